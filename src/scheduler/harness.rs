//! Differential testing of [`Scheduler`] against [`Reference`]: decodes an arbitrary byte
//! string into parameters and a sequence of timed inputs, applies each to both, and compares
//! every output, the counters, the lane depths, per-backend accounting and the next wake-up,
//! calling [`Scheduler::check_invariants`] after every step. Used by proptest in `tests.rs` and
//! by the `scheduler_model` fuzz target, so the fuzz logic compiles with the crate.

use std::collections::BTreeSet;

use crate::clock::Tick;
use crate::ring::prompt_pool::{PromptPool, NO_PROMPT};

use super::reference::Reference;
use super::{
    Arrival, Budget, EngineCache, IndexSize, Input, Lane, Output, Params, RequestId, Routing,
    Scheduler, Snapshot, Usage,
};

/// Reads bytes as small numbers; past the end it yields zeros.
#[derive(Debug)]
struct Bytes<'a> {
    data: &'a [u8],
}

impl Bytes<'_> {
    fn byte(&mut self) -> u8 {
        match self.data.split_first() {
            Some((&first, rest)) => {
                self.data = rest;
                first
            }
            None => 0,
        }
    }

    fn below(&mut self, bound: u32) -> u32 {
        u32::from(self.byte()) % bound
    }

    fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

const RESOLUTION: Tick = 1 << 10;

/// Decodes scheduling parameters: small limits so that every rule triggers often.
fn params(bytes: &mut Bytes) -> Params {
    let routing = match bytes.below(4) {
        0 => Routing::SessionAffinity,
        1 => Routing::LeastInflight,
        2 => Routing::RoundRobin,
        _ => Routing::PrefixCost,
    };
    // S16 with a tiny index (so that CLOCK evicts often), a slack from none to everything and
    // waits from none to long.
    let prefix = super::PrefixParams {
        block_bytes: 256,
        index_blocks: match bytes.below(3) {
            0 => IndexSize::Auto { default_blocks: 2 + bytes.below(10) },
            _ => IndexSize::Blocks(2 + bytes.below(10)),
        },
        scan_max: 1 + bytes.below(4),
        slack_tokens: [0, 64, 200, 1 << 20][bytes.below(4) as usize],
        wait_max: [0, 3 * RESOLUTION, 20 * RESOLUTION][bytes.below(3) as usize],
        // Inert here: the harness's prompts carry block hashes and no conversation ends.
        derive_sessions: true,
        // Few, so that the tiny indexes hold hot prefixes.
        hot_touches: 1 + bytes.below(4) as u16,
    };
    Params {
        boost: bytes.below(4) != 0,
        routing,
        backends: 1 + bytes.below(3) as u16,
        queue_timeout: [None, Some(50 * RESOLUTION), Some(5 * RESOLUTION)][bytes.below(3) as usize],
        max_queued: 1 + bytes.below(12),
        inflight_per_backend: 1 + bytes.below(3),
        inflight_learned: bytes.below(2) == 0,
        prefill_tokens_per_backend: budget(bytes),
        max_sessions: 1 + bytes.below(6),
        max_overtakes: bytes.below(4),
        boosted_streak_max: bytes.below(3),
        grace_period: [0, 3 * RESOLUTION, RESOLUTION / 2][bytes.below(3) as usize],
        max_retries: bytes.below(3),
        eject_after_failures: bytes.below(3),
        metrics_stale_after: 8 * RESOLUTION,
        timer_resolution: RESOLUTION,
        prefix,
        // Issue [11]: none (today's single queue) half the time, else one to three tenants
        // of small and unequal weights.
        tenant_weights: (0..[0, 0, 1, 2, 3][bytes.below(5) as usize])
            .map(|_| [1, 3, 1, 10][bytes.below(4) as usize])
            .collect(),
    }
}

/// The requests the harness believes are queued or admitted, from the outputs it saw.
#[derive(Debug, Default)]
struct Live {
    queued: Vec<u64>,
    admitted: Vec<u64>,
    next_id: u64,
    /// The last prefix-cache counters reported, queries and hits.
    counters: (u64, u64),
    /// The last preemption counter reported.
    preemptions: u64,
    /// The last inter-token counters reported, ticks and tokens.
    itl: (u64, u64),
}

impl Live {
    fn pick(&self, bytes: &mut Bytes, admitted_only: bool) -> RequestId {
        let pool: Vec<u64> = if admitted_only {
            self.admitted.clone()
        } else {
            self.queued.iter().chain(&self.admitted).copied().collect()
        };
        let choice = bytes.byte() as usize;
        if pool.is_empty() || choice % 16 == 15 {
            // Sometimes a request nobody knows: a stale event.
            return RequestId(1_000_000 + choice as u64);
        }
        RequestId(pool[choice % pool.len()])
    }

    fn apply(&mut self, input: &Input, outputs: &[Output]) {
        let forget = |list: &mut Vec<u64>, id: u64| list.retain(|&x| x != id);
        match *input {
            Input::Arrive(arrival) => self.queued.push(arrival.id.0),
            Input::Cancel(id) | Input::Complete { id, .. } => {
                forget(&mut self.queued, id.0);
                forget(&mut self.admitted, id.0);
            }
            Input::Retry(id) if self.admitted.contains(&id.0) => {
                forget(&mut self.admitted, id.0);
                self.queued.push(id.0);
            }
            _ => {}
        }
        self.apply_outputs(outputs);
    }

    fn apply_outputs(&mut self, outputs: &[Output]) {
        let forget = |list: &mut Vec<u64>, id: u64| list.retain(|&x| x != id);
        for output in outputs {
            match *output {
                Output::Admit { id, .. } => {
                    forget(&mut self.queued, id.0);
                    self.admitted.push(id.0);
                }
                Output::Reject { id, .. } => forget(&mut self.queued, id.0),
            }
        }
    }
}

/// A prompt's chain: one of three families of shared prefixes, 0 to 6 blocks long.
fn decode_blocks(bytes: &mut Bytes, out: &mut Vec<u64>) {
    out.clear();
    let family = u64::from(bytes.below(3)) * 100;
    let len = u64::from(bytes.below(7));
    out.extend((1..=len).map(|k| family + k));
}

/// An arrival: a session from a small set or none, a body size, block hashes under S16, and
/// with tenants configured one of them (or now and then one the scheduler has no weight for,
/// counted as none).
fn decode_arrival(
    bytes: &mut Bytes,
    live: &mut Live,
    tenants: u16,
    prompt: Option<(&PromptPool, &mut Vec<u64>)>,
) -> Input {
    live.next_id += 1;
    let session_pick = bytes.below(8);
    let mut body = [0, 160, 2800, 12_000, 400_000][bytes.below(5) as usize];
    let slot = match prompt {
        Some((pool, blocks)) => {
            decode_blocks(bytes, blocks);
            body += blocks.len() as u32 * 256;
            match pool.acquire() {
                Some(slot) => {
                    pool.with(slot, |hashes| hashes.extend_from_slice(blocks));
                    slot
                }
                None => {
                    blocks.clear();
                    NO_PROMPT
                }
            }
        }
        None => NO_PROMPT,
    };
    Input::Arrive(Arrival {
        id: RequestId(live.next_id),
        session: (session_pick < 6).then_some(u64::from(session_pick)),
        prompt_bytes: body,
        streaming: bytes.below(2) == 0,
        prompt: slot,
        tenant: match tenants {
            0 => 0,
            n => bytes.below(u32::from(n) + 2) as u16,
        },
    })
}

/// One step: an input, or a live reconfiguration (the new parameters and which backends are
/// still configured).
#[derive(Debug)]
enum Step {
    Input(Input),
    Reconfigure(Params, Vec<bool>),
}

/// A prefill budget: `auto`, none, or a large or a small fixed one.
fn budget(bytes: &mut Bytes) -> Budget {
    match bytes.below(4) {
        0 => Budget::Auto,
        n => Budget::Tokens([0, 1000, 50][n as usize - 1]),
    }
}

/// What a reload may change, restricted to what the reference restates (routing to or from
/// `PrefixCost` needs a restart): a backend added (up to four), any backend removed or back
/// (one at least stays), and one of the other limits, the prefill budget or a new tenant.
fn decode_reconfigure(bytes: &mut Bytes, current: &Params) -> Step {
    let mut params = current.clone();
    if params.backends < 4 && bytes.below(2) == 0 {
        params.backends += 1;
    }
    let mut live: Vec<bool> = (0..params.backends).map(|_| bytes.below(4) != 0).collect();
    if !live.contains(&true) {
        live[bytes.below(u32::from(params.backends)) as usize] = true;
    }
    match bytes.below(11) {
        0 => params.max_queued = 1 + bytes.below(12),
        1 => {
            params.inflight_per_backend = 1 + bytes.below(3);
            params.inflight_learned = bytes.below(2) == 0;
        }
        2 => {
            let timeouts = [None, Some(50 * RESOLUTION), Some(5 * RESOLUTION)];
            params.queue_timeout = timeouts[bytes.below(3) as usize];
        }
        3 if !params.tenant_weights.is_empty() && params.tenant_weights.len() < 4 => {
            params.tenant_weights.push([1, 3, 1, 10][bytes.below(4) as usize]);
        }
        4 => params.boost = !params.boost,
        5 if params.routing != Routing::PrefixCost => {
            let routings = [Routing::SessionAffinity, Routing::LeastInflight, Routing::RoundRobin];
            params.routing = routings[bytes.below(3) as usize];
        }
        6 => {
            params.max_overtakes = bytes.below(4);
            params.boosted_streak_max = bytes.below(3);
        }
        7 => params.grace_period = [0, 3 * RESOLUTION, RESOLUTION / 2][bytes.below(3) as usize],
        8 => {
            params.max_retries = bytes.below(3);
            params.eject_after_failures = bytes.below(3);
        }
        9 => params.prefill_tokens_per_backend = budget(bytes),
        _ => {}
    }
    Step::Reconfigure(params, live)
}

fn decode_step(
    bytes: &mut Bytes,
    live: &mut Live,
    params: &Params,
    now: Tick,
    prompt: Option<(&PromptPool, &mut Vec<u64>)>,
) -> Step {
    let counts = (params.backends, params.tenant_weights.len() as u16);
    match bytes.below(16) {
        14 => decode_reconfigure(bytes, params),
        _ => Step::Input(decode_input(bytes, live, counts, now, prompt)),
    }
}

fn decode_input(
    bytes: &mut Bytes,
    live: &mut Live,
    (backends, tenants): (u16, u16),
    now: Tick,
    prompt: Option<(&PromptPool, &mut Vec<u64>)>,
) -> Input {
    match bytes.below(16) {
        0..=4 => decode_arrival(bytes, live, tenants, prompt),
        5 => Input::Cancel(live.pick(bytes, false)),
        6 => Input::FirstByte(live.pick(bytes, true)),
        7..=9 => {
            let id = live.pick(bytes, true);
            let success = bytes.below(4) != 0;
            let prompt_tokens = [0, 40, 700, 3000, 100_000][bytes.below(5) as usize];
            let cached = match bytes.below(4) {
                0 => Usage::UNKNOWN_CACHED,
                1 => 0,
                2 => prompt_tokens / 2,
                _ => prompt_tokens,
            };
            let completion_tokens = [0, 1, 30, 500][bytes.below(4) as usize];
            let usage = Usage { prompt_tokens, cached_tokens: cached, completion_tokens };
            Input::Complete { id, success, usage }
        }
        10 => Input::Retry(live.pick(bytes, true)),
        11 | 12 => {
            let mut snapshot = Snapshot::new(
                bytes.below(5) != 0,
                [None, Some(0), Some(0), Some(2), Some(1)][bytes.below(5) as usize],
                now.saturating_sub(u64::from(bytes.below(4)) * 3 * RESOLUTION),
            );
            if bytes.below(2) == 0 {
                // The counters mostly grow (by up to 2^20 tokens), and sometimes restart.
                live.counters.0 = match bytes.below(8) {
                    0 => u64::from(bytes.below(100)),
                    _ => live.counters.0 + (u64::from(bytes.byte()) << 12),
                };
                let share = u64::from(bytes.below(5));
                live.counters.1 =
                    (live.counters.1 + (live.counters.0 * share / 4)).min(live.counters.0);
                // The preemption counter grows by up to 3, and sometimes restarts.
                live.preemptions = match bytes.below(8) {
                    0 => u64::from(bytes.below(3)),
                    _ => live.preemptions + u64::from(bytes.below(4)),
                };
                // The inter-token counters grow by up to 40 tokens (a sample needs 16) at up
                // to a few steps' ticks each, and sometimes restart.
                let tokens = u64::from(bytes.below(41));
                live.itl = match bytes.below(8) {
                    0 => (0, u64::from(bytes.below(3))),
                    _ => (
                        live.itl.0 + tokens * [1, 700, 40_000][bytes.below(3) as usize],
                        live.itl.1 + tokens,
                    ),
                };
                let exported = bytes.below(6) != 0;
                let none = EngineCache::NO_COUNTER;
                snapshot.cache = EngineCache {
                    itl_ticks: if exported { live.itl.0 } else { none },
                    itl_count: if exported { live.itl.1 } else { none },
                    kv_capacity_tokens: [0, 300, 3000, 100_000][bytes.below(4) as usize],
                    prefix_queries: live.counters.0,
                    prefix_hits: live.counters.1,
                    preemptions: live.preemptions,
                    // Unknown, empty, half, nearly and wholly full, and over one (clamped).
                    kv_usage_micro: [
                        EngineCache::NO_USAGE,
                        0,
                        500_000,
                        900_000,
                        1_000_000,
                        1_700_000,
                    ][bytes.below(6) as usize],
                };
            }
            // Now and then the report of a backend whose address moved (another engine).
            snapshot.new_engine = bytes.below(16) == 0;
            // Now and then a backend the scheduler does not have (yet: a reload's).
            Input::Snapshot { backend: bytes.below(u32::from(backends) + 1) as u16, snapshot }
        }
        13 if bytes.below(8) == 0 => Input::Shutdown,
        _ => Input::Tick,
    }
}

fn advance(bytes: &mut Bytes) -> Tick {
    match bytes.below(8) {
        0..=2 => 0,
        3 | 4 => u64::from(bytes.byte()),
        5 | 6 => RESOLUTION * u64::from(bytes.below(4)),
        _ => RESOLUTION * 40,
    }
}

/// Rejections within one step are compared as a set: the order in which simultaneous
/// deadlines fire is not part of the contract; admissions are compared in order.
fn split(outputs: &[Output]) -> (Vec<Output>, BTreeSet<(RequestId, super::RejectReason)>) {
    let admits = outputs.iter().filter(|o| matches!(o, Output::Admit { .. })).copied().collect();
    let rejects = outputs
        .iter()
        .filter_map(|o| match *o {
            Output::Reject { id, reason } => Some((id, reason)),
            Output::Admit { .. } => None,
        })
        .collect();
    (admits, rejects)
}

/// Runs `script`, each input at its tick with an arrival's prompt blocks beside it, through the
/// scheduler and the reference and compares them as [`run`] does; returns the scheduler's
/// outputs. For what random bytes seldom reach: a learned prefill rate needs eight first bytes
/// in one window on one backend.
pub fn run_script(params: &Params, script: &[(Tick, Input, Vec<u64>)]) -> Vec<Output> {
    let mut real = Scheduler::new(params.clone(), 0);
    let mut model = Reference::new(params.clone());
    let pool = real.prompt_pool();
    let (mut got, mut want, mut all) = (Vec::new(), Vec::new(), Vec::new());
    for (step, (now, input, blocks)) in script.iter().enumerate() {
        let (now, mut input) = (*now, *input);
        if let (Input::Arrive(arrival), Some(pool)) = (&mut input, &pool) {
            arrival.prompt = pool.acquire().expect("a free prompt slot");
            pool.with(arrival.prompt, |hashes| hashes.extend_from_slice(blocks));
        }
        model.set_next_blocks(blocks);
        got.clear();
        want.clear();
        real.handle(now, input, &mut got);
        model.handle(now, input, &mut want);
        let context = || format!("script step {step} at {now}: {input:?}");
        compare_step(&real, &model, (&got, &want), params.backends, &context);
        all.extend_from_slice(&got);
    }
    all
}

/// Runs the byte string `data` as a differential test; panics on the first divergence.
pub fn run(data: &[u8]) {
    run_params(data, false);
}

/// [`run`] with tenants always configured (issue \[11\]): two of weights 3 and 1 when the
/// bytes chose none.
pub fn run_with_tenants(data: &[u8]) {
    run_params(data, true);
}

fn run_params(data: &[u8], tenants: bool) {
    let mut bytes = Bytes { data };
    let mut params = params(&mut bytes);
    if tenants && params.tenant_weights.is_empty() {
        params.tenant_weights = vec![3, 1];
    }
    let mut real = Scheduler::new(params.clone(), 0);
    let mut model = Reference::new(params.clone());
    let mut live = Live::default();
    let (mut now, mut step) = (0, 0);
    let (mut got, mut want) = (Vec::new(), Vec::new());
    let pool = real.prompt_pool();
    let mut blocks = Vec::new();
    while !bytes.is_empty() {
        now += advance(&mut bytes);
        blocks.clear();
        let prompt = pool.as_deref().map(|pool| (pool, &mut blocks));
        let next = decode_step(&mut bytes, &mut live, &params, now, prompt);
        model.set_next_blocks(&blocks);
        got.clear();
        want.clear();
        match &next {
            Step::Input(input) => {
                real.handle(now, *input, &mut got);
                model.handle(now, *input, &mut want);
            }
            Step::Reconfigure(new, backends) => {
                real.reconfigure(now, new.clone(), backends, &mut got);
                model.reconfigure(now, new.clone(), backends, &mut want);
                params = new.clone();
            }
        }
        let context = || format!("step {step} at {now}: {next:?}\nparams {params:?}");
        compare_step(&real, &model, (&got, &want), params.backends, &context);
        match &next {
            Step::Input(input) => live.apply(input, &got),
            Step::Reconfigure(..) => live.apply_outputs(&got),
        }
        step += 1;
    }
}

/// After one step applied to both: their outputs, the scheduler's invariants, their states.
fn compare_step(
    real: &Scheduler,
    model: &Reference,
    (got, want): (&[Output], &[Output]),
    backends: u16,
    context: &dyn Fn() -> String,
) {
    assert_eq!(split(got), split(want), "outputs differ, {}", context());
    real.check_invariants();
    compare_state(real, model, backends, context);
}

fn compare_state(real: &Scheduler, model: &Reference, backends: u16, context: &dyn Fn() -> String) {
    assert_eq!(real.stats(), model.stats(), "stats differ, {}", context());
    for lane in Lane::ALL {
        assert_eq!(real.depth(lane), model.depth(lane), "{lane:?} depth, {}", context());
    }
    let (a, b) = (real.sessions_active(), model.sessions_active());
    assert_eq!(a, b, "sessions active, {}", context());
    for backend in 0..backends {
        assert_eq!(
            real.backend_inflight(backend),
            model.backend_inflight(backend),
            "{}",
            context()
        );
        let (a, b) = (real.backend_prefill_tokens(backend), model.backend_prefill_tokens(backend));
        assert_eq!(a, b, "prefill of {backend}, {}", context());
        let e = real.backend_estimates(backend);
        let a = (e.rate.0, e.rate.1, e.budget, e.kv_capacity_tokens, e.index_capacity, e.restarts);
        let pressure = (e.kv_pressure_micro, e.kv_held_micro, e.inflight_cap);
        let a = (a, pressure, (e.decode_gap, e.expected_output));
        assert_eq!(a, model.backend_estimates(backend), "estimates of {backend}, {}", context());
    }
    assert_eq!(real.next_wakeup(), model.next_wakeup(), "next wake-up, {}", context());
}
