//! Any app login may create role rows (`leader_seed`, 10,000 a call, no
//! total): the status page and the metrics refresh read and render a
//! bounded number of them, say so, and still show the roles that matter.

use std::time::Duration;

use prometheus_client::registry::Registry;

use ticklease::metrics::{PAGE_ROLES_MAX, REFRESH_ROWS_MAX};
use ticklease::{Config, Manager, Metrics, PgStore, PgStoreOptions, Role};
use ticklease_testkit::{connect, http_get, migrated_db, serve_metrics, test_config, PgCluster};

async fn get(addr: std::net::SocketAddr, path: &str) -> String {
    let response = http_get(addr, path).await.unwrap();
    assert!(response.starts_with("HTTP/1.1 200"), "{path}: {response:.300}");
    response
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn more_role_rows_than_the_bounds_leave_the_page_and_the_metrics_bounded_and_saying_so() {
    let db = migrated_db(PgCluster::shared()).await;
    let billing = Role::new("billing").unwrap();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&test_config()))
        .await
        .unwrap();
    let manager = Manager::start(store, test_config(), [billing.clone()])
        .await
        .unwrap();
    manager
        .lead(&billing, Duration::from_secs(3600), |_| async {
            Ok::<_, std::io::Error>(())
        })
        .await
        .unwrap();
    // More rows than a refresh reads, as an app login can make them.
    let seeded = REFRESH_ROWS_MAX + 2_000;
    let client = connect(&db).await.unwrap();
    for start in (0..seeded).step_by(5_000) {
        client
            .batch_execute(&format!(
                "SELECT leader_seed(array(SELECT 'seeded_' || g FROM generate_series({start}, {}) AS g))",
                (start + 5_000).min(seeded) - 1
            ))
            .await
            .unwrap();
    }
    let total = seeded + 1;

    let config = Config::default();
    let status = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let mut registry = Registry::with_prefix("ticklease");
    let metrics = Metrics::register(
        &mut registry,
        [billing.clone(), Role::new("seeded_9999").unwrap()],
    );
    let (addr, stop) = serve_metrics(registry, metrics, status).await;

    let page = get(addr, "/").await;
    let rows = page.matches("<tr data-role=").count();
    assert_eq!(rows, PAGE_ROLES_MAX, "roles rendered");
    assert!(
        page.contains(&format!("showing {PAGE_ROLES_MAX} of {total} roles")),
        "the page says rows were left out"
    );
    assert!(
        page.contains("<tr data-role=\"billing\">"),
        "the role that ticked is shown"
    );
    assert!(page.len() < 2_000_000, "page of {} bytes", page.len());

    // Declared roles are read by name: none is left out, whatever the table holds.
    let scrape = get(addr, "/metrics").await;
    assert!(
        scrape.contains("ticklease_leader_status_rows_left_out 0"),
        "{scrape}"
    );
    assert!(
        scrape.contains("ticklease_leader_last_tick_state{role=\"billing\",state=\"ok\"} 1"),
        "{scrape}"
    );
    assert!(
        scrape.contains("ticklease_leader_last_tick_state{role=\"seeded_9999\",state=\"never_ran\"} 1"),
        "{scrape}"
    );
    stop.cancel();
}

/// The shared buffers one query touched (`EXPLAIN (ANALYZE, BUFFERS)`), with `$1` and `$2` bound.
async fn buffers_touched(client: &tokio_postgres::Client, sql: &str, params: &str) -> i64 {
    let sql = sql
        .lines()
        .filter(|l| !l.trim_start().starts_with("--"))
        .collect::<Vec<_>>()
        .join("\n");
    client
        .batch_execute(&format!("PREPARE measured AS {sql}"))
        .await
        .unwrap();
    let lines = client
        .query(
            &format!("EXPLAIN (ANALYZE, BUFFERS) EXECUTE measured({params})"),
            &[],
        )
        .await
        .unwrap();
    client.batch_execute("DEALLOCATE measured").await.unwrap();
    // The first "Buffers:" line is the top node's: the whole query's.
    let line: String = lines
        .iter()
        .map(|r| r.get::<_, String>(0))
        .find(|l| l.contains("Buffers: shared"))
        .unwrap();
    ["hit=", "read="]
        .iter()
        .filter_map(|k| line.split(k).nth(1))
        .map(|v| {
            v.split(|c: char| !c.is_ascii_digit())
                .next()
                .unwrap()
                .parse::<i64>()
                .unwrap()
        })
        .sum()
}

/// The exporter's and the page's read is bounded by its own work (the
/// review's F4: 400,000 rows from one app login timed it out): the buffers a
/// bounded STATUS touches do not grow with the rows any login adds, past
/// where it stops counting.
#[tokio::test]
async fn a_bounded_status_touches_as_many_buffers_over_300_000_rows_as_over_150_000() {
    let db = migrated_db(PgCluster::shared()).await;
    let client = connect(&db).await.unwrap();
    let sql = include_str!("../src/store/status_bounded.sql");
    let params = format!("{PAGE_ROLES_MAX}, {}", ticklease::STATUS_COUNTED_MAX);
    let mut touched = Vec::new();
    for (from, upto) in [(0, 150_000), (150_000, 300_000)] {
        for start in (from..upto).step_by(10_000) {
            client
                .batch_execute(&format!(
                    "SELECT leader_seed(array(SELECT 'seeded_' || g FROM generate_series({start}, {}) AS g))",
                    start + 9_999
                ))
                .await
                .unwrap();
        }
        // As autovacuum leaves it: all visible, statistics fresh.
        client
            .batch_execute("VACUUM ANALYZE leader_leases")
            .await
            .unwrap();
        touched.push(buffers_touched(&client, sql, &params).await);
    }
    assert!(
        touched[1] <= touched[0] + touched[0] / 10,
        "buffers touched over 150,000 and 300,000 rows: {touched:?}"
    );
}

/// A role's last outcome is read through the history's (role, id) index,
/// whatever other roles wrote since (the review: ordered by id alone, the
/// planner walked the history backwards from its newest row, 600 ms over
/// 171,000 rows of 38 roles, and a scheduler with S = 0.5 s could not start).
#[tokio::test]
async fn a_role_s_last_outcome_costs_a_few_buffers_whatever_other_roles_wrote_since() {
    let db = migrated_db(PgCluster::shared()).await;
    let owner = connect(&ticklease_testkit::direct(&db)).await.unwrap();
    owner
        .batch_execute(
            "SELECT leader_seed(ARRAY['quiet', 'busy']);
             INSERT INTO leader_history (role, kind, token, holder_id, outcome, at)
             VALUES ('quiet', 'term', 1, 'h', 'completed', now() - interval '1 day');
             INSERT INTO leader_history (role, kind, token, holder_id, outcome)
             SELECT 'busy' || (g % 37), 'term', g + 1, 'h', 'completed' FROM generate_series(1, 200000) AS g",
        )
        .await
        .unwrap();
    owner
        .batch_execute("VACUUM ANALYZE leader_history")
        .await
        .unwrap();
    let client = connect(&db).await.unwrap();
    let sql = include_str!("../src/store/status_of.sql");
    let touched = buffers_touched(&client, sql, "ARRAY['quiet']").await;
    // About 130: the live keys read once (a constant), 4 for the history.
    assert!(touched < 500, "{touched} buffers for one role's row");
}
