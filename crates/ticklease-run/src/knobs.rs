//! A job's knobs, the same on the command line and in the jobs file: the
//! schedule (`every`, `cron`, `zone`, `catch_up`, `starting_deadline`),
//! retries (`attempts`, `backoff`, `backoff_max`), a long-lived command's
//! restart backoff (`restart_backoff`, `restart_backoff_max`), `timeout` and
//! `grace`. Both front ends parse into [`Knobs`]; one set of checks turns
//! them into a schedule, so a knob means the same and is refused for the
//! same reason whichever way it was given, naming the key (`{}`) or the
//! flag (`{:#}`).
//!
//! **A long-lived command** (no `every`, no `cron`) is meant to run until
//! the runner stops it. Whatever its exit, it is started again on whichever
//! host acquires the role next: after `restart_backoff` when it exited 0
//! (the term completes, and the backoff starts over), after a wait that
//! doubles with each consecutive failure (a non-zero exit, a signal, a
//! timeout) from `restart_backoff` up to `restart_backoff_max` otherwise,
//! except after a run at least `restart_backoff_max` long (a healthy one):
//! then `restart_backoff` alone ([`ticklease::Schedule::long_lived`]).
//! The database counts the failures since the last exit 0 (the library's
//! interval retries, [`ticklease::Retry`], with [`ticklease::Retry::ATTEMPTS_MAX`]
//! attempts a round): after that many consecutive failures one restart
//! waits `restart_backoff` and the doubling starts over.

use std::time::Duration;

use ticklease::{CatchUp, Config, Retry, Schedule};

/// A long-lived command's wait before it is started again after exit 0,
/// and the first wait after a failure.
pub const RESTART_BACKOFF_DEFAULT: Duration = Duration::from_secs(1);

/// The longest wait before a long-lived command that keeps failing is
/// started again.
pub const RESTART_BACKOFF_MAX_DEFAULT: Duration = Duration::from_secs(60);

/// The longest `timeout` accepted: a day, as the lease library's longest
/// duration.
pub const TIMEOUT_MAX: Duration = ticklease::DURATION_MAX;

/// One knob, named as the jobs file names it (`starting_deadline`) or, in
/// the alternate form, as the flag (`--starting-deadline`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Every,
    Cron,
    Zone,
    CatchUp,
    StartingDeadline,
    Attempts,
    Backoff,
    BackoffMax,
    RestartBackoff,
    RestartBackoffMax,
    Timeout,
    Grace,
}

impl Key {
    /// The jobs file's name of the knob.
    pub fn as_str(self) -> &'static str {
        match self {
            Key::Every => "every",
            Key::Cron => "cron",
            Key::Zone => "zone",
            Key::CatchUp => "catch_up",
            Key::StartingDeadline => "starting_deadline",
            Key::Attempts => "attempts",
            Key::Backoff => "backoff",
            Key::BackoffMax => "backoff_max",
            Key::RestartBackoff => "restart_backoff",
            Key::RestartBackoffMax => "restart_backoff_max",
            Key::Timeout => "timeout",
            Key::Grace => "grace",
        }
    }
}

impl std::fmt::Display for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match f.alternate() {
            true => write!(f, "--{}", self.as_str().replace('_', "-")),
            false => f.write_str(self.as_str()),
        }
    }
}

/// What kind of job a knob belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A cron schedule (`cron`).
    Cron,
    /// A schedule of either kind (`every` or `cron`).
    Scheduled,
    /// A long-lived command (neither `every` nor `cron`).
    LongLived,
}

impl std::fmt::Display for Kind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Kind::Cron => "a cron schedule (cron)",
            Kind::Scheduled => {
                "a schedule (every or cron; a long-lived command has restart_backoff and restart_backoff_max)"
            }
            Kind::LongLived => "a long-lived command (neither every nor cron)",
        })
    }
}

/// A knob refused: `{}` names the jobs file's key, `{:#}` the flag.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KnobError {
    /// The knob belongs to another kind of job.
    NotFor { key: Key, kind: Kind },
    /// Two knobs that exclude each other.
    Conflict { key: Key, other: Key },
    /// The knob's value is out of bounds or malformed.
    Invalid { key: Key, reason: String },
}

impl std::fmt::Display for KnobError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = |key: &Key| match f.alternate() {
            true => format!("{key:#}"),
            false => key.to_string(),
        };
        match self {
            KnobError::NotFor { key, kind } => write!(f, "{} belongs to {kind}", name(key)),
            KnobError::Conflict { key, other } => write!(f, "{} and {}: at most one", name(key), name(other)),
            KnobError::Invalid { key, reason } => write!(f, "{}: {reason}", name(key)),
        }
    }
}

/// A job's knobs as given (each `None` when not given).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Knobs {
    pub every: Option<Duration>,
    pub cron: Option<String>,
    pub zone: Option<String>,
    pub catch_up: Option<String>,
    pub starting_deadline: Option<Duration>,
    pub attempts: Option<u32>,
    pub backoff: Option<Duration>,
    pub backoff_max: Option<Duration>,
    pub restart_backoff: Option<Duration>,
    pub restart_backoff_max: Option<Duration>,
    pub timeout: Option<Duration>,
    pub grace: Option<Duration>,
}

fn invalid(key: Key) -> impl Fn(String) -> KnobError {
    move |reason| KnobError::Invalid { key, reason }
}

impl Knobs {
    /// The job's schedule, checked against the lease's timings: an
    /// interval, a cron schedule, or a long-lived command's restarts.
    pub fn schedule(&self, config: &Config) -> Result<Schedule, KnobError> {
        self.check_kinds()?;
        let (schedule, key) = match (self.every, &self.cron) {
            (Some(every), _) => (Schedule::every(every), Key::Every),
            (None, Some(_)) => (self.cron()?, Key::Cron),
            (None, None) => (self.restarts()?, Key::RestartBackoff),
        };
        schedule.check(config).map_err(|e| KnobError::Invalid {
            key,
            reason: e.to_string(),
        })?;
        match (self.every, &self.cron) {
            (None, None) => Ok(schedule),
            _ => self.retry(schedule),
        }
    }

    /// Each knob given belongs to the kind of job the others make.
    fn check_kinds(&self) -> Result<(), KnobError> {
        if self.every.is_some() && self.cron.is_some() {
            return Err(KnobError::Conflict {
                key: Key::Every,
                other: Key::Cron,
            });
        }
        let cron = self.cron.is_some();
        let scheduled = cron || self.every.is_some();
        let given = [
            (Key::Zone, self.zone.is_some(), cron, Kind::Cron),
            (Key::CatchUp, self.catch_up.is_some(), cron, Kind::Cron),
            (
                Key::StartingDeadline,
                self.starting_deadline.is_some(),
                cron,
                Kind::Cron,
            ),
            (Key::Attempts, self.attempts.is_some(), scheduled, Kind::Scheduled),
            (Key::Backoff, self.backoff.is_some(), scheduled, Kind::Scheduled),
            (
                Key::BackoffMax,
                self.backoff_max.is_some(),
                scheduled,
                Kind::Scheduled,
            ),
            (
                Key::RestartBackoff,
                self.restart_backoff.is_some(),
                !scheduled,
                Kind::LongLived,
            ),
            (
                Key::RestartBackoffMax,
                self.restart_backoff_max.is_some(),
                !scheduled,
                Kind::LongLived,
            ),
        ];
        match given.iter().find(|(_, given, fits, _)| *given && !fits) {
            Some((key, _, _, kind)) => Err(KnobError::NotFor {
                key: *key,
                kind: *kind,
            }),
            None => Ok(()),
        }
    }

    fn cron(&self) -> Result<Schedule, KnobError> {
        let expression = self.cron.as_deref().unwrap_or_default();
        let mut cron = Schedule::cron(expression).map_err(|e| invalid(Key::Cron)(e.to_string()))?;
        if let Some(zone) = &self.zone {
            cron = cron.zone(zone).map_err(|e| invalid(Key::Zone)(e.to_string()))?;
        }
        if let Some(policy) = &self.catch_up {
            let policy = catch_up(policy).map_err(invalid(Key::CatchUp))?;
            cron = cron
                .catch_up(policy)
                .map_err(|e| invalid(Key::CatchUp)(e.to_string()))?;
        }
        if let Some(deadline) = self.starting_deadline {
            cron = cron
                .starting_deadline(deadline)
                .map_err(|e| invalid(Key::StartingDeadline)(e.to_string()))?;
        }
        Ok(cron)
    }

    /// The schedule's retry policy with the knobs given over its defaults
    /// (a cron schedule's [`Retry::default`], an interval's [`Retry::NONE`]);
    /// `backoff_max` is at least `backoff` unless given.
    fn retry(&self, schedule: Schedule) -> Result<Schedule, KnobError> {
        if (self.attempts, self.backoff, self.backoff_max) == (None, None, None) {
            return Ok(schedule);
        }
        let base = schedule.retry_policy();
        let attempts = self.attempts.unwrap_or(base.attempts);
        if !(1..=Retry::ATTEMPTS_MAX).contains(&attempts) {
            return Err(invalid(Key::Attempts)(format!(
                "{attempts}: from 1 to {}",
                Retry::ATTEMPTS_MAX
            )));
        }
        let backoff = self.backoff.unwrap_or(base.backoff);
        let backoff_max = self.backoff_max.unwrap_or(base.backoff_max.max(backoff));
        let (backoff, backoff_max) = backoffs(backoff, backoff_max, (Key::Backoff, Key::BackoffMax))?;
        schedule
            .retry(Retry {
                attempts,
                backoff,
                backoff_max,
            })
            .map_err(|e| invalid(Key::Attempts)(e.to_string()))
    }

    /// A long-lived command's schedule: started again `restart_backoff`
    /// after exit 0, after a doubling wait up to `restart_backoff_max`
    /// after each consecutive failure (the module's docs).
    fn restarts(&self) -> Result<Schedule, KnobError> {
        let first = self.restart_backoff.unwrap_or(RESTART_BACKOFF_DEFAULT);
        let max = self
            .restart_backoff_max
            .unwrap_or(RESTART_BACKOFF_MAX_DEFAULT.max(first));
        let (backoff, backoff_max) = backoffs(first, max, (Key::RestartBackoff, Key::RestartBackoffMax))?;
        let retry = Retry {
            attempts: Retry::ATTEMPTS_MAX,
            backoff,
            backoff_max,
        };
        Schedule::long_lived(first)
            .retry(retry)
            .map_err(|e| invalid(Key::RestartBackoff)(e.to_string()))
    }

    /// The timeout, above zero and at most [`TIMEOUT_MAX`].
    pub fn timeout(&self) -> Result<Option<Duration>, KnobError> {
        match self.timeout {
            Some(t) if t.is_zero() || t > TIMEOUT_MAX => Err(invalid(Key::Timeout)(format!(
                "{t:?}: must be above zero and at most {TIMEOUT_MAX:?}"
            ))),
            timeout => Ok(timeout),
        }
    }

    /// The grace, checked against the lease ([`crate::check_grace`]).
    pub fn grace(&self, config: &Config) -> Result<Duration, KnobError> {
        let grace = self.grace.unwrap_or_else(|| crate::default_grace(config));
        match crate::runner::grace_problem(config, grace) {
            Some(reason) => Err(invalid(Key::Grace)(reason)),
            None => Ok(grace),
        }
    }
}

/// A backoff and its cap: the first above zero, at most the cap, the cap
/// at most the library's longest duration.
fn backoffs(first: Duration, max: Duration, keys: (Key, Key)) -> Result<(Duration, Duration), KnobError> {
    if first.is_zero() {
        return Err(invalid(keys.0)("must be above zero".into()));
    }
    if max < first || max > ticklease::DURATION_MAX {
        return Err(invalid(keys.1)(format!(
            "{max:?}: must be at least {} ({first:?}) and at most {:?}",
            keys.0,
            ticklease::DURATION_MAX
        )));
    }
    Ok((first, max))
}

/// A catch-up policy by name: `latest`, `skip` or `all:N`.
fn catch_up(policy: &str) -> Result<CatchUp, String> {
    match policy {
        "latest" => Ok(CatchUp::Latest),
        "skip" => Ok(CatchUp::Skip),
        other => match other.strip_prefix("all:").map(str::parse::<u32>) {
            Some(Ok(max)) => Ok(CatchUp::All { max }),
            _ => Err(format!("{other:?}: expected latest, skip or all:N")),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> Config {
        Config::default()
    }

    #[test]
    fn a_knob_of_another_kind_of_job_is_refused_naming_the_key_or_the_flag() {
        let knobs = Knobs {
            every: Some(Duration::from_secs(60)),
            starting_deadline: Some(Duration::from_secs(5)),
            ..Knobs::default()
        };
        let e = knobs.schedule(&config()).unwrap_err();
        assert_eq!(
            e.to_string(),
            "starting_deadline belongs to a cron schedule (cron)"
        );
        assert!(
            format!("{e:#}").starts_with("--starting-deadline belongs to"),
            "{e:#}"
        );
        let long_lived = Knobs {
            attempts: Some(3),
            ..Knobs::default()
        };
        assert!(matches!(
            long_lived.schedule(&config()),
            Err(KnobError::NotFor {
                key: Key::Attempts,
                kind: Kind::Scheduled
            })
        ));
        let interval = Knobs {
            every: Some(Duration::from_secs(60)),
            restart_backoff: Some(Duration::from_secs(1)),
            ..Knobs::default()
        };
        assert!(matches!(
            interval.schedule(&config()),
            Err(KnobError::NotFor {
                key: Key::RestartBackoff,
                kind: Kind::LongLived
            })
        ));
    }

    #[test]
    fn retries_and_restarts_are_bounded() {
        let cron = |attempts, backoff, backoff_max| Knobs {
            cron: Some("0 * * * *".into()),
            attempts,
            backoff,
            backoff_max,
            ..Knobs::default()
        };
        let secs = |s| Some(Duration::from_secs(s));
        let policy = cron(Some(5), secs(1), None)
            .schedule(&config())
            .unwrap()
            .retry_policy();
        assert_eq!((policy.attempts, policy.backoff), (5, Duration::from_secs(1)));
        assert_eq!(policy.backoff_max, Retry::BACKOFF_MAX_DEFAULT);
        let long = cron(None, secs(600), None)
            .schedule(&config())
            .unwrap()
            .retry_policy();
        assert_eq!(
            long.backoff_max,
            Duration::from_secs(600),
            "the cap follows a longer backoff"
        );
        for (knobs, key) in [
            (cron(Some(0), None, None), Key::Attempts),
            (cron(Some(Retry::ATTEMPTS_MAX + 1), None, None), Key::Attempts),
            (cron(None, secs(0), None), Key::Backoff),
            (cron(None, secs(10), secs(5)), Key::BackoffMax),
            (cron(None, None, secs(2 * 86_400)), Key::BackoffMax),
        ] {
            match knobs.schedule(&config()) {
                Err(KnobError::Invalid { key: k, .. }) => assert_eq!(k, key, "{knobs:?}"),
                other => panic!("{knobs:?}: {other:?}"),
            }
        }
        let restarts = Knobs::default().schedule(&config()).unwrap();
        assert_eq!(restarts.interval(), Some(RESTART_BACKOFF_DEFAULT));
        let policy = restarts.retry_policy();
        assert_eq!(
            (policy.backoff, policy.backoff_max),
            (RESTART_BACKOFF_DEFAULT, RESTART_BACKOFF_MAX_DEFAULT)
        );
        assert_eq!(
            policy.backoff_in_round(10),
            Some(RESTART_BACKOFF_MAX_DEFAULT),
            "capped"
        );
        let inverted = Knobs {
            restart_backoff: secs(10),
            restart_backoff_max: secs(5),
            ..Knobs::default()
        };
        assert!(matches!(
            inverted.schedule(&config()),
            Err(KnobError::Invalid {
                key: Key::RestartBackoffMax,
                ..
            })
        ));
    }

    #[test]
    fn a_timeout_is_above_zero_and_at_most_a_day() {
        let timeout = |t| Knobs {
            timeout: Some(t),
            ..Knobs::default()
        };
        assert!(timeout(Duration::ZERO).timeout().is_err());
        assert!(timeout(TIMEOUT_MAX + Duration::from_secs(1)).timeout().is_err());
        assert_eq!(timeout(TIMEOUT_MAX).timeout(), Ok(Some(TIMEOUT_MAX)));
    }
}
