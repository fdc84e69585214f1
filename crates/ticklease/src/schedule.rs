//! Scheduling: the loops that decide when each role or family key is led,
//! and when a follower asks the database next.

pub(crate) mod chance;
pub(crate) mod family;
pub(crate) mod scheduler;
pub(crate) mod wake;
