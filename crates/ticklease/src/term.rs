//! The term's vocabulary, the layer every other builds on: role names and
//! families of them, fencing tokens, holder ids, the fence a claim
//! carries, and the schedule that says when a role is due.

pub(crate) mod family;
pub(crate) mod fence;
#[cfg(feature = "sqlx")]
mod fence_sqlx;
pub(crate) mod holder;
pub(crate) mod role;
pub(crate) mod schedule;
pub(crate) mod token;
