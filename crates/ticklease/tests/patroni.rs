//! Issue 35, item 6: ticklease on a real Patroni 3.0 + etcd cluster of three
//! members (Debian's packages). Three replicas lead three roles on the
//! multi-host URL, each tick a fenced claim on the server its term started
//! on (`ticklease_testkit::ha`); through a switchover and a SIGKILLed
//! primary postmaster, every role leads again within a bound of the
//! cluster's recovery, no term's claims come from two replicas, and tokens
//! only grow in the order claims commit.

use std::time::Duration;

use ticklease_testkit::ha::{
    claim_violations, create_claims, every_role_claims_after, last_claim, spawn_replica,
};
use ticklease_testkit::{connect, test_config, PatroniCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_switchover_and_a_killed_primary_every_role_leads_again_and_tokens_only_grow() {
    let cluster = tokio::task::spawn_blocking(PatroniCluster::start)
        .await
        .unwrap()
        .unwrap();
    let owner = connect(&cluster.url("postgres").parse().unwrap()).await.unwrap();
    owner.batch_execute("CREATE DATABASE app").await.unwrap();
    let url = cluster.url("app");
    ticklease::migrate(&mut connect(&url.parse().unwrap()).await.unwrap())
        .await
        .unwrap();
    create_claims(&url).await;
    let config = test_config();
    let stop = ticklease::CancellationToken::new();
    for r in 0..3 {
        spawn_replica(&url, config, r, true, stop.clone()).await;
    }
    // The bound after the cluster is healthy again: a lease's expiry, a
    // poll, a probe of the hosts and a statement, doubled for a loaded machine.
    let bound = (config.lease_ttl() + config.max_poll() + config.statement_timeout() * 3) * 2;
    every_role_claims_after(&url, 0, Duration::from_secs(30)).await;

    let leader = cluster.leader().unwrap().name.clone();
    let candidate = cluster
        .members()
        .iter()
        .find(|m| m.name != leader)
        .unwrap()
        .name
        .clone();
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.switchover(&candidate).unwrap();
        cluster.wait_healthy().unwrap();
        cluster
    })
    .await
    .unwrap();
    let took = every_role_claims_after(&url, last_claim(&url).await, bound).await;
    eprintln!("switchover: every role led again {took:?} after the cluster was healthy");

    let cluster = tokio::task::spawn_blocking(move || {
        cluster.kill_leader_postmaster().unwrap();
        cluster.wait_healthy().unwrap();
        cluster
    })
    .await
    .unwrap();
    let took = every_role_claims_after(&url, last_claim(&url).await, bound).await;
    eprintln!("killed primary: every role led again {took:?} after the cluster was healthy");
    stop.cancel();

    let (shared, backwards) = claim_violations(&url).await;
    assert_eq!(shared, 0, "a term's claims were made by two replicas");
    assert_eq!(
        backwards, 0,
        "a claim committed under a token below an earlier one's"
    );
    drop(cluster);
}
