//! A TCP fault proxy between a replica and Postgres (or PgBouncer): pass,
//! added latency, blackhole (connections stay open, bytes go nowhere), or
//! reset (every connection is cut with RST, new ones too). Controlled from
//! the test or bench process that owns it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// What the proxy does to traffic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Pass,
    /// Each chunk is held this long before it is forwarded.
    Latency(Duration),
    /// Connections stay open; nothing is forwarded either way.
    Blackhole,
    /// Every connection is reset (RST); new ones are reset on accept.
    Reset,
}

/// A running proxy. Dropping it stops accepting; live connections end with it.
#[derive(Debug)]
pub struct FaultProxy {
    addr: SocketAddr,
    fault: Arc<watch::Sender<Fault>>,
    accept: tokio::task::JoinHandle<()>,
}

/// Bytes read per chunk.
const CHUNK: usize = 16 * 1024;

impl FaultProxy {
    /// Listens on a free loopback port and forwards to `upstream`.
    pub async fn start(upstream: SocketAddr) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let fault = Arc::new(watch::channel(Fault::Pass).0);
        let f = fault.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let f = f.clone();
                tokio::spawn(async move {
                    if *f.borrow() == Fault::Reset {
                        reset(client);
                        return;
                    }
                    if let Ok(server) = TcpStream::connect(upstream).await {
                        let _ = client.set_nodelay(true);
                        let _ = server.set_nodelay(true);
                        link(client, server, f.subscribe()).await;
                    }
                });
            }
        });
        Ok(FaultProxy { addr, fault, accept })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    pub fn set(&self, fault: Fault) {
        self.fault.send_replace(fault);
    }

    pub fn fault(&self) -> Fault {
        *self.fault.borrow()
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.fault.send_replace(Fault::Reset);
    }
}

fn reset(stream: TcpStream) {
    // SO_LINGER 0: close() sends RST instead of FIN.
    let _ = socket2::SockRef::from(&stream).set_linger(Some(Duration::ZERO));
    drop(stream);
}

async fn link(client: TcpStream, server: TcpStream, mut fault: watch::Receiver<Fault>) {
    // Linger 0 on both sockets: when the halves drop, the peers see RST.
    let _ = socket2::SockRef::from(&client).set_linger(Some(Duration::ZERO));
    let _ = socket2::SockRef::from(&server).set_linger(Some(Duration::ZERO));
    let (cr, cw) = client.into_split();
    let (sr, sw) = server.into_split();
    let mut up = tokio::spawn(pump(cr, sw, fault.clone()));
    let mut down = tokio::spawn(pump(sr, cw, fault.clone()));
    loop {
        tokio::select! {
            _ = &mut up => break,
            _ = &mut down => break,
            changed = fault.changed() => {
                if changed.is_err() || *fault.borrow() == Fault::Reset {
                    break;
                }
            }
        }
    }
    up.abort();
    down.abort();
}

/// Forwards one direction. A blackhole holds the chunk in flight (and reads
/// no more) until the fault changes, as a partition holds packets that TCP
/// will retransmit once it heals; the end of the stream (a FIN) too, so a
/// peer that closed during a partition is not known closed across it.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    mut fault: watch::Receiver<Fault>,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = from.read(&mut buf).await?;
        loop {
            let current = *fault.borrow_and_update();
            match current {
                Fault::Pass => break,
                Fault::Latency(d) => {
                    tokio::time::sleep(d).await;
                    break;
                }
                Fault::Blackhole => {
                    if fault.changed().await.is_err() {
                        return Ok(());
                    }
                }
                Fault::Reset => return Ok(()),
            }
        }
        if n == 0 {
            return to.shutdown().await;
        }
        to.write_all(&buf[..n]).await?;
    }
}
