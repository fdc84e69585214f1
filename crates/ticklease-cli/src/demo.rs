//! `ticklease demo`: the whole system on one machine in about a minute.
//! A throwaway Postgres (or `--database-url`), in-process peers, N worker
//! processes, a narrated script of failures, and a report that exits 0 only
//! when every invariant held.

use std::collections::BTreeMap;
use std::io::{IsTerminal, Write};
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use tokio::process::{Child, Command};
use tokio_postgres::Client;

use ticklease_testkit::{connect, signal, HttpPeer, PgCluster, SmtpSink};

const SECRET: &str = "whsec_ZGVtby1zZWNyZXQ=";
const ROLES: [&str; 5] = ticklease_worker::ROLES;

/// Demo timings: TTL 3 s.
pub fn demo_config() -> ticklease::Config {
    ticklease::Config::builder()
        .lease_ttl(Duration::from_secs(3))
        .heartbeat_every(Duration::from_millis(900))
        .statement_timeout(Duration::from_millis(600))
        .abandon_after(Duration::from_millis(1800))
        .max_poll(Duration::from_millis(500))
        .build()
        .expect("demo timings are valid")
}

#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub replicas: usize,
    pub duration: Duration,
    pub database_url: Option<String>,
    pub keep: bool,
}

/// One observed row of leader_status.
#[derive(Debug, Clone, Default, PartialEq)]
struct RoleView {
    token: i64,
    pid: Option<u32>,
    paused: bool,
}

/// What the demo watches: per role the current view and the terms seen.
/// Ticks are short, so a term is counted by its token, not by catching it held.
#[derive(Debug, Default)]
struct Watch {
    views: BTreeMap<String, RoleView>,
    terms: BTreeMap<String, i64>,
    /// Terms seen led by another replica than the term before.
    takeovers: BTreeMap<String, i64>,
}

impl Watch {
    async fn poll(&mut self, db: &Client) -> anyhow::Result<()> {
        let rows = db
            .query_typed(
                "SELECT role, holder_token, CASE WHEN held THEN holder_id ELSE last_tick_holder END,
                        paused_at IS NOT NULL
                   FROM leader_status",
                &[],
            )
            .await?;
        for r in rows {
            let role: String = r.get(0);
            let holder: Option<String> = r.get(2);
            let view = RoleView {
                token: r.get(1),
                pid: holder
                    .as_deref()
                    .and_then(|h| h.split(':').nth(1))
                    .and_then(|p| p.parse().ok()),
                paused: r.get(3),
            };
            if let Some(old) = self.views.insert(role.clone(), view.clone()) {
                *self.terms.entry(role.clone()).or_default() += view.token - old.token;
                if view.token != old.token && old.pid.is_some() && view.pid.is_some() && old.pid != view.pid {
                    *self.takeovers.entry(role).or_default() += 1;
                }
            }
        }
        Ok(())
    }
}

struct Replica {
    n: usize,
    child: Child,
}

fn spawn(
    exe: &PathBuf,
    url: &str,
    http: &HttpPeer,
    smtp: &SmtpSink,
    log: &std::fs::File,
) -> anyhow::Result<Child> {
    let c = demo_config();
    let ms = |d: Duration| format!("{}ms", d.as_millis());
    let mut cmd = Command::new(exe);
    cmd.args(["worker", "--database-url", url, "--webhook-secret", SECRET])
        .args([
            "--payments-url",
            &http.url(),
            "--smtp-url",
            &smtp.url(),
            "--batch-size",
            "3",
        ])
        .args([
            "--lease-ttl",
            &ms(c.lease_ttl()),
            "--heartbeat-every",
            &ms(c.heartbeat_every()),
        ])
        .args([
            "--statement-timeout",
            &ms(c.statement_timeout()),
            "--abandon-after",
            &ms(c.abandon_after()),
        ])
        .args(["--max-poll", &ms(c.max_poll()), "--decline-backoff", "1s"]);
    for role in ROLES {
        cmd.args(["--tick-interval", &format!("{role}=300ms")]);
    }
    cmd.env("RUST_LOG", "ticklease=info,ticklease_worker=info")
        .stdout(Stdio::null())
        .stderr(log.try_clone()?)
        .kill_on_drop(true);
    Ok(cmd.spawn()?)
}

/// A measured event of the script.
#[derive(Debug, Clone)]
struct Event {
    what: String,
    took: Option<Duration>,
    bound: Duration,
}

struct Demo {
    exe: PathBuf,
    url: String,
    db: Client,
    http: HttpPeer,
    smtp: SmtpSink,
    log: std::fs::File,
    replicas: Vec<Replica>,
    spawned: usize,
    watch: Watch,
    started: Instant,
    tty: bool,
    events: Vec<Event>,
}

impl Demo {
    fn say(&mut self, line: String) {
        let at = self.started.elapsed().as_secs_f64();
        if self.tty {
            print!("\x1b[2K\r");
        }
        println!("[{at:5.1}s] {line}");
    }

    async fn tick(&mut self) -> anyhow::Result<()> {
        self.watch.poll(&self.db).await?;
        if self.tty {
            let roles: Vec<String> = ROLES
                .iter()
                .map(|r| {
                    let v = self.watch.views.get(*r).cloned().unwrap_or_default();
                    let who = match (v.paused, v.pid.and_then(|p| self.replica_of(p))) {
                        (true, _) => "paused".to_string(),
                        (false, Some(n)) => format!("r{n}"),
                        (false, None) => "-".to_string(),
                    };
                    format!(
                        "{r}: {who} #{} ({} terms, {} moves)",
                        v.token % 10_000,
                        self.watch.terms.get(*r).unwrap_or(&0),
                        self.watch.takeovers.get(*r).unwrap_or(&0)
                    )
                })
                .collect();
            let sent = self.smtp.mails().len();
            print!(
                "\x1b[2K\r{} | emails {sent} | hooks {}",
                roles.join(" | "),
                self.http.requests().len()
            );
            let _ = std::io::stdout().flush();
        }
        Ok(())
    }

    fn replica_of(&self, pid: u32) -> Option<usize> {
        self.replicas
            .iter()
            .find(|r| r.child.id() == Some(pid))
            .map(|r| r.n)
    }

    async fn add_load(&self, n: i64) -> anyhow::Result<()> {
        let mut c = connect_url(&self.url).await?;
        let endpoints = vec![
            format!("{}/hooks/a", self.http.url()),
            format!("{}/hooks/b", self.http.url()),
        ];
        ticklease_worker::seed::seed(
            &mut c,
            &ticklease_worker::seed::Seed {
                subscriptions: n,
                emails: n,
                events: n,
                endpoints,
            },
        )
        .await?;
        Ok(())
    }

    /// Waits until `role` is held by one of our replicas; returns its index in `replicas` and the term.
    async fn leader_of(&mut self, role: &str, within: Duration) -> anyhow::Result<(usize, i64)> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            self.tick().await?;
            let rows = self
                .db
                .query_typed(
                    "SELECT holder_token, holder_id FROM leader_status WHERE role = $1 AND held",
                    &[(&role, tokio_postgres::types::Type::TEXT)],
                )
                .await?;
            if let Some(r) = rows.first() {
                let (token, holder): (i64, String) = (r.get(0), r.get(1));
                let pid: Option<u32> = holder.split(':').nth(1).and_then(|p| p.parse().ok());
                if let Some(i) = pid.and_then(|p| self.replicas.iter().position(|r| r.child.id() == Some(p)))
                {
                    return Ok((i, token));
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        bail!("{role} had no leader among the replicas within {within:?}")
    }

    /// SIGSTOPs the replica leading `role`, retrying until it is frozen while
    /// still holding its term (ticks are short); returns its index and term.
    async fn freeze_holder(&mut self, role: &str) -> anyhow::Result<(usize, i64)> {
        let within = demo_config().lease_ttl() * 3;
        loop {
            let (i, token) = self.leader_of(role, within).await?;
            signal(&self.replicas[i].child, Signal::SIGSTOP);
            // A RELEASE already on the wire still lands: look once it would have.
            tokio::time::sleep(Duration::from_millis(100)).await;
            let held: i64 = self
                .db
                .query_typed(
                    "SELECT count(*) FROM leader_status WHERE role = $1 AND held AND holder_token = $2",
                    &[
                        (&role, tokio_postgres::types::Type::TEXT),
                        (&token, tokio_postgres::types::Type::INT8),
                    ],
                )
                .await?[0]
                .get(0);
            if held == 1 {
                return Ok((i, token));
            }
            signal(&self.replicas[i].child, Signal::SIGCONT);
        }
    }

    /// Waits for a term of `role` above `token`; returns how long it took.
    async fn new_term(
        &mut self,
        role: &str,
        token: i64,
        within: Duration,
    ) -> anyhow::Result<Option<Duration>> {
        let from = Instant::now();
        while from.elapsed() < within {
            self.tick().await?;
            if self.watch.views.get(role).is_some_and(|v| v.token > token) {
                return Ok(Some(from.elapsed()));
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        Ok(None)
    }

    fn respawn(&mut self) -> anyhow::Result<()> {
        self.spawned += 1;
        let child = spawn(&self.exe, &self.url, &self.http, &self.smtp, &self.log)?;
        self.replicas.push(Replica {
            n: self.spawned,
            child,
        });
        Ok(())
    }

    fn record(&mut self, what: &str, took: Option<Duration>, bound: Duration) {
        let line = match took {
            Some(t) => format!("{what}: {} ms (bound {} ms)", t.as_millis(), bound.as_millis()),
            None => format!("{what}: NOT OBSERVED within {} ms", bound.as_millis()),
        };
        self.say(line);
        self.events.push(Event {
            what: what.to_string(),
            took,
            bound,
        });
    }

    async fn wait_until(&mut self, at: Duration) -> anyhow::Result<()> {
        while self.started.elapsed() < at {
            self.tick().await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok(())
    }
}

async fn connect_url(url: &str) -> anyhow::Result<Client> {
    Ok(connect(&url.parse()?).await?)
}

/// Runs the demo; `Ok(true)` when every invariant held. A throwaway cluster
/// is stopped and removed when this returns or is dropped (Ctrl-C).
pub async fn run(opts: DemoOptions) -> anyhow::Result<bool> {
    if opts.replicas < 2 {
        bail!(
            "--replicas {}: the demo needs at least 2 for takeovers",
            opts.replicas
        );
    }
    match &opts.database_url {
        Some(url) => run_with(&opts, url.clone()).await,
        None => {
            let cluster = tokio::task::spawn_blocking(PgCluster::start).await??;
            let db = cluster.create_database().await?;
            println!(
                "started a throwaway Postgres in {} on port {}",
                cluster.data_dir().display(),
                cluster.port()
            );
            run_with(&opts, cluster.url(&db)).await
        }
    }
}

async fn run_with(opts: &DemoOptions, url: String) -> anyhow::Result<bool> {
    let mut owner = connect_url(&url)
        .await
        .context("could not connect to the demo database")?;
    ticklease::migrate(&mut owner).await?;
    ticklease_worker::migrate(&mut owner).await?;
    let http = HttpPeer::start(0).await?;
    let smtp = SmtpSink::start().await?;
    let logs = tempfile::tempdir()?;
    let log = std::fs::File::create(logs.path().join("workers.log"))?;
    let exe = std::env::current_exe()?;
    let mut demo = Demo {
        exe,
        url: url.clone(),
        db: connect_url(&url).await?,
        http,
        smtp,
        log,
        replicas: Vec::new(),
        spawned: 0,
        watch: Watch::default(),
        started: Instant::now(),
        tty: std::io::stdout().is_terminal(),
        events: Vec::new(),
    };
    demo.add_load(6).await?;
    for _ in 0..opts.replicas {
        demo.respawn()?;
    }
    demo.say(format!(
        "{} worker replicas started (TTL 3 s, heartbeat 0.9 s, poll 0.5 s)",
        opts.replicas
    ));
    let config = demo_config();
    let takeover_bound = config.lease_ttl() + config.max_poll() + Duration::from_secs(1);
    let d = opts.duration;
    let at = |f: f64| d.mul_f64(f);

    demo.wait_until(at(0.08)).await?;
    let (i, token) = demo.freeze_holder("billing").await?;
    demo.say(format!(
        "SIGKILL the billing leader (replica r{}, term {token})",
        demo.replicas[i].n
    ));
    let mut victim = demo.replicas.swap_remove(i);
    signal(&victim.child, Signal::SIGKILL);
    let _ = victim.child.wait().await;
    let took = demo.new_term("billing", token, takeover_bound * 2).await?;
    demo.record("billing taken over after SIGKILL", took, takeover_bound);
    demo.respawn()?;

    demo.add_load(4).await?;
    demo.wait_until(at(0.25)).await?;
    demo.say("pause email_outbox (leader_pause 'demo', 'SMTP key rotation')".into());
    let before = demo.smtp.mails().len();
    demo.db
        .batch_execute("SELECT leader_pause('email_outbox', 'demo', 'SMTP key rotation')")
        .await?;
    demo.tick().await?;
    let paused_token = demo
        .watch
        .views
        .get("email_outbox")
        .map(|v| v.token)
        .unwrap_or_default();
    demo.add_load(3).await?;
    // Hold the pause for a few polls at least, however the script's clock stands.
    let hold = at(0.35).max(demo.started.elapsed() + config.max_poll() * 4);
    demo.wait_until(hold).await?;
    let during = demo.smtp.mails().len() - before;
    let view = demo.watch.views.get("email_outbox").cloned().unwrap_or_default();
    // No term may start while paused; sends already in flight at the pause may still land.
    let paused_ok = view.paused && view.token == paused_token;
    demo.say(format!(
        "while paused: no new email_outbox term ({paused_ok}); {during} emails landed (sent before the pause took hold)"
    ));
    demo.db
        .batch_execute("SELECT leader_unpause('email_outbox')")
        .await?;
    let took = demo
        .new_term("email_outbox", paused_token, takeover_bound * 2)
        .await?;
    demo.record(
        "email_outbox led again after unpause",
        took,
        config.max_poll() + Duration::from_secs(1),
    );
    if !paused_ok {
        demo.events.push(Event {
            what: "no term while paused".into(),
            took: None,
            bound: Duration::ZERO,
        });
    }

    demo.wait_until(at(0.45)).await?;
    let (i, token) = demo.freeze_holder("webhook_delivery").await?;
    demo.say(format!(
        "SIGSTOP the webhook_delivery leader (r{}, term {token}) past its TTL",
        demo.replicas[i].n
    ));
    let took = demo
        .new_term("webhook_delivery", token, takeover_bound * 2)
        .await?;
    demo.record(
        "webhook_delivery taken over from a frozen leader",
        took,
        takeover_bound,
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    signal(&demo.replicas[i].child, Signal::SIGCONT);
    demo.say(format!(
        "SIGCONT r{}: it resumes, its term is over, it claims nothing",
        demo.replicas[i].n
    ));

    demo.add_load(3).await?;
    demo.wait_until(at(0.62)).await?;
    let (i, token) = demo.leader_of("dunning", config.lease_ttl() * 3).await?;
    demo.say(format!(
        "SIGTERM the dunning leader (r{}): a clean handover",
        demo.replicas[i].n
    ));
    let mut leaving = demo.replicas.swap_remove(i);
    signal(&leaving.child, Signal::SIGTERM);
    let took = demo.new_term("dunning", token, takeover_bound * 2).await?;
    demo.record(
        "dunning handed over after SIGTERM",
        took,
        config.max_poll() + config.heartbeat_every() + Duration::from_secs(1),
    );
    let clean = tokio::time::timeout(config.lease_ttl(), leaving.child.wait())
        .await
        .ok()
        .and_then(|s| s.ok())
        .and_then(|s| s.code());
    if clean != Some(0) {
        demo.events.push(Event {
            what: format!("SIGTERM exit code {clean:?}"),
            took: None,
            bound: Duration::ZERO,
        });
    }
    demo.respawn()?;

    // Drain: no new load; wait for the outboxes to empty.
    demo.say("draining the load".into());
    let deadline = demo.started + d.max(Duration::from_secs(20)) + Duration::from_secs(30);
    loop {
        demo.tick().await?;
        let pending: i64 = demo
            .db
            .query_typed(
                "SELECT (SELECT count(*) FROM subscriptions WHERE next_billing_at <= now())
                      + (SELECT count(*) FROM dunning_runs WHERE state = 'active')
                      + (SELECT count(*) FROM webhook_events WHERE dispatched_at IS NULL)
                      + (SELECT count(*) FROM webhook_deliveries WHERE status <> 'delivered')
                      + (SELECT count(*) FROM email_outbox WHERE status <> 'sent')",
                &[],
            )
            .await?[0]
            .get(0);
        if pending == 0 && demo.started.elapsed() >= d.mul_f64(0.7) {
            break;
        }
        if Instant::now() > deadline {
            demo.events.push(Event {
                what: format!("{pending} items still pending at the end"),
                took: None,
                bound: Duration::ZERO,
            });
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    if opts.keep {
        println!();
        println!("--keep: the cluster and workers keep running. Connect with:  psql '{url}'");
        println!("  SELECT * FROM leader_status;   (Ctrl-C to stop and clean up)");
        tokio::signal::ctrl_c().await?;
    }
    for r in &demo.replicas {
        signal(&r.child, Signal::SIGCONT);
        signal(&r.child, Signal::SIGTERM);
    }
    for r in &mut demo.replicas {
        let _ = tokio::time::timeout(config.lease_ttl() * 2, r.child.wait()).await;
    }

    let received = ticklease_testkit::peers::received(&demo.http, &demo.smtp);
    let audit =
        ticklease_worker::audit::audit(&demo.db, &received, &["/hooks/a".into(), "/hooks/b".into()]).await?;
    let late: Vec<&Event> = demo
        .events
        .iter()
        .filter(|e| e.took.is_none_or(|t| t > e.bound))
        .collect();
    if demo.tty {
        println!();
    }
    println!(
        "\n=== ticklease demo report ({:.0} s) ===",
        demo.started.elapsed().as_secs_f64()
    );
    println!("events:");
    for e in &demo.events {
        match e.took {
            Some(t) => println!(
                "  {:<50} {:>6} ms  (bound {} ms)",
                e.what,
                t.as_millis(),
                e.bound.as_millis()
            ),
            None => println!("  {:<50} FAILED", e.what),
        }
    }
    println!("effects (sent → received):");
    println!("  invoices created:        {}", audit.invoices);
    println!(
        "  charges:                 {} invoices charged, {} idempotency keys, {} requests",
        audit.charged_invoices, audit.charge_keys, audit.charge_requests
    );
    println!(
        "  webhooks:                {} events × {} endpoints → {} unique deliveries, {} requests ({} re-sent under the same webhook-id)",
        audit.events,
        audit.endpoints.len(),
        audit.hooks_unique,
        audit.hooks_received,
        audit.hooks_received - audit.hooks_unique
    );
    println!(
        "  emails:                  {} in the outbox → {} unique Message-IDs, {} received ({} re-sent with the same Message-ID)",
        audit.emails,
        audit.emails_unique,
        audit.emails_received,
        audit.emails_received - audit.emails_unique
    );
    println!(
        "  duplicates past idempotency keys: {}",
        audit.count(ticklease_worker::audit::Kind::Duplicate)
    );
    println!(
        "  losses:                  {}",
        audit.count(ticklease_worker::audit::Kind::Loss)
    );
    println!(
        "  stale claims:            {}",
        audit.count(ticklease_worker::audit::Kind::StaleClaim)
    );
    let ok = audit.violations.is_empty() && late.is_empty();
    for v in &audit.violations {
        println!("  VIOLATION: {v}");
    }
    for e in &late {
        println!("  LATE OR MISSING: {}", e.what);
    }
    println!(
        "{}",
        if ok {
            "all invariants held"
        } else {
            "INVARIANTS BROKEN"
        }
    );
    Ok(ok)
}
