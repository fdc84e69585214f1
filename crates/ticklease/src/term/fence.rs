//! The fence: proof, inside a claim statement, that the caller's term is live.

use tokio_postgres::types::{ToSql, Type};

use crate::term::role::Role;
use crate::term::token::Token;

/// A role and the token of a term this process acquired. Only [`crate::Manager::lead`]
/// makes one, so a leader-only store method that takes `&Fence` cannot run outside
/// a term: there is no unfenced fallback to forget.
///
/// A fence outlives its term harmlessly: the predicate it yields is false once the
/// term is over, so a stale fence claims nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    role: Role,
    token: Token,
}

impl Fence {
    pub(crate) fn new(role: Role, token: Token) -> Self {
        Fence { role, token }
    }

    /// The term's role.
    pub fn role(&self) -> &Role {
        &self.role
    }

    /// The term's token.
    pub fn token(&self) -> Token {
        self.token
    }

    /// The SQL predicate for a claim statement's WHERE clause, with its two
    /// parameters numbered from `first_param`: `(SELECT leader_fence_v2($n, $n+1))`.
    ///
    /// The uncorrelated scalar subquery runs once per statement (an InitPlan),
    /// not once per candidate row, and reads the term at that instant. When it
    /// passes, the claim's transaction holds the lease row `FOR KEY SHARE`
    /// until it ends: no takeover, pause or RELEASE of the term commits
    /// before it; they wait for it at most a grace, then end its backend
    /// (crate docs, guarantee 3).
    pub fn predicate(&self, first_param: usize) -> String {
        format!("(SELECT leader_fence_v2(${}, ${}))", first_param, first_param + 1)
    }

    /// The two parameters of [`Fence::predicate`], typed for `query_typed`.
    pub fn params(&self) -> [(&(dyn ToSql + Sync), Type); 2] {
        [(&self.role.0, Type::TEXT), (&self.token.0, Type::INT8)]
    }
}

/// Pushes [`Fence::predicate`] with its two values bound onto a sqlx
/// `QueryBuilder` (any version: the macro uses only `push` and
/// `push_bind`), numbered as the builder numbers its binds:
/// `push_fence!(builder, tick.fence())` writes `(SELECT leader_fence_v2($i, $j))`.
#[macro_export]
macro_rules! push_fence {
    ($builder:expr, $fence:expr) => {{
        let fence: &$crate::Fence = $fence;
        $builder
            .push("(SELECT leader_fence_v2(")
            .push_bind(fence.role().as_str().to_owned())
            .push(", ")
            .push_bind(fence.token().get())
            .push("))")
    }};
}
