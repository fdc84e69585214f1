//! Wall-clock schedules at scale (issue 25): replicas sharing many roles on
//! one cron schedule, every role due at the same instants. Each occurrence's
//! work writes one fenced row (role, occurrence, token, the server's clock);
//! from them: occurrences completed twice (duplicates) or never (missed),
//! the start lag (occurrence instant on the database clock → the work's
//! first fenced statement), and the statements the replicas sent per role
//! occurrence (`pg_stat_statements`; not the fence's own statements, which
//! its commit-time check runs for the work's claim, nor the bench's rows).
//!
//! The replicas are managers in this one process (one runtime, one pool and,
//! with coordination, one session each), so the lag includes this process's
//! own scheduling of every replica's role loops on the machine's cores.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use tokio_postgres::types::Type;
use tokio_util::sync::CancellationToken;

use ticklease::{Family, Manager, PgStore, PgStoreOptions, Role, Schedule, Scheduler, Stopped, Tick};
use ticklease_sandbox::ClusterOptions;
use ticklease_testkit::{connect, PgCluster};

use crate::stats::{summarize, Summary};
use crate::Timing;

/// One configuration of the run.
#[derive(Debug, Clone)]
pub struct SchedulesOptions {
    pub replicas: usize,
    pub roles: usize,
    /// Occurrences measured (after one to warm up).
    pub occurrences: u32,
    /// The schedule's period in seconds (`*/N * * * * *`, at least the heartbeat).
    pub every_secs: u32,
    pub timing: Timing,
    /// Each replica opens a coordination session.
    pub coordinated: bool,
    /// Each replica's lease-statement pool.
    pub pool: usize,
    /// The roles are the keys of one family (`job:k0000` …), not declared roles.
    pub family: bool,
}

/// What one configuration measured.
#[derive(Debug, Clone)]
pub struct SchedulesRun {
    pub label: String,
    /// Start lag of every completed (role, occurrence), in ms.
    pub lags_ms: Vec<f64>,
    pub expected: usize,
    pub completed: usize,
    pub duplicates: usize,
    pub missed: usize,
    /// ticklease's statements per role occurrence (every replica's).
    pub statements_per_occurrence: f64,
}

impl SchedulesRun {
    pub fn lag(&self) -> Option<Summary> {
        summarize(&self.lags_ms)
    }
}

const WORK: &str = "INSERT INTO bench_runs (role, occurrence, token)
    SELECT $1, $3, $2 WHERE leader_fence_v2($1, $2)";

/// Clients each replica's work writes through (round robin).
const WORK_CLIENTS: usize = 4;

/// One occurrence's work: its fenced row.
async fn work(client: Arc<tokio_postgres::Client>, tick: Tick) -> Result<(), tokio_postgres::Error> {
    let (role, token) = (tick.role().as_str().to_string(), tick.token().get());
    client
        .execute_typed(
            WORK,
            &[
                (&role, Type::TEXT),
                (&token, Type::INT8),
                (&tick.occurrence(), Type::TIMESTAMPTZ),
            ],
        )
        .await
        .map(|_| ())
}

/// Runs one configuration on a fresh cluster.
pub async fn run(o: &SchedulesOptions) -> anyhow::Result<SchedulesRun> {
    let cluster = PgCluster::start_with(&ClusterOptions::default().with_pg_stat_statements())?;
    let db = cluster.create_database().await?;
    let url = cluster.config(&db);
    let owner = prepare(&url).await?;
    let schedule = Schedule::cron(&format!("*/{} * * * * *", o.every_secs))?;
    let stop = CancellationToken::new();
    let runs = start_replicas(o, &url, &schedule, &stop).await?;
    let (first, last, calls) = measure(&owner, &schedule, o).await?;
    stop.cancel();
    for run in runs {
        let _ = run.await;
    }
    tally(o, &owner, (first, last), calls).await
}

/// The migrated database, with `pg_stat_statements` and the table the work
/// writes; the owner's client, which the bench keeps for its own queries.
async fn prepare(url: &tokio_postgres::Config) -> anyhow::Result<tokio_postgres::Client> {
    let mut owner = connect(url).await?;
    ticklease::migrate(&mut owner).await?;
    owner
        .batch_execute(
            "CREATE EXTENSION IF NOT EXISTS pg_stat_statements;
             CREATE TABLE bench_runs (role text NOT NULL, occurrence timestamptz, token bigint NOT NULL,
                                      started_at timestamptz NOT NULL DEFAULT clock_timestamp());
             GRANT INSERT, SELECT ON bench_runs TO PUBLIC;",
        )
        .await?;
    Ok(owner)
}

/// Starts `o.replicas` schedulers, each with its own store and work clients,
/// running every role (or the family's keys) until `stop`.
async fn start_replicas(
    o: &SchedulesOptions,
    url: &tokio_postgres::Config,
    schedule: &Schedule,
    stop: &CancellationToken,
) -> anyhow::Result<Vec<tokio::task::JoinHandle<Stopped>>> {
    let config = o.timing.config();
    let keys: Vec<String> = (0..o.roles).map(|i| format!("k{i:04}")).collect();
    let roles: Vec<Role> = keys
        .iter()
        .map(|k| Role::new(format!("job{k}")))
        .collect::<Result<_, _>>()?;
    let mut runs = Vec::new();
    for _ in 0..o.replicas {
        let options = PgStoreOptions {
            pool_size: o.pool,
            ..PgStoreOptions::from_config(&config)
        };
        let mut store = PgStore::connect(url.clone(), options).await?;
        if o.coordinated {
            store = store.with_direct(url.clone()).await?;
        }
        let declared = if o.family { Vec::new() } else { roles.clone() };
        let manager = Manager::start(store, config, declared).await?;
        let mut clients = Vec::new();
        for _ in 0..WORK_CLIENTS {
            clients.push(Arc::new(connect(url).await?));
        }
        let mut scheduler = Scheduler::new(manager);
        if o.family {
            let family = Family::new("job")?;
            family.set(keys.clone())?;
            let clients = clients.clone();
            scheduler = scheduler.family(&family, schedule.clone(), move |tick| {
                let client =
                    clients[usize::try_from(tick.token().get()).unwrap_or_default() % WORK_CLIENTS].clone();
                work(client, tick)
            })?;
        }
        for (i, role) in roles.iter().enumerate().filter(|_| !o.family) {
            let client = clients[i % WORK_CLIENTS].clone();
            scheduler = scheduler.job(role, schedule.clone(), move |tick| work(client.clone(), tick))?;
        }
        runs.push(tokio::spawn(scheduler.run(stop.clone())));
    }
    Ok(runs)
}

/// Waits out the window and counts the replicas' statements in it: the
/// window's first and last occurrence and the statement calls.
async fn measure(
    owner: &tokio_postgres::Client,
    schedule: &Schedule,
    o: &SchedulesOptions,
) -> anyhow::Result<(SystemTime, SystemTime, i64)> {
    let every = Duration::from_secs(u64::from(o.every_secs));
    // The window: from the occurrence after the next one (all replicas have
    // looked by then), for `occurrences` occurrences.
    let now: SystemTime = owner.query_one("SELECT now()", &[]).await?.get(0);
    let first = schedule
        .next_after(schedule.next_after(now).context("next occurrence")?)
        .context("next")?;
    let last = (1..o.occurrences)
        .try_fold(first, |at, _| schedule.next_after(at))
        .context("last")?;
    wait_until(owner, first - Duration::from_millis(500)).await?;
    owner.batch_execute("SELECT pg_stat_statements_reset()").await?;
    // Each occurrence's terms end well within a period: count until just before the next.
    wait_until(owner, last + every - Duration::from_millis(500)).await?;
    let calls: i64 = owner
        .query_one(
            "SELECT coalesce(sum(calls), 0)::bigint FROM pg_stat_statements
              WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database())
                AND query NOT LIKE '%bench_runs%' AND query NOT LIKE '%pg_stat_statements%'
                AND query NOT LIKE 'SELECT now()%' AND query NOT LIKE '%NEW.%'
                AND query NOT LIKE '%pg_export_snapshot%'",
            &[],
        )
        .await?
        .get(0);
    Ok((first, last, calls))
}

/// The run's figures from the fenced rows of the window's occurrences.
async fn tally(
    o: &SchedulesOptions,
    owner: &tokio_postgres::Client,
    (first, last): (SystemTime, SystemTime),
    calls: i64,
) -> anyhow::Result<SchedulesRun> {
    let rows = owner
        .query(
            "SELECT role, occurrence, extract(epoch FROM started_at - occurrence)::float8 * 1000
               FROM bench_runs WHERE occurrence BETWEEN $1 AND $2",
            &[&first, &last],
        )
        .await?;
    let mut seen = std::collections::HashSet::new();
    let mut lags_ms = Vec::new();
    for r in &rows {
        let key: (String, SystemTime) = (r.get(0), r.get(1));
        if seen.insert(key) {
            lags_ms.push(r.get::<_, f64>(2));
        }
    }
    let expected = o.roles * o.occurrences as usize;
    let completions = rows.len();
    let occurrences_run = (o.roles * o.occurrences as usize) as f64;
    Ok(SchedulesRun {
        label: label(o),
        lags_ms,
        expected,
        completed: seen.len(),
        duplicates: completions - seen.len(),
        missed: expected.saturating_sub(seen.len()),
        statements_per_occurrence: calls as f64 / occurrences_run,
    })
}

fn label(o: &SchedulesOptions) -> String {
    format!(
        "{} replicas x {} {}, {}",
        o.replicas,
        o.roles,
        if o.family { "family keys" } else { "roles" },
        if o.coordinated {
            "coordination sessions"
        } else {
            "leases alone"
        }
    )
}

/// Waits until the database clock reaches `at`.
async fn wait_until(db: &tokio_postgres::Client, at: SystemTime) -> anyhow::Result<()> {
    let now: SystemTime = db.query_one("SELECT now()", &[]).await?.get(0);
    if let Ok(left) = at.duration_since(now) {
        tokio::time::sleep(left).await;
    }
    Ok(())
}

/// Writes the runs' lags as CSV, the summary as markdown and a strip plot.
pub fn write(out: &Path, o: &SchedulesOptions, runs: &[SchedulesRun]) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(out)?;
    let mut csv = String::from("configuration,lag_ms\n");
    for r in runs {
        for lag in &r.lags_ms {
            let _ = writeln!(csv, "{},{lag:.3}", r.label);
        }
    }
    std::fs::write(out.join("schedules-lag.csv"), csv)?;
    let strips: Vec<crate::plot::Strip> = runs
        .iter()
        .enumerate()
        .map(|(i, r)| crate::plot::Strip {
            label: r.label.clone(),
            group: i,
            values: r.lags_ms.iter().map(|l| l.max(0.1)).collect(),
        })
        .collect();
    crate::plot::strips_svg(
        &out.join("schedules.svg"),
        &format!(
            "Start lag of a cron occurrence ({} roles due at once, {} occurrences)",
            o.roles, o.occurrences
        ),
        "occurrence instant (database clock) -> first fenced statement, ms",
        &strips,
    )?;
    let md = out.join("schedules.md");
    std::fs::write(&md, markdown(o, runs))?;
    Ok(md)
}

fn markdown(o: &SchedulesOptions, runs: &[SchedulesRun]) -> String {
    let mut s = format!(
        "# Wall-clock schedules at scale\n\n`ticklease-bench schedules --replicas {} --roles {} --occurrences {} \
         --every {}s --timing {}`: {} roles on `*/{} * * * * *`, all due at the same instants, led by {} \
         replicas (managers in one process, pool {} each); each occurrence's work writes one fenced row. \
         Start lag: the occurrence instant on the database clock to the work's fenced INSERT \
         (`clock_timestamp()`), per completed (role, occurrence). Statements: `pg_stat_statements` calls \
         of the database over the window (not the fence's statements for the work's claim, nor the bench's own rows), per role occurrence.\n\n\
         | configuration | completed / expected | duplicates | missed | lag p50 ms | lag p99 ms | lag max ms | statements per occurrence |\n\
         |---|---|---|---|---|---|---|---|\n",
        o.replicas, o.roles, o.occurrences, o.every_secs, o.timing.as_str(), o.roles, o.every_secs, o.replicas, o.pool
    );
    for r in runs {
        let (p50, p99, max) = r
            .lag()
            .map_or((f64::NAN, f64::NAN, f64::NAN), |l| (l.p50, l.p99, l.max));
        let _ = writeln!(
            s,
            "| {} | {} / {} | {} | {} | {p50:.1} | {p99:.1} | {max:.1} | {:.2} |",
            r.label, r.completed, r.expected, r.duplicates, r.missed, r.statements_per_occurrence
        );
    }
    s.push_str("\n![start lag](schedules.svg)\n");
    s
}
