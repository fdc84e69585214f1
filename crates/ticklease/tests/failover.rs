//! A Postgres failover that loses the last commits: tokens stay unique, and a
//! replica with a multi-host URL follows the new primary without a restart.

use std::time::Duration;

use ticklease::{
    Acquire, LeaseStore, LossReason, PgConnect, PgStore, PgStoreOptions, Release, Renew, Role, Token,
};
use ticklease_testkit::{connect, scalar, url_for_hosts, PgCluster, Standby};

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
    let primary = PgCluster::start_primary().unwrap();
    let db = primary.create_database().await.unwrap();
    ticklease::migrate(&mut connect(&primary.config(&db)).await.unwrap())
        .await
        .unwrap();
    let standby = Standby::start(&primary).unwrap();
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
    let fenced: bool = scalar(
        &connect(&standby.cluster().config(&db)).await.unwrap(),
        &format!("SELECT leader_fence('billing', {})", lost.get()),
    )
    .await;
    assert!(!fenced, "the lost token passes the fence on the new primary");
}
