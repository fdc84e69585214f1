//! The demo's verdict and its report: pure functions of the script's checks
//! and the effects audit.

use std::fmt::Write;
use std::time::Duration;

use ticklease_sandbox::audit::{Audit, Kind};

/// One check of the script.
#[derive(Debug, Clone, PartialEq)]
pub enum Check {
    /// Something that must happen within `bound`; `took` is `None` when it
    /// was not observed at all.
    Timed {
        what: String,
        took: Option<Duration>,
        bound: Duration,
    },
    /// Something that must not happen, and did.
    Failed(String),
}

impl Check {
    /// Missing (not observed at all) or failed: the run failed.
    fn failed(&self) -> bool {
        match self {
            Check::Timed { took, .. } => took.is_none(),
            Check::Failed(_) => true,
        }
    }

    /// Observed, but later than its bound: a busy machine slows failover
    /// down; it changes no effect, so it is reported apart and fails nothing.
    fn late(&self) -> bool {
        matches!(self, Check::Timed { took: Some(t), bound, .. } if t > bound)
    }

    fn what(&self) -> &str {
        match self {
            Check::Timed { what, .. } | Check::Failed(what) => what,
        }
    }
}

/// Every invariant held and every event was observed (late ones included).
pub fn report(checks: &[Check], audit: &Audit) -> bool {
    audit.violations.is_empty() && !checks.iter().any(Check::failed)
}

/// The report printed at the end of a run that lasted `took`.
pub fn render(checks: &[Check], audit: &Audit, took: Duration) -> String {
    let mut out = String::new();
    // Writing to a String cannot fail.
    let _ = write_report(&mut out, checks, audit, took);
    out
}

fn write_report(out: &mut String, checks: &[Check], audit: &Audit, took: Duration) -> std::fmt::Result {
    writeln!(
        out,
        "\n=== ticklease demo report ({:.0} s) ===",
        took.as_secs_f64()
    )?;
    writeln!(out, "events:")?;
    for c in checks {
        match c {
            Check::Timed {
                what,
                took: Some(t),
                bound,
            } => writeln!(
                out,
                "  {what:<50} {:>6} ms  (bound {} ms){}",
                t.as_millis(),
                bound.as_millis(),
                if c.late() { "  LATE" } else { "" }
            )?,
            _ => writeln!(out, "  {:<50} FAILED", c.what())?,
        }
    }
    write_effects(out, audit)?;
    for v in &audit.violations {
        writeln!(out, "  VIOLATION: {v}")?;
    }
    for c in checks.iter().filter(|c| c.failed()) {
        writeln!(out, "  MISSING OR FAILED: {}", c.what())?;
    }
    write_late(out, checks)?;
    let verdict = if report(checks, audit) {
        "all invariants held"
    } else {
        "INVARIANTS BROKEN"
    };
    writeln!(out, "{verdict}")
}

/// The late events, apart from the invariants.
fn write_late(out: &mut String, checks: &[Check]) -> std::fmt::Result {
    let late: Vec<&Check> = checks.iter().filter(|c| c.late()).collect();
    if late.is_empty() {
        return Ok(());
    }
    writeln!(
        out,
        "late ({}; a busy machine delays failover, it does not change what is sent):",
        late.len()
    )?;
    for c in late {
        writeln!(out, "  {}", c.what())?;
    }
    Ok(())
}

fn write_effects(out: &mut String, a: &Audit) -> std::fmt::Result {
    writeln!(out, "effects (sent → received):")?;
    writeln!(out, "  invoices created:        {}", a.invoices)?;
    writeln!(
        out,
        "  charges:                 {} invoices charged, {} idempotency keys, {} requests",
        a.charged_invoices, a.charge_keys, a.charge_requests
    )?;
    writeln!(
        out,
        "  webhooks:                {} events × {} endpoints → {} unique deliveries, {} requests ({} re-sent under the same webhook-id)",
        a.events,
        a.endpoints.len(),
        a.hooks_unique,
        a.hooks_received,
        a.hooks_received - a.hooks_unique
    )?;
    writeln!(
        out,
        "  emails:                  {} in the outbox → {} unique Message-IDs, {} received ({} re-sent with the same Message-ID)",
        a.emails,
        a.emails_unique,
        a.emails_received,
        a.emails_received - a.emails_unique
    )?;
    writeln!(
        out,
        "  duplicates past idempotency keys: {}",
        a.count(Kind::Duplicate)
    )?;
    writeln!(out, "  losses:                  {}", a.count(Kind::Loss))?;
    writeln!(out, "  stale claims:            {}", a.count(Kind::StaleClaim))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use ticklease_sandbox::audit::{Audit, Duplicate, Loss, Violation};

    use super::{render, report, Check};

    fn timed(took: Option<u64>, bound: u64) -> Check {
        Check::Timed {
            what: "billing taken over after SIGKILL".into(),
            took: took.map(Duration::from_millis),
            bound: Duration::from_millis(bound),
        }
    }

    #[test]
    fn checks_within_their_bounds_and_a_clean_audit_pass() {
        let checks = [timed(Some(900), 4500)];
        assert!(report(&checks, &Audit::default()));
        let text = render(&checks, &Audit::default(), Duration::from_secs(20));
        assert!(text.contains("   900 ms  (bound 4500 ms)"), "{text}");
        assert!(text.ends_with("all invariants held\n"), "{text}");
    }

    #[test]
    fn a_missing_or_failed_check_fails_the_run() {
        for check in [timed(None, 4500), Check::Failed("no term while paused".into())] {
            let checks = [check];
            assert!(!report(&checks, &Audit::default()), "{checks:?}");
            let text = render(&checks, &Audit::default(), Duration::ZERO);
            assert!(text.contains("MISSING OR FAILED"), "{text}");
            assert!(text.ends_with("INVARIANTS BROKEN\n"), "{text}");
        }
        let text = render(&[timed(None, 4500)], &Audit::default(), Duration::ZERO);
        assert!(text.contains(" FAILED\n"), "{text}");
    }

    #[test]
    fn a_late_event_is_reported_apart_and_breaks_no_invariant() {
        let checks = [timed(Some(4501), 4500), timed(Some(900), 4500)];
        assert!(report(&checks, &Audit::default()));
        let text = render(&checks, &Audit::default(), Duration::ZERO);
        assert!(text.contains("  4501 ms  (bound 4500 ms)  LATE\n"), "{text}");
        assert!(text.contains("   900 ms  (bound 4500 ms)\n"), "{text}");
        assert!(text.contains("late (1; a busy machine"), "{text}");
        assert!(!text.contains("MISSING"), "{text}");
        assert!(text.ends_with("all invariants held\n"), "{text}");
    }

    #[test]
    fn the_report_counts_each_kind_of_violation_apart() {
        let audit = Audit {
            violations: vec![
                Violation::Duplicate(Duplicate::KeyReused {
                    key: "dunning-1-1".into(),
                    charges: 2,
                }),
                Violation::Loss(Loss::Email { id: 3 }),
                Violation::Loss(Loss::Charge { invoice: 4 }),
            ],
            ..Audit::default()
        };
        assert!(!report(&[], &audit));
        let text = render(&[], &audit, Duration::ZERO);
        assert!(text.contains("duplicates past idempotency keys: 1\n"), "{text}");
        assert!(text.contains("losses:                  2\n"), "{text}");
        assert!(text.contains("stale claims:            0\n"), "{text}");
        assert!(text.contains("VIOLATION: loss: email 3 never arrived"), "{text}");
    }
}
