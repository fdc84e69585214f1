"""A real Postgres for the suite: one cluster per session (its own port and socket directory), a fresh
migrated database per test, and the logins of the crate docs (the schema owner, an app login, an operator)."""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

import ticklease

#: How long the postmaster may take to accept connections.
START_TIMEOUT_S = 30.0


def bindir() -> Path:
    given = os.environ.get("TICKLEASE_PG_BINDIR")
    if given:
        return Path(given)
    found = sorted(
        (int(p.parent.name), p) for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "postgres").exists()
    )
    if not found:
        pytest.exit("no PostgreSQL server binaries (apt-get install postgresql)", returncode=2)
    return found[-1][1]


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Cluster:
    port: int
    root: Path
    process: subprocess.Popen[bytes]

    def url(self, user: str, db: str = "postgres") -> str:
        return f"postgres://{user}@127.0.0.1:{self.port}/{db}"

    def log(self) -> str:
        return (self.root / "log").read_text(errors="replace")[-4000:]


def _as_postgres() -> pwd.struct_passwd | None:
    return pwd.getpwnam("postgres") if os.geteuid() == 0 else None


@pytest.fixture(scope="session")
def cluster() -> Iterator[Cluster]:
    user = _as_postgres()
    root = Path(tempfile.mkdtemp(prefix="ticklease-py-"))
    (root / "sock").mkdir()
    if user:
        for p in (root, root / "sock"):
            os.chown(p, user.pw_uid, user.pw_gid)

    def demote() -> None:
        if user:
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)

    bins = bindir()
    subprocess.run(
        [bins / "initdb", "-D", root / "data", "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
        check=True,
        capture_output=True,
        preexec_fn=demote,
    )
    port = free_port()
    log = open(root / "log", "wb")  # noqa: SIM115 (the postmaster's, for the session)
    process = subprocess.Popen(
        [
            bins / "postgres",
            "-D",
            root / "data",
            "-p",
            str(port),
            "-k",
            root / "sock",
            "-c",
            "listen_addresses=127.0.0.1",
            "-c",
            "fsync=off",
            "-c",
            "max_connections=200",
            "-c",
            "track_commit_timestamp=on",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        preexec_fn=demote,
    )
    c = Cluster(port, root, process)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            psycopg.connect(c.url("postgres"), connect_timeout=2).close()
            break
        except psycopg.OperationalError:
            if time.monotonic() > deadline or process.poll() is not None:
                pytest.exit(f"the postmaster did not start: {c.log()}", returncode=2)
            time.sleep(0.1)
    with psycopg.connect(c.url("postgres"), autocommit=True) as conn:
        conn.execute("CREATE ROLE ticklease_app NOLOGIN")
        conn.execute("CREATE ROLE ticklease_operator NOLOGIN")
        conn.execute("CREATE ROLE app_login LOGIN IN ROLE ticklease_app")
        conn.execute("CREATE ROLE ops_login LOGIN IN ROLE ticklease_operator")
    yield c
    process.send_signal(signal.SIGINT)  # a fast shutdown
    process.wait(timeout=30)
    log.close()
    shutil.rmtree(root, ignore_errors=True)


_numbers = itertools.count()


@dataclass
class Database:
    owner_url: str
    app_url: str
    operator_url: str

    def sql(self, statement: str, *params: object) -> list[tuple[object, ...]]:
        """Runs one statement as the owner, committed; its rows (none for a statement without)."""
        with psycopg.connect(self.owner_url, autocommit=True) as conn:
            cur = conn.execute(statement, params or None)
            return cur.fetchall() if cur.description else []


@pytest.fixture
def db(cluster: Cluster) -> Database:
    name = f"t{os.getpid()}_{next(_numbers)}"
    with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    owner = cluster.url("postgres", name)
    ticklease.migrate(owner)
    return Database(owner, cluster.url("app_login", name), cluster.url("ops_login", name))


#: The crate's test timings (TTL 2 s, heartbeat 300 ms, statement timeout 500 ms, abandon 1.2 s, poll 200 ms):
#: generous on a loaded two-core machine.
def scaled_config() -> ticklease.Config:
    return ticklease.Config(lease_ttl=2.0, heartbeat_every=0.3, statement_timeout=0.5, abandon_after=1.2, max_poll=0.2)
