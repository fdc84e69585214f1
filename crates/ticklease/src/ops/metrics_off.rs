//! Without the `prometheus` feature: no metrics type can be made, so every
//! `Option<Metrics>` is `None` and these calls are never reached.

use std::time::Duration;

pub(crate) use crate::ops::outcome::{LostReason, TickOutcome};
use crate::term::role::Role;

/// Uninhabited: metrics are compiled out.
#[derive(Debug, Clone)]
pub(crate) enum Metrics {}

impl Metrics {
    pub(crate) fn interval(&self, _: &Role, _: Duration) {
        match *self {}
    }
    pub(crate) fn leading(&self, _: &Role, _: bool) {
        match *self {}
    }
    pub(crate) fn tick_ended(&self, _: &Role, _: TickOutcome, _: Duration, _: Option<LostReason>) {
        match *self {}
    }
    pub(crate) fn renewed(&self, _: Duration) {
        match *self {}
    }
    pub(crate) fn drift(&self, _: f64) {
        match *self {}
    }
    pub(crate) fn coordination_up(&self, _: bool) {
        match *self {}
    }
    pub(crate) fn family(&self, _: &crate::Family, _: Option<Duration>) {
        match *self {}
    }
    pub(crate) fn family_leading(&self, _: &str, _: bool) {
        match *self {}
    }
    pub(crate) fn family_tick_ended(&self, _: &str, _: TickOutcome, _: Option<LostReason>) {
        match *self {}
    }
    pub(crate) fn skipped(&self, _: &Role, _: &[crate::Skipped]) {
        match *self {}
    }
}
