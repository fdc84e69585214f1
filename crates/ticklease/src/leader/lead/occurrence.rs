//! Leading one occurrence of a cron schedule: which occurrence is due comes
//! from the schedule's arithmetic on the database's clock (its last answer,
//! moved on by the local monotonic clock), and the database decides: its
//! ACQUIRE starts a term only for an occurrence its own clock has reached
//! and that is later than the last one completed.

use std::future::Future;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use super::{BoxError, Lead, Manager, TermScope, Tick};
use crate::config::DURATION_MAX;
use crate::error::Error;
use crate::store::{Acquire, LeaseStore, OccurrenceAnswer, OccurrenceAsk, Refusal};
use crate::term::role::Role;
use crate::term::schedule::{CatchUp, Schedule};

/// What the database last said of a role's occurrences.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Known {
    /// Occurrences at or before this never run.
    after: SystemTime,
    /// The last occurrence a term started for: skipped ones are counted after it.
    started: Option<SystemTime>,
    /// The database clock when the answer arrived …
    db_now: SystemTime,
    /// … and that instant on the local monotonic clock.
    at: Instant,
    /// The role's run-now count when it was asked ([`Manager::told`]).
    told: u64,
    /// A run-now waited for a manual run the answer did not start.
    run_now_pending: bool,
    /// The role's last pause (paused, unpaused).
    last_pause: Option<(SystemTime, SystemTime)>,
}

impl Known {
    /// The database clock now, as last answered and moved on locally: only
    /// ever used to pick which occurrence to ask for, never to decide.
    fn db_now(&self) -> SystemTime {
        self.db_now + self.at.elapsed()
    }
}

/// The occurrence a term runs, and how long the role waits after it.
#[derive(Debug, Clone, Copy)]
pub(crate) struct OccurrenceScope {
    pub(crate) at: SystemTime,
    /// The occurrence after it.
    next: Option<SystemTime>,
    /// The database clock when the ACQUIRE answered, and that instant here.
    db_now: SystemTime,
    answered: Instant,
    /// The retry backoff after work that returned `Err`, while attempts remain.
    backoff: Option<Duration>,
    max_poll: Duration,
}

impl OccurrenceScope {
    /// The term of occurrence `at` of `schedule` that an ACQUIRE answered at
    /// `db_now` (on the database clock), after `failures` failed attempts.
    pub(crate) fn started(
        schedule: &Schedule,
        at: SystemTime,
        db_now: SystemTime,
        failures: u32,
        max_poll: Duration,
    ) -> Self {
        OccurrenceScope {
            at,
            next: schedule.next_after(at.max(db_now)),
            db_now,
            answered: Instant::now(),
            backoff: schedule.retry_policy().backoff_after(failures + 1),
            max_poll,
        }
    }

    /// The cooldown RELEASE sets after a tick that ended as `outcome`:
    /// after an `Err`, the backoff while attempts remain; else (spent
    /// retries, a panic, a lost term) until the next occurrence, counted
    /// from now (RELEASE adds it to its own `now()`), not from the ACQUIRE.
    pub(crate) fn wait(&self, failed: bool) -> Duration {
        let until_next = wait_until(self.next, self.db_now + self.answered.elapsed(), self.max_poll);
        match (failed, self.backoff) {
            (true, Some(backoff)) => backoff,
            _ => until_next,
        }
    }
}

/// The wait until `next` from `now` (none once it passed; `fallback` when
/// there is no next), within the bounds the database accepts.
fn wait_until(next: Option<SystemTime>, now: SystemTime, fallback: Duration) -> Duration {
    next.map_or(fallback, |n| n.duration_since(now).unwrap_or_default())
        .clamp(Duration::from_millis(1), DURATION_MAX)
}

impl<S: LeaseStore> Manager<S> {
    pub(super) async fn lead_occurrence<F, Fut, T, E>(
        &self,
        role: &Role,
        schedule: &Schedule,
        work: F,
    ) -> Result<Lead<T>, Error>
    where
        F: FnOnce(Tick) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        let config = self.inner.config;
        self.check_occurrence(role, schedule)?;
        if self.inner.shutdown.is_cancelled() {
            return Ok(Lead::ShuttingDown);
        }
        // The database is asked again once what it said is max_poll old, when
        // a run-now of the role was heard since, or while one waits; an
        // occurrence due by the old answer is asked for at once instead, as
        // that ACQUIRE answers afresh too (and starts a waiting manual run
        // when the occurrence is not one to run).
        let cached = self.known(role);
        let fresh = cached.filter(|k| {
            k.at.elapsed() < config.max_poll() && k.told == self.told(role) && !k.run_now_pending
        });
        let known = match (fresh, cached) {
            (Some(known), _) => known,
            (None, Some(known))
                if schedule
                    .due(
                        known.after,
                        known.db_now(),
                        config.lease_ttl(),
                        known.last_pause,
                        known.started,
                    )
                    .run
                    .is_some() =>
            {
                known
            }
            _ => {
                let look = OccurrenceAsk {
                    schedule: schedule.to_string(),
                    ..OccurrenceAsk::default()
                };
                let sent = Instant::now();
                let (known, answer) = self.ask(role, &look).await?;
                if let (Acquire::Acquired(term), Some(by)) = (answer.acquire, answer.manual_by) {
                    return self.lead_manual(role, term.token, sent, &by, work).await;
                }
                known
            }
        };
        let now = known.db_now();
        let due = schedule.due(
            known.after,
            now,
            config.lease_ttl(),
            known.last_pause,
            known.started,
        );
        let Some(occurrence) = due.run else {
            let due_at = due.next.unwrap_or(now + config.max_poll());
            return Ok(Lead::Refused(Refusal::NotDue {
                due_at,
                remaining: wait_until(Some(due_at), now, config.max_poll()),
            }));
        };
        let before = match schedule.catch_up_policy() {
            CatchUp::All { .. } => None,
            _ => schedule.next_after(occurrence),
        };
        let ask = OccurrenceAsk {
            occurrence: Some(occurrence),
            before,
            skipped: due.skipped,
            schedule: schedule.to_string(),
            next: schedule.next_after(occurrence),
        };
        let sent = Instant::now();
        let sent_wall = SystemTime::now();
        let (_, answer) = self.ask(role, &ask).await?;
        let term = match answer.acquire {
            Acquire::Acquired(term) => term,
            Acquire::Refused(refusal) => return Ok(Lead::Refused(refusal)),
        };
        if let Some(by) = &answer.manual_by {
            return self.lead_manual(role, term.token, sent, by, work).await;
        }
        self.inner.drift.observe(sent_wall, sent.elapsed(), term.db_now);
        if let Some(metrics) = &self.inner.metrics {
            metrics.skipped(role, &ask.skipped);
        }
        self.remember(role, |k| k.started = k.started.max(Some(occurrence)));
        let scope = OccurrenceScope::started(
            schedule,
            occurrence,
            answer.db_now,
            answer.failures,
            config.max_poll(),
        );
        let until_next = scope.wait(false);
        let scope = TermScope {
            occurrence: Some(scope),
            ..TermScope::default()
        };
        let lead = self
            .run_term(role, until_next, term.token, sent, work, scope)
            .await?;
        if let Lead::Completed { .. } = lead {
            self.remember(role, |k| k.after = k.after.max(occurrence));
        }
        Ok(lead)
    }

    /// A manual run an operator asked for (run-now): a term like any other,
    /// with no occurrence ([`Tick::occurrence`] is `None`); its RELEASE
    /// completes none, and the role is due again at once for its schedule.
    async fn lead_manual<F, Fut, T, E>(
        &self,
        role: &Role,
        token: crate::Token,
        sent: Instant,
        by: &str,
        work: F,
    ) -> Result<Lead<T>, Error>
    where
        F: FnOnce(Tick) -> Fut,
        Fut: Future<Output = Result<T, E>>,
        E: Into<BoxError>,
    {
        tracing::info!(%role, %token, by, "a manual run (run-now)");
        let cooldown = Duration::from_millis(1);
        self.run_term(role, cooldown, token, sent, work, TermScope::default())
            .await
    }

    /// How many run-nows of the role this replica's coordination session
    /// heard (or may have missed at a reconnect); 0 without one.
    fn told(&self, role: &Role) -> u64 {
        self.inner
            .store
            .signals()
            .map_or(0, |s| s.role(role.as_str()).told())
    }

    pub(super) fn check_occurrence(&self, role: &Role, schedule: &Schedule) -> Result<(), Error> {
        self.check_declared(role)?;
        schedule
            .check(&self.inner.config)
            .map_err(|source| Error::Schedule {
                role: role.to_string(),
                source,
            })
    }

    fn known(&self, role: &Role) -> Option<Known> {
        self.inner
            .occurrences
            .lock()
            .expect("occurrences")
            .get(role)
            .copied()
    }

    fn remember(&self, role: &Role, change: impl FnOnce(&mut Known)) {
        if let Some(known) = self.inner.occurrences.lock().expect("occurrences").get_mut(role) {
            change(known);
        }
    }

    /// One ACQUIRE of an occurrence; what it said of the role is kept.
    async fn ask(&self, role: &Role, ask: &OccurrenceAsk) -> Result<(Known, OccurrenceAnswer), Error> {
        let inner = &self.inner;
        // Read before the statement: a notification during it asks again.
        let told = self.told(role);
        let answer = inner
            .store
            .acquire_occurrence(role, &inner.holder_id, inner.config.lease_ttl(), ask)
            .await?;
        let known = Known {
            after: answer.after,
            started: answer.started,
            db_now: answer.db_now,
            at: Instant::now(),
            told,
            run_now_pending: answer.run_now_pending,
            last_pause: answer.last_pause,
        };
        let mut cache = inner.occurrences.lock().expect("occurrences");
        match answer.acquire {
            // Not kept: the look after the unpause brings the pause's window.
            Acquire::Refused(Refusal::Paused { .. }) => cache.remove(role),
            _ => cache.insert(role.clone(), known),
        };
        drop(cache);
        Ok((known, answer))
    }
}
