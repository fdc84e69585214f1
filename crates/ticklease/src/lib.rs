//! ticklease (design note written below once the core compiles)

pub mod config;
pub mod error;
pub mod fence;
mod heartbeat;
pub mod lead;
pub mod migrate;
pub mod role;
pub mod store;
pub mod token;

pub use config::{Config, ConfigBuilder};
pub use error::{ConfigError, Error, MigrateError, RoleError, StoreError};
pub use fence::Fence;
pub use lead::{holder_id, BoxError, Cancel, Lead, Manager, RoleReport, Tick};
pub use migrate::{migrate, MigrateReport};
pub use role::Role;
pub use store::{Acquire, LeaseStatus, LeaseStore, LossReason, PgStore, PgStoreOptions, Release, Renew, Term};
pub use token::Token;
