"""The core's configuration, in seconds or ``timedelta``; every check is the core's (``ValueError`` naming the knob)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import timedelta
from typing import Literal, Union

from ticklease import _native

Seconds = Union[float, int, timedelta]


def seconds(knob: str, value: Seconds) -> float:
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{knob} must be seconds (a number) or a timedelta, not {type(value).__name__}")
    try:
        return float(value)
    except OverflowError:
        raise ValueError(f"{knob} = {value} s is too long") from None


def count(knob: str, value: int, low: int, high: int) -> int:
    """A whole number within ``low ..= high``: a ``ValueError`` naming ``knob`` otherwise (a ``bool`` is not one)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{knob} must be a whole number, not {type(value).__name__}")
    if not low <= value <= high:
        raise ValueError(f"{knob} must be within {low}..={high}, not {value}")
    return value


#: The largest count the core takes (a u32).
COUNT_MAX = 2**32 - 1


def optional_seconds(knob: str, value: Seconds | None) -> float | None:
    return None if value is None else seconds(knob, value)


class Config:
    """T, H, S, A, P: the lease TTL (10 s), the heartbeat period (3 s), the bound on every statement (2 s),
    the abandon cut (6 s) and a follower's longest poll (5 s). The core checks each bound and relation
    (``abandon_after + statement_timeout < lease_ttl``, ``heartbeat_every < abandon_after``)."""

    __slots__ = ("_native",)

    def __init__(
        self,
        *,
        lease_ttl: Seconds | None = None,
        heartbeat_every: Seconds | None = None,
        statement_timeout: Seconds | None = None,
        abandon_after: Seconds | None = None,
        max_poll: Seconds | None = None,
    ) -> None:
        self._native = _native.Config(
            optional_seconds("lease_ttl", lease_ttl),
            optional_seconds("heartbeat_every", heartbeat_every),
            optional_seconds("statement_timeout", statement_timeout),
            optional_seconds("abandon_after", abandon_after),
            optional_seconds("max_poll", max_poll),
        )

    @classmethod
    def scaled_down(cls, factor: int) -> Config:
        """Every default divided by ``factor`` (tests)."""
        config = cls.__new__(cls)
        config._native = _native.Config.scaled_down(count("factor", factor, 1, 1000))
        return config

    @property
    def lease_ttl(self) -> timedelta:
        return timedelta(seconds=self._native.lease_ttl)

    @property
    def heartbeat_every(self) -> timedelta:
        return timedelta(seconds=self._native.heartbeat_every)

    @property
    def statement_timeout(self) -> timedelta:
        return timedelta(seconds=self._native.statement_timeout)

    @property
    def abandon_after(self) -> timedelta:
        return timedelta(seconds=self._native.abandon_after)

    @property
    def max_poll(self) -> timedelta:
        return timedelta(seconds=self._native.max_poll)

    def __repr__(self) -> str:
        n = self._native
        return (
            f"Config(lease_ttl={n.lease_ttl}, heartbeat_every={n.heartbeat_every}, "
            f"statement_timeout={n.statement_timeout}, abandon_after={n.abandon_after}, max_poll={n.max_poll})"
        )


CatchUp = Literal["latest", "all", "skip"]


class Schedule:
    """When a role is due: :meth:`every` interval, :meth:`cron` occurrences, or :meth:`long_lived`."""

    __slots__ = ("_native",)

    def __init__(self, native: _native.Schedule) -> None:
        self._native = native

    @classmethod
    def every(cls, interval: Seconds) -> Schedule:
        """Due ``interval`` after the last completed tick ended."""
        return cls(_native.Schedule.every(seconds("interval", interval)))

    @classmethod
    def cron(
        cls,
        expression: str,
        *,
        zone: str | None = None,
        catch_up: CatchUp | None = None,
        catch_up_max: int = 10,
        starting_deadline: Seconds | None = None,
    ) -> Schedule:
        """Due at each occurrence of ``expression`` (five fields, or six with seconds first; ``CRON_TZ=`` prefix
        or ``zone``, an IANA name; UTC otherwise). Each occurrence runs once across the replicas, on the
        database's clock; ``catch_up`` says what runs of the ones missed (default ``latest``)."""
        return cls(
            _native.Schedule.cron(
                expression,
                zone,
                catch_up,
                count("catch_up_max", catch_up_max, 1, COUNT_MAX),
                optional_seconds("starting_deadline", starting_deadline),
            )
        )

    @classmethod
    def long_lived(cls, restart: Seconds) -> Schedule:
        """Work that runs for the whole term (a relay, a consumer); due again ``restart`` after it returns."""
        return cls(_native.Schedule.long_lived(seconds("restart", restart)))

    def retry(self, attempts: int, backoff: Seconds, backoff_max: Seconds) -> Schedule:
        """This schedule, with a failed tick retried ``attempts - 1`` times, the wait doubling from ``backoff``."""
        return Schedule(self._native.retry(attempts, seconds("backoff", backoff), seconds("backoff_max", backoff_max)))

    def __repr__(self) -> str:
        return repr(self._native)


def as_schedule(schedule: Schedule | Seconds) -> Schedule:
    return schedule if isinstance(schedule, Schedule) else Schedule.every(schedule)


class Family:
    """Many roles of one job (``tenant_sync:acme``), their keys changed at run time, spread over the replicas."""

    __slots__ = ("_native",)

    def __init__(self, name: str, keys: Sequence[str] = (), *, max_terms: int | None = None) -> None:
        self._native = _native.Family(
            name, _keys(keys), None if max_terms is None else count("max_terms", max_terms, 1, COUNT_MAX)
        )

    @property
    def name(self) -> str:
        return self._native.name

    def add(self, key: str) -> str:
        """Adds ``key``; returns its role's name (``<family>:<key>``)."""
        return self._native.add(key)

    def remove(self, key: str) -> bool:
        """Removes ``key``: its running term is cancelled (``removed``) and released as interrupted."""
        return self._native.remove(key)

    def set(self, keys: Sequence[str]) -> None:
        self._native.set(_keys(keys))

    def keys(self) -> list[str]:
        return self._native.keys()

    def __len__(self) -> int:
        return len(self._native)


def _keys(keys: Sequence[str]) -> list[str]:
    if isinstance(keys, str):
        raise TypeError("keys must be a sequence of keys, not one string")
    return list(keys)
