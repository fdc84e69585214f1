//! When a role's terms are due: every interval since the last completed
//! tick (the spec's model), or at the occurrences of a cron expression in a
//! time zone. This file holds the schedule's arithmetic only; every instant
//! it is given comes from the database's clock.
//!
//! Parsing and next-occurrence arithmetic are croner's (Vixie cron with
//! optional seconds, `L`, `W`, `#` and the `@` aliases), time zones
//! chrono-tz's (the IANA database). Across a daylight-saving change croner
//! follows the Vixie rule: a fixed time inside the spring gap runs once,
//! right after the gap; a fixed time inside the autumn fold runs once, at its
//! first instance; a schedule of every few minutes or hours follows real
//! time through both.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use croner::parser::{CronParser, Seconds, Year};
use croner::Cron;

use crate::config::{Config, DURATION_MAX};
pub use crate::error::ScheduleError;

/// The smallest step between instants: "just before" and "just after".
const NANO: Duration = Duration::from_nanos(1);

/// Occurrences looked at to find a cron expression's shortest gap.
const GAP_SAMPLE: usize = 1_000;

/// Skipped occurrences counted one by one; past this a skip reports a lower bound.
pub const SKIPPED_COUNTED_MAX: u32 = 1_000;

/// The longest cron expression accepted, in characters (its text, with the
/// zone, is recorded in the lease row for operators).
pub const EXPRESSION_MAX: usize = 120;

/// How much older than a role's first look its first occurrence may be
/// (when no occurrence of it ever started): a crontab line that starts
/// `ticklease run --once` just after its own occurrence runs that
/// occurrence. Only the latest such occurrence runs, and none of them is
/// counted as skipped; `leader_occurrence_floor` lets the database accept it.
pub const FIRST_OCCURRENCE_GRACE: Duration = Duration::from_secs(60);

/// The most occurrences [`CatchUp::All`] runs after a downtime.
pub const CATCH_UP_MAX: u32 = 1_000;

/// When a role is due.
#[derive(Debug, Clone)]
pub struct Schedule {
    kind: Kind,
    catch_up: CatchUp,
    starting_deadline: Option<Duration>,
    retry: Retry,
    /// An interval role whose work runs for the whole term ([`Schedule::long_lived`]).
    long_lived: bool,
}

#[derive(Debug, Clone)]
enum Kind {
    Every(Duration),
    Cron {
        expression: String,
        cron: Box<Cron>,
        zone: Tz,
        /// The shortest gap between occurrences, measured once per zone.
        shortest_gap: Option<Duration>,
    },
}

/// What runs of the occurrences missed while no replica ran one (a downtime,
/// a pause, a tick longer than the period). A role has one term at a time,
/// so occurrences never overlap whatever the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum CatchUp {
    /// The most recent missed occurrence runs once; the older ones are skipped.
    #[default]
    Latest,
    /// Every missed occurrence runs, oldest first, at most `max` of them
    /// (the most recent `max`; older ones are skipped).
    All {
        /// At most this many, 1 ..= [`CATCH_UP_MAX`].
        max: u32,
    },
    /// Only occurrences that are still on time run: one older than its
    /// starting deadline (the lease TTL when none is set) is skipped.
    Skip,
}

/// Retries of a tick whose work returned `Err`: each retry is the same
/// occurrence, after a backoff that doubles from `backoff` up to
/// `backoff_max`; after `attempts` failed attempts the role waits as after
/// any failed tick. A panic is not retried (the spec's full-interval wait).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Attempts of one occurrence, the first included (1: no retry).
    pub attempts: u32,
    /// The wait before the first retry.
    pub backoff: Duration,
    /// The longest wait between two attempts.
    pub backoff_max: Duration,
}

impl Retry {
    /// Attempts of one occurrence by default: the first and two retries.
    pub const ATTEMPTS_DEFAULT: u32 = 3;
    /// The most attempts a policy may allow.
    pub const ATTEMPTS_MAX: u32 = 100;
    /// The wait before the first retry by default.
    pub const BACKOFF_DEFAULT: Duration = Duration::from_secs(10);
    /// The longest wait between attempts by default.
    pub const BACKOFF_MAX_DEFAULT: Duration = Duration::from_secs(300);

    /// No retry: a failed tick waits as the spec says.
    pub const NONE: Retry = Retry {
        attempts: 1,
        backoff: Self::BACKOFF_DEFAULT,
        backoff_max: Self::BACKOFF_MAX_DEFAULT,
    };

    /// The wait before attempt `failed + 1` after `failed` failed attempts of
    /// one occurrence; `None` once the attempts are spent.
    pub fn backoff_after(&self, failed: u32) -> Option<Duration> {
        if failed == 0 || failed >= self.attempts {
            return None;
        }
        let doublings = (failed - 1).min(31);
        Some(self.backoff.saturating_mul(1 << doublings).min(self.backoff_max))
    }

    /// The wait after one more failed attempt of an interval's tick, when
    /// `failed` attempts failed since the last completed tick: attempts
    /// come in rounds of `attempts`, each round ended by the interval's
    /// wait (`None`).
    pub fn backoff_in_round(&self, failed: u32) -> Option<Duration> {
        self.backoff_after(failed % self.attempts.max(1) + 1)
    }
}

impl Default for Retry {
    fn default() -> Self {
        Retry {
            attempts: Self::ATTEMPTS_DEFAULT,
            backoff: Self::BACKOFF_DEFAULT,
            backoff_max: Self::BACKOFF_MAX_DEFAULT,
        }
    }
}

const _: () = assert!(Retry::ATTEMPTS_DEFAULT <= Retry::ATTEMPTS_MAX);
const _: () = assert!(Retry::BACKOFF_DEFAULT.as_millis() <= Retry::BACKOFF_MAX_DEFAULT.as_millis());

/// Why an occurrence was skipped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SkipReason {
    /// It was due longer ago than the starting deadline.
    Deadline,
    /// It fell due while the role was paused (and no policy ran it after).
    Paused,
    /// The catch-up policy runs a newer one instead.
    CatchUp,
}

impl SkipReason {
    /// The reason as the history and metrics name it.
    pub fn as_str(self) -> &'static str {
        match self {
            SkipReason::Deadline => "deadline",
            SkipReason::Paused => "paused",
            SkipReason::CatchUp => "catch_up",
        }
    }
}

/// Occurrences skipped for one reason: the first and last of them and how many.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Skipped {
    /// Why they were skipped.
    pub reason: SkipReason,
    /// The earliest skipped occurrence.
    pub first: SystemTime,
    /// The latest skipped occurrence.
    pub last: SystemTime,
    /// How many (at most [`SKIPPED_COUNTED_MAX`]; `more` says there were more).
    pub count: u32,
    /// More than `count` were skipped.
    pub more: bool,
}

impl Skipped {
    /// The record's text in the history: how many, from when to when (UTC).
    pub fn summary(&self) -> String {
        let rfc = |t: SystemTime| DateTime::<Utc>::from(t).to_rfc3339_opts(chrono::SecondsFormat::Secs, true);
        let count = match (self.count, self.more) {
            (n, true) => format!("more than {n} occurrences"),
            (1, false) => "1 occurrence".to_owned(),
            (n, false) => format!("{n} occurrences"),
        };
        format!("{count} from {} to {}", rfc(self.first), rfc(self.last))
    }
}

/// What a cron schedule says at a database instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Due {
    /// The occurrence to run now, if any.
    pub run: Option<SystemTime>,
    /// The occurrences passed over (at most one record per reason).
    pub skipped: Vec<Skipped>,
    /// The first occurrence after the database's now.
    pub next: Option<SystemTime>,
}

/// The range `(from, until)` of occurrences skipped for `reason`, with the
/// part that fell due within the pause `[paused, unpaused)` given to
/// [`SkipReason::Paused`] (each part as `(after, before)` bounds).
fn split_by_pause(
    from: SystemTime,
    until: SystemTime,
    reason: SkipReason,
    paused: Option<(SystemTime, SystemTime)>,
) -> Vec<(SystemTime, SystemTime, SkipReason)> {
    let Some((paused, unpaused)) = paused.filter(|(p, u)| p < u && *p < until && *u > from + NANO) else {
        return vec![(from, until, reason)];
    };
    let inside_from = from.max(paused - NANO);
    let inside_until = until.min(unpaused);
    vec![
        (from, until.min(paused), reason),
        (inside_from, inside_until, SkipReason::Paused),
        (inside_until - NANO, until, reason),
    ]
}

/// One record per reason, in the order deadline, paused, catch-up: a
/// reason split around a pause spans both parts.
fn merge_by_reason(records: Vec<Skipped>) -> Vec<Skipped> {
    let mut merged: Vec<Skipped> = Vec::new();
    for reason in [SkipReason::Deadline, SkipReason::Paused, SkipReason::CatchUp] {
        let mut parts = records.iter().filter(|r| r.reason == reason);
        let Some(first) = parts.next().copied() else {
            continue;
        };
        merged.push(parts.fold(first, |acc, r| Skipped {
            reason,
            first: acc.first.min(r.first),
            last: acc.last.max(r.last),
            count: (acc.count + r.count).min(SKIPPED_COUNTED_MAX),
            more: acc.more || r.more || acc.count + r.count > SKIPPED_COUNTED_MAX,
        }));
    }
    merged
}

/// An interval as the database counts it: whole milliseconds (the lease
/// statements pass it in ms, so `900µs` would reach them as 0 ms and be
/// refused at every ACQUIRE), from 1 ms to [`DURATION_MAX`].
pub(crate) fn check_interval(interval: Duration) -> Result<(), ScheduleError> {
    let whole_ms = interval.subsec_nanos() % 1_000_000 == 0;
    if interval.is_zero() || interval > DURATION_MAX || !whole_ms {
        return Err(ScheduleError::Interval {
            interval,
            max: DURATION_MAX,
        });
    }
    Ok(())
}

/// The fields of a five- or six-field expression, in order.
const FIELDS_5: [&str; 5] = ["minute", "hour", "day of month", "month", "day of week"];
const FIELDS_6: [&str; 6] = ["second", "minute", "hour", "day of month", "month", "day of week"];

fn parser() -> CronParser {
    CronParser::builder()
        .seconds(Seconds::Optional)
        .year(Year::Disallowed)
        .build()
}

impl Schedule {
    /// Due once per `interval` since the last completed tick (the spec's
    /// model): a failed tick waits one interval, a lost one at most a minute
    /// (no retry unless [`Schedule::retry`] asks for one).
    pub fn every(interval: Duration) -> Schedule {
        Schedule {
            kind: Kind::Every(interval),
            catch_up: CatchUp::default(),
            starting_deadline: None,
            retry: Retry::NONE,
            long_lived: false,
        }
    }

    /// A long-lived role (a relay, a queue consumer): its work runs for the
    /// whole term; when it returns, the role is due again `restart` later
    /// (as [`Schedule::every`], with [`Schedule::retry`]'s backoff after a
    /// failure; a failure after a run at least as long as the longest wait
    /// waits only the first: a crash after a healthy run restarts at once,
    /// while the database's count of failures, which sets the waits of a
    /// crash loop, resets only when a run completes). Each term records the
    /// role as long-lived, so readers (the
    /// metrics, the alerts, the status page) count it healthy while it is
    /// held, and alert when it is held nowhere, instead of waiting for ticks
    /// it never completes.
    pub fn long_lived(restart: Duration) -> Schedule {
        Schedule {
            long_lived: true,
            ..Schedule::every(restart)
        }
    }

    /// Whether this is a [`Schedule::long_lived`] role.
    pub fn is_long_lived(&self) -> bool {
        self.long_lived
    }

    /// Due at each occurrence of `expression` (five fields, or six with
    /// seconds first; `L`, `W`, `#`; `@hourly`, `@daily`, `@weekly`,
    /// `@monthly`, `@yearly`), in UTC unless [`Schedule::zone`] says otherwise.
    pub fn cron(expression: &str) -> Result<Schedule, ScheduleError> {
        if expression.chars().count() > EXPRESSION_MAX {
            return Err(ScheduleError::InvalidExpression {
                expression: expression.chars().take(EXPRESSION_MAX).collect(),
                reason: format!("longer than {EXPRESSION_MAX} characters"),
            });
        }
        let cron = parse(expression)?;
        let mut schedule = Schedule {
            kind: Kind::Cron {
                expression: expression.to_owned(),
                cron: Box::new(cron),
                zone: Tz::UTC,
                shortest_gap: None,
            },
            catch_up: CatchUp::default(),
            starting_deadline: None,
            retry: Retry::default(),
            long_lived: false,
        };
        schedule.measure()?;
        Ok(schedule)
    }

    /// A cron expression, optionally prefixed with its zone as robfig/cron
    /// (and Kubernetes CronJobs before `timeZone`) accept it on one line:
    /// `CRON_TZ=Europe/Berlin 5 0 * * *` (UTC without the prefix).
    pub fn cron_tz(spec: &str) -> Result<Schedule, ScheduleError> {
        match spec.trim_start().strip_prefix("CRON_TZ=") {
            Some(rest) => {
                let (zone, expression) = rest.split_once(char::is_whitespace).unwrap_or((rest, ""));
                Schedule::cron(expression.trim())?.zone(zone)
            }
            None => Schedule::cron(spec),
        }
    }

    /// The time zone the expression's fields are read in (an IANA name).
    pub fn zone(mut self, name: &str) -> Result<Schedule, ScheduleError> {
        let Kind::Cron { zone, .. } = &mut self.kind else {
            return Err(ScheduleError::NotForInterval { what: "time zone" });
        };
        *zone = name.parse::<Tz>().map_err(|_| ScheduleError::UnknownZone {
            zone: name.to_owned(),
        })?;
        self.measure()?;
        Ok(self)
    }

    /// What runs of the occurrences missed (default [`CatchUp::Latest`]).
    pub fn catch_up(mut self, policy: CatchUp) -> Result<Schedule, ScheduleError> {
        self.cron_only("catch-up policy")?;
        if let CatchUp::All { max } = policy {
            if !(1..=CATCH_UP_MAX).contains(&max) {
                return Err(ScheduleError::CatchUpMax {
                    max,
                    limit: CATCH_UP_MAX,
                });
            }
        }
        self.catch_up = policy;
        Ok(self)
    }

    /// An occurrence not started within `deadline` of its instant is skipped.
    pub fn starting_deadline(mut self, deadline: Duration) -> Result<Schedule, ScheduleError> {
        self.cron_only("starting deadline")?;
        if deadline.is_zero() || deadline > DURATION_MAX {
            return Err(ScheduleError::Deadline {
                deadline,
                max: DURATION_MAX,
            });
        }
        self.starting_deadline = Some(deadline);
        Ok(self)
    }

    /// Retries of a tick whose work returned `Err`: for a cron schedule,
    /// attempts of one occurrence (default [`Retry::default`]); for an
    /// interval, attempts of one interval's tick (default [`Retry::NONE`],
    /// the spec's wait), after which the role waits one interval and the
    /// next tick starts a fresh round of attempts.
    pub fn retry(mut self, retry: Retry) -> Result<Schedule, ScheduleError> {
        let in_bounds = (1..=Retry::ATTEMPTS_MAX).contains(&retry.attempts)
            && !retry.backoff.is_zero()
            && retry.backoff <= retry.backoff_max
            && retry.backoff_max <= DURATION_MAX;
        if !in_bounds {
            return Err(ScheduleError::Retry {
                attempts: retry.attempts,
                backoff: retry.backoff,
                backoff_max: retry.backoff_max,
                attempts_max: Retry::ATTEMPTS_MAX,
                max: DURATION_MAX,
            });
        }
        self.retry = retry;
        Ok(self)
    }

    fn cron_only(&self, what: &'static str) -> Result<(), ScheduleError> {
        match self.kind {
            Kind::Every(_) => Err(ScheduleError::NotForInterval { what }),
            Kind::Cron { .. } => Ok(()),
        }
    }

    /// The interval of an interval schedule.
    pub fn interval(&self) -> Option<Duration> {
        match &self.kind {
            Kind::Every(interval) => Some(*interval),
            Kind::Cron { .. } => None,
        }
    }

    /// The cron expression and zone of a cron schedule.
    pub fn expression(&self) -> Option<(&str, &str)> {
        match &self.kind {
            Kind::Every(_) => None,
            Kind::Cron { expression, zone, .. } => Some((expression, zone.name())),
        }
    }

    /// The catch-up policy.
    pub fn catch_up_policy(&self) -> CatchUp {
        self.catch_up
    }

    /// Checks the schedule can run a role family's keys: an interval, or a
    /// cron schedule catching up with [`CatchUp::Latest`] and no starting
    /// deadline (a family's batched ACQUIRE runs the latest occurrence).
    pub fn check_family(&self) -> Result<(), ScheduleError> {
        let what = match (&self.kind, self.catch_up, self.starting_deadline) {
            (Kind::Every(_), ..) | (_, CatchUp::Latest, None) => return Ok(()),
            (_, CatchUp::Latest, Some(_)) => "starting deadline",
            _ => "catch-up policy other than Latest",
        };
        Err(ScheduleError::NotForFamily { what })
    }

    /// The retry policy.
    pub fn retry_policy(&self) -> Retry {
        self.retry
    }

    /// Checks the schedule against the lease's timings: an interval the
    /// database accepts (`check_interval`); occurrences no closer than
    /// `heartbeat_every`.
    pub fn check(&self, config: &Config) -> Result<(), ScheduleError> {
        match &self.kind {
            Kind::Every(interval) => check_interval(*interval),
            Kind::Cron {
                expression,
                shortest_gap,
                ..
            } => match *shortest_gap {
                Some(gap) if gap < config.heartbeat_every() => Err(ScheduleError::FasterThanLease {
                    expression: expression.clone(),
                    gap,
                    heartbeat_every: config.heartbeat_every(),
                }),
                _ => Ok(()),
            },
        }
    }

    /// The first occurrence strictly after `after`.
    pub fn next_after(&self, after: SystemTime) -> Option<SystemTime> {
        let Kind::Cron { cron, zone, .. } = &self.kind else {
            return None;
        };
        cron.find_next_occurrence(&to_zone(after, *zone), false)
            .ok()
            .map(from_zone)
    }

    /// The latest occurrence at or before `at`.
    pub fn latest_at_or_before(&self, at: SystemTime) -> Option<SystemTime> {
        let Kind::Cron { cron, zone, .. } = &self.kind else {
            return None;
        };
        cron.find_previous_occurrence(&to_zone(at, *zone), true)
            .ok()
            .map(from_zone)
    }

    /// What runs at the database instant `now`, given `after`: the last
    /// completed occurrence (or, before the first, the instant the schedule
    /// started counting). Occurrences at or before `after` never run again.
    /// Interval schedules have no occurrences: `run` and `next` are `None`.
    /// The skipped occurrences that fell due within `paused` (the role's
    /// last pause: from, until) are recorded as [`SkipReason::Paused`].
    /// Occurrences at or before `started` (the last one a term started for)
    /// were attempted or recorded as skipped already: none is counted again.
    /// While none ever started (`None`), the latest occurrence at most
    /// [`FIRST_OCCURRENCE_GRACE`] before `after` runs, alone.
    pub fn due(
        &self,
        after: SystemTime,
        now: SystemTime,
        lease_ttl: Duration,
        paused: Option<(SystemTime, SystemTime)>,
        started: Option<SystemTime>,
    ) -> Due {
        let next = self.next_after(now);
        if started.is_none() {
            if let Some(first) = self.first_occurrence(after, now, lease_ttl) {
                return Due {
                    run: Some(first),
                    skipped: Vec::new(),
                    next,
                };
            }
        }
        let Some(latest) = self.latest_at_or_before(now).filter(|l| *l > after) else {
            return Due {
                run: None,
                skipped: Vec::new(),
                next,
            };
        };
        let deadline = match self.catch_up {
            CatchUp::Skip => Some(self.starting_deadline.unwrap_or(lease_ttl)),
            _ => self.starting_deadline,
        };
        // Occurrences before `on_time` are past their deadline.
        let on_time = deadline.and_then(|d| now.checked_sub(d)).filter(|t| *t > after);
        let candidate = match self.catch_up {
            CatchUp::All { max } => self.oldest_of_latest(latest, after, max),
            CatchUp::Latest | CatchUp::Skip => latest,
        };
        let run = match on_time {
            Some(on_time) if candidate < on_time => self.next_after(on_time - NANO).filter(|r| *r <= latest),
            _ => Some(candidate),
        };
        // Everything in (after, end) was passed over: what fell due while
        // paused for the pause, the late part for the deadline, the rest for
        // the catch-up policy.
        let end = run.unwrap_or(latest + NANO);
        let counted = started.map_or(after, |s| s.max(after));
        let late_end = on_time.map_or(counted, |t| t.clamp(counted, end.max(counted)));
        let mut skipped = Vec::new();
        for (from, until, reason) in [
            (counted, late_end, SkipReason::Deadline),
            (late_end.max(counted + NANO) - NANO, end, SkipReason::CatchUp),
        ] {
            for (from, until, reason) in split_by_pause(from, until, reason, paused) {
                skipped.extend(self.skipped(from, until, reason));
            }
        }
        Due {
            run,
            skipped: merge_by_reason(skipped),
            next,
        }
    }

    /// A role's first occurrence when none ever started: the latest one, if
    /// it falls at most [`FIRST_OCCURRENCE_GRACE`] before where counting
    /// started (`after`, the first look) and is still within the starting
    /// deadline (under [`CatchUp::Skip`], the lease TTL unless set).
    fn first_occurrence(
        &self,
        after: SystemTime,
        now: SystemTime,
        lease_ttl: Duration,
    ) -> Option<SystemTime> {
        let latest = self.latest_at_or_before(now)?;
        let deadline = match self.catch_up {
            CatchUp::Skip => Some(self.starting_deadline.unwrap_or(lease_ttl)),
            _ => self.starting_deadline,
        };
        let on_time = deadline.is_none_or(|d| now.checked_sub(d).is_none_or(|t| latest >= t));
        let in_grace = latest <= after
            && after
                .checked_sub(FIRST_OCCURRENCE_GRACE)
                .is_some_and(|g| latest > g);
        (in_grace && on_time).then_some(latest)
    }

    /// Of the occurrences in `(after, latest]`, the oldest of the most recent `max`.
    fn oldest_of_latest(&self, latest: SystemTime, after: SystemTime, max: u32) -> SystemTime {
        let mut oldest = latest;
        for _ in 1..max {
            match self.latest_at_or_before(oldest - NANO).filter(|p| *p > after) {
                Some(p) => oldest = p,
                None => break,
            }
        }
        oldest
    }

    /// The occurrences in `(after, before)`, summarized.
    fn skipped(&self, after: SystemTime, before: SystemTime, reason: SkipReason) -> Option<Skipped> {
        let first = self.next_after(after).filter(|f| *f < before)?;
        let (mut last, mut count) = (first, 1);
        while let Some(next) = self.next_after(last).filter(|n| *n < before) {
            if count == SKIPPED_COUNTED_MAX {
                let last = self.latest_at_or_before(before - NANO).unwrap_or(next);
                return Some(Skipped {
                    reason,
                    first,
                    last,
                    count,
                    more: true,
                });
            }
            (last, count) = (next, count + 1);
        }
        Some(Skipped {
            reason,
            first,
            last,
            count,
            more: false,
        })
    }

    /// Checks the expression fires from now on in its zone, and keeps the
    /// shortest gap between its occurrences.
    fn measure(&mut self) -> Result<(), ScheduleError> {
        let fires = self.next_after(SystemTime::now()).is_some();
        let gap = self.shortest_gap();
        let Kind::Cron {
            expression,
            zone,
            shortest_gap,
            ..
        } = &mut self.kind
        else {
            return Ok(());
        };
        if !fires {
            return Err(ScheduleError::NeverFires {
                expression: expression.clone(),
                zone: zone.name().to_owned(),
            });
        }
        *shortest_gap = gap;
        Ok(())
    }

    /// The shortest gap between consecutive occurrences among the next [`GAP_SAMPLE`].
    fn shortest_gap(&self) -> Option<Duration> {
        let mut at = self.next_after(SystemTime::now())?;
        let mut shortest: Option<Duration> = None;
        for _ in 0..GAP_SAMPLE {
            let Some(next) = self.next_after(at) else { break };
            let gap = next.duration_since(at).unwrap_or_default();
            shortest = Some(shortest.map_or(gap, |s| s.min(gap)));
            at = next;
        }
        shortest
    }
}

/// `every 30s`, or a cron schedule as [`Schedule::cron_tz`] reads it
/// (`CRON_TZ=Europe/Berlin 5 0 * * *`): what operators see in the status.
impl std::fmt::Display for Schedule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.kind {
            Kind::Every(interval) if self.long_lived => write!(f, "long-lived, restarted after {interval:?}"),
            Kind::Every(interval) => write!(f, "every {interval:?}"),
            Kind::Cron { expression, zone, .. } => write!(f, "CRON_TZ={} {expression}", zone.name()),
        }
    }
}

impl From<Duration> for Schedule {
    fn from(interval: Duration) -> Schedule {
        Schedule::every(interval)
    }
}

/// Parses `expression`, naming the field at fault.
fn parse(expression: &str) -> Result<Cron, ScheduleError> {
    let whole = parser().parse(expression);
    let error = match whole {
        Ok(cron) => return Ok(cron),
        Err(e) => e.to_string(),
    };
    let fields = fields(expression);
    let names: &[&str] = match fields.len() {
        5 => &FIELDS_5,
        6 => &FIELDS_6,
        _ => &[],
    };
    if expression.trim_start().starts_with('@') || names.is_empty() {
        let reason = if names.is_empty() && !expression.trim_start().starts_with('@') {
            format!(
                "{} fields; give five (minute hour day-of-month month day-of-week) or six (seconds first)",
                fields.len()
            )
        } else {
            error
        };
        return Err(ScheduleError::InvalidExpression {
            expression: expression.to_owned(),
            reason,
        });
    }
    for (i, (position, value)) in fields.iter().enumerate() {
        let alone: Vec<&str> = (0..fields.len())
            .map(|j| if j == i { *value } else { "*" })
            .collect();
        if let Err(e) = parser().parse(&alone.join(" ")) {
            return Err(ScheduleError::InvalidField {
                expression: expression.to_owned(),
                field: names[i],
                value: (*value).to_owned(),
                position: *position,
                reason: e.to_string(),
            });
        }
    }
    Err(ScheduleError::InvalidExpression {
        expression: expression.to_owned(),
        reason: error,
    })
}

/// The whitespace-separated fields of `expression` with the character
/// position (from 1) each starts at.
fn fields(expression: &str) -> Vec<(usize, &str)> {
    let mut out = Vec::new();
    let mut start = None;
    for (chars, (byte, c)) in expression.char_indices().enumerate() {
        match (c.is_whitespace(), start) {
            (false, None) => start = Some((chars + 1, byte)),
            (true, Some((position, from))) => {
                out.push((position, &expression[from..byte]));
                start = None;
            }
            _ => {}
        }
    }
    if let Some((position, from)) = start {
        out.push((position, &expression[from..]));
    }
    out
}

fn to_zone(at: SystemTime, zone: Tz) -> DateTime<Tz> {
    DateTime::<Utc>::from(at).with_timezone(&zone)
}

fn from_zone(at: DateTime<Tz>) -> SystemTime {
    at.with_timezone(&Utc).into()
}
