//! The drill leader: a process that leads one role and, for as long as its
//! tick runs, writes a fenced row into `drill_journal` every `write_every`.
//! The journal then shows, on the database clock, each term's last and first
//! fenced write. It prints `LEADING <token>` when a tick starts and
//! `ENDED <token> lost <reason>` or `ENDED <token> interrupted` when one ends early.

use std::convert::Infallible;
use std::io::Write;
use std::time::Duration;

use ticklease::{Lead, Manager, PgStore, PgStoreOptions, Role};
use tokio_postgres::types::Type;
use tokio_util::sync::CancellationToken;

/// Runs until SIGTERM (releases as interrupted, exits 0) or until killed.
pub async fn run(
    url: &str,
    role: &str,
    config: ticklease::Config,
    write_every: Duration,
) -> anyhow::Result<()> {
    let role = Role::new(role)?;
    let pg: ticklease::PgConnect = url.parse()?;
    let store = PgStore::connect(pg.clone(), PgStoreOptions::from_config(&config)).await?;
    let manager = Manager::start(store, config, [role.clone()]).await?;
    let holder = manager.holder_id().to_string();
    let writer = Writer::connect(pg).await?;
    let shutdown = CancellationToken::new();
    ticklease::cancel_on_signals(shutdown.clone())?;
    let stop = manager.clone();
    let token = shutdown.clone();
    tokio::spawn(async move {
        token.cancelled().await;
        stop.shutdown();
    });
    let writer = &writer;
    loop {
        let lead = manager
            .lead(&role, Duration::from_millis(1), |tick| {
                let holder = holder.clone();
                async move {
                    println!("LEADING {}", tick.token());
                    let _ = std::io::stdout().flush();
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
                    Ok::<_, Infallible>(())
                }
            })
            .await;
        match &lead {
            Ok(Lead::Lost { token, reason }) => println!("ENDED {token} lost {reason}"),
            Ok(Lead::Interrupted { token }) => println!("ENDED {token} interrupted"),
            _ => {}
        }
        let _ = std::io::stdout().flush();
        match lead {
            Ok(Lead::ShuttingDown) => return Ok(()),
            Ok(Lead::Interrupted { .. }) if shutdown.is_cancelled() => return Ok(()),
            Ok(_) => {}
            Err(e) => eprintln!("drill leader: {}", ticklease::error::chain(&e)),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return Ok(()),
            _ = tokio::time::sleep(config.max_poll()) => {}
        }
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
    role: &str,
    timing: crate::Timing,
    write_every: Duration,
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
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .context("spawn the drill leader")?;
    let lines = tokio::io::BufReader::new(child.stdout.take().expect("piped")).lines();
    Ok((child, lines))
}
