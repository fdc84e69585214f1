"""CPU and resident memory of one process leading 10 roles while idle (each due once an hour, so after the first
ticks nothing is due), read from /proc: CPU from ``/proc/PID/stat`` (utime + stime, in clock ticks: 10 ms
steps) and, finer, the sum of ``/proc/PID/task/*/schedstat`` (ns on a CPU, threads alive at both readings); RSS
and threads from ``/proc/PID/status``. The processes run side by side, each with a database of its own, and the
statements each database saw in the window are counted from ``pg_stat_statements``.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import psycopg
from infra import Processes
from replicas import Tools, Urls, replica_env
from ticks import label, statements

ROLES = 10
CLOCK_TICK_S = 1.0 / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class IdleVariant:
    key: str
    client: str
    describe: str


RUST_IDLE = IdleVariant("rust", "rust-scheduler", "`ticklease-bench scale-replica --mode per-role --keys 10`")
PYTHON_IDLE = IdleVariant("python", "python", "`bench/idle_python.py` (`ticklease.Scheduler`, 10 jobs)")


def idle_argv(v: IdleVariant, tools: Tools, urls: Urls, logdir: Path) -> list[str]:
    if v.key == "python":
        here = Path(__file__).resolve().parent
        return [str(tools.python), str(here / "idle_python.py"), urls.statements, urls.direct, str(ROLES)]
    return [
        str(tools.bench_exe), "scale-replica", "--url", urls.statements, "--direct-url", urls.direct,
        "--mode", "per-role", "--keys", str(ROLES), "--interval", "1h", "--work", "10ms", "--pool-size", "8",
        "--stats", str(logdir / f"idle-{urls.db}.samples"), "--timing", "default",
    ]  # fmt: skip


@dataclass
class ProcReading:
    cpu_ticks: int
    sched_ns: dict[str, int]
    rss_kb: int
    hwm_kb: int
    threads: int


def read_proc(pid: int) -> ProcReading:
    stat = Path(f"/proc/{pid}/stat").read_text()
    fields = stat.rsplit(")", 1)[1].split()
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    sched = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            sched[task.name] = int((task / "schedstat").read_text().split()[0])
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile

    def kb(key: str) -> int:
        return int(status[key].split()[0])

    return ProcReading(int(fields[11]) + int(fields[12]), sched, kb("VmRSS"), kb("VmHWM"), kb("Threads"))


@dataclass
class IdleWindow:
    variant: str
    path: str
    seconds: float
    cpu_s: float
    sched_cpu_s: float
    rss_mb: float
    hwm_mb: float
    threads: int
    statements: int
    #: The window's statements by kind (``ticks.label``).
    kinds: Counter[str]


@dataclass(frozen=True)
class IdleTarget:
    variant: IdleVariant
    path: str
    urls: Urls
    pid: int


def start_idle(procs: Processes, v: IdleVariant, path: str, tools: Tools, urls: Urls, logdir: Path) -> IdleTarget:
    argv = idle_argv(v, tools, urls, logdir)
    log = logdir / f"idle-{urls.db}.log"
    return IdleTarget(
        v, path, urls, procs.start(argv, env=replica_env(urls, "idle", v.key, 10, tools.blackbox), log=log).pid
    )


def kinds(diff: Counter[str]) -> Counter[str]:
    out: Counter[str] = Counter()
    for query, n in diff.items():
        out["SELECT 1 (PgBouncer's server check)" if query.lower() == "select $1" else label(query)] += n
    return out


def one_window(
    targets: list[IdleTarget], admin: psycopg.Connection[tuple[object, ...]], seconds: float
) -> list[IdleWindow]:
    """One window of ``seconds`` over every target at once."""
    before = {t.pid: (read_proc(t.pid), statements(admin, t.urls.db)) for t in targets}
    at = time.monotonic()
    time.sleep(seconds)
    elapsed = time.monotonic() - at
    out = []
    for t in targets:
        p0, s0 = before[t.pid]
        p1, s1 = read_proc(t.pid), statements(admin, t.urls.db)
        sched = sum(ns - p0.sched_ns[task] for task, ns in p1.sched_ns.items() if task in p0.sched_ns) / 1e9
        out.append(IdleWindow(
            t.variant.client, t.path, elapsed, (p1.cpu_ticks - p0.cpu_ticks) * CLOCK_TICK_S, sched,
            p1.rss_kb / 1024, p1.hwm_kb / 1024, p1.threads, sum(s1.values()) - sum(s0.values()), kinds(s1 - s0),
        ))  # fmt: skip
    return out
