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

use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::{CancellationToken, DropGuard};

use tokio_postgres::config::Host;
use tokio_postgres::{Client, Config, Connection, Socket};

use crate::connect::timeline;
use crate::connect::tls::{PgConnect, PgTlsStream};

/// The hosts of one URL, each with the URL's every other setting.
#[derive(Debug)]
pub struct Hosts {
    hosts: Vec<PgConnect>,
    /// Each host's server, for the log, the timelines seen and the environment of work.
    servers: Vec<Server>,
    per_host: Duration,
    last_good: AtomicUsize,
    /// Whether any connection was made yet (the first is no change of host).
    connected: AtomicBool,
    /// The probe before the first connection, awaited by every first connect.
    first_probe: tokio::sync::OnceCell<()>,
    /// Times a connection reached another host than the one before.
    changes: AtomicU64,
    /// Pooled connections that ended with an error (a restart, a failover,
    /// a cut link); the pool connects again at the next statement.
    lost: AtomicU64,
    /// What this URL made of its servers' timelines.
    timelines: timeline::UrlTimelines,
    /// Since when no connection could be had or kept (a connection lost, or
    /// none made to the server last used), while that lasts.
    outage: std::sync::Mutex<Option<std::time::Instant>>,
    /// When an outage that goes on was last told.
    still_down_said: std::sync::Mutex<Option<std::time::Instant>>,
    /// How often it is told.
    still_down_every: Duration,
    /// Whether a change of host or a connection restored is logged (once
    /// per process: the store's hosts say it, the coordination session's not).
    says: bool,
    /// Moves when a connection reaches another host, or the store ran a
    /// statement again after an outage ([`Hosts::usable`]).
    usable: tokio::sync::watch::Sender<u64>,
    /// An outage began: the store's outage watch starts trying a statement.
    outage_began: tokio::sync::Notify,
}

/// The last reconnection this process told of: to which server, and when.
static SAID: std::sync::Mutex<Option<(String, std::time::Instant)>> = std::sync::Mutex::new(None);

/// How long a change of host without an outage is told once per process.
const SAID_FOR: std::time::Duration = std::time::Duration::from_secs(30);

/// The first reconnect after a connection is lost (the store's, its
/// coordination session's or a key waiter's) comes this soon, and each
/// later one twice as late, up to [`RECONNECT_MAX`].
pub(crate) const RECONNECT_MIN: Duration = Duration::from_millis(100);
/// The longest between reconnects while the server is away: a reconnect is
/// what wakes the role loops once the server is back, so it bounds how long
/// after a restart or a promotion the roles lead again (it was 5 s: a
/// Patroni restart's roles led again 1.4-3.2 s after the cluster was
/// healthy, waiting out backoffs of 1.6-3.2 s). An attempt costs a
/// connection the server refuses or a standby turns away.
pub(crate) const RECONNECT_MAX: Duration = Duration::from_millis(500);

/// How often an outage that goes on is told, in connect deadlines (a
/// minute at the default 2 s statement timeout): a server that stays away
/// is not a failover.
const STILL_DOWN_DEADLINES: u32 = 30;

/// Whether no other `Hosts` of this process (another store's, an idle
/// pool's, an application's own) told of reaching `server` since `since`
/// (its own outage's start); if so, this one does, and notes it.
fn first_to_say(server: &Server, since: std::time::Instant) -> bool {
    let mut said = SAID.lock().expect("said");
    let text = server.to_string();
    if said.as_ref().is_some_and(|(to, at)| *to == text && *at >= since) {
        return false;
    }
    *said = Some((text, std::time::Instant::now()));
    true
}

/// One server of a URL: the host it names (a name, an address or a socket
/// directory), the address the URL gives for it (`hostaddr`), its port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub struct Server {
    /// The host the URL names for it (the address when it names only `hostaddr`).
    pub host: String,
    /// The address the URL gives for it (`hostaddr`), if any.
    pub hostaddr: Option<std::net::IpAddr>,
    /// Its port.
    pub port: u16,
}

impl std::fmt::Display for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self.hostaddr {
            Some(addr) => write!(f, "{}[{addr}]:{}", self.host, self.port),
            None => write!(f, "{}:{}", self.host, self.port),
        }
    }
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
    /// Every writable host that answered has been superseded by a promotion
    /// of another host of the URL (see `ticklease::hosts`).
    Superseded {
        /// The newest server seen writable (`host:port`).
        by: String,
        /// Its timeline.
        timeline: u32,
    },
}

impl std::fmt::Display for HostsError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostsError::Db(_) => f.write_str("no host accepted the connection"),
            HostsError::TimedOut { per_host } => {
                write!(f, "no host answered within {per_host:?} each")
            }
            HostsError::Superseded { by, timeline } => write!(
                f,
                "every writable host that answered is on an older timeline than {by} (timeline {timeline}) \
                 was seen writable on"
            ),
        }
    }
}

impl std::error::Error for HostsError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            HostsError::Db(e) => Some(e),
            HostsError::TimedOut { .. } | HostsError::Superseded { .. } => None,
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
        let hosts: Vec<PgConnect> = hosts
            .into_iter()
            .map(|mut h| {
                h.config_mut().connect_timeout(per_host);
                h
            })
            .collect();
        let servers: Vec<Server> = hosts.iter().map(|h| server_of(h.config())).collect();
        Hosts {
            timelines: timeline::UrlTimelines::new(servers.iter().map(Server::to_string).collect()),
            hosts,
            servers,
            per_host,
            last_good: AtomicUsize::new(0),
            connected: AtomicBool::new(false),
            first_probe: tokio::sync::OnceCell::new(),
            changes: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            outage: std::sync::Mutex::new(None),
            still_down_said: std::sync::Mutex::new(None),
            still_down_every: deadline * STILL_DOWN_DEADLINES,
            says: true,
            usable: tokio::sync::watch::Sender::new(0),
            outage_began: tokio::sync::Notify::new(),
        }
    }

    /// These hosts log nothing of a failover: another `Hosts` of the
    /// process (the store's) says it in one line.
    pub fn quiet(mut self) -> Self {
        self.says = false;
        self
    }

    /// Notes that a connection to host `i` was lost or could not be made:
    /// the start of an outage, unless one is under way or `i` is no longer
    /// the host last used (a pass begun before another reached a new host:
    /// the outage it belongs to has ended, and was told).
    fn trouble(&self, since: std::time::Instant, i: usize) {
        let mut outage = self.outage.lock().expect("outage");
        if outage.is_none()
            && self.connected.load(Ordering::Relaxed)
            && self.last_good.load(Ordering::Relaxed) == i
        {
            *outage = Some(since);
            self.outage_began.notify_one();
        }
    }

    /// One pass over the hosts, the last good one first. Of a multi-host
    /// URL, a host on an older timeline than another host was seen writable
    /// on is passed over (see `connect/timeline.rs`).
    pub async fn connect(&self) -> Result<(Client, Connection<Socket, PgTlsStream>), HostsError> {
        self.connect_host()
            .await
            .map(|(_, client, connection)| (client, connection))
    }

    /// As [`Hosts::connect`], with the index of the host reached.
    async fn connect_host(&self) -> Result<(usize, Client, Connection<Socket, PgTlsStream>), HostsError> {
        // The first connections of a multi-host URL know no timelines yet:
        // every host is asked first, so none starts on a superseded server.
        if self.hosts.len() > 1 {
            // Done once a host answered; until then every connect asks again.
            let _ = self.first_probe.get_or_try_init(|| self.first_pass()).await;
        }
        let first = self.last_good.load(Ordering::Relaxed);
        let mut failed = None;
        let mut timed_out = false;
        for i in (0..self.hosts.len()).map(|k| (first + k) % self.hosts.len()) {
            let started = std::time::Instant::now();
            let attempt = tokio::time::timeout(self.per_host, self.attempt(i)).await;
            if i == first && !matches!(attempt, Ok(Ok(Attempt::Current(..)))) {
                self.trouble(started, first);
            }
            match attempt {
                Ok(Ok(Attempt::Current(client, connection, _))) => {
                    self.connected_to(i);
                    return Ok((i, client, *connection));
                }
                Ok(Ok(Attempt::Superseded { by, timeline })) => {
                    failed = Some(HostsError::Superseded { by, timeline });
                }
                Ok(Err(e)) => failed = Some(HostsError::Db(e)),
                Err(_) => timed_out = true,
            }
        }
        // A standby's refusal says nothing while a host that may be the
        // primary did not answer in time: the pass is one to try again.
        let failed = match failed {
            Some(HostsError::Db(e)) if timed_out && read_only_refusal(&e) => None,
            failed => failed,
        };
        let failed = failed.unwrap_or(HostsError::TimedOut {
            per_host: self.per_host,
        });
        self.still_down(&failed);
        Err(failed)
    }

    /// An outage that goes on is told every [`STILL_DOWN_DEADLINES`]
    /// connect deadlines, with the last error: one line per failover holds
    /// only for a failover.
    fn still_down(&self, failed: &HostsError) {
        let Some(since) = *self.outage.lock().expect("outage") else {
            return;
        };
        let mut said = self.still_down_said.lock().expect("still down");
        let last = said.unwrap_or(since);
        if !self.says || last.elapsed() < self.still_down_every {
            return;
        }
        *said = Some(std::time::Instant::now());
        tracing::warn!(
            down_s = since.elapsed().as_secs(),
            error = failed as &dyn std::error::Error,
            "no database connection yet; still trying"
        );
    }

    /// A connection to host `i`, its timeline read and judged when the URL
    /// has other hosts. A timeline that cannot be read (the function
    /// revoked on a hardened server) is unknown: the host is never passed
    /// over for it.
    async fn attempt(&self, i: usize) -> Result<Attempt, tokio_postgres::Error> {
        let (client, mut connection) = self.hosts[i].connect().await?;
        if self.hosts.len() == 1 {
            return Ok(Attempt::Current(client, Box::new(connection), None));
        }
        let server = &self.servers[i];
        let timeline = match timeline::read(&client, &mut connection).await {
            Ok(Some(timeline)) => timeline,
            Ok(None) => return Ok(Attempt::Current(client, Box::new(connection), None)),
            Err(error) => {
                if self.timelines.first_unreadable(i) {
                    tracing::warn!(%server, error = &error as &dyn std::error::Error,
                        "cannot read the server's timeline: two writable servers cannot be told apart there");
                }
                return Ok(Attempt::Current(client, Box::new(connection), None));
            }
        };
        match self.timelines.judge(i, timeline) {
            None => Ok(Attempt::Current(client, Box::new(connection), Some(timeline))),
            Some((by, newer)) => Ok(Attempt::Superseded { by, timeline: newer }),
        }
    }

    /// Notes a connection to host `i`: a change of host is counted, and
    /// the outage it ends is told in one line, from where to where and how
    /// long it lasted (a failover's other lines are at debug).
    fn connected_to(&self, i: usize) {
        self.timelines.used(i);
        // Under the outage's lock: a failure on the host left either comes
        // before the take (and this ends its outage) or sees the new host.
        let (outage, before) = {
            let mut outage = self.outage.lock().expect("outage");
            (outage.take(), self.last_good.swap(i, Ordering::Relaxed))
        };
        let changed = self.connected.swap(true, Ordering::Relaxed) && before != i;
        if changed {
            self.changes.fetch_add(1, Ordering::Relaxed);
            self.usable_again();
        }
        *self.still_down_said.lock().expect("still down") = None;
        let since = outage.unwrap_or_else(|| std::time::Instant::now() - SAID_FOR);
        if !self.says || (outage.is_none() && !changed) || !first_to_say(&self.servers[i], since) {
            return;
        }
        let (from, to) = (&self.servers[before], &self.servers[i]);
        match outage.map(|since| since.elapsed().as_millis()) {
            Some(down_ms) if changed => tracing::warn!(%from, %to, down_ms, "database host changed"),
            None => tracing::warn!(%from, %to, "database host changed"),
            Some(down_ms) => tracing::warn!(server = %to, down_ms, "database connection restored"),
        }
    }

    /// The probe before the first connection: an error when no host answered.
    async fn first_pass(&self) -> Result<(), ()> {
        self.probe().await;
        self.timelines.any_known().then_some(()).ok_or(())
    }

    /// Connects to every host of a multi-host URL at once, each bounded by
    /// its share, recording the timelines of the writable ones. A server
    /// this process used that answers writable on an older timeline than
    /// another host's was superseded by a promotion:
    /// [`Hosts::superseded_since`] then tells the pool to drop the
    /// connections made before and the heartbeat to end the terms started
    /// before, and the next connection goes to the newest host. One pass
    /// costs a connection to each host.
    pub(crate) async fn probe(&self) {
        if self.hosts.len() == 1 {
            return;
        }
        let probes = (0..self.hosts.len()).map(|i| tokio::time::timeout(self.per_host, self.attempt(i)));
        let attempts: Vec<_> = futures::future::join_all(probes)
            .await
            .into_iter()
            .enumerate()
            .map(|(i, attempt)| match attempt {
                // Judged again once the pass answered: a host that answered
                // before a newer host's timeline was seen was judged current,
                // and the promotion waited for the next pass.
                Ok(Ok(Attempt::Current(client, connection, Some(timeline)))) => {
                    Ok(Ok(match self.timelines.judge(i, timeline) {
                        Some((by, timeline)) => Attempt::Superseded { by, timeline },
                        None => Attempt::Current(client, connection, Some(timeline)),
                    }))
                }
                other => other,
            })
            .collect();
        let newest = attempts
            .iter()
            .enumerate()
            .filter_map(|(i, a)| match a {
                Ok(Ok(Attempt::Current(_, _, timeline))) => Some((i, *timeline)),
                _ => None,
            })
            .max_by_key(|(i, timeline)| (*timeline, std::cmp::Reverse(*i)));
        let current = self.last_good.load(Ordering::Relaxed);
        let current_passed_over = matches!(attempts.get(current), Some(Ok(Ok(Attempt::Superseded { .. }))));
        match newest {
            // Before a first connection: start with the newest host that
            // answered, not one that did not.
            Some((i, _)) if !self.connected.load(Ordering::Relaxed) => {
                self.last_good.store(i, Ordering::Relaxed)
            }
            Some((i, _)) if current_passed_over => self.connected_to(i),
            _ => {}
        }
    }

    /// Probes every `every` (see [`Hosts::probe`]) until the guard is
    /// dropped; nothing for a single host.
    pub(crate) fn watch(self: &Arc<Self>, every: Duration) -> Option<DropGuard> {
        if self.hosts.len() == 1 {
            return None;
        }
        let stop = CancellationToken::new();
        let (hosts, stopped) = (self.clone(), stop.clone());
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = tokio::time::sleep(every) => hosts.probe().await,
                }
            }
        });
        Some(stop.drop_guard())
    }

    /// Resolves when an outage begins (a connection lost, or none made to
    /// the server last used).
    pub(crate) async fn outage_begins(&self) {
        self.outage_began.notified().await;
    }

    /// A receiver that moves when a connection reaches another host (a
    /// failover), or when the store that owns these hosts ran a statement
    /// again after an outage: a statement that failed before may now work.
    pub fn usable(&self) -> tokio::sync::watch::Receiver<u64> {
        self.usable.subscribe()
    }

    /// Moves [`Hosts::usable`]: something a failed statement waited for changed.
    pub(crate) fn usable_again(&self) {
        self.usable.send_modify(|n| *n += 1);
    }

    /// When a server this process used was last found superseded by a
    /// promotion: a connection made, or a term started, before then may
    /// be on it.
    pub fn superseded_since(&self) -> Option<std::time::Instant> {
        self.timelines.superseded_at()
    }

    /// A `pre_recycle` hook for a pool on these hosts
    /// (`Pool::builder(…).pre_recycle(hosts.recycle_hook())`): it drops a
    /// connection made before a server this process used was found
    /// superseded by a promotion, or seen below another host's timeline.
    pub fn recycle_hook(self: &Arc<Self>) -> deadpool_postgres::Hook {
        let hosts = self.clone();
        deadpool_postgres::Hook::sync_fn(move |_, metrics| match hosts.timelines.recycle_before() {
            Some(at) if metrics.created < at => Err(deadpool_postgres::HookError::Message(
                "made before its server was found superseded by a promotion".into(),
            )),
            _ => Ok(()),
        })
    }

    /// What happened to the connections so far.
    pub fn events(&self) -> ConnectionEvents {
        ConnectionEvents {
            host_changes: self.changes.load(Ordering::Relaxed),
            connections_lost: self.lost.load(Ordering::Relaxed),
            superseded_at: self.superseded_since(),
        }
    }

    /// The server the last connection reached, if any did.
    pub fn current(&self) -> Option<&Server> {
        self.connected
            .load(Ordering::Relaxed)
            .then(|| &self.servers[self.last_good.load(Ordering::Relaxed)])
    }
}

/// Counts of what happened to a store's connections, each also a log line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ConnectionEvents {
    /// New connections that reached another host than the one before (a
    /// failover, a switchover, a host that stopped answering).
    pub host_changes: u64,
    /// Pooled connections that ended with an error (a restart, a failover, a
    /// cut link); the pool connects again at the next statement.
    pub connections_lost: u64,
    /// When a server the store used was last found superseded by a
    /// promotion of another host of its URL.
    pub superseded_at: Option<std::time::Instant>,
}

/// A connection to one host, or why it is passed over.
enum Attempt {
    /// With the server's timeline when it was read (a multi-host URL).
    Current(Client, Box<Connection<Socket, PgTlsStream>>, Option<u32>),
    Superseded {
        by: String,
        timeline: u32,
    },
}

/// The pool's way to connect: passes over the hosts until one gives a
/// connection or refuses it; a pass in which every host timed out is tried
/// again, until the statement's deadline (around every pool wait) ends it.
/// Give it to `deadpool_postgres::Manager::from_connect`, and bound the
/// pool's waits (`Pool::builder(…).wait_timeout(…).create_timeout(…)`).
pub struct PoolConnect(pub(crate) Arc<Hosts>);

impl PoolConnect {
    /// Connections to `hosts`.
    pub fn new(hosts: Arc<Hosts>) -> Self {
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
                match self.0.connect_host().await {
                    Ok((i, client, connection)) => {
                        let hosts = self.0.clone();
                        let server = hosts.servers[i].to_string();
                        let task = tokio::spawn(async move {
                            if let Err(error) = connection.await {
                                hosts.lost.fetch_add(1, Ordering::Relaxed);
                                hosts.trouble(std::time::Instant::now(), i);
                                // Counted; the reconnection's one line tells the outage.
                                tracing::debug!(%server, error = &error as &dyn std::error::Error,
                                    "a database connection was lost; the next statement connects again");
                            }
                        });
                        return Ok((client, task));
                    }
                    Err(HostsError::Db(e)) => return Err(e),
                    // Every answering host superseded: another pass after a
                    // host's share (such a pass is quick: no spin), until
                    // the statement's deadline.
                    Err(HostsError::Superseded { .. }) => tokio::time::sleep(self.0.per_host).await,
                    Err(_) => {}
                }
            }
        })
    }
}

/// tokio-postgres's refusal of a read-only server for `target_session_attrs=read-write`.
fn read_only_refusal(e: &tokio_postgres::Error) -> bool {
    std::error::Error::source(e)
        .and_then(|source| source.downcast_ref::<std::io::Error>())
        .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
}

/// A single-host config's server.
fn server_of(c: &Config) -> Server {
    let hostaddr = c.get_hostaddrs().first().copied();
    let host = match c.get_hosts().first() {
        Some(Host::Tcp(h)) => h.clone(),
        Some(Host::Unix(p)) => p.display().to_string(),
        None => hostaddr.map_or_else(|| "localhost".to_string(), |a| a.to_string()),
    };
    Server {
        host,
        hostaddr,
        port: c.get_ports().first().copied().unwrap_or(5432),
    }
}

/// One `PgConnect` per host of `pg` (its `hostaddr` and port with it).
fn split(pg: &PgConnect) -> Vec<PgConnect> {
    let c = pg.config();
    // `hostaddr=a,b` without `host` names two servers too.
    let n = c.get_hosts().len().max(c.get_hostaddrs().len());
    if n <= 1 {
        return vec![pg.clone()];
    }
    (0..n)
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
    match c.get_hosts().get(i) {
        Some(Host::Tcp(h)) => {
            one.host(h);
        }
        Some(Host::Unix(p)) => {
            one.host_path(p);
        }
        None => {}
    }
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
    fn a_failure_on_the_host_left_begins_no_outage_once_another_was_reached() {
        let hosts = Hosts::new(&"host=left,reached".parse().unwrap(), Duration::from_secs(2));
        hosts.connected_to(0);
        let pass_began = std::time::Instant::now();
        hosts.trouble(pass_began, 0); // the old primary stopped
        hosts.connected_to(1); // the failover's one line
                               // A pass that began on host 0 before the switch hears its refusal now.
        hosts.trouble(pass_began, 0);
        assert!(hosts.outage.lock().unwrap().is_none(), "no second outage");
        hosts.trouble(std::time::Instant::now(), 1);
        assert!(
            hosts.outage.lock().unwrap().is_some(),
            "a failure on the host in use is one"
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
