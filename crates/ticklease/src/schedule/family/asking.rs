//! A family loop's batched ACQUIRE on its schedule: on an interval, or for
//! the occurrence of a cron schedule that is due on the database clock
//! (under the Latest catch-up policy: the most recent one runs once per
//! key), and what each term it starts waits for when it ends.

use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::error::Error;
use crate::leader::lead::occurrence::OccurrenceScope;
use crate::leader::lead::Manager;
use crate::store::{Acquire, FamilyOccurrenceAsk, LeaseStore, Refusal};
use crate::term::role::Role;
use crate::term::schedule::{Schedule, SKIPPED_COUNTED_MAX};

const NANO: Duration = Duration::from_nanos(1);

/// How a started term waits once it ends.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct TermPlan {
    /// The wait RELEASE sets after a completed tick: the interval; for an
    /// occurrence until the next one; 1 ms after a manual run.
    pub(crate) wait: Duration,
    /// An interval's retry: the cooldown if the work returns `Err`.
    pub(crate) backoff: Option<Duration>,
    /// The occurrence the term runs (its waits are counted from its RELEASE).
    pub(crate) occurrence: Option<OccurrenceScope>,
}

impl TermPlan {
    /// How long after the term ended its key is due again.
    pub(crate) fn after(&self, failed: bool) -> Duration {
        match (self.occurrence, self.backoff) {
            (Some(o), _) => o.wait(failed),
            (None, Some(backoff)) if failed => backoff,
            _ => self.wait,
        }
    }
}

/// The database clock as the family's last answer gave it, moved on by the
/// local monotonic clock: only used to pick the occurrence to ask for.
#[derive(Debug, Default)]
pub(crate) struct DbClock(Option<(SystemTime, Instant)>);

impl DbClock {
    fn now(&self) -> SystemTime {
        self.0
            .map_or_else(SystemTime::now, |(db_now, at)| db_now + at.elapsed())
    }
}

/// One key's answer.
pub(crate) struct Answer {
    pub(crate) role: Role,
    pub(crate) acquire: Acquire,
    pub(crate) plan: TermPlan,
    /// Occurrences at or before this never run for the key (cron only).
    pub(crate) after: Option<SystemTime>,
}

/// Sends the batched ACQUIRE of `candidates` (at most `room` terms). On a
/// cron schedule `back_to` is the oldest last-completed occurrence known of
/// them (`None`: one is unknown), how far back skipped ones are listed.
pub(crate) async fn ask<S: LeaseStore>(
    manager: &Manager<S>,
    schedule: &Schedule,
    clock: &mut DbClock,
    candidates: &[Role],
    back_to: Option<SystemTime>,
    room: usize,
) -> Result<(Vec<Answer>, Instant), Error> {
    let max_poll = manager.config().max_poll();
    if let Some(interval) = schedule.interval() {
        let (answers, sent) = manager.acquire_many(candidates, interval, room).await?;
        let retry = schedule.retry_policy();
        let answers = answers.into_iter().map(|(role, acquire)| {
            let backoff = match &acquire {
                Acquire::Acquired(term) => retry.backoff_in_round(term.failures),
                Acquire::Refused(_) => None,
            };
            let plan = TermPlan {
                wait: interval,
                backoff,
                occurrence: None,
            };
            Answer {
                role,
                acquire,
                plan,
                after: None,
            }
        });
        return Ok((answers.collect(), sent));
    }
    let now = clock.now();
    let Some((occurrence, next)) = due(schedule, now) else {
        // Fires no more (refused when the schedule was built): asked again later.
        let not_due = Refusal::NotDue {
            due_at: now + max_poll,
            remaining: max_poll,
        };
        let answers = candidates.iter().map(|role| Answer {
            role: role.clone(),
            acquire: Acquire::Refused(not_due.clone()),
            plan: TermPlan::default(),
            after: None,
        });
        return Ok((answers.collect(), Instant::now()));
    };
    let ask = FamilyOccurrenceAsk {
        occurrence,
        next,
        schedule: schedule.to_string(),
        recent: recent(schedule, occurrence, back_to),
    };
    let (answers, sent) = manager.acquire_many_occurrence(candidates, &ask, room).await?;
    if let Some((_, a)) = answers.first() {
        clock.0 = Some((a.db_now, Instant::now()));
    }
    let answers = answers.into_iter().map(|(role, a)| {
        let plan = match (&a.acquire, &a.manual_by) {
            (Acquire::Acquired(_), Some(_)) => TermPlan {
                wait: Duration::from_millis(1),
                ..TermPlan::default()
            },
            (Acquire::Acquired(_), None) => {
                let o = OccurrenceScope::started(schedule, occurrence, a.db_now, a.failures, max_poll);
                TermPlan {
                    wait: o.wait(false),
                    backoff: None,
                    occurrence: Some(o),
                }
            }
            (Acquire::Refused(_), _) => TermPlan::default(),
        };
        Answer {
            role,
            acquire: a.acquire,
            plan,
            after: Some(a.after),
        }
    });
    Ok((answers.collect(), sent))
}

/// The occurrence to ask for at the database instant `now` (the latest
/// reached, else the first ahead) and the one after it.
fn due(schedule: &Schedule, now: SystemTime) -> Option<(SystemTime, SystemTime)> {
    let occurrence = schedule
        .latest_at_or_before(now)
        .or_else(|| schedule.next_after(now))?;
    Some((occurrence, schedule.next_after(occurrence)?))
}

/// The occurrences before `occurrence`, oldest first, back to `back_to`
/// (exclusive) or at most [`SKIPPED_COUNTED_MAX`] of them.
fn recent(schedule: &Schedule, occurrence: SystemTime, back_to: Option<SystemTime>) -> Vec<SystemTime> {
    let mut recent = Vec::new();
    let mut at = occurrence;
    while recent.len() < SKIPPED_COUNTED_MAX as usize {
        match schedule.latest_at_or_before(at - NANO) {
            Some(earlier) if back_to.is_none_or(|b| earlier > b) => {
                recent.push(earlier);
                at = earlier;
            }
            _ => break,
        }
    }
    recent.reverse();
    recent
}
