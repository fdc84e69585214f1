//! The completion compare-and-sets under races: racing writers, one winner.

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use ticklease::{Lead, Manager, PgStore, PgStoreOptions, Role};
use ticklease_testkit::{connect, direct, migrated_db, scalar, test_config, PgCluster};
use ticklease_worker::billing::{self, PeriodClose};
use ticklease_worker::dunning::{self, Attempt, Charge};
use ticklease_worker::{delivery, Mark};

const RACERS: usize = 20;

async fn setup(workload: &str) -> tokio_postgres::Config {
    let db = migrated_db(PgCluster::shared()).await;
    let mut owner = connect(&direct(&db)).await.unwrap();
    ticklease_worker::migrate(&mut owner).await.unwrap();
    owner.batch_execute(workload).await.unwrap();
    db
}

#[tokio::test]
async fn twenty_racing_period_writers_make_exactly_one_invoice() {
    let db = setup(
        "INSERT INTO subscriptions (period_start, next_billing_at, amount_cents, customer_email)
         VALUES (now() - interval '1 hour', now() - interval '1 second', 500, 'c@example.test')",
    )
    .await;
    let config = test_config();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let billing_role = Role::new("billing").unwrap();
    let m = Manager::start(store, config, [billing_role.clone()])
        .await
        .unwrap();
    let client = connect(&db).await.unwrap();
    let client = &client;
    let Lead::Completed { value: subs, .. } = m
        .lead(&billing_role, Duration::from_secs(60), |t| async move {
            Ok::<_, Infallible>(billing::due(client, t.fence(), 10, None).await.unwrap())
        })
        .await
        .unwrap()
    else {
        panic!("no tick")
    };
    assert_eq!(subs.len(), 1);
    let racers = (0..RACERS).map(|_| {
        let (db, sub) = (db.clone(), subs[0].clone());
        tokio::spawn(async move {
            let mut c = connect(&db).await.unwrap();
            billing::close_period(&mut c, &sub).await.unwrap()
        })
    });
    let outcomes: Vec<PeriodClose> = futures::future::join_all(racers)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    let won = outcomes
        .iter()
        .filter(|o| matches!(o, PeriodClose::Invoiced { .. }))
        .count();
    assert_eq!(won, 1, "{outcomes:?}");
    assert_eq!(
        outcomes
            .iter()
            .filter(|o| **o == PeriodClose::WatermarkMoved)
            .count(),
        RACERS - 1
    );
    let observer = connect(&db).await.unwrap();
    assert_eq!(scalar::<i64>(&observer, "SELECT count(*) FROM invoices").await, 1);
    assert_eq!(
        scalar::<i64>(
            &observer,
            "SELECT count(*) FROM webhook_events WHERE kind = 'invoice.finalized'"
        )
        .await,
        1
    );
    assert_eq!(
        scalar::<i64>(&observer, "SELECT count(*) FROM dunning_runs").await,
        1
    );
}

#[tokio::test]
async fn twenty_racing_delivery_marks_make_one_and_the_rest_are_stale() {
    let db = setup(
        "INSERT INTO webhook_endpoints (url) VALUES ('http://x/hooks/a');
         INSERT INTO webhook_events (kind, payload) VALUES ('demo', '{}');
         INSERT INTO webhook_deliveries (event_id, endpoint_id) SELECT e.id, p.id FROM webhook_events e, webhook_endpoints p;",
    )
    .await;
    let id: i64 = scalar(&connect(&db).await.unwrap(), "SELECT id FROM webhook_deliveries").await;
    let racers = (0..RACERS).map(|_| {
        let db = db.clone();
        tokio::spawn(async move {
            delivery::mark_delivered(&connect(&db).await.unwrap(), id, 0)
                .await
                .unwrap()
        })
    });
    let marks: Vec<Mark> = futures::future::join_all(racers)
        .await
        .into_iter()
        .map(|r| r.unwrap())
        .collect();
    assert_eq!(
        marks.iter().filter(|m| **m == Mark::Marked).count(),
        1,
        "{marks:?}"
    );
    // A mark from an attempt that moved on is refused too.
    assert_eq!(
        delivery::mark_retry(&connect(&db).await.unwrap(), id, 0, Duration::ZERO, 5)
            .await
            .unwrap(),
        Mark::Stale
    );
}

#[tokio::test]
async fn racing_dunning_attempts_advance_the_count_once_per_attempt_and_charge_once_per_key() {
    let db = setup(
        "INSERT INTO subscriptions (period_start, next_billing_at, amount_cents, customer_email)
           VALUES (now(), now() + interval '1 hour', 700, 'c@example.test');
         INSERT INTO invoices (subscription_id, period_start, amount_cents) SELECT id, period_start, 700 FROM subscriptions;
         INSERT INTO dunning_runs (invoice_id, max_attempts) SELECT id, 3 FROM invoices;",
    )
    .await;
    let observer = connect(&db).await.unwrap();
    let (run_id, invoice_id): (i64, i64) = (
        scalar(&observer, "SELECT id FROM dunning_runs").await,
        scalar(&observer, "SELECT invoice_id FROM dunning_runs").await,
    );
    let charges = Arc::new(AtomicUsize::new(0));
    for attempt in 0..2 {
        let run = dunning::Run {
            id: run_id,
            invoice_id,
            attempt_count: attempt,
            max_attempts: 3,
            amount_cents: 700,
            inflight_key: None,
        };
        let racers = (0..RACERS).map(|_| {
            let (db, run, charges) = (db.clone(), run.clone(), charges.clone());
            tokio::spawn(async move {
                let c = connect(&db).await.unwrap();
                dunning::attempt(&c, &run, Duration::ZERO, |key| async move {
                    assert_eq!(key, dunning::idempotency_key(run_id, attempt + 1));
                    charges.fetch_add(1, Ordering::SeqCst);
                    Ok(Charge::Declined)
                })
                .await
                .unwrap()
            })
        });
        let outcomes: Vec<Attempt> = futures::future::join_all(racers)
            .await
            .into_iter()
            .map(|r| r.unwrap())
            .collect();
        assert_eq!(
            outcomes.iter().filter(|o| **o != Attempt::Stale).count(),
            1,
            "{outcomes:?}"
        );
        assert_eq!(
            scalar::<i32>(&observer, "SELECT attempt_count FROM dunning_runs").await,
            attempt + 1
        );
        assert_eq!(
            charges.load(Ordering::SeqCst),
            attempt as usize + 1,
            "one charge per attempt"
        );
    }
}

/// Billing claims as of its tick's occurrence (the period key): a period due
/// after the occurrence's instant is the next occurrence's, even when this
/// one runs late; without an occurrence (an interval tick, a run-now) it
/// claims what is due now.
#[tokio::test]
async fn billing_as_of_an_occurrence_claims_only_the_periods_due_by_its_instant() {
    let db = setup(
        "INSERT INTO subscriptions (period_start, next_billing_at, amount_cents, customer_email)
         VALUES (now() - interval '1 hour', now() - interval '10 minutes', 500, 'early@example.test'),
                (now() - interval '1 hour', now() - interval '1 minute', 700, 'late@example.test')",
    )
    .await;
    let config = test_config();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let billing_role = Role::new("billing").unwrap();
    let m = Manager::start(store, config, [billing_role.clone()])
        .await
        .unwrap();
    let client = connect(&db).await.unwrap();
    let client = &client;
    let occurrence: std::time::SystemTime = scalar(client, "SELECT now() - interval '5 minutes'").await;
    let Lead::Completed {
        value: (as_of, now), ..
    } = m
        .lead(&billing_role, Duration::from_secs(60), |t| async move {
            let as_of = billing::due(client, t.fence(), 10, Some(occurrence))
                .await
                .unwrap();
            let now = billing::due(client, t.fence(), 10, None).await.unwrap();
            Ok::<_, Infallible>((as_of, now))
        })
        .await
        .unwrap()
    else {
        panic!("no tick")
    };
    let emails = |subs: &[billing::Subscription]| -> Vec<String> {
        subs.iter().map(|s| s.customer_email.clone()).collect()
    };
    assert_eq!(emails(&as_of), ["early@example.test"]);
    assert_eq!(emails(&now), ["early@example.test", "late@example.test"]);
}
