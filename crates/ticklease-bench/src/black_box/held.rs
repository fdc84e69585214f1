//! The faults that act between a claim's fence and its COMMIT, or on the
//! holder's heartbeat alone, all from the server side (`server.rs`): a
//! client needs nothing for them, and one that skips the fence, keeps
//! working past its abandon instant, or reports a lost term completed is
//! caught by what follows.

use std::time::{Duration, SystemTime};

use super::db::ms_between;
use super::faults::{Outcome, Run, ATTEMPTS};
use super::server;

/// How often a fault looks at the server while it waits.
const LOOK_EVERY: Duration = Duration::from_millis(10);

/// How much later than the abandon instant a claim may commit: a claim
/// whose COMMIT was sent just before it, and the server's commit latency.
const ABANDON_SLACK: Duration = Duration::from_millis(200);

impl Run<'_> {
    /// Arms the hold for the next claim of the holder's term and waits for
    /// that claim to be held: the holder's name, token and the claim's
    /// backend; None when the term ended first (its work was done).
    async fn hold_next_claim(&mut self, until_over: bool) -> anyhow::Result<Option<(String, i64, i32)>> {
        let t = self.timings;
        let (name, token) = self.db.wait_holder(&self.role, Duration::from_secs(10)).await?;
        let owner = self.db.owner().await?;
        server::arm(&owner, &self.role, token, until_over, t.work + t.lease_ttl * 2).await?;
        let deadline = tokio::time::Instant::now() + t.work + Duration::from_secs(1);
        while tokio::time::Instant::now() < deadline {
            if let Some(pid) = server::held_claim(&owner).await? {
                return Ok(Some((name, token, pid)));
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
        server::disarm(&owner, &self.role).await?;
        Ok(None)
    }

    /// The holder's next claim held after its fence, while the operator
    /// pauses the role (not notified: the holder learns at its next RENEW):
    /// the claim returns once the pause ended its term, and the client sends
    /// its COMMIT. The fence's commit check (or the pause's sweep) must
    /// refuse it; a client without the fence commits after its term ended.
    pub async fn claim_held(&mut self) -> anyhow::Result<()> {
        for _ in 0..ATTEMPTS {
            let Some((_, _, pid)) = self.hold_next_claim(true).await? else {
                continue;
            };
            let owner = self.db.owner().await?;
            let at = self.db.now().await?;
            self.fault_at(at);
            owner
                .execute(
                    "SELECT leader_pause($1, 'blackbox', 'claim held past its term')",
                    &[&self.role],
                )
                .await?;
            self.wait_gone(&owner, pid, Duration::from_secs(2)).await?;
            server::disarm(&owner, &self.role).await?;
            // The holder's next RENEW tells it of the pause.
            tokio::time::sleep(self.timings.heartbeat).await;
            let unpaused: SystemTime = owner.query_one("SELECT clock_timestamp()", &[]).await?.get(0);
            owner.execute("SELECT leader_unpause($1)", &[&self.role]).await?;
            owner
                .execute("SELECT pg_notify('ticklease', 'unpause ' || $1)", &[&self.role])
                .await?;
            let bound = self.timings.max_poll + Duration::from_secs(1);
            let claim = self
                .db
                .wait_claim_after(&self.role, 0, unpaused, bound * 2)
                .await?;
            let outcome = Outcome::new("claim held past its term (pause)", unpaused, claim, bound);
            return self.done(outcome, claim, Vec::new()).await;
        }
        anyhow::bail!("claim held: the holder's term ended before its next claim {ATTEMPTS} times")
    }

    /// The holder's next claim held after its fence, and its session ended
    /// by the server (`pg_terminate_backend`, as an administrator or a
    /// pooler would): `57P01` while the term is still live. The work must
    /// not report its term completed (it made one claim of two).
    pub async fn session_ended(&mut self) -> anyhow::Result<()> {
        for _ in 0..ATTEMPTS {
            let Some((_, token, pid)) = self.hold_next_claim(false).await? else {
                continue;
            };
            let owner = self.db.owner().await?;
            let at = self.db.now().await?;
            self.fault_at(at);
            owner.execute("SELECT pg_terminate_backend($1)", &[&pid]).await?;
            server::disarm(&owner, &self.role).await?;
            let bound = self.takeover_bound();
            let claim = self.db.wait_claim_after(&self.role, token, at, bound).await?;
            let outcome = Outcome::new("claim's session ended", at, claim, bound);
            return self.done(outcome, claim, Vec::new()).await;
        }
        anyhow::bail!("session ended: the holder's term ended before its next claim {ATTEMPTS} times")
    }

    /// Waits up to `within` until backend `pid` is no longer held.
    async fn wait_gone(
        &self,
        owner: &tokio_postgres::Client,
        pid: i32,
        within: Duration,
    ) -> anyhow::Result<()> {
        let deadline = tokio::time::Instant::now() + within;
        while server::held_claim(owner).await? == Some(pid) && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(LOOK_EVERY).await;
        }
        Ok(())
    }

    /// A new term's RENEWs refused from its first claim (its heartbeat
    /// fails; its claims still reach the server) until the term is over:
    /// the holder must stop its work within A of its last acknowledged
    /// RENEW, while the lease (T) still lets its claims pass the fence, and
    /// its term must not be reported completed.
    pub async fn renew_refused(&mut self) -> anyhow::Result<()> {
        let (_, before) = self.db.wait_holder(&self.role, Duration::from_secs(10)).await?;
        let (name, token) = self.wait_new_holder(before).await?;
        let owner = self.db.owner().await?;
        let at = self.db.now().await?;
        self.fault_at(at);
        server::refuse_renew(&owner, true).await?;
        let expiry = self.last_expiry(&owner, token).await;
        server::refuse_renew(&owner, false).await?;
        let expiry = expiry?;
        let bound = self.takeover_bound();
        let claim = self.db.wait_claim_after(&self.role, token, at, bound).await?;
        let mut own = Vec::new();
        if let Some(expiry) = expiry {
            own.extend(self.stopped_late(&owner, &name, token, expiry).await?);
        }
        let outcome = Outcome::new("RENEW refused", at, claim, bound);
        self.done(outcome, claim, own).await
    }

    /// Waits for a holder of a term after `token` that has claimed.
    async fn wait_new_holder(&self, token: i64) -> anyhow::Result<(String, i64)> {
        let deadline = tokio::time::Instant::now() + self.timings.lease_ttl * 3 + self.timings.work;
        loop {
            if let Some((name, t)) = self.db.holder(&self.role).await? {
                if t > token {
                    return Ok((name, t));
                }
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "no new term of {} claimed after term {token}",
                self.role
            );
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// Follows the term `token` until it is over (or T + 1 s): the last
    /// expiry the server gave it (its last RENEW's, or its ACQUIRE's).
    async fn last_expiry(
        &self,
        owner: &tokio_postgres::Client,
        token: i64,
    ) -> anyhow::Result<Option<SystemTime>> {
        let deadline = tokio::time::Instant::now() + self.timings.lease_ttl + Duration::from_secs(1);
        let mut last = None;
        while tokio::time::Instant::now() < deadline {
            match server::expiry(owner, &self.role, token).await? {
                Some(e) => last = last.max(Some(e)),
                None => break,
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
        Ok(last)
    }

    /// A claim of term `token` committed past its abandon instant: its last
    /// acknowledged RENEW (the expiry it set, less T) plus A.
    async fn stopped_late(
        &self,
        owner: &tokio_postgres::Client,
        name: &str,
        token: i64,
        expiry: SystemTime,
    ) -> anyhow::Result<Option<String>> {
        let t = self.timings;
        let renewed = expiry - t.lease_ttl;
        let last: Option<SystemTime> = owner
            .query_one(
                "SELECT max(pg_xact_commit_timestamp(xmin)) FROM blackbox_claims WHERE role = $1 AND token = $2",
                &[&self.role, &token],
            )
            .await?
            .get(0);
        let late = last
            .map(|c| ms_between(c, renewed))
            .filter(|&ms| ms > (t.abandon + ABANDON_SLACK).as_secs_f64() * 1000.0);
        Ok(late.map(|ms| {
            format!(
                "{}: term {token} ({name}) committed a claim {ms:.0} ms after its last acknowledged RENEW: \
                 past the abandon bound A ({} ms), its work had to stop",
                self.role,
                t.abandon.as_millis()
            )
        }))
    }
}
