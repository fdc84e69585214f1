//! The chaos run: worker replicas, each on its own link through a fault
//! proxy, under a seeded stream of faults (SIGKILL, SIGTERM, SIGSTOP/SIGCONT,
//! blackholed and reset links, Postgres restarts) while load keeps arriving;
//! then a checker over the claim journal, the lease history and what the
//! peers received.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::process::Child;

use ticklease::Role;
use ticklease_sandbox::{Violation, WorkerProcess};
use ticklease_testkit::{connect, scalar, signal, Fault, FaultProxy, HttpPeer, PgBouncer, SmtpSink};
use ticklease_worker::worker::WorkerConfig;

use crate::failover::Env;
use crate::Timing;

/// The webhook secret the chaos workers sign with.
pub const SECRET: &str = "whsec_Y2hhb3Mtc2VjcmV0";

#[derive(Debug, Clone)]
pub struct ChaosOptions {
    pub replicas: usize,
    pub faults: usize,
    pub seed: u64,
    pub timing: Timing,
    /// This binary: replicas are `<exe> worker …`.
    pub exe: PathBuf,
    /// Replicas reach Postgres through PgBouncer (transaction mode), which the
    /// fault stream also restarts.
    pub pooled: bool,
}

/// What the run did and what the checker found.
#[derive(Debug, Clone, Default)]
pub struct ChaosReport {
    pub seed: u64,
    pub faults: BTreeMap<&'static str, usize>,
    pub violations: Vec<String>,
    /// Per role: the longest time between two terms, outside Postgres restarts (ms).
    pub max_gap_ms: BTreeMap<String, f64>,
    pub gap_bound_ms: f64,
    pub terms: i64,
    pub journal_claims: i64,
    pub took: Duration,
}

impl ChaosReport {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Replica faults, then the rare whole-service restarts.
const REPLICA_FAULTS: [&str; 5] = ["sigkill", "sigterm", "freeze", "blackhole", "reset"];

struct Replica {
    link: FaultProxy,
    child: Child,
}

fn spawn_worker(env: &Env, link: &FaultProxy, http: &HttpPeer, smtp: &SmtpSink) -> anyhow::Result<Child> {
    let lease = env.timing.config();
    WorkerProcess::new(&env.exe, env.url_via(link), SECRET)
        .lease(lease)
        .payments_url(http.url())
        .smtp_url(smtp.url())
        .batch_size(5)
        .tick_interval(lease.max_poll())
        .decline_backoff(lease.max_poll())
        .spawn()
        .context("spawn a worker replica")
}

/// The flags of `ticklease worker` a chaos replica gets from [`WorkerProcess`].
#[derive(Debug, clap::Args)]
pub struct WorkerFlags {
    #[arg(long)]
    database_url: String,
    #[arg(long)]
    webhook_secret: String,
    #[arg(long)]
    payments_url: String,
    #[arg(long)]
    smtp_url: String,
    #[arg(long, value_parser = humantime::parse_duration)]
    lease_ttl: Duration,
    #[arg(long, value_parser = humantime::parse_duration)]
    heartbeat_every: Duration,
    #[arg(long, value_parser = humantime::parse_duration)]
    statement_timeout: Duration,
    #[arg(long, value_parser = humantime::parse_duration)]
    abandon_after: Duration,
    #[arg(long, value_parser = humantime::parse_duration)]
    max_poll: Duration,
    #[arg(long)]
    batch_size: i64,
    #[arg(long, value_parser = humantime::parse_duration)]
    decline_backoff: Duration,
    /// ROLE=DURATION, once per role.
    #[arg(long = "tick-interval", value_parser = tick_interval)]
    tick_intervals: Vec<(Role, Duration)>,
}

fn tick_interval(s: &str) -> Result<(Role, Duration), String> {
    let (role, every) = s.split_once('=').ok_or("expected ROLE=DURATION")?;
    let every = humantime::parse_duration(every).map_err(|e| e.to_string())?;
    Ok((Role::new(role).map_err(|e| e.to_string())?, every))
}

impl WorkerFlags {
    /// The replica's worker config: every role, mail from the chaos sender.
    pub fn config(self) -> anyhow::Result<WorkerConfig> {
        let lease = ticklease::Config::builder()
            .lease_ttl(self.lease_ttl)
            .heartbeat_every(self.heartbeat_every)
            .statement_timeout(self.statement_timeout)
            .abandon_after(self.abandon_after)
            .max_poll(self.max_poll)
            .build()?;
        let (host, port) = self
            .smtp_url
            .trim_start_matches("smtp://")
            .rsplit_once(':')
            .context("--smtp-url: expected smtp://host:port")?;
        Ok(WorkerConfig {
            database: self.database_url.parse()?,
            roles: ticklease_worker::ROLES
                .iter()
                .map(|r| Role::new(*r))
                .collect::<Result<_, _>>()?,
            tick_intervals: self.tick_intervals.into_iter().collect(),
            lease,
            payments_url: self.payments_url,
            smtp_host: host.to_string(),
            smtp_port: port.parse()?,
            mail_from: "chaos@ticklease.invalid".into(),
            webhook_secret: self.webhook_secret,
            metrics_addr: None,
            batch_size: self.batch_size,
            decline_backoff: self.decline_backoff,
        })
    }
}

async fn top_up(env: &Env, n: i64, endpoints: &[String]) -> anyhow::Result<()> {
    let mut c = connect(&env.cluster.config(&env.db)).await?;
    let seed = ticklease_worker::seed::Seed {
        subscriptions: n,
        emails: n,
        events: n,
        endpoints: endpoints.to_vec(),
    };
    ticklease_worker::seed::seed(&mut c, &seed).await?;
    Ok(())
}

/// Everything a run holds: the cluster, the peers, the optional bouncer,
/// the replicas on their links, and the windows of whole-service restarts.
struct Stage {
    env: Env,
    http: HttpPeer,
    smtp: SmtpSink,
    endpoints: Vec<String>,
    bouncer: Option<PgBouncer>,
    replicas: Vec<Replica>,
    restarts: Vec<(SystemTime, SystemTime)>,
}

/// Runs the chaos and checks the outcome.
pub async fn run(opts: &ChaosOptions) -> anyhow::Result<ChaosReport> {
    let started = Instant::now();
    let mut stage = Stage::start(opts).await?;
    let ttl = opts.timing.config().lease_ttl();
    let mut kinds: Vec<&'static str> = REPLICA_FAULTS.to_vec();
    kinds.push("pg_restart");
    if opts.pooled {
        kinds.push("bouncer_restart");
    }
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut report = ChaosReport {
        seed: opts.seed,
        ..ChaosReport::default()
    };
    for k in 0..opts.faults {
        tokio::time::sleep(span(&mut rng, ttl, 0.2, 1.0)).await;
        // Every kind once first; then whole-service restarts are rare (one in twenty).
        let kind = match k {
            k if k < kinds.len() => kinds[k],
            _ if rng.gen_range(0..20) == 0 => kinds[rng.gen_range(REPLICA_FAULTS.len()..kinds.len())],
            _ => REPLICA_FAULTS[rng.gen_range(0..REPLICA_FAULTS.len())],
        };
        let i = rng.gen_range(0..stage.replicas.len());
        *report.faults.entry(kind).or_default() += 1;
        tracing::info!(k, kind, replica = i, "fault");
        stage.fault(kind, i, &mut rng).await?;
        if k % 5 == 4 {
            top_up(&stage.env, 2, &stage.endpoints).await?;
        }
    }
    for r in &stage.replicas {
        r.link.set(Fault::Pass);
        signal(&r.child, Signal::SIGCONT);
    }
    let db = connect(&stage.env.cluster.config(&stage.env.db)).await?;
    report.violations.extend(stage.drain(&db).await);
    report.violations.extend(stage.stop().await);
    check(&stage, &db, &mut report).await?;
    report.took = started.elapsed();
    Ok(report)
}

/// A random share of `ttl` between `lo` and `hi`.
fn span(rng: &mut StdRng, ttl: Duration, lo: f64, hi: f64) -> Duration {
    ttl.mul_f64(rng.gen_range(lo..hi))
}

impl Stage {
    /// The cluster, the peers, a first load, the bouncer when pooled, and the replicas.
    async fn start(opts: &ChaosOptions) -> anyhow::Result<Stage> {
        let env = Env::start(opts.timing, opts.exe.clone()).await?;
        let http = HttpPeer::start(0).await?;
        let smtp = SmtpSink::start().await?;
        let endpoints = vec![
            format!("{}/hooks/a", http.url()),
            format!("{}/hooks/b", http.url()),
        ];
        top_up(&env, 8, &endpoints).await?;
        let bouncer = if opts.pooled {
            Some(PgBouncer::start(&env.cluster, 10)?)
        } else {
            None
        };
        let upstream_port = bouncer.as_ref().map_or(env.cluster.port(), PgBouncer::port);
        let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], upstream_port));
        let mut replicas = Vec::new();
        for _ in 0..opts.replicas {
            let link = FaultProxy::start(upstream).await?;
            let child = spawn_worker(&env, &link, &http, &smtp)?;
            replicas.push(Replica { link, child });
        }
        Ok(Stage {
            env,
            http,
            smtp,
            endpoints,
            bouncer,
            replicas,
            restarts: Vec::new(),
        })
    }

    /// Injects one fault of `kind` into replica `i` (or the whole service).
    async fn fault(&mut self, kind: &str, i: usize, rng: &mut StdRng) -> anyhow::Result<()> {
        let ttl = self.env.timing.config().lease_ttl();
        match kind {
            "sigkill" | "sigterm" => {
                let r = &mut self.replicas[i];
                signal(
                    &r.child,
                    if kind == "sigkill" {
                        Signal::SIGKILL
                    } else {
                        Signal::SIGTERM
                    },
                );
                let _ = tokio::time::timeout(ttl * 5, r.child.wait()).await;
                r.child = spawn_worker(&self.env, &r.link, &self.http, &self.smtp)?;
            }
            "freeze" => {
                signal(&self.replicas[i].child, Signal::SIGSTOP);
                tokio::time::sleep(span(rng, ttl, 0.5, 2.0)).await;
                signal(&self.replicas[i].child, Signal::SIGCONT);
            }
            "blackhole" => {
                self.replicas[i].link.set(Fault::Blackhole);
                tokio::time::sleep(span(rng, ttl, 0.5, 2.0)).await;
                self.replicas[i].link.set(Fault::Pass);
            }
            "reset" => {
                self.replicas[i].link.set(Fault::Reset);
                tokio::time::sleep(Duration::from_millis(50)).await;
                self.replicas[i].link.set(Fault::Pass);
            }
            "bouncer_restart" => {
                let from = SystemTime::now();
                self.bouncer
                    .as_ref()
                    .context("bouncer restart without a bouncer")?
                    .restart()?;
                self.restarts.push((from, SystemTime::now()));
            }
            _ => {
                let from = SystemTime::now();
                self.env.cluster.restart()?;
                self.restarts.push((from, SystemTime::now()));
            }
        }
        Ok(())
    }

    /// Waits for the load to be worked off; a violation if it is not in time.
    async fn drain(&self, db: &tokio_postgres::Client) -> Option<String> {
        let ttl = self.env.timing.config().lease_ttl();
        let deadline = Instant::now() + ttl * 60 + Duration::from_secs(60);
        loop {
            let pending: i64 = scalar(
                db,
                "SELECT (SELECT count(*) FROM subscriptions WHERE next_billing_at <= now())
                      + (SELECT count(*) FROM dunning_runs WHERE state = 'active')
                      + (SELECT count(*) FROM webhook_events WHERE dispatched_at IS NULL)
                      + (SELECT count(*) FROM webhook_deliveries WHERE status <> 'delivered')
                      + (SELECT count(*) FROM email_outbox WHERE status <> 'sent')",
            )
            .await;
            if pending == 0 {
                return None;
            }
            if Instant::now() > deadline {
                return Some(format!("{pending} items still pending after the faults stopped"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGTERMs every replica; a violation for each one that does not exit.
    async fn stop(&mut self) -> Vec<String> {
        let ttl = self.env.timing.config().lease_ttl();
        for r in &self.replicas {
            signal(&r.child, Signal::SIGTERM);
        }
        let mut stuck = Vec::new();
        for r in &mut self.replicas {
            if tokio::time::timeout(ttl * 5, r.child.wait()).await.is_err() {
                stuck.push("a replica did not exit after SIGTERM".to_string());
            }
        }
        stuck
    }
}

async fn check(stage: &Stage, db: &tokio_postgres::Client, report: &mut ChaosReport) -> anyhow::Result<()> {
    let config = stage.env.timing.config();
    let restarts = &stage.restarts;
    let received = ticklease_sandbox::peers::received(&stage.http, &stage.smtp);
    let audit =
        ticklease_sandbox::audit::audit(db, &received, &["/hooks/a".to_string(), "/hooks/b".to_string()])
            .await?;
    let v = &mut report.violations;
    v.extend(audit.violations.iter().map(ToString::to_string));

    // Leadership gaps: consecutive term starts per role, outside Postgres restarts.
    let interval = config.max_poll();
    let bound = config.lease_ttl()
        + config.statement_timeout()
        + config.max_poll()
        + interval
        + Duration::from_millis(1500);
    report.gap_bound_ms = bound.as_secs_f64() * 1000.0;
    let rows = db
        .query_typed(
            "SELECT role, at FROM lease_history WHERE new_token <> old_token AND new_holder IS NOT NULL ORDER BY role, at",
            &[],
        )
        .await?;
    let mut last: BTreeMap<String, SystemTime> = BTreeMap::new();
    for r in &rows {
        let (role, at): (String, SystemTime) = (r.get(0), r.get(1));
        if let Some(prev) = last.insert(role.clone(), at) {
            let during_restart = restarts
                .iter()
                .any(|(from, to)| prev <= *to + config.lease_ttl() * 2 && at >= *from);
            let gap = at.duration_since(prev).unwrap_or_default();
            if !during_restart {
                let max = report.max_gap_ms.entry(role.clone()).or_default();
                *max = max.max(gap.as_secs_f64() * 1000.0);
                if gap > bound {
                    let gap = Violation::LeaderlessGap {
                        role: role.clone(),
                        gap,
                        bound,
                        after: prev,
                    };
                    v.push(gap.to_string());
                }
            }
        }
    }
    report.terms = rows.len() as i64;
    report.journal_claims = scalar(db, "SELECT count(*) FROM worker_journal").await;
    Ok(())
}
