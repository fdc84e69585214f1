//! The test kit's own failure message. Alone in its binary: it sets an
//! environment variable the launcher reads.

use ticklease_testkit::{KitError, PgCluster};

#[test]
fn missing_server_binaries_get_a_clear_error_naming_the_package() {
    std::env::set_var("TICKLEASE_PG_BINDIR", "/nonexistent");
    let err = PgCluster::start().unwrap_err();
    assert!(matches!(err, KitError::NoBinaries), "{err:?}");
    assert!(
        err.to_string()
            .contains("install the Debian package postgresql-15"),
        "{err}"
    );
}
