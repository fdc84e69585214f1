//! Role families, as declared: a name and a set of keys, each key a role
//! `name:key` with a term of its own. The loop that leads them is
//! `schedule::family`.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use tokio::sync::watch;

use crate::error::RoleError;
use crate::term::role::Role;

/// Most keys a family holds (each costs its loop about 200 bytes while no
/// term of it runs here).
pub const FAMILY_KEYS_MAX: usize = 100_000;

/// The default cap on a family's concurrent terms on one replica.
pub const FAMILY_TERMS_DEFAULT: usize = 1_000;

/// A set of roles `name:key` that can change at run time. Cheap to clone:
/// clones share the keys, so the application adds and removes keys on the
/// clone it keeps while the scheduler leads them.
#[derive(Clone)]
pub struct Family {
    inner: Arc<Inner>,
}

struct Inner {
    name: Arc<str>,
    keys: Mutex<BTreeSet<String>>,
    /// Bumped on every change, to wake the family loop.
    version: watch::Sender<u64>,
    max_terms: std::sync::atomic::AtomicUsize,
    per_role_metrics: std::sync::atomic::AtomicBool,
}

impl std::fmt::Debug for Family {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Family")
            .field("name", &self.name())
            .field("keys", &self.len())
            .finish()
    }
}

impl Family {
    /// A family with no keys. `name` follows the role rule without a key
    /// (`[a-z][a-z0-9_]*`, so that `name:key` is a role name).
    pub fn new(name: &str) -> Result<Family, RoleError> {
        if name.contains(':') {
            return Err(RoleError::FamilyWithKey {
                name: name.to_string(),
            });
        }
        Role::new(format!("{name}:k"))?;
        Ok(Family {
            inner: Arc::new(Inner {
                name: name.into(),
                keys: Mutex::default(),
                version: watch::Sender::new(0),
                max_terms: FAMILY_TERMS_DEFAULT.into(),
                per_role_metrics: false.into(),
            }),
        })
    }

    /// The family's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The role of `key`: `name:key`, checked against the role rule.
    pub fn role(&self, key: &str) -> Result<Role, RoleError> {
        Role::new(format!("{}:{key}", self.name()))
    }

    /// Adds `key`; `Ok` also when it was there already.
    pub fn add(&self, key: &str) -> Result<Role, RoleError> {
        let role = self.role(key)?;
        let mut keys = self.keys();
        if !keys.contains(key) {
            self.check_len(keys.len() + 1)?;
            keys.insert(key.to_string());
            drop(keys);
            self.changed();
        }
        Ok(role)
    }

    /// Removes `key`; a term of it running here is cancelled
    /// ([`Cancel::Removed`](crate::Cancel::Removed)) and released as
    /// interrupted. `false` when it was not there.
    pub fn remove(&self, key: &str) -> bool {
        let removed = self.keys().remove(key);
        if removed {
            self.changed();
        }
        removed
    }

    /// Replaces the keys with `keys`, all or nothing: one invalid key (or
    /// too many) changes nothing.
    pub fn set<K: AsRef<str>>(&self, keys: impl IntoIterator<Item = K>) -> Result<(), RoleError> {
        let mut next = BTreeSet::new();
        for key in keys {
            let key = key.as_ref();
            self.role(key)?;
            next.insert(key.to_string());
            self.check_len(next.len())?;
        }
        *self.keys() = next;
        self.changed();
        Ok(())
    }

    /// The keys, sorted.
    pub fn key_list(&self) -> Vec<String> {
        self.keys().iter().cloned().collect()
    }

    /// How many keys the family holds.
    pub fn len(&self) -> usize {
        self.keys().len()
    }

    /// Whether the family holds no key.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Caps the family's concurrent terms on each replica (default
    /// [`FAMILY_TERMS_DEFAULT`], at most [`FAMILY_KEYS_MAX`]).
    pub fn set_max_terms(&self, max_terms: usize) -> Result<(), crate::Error> {
        if !(1..=FAMILY_KEYS_MAX).contains(&max_terms) {
            return Err(crate::Error::FamilyTermsOutOfRange {
                family: self.name().to_string(),
                max_terms,
                max: FAMILY_KEYS_MAX,
            });
        }
        self.inner
            .max_terms
            .store(max_terms, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// The cap on the family's concurrent terms on each replica.
    pub fn max_terms(&self) -> usize {
        self.inner.max_terms.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Exports the per-role series for every key too (default off: a
    /// family exports aggregates, since thousands of keys would be
    /// thousands of series). Takes effect for terms started afterwards.
    pub fn set_per_role_metrics(&self, on: bool) {
        self.inner
            .per_role_metrics
            .store(on, std::sync::atomic::Ordering::Relaxed);
    }

    pub(crate) fn keys(&self) -> std::sync::MutexGuard<'_, BTreeSet<String>> {
        self.inner.keys.lock().expect("not poisoned")
    }

    /// The name, shared (each term of a key carries it).
    pub(crate) fn shared_name(&self) -> Arc<str> {
        self.inner.name.clone()
    }

    /// Whether terms started now export the per-role series too.
    pub(crate) fn per_role_metrics(&self) -> bool {
        self.inner
            .per_role_metrics
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Changes with every change of the keys or settings.
    pub(crate) fn version(&self) -> watch::Receiver<u64> {
        self.inner.version.subscribe()
    }

    fn check_len(&self, keys: usize) -> Result<(), RoleError> {
        if keys > FAMILY_KEYS_MAX {
            return Err(RoleError::TooManyKeys {
                family: self.name().to_string(),
                keys,
                max: FAMILY_KEYS_MAX,
            });
        }
        Ok(())
    }

    fn changed(&self) {
        self.inner.version.send_modify(|v| *v += 1);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn family_names_and_keys_follow_the_role_rule_and_set_is_all_or_nothing() {
        assert!(matches!(
            Family::new("tenant_sync:acme"),
            Err(RoleError::FamilyWithKey { .. })
        ));
        assert!(Family::new("Tenant").is_err());
        let family = Family::new("tenant_sync").unwrap();
        assert_eq!(family.add("acme").unwrap().as_str(), "tenant_sync:acme");
        assert!(family.add("Bad Key").is_err());
        assert!(family.set(["a", "b", "no way"]).is_err());
        assert_eq!(family.key_list(), ["acme"], "nothing changed");
        assert!(family.remove("acme"));
        assert!(!family.remove("acme"));
        assert!(family.set_max_terms(0).is_err());
    }
}
