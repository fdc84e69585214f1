//! The heartbeat state machine under tokio's paused clock, against the fake
//! store (which passes the same conformance suite as the Postgres store).
//! Default timings: TTL 10 s, heartbeat 3 s, statement timeout 2 s, abandon 6 s.

use std::convert::Infallible;
use std::time::Duration;

use tokio::sync::oneshot;
use tokio::time::Instant;

use ticklease::{Cancel, Config, Error, Lead, LeaseStatus, LeaseStore, LossReason, Manager, Role};
use ticklease_testkit::FakeStore;

const INTERVAL: Duration = Duration::from_secs(3600);

fn billing() -> Role {
    Role::new("billing").unwrap()
}

async fn manager(store: &FakeStore) -> Manager<FakeStore> {
    Manager::start(store.clone(), Config::DEFAULT, [billing()])
        .await
        .unwrap()
}

/// Reports when the work future is dropped, and the tick's cancellation cause then.
struct OnDrop(
    Option<oneshot::Sender<(Instant, Option<Cancel>)>>,
    ticklease::Tick,
);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send((Instant::now(), self.1.cause()));
        }
    }
}

async fn status(store: &FakeStore) -> LeaseStatus {
    ticklease_testkit::lease_row(store, "billing").await
}

#[tokio::test(start_paused = true)]
async fn healthy_heartbeat_renews_every_beat_and_keeps_the_term() {
    let store = FakeStore::new();
    let m = manager(&store).await;
    let start = Instant::now();
    let lead = m
        .lead(&billing(), INTERVAL, |_tick| async {
            tokio::time::sleep(Duration::from_secs(60)).await;
            Ok::<_, Infallible>("done")
        })
        .await
        .unwrap();
    assert!(matches!(lead, Lead::Completed { value: "done", .. }), "{lead:?}");
    let sends = store.renew_sends();
    assert_eq!(sends.len(), 19, "one RENEW every 3 s over 60 s");
    for (i, sent) in sends.iter().enumerate() {
        assert_eq!(*sent - start, Duration::from_secs(3 * (i as u64 + 1)));
    }
    assert!(status(&store).await.last_tick_ended_at.is_some());
}

#[tokio::test(start_paused = true)]
async fn hung_renew_abandons_at_abandon_after_and_starts_no_renew_after() {
    let store = FakeStore::new();
    let m = manager(&store).await;
    store.hang_renews(true);
    let start = Instant::now();
    let (tx, rx) = oneshot::channel();
    let lead = m
        .lead(&billing(), INTERVAL, |tick| async move {
            let _dropped = OnDrop(Some(tx), tick);
            std::future::pending::<Result<(), Infallible>>().await
        })
        .await
        .unwrap();
    let (dropped_at, cause) = rx.await.unwrap();
    assert_eq!(
        cause,
        Some(Cancel::LeaseLost(LossReason::HeartbeatTimeout)),
        "cancelled before the work is dropped"
    );
    assert!(
        matches!(
            lead,
            Lead::Lost {
                reason: LossReason::HeartbeatTimeout,
                ..
            }
        ),
        "{lead:?}"
    );
    // The ACQUIRE was sent at `start`: the abandon is exactly abandon_after later,
    // well before the lease (TTL 10 s from a database instant at or after `start`) expires.
    assert_eq!(dropped_at - start, Duration::from_secs(6));
    let sends = store.renew_sends();
    assert!(!sends.is_empty());
    assert!(
        sends.iter().all(|s| *s - start < Duration::from_secs(6)),
        "a RENEW started after the abandon: {sends:?}"
    );
    // The abandoned term was still ours, so RELEASE applied the lost-tick cooldown.
    let s = status(&store).await;
    assert_eq!(s.not_before, Some(s.db_now + Duration::from_secs(60)));
    assert_eq!(s.last_tick_ended_at, None);
}

#[tokio::test(start_paused = true)]
async fn one_failed_renew_is_a_missed_beat_retried_not_a_loss() {
    let store = FakeStore::new();
    let m = manager(&store).await;
    store.fail_renews(1);
    let start = Instant::now();
    let lead = m
        .lead(&billing(), INTERVAL, |_tick| async {
            tokio::time::sleep(Duration::from_secs(20)).await;
            Ok::<_, Infallible>(())
        })
        .await
        .unwrap();
    assert!(matches!(lead, Lead::Completed { .. }), "{lead:?}");
    let offsets: Vec<Duration> = store.renew_sends().iter().map(|s| *s - start).collect();
    assert_eq!(
        offsets[..3],
        [
            Duration::from_millis(3000),
            Duration::from_millis(4500),
            Duration::from_millis(7500)
        ]
    );
}

#[tokio::test(start_paused = true)]
async fn renew_returning_zero_rows_is_a_loss_within_one_beat() {
    let store = FakeStore::new();
    let m = manager(&store).await;
    let start = Instant::now();
    let pauser = store.clone();
    tokio::spawn(async move {
        tokio::time::sleep(Duration::from_secs(4)).await;
        pauser.pause(&billing(), "ops", "drill").await.unwrap();
    });
    let (tx, rx) = oneshot::channel();
    let lead = m
        .lead(&billing(), INTERVAL, |tick| async move {
            let _dropped = OnDrop(Some(tx), tick);
            std::future::pending::<Result<(), Infallible>>().await
        })
        .await
        .unwrap();
    let (at, cause) = rx.await.unwrap();
    assert_eq!(cause, Some(Cancel::LeaseLost(LossReason::Paused)));
    assert!(matches!(
        lead,
        Lead::Lost {
            reason: LossReason::Paused,
            ..
        }
    ));
    assert_eq!(
        at - start,
        Duration::from_secs(6),
        "the first beat after the pause"
    );
}

#[tokio::test(start_paused = true)]
async fn dropping_the_lead_future_mid_tick_releases_as_interrupted() {
    let store = FakeStore::new();
    let m = manager(&store).await;
    let (started_tx, started_rx) = oneshot::channel();
    let leader = m.clone();
    let task = tokio::spawn(async move {
        leader
            .lead(&billing(), INTERVAL, |_tick| async move {
                let _ = started_tx.send(());
                std::future::pending::<Result<(), Infallible>>().await
            })
            .await
    });
    started_rx.await.unwrap();
    assert!(status(&store).await.held);
    task.abort();
    let _ = task.await;
    tokio::task::yield_now().await;
    let s = status(&store).await;
    assert!(!s.held, "RELEASE must run even when the lead future is dropped");
    assert_eq!(
        (s.not_before, s.last_tick_ended_at),
        (None, None),
        "released as interrupted"
    );
}

#[tokio::test(start_paused = true)]
async fn undeclared_role_and_zero_interval_are_errors_and_write_nothing() {
    let store = FakeStore::new();
    let m = manager(&store).await;
    let before = store.status().await.unwrap();
    let other = Role::new("dunning").unwrap();
    let r = m
        .lead(&other, INTERVAL, |_| async { Ok::<_, Infallible>(()) })
        .await;
    assert!(
        matches!(r, Err(Error::UnknownRole { ref role }) if role == "dunning"),
        "{r:?}"
    );
    let r = m
        .lead(&billing(), Duration::ZERO, |_| async { Ok::<_, Infallible>(()) })
        .await;
    assert!(matches!(r, Err(Error::ZeroInterval { .. })), "{r:?}");
    assert_eq!(store.status().await.unwrap(), before);
}
