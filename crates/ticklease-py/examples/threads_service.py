"""A service without asyncio: plain functions, each term's work in a thread of the core's pool.

DATABASE_URL=postgres://billing_svc@db/app python threads_service.py
"""

from __future__ import annotations

import os

import psycopg

import ticklease

URL = os.environ["DATABASE_URL"]
scheduler = ticklease.Scheduler(URL)


@scheduler.job("reports", ticklease.Schedule.every(60).retry(attempts=3, backoff=5, backoff_max=60))
def reports(term: ticklease.Term) -> None:
    with psycopg.connect(URL) as conn, conn.transaction():
        cur = conn.execute(
            f"UPDATE report_runs SET started_by = %(token)s WHERE due AND {term.fence.sql}",
            {"token": term.token, **term.fence.params},
        )
        if cur.rowcount == 0:
            return
    # Long work checks its term: a plain function cannot be stopped from outside.
    for chunk in range(10):
        if term.wait(0.1):  # True: lost or stopping
            return
        if not send(chunk):
            raise ticklease.Failed(f"chunk {chunk} refused")  # released as failed, retried after its backoff


def send(chunk: int) -> bool:
    return True


if __name__ == "__main__":
    stopped = scheduler.run_blocking()  # SIGTERM / Ctrl-C: every term released as interrupted
    raise SystemExit(0 if stopped.all_released else 1)
