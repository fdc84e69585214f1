//! `<exe> worker …` processes: one flag list for the demo's replicas, the
//! end-to-end tests' and the chaos run's.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

/// A worker process to start: `<exe> worker` with the flags of `ticklease worker`.
#[derive(Debug, Clone)]
pub struct WorkerProcess {
    exe: PathBuf,
    database_url: String,
    direct_url: Option<String>,
    webhook_secret: String,
    lease: Option<ticklease::Config>,
    payments_url: Option<String>,
    smtp_url: Option<String>,
    roles: Option<Vec<String>>,
    tick_interval: Option<Duration>,
    schedules: Vec<(String, String)>,
    batch_size: Option<i64>,
    decline_backoff: Option<Duration>,
    log: Option<PathBuf>,
}

impl WorkerProcess {
    /// `exe` is a binary with the `worker` subcommand (`ticklease`, or the bench's).
    pub fn new(
        exe: impl Into<PathBuf>,
        database_url: impl Into<String>,
        webhook_secret: impl Into<String>,
    ) -> Self {
        WorkerProcess {
            exe: exe.into(),
            database_url: database_url.into(),
            direct_url: None,
            webhook_secret: webhook_secret.into(),
            lease: None,
            payments_url: None,
            smtp_url: None,
            roles: None,
            tick_interval: None,
            schedules: Vec::new(),
            batch_size: None,
            decline_backoff: None,
            log: None,
        }
    }

    /// A URL straight to Postgres for the coordination session
    /// (`--direct-url`; default: none, leases alone).
    pub fn direct_url(mut self, url: impl Into<String>) -> Self {
        self.direct_url = Some(url.into());
        self
    }

    /// Lease timings (default: the worker's).
    pub fn lease(mut self, config: ticklease::Config) -> Self {
        self.lease = Some(config);
        self
    }

    pub fn payments_url(mut self, url: impl Into<String>) -> Self {
        self.payments_url = Some(url.into());
        self
    }

    pub fn smtp_url(mut self, url: impl Into<String>) -> Self {
        self.smtp_url = Some(url.into());
        self
    }

    /// Only these roles (default: all five).
    pub fn roles(mut self, roles: &[&str]) -> Self {
        self.roles = Some(roles.iter().map(|r| r.to_string()).collect());
        self
    }

    /// A role's schedule (a duration or a cron spec), over the tick interval.
    pub fn schedule(mut self, role: &str, spec: &str) -> Self {
        self.schedules.push((role.to_string(), spec.to_string()));
        self
    }

    /// One tick interval for every role it runs.
    pub fn tick_interval(mut self, every: Duration) -> Self {
        self.tick_interval = Some(every);
        self
    }

    pub fn batch_size(mut self, rows: i64) -> Self {
        self.batch_size = Some(rows);
        self
    }

    pub fn decline_backoff(mut self, wait: Duration) -> Self {
        self.decline_backoff = Some(wait);
        self
    }

    /// Appends the worker's stderr, at `info` for ticklease, to this file
    /// (default: stderr is discarded).
    pub fn log(mut self, path: impl Into<PathBuf>) -> Self {
        self.log = Some(path.into());
        self
    }

    /// The command line, stdout discarded.
    pub fn command(&self) -> std::io::Result<Command> {
        let mut cmd = Command::new(&self.exe);
        cmd.args(self.args()).stdout(Stdio::null());
        match &self.log {
            Some(path) => {
                let log = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
                cmd.env("RUST_LOG", "ticklease=info,ticklease_worker=info")
                    .stderr(log);
            }
            None => {
                cmd.stderr(Stdio::null());
            }
        }
        Ok(cmd)
    }

    /// Starts the process; it is killed when its handle is dropped.
    pub fn spawn(&self) -> std::io::Result<tokio::process::Child> {
        tokio::process::Command::from(self.command()?)
            .kill_on_drop(true)
            .spawn()
    }

    fn args(&self) -> Vec<String> {
        let ms = |d: Duration| format!("{}ms", d.as_millis());
        let mut args: Vec<String> = vec!["worker".into()];
        let mut flag = |name: &str, value: String| args.extend([format!("--{name}"), value]);
        flag("database-url", self.database_url.clone());
        flag("webhook-secret", self.webhook_secret.clone());
        if let Some(url) = &self.direct_url {
            flag("direct-url", url.clone());
        }
        if let Some(c) = &self.lease {
            flag("lease-ttl", ms(c.lease_ttl()));
            flag("heartbeat-every", ms(c.heartbeat_every()));
            flag("statement-timeout", ms(c.statement_timeout()));
            flag("abandon-after", ms(c.abandon_after()));
            flag("max-poll", ms(c.max_poll()));
        }
        let optional = [
            ("payments-url", self.payments_url.clone()),
            ("smtp-url", self.smtp_url.clone()),
            ("roles", self.roles.as_ref().map(|r| r.join(","))),
            ("batch-size", self.batch_size.map(|n| n.to_string())),
            ("decline-backoff", self.decline_backoff.map(ms)),
        ];
        for (name, value) in optional {
            if let Some(value) = value {
                flag(name, value);
            }
        }
        if let Some(every) = self.tick_interval {
            let all = ticklease_worker::ROLES.map(String::from).to_vec();
            for role in self.roles.as_ref().unwrap_or(&all) {
                flag("tick-interval", format!("{role}={}", ms(every)));
            }
        }
        // Later flags of a role win.
        for (role, spec) in &self.schedules {
            flag("tick-interval", format!("{role}={spec}"));
        }
        args
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::WorkerProcess;

    #[test]
    fn the_flags_name_each_setting_once_and_a_tick_interval_per_role() {
        let args = WorkerProcess::new("ticklease", "postgres://db", "whsec_x")
            .roles(&["billing", "dunning"])
            .tick_interval(Duration::from_millis(150))
            .batch_size(4)
            .args();
        assert_eq!(
            args,
            [
                "worker",
                "--database-url",
                "postgres://db",
                "--webhook-secret",
                "whsec_x",
                "--roles",
                "billing,dunning",
                "--batch-size",
                "4",
                "--tick-interval",
                "billing=150ms",
                "--tick-interval",
                "dunning=150ms",
            ]
        );
    }
}
