//! Issue 32, items 1 and 3: the fence's advisory-lock keys are public (any
//! login computes a role's two class ids from `leader_role_hash`'s text and
//! reads tokens in `pg_locks`). A login with CONNECT alone that holds
//! "earlier" pairs of a role's keys in many backends, and fills the lock
//! table, must make no takeover or pause slower than its statement timeout,
//! take no claimer's place in the sweep, and lose none of its own backends
//! to it. On a cluster of its own: the lock table is shared by every
//! database of a cluster, and this test fills most of it.

use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, Config};

use ticklease_testkit::{connect, PgCluster};

/// Backends of the hostile login, each holding one planted pair (more than
/// the 64 candidates the sweep once looked at).
const PLANTED: usize = 100;

/// Locks the hostile login adds to the lock table (its capacity here is
/// max_locks_per_transaction 64 x max_connections 400).
const FILLER: i32 = 20_000;

/// The statement timeout every decision runs under here (the test timings').
const STATEMENT_TIMEOUT: &str = "SET statement_timeout = 500";

struct Logins {
    owner: Client,
    db: Config,
}

impl Logins {
    async fn create(cluster: &PgCluster) -> Logins {
        Logins::create_owned(cluster, None).await
    }

    /// A database whose tables `owner` owns (a login that is no superuser,
    /// a member of pg_signal_backend, created here), or the superuser's.
    async fn create_owned(cluster: &PgCluster, owner: Option<&str>) -> Logins {
        let name = cluster.create_database().await.unwrap();
        let mut db = cluster.config(&name);
        if let Some(owner) = owner {
            let admin = connect(&db).await.unwrap();
            admin
                .batch_execute(&format!(
                    "CREATE ROLE {owner} LOGIN CREATEROLE IN ROLE pg_signal_backend;
                     ALTER DATABASE \"{name}\" OWNER TO {owner};
                     ALTER SCHEMA public OWNER TO {owner}"
                ))
                .await
                .unwrap();
            db.user(owner);
        }
        let mut owner = connect(&db).await.unwrap();
        ticklease::migrate(&mut owner).await.unwrap();
        owner
            .batch_execute(
                "CREATE TABLE jobs (id int PRIMARY KEY, claimed_by bigint);
                 INSERT INTO jobs SELECT g, NULL FROM generate_series(1, 10) g;
                 GRANT SELECT, UPDATE ON jobs TO ticklease_app;
                 CREATE ROLE planted_app1 LOGIN IN ROLE ticklease_app;
                 CREATE ROLE planted_app2 LOGIN IN ROLE ticklease_app;
                 CREATE ROLE planted_operator LOGIN IN ROLE ticklease_operator;
                 CREATE ROLE planted_nobody LOGIN;
                 SELECT leader_seed(ARRAY['victim'])",
            )
            .await
            .unwrap();
        Logins { owner, db }
    }

    async fn login(&self, user: &str) -> Client {
        let mut as_user = self.db.clone();
        as_user.user(user);
        let client = connect(&as_user).await.unwrap();
        client.batch_execute(STATEMENT_TIMEOUT).await.unwrap();
        client
    }

    /// Waits until the role's term has expired on the database clock.
    async fn expired(&self, role: &str) {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let row = self
                .owner
                .query_one(
                    "SELECT expires_at <= now() FROM leader_leases WHERE role = $1",
                    &[&role],
                )
                .await
                .unwrap();
            if row.get::<_, Option<bool>>(0) == Some(true) {
                return;
            }
            assert!(Instant::now() < deadline, "the term never expired");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// A term of `role` for `holder`; its token.
async fn acquire(client: &Client, role: &str, holder: &str, ttl_ms: i64) -> i64 {
    let row = client
        .query_typed(
            "SELECT holder_token FROM leader_acquire($1, $2, $3, 1)",
            &[(&role, Type::TEXT), (&holder, Type::TEXT), (&ttl_ms, Type::INT8)],
        )
        .await
        .unwrap();
    row[0].get::<_, Option<i64>>(0).expect("the role is free")
}

/// Opens a transaction on `client` that passes the fence and locks job `id`.
async fn claim_and_freeze(client: &Client, role: &str, token: i64, id: i32) {
    claim_and_freeze_with(client, "leader_fence", role, token, id).await
}

/// The same through the fence function named.
async fn claim_and_freeze_with(client: &Client, fence: &str, role: &str, token: i64, id: i32) {
    client.batch_execute("BEGIN").await.unwrap();
    let n = client
        .execute_typed(
            &format!("UPDATE jobs SET claimed_by = $2 WHERE id = $3 AND (SELECT {fence}($1, $2))"),
            &[(&role, Type::TEXT), (&token, Type::INT8), (&id, Type::INT4)],
        )
        .await
        .unwrap();
    assert_eq!(n, 1, "the live term's claim passes the fence");
}

/// The hostile login's plant: `PLANTED` backends holding an "earlier" pair
/// of the role's fence keys (computed from public text alone), one holding
/// `FILLER` more locks.
async fn plant(logins: &Logins, role: &str, token: i64) -> Vec<Client> {
    let key = |which: i32| format!("hashtext('ticklease:{which}:6:public:{role}')");
    let earlier = ((token - 1000) & 0xffff_ffff) as u32 as i32;
    let mut planted = Vec::with_capacity(PLANTED + 1);
    for _ in 0..PLANTED {
        let nobody = logins.login("planted_nobody").await;
        nobody
            .batch_execute(&format!(
                "SELECT pg_advisory_lock_shared({}, {earlier}), pg_advisory_lock_shared({}, {earlier})",
                key(1),
                key(2)
            ))
            .await
            .unwrap();
        planted.push(nobody);
    }
    let filler = logins.login("planted_nobody").await;
    filler
        .batch_execute(&format!(
            "SET statement_timeout = 0; SELECT count(pg_advisory_lock(7, g)) FROM generate_series(1, {FILLER}) g"
        ))
        .await
        .unwrap();
    planted.push(filler);
    planted
}

/// Every planted backend still answers: the sweep ended none of them.
async fn all_alive(planted: &[Client]) {
    for (i, nobody) in planted.iter().enumerate() {
        nobody
            .batch_execute("SELECT 1")
            .await
            .unwrap_or_else(|e| panic!("planted backend {i} was ended by the sweep: {e}"));
    }
}

/// The frozen claimer's session was ended by the sweep. Asked with a plain
/// query, not a COMMIT: a COMMIT would fail its commit check and roll back
/// by itself, freeing its rows whether or not the sweep ended it.
async fn ended(claimer: &Client, what: &str) {
    let asked = claimer.batch_execute("SELECT 1").await;
    assert!(
        asked.is_err() || claimer.is_closed(),
        "{what}: the frozen claimer survived the sweep"
    );
}

#[tokio::test]
async fn a_login_with_connect_alone_that_plants_fence_keys_slows_no_takeover_or_pause_and_hides_no_claimer() {
    let cluster = PgCluster::start().unwrap();
    let logins = Logins::create(&cluster).await;
    let app1 = logins.login("planted_app1").await;
    let app2 = logins.login("planted_app2").await;
    let first = acquire(&app1, "victim", "a", 60_000).await;
    let planted = plant(&logins, "victim", first).await;
    let claimer = logins.login("planted_app1").await;
    claim_and_freeze(&claimer, "victim", first, 1).await;
    // Its holder froze too: the term runs out (the owner ends it now rather
    // than the test waiting for its lease).
    logins
        .owner
        .batch_execute("UPDATE leader_leases SET expires_at = now() WHERE role = 'victim'")
        .await
        .unwrap();
    logins.expired("victim").await;

    // The takeover: within the statement timeout, the claimer ended, the plants spared.
    let started = Instant::now();
    let second = acquire(&app2, "victim", "b", 60_000).await;
    let took = started.elapsed();
    ended(&claimer, "takeover").await;
    all_alive(&planted).await;
    app2.batch_execute("SET lock_timeout = 200").await.unwrap();
    let reclaimed = app2
        .execute_typed(
            "UPDATE jobs SET claimed_by = $2 WHERE id = 1 AND (SELECT leader_fence($1, $2))",
            &[(&"victim", Type::TEXT), (&second, Type::INT8)],
        )
        .await
        .expect("the frozen claimer's row is free again");
    assert_eq!(reclaimed, 1);

    // The pause: the same, for the operator.
    let claimer = logins.login("planted_app2").await;
    claim_and_freeze(&claimer, "victim", second, 2).await;
    let operator = logins.login("planted_operator").await;
    let started = Instant::now();
    operator
        .batch_execute("SELECT leader_pause('victim', 'oncall', 'planted keys')")
        .await
        .expect("the pause answers within the statement timeout");
    let paused = started.elapsed();
    ended(&claimer, "pause").await;
    all_alive(&planted).await;
    println!("takeover {took:?}, pause {paused:?} with {PLANTED} planted pairs and {FILLER} more locks");
}

/// Issue 43, item 3: the fence (generation 9) finds a claimer by the term's
/// key it holds shared, counted only for a login that may call the fence,
/// or by its marker, a key derived from the term's salt (which a login with
/// CONNECT alone cannot read) and the claimer's own xid; the term's enders
/// lock the lease row, which such a login cannot lock nor wait on. The
/// audits' cases: 300 backends of a CONNECT-only login, each in a
/// transaction with an xid of its own, holding a prepared INSERT into the
/// lease table (its lock is granted while parsing), the term's key shared,
/// copies of the claimer's marks and other keys of its class; one holds the
/// term's gate exclusively, the others the next term's gate shared; another
/// fills the lock table; the cluster has 2,000 more roles. With the default
/// install (no REVOKE USAGE), owned by a superuser and by a login that is
/// none.
mod generation_7 {
    use super::*;

    const PLANTED: usize = 300;
    /// More roles in the cluster.
    const ROLES: usize = 2_000;

    async fn marker_class_and_gate(owner: &Client, role: &str, token: i64) -> (i32, i32, i32) {
        let row = owner
            .query_one(
                "SELECT leader_role_hash($1, 3), leader_role_hash($1, 4), leader_token_low($2)",
                &[&role, &token],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1), row.get(2))
    }

    /// The markers the claimer holds, as pg_locks shows them to any login.
    async fn markers(owner: &Client, class: i32) -> Vec<i32> {
        owner
            .query(
                "SELECT objid::int8 FROM pg_locks WHERE locktype = 'advisory' AND classid = ($1::int8 & 4294967295)::oid",
                &[&(class as i64)],
            )
            .await
            .unwrap()
            .iter()
            .map(|r| r.get::<_, i64>(0) as u32 as i32)
            .collect()
    }

    async fn plant(logins: &Logins, role: &str, token: i64) -> Vec<Client> {
        let (class, gate, low) = marker_class_and_gate(&logins.owner, role, token).await;
        let copied = markers(&logins.owner, class).await;
        assert!(!copied.is_empty(), "the claimer's marker shows");
        let copies: String = copied
            .iter()
            .map(|k| format!(", pg_advisory_xact_lock_shared({class}, {k})"))
            .collect();
        let next_low = ((token + 1) & 0xffff_ffff) as u32 as i32;
        // The term's key (generation 9), which the claimer holds shared.
        let term_key = ((class as i64) << 32) | (token & 0xffff_ffff);
        let mut planted = Vec::with_capacity(PLANTED + 1);
        for i in 0..PLANTED {
            let nobody = logins.login("planted_nobody").await;
            let gate_lock = if i == 0 {
                format!("pg_advisory_xact_lock({gate}, {low})")
            } else {
                format!("pg_advisory_xact_lock_shared({gate}, {next_low})")
            };
            nobody
                .batch_execute(&format!(
                    "BEGIN;
                     CREATE TEMP TABLE mine (x int); INSERT INTO mine VALUES (1);
                     PREPARE planted AS INSERT INTO leader_leases (role) VALUES ('planted');
                     SELECT {gate_lock}{copies}, pg_advisory_xact_lock_shared({term_key}),
                            pg_advisory_xact_lock_shared({class}, {i}),
                            pg_advisory_xact_lock_shared({class}, -{i} - 1)"
                ))
                .await
                .unwrap();
            planted.push(nobody);
        }
        let filler = logins.login("planted_nobody").await;
        filler
            .batch_execute(&format!(
                "SET statement_timeout = 0; SELECT count(pg_advisory_lock(7, g)) FROM generate_series(1, {FILLER}) g"
            ))
            .await
            .unwrap();
        planted.push(filler);
        planted
    }

    async fn takeover_and_pause_hold_against_a_login_with_connect_alone(owner: Option<&str>) {
        let cluster = PgCluster::start().unwrap();
        let logins = Logins::create_owned(&cluster, owner).await;
        let app1 = logins.login("planted_app1").await;
        let app2 = logins.login("planted_app2").await;
        // Roles of the cluster: the drain's login check once cost a test per
        // role for each planted backend (review 11, H1: 300 backends and
        // 5,000 roles, 18 s a call).
        logins
            .owner
            .batch_execute(&format!(
                "DO $$ BEGIN FOR i IN 1..{ROLES} LOOP EXECUTE format('CREATE ROLE planted_filler_%s', i); END LOOP; END $$"
            ))
            .await
            .unwrap();
        let first = acquire(&app1, "victim", "a", 60_000).await;
        let claimer = logins.login("planted_app1").await;
        claim_and_freeze_with(&claimer, "leader_fence_v2", "victim", first, 1).await;
        let planted = plant(&logins, "victim", first).await;
        // A claim of the live term still passes under the planted gate.
        let other = logins.login("planted_app2").await;
        claim_and_freeze_with(&other, "leader_fence_v2", "victim", first, 3).await;
        other
            .batch_execute("COMMIT")
            .await
            .expect("a claim under a planted gate commits");
        logins
            .owner
            .batch_execute("UPDATE leader_leases SET expires_at = now() WHERE role = 'victim'")
            .await
            .unwrap();
        logins.expired("victim").await;

        let started = Instant::now();
        let second = acquire(&app2, "victim", "b", 60_000).await;
        let took = started.elapsed();
        ended(&claimer, "takeover").await;
        all_alive(&planted).await;

        let claimer = logins.login("planted_app2").await;
        claim_and_freeze_with(&claimer, "leader_fence_v2", "victim", second, 2).await;
        let operator = logins.login("planted_operator").await;
        let started = Instant::now();
        operator
            .batch_execute("SELECT leader_pause('victim', 'oncall', 'planted keys')")
            .await
            .expect("the pause answers within the statement timeout");
        let paused = started.elapsed();
        ended(&claimer, "pause").await;
        all_alive(&planted).await;
        let claimed: Vec<Option<i64>> = logins
            .owner
            .query("SELECT claimed_by FROM jobs WHERE id IN (1, 2) ORDER BY id", &[])
            .await
            .unwrap()
            .iter()
            .map(|r| r.get(0))
            .collect();
        assert_eq!(claimed, [None, None], "no claim of an ended term committed");
        println!("generation 7, owner {owner:?}: takeover {took:?}, pause {paused:?} with {PLANTED} planted backends and {FILLER} more locks");
    }

    #[tokio::test]
    async fn planted_markers_gates_and_prepared_inserts_slow_no_takeover_or_pause_under_a_superuser_owner() {
        takeover_and_pause_hold_against_a_login_with_connect_alone(None).await;
    }

    #[tokio::test]
    async fn planted_markers_gates_and_prepared_inserts_slow_no_takeover_or_pause_under_an_owner_that_is_no_superuser(
    ) {
        takeover_and_pause_hold_against_a_login_with_connect_alone(Some("lease_owner")).await;
    }
}

/// The generation-6 sweep (still run by takeovers and pauses, for claims
/// of older clients) took any backend holding the claims table's lock and
/// a pair of an ended term's keys for a claimer; a login with CONNECT alone
/// gets that lock by preparing an INSERT. Since generation 7 only a login
/// that may call `leader_fence` counts.
#[tokio::test]
async fn a_prepared_insert_and_planted_keys_of_a_login_with_connect_alone_pass_for_no_generation_6_claimer() {
    // A cluster of its own: the logins are the cluster's.
    let cluster = PgCluster::start().unwrap();
    let logins = Logins::create(&cluster).await;
    let app1 = logins.login("planted_app1").await;
    let first = acquire(&app1, "victim", "a", 60_000).await;
    let key = |which: i32| format!("hashtext('ticklease:{which}:6:public:victim')");
    let low = (first & 0xffff_ffff) as u32 as i32;
    let nobody = logins.login("planted_nobody").await;
    nobody
        .batch_execute(&format!(
            "BEGIN; PREPARE planted AS INSERT INTO leader_fence_claims VALUES (NULL, NULL, NULL);
             SELECT pg_advisory_xact_lock_shared({}, {low}), pg_advisory_xact_lock_shared({}, {low})",
            key(1),
            key(2)
        ))
        .await
        .unwrap();
    let operator = logins.login("planted_operator").await;
    operator
        .batch_execute("SELECT leader_pause('victim', 'oncall', 'planted claims lock')")
        .await
        .unwrap();
    nobody
        .batch_execute("COMMIT")
        .await
        .expect("the planted backend was not ended");
}
