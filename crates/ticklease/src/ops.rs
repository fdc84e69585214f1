//! Operations: how ticks end as metrics and history label them, the
//! history reader, the Prometheus metrics and the status page.

#[cfg(feature = "prometheus")]
pub(crate) mod alerts;
pub(crate) mod history;
#[cfg(feature = "prometheus")]
pub mod metrics;
#[cfg(not(feature = "prometheus"))]
#[path = "ops/metrics_off.rs"]
pub(crate) mod metrics;
pub(crate) mod outcome;
#[cfg(feature = "http")]
pub(crate) mod page;
