//! Role families under load, kept apart from `family.rs`'s timing checks (a
//! test binary's tests run at once): batched ACQUIREs of the same new keys
//! from three replicas, and a Postgres restart under a family's waiters.

use std::time::Duration;

use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use ticklease::{Config, Family, LeaseStore, Manager, PgStore, PgStoreOptions, Role, Scheduler, Token};
use ticklease_testkit::{migrated_db, PgCluster};

/// A tick's start, as its work reports it.
#[derive(Debug)]
enum Seen {
    Started(Role, Token),
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

/// Waits for `n` tick starts.
async fn started(rx: &mut mpsc::UnboundedReceiver<Seen>, n: usize) -> Vec<(Role, Token)> {
    let mut terms = Vec::new();
    while terms.len() < n {
        match rx.recv().await.expect("the scheduler runs") {
            Seen::Started(role, token) => terms.push((role, token)),
        }
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

/// Item 15 of issue 22: replicas declaring the same new keys at once ask
/// for them in different orders (each its preferred keys first). The rows
/// they create must be created in role order too, or two batched ACQUIREs
/// deadlock on each other's uncommitted rows.
#[tokio::test]
async fn batched_acquires_of_the_same_new_keys_in_different_orders_never_deadlock() {
    let db = migrated_db(PgCluster::shared()).await;
    // A deadlock is found after deadlock_timeout (1 s): the statements wait longer.
    let config = Config::default();
    let stores = [
        pg(&db, &config).await,
        pg(&db, &config).await,
        pg(&db, &config).await,
    ];
    for round in 0..20 {
        let keys: Vec<Role> = (0..200)
            .map(|k| Role::new(format!("tenant:r{round}k{k:03}")).unwrap())
            .collect();
        let asks = stores.iter().enumerate().map(|(i, store)| {
            // Each replica's order: its third of the keys first, then the rest reversed.
            let mut order: Vec<Role> = keys.iter().skip(i).step_by(3).cloned().collect();
            let rest: Vec<Role> = keys
                .iter()
                .rev()
                .filter(|k| !order.contains(k))
                .cloned()
                .collect();
            order.extend(rest);
            let holder = format!("replica:{i}");
            async move {
                store
                    .acquire_many(
                        &order,
                        &holder,
                        Duration::from_secs(30),
                        Duration::from_millis(1),
                        200,
                    )
                    .await
            }
        });
        let answers = futures::future::join_all(asks).await;
        let mut won = 0;
        for answer in answers {
            let answer = answer.unwrap_or_else(|e| panic!("round {round}: {e:?}"));
            won += answer
                .iter()
                .filter(|(_, a)| matches!(a, ticklease::Acquire::Acquired(_)))
                .count();
        }
        assert_eq!(won, 200, "round {round}: each key led exactly once");
    }
}

/// Item 7 of issue 22: a family loop's waiter that failed was never retried
/// and kept its slot, so after a Postgres restart (which fails them all at
/// once) the replica never waited on any key again and took over only when
/// the leases ran out. Sixteen keys held by sixteen holders that die with
/// the restart: their waiters wait again, find the keys gone, and the
/// replica leads every key within seconds.
#[tokio::test]
async fn after_a_postgres_restart_a_familys_waiters_wait_again_and_take_over() {
    let cluster = PgCluster::start().unwrap();
    let name = cluster.create_database().await.unwrap();
    let db = cluster.config(&name);
    ticklease::migrate(&mut ticklease_testkit::connect(&db).await.unwrap())
        .await
        .unwrap();
    // Sixteen holders, each a session holding a coordination key of its own
    // and a term of an hour on one key.
    let mut holders = Vec::new();
    for i in 0..ticklease::KEY_WAITERS_MAX {
        let holder = ticklease_testkit::connect(&db).await.unwrap();
        holder
            .batch_execute(&format!(
                "SELECT pg_advisory_lock((pg_backend_pid()::bigint << 32) | {i});
                 INSERT INTO leader_leases (role, holder_id, acquired_at, expires_at, holder_key)
                 VALUES ('fam:k{i:03}', 'holder:{i}', now(), now() + interval '1 hour',
                         (pg_backend_pid()::bigint << 32) | {i})"
            ))
            .await
            .unwrap();
        holders.push(holder);
    }
    let config = Config::default();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap()
        .with_direct(db.clone())
        .await
        .unwrap();
    let manager = Manager::start(store, config, Vec::<Role>::new()).await.unwrap();
    let fam = family(ticklease::KEY_WAITERS_MAX);
    let (mut seen, stop) = run_family(manager, &fam, Duration::from_secs(3600), Duration::MAX);
    let observer = ticklease_testkit::connect(&db).await.unwrap();
    let waiting =
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 AND NOT granted";
    let deadline = Instant::now() + Duration::from_secs(20);
    while ticklease_testkit::scalar::<i64>(&observer, waiting).await < ticklease::KEY_WAITERS_MAX as i64 {
        assert!(
            Instant::now() < deadline,
            "the replica waits on every holder's key"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop((observer, holders));
    cluster.restart().unwrap();
    let restarted = Instant::now();
    let led = tokio::time::timeout(
        Duration::from_secs(15),
        started(&mut seen, ticklease::KEY_WAITERS_MAX),
    )
    .await;
    assert!(
        led.is_ok(),
        "every key led within 15 s of the restart: {:?}",
        restarted.elapsed()
    );
    // The failed waiters' slots are free again: a new key held by another
    // holder is waited on, and taken over as soon as that holder dies.
    let holder = ticklease_testkit::connect(&db).await.unwrap();
    holder
        .batch_execute(
            "SELECT pg_advisory_lock((pg_backend_pid()::bigint << 32) | 99);
             INSERT INTO leader_leases (role, holder_id, acquired_at, expires_at, holder_key)
             VALUES ('fam:late', 'holder:late', now(), now() + interval '1 hour',
                     (pg_backend_pid()::bigint << 32) | 99)",
        )
        .await
        .unwrap();
    fam.add("late").unwrap();
    let observer = ticklease_testkit::connect(&db).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    while ticklease_testkit::scalar::<i64>(&observer, waiting).await < 1 {
        assert!(
            Instant::now() < deadline,
            "no waiter for a new holder's key after the restart: the failed waiters kept their slots"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    drop(holder);
    let late = tokio::time::timeout(Duration::from_secs(5), started(&mut seen, 1))
        .await
        .expect("the dead holder's key taken over at once");
    assert_eq!(late[0].0.as_str(), "fam:late");
    stop.cancel();
}
