//! The generation-6 fence (`leader_fence`, its commit check), kept for
//! clients built before generation 7, on a real claim table. Each conjunct of the fence is shown to
//! matter: the same claim against a copy of the function with that conjunct
//! removed succeeds where the real one claims nothing (a mutation check that
//! runs on every test run).

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;

use tokio_postgres::types::Type;
use tokio_postgres::Client;

use ticklease::{
    Acquire, Fence, Lead, LeaseStore, Manager, PgStore, PgStoreOptions, Refusal, Renew, Role, Token,
};
use ticklease_testkit::{connect, migrated_db, test_config, PgCluster};

const JOBS: &str = "CREATE TABLE jobs (id int PRIMARY KEY, claimed_by bigint);
                    INSERT INTO jobs SELECT g, NULL FROM generate_series(1, 100) g;";

/// The claim funnel of a leader-only store method: it takes a `&Fence`.
async fn claim(client: &Client, fence: &Fence, limit: i64) -> Vec<i32> {
    // The generation-6 fence by name: this file holds its commit check
    // (the library's predicate is generation 7's: tests/fence_v2.rs).
    let sql = "UPDATE jobs SET claimed_by = $3
          WHERE id IN (SELECT id FROM jobs WHERE claimed_by IS NULL ORDER BY id LIMIT $4 FOR UPDATE SKIP LOCKED)
            AND (SELECT leader_fence($1, $2))
         RETURNING id";
    let [role, token] = fence.params();
    let rows = client
        .query_typed(
            sql,
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

/// Copies of the fence with one part removed each. They register nothing,
/// so a claim through them is not checked at commit either.
const MUTANTS: &str = "
CREATE FUNCTION fence_without_token(p_role text, p_token bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM leader_leases WHERE role = p_role AND paused_at IS NULL
                   AND leader_lease_live(holder_id, expires_at, clock_timestamp())) $$;
CREATE FUNCTION fence_without_pause(p_role text, p_token bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM leader_leases WHERE role = p_role AND holder_token = p_token
                   AND expires_at > clock_timestamp()) $$;
CREATE FUNCTION fence_without_expiry(p_role text, p_token bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM leader_leases WHERE role = p_role AND holder_token = p_token
                   AND paused_at IS NULL AND holder_id IS NOT NULL) $$;
CREATE FUNCTION fence_at_now(p_role text, p_token bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM leader_leases WHERE role = p_role AND holder_token = p_token
                   AND paused_at IS NULL AND leader_lease_live(holder_id, expires_at, now())) $$;
CREATE FUNCTION fence_at_statement_start(p_role text, p_token bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM leader_leases WHERE role = p_role AND holder_token = p_token
                   AND paused_at IS NULL AND leader_lease_live(holder_id, expires_at, statement_timestamp())) $$;
CREATE FUNCTION fence_unchecked_at_commit(p_role text, p_token bigint) RETURNS boolean LANGUAGE sql STABLE AS $$
  SELECT EXISTS (SELECT 1 FROM leader_leases WHERE role = p_role AND holder_token = p_token
                   AND paused_at IS NULL AND leader_lease_live(holder_id, expires_at, clock_timestamp())) $$;
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

/// A term of `ttl` for `billing`, acquired outside any tick (no heartbeat).
async fn term_of(s: &Setup, ttl: Duration) -> Token {
    match s
        .manager
        .store()
        .acquire(&billing(), "a", ttl, Duration::from_millis(1))
        .await
        .unwrap()
    {
        Acquire::Acquired(term) => term.token,
        other => panic!("acquire: {other:?}"),
    }
}

/// ACQUIREs `billing` for `holder` until it is acquired; how long that took.
async fn take_over(s: &Setup, holder: &str) -> (Duration, Token) {
    let started = Instant::now();
    let store = s.manager.store();
    loop {
        match store
            .acquire(
                &billing(),
                holder,
                Duration::from_secs(30),
                Duration::from_millis(1),
            )
            .await
            .unwrap()
        {
            Acquire::Acquired(term) => return (started.elapsed(), term.token),
            Acquire::Refused(Refusal::Held { .. }) => tokio::time::sleep(Duration::from_millis(10)).await,
            other => panic!("takeover: {other:?}"),
        }
    }
}

#[tokio::test]
async fn fence_reads_the_clock_at_execution_not_at_begin_or_message_arrival() {
    let s = setup().await;
    let ttl = Duration::from_millis(600);
    let t = term_of(&s, ttl).await;
    let mut client = connect(&s.db).await.unwrap();
    let tx = client.transaction().await.unwrap();
    let fence = |f: &'static str| {
        let sql = format!("SELECT {f}('billing', $1)");
        let tx = &tx;
        async move { tx.query_typed(&sql, &[(&t.0, Type::INT8)]).await.unwrap()[0].get::<_, bool>(0) }
    };
    // (A passing leader_fence here would also end this idle session with the term.)
    assert!(fence("fence_at_now").await);
    tokio::time::sleep(ttl + Duration::from_millis(200)).await;
    assert!(
        !fence("leader_fence").await,
        "an expired lease must fail the fence inside a long transaction"
    );
    assert!(
        fence("fence_at_now").await,
        "mutation: now() is frozen at BEGIN and still accepts it"
    );
    tx.rollback().await.unwrap();

    // One simple-query message: statement_timestamp() is the message's arrival,
    // before the sleep; the fence must read the clock after it.
    let t = term_of(&s, ttl).await;
    s.client
        .batch_execute(&format!(
            "CREATE TABLE seen (f text, passed boolean);
             SELECT pg_sleep(0.8);
             INSERT INTO seen SELECT 'real', (SELECT leader_fence('billing', {t}));
             INSERT INTO seen SELECT 'mutant', (SELECT fence_at_statement_start('billing', {t}));",
            t = t.0
        ))
        .await
        .unwrap();
    let real: bool = ticklease_testkit::scalar(&s.client, "SELECT passed FROM seen WHERE f = 'real'").await;
    let mutant: bool =
        ticklease_testkit::scalar(&s.client, "SELECT passed FROM seen WHERE f = 'mutant'").await;
    assert!(!real, "the fence passed 200 ms after expires_at");
    assert!(mutant, "mutation: statement_timestamp() accepts the expired term");
}

/// Claims one job in an open transaction with `function` as the fence, lets
/// the lease expire, and takes the role over (or pauses it) while the claim
/// is uncommitted. Returns how long the takeover or pause took, and the
/// claim's COMMIT.
async fn term_ends_during_open_claim(
    s: &Setup,
    function: &str,
    end: EndTerm,
) -> (Duration, Result<(), tokio_postgres::Error>) {
    let ttl = Duration::from_millis(600);
    let t = term_of(s, ttl).await;
    let mut claimer = connect(&s.db).await.unwrap();
    let tx = claimer.transaction().await.unwrap();
    let sql = format!(
        "UPDATE jobs SET claimed_by = $2 WHERE id IN (SELECT id FROM jobs WHERE claimed_by IS NULL LIMIT 1)
            AND (SELECT {function}($1, $2)) RETURNING id"
    );
    let claimed = tx
        .query_typed(&sql, &[(&"billing", Type::TEXT), (&t.0, Type::INT8)])
        .await
        .unwrap();
    assert_eq!(claimed.len(), 1, "the live term claims");
    // In SQL, not through the store: the store would also end the claimer's
    // session (its sweep), and this is the commit check's test.
    let elapsed = match end {
        EndTerm::Takeover => {
            tokio::time::sleep(ttl).await;
            let started = Instant::now();
            loop {
                let token: Option<i64> = ticklease_testkit::scalar(
                    &s.client,
                    "SELECT holder_token FROM leader_acquire('billing', 'b', 30000, 1, NULL)",
                )
                .await;
                if let Some(token) = token {
                    assert!(token > t.0);
                    break started.elapsed();
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
        EndTerm::Pause => {
            let started = Instant::now();
            assert!(
                ticklease_testkit::scalar::<bool>(
                    &s.client,
                    "SELECT leader_pause('billing', 'ops', 'drill')"
                )
                .await
            );
            started.elapsed()
        }
    };
    (elapsed, tx.commit().await)
}

#[derive(Clone, Copy)]
enum EndTerm {
    Takeover,
    Pause,
}

/// The claim did not commit: its COMMIT failed the commit check, or the
/// next term's leader had ended the claimer's session (the sweep after its
/// ACQUIRE or a pause).
fn assert_rolled_back<T: std::fmt::Debug>(commit: Result<T, tokio_postgres::Error>) {
    let err = commit.expect_err("the claim must not commit after its term ended");
    assert!(
        err.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE)
            || err.code() == Some(&SqlState::ADMIN_SHUTDOWN)
            || err.is_closed(),
        "{err:?}"
    );
}

#[tokio::test]
async fn a_claim_open_past_its_term_neither_delays_the_takeover_nor_commits() {
    let s = setup().await;
    let (waited, commit) = term_ends_during_open_claim(&s, "leader_fence", EndTerm::Takeover).await;
    assert!(waited < Duration::from_millis(500), "takeover waited {waited:?}");
    assert_rolled_back(commit);
    assert_eq!(unclaimed(&s.client).await, 100, "the stale claim was rolled back");
}

#[tokio::test]
async fn mutation_a_fence_unchecked_at_commit_lets_a_claim_commit_after_the_takeover() {
    let s = setup().await;
    let (_, commit) = term_ends_during_open_claim(&s, "fence_unchecked_at_commit", EndTerm::Takeover).await;
    commit.unwrap();
    assert_eq!(unclaimed(&s.client).await, 99, "the stale claim committed");
}

#[tokio::test]
async fn leader_fence_lock_of_0002_is_the_same_fence() {
    let s = setup().await;
    let (_, commit) = term_ends_during_open_claim(&s, "leader_fence_lock", EndTerm::Takeover).await;
    assert_rolled_back(commit);
}

#[tokio::test]
async fn pause_during_an_open_claim_returns_at_once_and_the_claim_rolls_back() {
    let s = setup().await;
    let (waited, commit) = term_ends_during_open_claim(&s, "leader_fence", EndTerm::Pause).await;
    assert!(waited < Duration::from_millis(500), "pause waited {waited:?}");
    assert_rolled_back(commit);
    assert_eq!(unclaimed(&s.client).await, 100);
}

/// Claims the first 10 jobs in `tx` under the fence of (`role`, `token`) and
/// leaves the transaction open: a claimer frozen in its term.
async fn freeze_ten(tx: &tokio_postgres::Transaction<'_>, role: &str, token: i64) {
    let sql =
        "UPDATE jobs SET claimed_by = $2 WHERE id IN (SELECT id FROM jobs ORDER BY id LIMIT 10 FOR UPDATE)
                 AND (SELECT leader_fence($1, $2)) RETURNING id";
    let claimed = tx
        .query_typed(sql, &[(&role, Type::TEXT), (&token, Type::INT8)])
        .await
        .unwrap();
    assert_eq!(claimed.len(), 10);
}

/// Claims jobs one by one as billing's term `token` for up to 2 s (skipping
/// locked rows): how many it got.
async fn claim_all(s: &Setup, token: Token) -> usize {
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut claimed = 0;
    while claimed < 100 && Instant::now() < deadline {
        let n = claim_with(&s.client, "leader_fence", "billing", token).await;
        claimed += n;
        if n == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    claimed
}

/// A claimer that froze idle inside its fenced transaction: the role is taken
/// over when the lease runs out, and the server ends the frozen session soon
/// after, so the rows it locked become claimable by the new leader.
#[tokio::test]
async fn a_frozen_idle_in_transaction_claimer_delays_neither_takeover_nor_its_rows() {
    let s = setup().await;
    let ttl = Duration::from_millis(600);
    let acquired = Instant::now();
    let t = term_of(&s, ttl).await;
    let mut frozen = connect(&s.db).await.unwrap();
    let tx = frozen.transaction().await.unwrap();
    freeze_ten(&tx, "billing", t.0).await;

    // The takeover's ACQUIRE ends the superseded term's open transactions.
    let (_, new_token) = take_over(&s, "b").await;
    let taken_over = acquired.elapsed();
    assert!(
        taken_over < ttl + Duration::from_millis(500),
        "taken over {taken_over:?} after the acquire, TTL {ttl:?}"
    );
    // The new leader's claim skips locked rows; once the frozen session is
    // ended, all 100 are claimable.
    assert_eq!(
        claim_all(&s, new_token).await,
        100,
        "the frozen claimer's rows stayed locked"
    );
    assert!(tx.commit().await.is_err(), "the frozen session was ended");
}

/// A claimer frozen inside its fenced transaction when its role is paused:
/// the pause ends it, so after the unpause the next term (not a takeover:
/// the pause ended the term) claims every row.
#[tokio::test]
async fn a_pause_frees_the_rows_of_a_claimer_frozen_in_the_paused_term() {
    let s = setup().await;
    let t = term_of(&s, Duration::from_secs(30)).await;
    let mut frozen = connect(&s.db).await.unwrap();
    let tx = frozen.transaction().await.unwrap();
    freeze_ten(&tx, "billing", t.0).await;
    let store = s.manager.store();
    assert!(store.pause(&billing(), "ops", "frozen claimer").await.unwrap());
    assert!(store.unpause(&billing()).await.unwrap());
    // The paused term's holder is done (else the next term waits for its lease).
    assert!(!store
        .release(&billing(), t, ticklease::Release::Lost, Duration::from_millis(1))
        .await
        .unwrap());
    let next = term_of(&s, Duration::from_secs(30)).await;
    assert_eq!(
        claim_all(&s, next).await,
        100,
        "the frozen claimer's rows stayed locked"
    );
    assert!(tx.commit().await.is_err(), "the frozen session was ended");
}

/// The batched ACQUIRE (families) ends the open transactions of the terms it
/// takes over, as the one-row ACQUIRE does.
#[tokio::test]
async fn a_batched_takeover_ends_the_taken_over_terms_open_claims() {
    let s = setup().await;
    let token: i64 = ticklease_testkit::scalar(
        &s.client,
        "SELECT holder_token FROM leader_acquire_many(ARRAY['fam:k1'], 'a', 300, 1, NULL, 1)",
    )
    .await;
    let mut frozen = connect(&s.db).await.unwrap();
    let tx = frozen.transaction().await.unwrap();
    freeze_ten(&tx, "fam:k1", token).await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    let taken: i64 = ticklease_testkit::scalar(
        &s.client,
        "SELECT count(holder_token) FROM leader_acquire_many(ARRAY['fam:k1', 'fam:k2'], 'b', 30000, 1, NULL, 2)",
    )
    .await;
    assert_eq!(taken, 2);
    let err = tx
        .commit()
        .await
        .expect_err("the taken-over term's claim must not commit");
    assert!(
        err.is_closed() || err.code() == Some(&SqlState::ADMIN_SHUTDOWN),
        "ended, not refused at COMMIT: {err:?}"
    );
}

/// From the review of the automatic sweep: it counted an expired term as
/// over, but no one had taken it over and its RENEW still extends it; its
/// claim was ended. Only a newer token, a release or a pause end a term.
#[tokio::test]
async fn a_sweep_spares_an_expired_term_that_no_one_took_over() {
    let s = setup().await;
    let t = term_of(&s, Duration::from_millis(300)).await;
    let mut claimer = connect(&s.db).await.unwrap();
    let tx = claimer.transaction().await.unwrap();
    assert_eq!(
        tx.execute_typed(
            "UPDATE jobs SET claimed_by = $2 WHERE id = 1 AND (SELECT leader_fence($1, $2))",
            &[(&"billing", Type::TEXT), (&t.0, Type::INT8)],
        )
        .await
        .unwrap(),
        1
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let sweeper = connect(&ticklease_testkit::direct(&s.db)).await.unwrap();
    let ended: i32 = ticklease_testkit::scalar(&sweeper, "SELECT leader_fence_sweep(ARRAY['billing'])").await;
    assert_eq!(ended, 0, "an expired term no one took over is not over");
    let renewed = s
        .manager
        .store()
        .renew(&billing(), t, Duration::from_secs(30))
        .await
        .unwrap();
    assert!(matches!(renewed, Renew::Renewed { .. }), "{renewed:?}");
    tx.commit().await.expect("the renewed term's claim commits");
}

/// From the review of the automatic sweep: it paired every advisory lock of
/// the cluster with every other before looking at the roles' hashes, so a
/// login holding thousands of locks made every takeover's ACQUIRE run for
/// seconds, past its statement timeout.
#[tokio::test]
async fn thousands_of_advisory_locks_of_another_login_slow_no_takeover() {
    let s = setup().await;
    term_of(&s, Duration::from_millis(300)).await;
    let hog = connect(&ticklease_testkit::direct(&s.db)).await.unwrap();
    hog.batch_execute(
        "SELECT count(pg_advisory_lock(leader_role_hash('billing', 1), g)) FROM generate_series(1, 3000) g;
         SELECT count(pg_advisory_lock(7, g)) FROM generate_series(1, 3000) g",
    )
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(400)).await;
    let started = Instant::now();
    take_over(&s, "b").await;
    let took = started.elapsed();
    assert!(took < Duration::from_secs(1), "the takeover took {took:?}");
}

/// A claim statement that runs on past its term (here it sleeps after the
/// fence passed) does not hold the takeover back, and does not commit.
#[tokio::test]
async fn a_claimer_stuck_in_a_long_statement_delays_no_takeover_and_claims_nothing() {
    let s = setup().await;
    let ttl = Duration::from_millis(600);
    let acquired = Instant::now();
    let t = term_of(&s, ttl).await;
    let stuck = connect(&s.db).await.unwrap();
    let claim = tokio::spawn(async move {
        stuck
            .query_typed(
                "UPDATE jobs SET claimed_by = $2 WHERE id = 1 AND (SELECT leader_fence($1, $2))
                    AND pg_sleep(1.5) IS NOT NULL RETURNING id",
                &[(&"billing", Type::TEXT), (&t.0, Type::INT8)],
            )
            .await
    });
    take_over(&s, "b").await;
    let taken_over = acquired.elapsed();
    assert!(
        taken_over < ttl + Duration::from_millis(500),
        "taken over after {taken_over:?}"
    );
    assert_rolled_back(claim.await.unwrap());
    assert_eq!(unclaimed(&s.client).await, 100);
}

/// Overlapping fenced transactions, back to back: pause returns promptly, and
/// no claim whose COMMIT was sent after pause returned commits.
#[tokio::test]
async fn pause_under_a_stream_of_overlapping_claims_returns_within_a_second() {
    let s = setup().await;
    s.client
        .batch_execute("CREATE TABLE claims (token bigint, claimer int)")
        .await
        .unwrap();
    let t = term_of(&s, Duration::from_secs(30)).await;
    let paused_at: Arc<OnceLock<Instant>> = Arc::default();
    let stop = CancellationToken::new();
    let mut claimers = Vec::new();
    for claimer in 0..4i32 {
        let (db, paused_at, stop) = (s.db.clone(), paused_at.clone(), stop.clone());
        claimers.push(tokio::spawn(async move {
            let mut client = connect(&db).await.unwrap();
            let (mut committed, mut late) = (0, 0);
            while !stop.is_cancelled() {
                // The pause ends sessions inside the paused term's claims (its sweep).
                let Ok(tx) = client.transaction().await else { break };
                let Ok(claimed) = tx
                    .execute_typed(
                        "INSERT INTO claims SELECT $2, $3 WHERE (SELECT leader_fence($1, $2))",
                        &[
                            (&"billing", Type::TEXT),
                            (&t.0, Type::INT8),
                            (&claimer, Type::INT4),
                        ],
                    )
                    .await
                else {
                    break;
                };
                tokio::time::sleep(Duration::from_millis(20 + 5 * claimer as u64)).await;
                let commit_sent = Instant::now();
                if tx.commit().await.is_ok() && claimed == 1 {
                    committed += 1;
                    if paused_at.get().is_some_and(|p| commit_sent > *p) {
                        late += 1;
                    }
                }
            }
            (committed, late)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let started = Instant::now();
    assert!(s.manager.store().pause(&billing(), "ops", "drill").await.unwrap());
    let took = started.elapsed();
    paused_at.set(Instant::now()).unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.cancel();
    let mut committed = 0;
    for c in claimers {
        let (c, late) = c.await.unwrap();
        assert_eq!(late, 0, "a claim committed after pause returned");
        committed += c;
    }
    assert!(committed >= 8, "the stream ran: {committed} claims");
    assert!(took < Duration::from_secs(1), "pause took {took:?}");
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

/// SET CONSTRAINTS ... IMMEDIATE, before or after the fence, would fire the
/// commit check early and skip it at COMMIT: refused either way.
#[tokio::test]
async fn set_constraints_immediate_cannot_skip_the_commit_check() {
    let s = setup().await;
    let t = term_of(&s, Duration::from_secs(30)).await;
    let fenced = format!(
        "UPDATE jobs SET claimed_by = {t} WHERE id = 1 AND (SELECT leader_fence('billing', {t}))",
        t = t.0
    );
    for sql in [
        format!("BEGIN; SET CONSTRAINTS ALL IMMEDIATE; {fenced}; COMMIT"),
        format!("BEGIN; {fenced}; SET CONSTRAINTS ALL IMMEDIATE; COMMIT"),
        format!("BEGIN; {fenced}; SET CONSTRAINTS leader_fence_commit IMMEDIATE; COMMIT"),
    ] {
        let err = s.client.batch_execute(&sql).await.expect_err(&sql);
        assert_eq!(
            err.code(),
            Some(&SqlState::FEATURE_NOT_SUPPORTED),
            "{sql}: {err:?}"
        );
        s.client.batch_execute("ROLLBACK").await.unwrap();
    }
    assert_eq!(unclaimed(&s.client).await, 100);
}

/// A COMMIT whose check waits for a pause in progress: when the pause
/// commits, the check reads the row again and fails (a non-key update is not
/// re-checked by the row lock itself). The claimer's fence could not take
/// its term's locks (another session held them), so the pause's sweep does
/// not see it and the commit check alone stands.
#[tokio::test]
async fn a_commit_check_waiting_for_a_pause_fails_once_the_pause_commits() {
    let s = setup().await;
    let t = term_of(&s, Duration::from_secs(30)).await;
    let mut claimer = connect(&s.db).await.unwrap();
    let mut operator = connect(&ticklease_testkit::direct(&s.db)).await.unwrap();
    let observer = connect(&ticklease_testkit::direct(&s.db)).await.unwrap();
    let squatter = connect(&ticklease_testkit::direct(&s.db)).await.unwrap();
    squatter
        .batch_execute(&format!(
            "SELECT pg_advisory_lock(leader_role_hash('billing', n), leader_token_low({}))
               FROM generate_series(1, 2) AS n",
            t.0
        ))
        .await
        .unwrap();
    let claim = claimer.transaction().await.unwrap();
    let claimed = claim
        .execute_typed(
            "UPDATE jobs SET claimed_by = $2 WHERE id = 1 AND (SELECT leader_fence($1, $2))",
            &[(&"billing", Type::TEXT), (&t.0, Type::INT8)],
        )
        .await
        .unwrap();
    assert_eq!(claimed, 1);
    let pause = operator.transaction().await.unwrap();
    pause
        .batch_execute("SELECT leader_pause('billing', 'ops', 'race')")
        .await
        .unwrap();
    let let_the_pause_commit = async {
        let waiting = "SELECT count(*) FROM pg_stat_activity
                        WHERE datname = current_database() AND wait_event_type = 'Lock'";
        let deadline = Instant::now() + Duration::from_secs(10);
        while ticklease_testkit::scalar::<i64>(&observer, waiting).await == 0 {
            assert!(Instant::now() < deadline, "the commit check waits for the pause");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        pause.commit().await.unwrap();
    };
    let (commit, ()) = tokio::join!(claim.commit(), let_the_pause_commit);
    let err = commit.expect_err("the claim committed after the pause");
    assert_eq!(err.code(), Some(&SqlState::T_R_SERIALIZATION_FAILURE), "{err:?}");
    assert_eq!(unclaimed(&s.client).await, 100);
}

/// Runs `statements` one by one in a transaction of `client` after a claim
/// of job 1 fenced by `t`; returns the first error (or the COMMIT's).
async fn fenced_then(
    client: &mut Client,
    t: Token,
    statements: &[&str],
) -> Result<(), tokio_postgres::Error> {
    let tx = client.transaction().await.unwrap();
    let claimed = tx
        .execute_typed(
            "UPDATE jobs SET claimed_by = $2 WHERE id = 1 AND (SELECT leader_fence($1, $2))",
            &[(&"billing", Type::TEXT), (&t.0, Type::INT8)],
        )
        .await
        .unwrap();
    assert_eq!(claimed, 1, "the live term claims");
    for sql in statements {
        tx.batch_execute(sql).await?;
    }
    tx.commit().await
}

/// Item 4 of issue 22: the commit check inferred "at COMMIT" from the query
/// text, so SET CONSTRAINTS from a function, or behind a comment, fired it
/// early: it passed, and the claim could commit long after its term ended.
/// Now every shape that fires it early is refused, decided without text.
#[tokio::test]
async fn set_constraints_immediate_from_a_function_or_behind_a_comment_cannot_fire_the_check_early() {
    let s = setup().await;
    let t = term_of(&s, Duration::from_secs(30)).await;
    s.client
        .batch_execute(
            "CREATE FUNCTION app_check_constraints() RETURNS void LANGUAGE plpgsql AS $$
             BEGIN SET CONSTRAINTS ALL IMMEDIATE; SET CONSTRAINTS ALL DEFERRED; END $$;",
        )
        .await
        .unwrap();
    let mut claimer = connect(&s.db).await.unwrap();
    for shape in [
        "SELECT app_check_constraints()",
        "SET/**/CONSTRAINTS ALL IMMEDIATE",
        "SET CONSTRAINTS ALL IMMEDIATE",
        "DO $$ BEGIN SET CONSTRAINTS leader_fence_commit IMMEDIATE; END $$",
    ] {
        let err = fenced_then(&mut claimer, t, &[shape]).await.expect_err(shape);
        assert_eq!(
            err.code(),
            Some(&SqlState::FEATURE_NOT_SUPPORTED),
            "{shape}: {err:?}"
        );
    }
    assert_eq!(unclaimed(&s.client).await, 100, "nothing committed");
}

/// A fenced transaction cannot be prepared (its check would hold the lease
/// row's lock until COMMIT PREPARED, and delay every pause and takeover).
#[tokio::test]
async fn a_fenced_transaction_cannot_be_prepared() {
    let s = setup().await;
    let t = term_of(&s, Duration::from_secs(30)).await;
    let mut claimer = connect(&s.db).await.unwrap();
    let gid = format!("fenced_{}", t.0);
    let prepare = format!("PREPARE/**/TRANSACTION '{gid}'");
    let err = fenced_then(&mut claimer, t, &[&prepare]).await;
    let prepared: i64 = ticklease_testkit::scalar(
        &s.client,
        &format!("SELECT count(*) FROM pg_prepared_xacts WHERE gid = '{gid}'"),
    )
    .await;
    if prepared > 0 {
        s.client
            .batch_execute(&format!("ROLLBACK PREPARED '{gid}'"))
            .await
            .unwrap();
    }
    assert_eq!(prepared, 0, "the fenced transaction was prepared");
    let err = err.expect_err("PREPARE of a fenced transaction");
    assert_eq!(err.code(), Some(&SqlState::FEATURE_NOT_SUPPORTED), "{err:?}");
    assert_eq!(unclaimed(&s.client).await, 100);
}

/// The words in a comment or a literal are not a shape: such a claim commits,
/// also when its COMMIT comes in the same simple-protocol message.
#[tokio::test]
async fn a_claim_whose_text_mentions_set_constraints_or_prepare_transaction_commits() {
    let s = setup().await;
    let t = term_of(&s, Duration::from_secs(30)).await;
    let claimer = connect(&s.db).await.unwrap();
    claimer
        .batch_execute(&format!(
            "BEGIN;
             /* never SET CONSTRAINTS ALL IMMEDIATE, never PREPARE TRANSACTION */
             UPDATE jobs SET claimed_by = {t} WHERE id = 1 AND 'prepare transaction' <> ''
                AND (SELECT leader_fence('billing', {t}));
             COMMIT",
            t = t.0
        ))
        .await
        .expect("an innocent claim commits");
    assert_eq!(unclaimed(&s.client).await, 99);
}

/// Savepoints, a fence inside a function and two roles in one transaction:
/// the check runs at COMMIT for each term, and fails when any of them ended.
#[tokio::test]
async fn savepoints_functions_and_two_fenced_roles_are_checked_at_commit() {
    let s = setup().await;
    let t = term_of(&s, Duration::from_secs(30)).await;
    let store = s.manager.store();
    let mut claimer = connect(&s.db).await.unwrap();
    // An early firing, refused and rolled back to a savepoint, is undone:
    // the check runs again at COMMIT.
    let rolled_back = fenced_then(
        &mut claimer,
        t,
        &["SAVEPOINT s",
          "DO $$ BEGIN SET CONSTRAINTS ALL IMMEDIATE; EXCEPTION WHEN feature_not_supported THEN NULL; END $$",
          "ROLLBACK TO SAVEPOINT s"],
    );
    rolled_back.await.expect("the live term's claim commits");
    assert_eq!(unclaimed(&s.client).await, 99);
    s.client
        .batch_execute("UPDATE jobs SET claimed_by = NULL")
        .await
        .unwrap();
    // A fence inside a function: checked at COMMIT like any other.
    s.client
        .batch_execute(
            "CREATE FUNCTION app_claim(p_role text, p_token bigint) RETURNS bigint LANGUAGE plpgsql AS $$
             DECLARE n bigint;
             BEGIN
                 UPDATE jobs SET claimed_by = p_token WHERE id = 2 AND (SELECT leader_fence(p_role, p_token));
                 GET DIAGNOSTICS n = ROW_COUNT;
                 RETURN n;
             END $$;",
        )
        .await
        .unwrap();
    let dunning = Role::new("dunning").unwrap();
    let Acquire::Acquired(d) = store
        .acquire(&dunning, "a", Duration::from_secs(30), Duration::from_millis(1))
        .await
        .unwrap()
    else {
        panic!("dunning")
    };
    let tx = claimer.transaction().await.unwrap();
    let n: i64 = tx
        .query_one("SELECT app_claim('billing', $1)", &[&t.0])
        .await
        .unwrap()
        .get(0);
    assert_eq!(n, 1);
    let both = tx
        .execute_typed(
            "UPDATE jobs SET claimed_by = $2 WHERE id = 3 AND (SELECT leader_fence($1, $2))",
            &[(&"dunning", Type::TEXT), (&d.token.0, Type::INT8)],
        )
        .await
        .unwrap();
    assert_eq!(both, 1, "two roles fenced in one transaction");
    assert!(store.pause(&dunning, "ops", "one of two").await.unwrap());
    assert_rolled_back(tx.commit().await);
    assert_eq!(unclaimed(&s.client).await, 100);
}

/// Item 5 of issue 22: the fence lowered the transaction's idle limit to the
/// term's remaining time at the fence, and renewals never raised it, so a
/// live term's slow transaction was cut. A fenced transaction idle for three
/// TTLs while its term is renewed now commits.
#[tokio::test]
async fn a_renewed_terms_transaction_idle_for_three_ttls_commits() {
    let s = setup().await;
    let config = test_config();
    let db = s.db.clone();
    let lead = s
        .manager
        .lead(&billing(), Duration::from_millis(1), |tick| async move {
            let mut claimer = connect(&db).await.unwrap();
            let tx = claimer.transaction().await.unwrap();
            let claimed = tx
                .execute_typed(
                    "UPDATE jobs SET claimed_by = $2 WHERE id <= 10 AND (SELECT leader_fence($1, $2))",
                    &[(&"billing", Type::TEXT), (&tick.token().0, Type::INT8)],
                )
                .await
                .unwrap();
            assert_eq!(claimed, 10);
            // A slow publish: the transaction idles while the heartbeat renews.
            tokio::time::sleep(config.lease_ttl() * 3).await;
            tx.commit().await
        })
        .await
        .unwrap();
    match lead {
        Lead::Completed { .. } => {}
        other => panic!("the live term's transaction must commit: {other:?}"),
    }
    assert_eq!(unclaimed(&s.client).await, 90);
}

/// The takeover's ACQUIRE ends the earlier term's open claim; a sweep asked
/// for by anyone afterwards ends nothing of the live term: the terms it
/// ends are read from the lease row, not from its caller.
#[tokio::test]
async fn a_sweep_ends_the_taken_over_terms_claims_and_spares_the_live_terms() {
    let s = setup().await;
    let early = term_of(&s, Duration::from_millis(300)).await;
    let mut earlier = connect(&s.db).await.unwrap();
    let old_claim = earlier.transaction().await.unwrap();
    assert_eq!(
        old_claim
            .execute_typed(
                "UPDATE jobs SET claimed_by = $2 WHERE id = 1 AND (SELECT leader_fence($1, $2))",
                &[(&"billing", Type::TEXT), (&early.0, Type::INT8)],
            )
            .await
            .unwrap(),
        1
    );
    tokio::time::sleep(Duration::from_millis(400)).await;
    let late: Option<i64> = ticklease_testkit::scalar(
        &s.client,
        "SELECT holder_token FROM leader_acquire('billing', 'b', 30000, 1, NULL)",
    )
    .await;
    let late = late.expect("the expired term is taken over in SQL");
    assert_rolled_back(old_claim.commit().await);
    let mut later = connect(&s.db).await.unwrap();
    let new_claim = later.transaction().await.unwrap();
    assert_eq!(
        new_claim
            .execute_typed(
                "UPDATE jobs SET claimed_by = $2 WHERE id = 2 AND (SELECT leader_fence($1, $2))",
                &[(&"billing", Type::TEXT), (&late, Type::INT8)],
            )
            .await
            .unwrap(),
        1
    );
    // Asked for again (on a direct connection: through a pool of 2 the two
    // claims held both).
    let sweeper = connect(&ticklease_testkit::direct(&s.db)).await.unwrap();
    let ended: i32 = ticklease_testkit::scalar(&sweeper, "SELECT leader_fence_sweep(ARRAY['billing'])").await;
    assert_eq!(ended, 0, "the live term's claim is spared");
    new_claim.commit().await.expect("the live term's claim commits");
    assert_eq!(unclaimed(&s.client).await, 99);
}

/// From the review of issue 22's change: the fence's term locks are visible
/// in pg_locks, and a login with CONNECT alone could queue an exclusive lock
/// on one, after which every later fence of the live term waited. The fence
/// only tries its locks.
#[tokio::test]
async fn a_login_that_locks_a_terms_fence_key_stalls_no_claim() {
    let s = setup().await;
    let t = term_of(&s, Duration::from_secs(30)).await;
    let owner = connect(&ticklease_testkit::direct(&s.db)).await.unwrap();
    owner
        .batch_execute("CREATE ROLE squatter_fence LOGIN")
        .await
        .or_else(|e| {
            if e.code() == Some(&SqlState::DUPLICATE_OBJECT) {
                Ok(())
            } else {
                Err(e)
            }
        })
        .unwrap();
    let mut as_squatter = ticklease_testkit::direct(&s.db);
    as_squatter.user("squatter_fence");
    let squatter = connect(&as_squatter).await.unwrap();
    let mut claimer = connect(&s.db).await.unwrap();
    let first = claimer.transaction().await.unwrap();
    assert_eq!(
        first
            .execute_typed(
                "UPDATE jobs SET claimed_by = $2 WHERE id = 1 AND (SELECT leader_fence($1, $2))",
                &[(&"billing", Type::TEXT), (&t.0, Type::INT8)],
            )
            .await
            .unwrap(),
        1
    );
    let squat = tokio::spawn(async move {
        squatter
            .batch_execute(
                "SELECT pg_advisory_lock(((classid::bigint # 2147483648) - 2147483648)::int,
                                         ((objid::bigint # 2147483648) - 2147483648)::int)
                   FROM pg_locks
                  WHERE locktype = 'advisory' AND objsubid = 2 AND granted
                    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                  LIMIT 1",
            )
            .await
            .map(|()| squatter)
    });
    // This database's locks only: the shared cluster runs other tests' fences.
    let queued = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND NOT granted
                    AND database = (SELECT oid FROM pg_database WHERE datname = current_database())";
    let deadline = Instant::now() + Duration::from_secs(10);
    while ticklease_testkit::scalar::<i64>(&owner, queued).await == 0 {
        assert!(Instant::now() < deadline, "the squatter queues for the fence key");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    first.commit().await.unwrap();
    let _squatter = squat.await.unwrap().unwrap();
    let started = Instant::now();
    let next = tokio::time::timeout(
        Duration::from_secs(2),
        claimer.execute_typed(
            "UPDATE jobs SET claimed_by = $2 WHERE id = 2 AND (SELECT leader_fence($1, $2))",
            &[(&"billing", Type::TEXT), (&t.0, Type::INT8)],
        ),
    )
    .await
    .expect("a live term's claim waited on a squatted fence key")
    .unwrap();
    assert_eq!(next, 1);
    assert!(started.elapsed() < Duration::from_secs(1));
}

/// From the review: the sweep found a term's transactions by one 32-bit
/// hash of the role, so another role whose hash collided had its live
/// transactions ended. The fence's locks carry two hashes now.
#[tokio::test]
async fn a_sweep_ends_no_transaction_of_a_role_whose_hash_collides() {
    let s = setup().await;
    let pair: (String, String) = {
        let row = s
            .client
            .query_one(
                "SELECT min(r), max(r) FROM (SELECT 'job_' || g AS r FROM generate_series(1, 400000) g) n
                  GROUP BY leader_role_hash(r, 1) HAVING count(*) > 1 LIMIT 1",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    let (a, b) = pair;
    let store = s.manager.store();
    let ttl = Duration::from_secs(30);
    let Acquire::Acquired(term_a) = store
        .acquire(&Role::new(&a).unwrap(), "x", ttl, Duration::from_millis(1))
        .await
        .unwrap()
    else {
        panic!("{a}")
    };
    let mut claimer = connect(&s.db).await.unwrap();
    let tx = claimer.transaction().await.unwrap();
    assert_eq!(
        tx.execute_typed(
            "UPDATE jobs SET claimed_by = $2 WHERE id = 1 AND (SELECT leader_fence($1, $2))",
            &[(&a.as_str(), Type::TEXT), (&term_a.token.0, Type::INT8)],
        )
        .await
        .unwrap(),
        1
    );
    tokio::time::sleep(Duration::from_millis(5)).await;
    let later: i64 = ticklease_testkit::scalar(
        &s.client,
        &format!("SELECT holder_token FROM leader_acquire('{b}', 'y', 30000, 1, NULL)"),
    )
    .await;
    // So a's live term looks earlier than b's, as a sweep of b reads it.
    assert!(later > term_a.token.0);
    let sweeper = connect(&ticklease_testkit::direct(&s.db)).await.unwrap();
    let ended: i32 =
        ticklease_testkit::scalar(&sweeper, &format!("SELECT leader_fence_sweep(ARRAY['{b}'])")).await;
    assert_eq!(
        ended, 0,
        "{a} and {b} share a hash; {a}'s live claim must survive {b}'s sweep"
    );
    tx.commit().await.expect("the live term's claim commits");
}
