//! Real network peers for the worker: an HTTP server that plays the
//! payment provider and the webhook receivers, recording every request, and
//! an SMTP sink recording every message. Duplicates and losses are counted
//! from what actually arrived.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::oneshot;

/// One request as it arrived.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recorded {
    pub path: String,
    pub headers: BTreeMap<String, String>,
    pub body: String,
}

#[derive(Debug, Default)]
struct HttpState {
    requests: Vec<Recorded>,
    /// Idempotency key → (answer status, times requested).
    charges: BTreeMap<String, (u16, u32)>,
    /// Every n-th webhook POST fails with 500 (0: never).
    fail_every: u32,
    hooks_seen: u32,
    /// The next charge's answer is held (see [`HttpPeer::hold_next_charge`]).
    hold: Option<Hold>,
}

#[derive(Debug)]
struct Hold {
    received: oneshot::Sender<String>,
    release: oneshot::Receiver<()>,
}

/// A charge the provider has taken but not yet answered: what a client
/// killed mid-request leaves behind.
#[derive(Debug)]
pub struct HeldCharge {
    received: oneshot::Receiver<String>,
    release: oneshot::Sender<()>,
}

impl HeldCharge {
    /// Waits for the held charge to arrive; its idempotency key.
    pub async fn received(&mut self) -> String {
        (&mut self.received)
            .await
            .expect("the peer keeps the hold until it fires")
    }

    /// Lets the held answer go out (dropping the hold does too).
    pub fn release(self) {
        let _ = self.release.send(());
    }
}

/// The payment provider (`POST /charges`, idempotent by `idempotency-key`) and
/// webhook receivers (`POST /hooks/{name}`).
#[derive(Debug, Clone)]
pub struct HttpPeer {
    addr: SocketAddr,
    state: Arc<Mutex<HttpState>>,
}

impl HttpPeer {
    /// Starts on a free loopback port; every `fail_every`-th webhook POST answers 500.
    pub async fn start(fail_every: u32) -> std::io::Result<HttpPeer> {
        let state = Arc::new(Mutex::new(HttpState {
            fail_every,
            ..HttpState::default()
        }));
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let app = axum::Router::new()
            .route("/charges", post(charge))
            .route("/hooks/{name}", post(hook))
            .with_state(state.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Ok(HttpPeer { addr, state })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.state.lock().expect("state").requests.clone()
    }

    /// Holds the answer to the next charge request: the charge is taken and
    /// recorded, the hold reports its key, and the answer waits for release.
    pub fn hold_next_charge(&self) -> HeldCharge {
        let (received_tx, received) = oneshot::channel();
        let (release, release_rx) = oneshot::channel();
        self.state.lock().expect("state").hold = Some(Hold {
            received: received_tx,
            release: release_rx,
        });
        HeldCharge { received, release }
    }

    /// Idempotency key → the status the provider answers for it.
    pub fn charge_answers(&self) -> BTreeMap<String, u16> {
        self.state
            .lock()
            .expect("state")
            .charges
            .iter()
            .map(|(k, (status, _))| (k.clone(), *status))
            .collect()
    }

    /// Idempotency key → how many times it was requested (charged once each).
    pub fn charge_requests(&self) -> BTreeMap<String, u32> {
        self.state
            .lock()
            .expect("state")
            .charges
            .iter()
            .map(|(k, (_, n))| (k.clone(), *n))
            .collect()
    }
}

fn record(state: &Mutex<HttpState>, path: String, headers: &HeaderMap, body: &Bytes) {
    let headers = headers
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or_default().to_string()))
        .collect();
    state.lock().expect("state").requests.push(Recorded {
        path,
        headers,
        body: String::from_utf8_lossy(body).into_owned(),
    });
}

async fn charge(
    State(state): State<Arc<Mutex<HttpState>>>,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, String) {
    record(&state, "/charges".into(), &headers, &body);
    let Some(key) = headers
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
    else {
        return (StatusCode::BAD_REQUEST, "missing idempotency-key".into());
    };
    let (status, hold) = {
        let mut s = state.lock().expect("state");
        let entry = s.charges.entry(key.clone()).or_insert((200, 0));
        entry.1 += 1;
        let status = entry.0;
        (status, s.hold.take())
    };
    if let Some(hold) = hold {
        let _ = hold.received.send(key);
        // A dropped hold releases too.
        let _ = hold.release.await;
    }
    (
        StatusCode::from_u16(status).unwrap_or(StatusCode::OK),
        r#"{"status":"succeeded"}"#.into(),
    )
}

async fn hook(
    State(state): State<Arc<Mutex<HttpState>>>,
    Path(name): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> StatusCode {
    let fail = {
        let mut s = state.lock().expect("state");
        s.hooks_seen += 1;
        s.fail_every > 0 && s.hooks_seen % s.fail_every == 0
    };
    if fail {
        return StatusCode::INTERNAL_SERVER_ERROR;
    }
    record(&state, format!("/hooks/{name}"), &headers, &body);
    StatusCode::OK
}

/// One message as the sink received it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mail {
    pub from: String,
    pub to: Vec<String>,
    pub data: String,
}

impl Mail {
    /// The value of the `Message-ID` header.
    pub fn message_id(&self) -> Option<&str> {
        self.data.lines().find_map(|l| {
            let (name, value) = l.split_once(':')?;
            name.eq_ignore_ascii_case("message-id").then(|| value.trim())
        })
    }
}

/// A minimal SMTP server that accepts and records every message.
#[derive(Debug, Clone)]
pub struct SmtpSink {
    addr: SocketAddr,
    mails: Arc<Mutex<Vec<Mail>>>,
}

impl SmtpSink {
    pub async fn start() -> std::io::Result<SmtpSink> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let mails = Arc::new(Mutex::new(Vec::new()));
        let sink = mails.clone();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                tokio::spawn(session(stream, sink.clone()));
            }
        });
        Ok(SmtpSink { addr, mails })
    }

    pub fn url(&self) -> String {
        format!("smtp://{}", self.addr)
    }

    pub fn mails(&self) -> Vec<Mail> {
        self.mails.lock().expect("mails").clone()
    }
}

/// Longest message the sink accepts, in bytes.
const MAIL_MAX: usize = 1 << 20;

async fn session(stream: tokio::net::TcpStream, mails: Arc<Mutex<Vec<Mail>>>) -> std::io::Result<()> {
    let (read, mut write) = stream.into_split();
    let mut lines = BufReader::new(read).lines();
    write.write_all(b"220 ticklease-sink ESMTP\r\n").await?;
    let (mut from, mut to) = (String::new(), Vec::new());
    while let Some(line) = lines.next_line().await? {
        let upper = line.to_ascii_uppercase();
        let reply: &[u8] = if upper.starts_with("EHLO") || upper.starts_with("HELO") {
            b"250 ticklease-sink\r\n"
        } else if upper.starts_with("MAIL FROM:") {
            from = line[10..].trim().to_string();
            to.clear();
            b"250 OK\r\n"
        } else if upper.starts_with("RCPT TO:") {
            to.push(line[8..].trim().to_string());
            b"250 OK\r\n"
        } else if upper == "DATA" {
            write.write_all(b"354 end with .\r\n").await?;
            let mut data = String::new();
            while let Some(l) = lines.next_line().await? {
                if l == "." {
                    break;
                }
                if data.len() < MAIL_MAX {
                    data.push_str(l.strip_prefix('.').unwrap_or(&l));
                    data.push('\n');
                }
            }
            mails.lock().expect("mails").push(Mail {
                from: from.clone(),
                to: to.clone(),
                data,
            });
            b"250 OK queued\r\n"
        } else if upper == "QUIT" {
            write.write_all(b"221 bye\r\n").await?;
            return Ok(());
        } else if upper == "RSET" || upper == "NOOP" {
            b"250 OK\r\n"
        } else {
            b"502 not implemented\r\n"
        };
        write.write_all(reply).await?;
    }
    Ok(())
}

/// What both peers received, in the shape of the worker's audit.
pub fn received(http: &HttpPeer, smtp: &SmtpSink) -> crate::audit::Received {
    let mut r = crate::audit::Received::default();
    let answers = http.charge_answers();
    for req in http.requests() {
        if req.path == "/charges" {
            let key = req.headers.get("idempotency-key").cloned().unwrap_or_default();
            let accepted = matches!(answers.get(&key), Some(200 | 201));
            r.charges.push(crate::audit::ChargeRequest {
                key,
                body: req.body,
                accepted,
            });
        } else {
            let id = req.headers.get("webhook-id").cloned().unwrap_or_default();
            r.hooks.push((req.path, id, req.body));
        }
    }
    r.message_ids = smtp
        .mails()
        .iter()
        .filter_map(|m| m.message_id().map(str::to_string))
        .collect();
    r
}
