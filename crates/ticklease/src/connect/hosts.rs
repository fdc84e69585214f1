//! Connecting to one of several hosts (`host=a,b`, `target_session_attrs=read-write`)
//! within a statement's deadline.
//!
//! tokio-postgres tries a multi-host URL's hosts in order and bounds only each
//! TCP connect by `connect_timeout`: a host that drops packets costs the whole
//! timeout, and one that accepts TCP but never answers (a hung server, a
//! black-holing proxy) hangs the attempt for good, so the next host is never
//! tried. Here each host is its own attempt, bounded as a whole (TCP, TLS,
//! startup, authentication, the read-write check) by a share of the deadline,
//! and the host that answered last is tried first: a dead first host costs
//! each new connection at most its share, and nothing once another host answered.
//!
//! Public (as `ticklease::hosts::{Hosts, PoolConnect}`) so that every other
//! connection of an application, its own pools included, follows the same
//! rules as the store's.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, Connection, Socket};

use crate::connect::tls::{PgConnect, PgTlsStream};

/// The hosts of one URL, each with the URL's every other setting.
#[derive(Debug)]
pub struct Hosts {
    hosts: Vec<PgConnect>,
    per_host: Duration,
    last_good: AtomicUsize,
}

/// Why no host gave a connection in one pass over them.
#[derive(Debug)]
#[non_exhaustive]
pub enum HostsError {
    /// The last host that answered with an error.
    Db(tokio_postgres::Error),
    /// Every host timed out.
    TimedOut {
        /// The bound on each host's attempt.
        per_host: Duration,
    },
}

impl std::fmt::Display for HostsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostsError::Db(_) => f.write_str("no host accepted the connection"),
            HostsError::TimedOut { per_host } => {
                write!(f, "no host answered within {per_host:?} each")
            }
        }
    }
}

impl std::error::Error for HostsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HostsError::Db(e) => Some(e),
            HostsError::TimedOut { .. } => None,
        }
    }
}

impl Hosts {
    /// `pg`'s hosts, each attempt bounded by an equal share of `deadline`
    /// (or the URL's own `connect_timeout`, if shorter).
    pub fn new(pg: &PgConnect, deadline: Duration) -> Self {
        let hosts = split(pg);
        let n = u32::try_from(hosts.len()).unwrap_or(u32::MAX).max(1);
        let share = deadline / n;
        let per_host = pg
            .config()
            .get_connect_timeout()
            .map_or(share, |own| share.min(*own));
        let hosts = hosts
            .into_iter()
            .map(|mut h| {
                h.config_mut().connect_timeout(per_host);
                h
            })
            .collect();
        Hosts {
            hosts,
            per_host,
            last_good: AtomicUsize::new(0),
        }
    }

    /// One pass over the hosts, the last good one first.
    pub async fn connect(&self) -> Result<(Client, Connection<Socket, PgTlsStream>), HostsError> {
        let first = self.last_good.load(Ordering::Relaxed);
        let mut failed = None;
        for i in (0..self.hosts.len()).map(|k| (first + k) % self.hosts.len()) {
            match tokio::time::timeout(self.per_host, self.hosts[i].connect()).await {
                Ok(Ok(connected)) => {
                    self.last_good.store(i, Ordering::Relaxed);
                    return Ok(connected);
                }
                Ok(Err(e)) => failed = Some(e),
                Err(_) => {}
            }
        }
        Err(failed.map_or(
            HostsError::TimedOut {
                per_host: self.per_host,
            },
            HostsError::Db,
        ))
    }
}

/// The pool's way to connect: passes over the hosts until one gives a
/// connection or refuses it; a pass in which every host timed out is tried
/// again, until the statement's deadline (around every pool wait) ends it.
/// Give it to `deadpool_postgres::Manager::from_connect`, and bound the
/// pool's waits (`Pool::builder(…).wait_timeout(…).create_timeout(…)`).
pub struct PoolConnect(pub(crate) std::sync::Arc<Hosts>);

impl PoolConnect {
    /// Connections to `hosts`.
    pub fn new(hosts: std::sync::Arc<Hosts>) -> Self {
        PoolConnect(hosts)
    }
}

impl deadpool_postgres::Connect for PoolConnect {
    fn connect(
        &self,
        _: &Config,
    ) -> futures::future::BoxFuture<'_, Result<(Client, tokio::task::JoinHandle<()>), tokio_postgres::Error>>
    {
        Box::pin(async move {
            loop {
                match self.0.connect().await {
                    Ok((client, connection)) => {
                        let task = tokio::spawn(async move {
                            let _ = connection.await;
                        });
                        return Ok((client, task));
                    }
                    Err(HostsError::Db(e)) => return Err(e),
                    Err(HostsError::TimedOut { .. }) => {}
                }
            }
        })
    }
}

/// One `PgConnect` per host of `pg` (its `hostaddr` and port with it).
fn split(pg: &PgConnect) -> Vec<PgConnect> {
    let c = pg.config();
    let hosts = c.get_hosts();
    if hosts.len() <= 1 {
        return vec![pg.clone()];
    }
    (0..hosts.len())
        .map(|i| {
            let mut one = pg.clone();
            *one.config_mut() = single(c, i);
            one
        })
        .collect()
}

/// `c` with host `i` alone; every other setting as it is.
fn single(c: &Config, i: usize) -> Config {
    let mut one = Config::new();
    if let Some(v) = c.get_user() {
        one.user(v);
    }
    if let Some(v) = c.get_password() {
        one.password(v);
    }
    if let Some(v) = c.get_dbname() {
        one.dbname(v);
    }
    if let Some(v) = c.get_options() {
        one.options(v);
    }
    if let Some(v) = c.get_application_name() {
        one.application_name(v);
    }
    one.ssl_mode(c.get_ssl_mode())
        .ssl_negotiation(c.get_ssl_negotiation())
        .keepalives(c.get_keepalives())
        .keepalives_idle(c.get_keepalives_idle())
        .target_session_attrs(c.get_target_session_attrs())
        .channel_binding(c.get_channel_binding());
    if let Some(v) = c.get_keepalives_interval() {
        one.keepalives_interval(v);
    }
    if let Some(v) = c.get_keepalives_retries() {
        one.keepalives_retries(v);
    }
    if let Some(v) = c.get_tcp_user_timeout() {
        one.tcp_user_timeout(*v);
    }
    match &c.get_hosts()[i] {
        Host::Tcp(h) => one.host(h),
        Host::Unix(p) => one.host_path(p),
    };
    if let Some(addr) = c.get_hostaddrs().get(i) {
        one.hostaddr(*addr);
    }
    match c.get_ports() {
        [] => {}
        [port] => {
            one.port(*port);
        }
        ports => {
            one.port(ports.get(i).copied().unwrap_or(5432));
        }
    }
    one
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_host_keeps_its_port_and_every_other_setting() {
        let c: Config = "host=a,b port=5433,5434 user=u dbname=d application_name=x \
                         target_session_attrs=read-write connect_timeout=7"
            .parse()
            .unwrap();
        let b = single(&c, 1);
        assert_eq!(b.get_hosts(), [Host::Tcp("b".into())]);
        assert_eq!(b.get_ports(), [5434]);
        assert_eq!(b.get_user(), Some("u"));
        assert_eq!(b.get_dbname(), Some("d"));
        assert_eq!(b.get_application_name(), Some("x"));
        assert_eq!(
            b.get_target_session_attrs(),
            tokio_postgres::config::TargetSessionAttrs::ReadWrite
        );
    }

    #[test]
    fn a_host_gets_a_share_of_the_deadline_or_its_own_shorter_timeout() {
        let two: PgConnect = "host=a,b connect_timeout=7".parse().unwrap();
        assert_eq!(
            Hosts::new(&two, Duration::from_secs(2)).per_host,
            Duration::from_secs(1)
        );
        let short: PgConnect = "host=a,b,c connect_timeout=1".parse().unwrap();
        assert_eq!(
            Hosts::new(&short, Duration::from_secs(6)).per_host,
            Duration::from_secs(1)
        );
        let one: PgConnect = "host=a".parse().unwrap();
        assert_eq!(
            Hosts::new(&one, Duration::from_secs(2)).per_host,
            Duration::from_secs(2)
        );
    }
}
