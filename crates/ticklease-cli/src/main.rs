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
    /// Serve the cluster-fact metrics of every role in leader_leases on /metrics, and /healthz.
    #[command(
        after_help = "Examples:\n  ticklease metrics --metrics-addr 0.0.0.0:9187\n  ticklease metrics --metrics-addr 127.0.0.1:0 --prefix myapp"
    )]
    Metrics {
        /// Address to listen on (port 0 picks a free port; the bound address is printed).
        #[arg(long, default_value = "127.0.0.1:9187")]
        metrics_addr: std::net::SocketAddr,
        /// Metric name prefix.
        #[arg(long, default_value = "ticklease")]
        prefix: String,
    },
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
        Command::Metrics { metrics_addr, prefix } => {
            let store = connect_store(config).await?;
            let roles = ticklease::LeaseStore::status(&store)
                .await?
                .into_iter()
                .map(|s| ticklease::Role::new(s.role))
                .collect::<Result<Vec<_>, _>>()?;
            let mut registry = prometheus_client::registry::Registry::with_prefix(prefix);
            let metrics = ticklease::Metrics::register(&mut registry, roles);
            let listener = tokio::net::TcpListener::bind(metrics_addr)
                .await
                .with_context(|| format!("could not listen on {metrics_addr}"))?;
            println!(
                "serving /metrics and /healthz on http://{}",
                listener.local_addr()?
            );
            let shutdown = tokio_util::sync::CancellationToken::new();
            let stop = shutdown.clone();
            tokio::spawn(async move {
                let _ = tokio::signal::ctrl_c().await;
                stop.cancel();
            });
            ticklease::metrics::serve(listener, std::sync::Arc::new(registry), metrics, store, shutdown)
                .await?;
        }
    }
    Ok(())
}

async fn connect_store(config: tokio_postgres::Config) -> anyhow::Result<ticklease::PgStore> {
    let options = ticklease::PgStoreOptions::from_config(&ticklease::Config::default());
    Ok(ticklease::PgStore::connect(config, options).await?)
}
