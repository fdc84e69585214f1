//! Errors. Normal outcomes (a held lease, a lost term) are values elsewhere;
//! these are failures. Display texts name the value at fault and leave the
//! cause to `source()`.

use std::sync::Arc;
use std::time::Duration;

/// A role name that fails the naming rule.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RoleError {
    /// The name breaks the rule.
    #[error("invalid role name {name:?}: {problem}")]
    Invalid {
        /// The name given.
        name: String,
        /// Which part of the rule it breaks.
        problem: &'static str,
    },
    /// A family name with a key (`tenant_sync:acme` is a role; its family is `tenant_sync`).
    #[error("invalid family name {name:?}: a family is a role name without ':key'")]
    FamilyWithKey {
        /// The name given.
        name: String,
    },
    /// A family would hold more keys than it may.
    #[error("family {family:?} would hold {keys} keys; at most {max}")]
    TooManyKeys {
        /// The family.
        family: String,
        /// How many it would hold.
        keys: usize,
        /// The most it may hold.
        max: usize,
    },
}

/// A `holder_id` that is not `host:pid:nonce`.
#[derive(Debug, thiserror::Error)]
#[error("holder id {text:?} is not host:pid:nonce")]
pub struct HolderIdError {
    /// The text given.
    pub text: String,
}

/// A lease timing configuration that breaks a rule.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    /// A duration is zero.
    #[error("{name} must be greater than zero")]
    Zero {
        /// The setting.
        name: &'static str,
    },
    /// A duration exceeds the limit.
    #[error("{name} = {value:?} exceeds the limit of {max:?}")]
    TooLong {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: Duration,
        /// The limit.
        max: Duration,
    },
    /// A metric name prefix Prometheus would not accept.
    #[error("invalid metric prefix {prefix:?}: use [a-zA-Z_:][a-zA-Z0-9_:]*, at most 100 characters")]
    MetricPrefix {
        /// The prefix given.
        prefix: String,
    },
    /// A duration has a fraction of a millisecond (the statements take ms).
    #[error("{name} = {value:?} is not a whole number of milliseconds")]
    SubMillisecond {
        /// The setting.
        name: &'static str,
        /// Its value.
        value: Duration,
    },
    /// `abandon_after + statement_timeout >= lease_ttl`.
    #[error(
        "abandon_after ({abandon_after:?}) + statement_timeout ({statement_timeout:?}) must be less than \
         lease_ttl ({lease_ttl:?}): a leader must stop before its lease can expire"
    )]
    AbandonTooLate {
        /// The abandon bound.
        abandon_after: Duration,
        /// The statement timeout.
        statement_timeout: Duration,
        /// The lease TTL.
        lease_ttl: Duration,
    },
    /// `heartbeat_every >= abandon_after`.
    #[error("heartbeat_every ({heartbeat_every:?}) must be less than abandon_after ({abandon_after:?})")]
    HeartbeatTooSlow {
        /// The heartbeat period.
        heartbeat_every: Duration,
        /// The abandon bound.
        abandon_after: Duration,
    },
}

/// A lease store statement that failed. A failed RENEW is a missed beat, not a loss.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The statement (or the wait for a connection) ran out of time.
    #[error("{statement} did not answer within {after:?}")]
    Timeout {
        /// The statement.
        statement: &'static str,
        /// Its timeout.
        after: Duration,
    },
    /// No connection could be had.
    #[error("could not get a database connection for {statement}")]
    Connect {
        /// The statement that wanted it.
        statement: &'static str,
        /// The pool's error, boxed: the pool's types are not part of this API.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// The schema is missing or differs.
    #[error("the database is not migrated: {detail} (run `{command}`)")]
    NotMigrated {
        /// What is missing.
        detail: String,
        /// The command that applies the missing migrations.
        command: &'static str,
    },
    /// The role has no row.
    #[error("unknown role {role:?}: no such row in leader_leases")]
    UnknownRole {
        /// The role.
        role: String,
    },
    /// The database role lacks a grant.
    #[error("{statement} was refused: permission denied")]
    PermissionDenied {
        /// The statement.
        statement: &'static str,
        /// The database's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// Any other database error.
    #[error("{statement} failed")]
    Db {
        /// The statement.
        statement: &'static str,
        /// The database's error.
        #[source]
        source: tokio_postgres::Error,
    },
    /// The batched statement that carried this one failed.
    #[error("{statement} failed")]
    Batch {
        /// The batched statement.
        statement: &'static str,
        /// Its error, shared by every statement it carried.
        #[source]
        source: Arc<StoreError>,
    },
    /// Refused before anything was sent.
    #[error("{statement} refused: {problem}")]
    Rejected {
        /// The statement.
        statement: &'static str,
        /// Why.
        problem: &'static str,
    },
    /// The Patroni check could not start ([`crate::PgStore::with_patroni`]).
    #[error("the Patroni check could not start")]
    Patroni {
        /// Why.
        #[source]
        source: PatroniError,
    },
    /// Not sent: Patroni has not confirmed the store's server as the
    /// primary recently enough ([`crate::PgStore::with_patroni`]).
    #[error("{statement} not sent: Patroni has not confirmed the store's server as the primary{}",
        .since.map(|s| format!(" for {s:?}")).unwrap_or_default())]
    NotConfirmed {
        /// The statement.
        statement: &'static str,
        /// How long ago the last confirmation was; `None`: never.
        since: Option<Duration>,
    },
    /// The database refused an argument (a CHECK or a bound in a lease function).
    #[error("invalid argument to {statement}")]
    Invalid {
        /// The statement.
        statement: &'static str,
        /// The database's error.
        #[source]
        source: tokio_postgres::Error,
    },
}

impl Error {
    /// Whether it is a store statement cut off by an outage
    /// ([`StoreError::is_outage`]).
    pub fn is_outage(&self) -> bool {
        matches!(self, Error::Store(e) if e.is_outage())
    }
}

/// Whether a server's error says that it or the link was away: no SQLSTATE
/// (refused, reset, closed), class 08 (connection exception), 57P01–57P03
/// (shut down, crashed, starting), 25006 (a read-only server: a demoted
/// primary, or a standby a multi-host URL reached before a failover).
fn pg_is_outage(e: &tokio_postgres::Error) -> bool {
    use tokio_postgres::error::SqlState;
    match e.code() {
        None => true,
        Some(code) => {
            code.code().starts_with("08")
                || [
                    SqlState::ADMIN_SHUTDOWN,
                    SqlState::CRASH_SHUTDOWN,
                    SqlState::CANNOT_CONNECT_NOW,
                    SqlState::READ_ONLY_SQL_TRANSACTION,
                ]
                .contains(code)
        }
    }
}

/// [`pg_is_outage`] of the first server error in `e`'s chain; without
/// one, whether the pool timed out.
pub(crate) fn chain_is_outage(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(e);
    while let Some(e) = next {
        if let Some(pg) = e.downcast_ref::<tokio_postgres::Error>() {
            return pg_is_outage(pg);
        }
        if let Some(pool) = e.downcast_ref::<deadpool_postgres::PoolError>() {
            if matches!(pool, deadpool_postgres::PoolError::Timeout(_)) {
                return true;
            }
        }
        next = e.source();
    }
    false
}

impl StoreError {
    /// Whether the statement was cut off by an outage of the server or the
    /// link (a failover, a restart, a cut link): no answer in time, a
    /// connection refused, reset, closed or ended by the server, a
    /// read-only server. Narrower than [`StoreError::is_transient`]: what a
    /// server chose to refuse (a login, a privilege, a full server) is not.
    /// Such errors are logged at debug: the connection's own line tells the
    /// outage once, when it ends (and every minute while it lasts).
    pub fn is_outage(&self) -> bool {
        match self {
            StoreError::Timeout { .. } => true,
            StoreError::Connect { source, .. } => chain_is_outage(&**source),
            StoreError::Db { source, .. } => pg_is_outage(source),
            StoreError::Batch { source, .. } => source.is_outage(),
            _ => false,
        }
    }

    /// Whether nothing was sent because the failover manager has not
    /// confirmed the store's server (its check logs each change once).
    pub fn is_unconfirmed(&self) -> bool {
        match self {
            StoreError::NotConfirmed { .. } => true,
            StoreError::Batch { source, .. } => source.is_unconfirmed(),
            _ => false,
        }
    }

    /// Whether the statement could not finish (no answer in time, no
    /// connection, an error of the server or the link at that moment), so
    /// that sending it again may succeed; false when the database refused it
    /// (a privilege, an argument, the schema, an unknown role).
    pub fn is_transient(&self) -> bool {
        match self {
            StoreError::Timeout { .. }
            | StoreError::Connect { .. }
            | StoreError::Db { .. }
            | StoreError::NotConfirmed { .. } => true,
            StoreError::Batch { source, .. } => source.is_transient(),
            _ => false,
        }
    }
}

/// A migration run that failed; nothing of it was committed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrateError {
    /// An applied migration's file changed.
    #[error("migration {version} ({name}) was modified after it was applied: its checksum differs")]
    Modified {
        /// Its version.
        version: i32,
        /// Its name.
        name: String,
    },
    /// The database is ahead of this build.
    #[error(
        "the database has migration {version} applied, which this build does not know (a newer ticklease?)"
    )]
    UnknownApplied {
        /// The unknown version.
        version: i32,
    },
    /// A database role name ticklease does not accept.
    #[error("invalid database role name {name:?}: use [a-z_][a-z0-9_]*, at most 63 bytes")]
    InvalidRoleName {
        /// The name given.
        name: String,
    },
    /// The migrating login is not the owner of ticklease's tables: the
    /// objects it would create would have another owner.
    #[error("migrations run as the owner of leader_leases ({owner}), not as {user}: connect as {owner}")]
    NotOwner {
        /// The migrating login.
        user: String,
        /// The owner of `leader_leases`.
        owner: String,
    },
    /// A login other than the owner can create objects in the schema, or
    /// created some our functions would resolve to: it could run code with
    /// the owner's rights. Nothing was written.
    #[error("schema {schema} is not safe for ticklease: {detail}")]
    UnsafeSchema {
        /// The schema.
        schema: String,
        /// Who can write it, or what was planted.
        detail: String,
    },
    /// A migration of the set is missing or differs.
    #[error("the database is not migrated: {detail} (run `{command}`)")]
    NotMigrated {
        /// What is missing.
        detail: String,
        /// The command that applies the missing migrations.
        command: &'static str,
    },
    /// Every writable host of the URL that answered has been superseded
    /// by a promotion of another (see `ticklease::hosts`).
    #[error(
        "every writable host of the URL is on an older timeline than {by} (timeline {timeline}) was seen on"
    )]
    Superseded {
        /// The newest server seen writable.
        by: String,
        /// Its timeline.
        timeline: u32,
    },
    /// The server did not answer within the bound.
    #[error("no answer to the {what} within {waited:?}")]
    NoAnswer {
        /// What waited: the connect or the run.
        what: &'static str,
        /// How long.
        waited: std::time::Duration,
    },
    /// A step failed in the database.
    #[error("migration step {step} failed")]
    Db {
        /// The step.
        step: String,
        /// The database's error.
        #[source]
        source: tokio_postgres::Error,
    },
}

/// A failure of [`crate::Manager`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The role is not declared to this manager.
    #[error("unknown role {role:?}: not declared to this manager")]
    UnknownRole {
        /// The role.
        role: String,
    },
    /// A second job for one role.
    #[error("role {role:?} already has a job in this scheduler")]
    DuplicateJob {
        /// The role.
        role: String,
    },
    /// A family's cap on concurrent terms is zero or above the most it may hold.
    #[error("family {family:?}: max_terms must be within 1..={max}, got {max_terms}")]
    FamilyTermsOutOfRange {
        /// The family.
        family: String,
        /// The cap given.
        max_terms: usize,
        /// The largest cap allowed.
        max: usize,
    },
    /// A zero tick interval.
    #[error("tick interval for role {role:?} must be greater than zero")]
    ZeroInterval {
        /// The role.
        role: String,
    },
    /// A tick interval over the limit.
    #[error("tick interval {interval:?} for role {role:?} exceeds the limit of {max:?}")]
    IntervalTooLong {
        /// The role.
        role: String,
        /// The interval given.
        interval: Duration,
        /// The limit.
        max: Duration,
    },
    /// A schedule the role cannot be led on.
    #[error("schedule of role {role:?}")]
    Schedule {
        /// The role.
        role: String,
        /// What is wrong with the schedule.
        #[source]
        source: ScheduleError,
    },
    /// A store statement failed.
    #[error("lease store failed")]
    Store(#[from] StoreError),
}

/// An error and its sources on one line, `outer: inner: root`, each cause
/// once: many errors (tokio-postgres's, deadpool's) print their source in
/// their own text as well, so a message that ends with its source's text is
/// cut before it.
pub fn chain(error: &(dyn std::error::Error + 'static)) -> String {
    let mut parts = Vec::new();
    let mut next = Some(error);
    while let Some(e) = next {
        let text = e.to_string();
        next = e.source();
        let own = match next.map(|s| s.to_string()) {
            Some(inner) if text != inner && text.ends_with(&inner) => text[..text.len() - inner.len()]
                .trim_end_matches([' ', ':'])
                .to_string(),
            Some(inner) if text == inner => continue,
            _ => text,
        };
        parts.push(own);
    }
    parts.join(": ")
}

/// Why the failover manager's word cannot be used.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PatroniError {
    /// No member's REST API was given.
    #[error("no Patroni REST API URL given")]
    NoUrl,
    /// More members than `PATRONI_URLS_MAX` (16).
    #[error("{given} Patroni REST API URLs given; at most {max}")]
    TooManyUrls {
        /// How many were given.
        given: usize,
        /// The most accepted.
        max: usize,
    },
    /// A URL that is not `http://host:port`.
    #[error("Patroni REST API URL {url:?}: {problem}")]
    BadUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        problem: &'static str,
    },
    /// No member answered `GET /config` with Patroni's settings.
    #[error("no Patroni member answered GET /config with its settings (asked {asked})")]
    NoSettings {
        /// The members asked.
        asked: String,
    },
    /// A setting Patroni's dynamic configuration holds that this cannot read.
    #[error("Patroni's {name} is {value}: not a whole number of seconds")]
    Setting {
        /// The setting's name.
        name: &'static str,
        /// Its JSON value.
        value: String,
    },
    /// Patroni's `failsafe_mode` is on.
    #[error(
        "Patroni's failsafe_mode is on: a leader cut off from the DCS then stays primary, so its word bounds nothing"
    )]
    FailsafeMode,
    /// The settings leave a term running after another member may be promoted.
    #[error(
        "abandon_after {abandon_after:?} + statement_timeout {statement_timeout:?} exceeds Patroni's \
         ttl {ttl:?} - loop_wait {loop_wait:?} - max(retry_timeout {retry_timeout:?}, loop_wait + 3s): \
         a term could outlive its server's leadership; lower abandon_after or raise Patroni's ttl"
    )]
    Margin {
        /// The replica's `abandon_after`.
        abandon_after: Duration,
        /// The replica's `statement_timeout`.
        statement_timeout: Duration,
        /// Patroni's `ttl`.
        ttl: Duration,
        /// Patroni's `loop_wait`.
        loop_wait: Duration,
        /// Patroni's `retry_timeout`.
        retry_timeout: Duration,
    },
    /// The HTTP client could not be built.
    #[cfg(feature = "patroni")]
    #[error("could not build the HTTP client for Patroni")]
    Client {
        /// reqwest's error.
        #[source]
        source: reqwest::Error,
    },
}

#[cfg(test)]
mod tests {
    use super::chain;

    #[derive(Debug, thiserror::Error)]
    #[error("{text}")]
    struct E {
        text: &'static str,
        #[source]
        source: Option<Box<E>>,
    }

    fn e(text: &'static str, source: Option<E>) -> E {
        E {
            text,
            source: source.map(Box::new),
        }
    }

    #[test]
    fn chain_names_each_cause_once() {
        let root = e("Connection refused (os error 111)", None);
        let pg = e(
            "error connecting to server: Connection refused (os error 111)",
            Some(root),
        );
        let pool = e(
            "Error occurred while creating a new object: error connecting to server: Connection refused (os error 111)",
            Some(pg),
        );
        let ours = e("could not get a database connection for schema check", Some(pool));
        assert_eq!(
            chain(&ours),
            "could not get a database connection for schema check: Error occurred while creating a new object: \
             error connecting to server: Connection refused (os error 111)"
        );
        let same = e("timed out", Some(e("timed out", None)));
        assert_eq!(chain(&same), "timed out");
    }
}

/// A schedule that cannot be used, named before anything is written.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ScheduleError {
    /// A field of the cron expression is invalid.
    #[error("cron expression {expression:?}: the {field} field {value:?} at character {position} is invalid: {reason}")]
    InvalidField {
        /// The expression as given.
        expression: String,
        /// Which field: `second`, `minute`, `hour`, `day of month`, `month`, `day of week`.
        field: &'static str,
        /// The field's text.
        value: String,
        /// Where the field starts in the expression, counting characters from 1.
        position: usize,
        /// What croner found wrong with it.
        reason: String,
    },
    /// The expression as a whole is invalid (its field count, an unknown alias, …).
    #[error("cron expression {expression:?} is invalid: {reason}")]
    InvalidExpression {
        /// The expression as given.
        expression: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The zone is not an IANA time zone name.
    #[error("unknown time zone {zone:?} (an IANA name such as \"Europe/Berlin\" or \"UTC\")")]
    UnknownZone {
        /// The name as given.
        zone: String,
    },
    /// The expression matches no instant (such as `0 0 30 2 *`).
    #[error("cron expression {expression:?} never fires in {zone}")]
    NeverFires {
        /// The expression as given.
        expression: String,
        /// The zone it was evaluated in.
        zone: String,
    },
    /// Two occurrences come closer than the lease's heartbeat.
    #[error("cron expression {expression:?} fires {gap:?} apart, faster than the lease's heartbeat ({heartbeat_every:?}): each occurrence is a term, and a term is watched one beat at a time")]
    FasterThanLease {
        /// The expression as given.
        expression: String,
        /// The shortest gap found between two occurrences.
        gap: Duration,
        /// The configured heartbeat.
        heartbeat_every: Duration,
    },
    /// A setting of cron schedules given to an interval schedule.
    #[error("an interval schedule has no {what}: it belongs to cron schedules")]
    NotForInterval {
        /// The setting: `time zone`, `catch-up policy` or `starting deadline`.
        what: &'static str,
    },
    /// A setting a role family's batched ACQUIRE does not run (it runs the
    /// latest occurrence of a cron schedule, once per key).
    #[error("a role family's cron schedule takes no {what}: each key runs the latest occurrence (CatchUp::Latest)")]
    NotForFamily {
        /// The setting: `starting deadline` or `catch-up policy other than Latest`.
        what: &'static str,
    },
    /// An interval the database would refuse at every ACQUIRE: not whole
    /// milliseconds, or outside 1 ms ..= the longest duration.
    #[error("an interval must be whole milliseconds from 1ms to {max:?} (the database counts it in ms), got {interval:?}")]
    Interval {
        /// The interval as given.
        interval: Duration,
        /// The longest accepted.
        max: Duration,
    },
    /// A catch-up `max` outside 1 ..= [`CATCH_UP_MAX`](crate::CATCH_UP_MAX).
    #[error("catch-up of all missed occurrences needs a max of 1 to {limit}, got {max}")]
    CatchUpMax {
        /// The max as given.
        max: u32,
        /// The largest accepted.
        limit: u32,
    },
    /// A starting deadline of zero or above the longest duration.
    #[error("a starting deadline must be above zero and at most {max:?}, got {deadline:?}")]
    Deadline {
        /// The deadline as given.
        deadline: Duration,
        /// The longest accepted.
        max: Duration,
    },
    /// A retry policy outside its bounds.
    #[error("a retry policy needs 1 to {attempts_max} attempts and backoffs above zero with backoff <= backoff_max <= {max:?}, got {attempts} attempts, backoff {backoff:?}, backoff_max {backoff_max:?}")]
    Retry {
        /// The attempts given.
        attempts: u32,
        /// The first backoff given.
        backoff: Duration,
        /// The longest backoff given.
        backoff_max: Duration,
        /// The most attempts accepted.
        attempts_max: u32,
        /// The longest accepted backoff.
        max: Duration,
    },
}
