#!/usr/bin/env python3
"""clients/python/blackbox.py with its statements and claims on TICKLEASE_URL (PgBouncer in transaction mode) and
its coordination session on BENCH_DIRECT_URL (Postgres itself), as the package's docs say a pooled deployment runs.

The replica program passes TICKLEASE_URL as ``direct_url`` too, which a transaction-mode pooler cannot carry (the
core refuses it at start: "the coordination session hears no notifications"). This wrapper changes only that
argument: ``ticklease.Scheduler`` is replaced, in this process alone, by a subclass that takes BENCH_DIRECT_URL as
its ``direct_url``; everything else is the replica program as it is.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

import ticklease

#: The replica program: BENCH_BLACKBOX (the bench's copy), else the checkout's.
REPLICA = Path(os.environ.get("BENCH_BLACKBOX") or Path(__file__).resolve().parents[3] / "clients/python/blackbox.py")


class DirectScheduler(ticklease.Scheduler):
    def __init__(self, url: str, **kwargs: Any) -> None:
        kwargs["direct_url"] = os.environ["BENCH_DIRECT_URL"]
        super().__init__(url, **kwargs)


def main() -> int:
    spec = importlib.util.spec_from_file_location("blackbox", REPLICA)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {REPLICA}")
    blackbox = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(blackbox)
    ticklease.Scheduler = DirectScheduler  # type: ignore[misc]
    return int(asyncio.run(blackbox.main()))


if __name__ == "__main__":
    sys.exit(main())
