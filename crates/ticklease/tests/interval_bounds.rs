//! An interval is checked as the database will count it: whole
//! milliseconds from 1 ms to 24 h. One the database would refuse at every
//! ACQUIRE (`900µs` reaches it as 0 ms) is refused before anything is
//! written, by `Schedule::check` and by every way a role is led.

use std::convert::Infallible;
use std::time::Duration;

use ticklease::{Config, Family, Manager, PgStore, PgStoreOptions, Role, Schedule, ScheduleError, Scheduler};
use ticklease_testkit::{connect, migrated_db, test_config, PgCluster};

/// Part milliseconds are a schedule error; past 24 h, the older `IntervalTooLong`.
fn refused_by_the_library(err: Option<&ticklease::Error>) -> bool {
    matches!(
        err,
        Some(ticklease::Error::Schedule { .. } | ticklease::Error::IntervalTooLong { .. })
    )
}

#[tokio::test]
async fn an_interval_the_database_would_refuse_is_refused_before_anything_is_written() {
    let refused = [
        Duration::from_micros(900),
        Duration::from_micros(1500),
        Duration::from_nanos(24 * 3600 * 1_000_000_000 + 500_000),
    ];
    for interval in refused {
        let err = Schedule::every(interval).check(&Config::default()).unwrap_err();
        assert!(
            matches!(err, ScheduleError::Interval { .. }) && err.to_string().contains("whole milliseconds"),
            "{interval:?}: {err}"
        );
    }
    Schedule::every(Duration::from_millis(1))
        .check(&Config::default())
        .unwrap();

    let db = migrated_db(PgCluster::shared()).await;
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&test_config()))
        .await
        .unwrap();
    let billing = Role::new("billing").unwrap();
    let manager = Manager::start(store, test_config(), [billing.clone()])
        .await
        .unwrap();
    let noop = |_| async { Ok::<_, Infallible>(()) };
    for interval in refused {
        let job = Scheduler::new(manager.clone())
            .job(&billing, interval, noop)
            .err();
        assert!(refused_by_the_library(job.as_ref()), "{interval:?}: {job:?}");
        let family = Family::new("tenant_sync").unwrap();
        let keys = Scheduler::new(manager.clone())
            .family(&family, interval, noop)
            .err();
        assert!(refused_by_the_library(keys.as_ref()), "{interval:?}: {keys:?}");
        let led = manager.lead(&billing, interval, noop).await;
        assert!(
            refused_by_the_library(led.as_ref().err()),
            "{interval:?}: {led:?}"
        );
    }
    let client = connect(&db).await.unwrap();
    let history: i64 = client
        .query_one("SELECT count(*) FROM leader_history", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(history, 0, "no term started");
}
