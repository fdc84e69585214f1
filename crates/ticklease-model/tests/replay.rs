//! The bridge from the model to the code: random walks of the model (leases,
//! claims, pause, freezes and deaths; no coordination sessions or
//! promotions, which need processes and a standby) are replayed against the
//! real Postgres store, statement by statement, and every answer must be the
//! one the model predicts. A tick of the model is `TICK` of real time; the
//! real lease is half a tick shorter than the model's, so a statement that
//! runs less than half a tick into its tick is on the model's side of every
//! expiry boundary (the test checks that each one did).

use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use stateright::Model;
use tokio::time::Instant;

use ticklease::{Acquire, LeaseStore, PgStore, PgStoreOptions, Release, Renew, Role, Token};
use ticklease_model::{Action, LeaseModel, State};
use ticklease_testkit::{connect, migrated_db, test_config, PgCluster};

const TICK: Duration = Duration::from_millis(400);
/// How far into its tick a statement may run: half a tick is the margin the
/// shorter real lease gives, less a little for clock reads.
const LATE_MAX: Duration = Duration::from_millis(180);
const WALKS: u64 = 10;
const STEPS: usize = 40;
/// How likely each action is picked, relative to the others: walks that
/// acquire often and let time pass contain takeovers. A death is, for the
/// store, a replica frozen for good: left to freezes.
fn weight(action: &Action) -> usize {
    match action {
        Action::Acquire(_) => 4,
        Action::Tick | Action::Unpause | Action::Resume(_) => 3,
        Action::Die(_) => 0,
        _ => 1,
    }
}

fn model() -> LeaseModel {
    LeaseModel {
        sessions: false,
        promotions: false,
        max_faults: 3,
        max_time: 7,
        max_statements: 40,
        ..LeaseModel::small()
    }
}

/// The walks reach what matters: takeovers after expiry, refused and
/// committed claims, pauses.
#[test]
fn the_walks_cover_takeovers_claims_and_pauses() {
    let model = model();
    let mut seen = std::collections::BTreeSet::new();
    for seed in 0..WALKS {
        for (before, action, after) in walk(&model, seed) {
            let kind = match action {
                Action::Acquire(_)
                    if before.db.row.holder.is_some() && after.db.row.token != before.db.row.token =>
                {
                    "takeover"
                }
                Action::Acquire(_)
                    if before.db.row.holder.is_some()
                        && before.db.row.expires == before.now + 1
                        && after.db.row.token == before.db.row.token =>
                {
                    "refused in the lease's last tick"
                }
                Action::Fence(_) if before.db.row.expires == before.now + 1 => {
                    "fence in the lease's last tick"
                }
                Action::Commit(r)
                    if before.fence_passes(&model, before.replicas[r as usize].claim.unwrap()) =>
                {
                    "commit"
                }
                Action::Commit(_) => "commit refused",
                Action::Fence(r) if after.replicas[r as usize].claim.is_none() => "fence refused",
                Action::Pause => "pause",
                Action::Renew(r) if after.replicas[r as usize].term.is_none() => "renew lost",
                _ => continue,
            };
            seen.insert(kind);
        }
    }
    for kind in [
        "takeover",
        "commit",
        "fence refused",
        "pause",
        "renew lost",
        "refused in the lease's last tick",
        "fence in the lease's last tick",
    ] {
        assert!(seen.contains(kind), "no walk has a {kind}: {seen:?}");
    }
}

/// A seeded random walk: at each step one enabled action.
fn walk(model: &LeaseModel, seed: u64) -> Vec<(State, Action, State)> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut state = model.init_states().remove(0);
    let mut steps = Vec::new();
    for _ in 0..STEPS {
        let mut actions = Vec::new();
        model.actions(&state, &mut actions);
        let mut enabled: Vec<(Action, State)> = actions
            .into_iter()
            .filter_map(|a| model.next_state(&state, a).map(|n| (a, n)))
            .collect();
        if enabled.is_empty() {
            break;
        }
        let mut pick = rng.gen_range(0..enabled.iter().map(|(a, _)| weight(a)).sum::<usize>());
        let at = enabled
            .iter()
            .position(|(a, _)| {
                let hit = pick < weight(a);
                pick = pick.saturating_sub(weight(a));
                hit
            })
            .expect("a pick within the total weight");
        let (action, next) = enabled.swap_remove(at);
        if action == Action::Tick {
            // Before the clock moves, every idle replica asks: a refused
            // ACQUIRE changes nothing in the model, and probes the lease's
            // end in every tick of the replay.
            for r in 0..model.replicas {
                let probe = Action::Acquire(r);
                let mut actions = Vec::new();
                model.actions(&state, &mut actions);
                if let Some(after) = actions
                    .contains(&probe)
                    .then(|| model.next_state(&state, probe))
                    .flatten()
                {
                    if after.db.row == state.db.row {
                        steps.push((state.clone(), probe, after.clone()));
                        state = after;
                    }
                }
            }
            let next = model
                .next_state(&state, Action::Tick)
                .expect("a probe does not block the clock");
            steps.push((state, Action::Tick, next.clone()));
            state = next;
            continue;
        }
        steps.push((state, action, next.clone()));
        state = next;
    }
    steps
}

/// A statement answered too far into its tick for its answer to be
/// compared with the model's (a stall of the machine, not of the protocol).
#[derive(Debug)]
struct Late;

/// Attempts per walk: a walk that ran late is replayed afresh.
const ATTEMPTS: usize = 3;

#[tokio::test]
async fn walks_of_the_model_replay_on_postgres_with_the_answers_it_predicts() {
    let model = model();
    for seed in 0..WALKS {
        let mut attempts = 0;
        while replay(&model, seed).await.is_err() {
            attempts += 1;
            assert!(attempts < ATTEMPTS, "walk {seed} ran late {ATTEMPTS} times");
        }
    }
}

/// Replays walk `seed` on a fresh database; every answer that arrived in
/// time must be the model's.
async fn replay(model: &LeaseModel, seed: u64) -> Result<(), Late> {
    let billing = Role::new("billing").unwrap();
    let real_ttl = TICK * u32::from(model.ttl) - TICK / 2;
    {
        let db = migrated_db(PgCluster::shared()).await;
        let store = PgStore::connect(db.clone(), PgStoreOptions::from_config(&test_config()))
            .await
            .unwrap();
        // The model's row exists from the start, as a Manager seeds it.
        store.seed(std::slice::from_ref(&billing)).await.unwrap();
        let owner = connect(&db).await.unwrap();
        owner
            .batch_execute("CREATE TABLE model_claims (n int)")
            .await
            .unwrap();
        let mut claimers = Vec::new();
        for _ in 0..model.replicas {
            claimers.push(connect(&db).await.unwrap());
        }
        let mut tokens: Vec<Option<Token>> = vec![None; model.replicas as usize];
        let steps = walk(model, seed);
        let start = Instant::now();
        // Answers that arrive less than LATE_MAX into their tick are on the
        // model's side of every expiry boundary.
        let on_time = |now: u8| {
            if start.elapsed().saturating_sub(TICK * u32::from(now)) < LATE_MAX {
                Ok(())
            } else {
                Err(Late)
            }
        };
        for (i, (before, action, after)) in steps.iter().enumerate() {
            let trace = || {
                let actions: Vec<_> = steps[..=i].iter().map(|(_, a, _)| *a).collect();
                format!("seed {seed}, after {actions:?}")
            };
            let holder = |r: u8| format!("replica-{r}");
            match *action {
                Action::Acquire(r) => {
                    let answer = store
                        .acquire(&billing, &holder(r), real_ttl, Duration::from_millis(1))
                        .await
                        .unwrap();
                    on_time(after.now)?;
                    let predicted = after.replicas[r as usize].term.is_some();
                    match answer {
                        Acquire::Acquired(term) => {
                            assert!(predicted, "ACQUIRE succeeded; the model refused it: {}", trace());
                            tokens[r as usize] = Some(term.token);
                        }
                        Acquire::Refused(refusal) => {
                            assert!(
                                !predicted,
                                "ACQUIRE refused ({refusal:?}); the model granted it: {}",
                                trace()
                            )
                        }
                    }
                }
                Action::Renew(r) | Action::RenewUnanswered(r) => {
                    let answer = store
                        .renew(&billing, tokens[r as usize].unwrap(), real_ttl)
                        .await
                        .unwrap();
                    on_time(after.now)?;
                    if *action == Action::Renew(r) {
                        let predicted = after.replicas[r as usize].term.is_some();
                        let renewed = matches!(answer, Renew::Renewed { .. });
                        assert_eq!(renewed, predicted, "RENEW answered {answer:?}: {}", trace());
                    }
                }
                Action::Release(r) => {
                    let released = store
                        .release(
                            &billing,
                            tokens[r as usize].unwrap(),
                            Release::Interrupted,
                            Duration::from_millis(1),
                        )
                        .await
                        .unwrap();
                    on_time(after.now)?;
                    let predicted = before.db.row.holder.is_some()
                        && before.replicas[r as usize]
                            .term
                            .is_some_and(|h| h.token == before.db.row.token);
                    assert_eq!(released, predicted, "RELEASE: {}", trace());
                }
                Action::Fence(r) => {
                    // The store ends an earlier term's fenced sessions (its
                    // sweep after an ACQUIRE or a pause): a claimer may be closed.
                    if claimers[r as usize].is_closed() {
                        claimers[r as usize] = connect(&db).await.unwrap();
                    }
                    let claimer = &claimers[r as usize];
                    claimer.batch_execute("BEGIN").await.unwrap();
                    let rows = claimer
                        .execute(
                            "INSERT INTO model_claims SELECT 1 WHERE (SELECT leader_fence('billing', $1))",
                            &[&tokens[r as usize].unwrap().0],
                        )
                        .await
                        .unwrap();
                    on_time(after.now)?;
                    let predicted = after.replicas[r as usize].claim.is_some();
                    assert_eq!(rows == 1, predicted, "the fence: {}", trace());
                    if rows == 0 {
                        claimer.batch_execute("ROLLBACK").await.unwrap();
                    }
                }
                Action::Commit(r) => {
                    let token = before.replicas[r as usize].claim.unwrap();
                    let committed = claimers[r as usize].batch_execute("COMMIT").await.is_ok();
                    on_time(after.now)?;
                    assert_eq!(
                        committed,
                        before.fence_passes(model, token),
                        "COMMIT: {}",
                        trace()
                    );
                }
                Action::Abandon(_) | Action::Die(_) | Action::Freeze(_) | Action::Resume(_) => {}
                Action::Pause => {
                    let paused = store.pause(&billing, "model", "replay").await.unwrap();
                    on_time(after.now)?;
                    assert!(paused, "PAUSE: {}", trace());
                }
                Action::Unpause => {
                    let unpaused = store.unpause(&billing).await.unwrap();
                    on_time(after.now)?;
                    assert!(unpaused, "UNPAUSE: {}", trace());
                }
                Action::Tick => {
                    tokio::time::sleep_until(start + TICK * u32::from(after.now)).await;
                }
                other => panic!("the replay model has no {other:?}"),
            }
            // A term that ended under its work drops the work's open claim.
            for r in 0..model.replicas {
                let (was, is) = (
                    before.replicas[r as usize].claim,
                    after.replicas[r as usize].claim,
                );
                if was.is_some() && is.is_none() && *action != Action::Commit(r) {
                    // Ended already when the next term's sweep closed its session.
                    if let Err(e) = claimers[r as usize].batch_execute("ROLLBACK").await {
                        assert!(
                            e.is_closed()
                                || e.code() == Some(&tokio_postgres::error::SqlState::ADMIN_SHUTDOWN),
                            "ROLLBACK: {e}"
                        );
                    }
                }
            }
        }
    }
    Ok(())
}
