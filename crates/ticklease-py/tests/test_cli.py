"""The `ticklease` command installed with pip (crates/ticklease-cli), as an operations team runs it."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import Database


def cli() -> str:
    found = os.environ.get("TICKLEASE_CLI") or shutil.which("ticklease")
    if found is None:
        if os.environ.get("CI"):
            pytest.fail("TICKLEASE_CLI is not set: scripts/test installs crates/ticklease-cli")
        pytest.skip("the ticklease command is not installed (pip install crates/ticklease-cli)")
    return found


def test_the_pip_installed_command_runs_a_fenced_singleton_and_pauses_it(db: Database) -> None:
    ticklease = cli()
    once = subprocess.run(
        [ticklease, "run", "nightly", "--every", "1h", "--once", "--", "sh", "-c", 'echo "token $TICKLEASE_TOKEN"'],
        env={**os.environ, "DATABASE_URL": db.app_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert once.returncode == 0, once.stderr
    assert "token " in once.stdout
    paused = subprocess.run(
        [ticklease, "pause", "nightly", "--reason", "maintenance"],
        env={**os.environ, "DATABASE_URL": db.operator_url},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert paused.returncode == 0, paused.stderr
    assert db.sql("SELECT paused_at IS NOT NULL, pause_reason FROM leader_leases WHERE role = 'nightly'") == [
        (True, "maintenance")
    ]
