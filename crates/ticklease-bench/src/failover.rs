//! The failover benchmark: a drill leader and a follower, each on its own
//! link through a fault proxy; one fault per trial; the database's record
//! says how long the role went unclaimed and whether the terms overlapped.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use tokio::io::BufReader;
use tokio::process::{Child, ChildStdout};
use tokio_postgres::types::Type;

use ticklease_testkit::{connect, signal, Fault, FaultProxy, PgCluster};

use crate::drill::{self, LeaderLines};
use crate::stats::{summarize, Summary};
use crate::{Timing, HISTORY_SQL};

/// The fault a trial injects into the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// SIGKILL: no RELEASE, the lease runs out.
    Sigkill,
    /// The leader's TCP link blackholed (statements hang), healed after the takeover.
    Severed,
    /// SIGSTOP past the TTL, SIGCONT after the takeover: it must claim nothing on resume.
    Freeze,
    /// SIGTERM: a clean shutdown releases at once.
    Sigterm,
}

impl Scenario {
    pub const ALL: [Scenario; 4] = [
        Scenario::Sigkill,
        Scenario::Severed,
        Scenario::Freeze,
        Scenario::Sigterm,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scenario::Sigkill => "sigkill",
            Scenario::Severed => "severed",
            Scenario::Freeze => "freeze",
            Scenario::Sigterm => "sigterm",
        }
    }
}

/// One trial's measurements, all on the database clock except `fault_to_takeover`.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    pub scenario: Scenario,
    pub n: usize,
    /// The old leader's last acknowledged ACQUIRE/RENEW → the new leader's first fenced claim.
    pub takeover: Duration,
    /// The old leader's last statement (renew or fenced write) → the new leader's first claim;
    /// negative would be an overlap.
    pub gap_ms: f64,
    /// Fenced writes of the old term committed after the new term's first write.
    pub stale_writes: i64,
    /// Local clock: fault injected → the follower reported leading.
    pub fault_to_takeover: Duration,
    /// For freeze and severed: how the old leader's tick ended once it could run again.
    pub old_ended: Option<String>,
}

/// A cluster and database prepared for drills.
pub struct Env {
    pub cluster: PgCluster,
    pub db: String,
    pub timing: Timing,
    pub exe: PathBuf,
    pub write_every: Duration,
}

impl Env {
    /// Starts a cluster of its own, migrated and instrumented.
    pub async fn start(timing: Timing, exe: PathBuf) -> anyhow::Result<Env> {
        Env::on(PgCluster::start()?, timing, exe).await
    }

    /// A migrated, instrumented database on `cluster`.
    pub async fn on(cluster: PgCluster, timing: Timing, exe: PathBuf) -> anyhow::Result<Env> {
        let db = cluster.create_database().await?;
        let mut client = connect(&cluster.config(&db)).await?;
        ticklease::migrate(&mut client).await?;
        ticklease_worker::migrate(&mut client).await?;
        client.batch_execute(HISTORY_SQL).await?;
        let write_every = timing.config().heartbeat_every() / 6;
        Ok(Env {
            cluster,
            db,
            timing,
            exe,
            write_every,
        })
    }

    pub fn url_via(&self, proxy: &FaultProxy) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{}", proxy.port(), self.db)
    }

    async fn spawn_leader(&self, proxy: &FaultProxy, role: &str) -> anyhow::Result<(Child, LeaderLines)> {
        drill::spawn_leader(
            &self.exe,
            &self.url_via(proxy),
            role,
            self.timing,
            self.write_every,
        )
    }
}

pub(crate) async fn next_line(
    lines: &mut tokio::io::Lines<BufReader<ChildStdout>>,
    within: Duration,
) -> anyhow::Result<String> {
    let line = tokio::time::timeout(within, lines.next_line())
        .await
        .context("no line in time")??;
    line.context("the process exited")
}

pub(crate) async fn next_leading(
    lines: &mut tokio::io::Lines<BufReader<ChildStdout>>,
    within: Duration,
) -> anyhow::Result<i64> {
    let line = next_line(lines, within).await?;
    Ok(line
        .strip_prefix("LEADING ")
        .with_context(|| format!("unexpected output {line:?}"))?
        .trim()
        .parse()?)
}

fn between(later: SystemTime, earlier: SystemTime) -> f64 {
    match later.duration_since(earlier) {
        Ok(d) => d.as_secs_f64() * 1000.0,
        Err(e) => -e.duration().as_secs_f64() * 1000.0,
    }
}

/// Runs one trial of `scenario`.
pub async fn trial(env: &Env, scenario: Scenario, n: usize) -> anyhow::Result<Trial> {
    let config = env.timing.config();
    let role = format!("drill_{}_{n}", scenario.as_str());
    let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], env.cluster.port()));
    let (leader_link, follower_link) = (
        FaultProxy::start(upstream).await?,
        FaultProxy::start(upstream).await?,
    );
    let (mut leader, mut leader_out) = env.spawn_leader(&leader_link, &role).await?;
    let old = next_leading(&mut leader_out, config.lease_ttl() * 3).await?;
    let (mut follower, mut follower_out) = env.spawn_leader(&follower_link, &role).await?;
    // Mid-term: a few heartbeats in, with the follower polling, at a random
    // point of its poll cycle (else every trial would hit the same phase).
    let phase = config.max_poll().mul_f64(rand::random::<f64>());
    tokio::time::sleep(config.heartbeat_every() * 2 + config.max_poll() + phase).await;

    let fault_at = Instant::now();
    match scenario {
        Scenario::Sigkill => signal(&leader, Signal::SIGKILL),
        Scenario::Severed => leader_link.set(Fault::Blackhole),
        Scenario::Freeze => signal(&leader, Signal::SIGSTOP),
        Scenario::Sigterm => signal(&leader, Signal::SIGTERM),
    }
    let new = next_leading(&mut follower_out, config.lease_ttl() * 3 + config.max_poll()).await?;
    let fault_to_takeover = fault_at.elapsed();
    if new <= old {
        bail!("the follower led token {new}, not above {old}");
    }
    // Let a frozen or cut-off old leader resume and try: it must claim nothing,
    // and its tick must end as lost (the work cancelled), not run on.
    let mut old_ended = None;
    match scenario {
        Scenario::Freeze | Scenario::Severed => {
            if scenario == Scenario::Freeze {
                signal(&leader, Signal::SIGCONT);
            } else {
                leader_link.set(Fault::Pass);
            }
            let line = next_line(&mut leader_out, config.lease_ttl() * 2).await?;
            if !line.starts_with(&format!("ENDED {old} lost")) {
                bail!("the resumed old leader did not end its tick as lost: {line:?}");
            }
            old_ended = Some(line);
        }
        _ => {}
    }
    tokio::time::sleep(config.heartbeat_every() * 2).await;
    signal(&leader, Signal::SIGKILL);
    signal(&follower, Signal::SIGKILL);
    let _ = leader.wait().await;
    let _ = follower.wait().await;

    let h = handover(env, &role, old).await?;
    Ok(Trial {
        scenario,
        n,
        takeover: h.first_claim.duration_since(h.last_renew).unwrap_or_default(),
        gap_ms: between(h.first_claim, h.last_statement),
        stale_writes: h.stale,
        fault_to_takeover,
        old_ended,
    })
}

/// What the database recorded of a handover.
struct Handover {
    /// The old term's last acknowledged ACQUIRE/RENEW.
    last_renew: SystemTime,
    /// The new term's first claim.
    first_claim: SystemTime,
    /// The old term's last statement (renew or write).
    last_statement: SystemTime,
    /// Writes of the old term after the new term's first claim.
    stale: i64,
}

async fn handover(env: &Env, role: &str, old: i64) -> anyhow::Result<Handover> {
    let role = role.to_string();
    let db = connect(&env.cluster.config(&env.db)).await?;
    let one = |sql: &'static str| {
        let (db, role) = (&db, role.clone());
        async move {
            let rows = db
                .query_typed(sql, &[(&role, Type::TEXT), (&old, Type::INT8)])
                .await?;
            Ok::<Option<SystemTime>, tokio_postgres::Error>(rows.first().and_then(|r| r.get(0)))
        }
    };
    let last_renew = one(
        "SELECT max(at) FROM lease_history WHERE role = $1 AND new_token = $2 AND new_holder IS NOT NULL",
    )
    .await?
    .context("no acknowledged ACQUIRE/RENEW of the old term")?;
    let first_claim = one("SELECT min(at) FROM drill_journal WHERE role = $1 AND token > $2")
        .await?
        .context("the new term wrote nothing")?;
    let last_write = one("SELECT max(at) FROM drill_journal WHERE role = $1 AND token = $2").await?;
    let last_statement = last_write.map_or(last_renew, |w| w.max(last_renew));
    let stale: i64 = db
        .query_typed(
            "SELECT count(*) FROM drill_journal WHERE role = $1 AND token = $2 AND at > (SELECT min(at) FROM drill_journal WHERE role = $1 AND token > $2)",
            &[(&role, Type::TEXT), (&old, Type::INT8)],
        )
        .await?[0]
        .get(0);
    Ok(Handover {
        last_renew,
        first_claim,
        last_statement,
        stale,
    })
}

/// Per-scenario summaries of takeover and gap, in milliseconds.
pub fn summaries(trials: &[Trial], scenario: Scenario) -> (Option<Summary>, Option<Summary>) {
    let of = |f: &dyn Fn(&Trial) -> f64| -> Vec<f64> {
        trials.iter().filter(|t| t.scenario == scenario).map(f).collect()
    };
    (
        summarize(&of(&|t| t.takeover.as_secs_f64() * 1000.0)),
        summarize(&of(&|t| t.gap_ms)),
    )
}

/// The raw trials as CSV.
pub fn csv(trials: &[Trial]) -> String {
    let mut out = String::from("scenario,trial,takeover_ms,gap_ms,stale_writes,fault_to_takeover_ms\n");
    for t in trials {
        let _ = writeln!(
            out,
            "{},{},{:.1},{:.1},{},{:.1}",
            t.scenario.as_str(),
            t.n,
            t.takeover.as_secs_f64() * 1000.0,
            t.gap_ms,
            t.stale_writes,
            t.fault_to_takeover.as_secs_f64() * 1000.0
        );
    }
    out
}

/// The results table in Markdown.
pub fn table(trials: &[Trial]) -> String {
    let mut out = String::from(
        "| scenario | trials | takeover p50 | p99 | max | gap min | gap p50 | gap p99 | gap max | stale writes |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    for s in Scenario::ALL {
        let (take, gap) = summaries(trials, s);
        let (Some(take), Some(gap)) = (take, gap) else {
            continue;
        };
        let stale: i64 = trials
            .iter()
            .filter(|t| t.scenario == s)
            .map(|t| t.stale_writes)
            .sum();
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {stale} |",
            s.as_str(),
            take.n,
            take.p50,
            take.p99,
            take.max,
            gap.min,
            gap.p50,
            gap.p99,
            gap.max
        );
    }
    out
}

/// Writes `failover-<timing>.csv` into `dir` and returns its path.
pub fn write_csv(dir: &Path, timing: Timing, trials: &[Trial]) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("failover-{}.csv", timing.as_str()));
    std::fs::write(&path, csv(trials))?;
    Ok(path)
}

/// The machine a run measured on, for the report.
pub fn machine() -> String {
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|m| {
            m.lines()
                .find_map(|l| l.strip_prefix("MemTotal:").map(str::trim).map(str::to_string))
        })
        .and_then(|kb| kb.trim_end_matches(" kB").parse::<f64>().ok())
        .map(|kb| kb / 1024.0 / 1024.0)
        .unwrap_or(0.0);
    let kernel = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{cores} cores, {mem_gib:.0} GiB, Linux {}", kernel.trim())
}

/// Writes `failover-<timing>.md`: the table, the machine, and how to rerun.
pub fn write_markdown(
    dir: &Path,
    timing: Timing,
    trials: &[Trial],
    server_version: &str,
) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("failover-{}.md", timing.as_str()));
    let per = trials.iter().map(|t| t.n + 1).max().unwrap_or(0);
    let c = timing.config();
    let text = format!(
        "# Failover, {} timings (generated)\n\n\
         TTL {:?}, heartbeat {:?}, statement timeout {:?}, abandon {:?}, max poll {:?}; {per} trials per scenario.\n\
         Machine: {}; PostgreSQL {server_version}; measured {}.\n\n\
         takeover = the old leader's last acknowledged ACQUIRE/RENEW → the new leader's first fenced claim;\n\
         gap = the old leader's last statement → the new leader's first claim (negative would be an overlap);\n\
         stale writes = fenced writes of the old term after the new term's first. All on the database clock.\n\n\
         {}\nRaw trials: `failover-{}.csv`. Rerun: `cargo run --release -p ticklease-bench -- failover --trials {per} --timing {}`.\n",
        timing.as_str(),
        c.lease_ttl(),
        c.heartbeat_every(),
        c.statement_timeout(),
        c.abandon_after(),
        c.max_poll(),
        machine(),
        humantime::format_rfc3339_seconds(SystemTime::now()),
        table(trials),
        timing.as_str(),
        timing.as_str(),
    );
    std::fs::write(&path, text)?;
    Ok(path)
}
