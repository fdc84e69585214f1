//! Connecting to Postgres: TLS and URLs, multi-host connects, and the
//! coordination session (liveness keys, notifications, key waiters).

pub(crate) mod coordination;
pub mod hosts;
pub mod patroni;
mod timeline;
pub mod tls;
mod url;
