"""How the core calls a job's work: the outcome as the crate counts it.

Returned -> ``completed``; :class:`ticklease.Failed` -> ``failed``; any other exception -> ``panicked``, its
traceback logged on the ``ticklease`` logger. Every work reports exactly one outcome, whatever it raises (a
``CancelledError`` of its own, an exception whose ``str()`` raises): a term whose work ended is never left held.
A task the core cancels (its term was lost) reports to nobody: the core stopped waiting for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import threading
from concurrent.futures import Future
from typing import Any, Callable, Optional

from ticklease import _native
from ticklease._term import Failed, Term

logger = logging.getLogger("ticklease")

Outcome = tuple[str, Optional[str]]
Done = Callable[[str, Optional[str]], None]

#: The longest message a failure or panic passes to the core (the history keeps 500 characters).
MESSAGE_MAX = 500


def _describe(exc: BaseException) -> str:
    """``Type: message``; never raises (a ``__str__`` is user code)."""
    try:
        text = str(exc)
    except BaseException:
        text = "(its str() raised)"
    described = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return described[:MESSAGE_MAX]


def _raised(term: Term, exc: BaseException) -> Outcome:
    if isinstance(exc, Failed):
        return ("failed", _describe(exc))
    # A handler that raises must not take the outcome with it.
    with contextlib.suppress(BaseException):
        logger.error(
            "work of role %s raised (term %s): counted as panicked",
            term.role,
            term.token,
            exc_info=(type(exc), exc, exc.__traceback__),
            extra={"role": term.role, "token": term.token},
        )
    return ("panicked", _describe(exc))


def _run_sync(work: Callable[[Term], Any], term: Term) -> Outcome:
    try:
        result = work(term)
    except BaseException as exc:
        return _raised(term, exc)
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        return _raised(term, TypeError("the work returned an awaitable: declare it `async def`"))
    return ("completed", None)


def start_sync(work: Callable[[Term], Any], native: _native.Term, done: Done) -> None:
    """Runs a plain function's work on a daemon thread of Python's own: the interpreter's exit neither waits
    for a work that does not return nor crashes on it."""
    term = Term(native)

    def run() -> None:
        # Started by a core thread, which blocks every asynchronous signal: this thread and the processes it
        # starts would inherit that (a child's SIGTERM left pending). As a thread of Python's own, none.
        signal.pthread_sigmask(signal.SIG_SETMASK, ())
        outcome: Outcome = ("panicked", "the work's thread ended without an outcome")
        try:
            outcome = _run_sync(work, term)
        finally:
            done(*outcome)

    threading.Thread(target=run, name=f"ticklease-work {term.role}", daemon=True).start()


def start_async(
    loop: asyncio.AbstractEventLoop, work: Callable[[Term], Any], native: _native.Term, done: Done
) -> Future[Outcome]:
    """Starts an ``async def`` work as a task of ``loop``; ``done`` gets its outcome, once."""
    term = Term(native)

    async def run() -> Outcome:
        try:
            await work(term)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            return _raised(term, exc)
        return ("completed", None)

    def report(task: Future[Outcome]) -> None:
        outcome: Outcome
        if task.cancelled():
            # By the core (nobody listens any more), or by the work itself: a defect either way.
            outcome = ("panicked", "the work's task was cancelled")
        else:
            exc = task.exception()
            outcome = task.result() if exc is None else ("panicked", _describe(exc))
        done(*outcome)

    task = asyncio.run_coroutine_threadsafe(run(), loop)
    task.add_done_callback(report)
    return task
