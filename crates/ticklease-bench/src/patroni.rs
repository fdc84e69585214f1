//! The Patroni campaign: a three-member Patroni + etcd cluster, asynchronous
//! or in Patroni's `synchronous_mode`; three replicas leading three roles on
//! the multi-host URL (with and without the direct URL, with and without
//! Patroni's word: `PgStore::with_patroni`), each tick a fenced claim on its
//! term's server (`ticklease_testkit::ha`), and a fourth replica reaching
//! every member through proxies of its own. Per round, on a fresh cluster: a
//! switchover, a SIGKILLed primary postmaster, the primary's Patroni
//! SIGKILLed and restarted after 1 s, and last the primary's Patroni
//! SIGKILLed for good (Patroni promotes another member after its TTL while
//! the old primary stays writable: two writable servers), the fourth
//! replica's proxies to the other members resetting every connection from
//! then on (a one-sided partition: it reaches the old primary alone).
//! Measured per fault: the fault → every role led again, the primary
//! writable again (Patroni healthy and its Postgres out of recovery: Patroni
//! answers as the primary while the restarted or promoted Postgres still
//! replays, and that is Patroni's time) → every role led again; for the last, the claims the
//! old primary took after the promotion (writes to be rewound) and how long
//! a role was led on both servers at once.

use std::fmt::Write as _;
use std::path::Path;
use std::time::{Duration, Instant};

use anyhow::Context;

use ticklease::patroni::Patroni;
use ticklease::CancellationToken;
use ticklease_testkit::ha::{
    claim_violations, create_claims, every_role_claims_after, last_claim, on_primary, spawn_checked_replica,
    ROLES,
};
use ticklease_testkit::{connect, Fault as ProxyFault, FaultProxy, PatroniCluster};

use crate::stats::summarize;
use crate::Timing;

/// Longest a fault may take to be led through.
const LED_AGAIN_MAX: Duration = Duration::from_secs(120);
/// How long the old primary stays reachable after the promotion before its
/// claims are read: past a TTL, so a replica that would lose its term there
/// has, and the partitioned replica leads there for all of it unless told.
const SPLIT_HELD: Duration = Duration::from_secs(15);
/// The replica behind proxies of its own (the others are 0, 1 and 2).
const PARTITIONED: i32 = 3;

/// Patroni's replication mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Replication {
    Async,
    /// `synchronous_mode: true`: the leader commits once its synchronous standby has the commit.
    Sync,
}

/// Whether the replicas' terms need Patroni's word (`PgStore::with_patroni`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Word {
    Without,
    With,
}

/// One cell of the campaign.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Setup {
    pub replication: Replication,
    pub word: Word,
    pub direct: bool,
}

impl Setup {
    fn label(self) -> String {
        format!(
            "{} | {} | {}",
            match self.replication {
                Replication::Async => "async",
                Replication::Sync => "sync",
            },
            match self.word {
                Word::Without => "without",
                Word::With => "with",
            },
            if self.direct { "yes" } else { "no" }
        )
    }
}

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
            Fault::KillPatroniForGood => "primary's Patroni SIGKILL, not restarted; one-sided partition",
        }
    }
}

/// One fault's measurements.
#[derive(Debug, Clone)]
struct Trial {
    fault: Fault,
    /// The fault → every role claimed again.
    from_fault: Duration,
    /// The primary writable again (Patroni healthy, its Postgres out of
    /// recovery; the promoted server's, for the last fault) → every role claimed again.
    from_healthy: Duration,
    /// What the old primary took after the promotion (the last fault alone leaves it writable).
    split: Option<Split>,
}

/// The two writable servers of the last fault, read `SPLIT_HELD` after the promotion.
#[derive(Debug, Clone, Copy)]
struct Split {
    /// Claims of the multi-host replicas committed on the old primary after the promotion.
    multi_host: i64,
    /// The partitioned replica's.
    partitioned: i64,
    /// The longest a role was claimed on both servers by the multi-host
    /// replicas: its last claim of theirs on the old primary after the
    /// promotion − its first on the promoted server.
    multi_host_overlap: Duration,
    /// The same, of the partitioned replica's claims on the old primary.
    partitioned_overlap: Duration,
}

/// A round's trials, and what the claims on the promoted server break.
#[derive(Debug)]
struct Round {
    trials: Vec<Trial>,
    shared: i64,
    backwards: i64,
}

/// Everything measured so far, and the rounds that failed.
#[derive(Debug, Default)]
struct Results {
    /// Each round's setup and number (from 1), and what it measured.
    rounds: Vec<(Setup, usize, Round)>,
    failures: Vec<String>,
}

/// Runs `rounds` passes over `setups` (each pass a round of every setup, so
/// a run cut short has every setup measured alike); writes `patroni.md` and
/// `patroni.csv` under `out` after every round, so a run cut short keeps
/// what it measured.
pub async fn run(rounds: usize, timing: Timing, setups: &[Setup], out: &Path) -> anyhow::Result<()> {
    let mut results = Results::default();
    for round in 1..=rounds {
        for &setup in setups {
            eprintln!("patroni: round {round} of {rounds}: {}", setup.label());
            match one_round_caught(setup, timing).await {
                Ok(r) => results.rounds.push((setup, round, r)),
                Err(e) => {
                    let failed = format!("{}, round {round}: {e}", setup.label());
                    eprintln!("patroni: failed: {failed}");
                    results.failures.push(failed);
                }
            }
            write(&results, setups, timing, out)?;
        }
    }
    Ok(())
}

/// [`one_round`] on a task of its own, so that a panic of the test kit's
/// (a bound passed) fails that round, not the run; why it failed.
async fn one_round_caught(setup: Setup, timing: Timing) -> Result<Round, String> {
    match tokio::spawn(one_round(setup, timing)).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(format!("{e:#}")),
        Err(e) => Err(panic_text(e)),
    }
}

/// What a round's task panicked with.
fn panic_text(e: tokio::task::JoinError) -> String {
    match e.try_into_panic() {
        Ok(p) => p
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| p.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "a panic".into()),
        Err(e) => e.to_string(),
    }
}

async fn one_round(setup: Setup, timing: Timing) -> anyhow::Result<Round> {
    let synchronous = setup.replication == Replication::Sync;
    let mut cluster = tokio::task::spawn_blocking(move || PatroniCluster::start_with(synchronous)).await??;
    let owner = connect(&cluster.url("postgres").parse()?).await?;
    owner.batch_execute("CREATE DATABASE app").await?;
    let url = cluster.url("app");
    ticklease::migrate(&mut connect(&url.parse()?).await?).await?;
    create_claims(&url).await;
    let stop = CancellationToken::new();
    // A round that fails stops its replicas with it.
    let _stopped = stop.clone().drop_guard();
    let config = timing.config();
    for r in 0..PARTITIONED {
        let word = word(&cluster, setup, timing)?;
        spawn_checked_replica(&url, config, r, setup.direct, word, stop.clone()).await;
    }
    let proxies = spawn_partitioned(&cluster, setup, timing, stop.clone()).await?;
    every_role_claims_after(&url, 0, LED_AGAIN_MAX).await;
    let mut trials = Vec::new();
    for fault in Fault::ALL {
        let (trial, back) = inflict(cluster, fault, &url, &proxies).await?;
        cluster = back;
        trials.push(trial);
    }
    stop.cancel();
    let (shared, backwards) = claim_violations(&url).await;
    drop(cluster);
    Ok(Round {
        trials,
        shared,
        backwards,
    })
}

/// Patroni's word for a replica of `setup`: every member's REST API, each
/// request bounded by the statement timeout.
fn word(cluster: &PatroniCluster, setup: Setup, timing: Timing) -> anyhow::Result<Option<Patroni>> {
    if setup.word == Word::Without {
        return Ok(None);
    }
    Ok(Some(Patroni::new(
        cluster.api_urls(),
        timing.config().statement_timeout(),
    )?))
}

/// Starts the partitioned replica: its URL names every member through a
/// proxy of its own (member name, proxy), which the last fault cuts to all
/// but the old primary.
async fn spawn_partitioned(
    cluster: &PatroniCluster,
    setup: Setup,
    timing: Timing,
    stop: CancellationToken,
) -> anyhow::Result<Vec<(String, FaultProxy)>> {
    let mut proxies = Vec::new();
    for m in cluster.members() {
        let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], m.pg_port));
        proxies.push((m.name.clone(), FaultProxy::start(upstream).await?));
    }
    let hosts: Vec<String> = proxies.iter().map(|(_, p)| p.addr().to_string()).collect();
    let url = format!(
        "postgres://postgres@{}/app?target_session_attrs=read-write",
        hosts.join(",")
    );
    let word = word(cluster, setup, timing)?;
    spawn_checked_replica(&url, timing.config(), PARTITIONED, setup.direct, word, stop).await;
    Ok(proxies)
}

/// Applies `fault` and measures until every role claims again.
async fn inflict(
    mut cluster: PatroniCluster,
    fault: Fault,
    url: &str,
    proxies: &[(String, FaultProxy)],
) -> anyhow::Result<(Trial, PatroniCluster)> {
    let leader = cluster.leader().context("no leader")?.name.clone();
    let started = Instant::now();
    let before = last_claim(url).await;
    if fault == Fault::KillPatroniForGood {
        return two_writable(cluster, &leader, proxies, started).await;
    }
    let cluster = tokio::task::spawn_blocking(move || -> anyhow::Result<PatroniCluster> {
        match fault {
            Fault::Switchover => {
                let candidate = switchover_candidate(&cluster, &leader)?;
                cluster.switchover(&candidate)?;
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
    writable(url).await;
    let healthy = Instant::now();
    every_role_claims_after(url, before, LED_AGAIN_MAX).await;
    let trial = Trial {
        fault,
        from_fault: started.elapsed(),
        from_healthy: healthy.elapsed(),
        split: None,
    };
    Ok((trial, cluster))
}

/// The synchronous standby (in synchronous mode Patroni refuses any other
/// candidate), else any member but the leader.
fn switchover_candidate(cluster: &PatroniCluster, leader: &str) -> anyhow::Result<String> {
    let candidate = cluster
        .synchronous_standbys()
        .next()
        .or_else(|| cluster.members().iter().find(|m| m.name != leader))
        .context("a member")?;
    Ok(candidate.name.clone())
}

/// The old primary's Patroni is killed for good: another member is promoted
/// after Patroni's TTL while the old primary stays writable; the partitioned
/// replica reaches the old primary alone from the kill on.
async fn two_writable(
    mut cluster: PatroniCluster,
    old: &str,
    proxies: &[(String, FaultProxy)],
    started: Instant,
) -> anyhow::Result<(Trial, PatroniCluster)> {
    cluster.kill_patroni(old)?;
    for (name, proxy) in proxies {
        if name != old {
            proxy.set(ProxyFault::Reset);
        }
    }
    let (cluster, new) = promoted(cluster, old.to_owned()).await?;
    let new_url = cluster.member_url(&new, "app")?;
    let old_url = cluster.member_url(old, "app")?;
    // The instant the promoted server took writes, on its own clock (the
    // old primary's: one machine): REST API's 200 comes before it leaves recovery.
    let promoted_clock = writable(&new_url).await;
    let promoted_at = Instant::now();
    let before = last_claim(&new_url).await;
    every_role_claims_after(&new_url, before, LED_AGAIN_MAX).await;
    let led = Instant::now();
    // Writes the old primary took after the promotion (to be rewound): read
    // once every replica that can has moved, and the split has lasted.
    tokio::time::sleep((promoted_at + SPLIT_HELD).saturating_duration_since(Instant::now())).await;
    let split = split(&old_url, &new_url, promoted_clock).await;
    let trial = Trial {
        fault: Fault::KillPatroniForGood,
        from_fault: led - started,
        from_healthy: led - promoted_at,
        split: Some(split),
    };
    Ok((trial, cluster))
}

/// Waits until the primary `url` reaches takes writes; its clock then (ms
/// since the epoch).
async fn writable(url: &str) -> i64 {
    on_primary(
        url,
        "SELECT (extract(epoch FROM clock_timestamp()) * 1000)::int8 WHERE NOT pg_is_in_recovery()",
        LED_AGAIN_MAX,
    )
    .await
}

/// Waits until a member other than `old` leads; its name.
async fn promoted(cluster: PatroniCluster, old: String) -> anyhow::Result<(PatroniCluster, String)> {
    tokio::task::spawn_blocking(move || {
        let deadline = Instant::now() + LED_AGAIN_MAX;
        loop {
            if let Some(new) = cluster.leader().filter(|l| l.name != old) {
                let new = new.name.clone();
                return Ok((cluster, new));
            }
            anyhow::ensure!(Instant::now() < deadline, "no member was promoted");
            std::thread::sleep(Duration::from_millis(100));
        }
    })
    .await?
}

/// The old primary's claims after the promotion (at `promoted_clock`, ms
/// since the epoch), and the longest a role was claimed on both servers.
async fn split(old_url: &str, new_url: &str, promoted_clock: i64) -> Split {
    let late = format!("at > to_timestamp({promoted_clock} / 1000.0)");
    let (multi_host, partitioned) = (
        format!("replica <> {PARTITIONED}"),
        format!("replica = {PARTITIONED}"),
    );
    let count = |who: &str| format!("SELECT count(*) FROM claims WHERE {late} AND {who}");
    Split {
        multi_host: on_primary(old_url, &count(&multi_host), LED_AGAIN_MAX).await,
        partitioned: on_primary(old_url, &count(&partitioned), LED_AGAIN_MAX).await,
        multi_host_overlap: overlap(old_url, new_url, &late, &multi_host).await,
        partitioned_overlap: overlap(old_url, new_url, &late, &partitioned).await,
    }
}

/// The longest a role's claims by the replicas `who` went on on the old
/// primary (after `late`) after its first claim on the promoted server.
async fn overlap(old_url: &str, new_url: &str, late: &str, who: &str) -> Duration {
    let mut most = 0;
    for role in ROLES {
        let at = |f: &str, who: &str| {
            format!(
                "SELECT coalesce((extract(epoch FROM {f}(at)) * 1000)::int8, 0) FROM claims \
                 WHERE {late} AND role = '{role}' AND {who}"
            )
        };
        let last_old = on_primary(old_url, &at("max", who), LED_AGAIN_MAX).await;
        let first_new = on_primary(new_url, &at("min", "true"), LED_AGAIN_MAX).await;
        if last_old > 0 && first_new > 0 {
            most = most.max(last_old - first_new);
        }
    }
    Duration::from_millis(most.max(0) as u64)
}

fn write(results: &Results, setups: &[Setup], timing: Timing, out: &Path) -> anyhow::Result<()> {
    std::fs::write(out.join("patroni.csv"), csv(results))?;
    std::fs::write(out.join("patroni.md"), markdown(results, setups, timing))?;
    Ok(())
}

fn csv(results: &Results) -> String {
    let mut csv = String::from(
        "replication,patroni_word,direct,round,fault,from_fault_s,from_healthy_s,\
         old_primary_claims_multi_host,old_primary_claims_partitioned,overlap_multi_host_s,overlap_partitioned_s,shared_terms,backwards_tokens\n",
    );
    for (setup, number, round) in &results.rounds {
        for t in &round.trials {
            let split = |f: fn(&Split) -> String| t.split.as_ref().map_or(String::new(), f);
            let _ = writeln!(
                csv,
                "{},{},{},{:.3},{:.3},{},{},{},{}",
                setup.label().replace(" | ", ","),
                number,
                t.fault.as_str().replace(',', ";"),
                t.from_fault.as_secs_f64(),
                t.from_healthy.as_secs_f64(),
                split(|s| s.multi_host.to_string()),
                split(|s| s.partitioned.to_string()),
                split(|s| format!(
                    "{:.3},{:.3}",
                    s.multi_host_overlap.as_secs_f64(),
                    s.partitioned_overlap.as_secs_f64()
                )),
                format_args!("{},{}", round.shared, round.backwards),
            );
        }
    }
    csv
}

fn markdown(results: &Results, setups: &[Setup], timing: Timing) -> String {
    let mut md = format!(
        "# Patroni failovers\n\n`ticklease-bench patroni --timing {}`: a three-member Patroni 3.0.2 + etcd 3.4 cluster \
         (PostgreSQL 15, Patroni TTL 20 s, loop_wait 1 s, retry_timeout 5 s; asynchronous, or `synchronous_mode: true`) \
         on one 2-core machine, three replicas leading three roles every 100 ms on the multi-host URL (with or without \
         Patroni's word: `PgStore::with_patroni` on every member's REST API), each tick a fenced claim on its term's \
         server, and a fourth replica reaching every member through proxies of its own. Per round, on a fresh \
         cluster, the four faults in this order; at the last, the fourth replica's proxies to the members other than \
         the old primary reset every connection (a one-sided partition). Seconds, p50 / p99 / max over the rounds \
         (raw: `patroni.csv`). \"Writable\" is Patroni's REST API showing one primary and two streaming replicas (and \
         a synchronous standby in synchronous mode), or, for the Patroni killed for good, another member answering \
         as primary, and then that primary's Postgres out of recovery (Patroni answers as the primary while a \
         restarted or promoted Postgres still replays: that time is Patroni's). The old primary's claims are those committed after the promoted server took writes, read {} s \
         after the promotion (the partition lasts that long); \"on two servers\" is the longest a role's claims went \
         on on the old primary after its first on the promoted server.\n\n\
         | replication | Patroni's word | direct URL | fault | n | fault → led again | writable → led again \
         | old primary's claims after the promotion (max): multi-host replicas / partitioned replica \
         | a role claimed on two servers at once (max s): multi-host / partitioned |\n\
         |---|---|---|---|---|---|---|---|---|\n",
        timing.as_str(),
        SPLIT_HELD.as_secs()
    );
    for &setup in setups {
        for fault in Fault::ALL {
            let _ = writeln!(md, "{}", row(results, setup, fault));
        }
    }
    notes(&mut md, results);
    md
}

/// A table row: `fault` in the rounds of `setup`.
fn row(results: &Results, setup: Setup, fault: Fault) -> String {
    let of: Vec<&Trial> = results
        .rounds
        .iter()
        .filter(|(s, _, _)| *s == setup)
        .flat_map(|(_, _, r)| &r.trials)
        .filter(|t| t.fault == fault)
        .collect();
    let secs = |f: &dyn Fn(&Trial) -> Option<Duration>| {
        let s: Vec<f64> = of.iter().filter_map(|t| f(t)).map(|d| d.as_secs_f64()).collect();
        summarize(&s).map_or("–".into(), |s| {
            format!("{:.2} / {:.2} / {:.2}", s.p50, s.p99, s.max)
        })
    };
    let most = |f: fn(&Split) -> i64| {
        of.iter()
            .filter_map(|t| t.split.as_ref().map(f))
            .max()
            .map_or("–".into(), |n| n.to_string())
    };
    let longest = |f: fn(&Split) -> Duration| {
        of.iter()
            .filter_map(|t| t.split.as_ref().map(|s| f(s).as_secs_f64()))
            .max_by(f64::total_cmp)
            .map_or("–".into(), |s| format!("{s:.2}"))
    };
    format!(
        "| {} | {} | {} | {} | {} | {} / {} | {} / {} |",
        setup.label(),
        fault.as_str(),
        of.len(),
        secs(&|t| Some(t.from_fault)),
        secs(&|t| Some(t.from_healthy)),
        most(|s| s.multi_host),
        most(|s| s.partitioned),
        longest(|s| s.multi_host_overlap),
        longest(|s| s.partitioned_overlap)
    )
}

/// What the claims on the promoted server broke, and the rounds that failed.
fn notes(md: &mut String, results: &Results) {
    let shared: i64 = results.rounds.iter().map(|(_, _, r)| r.shared).sum();
    let backwards: i64 = results.rounds.iter().map(|(_, _, r)| r.backwards).sum();
    let _ = writeln!(
        md,
        "\nOn the promoted server, over every round: {shared} terms claimed by two replicas, {backwards} claims \
         under a token below an earlier one's."
    );
    if !results.failures.is_empty() {
        let _ = writeln!(md, "\nRounds that failed (not in the table):\n");
        for f in &results.failures {
            let _ = writeln!(md, "- {}", f.replace('\n', " "));
        }
    }
}
