//! Fencing tokens.

use std::fmt;

/// The number of one term of a role. Every ACQUIRE increments it, so a larger
/// token is a later term; statements that end or prove a term match
/// `(role, token)` exactly.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Token(pub i64);

impl Token {
    /// The token as stored.
    pub fn get(self) -> i64 {
        self.0
    }
}

impl fmt::Display for Token {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}
