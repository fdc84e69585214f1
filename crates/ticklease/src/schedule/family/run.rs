//! One family's loop on one replica, as a state machine: each wake-up beats
//! the replica registry when due, wakes the keys it was told of, asks the
//! database about the due keys (preferred first, then probes), waits on the
//! holders' sessions, and sleeps until the next thing is due. One method per
//! step; the state between wake-ups is [`FamilyLoop`].

use std::collections::{BTreeMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::sync::Arc;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::asking::{self, Answer, DbClock, TermPlan};
use super::{
    ended, fair_cap, heard_notified, key_of, key_of_mut, on_grid, park, preferred, scope, sync_keys,
    term_done, told_spacing, wake_grid, wake_told, FamilyJob, Key, REGISTRATION_TTL_MAX,
};
use crate::connect::coordination::{FamilySignals, Signals};
use crate::error::chain;
use crate::leader::lead::{Manager, Work};
use crate::schedule::wake::{next_wake, Polled};
use crate::store::{Acquire, LeaseStore, Refusal, Term, BATCH_MAX};
use crate::term::family::Family;
use crate::term::role::Role;
use crate::term::schedule::Schedule;

/// Leads the keys of one family until `shutdown`, then leaves the replica
/// registry and waits for its terms to end (or, once `abandon` fires, drops them).
pub(crate) async fn family_loop<S: LeaseStore>(
    manager: Manager<S>,
    job: FamilyJob,
    shutdown: CancellationToken,
    abandon: CancellationToken,
) {
    let mut state = FamilyLoop::new(manager, job, shutdown);
    let mut version = state.family.version();
    let mut synced = None;
    loop {
        let current = *version.borrow_and_update();
        if synced != Some(current) {
            sync_keys(&state.family, &mut state.keys, Instant::now());
            synced = Some(current);
        }
        state.beat_when_due().await;
        let view = state.view();
        state.wake_told_when_due(&view);
        let view = View {
            now: Instant::now(),
            ..view
        };
        for (candidates, room, others) in state.batches(&view) {
            if state.shutdown.is_cancelled() {
                break;
            }
            state.ask(&candidates, room, &others).await;
        }
        state.wait_on_holders();
        if !state.sleep(&view, &mut version).await {
            break;
        }
    }
    state.leave(abandon).await;
}

/// What one wake-up decides by: the replicas, this one's rank among them,
/// how many more terms it may start, and when it looked.
struct View {
    replicas: usize,
    rank: Option<usize>,
    limit: usize,
    now: Instant,
}

/// A family loop's state between wake-ups.
struct FamilyLoop<S: LeaseStore> {
    manager: Manager<S>,
    family: Family,
    schedule: Schedule,
    work: Work,
    store: Arc<S>,
    holder: String,
    signals: Option<Signals>,
    heard: Option<Arc<FamilySignals>>,
    config: crate::Config,
    shutdown: CancellationToken,
    clock: DbClock,
    epoch: Instant,
    /// Longer than the preferred replica needs to hear of a release, ask,
    /// and wake at the due time it was told (spacing, grid, a statement).
    grace: Duration,
    grid: Duration,
    spacing: Duration,
    keys: BTreeMap<String, Key>,
    terms: JoinSet<(String, Duration)>,
    /// Waits on holders' sessions, each resolving to the holder key.
    gone: FuturesUnordered<BoxFuture<'static, i64>>,
    waited: HashSet<i64>,
    /// The live replicas of the registry's last answer (none before one).
    replicas: Vec<String>,
    beat_at: Instant,
    told_at: Option<Instant>,
    told_pending: bool,
}

impl<S: LeaseStore> FamilyLoop<S> {
    fn new(manager: Manager<S>, job: FamilyJob, shutdown: CancellationToken) -> Self {
        let FamilyJob {
            family,
            schedule,
            work,
        } = job;
        let config = *manager.config();
        let store = manager.store_arc().clone();
        let signals = store.signals().cloned();
        FamilyLoop {
            holder: manager.holder_id().to_string(),
            heard: signals.as_ref().map(|s| s.family(family.name())),
            grace: config.heartbeat_every() / 2,
            grid: wake_grid(&config),
            spacing: told_spacing(&config),
            epoch: Instant::now(),
            beat_at: Instant::now(),
            clock: DbClock::default(),
            keys: BTreeMap::new(),
            terms: JoinSet::new(),
            gone: FuturesUnordered::new(),
            waited: HashSet::new(),
            replicas: Vec::new(),
            told_at: None,
            told_pending: false,
            signals,
            store,
            config,
            manager,
            family,
            schedule,
            work,
            shutdown,
        }
    }

    /// Registers this replica and reads who else serves the family, once a
    /// beat is due (a beat that timed out is not sent again at once).
    async fn beat_when_due(&mut self) {
        let now = Instant::now();
        if now < self.beat_at {
            return;
        }
        let config = &self.config;
        // The database keeps a registration at most REGISTRATION_TTL_MAX.
        let beat_every = config.heartbeat_every().min(REGISTRATION_TTL_MAX / 3);
        let ttl = config.lease_ttl().min(REGISTRATION_TTL_MAX);
        let beat = self.store.beat(self.family.name(), &self.holder, ttl);
        let answer = tokio::time::timeout(config.statement_timeout(), beat).await;
        self.beat_at = Instant::now() + beat_every;
        match answer {
            Ok(Ok(live)) => {
                if live != self.replicas {
                    // Preferences moved, or a holder left (stopped, or froze past its TTL).
                    for key in self.keys.values_mut().filter(|k| k.parked) {
                        key.parked = false;
                        key.wake_at = now;
                    }
                }
                self.replicas = live;
            }
            Ok(Err(error)) if error.is_outage() => {
                tracing::debug!(family = self.family.name(), error = %chain(&error), "replica beat failed")
            }
            Ok(Err(error)) => {
                tracing::warn!(family = self.family.name(), error = %chain(&error), "replica beat failed")
            }
            Err(_) => tracing::debug!(family = self.family.name(), "replica beat did not answer"),
        }
    }

    fn view(&self) -> View {
        let replicas = self.replicas.len().max(1);
        let led = self.keys.values().filter(|k| k.term.is_some()).count();
        let cap = fair_cap(self.keys.len(), replicas).min(self.family.max_terms());
        View {
            replicas,
            rank: self.replicas.iter().position(|r| *r == self.holder),
            limit: cap.saturating_sub(led),
            now: Instant::now(),
        }
    }

    /// Wakes the keys this replica prefers among those it was told of, at
    /// most once per spacing.
    fn wake_told_when_due(&mut self, view: &View) {
        let due = self.told_at.is_none_or(|at| at + self.spacing <= Instant::now());
        if self.told_pending && due {
            self.told_pending = false;
            self.told_at = Some(Instant::now());
            let (rank, n) = (view.rank, view.replicas);
            wake_told(self.heard.as_deref(), &mut self.keys, Instant::now(), |i| {
                preferred(i, rank, n)
            });
        }
    }

    /// When the key at `index` may be asked about: its wake-up, plus the
    /// grace if another replica prefers it.
    fn eligible_at(&self, view: &View, index: usize, key: &Key) -> Instant {
        if preferred(index, view.rank, view.replicas) {
            key.wake_at
        } else {
            key.wake_at + self.grace
        }
    }

    /// The ACQUIREs of this wake-up: the due keys (preferred first) with
    /// room for `limit` terms, then the keys to look at, with room for
    /// none; each with the keys among them that another replica prefers.
    /// None before the registry answered once (alone, a replica would count
    /// N = 1), at the limit, or once shutting down.
    fn batches(&self, view: &View) -> Vec<(Vec<Role>, usize, HashSet<Role>)> {
        if view.limit == 0 || self.replicas.is_empty() || self.shutdown.is_cancelled() {
            return Vec::new();
        }
        let (mut probes, mut candidates): (Vec<_>, Vec<_>) = self
            .keys
            .values()
            .enumerate()
            .filter(|(i, k)| k.term.is_none() && self.eligible_at(view, *i, k) <= view.now)
            .map(|(i, k)| (!preferred(i, view.rank, view.replicas), k))
            .partition(|(other, k)| *other && k.probe);
        // Preferred keys first; stable, so each group stays in key order.
        candidates.sort_by_key(|(other, _)| *other);
        candidates.truncate(BATCH_MAX);
        probes.truncate(BATCH_MAX);
        let others: HashSet<Role> = candidates
            .iter()
            .chain(&probes)
            .filter(|(other, _)| *other)
            .map(|(_, k)| k.role.clone())
            .collect();
        let roles = |batch: Vec<(bool, &Key)>| -> Vec<Role> {
            batch.into_iter().map(|(_, k)| k.role.clone()).collect()
        };
        [(roles(candidates), view.limit), (roles(probes), 0)]
            .into_iter()
            .filter(|(roles, _)| !roles.is_empty())
            .map(|(roles, room)| (roles, room, others.clone()))
            .collect()
    }

    /// Asks the database about `candidates`, starting at most `room` terms.
    async fn ask(&mut self, candidates: &[Role], room: usize, others: &HashSet<Role>) {
        // How far back the skipped occurrences of these keys can reach.
        let back_to = candidates
            .iter()
            .map(|role| key_of(&self.keys, role).and_then(|k| k.after))
            .min()
            .flatten();
        let asked = asking::ask(
            &self.manager,
            &self.schedule,
            &mut self.clock,
            candidates,
            back_to,
            room,
        )
        .await;
        match asked {
            Ok((answers, sent)) => {
                let now = Instant::now();
                for answer in answers {
                    self.answered(answer, sent, now, others);
                }
            }
            Err(error) => {
                let retry = match &error {
                    // The Patroni check said so once, when it stopped confirming.
                    crate::Error::Store(e) if e.is_unconfirmed() => {
                        tracing::debug!(family = self.family.name(), error = %chain(&error), "ACQUIRE many not sent");
                        Instant::now() + self.config.heartbeat_every() / 2
                    }
                    // A failover's is told by the host's one line.
                    _ if error.is_outage() => {
                        tracing::debug!(family = self.family.name(), error = %chain(&error), "ACQUIRE many failed");
                        Instant::now() + self.config.max_poll()
                    }
                    _ => {
                        tracing::warn!(family = self.family.name(), error = %chain(&error), "ACQUIRE many failed");
                        Instant::now() + self.config.max_poll()
                    }
                };
                for role in candidates {
                    if let Some(key) = key_of_mut(&mut self.keys, role) {
                        key.wake_at = retry;
                        key.probe = true;
                    }
                }
            }
        }
    }

    /// One key's answer: a term started, or when to ask again.
    fn answered(&mut self, answer: Answer, sent: Instant, now: Instant, others: &HashSet<Role>) {
        let Answer {
            role,
            acquire,
            plan,
            after,
        } = answer;
        let Some(key) = key_of_mut(&mut self.keys, &role) else {
            return;
        };
        key.after = after.or(key.after);
        match acquire {
            Acquire::Acquired(term) => self.started(role, term, plan, sent),
            Acquire::Refused(refusal) => self.refused(&role, refusal, now, others),
        }
    }

    /// Runs a started term of a key on a task of its own.
    fn started(&mut self, role: Role, term: Term, plan: TermPlan, sent: Instant) {
        let Some(key) = key_of_mut(&mut self.keys, &role) else {
            return;
        };
        let removed = self.manager.key_cancel();
        key.term = Some(removed.clone());
        key.holder_key = None;
        key.parked = false;
        key.probe = false;
        let (manager, work, config) = (self.manager.clone(), self.work.clone(), self.config);
        let name = role.as_str().to_string();
        let scope = scope(&self.family, removed, &plan);
        self.terms.spawn(async move {
            let lead = AssertUnwindSafe(manager.run_term(
                &role,
                plan.wait,
                term.token,
                sent,
                |tick| work(tick),
                scope,
            ))
            .catch_unwind()
            .await;
            let key = name.split_once(':').map_or(name.clone(), |(_, k)| k.to_string());
            (key, ended(&role, &plan, &config, lead))
        });
    }

    /// A refused key: parked while a live replica that prefers it holds it,
    /// else woken as the refusal says, never at once.
    fn refused(&mut self, role: &Role, refusal: Refusal, now: Instant, others: &HashSet<Role>) {
        let (epoch, grid, with_signals) = (self.epoch, self.grid, self.signals.is_some());
        let replicas = &self.replicas;
        let Some(key) = key_of_mut(&mut self.keys, role) else {
            return;
        };
        key.parked = matches!(&refusal, Refusal::Held { holder, .. }
            if others.contains(role) && replicas.contains(holder));
        let refusal = if key.parked {
            // Wake as a role whose holder never expires would: at the cap.
            park(&refusal)
        } else {
            refusal
        };
        // A time from the database (or acquirable now) anchors its grace.
        key.probe = key.parked
            || !matches!(
                refusal,
                Refusal::Held { .. } | Refusal::NotDue { .. } | Refusal::Contended | Refusal::OverLimit
            );
        let wake = next_wake(&Polled::Refused(&refusal), &self.config, with_signals);
        // Never at once: a refusal is asked again on a later grid step.
        key.wake_at = on_grid(now + wake.after.max(Duration::from_millis(1)), epoch, grid);
        key.holder_key = wake.holder_key;
    }

    /// Waits on the session of every holder a key was refused by (none past
    /// KEY_WAITERS_MAX: that holder is then waited for by its lease alone).
    fn wait_on_holders(&mut self) {
        let Some(signals) = &self.signals else {
            return;
        };
        for key in self.keys.values().filter_map(|k| k.holder_key) {
            if self.waited.contains(&key) {
                continue;
            }
            if let Some(wait) = signals.holder_gone(key) {
                self.waited.insert(key);
                self.gone.push(wait.map(move |()| key).boxed());
            }
        }
    }

    /// When to wake next: the first eligible key (none without a registry
    /// answer or at the limit), the told keys' spacing, the next beat.
    fn next_wake(&self, view: &View) -> Instant {
        let next = if view.limit > 0 && !self.replicas.is_empty() {
            self.keys
                .values()
                .enumerate()
                .filter(|(_, k)| k.term.is_none())
                .map(|(i, k)| self.eligible_at(view, i, k))
                .min()
        } else {
            None
        };
        let told_due = self
            .told_at
            .filter(|_| self.told_pending)
            .map(|at| at + self.spacing);
        [next, told_due, Some(self.beat_at)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(self.beat_at)
    }

    /// Sleeps until the next wake-up or an event; `false` at shutdown.
    async fn sleep(&mut self, view: &View, version: &mut tokio::sync::watch::Receiver<u64>) -> bool {
        let sleep = tokio::time::sleep_until(self.next_wake(view));
        tokio::select! {
            _ = self.shutdown.cancelled() => return false,
            _ = sleep => {}
            _ = version.changed() => {}
            Some(done) = self.terms.join_next(), if !self.terms.is_empty() => {
                term_done(&self.family, &mut self.keys, done)
            }
            Some(dead) = self.gone.next(), if !self.gone.is_empty() => self.holder_gone(dead),
            // Acted on at the loop's top, at most once per spacing.
            _ = heard_notified(self.heard.as_deref()), if !self.told_pending => self.told_pending = true,
        }
        true
    }

    /// A holder's coordination session ended: its keys are acquirable now.
    fn holder_gone(&mut self, dead: i64) {
        tracing::debug!(
            family = self.family.name(),
            key = dead,
            "a holder's coordination session ended"
        );
        self.waited.remove(&dead);
        self.beat_at = Instant::now();
        for key in self.keys.values_mut().filter(|k| k.holder_key == Some(dead)) {
            key.holder_key = None;
            key.parked = false;
            // Acquirable now: taken after the grace if its preferred replica does not.
            key.probe = false;
            key.wake_at = Instant::now();
        }
    }

    /// Leaves the registry (the others count without this replica at once)
    /// and waits for the terms, which the manager's shutdown cancels and
    /// releases as interrupted; once `abandon` fires, drops them.
    async fn leave(mut self, abandon: CancellationToken) {
        let leave = self.store.leave(self.family.name(), &self.holder);
        let _ = tokio::time::timeout(self.config.statement_timeout(), leave).await;
        loop {
            tokio::select! {
                done = self.terms.join_next() => match done {
                    Some(done) => term_done(&self.family, &mut self.keys, done),
                    None => break,
                },
                _ = abandon.cancelled() => {
                    // Dropping a term's task releases it as interrupted.
                    self.terms.shutdown().await;
                    break;
                }
            }
        }
    }
}
