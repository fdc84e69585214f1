//! Two writable servers (an old primary nothing demoted, and a promoted
//! standby) at the edges an outside review found: a host change by an
//! ordinary connect, concurrent first connections, URLs of addresses alone,
//! a server that refuses the timeline read, and only the superseded server
//! left. See `with_two_writable_servers_every_statement_goes_to_the_promoted_one`
//! (tests/failover.rs) for the main path.

use std::time::Duration;

use ticklease::{Acquire, LeaseStore, PgConnect, PgStore, PgStoreOptions, Role};
use ticklease_testkit::{connect, primary_and_standby, scalar, test_config, url_for_hosts};

const MINUTE: Duration = Duration::from_secs(60);
const DUE: Duration = Duration::from_millis(1);

async fn acquired(store: &PgStore, role: &str) {
    let role = Role::new(role).unwrap();
    let acquired = store.acquire(&role, "h", MINUTE, DUE).await.unwrap();
    assert!(matches!(acquired, Acquire::Acquired(_)), "{acquired:?}");
}

async fn has_row(server: &tokio_postgres::Client, role: &str) -> bool {
    let rows = format!("SELECT count(*) FROM leader_leases WHERE role = '{role}'");
    scalar::<i64>(server, &rows).await == 1
}

/// The pool reached the promoted server through an ordinary connect (the
/// old primary refused new connections for a moment), with connections to
/// the old primary still pooled: the next probe, which finds the old primary
/// writable on the older timeline, ends them, and no later term starts there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_change_by_an_ordinary_connect_still_ends_the_pooled_connections_to_the_old_primary() {
    pooled_connections_to_the_old_primary_end(true).await;
}

/// The same, with the old primary refusing new connections for good (its
/// slots full, a rule against new ones) while its pooled ones live on: the
/// probe cannot find it writable, but it was seen below the promoted
/// server's timeline, so the pool drops its connections all the same.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_primary_refusing_new_connections_keeps_none_of_the_pool() {
    pooled_connections_to_the_old_primary_end(false).await;
}

async fn pooled_connections_to_the_old_primary_end(refusing_for_a_moment: bool) {
    let (primary, standby, db) = primary_and_standby().await;
    let url: PgConnect = url_for_hosts(&[&primary, standby.cluster()], &db)
        .parse()
        .unwrap();
    let s = Duration::from_secs(1);
    let options = PgStoreOptions {
        pool_size: 4,
        statement_timeout: s,
    };
    let store = PgStore::connect(url, options).await.unwrap();
    tokio::join!(
        acquired(&store, "warm_a"),
        acquired(&store, "warm_b"),
        acquired(&store, "warm_c")
    );
    let old = connect(&primary.config(&db)).await.unwrap();
    standby.promote().await.unwrap();
    let new = connect(&standby.cluster().config(&db)).await.unwrap();
    let hba = primary.data_dir().join("pg_hba.conf");
    let original = std::fs::read_to_string(&hba).unwrap();
    std::fs::write(&hba, format!("host all all 127.0.0.1/32 reject\n{original}")).unwrap();
    old.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    let burst = ["burst_d", "burst_e", "burst_f", "burst_g"].map(|r| acquired(&store, r));
    futures::future::join_all(burst).await;
    if refusing_for_a_moment {
        std::fs::write(&hba, original).unwrap();
        old.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    }
    // Within two probe periods and their passes, a term starts on the
    // promoted server; from then on none starts on the old primary.
    let deadline = tokio::time::Instant::now() + s * 3;
    for k in 0.. {
        let role = format!("moving_{k}");
        acquired(&store, &role).await;
        if has_row(&new, &role).await {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "terms still start on the old primary"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    for k in 0..8 {
        let role = format!("late_{k}");
        acquired(&store, &role).await;
        assert!(has_row(&new, &role).await);
        assert!(
            !has_row(&old, &role).await,
            "{role} started on the superseded server"
        );
    }
}

/// Four first connections of a fresh `Hosts` at once: each waits for the
/// first probe, so none reaches the superseded server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_connections_all_wait_for_the_first_probe() {
    let (primary, standby, db) = primary_and_standby().await;
    standby.promote().await.unwrap();
    let url: PgConnect = url_for_hosts(&[&primary, standby.cluster()], &db)
        .parse()
        .unwrap();
    let hosts = std::sync::Arc::new(ticklease::hosts::Hosts::new(&url, Duration::from_secs(2)));
    let port = || {
        let hosts = hosts.clone();
        async move {
            let (client, connection) = hosts.connect().await.unwrap();
            tokio::spawn(connection);
            scalar::<String>(&client, "SELECT current_setting('port')").await
        }
    };
    let reached = futures::future::join_all((0..4).map(|_| port())).await;
    let promoted = standby.cluster().port().to_string();
    assert!(reached.iter().all(|p| *p == promoted), "{reached:?}");
}

/// Forwards connections on `listener` to the local port `to`.
async fn forward(listener: tokio::net::TcpListener, to: u16) {
    tokio::spawn(async move {
        while let Ok((mut client, _)) = listener.accept().await {
            tokio::spawn(async move {
                if let Ok(mut server) = tokio::net::TcpStream::connect(("127.0.0.1", to)).await {
                    let _ = tokio::io::copy_bidirectional(&mut client, &mut server).await;
                }
            });
        }
    });
}

/// A URL of addresses alone (`hostaddr=a,b`, one port): each address is a
/// server of its own, told apart by timeline; the server a term started on
/// names its address.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servers_named_by_address_alone_are_told_apart_by_timeline() {
    let (primary, standby, db) = primary_and_standby().await;
    let (a, b, port) = loop {
        let a = tokio::net::TcpListener::bind("127.0.0.2:0").await.unwrap();
        let port = a.local_addr().unwrap().port();
        if let Ok(b) = tokio::net::TcpListener::bind(("127.0.0.3", port)).await {
            break (a, b, port);
        }
    };
    forward(a, primary.port()).await;
    forward(b, standby.cluster().port()).await;
    let url = format!(
        "hostaddr=127.0.0.2,127.0.0.3 port={port} user=postgres dbname={db} target_session_attrs=read-write"
    );
    let store = PgStore::connect(
        url.parse::<PgConnect>().unwrap(),
        PgStoreOptions::from_config(&test_config()),
    )
    .await
    .unwrap();
    let server = LeaseStore::server(&store).unwrap();
    assert_eq!(server.hostaddr, Some([127, 0, 0, 2].into()));
    standby.promote().await.unwrap();
    let old = connect(&primary.config(&db)).await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.hosts().current().and_then(|s| s.hostaddr) != Some([127, 0, 0, 3].into()) {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the store stayed on the old primary"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    acquired(&store, "late").await;
    assert!(
        !has_row(&old, "late").await,
        "a term started on the superseded server"
    );
}

/// A hardened server refuses `pg_walfile_name` to the application's login:
/// its timeline is unknown, and it is not passed over for that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_refuses_the_timeline_read_is_not_passed_over() {
    let (primary, standby, db) = primary_and_standby().await;
    let owner = connect(&primary.config(&db)).await.unwrap();
    owner
        .batch_execute(
            "CREATE ROLE app_login LOGIN IN ROLE ticklease_app; \
             REVOKE EXECUTE ON FUNCTION pg_catalog.pg_walfile_name(pg_lsn) FROM PUBLIC",
        )
        .await
        .unwrap();
    standby.wait_caught_up(&primary).await.unwrap();
    let url = url_for_hosts(&[&primary, standby.cluster()], &db).replace("postgres@", "app_login@");
    let store = PgStore::connect(
        url.parse::<PgConnect>().unwrap(),
        PgStoreOptions::from_config(&test_config()),
    )
    .await
    .unwrap();
    acquired(&store, "billing").await;
}

/// The promoted server died and only the superseded one answers: statements
/// fail (an operator decides which server's writes count), each opening at
/// most a connection per host and share of S, not one after another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_only_the_superseded_server_left_a_statement_fails_without_a_storm_of_connections() {
    let (primary, standby, db) = primary_and_standby().await;
    let url: PgConnect = url_for_hosts(&[&primary, standby.cluster()], &db)
        .parse()
        .unwrap();
    let options = PgStoreOptions {
        pool_size: 2,
        statement_timeout: Duration::from_millis(500),
    };
    let store = PgStore::connect(url, options).await.unwrap();
    standby.promote().await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while store.hosts().superseded_since().is_none() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "no probe found the old primary superseded"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    standby.cluster().stop();
    let old = connect(&primary.config(&db)).await.unwrap();
    let sessions = "SELECT sessions FROM pg_stat_database WHERE datname = current_database()";
    old.batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    let before: i64 = scalar(&old, sessions).await;
    let role = Role::new("after").unwrap();
    assert!(store.acquire(&role, "h", MINUTE, DUE).await.is_err());
    // The statistics reach pg_stat_database when the sessions end.
    tokio::time::sleep(Duration::from_millis(700)).await;
    old.batch_execute("SELECT pg_stat_clear_snapshot()")
        .await
        .unwrap();
    let opened = scalar::<i64>(&old, sessions).await - before;
    // 500 ms, a pass and a pause of a host's share (250 ms) each: 2 passes,
    // the probes (every 500 ms) meanwhile, and the outage watch's `SELECT 1`
    // (at 0.1, 0.3 and 0.7 s, one connection each): at most about 7.
    assert!(
        opened <= 9,
        "{opened} connections to the superseded server for one statement"
    );
    assert!(!has_row(&old, "after").await);
}
