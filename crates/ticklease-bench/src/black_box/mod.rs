//! The black-box check (`docs/black-box.md`): N replica processes of a
//! client given as a command, driven through SIGKILL, SIGSTOP past the
//! lease, a pause, a cut link and a Postgres restart on an interval role,
//! and a run-now between the occurrences of a cron role; then checked from
//! the database alone: terms never overlap, no claim committed twice,
//! outside its term or while paused, no tick or occurrence missed, and each
//! takeover within its bound.

pub mod bench;
pub mod checks;
pub mod client;
pub mod contract;
pub mod cron;
pub mod db;
pub mod faults;
pub mod replicas;

use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context as _;

pub use contract::{ScheduleSpec, Timings};
pub use faults::Outcome;

use db::Db;
use faults::Run;
use replicas::Replicas;

/// Replicas of the client under check, in each scenario.
pub const REPLICAS: usize = 3;

/// The interval role's interval.
pub const INTERVAL: Duration = Duration::from_millis(200);

/// A client: a name for reports and the command line that starts one
/// replica (run by `sh -c "exec …"`), with variables of its own.
#[derive(Debug, Clone)]
pub struct ClientUnderCheck {
    pub name: String,
    pub command: String,
    pub env: Vec<(String, String)>,
}

/// What one check of one client found.
#[derive(Debug)]
pub struct Report {
    pub client: String,
    pub outcomes: Vec<Outcome>,
    /// Every invariant broken, every bound missed, every replica that did not exit 0 on SIGTERM.
    pub violations: Vec<String>,
    /// The last lines of each replica's output.
    pub tails: String,
}

impl Report {
    pub fn summary(&self) -> String {
        let mut out = format!("{}:", self.client);
        for o in &self.outcomes {
            let took = o.to_claim_ms.map_or("never".into(), |ms| format!("{ms:.0} ms"));
            out.push_str(&format!(
                " {} → claim {took} (bound {:.0} ms);",
                o.fault, o.bound_ms
            ));
        }
        out
    }
}

/// Runs both scenarios for `client` on a Postgres of their own.
pub async fn check(client: &ClientUnderCheck, timings: Timings) -> anyhow::Result<Report> {
    let db = Db::start().await?;
    let dir = tempfile::tempdir()?;
    let mut report = Report {
        client: client.name.clone(),
        outcomes: Vec::new(),
        violations: Vec::new(),
        tails: String::new(),
    };
    interval(&db, client, timings, dir.path(), &mut report).await?;
    cron_role(&db, client, timings, dir.path(), &mut report).await?;
    for o in &report.outcomes {
        if o.to_claim_ms.is_none_or(|ms| ms > o.bound_ms) {
            report.violations.push(format!(
                "{}: {} → next claim {:?} ms, bound {:.0} ms",
                client.name, o.fault, o.to_claim_ms, o.bound_ms
            ));
        }
    }
    Ok(report)
}

/// The SIGSTOP fault alone on the interval role, and the invariants'
/// violations: how the tests show that a client breaking the contract is caught.
pub async fn stop_fault_alone(client: &ClientUnderCheck, timings: Timings) -> anyhow::Result<Vec<String>> {
    let db = Db::start().await?;
    let dir = tempfile::tempdir()?;
    let role = "outbox";
    let schedule = ScheduleSpec::Every(INTERVAL);
    let replicas = start_replicas(&db, client, role, &schedule, timings, dir.path()).await?;
    let mut run = Run::new(&db, replicas, role, timings);
    run.settle(UNIX_EPOCH).await?;
    run.stop().await?;
    // The stopped holder's work goes on once it resumes: give it its wait.
    tokio::time::sleep(timings.work * 2).await;
    run.replicas.stop(Duration::from_secs(10)).await;
    checks::invariants(&db.owner().await?, role).await
}

/// Starts the replicas of `client` leading `role` on `schedule`.
async fn start_replicas(
    db: &Db,
    client: &ClientUnderCheck,
    role: &str,
    schedule: &ScheduleSpec,
    timings: Timings,
    dir: &std::path::Path,
) -> anyhow::Result<Replicas> {
    let env = replica_env(client, role, schedule, timings);
    let port = db.cluster.port();
    Replicas::start(REPLICAS, &client.command, env, port, &db.name, dir).await
}

fn replica_env(
    client: &ClientUnderCheck,
    role: &str,
    schedule: &ScheduleSpec,
    timings: Timings,
) -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = timings
        .to_env()
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
    env.push(("TICKLEASE_ROLE".into(), role.into()));
    env.push(("TICKLEASE_SCHEDULE".into(), schedule.to_env()));
    env.extend(client.env.iter().cloned());
    env
}

/// The interval role through every fault, then its checks.
async fn interval(
    db: &Db,
    client: &ClientUnderCheck,
    timings: Timings,
    dir: &std::path::Path,
    report: &mut Report,
) -> anyhow::Result<()> {
    let role = "outbox";
    let schedule = ScheduleSpec::Every(INTERVAL);
    let replicas = start_replicas(db, client, role, &schedule, timings, &dir.join("interval")).await?;
    let mut run = Run::new(db, replicas, role, timings);
    let faults = async {
        run.settle(UNIX_EPOCH).await?;
        run.kill().await?;
        run.stop().await?;
        run.pause().await?;
        run.cut().await?;
        run.restart().await
    }
    .await;
    let tails = run.replicas.tails();
    faults.with_context(|| format!("{} (interval role): {tails}", client.name))?;
    run.end(db.now().await?);
    report
        .violations
        .extend(run.replicas.stop(Duration::from_secs(10)).await);
    let owner = db.owner().await?;
    report.violations.extend(checks::invariants(&owner, role).await?);
    let longest = INTERVAL + timings.work + timings.lease_ttl;
    report
        .violations
        .extend(checks::gaps(&owner, role, &run.steady, longest).await?);
    report.outcomes.append(&mut run.outcomes);
    report.tails.push_str(&tails);
    Ok(())
}

/// The cron role with a run-now, then its checks.
async fn cron_role(
    db: &Db,
    client: &ClientUnderCheck,
    timings: Timings,
    dir: &std::path::Path,
    report: &mut Report,
) -> anyhow::Result<()> {
    let role = "billing";
    let schedule = ScheduleSpec::Cron(cron::expression());
    let mut replicas = start_replicas(db, client, role, &schedule, timings, &dir.join("cron")).await?;
    let outcome = cron::run(db, role, timings).await;
    let tails = replicas.tails();
    let (outcome, from) = outcome.with_context(|| format!("{} (cron role): {tails}", client.name))?;
    report
        .violations
        .extend(replicas.stop(Duration::from_secs(10)).await);
    let owner = db.owner().await?;
    report.violations.extend(checks::invariants(&owner, role).await?);
    report
        .violations
        .extend(cron::check(db, role, from, timings.max_poll + Duration::from_millis(1500)).await?);
    report.outcomes.push(outcome);
    report.tails.push_str(&tails);
    Ok(())
}
