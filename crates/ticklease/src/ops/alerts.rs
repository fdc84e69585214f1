//! The Prometheus alert rules for ticklease's metrics, and their promtool
//! tests, for the prefix the application's registry gives the series: the
//! rules are written for `ticklease_leader_…` (`ticklease metrics`, the
//! worker); a library user's registry `Registry::with_prefix("myapp")`
//! exports `myapp_leader_…`, so the rules must say so too.

use crate::error::ConfigError;

const RULES: &str = include_str!("alerts/ticklease-alerts.yml");
const TESTS: &str = include_str!("alerts/ticklease-alerts.test.yml");

/// The prefix the shipped rules are written for.
pub const DEFAULT_PREFIX: &str = "ticklease";

/// The alert rules (Prometheus rule file) for series named `<prefix>_leader_…`.
pub fn alert_rules(prefix: &str) -> Result<String, ConfigError> {
    with_prefix(RULES, prefix)
}

/// The promtool tests of [`alert_rules`] for the same prefix; they read the
/// rules from `ticklease-alerts.yml` beside them (`promtool test rules`).
pub fn alert_rule_tests(prefix: &str) -> Result<String, ConfigError> {
    with_prefix(TESTS, prefix)
}

fn with_prefix(text: &str, prefix: &str) -> Result<String, ConfigError> {
    let valid = !prefix.is_empty()
        && prefix.len() <= 100
        && prefix.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && prefix
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':');
    if !valid {
        return Err(ConfigError::MetricPrefix {
            prefix: prefix.to_string(),
        });
    }
    Ok(text.replace(&format!("{DEFAULT_PREFIX}_leader_"), &format!("{prefix}_leader_")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rules_name_the_prefixed_series_and_nothing_of_the_default() {
        let rules = alert_rules("myapp").unwrap();
        assert!(rules.contains("myapp_leader_last_tick_age_seconds"));
        assert!(!rules.contains("ticklease_leader_"), "{rules}");
        assert_eq!(alert_rules(DEFAULT_PREFIX).unwrap(), RULES);
        for bad in ["", "9app", "my-app", "my app"] {
            assert!(alert_rules(bad).is_err(), "{bad:?}");
        }
    }
}
