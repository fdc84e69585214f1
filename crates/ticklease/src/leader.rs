//! Leading one term: the manager's ACQUIRE, the tick and its work, the
//! heartbeat state machine that renews or abandons, clock drift, and steps.

pub(crate) mod drift;
pub(crate) mod heartbeat;
pub(crate) mod lead;
pub(crate) mod step;
