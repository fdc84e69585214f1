//! What the harness does on the server around a client's statements,
//! without anything from the client: it holds a claim between its fence and
//! its COMMIT, refuses the app's RENEWs, and records what was acknowledged
//! before a stop so the check can see that nothing vanished.

use std::time::{Duration, SystemTime};

use tokio_postgres::Client;

/// The harness's own objects beside the claims table, created by the schema
/// owner. A claim row whose (role, token) is armed in `blackbox_hold` waits
/// in a BEFORE INSERT trigger: the trigger runs after the statement's fence
/// (the fence is an uncorrelated InitPlan, run before the first row), so the
/// claim has passed its fence and not yet committed. It waits while its term
/// is live (`until_over`) or until the deadline: a client that sends its
/// COMMIT as soon as the INSERT returns then commits after its term ended,
/// unless the fence's commit check refuses it. Reading the lease row takes
/// no lock, so the hold never delays a pause or a takeover.
pub const HOLD: &str = "
CREATE TABLE blackbox_hold (role text PRIMARY KEY, token bigint NOT NULL, until_over boolean NOT NULL,
                            deadline timestamptz NOT NULL);
CREATE FUNCTION blackbox_hold_claim() RETURNS trigger LANGUAGE plpgsql SECURITY DEFINER
SET search_path FROM CURRENT AS $fn$
DECLARE
    h blackbox_hold;
BEGIN
    SELECT * INTO h FROM blackbox_hold WHERE role = NEW.role AND token = NEW.token;
    IF NOT FOUND THEN
        RETURN NEW;
    END IF;
    WHILE clock_timestamp() < h.deadline
      AND (NOT h.until_over OR EXISTS (
            SELECT 1 FROM leader_leases AS l
             WHERE l.role = NEW.role AND l.holder_token = NEW.token AND l.holder_id IS NOT NULL
               AND l.paused_at IS NULL AND l.expires_at > clock_timestamp())) LOOP
        PERFORM pg_sleep(0.002);
    END LOOP;
    RETURN NEW;
END
$fn$;
CREATE TRIGGER blackbox_hold BEFORE INSERT ON blackbox_claims FOR EACH ROW EXECUTE FUNCTION blackbox_hold_claim();";

/// Arms the hold for the next claims of `(role, token)`, up to `longest`.
pub async fn arm(
    owner: &Client,
    role: &str,
    token: i64,
    until_over: bool,
    longest: Duration,
) -> anyhow::Result<()> {
    let ms = longest.as_millis() as f64;
    owner
        .execute(
            "INSERT INTO blackbox_hold VALUES ($1, $2, $3, clock_timestamp() + $4 * interval '1 ms')
             ON CONFLICT (role) DO UPDATE SET token = $2, until_over = $3, deadline = excluded.deadline",
            &[&role, &token, &until_over, &ms],
        )
        .await?;
    Ok(())
}

pub async fn disarm(owner: &Client, role: &str) -> anyhow::Result<()> {
    owner
        .execute("DELETE FROM blackbox_hold WHERE role = $1", &[&role])
        .await?;
    Ok(())
}

/// The backend of a claim waiting in the hold, if one is.
pub async fn held_claim(owner: &Client) -> anyhow::Result<Option<i32>> {
    let row = owner
        .query_opt(
            "SELECT pid FROM pg_stat_activity
              WHERE usename = 'blackbox_app' AND wait_event = 'PgSleep' AND query ILIKE '%blackbox_claims%' LIMIT 1",
            &[],
        )
        .await?;
    Ok(row.map(|r| r.get(0)))
}

/// Refuses (or allows again) every RENEW of the app role: EXECUTE on each
/// `leader_renew*` function revoked from `ticklease_app`. The RENEW then
/// fails at once with `42501`, a missed beat, while ACQUIRE, RELEASE, the
/// fence and the claims still work: the holder's heartbeat fails while its
/// work's claims still reach the server.
pub async fn refuse_renew(owner: &Client, refuse: bool) -> anyhow::Result<()> {
    let verb = if refuse { "REVOKE" } else { "GRANT" };
    let to = if refuse { "FROM" } else { "TO" };
    owner
        .batch_execute(&format!(
            "DO $$ DECLARE f regprocedure; BEGIN
               FOR f IN SELECT p.oid::regprocedure FROM pg_proc AS p
                         WHERE p.proname LIKE 'leader\\_renew%' AND pg_function_is_visible(p.oid) LOOP
                 EXECUTE format('{verb} EXECUTE ON FUNCTION %s {to} ticklease_app', f);
               END LOOP; END $$"
        ))
        .await?;
    Ok(())
}

/// The latest expiry the server gave the term `(role, token)`; None once
/// the row holds another term or none.
pub async fn expiry(owner: &Client, role: &str, token: i64) -> anyhow::Result<Option<SystemTime>> {
    let row = owner
        .query_opt(
            "SELECT expires_at FROM leader_leases WHERE role = $1 AND holder_token = $2 AND holder_id IS NOT NULL",
            &[&role, &token],
        )
        .await?;
    Ok(row.and_then(|r| r.get(0)))
}

/// What the server had acknowledged at an instant: its last claim, its
/// last history row, and each role's term. A stop loses a suffix of the WAL
/// if anything, so the last of each is what would go first; and each is
/// compared whole (a sequence may hand out a lost row's id again).
pub struct Acknowledged {
    claim: Option<String>,
    history: Option<String>,
    tokens: Vec<(String, i64)>,
}

/// A claim's identity and its table, then a history row's.
const CLAIM: (&str, &str) = (
    "format('%s/%s/%s/%s/%s', role, token, seq, replica, at)",
    "blackbox_claims",
);
const HISTORY: (&str, &str) = (
    "format('%s/%s/%s/%s/%s', id, role, kind, token, outcome)",
    "leader_history",
);

/// The identity of the last row of `table`, by commit (then by id, for
/// rows of one transaction).
async fn last(owner: &Client, (id, table): (&str, &str)) -> anyhow::Result<Option<String>> {
    let order = if table == "leader_history" { "id" } else { "seq" };
    let sql = format!(
        "SELECT {id} FROM {table} ORDER BY pg_xact_commit_timestamp(xmin) DESC, {order} DESC LIMIT 1"
    );
    Ok(owner.query_opt(&sql, &[]).await?.map(|r| r.get(0)))
}

/// Whether the row named `what` is still in its table.
async fn still(owner: &Client, (id, table): (&str, &str), what: &Option<String>) -> anyhow::Result<bool> {
    let Some(what) = what else {
        return Ok(true);
    };
    let sql = format!("SELECT EXISTS (SELECT 1 FROM {table} WHERE {id} = $1)");
    Ok(owner.query_one(&sql, &[what]).await?.get(0))
}

/// Reads what is committed now (visible to a new snapshot: acknowledged
/// to its client, since with durable commits a commit becomes visible only
/// after its record is written).
pub async fn acknowledged(owner: &Client) -> anyhow::Result<Acknowledged> {
    let claim = last(owner, CLAIM).await?;
    let history = last(owner, HISTORY).await?;
    let tokens = owner
        .query(
            "SELECT role, holder_token FROM leader_leases WHERE holder_token IS NOT NULL",
            &[],
        )
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    Ok(Acknowledged {
        claim,
        history,
        tokens,
    })
}

/// What of `before` the server no longer has.
pub async fn vanished(owner: &Client, before: &Acknowledged) -> anyhow::Result<Vec<String>> {
    let mut out = Vec::new();
    if !still(owner, CLAIM, &before.claim).await? {
        let claim = before.claim.as_deref().unwrap_or_default();
        out.push(format!(
            "the last acknowledged claim ({claim}) vanished in the stop"
        ));
    }
    if !still(owner, HISTORY, &before.history).await? {
        let row = before.history.as_deref().unwrap_or_default();
        out.push(format!(
            "the last acknowledged history row ({row}) vanished in the stop"
        ));
    }
    let now = acknowledged(owner).await?;
    for (role, token) in &before.tokens {
        if !now.tokens.iter().any(|(r, t)| r == role && t >= token) {
            out.push(format!("{role}: acknowledged term {token} vanished in the stop"));
        }
    }
    Ok(out)
}
