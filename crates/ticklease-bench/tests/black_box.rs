//! The black-box check (docs/black-box.md) in CI: the Rust Scheduler,
//! `ticklease run` and the Python client, each as three replica processes
//! through SIGKILL, SIGSTOP, a pause, a cut link, a Postgres restart and a
//! run-now, checked from the database. And the checks themselves: each
//! finds the violation it names in a record that has one.

use std::path::PathBuf;

use ticklease_bench::black_box::bench::{repository_clients, Paths};
use ticklease_bench::black_box::{check, checks, Timings};

fn paths() -> Paths {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_ticklease-bench"));
    // `cargo test --workspace` builds the CLI beside this crate's binary (its own tests need it).
    let ticklease = bench.with_file_name("ticklease");
    assert!(ticklease.exists(), "{} is not built: cargo build -p ticklease-cli", ticklease.display());
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    Paths { bench, ticklease, root }
}

async fn passes(name: &str) {
    let client = repository_clients(&paths()).into_iter().find(|c| c.name == name).expect("a client of that name");
    let report = check(&client, Timings::SCALED).await.expect("the check ran");
    println!("{}", report.summary());
    assert!(
        report.violations.is_empty(),
        "{name} broke the contract:\n{}\n{}",
        report.violations.join("\n"),
        report.tails
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_rust_scheduler_passes_the_black_box_check() {
    passes("rust-scheduler").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ticklease_run_passes_the_black_box_check() {
    passes("ticklease-run").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_python_client_passes_the_black_box_check() {
    passes("python").await;
}
