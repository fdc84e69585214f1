//! One function per subcommand that needs the database URL.

use std::io::Write as _;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::Context;
use ticklease::{HistoryStore, LeaseStore, PgConnect, PgStore, PgStoreOptions, Role};

use crate::args::{Command, RoleNames, WorkerAction, WorkerCmd, WorkerRun};
use crate::{history, say, status, Usage};

/// Runs `command` against the database at `url`.
pub async fn run(url: &str, command: Command) -> anyhow::Result<()> {
    let config: PgConnect = url.parse().context("invalid --database-url")?;
    let db = Db {
        target: describe(config.config()),
        config,
    };
    match command {
        Command::Migrate { roles } => cmd_migrate(db, roles).await,
        Command::Grant { roles } => cmd_grant(db, roles).await,
        Command::Status { json, watch, role } => cmd_status(db, json, watch, role).await,
        Command::History {
            role,
            since,
            limit,
            json,
        } => cmd_history(db, role, since, limit, json).await,
        Command::Pause { role, by, reason } => {
            let by = match by {
                Some(by) => by,
                None => db.operator().await?,
            };
            cmd_pause(db, role, &by, &reason).await
        }
        Command::Unpause { role } => cmd_unpause(db, role).await,
        Command::Alerts { .. } => unreachable!("main prints the alert rules without a database"),
        Command::RunNow { role } => cmd_run_now(db, role).await,
        Command::Roles { declared } => cmd_roles(db, &declared).await,
        Command::Worker(WorkerCmd { action, run }) => match action {
            Some(WorkerAction::Migrate) => cmd_worker_migrate(db).await,
            Some(WorkerAction::Seed {
                subscriptions,
                emails,
                events,
                endpoints,
            }) => {
                let seed = ticklease_worker::seed::Seed {
                    subscriptions,
                    emails,
                    events,
                    endpoints,
                };
                cmd_worker_seed(db, seed).await
            }
            None => cmd_worker(db, run).await,
        },
        Command::Demo { .. } => unreachable!("handled before the database URL is required"),
        Command::Metrics {
            metrics_addr,
            prefix,
            roles,
        } => cmd_metrics(db, metrics_addr, prefix, roles).await,
        Command::Run(run) => cmd_run(db, run).await,
        Command::Guard(_) => unreachable!("main runs the guard before anything else"),
    }
}

/// Where the commands connect, and how to name it in errors.
struct Db {
    config: PgConnect,
    target: String,
}

/// Longest wait for a connection of the one-shot commands that take a plain
/// client (`migrate`, `grant`, `worker migrate`, `worker seed`), per host of
/// the URL, when the URL sets no `connect_timeout` (which then takes its
/// place): TCP connect, TLS and authentication together, so a server that
/// accepts and never answers ends the command too.
const CONNECT_WAIT: Duration = Duration::from_secs(10);

/// Longest run of those commands once connected, on the client's clock: the
/// server bounds each statement ([`ticklease::migrate::MIGRATION_STATEMENT_TIMEOUT`],
/// lock waits [`ticklease::migrate::MIGRATION_LOCK_WAIT`]); this bounds a
/// server that stops answering mid-run.
const RUN_WAIT: Duration = Duration::from_secs(900);

impl Db {
    /// Who runs this command, for `pause` without `--by`: `$USER@host`, or
    /// the database login (`session_user`) when `$USER` is unset.
    async fn operator(&self) -> anyhow::Result<String> {
        let host = gethostname::gethostname()
            .into_string()
            .ok()
            .filter(|h| !h.is_empty());
        Ok(
            match (std::env::var("USER").ok().filter(|u| !u.trim().is_empty()), host) {
                (Some(user), Some(host)) => format!("{user}@{host}"),
                (Some(user), None) => user,
                (None, _) => {
                    let client = self.client().await?;
                    let rows = client.query_typed("SELECT session_user::text", &[]).await?;
                    rows.first().map(|r| r.get(0)).unwrap_or_else(|| "unknown".into())
                }
            },
        )
    }

    async fn client(&self) -> anyhow::Result<tokio_postgres::Client> {
        let pg = self.config.config();
        let hosts = u32::try_from(pg.get_hosts().len().max(1)).unwrap_or(u32::MAX);
        let bound = pg.get_connect_timeout().copied().unwrap_or(CONNECT_WAIT) * hosts;
        // The library's host rules: each host its own bounded attempt (TCP
        // connect, TLS, authentication), so a silent first host of a
        // multi-host URL costs its share of the bound and the next is tried.
        let (client, connection) = ticklease::hosts::Hosts::new(&self.config, bound)
            .connect()
            .await
            .map_err(|e| match e {
                ticklease::hosts::HostsError::TimedOut { per_host } => anyhow::anyhow!(
                    "no answer within {} (TCP connect, TLS and authentication; {} per host)",
                    humantime::format_duration(bound),
                    humantime::format_duration(per_host)
                ),
                other => anyhow::Error::new(other),
            })
            .with_context(|| format!("could not connect to the database at {}", self.target))?;
        tokio::spawn(connection);
        Ok(client)
    }

    /// `work` on the client's clock: at most [`RUN_WAIT`].
    async fn bounded<T>(
        &self,
        what: &str,
        work: impl std::future::Future<Output = anyhow::Result<T>>,
    ) -> anyhow::Result<T> {
        tokio::time::timeout(RUN_WAIT, work).await.unwrap_or_else(|_| {
            Err(anyhow::anyhow!(
                "{what}: no answer from the database at {} within {}",
                self.target,
                humantime::format_duration(RUN_WAIT)
            ))
        })
    }

    async fn store(self) -> anyhow::Result<PgStore> {
        let options = ticklease::PgStoreOptions::from_config(&ticklease::Config::default());
        let target = self.target;
        PgStore::connect(self.config, options).await.map_err(|e| match e {
            ticklease::StoreError::Connect { .. } | ticklease::StoreError::Timeout { .. } => {
                anyhow::Error::new(e).context(format!("could not connect to the database at {target}"))
            }
            other => other.into(),
        })
    }
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

async fn cmd_migrate(db: Db, roles: RoleNames) -> anyhow::Result<()> {
    let options = roles.options().map_err(|e| Usage(e.to_string()))?;
    let mut client = db.client().await?;
    let report = db
        .bounded("migrate", async {
            Ok(ticklease::migrate_with(&mut client, &options).await?)
        })
        .await?;
    println!(
        "migrations applied: {:?}; already applied: {:?}; definitions applied: {:?}",
        report.applied, report.already_applied, report.definitions
    );
    if let Some(newer) = report.definitions_newer {
        eprintln!(
            "warning: the database holds definitions of generation {newer}, newer than this build's {}: left in place",
            ticklease::migrate::DEFINITIONS_GENERATION
        );
    }
    if let Some(owner) = report.owner_cannot_end_claimers {
        // Quoted as an identifier, so the GRANT shown runs as it is.
        let owner = status::escape(&format!("\"{}\"", owner.replace('"', "\"\"")));
        eprintln!(
            "warning: the schema owner {owner} has not the rights of pg_signal_backend (it is neither a superuser \
             nor a member that inherits them): a takeover or pause cannot end a frozen claimer and fails with 55P03 \
             until it ends; GRANT pg_signal_backend TO {owner}; and, for a NOINHERIT owner, ALTER ROLE {owner} \
             INHERIT; (docs/runbook.md, \"A claim that holds its lease row\")"
        );
    }
    Ok(())
}

async fn cmd_grant(db: Db, roles: RoleNames) -> anyhow::Result<()> {
    let options = roles.options().map_err(|e| Usage(e.to_string()))?;
    let client = db.client().await?;
    db.bounded("grant", async {
        Ok(ticklease::migrate::grant(&client, &options).await?)
    })
    .await?;
    println!(
        "granted {} (application) and {} (operator)",
        options.app_role, options.operator_role
    );
    Ok(())
}

async fn cmd_status(db: Db, json: bool, watch: bool, role: Option<Role>) -> anyhow::Result<()> {
    let store = db.store().await?;
    // One role by name, or a bounded part of the table (any app login may
    // create rows): what is left out is said on stderr, the output's shape stays.
    let read = || async {
        let rows = match &role {
            Some(role) => store.status_of(std::slice::from_ref(role)).await?,
            None => {
                let (rows, total) = store.status_bounded(STATUS_ROWS_MAX).await?;
                say_left_out(rows.len(), total);
                rows
            }
        };
        anyhow::Ok(rows)
    };
    if json {
        let json = serde_json::to_string_pretty(&status::json(&read().await?))?;
        println!("{}", ticklease::HistoryEntry::escape_json(&json));
    } else if watch {
        // One listener for the whole watch: a Ctrl-C that arrives while a
        // status is read or printed is kept for the next wait, not lost (once
        // a listener exists, SIGINT no longer ends the process by itself).
        let interrupted = tokio::signal::ctrl_c();
        tokio::pin!(interrupted);
        loop {
            let table = status::table(&read().await?);
            print!("\x1b[2J\x1b[H{table}");
            tokio::select! {
                _ = &mut interrupted => break,
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
        }
    } else {
        print!("{}", status::table(&read().await?));
    }
    Ok(())
}

async fn cmd_history(
    db: Db,
    role: Option<Role>,
    since: Duration,
    limit: u16,
    json: bool,
) -> anyhow::Result<()> {
    let store = db.store().await?;
    let entries = store.history(role.as_ref(), since, usize::from(limit)).await?;
    if json {
        let json = serde_json::to_string_pretty(&history::json(&entries))?;
        println!("{}", ticklease::HistoryEntry::escape_json(&json));
    } else {
        // The database's clock, from one row read by index (any app login
        // may create rows: nothing here reads them all).
        let now = store
            .status_bounded(1)
            .await?
            .0
            .first()
            .map_or_else(SystemTime::now, |s| s.db_now);
        print!("{}", history::table(&entries, now));
    }
    Ok(())
}

async fn cmd_pause(db: Db, role: Role, by: &str, reason: &str) -> anyhow::Result<()> {
    let paused = db
        .store()
        .await?
        .pause(&role, by, reason)
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
    Ok(())
}

async fn cmd_unpause(db: Db, role: Role) -> anyhow::Result<()> {
    let unpaused = db
        .store()
        .await?
        .unpause(&role)
        .await
        .with_context(|| format!("could not unpause {role}"))?;
    println!("{role}: {}", if unpaused { "unpaused" } else { "was not paused" });
    Ok(())
}

async fn cmd_run_now(db: Db, role: Role) -> anyhow::Result<()> {
    let store = db.store().await?;
    let cooldown = store
        .run_now(&role)
        .await
        .with_context(|| format!("could not run {role} now"))?;
    let rows = store.status_of(std::slice::from_ref(&role)).await?;
    let row = rows.first();
    let cron = row.is_some_and(|r| r.schedule.is_some());
    let paused = row.is_some_and(|r| r.paused_at.is_some());
    let held = row.is_some_and(|r| r.held);
    let when = if held {
        "a manual run starts once its current term ends"
    } else {
        // A term a pause ended is waited out too (its lease, unless its holder released it).
        "a manual run starts at the next poll once no term is live"
    };
    let after = if cron {
        "its next occurrence still runs"
    } else if cooldown {
        "its cooldown stays for the ticks after"
    } else {
        "the next interval counts from its end"
    };
    if paused {
        println!("{role}: paused: a manual run starts once it is unpaused");
    } else {
        println!("{role}: {when} ({after})");
    }
    Ok(())
}

/// On stderr, how many rows a bounded read left out, so that stdout keeps its shape.
fn say_left_out(shown: usize, total: u64) {
    let left_out = total.saturating_sub(shown as u64);
    if left_out > 0 {
        let or_more = if total >= ticklease::STATUS_COUNTED_MAX {
            " or"
        } else {
            ""
        };
        eprintln!(
            "{left_out}{or_more} more roles not shown (paused ones first, then by name): \
             ticklease status --role NAME shows any one"
        );
    }
}

async fn cmd_roles(db: Db, declared: &[Role]) -> anyhow::Result<()> {
    let store = db.store().await?;
    // The first rows by index, and the declared ones by name: bounded
    // whatever rows any app login created.
    let (mut rows, total) = store.status_bounded(STATUS_ROWS_MAX).await?;
    say_left_out(rows.len(), total);
    let shown = rows.len();
    for row in store.status_of(declared).await? {
        if !rows[..shown].iter().any(|r| r.role == row.role) {
            rows.push(row);
        }
    }
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
    Ok(())
}

async fn cmd_worker_migrate(db: Db) -> anyhow::Result<()> {
    let mut client = db.client().await?;
    let report = db
        .bounded("worker migrate", async {
            Ok(ticklease_worker::migrate(&mut client).await?)
        })
        .await?;
    println!(
        "worker migrations applied: {:?}; already applied: {:?}",
        report.applied, report.already_applied
    );
    Ok(())
}

async fn cmd_worker_seed(db: Db, seed: ticklease_worker::seed::Seed) -> anyhow::Result<()> {
    let mut client = db.client().await?;
    db.bounded("worker seed", async {
        Ok(ticklease_worker::seed::seed(&mut client, &seed).await?)
    })
    .await?;
    println!(
        "seeded {} subscriptions, {} emails, {} events, {} endpoints",
        seed.subscriptions,
        seed.emails,
        seed.events,
        seed.endpoints.len()
    );
    Ok(())
}

async fn cmd_worker(db: Db, run: WorkerRun) -> anyhow::Result<()> {
    let worker = run.config(db.config).map_err(Usage)?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    ticklease::cancel_on_signals(shutdown.clone())?;
    let roles: Vec<&str> = worker.roles.iter().map(Role::as_str).collect();
    say(format_args!("worker {} running {roles:?}", std::process::id()));
    let stopped = ticklease_worker::worker::run(worker, shutdown).await?;
    // Exit 1 when a term stays held: another replica waits out its lease.
    anyhow::ensure!(stopped.all_released(), "worker stopped: {stopped}");
    say(format_args!("worker stopped: {stopped}"));
    Ok(())
}

/// Most roles `ticklease status` shows (`--role` shows any one).
const STATUS_ROWS_MAX: usize = 1_000;

/// Most roles `ticklease metrics` exports (about a dozen series each): any
/// app login may create rows, and each would be a series of every scrape.
const METRICS_ROLES_MAX: usize = 1_000;

async fn cmd_metrics(
    db: Db,
    addr: std::net::SocketAddr,
    prefix: String,
    roles: Vec<Role>,
) -> anyhow::Result<()> {
    let store = db.store().await?;
    let mut registry = prometheus_client::registry::Registry::with_prefix(prefix);
    // Named roles are read by name (a stalled one is exported whatever rows
    // any app login created); without, the rows as each scrape reads them
    // (paused first, then by role; leader_status_rows_left_out counts the
    // rest): a role created later is exported too.
    let metrics = if roles.is_empty() {
        ticklease::Metrics::register_following_rows(&mut registry, METRICS_ROLES_MAX)
    } else {
        ticklease::Metrics::register(&mut registry, roles)
    };
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("could not listen on {addr}"))?;
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
    Ok(())
}

/// `ticklease run`: every check before anything is written (exit 2), then
/// the roles led on their schedules, the command under a guard each term.
async fn cmd_run(db: Db, run: crate::args::RunCmd) -> anyhow::Result<()> {
    let config = run.lease.config().map_err(|e| Usage(e.to_string()))?;
    let guard = vec![std::env::current_exe()?.into_os_string(), "__guard".into()];
    let jobs = match &run.jobs {
        Some(path) => {
            let text = ticklease_run::jobs::read(path)
                .map_err(|e| Usage(format!("--jobs {}: {e}", path.display())))?;
            ticklease_run::jobs::parse(&text, &config, &guard)
                .map_err(|e| Usage(format!("--jobs {}: {e}", path.display())))?
        }
        None => vec![one_job(&run, &config, guard)?],
    };
    let direct = run
        .direct_url
        .as_deref()
        .map(str::parse::<PgConnect>)
        .transpose()
        .map_err(|e| Usage(format!("--direct-url: {e}")))?;
    let patroni = (!run.patroni.is_empty())
        .then(|| ticklease::patroni::Patroni::new(&run.patroni, config.statement_timeout()))
        .transpose()
        .map_err(|e| Usage(format!("--patroni: {e}")))?;
    let store = PgStore::connect(db.config.clone(), PgStoreOptions::from_config(&config)).await?;
    let store = match patroni {
        Some(patroni) => store.with_patroni(patroni, &config).await?,
        None => store,
    };
    // A child is no fenced claim: its role is taken over only once its lease
    // expired, unless the user trades that for speed.
    let store = match direct {
        Some(direct) if run.takeover_on_session_end => store.with_direct(direct).await?,
        Some(direct) => store.with_direct_wakeups(direct).await?,
        None => store,
    };
    let roles: Vec<Role> = jobs.iter().map(|j| j.role.clone()).collect();
    let mut registry = prometheus_client::registry::Registry::with_prefix("ticklease");
    let metrics = ticklease::Metrics::register(&mut registry, roles.clone());
    let manager =
        ticklease::Manager::start_with_metrics(store.clone(), config, roles, metrics.clone()).await?;
    let shutdown = tokio_util::sync::CancellationToken::new();
    if let Some(addr) = run.metrics_addr {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("could not listen on {addr}"))?;
        say(format_args!(
            "serving /metrics on http://{}",
            listener.local_addr()?
        ));
        let serve = ticklease::metrics::serve(listener, Arc::new(registry), metrics, store, shutdown.clone());
        tokio::spawn(serve);
    }
    ticklease_run::stop_on_signals(shutdown.clone())?;
    if run.once {
        let end = ticklease_run::run_once(&manager, &jobs[0], shutdown.clone()).await?;
        manager.shutdown();
        manager.wait_released(config.statement_timeout() * 2).await;
        if let Some(why) = end.why {
            let _ = writeln!(crate::LossyStderr::default(), "{why}");
        }
        return Err(crate::ExitWith(end.code).into());
    }
    let stopped = ticklease_run::run_until(manager, jobs, shutdown).await?;
    anyhow::ensure!(stopped.all_released(), "runner stopped: {stopped}");
    Ok(())
}

/// The one job of `ticklease run ROLE … -- CMD`, checked.
fn one_job(
    run: &crate::args::RunCmd,
    config: &ticklease::Config,
    guard: Vec<std::ffi::OsString>,
) -> anyhow::Result<ticklease_run::RunOptions> {
    let role = run.role.clone().ok_or_else(|| Usage("ROLE is required".into()))?;
    let knobs = run.knobs();
    // `{:#}` names the flag (`--starting-deadline`), as the jobs file names its key.
    let usage = |e: ticklease_run::KnobError| Usage(format!("{e:#}"));
    let schedule = knobs.schedule(config).map_err(usage)?;
    let grace = knobs.grace(config).map_err(usage)?;
    let timeout = knobs.timeout().map_err(usage)?;
    if !run.shell {
        ticklease_run::find_program(&run.command[0]).map_err(Usage)?;
    }
    Ok(ticklease_run::RunOptions {
        role,
        schedule,
        command: ticklease_run::CommandSpec {
            argv: run.command.clone(),
            shell: run.shell,
            env: Vec::new(),
            dir: None,
            prefix: run.prefix,
            timeout,
        },
        grace,
        guard,
    })
}
