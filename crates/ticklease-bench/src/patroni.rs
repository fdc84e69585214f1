//! The Patroni campaign: a three-member Patroni + etcd cluster, three
//! replicas leading three roles on the multi-host URL (with and without the
//! direct URL), each tick a fenced claim on its term's server
//! (`ticklease_testkit::ha`). Per round, on a fresh cluster: a switchover, a
//! SIGKILLed primary postmaster, the primary's Patroni SIGKILLed and
//! restarted after 1 s, and last the primary's Patroni SIGKILLed for good
//! (Patroni promotes another member after its TTL while the old primary
//! stays writable: two writable servers). Measured per fault: the fault →
//! every role led again, Patroni healthy (or the promotion seen) → every
//! role led again, and claims committed on the old primary after the
//! promotion (writes to be rewound).

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use ticklease::CancellationToken;
use ticklease_testkit::ha::{
    claim_violations, create_claims, every_role_claims_after, last_claim, on_primary, spawn_replica,
};
use ticklease_testkit::{connect, PatroniCluster};

use crate::stats::summarize;
use crate::Timing;

/// Longest a fault may take to be led through.
const LED_AGAIN_MAX: Duration = Duration::from_secs(120);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    Switchover,
    KillPostmaster,
    KillPatroniRestarted,
    KillPatroniForGood,
}

impl Fault {
    const ALL: [Fault; 4] = [
        Fault::Switchover,
        Fault::KillPostmaster,
        Fault::KillPatroniRestarted,
        Fault::KillPatroniForGood,
    ];

    fn as_str(self) -> &'static str {
        match self {
            Fault::Switchover => "switchover",
            Fault::KillPostmaster => "primary postmaster SIGKILL",
            Fault::KillPatroniRestarted => "primary's Patroni SIGKILL, restarted after 1 s",
            Fault::KillPatroniForGood => "primary's Patroni SIGKILL, not restarted",
        }
    }
}

/// One fault's measurements.
#[derive(Debug, Clone)]
struct Trial {
    direct: bool,
    fault: Fault,
    /// The fault → every role claimed again.
    from_fault: Duration,
    /// Patroni healthy again (the promotion seen, for the last fault) → every role claimed again.
    from_healthy: Duration,
    /// Claims committed on the old primary after another member was promoted.
    old_primary_claims: i64,
}

/// Runs `rounds` rounds with the direct URL and `rounds` without; writes
/// `patroni.md` and `patroni.csv` under `out`.
pub async fn run(rounds: usize, timing: Timing, out: &Path) -> anyhow::Result<()> {
    let mut trials = Vec::new();
    for direct in [true, false] {
        for round in 0..rounds {
            eprintln!("patroni: round {} of {rounds}, direct URL {direct}", round + 1);
            trials.extend(one_round(direct, timing).await?);
        }
    }
    write(&trials, timing, out)
}

async fn one_round(direct: bool, timing: Timing) -> anyhow::Result<Vec<Trial>> {
    let mut cluster = tokio::task::spawn_blocking(PatroniCluster::start).await??;
    let owner = connect(&cluster.url("postgres").parse()?).await?;
    owner.batch_execute("CREATE DATABASE app").await?;
    let url = cluster.url("app");
    ticklease::migrate(&mut connect(&url.parse()?).await?).await?;
    create_claims(&url).await;
    let stop = CancellationToken::new();
    for r in 0..3 {
        spawn_replica(&url, timing.config(), r, direct, stop.clone()).await;
    }
    every_role_claims_after(&url, 0, LED_AGAIN_MAX).await;
    let mut trials = Vec::new();
    for fault in Fault::ALL {
        let (trial, back) = inflict(cluster, fault, direct, &url).await?;
        cluster = back;
        trials.push(trial);
    }
    stop.cancel();
    let (shared, backwards) = claim_violations(&url).await;
    anyhow::ensure!(
        shared == 0 && backwards == 0,
        "claims: {shared} shared terms, {backwards} backwards"
    );
    drop(cluster);
    Ok(trials)
}

/// Applies `fault` and measures until every role claims again.
async fn inflict(
    mut cluster: PatroniCluster,
    fault: Fault,
    direct: bool,
    url: &str,
) -> anyhow::Result<(Trial, PatroniCluster)> {
    let leader = cluster.leader().context("no leader")?.name.clone();
    let started = Instant::now();
    let before = last_claim(url).await;
    if fault == Fault::KillPatroniForGood {
        return two_writable(cluster, &leader, direct, started).await;
    }
    let cluster = tokio::task::spawn_blocking(move || -> anyhow::Result<PatroniCluster> {
        match fault {
            Fault::Switchover => {
                let other = cluster
                    .members()
                    .iter()
                    .find(|m| m.name != leader)
                    .context("a member")?;
                cluster.switchover(&other.name.clone())?;
            }
            Fault::KillPostmaster => {
                cluster.kill_leader_postmaster()?;
            }
            _ => {
                cluster.kill_patroni(&leader)?;
                std::thread::sleep(Duration::from_secs(1));
                cluster.restart_patroni(&leader)?;
            }
        }
        cluster.wait_healthy()?;
        Ok(cluster)
    })
    .await??;
    let healthy = Instant::now();
    every_role_claims_after(url, before, LED_AGAIN_MAX).await;
    let trial = Trial {
        direct,
        fault,
        from_fault: started.elapsed(),
        from_healthy: healthy.elapsed(),
        old_primary_claims: 0,
    };
    Ok((trial, cluster))
}

/// The old primary's Patroni is killed for good: another member is promoted
/// after Patroni's TTL while the old primary stays writable.
async fn two_writable(
    cluster: PatroniCluster,
    old: &str,
    direct: bool,
    started: Instant,
) -> anyhow::Result<(Trial, PatroniCluster)> {
    let old = old.to_owned();
    let killed = old.clone();
    let (cluster, new) = tokio::task::spawn_blocking(move || -> anyhow::Result<_> {
        let mut cluster = cluster;
        cluster.kill_patroni(&killed)?;
        let deadline = Instant::now() + LED_AGAIN_MAX;
        loop {
            if let Some(new) = cluster.leader().filter(|l| l.name != killed) {
                let new = new.name.clone();
                return Ok((cluster, new));
            }
            anyhow::ensure!(Instant::now() < deadline, "no member was promoted");
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await??;
    let promoted_at = Instant::now();
    let new_url = cluster.member_url(&new, "app")?;
    let old_url = cluster.member_url(&old, "app")?;
    let promoted_clock = on_primary(
        &new_url,
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8",
        LED_AGAIN_MAX,
    )
    .await;
    let before = last_claim(&new_url).await;
    every_role_claims_after(&new_url, before, LED_AGAIN_MAX).await;
    let led = Instant::now();
    // Writes the old primary took after the promotion (to be rewound): read
    // once every replica had moved.
    let late = format!("SELECT count(*) FROM claims WHERE at > to_timestamp({promoted_clock} / 1000.0)");
    let old_primary_claims = on_primary(&old_url, &late, LED_AGAIN_MAX).await;
    let trial = Trial {
        direct,
        fault: Fault::KillPatroniForGood,
        from_fault: led - started,
        from_healthy: led - promoted_at,
        old_primary_claims,
    };
    Ok((trial, cluster))
}

fn write(trials: &[Trial], timing: Timing, out: &Path) -> anyhow::Result<()> {
    let mut csv = String::from("direct,fault,from_fault_s,from_healthy_s,old_primary_claims\n");
    for t in trials {
        let _ = writeln!(
            csv,
            "{},{},{:.3},{:.3},{}",
            t.direct,
            t.fault.as_str(),
            t.from_fault.as_secs_f64(),
            t.from_healthy.as_secs_f64(),
            t.old_primary_claims
        );
    }
    std::fs::write(out.join("patroni.csv"), csv)?;
    let mut md = format!(
        "# Patroni failovers\n\n`ticklease-bench patroni --timing {}`: a three-member Patroni 3.0.2 + etcd 3.4 cluster \
         (PostgreSQL 15, async replication, Patroni TTL 20 s, loop_wait 1 s) on one 2-core machine, three replicas \
         leading three roles every 100 ms on the multi-host URL, each tick a fenced claim on its term's server. \
         Per round, on a fresh cluster, the four faults in this order. Seconds, p50 / p99 / max over the rounds \
         (raw: `patroni.csv`). \"Healthy\" is Patroni's REST API showing one primary and two streaming replicas, \
         or, for the Patroni killed for good, another member answering as primary.\n\n\
         | direct URL | fault | n | fault → led again | healthy → led again | claims on the old primary after the promotion (max) |\n\
         |---|---|---|---|---|---|\n",
        timing.as_str()
    );
    for direct in [true, false] {
        for fault in Fault::ALL {
            let of: Vec<&Trial> = trials
                .iter()
                .filter(|t| t.direct == direct && t.fault == fault)
                .collect();
            let secs = |f: fn(&Trial) -> Duration| {
                let s: Vec<f64> = of.iter().map(|t| f(t).as_secs_f64()).collect();
                summarize(&s).map_or("-".into(), |s| {
                    format!("{:.2} / {:.2} / {:.2}", s.p50, s.p99, s.max)
                })
            };
            let old = of.iter().map(|t| t.old_primary_claims).max().unwrap_or(0);
            let _ = writeln!(
                md,
                "| {} | {} | {} | {} | {} | {} |",
                if direct { "yes" } else { "no" },
                fault.as_str(),
                of.len(),
                secs(|t| t.from_fault),
                secs(|t| t.from_healthy),
                old
            );
        }
    }
    std::fs::write(out.join("patroni.md"), md)?;
    Ok(())
}
