#!/usr/bin/env python3
"""The black-box replica of docs/black-box.md, on ticklease_client.

Reads the harness's environment, leads TICKLEASE_ROLE; each term's work is: a fenced claim, a wait of
TICKLEASE_WORK_MS (cut short when the term is lost or abandoned: then no second claim), the claim again.
SIGTERM/SIGINT: the work stops, its term is RELEASEd `interrupted`, the process exits 0.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading

import psycopg

from ticklease_client import Config, Leader, StatementTimeout, Term, TermLost, WorkFailed, parse_schedule

CLAIM = """INSERT INTO blackbox_claims (role, token, replica, seq, at, occurrence)
SELECT %(role)s::text, %(token)s::bigint, %(replica)s::text, n.seq, clock_timestamp(),
       (SELECT l.occurrence FROM leader_leases AS l WHERE l.role = %(role)s::text)
  FROM (SELECT coalesce(max(c.seq), 0) + 1 AS seq FROM blackbox_claims AS c WHERE c.role = %(role)s::text) AS n
 WHERE (SELECT leader_fence(%(role)s::text, %(token)s::bigint))"""


def env_ms(name: str) -> int:
    value = os.environ.get(name, "")
    if not value.strip().isdigit():
        raise SystemExit(f"blackbox: {name} must be a whole number of ms, got {value!r}")
    return int(value)


def main() -> int:
    replica = os.environ.get("TICKLEASE_REPLICA", "r?")
    logging.basicConfig(stream=sys.stderr, level=logging.INFO,
                        format=f"%(asctime)s {replica} %(levelname)s %(message)s")
    try:
        url, role = os.environ["TICKLEASE_URL"], os.environ["TICKLEASE_ROLE"]
        schedule = parse_schedule(os.environ["TICKLEASE_SCHEDULE"])
        p = env_ms("TICKLEASE_MAX_POLL_MS")
        config = Config(lease_ttl_ms=env_ms("TICKLEASE_LEASE_TTL_MS"), heartbeat_ms=env_ms("TICKLEASE_HEARTBEAT_MS"),
                        statement_timeout_ms=env_ms("TICKLEASE_STATEMENT_TIMEOUT_MS"),
                        abandon_ms=env_ms("TICKLEASE_ABANDON_MS"), max_poll_ms=p,
                        max_poll_listening_ms=p)  # the harness's bounds count in P even with a listener
        work_s = env_ms("TICKLEASE_WORK_MS") / 1000
    except (KeyError, ValueError) as exc:
        logging.error("bad environment: %s", exc)
        return 2

    def claim(term: Term) -> None:
        try:
            term.fence(CLAIM, {"replica": replica})
            logging.info("claim role=%s token=%s", term.role, term.token)
        except TermLost:
            raise
        except (psycopg.Error, StatementTimeout) as exc:  # any other error in the work: a failed tick
            raise WorkFailed(f"claim: {type(exc).__name__}: {str(exc).strip()[:200]}") from exc

    def work(term: Term) -> None:
        claim(term)
        if term.wait(work_s):
            return  # lost, abandoned or stopping: no second claim
        claim(term)

    leader = Leader(url, role, schedule, work, config, holder=f"{replica}:{os.uname().nodename}:{os.getpid()}")
    runner = threading.Thread(target=leader.run, name="leader")
    # The handler only sets a flag: the main thread, not the handler, calls stop() (no locks in a handler).
    signalled: list[int] = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, _frame: signalled.append(signum))
    logging.info("replica start role=%s schedule=%s holder=%s", role, os.environ["TICKLEASE_SCHEDULE"], leader.holder)
    parent = os.getppid()
    runner.start()
    # Under `sh -c` (dash does not exec) a signal may reach only the shell; never outlive it as an orphan.
    while runner.is_alive() and not signalled and os.getppid() == parent:
        runner.join(0.05)
    if runner.is_alive():
        logging.info("%s: stopping", f"signal {signalled[0]}" if signalled else "parent gone")
        leader.stop()
        runner.join()
    logging.info("replica exit")
    return 0


if __name__ == "__main__":
    sys.exit(main())
