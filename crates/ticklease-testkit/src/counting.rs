//! A store wrapper that counts the statements it forwards, for tests that
//! bound how many statements a behaviour costs.

use std::time::Duration;

use ticklease::{Acquire, Interval, LeaseStore, Role, StoreError, Token};

/// A store that counts the ACQUIREs and RENEWs it forwards.
#[derive(Debug)]
pub struct Counting<S> {
    inner: S,
    acquires: std::sync::atomic::AtomicUsize,
    renews: std::sync::atomic::AtomicUsize,
}

impl<S> Counting<S> {
    /// Wraps `inner`.
    pub fn new(inner: S) -> Self {
        Counting {
            inner,
            acquires: Default::default(),
            renews: Default::default(),
        }
    }
    /// The ACQUIRE and RENEW statements forwarded so far (a batched one counts once).
    pub fn counts(&self) -> (usize, usize) {
        use std::sync::atomic::Ordering::Relaxed;
        (self.acquires.load(Relaxed), self.renews.load(Relaxed))
    }
}

impl<S: LeaseStore> LeaseStore for Counting<S> {
    async fn acquire(
        &self,
        role: &Role,
        holder: &str,
        lease_ttl: Duration,
        interval: impl Into<Interval> + Send,
    ) -> Result<Acquire, StoreError> {
        let answer = self.inner.acquire(role, holder, lease_ttl, interval).await;
        // Counted once answered: a count means the caller has its answer.
        self.acquires.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        answer
    }
    async fn acquire_occurrence(
        &self,
        role: &Role,
        holder: &str,
        lease_ttl: Duration,
        ask: &ticklease::OccurrenceAsk,
    ) -> Result<ticklease::OccurrenceAnswer, StoreError> {
        let answer = self.inner.acquire_occurrence(role, holder, lease_ttl, ask).await;
        self.acquires.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        answer
    }
    async fn renew(
        &self,
        role: &Role,
        token: Token,
        lease_ttl: Duration,
    ) -> Result<ticklease::Renew, StoreError> {
        self.renews.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.renew(role, token, lease_ttl).await
    }
    async fn release(
        &self,
        role: &Role,
        token: Token,
        outcome: ticklease::Release,
        interval: Duration,
    ) -> Result<bool, StoreError> {
        self.inner.release(role, token, outcome, interval).await
    }
    async fn acquire_many(
        &self,
        roles: &[Role],
        holder: &str,
        lease_ttl: Duration,
        interval: Duration,
        limit: usize,
    ) -> Result<Vec<(Role, Acquire)>, StoreError> {
        let answer = self
            .inner
            .acquire_many(roles, holder, lease_ttl, interval, limit)
            .await;
        self.acquires.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        answer
    }
    async fn acquire_many_occurrence(
        &self,
        roles: &[Role],
        holder: &str,
        lease_ttl: Duration,
        ask: &ticklease::FamilyOccurrenceAsk,
        limit: usize,
    ) -> Result<Vec<(Role, ticklease::OccurrenceAnswer)>, StoreError> {
        let answer = self
            .inner
            .acquire_many_occurrence(roles, holder, lease_ttl, ask, limit)
            .await;
        self.acquires.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        answer
    }
    async fn renew_many(
        &self,
        terms: &[(Role, Token)],
        lease_ttl: Duration,
    ) -> Result<Vec<ticklease::Renew>, StoreError> {
        self.renews.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        self.inner.renew_many(terms, lease_ttl).await
    }
    async fn release_many(&self, terms: &[ticklease::Releasing]) -> Result<Vec<bool>, StoreError> {
        self.inner.release_many(terms).await
    }
    async fn beat(&self, family: &str, holder: &str, lease_ttl: Duration) -> Result<Vec<String>, StoreError> {
        self.inner.beat(family, holder, lease_ttl).await
    }
    async fn leave(&self, family: &str, holder: &str) -> Result<bool, StoreError> {
        self.inner.leave(family, holder).await
    }
    async fn pause(&self, role: &Role, by: &str, reason: &str) -> Result<bool, StoreError> {
        self.inner.pause(role, by, reason).await
    }
    async fn unpause(&self, role: &Role) -> Result<bool, StoreError> {
        self.inner.unpause(role).await
    }
    async fn run_now(&self, role: &Role) -> Result<bool, StoreError> {
        self.inner.run_now(role).await
    }
    async fn seed(&self, roles: &[Role]) -> Result<(), StoreError> {
        self.inner.seed(roles).await
    }
    async fn status(&self) -> Result<Vec<ticklease::LeaseStatus>, StoreError> {
        self.inner.status().await
    }
    async fn status_bounded(&self, limit: usize) -> Result<(Vec<ticklease::LeaseStatus>, u64), StoreError> {
        self.inner.status_bounded(limit).await
    }
    async fn status_of(&self, roles: &[Role]) -> Result<Vec<ticklease::LeaseStatus>, StoreError> {
        self.inner.status_of(roles).await
    }
    fn release_ending(
        &self,
        role: &Role,
        token: Token,
        outcome: ticklease::Release,
        interval: Duration,
        ending: &ticklease::Ending,
    ) -> impl std::future::Future<Output = Result<bool, StoreError>> + Send {
        self.inner.release_ending(role, token, outcome, interval, ending)
    }
    fn signals(&self) -> Option<&ticklease::Signals> {
        self.inner.signals()
    }
}
