//! Drills on real processes: a leader killed without RELEASE is taken over
//! within TTL + MaxPoll.

use std::convert::Infallible;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ticklease::{Lead, Manager, PgStore, PgStoreOptions, Role};
use ticklease_testkit::{migrated_db, test_config, PgCluster};

#[tokio::test]
async fn sigkilled_leader_is_taken_over_within_ttl_plus_max_poll() {
    let cluster = PgCluster::shared();
    let db = migrated_db(cluster).await;
    let name = db.get_dbname().unwrap().to_string();
    let config = test_config();
    let role = Role::new("billing").unwrap();
    let store = PgStore::connect(db, PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let follower = Manager::start(store, config, [role.clone()]).await.unwrap();
    let bound = config.lease_ttl() + config.max_poll() + Duration::from_millis(800);

    let mut takeovers = Vec::new();
    for trial in 0..3 {
        let mut child = Command::new(env!("CARGO_BIN_EXE_ticklease-testkit-leader"))
            .args([cluster.url(&name), role.to_string()])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut line = String::new();
        BufReader::new(child.stdout.take().unwrap())
            .read_line(&mut line)
            .unwrap();
        let child_token: i64 = line
            .trim()
            .strip_prefix("LEADING ")
            .expect("LEADING line")
            .parse()
            .unwrap();
        // Let a few heartbeats land so the kill is mid-term, not at its start.
        tokio::time::sleep(config.heartbeat_every() * 2).await;
        child.kill().unwrap(); // SIGKILL: no RELEASE
        let killed = Instant::now();
        child.wait().unwrap();
        let token = loop {
            match follower
                .lead(&role, Duration::from_millis(1), |t| async move {
                    Ok::<_, Infallible>(t.token())
                })
                .await
            {
                Ok(Lead::Completed { value, .. }) => break value,
                Ok(_) => {}
                Err(e) => panic!("{e}"),
            }
            assert!(
                killed.elapsed() < bound * 2,
                "no takeover after {:?}",
                killed.elapsed()
            );
            tokio::time::sleep(config.max_poll()).await;
        };
        let took = killed.elapsed();
        println!("trial {trial}: SIGKILL → takeover in {took:?} (bound {bound:?})");
        assert!(token.0 > child_token);
        assert!(took <= bound, "takeover took {took:?}, bound {bound:?}");
        takeovers.push(took);
    }
    takeovers.sort();
    println!(
        "SIGKILL takeover over {} trials: min {:?}, max {:?}",
        takeovers.len(),
        takeovers[0],
        takeovers[takeovers.len() - 1]
    );
}

#[tokio::test]
async fn terminated_backends_are_missed_beats_and_the_term_survives() {
    let cluster = PgCluster::shared();
    let db = migrated_db(cluster).await;
    let name = db.get_dbname().unwrap().to_string();
    let config = test_config();
    let role = Role::new("dunning").unwrap();
    let store = PgStore::connect(db, PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let m = Manager::start(store, config, [role.clone()]).await.unwrap();
    let lead = m
        .lead(&role, Duration::from_secs(3600), |_| async {
            for _ in 0..2 {
                tokio::time::sleep(config.heartbeat_every() * 2).await;
                assert!(cluster.terminate_backends(&name).await.unwrap() > 0);
            }
            // Outlive the TTL: only renewals on fresh connections keep the term.
            tokio::time::sleep(config.lease_ttl()).await;
            Ok::<_, Infallible>(())
        })
        .await
        .unwrap();
    assert!(matches!(lead, Lead::Completed { .. }), "{lead:?}");
}

#[tokio::test]
async fn a_restarted_postmaster_is_led_again_within_the_takeover_bound() {
    let cluster = PgCluster::start().unwrap();
    let db = migrated_db(&cluster).await;
    let config = test_config();
    let role = Role::new("webhook_delivery").unwrap();
    let store = PgStore::connect(db, PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let m = Manager::start(store, config, [role.clone()]).await.unwrap();
    let tick = |m: Manager<PgStore>, role: Role| async move {
        m.lead(&role, Duration::from_millis(1), |_| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Ok::<_, Infallible>(())
        })
        .await
    };
    assert!(matches!(
        tick(m.clone(), role.clone()).await,
        Ok(Lead::Completed { .. })
    ));
    let running = tokio::spawn(tick(m.clone(), role.clone()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    let restarted = Instant::now();
    cluster.restart().unwrap();
    let down_for = restarted.elapsed();
    let _ = running.await.unwrap(); // completed or lost, both legal across a restart
    let bound = config.lease_ttl() + config.max_poll() + Duration::from_secs(1);
    loop {
        if let Ok(Lead::Completed { .. }) = tick(m.clone(), role.clone()).await {
            break;
        }
        assert!(
            restarted.elapsed() < down_for + bound,
            "not led again {:?} after the restart",
            restarted.elapsed()
        );
        tokio::time::sleep(config.max_poll()).await;
    }
    println!(
        "postmaster down {down_for:?}; led again {:?} after the restart began",
        restarted.elapsed()
    );
}
