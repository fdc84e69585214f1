//! The failover manager's word (opt-in, [`crate::PgStore::with_patroni`]): a
//! term starts, and runs on, only while Patroni says that the server this
//! store's statements reach is the primary.
//!
//! Why: timelines ([`crate::hosts`]) tell an old primary from the promoted
//! one only when this process reaches both. A process that cannot see the
//! promotion (the old primary's Patroni died and nothing demoted it; a
//! partition; the promoted server's connection slots full; a pooler in front
//! of the old primary) reaches a writable server whose lease rows still name
//! its terms: RENEW succeeds there, and the term's work runs beside the
//! promoted server's. Patroni decided the promotion; its REST API says who
//! holds the leader key.
//!
//! The check, every half `heartbeat_every`: `GET /primary` on every given
//! member at once, then `GET /config` on the member that answered 200, and
//! the postmaster start time of the server the store's pool reaches (one
//! statement: a server's identity, through a pooler too). Confirmed when a
//! member answered 200 (Patroni answers 200 only while its member holds the
//! leader key) as a running primary whose postmaster started at that time,
//! whose DCS contact is fresh, and whose settings (read again at every
//! check: an `edit-config` counts) still admit this store's timings. Not
//! the timeline: Patroni answers 200 as soon as its member holds the key,
//! while its Postgres still replays WAL on the old timeline, which an old
//! primary's timeline equals. The instant the check started is the
//! confirmation's.
//!
//! The bound: the leader reads the DCS (`dcs_last_seen`) then renews its
//! key, every `loop_wait`; it demotes itself (answering 503 from then on)
//! once a renewal has failed for `retry_timeout`; another member takes the
//! key only when it expires, `ttl` after the last renewal. A live loop's
//! 200 therefore comes at most `loop_wait + retry_timeout` after its last
//! renewal. A frozen loop whose REST thread lives answers 200 until the key
//! expires: an answer counts only when its `dcs_last_seen` is at most
//! `loop_wait + 1 s` older than its `Date` (both Patroni's clock, whole
//! seconds: the answer came less than `loop_wait + 2 s` after a DCS read,
//! whose renewal came at most a cycle later, or, the loop frozen between
//! the two, a cycle earlier: `loop_wait` and the cycle's work, taken to be
//! under 1 s). The leader's REST thread refreshes `dcs_last_seen` too when
//! it reads the DCS itself (`GET /cluster`; `/config` and `/history` once
//! the loop's view is `ttl` old): the settings are read from the other
//! members, and a monitor polling the leader's `/cluster` leaves a stalled
//! loop to Patroni's watchdog. So no member is promoted before a confirmation's instant +
//! `ttl − loop_wait − max(retry_timeout, loop_wait + 3 s)` (the margin). A
//! term ends `abandon_after` after its last confirmation (the heartbeat,
//! reason `superseded`), and ACQUIRE is not sent without a confirmation
//! younger than `abandon_after − heartbeat_every`;
//! [`crate::PgStore::with_patroni`] refuses `abandon_after +
//! statement_timeout` above the margin, and a check whose settings do so
//! confirms nothing, so an old primary's terms have stopped, with their
//! last statement, before another server is promoted. Settings that no
//! longer admit the timings withdraw the word: running terms end at their
//! next beat. It relies on
//! Patroni's `failsafe_mode` off (refused when on: a leader cut off from
//! the DCS then stays primary), on Patroni 2.1 or later (`dcs_last_seen`),
//! and on the clocks of the Patroni hosts and this one running at one rate.
//! Patroni unreachable ends terms too: without its word no term runs.
//!
//! The REST client ([`Patroni`]) is the `patroni` feature (on by default).

use std::time::Duration;

/// Most Patroni members one check asks.
pub const PATRONI_URLS_MAX: usize = 16;
/// What the whole seconds of `dcs_last_seen` and `Date` (and the HA
/// cycle's own work) add to the age of an answer's DCS contact.
const WHOLE_SECONDS_SLACK: Duration = Duration::from_secs(1);

pub use crate::error::PatroniError;

/// Patroni's settings that bound its promotions.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PatroniSettings {
    /// How long the leader key lives unrenewed.
    pub ttl: Duration,
    /// How often the leader renews it.
    pub loop_wait: Duration,
    /// How long a failing renewal is retried before the leader demotes itself.
    pub retry_timeout: Duration,
    /// A leader cut off from the DCS stays primary while it reaches every member.
    pub failsafe_mode: bool,
}

impl PatroniSettings {
    /// How long after a confirmation no other member can be promoted.
    pub fn margin(&self) -> Duration {
        // A live loop's last 200 comes within loop_wait + retry_timeout of
        // its renewal; a frozen loop's within 2 × loop_wait + 3 s (see above).
        let frozen = self.loop_wait + 3 * WHOLE_SECONDS_SLACK;
        self.ttl
            .saturating_sub(self.loop_wait + self.retry_timeout.max(frozen))
    }

    /// How much older than its answer a leader's last DCS read may be for
    /// its answer to count.
    pub fn dcs_contact_within(&self) -> Duration {
        self.loop_wait + WHOLE_SECONDS_SLACK
    }

    /// Whether these settings bound a term of these timings: `failsafe_mode`
    /// off, and `abandon_after + statement_timeout` within the margin.
    pub fn admit(&self, abandon_after: Duration, statement_timeout: Duration) -> Result<(), PatroniError> {
        if self.failsafe_mode {
            return Err(PatroniError::FailsafeMode);
        }
        if abandon_after + statement_timeout > self.margin() {
            return Err(PatroniError::Margin {
                abandon_after,
                statement_timeout,
                ttl: self.ttl,
                loop_wait: self.loop_wait,
                retry_timeout: self.retry_timeout,
            });
        }
        Ok(())
    }
}

#[cfg(feature = "patroni")]
pub(crate) mod check;
#[cfg(feature = "patroni")]
mod client;
#[cfg(feature = "patroni")]
pub use client::Patroni;

/// What the failover manager last said of the store's server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Confirmation {
    /// Never confirmed as the primary.
    Never,
    /// Confirmed by the check that started at this instant (the latest).
    At(std::time::Instant),
}

#[cfg(test)]
mod tests {
    use super::*;

    pub(crate) const SECOND: Duration = Duration::from_secs(1);

    /// Settings of these whole seconds, failsafe_mode off.
    pub(crate) fn settings(ttl: u64, loop_wait: u64, retry_timeout: u64) -> PatroniSettings {
        PatroniSettings {
            ttl: SECOND * ttl as u32,
            loop_wait: SECOND * loop_wait as u32,
            retry_timeout: SECOND * retry_timeout as u32,
            failsafe_mode: false,
        }
    }

    #[test]
    fn the_margin_is_the_ttl_less_a_loop_and_the_longer_of_the_retries_and_a_frozen_loop() {
        // Patroni's defaults: a frozen loop (10 + 3 s) outlasts the retries (10 s).
        assert_eq!(settings(30, 10, 10).margin(), SECOND * 7);
        // The test kit's: the retries (5 s) outlast a frozen loop (1 + 3 s).
        assert_eq!(settings(20, 1, 5).margin(), SECOND * 14);
        assert_eq!(settings(5, 10, 10).margin(), Duration::ZERO);
    }
}
