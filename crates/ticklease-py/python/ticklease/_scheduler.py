"""The scheduler: the core's, with Python work, run from asyncio or from a thread."""

from __future__ import annotations

import asyncio
import functools
import inspect
import logging
import signal
import socket
import threading
from collections.abc import Awaitable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, Callable, TypeVar, Union, overload

from ticklease import _native
from ticklease._config import Config, Family, Schedule, Seconds, as_schedule, count, optional_seconds
from ticklease._term import Term

Work = Union[Callable[[Term], Awaitable[None]], Callable[[Term], None]]
W = TypeVar("W", bound=Work)

logger = logging.getLogger("ticklease")

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class Stopped:
    """How a run ended."""

    #: Every tick returned within the shutdown grace (none was abandoned).
    loops_finished: bool
    #: Every RELEASE answered or timed out before the run returned.
    releases_done: bool
    #: Terms whose RELEASE failed or did not answer: held until their lease runs out.
    unreleased: int
    summary: str

    @property
    def all_released(self) -> bool:
        """Every term this replica held at the stop was released."""
        return self.releases_done and self.unreleased == 0

    def __str__(self) -> str:
        return self.summary


def _is_async(work: Callable[..., Any]) -> bool:
    while isinstance(work, functools.partial):
        work = work.func
    if inspect.iscoroutinefunction(work):
        return True
    # An object whose class defines `async def __call__`.
    return not inspect.isroutine(work) and inspect.iscoroutinefunction(type(work).__call__)


def _patroni_urls(patroni: str | Sequence[str] | None) -> list[str] | None:
    # One string is a comma-separated list, as TICKLEASE_PATRONI is for the CLI.
    if patroni is None:
        return None
    return patroni.split(",") if isinstance(patroni, str) else list(patroni)


class Scheduler:
    """Runs the jobs of several roles on this replica, each led by one replica at a time.

    Work is an ``async def`` (a task of the loop that awaits :meth:`run`) or a plain function (run in a thread
    of the core's pool), taking a :class:`Term`. Returned: the tick completed. :class:`Failed`: it failed. Any
    other exception: it panicked (logged with its traceback). A lost term cancels an ``async def`` work.

    ``url`` is a libpq URL (several hosts: the core picks the writable one on the newest timeline; TLS as
    ``sslmode`` says). ``direct_url``, a connection straight to Postgres (not through PgBouncer), adds the
    coordination session: a dead replica's roles are taken over in milliseconds, releases and pauses are heard
    at once. ``holder_keys=False`` keeps the wake-ups but no takeover when a session ends: for work the fence
    cannot stop (a side effect outside the database), since a session's end (a link cut on the server's side, a
    restart) does not prove that the replica's work stopped; a dead holder's role then waits for its lease.
    ``patroni``, the REST APIs of a Patroni cluster's members (``http://host:8008``): a term starts, and runs
    on, only while a member confirms the server reached as the primary, so a replica that cannot see a
    promotion stops before the promoted server is written to (the core's ``PgStore::with_patroni``; the start
    refuses timings a term could outlive its server's leadership with).
    """

    def __init__(
        self,
        url: str,
        *,
        config: Config | None = None,
        direct_url: str | None = None,
        holder_keys: bool = True,
        pool_size: int = 8,
        shutdown_timeout: Seconds | None = None,
        patroni: str | Sequence[str] | None = None,
    ) -> None:
        self.config = config or Config()
        self._has_async = False
        self._runner = _native.Runner(
            url,
            self.config._native,
            direct_url,
            holder_keys,
            count("pool_size", pool_size, 1, 64),
            optional_seconds("shutdown_timeout", shutdown_timeout),
            _patroni_urls(patroni),
        )

    @overload
    def job(self, role: str, schedule: Schedule | Seconds) -> Callable[[W], W]: ...
    @overload
    def job(self, role: str, schedule: Schedule | Seconds, work: W) -> W: ...
    def job(self, role: str, schedule: Schedule | Seconds, work: W | None = None) -> W | Callable[[W], W]:
        """Adds the job of ``role``: ``work`` runs once per tick (an interval in seconds or a
        :class:`Schedule`). Usable as a decorator."""
        sched = as_schedule(schedule)

        def add(w: W) -> W:
            is_async = _is_async(w)
            self._runner.job(role, sched._native, w, is_async)
            self._has_async |= is_async
            return w

        return add if work is None else add(work)

    @overload
    def family(self, family: Family, schedule: Schedule | Seconds) -> Callable[[W], W]: ...
    @overload
    def family(self, family: Family, schedule: Schedule | Seconds, work: W) -> W: ...
    def family(self, family: Family, schedule: Schedule | Seconds, work: W | None = None) -> W | Callable[[W], W]:
        """Adds the job of every key of ``family``, as its keys change (the term's role names the key)."""
        sched = as_schedule(schedule)

        def add(w: W) -> W:
            is_async = _is_async(w)
            self._runner.family(family._native, sched._native, w, is_async)
            self._has_async |= is_async
            return w

        return add if work is None else add(work)

    def stop(self) -> None:
        """Stops the run: each running work is told (its term is cancelled with cause ``shutdown``), a work still
        running after the shutdown grace is dropped, and every term is released as interrupted. Safe from any
        thread and from a signal handler."""
        self._runner.stop()

    def metrics_text(self) -> str:
        """The core's Prometheus metrics (OpenMetrics text), refreshed from the database; empty before
        the run has started. ``ticklease.prometheus.Collector`` serves them through ``prometheus_client``."""
        return self._runner.metrics_text()

    async def run(self, *, handle_signals: bool = True) -> Stopped:
        """Runs every job until :meth:`stop` (or SIGTERM / SIGINT, with ``handle_signals`` on the main
        thread), then releases every term. Under a framework that owns the signals (uvicorn), pass
        ``handle_signals=False`` and call :meth:`stop` from its shutdown (a FastAPI lifespan)."""
        loop = asyncio.get_running_loop()
        _native.set_log_level(logger.getEffectiveLevel())
        # Python-level handlers, not the loop's: they run between bytecodes even while a work blocks the loop.
        with _signals_stop(self.stop, handle_signals, loop):
            ran = self._runner.run_async(loop)
            try:
                result = await asyncio.shield(ran)
            except asyncio.CancelledError:
                # The task awaiting the run was cancelled: stop, release, then let the cancellation go on.
                self.stop()
                await ran
                raise
        return Stopped(*result)

    def run_blocking(self, *, handle_signals: bool = True) -> Stopped:
        """As :meth:`run`, in this thread (no asyncio needed; ``async def`` work runs on a loop in a thread
        of its own). SIGTERM and SIGINT stop it when ``handle_signals`` and this is the main thread."""
        _native.set_log_level(logger.getEffectiveLevel())
        with _signals_stop(self.stop, handle_signals), _loop_thread(self._has_async) as loop:
            result = self._runner.run_blocking(loop)
        return Stopped(*result)


@contextmanager
def _signals_stop(
    stop: Callable[[], None], handle: bool, loop: asyncio.AbstractEventLoop | None = None
) -> Iterator[None]:
    if not handle or threading.current_thread() is not threading.main_thread():
        yield
        return

    def handler(signum: int, frame: FrameType | None) -> None:
        stop()

    previous = {sig: signal.signal(sig, handler) for sig in _SIGNALS}
    try:
        with _signals_wake(loop):
            yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


@contextmanager
def _signals_wake(loop: asyncio.AbstractEventLoop | None) -> Iterator[None]:
    """Has a signal wake ``loop``. Python runs a handler when its thread next runs bytecode; a signal that
    lands after the loop's last look and before its ``epoll_wait`` (with nothing scheduled, no timeout) left
    the handler pending and the loop asleep: Ctrl-C stopped nothing (about one in 500 under load). The
    signal's C handler writes to the wakeup descriptor, which the loop watches. Left alone when the
    application set one of its own (``loop.add_signal_handler`` does): that one wakes its loop."""
    if loop is None:
        yield
        return
    reader, writer = socket.socketpair()
    reader.setblocking(False)
    writer.setblocking(False)
    try:
        theirs = signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        if theirs != -1:
            signal.set_wakeup_fd(theirs)
            yield
            return
        loop.add_reader(reader.fileno(), _drain, reader)
        try:
            yield
        finally:
            signal.set_wakeup_fd(-1)
            loop.remove_reader(reader.fileno())
    finally:
        reader.close()
        writer.close()


def _drain(reader: socket.socket) -> None:
    # The bytes only woke the loop: the handler itself runs as the loop's next bytecode does.
    try:
        while reader.recv(4096):
            pass
    except BlockingIOError:
        pass


@contextmanager
def _loop_thread(needed: bool) -> Iterator[asyncio.AbstractEventLoop | None]:
    if not needed:
        yield None
        return
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, name="ticklease-asyncio", daemon=True)
    thread.start()
    try:
        yield loop
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join()
        loop.close()
