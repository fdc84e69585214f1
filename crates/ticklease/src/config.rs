//! Lease timings: the spec's defaults, every value overridable, the relations
//! between them checked.

use std::time::Duration;

use crate::error::ConfigError;

/// Lease timings. Build with [`Config::builder`]; a `Config` that exists is valid.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Config {
    lease_ttl: Duration,
    heartbeat_every: Duration,
    statement_timeout: Duration,
    abandon_after: Duration,
    max_poll: Duration,
}

/// Longest value accepted for any timing.
pub const DURATION_MAX: Duration = Duration::from_secs(24 * 3600);

impl Config {
    /// LeaseTTL 10 s, HeartbeatEvery 3 s, StatementTimeout 2 s, AbandonAfter 6 s, MaxPoll 5 s.
    pub const DEFAULT: Config = Config {
        lease_ttl: Duration::from_secs(10),
        heartbeat_every: Duration::from_secs(3),
        statement_timeout: Duration::from_secs(2),
        abandon_after: Duration::from_secs(6),
        max_poll: Duration::from_secs(5),
    };

    /// Starts from the defaults.
    pub fn builder() -> ConfigBuilder {
        ConfigBuilder(Config::DEFAULT)
    }

    /// How long a term lasts past its last ACQUIRE or RENEW, on the database clock.
    pub fn lease_ttl(&self) -> Duration {
        self.lease_ttl
    }
    /// RENEW cadence while a tick runs.
    pub fn heartbeat_every(&self) -> Duration {
        self.heartbeat_every
    }
    /// Bound on every statement (and on getting a connection for it).
    pub fn statement_timeout(&self) -> Duration {
        self.statement_timeout
    }
    /// Past this long since the last acknowledged RENEW was sent, the tick is
    /// abandoned: work cancelled, no further RENEW started.
    pub fn abandon_after(&self) -> Duration {
        self.abandon_after
    }
    /// Longest wait between two ACQUIRE attempts of a follower.
    pub fn max_poll(&self) -> Duration {
        self.max_poll
    }

    fn validate(self) -> Result<Self, ConfigError> {
        for (name, value) in [
            ("lease_ttl", self.lease_ttl),
            ("heartbeat_every", self.heartbeat_every),
            ("statement_timeout", self.statement_timeout),
            ("abandon_after", self.abandon_after),
            ("max_poll", self.max_poll),
        ] {
            if value.is_zero() {
                return Err(ConfigError::Zero { name });
            }
            if value > DURATION_MAX {
                return Err(ConfigError::TooLong {
                    name,
                    value,
                    max: DURATION_MAX,
                });
            }
            if value.subsec_nanos() % 1_000_000 != 0 {
                return Err(ConfigError::SubMillisecond { name, value });
            }
        }
        if self.abandon_after + self.statement_timeout >= self.lease_ttl {
            return Err(ConfigError::AbandonTooLate {
                abandon_after: self.abandon_after,
                statement_timeout: self.statement_timeout,
                lease_ttl: self.lease_ttl,
            });
        }
        if self.heartbeat_every >= self.abandon_after {
            return Err(ConfigError::HeartbeatTooSlow {
                heartbeat_every: self.heartbeat_every,
                abandon_after: self.abandon_after,
            });
        }
        Ok(self)
    }
}

impl Default for Config {
    fn default() -> Self {
        Config::DEFAULT
    }
}

// The defaults obey the same relations `validate` checks on user config.
const _: () = {
    let d = Config::DEFAULT;
    assert!(d.abandon_after.as_millis() + d.statement_timeout.as_millis() < d.lease_ttl.as_millis());
    assert!(d.heartbeat_every.as_millis() < d.abandon_after.as_millis());
};

/// Builder for [`Config`], starting from the defaults.
#[derive(Debug, Clone, Copy)]
pub struct ConfigBuilder(Config);

impl ConfigBuilder {
    /// How long a term lasts without a RENEW (default 10 s).
    pub fn lease_ttl(mut self, v: Duration) -> Self {
        self.0.lease_ttl = v;
        self
    }
    /// RENEW period while a tick runs (default 3 s).
    pub fn heartbeat_every(mut self, v: Duration) -> Self {
        self.0.heartbeat_every = v;
        self
    }
    /// Bound on every lease statement (default 2 s).
    pub fn statement_timeout(mut self, v: Duration) -> Self {
        self.0.statement_timeout = v;
        self
    }
    /// Stop the work when no RENEW was acknowledged for this long (default 6 s).
    pub fn abandon_after(mut self, v: Duration) -> Self {
        self.0.abandon_after = v;
        self
    }
    /// Longest wait between polls of a follower (default 5 s).
    pub fn max_poll(mut self, v: Duration) -> Self {
        self.0.max_poll = v;
        self
    }
    /// Every default divided by `factor` (rounded to whole milliseconds), for tests.
    pub fn scaled_down(self, factor: u32) -> Self {
        let d = Config::DEFAULT;
        let f = |v: Duration| Duration::from_millis((v.as_millis() / u128::from(factor.max(1))) as u64);
        self.lease_ttl(f(d.lease_ttl))
            .heartbeat_every(f(d.heartbeat_every))
            .statement_timeout(f(d.statement_timeout))
            .abandon_after(f(d.abandon_after))
            .max_poll(f(d.max_poll))
    }
    /// Checks every bound and relation (`abandon_after + statement_timeout < lease_ttl`, …).
    pub fn build(self) -> Result<Config, ConfigError> {
        self.0.validate()
    }
}
