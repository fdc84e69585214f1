//! The command line: clap's structs, and turning parsed flags into the
//! library's and the worker's configs.

use std::time::Duration;

use clap::{Parser, Subcommand};
use ticklease::{MigrateOptions, Role, Schedule};

#[derive(Parser)]
#[command(
    name = "ticklease",
    version,
    about = "Leader leases for singleton background jobs on Postgres"
)]
pub struct Cli {
    /// Postgres connection URL (`migrate` and `grant` want the schema owner on a direct or session-mode connection).
    #[arg(long, env = "DATABASE_URL", global = true, hide_env_values = true)]
    pub database_url: Option<String>,
    #[command(subcommand)]
    pub command: Command,
}

const ROLES_HELP: &str = "Database roles: the application role gets SELECT on leader_leases and EXECUTE on \
leader_acquire_v2/leader_renew_v2/leader_release/leader_seed/leader_fence and the rest of docs/sql-api.md's client functions (SECURITY DEFINER, its only way to write \
the table); the operator role gets EXECUTE on \
leader_pause/leader_unpause/leader_run_now and SELECT on leader_status. Both are created NOLOGIN if missing; \
grant them to login users: GRANT ticklease_app TO my_service;";

// Parsed once per process: the size of the worker's flags does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
pub enum Command {
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
        after_help = "Examples:\n  ticklease status\n  ticklease status --json | jq '.[] | select(.paused_by)'\n  ticklease status --role billing\n  ticklease status --watch"
    )]
    Status {
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
        /// Redraw every second until Ctrl-C.
        #[arg(long, conflicts_with = "json")]
        watch: bool,
        /// Only this role's row (the status page shows a bounded number of roles).
        #[arg(long, value_name = "NAME")]
        role: Option<Role>,
    },
    /// Show how recent terms ended and who paused, unpaused or ran a role now, newest first.
    #[command(
        after_help = "Examples:\n  ticklease history billing --since 24h\n  ticklease history --since 1h --json | jq '.[] | select(.outcome == \"lost\")'"
    )]
    History {
        /// Only this role (default: every role).
        role: Option<Role>,
        /// How far back (e.g. 30m, 24h, 7d).
        #[arg(long, value_parser = humantime::parse_duration, default_value = "24h")]
        since: Duration,
        /// Most entries shown (1..=10000).
        #[arg(long, default_value_t = 200,
              value_parser = clap::value_parser!(u16).range(1..=10000))]
        limit: u16,
        /// One JSON array instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Pause a role: ends its current term now and refuses ACQUIRE on every replica.
    #[command(
        after_help = "Examples:\n  ticklease pause email_outbox\n  ticklease pause email_outbox --by alice --reason 'SMTP key rotation'"
    )]
    Pause {
        role: Role,
        /// Who pauses (shown in status); default `$USER@host`, or the database login without `$USER`.
        #[arg(long)]
        by: Option<String>,
        /// Why (shown in status); default none.
        #[arg(long, default_value = "")]
        reason: String,
    },
    /// Print the Prometheus alert rules (or their promtool tests) for a metric prefix; needs no database.
    #[command(
        after_help = "The rules match series named <PREFIX>_leader_…: `ticklease metrics` and the worker export \
ticklease_leader_…; a library user's Registry::with_prefix(\"myapp\") exports myapp_leader_….\n\n\
Examples:\n  ticklease alerts --prefix myapp > ticklease-alerts.yml\n  ticklease alerts --prefix myapp --tests > \
ticklease-alerts.test.yml && promtool test rules ticklease-alerts.test.yml"
    )]
    Alerts {
        /// The registry's prefix.
        #[arg(long, default_value = "ticklease")]
        prefix: String,
        /// Print the promtool tests instead (they read the rules from ticklease-alerts.yml beside them).
        #[arg(long)]
        tests: bool,
    },
    /// Unpause a role: due again at the next poll (a cooldown stays; see run-now).
    #[command(after_help = "Examples:\n  ticklease unpause email_outbox")]
    Unpause { role: Role },
    /// Run a role once now, as a manual run (the history names who asked): at the next poll, once
    /// its current term ends and while it is not paused, whatever its cooldown or schedule. A cron
    /// role's next occurrence still runs; an interval role's next tick counts from the run's end.
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
    /// Run a command as a fenced singleton: on every host the same line; each tick (or occurrence)
    /// runs CMD on exactly one, stopped before its lease can expire (while one server takes writes:
    /// across a failover, see docs/runbook.md "Postgres failover"; on Patroni, --patroni).
    #[command(after_help = run_help())]
    Run(RunCmd),
    /// The guard of `run`'s child (internal).
    #[command(name = "__guard", hide = true)]
    Guard(GuardCmd),
    /// Serve the cluster-fact metrics of your roles (--roles), or of the roles in leader_leases, on /metrics,
    /// and /healthz.
    #[command(
        after_help = "Name your roles: any app login can create rows, and an exporter that follows the rows exports \
                      at most 1,000 of them (the first by name, paused ones first); named roles are read by name \
                      and always exported.\n\nExamples:\n  ticklease metrics --metrics-addr 0.0.0.0:9187 --roles billing,dunning\n  ticklease metrics --metrics-addr 127.0.0.1:0 --prefix myapp"
    )]
    Metrics {
        /// The roles to export, read by name whatever else is in the table (comma-separated; repeatable).
        /// Without: the rows of leader_leases, at most 1,000.
        #[arg(long, value_delimiter = ',', value_name = "NAME,...")]
        roles: Vec<Role>,
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
pub struct WorkerCmd {
    #[command(subcommand)]
    pub action: Option<WorkerAction>,
    #[command(flatten)]
    pub run: WorkerRun,
}

#[derive(Subcommand)]
pub enum WorkerAction {
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
pub struct WorkerRun {
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
    /// A URL straight to Postgres (not through PgBouncer) for the coordination session: a dead
    /// leader is replaced in milliseconds, releases and pauses are heard at once. Statements
    /// still use --database-url.
    #[arg(long, env = "TICKLEASE_DIRECT_URL", hide_env_values = true)]
    direct_url: Option<String>,
    /// Patroni REST API URLs (http://host:8008, comma-separated or repeated): a term starts, and runs
    /// on, only while a member says the server reached is the primary (ends abandon_after after its
    /// last word); the start refuses timings a term could outlive its server's leadership with.
    #[arg(long, env = "TICKLEASE_PATRONI", value_delimiter = ',')]
    patroni: Vec<String>,
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
    #[command(flatten)]
    lease: LeaseFlags,
    /// A role's schedule (repeatable; default: billing on cron '0 * * * *',
    /// billing as of each occurrence; the others every 5s): ROLE=DURATION, or
    /// ROLE=CRON with an optional zone prefix,
    /// 'billing=CRON_TZ=Europe/Berlin 5 0 * * *'.
    #[arg(long = "tick-interval", value_parser = parse_tick_interval)]
    tick_intervals: Vec<(Role, Schedule)>,
    /// Rows claimed per tick.
    #[arg(long, default_value_t = 100,
          value_parser = clap::value_parser!(i64).range(1..=ticklease_worker::worker::BATCH_MAX))]
    batch_size: i64,
    /// Wait after a declined charge before the next attempt.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "1h")]
    decline_backoff: Duration,
}

fn parse_tick_interval(s: &str) -> Result<(Role, Schedule), String> {
    let (role, spec) = s
        .split_once('=')
        .ok_or_else(|| format!("{s:?}: expected ROLE=DURATION or ROLE=CRON"))?;
    let role = Role::new(role).map_err(|e| e.to_string())?;
    let parsed = match humantime::parse_duration(spec) {
        Ok(parsed) => parsed,
        Err(duration) => {
            return Schedule::cron_tz(spec).map(|cron| (role, cron)).map_err(|cron| {
                format!("{spec:?} is neither a duration ({duration}) nor a cron schedule ({cron})")
            })
        }
    };
    let max = ticklease::DURATION_MAX;
    if parsed.is_zero() || parsed > max {
        return Err(format!(
            "{role}={spec}: a tick interval must be greater than zero and at most {}",
            humantime::format_duration(max)
        ));
    }
    Ok((role, Schedule::every(parsed)))
}

/// The lease's timings, each defaulting to the spec's.
#[derive(clap::Args)]
pub struct LeaseFlags {
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
}

impl LeaseFlags {
    pub fn config(&self) -> Result<ticklease::Config, ticklease::ConfigError> {
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
}

impl WorkerRun {
    pub fn config(
        self,
        database: ticklease::PgConnect,
    ) -> Result<ticklease_worker::worker::WorkerConfig, String> {
        let lease = self.lease.config().map_err(|e| e.to_string())?;
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
        for (role, schedule) in &self.tick_intervals {
            schedule
                .check(&lease)
                .map_err(|e| format!("--tick-interval {role}: {e}"))?;
        }
        let direct = self
            .direct_url
            .map(|url| url.parse::<ticklease::PgConnect>())
            .transpose()
            .map_err(|e| format!("--direct-url: {e}"))?;
        let patroni = (!self.patroni.is_empty())
            .then(|| ticklease::patroni::Patroni::new(&self.patroni, lease.statement_timeout()))
            .transpose()
            .map_err(|e| format!("--patroni: {e}"))?;
        Ok(ticklease_worker::worker::WorkerConfig {
            database,
            direct,
            patroni,
            roles: self.roles,
            lease,
            schedules: self.tick_intervals.into_iter().collect(),
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
pub struct RoleNames {
    /// The application's database role.
    #[arg(long, default_value = "ticklease_app")]
    app_role: String,
    /// The operators' database role.
    #[arg(long, default_value = "ticklease_operator")]
    operator_role: String,
}

impl RoleNames {
    /// The names, checked before anything connects.
    pub fn options(self) -> Result<MigrateOptions, ticklease::MigrateError> {
        MigrateOptions::new(&self.app_role, &self.operator_role)
    }
}

#[derive(clap::Args)]
pub struct RunCmd {
    /// The role (one row; the same on every host).
    #[arg(required_unless_present = "jobs")]
    pub role: Option<Role>,
    /// A jobs file instead: several roles, each with its command and schedule ([job.ROLE] tables).
    #[arg(long, conflicts_with_all = ["role", "every", "cron", "zone", "catch_up", "starting_deadline",
        "attempts", "backoff", "backoff_max", "restart_backoff", "restart_backoff_max", "timeout", "once",
        "grace", "shell", "prefix"])]
    pub jobs: Option<std::path::PathBuf>,
    /// Run CMD once per interval (without --every or --cron: CMD runs as a long-lived singleton,
    /// started again after it exits, and on another host when its host dies).
    #[arg(long, value_parser = humantime::parse_duration, conflicts_with = "cron")]
    pub every: Option<Duration>,
    /// Run CMD once per occurrence of this cron expression (5 or 6 fields, @daily …).
    #[arg(long)]
    pub cron: Option<String>,
    /// The cron expression's IANA time zone (default UTC).
    #[arg(long, requires = "cron")]
    pub zone: Option<String>,
    /// Missed occurrences: latest (default), skip, or all:N.
    #[arg(long, requires = "cron")]
    pub catch_up: Option<String>,
    /// Skip an occurrence not started this long after its time (default: none; with --catch-up
    /// skip, the lease TTL).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub starting_deadline: Option<Duration>,
    /// Attempts of one occurrence (of one interval's run), the first included: 1..=100 (default:
    /// cron 3, --every 1).
    #[arg(long)]
    pub attempts: Option<u32>,
    /// The wait before the first retry, doubling per retry (default 10s).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub backoff: Option<Duration>,
    /// The longest wait between two attempts (default 5m, at least --backoff).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub backoff_max: Option<Duration>,
    /// A long-lived CMD (no --every or --cron): the wait before it is started again after exit 0,
    /// and the first wait after a failure (default 1s).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub restart_backoff: Option<Duration>,
    /// A long-lived CMD: the cap of the wait, which doubles per consecutive failure (default 1m).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub restart_backoff_max: Option<Duration>,
    /// Stop CMD after this long (the run fails; at most 24h).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub timeout: Option<Duration>,
    /// Run at most one tick, then exit with the command's code (or a code saying why it did not run).
    #[arg(long)]
    pub once: bool,
    /// SIGTERM to SIGKILL when the term ends (default: half of lease_ttl - abandon_after).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub grace: Option<Duration>,
    /// CMD is one command line for /bin/sh -c.
    #[arg(long)]
    pub shell: bool,
    /// Prefix each line CMD writes with [role token].
    #[arg(long)]
    pub prefix: bool,
    /// Serve /metrics and /healthz here.
    #[arg(long)]
    pub metrics_addr: Option<std::net::SocketAddr>,
    /// A URL straight to Postgres (not through PgBouncer) for the coordination session: releases,
    /// pauses and run-nows are heard at once. A dead runner's role is still taken over when its
    /// lease expires, never while its child may run (see --takeover-on-session-end).
    #[arg(long, env = "TICKLEASE_DIRECT_URL", hide_env_values = true)]
    pub direct_url: Option<String>,
    /// Patroni REST API URLs (http://host:8008, comma-separated or repeated): a term starts, and runs
    /// on, only while a member says the server reached is the primary (ends abandon_after after its
    /// last word); the start refuses timings a term could outlive its server's leadership with.
    #[arg(long, env = "TICKLEASE_PATRONI", value_delimiter = ',')]
    pub patroni: Vec<String>,
    /// Opt-in, with --direct-url: a role is taken over the moment its runner's coordination session
    /// ends (milliseconds after a runner's death, not the lease's expiry). Trades the no-overlap
    /// rule for speed: when only the session ends (a link cut on the server's side, a Postgres
    /// restart, pg_terminate_backend) the next child starts while the last one runs, for up to a
    /// heartbeat plus the abandon deadline plus the grace (docs/benchmarks/run-failover.md).
    #[arg(long, requires = "direct_url")]
    pub takeover_on_session_end: bool,
    #[command(flatten)]
    pub lease: LeaseFlags,
    /// The command and its arguments, after `--`.
    #[arg(
        last = true,
        required_unless_present = "jobs",
        conflicts_with = "jobs",
        value_name = "CMD"
    )]
    pub command: Vec<std::ffi::OsString>,
}

#[derive(clap::Args)]
pub struct GuardCmd {
    #[arg(long)]
    pub grace_ms: u64,
    #[arg(long)]
    pub deadline_ns: u64,
    #[arg(last = true, required = true)]
    pub command: Vec<std::ffi::OsString>,
}

impl RunCmd {
    /// The knobs the flags give, checked as the jobs file's are.
    pub fn knobs(&self) -> ticklease_run::Knobs {
        ticklease_run::Knobs {
            every: self.every,
            cron: self.cron.clone(),
            zone: self.zone.clone(),
            catch_up: self.catch_up.clone(),
            starting_deadline: self.starting_deadline,
            attempts: self.attempts,
            backoff: self.backoff,
            backoff_max: self.backoff_max,
            restart_backoff: self.restart_backoff,
            restart_backoff_max: self.restart_backoff_max,
            timeout: self.timeout,
            grace: self.grace,
        }
    }
}

/// `ticklease run --help`'s closing text: exit codes, the long-lived rule,
/// the term's environment, every jobs file key, examples.
fn run_help() -> String {
    format!(
        "Exit codes with --once: the command's own (128 + a signal), 75 held by another host, \
76 paused, 77 not due, 78 the term was lost while it ran, 130 interrupted; 1 the runner failed; 2 usage. \
Whenever --once does not exit 0 it writes one line on stderr saying why (a command that itself exits \
with one of these codes is told apart by that line).\n\n\
Without --every or --cron, CMD is long-lived: started again whatever its exit, on whichever host acquires \
the role: --restart-backoff after exit 0 (its work is done for now), else after a wait that doubles per \
consecutive failure up to --restart-backoff-max. The runner itself exits 0 only when stopped by SIGTERM \
or Ctrl-C with every term released.\n\n\
The command's environment names its term: TICKLEASE_ROLE, TICKLEASE_TOKEN, TICKLEASE_HOLDER and, on a \
cron schedule, TICKLEASE_OCCURRENCE (RFC 3339, UTC); and the server the term started on: TICKLEASE_DB_HOST, \
TICKLEASE_DB_PORT and, when the URL gives the address, TICKLEASE_DB_HOSTADDR. Its own connection goes there, \
not through a list of hosts (after a promotion the old primary may still take writes), and its claims \
can be fenced:\n  \
echo \"UPDATE ... WHERE ... AND (SELECT leader_fence_v2(:'role', :token))\" | \\\n    \
psql \"host=$TICKLEASE_DB_HOST port=$TICKLEASE_DB_PORT ${{TICKLEASE_DB_HOSTADDR:+hostaddr=$TICKLEASE_DB_HOSTADDR}} dbname=app\" \\\n    \
-v role=\"$TICKLEASE_ROLE\" -v token=\"$TICKLEASE_TOKEN\"   (psql substitutes variables in its input, not in -c)\n\n\
{}\n\
Logs: one INFO line when a job starts and one when it ends (role, token, occurrence, exit, outcome, \
duration_ms), shown by default except with --once; RUST_LOG=warn hides them. No colour unless stderr is a \
terminal and NO_COLOR is unset.\n\n\
Examples:\n  ticklease run nightly_dump --cron '5 0 * * *' --zone Europe/Berlin --timeout 1h -- pg_dump -f /backup/app.sql app\n  \
ticklease run report --every 15m --once -- ./report.sh\n  \
ticklease run relay --direct-url postgres://db/app --restart-backoff-max 5m -- ./relay --listen :9000\n  \
ticklease run --jobs /etc/ticklease/jobs.toml --direct-url postgres://db/app",
        ticklease_run::jobs::keys_help()
    )
}
