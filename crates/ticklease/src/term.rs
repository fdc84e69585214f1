//! The term's vocabulary, the layer every other builds on: role names and
//! families of them, fencing tokens, holder ids, and the fence a claim
//! carries.

pub(crate) mod family;
pub(crate) mod fence;
#[cfg(feature = "sqlx")]
mod fence_sqlx;
pub(crate) mod holder;
pub(crate) mod role;
pub(crate) mod token;
