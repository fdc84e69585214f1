"""The core used before ``fork``, then in the child: the child's runtime is its own, and it leads."""

from __future__ import annotations

import os
import sys

import ticklease


def main() -> int:
    url, role = sys.argv[1], sys.argv[2]
    ticklease.status(url)  # the parent's runtime starts (threads, connections)
    pid = os.fork()
    if pid == 0:
        s = ticklease.Scheduler(url, config=ticklease.Config.scaled_down(5))
        led: list[int] = []

        def once(term: ticklease.Term) -> None:
            led.append(term.token)
            s.stop()

        s.job(role, 0.05, once)
        stopped = s.run_blocking(handle_signals=False)
        print(f"child led {len(led)} released {stopped.all_released}", flush=True)
        os._exit(0 if led and stopped.all_released else 1)
    _, status = os.waitpid(pid, 0)
    # The parent's runtime still answers after the fork.
    rows = ticklease.status(url).rows
    print(f"parent sees {[r['role'] for r in rows]}", flush=True)
    return os.waitstatus_to_exitcode(status)


if __name__ == "__main__":
    sys.exit(main())
