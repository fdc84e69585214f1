//! Long-lived roles ([`Schedule::long_lived`]) under tokio's paused clock,
//! against the fake store (which passes the same conformance suite as the
//! Postgres store): each term records the role as long-lived, a crash loop's
//! restart waits double up to their cap, and a crash after a healthy run
//! (one at least as long as the longest wait) restarts after the first wait.

use std::time::Duration;

use ticklease::{Config, Lead, Manager, Retry, Role, Schedule};
use ticklease_testkit::FakeStore;

fn relay() -> Role {
    Role::new("relay").unwrap()
}

/// The wait the role's last RELEASE set: its cooldown from the store's now.
async fn wait(store: &FakeStore) -> Duration {
    let row = ticklease_testkit::lease_row(store, "relay").await;
    assert!(row.long_lived, "each term records the role as long-lived");
    row.not_before.unwrap().duration_since(row.db_now).unwrap()
}

#[tokio::test(start_paused = true)]
async fn a_crash_after_a_healthy_run_restarts_after_the_first_wait_and_a_crash_loop_after_doubling_ones() {
    let store = FakeStore::new();
    let m = Manager::start(store.clone(), Config::DEFAULT, [relay()])
        .await
        .unwrap();
    let second = Duration::from_secs(1);
    let schedule = Schedule::long_lived(second)
        .retry(Retry {
            attempts: Retry::ATTEMPTS_MAX,
            backoff: second,
            backoff_max: 8 * second,
        })
        .unwrap();
    let crash_after = |run: Duration| {
        let schedule = schedule.clone();
        let m = m.clone();
        async move {
            let lead = m
                .lead(&relay(), schedule, |_| async move {
                    tokio::time::sleep(run).await;
                    Err::<(), _>(std::io::Error::other("the relay crashed"))
                })
                .await
                .unwrap();
            assert!(matches!(lead, Lead::Failed { .. }), "{lead:?}");
        }
    };
    for expected in [1, 2, 4, 8, 8] {
        crash_after(Duration::ZERO).await;
        let waited = wait(&store).await;
        assert_eq!(
            waited,
            expected * second,
            "a crash loop's waits double up to the cap"
        );
        tokio::time::sleep(waited).await;
    }
    crash_after(8 * second).await;
    assert_eq!(
        wait(&store).await,
        second,
        "a crash after a healthy run restarts after the first wait"
    );
}
