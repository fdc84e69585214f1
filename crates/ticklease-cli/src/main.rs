//! `ticklease`: the operator's command. Thin: the logic lives in the library.
//!
//! Exit codes: 0 ok, 1 operational error (unknown role, database unreachable,
//! schema not migrated, permission denied), 2 usage error.

mod demo;

use std::io::Write;
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

const ROLES_HELP: &str = "Database roles: the application role gets SELECT on leader_leases and EXECUTE on \
leader_acquire/leader_renew/leader_release/leader_seed/leader_fence (SECURITY DEFINER, its only way to write \
the table); the operator role gets EXECUTE on \
leader_pause/leader_unpause/leader_run_now and SELECT on leader_status. Both are created NOLOGIN if missing; \
grant them to login users: GRANT ticklease_app TO my_service;";

// Parsed once per process: the size of the worker's flags does not matter.
#[allow(clippy::large_enum_variant)]
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
    /// Run the reference worker (the spec's five roles on five fenced stores), or set it up.
    #[command(
        after_help = "Examples:\n  ticklease worker migrate\n  ticklease worker seed --subscriptions 20 --emails 20 --events 20 --endpoint http://127.0.0.1:9000/hooks/a\n  ticklease worker --webhook-secret whsec_c2VjcmV0 --roles billing,dunning --tick-interval billing=1m\n  ticklease worker --webhook-secret s --lease-ttl 2s --heartbeat-every 300ms --statement-timeout 500ms \\\n      --abandon-after 1200ms --max-poll 200ms --metrics-addr 127.0.0.1:9188"
    )]
    Worker(WorkerCmd),
    /// A one-minute tour: throwaway Postgres, worker replicas, narrated failures, a report.
    #[command(
        after_help = "Examples:\n  ticklease demo\n  ticklease demo --replicas 4 --duration 2m\n  ticklease demo --database-url postgres://me@localhost/scratch --keep"
    )]
    Demo {
        /// Worker processes to start.
        #[arg(long, default_value_t = 3)]
        replicas: usize,
        /// How long the scripted run lasts (the drain may add a little).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
        duration: Duration,
        /// Leave the cluster and the workers running at the end, until Ctrl-C.
        #[arg(long)]
        keep: bool,
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
#[command(args_conflicts_with_subcommands = true)]
struct WorkerCmd {
    #[command(subcommand)]
    action: Option<WorkerAction>,
    #[command(flatten)]
    run: WorkerRun,
}

#[derive(Subcommand)]
enum WorkerAction {
    /// Apply the worker's own migrations (after `ticklease migrate`).
    Migrate,
    /// Insert a demo workload: subscriptions due now, emails, events, webhook endpoints.
    Seed {
        #[arg(long, default_value_t = 0)]
        subscriptions: i64,
        #[arg(long, default_value_t = 0)]
        emails: i64,
        #[arg(long, default_value_t = 0)]
        events: i64,
        /// A webhook endpoint URL (repeatable).
        #[arg(long = "endpoint")]
        endpoints: Vec<String>,
    },
}

#[derive(clap::Args)]
struct WorkerRun {
    /// Roles to run, comma-separated (default: all five).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "billing,dunning,webhook_outbox,email_outbox,webhook_delivery"
    )]
    roles: Vec<Role>,
    /// Serve /metrics and /healthz here.
    #[arg(long)]
    metrics_addr: Option<std::net::SocketAddr>,
    /// Base URL of the payment provider (POST {url}/charges with an Idempotency-Key).
    #[arg(long, default_value = "http://127.0.0.1:8081")]
    payments_url: String,
    /// SMTP relay, smtp://host:port (no TLS).
    #[arg(long, default_value = "smtp://127.0.0.1:2525")]
    smtp_url: String,
    /// Sender address of outbox emails.
    #[arg(long, default_value = "billing@ticklease.invalid")]
    mail_from: String,
    /// Standard Webhooks signing secret (`whsec_` + base64, or raw bytes).
    #[arg(long, env = "TICKLEASE_WEBHOOK_SECRET", hide_env_values = true)]
    webhook_secret: Option<String>,
    /// Lease TTL (default 10s).
    #[arg(long, value_parser = humantime::parse_duration)]
    lease_ttl: Option<Duration>,
    /// Heartbeat period (default 3s).
    #[arg(long, value_parser = humantime::parse_duration)]
    heartbeat_every: Option<Duration>,
    /// Statement timeout (default 2s).
    #[arg(long, value_parser = humantime::parse_duration)]
    statement_timeout: Option<Duration>,
    /// Abandon a tick this long after the last acknowledged beat (default 6s).
    #[arg(long, value_parser = humantime::parse_duration)]
    abandon_after: Option<Duration>,
    /// Longest wait between polls (default 5s).
    #[arg(long, value_parser = humantime::parse_duration)]
    max_poll: Option<Duration>,
    /// A role's tick interval, ROLE=DURATION (repeatable; default 5s).
    #[arg(long = "tick-interval", value_parser = parse_tick_interval)]
    tick_intervals: Vec<(Role, Duration)>,
    /// Rows claimed per tick.
    #[arg(long, default_value_t = 100,
          value_parser = clap::value_parser!(i64).range(1..=ticklease_worker::worker::BATCH_MAX))]
    batch_size: i64,
    /// Wait after a declined charge before the next attempt.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
    decline_backoff: Duration,
}

/// Ctrl-C, SIGTERM or SIGHUP (a closed terminal): the demo then cleans up.
async fn interrupted() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut hup)) = (signal(SignalKind::terminate()), signal(SignalKind::hangup())) else {
        let _ = tokio::signal::ctrl_c().await;
        return;
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
        _ = hup.recv() => {}
    }
}

/// Bad input found after parsing (exit code 2, like clap's own usage errors).
#[derive(Debug)]
struct Usage(String);

impl std::fmt::Display for Usage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Usage {}

fn parse_tick_interval(s: &str) -> Result<(Role, Duration), String> {
    let (role, duration) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected ROLE=DURATION"))?;
    let role = Role::new(role).map_err(|e| e.to_string())?;
    let parsed = humantime::parse_duration(duration).map_err(|e| format!("{duration:?}: {e}"))?;
    let max = ticklease::config::DURATION_MAX;
    if parsed.is_zero() || parsed > max {
        return Err(format!(
            "{role}={duration}: a tick interval must be greater than zero and at most {}",
            humantime::format_duration(max)
        ));
    }
    Ok((role, parsed))
}

impl WorkerRun {
    fn lease(&self) -> Result<ticklease::Config, ticklease::ConfigError> {
        let mut b = ticklease::Config::builder();
        if let Some(v) = self.lease_ttl {
            b = b.lease_ttl(v);
        }
        if let Some(v) = self.heartbeat_every {
            b = b.heartbeat_every(v);
        }
        if let Some(v) = self.statement_timeout {
            b = b.statement_timeout(v);
        }
        if let Some(v) = self.abandon_after {
            b = b.abandon_after(v);
        }
        if let Some(v) = self.max_poll {
            b = b.max_poll(v);
        }
        b.build()
    }

    fn config(
        self,
        database: ticklease::PgConnect,
    ) -> Result<ticklease_worker::worker::WorkerConfig, String> {
        let lease = self.lease().map_err(|e| e.to_string())?;
        let smtp = self.smtp_url.strip_prefix("smtp://").ok_or(format!(
            "--smtp-url {:?}: expected smtp://host:port",
            self.smtp_url
        ))?;
        let (host, port) = smtp.rsplit_once(':').ok_or(format!(
            "--smtp-url {:?}: expected smtp://host:port",
            self.smtp_url
        ))?;
        let port = port
            .parse()
            .map_err(|_| format!("--smtp-url {:?}: bad port", self.smtp_url))?;
        for role in &self.roles {
            if !ticklease_worker::ROLES.contains(&role.as_str()) {
                return Err(format!(
                    "--roles: {:?} is not one of {:?}",
                    role.as_str(),
                    ticklease_worker::ROLES
                ));
            }
        }
        Ok(ticklease_worker::worker::WorkerConfig {
            database,
            roles: self.roles,
            lease,
            tick_intervals: self.tick_intervals.into_iter().collect(),
            payments_url: self.payments_url,
            smtp_host: host.to_string(),
            smtp_port: port,
            mail_from: self.mail_from,
            webhook_secret: self
                .webhook_secret
                .ok_or("--webhook-secret (or TICKLEASE_WEBHOOK_SECRET) is required")?,
            metrics_addr: self.metrics_addr,
            batch_size: self.batch_size,
            decline_backoff: self.decline_backoff,
        })
    }
}

#[derive(clap::Args)]
struct RoleNames {
    /// The application's database role.
    #[arg(long, default_value = "ticklease_app", value_parser = db_role)]
    app_role: String,
    /// The operators' database role.
    #[arg(long, default_value = "ticklease_operator", value_parser = db_role)]
    operator_role: String,
}

fn db_role(name: &str) -> Result<String, String> {
    ticklease::migrate::check_role_name(name)
        .map(|()| name.to_string())
        .map_err(|e| e.to_string())
}

impl RoleNames {
    fn options(self) -> MigrateOptions {
        MigrateOptions {
            app_role: self.app_role,
            operator_role: self.operator_role,
        }
    }
}

/// Stderr that drops what it cannot write: a closed log pipe (a crashed log
/// shipper, a terminal closed under ssh) must not change what a replica does.
struct LossyStderr;

impl std::io::Write for LossyStderr {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let _ = std::io::stderr().write_all(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        let _ = std::io::stderr().flush();
        Ok(())
    }
}

/// A line on stdout that may be lost, for the long-running commands.
fn say(line: impl std::fmt::Display) {
    let _ = writeln!(std::io::stdout(), "{line}");
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(|| LossyStderr)
        .log_internal_errors(false)
        .init();
    let cli = Cli::parse();
    let service = matches!(
        cli.command,
        Command::Demo { .. } | Command::Metrics { .. } | Command::Worker(WorkerCmd { action: None, .. })
    );
    if !service {
        // A one-shot command piped into `head` ends quietly, as Unix tools do
        // (exit 141), instead of panicking on a closed stdout. Rust ignores
        // SIGPIPE by default; services keep that, and write with `say`.
        // SAFETY: no other thread exists yet that could race on the disposition.
        let _ = unsafe {
            nix::sys::signal::signal(
                nix::sys::signal::Signal::SIGPIPE,
                nix::sys::signal::SigHandler::SigDfl,
            )
        };
    }
    if let Command::Demo {
        replicas,
        duration,
        keep,
    } = cli.command
    {
        let opts = demo::DemoOptions {
            replicas,
            duration,
            database_url: cli.database_url,
            keep,
        };
        return tokio::select! {
            outcome = demo::run(opts) => match outcome {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(1),
                Err(e) => {
                    let _ = writeln!(LossyStderr, "ticklease demo: {}", ticklease::error::chain(e.as_ref()));
                    ExitCode::from(1)
                }
            },
            _ = interrupted() => {
                let _ = writeln!(LossyStderr, "ticklease demo: interrupted; stopping the workers and removing the cluster");
                ExitCode::from(130)
            }
        };
    }
    let Some(url) = cli.database_url else {
        eprintln!("ticklease: --database-url (or DATABASE_URL) is required");
        return ExitCode::from(2);
    };
    match run(&url, cli.command).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let _ = writeln!(LossyStderr, "ticklease: {}", ticklease::error::chain(e.as_ref()));
            ExitCode::from(if e.is::<Usage>() { 2 } else { 1 })
        }
    }
}

async fn run(url: &str, command: Command) -> anyhow::Result<()> {
    let config: ticklease::PgConnect = url.parse().context("invalid --database-url")?;
    let target = describe(config.config());
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
        Command::Worker(WorkerCmd {
            action: Some(WorkerAction::Migrate),
            ..
        }) => {
            let report = ticklease_worker::migrate(&mut connect(&config, &target).await?).await?;
            println!(
                "worker migrations applied: {:?}; already applied: {:?}",
                report.applied, report.already_applied
            );
        }
        Command::Worker(WorkerCmd {
            action:
                Some(WorkerAction::Seed {
                    subscriptions,
                    emails,
                    events,
                    endpoints,
                }),
            ..
        }) => {
            let seed = ticklease_worker::seed::Seed {
                subscriptions,
                emails,
                events,
                endpoints,
            };
            ticklease_worker::seed::seed(&mut connect(&config, &target).await?, &seed).await?;
            println!(
                "seeded {subscriptions} subscriptions, {emails} emails, {events} events, {} endpoints",
                seed.endpoints.len()
            );
        }
        Command::Worker(WorkerCmd { action: None, run }) => {
            let worker = run.config(config).map_err(Usage)?;
            let shutdown = tokio_util::sync::CancellationToken::new();
            ticklease::cancel_on_signals(shutdown.clone())?;
            let roles: Vec<&str> = worker.roles.iter().map(Role::as_str).collect();
            say(format_args!("worker {} running {roles:?}", std::process::id()));
            let stopped = ticklease_worker::worker::run(worker, shutdown).await?;
            // Exit 1 when a term stays held: another replica waits out its lease.
            anyhow::ensure!(stopped.all_released(), "worker stopped: {stopped}");
            say(format_args!("worker stopped: {stopped}"));
        }
        Command::Demo { .. } => unreachable!("handled before the database URL is required"),
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
            say(format_args!(
                "serving /metrics and /healthz on http://{}",
                listener.local_addr()?
            ));
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

async fn connect(config: &ticklease::PgConnect, target: &str) -> anyhow::Result<tokio_postgres::Client> {
    let (client, connection) = config
        .connect()
        .await
        .with_context(|| format!("could not connect to the database at {target}"))?;
    tokio::spawn(connection);
    Ok(client)
}

async fn store(config: ticklease::PgConnect, target: &str) -> anyhow::Result<PgStore> {
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

/// Text from the database, made safe for a terminal: control characters and
/// bidirectional overrides are shown escaped (`\u{1b}`), never interpreted.
fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        let bidi = matches!(
            c,
            '\u{061c}' | '\u{200b}'..='\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}'
        );
        if c.is_control() || bidi {
            out.extend(c.escape_unicode());
        } else {
            out.push(c);
        }
    }
    out
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
        lines.push(
            [
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
            ]
            .map(|cell| escape(&cell)),
        );
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
