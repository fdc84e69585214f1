"""An asyncio service: a cron billing job in Berlin time and an outbox dispatcher claiming 50 rows behind the fence.

DATABASE_URL=postgres://billing_svc@db/app python asyncio_service.py
"""

from __future__ import annotations

import asyncio
import os

import psycopg

import ticklease

URL = os.environ["DATABASE_URL"]
scheduler = ticklease.Scheduler(URL, direct_url=os.environ.get("TICKLEASE_DIRECT_URL"))


@scheduler.job("billing", ticklease.Schedule.cron("5 0 * * *", zone="Europe/Berlin"))
async def billing(term: ticklease.Term) -> None:
    # The occurrence is the billing period's key: the same for every attempt of it.
    period = term.occurrence
    print(f"billing for {period}, term {term.token}")


@scheduler.job("outbox", 2.0)
async def outbox(term: ticklease.Term) -> None:
    # Connect to the server the term started on (of a multi-host URL, the promoted one).
    async with await psycopg.AsyncConnection.connect(URL) as conn, conn.transaction():
        cur = await conn.execute(
            "UPDATE outbox SET claimed_by = %(token)s WHERE id IN ("
            "  SELECT id FROM outbox WHERE claimed_by IS NULL ORDER BY id LIMIT 50 FOR UPDATE SKIP LOCKED)"
            f" AND {term.fence.sql} RETURNING id, payload",
            {"token": term.token, **term.fence.params},
        )
        rows = await cur.fetchall()
    for _id, _payload in rows:
        if term.is_cancelled:
            return  # lost or stopping: the rows stay claimed by this term, reclaimed by a later one
        ...  # send


if __name__ == "__main__":
    stopped = asyncio.run(scheduler.run())  # SIGTERM / Ctrl-C: every term released as interrupted
    raise SystemExit(0 if stopped.all_released else 1)
