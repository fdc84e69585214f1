//! The drill leader: a process that leads one role and, for as long as its
//! tick runs, writes a fenced row into `drill_journal` every `write_every`.
//! The journal then shows, on the database clock, each term's last and first
//! fenced write. It prints `LEADING <token>` when a tick starts and
//! `ENDED <token> lost <reason> <cancelled>` or `ENDED <token> interrupted <cancelled>`
//! when one ends, `<cancelled>` being the wall-clock instant (µs since the
//! epoch) at which its work ended: the pause bench's end mark.
//! With a zero `write_every` the tick writes nothing and opens no journal
//! connection (the idle-load bench counts ticklease's statements alone).

use std::convert::Infallible;
use std::io::Write;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use ticklease::{Cancel, Lead, Manager, NextChance, PgStore, PgStoreOptions, Role, Scheduler, Tick};
use tokio_postgres::types::Type;
use tokio_util::sync::CancellationToken;

/// What drives the drill leader's role: the library's loop, or a loop of
/// the application's own over [`Manager::lead`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, clap::ValueEnum)]
pub enum Driver {
    /// [`Scheduler`] (the README's way).
    #[default]
    Scheduler,
    /// `Manager::lead` in a loop waiting on [`NextChance`] (the crate docs' loop).
    NextChance,
    /// `Manager::lead` in a loop sleeping `max_poll` after each call (the
    /// README's first example before issue 24, but going on after an error).
    Poll,
}

impl Driver {
    pub fn as_str(self) -> &'static str {
        match self {
            Driver::Scheduler => "scheduler",
            Driver::NextChance => "next-chance",
            Driver::Poll => "poll",
        }
    }

    /// What the driver is, for a report's heading.
    pub fn describe(self) -> &'static str {
        match self {
            Driver::Scheduler => "the Scheduler",
            Driver::NextChance => "Manager::lead waiting on NextChance",
            Driver::Poll => "Manager::lead sleeping max_poll after each call",
        }
    }
}

/// Runs until SIGTERM (releases as interrupted, exits 0) or until killed;
/// with `direct`, with a coordination session on it. `driver` says what
/// loops over the role: the library's [`Scheduler`] by default, so a
/// follower wakes as the library decides (the holder's session ending, a
/// notification, the lease's expiry).
pub async fn run(
    url: &str,
    direct: Option<&str>,
    role: &str,
    config: ticklease::Config,
    write_every: Duration,
    driver: Driver,
) -> anyhow::Result<()> {
    let role = Role::new(role)?;
    let pg: ticklease::PgConnect = url.parse()?;
    let mut store = PgStore::connect(pg.clone(), PgStoreOptions::from_config(&config)).await?;
    if let Some(direct) = direct {
        store = store.with_direct(direct.parse::<ticklease::PgConnect>()?).await?;
    }
    let manager = Manager::start(store, config, [role.clone()]).await?;
    let holder = manager.holder_id().to_string();
    let writer = if write_every.is_zero() {
        None
    } else {
        Some(Arc::new(Writer::connect(pg).await?))
    };
    let work = move |tick: Tick| drill_tick(tick, holder.clone(), writer.clone(), write_every);
    let shutdown = CancellationToken::new();
    ticklease::cancel_on_signals(shutdown.clone())?;
    let interval = Duration::from_millis(1);
    if driver == Driver::Scheduler {
        let stopped = Scheduler::new(manager)
            .job(&role, interval, work)?
            .run(shutdown)
            .await;
        if !stopped.all_released() {
            eprintln!("drill leader: {stopped}");
        }
        return Ok(());
    }
    let mut chance = NextChance::new(&manager, &role);
    let stop = manager.clone();
    tokio::spawn(async move {
        shutdown.cancelled().await;
        stop.shutdown();
    });
    loop {
        let lead = manager.lead(&role, interval, &work).await;
        let go_on = match driver {
            Driver::Poll if matches!(lead, Ok(Lead::ShuttingDown)) => false,
            Driver::Poll => {
                tokio::time::sleep(config.max_poll()).await;
                true
            }
            _ => chance.wait(&lead).await,
        };
        if !go_on {
            break;
        }
    }
    if !manager.wait_released(config.statement_timeout() * 2).await || manager.unreleased() > 0 {
        eprintln!("drill leader: {} term(s) not released", manager.unreleased());
    }
    Ok(())
}

/// One drill tick: a fenced journal row every `write_every` until the term is
/// cancelled (with no writer, just the wait).
async fn drill_tick(
    tick: Tick,
    holder: String,
    writer: Option<Arc<Writer>>,
    write_every: Duration,
) -> Result<(), Infallible> {
    println!("LEADING {}", tick.token());
    let _ = std::io::stdout().flush();
    let _end = EndMark(tick.clone());
    let Some(writer) = writer else {
        tick.cancelled().await;
        return Ok(());
    };
    let sql = format!(
        "INSERT INTO drill_journal (role, token, holder) SELECT $1, $2, $3 WHERE {}",
        tick.fence().predicate(1)
    );
    while !tick.is_cancelled() {
        let [r, t] = tick.fence().params();
        // A failed or fenced-off write is no reason to stop: the heartbeat decides.
        let _ = writer.insert(&sql, &[r, t, (&holder, Type::TEXT)]).await;
        tokio::select! {
            _ = tick.cancelled() => {}
            _ = tokio::time::sleep(write_every) => {}
        }
    }
    Ok(())
}

/// Prints the `ENDED` line when the work ends: dropped by the library right
/// after a loss cancels it, or returning after a shutdown did.
struct EndMark(Tick);

impl Drop for EndMark {
    fn drop(&mut self) {
        let at = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_micros());
        let token = self.0.token();
        match self.0.cause() {
            Some(Cancel::LeaseLost(reason)) => println!("ENDED {token} lost {reason} {at}"),
            Some(_) => println!("ENDED {token} interrupted {at}"),
            // The work returns only once cancelled.
            None => {}
        }
        let _ = std::io::stdout().flush();
    }
}

/// The journal writer's own connection, replaced when it closes: after a
/// Postgres failover the multi-host URL reaches the new primary.
struct Writer {
    pg: ticklease::PgConnect,
    client: tokio::sync::Mutex<tokio_postgres::Client>,
}

impl Writer {
    async fn connect(pg: ticklease::PgConnect) -> anyhow::Result<Writer> {
        let client = Self::open(&pg).await?;
        Ok(Writer {
            pg,
            client: tokio::sync::Mutex::new(client),
        })
    }

    async fn open(pg: &ticklease::PgConnect) -> anyhow::Result<tokio_postgres::Client> {
        let (client, connection) = pg.connect().await?;
        tokio::spawn(connection);
        Ok(client)
    }

    async fn insert(
        &self,
        sql: &str,
        params: &[(&(dyn tokio_postgres::types::ToSql + Sync), Type)],
    ) -> anyhow::Result<u64> {
        let mut client = self.client.lock().await;
        if client.is_closed() {
            *client = Self::open(&self.pg).await?;
        }
        Ok(client.execute_typed(sql, params).await?)
    }
}

/// The output lines of a drill leader process.
pub(crate) type LeaderLines = tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>;

/// Starts a drill leader process (`exe leader`) on `url` for `role`, its
/// stdout piped (one line per term it leads and ends).
pub(crate) fn spawn_leader(
    exe: &std::path::Path,
    url: &str,
    direct: Option<&str>,
    role: &str,
    timing: crate::Timing,
    write_every: Duration,
    driver: Driver,
) -> anyhow::Result<(tokio::process::Child, LeaderLines)> {
    use anyhow::Context as _;
    use tokio::io::AsyncBufReadExt as _;
    let mut child = tokio::process::Command::new(exe)
        .args([
            "leader",
            "--url",
            url,
            "--role",
            role,
            "--timing",
            timing.as_str(),
        ])
        .args(["--write-every", &format!("{}ms", write_every.as_millis())])
        .args(["--driver", driver.as_str()])
        .args(direct.map(|d| ["--direct-url", d]).into_iter().flatten())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("spawn the drill leader")?;
    let lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    Ok((child, lines))
}
