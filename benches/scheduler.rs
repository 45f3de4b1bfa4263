//! Scheduler benchmarks.
//!
//! Dimensions:
//! - `cycle/warmpath/{0,1000,10000,100000}`: one arrive + admit + complete cycle through
//!   [`Scheduler::handle`] with the queue held at that depth (every slot busy, so each completion
//!   admits exactly one queued request). Half the arrivals are follow-ups of tracked sessions
//!   (boosted), half have no session; every request carries a 30 s queue deadline (in the
//!   deadline list). 4 backends, 64 slots each, session-affinity routing, 4,096 tracked sessions.
//! - `cycle/warmpath-100-tenants/{0,1000,10000}`: the same cycle with 100 tenants configured
//!   (weights 1 to 4) and the arrivals spread over them in rotation (issue \[11\]: the tenant
//!   order's heap of 100 backlogged tenants is updated on every admission).
//! - `cycle/binaryheap/…`: the same cycle through a baseline queue built on
//!   `std::collections::BinaryHeap` (boosted lane) and a `VecDeque` (normal lane), with lazy
//!   deletion (cancelled ids in a set, skipped when popped) and the same session tracker.
//! - `cancel/{warmpath,binaryheap}/10000`: arrive + cancel of a random queued request at depth
//!   10,000 (the baseline's cancel is O(1) but leaves garbage its pops must skip).
//!
//! Time is simulated (1 µs per cycle) so no clock read is measured.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, VecDeque};
use std::hint::black_box;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use hashbrown::HashSet;
use warmpath::scheduler::tracker::SessionTracker;
use warmpath::scheduler::{
    Arrival, Budget, Input, Output, Params, RequestId, Routing, Scheduler, Usage,
};
use warmpath::splitmix::SplitMix64;

const SESSIONS: u64 = 4096;
const BACKENDS: u16 = 4;
const SLOTS: u32 = 64;
const SECOND: u64 = 1_000_000_000;

fn params(max_queued: u32, tenants: u16) -> Params {
    Params {
        boost: true,
        routing: Routing::SessionAffinity,
        backends: BACKENDS,
        queue_timeout: Some(30 * SECOND),
        max_queued,
        inflight_per_backend: SLOTS,
        inflight_learned: false,
        prefill_tokens_per_backend: Budget::Tokens(0),
        max_sessions: SESSIONS as u32,
        max_overtakes: 16,
        boosted_streak_max: 0,
        grace_period: 0,
        max_retries: 2,
        eject_after_failures: 3,
        metrics_stale_after: 5 * SECOND,
        timer_resolution: 1 << 20,
        prefix: warmpath::scheduler::PrefixParams::DEFAULT,
        tenant_weights: (0..tenants).map(|t| 1 + t % 4).collect(),
    }
}

/// The scheduler held at a steady queue depth.
struct Steady {
    s: Scheduler,
    now: u64,
    next_id: u64,
    running: VecDeque<u64>,
    queued: Vec<u64>,
    out: Vec<Output>,
    rng: SplitMix64,
    /// Tenants the arrivals rotate over (0: none configured).
    tenants: u16,
}

impl Steady {
    fn new(depth: u32) -> Steady {
        Steady::with_tenants(depth, 0)
    }

    fn with_tenants(depth: u32, tenants: u16) -> Steady {
        let total = depth + SLOTS * u32::from(BACKENDS);
        let mut steady = Steady {
            tenants,
            s: Scheduler::new(params(depth.max(1), tenants), 0),
            now: 0,
            next_id: 0,
            running: VecDeque::with_capacity(total as usize + 8),
            queued: Vec::with_capacity(depth as usize + 8),
            out: Vec::with_capacity(64),
            rng: SplitMix64::new(7),
        };
        for session in 0..SESSIONS {
            steady.arrive(Some(session));
            steady.complete_oldest();
        }
        for _ in 0..total {
            steady.arrive(None);
        }
        steady
    }

    fn arrive(&mut self, session: Option<u64>) -> u64 {
        self.now += 1_000;
        self.next_id += 1;
        let arrival = Arrival {
            id: RequestId(self.next_id),
            session,
            prompt_bytes: 2000,
            streaming: true,
            prompt: warmpath::ring::prompt_pool::NO_PROMPT,
            tenant: match self.tenants {
                0 => 0,
                n => 1 + (self.next_id % u64::from(n)) as u16,
            },
        };
        self.out.clear();
        self.s.handle(self.now, Input::Arrive(arrival), &mut self.out);
        self.collect();
        self.next_id
    }

    fn collect(&mut self) {
        for output in &self.out {
            if let Output::Admit { id, .. } = output {
                self.running.push_back(id.0);
                if let Some(at) = self.queued.iter().rposition(|&q| q == id.0) {
                    self.queued.swap_remove(at);
                }
            }
        }
    }

    fn complete_oldest(&mut self) {
        let id = self.running.pop_front().expect("a running request");
        self.out.clear();
        let input = Input::Complete { id: RequestId(id), success: true, usage: Usage::NONE };
        self.s.handle(self.now, input, &mut self.out);
        self.collect();
    }

    fn cycle(&mut self) {
        let session = (self.next_id % 2 == 0).then(|| self.rng.next_u64() % SESSIONS);
        self.arrive(session);
        self.complete_oldest();
    }
}

/// The baseline: BinaryHeap + VecDeque with lazy deletion, same tracker.
struct Lazy {
    boosted: BinaryHeap<(u64, Reverse<u64>, u64)>,
    normal: VecDeque<u64>,
    cancelled: HashSet<u64>,
    tracker: SessionTracker,
    seq: u64,
    now: u64,
    rng: SplitMix64,
}

impl Lazy {
    fn new(depth: u32) -> Lazy {
        let mut lazy = Lazy {
            boosted: BinaryHeap::with_capacity(depth as usize + 8),
            normal: VecDeque::with_capacity(depth as usize + 8),
            cancelled: HashSet::with_capacity(1024),
            tracker: SessionTracker::with_capacity(SESSIONS as usize),
            seq: 0,
            now: 0,
            rng: SplitMix64::new(7),
        };
        for session in 0..SESSIONS {
            lazy.tracker.complete(session, session, (session % 4) as u16);
        }
        for _ in 0..depth {
            let session = (lazy.seq % 2 == 0).then(|| lazy.rng.next_u64() % SESSIONS);
            lazy.arrive(session);
        }
        lazy
    }

    fn arrive(&mut self, session: Option<u64>) -> u64 {
        self.now += 1_000;
        self.seq += 1;
        match session.and_then(|s| self.tracker.lookup(s)) {
            Some(completion) => self.boosted.push((completion.at, Reverse(self.seq), self.seq)),
            None => self.normal.push_back(self.seq),
        }
        self.seq
    }

    fn admit(&mut self) -> Option<u64> {
        while let Some((_, _, id)) = self.boosted.pop() {
            if !self.cancelled.remove(&id) {
                return Some(id);
            }
        }
        while let Some(id) = self.normal.pop_front() {
            if !self.cancelled.remove(&id) {
                return Some(id);
            }
        }
        None
    }

    fn cycle(&mut self) {
        let session = (self.seq % 2 == 0).then(|| self.rng.next_u64() % SESSIONS);
        self.arrive(session);
        let id = self.admit().expect("queued");
        self.tracker.complete(id % SESSIONS, self.now, (id % 4) as u16);
    }
}

fn cycle(c: &mut Criterion) {
    let mut group = c.benchmark_group("cycle");
    group.throughput(Throughput::Elements(1));
    for depth in [0u32, 1_000, 10_000, 100_000] {
        let mut steady = Steady::new(depth);
        group.bench_function(BenchmarkId::new("warmpath", depth), |b| b.iter(|| steady.cycle()));
        black_box(steady.s.queued());
        let mut lazy = Lazy::new(depth.max(1));
        group.bench_function(BenchmarkId::new("binaryheap", depth), |b| b.iter(|| lazy.cycle()));
        if depth <= 10_000 {
            let mut tenants = Steady::with_tenants(depth, 100);
            let id = BenchmarkId::new("warmpath-100-tenants", depth);
            group.bench_function(id, |b| b.iter(|| tenants.cycle()));
            black_box(tenants.s.queued());
        }
    }
    group.finish();
}

fn cancel(c: &mut Criterion) {
    let depth = 10_000u32;
    let mut group = c.benchmark_group("cancel");
    let mut steady = Steady::new(depth);
    steady.queued = (steady.next_id - u64::from(depth) + 1..=steady.next_id).collect();
    group.bench_function(BenchmarkId::new("warmpath", depth), |b| {
        b.iter(|| {
            let session = (steady.next_id % 2 == 0).then(|| steady.rng.next_u64() % SESSIONS);
            let id = steady.arrive(session);
            steady.queued.push(id);
            let victim = steady.rng.next_u64() as usize % steady.queued.len();
            let victim = steady.queued.swap_remove(victim);
            steady.out.clear();
            steady.s.handle(steady.now, Input::Cancel(RequestId(victim)), &mut steady.out);
        });
    });
    let mut lazy = Lazy::new(depth);
    let mut queued: Vec<u64> = (1..=u64::from(depth)).collect();
    group.bench_function(BenchmarkId::new("binaryheap", depth), |b| {
        b.iter(|| {
            let session = (lazy.seq % 2 == 0).then(|| lazy.rng.next_u64() % SESSIONS);
            queued.push(lazy.arrive(session));
            let victim = queued.swap_remove(lazy.rng.next_u64() as usize % queued.len());
            lazy.cancelled.insert(victim);
        });
    });
    group.finish();
}

criterion_group!(benches, cycle, cancel);
criterion_main!(benches);
