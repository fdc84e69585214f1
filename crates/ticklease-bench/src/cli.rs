//! The command line of `ticklease-bench`: the doc comments on [`Cmd`] are the
//! `--help` text, and each subcommand's flags are a struct of their own so
//! that its function in `commands` takes them whole.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ticklease_bench::chaos::WorkerFlags;
use ticklease_bench::drill::Driver;
use ticklease_bench::failover::{Mode, Scenario};
use ticklease_bench::patroni::{Replication, Word};
use ticklease_bench::scale;
use ticklease_bench::scale_replica::ReplicaFlags;
use ticklease_bench::Timing;

#[derive(Parser)]
#[command(
    name = "ticklease-bench",
    about = "Failover benchmark and chaos run for ticklease"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Cmd,
}

#[derive(Subcommand)]
pub enum Cmd {
    /// Trials of each failure scenario; prints the table and writes the raw trials as CSV.
    Failover(FailoverArgs),
    /// Statements per second and connections per replica while one role's
    /// tick runs on one of the replicas and the others wait.
    Idle(IdleArgs),
    /// Postgres switchovers (standby caught up, primary stopped, standby promoted)
    /// under a drill leader and a follower on the multi-host URL.
    Promotion(PromotionArgs),
    /// Patroni failovers (switchover, killed postmaster, killed Patroni restarted or not, with a
    /// one-sided partition) under four replicas on the multi-host URL, async and sync, with and without
    /// Patroni's word and the direct URL: patroni.md.
    Patroni(PatroniArgs),
    /// Worker replicas under seeded random faults (promotions of the standby,
    /// with and without a lost tail, among them), then the history checker.
    Chaos(ChaosArgs),
    /// SVG plots from the CSVs already in `dir`: `failover-<timing>.svg` for
    /// each timing with `failover-<timing>-<mode>.csv` files (no benchmark runs).
    Plot(PlotArgs),
    /// Role families at scale: replicas sharing one family of keys (statements/s,
    /// ACQUIRE/RENEW latency, lost terms, spread, CPU), a SIGKILL of some of
    /// them, then the same load with one role per key as the baseline.
    Scale(ScaleArgs),
    /// What the fence costs a claim: pgbench runs of a one-row and a 50-row
    /// batch claim, unfenced, with the lock-free STABLE fence and with the real
    /// fence (and candidate fences); prints the table (with WAL bytes, multixacts and
    /// lock waits per transaction), writes every run as CSV and the plot as SVG.
    Fence(FenceArgs),
    /// `ticklease run` under its runner's SIGKILL and SIGSTOP, beside flock and a
    /// session advisory lock: the child's death and the next child, per trial.
    RunFailover(RunFailoverArgs),
    /// The black-box check (docs/black-box.md) of the Rust Scheduler, `ticklease run`, the Python
    /// package and any client given with --client, `rounds` times each: the figures per fault go to black-box.md.
    BlackBox(BlackBoxArgs),
    /// (child process) The Rust client of the black-box check.
    #[command(hide = true)]
    BlackBoxClient,
    /// The advisory-lock baseline's holder (internal to run-failover).
    #[command(hide = true)]
    AdvisoryHolder(AdvisoryHolderArgs),
    /// Wall-clock schedules at scale: replicas sharing many roles on one cron
    /// schedule, all due at once; with and without coordination sessions:
    /// duplicates, missed occurrences, start lag, statements per occurrence.
    Schedules(SchedulesArgs),
    /// (child process) One replica of the scale bench.
    #[command(hide = true)]
    ScaleReplica(ReplicaFlags),
    /// (child process) A drill leader writing fenced rows while it leads.
    #[command(hide = true)]
    Leader(LeaderArgs),
    /// (child process) A worker replica with the chaos run's settings.
    #[command(hide = true)]
    Worker(WorkerFlags),
}

// The flags of each subcommand, in the order `--help` lists them. They carry
// no doc comment of their own: the variant's above is the subcommand's help.

#[derive(clap::Args)]
pub struct FailoverArgs {
    #[arg(long, default_value_t = 20)]
    pub trials: usize,
    #[arg(long, value_enum, default_value = "default")]
    pub timing: Timing,
    /// Only these scenarios (default: all).
    #[arg(long, value_enum, value_delimiter = ',')]
    pub scenarios: Vec<Scenario>,
    #[command(flatten)]
    pub mode: ModeFlags,
    /// What loops over the drill leaders' role.
    #[arg(long, value_enum, default_value = "scheduler")]
    pub driver: Driver,
    #[arg(long, default_value = "docs/benchmarks")]
    pub out: PathBuf,
}

#[derive(clap::Args)]
pub struct IdleArgs {
    #[arg(long, default_value_t = 2)]
    pub replicas: usize,
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    pub over: Duration,
    #[arg(long, value_enum, default_value = "default")]
    pub timing: Timing,
    #[command(flatten)]
    pub mode: ModeFlags,
    #[arg(long, default_value = "docs/benchmarks")]
    pub out: PathBuf,
}

#[derive(clap::Args)]
pub struct PromotionArgs {
    #[arg(long, default_value_t = 10)]
    pub trials: usize,
    #[arg(long, value_enum, default_value = "scaled")]
    pub timing: Timing,
    /// Keep the cluster without a writable server this long before promoting.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "0ms")]
    pub down_for: Duration,
    #[arg(long, default_value = "docs/benchmarks")]
    pub out: PathBuf,
}

#[derive(clap::Args)]
pub struct PatroniArgs {
    /// Rounds of every combination of the settings below.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
    /// Patroni's replication: async, sync (`synchronous_mode: true`), or both (`async,sync`).
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["async", "sync"])]
    pub replication: Vec<Replication>,
    /// Replicas built without Patroni's word, with it (`PgStore::with_patroni`), or both.
    #[arg(long, value_enum, value_delimiter = ',', default_values = ["without", "with"])]
    pub patroni_word: Vec<Word>,
    /// Replicas with the direct URL (`true`), without (`false`), or both.
    #[arg(long, value_delimiter = ',', default_values = ["true", "false"])]
    pub direct: Vec<bool>,
    #[arg(long, value_enum, default_value = "default")]
    pub timing: Timing,
    #[arg(long, default_value = "docs/benchmarks")]
    pub out: PathBuf,
}

#[derive(clap::Args)]
pub struct ChaosArgs {
    #[arg(long, default_value_t = 5)]
    pub replicas: usize,
    #[arg(long, default_value_t = 50)]
    pub faults: usize,
    /// Seed of the fault stream (printed, so a failure reproduces).
    #[arg(long)]
    pub seed: Option<u64>,
    #[arg(long, value_enum, default_value = "scaled")]
    pub timing: Timing,
    /// Reach Postgres through a PgBouncer (transaction mode) on each node, and restart it too.
    #[arg(long)]
    pub pooled: bool,
    /// Where the timeline of terms and faults goes (`chaos-timeline.svg`).
    #[arg(long, default_value = "docs/benchmarks")]
    pub out: PathBuf,
}

#[derive(clap::Args)]
pub struct PlotArgs {
    #[arg(long, default_value = "docs/benchmarks")]
    pub dir: PathBuf,
}

#[derive(clap::Args)]
pub struct ScaleArgs {
    #[arg(long, default_value_t = 10)]
    pub replicas: usize,
    #[arg(long, default_value_t = 1000)]
    pub keys: usize,
    /// The family window, after a warm-up of two tick cycles.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
    pub over: Duration,
    /// Replicas to SIGKILL after the window (0: none).
    #[arg(long, default_value_t = 2)]
    pub kill: usize,
    /// The per-role baseline's window (0s: no baseline).
    #[arg(long, value_parser = humantime::parse_duration, default_value = "2m")]
    pub baseline_over: Duration,
    #[arg(long, value_enum, default_value = "default")]
    pub timing: Timing,
    /// Each family replica's pool.
    #[arg(long, default_value_t = scale::DEFAULT_POOL)]
    pub pool: usize,
    /// Each per-role replica's pool (default: the most the sandbox's connections allow, at most 64).
    #[arg(long)]
    pub baseline_pool: Option<usize>,
    #[arg(long, default_value = "docs/benchmarks")]
    pub out: PathBuf,
    /// Exit non-zero unless no term was lost and the spread stayed within ±20 %.
    #[arg(long)]
    pub assert: bool,
}

#[derive(clap::Args)]
pub struct FenceArgs {
    #[arg(long, default_value_t = 5)]
    pub runs: usize,
    /// Seconds per run.
    #[arg(long, default_value_t = 10)]
    pub secs: u64,
    #[arg(long, value_delimiter = ',', default_value = "1,4")]
    pub clients: Vec<u32>,
    #[arg(long, value_enum, value_delimiter = ',', default_value = "one,batch")]
    pub shapes: Vec<ticklease_bench::fence_cost::Shape>,
    /// `max_prepared_transactions` settings to measure (8: the test kit's).
    #[arg(long, value_delimiter = ',', default_value = "8,0")]
    pub prepared: Vec<u32>,
    /// A candidate fence, `name=file.sql` (CREATE OR REPLACE, `@schema@` for the schema), in a database of its own.
    #[arg(long = "candidate", value_parser = ticklease_bench::fence_cost::parse_candidate)]
    pub candidates: Vec<ticklease_bench::fence_cost::Variant>,
    /// pgbench's query protocol (`extended`: unnamed statements, as the library sends).
    #[arg(long, default_value = "extended")]
    pub protocol: String,
    /// Where `fence-cost.csv` (every run) and `fence-cost.svg` (the plot) go.
    #[arg(long, default_value = "docs/benchmarks")]
    pub out: PathBuf,
}

#[derive(clap::Args)]
pub struct RunFailoverArgs {
    #[arg(long, default_value_t = 20)]
    pub trials: usize,
    /// The ticklease binary (build it with `cargo build --release -p ticklease-cli`).
    #[arg(long, default_value = "target/release/ticklease")]
    pub ticklease: PathBuf,
    #[arg(long, default_value = "docs/benchmarks")]
    pub out: PathBuf,
}

#[derive(clap::Args)]
pub struct BlackBoxArgs {
    #[arg(long, default_value_t = 5)]
    pub rounds: usize,
    /// The ticklease binary (build it with `cargo build --release -p ticklease-cli`).
    #[arg(long, default_value = "target/release/ticklease")]
    pub ticklease: PathBuf,
    /// Only the repository's clients of these names (rust-scheduler, ticklease-run, python); an
    /// unknown name is refused.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// A client of your own, `NAME=COMMAND` (repeatable): checked under NAME, started as `sh -c "exec
    /// COMMAND"`. With --client and no --only, only the given clients are checked.
    #[arg(long = "client", value_parser = ticklease_bench::black_box::bench::parse_client)]
    pub clients: Vec<ticklease_bench::black_box::ClientUnderCheck>,
    #[arg(long, default_value = "docs/benchmarks")]
    pub out: PathBuf,
}

#[derive(clap::Args)]
pub struct AdvisoryHolderArgs {
    pub url: String,
    pub key: i64,
    #[arg(last = true)]
    pub command: Vec<String>,
}

#[derive(clap::Args)]
pub struct SchedulesArgs {
    #[arg(long, default_value_t = 10)]
    pub replicas: usize,
    #[arg(long, default_value_t = 1000)]
    pub roles: usize,
    #[arg(long, default_value_t = 10)]
    pub occurrences: u32,
    /// The schedule's period in seconds (`*/N * * * * *`).
    #[arg(long, default_value_t = 10)]
    pub every: u32,
    #[arg(long, value_enum, default_value = "default")]
    pub timing: Timing,
    /// Each replica's lease-statement pool.
    #[arg(long, default_value_t = 8)]
    pub pool: usize,
    /// Run the roles as the keys of one family instead (batched statements).
    #[arg(long)]
    pub family: bool,
    #[arg(long, default_value = "docs/benchmarks")]
    pub out: PathBuf,
}

#[derive(clap::Args)]
pub struct LeaderArgs {
    #[arg(long)]
    pub url: String,
    /// Opens a coordination session on this URL.
    #[arg(long)]
    pub direct_url: Option<String>,
    #[arg(long)]
    pub role: String,
    #[arg(long, value_enum)]
    pub timing: Timing,
    #[arg(long, value_parser = humantime::parse_duration)]
    pub write_every: Duration,
    #[arg(long, value_enum, default_value = "scheduler")]
    pub driver: Driver,
}

/// How the drill processes reach Postgres; neither flag: statements straight
/// to Postgres and no coordination session (leases alone, the pre-issue-12 run).
#[derive(Debug, clap::Args)]
pub struct ModeFlags {
    /// A coordination session straight to Postgres (with `--pooled`: the direct URL beside the pooled one).
    #[arg(long)]
    direct: bool,
    /// Statements through PgBouncer in transaction mode.
    #[arg(long)]
    pooled: bool,
}

impl ModeFlags {
    pub fn mode(&self) -> Mode {
        Mode::from_flags(self.direct, self.pooled)
    }
}
