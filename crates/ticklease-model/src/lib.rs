//! An executable model of ticklease's protocol for one role: leases on the
//! database clock, fencing tokens, the fence and its commit check, pause,
//! the coordination session's holder keys, and a promotion that loses the
//! last commits. [`LeaseModel`] is checked exhaustively for small bounds with
//! [stateright](https://docs.rs/stateright); every property has a
//! [`Bug`] that the checker must catch with a counterexample
//! (`tests/mutations.rs`), and `tests/replay.rs` replays walks of the model
//! against the real Postgres store, so the model and the code cannot drift
//! apart silently.
//!
//! Each action is named after the statement it models (see the crate docs of
//! `ticklease`, "The four statements"). Time is the database clock in whole
//! ticks. A replica's monotonic clock may run slow against it: replica 0's
//! abandon instant comes up to `skew` ticks late in database time (a
//! constant offset changes nothing, since the code only compares local
//! instants with each other).
//!
//! What the model abstracts: one role; statements are atomic and take no
//! time (an unanswered RENEW is modelled by [`Action::RenewUnanswered`]);
//! `statement_timeout` is folded into `abandon` (the config enforces
//! `abandon + statement_timeout < lease_ttl`); a claim is one fenced
//! transaction, its fence ([`Action::Fence`]) and its COMMIT
//! ([`Action::Commit`]) two steps that other actions may interleave.
//!
//! Two fences are modelled ([`FenceKind`]). The shipped one checks the term
//! at the fence and again at COMMIT (a deferred check). The lock at the
//! fence (issue 43) checks once and keeps a `FOR KEY SHARE` lock on the
//! lease row to the claim's end; whatever ends a term (a takeover, a pause,
//! a RELEASE) takes a conflicting lock, so it first ends the claims that
//! hold one (it waits a grace, then ends their backends: one step here,
//! since a statement is atomic in the model and the grace is shorter than
//! a statement's timeout). The difference a user sees: a claim whose lease
//! ran out while nothing ended its term commits.

use stateright::{Model, Property};

/// A deliberate defect, each the negation of one safety argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Bug {
    /// ACQUIRE keeps the row's token instead of issuing a new one.
    NoTokenBump,
    /// The fence checks the term when it runs, and nothing at COMMIT. Under
    /// the lock at the fence, a fence that takes no lock: what a check and a
    /// lock taken in two steps allows too, once an ender commits between them.
    LockFreeFence,
    /// RENEW matches the role, not `(role, token)`, and takes the row back.
    RenewRevives,
    /// ACQUIRE issues `token + 1`, without the database clock.
    TokenPlusOne,
    /// ACQUIRE over a dead holder key starts a term under the old token, so
    /// the old term's fence still passes.
    KeyTakeoverKeepsToken,
    /// The fence and its commit check ignore a pause (and pause leaves the
    /// holder in place).
    FenceIgnoresPause,
    /// Followers do not wait on the holder's key: a dead holder is replaced
    /// only when its lease runs out.
    NoKeyWait,
    /// The holder is not told of a pause: it learns at its next heartbeat.
    NoPauseSignal,
    /// Lock at the fence: a pause marks the row without a lock that
    /// conflicts with the claims' (as `FOR NO KEY UPDATE` would), so it
    /// neither waits for nor ends them.
    EnderNoKeyUpdate,
    /// Lock at the fence: ACQUIRE ends the claims holding the row before it
    /// asks whether the term is live.
    DrainKillsLiveTerm,
    /// Lock at the fence: a takeover or a pause waits for the claims that
    /// hold the row and never ends them, so a frozen claimer holds it back.
    NoDrain,
}

/// Which fence the claims use.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FenceKind {
    /// `leader_fence`: the term is checked at the fence and again by a
    /// deferred check at COMMIT.
    CommitCheck,
    /// The lock at the fence: the term is checked once, under a
    /// `FOR KEY SHARE` lock on the lease row held to the claim's end, which
    /// every statement that ends a term waits for, then ends.
    RowLock,
}

/// The model's bounds and timings, in ticks of the database clock.
#[derive(Clone, Debug)]
pub struct LeaseModel {
    /// Replicas (2..=3).
    pub replicas: u8,
    /// `lease_ttl`.
    pub ttl: u8,
    /// `abandon_after` (+ `statement_timeout`): `< ttl`.
    pub abandon: u8,
    /// How late, in database ticks, replica 0's clock may reach its
    /// abandon instant (both 0 and this are checked).
    pub skew: u8,
    /// The database clock stops here.
    pub max_time: u8,
    /// Token units (milliseconds) per tick: ACQUIRE issues
    /// `greatest(token + 1, now × per_tick)`.
    pub token_per_tick: u64,
    /// How long a promotion takes, in ticks.
    pub failover: u8,
    /// Promotions per run.
    pub max_promotions: u8,
    /// Coordination sessions (re)opened per run, over all replicas.
    pub max_sessions: u8,
    /// Faults (freeze, death, session drop) per run.
    pub max_faults: u8,
    /// Statements per run (ACQUIRE, RENEW, RELEASE, claims): bounds the
    /// tokens' lead over the clock.
    pub max_statements: u8,
    /// Model coordination sessions (holder keys).
    pub sessions: bool,
    /// Model promotions.
    pub promotions: bool,
    /// The fence the claims use.
    pub fence: FenceKind,
    /// The defect to check for, if any.
    pub bug: Option<Bug>,
    /// Check only this property (the checker then stops at its first
    /// counterexample).
    pub only: Option<&'static str>,
}

impl LeaseModel {
    /// The bounds checked in CI: two replicas, TTL 3, abandon 2, four ticks,
    /// replica 0's clock up to one tick slow.
    pub fn small() -> Self {
        LeaseModel {
            replicas: 2,
            ttl: 3,
            abandon: 2,
            skew: 1,
            max_time: 4,
            token_per_tick: 100,
            failover: 1,
            max_promotions: 1,
            max_sessions: 3,
            max_faults: 2,
            max_statements: 6,
            sessions: true,
            promotions: true,
            fence: FenceKind::CommitCheck,
            bug: None,
            only: None,
        }
    }

    /// Three replicas, within a smaller bound: a third replica (two
    /// followers racing for a dead holder's role) without the state space
    /// of [`LeaseModel::small`]'s longer runs.
    pub fn three_replicas() -> Self {
        LeaseModel {
            replicas: 3,
            skew: 0,
            max_time: 3,
            max_statements: 4,
            max_sessions: 4,
            ..LeaseModel::small()
        }
    }

    /// The same bounds, with claims under the lock at the fence.
    pub fn row_lock(self) -> Self {
        LeaseModel {
            fence: FenceKind::RowLock,
            ..self
        }
    }

    /// With `bug` planted, checking only `property`.
    pub fn with_bug(mut self, bug: Bug, property: &'static str) -> Self {
        self.bug = Some(bug);
        self.only = Some(property);
        self
    }

    fn bug(&self, bug: Bug) -> bool {
        self.bug == Some(bug)
    }
}

/// The lease row.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Row {
    /// `holder_token`.
    pub token: u64,
    /// `holder_id`: the replica.
    pub holder: Option<u8>,
    /// `expires_at`.
    pub expires: u8,
    /// `holder_key`.
    pub key: Option<u8>,
    /// `paused_at IS NOT NULL`.
    pub paused: bool,
    /// `pause_wait_until`: the lease's end of the term a pause ended, which
    /// every ACQUIRE waits for unless that term's holder RELEASEs it.
    pub pause_wait: Option<u8>,
}

/// One database (the primary's, or the standby's copy). Committed claims
/// are kept as what the properties need, not as a list, to keep the state
/// space small.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Db {
    /// The role's row.
    pub row: Row,
    /// The token of the last committed claim.
    pub last_claim: Option<u64>,
    /// A claim committed after a claim of a newer token.
    pub stale_claim: bool,
    /// A claim committed while the role was paused.
    pub claim_while_paused: bool,
}

/// A replica's term as it believes it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Held {
    /// The term's token.
    pub token: u64,
    /// When the last acknowledged RENEW (or the ACQUIRE) was sent.
    pub last_ack: u8,
}

/// One replica process.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Replica {
    /// The process runs (or is frozen).
    pub alive: bool,
    /// SIGSTOPped: takes no step; its backends (and key) live on.
    pub frozen: bool,
    /// Its coordination session's key, while the session lives.
    pub session: Option<u8>,
    /// The term it believes it holds.
    pub term: Option<Held>,
    /// A claim that passed the fence and has not committed: its token.
    pub claim: Option<u64>,
    /// How late its clock reaches an instant, in database ticks.
    pub skew: u8,
}

/// The whole system.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    /// The database clock.
    pub now: u8,
    /// The primary.
    pub db: Db,
    /// The standby's copy (asynchronous: as of the last replication).
    pub standby: Db,
    /// The replicas.
    pub replicas: Vec<Replica>,
    /// The largest token any ACQUIRE issued, on any timeline.
    pub max_issued: Option<u64>,
    /// An ACQUIRE issued a token not above every token issued before.
    pub reissued: bool,
    /// Sessions opened so far (the next key).
    pub sessions: u8,
    /// Promotions so far.
    pub promotions: u8,
    /// Faults so far.
    pub faults: u8,
    /// Statements so far.
    pub statements: u8,
    /// A tick passed while a follower had been told the role is free.
    pub missed_wakeup: bool,
    /// A tick passed while a paused holder, told of the pause, still worked.
    pub missed_pause: bool,
    /// An ACQUIRE took over a term whose lease ran but whose key was gone.
    pub key_takeover: bool,
    /// A promotion lost an ACQUIRE the old primary had committed.
    pub lost_acquire: bool,
    /// Lock at the fence: the replicas whose claims hold the lease row
    /// (a bit each). Row locks are the primary's: a promotion ends them.
    pub lockers: u8,
    /// A claim committed once its term was over: another term, a pause or
    /// a RELEASE had committed.
    pub claim_after_end: bool,
    /// A claim committed after its lease ran out (the lock at the fence
    /// allows it while nothing ended the term).
    pub claim_after_expiry: bool,
    /// A statement ended the claims of a term that was live.
    pub swept_live: bool,
    /// A takeover or pause was held back by a claim in flight.
    pub held_back: bool,
}

/// A step of one actor, named after the statement it runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// ACQUIRE by a replica.
    Acquire(u8),
    /// RENEW, answered.
    Renew(u8),
    /// RENEW that ran but whose answer was lost (a statement timeout).
    RenewUnanswered(u8),
    /// RELEASE.
    Release(u8),
    /// The heartbeat stops the work at `last_ack + abandon`.
    Abandon(u8),
    /// A claim statement with the fence (`leader_fence`).
    Fence(u8),
    /// The claim's COMMIT, with the deferred commit check.
    Commit(u8),
    /// `leader_pause`.
    Pause,
    /// `leader_unpause`.
    Unpause,
    /// SIGSTOP.
    Freeze(u8),
    /// SIGCONT.
    Resume(u8),
    /// SIGKILL: its backends end, and its key with them.
    Die(u8),
    /// Only its coordination connection ends (`pg_terminate_backend`).
    DropSession(u8),
    /// The coordination session reconnects with a new key.
    Reconnect(u8),
    /// The database clock advances one tick.
    Tick,
    /// The standby catches up with the primary.
    Replicate,
    /// The standby is promoted (losing what it had not received).
    Promote,
}

impl State {
    fn key_alive(&self, key: Option<u8>) -> bool {
        key.is_none_or(|k| self.replicas.iter().any(|r| r.session == Some(k)))
    }

    /// `leader_lease_live`: what the fence and its commit check ask.
    fn lease_live(&self) -> bool {
        let row = &self.db.row;
        row.holder.is_some() && row.expires > self.now
    }

    /// `leader_term_live`: what ACQUIRE asks.
    fn term_live(&self) -> bool {
        self.lease_live() && self.key_alive(self.db.row.key)
    }

    /// `leader_fence(role, token)` now (also what the commit check asks).
    pub fn fence_passes(&self, model: &LeaseModel, token: u64) -> bool {
        self.db.row.token == token
            && self.lease_live()
            && (!self.db.row.paused || model.bug(Bug::FenceIgnoresPause))
    }

    /// Lock at the fence: what a statement that ends the term does about
    /// the claims holding the row. `true` when it may go on (none held it,
    /// or it ended them); each ended claim is rolled back.
    fn drain(&mut self, model: &LeaseModel) -> bool {
        if model.fence != FenceKind::RowLock || self.lockers == 0 {
            return true;
        }
        if model.bug(Bug::NoDrain) {
            return false;
        }
        for (r, replica) in self.replicas.iter_mut().enumerate() {
            if self.lockers & (1 << r) != 0 {
                replica.claim = None;
            }
        }
        self.lockers = 0;
        true
    }

    /// A replica's claim ends without committing (its transaction rolls back).
    fn drop_claim(&mut self, r: u8) {
        self.replicas[r as usize].claim = None;
        self.lockers &= !(1 << r);
    }

    fn acting(&self, r: u8) -> bool {
        let replica = &self.replicas[r as usize];
        replica.alive && !replica.frozen
    }

    /// A follower the coordination session wakes now: the holder's key is
    /// gone while its lease runs, and the follower could lead.
    fn woken_follower(&self, model: &LeaseModel) -> bool {
        let row = &self.db.row;
        let freed = row.holder.is_some() && row.expires > self.now && !self.key_alive(row.key);
        freed
            && !row.paused
            && (0..model.replicas).any(|r| {
                let replica = &self.replicas[r as usize];
                self.acting(r)
                    && replica.session.is_some()
                    && replica.term.is_none()
                    && replica.claim.is_none()
            })
    }

    /// A holder told of a pause that has not yet renewed.
    fn told_of_pause(&self, model: &LeaseModel) -> bool {
        self.db.row.paused
            && (0..model.replicas).any(|r| {
                let replica = &self.replicas[r as usize];
                self.acting(r) && replica.session.is_some() && replica.term.is_some()
            })
    }
}

impl Model for LeaseModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        let db = Db {
            row: Row {
                token: 0,
                holder: None,
                expires: 0,
                key: None,
                paused: false,
                pause_wait: None,
            },
            last_claim: None,
            stale_claim: false,
            claim_while_paused: false,
        };
        let replica = Replica {
            alive: true,
            frozen: false,
            session: None,
            term: None,
            claim: None,
            skew: 0,
        };
        let mut replicas = vec![replica; self.replicas as usize];
        let mut sessions = 0;
        if self.sessions {
            for (i, r) in replicas.iter_mut().enumerate() {
                r.session = Some(i as u8);
                sessions += 1;
            }
        }
        let initial = State {
            now: 0,
            standby: db.clone(),
            db,
            replicas,
            max_issued: None,
            reissued: false,
            sessions,
            promotions: 0,
            faults: 0,
            statements: 0,
            missed_wakeup: false,
            missed_pause: false,
            key_takeover: false,
            lost_acquire: false,
            lockers: 0,
            claim_after_end: false,
            claim_after_expiry: false,
            swept_live: false,
            held_back: false,
        };
        (0..=self.skew)
            .map(|skew| {
                let mut state = initial.clone();
                state.replicas[0].skew = skew;
                state
            })
            .collect()
    }

    fn actions(&self, s: &State, actions: &mut Vec<Action>) {
        let statements = s.statements < self.max_statements;
        let faults = s.faults < self.max_faults;
        for r in 0..self.replicas {
            let replica = &s.replicas[r as usize];
            if s.acting(r) {
                match (replica.term, replica.claim) {
                    (None, None) if statements => actions.push(Action::Acquire(r)),
                    (Some(held), claim) => {
                        if s.now < held.last_ack + self.abandon + replica.skew && statements {
                            actions.push(Action::Renew(r));
                            actions.push(Action::RenewUnanswered(r));
                        }
                        if s.now >= held.last_ack + self.abandon + replica.skew {
                            actions.push(Action::Abandon(r));
                        }
                        if statements {
                            actions.push(Action::Release(r));
                        }
                        match claim {
                            None if statements => actions.push(Action::Fence(r)),
                            Some(_) => actions.push(Action::Commit(r)),
                            None => {}
                        }
                    }
                    _ => {}
                }
            }
            if replica.alive && faults {
                if replica.frozen {
                    actions.push(Action::Resume(r));
                } else {
                    actions.push(Action::Freeze(r));
                }
                let others_alive = s.replicas.iter().filter(|o| o.alive).count() > 1;
                if others_alive {
                    actions.push(Action::Die(r));
                }
                if replica.session.is_some() {
                    actions.push(Action::DropSession(r));
                }
            }
            if self.sessions && replica.alive && replica.session.is_none() && s.sessions < self.max_sessions {
                actions.push(Action::Reconnect(r));
            }
        }
        if statements {
            actions.push(if s.db.row.paused {
                Action::Unpause
            } else {
                Action::Pause
            });
        }
        if s.now < self.max_time {
            actions.push(Action::Tick);
        }
        if self.promotions && s.promotions < self.max_promotions {
            if s.standby != s.db {
                actions.push(Action::Replicate);
            }
            if s.now + self.failover <= self.max_time {
                actions.push(Action::Promote);
            }
        }
    }

    fn next_state(&self, s: &State, action: Action) -> Option<State> {
        let mut n = self.step(s, action)?;
        // Judged from the states alone, whatever the step's code did.
        match action {
            Action::Acquire(r) => {
                let takeover_allowed =
                    !s.db.row.paused && !s.term_live() && s.db.row.pause_wait.is_none_or(|w| w <= s.now);
                n.held_back |= takeover_allowed && n.replicas[r as usize].term.is_none();
                n.swept_live |= s.term_live()
                    && s.replicas
                        .iter()
                        .zip(&n.replicas)
                        .any(|(before, after)| before.claim.is_some() && after.claim.is_none());
            }
            Action::Pause => n.held_back |= !n.db.row.paused,
            _ => {}
        }
        Some(n)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut all = vec![
            Property::always("claims commit in token order", |_, s: &State| !s.db.stale_claim),
            Property::always("at most one live term", |m, s: &State| {
                s.replicas
                    .iter()
                    .filter(|r| r.term.is_some_and(|h| s.fence_passes(m, h.token)))
                    .count()
                    <= 1
            }),
            Property::always("no claim commits while paused", |_, s: &State| {
                !s.db.claim_while_paused
            }),
            Property::always("tokens are unique across timelines", |_, s: &State| !s.reissued),
            Property::always("no claim commits once its term is over", |_, s: &State| {
                !s.claim_after_end
            }),
            Property::always(
                "a takeover or a pause is never held back by a claim",
                |_, s: &State| !s.held_back,
            ),
            Property::always("no claim of a live term is ended", |_, s: &State| !s.swept_live),
            Property::always(
                "a dead holder's role is led before the next tick",
                |_, s: &State| !s.missed_wakeup,
            ),
            Property::always(
                "a pause cancels the holder's work before the next tick",
                |_, s: &State| !s.missed_pause,
            ),
            // Not vacuous: the interesting steps are reachable.
            Property::sometimes("a key takeover happens", |_, s: &State| s.key_takeover),
            Property::sometimes("a promotion loses an ACQUIRE", |_, s: &State| s.lost_acquire),
            Property::sometimes("a claim commits", |_, s: &State| s.db.last_claim.is_some()),
        ];
        match self.fence {
            FenceKind::CommitCheck => all.push(Property::always(
                "no claim commits after its lease ran out",
                |_, s: &State| !s.claim_after_expiry,
            )),
            // What the lock at the fence gives up: stated, and reachable.
            FenceKind::RowLock => all.push(Property::sometimes(
                "a claim commits after its lease ran out, nothing having ended its term",
                |_, s: &State| s.claim_after_expiry,
            )),
        }
        if let Some(only) = self.only {
            all.retain(|p| p.name == only);
        }
        all
    }
}

impl LeaseModel {
    /// One action's effect, before the checks [`Model::next_state`] makes
    /// of the states on either side.
    fn step(&self, s: &State, action: Action) -> Option<State> {
        let mut n = s.clone();
        match action {
            Action::Acquire(r) => self.acquire(s, &mut n, r),
            Action::Renew(r) | Action::RenewUnanswered(r) => {
                self.renew(s, &mut n, r, action == Action::Renew(r))?
            }
            Action::Release(r) => self.release(s, &mut n, r)?,
            Action::Abandon(r) => {
                n.replicas[r as usize].term = None;
                n.drop_claim(r);
            }
            Action::Fence(r) => self.fence(s, &mut n, r)?,
            Action::Commit(r) => self.commit(s, &mut n, r)?,
            Action::Pause => self.pause(s, &mut n),
            Action::Unpause => {
                n.statements += 1;
                n.db.row.paused = false;
            }
            Action::Freeze(_)
            | Action::Resume(_)
            | Action::Die(_)
            | Action::DropSession(_)
            | Action::Reconnect(_) => self.fault(s, &mut n, action),
            Action::Tick => self.tick(s, &mut n)?,
            Action::Replicate => n.standby = s.db.clone(),
            Action::Promote => self.promote(s, &mut n),
        }
        Some(n)
    }

    /// ACQUIRE: a takeover drains the old term's claims first.
    fn acquire(&self, s: &State, n: &mut State, r: u8) {
        n.statements += 1;
        if self.bug(Bug::DrainKillsLiveTerm) {
            n.drain(self);
        }
        if s.db.row.paused || s.term_live() || s.db.row.pause_wait.is_some_and(|w| w > s.now) {
            return;
        }
        // The takeover: the old term's claims end first.
        if !n.drain(self) {
            return;
        }
        let seeded = if self.bug(Bug::TokenPlusOne) {
            s.db.row.token + 1
        } else {
            (s.db.row.token + 1).max(s.now as u64 * self.token_per_tick)
        };
        let key_takeover = s.lease_live() && !s.key_alive(s.db.row.key);
        let token = if self.bug(Bug::NoTokenBump) || (self.bug(Bug::KeyTakeoverKeepsToken) && key_takeover) {
            s.db.row.token
        } else {
            seeded
        };
        let replica = &mut n.replicas[r as usize];
        n.db.row = Row {
            token,
            holder: Some(r),
            expires: s.now + self.ttl,
            key: replica.session,
            paused: false,
            pause_wait: s.db.row.pause_wait,
        };
        replica.term = Some(Held {
            token,
            last_ack: s.now,
        });
        n.reissued |= s.max_issued.is_some_and(|m| token <= m);
        n.max_issued = Some(s.max_issued.map_or(token, |m| m.max(token)));
        n.key_takeover |= key_takeover;
    }

    /// RENEW, answered or not.
    fn renew(&self, s: &State, n: &mut State, r: u8, answered: bool) -> Option<()> {
        n.statements += 1;
        let held = s.replicas[r as usize].term?;
        let matches = s.db.row.token == held.token && s.db.row.holder.is_some();
        let revive = self.bug(Bug::RenewRevives) && !s.db.row.paused;
        let replica = &mut n.replicas[r as usize];
        if matches || revive {
            n.db.row.token = held.token;
            n.db.row.holder = Some(r);
            n.db.row.expires = s.now + self.ttl;
            n.db.row.key = replica.session;
            if answered {
                replica.term = Some(Held {
                    last_ack: s.now,
                    ..held
                });
            }
        } else if answered {
            // 0 rows: the term is over; the work (and its claim) is dropped.
            replica.term = None;
            n.drop_claim(r);
        }
        Some(())
    }

    /// RELEASE by the holder of `r`'s term.
    fn release(&self, s: &State, n: &mut State, r: u8) -> Option<()> {
        n.statements += 1;
        let held = s.replicas[r as usize].term?;
        if s.db.row.token == held.token && s.db.row.holder.is_some() {
            n.db.row.holder = None;
            n.db.row.key = None;
        } else if s.db.row.token == held.token {
            // The holder of a term a pause ended: its work stopped.
            n.db.row.pause_wait = None;
        }
        n.replicas[r as usize].term = None;
        n.drop_claim(r);
        Some(())
    }

    /// The claim statement with the fence.
    fn fence(&self, s: &State, n: &mut State, r: u8) -> Option<()> {
        n.statements += 1;
        let held = s.replicas[r as usize].term?;
        if s.fence_passes(self, held.token) {
            n.replicas[r as usize].claim = Some(held.token);
            if self.fence == FenceKind::RowLock && !self.bug(Bug::LockFreeFence) {
                n.lockers |= 1 << r;
            }
        }
        Some(())
    }

    /// The claim's COMMIT.
    fn commit(&self, s: &State, n: &mut State, r: u8) -> Option<()> {
        let token = s.replicas[r as usize].claim?;
        let checked = match self.fence {
            FenceKind::CommitCheck => s.fence_passes(self, token),
            // The lock held since the fence: nothing ended the term.
            FenceKind::RowLock => true,
        };
        if self.bug(Bug::LockFreeFence) || checked {
            let row = &s.db.row;
            n.db.stale_claim |= s.db.last_claim.is_some_and(|last| token < last);
            n.db.claim_while_paused |= row.paused;
            n.db.last_claim = Some(token);
            n.claim_after_end |= row.token != token || row.holder.is_none() || row.paused;
            n.claim_after_expiry |= row.expires <= s.now;
        }
        n.drop_claim(r);
        Some(())
    }

    /// `leader_pause`: under the lock, it drains first.
    fn pause(&self, s: &State, n: &mut State) {
        n.statements += 1;
        if !self.bug(Bug::EnderNoKeyUpdate) && !n.drain(self) {
            return;
        }
        if s.lease_live() {
            n.db.row.pause_wait = Some(s.db.row.expires);
        }
        n.db.row.paused = true;
        if !self.bug(Bug::FenceIgnoresPause) {
            n.db.row.holder = None;
            n.db.row.key = None;
        }
    }

    /// The database clock advances, unless a replica must act first.
    fn tick(&self, s: &State, n: &mut State) -> Option<()> {
        // The heartbeat stops the work at its abandon instant: time
        // does not pass it while the replica runs.
        let overdue = (0..self.replicas).any(|r| {
            let replica = &s.replicas[r as usize];
            s.acting(r)
                && replica
                    .term
                    .is_some_and(|h| s.now >= h.last_ack + self.abandon + replica.skew)
        });
        if overdue {
            return None;
        }
        // A told replica acts before the clock moves on (the
        // scheduler's bound); the bugs let it sleep through.
        let woken = s.woken_follower(self);
        let told = s.told_of_pause(self);
        if (woken && !self.bug(Bug::NoKeyWait)) || (told && !self.bug(Bug::NoPauseSignal)) {
            return None;
        }
        n.missed_wakeup |= woken;
        n.missed_pause |= told;
        n.now += 1;
        Some(())
    }

    /// The standby is promoted, losing what it had not received.
    fn promote(&self, s: &State, n: &mut State) {
        n.promotions += 1;
        n.lost_acquire |= s.standby.row.token != s.db.row.token;
        n.db = s.standby.clone();
        n.now = s.now + self.failover;
        for replica in &mut n.replicas {
            // Advisory locks are not replicated; claims in flight
            // were on the old primary.
            replica.session = None;
            replica.claim = None;
        }
        n.lockers = 0;
    }

    /// A fault of one replica's process or session, or its reconnect.
    fn fault(&self, s: &State, n: &mut State, action: Action) {
        match action {
            Action::Freeze(r) => {
                n.faults += 1;
                n.replicas[r as usize].frozen = true;
            }
            Action::Resume(r) => {
                n.faults += 1;
                n.replicas[r as usize].frozen = false;
            }
            Action::Die(r) => {
                n.faults += 1;
                n.drop_claim(r);
                n.replicas[r as usize] = Replica {
                    alive: false,
                    frozen: false,
                    session: None,
                    term: None,
                    claim: None,
                    skew: s.replicas[r as usize].skew,
                };
            }
            Action::DropSession(r) => {
                n.faults += 1;
                n.replicas[r as usize].session = None;
            }
            Action::Reconnect(r) => {
                n.replicas[r as usize].session = Some(s.sessions);
                n.sessions += 1;
            }
            _ => unreachable!("not a fault: {action:?}"),
        }
    }
}
