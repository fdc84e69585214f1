//! The black-box check (docs/black-box.md) in CI: the Rust Scheduler,
//! `ticklease run` and the Python client, each as three replica processes
//! through every fault of the harness and a run-now, checked from the
//! database. Three clients broken on purpose, each failing it. And the
//! checks themselves: each finds the violation it names in a record that
//! has one.

use std::path::PathBuf;

use ticklease_bench::black_box::bench::{repository_clients, Paths};
use ticklease_bench::black_box::{check, checks, cron, faults_alone, server, Fault, Timings};

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

/// The Rust client broken on purpose (`BLACKBOX_BROKEN`), through
/// `faults` alone: the harness must find a violation containing `named`.
/// Each test gives its fault twice: the second runs only if the first found
/// nothing (a RENEW can land in the few ms between a held claim's return and
/// its COMMIT, and stop the work first).
async fn fails(how: &str, faults: &[Fault], named: &str) {
    let mut client = repository_clients(&paths())
        .into_iter()
        .find(|c| c.name == "rust-scheduler")
        .unwrap();
    client.name = format!("broken-{how}");
    client.env.push(("BLACKBOX_BROKEN".into(), how.into()));
    let report = faults_alone(&client, Timings::SCALED, faults)
        .await
        .expect("the faults ran");
    println!("{}", report.summary());
    assert!(
        report.violations.iter().any(|v| v.contains(named)),
        "{how}: no violation naming {named:?} in {:?}\n{}",
        report.violations,
        report.tails
    );
}

/// Without the fence, a claim held between its statement and its COMMIT
/// while its term ends commits after the term: the check finds it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_without_the_fence_fails() {
    fails("no-fence", &[Fault::ClaimHeld; 2], "after it ended").await;
}

/// A holder whose RENEWs fail must stop its work within A of the last one
/// that succeeded: one whose work runs on commits a claim past that bound
/// (its lease still lets the claim through the fence).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_keeps_working_after_a_failed_renew_fails() {
    fails("ignore-renew", &[Fault::RenewRefused; 2], "its work had to stop").await;
}

/// A term whose claim failed (its session ended while the term was live)
/// and that is released `completed` anyway did not make its claims.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_that_releases_a_lost_term_completed_fails() {
    fails(
        "lost-as-completed",
        &[Fault::SessionEnded; 2],
        "released completed with 1 of its 2 claims",
    )
    .await;
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

    // A term released completed with one claim of two; one with both passes.
    for sql in [
        claim("half", 1, 1),
        term("half", 1),
        claim("half", 2, 2),
        claim("half", 2, 3),
        term("half", 2),
    ] {
        commit(&owner, &sql).await;
    }
    let half = checks::completed(&owner, "half").await.unwrap();
    assert_eq!(
        half,
        ["half: term 1 (r1) was released completed with 1 of its 2 claims"],
        "only the term with one claim"
    );

    // What was acknowledged before a stop and is gone after it.
    let before = server::acknowledged(&owner).await.unwrap();
    assert_eq!(
        server::vanished(&owner, &before).await.unwrap(),
        Vec::<String>::new()
    );
    commit(&owner, "DELETE FROM blackbox_claims WHERE role = 'half'").await;
    let lost = server::vanished(&owner, &before).await.unwrap();
    assert!(
        lost.iter()
            .any(|v| v.starts_with("the last acknowledged claim (half/2/3/r1/")),
        "{lost:?}"
    );

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
