//! Patroni's REST API over plain HTTP (feature `patroni`).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use super::check::Word;
use super::{PatroniError, PatroniSettings, PATRONI_URLS_MAX};

/// Longest answer read from a member.
const ANSWER_BYTES_MAX: usize = 64 * 1024;

/// The REST APIs of a Patroni cluster's members.
#[derive(Debug, Clone)]
pub struct Patroni {
    urls: Vec<reqwest::Url>,
    http: reqwest::Client,
    latest: Arc<Latest>,
}

/// The settings as last read, shared by the clones.
#[derive(Debug, Default)]
struct Latest {
    /// `None` until read; an error when the settings read cannot bound a
    /// term (unreadable). A read that reached no member keeps the last.
    settings: Mutex<Option<Result<PatroniSettings, Arc<PatroniError>>>>,
    /// Whether a re-read runs (one at a time).
    reading: AtomicBool,
}

/// One member's answer: its HTTP status, its JSON body (if the body is
/// JSON and within [`ANSWER_BYTES_MAX`]) and its `Date` header (seconds
/// since the epoch, on the member's clock).
struct Answer {
    status: u16,
    body: Option<serde_json::Value>,
    date: Option<i64>,
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
        Ok(Patroni {
            urls,
            http,
            latest: Arc::default(),
        })
    }

    /// Patroni's settings, from the first member that answers `GET /config`.
    pub async fn settings(&self) -> Result<PatroniSettings, PatroniError> {
        for url in &self.urls {
            if let Some(body) = self.get(url, "config").await.and_then(|a| a.body) {
                let read = settings(&body);
                self.keep(&read);
                return read;
            }
        }
        Err(self.no_settings())
    }

    /// Keeps a read's result, unless it reached no member.
    fn keep(&self, read: &Result<PatroniSettings, PatroniError>) {
        let kept = match read {
            Ok(settings) => Ok(*settings),
            Err(PatroniError::Setting { name, value }) => Err(Arc::new(PatroniError::Setting {
                name,
                value: value.clone(),
            })),
            Err(_) => return,
        };
        *self.latest.settings.lock().expect("not poisoned") = Some(kept);
    }
    fn no_settings(&self) -> PatroniError {
        let asked: Vec<&str> = self.urls.iter().map(reqwest::Url::as_str).collect();
        PatroniError::NoSettings {
            asked: asked.join(", "),
        }
    }

    /// The word of the member that answers `GET /primary` with 200 as a
    /// running primary, if one does, with the settings read again (an
    /// `edit-config` since the start counts). Patroni answers 200 from the
    /// moment its member holds the leader key, before its Postgres has left
    /// recovery: such an answer confirms nothing.
    pub(crate) async fn leader(&self) -> Option<Word> {
        let mut pending: Vec<_> = self
            .urls
            .iter()
            .map(|url| Box::pin(async move { (url, self.get(url, "primary").await) }))
            .collect();
        while !pending.is_empty() {
            let ((url, answer), _, rest) = futures::future::select_all(pending).await;
            pending = rest;
            let Some(Answer {
                status: 200,
                body: Some(body),
                date,
            }) = answer
            else {
                continue;
            };
            let Some(postmaster) = running_primary(&body) else {
                continue;
            };
            let seen = body.get("dcs_last_seen").and_then(serde_json::Value::as_i64);
            self.read_settings_again(url);
            let settings = self.latest.settings.lock().expect("not poisoned").clone();
            return Some(Word {
                postmaster,
                dcs_contact_age_secs: date.zip(seen).map(|(date, seen)| date - seen),
                settings: settings.unwrap_or_else(|| Err(Arc::new(self.no_settings()))),
            });
        }
        None
    }

    /// Reads the settings again in the background (one read at a time):
    /// the next check judges by them, and a member that hangs delays no
    /// confirmation.
    fn read_settings_again(&self, leader: &reqwest::Url) {
        if self.latest.reading.swap(true, Ordering::AcqRel) {
            return;
        }
        let (patroni, leader) = (self.clone(), leader.clone());
        tokio::spawn(async move {
            let read = patroni.settings_beside(&leader).await;
            patroni.keep(&read);
            patroni.latest.reading.store(false, Ordering::Release);
        });
    }

    /// The settings, asked of the members other than `leader` first: a
    /// leader's REST thread answers `GET /config` from the DCS itself once
    /// its HA loop's view is `ttl` old, which refreshes the `dcs_last_seen`
    /// a stalled loop would otherwise let go stale.
    async fn settings_beside(&self, leader: &reqwest::Url) -> Result<PatroniSettings, PatroniError> {
        let others: Vec<_> = self
            .urls
            .iter()
            .filter(|url| *url != leader)
            .map(|url| Box::pin(async move { self.get(url, "config").await.and_then(|a| a.body).ok_or(()) }))
            .collect();
        // select_ok panics on no futures: the leader may be the only member given.
        let beside = if others.is_empty() {
            None
        } else {
            futures::future::select_ok(others)
                .await
                .ok()
                .map(|(config, _)| config)
        };
        let config = match beside {
            Some(config) => Some(config),
            // The only member, or none of the others answers.
            None => self.get(leader, "config").await.and_then(|a| a.body),
        };
        config.as_ref().map_or_else(|| Err(self.no_settings()), settings)
    }

    /// `GET path` on one member. The body is read up to [`ANSWER_BYTES_MAX`]
    /// and dropped beyond: a member (or whatever answers at its address)
    /// cannot make this process buffer more.
    async fn get(&self, base: &reqwest::Url, path: &str) -> Option<Answer> {
        let url = base.join(path).ok()?;
        let mut response = self.http.get(url).send().await.ok()?;
        let status = response.status().as_u16();
        let date = response
            .headers()
            .get(reqwest::header::DATE)
            .and_then(|d| d.to_str().ok())
            .and_then(|d| chrono::DateTime::parse_from_rfc2822(d).ok())
            .map(|d| d.timestamp());
        let mut bytes = Vec::new();
        let mut fits = true;
        while let Some(chunk) = response.chunk().await.ok()? {
            if bytes.len() + chunk.len() > ANSWER_BYTES_MAX {
                fits = false;
                break;
            }
            bytes.extend_from_slice(&chunk);
        }
        let body = fits.then(|| serde_json::from_slice(&bytes).ok()).flatten();
        Some(Answer { status, body, date })
    }
}

/// Patroni's settings from its dynamic configuration, read as Patroni
/// reads them: `int()` of the timings, `parse_bool` of `failsafe_mode`;
/// Patroni's defaults for what is left out. A value Patroni would read
/// but this cannot is refused, never defaulted.
fn settings(config: &serde_json::Value) -> Result<PatroniSettings, PatroniError> {
    let secs = |field: &'static str, default: u64| -> Result<Duration, PatroniError> {
        let value = match config.get(field) {
            None | Some(serde_json::Value::Null) => return Ok(Duration::from_secs(default)),
            Some(value) => value,
        };
        let whole = match value {
            serde_json::Value::Number(n) => n
                .as_u64()
                .or_else(|| n.as_f64().filter(|f| *f >= 0.0).map(|f| f as u64)),
            serde_json::Value::String(s) => s.trim().parse::<u64>().ok(),
            _ => None,
        };
        whole
            .map(Duration::from_secs)
            .ok_or_else(|| PatroniError::Setting {
                name: field,
                value: value.to_string(),
            })
    };
    Ok(PatroniSettings {
        ttl: secs("ttl", 30)?,
        loop_wait: secs("loop_wait", 10)?,
        retry_timeout: secs("retry_timeout", 10)?,
        failsafe_mode: config.get("failsafe_mode").is_some_and(parse_bool),
    })
}

/// Patroni's `parse_bool` of `str(value).lower()` as true: `on`, `true`,
/// `yes`, `1` (a JSON `true` is Python's `True`, whose `str` is `True`).
fn parse_bool(value: &serde_json::Value) -> bool {
    let text = match value {
        serde_json::Value::String(s) => s.to_lowercase(),
        other => other.to_string().to_lowercase(),
    };
    matches!(text.as_str(), "on" | "true" | "yes" | "1")
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
    fn failsafe_mode_is_read_as_patroni_reads_it() {
        for on in [
            serde_json::json!(true),
            serde_json::json!("on"),
            serde_json::json!("ON"),
            serde_json::json!("yes"),
            serde_json::json!("true"),
            serde_json::json!(1),
            serde_json::json!("1"),
        ] {
            let config = serde_json::json!({ "failsafe_mode": on });
            assert!(settings(&config).unwrap().failsafe_mode, "{on}");
        }
        for off in [
            serde_json::json!(false),
            serde_json::json!("off"),
            serde_json::json!(0),
            serde_json::json!(null),
        ] {
            let config = serde_json::json!({ "failsafe_mode": off });
            assert!(!settings(&config).unwrap().failsafe_mode, "{off}");
        }
    }

    #[test]
    fn timings_are_read_as_patroni_reads_them_and_the_unreadable_are_refused() {
        let config = serde_json::json!({"ttl": "20", "loop_wait": 1.9, "retry_timeout": 5});
        assert_eq!(
            settings(&config).unwrap(),
            PatroniSettings {
                ttl: Duration::from_secs(20),
                loop_wait: Duration::from_secs(1),
                retry_timeout: Duration::from_secs(5),
                failsafe_mode: false,
            }
        );
        let defaults = settings(&serde_json::json!({})).unwrap();
        assert_eq!(defaults.ttl, Duration::from_secs(30));
        for bad in [
            serde_json::json!("20s"),
            serde_json::json!(-1),
            serde_json::json!([20]),
        ] {
            let config = serde_json::json!({ "ttl": bad });
            assert!(
                matches!(settings(&config), Err(PatroniError::Setting { name: "ttl", .. })),
                "{bad}"
            );
        }
    }

    /// A member at a local port: answers each path with its (status, body)
    /// and an HTTP `Date` of now; an unknown path with an endless body.
    async fn member(answers: Vec<(&'static str, u16, String)>) -> String {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let answers = answers.clone();
                tokio::spawn(async move {
                    let mut request = vec![0; 4096];
                    let n = socket.read(&mut request).await.unwrap_or(0);
                    let request = String::from_utf8_lossy(&request[..n]).to_string();
                    let date = chrono::Utc::now().format("%a, %d %b %Y %H:%M:%S GMT");
                    let known = answers
                        .iter()
                        .find(|(path, _, _)| request.starts_with(&format!("GET /{path} ")));
                    let Some((_, status, body)) = known else {
                        let head = format!("HTTP/1.1 200 OK\r\nDate: {date}\r\nConnection: close\r\n\r\n");
                        let _ = socket.write_all(head.as_bytes()).await;
                        let filler = vec![b' '; 64 * 1024];
                        while socket.write_all(&filler).await.is_ok() {}
                        return;
                    };
                    let head = format!(
                        "HTTP/1.1 {status} X\r\nDate: {date}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
                        body.len()
                    );
                    let _ = socket.write_all(head.as_bytes()).await;
                    let _ = socket.write_all(body.as_bytes()).await;
                });
            }
        });
        url
    }

    fn primary_seen(secs_ago: i64) -> String {
        serde_json::json!({"state": "running", "role": "master",
            "postmaster_start_time": "2026-12-05 12:40:37.5+00:00",
            "dcs_last_seen": chrono::Utc::now().timestamp() - secs_ago})
        .to_string()
    }

    const KIT: &str = r#"{"ttl": 20, "loop_wait": 1, "retry_timeout": 5}"#;

    #[tokio::test]
    async fn a_leader_answer_counts_only_while_its_dcs_contact_is_fresh_by_its_own_date() {
        let (abandon_after, statement_timeout) = (Duration::from_secs(6), Duration::from_secs(2));
        let fresh = member(vec![
            ("primary", 200, primary_seen(0)),
            ("config", 200, KIT.into()),
        ])
        .await;
        let stale = member(vec![
            ("primary", 200, primary_seen(30)),
            ("config", 200, KIT.into()),
        ])
        .await;
        let ask = |url: String| async move {
            let patroni = Patroni::new([url], Duration::from_secs(5)).unwrap();
            patroni.settings().await.unwrap();
            let word = patroni.leader().await.expect("a running primary answered");
            word.confirms(abandon_after, statement_timeout)
        };
        assert!(ask(fresh).await.is_ok());
        assert!(matches!(
            ask(stale).await,
            Err(super::super::check::Refusal::Stale {
                age_secs: Some(30..=31)
            })
        ));
    }

    #[tokio::test]
    async fn an_answer_longer_than_the_limit_is_dropped_not_buffered() {
        let endless = member(vec![]).await;
        let patroni = Patroni::new([endless.as_str()], Duration::from_secs(30)).unwrap();
        let base = reqwest::Url::parse(&endless).unwrap();
        let started = std::time::Instant::now();
        let answer = patroni
            .get(&base, "primary")
            .await
            .expect("an answer, cut at the limit");
        assert_eq!(answer.status, 200);
        assert!(answer.body.is_none());
        assert!(
            started.elapsed() < Duration::from_secs(20),
            "read up to the limit, not to the timeout"
        );
    }

    /// A member that accepts connections and never answers (a stopped Patroni).
    async fn hung() -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((socket, _)) = listener.accept().await {
                held.push(socket);
            }
        });
        url
    }

    #[tokio::test]
    async fn a_member_that_hangs_slows_no_check_of_the_leader() {
        let leader = member(vec![
            ("primary", 200, primary_seen(0)),
            ("config", 200, KIT.into()),
        ])
        .await;
        let timeout = Duration::from_secs(5);
        let patroni = Patroni::new([leader, hung().await], timeout).unwrap();
        patroni.settings().await.unwrap();
        for _ in 0..3 {
            let started = std::time::Instant::now();
            let word = patroni.leader().await.expect("the leader answered");
            assert!(word.settings.is_ok());
            assert!(
                started.elapsed() < timeout / 2,
                "a check took {:?}: it waited for the hung member",
                started.elapsed()
            );
        }
    }
}
