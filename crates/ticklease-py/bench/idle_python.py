#!/usr/bin/env python3
"""One process leading ROLES roles with the ``ticklease`` package, each due once an hour: after the first ticks
nothing is due, so what the process costs then is the package's idle cost (the bench reads /proc).

Arguments: URL DIRECT_URL [ROLES]. The work of a tick waits 10 ms, as the Rust replica it is compared with
(``ticklease-bench scale-replica --mode per-role --work 10ms``). Runs until SIGTERM (terms released).
"""

from __future__ import annotations

import asyncio
import sys

import ticklease


async def work(term: ticklease.Term) -> None:
    await asyncio.sleep(0.01)


async def main(url: str, direct_url: str, roles: int) -> int:
    scheduler = ticklease.Scheduler(url, direct_url=direct_url, pool_size=8)
    for i in range(roles):
        scheduler.job(f"idle_{i}", ticklease.Schedule.every(3600), work)
    stopped = await scheduler.run()
    print(f"stopped: {stopped}", file=sys.stderr)
    return 0 if stopped.all_released else 1


if __name__ == "__main__":
    roles = int(sys.argv[3]) if len(sys.argv) > 3 else 10
    sys.exit(asyncio.run(main(sys.argv[1], sys.argv[2], roles)))
