//! One table-driven test over the five claim funnels: with a superseded token
//! each claim returns 0 rows and changes nothing; with the current token it
//! claims. Each row is mutation-verified: the same funnel with its fence
//! predicate replaced by `true` lets the stale claim through.

use std::convert::Infallible;
use std::time::Duration;

use tokio_postgres::types::{ToSql, Type};
use tokio_postgres::Client;

use ticklease::{Fence, Lead, Manager, PgStore, PgStoreOptions, Role};
use ticklease_testkit::{connect, direct, migrated_db, test_config, PgCluster};
use ticklease_worker::funnel::{Funnel, FUNNELS};

const WORKLOAD: &str = "
INSERT INTO subscriptions (period_start, next_billing_at, amount_cents, customer_email)
  SELECT now() - interval '1 hour', now() - interval '1 minute', 100 * g, 'c' || g || '@example.test' FROM generate_series(1, 3) g;
INSERT INTO invoices (subscription_id, period_start, amount_cents) SELECT id, period_start, amount_cents FROM subscriptions;
INSERT INTO dunning_runs (invoice_id, next_attempt_at) SELECT id, now() - interval '1 minute' FROM invoices;
INSERT INTO webhook_endpoints (url) VALUES ('http://127.0.0.1:1/hooks/a');
INSERT INTO webhook_events (kind, payload) SELECT 'demo', '{}' FROM generate_series(1, 3);
INSERT INTO webhook_deliveries (event_id, endpoint_id, next_attempt_at)
  SELECT e.id, p.id, now() - interval '1 minute' FROM webhook_events e CROSS JOIN webhook_endpoints p;
INSERT INTO email_outbox (to_addr, subject, body, next_attempt_at)
  SELECT 'u' || g || '@example.test', 's', 'b', now() - interval '1 minute' FROM generate_series(1, 3) g;
";

async fn checksum(client: &Client, table: &str) -> String {
    ticklease_testkit::scalar(
        client,
        &format!("SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM {table} t"),
    )
    .await
}

/// Runs the funnel's claim in a transaction that is rolled back; returns the rows claimed.
async fn claim(client: &mut Client, funnel: &Funnel, fence: &Fence, predicate: &str) -> usize {
    let limit = 10i64;
    let claim_secs = 30.0f64;
    let as_of: Option<std::time::SystemTime> = None;
    let mut rest: Vec<(&(dyn ToSql + Sync), Type)> = vec![(&limit, Type::INT8)];
    // $4: email's claim lease in seconds, billing's as-of instant (NULL: now).
    match funnel.role {
        "email_outbox" => rest.push((&claim_secs, Type::FLOAT8)),
        "billing" => rest.push((&as_of, Type::TIMESTAMPTZ)),
        _ => assert!(!funnel.sql.contains("$4"), "{}: what is its $4?", funnel.role),
    }
    let [role, token] = fence.params();
    let mut params = vec![role, token];
    params.extend_from_slice(&rest);
    let tx = client.transaction().await.unwrap();
    let n = tx
        .query_typed(&funnel.render(predicate), &params)
        .await
        .unwrap()
        .len();
    tx.rollback().await.unwrap();
    n
}

#[tokio::test]
async fn each_funnel_refuses_a_superseded_token_and_claims_with_the_current_one() {
    let db = migrated_db(PgCluster::shared()).await;
    let mut owner = connect(&direct(&db)).await.unwrap();
    ticklease_worker::migrate(&mut owner).await.unwrap();
    owner.batch_execute(WORKLOAD).await.unwrap();
    let config = test_config();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let roles: Vec<Role> = FUNNELS.iter().map(|f| Role::new(f.role).unwrap()).collect();
    let manager = Manager::start(store, config, roles.clone()).await.unwrap();

    for (funnel, role) in FUNNELS.iter().zip(&roles) {
        let stale = match manager
            .lead(role, Duration::from_millis(1), |t| async move {
                Ok::<_, Infallible>(t.fence().clone())
            })
            .await
        {
            Ok(Lead::Completed { value, .. }) => value,
            other => panic!("{}: {other:?}", funnel.role),
        };
        tokio::time::sleep(Duration::from_millis(5)).await;
        let mut client = connect(&db).await.unwrap();
        let client = &mut client;
        let lead = manager
            .lead(role, Duration::from_millis(1), |tick| async move {
                let current = tick.fence().clone();
                assert!(current.token() > stale.token());
                let before = checksum(client, funnel.table).await;
                let stale_claimed = claim(client, funnel, &stale, &stale.predicate(1)).await;
                let after = checksum(client, funnel.table).await;
                let current_claimed = claim(client, funnel, &current, &current.predicate(1)).await;
                let mutant_claimed = claim(client, funnel, &stale, "true").await;
                Ok::<_, Infallible>((stale_claimed, before == after, current_claimed, mutant_claimed))
            })
            .await
            .unwrap();
        let Lead::Completed {
            value: (stale_claimed, unchanged, current_claimed, mutant_claimed),
            ..
        } = lead
        else {
            panic!("{}: {lead:?}", funnel.role)
        };
        println!("{:16} stale: {stale_claimed}  current: {current_claimed}  stale without the fence: {mutant_claimed}", funnel.role);
        assert_eq!(
            stale_claimed, 0,
            "{}: a superseded token claimed rows",
            funnel.role
        );
        assert!(
            unchanged,
            "{}: a superseded claim changed {}",
            funnel.role, funnel.table
        );
        assert!(
            current_claimed > 0,
            "{}: the current token claimed nothing",
            funnel.role
        );
        assert!(
            mutant_claimed > 0,
            "{}: without the fence the stale claim must succeed (the test depends on it)",
            funnel.role
        );
    }
}

#[test]
fn every_funnel_carries_the_fence_and_names_a_worker_role() {
    for f in FUNNELS {
        assert_eq!(f.sql.matches("{fence}").count(), 1, "{}", f.role);
        assert!(ticklease_worker::ROLES.contains(&f.role));
    }
    assert_eq!(FUNNELS.len(), ticklease_worker::ROLES.len());
}
