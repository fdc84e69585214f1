//! The status page, loaded in a real browser (headless Chromium, installed
//! by `scripts/test`) from a database with a known history, and checked through
//! the DOM the browser built; a screenshot is kept in the target dir.

use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use ticklease::{Manager, Metrics, PgStore, PgStoreOptions, Role, TimelineSlice};
use ticklease_testkit::{connect, direct, migrated_db, test_config, PgCluster};

async fn serve(db: &tokio_postgres::Config, roles: Vec<Role>) -> (String, CancellationToken) {
    // The default statement timeout (2 s), as `ticklease metrics` serves it:
    // the page's cost is checked apart from the machine's load.
    let config = ticklease::Config::default();
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let mut registry = prometheus_client::registry::Registry::with_prefix("ticklease");
    let metrics = Metrics::register(&mut registry, roles);
    let (addr, stop) = ticklease_testkit::serve_metrics(registry, metrics, store).await;
    (format!("http://{addr}/"), stop)
}

/// Runs headless Chromium on `url` with `args`; its stdout.
async fn chromium(args: &[&str], url: &str) -> String {
    let output = tokio::time::timeout(
        Duration::from_secs(90),
        tokio::process::Command::new("chromium")
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
            ])
            .args(args)
            .arg(url)
            .kill_on_drop(true)
            .output(),
    )
    .await
    .expect("chromium answered within 90 s")
    .expect("chromium runs (Debian package chromium; scripts/test installs it)");
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).unwrap()
}

#[tokio::test]
async fn the_page_shows_roles_holders_an_escaped_pause_reason_and_the_timeline_in_a_browser() {
    let config = test_config();
    let db = migrated_db(PgCluster::shared()).await;
    let roles = vec![Role::new("billing").unwrap(), Role::new("email_outbox").unwrap()];
    let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let manager = Manager::start(store, config, roles.clone()).await.unwrap();
    let tick = Duration::from_millis(1);
    for _ in 0..3 {
        manager
            .lead(&roles[0], tick, |_| async { Ok::<_, std::io::Error>(()) })
            .await
            .unwrap();
    }
    // The interval is 1 ms: a lead right after a tick may find it not due yet.
    let mut failed = false;
    for _ in 0..100 {
        let lead = manager
            .lead(&roles[0], tick, |_| async {
                Err::<(), _>(std::io::Error::other("declined"))
            })
            .await
            .unwrap();
        if matches!(lead, ticklease::Lead::Failed { .. }) {
            failed = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert!(failed, "a failing tick ran");
    use ticklease::LeaseStore;
    manager
        .store()
        .pause(&roles[1], "mallory", "<script>alert(1)</script>")
        .await
        .unwrap();
    // A live term: billing held by this manager while the page loads.
    manager.store().run_now(&roles[0]).await.unwrap();
    let hold = CancellationToken::new();
    let held = tokio::spawn({
        let (manager, hold, role) = (manager.clone(), hold.clone(), roles[0].clone());
        async move {
            loop {
                let hold = hold.clone();
                let lead = manager
                    .lead(&role, tick, |_| async move {
                        hold.cancelled().await;
                        Ok::<_, std::io::Error>(())
                    })
                    .await;
                // Not due yet (1 ms after the last tick): ask again.
                if !matches!(lead, Ok(ticklease::Lead::Refused(_))) {
                    return lead;
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    });
    while !manager.store().status().await.unwrap()[0].held {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // An earlier stretch of completed ticks, two hours ago.
    connect(&direct(&db))
        .await
        .unwrap()
        .batch_execute(
            "INSERT INTO leader_history (role, kind, at, token, holder_id, acquired_at, outcome)
             SELECT 'billing', 'term', now() - interval '2 hours' + m * interval '1 minute', m, 'old:1:2',
                    now() - interval '2 hours' + m * interval '1 minute' - interval '10 seconds', 'completed'
               FROM generate_series(1, 30) m",
        )
        .await
        .unwrap();
    let (url, stop) = serve(&db, roles).await;
    let dom = chromium(&["--dump-dom"], &url).await;
    let shot = format!("{}/status-page.png", env!("CARGO_TARGET_TMPDIR"));
    chromium(&[&format!("--screenshot={shot}"), "--window-size=1280,900"], &url).await;
    assert!(std::fs::metadata(&shot).unwrap().len() > 0);
    hold.cancel();
    held.await.unwrap().unwrap();
    stop.cancel();

    assert!(dom.contains("<tr data-role=\"billing\">"), "{dom}");
    assert!(dom.contains("<tr data-role=\"email_outbox\">"), "{dom}");
    assert!(dom.contains(manager.holder_id()), "the holder is shown: {dom}");
    // The reason is text, not markup: the browser built no script element.
    assert!(
        dom.contains("mallory: &lt;script&gt;alert(1)&lt;/script&gt;"),
        "{dom}"
    );
    assert!(!dom.contains("<script"), "{dom}");
    assert!(dom.contains("class=\"term completed\""), "a completed bar: {dom}");
    assert!(dom.contains("class=\"term failed\""), "a failed bar: {dom}");
    assert!(dom.contains("class=\"term held\""), "the live term's bar: {dom}");
    assert!(dom.contains("class=\"pause\""), "the pause marker: {dom}");
}

/// 50 roles × 24 h of one-minute ticks (72,000 terms): the timeline reads
/// at most a bounded number of history rows per role and slice (measured
/// with EXPLAIN ANALYZE on the store's own statement, so the check does not
/// depend on the machine's load), and every page load answers within the
/// store's statement timeout (2 s, the default) by a wide margin. Precise
/// numbers are in docs/benchmarks/status-page.md.
#[tokio::test]
async fn the_page_for_50_roles_and_a_day_of_minute_ticks_reads_a_bounded_number_of_rows_per_role_and_slice() {
    let db = migrated_db(PgCluster::shared()).await;
    let owner = connect(&direct(&db)).await.unwrap();
    owner
        .batch_execute(
            "INSERT INTO leader_leases (role) SELECT 'role_' || r FROM generate_series(1, 50) r;
             INSERT INTO leader_history (role, kind, at, token, holder_id, acquired_at, outcome)
             SELECT 'role_' || r, 'term', now() - m * interval '1 minute', m, 'host:1:' || r,
                    now() - m * interval '1 minute' - interval '20 seconds',
                    CASE WHEN m % 97 = 0 THEN 'failed' ELSE 'completed' END
               FROM generate_series(1, 50) r, generate_series(1, 1440) m;
             INSERT INTO leader_history (role, kind, at, reason, by)
             VALUES ('role_7', 'pause', now() - interval '12 hours', 'INC-42', 'alice');
             ANALYZE leader_history;",
        )
        .await
        .unwrap();

    // The cost: 50 roles × 30 slices of 48 minutes (48 terms each) read at
    // most TERMS_READ terms and as many notable ones per cell, not every
    // term of the window (72,000).
    // The function's own body, prepared and explained (a function call's
    // plan hides it); it runs without JIT, whose compile alone took 0.7 s.
    let (body, config): (String, String) = {
        let row = owner
            .query_one(
                "SELECT prosrc, array_to_string(proconfig, ',') FROM pg_proc
                  WHERE oid = 'leader_timeline(int8, int4, int4, int4)'::regprocedure",
                &[],
            )
            .await
            .unwrap();
        (row.get(0), row.get(1))
    };
    assert_eq!(config, "jit=off");
    let (buckets, day_ms) = (30, 86_400_000i64);
    let explain = format!(
        "PREPARE timeline (int8, int4, int4, int4) AS {body};
         EXPLAIN (ANALYZE, TIMING off) EXECUTE timeline ({day_ms}, {buckets}, {}, {})",
        TimelineSlice::CELLS_MAX,
        TimelineSlice::TERMS_READ
    );
    let plan: Vec<String> = owner
        .simple_query(&explain)
        .await
        .unwrap()
        .into_iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_string),
            _ => None,
        })
        .collect();
    let read = rows_read_from_history(&plan);
    let bound = 50 * buckets * 2 * i64::from(TimelineSlice::TERMS_READ);
    assert!(
        read <= bound,
        "the timeline read {read} history rows (bound {bound}):\n{}",
        plan.join("\n")
    );

    let roles: Vec<Role> = (1..=50)
        .map(|r| Role::new(format!("role_{r}")).unwrap())
        .collect();
    let (url, stop) = serve(&db, roles).await;
    let first = reqwest_free_get(&format!("{url}?hours=24")).await;
    assert!(first.contains("role_50"));
    assert!(
        first.contains("class=\"pause\""),
        "a pause 12 h ago is marked under 72,000 completed terms"
    );
    assert!(first.contains("class=\"term failed\""), "failed terms are marked");
    let mut took = Vec::new();
    for i in 0..10 {
        // Alternating windows (12 and 24 h): each load reads the store (a
        // window's page is kept a second; 23 would round up to 24).
        let url = format!("{url}?hours={}", 12 * (1 + i % 2));
        let started = Instant::now();
        let body = reqwest_free_get(&url).await;
        took.push(started.elapsed());
        assert!(body.len() < 2_000_000, "page of {} bytes", body.len());
    }
    stop.cancel();
    took.sort();
    println!(
        "page p50 {:?}, max {:?}; timeline read {read} rows",
        took[took.len() / 2],
        took.last().unwrap()
    );
    assert!(*took.last().unwrap() < Duration::from_secs(5), "{took:?}");
}

/// Rows the scans of `leader_history` in an EXPLAIN ANALYZE text plan
/// visited: (rows + rows removed by a filter) × loops, summed.
fn rows_read_from_history(plan: &[String]) -> i64 {
    let number_after = |line: &str, key: &str| -> Option<f64> {
        let rest = &line[line.find(key)? + key.len()..];
        let end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        rest[..end].parse().ok()
    };
    let mut total = 0.0;
    for (i, line) in plan.iter().enumerate() {
        if !(line.contains(" on leader_history") && line.contains("Scan")) {
            continue;
        }
        let rows = number_after(line, "rows=").unwrap_or(0.0);
        let loops = number_after(line, "loops=").unwrap_or(1.0);
        // The node's detail lines follow it, indented deeper, up to the next node.
        let removed: f64 = plan[i + 1..]
            .iter()
            .take_while(|l| !l.contains("->"))
            .filter_map(|l| number_after(l, "Rows Removed by Filter: "))
            .sum();
        total += (rows + removed) * loops;
    }
    total.round() as i64
}

/// The page escapes text from the database by the rule the CLI uses: a
/// bidi override (U+202E), an isolate (U+2066) or a control character is
/// shown as `\u{…}`, never passed to the browser.
#[tokio::test]
async fn the_page_shows_bidi_overrides_isolates_and_control_characters_escaped() {
    let db = migrated_db(PgCluster::shared()).await;
    connect(&direct(&db))
        .await
        .unwrap()
        .batch_execute(
            "SELECT leader_seed(ARRAY['billing']);
             SELECT leader_pause('billing', E'eve\\u202e', E'txt.exe\\u2066gpj\\u2069 \\u200f\\x1b[2J');",
        )
        .await
        .unwrap();
    let (url, stop) = serve(&db, vec![Role::new("billing").unwrap()]).await;
    let body = reqwest_free_get(&url).await;
    stop.cancel();
    for c in ['\u{202e}', '\u{2066}', '\u{2069}', '\u{200f}', '\u{1b}'] {
        assert!(!body.contains(c), "{c:?} passed to the page: {body}");
    }
    assert!(
        body.contains(r"eve\u{202e}: txt.exe\u{2066}gpj\u{2069} \u{200f}\u{1b}[2J"),
        "{body}"
    );
    assert_eq!(
        ticklease::HistoryEntry::escape("eve\u{202e}\u{1b}"),
        r"eve\u{202e}\u{1b}",
        "the library's one rule"
    );
}

/// A plain HTTP/1.0 GET over a socket (the test needs no HTTP client crate).
async fn reqwest_free_get(url: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let rest = url.strip_prefix("http://").unwrap();
    let (addr, path) = rest.split_once('/').unwrap();
    let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(format!("GET /{path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(
        response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200"),
        "{response:.300}"
    );
    response
}
