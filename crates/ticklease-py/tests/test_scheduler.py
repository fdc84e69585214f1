"""The core's scheduler with Python work, against a real Postgres: leads, fences, outcomes, cancellation."""

from __future__ import annotations

import asyncio
import logging
import signal
import subprocess
import threading
import time
from datetime import datetime
from typing import Any, Callable

import asyncpg  # type: ignore[import-untyped]
import psycopg
import pytest

import ticklease
from conftest import Database, scaled_config

CLAIMS_TABLE = "CREATE TABLE claims (role text, token bigint, at timestamptz DEFAULT clock_timestamp())"


def claim_psycopg(conn: psycopg.Connection[Any], term: ticklease.Term) -> int:
    with conn.transaction():
        cur = conn.execute(
            f"INSERT INTO claims (role, token) SELECT %(role)s, %(token)s WHERE {term.fence.sql}",
            {"role": term.role, "token": term.token, **term.fence.params},
        )
        return cur.rowcount


def history(db: Database, role: str) -> list[tuple[object, ...]]:
    return db.sql(
        "SELECT token, outcome, reason, error FROM leader_history WHERE role = %s AND token IS NOT NULL ORDER BY id",
        role,
    )


def stop_when(s: ticklease.Scheduler, done: Callable[[], bool], bound_s: float = 30.0) -> threading.Thread:
    """Stops ``s`` from a thread of its own once ``done()`` (polled), or after ``bound_s``."""

    def watch() -> None:
        deadline = time.monotonic() + bound_s
        while not done() and time.monotonic() < deadline:
            time.sleep(0.02)
        s.stop()

    t = threading.Thread(target=watch, daemon=True)
    t.start()
    return t


def test_an_async_job_leads_claims_through_the_fence_and_releases_at_stop(db: Database) -> None:
    db.sql(CLAIMS_TABLE)
    db.sql("GRANT INSERT, SELECT ON claims TO ticklease_app")
    s = ticklease.Scheduler(db.app_url, config=scaled_config())
    terms: list[int] = []

    @s.job("billing", 0.05)
    async def billing(term: ticklease.Term) -> None:
        conn = await psycopg.AsyncConnection.connect(db.app_url)
        async with conn, conn.transaction():
            cur = await conn.execute(
                f"INSERT INTO claims (role, token) SELECT %(r)s, %(t)s WHERE {term.fence.sql}",
                {"r": term.role, "t": term.token, **term.fence.params},
            )
            assert cur.rowcount == 1
        terms.append(term.token)
        if len(terms) == 3:
            s.stop()

    async def main() -> ticklease.Stopped:
        return await asyncio.wait_for(s.run(handle_signals=False), 30)

    stopped = asyncio.run(main())
    assert stopped.all_released, stopped
    assert terms == sorted(terms) and len(set(terms)) == len(terms) >= 3
    claimed = db.sql("SELECT token FROM claims ORDER BY at")
    assert [t for (t,) in claimed] == terms
    # The third term's own work stopped the scheduler: it ended before or after the stop reached it.
    outcomes = [h[1] for h in history(db, "billing")]
    assert outcomes[:2] == ["completed", "completed"] and outcomes[2] in ("completed", "interrupted")
    assert len(outcomes) == 3


def test_a_thread_job_runs_under_run_blocking_and_a_stop_from_another_thread_ends_it(db: Database) -> None:
    db.sql(CLAIMS_TABLE)
    db.sql("GRANT INSERT, SELECT ON claims TO ticklease_app")
    s = ticklease.Scheduler(db.app_url, config=scaled_config())
    started = threading.Event()

    @s.job("outbox", 0.05)
    def outbox(term: ticklease.Term) -> None:
        with psycopg.connect(db.app_url) as conn:
            assert claim_psycopg(conn, term) == 1
        started.set()
        # Holds the term until the stop: wait() releases the GIL and wakes at the cancellation.
        assert term.wait(30) is True
        assert term.cause == "shutdown"

    def stop_once_started() -> None:
        started.wait(30)
        s.stop()

    stopper = threading.Thread(target=stop_once_started)
    stopper.start()
    stopped = s.run_blocking(handle_signals=False)
    stopper.join()
    assert stopped.all_released, stopped
    assert history(db, "outbox")[-1][1] == "interrupted"
    row = ticklease.status(db.operator_url).rows[0]
    assert row["role"] == "outbox" and row["held"] is False


def test_outcomes_are_pythons_returned_failed_and_any_other_exception_panicked(
    db: Database, caplog: pytest.LogCaptureFixture
) -> None:
    s = ticklease.Scheduler(db.app_url, config=scaled_config())

    @s.job("ok", 10.0)
    def ok(term: ticklease.Term) -> None:
        pass

    @s.job("failing", 10.0)
    async def failing(term: ticklease.Term) -> None:
        raise ticklease.Failed("the provider said no")

    @s.job("broken", 10.0)
    def broken(term: ticklease.Term) -> None:
        raise KeyError("row 17")

    stop_when(s, lambda: all(history(db, r) for r in ("ok", "failing", "broken")))
    with caplog.at_level(logging.INFO, logger="ticklease"):
        stopped = s.run_blocking(handle_signals=False)
    assert stopped.all_released, stopped
    assert [h[1] for h in history(db, "ok")] == ["completed"]
    assert [(h[1], h[3]) for h in history(db, "failing")] == [("failed", "Failed: the provider said no")]
    assert [(h[1], h[3]) for h in history(db, "broken")] == [("panicked", "KeyError: 'row 17'")]
    raised = [r for r in caplog.records if "work of role broken raised" in r.getMessage()]
    assert raised and raised[0].exc_info is not None and "row 17" in str(raised[0].exc_info[1])
    assert getattr(raised[0], "role", None) == "broken"
    # The core's own lines reach `logging` too (from a thread of their own), each field in the record's extra.
    deadline = time.monotonic() + 5
    while not (core := [r for r in caplog.records if r.getMessage().startswith("tick panicked")]):
        assert time.monotonic() < deadline, "the core's line reached logging"
        time.sleep(0.01)
    assert core and core[0].levelno == logging.ERROR and getattr(core[0], "role", None) == "broken"


def test_a_pause_cancels_an_async_works_task_and_the_term_says_why(db: Database) -> None:
    s = ticklease.Scheduler(db.app_url, config=scaled_config())
    seen: dict[str, Any] = {}
    holding = threading.Event()

    @s.job("dunning", 10.0)
    async def dunning(term: ticklease.Term) -> None:
        holding.set()
        try:
            await term.cancelled()
        finally:
            # The core drops a lost term's work at once (its task is cancelled), or the term's
            # cancellation wakes it first: either way the cause is already set.
            seen["cause"] = term.cause

    async def main() -> ticklease.Stopped:
        run = asyncio.ensure_future(s.run(handle_signals=False))
        await asyncio.get_running_loop().run_in_executor(None, holding.wait, 30)
        t0 = time.monotonic()
        assert await asyncio.to_thread(ticklease.pause, db.operator_url, "dunning", by="ops", reason="test")
        deadline = time.monotonic() + 30
        while "cause" not in seen and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        # The pause is heard at the next RENEW: within a heartbeat (generous: a loaded machine).
        seen["after"] = time.monotonic() - t0
        s.stop()
        return await asyncio.wait_for(run, 30)

    stopped = asyncio.run(main())
    assert stopped.all_released, stopped
    assert seen["cause"] == "lost:paused"
    assert seen["after"] < 0.3 + 1.2 + 1.0
    outcome = history(db, "dunning")[-1]
    assert outcome[1] == "lost" and outcome[2] == "paused"


def test_a_stale_terms_fence_claims_nothing_through_asyncpg(db: Database) -> None:
    db.sql(CLAIMS_TABLE)
    db.sql("GRANT INSERT, SELECT ON claims TO ticklease_app")
    s = ticklease.Scheduler(db.app_url, config=scaled_config())
    kept: list[ticklease.Term] = []

    @s.job("relay", 0.05)
    async def relay(term: ticklease.Term) -> None:
        kept.append(term)
        if len(kept) == 2:
            s.stop()

    async def main() -> tuple[int, int]:
        await s.run(handle_signals=False)
        conn = await asyncpg.connect(db.app_url, statement_cache_size=0)
        try:
            counts = []
            for term in (kept[0], kept[-1]):
                async with conn.transaction():
                    status = await conn.execute(
                        f"INSERT INTO claims (role, token) SELECT $1, $2 WHERE {term.fence.predicate(3)}",
                        term.role,
                        term.token,
                        *term.fence.args,
                    )
                counts.append(int(status.split()[-1]))
            return counts[0], counts[1]
        finally:
            await conn.close()

    stale, last = asyncio.run(main())
    # Both terms are over (released): neither fence passes.
    assert (stale, last) == (0, 0)
    assert kept[0].token < kept[1].token


def test_metrics_come_from_the_core_and_through_prometheus_client(db: Database) -> None:
    from prometheus_client import CollectorRegistry, generate_latest

    from ticklease.prometheus import Collector

    s = ticklease.Scheduler(db.app_url, config=scaled_config())
    texts: list[str] = []

    @s.job("report", 0.05)
    def report(term: ticklease.Term) -> None:
        registry = CollectorRegistry()
        registry.register(Collector(s))
        texts.append(generate_latest(registry).decode())
        s.stop()

    assert s.metrics_text() == ""
    s.run_blocking(handle_signals=False)
    assert 'role="report"' in texts[0]
    assert "ticklease_leader" in texts[0] or "leader_" in texts[0]


def test_operator_calls_pause_unpause_and_run_now_from_a_script(db: Database) -> None:
    s = ticklease.Scheduler(db.app_url, config=scaled_config())

    def nightly(term: ticklease.Term) -> None:
        raise ticklease.Failed("upstream down")  # a failed tick waits its interval: a cooldown to clear

    s.job("nightly", 3600.0, nightly)
    stop_when(s, lambda: bool(history(db, "nightly")))
    s.run_blocking(handle_signals=False)
    assert ticklease.status(db.operator_url).rows[0]["not_before"] is not None
    assert ticklease.pause(db.operator_url, "nightly", by="alice", reason="key rotation") is True
    row = ticklease.status(db.operator_url).rows[0]
    assert (row["paused_by"], row["pause_reason"]) == ("alice", "key rotation")
    assert ticklease.unpause(db.operator_url, "nightly") is True
    assert ticklease.run_now(db.operator_url, "nightly") is True  # it had a cooldown, which stays
    assert ticklease.status(db.operator_url).rows[0]["not_before"] is not None
    # The manual run starts at once, though the hour and the cooldown are not over.
    ran: list[int] = []
    again = ticklease.Scheduler(db.app_url, config=scaled_config())
    again.job("nightly", 3600.0, lambda term: ran.append(term.token))
    stop_when(again, lambda: bool(ran), bound_s=10.0)
    again.run_blocking(handle_signals=False)
    assert len(ran) == 1
    with pytest.raises(ticklease.TickleaseError):
        ticklease.pause(db.operator_url, "no_such_role", by="alice", reason="x")
    with pytest.raises(ValueError, match="role"):
        ticklease.pause(db.operator_url, "bad name!", by="alice", reason="x")


def test_a_scheduler_runs_once() -> None:
    s = ticklease.Scheduler("postgres://nobody@127.0.0.1:1/x")
    s.stop()
    with pytest.raises(ticklease.TickleaseError):
        s.run_blocking(handle_signals=False)
    with pytest.raises(RuntimeError, match="runs once"):
        s.run_blocking(handle_signals=False)


def test_a_familys_keys_are_each_led_and_a_removed_key_is_cancelled_as_removed(db: Database) -> None:
    s = ticklease.Scheduler(db.app_url, config=scaled_config())
    family = ticklease.Family("tenant_sync", ["acme", "globex"])
    assert family.add("initech") == "tenant_sync:initech"
    led: dict[str, int] = {}
    causes: list[str | None] = []

    @s.family(family, 0.05)
    def sync(term: ticklease.Term) -> None:
        led[term.role] = term.token
        if term.role == "tenant_sync:globex":
            assert term.wait(30)
            causes.append(term.cause)

    def remove_then_stop() -> None:
        deadline = time.monotonic() + 30
        while len(led) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        family.remove("globex")
        while not causes and time.monotonic() < deadline:
            time.sleep(0.02)
        s.stop()

    t = threading.Thread(target=remove_then_stop)
    t.start()
    stopped = s.run_blocking(handle_signals=False)
    t.join()
    assert stopped.all_released, stopped
    assert sorted(led) == ["tenant_sync:acme", "tenant_sync:globex", "tenant_sync:initech"]
    assert causes == ["removed"]
    assert family.keys() == ["acme", "initech"]


def test_the_history_reads_terms_and_operator_events_and_escape_hides_nothing(db: Database) -> None:
    s = ticklease.Scheduler(db.app_url, config=scaled_config())

    @s.job("audited", 3600.0)
    def audited(term: ticklease.Term) -> None:
        term.keep_output("sent 3 invoices")
        raise ticklease.Failed("provider \u202edown")

    stop_when(s, lambda: bool(history(db, "audited")))
    s.run_blocking(handle_signals=False)
    ticklease.pause(db.operator_url, "audited", by="alice\x1b[31m", reason="rotation")
    entries = ticklease.history(db.operator_url, "audited")
    assert [e["kind"] for e in entries] == ["pause", "term"]
    term = entries[1]
    assert (term["outcome"], term["output"]) == ("failed", "sent 3 invoices")
    assert term["error"] == "Failed: provider \u202edown"  # as stored: escape before showing it
    assert ticklease.escape(term["error"]) == "Failed: provider \\u{202e}down"
    assert ticklease.escape(entries[0]["by"]) == "alice\\u{1b}[31m"
    with pytest.raises(ValueError, match="limit"):
        ticklease.history(db.operator_url, limit=0)


def test_the_gil_is_released_while_the_core_waits_on_the_network() -> None:
    # A server that accepts and never answers: the core waits its statement timeout on it.
    import socket

    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen()
    port = silent.getsockname()[1]
    spins = 0
    done = threading.Event()

    def spin() -> None:
        nonlocal spins
        while not done.is_set():
            spins += 1

    t = threading.Thread(target=spin)
    t.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(ticklease.TickleaseError):
            ticklease.status(f"postgres://nobody@127.0.0.1:{port}/x?connect_timeout=30")
        waited = time.monotonic() - t0
        before = spins
        time.sleep(0.2)
        per_second_free = (spins - before) / 0.2
    finally:
        done.set()
        t.join()
        silent.close()
    assert waited >= 1.5, "the core waited (its statement timeout, 2 s) on the silent server"
    # While the core waited, the other thread ran at (a good part of) its free speed: the GIL was released.
    assert before / waited > per_second_free / 10, (before, waited, per_second_free)


def test_a_cron_job_runs_occurrences_and_a_long_lived_job_is_recorded_as_such(db: Database) -> None:
    s = ticklease.Scheduler(db.app_url, config=scaled_config())
    occurrences: list[datetime] = []

    @s.job("every_second", ticklease.Schedule.cron("* * * * * *", zone="Europe/Berlin", catch_up="skip"))
    async def every_second(term: ticklease.Term) -> None:
        assert term.occurrence is not None
        occurrences.append(term.occurrence)

    @s.job("relay", ticklease.Schedule.long_lived(restart=1.0))
    async def relay(term: ticklease.Term) -> None:
        await term.cancelled()

    stop_when(s, lambda: len(occurrences) >= 3)
    s.run_blocking(handle_signals=False)
    assert len(occurrences) >= 3
    assert all(o.microsecond == 0 and o.tzinfo is not None for o in occurrences)
    assert occurrences == sorted(set(occurrences)), "each occurrence once, in order"
    rows = {r["role"]: r for r in ticklease.status(db.operator_url).rows}
    assert rows["relay"]["long_lived"] is True
    assert rows["every_second"]["schedule"] is not None


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no str for you")


def test_every_async_work_reports_one_outcome_whatever_it_raises(db: Database) -> None:
    # A CancelledError of the work's own, an exception whose str() raises: each is panicked and the role is led
    # again, never held by a replica whose work is gone.
    s = ticklease.Scheduler(db.app_url, config=scaled_config())

    @s.job("cancels_itself", 0.05)
    async def cancels_itself(term: ticklease.Term) -> None:
        raise asyncio.CancelledError()

    @s.job("unprintable", 0.05)
    async def unprintable(term: ticklease.Term) -> None:
        raise Unprintable()

    @s.job("unprintable_failed", 0.05)
    def unprintable_failed(term: ticklease.Term) -> None:
        raise type("UnprintableFailed", (ticklease.Failed,), {"__str__": Unprintable.__str__})()

    roles = ("cancels_itself", "unprintable", "unprintable_failed")
    stop_when(s, lambda: all(len(history(db, r)) >= 2 for r in roles), bound_s=20)
    s.run_blocking(handle_signals=False)
    outcomes = {r: [h[1] for h in history(db, r)] for r in roles}
    assert outcomes["cancels_itself"][:2] == ["panicked", "panicked"], outcomes
    assert outcomes["unprintable"][:2] == ["panicked", "panicked"], outcomes
    assert outcomes["unprintable_failed"][0] == "failed", outcomes
    assert history(db, "unprintable")[0][3] == "Unprintable: (its str() raised)"


def test_a_signal_whose_handler_ran_on_another_thread_still_wakes_the_asyncio_loop(db: Database) -> None:
    # Python runs a signal's handler when the main thread next runs bytecode. A signal that landed after the
    # loop's last look and before its epoll_wait (or on another thread) left the loop asleep and Ctrl-C stopped
    # nothing: about one exit in 500 under load. Here the signal is sent to a thread of the work's own, so
    # the main thread's epoll_wait is never interrupted: only the wakeup descriptor can wake the loop.
    s = ticklease.Scheduler(db.app_url, config=scaled_config())
    sent: list[float] = []

    def signal_this_thread() -> None:
        time.sleep(0.3)  # the loop is asleep by then: nothing of it is scheduled
        sent.append(time.monotonic())
        signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

    @s.job("woken", 0.05)
    async def woken(term: ticklease.Term) -> None:
        threading.Thread(target=signal_this_thread, daemon=True).start()
        await term.cancelled()

    async def main() -> ticklease.Stopped:
        return await asyncio.wait_for(s.run(), 60)

    stopped = asyncio.run(main())
    assert stopped.all_released, stopped
    assert sent and time.monotonic() - sent[0] < 10, "stopped at the signal, not when the loop woke for another reason"


def test_a_plain_function_work_and_its_children_take_signals_as_a_python_thread_would(db: Database) -> None:
    # The work's thread is started by a core thread, whose signals are all blocked: a child it started
    # inherited that, and its terminate() was left pending (the outside review's F3).
    s = ticklease.Scheduler(db.app_url, config=scaled_config())
    codes: list[int | None] = []

    @s.job("children", 0.05)
    def children(term: ticklease.Term) -> None:
        child = subprocess.Popen(["sleep", "30"])
        child.terminate()
        try:
            codes.append(child.wait(10))
        except subprocess.TimeoutExpired:
            child.kill()
            codes.append(None)
        s.stop()

    stopped = s.run_blocking(handle_signals=False)
    assert stopped.all_released, stopped
    assert codes == [-signal.SIGTERM]
