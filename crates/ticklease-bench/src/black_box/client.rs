//! The Rust client under the black-box check: the library's [`Scheduler`]
//! leading one role as `docs/black-box.md` says, with a coordination
//! session (and so notifications) on the same URL. Its work is the
//! contract's: a fenced claim, a wait, the claim again.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use tokio_postgres::types::Type;
use tokio_util::sync::CancellationToken;

use ticklease::{Manager, PgStore, PgStoreOptions, Role, Schedule, Scheduler, Tick};

use super::contract::{ClientEnv, ScheduleSpec, CLAIM_SQL, UNFENCED_CLAIM_SQL};

/// Runs until SIGTERM or SIGINT (every term released as interrupted).
pub async fn run() -> anyhow::Result<()> {
    let env = ClientEnv::from_env()?;
    let t = env.timings;
    let config = ticklease::Config::builder()
        .lease_ttl(t.lease_ttl)
        .heartbeat_every(t.heartbeat)
        .statement_timeout(t.statement_timeout)
        .abandon_after(t.abandon)
        .max_poll(t.max_poll)
        .build()?;
    let role = Role::new(&env.role)?;
    let pg: ticklease::PgConnect = env.url.parse()?;
    let store = PgStore::connect(pg.clone(), PgStoreOptions::from_config(&config))
        .await?
        .with_direct(pg.clone())
        .await?;
    let schedule = match &env.schedule {
        ScheduleSpec::Every(every) => Schedule::every(*every),
        ScheduleSpec::Cron(expr) => Schedule::cron(expr)?,
    };
    let manager = Manager::start(store, config, [role.clone()]).await?;
    let claims = Arc::new(Claims {
        pg,
        replica: env.replica.clone(),
        broken: Broken::from_env()?,
    });
    let work_for = t.work;
    let work = move |tick: Tick| {
        let claims = claims.clone();
        async move {
            claims.work(tick, work_for).await;
            Ok::<(), Infallible>(())
        }
    };
    let shutdown = CancellationToken::new();
    ticklease::cancel_on_signals(shutdown.clone())?;
    let stopped = Scheduler::new(manager)
        .job(&role, schedule, work)?
        .run(shutdown)
        .await;
    if !stopped.all_released() {
        eprintln!("black-box client: {stopped}");
    }
    Ok(())
}

/// How the client breaks the contract on purpose (`BLACKBOX_BROKEN`), so a
/// test can show what the check then finds: `stale` claims again after its
/// wait even when the term was lost meanwhile (the fence must refuse it);
/// `unfenced` does that with a claim that has no fence.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broken {
    No,
    Stale,
    Unfenced,
}

impl Broken {
    fn from_env() -> anyhow::Result<Broken> {
        match std::env::var("BLACKBOX_BROKEN").as_deref() {
            Err(_) => Ok(Broken::No),
            Ok("stale") => Ok(Broken::Stale),
            Ok("unfenced") => Ok(Broken::Unfenced),
            Ok(other) => anyhow::bail!("BLACKBOX_BROKEN: stale or unfenced, not {other:?}"),
        }
    }
}

/// The claims of one replica, each on a connection of its own (opened per
/// claim: a Postgres restart or a cut link leaves nothing to repair).
struct Claims {
    pg: ticklease::PgConnect,
    replica: String,
    broken: Broken,
}

impl Claims {
    /// The contract's work: claim, wait (cut short by a loss), claim again.
    /// A refused claim ends the work: the heartbeat reports the loss.
    async fn work(self: Arc<Self>, tick: Tick, wait: Duration) {
        if self.broken != Broken::No {
            // Detached, as work that ignores its cancellation runs on after the
            // library stops waiting for it.
            let stale = tokio::spawn(async move {
                self.claim(&tick).await;
                tokio::time::sleep(wait).await;
                self.claim(&tick).await;
            });
            let _ = stale.await;
            return;
        }
        let tick = &tick;
        if !self.claim(tick).await {
            tick.cancelled().await;
            return;
        }
        tokio::select! {
            _ = tick.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
        }
        if !self.claim(tick).await {
            tick.cancelled().await;
        }
    }

    /// One fenced claim, committed; false when the fence or the commit
    /// check refused it, or the database could not be reached.
    async fn claim(&self, tick: &Tick) -> bool {
        match self.try_claim(tick).await {
            Ok(claimed) => claimed,
            Err(e) => {
                eprintln!("r {}: claim of term {}: {e:#}", self.replica, tick.token());
                false
            }
        }
    }

    async fn try_claim(&self, tick: &Tick) -> anyhow::Result<bool> {
        let (mut client, connection) = self.pg.connect().await.context("connect")?;
        tokio::spawn(connection);
        let tx = client.transaction().await?;
        let [role, token] = tick.fence().params();
        let sql = if self.broken == Broken::Unfenced {
            UNFENCED_CLAIM_SQL
        } else {
            CLAIM_SQL
        };
        let n = tx
            .execute_typed(sql, &[role, token, (&self.replica, Type::TEXT)])
            .await?;
        tx.commit().await?;
        Ok(n == 1)
    }
}
