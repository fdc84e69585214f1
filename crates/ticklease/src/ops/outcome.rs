//! How ticks end, as the metrics and the history label them (kept with or
//! without the `prometheus` feature: `settle` decides them either way).

use std::any::Any;

use crate::store::LossReason;

/// Why a tick ended without completing, as counted by `leader_lease_lost_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum LostReason {
    /// The term was lost.
    Lease(LossReason),
    /// The work panicked (a code or data defect).
    Panicked,
    /// The work returned `Err`.
    Failed,
}

impl LostReason {
    /// The metric label.
    #[cfg(feature = "prometheus")]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            LostReason::Lease(r) => r.as_str(),
            LostReason::Panicked => "panicked",
            LostReason::Failed => "failed",
        }
    }
}

/// How a tick ended, as counted by `leader_ticks_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub(crate) enum TickOutcome {
    /// Work returned `Ok`.
    Completed,
    /// Work returned `Err`.
    Failed,
    /// Work panicked.
    Panicked,
    /// Shutdown cancelled the tick.
    Interrupted,
    /// The term was lost under the work.
    Lost,
}

impl TickOutcome {
    /// The metric and history label.
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            TickOutcome::Completed => "completed",
            TickOutcome::Failed => "failed",
            TickOutcome::Panicked => "panicked",
            TickOutcome::Interrupted => "interrupted",
            TickOutcome::Lost => "lost",
        }
    }
}

/// The message of a panic payload.
pub(crate) fn panic_message(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "<non-string panic payload>"
    }
}
