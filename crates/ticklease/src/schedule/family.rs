//! Role families: many roles of one kind (`tenant_sync:acme`,
//! `tenant_sync:globex`), one row and one independent term per key, led by
//! one loop per family and replica with statements that grow with replicas,
//! not keys.
//!
//! Each wake-up, a family loop sends one ACQUIRE for every key that is due
//! (its preferred keys first, at most its fair share of terms); each term
//! beats on the replica's shared heartbeat grid, so one RENEW carries all of
//! them; terms that end together are released in one RELEASE.
//!
//! **Spread.** Replicas learn how many serve the family from the replica
//! registry (`leader_replicas`): each loop registers itself once per
//! heartbeat and reads who else did. A replica counts while its
//! registration is younger than a lease TTL and, with a coordination
//! session, while its session holds its key (a killed replica drops out at
//! once). With N replicas and K keys, a replica prefers the keys whose rank
//! in the sorted key list is its own rank among the replicas modulo N
//! (K/N each, exactly, when all declare the same keys), takes other keys
//! only once they have stayed due for a grace of half a heartbeat,
//! and never holds more than `ceil(K/N)` plus a tenth (at least one) at
//! once, nor more than its `max_terms`.

use std::collections::{BTreeMap, HashSet};
use std::panic::AssertUnwindSafe;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use tokio::task::JoinSet;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::connect::coordination::{FamilySignals, Heard, SIGNAL_SPACING};
use crate::error::chain;
use crate::leader::lead::Work;
use crate::leader::lead::{FamilyScope, KeyCancel, Lead, Manager, TermScope};
use crate::ops::outcome::panic_message;
use crate::schedule::wake::{next_wake, Polled};
use crate::store::{Acquire, LeaseStore, Refusal, BATCH_MAX};
use asking::{Answer, DbClock, TermPlan};

mod asking;
use crate::term::family::Family;
use crate::term::role::Role;
use crate::term::schedule::Schedule;

pub use crate::store::REGISTRATION_TTL_MAX;

/// Wake-ups are rounded up to a grid of at most this (and at most a twelfth
/// of a heartbeat), so keys due within it share one ACQUIRE.
const WAKE_GRID_MAX: Duration = Duration::from_millis(50);

fn wake_grid(config: &crate::Config) -> Duration {
    WAKE_GRID_MAX.min(config.heartbeat_every() / 12)
}

/// The least time between two ACQUIREs a family loop runs because it was
/// told of releases, unpauses or run-nows (at most [`SIGNAL_SPACING`], a
/// sixth of a heartbeat): the keys told of within it share one statement.
/// Only the keys this replica prefers are asked about early: every
/// completed tick notifies, and the others wait for their grace anyway.
fn told_spacing(config: &crate::Config) -> Duration {
    SIGNAL_SPACING.min(config.heartbeat_every() / 6)
}

/// How a term of one of `family`'s keys is cancelled and counted.
fn scope(family: &Family, removed: KeyCancel, plan: &TermPlan) -> TermScope {
    TermScope {
        family: Some(FamilyScope {
            name: family.shared_name(),
            per_role_metrics: family.per_role_metrics(),
        }),
        removed: Some(removed),
        occurrence: plan.occurrence,
        backoff: plan.backoff,
        // A family runs scheduled keys, never long-lived ones.
        healthy_run: None,
    }
}

/// A family's job in a scheduler.
pub(crate) struct FamilyJob {
    pub(crate) family: Family,
    pub(crate) schedule: Schedule,
    pub(crate) work: Work,
}

/// One key as its family loop sees it.
struct Key {
    role: Role,
    /// When to ask the database about it next.
    wake_at: Instant,
    /// Whose coordination session's end makes it acquirable at once.
    holder_key: Option<i64>,
    /// Set while a term of it runs here; fired when the key is removed.
    term: Option<KeyCancel>,
    /// Held by a live replica and preferred by another: asked about again
    /// only when the replicas change, its holder's session ends, or after a
    /// long sleep (the preferred replica watches its expiry).
    parked: bool,
    /// Its wake-up is not a time the database gave for it (parked, paused,
    /// new, or after a failed ACQUIRE): if this replica does not prefer it,
    /// it is first looked at by an ACQUIRE that starts no term, so that its
    /// grace counts from when it was seen acquirable, never from an instant
    /// between its due time and its preferred replica's ACQUIRE.
    probe: bool,
    /// On a cron schedule, its last completed occurrence (or where its
    /// counting started) as last answered.
    after: Option<SystemTime>,
}

/// The fair share and its slack: how many terms a replica may hold.
pub(crate) fn fair_cap(keys: usize, replicas: usize) -> usize {
    let share = keys.div_ceil(replicas.max(1));
    share + (share / 10).max(1)
}

/// Whether this replica (`rank` among `replicas`) prefers the key at `index` in the sorted key list.
fn preferred(index: usize, rank: Option<usize>, replicas: usize) -> bool {
    rank.is_none_or(|rank| index % replicas.max(1) == rank)
}

fn on_grid(at: Instant, epoch: Instant, grid: Duration) -> Instant {
    let since = at.saturating_duration_since(epoch).as_nanos();
    let step = grid.as_nanos().max(1);
    let nanos = since.div_ceil(step) * step;
    epoch + Duration::from_nanos(u64::try_from(nanos).unwrap_or(u64::MAX))
}

/// Leads the keys of one family until `shutdown`, then leaves the replica
/// registry and waits for its terms to end (or, once `abandon` fires, drops them).
pub(crate) async fn family_loop<S: LeaseStore>(
    manager: Manager<S>,
    job: FamilyJob,
    shutdown: CancellationToken,
    abandon: CancellationToken,
) {
    let FamilyJob {
        family,
        schedule,
        work,
    } = job;
    let mut clock = DbClock::default();
    let config = *manager.config();
    let store = manager.store_arc().clone();
    let holder = manager.holder_id().to_string();
    let signals = store.signals().cloned();
    let heard = signals.as_ref().map(|s| s.family(family.name()));
    let mut version = family.version();
    let epoch = Instant::now();
    // Longer than the preferred replica needs to hear of a release, ask,
    // and wake at the due time it was told (spacing, grid, a statement).
    let grace = config.heartbeat_every() / 2;
    let (grid, spacing) = (wake_grid(&config), told_spacing(&config));
    let mut keys: BTreeMap<String, Key> = BTreeMap::new();
    let mut terms: JoinSet<(String, Duration)> = JoinSet::new();
    let mut gone: FuturesUnordered<BoxFuture<'static, i64>> = FuturesUnordered::new();
    let mut waited: HashSet<i64> = HashSet::new();
    let mut replicas: Vec<String> = Vec::new();
    let mut beat_at = Instant::now();
    let mut told_at: Option<Instant> = None;
    let mut told_pending = false;
    let mut synced = None;
    loop {
        let now = Instant::now();
        let current = *version.borrow_and_update();
        if synced != Some(current) {
            sync_keys(&family, &mut keys, now);
            synced = Some(current);
        }
        // The database keeps a registration at most REGISTRATION_TTL_MAX.
        let beat_every = config.heartbeat_every().min(REGISTRATION_TTL_MAX / 3);
        if now >= beat_at {
            let answer = tokio::time::timeout(
                config.statement_timeout(),
                store.beat(
                    family.name(),
                    &holder,
                    config.lease_ttl().min(REGISTRATION_TTL_MAX),
                ),
            )
            .await;
            // Counted from the answer: a beat that timed out is not sent again at once.
            beat_at = Instant::now() + beat_every;
            match answer {
                Ok(Ok(live)) => {
                    if live != replicas {
                        // Preferences moved, or a holder left (stopped, or froze past its TTL).
                        for key in keys.values_mut().filter(|k| k.parked) {
                            key.parked = false;
                            key.wake_at = now;
                        }
                    }
                    replicas = live;
                }
                Ok(Err(error)) => {
                    tracing::warn!(family = family.name(), error = %chain(&error), "replica beat failed")
                }
                Err(_) => tracing::warn!(family = family.name(), "replica beat did not answer"),
            }
        }
        let n = replicas.len().max(1);
        let rank = replicas.iter().position(|r| *r == holder);
        if told_pending && told_at.is_none_or(|at| at + spacing <= Instant::now()) {
            told_pending = false;
            told_at = Some(Instant::now());
            wake_told(heard.as_deref(), &mut keys, Instant::now(), |i| {
                preferred(i, rank, n)
            });
        }
        let led = keys.values().filter(|k| k.term.is_some()).count();
        let cap = fair_cap(keys.len(), n).min(family.max_terms());
        let limit = cap.saturating_sub(led);
        let now = Instant::now();
        let eligible_at = |index: usize, key: &Key| {
            if preferred(index, rank, n) {
                key.wake_at
            } else {
                key.wake_at + grace
            }
        };
        let (mut probes, mut candidates): (Vec<_>, Vec<_>) = keys
            .values()
            .enumerate()
            .filter(|(i, k)| k.term.is_none() && eligible_at(*i, k) <= now)
            .map(|(i, k)| (!preferred(i, rank, n), k))
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
        // The keys to look at go with a limit of 0: they start no term.
        let batches = [(roles(candidates), limit), (roles(probes), 0)];
        // Not before the registry answered once: alone, a replica would count N = 1.
        for (candidates, room) in batches {
            if limit == 0 || candidates.is_empty() || replicas.is_empty() || shutdown.is_cancelled() {
                continue;
            }
            // How far back the skipped occurrences of these keys can reach.
            let back_to = candidates
                .iter()
                .map(|role| key_of(&keys, role).and_then(|k| k.after))
                .min()
                .flatten();
            match asking::ask(&manager, &schedule, &mut clock, &candidates, back_to, room).await {
                Ok((answers, sent)) => {
                    let now = Instant::now();
                    for Answer {
                        role,
                        acquire,
                        plan,
                        after,
                    } in answers
                    {
                        let Some(key) = role.as_str().split_once(':').and_then(|(_, k)| keys.get_mut(k))
                        else {
                            continue;
                        };
                        key.after = after.or(key.after);
                        match acquire {
                            Acquire::Acquired(term) => {
                                let removed = manager.key_cancel();
                                key.term = Some(removed.clone());
                                key.holder_key = None;
                                key.parked = false;
                                key.probe = false;
                                let (manager, work, name) =
                                    (manager.clone(), work.clone(), role.as_str().to_string());
                                let scope = scope(&family, removed, &plan);
                                terms.spawn(async move {
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
                                    let key =
                                        name.split_once(':').map_or(name.clone(), |(_, k)| k.to_string());
                                    (key, ended(&role, &plan, &config, lead))
                                });
                            }
                            Acquire::Refused(refusal) => {
                                key.parked = matches!(&refusal, Refusal::Held { holder, .. }
                                    if others.contains(&role) && replicas.contains(holder));
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
                                        Refusal::Held { .. }
                                            | Refusal::NotDue { .. }
                                            | Refusal::Contended
                                            | Refusal::OverLimit
                                    );
                                let wake = next_wake(&Polled::Refused(&refusal), &config, signals.is_some());
                                // Never at once: a refusal is asked again on a later grid step.
                                key.wake_at =
                                    on_grid(now + wake.after.max(Duration::from_millis(1)), epoch, grid);
                                key.holder_key = wake.holder_key;
                            }
                        }
                    }
                }
                Err(error) => {
                    tracing::warn!(family = family.name(), error = %chain(&error), "ACQUIRE many failed");
                    let retry = Instant::now() + config.max_poll();
                    for role in &candidates {
                        if let Some(key) = role.as_str().split_once(':').and_then(|(_, k)| keys.get_mut(k)) {
                            key.wake_at = retry;
                            key.probe = true;
                        }
                    }
                }
            }
        }
        if let Some(signals) = &signals {
            for key in keys.values().filter_map(|k| k.holder_key) {
                if waited.contains(&key) {
                    continue;
                }
                // None past KEY_WAITERS_MAX: that holder is then waited for by its lease alone.
                if let Some(wait) = signals.holder_gone(key) {
                    waited.insert(key);
                    gone.push(wait.map(move |()| key).boxed());
                }
            }
        }
        // Without a registry answer no key is asked about: sleep until the next beat.
        let next = if limit > 0 && !replicas.is_empty() {
            keys.values()
                .enumerate()
                .filter(|(_, k)| k.term.is_none())
                .map(|(i, k)| eligible_at(i, k))
                .min()
        } else {
            None
        };
        let told_due = told_at.filter(|_| told_pending).map(|at| at + spacing);
        let wake = [next, told_due, Some(beat_at)]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(beat_at);
        let sleep = tokio::time::sleep_until(wake);
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = sleep => {}
            _ = version.changed() => {}
            Some(done) = terms.join_next(), if !terms.is_empty() => term_done(&family, &mut keys, done),
            Some(dead) = gone.next(), if !gone.is_empty() => {
                tracing::debug!(family = family.name(), key = dead, "a holder's coordination session ended");
                waited.remove(&dead);
                beat_at = Instant::now();
                for key in keys.values_mut().filter(|k| k.holder_key == Some(dead)) {
                    key.holder_key = None;
                    key.parked = false;
                    // Acquirable now: taken after the grace if its preferred replica does not.
                    key.probe = false;
                    key.wake_at = Instant::now();
                }
            }
            // Acted on at the loop's top, at most once per spacing.
            _ = heard_notified(heard.as_deref()), if !told_pending => told_pending = true,
        }
    }
    // The others count without this replica at once; its terms are
    // cancelled by the manager's shutdown and release as interrupted.
    let _ = tokio::time::timeout(config.statement_timeout(), store.leave(family.name(), &holder)).await;
    loop {
        tokio::select! {
            done = terms.join_next() => match done {
                Some(done) => term_done(&family, &mut keys, done),
                None => break,
            },
            _ = abandon.cancelled() => {
                // Dropping a term's task releases it as interrupted.
                terms.shutdown().await;
                break;
            }
        }
    }
}

/// The entry of a family key's role.
fn key_of<'a>(keys: &'a BTreeMap<String, Key>, role: &Role) -> Option<&'a Key> {
    role.as_str().split_once(':').and_then(|(_, k)| keys.get(k))
}

/// Resolves when the family is told of a release, unpause or run-now; never without signals.
async fn heard_notified(heard: Option<&FamilySignals>) {
    match heard {
        Some(heard) => heard.notify.notified().await,
        None => std::future::pending().await,
    }
}

/// A Held refusal whose expiry is pushed out to the longest sleep.
fn park(refusal: &Refusal) -> Refusal {
    match refusal.clone() {
        Refusal::Held {
            holder,
            expires_at,
            holder_key,
            ..
        } => Refusal::Held {
            holder,
            expires_at,
            remaining: Duration::MAX,
            holder_key,
        },
        other => other,
    }
}

/// Makes the keys the family was told of due now, among those it `prefers` (by index).
fn wake_told(
    heard: Option<&FamilySignals>,
    keys: &mut BTreeMap<String, Key>,
    now: Instant,
    prefers: impl Fn(usize) -> bool,
) {
    let Some(heard) = heard else {
        return;
    };
    let told = heard.take();
    for (index, (name, key)) in keys.iter_mut().enumerate() {
        let wake = match &told {
            Heard::All => true,
            Heard::Keys(told) => told.binary_search(name).is_ok(),
        };
        if wake && prefers(index) {
            key.wake_at = key.wake_at.min(now);
        }
    }
}

/// Adds new keys (due at once) and drops removed ones, cancelling a term of
/// a removed key (its entry goes when the term ends).
fn sync_keys(family: &Family, keys: &mut BTreeMap<String, Key>, now: Instant) {
    let current = family.keys().clone();
    keys.retain(|name, key| {
        if current.contains(name) {
            return true;
        }
        match &key.term {
            Some(removed) => {
                removed.remove();
                true
            }
            None => false,
        }
    });
    for name in current {
        if let std::collections::btree_map::Entry::Vacant(slot) = keys.entry(name) {
            let role = family.role(slot.key()).expect("checked when added");
            slot.insert(Key {
                role,
                wake_at: now,
                holder_key: None,
                term: None,
                parked: false,
                // Other replicas may have led it for long: its due time is unknown here.
                probe: true,
                after: None,
            });
        }
    }
}

/// How long after its term's task ended a key is asked about again.
fn ended(
    role: &Role,
    plan: &TermPlan,
    config: &crate::Config,
    lead: std::thread::Result<Result<Lead<()>, crate::Error>>,
) -> Duration {
    match lead {
        // RELEASE set the retry's backoff, or a cooldown as after any failed tick.
        Ok(Ok(Lead::Failed { .. })) => plan.after(true),
        // RELEASE stamped the tick, or until the next occurrence: not due before.
        Ok(Ok(Lead::Completed { .. })) => plan.after(false),
        // Asked about again at once: the database answers its cooldown (at
        // most a minute), or runs the lost occurrence again once unpaused.
        Ok(Ok(Lead::Lost { .. })) => Duration::ZERO,
        Ok(Ok(_)) => Duration::ZERO,
        Ok(Err(error)) => {
            tracing::warn!(%role, error = %chain(&error), "term failed");
            config.max_poll()
        }
        Err(panic) => {
            tracing::error!(%role, panic = panic_message(&*panic), "tick panicked");
            plan.after(false)
        }
    }
}

fn term_done(
    family: &Family,
    keys: &mut BTreeMap<String, Key>,
    done: Result<(String, Duration), tokio::task::JoinError>,
) {
    let Ok((name, after)) = done else {
        return;
    };
    let Some(key) = keys.get_mut(&name) else {
        return;
    };
    if key.term.take().is_some_and(|removed| removed.is_removed()) {
        if family.keys().contains(&name) {
            // Removed and added again while its term ran: a key like any other.
            key.wake_at = Instant::now();
        } else {
            keys.remove(&name);
        }
        return;
    }
    key.wake_at = Instant::now() + after;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fair_cap_is_the_share_plus_a_tenth_at_least_one() {
        assert_eq!(fair_cap(1000, 10), 110);
        assert_eq!(fair_cap(1000, 8), 137);
        assert_eq!(fair_cap(200, 3), 73);
        assert_eq!(fair_cap(5, 10), 2);
        assert_eq!(fair_cap(7, 0), 8);
    }

    #[test]
    fn each_replica_prefers_every_nth_key_by_its_rank() {
        let mine: Vec<usize> = (0..10).filter(|i| preferred(*i, Some(1), 3)).collect();
        assert_eq!(mine, [1, 4, 7]);
        assert!(preferred(5, None, 3), "unregistered: every key");
    }
}
