//! The fence on a real claim table. Each conjunct of the fence is shown to
//! matter: the same claim against a copy of the function with that conjunct
//! removed succeeds where the real one claims nothing (a mutation check that
//! runs on every test run).

use std::convert::Infallible;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use tokio::time::Instant;
use tokio_postgres::error::SqlState;
use tokio_util::sync::CancellationToken;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

use ticklease::{Acquire, Fence, Lead, LeaseStore, Manager, PgStore, PgStoreOptions, Refusal, Role, Token};
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
    let elapsed = match end {
        EndTerm::Takeover => {
            tokio::time::sleep(ttl).await;
            let (waited, token) = take_over(s, "b").await;
            assert!(token > t);
            waited
        }
        EndTerm::Pause => {
            let started = Instant::now();
            assert!(s.manager.store().pause(&billing(), "ops", "drill").await.unwrap());
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
/// server had already ended the session for idling in the transaction past
/// its term.
fn assert_rolled_back(commit: Result<(), tokio_postgres::Error>) {
    let err = commit.expect_err("the claim must not commit after its term ended");
    assert!(
        err.code() == Some(&SqlState::T_R_SERIALIZATION_FAILURE) || err.is_closed(),
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
    let err = commit.expect_err("a claim of a paused term must not commit");
    assert_eq!(err.code(), Some(&SqlState::T_R_SERIALIZATION_FAILURE), "{err:?}");
    assert_eq!(unclaimed(&s.client).await, 100);
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
    let sql =
        "UPDATE jobs SET claimed_by = $2 WHERE id IN (SELECT id FROM jobs ORDER BY id LIMIT 10 FOR UPDATE)
                 AND (SELECT leader_fence($1, $2)) RETURNING id";
    let params = [
        (&"billing" as &(dyn ToSql + Sync), Type::TEXT),
        (&t.0, Type::INT8),
    ];
    assert_eq!(tx.query_typed(sql, &params).await.unwrap().len(), 10);

    let (_, new_token) = take_over(&s, "b").await;
    let taken_over = acquired.elapsed();
    assert!(
        taken_over < ttl + Duration::from_millis(500),
        "taken over {taken_over:?} after the acquire, TTL {ttl:?}"
    );
    // The new leader's claim skips locked rows; once the frozen session is
    // ended (idle timeout = the term's remaining time), all 100 are claimable.
    let deadline = Instant::now() + ttl + Duration::from_secs(2);
    let mut claimed = 0;
    while claimed < 100 && Instant::now() < deadline {
        let n = claim_with(&s.client, "leader_fence", "billing", new_token).await;
        claimed += n;
        if n == 0 {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    assert_eq!(claimed, 100, "the frozen claimer's rows stayed locked");
    assert!(tx.commit().await.is_err(), "the frozen session was ended");
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
    let err = claim.await.unwrap().expect_err("the stuck claim must not commit");
    assert_eq!(err.code(), Some(&SqlState::T_R_SERIALIZATION_FAILURE), "{err:?}");
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
                let tx = client.transaction().await.unwrap();
                let claimed = tx
                    .execute_typed(
                        "INSERT INTO claims SELECT $2, $3 WHERE (SELECT leader_fence($1, $2))",
                        &[
                            (&"billing", Type::TEXT),
                            (&t.0, Type::INT8),
                            (&claimer, Type::INT4),
                        ],
                    )
                    .await
                    .unwrap();
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
/// re-checked by the row lock itself).
#[tokio::test]
async fn a_commit_check_waiting_for_a_pause_fails_once_the_pause_commits() {
    let s = setup().await;
    let t = term_of(&s, Duration::from_secs(30)).await;
    let mut claimer = connect(&s.db).await.unwrap();
    let mut operator = connect(&ticklease_testkit::direct(&s.db)).await.unwrap();
    let observer = connect(&ticklease_testkit::direct(&s.db)).await.unwrap();
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
        while ticklease_testkit::scalar::<i64>(&observer, waiting).await == 0 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        pause.commit().await.unwrap();
    };
    let (commit, ()) = tokio::join!(claim.commit(), let_the_pause_commit);
    let err = commit.expect_err("the claim committed after the pause");
    assert_eq!(err.code(), Some(&SqlState::T_R_SERIALIZATION_FAILURE), "{err:?}");
    assert_eq!(unclaimed(&s.client).await, 100);
}
