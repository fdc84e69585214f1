//! The failover manager's word (opt-in, [`crate::PgStore::with_patroni`]): a
//! term starts, and runs on, only while Patroni says that the server this
//! store's statements reach is the primary.
//!
//! Why: timelines ([`crate::hosts`]) tell an old primary from the promoted
//! one only when this process reaches both. A process that cannot see the
//! promotion (the old primary's Patroni died and nothing demoted it; a
//! partition; the promoted server's connection slots full; a pooler in front
//! of the old primary) reaches a writable server whose lease rows still name
//! its terms: RENEW succeeds there, and the term's work runs beside the
//! promoted server's. Patroni decided the promotion; its REST API says who
//! holds the leader key.
//!
//! The check, every half `heartbeat_every`: `GET /primary` on every given
//! member at once, and the postmaster start time of the server the store's
//! pool reaches (one statement: a server's identity, through a pooler too).
//! Confirmed when a member answered 200 (Patroni answers 200 only on the
//! member holding the leader key) as a running primary whose postmaster
//! started at that time. Not the timeline: Patroni answers 200 as soon as
//! its member holds the key, while its Postgres still replays WAL on the old
//! timeline, which an old primary's timeline equals. The instant the check
//! started is the confirmation's.
//!
//! The bound: the leader renews its key every `loop_wait`, and demotes
//! itself (answering 503 from then on) once a renewal has failed for
//! `retry_timeout`; another member takes the key only when it expires, `ttl`
//! after the last renewal. So no member is promoted before a confirmation's
//! instant + `ttl − loop_wait − retry_timeout` (the margin). A term ends
//! `abandon_after` after its last confirmation (the heartbeat, reason
//! `superseded`), and ACQUIRE is not sent without a confirmation younger than
//! `abandon_after − heartbeat_every`; [`crate::PgStore::with_patroni`] reads
//! Patroni's settings (`GET /config`) and refuses `abandon_after +
//! statement_timeout` above the margin, so an old primary's terms have
//! stopped, with their last statement, before another server is promoted.
//! It relies on Patroni's `failsafe_mode` off (refused when on: a leader cut
//! off from the DCS then stays primary), and on the clocks of the Patroni
//! hosts and this one running at one rate. Patroni unreachable ends terms
//! too: without its word no term runs.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

/// Most Patroni members one check asks.
pub const PATRONI_URLS_MAX: usize = 16;
/// Longest answer read from a member.
const ANSWER_BYTES_MAX: usize = 64 * 1024;

/// Why the failover manager's word cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PatroniError {
    /// No member's REST API was given.
    #[error("no Patroni REST API URL given")]
    NoUrl,
    /// More members than [`PATRONI_URLS_MAX`].
    #[error("{given} Patroni REST API URLs given; at most {max}")]
    TooManyUrls {
        /// How many were given.
        given: usize,
        /// The most accepted.
        max: usize,
    },
    /// A URL that is not `http://host:port`.
    #[error("Patroni REST API URL {url:?}: {problem}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// No member answered `GET /config` with Patroni's settings.
    #[error("no Patroni member answered GET /config with its settings (asked {asked})")]
    NoSettings {
        /// The members asked.
        asked: String,
    },
    /// Patroni's `failsafe_mode` is on.
    #[error(
        "Patroni's failsafe_mode is on: a leader cut off from the DCS then stays primary, so its word bounds nothing"
    )]
    FailsafeMode,
    /// The settings leave a term running after another member may be promoted.
    #[error(
        "abandon_after {abandon_after:?} + statement_timeout {statement_timeout:?} exceeds Patroni's \
         ttl {ttl:?} - loop_wait {loop_wait:?} - retry_timeout {retry_timeout:?}: a term could outlive \
         its server's leadership; lower abandon_after or raise Patroni's ttl"
    )]
    Margin {
        /// The replica's `abandon_after`.
        abandon_after: Duration,
        /// The replica's `statement_timeout`.
        statement_timeout: Duration,
        /// Patroni's `ttl`.
        ttl: Duration,
        /// Patroni's `loop_wait`.
        loop_wait: Duration,
        /// Patroni's `retry_timeout`.
        retry_timeout: Duration,
    },
    /// The HTTP client could not be built.
    #[error("could not build the HTTP client for Patroni")]
    Client {
        /// reqwest's error.
        #[source]
        source: reqwest::Error,
    },
}

/// Patroni's settings that bound its promotions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatroniSettings {
    /// How long the leader key lives unrenewed.
    pub ttl: Duration,
    /// How often the leader renews it.
    pub loop_wait: Duration,
    /// How long a failing renewal is retried before the leader demotes itself.
    pub retry_timeout: Duration,
    /// A leader cut off from the DCS stays primary while it reaches every member.
    pub failsafe_mode: bool,
}

impl PatroniSettings {
    /// How long after a confirmation no other member can be promoted.
    pub fn margin(&self) -> Duration {
        self.ttl.saturating_sub(self.loop_wait + self.retry_timeout)
    }
}

/// The REST APIs of a Patroni cluster's members.
#[derive(Debug, Clone)]
pub struct Patroni {
    urls: Vec<reqwest::Url>,
    http: reqwest::Client,
}

impl Patroni {
    /// The members' REST APIs (`http://host:8008`), each request bounded by `timeout`.
    pub fn new<I, U>(urls: I, timeout: Duration) -> Result<Self, PatroniError>
    where
        I: IntoIterator<Item = U>,
        U: AsRef<str>,
    {
        let urls: Vec<reqwest::Url> = urls
            .into_iter()
            .map(|u| parse(u.as_ref()))
            .collect::<Result<_, _>>()?;
        if urls.is_empty() {
            return Err(PatroniError::NoUrl);
        }
        if urls.len() > PATRONI_URLS_MAX {
            return Err(PatroniError::TooManyUrls {
                given: urls.len(),
                max: PATRONI_URLS_MAX,
            });
        }
        let http = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|source| PatroniError::Client { source })?;
        Ok(Patroni { urls, http })
    }

    /// Patroni's settings, from the first member that answers `GET /config`.
    pub async fn settings(&self) -> Result<PatroniSettings, PatroniError> {
        for url in &self.urls {
            let Some(config) = self.get_json(url, "config").await.and_then(|(_, v)| v) else {
                continue;
            };
            let secs = |field: &str| config.get(field).and_then(serde_json::Value::as_u64);
            // Patroni's own defaults for settings the dynamic config leaves out.
            let settings = PatroniSettings {
                ttl: Duration::from_secs(secs("ttl").unwrap_or(30)),
                loop_wait: Duration::from_secs(secs("loop_wait").unwrap_or(10)),
                retry_timeout: Duration::from_secs(secs("retry_timeout").unwrap_or(10)),
                failsafe_mode: config.get("failsafe_mode").and_then(serde_json::Value::as_bool) == Some(true),
            };
            return Ok(settings);
        }
        Err(PatroniError::NoSettings {
            asked: self
                .urls
                .iter()
                .map(reqwest::Url::as_str)
                .collect::<Vec<_>>()
                .join(", "),
        })
    }

    /// The postmaster of the member that answers `GET /primary` with 200
    /// as a running primary, if one does: its start time in microseconds
    /// since the epoch (a server's identity: another member's, or a
    /// restarted one, differs). Patroni answers 200 from the moment its
    /// member holds the leader key, before its Postgres has left recovery:
    /// such an answer confirms nothing.
    pub(crate) async fn leader_postmaster(&self) -> Option<i64> {
        let mut pending: Vec<_> = self
            .urls
            .iter()
            .map(|url| Box::pin(self.get_json(url, "primary")))
            .collect();
        while !pending.is_empty() {
            let (answer, _, rest) = futures::future::select_all(pending).await;
            pending = rest;
            if let Some((200, Some(body))) = answer {
                if let Some(started) = running_primary(&body) {
                    return Some(started);
                }
            }
        }
        None
    }

    /// `GET path` on one member: its status and its JSON body (if the body is JSON).
    async fn get_json(&self, base: &reqwest::Url, path: &str) -> Option<(u16, Option<serde_json::Value>)> {
        let url = base.join(path).ok()?;
        let response = self.http.get(url).send().await.ok()?;
        let status = response.status().as_u16();
        let body = response.bytes().await.ok()?;
        let json = (body.len() <= ANSWER_BYTES_MAX)
            .then(|| serde_json::from_slice(&body).ok())
            .flatten();
        Some((status, json))
    }
}

/// A status body's postmaster start time (µs since the epoch), when it
/// says its Postgres runs as the primary.
fn running_primary(body: &serde_json::Value) -> Option<i64> {
    let role = body.get("role")?.as_str()?;
    if !matches!(role, "master" | "primary") || body.get("state")?.as_str()? != "running" {
        return None;
    }
    // Python's str() of a datetime: "2026-12-05 12:40:37.123456+00:00".
    let started = body.get("postmaster_start_time")?.as_str()?;
    let started = chrono::DateTime::parse_from_str(started, "%Y-%m-%d %H:%M:%S%.f%:z").ok()?;
    Some(started.timestamp_micros())
}

/// The postmaster start time (µs since the epoch) of the server a
/// statement reaches, NULL while it is in recovery. Callable by any login.
pub(crate) const POSTMASTER_SQL: &str = "SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL \
     ELSE (EXTRACT(epoch FROM pg_catalog.pg_postmaster_start_time()) * 1000000)::int8 END";

/// `http://host[:port][/]`: the REST API's root.
fn parse(url: &str) -> Result<reqwest::Url, PatroniError> {
    let bad = |problem| PatroniError::BadUrl {
        url: url.to_owned(),
        problem,
    };
    let parsed = reqwest::Url::parse(url).map_err(|_| bad("not a URL"))?;
    if parsed.scheme() != "http" {
        return Err(bad("only http:// is supported (the REST API's plain listener)"));
    }
    if parsed.host_str().is_none_or(str::is_empty) {
        return Err(bad("no host"));
    }
    if !parsed.username().is_empty() || parsed.password().is_some() {
        return Err(bad("credentials in the URL are not supported"));
    }
    if parsed.path() != "/" || parsed.query().is_some() || parsed.fragment().is_some() {
        return Err(bad("give the REST API's root, with no path or query"));
    }
    Ok(parsed)
}

/// What the failover manager last said of the store's server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// Never confirmed as the primary.
    Never,
    /// Confirmed by the check that started at this instant (the latest).
    At(std::time::Instant),
}

/// The latest confirmation, shared by the check's task and the store's clones.
#[derive(Debug)]
pub(crate) struct Confirmations {
    at: Mutex<Option<Instant>>,
    /// Whether the last check confirmed (for one log line per change).
    confirmed: Mutex<Option<bool>>,
}

impl Confirmations {
    pub(crate) fn latest(&self) -> Confirmation {
        match *self.at.lock().expect("not poisoned") {
            Some(at) => Confirmation::At(at.into_std()),
            None => Confirmation::Never,
        }
    }

    /// Records one check's result; logs a change.
    fn record(&self, started: Instant, leader: Option<i64>, ours: Option<i64>) {
        let confirmed = leader.is_some() && leader == ours;
        if confirmed {
            let mut at = self.at.lock().expect("not poisoned");
            *at = Some(at.map_or(started, |before| before.max(started)));
        }
        let before = self.confirmed.lock().expect("not poisoned").replace(confirmed);
        if before == Some(confirmed) {
            return;
        }
        match (confirmed, leader) {
            (true, _) => {
                tracing::info!(timeline = ?ours, "Patroni confirms the store's server as the primary")
            }
            (false, None) => tracing::warn!(server_timeline = ?ours,
                "no Patroni member says it is the primary: no term starts, and terms end abandon_after after the last confirmation"),
            (false, Some(_)) => tracing::warn!(reached_primary = ours.is_some(),
                "Patroni's primary is not the store's server: no term starts, and terms end abandon_after after the last confirmation"),
        }
    }
}

/// Checks every `every` until the guard is dropped: `leader` asks Patroni,
/// `ours` reads the postmaster of the server the store reaches.
pub(crate) fn watch<L, O, LF, OF>(every: Duration, leader: L, ours: O) -> (Arc<Confirmations>, DropGuard)
where
    L: Fn() -> LF + Send + 'static,
    O: Fn() -> OF + Send + 'static,
    LF: std::future::Future<Output = Option<i64>> + Send,
    OF: std::future::Future<Output = Option<i64>> + Send,
{
    let confirmations = Arc::new(Confirmations {
        at: Mutex::new(None),
        confirmed: Mutex::new(None),
    });
    let stop = CancellationToken::new();
    let (record, stopped) = (confirmations.clone(), stop.clone());
    tokio::spawn(async move {
        loop {
            let started = Instant::now();
            let (leader, ours) = futures::join!(leader(), ours());
            record.record(started, leader, ours);
            tokio::select! {
                _ = stopped.cancelled() => return,
                _ = tokio::time::sleep_until(started + every) => {}
            }
        }
    });
    (confirmations, stop.drop_guard())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_url_must_be_a_plain_http_root() {
        assert!(parse("http://10.0.0.1:8008").is_ok());
        assert!(parse("http://db1:8008/").is_ok());
        for (url, problem) in [
            ("db1", "not a URL"),
            ("db1:8008", "only http://"),
            ("https://db1:8008", "only http://"),
            ("http://u:p@db1:8008", "credentials"),
            ("http://db1:8008/primary", "root"),
            ("http://db1:8008/?x=1", "root"),
        ] {
            let error = parse(url).unwrap_err().to_string();
            assert!(error.contains(problem), "{url}: {error}");
        }
    }

    #[test]
    fn no_url_and_too_many_urls_are_refused() {
        let none: [&str; 0] = [];
        assert!(matches!(
            Patroni::new(none, Duration::from_secs(1)),
            Err(PatroniError::NoUrl)
        ));
        let many = (0..=PATRONI_URLS_MAX).map(|i| format!("http://h{i}:8008"));
        assert!(matches!(
            Patroni::new(many, Duration::from_secs(1)),
            Err(PatroniError::TooManyUrls { .. })
        ));
    }

    #[test]
    fn only_a_running_primary_names_its_postmaster() {
        let body = |role: &str, state: &str| {
            serde_json::json!({"state": state, "role": role,
                "postmaster_start_time": "2026-12-05 12:40:37.123456+01:00", "timeline": 2})
        };
        let micros = chrono::DateTime::parse_from_rfc3339("2026-12-05T11:40:37.123456Z")
            .unwrap()
            .timestamp_micros();
        assert_eq!(running_primary(&body("master", "running")), Some(micros));
        assert_eq!(running_primary(&body("primary", "running")), Some(micros));
        assert_eq!(running_primary(&body("replica", "running")), None);
        assert_eq!(running_primary(&body("master", "starting")), None);
        let whole = serde_json::json!({"state": "running", "role": "master",
            "postmaster_start_time": "2026-12-05 12:40:37+00:00"});
        assert!(
            running_primary(&whole).is_some(),
            "a start on a whole second has no fraction"
        );
    }

    #[test]
    fn the_margin_is_the_ttl_less_a_loop_and_the_retries() {
        let s = PatroniSettings {
            ttl: Duration::from_secs(30),
            loop_wait: Duration::from_secs(10),
            retry_timeout: Duration::from_secs(10),
            failsafe_mode: false,
        };
        assert_eq!(s.margin(), Duration::from_secs(10));
    }

    #[tokio::test]
    async fn a_check_confirms_only_the_postmaster_patroni_names() {
        let c = Confirmations {
            at: Mutex::new(None),
            confirmed: Mutex::new(None),
        };
        let t0 = Instant::now();
        c.record(t0, Some(3), Some(2));
        assert_eq!(c.latest(), Confirmation::Never);
        c.record(t0, None, Some(2));
        assert_eq!(c.latest(), Confirmation::Never);
        c.record(t0, Some(2), None);
        assert_eq!(c.latest(), Confirmation::Never);
        c.record(t0, Some(2), Some(2));
        assert_eq!(c.latest(), Confirmation::At(t0.into_std()));
        let t1 = t0 + Duration::from_secs(1);
        c.record(t1, Some(3), Some(2));
        assert_eq!(
            c.latest(),
            Confirmation::At(t0.into_std()),
            "a refusal keeps the last confirmation's instant"
        );
    }
}
