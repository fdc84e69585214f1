//! The coordination session: one direct connection per replica that makes
//! takeover and handoff fast without deciding anything. See the crate docs,
//! "Coordination".
//!
//! The session holds a session advisory lock on a 64-bit key (this replica's
//! **holder key**, recorded by ACQUIRE and RENEW: its backend's pid in the
//! high 32 bits, 32 random bits below) and LISTENs on channel `ticklease`.
//! The database counts a key as alive only while the backend whose pid it
//! carries holds it, so another login that locks a dead holder's key keeps
//! nothing alive. A follower refused because a role is held waits on the
//! holder's key on a connection of its own (`pg_advisory_lock_shared`): the
//! wait returns when the holder's session ends (or, if someone else took the
//! key meanwhile, at the next re-check), and the follower ACQUIREs, which
//! takes over because the key is alive no more. Nothing
//! here is on the pooled path: a pooled deployment gives a direct URL for this
//! session alone.

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;

use futures::StreamExt;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;
use tokio_postgres::types::Type;
use tokio_postgres::{AsyncMessage, Client};
use tokio_util::sync::{CancellationToken, DropGuard};

use crate::connect::hosts::{Hosts, HostsError, RECONNECT_MAX, RECONNECT_MIN};
use crate::connect::tls::PgConnect;
use crate::error::StoreError;

/// The channel RELEASE, pause, unpause and run-now notify.
const CHANNEL: &str = "ticklease";

/// Most waiter connections one replica has open at once, one per holder key
/// it waits on (at most one per other replica that holds a role this one
/// wants), those given up and finishing their slice (at most a second)
/// among them; past it, a follower waits by the lease alone.
pub const KEY_WAITERS_MAX: usize = 16;

/// Server-side keepalives on the session: a peer whose link drops packets is
/// found dead in about idle + interval × count (or the user timeout, with
/// data unacknowledged), its backend ends and its key with it.
const KEEPALIVES: &str = "SET tcp_keepalives_idle = 2; SET tcp_keepalives_interval = 1; \
     SET tcp_keepalives_count = 2; SET tcp_user_timeout = 4000";

/// A waiter waits in slices of at most a second (`leader_key_wait`, which sets its
/// own lock timeout and catches it) to ask whether the key is still alive:
/// any login can queue for a key and be granted it when the holder's
/// session ends, and then a follower learns of it within a second. A waiter
/// that is no longer needed closes between slices, when its backend is idle
/// (silent in the server's log); one whose process dies mid-slice is
/// noticed by the server within a second.
const WAITER_SETTINGS: &str = "SET statement_timeout = 0; SET idle_session_timeout = 0; \
     SET client_connection_check_interval = 1000";

/// Tries to find a free key (a collision is a 2^-32 event: the high half is
/// this backend's pid).
const KEY_TRIES: usize = 3;

/// The signals a store with a coordination session gives the scheduler: this
/// replica's holder key, per-role wake-ups from notifications, and waits on
/// other holders' keys. Cloned with its store; the session ends when the last
/// clone is dropped.
#[derive(Clone)]
pub struct Signals {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Signals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Signals").field("key", &self.key()).finish()
    }
}

struct Inner {
    events: Arc<Events>,
    direct: Arc<Hosts>,
    connect_timeout: Duration,
    waiters: Mutex<HashMap<i64, Weak<KeyWaiter>>>,
    /// Waiter tasks alive, those given up and finishing their slice among
    /// them: at most [`KEY_WAITERS_MAX`].
    open: Arc<AtomicUsize>,
    _stop: DropGuard,
}

/// What the session task shares with the scheduler.
struct Events {
    /// This replica's holder key; `None` while the session is down.
    key: watch::Sender<Option<i64>>,
    roles: Mutex<HashMap<String, Arc<RoleSignals>>>,
    /// Family loops, by family name: one wake-up for any of their keys.
    families: Mutex<HashMap<String, Arc<FamilySignals>>>,
    /// The database refused the key as held by no session: the session is
    /// dead though its client has not noticed (a cut link whose end the
    /// server's keepalives found first).
    refused: Notify,
    /// The last [`PROBES_KEPT`] `probe` payloads heard: every session hears
    /// every replica's probe, and replicas starting together probe at once.
    probe: watch::Sender<std::collections::VecDeque<String>>,
}

/// Past this many roles' wake-ups, unused ones are dropped before another is added.
const ROLE_SIGNALS_PRUNE: usize = 1024;

/// Probes a session remembers, so one started among many still finds its own.
const PROBES_KEPT: usize = 64;

/// Wake-ups of one role.
#[derive(Debug, Default)]
pub(crate) struct RoleSignals {
    /// Released, unpaused or run now (or the session reconnected and may
    /// have missed one): a follower ACQUIREs now.
    pub(crate) follower: Notify,
    /// Paused: the holder renews now.
    pub(crate) holder: Notify,
    /// How many run-nows were heard (or might have been missed, at a
    /// reconnect): a cron role's cached answer is stale once this moves. A
    /// release or an unpause leaves it: the next occurrence is asked for
    /// anyway, and every replica looking after each release would double the
    /// statements of an occurrence.
    told: std::sync::atomic::AtomicU64,
}

impl RoleSignals {
    pub(crate) fn told(&self) -> u64 {
        self.told.load(std::sync::atomic::Ordering::Acquire)
    }

    fn run_now(&self) {
        self.told.fetch_add(1, std::sync::atomic::Ordering::AcqRel);
        self.follower.notify_one();
    }
}

/// Wake-ups of a family loop: the keys released, unpaused or run now since
/// it last looked (at most [`FAMILY_TOLD_MAX`]; past that, or after a
/// reconnect, every key).
#[derive(Debug, Default)]
pub(crate) struct FamilySignals {
    pub(crate) notify: Notify,
    told: Mutex<Told>,
}

#[derive(Debug, Default)]
struct Told {
    keys: std::collections::BTreeSet<String>,
    all: bool,
}

/// Keys a family remembers being told of between two looks; a flood of
/// forged notifications beyond it costs one look at every key.
const FAMILY_TOLD_MAX: usize = 1024;

/// What a family loop was told since it last looked.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Heard {
    Keys(Vec<String>),
    All,
}

impl FamilySignals {
    fn tell(&self, key: &str) {
        let mut told = self.told.lock().expect("not poisoned");
        if told.keys.len() >= FAMILY_TOLD_MAX {
            told.all = true;
        } else {
            told.keys.insert(key.to_string());
        }
        drop(told);
        self.notify.notify_one();
    }

    fn tell_all(&self) {
        self.told.lock().expect("not poisoned").all = true;
        self.notify.notify_one();
    }

    /// Takes what was told.
    pub(crate) fn take(&self) -> Heard {
        let told = std::mem::take(&mut *self.told.lock().expect("not poisoned"));
        if told.all {
            Heard::All
        } else {
            Heard::Keys(told.keys.into_iter().collect())
        }
    }
}

impl Events {
    fn role(&self, role: &str) -> Arc<RoleSignals> {
        let mut roles = self.roles.lock().expect("not poisoned");
        if roles.len() >= ROLE_SIGNALS_PRUNE && !roles.contains_key(role) {
            // Family keys come and go: drop the entries no term or loop uses any more.
            roles.retain(|_, signals| Arc::strong_count(signals) > 1);
        }
        roles.entry(role.to_string()).or_default().clone()
    }

    /// A notification on this session's probe channel.
    fn probed(&self, nonce: &str) {
        self.probe.send_modify(|heard| {
            if heard.len() == PROBES_KEPT {
                heard.pop_front();
            }
            heard.push_back(nonce.to_string());
        });
    }

    fn dispatch(&self, payload: &str) {
        let Some((event, role)) = payload.split_once(' ') else {
            return;
        };
        if matches!(event, "release" | "unpause" | "run_now") {
            if let Some((family, key)) = role.split_once(':') {
                if let Some(signals) = self.families.lock().expect("not poisoned").get(family) {
                    signals.tell(key);
                }
            }
        }
        let roles = self.roles.lock().expect("not poisoned");
        let Some(signals) = roles.get(role) else {
            return;
        };
        match event {
            "release" | "unpause" => signals.follower.notify_one(),
            "run_now" => signals.run_now(),
            "pause" => signals.holder.notify_one(),
            _ => {}
        }
    }

    /// After a reconnect: a notification may have been missed, so every
    /// follower asks now and every holder renews now.
    fn wake_all(&self) {
        for signals in self.roles.lock().expect("not poisoned").values() {
            signals.run_now();
            signals.holder.notify_one();
        }
        for signals in self.families.lock().expect("not poisoned").values() {
            signals.tell_all();
        }
    }
}

impl Signals {
    /// Opens the coordination session on `direct` and keeps it open
    /// (reconnecting with a new key after it is lost) until the last clone
    /// is dropped.
    ///
    /// `check` runs through the pooled path with the session's key and its
    /// probe channel (see [`crate::PgStore::with_direct`]): it must send a
    /// notification on that channel, which the session must then hear. The
    /// session listens on the probe channel alone until then, so nothing
    /// other logins send on `ticklease` stands in the probe's way.
    ///
    /// A session that cannot be opened at all at the start (the server does
    /// not answer within the timeout, a connection flood) does not fail the
    /// start: the replica leads without it (its terms then end by their
    /// lease, as without a direct URL; `leader_coordination_up` 0) while the
    /// session is opened again with backoff, checked the same way once it
    /// opens. A session that opens and fails the check fails the start.
    pub(crate) async fn start<C, F>(
        direct: PgConnect,
        connect_timeout: Duration,
        check: C,
    ) -> Result<Self, StoreError>
    where
        C: Fn(i64, String) -> F + Send + Sync + 'static,
        F: Future<Output = Result<(), StoreError>> + Send + 'static,
    {
        let events = Arc::new(Events {
            key: watch::Sender::new(None),
            roles: Mutex::default(),
            families: Mutex::default(),
            refused: Notify::new(),
            probe: watch::Sender::new(std::collections::VecDeque::new()),
        });
        // Each host of a multi-host URL gets a share of the connect timeout.
        let direct = Arc::new(Hosts::new(&with_client_keepalives(direct), connect_timeout).quiet());
        let first = match open_checked(&direct, connect_timeout, &events, &check).await {
            Ok(session) => {
                // Up when the start returns: the first statements record the key.
                events.key.send_replace(Some(session.key));
                Some(session)
            }
            Err(Opening::Refused(error)) => return Err(error),
            Err(Opening::Unreachable(error)) => {
                tracing::warn!(
                    error = &error as &dyn std::error::Error,
                    "coordination session could not open; leading without it (terms end by their lease) \
                     while it is opened again"
                );
                None
            }
        };
        let stop = CancellationToken::new();
        tokio::spawn(keep_starting(
            direct.clone(),
            connect_timeout,
            events.clone(),
            stop.clone(),
            first,
            check,
        ));
        Ok(Signals {
            inner: Arc::new(Inner {
                events,
                direct,
                connect_timeout,
                waiters: Mutex::default(),
                open: Arc::default(),
                _stop: stop.drop_guard(),
            }),
        })
    }

    /// This replica's holder key while its session is up.
    pub(crate) fn key(&self) -> Option<i64> {
        *self.inner.events.key.borrow()
    }

    /// The database said no session holds `key`: if it is still this
    /// replica's key, withdraw it (statements record none) and reconnect.
    pub(crate) fn key_refused(&self, key: i64) {
        let events = &self.inner.events;
        if events.key.send_if_modified(|k| {
            let ours = *k == Some(key);
            if ours {
                *k = None;
            }
            ours
        }) {
            events.refused.notify_one();
        }
    }

    /// The wake-ups of `role` (registered on first use).
    pub(crate) fn role(&self, role: &str) -> Arc<RoleSignals> {
        self.inner.events.role(role)
    }

    /// The wake-ups of the family `name`'s loop (registered on first use).
    pub(crate) fn family(&self, name: &str) -> Arc<FamilySignals> {
        let mut families = self.inner.events.families.lock().expect("not poisoned");
        families.entry(name.to_string()).or_default().clone()
    }

    /// Resolves when no session holds `key` any more (its holder died or
    /// lost its session); never resolves if the wait itself fails. `None`
    /// when [`KEY_WAITERS_MAX`] other keys are being waited on.
    pub(crate) fn holder_gone(&self, key: i64) -> Option<impl Future<Output = ()> + Send + 'static> {
        let waiter = {
            let mut waiters = self.inner.waiters.lock().expect("not poisoned");
            match waiters.get(&key).and_then(Weak::upgrade) {
                Some(waiter) => waiter,
                None => {
                    waiters.retain(|_, w| w.strong_count() > 0);
                    if self.inner.open.load(Ordering::Relaxed) >= KEY_WAITERS_MAX {
                        return None;
                    }
                    let waiter = Arc::new(KeyWaiter::spawn(
                        self.inner.direct.clone(),
                        self.inner.connect_timeout,
                        key,
                        OpenWaiter::new(&self.inner.open),
                    ));
                    waiters.insert(key, Arc::downgrade(&waiter));
                    waiter
                }
            }
        };
        Some(async move {
            let mut gone = waiter.gone.clone();
            if gone.wait_for(|gone| *gone).await.is_err() {
                std::future::pending::<()>().await;
            }
        })
    }
}

/// An open coordination session: its client (dropping it closes the
/// session) and the task that reads its notifications until it ends.
struct Session {
    client: Client,
    key: i64,
    reader: AbortOnDrop,
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;

impl Session {
    async fn open(
        direct: &Hosts,
        connect_timeout: Duration,
        events: &Arc<Events>,
        listen: Listen,
    ) -> Result<Self, BoxError> {
        let (client, mut connection) = tokio::time::timeout(connect_timeout, direct.connect()).await??;
        let events = events.clone();
        let reader = AbortOnDrop(tokio::spawn(async move {
            let mut messages = futures::stream::poll_fn(move |cx| connection.poll_message(cx));
            while let Some(message) = messages.next().await {
                match message {
                    Ok(AsyncMessage::Notification(n)) if n.channel() == CHANNEL => {
                        events.dispatch(n.payload())
                    }
                    Ok(AsyncMessage::Notification(n)) => events.probed(n.payload()),
                    Ok(_) => {}
                    Err(error) => {
                        tracing::debug!(
                            error = &error as &dyn std::error::Error,
                            "coordination session ended"
                        );
                        return;
                    }
                }
            }
        }));
        tokio::time::timeout(connect_timeout, async {
            client.batch_execute(KEEPALIVES).await?;
            let pid: i32 = client.query_one("SELECT pg_backend_pid()", &[]).await?.get(0);
            let mut taken = None;
            for _ in 0..KEY_TRIES {
                let key = holder_key(pid, rand::random());
                let rows = client
                    .query_typed("SELECT pg_try_advisory_lock($1)", &[(&key, Type::INT8)])
                    .await?;
                if rows.first().is_some_and(|r| r.get::<_, bool>(0)) {
                    taken = Some(key);
                    break;
                }
            }
            let key = taken.ok_or("no free coordination key")?;
            // Last: from here on notifications arrive, and nothing of the
            // setup waits behind them.
            let session = Session { client, key, reader };
            match listen {
                Listen::Probe => {
                    session
                        .client
                        .batch_execute(&format!("LISTEN {}", probe_channel(key)))
                        .await?
                }
                Listen::All => session.listen().await?,
            }
            Ok::<_, BoxError>(session)
        })
        .await?
    }
}

impl Session {
    /// LISTEN on the channel of releases, pauses, unpauses and run-nows.
    async fn listen(&self) -> Result<(), tokio_postgres::Error> {
        self.client.batch_execute(&format!("LISTEN {CHANNEL}")).await
    }
}

/// What a new session listens on: its own probe channel only (the first,
/// until the coordination check heard the probe), or the shared channel.
#[derive(Debug, Clone, Copy)]
enum Listen {
    Probe,
    All,
}

/// The channel a session's coordination check sends its probe on: its own,
/// so other logins' notifications on `ticklease` never delay the probe.
fn probe_channel(key: i64) -> String {
    format!("{CHANNEL}_probe_{key}")
}

/// A holder key: the backend's pid above, 32 random bits below (the
/// database checks the pid against the lock's holder).
fn holder_key(pid: i32, random: u32) -> i64 {
    (i64::from(pid) << 32) | i64::from(random)
}

/// Why a session could not be opened and checked.
enum Opening {
    /// It could not be opened (or set up) in time: worth trying again.
    Unreachable(StoreError),
    /// It opened and the check refused it: the direct URL is wrong.
    Refused(StoreError),
}

/// Whether the server refused the direct URL's login or database (its
/// authentication, class 28; an unknown database, 3D000; no CONNECT
/// privilege, 42501): a wrong URL, which no retry mends, not an outage.
fn login_refused(error: &(dyn std::error::Error + 'static)) -> bool {
    let db = match error.downcast_ref::<HostsError>() {
        Some(HostsError::Db(e)) => Some(e),
        _ => error.downcast_ref::<tokio_postgres::Error>(),
    };
    db.and_then(tokio_postgres::Error::code).is_some_and(|code| {
        code.code().starts_with("28")
            || *code == tokio_postgres::error::SqlState::INVALID_CATALOG_NAME
            || *code == tokio_postgres::error::SqlState::INSUFFICIENT_PRIVILEGE
    })
}

/// Opens a session listening on its probe channel, runs `check` through
/// the pooled path, waits to hear its probe, then listens on the shared channel.
async fn open_checked<C, F>(
    direct: &Hosts,
    connect_timeout: Duration,
    events: &Arc<Events>,
    check: &C,
) -> Result<Session, Opening>
where
    C: Fn(i64, String) -> F,
    F: Future<Output = Result<(), StoreError>>,
{
    let unreachable = |source| {
        Opening::Unreachable(StoreError::Connect {
            statement: "coordination session",
            source,
        })
    };
    let session = Session::open(direct, connect_timeout, events, Listen::Probe)
        .await
        .map_err(|source: BoxError| {
            if login_refused(source.as_ref()) {
                Opening::Refused(StoreError::Connect {
                    statement: "coordination session",
                    source,
                })
            } else {
                unreachable(source)
            }
        })?;
    let mut probe = events.probe.subscribe();
    let nonce = session.key.to_string();
    check(session.key, probe_channel(session.key))
        .await
        .map_err(|error| match error.is_transient() {
            // A check that could not finish says nothing of the URL: try again.
            true => Opening::Unreachable(error),
            false => Opening::Refused(error),
        })?;
    let heard = probe.wait_for(|heard| heard.iter().any(|h| *h == nonce));
    if tokio::time::timeout(connect_timeout, heard).await.is_err() {
        return Err(Opening::Refused(StoreError::Rejected {
            statement: "coordination check",
            problem: "the coordination session hears no notifications: the direct URL must reach \
                      Postgres itself, not a transaction-mode pooler",
        }));
    }
    tokio::time::timeout(connect_timeout, session.listen())
        .await
        .map_err(|elapsed| unreachable(elapsed.into()))?
        .map_err(|e| unreachable(e.into()))?;
    Ok(session)
}

/// [`keep`], after opening the first session with backoff when the start
/// could not. A check that refuses it then is logged as an error and the
/// replica goes on without a session (as one started without a direct URL).
async fn keep_starting<C, F>(
    direct: Arc<Hosts>,
    connect_timeout: Duration,
    events: Arc<Events>,
    stop: CancellationToken,
    first: Option<Session>,
    check: C,
) where
    C: Fn(i64, String) -> F + Send + Sync + 'static,
    F: Future<Output = Result<(), StoreError>> + Send + 'static,
{
    let mut backoff = RECONNECT_MIN;
    let session = match first {
        Some(session) => session,
        None => loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            match open_checked(&direct, connect_timeout, &events, &check).await {
                Ok(session) => break session,
                Err(Opening::Refused(error)) => {
                    tracing::error!(
                        error = &error as &dyn std::error::Error,
                        "coordination session refused by its check; leading without it"
                    );
                    return;
                }
                Err(Opening::Unreachable(error)) => {
                    tracing::warn!(
                        error = &error as &dyn std::error::Error,
                        ?backoff,
                        "coordination session could not open"
                    );
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                }
            }
        },
    };
    keep(direct, connect_timeout, events, stop, session).await;
}

/// Keeps the session open until `stop`: when it ends, the key is withdrawn
/// (ACQUIRE and RENEW then record none) and a new session is opened.
async fn keep(
    direct: Arc<Hosts>,
    connect_timeout: Duration,
    events: Arc<Events>,
    stop: CancellationToken,
    mut session: Session,
) {
    loop {
        events.key.send_replace(Some(session.key));
        events.wake_all();
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = &mut session.reader.0 => {
                // The host's one line tells a failover; the gauge says the session is down.
                tracing::debug!("coordination session lost; reconnecting");
            }
            _ = events.refused.notified() => {
                tracing::warn!("the database holds this replica's key no more; reconnecting the coordination session");
            }
        }
        events.key.send_replace(None);
        drop(session);
        let mut backoff = RECONNECT_MIN;
        session = loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep(backoff) => {}
            }
            match Session::open(&direct, connect_timeout, &events, Listen::All).await {
                Ok(session) => break session,
                Err(error) => {
                    tracing::debug!(
                        error = &*error as &dyn std::error::Error,
                        ?backoff,
                        "coordination session could not reconnect"
                    );
                    backoff = (backoff * 2).min(RECONNECT_MAX);
                }
            }
        };
    }
}

/// A wait on another holder's key, on a direct connection of its own,
/// shared by every role loop waiting on that key. Dropped with its last
/// user, which closes the connection.
struct KeyWaiter {
    gone: watch::Receiver<bool>,
    _stop: DropGuard,
}

impl KeyWaiter {
    fn spawn(direct: Arc<Hosts>, connect_timeout: Duration, key: i64, open: OpenWaiter) -> Self {
        let (gone, receiver) = watch::channel(false);
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        tokio::spawn(async move {
            let _open = open;
            // A wait that fails (its backend terminated, a restart) is
            // retried with backoff; the slot is this waiter's until its last
            // user drops it, and its users wake at the lease's expiry anyway.
            // A stop takes effect between slices (within a second), never
            // mid-wait: see WAITER_SETTINGS.
            let mut backoff = RECONNECT_MIN;
            loop {
                match wait_for_key(&direct, connect_timeout, key, &stopped).await {
                    Ok(Waited::Gone) => {
                        gone.send_replace(true);
                        return;
                    }
                    Ok(Waited::Stopped) => return,
                    Err(error) => tracing::debug!(
                        error = &*error as &dyn std::error::Error,
                        ?backoff,
                        "wait on a holder key failed; retrying"
                    ),
                }
                tokio::select! {
                    _ = stopped.cancelled() => return,
                    _ = tokio::time::sleep(backoff) => {}
                }
                backoff = (backoff * 2).min(RECONNECT_MAX);
            }
        });
        KeyWaiter {
            gone: receiver,
            _stop: stop.drop_guard(),
        }
    }
}

/// Counts a waiter task as open until it ends (its connection closed).
struct OpenWaiter(Arc<AtomicUsize>);

impl OpenWaiter {
    fn new(open: &Arc<AtomicUsize>) -> Self {
        open.fetch_add(1, Ordering::Relaxed);
        OpenWaiter(open.clone())
    }
}

impl Drop for OpenWaiter {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// How a wait on a holder's key ended.
enum Waited {
    Gone,
    Stopped,
}

async fn wait_for_key(
    direct: &Hosts,
    connect_timeout: Duration,
    key: i64,
    stop: &CancellationToken,
) -> Result<Waited, BoxError> {
    let connect = async {
        let (client, connection) = tokio::time::timeout(connect_timeout, direct.connect()).await??;
        let driver = AbortOnDrop(tokio::spawn(async move {
            let _ = connection.await;
        }));
        tokio::time::timeout(connect_timeout, client.batch_execute(WAITER_SETTINGS)).await??;
        Ok::<_, BoxError>((client, driver))
    };
    let (client, _driver) = tokio::select! {
        _ = stop.cancelled() => return Ok(Waited::Stopped),
        connected = connect => connected?,
    };
    // Granted when the holder's session ends; held until this connection
    // closes (see leader_key_wait).
    loop {
        let gone = client
            .query_typed("SELECT leader_key_wait($1)", &[(&key, Type::INT8)])
            .await?;
        if gone.first().is_some_and(|r| r.get::<_, bool>(0)) {
            return Ok(Waited::Gone);
        }
        if stop.is_cancelled() {
            return Ok(Waited::Stopped);
        }
    }
}

/// Named as ticklease's, and client-side keepalives on every direct connection, as the server's: a
/// link that drops packets ends the session from this side too, in about
/// idle + interval × retries (or the user timeout with data unacknowledged).
fn with_client_keepalives(direct: PgConnect) -> PgConnect {
    let mut direct = direct.named("coordination");
    direct
        .config_mut()
        .keepalives(true)
        .keepalives_idle(Duration::from_secs(2))
        .keepalives_interval(Duration::from_secs(1))
        .keepalives_retries(2)
        .tcp_user_timeout(Duration::from_secs(4));
    direct
}

/// The least time between two statements one role runs because it was told
/// to: anyone who can connect can NOTIFY, so a storm of forged notifications
/// costs at most one statement per spacing per role and replica, while the
/// first signal after a quiet spell acts at once.
pub(crate) const SIGNAL_SPACING: Duration = Duration::from_millis(200);

/// Resolves when `notify` fires, but no sooner than [`SIGNAL_SPACING`] after
/// `last` (the previous signal acted on); never without signals.
pub(crate) async fn told(notify: Option<&Notify>, last: Option<tokio::time::Instant>) {
    let Some(notify) = notify else {
        return std::future::pending().await;
    };
    notify.notified().await;
    if let Some(last) = last {
        tokio::time::sleep_until(last + SIGNAL_SPACING).await;
    }
}

/// A task aborted when its handle is dropped.
struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
