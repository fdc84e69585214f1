//! The writer endpoint of an HA Postgres: one address that follows the
//! primary (a floating IP moved by vip-manager or keepalived, a cloud's
//! writer endpoint, a Kubernetes `-rw` service). Clients keep one URL; on a
//! failover the address stops answering, then leads to the new primary's node.
//! Connections open through it when it moves are cut, as TCP sessions to a
//! node that lost the address are.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// A running endpoint; dropping it stops accepting.
#[derive(Debug)]
pub struct WriterEndpoint {
    addr: SocketAddr,
    /// The node behind the address; `None` while no node holds it.
    target: Arc<watch::Sender<Option<SocketAddr>>>,
    accept: tokio::task::JoinHandle<()>,
}

impl WriterEndpoint {
    /// Listens on a free loopback port and forwards to `target`.
    pub async fn start(target: SocketAddr) -> std::io::Result<WriterEndpoint> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let target = Arc::new(watch::channel(Some(target)).0);
        let t = target.clone();
        let accept = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                tokio::spawn(forward(client, t.subscribe()));
            }
        });
        Ok(WriterEndpoint { addr, target, accept })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// Moves the address to `node` (`None`: no node holds it, connections are
    /// refused); every connection through it is cut.
    pub fn point(&self, node: Option<SocketAddr>) {
        self.target.send_replace(node);
    }
}

impl Drop for WriterEndpoint {
    fn drop(&mut self) {
        self.accept.abort();
        self.target.send_replace(None);
    }
}

/// Forwards one connection until either side closes or the address moves
/// (both sockets are then closed).
async fn forward(mut client: TcpStream, mut target: watch::Receiver<Option<SocketAddr>>) {
    let Some(node) = *target.borrow_and_update() else {
        return;
    };
    let Ok(mut server) = TcpStream::connect(node).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = target.changed() => {}
    }
}
