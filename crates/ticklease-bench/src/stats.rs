//! Distributions: p50 / p99 / max over a run's samples.

/// Summary of samples (any unit).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Summary {
    pub n: usize,
    pub min: f64,
    pub p50: f64,
    pub p99: f64,
    pub max: f64,
}

/// Nearest-rank percentiles; `None` for no samples.
pub fn summarize(samples: &[f64]) -> Option<Summary> {
    if samples.is_empty() {
        return None;
    }
    let mut s = samples.to_vec();
    s.sort_by(f64::total_cmp);
    let rank = |p: f64| s[((p * s.len() as f64).ceil() as usize).clamp(1, s.len()) - 1];
    Some(Summary {
        n: s.len(),
        min: s[0],
        p50: rank(0.50),
        p99: rank(0.99),
        max: s[s.len() - 1],
    })
}
