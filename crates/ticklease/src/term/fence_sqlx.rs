//! The fence through sqlx (feature `sqlx`, sqlx 0.8 or 0.9): the two values
//! of [`Fence::predicate`] bound in the order it numbers them, so no claim
//! binds them by hand. [`push_fence!`](crate::push_fence) pushes the whole
//! predicate onto a `QueryBuilder` of either version.

use sqlx::postgres::{PgArguments, Postgres};
use sqlx::query::Query;

use crate::term::fence::Fence;

impl Fence {
    /// Binds the role and the token onto `query`, as `$n` and `$n+1` of
    /// [`Fence::predicate`]`(n)`: call it right after binding `$1 .. $(n-1)`.
    ///
    /// Through PgBouncer in transaction mode, make the query
    /// `.persistent(false)` (an unnamed statement) **and run it in a
    /// transaction**: sqlx parses an unnamed statement in one round trip and
    /// binds and executes it in a second, each ending in a Sync, and between
    /// them the pooler may hand the server to another client. The second
    /// then meets a server where the statement does not exist (26000,
    /// `unnamed prepared statement does not exist`) or where the unnamed
    /// statement is another client's. In a transaction the pooler keeps
    /// one server until `COMMIT`. sqlx 0.9 takes static SQL: write the
    /// predicate out as [`Fence::predicate`] writes it.
    ///
    /// ```no_run
    /// # async fn claim(pool: &sqlx::PgPool, tick: &ticklease::Tick) -> Result<(), sqlx::Error> {
    /// // Up to 50 unclaimed rows, only while this tick's term is live.
    /// const CLAIM: &str = "UPDATE outbox SET claimed_by = $1
    ///   WHERE id IN (SELECT id FROM outbox WHERE claimed_by IS NULL AND (SELECT leader_fence_v2($2, $3))
    ///                 ORDER BY id LIMIT 50 FOR UPDATE SKIP LOCKED)
    ///  RETURNING id";
    /// let fence = tick.fence();
    /// debug_assert!(CLAIM.contains(&fence.predicate(2)));
    /// let mut tx = pool.begin().await?;
    /// let query = sqlx::query(CLAIM).persistent(false).bind(fence.token().get());
    /// let claimed = fence.bind(query).fetch_all(&mut *tx).await?; // empty once the term is over
    /// tx.commit().await?;
    /// # Ok(()) }
    /// ```
    pub fn bind<'q>(&self, query: Query<'q, Postgres, PgArguments>) -> Query<'q, Postgres, PgArguments> {
        query
            .bind(self.role().as_str().to_owned())
            .bind(self.token().get())
    }
}
