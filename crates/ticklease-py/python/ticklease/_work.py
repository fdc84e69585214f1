"""How the core calls a job's work: the outcome as the crate counts it.

Returned -> ``completed``; :class:`ticklease.Failed` -> ``failed``; any other exception -> ``panicked``, its
traceback logged on the ``ticklease`` logger. A task the core cancels (its term was lost) ends with nobody waiting
for an outcome.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
from concurrent.futures import Future
from typing import Any, Callable, Optional

from ticklease import _native
from ticklease._term import Failed, Term

logger = logging.getLogger("ticklease")

Outcome = tuple[str, Optional[str]]

#: The longest message a failure or panic passes to the core (the history keeps 500 characters).
MESSAGE_MAX = 500


def _describe(exc: BaseException) -> str:
    text = str(exc)
    described = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return described[:MESSAGE_MAX]


def _raised(term: Term, exc: BaseException) -> Outcome:
    if isinstance(exc, Failed):
        return ("failed", _describe(exc))
    logger.error(
        "work of role %s raised (term %s): counted as panicked",
        term.role,
        term.token,
        exc_info=(type(exc), exc, exc.__traceback__),
        extra={"role": term.role, "token": term.token},
    )
    return ("panicked", _describe(exc))


def outcome_sync(work: Callable[[Term], Any], native: _native.Term) -> Outcome:
    """Runs a plain function's work in this (pool) thread."""
    term = Term(native)
    try:
        result = work(term)
    except BaseException as exc:
        return _raised(term, exc)
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            result.close()
        return _raised(term, TypeError("the work returned an awaitable: declare it `async def`"))
    return ("completed", None)


def start_async(
    loop: asyncio.AbstractEventLoop,
    work: Callable[[Term], Any],
    native: _native.Term,
    done: Callable[[str, str | None], None],
) -> Future[None]:
    """Starts an ``async def`` work as a task of ``loop``; ``done`` gets its outcome."""
    term = Term(native)

    async def run() -> None:
        try:
            await work(term)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            done(*_raised(term, exc))
            return
        done("completed", None)

    return asyncio.run_coroutine_threadsafe(run(), loop)
