//! Role families at scale (issue 13): N replica processes share one family
//! of K keys on one Postgres. Measured after a warm-up of two tick cycles:
//! statements per second (`pg_stat_statements` call deltas), ACQUIRE and
//! RENEW latency (timed in the replicas), missed heartbeats, lost terms
//! (`leader_history`), the spread of roles over replicas, Postgres CPU and
//! replica memory. Then some replicas are SIGKILLed and the takeover of
//! their terms is timed, and the same load runs once more with one role and
//! one job per key (today's path) as the baseline.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::str::FromStr;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use tokio::process::Child;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use ticklease::{HolderId, KEY_WAITERS_MAX, POOL_SIZE_MAX};
use ticklease_sandbox::ClusterOptions;
use ticklease_testkit::{connect, signal, PgCluster};

use crate::scale_replica::{self, Answer, Kind, ReplicaFlags, Sample, ScaleMode, FAMILY};
use crate::stats::{summarize, Summary};
use crate::Timing;

/// What to run.
#[derive(Debug, Clone)]
pub struct ScaleOptions {
    pub replicas: usize,
    pub keys: usize,
    pub over: Duration,
    /// Replicas SIGKILLed after the window (0: no kill phase).
    pub kill: usize,
    /// The per-role baseline's window (zero: no baseline).
    pub baseline_over: Duration,
    pub timing: Timing,
    /// Each family replica's pool.
    pub pool: usize,
    /// Each per-role replica's pool.
    pub baseline_pool: usize,
    pub exe: PathBuf,
}

/// The tick interval and the work that holds each term, for a timing: the
/// work takes most of the cycle, so terms are live most of the time.
pub fn cadence(timing: Timing) -> (Duration, Duration) {
    match timing {
        Timing::Default => (Duration::from_secs(10), Duration::from_secs(8)),
        Timing::Scaled | Timing::LongLease => (Duration::from_secs(1), Duration::from_millis(800)),
    }
}

/// The sandbox's `max_connections`, less room for the bench and the superuser reserve.
const CONNECTIONS_FOR_REPLICAS: usize = 380;

/// The largest per-role pool that fits `replicas` replicas in the sandbox's
/// connections: each also holds a coordination session and up to
/// `KEY_WAITERS_MAX` waiter connections.
pub fn baseline_pool(replicas: usize) -> usize {
    (CONNECTIONS_FOR_REPLICAS / replicas.max(1))
        .saturating_sub(1 + KEY_WAITERS_MAX)
        .clamp(1, POOL_SIZE_MAX)
}

/// Marks the bench's own queries, so the statement counts leave them out.
const MARKER: &str = "/* ticklease-bench scale */";

/// The bench's goal for ACQUIRE and RENEW p99 latency.
const P99_GOAL_MS: f64 = 20.0;

/// The spread goal: every replica within this fraction of K/N.
const SPREAD_TOLERANCE: f64 = 0.2;

/// A replica process.
struct Replica {
    child: Child,
    pid: u32,
    samples: PathBuf,
    log: PathBuf,
}

impl Replica {
    /// The last lines of its stderr, for an error message.
    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

/// The cluster and where the replicas keep their files.
struct Bench {
    cluster: PgCluster,
    options: ScaleOptions,
    config: ticklease::Config,
    interval: Duration,
    work: Duration,
    dir: tempfile::TempDir,
}

impl Bench {
    fn cycle(&self) -> Duration {
        self.interval + self.work
    }

    fn sample_every(&self) -> Duration {
        self.cycle() / 6
    }

    /// A migrated database with `pg_stat_statements`, and the bench's client on it.
    async fn database(&self) -> anyhow::Result<(String, Client)> {
        let db = self.cluster.create_database().await?;
        let mut client = connect(&self.cluster.config(&db)).await?;
        ticklease::migrate(&mut client).await?;
        client
            .batch_execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            .await?;
        Ok((db, client))
    }

    fn spawn(&self, db: &str, mode: ScaleMode, name: &str, pool: usize) -> anyhow::Result<Replica> {
        let url = self.cluster.url(db);
        let flags = ReplicaFlags {
            url: url.clone(),
            direct_url: url,
            mode,
            keys: self.options.keys,
            interval: self.interval,
            work: self.work,
            pool_size: pool,
            stats: self.dir.path().join(format!("{name}.samples")),
            timing: self.options.timing,
        };
        let log = self.dir.path().join(format!("{name}.log"));
        let child = tokio::process::Command::new(&self.options.exe)
            .arg("scale-replica")
            .args(flags.args())
            .env(
                "RUST_LOG",
                std::env::var("RUST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()
            .context("spawn a scale replica")?;
        let pid = child.id().context("a replica without a pid")?;
        Ok(Replica {
            child,
            pid,
            samples: flags.stats,
            log,
        })
    }

    /// `n` replicas of `mode`, started together, returned once each has its scheduler running.
    async fn start_replicas(
        &self,
        db: &str,
        mode: ScaleMode,
        n: usize,
        pool: usize,
    ) -> anyhow::Result<Vec<Replica>> {
        let mut replicas = (0..n)
            .map(|i| self.spawn(db, mode, &format!("{}-{i}", mode.as_str()), pool))
            .collect::<anyhow::Result<Vec<_>>>()?;
        let all: Vec<usize> = (0..n).collect();
        let deadline = Instant::now() + Duration::from_secs(120);
        while !replicas.iter().all(|r| r.samples.exists()) {
            check_alive(&mut replicas, &all)?;
            if Instant::now() > deadline {
                bail!("the {} replicas did not start within 2 minutes", mode.as_str());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(replicas)
    }
}

/// Fails when one of `which` exited.
fn check_alive(replicas: &mut [Replica], which: &[usize]) -> anyhow::Result<()> {
    for &i in which {
        if let Some(status) = replicas[i].child.try_wait()? {
            bail!(
                "replica {i} exited ({status}); its log:\n{}",
                replicas[i].log_tail()
            );
        }
    }
    Ok(())
}

/// SIGTERM, then SIGKILL for a replica that has not exited within `grace`.
async fn stop(replicas: &mut [Replica], grace: Duration) {
    for r in replicas.iter() {
        signal(&r.child, Signal::SIGTERM);
    }
    for r in replicas.iter_mut() {
        if tokio::time::timeout(grace, r.child.wait()).await.is_err() {
            let _ = r.child.kill().await;
        }
    }
}

/// One sample of who owns which roles.
#[derive(Debug, Clone)]
pub struct SpreadSample {
    /// Seconds into the window.
    pub at_s: f64,
    /// Roles owned, per replica of the phase (by index).
    pub owned: Vec<usize>,
    /// Roles owned by no replica counted in the phase (never ticked, or a killed replica's).
    pub unowned: usize,
}

/// Spread over a window: the fewest and most roles any counted replica owned.
#[derive(Debug, Clone, Copy)]
pub struct Spread {
    pub fair: f64,
    pub min: usize,
    pub max: usize,
    pub unowned_max: usize,
    pub samples: usize,
}

impl Spread {
    fn of(samples: &[SpreadSample], counted: &[usize], keys: usize) -> Option<Spread> {
        let fair = keys as f64 / counted.len().max(1) as f64;
        let counts = || samples.iter().flat_map(|s| counted.iter().map(|&i| s.owned[i]));
        Some(Spread {
            fair,
            min: counts().min()?,
            max: counts().max()?,
            unowned_max: samples.iter().map(|s| s.unowned).max()?,
            samples: samples.len(),
        })
    }

    pub fn within(&self, tolerance: f64) -> bool {
        self.min as f64 >= self.fair * (1.0 - tolerance) && self.max as f64 <= self.fair * (1.0 + tolerance)
    }

    fn describe(&self) -> String {
        format!(
            "min {} / max {} (K/N {:.1}: {:+.0} % / {:+.0} %), unowned ≤ {}, {} samples",
            self.min,
            self.max,
            self.fair,
            (self.min as f64 / self.fair - 1.0) * 100.0,
            (self.max as f64 / self.fair - 1.0) * 100.0,
            self.unowned_max,
            self.samples
        )
    }
}

/// What one window measured.
#[derive(Debug, Clone)]
pub struct Window {
    pub phase: &'static str,
    pub from: SystemTime,
    pub to: SystemTime,
    /// Calls per normalized statement over the window (the bench's own left out), most first.
    pub statements: Vec<(String, i64)>,
    /// Postgres (postmaster and children) CPU as a % of one core.
    pub pg_cpu_pct: f64,
    /// The counted replicas' CPU together, as a % of one core.
    pub replica_cpu_pct: f64,
    /// Every process of the machine (this bench's and anyone else's), as a %
    /// of one core: what else loaded the machine during the window.
    pub machine_cpu_pct: f64,
    /// Largest VmRSS seen, per counted replica (kB).
    pub rss_max_kb: Vec<u64>,
    pub spread_samples: Vec<SpreadSample>,
    pub spread: Option<Spread>,
    /// `leader_history` terms lost in the window, by reason.
    pub lost_terms: Vec<(String, i64)>,
    /// Replica indexes the window counted.
    pub counted: Vec<usize>,
}

impl Window {
    pub fn seconds(&self) -> f64 {
        self.to
            .duration_since(self.from)
            .unwrap_or_default()
            .as_secs_f64()
    }

    pub fn statements_per_s(&self) -> f64 {
        self.statements.iter().map(|(_, n)| n).sum::<i64>() as f64 / self.seconds()
    }

    pub fn lease_statements_per_s(&self) -> f64 {
        self.statements
            .iter()
            .filter(|(q, _)| is_lease_statement(q))
            .map(|(_, n)| n)
            .sum::<i64>() as f64
            / self.seconds()
    }

    pub fn lost(&self) -> i64 {
        self.lost_terms.iter().map(|(_, n)| n).sum()
    }

    fn ms_range(&self) -> (u64, u64) {
        (epoch_ms(self.from), epoch_ms(self.to))
    }
}

/// ACQUIRE/RENEW/RELEASE and the registry beat, called by the library.
fn is_lease_statement(query: &str) -> bool {
    [
        "leader_acquire",
        "leader_renew",
        "leader_release",
        "leader_replica_",
    ]
    .iter()
    .any(|f| query.contains(f))
}

fn epoch_ms(t: SystemTime) -> u64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn epoch_s(t: SystemTime) -> f64 {
    t.duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64())
}

/// Calls so far per normalized statement of the bench's database.
async fn statement_calls(db: &Client) -> anyhow::Result<HashMap<String, i64>> {
    let sql = format!(
        "SELECT {MARKER} query, sum(calls)::bigint FROM pg_stat_statements
          WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
          GROUP BY query"
    );
    Ok(db
        .query(&sql, &[])
        .await?
        .iter()
        .map(|r| (r.get::<_, String>(0), r.get::<_, i64>(1)))
        .filter(|(q, _)| !q.contains(MARKER))
        .collect())
}

/// Who owns each role now: the live term's holder, else the last tick's.
async fn owners(db: &Client) -> anyhow::Result<Vec<(Option<String>, i64)>> {
    let sql = format!(
        "SELECT {MARKER} CASE WHEN held THEN holder_id ELSE last_tick_holder END, count(*)::bigint
           FROM leader_status WHERE role LIKE '{FAMILY}:%' GROUP BY 1"
    );
    Ok(db
        .query(&sql, &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// The replica (by index) whose process wrote `holder`.
fn replica_of(holder: &str, replicas: &[Replica]) -> Option<usize> {
    let pid = HolderId::from_str(holder).ok()?.pid();
    replicas.iter().position(|r| r.pid == pid)
}

async fn spread_sample(
    db: &Client,
    replicas: &[Replica],
    counted: &[usize],
    at_s: f64,
) -> anyhow::Result<SpreadSample> {
    let mut sample = SpreadSample {
        at_s,
        owned: vec![0; replicas.len()],
        unowned: 0,
    };
    for (holder, n) in owners(db).await? {
        match holder.and_then(|h| replica_of(&h, replicas)) {
            Some(i) if counted.contains(&i) => sample.owned[i] += n as usize,
            _ => sample.unowned += n as usize,
        }
    }
    Ok(sample)
}

async fn lost_terms(db: &Client, from: SystemTime, to: SystemTime) -> anyhow::Result<Vec<(String, i64)>> {
    let sql = format!(
        "SELECT {MARKER} coalesce(reason, '-'), count(*)::bigint FROM leader_history
          WHERE kind = 'term' AND outcome = 'lost' AND at >= to_timestamp($1) AND at < to_timestamp($2)
          GROUP BY 1 ORDER BY 2 DESC"
    );
    Ok(db
        .query_typed(
            &sql,
            &[(&epoch_s(from), Type::FLOAT8), (&epoch_s(to), Type::FLOAT8)],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect())
}

/// `/proc/<pid>/stat`: (own utime + stime, reaped children's, parent pid), in clock ticks.
fn proc_times(pid: u32) -> Option<(u64, u64, u32)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may hold spaces: the fields start after its closing parenthesis.
    let fields: Vec<&str> = stat[stat.rfind(')')? + 2..].split(' ').collect();
    let n = |i: usize| fields.get(i)?.parse::<u64>().ok();
    Some((n(11)? + n(12)?, n(13)? + n(14)?, n(1)? as u32))
}

/// CPU ticks of the postmaster and every process it started, including those that exited.
fn postgres_ticks(postmaster: u32) -> u64 {
    let (own, reaped, _) = proc_times(postmaster).unwrap_or_default();
    let children: u64 = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter_map(proc_times_of_child(postmaster))
        .sum();
    own + reaped + children
}

fn proc_times_of_child(parent: u32) -> impl Fn(u32) -> Option<u64> {
    move |pid| {
        let (own, reaped, ppid) = proc_times(pid)?;
        (ppid == parent).then_some(own + reaped)
    }
}

fn replica_ticks(replicas: &[Replica], which: &[usize]) -> u64 {
    which
        .iter()
        .filter_map(|&i| proc_times(replicas[i].pid))
        .map(|(own, _, _)| own)
        .sum()
}

/// Busy (not idle, not waiting for I/O) clock ticks of all CPUs, from `/proc/stat`.
fn machine_ticks() -> u64 {
    let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let Some(cpu) = stat.lines().next().and_then(|l| l.strip_prefix("cpu ")) else {
        return 0;
    };
    let n: Vec<u64> = cpu.split_whitespace().filter_map(|f| f.parse().ok()).collect();
    // user nice system idle iowait irq softirq steal (guest time is inside user).
    n.iter().take(8).sum::<u64>() - n.get(3).unwrap_or(&0) - n.get(4).unwrap_or(&0)
}

fn ticks_per_second() -> f64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .map_or(100.0, |t| t as f64)
}

/// VmRSS of `pid` in kB.
fn rss_kb(pid: u32) -> Option<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .trim()
        .trim_end_matches("kB")
        .trim()
        .parse()
        .ok()
}

/// Measures `over` with the replicas `counted` (the others are dead or ignored).
async fn measure(
    bench: &Bench,
    db: &Client,
    replicas: &mut [Replica],
    counted: &[usize],
    phase: &'static str,
    over: Duration,
) -> anyhow::Result<Window> {
    let postmaster = bench
        .cluster
        .postmaster_pid()
        .context("the postmaster is not running")?
        .as_raw() as u32;
    let calls_before = statement_calls(db).await?;
    let pg_before = postgres_ticks(postmaster);
    let replicas_before = replica_ticks(replicas, counted);
    let machine_before = machine_ticks();
    let from = SystemTime::now();
    let started = Instant::now();
    let mut spread_samples = Vec::new();
    let mut rss_max_kb = vec![0; replicas.len()];
    loop {
        check_alive(replicas, counted)?;
        let at_s = started.elapsed().as_secs_f64();
        spread_samples.push(spread_sample(db, replicas, counted, at_s).await?);
        for &i in counted {
            rss_max_kb[i] = rss_max_kb[i].max(rss_kb(replicas[i].pid).unwrap_or(0));
        }
        let left = over.saturating_sub(started.elapsed());
        if left.is_zero() {
            break;
        }
        tokio::time::sleep(left.min(bench.sample_every())).await;
    }
    let pg_after = postgres_ticks(postmaster);
    let replicas_after = replica_ticks(replicas, counted);
    let machine_after = machine_ticks();
    let to = SystemTime::now();
    let seconds = started.elapsed().as_secs_f64();
    let calls_after = statement_calls(db).await?;
    let mut statements: Vec<(String, i64)> = calls_after
        .into_iter()
        .map(|(q, n)| {
            let before = calls_before.get(&q).copied().unwrap_or(0);
            (q, n - before)
        })
        .filter(|(_, n)| *n > 0)
        .collect();
    statements.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    let cpu = |ticks: u64| ticks as f64 / ticks_per_second() / seconds * 100.0;
    let spread = Spread::of(&spread_samples, counted, bench.options.keys);
    Ok(Window {
        phase,
        from,
        to,
        statements,
        pg_cpu_pct: cpu(pg_after.saturating_sub(pg_before)),
        replica_cpu_pct: cpu(replicas_after.saturating_sub(replicas_before)),
        machine_cpu_pct: cpu(machine_after.saturating_sub(machine_before)),
        rss_max_kb: counted.iter().map(|&i| rss_max_kb[i]).collect(),
        spread_samples,
        spread,
        lost_terms: lost_terms(db, from, to).await?,
        counted: counted.to_vec(),
    })
}

/// The takeover of the killed replicas' terms.
#[derive(Debug, Clone)]
pub struct Takeover {
    pub killed: usize,
    /// Per term live on a killed replica at the kill: (role, kill → first later term's start, ms).
    pub taken_ms: Vec<(String, f64)>,
    /// Terms that had no later term by the deadline.
    pub not_taken: Vec<String>,
    /// Terms seen live before the kill that their replica released before it.
    pub released_before_kill: usize,
    /// The survivors one cycle after the takeover.
    pub after: Window,
}

/// SIGKILLs the first `kill` replicas and times the takeover of their terms.
async fn kill_and_take_over(
    bench: &Bench,
    db: &Client,
    replicas: &mut [Replica],
    kill: usize,
) -> anyhow::Result<Takeover> {
    let survivors: Vec<usize> = (kill..replicas.len()).collect();
    let (killed_at, terms) = kill_replicas(db, replicas, kill).await?;
    wait_for_takeover(bench, db, &terms).await?;
    let (taken_ms, not_taken, released_before_kill) = takeover_times(db, &terms, killed_at).await?;
    // One more cycle for the survivors to settle, then one cycle of samples.
    tokio::time::sleep(bench.cycle()).await;
    Ok(Takeover {
        killed: kill,
        taken_ms,
        not_taken,
        released_before_kill,
        after: measure(bench, db, replicas, &survivors, "after-kill", bench.cycle()).await?,
    })
}

/// The terms live on the killed replicas at the kill: their roles and tokens, side by side.
struct KilledTerms {
    roles: Vec<String>,
    tokens: Vec<i64>,
}

/// SIGKILLs the first `kill` replicas and waits for them to exit; returns the
/// instant of the kill and the terms that were live on them just before it.
async fn kill_replicas(
    db: &Client,
    replicas: &mut [Replica],
    kill: usize,
) -> anyhow::Result<(SystemTime, KilledTerms)> {
    let victims: Vec<usize> = (0..kill).collect();
    let sql = format!(
        "SELECT {MARKER} role, holder_token, holder_id FROM leader_status WHERE held AND role LIKE '{FAMILY}:%'"
    );
    let held = db.query(&sql, &[]).await?;
    let killed_at = SystemTime::now();
    for &i in &victims {
        signal(&replicas[i].child, Signal::SIGKILL);
    }
    let (mut roles, mut tokens) = (Vec::<String>::new(), Vec::<i64>::new());
    for row in &held {
        let holder: String = row.get(2);
        if replica_of(&holder, replicas).is_some_and(|i| victims.contains(&i)) {
            roles.push(row.get(0));
            tokens.push(row.get(1));
        }
    }
    for &i in &victims {
        let _ = replicas[i].child.wait().await;
    }
    Ok((killed_at, KilledTerms { roles, tokens }))
}

/// Polls until every killed term has a later one, or the deadline (two TTLs
/// and a cycle, plus slack) passes.
async fn wait_for_takeover(bench: &Bench, db: &Client, terms: &KilledTerms) -> anyhow::Result<()> {
    // A later token on the row: a survivor started a term (a killed process starts none).
    let pending_sql = format!(
        "SELECT {MARKER} count(*)::bigint FROM unnest($1::text[], $2::int8[]) AS v(role, token)
           JOIN leader_leases AS l USING (role) WHERE l.holder_token <= v.token"
    );
    let deadline = Instant::now() + bench.config.lease_ttl() * 2 + bench.cycle() + Duration::from_secs(10);
    loop {
        let pending: i64 = db
            .query_typed(
                &pending_sql,
                &[
                    (&terms.roles, Type::TEXT_ARRAY),
                    (&terms.tokens, Type::INT8_ARRAY),
                ],
            )
            .await?[0]
            .get(0);
        if pending == 0 || Instant::now() > deadline {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Each killed term's takeover (kill → the first later term's start, ms), the
/// terms not taken over, and the count of those released just before the kill.
async fn takeover_times(
    db: &Client,
    terms: &KilledTerms,
    killed_at: SystemTime,
) -> anyhow::Result<(Vec<(String, f64)>, Vec<String>, usize)> {
    // The first later term's start, from the history (ended terms) or the row
    // (a live one); a term whose own history says it ended otherwise than
    // lost was released just before the kill, and is left out.
    let times_sql = format!(
        "SELECT {MARKER} v.role,
                (SELECT h.outcome FROM leader_history AS h
                  WHERE h.role = v.role AND h.kind = 'term' AND h.token = v.token),
                extract(epoch FROM least(
                    (SELECT min(h.acquired_at) FROM leader_history AS h
                      WHERE h.role = v.role AND h.kind = 'term' AND h.token > v.token),
                    (SELECT l.acquired_at FROM leader_leases AS l
                      WHERE l.role = v.role AND l.holder_token > v.token)))::float8
           FROM unnest($1::text[], $2::int8[]) AS v(role, token)"
    );
    let rows = db
        .query_typed(
            &times_sql,
            &[
                (&terms.roles, Type::TEXT_ARRAY),
                (&terms.tokens, Type::INT8_ARRAY),
            ],
        )
        .await?;
    let (mut taken_ms, mut not_taken, mut released_before_kill) = (Vec::new(), Vec::new(), 0);
    for row in rows {
        let role: String = row.get(0);
        let outcome: Option<String> = row.get(1);
        let started: Option<f64> = row.get(2);
        match (outcome.as_deref(), started) {
            (Some(o), _) if o != "lost" => released_before_kill += 1,
            (_, Some(at)) => taken_ms.push((role, (at - epoch_s(killed_at)) * 1e3)),
            (_, None) => not_taken.push(role),
        }
    }
    Ok((taken_ms, not_taken, released_before_kill))
}

/// Latency of one kind of statement in a window.
#[derive(Debug, Clone)]
pub struct Latency {
    pub kind: Kind,
    pub calls: usize,
    /// Roles per call on average.
    pub roles_per_call: f64,
    pub summary: Option<Summary>,
    pub timeouts: usize,
    pub errors: usize,
    /// Roles whose beat a failed call carried (RENEW: missed heartbeats).
    pub roles_failed: u64,
    /// RENEW answers that said the term was over, by reason.
    pub lost_answers: BTreeMap<String, u64>,
    /// ACQUIRE: the calls by how many terms each started ([`STARTED_GROUPS`]): calls, latency.
    pub by_started: Vec<(usize, Option<Summary>)>,
    pub latencies_ms: Vec<f64>,
}

/// ACQUIRE calls grouped by the terms each started (a batch's cost grows with
/// the terms it starts): the label and the range.
pub const STARTED_GROUPS: [(&str, std::ops::RangeInclusive<u32>); 3] =
    [("0", 0..=0), ("1–9", 1..=9), ("≥ 10", 10..=u32::MAX)];

fn latency(samples: &[Sample], kind: Kind, (from, to): (u64, u64)) -> Latency {
    let window: Vec<&Sample> = samples
        .iter()
        .filter(|s| s.kind == kind && s.at_ms >= from && s.at_ms < to)
        .collect();
    let latencies_ms: Vec<f64> = window.iter().map(|s| s.latency_ms).collect();
    let failed = || window.iter().filter(|s| s.answer != Answer::Ok);
    Latency {
        kind,
        calls: window.len(),
        roles_per_call: window.iter().map(|s| s.roles as f64).sum::<f64>() / window.len().max(1) as f64,
        summary: summarize(&latencies_ms),
        timeouts: window.iter().filter(|s| s.answer == Answer::Timeout).count(),
        errors: window.iter().filter(|s| s.answer == Answer::Error).count(),
        roles_failed: failed().map(|s| u64::from(s.roles)).sum(),
        lost_answers: window
            .iter()
            .flat_map(|s| &s.answered.lost)
            .fold(BTreeMap::new(), |mut by, reason| {
                *by.entry(reason.clone()).or_default() += 1;
                by
            }),
        by_started: STARTED_GROUPS
            .iter()
            .map(|(_, range)| {
                let ms: Vec<f64> = window
                    .iter()
                    .filter(|s| range.contains(&s.answered.started))
                    .map(|s| s.latency_ms)
                    .collect();
                (ms.len(), summarize(&ms))
            })
            .collect(),
        latencies_ms,
    }
}

/// A window and the latencies its replicas recorded in it.
#[derive(Debug, Clone)]
pub struct Phase {
    pub mode: ScaleMode,
    pub window: Window,
    pub latencies: Vec<Latency>,
    pub pool: usize,
    /// WARN/ERROR lines the phase's replicas logged (whole run).
    pub replica_warnings: usize,
}

impl Phase {
    pub fn latency(&self, kind: Kind) -> &Latency {
        self.latencies
            .iter()
            .find(|l| l.kind == kind)
            .expect("every kind is measured")
    }

    /// RENEW calls that failed or timed out.
    pub fn missed_heartbeats(&self) -> usize {
        let renew = self.latency(Kind::Renew);
        renew.timeouts + renew.errors
    }
}

fn phase(mode: ScaleMode, window: Window, samples: &[Sample], pool: usize, replica_warnings: usize) -> Phase {
    let range = window.ms_range();
    Phase {
        mode,
        latencies: Kind::ALL
            .into_iter()
            .map(|k| latency(samples, k, range))
            .collect(),
        window,
        pool,
        replica_warnings,
    }
}

/// Every sample the replicas wrote, and their WARN/ERROR log lines.
fn collect(replicas: &[Replica]) -> anyhow::Result<(Vec<Sample>, usize)> {
    let mut samples = Vec::new();
    let mut warnings = 0;
    for r in replicas {
        samples.extend(scale_replica::read_samples(&r.samples)?);
        warnings += std::fs::read_to_string(&r.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.contains(" WARN ") || l.contains(" ERROR "))
            .count();
    }
    Ok((samples, warnings))
}

/// The whole run's figures.
#[derive(Debug, Clone)]
pub struct Report {
    pub options: ScaleOptions,
    pub config: ticklease::Config,
    pub interval: Duration,
    pub work: Duration,
    pub family: Phase,
    pub takeover: Option<(Takeover, Phase)>,
    pub baseline: Option<Phase>,
    pub server_version: String,
    /// The commit checked out when the run began (build the binary from it).
    pub commit: Option<String>,
    pub took: Duration,
}

/// Runs the family phase, the kill, and the baseline.
pub async fn run(options: ScaleOptions) -> anyhow::Result<Report> {
    let begun = Instant::now();
    let commit = git_head();
    if options.kill >= options.replicas {
        bail!(
            "--kill {} leaves no survivor of {} replicas",
            options.kill,
            options.replicas
        );
    }
    let (interval, work) = cadence(options.timing);
    let bench = Bench {
        cluster: PgCluster::start_with(&ClusterOptions::default().with_pg_stat_statements())?,
        config: options.timing.config(),
        options: options.clone(),
        interval,
        work,
        dir: tempfile::Builder::new().prefix("ticklease-scale-").tempdir()?,
    };
    let (db, client) = bench.database().await?;
    let server_version: String = client.query_one("SHOW server_version", &[]).await?.get(0);
    let (family, takeover) = family_phase(&bench, &db, &client).await?;
    let baseline = if options.baseline_over.is_zero() {
        None
    } else {
        Some(baseline_phase(&bench).await?)
    };
    Ok(Report {
        config: bench.config,
        interval,
        work,
        family,
        takeover,
        baseline,
        server_version,
        commit,
        options,
        took: begun.elapsed(),
    })
}

/// The family replicas on `db`: warm-up, the measured window, then the kill
/// of some and the survivors' window after it, if `--kill` asks for one.
async fn family_phase(
    bench: &Bench,
    db: &str,
    client: &Client,
) -> anyhow::Result<(Phase, Option<(Takeover, Phase)>)> {
    let options = &bench.options;
    let n = options.replicas;
    let all: Vec<usize> = (0..n).collect();
    eprintln!(
        "family: {n} replicas × {} keys; warm-up {:?}, then {:?}",
        options.keys,
        bench.cycle() * 2,
        options.over
    );
    let mut replicas = bench
        .start_replicas(db, ScaleMode::Family, n, options.pool)
        .await?;
    tokio::time::sleep(bench.cycle() * 2).await;
    let window = measure(bench, client, &mut replicas, &all, "family", options.over).await?;
    let takeover = if options.kill > 0 {
        eprintln!("killing {} replicas", options.kill);
        Some(kill_and_take_over(bench, client, &mut replicas, options.kill).await?)
    } else {
        None
    };
    stop(&mut replicas, bench.config.lease_ttl()).await;
    let (samples, warnings) = collect(&replicas)?;
    let family = phase(ScaleMode::Family, window, &samples, options.pool, warnings);
    let takeover = takeover.map(|t| {
        let after = phase(
            ScaleMode::Family,
            t.after.clone(),
            &samples,
            options.pool,
            warnings,
        );
        (t, after)
    });
    Ok((family, takeover))
}

/// The per-role baseline: the same replicas and keys, one role per key, on a
/// database of its own, measured after its own warm-up.
async fn baseline_phase(bench: &Bench) -> anyhow::Result<Phase> {
    let options = &bench.options;
    let n = options.replicas;
    let all: Vec<usize> = (0..n).collect();
    let (db, client) = bench.database().await?;
    eprintln!(
        "baseline (per-role, pool {}): warm-up {:?}, then {:?}",
        options.baseline_pool,
        bench.cycle() * 2,
        options.baseline_over
    );
    let mut replicas = bench
        .start_replicas(&db, ScaleMode::PerRole, n, options.baseline_pool)
        .await?;
    tokio::time::sleep(bench.cycle() * 2).await;
    let window = measure(
        bench,
        &client,
        &mut replicas,
        &all,
        "per-role",
        options.baseline_over,
    )
    .await?;
    stop(&mut replicas, bench.config.lease_ttl()).await;
    let (samples, warnings) = collect(&replicas)?;
    Ok(phase(
        ScaleMode::PerRole,
        window,
        &samples,
        options.baseline_pool,
        warnings,
    ))
}

/// One goal and whether the run met it.
#[derive(Debug, Clone)]
pub struct Goal {
    pub what: String,
    pub measured: String,
    pub met: bool,
}

impl Report {
    /// The bound on a killed replica's term being led again: the direct URL
    /// ends its sessions at once, so well under a second, plus one wake-up:
    /// a survivor that does not prefer the key waits a third of a heartbeat
    /// before taking it.
    pub fn takeover_goal(&self) -> Duration {
        Duration::from_secs(1) + self.config.heartbeat_every() / 3
    }

    pub fn goals(&self) -> Vec<Goal> {
        let mut goals = Vec::new();
        let f = &self.family;
        for kind in [Kind::Acquire, Kind::Renew] {
            let l = f.latency(kind);
            goals.push(Goal {
                what: format!("{} p99 ≤ {P99_GOAL_MS} ms (family)", kind.as_str().to_uppercase()),
                measured: l
                    .summary
                    .map_or("no calls".into(), |s| format!("{:.1} ms", s.p99)),
                met: l.summary.is_some_and(|s| s.p99 <= P99_GOAL_MS),
            });
        }
        goals.push(Goal {
            what: "missed heartbeats = 0 (family)".into(),
            measured: f.missed_heartbeats().to_string(),
            met: f.missed_heartbeats() == 0,
        });
        goals.push(Goal {
            what: "lost terms = 0 (family)".into(),
            measured: f.window.lost().to_string(),
            met: f.window.lost() == 0,
        });
        goals.push(spread_goal("family", f.window.spread));
        if let Some((t, after)) = &self.takeover {
            let max = t.taken_ms.iter().map(|(_, ms)| *ms).fold(f64::NAN, f64::max);
            goals.push(Goal {
                what: format!(
                    "takeover of the killed replicas' terms ≤ {} ms, none left",
                    self.takeover_goal().as_millis()
                ),
                measured: format!(
                    "max {max:.0} ms over {} terms, {} not taken",
                    t.taken_ms.len(),
                    t.not_taken.len()
                ),
                met: t.not_taken.is_empty() && max <= self.takeover_goal().as_secs_f64() * 1e3,
            });
            goals.push(spread_goal("survivors after the kill", after.window.spread));
        }
        goals
    }

    /// What `--assert` demands: no lost term and the spread within ±20 %.
    pub fn assert_ok(&self) -> bool {
        self.family.window.lost() == 0
            && self
                .family
                .window
                .spread
                .is_some_and(|s| s.within(SPREAD_TOLERANCE))
    }

    pub fn command(&self) -> String {
        let o = &self.options;
        let mut c = format!(
            "ticklease-bench scale --replicas {} --keys {} --over {} --kill {} --baseline-over {} --timing {}",
            o.replicas,
            o.keys,
            humantime::format_duration(o.over),
            o.kill,
            humantime::format_duration(o.baseline_over),
            o.timing.as_str()
        );
        if o.pool != DEFAULT_POOL {
            let _ = write!(c, " --pool {}", o.pool);
        }
        if o.baseline_pool != baseline_pool(o.replicas) {
            let _ = write!(c, " --baseline-pool {}", o.baseline_pool);
        }
        c
    }

    /// The figures as a markdown table (also what the command prints).
    pub fn table(&self) -> String {
        let mut phases: Vec<(&str, &Phase)> = vec![("family", &self.family)];
        if let Some((_, after)) = &self.takeover {
            phases.push(("family, survivors after the kill", after));
        }
        if let Some(b) = &self.baseline {
            phases.push(("per-role baseline", b));
        }
        let mut t = PhaseTable::new(phases);
        load_rows(&mut t);
        latency_rows(&mut t);
        health_rows(&mut t);
        resource_rows(&mut t);
        t.text
    }

    /// Takeover and the baseline ratio, as lines.
    pub fn takeover_and_ratio(&self) -> String {
        let mut s = String::new();
        if let Some((t, _)) = &self.takeover {
            let ms: Vec<f64> = t.taken_ms.iter().map(|(_, ms)| *ms).collect();
            match summarize(&ms) {
                Some(x) => {
                    let _ = writeln!(
                        s,
                        "takeover after SIGKILL of {} replicas: {} terms, kill → first later term p50 {:.0} ms, p99 {:.0} ms, max {:.0} ms; {} not taken; {} released just before the kill (left out)",
                        t.killed, x.n, x.p50, x.p99, x.max, t.not_taken.len(), t.released_before_kill
                    );
                }
                None => {
                    let _ = writeln!(
                        s,
                        "takeover after SIGKILL of {} replicas: no term of theirs was live at the kill ({} not taken)",
                        t.killed,
                        t.not_taken.len()
                    );
                }
            }
        }
        if let Some(b) = &self.baseline {
            let f = &self.family.window;
            let _ = writeln!(
                s,
                "baseline / family statements/s: {:.1}× (all), {:.1}× (lease statements)",
                b.window.statements_per_s() / f.statements_per_s(),
                b.window.lease_statements_per_s() / f.lease_statements_per_s()
            );
        }
        s
    }
}

/// A markdown table with a column per phase, written a row (one figure) at a time.
struct PhaseTable<'a> {
    phases: Vec<(&'a str, &'a Phase)>,
    text: String,
}

impl<'a> PhaseTable<'a> {
    /// The header row: the phases' names.
    fn new(phases: Vec<(&'a str, &'a Phase)>) -> Self {
        let mut text = String::from("| figure |");
        for (name, _) in &phases {
            let _ = write!(text, " {name} |");
        }
        text.push_str("\n|---|");
        text.push_str(&"---|".repeat(phases.len()));
        text.push('\n');
        PhaseTable { phases, text }
    }

    /// One figure's row: its name, then `cell` of each phase.
    fn row(&mut self, figure: &str, cell: &dyn Fn(&Phase) -> String) {
        let _ = write!(self.text, "| {figure} |");
        for (_, p) in &self.phases {
            let _ = write!(self.text, " {} |", cell(p));
        }
        self.text.push('\n');
    }
}

/// The rows of what ran and the statements it sent.
fn load_rows(t: &mut PhaseTable) {
    t.row("replicas × pool", &|p| {
        format!("{} × {}", p.window.counted.len(), p.pool)
    });
    t.row("window", &|p| format!("{:.0} s", p.window.seconds()));
    t.row("statements/s (all)", &|p| {
        format!("{:.1}", p.window.statements_per_s())
    });
    t.row("lease statements/s", &|p| {
        format!("{:.1}", p.window.lease_statements_per_s())
    });
}

/// The rows of each statement kind's latency and calls, and ACQUIRE's by terms started.
fn latency_rows(t: &mut PhaseTable) {
    for kind in Kind::ALL {
        t.row(
            &format!("{} p50 / p99 / max (ms)", kind.as_str().to_uppercase()),
            &|p| match p.latency(kind).summary {
                Some(s) => format!("{:.1} / {:.1} / {:.1}", s.p50, s.p99, s.max),
                None => "–".into(),
            },
        );
        t.row(
            &format!("{} calls (roles per call)", kind.as_str().to_uppercase()),
            &|p| {
                let l = p.latency(kind);
                match l.calls {
                    0 => "0".into(),
                    n => format!("{n} ({:.1})", l.roles_per_call),
                }
            },
        );
    }
    let groups: Vec<&str> = STARTED_GROUPS.iter().map(|(label, _)| *label).collect();
    t.row(
        &format!("ACQUIRE p99 (calls) by terms started: {}", groups.join(" / ")),
        &|p| {
            let cells: Vec<String> = p
                .latency(Kind::Acquire)
                .by_started
                .iter()
                .map(|(calls, s)| match s {
                    Some(s) => format!("{:.1} ({calls})", s.p99),
                    None => "–".into(),
                })
                .collect();
            cells.join(" / ")
        },
    );
}

/// The rows of what went wrong: missed heartbeats, terms over and lost, and the spread.
fn health_rows(t: &mut PhaseTable) {
    t.row("missed heartbeats: RENEW timeouts + errors (roles)", &|p| {
        let r = p.latency(Kind::Renew);
        format!("{} + {} ({})", r.timeouts, r.errors, r.roles_failed)
    });
    t.row("RENEW answers: term over", &|p| {
        let by = &p.latency(Kind::Renew).lost_answers;
        if by.is_empty() {
            return "0".into();
        }
        let each: Vec<String> = by.iter().map(|(r, n)| format!("{n} {r}")).collect();
        format!("{} ({})", by.values().sum::<u64>(), each.join(", "))
    });
    t.row("lost terms (leader_history)", &|p| {
        if p.window.lost_terms.is_empty() {
            "0".into()
        } else {
            let by: Vec<String> = p
                .window
                .lost_terms
                .iter()
                .map(|(r, n)| format!("{n} {r}"))
                .collect();
            format!("{} ({})", p.window.lost(), by.join(", "))
        }
    });
    t.row("spread: roles per replica", &|p| {
        p.window.spread.map_or("–".into(), |s| s.describe())
    });
}

/// The rows of CPU, memory and the replicas' log warnings.
fn resource_rows(t: &mut PhaseTable) {
    t.row("Postgres CPU (% of one core)", &|p| {
        format!("{:.0} %", p.window.pg_cpu_pct)
    });
    t.row("replicas' CPU together (% of one core)", &|p| {
        format!("{:.0} %", p.window.replica_cpu_pct)
    });
    t.row("whole machine CPU busy (% of one core, of 200 %)", &|p| {
        format!("{:.0} %", p.window.machine_cpu_pct)
    });
    t.row("replica RSS max (MB)", &|p| {
        let max = p.window.rss_max_kb.iter().max().copied().unwrap_or(0);
        format!("{:.1}", max as f64 / 1024.0)
    });
    t.row("replica WARN/ERROR log lines (whole phase)", &|p| {
        p.replica_warnings.to_string()
    });
}

/// The family replicas' pool unless `--pool` says otherwise.
pub const DEFAULT_POOL: usize = 8;

fn spread_goal(what: &str, spread: Option<Spread>) -> Goal {
    Goal {
        what: format!("spread within ±{:.0} % of K/N ({what})", SPREAD_TOLERANCE * 100.0),
        measured: spread.map_or("no samples".into(), |s| s.describe()),
        met: spread.is_some_and(|s| s.within(SPREAD_TOLERANCE)),
    }
}

/// The file name stem: `scale` for the default timing, `scale-<timing>` otherwise.
fn stem(timing: Timing) -> String {
    match timing {
        Timing::Default => "scale".into(),
        other => format!("scale-{}", other.as_str()),
    }
}

/// Writes the markdown report and the CSVs into `dir`; returns their paths.
pub fn write_reports(dir: &Path, report: &Report) -> anyhow::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let stem = stem(report.options.timing);
    let mut phases: Vec<&Phase> = vec![&report.family];
    if let Some((_, after)) = &report.takeover {
        phases.push(after);
    }
    phases.extend(&report.baseline);
    let mut written = Vec::new();

    let mut latency = String::from("phase,statement,upper_ms,count,cumulative\n");
    for p in &phases {
        for l in &p.latencies {
            for (upper, count, cumulative) in histogram(&l.latencies_ms) {
                let _ = writeln!(
                    latency,
                    "{},{},{upper:.3},{count},{cumulative:.5}",
                    p.window.phase,
                    l.kind.as_str()
                );
            }
        }
    }
    written.push(write(dir, &format!("{stem}-latency.csv"), &latency)?);

    let mut spread = String::from("phase,t_s,replica,owned\n");
    for p in &phases {
        for s in &p.window.spread_samples {
            for &i in &p.window.counted {
                let _ = writeln!(spread, "{},{:.1},{i},{}", p.window.phase, s.at_s, s.owned[i]);
            }
            let _ = writeln!(spread, "{},{:.1},none,{}", p.window.phase, s.at_s, s.unowned);
        }
    }
    written.push(write(dir, &format!("{stem}-spread.csv"), &spread)?);

    let mut statements = String::from("phase,window_s,calls,statement\n");
    for p in &phases {
        for (query, calls) in &p.window.statements {
            let query = query
                .split_whitespace()
                .collect::<Vec<_>>()
                .join(" ")
                .replace('"', "\"\"");
            let _ = writeln!(
                statements,
                "{},{:.1},{calls},\"{query}\"",
                p.window.phase,
                p.window.seconds()
            );
        }
    }
    written.push(write(dir, &format!("{stem}-statements.csv"), &statements)?);

    if let Some((t, _)) = &report.takeover {
        let mut csv = String::from("role,kill_to_term_ms\n");
        for (role, ms) in &t.taken_ms {
            let _ = writeln!(csv, "{role},{ms:.1}");
        }
        for role in &t.not_taken {
            let _ = writeln!(csv, "{role},");
        }
        written.push(write(dir, &format!("{stem}-takeover.csv"), &csv)?);
    }

    written.insert(0, write(dir, &format!("{stem}.md"), &markdown(report))?);
    Ok(written)
}

fn write(dir: &Path, name: &str, text: &str) -> anyhow::Result<PathBuf> {
    let path = dir.join(name);
    std::fs::write(&path, text)?;
    Ok(path)
}

/// Buckets of 10 % width from 0.1 ms: (upper edge, count, cumulative fraction), non-empty only.
fn histogram(latencies_ms: &[f64]) -> Vec<(f64, usize, f64)> {
    let mut buckets: BTreeMap<i32, usize> = BTreeMap::new();
    for &ms in latencies_ms {
        let i = if ms <= 0.1 {
            0
        } else {
            (ms / 0.1).log(1.1).ceil() as i32
        };
        *buckets.entry(i).or_default() += 1;
    }
    let mut seen = 0;
    buckets
        .into_iter()
        .map(|(i, count)| {
            seen += count;
            (
                0.1 * 1.1f64.powi(i),
                count,
                seen as f64 / latencies_ms.len() as f64,
            )
        })
        .collect()
}

/// The machine: cores, CPU model, memory.
fn machine() -> String {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let model = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_else(|| "unknown CPU".into());
    let mem_kb: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    format!(
        "{} cores ({model}), {:.0} GB RAM",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        mem_kb as f64 / 1024.0 / 1024.0
    )
}

/// The commit checked out where the bench runs.
fn git_head() -> Option<String> {
    let out = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The markdown report: how the run was set up, the goals, the figures, and what each figure is.
fn markdown(r: &Report) -> String {
    let o = &r.options;
    let mut md = String::new();
    let _ = writeln!(md, "# Role families at scale ({} timing)\n", o.timing.as_str());
    let _ = writeln!(md, "```sh\n{}\n```\n", r.command());
    md.push_str(&setup_markdown(r));
    md.push_str("## Goals\n\n| goal | measured | met |\n|---|---|---|\n");
    for g in r.goals() {
        let _ = writeln!(
            md,
            "| {} | {} | {} |",
            g.what,
            g.measured,
            if g.met { "yes" } else { "**no**" }
        );
    }
    md.push_str("\n## Figures\n\n");
    md.push_str(&r.table());
    md.push('\n');
    md.push_str(&r.takeover_and_ratio());
    md.push_str(FIGURES_EXPLAINED);
    md
}

/// The report's bullets on the machine, the load, the timings and the phases.
fn setup_markdown(r: &Report) -> String {
    let o = &r.options;
    let c = &r.config;
    let mut md = String::new();
    let _ = writeln!(
        md,
        "- Machine: {}; PostgreSQL {} (sandbox: `fsync=off`, `synchronous_commit=off`, `max_connections=400`), \
         release build{}; the run took {}.",
        machine(),
        r.server_version,
        r.commit.as_ref().map_or(String::new(), |h| format!(" of {h}")),
        humantime::format_duration(Duration::from_secs(r.took.as_secs()))
    );
    let _ = writeln!(
        md,
        "- {} replica processes share one family `{FAMILY}` of {} keys (one role row `{FAMILY}:<key>` each), \
         tick interval {:?}, each tick holding its term for {:?} of work. Lease TTL {:?}, heartbeat {:?}, \
         statement timeout {:?}, abandon {:?}, poll {:?}. Statements and the coordination session go straight \
         to Postgres (the direct URL given), as superuser, all on this one host with the bench.",
        o.replicas,
        o.keys,
        r.interval,
        r.work,
        c.lease_ttl(),
        c.heartbeat_every(),
        c.statement_timeout(),
        c.abandon_after(),
        c.max_poll()
    );
    let _ = write!(
        md,
        "- Measured over {} after a warm-up of two cycles ({:?})",
        humantime::format_duration(o.over),
        (r.interval + r.work) * 2
    );
    if o.kill > 0 {
        let _ = write!(
            md,
            "; then {} of the replicas SIGKILLed, and the survivors measured for one cycle after a cycle's wait",
            o.kill
        );
    }
    if !o.baseline_over.is_zero() {
        let _ = write!(
            md,
            "; then the baseline: the same replicas and keys with one declared role and one scheduler job \
             per key (today's path, pool {}), {} after its own warm-up",
            o.baseline_pool,
            humantime::format_duration(o.baseline_over)
        );
    }
    md.push_str(".\n\n");
    md
}

/// The report's last section: how each figure of the table is measured.
const FIGURES_EXPLAINED: &str = "
## What each figure is

- **statements/s**: calls counted by `pg_stat_statements` (top-level statements of the bench's database)
  between the start and the end of the window, divided by its length; the bench's own queries are left
  out. *Lease statements* are the ACQUIRE, RENEW and RELEASE statements (one-row or batched) and the
  replica-registry beat; the rest are the coordination session's and the key waiters' statements.
  `-statements.csv` has the calls per statement.
- **ACQUIRE / RENEW / RELEASE / BEAT latency**: timed in each replica around the store call (a wrapper
  of `LeaseStore` over `PgStore`), so it includes waiting for a pooled connection; one sample per call,
  one-row or batched alike (roles per call says which). `-latency.csv` has the distribution in 10 %
  buckets. ACQUIRE is also split by how many terms each call started: a batched ACQUIRE runs the
  one-row ACQUIRE for each term it starts, and only reads the others.
- **missed heartbeats**: RENEW calls that timed out or failed (the roles they carried in brackets).
- **RENEW answers: term over**: terms a RENEW found already over, by the reason the library read
  (`released`: the term's own RELEASE had committed first, so nothing was lost; `taken_over`, `paused`).
- **lost terms**: rows of `leader_history` with `kind = 'term'` and `outcome = 'lost'` whose end falls in
  the window, by reason (`expired`/`holder_gone`: taken over without a RELEASE; the others from RELEASE).
  After the kill the killed replicas' terms are lost by design (`holder_gone`).
- **spread**: every sample (each sixth of a cycle) counts, per replica, the roles it owns: the holder of
  the live term, else the holder of the last completed tick (`leader_status`). Min and max are over every
  replica and every sample of the window; K/N is keys over (surviving) replicas; *unowned* are roles owned
  by no counted replica (never ticked yet, or last ticked by a killed one). `-spread.csv` has every sample.
- **takeover**: for each term live on a killed replica just before the SIGKILL, the start
  (`acquired_at`, database clock, one host) of the role's next term less the instant of the kill.
  `-takeover.csv` has every term.
- **Postgres CPU**: utime + stime of the postmaster and every process it started (those that exited
  included), from `/proc/<pid>/stat`, over the window, as a % of one core (the machine has two).
- **whole machine CPU**: busy time of both cores from `/proc/stat` over the window (Postgres, the
  replicas, the bench, and anything else that ran on the machine meanwhile), as a % of one core.
- **replica RSS**: the largest `VmRSS` seen in any replica during the window.
";
