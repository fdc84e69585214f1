//! Prometheus metrics, registered into a registry the application passes in
//! (no globals). Give the registry a prefix (`Registry::with_prefix("myapp")`)
//! and the names below read `<prefix>_leader_…`; the shipped alert rules
//! then need the same prefix: [`alert_rules`]`("myapp")` (and
//! [`alert_rule_tests`] for promtool), or `ticklease alerts --prefix myapp`.
//!
//! Two kinds of series:
//! - **cluster facts**, read from `leader_leases` on each scrape by any replica
//!   ([`Metrics::refresh`]): `leader_last_tick_age_seconds{role}` (never
//!   negative), `leader_last_tick_state{role,state}` with state `ok`,
//!   `never_ran` or `error` (the age series is absent in the latter two, never
//!   a stale or sentinel value), `leader_paused{role}`, `leader_held{role}`
//!   (a live term holds it, on any replica), `leader_long_lived{role}` (its
//!   work runs for the whole term: healthy while held; see
//!   [`Schedule::long_lived`](crate::Schedule::long_lived)),
//!   `leader_last_term_failed{role}` (its last ended term failed or panicked,
//!   none completed since), `leader_tick_interval_seconds{role}` once a term
//!   of an interval role recorded it, and for cron roles
//!   `leader_occurrence_next_seconds{role}` (until the next occurrence to run,
//!   0 once due) and `leader_occurrence_late_seconds{role}` (how long it has
//!   been due with no term running it; the `TickleaseOccurrenceLate` alert);
//!   `leader_synchronous_waiting` and `leader_synchronous_wait_seconds`: the
//!   statements of the replica's login that wait for a synchronous standby to
//!   confirm their commit, and the longest wait (the
//!   `TickleaseSynchronousStandbyStalled` alert; with `pg_read_all_stats`,
//!   every login's);
//! - **this replica**: `leader_is_leader{role}`, `leader_ticks_total{role,outcome}`,
//!   `leader_lease_lost_total{role,reason}` (reason `taken_over`, `paused`,
//!   `released`, `heartbeat_timeout`, `superseded` when the term was lost, `panicked` or
//!   `failed` when the work panicked or returned `Err`; its `panicked` series exists at 0
//!   from the start for every declared role, so the first panic after a start
//!   is an increase an alert sees), `leader_tick_duration_seconds{role}`,
//!   `leader_renew_duration_seconds`, `leader_db_clock_drift_seconds`,
//!   `leader_tick_interval_seconds{role}` (what the stall alert compares with),
//!   `leader_coordination_up` (its coordination session, as of its last poll),
//!   `leader_host_changes_total` (new connections that reached another host of
//!   the store's URL than the one before: a failover or switchover) and
//!   `leader_connections_lost_total` (its store's connections that ended with an
//!   error), both as of the last scrape,
//!   and `leader_occurrences_skipped_total{role,reason}` (reason `deadline`,
//!   `paused` or `catch_up`: occurrences it recorded passed over when it started a later one;
//!   the history's fourth reason, `overtaken`, an occurrence whose holder died mid-run, is
//!   written by the database at the takeover and read there, not counted here).
//!
//! Any app login can create role rows (`leader_seed`, an ACQUIRE of any
//! name), so no read here is bounded by the rows: a replica's refresh reads
//! its declared roles (and its families' keys) **by name**, whatever the
//! table holds, so no row any login adds pushes one of them out or slows
//! its read; an exporter following the rows ([`Metrics::register_following_rows`],
//! `ticklease metrics` without `--roles`) reads at most [`REFRESH_ROWS_MAX`]
//! of them by index (paused first, then by role; counted up to
//! [`STATUS_COUNTED_MAX`](crate::STATUS_COUNTED_MAX)) and exports
//! `leader_status_rows_left_out` (those it did not export: the
//! `TickleaseRolesLeftOut` alert). `leader_status_unreadable` (1 when the
//! last refresh could not read) exists at 0 from the start, so a read that
//! cannot finish pages (`TickleaseStatusUnreadable`) even before any role
//! series exists; a declared role then shows `state="error"`. The status
//! page renders at most [`PAGE_ROLES_MAX`] roles and says how many it left out.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

use crate::error::StoreError;
pub use crate::ops::alerts::{alert_rule_tests, alert_rules, DEFAULT_PREFIX};
pub(crate) use crate::ops::outcome::{LostReason, TickOutcome};
use crate::store::{LeaseStatus, LeaseStore};
use crate::term::role::Role;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RoleLabel {
    role: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabels {
    role: String,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    role: String,
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    role: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FamilyLabel {
    family: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FamilyOutcomeLabels {
    family: String,
    outcome: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct FamilyReasonLabels {
    family: String,
    reason: &'static str,
}

fn family_label(family: &str) -> FamilyLabel {
    FamilyLabel {
        family: family.to_string(),
    }
}

type FloatGauge = Gauge<f64, AtomicU64>;

struct Inner {
    roles: Vec<Role>,
    /// Follows the rows instead of declared roles ([`Metrics::register_following_rows`]):
    /// at most this many, and the roles of the last refresh.
    following: Option<(usize, std::sync::Mutex<Vec<Role>>)>,
    last_tick_age: Family<RoleLabel, FloatGauge>,
    last_tick_state: Family<StateLabels, Gauge>,
    paused: Family<RoleLabel, Gauge>,
    held: Family<RoleLabel, Gauge>,
    long_lived: Family<RoleLabel, Gauge>,
    last_term_failed: Family<RoleLabel, Gauge>,
    interval: Family<RoleLabel, FloatGauge>,
    is_leader: Family<RoleLabel, Gauge>,
    ticks: Family<OutcomeLabels, Counter>,
    lease_lost: Family<ReasonLabels, Counter>,
    tick_duration: Family<RoleLabel, Histogram>,
    renew_duration: Histogram,
    drift: FloatGauge,
    token_lead: FloatGauge,
    /// Absent without a coordination session: a family with no labels.
    coordination_up: Family<Vec<(String, String)>, Gauge>,
    /// Absent for a store without connections: no labels.
    host_changes: Family<Vec<(String, String)>, Counter>,
    connections_lost: Family<Vec<(String, String)>, Counter>,
    /// The store's counts at the last refresh (the counters add the rest).
    connection_events_seen: std::sync::Mutex<crate::connect::hosts::ConnectionEvents>,
    /// The role families this replica runs, for their aggregates.
    families: std::sync::Mutex<Vec<crate::Family>>,
    family_leading: Family<FamilyLabel, Gauge>,
    family_ticks: Family<FamilyOutcomeLabels, Counter>,
    family_lost: Family<FamilyReasonLabels, Counter>,
    family_interval: Family<FamilyLabel, FloatGauge>,
    family_age_max: Family<FamilyLabel, FloatGauge>,
    family_never_ran: Family<FamilyLabel, Gauge>,
    family_paused: Family<FamilyLabel, Gauge>,
    occurrence_next: Family<RoleLabel, FloatGauge>,
    occurrence_late: Family<RoleLabel, FloatGauge>,
    occurrences_skipped: Family<ReasonLabels, Counter>,
    rows_left_out: Gauge,
    status_unreadable: Gauge,
    synchronous_waiting: Gauge,
    synchronous_wait: FloatGauge,
}

/// Most rows of `leader_leases` one refresh of the cluster facts reads.
pub const REFRESH_ROWS_MAX: usize = 10_000;
/// Most roles the status page renders.
pub const PAGE_ROLES_MAX: usize = 500;

/// The metric handles. Cheap to clone.
#[derive(Clone)]
pub struct Metrics {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Metrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Metrics")
            .field("roles", &self.inner.roles)
            .finish()
    }
}

fn tick_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.01, 4.0, 10))
}

fn label(role: &Role) -> RoleLabel {
    RoleLabel {
        role: role.to_string(),
    }
}

const STATES: [&str; 3] = ["ok", "never_ran", "error"];

/// The largest token minus the database clock in ms, in seconds: tokens are
/// seeded from the clock, so a positive lead is how far they ran ahead of it.
fn token_lead_seconds(rows: &[LeaseStatus]) -> Option<f64> {
    let db_now = rows.first()?.db_now;
    let now_ms = db_now.duration_since(std::time::UNIX_EPOCH).ok()?.as_millis() as i64;
    let max = rows.iter().map(|r| r.token.get()).max()?;
    Some((max - now_ms) as f64 / 1000.0)
}

impl Inner {
    fn register_into(&self, r: &mut Registry) {
        r.register(
            "leader_status_rows_left_out",
            "Rows of leader_leases an exporter following the rows did not export (it reads at most \
             the rows it was given, 1,000 for ticklease metrics, never over 10,000, and counts up to \
             100,000; cluster fact)",
            self.rows_left_out.clone(),
        );
        r.register(
            "leader_status_unreadable",
            "1 when this replica's last refresh of the cluster facts could not read leader_leases \
             (exists at 0 from the start)",
            self.status_unreadable.clone(),
        );
        r.register(
            "leader_synchronous_waiting",
            "Statements of this replica's database login that wait now for a synchronous standby to \
             confirm their commit (cluster fact, as far as the login sees)",
            self.synchronous_waiting.clone(),
        );
        r.register(
            "leader_synchronous_wait_seconds",
            "The longest of those waits so far, 0 when none waits: a standby that stopped confirming \
             holds every commit (the TickleaseSynchronousStandbyStalled alert)",
            self.synchronous_wait.clone(),
        );
        r.register(
            "leader_last_tick_age_seconds",
            "Seconds since the role's last completed tick (cluster fact; absent unless state=ok)",
            self.last_tick_age.clone(),
        );
        r.register(
            "leader_last_tick_state",
            "1 for the current state of the last-tick fact: ok, never_ran or error",
            self.last_tick_state.clone(),
        );
        r.register(
            "leader_paused",
            "1 while an operator has paused the role",
            self.paused.clone(),
        );
        r.register(
            "leader_held",
            "1 while a live term holds the role, on any replica (cluster fact)",
            self.held.clone(),
        );
        r.register(
            "leader_long_lived",
            "1 when the role is long-lived: its work runs for the whole term, so it is healthy while \
             held (cluster fact: as the replica that started its last term declared it)",
            self.long_lived.clone(),
        );
        r.register(
            "leader_last_term_failed",
            "1 while the role's last ended term failed or panicked: no term completed since \
             (cluster fact)",
            self.last_term_failed.clone(),
        );
        r.register(
            "leader_tick_interval_seconds",
            "The role's tick interval (from replicas running it, and as a cluster fact from the \
             database once a term of it started; absent on a cron schedule)",
            self.interval.clone(),
        );
        r.register(
            "leader_is_leader",
            "1 while this replica runs a tick of the role",
            self.is_leader.clone(),
        );
        r.register(
            "leader_ticks",
            "Ticks this replica ran, by outcome",
            self.ticks.clone(),
        );
        r.register(
            "leader_lease_lost",
            "Ticks that ended without completing, by reason",
            self.lease_lost.clone(),
        );
        r.register(
            "leader_tick_duration_seconds",
            "Tick durations",
            self.tick_duration.clone(),
        );
        r.register(
            "leader_renew_duration_seconds",
            "RENEW round trips",
            self.renew_duration.clone(),
        );
        r.register(
            "leader_db_clock_drift_seconds",
            "Database clock minus this replica's clock, as last observed",
            self.drift.clone(),
        );
        r.register(
            "leader_token_lead_seconds",
            "Largest token minus the database clock in ms, as seconds (cluster fact): a failover that \
             loses commits keeps tokens unique while it lasts longer than this",
            self.token_lead.clone(),
        );
        r.register(
            "leader_coordination_up",
            "1 while this replica's coordination session is up, 0 while it reconnects (absent \
             without one): while down, a dead holder is replaced only when its lease runs out",
            self.coordination_up.clone(),
        );
        r.register(
            "leader_host_changes",
            "Times a new database connection of this replica reached another host of its URL than \
             the one before: a failover or switchover (absent for a store without hosts)",
            self.host_changes.clone(),
        );
        r.register(
            "leader_connections_lost",
            "Database connections of this replica's store that ended with an error (a restart, a \
             failover, a cut link); each is made again at the next statement",
            self.connections_lost.clone(),
        );
        r.register(
            "leader_family_leading",
            "Terms of the family's keys this replica runs",
            self.family_leading.clone(),
        );
        r.register(
            "leader_family_ticks",
            "Ticks of the family's keys this replica ran, by outcome",
            self.family_ticks.clone(),
        );
        r.register(
            "leader_family_lease_lost",
            "Ticks of the family's keys that ended without completing, by reason",
            self.family_lost.clone(),
        );
        r.register(
            "leader_family_tick_interval_seconds",
            "The family's tick interval",
            self.family_interval.clone(),
        );
        r.register(
            "leader_family_last_tick_age_max_seconds",
            "Seconds since the last completed tick of the family's key that waited longest, among \
             keys that ever completed one (cluster fact)",
            self.family_age_max.clone(),
        );
        r.register(
            "leader_family_never_ran",
            "The family's keys with no completed tick yet (cluster fact)",
            self.family_never_ran.clone(),
        );
        r.register(
            "leader_occurrence_next_seconds",
            "Seconds until the next occurrence of the role's cron schedule to run, 0 once it is due \
             (cluster fact; absent for interval roles and before a first occurrence is known)",
            self.occurrence_next.clone(),
        );
        r.register(
            "leader_occurrence_late_seconds",
            "Seconds since the next occurrence to run came due with no term running it: a failed \
             one awaiting its retry, or one no replica started (cluster fact; 0 when on time)",
            self.occurrence_late.clone(),
        );
        r.register(
            "leader_occurrences_skipped",
            "Occurrences this replica recorded as skipped when it started a later one, by reason \
             (deadline, paused, catch_up)",
            self.occurrences_skipped.clone(),
        );
        r.register(
            "leader_family_paused",
            "The family's keys an operator has paused (cluster fact)",
            self.family_paused.clone(),
        );
    }
}

impl Metrics {
    /// Registers every metric for `roles` into `registry`. With a prefixed
    /// registry (`Registry::with_prefix("myapp")`) alert with
    /// [`alert_rules`]`("myapp")`: the shipped rules name `ticklease_leader_…`.
    pub fn register(registry: &mut Registry, roles: impl IntoIterator<Item = Role>) -> Metrics {
        let inner = Inner {
            roles: roles.into_iter().collect(),
            following: None,
            last_tick_age: Family::default(),
            last_tick_state: Family::default(),
            paused: Family::default(),
            held: Family::default(),
            long_lived: Family::default(),
            last_term_failed: Family::default(),
            interval: Family::default(),
            is_leader: Family::default(),
            ticks: Family::default(),
            lease_lost: Family::default(),
            tick_duration: Family::new_with_constructor(tick_buckets),
            renew_duration: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            drift: FloatGauge::default(),
            token_lead: FloatGauge::default(),
            coordination_up: Family::default(),
            host_changes: Family::default(),
            connections_lost: Family::default(),
            connection_events_seen: Default::default(),
            families: Default::default(),
            family_leading: Family::default(),
            family_ticks: Family::default(),
            family_lost: Family::default(),
            family_interval: Family::default(),
            family_age_max: Family::default(),
            family_never_ran: Family::default(),
            family_paused: Family::default(),
            occurrence_next: Family::default(),
            occurrence_late: Family::default(),
            occurrences_skipped: Family::default(),
            rows_left_out: Gauge::default(),
            status_unreadable: Gauge::default(),
            synchronous_waiting: Gauge::default(),
            synchronous_wait: FloatGauge::default(),
        };
        inner.register_into(registry);
        for role in &inner.roles {
            // Exists at 0 from the start: the first panic is then an increase.
            drop(inner.lease_lost.get_or_create(&ReasonLabels {
                role: role.to_string(),
                reason: "panicked",
            }));
            inner.is_leader.get_or_create(&label(role)).set(0);
        }
        Metrics {
            inner: Arc::new(inner),
        }
    }

    /// Registers the cluster facts of the roles in `leader_leases`, at most
    /// `roles_max` of them: a role once exported stays exported until its
    /// row is gone (a forgotten role drops out), and a role created later is
    /// added at the next refresh while there is room. A fresh start exports
    /// the first rows it reads (paused first, then by role), so rows any app
    /// login created may take the room of a role of yours: name your roles
    /// ([`Metrics::register`], `ticklease metrics --roles`) for alerts no
    /// login can blind. `leader_status_rows_left_out` counts the roles not
    /// exported (the `TickleaseRolesLeftOut` alert). For an exporter that
    /// leads no role (`ticklease metrics`).
    pub fn register_following_rows(registry: &mut Registry, roles_max: usize) -> Metrics {
        let mut metrics = Metrics::register(registry, []);
        Arc::get_mut(&mut metrics.inner)
            .expect("not shared yet")
            .following = Some((roles_max.min(REFRESH_ROWS_MAX), Default::default()));
        metrics
    }

    /// The roles a refresh exports: the declared ones, or the followed ones
    /// ([`Metrics::register_following_rows`]) given the rows read and
    /// whether they are all the table's (only then is a missing row gone).
    fn roles_of(&self, rows: Option<(&[LeaseStatus], bool)>) -> Vec<Role> {
        let Some((roles_max, following)) = &self.inner.following else {
            return self.inner.roles.clone();
        };
        let mut followed = following.lock().expect("not poisoned");
        if let Some((rows, all)) = rows {
            let names: std::collections::HashSet<&str> = rows.iter().map(|s| s.role.as_str()).collect();
            if all {
                for gone in followed.iter().filter(|r| !names.contains(r.as_str())) {
                    self.drop_role(gone);
                }
                followed.retain(|r| names.contains(r.as_str()));
            }
            let mut have: std::collections::HashSet<String> =
                followed.iter().map(|r| r.to_string()).collect();
            for row in rows {
                if followed.len() >= *roles_max {
                    break;
                }
                if let Ok(role) = Role::new(row.role.as_str()) {
                    if have.insert(role.to_string()) {
                        followed.push(role);
                    }
                }
            }
        }
        followed.clone()
    }

    /// Removes every cluster fact of `role`.
    fn drop_role(&self, role: &Role) {
        let inner = &self.inner;
        for family in [
            &inner.paused,
            &inner.held,
            &inner.long_lived,
            &inner.last_term_failed,
        ] {
            family.remove(&label(role));
        }
        for family in [
            &inner.last_tick_age,
            &inner.interval,
            &inner.occurrence_next,
            &inner.occurrence_late,
        ] {
            family.remove(&label(role));
        }
        for state in STATES {
            inner.last_tick_state.remove(&StateLabels {
                role: role.to_string(),
                state,
            });
        }
    }

    /// Reads the cluster facts from the store. A failure is exported as
    /// `state="error"` and `leader_status_unreadable 1`, never as a value.
    /// Declared roles (and the keys of the families this replica runs) are
    /// read by name, so the read costs what they are, whatever rows any
    /// login added; an exporter following the rows reads a bounded part.
    pub async fn refresh<S: LeaseStore>(&self, store: &S) {
        if let Some(events) = store.connection_events() {
            self.connection_events(events);
        }
        let read = match &self.inner.following {
            None => store.status_of(&self.names_read()).await.map(|rows| (rows, None)),
            Some(_) => store
                .status_bounded(REFRESH_ROWS_MAX)
                .await
                .map(|(rows, total)| (rows, Some(total))),
        };
        self.inner.status_unreadable.set(i64::from(read.is_err()));
        match read {
            Ok((rows, total)) => self.refreshed(&rows, total),
            Err(error) => self.unreadable(&error),
        }
        // Unread is none: a stale wait would page on; an unreadable store
        // pages as TickleaseStatusUnreadable.
        let waits = store.synchronous_waits().await.ok().flatten();
        self.inner
            .synchronous_waiting
            .set(waits.map_or(0, |w| i64::try_from(w.waiting).unwrap_or(i64::MAX)));
        self.inner
            .synchronous_wait
            .set(waits.map_or(0.0, |w| w.longest.as_secs_f64()));
    }

    /// The roles a refresh of declared roles reads: those and every key of
    /// the families this replica runs.
    fn names_read(&self) -> Vec<Role> {
        let mut names = self.inner.roles.clone();
        for family in self.families() {
            names.extend(family.key_list().iter().filter_map(|key| family.role(key).ok()));
        }
        names
    }

    /// The facts from the rows read; `total`: the table's rows (counted up to
    /// a bound) when the rows read are a bounded part of it, `None` when they
    /// are every declared role's.
    fn refreshed(&self, rows: &[LeaseStatus], total: Option<u64>) {
        let inner = &self.inner;
        let left_out = total.map_or(0, |t| t.saturating_sub(rows.len() as u64));
        let roles = self.roles_of(Some((rows, left_out == 0)));
        // Following rows, the roles not exported are left out too.
        let not_exported = match total {
            Some(total) => total.saturating_sub(roles.len() as u64),
            None => 0,
        };
        inner
            .rows_left_out
            .set(i64::try_from(not_exported).unwrap_or(i64::MAX));
        if let Some(lead) = token_lead_seconds(rows) {
            inner.token_lead.set(lead);
        }
        let by_role: std::collections::HashMap<&str, &LeaseStatus> =
            rows.iter().map(|s| (s.role.as_str(), s)).collect();
        for role in &roles {
            let row = by_role.get(role.as_str()).copied();
            if row.is_none() && left_out > 0 {
                // Its row may exist among those not read: unknown, not never ran.
                self.unknown_role(role);
                continue;
            }
            self.refresh_role(role, row);
        }
        for family in self.families() {
            self.refresh_family(&family, rows);
        }
    }

    /// No row could be read: every fact is unknown.
    fn unreadable(&self, error: &StoreError) {
        tracing::warn!(
            error = error as &dyn std::error::Error,
            "could not read leader_leases for metrics"
        );
        for family in self.families() {
            let label = family_label(family.name());
            self.inner.family_age_max.remove(&label);
            self.inner.family_never_ran.remove(&label);
            self.inner.family_paused.remove(&label);
        }
        for role in &self.roles_of(None) {
            self.unknown_role(role);
        }
    }

    /// One role's cluster facts from its row (none: never seen).
    fn refresh_role(&self, role: &Role, row: Option<&LeaseStatus>) {
        let inner = &self.inner;
        let age = row.and_then(|s| {
            s.last_tick_ended_at
                .map(|t| s.db_now.duration_since(t).unwrap_or_default())
        });
        match age {
            Some(age) => {
                inner
                    .last_tick_age
                    .get_or_create(&label(role))
                    .set(age.as_secs_f64());
                self.state(role, "ok");
            }
            None => {
                inner.last_tick_age.remove(&label(role));
                self.state(role, "never_ran");
            }
        }
        let flag = |family: &Family<RoleLabel, Gauge>, on: bool| {
            family.get_or_create(&label(role)).set(i64::from(on))
        };
        flag(&inner.paused, row.is_some_and(|s| s.paused_at.is_some()));
        flag(&inner.held, row.is_some_and(|s| s.held));
        flag(&inner.long_lived, row.is_some_and(|s| s.long_lived));
        let failed = row.is_some_and(|s| matches!(s.last_outcome.as_deref(), Some("failed" | "panicked")));
        flag(&inner.last_term_failed, failed);
        match row {
            Some(LeaseStatus {
                tick_interval: Some(every),
                ..
            }) => {
                inner
                    .interval
                    .get_or_create(&label(role))
                    .set(every.as_secs_f64());
            }
            // A role on a cron schedule now has no interval.
            Some(s) if s.schedule.is_some() => {
                inner.interval.remove(&label(role));
            }
            _ => {}
        }
        self.refresh_occurrence(role, row);
    }

    /// A role whose row could not be read: its facts are absent (never a
    /// stale value) and its state is `error`.
    fn unknown_role(&self, role: &Role) {
        let inner = &self.inner;
        for family in [
            &inner.paused,
            &inner.held,
            &inner.long_lived,
            &inner.last_term_failed,
        ] {
            family.remove(&label(role));
        }
        inner.last_tick_age.remove(&label(role));
        self.refresh_occurrence(role, None);
        self.state(role, "error");
    }

    /// The next occurrence's distance from the database clock, either way.
    fn refresh_occurrence(&self, role: &Role, row: Option<&LeaseStatus>) {
        let inner = &self.inner;
        match row.and_then(|r| r.next_occurrence.map(|next| (next, r.db_now))) {
            Some((next, now)) => {
                let until = next.duration_since(now).unwrap_or_default();
                let late = now.duration_since(next).unwrap_or_default();
                inner
                    .occurrence_next
                    .get_or_create(&label(role))
                    .set(until.as_secs_f64());
                inner
                    .occurrence_late
                    .get_or_create(&label(role))
                    .set(late.as_secs_f64());
            }
            None => {
                inner.occurrence_next.remove(&label(role));
                inner.occurrence_late.remove(&label(role));
            }
        }
    }

    pub(crate) fn skipped(&self, role: &Role, skipped: &[crate::Skipped]) {
        for s in skipped {
            self.inner
                .occurrences_skipped
                .get_or_create(&ReasonLabels {
                    role: role.to_string(),
                    reason: s.reason.as_str(),
                })
                .inc_by(u64::from(s.count));
        }
    }

    fn families(&self) -> Vec<crate::Family> {
        self.inner.families.lock().expect("not poisoned").clone()
    }

    /// A family's cluster facts over its current keys (a removed key's row
    /// stays in the table, and must not look stalled).
    fn refresh_family(&self, family: &crate::Family, rows: &[LeaseStatus]) {
        let keys = family.key_list();
        let prefix = format!("{}:", family.name());
        let (mut age_max, mut never_ran, mut paused) = (None::<Duration>, keys.len(), 0);
        for row in rows {
            let Some(key) = row.role.strip_prefix(&prefix) else {
                continue;
            };
            if keys.binary_search_by(|k| k.as_str().cmp(key)).is_err() {
                continue;
            }
            if let Some(ended) = row.last_tick_ended_at {
                never_ran -= 1;
                let age = row.db_now.duration_since(ended).unwrap_or_default();
                age_max = Some(age_max.map_or(age, |m| m.max(age)));
            }
            paused += usize::from(row.paused_at.is_some());
        }
        let label = family_label(family.name());
        match age_max {
            Some(age) => {
                self.inner
                    .family_age_max
                    .get_or_create(&label)
                    .set(age.as_secs_f64());
            }
            None => {
                self.inner.family_age_max.remove(&label);
            }
        }
        let count = |n: usize| i64::try_from(n).unwrap_or(i64::MAX);
        self.inner
            .family_never_ran
            .get_or_create(&label)
            .set(count(never_ran));
        self.inner.family_paused.get_or_create(&label).set(count(paused));
    }

    /// Exports `family`'s aggregates (the scheduler calls this for each family it runs).
    pub(crate) fn family(&self, family: &crate::Family, interval: Option<Duration>) {
        let label = family_label(family.name());
        // A cron family has no interval for the stall alert to compare with.
        if let Some(interval) = interval {
            self.inner
                .family_interval
                .get_or_create(&label)
                .set(interval.as_secs_f64());
        }
        self.inner.family_leading.get_or_create(&label).set(0);
        // Exists at 0 from the start: the first panic is then an increase.
        drop(self.inner.family_lost.get_or_create(&FamilyReasonLabels {
            family: family.name().to_string(),
            reason: "panicked",
        }));
        let mut families = self.inner.families.lock().expect("not poisoned");
        if !families.iter().any(|f| f.name() == family.name()) {
            families.push(family.clone());
        }
    }

    pub(crate) fn family_leading(&self, family: &str, leading: bool) {
        let gauge = self.inner.family_leading.get_or_create(&family_label(family));
        if leading {
            gauge.inc();
        } else {
            gauge.dec();
        }
    }

    pub(crate) fn family_tick_ended(&self, family: &str, outcome: TickOutcome, lost: Option<LostReason>) {
        self.inner
            .family_ticks
            .get_or_create(&FamilyOutcomeLabels {
                family: family.to_string(),
                outcome: outcome.as_str(),
            })
            .inc();
        if let Some(reason) = lost {
            self.inner
                .family_lost
                .get_or_create(&FamilyReasonLabels {
                    family: family.to_string(),
                    reason: reason.as_str(),
                })
                .inc();
        }
    }

    fn state(&self, role: &Role, state: &'static str) {
        for s in STATES {
            let labels = StateLabels {
                role: role.to_string(),
                state: s,
            };
            self.inner
                .last_tick_state
                .get_or_create(&labels)
                .set(i64::from(s == state));
        }
    }

    pub(crate) fn interval(&self, role: &Role, interval: Duration) {
        self.inner
            .interval
            .get_or_create(&label(role))
            .set(interval.as_secs_f64());
    }

    pub(crate) fn leading(&self, role: &Role, leading: bool) {
        self.inner
            .is_leader
            .get_or_create(&label(role))
            .set(i64::from(leading));
    }

    pub(crate) fn tick_ended(
        &self,
        role: &Role,
        outcome: TickOutcome,
        took: Duration,
        lost: Option<LostReason>,
    ) {
        let inner = &self.inner;
        inner
            .ticks
            .get_or_create(&OutcomeLabels {
                role: role.to_string(),
                outcome: outcome.as_str(),
            })
            .inc();
        inner
            .tick_duration
            .get_or_create(&label(role))
            .observe(took.as_secs_f64());
        if let Some(reason) = lost {
            inner
                .lease_lost
                .get_or_create(&ReasonLabels {
                    role: role.to_string(),
                    reason: reason.as_str(),
                })
                .inc();
        }
    }

    pub(crate) fn renewed(&self, took: Duration) {
        self.inner.renew_duration.observe(took.as_secs_f64());
    }

    pub(crate) fn drift(&self, seconds: f64) {
        self.inner.drift.set(seconds);
    }

    /// The store's connection events so far (see [`LeaseStore::connection_events`]).
    pub(crate) fn connection_events(&self, now: crate::connect::hosts::ConnectionEvents) {
        let before = std::mem::replace(
            &mut *self.inner.connection_events_seen.lock().expect("not poisoned"),
            now,
        );
        let no_labels = Vec::new();
        self.inner
            .host_changes
            .get_or_create(&no_labels)
            .inc_by(now.host_changes.saturating_sub(before.host_changes));
        self.inner
            .connections_lost
            .get_or_create(&no_labels)
            .inc_by(now.connections_lost.saturating_sub(before.connections_lost));
    }

    pub(crate) fn coordination_up(&self, up: bool) {
        self.inner
            .coordination_up
            .get_or_create(&Vec::new())
            .set(i64::from(up));
    }
}

/// Scrapes read the store at most this often; in between they serve the last snapshot.
#[cfg(feature = "http")]
pub const SCRAPE_REFRESH_MIN: Duration = Duration::from_secs(1);
/// Scrapes served at once; more are answered 503 at once.
#[cfg(feature = "http")]
pub const SCRAPES_MAX: usize = 16;
/// Status page loads served at once (apart from the scrapes'); more are answered 503.
#[cfg(feature = "http")]
pub const PAGES_MAX: usize = 4;

/// The routes `/metrics` (the registry in OpenMetrics text), `/healthz` and the
/// read-only status page `/` (`?hours=N`, 1..=168, default 6, rounded up to
/// 1, 2, 3, 6, 12, 24, 48, 72 or 168; each window's page kept a second). The page shows holder ids, pause
/// reasons and error summaries to whoever reaches this address: bind it
/// where the metrics are private. The cluster facts are refreshed from `store` by at most one
/// scrape at a time and at most once per [`SCRAPE_REFRESH_MIN`], so a flood of
/// scrapes costs the store one STATUS statement a second; at most
/// [`SCRAPES_MAX`] scrapes and page loads run at once. Give it a store of
/// its own (a pool of one) so those statements never queue before a RENEW.
///
/// Mount it under a path of the application's own router,
/// `app.nest_service("/ops", router(…))` (any state; `merge` at the root
/// panics at startup when the app has its own `/` or `/healthz`). It shows
/// holder ids, pause reasons and error summaries: mount it where the
/// metrics are private, not on a public port. The slots, the page cache and
/// the refresh limit belong to one `router` call: clone that router rather
/// than calling `router` again. [`serve`] is the same on a port of its own.
#[cfg(feature = "http")]
pub fn router<S: LeaseStore + crate::ops::history::HistoryStore + Clone>(
    registry: Arc<Registry>,
    metrics: Metrics,
    store: S,
) -> axum::Router {
    use axum::routing::get;
    axum::Router::new()
        .route("/", page_route(store.clone()))
        .route("/metrics", scrape_route(registry, metrics, store))
        .route("/healthz", get(|| async { "ok\n" }))
}

/// [`router`] on `listener` until `shutdown`.
#[cfg(feature = "http")]
pub async fn serve<S: LeaseStore + crate::ops::history::HistoryStore + Clone>(
    listener: tokio::net::TcpListener,
    registry: Arc<Registry>,
    metrics: Metrics,
    store: S,
    shutdown: tokio_util::sync::CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router(registry, metrics, store))
        .with_graceful_shutdown(shutdown.cancelled_owned())
        .await
}

/// The status page, its load slots and each window's cached page.
#[cfg(feature = "http")]
fn page_route<S: LeaseStore + crate::ops::history::HistoryStore + Clone>(
    store: S,
) -> axum::routing::MethodRouter {
    use axum::http::header::CONTENT_TYPE;
    use axum::http::StatusCode;
    // The page has slots of its own (a loop of page loads never starves
    // /metrics) and keeps each window's page for a second: one page load
    // at a time reads the store, the others wait for its result.
    let pages = Arc::new(tokio::sync::Semaphore::new(PAGES_MAX));
    type Cached = Option<(tokio::time::Instant, String)>;
    let cache: Arc<tokio::sync::Mutex<[Cached; crate::ops::page::WINDOWS_HOURS.len()]>> = Arc::default();
    let page = {
        move |axum::extract::RawQuery(query): axum::extract::RawQuery| {
            let (store, pages, cache) = (store.clone(), pages.clone(), cache.clone());
            async move {
                let headers = |kind: &'static str| {
                    [
                        (CONTENT_TYPE, kind),
                        (axum::http::header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                        (
                            axum::http::header::CONTENT_SECURITY_POLICY,
                            "default-src 'none'; style-src 'unsafe-inline'",
                        ),
                    ]
                };
                let text = "text/plain; charset=utf-8";
                let Ok(_slot) = pages.try_acquire_owned() else {
                    return (
                        StatusCode::SERVICE_UNAVAILABLE,
                        headers(text),
                        "too many page loads at once\n".to_string(),
                    );
                };
                let hours = match query
                    .as_deref()
                    .into_iter()
                    .flat_map(|q| q.split('&'))
                    .find_map(|pair| pair.strip_prefix("hours="))
                {
                    None => Some(crate::ops::page::HOURS_DEFAULT),
                    Some(n) => n.parse().ok(),
                };
                let Some((slot, hours)) = hours.and_then(crate::ops::page::window_of) else {
                    return (
                        StatusCode::BAD_REQUEST,
                        headers(text),
                        "hours must be within 1..=168\n".to_string(),
                    );
                };
                let mut cached = cache.lock().await;
                if let Some((at, body)) = cached[slot].as_ref() {
                    if at.elapsed() < SCRAPE_REFRESH_MIN {
                        return (StatusCode::OK, headers("text/html; charset=utf-8"), body.clone());
                    }
                }
                let window = Duration::from_secs(hours * 3600);
                let read = async {
                    let (rows, total) = store.status_bounded(PAGE_ROLES_MAX).await?;
                    let slices = store.timeline(window, crate::ops::page::BUCKETS).await?;
                    let events = store.notable(window, crate::ops::page::EVENTS_MAX).await?;
                    Ok::<_, crate::error::StoreError>((rows, total, slices, events))
                };
                match read.await {
                    Ok((rows, total, slices, events)) => {
                        let now = rows.first().map_or_else(std::time::SystemTime::now, |r| r.db_now);
                        let body = crate::ops::page::render(&rows, total, &slices, &events, now, window);
                        cached[slot] = Some((tokio::time::Instant::now(), body.clone()));
                        (StatusCode::OK, headers("text/html; charset=utf-8"), body)
                    }
                    Err(error) => (
                        StatusCode::SERVICE_UNAVAILABLE,
                        headers(text),
                        format!(
                            "could not read the lease tables: {}\n",
                            crate::error::chain(&error)
                        ),
                    ),
                }
            }
        }
    };
    axum::routing::get(page)
}

/// One refresh of the cluster facts at a time, shared: a scrape that arrives
/// while one runs waits for it and serves its result (16 scrapes during a
/// refresh of 2 s cost one refresh, not 16 one after another), and one
/// that arrives within [`SCRAPE_REFRESH_MIN`] of the last start serves the
/// last snapshot.
#[cfg(feature = "http")]
#[derive(Default)]
struct SharedRefresh {
    /// When the last refresh started.
    started: tokio::sync::Mutex<Option<tokio::time::Instant>>,
    /// Refreshes finished (or abandoned) so far.
    finished: std::sync::atomic::AtomicU64,
}

#[cfg(feature = "http")]
impl SharedRefresh {
    async fn refresh<S: LeaseStore>(&self, metrics: &Metrics, store: &S) {
        use std::sync::atomic::Ordering::SeqCst;
        let arrived = self.finished.load(SeqCst);
        let mut started = self.started.lock().await;
        if self.finished.load(SeqCst) != arrived {
            // One finished while this scrape waited for the lock: its result is this scrape's.
            return;
        }
        if started.is_some_and(|t| t.elapsed() < SCRAPE_REFRESH_MIN) {
            return;
        }
        // Stamped first: a scraper that hangs up mid-refresh (dropping it)
        // does not earn the next one a refresh; counted however it ends.
        *started = Some(tokio::time::Instant::now());
        let _finished = scopeguard_finish(&self.finished);
        metrics.refresh(store).await;
    }
}

/// Counts a refresh as finished when dropped (it completed, or its scraper hung up).
#[cfg(feature = "http")]
fn scopeguard_finish(finished: &std::sync::atomic::AtomicU64) -> impl Drop + '_ {
    struct Finish<'a>(&'a std::sync::atomic::AtomicU64);
    impl Drop for Finish<'_> {
        fn drop(&mut self) {
            self.0.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }
    }
    Finish(finished)
}

/// `/metrics`: at most one refresh of the cluster facts a second, at most
/// [`SCRAPES_MAX`] scrapes at once.
#[cfg(feature = "http")]
fn scrape_route<S: LeaseStore + Clone>(
    registry: Arc<Registry>,
    metrics: Metrics,
    store: S,
) -> axum::routing::MethodRouter {
    use axum::http::header::CONTENT_TYPE;
    use axum::http::StatusCode;
    let refreshed = Arc::new(SharedRefresh::default());
    let slots = Arc::new(tokio::sync::Semaphore::new(SCRAPES_MAX));
    let scrape = move || {
        let (registry, metrics, store) = (registry.clone(), metrics.clone(), store.clone());
        let (refreshed, slots) = (refreshed.clone(), slots.clone());
        async move {
            let text = |status, body: &str| {
                (
                    status,
                    [(CONTENT_TYPE, "text/plain; charset=utf-8")],
                    body.to_string(),
                )
            };
            let Ok(_slot) = slots.try_acquire_owned() else {
                return text(StatusCode::SERVICE_UNAVAILABLE, "too many scrapes at once\n");
            };
            refreshed.refresh(&metrics, &store).await;
            let mut body = String::new();
            match prometheus_client::encoding::text::encode(&mut body, &registry) {
                Ok(()) => (
                    StatusCode::OK,
                    [(
                        CONTENT_TYPE,
                        "application/openmetrics-text; version=1.0.0; charset=utf-8",
                    )],
                    body,
                ),
                Err(_) => text(StatusCode::INTERNAL_SERVER_ERROR, "could not encode metrics\n"),
            }
        }
    };
    axum::routing::get(scrape)
}
