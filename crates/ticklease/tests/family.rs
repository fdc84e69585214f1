//! Role families (issue 13): keys spread over replicas, batched statements,
//! keys added and removed at run time, a stopped replica's keys taken over,
//! aggregate metrics. Real Postgres, except the statement counts under
//! paused time, which use the fake.

use std::collections::BTreeMap;
use std::time::Duration;

use prometheus_client::registry::Registry;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use ticklease::{
    Cancel, Config, Family, LeaseStatus, LeaseStore, Manager, Metrics, PgStore, PgStoreOptions, Role,
    Scheduler, Tick, Token,
};
use ticklease_testkit::{direct, migrated_db, test_config, Counting, FakeStore, PgCluster};

/// A tick's start or end, as its work reports it.
#[derive(Debug)]
enum Seen {
    Started(Role, Token),
    Ended(Role, Option<Cancel>),
}

struct EndReport(mpsc::UnboundedSender<Seen>, Tick);

impl Drop for EndReport {
    fn drop(&mut self) {
        let _ = self.0.send(Seen::Ended(self.1.role().clone(), self.1.cause()));
    }
}

/// Runs `family` on `manager`: each tick reports its start, holds its term
/// for `hold` (or until cancelled), and reports its end.
fn run_family<S: LeaseStore>(
    manager: Manager<S>,
    family: &Family,
    interval: Duration,
    hold: Duration,
) -> (mpsc::UnboundedReceiver<Seen>, CancellationToken) {
    let (seen, rx) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let scheduler = Scheduler::new(manager)
        .family(family, interval, move |tick| {
            let seen = seen.clone();
            async move {
                let _ = seen.send(Seen::Started(tick.role().clone(), tick.token()));
                // Reports when the work returns or is dropped (a lost term's is).
                let _report = EndReport(seen, tick.clone());
                tokio::select! {
                    _ = tokio::time::sleep(hold) => {}
                    _ = tick.cancelled() => {}
                }
                Ok::<_, std::io::Error>(())
            }
        })
        .unwrap();
    tokio::spawn(scheduler.run(stop.clone()));
    (rx, stop)
}

/// Waits for `n` tick starts (at most two minutes: a stalled family fails, not hangs).
async fn started(rx: &mut mpsc::UnboundedReceiver<Seen>, n: usize) -> Vec<(Role, Token)> {
    let mut terms = Vec::new();
    let wait = async {
        while terms.len() < n {
            match rx.recv().await.expect("the scheduler runs") {
                Seen::Started(role, token) => terms.push((role, token)),
                Seen::Ended(..) => {}
            }
        }
    };
    if tokio::time::timeout(Duration::from_secs(120), wait)
        .await
        .is_err()
    {
        panic!("{} of {n} ticks started within two minutes", terms.len());
    }
    terms
}

fn keys(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("k{i:03}")).collect()
}

fn family(n: usize) -> Family {
    let family = Family::new("fam").unwrap();
    family.set(keys(n)).unwrap();
    family
}

async fn pg(db: &tokio_postgres::Config, config: &Config) -> PgStore {
    PgStore::connect(db.clone(), PgStoreOptions::from_config(config))
        .await
        .unwrap()
}

async fn rows(store: &impl LeaseStore) -> Vec<LeaseStatus> {
    store.status().await.unwrap()
}

/// Live terms per holder.
fn held_by(rows: &[LeaseStatus]) -> BTreeMap<String, usize> {
    let mut by = BTreeMap::new();
    for row in rows.iter().filter(|r| r.held) {
        *by.entry(row.holder_id.clone().unwrap()).or_default() += 1;
    }
    by
}

/// Family terms started at different times still renew together: one
/// RENEW statement per heartbeat for all of them, not one per term.
#[tokio::test(start_paused = true)]
async fn family_terms_renew_in_one_statement_per_heartbeat() {
    let config = Config::default();
    let store = FakeStore::new();
    let manager = Manager::start(Counting::new(store.clone()), config, Vec::<Role>::new())
        .await
        .unwrap();
    let family = Family::new("fam").unwrap();
    let (mut seen, stop) = run_family(manager.clone(), &family, Duration::from_secs(3600), Duration::MAX);
    // Twenty keys added 700 ms apart: twenty different ACQUIRE instants.
    for key in keys(20) {
        family.add(&key).unwrap();
        started(&mut seen, 1).await;
        tokio::time::sleep(Duration::from_millis(700)).await;
    }
    let before = store.renew_sends().len();
    let beats = 10;
    tokio::time::sleep(config.heartbeat_every() * beats).await;
    let renews = store.renew_sends().len() - before;
    assert!(
        (beats as usize..=beats as usize + 1).contains(&renews),
        "{renews} RENEW statements in {beats} heartbeats for 20 terms"
    );
    assert_eq!(held_by(&rows(&store).await).values().sum::<usize>(), 20);
    stop.cancel();
}

/// A family's ACQUIREs are batched too: 200 keys due at once cost one
/// statement, and a replica holds at most its cap.
#[tokio::test(start_paused = true)]
async fn due_keys_are_acquired_in_one_statement_up_to_max_terms() {
    let config = Config::default();
    let store = Counting::new(FakeStore::new());
    let manager = Manager::start(store, config, Vec::<Role>::new()).await.unwrap();
    let family = family(200);
    family.set_max_terms(150).unwrap();
    let (mut seen, stop) = run_family(manager.clone(), &family, Duration::from_secs(3600), Duration::MAX);
    started(&mut seen, 150).await;
    tokio::time::sleep(config.lease_ttl() * 3).await;
    let held = held_by(&rows(manager.store()).await);
    assert_eq!(
        held.values().sum::<usize>(),
        150,
        "max_terms caps the terms: {held:?}"
    );
    let (acquires, _) = manager.store().counts();
    assert!(acquires <= 3, "{acquires} ACQUIRE statements for 200 keys");
    stop.cancel();
}

/// While another replica is registered, one takes no more than its fair
/// share plus a tenth, though every key is free and due.
#[tokio::test(start_paused = true)]
async fn a_replica_takes_no_more_than_its_fair_share_while_others_are_alive() {
    let config = Config::default();
    let store = FakeStore::new();
    let other = store.clone();
    tokio::spawn(async move {
        loop {
            other.beat("fam", "zz-other", config.lease_ttl()).await.unwrap();
            tokio::time::sleep(config.heartbeat_every()).await;
        }
    });
    let manager = Manager::start(store.clone(), config, Vec::<Role>::new())
        .await
        .unwrap();
    let (mut seen, stop) = run_family(manager, &family(40), Duration::from_secs(3600), Duration::MAX);
    started(&mut seen, 22).await;
    tokio::time::sleep(config.lease_ttl() * 3).await;
    let held = held_by(&rows(&store).await);
    assert_eq!(
        held.values().sum::<usize>(),
        22,
        "40 keys, 2 replicas: 20 + 2 at most: {held:?}"
    );
    stop.cancel();
}

/// A replica whose registry beats fail sleeps until its next beat, its due
/// keys untouched (alone it would count N = 1), and leads them once a beat
/// answers. Its loop used to wake at the keys' past due time over and over:
/// on a current-thread runtime that spin starved the beats' own I/O until
/// they timed out for good (a CI run hung 75 minutes through PgBouncer).
/// Under paused time a spin never lets the clock advance, so the test runs
/// on a thread of its own and fails if it does not finish in wall time.
#[test]
fn a_replica_whose_beat_fails_sleeps_until_its_next_beat() {
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        runtime.block_on(async {
            let config = Config::default();
            let store = FakeStore::new();
            store.fail_beats(3);
            let manager = Manager::start(store.clone(), config, Vec::<Role>::new())
                .await
                .unwrap();
            let started_at = Instant::now();
            let (mut seen, stop) = run_family(manager, &family(4), Duration::from_secs(3600), Duration::MAX);
            started(&mut seen, 4).await;
            let waited = started_at.elapsed();
            assert!(
                waited >= config.heartbeat_every() * 3,
                "led after {waited:?}, before the fourth beat"
            );
            stop.cancel();
        });
        let _ = done.send(());
    });
    finished
        .recv_timeout(Duration::from_secs(30))
        .expect("the family loop finished within 30 s of wall time (it spins while beats fail)");
}

/// Three replicas share thirty keys: each leads about ten (its preferred
/// keys), not whichever it reached first.
#[tokio::test]
async fn three_replicas_share_a_familys_keys_evenly() {
    let config = test_config();
    let db = migrated_db(PgCluster::shared()).await;
    let interval = Duration::from_millis(800);
    let mut stops = Vec::new();
    let mut runs = Vec::new();
    let mut holders = Vec::new();
    for _ in 0..3 {
        let manager = Manager::start(pg(&db, &config).await, config, Vec::<Role>::new())
            .await
            .unwrap();
        holders.push(manager.holder_id().to_string());
        let (seen, stop) = run_family(manager, &family(30), interval, Duration::from_millis(200));
        runs.push(seen);
        stops.push(stop);
    }
    let observer = pg(&db, &config).await;
    // Enough ticks that every key was due several times with all three
    // registered; no key's ticks overlap, whichever replica runs them.
    let mut ticks = 0;
    let mut running: BTreeMap<Role, usize> = BTreeMap::new();
    // About 6 s of ticks; a family that stops ticking fails here, not hangs.
    let deadline = Instant::now() + Duration::from_secs(60);
    while ticks < 30 * 5 {
        assert!(Instant::now() < deadline, "{ticks} ticks in 60 s");
        for run in &mut runs {
            while let Ok(seen) = run.try_recv() {
                match seen {
                    Seen::Started(role, _) => {
                        ticks += 1;
                        let n = running.entry(role.clone()).or_default();
                        *n += 1;
                        assert_eq!(*n, 1, "two ticks of {role} at once");
                    }
                    Seen::Ended(role, _) => *running.get_mut(&role).unwrap() -= 1,
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let mut owners: BTreeMap<String, usize> = BTreeMap::new();
    let mut elsewhere = 0;
    holders.sort();
    for row in rows(&observer)
        .await
        .iter()
        .filter(|r| r.role.starts_with("fam:"))
    {
        let owner = row.holder_id.clone().or(row.last_tick_holder.clone()).unwrap();
        // Key i is preferred by the replica of rank i mod 3 among the sorted holder ids.
        let index: usize = row.role["fam:k".len()..].parse().unwrap();
        elsewhere += usize::from(owner != holders[index % 3]);
        *owners.entry(owner).or_default() += 1;
    }
    assert_eq!(owners.len(), 3, "{owners:?}");
    assert!(
        owners.values().all(|n| (8..=12).contains(n)),
        "each replica leads about 10 of 30: {owners:?}"
    );
    assert!(
        elsewhere <= 3,
        "{elsewhere} of 30 keys last led by a replica that does not prefer them"
    );
    for stop in stops {
        stop.cancel();
    }
}

/// A loaded CI machine, through PgBouncer's pool of 2, took 1.5 s and then
/// more than 3 s (20 of 30 keys by then) to lead a dead replica's keys
/// again: the survivors' ACQUIRE after the death waits for the registry beat
/// and the pool. Cause of the slow runs not found (issue 22 note).
const TAKEOVER_BOUND: Duration = Duration::from_secs(7);

/// A replica that dies (its runtime stops: no RELEASE, its connections
/// close) has its keys led again by the others within [`TAKEOVER_BOUND`],
/// inside its 10 s leases: its coordination session's end is heard (by
/// leases alone the keys would wait at least the 10 s).
#[tokio::test]
async fn a_dead_replicas_keys_are_taken_over_at_once_by_the_others() {
    let config = Config::builder()
        .lease_ttl(Duration::from_secs(10))
        .heartbeat_every(Duration::from_secs(3))
        .statement_timeout(Duration::from_secs(2))
        .abandon_after(Duration::from_secs(6))
        .max_poll(Duration::from_secs(5))
        .build()
        .unwrap();
    let db = migrated_db(PgCluster::shared()).await;
    let coordinated = |db: tokio_postgres::Config| async move {
        pg(&db, &config).await.with_direct(direct(&db)).await.unwrap()
    };
    let hour = Duration::from_secs(3600);
    let victim_db = db.clone();
    let (victim_tx, victim_rx) = std::sync::mpsc::channel::<tokio::runtime::Runtime>();
    let (victim_up, mut victim_seen) = mpsc::unbounded_channel();
    // The victim runs on a runtime of its own, so it can be stopped dead.
    std::thread::spawn(move || {
        let runtime = tokio::runtime::Runtime::new().unwrap();
        runtime.block_on(async {
            let store = pg(&victim_db, &config)
                .await
                .with_direct(direct(&victim_db))
                .await
                .unwrap();
            let manager = Manager::start(store, config, Vec::<Role>::new()).await.unwrap();
            let (mut seen, stop) = run_family(manager, &family(30), hour, hour);
            std::mem::forget(stop);
            tokio::spawn(async move {
                while let Some(s) = seen.recv().await {
                    let _ = victim_up.send(s);
                }
            });
        });
        victim_tx.send(runtime).unwrap();
    });
    let runtime = victim_rx.recv().unwrap();
    let mut runs = Vec::new();
    for _ in 0..2 {
        let manager = Manager::start(coordinated(db.clone()).await, config, Vec::<Role>::new())
            .await
            .unwrap();
        runs.push(run_family(manager, &family(30), hour, hour));
    }
    let observer = pg(&db, &config).await;
    let all_held = |rows: &[LeaseStatus]| rows.iter().filter(|r| r.held).count() == 30;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !all_held(&rows(&observer).await) {
        assert!(
            Instant::now() < deadline,
            "30 keys led: {:?}",
            held_by(&rows(&observer).await)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut victim_terms = 0;
    while let Ok(seen) = victim_seen.try_recv() {
        victim_terms += usize::from(matches!(seen, Seen::Started(..)));
    }
    assert!(victim_terms > 0, "the victim leads some keys");
    let killed = Instant::now();
    runtime.shutdown_background();
    let mut taken = 0;
    while taken < victim_terms {
        for (seen, _) in &mut runs {
            while let Ok(s) = seen.try_recv() {
                taken += usize::from(matches!(s, Seen::Started(..)));
            }
        }
        // Waits past the bound to say when they were all led, for the record.
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "{taken} of the dead replica's {victim_terms} keys led again after {:?}",
            killed.elapsed()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(
        killed.elapsed() < TAKEOVER_BOUND,
        "the dead replica's {victim_terms} keys were led again after {:?}, not within {TAKEOVER_BOUND:?}",
        killed.elapsed()
    );
    let held = held_by(&rows(&observer).await);
    assert_eq!(held.len(), 2, "{held:?}");
    assert!(
        held.values().all(|n| (14..=16).contains(n)),
        "the survivors share 30: {held:?}"
    );
    for (_, stop) in runs {
        stop.cancel();
    }
}

/// A key removed at run time has its work cancelled with `Cancel::Removed`
/// and its term released (as interrupted); a key added is led.
#[tokio::test]
async fn a_removed_key_ends_its_term_cleanly_and_an_added_key_is_led() {
    let config = test_config();
    let (store, _) = ticklease_testkit::pg_store(&config).await;
    let manager = Manager::start(store, config, Vec::<Role>::new()).await.unwrap();
    let family = family(2);
    let hour = Duration::from_secs(3600);
    let (mut seen, stop) = run_family(manager.clone(), &family, hour, hour);
    started(&mut seen, 2).await;
    assert!(family.remove("k000"));
    let cause = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if let Seen::Ended(role, cause) = seen.recv().await.unwrap() {
                assert_eq!(role.as_str(), "fam:k000");
                break cause;
            }
        }
    })
    .await
    .expect("the removed key's work is cancelled");
    assert_eq!(cause, Some(Cancel::Removed));
    family.add("k002").unwrap();
    let (role, _) = started(&mut seen, 1).await.remove(0);
    assert_eq!(role.as_str(), "fam:k002");
    // The RELEASE follows the work's return.
    let deadline = Instant::now() + Duration::from_secs(1);
    let removed = loop {
        let removed = rows(manager.store())
            .await
            .into_iter()
            .find(|r| r.role == "fam:k000")
            .unwrap();
        if !removed.held || Instant::now() > deadline {
            break removed;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert!(!removed.held, "the removed key's term was released");
    assert_eq!(removed.last_outcome.as_deref(), Some("interrupted"));
    let rows = rows(manager.store()).await;
    assert!(rows.iter().find(|r| r.role == "fam:k001").unwrap().held);
    stop.cancel();
}

/// A key removed and added again while its cancelled term still runs is
/// led again once that term ends.
#[tokio::test]
async fn a_key_removed_and_added_again_is_led_again() {
    let config = test_config();
    let (store, _) = ticklease_testkit::pg_store(&config).await;
    let manager = Manager::start(store, config, Vec::<Role>::new()).await.unwrap();
    let family = family(1);
    let (seen, mut rx) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let scheduler = Scheduler::new(manager)
        .family(&family, Duration::from_secs(3600), move |tick| {
            let seen = seen.clone();
            async move {
                let _ = seen.send(Seen::Started(tick.role().clone(), tick.token()));
                let cause = tick.cancelled().await;
                let _ = seen.send(Seen::Ended(tick.role().clone(), Some(cause)));
                // Still running when the key comes back.
                tokio::time::sleep(Duration::from_millis(500)).await;
                Ok::<_, std::io::Error>(())
            }
        })
        .unwrap();
    tokio::spawn(scheduler.run(stop.clone()));
    let (_, first) = started(&mut rx, 1).await.remove(0);
    family.remove("k000");
    match rx.recv().await.unwrap() {
        Seen::Ended(_, cause) => assert_eq!(cause, Some(Cancel::Removed)),
        other => panic!("{other:?}"),
    }
    family.add("k000").unwrap();
    let again = tokio::time::timeout(Duration::from_secs(10), started(&mut rx, 1))
        .await
        .expect("the key is led again");
    assert!(again[0].1 > first, "a new term: {again:?}");
    stop.cancel();
}

/// A tick whose error text holds a NUL (Postgres text refuses it) is still
/// released, and so are the terms released in the same batch.
#[tokio::test]
async fn a_tick_error_with_a_nul_byte_does_not_cost_any_release() {
    let config = test_config();
    let (store, _) = ticklease_testkit::pg_store(&config).await;
    let manager = Manager::start(store, config, Vec::<Role>::new()).await.unwrap();
    let family = family(3);
    let stop = CancellationToken::new();
    let (done, mut finished) = mpsc::unbounded_channel();
    let scheduler = Scheduler::new(manager.clone())
        .family(&family, Duration::from_secs(3600), move |tick| {
            let done = done.clone();
            async move {
                tokio::time::sleep(Duration::from_millis(100)).await;
                let _ = done.send(());
                if tick.role().as_str() == "fam:k001" {
                    return Err(std::io::Error::other("bad \0 byte"));
                }
                Ok(())
            }
        })
        .unwrap();
    tokio::spawn(scheduler.run(stop.clone()));
    for _ in 0..3 {
        finished.recv().await.unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(5);
    let rows = loop {
        let rows = rows(manager.store()).await;
        if rows.iter().all(|r| !r.held) || Instant::now() > deadline {
            break rows;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    for row in &rows {
        assert!(!row.held, "{} released", row.role);
        let failed = row.role == "fam:k001";
        assert_eq!(row.last_tick_ended_at.is_some(), !failed, "{}", row.role);
        assert_eq!(
            row.last_outcome.as_deref(),
            Some(if failed { "failed" } else { "completed" })
        );
    }
    stop.cancel();
}

/// Work that ignores its cancellation is dropped after the shutdown grace,
/// and every term is released before `run` returns.
#[tokio::test]
async fn shutdown_releases_every_family_term_before_run_returns_even_when_work_hangs() {
    let config = test_config();
    let (store, _) = ticklease_testkit::pg_store(&config).await;
    let manager = Manager::start(store, config, Vec::<Role>::new()).await.unwrap();
    let (up, mut started_work) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let scheduler = Scheduler::new(manager.clone())
        .shutdown_timeout(Duration::from_millis(100))
        .family(&family(5), Duration::from_secs(3600), move |_tick| {
            let _ = up.send(());
            std::future::pending::<Result<(), std::io::Error>>()
        })
        .unwrap();
    let run = tokio::spawn(scheduler.run(stop.clone()));
    for _ in 0..5 {
        started_work.recv().await.unwrap();
    }
    stop.cancel();
    let stopped = run.await.unwrap();
    assert!(!stopped.loops_finished);
    let held: Vec<String> = rows(manager.store())
        .await
        .into_iter()
        .filter(|r| r.held)
        .map(|r| r.role)
        .collect();
    assert!(
        held.is_empty() && stopped.all_released(),
        "{stopped}: still held {held:?}"
    );
}

/// Pausing one key ends that key's term only; the batch RENEW goes on for the others.
#[tokio::test]
async fn pausing_one_key_ends_only_its_term() {
    let config = test_config();
    let (store, _) = ticklease_testkit::pg_store(&config).await;
    let manager = Manager::start(store, config, Vec::<Role>::new()).await.unwrap();
    let hour = Duration::from_secs(3600);
    let (mut seen, stop) = run_family(manager.clone(), &family(3), hour, hour);
    let terms = started(&mut seen, 3).await;
    let paused = Role::new("fam:k001").unwrap();
    assert!(manager.store().pause(&paused, "ops", "test").await.unwrap());
    let cause = loop {
        if let Seen::Ended(role, cause) = seen.recv().await.unwrap() {
            assert_eq!(role, paused, "only the paused key's tick ends");
            break cause;
        }
    };
    assert_eq!(cause, Some(Cancel::LeaseLost(ticklease::LossReason::Paused)));
    // Two more heartbeats: the others' terms are renewed, tokens unchanged.
    tokio::time::sleep(config.heartbeat_every() * 2).await;
    let rows = rows(manager.store()).await;
    for (role, token) in terms.iter().filter(|(r, _)| *r != paused) {
        let row = rows.iter().find(|r| r.role == role.as_str()).unwrap();
        assert!(row.held && row.token == *token, "{role} still led in its term");
    }
    assert!(seen.try_recv().is_err(), "no other tick ended");
    stop.cancel();
}

/// By default a family exports aggregates, not one series per key.
#[tokio::test]
async fn a_family_exports_aggregates_not_per_key_series() {
    let config = test_config();
    let (store, _) = ticklease_testkit::pg_store(&config).await;
    let mut registry = Registry::with_prefix("ticklease");
    let metrics = Metrics::register(&mut registry, Vec::<Role>::new());
    let manager = Manager::start_with_metrics(store, config, Vec::<Role>::new(), metrics.clone())
        .await
        .unwrap();
    let interval = Duration::from_millis(500);
    let (mut seen, stop) = run_family(manager.clone(), &family(4), interval, Duration::from_secs(3600));
    started(&mut seen, 4).await;
    metrics.refresh(manager.store()).await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    assert!(
        text.contains("ticklease_leader_family_leading{family=\"fam\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("ticklease_leader_family_never_ran{family=\"fam\"} 4"),
        "{text}"
    );
    assert!(
        text.contains("ticklease_leader_family_tick_interval_seconds{family=\"fam\"} 0.5"),
        "{text}"
    );
    assert!(
        !text.contains("role=\"fam:"),
        "no per-key series by default: {text}"
    );
    stop.cancel();
}

/// A batched ACQUIRE that takes over a term never released records that
/// term as lost (expired), as the one-row ACQUIRE does, and only once.
#[tokio::test]
async fn a_batched_takeover_records_the_old_term_as_expired() {
    use ticklease::{Acquire, HistoryKind, HistoryStore};
    let config = test_config();
    let (store, _) = ticklease_testkit::pg_store(&config).await;
    let roles: Vec<Role> = ["fam:a", "fam:b"].map(|r| Role::new(r).unwrap()).to_vec();
    let ttl = Duration::from_millis(300);
    let interval = Duration::from_millis(1);
    let mut old = Vec::new();
    for role in &roles {
        match store.acquire(role, "gone", ttl, interval).await.unwrap() {
            Acquire::Acquired(term) => old.push(term.token),
            other => panic!("{other:?}"),
        }
    }
    tokio::time::sleep(ttl * 2).await;
    let answers = store
        .acquire_many(&roles, "me", config.lease_ttl(), interval, 10)
        .await
        .unwrap();
    assert!(
        answers.iter().all(|(_, a)| matches!(a, Acquire::Acquired(_))),
        "{answers:?}"
    );
    for (role, token) in roles.iter().zip(old) {
        let lost: Vec<_> = store
            .history(Some(role), Duration::from_secs(3600), 100)
            .await
            .unwrap()
            .into_iter()
            .filter_map(|e| match e.kind {
                HistoryKind::Term {
                    token: t,
                    outcome,
                    reason,
                    ..
                } if t == token.get() => Some((outcome, reason)),
                _ => None,
            })
            .collect();
        assert_eq!(
            lost,
            [("lost".to_string(), Some("expired".to_string()))],
            "{role}"
        );
    }
}

/// A follower does not re-ask about the keys another live replica holds
/// and prefers each time their leases' expiry passes: the preferred
/// replica watches those, and the session's end or the registry wakes it.
#[tokio::test]
async fn a_follower_does_not_poll_keys_a_live_replica_holds_and_prefers() {
    let config = test_config();
    let db = migrated_db(PgCluster::shared()).await;
    let hour = Duration::from_secs(3600);
    let mut managers = Vec::new();
    for _ in 0..2 {
        let store = pg(&db, &config).await.with_direct(direct(&db)).await.unwrap();
        let manager = Manager::start(Counting::new(store), config, Vec::<Role>::new())
            .await
            .unwrap();
        // Registered before either leads: each takes its own share.
        manager
            .store()
            .beat("fam", manager.holder_id(), config.lease_ttl())
            .await
            .unwrap();
        managers.push(manager);
    }
    let runs: Vec<_> = managers
        .iter()
        .map(|m| run_family(m.clone(), &family(20), hour, hour))
        .collect();
    let observer = pg(&db, &config).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let held = held_by(&rows(&observer).await);
        if held.len() == 2 && held.values().sum::<usize>() == 20 {
            break;
        }
        assert!(Instant::now() < deadline, "20 keys over 2 replicas: {held:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let before: Vec<usize> = managers.iter().map(|m| m.store().counts().0).collect();
    // Three lease TTLs: a follower polling by expiry would ask about the other's keys each time.
    tokio::time::sleep(config.lease_ttl() * 3).await;
    let asked: Vec<usize> = managers
        .iter()
        .zip(before)
        .map(|(m, b)| m.store().counts().0 - b)
        .collect();
    assert!(
        asked.iter().all(|n| *n <= 1),
        "ACQUIREs per replica in 3 TTLs: {asked:?}"
    );
    for (_, stop) in runs {
        stop.cancel();
    }
}

/// Item 10 of issue 22: one statement of 1,000 beats with a 24 h TTL
/// registered phantoms that cut a real replica's cap for a day. A
/// registration now lives at most REGISTRATION_TTL_MAX past its beat, and a
/// beat returns at most 1,000 replicas, the caller always among them.
#[tokio::test]
async fn phantom_registrations_live_a_minute_and_a_beat_returns_a_bounded_list() {
    let db = migrated_db(PgCluster::shared()).await;
    let owner = ticklease_testkit::connect(&direct(&db)).await.unwrap();
    owner
        .batch_execute(
            "SELECT count(*) FROM generate_series(1, 1500) g,
                    LATERAL leader_replica_beat('tenant', 'phantom:' || lpad(g::text, 5, '0'), 86400000, NULL)",
        )
        .await
        .unwrap();
    let longest: f64 = ticklease_testkit::scalar(
        &owner,
        "SELECT extract(epoch FROM max(expires_at) - now())::float8 FROM leader_replicas",
    )
    .await;
    assert!(
        longest <= ticklease::REGISTRATION_TTL_MAX.as_secs_f64() + 1.0,
        "a registration lives {longest} s"
    );
    let config = test_config();
    let store = pg(&db, &config).await;
    let live = store
        .beat("tenant", "zzz:real", Duration::from_secs(86_400))
        .await
        .unwrap();
    assert_eq!(live.len(), 1000);
    assert!(live.iter().any(|h| h == "zzz:real"), "the caller is among them");
    assert!(live.windows(2).all(|w| w[0] < w[1]), "ordered by holder id");
}

/// A family on an interval with a retry policy: a key whose work returned
/// `Err` runs again after the backoff (not an hour later), the attempts of
/// one round at most; the other keys complete once.
#[tokio::test]
async fn a_family_key_that_failed_is_retried_after_its_backoff_and_its_attempts_are_bounded() {
    let config = test_config();
    let (store, _) = ticklease_testkit::pg_store(&config).await;
    let manager = Manager::start(store, config, Vec::<Role>::new()).await.unwrap();
    let family = family(2);
    let hourly = ticklease::Schedule::every(Duration::from_secs(3600))
        .retry(ticklease::Retry {
            attempts: 3,
            backoff: Duration::from_millis(100),
            backoff_max: Duration::from_millis(200),
        })
        .unwrap();
    let stop = CancellationToken::new();
    let (ran, mut runs) = mpsc::unbounded_channel();
    let scheduler = Scheduler::new(manager.clone())
        .family(&family, hourly, move |tick| {
            let ran = ran.clone();
            async move {
                let _ = ran.send((tick.role().to_string(), Instant::now()));
                match tick.role().as_str() {
                    "fam:k001" => Err(std::io::Error::other("the provider is down")),
                    _ => Ok(()),
                }
            }
        })
        .unwrap();
    tokio::spawn(scheduler.run(stop.clone()));
    let mut failing = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while failing.len() < 3 {
        let (role, at) = tokio::time::timeout_at(deadline, runs.recv())
            .await
            .expect("three attempts of the failing key within 10 s")
            .unwrap();
        if role == "fam:k001" {
            failing.push(at);
        }
    }
    // Spent: no fourth attempt within a few heartbeats.
    let more = tokio::time::timeout(Duration::from_secs(2), async {
        loop {
            if runs.recv().await.unwrap().0 == "fam:k001" {
                break;
            }
        }
    })
    .await;
    stop.cancel();
    assert!(
        more.is_err(),
        "the attempts are spent: the key waits its interval"
    );
    let gaps: Vec<Duration> = failing.windows(2).map(|w| w[1] - w[0]).collect();
    assert!(
        gaps.iter()
            .all(|g| *g >= Duration::from_millis(90) && *g < Duration::from_secs(2)),
        "retried after the backoff: {gaps:?}"
    );
}

/// A family on a cron schedule: two replicas, every key runs each
/// occurrence once (the latest, its instant as `Tick::occurrence`), in
/// batched statements; a key whose counting started long ago records the
/// occurrences it passed over as skipped, those due while it was paused
/// apart.
#[tokio::test]
async fn a_cron_familys_keys_each_run_every_occurrence_once_across_replicas() {
    let config = test_config();
    let (first, db) = ticklease_testkit::pg_store(&config).await;
    let owner = ticklease_testkit::connect(&direct(&db)).await.unwrap();
    owner
        .batch_execute(
            "SELECT leader_seed(ARRAY['fam:k000', 'fam:k001']);
             UPDATE leader_leases SET occurrences_since = now() - interval '10.5 seconds'
              WHERE role IN ('fam:k000', 'fam:k001');
             UPDATE leader_leases SET last_paused_at = now() - interval '10.2 seconds',
                    last_unpaused_at = now() - interval '5.5 seconds'
              WHERE role = 'fam:k001';",
        )
        .await
        .unwrap();
    let every_second = ticklease::Schedule::cron("* * * * * *").unwrap();
    let family = family(4);
    let (ran, mut runs) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    for store in [first, pg(&db, &config).await] {
        let manager = Manager::start(store, config, Vec::<Role>::new()).await.unwrap();
        let ran = ran.clone();
        let scheduler = Scheduler::new(manager)
            .family(&family, every_second.clone(), move |tick| {
                let ran = ran.clone();
                async move {
                    let _ = ran.send((tick.role().to_string(), tick.occurrence(), tick.token()));
                    Ok::<_, std::io::Error>(())
                }
            })
            .unwrap();
        tokio::spawn(scheduler.run(stop.clone()));
    }
    let mut seen: BTreeMap<(String, std::time::SystemTime), usize> = BTreeMap::new();
    let deadline = Instant::now() + Duration::from_secs(4);
    while let Ok(Some((role, occurrence, _))) = tokio::time::timeout_at(deadline, runs.recv()).await {
        *seen
            .entry((role, occurrence.expect("a cron term runs an occurrence")))
            .or_default() += 1;
    }
    stop.cancel();
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "each occurrence once per key: {twice:?}");
    for key in keys(4) {
        let runs = seen
            .keys()
            .filter(|(role, _)| *role == format!("fam:{key}"))
            .count();
        assert!(runs >= 2, "{key} ran {runs} occurrences in 4 s: {seen:?}");
    }
    let skipped: Vec<(String, String)> = owner
        .query(
            "SELECT role, reason || ': ' || error FROM leader_history WHERE kind = 'skipped' ORDER BY role, reason",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let roles: Vec<&str> = skipped.iter().map(|(r, _)| r.as_str()).collect();
    assert_eq!(
        roles,
        ["fam:k000", "fam:k001", "fam:k001"],
        "only keys counting since long ago: {skipped:?}"
    );
    let starts = |text: &str, counts: &[u32], reason: &str| {
        counts
            .iter()
            .any(|n| text.starts_with(&format!("{reason}: {n} occurrences from ")))
    };
    assert!(starts(&skipped[0].1, &[9, 10], "catch_up"), "{skipped:?}");
    assert!(starts(&skipped[1].1, &[4, 5, 6], "catch_up"), "{skipped:?}");
    assert!(starts(&skipped[2].1, &[4, 5, 6], "paused"), "{skipped:?}");
}

/// A family's cron schedule runs the latest occurrence of each key: other
/// catch-up policies and a starting deadline are refused up front.
#[tokio::test]
async fn a_familys_cron_schedule_with_another_catch_up_policy_is_refused() {
    let manager = Manager::start(FakeStore::default(), test_config(), Vec::<Role>::new())
        .await
        .unwrap();
    let hourly = ticklease::Schedule::cron("0 * * * *").unwrap();
    for schedule in [
        hourly
            .clone()
            .catch_up(ticklease::CatchUp::All { max: 3 })
            .unwrap(),
        hourly.clone().starting_deadline(Duration::from_secs(60)).unwrap(),
    ] {
        let refused = Scheduler::new(manager.clone())
            .family(&family(1), schedule, |_| async { Ok::<_, std::io::Error>(()) });
        assert!(
            matches!(
                &refused,
                Err(ticklease::Error::Schedule {
                    source: ticklease::ScheduleError::NotForFamily { .. },
                    ..
                })
            ),
            "{:?}",
            refused.err()
        );
    }
    assert!(Scheduler::new(manager)
        .family(&family(1), hourly, |_| async { Ok::<_, std::io::Error>(()) })
        .is_ok());
}

/// A single-replica cron family without a coordination session: a term
/// lost to a pause (from psql, which notifies no one) is asked about again at
/// once, and its occurrence runs again once unpaused (review finding: the key
/// slept until the next occurrence, which passed the lost one over).
#[tokio::test]
async fn a_cron_family_key_whose_term_was_lost_is_asked_about_again_at_once() {
    let config = test_config();
    let (store, db) = ticklease_testkit::pg_store(&config).await;
    let owner = ticklease_testkit::connect(&direct(&db)).await.unwrap();
    owner
        .batch_execute(
            "SELECT leader_seed(ARRAY['fam:k000']);
             UPDATE leader_leases SET occurrences_since = date_trunc('hour', now()) - interval '1 minute'
              WHERE role = 'fam:k000';",
        )
        .await
        .unwrap();
    let manager = Manager::start(store, config, Vec::<Role>::new()).await.unwrap();
    let family = Family::new("fam").unwrap();
    family.set(vec!["k000".to_string()]).unwrap();
    let hourly = ticklease::Schedule::cron("0 * * * *").unwrap();
    let (ran, mut runs) = mpsc::unbounded_channel();
    let stop = CancellationToken::new();
    let scheduler = Scheduler::new(manager)
        .family(&family, hourly, move |tick| {
            let ran = ran.clone();
            async move {
                let _ = ran.send(tick.occurrence());
                tokio::select! {
                    _ = tick.cancelled() => {}
                    _ = tokio::time::sleep(Duration::from_secs(3)) => {}
                }
                Ok::<_, std::io::Error>(())
            }
        })
        .unwrap();
    tokio::spawn(scheduler.run(stop.clone()));
    let first = tokio::time::timeout(Duration::from_secs(5), runs.recv())
        .await
        .unwrap()
        .unwrap();
    // An operator pauses and unpauses from psql (notifies no one): the term is lost.
    owner
        .batch_execute("SELECT leader_pause('fam:k000', 'ops', 'blip')")
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    owner
        .batch_execute("SELECT leader_unpause('fam:k000')")
        .await
        .unwrap();
    let acquirable: bool = ticklease_testkit::scalar(
        &owner,
        "SELECT holder_id IS NULL AND paused_at IS NULL AND coalesce(not_before <= now(), true)
                AND last_occurrence IS NULL FROM leader_leases WHERE role = 'fam:k000'",
    )
    .await;
    assert!(
        acquirable,
        "the occurrence is not completed and the row acquirable"
    );
    let again = tokio::time::timeout(Duration::from_secs(20), runs.recv()).await;
    stop.cancel();
    assert!(
        again.is_ok_and(|a| a == Some(first)),
        "the lost occurrence runs again (max_poll is 200 ms)"
    );
}

/// The batched ACQUIRE of an occurrence locks no row it does not start
/// (review finding: its first-ask upsert locked every row it was given, so
/// a batch waited on, and held up, terms of other replicas).
#[tokio::test]
async fn a_cron_batch_locks_no_row_it_does_not_start() {
    let db = migrated_db(PgCluster::shared()).await;
    let first = ticklease_testkit::connect(&direct(&db)).await.unwrap();
    let ask = "SELECT count(*) FROM leader_acquire_many(ARRAY['fam:a', 'fam:b'], 'r1', 60000, NULL, NULL, 0,
                 date_trunc('second', now()) - interval '1 second', date_trunc('second', now()) + interval '1 second',
                 'CRON_TZ=UTC * * * * * *', date_trunc('second', now()) + interval '1 second', NULL)";
    // The first ask starts counting; the second, in an open transaction, starts nothing.
    first.batch_execute(ask).await.unwrap();
    first.batch_execute(&format!("BEGIN; {ask}")).await.unwrap();
    let other = ticklease_testkit::connect(&direct(&db)).await.unwrap();
    let locked = other
        .batch_execute("SELECT 1 FROM leader_leases WHERE role IN ('fam:a', 'fam:b') FOR UPDATE NOWAIT")
        .await;
    first.batch_execute("COMMIT").await.unwrap();
    assert!(locked.is_ok(), "a row was locked: {locked:?}");
}

/// On an interval the batched ACQUIRE takes no cron arguments and records
/// no schedule (review finding: a schedule text made an interval role look
/// like a cron role, so run-now stopped clearing its cooldown).
#[tokio::test]
async fn an_interval_batch_refuses_a_schedule_and_records_none() {
    let db = migrated_db(PgCluster::shared()).await;
    let owner = ticklease_testkit::connect(&direct(&db)).await.unwrap();
    let refused = owner
        .batch_execute(
            "SELECT count(*) FROM leader_acquire_many(ARRAY['fam:x'], 'r1', 1000, 1000, NULL, 1, NULL, NULL,
                     'CRON_TZ=UTC 0 * * * *', NULL, NULL)",
        )
        .await;
    assert!(refused.is_err(), "a schedule on an interval is refused");
    owner
        .batch_execute(
            "SELECT count(*) FROM leader_acquire_many(ARRAY['fam:x'], 'r1', 1000, 1000, NULL, 1, NULL, NULL, NULL, NULL, NULL)",
        )
        .await
        .unwrap();
    let schedule: Option<String> = owner
        .query_one("SELECT schedule FROM leader_leases WHERE role = 'fam:x'", &[])
        .await
        .unwrap()
        .get(0);
    assert_eq!(schedule, None);
}

/// A key's skipped records count exactly, except the reason whose oldest
/// occurrence the caller's list did not reach back past (review finding:
/// "more than" was written on every reason's record).
#[tokio::test]
async fn a_cron_batch_counts_skipped_occurrences_exactly_where_its_list_reaches() {
    let db = migrated_db(PgCluster::shared()).await;
    let owner = ticklease_testkit::connect(&direct(&db)).await.unwrap();
    owner
        .batch_execute(
            "SELECT leader_seed(ARRAY['fam:k']);
             CREATE TEMP TABLE at AS SELECT date_trunc('second', now()) AS x;
             UPDATE leader_leases SET occurrences_since = (SELECT x FROM at) - interval '2000 seconds',
                    last_paused_at = (SELECT x FROM at) - interval '600 seconds',
                    last_unpaused_at = (SELECT x FROM at) - interval '10 seconds'
              WHERE role = 'fam:k';
             SELECT count(*) FROM leader_acquire_many(ARRAY['fam:k'], 'r1', 60000, NULL, NULL, 1,
                 (SELECT x FROM at), (SELECT x FROM at) + interval '1 second', 'CRON_TZ=UTC * * * * * *',
                 (SELECT x FROM at) + interval '1 second',
                 ARRAY(SELECT (SELECT x FROM at) - i * interval '1 second' FROM generate_series(1000, 1, -1) AS i));",
        )
        .await
        .unwrap();
    let rows: Vec<(String, String)> = owner
        .query(
            "SELECT reason, error FROM leader_history WHERE kind = 'skipped' ORDER BY reason",
            &[],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    assert_eq!(rows.len(), 2, "{rows:?}");
    assert!(
        rows[0].1.starts_with("more than 410 occurrences from "),
        "{rows:?}"
    );
    assert!(rows[1].1.starts_with("590 occurrences from "), "{rows:?}");
}
