//! The dataplane's counters: one [`ShardMetrics`] per shard, written only by its shard (a load
//! and a store, no locked instruction), summed over shards when `/metrics` is scraped (SPEC 6:
//! never a shared contended cache line). Scheduler-side counters and gauges come from each
//! scheduler's [`Report`](crate::scheduler::thread::Report), published by its host.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Kinds of upstream failure, the `kind` label of `warmpath_upstream_errors_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum UpstreamError {
    /// TCP connect failed or timed out.
    Connect = 0,
    /// Reset or closed before any response byte.
    Reset = 1,
    /// No response head within `upstream.header_timeout`.
    Timeout = 2,
    /// A malformed response head or body.
    Malformed = 3,
    /// The connection ended in the middle of a response body.
    Truncated = 4,
}

impl UpstreamError {
    /// Every kind, in label order.
    pub const ALL: [UpstreamError; 5] = [
        UpstreamError::Connect,
        UpstreamError::Reset,
        UpstreamError::Timeout,
        UpstreamError::Malformed,
        UpstreamError::Truncated,
    ];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            UpstreamError::Connect => "connect",
            UpstreamError::Reset => "reset",
            UpstreamError::Timeout => "timeout",
            UpstreamError::Malformed => "malformed",
            UpstreamError::Truncated => "truncated",
        }
    }
}

/// Adds `n` to a counter only one thread writes: no read-modify-write instruction needed.
fn add(counter: &AtomicU64, n: u64) {
    counter.store(counter.load(Ordering::Relaxed).wrapping_add(n), Ordering::Relaxed);
}

/// Upper bounds of the latency histograms' buckets, in microseconds (the last is +Inf).
pub const BUCKETS_US: [u64; 18] = [
    500,
    1_000,
    2_500,
    5_000,
    10_000,
    25_000,
    50_000,
    100_000,
    250_000,
    500_000,
    1_000_000,
    2_500_000,
    5_000_000,
    10_000_000,
    30_000_000,
    60_000_000,
    120_000_000,
    300_000_000,
];

/// A latency histogram with the buckets of [`BUCKETS_US`] (non-cumulative counts; the scrape
/// accumulates) and a sum in microseconds.
#[derive(Debug, Default)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS_US.len() + 1],
    sum_us: AtomicU64,
}

impl Histogram {
    /// Records one observation.
    pub fn observe(&self, value: Duration) {
        let us = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        let bucket = BUCKETS_US.iter().position(|&bound| us <= bound).unwrap_or(BUCKETS_US.len());
        add(&self.buckets[bucket], 1);
        add(&self.sum_us, us);
    }

    /// Adds this histogram's counts into `into` (bucket counts, then the sum in µs).
    pub fn sum_into(&self, into: &mut [u64; BUCKETS_US.len() + 2]) {
        for (total, bucket) in into.iter_mut().zip(&self.buckets) {
            *total += bucket.load(Ordering::Relaxed);
        }
        into[BUCKETS_US.len() + 1] += self.sum_us.load(Ordering::Relaxed);
    }
}

/// Statuses are counted in a dense array indexed by the code (100..=599).
pub const STATUS_SLOTS: usize = 600;

/// One shard's counters for one model.
#[derive(Debug)]
pub struct ModelMetrics {
    /// Responses by status (router errors and relayed backend statuses alike).
    pub status: Box<[AtomicU64]>,
    /// Arrival to last byte.
    pub duration: Histogram,
    /// Forwarded to first response byte from the backend.
    pub ttfb: Histogram,
    /// Queue wait by lane, indexed by `Lane as usize`.
    pub queue_wait: [Histogram; 4],
    /// Upstream errors, `[backend][kind]`.
    pub upstream_errors: Box<[[AtomicU64; 5]]>,
    /// Dead pooled connections replaced by a fresh one to the same backend.
    pub pool_reconnects: AtomicU64,
}

impl ModelMetrics {
    fn new(backends: usize) -> ModelMetrics {
        ModelMetrics {
            status: (0..STATUS_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            duration: Histogram::default(),
            ttfb: Histogram::default(),
            queue_wait: Default::default(),
            upstream_errors: (0..backends).map(|_| Default::default()).collect(),
            pool_reconnects: AtomicU64::new(0),
        }
    }

    /// Counts a response with `status`.
    pub fn count_status(&self, status: u16) {
        add(&self.status[usize::from(status).min(STATUS_SLOTS - 1)], 1);
    }

    /// Counts an upstream error on `backend`.
    pub fn count_upstream_error(&self, backend: u16, kind: UpstreamError) {
        add(&self.upstream_errors[usize::from(backend)][kind as usize], 1);
    }

    /// Counts a pooled connection found dead and replaced.
    pub fn count_pool_reconnect(&self) {
        add(&self.pool_reconnects, 1);
    }
}

/// One shard's counters.
#[derive(Debug)]
pub struct ShardMetrics {
    /// Per model, in configuration order.
    pub models: Box<[ModelMetrics]>,
    /// Router answers before a model was known (bad framing, unknown model, other routes).
    pub other_status: Box<[AtomicU64]>,
    /// Client connections accepted.
    pub accepted: AtomicU64,
    /// Client connections refused at `max_connections`.
    pub refused: AtomicU64,
    /// Open client connections (a gauge the shard stores).
    pub open: AtomicU64,
    /// Bytes of request bodies held while queued (a gauge).
    pub buffered: AtomicU64,
    /// Requests whose client went away while queued or in flight.
    pub clients_gone: AtomicU64,
}

impl ShardMetrics {
    /// Counters for models with `backends[i]` backends each.
    pub fn new(backends: &[usize]) -> ShardMetrics {
        ShardMetrics {
            models: backends.iter().map(|&n| ModelMetrics::new(n)).collect(),
            other_status: (0..STATUS_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            open: AtomicU64::new(0),
            buffered: AtomicU64::new(0),
            clients_gone: AtomicU64::new(0),
        }
    }

    /// Counts a router answer not attributed to a model.
    pub fn count_other_status(&self, status: u16) {
        add(&self.other_status[usize::from(status).min(STATUS_SLOTS - 1)], 1);
    }

    /// Adds one to a counter of this shard.
    pub fn bump(counter: &AtomicU64) {
        add(counter, 1);
    }

    /// Sets a gauge of this shard.
    pub fn set(gauge: &AtomicU64, value: u64) {
        gauge.store(value, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_upper_bounds() {
        let h = Histogram::default();
        h.observe(Duration::from_micros(500));
        h.observe(Duration::from_micros(501));
        h.observe(Duration::from_secs(3600));
        let mut sums = [0; BUCKETS_US.len() + 2];
        h.sum_into(&mut sums);
        assert_eq!(sums[0], 1, "500 µs falls in the 500 µs bucket");
        assert_eq!(sums[1], 1, "501 µs falls in the 1 ms bucket");
        assert_eq!(sums[BUCKETS_US.len()], 1, "an hour falls in +Inf");
        assert_eq!(sums[BUCKETS_US.len() + 1], 500 + 501 + 3_600_000_000);
    }

    #[test]
    fn statuses_are_clamped_into_the_array() {
        let m = ShardMetrics::new(&[1]);
        m.models[0].count_status(200);
        m.models[0].count_status(999);
        m.count_other_status(404);
        assert_eq!(m.models[0].status[200].load(Ordering::Relaxed), 1);
        assert_eq!(m.models[0].status[STATUS_SLOTS - 1].load(Ordering::Relaxed), 1);
        assert_eq!(m.other_status[404].load(Ordering::Relaxed), 1);
    }
}
