//! The metrics exporter served on a free local port, and a plain GET of it,
//! as a scraper or a browser asks.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use ticklease::prometheus_client::registry::Registry;
use ticklease::{CancellationToken, HistoryStore, LeaseStore, Metrics};

/// `ticklease::metrics::serve` of `registry` on 127.0.0.1, a free port:
/// its address, and the token that stops it.
pub async fn serve_metrics<S>(
    registry: Registry,
    metrics: Metrics,
    store: S,
) -> (SocketAddr, CancellationToken)
where
    S: LeaseStore + HistoryStore + Clone,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let stop = CancellationToken::new();
    tokio::spawn(ticklease::metrics::serve(
        listener,
        Arc::new(registry),
        metrics,
        store,
        stop.clone(),
    ));
    (addr, stop)
}

/// `GET path` (HTTP/1.1, the connection closed after): the whole response.
pub async fn http_get(addr: SocketAddr, path: &str) -> std::io::Result<String> {
    let mut conn = tokio::net::TcpStream::connect(addr).await?;
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n").as_bytes())
        .await?;
    let mut response = String::new();
    conn.read_to_string(&mut response).await?;
    Ok(response)
}
