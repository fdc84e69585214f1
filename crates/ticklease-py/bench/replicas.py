"""The replica programs the bench compares, and how each is started.

Black-box replicas (docs/black-box.md) read the harness's environment and claim twice per term in
``blackbox_claims``; the Rust black-box client cannot be given a direct URL apart from TICKLEASE_URL, so behind
PgBouncer the Rust side is the drill leader (``ticklease-bench leader``: the same Scheduler, a fenced journal row
every 100 ms while it leads) and, for the statement and idle counts, the scale bench's replica.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from infra import Processes

#: The project's default timings (T, H, S, A, P), in ms.
DEFAULT_TIMINGS = {
    "TICKLEASE_LEASE_TTL_MS": "10000",
    "TICKLEASE_HEARTBEAT_MS": "3000",
    "TICKLEASE_STATEMENT_TIMEOUT_MS": "2000",
    "TICKLEASE_ABANDON_MS": "6000",
    "TICKLEASE_MAX_POLL_MS": "5000",
}
LEASE_TTL_S = 10.0
MAX_POLL_S = 5.0


@dataclass(frozen=True)
class Tools:
    """The programs run: copies taken at the start (others may rebuild or edit the originals meanwhile)."""

    repo: Path
    python: Path
    bench_exe: Path
    blackbox: Path


@dataclass(frozen=True)
class Urls:
    """One database's URLs: where statements go, Postgres itself, and the owner's (the bench's reads)."""

    db: str
    statements: str
    direct: str
    owner: str


@dataclass(frozen=True)
class Program:
    """One kind of replica process. ``journal``: the table its work writes fenced rows to."""

    key: str
    client: str
    describe: str
    journal: str

    def argv(self, tools: Tools, urls: Urls, role: str, logdir: Path) -> list[str]:
        bb = tools.blackbox
        here = Path(__file__).resolve().parent
        scale = [
            str(tools.bench_exe), "scale-replica", "--url", urls.statements, "--direct-url", urls.direct,
            "--mode", "per-role", "--keys", "1", "--interval", "100ms", "--work", "10ms", "--pool-size", "8",
            "--stats", str(logdir / f"scale-{time.monotonic_ns()}.samples"), "--timing", "default",
        ]  # fmt: skip
        return {
            "bb-rust": [str(tools.bench_exe), "black-box-client"],
            "bb-python": [str(tools.python), str(bb)],
            "bb-python-split": [str(tools.python), str(here / "pooled_blackbox.py")],
            "drill-rust": [
                *(str(tools.bench_exe), "leader", "--url", urls.statements, "--direct-url", urls.direct),
                *("--role", role, "--timing", "default", "--write-every", "100ms", "--driver", "scheduler"),
            ],
            "scale-rust": scale,
        }[self.key]


BB_RUST = Program("bb-rust", "rust-scheduler", "`ticklease-bench black-box-client`", "blackbox_claims")
BB_PYTHON = Program("bb-python", "python", "`clients/python/blackbox.py`", "blackbox_claims")
BB_PYTHON_SPLIT = Program(
    "bb-python-split", "python", "`bench/pooled_blackbox.py` (blackbox.py, direct URL apart)", "blackbox_claims"
)
DRILL_RUST = Program("drill-rust", "rust-scheduler", "`ticklease-bench leader` (drill leader)", "drill_journal")
SCALE_RUST = Program("scale-rust", "rust-scheduler", "`ticklease-bench scale-replica --keys 1`", "")


@dataclass(frozen=True)
class Variant:
    """One client on one path: ``program`` reaching Postgres directly or through PgBouncer (its coordination
    session always direct). ``calibration``: a Rust program run on the direct path too, to show what changing the
    program (not the path) does."""

    client: str
    path: str
    program: Program
    calibration: bool = False

    @property
    def pooled(self) -> bool:
        return self.path == "pgbouncer"

    @property
    def db(self) -> str:
        return f"{self.program.key.replace('-', '_')}_{self.path}"

    @property
    def key(self) -> str:
        return f"{self.client} {self.path}" + (f" ({self.program.key})" if self.calibration else "")


def replica_env(urls: Urls, role: str, name: str, work_ms: int, blackbox: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TICKLEASE_", "RUST_LOG", "BENCH_"))}
    env.update(DEFAULT_TIMINGS)
    env.update(
        TICKLEASE_URL=urls.statements, TICKLEASE_ROLE=role, TICKLEASE_SCHEDULE="every 100",
        TICKLEASE_WORK_MS=str(work_ms), TICKLEASE_REPLICA=name,
        BENCH_DIRECT_URL=urls.direct, BENCH_BLACKBOX=str(blackbox),
        PYTHONFAULTHANDLER="1",  # a crash names itself in the log
    )  # fmt: skip
    return env


@dataclass
class Replica:
    name: str
    process: subprocess.Popen[bytes]
    log: Path


@dataclass
class ReplicaSet:
    """Replicas of one program leading one role in one database; each start logs to a file of its own."""

    procs: Processes
    program: Program
    tools: Tools
    urls: Urls
    role: str
    logdir: Path
    work_ms: int
    replicas: dict[str, Replica] = field(default_factory=dict)
    starts: int = 0

    def start(self, name: str) -> Replica:
        self.starts += 1
        log = self.logdir / f"{self.urls.db}-{name}-{self.starts}.log"
        argv = self.program.argv(self.tools, self.urls, self.role, self.logdir)
        env = replica_env(self.urls, self.role, name, self.work_ms, self.tools.blackbox)
        replica = Replica(name, self.procs.start(argv, env=env, log=log), log)
        self.replicas[name] = replica
        return replica

    def by_pid(self, pid: int) -> Replica | None:
        return next((r for r in self.replicas.values() if r.process.pid == pid), None)

    def pids(self) -> Mapping[str, int]:
        return {r.name: r.process.pid for r in self.replicas.values()}

    def dead(self) -> list[Replica]:
        return [r for r in self.replicas.values() if r.process.poll() is not None]

    def stop_all(self) -> dict[str, int]:
        """SIGTERM to each (a clean exit releases its terms); exit codes by name."""
        codes = {r.name: self.procs.end(r.process) for r in self.replicas.values()}
        self.replicas.clear()
        return codes

    def tail(self, replica: Replica, lines: int = 5) -> str:
        text = replica.log.read_text(errors="replace").strip().splitlines()
        return "\n".join(text[-lines:])
