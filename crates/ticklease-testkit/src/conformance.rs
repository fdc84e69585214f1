//! The lease store conformance suite: what every `LeaseStore` must do. The
//! Postgres store and the fake run it alike (`conformance_suite!`); timings
//! are short real time for Postgres and paused time for the fake.

use std::time::{Duration, SystemTime};

use ticklease::{
    Acquire, FamilyOccurrenceAsk, LeaseStatus, LeaseStore, LossReason, OccurrenceAnswer, OccurrenceAsk,
    Refusal, Release, Renew, Role, StoreError, Token,
};

/// The lease TTL the suite uses.
pub const TTL: Duration = Duration::from_millis(400);
const HOUR: Duration = Duration::from_secs(3600);
/// Tolerance for comparing two database timestamps taken a statement apart.
const SLACK: Duration = Duration::from_secs(2);

fn role(name: &str) -> Role {
    Role::new(name).expect("valid role")
}

async fn acquired<S: LeaseStore>(store: &S, role: &Role, holder: &str, interval: Duration) -> Token {
    match store.acquire(role, holder, TTL, interval).await.expect("ACQUIRE") {
        Acquire::Acquired(term) => term.token,
        other => panic!("expected {holder} to acquire {role}, got {other:?}"),
    }
}

/// A term of `role` for `holder` with a lease of `lease` (an interval of 1 ms).
async fn acquired_for<S: LeaseStore>(store: &S, role: &Role, holder: &str, lease: Duration) -> Token {
    match store
        .acquire(role, holder, lease, Duration::from_millis(1))
        .await
        .expect("ACQUIRE")
    {
        Acquire::Acquired(term) => term.token,
        other => panic!("expected {holder} to acquire {role}, got {other:?}"),
    }
}

/// The `leader_status` row of `role`.
pub async fn lease_row<S: LeaseStore>(store: &S, role: &str) -> LeaseStatus {
    let all = store.status().await.expect("status");
    all.into_iter()
        .find(|s| s.role == role)
        .unwrap_or_else(|| panic!("no row for {role}"))
}

async fn row<S: LeaseStore>(store: &S, role: &Role) -> LeaseStatus {
    lease_row(store, role.as_str()).await
}

fn near(actual: SystemTime, expected: SystemTime) -> bool {
    let d = actual.duration_since(expected).unwrap_or_else(|e| e.duration());
    d <= SLACK
}

pub async fn acquire_starts_a_term_and_refuses_a_second_holder<S: LeaseStore>(store: &S) {
    let r = role("billing");
    let t = acquired(store, &r, "a", HOUR).await;
    match store.acquire(&r, "b", TTL, HOUR).await.expect("ACQUIRE") {
        Acquire::Refused(Refusal::Held {
            holder,
            remaining,
            holder_key,
            ..
        }) => {
            assert_eq!(holder, "a");
            assert!(remaining <= TTL && remaining > TTL / 2, "{remaining:?}");
            assert_eq!(
                holder_key, None,
                "a holder without a coordination session records no key"
            );
        }
        other => panic!("second holder got {other:?}"),
    }
    let s = row(store, &r).await;
    assert!(s.held);
    assert_eq!((s.holder_id.as_deref(), s.token), (Some("a"), t));
}

pub async fn expired_term_is_taken_over_with_a_larger_token<S: LeaseStore>(store: &S) {
    let r = role("billing");
    let t1 = acquired(store, &r, "a", Duration::from_millis(1)).await;
    tokio::time::sleep(TTL * 2).await;
    let t2 = acquired(store, &r, "b", Duration::from_millis(1)).await;
    assert!(t2 > t1, "{t2} > {t1}");
    assert_eq!(
        store.renew(&r, t1, TTL).await.expect("RENEW"),
        Renew::Lost(LossReason::TakenOver)
    );
    assert!(
        !store
            .release(&r, t1, Release::Completed, HOUR)
            .await
            .expect("RELEASE"),
        "stale release matched"
    );
    assert_eq!(row(store, &r).await.holder_id.as_deref(), Some("b"));
}

pub async fn renew_keeps_the_term_live_past_its_first_ttl<S: LeaseStore>(store: &S) {
    let r = role("dunning");
    let t = acquired(store, &r, "a", HOUR).await;
    for _ in 0..3 {
        tokio::time::sleep(TTL / 2).await;
        assert!(matches!(
            store.renew(&r, t, TTL).await.expect("RENEW"),
            Renew::Renewed { .. }
        ));
    }
    assert!(matches!(
        store.acquire(&r, "b", TTL, HOUR).await.expect("ACQUIRE"),
        Acquire::Refused(Refusal::Held { .. })
    ));
}

pub async fn release_and_renew_are_term_scoped<S: LeaseStore>(store: &S) {
    let r = role("dunning");
    let t = acquired(store, &r, "a", HOUR).await;
    let other = Token(t.0 - 1);
    assert!(!store
        .release(&r, other, Release::Completed, HOUR)
        .await
        .expect("RELEASE"));
    assert!(matches!(
        store.renew(&r, other, TTL).await.expect("RENEW"),
        Renew::Lost(_)
    ));
    assert!(row(store, &r).await.held, "a wrong token must not end the term");
}

pub async fn completed_release_stamps_the_tick_and_waits_an_interval<S: LeaseStore>(store: &S) {
    let r = role("email_outbox");
    let t = acquired(store, &r, "a", HOUR).await;
    assert!(store
        .release(&r, t, Release::Completed, HOUR)
        .await
        .expect("RELEASE"));
    let s = row(store, &r).await;
    assert!(!s.held && s.holder_id.is_none());
    assert_eq!(s.last_tick_holder.as_deref(), Some("a"));
    assert!(near(s.last_tick_ended_at.expect("stamped"), s.db_now));
    assert_eq!(s.not_before, None);
    match store.acquire(&r, "b", TTL, HOUR).await.expect("ACQUIRE") {
        Acquire::Refused(Refusal::NotDue { due_at, remaining }) => {
            assert!(near(due_at, s.db_now + HOUR));
            assert!(
                remaining <= HOUR && remaining > HOUR - Duration::from_secs(5),
                "{remaining:?}"
            );
        }
        other => panic!("expected NotDue, got {other:?}"),
    }
    tokio::time::sleep(Duration::from_millis(5)).await;
    acquired(store, &r, "b", Duration::from_millis(1)).await;
}

pub async fn interrupted_release_leaves_the_role_due_at_once<S: LeaseStore>(store: &S) {
    let r = role("email_outbox");
    let t = acquired(store, &r, "a", HOUR).await;
    assert!(store
        .release(&r, t, Release::Interrupted, HOUR)
        .await
        .expect("RELEASE"));
    let s = row(store, &r).await;
    assert_eq!((s.last_tick_ended_at, s.not_before), (None, None));
    acquired(store, &r, "b", HOUR).await;
}

pub async fn lost_release_cools_down_for_the_interval_capped_at_60s<S: LeaseStore>(store: &S) {
    let (long, short) = (role("webhook_outbox"), role("webhook_delivery"));
    let t = acquired(store, &long, "a", HOUR).await;
    assert!(store
        .release(&long, t, Release::Lost, HOUR)
        .await
        .expect("RELEASE"));
    let s = row(store, &long).await;
    assert!(near(
        s.not_before.expect("cooldown"),
        s.db_now + Duration::from_secs(60)
    ));
    assert_eq!(s.last_tick_ended_at, None);
    assert!(matches!(
        store.acquire(&long, "b", TTL, HOUR).await.expect("ACQUIRE"),
        Acquire::Refused(Refusal::NotDue { .. })
    ));

    let t = acquired(store, &short, "a", Duration::from_secs(5)).await;
    assert!(store
        .release(&short, t, Release::Lost, Duration::from_secs(5))
        .await
        .expect("RELEASE"));
    let s = row(store, &short).await;
    assert!(near(
        s.not_before.expect("cooldown"),
        s.db_now + Duration::from_secs(5)
    ));
}

pub async fn failed_release_waits_a_full_interval_and_is_not_a_completion<S: LeaseStore>(store: &S) {
    let r = role("billing");
    let t = acquired(store, &r, "a", HOUR).await;
    assert!(store
        .release(&r, t, Release::Failed, HOUR)
        .await
        .expect("RELEASE"));
    let s = row(store, &r).await;
    assert!(near(s.not_before.expect("cooldown"), s.db_now + HOUR));
    assert_eq!((s.last_tick_ended_at, s.last_tick_holder), (None, None));
    assert!(matches!(
        store
            .acquire(&r, "b", TTL, Duration::from_millis(1))
            .await
            .expect("ACQUIRE"),
        Acquire::Refused(Refusal::NotDue { .. })
    ));
}

pub async fn pause_ends_the_term_and_refuses_acquire_until_unpause<S: LeaseStore>(store: &S) {
    let r = role("email_outbox");
    let t = acquired(store, &r, "a", HOUR).await;
    assert!(store.pause(&r, "ops", "smtp key rotation").await.expect("PAUSE"));
    assert!(
        !store.pause(&r, "ops", "again").await.expect("PAUSE"),
        "second pause reports no change"
    );
    assert_eq!(
        store.renew(&r, t, TTL).await.expect("RENEW"),
        Renew::Lost(LossReason::Paused)
    );
    match store.acquire(&r, "b", TTL, HOUR).await.expect("ACQUIRE") {
        Acquire::Refused(Refusal::Paused { by, reason }) => {
            assert_eq!((by.as_str(), reason.as_str()), ("ops", "smtp key rotation"))
        }
        other => panic!("expected Paused, got {other:?}"),
    }
    let s = row(store, &r).await;
    assert!(!s.held && s.holder_id.is_none() && s.paused_at.is_some());
    assert!(store.unpause(&r).await.expect("UNPAUSE"));
    assert!(
        !store.unpause(&r).await.expect("UNPAUSE"),
        "second unpause reports no change"
    );
    // The paused term's holder says its work stopped (pause_waits_for_the_ended_terms_lease…).
    assert!(!store.release(&r, t, Release::Lost, HOUR).await.expect("RELEASE"));
    let t2 = acquired(store, &r, "b", HOUR).await;
    assert!(t2 > t);
}

/// Issue 32: a pause ends the term at once, but its holder's unfenced work
/// may still run until the holder hears of it and stops it: the next term
/// waits (an unpause, a run-now notwithstanding) until the ended term's
/// lease would have run out, or until its holder RELEASEs it, whichever
/// comes first.
pub async fn a_pause_makes_the_next_term_wait_for_the_ended_terms_lease_unless_its_holder_releases_it<
    S: LeaseStore,
>(
    store: &S,
) {
    let r = role("relay");
    // A lease of seconds: the wait it sets must outlast the three statements
    // below on a loaded machine (the suite's TTL of 400 ms did not, in CI).
    let t = acquired_for(store, &r, "a", Duration::from_secs(5)).await;
    assert!(store.pause(&r, "ops", "").await.expect("PAUSE"));
    assert!(store.unpause(&r).await.expect("UNPAUSE"));
    store.run_now(&r).await.expect("RUN NOW");
    assert!(
        matches!(
            store
                .acquire(&r, "b", TTL, Duration::from_millis(1))
                .await
                .expect("ACQUIRE"),
            Acquire::Refused(Refusal::NotDue { .. })
        ),
        "the next term waits for the paused term's lease"
    );
    assert!(
        !store.release(&r, t, Release::Lost, HOUR).await.expect("RELEASE"),
        "the paused term was over already"
    );
    // Without a release, the wait ends with the lease (again seconds long).
    let lease = Duration::from_secs(2);
    let t2 = acquired_for(store, &r, "b", lease).await;
    assert!(store.pause(&r, "ops", "").await.expect("PAUSE"));
    assert!(store.unpause(&r).await.expect("UNPAUSE"));
    match store
        .acquire(&r, "c", TTL, Duration::from_millis(1))
        .await
        .expect("ACQUIRE")
    {
        Acquire::Refused(Refusal::NotDue { remaining, .. }) => {
            assert!(
                remaining <= lease,
                "waits at most the ended term's lease: {remaining:?}"
            )
        }
        other => panic!("expected NotDue, got {other:?}"),
    }
    tokio::time::sleep(lease + Duration::from_millis(100)).await;
    let t3 = acquired(store, &r, "c", Duration::from_millis(1)).await;
    assert!(t3 > t2);
}

pub async fn unpause_leaves_not_before_alone<S: LeaseStore>(store: &S) {
    let r = role("dunning");
    let t = acquired(store, &r, "a", HOUR).await;
    assert!(store
        .release(&r, t, Release::Failed, HOUR)
        .await
        .expect("RELEASE"));
    let before = row(store, &r).await.not_before;
    assert!(store.pause(&r, "ops", "investigating").await.expect("PAUSE"));
    assert!(store.unpause(&r).await.expect("UNPAUSE"));
    assert_eq!(row(store, &r).await.not_before, before);
    assert!(matches!(
        store.acquire(&r, "b", TTL, HOUR).await.expect("ACQUIRE"),
        Acquire::Refused(Refusal::NotDue { .. })
    ));
}

pub async fn pause_of_an_unknown_role_is_an_error<S: LeaseStore>(store: &S) {
    let r = role("nope");
    assert!(matches!(
        store.pause(&r, "ops", "x").await,
        Err(StoreError::UnknownRole { .. })
    ));
    assert!(matches!(
        store.unpause(&r).await,
        Err(StoreError::UnknownRole { .. })
    ));
    assert!(
        store.status().await.expect("status").is_empty(),
        "nothing written"
    );
}

pub async fn pause_without_a_name_is_refused_and_writes_nothing<S: LeaseStore>(store: &S) {
    let r = role("billing");
    store.seed(std::slice::from_ref(&r)).await.expect("SEED");
    assert!(matches!(
        store.pause(&r, " ", "x").await,
        Err(StoreError::Rejected { .. })
    ));
    assert_eq!(row(store, &r).await.paused_at, None);
}

pub async fn seed_creates_missing_rows_and_leaves_existing_ones<S: LeaseStore>(store: &S) {
    let (a, b) = (role("billing"), role("dunning"));
    store.seed(std::slice::from_ref(&a)).await.expect("SEED");
    let t = acquired(store, &a, "x", HOUR).await;
    store.seed(&[a.clone(), b.clone()]).await.expect("SEED");
    let s = row(store, &a).await;
    assert_eq!(
        (s.held, s.token),
        (true, t),
        "seeding must not touch an existing row"
    );
    assert!(!row(store, &b).await.held);
}

pub async fn acquire_recreates_a_missing_row<S: LeaseStore>(store: &S) {
    let r = role("billing:shard-3");
    let t = acquired(store, &r, "a", HOUR).await;
    let seeded_from_epoch_ms = SystemTime::UNIX_EPOCH + Duration::from_millis(t.0 as u64);
    assert!(
        near(seeded_from_epoch_ms, row(store, &r).await.db_now),
        "token {t} not seeded from the epoch in ms"
    );
}

/// Each ACQUIRE issues `greatest(token + 1, clock in ms)`: a larger token,
/// and never one below the store's clock (tokens stay unique across a
/// failover that loses commits).
pub async fn every_acquire_issues_a_larger_token_never_below_the_clock<S: LeaseStore>(store: &S) {
    let r = role("billing");
    let mut last = acquired(store, &r, "a", Duration::from_millis(1)).await;
    for i in 0..5 {
        assert!(store
            .release(&r, last, Release::Interrupted, HOUR)
            .await
            .expect("RELEASE"));
        tokio::time::sleep(Duration::from_millis(5)).await;
        let before = row(store, &r).await.db_now;
        let before_ms = before
            .duration_since(SystemTime::UNIX_EPOCH)
            .expect("after the epoch")
            .as_millis() as i64;
        let t = acquired(store, &r, &format!("h{i}"), Duration::from_millis(1)).await;
        assert!(t.0 > last.0, "token {t} not above {last}");
        assert!(t.0 >= before_ms, "token {t} below the clock {before_ms} ms");
        last = t;
    }
}

pub async fn run_now_starts_one_manual_term_over_a_cooldown_and_names_unknown_roles<S: LeaseStore>(
    store: &S,
) {
    let r = role("billing");
    let t = acquired(store, &r, "a", Duration::from_millis(1)).await;
    assert!(store
        .release(&r, t, Release::Failed, HOUR)
        .await
        .expect("RELEASE"));
    assert!(matches!(
        store
            .acquire(&r, "b", TTL, Duration::from_millis(1))
            .await
            .expect("ACQUIRE"),
        Acquire::Refused(Refusal::NotDue { .. })
    ));
    assert!(
        store.run_now(&r).await.expect("RUN NOW"),
        "the role had a cooldown"
    );
    assert!(
        store.run_now(&r).await.expect("RUN NOW"),
        "asked twice: one manual run, the cooldown still there"
    );
    let manual = acquired(store, &r, "b", Duration::from_millis(1)).await;
    assert!(store
        .release(&r, manual, Release::Completed, HOUR)
        .await
        .expect("RELEASE"));
    // The manual run is consumed; the hour's cooldown stays for the ticks after it.
    assert!(matches!(
        store
            .acquire(&r, "b", TTL, Duration::from_millis(1))
            .await
            .expect("ACQUIRE"),
        Acquire::Refused(Refusal::NotDue { .. })
    ));
    assert!(matches!(
        store.run_now(&role("nope")).await,
        Err(StoreError::UnknownRole { .. })
    ));
}

fn outcomes(answers: Vec<(Role, Acquire)>) -> std::collections::BTreeMap<String, Acquire> {
    let n = answers.len();
    let map: std::collections::BTreeMap<String, Acquire> =
        answers.into_iter().map(|(r, a)| (r.to_string(), a)).collect();
    assert_eq!(map.len(), n, "one answer per role");
    map
}

fn started(a: &Acquire) -> Option<Token> {
    match a {
        Acquire::Acquired(term) => Some(term.token),
        Acquire::Refused(_) => None,
    }
}

pub async fn acquire_many_starts_at_most_limit_terms_in_the_order_given<S: LeaseStore>(store: &S) {
    let roles: Vec<Role> = ["fam:c", "fam:a", "fam:d", "fam:b"].map(role).to_vec();
    store.seed(&roles).await.expect("seed");
    let held = acquired(store, &roles[2], "other", HOUR).await;
    let answers = outcomes(
        store
            .acquire_many(&roles, "me", TTL, HOUR, 2)
            .await
            .expect("ACQUIRE many"),
    );
    assert_eq!(answers.len(), 4);
    assert!(
        started(&answers["fam:c"]).is_some(),
        "first in order: {answers:?}"
    );
    assert!(
        started(&answers["fam:a"]).is_some(),
        "second in order: {answers:?}"
    );
    assert!(
        matches!(&answers["fam:d"], Acquire::Refused(Refusal::Held { holder, .. }) if holder == "other"),
        "{answers:?}"
    );
    assert_eq!(answers["fam:b"], Acquire::Refused(Refusal::OverLimit));
    for (name, holder) in [("fam:c", Some("me")), ("fam:a", Some("me")), ("fam:b", None)] {
        assert_eq!(
            row(store, &role(name)).await.holder_id.as_deref(),
            holder,
            "{name}"
        );
    }
    assert_eq!(
        row(store, &roles[2]).await.token,
        held,
        "a held term is untouched"
    );
    let again = outcomes(
        store
            .acquire_many(&roles, "third", TTL, HOUR, 0)
            .await
            .expect("ACQUIRE many"),
    );
    assert_eq!(
        again["fam:b"],
        Acquire::Refused(Refusal::OverLimit),
        "limit 0 starts nothing"
    );
    assert!(matches!(again["fam:c"], Acquire::Refused(Refusal::Held { .. })));
    assert_eq!(row(store, &role("fam:b")).await.holder_id, None);
}

pub async fn acquire_many_refuses_as_acquire_does_and_recreates_missing_rows<S: LeaseStore>(store: &S) {
    let (paused, due, fresh) = (role("fam:paused"), role("fam:due"), role("fam:fresh"));
    store.seed(&[paused.clone(), due.clone()]).await.expect("seed");
    store.pause(&paused, "ops", "maintenance").await.expect("PAUSE");
    let t = acquired(store, &due, "a", HOUR).await;
    assert!(store
        .release(&due, t, Release::Completed, HOUR)
        .await
        .expect("RELEASE"));
    let answers = outcomes(
        store
            .acquire_many(&[paused.clone(), due.clone(), fresh.clone()], "me", TTL, HOUR, 10)
            .await
            .expect("ACQUIRE many"),
    );
    assert!(
        matches!(&answers["fam:paused"], Acquire::Refused(Refusal::Paused { by, .. }) if by == "ops"),
        "{answers:?}"
    );
    assert!(
        matches!(&answers["fam:due"], Acquire::Refused(Refusal::NotDue { remaining, .. }) if *remaining > HOUR / 2),
        "{answers:?}"
    );
    let token = started(&answers["fam:fresh"]).expect("a role without a row is acquired");
    assert_eq!(row(store, &fresh).await.token, token);
    assert!(store
        .acquire_many(&[], "me", TTL, HOUR, 10)
        .await
        .expect("an empty batch")
        .is_empty());
}

pub async fn renew_many_renews_each_live_term_and_names_each_loss<S: LeaseStore>(store: &S) {
    let (a, b, c, d) = (role("fam:a"), role("fam:b"), role("fam:c"), role("fam:d"));
    let ta = acquired(store, &a, "me", HOUR).await;
    let tb = acquired(store, &b, "me", HOUR).await;
    let tc = acquired(store, &c, "me", HOUR).await;
    let td = acquired(store, &d, "me", HOUR).await;
    store.pause(&b, "ops", "").await.expect("PAUSE");
    assert!(store
        .release(&c, tc, Release::Interrupted, HOUR)
        .await
        .expect("RELEASE"));
    let tc2 = acquired(store, &c, "other", HOUR).await;
    let other_expires = row(store, &c).await.expires_at;
    tokio::time::sleep(TTL / 2).await;
    let answers = store
        .renew_many(
            &[(d.clone(), td), (a.clone(), ta), (b.clone(), tb), (c.clone(), tc)],
            TTL,
        )
        .await
        .expect("RENEW many");
    assert!(matches!(answers[0], Renew::Renewed { .. }), "{answers:?}");
    assert!(matches!(answers[1], Renew::Renewed { .. }), "{answers:?}");
    assert_eq!(answers[2], Renew::Lost(LossReason::Paused));
    assert_eq!(answers[3], Renew::Lost(LossReason::TakenOver));
    tokio::time::sleep(TTL * 3 / 4).await;
    assert!(row(store, &a).await.held, "renewed past its first TTL");
    let other = row(store, &c).await;
    assert_eq!(
        (other.token, other.expires_at),
        (tc2, other_expires),
        "the other holder's term is untouched, not renewed"
    );
    assert!(store
        .renew_many(&[], TTL)
        .await
        .expect("an empty batch")
        .is_empty());
}

pub async fn release_many_ends_each_term_by_its_outcome<S: LeaseStore>(store: &S) {
    let (a, b, c) = (role("fam:a"), role("fam:b"), role("fam:c"));
    let ta = acquired(store, &a, "me", HOUR).await;
    let tb = acquired(store, &b, "me", HOUR).await;
    let tc = acquired(store, &c, "me", HOUR).await;
    assert!(store
        .release(&c, tc, Release::Interrupted, HOUR)
        .await
        .expect("RELEASE"));
    let term = |role: &Role, token, outcome| ticklease::Releasing {
        role: role.clone(),
        token,
        outcome,
        interval: HOUR,
        ending: ticklease::Ending::of(outcome),
    };
    let released = store
        .release_many(&[
            term(&b, tb, Release::Failed),
            term(&a, ta, Release::Completed),
            term(&c, tc, Release::Completed),
        ])
        .await
        .expect("RELEASE many");
    assert_eq!(released, vec![true, true, false], "c was already over");
    let (sa, sb, sc) = (row(store, &a).await, row(store, &b).await, row(store, &c).await);
    assert!(!sa.held && !sb.held);
    assert_eq!(
        sa.last_tick_holder.as_deref(),
        Some("me"),
        "completed stamps the tick"
    );
    assert!(
        sb.last_tick_ended_at.is_none() && sb.not_before.is_some(),
        "failed cools down"
    );
    assert!(sc.last_tick_ended_at.is_none(), "an over term is not stamped");
}

pub async fn an_occurrence_starts_once_due_and_never_again_once_completed<S: LeaseStore>(store: &S) {
    let r = role("billing");
    let schedule = "CRON_TZ=UTC * * * * * *";
    let ask = |occurrence: Option<SystemTime>| OccurrenceAsk {
        occurrence,
        schedule: schedule.into(),
        next: occurrence.map(|o| o + HOUR),
        ..OccurrenceAsk::default()
    };
    let look = store
        .acquire_occurrence(&r, "a", TTL, &ask(None))
        .await
        .expect("look");
    assert!(
        matches!(look.acquire, Acquire::Refused(_)),
        "a look starts nothing: {look:?}"
    );
    assert!(near(look.after, look.db_now), "counting starts at the first look");
    assert_eq!(look.started, None, "no term started yet");
    // Asked right after the look, so that one round trip lies between the
    // look's clock reading and this ACQUIRE's: with a status read of the
    // whole table in between, the window overran 300 ms once under load.
    let soon = look.db_now + Duration::from_millis(300);
    match store
        .acquire_occurrence(&r, "a", TTL, &ask(Some(soon)))
        .await
        .expect("ACQUIRE")
        .acquire
    {
        Acquire::Refused(Refusal::NotDue { due_at, .. }) => assert_eq!(due_at, soon),
        other => panic!("not before the store's clock reaches it: {other:?}"),
    }
    let row = lease_row(store, "billing").await;
    let shown = (row.schedule.as_deref(), row.last_occurrence, row.next_occurrence);
    assert_eq!(shown, (Some(schedule), None, None), "a look records the schedule");
    tokio::time::sleep(Duration::from_millis(400)).await;
    let started = store
        .acquire_occurrence(&r, "a", TTL, &ask(Some(soon)))
        .await
        .expect("ACQUIRE");
    let Acquire::Acquired(term) = started.acquire else {
        panic!("a due occurrence starts: {started:?}")
    };
    assert_eq!(started.failures, 0);
    assert_eq!(started.started, None, "the answer is the row before this term");
    match store
        .acquire_occurrence(&r, "b", TTL, &ask(Some(soon)))
        .await
        .expect("ACQUIRE")
        .acquire
    {
        Acquire::Refused(Refusal::Held { holder, .. }) => assert_eq!(holder, "a"),
        other => panic!("one term at a time: {other:?}"),
    }
    assert!(store
        .release(&r, term.token, Release::Failed, Duration::from_millis(1))
        .await
        .expect("RELEASE"));
    let row = lease_row(store, "billing").await;
    assert_eq!(
        (row.last_occurrence, row.next_occurrence),
        (None, Some(soon)),
        "a failed occurrence is the next to run"
    );
    tokio::time::sleep(Duration::from_millis(10)).await;
    let retried = store
        .acquire_occurrence(&r, "b", TTL, &ask(Some(soon)))
        .await
        .expect("ACQUIRE");
    assert_eq!(retried.failures, 1, "a failed attempt counts");
    assert_eq!(retried.started, Some(soon), "the failed attempt was started");
    let Acquire::Acquired(retry) = retried.acquire else {
        panic!("a failed occurrence is retried: {retried:?}")
    };
    assert!(retry.token > term.token);
    assert!(store
        .release(&r, retry.token, Release::Completed, HOUR)
        .await
        .expect("RELEASE"));
    let done = store
        .acquire_occurrence(&r, "a", TTL, &ask(Some(soon)))
        .await
        .expect("ACQUIRE");
    assert_eq!(
        done.acquire,
        Acquire::Refused(Refusal::Contended),
        "never again once completed"
    );
    assert_eq!((done.after, done.failures, done.started), (soon, 0, Some(soon)));
    let row = lease_row(store, "billing").await;
    assert_eq!(
        (row.schedule.as_deref(), row.last_occurrence, row.next_occurrence),
        (Some(schedule), Some(soon), Some(soon + HOUR)),
        "a completed occurrence is the last; the next is the one after it"
    );
}

pub async fn run_now_of_a_cron_role_starts_one_manual_term<S: LeaseStore>(store: &S) {
    let r = role("billing");
    let ask = |occurrence: Option<SystemTime>, schedule: &str| OccurrenceAsk {
        occurrence,
        schedule: schedule.into(),
        next: occurrence.map(|o| o + HOUR),
        ..OccurrenceAsk::default()
    };
    let hourly = "CRON_TZ=UTC 0 * * * *";
    let first = store
        .acquire_occurrence(&r, "a", TTL, &ask(None, hourly))
        .await
        .expect("look");
    assert!(matches!(first.acquire, Acquire::Refused(_)), "{first:?}");
    // Occurrence x fails once and awaits its retry, 10 s off.
    let x = first.db_now + Duration::from_millis(10);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let Acquire::Acquired(failing) = store
        .acquire_occurrence(&r, "a", TTL, &ask(Some(x), hourly))
        .await
        .expect("ACQUIRE")
        .acquire
    else {
        panic!("x is due")
    };
    assert!(store
        .release(&r, failing.token, Release::Failed, Duration::from_secs(10))
        .await
        .expect("RELEASE"));
    assert!(
        store.run_now(&r).await.expect("run now"),
        "a cron role's cooldown is reported (and stays)"
    );
    store.pause(&r, "ops", "").await.expect("pause");
    let paused = store
        .acquire_occurrence(&r, "a", TTL, &ask(None, hourly))
        .await
        .expect("look");
    assert!(
        matches!(paused.acquire, Acquire::Refused(Refusal::Paused { .. })) && paused.run_now_pending,
        "a paused role keeps its run-now waiting: {paused:?}"
    );
    store.unpause(&r).await.expect("unpause");
    // The manual run waits for no cooldown; the schedule of the replica that starts it is recorded.
    let half_hourly = "CRON_TZ=UTC 30 * * * *";
    let manual = store
        .acquire_occurrence(&r, "a", TTL, &ask(None, half_hourly))
        .await
        .expect("look");
    let Acquire::Acquired(term) = manual.acquire else {
        panic!("a run-now starts a manual term at once: {manual:?}")
    };
    assert!(manual.manual_by.is_some(), "{manual:?}");
    assert_eq!(
        lease_row(store, "billing").await.schedule.as_deref(),
        Some(half_hourly)
    );
    assert!(store
        .release(&r, term.token, Release::Completed, Duration::from_millis(1))
        .await
        .expect("RELEASE"));
    let row = lease_row(store, "billing").await;
    assert_eq!(
        (row.last_occurrence, row.next_occurrence),
        (None, Some(x)),
        "a manual run completes no occurrence: x is still the next to run"
    );
    let again = store
        .acquire_occurrence(&r, "a", TTL, &ask(None, hourly))
        .await
        .expect("look");
    assert!(
        matches!(again.acquire, Acquire::Refused(_)) && again.manual_by.is_none(),
        "one manual run per run-now: {again:?}"
    );
    let retried = store
        .acquire_occurrence(&r, "a", TTL, &ask(Some(x), hourly))
        .await
        .expect("ACQUIRE");
    assert!(
        matches!(retried.acquire, Acquire::Refused(Refusal::NotDue { .. })),
        "x waits for its backoff: {retried:?}"
    );
    assert_eq!(retried.failures, 1, "a manual run counts no attempt of x");
}

pub async fn an_interval_term_clears_what_a_cron_schedule_recorded<S: LeaseStore>(store: &S) {
    let r = role("billing");
    let look = OccurrenceAsk {
        schedule: "CRON_TZ=UTC 0 * * * *".into(),
        ..OccurrenceAsk::default()
    };
    let first = store.acquire_occurrence(&r, "a", TTL, &look).await.expect("look");
    let x = first.db_now + Duration::from_millis(10);
    tokio::time::sleep(Duration::from_millis(30)).await;
    let at_x = OccurrenceAsk {
        occurrence: Some(x),
        next: Some(x + HOUR),
        ..look.clone()
    };
    let Acquire::Acquired(term) = store
        .acquire_occurrence(&r, "a", TTL, &at_x)
        .await
        .expect("ACQUIRE")
        .acquire
    else {
        panic!("x is due")
    };
    assert!(store
        .release(&r, term.token, Release::Completed, HOUR)
        .await
        .expect("RELEASE"));
    store.run_now(&r).await.expect("run now");
    tokio::time::sleep(Duration::from_millis(10)).await;
    // The role moves to an interval: what the cron schedule recorded for operators goes.
    let Acquire::Acquired(tick) = store
        .acquire(&r, "a", TTL, Duration::from_millis(1))
        .await
        .expect("ACQUIRE")
    else {
        panic!("an interval tick starts")
    };
    assert!(store
        .release(&r, tick.token, Release::Completed, HOUR)
        .await
        .expect("RELEASE"));
    let row = lease_row(store, "billing").await;
    assert_eq!(
        (row.schedule, row.next_occurrence, row.last_occurrence),
        (None, None, Some(x)),
        "its counting stays"
    );
    assert!(
        !store.run_now(&r).await.expect("run now"),
        "an interval role had no cooldown"
    );
    // Its interval (an hour) is not over: the run-now starts a manual term all the same, which consumes it.
    let Acquire::Acquired(manual) = store.acquire(&r, "a", TTL, HOUR).await.expect("ACQUIRE") else {
        panic!("a run-now of an interval role that is not due starts a term")
    };
    assert!(store
        .release(&r, manual.token, Release::Completed, HOUR)
        .await
        .expect("RELEASE"));
    let back = store.acquire_occurrence(&r, "a", TTL, &look).await.expect("look");
    assert!(
        matches!(back.acquire, Acquire::Refused(_)) && !back.run_now_pending,
        "no manual run left over from its interval days: {back:?}"
    );
    // Back on cron: the look records the schedule again, so a run-now is a manual run.
    let row = lease_row(store, "billing").await;
    assert_eq!(row.schedule.as_deref(), Some("CRON_TZ=UTC 0 * * * *"));
    store.run_now(&r).await.expect("run now");
    let manual = store.acquire_occurrence(&r, "a", TTL, &look).await.expect("look");
    assert!(manual.manual_by.is_some(), "{manual:?}");
}

pub async fn replicas_beat_and_leave_per_family<S: LeaseStore>(store: &S) {
    assert_eq!(store.beat("fam", "b", TTL).await.expect("beat"), vec!["b"]);
    assert_eq!(store.beat("fam", "a", TTL).await.expect("beat"), vec!["a", "b"]);
    assert_eq!(store.beat("other", "c", TTL).await.expect("beat"), vec!["c"]);
    assert!(store.leave("fam", "b").await.expect("leave"));
    assert!(!store.leave("fam", "b").await.expect("leave"));
    assert_eq!(store.beat("fam", "a", TTL).await.expect("beat"), vec!["a"]);
    tokio::time::sleep(TTL / 2).await;
    store.beat("fam", "b", TTL).await.expect("beat");
    tokio::time::sleep(TTL * 3 / 4).await;
    assert_eq!(
        store.beat("fam", "b", TTL).await.expect("beat"),
        vec!["b"],
        "a replica that stopped beating drops out after a TTL"
    );
}

/// ACQUIRE (one row and batched) tells how many attempts failed since the
/// last completed tick: a failure or a panic counts one, an interruption
/// none, a completion starts again from 0 (the retry policy's count).
pub async fn acquire_counts_failed_attempts_until_a_completion<S: LeaseStore>(store: &S) {
    let r = role("dunning");
    let quick = Duration::from_millis(1);
    let failures = |a: Acquire| match a {
        Acquire::Acquired(term) => (term.token, term.failures),
        other => panic!("expected a term, got {other:?}"),
    };
    let mut seen = Vec::new();
    for outcome in [
        Release::Failed,
        Release::Interrupted,
        Release::Failed,
        Release::Completed,
    ] {
        let (token, failed) = failures(store.acquire(&r, "a", TTL, quick).await.expect("ACQUIRE"));
        seen.push(failed);
        assert!(store.release(&r, token, outcome, quick).await.expect("RELEASE"));
        tokio::time::sleep(quick * 5).await;
    }
    let many = store
        .acquire_many(std::slice::from_ref(&r), "a", TTL, quick, 1)
        .await
        .expect("ACQUIRE many");
    let (token, failed) = failures(many.into_iter().next().expect("an answer").1);
    seen.push(failed);
    assert_eq!(seen, [0, 1, 1, 2, 0], "failed attempts as each ACQUIRE saw them");
    assert!(store
        .release(&r, token, Release::Failed, quick)
        .await
        .expect("RELEASE"));
    tokio::time::sleep(quick * 5).await;
    let many = store
        .acquire_many(std::slice::from_ref(&r), "a", TTL, quick, 1)
        .await
        .expect("ACQUIRE many");
    assert_eq!(failures(many.into_iter().next().expect("an answer").1).1, 1);
}

/// Unpause keeps the pause's window, and ACQUIRE of an occurrence answers
/// it (the skipped occurrences that fell due within it are named paused);
/// a second pause replaces it.
pub async fn unpause_keeps_the_pauses_window_for_the_occurrences_it_passed_over<S: LeaseStore>(store: &S) {
    let r = role("billing");
    let look = || async {
        let ask = OccurrenceAsk {
            schedule: "CRON_TZ=UTC 0 * * * *".into(),
            ..OccurrenceAsk::default()
        };
        store.acquire_occurrence(&r, "a", TTL, &ask).await.expect("look")
    };
    assert_eq!(look().await.last_pause, None, "never paused");
    assert!(store.pause(&r, "ops", "maintenance").await.expect("pause"));
    assert_eq!(look().await.last_pause, None, "still paused");
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(store.unpause(&r).await.expect("unpause"));
    let answer = look().await;
    let (paused, unpaused) = answer.last_pause.expect("the pause's window");
    assert!(
        unpaused >= paused + Duration::from_millis(40),
        "{paused:?} .. {unpaused:?}"
    );
    assert!(near(unpaused, answer.db_now));
    assert!(store.pause(&r, "ops", "again").await.expect("pause"));
    assert!(store.unpause(&r).await.expect("unpause"));
    let (again, _) = look().await.last_pause.expect("the pause's window");
    assert!(again >= unpaused, "the last pause replaces the one before");
}

/// The batched ACQUIRE of an occurrence: every key counts from its first
/// ask; the occurrence starts once reached, on at most `limit` keys in the
/// order given (the others over the limit), never again on a key that
/// completed it (due at the next occurrence); a key's run-now starts a
/// manual term; a failed key keeps its count of attempts.
pub async fn acquire_many_of_an_occurrence_starts_each_key_once_up_to_the_limit<S: LeaseStore>(store: &S) {
    let keys: Vec<Role> = ["fam:a", "fam:b", "fam:c"].into_iter().map(role).collect();
    let ask = |occurrence: SystemTime| FamilyOccurrenceAsk {
        occurrence,
        next: occurrence + HOUR,
        schedule: "CRON_TZ=UTC 0 * * * *".into(),
        recent: vec![occurrence - HOUR],
    };
    let by_key =
        |answers: Vec<(Role, OccurrenceAnswer)>| -> std::collections::BTreeMap<String, OccurrenceAnswer> {
            answers.into_iter().map(|(r, a)| (r.to_string(), a)).collect()
        };
    let keys = &keys;
    let many = |x: SystemTime, limit: usize| async move {
        by_key(
            store
                .acquire_many_occurrence(keys, "a", TTL, &ask(x), limit)
                .await
                .expect("ACQUIRE many"),
        )
    };
    // The first ask starts counting: an occurrence before it never runs.
    let first = many(SystemTime::now() - HOUR, 3).await;
    let db_now = first["fam:a"].db_now;
    for answer in first.values() {
        assert!(
            near(answer.after, db_now),
            "counting starts at the first ask: {answer:?}"
        );
        assert!(!matches!(answer.acquire, Acquire::Acquired(_)), "{answer:?}");
    }
    let x = db_now + Duration::from_millis(200);
    let early = many(x, 3).await;
    assert!(
        early
            .values()
            .all(|a| matches!(a.acquire, Acquire::Refused(Refusal::NotDue { due_at, .. }) if due_at == x)),
        "not before the store's clock reaches it: {early:?}"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    let due = many(x, 2).await;
    let token = |a: &OccurrenceAnswer| match a.acquire {
        Acquire::Acquired(term) => Some(term.token),
        _ => None,
    };
    let (ta, tb) = (
        token(&due["fam:a"]).expect("a starts"),
        token(&due["fam:b"]).expect("b starts"),
    );
    assert!(
        matches!(due["fam:c"].acquire, Acquire::Refused(Refusal::OverLimit)),
        "{due:?}"
    );
    assert_eq!(lease_row(store, "fam:a").await.next_occurrence, Some(x + HOUR));
    assert!(store
        .release(&keys[0], ta, Release::Completed, HOUR)
        .await
        .expect("RELEASE"));
    assert!(store
        .release(&keys[1], tb, Release::Failed, Duration::from_millis(1))
        .await
        .expect("RELEASE"));
    tokio::time::sleep(Duration::from_millis(20)).await;
    let again = many(x, 3).await;
    assert!(
        matches!(again["fam:a"].acquire, Acquire::Refused(Refusal::NotDue { due_at, .. }) if due_at == x + HOUR),
        "a completed occurrence never runs again: {again:?}"
    );
    assert_eq!(lease_row(store, "fam:a").await.last_occurrence, Some(x));
    let (retry, tc) = (
        token(&again["fam:b"]).expect("b retries"),
        token(&again["fam:c"]).expect("c starts"),
    );
    assert_eq!(again["fam:b"].failures, 1, "the retry knows its failed attempt");
    for (key, t) in [(&keys[1], retry), (&keys[2], tc)] {
        assert!(store
            .release(key, t, Release::Completed, HOUR)
            .await
            .expect("RELEASE"));
    }
    assert!(
        !store.run_now(&keys[0]).await.expect("run now"),
        "a cron key's run-now is a manual run"
    );
    let manual = many(x, 3).await;
    assert!(token(&manual["fam:a"]).is_some(), "{manual:?}");
    assert!(manual["fam:a"].manual_by.is_some(), "a manual term: {manual:?}");
    assert!(token(&manual["fam:b"]).is_none() && token(&manual["fam:c"]).is_none());
    let mut late = ask(x);
    late.recent.push(x);
    let refused = store.acquire_many_occurrence(keys, "a", TTL, &late, 3).await;
    assert!(
        refused.is_err(),
        "an earlier occurrence at the asked one is refused: {refused:?}"
    );
    let mut long = ask(x);
    long.recent = (1..=1001).rev().map(|i| x - Duration::from_secs(i)).collect();
    assert!(
        store
            .acquire_many_occurrence(keys, "a", TTL, &long, 3)
            .await
            .is_err(),
        "at most 1000"
    );
}

/// Generates one test per conformance case for the store `$make` builds.
/// Put the test attribute first: `conformance_suite!(#[tokio::test] make_store());`
#[macro_export]
macro_rules! conformance_suite {
    (#[$attr:meta] $make:expr) => {
        $crate::conformance_suite!(@cases #[$attr] $make;
            acquire_starts_a_term_and_refuses_a_second_holder,
            expired_term_is_taken_over_with_a_larger_token,
            renew_keeps_the_term_live_past_its_first_ttl,
            release_and_renew_are_term_scoped,
            completed_release_stamps_the_tick_and_waits_an_interval,
            interrupted_release_leaves_the_role_due_at_once,
            lost_release_cools_down_for_the_interval_capped_at_60s,
            failed_release_waits_a_full_interval_and_is_not_a_completion,
            pause_ends_the_term_and_refuses_acquire_until_unpause,
            a_pause_makes_the_next_term_wait_for_the_ended_terms_lease_unless_its_holder_releases_it,
            unpause_leaves_not_before_alone,
            pause_of_an_unknown_role_is_an_error,
            pause_without_a_name_is_refused_and_writes_nothing,
            seed_creates_missing_rows_and_leaves_existing_ones,
            acquire_recreates_a_missing_row,
            every_acquire_issues_a_larger_token_never_below_the_clock,
            run_now_starts_one_manual_term_over_a_cooldown_and_names_unknown_roles,
            acquire_many_starts_at_most_limit_terms_in_the_order_given,
            acquire_many_refuses_as_acquire_does_and_recreates_missing_rows,
            renew_many_renews_each_live_term_and_names_each_loss,
            release_many_ends_each_term_by_its_outcome,
            replicas_beat_and_leave_per_family,
            an_occurrence_starts_once_due_and_never_again_once_completed,
            run_now_of_a_cron_role_starts_one_manual_term,
            an_interval_term_clears_what_a_cron_schedule_recorded,
            acquire_counts_failed_attempts_until_a_completion,
            unpause_keeps_the_pauses_window_for_the_occurrences_it_passed_over,
            acquire_many_of_an_occurrence_starts_each_key_once_up_to_the_limit,
        );
    };
    (@cases #[$attr:meta] $make:expr; $($case:ident),* $(,)?) => {
        $(
            #[$attr]
            async fn $case() {
                let store = $make.await;
                $crate::conformance::$case(&store).await;
            }
        )*
    };
}
