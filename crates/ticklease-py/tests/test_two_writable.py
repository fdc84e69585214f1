"""Two writable servers (a standby promoted while the old primary was never demoted), from Python: the core's
timeline rule picks the promoted server, and a term on the old one ends as superseded."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

import ticklease
from conftest import as_postgres, bindir, free_port, scaled_config, start_postmaster

CLAIMS = "CREATE TABLE claims (token bigint, port int, at timestamptz DEFAULT clock_timestamp())"


@dataclass
class Pair:
    old_port: int
    new_port: int

    def url(self, user: str, port: int) -> str:
        return f"postgres://{user}@127.0.0.1:{port}/pair"

    def both(self, user: str) -> str:
        return f"postgres://{user}@127.0.0.1:{self.old_port},127.0.0.1:{self.new_port}/pair"

    def promote(self) -> None:
        with psycopg.connect(self.url("postgres", self.new_port), autocommit=True) as conn:
            conn.execute("SELECT pg_promote(true, 30)")


@pytest.fixture
def pair() -> Iterator[Pair]:
    """A migrated primary and its streaming standby, caught up (not yet promoted)."""
    root = Path(tempfile.mkdtemp(prefix="ticklease-pair-"))
    user = as_postgres()
    if user:
        os.chown(root, user.pw_uid, user.pw_gid)
    old = start_postmaster(root / "old", free_port())
    with psycopg.connect(old.url("postgres"), autocommit=True) as conn:
        conn.execute("CREATE ROLE app_login LOGIN")
    procs = [old]
    try:
        primary = f"postgres://postgres@127.0.0.1:{old.port}/postgres"
        with psycopg.connect(primary, autocommit=True) as conn:
            conn.execute("CREATE DATABASE pair")
        ticklease.migrate(f"postgres://postgres@127.0.0.1:{old.port}/pair")
        with psycopg.connect(old.url("postgres"), autocommit=True) as conn:
            conn.execute("GRANT ticklease_app TO app_login")
        with psycopg.connect(f"postgres://postgres@127.0.0.1:{old.port}/pair", autocommit=True) as conn:
            conn.execute(CLAIMS)
            conn.execute("GRANT INSERT, SELECT ON claims TO ticklease_app")
        subprocess.run(
            [bindir() / "pg_basebackup", "-D", root / "new" / "data", "-R", "-X", "stream", "-c", "fast",
             "-d", f"postgres://postgres@127.0.0.1:{old.port}/postgres"],
            check=True, capture_output=True, preexec_fn=old.demote,
        )  # fmt: skip
        new = start_postmaster(root / "new", free_port(), initdb=False)
        procs.append(new)
        yield Pair(old.port, new.port)
    finally:
        for p in procs:
            p.stop()
        shutil.rmtree(root, ignore_errors=True)


def lead_and_claim(pair: Pair, stop_after_s: float, promote_at_s: float | None) -> list[tuple[int, int]]:
    """Leads `pair_job` on both hosts' URL, each term claiming on its term's server; promotes the standby
    `promote_at_s` in. Returns (token, port) of each claim's term."""
    s = ticklease.Scheduler(pair.both("app_login"), config=scaled_config())
    claims: list[tuple[int, int]] = []

    @s.job("pair_job", 0.05)
    def work(term: ticklease.Term) -> None:
        server = term.server
        assert server is not None
        with psycopg.connect(pair.url("app_login", server.port), connect_timeout=5) as conn, conn.transaction():
            cur = conn.execute(
                f"INSERT INTO claims (token, port) SELECT %(t)s, %(p)s WHERE {term.fence.sql}",
                {"t": term.token, "p": server.port, **term.fence.params},
            )
            if cur.rowcount == 1:
                claims.append((term.token, server.port))

    def script() -> None:
        if promote_at_s is not None:
            time.sleep(promote_at_s)
            pair.promote()
        time.sleep(stop_after_s - (promote_at_s or 0))
        s.stop()

    t = threading.Thread(target=script)
    t.start()
    s.run_blocking(handle_signals=False)
    t.join()
    return claims


def rows_after(pair: Pair, port: int, after: str) -> int:
    with psycopg.connect(pair.url("postgres", port)) as conn:
        row = conn.execute("SELECT count(*) FROM claims WHERE at > %s::timestamptz", (after,)).fetchone()
        assert row is not None
        return int(row[0])


def test_a_fresh_process_leads_only_on_the_promoted_server(pair: Pair) -> None:
    pair.promote()
    claims = lead_and_claim(pair, stop_after_s=2.0, promote_at_s=None)
    assert claims, "it led"
    assert {port for _, port in claims} == {pair.new_port}
    assert rows_after(pair, pair.old_port, "-infinity") == 0


def test_a_leader_on_the_old_primary_moves_to_the_promoted_one_for_good(
    pair: Pair,
) -> None:
    claims = lead_and_claim(pair, stop_after_s=6.0, promote_at_s=1.5)
    ports = [port for _, port in claims]
    assert ports[0] == pair.old_port and ports[-1] == pair.new_port, ports
    # Once on the promoted server, never back.
    first_new = ports.index(pair.new_port)
    assert set(ports[first_new:]) == {pair.new_port}
    with psycopg.connect(pair.url("postgres", pair.new_port)) as conn:
        row = conn.execute("SELECT min(at)::text FROM claims WHERE port = %s", (pair.new_port,)).fetchone()
        assert row is not None and row[0] is not None
    # Nothing committed on the old primary once the promoted server had a claim (one machine: one clock).
    assert rows_after(pair, pair.old_port, row[0]) == 0
