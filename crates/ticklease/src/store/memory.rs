//! An in-memory lease store on tokio's clock (feature `testing`), for
//! deterministic paused-time tests of a job's behaviour on lease loss,
//! pause and shutdown without Postgres. It passes the same conformance
//! suite as the Postgres store (`ticklease-testkit`), and it can be told to
//! hang or fail RENEWs and RELEASEs.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::sync::watch;
use tokio::time::Instant;

use crate::error::StoreError;
use crate::store::{
    Acquire, Ending, FamilyOccurrenceAsk, Interval, LeaseStatus, LeaseStore, LossReason, OccurrenceAnswer,
    OccurrenceAsk, Refusal, Release, Releasing, Renew, Term, BATCH_MAX, REGISTRATION_TTL_MAX,
};
use crate::term::role::Role;
use crate::term::schedule::{FIRST_OCCURRENCE_GRACE, SKIPPED_COUNTED_MAX};
use crate::term::token::Token;

#[derive(Debug, Clone, Default)]
struct Row {
    token: i64,
    holder_id: Option<String>,
    acquired_at: Option<SystemTime>,
    expires_at: Option<SystemTime>,
    last_tick_ended_at: Option<SystemTime>,
    last_tick_holder: Option<String>,
    paused_at: Option<SystemTime>,
    paused_by: Option<String>,
    pause_reason: Option<String>,
    not_before: Option<SystemTime>,
    /// The occurrence the current (or last) term ran.
    occurrence: Option<SystemTime>,
    last_occurrence: Option<SystemTime>,
    occurrences_since: Option<SystemTime>,
    /// Failed attempts of `occurrence`.
    failures: u32,
    schedule: Option<String>,
    next_occurrence: Option<SystemTime>,
    /// A run-now of a cron role waiting for a replica, and who asked.
    run_now_by: Option<String>,
    /// The last pause: when paused, when unpaused.
    last_pause: Option<(SystemTime, SystemTime)>,
    /// The current term is that manual run.
    manual_by: Option<String>,
    /// Declared by the last term's ACQUIRE (as `leader_acquire`'s p_long_lived),
    /// with its interval (none on a cron schedule).
    long_lived: bool,
    tick_interval: Option<Duration>,
    /// The lease's end of the term a pause ended, which every ACQUIRE waits
    /// for with `not_before` until that term's holder releases it (as
    /// `leader_pause`).
    pause_wait_until: Option<SystemTime>,
}

impl Row {
    fn live(&self, now: SystemTime) -> bool {
        self.holder_id.is_some() && self.expires_at.is_some_and(|e| e > now)
    }

    /// A pause's wait still holds the next term back (as `leader_pause_waits`).
    fn pause_waits(&self, now: SystemTime) -> bool {
        self.pause_wait_until.is_some_and(|w| w > now)
    }

    /// What an ACQUIRE waits for: the cooldown or a pause's wait.
    fn not_before(&self) -> Option<SystemTime> {
        self.not_before.max(self.pause_wait_until)
    }
}

#[derive(Debug)]
struct State {
    rows: BTreeMap<String, Row>,
    renew_sends: Vec<Instant>,
    fail_renews: usize,
    fail_releases: usize,
    fail_beats: usize,
    /// `(family, holder)` → when the replica's registration runs out.
    replicas: BTreeMap<(String, String), SystemTime>,
}

/// The in-memory store. Clones share state; at most [`RENEW_SENDS_KEPT`]
/// RENEW instants are kept.
///
/// ```
/// use std::time::Duration;
/// use ticklease::testing::MemoryStore;
/// use ticklease::{Config, Lead, LossReason, Manager, Role};
///
/// # #[tokio::main(flavor = "current_thread", start_paused = true)]
/// # async fn main() {
/// let store = MemoryStore::new();
/// let billing = Role::new("billing").unwrap();
/// let manager = Manager::start(store.clone(), Config::default(), [billing.clone()]).await.unwrap();
/// // Another replica takes the term over mid-tick: the next RENEW loses it and the work is cancelled.
/// let lead = manager
///     .lead(&billing, Duration::from_secs(3600), |tick| {
///         let store = store.clone();
///         async move {
///             store.take_over(tick.role(), Duration::from_secs(10));
///             tick.cancelled().await;
///             Ok::<_, std::io::Error>(())
///         }
///     })
///     .await
///     .unwrap();
/// assert!(matches!(lead, Lead::Lost { reason: LossReason::TakenOver, .. }), "{lead:?}");
/// # }
/// ```
#[derive(Debug, Clone)]
pub struct MemoryStore {
    state: Arc<Mutex<State>>,
    hang: Arc<watch::Sender<bool>>,
    epoch: (Instant, SystemTime),
}

impl Default for MemoryStore {
    fn default() -> Self {
        MemoryStore::new()
    }
}

/// Most RENEW instants [`MemoryStore::renew_sends`] keeps (the oldest go first).
pub const RENEW_SENDS_KEPT: usize = 10_000;

impl MemoryStore {
    /// An empty store on tokio's clock.
    pub fn new() -> Self {
        MemoryStore {
            state: Arc::new(Mutex::new(State {
                rows: BTreeMap::new(),
                renew_sends: Vec::new(),
                fail_renews: 0,
                fail_releases: 0,
                fail_beats: 0,
                replicas: BTreeMap::new(),
            })),
            hang: Arc::new(watch::channel(false).0),
            epoch: (Instant::now(), SystemTime::now()),
        }
    }

    /// The store's clock: tokio's (pausable) clock, as wall time.
    pub fn now(&self) -> SystemTime {
        self.epoch.1 + (Instant::now() - self.epoch.0)
    }

    /// While set, every RENEW waits (as a statement stuck on a lock would).
    pub fn hang_renews(&self, hang: bool) {
        self.hang.send_replace(hang);
    }

    /// The next `n` RENEWs fail with an error.
    pub fn fail_renews(&self, n: usize) {
        self.state.lock().expect("state").fail_renews = n;
    }

    /// The next `n` RELEASEs fail with an error (the term stays held).
    pub fn fail_releases(&self, n: usize) {
        self.state.lock().expect("state").fail_releases = n;
    }

    /// The next `n` replica-registry beats fail with an error (nothing is registered).
    pub fn fail_beats(&self, n: usize) {
        self.state.lock().expect("state").fail_beats = n;
    }

    /// Another replica takes `role` over: a later term, held by
    /// `another-replica` for `ttl`; the current holder's next RENEW loses it.
    pub fn take_over(&self, role: &Role, ttl: Duration) {
        let now = self.now();
        self.with(|s| {
            let row = s.rows.entry(role.to_string()).or_default();
            row.token += 1;
            row.holder_id = Some("another-replica".into());
            row.acquired_at = Some(now);
            row.expires_at = Some(now + ttl);
        });
    }

    /// The instants at which RENEWs were received.
    pub fn renew_sends(&self) -> Vec<Instant> {
        self.state.lock().expect("state").renew_sends.clone()
    }

    fn with<T>(&self, f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut self.state.lock().expect("state"))
    }
}

fn seed_token(now: SystemTime) -> i64 {
    now.duration_since(SystemTime::UNIX_EPOCH)
        .map(|d| d.as_millis() as i64)
        .unwrap_or_default()
}

fn check_batch(statement: &'static str, len: usize) -> Result<(), StoreError> {
    if len > BATCH_MAX {
        return Err(StoreError::Rejected {
            statement,
            problem: "a batch holds at most 1000 roles (BATCH_MAX)",
        });
    }
    Ok(())
}

/// ACQUIRE of one row; with `start` false an acquirable row is only reported ([`Refusal::OverLimit`]).
fn acquire_row(
    s: &mut State,
    role: &Role,
    holder: &str,
    lease_ttl: Duration,
    Interval { every, long_lived }: Interval,
    now: SystemTime,
    start: bool,
) -> Acquire {
    if !start && !s.rows.contains_key(role.as_str()) {
        return Acquire::Refused(Refusal::OverLimit);
    }
    let row = s.rows.entry(role.to_string()).or_insert_with(|| Row {
        token: seed_token(now) - 1,
        ..Row::default()
    });
    let due_at = [row.last_tick_ended_at.map(|t| t + every), row.not_before()]
        .into_iter()
        .flatten()
        .max();
    // A run-now is due at once, but for a pause's wait.
    let manual = row.run_now_by.is_some() && !row.pause_waits(now);
    if let Some(refusal) = blocked(row, now, due_at.filter(|_| !manual)) {
        return Acquire::Refused(refusal);
    }
    if !start {
        return Acquire::Refused(Refusal::OverLimit);
    }
    row.occurrence = None;
    row.manual_by = row.run_now_by.take();
    row.schedule = None;
    row.next_occurrence = None;
    row.long_lived = long_lived;
    row.tick_interval = Some(every);
    Acquire::Acquired(start_term(row, holder, lease_ttl, now))
}

/// Why `row` starts no term at `now`: paused, held, or not due until `due_at`.
fn blocked(row: &Row, now: SystemTime, due_at: Option<SystemTime>) -> Option<Refusal> {
    if let Some(by) = &row.paused_by {
        return Some(Refusal::Paused {
            by: by.clone(),
            reason: row.pause_reason.clone().unwrap_or_default(),
        });
    }
    if row.live(now) {
        let expires_at = row.expires_at.unwrap_or(now);
        return Some(Refusal::Held {
            holder: row.holder_id.clone().unwrap_or_default(),
            expires_at,
            remaining: expires_at.duration_since(now).unwrap_or_default(),
            // The fake has no coordination session.
            holder_key: None,
        });
    }
    due_at.filter(|d| *d > now).map(|due_at| Refusal::NotDue {
        due_at,
        remaining: due_at.duration_since(now).unwrap_or_default(),
    })
}

fn start_term(row: &mut Row, holder: &str, lease_ttl: Duration, now: SystemTime) -> Term {
    row.token = (row.token + 1).max(seed_token(now));
    row.holder_id = Some(holder.to_string());
    row.acquired_at = Some(now);
    row.expires_at = Some(now + lease_ttl);
    Term {
        token: Token(row.token),
        db_now: now,
        failures: row.failures,
    }
}

/// ACQUIRE of an occurrence, as `leader_acquire_occurrence` decides it;
/// with `start` false a term it would start is only reported ([`Refusal::OverLimit`]).
fn acquire_occurrence_row(
    s: &mut State,
    role: &Role,
    holder: &str,
    lease_ttl: Duration,
    ask: &OccurrenceAsk,
    now: SystemTime,
    start: bool,
) -> OccurrenceAnswer {
    let row = s.rows.entry(role.to_string()).or_insert_with(|| Row {
        token: seed_token(now) - 1,
        ..Row::default()
    });
    if row.occurrences_since.is_none() && row.last_occurrence.is_none() {
        row.occurrences_since = Some(now);
        row.schedule = Some(ask.schedule.clone());
    }
    if ask.occurrence.is_none() {
        row.schedule = Some(ask.schedule.clone());
    }
    let after = row.last_occurrence.or(row.occurrences_since).unwrap_or(now);
    let started = row.occurrence;
    // As leader_occurrence_floor: a role's first occurrence may be up to a
    // minute older than its first look.
    let floor = match (row.last_occurrence, started) {
        (None, None) => after - FIRST_OCCURRENCE_GRACE,
        _ => after,
    };
    let same = row.occurrence == ask.occurrence;
    let failures = if same { row.failures } else { 0 };
    // A requested manual run waits neither for the cooldown nor for the asked occurrence.
    let due_at = row
        .not_before()
        .filter(|n| *n > now)
        .or(ask.occurrence.filter(|o| *o > now))
        .filter(|_| row.run_now_by.is_none() || row.pause_waits(now));
    let cooled = row.not_before().is_none_or(|n| n <= now);
    let runnable = ask
        .occurrence
        .filter(|o| *o <= now && *o > floor && ask.before.is_none_or(|b| now < b) && cooled);
    let mut manual_by = None;
    let acquire = match blocked(row, now, due_at) {
        Some(refusal) => Acquire::Refused(refusal),
        None if !start && (runnable.is_some() || row.run_now_by.is_some()) => {
            Acquire::Refused(Refusal::OverLimit)
        }
        None => match (runnable, row.run_now_by.take()) {
            (Some(o), asked) => {
                row.run_now_by = asked;
                row.failures = failures;
                row.occurrence = Some(o);
                row.schedule = Some(ask.schedule.clone());
                row.next_occurrence = ask.next;
                row.manual_by = None;
                (row.tick_interval, row.long_lived) = (None, false);
                Acquire::Acquired(start_term(row, holder, lease_ttl, now))
            }
            (None, Some(by)) => {
                row.manual_by = Some(by);
                row.schedule = Some(ask.schedule.clone());
                (row.tick_interval, row.long_lived) = (None, false);
                manual_by.clone_from(&row.manual_by);
                Acquire::Acquired(start_term(row, holder, lease_ttl, now))
            }
            (None, None) => Acquire::Refused(Refusal::Contended),
        },
    };
    OccurrenceAnswer {
        acquire,
        after,
        failures,
        started,
        db_now: now,
        run_now_pending: row.run_now_by.is_some(),
        manual_by,
        last_pause: row.last_pause,
    }
}

fn renew_row(s: &mut State, role: &Role, token: Token, lease_ttl: Duration, now: SystemTime) -> Renew {
    let Some(row) = s.rows.get_mut(role.as_str()) else {
        return Renew::Lost(LossReason::Released);
    };
    if row.token == token.0 && row.holder_id.is_some() {
        row.expires_at = Some(now + lease_ttl);
        return Renew::Renewed { db_now: now };
    }
    Renew::Lost(if row.paused_at.is_some() {
        LossReason::Paused
    } else if row.token != token.0 {
        LossReason::TakenOver
    } else {
        LossReason::Released
    })
}

fn release_row(s: &mut State, term: &Releasing, now: SystemTime) -> bool {
    let Some(row) = s.rows.get_mut(term.role.as_str()) else {
        return false;
    };
    if row.token != term.token.0 || row.holder_id.is_none() {
        // The holder of a term a pause ended: its work stopped, the wait ends.
        if row.token == term.token.0 && row.holder_id.is_none() {
            row.pause_wait_until = None;
        }
        return false;
    }
    // A manual run (run-now) completes no occurrence and counts no attempt.
    let manual = row.manual_by.take().is_some();
    if term.outcome.stamps_last_tick() {
        row.last_tick_ended_at = Some(now);
        row.last_tick_holder = row.holder_id.clone();
        if !manual {
            row.last_occurrence = row.last_occurrence.max(row.occurrence);
            row.failures = 0;
        }
    } else if term.outcome == Release::Failed && !manual {
        row.failures = (row.failures + 1).min(1_000_000);
    }
    // A manual run leaves the cooldown (a failed occurrence's backoff) alone.
    if !manual {
        row.not_before = term.outcome.cooldown(term.interval).map(|d| now + d);
    }
    row.holder_id = None;
    row.acquired_at = None;
    row.expires_at = None;
    true
}

impl LeaseStore for MemoryStore {
    async fn acquire(
        &self,
        role: &Role,
        holder: &str,
        lease_ttl: Duration,
        interval: impl Into<Interval> + Send,
    ) -> Result<Acquire, StoreError> {
        let (now, interval) = (self.now(), interval.into());
        Ok(self.with(|s| acquire_row(s, role, holder, lease_ttl, interval, now, true)))
    }

    async fn acquire_occurrence(
        &self,
        role: &Role,
        holder: &str,
        lease_ttl: Duration,
        ask: &OccurrenceAsk,
    ) -> Result<OccurrenceAnswer, StoreError> {
        let now = self.now();
        Ok(self.with(|s| acquire_occurrence_row(s, role, holder, lease_ttl, ask, now, true)))
    }

    async fn acquire_many(
        &self,
        roles: &[Role],
        holder: &str,
        lease_ttl: Duration,
        interval: Duration,
        limit: usize,
    ) -> Result<Vec<(Role, Acquire)>, StoreError> {
        check_batch("ACQUIRE many", roles.len())?;
        let now = self.now();
        let mut seen = BTreeSet::new();
        let mut started = 0;
        Ok(self.with(|s| {
            roles
                .iter()
                .filter(|role| seen.insert(*role))
                .map(|role| {
                    let answer =
                        acquire_row(s, role, holder, lease_ttl, interval.into(), now, started < limit);
                    if matches!(answer, Acquire::Acquired(_)) {
                        started += 1;
                    }
                    (role.clone(), answer)
                })
                .collect()
        }))
    }

    async fn acquire_many_occurrence(
        &self,
        roles: &[Role],
        holder: &str,
        lease_ttl: Duration,
        ask: &FamilyOccurrenceAsk,
        limit: usize,
    ) -> Result<Vec<(Role, OccurrenceAnswer)>, StoreError> {
        check_batch("ACQUIRE many", roles.len())?;
        let in_bounds = ask.next > ask.occurrence
            && ask.recent.len() <= SKIPPED_COUNTED_MAX as usize
            && ask.recent.iter().all(|r| *r < ask.occurrence)
            && ask.schedule.chars().count() <= 200;
        if !in_bounds {
            return Err(StoreError::Rejected {
                statement: "ACQUIRE many",
                problem: "an occurrence needs the next after it, a schedule of at most 200 characters and at most 1000 earlier occurrences",
            });
        }
        let now = self.now();
        let one = OccurrenceAsk {
            occurrence: Some(ask.occurrence),
            before: Some(ask.next),
            skipped: Vec::new(),
            schedule: ask.schedule.clone(),
            next: Some(ask.next),
        };
        let mut seen = BTreeSet::new();
        let mut started = 0;
        Ok(self.with(|s| {
            roles
                .iter()
                .filter(|role| seen.insert(*role))
                .map(|role| {
                    let mut answer =
                        acquire_occurrence_row(s, role, holder, lease_ttl, &one, now, started < limit);
                    if matches!(answer.acquire, Acquire::Acquired(_)) {
                        started += 1;
                    }
                    // As the batched statement: it counts a key's skipped occurrences itself.
                    answer.started = None;
                    // As the batched statement: a refused key's due time is the next
                    // occurrence once this one completed.
                    if let Acquire::Refused(Refusal::Contended) = answer.acquire {
                        if answer.after >= ask.occurrence {
                            answer.acquire = Acquire::Refused(Refusal::NotDue {
                                due_at: ask.next,
                                remaining: ask.next.duration_since(now).unwrap_or_default(),
                            });
                        }
                    }
                    answer.run_now_pending = false;
                    answer.last_pause = None;
                    (role.clone(), answer)
                })
                .collect()
        }))
    }

    async fn renew(&self, role: &Role, token: Token, lease_ttl: Duration) -> Result<Renew, StoreError> {
        Ok(self.renew_many(&[(role.clone(), token)], lease_ttl).await?[0])
    }

    async fn renew_many(
        &self,
        terms: &[(Role, Token)],
        lease_ttl: Duration,
    ) -> Result<Vec<Renew>, StoreError> {
        check_batch("RENEW many", terms.len())?;
        self.with(|s| {
            if s.renew_sends.len() >= RENEW_SENDS_KEPT {
                s.renew_sends.remove(0);
            }
            s.renew_sends.push(Instant::now());
        });
        let mut hang = self.hang.subscribe();
        // The statement waits while hung, and is dropped if the caller times out.
        let _ = hang.wait_for(|h| !*h).await;
        let now = self.now();
        self.with(|s| {
            if s.fail_renews > 0 {
                s.fail_renews -= 1;
                return Err(StoreError::Timeout {
                    statement: "RENEW",
                    after: Duration::ZERO,
                });
            }
            Ok(terms
                .iter()
                .map(|(role, token)| renew_row(s, role, *token, lease_ttl, now))
                .collect())
        })
    }

    async fn release(
        &self,
        role: &Role,
        token: Token,
        outcome: Release,
        interval: Duration,
    ) -> Result<bool, StoreError> {
        let term = Releasing {
            role: role.clone(),
            token,
            outcome,
            interval,
            ending: Ending::of(outcome),
        };
        Ok(self.release_many(&[term]).await?[0])
    }

    async fn release_many(&self, terms: &[Releasing]) -> Result<Vec<bool>, StoreError> {
        check_batch("RELEASE many", terms.len())?;
        let now = self.now();
        self.with(|s| {
            if s.fail_releases > 0 {
                s.fail_releases -= 1;
                return Err(StoreError::Timeout {
                    statement: "RELEASE",
                    after: Duration::ZERO,
                });
            }
            Ok(terms.iter().map(|t| release_row(s, t, now)).collect())
        })
    }

    async fn beat(&self, family: &str, holder: &str, lease_ttl: Duration) -> Result<Vec<String>, StoreError> {
        let now = self.now();
        self.with(|s| {
            if s.fail_beats > 0 {
                s.fail_beats -= 1;
                return Err(StoreError::Timeout {
                    statement: "BEAT",
                    after: Duration::ZERO,
                });
            }
            s.replicas.insert(
                (family.to_string(), holder.to_string()),
                now + lease_ttl.min(REGISTRATION_TTL_MAX),
            );
            Ok(s.replicas
                .iter()
                .filter(|((f, _), expires_at)| f == family && **expires_at > now)
                .map(|((_, h), _)| h.clone())
                .collect())
        })
    }

    async fn leave(&self, family: &str, holder: &str) -> Result<bool, StoreError> {
        Ok(self.with(|s| {
            s.replicas
                .remove(&(family.to_string(), holder.to_string()))
                .is_some()
        }))
    }

    async fn pause(&self, role: &Role, by: &str, reason: &str) -> Result<bool, StoreError> {
        if by.trim().is_empty() {
            return Err(StoreError::Rejected {
                statement: "PAUSE",
                problem: "who paused the role must be named",
            });
        }
        let now = self.now();
        self.with(|s| {
            let row = s.rows.get_mut(role.as_str()).ok_or(StoreError::UnknownRole {
                role: role.to_string(),
            })?;
            if row.paused_at.is_some() {
                return Ok(false);
            }
            if row.live(now) {
                row.pause_wait_until = row.expires_at;
            }
            row.paused_at = Some(now);
            row.paused_by = Some(by.to_string());
            row.pause_reason = Some(reason.to_string());
            row.holder_id = None;
            row.acquired_at = None;
            row.expires_at = None;
            Ok(true)
        })
    }

    async fn unpause(&self, role: &Role) -> Result<bool, StoreError> {
        let now = self.now();
        self.with(|s| {
            let row = s.rows.get_mut(role.as_str()).ok_or(StoreError::UnknownRole {
                role: role.to_string(),
            })?;
            let paused_at = row.paused_at.take();
            let was = paused_at.is_some();
            if let Some(at) = paused_at {
                row.last_pause = Some((at, now.max(at)));
            }
            row.paused_by = None;
            row.pause_reason = None;
            Ok(was)
        })
    }

    async fn run_now(&self, role: &Role) -> Result<bool, StoreError> {
        let now = self.now();
        self.with(|s| {
            let row = s.rows.get_mut(role.as_str()).ok_or(StoreError::UnknownRole {
                role: role.to_string(),
            })?;
            // A manual run, whatever the schedule; its cooldown stays, as a pause's wait.
            row.run_now_by = Some("memory".into());
            Ok(row.not_before.is_some_and(|t| t > now))
        })
    }

    async fn seed(&self, roles: &[Role]) -> Result<(), StoreError> {
        let now = self.now();
        self.with(|s| {
            for role in roles {
                s.rows.entry(role.to_string()).or_insert_with(|| Row {
                    token: seed_token(now),
                    ..Row::default()
                });
            }
        });
        Ok(())
    }

    async fn status(&self) -> Result<Vec<LeaseStatus>, StoreError> {
        let now = self.now();
        Ok(self.with(|s| {
            s.rows
                .iter()
                .map(|(role, r)| LeaseStatus {
                    role: role.clone(),
                    held: r.live(now),
                    holder_id: r.holder_id.clone(),
                    token: Token(r.token),
                    acquired_at: r.acquired_at,
                    expires_at: r.expires_at,
                    db_now: now,
                    remaining: r
                        .expires_at
                        .filter(|_| r.live(now))
                        .and_then(|e| e.duration_since(now).ok()),
                    paused_at: r.paused_at,
                    paused_by: r.paused_by.clone(),
                    pause_reason: r.pause_reason.clone(),
                    last_tick_ended_at: r.last_tick_ended_at,
                    last_tick_holder: r.last_tick_holder.clone(),
                    not_before: if r.pause_waits(now) {
                        r.not_before()
                    } else {
                        r.not_before
                    },
                    last_outcome: None,
                    schedule: r.schedule.clone(),
                    last_occurrence: r.last_occurrence,
                    next_occurrence: match r.occurrence {
                        // Retries spent: the cooldown reaches the next occurrence.
                        Some(o)
                            if Some(o) > r.last_occurrence
                                && !r.live(now)
                                && r.not_before
                                    .zip(r.next_occurrence)
                                    .is_none_or(|(n, next)| n + Duration::from_secs(1) < next) =>
                        {
                            Some(o)
                        }
                        _ => r.next_occurrence,
                    },
                    long_lived: r.long_lived,
                    tick_interval: r.tick_interval,
                })
                .collect()
        }))
    }
}
