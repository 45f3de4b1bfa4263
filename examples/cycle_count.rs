//! A fixed number of scheduler cycles, for counting instructions per cycle exactly
//! (`perf/cycle_count.sh`): the cycle of `benches/scheduler.rs` (arrive + admit + complete
//! at a steady queue depth; half the arrivals follow-ups of tracked sessions; a 30 s queue
//! deadline; 4 backends of 64 slots; 4,096 tracked sessions), without criterion, whose
//! iteration count depends on the machine's speed while the cost of a cycle drifts as the
//! state evolves. Two runs under callgrind, with `CYCLES=0` and `CYCLES=N`, give the cost of
//! N cycles as the difference of their totals.
//!
//! DEPTH=1000 TENANTS=100 CYCLES=200000 cargo run --release --example cycle_count

use std::collections::VecDeque;
use std::hint::black_box;

use warmpath::scheduler::{
    Arrival, Budget, Input, Output, Params, RequestId, Routing, Scheduler, Usage,
};
use warmpath::splitmix::SplitMix64;

const SESSIONS: u64 = 4096;
const BACKENDS: u16 = 4;
const SLOTS: u32 = 64;
const SECOND: u64 = 1_000_000_000;

fn params(max_queued: u32, tenants: u16) -> Params {
    let _ = tenants;
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
        tenant_weights: (0..tenants).map(|t| 1 + t % 4).collect(), // TENANTS
    }
}

struct Steady {
    s: Scheduler,
    now: u64,
    next_id: u64,
    running: VecDeque<u64>,
    out: Vec<Output>,
    rng: SplitMix64,
    tenants: u16,
}

impl Steady {
    fn new(depth: u32, tenants: u16) -> Steady {
        let total = depth + SLOTS * u32::from(BACKENDS);
        let mut steady = Steady {
            s: Scheduler::new(params(depth.max(1), tenants), 0),
            now: 0,
            next_id: 0,
            running: VecDeque::with_capacity(total as usize + 8),
            out: Vec::with_capacity(64),
            rng: SplitMix64::new(7),
            tenants,
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

    fn arrive(&mut self, session: Option<u64>) {
        self.now += 1_000;
        self.next_id += 1;
        let tenant = match self.tenants {
            0 => 0,
            n => 1 + (self.next_id % u64::from(n)) as u16,
        };
        let _ = tenant;
        let arrival = Arrival {
            id: RequestId(self.next_id),
            session,
            prompt_bytes: 2000,
            streaming: true,
            prompt: warmpath::ring::prompt_pool::NO_PROMPT,
            tenant, // TENANTS
        };
        self.out.clear();
        self.s.handle(self.now, Input::Arrive(arrival), &mut self.out);
        self.collect();
    }

    fn collect(&mut self) {
        for output in &self.out {
            if let Output::Admit { id, .. } = output {
                self.running.push_back(id.0);
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

fn main() {
    let var = |name: &str, default: u64| {
        std::env::var(name).map_or(default, |v| v.parse().unwrap_or_else(|_| panic!("{name}")))
    };
    let depth = var("DEPTH", 1000) as u32;
    let tenants = var("TENANTS", 0) as u16;
    let mut steady = Steady::new(depth, tenants);
    for _ in 0..var("CYCLES", 100_000) {
        steady.cycle();
    }
    black_box(steady.s.queued());
}
