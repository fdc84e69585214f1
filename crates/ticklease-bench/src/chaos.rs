//! The chaos run: worker replicas, each on its own link through a fault
//! proxy, under a seeded stream of faults (SIGKILL, SIGTERM, SIGSTOP/SIGCONT,
//! blackholed and reset links, a holder's coordination session ended alone,
//! Postgres restarts, promotions of the standby with and without a lost
//! tail) while load keeps arriving; then a checker over the claim journal,
//! the lease history and what the peers received.
//!
//! Postgres runs highly available as it does in production: a primary and
//! an asynchronous streaming standby, each node with its own PgBouncer when
//! pooled, and the replicas reaching the primary's node through a writer
//! endpoint ([`WriterEndpoint`]: a floating address that follows the
//! primary). Each replica also has a coordination session, on a direct URL
//! through a second endpoint that follows the primary's Postgres itself (not
//! its bouncer), over a second link of its own: a cut or reset link takes
//! both. A promotion moves both addresses; the replicas keep their URLs and
//! are not restarted. A replica has one address per link here, so the
//! multi-host URL (the other way to follow a primary, tested in the CLI's
//! switchover test) is not what this run exercises.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::ops::Range;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use anyhow::{bail, Context};
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::process::Child;
use tokio_postgres::types::Type;
use tokio_postgres::Client;

use ticklease::Role;
use ticklease_sandbox::audit::Received;
use ticklease_sandbox::{Violation, WorkerProcess};
use ticklease_testkit::{
    connect, scalar, signal, Fault, FaultProxy, HttpPeer, PgBouncer, PgCluster, SmtpSink, Standby,
};
use ticklease_worker::worker::WorkerConfig;

use crate::endpoint::WriterEndpoint;
use crate::failover::Env;
use crate::plot;
use crate::Timing;

/// The webhook secret the chaos workers sign with.
pub const SECRET: &str = "whsec_Y2hhb3Mtc2VjcmV0";

#[derive(Debug, Clone)]
pub struct ChaosOptions {
    pub replicas: usize,
    pub faults: usize,
    pub seed: u64,
    pub timing: Timing,
    /// This binary: replicas are `<exe> worker …`.
    pub exe: PathBuf,
    /// Replicas reach Postgres through PgBouncer (transaction mode), which the
    /// fault stream also restarts.
    pub pooled: bool,
}

/// What the run did and what the checker found.
#[derive(Debug, Clone, Default)]
pub struct ChaosReport {
    pub seed: u64,
    pub faults: BTreeMap<&'static str, usize>,
    pub violations: Vec<String>,
    /// Per role: the longest time between two terms, outside Postgres restarts (ms).
    pub max_gap_ms: BTreeMap<String, f64>,
    pub gap_bound_ms: f64,
    pub terms: i64,
    pub journal_claims: i64,
    /// ACQUIREs the old primaries committed after their standby's WAL receipt
    /// was cut: terms lost with the promotions' lost tails.
    pub lost_acquires: i64,
    /// Fenced claims lost with them.
    pub lost_claims: i64,
    /// Coordination sessions of holders the `coordination_kill` faults ended
    /// (a fault finds none while no holder has a session up).
    pub coordination_kills: usize,
    /// Webhooks, charges and emails the peers received during lost tails,
    /// left out of the audit (see `LostTail` in this module).
    pub lost_tail_receipts: usize,
    /// Identifiers a lost tail sent that the surviving timeline sent again
    /// with another body: a webhook-id or idempotency key the worker derived
    /// from a sequence value the lost tail had handed out, so a receiver that
    /// dedupes would drop the second, different effect. Reported, not a
    /// violation: the worker chooses its keys, and an async failover may lose
    /// the rows they came from.
    pub reused_ids: Vec<String>,
    pub took: Duration,
    /// The terms and faults over time, for [`Timeline::write_svg`].
    pub timeline: Timeline,
}

/// The run's terms (from `lease_history` on the surviving timeline) and its
/// faults, in seconds from the replicas' start.
#[derive(Clone, Default)]
pub struct Timeline {
    /// The roles, one row each.
    pub roles: Vec<String>,
    pub replicas: usize,
    /// One per term: its role's row, start, end, and the replica whose process held it.
    pub terms: Vec<plot::Bar>,
    /// One per fault: when it was injected and its kind.
    pub faults: Vec<plot::FaultMark>,
}

impl std::fmt::Debug for Timeline {
    /// Counts only: the report is printed whole.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Timeline")
            .field("terms", &self.terms.len())
            .field("faults", &self.faults.len())
            .finish()
    }
}

impl Timeline {
    /// An SVG timeline: a row per role, a bar per term coloured by replica,
    /// a labelled vertical line per fault.
    pub fn write_svg(&self, path: &std::path::Path, title: &str) -> anyhow::Result<()> {
        plot::timeline_svg(path, title, &self.roles, self.replicas, &self.terms, &self.faults)
    }
}

impl ChaosReport {
    pub fn ok(&self) -> bool {
        self.violations.is_empty()
    }
}

/// Replica faults, then the rare whole-service ones. `coordination_kill`
/// ends a holder's coordination session alone (`pg_terminate_backend`): the
/// false positive, a term acquirable while its holder runs on.
const REPLICA_FAULTS: [&str; 6] = [
    "sigkill",
    "sigterm",
    "freeze",
    "blackhole",
    "reset",
    "coordination_kill",
];

/// The pool PgBouncer keeps per database on each node.
const BOUNCER_POOL: u32 = 10;

struct Replica {
    link: FaultProxy,
    /// The coordination session's link, to the direct endpoint.
    direct_link: FaultProxy,
    child: Child,
}

impl Replica {
    /// Both links: the replica's host network.
    fn set(&self, fault: Fault) {
        self.link.set(fault);
        self.direct_link.set(fault);
    }
}

fn spawn_worker(
    env: &Env,
    replica: (&FaultProxy, &FaultProxy),
    http: &HttpPeer,
    smtp: &SmtpSink,
) -> anyhow::Result<Child> {
    let lease = env.timing.config();
    let (link, direct_link) = replica;
    WorkerProcess::new(&env.exe, env.url_via(link), SECRET)
        .direct_url(env.url_via(direct_link))
        .lease(lease)
        .payments_url(http.url())
        .smtp_url(smtp.url())
        .batch_size(5)
        .tick_interval(lease.max_poll())
        .decline_backoff(lease.max_poll())
        .spawn()
        .context("spawn a worker replica")
}

/// The flags of `ticklease worker` a chaos replica gets from [`WorkerProcess`].
#[derive(Debug, clap::Args)]
pub struct WorkerFlags {
    #[arg(long)]
    database_url: String,
    #[arg(long)]
    direct_url: Option<String>,
    #[arg(long)]
    webhook_secret: String,
    #[arg(long)]
    payments_url: String,
    #[arg(long)]
    smtp_url: String,
    #[arg(long, value_parser = humantime::parse_duration)]
    lease_ttl: Duration,
    #[arg(long, value_parser = humantime::parse_duration)]
    heartbeat_every: Duration,
    #[arg(long, value_parser = humantime::parse_duration)]
    statement_timeout: Duration,
    #[arg(long, value_parser = humantime::parse_duration)]
    abandon_after: Duration,
    #[arg(long, value_parser = humantime::parse_duration)]
    max_poll: Duration,
    #[arg(long)]
    batch_size: i64,
    #[arg(long, value_parser = humantime::parse_duration)]
    decline_backoff: Duration,
    /// ROLE=DURATION, once per role.
    #[arg(long = "tick-interval", value_parser = tick_interval)]
    tick_intervals: Vec<(Role, Duration)>,
}

fn tick_interval(s: &str) -> Result<(Role, Duration), String> {
    let (role, every) = s.split_once('=').ok_or("expected ROLE=DURATION")?;
    let every = humantime::parse_duration(every).map_err(|e| e.to_string())?;
    Ok((Role::new(role).map_err(|e| e.to_string())?, every))
}

impl WorkerFlags {
    /// The replica's worker config: every role, mail from the chaos sender.
    pub fn config(self) -> anyhow::Result<WorkerConfig> {
        let lease = ticklease::Config::builder()
            .lease_ttl(self.lease_ttl)
            .heartbeat_every(self.heartbeat_every)
            .statement_timeout(self.statement_timeout)
            .abandon_after(self.abandon_after)
            .max_poll(self.max_poll)
            .build()?;
        let (host, port) = self
            .smtp_url
            .trim_start_matches("smtp://")
            .rsplit_once(':')
            .context("--smtp-url: expected smtp://host:port")?;
        Ok(WorkerConfig {
            database: self.database_url.parse()?,
            direct: self.direct_url.as_deref().map(str::parse).transpose()?,
            patroni: None,
            roles: ticklease_worker::ROLES
                .iter()
                .map(|r| Role::new(*r))
                .collect::<Result<_, _>>()?,
            schedules: self
                .tick_intervals
                .into_iter()
                .map(|(role, every)| (role, ticklease::Schedule::every(every)))
                .collect(),
            lease,
            payments_url: self.payments_url,
            smtp_host: host.to_string(),
            smtp_port: port.parse()?,
            mail_from: "chaos@ticklease.invalid".into(),
            webhook_secret: self.webhook_secret,
            metrics_addr: None,
            batch_size: self.batch_size,
            decline_backoff: self.decline_backoff,
        })
    }
}

async fn top_up(env: &Env, n: i64, endpoints: &[String]) -> anyhow::Result<()> {
    let mut c = connect(&env.cluster.config(&env.db)).await?;
    let seed = ticklease_worker::seed::Seed {
        subscriptions: n,
        emails: n,
        events: n,
        endpoints: endpoints.to_vec(),
    };
    ticklease_worker::seed::seed(&mut c, &seed).await?;
    Ok(())
}

/// Everything a run holds: the primary (`env.cluster`) and its node's
/// optional bouncer, the standby node, the writer endpoint, the peers, the
/// replicas on their links, the windows of whole-service restarts and
/// promotions, and the promotions' lost tails.
struct Stage {
    env: Env,
    http: HttpPeer,
    smtp: SmtpSink,
    endpoints: Vec<String>,
    pooled: bool,
    bouncer: Option<PgBouncer>,
    /// `None` only while a promotion runs.
    standby: Option<StandbyNode>,
    writer: WriterEndpoint,
    /// The primary's Postgres, for the coordination sessions.
    direct: WriterEndpoint,
    replicas: Vec<Replica>,
    coordination_kills: usize,
    restarts: Vec<(SystemTime, SystemTime)>,
    lost_tails: Vec<LostTail>,
    /// When the replicas were first spawned: the timeline's zero.
    started: SystemTime,
    /// Each replica process's pid and the replica's index, for the timeline.
    pids: Vec<(u32, usize)>,
    /// Each fault's instant and kind.
    faults: Vec<(SystemTime, &'static str)>,
}

/// A standby and, when pooled, the PgBouncer on its node (idle until the
/// node is promoted).
struct StandbyNode {
    server: Standby,
    bouncer: Option<PgBouncer>,
}

impl StandbyNode {
    /// A base backup of `primary`, streaming from it.
    fn start(primary: &PgCluster, pooled: bool) -> anyhow::Result<StandbyNode> {
        let server = tokio::task::block_in_place(|| Standby::start(primary))?;
        let bouncer = if pooled {
            Some(PgBouncer::start(server.cluster(), BOUNCER_POOL)?)
        } else {
            None
        };
        Ok(StandbyNode { server, bouncer })
    }
}

/// Where a node takes clients: its bouncer, or Postgres itself.
fn node_entry(server: &PgCluster, bouncer: Option<&PgBouncer>) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], bouncer.map_or(server.port(), PgBouncer::port)))
}

/// What a promotion with a lost tail leaves for the checker.
///
/// The checker reads the promoted server: the surviving timeline. The lost
/// tail's commits (claims, journal rows, terms, completion marks) never
/// happened there, so judging them would be judging a history nobody
/// continues; the peers, though, received the lost tail's effects. Every
/// completion a worker committed after the cut is lost, and a completion
/// commits after its effect, so whatever the peers received from the cut to
/// the switch is either the lost timeline's own effect or one the surviving
/// timeline still has pending and sends again: the audit leaves those
/// receipts out and judges the surviving timeline against what it sent.
/// The one thing carried over from the lost timeline is its tokens: the new
/// primary must issue tokens above them, or a leader of the lost tail,
/// reconnected, would pass the fence beside a new one.
struct LostTail {
    /// Per role, the token the old primary held when no client could reach it any more.
    tokens: Vec<(String, i64)>,
    /// ACQUIREs and fenced claims the old primary committed after the cut.
    acquires: i64,
    claims: i64,
    /// The writer endpoint led to the new primary from this instant.
    switched_at: SystemTime,
    /// The peers' receipts at the cut and at the switch.
    from: Marks,
    to: Marks,
}

/// How many webhooks, charges and emails the peers had received.
#[derive(Debug, Clone, Copy)]
struct Marks {
    hooks: usize,
    charges: usize,
    mails: usize,
}

impl Marks {
    fn now(http: &HttpPeer, smtp: &SmtpSink) -> Marks {
        let r = ticklease_sandbox::peers::received(http, smtp);
        Marks {
            hooks: r.hooks.len(),
            charges: r.charges.len(),
            mails: r.message_ids.len(),
        }
    }
}

/// Runs the chaos and checks the outcome.
pub async fn run(opts: &ChaosOptions) -> anyhow::Result<ChaosReport> {
    let started = Instant::now();
    let mut stage = Stage::start(opts).await?;
    let ttl = opts.timing.config().lease_ttl();
    let mut kinds: Vec<&'static str> = REPLICA_FAULTS.to_vec();
    kinds.push("pg_restart");
    if opts.pooled {
        kinds.push("bouncer_restart");
    }
    kinds.extend(["promote", "promote_lost_tail"]);
    let mut rng = StdRng::seed_from_u64(opts.seed);
    let mut report = ChaosReport {
        seed: opts.seed,
        ..ChaosReport::default()
    };
    let bar = crate::progress(opts.faults, "chaos faults");
    for k in 0..opts.faults {
        tokio::time::sleep(span(&mut rng, ttl, 0.2, 1.0)).await;
        // Every kind once first; then whole-service restarts are rare (one in twenty).
        let kind = match k {
            k if k < kinds.len() => kinds[k],
            _ if rng.gen_range(0..20) == 0 => kinds[rng.gen_range(REPLICA_FAULTS.len()..kinds.len())],
            _ => REPLICA_FAULTS[rng.gen_range(0..REPLICA_FAULTS.len())],
        };
        let i = rng.gen_range(0..stage.replicas.len());
        *report.faults.entry(kind).or_default() += 1;
        tracing::info!(k, kind, replica = i, "fault");
        bar.set_message(kind);
        stage.faults.push((SystemTime::now(), kind));
        stage.fault(kind, i, &mut rng).await?;
        bar.inc(1);
        if k % 5 == 4 {
            top_up(&stage.env, 2, &stage.endpoints).await?;
        }
    }
    bar.finish_and_clear();
    for r in &stage.replicas {
        r.set(Fault::Pass);
        signal(&r.child, Signal::SIGCONT);
    }
    report.coordination_kills = stage.coordination_kills;
    // The current primary: after a promotion, the surviving timeline.
    let db = connect(&stage.env.cluster.config(&stage.env.db)).await?;
    report.violations.extend(stage.drain(&db).await);
    report.violations.extend(stage.stop().await);
    check(&stage, &db, &mut report).await?;
    report.took = started.elapsed();
    Ok(report)
}

/// A random share of `ttl` between `lo` and `hi`.
fn span(rng: &mut StdRng, ttl: Duration, lo: f64, hi: f64) -> Duration {
    ttl.mul_f64(rng.gen_range(lo..hi))
}

impl Stage {
    /// The primary and its standby, the peers, a first load, the bouncers
    /// when pooled, the writer endpoint, and the replicas.
    async fn start(opts: &ChaosOptions) -> anyhow::Result<Stage> {
        let env = Env::on(PgCluster::start_primary()?, opts.timing, opts.exe.clone()).await?;
        let http = HttpPeer::start(0).await?;
        let smtp = SmtpSink::start().await?;
        let endpoints = vec![
            format!("{}/hooks/a", http.url()),
            format!("{}/hooks/b", http.url()),
        ];
        top_up(&env, 8, &endpoints).await?;
        let bouncer = if opts.pooled {
            Some(PgBouncer::start(&env.cluster, BOUNCER_POOL)?)
        } else {
            None
        };
        let standby = StandbyNode::start(&env.cluster, opts.pooled)?;
        let writer = WriterEndpoint::start(node_entry(&env.cluster, bouncer.as_ref())).await?;
        let direct = WriterEndpoint::start(node_entry(&env.cluster, None)).await?;
        let local = |port| SocketAddr::from(([127, 0, 0, 1], port));
        let mut replicas = Vec::new();
        let mut pids = Vec::new();
        let started = SystemTime::now();
        for i in 0..opts.replicas {
            let link = FaultProxy::start(local(writer.port())).await?;
            let direct_link = FaultProxy::start(local(direct.port())).await?;
            let child = spawn_worker(&env, (&link, &direct_link), &http, &smtp)?;
            pids.extend(child.id().map(|pid| (pid, i)));
            replicas.push(Replica {
                link,
                direct_link,
                child,
            });
        }
        Ok(Stage {
            env,
            http,
            smtp,
            endpoints,
            pooled: opts.pooled,
            bouncer,
            standby: Some(standby),
            writer,
            direct,
            replicas,
            coordination_kills: 0,
            restarts: Vec::new(),
            lost_tails: Vec::new(),
            started,
            pids,
            faults: Vec::new(),
        })
    }

    /// Injects one fault of `kind` into replica `i` (or the whole service).
    async fn fault(&mut self, kind: &str, i: usize, rng: &mut StdRng) -> anyhow::Result<()> {
        let ttl = self.env.timing.config().lease_ttl();
        match kind {
            "sigkill" | "sigterm" => {
                let r = &mut self.replicas[i];
                signal(
                    &r.child,
                    if kind == "sigkill" {
                        Signal::SIGKILL
                    } else {
                        Signal::SIGTERM
                    },
                );
                let _ = tokio::time::timeout(ttl * 5, r.child.wait()).await;
                r.child = spawn_worker(&self.env, (&r.link, &r.direct_link), &self.http, &self.smtp)?;
                self.pids.extend(r.child.id().map(|pid| (pid, i)));
            }
            "freeze" => {
                signal(&self.replicas[i].child, Signal::SIGSTOP);
                tokio::time::sleep(span(rng, ttl, 0.5, 2.0)).await;
                signal(&self.replicas[i].child, Signal::SIGCONT);
            }
            "blackhole" => {
                self.replicas[i].set(Fault::Blackhole);
                tokio::time::sleep(span(rng, ttl, 0.5, 2.0)).await;
                self.replicas[i].set(Fault::Pass);
            }
            "reset" => {
                self.replicas[i].set(Fault::Reset);
                tokio::time::sleep(Duration::from_millis(50)).await;
                self.replicas[i].set(Fault::Pass);
            }
            "coordination_kill" => {
                if self.end_a_holders_coordination_session().await? {
                    self.coordination_kills += 1;
                }
            }
            "bouncer_restart" => {
                let from = SystemTime::now();
                self.bouncer
                    .as_ref()
                    .context("bouncer restart without a bouncer")?
                    .restart()?;
                self.restarts.push((from, SystemTime::now()));
            }
            "pg_restart" => {
                let from = SystemTime::now();
                self.env.cluster.restart()?;
                self.restarts.push((from, SystemTime::now()));
            }
            "promote" => self.promote(false).await?,
            "promote_lost_tail" => self.promote(true).await?,
            other => bail!("unknown fault {other}"),
        }
        Ok(())
    }

    /// Promotes the standby and moves the writer endpoint to its node; then
    /// a new standby (and bouncer) from the new primary, for the next
    /// promotion.
    ///
    /// Without a lost tail: the standby catches up, the primary shuts down
    /// cleanly (its standby receives every WAL record first), the standby is
    /// promoted and the endpoint moves at once, a switchover. With one: the
    /// standby's WAL receipt is cut, the workers commit on the primary until
    /// an ACQUIRE and a fenced claim are among those commits, then the
    /// address leaves the primary and it crashes: everything since the cut is
    /// lost.
    async fn promote(&mut self, lost_tail: bool) -> anyhow::Result<()> {
        let config = self.env.timing.config();
        let node = self.standby.take().context("no standby to promote")?;
        let from = SystemTime::now();
        let old = connect(&self.env.cluster.config(&self.env.db)).await?;
        let cut = if lost_tail {
            // Work for the tail, which the standby has before its cut.
            top_up(&self.env, 2, &self.endpoints).await?;
            node.server.wait_caught_up(&self.env.cluster).await?;
            node.server.cut_wal_receipt().await?;
            let at = SystemTime::now();
            let marks = Marks::now(&self.http, &self.smtp);
            wait_for_lost_work(&old, at, config.lease_ttl() * 10).await?;
            Some((at, marks))
        } else {
            node.server.wait_caught_up(&self.env.cluster).await?;
            None
        };
        // No client reaches the old primary from here: what it holds now is
        // all the lost tail holds, and no tick's beat is acknowledged after `down`.
        self.writer.point(None);
        self.direct.point(None);
        let down = Instant::now();
        let lost = match cut {
            Some((at, marks)) => {
                let tokens = old
                    .query_typed("SELECT role, holder_token FROM leader_leases", &[])
                    .await?
                    .iter()
                    .map(|r| (r.get(0), r.get(1)))
                    .collect();
                let commits = lost_commits(&old, at).await?;
                tokio::task::block_in_place(|| self.env.cluster.stop());
                Some((tokens, commits, marks))
            }
            None => {
                tokio::task::block_in_place(|| self.env.cluster.stop_fast());
                None
            }
        };
        drop(old);
        node.server.promote().await?;
        let lost = match lost {
            Some((tokens, commits, from)) => {
                // The failover's detection time, as an HA manager waits out
                // the old primary's leader key: by now every tick of the lost
                // timeline was abandoned (abandon-after its last acknowledged
                // beat, before `down`) and what it had sent has arrived, so
                // the peers' receipts after the switch are the surviving
                // timeline's.
                let settled = down + config.abandon_after() + config.statement_timeout();
                tokio::time::sleep_until(settled.into()).await;
                Some((tokens, commits, from, Marks::now(&self.http, &self.smtp)))
            }
            None => None,
        };
        let retired = (
            std::mem::replace(&mut self.env.cluster, node.server.into_cluster()),
            std::mem::replace(&mut self.bouncer, node.bouncer),
        );
        self.writer
            .point(Some(node_entry(&self.env.cluster, self.bouncer.as_ref())));
        self.direct.point(Some(node_entry(&self.env.cluster, None)));
        let switched_at = SystemTime::now();
        tokio::task::block_in_place(|| drop(retired));
        self.restarts.push((from, switched_at));
        if let Some((tokens, (acquires, claims), from, to)) = lost {
            self.lost_tails.push(LostTail {
                tokens,
                acquires,
                claims,
                switched_at,
                from,
                to,
            });
        }
        self.standby = Some(StandbyNode::start(&self.env.cluster, self.pooled)?);
        Ok(())
    }

    /// Ends the coordination session of a holder picked at random: the
    /// backend holding (`ExclusiveLock`, the session's lock) the advisory key
    /// its term recorded in `leader_leases`. The holder runs on; its term is
    /// acquirable at once. A worker's tick is short, so a role is held only
    /// now and then: polled for up to two TTLs (the database has no
    /// notification for it). Whether a session was found and ended.
    async fn end_a_holders_coordination_session(&self) -> anyhow::Result<bool> {
        let ttl = self.env.timing.config().lease_ttl();
        let db = connect(&self.env.cluster.config(&self.env.db)).await?;
        let started = Instant::now();
        loop {
            let ended = db
                .query_typed(
                    "SELECT pg_terminate_backend(l.pid)
                       FROM leader_leases r
                       JOIN pg_locks l
                         ON l.locktype = 'advisory' AND l.mode = 'ExclusiveLock' AND l.granted
                        AND l.objsubid = 1
                        AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
                        AND (l.classid::bigint << 32) | l.objid::bigint = r.holder_key
                      WHERE r.holder_id IS NOT NULL
                      ORDER BY random() LIMIT 1",
                    &[],
                )
                .await?;
            if ended.first().is_some_and(|r| r.get::<_, bool>(0)) {
                return Ok(true);
            }
            if started.elapsed() > ttl * 2 {
                return Ok(false);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// Waits for the load to be worked off; a violation if it is not in time.
    async fn drain(&self, db: &tokio_postgres::Client) -> Option<String> {
        let ttl = self.env.timing.config().lease_ttl();
        let deadline = Instant::now() + ttl * 60 + Duration::from_secs(60);
        loop {
            let pending: i64 = scalar(
                db,
                "SELECT (SELECT count(*) FROM subscriptions WHERE next_billing_at <= now())
                      + (SELECT count(*) FROM dunning_runs WHERE state = 'active')
                      + (SELECT count(*) FROM webhook_events WHERE dispatched_at IS NULL)
                      + (SELECT count(*) FROM webhook_deliveries WHERE status <> 'delivered')
                      + (SELECT count(*) FROM email_outbox WHERE status <> 'sent')",
            )
            .await;
            if pending == 0 {
                return None;
            }
            if Instant::now() > deadline {
                return Some(format!("{pending} items still pending after the faults stopped"));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// SIGTERMs every replica; a violation for each one that does not exit.
    async fn stop(&mut self) -> Vec<String> {
        let ttl = self.env.timing.config().lease_ttl();
        for r in &self.replicas {
            signal(&r.child, Signal::SIGTERM);
        }
        let mut stuck = Vec::new();
        for r in &mut self.replicas {
            if tokio::time::timeout(ttl * 5, r.child.wait()).await.is_err() {
                stuck.push("a replica did not exit after SIGTERM".to_string());
            }
        }
        stuck
    }
}

/// The ACQUIREs and the fenced claims `old` committed after `cut`.
async fn lost_commits(old: &Client, cut: SystemTime) -> anyhow::Result<(i64, i64)> {
    let row = &old
        .query_typed(
            "SELECT (SELECT count(*) FROM lease_history
                      WHERE at > $1 AND new_token <> old_token AND new_holder IS NOT NULL),
                    (SELECT count(*) FROM worker_journal WHERE at > $1)",
            &[(&cut, Type::TIMESTAMPTZ)],
        )
        .await?[0];
    Ok((row.get(0), row.get(1)))
}

/// Waits until the primary `old`, whose standby stopped receiving at `cut`,
/// has committed an ACQUIRE and a fenced claim since: a lost tail with a
/// term and work in it. Polled: the database has no notification for it.
async fn wait_for_lost_work(old: &Client, cut: SystemTime, within: Duration) -> anyhow::Result<()> {
    let started = Instant::now();
    loop {
        if let (1.., 1..) = lost_commits(old, cut).await? {
            return Ok(());
        }
        if started.elapsed() > within {
            bail!("no ACQUIRE and claim on the primary within {within:?} of cutting its standby off");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Takes what the peers received during the lost tails out of `received`
/// (see [`LostTail`]); returns how many receipts that was and the
/// identifiers the surviving timeline sent again with another body.
fn without_lost_tails(received: &mut Received, tails: &[LostTail]) -> (usize, Vec<String>) {
    let windows = |of: fn(&Marks) -> usize| -> Vec<Range<usize>> {
        tails.iter().map(|t| of(&t.from)..of(&t.to)).collect()
    };
    let (hooks, lost_hooks) = split(std::mem::take(&mut received.hooks), &windows(|m| m.hooks));
    let (charges, lost_charges) = split(std::mem::take(&mut received.charges), &windows(|m| m.charges));
    let (mails, lost_mails) = split(std::mem::take(&mut received.message_ids), &windows(|m| m.mails));
    let mut reused: Vec<String> = lost_hooks
        .iter()
        .filter(|(path, id, body)| hooks.iter().any(|(p, i, b)| p == path && i == id && b != body))
        .map(|(path, id, _)| format!("webhook-id {id} at {path}"))
        .collect();
    reused.extend(
        lost_charges
            .iter()
            .filter(|c| charges.iter().any(|k| k.key == c.key && k.body != c.body))
            .map(|c| format!("idempotency key {}", c.key)),
    );
    reused.sort();
    reused.dedup();
    (received.hooks, received.charges, received.message_ids) = (hooks, charges, mails);
    (lost_hooks.len() + lost_charges.len() + lost_mails.len(), reused)
}

/// `items` outside `windows` (by position), and those inside.
fn split<T>(items: Vec<T>, windows: &[Range<usize>]) -> (Vec<T>, Vec<T>) {
    let (inside, outside): (Vec<_>, Vec<_>) = items
        .into_iter()
        .enumerate()
        .partition(|(i, _)| windows.iter().any(|w| w.contains(i)));
    let strip = |v: Vec<(usize, T)>| v.into_iter().map(|(_, t)| t).collect();
    (strip(outside), strip(inside))
}

async fn check(stage: &Stage, db: &tokio_postgres::Client, report: &mut ChaosReport) -> anyhow::Result<()> {
    let config = stage.env.timing.config();
    let restarts = &stage.restarts;
    let mut received = ticklease_sandbox::peers::received(&stage.http, &stage.smtp);
    (report.lost_tail_receipts, report.reused_ids) = without_lost_tails(&mut received, &stage.lost_tails);
    let audit =
        ticklease_sandbox::audit::audit(db, &received, &["/hooks/a".to_string(), "/hooks/b".to_string()])
            .await?;
    let v = &mut report.violations;
    v.extend(audit.violations.iter().map(ToString::to_string));

    // Tokens across each lost tail: the first term the new primary issued
    // for a role is above the last one the lost timeline issued.
    for tail in &stage.lost_tails {
        report.lost_acquires += tail.acquires;
        report.lost_claims += tail.claims;
        for (role, lost) in &tail.tokens {
            let first: Option<i64> = db
                .query_typed(
                    "SELECT min(new_token) FROM lease_history
                      WHERE role = $1 AND at >= $2 AND new_token <> old_token AND new_holder IS NOT NULL",
                    &[(role, Type::TEXT), (&tail.switched_at, Type::TIMESTAMPTZ)],
                )
                .await?[0]
                .get(0);
            if let Some(token) = first.filter(|t| t <= lost) {
                v.push(format!(
                    "token reused across a lost tail: {role} got token {token} on the new primary, \
                     not above {lost} from the lost timeline"
                ));
            }
        }
    }

    // Leadership gaps: consecutive term starts per role, outside Postgres restarts.
    let interval = config.max_poll();
    let bound = config.lease_ttl()
        + config.statement_timeout()
        + config.max_poll()
        + interval
        + Duration::from_millis(1500);
    report.gap_bound_ms = bound.as_secs_f64() * 1000.0;
    let rows = db
        .query_typed(
            "SELECT role, at FROM lease_history WHERE new_token <> old_token AND new_holder IS NOT NULL ORDER BY role, at",
            &[],
        )
        .await?;
    let mut last: BTreeMap<String, SystemTime> = BTreeMap::new();
    for r in &rows {
        let (role, at): (String, SystemTime) = (r.get(0), r.get(1));
        if let Some(prev) = last.insert(role.clone(), at) {
            let during_restart = restarts
                .iter()
                .any(|(from, to)| prev <= *to + config.lease_ttl() * 2 && at >= *from);
            let gap = at.duration_since(prev).unwrap_or_default();
            if !during_restart {
                let max = report.max_gap_ms.entry(role.clone()).or_default();
                *max = max.max(gap.as_secs_f64() * 1000.0);
                if gap > bound {
                    let gap = Violation::LeaderlessGap {
                        role: role.clone(),
                        gap,
                        bound,
                        after: prev,
                    };
                    v.push(gap.to_string());
                }
            }
        }
    }
    report.terms = rows.len() as i64;
    report.timeline = timeline(stage, db).await?;
    report.journal_claims = scalar(db, "SELECT count(*) FROM worker_journal").await;
    Ok(())
}

/// The terms of every role on the surviving timeline and the faults, for the plot.
///
/// A term runs from the row that gave its holder a new token to the next row
/// that changed the token or the holder (a release, an expiry taken over),
/// or to now. Its replica is the one whose process id is in the holder id
/// (`host:pid:nonce`).
async fn timeline(stage: &Stage, db: &Client) -> anyhow::Result<Timeline> {
    let secs = |t: SystemTime| t.duration_since(stage.started).unwrap_or_default().as_secs_f64();
    let roles: Vec<String> = ticklease_worker::ROLES.iter().map(|r| r.to_string()).collect();
    let replica = |holder: &str| {
        let pid = holder.parse::<ticklease::HolderId>().ok()?.pid();
        stage.pids.iter().find(|(p, _)| *p == pid).map(|(_, i)| *i)
    };
    let rows = db
        .query_typed(
            "SELECT role, at, old_token, new_token, new_holder FROM lease_history ORDER BY role, at, id",
            &[],
        )
        .await?;
    let now = secs(SystemTime::now());
    let mut terms = Vec::new();
    // Per role: the open term's start, token and holder.
    let mut open: BTreeMap<String, (f64, i64, String)> = BTreeMap::new();
    for r in &rows {
        let (role, at, old, new, holder): (String, SystemTime, i64, i64, Option<String>) =
            (r.get(0), r.get(1), r.get(2), r.get(3), r.get(4));
        let Some(row) = roles.iter().position(|x| *x == role) else {
            continue;
        };
        let at = secs(at);
        if let Some((from, token, h)) = open.get(&role) {
            if *token != new || holder.as_deref() != Some(h.as_str()) {
                terms.push(plot::Bar {
                    row,
                    from: *from,
                    to: at,
                    replica: replica(h),
                });
                open.remove(&role);
            }
        }
        if let Some(h) = holder {
            if new != old || !open.contains_key(&role) {
                open.entry(role).or_insert((at, new, h));
            }
        }
    }
    for (role, (from, _, h)) in open {
        if let Some(row) = roles.iter().position(|x| *x == role) {
            terms.push(plot::Bar {
                row,
                from,
                to: now,
                replica: replica(&h),
            });
        }
    }
    Ok(Timeline {
        roles,
        replicas: stage.replicas.len(),
        terms,
        faults: stage
            .faults
            .iter()
            .map(|(at, kind)| plot::FaultMark {
                at: secs(*at),
                label: kind.to_string(),
            })
            .collect(),
    })
}
