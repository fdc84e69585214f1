"""Statements per tick: one replica leads one role ``every 100`` with a 10 ms work, for a bounded run.

Two counts per run, both read from the ``postgres`` database (so the bench's own reads never count):

- ``pg_stat_statements`` (top-level calls in the bench's database) between two snapshots taken inside the run,
  divided by the terms started between them (``leader_history.acquired_at``), split into the claims' own
  statements (the INSERT, its BEGIN and COMMIT) and the library's (everything else);
- ``pg_stat_database.xact_commit + xact_rollback`` over the replica's whole life (its start and shutdown
  included), divided by all its terms, minus the claims' transactions. The server flushes a backend's counters
  only now and then (up to 10 s late for an idle one), so every backend of the database is ended before the
  second reading (PgBouncer's server connections too: they outlive the replica).
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from dataclasses import dataclass, field

import psycopg
from infra import sql, wait_until
from replicas import ReplicaSet

WARM_S = 3.0
CLAIM_MARKERS = ("blackbox_claims", "drill_journal")
TX_CONTROL = ("BEGIN", "START TRANSACTION", "COMMIT", "ROLLBACK")


@dataclass
class TickRun:
    variant: str
    window_s: float
    #: Terms started inside the window, and over the whole run.
    terms: int
    terms_all: int
    claims: int
    claims_all: int
    #: Top-level statements inside the window: the claims' own, and the rest (the library's, a pooler's).
    claim_statements: int
    library_statements: int
    #: Transactions over the whole run (commits and rollbacks).
    xacts_all: int
    by_statement: Counter[str] = field(default_factory=Counter)

    @property
    def library_per_term(self) -> float:
        return self.library_statements / max(self.terms, 1)

    @property
    def xacts_per_term(self) -> float:
        """The library's transactions per term over the whole run (the claims' own taken off)."""
        return (self.xacts_all - self.claims_all) / max(self.terms_all, 1)


def statements(admin: psycopg.Connection[tuple[object, ...]], db: str) -> Counter[str]:
    rows = admin.execute(
        """SELECT query, calls FROM pg_stat_statements
            WHERE dbid = (SELECT oid FROM pg_database WHERE datname = %s) AND toplevel""",
        (db,),
    ).fetchall()
    counts: Counter[str] = Counter()
    for query, calls in rows:
        counts[" ".join(str(query).split())] += int(str(calls))
    return counts


def xacts(admin: psycopg.Connection[tuple[object, ...]], db: str) -> int:
    row = admin.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = %s", (db,)).fetchone()
    return int(str(row[0])) if row else 0


def end_backends(admin: psycopg.Connection[tuple[object, ...]], db: str) -> None:
    """Ends every backend of ``db`` (their counters are flushed as they exit), and waits, bounded, until none is."""
    terminate = "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s AND pid <> pg_backend_pid()"
    admin.execute(terminate, (db,))
    count = "SELECT count(*) FROM pg_stat_activity WHERE datname = %s"
    wait_until(f"{db}: no backend left", lambda: admin.execute(count, (db,)).fetchone() == (0,), 15.0, 0.05)
    time.sleep(0.2)


def label(query: str) -> str:
    """What a normalized statement is: the library's (its leading ``-- NAME:`` comment, ``pg_notify``, other) or
    the claim's (the INSERT, BEGIN/COMMIT, and the fence's deferred trigger statements, which run at COMMIT outside
    any executor and so count as top-level in ``pg_stat_statements``)."""
    if query.startswith("-- "):
        return query[3:].split(":", 1)[0].strip()
    if "pg_notify" in query:
        return "pg_notify"
    if "NEW." in query:
        return "claim: fence trigger"
    if any(m in query for m in CLAIM_MARKERS):
        return "claim: INSERT"
    if query.upper().startswith(TX_CONTROL):
        return "claim: BEGIN/COMMIT"
    return "other"


def is_claim(query: str) -> bool:
    return label(query).startswith("claim")


def counted(rs: ReplicaSet, t0: float, t1: float, since: float) -> tuple[int, int, int, int]:
    """(terms in [t0, t1), terms since ``since``, claims in [t0, t1), claims since) from the database."""
    history = "SELECT count(*) FROM leader_history WHERE kind = 'term' AND acquired_at >= to_timestamp(%s)"
    window = history + " AND acquired_at < to_timestamp(%s)"
    claims = "SELECT count(*) FROM blackbox_claims WHERE at >= to_timestamp(%s)"
    claims_window = claims + " AND at < to_timestamp(%s)"

    def one(query: str, *params: float) -> int:
        return int(sql(rs.urls.owner, query, params)[0][0])

    return one(window, t0, t1), one(history, since), one(claims_window, t0, t1), one(claims, since)


def db_now(admin: psycopg.Connection[tuple[object, ...]]) -> float:
    row = admin.execute("SELECT extract(epoch FROM clock_timestamp())").fetchone()
    return float(str(row[0])) if row else 0.0


def tick_run(rs: ReplicaSet, admin: psycopg.Connection[tuple[object, ...]], window_s: float) -> TickRun:
    db = rs.urls.db
    end_backends(admin, db)
    since, x0 = db_now(admin), xacts(admin, db)
    replica = rs.start("r1")
    time.sleep(WARM_S)
    s0, t0 = statements(admin, db), db_now(admin)
    time.sleep(window_s)
    s1, t1 = statements(admin, db), db_now(admin)
    rs.procs.end(replica.process, signal.SIGTERM)
    rs.replicas.clear()
    end_backends(admin, db)
    x1 = xacts(admin, db)
    terms, terms_all, claims, claims_all = counted(rs, t0, t1, since)
    diff = s1 - s0
    claim_statements = sum(n for q, n in diff.items() if is_claim(q))
    library = sum(diff.values()) - claim_statements
    return TickRun(rs.program.key, t1 - t0, terms, terms_all, claims, claims_all, claim_statements, library,
                   x1 - x0, diff)  # fmt: skip
