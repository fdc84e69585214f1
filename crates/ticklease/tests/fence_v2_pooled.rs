//! The fence at one row lock (definitions generation 7) through a real
//! PgBouncer in transaction mode, as the application reaches Postgres: the
//! claims run on pooled server connections, with unnamed statements
//! (`query_typed`) and simple queries, and no session state. What ends a
//! term drains them as it drains direct ones (waits the grace, then ends
//! their backends); the pooler then opens a new server connection for the
//! next transaction. Where prepared transactions are enabled (the kit's
//! clusters: `max_prepared_transactions = 8`), the fence's guard refuses a
//! fenced PREPARE, and its session lock stays with the server connection
//! without refusing the PREPARE of another client's unfenced transaction.

use std::future::Future;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_postgres::{Client, Config, NoTls};

use ticklease_testkit::{connect, direct, migrated_db, scalar, PgBouncer, PgCluster};

mod fence_common;
use fence_common::{acquire, claim, claim_table, wait_expired};

/// The direct enders' statement timeout here: the grace is then 200 ms.
const ENDER_TIMEOUT: &str = "SET statement_timeout = '4s'";

/// The grace at that timeout (`leader_fence_grace_ms`), and at the pooled
/// sessions' statement timeout (0: none, which PgBouncer leaves as it is).
const GRACE: Duration = Duration::from_millis(200);

/// How long a pooled statement may wait for a server connection before the
/// pool is taken for stuck (PgBouncer's own `query_wait_timeout` is 120 s).
const POOL_WAIT: Duration = Duration::from_secs(10);

struct Db {
    owner: Client,
    config: Config,
    bouncer: PgBouncer,
}

/// A fresh database with a claim table and the role `billing`, reached by the
/// owner directly and by the application through its own PgBouncer with a
/// server pool of `pool_size`.
async fn setup(pool_size: u32) -> Db {
    let config = direct(&migrated_db(PgCluster::shared()).await);
    let owner = connect(&config).await.unwrap();
    claim_table(&owner).await;
    let bouncer = PgBouncer::start(PgCluster::shared(), pool_size).expect("pgbouncer");
    Db {
        owner,
        config,
        bouncer,
    }
}

impl Db {
    /// A direct session (an operator's, or a test's observer).
    async fn session(&self) -> Client {
        let c = connect(&self.config).await.unwrap();
        c.batch_execute(ENDER_TIMEOUT).await.unwrap();
        c
    }

    /// A client connection through the bouncer: no session state is set.
    async fn pooled(&self) -> Client {
        connect(&self.pooled_config()).await.unwrap()
    }

    fn pooled_config(&self) -> Config {
        self.bouncer
            .config(self.config.get_dbname().expect("a database name"))
    }

    /// As [`Db::pooled`], with how its connection ended: the bouncer passes
    /// on what the server sends as it ends the backend.
    async fn pooled_watched(&self) -> (Client, JoinHandle<Result<(), tokio_postgres::Error>>) {
        let (client, connection) = self.pooled_config().connect(NoTls).await.unwrap();
        (client, tokio::spawn(connection))
    }

    async fn claimed_by(&self, id: i32) -> Option<i64> {
        self.owner
            .query_one("SELECT claimed_by FROM jobs WHERE id = $1", &[&id])
            .await
            .unwrap()
            .get(0)
    }

    /// The advisory locks `pid` holds in this database.
    async fn advisory_locks_of(&self, pid: i32) -> i64 {
        self.owner
            .query_one(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND pid = $1
                    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
                &[&pid],
            )
            .await
            .unwrap()
            .get(0)
    }
}

/// `step` through the bouncer, bounded: a pool that lost count of a dead
/// server connection would make it wait for a server without end.
async fn within_pool_wait<T>(what: &str, step: impl Future<Output = T>) -> T {
    tokio::time::timeout(POOL_WAIT, step)
        .await
        .unwrap_or_else(|_| panic!("{what}: no server connection within {POOL_WAIT:?}"))
}

/// The server backend a pooled client's transaction runs on.
async fn backend(c: &Client) -> i32 {
    scalar(c, "SELECT pg_backend_pid()").await
}

/// A pooled transaction left open (idle in transaction) with one claim in
/// the term: its client, its server backend and its client connection.
struct OpenClaim {
    client: Client,
    backend: i32,
    connection: JoinHandle<Result<(), tokio_postgres::Error>>,
}

async fn open_pooled_claim(db: &Db, role: &str, token: i64, id: i32) -> OpenClaim {
    let (client, connection) = db.pooled_watched().await;
    within_pool_wait("the claim's BEGIN", client.batch_execute("BEGIN"))
        .await
        .unwrap();
    assert!(
        claim(&client, role, token, id).await.unwrap(),
        "the live term claims"
    );
    let backend = backend(&client).await;
    OpenClaim {
        client,
        backend,
        connection,
    }
}

/// The COMMIT of a claim whose backend was ended fails, and the client's
/// connection ends: how each told it.
async fn commit_of_an_ended_claim(open: OpenClaim) -> String {
    let commit = within_pool_wait("the ended claim's COMMIT", open.client.batch_execute("COMMIT")).await;
    let err = commit.expect_err("the claimer's backend was ended: its COMMIT fails");
    let ended = within_pool_wait("the claimer's connection's end", open.connection)
        .await
        .unwrap();
    // PgBouncer passes on the server's FATAL to the client linked to it.
    if let Some(code) = ended.as_ref().err().and_then(|e| e.code()) {
        assert_eq!(code, &SqlState::ADMIN_SHUTDOWN, "{ended:?}");
    }
    format!("COMMIT: {:?} {err}; the connection: {ended:?}", err.code())
}

#[tokio::test]
async fn a_claim_through_the_bouncer_commits_while_the_term_lives_and_claims_nothing_once_it_is_paused() {
    let db = setup(1).await;
    let op = db.session().await;
    let t = acquire(&op, "billing", "a", 30_000).await.unwrap();
    let c = db.pooled().await;
    c.batch_execute("BEGIN").await.unwrap();
    assert!(claim(&c, "billing", t, 1).await.unwrap(), "the live term claims");
    let server = backend(&c).await;
    c.batch_execute("COMMIT")
        .await
        .expect("the live term's claim commits");
    assert_eq!(db.claimed_by(1).await, Some(t));
    // The committed claim let go of the lease row: the pause ends no backend.
    let paused: bool = scalar(&op, "SELECT leader_pause('billing', 'op', 'pooled')").await;
    assert!(paused);
    c.batch_execute("BEGIN").await.unwrap();
    assert_eq!(
        backend(&c).await,
        server,
        "the pool's one server connection lives on"
    );
    assert!(
        !claim(&c, "billing", t, 2).await.unwrap(),
        "a claim of the paused term"
    );
    c.batch_execute("COMMIT").await.unwrap();
    // Also from a client that connected after the pause.
    let late = db.pooled().await;
    late.batch_execute("BEGIN").await.unwrap();
    assert!(!claim(&late, "billing", t, 3).await.unwrap(), "paused");
    late.batch_execute("COMMIT").await.unwrap();
    assert_eq!(db.claimed_by(2).await, None);
    assert_eq!(db.claimed_by(3).await, None);
}

/// The takeover is a follower's ACQUIRE through the same bouncer (pool of
/// 2: the open claim holds one server connection, the ACQUIRE runs on the
/// other). Afterwards two transactions at once need two servers: the pool
/// replaced the ended one.
#[tokio::test]
async fn a_takeover_through_the_bouncer_ends_a_pooled_claim_left_open_and_the_pool_opens_a_new_server() {
    let db = setup(2).await;
    let op = db.session().await;
    let t1 = acquire(&op, "billing", "a", 300).await.unwrap();
    let claimer = open_pooled_claim(&db, "billing", t1, 1).await;
    wait_expired(&db.owner, "billing").await;
    let follower = db.pooled().await;
    let started = Instant::now();
    let t2 = within_pool_wait("the takeover", acquire(&follower, "billing", "b", 30_000))
        .await
        .expect("the takeover");
    let took = started.elapsed();
    assert!(t2 > t1);
    assert!(took >= GRACE, "the takeover waited for the claim: {took:?}");
    assert!(
        took < Duration::from_secs(3),
        "within the grace and an abort: {took:?}"
    );
    let ended = claimer.backend;
    let err = commit_of_an_ended_claim(claimer).await;
    eprintln!("the ended claim's COMMIT through the bouncer: {err}");
    assert_eq!(db.claimed_by(1).await, None, "nothing of the old term committed");
    // Two transactions at once, each on a server of its own.
    let (a, b) = (db.pooled().await, db.pooled().await);
    within_pool_wait("a first transaction", a.batch_execute("BEGIN"))
        .await
        .unwrap();
    within_pool_wait("a second transaction", b.batch_execute("BEGIN"))
        .await
        .unwrap();
    let (pa, pb) = (
        within_pool_wait("a first server", backend(&a)).await,
        within_pool_wait("a second server", backend(&b)).await,
    );
    assert!(pa != ended && pb != ended && pa != pb, "{ended}: {pa}, {pb}");
    assert!(claim(&a, "billing", t2, 2).await.unwrap(), "the new term claims");
    assert!(
        !claim(&b, "billing", t1, 3).await.unwrap(),
        "the old term claims nothing"
    );
    a.batch_execute("COMMIT")
        .await
        .expect("the new term's claim commits");
    b.batch_execute("COMMIT").await.unwrap();
    assert_eq!(db.claimed_by(2).await, Some(t2));
    assert_eq!(db.claimed_by(3).await, None);
}

/// The pause is an operator's, straight to Postgres. The pool has one server
/// connection, the one the drain ended: the next transaction runs on a new one.
#[tokio::test]
async fn a_pause_ends_a_pooled_claim_left_open_within_the_grace_and_a_pool_of_one_serves_the_next_transaction(
) {
    let db = setup(1).await;
    let op = db.session().await;
    let t = acquire(&op, "billing", "a", 30_000).await.unwrap();
    let claimer = open_pooled_claim(&db, "billing", t, 1).await;
    let started = Instant::now();
    let paused: bool = scalar(&op, "SELECT leader_pause('billing', 'op', 'pooled')").await;
    let took = started.elapsed();
    assert!(paused);
    assert!(took >= GRACE, "the pause waited for the claim: {took:?}");
    assert!(
        took < Duration::from_secs(3),
        "within the grace and an abort: {took:?}"
    );
    let ended = claimer.backend;
    let err = commit_of_an_ended_claim(claimer).await;
    eprintln!("the ended claim's COMMIT through the bouncer: {err}");
    assert_eq!(db.claimed_by(1).await, None, "no claim of the paused term");
    // The next transaction through the bouncer, on a new server connection.
    let next = db.pooled().await;
    within_pool_wait("the next transaction", next.batch_execute("BEGIN"))
        .await
        .expect("the pool recovers from the ended server connection");
    let server = within_pool_wait("the next server", backend(&next)).await;
    assert_ne!(server, ended, "a new server connection");
    let marked = next
        .query_typed("UPDATE jobs SET claimed_by = 0 WHERE id = 2 RETURNING id", &[])
        .await
        .unwrap();
    assert_eq!(marked.len(), 1);
    next.batch_execute("COMMIT")
        .await
        .expect("the next transaction commits");
    assert_eq!(db.claimed_by(2).await, Some(0));
}

/// The guard: the fence takes a session-level and a transaction-level
/// advisory lock on one key of its backend, so PREPARE TRANSACTION of a
/// fenced transaction fails. Through the bouncer the session lock stays with
/// the server connection, which the pool (of 1) then gives to other clients:
/// their unfenced transactions take no transaction-level lock on the key and
/// prepare as before, and a fenced one is refused again.
#[tokio::test]
async fn through_the_bouncer_a_fenced_transaction_cannot_be_prepared_and_the_guards_lock_lets_another_client_prepare(
) {
    let db = setup(1).await;
    let mpx: String = scalar(&db.owner, "SHOW max_prepared_transactions").await;
    assert_ne!(mpx, "0", "the kit's cluster enables prepared transactions");
    let op = db.session().await;
    let t = acquire(&op, "billing", "a", 30_000).await.unwrap();
    let fenced = db.pooled().await;
    fenced.batch_execute("BEGIN").await.unwrap();
    assert!(claim(&fenced, "billing", t, 1).await.unwrap());
    let server = backend(&fenced).await;
    let gid = format!("pooled_fenced_{t}");
    let err = fenced
        .batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
        .await
        .expect_err("PREPARE of a fenced transaction");
    assert_eq!(err.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED), "{err:?}");
    let message = err.as_db_error().map(|e| e.message()).unwrap_or_default();
    assert!(
        message.contains("session-level and transaction-level locks"),
        "refused by the guard's lock (not its snapshot): {message}"
    );
    let prepared: i64 = scalar(
        &db.owner,
        &format!("SELECT count(*) FROM pg_prepared_xacts WHERE gid = '{gid}'"),
    )
    .await;
    assert_eq!(prepared, 0);
    assert_eq!(db.claimed_by(1).await, None, "the transaction was rolled back");
    // The server connection went back to the pool with the guard's session lock.
    assert!(
        db.advisory_locks_of(server).await > 0,
        "the guard's session lock stays with the server connection"
    );
    // Another client's unfenced transaction on that server connection prepares.
    let other = db.pooled().await;
    within_pool_wait("the unfenced transaction", other.batch_execute("BEGIN"))
        .await
        .unwrap();
    assert_eq!(backend(&other).await, server, "the pool's one server connection");
    let marked = other
        .query_typed("UPDATE jobs SET claimed_by = 0 WHERE id = 2 RETURNING id", &[])
        .await
        .unwrap();
    assert_eq!(marked.len(), 1);
    let gid2 = format!("pooled_unfenced_{t}");
    other
        .batch_execute(&format!("PREPARE TRANSACTION '{gid2}'"))
        .await
        .expect("an unfenced transaction prepares beside the guard's session lock");
    let prepared: i64 = scalar(
        &db.owner,
        &format!("SELECT count(*) FROM pg_prepared_xacts WHERE gid = '{gid2}'"),
    )
    .await;
    assert_eq!(prepared, 1);
    other
        .batch_execute(&format!("ROLLBACK PREPARED '{gid2}'"))
        .await
        .expect("ROLLBACK PREPARED through the bouncer");
    assert_eq!(db.claimed_by(2).await, None, "rolled back");
    // A fenced transaction on the same server connection is refused again.
    other.batch_execute("BEGIN").await.unwrap();
    assert_eq!(backend(&other).await, server);
    assert!(claim(&other, "billing", t, 3).await.unwrap());
    let err = other
        .batch_execute(&format!("PREPARE TRANSACTION '{gid}'"))
        .await
        .expect_err("PREPARE of a second fenced transaction on the server connection");
    assert_eq!(err.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED), "{err:?}");
    assert_eq!(db.claimed_by(3).await, None);
    // And a fenced claim there commits as ever.
    other.batch_execute("BEGIN").await.unwrap();
    assert!(claim(&other, "billing", t, 4).await.unwrap());
    other
        .batch_execute("COMMIT")
        .await
        .expect("a fenced claim commits");
    assert_eq!(db.claimed_by(4).await, Some(t));
}
