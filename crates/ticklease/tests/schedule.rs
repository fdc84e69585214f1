//! Wall-clock schedules, the arithmetic (no database): parsing and its
//! errors, next occurrences in a zone through both 2026 daylight-saving
//! changes of Europe/Berlin and Australia/Sydney, the catch-up policies and
//! the retry backoff.

use std::time::{Duration, SystemTime};

use chrono::{DateTime, Utc};
use ticklease::{CatchUp, Config, Retry, Schedule, ScheduleError, SkipReason, Skipped};

const MIN: Duration = Duration::from_secs(60);
const TTL: Duration = Duration::from_secs(10);

fn at(rfc3339: &str) -> SystemTime {
    DateTime::parse_from_rfc3339(rfc3339)
        .unwrap()
        .with_timezone(&Utc)
        .into()
}

fn show(t: SystemTime) -> String {
    DateTime::<Utc>::from(t).to_rfc3339()
}

fn cron(expression: &str, zone: &str) -> Schedule {
    Schedule::cron(expression).unwrap().zone(zone).unwrap()
}

/// The occurrences strictly after `from`, `n` of them, in UTC.
fn next_n(schedule: &Schedule, from: &str, n: usize) -> Vec<String> {
    let mut t = at(from);
    (0..n)
        .map(|_| {
            t = schedule.next_after(t).unwrap();
            show(t)
        })
        .collect()
}

#[test]
fn next_occurrences_follow_the_vixie_rule_through_both_2026_transitions() {
    // (expression, zone, from (UTC), the next occurrences (UTC))
    let table: &[(&str, &str, &str, &[&str])] = &[
        // Berlin, spring (29 March 02:00 CET → 03:00 CEST): 02:30 is in the gap,
        // runs once right after it (03:00 CEST = 01:00 UTC), then 02:30 CEST.
        (
            "30 2 * * *",
            "Europe/Berlin",
            "2026-03-28T12:00:00Z",
            &["2026-03-29T01:00:00+00:00", "2026-03-30T00:30:00+00:00"],
        ),
        // Berlin, autumn (25 October 03:00 CEST → 02:00 CET): 02:30 happens
        // twice and runs once, at its first instance.
        (
            "30 2 * * *",
            "Europe/Berlin",
            "2026-10-24T12:00:00Z",
            &["2026-10-25T00:30:00+00:00", "2026-10-26T01:30:00+00:00"],
        ),
        // Every 15 minutes follows real time through the gap ...
        (
            "*/15 * * * *",
            "Europe/Berlin",
            "2026-03-29T00:30:00Z",
            &[
                "2026-03-29T00:45:00+00:00",
                "2026-03-29T01:00:00+00:00",
                "2026-03-29T01:15:00+00:00",
            ],
        ),
        // ... and through the fold (02:00–03:00 local twice: both run).
        (
            "*/15 * * * *",
            "Europe/Berlin",
            "2026-10-25T00:30:00Z",
            &[
                "2026-10-25T00:45:00+00:00",
                "2026-10-25T01:00:00+00:00",
                "2026-10-25T01:15:00+00:00",
                "2026-10-25T01:30:00+00:00",
            ],
        ),
        // Sydney, autumn (5 April 03:00 AEDT → 02:00 AEST): 02:30 once, at its first instance.
        (
            "30 2 * * *",
            "Australia/Sydney",
            "2026-04-04T00:00:00Z",
            &["2026-04-04T15:30:00+00:00", "2026-04-05T16:30:00+00:00"],
        ),
        // Sydney, spring (4 October 02:00 AEST → 03:00 AEDT): 02:30 is in the gap.
        (
            "30 2 * * *",
            "Australia/Sydney",
            "2026-10-03T00:00:00Z",
            &["2026-10-03T16:00:00+00:00", "2026-10-04T15:30:00+00:00"],
        ),
        (
            "*/15 * * * *",
            "Australia/Sydney",
            "2026-10-03T15:30:00Z",
            &[
                "2026-10-03T15:45:00+00:00",
                "2026-10-03T16:00:00+00:00",
                "2026-10-03T16:15:00+00:00",
            ],
        ),
        // UTC by default; seconds first when six fields; aliases; L, W and #.
        (
            "5 0 * * *",
            "UTC",
            "2026-12-02T00:04:59Z",
            &["2026-12-02T00:05:00+00:00"],
        ),
        (
            "30 */20 * * * *",
            "UTC",
            "2026-12-02T10:00:00Z",
            &["2026-12-02T10:00:30+00:00", "2026-12-02T10:20:30+00:00"],
        ),
        (
            "@hourly",
            "UTC",
            "2026-12-02T10:00:00Z",
            &["2026-12-02T11:00:00+00:00"],
        ),
        (
            "@daily",
            "UTC",
            "2026-12-02T10:00:00Z",
            &["2026-12-03T00:00:00+00:00"],
        ),
        (
            "0 9 L * *",
            "UTC",
            "2026-02-01T00:00:00Z",
            &["2026-02-28T09:00:00+00:00"],
        ),
        // 15 March 2026 is a Sunday: the nearest weekday is Monday the 16th.
        (
            "0 9 15W * *",
            "UTC",
            "2026-03-01T00:00:00Z",
            &["2026-03-16T09:00:00+00:00"],
        ),
        // The first Monday of the month (1 December 2026 is a Tuesday), 09:00 Berlin (CET = UTC+1).
        (
            "0 9 * * MON#1",
            "Europe/Berlin",
            "2026-12-02T00:00:00Z",
            &["2026-12-07T08:00:00+00:00"],
        ),
    ];
    for (expression, zone, from, want) in table {
        let got = next_n(&cron(expression, zone), from, want.len());
        assert_eq!(&got, want, "{expression} in {zone} after {from}");
    }
}

#[test]
fn the_latest_occurrence_at_or_before_an_instant_includes_the_instant() {
    let s = cron("0 * * * *", "UTC");
    let latest = |t: &str| show(s.latest_at_or_before(at(t)).unwrap());
    assert_eq!(latest("2026-12-02T10:00:00Z"), "2026-12-02T10:00:00+00:00");
    assert_eq!(latest("2026-12-02T10:59:59Z"), "2026-12-02T10:00:00+00:00");
    assert_eq!(
        s.next_after(at("2026-12-02T10:00:00Z")),
        Some(at("2026-12-02T11:00:00Z"))
    );
}

#[test]
fn an_invalid_field_is_named_with_its_position() {
    let cases: &[(&str, &str, &str, usize)] = &[
        ("5 0 32 * *", "day of month", "32", 5),
        ("61 0 * * *", "minute", "61", 1),
        ("0  25 * * *", "hour", "25", 4),
        ("0 0 * 13 *", "month", "13", 7),
        ("0 0 * * 9", "day of week", "9", 9),
        ("70 0 0 * * *", "second", "70", 1),
        ("*/0 * * * *", "minute", "*/0", 1),
    ];
    for (expression, field, value, position) in cases {
        match Schedule::cron(expression) {
            Err(ScheduleError::InvalidField {
                field: f,
                value: v,
                position: p,
                ..
            }) => assert_eq!((f, v.as_str(), p), (*field, *value, *position), "{expression}"),
            other => panic!("{expression}: {other:?}"),
        }
    }
    let e = Schedule::cron("5 0 32 * *").unwrap_err().to_string();
    assert!(e.contains("day of month") && e.contains("character 5"), "{e}");
}

#[test]
fn bad_expressions_zones_and_policies_are_refused_by_name() {
    for expression in ["", "* * * *", "* * * * * * * *", "@fortnightly"] {
        assert!(
            matches!(
                Schedule::cron(expression),
                Err(ScheduleError::InvalidExpression { .. })
            ),
            "{expression:?}"
        );
    }
    assert_eq!(
        Schedule::cron("0 0 * * *")
            .unwrap()
            .zone("Europe/Berln")
            .unwrap_err(),
        ScheduleError::UnknownZone {
            zone: "Europe/Berln".into()
        }
    );
    assert_eq!(
        Schedule::every(MIN).zone("UTC").unwrap_err(),
        ScheduleError::NotForInterval { what: "time zone" }
    );
    assert!(Schedule::every(MIN).catch_up(CatchUp::Skip).is_err());
    assert!(Schedule::every(MIN)
        .retry(Retry {
            attempts: 0,
            ..Retry::default()
        })
        .is_err());
    assert!(Schedule::every(MIN).starting_deadline(MIN).is_err());
    assert!(matches!(
        Schedule::cron("0 0 30 2 *"),
        Err(ScheduleError::NeverFires { .. })
    ));
    let s = Schedule::cron("0 0 * * *").unwrap();
    assert!(s.clone().catch_up(CatchUp::All { max: 0 }).is_err());
    assert!(s.clone().catch_up(CatchUp::All { max: 1001 }).is_err());
    assert!(s.clone().starting_deadline(Duration::ZERO).is_err());
    let bad = Retry {
        attempts: 0,
        ..Retry::default()
    };
    assert!(s.clone().retry(bad).is_err());
    let bad = Retry {
        backoff: Duration::from_secs(600),
        ..Retry::default()
    };
    assert!(s.retry(bad).is_err(), "backoff above backoff_max");
}

#[test]
fn a_schedule_faster_than_the_heartbeat_is_refused() {
    let config = Config::default(); // heartbeat 3 s
    let every_second = Schedule::cron("* * * * * *").unwrap();
    match every_second.check(&config) {
        Err(ScheduleError::FasterThanLease { gap, .. }) => assert_eq!(gap, Duration::from_secs(1)),
        other => panic!("{other:?}"),
    }
    assert!(Schedule::cron("*/5 * * * * *").unwrap().check(&config).is_ok());
    assert!(Schedule::cron("0 0 * * *").unwrap().check(&config).is_ok());
    assert!(Schedule::every(Duration::ZERO).check(&config).is_err());
    assert!(Schedule::every(MIN).check(&config).is_ok());
}

fn skipped(reason: SkipReason, first: &str, last: &str, count: u32) -> Skipped {
    Skipped {
        reason,
        first: at(first),
        last: at(last),
        count,
        more: false,
    }
}

#[test]
fn catch_up_latest_runs_the_most_recent_missed_occurrence_once() {
    let s = cron("0 * * * *", "UTC");
    // Last completed 07:00; the database says 10:20: 08:00 and 09:00 are skipped, 10:00 runs.
    let due = s.due(
        at("2026-12-02T07:00:00Z"),
        at("2026-12-02T10:20:00Z"),
        TTL,
        None,
        None,
    );
    assert_eq!(due.run, Some(at("2026-12-02T10:00:00Z")));
    assert_eq!(
        due.skipped,
        [skipped(
            SkipReason::CatchUp,
            "2026-12-02T08:00:00Z",
            "2026-12-02T09:00:00Z",
            2
        )]
    );
    assert_eq!(due.next, Some(at("2026-12-02T11:00:00Z")));
    // Once 10:00 completed (so it started), nothing is due until 11:00.
    let due = s.due(
        at("2026-12-02T10:00:00Z"),
        at("2026-12-02T10:20:00Z"),
        TTL,
        None,
        Some(at("2026-12-02T10:00:00Z")),
    );
    assert_eq!((due.run, due.skipped.len()), (None, 0));
    assert_eq!(due.next, Some(at("2026-12-02T11:00:00Z")));
    // The occurrence is due when the database clock reaches it, not before.
    let due = s.due(
        at("2026-12-02T10:00:00Z"),
        at("2026-12-02T10:59:59.999Z"),
        TTL,
        None,
        Some(at("2026-12-02T10:00:00Z")),
    );
    assert_eq!(due.run, None);
    let due = s.due(
        at("2026-12-02T10:00:00Z"),
        at("2026-12-02T11:00:00Z"),
        TTL,
        None,
        None,
    );
    assert_eq!(due.run, Some(at("2026-12-02T11:00:00Z")));
}

/// Occurrences that fell due while the role was paused are skipped as
/// `paused`; those before and after the pause keep their policy's reason.
#[test]
fn occurrences_due_while_paused_are_skipped_as_paused() {
    let s = cron("0 * * * *", "UTC");
    let pause = Some((at("2026-12-02T08:30:00Z"), at("2026-12-02T11:10:00Z")));
    // Last completed 07:00; paused 08:30-11:10; the database says 12:20.
    let due = s.due(
        at("2026-12-02T07:00:00Z"),
        at("2026-12-02T12:20:00Z"),
        TTL,
        pause,
        None,
    );
    assert_eq!(due.run, Some(at("2026-12-02T12:00:00Z")));
    assert_eq!(
        due.skipped,
        [
            skipped(
                SkipReason::Paused,
                "2026-12-02T09:00:00Z",
                "2026-12-02T11:00:00Z",
                3
            ),
            skipped(
                SkipReason::CatchUp,
                "2026-12-02T08:00:00Z",
                "2026-12-02T08:00:00Z",
                1
            ),
        ]
    );
    // An occurrence at the pause's first instant fell due while paused; one
    // at the unpause did not.
    let pause = Some((at("2026-12-02T09:00:00Z"), at("2026-12-02T11:00:00Z")));
    let due = s.due(
        at("2026-12-02T07:00:00Z"),
        at("2026-12-02T12:20:00Z"),
        TTL,
        pause,
        None,
    );
    let reasons: Vec<(SkipReason, u32)> = due.skipped.iter().map(|k| (k.reason, k.count)).collect();
    assert_eq!(reasons, [(SkipReason::Paused, 2), (SkipReason::CatchUp, 2)]);
    // A pause before the last completed occurrence names nothing.
    let old = Some((at("2026-12-01T01:00:00Z"), at("2026-12-01T05:00:00Z")));
    let due = s.due(
        at("2026-12-02T07:00:00Z"),
        at("2026-12-02T09:20:00Z"),
        TTL,
        old,
        None,
    );
    assert_eq!(
        due.skipped,
        [skipped(
            SkipReason::CatchUp,
            "2026-12-02T08:00:00Z",
            "2026-12-02T08:00:00Z",
            1
        )]
    );
    // Past the starting deadline and paused: the pause is the reason.
    let late = s.clone().starting_deadline(Duration::from_secs(1800)).unwrap();
    let pause = Some((at("2026-12-02T07:30:00Z"), at("2026-12-02T09:30:00Z")));
    let due = late.due(
        at("2026-12-02T07:00:00Z"),
        at("2026-12-02T10:40:00Z"),
        TTL,
        pause,
        None,
    );
    assert_eq!(due.run, None, "10:00 is past its deadline too");
    let reasons: Vec<(SkipReason, u32)> = due.skipped.iter().map(|k| (k.reason, k.count)).collect();
    assert_eq!(reasons, [(SkipReason::Deadline, 1), (SkipReason::Paused, 2)]);
}

#[test]
fn catch_up_all_runs_each_missed_occurrence_in_order_up_to_max() {
    let s = cron("0 * * * *", "UTC")
        .catch_up(CatchUp::All { max: 2 })
        .unwrap();
    let due = s.due(
        at("2026-12-02T06:00:00Z"),
        at("2026-12-02T10:20:00Z"),
        TTL,
        None,
        None,
    );
    // 07:00 … 10:00 missed; the most recent two run, oldest first.
    assert_eq!(due.run, Some(at("2026-12-02T09:00:00Z")));
    assert_eq!(
        due.skipped,
        [skipped(
            SkipReason::CatchUp,
            "2026-12-02T07:00:00Z",
            "2026-12-02T08:00:00Z",
            2
        )]
    );
    let due = s.due(
        at("2026-12-02T09:00:00Z"),
        at("2026-12-02T10:21:00Z"),
        TTL,
        None,
        None,
    );
    assert_eq!(
        (due.run, due.skipped.len()),
        (Some(at("2026-12-02T10:00:00Z")), 0)
    );
}

#[test]
fn catch_up_skip_and_a_starting_deadline_pass_over_late_occurrences() {
    let skip = cron("0 * * * *", "UTC").catch_up(CatchUp::Skip).unwrap();
    // 10:00 is 5 s old, inside the TTL: it runs.
    let due = skip.due(
        at("2026-12-02T09:00:00Z"),
        at("2026-12-02T10:00:05Z"),
        TTL,
        None,
        None,
    );
    assert_eq!(due.run, Some(at("2026-12-02T10:00:00Z")));
    // 20 minutes old: skipped past its deadline, nothing runs until 11:00.
    let due = skip.due(
        at("2026-12-02T09:00:00Z"),
        at("2026-12-02T10:20:00Z"),
        TTL,
        None,
        None,
    );
    assert_eq!(due.run, None);
    assert_eq!(
        due.skipped,
        [skipped(
            SkipReason::Deadline,
            "2026-12-02T10:00:00Z",
            "2026-12-02T10:00:00Z",
            1
        )]
    );
    // All with a 90-minute deadline: 07:00 and 08:00 are late, 09:00 runs.
    let all = cron("0 * * * *", "UTC")
        .catch_up(CatchUp::All { max: 10 })
        .unwrap()
        .starting_deadline(Duration::from_secs(90 * 60))
        .unwrap();
    let due = all.due(
        at("2026-12-02T06:00:00Z"),
        at("2026-12-02T10:20:00Z"),
        TTL,
        None,
        None,
    );
    assert_eq!(due.run, Some(at("2026-12-02T09:00:00Z")));
    assert_eq!(
        due.skipped,
        [skipped(
            SkipReason::Deadline,
            "2026-12-02T07:00:00Z",
            "2026-12-02T08:00:00Z",
            2
        )]
    );
}

#[test]
fn a_long_downtime_is_summarized_not_listed() {
    let s = cron("* * * * *", "UTC");
    // Last completed a year ago: the latest runs, the rest are one bounded record.
    let due = s.due(
        at("2025-12-02T10:00:00Z"),
        at("2026-12-02T10:00:30Z"),
        TTL,
        None,
        None,
    );
    assert_eq!(due.run, Some(at("2026-12-02T10:00:00Z")));
    let [skip] = due.skipped.as_slice() else {
        panic!("{:?}", due.skipped)
    };
    assert_eq!(skip.first, at("2025-12-02T10:01:00Z"));
    assert_eq!(skip.last, at("2026-12-02T09:59:00Z"));
    assert_eq!((skip.count, skip.more), (ticklease::SKIPPED_COUNTED_MAX, true));
}

#[test]
fn an_interval_schedule_has_no_occurrences() {
    let s = Schedule::every(MIN);
    assert_eq!(s.interval(), Some(MIN));
    let due = s.due(
        at("2026-12-02T10:00:00Z"),
        at("2026-12-02T11:00:00Z"),
        TTL,
        None,
        None,
    );
    assert_eq!((due.run, due.next), (None, None));
    assert_eq!(Schedule::from(MIN).interval(), Some(MIN));
}

#[test]
fn retries_back_off_exponentially_up_to_the_cap_then_stop() {
    let r = Retry {
        attempts: 5,
        backoff: Duration::from_secs(10),
        backoff_max: Duration::from_secs(25),
    };
    let waits: Vec<Option<u64>> = (0..6).map(|f| r.backoff_after(f).map(|d| d.as_secs())).collect();
    assert_eq!(waits, [None, Some(10), Some(20), Some(25), Some(25), None]);
    assert_eq!(Retry::NONE.backoff_after(1), None);
    assert_eq!(Retry::default().backoff_after(1), Some(Retry::BACKOFF_DEFAULT));
}

#[test]
fn an_intervals_retries_come_in_rounds_each_ended_by_the_interval() {
    let r = Retry {
        attempts: 3,
        backoff: Duration::from_secs(10),
        backoff_max: Duration::from_secs(300),
    };
    let waits: Vec<Option<u64>> = (0..7)
        .map(|f| r.backoff_in_round(f).map(|d| d.as_secs()))
        .collect();
    assert_eq!(
        waits,
        [Some(10), Some(20), None, Some(10), Some(20), None, Some(10)]
    );
    assert_eq!(Retry::NONE.backoff_in_round(0), None);
    assert_eq!(Retry::NONE.backoff_in_round(7), None);
}

#[test]
fn an_interval_schedule_takes_a_retry_policy_and_none_by_default() {
    let every = Schedule::every(Duration::from_secs(60));
    assert_eq!(every.retry_policy(), Retry::NONE);
    let policy = Retry {
        attempts: 2,
        ..Retry::default()
    };
    assert_eq!(every.retry(policy).unwrap().retry_policy(), policy);
}

#[test]
fn a_crontab_spec_may_name_its_zone_as_cronie_does() {
    let berlin = Schedule::cron_tz("CRON_TZ=Europe/Berlin 5 0 * * *").unwrap();
    assert_eq!(berlin.expression(), Some(("5 0 * * *", "Europe/Berlin")));
    assert_eq!(
        berlin.next_after(at("2026-12-02T00:00:00Z")),
        Some(at("2026-12-02T23:05:00Z")),
        "00:05 CET"
    );
    assert_eq!(
        Schedule::cron_tz("@daily").unwrap().expression(),
        Some(("@daily", "UTC"))
    );
    assert!(matches!(
        Schedule::cron_tz("CRON_TZ=Mars/Olympus 5 0 * * *"),
        Err(ScheduleError::UnknownZone { .. })
    ));
    assert!(matches!(
        Schedule::cron_tz("CRON_TZ=UTC"),
        Err(ScheduleError::InvalidExpression { .. })
    ));
}

/// A role's first occurrence (none ever started) may be up to a minute
/// older than where counting started: the latest such one runs alone, none
/// is counted as skipped, under any catch-up policy; not once an occurrence
/// started, and not one over the minute.
#[test]
fn a_first_occurrence_up_to_a_minute_before_counting_started_runs_alone() {
    let every_10s = Schedule::cron("*/10 * * * * *")
        .unwrap()
        .catch_up(CatchUp::All { max: 100 })
        .unwrap();
    let since = at("2026-12-02T10:00:55Z");
    let now = at("2026-12-02T10:00:57Z");
    let due = every_10s.due(since, now, TTL, None, None);
    assert_eq!(
        (due.run, due.skipped.len()),
        (Some(at("2026-12-02T10:00:50Z")), 0)
    );
    let started = Some(at("2026-12-02T09:00:00Z"));
    let due = every_10s.due(since, now, TTL, None, started);
    assert_eq!(due.run, None, "an occurrence started before: no grace");
    let hourly = Schedule::cron("0 * * * *").unwrap();
    let due = hourly.due(
        at("2026-12-02T10:01:01Z"),
        at("2026-12-02T10:01:02Z"),
        TTL,
        None,
        None,
    );
    assert_eq!(due.run, None, "over the minute");
    let due = hourly.due(
        at("2026-12-02T10:00:59Z"),
        at("2026-12-02T10:01:02Z"),
        TTL,
        None,
        None,
    );
    assert_eq!(due.run, Some(at("2026-12-02T10:00:00Z")));
}

/// Every line of `docs/cron-vectors.tsv` (the file other languages' clients
/// check their cron arithmetic against) holds for the library: the vectors
/// say what the library does, and a change to it fails here first.
#[test]
fn every_cron_vector_in_the_docs_holds() {
    let file = include_str!("../../../docs/cron-vectors.tsv");
    let mut checked = 0;
    for line in file.lines().filter(|l| !l.starts_with('#')).skip(1) {
        let fields: Vec<&str> = line.split('\t').collect();
        let [spec, after, expected @ ..] = fields.as_slice() else {
            panic!("a vector has a schedule, an instant and occurrences: {line:?}")
        };
        let schedule = Schedule::cron_tz(spec).unwrap_or_else(|e| panic!("{spec}: {e}"));
        let mut t = at(after);
        for want in expected {
            t = schedule
                .next_after(t)
                .unwrap_or_else(|| panic!("{spec}: none after {}", show(t)));
            assert_eq!(t, at(want), "{spec} after {after}: got {}", show(t));
        }
        checked += 1;
    }
    assert!(checked >= 25, "{checked} vectors");
}
