"""``ticklease.migrate`` as a schema owner: what the core says of the owner reaches ``logging``."""

from __future__ import annotations

import logging
import os
import time

import psycopg
import pytest

import ticklease
from conftest import Postmaster


def test_a_migrate_by_an_owner_who_may_end_no_claimer_logs_a_warning_naming_it(
    cluster: Postmaster, caplog: pytest.LogCaptureFixture
) -> None:
    # The drain ends a frozen claimer's backend with the owner's rights: an owner that is neither a superuser
    # nor a member of pg_signal_backend cannot, and the core says so (`MigrateReport::owner_cannot_end_claimers`).
    name = f"m{os.getpid()}_{time.monotonic_ns()}"
    owner = f"{name}_owner"
    with psycopg.connect(cluster.url("postgres"), autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
        conn.execute(f"CREATE ROLE {owner} LOGIN CREATEROLE")
        conn.execute(f"ALTER DATABASE {name} OWNER TO {owner}")
    with psycopg.connect(cluster.url("postgres", name), autocommit=True) as conn:
        conn.execute(f"ALTER SCHEMA public OWNER TO {owner}")
    with caplog.at_level(logging.WARNING, logger="ticklease"):
        assert list(ticklease.migrate(cluster.url(owner, name)))
        # The core's lines come from a thread of their own.
        deadline = time.monotonic() + 5
        while not (said := [r for r in caplog.records if "pg_signal_backend" in r.getMessage()]):
            assert time.monotonic() < deadline, "the core's warning reached logging"
            time.sleep(0.01)
    assert said[0].levelno == logging.WARNING and getattr(said[0], "owner", None) == owner
