//! The black-box check (docs/black-box.md) in CI: the Rust Scheduler,
//! `ticklease run` and the Python client, each as three replica processes
//! through SIGKILL, SIGSTOP, a pause, a cut link, a Postgres restart and a
//! run-now, checked from the database. And the checks themselves: each
//! finds the violation it names in a record that has one.

use std::path::PathBuf;

use ticklease_bench::black_box::bench::{repository_clients, Paths};
use ticklease_bench::black_box::{check, checks, cron, stop_fault_alone, Timings};

fn paths() -> Paths {
    let bench = PathBuf::from(env!("CARGO_BIN_EXE_ticklease-bench"));
    // `cargo test --workspace` builds the CLI beside this crate's binary (its own tests need it).
    let ticklease = bench.with_file_name("ticklease");
    assert!(
        ticklease.exists(),
        "{} is not built: cargo build -p ticklease-cli",
        ticklease.display()
    );
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    Paths {
        bench,
        ticklease,
        root,
    }
}

async fn passes(name: &str) {
    let client = repository_clients(&paths())
        .into_iter()
        .find(|c| c.name == name)
        .expect("a client of that name");
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

/// A client whose work claims again after its wait even when its term was
/// lost meanwhile: the fence refuses that claim; without the fence the check
/// finds it committed after its term ended (the mutation check of the
/// harness: a client that breaks the contract does not pass).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_claim_is_refused_by_the_fence_and_caught_without_it() {
    let rust = repository_clients(&paths())
        .into_iter()
        .find(|c| c.name == "rust-scheduler")
        .unwrap();
    let broken = |how: &str| {
        let mut c = rust.clone();
        c.env.push(("BLACKBOX_BROKEN".into(), how.into()));
        c
    };
    let fenced = stop_fault_alone(&broken("stale"), Timings::SCALED).await.unwrap();
    assert_eq!(fenced, Vec::<String>::new(), "the fence refused the stale claim");
    let unfenced = stop_fault_alone(&broken("unfenced"), Timings::SCALED)
        .await
        .unwrap();
    assert!(
        unfenced.iter().any(|v| v.contains("after it ended")),
        "a stale claim without the fence is found: {unfenced:?}"
    );
}

/// One statement, committed on its own (the checks read commit order).
async fn commit(owner: &tokio_postgres::Client, sql: &str) {
    owner
        .batch_execute(sql)
        .await
        .unwrap_or_else(|e| panic!("{sql}: {e}"));
}

fn term(role: &str, token: i64) -> String {
    format!(
        "INSERT INTO leader_history (role, kind, token, holder_id, acquired_at, outcome)
         VALUES ('{role}', 'term', {token}, 'h', clock_timestamp(), 'completed')"
    )
}

fn claim(role: &str, token: i64, seq: i64) -> String {
    claim_by(role, token, seq, "r1")
}

fn claim_by(role: &str, token: i64, seq: i64, replica: &str) -> String {
    format!("INSERT INTO blackbox_claims VALUES ('{role}', {token}, '{replica}', {seq}, clock_timestamp())")
}

/// Plants each violation in a role of its own (and a clean role), each statement committed on its own.
async fn plant_violations(owner: &tokio_postgres::Client) {
    // A clean record: two terms, each claiming inside itself.
    for sql in [
        claim("clean", 1, 1),
        term("clean", 1),
        claim("clean", 2, 2),
        term("clean", 2),
    ] {
        commit(owner, &sql).await;
    }
    // A claim committed after its term ended; a claim of no term.
    for sql in [term("late", 1), claim("late", 1, 1), claim("late", 7, 2)] {
        commit(owner, &sql).await;
    }
    // Term 2 claimed before term 1 ended.
    for sql in [
        claim("overlap", 1, 1),
        claim("overlap", 2, 2),
        term("overlap", 1),
        term("overlap", 2),
    ] {
        commit(owner, &sql).await;
    }
    // One seq committed by two terms.
    for sql in [
        claim("twice", 1, 1),
        term("twice", 1),
        claim("twice", 2, 1),
        term("twice", 2),
    ] {
        commit(owner, &sql).await;
    }
    // One term's claims from two replicas.
    for sql in [
        claim("shared", 1, 1),
        claim_by("shared", 1, 2, "r2"),
        term("shared", 1),
    ] {
        commit(owner, &sql).await;
    }
    // A claim between a pause and its unpause.
    let history = |kind: &str| {
        format!("INSERT INTO leader_history (role, kind, by) VALUES ('paused', '{kind}', 'ops')")
    };
    for sql in [
        history("pause"),
        claim("paused", 1, 1),
        term("paused", 1),
        history("unpause"),
    ] {
        commit(owner, &sql).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_check_finds_the_violation_it_names() {
    let db = ticklease_bench::black_box::db::Db::start().await.unwrap();
    let owner = db.owner().await.unwrap();
    plant_violations(&owner).await;
    let found = |role: &'static str| {
        let owner = &owner;
        async move { checks::invariants(owner, role).await.unwrap() }
    };
    assert_eq!(found("clean").await, Vec::<String>::new());
    let late = found("late").await;
    assert!(late.iter().any(|v| v.contains("after it ended")), "{late:?}");
    assert!(late.iter().any(|v| v.contains("no such term")), "{late:?}");
    let overlap = found("overlap").await;
    assert!(
        overlap.iter().any(|v| v.contains("before term 1 ended")),
        "{overlap:?}"
    );
    let twice = found("twice").await;
    assert!(
        twice
            .iter()
            .any(|v| v.starts_with("twice: seq 1 committed 2 times")),
        "{twice:?}"
    );
    let shared = found("shared").await;
    assert!(
        shared.iter().any(|v| v.contains("claimed by 2 replicas")),
        "{shared:?}"
    );
    let paused = found("paused").await;
    assert!(paused.iter().any(|v| v.contains("while paused")), "{paused:?}");

    // A cron term that ran its occurrence ten seconds late.
    let now = db.now().await.unwrap();
    let secs = now.duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    let o = secs - secs % cron::EVERY_S - 2 * cron::EVERY_S;
    let late = format!(
        "INSERT INTO blackbox_claims VALUES ('late_cron', 1, 'r1', 1, clock_timestamp(), to_timestamp({o}))"
    );
    for sql in [late, term("late_cron", 1)] {
        commit(&owner, &sql).await;
    }
    let found = cron::check(&db, "late_cron", o, std::time::Duration::from_millis(2500))
        .await
        .unwrap();
    assert!(
        found
            .iter()
            .any(|v| v.contains(&format!("the term of {o} claimed"))),
        "{found:?}"
    );

    // A steady window with a gap longer than allowed.
    let now = db.now().await.unwrap();
    let window = [(now - std::time::Duration::from_secs(10), now)];
    let gaps = checks::gaps(&owner, "clean", &window, std::time::Duration::from_secs(1))
        .await
        .unwrap();
    assert!(
        !gaps.is_empty(),
        "claims a second apart in a 10 s window leave gaps"
    );
    assert!(
        checks::gaps(&owner, "clean", &window, std::time::Duration::from_secs(20))
            .await
            .unwrap()
            .is_empty()
    );
}
