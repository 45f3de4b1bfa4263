//! The scheduler allocates nothing per request after warm-up: a counting global allocator
//! watches a steady mix of arrivals (boosted and normal), admissions, first bytes, completions,
//! cancellations, retries, queue timeouts, grace holds and snapshots.

// A global allocator cannot be written without `unsafe`: this test binary opts out of the
// crate-wide `unsafe_code = "deny"` for the forwarding allocator below only.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use warmpath::scheduler::{
    Arrival, Budget, Input, Output, Params, RequestId, Routing, Scheduler, Snapshot, Usage,
};

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counter is a relaxed
// atomic increment that touches no allocator state.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: same contract as our caller's.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: same contract as our caller's.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

const MS: u64 = 1_000_000;

struct Driver {
    s: Scheduler,
    now: u64,
    next_id: u64,
    running: std::collections::VecDeque<u64>,
    out: Vec<Output>,
}

impl Driver {
    fn send(&mut self, input: Input) {
        self.out.clear();
        self.s.handle(self.now, input, &mut self.out);
        for output in &self.out {
            if let Output::Admit { id, .. } = output {
                self.running.push_back(id.0);
            }
        }
    }

    /// One round of every kind of event.
    fn round(&mut self, round: u64) {
        self.now += 3 * MS;
        for k in 0..6 {
            self.next_id += 1;
            let session = (k % 2 == 0).then_some((round * 3 + k) % 20);
            let arrival = Arrival {
                id: RequestId(self.next_id),
                session,
                prompt_bytes: 1200,
                streaming: k % 3 != 0,
                prompt: warmpath::ring::prompt_pool::NO_PROMPT,
                tenant: 0,
            };
            self.send(Input::Arrive(arrival));
        }
        // A queued or admitted request's client goes away.
        self.send(Input::Cancel(RequestId(self.next_id - 1)));
        for k in 0..5 {
            let Some(id) = self.running.pop_front() else { break };
            self.send(Input::FirstByte(RequestId(id)));
            let input = match k {
                0 => Input::Retry(RequestId(id)),
                1 => Input::Complete { id: RequestId(id), success: false, usage: Usage::NONE },
                // The response's usage teaches tokens per byte and the engine's cache hits.
                _ => {
                    let usage =
                        Usage { prompt_tokens: 280, cached_tokens: 100, completion_tokens: 60 };
                    Input::Complete { id: RequestId(id), success: true, usage }
                }
            };
            self.send(input);
        }
        let snapshot = Snapshot::new(true, Some(round as u32 % 2), self.now);
        self.send(Input::Snapshot { backend: (round % 3) as u16, snapshot });
        self.send(Input::Tick);
    }
}

#[test]
fn no_allocation_per_request_after_warm_up() {
    let params = Params {
        boost: true,
        routing: Routing::SessionAffinity,
        backends: 3,
        queue_timeout: Some(40 * MS),
        max_queued: 256,
        inflight_per_backend: 4,
        // A learned cap allocates when it grows past the arena, up to its ceiling
        // (`scheduler::estimate`, "The inflight cap"): a bounded number of times, not per request.
        // This driver's waiting gauge reads 0 or 1 whatever is sent, so a learned cap would grow
        // toward its ceiling throughout; the fixed one keeps the arena at its size.
        inflight_learned: false,
        prefill_tokens_per_backend: Budget::Auto,
        max_sessions: 128,
        max_overtakes: 1,
        boosted_streak_max: 3,
        grace_period: 5 * MS,
        max_retries: 1,
        eject_after_failures: 0,
        metrics_stale_after: 50 * MS,
        timer_resolution: 1 << 20,
        prefix: warmpath::scheduler::PrefixParams::DEFAULT,
        tenant_weights: Vec::new(),
    };
    let mut driver = Driver {
        s: Scheduler::new(params, 0),
        now: 0,
        next_id: 0,
        running: std::collections::VecDeque::with_capacity(4096),
        out: Vec::with_capacity(4096),
    };
    for round in 0..2_000 {
        driver.round(round);
    }
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for round in 2_000..12_000 {
        driver.round(round);
    }
    let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
    let stats = driver.s.stats().clone();
    assert!(stats.timeouts > 0 && stats.grace_hits > 0 && stats.retries > 0, "{stats:?}");
    assert!(stats.cancelled > 0 && stats.forced > 0, "{stats:?}");
    assert_eq!(allocations, 0, "allocations in 10,000 rounds after warm-up; stats {stats:?}");
}
