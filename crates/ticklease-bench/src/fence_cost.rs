//! What the fence costs a claim (issue 22, "The fence's cost"): pgbench with
//! custom scripts, autocommit, against a throwaway cluster of the test kit
//! with a 100k-row `jobs` table and one long-lived term of role `billing`.
//!
//! Two claim shapes, each unfenced, with the spec's lock-free STABLE fence
//! (unsound: the baseline only) and with the real fence; optionally with
//! candidate fences (`--candidate name=file.sql`), each applied with
//! `CREATE OR REPLACE` in a database of its own, so the migrated functions
//! of the other databases stay as they are. Every cell runs `runs` times for
//! `secs` each; the cells of one round run in an order rotated every round,
//! so a drift of the (shared) machine's load spreads over every variant.
//!
//! The kit's clusters run with `max_prepared_transactions=8` (on its command
//! line, which `ALTER SYSTEM` cannot override); for the setting 0 the bench
//! stops the kit's postmaster and starts one of its own on the same data
//! directory and port with that setting, and stops it at the end.
//!
//! Beside throughput and latency, each run records what explains them
//! (issue 43, item 1): WAL bytes and multixacts per transaction, from the
//! server's counters before and after the run, and the lock waits seen by
//! sampling `pg_locks` while it runs. The counters are cluster-wide: the
//! bench runs alone on a cluster of its own, so what they count is the run's
//! (and the autovacuum its writes bring on, a cost of the claims as well).

use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::time::MissedTickBehavior;
use tokio_postgres::Client;
use tokio_util::sync::CancellationToken;

use ticklease_testkit::{connect, PgCluster};

use crate::plot::{Panel, Strip};
use crate::stats::summarize;

/// Rows of the claim table.
pub const ROWS: i64 = 100_000;
/// Rows per batch claim.
pub const BATCH: i64 = 50;
/// The role of the bench's term.
pub const ROLE: &str = "billing";

/// A claim statement's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Shape {
    /// `UPDATE jobs SET claimed_by = :token WHERE id = :random_id AND <fence>`.
    One,
    /// A 50-row `FOR UPDATE SKIP LOCKED` batch claim.
    Batch,
}

impl Shape {
    pub fn as_str(self) -> &'static str {
        match self {
            Shape::One => "one-row",
            Shape::Batch => "batch-50",
        }
    }

    /// The pgbench script with `fence` as the fence predicate. The batch
    /// claim alternates each client's mark between 0 and 1 and claims rows
    /// whose mark differs, so it never runs dry and does the same work for
    /// every variant (the same lowest ids, re-claimed).
    fn script(self, fence: &str) -> String {
        match self {
            Shape::One => format!(
                "\\set random_id random(1, {ROWS})\n\
                 UPDATE jobs SET claimed_by = :token WHERE id = :random_id AND {fence};\n"
            ),
            Shape::Batch => format!(
                "\\set mark 1 - :mark\n\
                 UPDATE jobs SET claimed_by = :mark WHERE id IN (SELECT id FROM jobs \
                 WHERE claimed_by IS DISTINCT FROM :mark ORDER BY id LIMIT {BATCH} FOR UPDATE SKIP LOCKED) \
                 AND {fence};\n"
            ),
        }
    }
}

/// What guards a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Variant {
    /// No fence.
    Unfenced,
    /// The spec's lock-free STABLE fence (unsound; the baseline).
    LockFree,
    /// `(SELECT leader_fence_v2(role, token))` as migrated: the fence at one
    /// row lock (generation 7).
    Fence,
    /// `(SELECT leader_fence(role, token))` as migrated: generation 6's
    /// fence with its commit check, kept for older clients.
    FenceGen6,
    /// `(SELECT leader_fence(role, token))` after this SQL (`@schema@` = the schema).
    Candidate { name: String, sql: PathBuf },
}

impl Variant {
    pub fn name(&self) -> &str {
        match self {
            Variant::Unfenced => "unfenced",
            Variant::LockFree => "lock-free",
            Variant::Fence => "fence",
            Variant::FenceGen6 => "fence-gen6",
            Variant::Candidate { name, .. } => name,
        }
    }

    fn predicate(&self) -> &'static str {
        match self {
            Variant::Unfenced => "true",
            Variant::LockFree => "(SELECT bench_lockfree_fence(:role, :token))",
            Variant::Fence => "(SELECT leader_fence_v2(:role, :token))",
            Variant::FenceGen6 | Variant::Candidate { .. } => "(SELECT leader_fence(:role, :token))",
        }
    }
}

/// Parses `name=path` for `--candidate`.
pub fn parse_candidate(s: &str) -> Result<Variant, String> {
    let (name, sql) = s.split_once('=').ok_or("expected name=file.sql")?;
    if name.is_empty() || ["unfenced", "lock-free", "fence", "fence-gen6"].contains(&name) {
        return Err(format!("{name:?}: pick another name"));
    }
    Ok(Variant::Candidate {
        name: name.to_string(),
        sql: PathBuf::from(sql),
    })
}

#[derive(Debug, Clone)]
pub struct FenceOptions {
    pub runs: usize,
    pub secs: u64,
    pub clients: Vec<u32>,
    pub shapes: Vec<Shape>,
    /// `max_prepared_transactions` settings, in order (8 is the kit's).
    pub prepared: Vec<u32>,
    pub candidates: Vec<Variant>,
    /// pgbench's `-M`: `extended` (unnamed statements, as the library's
    /// `query_typed`), `prepared` or `simple`.
    pub protocol: String,
}

/// One pgbench run.
#[derive(Debug, Clone)]
pub struct Run {
    pub prepared: u32,
    pub shape: Shape,
    pub clients: u32,
    pub variant: String,
    pub round: usize,
    pub tps: f64,
    pub transactions: u64,
    pub failed: u64,
    pub latency_ms: f64,
    /// Each transaction's latency (pgbench's per-transaction log): p50 / p99 / max, ms.
    pub latency: Option<crate::stats::Summary>,
    pub load_before: f64,
    pub load_after: f64,
    pub per_transaction: PerTransaction,
    pub lock_waits: LockWaits,
}

/// The CSV's columns; those after `loadavg_after` came with issue 43.
const CSV_HEADER: &str = "max_prepared_transactions,claim,clients,variant,round,seconds,tps,transactions,failed,latency_ms,\
     latency_p50_ms,latency_p99_ms,latency_max_ms,loadavg_before,loadavg_after,\
     wal_bytes_per_tx,multixacts_per_tx,multixact_members_per_tx,lock_samples,lock_waiting_mean,lock_wait_share\n";

impl Run {
    /// The run as a CSV row of [`CSV_HEADER`]'s columns (no newline).
    fn csv_row(&self, secs: u64) -> String {
        let latency = self
            .latency
            .as_ref()
            .map(|l| format!("{:.3},{:.3},{:.3}", l.p50, l.p99, l.max))
            .unwrap_or_else(|| ",,".into());
        let (cost, waits) = (&self.per_transaction, &self.lock_waits);
        format!(
            "{},{},{},{},{},{secs},{:.1},{},{},{:.3},{latency},{:.2},{:.2},{:.1},{:.4},{:.4},{},{:.4},{:.4}",
            self.prepared,
            self.shape.as_str(),
            self.clients,
            self.variant,
            self.round,
            self.tps,
            self.transactions,
            self.failed,
            self.latency_ms,
            self.load_before,
            self.load_after,
            cost.wal_bytes,
            cost.multixacts,
            cost.multixact_members,
            waits.samples,
            waits.mean_waiting(),
            waits.share_with_wait(),
        )
    }
}

/// The server's counters that a run moves, read after a CHECKPOINT.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Counters {
    /// `pg_stat_wal.wal_bytes`.
    pub wal_bytes: u64,
    /// `pg_control_checkpoint()`'s `next_multixact_id`: multixacts created.
    pub next_multixact: u32,
    /// `pg_control_checkpoint()`'s `next_multi_offset`: member slots used.
    pub next_multi_offset: u32,
}

/// A run's cost per transaction, from its [`Counters`] before and after.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PerTransaction {
    pub wal_bytes: f64,
    pub multixacts: f64,
    pub multixact_members: f64,
}

impl PerTransaction {
    /// The counters' growth over `transactions` (NaN for none). Multixact ids
    /// and member offsets are 32-bit and wrap around, so their deltas do too.
    pub fn between(before: Counters, after: Counters, transactions: u64) -> PerTransaction {
        let per = |delta: f64| {
            if transactions == 0 {
                f64::NAN
            } else {
                delta / transactions as f64
            }
        };
        PerTransaction {
            wal_bytes: per(after.wal_bytes.saturating_sub(before.wal_bytes) as f64),
            multixacts: per(after.next_multixact.wrapping_sub(before.next_multixact) as f64),
            multixact_members: per(after.next_multi_offset.wrapping_sub(before.next_multi_offset) as f64),
        }
    }
}

/// Lock waits seen by sampling `pg_locks` during a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LockWaits {
    pub samples: u64,
    /// Waiting backends, summed over the samples.
    pub waiting: u64,
    /// Samples in which at least one backend waited.
    pub with_wait: u64,
}

impl LockWaits {
    fn add(&mut self, waiting: u64) {
        self.samples += 1;
        self.waiting += waiting;
        self.with_wait += u64::from(waiting > 0);
    }

    /// The mean number of waiting backends (NaN without samples).
    pub fn mean_waiting(&self) -> f64 {
        self.waiting as f64 / self.samples as f64
    }

    /// The share of samples with any wait, 0 to 1 (NaN without samples).
    pub fn share_with_wait(&self) -> f64 {
        self.with_wait as f64 / self.samples as f64
    }
}

/// How often the sampler reads `pg_locks`: often enough to see waits of a
/// few ms, seldom enough that its statement (about 0.1 ms) costs the run ~1 %.
const SAMPLE_EVERY: Duration = Duration::from_millis(10);

/// The backends of this database waiting for a lock, in one statement.
/// From `pg_stat_activity`'s wait events, not `pg_locks`: reading `pg_locks`
/// takes every lock-table partition's lock and every backend's fast-path
/// lock, so sampling it 100 times a second stalled the fences' advisory
/// locks and charged the fence for the bench's own instrument. A row lock's
/// wait shows as wait event `transactionid` (or `tuple`) of type `Lock`.
const WAITING_SQL: &str = "SELECT count(*) FROM pg_stat_activity \
     WHERE wait_event_type = 'Lock' AND datname = current_database()";

/// Samples the lock waits every [`SAMPLE_EVERY`] until `stop` is cancelled.
async fn sample_lock_waits(client: &Client, stop: &CancellationToken) -> anyhow::Result<LockWaits> {
    let statement = client
        .prepare(WAITING_SQL)
        .await
        .context("prepare the lock sampler")?;
    let mut tick = tokio::time::interval(SAMPLE_EVERY);
    // A slow sample delays the next ones rather than bunching them up.
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut waits = LockWaits::default();
    loop {
        tokio::select! {
            _ = stop.cancelled() => return Ok(waits),
            _ = tick.tick() => {}
        }
        let waiting: i64 = client
            .query_one(&statement, &[])
            .await
            .context("sample pg_locks")?
            .get(0);
        waits.add(waiting.max(0) as u64);
    }
}

impl Counters {
    async fn read(client: &Client) -> anyhow::Result<Counters> {
        let row = client
            .query_one(
                "SELECT (SELECT wal_bytes FROM pg_stat_wal)::bigint,
                        c.next_multixact_id::text::bigint, c.next_multi_offset::text::bigint
                   FROM pg_control_checkpoint() AS c",
                &[],
            )
            .await
            .context("read pg_stat_wal and pg_control_checkpoint()")?;
        let u32_at = |i: usize| u32::try_from(row.get::<_, i64>(i)).context("a 32-bit counter");
        Ok(Counters {
            wal_bytes: u64::try_from(row.get::<_, i64>(0))?,
            next_multixact: u32_at(1)?,
            next_multi_offset: u32_at(2)?,
        })
    }
}

/// The bench's databases: one per fence definition.
struct Db {
    name: String,
    token: i64,
}

/// The 1-minute load average.
fn loadavg() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(f64::NAN)
}

/// A migrated database with the claim table, the lock-free fence, the
/// candidate's SQL if any, and a 24 h term of `billing`; returns its token.
async fn setup(cluster: &PgCluster, candidate: Option<&Path>) -> anyhow::Result<Db> {
    let name = cluster.create_database().await?;
    let mut client = connect(&cluster.config(&name)).await?;
    ticklease::migrate(&mut client).await?;
    client
        .batch_execute(&format!(
            "CREATE TABLE jobs (id bigint PRIMARY KEY, claimed_by bigint, payload text NOT NULL DEFAULT 'job');
             INSERT INTO jobs (id) SELECT g FROM generate_series(1, {ROWS}) AS g;
             CREATE FUNCTION bench_lockfree_fence(p_role text, p_token bigint) RETURNS boolean
             LANGUAGE sql STABLE AS $$
                 SELECT EXISTS (SELECT 1 FROM leader_leases WHERE role = p_role AND holder_token = p_token
                                   AND paused_at IS NULL AND expires_at > clock_timestamp())
             $$;"
        ))
        .await?;
    client.batch_execute("VACUUM ANALYZE jobs").await?;
    if let Some(sql) = candidate {
        let text = std::fs::read_to_string(sql).with_context(|| format!("read {}", sql.display()))?;
        let schema: String = client.query_one("SELECT current_schema()", &[]).await?.get(0);
        client
            .batch_execute(&text.replace("@schema@", &schema))
            .await
            .with_context(|| format!("apply {}", sql.display()))?;
    }
    let token: i64 = client
        .query_one(
            "SELECT holder_token FROM leader_acquire($1, 'bench', 86400000, 1, NULL)",
            &[&ROLE],
        )
        .await?
        .get(0);
    Ok(Db { name, token })
}

/// The same state before every run: claims reset, dead rows gone, a checkpoint.
async fn reset(client: &Client) -> anyhow::Result<()> {
    client
        .batch_execute("UPDATE jobs SET claimed_by = NULL WHERE claimed_by IS NOT NULL")
        .await?;
    client.batch_execute("VACUUM jobs").await?;
    client.batch_execute("VACUUM leader_fence_claims").await?;
    client.batch_execute("CHECKPOINT").await?;
    // A backend reports its WAL to pg_stat_wal at most once a second (or when
    // idle 10 s): forced now, before it next goes idle, so the reset's own WAL
    // is counted before the run, not in it.
    client.batch_execute("SELECT pg_stat_force_next_flush()").await?;
    Ok(())
}

/// After a run: waits until its backends have gone (each reports its last WAL
/// to pg_stat_wal as it exits), then a checkpoint, so that the next
/// multixact id and member offset in pg_control are current.
async fn settle(client: &Client) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        let others: i64 = client
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND backend_type = 'client backend'
                    AND pid <> pg_backend_pid()",
                &[],
            )
            .await?
            .get(0);
        if others == 0 {
            break;
        }
        anyhow::ensure!(
            started.elapsed() < Duration::from_secs(10),
            "{others} backends of the run still connected after 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    client
        .batch_execute("CHECKPOINT")
        .await
        .context("checkpoint after the run")
}

/// Fails when a run's claims matched no row: a fence whose term is not
/// current is cheap (nothing is written) and would pass for a fast one.
async fn claimed_some(client: &Client, variant: &str) -> anyhow::Result<()> {
    let claimed: i64 = client
        .query_one("SELECT count(*) FROM jobs WHERE claimed_by IS NOT NULL", &[])
        .await?
        .get(0);
    anyhow::ensure!(
        claimed > 0,
        "{variant}: no claim matched a row (is the bench's term of {ROLE} still current?)"
    );
    Ok(())
}

/// A postmaster of the bench's own on the kit cluster's data directory.
struct OwnPostmaster {
    child: Child,
}

impl OwnPostmaster {
    /// Stops the kit's postmaster and starts one with `max_prepared_transactions`
    /// at `prepared`, otherwise the kit's settings, on the same port.
    async fn start(cluster: &PgCluster, prepared: u32) -> anyhow::Result<OwnPostmaster> {
        // A clean shutdown (a checkpoint): the kit runs with synchronous_commit
        // off, so an immediate one loses the setup's last commits still in the
        // WAL buffers (the claim table, the term) and the runs find no table,
        // or claim nothing behind a fence whose term is gone.
        cluster.stop_fast();
        let bindir = ticklease_testkit::cluster::bindir()?;
        let data = cluster.data_dir();
        let owner = std::fs::metadata(&data)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(cluster.root_dir().join("bench-postmaster.log"))?;
        let mut cmd = Command::new(bindir.join("postgres"));
        cmd.arg("-D")
            .arg(&data)
            .args(["-p", &cluster.port().to_string(), "-k"])
            .arg(cluster.socket_dir());
        for setting in [
            "listen_addresses=127.0.0.1".to_string(),
            "fsync=off".into(),
            "synchronous_commit=off".into(),
            "full_page_writes=off".into(),
            "max_connections=400".into(),
            "shared_buffers=64MB".into(),
            format!("max_prepared_transactions={prepared}"),
            "log_min_messages=warning".into(),
        ] {
            cmd.args(["-c", &setting]);
        }
        if nix::unistd::Uid::effective().is_root() {
            cmd.uid(owner.uid()).gid(owner.gid());
        }
        cmd.env_remove("PGDATA")
            .env("LC_ALL", "C")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0);
        let child = cmd.spawn().context("spawn postgres")?;
        let own = OwnPostmaster { child };
        let started = Instant::now();
        loop {
            if let Ok(client) = connect(&cluster.config("postgres")).await {
                let setting: String = client
                    .query_one("SELECT current_setting('max_prepared_transactions')", &[])
                    .await?
                    .get(0);
                anyhow::ensure!(
                    setting == prepared.to_string(),
                    "max_prepared_transactions = {setting}"
                );
                return Ok(own);
            }
            anyhow::ensure!(
                started.elapsed() < Duration::from_secs(30),
                "the bench's postmaster did not start"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

impl Drop for OwnPostmaster {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One pgbench run of `script` on `db`, with the bench's seconds and protocol.
async fn pgbench(
    bench: &Bench<'_>,
    db: &Db,
    script: &Path,
    clients: u32,
    logs: &Path,
) -> anyhow::Result<(f64, u64, u64, f64)> {
    let bindir = ticklease_testkit::cluster::bindir()?;
    let out = tokio::process::Command::new(bindir.join("pgbench"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &bench.cluster.port().to_string(),
            "-U",
            "postgres",
        ])
        .args(["-n", "-M", &bench.options.protocol])
        .args(["-T", &bench.options.secs.to_string()])
        .args(["-c", &clients.to_string(), "-j", &clients.min(2).to_string()])
        .args(["-D", &format!("token={}", db.token), "-D", "mark=0"])
        .args(["-D", &format!("role={ROLE}")])
        .arg("-l")
        .arg(format!("--log-prefix={}", logs.join("tx").display()))
        .arg("-f")
        .arg(script)
        .arg(&db.name)
        .output()
        .await
        .context("run pgbench")?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    anyhow::ensure!(
        out.status.success(),
        "pgbench failed: {text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let field = |prefix: &str| -> Option<String> {
        text.lines()
            .find_map(|l| l.trim().strip_prefix(prefix))
            .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
    };
    let tps: f64 = field("tps =").context("no tps")?.parse()?;
    let transactions: u64 = field("number of transactions actually processed:")
        .context("no count")?
        .parse()?;
    let failed: u64 = field("number of failed transactions:")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    let latency: f64 = field("latency average =")
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN);
    Ok((tps, transactions, failed, latency))
}

/// Every transaction's latency in ms, from pgbench's per-transaction logs
/// in `dir` (`client transaction latency_us script epoch epoch_us`).
fn transaction_latencies_ms(dir: &Path) -> anyhow::Result<Vec<f64>> {
    let mut ms = Vec::new();
    for file in std::fs::read_dir(dir)? {
        let text = std::fs::read_to_string(file?.path())?;
        ms.extend(
            text.lines()
                .filter_map(|l| l.split_whitespace().nth(2)?.parse::<f64>().ok())
                .map(|us| us / 1000.0),
        );
    }
    Ok(ms)
}

/// What was measured and on what.
#[derive(Debug, Clone)]
pub struct Report {
    pub runs: Vec<Run>,
    pub server_version: String,
    pub options: FenceOptions,
    pub took: Duration,
}

/// Runs every cell `runs` times and returns every run.
pub async fn run(options: FenceOptions) -> anyhow::Result<Report> {
    let started = Instant::now();
    let cluster = PgCluster::start()?;
    let mut variants = vec![
        Variant::Unfenced,
        Variant::LockFree,
        Variant::FenceGen6,
        Variant::Fence,
    ];
    variants.extend(options.candidates.iter().cloned());
    let dbs = databases(&cluster, &variants).await?;
    let fence_db = variants
        .iter()
        .position(|v| *v == Variant::Fence)
        .expect("the fence");
    let server_version: String = connect(&cluster.config("postgres"))
        .await?
        .query_one("SELECT current_setting('server_version')", &[])
        .await?
        .get(0);
    let dir = tempfile::tempdir()?;
    let bench = Bench {
        cluster: &cluster,
        scripts: dir.path(),
        options: &options,
    };
    let mut runs = Vec::new();
    let cells = options.shapes.len() * options.clients.len() * variants.len();
    let bar = crate::progress(options.prepared.len() * options.runs * cells, "fence runs");
    let mut own = None;
    for &prepared in &options.prepared {
        if prepared != 8 || own.is_some() {
            drop(own.take());
            own = Some(OwnPostmaster::start(&cluster, prepared).await?);
        }
        for round in 0..options.runs {
            for (shape, clients, i, variant) in round_order(&options, &variants, round) {
                let db = dbs[i]
                    .as_ref()
                    .unwrap_or_else(|| dbs[fence_db].as_ref().expect("db"));
                let cell = Cell {
                    prepared,
                    round,
                    shape,
                    clients,
                    variant,
                };
                let r = measure(&bench, db, cell).await?;
                bar.inc(1);
                bar.suspend(|| {
                    eprintln!(
                        "mpt={prepared} {} c={clients} {} #{round}: {:.0} tps, {} failed, load {:.2}",
                        shape.as_str(),
                        r.variant,
                        r.tps,
                        r.failed,
                        r.load_after
                    )
                });
                runs.push(r);
            }
        }
    }
    bar.finish_and_clear();
    drop(own);
    Ok(Report {
        runs,
        server_version,
        options,
        took: started.elapsed(),
    })
}

/// One database per fence definition; the unfenced, lock-free and
/// generation-6 claims run in the migrated one (`None`: the fence's).
async fn databases(cluster: &PgCluster, variants: &[Variant]) -> anyhow::Result<Vec<Option<Db>>> {
    let mut dbs = Vec::new();
    for v in variants {
        dbs.push(match v {
            Variant::Candidate { sql, .. } => Some(setup(cluster, Some(sql)).await?),
            Variant::Fence => Some(setup(cluster, None).await?),
            _ => None,
        });
    }
    Ok(dbs)
}

/// A round's cells (shape, clients, variant's index, variant), the variants of
/// each (shape, clients) group rotated by the round, so that no variant always
/// runs first on a machine whose load drifts.
fn round_order<'a>(
    options: &FenceOptions,
    variants: &'a [Variant],
    round: usize,
) -> Vec<(Shape, u32, usize, &'a Variant)> {
    let mut order = Vec::new();
    for &shape in &options.shapes {
        for &clients in &options.clients {
            for (i, v) in variants.iter().enumerate() {
                order.push((shape, clients, i, v));
            }
        }
    }
    // Rotate the order of the variants within each cell group every round.
    let k = variants.len();
    for group in order.chunks_mut(k) {
        group.rotate_left(round % k);
    }
    order
}

/// What every run of a bench shares: the cluster, where the scripts go, the options.
struct Bench<'a> {
    cluster: &'a PgCluster,
    scripts: &'a Path,
    options: &'a FenceOptions,
}

/// Which run this is: the setting, the round and the cell.
#[derive(Clone, Copy)]
struct Cell<'a> {
    prepared: u32,
    round: usize,
    shape: Shape,
    clients: u32,
    variant: &'a Variant,
}

/// One pgbench run of a cell on a freshly reset `db`, checked to have claimed
/// rows, with its cost per transaction and the lock waits seen during it.
async fn measure(bench: &Bench<'_>, db: &Db, cell: Cell<'_>) -> anyhow::Result<Run> {
    let Cell {
        prepared,
        round,
        shape,
        clients,
        variant: v,
    } = cell;
    let client = connect(&bench.cluster.config(&db.name)).await?;
    reset(&client).await?;
    let script = bench.scripts.join(format!("{}-{}.sql", shape.as_str(), v.name()));
    std::fs::write(&script, shape.script(v.predicate()))?;
    let before = Counters::read(&client).await?;
    let load_before = loadavg();
    let logs = tempfile::tempdir()?;
    let ((tps, transactions, failed, latency_ms), lock_waits) =
        sampled_pgbench(bench, db, &script, clients, logs.path()).await?;
    let load_after = loadavg();
    settle(&client).await?;
    let after = Counters::read(&client).await?;
    claimed_some(&client, v.name()).await?;
    drop(client);
    Ok(Run {
        prepared,
        shape,
        clients,
        variant: v.name().to_string(),
        round,
        tps,
        transactions,
        failed,
        latency_ms,
        latency: summarize(&transaction_latencies_ms(logs.path())?),
        load_before,
        load_after,
        per_transaction: PerTransaction::between(before, after, transactions),
        lock_waits,
    })
}

/// [`pgbench`] while a connection of its own samples the database's lock
/// waits; the sampler stops when pgbench returns, whatever it returns.
async fn sampled_pgbench(
    bench: &Bench<'_>,
    db: &Db,
    script: &Path,
    clients: u32,
    logs: &Path,
) -> anyhow::Result<((f64, u64, u64, f64), LockWaits)> {
    let sampler = connect(&bench.cluster.config(&db.name)).await?;
    let stop = CancellationToken::new();
    let (run, waits) = tokio::join!(
        async {
            let run = pgbench(bench, db, script, clients, logs).await;
            stop.cancel();
            run
        },
        sample_lock_waits(&sampler, &stop)
    );
    Ok((run?, waits?))
}

impl Report {
    /// The runs of one cell.
    fn cell_runs<'r>(
        &'r self,
        prepared: u32,
        shape: Shape,
        clients: u32,
        variant: &'r str,
    ) -> impl Iterator<Item = &'r Run> + 'r {
        self.runs.iter().filter(move |r| {
            r.prepared == prepared && r.shape == shape && r.clients == clients && r.variant == variant
        })
    }

    fn tps(&self, prepared: u32, shape: Shape, clients: u32, variant: &str) -> Vec<f64> {
        self.cell_runs(prepared, shape, clients, variant)
            .map(|r| r.tps)
            .collect()
    }

    /// A cell's transaction latencies: the median over its runs of each
    /// run's p50 and p99, and the largest max.
    fn latency(&self, prepared: u32, shape: Shape, clients: u32, variant: &str) -> String {
        let of = |pick: fn(&crate::stats::Summary) -> f64| -> Vec<f64> {
            self.cell_runs(prepared, shape, clients, variant)
                .filter_map(|r| r.latency.as_ref().map(pick))
                .collect()
        };
        match (
            summarize(&of(|l| l.p50)),
            summarize(&of(|l| l.p99)),
            summarize(&of(|l| l.max)),
        ) {
            (Some(p50), Some(p99), Some(max)) => format!("{:.2} / {:.2} / {:.1}", p50.p50, p99.p50, max.max),
            _ => String::new(),
        }
    }

    /// A cell's explanation columns, each the median over its runs: WAL bytes
    /// per transaction; multixacts (and member slots) per transaction; the
    /// mean number of backends waiting for a lock and the share of samples with any.
    fn costs(&self, prepared: u32, shape: Shape, clients: u32, variant: &str) -> String {
        let median = |pick: fn(&Run) -> f64| -> f64 {
            let values: Vec<f64> = self
                .cell_runs(prepared, shape, clients, variant)
                .map(pick)
                .filter(|v| !v.is_nan())
                .collect();
            summarize(&values).map_or(f64::NAN, |s| s.p50)
        };
        format!(
            "{:.0} | {:.2} ({:.2}) | {:.2} / {:.0} %",
            median(|r| r.per_transaction.wal_bytes),
            median(|r| r.per_transaction.multixacts),
            median(|r| r.per_transaction.multixact_members),
            median(|r| r.lock_waits.mean_waiting()),
            100.0 * median(|r| r.lock_waits.share_with_wait()),
        )
    }

    fn variants(&self) -> Vec<String> {
        let mut v: Vec<String> = Vec::new();
        for r in &self.runs {
            if !v.contains(&r.variant) {
                v.push(r.variant.clone());
            }
        }
        v
    }

    /// The markdown table: per setting, shape, clients and variant, p50 / min /
    /// max tps over the runs, the p50 ratio to the unfenced p50, the latencies
    /// and what explains the cost (WAL, multixacts, lock waits).
    pub fn table(&self) -> String {
        let mut out = String::from(
            "| max_prepared_transactions | claim | clients | variant | runs | p50 tps | min | max | p50 / unfenced p50 | p50 / lock-free p50 | latency p50 / p99 / max ms | WAL B / tx | multixacts / tx (members) | lock waits: mean waiting / samples with any |\n\
             |---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        );
        for &prepared in &self.options.prepared {
            for &shape in &self.options.shapes {
                for &clients in &self.options.clients {
                    let p50 = |v: &str| summarize(&self.tps(prepared, shape, clients, v)).map(|s| s.p50);
                    let unfenced = p50("unfenced");
                    let lockfree = p50("lock-free");
                    for v in self.variants() {
                        let Some(s) = summarize(&self.tps(prepared, shape, clients, &v)) else {
                            continue;
                        };
                        let ratio =
                            |base: Option<f64>| base.map(|b| format!("{:.2}", s.p50 / b)).unwrap_or_default();
                        let _ = writeln!(
                            out,
                            "| {prepared} | {} | {clients} | {v} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {} | {} |",
                            shape.as_str(),
                            s.n,
                            s.p50,
                            s.min,
                            s.max,
                            ratio(unfenced),
                            ratio(lockfree),
                            self.latency(prepared, shape, clients, &v),
                            self.costs(prepared, shape, clients, &v)
                        );
                    }
                }
            }
        }
        out
    }

    /// Every run as CSV.
    pub fn csv(&self) -> String {
        let mut out = String::from(CSV_HEADER);
        for r in &self.runs {
            out.push_str(&r.csv_row(self.options.secs));
            out.push('\n');
        }
        out
    }

    /// The load average over the runs (min / p50 / max of the 1-minute figure at each run's end).
    pub fn load(&self) -> String {
        let loads: Vec<f64> = self.runs.iter().map(|r| r.load_after).collect();
        match summarize(&loads) {
            Some(s) => format!(
                "1-min load average at the runs' ends: min {:.2}, p50 {:.2}, max {:.2}",
                s.min, s.p50, s.max
            ),
            None => String::new(),
        }
    }

    /// Per setting, shape, clients and variant (in the table's order), a
    /// strip of each run's `pick`, coloured by variant.
    fn strips(&self, pick: fn(&Run) -> Option<f64>) -> Vec<Strip> {
        let variants = self.variants();
        let mut rows = Vec::new();
        for &prepared in &self.options.prepared {
            for &shape in &self.options.shapes {
                for &clients in &self.options.clients {
                    for (group, v) in variants.iter().enumerate() {
                        let values: Vec<f64> = self
                            .cell_runs(prepared, shape, clients, v)
                            .filter_map(pick)
                            .collect();
                        if !values.is_empty() {
                            rows.push(Strip {
                                label: format!("mpt {prepared} · {} · {clients} c · {v}", shape.as_str()),
                                group,
                                values,
                            });
                        }
                    }
                }
            }
        }
        rows
    }

    /// Writes the plot (issue 43, item 5): each run's throughput and p99
    /// latency by setting, claim, clients and variant, side by side.
    pub fn write_svg(&self, path: &Path) -> anyhow::Result<PathBuf> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        let tps = self.strips(|r| Some(r.tps));
        let p99 = self.strips(|r| r.latency.map(|l| l.p99));
        crate::plot::panels_svg(
            path,
            &[
                Panel {
                    title: "What the fence costs a claim: throughput per run",
                    axis: "transactions/s (log scale)",
                    rows: &tps,
                },
                Panel {
                    title: "p99 transaction latency per run",
                    axis: "ms (log scale)",
                    rows: &p99,
                },
            ],
        )
        .with_context(|| format!("write {}", path.display()))?;
        Ok(path.to_path_buf())
    }

    /// Writes the CSV to `path`.
    pub fn write_csv(&self, path: &Path) -> anyhow::Result<PathBuf> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, self.csv())?;
        Ok(path.to_path_buf())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn counters(wal_bytes: u64, next_multixact: u32, next_multi_offset: u32) -> Counters {
        Counters {
            wal_bytes,
            next_multixact,
            next_multi_offset,
        }
    }

    #[test]
    fn costs_per_transaction_are_the_counters_growth_over_the_transactions() {
        let cost = PerTransaction::between(counters(1_000, 10, 20), counters(21_000, 55, 120), 100);
        assert_eq!(
            cost,
            PerTransaction {
                wal_bytes: 200.0,
                multixacts: 0.45,
                multixact_members: 1.0,
            }
        );
        // Multixact ids and offsets wrap around at 2^32.
        let wrapped = PerTransaction::between(counters(0, u32::MAX - 1, u32::MAX), counters(0, 3, 1), 5);
        assert_eq!((wrapped.multixacts, wrapped.multixact_members), (1.0, 0.4));
        assert!(PerTransaction::between(counters(0, 0, 0), counters(9, 1, 1), 0)
            .wal_bytes
            .is_nan());
    }

    #[test]
    fn lock_waits_count_waiting_backends_and_samples_with_any() {
        let mut waits = LockWaits::default();
        for waiting in [0, 2, 0, 1] {
            waits.add(waiting);
        }
        assert_eq!((waits.samples, waits.waiting, waits.with_wait), (4, 3, 2));
        assert_eq!((waits.mean_waiting(), waits.share_with_wait()), (0.75, 0.5));
        assert!(LockWaits::default().mean_waiting().is_nan());
    }

    fn run(variant: &str, tps: f64) -> Run {
        Run {
            prepared: 0,
            shape: Shape::One,
            clients: 4,
            variant: variant.into(),
            round: 1,
            tps,
            transactions: 2000,
            failed: 0,
            latency_ms: 0.5,
            latency: summarize(&[0.25, 0.5, 2.0]),
            load_before: 1.0,
            load_after: 1.25,
            per_transaction: PerTransaction {
                wal_bytes: 254.7,
                multixacts: 0.45,
                multixact_members: 1.02,
            },
            lock_waits: LockWaits {
                samples: 200,
                waiting: 30,
                with_wait: 25,
            },
        }
    }

    #[test]
    fn a_csv_row_keeps_the_old_columns_and_ends_with_the_costs() {
        let row = run("row-lock", 4000.0).csv_row(2);
        let header: Vec<&str> = CSV_HEADER.trim_end().split(',').collect();
        let fields: Vec<&str> = row.split(',').collect();
        assert_eq!(fields.len(), header.len(), "{row}");
        let at = |name: &str| fields[header.iter().position(|h| *h == name).unwrap()];
        assert_eq!(header[..15].last(), Some(&"loadavg_after"));
        assert_eq!(
            (at("variant"), at("tps"), at("latency_p99_ms")),
            ("row-lock", "4000.0", "2.000")
        );
        assert_eq!((at("loadavg_before"), at("loadavg_after")), ("1.00", "1.25"));
        assert_eq!(
            &fields[15..],
            ["254.7", "0.4500", "1.0200", "200", "0.1500", "0.1250"]
        );
    }

    #[test]
    fn the_table_and_the_plot_have_a_row_per_variant_of_each_cell() {
        let report = Report {
            runs: vec![
                run("unfenced", 8000.0),
                run("fence", 2000.0),
                run("fence", 2200.0),
            ],
            server_version: "15".into(),
            options: FenceOptions {
                runs: 2,
                secs: 2,
                clients: vec![4],
                shapes: vec![Shape::One],
                prepared: vec![0],
                candidates: Vec::new(),
                protocol: "extended".into(),
            },
            took: Duration::from_secs(1),
        };
        let table = report.table();
        assert!(
            table.contains("| 0 | one-row | 4 | fence | 2 | 2000 | 2000 | 2200 | 0.25 |"),
            "{table}"
        );
        assert!(table.contains("| 255 | 0.45 (1.02) | 0.15 / 12 % |"), "{table}");
        let strips = report.strips(|r| Some(r.tps));
        let labels: Vec<&str> = strips.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "mpt 0 · one-row · 4 c · unfenced",
                "mpt 0 · one-row · 4 c · fence"
            ]
        );
        assert_eq!(
            (strips[1].group, strips[1].values.clone()),
            (1, vec![2000.0, 2200.0])
        );
    }
}
