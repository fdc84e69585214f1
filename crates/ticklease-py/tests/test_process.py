"""Python's process model: signals under a plain script and under uvicorn, a SIGKILLed holder taken over through
the coordination session, and a fork after the core started."""

from __future__ import annotations

import os
import selectors
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import Database

PROGRAMS = Path(__file__).parent / "programs"


def spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-u", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        cwd=PROGRAMS,
        env={**os.environ, **(env or {})},
    )


def line_starting(proc: subprocess.Popen[str], prefix: str, within_s: float) -> str:
    """The first line of ``proc``'s output that starts with ``prefix``, waited for at most ``within_s``."""
    assert proc.stdout is not None
    seen: list[str] = []
    deadline = time.monotonic() + within_s
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not sel.select(left):
                break
            line = proc.stdout.readline()
            if not line:
                break
            seen.append(line)
            if line.startswith(prefix):
                return line.strip()
    raise AssertionError(f"no line {prefix!r} within {within_s} s; output:\n{''.join(seen[-30:])}")


def last_outcome(db: Database, role: str) -> object:
    rows = db.sql("SELECT outcome FROM leader_history WHERE role = %s AND kind = 'term' ORDER BY id DESC", role)
    return rows[0][0] if rows else None


@pytest.mark.parametrize("mode", [[], ["--threads"]], ids=["asyncio", "threads"])
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_releases_the_term_as_interrupted_and_the_script_exits_0(
    db: Database, mode: list[str], sig: signal.Signals
) -> None:
    p = spawn("replica.py", db.app_url, "billing", *mode)
    try:
        line_starting(p, "leading", 30)
        t0 = time.monotonic()
        p.send_signal(sig)
        # The bound: the work returns at once (it waits on its term), then one RELEASE (S = 0.5 s).
        assert line_starting(p, "stopped", 5) == "stopped True"
        assert p.wait(5) == 0
        assert time.monotonic() - t0 < 5
    finally:
        p.kill()
        p.wait()
    assert last_outcome(db, "billing") == "interrupted"
    assert db.sql("SELECT holder_id FROM leader_leases WHERE role = 'billing'") == [(None,)]


def test_a_sigkilled_holders_role_is_taken_over_long_before_its_lease_expires(db: Database) -> None:
    # TTL 10 s: a takeover by expiry would take seconds; the holder's coordination session ends with it.
    first = spawn("replica.py", db.app_url, "outbox", "--direct", "--ttl", "10")
    second = None
    try:
        line_starting(first, "leading", 30)
        second = spawn("replica.py", db.app_url, "outbox", "--direct", "--ttl", "10")
        time.sleep(1.5)  # the second replica is up and following (its first look found the role held)
        t0 = time.monotonic()
        first.kill()
        line_starting(second, "leading", 10)
        took = time.monotonic() - t0
        assert took < 3.0, f"taken over after {took:.2f} s"
    finally:
        for p in (first, second):
            if p is not None:
                p.kill()
                p.wait()


def test_a_forked_child_leads_on_a_runtime_of_its_own(db: Database) -> None:
    p = spawn("forked.py", db.app_url, "forked")
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0, out
    assert "child led 1 released True" in out
    assert "parent sees ['forked']" in out


def test_uvicorn_shutdown_stops_the_scheduler_in_the_lifespan_and_releases_the_term(db: Database) -> None:
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    env = {"TICKLEASE_URL": db.app_url, "TICKLEASE_ROLE": "web_outbox"}
    p = spawn("-m", "uvicorn", "fastapi_app:app", "--port", "0", env=env)
    try:
        line_starting(p, "leading", 30)
        p.send_signal(signal.SIGTERM)
        assert line_starting(p, "stopped", 10) == "stopped True"
        # uvicorn raises the signal again once it has shut down (its exit status says why it stopped).
        assert p.wait(10) in (0, -signal.SIGTERM)
    finally:
        p.kill()
        p.wait()
    assert last_outcome(db, "web_outbox") == "interrupted"


def test_the_interpreter_exits_cleanly_after_a_run_every_time(db: Database) -> None:
    # Without the core's runtime shut down at exit, a thread of it called into the finalizing interpreter:
    # a segmentation fault in about one exit in three.
    codes = []
    for _ in range(8):
        p = spawn("replica.py", db.app_url, "exits")
        try:
            line_starting(p, "leading", 30)
            p.send_signal(signal.SIGINT)
            codes.append(p.wait(10))
        finally:
            p.kill()
            p.wait()
    assert codes == [0] * 8


def signals_blocked(pid: int, tid: str) -> int:
    """The blocked-signal mask of thread ``tid`` of process ``pid`` (bit n-1 for signal n)."""
    status = Path(f"/proc/{pid}/task/{tid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigBlk:")), 16)


@pytest.mark.parametrize("mode", ["async", "threads"])
def test_no_thread_of_the_core_takes_a_signal_meant_for_python(db: Database, mode: str) -> None:
    # The kernel gives a process-directed SIGINT to any thread that does not block it. Taken by a core thread,
    # it does not interrupt the main thread's sleep, where Python runs the handler.
    # A plain function's work runs on a Python thread the core starts (which inherits the core's name): it
    # takes signals as any Python thread does, and so do the processes it starts.
    p = spawn("replica.py", db.app_url, "masks", *(["--threads"] if mode == "threads" else []))
    try:
        work = line_starting(p, "leading", 30).split(" on ")[1]
        threads = {
            t: Path(f"/proc/{p.pid}/task/{t}/comm").read_text().strip() for t in os.listdir(f"/proc/{p.pid}/task")
        }
        core = [t for t, name in threads.items() if name.startswith("ticklease") and t != work]
        assert core, threads
        wanted = 1 << (signal.SIGINT - 1) | 1 << (signal.SIGTERM - 1)
        assert all(signals_blocked(p.pid, t) & wanted == wanted for t in core), [
            hex(signals_blocked(p.pid, t)) for t in core
        ]
        assert signals_blocked(p.pid, str(p.pid)) & wanted == 0, "the main thread takes them"
        assert signals_blocked(p.pid, work) & wanted == 0, "the work's thread takes them"
    finally:
        p.kill()
        p.wait()


def test_a_sigterm_releases_the_term_within_the_grace_while_the_work_blocks_the_event_loop(db: Database) -> None:
    # The work blocks the loop (time.sleep(30)): the loop's own signal handlers could not have run for 30 s;
    # Python's run between bytecodes, and the core releases the term on its own threads.
    p = spawn("replica.py", db.app_url, "blocked", "--stuck")
    try:
        line_starting(p, "leading", 30)
        t0 = time.monotonic()
        p.send_signal(signal.SIGTERM)
        # The shutdown grace (the TTL, 2 s), the abandon's RELEASE (S, 0.5 s), and a margin for a loaded machine.
        while last_outcome(db, "blocked") != "interrupted":
            assert time.monotonic() - t0 < 8, "released within the grace"
            time.sleep(0.05)
    finally:
        p.kill()
        p.wait()


def test_a_plain_function_that_never_returns_is_abandoned_and_the_interpreter_still_exits_cleanly(
    db: Database,
) -> None:
    # The interpreter used to exit with a thread of the core inside Python: a crash (134 or 139) every time.
    for _ in range(3):
        p = spawn("replica.py", db.app_url, "stuck", "--stuck", "--threads")
        try:
            line_starting(p, "leading", 30)
            p.send_signal(signal.SIGTERM)
            assert line_starting(p, "stopped", 8).startswith("stopped")
            assert p.wait(10) == 0
        finally:
            p.kill()
            p.wait()
        assert last_outcome(db, "stuck") == "interrupted"
