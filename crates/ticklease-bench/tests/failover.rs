//! The scaled-down failover run (TTL 1 s, 3 trials per scenario): takeover
//! within TTL + MaxPoll + slack, a positive gap (no overlap), and no fenced
//! write of the old term after the new term's first.

use std::time::Duration;

use ticklease_bench::failover::{self, Env, Scenario};
use ticklease_bench::Timing;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scaled_failover_takes_over_within_the_bound_without_overlap() {
    let env = Env::start(Timing::Scaled, env!("CARGO_BIN_EXE_ticklease-bench").into())
        .await
        .unwrap();
    let config = Timing::Scaled.config();
    let bound = config.lease_ttl() + config.max_poll() + Duration::from_millis(700);
    let mut trials = Vec::new();
    for scenario in Scenario::ALL {
        for n in 0..3 {
            let t = failover::trial(&env, scenario, n).await.unwrap();
            println!(
                "{} #{n}: takeover {:?}, gap {:.0} ms, stale writes {}",
                scenario.as_str(),
                t.takeover,
                t.gap_ms,
                t.stale_writes
            );
            assert!(
                t.takeover <= bound,
                "{}: takeover {:?} over the bound {bound:?}",
                scenario.as_str(),
                t.takeover
            );
            assert!(
                t.gap_ms > 0.0,
                "{}: the terms overlapped by {:.0} ms",
                scenario.as_str(),
                -t.gap_ms
            );
            assert_eq!(
                t.stale_writes,
                0,
                "{}: the old term wrote after the new one began",
                scenario.as_str()
            );
            if matches!(scenario, Scenario::Freeze | Scenario::Severed) {
                assert!(
                    t.old_ended.is_some(),
                    "{}: the resumed leader's tick must end as lost",
                    scenario.as_str()
                );
            }
            trials.push(t);
        }
    }
    println!("{}", failover::table(&trials));
}
