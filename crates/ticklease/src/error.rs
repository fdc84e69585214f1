//! Errors. Normal outcomes (a held lease, a lost term) are values elsewhere;
//! these are failures. Display texts name the value at fault and leave the
//! cause to `source()`.

use std::time::Duration;

/// A role name that fails the naming rule.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RoleError {
    #[error("invalid role name {name:?}: {problem}")]
    Invalid { name: String, problem: &'static str },
}

/// A `holder_id` that is not `host:pid:nonce`.
#[derive(Debug, thiserror::Error)]
#[error("holder id {text:?} is not host:pid:nonce")]
pub struct HolderIdError {
    pub text: String,
}

/// A lease timing configuration that breaks a rule.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConfigError {
    #[error("{name} must be greater than zero")]
    Zero { name: &'static str },
    #[error("{name} = {value:?} exceeds the limit of {max:?}")]
    TooLong {
        name: &'static str,
        value: Duration,
        max: Duration,
    },
    #[error("{name} = {value:?} is not a whole number of milliseconds")]
    SubMillisecond { name: &'static str, value: Duration },
    #[error(
        "abandon_after ({abandon_after:?}) + statement_timeout ({statement_timeout:?}) must be less than \
         lease_ttl ({lease_ttl:?}): a leader must stop before its lease can expire"
    )]
    AbandonTooLate {
        abandon_after: Duration,
        statement_timeout: Duration,
        lease_ttl: Duration,
    },
    #[error("heartbeat_every ({heartbeat_every:?}) must be less than abandon_after ({abandon_after:?})")]
    HeartbeatTooSlow {
        heartbeat_every: Duration,
        abandon_after: Duration,
    },
}

/// A lease store statement that failed. A failed RENEW is a missed beat, not a loss.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    #[error("{statement} did not answer within {after:?}")]
    Timeout {
        statement: &'static str,
        after: Duration,
    },
    #[error("could not get a database connection for {statement}")]
    Connect {
        statement: &'static str,
        #[source]
        source: deadpool_postgres::PoolError,
    },
    #[error("the database is not migrated: {detail} (run `{command}`)")]
    NotMigrated {
        detail: String,
        /// The command that applies the missing migrations.
        command: &'static str,
    },
    #[error("unknown role {role:?}: no such row in leader_leases")]
    UnknownRole { role: String },
    #[error("{statement} was refused: permission denied")]
    PermissionDenied {
        statement: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("{statement} failed")]
    Db {
        statement: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
    #[error("{statement} refused: {problem}")]
    Rejected {
        statement: &'static str,
        problem: &'static str,
    },
    #[error("invalid argument to {statement}")]
    Invalid {
        statement: &'static str,
        #[source]
        source: tokio_postgres::Error,
    },
}

/// A migration run that failed; nothing of it was committed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MigrateError {
    #[error("migration {version} ({name}) was modified after it was applied: its checksum differs")]
    Modified { version: i32, name: String },
    #[error(
        "the database has migration {version} applied, which this build does not know (a newer ticklease?)"
    )]
    UnknownApplied { version: i32 },
    #[error("invalid database role name {name:?}: use [a-z_][a-z0-9_]*, at most 63 bytes")]
    InvalidRoleName { name: String },
    #[error("migration step {step} failed")]
    Db {
        step: String,
        #[source]
        source: tokio_postgres::Error,
    },
}

/// A failure of [`crate::Manager`].
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    #[error("unknown role {role:?}: not declared to this manager")]
    UnknownRole { role: String },
    #[error("role {role:?} already has a job in this scheduler")]
    DuplicateJob { role: String },
    #[error("tick interval for role {role:?} must be greater than zero")]
    ZeroInterval { role: String },
    #[error("tick interval {interval:?} for role {role:?} exceeds the limit of {max:?}")]
    IntervalTooLong {
        role: String,
        interval: Duration,
        max: Duration,
    },
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
