//! The faults of the interval scenario, one function each: each finds the
//! holder, injects the fault at an instant read from the database clock,
//! and measures how long until another term claimed.

use std::time::{Duration, SystemTime};

use nix::sys::signal::Signal;

use ticklease_testkit::proxy::Fault;

use super::contract::Timings;
use super::db::{ms_between, Db};
use super::replicas::Replicas;

/// Attempts to catch the holder inside its term (a fault that lands
/// between two terms is tried again).
const ATTEMPTS: usize = 3;

/// What one fault did.
#[derive(Debug, Clone)]
pub struct Outcome {
    pub fault: &'static str,
    /// From the fault to the next term's first claim (the unpause, the
    /// server's start), on the database clock; None when none came in time.
    pub to_claim_ms: Option<f64>,
    pub bound_ms: f64,
}

/// The interval scenario in progress.
pub struct Run<'a> {
    pub db: &'a Db,
    pub replicas: Replicas,
    pub role: String,
    pub timings: Timings,
    /// Windows without a fault, where no tick may be missed.
    pub steady: Vec<(SystemTime, SystemTime)>,
    steady_from: Option<SystemTime>,
    pub outcomes: Vec<Outcome>,
}

impl<'a> Run<'a> {
    pub fn new(db: &'a Db, replicas: Replicas, role: &str, timings: Timings) -> Run<'a> {
        Run {
            db,
            replicas,
            role: role.to_owned(),
            timings,
            steady: Vec::new(),
            steady_from: None,
            outcomes: Vec::new(),
        }
    }

    /// The lease alone bounds a takeover: its TTL, a follower's poll, and a second of slack.
    fn takeover_bound(&self) -> Duration {
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

    fn fault_at(&mut self, at: SystemTime) {
        if let Some(from) = self.steady_from.take() {
            self.steady.push((from, at));
        }
    }

    fn record(&mut self, fault: &'static str, at: SystemTime, claim: Option<SystemTime>, bound: Duration) {
        self.outcomes.push(Outcome {
            fault,
            to_claim_ms: claim.map(|c| ms_between(c, at)),
            bound_ms: bound.as_secs_f64() * 1000.0,
        });
    }

    /// Whether the term `token` was cut by the fault (not completed before it).
    async fn cut_short(&self, token: i64) -> anyhow::Result<bool> {
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

    /// SIGKILL of the holder, then started again.
    pub async fn kill(&mut self) -> anyhow::Result<()> {
        self.on_holder(HolderFault::Kill).await
    }

    /// SIGSTOP of the holder's process group past its lease, then SIGCONT:
    /// its work wakes with its wait over and claims at once, after its term
    /// ended, unless it learns of the loss first; only the fence stops that claim.
    pub async fn stop(&mut self) -> anyhow::Result<()> {
        self.on_holder(HolderFault::Stop).await
    }

    /// The holder's link blackholed past its lease, then passing again.
    pub async fn cut(&mut self) -> anyhow::Result<()> {
        self.on_holder(HolderFault::Cut).await
    }

    /// Injects `fault` into the replica that holds the role and has claimed,
    /// measures the next term's first claim, and recovers the replica.
    async fn on_holder(&mut self, fault: HolderFault) -> anyhow::Result<()> {
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
                self.record(fault.name(), at, claim, bound);
                return self.settle(claim.unwrap_or(at)).await;
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
        self.record("pause → unpause", unpaused, claim, bound);
        self.settle(claim.unwrap_or(unpaused)).await
    }

    /// A fast shutdown and start of the server.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        let at = self.db.now().await?;
        self.fault_at(at);
        tokio::task::block_in_place(|| self.db.cluster.restart())?;
        let started: SystemTime = self
            .db
            .owner()
            .await?
            .query_one("SELECT pg_postmaster_start_time()", &[])
            .await?
            .get(0);
        let bound = self.takeover_bound() + Duration::from_secs(1);
        let claim = self
            .db
            .wait_claim_after(&self.role, 0, started, bound * 2)
            .await?;
        self.record("Postgres restart", started, claim, bound);
        self.settle(claim.unwrap_or(started)).await
    }
}

/// A fault aimed at the replica that holds the role.
#[derive(Debug, Clone, Copy)]
enum HolderFault {
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
                replicas.link(i, Fault::Blackhole);
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
                replicas.link(i, Fault::Pass);
                Ok(())
            }
        }
    }
}
