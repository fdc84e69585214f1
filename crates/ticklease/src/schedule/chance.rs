//! A role's next chance: what a loop over [`Manager::lead`] waits on before
//! asking again, woken exactly as the [`Scheduler`](crate::Scheduler)'s own
//! loops are.

use std::sync::Arc;

use futures::future::BoxFuture;
use futures::FutureExt;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::connect::coordination::{told, RoleSignals, Signals};
use crate::error::Error;
use crate::leader::lead::{Lead, Manager};
use crate::schedule::wake::{next_wake, Polled, Wake};
use crate::store::{usable_moved, LeaseStore};
use crate::term::role::Role;

/// Waits for a role's next chance after a call of [`Manager::lead`]: until
/// the database said the role may be due or free (the holder's expiry, the
/// due time; at most `max_poll` without a coordination session), or, with
/// one, until a release, unpause or run-now is told or the holder's session
/// ends (a dead leader is replaced in milliseconds, not at the next poll).
/// The [`Scheduler`](crate::Scheduler)'s role loops wait on it too.
///
/// Make one per role loop and keep it for the loop's life: it keeps the wait
/// on the current holder's session across calls and spaces the wake-ups
/// notifications cause (at most one per 200 ms, whoever sends them).
///
/// ```no_run
/// # use std::time::Duration;
/// # use ticklease::{Manager, NextChance, PgStore, Role};
/// # async fn example(manager: Manager<PgStore>, billing: Role) {
/// let mut chance = NextChance::new(&manager, &billing);
/// loop {
///     let lead = manager
///         .lead(&billing, Duration::from_secs(3600), |tick| async move {
///             let _fence = tick.fence(); // claim with it
///             Ok::<_, std::io::Error>(())
///         })
///         .await;
///     // `false` once Manager::shutdown was called: the terms are being released.
///     if !chance.wait(&lead).await {
///         break;
///     }
/// }
/// # }
/// ```
pub struct NextChance {
    role: Role,
    config: Config,
    signals: Option<Signals>,
    woken: Option<Arc<RoleSignals>>,
    shutdown: CancellationToken,
    /// The wait on the current holder's key, kept while the holder stays the same.
    waiting: Option<(i64, BoxFuture<'static, ()>)>,
    /// Moves when the store may work again ([`LeaseStore::usable`]): seen
    /// at each wake-up, so a move during the next poll wakes its wait.
    usable: Option<watch::Receiver<u64>>,
    /// Whether a move of `usable` ended the wait after the last failed poll:
    /// one early poll per run of failures, then `max_poll` again, however
    /// often a hostile or flapping link moves it.
    woken_early: bool,
    /// Moves when Patroni confirms the store's server again
    /// ([`LeaseStore::confirmed_again`]).
    confirmed: Option<watch::Receiver<u64>>,
    told_at: Option<tokio::time::Instant>,
}

impl std::fmt::Debug for NextChance {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NextChance")
            .field("role", &self.role)
            .field("signalled", &self.signals.is_some())
            .field("waiting_on", &self.waiting.as_ref().map(|(key, _)| key))
            .finish()
    }
}

impl NextChance {
    /// The next-chance waits of `role` under `manager`'s store and timings.
    pub fn new<S: LeaseStore>(manager: &Manager<S>, role: &Role) -> NextChance {
        let signals = manager.store().signals().cloned();
        NextChance {
            role: role.clone(),
            config: *manager.config(),
            woken: signals.as_ref().map(|s| s.role(role.as_str())),
            signals,
            shutdown: manager.shutdown_token(),
            waiting: None,
            usable: manager.store().usable(),
            woken_early: false,
            confirmed: manager.store().confirmed_again(),
            told_at: None,
        }
    }

    /// Waits after `last`, what [`Manager::lead`] returned: not at all after
    /// a term (the database knows when the role is due next), `max_poll`
    /// after an error, and after a refusal as the refusal says. Returns
    /// `false`, at once, when the manager is shutting down: stop asking.
    pub async fn wait<T>(&mut self, last: &Result<Lead<T>, Error>) -> bool {
        let polled = match last {
            Ok(Lead::Refused(refusal)) => Polled::Refused(refusal),
            Ok(Lead::ShuttingDown) => return false,
            Ok(_) => Polled::TermEnded,
            Err(Error::Store(e)) if e.is_unconfirmed() => Polled::Unconfirmed,
            Err(_) => Polled::Failed,
        };
        // Decided before the first await, so the future does not hold `last`.
        let wake = self.plan(&polled);
        self.sleep(wake).await
    }

    /// Waits after a poll of the scheduler's own; `false` at shutdown.
    pub(crate) async fn wait_polled(&mut self, polled: &Polled<'_>) -> bool {
        let wake = self.plan(polled);
        self.sleep(wake).await
    }

    /// When to ask next, and the wait on the holder's key to keep.
    fn plan(&mut self, polled: &Polled<'_>) -> Wake {
        let mut wake = next_wake(polled, &self.config, self.signals.is_some());
        match polled {
            Polled::Failed => wake.on_usable &= !self.woken_early,
            _ => self.woken_early = false,
        }
        match (wake.holder_key, &self.signals) {
            (Some(key), Some(signals)) if self.waiting.as_ref().map(|(k, _)| *k) != Some(key) => {
                self.waiting = signals.holder_gone(key).map(|gone| (key, gone.boxed()));
            }
            (Some(_), _) => {}
            (None, _) => self.waiting = None,
        }
        wake
    }

    async fn sleep(&mut self, wake: Wake) -> bool {
        let NextChance {
            role,
            waiting,
            woken,
            told_at,
            shutdown,
            usable,
            woken_early,
            confirmed,
            ..
        } = self;
        let gone = tokio::select! {
            _ = shutdown.cancelled() => return false,
            _ = tokio::time::sleep(wake.after) => false,
            Some(()) = usable_moved(usable.as_mut()), if wake.on_usable => {
                tracing::debug!(%role, "the store answers again; asking now");
                *woken_early = true;
                false
            }
            Some(()) = usable_moved(confirmed.as_mut()), if wake.on_confirmed => {
                tracing::debug!(%role, "Patroni confirms the store's server; asking now");
                false
            }
            _ = told(woken.as_ref().map(|w| &w.follower), *told_at) => {
                *told_at = Some(tokio::time::Instant::now());
                false
            }
            _ = async {
                match waiting.as_mut() {
                    Some((_, gone)) => gone.await,
                    None => std::future::pending().await,
                }
            } => true,
        };
        if gone {
            tracing::debug!(%role, "the holder's coordination session ended; acquiring now");
            *waiting = None;
        }
        for moved in [usable, confirmed].into_iter().flatten() {
            moved.borrow_and_update();
        }
        true
    }
}
