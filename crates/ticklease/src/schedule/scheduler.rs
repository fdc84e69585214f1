//! The scheduler: one loop per declared role, each leading a tick when one
//! is due. A loop wakes when the database said the role may be acquirable
//! (the holder's expiry, the due time; at most `max_poll` without a
//! coordination session), or earlier when the coordination session tells of
//! a release, an unpause or a run-now, or the holder's session ends.
//!
//! Shutdown cancels the in-flight ticks (they release as interrupted, so the
//! role is due at once on another replica). A tick that has not returned
//! within the shutdown grace is abandoned: its work is dropped and its term
//! RELEASEd. `run` returns after every RELEASE answered or gave up (at the
//! lease's end, see the crate docs' guarantee 9), and
//! [`Stopped`] says truthfully whether every term was released.

use std::future::Future;
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::FutureExt;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::error::chain;
use crate::error::Error;
use crate::leader::lead::{check_interval, BoxError, Lead, Manager, Tick, Work};
use crate::ops::outcome::panic_message;
use crate::schedule::chance::NextChance;
use crate::schedule::family::{family_loop, FamilyJob};
use crate::schedule::wake::Polled;
use crate::store::LeaseStore;
use crate::term::family::Family;
use crate::term::role::Role;
use crate::term::schedule::Schedule;

struct Job {
    role: Role,
    schedule: Schedule,
    work: Work,
}

/// How a scheduler run ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub struct Stopped {
    /// Every tick returned within the shutdown grace (none was abandoned).
    pub loops_finished: bool,
    /// Every RELEASE answered or gave up (at the lease's end) before `run` returned.
    pub releases_done: bool,
    /// Terms whose RELEASE failed or did not answer: they stay held until
    /// their lease runs out.
    pub unreleased: usize,
}

impl Stopped {
    /// Every term this replica held at shutdown was released.
    pub fn all_released(&self) -> bool {
        self.releases_done && self.unreleased == 0
    }
}

impl std::fmt::Display for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.loops_finished {
            "every tick returned"
        } else {
            "a tick did not return within the shutdown grace and was abandoned"
        })?;
        match (self.releases_done, self.unreleased) {
            (true, 0) => f.write_str("; every term was released"),
            (true, n) => write!(
                f,
                "; {n} term(s) could not be released and stay held until their lease runs out"
            ),
            (false, _) => f.write_str(
                "; some RELEASEs did not finish in time: their terms stay held until their lease runs out",
            ),
        }
    }
}

/// Runs the jobs of a [`Manager`]'s roles.
pub struct Scheduler<S> {
    manager: Manager<S>,
    jobs: Vec<Job>,
    families: Vec<FamilyJob>,
    shutdown_timeout: Duration,
}

impl<S: LeaseStore> Scheduler<S> {
    /// A scheduler with no jobs; shutdown waits up to the lease TTL for work to return.
    pub fn new(manager: Manager<S>) -> Self {
        let shutdown_timeout = manager.config().lease_ttl();
        Scheduler {
            manager,
            jobs: Vec::new(),
            families: Vec::new(),
            shutdown_timeout,
        }
    }

    /// How long shutdown waits for in-flight work before dropping it.
    pub fn shutdown_timeout(mut self, bound: Duration) -> Self {
        self.shutdown_timeout = bound;
        self
    }

    /// Adds the job of `role`: `work` runs once per tick, at most once per
    /// interval, or once per occurrence of a cron [`Schedule`].
    pub fn job<F, Fut, E>(
        mut self,
        role: &Role,
        schedule: impl Into<Schedule>,
        work: F,
    ) -> Result<Self, Error>
    where
        F: Fn(Tick) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let schedule = schedule.into();
        self.manager.check_schedule(role, &schedule)?;
        if self.jobs.iter().any(|j| &j.role == role) {
            return Err(Error::DuplicateJob {
                role: role.to_string(),
            });
        }
        self.jobs.push(Job {
            role: role.clone(),
            schedule,
            work: boxed(work),
        });
        Ok(self)
    }

    /// Adds the job of every key of `family`, as it changes: `work` runs
    /// once per tick of each key (its role is [`Tick::role`]), spread over
    /// the replicas that run the family: at most once per interval each (a
    /// [`Schedule::every`], with its retry policy), or once per occurrence of
    /// a cron schedule, the latest one ([`CatchUp::Latest`](crate::CatchUp),
    /// no starting deadline), in batched statements either way.
    pub fn family<F, Fut, E>(
        mut self,
        family: &Family,
        schedule: impl Into<Schedule>,
        work: F,
    ) -> Result<Self, Error>
    where
        F: Fn(Tick) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<(), E>> + Send + 'static,
        E: Into<BoxError> + 'static,
    {
        let schedule = schedule.into();
        let refused = |source| Error::Schedule {
            role: family.name().to_string(),
            source,
        };
        schedule.check_family().map_err(refused)?;
        match schedule.interval() {
            Some(interval) => check_interval(family.name(), interval)?,
            None => schedule.check(self.manager.config()).map_err(refused)?,
        }
        if self.families.iter().any(|j| j.family.name() == family.name()) {
            return Err(Error::DuplicateJob {
                role: family.name().to_string(),
            });
        }
        if let Some(metrics) = self.manager.metrics_handle() {
            metrics.family(family, schedule.interval());
        }
        self.families.push(FamilyJob {
            family: family.clone(),
            schedule,
            work: boxed(work),
        });
        Ok(self)
    }

    /// Runs every job until `shutdown` fires, then stops them.
    pub async fn run(self, shutdown: CancellationToken) -> Stopped {
        let mut loops = JoinSet::new();
        for job in self.jobs {
            loops.spawn(role_loop(self.manager.clone(), job, shutdown.clone()));
        }
        let abandon = CancellationToken::new();
        for job in self.families {
            loops.spawn(family_loop(
                self.manager.clone(),
                job,
                shutdown.clone(),
                abandon.clone(),
            ));
        }
        shutdown.cancelled().await;
        self.manager.shutdown();
        let loops_finished = tokio::time::timeout(self.shutdown_timeout, async {
            while loops.join_next().await.is_some() {}
        })
        .await
        .is_ok();
        if !loops_finished {
            tracing::warn!(after = ?self.shutdown_timeout, "work did not return after shutdown; dropping it");
            // Family loops drop their terms' work and wait for it to be
            // dropped, so each RELEASE is started before they return.
            abandon.cancel();
            let _ = tokio::time::timeout(self.manager.config().statement_timeout(), async {
                while loops.join_next().await.is_some() {}
            })
            .await;
            // Dropping a lead future releases its term as interrupted.
            loops.shutdown().await;
        }
        // Each RELEASE is bounded by the statement timeout on its own task.
        let releases_done = self
            .manager
            .wait_released(self.manager.config().statement_timeout() * 2)
            .await;
        Stopped {
            loops_finished,
            releases_done,
            unreleased: self.manager.unreleased(),
        }
    }
}

fn boxed<F, Fut, E>(work: F) -> Work
where
    F: Fn(Tick) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<(), E>> + Send + 'static,
    E: Into<BoxError> + 'static,
{
    Arc::new(move |tick| {
        let fut = work(tick);
        async move { fut.await.map_err(Into::into) }.boxed()
    })
}

async fn role_loop<S: LeaseStore>(manager: Manager<S>, job: Job, shutdown: CancellationToken) {
    let Job { role, schedule, work } = job;
    let mut chance = NextChance::new(&manager, &role);
    loop {
        let tick = AssertUnwindSafe(manager.lead(&role, schedule.clone(), |tick| work(tick)))
            .catch_unwind()
            .await;
        let polled = match &tick {
            Ok(Ok(Lead::ShuttingDown)) => return,
            Ok(Ok(Lead::Refused(refusal))) => Polled::Refused(refusal),
            Ok(Ok(_)) => Polled::TermEnded,
            // The Patroni check said so once, when it stopped confirming.
            Ok(Err(Error::Store(e))) if e.is_unconfirmed() => {
                tracing::debug!(%role, error = %chain(e), "poll not sent");
                Polled::Unconfirmed
            }
            Ok(Err(error)) => {
                // A failover's is told by the host's one line; a refusal here.
                if error.is_outage() {
                    tracing::debug!(%role, error = %chain(error), "poll failed");
                } else {
                    tracing::warn!(%role, error = %chain(error), "poll failed");
                }
                Polled::Failed
            }
            Err(panic) => {
                tracing::error!(%role, panic = panic_message(&**panic), "tick panicked");
                Polled::Failed
            }
        };
        let go_on = tokio::select! {
            _ = shutdown.cancelled() => false,
            go_on = chance.wait_polled(&polled) => go_on,
        };
        if !go_on {
            return;
        }
    }
}

/// Cancels `token` on SIGTERM or SIGINT (Ctrl-C), for [`Scheduler::run`].
pub fn cancel_on_signals(token: CancellationToken) -> std::io::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        // Cancel before logging: nothing a log line does may stop the shutdown.
        token.cancel();
        tracing::info!("{name}: shutting down");
    });
    Ok(())
}
