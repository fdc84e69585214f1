//! What the command's test files share: the binary, and a database it migrated.

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Output, Stdio};

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

/// `ticklease metrics --database-url URL ARGS` on a free port: the child and
/// its address, once it serves.
pub fn exporter(url: &str, args: &[&str]) -> (Child, String) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(["metrics", "--database-url", url, "--metrics-addr", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let addr = line.trim().rsplit("http://").next().unwrap().to_string();
    (child, addr)
}

/// The whole response to `GET path` (HTTP/1.0).
pub fn http_get(addr: &str, path: &str) -> String {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    response
}
