//! `ticklease demo`, short: a throwaway cluster, three workers, the narrated
//! failures, and a report that exits 0 only when every invariant held.

use std::process::Command;

#[test]
fn a_short_demo_runs_the_script_and_every_invariant_holds() {
    let o = Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(["demo", "--duration", "20s"])
        .env_remove("DATABASE_URL")
        .output()
        .unwrap();
    let out = String::from_utf8_lossy(&o.stdout);
    println!("{out}{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(o.status.code(), Some(0), "the demo failed");
    for line in [
        "billing taken over after SIGKILL",
        "email_outbox led again after unpause",
        "webhook_delivery taken over from a frozen leader",
        "dunning occurrence completed once after SIGKILL of its leader",
        "webhook_outbox handed over after SIGTERM",
        "duplicates past idempotency keys: 0",
        "losses:                  0",
        "all invariants held",
    ] {
        assert!(out.contains(line), "report lacks {line:?}");
    }
    let dir = out
        .lines()
        .find_map(|l| l.strip_prefix("started a throwaway Postgres in "))
        .and_then(|l| l.split(" on port").next())
        .expect("the demo names its cluster dir");
    assert!(
        !std::path::Path::new(dir).exists(),
        "the throwaway cluster {dir} was not removed"
    );
}

#[test]
fn without_postgres_binaries_the_demo_names_the_package_to_install() {
    let o = Command::new(env!("CARGO_BIN_EXE_ticklease"))
        .args(["demo"])
        .env_remove("DATABASE_URL")
        .env("TICKLEASE_PG_BINDIR", "/nonexistent")
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("install the Debian package postgresql-15"), "{err}");
}
