//! The failover bench, scaled down, in CI.
//!
//! Leases alone (TTL 1 s, 3 trials per scenario): takeover within TTL +
//! MaxPoll + slack, a positive gap (no overlap), and no fenced write of the
//! old term after the new term's first. With a coordination session (direct,
//! and beside PgBouncer), at the default TTL of 10 s but the rest scaled: a
//! killed or stopped leader's role is claimed again within 2 s of the
//! signal, which the lease alone cannot do (it runs out ~10 s after the last
//! renew), so this fails if the coordination path stops working.

use std::time::Duration;

use ticklease_bench::failover::{self, Env, Mode, Scenario, Trial};
use ticklease_bench::Timing;

fn exe() -> std::path::PathBuf {
    env!("CARGO_BIN_EXE_ticklease-bench").into()
}

fn print(t: &Trial) {
    println!(
        "{} {} #{}: fault → claim {:.0} ms, takeover {:?} ms, gap {:.0} ms, pause → ended {:?} ms, stale writes {}",
        t.mode.as_str(),
        t.scenario.as_str(),
        t.n,
        t.fault_to_claim_ms,
        t.takeover_ms,
        t.gap_ms,
        t.pause_to_cancel_ms,
        t.stale_writes
    );
}

fn assert_safe(t: &Trial) {
    let what = format!("{} {} #{}", t.mode.as_str(), t.scenario.as_str(), t.n);
    assert!(
        t.gap_ms > 0.0,
        "{what}: the terms overlapped by {:.0} ms",
        -t.gap_ms
    );
    assert_eq!(t.stale_writes, 0, "{what}: the old term wrote after it ended");
    if matches!(t.scenario, Scenario::Freeze | Scenario::Severed) {
        assert!(
            t.old_ended.is_some(),
            "{what}: the resumed leader's tick must end as lost"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaled_failover_takes_over_within_the_bound_without_overlap() {
    let env = Env::start(Timing::Scaled, exe(), Mode::Lease).await.unwrap();
    let config = Timing::Scaled.config();
    let bound = config.lease_ttl() + config.max_poll() + Duration::from_millis(700);
    let mut trials = Vec::new();
    for scenario in Scenario::ALL {
        for n in 0..3 {
            let t = failover::trial(&env, scenario, n).await.unwrap();
            print(&t);
            assert_safe(&t);
            let (took, what) = match t.takeover_ms {
                Some(ms) => (ms, "takeover"),
                None => (t.fault_to_claim_ms, "unpause → claim"),
            };
            assert!(
                took <= bound.as_secs_f64() * 1000.0,
                "{}: {what} {took:.0} ms over the bound {bound:?}",
                scenario.as_str(),
            );
            trials.push(t);
        }
    }
    println!("{}", failover::table(&trials));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_coordination_session_hands_over_a_killed_or_stopped_leaders_role_at_once() {
    let bound_ms = 2000.0;
    let ttl = Timing::LongLease.config().lease_ttl();
    let plan = [
        (Mode::Direct, [Scenario::Sigkill, Scenario::Sigterm].as_slice(), 3),
        (Mode::PooledDirect, [Scenario::Sigkill].as_slice(), 2),
    ];
    for (mode, scenarios, runs) in plan {
        let env = Env::start(Timing::LongLease, exe(), mode).await.unwrap();
        let mut trials = Vec::new();
        for &scenario in scenarios {
            for n in 0..runs {
                let t = failover::trial(&env, scenario, n).await.unwrap();
                print(&t);
                assert_safe(&t);
                assert!(
                    t.fault_to_claim_ms < bound_ms,
                    "{} {}: claimed again {:.0} ms after the signal, not within {bound_ms} ms \
                     (the lease alone runs out {ttl:?} after the last renew)",
                    mode.as_str(),
                    scenario.as_str(),
                    t.fault_to_claim_ms
                );
                trials.push(t);
            }
        }
        println!("{}", failover::table(&trials));
    }
}
