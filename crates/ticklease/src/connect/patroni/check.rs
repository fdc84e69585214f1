//! The check's state (feature `patroni`): what one check heard, and the
//! latest confirmation the store's statements and heartbeats read.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::{CancellationToken, DropGuard};

use super::{Confirmation, PatroniError, PatroniSettings};

/// What the member answering as the primary said, at one check.
#[derive(Debug)]
pub(crate) struct Word {
    /// Its postmaster's start time, µs since the epoch.
    pub(crate) postmaster: i64,
    /// Its `Date` less its `dcs_last_seen`, in whole seconds (`None` when
    /// either is missing: a Patroni before 2.1, or no `Date`).
    pub(crate) dcs_contact_age_secs: Option<i64>,
    /// The settings as last read (again at every check, in the
    /// background: a member that hangs slows no confirmation).
    pub(crate) settings: Result<PatroniSettings, Arc<PatroniError>>,
}

/// Why a check confirmed nothing.
#[derive(Debug)]
pub(crate) enum Refusal {
    /// No member answered as a running primary.
    NoLeader,
    /// The leader's last DCS contact is too old, or unknown: its HA loop
    /// may be stalled while its REST API answers.
    Stale {
        /// How old, in whole seconds.
        age_secs: Option<i64>,
    },
    /// Its settings no longer bound a term.
    Settings(Arc<PatroniError>),
}

impl Word {
    /// The leader's postmaster, if its word bounds a term of these timings.
    pub(crate) fn confirms(
        self,
        abandon_after: Duration,
        statement_timeout: Duration,
    ) -> Result<i64, Refusal> {
        let settings = self.settings.map_err(Refusal::Settings)?;
        settings
            .admit(abandon_after, statement_timeout)
            .map_err(|e| Refusal::Settings(Arc::new(e)))?;
        let within = i64::try_from(settings.dcs_contact_within().as_secs()).unwrap_or(i64::MAX);
        match self.dcs_contact_age_secs {
            // Below zero only when Patroni's clock stepped back since its
            // last DCS read: an age that says nothing.
            Some(age) if (0..=within).contains(&age) => Ok(self.postmaster),
            age_secs => Err(Refusal::Stale { age_secs }),
        }
    }
}

/// The postmaster start time (µs since the epoch) of the server a
/// statement reaches, NULL while it is in recovery. Callable by any login.
pub(crate) const POSTMASTER_SQL: &str = "SELECT CASE WHEN pg_catalog.pg_is_in_recovery() THEN NULL \
     ELSE (EXTRACT(epoch FROM pg_catalog.pg_postmaster_start_time()) * 1000000)::int8 END";

/// The shortest time between two checks, however often the store's
/// connections change: each costs a request to every member.
const CHECK_SPACING: Duration = Duration::from_millis(100);

/// How many checks per period while the last one confirmed nothing: a
/// failover is then under way (the primary's Patroni died, or Patroni
/// names a server the store does not reach yet), and the promoted server is
/// confirmed within a quarter period of Patroni naming it, not a period.
const SUSPECT_CHECKS_PER_PERIOD: u32 = 4;

/// The latest confirmation, shared by the check's task and the store's clones.
#[derive(Debug)]
pub(crate) struct Confirmations {
    at: Mutex<Option<Instant>>,
    /// The last check's outcome (for one log line per change).
    outcome: Mutex<Option<Outcome>>,
}

impl Confirmations {
    pub(crate) fn latest(&self) -> Confirmation {
        match *self.at.lock().expect("not poisoned") {
            Some(at) => Confirmation::At(at.into_std()),
            None => Confirmation::Never,
        }
    }

    /// Records one check's result; logs a change of outcome. The outcome,
    /// and whether it changed.
    fn record(&self, started: Instant, leader: Result<i64, Refusal>, ours: Option<i64>) -> (Outcome, bool) {
        let outcome = match (&leader, ours) {
            (Ok(leader), Some(ours)) if *leader == ours => Outcome::Confirmed,
            (Ok(_), _) => Outcome::OtherServer,
            (Err(Refusal::NoLeader), _) => Outcome::NoLeader,
            (Err(Refusal::Stale { .. }), _) => Outcome::Stale,
            (Err(Refusal::Settings(_)), _) => Outcome::Settings,
        };
        let mut at = self.at.lock().expect("not poisoned");
        match outcome {
            Outcome::Confirmed => *at = Some(at.map_or(started, |before| before.max(started))),
            // Settings that no longer bound a term withdraw the word given
            // under the old ones: its margin is gone, so terms end at their
            // next beat, not abandon_after after it.
            Outcome::Settings => *at = None,
            _ => {}
        }
        drop(at);
        let before = self.outcome.lock().expect("not poisoned").replace(outcome);
        if before == Some(outcome) {
            return (outcome, false);
        }
        const ENDS: &str = "no term starts, and terms end abandon_after after the last confirmation";
        match leader {
            Ok(_) if outcome == Outcome::Confirmed => {
                tracing::info!(postmaster_start_us = ?ours, "Patroni confirms the store's server as the primary")
            }
            Ok(_) => tracing::warn!(
                reached_primary = ours.is_some(),
                "Patroni's primary is not the store's server: {ENDS}"
            ),
            Err(Refusal::NoLeader) => {
                tracing::warn!("no Patroni member says it is a running primary: {ENDS}")
            }
            Err(Refusal::Stale { age_secs }) => tracing::warn!(dcs_contact_age_secs = ?age_secs,
                "Patroni's primary has not reached its DCS lately (its HA loop may be stalled) or does not say when: {ENDS}"),
            Err(Refusal::Settings(error)) => tracing::error!(error = %error,
                "Patroni's settings no longer bound a term: no term starts, and running terms end at their next beat"),
        }
        (outcome, true)
    }
}

/// A check's outcome, for one log line per change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Confirmed,
    OtherServer,
    NoLeader,
    Stale,
    Settings,
}

/// What the check tells the store, and what it hears from it.
pub(crate) struct Hooks<G, E> {
    /// Moves when the store answers again or its connections reached
    /// another host: the check runs at once ([`CHECK_SPACING`] after the
    /// last, and once per period at most), so a promoted server is confirmed
    /// when the store reaches it, not up to a check's period later.
    pub(crate) again: watch::Receiver<u64>,
    /// Called when a check confirms after one that did not.
    pub(crate) gained: G,
    /// Awaited after each check in which Patroni named another server
    /// than the store's: the store looks for it among its URL's hosts then,
    /// not at its next probe.
    pub(crate) elsewhere: E,
}

/// The period while the last check confirmed nothing; never under
/// [`CHECK_SPACING`].
fn suspect_every(every: Duration) -> Duration {
    (every / SUSPECT_CHECKS_PER_PERIOD).max(CHECK_SPACING).min(every)
}

/// Checks every `every` (a quarter of it while the last check found no
/// leader, a stale one, or another server) until the guard is dropped: `leader` asks Patroni,
/// `ours` reads the postmaster of the server the store reaches.
pub(crate) fn watch<L, O, LF, OF, G, E, EF>(
    every: Duration,
    hooks: Hooks<G, E>,
    leader: L,
    ours: O,
) -> (Arc<Confirmations>, DropGuard)
where
    G: Fn() + Send + 'static,
    E: Fn() -> EF + Send + 'static,
    EF: std::future::Future<Output = ()> + Send,
    L: Fn() -> LF + Send + 'static,
    O: Fn() -> OF + Send + 'static,
    LF: std::future::Future<Output = Result<i64, Refusal>> + Send,
    OF: std::future::Future<Output = Option<i64>> + Send,
{
    let confirmations = Arc::new(Confirmations {
        at: Mutex::new(None),
        outcome: Mutex::new(None),
    });
    let stop = CancellationToken::new();
    let (record, stopped) = (confirmations.clone(), stop.clone());
    let Hooks {
        mut again,
        gained,
        elsewhere,
    } = hooks;
    let check = tokio::spawn(async move {
        // At most one early check per period: a link that flaps, or a login
        // that ends our connections, costs Patroni one more request per period.
        let mut early_from = Instant::now();
        // At most one look per period: a look connects to every host of the
        // URL, and while Patroni names a server the store cannot reach (a
        // one-sided partition, its slots taken) a look finds nothing new.
        let mut looked_at: Option<Instant> = None;
        loop {
            let started = Instant::now();
            again.borrow_and_update();
            let (leader, ours) = futures::join!(leader(), ours());
            let next = match record.record(started, leader, ours) {
                (Outcome::Confirmed, gain) => {
                    if gain {
                        gained();
                    }
                    every
                }
                (Outcome::OtherServer, _) => {
                    if looked_at.is_none_or(|at| at.elapsed() >= every) {
                        looked_at = Some(Instant::now());
                        elsewhere().await;
                    }
                    suspect_every(every)
                }
                // Settings that no longer bound a term are an operator's
                // to fix, not a failover: checked at the usual pace.
                (Outcome::Settings, _) => every,
                _ => suspect_every(every),
            };
            tokio::select! {
                _ = stopped.cancelled() => return,
                _ = tokio::time::sleep_until(started + next) => {}
                Ok(()) = again.changed(), if Instant::now() >= early_from => {
                    early_from = Instant::now() + every;
                    tokio::time::sleep_until(started + CHECK_SPACING).await;
                }
            }
        }
    });
    // A check that died would leave every term to end unexplained.
    tokio::spawn(async move {
        if let Err(error) = check.await {
            if error.is_panic() {
                tracing::error!(
                    "the Patroni check stopped: no term starts on this store, and terms end abandon_after after the last confirmation"
                );
            }
        }
    });
    (confirmations, stop.drop_guard())
}

#[cfg(test)]
mod tests {
    use super::super::tests::{settings, SECOND};
    use super::*;

    fn word(age_secs: Option<i64>, settings: Result<PatroniSettings, PatroniError>) -> Word {
        Word {
            postmaster: 7,
            dcs_contact_age_secs: age_secs,
            settings: settings.map_err(Arc::new),
        }
    }

    fn refused_for(refusal: Result<i64, Refusal>, expected: fn(&PatroniError) -> bool) -> bool {
        matches!(refusal, Err(Refusal::Settings(e)) if expected(&e))
    }

    #[test]
    fn a_leader_whose_dcs_contact_is_older_than_a_loop_and_a_second_confirms_nothing() {
        let kit = || Ok(settings(20, 1, 5));
        let (abandon_after, statement_timeout) = (SECOND * 6, SECOND * 2);
        assert_eq!(
            word(Some(0), kit())
                .confirms(abandon_after, statement_timeout)
                .unwrap(),
            7
        );
        assert_eq!(
            word(Some(2), kit())
                .confirms(abandon_after, statement_timeout)
                .unwrap(),
            7
        );
        for stale in [Some(3), Some(60), None, Some(-5)] {
            assert!(
                matches!(
                    word(stale, kit()).confirms(abandon_after, statement_timeout),
                    Err(Refusal::Stale { .. })
                ),
                "{stale:?}"
            );
        }
    }

    #[test]
    fn a_leader_whose_settings_no_longer_bound_the_term_confirms_nothing() {
        let (abandon_after, statement_timeout) = (SECOND * 6, SECOND * 2);
        let shortened = word(Some(0), Ok(settings(10, 1, 5)));
        assert!(refused_for(
            shortened.confirms(abandon_after, statement_timeout),
            |e| matches!(e, PatroniError::Margin { .. })
        ));
        let failsafe = word(
            Some(0),
            Ok(PatroniSettings {
                failsafe_mode: true,
                ..settings(20, 1, 5)
            }),
        );
        assert!(refused_for(
            failsafe.confirms(abandon_after, statement_timeout),
            |e| matches!(e, PatroniError::FailsafeMode)
        ));
        let unread = word(Some(0), Err(PatroniError::NoUrl));
        assert!(matches!(
            unread.confirms(abandon_after, statement_timeout),
            Err(Refusal::Settings(_))
        ));
    }

    #[tokio::test]
    async fn a_check_confirms_only_the_postmaster_patroni_names() {
        let c = Confirmations {
            at: Mutex::new(None),
            outcome: Mutex::new(None),
        };
        let t0 = Instant::now();
        assert_eq!(c.record(t0, Ok(3), Some(2)), (Outcome::OtherServer, true));
        assert_eq!(c.latest(), Confirmation::Never);
        assert_eq!(
            c.record(t0, Err(Refusal::NoLeader), Some(2)),
            (Outcome::NoLeader, true)
        );
        assert_eq!(c.latest(), Confirmation::Never);
        assert_eq!(c.record(t0, Ok(2), None), (Outcome::OtherServer, true));
        assert_eq!(c.latest(), Confirmation::Never);
        assert_eq!(c.record(t0, Ok(2), Some(2)), (Outcome::Confirmed, true), "gained");
        assert_eq!(c.latest(), Confirmation::At(t0.into_std()));
        assert_eq!(
            c.record(t0, Ok(2), Some(2)),
            (Outcome::Confirmed, false),
            "kept, not gained"
        );
        let t1 = t0 + Duration::from_secs(1);
        c.record(t1, Ok(3), Some(2));
        c.record(t1, Err(Refusal::Stale { age_secs: Some(9) }), Some(2));
        assert_eq!(
            c.latest(),
            Confirmation::At(t0.into_std()),
            "a refusal keeps the last confirmation's instant"
        );
        let shortened = Arc::new(PatroniError::FailsafeMode);
        c.record(t1, Err(Refusal::Settings(shortened)), Some(2));
        assert_eq!(
            c.latest(),
            Confirmation::Never,
            "settings that no longer bound a term withdraw the word"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn checks_come_four_times_as_often_while_patroni_confirms_nothing_and_at_the_period_once_it_does() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let checks = Arc::new(AtomicUsize::new(0));
        let counted = checks.clone();
        let (_again, seen) = watch::channel(0u64);
        let (_confirmations, _guard) = watch(
            Duration::from_secs(4),
            Hooks {
                again: seen,
                gained: || {},
                elsewhere: || async {},
            },
            move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                // No leader at the first three checks, ours from the fourth.
                async move {
                    if n < 3 {
                        Err(Refusal::NoLeader)
                    } else {
                        Ok(2)
                    }
                }
            },
            || async { Some(2) },
        );
        // Checks at 0, 1, 2 and 3 s (no leader), then 7 s (confirmed at 3).
        tokio::time::sleep(Duration::from_millis(3500)).await;
        assert_eq!(
            checks.load(Ordering::SeqCst),
            4,
            "a quarter period apart while unconfirmed"
        );
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(checks.load(Ordering::SeqCst), 4, "a period apart once confirmed");
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(checks.load(Ordering::SeqCst), 5);
    }

    /// Counts the checks and looks of a check whose Patroni always names
    /// another server, over `over`, while `again` moves every 50 ms.
    async fn checks_and_looks_while_patroni_names_another_server(over: Duration) -> (usize, usize) {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (checks, looks) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let (counted, looked) = (checks.clone(), looks.clone());
        let (again, seen) = watch::channel(0u64);
        let (_confirmations, _guard) = watch(
            Duration::from_secs(4),
            Hooks {
                again: seen,
                gained: || {},
                elsewhere: move || {
                    looked.fetch_add(1, Ordering::SeqCst);
                    async {}
                },
            },
            move || {
                counted.fetch_add(1, Ordering::SeqCst);
                async { Ok(1) }
            },
            || async { Some(2) },
        );
        let until = Instant::now() + over;
        while Instant::now() < until {
            again.send_modify(|n| *n += 1);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        (checks.load(Ordering::SeqCst), looks.load(Ordering::SeqCst))
    }

    #[tokio::test(start_paused = true)]
    async fn a_store_that_moves_all_the_time_costs_one_early_check_and_one_look_per_period() {
        // A check every second (a quarter of 4 s) from 0 to 11.95 s: 12, and
        // at most one early check per period: 3 more.
        let (checks, looks) =
            checks_and_looks_while_patroni_names_another_server(Duration::from_millis(11_950)).await;
        assert!((12..=15).contains(&checks), "{checks} checks");
        assert_eq!(looks, 3, "one look per period, at 0, 4 and 8 s");
    }

    #[test]
    fn the_fast_period_is_never_under_the_spacing_nor_over_the_period() {
        assert_eq!(
            suspect_every(Duration::from_millis(1500)),
            Duration::from_millis(375)
        );
        assert_eq!(suspect_every(Duration::from_millis(200)), CHECK_SPACING);
        assert_eq!(
            suspect_every(Duration::from_millis(50)),
            Duration::from_millis(50)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_check_naming_another_server_looks_for_it_and_the_store_reaching_it_checks_at_once() {
        use std::sync::atomic::{AtomicUsize, Ordering};
        let (checks, gains) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
        let looks = Arc::new(AtomicUsize::new(0));
        let (again, seen) = watch::channel(0u64);
        let (counted, told, looked) = (checks.clone(), gains.clone(), looks.clone());
        let (_confirmations, _guard) = watch(
            Duration::from_secs(10),
            Hooks {
                again: seen,
                gained: move || {
                    told.fetch_add(1, Ordering::SeqCst);
                },
                elsewhere: move || {
                    looked.fetch_add(1, Ordering::SeqCst);
                    async {}
                },
            },
            move || {
                let n = counted.fetch_add(1, Ordering::SeqCst);
                // Patroni names our server from the second check on.
                async move { Ok(if n == 0 { 1 } else { 2 }) }
            },
            || async { Some(2) },
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(
            (checks.load(Ordering::SeqCst), gains.load(Ordering::SeqCst)),
            (1, 0)
        );
        assert_eq!(
            looks.load(Ordering::SeqCst),
            1,
            "Patroni named another server: the store looked for it"
        );
        again.send_modify(|n| *n += 1);
        tokio::time::sleep(CHECK_SPACING).await;
        assert_eq!(
            (checks.load(Ordering::SeqCst), gains.load(Ordering::SeqCst)),
            (2, 1),
            "checked at once, not 10 s after the last, and the confirmation told"
        );
    }
}
