//! `ticklease`: the operator's command. Thin: the logic lives in the library.

use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "ticklease",
    version,
    about = "Leader leases for singleton background jobs on Postgres"
)]
struct Cli {
    /// Postgres connection URL (a direct or session-mode connection for `migrate`).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Apply the ticklease schema migrations (safe to run from several replicas at once).
    #[command(
        after_help = "Examples:\n  ticklease migrate --database-url postgres://app@db/app\n  DATABASE_URL=postgres://app@db/app ticklease migrate"
    )]
    Migrate,
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    match run(cli).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ticklease: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(cli: Cli) -> anyhow::Result<()> {
    let Some(url) = cli.database_url else {
        eprintln!("ticklease: --database-url (or DATABASE_URL) is required");
        std::process::exit(2);
    };
    let config: tokio_postgres::Config = url.parse().context("invalid --database-url")?;
    match cli.command {
        Command::Migrate => {
            let (mut client, connection) = config
                .connect(tokio_postgres::NoTls)
                .await
                .context("could not connect to the database")?;
            tokio::spawn(connection);
            let report = ticklease::migrate(&mut client).await?;
            println!(
                "migrations applied: {:?}; already applied: {:?}",
                report.applied, report.already_applied
            );
        }
    }
    Ok(())
}
