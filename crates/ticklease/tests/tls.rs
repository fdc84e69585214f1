//! TLS to Postgres: each `sslmode` against a server that takes TCP over TLS
//! only (`hostssl`), with a certificate for `localhost` and 127.0.0.1 signed
//! by a CA made in the test. Every URL connects to 127.0.0.1 (`hostaddr`), so
//! the host name in it is only the name the certificate is checked against.

use std::time::{Duration, Instant};

use ticklease::error::chain;
use ticklease::{LeaseStore, PgConnect, PgConnectError, PgStore, PgStoreOptions, StoreError};
use ticklease_testkit::{TestCa, TlsCluster};

fn url(host: &str, dbname: &str, params: &str) -> String {
    let port = TlsCluster::shared().cluster().port();
    format!("postgres://postgres@{host}:{port}/{dbname}?hostaddr=127.0.0.1&{params}")
}

fn root_cert() -> String {
    TlsCluster::shared().root_cert().display().to_string()
}

/// Connects and reports whether the session is encrypted, from the server's side.
async fn encrypted(pg: &PgConnect) -> Result<bool, tokio_postgres::Error> {
    let (client, connection) = pg.connect().await?;
    tokio::spawn(connection);
    let row = client
        .query_one("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()", &[])
        .await?;
    Ok(row.get(0))
}

async fn refused(url: &str) -> String {
    let pg: PgConnect = url.parse().expect("a valid URL");
    match encrypted(&pg).await {
        Ok(_) => panic!("{url} connected"),
        Err(e) => chain(&e),
    }
}

#[tokio::test]
async fn require_connects_over_tls_without_checking_the_certificate() {
    let pg: PgConnect = url("not-the-server.invalid", "postgres", "sslmode=require")
        .parse()
        .unwrap();
    assert!(encrypted(&pg).await.unwrap());
}

#[tokio::test]
async fn verify_full_with_the_right_ca_connects_by_host_name_and_by_address() {
    let by_name = url(
        "localhost",
        "postgres",
        &format!("sslmode=verify-full&sslrootcert={}", root_cert()),
    );
    assert!(encrypted(&by_name.parse().unwrap()).await.unwrap());
    let port = TlsCluster::shared().cluster().port();
    let by_address = format!(
        "host=127.0.0.1 port={port} user=postgres dbname=postgres sslmode=verify-full sslrootcert='{}'",
        root_cert()
    );
    assert!(encrypted(&by_address.parse().unwrap()).await.unwrap());
}

#[tokio::test]
async fn verify_full_refuses_a_certificate_for_another_host_name() {
    let err = refused(&url(
        "db.example.invalid",
        "postgres",
        &format!("sslmode=verify-full&sslrootcert={}", root_cert()),
    ))
    .await;
    println!("{err}");
    assert!(err.contains("not valid for name \"db.example.invalid\""), "{err}");
}

#[tokio::test]
async fn verify_ca_checks_the_chain_but_not_the_host_name() {
    let pg: PgConnect = url(
        "db.example.invalid",
        "postgres",
        &format!("sslmode=verify-ca&sslrootcert={}", root_cert()),
    )
    .parse()
    .unwrap();
    assert!(encrypted(&pg).await.unwrap());
}

#[tokio::test]
async fn a_root_cert_of_another_ca_is_refused_by_require_verify_ca_and_verify_full() {
    let other = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(other.path(), TestCa::new("another CA").pem()).unwrap();
    for mode in ["require", "verify-ca", "verify-full"] {
        let err = refused(&url(
            "localhost",
            "postgres",
            &format!("sslmode={mode}&sslrootcert={}", other.path().display()),
        ))
        .await;
        assert!(err.contains("UnknownIssuer"), "{mode}: {err}");
    }
}

#[tokio::test]
async fn verify_full_without_a_root_cert_checks_against_the_platform_roots() {
    // The test's CA is in no platform store, so the server is refused, not unchecked.
    match url("localhost", "postgres", "sslmode=verify-full").parse::<PgConnect>() {
        Ok(pg) => {
            let err = chain(&encrypted(&pg).await.unwrap_err());
            assert!(err.contains("UnknownIssuer"), "{err}");
        }
        // A machine without a CA store refuses before connecting.
        Err(PgConnectError::NoPlatformRoots) => {}
        Err(e) => panic!("{e:?}"),
    }
}

#[tokio::test]
async fn disable_against_a_hostssl_only_server_fails_saying_there_was_no_encryption() {
    let err = refused(&url("localhost", "postgres", "sslmode=disable")).await;
    println!("{err}");
    assert!(err.contains("no pg_hba.conf entry"), "{err}");
    assert!(err.contains("no encryption"), "{err}");
}

#[test]
fn an_unknown_sslmode_is_refused_naming_the_value() {
    let err = "postgres://app@db/app?sslmode=verify_full"
        .parse::<PgConnect>()
        .unwrap_err();
    assert!(
        matches!(&err, PgConnectError::SslMode { value } if value == "verify_full"),
        "{err:?}"
    );
    assert!(err.to_string().contains("\"verify_full\""), "{err}");
}

#[test]
fn verify_ca_without_a_root_cert_is_refused() {
    let err = "postgres://app@db/app?sslmode=verify-ca"
        .parse::<PgConnect>()
        .unwrap_err();
    assert!(matches!(err, PgConnectError::VerifyCaNeedsRootCert), "{err:?}");
}

#[test]
fn a_missing_root_cert_file_is_refused_naming_the_path() {
    let err = "host=db user=app sslmode=verify-full sslrootcert=/nonexistent/ca.pem"
        .parse::<PgConnect>()
        .unwrap_err();
    assert!(
        matches!(&err, PgConnectError::RootCertRead { path, .. } if path.to_str() == Some("/nonexistent/ca.pem")),
        "{err:?}"
    );
}

/// The store and the migrations over verify-full; a statement that times out
/// is cancelled on the server over the same TLS (a plain cancel request would
/// be answered with a TLS negotiation it cannot do, and never sent).
#[tokio::test]
async fn the_store_runs_over_verified_tls_and_cancels_a_timed_out_statement_on_the_server() {
    let cluster = TlsCluster::shared().cluster();
    let dbname = cluster.create_database().await.unwrap();
    let pg: PgConnect = url(
        "localhost",
        &dbname,
        &format!("sslmode=verify-full&sslrootcert={}", root_cert()),
    )
    .parse()
    .unwrap();
    let (mut owner, connection) = pg.connect().await.unwrap();
    tokio::spawn(connection);
    ticklease::migrate(&mut owner).await.unwrap();
    let timeout = Duration::from_millis(500);
    let store = PgStore::connect(
        pg.clone(),
        PgStoreOptions {
            pool_size: 2,
            statement_timeout: timeout,
        },
    )
    .await
    .unwrap();
    store.status().await.unwrap();

    let lock = owner.transaction().await.unwrap();
    lock.batch_execute("LOCK TABLE leader_leases IN ACCESS EXCLUSIVE MODE")
        .await
        .unwrap();
    let err = store.status().await.unwrap_err();
    assert!(matches!(err, StoreError::Timeout { .. }), "{err:?}");

    let (observer, connection) = pg.connect().await.unwrap();
    tokio::spawn(connection);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let waiting: i64 = observer
            .query_one(
                "SELECT count(*) FROM pg_stat_activity
                  WHERE datname = current_database() AND wait_event_type = 'Lock'",
                &[],
            )
            .await
            .unwrap()
            .get(0);
        if waiting == 0 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the timed-out statement still waits on the server"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    lock.rollback().await.unwrap();
}
