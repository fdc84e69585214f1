//! A Postgres failover that loses the last commits: tokens stay unique, and a
//! replica with a multi-host URL follows the new primary without a restart.

use std::time::Duration;

use ticklease::{
    Acquire, Family, Lead, LeaseStore, LossReason, Manager, PgConnect, PgStore, PgStoreOptions, Release,
    Renew, Role, Scheduler, Token,
};
use ticklease_testkit::{
    connect, primary_and_standby, scalar, test_config, url_for_hosts, Fault, FaultProxy, PgCluster, Standby,
};

fn billing() -> Role {
    Role::new("billing").unwrap()
}

async fn acquired(store: &PgStore, holder: &str) -> Token {
    match store
        .acquire(
            &billing(),
            holder,
            Duration::from_secs(30),
            Duration::from_millis(1),
        )
        .await
        .unwrap()
    {
        Acquire::Acquired(term) => term.token,
        other => panic!("{holder}: {other:?}"),
    }
}

/// Leader A acquires token T on the primary; that commit never reaches the
/// standby; the standby is promoted. The promoted server's next ACQUIRE
/// issues a token above T, and A, whose multi-host URL now reaches the new
/// primary, fences nothing with T and its RENEW reports the takeover.
#[tokio::test]
async fn a_lossy_promotion_issues_tokens_above_the_lost_ones() {
    let (primary, standby, db) = primary_and_standby().await;
    let options = PgStoreOptions {
        pool_size: 2,
        statement_timeout: Duration::from_secs(2),
    };
    // A parses the URL as the CLI and the worker do.
    let url: PgConnect = url_for_hosts(&[&primary, standby.cluster()], &db)
        .parse()
        .unwrap();
    let a = PgStore::connect(url, options).await.unwrap();
    let t0 = acquired(&a, "a").await;
    assert!(a
        .release(&billing(), t0, Release::Interrupted, Duration::from_millis(1))
        .await
        .unwrap());
    standby.wait_caught_up(&primary).await.unwrap();

    standby.cut_wal_receipt().await.unwrap();
    let lost = acquired(&a, "a").await;
    primary.stop_fast();
    standby.promote().await.unwrap();

    let b = PgStore::connect(standby.cluster().config(&db), options)
        .await
        .unwrap();
    let next = acquired(&b, "b").await;
    assert!(
        next > lost,
        "token {next} issued again after the failover (lost {lost})"
    );

    // A's connections to the old primary are dead: missed beats, then its
    // multi-host URL reaches the new primary, where its term is over.
    let mut renew = None;
    for _ in 0..20 {
        match a.renew(&billing(), lost, Duration::from_secs(30)).await {
            Ok(r) => {
                renew = Some(r);
                break;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    assert_eq!(renew, Some(Renew::Lost(LossReason::TakenOver)));
    let lost_connections = exported(&a, "leader_connections_lost_total").await;
    assert!(
        lost_connections >= Some(1.0),
        "the old primary's connections ended: {lost_connections:?}"
    );
    let fenced: bool = scalar(
        &connect(&standby.cluster().config(&db)).await.unwrap(),
        &format!("SELECT leader_fence_v2('billing', {})", lost.get()),
    )
    .await;
    assert!(!fenced, "the lost token passes the fence on the new primary");
}

/// With `host=A,B`, A the primary black-holed and B a standby, a pass over
/// the hosts is one to try again (A may answer next), not B's refusal as a
/// read-only server, which named the standby where the primary was slow.
#[tokio::test]
async fn a_standbys_refusal_beside_a_primary_that_timed_out_is_no_answer() {
    let (primary, standby, db) = primary_and_standby().await;
    let upstream: std::net::SocketAddr = format!("127.0.0.1:{}", primary.port()).parse().unwrap();
    let a = FaultProxy::start(upstream).await.unwrap();
    a.set(Fault::Blackhole);
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs=read-write",
        a.port(),
        standby.cluster().port()
    );
    let hosts = ticklease::hosts::Hosts::new(&url.parse().unwrap(), Duration::from_secs(2));
    let failed = hosts.connect().await.err().expect("no host is writable in time");
    assert!(
        matches!(failed, ticklease::hosts::HostsError::TimedOut { .. }),
        "{failed:?}"
    );
    a.set(Fault::Pass);
    assert!(hosts.connect().await.is_ok(), "the primary answers again");
}

/// Item 3 of issue 22: with `host=A,B` and A black-holed (it accepts TCP and
/// never answers), every new connection spent its whole deadline on A and B
/// was never tried: no tick ran. Each host now gets a share of the deadline
/// and the host that answered last goes first: single roles, a family and
/// the coordination session all run through B.
#[tokio::test]
async fn a_black_holed_first_host_costs_a_share_of_the_deadline_not_a_stop() {
    let cluster = PgCluster::shared();
    let (db, a) = migrated_behind_a_proxy().await;
    a.set(Fault::Blackhole);
    let url = format!(
        "postgres://postgres@127.0.0.1:{},127.0.0.1:{}/{db}?target_session_attrs=read-write",
        a.port(),
        cluster.port()
    );
    let config = test_config();
    let store = PgStore::connect(
        url.parse::<PgConnect>().unwrap(),
        PgStoreOptions::from_config(&config),
    )
    .await
    .expect("the store reaches B")
    .with_direct(url.parse::<PgConnect>().unwrap())
    .await
    .expect("the coordination session reaches B");
    let manager = Manager::start(store, config, [billing()]).await.unwrap();
    let tenants = Family::new("tenant").unwrap();
    tenants.set(["a", "b", "c"]).unwrap();
    let (ticks, mut ticked) = tokio::sync::mpsc::unbounded_channel();
    let family_ticks = ticks.clone();
    let scheduler = Scheduler::new(manager)
        .job(&billing(), Duration::from_millis(50), move |tick| {
            let ticks = ticks.clone();
            async move {
                let _ = ticks.send(tick.role().to_string());
                Ok::<_, std::io::Error>(())
            }
        })
        .unwrap()
        .family(&tenants, Duration::from_millis(50), move |tick| {
            let ticks = family_ticks.clone();
            async move {
                let _ = ticks.send(tick.role().to_string());
                Ok::<_, std::io::Error>(())
            }
        })
        .unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let run = tokio::spawn(scheduler.run(stop.clone()));
    let mut seen = std::collections::BTreeMap::<String, usize>::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while seen.len() < 4 || seen.values().any(|n| *n < 3) {
        match tokio::time::timeout_at(deadline, ticked.recv()).await {
            Ok(Some(role)) => *seen.entry(role).or_default() += 1,
            _ => panic!("ticks in 20 s with host A black-holed: {seen:?}"),
        }
    }
    stop.cancel();
    assert!(run.await.unwrap().all_released());
}

/// Issue 35, item 1: with `host=A,B` and the statements on B, a statement
/// that outlived its timeout was cancelled on A (the URL's first host) and
/// kept running on B: an ACQUIRE waiting on a row lock later committed a
/// term its caller never learned of. The cancel now goes to every host, and
/// only the server whose backend it names acts on it.
#[tokio::test]
async fn a_timed_out_statement_is_cancelled_on_the_host_that_runs_it_not_the_urls_first() {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let mut owner = connect(&cluster.config(&db)).await.unwrap();
    ticklease::migrate(&mut owner).await.unwrap();
    // A: a port nothing listens on (connections are refused, so B runs every statement).
    let closed = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let url = format!(
        "postgres://postgres@127.0.0.1:{closed},127.0.0.1:{}/{db}",
        cluster.port()
    );
    let options = PgStoreOptions {
        pool_size: 2,
        statement_timeout: Duration::from_millis(500),
    };
    let store = PgStore::connect(url.parse::<PgConnect>().unwrap(), options)
        .await
        .unwrap();
    let lock = owner.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE leader_leases IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let err = store
        .acquire(&billing(), "h", Duration::from_secs(10), Duration::from_secs(60))
        .await;
    assert!(
        matches!(err, Err(ticklease::StoreError::Timeout { .. })),
        "{err:?}"
    );

    let observer = connect(&cluster.config(&db)).await.unwrap();
    let waiting = "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND wait_event_type = 'Lock'";
    let deadline = tokio::time::Instant::now() + Duration::from_secs(5);
    while scalar::<i64>(&observer, waiting).await > 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the timed-out ACQUIRE still waits on B: its cancel went elsewhere"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    lock.rollback().await.unwrap();
    let held: Option<String> = observer
        .query_one(
            "SELECT max(holder_id) FROM leader_leases WHERE role = 'billing'",
            &[],
        )
        .await
        .unwrap()
        .get(0);
    assert_eq!(held, None, "the cancelled ACQUIRE started no term");
}

/// `role`'s row on a server: its holder token, and its expiry.
async fn lease_row(server: &tokio_postgres::Client, role: &str) -> (Option<i64>, std::time::SystemTime) {
    let row = server
        .query_one(
            "SELECT holder_token, expires_at FROM leader_leases WHERE role = $1",
            &[&role],
        )
        .await
        .unwrap();
    (row.get(0), row.get(1))
}

/// Leads billing on `manager` until the term ends; the token reported first.
fn hold(
    manager: &Manager<PgStore>,
) -> (
    tokio::sync::oneshot::Receiver<Token>,
    tokio::task::JoinHandle<Lead<()>>,
) {
    let (started, token) = tokio::sync::oneshot::channel();
    let leader = manager.clone();
    let lead = tokio::spawn(async move {
        let work = |tick: ticklease::Tick| async move {
            let _ = started.send(tick.token());
            tick.cancelled().await;
            Ok::<_, std::io::Error>(())
        };
        leader
            .lead(&billing(), Duration::from_millis(1), work)
            .await
            .unwrap()
    });
    (token, lead)
}

/// Issue 35, item 2: a standby is promoted while the old primary stays
/// writable (its failover manager died and nothing demoted it). Every
/// process kept its statements on the old primary, the host that answered
/// last. Now a probe of the URL's hosts sees the promoted server on a higher
/// timeline: the term started on the old primary ends as `superseded` (its
/// work may be writing there) and is released on the promoted server; the
/// next term starts there and nothing reaches the old primary any more; a
/// process started meanwhile leads on the promoted server alone. The move
/// is a log line and is counted.
#[tokio::test]
async fn with_two_writable_servers_every_statement_goes_to_the_promoted_one() {
    let config = test_config();
    let Promoted {
        primary,
        standby,
        db,
        store,
        manager,
        first,
        lead,
    } = a_term_then_a_promotion(config).await;
    let promoted = tokio::time::Instant::now();
    let old = connect(&primary.config(&db)).await.unwrap();
    let new = connect(&standby.cluster().config(&db)).await.unwrap();

    the_term_ends_as_superseded_within_the_bound(lead, promoted, &config).await;
    // Until the probe saw the promotion, RENEWs went to the old primary;
    // from the loss on, nothing does.
    let left_old = lease_row(&old, "billing").await;
    let (second, lead) = hold(&manager);
    let second = second.await.unwrap();
    assert!(second > first);
    assert_eq!(
        lease_row(&new, "billing").await.0,
        Some(second.get()),
        "the next term is on the promoted server"
    );
    assert_eq!(
        lease_row(&old, "billing").await,
        left_old,
        "a statement reached the old primary"
    );
    let released = "SELECT reason FROM leader_history WHERE role = 'billing' AND token = $1";
    let reason: Option<String> = new.query_one(released, &[&first.get()]).await.unwrap().get(0);
    assert_eq!(
        reason.as_deref(),
        Some("superseded"),
        "released on the promoted server"
    );
    let standby_server = format!("127.0.0.1:{}", standby.cluster().port());
    assert_eq!(
        store.hosts().current().map(ToString::to_string),
        Some(standby_server)
    );
    assert_eq!(exported(&store, "leader_host_changes_total").await, Some(1.0));

    a_fresh_process_leads_on_the_promoted_server(
        &url_for_hosts(&[&primary, standby.cluster()], &db),
        &old,
        &new,
    )
    .await;
    manager.shutdown();
    lead.await.unwrap();
}

/// The value of metric `name` as a scrape of `store`'s replica exports it.
async fn exported(store: &PgStore, name: &str) -> Option<f64> {
    let mut registry = prometheus_client::registry::Registry::default();
    let metrics = ticklease::Metrics::register(&mut registry, [billing()]);
    metrics.refresh(store).await;
    let mut text = String::new();
    prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
}

/// The term started on the old primary ends as superseded within the
/// documented bound, S + 2 S / hosts + 200 ms (a RENEW's spacing), plus its
/// RELEASE (at most S) and a second for a loaded machine.
async fn the_term_ends_as_superseded_within_the_bound(
    lead: tokio::task::JoinHandle<Lead<()>>,
    promoted: tokio::time::Instant,
    config: &ticklease::Config,
) {
    let lost = tokio::time::timeout(Duration::from_secs(10), lead)
        .await
        .expect("the term ends");
    let s = config.statement_timeout();
    let bound = s + s + Duration::from_millis(200) + s + Duration::from_secs(1);
    let took = promoted.elapsed();
    assert!(took <= bound, "the term ended {took:?} after the promotion");
    assert!(
        matches!(
            lost.unwrap(),
            Lead::Lost {
                reason: LossReason::Superseded,
                ..
            }
        ),
        "the term of the superseded server ends as superseded"
    );
}

/// A process started now (it has seen no timeline yet) leads on the
/// promoted server alone.
async fn a_fresh_process_leads_on_the_promoted_server(
    url: &str,
    old: &tokio_postgres::Client,
    new: &tokio_postgres::Client,
) {
    let child = tokio::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_fresh_process_acquires_other_on_the_urls_hosts",
            "--ignored",
        ])
        .env(TWO_WRITABLE, url)
        .output()
        .await
        .unwrap();
    assert!(
        child.status.success(),
        "{}",
        String::from_utf8_lossy(&child.stdout)
    );
    let rows = "SELECT count(*) FROM leader_leases WHERE role = 'other'";
    assert_eq!(scalar::<i64>(new, rows).await, 1);
    assert_eq!(
        scalar::<i64>(old, rows).await,
        0,
        "a term started on the superseded server"
    );
}

/// The URL of the two writable servers, for the fresh process.
const TWO_WRITABLE: &str = "TICKLEASE_TEST_TWO_WRITABLE_URL";

/// Run by `with_two_writable_servers_every_statement_goes_to_the_promoted_one`
/// in a process of its own, which has seen no server's timeline yet.
#[tokio::test]
#[ignore = "a step of another test, run in a process of its own"]
async fn a_fresh_process_acquires_other_on_the_urls_hosts() {
    let url: PgConnect = std::env::var(TWO_WRITABLE)
        .expect("run by with_two_writable_servers_every_statement_goes_to_the_promoted_one")
        .parse()
        .unwrap();
    let store = PgStore::connect(url, PgStoreOptions::from_config(&test_config()))
        .await
        .unwrap();
    let other = Role::new("other").unwrap();
    let acquired = store
        .acquire(&other, "fresh", Duration::from_secs(30), Duration::from_millis(1))
        .await
        .unwrap();
    assert!(matches!(acquired, Acquire::Acquired(_)), "{acquired:?}");
}

/// Issue 42 item 3: a RELEASE that falls into a cut link (as into a
/// switchover's reconnect) is sent again within the lease's life: the role
/// is free once the link passes, not a TTL later, and the tick keeps its
/// outcome. Before, it was tried once and the lease ran out on its own.
#[tokio::test]
async fn a_release_that_cannot_finish_is_sent_again_within_the_lease() {
    let (db, proxy) = migrated_behind_a_proxy().await;
    let owner = connect(&PgCluster::shared().config(&db)).await.unwrap();
    let proxy = std::sync::Arc::new(proxy);
    let url = format!("postgres://postgres@127.0.0.1:{}/{db}", proxy.port());
    let config = long_lease(Duration::from_secs(10));
    let store = PgStore::connect(
        url.parse::<PgConnect>().unwrap(),
        PgStoreOptions::from_config(&config),
    )
    .await
    .unwrap();
    let manager = Manager::start(store, config, [billing()]).await.unwrap();
    let cut = tokio::time::Instant::now();
    let lead = {
        let proxy = proxy.clone();
        manager
            .lead(&billing(), Duration::from_secs(3600), |_tick| async move {
                // The work is done; the link fails as it ends, for 1.5 s.
                proxy.set(Fault::Blackhole);
                tokio::spawn(async move {
                    tokio::time::sleep(Duration::from_millis(1500)).await;
                    proxy.set(Fault::Pass);
                });
                Ok::<_, std::io::Error>(())
            })
            .await
            .unwrap()
    };
    assert!(matches!(lead, Lead::Completed { .. }), "{lead:?}");
    let held: bool = scalar(&owner, "SELECT holder_id IS NOT NULL FROM leader_leases").await;
    assert!(!held, "the role is free once the RELEASE got through");
    let outcome: String = scalar(
        &owner,
        "SELECT outcome FROM leader_history WHERE kind = 'term' ORDER BY id DESC LIMIT 1",
    )
    .await;
    assert_eq!(outcome, "completed");
    assert!(
        cut.elapsed() < Duration::from_secs(6),
        "released {:?} after the cut: within the lease's 10 s",
        cut.elapsed()
    );
}
/// A lease of `ttl`, long beside the other timings (S 500 ms): what a lost
/// statement costs is told apart from a TTL.
fn long_lease(ttl: Duration) -> ticklease::Config {
    ticklease::Config::builder()
        .lease_ttl(ttl)
        .heartbeat_every(Duration::from_secs(1))
        .statement_timeout(Duration::from_millis(500))
        .abandon_after(Duration::from_secs(3))
        .max_poll(Duration::from_secs(1))
        .build()
        .unwrap()
}

/// Issue 42 item 4 (the review's F2): only an outage is logged at debug.
/// A database the server says does not exist is its refusal, which warns at
/// every poll; a port nobody listens on is an outage, told by one line.
#[tokio::test]
async fn a_database_that_does_not_exist_is_no_outage_and_a_closed_port_is() {
    let cluster = PgCluster::shared();
    let options = PgStoreOptions::from_config(&test_config());
    let missing: PgConnect = cluster.url("no_such_database").parse().unwrap();
    let missing = PgStore::connect(missing, options).await.unwrap_err();
    assert!(!missing.is_outage(), "{missing:?}");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let closed: PgConnect = format!("postgres://postgres@127.0.0.1:{port}/app")
        .parse()
        .unwrap();
    let closed = PgStore::connect(closed, options).await.unwrap_err();
    assert!(closed.is_outage(), "{closed:?}");
}

/// Issue 42 item 2: an ACQUIRE whose commit waits for a stalled synchronous
/// standby does not answer within S; the client's cancel ends the wait and
/// the transaction commits locally ("might not have been replicated"), so
/// the role is held by a term nobody runs. The next ACQUIRE of the same
/// manager finds its own holder there, releases that term and starts one:
/// the lost answer costs no lease (before, the role waited it out).
#[tokio::test]
async fn an_acquire_whose_answer_a_stalled_synchronous_standby_kept_costs_no_lease() {
    let (primary, standby, db, owner) = synchronous_commits().await;
    let config = ticklease::Config::builder()
        .lease_ttl(Duration::from_secs(30))
        .heartbeat_every(Duration::from_secs(1))
        .statement_timeout(Duration::from_millis(500))
        .abandon_after(Duration::from_secs(3))
        .max_poll(Duration::from_secs(1))
        .build()
        .unwrap();
    let store = PgStore::connect(primary.config(&db), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let manager = Manager::start(store, config, [billing()]).await.unwrap();
    set_synchronous(&primary, &db, "'*'").await;
    standby.cut_wal_receipt().await.unwrap();
    let work = |_tick| async { Ok::<_, std::io::Error>(()) };
    let lost = manager.lead(&billing(), HOUR, work).await;
    assert!(
        lost.is_err(),
        "the ACQUIRE's commit waits for the standby: {lost:?}"
    );
    // The cancel ends the wait and the commit becomes visible, a moment later.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let holder: Option<String> = scalar(&owner, "SELECT holder_id FROM leader_leases").await;
        if holder.as_deref() == Some(manager.holder_id()) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never committed locally: {holder:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    set_synchronous(&primary, &db, "''").await;
    let started = tokio::time::Instant::now();
    let led = manager.lead(&billing(), HOUR, work).await.unwrap();
    assert!(matches!(led, Lead::Completed { .. }), "{led:?}");
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{:?}",
        started.elapsed()
    );
}

const HOUR: Duration = Duration::from_secs(3600);

/// The primary's `synchronous_standby_names`, reloaded; returns once it
/// holds: with a name, once the standby is `sync`; without, once a commit
/// on a fresh session no longer waits (the reload reached the checkpointer,
/// which releases the waiters).
async fn set_synchronous(primary: &PgCluster, db: &str, names: &str) {
    let owner = connect(&primary.config(db)).await.unwrap();
    owner
        .batch_execute(&format!("ALTER SYSTEM SET synchronous_standby_names = {names}"))
        .await
        .unwrap();
    owner.batch_execute("SELECT pg_reload_conf()").await.unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    while !synchronous_holds(primary, db, names != "''").await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "{names} never took effect"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn synchronous_holds(primary: &PgCluster, db: &str, on: bool) -> bool {
    let client = connect(&primary.config(db)).await.unwrap();
    if on {
        let sync: i64 = scalar(
            &client,
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
        )
        .await;
        return sync == 1;
    }
    let commit = client.batch_execute("SET synchronous_commit = on; SELECT txid_current()");
    tokio::time::timeout(Duration::from_millis(300), commit)
        .await
        .is_ok()
}

/// The review's F1 of the recovery above: two calls of one manager lead one
/// role. While the second's term runs, the first's ACQUIRE is cut off (the
/// table locked past S: its answer, a refusal, is lost); its next ACQUIRE
/// finds the manager's own holder there and leaves the term alone: it is
/// the second call's, live.
#[tokio::test]
async fn a_live_term_of_another_call_is_never_released_as_an_unanswered_acquires() {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    let mut owner = connect(&cluster.config(&db)).await.unwrap();
    ticklease::migrate(&mut owner).await.unwrap();
    let config = test_config();
    let store = PgStore::connect(cluster.config(&db), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let manager = Manager::start(store, config, [billing()]).await.unwrap();
    let started = std::sync::Arc::new(tokio::sync::Notify::new());
    let (finish, finished) = tokio::sync::oneshot::channel::<()>();
    let second = {
        let (manager, started) = (manager.clone(), started.clone());
        tokio::spawn(async move {
            let work = |tick: ticklease::Tick| async move {
                started.notify_one();
                tokio::select! {
                    _ = finished => Ok(()),
                    cause = tick.cancelled() => Err(format!("cancelled: {cause:?}")),
                }
            };
            manager.lead(&billing(), HOUR, work).await
        })
    };
    tokio::time::timeout(Duration::from_secs(10), started.notified())
        .await
        .expect("the second call leads");

    let done = |_tick| async { Ok::<_, std::io::Error>(()) };
    let locked = owner.transaction().await.unwrap();
    locked
        .batch_execute("LOCK TABLE leader_leases IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let cut = manager.lead(&billing(), HOUR, done).await;
    assert!(cut.is_err(), "the ACQUIRE waits for the lock: {cut:?}");
    locked.rollback().await.unwrap();
    let first = manager.lead(&billing(), HOUR, done).await.unwrap();
    assert!(
        matches!(first, Lead::Refused(ticklease::Refusal::Held { .. })),
        "{first:?}"
    );
    // Beats enough for a released term's RENEW to find it over.
    tokio::time::sleep(config.heartbeat_every() * 3).await;
    finish.send(()).unwrap();
    let second = second.await.unwrap().unwrap();
    assert!(matches!(second, Lead::Completed { .. }), "{second:?}");
}

/// A primary and its standby whose database's commits wait for a
/// synchronous standby once `synchronous_standby_names` names one.
async fn synchronous_commits() -> (
    PgCluster,
    ticklease_testkit::Standby,
    String,
    tokio_postgres::Client,
) {
    let (primary, standby, db) = primary_and_standby().await;
    let owner = connect(&primary.config(&db)).await.unwrap();
    owner
        .batch_execute(&format!("ALTER DATABASE {db} SET synchronous_commit = on"))
        .await
        .unwrap();
    (primary, standby, db, owner)
}

/// Issue 42 item 2: a stalled synchronous standby shows in a scrape: while
/// a commit of the replica's login waits for it, how many wait and the
/// longest wait; once the primary stops waiting for it, none.
#[tokio::test]
async fn a_stalled_synchronous_standby_shows_in_the_waits_a_scrape_exports() {
    let (primary, standby, db, _owner) = synchronous_commits().await;
    let config = test_config();
    let store = PgStore::connect(primary.config(&db), PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    assert_eq!(exported(&store, "leader_synchronous_waiting").await, Some(0.0));
    set_synchronous(&primary, &db, "'*'").await;
    standby.cut_wal_receipt().await.unwrap();
    // A commit no one cancels: it waits as long as the standby is away.
    let waiter = connect(&primary.config(&db)).await.unwrap();
    let waiting =
        tokio::spawn(async move { waiter.batch_execute("SELECT leader_seed(ARRAY['stalled'])").await });
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    loop {
        let longest = exported(&store, "leader_synchronous_wait_seconds").await.unwrap();
        if longest > 0.5 {
            assert!(exported(&store, "leader_synchronous_waiting").await.unwrap() >= 1.0);
            break;
        }
        assert!(tokio::time::Instant::now() < deadline, "no wait seen: {longest}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    set_synchronous(&primary, &db, "''").await;
    waiting.await.unwrap().unwrap();
    assert_eq!(exported(&store, "leader_synchronous_waiting").await, Some(0.0));
    assert_eq!(
        exported(&store, "leader_synchronous_wait_seconds").await,
        Some(0.0)
    );
}

/// Issue 42 item 3: a role loop whose poll failed in an outage asks again
/// once the server answers again (the store reconnects at most 0.5 s apart
/// during an outage, and its return wakes the loop), not `max_poll` (10 s
/// here) later: a restarted server costs a pooled URL without a direct one
/// no more than it costs one with.
#[tokio::test]
async fn a_poll_that_failed_in_an_outage_is_sent_again_once_the_server_is_back() {
    let (db, proxy) = migrated_behind_a_proxy().await;
    let url = format!("postgres://postgres@127.0.0.1:{}/{db}", proxy.port());
    let config = ticklease::Config::builder()
        .lease_ttl(Duration::from_secs(20))
        .heartbeat_every(Duration::from_secs(1))
        .statement_timeout(Duration::from_millis(500))
        .abandon_after(Duration::from_secs(3))
        .max_poll(Duration::from_secs(10))
        .build()
        .unwrap();
    let store = PgStore::connect(
        url.parse::<PgConnect>().unwrap(),
        PgStoreOptions::from_config(&config),
    )
    .await
    .unwrap();
    let manager = Manager::start(store, config, [billing()]).await.unwrap();
    proxy.set(Fault::Reset);
    let mut chance = ticklease::NextChance::new(&manager, &billing());
    let work = || async { Ok::<_, std::io::Error>(()) };
    let failed = manager
        .lead(&billing(), Duration::from_secs(3600), |_| work())
        .await;
    assert!(failed.is_err(), "{failed:?}");
    let back = {
        let waited = chance.wait(&failed);
        tokio::pin!(waited);
        // The outage outlasts a few reconnects; the wait is still on.
        assert!(tokio::time::timeout(Duration::from_millis(1500), &mut waited)
            .await
            .is_err());
        proxy.set(Fault::Pass);
        let back = tokio::time::Instant::now();
        assert!(waited.await);
        back
    };
    let lead = manager
        .lead(&billing(), Duration::from_secs(3600), |_| work())
        .await;
    assert!(matches!(lead, Ok(Lead::Completed { .. })), "{lead:?}");
    assert!(
        back.elapsed() < Duration::from_secs(4),
        "led {:?} after the server was back: a reconnect's step (0.5 s) and a statement, not max_poll (10 s)",
        back.elapsed()
    );
}

/// Issue 42 item 3: a term on a server that a promotion superseded ends when
/// the store sees the promotion (its connections move to the promoted
/// host), not at the term's next beat: with `heartbeat_every` 30 s here, the
/// beat would come half a minute after the term started.
#[tokio::test]
async fn a_term_on_a_superseded_server_ends_when_the_store_sees_the_promotion_not_at_its_next_beat() {
    let config = ticklease::Config::builder()
        .lease_ttl(Duration::from_secs(120))
        .heartbeat_every(Duration::from_secs(30))
        .statement_timeout(Duration::from_millis(500))
        .abandon_after(Duration::from_secs(60))
        .max_poll(Duration::from_secs(1))
        .build()
        .unwrap();
    // The servers stop when dropped: kept to the end.
    let Promoted {
        primary: _primary,
        standby: _standby,
        store,
        manager,
        lead,
        ..
    } = a_term_then_a_promotion(config).await;
    let promoted = tokio::time::Instant::now();
    let seen = loop {
        if store.hosts().events().host_changes >= 1 {
            break tokio::time::Instant::now();
        }
        assert!(
            promoted.elapsed() < Duration::from_secs(20),
            "the store never saw the promotion: {:?}",
            store.hosts().events()
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let lost = tokio::time::timeout(Duration::from_secs(40), lead)
        .await
        .expect("the term ends")
        .unwrap();
    assert!(
        matches!(
            lost,
            Lead::Lost {
                reason: LossReason::Superseded,
                ..
            }
        ),
        "{lost:?}"
    );
    assert!(
        seen.elapsed() < Duration::from_secs(3),
        "the term ended {:?} after the store saw the promotion: its RELEASE, not its next beat",
        seen.elapsed()
    );
    manager.shutdown();
}

/// A fresh migrated database on the shared cluster, and a fault proxy in front of the cluster.
async fn migrated_behind_a_proxy() -> (String, FaultProxy) {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    ticklease::migrate(&mut connect(&cluster.config(&db)).await.unwrap())
        .await
        .unwrap();
    let upstream: std::net::SocketAddr = format!("127.0.0.1:{}", cluster.port()).parse().unwrap();
    (db, FaultProxy::start(upstream).await.unwrap())
}

/// Two writable servers: billing led on the primary by a store whose URL
/// names both, then the standby promoted while the old primary stays writable.
struct Promoted {
    primary: PgCluster,
    standby: Standby,
    db: String,
    store: PgStore,
    manager: Manager<PgStore>,
    /// The term started on the old primary, and its lead.
    first: Token,
    lead: tokio::task::JoinHandle<Lead<()>>,
}

async fn a_term_then_a_promotion(config: ticklease::Config) -> Promoted {
    let (primary, standby, db) = primary_and_standby().await;
    let url: PgConnect = url_for_hosts(&[&primary, standby.cluster()], &db)
        .parse()
        .unwrap();
    let store = PgStore::connect(url, PgStoreOptions::from_config(&config))
        .await
        .unwrap();
    let manager = Manager::start(store.clone(), config, [billing()]).await.unwrap();
    let (first, lead) = hold(&manager);
    let first = first.await.unwrap();
    standby.wait_caught_up(&primary).await.unwrap();
    standby.promote().await.unwrap();
    Promoted {
        primary,
        standby,
        db,
        store,
        manager,
        first,
        lead,
    }
}

/// The outside review's F1 (issue 42): a login that ends the store's
/// backends over and over (a superuser's watchdog, any login with
/// `pg_signal_backend`) turned the wake-up of failed polls into a storm,
/// since every connection made woke every failed role loop at once (407
/// polls in 10 s for 20 roles). Now the store's return is a statement that
/// answered, and each loop takes one early poll per run of failures: at
/// most two polls per `max_poll` and role, as before the wake-up, plus one.
#[tokio::test]
async fn a_login_that_ends_our_backends_over_and_over_costs_at_most_two_polls_per_max_poll() {
    let cluster = PgCluster::shared();
    let db = cluster.create_database().await.unwrap();
    ticklease::migrate(&mut connect(&cluster.config(&db)).await.unwrap())
        .await
        .unwrap();
    let max_poll = Duration::from_secs(5);
    let config = ticklease::Config::builder().max_poll(max_poll).build().unwrap();
    let store = PgStore::connect(
        cluster.url(&db).parse::<PgConnect>().unwrap(),
        PgStoreOptions::from_config(&config),
    )
    .await
    .unwrap();
    let roles: Vec<Role> = (0..10).map(|i| Role::new(format!("r{i}")).unwrap()).collect();
    let manager = Manager::start(store, config, roles.clone()).await.unwrap();
    let polls = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    for role in &roles {
        let (manager, role, polls) = (manager.clone(), role.clone(), polls.clone());
        tokio::spawn(async move {
            let mut chance = ticklease::NextChance::new(&manager, &role);
            loop {
                let work = |_| async { Ok::<_, std::io::Error>(()) };
                let lead = manager.lead(&role, Duration::from_secs(3600), work).await;
                polls.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                if !chance.wait(&lead).await {
                    return;
                }
            }
        });
    }
    let killer = connect(&cluster.config("postgres")).await.unwrap();
    let window = Duration::from_secs(10);
    let start = tokio::time::Instant::now();
    let before = polls.load(std::sync::atomic::Ordering::SeqCst);
    while start.elapsed() < window {
        let end = "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                   WHERE datname = $1 AND pid <> pg_backend_pid() AND backend_type = 'client backend'";
        killer.query_one(end, &[&db]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let polled = polls.load(std::sync::atomic::Ordering::SeqCst) - before;
    let periods = window.as_secs() / max_poll.as_secs() + 1;
    let bound = roles.len() as u64 * (2 * periods + 1);
    assert!(polled <= bound, "{polled} polls in {window:?}: at most {bound}");
    manager.shutdown();
}
