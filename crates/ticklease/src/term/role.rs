//! Role names: what an application declares, one lease row each.

use std::fmt;

use crate::error::RoleError;

/// Longest role name, in bytes (also enforced by the table's CHECK).
pub const ROLE_NAME_MAX: usize = 63;

/// A validated role name: `[a-z][a-z0-9_]*`, optionally followed by a key
/// `:[a-z0-9][a-z0-9_.-]*` (`billing:shard-3`), at most [`ROLE_NAME_MAX`] bytes.
///
/// The same rule is the `leader_leases_role_name` CHECK in the migration, so a
/// name that passes here is never refused by the database.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Role(pub(crate) String);

impl Role {
    /// Checks the naming rule: `[a-z][a-z0-9_]*`, optionally `:key` (`[a-z0-9][a-z0-9_.-]*`), at most 63 bytes.
    pub fn new(name: impl Into<String>) -> Result<Self, RoleError> {
        let name = name.into();
        match problem(&name) {
            None => Ok(Role(name)),
            Some(problem) => Err(RoleError::Invalid { name, problem }),
        }
    }

    /// The name.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

fn problem(name: &str) -> Option<&'static str> {
    if name.is_empty() {
        return Some("is empty");
    }
    if name.len() > ROLE_NAME_MAX {
        return Some("is longer than 63 bytes");
    }
    let (base, key) = match name.split_once(':') {
        Some((base, key)) => (base, Some(key)),
        None => (name, None),
    };
    let mut chars = base.chars();
    if !chars.next().is_some_and(|c| c.is_ascii_lowercase()) {
        return Some("must start with a lowercase ASCII letter");
    }
    if !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_') {
        return Some("may contain only a-z, 0-9 and '_' before the ':'");
    }
    if let Some(key) = key {
        let mut chars = key.chars();
        if !chars
            .next()
            .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit())
        {
            return Some("has a key that does not start with a-z or 0-9");
        }
        if !chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "_.-".contains(c)) {
            return Some("has a key with characters other than a-z, 0-9, '_', '.', '-'");
        }
    }
    None
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::str::FromStr for Role {
    type Err = RoleError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::new(s)
    }
}

impl AsRef<str> for Role {
    fn as_ref(&self) -> &str {
        &self.0
    }
}
