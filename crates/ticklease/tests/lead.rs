//! `Manager::lead` on real Postgres with scaled timings (TTL 2 s, heartbeat
//! 300 ms, statement timeout 500 ms, abandon 1.2 s, poll 200 ms).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use tokio::sync::oneshot;
use tokio::time::Instant;

use ticklease::{
    Cancel, Lead, LeaseStatus, LossReason, Manager, PgStore, PgStoreOptions, Refusal, Role, Tick,
};
use ticklease_testkit::{connect, migrated_db, test_config, PgCluster};

const HOUR: Duration = Duration::from_secs(3600);

fn role(name: &str) -> Role {
    Role::new(name).unwrap()
}

async fn manager(db: &tokio_postgres::Config, roles: &[&str]) -> Manager<PgStore> {
    let config = test_config();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    Manager::start(store, config, roles.iter().map(|r| role(r)))
        .await
        .unwrap()
}

async fn status(m: &Manager<PgStore>, name: &str) -> LeaseStatus {
    ticklease_testkit::lease_row(m.store(), name).await
}

fn seconds_between(later: SystemTime, earlier: SystemTime) -> f64 {
    later
        .duration_since(earlier)
        .map(|d| d.as_secs_f64())
        .unwrap_or_else(|e| -e.duration().as_secs_f64())
}

/// Sends when the work future is dropped, with the tick's cause at that moment.
struct OnDrop(Option<oneshot::Sender<(Instant, Option<Cancel>)>>, Tick);

impl Drop for OnDrop {
    fn drop(&mut self) {
        if let Some(tx) = self.0.take() {
            let _ = tx.send((Instant::now(), self.1.cause()));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_managers_contend_and_exactly_one_leads_each_role() {
    let db = migrated_db(PgCluster::shared()).await;
    let roles: [&'static str; 3] = ["billing", "dunning", "email_outbox"];
    let managers = [manager(&db, &roles).await, manager(&db, &roles).await];
    let in_flight: Arc<[AtomicUsize; 3]> = Arc::new(Default::default());
    let overlaps = Arc::new(AtomicUsize::new(0));
    let ticks = Arc::new([
        [AtomicUsize::new(0), AtomicUsize::new(0)],
        [AtomicUsize::new(0), AtomicUsize::new(0)],
        [AtomicUsize::new(0), AtomicUsize::new(0)],
    ]);
    let deadline = Instant::now() + Duration::from_secs(3);
    let mut loops = Vec::new();
    for (mi, m) in managers.iter().enumerate() {
        for (ri, name) in roles.into_iter().enumerate() {
            let (m, in_flight, overlaps, ticks) =
                (m.clone(), in_flight.clone(), overlaps.clone(), ticks.clone());
            loops.push(tokio::spawn(async move {
                while Instant::now() < deadline {
                    let lead = m
                        .lead(&role(name), Duration::from_millis(1), |_tick| async {
                            if in_flight[ri].fetch_add(1, Ordering::SeqCst) != 0 {
                                overlaps.fetch_add(1, Ordering::SeqCst);
                            }
                            tokio::time::sleep(Duration::from_millis(20)).await;
                            in_flight[ri].fetch_sub(1, Ordering::SeqCst);
                            Ok::<_, Infallible>(())
                        })
                        .await
                        .unwrap();
                    if matches!(lead, Lead::Completed { .. }) {
                        ticks[ri][mi].fetch_add(1, Ordering::SeqCst);
                    }
                    tokio::time::sleep(Duration::from_millis(3)).await;
                }
            }));
        }
    }
    for l in loops {
        l.await.unwrap();
    }
    assert_eq!(
        overlaps.load(Ordering::SeqCst),
        0,
        "two leaders of one role at once"
    );
    for (ri, name) in roles.iter().enumerate() {
        let counts = [
            ticks[ri][0].load(Ordering::SeqCst),
            ticks[ri][1].load(Ordering::SeqCst),
        ];
        assert!(
            counts[0] + counts[1] >= 10,
            "{name} was led too rarely: {counts:?}"
        );
        println!("{name}: ticks per manager {counts:?}");
    }
}

#[tokio::test]
async fn pause_mid_tick_cancels_within_one_heartbeat_and_unpause_leads_at_the_next_poll() {
    let db = migrated_db(PgCluster::shared()).await;
    let (a, b) = (
        manager(&db, &["email_outbox"]).await,
        manager(&db, &["email_outbox"]).await,
    );
    let r = role("email_outbox");
    let (started_tx, started_rx) = oneshot::channel();
    let (dropped_tx, dropped_rx) = oneshot::channel();
    let leader = a.clone();
    let tick = tokio::spawn(async move {
        let r = role("email_outbox");
        leader
            .lead(&r, HOUR, |tick| async move {
                let _guard = OnDrop(Some(dropped_tx), tick);
                let _ = started_tx.send(());
                std::future::pending::<Result<(), Infallible>>().await
            })
            .await
            .unwrap()
    });
    started_rx.await.unwrap();
    let psql = connect(&db).await.unwrap();
    let paused_at = Instant::now();
    psql.batch_execute("SELECT leader_pause('email_outbox', 'ops', 'smtp key rotation')")
        .await
        .unwrap();
    let (dropped_at, cause) = dropped_rx.await.unwrap();
    let cancel_after = dropped_at - paused_at;
    println!("pause → work cancelled: {cancel_after:?}");
    assert_eq!(cause, Some(Cancel::LeaseLost(LossReason::Paused)));
    let bound =
        test_config().heartbeat_every() + test_config().statement_timeout() + Duration::from_millis(500);
    assert!(
        cancel_after <= bound,
        "cancelled after {cancel_after:?}, bound {bound:?}"
    );
    assert!(matches!(
        tick.await.unwrap(),
        Lead::Lost {
            reason: LossReason::Paused,
            ..
        }
    ));

    for m in [&a, &b] {
        match m
            .lead(&r, HOUR, |_| async { Ok::<_, Infallible>(()) })
            .await
            .unwrap()
        {
            Lead::Refused(Refusal::Paused { by, reason }) => {
                assert_eq!((by.as_str(), reason.as_str()), ("ops", "smtp key rotation"))
            }
            other => panic!("ACQUIRE must be refused while paused, got {other:?}"),
        }
    }

    psql.batch_execute("SELECT leader_unpause('email_outbox')")
        .await
        .unwrap();
    let unpaused_at = Instant::now();
    let led_after = loop {
        if let Lead::Completed { .. } = b
            .lead(&r, HOUR, |_| async { Ok::<_, Infallible>(()) })
            .await
            .unwrap()
        {
            break unpaused_at.elapsed();
        }
        assert!(
            unpaused_at.elapsed() < Duration::from_secs(5),
            "not led after unpause"
        );
        tokio::time::sleep(b.config().max_poll()).await;
    };
    println!("unpause → led: {led_after:?}");
    assert!(led_after <= b.config().max_poll() + Duration::from_millis(500));
}

#[tokio::test]
async fn clean_shutdown_releases_at_once_and_the_role_is_due_elsewhere() {
    let db = migrated_db(PgCluster::shared()).await;
    let (a, b) = (manager(&db, &["billing"]).await, manager(&db, &["billing"]).await);
    let (started_tx, started_rx) = oneshot::channel();
    let leader = a.clone();
    let tick = tokio::spawn(async move {
        leader
            .lead(&role("billing"), HOUR, |tick| async move {
                let _ = started_tx.send(());
                assert_eq!(tick.cancelled().await, Cancel::Shutdown);
                Ok::<_, Infallible>(())
            })
            .await
            .unwrap()
    });
    started_rx.await.unwrap();
    let asked = Instant::now();
    a.shutdown();
    assert!(matches!(tick.await.unwrap(), Lead::Interrupted { .. }));
    let s = status(&a, "billing").await;
    println!("shutdown → released: {:?}", asked.elapsed());
    assert!(!s.held && s.holder_id.is_none());
    assert_eq!((s.not_before, s.last_tick_ended_at), (None, None));
    assert!(matches!(
        a.lead(&role("billing"), HOUR, |_| async { Ok::<_, Infallible>(()) })
            .await
            .unwrap(),
        Lead::ShuttingDown
    ));
    let other = b
        .lead(&role("billing"), HOUR, |_| async { Ok::<_, Infallible>(()) })
        .await
        .unwrap();
    assert!(
        matches!(other, Lead::Completed { .. }),
        "due at once on the other manager: {other:?}"
    );
}

#[tokio::test]
async fn panicked_tick_is_not_a_completion_and_waits_a_full_interval() {
    let db = migrated_db(PgCluster::shared()).await;
    let (a, b) = (manager(&db, &["billing"]).await, manager(&db, &["billing"]).await);
    let leader = a.clone();
    let joined = tokio::spawn(async move {
        leader
            .lead(&role("billing"), HOUR, |_| async {
                panic!("malformed row") as Result<(), Infallible>
            })
            .await
    })
    .await;
    let panic = joined.unwrap_err().into_panic();
    assert_eq!(
        panic.downcast_ref::<&str>(),
        Some(&"malformed row"),
        "the panic continues past lead"
    );
    let s = status(&a, "billing").await;
    assert!(!s.held);
    assert_eq!((s.last_tick_ended_at, s.last_tick_holder), (None, None));
    let wait = seconds_between(s.not_before.expect("cooldown"), s.db_now);
    assert!(
        (3590.0..=3600.0).contains(&wait),
        "not_before = now + interval, got {wait}s"
    );
    let other = b
        .lead(&role("billing"), Duration::from_millis(1), |_| async {
            Ok::<_, Infallible>(())
        })
        .await
        .unwrap();
    assert!(
        matches!(other, Lead::Refused(Refusal::NotDue { .. })),
        "{other:?}"
    );
}

/// The tracing lines logged on this thread while `f` runs (a
/// current-thread runtime: every task of the test runs here).
#[derive(Clone, Default)]
struct Lines(Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Lines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Issue 42 item 4, one line per failover: a tick whose work failed because
/// the database went away under it (here its server process was ended, as
/// a switchover's shutdown ends it) is logged at INFO, since the
/// connection's own WARN says the outage once; any other failure at WARN.
#[tokio::test]
async fn a_tick_failed_by_the_database_going_away_is_logged_below_warn_and_another_failure_at_warn() {
    let lines = Lines::default();
    let writer = lines.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::INFO)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _default = tracing::subscriber::set_default(subscriber);
    let db = migrated_db(PgCluster::shared()).await;
    let a = manager(&db, &["billing", "dunning"]).await;
    // Straight to the server, also where the suite runs through PgBouncer:
    // its transaction pooling could give both clients one server backend,
    // and the owner would end its own.
    let owner = connect(&ticklease_testkit::direct(&db)).await.unwrap();
    let work_db = connect(&ticklease_testkit::direct(&db)).await.unwrap();
    let pid: i32 = work_db
        .query_one("SELECT pg_backend_pid()", &[])
        .await
        .unwrap()
        .get(0);
    let lead = a
        .lead(&role("billing"), HOUR, |_| async {
            owner
                .execute("SELECT pg_terminate_backend($1)", &[&pid])
                .await
                .unwrap();
            work_db.execute("SELECT 1", &[]).await.map(|_| ())
        })
        .await
        .unwrap();
    assert!(matches!(&lead, Lead::Failed { .. }), "{lead:?}");
    let lead = a
        .lead(&role("dunning"), HOUR, |_| async {
            Err::<(), _>(std::io::Error::other("smtp down"))
        })
        .await
        .unwrap();
    assert!(matches!(&lead, Lead::Failed { .. }), "{lead:?}");
    let text = String::from_utf8(lines.0.lock().unwrap().clone()).unwrap();
    let failed: Vec<&str> = text.lines().filter(|l| l.contains("tick failed")).collect();
    assert_eq!(failed.len(), 2, "{text}");
    assert!(
        failed[0].contains(" INFO ")
            && failed[0].contains("while the database was away")
            && failed[0].contains("billing"),
        "{failed:#?}"
    );
    assert!(
        failed[1].contains(" WARN ") && failed[1].contains("dunning"),
        "{failed:#?}"
    );
}

#[tokio::test]
async fn work_error_is_released_as_failed() {
    let db = migrated_db(PgCluster::shared()).await;
    let a = manager(&db, &["billing"]).await;
    let lead = a
        .lead(&role("billing"), HOUR, |_| async {
            Err::<(), _>(std::io::Error::other("smtp down"))
        })
        .await
        .unwrap();
    assert!(
        matches!(&lead, Lead::Failed { error, .. } if error.to_string() == "smtp down"),
        "{lead:?}"
    );
    let s = status(&a, "billing").await;
    assert_eq!(s.last_tick_ended_at, None);
    assert!((3590.0..=3600.0).contains(&seconds_between(s.not_before.unwrap(), s.db_now)));
}

#[tokio::test]
async fn tick_cancelled_by_shutdown_whose_work_then_panics_releases_as_interrupted() {
    let db = migrated_db(PgCluster::shared()).await;
    let (a, b) = (manager(&db, &["billing"]).await, manager(&db, &["billing"]).await);
    let (started_tx, started_rx) = oneshot::channel();
    let leader = a.clone();
    let tick = tokio::spawn(async move {
        leader
            .lead(&role("billing"), HOUR, |tick| async move {
                let _ = started_tx.send(());
                tick.cancelled().await;
                panic!("panicked on the cancelled tick") as Result<(), Infallible>
            })
            .await
    });
    started_rx.await.unwrap();
    a.shutdown();
    assert!(tick.await.unwrap_err().is_panic(), "the panic is still reported");
    let s = status(&a, "billing").await;
    assert!(!s.held);
    assert_eq!(s.not_before, None, "interrupted: no cooldown");
    let other = b
        .lead(&role("billing"), HOUR, |_| async { Ok::<_, Infallible>(()) })
        .await
        .unwrap();
    assert!(matches!(other, Lead::Completed { .. }), "{other:?}");
}

#[tokio::test]
async fn hung_renew_is_a_missed_beat_and_past_abandon_the_work_stops_before_the_lease_expires() {
    let db = migrated_db(PgCluster::shared()).await;
    let a = manager(&db, &["billing"]).await;
    let config = *a.config();
    let (started_tx, started_rx) = oneshot::channel();
    let (dropped_tx, dropped_rx) = oneshot::channel();
    let leader = a.clone();
    let tick = tokio::spawn(async move {
        leader
            .lead(&role("billing"), HOUR, |tick| async move {
                let _guard = OnDrop(Some(dropped_tx), tick);
                let _ = started_tx.send(Instant::now());
                std::future::pending::<Result<(), Infallible>>().await
            })
            .await
            .unwrap()
    });
    let started = started_rx.await.unwrap();
    // Another session holds the lease row: every RENEW now waits on the lock.
    // The test's own sessions go direct: they must not queue for the app's pooled connections.
    let mut locker = connect(&ticklease_testkit::direct(&db)).await.unwrap();
    let lock = locker.transaction().await.unwrap();
    lock.batch_execute("SELECT 1 FROM leader_leases WHERE role = 'billing' FOR UPDATE")
        .await
        .unwrap();
    let locked_at = Instant::now();

    let (dropped_at, cause) = dropped_rx.await.unwrap();
    assert_eq!(cause, Some(Cancel::LeaseLost(LossReason::HeartbeatTimeout)));
    let observer = connect(&ticklease_testkit::direct(&db)).await.unwrap();
    let still_valid: bool = ticklease_testkit::scalar(
        &observer,
        "SELECT expires_at > clock_timestamp() FROM leader_leases WHERE role = 'billing'",
    )
    .await;
    assert!(
        still_valid,
        "the work must stop while the lease is still valid on the database clock"
    );
    let stopped_after_lock = dropped_at - locked_at;
    println!(
        "row locked → work abandoned: {stopped_after_lock:?} (started {:?} before the lock)",
        locked_at - started
    );
    assert!(stopped_after_lock <= config.abandon_after() + Duration::from_millis(700));

    // Timed-out RENEWs were cancelled on the server, not left running.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let waiting: i64 = ticklease_testkit::scalar(
            &observer,
            "SELECT count(*) FROM pg_stat_activity WHERE state = 'active' AND query LIKE '%renewed AS (%'
                   AND pid <> pg_backend_pid()",
        )
        .await;
        if waiting == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{waiting} RENEW statements still running on the server"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // The RELEASE waits on the same lock; let it through.
    lock.commit().await.unwrap();
    assert!(matches!(
        tick.await.unwrap(),
        Lead::Lost {
            reason: LossReason::HeartbeatTimeout,
            ..
        }
    ));
    let s = status(&a, "billing").await;
    assert!(!s.held, "the abandoned term was released");
    let wait = seconds_between(s.not_before.expect("lost-tick cooldown"), s.db_now);
    assert!(
        (55.0..=60.0).contains(&wait),
        "not_before = now + min(interval, 60 s), got {wait}s"
    );
}

/// An interval's retry policy: a tick whose work returned `Err` is tried
/// again after the backoff; once the round's attempts are spent the role
/// waits its interval, and a completion starts a fresh round.
#[tokio::test]
async fn a_failed_interval_tick_is_retried_after_its_backoff_until_the_attempts_are_spent() {
    let db = migrated_db(PgCluster::shared()).await;
    let m = manager(&db, &["dunning"]).await;
    let hourly = ticklease::Schedule::every(HOUR)
        .retry(ticklease::Retry {
            attempts: 2,
            backoff: Duration::from_millis(150),
            backoff_max: Duration::from_millis(150),
        })
        .unwrap();
    let fail = |_| async { Err::<(), _>(std::io::Error::other("the provider is down")) };
    let first = m.lead(&role("dunning"), hourly.clone(), fail).await.unwrap();
    assert!(matches!(first, Lead::Failed { .. }), "{first:?}");
    let remaining = match m.lead(&role("dunning"), hourly.clone(), fail).await.unwrap() {
        Lead::Refused(Refusal::NotDue { remaining, .. }) => remaining,
        other => panic!("a retry waits for its backoff, got {other:?}"),
    };
    assert!(remaining <= Duration::from_millis(150), "{remaining:?}");
    tokio::time::sleep(remaining + Duration::from_millis(20)).await;
    let second = m.lead(&role("dunning"), hourly.clone(), fail).await.unwrap();
    assert!(
        matches!(second, Lead::Failed { .. }),
        "the retry runs: {second:?}"
    );
    match m.lead(&role("dunning"), hourly, fail).await.unwrap() {
        Lead::Refused(Refusal::NotDue { remaining, .. }) => {
            assert!(remaining > HOUR - Duration::from_secs(60), "spent: {remaining:?}")
        }
        other => panic!("spent attempts wait the interval, got {other:?}"),
    }
    // Without a policy a failed tick waits the interval (the spec).
    let plain = m.lead(&role("dunning"), HOUR, fail).await;
    assert!(
        matches!(plain, Ok(Lead::Refused(Refusal::NotDue { .. }))),
        "{plain:?}"
    );
}

/// `Schedule::every` keeps the spec's wait: no retry unless asked for.
#[tokio::test]
async fn a_failed_interval_tick_without_a_retry_policy_waits_its_interval() {
    let db = migrated_db(PgCluster::shared()).await;
    let m = manager(&db, &["dunning"]).await;
    let fail = |_| async { Err::<(), _>(std::io::Error::other("the provider is down")) };
    let first = m.lead(&role("dunning"), HOUR, fail).await.unwrap();
    assert!(matches!(first, Lead::Failed { .. }), "{first:?}");
    match m.lead(&role("dunning"), HOUR, fail).await.unwrap() {
        Lead::Refused(Refusal::NotDue { remaining, .. }) => {
            assert!(remaining > HOUR - Duration::from_secs(60), "{remaining:?}")
        }
        other => panic!("{other:?}"),
    }
}
