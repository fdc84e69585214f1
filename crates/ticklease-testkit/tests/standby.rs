//! The kit's streaming standby: an async failover keeps what was replicated
//! before the cut, loses what the primary committed after it, and the
//! multi-host URL follows the writable server.

use ticklease_testkit::{connect, url_for_hosts, PgCluster, Standby};

/// The values in table `t` of `db` on `cluster`, sorted.
async fn values(cluster: &PgCluster, db: &str) -> Vec<String> {
    let client = connect(&cluster.config(db)).await.unwrap();
    let rows = client.query("SELECT v FROM t ORDER BY v", &[]).await.unwrap();
    rows.iter().map(|r| r.get(0)).collect()
}

/// The port of the server a `target_session_attrs=read-write` client reaches.
async fn writable_port(url: &str) -> i32 {
    let client = connect(&url.parse().unwrap()).await.unwrap();
    let row = client
        .query_one("SELECT inet_server_port(), pg_is_in_recovery()", &[])
        .await
        .unwrap();
    assert!(!row.get::<_, bool>(1), "read-write reached a standby");
    row.get(0)
}

#[tokio::test]
async fn a_promoted_standby_keeps_commits_before_the_cut_loses_those_after_and_takes_writes() {
    let primary = PgCluster::start_primary().unwrap();
    let db = primary.create_database().await.unwrap();
    let standby = Standby::start(&primary).unwrap();
    let url = url_for_hosts(&[&primary, standby.cluster()], &db);
    assert_eq!(writable_port(&url).await, i32::from(primary.port()));

    // Streamed after the base backup, then replayed before the cut.
    let p = connect(&primary.config(&db)).await.unwrap();
    p.batch_execute("CREATE TABLE t (v text); INSERT INTO t VALUES ('before')")
        .await
        .unwrap();
    standby.wait_caught_up(&primary).await.unwrap();
    assert_eq!(values(standby.cluster(), &db).await, ["before"]);

    standby.cut_wal_receipt().await.unwrap();
    // Flushed at commit, and a fast shutdown sends a connected standby all
    // WAL: only the cut keeps this row from it.
    p.batch_execute("SET synchronous_commit = on; INSERT INTO t VALUES ('after')")
        .await
        .unwrap();
    assert_eq!(values(&primary, &db).await, ["after", "before"]);
    primary.stop_fast();
    standby.promote().await.unwrap();

    assert_eq!(values(standby.cluster(), &db).await, ["before"]);
    let s = connect(&standby.cluster().config(&db)).await.unwrap();
    s.batch_execute("INSERT INTO t VALUES ('promoted')")
        .await
        .unwrap();
    assert_eq!(values(standby.cluster(), &db).await, ["before", "promoted"]);
    assert_eq!(writable_port(&url).await, i32::from(standby.cluster().port()));
}
