"""A replica for the process tests: leads ROLE, prints ``leading <token> on <thread id>`` when a term starts
and holds it until the term is cancelled; ``--threads`` runs plain-function work under ``run_blocking``, else
``async def`` under asyncio. Exits 0 with ``stopped <all_released>`` after a stop."""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time

import ticklease


def config(ttl: float) -> ticklease.Config:
    # The test timings' shape at any TTL, in whole milliseconds: H = T/7, S = T/4, A = 3T/5, P = T/10.
    def ms(s: float) -> float:
        return round(s * 1000) / 1000

    return ticklease.Config(
        lease_ttl=ms(ttl),
        heartbeat_every=ms(ttl / 7),
        statement_timeout=ms(ttl / 4),
        abandon_after=ms(ttl * 3 / 5),
        max_poll=ms(ttl / 10),
    )


def say(line: str) -> None:
    print(line, flush=True)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("url")
    p.add_argument("role")
    p.add_argument("--ttl", type=float, default=2.0)
    p.add_argument("--direct", action="store_true", help="a coordination session on the same URL")
    p.add_argument("--threads", action="store_true")
    p.add_argument("--stuck", action="store_true", help="the work ignores its term and never returns")
    a = p.parse_args()
    s = ticklease.Scheduler(a.url, config=config(a.ttl), direct_url=a.url if a.direct else None)
    if a.threads:

        @s.job(a.role, 0.05)
        def hold(term: ticklease.Term) -> None:
            say(f"leading {term.token} on {threading.get_native_id()}")
            while a.stuck:
                time.sleep(0.01)
            term.wait()

        stopped = s.run_blocking()
    else:

        @s.job(a.role, 0.05)
        async def hold_async(term: ticklease.Term) -> None:
            say(f"leading {term.token} on {threading.get_native_id()}")
            if a.stuck:
                time.sleep(30)  # blocks the event loop itself
            await term.cancelled()

        stopped = asyncio.run(s.run())
    say(f"stopped {stopped.all_released}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
