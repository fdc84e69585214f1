//! The cron scenario: replicas lead a role on a schedule with an
//! occurrence every few seconds; an operator's run-now falls between two
//! occurrences. Every occurrence must run once, the run-now once more.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::contract::Timings;
use super::db::{ms_between, Db};
use super::faults::Outcome;

/// Seconds between two occurrences (divides a minute): room for an
/// occurrence's work and a manual run's between two.
pub const EVERY_S: u64 = 5;

/// The schedule, six fields, seconds first.
pub fn expression() -> String {
    format!("*/{EVERY_S} * * * * *")
}

/// How many occurrences the scenario watches after the run-now.
const OCCURRENCES_AFTER: u64 = 2;

/// The occurrence at or before `at`.
fn occurrence_of(at: SystemTime) -> u64 {
    let s = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
    s - s % EVERY_S
}

/// Runs the scenario on replicas already started; returns the run-now's
/// outcome and the first occurrence checked. A new role's first look runs
/// the latest occurrence of the last minute at once (late, by design), and
/// the next may wait for it: the check starts two occurrences later.
pub async fn run(db: &Db, role: &str, timings: Timings) -> anyhow::Result<(Outcome, u64)> {
    let first = db
        .settle(role, UNIX_EPOCH, 1, Duration::from_secs(EVERY_S * 3 + 10))
        .await?;
    let checked_from = occurrence_of(first) + 2 * EVERY_S;
    // After that occurrence's work, before the next occurrence.
    let run_now_at =
        UNIX_EPOCH + Duration::from_secs(checked_from) + timings.work + Duration::from_millis(500);
    sleep_until(db, run_now_at).await?;
    let owner = db.owner().await?;
    let before: i64 = owner
        .query_one(
            "SELECT coalesce(max(token), 0) FROM blackbox_claims WHERE role = $1",
            &[&role],
        )
        .await?
        .get(0);
    let at: SystemTime = owner.query_one("SELECT clock_timestamp()", &[]).await?.get(0);
    owner.execute("SELECT leader_run_now($1)", &[&role]).await?;
    owner
        .execute("SELECT pg_notify('ticklease', 'run_now ' || $1)", &[&role])
        .await?;
    let bound = timings.max_poll + Duration::from_secs(1);
    let claim = db.wait_claim_after(role, before, at, bound * 2).await?;
    let end =
        UNIX_EPOCH + Duration::from_secs(checked_from + EVERY_S * (OCCURRENCES_AFTER + 1)) + timings.work;
    sleep_until(db, end + Duration::from_millis(500)).await?;
    let outcome = Outcome::new("run-now", at, claim, bound);
    Ok((outcome, checked_from))
}

/// Sleeps until `at` on the database clock.
async fn sleep_until(db: &Db, at: SystemTime) -> anyhow::Result<()> {
    tokio::time::sleep(at.duration_since(db.now().await?).unwrap_or_default()).await;
    Ok(())
}

/// After the replicas stopped: exactly one manual term, and every
/// occurrence from `from` to the last ran in exactly one term that claimed
/// within `late` of it.
pub async fn check(db: &Db, role: &str, from: u64, late: Duration) -> anyhow::Result<Vec<String>> {
    let owner = db.owner().await?;
    let manual: i64 = owner
        .query_one(
            "SELECT count(*) FROM leader_history WHERE role = $1 AND kind = 'term' AND by IS NOT NULL",
            &[&role],
        )
        .await?
        .get(0);
    let mut out = Vec::new();
    if manual != 1 {
        out.push(format!("{role}: {manual} manual terms for one run-now"));
    }
    // Each non-manual term: the occurrence it ran (as its row named it when
    // it claimed; NULL when a claim named none) and its first claim.
    let rows = owner
        .query(
            "SELECT CASE WHEN count(c.occurrence) = count(*) THEN min(c.occurrence) END, max(c.occurrence),
                    min(c.at) FROM blackbox_claims AS c
               JOIN leader_history AS h ON h.role = c.role AND h.token = c.token AND h.kind = 'term'
              WHERE c.role = $1 AND h.by IS NULL GROUP BY c.token ORDER BY 1, 3",
            &[&role],
        )
        .await?;
    let mut expected = from;
    let mut firsts = 0;
    for r in &rows {
        let (ran, ran_too, first): (Option<SystemTime>, Option<SystemTime>, SystemTime) =
            (r.get(0), r.get(1), r.get(2));
        let Some(ran) = ran.filter(|_| ran == ran_too) else {
            out.push(format!(
                "{role}: a term's claims name occurrences {ran:?} .. {ran_too:?}"
            ));
            continue;
        };
        let o = occurrence_of(ran);
        if o < from {
            continue;
        }
        let after = ms_between(first, ran);
        if expected != o || after > late.as_secs_f64() * 1000.0 {
            out.push(format!(
                "{role}: occurrence {expected} expected, the term of {o} claimed {after:.0} ms after it"
            ));
        }
        expected = o + EVERY_S;
        firsts += 1;
    }
    if firsts < OCCURRENCES_AFTER + 1 {
        out.push(format!("{role}: only {firsts} occurrence(s) ran"));
    }
    Ok(out)
}
