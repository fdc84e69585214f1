//! The faults of the interval scenario, one function each: each finds the
//! holder, injects the fault at an instant read from the database clock,
//! and measures how long until another term claimed.

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;

use ticklease_testkit::proxy::Fault as LinkFault;

use super::checks;
use super::contract::Timings;
use super::db::{ms_between, Db};
use super::replicas::Replicas;
use super::server;

/// Attempts to catch the holder inside its term (a fault that lands
/// between two terms is tried again).
pub(super) const ATTEMPTS: usize = 3;

/// The faults of the interval scenario, in the order a full check runs them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Kill,
    Stop,
    ClaimHeld,
    RenewRefused,
    SessionEnded,
    Pause,
    Cut,
    Restart,
    ImmediateStop,
}

impl Fault {
    pub const ALL: [Fault; 9] = [
        Fault::Kill,
        Fault::Stop,
        Fault::ClaimHeld,
        Fault::RenewRefused,
        Fault::SessionEnded,
        Fault::Pause,
        Fault::Cut,
        Fault::Restart,
        Fault::ImmediateStop,
    ];

    /// Injects the fault into `run`, measures and checks what followed.
    pub async fn inject(self, run: &mut Run<'_>) -> anyhow::Result<()> {
        match self {
            Fault::Kill => run.on_holder(HolderFault::Kill).await,
            Fault::Stop => run.on_holder(HolderFault::Stop).await,
            Fault::Cut => run.on_holder(HolderFault::Cut).await,
            Fault::ClaimHeld => run.claim_held().await,
            Fault::RenewRefused => run.renew_refused().await,
            Fault::SessionEnded => run.session_ended().await,
            Fault::Pause => run.pause().await,
            Fault::Restart => run.restart(false).await,
            Fault::ImmediateStop => run.restart(true).await,
        }
    }
}

/// What one fault did.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub fault: &'static str,
    /// The fault's instant (the unpause, the server's start), database clock.
    pub at: SystemTime,
    /// From the fault to the next term's first claim, on the database
    /// clock; None when none came in time.
    pub to_claim_ms: Option<f64>,
    pub bound_ms: f64,
    /// What the checks found first after this fault (and the bound missed).
    pub violations: Vec<String>,
}

impl Outcome {
    pub fn new(fault: &'static str, at: SystemTime, claim: Option<SystemTime>, bound: Duration) -> Outcome {
        let to_claim_ms = claim.map(|c| ms_between(c, at));
        let bound_ms = bound.as_secs_f64() * 1000.0;
        let mut violations = Vec::new();
        if to_claim_ms.is_none_or(|ms| ms > bound_ms) {
            let took = to_claim_ms.map_or("none".into(), |ms| format!("{ms:.0} ms"));
            violations.push(format!("{fault}: next claim {took}, bound {bound_ms:.0} ms"));
        }
        Outcome {
            fault,
            at,
            to_claim_ms,
            bound_ms,
            violations,
        }
    }

    /// One line for a terminal.
    pub fn line(&self) -> String {
        let took = self
            .to_claim_ms
            .map_or("never".into(), |ms| format!("{ms:.0} ms"));
        let mut line = format!("{} → claim {took} (bound {:.0} ms)", self.fault, self.bound_ms);
        if !self.violations.is_empty() {
            line.push_str(&format!(", {} violation(s)", self.violations.len()));
        }
        line
    }
}

/// The interval scenario in progress.
pub struct Run<'a> {
    pub db: &'a Db,
    pub replicas: Replicas,
    pub role: String,
    pub timings: Timings,
    /// Names the run in the line printed per fault.
    pub label: String,
    /// Windows without a fault, where no tick may be missed.
    pub steady: Vec<(SystemTime, SystemTime)>,
    steady_from: Option<SystemTime>,
    pub outcomes: Vec<Outcome>,
    /// Violations found so far, so each fault is charged only with new ones.
    seen: HashSet<String>,
}

impl<'a> Run<'a> {
    pub fn new(db: &'a Db, replicas: Replicas, role: &str, timings: Timings, label: &str) -> Run<'a> {
        Run {
            db,
            replicas,
            role: role.to_owned(),
            timings,
            label: label.to_owned(),
            steady: Vec::new(),
            steady_from: None,
            outcomes: Vec::new(),
            seen: HashSet::new(),
        }
    }

    /// The lease alone bounds a takeover: its TTL, a follower's poll, and a second of slack.
    pub(super) fn takeover_bound(&self) -> Duration {
        self.timings.lease_ttl + self.timings.max_poll + Duration::from_secs(1)
    }

    /// Waits until the role claimed twice since `after`: a steady window starts.
    pub async fn settle(&mut self, after: SystemTime) -> anyhow::Result<()> {
        let at = self
            .db
            .settle(&self.role, after, 2, Duration::from_secs(30))
            .await?;
        self.steady_from = Some(at);
        Ok(())
    }

    /// Closes the last steady window at `at` (the run's end).
    pub fn end(&mut self, at: SystemTime) {
        self.fault_at(at);
    }

    pub(super) fn fault_at(&mut self, at: SystemTime) {
        if let Some(from) = self.steady_from.take() {
            self.steady.push((from, at));
        }
    }

    /// Ends a fault: waits for the role to run again (a steady window
    /// starts), checks the record, and prints the fault's line. `own` are
    /// the fault's own findings.
    pub(super) async fn done(
        &mut self,
        mut outcome: Outcome,
        claim: Option<SystemTime>,
        own: Vec<String>,
    ) -> anyhow::Result<()> {
        self.settle(claim.unwrap_or(outcome.at)).await?;
        outcome.violations.extend(own);
        outcome.violations.extend(self.new_violations().await?);
        eprintln!("black-box {}: {}", self.label, outcome.line());
        for v in &outcome.violations {
            eprintln!("  VIOLATION {}", ticklease::HistoryEntry::escape(v));
        }
        self.outcomes.push(outcome);
        Ok(())
    }

    /// What the checks find in the record that they had not found before.
    pub async fn new_violations(&mut self) -> anyhow::Result<Vec<String>> {
        let found = checks::all(&self.db.owner().await?, &self.role).await?;
        Ok(found
            .into_iter()
            .filter(|v| self.seen.insert(v.clone()))
            .collect())
    }

    /// Whether the term `token` was cut by the fault (not completed before it).
    pub(super) async fn cut_short(&self, token: i64) -> anyhow::Result<bool> {
        let row = self
            .db
            .owner()
            .await?
            .query_opt(
                "SELECT outcome FROM leader_history WHERE role = $1 AND token = $2 AND kind = 'term'",
                &[&self.role, &token],
            )
            .await?;
        Ok(row.is_none_or(|r| r.get::<_, String>(0) != "completed"))
    }

    /// Injects `fault` into the replica that holds the role and has claimed,
    /// measures the next term's first claim, and recovers the replica.
    pub(super) async fn on_holder(&mut self, fault: HolderFault) -> anyhow::Result<()> {
        let bound = self.takeover_bound();
        for _ in 0..ATTEMPTS {
            let (name, token) = self.db.wait_holder(&self.role, Duration::from_secs(10)).await?;
            let i = self.replicas.index(&name)?;
            let at = self.db.now().await?;
            self.fault_at(at);
            fault.inject(&self.replicas, i)?;
            // A stop or a cut lasts past the lease, whatever the takeover does meanwhile.
            tokio::time::sleep(fault.lasts(self.timings)).await;
            let claim = self.db.wait_claim_after(&self.role, token, at, bound).await?;
            fault.recover(&mut self.replicas, i).await?;
            if self.cut_short(token).await? || claim.is_none() {
                let outcome = Outcome::new(fault.name(), at, claim, bound);
                return self.done(outcome, claim, Vec::new()).await;
            }
            self.settle(at).await?;
        }
        anyhow::bail!(
            "{}: the holder's term completed before the fault {ATTEMPTS} times",
            fault.name()
        )
    }

    /// A pause by the operator for two seconds, notified, then an unpause, notified.
    pub async fn pause(&mut self) -> anyhow::Result<()> {
        let owner = self.db.owner().await?;
        let at = self.db.now().await?;
        self.fault_at(at);
        let notify = "SELECT pg_notify('ticklease', $1 || ' ' || $2)";
        owner
            .execute(
                "SELECT leader_pause($1, 'blackbox', 'the black-box check')",
                &[&self.role],
            )
            .await?;
        owner.execute(notify, &[&"pause", &self.role]).await?;
        tokio::time::sleep(Duration::from_secs(2)).await;
        let unpaused: SystemTime = owner.query_one("SELECT clock_timestamp()", &[]).await?.get(0);
        owner.execute("SELECT leader_unpause($1)", &[&self.role]).await?;
        owner.execute(notify, &[&"unpause", &self.role]).await?;
        let bound = self.timings.max_poll + Duration::from_secs(1);
        let claim = self
            .db
            .wait_claim_after(&self.role, 0, unpaused, bound * 2)
            .await?;
        let outcome = Outcome::new("pause → unpause", unpaused, claim, bound);
        self.done(outcome, claim, Vec::new()).await
    }

    /// A stop and start of the server, on durable commits: a fast shutdown
    /// (`pg_ctl stop -m fast`: SIGINT, sessions ended, a checkpoint), or an
    /// immediate stop (SIGQUIT: no checkpoint, recovery at the start). In
    /// both nothing the server acknowledged before the stop may vanish.
    pub async fn restart(&mut self, immediate: bool) -> anyhow::Result<()> {
        let owner = self.db.owner().await?;
        let at = self.db.now().await?;
        self.fault_at(at);
        let before = server::acknowledged(&owner).await?;
        drop(owner);
        let cluster = &self.db.cluster;
        tokio::task::block_in_place(|| {
            if !immediate {
                cluster.stop_fast();
            }
            // After a fast stop this only starts it; else an immediate stop first.
            cluster.restart()
        })?;
        let owner = self.db.owner().await?;
        let lost = server::vanished(&owner, &before).await?;
        let started: SystemTime = owner
            .query_one("SELECT pg_postmaster_start_time()", &[])
            .await?
            .get(0);
        let bound = self.takeover_bound() + Duration::from_secs(1);
        let claim = self
            .db
            .wait_claim_after(&self.role, 0, started, bound * 2)
            .await?;
        let name = if immediate {
            "immediate stop"
        } else {
            "Postgres restart"
        };
        let outcome = Outcome::new(name, started, claim, bound);
        self.done(outcome, claim, lost).await
    }
}

/// A fault aimed at the replica that holds the role.
#[derive(Debug, Clone, Copy)]
pub(super) enum HolderFault {
    Kill,
    Stop,
    Cut,
}

impl HolderFault {
    fn name(self) -> &'static str {
        match self {
            HolderFault::Kill => "SIGKILL",
            HolderFault::Stop => "SIGSTOP",
            HolderFault::Cut => "cut link",
        }
    }

    fn inject(self, replicas: &Replicas, i: usize) -> anyhow::Result<()> {
        match self {
            HolderFault::Kill => replicas.signal(i, Signal::SIGKILL),
            HolderFault::Stop => replicas.signal_group(i, Signal::SIGSTOP),
            HolderFault::Cut => {
                replicas.link(i, LinkFault::Blackhole);
                Ok(())
            }
        }
    }

    /// How long the fault lasts before [`HolderFault::recover`].
    fn lasts(self, timings: Timings) -> Duration {
        match self {
            HolderFault::Kill => Duration::ZERO,
            HolderFault::Stop | HolderFault::Cut => timings.lease_ttl + Duration::from_secs(1),
        }
    }

    async fn recover(self, replicas: &mut Replicas, i: usize) -> anyhow::Result<()> {
        match self {
            HolderFault::Kill => replicas.kill_and_restart(i).await,
            HolderFault::Stop => replicas.signal_group(i, Signal::SIGCONT),
            HolderFault::Cut => {
                replicas.link(i, LinkFault::Pass);
                Ok(())
            }
        }
    }
}
