//! `ticklease demo`: the whole system on one machine in about a minute.
//! A throwaway Postgres (or `--database-url`), in-process peers, N worker
//! processes, a narrated script of failures, and a report that exits 0 only
//! when every invariant held.

mod report;
mod scenes;
mod watch;

use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use tokio::process::Child;
use tokio_postgres::Client;

use ticklease_sandbox::{connect, signal, HttpPeer, PgCluster, SmtpSink, WorkerProcess};

use report::Check;
use watch::{holder_pid, Watch};

const SECRET: &str = "whsec_ZGVtby1zZWNyZXQ=";
const ROLES: [&str; 5] = ticklease_worker::ROLES;
const ENDPOINTS: [&str; 2] = ["/hooks/a", "/hooks/b"];
/// Dunning's schedule in the demo: every even second (an occurrence each).
const DUNNING_CRON: &str = "*/2 * * * * *";

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

/// How long a takeover may take on leases alone: TTL + MaxPoll, and a second of slack.
fn takeover_bound() -> Duration {
    let config = demo_config();
    config.lease_ttl() + config.max_poll() + Duration::from_secs(1)
}

/// How long a takeover may take when the holder's coordination session ended
/// with its process (the library's bound is 1 s; the demo watches the table
/// every 10 ms).
fn session_takeover_bound() -> Duration {
    Duration::from_secs(1)
}

/// How long the demo waits for an event before it counts as missing (a
/// failure): far past every bound, so that a busy machine makes an event
/// late (reported apart), not missing.
const OBSERVE: Duration = Duration::from_secs(60);

#[derive(Debug, Clone)]
pub struct DemoOptions {
    pub replicas: usize,
    pub duration: Duration,
    pub database_url: Option<String>,
    pub keep: bool,
}

struct Replica {
    n: usize,
    child: Child,
}

struct Demo {
    url: String,
    db: Client,
    http: HttpPeer,
    smtp: SmtpSink,
    workers: WorkerProcess,
    /// Holds the workers' log file.
    _logs: tempfile::TempDir,
    replicas: Vec<Replica>,
    spawned: usize,
    watch: Watch,
    started: Instant,
    tty: bool,
    checks: Vec<Check>,
}

impl Demo {
    /// Migrates the database, starts the peers, seeds a first load and the replicas.
    async fn start(url: &str, replicas: usize) -> anyhow::Result<Demo> {
        let mut owner = connect_url(url)
            .await
            .context("could not connect to the demo database")?;
        ticklease::migrate(&mut owner).await?;
        ticklease_worker::migrate(&mut owner).await?;
        let http = HttpPeer::start(0).await?;
        let smtp = SmtpSink::start().await?;
        let logs = tempfile::tempdir()?;
        // The demo's URL reaches Postgres directly, so it also serves the
        // coordination session: a killed leader is replaced in milliseconds.
        let workers = WorkerProcess::new(std::env::current_exe()?, url, SECRET)
            .direct_url(url)
            .payments_url(http.url())
            .smtp_url(smtp.url())
            .batch_size(3)
            .lease(demo_config())
            .decline_backoff(Duration::from_secs(1))
            .tick_interval(Duration::from_millis(300))
            // Dunning on the wall clock: each even second is one occurrence.
            .schedule("dunning", DUNNING_CRON)
            .log(logs.path().join("workers.log"));
        let mut demo = Demo {
            url: url.to_string(),
            db: connect_url(url).await?,
            http,
            smtp,
            workers,
            _logs: logs,
            replicas: Vec::new(),
            spawned: 0,
            watch: Watch::default(),
            started: Instant::now(),
            tty: std::io::stdout().is_terminal(),
            checks: Vec::new(),
        };
        demo.add_load(6).await?;
        for _ in 0..replicas {
            demo.respawn()?;
        }
        demo.say(format!(
            "{replicas} worker replicas started (TTL 3 s, heartbeat 0.9 s, poll 0.5 s)"
        ));
        Ok(demo)
    }

    /// The narrated script, its scenes at fractions of `d`.
    async fn script(&mut self, d: Duration) -> anyhow::Result<()> {
        let at = |f: f64| d.mul_f64(f);
        self.wait_until(at(0.08)).await?;
        self.sigkill_leader("billing").await?;
        self.add_load(4).await?;
        self.wait_until(at(0.15)).await?;
        self.sigkill_occurrence_leader("dunning").await?;
        self.wait_until(at(0.25)).await?;
        self.pause(at(0.35)).await?;
        self.wait_until(at(0.45)).await?;
        self.freeze_leader("webhook_delivery").await?;
        self.add_load(3).await?;
        self.wait_until(at(0.62)).await?;
        self.sigterm_leader("webhook_outbox").await?;
        self.drain(d).await
    }

    fn say(&mut self, line: String) {
        let at = self.started.elapsed().as_secs_f64();
        if self.tty {
            print!("\x1b[2K\r");
        }
        println!("[{at:5.1}s] {line}");
    }

    /// Polls leader_status; on a terminal, redraws the status line.
    async fn tick(&mut self) -> anyhow::Result<()> {
        self.watch.poll(&self.db).await?;
        if self.tty {
            let roles: Vec<String> = ROLES.iter().map(|r| self.role_line(r)).collect();
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

    fn role_line(&self, role: &str) -> String {
        let v = self.watch.view(role);
        let who = match (v.paused, v.pid.and_then(|p| self.replica_of(p))) {
            (true, _) => "paused".to_string(),
            (false, Some(n)) => format!("r{n}"),
            (false, None) => "-".to_string(),
        };
        format!(
            "{role}: {who} #{} ({} terms, {} moves)",
            v.token % 10_000,
            self.watch.terms.get(role).unwrap_or(&0),
            self.watch.takeovers.get(role).unwrap_or(&0)
        )
    }

    fn replica_of(&self, pid: u32) -> Option<usize> {
        self.replicas
            .iter()
            .find(|r| r.child.id() == Some(pid))
            .map(|r| r.n)
    }

    async fn add_load(&self, n: i64) -> anyhow::Result<()> {
        let mut c = connect_url(&self.url).await?;
        let endpoints = ENDPOINTS.map(|p| format!("{}{p}", self.http.url())).to_vec();
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
                let pid = holder_pid(&holder);
                if let Some(i) = pid.and_then(|p| self.replicas.iter().position(|r| r.child.id() == Some(p)))
                {
                    return Ok((i, token));
                }
            }
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        bail!("{role} had no leader among the replicas within {within:?}")
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
        let child = self.workers.spawn()?;
        self.replicas.push(Replica {
            n: self.spawned,
            child,
        });
        Ok(())
    }

    /// Narrates and keeps a timed check.
    fn record(&mut self, what: &str, took: Option<Duration>, bound: Duration) {
        let line = match took {
            Some(t) => format!(
                "{what}: {} ms (bound {} ms){}",
                t.as_millis(),
                bound.as_millis(),
                if t > bound { ", LATE" } else { "" }
            ),
            None => format!("{what}: NOT OBSERVED within {} s", OBSERVE.as_secs()),
        };
        self.say(line);
        self.checks.push(Check::Timed {
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

    /// SIGTERMs every replica (thawing any frozen one) and waits for them.
    async fn stop(&mut self) {
        for r in &self.replicas {
            signal(&r.child, Signal::SIGCONT);
            signal(&r.child, Signal::SIGTERM);
        }
        for r in &mut self.replicas {
            let _ = tokio::time::timeout(demo_config().lease_ttl() * 2, r.child.wait()).await;
        }
    }

    async fn audit(&self) -> anyhow::Result<ticklease_sandbox::Audit> {
        let received = ticklease_sandbox::peers::received(&self.http, &self.smtp);
        let endpoints = ENDPOINTS.map(String::from);
        Ok(ticklease_sandbox::audit::audit(&self.db, &received, &endpoints).await?)
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
        Some(url) => run_with(&opts, url).await,
        None => {
            let cluster = tokio::task::spawn_blocking(PgCluster::start).await??;
            let db = cluster.create_database().await?;
            println!(
                "started a throwaway Postgres in {} on port {}",
                cluster.data_dir().display(),
                cluster.port()
            );
            run_with(&opts, &cluster.url(&db)).await
        }
    }
}

async fn run_with(opts: &DemoOptions, url: &str) -> anyhow::Result<bool> {
    let mut demo = Demo::start(url, opts.replicas).await?;
    demo.script(opts.duration).await?;
    if opts.keep {
        println!();
        println!("--keep: the cluster and workers keep running. Connect with:  psql '{url}'");
        println!("  SELECT * FROM leader_status;   (Ctrl-C to stop and clean up)");
        tokio::signal::ctrl_c().await?;
    }
    demo.stop().await;
    let audit = demo.audit().await?;
    if demo.tty {
        println!();
    }
    print!("{}", report::render(&demo.checks, &audit, demo.started.elapsed()));
    Ok(report::report(&demo.checks, &audit))
}
