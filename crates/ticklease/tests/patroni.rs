//! Issue 35, item 6: ticklease on a real Patroni 3.0 + etcd cluster of three
//! members (Debian's packages). Three replicas lead three roles on the
//! multi-host URL, each tick a fenced claim on the server its term started
//! on (`ticklease_testkit::ha`); through a switchover and a SIGKILLed
//! primary postmaster, every role leads again within a bound of the
//! cluster's recovery, no term's claims come from two replicas, and tokens
//! only grow in the order claims commit.

use std::time::Duration;

use std::sync::Arc;

use tokio::sync::Notify;

use ticklease::patroni::{Patroni, PatroniError};
use ticklease::{Lead, LossReason, Manager, PgConnect, PgStore, PgStoreOptions, Role};
use ticklease_testkit::ha::{
    claim_violations, create_claims, every_role_claims_after, last_claim, spawn_checked_replica,
    spawn_replica,
};
use ticklease_testkit::{connect, test_config, Fault, FaultProxy, PatroniCluster};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn through_a_switchover_and_a_killed_primary_every_role_leads_again_and_tokens_only_grow() {
    let cluster = tokio::task::spawn_blocking(PatroniCluster::start)
        .await
        .unwrap()
        .unwrap();
    let url = app_database(&cluster).await;
    let config = test_config();
    let stop = ticklease::CancellationToken::new();
    for r in 0..3 {
        spawn_replica(&url, config, r, true, stop.clone()).await;
    }
    // The bound after the cluster is healthy again: a lease's expiry, a
    // poll, a probe of the hosts and a statement, doubled for a loaded machine.
    let bound = (config.lease_ttl() + config.max_poll() + config.statement_timeout() * 3) * 2;
    every_role_claims_after(&url, 0, Duration::from_secs(30)).await;

    let leader = cluster.leader().unwrap().name.clone();
    let candidate = cluster
        .members()
        .iter()
        .find(|m| m.name != leader)
        .unwrap()
        .name
        .clone();
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.switchover(&candidate).unwrap();
        cluster.wait_healthy().unwrap();
        cluster
    })
    .await
    .unwrap();
    let took = every_role_claims_after(&url, last_claim(&url).await, bound).await;
    eprintln!("switchover: every role led again {took:?} after the cluster was healthy");

    let cluster = tokio::task::spawn_blocking(move || {
        cluster.kill_leader_postmaster().unwrap();
        cluster.wait_healthy().unwrap();
        cluster
    })
    .await
    .unwrap();
    let took = every_role_claims_after(&url, last_claim(&url).await, bound).await;
    eprintln!("killed primary: every role led again {took:?} after the cluster was healthy");
    stop.cancel();

    let (shared, backwards) = claim_violations(&url).await;
    assert_eq!(shared, 0, "a term's claims were made by two replicas");
    assert_eq!(
        backwards, 0,
        "a claim committed under a token below an earlier one's"
    );
    drop(cluster);
}

/// Issue 42 item 1: the process that cannot see the promotion. The old
/// primary's Patroni is killed and left dead (its Postgres stays writable:
/// nothing demoted it); replica 0's URL names that server alone, replica 1's
/// every member, replica 2's every member through proxies whose links to
/// the others are cut at the fault (a one-sided partition), replica 3's
/// every member, whose database slots on the others a login with CONNECT
/// alone holds. With Patroni's word, replicas 0, 2 and 3 end their terms
/// and start none once no member
/// confirms their server, so no claim commits on the
/// old primary after the promotion, and replica 1 leads every role on the
/// promoted server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_patronis_word_a_replica_that_reaches_only_the_old_primary_commits_nothing_there_after_the_promotion(
) {
    let mut cluster = tokio::task::spawn_blocking(PatroniCluster::start)
        .await
        .unwrap()
        .unwrap();
    let url = app_database(&cluster).await;
    let config = test_config();
    let patroni = || Patroni::new(cluster.api_urls(), config.statement_timeout()).unwrap();

    // Timings a term could outlive its server's leadership with are refused.
    let store = PgStore::connect(
        url.parse::<ticklease::PgConnect>().unwrap(),
        PgStoreOptions::from_config(&config),
    )
    .await
    .unwrap();
    let slow = ticklease::Config::builder()
        .lease_ttl(Duration::from_secs(30))
        .heartbeat_every(Duration::from_secs(4))
        .abandon_after(Duration::from_secs(13))
        .statement_timeout(Duration::from_secs(2))
        .build()
        .unwrap();
    let refused = store.with_patroni(patroni(), &slow).await.unwrap_err();
    assert!(
        matches!(
            &refused,
            ticklease::StoreError::Patroni {
                source: PatroniError::Margin { .. }
            }
        ),
        "{refused:?}"
    );

    let old = cluster.leader().unwrap().name.clone();
    let old_url = cluster.member_url(&old, "app").unwrap();
    let stop = ticklease::CancellationToken::new();
    spawn_checked_replica(&old_url, config, 0, false, Some(patroni()), stop.clone()).await;
    spawn_checked_replica(&url, config, 1, false, Some(patroni()), stop.clone()).await;
    // Replica 2 reaches every member through a proxy of its own; at the
    // fault, the links to the others are cut (a one-sided partition: it
    // reaches the old primary alone, and never sees the promotion).
    let mut proxies = Vec::new();
    for m in cluster.members() {
        let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], m.pg_port));
        proxies.push((m.name.clone(), FaultProxy::start(upstream).await.unwrap()));
    }
    let hosts: Vec<String> = proxies.iter().map(|(_, p)| p.addr().to_string()).collect();
    let partitioned = format!(
        "postgres://postgres@{}/app?target_session_attrs=read-write",
        hosts.join(",")
    );
    spawn_checked_replica(&partitioned, config, 2, false, Some(patroni()), stop.clone()).await;
    // Replica 3, a login of the app's, reaches every member, but a login
    // with CONNECT alone holds the database's connection slots on the
    // others (its limit: superusers, the test's rig, are not held to it).
    owner_of(&url)
        .await
        .batch_execute(&format!(
            "CREATE ROLE app_login LOGIN IN ROLE ticklease_app; CREATE ROLE hog LOGIN; \
             ALTER DATABASE app CONNECTION LIMIT {HELD_SLOTS}"
        ))
        .await
        .unwrap();
    let all_hosts = cluster.url("app").replacen("postgres@", "app_login@", 1);
    spawn_checked_replica(&all_hosts, config, 3, false, Some(patroni()), stop.clone()).await;
    let _held = hold_slots(&cluster, &old).await;
    every_role_claims_after(&url, 0, Duration::from_secs(30)).await;
    let long = long_term(&old_url, patroni(), config).await;

    cluster.kill_patroni(&old).unwrap();
    let killed_at = std::time::Instant::now();
    for (name, proxy) in &proxies {
        if *name != old {
            proxy.set(Fault::Reset);
        }
    }
    let (cluster, new) = promoted_beside(cluster, old).await;
    let promoted_at = std::time::SystemTime::now();
    let ended = superseded_end(long).await;
    // Its word ran out at most a check (half a beat) plus abandon_after after the kill.
    let ended = ended.duration_since(killed_at);
    assert!(
        ended < config.abandon_after() + config.heartbeat_every() + config.statement_timeout() * 2,
        "the long term ended {ended:?} after the kill"
    );
    eprintln!(
        "{new} promoted {:?} after the old primary's Patroni was killed; the long term ended {ended:?} after",
        killed_at.elapsed()
    );
    let new_url = cluster.member_url(&new, "app").unwrap();
    let bound = (config.lease_ttl() + config.max_poll() + config.statement_timeout() * 3) * 2;
    every_role_claims_after(&new_url, last_claim(&new_url).await, bound).await;
    // Long enough for a replica still leading on the old primary to claim there.
    tokio::time::sleep(config.abandon_after() * 2).await;
    stop.cancel();

    assert_no_claims_after(&old_url, promoted_at).await;
    let (shared, backwards) = claim_violations(&new_url).await;
    assert_eq!(
        (shared, backwards),
        (0, 0),
        "terms shared or tokens backwards on the promoted server"
    );
    drop(cluster);
}

/// The database's connection limit, as many connections as a hostile login holds on each member.
const HELD_SLOTS: usize = 30;

/// A superuser's session on `url`.
async fn owner_of(url: &str) -> tokio_postgres::Client {
    connect(&url.parse().unwrap()).await.unwrap()
}

/// The login `hog` takes every connection slot of the database `app` on
/// each member but `old`, and holds them until dropped; `app_login` is then
/// refused there.
async fn hold_slots(cluster: &PatroniCluster, old: &str) -> Vec<tokio_postgres::Client> {
    let mut held = Vec::new();
    for m in cluster.members().iter().filter(|m| m.name != old) {
        let at = |user: &str| format!("postgres://{user}@127.0.0.1:{}/app", m.pg_port);
        for _ in 0..HELD_SLOTS {
            held.push(slot(&at("hog")).await);
        }
        let refused = connect(&at("app_login").parse().unwrap()).await.unwrap_err();
        assert!(
            format!("{refused:?}").contains("too many connections"),
            "{}: {refused}",
            m.name
        );
    }
    held
}

/// A connection of `url` once a slot is free: replica 3's probes (a
/// connection to each host every S) hold one for a moment, and `hog`, which
/// takes the last, was refused when it came then (seen once under load).
async fn slot(url: &str) -> tokio_postgres::Client {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match connect(&url.parse().unwrap()).await {
            Ok(client) => return client,
            Err(e)
                if std::time::Instant::now() < deadline
                    && format!("{e:?}").contains("too many connections") =>
            {
                tokio::time::sleep(Duration::from_millis(50)).await
            }
            Err(e) => panic!("{url}: {e}"),
        }
    }
}

/// A database `app` with ticklease's schema and the claims table; its multi-host URL.
async fn app_database(cluster: &PatroniCluster) -> String {
    let owner = connect(&cluster.url("postgres").parse().unwrap()).await.unwrap();
    owner.batch_execute("CREATE DATABASE app").await.unwrap();
    let url = cluster.url("app");
    ticklease::migrate(&mut connect(&url.parse().unwrap()).await.unwrap())
        .await
        .unwrap();
    create_claims(&url).await;
    url
}

/// Waits until Patroni says a member other than `old` leads; its name.
async fn promoted_beside(cluster: PatroniCluster, old: String) -> (PatroniCluster, String) {
    tokio::task::spawn_blocking(move || {
        let started = std::time::Instant::now();
        loop {
            if let Some(new) = cluster.leader().filter(|m| m.name != old).map(|m| m.name.clone()) {
                return (cluster, new);
            }
            assert!(
                started.elapsed() < Duration::from_secs(90),
                "no member was promoted"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    })
    .await
    .unwrap()
}

/// No claim committed on the server of `url` at or after `since`.
async fn assert_no_claims_after(url: &str, since: std::time::SystemTime) {
    let server = connect(&url.parse().unwrap()).await.unwrap();
    let row = server
        .query_one(
            "SELECT count(*), coalesce(array_agg(DISTINCT replica), '{}') FROM claims WHERE at >= $1",
            &[&since],
        )
        .await
        .unwrap();
    let (after, replicas): (i64, Vec<i32>) = (row.get(0), row.get(1));
    assert_eq!(
        after, 0,
        "{after} claims (of replicas {replicas:?}) committed on the old primary after the promotion"
    );
}

/// The review's F1: a leader whose HA loop froze while its REST API
/// answers says 200 until its key expires (Patroni 3.0.2 answers from
/// `is_leader()`, the last renewal + ttl); the members, parted from that
/// REST API, promote another. With Patroni's word, an answer counts only
/// while the leader's `dcs_last_seen` is within `loop_wait + 1 s` of its
/// `Date`: the replica on the old primary ends its terms and starts none
/// within that and `abandon_after` of the freeze, long before the promotion.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_patronis_word_a_leader_whose_ha_loop_froze_confirms_nothing_once_its_dcs_contact_is_stale() {
    let (cluster, apis) = cluster_with_cuttable_apis().await;
    let url = app_database(&cluster).await;
    let config = test_config();
    let patroni = || Patroni::new(cluster.api_urls(), config.statement_timeout()).unwrap();
    let contact_within = patroni().settings().await.unwrap().dcs_contact_within();
    let old = cluster.leader().unwrap().name.clone();
    let old_url = cluster.member_url(&old, "app").unwrap();
    let stop = ticklease::CancellationToken::new();
    spawn_checked_replica(&old_url, config, 0, false, Some(patroni()), stop.clone()).await;
    spawn_checked_replica(&url, config, 1, false, Some(patroni()), stop.clone()).await;
    every_role_claims_after(&url, 0, Duration::from_secs(30)).await;
    let long = long_term(&old_url, patroni(), config).await;

    // The members no longer reach the old leader's REST API (else they see
    // its primary alive and promote none); this test still does.
    apis.iter()
        .find(|(name, _)| *name == old)
        .unwrap()
        .1
        .set(Fault::Reset);
    let frozen = cluster.freeze_ha_loop(&old).unwrap();
    let frozen_at = std::time::Instant::now();
    let (cluster, new) = promoted_beside(cluster, old).await;
    let (promoted, promoted_at) = (std::time::Instant::now(), std::time::SystemTime::now());
    let ended = superseded_end(long).await;
    // The last answer that counted came within contact_within + 1 s (whole
    // seconds) of the freeze; a check later, abandon_after on, it ended.
    let bound =
        contact_within + Duration::from_secs(1) + config.abandon_after() + config.heartbeat_every() * 2;
    assert!(
        ended < frozen_at + bound && ended < promoted,
        "the long term ended {:?} after the freeze, {:?} before the promotion",
        ended - frozen_at,
        promoted.checked_duration_since(ended)
    );
    eprintln!(
        "{new} promoted {:?} after the old leader's HA loop froze; the long term ended {:?} after",
        promoted - frozen_at,
        ended - frozen_at
    );
    let new_url = cluster.member_url(&new, "app").unwrap();
    let bound = (config.lease_ttl() + config.max_poll() + config.statement_timeout() * 3) * 2;
    every_role_claims_after(&new_url, last_claim(&new_url).await, bound).await;
    tokio::time::sleep(config.abandon_after() * 2).await;
    stop.cancel();
    assert_no_claims_after(&old_url, promoted_at).await;
    drop(frozen);
    drop(cluster);
}

/// The review's R2-1: an `edit-config` that leaves Patroni's margin below
/// `abandon_after + statement_timeout` withdraws the word given under the
/// old settings: a running term ends at its next beat once a check read
/// the new settings, not `abandon_after` after its last confirmation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_patronis_word_an_edit_that_breaks_the_margin_ends_a_running_term_at_its_next_beat() {
    let cluster = tokio::task::spawn_blocking(PatroniCluster::start)
        .await
        .unwrap()
        .unwrap();
    let _ = app_database(&cluster).await;
    // Long enough an abandon_after that its end and a beat's differ.
    let config = ticklease::Config::builder()
        .lease_ttl(Duration::from_secs(10))
        .heartbeat_every(Duration::from_secs(1))
        .statement_timeout(Duration::from_millis(500))
        .abandon_after(Duration::from_secs(5))
        .max_poll(Duration::from_millis(200))
        .build()
        .unwrap();
    let patroni = Patroni::new(cluster.api_urls(), config.statement_timeout()).unwrap();
    let leader = cluster.leader().unwrap().name.clone();
    let long = long_term(&cluster.member_url(&leader, "app").unwrap(), patroni, config).await;
    // ttl 20 - loop_wait 1 - retry_timeout 15: a margin of 4 s, under 5.5 s.
    let cluster = tokio::task::spawn_blocking(move || {
        cluster.edit_config("retry_timeout=15").unwrap();
        cluster
    })
    .await
    .unwrap();
    let edited = std::time::Instant::now();
    let (lost, ended) = tokio::time::timeout(Duration::from_secs(20), long)
        .await
        .expect("the term runs on under settings that no longer bound it")
        .unwrap();
    assert_eq!(lost, Some(LossReason::Superseded), "the term ended otherwise");
    // A check, the re-read it starts, the next check, the next beat:
    // about 2 s; abandon_after after the last confirmation would be 5 s.
    let ended = ended.duration_since(edited);
    assert!(
        ended < config.abandon_after() * 3 / 5,
        "the term ended {ended:?} after the edit"
    );
    eprintln!("the term ended {ended:?} after the edit");
    drop(cluster);
}

/// A cluster whose members reach each other's REST API through a proxy
/// each (the announced `connect_address`), by member name.
async fn cluster_with_cuttable_apis() -> (PatroniCluster, Vec<(String, FaultProxy)>) {
    let runtime = tokio::runtime::Handle::current();
    tokio::task::spawn_blocking(move || {
        let mut apis = Vec::new();
        let cluster = PatroniCluster::start_announcing(|m| {
            let upstream = std::net::SocketAddr::from(([127, 0, 0, 1], m.api_port));
            let proxy = runtime.block_on(FaultProxy::start(upstream)).unwrap();
            let port = proxy.port();
            apis.push((m.name.clone(), proxy));
            Ok(port)
        })
        .unwrap();
        (cluster, apis)
    })
    .await
    .unwrap()
}

/// When the long term on the old primary ended, lost as superseded, soon
/// after the promotion at the latest.
async fn superseded_end(
    long: tokio::task::JoinHandle<(Option<LossReason>, std::time::Instant)>,
) -> std::time::Instant {
    let (lost, ended) = tokio::time::timeout(Duration::from_secs(10), long)
        .await
        .expect("the long term on the old primary still runs after the promotion")
        .unwrap();
    assert_eq!(
        lost,
        Some(LossReason::Superseded),
        "the long term ended otherwise"
    );
    ended
}

/// Starts a term on `url` whose work runs until it is cancelled (a
/// `ticklease run` child) and waits until it runs ([`lead_until_cancelled`]).
async fn long_term(
    url: &str,
    patroni: Patroni,
    config: ticklease::Config,
) -> tokio::task::JoinHandle<(Option<LossReason>, std::time::Instant)> {
    let started = Arc::new(Notify::new());
    let long = tokio::spawn(lead_until_cancelled(
        url.to_owned(),
        patroni,
        config,
        started.clone(),
    ));
    tokio::time::timeout(Duration::from_secs(30), started.notified())
        .await
        .expect("the long term started");
    long
}

/// Leads `relay` on `url` with Patroni's word, its work running until the
/// term is cancelled (`started` told when it runs): why the term was lost,
/// and when it ended.
async fn lead_until_cancelled(
    url: String,
    patroni: Patroni,
    config: ticklease::Config,
    started: Arc<Notify>,
) -> (Option<LossReason>, std::time::Instant) {
    let store = PgStore::connect(
        url.parse::<PgConnect>().unwrap(),
        PgStoreOptions::from_config(&config),
    )
    .await
    .unwrap()
    .with_patroni(patroni, &config)
    .await
    .unwrap();
    let role = Role::new("relay").unwrap();
    let manager = Manager::start(store, config, vec![role.clone()]).await.unwrap();
    loop {
        let started = started.clone();
        let work = |tick: ticklease::Tick| async move {
            started.notify_one();
            tick.cancelled().await;
            Ok::<(), ticklease::BoxError>(())
        };
        match manager.lead(&role, Duration::from_secs(3600), work).await {
            Ok(Lead::Lost { reason, .. }) => return (Some(reason), std::time::Instant::now()),
            Ok(Lead::Refused(_)) | Err(_) => tokio::time::sleep(config.max_poll()).await,
            Ok(_) => return (None, std::time::Instant::now()),
        }
    }
}
