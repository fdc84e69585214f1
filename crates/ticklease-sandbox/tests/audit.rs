//! The effects audit classifies what broke: a charge is one idempotency key
//! per invoice, and stale claims, duplicates and losses are counted apart.

use ticklease_sandbox::audit::{self, ChargeRequest, Duplicate, Kind, Received, Violation};
use ticklease_sandbox::{connect, PgCluster};

const WORKLOAD: &str = "
INSERT INTO subscriptions (period_start, next_billing_at, amount_cents, customer_email)
  SELECT now() - interval '1 hour', now() + (g > 1)::int * interval '1 hour', 100 * g, 'c' || g || '@example.test'
    FROM generate_series(1, 4) g;
-- Subscription 1 is due and was never invoiced.
INSERT INTO invoices (subscription_id, period_start, amount_cents)
  SELECT id, period_start, amount_cents FROM subscriptions WHERE amount_cents > 100 ORDER BY id;
INSERT INTO dunning_runs (invoice_id, state) SELECT id, 'paid' FROM invoices;
-- A claim under token 1 after token 2's first claim.
INSERT INTO worker_journal (role, token, claimed, at)
  VALUES ('billing', 2, 1, now() - interval '1 minute'), ('billing', 1, 1, now());";

fn charge(key: &str, invoice: i64, accepted: bool) -> ChargeRequest {
    ChargeRequest {
        key: key.into(),
        body: format!(r#"{{"invoice_id":{invoice},"amount_cents":1}}"#),
        accepted,
    }
}

#[tokio::test]
async fn the_audit_counts_keys_per_invoice_and_sorts_violations_by_kind() {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let mut owner = connect(&cluster.config(&db)).await.unwrap();
    ticklease::migrate(&mut owner).await.unwrap();
    ticklease_worker::migrate(&mut owner).await.unwrap();
    owner.batch_execute(WORKLOAD).await.unwrap();
    let invoices: Vec<i64> = owner
        .query_typed("SELECT id FROM invoices ORDER BY id", &[])
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let [twice, declined_then_paid, never] = invoices[..] else {
        panic!("{invoices:?}")
    };
    let received = Received {
        charges: vec![
            // Charged, then charged again under a new key after a crash.
            charge("dunning-1-1", twice, true),
            charge("dunning-1-2", twice, true),
            // A retry under the same key is one charge.
            charge("dunning-1-2", twice, true),
            // A settled decline, then the next attempt's key: one charge.
            charge("dunning-2-1", declined_then_paid, false),
            charge("dunning-2-2", declined_then_paid, true),
        ],
        ..Received::default()
    };

    let a = audit::audit(&owner, &received, &[]).await.unwrap();
    println!("{:#?}", a.violations);
    assert_eq!(a.count(Kind::StaleClaim), 1, "{:#?}", a.violations);
    assert_eq!(
        a.count(Kind::Duplicate),
        1,
        "only invoice {twice} was charged twice: {:#?}",
        a.violations
    );
    assert!(a.violations.iter().any(|v| matches!(
        v,
        Violation::Duplicate(Duplicate::InvoiceCharged { invoice: Some(i), keys })
            if *i == twice && keys.len() == 2
    )));
    assert_eq!(
        a.count(Kind::Loss),
        2,
        "the unbilled subscription and the paid invoice {never} never charged: {:#?}",
        a.violations
    );
    assert_eq!((a.charged_invoices, a.charge_keys, a.charge_requests), (2, 4, 5));
}
