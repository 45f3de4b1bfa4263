//! Deterministic simulation of one model's scheduler (TigerBeetle's VOPR in miniature): many
//! multi-turn sessions of clients and a few simulated backends driven on a simulated clock for
//! thousands of events, with faults: retryable failures before the first byte, errors after it,
//! clients vanishing while queued or mid-stream, backends going unhealthy and reporting waiting
//! queues. It checks S14: every request ends exactly one way, and when traffic stops every queue
//! and inflight count returns to zero. A failure names its seed; rerun one seed with
//! `WARMPATH_SIM_SEED=<seed> cargo test --test simulation`.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};

use warmpath::scheduler::{
    Arrival, Budget, Input, Lane, Output, Params, RejectReason, RequestId, Routing, Scheduler,
    Snapshot, Usage,
};
use warmpath::splitmix::SplitMix64;

const MS: u64 = 1_000_000;

/// The seeded choices of a run.
struct Rng(SplitMix64);

impl Rng {
    fn below(&mut self, bound: u64) -> u64 {
        self.0.next_u64() % bound
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A session (or, for `u64::MAX`, a sessionless client) sends its next request.
    Send(u64),
    /// The attempt of a request gets its first byte.
    FirstByte(u64, u32),
    /// The attempt ends: 0 success, 1 error after bytes, 2 retryable failure before any byte.
    Finish(u64, u32, u8),
    /// The client of a request goes away.
    Vanish(u64),
    /// The control thread reports on a backend.
    Report(u16),
    /// A timer wake-up.
    Wake,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    Queued,
    /// Admitted, with its attempt number.
    Admitted(u32),
    Done,
}

#[derive(Debug)]
struct Request {
    session: Option<u64>,
    state: State,
    attempts: u32,
    outcomes: u32,
}

struct Sim {
    rng: Rng,
    s: Scheduler,
    now: u64,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    seq: u64,
    requests: BTreeMap<u64, Request>,
    next_id: u64,
    traffic_until: u64,
    /// The one pending `Wake` event's time (`u64::MAX`: none).
    wake_at: u64,
    out: Vec<Output>,
}

fn params(rng: &mut Rng) -> Params {
    Params {
        boost: rng.chance(80),
        routing: [Routing::SessionAffinity, Routing::LeastInflight, Routing::RoundRobin]
            [rng.below(3) as usize],
        backends: 1 + rng.below(3) as u16,
        queue_timeout: Some((500 + rng.below(3000)) * MS),
        max_queued: 16 + rng.below(64) as u32,
        inflight_per_backend: 1 + rng.below(4) as u32,
        inflight_learned: rng.below(2) == 0,
        prefill_tokens_per_backend: match rng.below(4) {
            0 => Budget::Auto,
            n => Budget::Tokens([0, 2_000, 20_000][n as usize - 1]),
        },
        max_sessions: 4 + rng.below(40) as u32,
        max_overtakes: rng.below(6) as u32,
        boosted_streak_max: rng.below(4) as u32,
        grace_period: [0, 30 * MS][rng.below(2) as usize],
        max_retries: rng.below(3) as u32,
        eject_after_failures: rng.below(4) as u32,
        metrics_stale_after: 400 * MS,
        timer_resolution: MS,
        prefix: warmpath::scheduler::PrefixParams::DEFAULT,
        tenant_weights: Vec::new(),
    }
}

impl Sim {
    fn new(seed: u64) -> Sim {
        let mut rng = Rng(SplitMix64::new(seed));
        let params = params(&mut rng);
        let mut sim = Sim {
            s: Scheduler::new(params, 0),
            rng,
            now: 0,
            events: BinaryHeap::new(),
            seq: 0,
            requests: BTreeMap::new(),
            next_id: 0,
            traffic_until: 30_000 * MS,
            wake_at: u64::MAX,
            out: Vec::new(),
        };
        for session in 0..60 {
            let start = sim.rng.below(2_000) * MS;
            sim.at(start, Event::Send(session));
        }
        for _ in 0..400 {
            let start = sim.rng.below(sim.traffic_until);
            sim.at(start, Event::Send(u64::MAX));
        }
        for backend in 0..sim.s.params().backends {
            sim.at(100 * MS, Event::Report(backend));
        }
        sim
    }

    fn at(&mut self, time: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((time, self.seq, event)));
    }

    fn after(&mut self, delay: u64, event: Event) {
        self.at(self.now + delay, event);
    }

    fn input(&mut self, input: Input) {
        self.out.clear();
        self.s.handle(self.now, input, &mut self.out);
        self.s.check_invariants();
        let outputs = std::mem::take(&mut self.out);
        for output in &outputs {
            self.apply(*output);
        }
        self.out = outputs;
        if let Some(wake) = self.s.next_wakeup() {
            assert!(wake > self.now, "a due timer was left unfired");
            if wake < self.wake_at {
                self.wake_at = wake;
                self.at(wake, Event::Wake);
            }
        }
    }

    fn apply(&mut self, output: Output) {
        match output {
            Output::Admit { id, lane, .. } => {
                let request = self.requests.get_mut(&id.0).expect("admitted a known request");
                assert_ne!(request.state, State::Done, "admitted a finished request {}", id.0);
                assert!(lane != Lane::Retry || request.attempts > 0);
                request.attempts += 1;
                let attempt = request.attempts;
                request.state = State::Admitted(attempt);
                let ttfb = self.rng.below(200) * MS;
                let length = self.rng.below(800) * MS;
                let kind = match self.rng.below(100) {
                    0..=79 => 0,
                    80..=89 => 1,
                    _ => 2,
                };
                if kind != 2 {
                    self.after(ttfb, Event::FirstByte(id.0, attempt));
                }
                self.after(ttfb + length, Event::Finish(id.0, attempt, kind));
                if self.rng.chance(3) {
                    let delay = self.rng.below(1_000) * MS;
                    self.after(delay, Event::Vanish(id.0));
                }
            }
            Output::Reject { id, reason } => {
                assert!(reason != RejectReason::ShuttingDown, "no shutdown in this simulation");
                self.finish(id.0);
            }
        }
    }

    /// Records the one outcome of request `id`; a session then thinks and sends its next turn.
    fn finish(&mut self, id: u64) {
        let request = self.requests.get_mut(&id).expect("known request");
        request.state = State::Done;
        request.outcomes += 1;
        if let Some(session) = request.session {
            let think = self.rng.below(1_500) * MS;
            self.after(think, Event::Send(session));
        }
    }

    fn send(&mut self, session: u64) {
        if self.now >= self.traffic_until {
            return;
        }
        self.next_id += 1;
        let id = self.next_id;
        let session = (session != u64::MAX).then_some(session);
        let request = Request { session, state: State::Queued, attempts: 0, outcomes: 0 };
        self.requests.insert(id, request);
        if self.rng.chance(5) {
            let delay = self.rng.below(3_000) * MS;
            self.after(delay, Event::Vanish(id));
        }
        let tokens = self.rng.below(4_000) as u32;
        let streaming = self.rng.chance(70);
        let arrival = Arrival {
            id: RequestId(id),
            session,
            prompt_bytes: tokens * 4,
            streaming,
            prompt: warmpath::ring::prompt_pool::NO_PROMPT,
            tenant: 0,
        };
        self.input(Input::Arrive(arrival));
    }

    fn state(&self, id: u64) -> State {
        self.requests[&id].state
    }

    fn step(&mut self, event: Event) {
        match event {
            Event::Send(session) => self.send(session),
            Event::FirstByte(id, attempt) if self.state(id) == State::Admitted(attempt) => {
                self.input(Input::FirstByte(RequestId(id)));
            }
            Event::Finish(id, attempt, kind) if self.state(id) == State::Admitted(attempt) => {
                if kind == 2 {
                    self.requests.get_mut(&id).expect("known").state = State::Queued;
                    self.input(Input::Retry(RequestId(id)));
                } else {
                    let usage =
                        Usage { prompt_tokens: 100, cached_tokens: 30, completion_tokens: 40 };
                    self.input(Input::Complete { id: RequestId(id), success: kind == 0, usage });
                    self.finish(id);
                }
            }
            Event::Vanish(id) if self.state(id) != State::Done => {
                self.input(Input::Cancel(RequestId(id)));
                let request = self.requests.get_mut(&id).expect("known");
                request.state = State::Done;
                request.outcomes += 1;
            }
            Event::Report(backend) => self.report(backend),
            Event::Wake if self.now == self.wake_at => {
                self.wake_at = u64::MAX;
                self.input(Input::Tick);
            }
            _ => {}
        }
    }

    fn report(&mut self, backend: u16) {
        let traffic = self.now < self.traffic_until;
        let healthy = !traffic || self.rng.chance(90);
        let waiting = if traffic && self.rng.chance(20) { Some(2) } else { Some(0) };
        let waiting = if self.rng.chance(10) { None } else { waiting };
        let snapshot = Snapshot::new(healthy, waiting, self.now);
        self.input(Input::Snapshot { backend, snapshot });
        if traffic {
            let delay = 100 * MS + self.rng.below(400) * MS;
            self.after(delay, Event::Report(backend));
        }
    }

    fn run(&mut self) {
        let mut steps = 0u64;
        while let Some(Reverse((time, _, event))) = self.events.pop() {
            self.now = self.now.max(time);
            self.step(event);
            steps += 1;
            assert!(steps < 2_000_000, "simulation did not settle");
        }
        assert!(steps > 1_000, "too few steps ({steps}) to mean anything");
    }

    fn check_settled(&self) {
        assert_eq!(self.s.queued(), 0, "queue not empty after traffic stopped");
        assert_eq!(self.s.inflight(), 0, "inflight not zero after traffic stopped");
        for backend in 0..self.s.params().backends {
            assert_eq!(self.s.backend_inflight(backend), 0);
            assert_eq!(self.s.backend_prefill_tokens(backend), 0);
        }
        for (id, request) in &self.requests {
            assert_eq!(request.outcomes, 1, "request {id} ended {} times", request.outcomes);
            assert_eq!(request.state, State::Done);
        }
        let stats = self.s.stats();
        let admitted: u64 = stats.admitted.iter().sum();
        assert!(admitted > 0, "nothing admitted");
    }
}

fn run_seed(seed: u64) {
    let result = std::panic::catch_unwind(|| {
        let mut sim = Sim::new(seed);
        sim.run();
        sim.check_settled();
        sim.requests.len()
    });
    match result {
        Ok(requests) => assert!(requests > 100, "seed {seed}: only {requests} requests"),
        Err(panic) => {
            eprintln!("simulation failed with seed {seed}: rerun with WARMPATH_SIM_SEED={seed}");
            std::panic::resume_unwind(panic);
        }
    }
}

#[test]
fn every_request_ends_exactly_once_and_everything_returns_to_zero() {
    if let Ok(seed) = std::env::var("WARMPATH_SIM_SEED") {
        return run_seed(seed.parse().expect("WARMPATH_SIM_SEED is a number"));
    }
    for seed in 0..48 {
        run_seed(seed);
    }
}
