//! What the command's test files share: the binary, and a database it migrated.

use std::process::{Command, Output};

use ticklease_testkit::PgCluster;

/// `ticklease ARGS`, without the environment's `DATABASE_URL`.
pub fn ticklease(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(args)
        .env_remove("DATABASE_URL")
        .output()
        .unwrap()
}

/// A fresh database `ticklease migrate` migrated: its URL, and the owner's client.
pub async fn migrated_url() -> (String, tokio_postgres::Client) {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let url = cluster.url(&db);
    assert_eq!(
        ticklease(&["migrate", "--database-url", &url]).status.code(),
        Some(0)
    );
    let client = ticklease_testkit::connect(&cluster.config(&db)).await.unwrap();
    (url, client)
}
