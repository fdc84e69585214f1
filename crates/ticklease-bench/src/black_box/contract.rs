//! What the harness and a client agree on (`docs/black-box.md`): the
//! environment a replica gets, and the claim its work commits.

use std::time::Duration;

use anyhow::Context as _;

/// The claim every term's work commits twice, `$1` role, `$2` token, `$3`
/// replica; it records the occurrence the role's row names (a cron term's).
/// No unique key: two terms claiming at once would commit one `seq` twice,
/// which the check looks for.
pub const CLAIM_SQL: &str = "INSERT INTO blackbox_claims (role, token, replica, seq, at, occurrence)
SELECT $1, $2, $3, n.seq, clock_timestamp(), (SELECT l.occurrence FROM leader_leases AS l WHERE l.role = $1)
  FROM (SELECT coalesce(max(c.seq), 0) + 1 AS seq FROM blackbox_claims AS c WHERE c.role = $1) AS n
 WHERE (SELECT leader_fence_v2($1, $2))";

/// The claim without its fence: only a client broken on purpose sends it
/// (the test that shows the check catches a stale claim).
pub const UNFENCED_CLAIM_SQL: &str = "INSERT INTO blackbox_claims (role, token, replica, seq, at, occurrence)
SELECT $1, $2, $3, n.seq, clock_timestamp(), (SELECT l.occurrence FROM leader_leases AS l WHERE l.role = $1)
  FROM (SELECT coalesce(max(c.seq), 0) + 1 AS seq FROM blackbox_claims AS c WHERE c.role = $1) AS n
 WHERE $2::bigint IS NOT NULL";

/// The claims table, created by the schema owner; the app role may insert and read.
pub const CLAIMS_TABLE: &str = "CREATE TABLE blackbox_claims (
    role text NOT NULL, token bigint NOT NULL, replica text NOT NULL, seq bigint NOT NULL, at timestamptz NOT NULL,
    occurrence timestamptz);
GRANT SELECT, INSERT ON blackbox_claims TO ticklease_app";

/// A replica's schedule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScheduleSpec {
    /// `every <ms>`
    Every(Duration),
    /// `cron <six fields, seconds first>`
    Cron(String),
}

impl ScheduleSpec {
    pub fn to_env(&self) -> String {
        match self {
            ScheduleSpec::Every(d) => format!("every {}", d.as_millis()),
            ScheduleSpec::Cron(e) => format!("cron {e}"),
        }
    }

    fn parse(s: &str) -> anyhow::Result<ScheduleSpec> {
        if let Some(ms) = s.strip_prefix("every ") {
            return Ok(ScheduleSpec::Every(Duration::from_millis(ms.trim().parse()?)));
        }
        let expr = s
            .strip_prefix("cron ")
            .context("TICKLEASE_SCHEDULE: `every <ms>` or `cron <expr>`")?;
        Ok(ScheduleSpec::Cron(expr.trim().to_owned()))
    }
}

/// The five durations of a run, and the work's wait.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timings {
    pub lease_ttl: Duration,
    pub heartbeat: Duration,
    pub statement_timeout: Duration,
    pub abandon: Duration,
    pub max_poll: Duration,
    pub work: Duration,
}

impl Timings {
    /// The defaults divided by five, and a work of 1.5 s: most of a cycle
    /// is inside a term, where the faults aim.
    pub const SCALED: Timings = Timings {
        lease_ttl: Duration::from_millis(2000),
        heartbeat: Duration::from_millis(600),
        statement_timeout: Duration::from_millis(400),
        abandon: Duration::from_millis(1200),
        max_poll: Duration::from_millis(1000),
        work: Duration::from_millis(1500),
    };

    /// The variables naming them.
    pub fn to_env(&self) -> [(&'static str, String); 6] {
        let ms = |d: Duration| d.as_millis().to_string();
        [
            ("TICKLEASE_LEASE_TTL_MS", ms(self.lease_ttl)),
            ("TICKLEASE_HEARTBEAT_MS", ms(self.heartbeat)),
            ("TICKLEASE_STATEMENT_TIMEOUT_MS", ms(self.statement_timeout)),
            ("TICKLEASE_ABANDON_MS", ms(self.abandon)),
            ("TICKLEASE_MAX_POLL_MS", ms(self.max_poll)),
            ("TICKLEASE_WORK_MS", ms(self.work)),
        ]
    }
}

/// What a replica process reads from its environment.
#[derive(Debug, Clone)]
pub struct ClientEnv {
    pub url: String,
    pub role: String,
    pub replica: String,
    pub schedule: ScheduleSpec,
    pub timings: Timings,
}

impl ClientEnv {
    pub fn from_env() -> anyhow::Result<ClientEnv> {
        let var = |name: &str| std::env::var(name).with_context(|| format!("{name} is not set"));
        let ms = |name: &str| -> anyhow::Result<Duration> {
            let v = var(name)?;
            let n = v
                .parse()
                .with_context(|| format!("{name}: {v:?} is no number of ms"))?;
            Ok(Duration::from_millis(n))
        };
        Ok(ClientEnv {
            url: var("TICKLEASE_URL")?,
            role: var("TICKLEASE_ROLE")?,
            replica: var("TICKLEASE_REPLICA")?,
            schedule: ScheduleSpec::parse(&var("TICKLEASE_SCHEDULE")?)?,
            timings: Timings {
                lease_ttl: ms("TICKLEASE_LEASE_TTL_MS")?,
                heartbeat: ms("TICKLEASE_HEARTBEAT_MS")?,
                statement_timeout: ms("TICKLEASE_STATEMENT_TIMEOUT_MS")?,
                abandon: ms("TICKLEASE_ABANDON_MS")?,
                max_poll: ms("TICKLEASE_MAX_POLL_MS")?,
                work: ms("TICKLEASE_WORK_MS")?,
            },
        })
    }
}
