//! A fleet in virtual time: a bench workload replayed through a router's decisions onto
//! simulated engines, in one thread, with no sockets and no clock.
//!
//! The pieces are the real ones: the router is warmpath's sans-IO [`Scheduler`] (fed the same
//! inputs the shards and the control thread give it), the engines are `warmpath sim`'s
//! [`Engine`] cores, the workload is `warmpath bench`'s. What the dataplane adds in between is
//! modelled by two latencies: the client's to the router and the router's to an engine, one
//! way each, in simulated time (with `warmpath sim --time-scale 8`, a millisecond of real
//! latency is 8 ms of simulated time). A control round every `scrape_ns` snapshots each
//! engine's waiting queue. So a run of the Mooncake trace that takes 2.5 minutes through real
//! processes takes seconds here and gives the same answer every time.
//!
//! It is how the admission controller and the placement rules were chosen across traces,
//! engine profiles and loads (`perf/RESULTS.md`), and how the tests check that the learned
//! estimates converge. It is a model: the real replays of `perf/` through `warmpath serve`
//! are what the results stand on.
//!
//! Besides warmpath it models two peers, as far as their documented policies go, so that a
//! design can be compared before the real runs: a router that sends every request at once to
//! the engine with the fewest requests in flight, and sglang-router's `cache_aware` policy
//! ([`peer`]).

pub mod peer;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

use crate::bench::{Message, Workload};
use crate::protocol::prompt::PromptHasher;
use crate::ring::prompt_pool::NO_PROMPT;
use crate::scheduler::estimate::BackendEstimates;
use crate::scheduler::{
    Arrival, EngineCache, Input, Output, Params, RequestId, Scheduler, Snapshot, Stats, Usage,
};
use crate::sim::engine::{Engine, EngineParams, Event as EngineEvent, SubmitError};
use crate::sim::tokens;

use peer::{CacheAware, Peer};

/// How requests are routed.
#[derive(Debug, Clone)]
pub enum Router {
    /// warmpath's scheduler with these parameters (`backends` is set from the engines).
    Warmpath(Params),
    /// Every request at once to the engine with the fewest requests in flight.
    LeastInflight,
    /// sglang-router's `cache_aware` policy with its defaults.
    CacheAware,
}

/// A fleet and how it is connected.
#[derive(Debug, Clone)]
pub struct FleetSpec {
    /// One engine per backend.
    pub engines: Vec<EngineParams>,
    pub router: Router,
    /// Client to router (and back), one way, simulated ns.
    pub client_ns: u64,
    /// Router to engine (and back), one way, simulated ns.
    pub net_ns: u64,
    /// The control thread's interval, simulated ns.
    pub scrape_ns: u64,
    /// The model name in request bodies.
    pub model: String,
    /// Whether snapshots carry the engines' waiting gauge (as vLLM's metrics do).
    pub report_waiting: bool,
    /// Print each backend's budget, backlog, decode weight and decode gap (µs), and each
    /// engine's KV usage, running and waiting requests, at every control round (stderr).
    pub trace_budget: bool,
    /// Issue \[11\]: the tenant of each session of the workload, by index (missing: 0, none);
    /// its requests carry it to the scheduler, whose `tenant_weights` must know it.
    pub session_tenants: Vec<u16>,
    /// The share of sessions, in percent, whose client asks for whole responses, as the OpenAI
    /// SDKs do by default (0: every request streams; 100: none does). Which sessions is fixed
    /// by a hash of their index, so every router of a comparison meets the same mix. A
    /// non-streaming request gives warmpath no first byte before its end, so it counts in no
    /// prefill backlog and teaches no rate (SPEC S6.3); its client sees nothing before the
    /// whole response ([`Outcome::seen`]).
    pub unstreamed_percent: u8,
}

impl FleetSpec {
    /// `engines` behind `router`, connected as the lab connects them: 1 ms client to router, 4 ms
    /// router to engine, a control round every 800 ms, waiting gauges reported, every request
    /// streaming, no tenants.
    pub fn lab(engines: Vec<EngineParams>, router: Router) -> FleetSpec {
        FleetSpec {
            engines,
            router,
            client_ns: 1_000_000,
            net_ns: 4_000_000,
            scrape_ns: 800_000_000,
            model: "sim-8b".into(),
            report_waiting: true,
            trace_budget: false,
            session_tenants: Vec::new(),
            unstreamed_percent: 0,
        }
    }

    /// Whether the client of session `index` asks for streamed responses.
    pub fn streams(&self, index: usize) -> bool {
        crate::bench::workload::session_streams(index, self.unstreamed_percent)
    }
}

/// What one request saw.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Outcome {
    /// Whether it waited for an earlier turn.
    pub follow_up: bool,
    /// Send to first token at the client, seconds; `None` when it failed.
    pub ttft: Option<f64>,
    /// Send to last token at the client, seconds.
    pub e2e: f64,
    /// Whether its client asked for a streamed response.
    pub streamed: bool,
    /// Prompt tokens, and of them found cached by the engine.
    pub prompt_tokens: u32,
    pub cached_tokens: u32,
    /// The engine that served it.
    pub backend: u16,
    /// Its session's tenant (issue \[11\]).
    pub tenant: u16,
    /// When it was sent, simulated seconds.
    pub sent: f64,
    /// Send to admission (to the peer's routing decision), seconds: the router's queue wait.
    pub queued: f64,
}

impl Outcome {
    /// What its client waited for, seconds: the first token of a streamed response, the whole
    /// of any other (a non-streaming client has nothing before the end); `None` when it failed.
    pub fn seen(&self) -> Option<f64> {
        self.ttft.map(|ttft| if self.streamed { ttft } else { self.e2e })
    }
}

/// The result of a run.
#[derive(Debug, Clone)]
pub struct FleetReport {
    pub outcomes: Vec<Outcome>,
    /// Simulated seconds from the first send to the last answer.
    pub elapsed: f64,
    /// Per engine: prefix-cache queries and hits (tokens), busy ns, preemptions, prefill tokens
    /// computed.
    pub engines: Vec<(u64, u64, u64, u64, u64)>,
    /// The scheduler's counters (warmpath only).
    pub stats: Option<Stats>,
    /// What it learned of each backend, at the end (warmpath only).
    pub estimates: Vec<BackendEstimates>,
    /// Its learned tokens per byte, millionths.
    pub tokens_per_byte: Option<u64>,
}

impl FleetReport {
    /// Prompt tokens found cached over prompt tokens looked up, all engines.
    pub fn hit_rate(&self) -> f64 {
        let (q, h) = self.engines.iter().fold((0, 0), |(q, h), e| (q + e.0, h + e.1));
        if q == 0 {
            0.0
        } else {
            h as f64 / q as f64
        }
    }

    /// Nearest-rank percentile `p` (0..=100) of TTFT for follow-ups (`Some(true)`), first
    /// turns (`Some(false)`) or all requests, in seconds.
    pub fn ttft(&self, follow_up: Option<bool>, p: f64) -> f64 {
        self.ttft_of(None, follow_up, p)
    }

    /// [`FleetReport::ttft`] of the requests of `tenant` (`None`: all tenants).
    pub fn ttft_of(&self, tenant: Option<u16>, follow_up: Option<bool>, p: f64) -> f64 {
        let mut v: Vec<f64> = self
            .outcomes
            .iter()
            .filter(|o| tenant.is_none_or(|t| o.tenant == t))
            .filter(|o| follow_up.is_none_or(|f| o.follow_up == f))
            .filter_map(|o| o.ttft)
            .collect();
        percentile(&mut v, p)
    }

    /// Nearest-rank percentile `p` of [`Outcome::seen`], seconds, of the requests of streaming
    /// clients (`streamed` `Some(true)`), of the others (`Some(false)`) or of all, and of
    /// follow-ups, first turns or both (`follow_up` as in [`FleetReport::ttft`]).
    pub fn seen(&self, streamed: Option<bool>, follow_up: Option<bool>, p: f64) -> f64 {
        let mut v: Vec<f64> = (self.outcomes.iter())
            .filter(|o| streamed.is_none_or(|s| o.streamed == s))
            .filter(|o| follow_up.is_none_or(|f| o.follow_up == f))
            .filter_map(Outcome::seen)
            .collect();
        percentile(&mut v, p)
    }

    /// The `p`th percentile of [`Outcome::queued`] of the answered requests of `tenant` (`None`:
    /// all tenants).
    pub fn queued_of(&self, tenant: Option<u16>, p: f64) -> f64 {
        let mut v: Vec<f64> = (self.outcomes.iter())
            .filter(|o| o.ttft.is_some() && tenant.is_none_or(|t| o.tenant == t))
            .map(|o| o.queued)
            .collect();
        percentile(&mut v, p)
    }

    /// Requests that failed.
    pub fn errors(&self) -> usize {
        self.outcomes.iter().filter(|o| o.ttft.is_none()).count()
    }
}

/// Nearest-rank percentile of `v` (sorted here); 0 when empty.
pub fn percentile(v: &mut [f64], p: f64) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
    v[rank.clamp(1, v.len()) - 1]
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// A turn is due to be sent (its offset passed; its predecessor may still run).
    Due(u32),
    /// A request reaches the router.
    Arrive(u32),
    /// A request reaches its engine.
    Submit(u32),
    /// An engine's step ends.
    StepEnd(u16),
    /// The first response byte of a request reaches the router.
    FirstByte(u32),
    /// A response ends at the router.
    Done(u32),
    /// A control round.
    Scrape,
    /// The scheduler's timer.
    Wake,
}

#[derive(Debug)]
struct Req {
    session: u32,
    turn: u32,
    follow_up: bool,
    /// Whether its client asked for a streamed response.
    streamed: bool,
    sent: u64,
    first: Option<u64>,
    backend: u16,
    prompt_tokens: u32,
    cached_tokens: u32,
    failed: bool,
    /// Bound to a backend (by the scheduler or the peer), and when.
    admitted: bool,
    admitted_at: u64,
    /// What the response's `usage` says (the engine's count).
    usage: Usage,
    /// Engine time of its first token, and the mean time between its tokens after it.
    first_token_at: u64,
    gap: u64,
    ended: bool,
}

/// Runs `workload` on the fleet `spec` until every request has ended.
pub fn run(workload: &Workload, spec: &FleetSpec) -> FleetReport {
    Fleet::new(workload, spec).run()
}

struct Fleet<'a> {
    workload: &'a Workload,
    spec: &'a FleetSpec,
    now: u64,
    seq: u64,
    events: BinaryHeap<Reverse<(u64, u64, Event)>>,
    engines: Vec<Engine>,
    stepping: Vec<bool>,
    reqs: Vec<Req>,
    /// Request index by (session, turn).
    by_turn: HashMap<(u32, u32), u32>,
    /// Per session and turn: when it finished at the client (for the turns waiting on it).
    finished: Vec<Vec<Option<u64>>>,
    /// Turns waiting for their predecessor: (session, predecessor) -> turns.
    waiting_on: HashMap<(u32, u32), Vec<u32>>,
    scheduler: Option<Scheduler>,
    wake_at: u64,
    peer: Option<Box<dyn Peer>>,
    hasher: PromptHasher,
    body: Vec<u8>,
    out: Vec<Output>,
    step_events: Vec<EngineEvent>,
    live: usize,
}

/// The session header's hash, as the shards compute it (SipHash with fixed keys).
fn hash_session(id: &str) -> u64 {
    let mut hasher =
        std::hash::BuildHasherDefault::<std::collections::hash_map::DefaultHasher>::default()
            .build_hasher();
    hasher.write(id.as_bytes());
    hasher.finish()
}

impl<'a> Fleet<'a> {
    fn new(workload: &'a Workload, spec: &'a FleetSpec) -> Fleet<'a> {
        let engines: Vec<Engine> =
            spec.engines.iter().enumerate().map(|(i, p)| Engine::new(*p, i as u64 + 1)).collect();
        let backends = engines.len() as u16;
        let (scheduler, peer): (Option<Scheduler>, Option<Box<dyn Peer>>) = match &spec.router {
            Router::Warmpath(params) => {
                let mut params = params.clone();
                params.backends = backends;
                (Some(Scheduler::new(params, 0)), None)
            }
            Router::LeastInflight => (None, Some(Box::new(peer::LeastInflight::new(backends)))),
            Router::CacheAware => (None, Some(Box::new(CacheAware::new(backends)))),
        };
        let block = match &spec.router {
            Router::Warmpath(p) => p.prefix.block_bytes as usize,
            _ => 256,
        };
        let mut fleet = Fleet {
            workload,
            spec,
            now: 0,
            seq: 0,
            events: BinaryHeap::new(),
            stepping: vec![false; engines.len()],
            engines,
            reqs: Vec::with_capacity(workload.requests()),
            by_turn: HashMap::new(),
            finished: workload.sessions.iter().map(|s| vec![None; s.turns.len()]).collect(),
            waiting_on: HashMap::new(),
            scheduler,
            wake_at: u64::MAX,
            peer,
            hasher: PromptHasher::new(block),
            body: Vec::with_capacity(1 << 20),
            out: Vec::new(),
            step_events: Vec::new(),
            live: 0,
        };
        for (s, session) in workload.sessions.iter().enumerate() {
            for (t, turn) in session.turns.iter().enumerate() {
                let at = turn.at.as_nanos() as u64;
                let index = fleet.reqs.len() as u32;
                fleet.reqs.push(Req {
                    session: s as u32,
                    turn: t as u32,
                    follow_up: turn.after.is_some(),
                    streamed: spec.streams(s),
                    sent: 0,
                    first: None,
                    backend: 0,
                    prompt_tokens: 0,
                    cached_tokens: 0,
                    failed: false,
                    admitted: false,
                    admitted_at: 0,
                    usage: Usage::NONE,
                    first_token_at: 0,
                    gap: 0,
                    ended: false,
                });
                fleet.by_turn.insert((s as u32, t as u32), index);
                fleet.push(at, Event::Due(index));
            }
        }
        fleet.live = fleet.reqs.len();
        fleet.push(0, Event::Scrape);
        fleet
    }

    fn push(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.events.push(Reverse((at, self.seq, event)));
    }

    fn run(mut self) -> FleetReport {
        let mut first_send = None;
        while let Some(Reverse((at, _, event))) = self.events.pop() {
            debug_assert!(at >= self.now);
            self.now = at;
            match event {
                Event::Due(r) => {
                    self.due(r);
                    first_send.get_or_insert(self.now);
                }
                Event::Arrive(r) => self.arrive(r),
                Event::Submit(r) => self.submit(r),
                Event::StepEnd(e) => self.step_end(e),
                Event::FirstByte(r) => {
                    let id = RequestId(u64::from(r));
                    self.reqs[r as usize].first.get_or_insert(self.now);
                    if self.scheduler.is_some() {
                        self.schedule(Input::FirstByte(id));
                    }
                }
                Event::Done(r) => self.done(r),
                Event::Scrape => self.scrape(),
                Event::Wake => {
                    if self.wake_at == self.now {
                        self.wake_at = u64::MAX;
                        self.schedule(Input::Tick);
                    }
                }
            }
            if self.live == 0 {
                break;
            }
        }
        self.report(first_send.unwrap_or(0))
    }

    /// Request `r`'s trace time has come: it is sent now, or after its predecessor's end and
    /// think time.
    fn due(&mut self, r: u32) {
        let (s, t) = (self.reqs[r as usize].session, self.reqs[r as usize].turn);
        let turn = &self.workload.sessions[s as usize].turns[t as usize];
        match turn.after {
            Some(p) => match self.finished[s as usize][p as usize] {
                Some(done) => {
                    let at = (done + turn.think.as_nanos() as u64).max(self.now);
                    self.send_at(r, at);
                }
                None => self.waiting_on.entry((s, p)).or_default().push(t),
            },
            None => self.send_at(r, self.now),
        }
    }

    /// What the run did, from the first send (`start`) to now.
    fn report(&self, start: u64) -> FleetReport {
        let outcomes = self
            .reqs
            .iter()
            .map(|r| Outcome {
                follow_up: r.follow_up,
                ttft: r.first.filter(|_| !r.failed).map(|f| secs(f + self.spec.client_ns - r.sent)),
                e2e: secs(
                    self.finished[r.session as usize][r.turn as usize]
                        .unwrap_or(self.now)
                        .saturating_sub(r.sent),
                ),
                streamed: r.streamed,
                prompt_tokens: r.prompt_tokens,
                cached_tokens: r.cached_tokens,
                backend: r.backend,
                tenant: self.spec.session_tenants.get(r.session as usize).copied().unwrap_or(0),
                queued: secs(r.admitted_at.saturating_sub(r.sent)),
                sent: secs(r.sent),
            })
            .collect();
        FleetReport {
            outcomes,
            elapsed: secs(self.now - start),
            engines: self
                .engines
                .iter()
                .map(|e| {
                    let s = e.stats();
                    (s.prefix_queries, s.prefix_hits, s.busy_ns, s.preemptions, s.prefill_tokens)
                })
                .collect(),
            stats: self.scheduler.as_ref().map(|s| s.stats().clone()),
            estimates: self.scheduler.as_ref().map_or_else(Vec::new, |s| {
                (0..self.engines.len() as u16).map(|b| s.backend_estimates(b)).collect()
            }),
            tokens_per_byte: self.scheduler.as_ref().map(|s| s.token_rate().per_byte_micro()),
        }
    }

    /// The client sends request `r` at `at`.
    fn send_at(&mut self, r: u32, at: u64) {
        self.reqs[r as usize].sent = at;
        self.push(at + self.spec.client_ns, Event::Arrive(r));
    }

    fn messages(&self, r: u32) -> Vec<Message> {
        let req = &self.reqs[r as usize];
        self.workload.messages(req.session as usize, req.turn as usize)
    }

    fn arrive(&mut self, r: u32) {
        let req = &self.reqs[r as usize];
        let (s, t) = (req.session as usize, req.turn as usize);
        self.body.clear();
        self.workload.write_body(s, t, &self.spec.model, (false, true), &mut self.body);
        if self.scheduler.is_none() {
            let messages = self.messages(r);
            let backend = self.peer.as_mut().expect("a peer").route(&messages);
            self.reqs[r as usize].backend = backend;
            self.reqs[r as usize].admitted = true;
            self.reqs[r as usize].admitted_at = self.now;
            self.push(self.now + self.spec.net_ns, Event::Submit(r));
            return;
        }
        let scheduler = self.scheduler.as_mut().expect("warmpath");
        let prompt = match scheduler.prompt_pool() {
            Some(pool) => match pool.acquire() {
                Some(slot) => {
                    let hasher = &mut self.hasher;
                    let body = &self.body;
                    pool.with_ends(slot, |hashes, ends| {
                        hasher.hash_body(body, hashes);
                        *ends = hasher.ends();
                    });
                    slot
                }
                None => NO_PROMPT,
            },
            None => NO_PROMPT,
        };
        let session_id = &self.workload.sessions[s].id;
        let arrival = Arrival {
            id: RequestId(u64::from(r)),
            session: Some(hash_session(session_id)),
            prompt_bytes: u32::try_from(self.body.len()).unwrap_or(u32::MAX),
            streaming: self.reqs[r as usize].streamed,
            prompt,
            tenant: self.spec.session_tenants.get(s).copied().unwrap_or(0),
        };
        self.schedule(Input::Arrive(arrival));
    }

    /// Hands `input` to the scheduler at `now` and acts on its decisions.
    fn schedule(&mut self, input: Input) {
        let scheduler = self.scheduler.as_mut().expect("warmpath");
        self.out.clear();
        scheduler.handle(self.now, input, &mut self.out);
        let out = std::mem::take(&mut self.out);
        for decision in &out {
            match *decision {
                Output::Admit { id, backend, .. } => {
                    let r = id.0 as u32;
                    self.reqs[r as usize].backend = backend;
                    self.reqs[r as usize].admitted = true;
                    self.reqs[r as usize].admitted_at = self.now;
                    self.push(self.now + self.spec.net_ns, Event::Submit(r));
                }
                Output::Reject { id, .. } => {
                    let r = id.0 as u32;
                    self.reqs[r as usize].failed = true;
                    self.push(self.now + self.spec.client_ns, Event::Done(r));
                    self.reqs[r as usize].first = Some(self.now);
                }
            }
        }
        self.out = out;
        if let Some(at) = self.scheduler.as_ref().and_then(Scheduler::next_wakeup) {
            if at < self.wake_at {
                self.wake_at = at.max(self.now);
                self.push(self.wake_at, Event::Wake);
            }
        }
    }

    fn submit(&mut self, r: u32) {
        let e = self.reqs[r as usize].backend;
        let messages = self.messages(r);
        let mut prompt = Vec::new();
        for m in &messages {
            tokens::tokenize_message(m.role, &m.content, &mut prompt);
        }
        tokens::generation_prompt(&mut prompt);
        let req = &mut self.reqs[r as usize];
        req.prompt_tokens = prompt.len() as u32;
        let turn = &self.workload.sessions[req.session as usize].turns[req.turn as usize];
        let engine = &mut self.engines[usize::from(e)];
        match engine.submit(u64::from(r), prompt, turn.max_tokens, self.now) {
            Ok(()) => self.kick(e),
            Err(SubmitError::TooLong { .. } | SubmitError::EmptyPrompt | SubmitError::NoOutput) => {
                // A 400 from the engine: relayed at once (a first byte, then the end).
                self.reqs[r as usize].failed = true;
                self.push(self.now + self.spec.net_ns, Event::FirstByte(r));
                self.push(self.now + self.spec.net_ns, Event::Done(r));
            }
            Err(SubmitError::DuplicateId) => unreachable!("request ids are unique"),
        }
    }

    /// Starts a step on engine `e` if it is idle and has work.
    fn kick(&mut self, e: u16) {
        if self.stepping[usize::from(e)] {
            return;
        }
        if let Some(plan) = self.engines[usize::from(e)].start_step(self.now) {
            self.stepping[usize::from(e)] = true;
            self.push(self.now + plan.duration_ns, Event::StepEnd(e));
        }
    }

    fn step_end(&mut self, e: u16) {
        self.stepping[usize::from(e)] = false;
        let mut events = std::mem::take(&mut self.step_events);
        events.clear();
        self.engines[usize::from(e)].finish_step(self.now, &mut events);
        for event in &events {
            match *event {
                EngineEvent::Token { id, index: 0, .. } => {
                    self.reqs[id as usize].first_token_at = self.now;
                    self.push(self.now + self.spec.net_ns, Event::FirstByte(id as u32));
                }
                EngineEvent::Token { .. } => {}
                EngineEvent::Finished { id, usage } => {
                    let req = &mut self.reqs[id as usize];
                    req.cached_tokens = usage.cached_tokens;
                    if usage.completion_tokens > 1 {
                        let span = self.now - req.first_token_at;
                        req.gap = span / u64::from(usage.completion_tokens - 1);
                    }
                    req.usage = Usage {
                        prompt_tokens: usage.prompt_tokens,
                        cached_tokens: usage.cached_tokens,
                        completion_tokens: usage.completion_tokens,
                    };
                    self.push(self.now + self.spec.net_ns, Event::Done(id as u32));
                }
            }
        }
        self.step_events = events;
        self.kick(e);
    }

    /// A response ended at the router: the scheduler learns it, the client a little later.
    fn done(&mut self, r: u32) {
        let req = &mut self.reqs[r as usize];
        if req.ended {
            return;
        }
        req.ended = true;
        let (failed, backend, admitted) = (req.failed, req.backend, req.admitted);
        if let Some(peer) = self.peer.as_mut() {
            peer.finished(backend);
        } else if admitted && self.scheduler.is_some() {
            let id = RequestId(u64::from(r));
            let usage = self.reqs[r as usize].usage;
            self.schedule(Input::Complete { id, success: !failed, usage });
        }
        let (s, t) = (self.reqs[r as usize].session, self.reqs[r as usize].turn);
        let at = self.now + self.spec.client_ns;
        self.finished[s as usize][t as usize] = Some(at);
        if let Some(next) = self.waiting_on.remove(&(s, t)) {
            for turn in next {
                let index = self.by_turn[&(s, turn)];
                let think = self.workload.sessions[s as usize].turns[turn as usize].think;
                let due = self.workload.sessions[s as usize].turns[turn as usize].at;
                let send = (at + think.as_nanos() as u64).max(due.as_nanos() as u64);
                self.send_at(index, send);
            }
        }
        self.live -= 1;
    }

    fn scrape(&mut self) {
        if let (Some(s), true) = (&self.scheduler, self.spec.trace_budget) {
            let estimates: Vec<String> = (0..self.engines.len() as u16)
                .map(|b| {
                    let e = s.backend_estimates(b);
                    let gap = e.decode_gap / crate::scheduler::decode::GAP_SCALE;
                    format!(
                        "{}:{}:{}:{}us",
                        e.budget,
                        s.backend_prefill_tokens(b),
                        e.decode_weight,
                        gap / 1000
                    )
                })
                .collect();
            // Each engine's KV usage, running and waiting requests.
            let engines: Vec<String> = self
                .engines
                .iter()
                .map(|e| format!("{:.2}/{}/{}", e.kv_usage(), e.running(), e.waiting()))
                .collect();
            eprintln!(
                "t {:.1} queued {} {} kv {}",
                secs(self.now),
                s.queued(),
                estimates.join(" "),
                engines.join(" ")
            );
        }
        if self.scheduler.is_some() {
            for e in 0..self.engines.len() {
                let engine = &self.engines[e];
                let waiting = self.spec.report_waiting.then(|| engine.waiting() as u32);
                let mut snapshot = Snapshot::new(true, waiting, self.now);
                if self.spec.report_waiting {
                    let p = engine.params();
                    snapshot.cache = EngineCache {
                        kv_capacity_tokens: p.kv_blocks * p.block_size,
                        prefix_queries: engine.stats().prefix_queries,
                        prefix_hits: engine.stats().prefix_hits,
                        preemptions: engine.stats().preemptions,
                        kv_usage_micro: (engine.kv_usage().min(1.0) * 1e6).round() as u32,
                        // Ticks are simulated nanoseconds.
                        itl_ticks: (engine.stats().itl.sum() * 1e9).round() as u64,
                        itl_count: engine.stats().itl.count(),
                    };
                }
                self.schedule(Input::Snapshot { backend: e as u16, snapshot });
            }
        }
        if self.live > 0 {
            self.push(self.now + self.spec.scrape_ns, Event::Scrape);
        }
    }
}

fn secs(ns: u64) -> f64 {
    ns as f64 / 1e9
}

/// Nanoseconds of a duration, for specs.
pub fn ns(d: Duration) -> u64 {
    d.as_nanos() as u64
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::bench::synthetic::MultiTurn;

    /// Two-turn sessions arriving at `rate` a second for `seconds`, answers of `answer_tokens`,
    /// and the lab's connection to two H100 engines behind a least-inflight balancer.
    fn two_turn_sessions(rate: f64, seconds: u64, answer_tokens: u32) -> (Workload, FleetSpec) {
        let workload = MultiTurn {
            rate,
            duration: Duration::from_secs(seconds),
            turns: 2,
            answer_tokens,
            think_mean: Duration::from_secs(1),
            ..MultiTurn::default()
        }
        .workload();
        let engine = crate::sim::profile("h100-8b").expect("a named profile");
        (workload, FleetSpec::lab(vec![engine; 2], Router::LeastInflight))
    }

    /// An outcome's `e2e` is its own send to last token, not the send to the end of the run
    /// (what it was until the thirteenth session; nothing read it then).
    #[test]
    fn e2e_is_each_requests_send_to_its_last_token() {
        let (workload, lab) = two_turn_sessions(2.0, 10, 20);
        let spec = FleetSpec { unstreamed_percent: 100, ..lab };
        let report = run(&workload, &spec);
        assert!(report.outcomes.len() > 10);
        for o in &report.outcomes {
            let ttft = o.ttft.expect("no failures");
            assert!(o.e2e >= ttft, "e2e {} before the first token {ttft}", o.e2e);
        }
        // Requests sent at different times end at different times, not all at the run's end.
        let ends: Vec<f64> = report.outcomes.iter().map(|o| o.sent + o.e2e).collect();
        let last = ends.iter().copied().fold(0.0, f64::max);
        assert!(ends.iter().filter(|&&end| end < last - 1.0).count() > report.outcomes.len() / 2);
    }

    /// A mixed fleet: the share of sessions asked for asks for whole responses, a whole session
    /// at a time, the same sessions for every router; each client sees the first token of a
    /// stream and the whole of any other response.
    #[test]
    fn a_share_of_sessions_asks_for_whole_responses() {
        let (workload, lab) = two_turn_sessions(4.0, 30, 40);
        let sessions = workload.sessions.len();
        assert!(sessions > 80, "{sessions} sessions");
        for (percent, low, high) in [(0, 100, 100), (30, 55, 85), (100, 0, 0)] {
            let spec = FleetSpec { unstreamed_percent: percent, ..lab.clone() };
            let streamed = (0..sessions).filter(|&s| spec.streams(s)).count();
            let share = streamed * 100 / sessions;
            assert!((low..=high).contains(&share), "{percent} %: {share} % streamed");
        }
        let spec = FleetSpec { unstreamed_percent: 30, ..lab };
        let report = run(&workload, &spec);
        let mut i = 0;
        for (s, session) in workload.sessions.iter().enumerate() {
            for _ in &session.turns {
                let o = &report.outcomes[i];
                assert_eq!(o.streamed, spec.streams(s), "request {i} of session {s}");
                let ttft = o.ttft.expect("no failures");
                let seen = o.seen().expect("answered");
                assert!(o.e2e > ttft, "40 tokens take longer than one");
                assert_eq!(seen, if o.streamed { ttft } else { o.e2e });
                i += 1;
            }
        }
        let (streamed, unstreamed) =
            (report.seen(Some(true), None, 50.0), report.seen(Some(false), None, 50.0));
        assert!(unstreamed > streamed, "whole responses {unstreamed} s, first tokens {streamed} s");
    }
}
