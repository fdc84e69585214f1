//! The protocol, checked exhaustively for small bounds.

use std::time::Instant;

use stateright::{Checker, Model};
use ticklease_model::LeaseModel;

fn check(model: LeaseModel) {
    let started = Instant::now();
    let checker = model.checker().threads(2).spawn_bfs().join();
    println!(
        "{} unique states, depth {}, {:?}",
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker.assert_properties();
}

#[test]
fn every_property_holds_for_two_replicas() {
    check(LeaseModel::small());
}

#[test]
fn every_property_holds_for_three_replicas() {
    check(LeaseModel::three_replicas());
}

/// One fault per run (a frozen claimer, a death, a session dropped): the
/// faults the lock changes anything for are the claimer's own, and the
/// bound keeps this check within a quarter of the one above.
#[test]
fn every_property_holds_for_two_replicas_under_the_lock_at_the_fence() {
    check(LeaseModel {
        max_faults: 1,
        ..LeaseModel::small().row_lock()
    });
}

#[test]
fn every_property_holds_for_three_replicas_under_the_lock_at_the_fence() {
    check(LeaseModel::three_replicas().row_lock());
}
