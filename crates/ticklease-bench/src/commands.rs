//! One function per subcommand of `ticklease-bench`: each sets its bench up
//! from the parsed flags, runs it, and prints where its reports went.

use std::time::Duration;

use ticklease_bench::black_box::bench;
use ticklease_bench::chaos::{self, ChaosOptions, WorkerFlags};
use ticklease_bench::failover::{self, Env, Mode, Scenario, Trial};
use ticklease_bench::fence_cost::{self, FenceOptions};
use ticklease_bench::scale::{self, ScaleOptions};
use ticklease_bench::schedules::{self, SchedulesOptions};
use ticklease_bench::{drill, idle, patroni, plot, promotion, run_failover, Timing};

use crate::cli::{
    AdvisoryHolderArgs, BlackBoxArgs, ChaosArgs, FailoverArgs, FenceArgs, IdleArgs, LeaderArgs, PatroniArgs,
    PlotArgs, PromotionArgs, RunFailoverArgs, ScaleArgs, SchedulesArgs,
};

/// Runs the failover trials and writes the CSV and markdown reports to `out`.
pub async fn failover(args: FailoverArgs) -> anyhow::Result<()> {
    let mode = args.mode.mode();
    let mut env = Env::start(args.timing, std::env::current_exe()?, mode).await?;
    env.driver = args.driver;
    let scenarios = if args.scenarios.is_empty() {
        Scenario::ALL.to_vec()
    } else {
        args.scenarios
    };
    let all = failover_trials(&env, mode, scenarios, args.trials).await?;
    let out = &args.out;
    let csv = failover::write_csv(out, args.timing, mode, &all)?;
    let version: String = ticklease_testkit::scalar(
        &ticklease_testkit::connect(&env.cluster.config(&env.db)).await?,
        "SELECT current_setting('server_version')",
    )
    .await;
    let md = failover::write_markdown(out, args.timing, mode, &all, &version)?;
    let svg = plot::failover_svg(out, args.timing.as_str())?;
    println!("report: {}", md.display());
    println!("{}", failover::table(&all));
    println!("raw trials: {}", csv.display());
    if let Some(svg) = svg {
        println!("plot: {}", svg.display());
    }
    Ok(())
}

/// `trials` trials of each scenario, each logged on stderr under the progress bar.
async fn failover_trials(
    env: &Env,
    mode: Mode,
    scenarios: Vec<Scenario>,
    trials: usize,
) -> anyhow::Result<Vec<Trial>> {
    let mut all = Vec::new();
    let bar = ticklease_bench::progress(scenarios.len() * trials, "failover trials");
    for s in scenarios {
        for n in 0..trials {
            bar.set_message(s.as_str());
            let t = failover::trial(env, s, n).await?;
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
    Ok(all)
}

/// Measures the idle load of `replicas` replicas and writes it as CSV.
pub async fn idle(args: IdleArgs) -> anyhow::Result<()> {
    let env = Env::start(args.timing, std::env::current_exe()?, args.mode.mode()).await?;
    let load = idle::measure(&env, args.replicas, args.over).await?;
    let csv = idle::write_csv(&args.out, &env, &load)?;
    println!("{}", idle::summary(&env, &load));
    println!("statements: {}", csv.display());
    Ok(())
}

/// Runs the switchover trials and writes the CSV and markdown reports to `out`.
pub async fn promotion(args: PromotionArgs) -> anyhow::Result<()> {
    let plan = promotion::Plan {
        timing: args.timing,
        down_for: args.down_for,
    };
    let exe = std::env::current_exe()?;
    let mut all = Vec::new();
    let bar = ticklease_bench::progress(args.trials, "promotion trials");
    for n in 0..args.trials {
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
    let md = promotion::write_reports(&args.out, plan, &all)?;
    println!("report: {}", md.display());
    println!("{}", promotion::table(plan, &all));
    Ok(())
}

/// Runs the Patroni failover rounds over every combination of the settings
/// given (the module writes its report).
pub async fn patroni(args: PatroniArgs) -> anyhow::Result<()> {
    let mut setups = Vec::new();
    for &replication in &args.replication {
        for &word in &args.patroni_word {
            for &direct in &args.direct {
                setups.push(patroni::Setup {
                    replication,
                    word,
                    direct,
                });
            }
        }
    }
    patroni::run(args.rounds, args.timing, &setups, &args.out).await
}

/// Runs the chaos run, draws its timeline, and fails on any violation; the
/// seed is printed first so that a failure can be rerun.
pub async fn chaos(args: ChaosArgs) -> anyhow::Result<()> {
    let ChaosArgs {
        replicas,
        faults,
        seed,
        timing,
        pooled,
        out,
    } = args;
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
    Ok(())
}

/// Runs the schedules bench with coordination sessions, then without, and
/// writes both runs side by side.
pub async fn schedules(args: SchedulesArgs) -> anyhow::Result<()> {
    let mut options = SchedulesOptions {
        replicas: args.replicas,
        roles: args.roles,
        occurrences: args.occurrences,
        every_secs: args.every,
        timing: args.timing,
        coordinated: true,
        pool: args.pool,
        family: args.family,
    };
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
    println!("{}", schedules::write(&args.out, &options, &runs)?.display());
    Ok(())
}

/// Runs the `ticklease run` failover trials and writes them to `out`.
pub async fn run_failover(args: RunFailoverArgs) -> anyhow::Result<()> {
    let me = std::env::current_exe()?;
    let results = run_failover::run(&args.ticklease, &me, args.trials).await?;
    for t in &results {
        println!("{t:?}");
    }
    println!("{}", run_failover::write(&args.out, &results)?.display());
    Ok(())
}

/// Runs the black-box check of the chosen clients; fails on any violation.
pub async fn black_box(args: BlackBoxArgs) -> anyhow::Result<()> {
    let paths = bench::Paths {
        bench: std::env::current_exe()?,
        ticklease: std::fs::canonicalize(&args.ticklease)?,
        root: std::env::current_dir()?,
    };
    let clients = bench::choose(bench::repository_clients(&paths), &args.only, args.clients)?;
    let reports = bench::run(&clients, args.rounds, &args.out).await?;
    let violations: usize = reports.iter().map(|r| r.violations.len()).sum();
    anyhow::ensure!(violations == 0, "{violations} violation(s)");
    Ok(())
}

/// Holds the advisory lock for run-failover's baseline while its command runs.
pub async fn advisory_holder(args: AdvisoryHolderArgs) -> anyhow::Result<()> {
    run_failover::advisory_holder(&args.url, args.key, &args.command).await
}

/// Draws `failover-<timing>.svg` for each timing that has CSVs in `dir`.
pub fn plot(args: PlotArgs) -> anyhow::Result<()> {
    let mut any = false;
    for timing in [Timing::Default, Timing::Scaled, Timing::LongLease] {
        if let Some(svg) = plot::failover_svg(&args.dir, timing.as_str())? {
            println!("{}", svg.display());
            any = true;
        }
    }
    if !any {
        anyhow::bail!("no failover-<timing>-<mode>.csv in {}", args.dir.display());
    }
    Ok(())
}

/// Runs the scale bench, writes its reports to `out`, and with `--assert`
/// fails unless no term was lost and the spread stayed within bounds.
pub async fn scale(args: ScaleArgs) -> anyhow::Result<()> {
    let options = ScaleOptions {
        replicas: args.replicas,
        keys: args.keys,
        over: args.over,
        kill: args.kill,
        baseline_over: args.baseline_over,
        timing: args.timing,
        pool: args.pool,
        baseline_pool: args
            .baseline_pool
            .unwrap_or_else(|| scale::baseline_pool(args.replicas)),
        exe: std::env::current_exe()?,
    };
    let report = scale::run(options).await?;
    for path in scale::write_reports(&args.out, &report)? {
        println!("{}", path.display());
    }
    println!("{}", report.command());
    println!("{}", report.table());
    print!("{}", report.takeover_and_ratio());
    for goal in report.goals() {
        let met = if goal.met { "met" } else { "MISSED" };
        println!("{met}: {}: {}", goal.what, goal.measured);
    }
    println!("took {}", whole_seconds(report.took));
    if args.assert && !report.assert_ok() {
        anyhow::bail!(
            "scale: {} lost terms, spread {:?} (must be 0 and within ±20 %)",
            report.family.window.lost(),
            report.family.window.spread
        );
    }
    Ok(())
}

/// Runs the fence-cost pgbench runs, prints the table and writes them as CSV and SVG.
pub async fn fence(args: FenceArgs) -> anyhow::Result<()> {
    let secs = args.secs;
    let report = fence_cost::run(FenceOptions {
        runs: args.runs,
        secs,
        clients: args.clients,
        shapes: args.shapes,
        prepared: args.prepared,
        candidates: args.candidates,
        protocol: args.protocol,
    })
    .await?;
    println!("PostgreSQL {}, {} s per run", report.server_version, secs);
    println!("{}", report.table());
    println!("{}", report.load());
    println!(
        "runs: {}",
        report.write_csv(&args.out.join("fence-cost.csv"))?.display()
    );
    println!(
        "plot: {}",
        report.write_svg(&args.out.join("fence-cost.svg"))?.display()
    );
    println!("took {}", whole_seconds(report.took));
    Ok(())
}

/// (child process) Leads the drill's role, writing fenced rows while it leads.
pub async fn leader(args: LeaderArgs) -> anyhow::Result<()> {
    drill::run(
        &args.url,
        args.direct_url.as_deref(),
        &args.role,
        args.timing.config(),
        args.write_every,
        args.driver,
    )
    .await
}

/// (child process) Runs a worker replica until a signal cancels it.
pub async fn worker(flags: WorkerFlags) -> anyhow::Result<()> {
    let config = flags.config()?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    ticklease::cancel_on_signals(shutdown.clone())?;
    ticklease_worker::worker::run(config, shutdown).await?;
    Ok(())
}

/// A run's duration to the second, as humantime prints it ("1h 2m 3s"):
/// sub-second digits would only be noise in a run of minutes.
fn whole_seconds(took: Duration) -> humantime::FormattedDuration {
    humantime::format_duration(Duration::from_secs(took.as_secs()))
}
