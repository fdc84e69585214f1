//! The short chaos run: five worker replicas, through PgBouncer in
//! transaction mode and a writer endpoint that follows the primary, each
//! with a coordination session on a direct endpoint, under 50 seeded faults
//! (including a holder's coordination session ended alone, Postgres and
//! PgBouncer restarts and promotions of the standby, one of them losing a
//! tail with a term in it: the first faults are one of each kind), then the
//! history checker. The seed is
//! printed so a failure reproduces with `ticklease-bench chaos --seed`.

use ticklease_bench::chaos::{self, ChaosOptions};
use ticklease_bench::Timing;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifty_faults_leave_no_stale_claim_no_duplicate_and_no_loss() {
    let seed = std::env::var("TICKLEASE_CHAOS_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(1130);
    println!("chaos seed {seed}");
    let opts = ChaosOptions {
        replicas: 5,
        faults: 50,
        seed,
        timing: Timing::Scaled,
        exe: env!("CARGO_BIN_EXE_ticklease-bench").into(),
        pooled: true,
    };
    let report = chaos::run(&opts).await.unwrap();
    println!("{report:#?}");
    assert_eq!(report.faults.values().sum::<usize>(), 50);
    assert_eq!(
        report.faults.len(),
        10,
        "every fault kind occurred: {:?}",
        report.faults
    );
    assert!(report.journal_claims > 0 && report.terms > 0, "the run did work");
    assert!(
        report.coordination_kills > 0,
        "a coordination_kill fault found a holder's session to end"
    );
    assert!(
        report.lost_acquires > 0 && report.lost_claims > 0,
        "a promotion lost terms and claims with its tail"
    );
    assert!(report.ok(), "seed {seed}: {:#?}", report.violations);
}
