#!/usr/bin/env python3
"""The black-box replica of docs/black-box.md, on the ``ticklease`` package (the Rust core).

Reads the harness's environment and leads TICKLEASE_ROLE with a coordination session on the same URL; each
term's work is: a fenced claim, a wait of TICKLEASE_WORK_MS (cut short when the term is lost: then no second
claim), the claim again. SIGTERM/SIGINT: the work stops, its term is released ``interrupted``, the process exits 0.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys

import psycopg

import ticklease

CLAIM = """INSERT INTO blackbox_claims (role, token, replica, seq, at, occurrence)
SELECT %(role)s::text, %(token)s::bigint, %(replica)s::text, n.seq, clock_timestamp(),
       (SELECT l.occurrence FROM leader_leases AS l WHERE l.role = %(role)s::text)
  FROM (SELECT coalesce(max(c.seq), 0) + 1 AS seq FROM blackbox_claims AS c WHERE c.role = %(role)s::text) AS n
 WHERE """


def env_ms(name: str) -> float:
    value = os.environ.get(name, "")
    if not value.strip().isdigit():
        raise ValueError(f"{name} must be a whole number of ms, not {value!r}")
    return int(value) / 1000


def schedule(spec: str) -> ticklease.Schedule:
    kind, _, rest = spec.partition(" ")
    if kind == "every":
        return ticklease.Schedule.every(env_ms_text(rest))
    if kind == "cron":
        return ticklease.Schedule.cron(rest)
    raise ValueError(f"TICKLEASE_SCHEDULE: `every <ms>` or `cron <expr>`, not {spec!r}")


def env_ms_text(text: str) -> float:
    if not text.strip().isdigit():
        raise ValueError(f"a whole number of ms, not {text!r}")
    return int(text) / 1000


async def claim(url: str, replica: str, term: ticklease.Term) -> bool:
    """One fenced claim, committed; False when the fence refused it (or a generation-6 commit check did)."""
    server = term.server
    # The term's own server (of a multi-host URL, the one the core chose by timeline), not the URL's host order.
    where: dict[str, str] = {} if server is None else {"host": server.host, "port": str(server.port)}
    if server is not None and server.hostaddr is not None:
        where["hostaddr"] = server.hostaddr
    try:
        conn = await psycopg.AsyncConnection.connect(psycopg.conninfo.make_conninfo(url, **where), connect_timeout=5)
        async with conn, conn.transaction():
            cur = await conn.execute(
                CLAIM + term.fence.sql,
                {"role": term.role, "token": term.token, "replica": replica, **term.fence.params},
            )
            claimed = cur.rowcount == 1
    except psycopg.errors.SerializationFailure:
        return False  # 40001 at COMMIT: the term ended first
    except psycopg.Error as exc:
        raise ticklease.Failed(f"claim: {type(exc).__name__}: {str(exc).strip()[:200]}") from exc
    if claimed:
        logging.info("claim role=%s token=%s", term.role, term.token)
    return claimed


async def main() -> int:
    replica = os.environ.get("TICKLEASE_REPLICA", "r?")
    logging.basicConfig(
        stream=sys.stderr, level=logging.INFO, format=f"%(asctime)s {replica} %(levelname)s %(message)s"
    )
    try:
        url, role = os.environ["TICKLEASE_URL"], os.environ["TICKLEASE_ROLE"]
        config = ticklease.Config(
            lease_ttl=env_ms("TICKLEASE_LEASE_TTL_MS"),
            heartbeat_every=env_ms("TICKLEASE_HEARTBEAT_MS"),
            statement_timeout=env_ms("TICKLEASE_STATEMENT_TIMEOUT_MS"),
            abandon_after=env_ms("TICKLEASE_ABANDON_MS"),
            max_poll=env_ms("TICKLEASE_MAX_POLL_MS"),
        )
        wait_s = env_ms("TICKLEASE_WORK_MS")
        every = schedule(os.environ["TICKLEASE_SCHEDULE"])
    except (KeyError, ValueError) as exc:
        logging.error("bad environment: %s", exc)
        return 2
    scheduler = ticklease.Scheduler(url, config=config, direct_url=url)

    @scheduler.job(role, every)
    async def work(term: ticklease.Term) -> None:
        if not await claim(url, replica, term):
            await term.cancelled()  # refused: the heartbeat ends the term as lost
            return
        try:
            await asyncio.wait_for(term.cancelled(), wait_s)
            return  # lost or stopping: no second claim
        except asyncio.TimeoutError:
            pass
        if not await claim(url, replica, term):
            await term.cancelled()

    async def orphaned() -> None:
        # Under `sh -c` without exec a signal may reach only the shell: never outlive it.
        parent = os.getppid()
        while os.getppid() == parent:
            await asyncio.sleep(0.1)
        scheduler.stop()

    watch = asyncio.ensure_future(orphaned())
    logging.info("replica start role=%s schedule=%s", role, os.environ["TICKLEASE_SCHEDULE"])
    stopped = await scheduler.run()
    watch.cancel()
    logging.info("replica exit: %s", stopped)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
