//! When a role loop asks the database next: one decision for single roles
//! and family keys alike, from what the last ACQUIRE answered.

use std::time::Duration;

use crate::config::Config;
use crate::store::Refusal;

/// What the last poll of a role loop found.
#[derive(Debug)]
pub(crate) enum Polled<'a> {
    /// ACQUIRE started no term.
    Refused(&'a Refusal),
    /// A term ran and ended: the database knows when the role is due next.
    TermEnded,
    /// The poll failed (an error or a panic).
    Failed,
    /// No ACQUIRE was sent: the failover manager has not confirmed the
    /// store's server ([`crate::StoreError::NotConfirmed`]); its check runs
    /// every half beat, and a confirmation is acted on at the next.
    Unconfirmed,
}

/// When a role loop asks the database next, and what wakes it earlier.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Wake {
    pub(crate) after: Duration,
    /// The holder whose coordination session's end wakes it.
    pub(crate) holder_key: Option<i64>,
    /// Whether the store's connections coming back (or Patroni confirming
    /// its server) wakes it ([`crate::store::LeaseStore::usable`]).
    pub(crate) on_usable: bool,
    /// Whether Patroni confirming the store's server again wakes it
    /// ([`crate::store::LeaseStore::confirmed_again`]).
    pub(crate) on_confirmed: bool,
}

/// Retry after losing a race to another replica's ACQUIRE: the next answer
/// names the winner (and its key to wait on).
const CONTENDED_RETRY: Duration = Duration::from_millis(50);

/// Longest sleep with a coordination session, which tells of releases,
/// unpauses and run-nows: a guard against a notification lost with the
/// session between its end and the reconnect's wake-up.
const SIGNALLED_SLEEP_MAX: Duration = Duration::from_secs(60);

/// The one place that decides when a role loop next ACQUIREs. Times come
/// from the database's answer (the holder's expiry, the due time), measured
/// from the answer's arrival, so a follower never wakes before them. Without
/// a coordination session (`signalled` false) the wait is capped at
/// `max_poll`, the bound on noticing a release or an unpause.
pub(crate) fn next_wake(polled: &Polled<'_>, config: &Config, signalled: bool) -> Wake {
    let cap = |d: Duration| {
        if signalled {
            d.min(SIGNALLED_SLEEP_MAX)
        } else {
            d.min(config.max_poll())
        }
    };
    let after = |after| Wake {
        after,
        holder_key: None,
        on_usable: false,
        on_confirmed: false,
    };
    match polled {
        Polled::TermEnded => after(Duration::ZERO),
        Polled::Failed => Wake {
            on_usable: true,
            ..after(config.max_poll())
        },
        // Only a confirmation lets the next ACQUIRE be sent: a connection
        // that comes back (a login ending our backends, a flapping link)
        // would wake the loop for another refusal.
        Polled::Unconfirmed => Wake {
            on_confirmed: true,
            ..after(config.heartbeat_every() / 2)
        },
        Polled::Refused(Refusal::Held {
            remaining,
            holder_key,
            ..
        }) => Wake {
            holder_key: holder_key.filter(|_| signalled),
            ..after(cap(*remaining))
        },
        Polled::Refused(Refusal::NotDue { remaining, .. }) => after(cap(*remaining)),
        Polled::Refused(Refusal::Contended) => after(CONTENDED_RETRY),
        // A family key past its replica's limit: asked again once the
        // replica has room (its family loop waits for a term to end).
        Polled::Refused(Refusal::OverLimit) => after(Duration::ZERO),
        // An unpause from psql notifies no one (no decision notifies in its
        // own transaction): a paused role is asked about every max_poll.
        Polled::Refused(Refusal::Paused { .. }) => after(config.max_poll()),
    }
}

#[cfg(test)]
mod tests {
    use std::time::SystemTime;

    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn held(remaining: Duration, holder_key: Option<i64>) -> Refusal {
        Refusal::Held {
            holder: "h".into(),
            expires_at: SystemTime::UNIX_EPOCH,
            remaining,
            holder_key,
        }
    }

    fn wake(polled: Polled<'_>, signalled: bool) -> (Duration, Option<i64>) {
        let w = next_wake(&polled, &Config::default(), signalled);
        (w.after, w.holder_key)
    }

    fn on_usable(polled: Polled<'_>) -> bool {
        next_wake(&polled, &Config::default(), true).on_usable
    }

    fn on_confirmed(polled: Polled<'_>) -> bool {
        next_wake(&polled, &Config::default(), true).on_confirmed
    }

    #[test]
    fn a_follower_wakes_when_the_holders_lease_runs_out_capped_at_max_poll_without_signals() {
        let soon = held(S(2), Some(7));
        let late = held(S(9), Some(7));
        assert_eq!(wake(Polled::Refused(&soon), false), (S(2), None));
        assert_eq!(wake(Polled::Refused(&late), false), (S(5), None));
        assert_eq!(wake(Polled::Refused(&late), true), (S(9), Some(7)));
        let keyless = held(S(9), None);
        assert_eq!(wake(Polled::Refused(&keyless), true), (S(9), None));
    }

    #[test]
    fn a_role_not_due_wakes_at_its_due_time_and_a_paused_one_is_asked_every_max_poll() {
        let due = Refusal::NotDue {
            due_at: SystemTime::UNIX_EPOCH,
            remaining: S(3600),
        };
        assert_eq!(wake(Polled::Refused(&due), false).0, S(5));
        assert_eq!(wake(Polled::Refused(&due), true).0, SIGNALLED_SLEEP_MAX);
        let paused = Refusal::Paused {
            by: "ops".into(),
            reason: String::new(),
        };
        assert_eq!(wake(Polled::Refused(&paused), false).0, S(5));
        // An unpause from psql notifies no one: a session does not help.
        assert_eq!(wake(Polled::Refused(&paused), true).0, S(5));
    }

    #[test]
    fn only_a_failed_poll_is_woken_by_the_store_becoming_usable() {
        assert!(on_usable(Polled::Failed));
        assert!(
            !on_usable(Polled::Unconfirmed),
            "a connection back confirms nothing"
        );
        assert!(!on_usable(Polled::TermEnded));
        assert!(!on_usable(Polled::Refused(&held(S(2), Some(7)))));
        assert!(!on_usable(Polled::Refused(&Refusal::Contended)));
    }

    #[test]
    fn only_an_unconfirmed_poll_is_woken_by_a_confirmation() {
        assert!(on_confirmed(Polled::Unconfirmed));
        assert!(!on_confirmed(Polled::Failed));
        assert!(!on_confirmed(Polled::TermEnded));
        assert!(!on_confirmed(Polled::Refused(&held(S(2), Some(7)))));
    }

    #[test]
    fn after_a_term_the_loop_asks_at_once_and_after_a_failure_it_waits_max_poll() {
        assert_eq!(wake(Polled::TermEnded, true).0, Duration::ZERO);
        assert_eq!(wake(Polled::Failed, true).0, S(5));
        assert_eq!(wake(Polled::Unconfirmed, true).0, Duration::from_millis(1500));
        assert_eq!(
            wake(Polled::Refused(&Refusal::Contended), false).0,
            CONTENDED_RETRY
        );
    }
}
