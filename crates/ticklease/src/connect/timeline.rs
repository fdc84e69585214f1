//! Which of two writable servers is the newer: a promotion moves the new
//! primary to a higher timeline, and an old primary that stays writable
//! (its failover manager died, nothing demoted it) stays on the old one.
//!
//! Every connection to a host of a multi-host URL reads its server's
//! timeline; this process remembers, per server, the highest it saw while
//! the server was writable. A server whose timeline is below one another
//! host of the same URL was seen writable on has been superseded by a
//! promotion: nothing of ours connects to it from then on (the writes it
//! takes will be rewound). Timelines only grow within one cluster (a
//! switchover back promotes again), so the knowledge never expires; a
//! cluster re-created from scratch behind the same host names starts again
//! at timeline 1, and needs the processes restarted.

use std::collections::HashMap;
use std::sync::Mutex;

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
pub(crate) fn seen(server: &str) -> Option<u32> {
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
