#!/usr/bin/env python3
"""The Python package beside the Rust Scheduler, in one run: takeover after SIGKILL, handover after SIGTERM,
statements per tick, idle CPU and memory of 10 roles, import time; straight to Postgres and through PgBouncer in
transaction mode. Writes the figures into OUT/python.md (between its generated-section markers).

    python crates/ticklease-py/bench/bench_python.py --out docs/benchmarks --rounds 20

Needs PostgreSQL server binaries (/usr/lib/postgresql/*/bin), pgbouncer, the venv's python with the package and
psycopg, and target/debug/ticklease-bench (or --bench-exe). Every process it starts is ended, and its temp dir
removed, on any exit (SIGTERM and SIGINT included); each child also dies with it.
"""

from __future__ import annotations

import argparse
import datetime
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType

import failover
import idle
import imports
import infra
import psycopg
import report
import ticks
from replicas import BB_PYTHON, BB_PYTHON_SPLIT, BB_RUST, DRILL_RUST, SCALE_RUST, ReplicaSet, Tools, Urls, Variant
from stats import PhaseClock, dist

REPO = Path(__file__).resolve().parents[3]


FAILOVER_VARIANTS = [
    Variant("rust-scheduler", "direct", BB_RUST),
    Variant("python", "direct", BB_PYTHON),
    Variant("rust-scheduler", "pgbouncer", DRILL_RUST),
    Variant("python", "pgbouncer", BB_PYTHON_SPLIT),
    Variant("rust-scheduler", "direct", DRILL_RUST, calibration=True),
]
TICK_VARIANTS = [
    Variant("rust-scheduler", "direct", BB_RUST),
    Variant("python", "direct", BB_PYTHON),
    Variant("rust-scheduler", "pgbouncer", SCALE_RUST),
    Variant("python", "pgbouncer", BB_PYTHON_SPLIT),
    Variant("rust-scheduler", "direct", SCALE_RUST, calibration=True),
]


@dataclass
class Bench:
    args: argparse.Namespace
    tools: Tools
    procs: infra.Processes
    root: Path
    results: report.Results
    cluster: infra.Cluster | None = None
    bouncer: infra.Bouncer | None = None

    def urls(self, db: str, pooled: bool) -> Urls:
        assert self.cluster and self.bouncer
        direct = self.cluster.url("app_login", db)
        statements = self.bouncer.url("app_login", db) if pooled else direct
        return Urls(db, statements, direct, self.cluster.url("postgres", db))

    def database(self, name: str, pooled: bool) -> Urls:
        assert self.cluster
        infra.create_database(self.cluster, name)
        return self.urls(name, pooled)

    def admin(self) -> psycopg.Connection[tuple[object, ...]]:
        assert self.cluster
        return psycopg.connect(self.cluster.url("postgres"), autocommit=True, connect_timeout=5)

    def log(self, text: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


def phase_imports(b: Bench) -> None:
    b.results.imports = imports.measure_imports(b.tools.python, b.args.rounds)
    b.log(f"imports: -X importtime {dist(b.results.imports.importtime_ms)} ms (p50 / p99 / max)")


def phase_servers(b: Bench) -> None:
    b.cluster = infra.start_cluster(b.procs, b.root / "pg")
    b.bouncer = infra.start_bouncer(b.procs, b.root / "bouncer", b.cluster)
    b.results.facts["postgres"] = str(infra.sql(b.cluster.url("postgres"), "SHOW server_version")[0][0])
    b.log(f"postgres {b.results.facts['postgres']} on {b.cluster.port}, pgbouncer on {b.bouncer.port}")


def phase_refusals(b: Bench) -> None:
    """Each black-box replica with TICKLEASE_URL through PgBouncer: its coordination session on the same URL."""
    urls = b.database("same_url", pooled=True)
    for program in (BB_RUST, BB_PYTHON):
        for i in range(3):
            rs = ReplicaSet(b.procs, program, b.tools, urls, "same_url", b.root, 60000)
            at = time.monotonic()
            replica = rs.start(f"s{i}")
            try:
                code: int | None = replica.process.wait(timeout=30.0)
            except Exception:
                code = None
            seconds = time.monotonic() - at
            rs.stop_all()
            b.results.refusals.append(report.Refusal(program.client, code, seconds, report.error_line(replica.log)))
    b.log(f"same URL through PgBouncer: {[(r.client, r.exit_code) for r in b.results.refusals]}")


def wait_first_ticks(urls: Urls) -> None:
    """Until the roles' first ticks ended (bounded): after them nothing is due for an hour."""
    count = "SELECT count(*) FROM leader_history WHERE kind = 'term'"
    done = lambda: int(infra.sql(urls.owner, count)[0][0]) >= idle.ROLES  # noqa: E731
    infra.wait_until(f"{urls.db}: the first {idle.ROLES} ticks", done, 60.0, 0.2)


def phase_idle(b: Bench) -> None:
    targets = []
    for v in (idle.RUST_IDLE, idle.PYTHON_IDLE):
        for path in ("direct", "pgbouncer"):
            urls = b.database(f"idle_{v.key}_{path}", pooled=path == "pgbouncer")
            targets.append(idle.start_idle(b.procs, v, path, b.tools, urls, b.root))
    for t in targets:
        wait_first_ticks(t.urls)
    time.sleep(b.args.idle_settle)
    with b.admin() as admin:
        for i in range(b.args.idle_windows):
            b.results.idle += idle.one_window(targets, admin, b.args.idle_seconds)
            b.log(f"idle window {i + 1}/{b.args.idle_windows}")
    for t in targets:
        b.procs.end(next(p for p in b.procs.running if p.pid == t.pid))


def phase_ticks(b: Bench) -> None:
    sets = {}
    for v in TICK_VARIANTS:
        urls = b.database(f"tick_{v.db}", v.pooled)
        sets[v] = ReplicaSet(b.procs, v.program, b.tools, urls, "bench", b.root, 10)
    with b.admin() as admin:
        for run in range(b.args.tick_runs):
            for v in rotated(TICK_VARIANTS, run):
                got = ticks.tick_run(sets[v], admin, b.args.tick_seconds)
                b.results.ticks.setdefault(v.key, []).append(got)
                b.log(f"ticks {v.key}: {got.terms} terms, {got.library_per_term:.2f} library statements/term")


def rotated(items: list[Variant], i: int) -> list[Variant]:
    k = i % len(items)
    return items[k:] + items[:k]


def phase_failover(b: Bench) -> None:
    pairs: dict[Variant, tuple[ReplicaSet, failover.Watcher]] = {}
    try:
        for v in FAILOVER_VARIANTS:
            urls = b.database(f"fo_{v.db}", v.pooled)
            rs = ReplicaSet(b.procs, v.program, b.tools, urls, "bench", b.root, 60000)
            rs.start("r1")
            rs.start("r2")
            pairs[v] = (rs, failover.Watcher(urls.owner, "bench", v.program.journal))
        for i in range(b.args.rounds):
            for v in rotated(FAILOVER_VARIANTS, i):
                for sig in (signal.SIGKILL, signal.SIGTERM):
                    sample = failover.take_sample(*pairs[v], sig, v.key)
                    b.results.samples.setdefault(f"{v.key} {sample.signal}", []).append(sample)
            b.log(f"failover round {i + 1}/{b.args.rounds}")
    finally:
        for rs, watcher in pairs.values():
            watcher.close()
            rs.stop_all()


def phase_connects(b: Bench) -> None:
    """What a claim's own connection costs (each black-box claim connects anew): direct and through PgBouncer."""
    urls = b.database("connects", pooled=True)
    for path, url in (("direct", urls.direct), ("pgbouncer", urls.statements)):
        for _ in range(b.args.rounds):
            at = time.perf_counter()
            psycopg.connect(url, connect_timeout=5).close()
            b.results.connects.setdefault(path, []).append((time.perf_counter() - at) * 1000)


PHASES = [
    ("imports", phase_imports),
    ("servers", phase_servers),
    ("same URL through PgBouncer", phase_refusals),
    ("idle", phase_idle),
    ("statements per tick", phase_ticks),
    ("takeover and handover", phase_failover),
    ("connection cost", phase_connects),
]


def run(b: Bench) -> None:
    for name, phase in PHASES:
        if name in b.args.skip:
            continue
        b.log(f"phase: {name}")
        clock = PhaseClock(name)
        phase(b)
        b.results.phases.append(clock.done())


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=REPO / "docs" / "benchmarks")
    p.add_argument("--rounds", type=int, default=20, help="samples per client, path and signal; import runs")
    p.add_argument("--python", type=Path, default=Path(sys.executable))
    p.add_argument("--bench-exe", type=Path, default=REPO / "target" / "debug" / "ticklease-bench")
    p.add_argument("--tick-runs", type=int, default=4)
    p.add_argument("--tick-seconds", type=float, default=10.0)
    p.add_argument("--idle-settle", type=float, default=10.0)
    p.add_argument("--idle-windows", type=int, default=3)
    p.add_argument("--idle-seconds", type=float, default=30.0)
    p.add_argument("--skip", action="append", default=[], help="a phase to leave out (by name)")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (logs) after the run")
    return p.parse_args(argv)


def snapshot(args: argparse.Namespace, root: Path, results: report.Results) -> Tools:
    """Copies of the Rust binary and the replica program, so a rebuild or an edit during the run changes nothing."""
    (root / "bin").mkdir()
    exe = Path(shutil.copy2(args.bench_exe, root / "bin" / "ticklease-bench"))
    blackbox = Path(shutil.copy2(REPO / "clients" / "python" / "blackbox.py", root / "bin" / "blackbox.py"))
    built = datetime.datetime.fromtimestamp(args.bench_exe.stat().st_mtime, datetime.timezone.utc)
    results.facts["bench_exe"] = f"`{args.bench_exe}` (built {built:%Y-%m-%d %H:%M} UTC)"
    return Tools(REPO, args.python, exe, blackbox)


def _stop(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _stop)
    results = report.Results(datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"))
    procs, root = infra.Processes(), infra.temp_root()
    started = time.monotonic()
    try:
        b = Bench(args, snapshot(args, root, results), procs, root, results)
        run(b)
    finally:
        procs.end_all()
        if args.keep:
            print(f"kept {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)
    results.facts["wall"] = f"{(time.monotonic() - started) / 60:.1f} min"
    path = report.write(args.out / "python.md", results, b.tools, FAILOVER_VARIANTS, TICK_VARIANTS)
    b.log(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
