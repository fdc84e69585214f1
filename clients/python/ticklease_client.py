"""A ticklease client for Python, written from docs/sql-api.md alone.

ticklease's decisions are Postgres functions; this module keeps the client's side of the contract: one
autocommit statement per lease call, bounded by S on the client; a heartbeat on the monotonic clock with the
abandon rule; RELEASE by outcome; fenced claims; notifications as hints. Threads: the caller's thread runs
the follower loop and the work, one thread per term renews, one listens, and every statement runs in a short
worker thread so that a hung link can be cut (its socket is shut down) when its bound passes.
"""
from __future__ import annotations

import logging
import math
import os
import random
import socket
import threading
import time
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from typing import Any, Callable, Optional, Union

import psycopg
from croniter import croniter
from psycopg import errors as pgerr
from psycopg.rows import dict_row

log = logging.getLogger("ticklease")
MAX_MS = 86_400_000  # every duration is 1 ms ..= 24 h (reference: Conventions, Units)
CHANNEL = "ticklease"
HINT_GAP = 0.2  # act on at most one notification per role every 200 ms
UTC = timezone.utc


class TermLost(Exception):
    """The term is over (fence said no, COMMIT 40001, RENEW false, or abandoned)."""

    def __init__(self, reason: Optional[str] = None):
        super().__init__(reason or "term lost")
        self.reason = reason  # in leader_release's words, or None when unknown (a failed fence)


class WorkFailed(Exception):
    """Raised by the work for an expected failure: RELEASE `failed` (any other exception is `panicked`)."""


class StatementTimeout(Exception):
    """A statement did not answer within its client-side bound; its connection was cut."""


def _ms(name: str, value: Any, low: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= MAX_MS:
        raise ValueError(f"{name} must be a whole number of ms within {low} ..= {MAX_MS}, got {value!r}")
    return value


@dataclass(frozen=True)
class Config:
    """T, H, S, A, P in ms; the reference requires A + S < T and H < A (the Rust Config refuses others)."""

    lease_ttl_ms: int = 10_000  # T
    heartbeat_ms: int = 3_000  # H
    statement_timeout_ms: int = 2_000  # S
    abandon_ms: int = 6_000  # A
    max_poll_ms: int = 5_000  # P
    max_poll_listening_ms: int = 60_000  # a follower's cap while a listener is connected (rule 7)

    def __post_init__(self) -> None:
        t, h = _ms("lease_ttl_ms (T)", self.lease_ttl_ms), _ms("heartbeat_ms (H)", self.heartbeat_ms)
        s, a = _ms("statement_timeout_ms (S)", self.statement_timeout_ms), _ms("abandon_ms (A)", self.abandon_ms)
        p = _ms("max_poll_ms (P)", self.max_poll_ms)
        if _ms("max_poll_listening_ms", self.max_poll_listening_ms) < p:
            raise ValueError(f"max_poll_listening_ms ({self.max_poll_listening_ms}) must be at least P ({p})")
        if a + s >= t:
            raise ValueError(f"abandon_ms + statement_timeout_ms ({a} + {s}) must be less than lease_ttl_ms ({t})")
        if h >= a:
            raise ValueError(f"heartbeat_ms ({h}) must be less than abandon_ms ({a})")


@dataclass(frozen=True)
class Every:
    """An interval role: due interval_ms after its last completed tick ended."""

    interval_ms: int
    long_lived: bool = False

    def __post_init__(self) -> None:
        _ms("interval_ms", self.interval_ms)


@dataclass(frozen=True)
class Cron:
    """A cron role in UTC (six fields: seconds first; five: minutes first), catch-up *latest*.

    The retry policy of a failed attempt is the client's; the reference names it but gives no defaults."""

    expr: str
    max_attempts: int = 3
    retry_backoff_ms: int = 1_000
    starting_deadline_ms: Optional[int] = None  # None: T, as the black-box harness says

    def __post_init__(self) -> None:
        if len(self.expr.split()) not in (5, 6) or not croniter.is_valid(self.expr, second_at_beginning=self.six):
            raise ValueError(f"not a cron expression of 5 or 6 fields: {self.expr!r}")
        if len(self.expr) > 200:
            raise ValueError("a schedule is at most 200 characters")
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        _ms("retry_backoff_ms", self.retry_backoff_ms)

    @property
    def six(self) -> bool:
        return len(self.expr.split()) == 6

    def _it(self, start: datetime) -> croniter:
        return croniter(self.expr, start.astimezone(UTC), second_at_beginning=self.six)  # UTC, whatever TimeZone

    def next_after(self, t: datetime) -> datetime:  # strictly after t
        return self._it(t).get_next(datetime)

    def prev_before(self, t: datetime) -> datetime:  # strictly before t
        return self._it(t).get_prev(datetime)

    def at_or_after(self, t: datetime) -> datetime:
        return self.next_after(t - timedelta(microseconds=1))


def parse_schedule(text: str) -> Union[Every, Cron]:
    """`every <ms>` or `cron <expr>` (docs/black-box.md)."""
    kind, _, rest = text.strip().partition(" ")
    if kind == "every" and rest.strip().isdigit():
        return Every(int(rest))
    if kind == "cron" and rest.strip():
        return Cron(rest.strip())
    raise ValueError(f"schedule must be 'every <ms>' or 'cron <expr>', got {text!r}")


class _Stale(Exception):
    """BEGIN failed on a reused connection: nothing of the transaction ran, a fresh connection may retry it."""


# Cancel requests in flight at once (each a short connection of its own); past that, a cut only shuts its socket.
_CANCELS = threading.BoundedSemaphore(4)


def _cancel_request(conn: psycopg.Connection) -> Optional[Callable[[], Any]]:
    """The request that cancels the connection's statement, taken now, before the worker can close the connection.
    It goes over the connection's own TLS, bounded by its connect_timeout (libpq 17's cancel connection), else as
    libpq's legacy request."""
    try:
        return conn.pgconn.cancel_conn().blocking
    except (AttributeError, psycopg.Error):
        try:
            return conn.pgconn.get_cancel().cancel
        except (AttributeError, psycopg.Error):
            return None


def _send_cancel(send: Callable[[], Any]) -> None:
    """Sends a cancel request on a thread of its own. Shutting the socket down alone frees this side, but a backend
    waiting on a lock never notices: it would hold a connection slot and could still commit (an ACQUIRE whose term
    no one knows of)."""
    if not _CANCELS.acquire(blocking=False):
        return

    def run() -> None:
        try:
            send()
        except Exception as exc:  # a dead link: the socket shutdown did what it could
            log.debug("cancel request failed: %s", exc)
        finally:
            _CANCELS.release()

    try:
        threading.Thread(target=run, name="ticklease-cancel", daemon=True).start()
    except RuntimeError:  # no thread to be had: the slot goes back, the socket is shut anyway
        _CANCELS.release()


class _Link:
    """One connection, used by one statement at a time, every call bounded on the client.

    The call runs in a worker thread; when its bound (or the term) ends first, the socket is shut down through
    our own dup of it, which wakes libpq at once even on a blackholed link; the next call reconnects."""

    def __init__(self, url: str, name: str, *, autocommit: bool = True, retry: bool = True,
                 setup: Optional[Callable[[psycopg.Connection], None]] = None):
        self.url, self.name, self.autocommit, self.retry, self.setup = url, name, autocommit, retry, setup
        self._lock = threading.Lock()
        self._conn: Optional[psycopg.Connection] = None
        self._sock: Optional[socket.socket] = None
        self.connects = 0

    def _connect(self, cut: threading.Event) -> psycopg.Connection:
        # connect_timeout below 2 s is raised to 2 by libpq/psycopg, so S itself is kept by the caller's wait.
        conn = psycopg.connect(self.url, autocommit=self.autocommit, prepare_threshold=None,
                               row_factory=dict_row, connect_timeout=2)
        if not self.autocommit:  # the fence needs READ COMMITTED and a read-write transaction
            conn.isolation_level, conn.read_only = psycopg.IsolationLevel.READ_COMMITTED, False
        if self.setup:
            self.setup(conn)
        with self._lock:
            if cut.is_set():
                conn.close()
                raise StatementTimeout(f"{self.name}: connected too late")
            self._conn, self._sock = conn, socket.socket(fileno=os.dup(conn.pgconn.socket))
            self.connects += 1
        return conn

    def _drop(self, conn: Optional[psycopg.Connection]) -> None:
        with self._lock:
            if conn is not None and conn is self._conn:
                self._conn, sock = None, self._sock
                self._sock = None
                if sock:
                    sock.close()
        if conn is not None:
            conn.close()

    def close(self) -> None:
        with self._lock:
            conn = self._conn
        self._drop(conn)

    def cut(self) -> None:
        """Detach the connection, ask the server to cancel its statement, and shut its socket down: a statement
        in flight fails now here; the worker that ran it closes it, and the next call connects afresh."""
        with self._lock:
            conn, sock, self._conn, self._sock = self._conn, self._sock, None, None
        send = _cancel_request(conn) if conn is not None else None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        if send is not None:
            _send_cancel(send)

    def call(self, fn: Callable[[psycopg.Connection], Any], timeout: Optional[float],
             term: Optional["Term"] = None) -> Any:
        """fn(conn) within `timeout` seconds (None: no bound but the term's loss), else cut and raise."""
        box: dict[str, Any] = {}
        wake, cut = threading.Event(), threading.Event()

        def worker() -> None:
            try:
                for attempt in range(2):
                    with self._lock:
                        conn = self._conn if self._conn is not None and not self._conn.broken else None
                    fresh = conn is None
                    conn = self._connect(cut) if fresh else conn
                    try:
                        box["value"] = fn(conn)
                        return
                    except (psycopg.Error, _Stale) as exc:
                        if conn.broken or conn.closed:
                            self._drop(conn)
                            # a reused connection may have died while idle (server restart): once, try a fresh one
                            if (self.retry or isinstance(exc, _Stale)) and not fresh and attempt == 0 \
                                    and not cut.is_set():
                                continue
                        raise exc.__cause__ if isinstance(exc, _Stale) else exc
            except BaseException as exc:  # handed to the caller
                box["error"] = exc
            finally:
                wake.set()

        threading.Thread(target=worker, name=f"ticklease-{self.name}", daemon=True).start()
        if term is not None:
            term._on_loss(wake.set)
        wake.wait(None if timeout is None else max(0.0, timeout))
        if term is not None:
            term._off_loss(wake.set)
        if "value" in box:
            return box["value"]
        if "error" in box:
            raise box["error"]
        cut.set()
        self.cut()
        if term is not None and term.lost:
            raise TermLost(term.lost_reason)
        raise StatementTimeout(f"{self.name}: no answer within {(timeout or 0) * 1000:.0f} ms")


class Term:
    """One term of the role, handed to the work. Check `cancelled` (or use `wait`) and stop when it is set."""

    def __init__(self, leader: "Leader", token: int, sent: float, row: dict, *, occurrence=None, p_next=None):
        self.role, self.token, self._leader = leader.role, token, leader
        self.occurrence: Optional[datetime] = occurrence  # the cron occurrence this term is the attempt of
        self.next_occurrence: Optional[datetime] = p_next
        self.manual_by: Optional[str] = row.get("manual_by")
        self.failures: int = row.get("failures") or 0
        self.db_now: datetime = row["db_now"]
        self.answered = time.monotonic()
        self.last_ack = sent  # the send instant of the last acknowledged ACQUIRE/RENEW
        self.cancelled = threading.Event()  # the work must stop: lost, abandoned or shutting down
        self.lost = False
        self.lost_reason: Optional[str] = None
        self._lock = threading.Lock()
        self._cutters: list[Callable[[], None]] = []
        self._hb_wake = threading.Event()
        self._hb_stop = self._renew_now = False

    def wait(self, seconds: float) -> bool:
        """Sleep while the term runs; True when cut short (the work should stop)."""
        return self.cancelled.wait(seconds)

    def db_clock(self) -> datetime:
        """The database clock now, estimated from the ACQUIRE's answer on the monotonic clock."""
        return self.db_now + timedelta(seconds=time.monotonic() - self.answered)

    def check(self) -> None:
        """Raise TermLost once the term is over or the abandon instant passed (the heartbeat may not know yet)."""
        if not self.lost and time.monotonic() >= self.last_ack + self._leader.config.abandon_ms / 1000:
            self._lose("heartbeat_timeout")
        if self.lost:
            raise TermLost(self.lost_reason)

    def fence(self, sql: str, params: Optional[dict] = None, *, timeout: Optional[float] = None) -> int:
        """Run one claim statement in its own READ COMMITTED transaction and commit it; return its row count.

        `sql` must carry `(SELECT leader_fence(%(role)s, %(token)s))` (both filled in here). 0 rows where the
        fence said no and COMMIT's 40001 raise TermLost. Since 0 rows may also mean nothing to claim, a 0-row
        statement asks the fence again in the same transaction to tell the two apart. A 57P01 (the sweep, but also
        a server restart or an administrator) says only that the claim did not commit: it is raised as it is, and
        the heartbeat RENEWs at once, which decides whether the term is over."""
        self.check()
        args = dict(params or {}, role=self.role, token=self.token)

        def txn(conn: psycopg.Connection) -> int:
            began = False
            try:
                with conn.transaction():
                    began = True
                    rows = conn.execute(sql, args).rowcount
                    if rows == 0 and not conn.execute("SELECT leader_fence(%s, %s) AS ok",
                                                      (self.role, self.token)).fetchone()["ok"]:
                        raise TermLost(None)
                return rows
            except psycopg.OperationalError as exc:
                if not began:  # BEGIN failed: e.g. 57P01 of a server restart on an idle connection, not the sweep
                    raise _Stale() from exc
                raise

        try:
            return self._leader._claims.call(txn, timeout, term=self)
        except TermLost:
            self._lose(None)  # the term knows, even if the work swallows the exception
            raise
        except pgerr.SerializationFailure as exc:
            self._lose(None)
            raise TermLost(None) from exc
        except pgerr.AdminShutdown:
            with self._lock:
                self._renew_now = True
            self._hb_wake.set()  # RENEW now: it decides whether the term is over
            raise

    # -- used by the leader --
    def _lose(self, reason: Optional[str]) -> None:
        with self._lock:
            if self.lost:
                return
            self.lost, self.lost_reason, cutters = True, reason, list(self._cutters)
        self.cancelled.set()
        self._hb_wake.set()
        for c in cutters:
            c()
        log.warning("term lost role=%s token=%s reason=%s", self.role, self.token, reason or "fence")

    def _on_loss(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._cutters.append(fn)
        if self.lost:
            fn()

    def _off_loss(self, fn: Callable[[], None]) -> None:
        with self._lock:
            self._cutters.remove(fn)


class Leader:
    """Leads one role: follows, ACQUIREs, runs `work(term)` under the heartbeat, RELEASEs by outcome.

    `work` returns on success, raises WorkFailed for `failed`, TermLost when a claim found the term over; any
    other exception is `panicked`. Call `run()` from the thread that should run the work, `stop()` from any.
    `url` may go through a transaction-mode pooler; LISTEN needs a direct session: `listen_url` (default `url`)."""

    def __init__(self, url: str, role: str, schedule: Union[Every, Cron], work: Callable[[Term], None],
                 config: Config = Config(), *, holder: Optional[str] = None, listen: bool = True,
                 listen_url: Optional[str] = None):
        self.url, self.role, self.schedule, self.work, self.config = url, role, schedule, work, config
        self.holder = holder or f"{socket.gethostname()}:{os.getpid()}:{random.getrandbits(32):08x}"[-200:]
        if not role:
            raise ValueError("a role is needed")
        if not 1 <= len(self.holder) <= 200:
            raise ValueError(f"a holder id is 1..200 characters, got {len(self.holder)}")
        self.S, self.P = config.statement_timeout_ms / 1000, config.max_poll_ms / 1000
        self._lease = _Link(url, "lease")
        self._claims = _Link(url, "claims", autocommit=False, retry=False)
        self._stopping = threading.Event()
        self._wake = threading.Event()  # a follower's sleep ends early (notification, stop)
        self._term: Optional[Term] = None
        self._hint_lock, self._last_hint, self._hint_timer = threading.Lock(), 0.0, None
        self._listener = _Listener(self, listen_url or url) if listen else None
        self._errors = 0
        self._refused: Optional[datetime] = None  # the occurrence last refused as not_runnable

    # -- public --
    def run(self) -> None:
        """Lead until stop(); never raises for a database error (logs it and backs off)."""
        if self._listener:
            self._listener.start()
        while not self._stopping.is_set():
            try:
                self._cron_step() if isinstance(self.schedule, Cron) else self._interval_step()
            except Exception as exc:  # a database error, a refused input: log, back off, go on
                self._errors += 1
                delay = min(self.P, 0.05 * 2 ** min(self._errors, 6)) * random.uniform(0.5, 1.0)
                log.error("lease statement failed (%s: %s); retry in %.0f ms", type(exc).__name__,
                          str(exc).strip().splitlines()[0] if str(exc).strip() else "", delay * 1000)
                self._sleep(delay)
        for link in (self._lease, self._claims):
            link.close()

    def stop(self) -> None:
        """Ask run() to end: the work is cancelled, its term RELEASEd `interrupted`. From any thread; a signal
        handler should only set a flag for another thread to call this (Event.set takes a lock)."""
        self._stopping.set()
        self._wake.set()
        term = self._term
        if term is not None:
            term.cancelled.set()

    # -- statements --
    def _one(self, sql: str, params: Any) -> dict:
        return self._lease.call(lambda c: c.execute(sql, params).fetchone(), self.S)

    def _sleep(self, seconds: float) -> None:
        if not self._stopping.is_set():
            self._wake.wait(max(0.0, seconds))
        self._wake.clear()

    def _cap(self) -> float:
        listening = self._listener is not None and self._listener.connected
        return self.config.max_poll_listening_ms / 1000 if listening else self.P

    def _follow(self, row: dict, answered: float) -> None:
        """A refused ACQUIRE: sleep as its `reason` says, capped, waking early on a notification."""
        reason, now = row["reason"], row["db_now"]
        if reason == "contended":
            delay = random.uniform(0.005, 0.025)
        elif reason == "held" and row["expires_at"] is not None:
            delay = (row["expires_at"] - now).total_seconds()
        elif reason == "not_due" and row["due_at"] is not None:
            delay = (row["due_at"] - now).total_seconds()
        else:  # paused: wait for an unpause, polling; anything unexpected: poll
            delay = self._cap()
        self._sleep(min(delay, self._cap()) - (time.monotonic() - answered))

    def _interval_step(self) -> None:
        sch = self.schedule
        self._wake.clear()
        sent = time.monotonic()
        row = self._one("SELECT * FROM leader_acquire_v2(%s::text, %s::text, %s::bigint, %s::bigint, NULL::bigint,"
                        " %s::boolean)", (self.role, self.holder, self.config.lease_ttl_ms, sch.interval_ms,
                                          sch.long_lived))
        answered, self._errors = time.monotonic(), 0
        if row["acquired"]:
            self._run_term(Term(self, row["holder_token"], sent, row))
        else:
            self._follow(row, answered)

    _OCCURRENCE = ("SELECT a.*, l.occurrence AS started_occurrence FROM leader_acquire_occurrence_v2(%(role)s::text,"
                   " %(holder)s::text, %(ttl)s::bigint, %(occ)s::timestamptz, %(before)s::timestamptz, NULL::bigint,"
                   " %(reasons)s::text[], %(summaries)s::text[], %(schedule)s::text, %(next)s::timestamptz) AS a"
                   " LEFT JOIN leader_leases AS l ON l.role = %(role)s::text")

    def _occurrence(self, occ=None, before=None, nxt=None, skipped=()) -> dict:
        return self._one(self._OCCURRENCE, dict(
            role=self.role, holder=self.holder, ttl=self.config.lease_ttl_ms, occ=occ, before=before, next=nxt,
            reasons=[r for r, _ in skipped] or None, summaries=[s for _, s in skipped] or None,
            schedule=self.schedule.expr))

    def _cron_step(self) -> None:
        """The reference's loop: look, compute on the database clock, choose (latest), ask."""
        sch: Cron = self.schedule  # type: ignore[assignment]
        self._wake.clear()
        sent = time.monotonic()
        look = self._occurrence()
        answered, self._errors = time.monotonic(), 0
        if look["acquired"]:  # a pending run-now started a manual term
            return self._run_term(Term(self, look["holder_token"], sent, look))
        if look["reason"] in ("paused", "held", "not_due", "contended"):
            return self._follow(look, answered)
        after, started = look["after_occurrence"], look["started_occurrence"]
        now = look["db_now"] + timedelta(seconds=time.monotonic() - answered)
        latest = sch.prev_before(now + timedelta(microseconds=1))
        first = started is None and after is not None and timedelta(0) <= after - latest < timedelta(minutes=1)
        if latest == self._refused or not first and after is not None and latest <= after:
            # nothing due: sleep to the next occurrence (a notification or stop wakes us)
            return self._sleep(min((sch.next_after(now) - now).total_seconds(), self._cap()))
        chosen = latest
        p_next = sch.next_after(chosen)
        deadline = timedelta(milliseconds=sch.starting_deadline_ms or self.config.lease_ttl_ms)
        lows = [t for t in (after, started) if t is not None]
        skipped = [] if first or not lows else _skipped(sch, max(lows), chosen, look["last_paused_at"],
                                                         look["last_unpaused_at"], now - deadline)
        sent = time.monotonic()
        row = self._occurrence(chosen, p_next, p_next, skipped)
        answered = time.monotonic()
        if row["acquired"]:
            return self._run_term(Term(self, row["holder_token"], sent, row, occurrence=chosen, p_next=p_next))
        if row["reason"] == "not_runnable":  # not one to run (any more): look again, never ask it again
            self._refused = chosen
            return
        self._follow(row, answered)

    # -- a term --
    def _run_term(self, term: Term) -> None:
        """Run the work under the heartbeat, then RELEASE by outcome once the work and the heartbeat stopped."""
        self._term = term
        kind = f" occurrence={term.occurrence.isoformat()}" if term.occurrence else ""
        kind += f" manual_by={term.manual_by}" if term.manual_by else ""
        log.info("term started role=%s token=%s%s", self.role, term.token, kind)
        heartbeat = threading.Thread(target=self._heartbeat, args=(term,), name="ticklease-heartbeat", daemon=True)
        heartbeat.start()
        try:
            outcome, error = self._outcome(term)
        finally:
            with term._lock:
                term._hb_stop = True
            term._hb_wake.set()
            heartbeat.join()  # RELEASE only after the work stopped and no RENEW is in flight
            self._term = None
        self._release(term, outcome, error)

    def _outcome(self, term: Term) -> tuple[str, Optional[str]]:
        outcome, error = "completed", None
        try:
            if self._stopping.is_set():
                term.cancelled.set()
            else:
                self.work(term)
        except TermLost as exc:
            term._lose(exc.reason)
        except WorkFailed as exc:
            outcome, error = "failed", str(exc)[:500]
        except Exception as exc:
            outcome, error = "panicked", f"{type(exc).__name__}: {exc}"[:500]
        if term.lost:
            return "lost", error
        if outcome == "completed" and term.cancelled.is_set():
            return "interrupted", None  # cut short by stop(), not by a loss
        return outcome, error

    def _heartbeat(self, term: Term) -> None:
        """RENEW H after the last send (H/2 after a missed beat); abandon at last_ack + A, cutting a RENEW."""
        c = self.config
        h, a = c.heartbeat_ms / 1000, c.abandon_ms / 1000
        next_at = term.last_ack + h
        while True:
            term._hb_wake.wait(max(0.0, min(next_at, term.last_ack + a) - time.monotonic()))
            with term._lock:
                term._hb_wake.clear()
                if term._hb_stop or term.lost:
                    return
                now_requested, term._renew_now = term._renew_now, False
            sent = time.monotonic()
            if sent >= term.last_ack + a:
                return term._lose("heartbeat_timeout")  # cancel the work; the caller RELEASEs lost
            if sent < next_at and not now_requested:
                continue
            try:
                row = self._lease.call(lambda conn: conn.execute(
                    "SELECT * FROM leader_renew_v2(%s::text, %s::bigint, %s::bigint, NULL::bigint)",
                    (term.role, term.token, c.lease_ttl_ms)).fetchone(), min(self.S, term.last_ack + a - sent))
            except Exception as exc:
                log.warning("missed beat role=%s token=%s (%s)", term.role, term.token, type(exc).__name__)
                next_at = sent + h / 2
                continue
            if not row["renewed"]:
                return term._lose(row["reason"] or "released")
            term.last_ack, next_at = max(term.last_ack, sent), sent + h

    def _release_args(self, term: Term, outcome: str) -> tuple[bool, Optional[int]]:
        """p_stamp and p_cooldown_ms per the reference's table (the Rust library's policy)."""
        if outcome in ("completed", "interrupted"):
            return outcome == "completed", None
        sch = self.schedule
        if isinstance(sch, Every):
            return False, min(sch.interval_ms, 60_000) if outcome == "lost" else sch.interval_ms
        if term.manual_by or term.next_occurrence is None:
            return False, None  # a manual term keeps the role's cooldown and failure count
        left = (term.next_occurrence - term.db_clock()).total_seconds() * 1000
        until_next = min(max(0, math.ceil(left)), MAX_MS) or None  # 0 is none; 24 h is the bound
        if outcome == "lost":
            return False, min(until_next, 60_000) if until_next else None
        if outcome == "failed" and term.failures + 1 < sch.max_attempts:
            return False, sch.retry_backoff_ms
        return False, until_next

    def _release(self, term: Term, outcome: str, error: Optional[str]) -> None:
        stamp, cooldown = self._release_args(term, outcome)
        reason = term.lost_reason if outcome == "lost" else None
        try:
            done = self._one("SELECT leader_release(%s::text, %s::bigint, %s::boolean, %s::bigint, %s::text,"
                             " %s::text, %s::text, NULL::text) AS released",
                             (term.role, term.token, stamp, cooldown, outcome, reason, error))["released"]
        except Exception as exc:  # the lease ends on its own at its expiry
            log.error("term released? role=%s token=%s outcome=%s: RELEASE failed (%s)", term.role, term.token,
                      outcome, type(exc).__name__)
            return
        log.info("term released role=%s token=%s outcome=%s reason=%s released=%s%s", term.role, term.token,
                 outcome, reason, done, f" error={error!r}" if error else "")
        if done:
            self.notify("release")

    def notify(self, event: str) -> None:
        """`<event> <role>` on channel ticklease, in a statement of its own, after the decision committed."""
        try:
            self._one("SELECT pg_notify(%s, %s)", (CHANNEL, f"{event} {self.role}"))
        except Exception as exc:
            log.warning("notify %s failed (%s)", event, type(exc).__name__)

    # -- notifications --
    def _hint(self, event: str) -> None:
        """A notification for our role (or a listener reconnect): at most one acted on every 200 ms."""
        with self._hint_lock:
            wait = self._last_hint + HINT_GAP - time.monotonic()
            if wait > 0:
                if self._hint_timer is None:
                    # deferred hints act as "something happened": one kept may stand for several dropped
                    self._hint_timer = threading.Timer(wait, self._hint_deferred)
                    self._hint_timer.daemon = True
                    self._hint_timer.start()
                return
            self._last_hint = time.monotonic()
        term, any_ = self._term, event in ("reconnect", "any")
        if term is not None and (any_ or event == "pause"):
            with term._lock:
                term._renew_now = True
            term._hb_wake.set()  # RENEW now: it reads `paused`
        if term is None and (any_ or event in ("release", "unpause", "run_now")):
            self._wake.set()  # ACQUIRE (or look) now

    def _hint_deferred(self) -> None:
        with self._hint_lock:
            self._hint_timer = None
        self._hint("any")


class _Listener(threading.Thread):
    """LISTEN ticklease on a connection of its own; pings it so that a dead link is noticed and reconnected."""

    def __init__(self, leader: Leader, url: str):
        super().__init__(name="ticklease-listen", daemon=True)
        self.leader, self.connected = leader, False
        self.link = _Link(url, "listen", setup=lambda c: c.execute(f"LISTEN {CHANNEL}"))

    def run(self) -> None:
        leader, errors = self.leader, 0
        poll = min(1.0, leader.P)

        def step(conn: psycopg.Connection) -> None:
            for n in conn.notifies(timeout=poll):  # each one acted on as it arrives
                event, _, role = n.payload.partition(" ")
                if role == leader.role and event in ("release", "pause", "unpause", "run_now"):
                    leader._hint(event)
            conn.execute("SELECT 1")  # a blackholed link fails this within the bound

        while not leader._stopping.is_set():
            seen = self.link.connects
            try:
                self.link.call(step, poll + leader.S)
            except Exception as exc:
                was, self.connected, errors = self.connected, False, errors + 1
                if was:  # a follower sleeping under the listening cap recomputes it (rule 7)
                    leader._wake.set()
                log.warning("listener: %s; reconnecting", type(exc).__name__)
                leader._stopping.wait(min(leader.P, 0.1 * 2 ** min(errors, 5)))
                continue
            self.connected, errors = True, 0
            if self.link.connects != seen:  # a (re)connect: assume a notification was missed
                leader._hint("reconnect")


def _skipped(sch: Cron, low: datetime, chosen: datetime, paused_at: Optional[datetime],
             unpaused_at: Optional[datetime], cutoff: datetime) -> list[tuple[str, str]]:
    """Summaries of the occurrences strictly between `low` and `chosen`, one per reason (paused inside
    [paused_at, unpaused_at), deadline older than `cutoff`, else catch_up), counting at most 1000 each."""
    a, far = low + timedelta(microseconds=1), datetime.max.replace(tzinfo=UTC)
    pieces: list[tuple[str, datetime, datetime]] = []
    if paused_at is not None:
        pw_end = unpaused_at if unpaused_at is not None and unpaused_at > paused_at else far
        pieces.append(("paused", max(a, paused_at), min(chosen, pw_end)))
        rest = [(a, min(chosen, paused_at)), (max(a, pw_end), chosen)]
    else:
        rest = [(a, chosen)]
    for lo, hi in rest:
        pieces += [("deadline", lo, min(hi, cutoff)), ("catch_up", max(lo, cutoff), hi)]
    out = []
    for reason in ("paused", "deadline", "catch_up"):
        first = last = None
        count, capped = 0, False
        for r, lo, hi in sorted((p for p in pieces if p[0] == reason and p[1] < p[2]), key=lambda p: p[1]):
            o = sch.at_or_after(lo)
            if o >= hi:
                continue
            first, last = first or o, sch.prev_before(hi)
            while o < hi and not capped:
                count += 1
                capped = count > 1000
                o = sch.next_after(o)
        if first is not None:
            iso = lambda t: t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")  # noqa: E731
            n = "more than 1000 occurrences" if capped else f"{count} occurrence{'s' if count != 1 else ''}"
            out.append((reason, f"{n} from {iso(first)} to {iso(last)}"))
    return out
