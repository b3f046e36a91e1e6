//! Latency histograms (HDR, microseconds) and throughput.

use std::time::Duration;

use hdrhistogram::Histogram;

/// Latencies of one kind, in microseconds, 3 significant figures.
#[derive(Clone)]
pub(crate) struct Lat(Histogram<u64>);

impl Default for Lat {
    fn default() -> Self {
        Lat(Histogram::new_with_bounds(1, 600_000_000, 3).expect("valid histogram bounds"))
    }
}

impl Lat {
    /// Records one sample.
    pub(crate) fn record(&mut self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1);
        self.0.saturating_record(us);
    }

    /// How many samples.
    pub(crate) fn count(&self) -> u64 {
        self.0.len()
    }

    /// Adds `other`'s samples.
    pub(crate) fn add(&mut self, other: &Lat) {
        // Same bounds on both sides: adding cannot fail.
        let _ = self.0.add(&other.0);
    }

    /// The value at quantile `q` (0.5 for p50).
    pub(crate) fn q(&self, q: f64) -> Duration {
        Duration::from_micros(self.0.value_at_quantile(q))
    }

    /// p50.
    pub(crate) fn p50(&self) -> Duration {
        self.q(0.5)
    }

    /// p99.
    pub(crate) fn p99(&self) -> Duration {
        self.q(0.99)
    }
}

/// `a / b` as a ratio (0 when `b` is zero).
pub(crate) fn ratio(a: Duration, b: Duration) -> f64 {
    if b.is_zero() {
        0.0
    } else {
        a.as_secs_f64() / b.as_secs_f64()
    }
}

/// A duration for a table: µs under 10 ms, ms with one decimal above.
pub(crate) fn show(d: Duration) -> String {
    let us = d.as_micros();
    if us < 10_000 {
        format!("{us} µs")
    } else {
        format!("{:.1} ms", d.as_secs_f64() * 1000.0)
    }
}
