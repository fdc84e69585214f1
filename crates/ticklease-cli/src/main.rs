//! `ticklease`: the operator's command. Thin: the logic lives in the library.
//!
//! Exit codes: 0 ok, 1 operational error (unknown role, database unreachable,
//! schema not migrated, permission denied), 2 usage error.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use clap::{Parser, Subcommand};
use ticklease::{LeaseStatus, LeaseStore, MigrateOptions, PgStore, Role};

#[derive(Parser)]
#[command(
    name = "ticklease",
    version,
    about = "Leader leases for singleton background jobs on Postgres"
)]
struct Cli {
    /// Postgres connection URL (`migrate` and `grant` want the schema owner on a direct or session-mode connection).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    database_url: Option<String>,
    #[command(subcommand)]
    command: Command,
}

const ROLES_HELP: &str = "Database roles: the application role gets SELECT and a column-scoped UPDATE on \
leader_leases and EXECUTE on leader_acquire/leader_seed (SECURITY DEFINER); the operator role gets EXECUTE on \
leader_pause/leader_unpause/leader_run_now and SELECT on leader_status. Both are created NOLOGIN if missing; \
grant them to login users: GRANT ticklease_app TO my_service;";

#[derive(Subcommand)]
enum Command {
    /// Apply the schema migrations (safe to run from several replicas at once).
    #[command(after_help = format!("{ROLES_HELP}\n\nExamples:\n  ticklease migrate --database-url postgres://owner@db/app\n  ticklease migrate --app-role billing_svc --operator-role oncall"))]
    Migrate {
        #[command(flatten)]
        roles: RoleNames,
    },
    /// Grant the application and operator roles again (for example under other names).
    #[command(after_help = format!("{ROLES_HELP}\n\nExamples:\n  ticklease grant --app-role billing_svc --operator-role oncall"))]
    Grant {
        #[command(flatten)]
        roles: RoleNames,
    },
    /// Show who leads what: holder, token, held for, expires in, pause, last tick age, cooldown.
    #[command(
        after_help = "Examples:\n  ticklease status\n  ticklease status --json | jq '.[] | select(.paused_by)'\n  ticklease status --watch"
    )]
    Status {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
        /// Redraw every second until Ctrl-C.
        #[arg(long, conflicts_with = "json")]
        watch: bool,
    },
    /// Pause a role: ends its current term now and refuses ACQUIRE on every replica.
    #[command(
        after_help = "Examples:\n  ticklease pause email_outbox --by alice --reason 'SMTP key rotation'"
    )]
    Pause {
        role: Role,
        /// Who pauses (shown in status).
        #[arg(long)]
        by: String,
        /// Why (shown in status).
        #[arg(long)]
        reason: String,
    },
    /// Unpause a role: due again at the next poll (a cooldown stays; see run-now).
    #[command(after_help = "Examples:\n  ticklease unpause email_outbox")]
    Unpause { role: Role },
    /// Clear a role's cooldown (not_before) so it runs at its next poll once due.
    #[command(
        after_help = "Examples:\n  ticklease run-now billing   # after the fix for a panicking tick shipped"
    )]
    RunNow { role: Role },
    /// List the role rows present, and compare them with the roles an application declares.
    #[command(
        after_help = "Examples:\n  ticklease roles\n  ticklease roles --declared billing,dunning,email_outbox"
    )]
    Roles {
        /// The roles the application declares, comma-separated.
        #[arg(long, value_delimiter = ',')]
        declared: Vec<Role>,
    },
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

#[derive(clap::Args)]
struct RoleNames {
    /// The application's database role.
    #[arg(long, default_value = "ticklease_app")]
    app_role: String,
    /// The operators' database role.
    #[arg(long, default_value = "ticklease_operator")]
    operator_role: String,
}

impl RoleNames {
    fn options(self) -> MigrateOptions {
        MigrateOptions {
            app_role: self.app_role,
            operator_role: self.operator_role,
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let Some(url) = cli.database_url else {
        eprintln!("ticklease: --database-url (or DATABASE_URL) is required");
        return ExitCode::from(2);
    };
    match run(&url, cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ticklease: {e:#}");
            ExitCode::from(1)
        }
    }
}

async fn run(url: &str, command: Command) -> anyhow::Result<()> {
    let config: tokio_postgres::Config = url.parse().context("invalid --database-url")?;
    let target = describe(&config);
    match command {
        Command::Migrate { roles } => {
            let mut client = connect(&config, &target).await?;
            let report = ticklease::migrate_with(&mut client, &roles.options()).await?;
            println!(
                "migrations applied: {:?}; already applied: {:?}",
                report.applied, report.already_applied
            );
        }
        Command::Grant { roles } => {
            let options = roles.options();
            ticklease::migrate::grant(&connect(&config, &target).await?, &options).await?;
            println!(
                "granted {} (application) and {} (operator)",
                options.app_role, options.operator_role
            );
        }
        Command::Status { json, watch } => {
            let store = store(config, &target).await?;
            if json {
                println!(
                    "{}",
                    serde_json::to_string_pretty(&status_json(&store.status().await?))?
                );
            } else if watch {
                loop {
                    let table = status_table(&store.status().await?);
                    print!("\x1b[2J\x1b[H{table}");
                    tokio::select! {
                        _ = tokio::signal::ctrl_c() => break,
                        _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                    }
                }
            } else {
                print!("{}", status_table(&store.status().await?));
            }
        }
        Command::Pause { role, by, reason } => {
            let store = store(config, &target).await?;
            let paused = store
                .pause(&role, &by, &reason)
                .await
                .with_context(|| format!("could not pause {role}"))?;
            println!(
                "{role}: {}",
                if paused {
                    "paused"
                } else {
                    "was already paused (unchanged)"
                }
            );
        }
        Command::Unpause { role } => {
            let store = store(config, &target).await?;
            let unpaused = store
                .unpause(&role)
                .await
                .with_context(|| format!("could not unpause {role}"))?;
            println!("{role}: {}", if unpaused { "unpaused" } else { "was not paused" });
        }
        Command::RunNow { role } => {
            let store = store(config, &target).await?;
            let cleared = store
                .run_now(&role)
                .await
                .with_context(|| format!("could not clear {role}'s cooldown"))?;
            println!(
                "{role}: {}",
                if cleared {
                    "cooldown cleared"
                } else {
                    "had no cooldown"
                }
            );
        }
        Command::Roles { declared } => {
            let rows = store(config, &target).await?.status().await?;
            let present: Vec<&str> = rows.iter().map(|r| r.role.as_str()).collect();
            for name in &present {
                let mark = if declared.is_empty() || declared.iter().any(|d| d.as_str() == *name) {
                    ""
                } else {
                    "  (undeclared)"
                };
                println!("{name}{mark}");
            }
            for missing in declared.iter().filter(|d| !present.contains(&d.as_str())) {
                println!("{missing}  (declared, no row yet: seeded when a replica starts)");
            }
        }
        Command::Metrics { metrics_addr, prefix } => {
            let store = store(config, &target).await?;
            let roles = store
                .status()
                .await?
                .into_iter()
                .map(|s| Role::new(s.role))
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
            ticklease::metrics::serve(listener, Arc::new(registry), metrics, store, shutdown).await?;
        }
    }
    Ok(())
}

fn describe(config: &tokio_postgres::Config) -> String {
    let host = match config.get_hosts().first() {
        Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
        Some(tokio_postgres::config::Host::Unix(p)) => p.display().to_string(),
        None => "localhost".into(),
    };
    let port = config.get_ports().first().copied().unwrap_or(5432);
    format!("{host}:{port}/{}", config.get_dbname().unwrap_or_default())
}

async fn connect(config: &tokio_postgres::Config, target: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = config
        .connect(tokio_postgres::NoTls)
        .await
        .with_context(|| format!("could not connect to the database at {target}"))?;
    tokio::spawn(connection);
    Ok(client)
}

async fn store(config: tokio_postgres::Config, target: &str) -> anyhow::Result<PgStore> {
    let options = ticklease::PgStoreOptions::from_config(&ticklease::Config::default());
    PgStore::connect(config, options).await.map_err(|e| match e {
        ticklease::StoreError::Connect { .. } | ticklease::StoreError::Timeout { .. } => {
            anyhow::Error::new(e).context(format!("could not connect to the database at {target}"))
        }
        other => other.into(),
    })
}

/// `later - earlier` in seconds, signed.
fn seconds(later: SystemTime, earlier: SystemTime) -> f64 {
    match later.duration_since(earlier) {
        Ok(d) => d.as_secs_f64(),
        Err(e) => -e.duration().as_secs_f64(),
    }
}

fn short(seconds: f64) -> String {
    let s = seconds.max(0.0);
    match s {
        s if s < 60.0 => format!("{s:.1}s"),
        s if s < 3600.0 => format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64),
        s if s < 86400.0 => format!("{}h{:02}m", (s / 3600.0) as u64, ((s % 3600.0) / 60.0) as u64),
        s => format!("{}d{:02}h", (s / 86400.0) as u64, ((s % 86400.0) / 3600.0) as u64),
    }
}

fn status_table(rows: &[LeaseStatus]) -> String {
    let header = [
        "ROLE",
        "HOLDER",
        "TOKEN",
        "HELD FOR",
        "EXPIRES IN",
        "PAUSED BY / WHY",
        "LAST TICK AGE",
        "NOT BEFORE",
    ];
    let mut lines: Vec<[String; 8]> = vec![header.map(String::from)];
    for r in rows {
        let held = r.held;
        lines.push([
            r.role.clone(),
            if held {
                r.holder_id.clone().unwrap_or_default()
            } else {
                "-".into()
            },
            r.token.to_string(),
            r.acquired_at
                .filter(|_| held)
                .map(|t| short(seconds(r.db_now, t)))
                .unwrap_or_else(|| "-".into()),
            r.remaining
                .map(|d| short(d.as_secs_f64()))
                .unwrap_or_else(|| "-".into()),
            match (&r.paused_by, &r.pause_reason) {
                (Some(by), why) => format!("{by}: {}", why.clone().unwrap_or_default()),
                _ => "-".into(),
            },
            r.last_tick_ended_at
                .map(|t| short(seconds(r.db_now, t)))
                .unwrap_or_else(|| "never".into()),
            r.not_before
                .map(|t| {
                    let wait = seconds(t, r.db_now);
                    if wait > 0.0 {
                        format!("in {}", short(wait))
                    } else {
                        "passed".into()
                    }
                })
                .unwrap_or_else(|| "-".into()),
        ]);
    }
    let widths: Vec<usize> = (0..8)
        .map(|i| lines.iter().map(|l| l[i].chars().count()).max().unwrap_or(0))
        .collect();
    let mut out = String::new();
    for line in &lines {
        let cells: Vec<String> = line
            .iter()
            .zip(&widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn status_json(rows: &[LeaseStatus]) -> serde_json::Value {
    let time = |t: Option<SystemTime>| t.map(|t| humantime::format_rfc3339_millis(t).to_string());
    serde_json::Value::Array(
        rows.iter()
            .map(|r| {
                serde_json::json!({
                    "role": r.role,
                    "held": r.held,
                    "holder_id": r.holder_id,
                    "token": r.token.get(),
                    "acquired_at": time(r.acquired_at),
                    "expires_at": time(r.expires_at),
                    "db_now": time(Some(r.db_now)),
                    "remaining_seconds": r.remaining.map(|d| d.as_secs_f64()),
                    "paused_at": time(r.paused_at),
                    "paused_by": r.paused_by,
                    "pause_reason": r.pause_reason,
                    "last_tick_ended_at": time(r.last_tick_ended_at),
                    "last_tick_age_seconds": r.last_tick_ended_at.map(|t| seconds(r.db_now, t).max(0.0)),
                    "last_tick_holder": r.last_tick_holder,
                    "not_before": time(r.not_before),
                })
            })
            .collect(),
    )
}
