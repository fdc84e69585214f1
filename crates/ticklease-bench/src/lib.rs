//! Failure-correctness drills for ticklease: the failover benchmark and the
//! chaos run, on real processes, a real Postgres and a TCP fault proxy, and
//! the scale bench of role families (`scale`). The numbers come from the
//! database's own record (`lease_history`, written by a trigger on
//! `leader_leases`, and the journals written by fenced claims).

pub mod black_box;
pub mod chaos;
pub mod drill;
pub mod endpoint;
pub mod failover;
pub mod fence_cost;
pub mod idle;
pub mod patroni;
pub mod plot;
pub mod promotion;
pub mod run_failover;
pub mod scale;
pub mod scale_replica;
pub mod schedules;
pub mod stats;

/// A progress bar of `len` steps on stderr (trials done, ETA), drawn only
/// when stderr is a terminal: indicatif's stderr target draws nothing otherwise.
pub fn progress(len: usize, what: &str) -> indicatif::ProgressBar {
    let bar =
        indicatif::ProgressBar::with_draw_target(Some(len as u64), indicatif::ProgressDrawTarget::stderr());
    let style = indicatif::ProgressStyle::with_template(
        "{prefix} [{bar:30}] {pos}/{len} {msg} (elapsed {elapsed}, ETA {eta})",
    )
    .expect("a valid template")
    .progress_chars("=> ");
    bar.set_style(style);
    bar.set_prefix(what.to_string());
    bar
}

/// Bench-only instrumentation, applied after the migrations.
pub const HISTORY_SQL: &str = include_str!("history.sql");

/// Lease timings for a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Timing {
    /// The spec's defaults: TTL 10 s, heartbeat 3 s, statement 2 s, abandon 6 s, poll 5 s.
    Default,
    /// Everything divided by ten: TTL 1 s.
    Scaled,
    /// Scaled, but with the default TTL (10 s): a dead leader's lease alone
    /// runs out about 10 s after its last renew, so a takeover well within
    /// that is the coordination session's doing (the CI check of it).
    LongLease,
}

impl Timing {
    pub fn config(self) -> ticklease::Config {
        match self {
            Timing::Default => ticklease::Config::DEFAULT,
            Timing::Scaled => ticklease::Config::builder()
                .scaled_down(10)
                .build()
                .expect("scaled defaults are valid"),
            Timing::LongLease => ticklease::Config::builder()
                .scaled_down(10)
                .lease_ttl(ticklease::Config::DEFAULT.lease_ttl())
                .build()
                .expect("a longer TTL keeps the scaled set valid"),
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Timing::Default => "default",
            Timing::Scaled => "scaled",
            Timing::LongLease => "long-lease",
        }
    }
}
