//! The Postgres failover benchmark: a primary and a streaming standby, a
//! drill leader and a follower both on the multi-host URL; a clean
//! switchover (the standby caught up, the primary stopped, the standby
//! promoted). Measured on the new primary's clock: the promotion → the
//! role's first fenced claim there, and stale writes.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use tokio::process::Child;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use ticklease_testkit::{connect, signal, url_for_hosts, PgCluster, Standby};

use crate::drill::{self, LeaderLines};
use crate::failover::{machine, next_leading};
use crate::stats::summarize;
use crate::{Timing, HISTORY_SQL};

const ROLE: &str = "drill_promotion";

/// One switchover's measurements.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    pub n: usize,
    /// The promotion returned (the new primary's clock read just after) → the
    /// first fenced claim on the new primary; 0 if it came before that read.
    pub led_again: Duration,
    /// Local clock: the primary's fast shutdown began → the promotion returned
    /// (no server took writes in between).
    pub switchover: Duration,
    /// The promotion returned → the first ACQUIRE/RENEW committed on the new primary.
    pub lease_again: Duration,
    /// Whether that claim was under a new term (else the old leader's term
    /// carried over: its RENEW reached the new primary within the TTL).
    pub new_term: bool,
    /// Fenced writes under a token after a newer token's first write.
    pub stale_writes: i64,
}

/// A primary, its standby and a migrated, instrumented database on both.
struct Pair {
    primary: PgCluster,
    standby: Standby,
    db: String,
}

impl Pair {
    async fn start() -> anyhow::Result<Pair> {
        let primary = PgCluster::start_primary()?;
        let db = primary.create_database().await?;
        let mut client = connect(&primary.config(&db)).await?;
        ticklease::migrate(&mut client).await?;
        ticklease_worker::migrate(&mut client).await?;
        client.batch_execute(HISTORY_SQL).await?;
        let standby = Standby::start(&primary)?;
        Ok(Pair { primary, standby, db })
    }

    fn url(&self) -> String {
        url_for_hosts(&[&self.primary, self.standby.cluster()], &self.db)
    }
}

fn spawn_leader(exe: &Path, url: &str, timing: Timing) -> anyhow::Result<(Child, LeaderLines)> {
    drill::spawn_leader(
        exe,
        url,
        None,
        ROLE,
        timing,
        timing.config().heartbeat_every() / 6,
        drill::Driver::Scheduler,
    )
}

/// A run's settings.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Plan {
    pub timing: Timing,
    /// How long no server takes writes, on top of the switchover itself
    /// (between the primary's shutdown and the promotion): past abandon-after,
    /// the old term ends and the role is taken over under a new one.
    pub down_for: Duration,
}

impl Plan {
    /// `scaled`, or `scaled-down1500ms` with an outage added.
    pub fn label(&self) -> String {
        match self.down_for.as_millis() {
            0 => self.timing.as_str().to_string(),
            ms => format!("{}-down{ms}ms", self.timing.as_str()),
        }
    }
}

/// Runs one switchover trial on a fresh primary and standby.
pub async fn trial(exe: &Path, plan: Plan, n: usize) -> anyhow::Result<Trial> {
    let timing = plan.timing;
    let config = timing.config();
    let pair = Pair::start().await?;
    let url = pair.url();
    let (mut leader, mut leader_out) = spawn_leader(exe, &url, timing)?;
    let old = next_leading(&mut leader_out, config.lease_ttl() * 3).await?;
    let (mut follower, _follower_out) = spawn_leader(exe, &url, timing)?;
    // Mid-term, at a random point of the follower's poll cycle.
    let phase = config.max_poll().mul_f64(rand::random::<f64>());
    tokio::time::sleep(config.heartbeat_every() * 2 + config.max_poll() + phase).await;

    // Connected while still a hot standby, so the clock is read at once.
    let observer = connect(&pair.standby.cluster().config(&pair.db)).await?;
    pair.standby.wait_caught_up(&pair.primary).await?;
    // Anything recorded after this instant was written on the new primary:
    // nothing commits while neither server takes writes.
    let down_at: SystemTime = connect(&pair.primary.config(&pair.db))
        .await?
        .query_one("SELECT clock_timestamp()", &[])
        .await?
        .get(0);
    let stopping = std::time::Instant::now();
    pair.primary.stop_fast();
    tokio::time::sleep(plan.down_for).await;
    pair.standby.promote().await?;
    let switchover = stopping.elapsed();
    let promoted: SystemTime = observer.query_one("SELECT clock_timestamp()", &[]).await?.get(0);
    let within = config.lease_ttl() * 3 + config.max_poll() + Duration::from_secs(10);
    let (first_at, token) = first_claim_after(&observer, down_at, within).await?;
    // Time for a stale write to show, were the fence to let one through.
    tokio::time::sleep(config.heartbeat_every() * 2).await;
    signal(&leader, Signal::SIGKILL);
    signal(&follower, Signal::SIGKILL);
    let _ = leader.wait().await;
    let _ = follower.wait().await;
    let lease_at: SystemTime = observer
        .query_typed(
            "SELECT min(at) FROM lease_history WHERE role = $1 AND at >= $2 AND new_holder IS NOT NULL",
            &[(&ROLE, Type::TEXT), (&down_at, Type::TIMESTAMPTZ)],
        )
        .await?[0]
        .get::<_, Option<SystemTime>>(0)
        .context("no ACQUIRE/RENEW on the new primary")?;
    Ok(Trial {
        n,
        switchover,
        lease_again: lease_at.duration_since(promoted).unwrap_or_default(),
        led_again: first_at.duration_since(promoted).unwrap_or_default(),
        new_term: token > old,
        stale_writes: stale_writes(&observer).await?,
    })
}

/// Polls the new primary for the first fenced claim at or after `since`.
async fn first_claim_after(
    db: &Client,
    since: SystemTime,
    within: Duration,
) -> anyhow::Result<(SystemTime, i64)> {
    let started = std::time::Instant::now();
    while started.elapsed() < within {
        let row = db
            .query_typed(
                "SELECT at, token FROM drill_journal WHERE role = $1 AND at >= $2 ORDER BY at LIMIT 1",
                &[(&ROLE, Type::TEXT), (&since, Type::TIMESTAMPTZ)],
            )
            .await?;
        if let Some(r) = row.first() {
            return Ok((r.get(0), r.get(1)));
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    bail!("no fenced claim on the new primary within {within:?} of the promotion")
}

async fn stale_writes(db: &Client) -> anyhow::Result<i64> {
    Ok(db
        .query_typed(
            "SELECT count(*) FROM drill_journal j WHERE role = $1 AND EXISTS \
               (SELECT 1 FROM drill_journal n WHERE n.role = j.role AND n.token > j.token AND n.at < j.at)",
            &[(&ROLE, Type::TEXT)],
        )
        .await?[0]
        .get(0))
}

/// The results row in Markdown.
pub fn table(plan: Plan, trials: &[Trial]) -> String {
    let mut out = String::from(
        "| timing | trials | switchover p50 | switchover p99 | switchover max | claim p50 | claim p99 | claim max | lease p50 | lease p99 | lease max | new term | stale writes |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
    );
    let ms: Vec<f64> = trials
        .iter()
        .map(|t| t.led_again.as_secs_f64() * 1000.0)
        .collect();
    let lease: Vec<f64> = trials
        .iter()
        .map(|t| t.lease_again.as_secs_f64() * 1000.0)
        .collect();
    let down: Vec<f64> = trials
        .iter()
        .map(|t| t.switchover.as_secs_f64() * 1000.0)
        .collect();
    if let (Some(s), Some(l), Some(d)) = (summarize(&ms), summarize(&lease), summarize(&down)) {
        let new_terms = trials.iter().filter(|t| t.new_term).count();
        let stale: i64 = trials.iter().map(|t| t.stale_writes).sum();
        let _ = writeln!(
            out,
            "| {} | {} | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {:.0} ms | {new_terms}/{} | {stale} |",
            plan.label(),
            s.n,
            d.p50,
            d.p99,
            d.max,
            s.p50,
            s.p99,
            s.max,
            l.p50,
            l.p99,
            l.max,
            s.n
        );
    }
    out
}

/// Writes `promotion-<timing>.csv` and `.md` into `dir`; returns the markdown's path.
pub fn write_reports(dir: &Path, plan: Plan, trials: &[Trial]) -> anyhow::Result<PathBuf> {
    let (timing, label) = (plan.timing, plan.label());
    std::fs::create_dir_all(dir)?;
    let mut csv = String::from("trial,switchover_ms,claim_ms,lease_ms,new_term,stale_writes\n");
    for t in trials {
        let _ = writeln!(
            csv,
            "{},{:.1},{:.1},{:.1},{},{}",
            t.n,
            t.switchover.as_secs_f64() * 1000.0,
            t.led_again.as_secs_f64() * 1000.0,
            t.lease_again.as_secs_f64() * 1000.0,
            t.new_term,
            t.stale_writes
        );
    }
    std::fs::write(dir.join(format!("promotion-{label}.csv")), csv)?;
    let c = timing.config();
    let md = format!(
        "# Postgres switchover, {} timings (generated)\n\n\
         TTL {:?}, heartbeat {:?}, statement timeout {:?}, abandon {:?}, max poll {:?}; \
         no server takes writes for {:?} on top of the switchover.\n\
         Machine: {}; measured {}.\n\n{}\n\
         Raw trials: `promotion-{label}.csv`. Rerun: `cargo run --release -p ticklease-bench -- promotion --trials {} --timing {} --down-for {}ms`.\n",
        timing.as_str(),
        c.lease_ttl(),
        c.heartbeat_every(),
        c.statement_timeout(),
        c.abandon_after(),
        c.max_poll(),
        plan.down_for,
        machine(),
        humantime::format_rfc3339_seconds(SystemTime::now()),
        table(plan, trials),
        trials.len(),
        timing.as_str(),
        plan.down_for.as_millis(),
    );
    let path = dir.join(format!("promotion-{label}.md"));
    std::fs::write(&path, md)?;
    Ok(path)
}
