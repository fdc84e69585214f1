//! The fault proxy itself, in front of the shared test cluster.

use std::time::{Duration, Instant};

use ticklease_testkit::{connect, Fault, FaultProxy, PgCluster};

async fn proxied() -> (FaultProxy, tokio_postgres::Client) {
    let cluster = PgCluster::shared();
    let proxy = FaultProxy::start(([127, 0, 0, 1], cluster.port()).into())
        .await
        .unwrap();
    let client = connect(&via(&proxy)).await.unwrap();
    (proxy, client)
}

fn via(proxy: &FaultProxy) -> tokio_postgres::Config {
    let mut config = tokio_postgres::Config::new();
    config
        .host("127.0.0.1")
        .port(proxy.port())
        .user("postgres")
        .dbname("postgres");
    config
}

#[tokio::test]
async fn latency_delays_and_pass_forwards() {
    let (proxy, client) = proxied().await;
    client.simple_query("SELECT 1").await.unwrap();
    proxy.set(Fault::Latency(Duration::from_millis(150)));
    let t = Instant::now();
    client.simple_query("SELECT 1").await.unwrap();
    assert!(
        t.elapsed() >= Duration::from_millis(300),
        "one delay each way: {:?}",
        t.elapsed()
    );
    proxy.set(Fault::Pass);
    let t = Instant::now();
    client.simple_query("SELECT 1").await.unwrap();
    assert!(t.elapsed() < Duration::from_millis(150));
}

#[tokio::test]
async fn a_blackhole_holds_traffic_until_it_heals() {
    let (proxy, client) = proxied().await;
    proxy.set(Fault::Blackhole);
    let query = tokio::spawn(async move { client.simple_query("SELECT 1").await.map(|_| ()) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!query.is_finished(), "a statement through a blackhole must hang");
    proxy.set(Fault::Pass);
    tokio::time::timeout(Duration::from_secs(5), query)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn reset_cuts_live_connections_and_refuses_new_ones() {
    let (proxy, client) = proxied().await;
    proxy.set(Fault::Reset);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(
        client.simple_query("SELECT 1").await.is_err(),
        "a reset connection fails"
    );
    assert!(connect(&via(&proxy)).await.is_err(), "new connections are reset");
    proxy.set(Fault::Pass);
    connect(&via(&proxy)).await.unwrap();
}
