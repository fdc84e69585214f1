//! `examples/service.rs` against the test kit's Postgres: it migrates, sends
//! the whole outbox under its fence, serves its own page and the lease
//! metrics from one router, and stops cleanly.

#[path = "../examples/service.rs"]
#[allow(dead_code)]
mod service;

use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use ticklease_testkit::{connect, PgCluster};

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    conn.read_to_string(&mut response).await.unwrap();
    response
}

#[tokio::test]
async fn the_example_service_sends_its_outbox_and_serves_its_metrics() {
    let cluster = PgCluster::shared();
    let name = cluster.create_database().await.unwrap();
    let owner = connect(&cluster.config(&name)).await.unwrap();
    owner
        .batch_execute(
            "CREATE TABLE outbox (id int PRIMARY KEY, sent_by bigint);
             INSERT INTO outbox SELECT g, NULL FROM generate_series(1, 120) AS g",
        )
        .await
        .unwrap();
    let url = format!(
        // One URL for sqlx and ticklease, sqlx's own option in it.
        "postgres://postgres@127.0.0.1:{}/{name}?sslmode=disable&statement-cache-capacity=0",
        cluster.port()
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = ticklease::CancellationToken::new();
    let running = tokio::spawn({
        let (url, shutdown) = (url.clone(), shutdown.clone());
        async move { service::run(&url, &url, listener, shutdown).await }
    });

    // Three ticks of 50 rows, one every 2 s: the outbox is empty within 10 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let unsent: i64 = owner
            .query_one("SELECT count(*) FROM outbox WHERE sent_by IS NULL", &[])
            .await
            .unwrap()
            .get(0);
        if unsent == 0 {
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "{unsent} rows unsent");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(get(addr, "/").await.ends_with("the service's own page\n"));
    let metrics = get(addr, "/ops/metrics").await;
    assert!(
        metrics.contains(r#"myapp_leader_ticks_total{role="outbox",outcome="completed"}"#),
        "{metrics}"
    );
    shutdown.cancel();
    let stopped = running.await.unwrap().unwrap();
    assert!(stopped.all_released(), "{stopped}");
}
