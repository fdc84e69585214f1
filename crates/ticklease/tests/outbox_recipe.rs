//! `examples/outbox.rs` against the test kit's Postgres (issue 41: the
//! recipe without a reclaim left rows claimed and never sent when a term died
//! between claim and send, 117 of 2,867 in an outside run).

#[path = "../examples/outbox.rs"]
#[allow(dead_code)]
mod outbox;

use std::time::Duration;

use ticklease::{Lead, Manager, PgStore, PgStoreOptions, Role};
use ticklease_testkit::{connect, direct, migrated_db, scalar, test_config, PgCluster};

/// A term that dies between its claim and its sends leaves its rows claimed;
/// the next terms reclaim them, and every row is sent once.
#[tokio::test]
async fn rows_a_dead_term_claimed_are_reclaimed_by_the_next_and_sent_once() {
    let db = migrated_db(PgCluster::shared()).await;
    let owner = connect(&direct(&db)).await.unwrap();
    owner
        .batch_execute(
            "CREATE TABLE outbox (id bigint PRIMARY KEY, payload text NOT NULL, claimed_by bigint, sent_at timestamptz);
             INSERT INTO outbox SELECT g, 'mail ' || g FROM generate_series(1, 120) AS g;
             GRANT SELECT, UPDATE ON outbox TO ticklease_app",
        )
        .await
        .unwrap();
    let mut client = connect(&db).await.unwrap();
    let config = test_config();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let role = Role::new("outbox").unwrap();
    let manager = Manager::start(store, config, [role.clone()]).await.unwrap();
    let every = Duration::from_millis(1);

    // The first term claims 50 rows and dies before sending any.
    let died = manager
        .lead(&role, every, |tick| {
            let client = &mut client;
            async move {
                let fence = tick.fence();
                outbox::dispatch(client, fence, |_, _| {
                    Err(std::io::Error::other("the process died"))
                })
                .await
            }
        })
        .await
        .unwrap();
    assert!(matches!(died, Lead::Failed { .. }), "{died:?}");
    let stranded: i64 = scalar(&owner, "SELECT count(*) FROM outbox WHERE claimed_by IS NOT NULL").await;
    assert_eq!(stranded, outbox::CLAIM_MAX, "claimed and never sent");

    let mut sends = Vec::new();
    for _ in 0..10 {
        let unsent: i64 = scalar(&owner, "SELECT count(*) FROM outbox WHERE sent_at IS NULL").await;
        if unsent == 0 {
            break;
        }
        // A failed term's cooldown is one interval (1 ms).
        tokio::time::sleep(Duration::from_millis(5)).await;
        let lead = manager
            .lead(&role, every, |tick| {
                let (client, sends) = (&mut client, &mut sends);
                async move {
                    let fence = tick.fence();
                    outbox::dispatch(client, fence, |id, _| {
                        sends.push(id);
                        Ok::<_, std::io::Error>(())
                    })
                    .await
                }
            })
            .await
            .unwrap();
        assert!(matches!(lead, Lead::Completed { .. }), "{lead:?}");
    }
    let unsent: i64 = scalar(&owner, "SELECT count(*) FROM outbox WHERE sent_at IS NULL").await;
    assert_eq!(unsent, 0, "every row sent");
    sends.sort_unstable();
    assert_eq!(sends, (1..=120).collect::<Vec<i64>>(), "each row sent once");
}
