//! Both lease stores pass the same conformance suite.

mod postgres {
    use ticklease_testkit::{conformance_suite, pg_store, test_config};

    async fn store() -> ticklease::PgStore {
        pg_store(&test_config()).await.0
    }

    conformance_suite!(
        #[tokio::test]
        store()
    );
}

mod fake {
    use ticklease_testkit::{conformance_suite, FakeStore};

    async fn store() -> FakeStore {
        FakeStore::new()
    }

    conformance_suite!(
        #[tokio::test(start_paused = true)]
        store()
    );
}
