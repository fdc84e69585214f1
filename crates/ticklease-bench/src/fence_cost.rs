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

use std::fmt::Write as _;
use std::os::unix::fs::MetadataExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_postgres::Client;

use ticklease_testkit::{connect, PgCluster};

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
    /// `(SELECT leader_fence(role, token))` as migrated.
    Fence,
    /// `(SELECT leader_fence(role, token))` after this SQL (`@schema@` = the schema).
    Candidate { name: String, sql: PathBuf },
}

impl Variant {
    pub fn name(&self) -> &str {
        match self {
            Variant::Unfenced => "unfenced",
            Variant::LockFree => "lock-free",
            Variant::Fence => "fence",
            Variant::Candidate { name, .. } => name,
        }
    }

    fn predicate(&self) -> &'static str {
        match self {
            Variant::Unfenced => "true",
            Variant::LockFree => "(SELECT bench_lockfree_fence(:role, :token))",
            Variant::Fence | Variant::Candidate { .. } => "(SELECT leader_fence(:role, :token))",
        }
    }
}

/// Parses `name=path` for `--candidate`.
pub fn parse_candidate(s: &str) -> Result<Variant, String> {
    let (name, sql) = s.split_once('=').ok_or("expected name=file.sql")?;
    if name.is_empty() || ["unfenced", "lock-free", "fence"].contains(&name) {
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
    Ok(())
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

/// One pgbench run of `script` on `db`.
fn pgbench(
    cluster: &PgCluster,
    db: &Db,
    script: &Path,
    clients: u32,
    secs: u64,
    protocol: &str,
    logs: &Path,
) -> anyhow::Result<(f64, u64, u64, f64)> {
    let bindir = ticklease_testkit::cluster::bindir()?;
    let out = Command::new(bindir.join("pgbench"))
        .args([
            "-h",
            "127.0.0.1",
            "-p",
            &cluster.port().to_string(),
            "-U",
            "postgres",
        ])
        .args(["-n", "-M", protocol, "-T", &secs.to_string()])
        .args(["-c", &clients.to_string(), "-j", &clients.min(2).to_string()])
        .args(["-D", &format!("token={}", db.token), "-D", "mark=0"])
        .args(["-D", &format!("role={ROLE}")])
        .arg("-l")
        .arg(format!("--log-prefix={}", logs.join("tx").display()))
        .arg("-f")
        .arg(script)
        .arg(&db.name)
        .output()
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
    let mut variants = vec![Variant::Unfenced, Variant::LockFree, Variant::Fence];
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

/// One database per fence definition; the unfenced and lock-free claims
/// run in the migrated one (`None`: the fence's).
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

/// One pgbench run of a cell on a freshly reset `db`, checked to have claimed rows.
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
    let load_before = loadavg();
    let logs = tempfile::tempdir()?;
    let (tps, transactions, failed, latency_ms) = pgbench(
        bench.cluster,
        db,
        &script,
        clients,
        bench.options.secs,
        &bench.options.protocol,
        logs.path(),
    )?;
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
        load_after: loadavg(),
    })
}

impl Report {
    fn tps(&self, prepared: u32, shape: Shape, clients: u32, variant: &str) -> Vec<f64> {
        self.runs
            .iter()
            .filter(|r| {
                r.prepared == prepared && r.shape == shape && r.clients == clients && r.variant == variant
            })
            .map(|r| r.tps)
            .collect()
    }

    /// A cell's transaction latencies: the median over its runs of each
    /// run's p50 and p99, and the largest max.
    fn latency(&self, prepared: u32, shape: Shape, clients: u32, variant: &str) -> String {
        let of = |pick: fn(&crate::stats::Summary) -> f64| -> Vec<f64> {
            self.runs
                .iter()
                .filter(|r| r.prepared == prepared && r.shape == shape && r.clients == clients)
                .filter(|r| r.variant == variant)
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
    /// max tps over the runs, and the p50 ratio to the unfenced p50.
    pub fn table(&self) -> String {
        let mut out = String::from(
            "| max_prepared_transactions | claim | clients | variant | runs | p50 tps | min | max | p50 / unfenced p50 | p50 / lock-free p50 | latency p50 / p99 / max ms |\n\
             |---|---|---|---|---|---|---|---|---|---|---|\n",
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
                            "| {prepared} | {} | {clients} | {v} | {} | {:.0} | {:.0} | {:.0} | {} | {} | {} |",
                            shape.as_str(),
                            s.n,
                            s.p50,
                            s.min,
                            s.max,
                            ratio(unfenced),
                            ratio(lockfree),
                            self.latency(prepared, shape, clients, &v)
                        );
                    }
                }
            }
        }
        out
    }

    /// Every run as CSV.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "max_prepared_transactions,claim,clients,variant,round,seconds,tps,transactions,failed,latency_ms,\
             latency_p50_ms,latency_p99_ms,latency_max_ms,loadavg_before,loadavg_after\n",
        );
        for r in &self.runs {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{:.1},{},{},{:.3},{},{:.2},{:.2}",
                r.prepared,
                r.shape.as_str(),
                r.clients,
                r.variant,
                r.round,
                self.options.secs,
                r.tps,
                r.transactions,
                r.failed,
                r.latency_ms,
                r.latency
                    .as_ref()
                    .map(|l| format!("{:.3},{:.3},{:.3}", l.p50, l.p99, l.max))
                    .unwrap_or_else(|| ",,".into()),
                r.load_before,
                r.load_after
            );
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

    /// Writes the CSV to `path`.
    pub fn write_csv(&self, path: &Path) -> anyhow::Result<PathBuf> {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir)?;
        }
        std::fs::write(path, self.csv())?;
        Ok(path.to_path_buf())
    }
}
