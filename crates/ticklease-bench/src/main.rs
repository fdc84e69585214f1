//! `ticklease-bench`: the failover benchmark and the chaos run.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Parser, Subcommand};
use ticklease_bench::chaos::{self, ChaosOptions, WorkerFlags};
use ticklease_bench::drill::Driver;
use ticklease_bench::failover::{self, Env, Mode, Scenario};
use ticklease_bench::scale::{self, ScaleOptions};
use ticklease_bench::scale_replica::{self, ReplicaFlags};
use ticklease_bench::schedules::{self, SchedulesOptions};
use ticklease_bench::{drill, idle, promotion, Timing};

#[derive(Parser)]
#[command(
    name = "ticklease-bench",
    about = "Failover benchmark and chaos run for ticklease"
)]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Trials of each failure scenario; prints the table and writes the raw trials as CSV.
    Failover {
        #[arg(long, default_value_t = 20)]
        trials: usize,
        #[arg(long, value_enum, default_value = "default")]
        timing: Timing,
        /// Only these scenarios (default: all).
        #[arg(long, value_enum, value_delimiter = ',')]
        scenarios: Vec<Scenario>,
        #[command(flatten)]
        mode: ModeFlags,
        /// What loops over the drill leaders' role.
        #[arg(long, value_enum, default_value = "scheduler")]
        driver: Driver,
        #[arg(long, default_value = "docs/benchmarks")]
        out: PathBuf,
    },
    /// Statements per second and connections per replica while one role's
    /// tick runs on one of the replicas and the others wait.
    Idle {
        #[arg(long, default_value_t = 2)]
        replicas: usize,
        #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
        over: Duration,
        #[arg(long, value_enum, default_value = "default")]
        timing: Timing,
        #[command(flatten)]
        mode: ModeFlags,
        #[arg(long, default_value = "docs/benchmarks")]
        out: PathBuf,
    },
    /// Postgres switchovers (standby caught up, primary stopped, standby promoted)
    /// under a drill leader and a follower on the multi-host URL.
    Promotion {
        #[arg(long, default_value_t = 10)]
        trials: usize,
        #[arg(long, value_enum, default_value = "scaled")]
        timing: Timing,
        /// Keep the cluster without a writable server this long before promoting.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "0ms")]
        down_for: Duration,
        #[arg(long, default_value = "docs/benchmarks")]
        out: PathBuf,
    },
    /// Patroni failovers (switchover, killed postmaster, killed Patroni restarted or not) under three
    /// replicas on the multi-host URL, with and without the direct URL: patroni.md.
    Patroni {
        #[arg(long, default_value_t = 3)]
        rounds: usize,
        #[arg(long, value_enum, default_value = "default")]
        timing: Timing,
        #[arg(long, default_value = "docs/benchmarks")]
        out: PathBuf,
    },
    /// Worker replicas under seeded random faults (promotions of the standby,
    /// with and without a lost tail, among them), then the history checker.
    Chaos {
        #[arg(long, default_value_t = 5)]
        replicas: usize,
        #[arg(long, default_value_t = 50)]
        faults: usize,
        /// Seed of the fault stream (printed, so a failure reproduces).
        #[arg(long)]
        seed: Option<u64>,
        #[arg(long, value_enum, default_value = "scaled")]
        timing: Timing,
        /// Reach Postgres through a PgBouncer (transaction mode) on each node, and restart it too.
        #[arg(long)]
        pooled: bool,
        /// Where the timeline of terms and faults goes (`chaos-timeline.svg`).
        #[arg(long, default_value = "docs/benchmarks")]
        out: PathBuf,
    },
    /// SVG plots from the CSVs already in `dir`: `failover-<timing>.svg` for
    /// each timing with `failover-<timing>-<mode>.csv` files (no benchmark runs).
    Plot {
        #[arg(long, default_value = "docs/benchmarks")]
        dir: PathBuf,
    },
    /// Role families at scale: replicas sharing one family of keys (statements/s,
    /// ACQUIRE/RENEW latency, lost terms, spread, CPU), a SIGKILL of some of
    /// them, then the same load with one role per key as the baseline.
    Scale {
        #[arg(long, default_value_t = 10)]
        replicas: usize,
        #[arg(long, default_value_t = 1000)]
        keys: usize,
        /// The family window, after a warm-up of two tick cycles.
        #[arg(long, value_parser = humantime::parse_duration, default_value = "10m")]
        over: Duration,
        /// Replicas to SIGKILL after the window (0: none).
        #[arg(long, default_value_t = 2)]
        kill: usize,
        /// The per-role baseline's window (0s: no baseline).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "2m")]
        baseline_over: Duration,
        #[arg(long, value_enum, default_value = "default")]
        timing: Timing,
        /// Each family replica's pool.
        #[arg(long, default_value_t = scale::DEFAULT_POOL)]
        pool: usize,
        /// Each per-role replica's pool (default: the most the sandbox's connections allow, at most 64).
        #[arg(long)]
        baseline_pool: Option<usize>,
        #[arg(long, default_value = "docs/benchmarks")]
        out: PathBuf,
        /// Exit non-zero unless no term was lost and the spread stayed within ±20 %.
        #[arg(long)]
        assert: bool,
    },
    /// What the fence costs a claim: pgbench runs of a one-row and a 50-row
    /// batch claim, unfenced, with the lock-free STABLE fence and with the real
    /// fence (and candidate fences); prints the table, writes every run as CSV.
    Fence {
        #[arg(long, default_value_t = 5)]
        runs: usize,
        /// Seconds per run.
        #[arg(long, default_value_t = 10)]
        secs: u64,
        #[arg(long, value_delimiter = ',', default_value = "1,4")]
        clients: Vec<u32>,
        #[arg(long, value_enum, value_delimiter = ',', default_value = "one,batch")]
        shapes: Vec<ticklease_bench::fence_cost::Shape>,
        /// `max_prepared_transactions` settings to measure (8: the test kit's).
        #[arg(long, value_delimiter = ',', default_value = "8,0")]
        prepared: Vec<u32>,
        /// A candidate fence, `name=file.sql` (CREATE OR REPLACE, `@schema@` for the schema), in a database of its own.
        #[arg(long = "candidate", value_parser = ticklease_bench::fence_cost::parse_candidate)]
        candidates: Vec<ticklease_bench::fence_cost::Variant>,
        /// pgbench's query protocol (`extended`: unnamed statements, as the library sends).
        #[arg(long, default_value = "extended")]
        protocol: String,
        #[arg(long, default_value = "docs/benchmarks/fence-cost.csv")]
        csv: PathBuf,
    },
    /// `ticklease run` under its runner's SIGKILL and SIGSTOP, beside flock and a
    /// session advisory lock: the child's death and the next child, per trial.
    RunFailover {
        #[arg(long, default_value_t = 20)]
        trials: usize,
        /// The ticklease binary (build it with `cargo build --release -p ticklease-cli`).
        #[arg(long, default_value = "target/release/ticklease")]
        ticklease: PathBuf,
        #[arg(long, default_value = "docs/benchmarks")]
        out: PathBuf,
    },
    /// The black-box check (docs/black-box.md) of the Rust Scheduler, `ticklease run`, the Python
    /// package and any client given with --client, `rounds` times each: the figures per fault go to black-box.md.
    BlackBox {
        #[arg(long, default_value_t = 5)]
        rounds: usize,
        /// The ticklease binary (build it with `cargo build --release -p ticklease-cli`).
        #[arg(long, default_value = "target/release/ticklease")]
        ticklease: PathBuf,
        /// Only the repository's clients of these names (rust-scheduler, ticklease-run, python); an
        /// unknown name is refused.
        #[arg(long, value_delimiter = ',')]
        only: Vec<String>,
        /// A client of your own, `NAME=COMMAND` (repeatable): checked under NAME, started as `sh -c "exec
        /// COMMAND"`. With --client and no --only, only the given clients are checked.
        #[arg(long = "client", value_parser = ticklease_bench::black_box::bench::parse_client)]
        clients: Vec<ticklease_bench::black_box::ClientUnderCheck>,
        #[arg(long, default_value = "docs/benchmarks")]
        out: PathBuf,
    },
    /// (child process) The Rust client of the black-box check.
    #[command(hide = true)]
    BlackBoxClient,
    /// The advisory-lock baseline's holder (internal to run-failover).
    #[command(hide = true)]
    AdvisoryHolder {
        url: String,
        key: i64,
        #[arg(last = true)]
        command: Vec<String>,
    },
    /// Wall-clock schedules at scale: replicas sharing many roles on one cron
    /// schedule, all due at once; with and without coordination sessions:
    /// duplicates, missed occurrences, start lag, statements per occurrence.
    Schedules {
        #[arg(long, default_value_t = 10)]
        replicas: usize,
        #[arg(long, default_value_t = 1000)]
        roles: usize,
        #[arg(long, default_value_t = 10)]
        occurrences: u32,
        /// The schedule's period in seconds (`*/N * * * * *`).
        #[arg(long, default_value_t = 10)]
        every: u32,
        #[arg(long, value_enum, default_value = "default")]
        timing: Timing,
        /// Each replica's lease-statement pool.
        #[arg(long, default_value_t = 8)]
        pool: usize,
        /// Run the roles as the keys of one family instead (batched statements).
        #[arg(long)]
        family: bool,
        #[arg(long, default_value = "docs/benchmarks")]
        out: PathBuf,
    },
    /// (child process) One replica of the scale bench.
    #[command(hide = true)]
    ScaleReplica(ReplicaFlags),
    /// (child process) A drill leader writing fenced rows while it leads.
    #[command(hide = true)]
    Leader {
        #[arg(long)]
        url: String,
        /// Opens a coordination session on this URL.
        #[arg(long)]
        direct_url: Option<String>,
        #[arg(long)]
        role: String,
        #[arg(long, value_enum)]
        timing: Timing,
        #[arg(long, value_parser = humantime::parse_duration)]
        write_every: Duration,
        #[arg(long, value_enum, default_value = "scheduler")]
        driver: Driver,
    },
    /// (child process) A worker replica with the chaos run's settings.
    #[command(hide = true)]
    Worker(WorkerFlags),
}

/// How the drill processes reach Postgres; neither flag: statements straight
/// to Postgres and no coordination session (leases alone, the pre-issue-12 run).
#[derive(Debug, clap::Args)]
struct ModeFlags {
    /// A coordination session straight to Postgres (with `--pooled`: the direct URL beside the pooled one).
    #[arg(long)]
    direct: bool,
    /// Statements through PgBouncer in transaction mode.
    #[arg(long)]
    pooled: bool,
}

impl ModeFlags {
    fn mode(&self) -> Mode {
        Mode::from_flags(self.direct, self.pooled)
    }
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Cmd::Failover {
            trials,
            timing,
            scenarios,
            mode,
            driver,
            out,
        } => cmd_failover(trials, timing, mode.mode(), driver, scenarios, &out).await?,
        Cmd::Idle {
            replicas,
            over,
            timing,
            mode,
            out,
        } => {
            let env = Env::start(timing, std::env::current_exe()?, mode.mode()).await?;
            let load = idle::measure(&env, replicas, over).await?;
            let csv = idle::write_csv(&out, &env, &load)?;
            println!("{}", idle::summary(&env, &load));
            println!("statements: {}", csv.display());
        }
        Cmd::Promotion {
            trials,
            timing,
            down_for,
            out,
        } => cmd_promotion(trials, promotion::Plan { timing, down_for }, &out).await?,
        Cmd::Patroni { rounds, timing, out } => ticklease_bench::patroni::run(rounds, timing, &out).await?,
        Cmd::Chaos {
            replicas,
            faults,
            seed,
            timing,
            pooled,
            out,
        } => {
            let seed = seed.unwrap_or_else(rand::random);
            let p = if pooled { " --pooled" } else { "" };
            println!("chaos seed {seed} (rerun: ticklease-bench chaos --replicas {replicas} --faults {faults} --seed {seed}{p})");
            let exe = std::env::current_exe()?;
            let report = chaos::run(&ChaosOptions {
                replicas,
                faults,
                seed,
                timing,
                exe,
                pooled,
            })
            .await?;
            println!("{report:#?}");
            let svg = out.join("chaos-timeline.svg");
            std::fs::create_dir_all(&out)?;
            report.timeline.write_svg(
                &svg,
                &format!("Chaos: {replicas} replicas, {faults} faults, seed {seed}{p}"),
            )?;
            println!("timeline: {}", svg.display());
            if !report.ok() {
                anyhow::bail!("chaos seed {seed}: {} violations", report.violations.len());
            }
        }
        Cmd::Schedules {
            replicas,
            roles,
            occurrences,
            every,
            timing,
            pool,
            family,
            out,
        } => {
            let mut options = SchedulesOptions {
                replicas,
                roles,
                occurrences,
                every_secs: every,
                timing,
                coordinated: true,
                pool,
                family: false,
            };
            options.family = family;
            let mut runs = Vec::new();
            for coordinated in [true, false] {
                options.coordinated = coordinated;
                let run = schedules::run(&options).await?;
                println!(
                    "{run:?}",
                    run = (&run.label, run.completed, run.duplicates, run.missed, run.lag())
                );
                runs.push(run);
            }
            println!("{}", schedules::write(&out, &options, &runs)?.display());
        }
        Cmd::RunFailover {
            trials,
            ticklease,
            out,
        } => {
            let me = std::env::current_exe()?;
            let results = ticklease_bench::run_failover::run(&ticklease, &me, trials).await?;
            for t in &results {
                println!("{t:?}");
            }
            println!(
                "{}",
                ticklease_bench::run_failover::write(&out, &results)?.display()
            );
        }
        Cmd::BlackBox {
            rounds,
            ticklease,
            only,
            clients,
            out,
        } => {
            use ticklease_bench::black_box::bench;
            let paths = bench::Paths {
                bench: std::env::current_exe()?,
                ticklease: std::fs::canonicalize(&ticklease)?,
                root: std::env::current_dir()?,
            };
            let clients = bench::choose(bench::repository_clients(&paths), &only, clients)?;
            let reports = bench::run(&clients, rounds, &out).await?;
            let violations: usize = reports.iter().map(|r| r.violations.len()).sum();
            anyhow::ensure!(violations == 0, "{violations} violation(s)");
        }
        Cmd::BlackBoxClient => ticklease_bench::black_box::client::run().await?,
        Cmd::AdvisoryHolder { url, key, command } => {
            ticklease_bench::run_failover::advisory_holder(&url, key, &command).await?;
        }
        Cmd::Plot { dir } => {
            let mut any = false;
            for timing in [Timing::Default, Timing::Scaled, Timing::LongLease] {
                if let Some(svg) = ticklease_bench::plot::failover_svg(&dir, timing.as_str())? {
                    println!("{}", svg.display());
                    any = true;
                }
            }
            if !any {
                anyhow::bail!("no failover-<timing>-<mode>.csv in {}", dir.display());
            }
        }
        Cmd::Scale {
            replicas,
            keys,
            over,
            kill,
            baseline_over,
            timing,
            pool,
            baseline_pool,
            out,
            assert,
        } => {
            let options = ScaleOptions {
                replicas,
                keys,
                over,
                kill,
                baseline_over,
                timing,
                pool,
                baseline_pool: baseline_pool.unwrap_or_else(|| scale::baseline_pool(replicas)),
                exe: std::env::current_exe()?,
            };
            cmd_scale(options, &out, assert).await?;
        }
        Cmd::Fence {
            runs,
            secs,
            clients,
            shapes,
            prepared,
            candidates,
            protocol,
            csv,
        } => {
            let report = ticklease_bench::fence_cost::run(ticklease_bench::fence_cost::FenceOptions {
                runs,
                secs,
                clients,
                shapes,
                prepared,
                candidates,
                protocol,
            })
            .await?;
            println!("PostgreSQL {}, {} s per run", report.server_version, secs);
            println!("{}", report.table());
            println!("{}", report.load());
            println!("runs: {}", report.write_csv(&csv)?.display());
            println!(
                "took {}",
                humantime::format_duration(Duration::from_secs(report.took.as_secs()))
            );
        }
        Cmd::ScaleReplica(flags) => scale_replica::run(flags).await?,
        Cmd::Leader {
            url,
            direct_url,
            role,
            timing,
            write_every,
            driver,
        } => {
            drill::run(
                &url,
                direct_url.as_deref(),
                &role,
                timing.config(),
                write_every,
                driver,
            )
            .await?
        }
        Cmd::Worker(flags) => {
            let config = flags.config()?;
            let shutdown = tokio_util::sync::CancellationToken::new();
            ticklease::cancel_on_signals(shutdown.clone())?;
            ticklease_worker::worker::run(config, shutdown).await?;
        }
    }
    Ok(())
}

/// Runs the failover trials and writes the CSV and markdown reports to `out`.
async fn cmd_failover(
    trials: usize,
    timing: Timing,
    mode: Mode,
    driver: Driver,
    scenarios: Vec<Scenario>,
    out: &std::path::Path,
) -> anyhow::Result<()> {
    let mut env = Env::start(timing, std::env::current_exe()?, mode).await?;
    env.driver = driver;
    let scenarios = if scenarios.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        scenarios
    };
    let mut all = Vec::new();
    let bar = ticklease_bench::progress(scenarios.len() * trials, "failover trials");
    for s in scenarios {
        for n in 0..trials {
            bar.set_message(s.as_str());
            let t = failover::trial(&env, s, n).await?;
            bar.inc(1);
            bar.suspend(|| eprintln!(
                "{} {} #{n}: fault → claim {:.0} ms, takeover {:?} ms, gap {:.0} ms, pause → ended {:?} ms, stale writes {}",
                mode.as_str(),
                s.as_str(),
                t.fault_to_claim_ms,
                t.takeover_ms,
                t.gap_ms,
                t.pause_to_cancel_ms,
                t.stale_writes
            ));
            all.push(t);
        }
    }
    bar.finish_and_clear();
    let csv = failover::write_csv(out, timing, mode, &all)?;
    let version: String = ticklease_testkit::scalar(
        &ticklease_testkit::connect(&env.cluster.config(&env.db)).await?,
        "SELECT current_setting('server_version')",
    )
    .await;
    let md = failover::write_markdown(out, timing, mode, &all, &version)?;
    let svg = ticklease_bench::plot::failover_svg(out, timing.as_str())?;
    println!("report: {}", md.display());
    println!("{}", failover::table(&all));
    println!("raw trials: {}", csv.display());
    if let Some(svg) = svg {
        println!("plot: {}", svg.display());
    }
    Ok(())
}

/// Runs the scale bench, writes its reports to `out`, and with `assert`
/// fails unless no term was lost and the spread stayed within bounds.
async fn cmd_scale(options: ScaleOptions, out: &std::path::Path, assert: bool) -> anyhow::Result<()> {
    let report = scale::run(options).await?;
    for path in scale::write_reports(out, &report)? {
        println!("{}", path.display());
    }
    println!("{}", report.command());
    println!("{}", report.table());
    print!("{}", report.takeover_and_ratio());
    for goal in report.goals() {
        let met = if goal.met { "met" } else { "MISSED" };
        println!("{met}: {}: {}", goal.what, goal.measured);
    }
    println!(
        "took {}",
        humantime::format_duration(Duration::from_secs(report.took.as_secs()))
    );
    if assert && !report.assert_ok() {
        anyhow::bail!(
            "scale: {} lost terms, spread {:?} (must be 0 and within ±20 %)",
            report.family.window.lost(),
            report.family.window.spread
        );
    }
    Ok(())
}

/// Runs the switchover trials and writes the CSV and markdown reports to `out`.
async fn cmd_promotion(trials: usize, plan: promotion::Plan, out: &std::path::Path) -> anyhow::Result<()> {
    let exe = std::env::current_exe()?;
    let mut all = Vec::new();
    let bar = ticklease_bench::progress(trials, "promotion trials");
    for n in 0..trials {
        let t = promotion::trial(&exe, plan, n).await?;
        bar.inc(1);
        bar.suspend(|| {
            eprintln!(
                "promotion #{n}: switchover {:?}; claim {:?}, lease {:?} after; new term {}, stale writes {}",
                t.switchover, t.led_again, t.lease_again, t.new_term, t.stale_writes
            )
        });
        all.push(t);
    }
    bar.finish_and_clear();
    let md = promotion::write_reports(out, plan, &all)?;
    println!("report: {}", md.display());
    println!("{}", promotion::table(plan, &all));
    Ok(())
}
