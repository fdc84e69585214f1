//! The scheduler, the step guard and the metrics, on real Postgres.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use ticklease::{Lead, LeaseStore, Manager, Metrics, PgStore, PgStoreOptions, Role, Scheduler, Steps};
use ticklease_testkit::{connect, migrated_db, test_config, PgCluster};

const HOUR: Duration = Duration::from_secs(3600);

fn role(name: &str) -> Role {
    Role::new(name).unwrap()
}

struct Replica {
    manager: Manager<PgStore>,
    registry: Registry,
    metrics: Metrics,
}

async fn replica(db: &tokio_postgres::Config, roles: &[&str]) -> Replica {
    let config = test_config();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let mut registry = Registry::with_prefix("ticklease");
    let roles: Vec<Role> = roles.iter().map(|r| role(r)).collect();
    let metrics = Metrics::register(&mut registry, roles.clone());
    let manager = Manager::start_with_metrics(store, config, roles, metrics.clone())
        .await
        .unwrap();
    Replica {
        manager,
        registry,
        metrics,
    }
}

/// Parses OpenMetrics text into `series → value` (series as printed, labels sorted by the encoder).
fn scrape(r: &Replica) -> BTreeMap<String, f64> {
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &r.registry).unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .map(|l| {
            let (series, value) = l.rsplit_once(' ').unwrap();
            (series.to_string(), value.parse().unwrap())
        })
        .collect()
}

async fn refreshed(r: &Replica) -> BTreeMap<String, f64> {
    r.metrics.refresh(r.manager.store()).await;
    scrape(r)
}

fn not_before_wait(r: &ticklease::LeaseStatus) -> f64 {
    r.not_before
        .unwrap()
        .duration_since(r.db_now)
        .unwrap()
        .as_secs_f64()
}

async fn status(m: &Manager<PgStore>, name: &str) -> ticklease::LeaseStatus {
    ticklease_testkit::lease_row(m.store(), name).await
}

#[tokio::test]
async fn a_step_panic_lets_the_rest_of_the_tick_run_and_the_tick_is_released_panicked() {
    let db = migrated_db(PgCluster::shared()).await;
    let r = replica(&db, &["billing"]).await;
    let (ran_tx, mut ran_rx) = mpsc::unbounded_channel();
    let scheduler = Scheduler::new(r.manager.clone())
        .job(&role("billing"), HOUR, move |tick| {
            let ran = ran_tx.clone();
            async move {
                let mut steps = Steps::new(&tick);
                steps
                    .run("reconcile", async { ran.send("reconcile").unwrap() })
                    .await;
                steps
                    .run("charge", async { panic!("nil client in charge") })
                    .await;
                steps.run("cleanup", async { ran.send("cleanup").unwrap() }).await;
                ran.send("end").unwrap();
                steps.finish();
                Ok::<_, Infallible>(())
            }
        })
        .unwrap();
    let shutdown = CancellationToken::new();
    let run = tokio::spawn(scheduler.run(shutdown.clone()));
    let mut seen = Vec::new();
    while let Some(step) = ran_rx.recv().await {
        seen.push(step);
        if step == "end" {
            break;
        }
    }
    assert_eq!(seen, ["reconcile", "cleanup", "end"]);
    // Wait for the release (the lease-lost counter is written just before it).
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while status(&r.manager, "billing").await.not_before.is_none() {
        assert!(tokio::time::Instant::now() < deadline, "tick never released");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    shutdown.cancel();
    assert!(run.await.unwrap().all_released());
    let s = status(&r.manager, "billing").await;
    assert_eq!(s.last_tick_ended_at, None, "a panicked tick is not a completion");
    assert!((3590.0..=3600.0).contains(&not_before_wait(&s)));
    let m = scrape(&r);
    assert_eq!(
        m[r#"ticklease_leader_lease_lost_total{role="billing",reason="panicked"}"#],
        1.0
    );
    assert_eq!(
        m[r#"ticklease_leader_ticks_total{role="billing",outcome="panicked"}"#],
        1.0
    );
}

#[tokio::test]
async fn with_two_panicking_steps_the_first_is_the_one_raised() {
    let db = migrated_db(PgCluster::shared()).await;
    let r = replica(&db, &["dunning"]).await;
    let manager = r.manager.clone();
    let panic = tokio::spawn(async move {
        manager
            .lead(&role("dunning"), HOUR, |tick| async move {
                let mut steps = Steps::new(&tick);
                steps.run("first", async { panic!("first") }).await;
                steps.run("second", async { panic!("second") }).await;
                assert_eq!(steps.panics(), 2);
                steps.finish();
                Ok::<_, Infallible>(())
            })
            .await
    })
    .await
    .unwrap_err()
    .into_panic();
    assert_eq!(panic.downcast_ref::<&str>(), Some(&"first"));
}

#[tokio::test]
async fn a_panicking_item_does_not_stop_the_other_items() {
    let db = migrated_db(PgCluster::shared()).await;
    let r = replica(&db, &["billing"]).await;
    let billed = Arc::new(Mutex::new(Vec::new()));
    let b = billed.clone();
    let manager = r.manager.clone();
    let joined = tokio::spawn(async move {
        manager
            .lead(&role("billing"), HOUR, |tick| async move {
                let mut steps = Steps::new(&tick);
                let panicked = steps
                    .each("bill", ["sub-1", "sub-2", "sub-3", "sub-4"], |sub| {
                        let b = b.clone();
                        async move {
                            if sub == "sub-2" {
                                panic!("malformed subscription {sub}");
                            }
                            b.lock().unwrap().push(sub);
                        }
                    })
                    .await;
                assert_eq!(panicked, 1);
                steps.finish();
                Ok::<_, Infallible>(())
            })
            .await
    })
    .await;
    let panic = joined.unwrap_err().into_panic();
    assert_eq!(
        panic.downcast_ref::<String>().map(String::as_str),
        Some("malformed subscription sub-2")
    );
    assert_eq!(*billed.lock().unwrap(), ["sub-1", "sub-3", "sub-4"]);
}

#[tokio::test]
async fn a_panicked_tick_counts_0_to_1_and_the_last_tick_age_keeps_growing() {
    let db = migrated_db(PgCluster::shared()).await;
    let r = replica(&db, &["billing"]).await;
    let panicked = r#"ticklease_leader_lease_lost_total{role="billing",reason="panicked"}"#;
    let age = r#"ticklease_leader_last_tick_age_seconds{role="billing"}"#;
    let never_ran = r#"ticklease_leader_last_tick_state{role="billing",state="never_ran"}"#;

    let m = refreshed(&r).await;
    assert_eq!(m[panicked], 0.0, "pre-created at 0");
    assert_eq!(m[never_ran], 1.0);
    assert!(!m.contains_key(age), "no age value while the role never ran");

    let ok = r
        .manager
        .lead(&role("billing"), Duration::from_millis(1), |_| async {
            Ok::<_, Infallible>(())
        })
        .await;
    assert!(matches!(ok, Ok(Lead::Completed { .. })));
    tokio::time::sleep(Duration::from_millis(5)).await;
    let manager = r.manager.clone();
    let joined = tokio::spawn(async move {
        manager
            .lead(&role("billing"), Duration::from_millis(1), |_| async {
                panic!("boom") as Result<(), Infallible>
            })
            .await
    })
    .await;
    assert!(joined.unwrap_err().is_panic());
    let first = refreshed(&r).await;
    assert_eq!(first[panicked], 1.0);
    assert_eq!(
        first[r#"ticklease_leader_last_tick_state{role="billing",state="ok"}"#],
        1.0
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let later = refreshed(&r).await;
    assert!(
        later[age] >= first[age] + 0.25,
        "age must keep growing: {} then {}",
        first[age],
        later[age]
    );
}

#[tokio::test]
async fn shutdown_mid_tick_releases_as_interrupted_and_the_role_is_due_at_once_elsewhere() {
    let db = migrated_db(PgCluster::shared()).await;
    let (a, b) = (
        replica(&db, &["email_outbox"]).await,
        replica(&db, &["email_outbox"]).await,
    );
    let (started_tx, mut started_rx) = mpsc::unbounded_channel();
    let started = started_tx.clone();
    let scheduler_a = Scheduler::new(a.manager.clone())
        .job(&role("email_outbox"), HOUR, move |tick| {
            let started = started.clone();
            async move {
                started.send("a").unwrap();
                tick.cancelled().await;
                Ok::<_, Infallible>(())
            }
        })
        .unwrap();
    let stop_a = CancellationToken::new();
    let run_a = tokio::spawn(scheduler_a.run(stop_a.clone()));
    assert_eq!(started_rx.recv().await, Some("a"));

    let scheduler_b = Scheduler::new(b.manager.clone())
        .job(&role("email_outbox"), HOUR, move |_tick| {
            let started = started_tx.clone();
            async move {
                started.send("b").unwrap();
                Ok::<_, Infallible>(())
            }
        })
        .unwrap();
    let stop_b = CancellationToken::new();
    let run_b = tokio::spawn(scheduler_b.run(stop_b.clone()));

    tokio::time::sleep(Duration::from_millis(300)).await; // b polls and finds the role held
    let stopping = tokio::time::Instant::now();
    stop_a.cancel();
    let stopped = run_a.await.unwrap();
    assert!(stopped.loops_finished && stopped.all_released(), "{stopped}");
    assert_eq!(started_rx.recv().await, Some("b"));
    let took = stopping.elapsed();
    println!("shutdown of a → tick on b: {took:?}");
    assert!(took <= test_config().max_poll() + Duration::from_secs(1));
    let m = scrape(&a);
    assert_eq!(
        m[r#"ticklease_leader_ticks_total{role="email_outbox",outcome="interrupted"}"#],
        1.0
    );
    assert_eq!(m[r#"ticklease_leader_is_leader{role="email_outbox"}"#], 0.0);
    stop_b.cancel();
    run_b.await.unwrap();
}

#[tokio::test]
async fn metric_output_has_the_documented_names_labels_and_pre_created_series() {
    let db = migrated_db(PgCluster::shared()).await;
    let r = replica(&db, &["billing", "dunning"]).await;
    r.manager
        .store()
        .pause(&role("dunning"), "ops", "drill")
        .await
        .unwrap();
    let ok = r
        .manager
        .lead(&role("billing"), Duration::from_secs(60), |_| async {
            Ok::<_, Infallible>(())
        })
        .await;
    assert!(matches!(ok, Ok(Lead::Completed { .. })));
    let m = refreshed(&r).await;
    for series in [
        r#"ticklease_leader_lease_lost_total{role="billing",reason="panicked"}"#,
        r#"ticklease_leader_lease_lost_total{role="dunning",reason="panicked"}"#,
        r#"ticklease_leader_is_leader{role="billing"}"#,
        r#"ticklease_leader_is_leader{role="dunning"}"#,
        r#"ticklease_leader_paused{role="billing"}"#,
        r#"ticklease_leader_last_tick_state{role="dunning",state="error"}"#,
        r#"ticklease_leader_ticks_total{role="billing",outcome="completed"}"#,
        r#"ticklease_leader_tick_interval_seconds{role="billing"}"#,
        r#"ticklease_leader_tick_duration_seconds_count{role="billing"}"#,
        "ticklease_leader_renew_duration_seconds_count",
        "ticklease_leader_db_clock_drift_seconds",
    ] {
        assert!(m.contains_key(series), "missing {series}; have {:#?}", m.keys());
    }
    assert_eq!(m[r#"ticklease_leader_paused{role="dunning"}"#], 1.0);
    assert_eq!(m[r#"ticklease_leader_paused{role="billing"}"#], 0.0);
    assert_eq!(
        m[r#"ticklease_leader_tick_interval_seconds{role="billing"}"#],
        60.0
    );
    let age = m[r#"ticklease_leader_last_tick_age_seconds{role="billing"}"#];
    assert!((0.0..5.0).contains(&age), "{age}");
    assert!(m[r#"ticklease_leader_db_clock_drift_seconds"#].abs() < 1.0);
    // Tokens trail the clock: the last ACQUIRE issued the clock in ms.
    let lead = m["ticklease_leader_token_lead_seconds"];
    assert!((-5.0..=0.0).contains(&lead), "token lead {lead}");
    assert!(m.values().all(|v| v.is_finite()));
}

#[tokio::test]
async fn a_scrape_error_is_its_own_state_not_a_value() {
    let db = migrated_db(PgCluster::shared()).await;
    let r = replica(&db, &["billing"]).await;
    let ok = r
        .manager
        .lead(&role("billing"), Duration::from_secs(60), |_| async {
            Ok::<_, Infallible>(())
        })
        .await;
    assert!(matches!(ok, Ok(Lead::Completed { .. })));
    assert!(refreshed(&r)
        .await
        .contains_key(r#"ticklease_leader_last_tick_age_seconds{role="billing"}"#));
    let client = ticklease_testkit::connect(&db).await.unwrap();
    client
        .batch_execute("ALTER VIEW leader_status RENAME TO leader_status_gone")
        .await
        .unwrap();
    let m = refreshed(&r).await;
    assert_eq!(
        m[r#"ticklease_leader_last_tick_state{role="billing",state="error"}"#],
        1.0
    );
    assert_eq!(
        m[r#"ticklease_leader_last_tick_state{role="billing",state="ok"}"#],
        0.0
    );
    assert!(
        !m.contains_key(r#"ticklease_leader_last_tick_age_seconds{role="billing"}"#),
        "no stale age on error"
    );
}

#[tokio::test]
async fn jobs_for_undeclared_or_duplicate_roles_are_refused() {
    let db = migrated_db(PgCluster::shared()).await;
    let r = replica(&db, &["billing"]).await;
    let noop = |_| async { Ok::<_, Infallible>(()) };
    let err = Scheduler::new(r.manager.clone())
        .job(&role("dunning"), HOUR, noop)
        .err()
        .unwrap();
    assert_eq!(
        err.to_string(),
        "unknown role \"dunning\": not declared to this manager"
    );
    let err = Scheduler::new(r.manager.clone())
        .job(&role("billing"), HOUR, noop)
        .unwrap()
        .job(&role("billing"), HOUR, noop)
        .err()
        .unwrap();
    assert!(matches!(err, ticklease::Error::DuplicateJob { .. }));
    let err = Scheduler::new(r.manager.clone())
        .job(&role("billing"), Duration::ZERO, noop)
        .err()
        .unwrap();
    assert!(matches!(err, ticklease::Error::ZeroInterval { .. }));
}

#[tokio::test]
async fn a_tick_lost_before_its_work_panics_reports_only_the_loss_once() {
    let db = migrated_db(PgCluster::shared()).await;
    let r = replica(&db, &["email_outbox"]).await;
    let (started_tx, mut started_rx) = mpsc::unbounded_channel();
    let manager = r.manager.clone();
    let tick = tokio::spawn(async move {
        manager
            .lead(&role("email_outbox"), HOUR, |tick| async move {
                started_tx.send(()).unwrap();
                // Would panic once cancelled: the loss drops the work before it can.
                tick.cancelled().await;
                panic!("panicked on the lost tick") as Result<(), Infallible>
            })
            .await
    });
    started_rx.recv().await.unwrap();
    r.manager
        .store()
        .pause(&role("email_outbox"), "ops", "drill")
        .await
        .unwrap();
    let lead = tick.await.expect("no panic escapes a lost tick").unwrap();
    assert!(
        matches!(
            lead,
            Lead::Lost {
                reason: ticklease::LossReason::Paused,
                ..
            }
        ),
        "{lead:?}"
    );
    let m = scrape(&r);
    assert_eq!(
        m[r#"ticklease_leader_lease_lost_total{role="email_outbox",reason="paused"}"#],
        1.0
    );
    assert_eq!(
        m[r#"ticklease_leader_lease_lost_total{role="email_outbox",reason="panicked"}"#],
        0.0
    );
    assert_eq!(
        m[r#"ticklease_leader_ticks_total{role="email_outbox",outcome="lost"}"#],
        1.0
    );
}

/// Shutdown with a tick that ignores its cancellation: after the grace the
/// tick is abandoned and its term RELEASEd before `run` returns.
#[tokio::test]
async fn a_tick_stuck_past_the_shutdown_grace_is_released_before_run_returns() {
    let db = migrated_db(PgCluster::shared()).await;
    let r = replica(&db, &["billing"]).await;
    let (started_tx, mut started_rx) = mpsc::unbounded_channel();
    let scheduler = Scheduler::new(r.manager.clone())
        .shutdown_timeout(Duration::from_millis(300))
        .job(&role("billing"), HOUR, move |_tick| {
            let started = started_tx.clone();
            async move {
                started.send(()).unwrap();
                std::future::pending::<()>().await;
                Ok::<_, Infallible>(())
            }
        })
        .unwrap();
    let stop = CancellationToken::new();
    let run = tokio::spawn(scheduler.run(stop.clone()));
    started_rx.recv().await.unwrap();
    // Slow the RELEASE down: a row lock that the test lets go 200 ms after
    // the RELEASE starts waiting for it (well inside its statement timeout).
    let mut locker = connect(&ticklease_testkit::direct(&db)).await.unwrap();
    let observer = connect(&ticklease_testkit::direct(&db)).await.unwrap();
    let (locked, taken) = tokio::sync::oneshot::channel();
    let lock = tokio::spawn(async move {
        let tx = locker.transaction().await.unwrap();
        tx.batch_execute("SELECT 1 FROM leader_leases WHERE role = 'billing' FOR NO KEY UPDATE")
            .await
            .unwrap();
        let _ = locked.send(());
        let waiting = "SELECT count(*) FROM pg_stat_activity
                        WHERE datname = current_database() AND wait_event_type = 'Lock'";
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while ticklease_testkit::scalar::<i64>(&observer, waiting).await == 0 {
            assert!(
                tokio::time::Instant::now() < deadline,
                "no RELEASE waited for the row lock"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        tx.commit().await.unwrap();
    });
    taken.await.unwrap(); // the lock is taken before the shutdown
    stop.cancel();
    let stopped = run.await.unwrap();
    let row = ticklease_testkit::lease_row(r.manager.store(), "billing").await;
    assert!(!row.held, "run returned while its term was still held: {row:?}");
    lock.await.unwrap();
    assert!(!stopped.loops_finished, "{stopped}");
    assert!(stopped.all_released(), "{stopped}");
    assert_eq!(
        stopped.to_string(),
        "a tick did not return within the shutdown grace and was abandoned; every term was released"
    );
}

/// A RELEASE that fails at shutdown is sent again while the lease lives;
/// one that keeps failing for all of it is reported, not hidden.
#[tokio::test]
async fn a_release_that_fails_at_shutdown_is_sent_again_then_reported() {
    for (failures, released) in [(1, true), (usize::MAX, false)] {
        let store = ticklease_testkit::FakeStore::new();
        let manager = Manager::start(store.clone(), test_config(), [role("billing")])
            .await
            .unwrap();
        let (started_tx, mut started_rx) = mpsc::unbounded_channel();
        let scheduler = Scheduler::new(manager)
            .job(&role("billing"), HOUR, move |tick| {
                let started = started_tx.clone();
                async move {
                    started.send(()).unwrap();
                    tick.cancelled().await;
                    Ok::<_, Infallible>(())
                }
            })
            .unwrap();
        let stop = CancellationToken::new();
        let run = tokio::spawn(scheduler.run(stop.clone()));
        started_rx.recv().await.unwrap();
        store.fail_releases(failures);
        stop.cancel();
        let stopped = run.await.unwrap();
        assert!(stopped.loops_finished && stopped.releases_done, "{stopped}");
        assert_eq!(stopped.all_released(), released, "{failures} failures: {stopped}");
        assert_eq!(stopped.unreleased, usize::from(!released));
        assert_eq!(
            ticklease_testkit::lease_row(&store, "billing").await.held,
            !released
        );
    }
}

/// Another replica takes the billing term over (what its ACQUIRE would write).
const TAKE_OVER: &str = "UPDATE leader_leases SET holder_token = holder_token + 1, holder_id = 'other',
                                acquired_at = now(), expires_at = now() + interval '1 minute'
                          WHERE role = 'billing'";

/// A frozen leader resumes after another replica took its term over: the
/// work's own database error arrives before the heartbeat notices. The tick
/// is counted as lost (as the history records it), not as failed.
#[tokio::test]
async fn a_tick_whose_term_was_over_when_its_work_failed_is_counted_as_lost() {
    let db = migrated_db(PgCluster::shared()).await;
    let r = replica(&db, &["billing"]).await;
    let owner = connect(&db).await.unwrap();
    let lead = r
        .manager
        .lead(&role("billing"), HOUR, |_| {
            let owner = &owner;
            async move {
                owner.batch_execute(TAKE_OVER).await.unwrap();
                Err::<(), _>(std::io::Error::other("could not serialize access"))
            }
        })
        .await
        .unwrap();
    assert!(
        matches!(
            lead,
            Lead::Lost {
                reason: ticklease::LossReason::TakenOver,
                ..
            }
        ),
        "{lead:?}"
    );
    let m = scrape(&r);
    let series = |s: &str| m.get(s).copied().unwrap_or(0.0);
    assert_eq!(
        series(r#"ticklease_leader_lease_lost_total{role="billing",reason="taken_over"}"#),
        1.0,
        "{m:?}"
    );
    assert_eq!(
        series(r#"ticklease_leader_lease_lost_total{role="billing",reason="failed"}"#),
        0.0
    );
    assert_eq!(
        series(r#"ticklease_leader_ticks_total{role="billing",outcome="lost"}"#),
        1.0
    );
    assert_eq!(
        series(r#"ticklease_leader_ticks_total{role="billing",outcome="failed"}"#),
        0.0
    );
}

/// A tick that panics after its term was taken over still counts as
/// panicked (the alert on defects must see it), and the panic is raised again.
#[tokio::test]
async fn a_tick_that_panics_after_its_term_was_over_is_still_counted_as_panicked() {
    let db = migrated_db(PgCluster::shared()).await;
    let r = Arc::new(replica(&db, &["billing"]).await);
    let owner = Arc::new(connect(&db).await.unwrap());
    let leading = tokio::spawn({
        let (r, owner) = (r.clone(), owner.clone());
        async move {
            r.manager
                .lead(&role("billing"), HOUR, |_| async move {
                    owner.batch_execute(TAKE_OVER).await.unwrap();
                    panic!("a defect");
                    #[allow(unreachable_code)]
                    Ok::<(), std::io::Error>(())
                })
                .await
        }
    });
    assert!(leading.await.unwrap_err().is_panic(), "the panic is raised again");
    let m = scrape(&r);
    let series = |s: &str| m.get(s).copied().unwrap_or(0.0);
    assert_eq!(
        series(r#"ticklease_leader_lease_lost_total{role="billing",reason="panicked"}"#),
        1.0,
        "{m:?}"
    );
    assert_eq!(
        series(r#"ticklease_leader_ticks_total{role="billing",outcome="panicked"}"#),
        1.0
    );
}
