//! The database clock as seen from here: observed, never used to decide.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};
use std::time::{Duration, SystemTime};

use crate::ops::metrics::Metrics;

/// Database-vs-local clock offset seen in ACQUIRE/RENEW replies. Observed
/// only: no decision ever compares a database timestamp with a local one.
#[derive(Debug, Default)]
pub(crate) struct Drift {
    micros: AtomicI64,
    seen: AtomicBool,
    metrics: Option<Metrics>,
}

impl Drift {
    /// Reports each observation to `metrics` too.
    pub(crate) fn new(metrics: Option<Metrics>) -> Self {
        Drift {
            metrics,
            ..Drift::default()
        }
    }

    /// `db_now` is taken somewhere between the send and the reply; assume the middle.
    pub(crate) fn observe(&self, sent_wall: SystemTime, round_trip: Duration, db_now: SystemTime) {
        let local = sent_wall + round_trip / 2;
        let micros = match db_now.duration_since(local) {
            Ok(ahead) => ahead.as_micros() as i64,
            Err(behind) => -(behind.duration().as_micros() as i64),
        };
        self.micros.store(micros, Ordering::Relaxed);
        self.seen.store(true, Ordering::Relaxed);
        if let Some(m) = &self.metrics {
            m.drift(micros as f64 / 1e6);
        }
    }

    pub(crate) fn seconds(&self) -> Option<f64> {
        self.seen
            .load(Ordering::Relaxed)
            .then(|| self.micros.load(Ordering::Relaxed) as f64 / 1e6)
    }
}
