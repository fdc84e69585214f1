//! An asynchronous streaming standby of a throwaway primary, for HA tests.
//!
//! `pg_basebackup -R -X stream` from a [`PgCluster::start_primary`] into a
//! temp dir of its own, started as a hot standby on its own port. The test
//! can wait until it has replayed everything the primary committed, cut its
//! WAL receipt (so later commits on the primary never reach it: the commits
//! an async failover loses), and promote it.
//!
//! Each database a test uses must exist on the primary: made before the base
//! backup, or after it (CREATE DATABASE streams like any other change).

use std::time::{Duration, Instant};

use crate::cluster::{append, check_output, connect, io, ClusterOptions, PgCluster, SandboxError};

/// How long the standby may take to catch up, let go of the primary or promote.
const WAIT_TIMEOUT: Duration = Duration::from_secs(30);
const POLL: Duration = Duration::from_millis(20);

/// A running standby; stopped and removed on drop.
#[derive(Debug)]
pub struct Standby {
    cluster: PgCluster,
    primary_port: u16,
    /// Its walreceiver's `application_name`, which names its walsender in the
    /// primary's `pg_stat_replication`.
    name: String,
}

impl Standby {
    /// Takes a base backup of `primary` (started with replication on, see
    /// [`PgCluster::start_primary`]) and starts it as a hot standby streaming
    /// from it. Returns once it accepts (read-only) connections.
    pub fn start(primary: &PgCluster) -> Result<Standby, SandboxError> {
        let cluster = PgCluster::prepare(&ClusterOptions::default())?;
        let out = cluster
            .command("pg_basebackup")
            .args([
                "-h",
                "127.0.0.1",
                "-p",
                &primary.port().to_string(),
                "-U",
                "postgres",
            ])
            .arg("-D")
            .arg(cluster.data_dir())
            // -R: standby.signal and primary_conninfo; -c fast: no wait for a
            // spread checkpoint; --no-sync: the cluster is thrown away anyway.
            .args(["-R", "-X", "stream", "-c", "fast", "--no-sync"])
            .output()
            .map_err(io("run pg_basebackup"))?;
        check_output("pg_basebackup", &out)?;
        let name = format!("standby_{}", cluster.port());
        // The walreceiver reports cluster_name as its application_name. A
        // primary that restarts ends the walreceiver; it is started again
        // after wal_retrieve_retry_interval (5 s by default), which would
        // stretch every wait_caught_up that follows a restart.
        append(
            &cluster.data_dir().join("postgresql.conf"),
            &format!("cluster_name = '{name}'\nwal_retrieve_retry_interval = '100ms'\n"),
        )?;
        cluster.spawn_postmaster()?;
        Ok(Standby {
            cluster,
            primary_port: primary.port(),
            name,
        })
    }

    /// The standby's server: port, `config(db)`, `url(db)`, `stop()`, log.
    pub fn cluster(&self) -> &PgCluster {
        &self.cluster
    }

    /// The server alone, once promoted: a primary that a new standby can
    /// stream from (the base backup copied the replication settings).
    pub fn into_cluster(self) -> PgCluster {
        self.cluster
    }

    /// Waits until the standby has replayed every transaction `primary` had
    /// committed when this was called.
    pub async fn wait_caught_up(&self, primary: &PgCluster) -> Result<(), SandboxError> {
        let p = connect(&primary.config("postgres")).await?;
        // The clusters run with synchronous_commit=off, so recent commits may
        // not be flushed (nor sent) yet: one synchronous commit flushes them
        // all. It must write WAL, or the server commits it asynchronously too.
        p.batch_execute(
            "SET synchronous_commit = on; BEGIN; \
             SELECT pg_logical_emit_message(true, 'ticklease-sandbox', 'caught up?'); COMMIT",
        )
        .await
        .map_err(db("flush the primary's WAL"))?;
        let target: String = p
            .query_one("SELECT pg_current_wal_flush_lsn()::text", &[])
            .await
            .map_err(db("read the primary's flush LSN"))?
            .get(0);
        let s = connect(&self.cluster.config("postgres")).await?;
        poll_until("the standby to replay the primary's WAL", || async {
            let row = s
                .query_one("SELECT pg_last_wal_replay_lsn() >= $1::text::pg_lsn", &[&target])
                .await
                .map_err(db("read the standby's replay LSN"))?;
            Ok(row.get::<_, Option<bool>>(0) == Some(true))
        })
        .await
    }

    /// Stops the standby receiving WAL, for good: what it has received it still
    /// replays, but nothing the primary commits after this returns reaches it.
    ///
    /// How: `primary_conninfo` becomes empty and the config is reloaded, which
    /// ends the walreceiver and starts none. Returns once the standby has no
    /// walreceiver *and* the primary no walsender for it (or is down): no
    /// byte is in flight, so the cut is not a race with the next commit.
    pub async fn cut_wal_receipt(&self) -> Result<(), SandboxError> {
        let s = connect(&self.cluster.config("postgres")).await?;
        // ALTER SYSTEM refuses a transaction block: two round trips.
        s.batch_execute("ALTER SYSTEM SET primary_conninfo = ''")
            .await
            .map_err(db("clear primary_conninfo"))?;
        s.batch_execute("SELECT pg_reload_conf()")
            .await
            .map_err(db("reload the standby's config"))?;
        poll_until("the standby's walreceiver to stop", || async {
            let row = s
                .query_one("SELECT count(*) FROM pg_stat_wal_receiver", &[])
                .await
                .map_err(db("read pg_stat_wal_receiver"))?;
            Ok(row.get::<_, i64>(0) == 0)
        })
        .await?;
        let mut config = self.cluster.config("postgres");
        config.port(self.primary_port);
        let Ok(p) = connect(&config).await else {
            return Ok(()); // A primary that is down sends nothing.
        };
        poll_until("the primary's walsender to the standby to stop", || async {
            let row = p
                .query_one(
                    "SELECT count(*) FROM pg_stat_replication WHERE application_name = $1",
                    &[&self.name],
                )
                .await
                .map_err(db("read pg_stat_replication"))?;
            Ok(row.get::<_, i64>(0) == 0)
        })
        .await
    }

    /// Promotes the standby; returns once it is out of recovery and takes writes.
    pub async fn promote(&self) -> Result<(), SandboxError> {
        let s = connect(&self.cluster.config("postgres")).await?;
        let promoted: bool = s
            .query_one(
                "SELECT pg_promote(wait => true, wait_seconds => $1)",
                &[&(WAIT_TIMEOUT.as_secs() as i32)],
            )
            .await
            .map_err(db("pg_promote"))?
            .get(0);
        if promoted {
            Ok(())
        } else {
            Err(SandboxError::Command {
                what: format!("promoting the standby within {WAIT_TIMEOUT:?}"),
                output: self.cluster.log(),
            })
        }
    }
}

/// A URL naming several servers that connects to whichever of them takes
/// writes (libpq and tokio-postgres try the hosts in order, skipping
/// read-only ones and ones that are down):
/// `postgres://postgres@127.0.0.1:P1,127.0.0.1:P2/db?target_session_attrs=read-write`.
pub fn url_for_hosts(clusters: &[&PgCluster], dbname: &str) -> String {
    let hosts: Vec<String> = clusters
        .iter()
        .map(|c| format!("127.0.0.1:{}", c.port()))
        .collect();
    format!(
        "postgres://postgres@{}/{dbname}?target_session_attrs=read-write",
        hosts.join(",")
    )
}

/// The same as a client config.
pub fn config_for_hosts(clusters: &[&PgCluster], dbname: &str) -> tokio_postgres::Config {
    let mut c = tokio_postgres::Config::new();
    for cluster in clusters {
        c.host("127.0.0.1").port(cluster.port());
    }
    c.user("postgres")
        .dbname(dbname)
        .application_name("ticklease-test")
        .target_session_attrs(tokio_postgres::config::TargetSessionAttrs::ReadWrite);
    c
}

fn db(what: &'static str) -> impl FnOnce(tokio_postgres::Error) -> SandboxError {
    move |source| SandboxError::Db {
        what: what.into(),
        source,
    }
}

/// Polls `done` until it says so, for at most [`WAIT_TIMEOUT`]: the server
/// states waited on here have no notification to wait for.
async fn poll_until<F, Fut>(what: &str, mut done: F) -> Result<(), SandboxError>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<bool, SandboxError>>,
{
    let started = Instant::now();
    while started.elapsed() < WAIT_TIMEOUT {
        if done().await? {
            return Ok(());
        }
        tokio::time::sleep(POLL).await;
    }
    Err(SandboxError::Command {
        what: format!("waiting for {what}"),
        output: format!("not within {WAIT_TIMEOUT:?}"),
    })
}
