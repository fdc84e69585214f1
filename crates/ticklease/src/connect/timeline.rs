//! Which of two writable servers is the newer: a promotion moves the new
//! primary to a higher timeline, and an old primary that stays writable
//! (its failover manager died, nothing demoted it) stays on the old one.
//!
//! Every connection to a host of a multi-host URL reads its server's
//! timeline; this process remembers, per server (host, address, port), the
//! highest it saw while the server was writable. A server whose timeline is
//! below one another host of the same URL was seen writable on has been
//! superseded by a promotion: nothing of ours connects to it from then on
//! (the writes it takes will be rewound), and when it is one the URL used,
//! what was made there before (pooled connections, terms) is ended
//! ([`UrlTimelines::superseded_at`]). Timelines only grow within one
//! cluster (a switchover back promotes again), so the knowledge never
//! expires; a cluster re-created from scratch behind the same host names
//! starts again at timeline 1, and needs the processes restarted.

use std::collections::{HashMap, HashSet};
use std::sync::Mutex;
use std::time::Instant;

use tokio_postgres::{Client, Connection, Socket};

use crate::connect::tls::PgTlsStream;

/// The server's timeline while it is writable (the first 8 hex digits of
/// its current WAL file's name: the insertion timeline, which changes at
/// promotion, not at the next checkpoint), NULL during recovery. Callable
/// by any login.
const TIMELINE_SQL: &str = "SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL \
     ELSE pg_catalog.substr(pg_catalog.pg_walfile_name(pg_catalog.pg_current_wal_lsn()), 1, 8) END";

/// The highest timeline each server (`host:port`) was seen writable on.
static SEEN: Mutex<Option<HashMap<String, u32>>> = Mutex::new(None);

/// Reads the timeline on a new connection, driving the connection until the
/// answer comes; `None` during recovery.
pub(crate) async fn read(
    client: &Client,
    connection: &mut Connection<Socket, PgTlsStream>,
) -> Result<Option<u32>, tokio_postgres::Error> {
    let query = client.query_typed(TIMELINE_SQL, &[]);
    tokio::pin!(query);
    let rows = tokio::select! {
        rows = &mut query => rows?,
        ended = &mut *connection => {
            ended?;
            return Ok(None);
        }
    };
    let hex: Option<String> = rows.first().and_then(|r| r.get(0));
    Ok(hex.and_then(|h| u32::from_str_radix(&h, 16).ok()))
}

/// Records that `server` is writable on `timeline`.
pub(crate) fn record(server: &str, timeline: u32) {
    let mut seen = SEEN.lock().expect("not poisoned");
    let seen = seen.get_or_insert_with(HashMap::new);
    let highest = seen.entry(server.to_string()).or_insert(timeline);
    *highest = (*highest).max(timeline);
}

/// The highest timeline `server` was seen writable on.
fn seen(server: &str) -> Option<u32> {
    SEEN.lock().expect("not poisoned").as_ref()?.get(server).copied()
}

/// Another of `servers` seen writable on a higher timeline than `server`'s
/// `timeline`, the highest: `server` has been superseded by it.
pub(crate) fn superseded_by(server: &str, timeline: u32, servers: &[String]) -> Option<(String, u32)> {
    let seen = SEEN.lock().expect("not poisoned");
    let seen = seen.as_ref()?;
    servers
        .iter()
        .filter(|s| s.as_str() != server)
        .filter_map(|s| seen.get(s).map(|t| (s.clone(), *t)))
        .filter(|(_, t)| *t > timeline)
        .max_by_key(|(_, t)| *t)
}

/// One URL's judgement of its servers: which of them this process used
/// (connected to) since it last found one superseded, and when that was.
#[derive(Debug)]
pub(crate) struct UrlTimelines {
    /// Each host's server as the memory of timelines names it.
    names: Vec<String>,
    state: Mutex<UrlState>,
}

#[derive(Debug, Default)]
struct UrlState {
    used: HashSet<usize>,
    superseded_at: Option<Instant>,
    /// When a host this process used was last seen (by anyone in the
    /// process) below another host's timeline, even without answering
    /// writable itself: its pooled connections are suspect.
    stale_at: Option<Instant>,
    /// (host, timeline) found stale, each marked once.
    stale_marked: HashSet<(usize, u32)>,
    /// (host, timeline) found superseded, each logged once.
    logged: HashSet<(usize, u32)>,
    /// Hosts whose timeline could not be read, each logged once.
    unreadable: HashSet<usize>,
}

impl UrlTimelines {
    /// The timelines of the servers `names` (one per host, in order).
    pub(crate) fn new(names: Vec<String>) -> Self {
        UrlTimelines {
            names,
            state: Mutex::default(),
        }
    }

    /// Records that host `i` is writable on `timeline` and judges it: the
    /// newest other host seen writable on a higher timeline, if any. A host
    /// this process used found so marks a supersession (logged once per
    /// host and timeline): what was made on it before is suspect.
    pub(crate) fn judge(&self, i: usize, timeline: u32) -> Option<(String, u32)> {
        let server = &self.names[i];
        record(server, timeline);
        let (by, newer) = superseded_by(server, timeline, &self.names)?;
        let mut state = self.state.lock().expect("not poisoned");
        if state.used.contains(&i) {
            state.used.clear();
            state.superseded_at = Some(Instant::now());
        }
        if state.logged.insert((i, timeline)) {
            tracing::warn!(%server, timeline, %by, newer,
                "a writable server is on an older timeline than another host's: a promotion superseded it; \
                 nothing of this process connects to it, and what started there before ends");
        }
        Some((by, newer))
    }

    /// Whether any of the URL's servers was ever seen writable with a timeline.
    pub(crate) fn any_known(&self) -> bool {
        self.names.iter().any(|name| seen(name).is_some())
    }

    /// Notes a connection to host `i` (judged current when it was made: if
    /// a newer timeline was seen since, the connection is stale at once).
    pub(crate) fn used(&self, i: usize) {
        let mut state = self.state.lock().expect("not poisoned");
        state.used.insert(i);
        self.mark_stale(&mut state);
    }

    /// Marks as stale the hosts this process used that are below another
    /// host's timeline now, each once per timeline.
    fn mark_stale(&self, state: &mut UrlState) {
        let used: Vec<usize> = state.used.iter().copied().collect();
        for u in used {
            let Some(timeline) = seen(&self.names[u]) else {
                continue;
            };
            if superseded_by(&self.names[u], timeline, &self.names).is_some()
                && state.stale_marked.insert((u, timeline))
            {
                state.stale_at = Some(Instant::now());
            }
        }
    }

    /// Connections made before this instant may be to a superseded server
    /// (found so, or a used server seen below another host's timeline): the
    /// pool drops them.
    pub(crate) fn recycle_before(&self) -> Option<Instant> {
        let mut state = self.state.lock().expect("not poisoned");
        self.mark_stale(&mut state);
        state.superseded_at.max(state.stale_at)
    }

    /// Whether host `i`'s timeline could be read before (the first time a
    /// read fails is logged).
    pub(crate) fn first_unreadable(&self, i: usize) -> bool {
        self.state.lock().expect("not poisoned").unreadable.insert(i)
    }

    /// When a host this process used was last found superseded.
    pub(crate) fn superseded_at(&self) -> Option<Instant> {
        self.state.lock().expect("not poisoned").superseded_at
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_server_below_another_hosts_highest_timeline_is_superseded_by_the_highest() {
        let servers = ["tl-a:1".to_string(), "tl-b:1".into(), "tl-c:1".into()];
        record("tl-a:1", 3);
        assert_eq!(superseded_by("tl-a:1", 3, &servers), None);
        record("tl-b:1", 4);
        record("tl-c:1", 5);
        assert_eq!(superseded_by("tl-a:1", 3, &servers), Some(("tl-c:1".into(), 5)));
        assert_eq!(superseded_by("tl-c:1", 5, &servers), None);
        // Another URL's servers say nothing about this one's.
        assert_eq!(superseded_by("tl-a:1", 3, &servers[..1]), None);
        // A server re-promoted on a higher timeline is current again.
        record("tl-a:1", 6);
        assert_eq!(superseded_by("tl-a:1", 6, &servers), None);
    }
}
