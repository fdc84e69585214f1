"""The bench's own Postgres and PgBouncer, and the processes it starts: every one tracked and ended at teardown.

Postgres and PgBouncer refuse root, so as root they run as ``postgres`` (the approach of
``crates/ticklease-py/tests/conftest.py``: a temp dir chowned to that user, a ``preexec_fn`` that drops to it). Each
child also gets a parent-death signal, so even a SIGKILLed bench leaves nothing running.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import psycopg

import ticklease

#: How long a server may take to accept connections.
START_TIMEOUT_S = 30.0
#: How long a stopped process may take to exit before it is killed.
STOP_TIMEOUT_S = 15.0

_PR_SET_PDEATHSIG = 1
_libc = ctypes.CDLL(None, use_errno=True)

#: The claims table of docs/black-box.md (crates/ticklease-bench/src/black_box/contract.rs, CLAIMS_TABLE).
CLAIMS_TABLE = """CREATE TABLE blackbox_claims (
    role text NOT NULL, token bigint NOT NULL, replica text NOT NULL, seq bigint NOT NULL, at timestamptz NOT NULL,
    occurrence timestamptz);
GRANT SELECT, INSERT ON blackbox_claims TO ticklease_app"""

#: The drill leader's journal (crates/ticklease-bench/src/history.sql), for the Rust replica with a direct URL.
DRILL_TABLE = """CREATE TABLE drill_journal (
    id bigserial PRIMARY KEY, role text NOT NULL, token bigint NOT NULL, holder text NOT NULL,
    at timestamptz NOT NULL DEFAULT clock_timestamp());
GRANT SELECT, INSERT ON drill_journal TO ticklease_app;
GRANT USAGE ON SEQUENCE drill_journal_id_seq TO ticklease_app"""


def bindir() -> Path:
    given = os.environ.get("TICKLEASE_PG_BINDIR")
    if given:
        return Path(given)
    found = sorted(
        (int(p.parent.name), p) for p in Path("/usr/lib/postgresql").glob("*/bin") if (p / "postgres").exists()
    )
    if not found:
        raise SystemExit("no PostgreSQL server binaries (apt-get install postgresql)")
    return found[-1][1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _server_user() -> pwd.struct_passwd | None:
    return pwd.getpwnam("postgres") if os.geteuid() == 0 else None


def _die_with_parent(sig: int) -> None:
    if _libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG)")


def _as_server_user() -> None:
    """preexec_fn of Postgres and PgBouncer: drop to ``postgres`` (the death signal after: setuid clears it)."""
    user = _server_user()
    if user:
        os.setgid(user.pw_gid)
        os.setuid(user.pw_uid)
    _die_with_parent(signal.SIGQUIT)


def _own_group() -> None:
    """preexec_fn of a replica: a process group of its own, killed with the bench."""
    os.setpgid(0, 0)
    _die_with_parent(signal.SIGKILL)


def chown_to_server(*paths: Path) -> None:
    user = _server_user()
    if user:
        for p in paths:
            os.chown(p, user.pw_uid, user.pw_gid)


@dataclass
class Processes:
    """Every child the bench started, with how it stops; :meth:`end_all` ends those still running: the replicas
    first, then PgBouncer, then Postgres (a fast shutdown, then an immediate one, then SIGKILL)."""

    running: list[subprocess.Popen[bytes]] = field(default_factory=list)
    tiers: dict[int, tuple[int, int]] = field(default_factory=dict)

    def start(
        self,
        args: Sequence[str | Path],
        *,
        env: Mapping[str, str] | None = None,
        log: Path,
        preexec: Callable[[], None] = _own_group,
        stop: tuple[int, int] = (0, signal.SIGTERM),
    ) -> subprocess.Popen[bytes]:
        """Starts ``args``, its output to ``log``; ``stop`` is its tier (ended in increasing order) and signal."""
        with open(log, "ab") as out:
            p = subprocess.Popen(
                list(args), env=dict(env) if env is not None else None, stdin=subprocess.DEVNULL,
                stdout=out, stderr=subprocess.STDOUT, preexec_fn=preexec,
            )  # fmt: skip
        self.running.append(p)
        self.tiers[p.pid] = stop
        return p

    def end(self, p: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = STOP_TIMEOUT_S) -> int:
        """Signals ``p`` (if still running) and waits for it, at most ``timeout`` before a SIGQUIT, then SIGKILL."""
        for s in (sig, signal.SIGQUIT, signal.SIGKILL):
            if p.poll() is None:
                p.send_signal(s)
                try:
                    p.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    continue
            break
        if p in self.running:
            self.running.remove(p)
        return p.wait(timeout=timeout)

    def end_all(self) -> None:
        for tier in sorted({t for t, _ in self.tiers.values()}):
            batch = [p for p in self.running if self.tiers[p.pid][0] == tier]
            for p in batch:
                if p.poll() is None:
                    p.send_signal(self.tiers[p.pid][1])
            for p in batch:
                self.end(p, self.tiers[p.pid][1])


def wait_until(what: str, check: Callable[[], bool], timeout: float, every: float = 0.05) -> None:
    """Polls ``check`` until it holds; TimeoutError naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout} s")
        time.sleep(every)


def answers(url: str) -> bool:
    try:
        psycopg.connect(url, connect_timeout=2).close()
        return True
    except psycopg.OperationalError:
        return False


def sql(url: str, statement: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
    """One statement, autocommitted (5 s statement timeout); its rows."""
    with psycopg.connect(url, autocommit=True, connect_timeout=5, options="-c statement_timeout=5000") as conn:
        cur = conn.execute(statement, params)
        return cur.fetchall() if cur.description else []


@dataclass
class Cluster:
    """A Postgres 15+ server in ``root``, on 127.0.0.1:``port``, with pg_stat_statements loaded."""

    root: Path
    port: int
    process: subprocess.Popen[bytes]

    def url(self, user: str, db: str = "postgres") -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{db}"

    def log(self) -> str:
        return (self.root / "log").read_text(errors="replace")[-3000:]


SERVER_SETTINGS = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "max_connections": "300",
    "track_commit_timestamp": "on",
    "shared_preload_libraries": "pg_stat_statements",
    "pg_stat_statements.track": "top",
}


def start_cluster(procs: Processes, root: Path) -> Cluster:
    (root / "sock").mkdir(parents=True, exist_ok=True)
    chown_to_server(root, root / "sock")
    initdb = subprocess.run(
        [bindir() / "initdb", "-D", root / "data", "-U", "postgres", "--auth=trust", "-E", "UTF8", "--no-sync"],
        capture_output=True, text=True, preexec_fn=_as_server_user, timeout=120,
    )  # fmt: skip
    if initdb.returncode != 0:
        raise RuntimeError(f"initdb failed ({initdb.returncode}): {initdb.stderr[-2000:]}")
    port = free_port()
    args: list[str | Path] = [bindir() / "postgres", "-D", root / "data", "-p", str(port), "-k", root / "sock"]
    for name, value in SERVER_SETTINGS.items():
        args += ["-c", f"{name}={value}"]
    process = procs.start(args, log=root / "log", preexec=_as_server_user, stop=(2, signal.SIGINT))
    cluster = Cluster(root, port, process)
    wait_until("the postmaster accepts connections", lambda: answers(cluster.url("postgres")), START_TIMEOUT_S, 0.1)
    for statement in (
        "CREATE ROLE ticklease_app NOLOGIN",
        "CREATE ROLE ticklease_operator NOLOGIN",
        "CREATE ROLE app_login LOGIN IN ROLE ticklease_app",
    ):
        sql(cluster.url("postgres"), statement)
    sql(cluster.url("postgres"), "CREATE EXTENSION pg_stat_statements")
    return cluster


def stop_cluster(procs: Processes, cluster: Cluster) -> None:
    procs.end(cluster.process, signal.SIGINT)  # a fast shutdown


def create_database(cluster: Cluster, name: str) -> str:
    """A migrated database with the black-box claims table and the drill journal; the app login's URL."""
    sql(cluster.url("postgres"), f"CREATE DATABASE {name}")
    owner = cluster.url("postgres", name)
    ticklease.migrate(owner)
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(CLAIMS_TABLE)
        conn.execute(DRILL_TABLE)
        conn.execute("CREATE EXTENSION pg_stat_statements")
    return cluster.url("app_login", name)


@dataclass
class Bouncer:
    """PgBouncer in transaction mode in front of a cluster, on 127.0.0.1:``port`` (logins passed through)."""

    root: Path
    port: int
    process: subprocess.Popen[bytes]

    def url(self, user: str, db: str) -> str:
        return f"postgresql://{user}@127.0.0.1:{self.port}/{db}"


def _bouncer_ini(root: Path, pg_port: int, port: int) -> str:
    return f"""[databases]
* = host=127.0.0.1 port={pg_port}

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = {port}
unix_socket_dir =
auth_type = trust
auth_file = {root / "userlist.txt"}
pool_mode = transaction
default_pool_size = 20
max_client_conn = 1000
max_db_connections = 0
ignore_startup_parameters = extra_float_digits,options
logfile = {root / "pgbouncer.log"}
pidfile = {root / "pgbouncer.pid"}
admin_users = postgres
"""


def start_bouncer(procs: Processes, root: Path, cluster: Cluster) -> Bouncer:
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    (root / "userlist.txt").write_text('"postgres" ""\n"app_login" ""\n')
    (root / "pgbouncer.ini").write_text(_bouncer_ini(root, cluster.port, port))
    chown_to_server(root, root / "userlist.txt", root / "pgbouncer.ini")
    exe = shutil.which("pgbouncer") or "/usr/sbin/pgbouncer"
    if not Path(exe).exists():
        raise SystemExit("no pgbouncer (apt-get install pgbouncer)")
    process = procs.start(
        [exe, root / "pgbouncer.ini"], log=root / "stdout", preexec=_as_server_user, stop=(1, signal.SIGTERM)
    )
    bouncer = Bouncer(root, port, process)
    wait_until("pgbouncer accepts connections", lambda: answers(bouncer.url("postgres", "postgres")), 15.0, 0.1)
    return bouncer


def temp_root() -> Path:
    """The bench's temp dir, owned by the servers' user (their own dirs go inside)."""
    root = Path(tempfile.mkdtemp(prefix="ticklease-bench-py-"))
    chown_to_server(root)
    return root
