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


def as_postgres() -> pwd.struct_passwd | None:
    """The server's user: Postgres refuses to run as root."""
    return pwd.getpwnam("postgres") if os.geteuid() == 0 else None


@dataclass
class Postmaster:
    """A Postgres server in ``root`` (its data, socket directory and log), on ``port``."""

    root: Path
    port: int
    process: subprocess.Popen[bytes]

    def url(self, user: str, db: str = "postgres") -> str:
        return f"postgres://{user}@127.0.0.1:{self.port}/{db}"

    def log(self) -> str:
        return (self.root / "log").read_text(errors="replace")[-4000:]

    @staticmethod
    def demote() -> None:
        user = as_postgres()
        if user:
            os.setgid(user.pw_gid)
            os.setuid(user.pw_uid)

    def stop(self) -> None:
        self.process.send_signal(signal.SIGINT)  # a fast shutdown
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_postmaster(root: Path, port: int, *, initdb: bool = True) -> Postmaster:
    """Starts a server in ``root`` (``root/data`` made by initdb unless it exists) and waits until it answers."""
    user = as_postgres()
    (root / "sock").mkdir(parents=True, exist_ok=True)
    if user:
        for p in (root, root / "sock"):
            os.chown(p, user.pw_uid, user.pw_gid)
    if initdb:
        subprocess.run(
            [bindir() / "initdb", "-D", root / "data", "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
            check=True,
            capture_output=True,
            preexec_fn=Postmaster.demote,
        )
    settings = {
        "listen_addresses": "127.0.0.1",
        "fsync": "off",
        "max_connections": "200",
        "track_commit_timestamp": "on",
    }
    args: list[str | Path] = [bindir() / "postgres", "-D", root / "data", "-p", str(port), "-k", root / "sock"]
    for name, value in settings.items():
        args += ["-c", f"{name}={value}"]
    with open(root / "log", "wb") as log:
        process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, preexec_fn=Postmaster.demote)
    pm = Postmaster(root, port, process)
    deadline = time.monotonic() + START_TIMEOUT_S
    while True:
        try:
            psycopg.connect(pm.url("postgres"), connect_timeout=2).close()
            return pm
        except psycopg.OperationalError:
            if time.monotonic() > deadline or process.poll() is not None:
                pm.stop()
                pytest.exit(f"the postmaster did not start: {pm.log()}", returncode=2)
            time.sleep(0.1)


@pytest.fixture(scope="session")
def cluster() -> Iterator[Postmaster]:
    root = Path(tempfile.mkdtemp(prefix="ticklease-py-"))
    pm = start_postmaster(root, free_port())
    with psycopg.connect(pm.url("postgres"), autocommit=True) as conn:
        conn.execute("CREATE ROLE ticklease_app NOLOGIN")
        conn.execute("CREATE ROLE ticklease_operator NOLOGIN")
        conn.execute("CREATE ROLE app_login LOGIN IN ROLE ticklease_app")
        conn.execute("CREATE ROLE ops_login LOGIN IN ROLE ticklease_operator")
    yield pm
    pm.stop()
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
def db(cluster: Postmaster) -> Database:
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
