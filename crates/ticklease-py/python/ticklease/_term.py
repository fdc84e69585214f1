"""A term as a job's work sees it: who it is, its fence, and its cancellation."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import NamedTuple

from ticklease import _native


class Failed(Exception):
    """Raise it from a job's work to end the tick as ``failed`` (retried as the schedule says).

    Any other exception ends it as ``panicked``: a defect, logged with its traceback, that pages.
    """


class Server(NamedTuple):
    """The database server a term started on: work that connects on its own connects here."""

    host: str
    port: int
    hostaddr: str | None


class Fence:
    """The proof, inside a claim statement, that the term is live: false once it is over.

    With psycopg 3 (named parameters)::

        cur.execute(f"UPDATE jobs SET ... WHERE id IN (...) AND {term.fence.sql}", {**term.fence.params, ...})

    With asyncpg (numbered parameters)::

        await conn.execute(f"... WHERE ... AND {term.fence.predicate(3)}", a, b, *term.fence.args)

    Run the claim in a READ COMMITTED transaction: once the fence passes, the transaction holds the term's
    lease row until it ends, so no takeover, pause or RELEASE of the term commits before it (they wait for it
    at most a grace, then end its connection's backend).
    """

    __slots__ = ("_native",)

    def __init__(self, native: _native.Term) -> None:
        self._native = native

    @property
    def role(self) -> str:
        return self._native.role

    @property
    def token(self) -> int:
        return self._native.token

    def predicate(self, first_param: int = 1) -> str:
        """``(SELECT leader_fence_v2($n, $n+1))``, numbered from ``first_param`` (asyncpg, any ``$n`` driver)."""
        if first_param < 1:
            raise ValueError(f"first_param must be 1 or more, not {first_param}")
        return self._native.predicate(first_param)

    @property
    def args(self) -> tuple[str, int]:
        """The predicate's two values, in order: the role and the token."""
        return (self._native.role, self._native.token)

    #: The predicate with psycopg's named placeholders (``%(ticklease_role)s``, ``%(ticklease_token)s``).
    sql = "(SELECT leader_fence_v2(%(ticklease_role)s, %(ticklease_token)s))"

    @property
    def params(self) -> dict[str, str | int]:
        """The values of :attr:`sql`'s placeholders."""
        return {"ticklease_role": self._native.role, "ticklease_token": self._native.token}

    def __repr__(self) -> str:
        return f"Fence(role={self.role!r}, token={self.token})"


class Term:
    """The term a job's work runs in: its role, token, occurrence, fence and cancellation.

    The term is cancelled when it is lost (another replica took over, an operator paused the role, a heartbeat
    could not be acknowledged in time), when the scheduler stops, or when its family key is removed. An
    ``async def`` work is also cancelled (``CancelledError``) when the term is lost; a plain function cannot be
    stopped from outside and must poll :attr:`is_cancelled` or wait with :meth:`wait`.
    """

    __slots__ = ("_native", "fence")

    def __init__(self, native: _native.Term) -> None:
        self._native = native
        self.fence = Fence(native)

    @property
    def role(self) -> str:
        return self._native.role

    @property
    def token(self) -> int:
        """The fencing token: it grows with every term of the role."""
        return self._native.token

    @property
    def occurrence(self) -> datetime | None:
        """The scheduled instant this term runs (UTC) on a cron schedule, the same for every attempt of it:
        a key for the work's effects (the billing period). ``None`` on an interval and for a manual run."""
        at = self._native.occurrence
        return None if at is None else datetime.fromtimestamp(at, timezone.utc)

    @property
    def server(self) -> Server | None:
        """The server the term started on (of a multi-host URL, the one the core chose by timeline)."""
        s = self._native.server
        return None if s is None else Server(*s)

    @property
    def is_cancelled(self) -> bool:
        return self._native.is_cancelled()

    @property
    def cause(self) -> str | None:
        """Why the term was cancelled: ``lost:<reason>``, ``shutdown`` or ``removed``; ``None`` while live."""
        return self._native.cause()

    async def cancelled(self) -> str:
        """Resolves with the cause once the term is cancelled."""
        return await self._native.cancelled()

    def wait(self, timeout: float | None = None) -> bool:
        """Blocks (the GIL released) until the term is cancelled or ``timeout`` seconds passed; ``True`` when
        it was cancelled: stop the work."""
        return self._native.wait(timeout)

    def keep_output(self, output: str) -> None:
        """Keeps ``output`` (its last 4,000 characters) with this term's history row."""
        self._native.keep_output(output)

    def __repr__(self) -> str:
        return f"Term(role={self.role!r}, token={self.token}, occurrence={self.occurrence!r})"
