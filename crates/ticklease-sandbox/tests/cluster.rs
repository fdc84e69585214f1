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
