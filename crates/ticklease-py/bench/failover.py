"""Takeover after SIGKILL and handover after SIGTERM: two replicas lead one role (``every 100``, work 60 s, the
default timings); the holder (``leader_leases.holder_id`` is ``host:pid:nonce``) is signalled inside its work, and
the sample is the time from the signal to the first fenced write of a newer token, both on the host's clock
(``at`` is the server's ``clock_timestamp()``, the bench's instant is ``time.time()`` just before ``kill``: one
kernel clock; the bench also reads the server's clock right after each kill as a check).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from dataclasses import dataclass
from typing import Any

import psycopg
from infra import wait_until
from replicas import LEASE_TTL_S, MAX_POLL_S, Replica, ReplicaSet

#: Bound on a holder being found inside its work (a start, a first claim).
HOLDER_WAIT_S = 30.0
#: Bound on the follower waiting on the holder's key.
FOLLOWER_WAIT_S = 20.0
#: Bound on the next term's first write: past the lease and a poll, the coordination session has not helped.
TAKEOVER_WAIT_S = LEASE_TTL_S + MAX_POLL_S + 10.0
#: How long a SIGTERMed replica may take to exit (the harness's bound).
EXIT_WAIT_S = 10.0


@dataclass
class Sample:
    variant: str
    signal: str
    #: Signal to the next term's first write; None: none within TAKEOVER_WAIT_S.
    ms: float | None
    #: The server's clock read right after the kill, minus the instant used (ms): the check of the clock.
    db_lag_ms: float
    #: Exit code of the signalled replica (None: still running EXIT_WAIT_S after a SIGTERM).
    exit_code: int | None
    note: str = ""


class Watcher:
    """The bench's reading connection to one database (as its owner)."""

    def __init__(self, owner_url: str, role: str, journal: str) -> None:
        self.conn = psycopg.connect(owner_url, autocommit=True, connect_timeout=5)
        self.role = role
        self.journal = journal

    def one(self, statement: str, *params: Any) -> Any:
        row = self.conn.execute(statement, params).fetchone()
        return row[0] if row else None

    def holder_in_work(self) -> tuple[int, int] | None:
        """(token, pid) of the live term whose work has written, if any."""
        row = self.conn.execute(
            f"""SELECT l.holder_token, split_part(l.holder_id, ':', 2)::int FROM leader_leases AS l
                 WHERE l.role = %s AND l.holder_id IS NOT NULL AND l.expires_at > now()
                   AND EXISTS (SELECT 1 FROM {self.journal} AS j WHERE j.role = l.role AND j.token = l.holder_token)""",
            (self.role,),
        ).fetchone()
        return (int(row[0]), int(row[1])) if row else None

    def waiters(self) -> int:
        """Connections waiting on an advisory lock in this database (a follower waiting on the holder's key)."""
        return int(
            self.one(
                """SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted
                    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
            )
        )

    def first_write_after(self, token: int) -> float | None:
        at = self.one(f"SELECT min(at) FROM {self.journal} WHERE role = %s AND token > %s", self.role, token)
        return None if at is None else float(at.timestamp())

    def db_now(self) -> float:
        return float(self.one("SELECT extract(epoch FROM clock_timestamp())"))

    def close(self) -> None:
        self.conn.close()


def ready(rs: ReplicaSet, watcher: Watcher) -> tuple[int, Replica]:
    """Waits (bounded) until the holder is one of ours inside its work and the other waits on its key."""
    found: list[tuple[int, Replica]] = []

    def holder() -> bool:
        for r in rs.dead():
            raise RuntimeError(f"{rs.urls.db}: replica {r.name} exited ({r.process.returncode}): {rs.tail(r)}")
        hw = watcher.holder_in_work()
        replica = rs.by_pid(hw[1]) if hw else None
        if hw and replica:
            found[:] = [(hw[0], replica)]
        return bool(found)

    wait_until(f"{rs.urls.db}: a holder inside its work", holder, HOLDER_WAIT_S, 0.02)
    wait_until(f"{rs.urls.db}: the follower waiting", lambda: watcher.waiters() > 0, FOLLOWER_WAIT_S, 0.02)
    return found[0]


def reap(rs: ReplicaSet, victim: Replica, sig: int) -> int | None:
    """The signalled replica's exit code (a SIGTERMed one still running after EXIT_WAIT_S is killed: None)."""
    try:
        code: int | None = victim.process.wait(timeout=EXIT_WAIT_S if sig == signal.SIGTERM else 5.0)
    except subprocess.TimeoutExpired:
        code = None
    rs.procs.end(victim.process, signal.SIGKILL)
    return code


def crash_line(replica: Replica) -> str:
    """What a replica that exited abnormally said last (a "Fatal Python error: ..." line, if any)."""
    lines = replica.log.read_text(errors="replace").strip().splitlines()
    fatal = [ln for ln in lines if ln.startswith("Fatal Python error")]
    return (fatal or lines or ["(nothing)"])[-1][:200]


def take_sample(rs: ReplicaSet, watcher: Watcher, sig: int, variant: str) -> Sample:
    token, victim = ready(rs, watcher)
    at = time.time()
    os.kill(victim.process.pid, sig)
    db_lag_ms = (watcher.db_now() - at) * 1000
    first: list[float] = []

    def claimed() -> bool:
        got = watcher.first_write_after(token)
        if got is not None:
            first.append(got)
        return got is not None

    note = ""
    try:
        wait_until("the next term's first write", claimed, TAKEOVER_WAIT_S, 0.01)
    except TimeoutError as e:
        note = str(e)
    code = reap(rs, victim, sig)
    if code not in (0, -signal.SIGKILL):
        note = f"{victim.log.name}: exit {code}: {crash_line(victim)}"
    rs.start(victim.name)
    ms = (first[0] - at) * 1000 if first else None
    return Sample(variant, signal.Signals(sig).name, ms, db_lag_ms, code, note)
