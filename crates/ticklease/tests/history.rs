//! The tick history (migration 0005), on real Postgres: every outcome lands
//! with its label, a term taken over without a RELEASE lands as lost,
//! retention holds, the app role cannot rewrite it, and the writes stay
//! cheap.

use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use futures::FutureExt;
use tokio::time::Instant;
use tokio_postgres::error::SqlState;

use ticklease::{
    Acquire, HistoryKind, HistoryStore, Lead, LeaseStore, Manager, PgStore, PgStoreOptions, Release, Role,
    HISTORY_LIMIT_MAX,
};
use ticklease_testkit::{connect, direct, migrated_db, scalar, test_config, PgCluster};

const HOUR: Duration = Duration::from_secs(3600);
const DAY: Duration = Duration::from_secs(86_400);

fn billing() -> Role {
    Role::new("billing").unwrap()
}

/// (what, outcome or by, reason, error) of each entry, oldest first.
async fn entries(store: &PgStore) -> Vec<(String, String, Option<String>, Option<String>)> {
    let mut all: Vec<_> = store
        .history(Some(&billing()), DAY, HISTORY_LIMIT_MAX)
        .await
        .unwrap()
        .into_iter()
        .map(|e| match e.kind {
            HistoryKind::Term {
                outcome,
                reason,
                error,
                ..
            } => ("term".to_string(), outcome, reason, error),
            HistoryKind::Pause { by, reason } => ("pause".into(), by, Some(reason), None),
            HistoryKind::Unpause { by } => ("unpause".into(), by, None, None),
            HistoryKind::RunNow { by } => ("run_now".into(), by, None, None),
            other => panic!("{other:?}"),
        })
        .collect();
    all.reverse();
    all
}

#[tokio::test]
async fn every_outcome_lands_with_its_label() {
    let config = test_config();
    let db = migrated_db(PgCluster::shared()).await;
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let manager = Manager::start(store, config, [billing()]).await.unwrap();
    let tick = Duration::from_millis(1);
    let ok = manager
        .lead(&billing(), tick, |_| async { Ok::<_, std::io::Error>(()) })
        .await
        .unwrap();
    assert!(matches!(ok, Lead::Completed { .. }));
    manager.store().run_now(&billing()).await.unwrap();
    let failed = manager
        .lead(&billing(), tick, |_| async {
            Err::<(), _>(std::io::Error::other("card declined"))
        })
        .await
        .unwrap();
    assert!(matches!(failed, Lead::Failed { .. }));
    manager.store().run_now(&billing()).await.unwrap();
    let panicked = std::panic::AssertUnwindSafe(manager.lead(&billing(), tick, |_| async {
        if true {
            panic!("index out of bounds");
        }
        Ok::<_, std::io::Error>(())
    }))
    .catch_unwind()
    .await;
    assert!(panicked.is_err());
    manager.store().run_now(&billing()).await.unwrap();
    // Lost: paused under the work.
    let lead = tokio::spawn({
        let manager = manager.clone();
        async move {
            manager
                .lead(&billing(), tick, |t| async move {
                    t.cancelled().await;
                    Ok::<_, std::io::Error>(())
                })
                .await
        }
    });
    while !manager.store().status().await.unwrap()[0].held {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    manager
        .store()
        .pause(&billing(), "alice", "rotate keys")
        .await
        .unwrap();
    assert!(matches!(lead.await.unwrap().unwrap(), Lead::Lost { .. }));
    manager.store().unpause(&billing()).await.unwrap();
    // Interrupted: shutdown under the work.
    let lead = tokio::spawn({
        let manager = manager.clone();
        async move {
            manager
                .lead(&billing(), tick, |t| async move {
                    t.cancelled().await;
                    Ok::<_, std::io::Error>(())
                })
                .await
        }
    });
    while !manager.store().status().await.unwrap()[0].held {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    manager.shutdown();
    assert!(matches!(lead.await.unwrap().unwrap(), Lead::Interrupted { .. }));
    assert!(manager.wait_released(Duration::from_secs(2)).await);

    let user: String = scalar(&connect(&db).await.unwrap(), "SELECT session_user::text").await;
    let got = entries(manager.store()).await;
    let term = |outcome: &str, reason: Option<&str>, error: Option<&str>| {
        (
            "term".to_string(),
            outcome.to_string(),
            reason.map(String::from),
            error.map(String::from),
        )
    };
    let run_now = ("run_now".to_string(), user.clone(), None, None);
    assert_eq!(
        got,
        [
            term("completed", None, None),
            run_now.clone(),
            term("failed", None, Some("card declined")),
            run_now.clone(),
            term("panicked", None, Some("index out of bounds")),
            run_now,
            term("lost", Some("paused"), None),
            ("pause".into(), "alice".into(), Some("rotate keys".into()), None),
            ("unpause".into(), user, None, None),
            term("interrupted", None, None),
        ]
    );
    let status = manager.store().status().await.unwrap();
    assert_eq!(status[0].last_outcome.as_deref(), Some("interrupted"));
}

/// A holder that dies holding its term never RELEASEs: the ACQUIRE that
/// takes the role over records the term as lost (expired).
#[tokio::test]
async fn a_term_its_dead_holder_never_released_lands_as_lost_when_taken_over() {
    let config = test_config();
    let db = migrated_db(PgCluster::shared()).await;
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let ttl = Duration::from_millis(200);
    let Acquire::Acquired(dead) = store.acquire(&billing(), "dead", ttl, HOUR).await.unwrap() else {
        panic!("free role");
    };
    tokio::time::sleep(ttl * 2).await;
    let Acquire::Acquired(next) = store.acquire(&billing(), "next", ttl, HOUR).await.unwrap() else {
        panic!("the dead holder's lease ran out");
    };
    // Its late RELEASE (a frozen holder resuming) finds the term over and adds nothing.
    assert!(!store
        .release(&billing(), dead.token, Release::Lost, HOUR)
        .await
        .unwrap());
    let history = store.history(None, DAY, 10).await.unwrap();
    assert_eq!(history.len(), 1, "{history:?}");
    match &history[0].kind {
        HistoryKind::Term {
            token,
            holder,
            outcome,
            reason,
            ..
        } => {
            assert_eq!((*token, holder.as_deref()), (dead.token.0, Some("dead")));
            assert_eq!((outcome.as_str(), reason.as_deref()), ("lost", Some("expired")));
        }
        other => panic!("{other:?}"),
    }
    assert!(next.token > dead.token);
}

/// Two roles writing in turn (ids are shared, so a prune keyed on the id
/// alone would skip one of them for good): each keeps about its limit.
#[tokio::test]
async fn retention_holds_per_role_under_10000_ticks() {
    let db = migrated_db(PgCluster::shared()).await;
    let owner = connect(&direct(&db)).await.unwrap();
    owner
        .batch_execute(
            "UPDATE leader_history_settings SET keep_per_role = 100;
             DO $$ DECLARE t bigint; r text; BEGIN
               FOR i IN 1..10000 LOOP
                 r := CASE WHEN i % 2 = 0 THEN 'billing' ELSE 'dunning' END;
                 SELECT holder_token INTO t FROM leader_acquire(r, 'h', 60000, 1, NULL);
                 PERFORM leader_release(r, t, false, NULL, 'interrupted', NULL, NULL);
               END LOOP;
             END $$;",
        )
        .await
        .unwrap();
    for role in ["billing", "dunning"] {
        let kept: i64 = scalar(
            &owner,
            &format!("SELECT count(*) FROM leader_history WHERE role = '{role}'"),
        )
        .await;
        // A prune on one write in 16 on average: 250 is 150 writes without
        // one, a chance of (15/16)^150 ≈ 6e-5.
        assert!(
            (100..=250).contains(&kept),
            "{role}: {kept} rows kept for a limit of 100"
        );
    }
    // By age: rows older than keep_for go at the next prunes.
    owner
        .batch_execute(
            "UPDATE leader_history SET at = now() - interval '40 days';
             DO $$ DECLARE t bigint; BEGIN
               FOR i IN 1..400 LOOP
                 SELECT holder_token INTO t FROM leader_acquire('billing', 'h', 60000, 1, NULL);
                 PERFORM leader_release('billing', t, false, NULL, 'interrupted', NULL, NULL);
               END LOOP;
             END $$;",
        )
        .await
        .unwrap();
    let old: i64 = scalar(
        &owner,
        "SELECT count(*) FROM leader_history WHERE role = 'billing' AND at < now() - interval '30 days'",
    )
    .await;
    assert_eq!(old, 0, "rows past keep_for are pruned");
}

/// RELEASE takes only known loss reasons (the app role names them), and
/// every text the history keeps is cut to 500 characters.
#[tokio::test]
async fn history_text_is_bounded_and_reasons_are_known_labels() {
    let db = migrated_db(PgCluster::shared()).await;
    let owner = connect(&direct(&db)).await.unwrap();
    let token: i64 = scalar(
        &owner,
        &format!(
            "SELECT holder_token FROM leader_acquire('billing', '{}', 60000, 1, NULL)",
            // The longest holder id ACQUIRE takes (migration 0007 refuses longer).
            "h".repeat(200)
        ),
    )
    .await;
    let err = owner
        .batch_execute(&format!(
            "SELECT leader_release('billing', {token}, false, NULL, 'lost', 'expired', NULL)"
        ))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::INVALID_PARAMETER_VALUE), "{err}");
    owner
        .batch_execute(&format!(
            "SELECT leader_release('billing', {token}, false, 1000, 'failed', NULL, '{}')",
            "e".repeat(5000)
        ))
        .await
        .unwrap();
    let (holder, error): (i32, i32) = {
        let row = owner
            .query_one("SELECT length(holder_id), length(error) FROM leader_history", &[])
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!((holder, error), (200, 500));
}

#[tokio::test]
async fn the_app_role_reads_history_but_cannot_rewrite_it() {
    static USERS: AtomicU32 = AtomicU32::new(0);
    let db = migrated_db(PgCluster::shared()).await;
    let owner = connect(&direct(&db)).await.unwrap();
    let user = format!(
        "hist_app_{}_{}",
        std::process::id(),
        USERS.fetch_add(1, Ordering::Relaxed)
    );
    owner
        .batch_execute(&format!("CREATE ROLE {user} LOGIN IN ROLE ticklease_app"))
        .await
        .unwrap();
    let mut as_app = direct(&db);
    as_app.user(&user);
    let app = connect(&as_app).await.unwrap();
    let token: i64 = scalar(
        &app,
        "SELECT holder_token FROM leader_acquire('billing', 'a', 60000, 1)",
    )
    .await;
    app.batch_execute(&format!("SELECT leader_release('billing', {token}, true, NULL)"))
        .await
        .unwrap();
    let n: i64 = scalar(&app, "SELECT count(*) FROM leader_history").await;
    assert_eq!(n, 1);
    for sql in [
        "INSERT INTO leader_history (role, kind) VALUES ('billing', 'pause')".to_string(),
        "UPDATE leader_history SET outcome = 'completed'".into(),
        "DELETE FROM leader_history".into(),
        "TRUNCATE leader_history".into(),
        "UPDATE leader_history_settings SET keep_per_role = 10".into(),
        "SELECT leader_history_add('billing', 'pause', NULL, NULL, NULL, NULL, 'x', 'mallory', NULL)".into(),
    ] {
        let err = app.batch_execute(&sql).await.expect_err(&sql);
        assert_eq!(
            err.code(),
            Some(&SqlState::INSUFFICIENT_PRIVILEGE),
            "{sql}: {err}"
        );
    }
}

/// With a full history (10,000 rows for the role, pruned on one write in
/// 16 on average), RELEASE stays far inside the statement timeout.
#[tokio::test]
async fn history_writes_stay_inside_the_lease_statements_time_budget() {
    let config = test_config();
    let db = migrated_db(PgCluster::shared()).await;
    let owner = connect(&direct(&db)).await.unwrap();
    owner
        .batch_execute(
            "DO $$ DECLARE t bigint; BEGIN
               FOR i IN 1..10000 LOOP
                 SELECT holder_token INTO t FROM leader_acquire('billing', 'h', 60000, 1, NULL);
                 PERFORM leader_release('billing', t, false, NULL, 'interrupted', NULL, NULL);
               END LOOP;
             END $$;",
        )
        .await
        .unwrap();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let mut took = Vec::new();
    for _ in 0..64 {
        let Acquire::Acquired(term) = store
            .acquire(&billing(), "h", config.lease_ttl(), Duration::from_millis(1))
            .await
            .unwrap()
        else {
            panic!("free role");
        };
        let started = Instant::now();
        assert!(store
            .release(
                &billing(),
                term.token,
                Release::Interrupted,
                Duration::from_millis(1)
            )
            .await
            .unwrap());
        took.push(started.elapsed());
    }
    took.sort();
    let max = *took.last().unwrap();
    assert!(
        max < config.statement_timeout() / 4,
        "slowest RELEASE {max:?} (median {:?}) against a statement timeout of {:?}",
        took[took.len() / 2],
        config.statement_timeout()
    );
}

/// Item 12 of issue 22: retention ran only on a role's own writes, so a role
/// no longer written (a removed family key) kept its history for good. Any
/// role's writes now age out the oldest rows of every role.
#[tokio::test]
async fn history_of_a_role_no_longer_written_ages_out() {
    let db = migrated_db(PgCluster::shared()).await;
    let owner = connect(&direct(&db)).await.unwrap();
    owner
        .batch_execute(
            "UPDATE leader_history_settings SET keep_per_role = 10, keep_for = interval '1 hour';
             INSERT INTO leader_history (role, kind, at, reason, by)
             SELECT 'tenant:gone', 'pause', now() - interval '2 hours', 'r', 'ops' FROM generate_series(1, 40);
             INSERT INTO leader_history (role, kind, at, reason, by)
             SELECT 'tenant:gone', 'pause', now() - interval '10 minutes', 'r', 'ops' FROM generate_series(1, 5);",
        )
        .await
        .unwrap();
    // Another role's writes: one in 16 prunes, so 200 make a prune all but certain (1 - 2e-6).
    for _ in 0..200 {
        owner
            .batch_execute(
                "SELECT leader_history_add('billing', 'run_now', NULL, NULL, NULL, NULL, NULL, 'ops', NULL)",
            )
            .await
            .unwrap();
    }
    let left: i64 = scalar(
        &owner,
        "SELECT count(*) FROM leader_history WHERE role = 'tenant:gone'",
    )
    .await;
    assert_eq!(left, 5, "rows older than keep_for are gone, newer ones stay");
}

/// A role gone for good can be forgotten by an operator: its lease row and
/// history are deleted, unless a term is live or it is paused.
#[tokio::test]
async fn an_operator_forgets_an_idle_role_but_not_a_held_or_paused_one() {
    let db = migrated_db(PgCluster::shared()).await;
    let owner = connect(&direct(&db)).await.unwrap();
    let token: i64 = scalar(
        &owner,
        "SELECT holder_token FROM leader_acquire('tenant_sync:acme', 'h', 60000, 1, NULL)",
    )
    .await;
    assert!(
        !scalar::<bool>(&owner, "SELECT leader_forget('tenant_sync:acme')").await,
        "held"
    );
    owner
        .batch_execute(&format!(
            "SELECT leader_release('tenant_sync:acme', {token}, true, NULL, 'completed', NULL, NULL);
             SELECT leader_pause('tenant_sync:acme', 'ops', 'x');"
        ))
        .await
        .unwrap();
    assert!(
        !scalar::<bool>(&owner, "SELECT leader_forget('tenant_sync:acme')").await,
        "paused"
    );
    owner
        .batch_execute("SELECT leader_unpause('tenant_sync:acme')")
        .await
        .unwrap();
    assert!(scalar::<bool>(&owner, "SELECT leader_forget('tenant_sync:acme')").await);
    let rows: i64 = scalar(
        &owner,
        "SELECT (SELECT count(*) FROM leader_leases WHERE role = 'tenant_sync:acme')
              + (SELECT count(*) FROM leader_history WHERE role = 'tenant_sync:acme')",
    )
    .await;
    assert_eq!(rows, 0);
    let err = owner
        .batch_execute("SELECT leader_forget('tenant_sync:acme')")
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(&SqlState::NO_DATA_FOUND), "{err}");
}
