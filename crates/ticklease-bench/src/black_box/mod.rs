//! The black-box check (`docs/black-box.md`): N replica processes of a
//! client given as a command, driven through faults on an interval role
//! (SIGKILL, SIGSTOP past the lease, a claim held past its term, RENEWs
//! refused, a claim's session ended, a pause, a cut link, a Postgres
//! restart, an immediate stop) and a run-now between the occurrences of a
//! cron role; after each fault checked from the database alone: terms never
//! overlap, no claim committed twice, outside its term or while paused, a
//! completed term made all of its claims, no tick or occurrence missed, and
//! each takeover within its bound.

pub mod bench;
pub mod checks;
pub mod client;
pub mod contract;
pub mod cron;
pub mod db;
pub mod faults;
pub mod held;
pub mod replicas;
pub mod server;

use std::time::{Duration, UNIX_EPOCH};

use anyhow::Context as _;

pub use contract::{ScheduleSpec, Timings};
pub use faults::{Fault, Outcome};

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
    /// Each fault, with what the checks first found after it.
    pub outcomes: Vec<Outcome>,
    /// Every violation: the faults' (each once), then those of no fault
    /// (before the first, a replica that did not exit 0 on SIGTERM).
    pub violations: Vec<String>,
    /// The last lines of each replica's output (escaped).
    pub tails: String,
}

impl Report {
    pub fn summary(&self) -> String {
        let lines: Vec<String> = self.outcomes.iter().map(Outcome::line).collect();
        format!("{}: {}", self.client, lines.join("; "))
    }

    /// Violations charged to no fault.
    pub fn unattributed(&self) -> usize {
        let of_faults: usize = self.outcomes.iter().map(|o| o.violations.len()).sum();
        self.violations.len().saturating_sub(of_faults)
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
    let mut other = interval(&db, client, timings, dir.path(), &Fault::ALL, &mut report).await?;
    other.extend(cron_role(&db, client, timings, dir.path(), &mut report).await?);
    report.violations = report
        .outcomes
        .iter()
        .flat_map(|o| o.violations.iter().cloned())
        .chain(other)
        .collect();
    Ok(report)
}

/// `faults` alone on the interval role, stopping after the first that
/// finds a violation: how the tests show that a client breaking the
/// contract is caught, in seconds rather than a full check.
pub async fn faults_alone(
    client: &ClientUnderCheck,
    timings: Timings,
    faults: &[Fault],
) -> anyhow::Result<Report> {
    let db = Db::start().await?;
    let dir = tempfile::tempdir()?;
    let role = "outbox";
    let schedule = ScheduleSpec::Every(INTERVAL);
    let replicas = start_replicas(&db, client, role, &schedule, timings, dir.path()).await?;
    let mut run = Run::new(&db, replicas, role, timings, &client.name);
    let faults = async {
        run.settle(UNIX_EPOCH).await?;
        for fault in faults {
            fault.inject(&mut run).await?;
            if run.outcomes.last().is_some_and(|o| !o.violations.is_empty()) {
                break;
            }
        }
        anyhow::Ok(())
    }
    .await;
    let tails = run.replicas.tails();
    faults.with_context(|| format!("{}: {tails}", client.name))?;
    run.replicas.stop(Duration::from_secs(10)).await;
    let violations = run.outcomes.iter().flat_map(|o| o.violations.clone()).collect();
    Ok(Report {
        client: client.name.clone(),
        outcomes: run.outcomes,
        violations,
        tails,
    })
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

/// The interval role through `faults`, each checked as it ends; returns
/// the violations of no fault (the last checks, before the first fault, the
/// exits).
async fn interval(
    db: &Db,
    client: &ClientUnderCheck,
    timings: Timings,
    dir: &std::path::Path,
    faults: &[Fault],
    report: &mut Report,
) -> anyhow::Result<Vec<String>> {
    let role = "outbox";
    let schedule = ScheduleSpec::Every(INTERVAL);
    eprintln!(
        "black-box {}: interval role, {} faults",
        client.name,
        faults.len()
    );
    let replicas = start_replicas(db, client, role, &schedule, timings, &dir.join("interval")).await?;
    let mut run = Run::new(db, replicas, role, timings, &client.name);
    let injected = async {
        run.settle(UNIX_EPOCH).await?;
        for fault in faults {
            fault.inject(&mut run).await?;
        }
        anyhow::Ok(())
    }
    .await;
    let tails = run.replicas.tails();
    injected.with_context(|| format!("{} (interval role): {tails}", client.name))?;
    run.end(db.now().await?);
    let mut other = run.replicas.stop(Duration::from_secs(10)).await;
    other.extend(run.new_violations().await?);
    let longest = INTERVAL + timings.work + timings.lease_ttl;
    let gaps = checks::gaps(&db.owner().await?, role, &run.steady, longest).await?;
    for (from, gap) in gaps {
        // A gap belongs to the fault before its window.
        match run.outcomes.iter_mut().rev().find(|o| o.at <= from) {
            Some(o) => o.violations.push(gap),
            None => other.push(gap),
        }
    }
    report.outcomes.append(&mut run.outcomes);
    report.tails.push_str(&format!("=== interval role\n{tails}"));
    Ok(other)
}

/// The cron role with a run-now, then its checks (charged to the run-now);
/// returns the replicas that did not exit 0.
async fn cron_role(
    db: &Db,
    client: &ClientUnderCheck,
    timings: Timings,
    dir: &std::path::Path,
    report: &mut Report,
) -> anyhow::Result<Vec<String>> {
    let role = "billing";
    let schedule = ScheduleSpec::Cron(cron::expression());
    eprintln!("black-box {}: cron role", client.name);
    let mut replicas = start_replicas(db, client, role, &schedule, timings, &dir.join("cron")).await?;
    let outcome = cron::run(db, role, timings).await;
    let tails = replicas.tails();
    let (mut outcome, from) = outcome.with_context(|| format!("{} (cron role): {tails}", client.name))?;
    let other = replicas.stop(Duration::from_secs(10)).await;
    let owner = db.owner().await?;
    outcome.violations.extend(checks::all(&owner, role).await?);
    let late = timings.max_poll + Duration::from_millis(1500);
    outcome
        .violations
        .extend(cron::check(db, role, from, late).await?);
    eprintln!("black-box {}: {}", client.name, outcome.line());
    report.outcomes.push(outcome);
    report.tails.push_str(&format!("=== cron role\n{tails}"));
    Ok(other)
}
