//! Each property has a defect that the checker must catch with a
//! counterexample: a property the checker cannot fail proves nothing.

use stateright::{Checker, Model};
use ticklease_model::{Action, Bug, LeaseModel};

/// Checks `bug` against `property` and returns the counterexample's actions.
fn caught(bug: Bug, property: &'static str) -> Vec<Action> {
    caught_in(LeaseModel::small(), bug, property)
}

/// As [`caught`], with claims under the lock at the fence.
fn caught_under_the_lock(bug: Bug, property: &'static str) -> Vec<Action> {
    caught_in(LeaseModel::small().row_lock(), bug, property)
}

fn caught_in(model: LeaseModel, bug: Bug, property: &'static str) -> Vec<Action> {
    let checker = model
        .with_bug(bug, property)
        .checker()
        .threads(2)
        .spawn_bfs()
        .join();
    let path = checker
        .discovery(property)
        .unwrap_or_else(|| panic!("{bug:?} was not caught by {property:?}"));
    let actions = path.into_actions();
    println!("{bug:?} breaks {property:?}: {actions:?}");
    actions
}

#[test]
fn dropping_the_token_bump_lets_two_terms_pass_the_fence() {
    caught(Bug::NoTokenBump, "at most one live term");
}

#[test]
fn a_lock_free_fence_lets_a_stale_claim_commit() {
    let trace = caught(Bug::LockFreeFence, "claims commit in token order");
    assert!(trace.iter().any(|a| matches!(a, Action::Commit(_))));
}

#[test]
fn a_renew_that_revives_a_taken_over_term_lets_a_stale_claim_commit() {
    caught(Bug::RenewRevives, "claims commit in token order");
}

#[test]
fn token_plus_one_without_the_clock_reissues_a_token_after_a_lossy_promotion() {
    let trace = caught(Bug::TokenPlusOne, "tokens are unique across timelines");
    assert!(trace.contains(&Action::Promote));
}

#[test]
fn a_key_takeover_under_the_old_token_leaves_its_fence_passing() {
    caught(Bug::KeyTakeoverKeepsToken, "at most one live term");
}

#[test]
fn a_fence_that_ignores_a_pause_lets_a_claim_commit_while_paused() {
    caught(Bug::FenceIgnoresPause, "no claim commits while paused");
}

#[test]
fn followers_that_do_not_wait_on_the_key_leave_a_dead_holders_role_unled() {
    caught(Bug::NoKeyWait, "a dead holder's role is led before the next tick");
}

#[test]
fn a_holder_not_told_of_a_pause_works_on_past_it() {
    caught(
        Bug::NoPauseSignal,
        "a pause cancels the holder's work before the next tick",
    );
}

#[test]
fn a_lock_free_fence_lets_a_claim_commit_after_its_term_and_its_lease() {
    caught(Bug::LockFreeFence, "no claim commits once its term is over");
    caught(Bug::LockFreeFence, "no claim commits after its lease ran out");
}

#[test]
fn under_the_lock_a_fence_that_holds_no_lock_lets_a_stale_claim_commit() {
    caught_under_the_lock(Bug::LockFreeFence, "claims commit in token order");
    caught_under_the_lock(Bug::LockFreeFence, "no claim commits once its term is over");
}

#[test]
fn under_the_lock_a_pause_that_takes_no_conflicting_lock_lets_a_claim_commit_while_paused() {
    caught_under_the_lock(Bug::EnderNoKeyUpdate, "no claim commits while paused");
}

#[test]
fn under_the_lock_an_acquire_that_sweeps_before_asking_ends_a_live_terms_claim() {
    caught_under_the_lock(Bug::DrainKillsLiveTerm, "no claim of a live term is ended");
}

#[test]
fn under_the_lock_a_takeover_that_only_waits_is_held_back_by_a_frozen_claimer() {
    let trace = caught_under_the_lock(
        Bug::NoDrain,
        "a takeover or a pause is never held back by a claim",
    );
    assert!(trace.iter().any(|a| matches!(a, Action::Fence(_))));
}

#[test]
fn every_property_of_the_correct_model_is_one_a_defect_breaks() {
    // A property added without a mutation above fails this.
    let checked: std::collections::BTreeSet<&str> = [
        "at most one live term",
        "claims commit in token order",
        "tokens are unique across timelines",
        "a dead holder's role is led before the next tick",
        "a pause cancels the holder's work before the next tick",
        "no claim commits while paused",
        "no claim commits once its term is over",
        "no claim commits after its lease ran out",
        "a takeover or a pause is never held back by a claim",
        "no claim of a live term is ended",
    ]
    .into();
    let models = [LeaseModel::small(), LeaseModel::small().row_lock()];
    for property in models.iter().flat_map(|m| m.properties()) {
        if property.expectation == stateright::Expectation::Always {
            assert!(
                checked.contains(property.name),
                "{} has no mutation",
                property.name
            );
        }
    }
}
