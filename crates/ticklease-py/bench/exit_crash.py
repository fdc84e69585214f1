#!/usr/bin/env python3
"""Reproduces the Python replica's crash at exit. Two ``clients/python/blackbox.py`` replicas lead one role (the
default timings, ``every 100``, work 60 s); N times, as the bench does: the holder is SIGKILLed (the other takes
over), then the new holder is sent SIGTERM inside its work; each signalled replica is restarted.

Expected: every SIGTERMed replica exits 0 (docs/black-box.md, "Clean exits"). Observed in the bench: a few per cent
exit -6 (``Fatal Python error: PyGILState_Release: thread state ... must be current when releasing``, ``Python
runtime state: finalizing``) or -11, after the log's "replica exit: every tick returned; every term was released".

    python crates/ticklease-py/bench/exit_crash.py --times 200 [--hold 0] [--busy 2] [--no-kill]

``--hold S`` lets the holder lead S seconds before the SIGTERM; ``--busy N`` runs N CPU-bound processes beside it
(the bench saw the crash with other work on the two cores); ``--no-kill`` leaves the SIGKILLs out. Prints each
abnormal exit with its log's last line, then the exit codes.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import failover
import infra
from replicas import BB_PYTHON, ReplicaSet, Tools, Urls

REPO = Path(__file__).resolve().parents[3]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--times", type=int, default=120)
    p.add_argument("--hold", type=float, default=0.0)
    p.add_argument("--no-kill", action="store_true", help="SIGTERMs only (by default a SIGKILL precedes each)")
    p.add_argument("--busy", type=int, default=2, help="CPU-bound processes beside it (the crash needs contention)")
    args = p.parse_args(argv)
    procs, root = infra.Processes(), infra.temp_root()
    tools = Tools(
        REPO, Path(sys.executable), REPO / "target/debug/ticklease-bench", REPO / "clients/python/blackbox.py"
    )
    codes: Counter[int | None] = Counter()
    try:
        cluster = infra.start_cluster(procs, root / "pg")
        infra.create_database(cluster, "crash")
        app = cluster.url("app_login", "crash")
        urls = Urls("crash", app, app, cluster.url("postgres", "crash"))
        rs = ReplicaSet(procs, BB_PYTHON, tools, urls, "crash", root, 60000)
        for i in range(args.busy):
            procs.start([sys.executable, "-c", "while True: pass"], log=root / f"busy-{i}.log")
        rs.start("r1")
        rs.start("r2")
        watcher = failover.Watcher(urls.owner, "crash", "blackbox_claims")
        for _ in range(args.times):
            if not args.no_kill:  # as in the bench: the next holder takes over from a killed one
                failover.take_sample(rs, watcher, signal.SIGKILL, "crash")
            failover.ready(rs, watcher)
            time.sleep(args.hold)
            sample = failover.take_sample(rs, watcher, signal.SIGTERM, "crash")
            codes[sample.exit_code] += 1
            if sample.note:
                print(sample.note, flush=True)
        watcher.close()
        print(f"exit codes after SIGTERM: {dict(codes)}")
    finally:
        procs.end_all()
        shutil.rmtree(root, ignore_errors=True)
    return 0 if set(codes) == {0} else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
