//! Cron schedules on real Postgres (issue 25): each occurrence is one term,
//! run to completion at most once across replicas; the database clock
//! decides when it is due; a failed occurrence is retried as the same
//! occurrence; after a downtime the latest missed occurrence runs once and
//! the others are recorded as skipped. Under `TICKLEASE_TEST_POOLER=pgbouncer`
//! the statements go through PgBouncer.

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use ticklease::{
    Acquire, CatchUp, HistoryKind, HistoryStore, Lead, LeaseStore, Manager, NextChance, OccurrenceAsk,
    PgStore, PgStoreOptions, Refusal, Release, Retry, Role, Schedule, Scheduler, Token,
};
use ticklease_testkit::cluster::ClusterOptions;
use ticklease_testkit::{connect, direct, migrated_db, scalar, test_config, PgCluster};

fn role() -> Role {
    Role::new("billing").unwrap()
}

async fn manager(db: &tokio_postgres::Config) -> Manager<PgStore> {
    let config = test_config();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    Manager::start(store, config, [role()]).await.unwrap()
}

/// A manager of the role with a coordination session (run-nows heard at once).
async fn coordinated(db: &tokio_postgres::Config) -> Manager<PgStore> {
    let config = test_config();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap()
        .with_direct(direct(db))
        .await
        .unwrap();
    Manager::start(store, config, [role()]).await.unwrap()
}

/// The role's first look alone, starting nothing: a first lead would run an
/// occurrence at most a minute old (a role's first occurrence may be up to a
/// minute older than its first look), so a test of an hourly schedule that
/// ran in an hour's first minute would see it run.
async fn look(m: &Manager<PgStore>) {
    let look = m
        .store()
        .acquire_occurrence(&role(), "h", test_config().lease_ttl(), &OccurrenceAsk::default())
        .await
        .unwrap();
    assert!(matches!(look.acquire, Acquire::Refused(_)), "{look:?}");
}

/// Moves the role's counting back, as if it had been declared `ago`.
async fn counting_since(db: &tokio_postgres::Config, ago: Duration) {
    let owner = connect(&direct(db)).await.unwrap();
    owner
        .execute(
            "UPDATE leader_leases SET occurrences_since = now() - $1 * interval '1 millisecond' WHERE role = 'billing'",
            &[&(ago.as_millis() as f64)],
        )
        .await
        .unwrap();
}

#[tokio::test]
async fn each_occurrence_runs_once_across_replicas() {
    let db = migrated_db(PgCluster::shared()).await;
    let every_second = Schedule::cron("* * * * * *").unwrap();
    let (ran, mut runs) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let mut replicas = Vec::new();
    for replica in 0..3 {
        let m = manager(&db).await;
        let ran = ran.clone();
        // A config whose heartbeat (300 ms) allows a schedule of every second.
        let scheduler = Scheduler::new(m)
            .job(&role(), every_second.clone(), move |tick| {
                let ran = ran.clone();
                async move {
                    let _ = ran.send((tick.occurrence().expect("a cron term"), tick.token(), replica));
                    Ok::<_, std::io::Error>(())
                }
            })
            .unwrap();
        replicas.push(tokio::spawn(scheduler.run(stop.clone())));
    }
    // Until six occurrences have started (a start may be a re-run of a lost term).
    let mut started: Vec<(SystemTime, Token, usize)> = Vec::new();
    let mut distinct = std::collections::BTreeSet::new();
    while distinct.len() < 6 {
        let run = tokio::time::timeout(Duration::from_secs(10), runs.recv())
            .await
            .expect("occurrences keep running")
            .unwrap();
        distinct.insert(run.0);
        started.push(run);
    }
    stop.cancel();
    for r in replicas {
        assert!(r.await.unwrap().all_released());
    }
    while let Ok(run) = runs.try_recv() {
        started.push(run);
    }
    // Completed at most once each: the terms the history records as completed.
    let owner = connect(&direct(&db)).await.unwrap();
    let completed: Vec<i64> = owner
        .query(
            "SELECT token FROM leader_history WHERE role = 'billing' AND kind = 'term' AND outcome = 'completed'",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| r.get(0))
        .collect();
    let mut by_occurrence: BTreeMap<SystemTime, Vec<(Token, usize)>> = BTreeMap::new();
    for (occurrence, token, replica) in &started {
        if completed.contains(&token.0) {
            by_occurrence
                .entry(*occurrence)
                .or_default()
                .push((*token, *replica));
        }
    }
    assert!(
        by_occurrence.len() >= 5,
        "occurrences completed: {by_occurrence:?}"
    );
    for (occurrence, terms) in &by_occurrence {
        assert_eq!(
            terms.len(),
            1,
            "{occurrence:?} completed more than once: {terms:?}"
        );
    }
    // Later occurrences ran in later terms.
    let tokens: Vec<i64> = by_occurrence.values().map(|t| t[0].0 .0).collect();
    assert!(tokens.windows(2).all(|t| t[0] < t[1]), "tokens grow: {tokens:?}");
}

#[tokio::test]
async fn the_database_decides_which_occurrence_may_start() {
    let db = migrated_db(PgCluster::shared()).await;
    let m = manager(&db).await;
    let store = m.store();
    let ttl = Duration::from_secs(2);
    let look = store
        .acquire_occurrence(&role(), "h", ttl, &OccurrenceAsk::default())
        .await
        .unwrap();
    assert!(
        matches!(look.acquire, Acquire::Refused(_)),
        "a look starts nothing"
    );
    let since = look.after;
    let ask = |occurrence: SystemTime| OccurrenceAsk {
        occurrence: Some(occurrence),
        ..OccurrenceAsk::default()
    };
    // Not before the database clock reaches it.
    let future = look.db_now + Duration::from_secs(3600);
    let answer = store
        .acquire_occurrence(&role(), "h", ttl, &ask(future))
        .await
        .unwrap();
    match answer.acquire {
        Acquire::Refused(Refusal::NotDue { due_at, .. }) => assert_eq!(due_at, future),
        other => panic!("{other:?}"),
    }
    // Not one from over a minute before the role's counting started (a
    // first occurrence may be up to a minute older than the first look).
    let before_counting = since - Duration::from_secs(61);
    let answer = store
        .acquire_occurrence(&role(), "h", ttl, &ask(before_counting))
        .await
        .unwrap();
    assert_eq!(answer.acquire, Acquire::Refused(Refusal::Contended));
    // Not one that is no longer the latest.
    counting_since(&db, Duration::from_secs(60)).await;
    let x = answer.db_now - Duration::from_secs(30);
    let stale = OccurrenceAsk {
        before: Some(answer.db_now - Duration::from_secs(1)),
        ..ask(x)
    };
    let answer = store.acquire_occurrence(&role(), "h", ttl, &stale).await.unwrap();
    assert_eq!(answer.acquire, Acquire::Refused(Refusal::Contended));
    // A due one starts; failed, it is retried as itself; completed, never again.
    let Acquire::Acquired(first) = store
        .acquire_occurrence(&role(), "h", ttl, &ask(x))
        .await
        .unwrap()
        .acquire
    else {
        panic!("x is due")
    };
    assert!(store
        .release(&role(), first.token, Release::Failed, Duration::from_millis(1))
        .await
        .unwrap());
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = store
        .acquire_occurrence(&role(), "h", ttl, &ask(x))
        .await
        .unwrap();
    assert_eq!(again.failures, 1, "the failed attempt is counted");
    let Acquire::Acquired(second) = again.acquire else {
        panic!("a failed occurrence is retried: {again:?}")
    };
    assert!(store
        .release(
            &role(),
            second.token,
            Release::Completed,
            Duration::from_millis(1)
        )
        .await
        .unwrap());
    let done = store
        .acquire_occurrence(&role(), "h", ttl, &ask(x))
        .await
        .unwrap();
    assert_eq!(
        done.acquire,
        Acquire::Refused(Refusal::Contended),
        "a completed occurrence never runs again"
    );
    assert_eq!(done.after, x, "the row records it");
    assert_eq!(done.failures, 0);
}

#[tokio::test]
async fn a_failed_occurrence_is_retried_as_the_same_occurrence_then_completes() {
    let db = migrated_db(PgCluster::shared()).await;
    let m = manager(&db).await;
    let hourly = Schedule::cron("0 * * * *")
        .unwrap()
        .retry(Retry {
            attempts: 3,
            backoff: Duration::from_millis(100),
            backoff_max: Duration::from_millis(100),
        })
        .unwrap();
    // The role is first looked at, then its counting moved back past the last hour.
    look(&m).await;
    counting_since(&db, Duration::from_secs(3700)).await;
    let fresh = manager(&db).await; // forgets what the first manager knew
    let mut occurrences = Vec::new();
    let mut outcomes = Vec::new();
    for attempt in 0..3 {
        let lead = loop {
            let lead = fresh
                .lead(&role(), hourly.clone(), |tick| {
                    occurrences.push(tick.occurrence());
                    async move {
                        match attempt {
                            0 => Err(std::io::Error::other("payment provider down")),
                            _ => Ok(()),
                        }
                    }
                })
                .await
                .unwrap();
            match lead {
                Lead::Refused(Refusal::NotDue { remaining, .. }) if remaining < Duration::from_secs(1) => {
                    tokio::time::sleep(remaining).await
                }
                other => break other,
            }
        };
        outcomes.push(
            format!("{lead:?}")
                .split(|c: char| !c.is_alphanumeric())
                .next()
                .unwrap()
                .to_owned(),
        );
    }
    assert_eq!(outcomes, ["Failed", "Completed", "Refused"], "{occurrences:?}");
    assert_eq!(occurrences.len(), 2);
    assert_eq!(occurrences[0], occurrences[1], "the retry is the same occurrence");
    let owner = connect(&direct(&db)).await.unwrap();
    let last: SystemTime = scalar(
        &owner,
        "SELECT last_occurrence FROM leader_leases WHERE role = 'billing'",
    )
    .await;
    assert_eq!(Some(last), occurrences[0]);
}

/// Spent retries (and a panic, and a lost term) wait for the next
/// occurrence: the cooldown is counted from the RELEASE, so a slow failing
/// tick does not push the next occurrence back by its own length.
#[tokio::test]
async fn a_failed_occurrence_without_retries_waits_exactly_for_the_next_one() {
    let db = migrated_db(PgCluster::shared()).await;
    let m = manager(&db).await;
    let hourly = Schedule::cron("0 * * * *")
        .unwrap()
        .retry(Retry {
            attempts: 1,
            ..Retry::default()
        })
        .unwrap();
    look(&m).await;
    counting_since(&db, Duration::from_secs(3700)).await;
    let fresh = manager(&db).await;
    let mut ran = None;
    let lead = fresh
        .lead(&role(), hourly, |tick| {
            ran = tick.occurrence();
            async {
                tokio::time::sleep(Duration::from_millis(1500)).await;
                Err::<(), _>(std::io::Error::other("the provider timed out"))
            }
        })
        .await
        .unwrap();
    assert!(matches!(lead, Lead::Failed { .. }), "{lead:?}");
    let owner = connect(&direct(&db)).await.unwrap();
    let not_before: SystemTime = scalar(
        &owner,
        "SELECT not_before FROM leader_leases WHERE role = 'billing'",
    )
    .await;
    let next = ran.unwrap() + Duration::from_secs(3600);
    let off = not_before.duration_since(next).unwrap_or_else(|e| e.duration());
    assert!(
        off < Duration::from_millis(300),
        "waits until {not_before:?}, the next occurrence is {next:?}"
    );
}

/// A failing tick longer than the period: its next occurrence has passed
/// when it is released, so the role is due again at once (not a poll later,
/// which under `Skip` would have passed that occurrence over).
#[tokio::test]
async fn a_failed_tick_longer_than_the_period_leaves_the_role_due_at_once() {
    let db = migrated_db(PgCluster::shared()).await;
    let m = manager(&db).await;
    let every_second = Schedule::cron("* * * * * *")
        .unwrap()
        .retry(Retry {
            attempts: 1,
            ..Retry::default()
        })
        .unwrap();
    let mut chance = NextChance::new(&m, &role());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let lead = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no failed tick within 30 s"
        );
        let lead = m
            .lead(&role(), every_second.clone(), |_| async {
                tokio::time::sleep(Duration::from_millis(1300)).await;
                Err::<(), _>(std::io::Error::other("slow and failing"))
            })
            .await;
        if let Ok(Lead::Failed { .. }) = lead {
            break lead;
        }
        assert!(chance.wait(&lead).await);
    };
    assert!(matches!(lead, Ok(Lead::Failed { .. })), "{lead:?}");
    let owner = connect(&direct(&db)).await.unwrap();
    let wait: f64 = scalar(
        &owner,
        "SELECT extract(epoch FROM l.not_before - h.at)::float8
           FROM leader_leases AS l, leader_history AS h
          WHERE l.role = 'billing' AND h.role = 'billing' AND h.kind = 'term' AND h.outcome = 'failed'",
    )
    .await;
    assert!(wait < 0.1, "the role waited {wait} s after the RELEASE");
}

#[tokio::test]
async fn after_a_downtime_the_latest_occurrence_runs_once_and_the_rest_are_recorded_skipped() {
    let db = migrated_db(PgCluster::shared()).await;
    let m = manager(&db).await;
    let minutely = Schedule::cron("* * * * *").unwrap();
    look(&m).await;
    // Counting from 10½ minutes before the current minute: the ten minute
    // marks before it are skipped, the current one runs.
    let owner = connect(&direct(&db)).await.unwrap();
    owner
        .execute(
            "UPDATE leader_leases SET occurrences_since = date_trunc('minute', now()) - interval '630 seconds'
              WHERE role = 'billing'",
            &[],
        )
        .await
        .unwrap();
    let fresh = manager(&db).await;
    let mut ran = None;
    let lead = fresh
        .lead(&role(), minutely.clone(), |tick| {
            ran = tick.occurrence();
            async { Ok::<_, std::io::Error>(()) }
        })
        .await
        .unwrap();
    assert!(matches!(lead, Lead::Completed { .. }), "{lead:?}");
    let now: SystemTime = scalar(&owner, "SELECT now()").await;
    let ran = ran.expect("a cron term");
    assert!(
        now.duration_since(ran).unwrap() < Duration::from_secs(60),
        "the latest ran: {ran:?}"
    );
    let (reason, summary): (String, String) = {
        let row = owner
            .query_one(
                "SELECT reason, error FROM leader_history WHERE role = 'billing' AND kind = 'skipped'",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(reason, "catch_up");
    // 11 when the minute turned between the UPDATE and the ACQUIRE.
    assert!(
        summary.starts_with("10 occurrences from ") || summary.starts_with("11 occurrences from "),
        "{summary}"
    );
    let history = fresh
        .store()
        .history(None, Duration::from_secs(3600), 10)
        .await
        .unwrap();
    assert!(
        history
            .iter()
            .any(|e| matches!(&e.kind, HistoryKind::Skipped { reason, summary: s }
            if reason == "catch_up" && *s == summary)),
        "the history reads it as skipped: {history:?}"
    );
    // Nothing more runs until the next minute.
    let again = fresh
        .lead(&role(), minutely, |_| async { Ok::<_, std::io::Error>(()) })
        .await
        .unwrap();
    assert!(
        matches!(again, Lead::Refused(Refusal::NotDue { .. })),
        "{again:?}"
    );
}

#[tokio::test]
async fn a_schedule_faster_than_the_heartbeat_or_an_undeclared_role_is_refused_before_anything_runs() {
    let db = migrated_db(PgCluster::shared()).await;
    let config = ticklease::Config::default();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let m = Manager::start(store, config, [role()]).await.unwrap();
    let every_second = Schedule::cron("* * * * * *").unwrap();
    let refused =
        Scheduler::new(m.clone()).job(&role(), every_second, |_| async { Ok::<_, std::io::Error>(()) });
    assert!(matches!(refused, Err(ticklease::Error::Schedule { .. })));
    let other = Role::new("dunning").unwrap();
    let lead = m
        .lead(&other, Schedule::cron("@hourly").unwrap(), |_| async {
            Ok::<_, std::io::Error>(())
        })
        .await;
    assert!(matches!(lead, Err(ticklease::Error::UnknownRole { .. })));
    let owner = connect(&direct(&db)).await.unwrap();
    let asked: i64 = scalar(
        &owner,
        "SELECT count(*) FROM leader_leases WHERE occurrences_since IS NOT NULL",
    )
    .await;
    assert_eq!(asked, 0, "nothing was written");
}

fn utc(rfc3339: &str) -> SystemTime {
    chrono::DateTime::parse_from_rfc3339(rfc3339).unwrap().into()
}

/// The database's clock sits seconds before Berlin's 2026 spring change
/// (02:00 CET → 03:00 CEST, 01:00 UTC); this host's clock, and so the
/// library's, is months away from it: only the database's counts. A daily
/// 02:30 falls in the gap and runs once, right after it.
#[tokio::test]
async fn a_time_in_the_spring_gap_runs_once_right_after_it_on_the_database_clock() {
    let cluster =
        PgCluster::start_with(&ClusterOptions::default().with_fake_time("2026-03-29 00:59:54")).unwrap();
    let db = migrated_db(&cluster).await;
    let owner = connect(&cluster.config(db.get_dbname().unwrap())).await.unwrap();
    let start: SystemTime = scalar(&owner, "SELECT now()").await;
    assert!(
        start < utc("2026-03-29T01:00:00Z"),
        "the database clock is faked: {start:?}"
    );
    let m = manager(&db).await;
    let daily = Schedule::cron("30 2 * * *")
        .unwrap()
        .zone("Europe/Berlin")
        .unwrap();
    let mut chance = NextChance::new(&m, &role());
    let mut ran = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let lead = m
            .lead(&role(), daily.clone(), |tick| {
                ran.push(tick.occurrence());
                async { Ok::<_, std::io::Error>(()) }
            })
            .await;
        if let Ok(Lead::Completed { .. }) = lead {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "never ran: {lead:?}");
        assert!(chance.wait(&lead).await);
    }
    assert_eq!(ran, [Some(utc("2026-03-29T01:00:00Z"))], "once, at 03:00 CEST");
    let last: SystemTime = scalar(
        &owner,
        "SELECT last_occurrence FROM leader_leases WHERE role = 'billing'",
    )
    .await;
    assert_eq!(last, utc("2026-03-29T01:00:00Z"));
    match m
        .lead(&role(), daily, |_| async { Ok::<_, std::io::Error>(()) })
        .await
    {
        Ok(Lead::Refused(Refusal::NotDue { due_at, .. })) => {
            assert_eq!(
                due_at,
                utc("2026-03-30T00:30:00Z"),
                "next: 02:30 CEST the day after"
            )
        }
        other => panic!("{other:?}"),
    }
}

/// The metrics of a cron role, read from the lease row: seconds until the
/// next occurrence and how late it is, and the occurrences a replica
/// recorded skipped, by reason.
#[tokio::test]
async fn the_metrics_show_a_late_occurrence_and_count_the_skipped_ones() {
    use ticklease::prometheus_client::{encoding::text::encode, registry::Registry};
    use ticklease::Metrics;
    let db = migrated_db(PgCluster::shared()).await;
    let config = test_config();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let mut registry = Registry::with_prefix("app");
    let metrics = Metrics::register(&mut registry, [role()]);
    let m = Manager::start_with_metrics(store, config, [role()], metrics.clone())
        .await
        .unwrap();
    let scrape = || {
        let mut text = String::new();
        encode(&mut text, &registry).unwrap();
        let value = |series: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse::<f64>().ok())
        };
        let series = |name: &str| format!("app_leader_{name}{{role=\"billing\"}}");
        (
            value(&series("occurrence_next_seconds")),
            value(&series("occurrence_late_seconds")),
            value("app_leader_occurrences_skipped_total{role=\"billing\",reason=\"catch_up\"}"),
        )
    };
    let minutely = Schedule::cron("* * * * *").unwrap();
    metrics.refresh(m.store()).await;
    assert_eq!(scrape(), (None, None, None), "no occurrence known yet");
    // The occurrence 4 minutes before the current minute is the next to run, and no one ran it.
    let owner = connect(&direct(&db)).await.unwrap();
    owner
        .execute(
            "UPDATE leader_leases SET last_occurrence = date_trunc('minute', now()) - interval '5 minutes',
                    next_occurrence = date_trunc('minute', now()) - interval '4 minutes'
              WHERE role = 'billing'",
            &[],
        )
        .await
        .unwrap();
    metrics.refresh(m.store()).await;
    let (next, late, skipped) = scrape();
    assert_eq!(next, Some(0.0));
    assert!(late.is_some_and(|l| (240.0..330.0).contains(&l)), "{late:?}");
    assert_eq!(skipped, None);
    let lead = m
        .lead(&role(), minutely.clone(), |_| async {
            Ok::<_, std::io::Error>(())
        })
        .await;
    assert!(matches!(lead, Ok(Lead::Completed { .. })), "{lead:?}");
    metrics.refresh(m.store()).await;
    let (next, late, skipped) = scrape();
    assert!(next.is_some_and(|n| n > 0.0 && n <= 60.0), "{next:?}");
    assert_eq!(late, Some(0.0));
    // 5 when the minute turned between the UPDATE and the ACQUIRE.
    assert!(matches!(skipped, Some(4.0 | 5.0)), "{skipped:?}");
}

/// `run-now` of a cron role runs its work at once as a manual run (no
/// occurrence; the history names who asked), once, and consumes no
/// occurrence: the next one still runs when due. With a coordination
/// session a replica hears the run-now at once; here, within max_poll.
#[tokio::test]
async fn run_now_of_a_cron_role_runs_once_at_once_and_consumes_no_occurrence() {
    let db = migrated_db(PgCluster::shared()).await;
    let m = manager(&db).await;
    // The occurrence of the top of the hour after next: far off. An
    // occurrence of the role started yesterday, so no first occurrence runs
    // in this hour's first minute either.
    let hourly = Schedule::cron("0 * * * *").unwrap();
    look(&m).await;
    connect(&direct(&db))
        .await
        .unwrap()
        .execute(
            "UPDATE leader_leases SET occurrence = now() - interval '1 day' WHERE role = 'billing'",
            &[],
        )
        .await
        .unwrap();
    let first = m
        .lead(&role(), hourly.clone(), |_| async { Ok::<_, std::io::Error>(()) })
        .await;
    assert!(
        matches!(first, Ok(Lead::Refused(Refusal::NotDue { .. }))),
        "{first:?}"
    );
    assert!(!m.store().run_now(&role()).await.unwrap(), "no cooldown was set");
    let mut chance = NextChance::new(&m, &role());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let mut ran = Vec::new();
    let lead = loop {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no manual run within 10 s"
        );
        let lead = m
            .lead(&role(), hourly.clone(), |tick| {
                ran.push(tick.occurrence());
                async { Ok::<_, std::io::Error>(()) }
            })
            .await;
        if matches!(lead, Ok(Lead::Completed { .. })) {
            break lead;
        }
        assert!(chance.wait(&lead).await);
    };
    assert!(matches!(lead, Ok(Lead::Completed { .. })), "{lead:?}");
    assert_eq!(ran, [None], "a manual run has no occurrence");
    let owner = connect(&direct(&db)).await.unwrap();
    let login: String = scalar(&owner, "SELECT session_user::text").await;
    let history = m
        .store()
        .history(Some(&role()), Duration::from_secs(3600), 10)
        .await
        .unwrap();
    assert!(
        history.iter().any(
            |e| matches!(&e.kind, HistoryKind::Term { outcome, manual_by: Some(by), .. }
            if outcome == "completed" && *by == login)
        ),
        "{history:?}"
    );
    let row = ticklease_testkit::lease_row(m.store(), "billing").await;
    assert_eq!(row.last_occurrence, None, "a manual run completes no occurrence");
    // Once: later polls find nothing to run.
    tokio::time::sleep(test_config().max_poll() * 2).await;
    let again = m
        .lead(&role(), hourly.clone(), |_| async { Ok::<_, std::io::Error>(()) })
        .await;
    assert!(
        matches!(again, Ok(Lead::Refused(Refusal::NotDue { .. }))),
        "{again:?}"
    );
    // The occurrence at the top of this hour still runs (counting moved back to before it).
    owner
        .execute(
            "UPDATE leader_leases SET occurrences_since = date_trunc('hour', now()) - interval '1 minute'
              WHERE role = 'billing'",
            &[],
        )
        .await
        .unwrap();
    let fresh = manager(&db).await;
    let mut occurrence = None;
    let scheduled = fresh
        .lead(&role(), hourly.clone(), |tick| {
            occurrence = tick.occurrence();
            async { Ok::<_, std::io::Error>(()) }
        })
        .await;
    assert!(matches!(scheduled, Ok(Lead::Completed { .. })), "{scheduled:?}");
    let top: SystemTime = scalar(&owner, "SELECT date_trunc('hour', now())").await;
    assert_eq!(occurrence, Some(top));
}

/// The instant recorded as the next occurrence is bounded (after the asked
/// one, within 100 years; the asked one from 1970): any app login can call
/// the ACQUIRE, and status formats what it recorded.
#[tokio::test]
async fn an_acquire_naming_a_next_occurrence_out_of_bounds_is_refused_and_writes_nothing() {
    let db = migrated_db(PgCluster::shared()).await;
    let m = manager(&db).await;
    let now = SystemTime::now();
    let year = Duration::from_secs(365 * 86_400);
    for (occurrence, next) in [
        (now, SystemTime::UNIX_EPOCH - year),
        (now, now - Duration::from_secs(1)),
        (now, now + year * 101),
        (SystemTime::UNIX_EPOCH - year, now),
    ] {
        let ask = OccurrenceAsk {
            occurrence: Some(occurrence),
            next: Some(next),
            schedule: "x".into(),
            ..OccurrenceAsk::default()
        };
        let answer = m
            .store()
            .acquire_occurrence(&role(), "h", Duration::from_secs(10), &ask)
            .await;
        assert!(answer.is_err(), "{occurrence:?} then {next:?}: {answer:?}");
    }
    let row = ticklease_testkit::lease_row(m.store(), "billing").await;
    assert_eq!((row.schedule, row.next_occurrence), (None, None));
}

/// With a coordination session a run-now is heard at once, also when the
/// role had no cooldown to clear (the usual state of a cron role).
#[tokio::test]
async fn with_a_coordination_session_a_run_now_is_heard_at_once() {
    let db = migrated_db(PgCluster::shared()).await;
    let (config, m) = (test_config(), coordinated(&db).await);
    let (ran, mut runs) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let yearly = Schedule::cron("0 0 1 1 *").unwrap();
    let scheduler = Scheduler::new(m.clone())
        .job(&role(), yearly, move |tick| {
            let _ = ran.send(tick.occurrence());
            async { Ok::<_, std::io::Error>(()) }
        })
        .unwrap();
    let run = tokio::spawn(scheduler.run(stop.clone()));
    // The loop has looked once (the row records the schedule) and sleeps for up to a minute.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while ticklease_testkit::lease_row(m.store(), "billing")
        .await
        .schedule
        .is_none()
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the role loop never looked"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(config.max_poll() * 2).await;
    let asked = tokio::time::Instant::now();
    assert!(!m.store().run_now(&role()).await.unwrap(), "no cooldown to clear");
    let occurrence = tokio::time::timeout(Duration::from_secs(5), runs.recv())
        .await
        .expect("a manual run within 5 s of the run-now (the loop sleeps up to 60 s)")
        .unwrap();
    assert_eq!(occurrence, None, "a manual run");
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "heard after {:?}",
        asked.elapsed()
    );
    stop.cancel();
    run.await.unwrap();
}

/// Run-now of an interval role that is not due runs it now (issue 41: it
/// did nothing, "had no cooldown"), as a manual term whose history row names
/// who asked; the role's interval counts from that run.
#[tokio::test]
async fn a_run_now_runs_an_interval_role_that_is_not_due_at_once_and_names_who_asked() {
    let db = migrated_db(PgCluster::shared()).await;
    let (config, m) = (test_config(), coordinated(&db).await);
    let (ran, mut runs) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let scheduler = Scheduler::new(m.clone())
        .job(&role(), Schedule::every(Duration::from_secs(3600)), move |tick| {
            let _ = ran.send(tick.token());
            async { Ok::<_, std::io::Error>(()) }
        })
        .unwrap();
    let run = tokio::spawn(scheduler.run(stop.clone()));
    let first = tokio::time::timeout(Duration::from_secs(10), runs.recv())
        .await
        .expect("a role that never ran runs at once")
        .unwrap();
    // Its next tick is an hour off.
    assert!(
        tokio::time::timeout(config.max_poll() * 2, runs.recv())
            .await
            .is_err(),
        "no second tick before the run-now"
    );
    let asked = tokio::time::Instant::now();
    assert!(!m.store().run_now(&role()).await.unwrap(), "no cooldown");
    let manual = tokio::time::timeout(Duration::from_secs(5), runs.recv())
        .await
        .expect("the manual run within 5 s of the run-now (the next tick is an hour off)")
        .unwrap();
    assert!(manual > first);
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "heard after {:?}",
        asked.elapsed()
    );
    assert!(
        tokio::time::timeout(config.max_poll() * 2, runs.recv())
            .await
            .is_err(),
        "one run per run-now"
    );
    stop.cancel();
    run.await.unwrap();
    let client = connect(&db).await.unwrap();
    let by: String = scalar(
        &client,
        &format!(
            "SELECT by FROM leader_history WHERE kind = 'term' AND token = {}",
            manual.0
        ),
    )
    .await;
    let user: String = scalar(&client, "SELECT session_user::text").await;
    assert_eq!(by, user, "the manual term names who asked");
}

/// An occurrence that started and never completed, overtaken by a later
/// one (its holder killed mid-run, the next occurrence due before its lease
/// expired), is recorded (issue 41: it was recorded nowhere, the term only
/// `lost/expired`): a `skipped` row, reason `overtaken`, naming it.
#[tokio::test]
async fn an_occurrence_a_later_one_overtakes_is_recorded_as_skipped_overtaken() {
    let db = migrated_db(PgCluster::shared()).await;
    let m = manager(&db).await;
    look(&m).await;
    counting_since(&db, Duration::from_secs(3600)).await;
    let hourly = "CRON_TZ=UTC 0 * * * *".to_string();
    let now = m
        .store()
        .acquire_occurrence(&role(), "h", test_config().lease_ttl(), &OccurrenceAsk::default())
        .await
        .unwrap()
        .db_now;
    // Two past instants the test names occurrences: x, then y a second later.
    let x = now - Duration::from_secs(2);
    let y = now - Duration::from_secs(1);
    let ask = |occurrence: SystemTime, next: SystemTime| OccurrenceAsk {
        occurrence: Some(occurrence),
        next: Some(next),
        schedule: hourly.clone(),
        ..OccurrenceAsk::default()
    };
    let ttl = Duration::from_millis(200);
    let dies = m
        .store()
        .acquire_occurrence(&role(), "dead", ttl, &ask(x, y))
        .await
        .unwrap();
    assert!(matches!(dies.acquire, Acquire::Acquired(_)), "{dies:?}");
    // Its holder never renews: the lease runs out, and y is asked for.
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let next = m
        .store()
        .acquire_occurrence(&role(), "h", ttl, &ask(y, now + Duration::from_secs(3600)))
        .await
        .unwrap();
    assert!(matches!(next.acquire, Acquire::Acquired(_)), "{next:?}");
    let history = m
        .store()
        .history(Some(&role()), Duration::from_secs(60), 50)
        .await
        .unwrap();
    let x_text = chrono::DateTime::<chrono::Utc>::from(x).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
    let overtaken: Vec<&HistoryKind> = history
        .iter()
        .map(|e| &e.kind)
        .filter(|k| matches!(k, HistoryKind::Skipped { reason, .. } if reason == "overtaken"))
        .collect();
    assert_eq!(overtaken.len(), 1, "{history:?}");
    let HistoryKind::Skipped { summary, .. } = overtaken[0] else {
        unreachable!()
    };
    assert_eq!(summary, &format!("1 occurrence from {x_text} to {x_text}"));
    // A retry of the same occurrence overtakes nothing.
    tokio::time::sleep(ttl + Duration::from_millis(100)).await;
    let retry = m
        .store()
        .acquire_occurrence(&role(), "h2", ttl, &ask(y, now + Duration::from_secs(3600)))
        .await
        .unwrap();
    assert!(matches!(retry.acquire, Acquire::Acquired(_)), "{retry:?}");
    let again = m
        .store()
        .history(Some(&role()), Duration::from_secs(60), 50)
        .await
        .unwrap();
    assert_eq!(
        again
            .iter()
            .filter(|e| matches!(&e.kind, HistoryKind::Skipped { reason, .. } if reason == "overtaken"))
            .count(),
        1,
        "{again:?}"
    );
    // y fails (attempted); a manual run then starts, whose holder dies: the
    // row still names y, but neither y nor the manual run is overtaken by z.
    let Acquire::Acquired(term) = retry.acquire else {
        unreachable!()
    };
    let cooldown = Duration::from_millis(400);
    assert!(m
        .store()
        .release(&role(), term.token, Release::Failed, cooldown)
        .await
        .unwrap());
    m.store().run_now(&role()).await.unwrap();
    let look = OccurrenceAsk {
        schedule: hourly.clone(),
        ..OccurrenceAsk::default()
    };
    let manual = m
        .store()
        .acquire_occurrence(&role(), "h3", ttl, &look)
        .await
        .unwrap();
    assert!(matches!(manual.acquire, Acquire::Acquired(_)), "{manual:?}");
    tokio::time::sleep(cooldown + Duration::from_millis(100)).await;
    let z = m
        .store()
        .acquire_occurrence(&role(), "h4", ttl, &ask(now, now + Duration::from_secs(3600)))
        .await
        .unwrap();
    assert!(matches!(z.acquire, Acquire::Acquired(_)), "{z:?}");
    let last = m
        .store()
        .history(Some(&role()), Duration::from_secs(60), 50)
        .await
        .unwrap();
    let overtaken: Vec<_> = last
        .iter()
        .filter(|e| matches!(&e.kind, HistoryKind::Skipped { reason, .. } if reason == "overtaken"))
        .collect();
    assert_eq!(
        overtaken.len(),
        1,
        "y was attempted, the manual run ran no occurrence: {last:?}"
    );
}

/// A manual term lost to a pause is recorded with who asked for it.
#[tokio::test]
async fn a_manual_term_lost_to_a_pause_names_who_asked_for_it() {
    let db = migrated_db(PgCluster::shared()).await;
    let m = manager(&db).await;
    let look = OccurrenceAsk {
        schedule: "CRON_TZ=UTC 0 0 1 1 *".into(),
        ..OccurrenceAsk::default()
    };
    let ttl = Duration::from_secs(10);
    m.store()
        .acquire_occurrence(&role(), "h", ttl, &look)
        .await
        .unwrap();
    m.store().run_now(&role()).await.unwrap();
    let manual = m
        .store()
        .acquire_occurrence(&role(), "h", ttl, &look)
        .await
        .unwrap();
    assert!(matches!(manual.acquire, Acquire::Acquired(_)), "{manual:?}");
    m.store().pause(&role(), "ops", "maintenance").await.unwrap();
    let owner = connect(&direct(&db)).await.unwrap();
    let login: String = scalar(&owner, "SELECT session_user::text").await;
    let history = m
        .store()
        .history(Some(&role()), Duration::from_secs(3600), 10)
        .await
        .unwrap();
    assert!(
        history.iter().any(
            |e| matches!(&e.kind, HistoryKind::Term { outcome, manual_by: Some(by), .. }
            if outcome == "lost" && *by == login)
        ),
        "{history:?}"
    );
}

/// Unpause records the pause's window in the row; the first occurrence run
/// afterwards records those that fell due within it as skipped `paused`,
/// and the other missed ones as `catch_up`.
#[tokio::test]
async fn occurrences_due_while_the_role_was_paused_are_recorded_as_skipped_for_the_pause() {
    let db = migrated_db(PgCluster::shared()).await;
    let m = manager(&db).await;
    let minutely = Schedule::cron("* * * * *").unwrap();
    look(&m).await;
    assert!(m
        .store()
        .pause(&role(), "ops", "provider maintenance")
        .await
        .unwrap());
    assert!(m.store().unpause(&role()).await.unwrap());
    let owner = connect(&direct(&db)).await.unwrap();
    let recorded: bool = scalar(
        &owner,
        "SELECT last_paused_at <= last_unpaused_at AND last_unpaused_at <= now() FROM leader_leases WHERE role = 'billing'",
    )
    .await;
    assert!(recorded, "unpause records when the role was paused and unpaused");
    // As if declared 10.5 minutes ago and paused from 6.5 to 1.5 minutes ago.
    owner
        .execute(
            "UPDATE leader_leases SET occurrences_since = date_trunc('minute', now()) - interval '630 seconds',
                    last_paused_at = date_trunc('minute', now()) - interval '390 seconds',
                    last_unpaused_at = date_trunc('minute', now()) - interval '90 seconds'
              WHERE role = 'billing'",
            &[],
        )
        .await
        .unwrap();
    let fresh = manager(&db).await;
    let lead = fresh
        .lead(&role(), minutely, |_| async { Ok::<_, std::io::Error>(()) })
        .await
        .unwrap();
    assert!(matches!(lead, Lead::Completed { .. }), "{lead:?}");
    let skipped: Vec<(String, String)> = owner
        .query(
            "SELECT reason, error FROM leader_history WHERE role = 'billing' AND kind = 'skipped' ORDER BY reason",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(skipped.len(), 2, "{skipped:?}");
    assert_eq!(skipped[0].0, "catch_up");
    assert_eq!(skipped[1].0, "paused");
    assert!(skipped[1].1.starts_with("5 occurrences from "), "{skipped:?}");
    // Before the pause 4 (-10, -9, -8, -7 min); after it 1 (-1 min), or 2 when the minute turned.
    assert!(
        skipped[0].1.starts_with("5 occurrences from ") || skipped[0].1.starts_with("6 occurrences from "),
        "{skipped:?}"
    );
}

/// A replica that kept polling while the role was paused records the
/// occurrences due in the pause as paused (review finding: its cached answer,
/// from before the unpause, had no pause window).
#[tokio::test]
async fn a_replica_that_polled_while_paused_records_the_paused_occurrences_as_paused() {
    let db = migrated_db(PgCluster::shared()).await;
    let config = test_config();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let role = Role::new("billing").unwrap();
    let m = Manager::start(store, config, [role.clone()]).await.unwrap();
    let every_second = Schedule::cron("* * * * * *").unwrap();
    let ok = |_| async { Ok::<_, std::io::Error>(()) };
    // Runs an occurrence or two first (counting started).
    for _ in 0..20 {
        let _ = m.lead(&role, every_second.clone(), ok).await.unwrap();
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(m.store().pause(&role, "ops", "maintenance").await.unwrap());
    // The replica keeps polling while paused, as its loop does.
    for _ in 0..30 {
        let l = m.lead(&role, every_second.clone(), ok).await.unwrap();
        assert!(matches!(l, Lead::Refused(_)), "{l:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(m.store().unpause(&role).await.unwrap());
    let lead = m.lead(&role, every_second.clone(), ok).await.unwrap();
    assert!(matches!(lead, Lead::Completed { .. }), "{lead:?}");
    let owner = connect(&direct(&db)).await.unwrap();
    let rows = owner
        .query(
            "SELECT reason, error FROM leader_history WHERE role = 'billing' AND kind = 'skipped' ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    let skipped: Vec<(String, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
    assert!(
        skipped.iter().any(|(reason, _)| reason == "paused"),
        "the ~3 occurrences due while paused are recorded as paused: {skipped:?}"
    );
}

/// Issue 33, bug 2: a role whose every attempt fails records each
/// occurrence once: attempted, or inside exactly one `skipped` row. Before,
/// each term counted its skipped occurrences from the last *completed* one,
/// so every failed attempt was counted again by each later term.
#[tokio::test]
async fn an_attempted_occurrence_is_never_counted_as_skipped_and_none_is_counted_twice() {
    let db = migrated_db(PgCluster::shared()).await;
    let m = manager(&db).await;
    let every_second = Schedule::cron("* * * * * *")
        .unwrap()
        .retry(Retry {
            attempts: 1,
            ..Retry::default()
        })
        .unwrap();
    let mut attempted = Vec::new();
    while attempted.len() < 6 {
        if attempted.len() == 3 {
            // A downtime of about two occurrences: the next term passes them over.
            tokio::time::sleep(Duration::from_millis(2500)).await;
        }
        let lead = m
            .lead(&role(), every_second.clone(), |tick| {
                attempted.push(tick.occurrence().expect("a cron term"));
                async { Err::<(), _>(std::io::Error::other("always fails")) }
            })
            .await
            .unwrap();
        match lead {
            Lead::Failed { .. } => {}
            Lead::Refused(Refusal::NotDue { remaining, .. }) => tokio::time::sleep(remaining).await,
            other => panic!("{other:?}"),
        }
    }
    let owner = connect(&direct(&db)).await.unwrap();
    let rows = owner
        .query(
            "SELECT error FROM leader_history WHERE role = 'billing' AND kind = 'skipped' ORDER BY id",
            &[],
        )
        .await
        .unwrap();
    // "N occurrence(s) from A to B"
    let ranges: Vec<(u32, SystemTime, SystemTime)> = rows
        .iter()
        .map(|r| {
            let text: String = r.get(0);
            let words: Vec<&str> = text.split(' ').collect();
            (words[0].parse().unwrap(), utc(words[3]), utc(words[5]))
        })
        .collect();
    let (first, last) = (attempted[0], attempted[attempted.len() - 1]);
    let mut at = first;
    while at <= last {
        let tried = attempted.contains(&at);
        let skipped_in = ranges.iter().filter(|(_, a, b)| *a <= at && at <= *b).count();
        assert_eq!(
            (tried, skipped_in),
            (tried, usize::from(!tried)),
            "occurrence {at:?}: attempted {attempted:?}, skipped rows {ranges:?}"
        );
        at += Duration::from_secs(1);
    }
    let counted: u32 = ranges.iter().map(|r| r.0).sum();
    let between = (last.duration_since(first).unwrap().as_secs() + 1) as u32 - attempted.len() as u32;
    assert!(
        counted >= between && counted <= between + 2,
        "{counted} skipped for {between} passed over: {ranges:?}"
    );
}

/// Issue 33, bug 3: a crontab line that starts `ticklease run --once` just
/// after its own occurrence, on a role never run before, runs that
/// occurrence: a role's first occurrence may be up to a minute older than
/// its first look. Only the latest one runs, whatever the catch-up policy
/// (`All` here), and none before it is counted as skipped; an occurrence
/// older than the minute does not run (a new schedule does not run the past).
#[tokio::test]
async fn a_new_roles_first_look_runs_its_latest_occurrence_of_the_last_minute_alone() {
    let db = migrated_db(PgCluster::shared()).await;
    let m = manager(&db).await;
    let every_second = Schedule::cron("* * * * * *")
        .unwrap()
        .catch_up(CatchUp::All { max: 100 })
        .unwrap();
    let mut ran = None;
    let lead = m
        .lead(&role(), every_second, |tick| {
            ran = tick.occurrence();
            async { Ok::<_, std::io::Error>(()) }
        })
        .await
        .unwrap();
    assert!(matches!(lead, Lead::Completed { .. }), "{lead:?}");
    let owner = connect(&direct(&db)).await.unwrap();
    let age: f64 = scalar(
        &owner,
        &format!(
            "SELECT extract(epoch FROM acquired_at - '{}'::timestamptz)::float8 FROM leader_history
              WHERE role = 'billing' AND kind = 'term'",
            chrono::DateTime::<chrono::Utc>::from(ran.unwrap()).to_rfc3339()
        ),
    )
    .await;
    assert!(
        (0.0..1.0).contains(&age),
        "the latest occurrence runs, not an older one: {age} s old"
    );
    let skipped: i64 = scalar(
        &owner,
        "SELECT count(*) FROM leader_history WHERE kind = 'skipped'",
    )
    .await;
    assert_eq!(
        skipped, 0,
        "none before the first occurrence is counted as skipped"
    );
    // An occurrence older than the minute at the first look is passed over.
    let other = Role::new("dunning").unwrap();
    let m = Manager::start(m.store().clone(), test_config(), [other.clone()])
        .await
        .unwrap();
    // Hourly, at the minute half an hour away from now: its latest occurrence is about 30 minutes old.
    let minute = (SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs()
        / 60
        + 30)
        % 60;
    let hourly = Schedule::cron(&format!("{minute} * * * *")).unwrap();
    let lead = m
        .lead(&other, hourly, |_| async { Ok::<_, std::io::Error>(()) })
        .await
        .unwrap();
    assert!(matches!(lead, Lead::Refused(Refusal::NotDue { .. })), "{lead:?}");
}
