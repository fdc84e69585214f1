//! The chaos run: worker replicas, each on its own link through a fault
//! proxy, under a seeded stream of faults (SIGKILL, SIGTERM, SIGSTOP/SIGCONT,
//! blackholed and reset links, Postgres restarts) while load keeps arriving;
//! then a checker over the claim journal, the lease history and what the
//! peers received.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::{Duration, Instant, SystemTime};

use anyhow::Context;
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::process::{Child, Command};

use ticklease_sandbox::Violation;
use ticklease_testkit::{connect, scalar, signal, Fault, FaultProxy, HttpPeer, PgBouncer, SmtpSink};

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
    Command::new(&env.exe)
        .args([
            "worker",
            "--url",
            &env.url_via(link),
            "--timing",
            env.timing.as_str(),
        ])
        .args(["--payments-url", &http.url(), "--smtp-url", &smtp.url()])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("spawn a worker replica")
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

/// Runs the chaos and checks the outcome.
pub async fn run(opts: &ChaosOptions) -> anyhow::Result<ChaosReport> {
    let started = Instant::now();
    let env = Env::start(opts.timing, opts.exe.clone()).await?;
    let config = opts.timing.config();
    let ttl = config.lease_ttl();
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
    let mut kinds: Vec<&'static str> = REPLICA_FAULTS.to_vec();
    kinds.push("pg_restart");
    if opts.pooled {
        kinds.push("bouncer_restart");
    }
    let mut replicas = Vec::new();
    for _ in 0..opts.replicas {
        let link = FaultProxy::start(upstream).await?;
        let child = spawn_worker(&env, &link, &http, &smtp)?;
        replicas.push(Replica { link, child });
    }

    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut report = ChaosReport {
        seed: opts.seed,
        ..ChaosReport::default()
    };
    let mut restarts: Vec<(SystemTime, SystemTime)> = Vec::new();
    let span = |rng: &mut StdRng, lo: f64, hi: f64| ttl.mul_f64(rng.gen_range(lo..hi));
    for k in 0..opts.faults {
        tokio::time::sleep(span(&mut rng, 0.2, 1.0)).await;
        // Every kind once first; then whole-service restarts are rare (one in twenty).
        let kind = match k {
            k if k < kinds.len() => kinds[k],
            _ if rng.gen_range(0..20) == 0 => kinds[rng.gen_range(REPLICA_FAULTS.len()..kinds.len())],
            _ => REPLICA_FAULTS[rng.gen_range(0..REPLICA_FAULTS.len())],
        };
        let i = rng.gen_range(0..replicas.len());
        *report.faults.entry(kind).or_default() += 1;
        tracing::info!(k, kind, replica = i, "fault");
        match kind {
            "sigkill" | "sigterm" => {
                let r = &mut replicas[i];
                signal(
                    &r.child,
                    if kind == "sigkill" {
                        Signal::SIGKILL
                    } else {
                        Signal::SIGTERM
                    },
                );
                let _ = tokio::time::timeout(ttl * 5, r.child.wait()).await;
                r.child = spawn_worker(&env, &r.link, &http, &smtp)?;
            }
            "freeze" => {
                signal(&replicas[i].child, Signal::SIGSTOP);
                tokio::time::sleep(span(&mut rng, 0.5, 2.0)).await;
                signal(&replicas[i].child, Signal::SIGCONT);
            }
            "blackhole" => {
                replicas[i].link.set(Fault::Blackhole);
                tokio::time::sleep(span(&mut rng, 0.5, 2.0)).await;
                replicas[i].link.set(Fault::Pass);
            }
            "reset" => {
                replicas[i].link.set(Fault::Reset);
                tokio::time::sleep(Duration::from_millis(50)).await;
                replicas[i].link.set(Fault::Pass);
            }
            "bouncer_restart" => {
                let from = SystemTime::now();
                bouncer
                    .as_ref()
                    .context("bouncer restart without a bouncer")?
                    .restart()?;
                restarts.push((from, SystemTime::now()));
            }
            _ => {
                let from = SystemTime::now();
                env.cluster.restart()?;
                restarts.push((from, SystemTime::now()));
            }
        }
        if k % 5 == 4 {
            top_up(&env, 2, &endpoints).await?;
        }
    }
    for r in &replicas {
        r.link.set(Fault::Pass);
        signal(&r.child, Signal::SIGCONT);
    }

    // Drain the load.
    let db = connect(&env.cluster.config(&env.db)).await?;
    let deadline = Instant::now() + ttl * 60 + Duration::from_secs(60);
    loop {
        let pending: i64 = scalar(
            &db,
            "SELECT (SELECT count(*) FROM subscriptions WHERE next_billing_at <= now())
                  + (SELECT count(*) FROM dunning_runs WHERE state = 'active')
                  + (SELECT count(*) FROM webhook_events WHERE dispatched_at IS NULL)
                  + (SELECT count(*) FROM webhook_deliveries WHERE status <> 'delivered')
                  + (SELECT count(*) FROM email_outbox WHERE status <> 'sent')",
        )
        .await;
        if pending == 0 {
            break;
        }
        if Instant::now() > deadline {
            report
                .violations
                .push(format!("{pending} items still pending after the faults stopped"));
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for r in &replicas {
        signal(&r.child, Signal::SIGTERM);
    }
    for r in &mut replicas {
        if tokio::time::timeout(ttl * 5, r.child.wait()).await.is_err() {
            report
                .violations
                .push("a replica did not exit after SIGTERM".into());
        }
    }

    check(&env, &db, &http, &smtp, &restarts, &mut report).await?;
    report.took = started.elapsed();
    Ok(report)
}

async fn check(
    env: &Env,
    db: &tokio_postgres::Client,
    http: &HttpPeer,
    smtp: &SmtpSink,
    restarts: &[(SystemTime, SystemTime)],
    report: &mut ChaosReport,
) -> anyhow::Result<()> {
    let config = env.timing.config();
    let received = ticklease_sandbox::peers::received(http, smtp);
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
