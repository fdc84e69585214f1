//! The Rust client under the black-box check: the library's [`Scheduler`]
//! leading one role as `docs/black-box.md` says, with a coordination
//! session (and so notifications) on the same URL. Its work is the
//! contract's: a fenced claim, a wait, the claim again.

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
    let broken = Broken::from_env()?;
    if broken == Broken::IgnoreRenew {
        // The library waits this long for a lost term's work before it
        // drops it and RELEASEs: a work that ignores its cancellation runs on.
        manager.set_lost_drain(t.lease_ttl * 3);
    }
    let claims = Arc::new(Claims {
        pg,
        replica: env.replica.clone(),
        broken,
    });
    let work_for = t.work;
    let work = move |tick: Tick| claims.clone().work(tick, work_for);
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
/// test can show that the harness fails it: `no-fence` claims without the
/// fence (otherwise correct); `ignore-renew` keeps working when its
/// heartbeat fails (its work ignores its cancellation and the library is
/// told to wait for it); `lost-as-completed` returns success when a claim
/// is refused or fails, so its term is RELEASEd `completed`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Broken {
    No,
    NoFence,
    IgnoreRenew,
    LostAsCompleted,
}

impl Broken {
    fn from_env() -> anyhow::Result<Broken> {
        match std::env::var("BLACKBOX_BROKEN").as_deref() {
            Err(_) => Ok(Broken::No),
            Ok("no-fence") => Ok(Broken::NoFence),
            Ok("ignore-renew") => Ok(Broken::IgnoreRenew),
            Ok("lost-as-completed") => Ok(Broken::LostAsCompleted),
            Ok(other) => {
                anyhow::bail!("BLACKBOX_BROKEN: no-fence, ignore-renew or lost-as-completed, not {other:?}")
            }
        }
    }
}

/// What a claim came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Claimed {
    Yes,
    /// The fence said no, or the COMMIT check (`40001`): the term is over,
    /// and the heartbeat will say so.
    Refused,
    /// Any other error (`57P01` from an administrator or a restart, a lost
    /// connection): the term may still be live, so the work fails rather
    /// than wait for a loss that may never come.
    Failed,
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
    async fn work(self: Arc<Self>, tick: Tick, wait: Duration) -> anyhow::Result<()> {
        let tick = &tick;
        match self.broken {
            Broken::IgnoreRenew => {
                // No look at the cancellation: the wait and the second claim happen whatever.
                self.claim(tick).await;
                tokio::time::sleep(wait).await;
                self.claim(tick).await;
                return Ok(());
            }
            Broken::LostAsCompleted => {
                if self.claim(tick).await == Claimed::Yes {
                    tokio::time::sleep(wait).await;
                    self.claim(tick).await;
                }
                return Ok(());
            }
            Broken::No | Broken::NoFence => {}
        }
        self.claimed(tick, self.claim(tick).await).await?;
        tokio::select! {
            _ = tick.cancelled() => return Ok(()),
            _ = tokio::time::sleep(wait) => {}
        }
        self.claimed(tick, self.claim(tick).await).await
    }

    /// After a claim that was not made: a refused one waits for the loss
    /// the heartbeat reports, a failed one fails the tick.
    async fn claimed(&self, tick: &Tick, claimed: Claimed) -> anyhow::Result<()> {
        match claimed {
            Claimed::Yes => Ok(()),
            Claimed::Refused => {
                tick.cancelled().await;
                Ok(())
            }
            Claimed::Failed => anyhow::bail!("claim of term {} failed", tick.token()),
        }
    }

    /// One claim, committed.
    async fn claim(&self, tick: &Tick) -> Claimed {
        match self.try_claim(tick).await {
            Ok(true) => Claimed::Yes,
            Ok(false) => Claimed::Refused,
            Err(e) => {
                eprintln!("r {}: claim of term {}: {e:#}", self.replica, tick.token());
                let refused = e
                    .downcast_ref::<tokio_postgres::Error>()
                    .and_then(tokio_postgres::Error::code)
                    .is_some_and(|c| *c == tokio_postgres::error::SqlState::T_R_SERIALIZATION_FAILURE);
                if refused {
                    Claimed::Refused
                } else {
                    Claimed::Failed
                }
            }
        }
    }

    async fn try_claim(&self, tick: &Tick) -> anyhow::Result<bool> {
        let (mut client, connection) = self.pg.connect().await.context("connect")?;
        tokio::spawn(connection);
        let tx = client.transaction().await?;
        let [role, token] = tick.fence().params();
        let sql = if self.broken == Broken::NoFence {
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
