//! A leader process for drills: leads one role with the test kit's timings
//! and prints `LEADING <token>` when its tick starts; the tick runs until the
//! process is killed. Usage: ticklease-testkit-leader DATABASE_URL ROLE

use std::convert::Infallible;
use std::io::Write;
use std::time::Duration;

use ticklease::{Manager, PgStore, PgStoreOptions, Role};

#[tokio::main]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(role)) = (args.next(), args.next()) else {
        eprintln!("usage: ticklease-testkit-leader DATABASE_URL ROLE");
        std::process::exit(2);
    };
    let role = Role::new(role).expect("role");
    let config = ticklease_testkit::test_config();
    let pg: tokio_postgres::Config = url.parse().expect("database url");
    let store = PgStore::connect(pg, PgStoreOptions::from_config(&config))
        .await
        .expect("store");
    let manager = Manager::start(store, config, [role.clone()])
        .await
        .expect("manager");
    loop {
        manager
            .lead(&role, Duration::from_millis(1), |tick| async move {
                println!("LEADING {}", tick.token());
                std::io::stdout().flush().expect("stdout");
                std::future::pending::<Result<(), Infallible>>().await
            })
            .await
            .expect("lead");
        tokio::time::sleep(config.max_poll()).await;
    }
}
