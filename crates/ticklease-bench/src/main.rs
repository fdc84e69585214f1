//! `ticklease-bench`: the failover benchmark and the chaos run.

mod cli;
mod commands;

use clap::Parser;
use cli::{Cli, Cmd};
use ticklease_bench::scale_replica;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Cmd::Failover(args) => commands::failover(args).await,
        Cmd::Idle(args) => commands::idle(args).await,
        Cmd::Promotion(args) => commands::promotion(args).await,
        Cmd::Patroni(args) => commands::patroni(args).await,
        Cmd::Chaos(args) => commands::chaos(args).await,
        Cmd::Schedules(args) => commands::schedules(args).await,
        Cmd::RunFailover(args) => commands::run_failover(args).await,
        Cmd::BlackBox(args) => commands::black_box(args).await,
        Cmd::BlackBoxClient => ticklease_bench::black_box::client::run().await,
        Cmd::AdvisoryHolder(args) => commands::advisory_holder(args).await,
        Cmd::Plot(args) => commands::plot(args),
        Cmd::Scale(args) => commands::scale(args).await,
        Cmd::Fence(args) => commands::fence(args).await,
        Cmd::ScaleReplica(flags) => scale_replica::run(flags).await,
        Cmd::Leader(args) => commands::leader(args).await,
        Cmd::Worker(flags) => commands::worker(flags).await,
    }
}
