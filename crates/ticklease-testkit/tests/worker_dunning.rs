//! The dunning state machine against real Postgres: an attempt without a
//! definitive answer stays in flight and is retried under its key; only a
//! settled decline opens a new key; migration 0002 upgrades a live database.

use std::panic::AssertUnwindSafe;
use std::time::Duration;

use futures::FutureExt;
use ticklease::migrate::MigrationSet;
use ticklease_testkit::{connect, direct, migrated_db, scalar, PgCluster};
use ticklease_worker::dunning::{self, Attempt, Charge, Run};
use ticklease_worker::WorkerError;
use tokio_postgres::Client;

const ONE_RUN: &str = "
INSERT INTO subscriptions (period_start, next_billing_at, amount_cents, customer_email)
  VALUES (now(), now() + interval '1 hour', 700, 'c@example.test');
INSERT INTO invoices (subscription_id, period_start, amount_cents) SELECT id, period_start, 700 FROM subscriptions;
INSERT INTO dunning_runs (invoice_id, max_attempts) SELECT id, 2 FROM invoices;";

async fn one_run() -> Client {
    let db = migrated_db(PgCluster::shared()).await;
    let mut owner = connect(&direct(&db)).await.unwrap();
    ticklease_worker::migrate(&mut owner).await.unwrap();
    owner.batch_execute(ONE_RUN).await.unwrap();
    connect(&db).await.unwrap()
}

/// The run as the dunning funnel lists it.
async fn listed(c: &Client) -> Run {
    let r = &c
        .query_typed(
            "SELECT id, invoice_id, attempt_count, max_attempts, inflight_key FROM dunning_runs",
            &[],
        )
        .await
        .unwrap()[0];
    Run {
        id: r.get(0),
        invoice_id: r.get(1),
        attempt_count: r.get(2),
        max_attempts: r.get(3),
        amount_cents: 700,
        inflight_key: r.get(4),
    }
}

/// Charges under `key` after checking it is `expected`, answering `answer`.
async fn answer(key: String, expected: &str, answer: Charge) -> Result<Charge, WorkerError> {
    assert_eq!(key, expected, "charged under another key");
    Ok(answer)
}

#[tokio::test]
async fn a_charge_without_a_definitive_answer_stays_in_flight_and_the_next_tick_retries_its_key() {
    let c = one_run().await;
    let run = listed(&c).await;
    let first = dunning::idempotency_key(run.id, 1);

    let outcome = dunning::attempt(&c, &run, Duration::ZERO, |key| async move {
        Err(WorkerError::Provider { status: 503, key })
    })
    .await
    .unwrap();
    assert_eq!(outcome, Attempt::Unknown);
    let run = listed(&c).await;
    assert_eq!(run.inflight_key.as_deref(), Some(first.as_str()));
    assert_eq!(run.attempt_count, 1);
    assert!(
        scalar::<bool>(&c, "SELECT inflight_started_at IS NOT NULL FROM dunning_runs").await,
        "the start time is recorded with the key"
    );

    // A panic after the request may have reached the provider: still in flight.
    let panicked = AssertUnwindSafe(dunning::attempt(&c, &run, Duration::ZERO, |_| async {
        panic!("nil provider client") as Result<Charge, _>
    }))
    .catch_unwind()
    .await;
    assert!(panicked.is_err());
    assert_eq!(listed(&c).await, run, "a panic leaves the attempt in flight");

    let outcome = dunning::attempt(&c, &run, Duration::ZERO, |key| {
        answer(key, &first, Charge::Succeeded)
    })
    .await
    .unwrap();
    assert_eq!(outcome, Attempt::Paid);
    assert_eq!(
        scalar::<String>(
            &c,
            "SELECT state || ' ' || attempt_count || ' ' || (inflight_key IS NULL) FROM dunning_runs"
        )
        .await,
        "paid 1 true",
        "settled on the first attempt, nothing left in flight"
    );
}

#[tokio::test]
async fn a_tick_dropped_mid_charge_leaves_the_attempt_in_flight_under_its_key() {
    let c = one_run().await;
    let run = listed(&c).await;
    let (sent, charging) = tokio::sync::oneshot::channel();
    let tick = dunning::attempt(&c, &run, Duration::ZERO, |_| async move {
        sent.send(()).unwrap();
        std::future::pending::<Result<Charge, WorkerError>>().await
    });
    // Lease loss or a shutdown abort drops the tick while the charge is out.
    tokio::select! {
        _ = tick => panic!("the charge never answers"),
        _ = charging => {}
    }
    let run = listed(&c).await;
    let first = dunning::idempotency_key(run.id, 1);
    assert_eq!(run.inflight_key.as_deref(), Some(first.as_str()));

    let outcome = dunning::attempt(&c, &run, Duration::ZERO, |key| {
        answer(key, &first, Charge::Succeeded)
    })
    .await
    .unwrap();
    assert_eq!(outcome, Attempt::Paid);
    assert_eq!(
        scalar::<i32>(&c, "SELECT attempt_count FROM dunning_runs").await,
        1,
        "the dropped attempt spent no attempt"
    );
}

#[tokio::test]
async fn only_a_settled_decline_opens_a_new_key_and_spends_an_attempt() {
    let c = one_run().await;
    let run = listed(&c).await;
    let (first, second) = (
        dunning::idempotency_key(run.id, 1),
        dunning::idempotency_key(run.id, 2),
    );

    let outcome = dunning::attempt(&c, &run, Duration::ZERO, |key| {
        answer(key, &first, Charge::Declined)
    })
    .await
    .unwrap();
    assert_eq!(outcome, Attempt::Declined { exhausted: false });
    let stale = run.clone();
    let run = listed(&c).await;
    assert_eq!((run.attempt_count, run.inflight_key.as_deref()), (1, None));

    // A tick that listed the run before the decline settled finds nothing to record.
    let outcome = dunning::attempt(&c, &stale, Duration::ZERO, |_| async {
        panic!("a stale listing must not charge") as Result<Charge, _>
    })
    .await
    .unwrap();
    assert_eq!(outcome, Attempt::Stale);

    let outcome = dunning::attempt(&c, &run, Duration::ZERO, |key| {
        answer(key, &second, Charge::Declined)
    })
    .await
    .unwrap();
    assert_eq!(outcome, Attempt::Declined { exhausted: true });
    assert_eq!(
        scalar::<String>(&c, "SELECT state FROM dunning_runs").await,
        "exhausted"
    );
}

#[tokio::test]
async fn a_late_answer_under_a_settled_key_settles_nothing() {
    let c = one_run().await;
    let run = listed(&c).await;
    let first = dunning::idempotency_key(run.id, 1);
    dunning::attempt(&c, &run, Duration::ZERO, |key| async move {
        Err(WorkerError::Provider { status: 503, key })
    })
    .await
    .unwrap();
    let in_flight = listed(&c).await;
    dunning::attempt(&c, &in_flight, Duration::ZERO, |key| {
        answer(key, &first, Charge::Declined)
    })
    .await
    .unwrap();
    let opened = listed(&c).await;
    dunning::attempt(&c, &opened, Duration::ZERO, |key| async move {
        Err(WorkerError::Provider { status: 503, key })
    })
    .await
    .unwrap();

    // A superseded tick still holding the first key hears the provider's
    // replayed decline: the second attempt in flight is untouched.
    let outcome = dunning::attempt(&c, &in_flight, Duration::ZERO, |key| {
        answer(key, &first, Charge::Declined)
    })
    .await
    .unwrap();
    assert_eq!(outcome, Attempt::Stale);
    assert_eq!(
        listed(&c).await.inflight_key,
        Some(dunning::idempotency_key(run.id, 2))
    );
}

#[tokio::test]
async fn migration_two_upgrades_a_live_version_one_database_in_place() {
    let db = migrated_db(PgCluster::shared()).await;
    let mut owner = connect(&direct(&db)).await.unwrap();
    let schema = ticklease_worker::SCHEMA;
    let v1 = MigrationSet {
        migrations: &schema.migrations[..1],
        ..schema
    };
    v1.apply(&mut owner, "").await.unwrap();
    owner.batch_execute(ONE_RUN).await.unwrap();
    owner
        .batch_execute("UPDATE dunning_runs SET attempt_count = 1, last_outcome = 'declined'")
        .await
        .unwrap();

    let report = ticklease_worker::migrate(&mut owner).await.unwrap();
    assert_eq!((report.already_applied, report.applied), (vec![1], vec![2]));
    let c = connect(&db).await.unwrap();
    let run = listed(&c).await;
    assert_eq!((run.attempt_count, run.inflight_key.as_deref()), (1, None));
    let second = dunning::idempotency_key(run.id, 2);
    let outcome = dunning::attempt(&c, &run, Duration::ZERO, |key| {
        answer(key, &second, Charge::Succeeded)
    })
    .await
    .unwrap();
    assert_eq!(outcome, Attempt::Paid);
    let half = c
        .batch_execute("UPDATE dunning_runs SET inflight_key = 'k'")
        .await;
    assert!(half.is_err(), "a key without its start time is refused");
}
