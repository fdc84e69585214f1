//! The failover benchmark: a drill leader and a follower, each on its own
//! link through a fault proxy; one fault per trial; the database's record
//! says how long the role went unclaimed and whether the terms overlapped.

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use tokio::io::BufReader;
use tokio::process::{Child, ChildStdout};
use tokio_postgres::types::Type;

use ticklease_sandbox::ClusterOptions;
use ticklease_testkit::{connect, signal, Fault, FaultProxy, PgBouncer, PgCluster};

use crate::drill::{self, Driver, LeaderLines};
use crate::stats::{summarize, Summary};
use crate::{Timing, HISTORY_SQL};

/// The fault a trial injects into the leader.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Scenario {
    /// SIGKILL: no RELEASE; the holder's sessions end with the process.
    Sigkill,
    /// The leader's TCP links blackholed (statements hang), healed after the takeover.
    Severed,
    /// SIGSTOP past the TTL, SIGCONT after the takeover: it must claim nothing on resume.
    Freeze,
    /// SIGTERM: a clean shutdown releases at once.
    Sigterm,
    /// `leader_pause` (the holder's work must end), then `leader_unpause` (the role must be led again).
    Pause,
}

impl Scenario {
    pub const ALL: [Scenario; 5] = [
        Scenario::Sigkill,
        Scenario::Sigterm,
        Scenario::Freeze,
        Scenario::Severed,
        Scenario::Pause,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Scenario::Sigkill => "sigkill",
            Scenario::Severed => "severed",
            Scenario::Freeze => "freeze",
            Scenario::Sigterm => "sigterm",
            Scenario::Pause => "pause",
        }
    }
}

/// How the drill processes reach Postgres.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Statements straight to Postgres, no coordination session: leases alone,
    /// as before issue 12 (no flag).
    Lease,
    /// Statements and the coordination session straight to Postgres (`--direct`).
    Direct,
    /// Statements through PgBouncer in transaction mode and no direct URL:
    /// leases alone, due-time waking (`--pooled`).
    Pooled,
    /// Statements through PgBouncer, the coordination session straight to
    /// Postgres: the two-URL configuration (`--pooled --direct`).
    PooledDirect,
}

impl Mode {
    pub fn from_flags(direct: bool, pooled: bool) -> Mode {
        match (direct, pooled) {
            (false, false) => Mode::Lease,
            (true, false) => Mode::Direct,
            (false, true) => Mode::Pooled,
            (true, true) => Mode::PooledDirect,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Lease => "lease",
            Mode::Direct => "direct",
            Mode::Pooled => "pooled",
            Mode::PooledDirect => "pooled-direct",
        }
    }

    /// The command-line flags that select this mode.
    pub fn flags(self) -> &'static str {
        match self {
            Mode::Lease => "",
            Mode::Direct => " --direct",
            Mode::Pooled => " --pooled",
            Mode::PooledDirect => " --pooled --direct",
        }
    }

    pub fn pooled(self) -> bool {
        matches!(self, Mode::Pooled | Mode::PooledDirect)
    }

    /// Whether the processes open a coordination session.
    pub fn coordinated(self) -> bool {
        matches!(self, Mode::Direct | Mode::PooledDirect)
    }
}

/// One trial's measurements, in milliseconds. Database timestamps and the
/// bench's own wall clock are compared: one host, one clock.
#[derive(Debug, Clone, PartialEq)]
pub struct Trial {
    pub mode: Mode,
    pub driver: Driver,
    pub scenario: Scenario,
    pub n: usize,
    /// The fault (for `pause`: the unpause) sent → the new term's first fenced claim.
    pub fault_to_claim_ms: f64,
    /// The old term's last acknowledged ACQUIRE/RENEW → the new term's first
    /// fenced claim; `None` for `pause`, where the role stood paused between.
    pub takeover_ms: Option<f64>,
    /// The old term's last statement (renew or fenced write) → the new term's
    /// first claim; negative would be an overlap.
    pub gap_ms: f64,
    /// Fenced writes of the old term committed after the new term's first
    /// write (for `pause`: after the pause).
    pub stale_writes: i64,
    /// For `pause`: `leader_pause` sent → the holder's work ended.
    pub pause_to_cancel_ms: Option<f64>,
    /// For freeze and severed: how the old leader's tick ended once it could run again.
    pub old_ended: Option<String>,
}

/// PgBouncer's server pool per database: two drill processes need little.
const BOUNCER_POOL: u32 = 4;

/// A cluster and database prepared for drills.
pub struct Env {
    pub cluster: PgCluster,
    pub db: String,
    pub timing: Timing,
    pub exe: PathBuf,
    pub write_every: Duration,
    pub mode: Mode,
    /// What loops over the drill leaders' role.
    pub driver: Driver,
    /// In front of `cluster` when the mode pools statements.
    pub bouncer: Option<PgBouncer>,
}

/// One drill process's network: the link its statements take (to Postgres,
/// or to PgBouncer when pooled) and, with a coordination session, its
/// direct link to Postgres. A cut severs both, as a host's network would.
pub struct Links {
    statements: FaultProxy,
    direct: Option<FaultProxy>,
}

impl Links {
    pub fn set(&self, fault: Fault) {
        self.statements.set(fault);
        if let Some(direct) = &self.direct {
            direct.set(fault);
        }
    }
}

impl Env {
    /// Starts a cluster of its own (with `pg_stat_statements`, for the idle
    /// count), and a PgBouncer in front of it when `mode` pools.
    pub async fn start(timing: Timing, exe: PathBuf, mode: Mode) -> anyhow::Result<Env> {
        let cluster = PgCluster::start_with(&ClusterOptions::default().with_pg_stat_statements())?;
        let mut env = Env::on(cluster, timing, exe).await?;
        env.mode = mode;
        if mode.pooled() {
            env.bouncer = Some(PgBouncer::start(&env.cluster, BOUNCER_POOL)?);
        }
        Ok(env)
    }

    /// A migrated, instrumented database on `cluster`, reached directly.
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
            mode: Mode::Lease,
            driver: Driver::Scheduler,
            bouncer: None,
        })
    }

    pub fn url_via(&self, proxy: &FaultProxy) -> String {
        self.url_at(proxy.port())
    }

    /// The database's URL at a local port (Postgres, PgBouncer or a proxy).
    pub fn url_at(&self, port: u16) -> String {
        format!("postgres://postgres@127.0.0.1:{port}/{}", self.db)
    }

    /// Where statements go: PgBouncer when pooled, else Postgres.
    pub fn statements_port(&self) -> u16 {
        self.bouncer.as_ref().map_or(self.cluster.port(), PgBouncer::port)
    }

    /// New links for one drill process.
    pub async fn links(&self) -> anyhow::Result<Links> {
        let local = |port: u16| SocketAddr::from(([127, 0, 0, 1], port));
        let direct = if self.mode.coordinated() {
            Some(FaultProxy::start(local(self.cluster.port())).await?)
        } else {
            None
        };
        Ok(Links {
            statements: FaultProxy::start(local(self.statements_port())).await?,
            direct,
        })
    }

    fn spawn_leader(&self, links: &Links, role: &str) -> anyhow::Result<(Child, LeaderLines)> {
        let direct = links.direct.as_ref().map(|p| self.url_via(p));
        drill::spawn_leader(
            &self.exe,
            &self.url_via(&links.statements),
            direct.as_deref(),
            role,
            self.timing,
            self.write_every,
            self.driver,
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

/// The instant at the end of an `ENDED <token> … <µs>` line.
fn ended_at(line: &str) -> anyhow::Result<SystemTime> {
    let micros: u64 = line
        .rsplit(' ')
        .next()
        .and_then(|us| us.parse().ok())
        .with_context(|| format!("no instant in {line:?}"))?;
    Ok(SystemTime::UNIX_EPOCH + Duration::from_micros(micros))
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
    let within = config.lease_ttl() * 3 + config.max_poll();
    let role = format!("drill_{}_{n}", scenario.as_str());
    let (leader_links, follower_links) = (env.links().await?, env.links().await?);
    let (mut leader, mut leader_out) = env.spawn_leader(&leader_links, &role)?;
    let old = next_leading(&mut leader_out, within).await?;
    let (mut follower, mut follower_out) = env.spawn_leader(&follower_links, &role)?;
    // A heartbeat in, at a random point of the follower's wait (else every
    // trial would hit the same phase of its poll and of the leader's beat).
    let phase = config.max_poll().mul_f64(rand::random::<f64>());
    tokio::time::sleep(config.heartbeat_every() + phase).await;

    let db = connect(&env.cluster.config(&env.db)).await?;
    let mut fault_at = SystemTime::now();
    let mut pause_to_cancel_ms = None;
    match scenario {
        Scenario::Sigkill => signal(&leader, Signal::SIGKILL),
        Scenario::Severed => leader_links.set(Fault::Blackhole),
        Scenario::Freeze => signal(&leader, Signal::SIGSTOP),
        Scenario::Sigterm => signal(&leader, Signal::SIGTERM),
        Scenario::Pause => {
            let (ended_ms, unpaused_at) =
                pause_and_unpause(&db, &role, &mut leader_out, old, config, within, fault_at).await?;
            pause_to_cancel_ms = Some(ended_ms);
            fault_at = unpaused_at;
        }
    }
    let new = if scenario == Scenario::Pause {
        tokio::select! {
            led = next_leading(&mut leader_out, within) => led?,
            led = next_leading(&mut follower_out, within) => led?,
        }
    } else {
        next_leading(&mut follower_out, within).await?
    };
    if new <= old {
        bail!("the new term's token {new} is not above {old}");
    }
    let old_ended = resume_old_leader(scenario, &leader, &leader_links, &mut leader_out, old, config).await?;
    let first_claim = first_claim(&db, &role, old, within).await?;
    signal(&leader, Signal::SIGKILL);
    signal(&follower, Signal::SIGKILL);
    let _ = leader.wait().await;
    let _ = follower.wait().await;

    let h = handover(&db, &role, old, scenario == Scenario::Pause).await?;
    Ok(Trial {
        mode: env.mode,
        driver: env.driver,
        scenario,
        n,
        fault_to_claim_ms: between(first_claim, fault_at),
        takeover_ms: (scenario != Scenario::Pause).then(|| between(first_claim, h.last_renew)),
        gap_ms: between(first_claim, h.last_statement),
        stale_writes: h.stale,
        pause_to_cancel_ms,
        old_ended,
    })
}

/// The pause scenario's fault: pauses the role (at `paused_at`), checks that the
/// leader's work ends as paused, then unpauses it at a random point of the
/// replicas' waits. Returns pause → work ended (ms) and the instant of the unpause.
async fn pause_and_unpause(
    db: &tokio_postgres::Client,
    role: &str,
    leader_out: &mut LeaderLines,
    old: i64,
    config: ticklease::Config,
    within: Duration,
    paused_at: SystemTime,
) -> anyhow::Result<(f64, SystemTime)> {
    db.execute_typed(
        "SELECT leader_pause($1, 'bench', 'drill')",
        &[(&role, Type::TEXT)],
    )
    .await?;
    let line = next_line(leader_out, within).await?;
    if !line.starts_with(&format!("ENDED {old} lost paused ")) {
        bail!("the paused holder's work did not end as paused: {line:?}");
    }
    let ended_ms = between(ended_at(&line)?, paused_at);
    // Both replicas are refused now; unpause at a random point of their waits.
    tokio::time::sleep(config.max_poll().mul_f64(rand::random::<f64>())).await;
    let unpaused_at = SystemTime::now();
    db.execute_typed("SELECT leader_unpause($1)", &[(&role, Type::TEXT)])
        .await?;
    Ok((ended_ms, unpaused_at))
}

/// Lets a frozen or cut-off old leader resume and try: it must claim nothing,
/// and its tick must end as lost (the work cancelled), not run on. Returns
/// that `ENDED` line (`None`: the scenario left no old leader to resume).
async fn resume_old_leader(
    scenario: Scenario,
    leader: &Child,
    leader_links: &Links,
    leader_out: &mut LeaderLines,
    old: i64,
    config: ticklease::Config,
) -> anyhow::Result<Option<String>> {
    if !matches!(scenario, Scenario::Freeze | Scenario::Severed) {
        return Ok(None);
    }
    if scenario == Scenario::Freeze {
        signal(leader, Signal::SIGCONT);
    } else {
        leader_links.set(Fault::Pass);
    }
    let line = next_line(leader_out, config.lease_ttl() * 2).await?;
    if !line.starts_with(&format!("ENDED {old} lost")) {
        bail!("the resumed old leader did not end its tick as lost: {line:?}");
    }
    Ok(Some(line))
}

/// The first fenced claim of a term after `old`, waited for: the new leader
/// writes it right after it reports leading.
async fn first_claim(
    db: &tokio_postgres::Client,
    role: &str,
    old: i64,
    within: Duration,
) -> anyhow::Result<SystemTime> {
    let deadline = tokio::time::Instant::now() + within;
    loop {
        let at: Option<SystemTime> = db
            .query_typed(
                "SELECT min(at) FROM drill_journal WHERE role = $1 AND token > $2",
                &[(&role, Type::TEXT), (&old, Type::INT8)],
            )
            .await?[0]
            .get(0);
        if let Some(at) = at {
            return Ok(at);
        }
        if tokio::time::Instant::now() > deadline {
            bail!("the new term wrote nothing within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// What the database recorded of the old term.
struct Handover {
    /// The old term's last acknowledged ACQUIRE/RENEW.
    last_renew: SystemTime,
    /// The old term's last statement (renew or write).
    last_statement: SystemTime,
    /// Writes of the old term after the new term's first claim, or after the pause.
    stale: i64,
}

async fn handover(
    db: &tokio_postgres::Client,
    role: &str,
    old: i64,
    paused: bool,
) -> anyhow::Result<Handover> {
    let one = |sql: &'static str| async move {
        let rows = db
            .query_typed(sql, &[(&role, Type::TEXT), (&old, Type::INT8)])
            .await?;
        Ok::<Option<SystemTime>, tokio_postgres::Error>(rows.first().and_then(|r| r.get(0)))
    };
    let last_renew = one(
        "SELECT max(at) FROM lease_history WHERE role = $1 AND new_token = $2 AND new_holder IS NOT NULL",
    )
    .await?
    .context("no acknowledged ACQUIRE/RENEW of the old term")?;
    let last_write = one("SELECT max(at) FROM drill_journal WHERE role = $1 AND token = $2").await?;
    let last_statement = last_write.map_or(last_renew, |w| w.max(last_renew));
    // The pause clears the holder: the old term's first row without one.
    let stale_after = if paused {
        "SELECT min(at) FROM lease_history WHERE role = $1 AND old_token = $2 AND new_holder IS NULL"
    } else {
        "SELECT min(at) FROM drill_journal WHERE role = $1 AND token > $2"
    };
    let stale: i64 = db
        .query_typed(
            &format!(
                "SELECT count(*) FROM drill_journal WHERE role = $1 AND token = $2 AND at > ({stale_after})"
            ),
            &[(&role, Type::TEXT), (&old, Type::INT8)],
        )
        .await?[0]
        .get(0);
    Ok(Handover {
        last_renew,
        last_statement,
        stale,
    })
}

/// One row of the results table: a measure over the trials of a scenario.
struct Row {
    label: &'static str,
    scenario: Scenario,
    /// The main measure: fault → first claim, or pause → work ended.
    main: fn(&Trial) -> Option<f64>,
    /// Whether the row shows takeover, gap and stale writes.
    handover: bool,
}

const ROWS: [Row; 6] = [
    Row {
        label: "sigkill",
        scenario: Scenario::Sigkill,
        main: |t| Some(t.fault_to_claim_ms),
        handover: true,
    },
    Row {
        label: "sigterm",
        scenario: Scenario::Sigterm,
        main: |t| Some(t.fault_to_claim_ms),
        handover: true,
    },
    Row {
        label: "freeze",
        scenario: Scenario::Freeze,
        main: |t| Some(t.fault_to_claim_ms),
        handover: true,
    },
    Row {
        label: "severed",
        scenario: Scenario::Severed,
        main: |t| Some(t.fault_to_claim_ms),
        handover: true,
    },
    Row {
        label: "pause → work ended",
        scenario: Scenario::Pause,
        main: |t| t.pause_to_cancel_ms,
        handover: false,
    },
    Row {
        label: "unpause",
        scenario: Scenario::Pause,
        main: |t| Some(t.fault_to_claim_ms),
        handover: false,
    },
];

/// Summaries of `measure` over the trials of `scenario`.
pub fn summary(
    trials: &[Trial],
    scenario: Scenario,
    measure: impl Fn(&Trial) -> Option<f64>,
) -> Option<Summary> {
    let samples: Vec<f64> = trials
        .iter()
        .filter(|t| t.scenario == scenario)
        .filter_map(measure)
        .collect();
    summarize(&samples)
}

/// The raw trials as CSV.
pub fn csv(trials: &[Trial]) -> String {
    let mut out = String::from(
        "mode,driver,scenario,trial,fault_to_claim_ms,takeover_ms,gap_ms,stale_writes,pause_to_cancel_ms\n",
    );
    let opt = |v: Option<f64>| v.map(|v| format!("{v:.1}")).unwrap_or_default();
    for t in trials {
        let _ = writeln!(
            out,
            "{},{},{},{},{:.1},{},{:.1},{},{}",
            t.mode.as_str(),
            t.driver.as_str(),
            t.scenario.as_str(),
            t.n,
            t.fault_to_claim_ms,
            opt(t.takeover_ms),
            t.gap_ms,
            t.stale_writes,
            opt(t.pause_to_cancel_ms),
        );
    }
    out
}

/// The results table in Markdown.
pub fn table(trials: &[Trial]) -> String {
    let mut out = String::from(
        "| scenario | trials | fault → first claim p50 | p99 | max | last renew → first claim p50 | p99 | max | gap min | stale writes |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
    );
    let ms = |v: f64| format!("{v:.0} ms");
    for row in &ROWS {
        let Some(main) = summary(trials, row.scenario, row.main) else {
            continue;
        };
        let (take, gap, stale) = if row.handover {
            let take = summary(trials, row.scenario, |t| t.takeover_ms)
                .map(|s| format!("{} | {} | {}", ms(s.p50), ms(s.p99), ms(s.max)));
            let gap = summary(trials, row.scenario, |t| Some(t.gap_ms)).map(|s| ms(s.min));
            (take, gap, true)
        } else {
            (None, None, row.label != "unpause")
        };
        let stale = if stale {
            let n: i64 = trials
                .iter()
                .filter(|t| t.scenario == row.scenario)
                .map(|t| t.stale_writes)
                .sum();
            n.to_string()
        } else {
            "—".into()
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} | {stale} |",
            row.label,
            main.n,
            ms(main.p50),
            ms(main.p99),
            ms(main.max),
            take.unwrap_or_else(|| "— | — | —".into()),
            gap.unwrap_or_else(|| "—".into()),
        );
    }
    out
}

/// The reports' file stem: `failover-<timing>-<mode>`, and `-<driver>` for
/// a driver other than the scheduler.
fn stem(timing: Timing, mode: Mode, driver: Driver) -> String {
    match driver {
        Driver::Scheduler => format!("failover-{}-{}", timing.as_str(), mode.as_str()),
        other => format!(
            "failover-{}-{}-{}",
            timing.as_str(),
            mode.as_str(),
            other.as_str()
        ),
    }
}

/// The driver of a run's trials (the scheduler when there are none).
fn driver_of(trials: &[Trial]) -> Driver {
    trials.first().map_or(Driver::Scheduler, |t| t.driver)
}

/// Writes `failover-<timing>-<mode>.csv` into `dir` and returns its path.
pub fn write_csv(dir: &Path, timing: Timing, mode: Mode, trials: &[Trial]) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}.csv", stem(timing, mode, driver_of(trials))));
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

/// Writes `failover-<timing>-<mode>.md`: the table, the machine, and how to rerun.
pub fn write_markdown(
    dir: &Path,
    timing: Timing,
    mode: Mode,
    trials: &[Trial],
    server_version: &str,
) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let driver = driver_of(trials);
    let stem = stem(timing, mode, driver);
    let path = dir.join(format!("{stem}.md"));
    let per = trials.iter().map(|t| t.n + 1).max().unwrap_or(0);
    let c = timing.config();
    let text = format!(
        "# Failover, {} timings, {} mode, driven by {} (generated)\n\n\
         TTL {:?}, heartbeat {:?}, statement timeout {:?}, abandon {:?}, max poll {:?}; {per} trials per scenario.\n\
         Machine: {}; PostgreSQL {server_version}; measured {}.\n\n\
         fault → first claim = the kill, signal or cut (for unpause: `leader_unpause`) sent → the new term's first\n\
         fenced claim; pause → work ended = `leader_pause` sent → the holder's work dropped;\n\
         last renew → first claim = the old term's last acknowledged ACQUIRE/RENEW → the new term's first claim;\n\
         gap = the old term's last statement → the new term's first claim (negative would be an overlap);\n\
         stale writes = fenced writes of the old term after the new term's first (after the pause for pause).\n\n\
         {}\nRaw trials: `{stem}.csv`. Rerun: `cargo run --release -p ticklease-bench -- failover --trials {per} --timing {}{} --driver {}`.\n",
        timing.as_str(),
        mode.as_str(),
        driver.describe(),
        c.lease_ttl(),
        c.heartbeat_every(),
        c.statement_timeout(),
        c.abandon_after(),
        c.max_poll(),
        machine(),
        humantime::format_rfc3339_seconds(SystemTime::now()),
        table(trials),
        timing.as_str(),
        mode.flags(),
        driver.as_str(),
    );
    std::fs::write(&path, text)?;
    Ok(path)
}
