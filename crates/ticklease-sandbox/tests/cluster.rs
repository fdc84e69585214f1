//! Cluster options that change the server's configuration.

use ticklease_sandbox::{connect, ClusterOptions, PgCluster};

#[tokio::test]
async fn pg_stat_statements_is_loaded_when_asked_for() {
    let cluster = PgCluster::start_with(&ClusterOptions::default().with_pg_stat_statements()).unwrap();
    let db = cluster.create_database().await.unwrap();
    let client = connect(&cluster.config(&db)).await.unwrap();
    client
        .batch_execute("CREATE EXTENSION pg_stat_statements")
        .await
        .unwrap();
    let calls: i64 = client
        .query_one(
            "SELECT count(*) FROM pg_stat_statements WHERE query LIKE 'CREATE EXTENSION%'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(calls, 1, "the extension records statements");
}

/// A restart whose port a socket of this machine holds meanwhile (a client
/// connection's local end, the kernel's pick from the same range) waits for
/// it, then starts: CI saw "could not bind IPv4 address: Address already in
/// use" fail a restart.
#[tokio::test]
async fn a_restart_waits_for_its_port_while_another_socket_holds_it() {
    let cluster = PgCluster::start().unwrap();
    cluster.stop();
    let squatter = std::net::TcpListener::bind(("127.0.0.1", cluster.port())).unwrap();
    let (bound, release) = std::sync::mpsc::channel::<()>();
    let holder = std::thread::spawn(move || {
        // Held until the restart has failed to bind at least once.
        release.recv().unwrap();
        drop(squatter);
    });
    let restart = std::thread::scope(|s| {
        let restart = s.spawn(|| cluster.restart());
        let log = cluster.root_dir().join("postmaster.log");
        while !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("Address already in use")
        {
            assert!(
                !restart.is_finished(),
                "the restart ended without meeting the held port"
            );
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        bound.send(()).unwrap();
        restart.join().unwrap()
    });
    holder.join().unwrap();
    restart.expect("the restart once the port was free");
    let client = connect(&cluster.config("postgres")).await.unwrap();
    client.batch_execute("SELECT 1").await.unwrap();
}
