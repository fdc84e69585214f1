//! The fence on a real claim table. Each conjunct of the fence is shown to
//! matter: the same claim against a copy of the function with that conjunct
//! removed succeeds where the real one claims nothing (a mutation check that
//! runs on every test run).

use std::convert::Infallible;
use std::time::Duration;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use ticklease::{Acquire, Fence, Lead, LeaseStore, Manager, PgStore, PgStoreOptions, Role, Token};
use ticklease_testkit::{connect, migrated_db, test_config, PgCluster};

const JOBS: &str = "CREATE TABLE jobs (id int PRIMARY KEY, claimed_by bigint);
                    INSERT INTO jobs SELECT g, NULL FROM generate_series(1, 100) g;";

/// The claim funnel of a leader-only store method: it takes a `&Fence`.
async fn claim(client: &Client, fence: &Fence, limit: i64) -> Vec<i32> {
    let sql = format!(
        "UPDATE jobs SET claimed_by = $3
          WHERE id IN (SELECT id FROM jobs WHERE claimed_by IS NULL ORDER BY id LIMIT $4 FOR UPDATE SKIP LOCKED)
            AND {}
         RETURNING id",
        fence.predicate(1)
    );
    let [role, token] = fence.params();
    let rows = client
        .query_typed(
            &sql,
            &[role, token, (&fence.token().0, Type::INT8), (&limit, Type::INT8)],
        )
        .await
        .unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// The same claim with the fence call spelled out, for mutated fence functions.
async fn claim_with(client: &Client, function: &str, role: &str, token: Token) -> usize {
    let sql = format!(
        "UPDATE jobs SET claimed_by = $2
          WHERE id IN (SELECT id FROM jobs WHERE claimed_by IS NULL ORDER BY id LIMIT 1 FOR UPDATE SKIP LOCKED)
            AND (SELECT {function}($1, $2))
         RETURNING id"
    );
    client
        .query_typed(&sql, &[(&role, Type::TEXT), (&token.0, Type::INT8)])
        .await
        .unwrap()
        .len()
}

/// Copies of the fence with one conjunct removed each.
const MUTANTS: &str = "
CREATE FUNCTION fence_without_token(p_role text, p_token bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM leader_leases WHERE role = p_role AND paused_at IS NULL
                   AND leader_lease_live(holder_id, expires_at, statement_timestamp())) $$;
CREATE FUNCTION fence_without_pause(p_role text, p_token bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM leader_leases WHERE role = p_role AND holder_token = p_token
                   AND expires_at > statement_timestamp()) $$;
CREATE FUNCTION fence_without_expiry(p_role text, p_token bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM leader_leases WHERE role = p_role AND holder_token = p_token
                   AND paused_at IS NULL AND holder_id IS NOT NULL) $$;
CREATE FUNCTION fence_at_now(p_role text, p_token bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM leader_leases WHERE role = p_role AND holder_token = p_token
                   AND paused_at IS NULL AND leader_lease_live(holder_id, expires_at, now())) $$;
";

struct Setup {
    manager: Manager<PgStore>,
    client: Client,
    db: tokio_postgres::Config,
}

async fn setup() -> Setup {
    let db = migrated_db(PgCluster::shared()).await;
    let client = connect(&db).await.unwrap();
    client.batch_execute(JOBS).await.unwrap();
    client.batch_execute(MUTANTS).await.unwrap();
    let config = test_config();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let manager = Manager::start(store, config, [billing()]).await.unwrap();
    Setup { manager, client, db }
}

fn billing() -> Role {
    Role::new("billing").unwrap()
}

/// Leads one tick that claims `n` jobs and hands back its fence.
async fn tick_claiming(s: &Setup, n: i64) -> (Fence, Vec<i32>) {
    let client = &s.client;
    match s
        .manager
        .lead(&billing(), Duration::from_millis(1), |tick| async move {
            let ids = claim(client, tick.fence(), n).await;
            Ok::<_, Infallible>((tick.fence().clone(), ids))
        })
        .await
        .unwrap()
    {
        Lead::Completed { value, .. } => value,
        other => panic!("{other:?}"),
    }
}

async fn unclaimed(client: &Client) -> i64 {
    ticklease_testkit::scalar(client, "SELECT count(*) FROM jobs WHERE claimed_by IS NULL").await
}

#[tokio::test]
async fn claim_with_the_current_fence_claims_and_with_a_superseded_one_claims_nothing() {
    let s = setup().await;
    let (old, ids) = tick_claiming(&s, 3).await;
    assert_eq!(ids, [1, 2, 3]);
    tokio::time::sleep(Duration::from_millis(5)).await;
    let (new, ids) = tick_claiming(&s, 2).await;
    assert!(new.token() > old.token());
    assert_eq!(ids, [4, 5]);

    // A later term exists and is live (acquired, not yet released): the old token claims nothing.
    let store = s.manager.store();
    tokio::time::sleep(Duration::from_millis(5)).await;
    let Acquire::Acquired(term) = store
        .acquire(&billing(), "b", Duration::from_secs(30), Duration::from_millis(1))
        .await
        .unwrap()
    else {
        panic!("acquire")
    };
    assert_eq!(claim(&s.client, &old, 5).await, Vec::<i32>::new());
    assert_eq!(claim(&s.client, &new, 5).await, Vec::<i32>::new());
    assert_eq!(unclaimed(&s.client).await, 95, "nothing changed");
    // Mutation: without the token conjunct the stale claim goes through.
    assert_eq!(
        claim_with(&s.client, "fence_without_token", "billing", old.token()).await,
        1
    );
    assert_eq!(
        claim_with(&s.client, "leader_fence", "billing", term.token).await,
        1,
        "the live term claims"
    );
}

#[tokio::test]
async fn claim_in_a_paused_or_released_or_expired_term_claims_nothing() {
    let s = setup().await;
    let store = s.manager.store();
    let ttl = Duration::from_millis(600);
    let Acquire::Acquired(term) = store
        .acquire(&billing(), "a", ttl, Duration::from_millis(1))
        .await
        .unwrap()
    else {
        panic!("acquire")
    };
    let t = term.token;

    // Expired, nobody took over: the token still matches, the lease is not live.
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    assert_eq!(claim_with(&s.client, "leader_fence", "billing", t).await, 0);
    assert_eq!(claim_with(&s.client, "leader_fence_lock", "billing", t).await, 0);
    assert_eq!(
        claim_with(&s.client, "fence_without_expiry", "billing", t).await,
        1,
        "mutation: expiry ignored"
    );

    // Paused: pause clears the holder in the same statement. Make the row look
    // held again by hand, to show the paused_at conjunct on its own.
    s.client
        .batch_execute("SELECT leader_pause('billing', 'ops', 'drill')")
        .await
        .unwrap();
    assert_eq!(claim_with(&s.client, "leader_fence", "billing", t).await, 0);
    s.client
        .batch_execute(
            "ALTER TABLE leader_leases DROP CONSTRAINT leader_leases_paused_is_unheld;
             UPDATE leader_leases SET holder_id = 'a', acquired_at = now(), expires_at = now() + interval '1 minute'",
        )
        .await
        .unwrap();
    assert_eq!(claim_with(&s.client, "leader_fence", "billing", t).await, 0);
    assert_eq!(claim_with(&s.client, "leader_fence_lock", "billing", t).await, 0);
    assert_eq!(
        claim_with(&s.client, "fence_without_pause", "billing", t).await,
        1,
        "mutation: pause ignored"
    );

    // Released: the holder is cleared, the token unchanged.
    s.client
        .batch_execute("UPDATE leader_leases SET paused_at = NULL, paused_by = NULL, holder_id = NULL, acquired_at = NULL")
        .await
        .unwrap_err(); // the held-has-expiry CHECK refuses a half-cleared row
    s.client
        .batch_execute(
            "UPDATE leader_leases SET paused_at = NULL, paused_by = NULL, holder_id = NULL, acquired_at = NULL, expires_at = NULL",
        )
        .await
        .unwrap();
    assert_eq!(claim_with(&s.client, "leader_fence", "billing", t).await, 0);
    assert_eq!(claim_with(&s.client, "leader_fence_lock", "billing", t).await, 0);
}

#[tokio::test]
async fn fence_reads_the_statement_clock_not_the_transaction_start() {
    let s = setup().await;
    let store = s.manager.store();
    let ttl = Duration::from_millis(600);
    let Acquire::Acquired(term) = store
        .acquire(&billing(), "a", ttl, Duration::from_millis(1))
        .await
        .unwrap()
    else {
        panic!("acquire")
    };
    let mut client = connect(&s.db).await.unwrap();
    let tx = client.transaction().await.unwrap();
    let fence = |f: &'static str| {
        let sql = format!("SELECT {f}('billing', $1)");
        let tx = &tx;
        async move {
            tx.query_typed(&sql, &[(&term.token.0, Type::INT8)])
                .await
                .unwrap()[0]
                .get::<_, bool>(0)
        }
    };
    assert!(fence("leader_fence").await && fence("fence_at_now").await);
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    assert!(
        !fence("leader_fence").await,
        "an expired lease must fail the fence inside a long transaction"
    );
    assert!(
        fence("fence_at_now").await,
        "mutation: now() is frozen at BEGIN and still accepts it"
    );
}

#[derive(Clone, Copy)]
enum EndTerm {
    Takeover,
    Pause,
}

/// Holds a claim transaction open past the lease's expiry and ends the term
/// (a contender's takeover, or an operator's pause), with `function` as the
/// claim's fence. Returns whether the term ended while the claim was still
/// uncommitted.
async fn term_ends_during_open_claim(s: &Setup, function: &str, end: EndTerm) -> bool {
    let store = s.manager.store();
    let ttl = Duration::from_millis(600);
    let Acquire::Acquired(term) = store
        .acquire(&billing(), "a", ttl, Duration::from_millis(1))
        .await
        .unwrap()
    else {
        panic!("acquire")
    };
    let mut claimer = connect(&s.db).await.unwrap();
    let tx = claimer.transaction().await.unwrap();
    let sql = format!(
        "UPDATE jobs SET claimed_by = $2 WHERE id IN (SELECT id FROM jobs WHERE claimed_by IS NULL LIMIT 1)
            AND (SELECT {function}($1, $2)) RETURNING id"
    );
    let claimed = tx
        .query_typed(&sql, &[(&"billing", Type::TEXT), (&term.token.0, Type::INT8)])
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "the live term claims");
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;

    let contender = PgStore::connect(
        s.db.clone(),
        PgStoreOptions {
            pool_size: 1,
            statement_timeout: Duration::from_secs(20),
        },
    )
    .await
    .unwrap();
    let ender = tokio::spawn(async move {
        match end {
            EndTerm::Takeover => {
                let acquired = contender
                    .acquire(&billing(), "b", Duration::from_secs(30), Duration::from_millis(1))
                    .await
                    .unwrap();
                assert!(
                    matches!(acquired, Acquire::Acquired(t) if t.token > term.token),
                    "{acquired:?}"
                );
            }
            EndTerm::Pause => assert!(contender.pause(&billing(), "ops", "drill").await.unwrap()),
        }
    });
    tokio::time::sleep(Duration::from_millis(700)).await;
    let overlapped = ender.is_finished();
    tx.commit().await.unwrap();
    ender.await.unwrap();
    overlapped
}

#[tokio::test]
async fn claim_racing_a_takeover_commits_before_the_takeover() {
    let s = setup().await;
    let ended_first = term_ends_during_open_claim(&s, "leader_fence_lock", EndTerm::Takeover).await;
    assert!(!ended_first, "the takeover must wait for the claim to commit");
    let by_old: i64 = ticklease_testkit::scalar(
        &s.client,
        "SELECT count(*) FROM jobs WHERE claimed_by IS NOT NULL",
    )
    .await;
    assert_eq!(by_old, 1);
}

#[tokio::test]
async fn mutation_a_stable_fence_lets_a_claim_commit_after_the_takeover() {
    let s = setup().await;
    let ended_first = term_ends_during_open_claim(&s, "leader_fence", EndTerm::Takeover).await;
    assert!(ended_first, "without the lock the takeover does not wait");
}

#[tokio::test]
async fn pause_waits_for_an_in_flight_claim_to_commit() {
    let s = setup().await;
    assert!(!term_ends_during_open_claim(&s, "leader_fence_lock", EndTerm::Pause).await);
}

#[tokio::test]
async fn fence_predicate_runs_once_per_statement() {
    let s = setup().await;
    let (fence, _) = tick_claiming(&s, 1).await;
    let sql = format!(
        "EXPLAIN UPDATE jobs SET claimed_by = 0 WHERE {}",
        fence.predicate(1)
    );
    let [role, token] = fence.params();
    let plan: Vec<String> = s
        .client
        .query_typed(&sql, &[role, token])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert!(
        plan.iter().any(|l| l.contains("InitPlan")),
        "expected an InitPlan: {plan:#?}"
    );
}
