//! Cancelling a statement that outlived its timeout, then closing its connection.
//!
//! tokio-postgres's own cancel half-closes its socket right after writing the
//! request; PgBouncer 1.18 drops a cancel whose client socket closed before it
//! was forwarded. So the request is written through a duplicate of the socket
//! whose shutdown is a no-op, and the original is held open until the server
//! (or bouncer) closes it, bounded by `linger`.
//!
//! The request goes with the connection's own TLS choice: a cancel carries the
//! backend's secret key, which must not cross the wire in the clear when the
//! session did not.

use std::io;
use std::path::PathBuf;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use deadpool_postgres::ClientWrapper;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_postgres::config::Host;
use tokio_postgres::tls::MakeTlsConnect;

use crate::connect::tls::{PgConnect, PgTls};

#[derive(Debug, Clone)]
pub(super) struct CancelTarget {
    address: Option<Address>,
    /// The name the server certificate is checked against.
    host_name: String,
    tls: PgTls,
    linger: Duration,
}

#[derive(Debug, Clone)]
enum Address {
    Tcp(String, u16),
    Unix(PathBuf),
}

impl CancelTarget {
    pub(super) fn from_config(pg: &PgConnect, linger: Duration) -> Self {
        let config = pg.config();
        let port = config.get_ports().first().copied().unwrap_or(5432);
        let host = config.get_hosts().first();
        // As tokio-postgres connects: to `hostaddr` when given, TLS checked against `host`.
        let address = match (config.get_hostaddrs().first(), host) {
            (Some(addr), _) => Some(Address::Tcp(addr.to_string(), port)),
            (None, Some(Host::Tcp(host))) => Some(Address::Tcp(host.clone(), port)),
            (None, Some(Host::Unix(dir))) => Some(Address::Unix(dir.join(format!(".s.PGSQL.{port}")))),
            (None, None) => None,
        };
        let host_name = match host {
            Some(Host::Tcp(host)) => host.clone(),
            _ => String::new(),
        };
        CancelTarget {
            address,
            host_name,
            tls: pg.tls(),
            linger,
        }
    }

    /// Sends a cancel for the client's running statement, then drops the
    /// client, on a task of its own so the caller does not wait.
    pub(super) fn cancel_and_close(&self, client: ClientWrapper) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let target = self.clone();
        runtime.spawn(async move {
            let token = client.cancel_token();
            let sent = tokio::time::timeout(target.linger, async {
                match &target.address {
                    Some(Address::Tcp(host, port)) => {
                        let stream = TcpStream::connect((host.as_str(), *port)).await?;
                        let (send, keep) = duplicate_tcp(stream)?;
                        send_and_linger(&token, &target, send, keep).await
                    }
                    Some(Address::Unix(path)) => {
                        let stream = UnixStream::connect(path).await?;
                        let (send, keep) = duplicate_unix(stream)?;
                        send_and_linger(&token, &target, send, keep).await
                    }
                    None => Ok(()),
                }
            })
            .await;
            if !matches!(sent, Ok(Ok(()))) {
                tracing::debug!(?sent, "cancel of a timed-out statement did not complete");
            }
            drop(client);
        });
    }
}

async fn send_and_linger<S>(
    token: &tokio_postgres::CancelToken,
    target: &CancelTarget,
    send: S,
    mut keep: S,
) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let tls = MakeTlsConnect::<NoHalfClose<S>>::make_tls_connect(&mut target.tls.clone(), &target.host_name)
        .map_err(io::Error::other)?;
    token
        .cancel_query_raw(NoHalfClose(send), tls)
        .await
        .map_err(io::Error::other)?;
    let mut buf = [0u8; 64];
    while keep.read(&mut buf).await? > 0 {}
    Ok(())
}

fn duplicate_tcp(stream: TcpStream) -> io::Result<(TcpStream, TcpStream)> {
    let std = stream.into_std()?;
    let dup = std.try_clone()?;
    Ok((TcpStream::from_std(std)?, TcpStream::from_std(dup)?))
}

fn duplicate_unix(stream: UnixStream) -> io::Result<(UnixStream, UnixStream)> {
    let std = stream.into_std()?;
    let dup = std.try_clone()?;
    Ok((UnixStream::from_std(std)?, UnixStream::from_std(dup)?))
}

/// A stream whose `shutdown` does nothing, so writing the cancel request does
/// not half-close the socket the duplicate keeps open.
struct NoHalfClose<S>(S);

impl<S: AsyncRead + Unpin> AsyncRead for NoHalfClose<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for NoHalfClose<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}
