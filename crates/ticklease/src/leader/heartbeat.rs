//! The heartbeat: RENEW every `heartbeat_every` while a tick runs, on a task of
//! its own, and the one place the local clock decides anything.
//!
//! `last_ack` is the monotonic instant at which the last acknowledged RENEW
//! (or the ACQUIRE) was *sent*. The database set the expiry from its own clock
//! at or after that instant, so `last_ack + lease_ttl` is no later than the
//! real expiry. Before each RENEW the heartbeat checks `abandon_after`; past
//! it, it reports `HeartbeatTimeout` and starts nothing more. A RENEW that
//! fails or does not answer is a missed beat, retried after half a beat (so
//! with the defaults one missed beat is not yet an abandon); `renewed =
//! false` is a definitive loss. Every wait is capped at the abandon instant, and a RENEW
//! in flight is cut there. Told of a pause by the coordination session, it
//! renews at once: the RENEW reports the loss and the work is cancelled.
//! At each beat it also ends a term whose server the store found superseded
//! by a promotion since the ACQUIRE (`Superseded`): its work may have
//! connected there.

use std::sync::Arc;
use std::time::SystemTime;

use tokio::time::{sleep_until, timeout_at, Instant};
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::connect::coordination::{told, RoleSignals};
use crate::connect::patroni::Confirmation;
use crate::leader::drift::Drift;
use crate::ops::metrics::Metrics;
use crate::store::batch::{align_down, Batcher};
use crate::store::{usable_moved, LeaseStore, LossReason, Renew};
use crate::term::role::Role;
use crate::term::token::Token;

pub(crate) struct Heartbeat<S> {
    pub(crate) store: Arc<S>,
    pub(crate) role: Role,
    pub(crate) token: Token,
    pub(crate) config: Config,
    /// When the ACQUIRE that started the term was sent.
    pub(crate) acquire_sent: Instant,
    pub(crate) drift: Arc<Drift>,
    pub(crate) metrics: Option<Metrics>,
    /// The role's wake-ups, with a coordination session.
    pub(crate) signals: Option<Arc<RoleSignals>>,
    /// A family term's RENEWs go through the replica's batcher…
    pub(crate) batch: Option<Batcher>,
    /// …on the grid of `heartbeat_every` from this instant, so they leave together.
    pub(crate) grid: Option<Instant>,
    /// Told the abandon instant after each acknowledged RENEW ([`crate::Tick::abandon_at`]).
    pub(crate) abandon_at: tokio::sync::watch::Sender<Instant>,
}

impl<S: LeaseStore> Heartbeat<S> {
    /// Whether the store found its server superseded by a promotion after
    /// this term's ACQUIRE was sent: the term's work may be writing there.
    fn server_superseded(&self) -> bool {
        let superseded_at = self.store.connection_events().and_then(|e| e.superseded_at);
        superseded_at.is_some_and(|at| at > self.acquire_sent.into_std())
    }

    /// The instant the failover manager's word runs out, when the store
    /// asks it: `abandon_after` after its last confirmation (at once
    /// without one). See [`crate::patroni`].
    fn unconfirmed_at(&self) -> Option<Instant> {
        match self.store.primary_confirmation()? {
            Confirmation::At(at) => Some(Instant::from_std(at) + self.config.abandon_after()),
            Confirmation::Never => Some(self.acquire_sent),
        }
    }

    /// When the term is abandoned: `abandon_after` after the last
    /// acknowledged RENEW was sent, or when the failover manager's word runs out.
    fn abandon_at(&self, last_ack: Instant) -> Instant {
        let renewed = last_ack + self.config.abandon_after();
        self.unconfirmed_at().map_or(renewed, |at| renewed.min(at))
    }

    /// Runs until the term is lost (`Some(reason)`) or `stop` fires (`None`).
    /// `stop` is honoured between beats; a RENEW in flight is let finish.
    pub(crate) async fn run(self, stop: CancellationToken) -> Option<LossReason> {
        let cfg = self.config;
        let mut last_ack = self.acquire_sent;
        let mut last_sent = self.acquire_sent;
        let mut missed = false;
        let mut told_at = None;
        // The store's connections reaching another host (or coming back)
        // is when a promotion is seen: the term is judged then, not at its
        // next beat, and a missed beat is sent again.
        let mut usable = self.store.usable();
        let mut renewed_early = false;
        loop {
            let beat_at = match (missed, self.grid) {
                (true, _) => last_sent + cfg.heartbeat_every() / 2,
                (false, None) => last_sent + cfg.heartbeat_every(),
                (false, Some(epoch)) => {
                    align_down(last_sent + cfg.heartbeat_every(), epoch, cfg.heartbeat_every())
                }
            };
            tokio::select! {
                biased;
                _ = stop.cancelled() => return None,
                _ = sleep_until(beat_at.min(self.abandon_at(last_ack))) => renewed_early = false,
                _ = told(self.signals.as_ref().map(|s| &s.holder), told_at) => {
                    told_at = Some(Instant::now());
                    tracing::debug!(role = %self.role, token = %self.token, "told of a pause; renewing now");
                }
                // At most once between two beats: a link that flaps, or a
                // login that ends our connections, costs one RENEW per beat.
                Some(()) = usable_moved(usable.as_mut()), if !renewed_early => {
                    renewed_early = true;
                    tracing::debug!(role = %self.role, token = %self.token, "the store's connections came back or moved; renewing now");
                }
            }
            if let Some(usable) = &mut usable {
                usable.borrow_and_update();
            }
            if self.server_superseded() {
                tracing::warn!(role = %self.role, token = %self.token,
                    "the term's database server was superseded by a promotion; ending the term");
                return Some(LossReason::Superseded);
            }
            let sent = Instant::now();
            if self.unconfirmed_at().is_some_and(|at| sent >= at) {
                tracing::warn!(role = %self.role, token = %self.token,
                    "Patroni has not confirmed the term's server as the primary within abandon_after; ending the term");
                return Some(LossReason::Superseded);
            }
            let abandon_at = self.abandon_at(last_ack);
            if sent >= last_ack + cfg.abandon_after() {
                tracing::warn!(role = %self.role, token = %self.token, since_ack = ?sent - last_ack,
                    "no RENEW acknowledged within abandon_after; abandoning the tick");
                return Some(LossReason::HeartbeatTimeout);
            }
            last_sent = sent;
            let wall = SystemTime::now();
            let deadline = (sent + cfg.statement_timeout()).min(abandon_at);
            missed = true;
            let renew = async {
                match &self.batch {
                    Some(batch) => batch.renew(&self.role, self.token).await,
                    None => self.store.renew(&self.role, self.token, cfg.lease_ttl()).await,
                }
            };
            match timeout_at(deadline, renew).await {
                Ok(Ok(Renew::Renewed { db_now })) => {
                    last_ack = sent;
                    missed = false;
                    self.abandon_at.send_replace(self.abandon_at(last_ack));
                    self.drift.observe(wall, sent.elapsed(), db_now);
                    if let Some(m) = &self.metrics {
                        m.renewed(sent.elapsed());
                    }
                }
                Ok(Ok(Renew::Lost(reason))) => {
                    tracing::info!(role = %self.role, token = %self.token, %reason, "lease lost");
                    return Some(reason);
                }
                // A failover's missed beats say nothing the host's one line
                // does not (they are counted); a refusal is worth a warning.
                Ok(Err(error)) if error.is_outage() => {
                    tracing::debug!(role = %self.role, token = %self.token, error = &error as &dyn std::error::Error,
                        "RENEW failed; missed beat");
                }
                Ok(Err(error)) => {
                    tracing::warn!(role = %self.role, token = %self.token, error = &error as &dyn std::error::Error,
                        "RENEW failed; missed beat");
                }
                Err(_) => {
                    tracing::debug!(role = %self.role, token = %self.token, after = ?deadline - sent,
                        "RENEW did not answer; missed beat");
                }
            }
        }
    }
}
