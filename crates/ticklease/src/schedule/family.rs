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

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use tokio::time::Instant;

use crate::connect::coordination::{FamilySignals, Heard, SIGNAL_SPACING};
use crate::error::chain;
use crate::leader::lead::{FamilyScope, KeyCancel, Lead, TermScope, Work};
use crate::ops::outcome::panic_message;
use crate::store::Refusal;
use asking::TermPlan;

mod asking;
mod run;
use crate::term::family::Family;
use crate::term::role::Role;
use crate::term::schedule::Schedule;
pub(crate) use run::family_loop;

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

/// The entry of a family key's role.
fn key_of<'a>(keys: &'a BTreeMap<String, Key>, role: &Role) -> Option<&'a Key> {
    role.as_str().split_once(':').and_then(|(_, k)| keys.get(k))
}

/// The entry of a family key's role, to change.
fn key_of_mut<'a>(keys: &'a mut BTreeMap<String, Key>, role: &Role) -> Option<&'a mut Key> {
    role.as_str().split_once(':').and_then(|(_, k)| keys.get_mut(k))
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
            tracing::warn!(%role, error = %crate::HistoryEntry::escape(&chain(&error)), "term failed");
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
