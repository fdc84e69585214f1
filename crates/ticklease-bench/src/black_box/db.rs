//! The database of one black-box run: a Postgres of its own (the run
//! restarts it), migrated, with the app login the replicas use and the
//! claims table; and what the harness reads from it while it runs.

use std::time::{Duration, SystemTime};

use anyhow::Context as _;
use tokio_postgres::Client;

use ticklease_sandbox::{connect, ClusterOptions, PgCluster};

use super::contract::CLAIMS_TABLE;
use super::server::HOLD;

/// How often a wait looks at the database again.
const LOOK_EVERY: Duration = Duration::from_millis(20);

pub struct Db {
    pub cluster: PgCluster,
    pub name: String,
}

impl Db {
    pub async fn start() -> anyhow::Result<Db> {
        let cluster = PgCluster::start_with(&ClusterOptions::default())?;
        // The checks order claims and term ends by their commits.
        connect(&cluster.config("postgres"))
            .await?
            .batch_execute("ALTER SYSTEM SET track_commit_timestamp = on")
            .await?;
        tokio::task::block_in_place(|| cluster.restart())?;
        let name = cluster.create_database().await?;
        // Durable commits: the kit starts its servers with
        // `synchronous_commit=off` (fast tests), under which a commit is
        // visible and acknowledged before its record is written, and an
        // immediate stop loses it. A database's setting overrides the
        // server's command line for every session.
        connect(&cluster.config("postgres"))
            .await?
            .batch_execute(&format!("ALTER DATABASE \"{name}\" SET synchronous_commit = on"))
            .await?;
        let mut owner = connect(&cluster.config(&name)).await?;
        ticklease::migrate(&mut owner).await?;
        owner
            .batch_execute(&format!(
                "DO $$ BEGIN CREATE ROLE blackbox_app LOGIN; EXCEPTION WHEN duplicate_object THEN NULL; END $$;
                 GRANT ticklease_app TO blackbox_app; {CLAIMS_TABLE}; {HOLD}"
            ))
            .await?;
        Ok(Db { cluster, name })
    }

    /// A new owner connection, waiting up to 30 s for the server (it may be restarting).
    pub async fn owner(&self) -> anyhow::Result<Client> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            match connect(&self.cluster.config(&self.name)).await {
                Ok(client) => return Ok(client),
                Err(e) if tokio::time::Instant::now() >= deadline => return Err(e.into()),
                Err(_) => tokio::time::sleep(LOOK_EVERY * 5).await,
            }
        }
    }

    pub async fn now(&self) -> anyhow::Result<SystemTime> {
        Ok(self
            .owner()
            .await?
            .query_one("SELECT clock_timestamp()", &[])
            .await?
            .get(0))
    }

    /// The replica that holds `role` now and has claimed in its term, with its token.
    pub async fn holder(&self, role: &str) -> anyhow::Result<Option<(String, i64)>> {
        let row = self
            .owner()
            .await?
            .query_opt(
                "SELECT c.replica, l.holder_token FROM leader_leases AS l
                   JOIN blackbox_claims AS c ON c.role = l.role AND c.token = l.holder_token
                  WHERE l.role = $1 AND l.holder_id IS NOT NULL AND l.expires_at > now() LIMIT 1",
                &[&role],
            )
            .await?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    /// Waits up to `within` for a holder that has claimed.
    pub async fn wait_holder(&self, role: &str, within: Duration) -> anyhow::Result<(String, i64)> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(h) = self.holder(role).await? {
                return Ok(h);
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "no replica held {role} and claimed within {within:?}"
            );
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// The first claim of a term after `token`, at or after `after`.
    pub async fn first_claim_after(
        &self,
        role: &str,
        token: i64,
        after: SystemTime,
    ) -> anyhow::Result<Option<SystemTime>> {
        let row = self
            .owner()
            .await?
            .query_one(
                "SELECT min(at) FROM blackbox_claims WHERE role = $1 AND token > $2 AND at >= $3",
                &[&role, &token, &after],
            )
            .await?;
        Ok(row.get(0))
    }

    /// Waits up to `within` for [`Db::first_claim_after`]; None if none came.
    pub async fn wait_claim_after(
        &self,
        role: &str,
        token: i64,
        after: SystemTime,
        within: Duration,
    ) -> anyhow::Result<Option<SystemTime>> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            if let Some(at) = self.first_claim_after(role, token, after).await? {
                return Ok(Some(at));
            }
            if tokio::time::Instant::now() >= deadline {
                return Ok(None);
            }
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }

    /// Waits until `n` claims of `role` were committed after `after`, and
    /// returns the last one's instant: the role runs again.
    pub async fn settle(
        &self,
        role: &str,
        after: SystemTime,
        n: i64,
        within: Duration,
    ) -> anyhow::Result<SystemTime> {
        let deadline = tokio::time::Instant::now() + within;
        loop {
            let row = self
                .owner()
                .await?
                .query_one(
                    "SELECT count(*), max(at) FROM blackbox_claims WHERE role = $1 AND at > $2",
                    &[&role, &after],
                )
                .await?;
            if row.get::<_, i64>(0) >= n {
                return row
                    .get::<_, Option<SystemTime>>(1)
                    .context("a count without a max");
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "{role} did not claim {n} times within {within:?} (it had {})",
                row.get::<_, i64>(0)
            );
            tokio::time::sleep(LOOK_EVERY).await;
        }
    }
}

/// Milliseconds from `earlier` to `later` (negative when before).
pub fn ms_between(later: SystemTime, earlier: SystemTime) -> f64 {
    match later.duration_since(earlier) {
        Ok(d) => d.as_secs_f64() * 1000.0,
        Err(e) => -e.duration().as_secs_f64() * 1000.0,
    }
}
