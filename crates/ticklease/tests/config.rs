//! Timing configuration: defaults from the spec, every relation validated.

use std::time::Duration;

use ticklease::{Config, ConfigError};

const MS: fn(u64) -> Duration = Duration::from_millis;

#[test]
fn defaults_are_the_specs_numbers() {
    let c = Config::default();
    assert_eq!(
        (
            c.lease_ttl(),
            c.heartbeat_every(),
            c.statement_timeout(),
            c.abandon_after(),
            c.max_poll()
        ),
        (MS(10_000), MS(3_000), MS(2_000), MS(6_000), MS(5_000))
    );
    assert_eq!(Config::builder().build().unwrap(), c);
}

#[test]
fn zero_durations_are_refused_by_name() {
    let err = Config::builder()
        .heartbeat_every(Duration::ZERO)
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::Zero {
                name: "heartbeat_every"
            }
        ),
        "{err:?}"
    );
    assert_eq!(err.to_string(), "heartbeat_every must be greater than zero");
    let err = Config::builder().max_poll(Duration::ZERO).build().unwrap_err();
    assert!(matches!(err, ConfigError::Zero { name: "max_poll" }));
}

#[test]
fn abandon_plus_statement_timeout_must_stay_below_the_ttl() {
    // 6 s + 4 s = 10 s is not below a 10 s TTL.
    let err = Config::builder()
        .statement_timeout(MS(4_000))
        .build()
        .unwrap_err();
    assert!(matches!(err, ConfigError::AbandonTooLate { .. }), "{err:?}");
    let text = err.to_string();
    assert!(
        text.contains("abandon_after (6s)")
            && text.contains("statement_timeout (4s)")
            && text.contains("lease_ttl (10s)"),
        "{text}"
    );
    assert!(Config::builder().statement_timeout(MS(3_999)).build().is_ok());
}

#[test]
fn heartbeat_must_be_faster_than_abandon() {
    let err = Config::builder().heartbeat_every(MS(6_000)).build().unwrap_err();
    assert!(matches!(err, ConfigError::HeartbeatTooSlow { .. }), "{err:?}");
}

#[test]
fn absurd_and_sub_millisecond_values_are_refused() {
    let err = Config::builder()
        .lease_ttl(Duration::from_secs(90_000))
        .build()
        .unwrap_err();
    assert!(
        matches!(
            err,
            ConfigError::TooLong {
                name: "lease_ttl",
                ..
            }
        ),
        "{err:?}"
    );
    let err = Config::builder()
        .max_poll(Duration::from_micros(1500))
        .build()
        .unwrap_err();
    assert!(
        matches!(err, ConfigError::SubMillisecond { name: "max_poll", .. }),
        "{err:?}"
    );
}

#[test]
fn scaled_down_defaults_keep_the_invariants() {
    let c = Config::builder().scaled_down(10).build().unwrap();
    assert_eq!((c.lease_ttl(), c.abandon_after()), (MS(1_000), MS(600)));
}
