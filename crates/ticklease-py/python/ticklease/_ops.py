"""The operator's calls, for scripts (each opens a connection as the URL's login; blocking, the GIL released)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta, timezone
from typing import Any, NamedTuple

from ticklease import _native
from ticklease._config import Seconds, count, seconds

_TIMES = (
    "acquired_at",
    "expires_at",
    "db_now",
    "paused_at",
    "last_tick_ended_at",
    "not_before",
    "next_occurrence",
)


class Status(NamedTuple):
    """``leader_status`` as read: at most ``limit`` rows (paused first, then by role) and how many exist.

    ``total`` is counted up to 100,000: any app login may create rows, and the read's work stays bounded.
    """

    rows: list[dict[str, Any]]
    total: int


def _row(raw: dict[str, Any]) -> dict[str, Any]:
    row = dict(raw)
    for key in _TIMES:
        if row[key] is not None:
            row[key] = datetime.fromtimestamp(row[key], timezone.utc)
    if row["tick_interval"] is not None:
        row["tick_interval"] = timedelta(seconds=row["tick_interval"])
    return row


def status(url: str, *, limit: int = 1000) -> Status:
    """The roles' rows: who holds what, since when, paused by whom, the last tick and the next occurrence. Text is
    as stored, and any login of the app role can write some of it (holder ids): pass it through :func:`escape`
    before a terminal or a page."""
    rows, total = _native.status(url, count("limit", limit, 1, 10_000))
    return Status([_row(r) for r in rows], total)


def history(
    url: str, role: str | None = None, *, since: Seconds = timedelta(days=1), limit: int = 100
) -> list[dict[str, Any]]:
    """The history of ``role`` (every role when ``None``) over the last ``since``, newest first: each term's
    outcome, reason, error and output, pauses, unpauses, run-nows and skipped occurrences. Text is as stored, and
    any login of the app role can write some of it: pass it through :func:`escape` before a terminal or a page."""
    entries = _native.history(url, role, seconds("since", since), count("limit", limit, 1, 10_000))
    for e in entries:
        for key in ("at", "acquired_at"):
            if e.get(key) is not None:
                e[key] = datetime.fromtimestamp(e[key], timezone.utc)
    return entries


def escape(text: str) -> str:
    """The core's one escaping rule for database text: control, bidi and zero-width characters shown as
    ``\\u{…}``, everything else kept."""
    return _native.escape(text)


def pause(url: str, role: str, *, by: str, reason: str) -> bool:
    """Pauses ``role`` (its term ends at once, no term starts until unpaused); ``True`` if this call did."""
    return _native.pause(url, role, by, reason)


def unpause(url: str, role: str) -> bool:
    """Unpauses ``role``; ``True`` if this call did."""
    return _native.unpause(url, role)


def run_now(url: str, role: str) -> bool:
    """Asks for a manual run of ``role``: its next term starts at the next poll once no term is live,
    whatever its interval, cooldown or schedule."""
    return _native.run_now(url, role)


def migrate(
    owner_url: str, *, app_role: str = "ticklease_app", operator_role: str = "ticklease_operator"
) -> Sequence[int]:
    """Applies the schema as its owner; returns the migration versions this call applied."""
    return _native.migrate(owner_url, app_role, operator_role)


__all__ = ["Status", "escape", "history", "migrate", "pause", "run_now", "status", "unpause"]
