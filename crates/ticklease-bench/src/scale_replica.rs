//! One replica of the scale bench (`ticklease-bench scale-replica`): the
//! keys of one family, led through the library's [`Scheduler`] either as a
//! role family (batched statements) or as one job per role (today's path,
//! the baseline). Each tick holds its term for `work` (or until cancelled).
//! The store is wrapped so that every lease statement's latency and answer
//! are recorded; the samples are appended to a file once a second, so the
//! process holds at most a second of them and the parent reads them by time.

use std::convert::Infallible;
use std::future::Future;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use ticklease::{
    Acquire, Ending, Family, Interval, LeaseStatus, LeaseStore, Manager, PgConnect, PgStore, PgStoreOptions,
    Release, Releasing, Renew, Role, Scheduler, Signals, StoreError, Tick, Token,
};
use tokio_util::sync::CancellationToken;

use crate::Timing;

/// The family every key belongs to: key `k` is role `tenant_sync:k`.
pub const FAMILY: &str = "tenant_sync";

/// The name of key `i`.
pub fn key(i: usize) -> String {
    format!("t{i:04}")
}

/// How a replica declares the keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum ScaleMode {
    /// One family: batched ACQUIRE/RENEW/RELEASE and a replica registry.
    Family,
    /// One declared role and one scheduler job per key (the baseline).
    PerRole,
}

impl ScaleMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ScaleMode::Family => "family",
            ScaleMode::PerRole => "per-role",
        }
    }
}

/// The replica process's arguments.
#[derive(Debug, Clone, clap::Args)]
pub struct ReplicaFlags {
    /// Where lease statements go.
    #[arg(long)]
    pub url: String,
    /// The coordination session's direct URL.
    #[arg(long)]
    pub direct_url: String,
    #[arg(long, value_enum)]
    pub mode: ScaleMode,
    #[arg(long)]
    pub keys: usize,
    #[arg(long, value_parser = humantime::parse_duration)]
    pub interval: Duration,
    /// How long each tick holds its term.
    #[arg(long, value_parser = humantime::parse_duration)]
    pub work: Duration,
    #[arg(long)]
    pub pool_size: usize,
    /// The samples file (created once the replica is running, appended every second).
    #[arg(long)]
    pub stats: PathBuf,
    #[arg(long, value_enum)]
    pub timing: Timing,
}

impl ReplicaFlags {
    /// The command-line arguments that reproduce these flags.
    pub fn args(&self) -> Vec<String> {
        vec![
            "--url".into(),
            self.url.clone(),
            "--direct-url".into(),
            self.direct_url.clone(),
            "--mode".into(),
            self.mode.as_str().into(),
            "--keys".into(),
            self.keys.to_string(),
            "--interval".into(),
            format!("{}ms", self.interval.as_millis()),
            "--work".into(),
            format!("{}ms", self.work.as_millis()),
            "--pool-size".into(),
            self.pool_size.to_string(),
            "--stats".into(),
            self.stats.display().to_string(),
            "--timing".into(),
            self.timing.as_str().into(),
        ]
    }
}

/// Runs the replica until SIGTERM (its terms released as interrupted).
pub async fn run(flags: ReplicaFlags) -> anyhow::Result<()> {
    let config = flags.timing.config();
    let options = PgStoreOptions {
        pool_size: flags.pool_size,
        statement_timeout: config.statement_timeout(),
    };
    let store = PgStore::connect(flags.url.parse::<PgConnect>()?, options)
        .await?
        .with_direct(flags.direct_url.parse::<PgConnect>()?)
        .await?;
    let log = Log::new(&flags.stats);
    let store = Timed {
        inner: store,
        log: log.clone(),
    };
    let work = flags.work;
    let hold = move |tick: Tick| hold_for(tick, work);
    let keys = (0..flags.keys).map(key);
    let scheduler = match flags.mode {
        ScaleMode::Family => {
            let family = Family::new(FAMILY)?;
            family.set(keys)?;
            let manager = Manager::start(store, config, Vec::<Role>::new()).await?;
            Scheduler::new(manager).family(&family, flags.interval, hold)?
        }
        ScaleMode::PerRole => {
            let roles = keys
                .map(|k| Role::new(format!("{FAMILY}:{k}")))
                .collect::<Result<Vec<_>, _>>()?;
            let manager = Manager::start(store, config, roles.clone()).await?;
            let mut scheduler = Scheduler::new(manager);
            for role in &roles {
                scheduler = scheduler.job(role, flags.interval, hold)?;
            }
            scheduler
        }
    };
    let shutdown = CancellationToken::new();
    ticklease::cancel_on_signals(shutdown.clone())?;
    log.create()?;
    let flusher = tokio::spawn(log.clone().flush_every_second());
    let stopped = scheduler.run(shutdown).await;
    flusher.abort();
    log.flush()?;
    if !stopped.all_released() {
        eprintln!("scale replica: {stopped}");
    }
    Ok(())
}

/// A tick's work: hold the term for `work` unless cancelled first.
async fn hold_for(tick: Tick, work: Duration) -> Result<(), Infallible> {
    tokio::select! {
        _ = tick.cancelled() => {}
        _ = tokio::time::sleep(work) => {}
    }
    Ok(())
}

/// Which statement a sample times (one-row and batched alike).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Kind {
    Acquire,
    Renew,
    Release,
    Beat,
}

impl Kind {
    pub const ALL: [Kind; 4] = [Kind::Acquire, Kind::Renew, Kind::Release, Kind::Beat];

    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Acquire => "acquire",
            Kind::Renew => "renew",
            Kind::Release => "release",
            Kind::Beat => "beat",
        }
    }
}

/// How a timed statement answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    Ok,
    /// No answer within the statement timeout (or no connection in time).
    Timeout,
    /// Any other error.
    Error,
}

impl Answer {
    fn as_str(self) -> &'static str {
        match self {
            Answer::Ok => "ok",
            Answer::Timeout => "timeout",
            Answer::Error => "error",
        }
    }
}

/// One timed statement.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub kind: Kind,
    /// When the answer arrived, ms since the epoch (one host: the parent compares it with its own clock).
    pub at_ms: u64,
    pub latency_ms: f64,
    /// Roles in the statement (1 for the one-row statements).
    pub roles: u32,
    pub answer: Answer,
    /// What the answer said.
    pub answered: Answered,
}

/// What an answered statement said, where the bench looks.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answered {
    /// ACQUIRE: terms it started.
    pub started: u32,
    /// RENEW: the reason of each answer that said the term is over.
    pub lost: Vec<String>,
}

impl Sample {
    fn line(&self) -> String {
        format!(
            "{} {} {:.3} {} {} {} {}\n",
            self.kind.as_str(),
            self.at_ms,
            self.latency_ms,
            self.roles,
            self.answer.as_str(),
            self.answered.started,
            if self.answered.lost.is_empty() {
                "-".to_string()
            } else {
                self.answered.lost.join(",")
            }
        )
    }

    /// Parses one line of a samples file; `None` for a line cut by a kill.
    pub fn parse(line: &str) -> Option<Sample> {
        let f: Vec<&str> = line.split(' ').collect();
        let [kind, at_ms, latency_ms, roles, answer, started, lost] = f.as_slice() else {
            return None;
        };
        Some(Sample {
            kind: Kind::ALL.into_iter().find(|k| k.as_str() == *kind)?,
            at_ms: at_ms.parse().ok()?,
            latency_ms: latency_ms.parse().ok()?,
            roles: roles.parse().ok()?,
            answer: [Answer::Ok, Answer::Timeout, Answer::Error]
                .into_iter()
                .find(|a| a.as_str() == *answer)?,
            answered: Answered {
                started: started.parse().ok()?,
                lost: match *lost {
                    "-" => Vec::new(),
                    reasons => reasons.split(',').map(str::to_string).collect(),
                },
            },
        })
    }
}

/// Every sample of a samples file.
pub fn read_samples(path: &Path) -> std::io::Result<Vec<Sample>> {
    Ok(std::fs::read_to_string(path)?
        .lines()
        .filter_map(Sample::parse)
        .collect())
}

/// Samples not yet written, and the file they go to.
#[derive(Clone)]
struct Log {
    pending: Arc<Mutex<Vec<Sample>>>,
    path: PathBuf,
}

impl Log {
    fn new(path: &Path) -> Log {
        Log {
            pending: Arc::default(),
            path: path.to_path_buf(),
        }
    }

    /// Creates the (empty) file: the parent takes its existence as "running".
    fn create(&self) -> std::io::Result<()> {
        std::fs::File::create(&self.path).map(drop)
    }

    fn record(&self, sample: Sample) {
        self.pending.lock().expect("log lock").push(sample);
    }

    fn flush(&self) -> std::io::Result<()> {
        let pending = std::mem::take(&mut *self.pending.lock().expect("log lock"));
        let text: String = pending.iter().map(Sample::line).collect();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&self.path)?
            .write_all(text.as_bytes())
    }

    async fn flush_every_second(self) {
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            if let Err(e) = self.flush() {
                tracing::warn!(error = %e, "could not write the samples");
            }
        }
    }
}

/// The Postgres store, timing each ACQUIRE, RENEW, RELEASE and registry beat.
struct Timed {
    inner: PgStore,
    log: Log,
}

impl Timed {
    async fn timed<T>(
        &self,
        kind: Kind,
        roles: usize,
        call: impl Future<Output = Result<T, StoreError>>,
        read: impl FnOnce(&T) -> Answered,
    ) -> Result<T, StoreError> {
        let started = Instant::now();
        let result = call.await;
        let latency_ms = started.elapsed().as_secs_f64() * 1e3;
        let (answer, answered) = match &result {
            Ok(answer) => (Answer::Ok, read(answer)),
            Err(StoreError::Timeout { .. }) => (Answer::Timeout, Answered::default()),
            Err(_) => (Answer::Error, Answered::default()),
        };
        let at_ms = SystemTime::now()
            .duration_since(SystemTime::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        self.log.record(Sample {
            kind,
            at_ms,
            latency_ms,
            roles: roles as u32,
            answer,
            answered,
        });
        result
    }
}

/// The reasons of the RENEW answers that said a term is over.
fn lost<'a>(answers: impl IntoIterator<Item = &'a Renew>) -> Answered {
    Answered {
        started: 0,
        lost: answers
            .into_iter()
            .filter_map(|r| match r {
                Renew::Lost(reason) => Some(reason.as_str().to_string()),
                _ => None,
            })
            .collect(),
    }
}

/// How many of the ACQUIRE answers started a term.
fn started<'a>(answers: impl IntoIterator<Item = &'a Acquire>) -> Answered {
    Answered {
        started: answers
            .into_iter()
            .filter(|a| matches!(a, Acquire::Acquired(_)))
            .count() as u32,
        lost: Vec::new(),
    }
}

impl LeaseStore for Timed {
    async fn acquire(
        &self,
        role: &Role,
        holder: &str,
        lease_ttl: Duration,
        interval: impl Into<Interval> + Send,
    ) -> Result<Acquire, StoreError> {
        let call = self.inner.acquire(role, holder, lease_ttl, interval);
        self.timed(Kind::Acquire, 1, call, |a| started([a])).await
    }

    async fn acquire_occurrence(
        &self,
        role: &Role,
        holder: &str,
        lease_ttl: Duration,
        ask: &ticklease::OccurrenceAsk,
    ) -> Result<ticklease::OccurrenceAnswer, StoreError> {
        let call = self.inner.acquire_occurrence(role, holder, lease_ttl, ask);
        self.timed(Kind::Acquire, 1, call, |a| started([&a.acquire]))
            .await
    }

    async fn renew(&self, role: &Role, token: Token, lease_ttl: Duration) -> Result<Renew, StoreError> {
        let call = self.inner.renew(role, token, lease_ttl);
        self.timed(Kind::Renew, 1, call, |r| lost([r])).await
    }

    async fn release(
        &self,
        role: &Role,
        token: Token,
        outcome: Release,
        interval: Duration,
    ) -> Result<bool, StoreError> {
        let call = self.inner.release(role, token, outcome, interval);
        self.timed(Kind::Release, 1, call, |_| Answered::default()).await
    }

    async fn release_ending(
        &self,
        role: &Role,
        token: Token,
        outcome: Release,
        interval: Duration,
        ending: &Ending,
    ) -> Result<bool, StoreError> {
        let call = self.inner.release_ending(role, token, outcome, interval, ending);
        self.timed(Kind::Release, 1, call, |_| Answered::default()).await
    }

    async fn acquire_many(
        &self,
        roles: &[Role],
        holder: &str,
        lease_ttl: Duration,
        interval: Duration,
        limit: usize,
    ) -> Result<Vec<(Role, Acquire)>, StoreError> {
        let call = self.inner.acquire_many(roles, holder, lease_ttl, interval, limit);
        self.timed(Kind::Acquire, roles.len(), call, |answers| {
            started(answers.iter().map(|(_, a)| a))
        })
        .await
    }

    async fn acquire_many_occurrence(
        &self,
        roles: &[Role],
        holder: &str,
        lease_ttl: Duration,
        ask: &ticklease::FamilyOccurrenceAsk,
        limit: usize,
    ) -> Result<Vec<(Role, ticklease::OccurrenceAnswer)>, StoreError> {
        let call = self
            .inner
            .acquire_many_occurrence(roles, holder, lease_ttl, ask, limit);
        self.timed(Kind::Acquire, roles.len(), call, |answers| {
            started(answers.iter().map(|(_, a)| &a.acquire))
        })
        .await
    }

    async fn renew_many(
        &self,
        terms: &[(Role, Token)],
        lease_ttl: Duration,
    ) -> Result<Vec<Renew>, StoreError> {
        let call = self.inner.renew_many(terms, lease_ttl);
        self.timed(Kind::Renew, terms.len(), call, |answers| lost(answers))
            .await
    }

    async fn release_many(&self, terms: &[Releasing]) -> Result<Vec<bool>, StoreError> {
        let call = self.inner.release_many(terms);
        self.timed(Kind::Release, terms.len(), call, |_| Answered::default())
            .await
    }

    async fn beat(&self, family: &str, holder: &str, lease_ttl: Duration) -> Result<Vec<String>, StoreError> {
        let call = self.inner.beat(family, holder, lease_ttl);
        self.timed(Kind::Beat, 1, call, |_| Answered::default()).await
    }

    async fn leave(&self, family: &str, holder: &str) -> Result<bool, StoreError> {
        self.inner.leave(family, holder).await
    }

    async fn pause(&self, role: &Role, by: &str, reason: &str) -> Result<bool, StoreError> {
        self.inner.pause(role, by, reason).await
    }

    async fn unpause(&self, role: &Role) -> Result<bool, StoreError> {
        self.inner.unpause(role).await
    }

    async fn run_now(&self, role: &Role) -> Result<bool, StoreError> {
        self.inner.run_now(role).await
    }

    async fn seed(&self, roles: &[Role]) -> Result<(), StoreError> {
        self.inner.seed(roles).await
    }

    async fn status(&self) -> Result<Vec<LeaseStatus>, StoreError> {
        self.inner.status().await
    }
    async fn status_bounded(&self, limit: usize) -> Result<(Vec<LeaseStatus>, u64), StoreError> {
        self.inner.status_bounded(limit).await
    }
    async fn status_of(&self, roles: &[Role]) -> Result<Vec<LeaseStatus>, StoreError> {
        self.inner.status_of(roles).await
    }

    fn signals(&self) -> Option<&Signals> {
        self.inner.signals()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sample_line_parses_back_and_a_cut_line_is_skipped() {
        let s = Sample {
            kind: Kind::Renew,
            at_ms: 1_700_000_000_123,
            latency_ms: 1.25,
            roles: 100,
            answer: Answer::Timeout,
            answered: Answered {
                started: 3,
                lost: vec!["released".into(), "taken_over".into()],
            },
        };
        let line = s.line();
        assert_eq!(Sample::parse(line.trim_end()), Some(s.clone()));
        let none = Sample {
            answered: Answered::default(),
            ..s
        };
        assert_eq!(Sample::parse(none.line().trim_end()), Some(none));
        assert_eq!(Sample::parse("renew 1700000000123 1.2"), None);
    }
}
