//! Latency recording (an HDR histogram in nanoseconds) and its summary.

use std::time::Duration;

use hdrhistogram::Histogram;
use serde::Serialize;

/// The longest latency a histogram holds; longer ones are clamped to it. Every cycle is
/// bounded well below this by the scenario's own deadline.
const MAX_NS: u64 = 120 * 1_000_000_000;

/// Collects the latencies of one case, and counts the cycles that failed.
#[derive(Debug, Clone)]
pub struct Recorder {
    hist: Histogram<u64>,
    failures: u64,
    first_failure: Option<String>,
}

impl Default for Recorder {
    fn default() -> Self {
        Recorder {
            hist: Histogram::new_with_bounds(1, MAX_NS, 3).expect("valid histogram bounds"),
            failures: 0,
            first_failure: None,
        }
    }
}

impl Recorder {
    pub fn record(&mut self, latency: Duration) {
        let ns = u64::try_from(latency.as_nanos()).unwrap_or(MAX_NS);
        self.hist.saturating_record(ns.clamp(1, MAX_NS));
    }

    pub fn fail(&mut self, why: impl Into<String>) {
        self.failures += 1;
        if self.first_failure.is_none() {
            self.first_failure = Some(why.into());
        }
    }

    pub fn merge(&mut self, other: &Recorder) {
        self.hist
            .add(&other.hist)
            .expect("histograms with equal bounds");
        self.failures += other.failures;
        if self.first_failure.is_none() {
            self.first_failure.clone_from(&other.first_failure);
        }
    }

    pub fn summary(&self) -> Summary {
        let us = |ns: u64| ns as f64 / 1000.0;
        let empty = self.hist.is_empty();
        let at = |q: f64| {
            if empty {
                0.0
            } else {
                us(self.hist.value_at_quantile(q))
            }
        };
        Summary {
            samples: self.hist.len(),
            failures: self.failures,
            first_failure: self.first_failure.clone(),
            median_us: at(0.5),
            p99_us: at(0.99),
            max_us: if empty { 0.0 } else { us(self.hist.max()) },
            mean_us: if empty {
                0.0
            } else {
                self.hist.mean() / 1000.0
            },
            cdf: if empty {
                Vec::new()
            } else {
                quantiles().map(|q| [q, at(q)]).collect()
            },
        }
    }
}

/// The figures of one case, in microseconds.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub samples: u64,
    pub failures: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_failure: Option<String>,
    pub median_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub mean_us: f64,
    /// `[quantile, latency_us]` pairs, for plotting the distribution.
    pub cdf: Vec<[f64; 2]>,
}

/// The quantiles the distribution is sampled at: every percent, plus both tails.
fn quantiles() -> impl Iterator<Item = f64> {
    let head = [0.001, 0.005];
    let body = (1..=99).map(|p| f64::from(p) / 100.0);
    let tail = [0.995, 0.999, 0.9999, 1.0];
    head.into_iter().chain(body).chain(tail)
}

/// Formats microseconds for the tables: `412 µs`, `3.21 ms`, `1.02 s`.
pub fn fmt_us(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.2} s", us / 1_000_000.0)
    } else if us >= 10_000.0 {
        format!("{:.1} ms", us / 1000.0)
    } else if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}
