//! The dataplane's counters: one [`ShardMetrics`] per shard, written only by its shard (a load
//! and a store, no locked instruction), summed over shards when `/metrics` is scraped (SPEC 6:
//! never a shared contended cache line). Scheduler-side counters and gauges come from each
//! scheduler's [`Report`](super::report::Report), published by its host.
//!
//! Issue \[11\]: the counters of a request without a tenant (none configured) are the model's
//! own, as before; a configured tenant's responses, admissions and times to first byte are
//! counted in a [`TenantMetrics`] of its own per model, made by the shard at the tenant's first
//! request for that model (so a shard holds counters only for the pairs it has seen).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
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

/// Queue-wait buckets' upper bounds, in microseconds: 100 µs to 60 s (the +Inf bucket
/// follows). A queue wait is microseconds on an idle router and up to `queue.timeout` (30 s by
/// default) under a backlog.
pub const QUEUE_WAIT_BUCKETS_US: &[u64] = &[
    100, 250, 500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000,
    1_000_000, 2_500_000, 5_000_000, 10_000_000, 30_000_000, 60_000_000,
];

/// Time-to-first-byte and request-duration buckets' upper bounds, in microseconds: 1 ms to
/// 10 min. A first byte comes after the prefill (milliseconds to minutes for long prompts,
/// `upstream.header_timeout` is 600 s); a streamed answer lasts as long as its decode.
pub const LATENCY_BUCKETS_US: &[u64] = &[
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
    600_000_000,
];

fn latency() -> Histogram {
    Histogram::new(LATENCY_BUCKETS_US)
}

/// A latency histogram over a fixed bucket table (non-cumulative counts; the scrape
/// accumulates) and a sum in microseconds; single writer.
#[derive(Debug)]
pub struct Histogram {
    bounds: &'static [u64],
    /// One per bound, then +Inf.
    buckets: Box<[AtomicU64]>,
    sum_us: AtomicU64,
}

impl Histogram {
    /// An empty histogram with buckets `bounds` (increasing, in µs).
    pub fn new(bounds: &'static [u64]) -> Histogram {
        debug_assert!(bounds.windows(2).all(|w| w[0] < w[1]), "bucket bounds increase");
        Histogram {
            bounds,
            buckets: (0..=bounds.len()).map(|_| AtomicU64::new(0)).collect(),
            sum_us: AtomicU64::new(0),
        }
    }

    /// The buckets' upper bounds in µs (the +Inf bucket is not listed).
    pub fn bounds(&self) -> &'static [u64] {
        self.bounds
    }

    /// Records one observation.
    pub fn observe(&self, value: Duration) {
        let us = u64::try_from(value.as_micros()).unwrap_or(u64::MAX);
        let bucket = self.bounds.partition_point(|&bound| bound < us);
        add(&self.buckets[bucket], 1);
        add(&self.sum_us, us);
    }

    /// Adds this histogram's counts into `into` (bucket counts, +Inf, then the sum in µs);
    /// `into` has `bounds().len() + 2` slots.
    pub fn sum_into(&self, into: &mut [u64]) {
        for (total, bucket) in into.iter_mut().zip(self.buckets.iter()) {
            *total += bucket.load(Ordering::Relaxed);
        }
        into[self.bounds.len() + 1] += self.sum_us.load(Ordering::Relaxed);
    }

    /// Whether nothing was observed.
    pub fn is_empty(&self) -> bool {
        self.buckets.iter().all(|b| b.load(Ordering::Relaxed) == 0)
    }

    /// Copies `other`'s counts (same bounds) into this one.
    fn copy_from(&self, other: &Histogram) {
        for (to, from) in self.buckets.iter().zip(other.buckets.iter()) {
            to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        self.sum_us.store(other.sum_us.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// The `prefix` label values of `warmpath_ttft_seconds`, indexed by `warm as usize`.
pub const PREFIX_LABELS: [&str; 2] = ["cold", "warm"];

/// Turn-depth buckets (SPEC section 10's `turn` label,
/// [`TURN_BUCKETS`](crate::scheduler::tracker::TURN_BUCKETS)).
pub const TURNS: usize = 5;

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
    /// Issue \[10\]: arrival to first response byte (the first body byte of a streamed
    /// response, the head of any other), by turn bucket and predicted prefix
    /// (`[turn][warm as usize]`).
    pub ttft: [[Histogram; 2]; TURNS],
    /// Issue \[10\]: queue wait by turn bucket.
    pub queue_wait_by_turn: [Histogram; TURNS],
    /// Upstream errors, `[backend][kind]`.
    pub upstream_errors: Box<[[AtomicU64; 5]]>,
    /// Per backend: 401 answers to requests that carried the model's engine key
    /// (`backend_api_key_file`), which the engine refused.
    pub key_refused: Box<[AtomicU64]>,
    /// Dead pooled connections replaced by a fresh one to the same backend.
    pub pool_reconnects: AtomicU64,
    /// S16: requests placed without their prompt's block hashes, the model's prompt pool having
    /// no free slot.
    pub prompt_pool_exhausted: AtomicU64,
    /// Admissions of requests without a tenant by lane (`Lane as usize`), counted by the shard
    /// that receives them (issue \[11\]; with no tenant configured `/metrics` reads the
    /// scheduler's count instead, which also holds admissions whose client had just left).
    pub admitted: [AtomicU64; 4],
    /// Per configured tenant `t`, at `t - 1`: its counters, once it has sent a request.
    pub tenants: Box<[OnceLock<Box<TenantMetrics>>]>,
}

/// Responses by status in a fixed table: each slot a packed word, high 16 bits the status
/// (0 = free), low 48 bits its count; single writer. The last slot is reserved for 599, where
/// a status beyond the table's [`StatusCounts::SLOTS`] - 1 distinct ones is counted.
#[derive(Debug)]
pub struct StatusCounts {
    slots: [AtomicU64; StatusCounts::SLOTS],
}

impl StatusCounts {
    /// Slots, the reserved one included.
    pub const SLOTS: usize = 32;
    const COUNT: u64 = (1 << 48) - 1;

    fn new() -> StatusCounts {
        let slots: [AtomicU64; Self::SLOTS] = std::array::from_fn(|_| AtomicU64::new(0));
        slots[Self::SLOTS - 1].store(599 << 48, Ordering::Relaxed);
        StatusCounts { slots }
    }

    /// Counts one response with `status` (clamped to 100..=599).
    pub fn count(&self, status: u16) {
        let status = u64::from(status.clamp(100, 599));
        for slot in &self.slots {
            let word = slot.load(Ordering::Relaxed);
            if word >> 48 == status || word == 0 {
                let count = (word & Self::COUNT) + 1;
                slot.store(status << 48 | count.min(Self::COUNT), Ordering::Relaxed);
                return;
            }
        }
        add(&self.slots[Self::SLOTS - 1], 1);
    }

    /// Every status counted and its count (none counted: none listed).
    pub fn counts(&self) -> impl Iterator<Item = (u16, u64)> + '_ {
        self.slots.iter().filter_map(|slot| {
            let word = slot.load(Ordering::Relaxed);
            let count = word & Self::COUNT;
            (count > 0).then_some(((word >> 48) as u16, count))
        })
    }

    fn copy_from(&self, other: &StatusCounts) {
        copy(&self.slots, &other.slots);
    }
}

/// One shard's counters for one model and one configured tenant (issue \[11\]).
#[derive(Debug)]
pub struct TenantMetrics {
    /// Responses by status.
    pub status: StatusCounts,
    /// Admissions by lane.
    pub admitted: [AtomicU64; 4],
    /// Arrival to first response byte, as [`ModelMetrics::ttft`].
    pub ttft: [[Histogram; 2]; TURNS],
}

impl TenantMetrics {
    fn new() -> TenantMetrics {
        TenantMetrics {
            status: StatusCounts::new(),
            admitted: Default::default(),
            ttft: std::array::from_fn(|_| std::array::from_fn(|_| latency())),
        }
    }

    fn copy_from(&self, other: &TenantMetrics) {
        self.status.copy_from(&other.status);
        copy(&self.admitted, &other.admitted);
        for (to, from) in self.ttft.iter().flatten().zip(other.ttft.iter().flatten()) {
            to.copy_from(from);
        }
    }
}

impl ModelMetrics {
    fn new(backends: usize, tenants: usize) -> ModelMetrics {
        ModelMetrics {
            status: (0..STATUS_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            duration: Histogram::new(LATENCY_BUCKETS_US),
            ttfb: Histogram::new(LATENCY_BUCKETS_US),
            queue_wait: std::array::from_fn(|_| Histogram::new(QUEUE_WAIT_BUCKETS_US)),
            ttft: std::array::from_fn(|_| std::array::from_fn(|_| latency())),
            queue_wait_by_turn: std::array::from_fn(|_| Histogram::new(QUEUE_WAIT_BUCKETS_US)),
            upstream_errors: (0..backends).map(|_| Default::default()).collect(),
            key_refused: (0..backends).map(|_| AtomicU64::new(0)).collect(),
            pool_reconnects: AtomicU64::new(0),
            prompt_pool_exhausted: AtomicU64::new(0),
            admitted: Default::default(),
            tenants: (0..tenants).map(|_| OnceLock::new()).collect(),
        }
    }

    /// Tenant `tenant`'s counters (from 1), made at its first use.
    fn tenant(&self, tenant: u16) -> &TenantMetrics {
        let slot = &self.tenants[usize::from(tenant) - 1];
        slot.get_or_init(|| Box::new(TenantMetrics::new()))
    }

    /// Tenant `tenant`'s counters if it has any (from 1).
    pub fn tenant_if_seen(&self, tenant: u16) -> Option<&TenantMetrics> {
        let slot = self.tenants.get(usize::from(tenant).checked_sub(1)?)?;
        slot.get().map(|boxed| &**boxed)
    }

    /// Counts a response with `status`.
    pub fn count_status(&self, status: u16) {
        add(&self.status[usize::from(status).min(STATUS_SLOTS - 1)], 1);
    }

    /// Records a time to first response byte of a request admitted with `turn` (a bucket)
    /// and `warm` (issue \[10\]).
    pub fn observe_ttft(&self, turn: usize, warm: bool, value: Duration) {
        self.ttft[turn][usize::from(warm)].observe(value);
    }

    /// Counts an upstream error on `backend`.
    pub fn count_upstream_error(&self, backend: u16, kind: UpstreamError) {
        add(&self.upstream_errors[usize::from(backend)][kind as usize], 1);
    }

    /// Counts a 401 from `backend` to the engine key; returns this shard's count so far.
    pub fn count_key_refused(&self, backend: u16) -> u64 {
        let counter = &self.key_refused[usize::from(backend)];
        add(counter, 1);
        counter.load(Ordering::Relaxed)
    }

    /// Counts a pooled connection found dead and replaced.
    pub fn count_pool_reconnect(&self) {
        add(&self.pool_reconnects, 1);
    }

    /// Copies `other`'s values into this one (which has at least its backends).
    fn copy_from(&self, other: &ModelMetrics) {
        copy(&self.status, &other.status);
        self.duration.copy_from(&other.duration);
        self.ttfb.copy_from(&other.ttfb);
        for (to, from) in self.queue_wait.iter().zip(&other.queue_wait) {
            to.copy_from(from);
        }
        for (to, from) in self.ttft.iter().flatten().zip(other.ttft.iter().flatten()) {
            to.copy_from(from);
        }
        for (to, from) in self.queue_wait_by_turn.iter().zip(&other.queue_wait_by_turn) {
            to.copy_from(from);
        }
        for (to, from) in self.upstream_errors.iter().zip(other.upstream_errors.iter()) {
            copy(to, from);
        }
        copy(&self.key_refused, &other.key_refused);
        copy(
            std::slice::from_ref(&self.pool_reconnects),
            std::slice::from_ref(&other.pool_reconnects),
        );
        copy(&self.admitted, &other.admitted);
        for (to, from) in self.tenants.iter().zip(other.tenants.iter()) {
            if let Some(from) = from.get() {
                let made = to.get_or_init(|| Box::new(TenantMetrics::new()));
                made.copy_from(from);
            }
        }
    }
}

fn copy(to: &[AtomicU64], from: &[AtomicU64]) {
    for (to, from) in to.iter().zip(from) {
        to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
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
    /// `accept` calls that failed (EMFILE, ENFILE, ...): connections left waiting in the listen
    /// queue until a retry.
    pub accept_errors: AtomicU64,
    /// Upstream connections not opened for want of the router's own descriptors or memory
    /// (EMFILE, ENFILE, ENOBUFS, ENOMEM, EADDRNOTAVAIL): their requests answered 503.
    pub upstream_socket_errors: AtomicU64,
    /// Open client connections (a gauge the shard stores).
    pub open: AtomicU64,
    /// Bytes of request bodies held while queued (a gauge).
    pub buffered: AtomicU64,
    /// Requests whose client went away while queued or in flight.
    pub clients_gone: AtomicU64,
    /// TLS connections closed on a TLS error (issue \[11\]): a failed handshake, bytes that are
    /// not TLS, a record that does not decrypt.
    pub tls_errors: AtomicU64,
    /// Issue \[11\], per configured tenant `t` at `t - 1`: tokens of its 2xx responses as
    /// settled, `[prompt, completion]`.
    pub tenant_tokens: Box<[[AtomicU64; 2]]>,
    /// Issue \[11\], per configured tenant `t` at `t - 1`: requests refused by its limits,
    /// `[Limit as usize]`.
    pub rate_limited: Box<[[AtomicU64; 2]]>,
}

impl ShardMetrics {
    /// Counters for models with `backends[i]` backends each, and `tenants` configured tenants.
    pub fn new(backends: &[usize], tenants: usize) -> ShardMetrics {
        ShardMetrics {
            models: backends.iter().map(|&n| ModelMetrics::new(n, tenants)).collect(),
            other_status: (0..STATUS_SLOTS).map(|_| AtomicU64::new(0)).collect(),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            accept_errors: AtomicU64::new(0),
            upstream_socket_errors: AtomicU64::new(0),
            open: AtomicU64::new(0),
            buffered: AtomicU64::new(0),
            clients_gone: AtomicU64::new(0),
            tls_errors: AtomicU64::new(0),
            tenant_tokens: (0..tenants).map(|_| Default::default()).collect(),
            rate_limited: (0..tenants).map(|_| Default::default()).collect(),
        }
    }

    /// Counters for every model and backend of `generation`.
    pub fn for_generation(generation: &super::Generation) -> ShardMetrics {
        let backends: Vec<usize> = generation.models.iter().map(|m| m.backends.len()).collect();
        ShardMetrics::new(&backends, generation.tenants.len())
    }

    /// A copy of these counters with room for every model and backend of `generation` (whose
    /// tables extend this one's: indices are stable across generations). Only the shard that
    /// writes these counters may call it, so no increment is lost in the copy.
    pub fn grown(&self, generation: &super::Generation) -> ShardMetrics {
        let grown = ShardMetrics::for_generation(generation);
        for (to, from) in grown.models.iter().zip(self.models.iter()) {
            to.copy_from(from);
        }
        copy(&grown.other_status, &self.other_status);
        for (to, from) in grown.tenant_tokens.iter().zip(self.tenant_tokens.iter()) {
            copy(to, from);
        }
        for (to, from) in grown.rate_limited.iter().zip(self.rate_limited.iter()) {
            copy(to, from);
        }
        fn scalars(m: &ShardMetrics) -> [&AtomicU64; 8] {
            let (errors, gone, socket) =
                (&m.accept_errors, &m.clients_gone, &m.upstream_socket_errors);
            [&m.accepted, &m.refused, errors, socket, &m.open, &m.buffered, gone, &m.tls_errors]
        }
        for (to, from) in scalars(&grown).into_iter().zip(scalars(self)) {
            to.store(from.load(Ordering::Relaxed), Ordering::Relaxed);
        }
        grown
    }

    /// Counts a response with `status` to a request of `model` from `tenant` (0: none).
    pub fn count_status(&self, model: u16, tenant: u16, status: u16) {
        let model = &self.models[usize::from(model)];
        match tenant {
            0 => model.count_status(status),
            _ => model.tenant(tenant).status.count(status),
        }
    }

    /// Counts an admission of a request of `model` from `tenant` (0: none) from `lane`
    /// (`Lane as usize`).
    pub fn count_admitted(&self, model: u16, tenant: u16, lane: usize) {
        let model = &self.models[usize::from(model)];
        match tenant {
            0 => add(&model.admitted[lane], 1),
            _ => add(&model.tenant(tenant).admitted[lane], 1),
        }
    }

    /// Records a time to first response byte of a request of `model` from `tenant` (0: none)
    /// admitted with `turn` (a bucket) and `warm` (issue \[10\]).
    pub fn observe_ttft(&self, model: u16, tenant: u16, turn: usize, warm: bool, value: Duration) {
        let model = &self.models[usize::from(model)];
        match tenant {
            0 => model.observe_ttft(turn, warm, value),
            _ => model.tenant(tenant).ttft[turn][usize::from(warm)].observe(value),
        }
    }

    /// Counts a request of `tenant` (from 1) refused by its `limit`.
    pub fn count_rate_limited(&self, tenant: u16, limit: crate::server::rate_limit::Limit) {
        add(&self.rate_limited[usize::from(tenant) - 1][limit as usize], 1);
    }

    /// Counts the settled tokens of a 2xx response to `tenant` (from 1).
    pub fn count_tenant_tokens(&self, tenant: u16, prompt: u64, completion: u64) {
        let counters = &self.tenant_tokens[usize::from(tenant) - 1];
        add(&counters[0], prompt);
        add(&counters[1], completion);
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
        let h = Histogram::new(LATENCY_BUCKETS_US);
        h.observe(Duration::from_micros(1_000));
        h.observe(Duration::from_micros(1_001));
        h.observe(Duration::from_secs(3600));
        let n = LATENCY_BUCKETS_US.len();
        let mut sums = vec![0; n + 2];
        h.sum_into(&mut sums);
        assert_eq!(sums[0], 1, "1 ms falls in the 1 ms bucket");
        assert_eq!(sums[1], 1, "1.001 ms falls in the 2.5 ms bucket");
        assert_eq!(sums[n], 1, "an hour falls in +Inf");
        assert_eq!(sums[n + 1], 1_000 + 1_001 + 3_600_000_000);
        assert_eq!(QUEUE_WAIT_BUCKETS_US.first(), Some(&100), "queue waits from 100 µs");
        assert_eq!(QUEUE_WAIT_BUCKETS_US.last(), Some(&60_000_000), "to 60 s");
        assert_eq!(LATENCY_BUCKETS_US.last(), Some(&600_000_000), "TTFB to 10 min");
    }

    #[test]
    fn grown_counters_keep_their_values() {
        let m = ShardMetrics::new(&[1], 2);
        m.models[0].count_status(200);
        m.count_status(0, 2, 429);
        m.count_admitted(0, 2, 3);
        m.models[0].count_upstream_error(0, UpstreamError::Reset);
        m.models[0].ttfb.observe(Duration::from_millis(3));
        ShardMetrics::bump(&m.accepted);
        let grown = {
            let bigger = ShardMetrics::new(&[2, 1], 3);
            for (to, from) in bigger.models.iter().zip(m.models.iter()) {
                to.copy_from(from);
            }
            bigger
        };
        assert_eq!(grown.models[0].status[200].load(Ordering::Relaxed), 1);
        assert_eq!(grown.models[0].upstream_errors[0][1].load(Ordering::Relaxed), 1);
        assert_eq!(grown.models[0].upstream_errors.len(), 2);
        let tenant = grown.models[0].tenant_if_seen(2).expect("tenant 2's counters are copied");
        assert_eq!(tenant.status.counts().collect::<Vec<_>>(), [(429, 1)]);
        assert_eq!(tenant.admitted[3].load(Ordering::Relaxed), 1);
        assert!(grown.models[0].tenant_if_seen(1).is_none() && grown.models[0].tenants.len() == 3);
        let mut sums = vec![0; LATENCY_BUCKETS_US.len() + 2];
        grown.models[0].ttfb.sum_into(&mut sums);
        assert_eq!(sums.iter().take(LATENCY_BUCKETS_US.len() + 1).sum::<u64>(), 1);
    }

    #[test]
    fn a_tenant_counts_its_own_and_leaves_the_model_s_alone() {
        let m = ShardMetrics::new(&[1], 1);
        m.count_status(0, 0, 200);
        m.count_status(0, 1, 200);
        m.count_status(0, 1, 200);
        m.observe_ttft(0, 1, 2, true, Duration::from_millis(2));
        m.count_admitted(0, 0, 1);
        assert_eq!(m.models[0].status[200].load(Ordering::Relaxed), 1);
        assert_eq!(m.models[0].admitted[1].load(Ordering::Relaxed), 1);
        let tenant = m.models[0].tenant_if_seen(1).unwrap();
        assert_eq!(tenant.status.counts().collect::<Vec<_>>(), [(200, 2)]);
        let mut sums = vec![0; LATENCY_BUCKETS_US.len() + 2];
        tenant.ttft[2][1].sum_into(&mut sums);
        assert_eq!(sums[1], 1, "2 ms falls in the 2.5 ms bucket");
        assert!(m.models[0].tenant_if_seen(0).is_none() && m.models[0].tenant_if_seen(2).is_none());
    }

    #[test]
    fn status_tables_overflow_into_599() {
        let counts = StatusCounts::new();
        assert_eq!(counts.counts().count(), 0, "the reserved slot lists nothing until used");
        for status in 200..200 + StatusCounts::SLOTS as u16 {
            counts.count(status);
        }
        counts.count(200);
        counts.count(1000);
        let seen: Vec<(u16, u64)> = counts.counts().collect();
        assert_eq!(seen.len(), StatusCounts::SLOTS);
        assert_eq!(seen[0], (200, 2));
        assert_eq!(seen[StatusCounts::SLOTS - 2], (230, 1));
        // 231 found no free slot; 1000 is clamped to 599.
        assert_eq!(seen[StatusCounts::SLOTS - 1], (599, 2));
    }

    #[test]
    fn statuses_are_clamped_into_the_array() {
        let m = ShardMetrics::new(&[1], 0);
        m.models[0].count_status(200);
        m.models[0].count_status(999);
        m.count_other_status(404);
        assert_eq!(m.models[0].status[200].load(Ordering::Relaxed), 1);
        assert_eq!(m.models[0].status[STATUS_SLOTS - 1].load(Ordering::Relaxed), 1);
        assert_eq!(m.other_status[404].load(Ordering::Relaxed), 1);
    }
}
