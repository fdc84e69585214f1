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

/// Where a cancel goes: every host of the URL. The pool connects to
/// whichever host answers (the last good one first), so the server that
/// runs a statement may be any of them; a cancel request names its backend
/// by pid and secret key, and a server that has no such backend ignores it,
/// so sending it to each host reaches the one that runs the statement and
/// acts nowhere else.
#[derive(Debug, Clone)]
pub(super) struct CancelTarget {
    hosts: Vec<HostTarget>,
    tls: PgTls,
    linger: Duration,
}

#[derive(Debug, Clone)]
struct HostTarget {
    address: Address,
    /// The name the server certificate is checked against.
    host_name: String,
}

#[derive(Debug, Clone)]
enum Address {
    Tcp(String, u16),
    Unix(PathBuf),
}

impl CancelTarget {
    pub(super) fn from_config(pg: &PgConnect, linger: Duration) -> Self {
        let config = pg.config();
        let ports = config.get_ports();
        // As libpq reads a URL: one port for every host, or one per host.
        let port = |i: usize| ports.get(i).or(ports.first()).copied().unwrap_or(5432);
        let hosts = config
            .get_hosts()
            .iter()
            .enumerate()
            .map(|(i, host)| {
                // As tokio-postgres connects: to `hostaddr` when given, TLS checked against `host`.
                let address = match (config.get_hostaddrs().get(i), host) {
                    (Some(addr), _) => Address::Tcp(addr.to_string(), port(i)),
                    (None, Host::Tcp(host)) => Address::Tcp(host.clone(), port(i)),
                    (None, Host::Unix(dir)) => Address::Unix(dir.join(format!(".s.PGSQL.{}", port(i)))),
                };
                let host_name = match host {
                    Host::Tcp(host) => host.clone(),
                    Host::Unix(_) => String::new(),
                };
                HostTarget { address, host_name }
            })
            .collect();
        CancelTarget {
            hosts,
            tls: pg.tls(),
            linger,
        }
    }

    /// Sends a cancel for the client's running statement to every host,
    /// then drops the client, on a task of its own so the caller does not wait.
    pub(super) fn cancel_and_close(&self, client: ClientWrapper) {
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let target = self.clone();
        runtime.spawn(async move {
            let token = client.cancel_token();
            let each = target.hosts.iter().map(|host| async {
                let sent = tokio::time::timeout(target.linger, host.cancel(&token, &target)).await;
                if !matches!(sent, Ok(Ok(()))) {
                    tracing::debug!(?sent, ?host.address, "cancel of a timed-out statement did not complete");
                }
            });
            futures::future::join_all(each).await;
            drop(client);
        });
    }
}

impl HostTarget {
    async fn cancel(&self, token: &tokio_postgres::CancelToken, target: &CancelTarget) -> io::Result<()> {
        match &self.address {
            Address::Tcp(host, port) => {
                let stream = TcpStream::connect((host.as_str(), *port)).await?;
                let (send, keep) = duplicate_tcp(stream)?;
                send_and_linger(token, &target.tls, &self.host_name, send, keep).await
            }
            Address::Unix(path) => {
                let stream = UnixStream::connect(path).await?;
                let (send, keep) = duplicate_unix(stream)?;
                send_and_linger(token, &target.tls, &self.host_name, send, keep).await
            }
        }
    }
}

async fn send_and_linger<S>(
    token: &tokio_postgres::CancelToken,
    tls: &PgTls,
    host_name: &str,
    send: S,
    mut keep: S,
) -> io::Result<()>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let tls = MakeTlsConnect::<NoHalfClose<S>>::make_tls_connect(&mut tls.clone(), host_name)
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
