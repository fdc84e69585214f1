//! The wait a pause sets for the term it ended (issue 32), against what
//! else holds a role back: the holder's RELEASE ends the wait and nothing
//! else, a run-now clears a cooldown and not the wait.

use ticklease_testkit::{connect, migrated_db, scalar, PgCluster};

/// From the review of issue 32: a cron role's failed occurrence waits for
/// its backoff; a manual run (run-now) starts beside it; a pause ends that
/// manual term; its holder's RELEASE erased the backoff, so after the
/// unpause the failed occurrence was retried at once.
#[tokio::test]
async fn a_paused_manual_runs_release_keeps_the_failed_occurrences_backoff() {
    let db = migrated_db(PgCluster::shared()).await;
    let owner = connect(&ticklease_testkit::direct(&db)).await.unwrap();
    let ask =
        "SELECT holder_token FROM leader_acquire_occurrence('c1', 'h1', 10000, NULL, NULL, NULL, NULL, NULL,
                                                              '* * * * *', NULL)";
    let _: Option<i64> = scalar(&owner, ask).await;
    // The failed occurrence's backoff (as its RELEASE sets it).
    owner
        .batch_execute("UPDATE leader_leases SET not_before = now() + interval '1 hour' WHERE role = 'c1'")
        .await
        .unwrap();
    let _: bool = scalar(&owner, "SELECT leader_run_now('c1')").await;
    let manual: i64 = scalar::<Option<i64>>(&owner, ask)
        .await
        .expect("the manual run starts");
    let _: bool = scalar(&owner, "SELECT leader_pause('c1', 'ops', '')").await;
    let released: bool = scalar(
        &owner,
        &format!("SELECT leader_release('c1', {manual}, false, NULL, 'lost', 'paused', NULL)"),
    )
    .await;
    assert!(!released, "the paused term was over already");
    let _: bool = scalar(&owner, "SELECT leader_unpause('c1')").await;
    let (backoff, wait): (bool, bool) = {
        let row = owner
            .query_one(
                "SELECT coalesce(not_before > now() + interval '50 minutes', false), pause_wait_until IS NULL
                   FROM leader_leases WHERE role = 'c1'",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert!(backoff, "the failed occurrence's backoff stays");
    assert!(wait, "the holder's release ended the pause's wait");
}
