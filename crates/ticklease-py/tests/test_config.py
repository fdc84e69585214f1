"""The core's checks, as Python sees them: a bad value is a ValueError naming the knob, nothing runs."""

from __future__ import annotations

from datetime import timedelta

import pytest

import ticklease


def test_a_config_takes_seconds_or_timedeltas_and_keeps_the_defaults_it_was_not_given() -> None:
    c = ticklease.Config(lease_ttl=timedelta(seconds=20), max_poll=1.5)
    assert c.lease_ttl == timedelta(seconds=20)
    assert c.max_poll == timedelta(seconds=1.5)
    assert c.heartbeat_every == timedelta(seconds=3)


@pytest.mark.parametrize(
    ("knobs", "named"),
    [
        ({"lease_ttl": 0}, "lease_ttl"),
        ({"heartbeat_every": -1}, "heartbeat_every"),
        ({"statement_timeout": 0.0005}, "statement_timeout"),
        ({"max_poll": float("nan")}, "max_poll"),
        ({"lease_ttl": 5}, "abandon_after"),
        ({"heartbeat_every": 7}, "heartbeat_every"),
    ],
)
def test_a_bad_config_value_is_a_value_error_naming_the_knob(knobs: dict[str, float], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        ticklease.Config(**knobs)


def test_a_duration_of_another_type_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="lease_ttl"):
        ticklease.Config(lease_ttl="10s")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "named"),
    [
        (lambda: ticklease.Schedule.cron("*/5 * * *"), "expression"),
        (lambda: ticklease.Schedule.cron("0 * * * *", zone="Mars/Olympus"), "Mars/Olympus"),
        (lambda: ticklease.Schedule.cron("0 * * * *", catch_up="most"), "catch_up"),  # type: ignore[arg-type]
        (lambda: ticklease.Schedule.every(-1), "interval"),
    ],
)
def test_a_bad_schedule_is_a_value_error_naming_what_is_wrong(make: object, named: str) -> None:
    with pytest.raises(ValueError, match=named):
        make()  # type: ignore[operator]


def test_a_cron_schedule_in_a_zone_counts_its_occurrences_there() -> None:
    # 00:05 in Berlin is 23:05 UTC in winter.
    s = ticklease.Schedule.cron("5 0 * * *", zone="Europe/Berlin")
    after = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    assert s._native.next_after(after) == after + 23 * 3600 + 5 * 60


def test_a_role_name_the_core_refuses_is_a_value_error_and_adds_no_job() -> None:
    s = ticklease.Scheduler("postgres://nobody@127.0.0.1:1/x", config=ticklease.Config())
    with pytest.raises(ValueError, match="role"):
        s.job("bad role name!", 1.0, lambda term: None)
    with pytest.raises(ValueError, match="interval"):
        s.job("billing", 0.0001, lambda term: None)


def test_a_url_the_core_cannot_read_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="url"):
        ticklease.Scheduler("postgres://[::1/x")
