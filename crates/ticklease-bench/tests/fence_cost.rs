//! The fence's cost benchmark, at its smallest, in CI: it must run on the
//! postmaster it starts itself (`max_prepared_transactions` 0), and every
//! variant's claims must land (a fence whose term is gone claims nothing,
//! cheaply, and would pass for a fast one), each with its WAL per transaction
//! and lock-wait samples.

use ticklease_bench::fence_cost::{self, FenceOptions, Shape};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_fence_benchmark_runs_on_its_own_postmaster_and_every_variant_claims_rows() {
    let report = fence_cost::run(FenceOptions {
        runs: 1,
        secs: 1,
        clients: vec![1],
        shapes: vec![Shape::One],
        prepared: vec![0],
        candidates: Vec::new(),
        protocol: "extended".into(),
    })
    .await
    .unwrap_or_else(|e| panic!("the benchmark failed: {e:#}"));
    let variants: Vec<&str> = report.runs.iter().map(|r| r.variant.as_str()).collect();
    assert_eq!(variants, ["unfenced", "lock-free", "fence-gen6", "fence"]);
    for run in &report.runs {
        assert!(run.transactions > 0, "{}: no transaction ran", run.variant);
        assert_eq!(run.failed, 0, "{}: failed transactions", run.variant);
        // Every claim writes a row: its WAL is there, and the sampler ran beside it.
        let wal = run.per_transaction.wal_bytes;
        assert!(
            wal > 50.0 && wal < 10_000.0,
            "{}: {wal} WAL bytes per transaction",
            run.variant
        );
        assert!(run.lock_waits.samples > 0, "{}: no lock-wait sample", run.variant);
    }
}
