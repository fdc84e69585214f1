//! The replica processes of the client under check: each `sh -c "exec
//! COMMAND"` in a process group of its own, reaching Postgres through a
//! fault proxy of its own, its stderr kept in a file for reports.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use anyhow::Context as _;
use nix::sys::signal::{kill, killpg, Signal};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use ticklease_testkit::proxy::{Fault, FaultProxy};

/// How many lines of a replica's stderr a report quotes.
const TAIL_LINES: usize = 20;

/// One replica: its link and, while it runs, its process.
pub struct Replica {
    pub name: String,
    proxy: FaultProxy,
    child: Option<Child>,
    log: PathBuf,
}

/// The replicas of one run.
pub struct Replicas {
    pub list: Vec<Replica>,
    command: String,
    env: Vec<(String, String)>,
    db: String,
}

impl Replicas {
    /// Starts `n` replicas of `command` with `env` (all but the URL and the
    /// replica's name), each through a proxy to Postgres at `port`.
    pub async fn start(
        n: usize,
        command: &str,
        env: Vec<(String, String)>,
        port: u16,
        db: &str,
        dir: &std::path::Path,
    ) -> anyhow::Result<Replicas> {
        std::fs::create_dir_all(dir)?;
        let mut list = Vec::with_capacity(n);
        for i in 1..=n {
            list.push(Replica {
                name: format!("r{i}"),
                proxy: FaultProxy::start(SocketAddr::from(([127, 0, 0, 1], port))).await?,
                child: None,
                log: dir.join(format!("r{i}.log")),
            });
        }
        let mut replicas = Replicas {
            list,
            command: command.to_owned(),
            env,
            db: db.to_owned(),
        };
        for i in 0..n {
            replicas.spawn(i)?;
        }
        Ok(replicas)
    }

    /// Starts replica `i`'s process (again).
    pub fn spawn(&mut self, i: usize) -> anyhow::Result<()> {
        let replica = &mut self.list[i];
        let url = format!(
            "postgres://blackbox_app@127.0.0.1:{}/{}",
            replica.proxy.port(),
            self.db
        );
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&replica.log)?;
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {}", self.command))
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .env("TICKLEASE_URL", url)
            .env("TICKLEASE_REPLICA", &replica.name)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .process_group(0)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("start {}", replica.name))?;
        replica.child = Some(child);
        Ok(())
    }

    pub fn index(&self, name: &str) -> anyhow::Result<usize> {
        self.list
            .iter()
            .position(|r| r.name == name)
            .with_context(|| format!("no replica {name}"))
    }

    /// Sends `signal` to replica `i`'s process alone (not its children).
    pub fn signal(&self, i: usize, signal: Signal) -> anyhow::Result<()> {
        let pid = self.list[i]
            .child
            .as_ref()
            .and_then(Child::id)
            .context("the replica is not running")?;
        kill(Pid::from_raw(pid as i32), signal)?;
        Ok(())
    }

    /// Sends `signal` to replica `i`'s process group: the process and what
    /// it started (a runner's child), as a terminal's ^Z or a frozen host would.
    pub fn signal_group(&self, i: usize, signal: Signal) -> anyhow::Result<()> {
        let pid = self.list[i]
            .child
            .as_ref()
            .and_then(Child::id)
            .context("the replica is not running")?;
        killpg(Pid::from_raw(pid as i32), signal)?;
        Ok(())
    }

    /// SIGKILLs replica `i`'s process, reaps it, and starts it again.
    pub async fn kill_and_restart(&mut self, i: usize) -> anyhow::Result<()> {
        self.signal(i, Signal::SIGKILL)?;
        if let Some(mut child) = self.list[i].child.take() {
            child.wait().await?;
        }
        self.spawn(i)
    }

    pub fn link(&self, i: usize, fault: Fault) {
        self.list[i].proxy.set(fault);
    }

    /// Stops every replica: SIGCONT and SIGTERM, then what has not exited
    /// within `grace` is killed with its process group. Returns the
    /// replicas that did not exit 0 by themselves, with their status.
    pub async fn stop(&mut self, grace: Duration) -> Vec<String> {
        let mut unclean = Vec::new();
        for replica in &mut self.list {
            replica.proxy.set(Fault::Pass);
            let Some(mut child) = replica.child.take() else {
                continue;
            };
            let pgid = child.id().map(|id| Pid::from_raw(id as i32));
            if let Some(pgid) = pgid {
                let _ = kill(pgid, Signal::SIGCONT);
                let _ = kill(pgid, Signal::SIGTERM);
            }
            let status = tokio::time::timeout(grace, child.wait()).await;
            if let Some(pgid) = pgid {
                let _ = killpg(pgid, Signal::SIGKILL);
            }
            match status {
                Ok(Ok(s)) if s.success() => {}
                Ok(status) => unclean.push(format!("{}: {status:?}", replica.name)),
                Err(_) => unclean.push(format!("{}: still running {grace:?} after SIGTERM", replica.name)),
            }
            let _ = child.wait().await;
        }
        unclean
    }

    /// The last lines each replica wrote, for a failure's report.
    pub fn tails(&self) -> String {
        let mut out = String::new();
        for r in &self.list {
            let text = std::fs::read_to_string(&r.log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            out.push_str(&format!("--- {} (last {TAIL_LINES} lines)\n", r.name));
            for l in &lines[lines.len().saturating_sub(TAIL_LINES)..] {
                // A replica's text may hold control or bidi characters: shown escaped.
                out.push_str(&ticklease::HistoryEntry::escape(l));
                out.push('\n');
            }
        }
        out
    }
}

impl Drop for Replicas {
    fn drop(&mut self) {
        for r in &self.list {
            if let Some(id) = r.child.as_ref().and_then(Child::id) {
                let _ = killpg(Pid::from_raw(id as i32), Signal::SIGKILL);
            }
        }
    }
}
