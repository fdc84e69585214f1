"""TLS from Python: the core's `sslmode` (rustls): verify-full checks the server's certificate and name."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest

import ticklease
from conftest import Postmaster, as_postgres, free_port, scaled_config, start_postmaster


def openssl(*args: str | Path) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def make_certs(dir: Path) -> None:
    """A CA, and a server certificate it signed for 127.0.0.1 (name and address)."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=test-ca",
            "-keyout", dir / "ca.key", "-out", dir / "ca.pem")  # fmt: skip
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", "/CN=127.0.0.1",
            "-keyout", dir / "server.key", "-out", dir / "server.csr")  # fmt: skip
    (dir / "ext").write_text("subjectAltName=IP:127.0.0.1,DNS:localhost\n")
    openssl("x509", "-req", "-in", dir / "server.csr", "-CA", dir / "ca.pem", "-CAkey", dir / "ca.key",
            "-CAcreateserial", "-days", "2", "-extfile", dir / "ext", "-out", dir / "server.pem")  # fmt: skip
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=other-ca",
            "-keyout", dir / "other.key", "-out", dir / "other.pem")  # fmt: skip


@pytest.fixture
def tls_server() -> Iterator[tuple[Postmaster, Path]]:
    root = Path(tempfile.mkdtemp(prefix="ticklease-tls-"))
    certs = root / "certs"
    certs.mkdir()
    make_certs(certs)
    user = as_postgres()
    if user:
        os.chown(root, user.pw_uid, user.pw_gid)
    for name in ("server.pem", "server.key"):
        os.chmod(certs / name, 0o600)
        if user:
            os.chown(certs / name, user.pw_uid, user.pw_gid)
    pm = start_postmaster(root / "pg", free_port())
    try:
        with psycopg.connect(pm.url("postgres"), autocommit=True) as conn:
            conn.execute(f"ALTER SYSTEM SET ssl_cert_file = '{certs / 'server.pem'}'")
            conn.execute(f"ALTER SYSTEM SET ssl_key_file = '{certs / 'server.key'}'")
            conn.execute("ALTER SYSTEM SET ssl = on")
            conn.execute("SELECT pg_reload_conf()")
            conn.execute("CREATE ROLE app_login LOGIN")
        ticklease.migrate(pm.url("postgres"))
        with psycopg.connect(pm.url("postgres"), autocommit=True) as conn:
            conn.execute("GRANT ticklease_app TO app_login")
        yield pm, certs
    finally:
        pm.stop()
        shutil.rmtree(root, ignore_errors=True)


def test_verify_full_leads_with_the_right_ca_and_is_refused_with_another(tls_server: tuple[Postmaster, Path]) -> None:
    pm, certs = tls_server
    url = pm.url("app_login") + f"?sslmode=verify-full&sslrootcert={certs / 'ca.pem'}"
    s = ticklease.Scheduler(url, config=scaled_config())
    led: list[int] = []

    @s.job("tls_job", 0.05)
    def work(term: ticklease.Term) -> None:
        led.append(term.token)
        s.stop()

    assert s.run_blocking(handle_signals=False).all_released
    assert len(led) == 1
    with psycopg.connect(pm.url("postgres")) as conn:
        row = conn.execute("SELECT count(*) FROM pg_stat_ssl WHERE ssl").fetchone()
        assert row is not None and row[0] >= 1  # this very check, over TLS, at least
    wrong = pm.url("app_login") + f"?sslmode=verify-full&sslrootcert={certs / 'other.pem'}"
    with pytest.raises(ticklease.TickleaseError, match=r"(?i)certificate"):
        ticklease.Scheduler(wrong, config=scaled_config()).run_blocking(handle_signals=False)
