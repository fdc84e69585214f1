//! The protocol, checked exhaustively for small bounds.

use std::time::Instant;

use stateright::{Checker, Model};
use ticklease_model::LeaseModel;

#[test]
fn every_property_holds_for_two_replicas() {
    let started = Instant::now();
    let model = LeaseModel::small();
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
fn every_property_holds_for_three_replicas() {
    let started = Instant::now();
    let checker = LeaseModel::three_replicas()
        .checker()
        .threads(2)
        .spawn_bfs()
        .join();
    println!(
        "{} unique states, depth {}, {:?}",
        checker.unique_state_count(),
        checker.max_depth(),
        started.elapsed()
    );
    checker.assert_properties();
}
