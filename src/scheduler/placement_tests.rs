//! S16 rule by rule: placement by cost, waiting for the cheapest backend, the slack, the wait
//! bound, forced requests, and sharing across sessions.

use super::super::*;
use crate::ring::prompt_pool::NO_PROMPT;

/// Tokens per block: `PrefixParams::DEFAULT.block_bytes` / 4.
const BLOCK_TOKENS: u32 = 64;
/// The prefill backlog at which a backend stops being eligible.
const GATE: u64 = 1000;

fn params(backends: u16, inflight_per_backend: u32) -> Params {
    Params {
        boost: true,
        routing: Routing::PrefixCost,
        backends,
        queue_timeout: None,
        max_queued: 100,
        inflight_per_backend,
        inflight_learned: false,
        prefill_tokens_per_backend: Budget::Tokens(GATE),
        max_sessions: 100,
        max_overtakes: 16,
        boosted_streak_max: 0,
        grace_period: 0,
        max_retries: 2,
        eject_after_failures: 0,
        metrics_stale_after: 1 << 40,
        timer_resolution: 1 << 8,
        prefix: PrefixParams::DEFAULT,
        tenant_weights: Vec::new(),
    }
}

struct H {
    s: Scheduler,
    now: Tick,
}

impl H {
    fn new(params: Params) -> H {
        H { s: Scheduler::new(params, 0), now: 0 }
    }

    /// Applies `input` and checks the invariants: the outputs.
    fn outputs(&mut self, input: Input) -> Vec<Output> {
        let mut out = Vec::new();
        self.s.handle(self.now, input, &mut out);
        self.s.check_invariants();
        out
    }

    fn send(&mut self, input: Input) -> Vec<(u64, u16)> {
        self.outputs(input)
            .iter()
            .filter_map(|o| match o {
                Output::Admit { id, backend, .. } => Some((id.0, *backend)),
                Output::Reject { .. } => None,
            })
            .collect()
    }

    /// Request `id` whose prompt is the chain `blocks` (`tokens` estimated prompt tokens).
    fn arrive(
        &mut self,
        id: u64,
        session: Option<u64>,
        blocks: &[u64],
        tokens: u32,
        streaming: bool,
    ) -> Vec<(u64, u16)> {
        let pool = self.s.prompt_pool().expect("prefix-cost has a pool");
        let prompt = pool.acquire().expect("a free slot");
        pool.with(prompt, |hashes| hashes.extend_from_slice(blocks));
        self.send(Input::Arrive(arrival(id, session, tokens * 4, streaming, prompt)))
    }

    /// Request `id` of `session` whose prompt is the chain `blocks` (a block's tokens each):
    /// the (id, turn, warm) of the admissions it makes.
    fn turn(&mut self, id: u64, session: Option<u64>, blocks: &[u64]) -> Vec<(u64, u16, bool)> {
        let pool = self.s.prompt_pool().expect("prefix-cost has a pool");
        let prompt = pool.acquire().expect("a free slot");
        pool.with(prompt, |hashes| hashes.extend_from_slice(blocks));
        let tokens = BLOCK_TOKENS * (blocks.len() as u32).max(1);
        self.outputs(Input::Arrive(arrival(id, session, tokens * 4, false, prompt)))
            .iter()
            .filter_map(|o| match *o {
                Output::Admit { id, turn, warm, .. } => Some((id.0, turn, warm)),
                Output::Reject { .. } => None,
            })
            .collect()
    }

    fn first_byte(&mut self, id: u64) -> Vec<(u64, u16)> {
        self.send(Input::FirstByte(RequestId(id)))
    }

    fn complete(&mut self, id: u64) -> Vec<(u64, u16)> {
        self.send(Input::Complete { id: RequestId(id), success: true, usage: Usage::NONE })
    }
}

/// Tenant 0's request `id` with `prompt_bytes` of body and the prompt slot `prompt`.
fn arrival(
    id: u64,
    session: Option<u64>,
    prompt_bytes: u32,
    streaming: bool,
    prompt: u32,
) -> Arrival {
    Arrival { id: RequestId(id), session, prompt_bytes, streaming, prompt, tenant: 0 }
}

/// A chain of `n` block hashes starting at `from`.
fn chain(from: u64, n: u64) -> Vec<u64> {
    (from..from + n).collect()
}

/// Occupies `backend` with a streaming request whose backlog closes its gate (it must be
/// that backend the scheduler picks: both others are busier or it is the only free one).
fn make_busy(h: &mut H, id: u64, expect: u16) {
    let admitted = h.arrive(id, None, &chain(1_000_000 + id * 1000, 40), 2 * GATE as u32, true);
    assert_eq!(admitted, vec![(id, expect)]);
    assert!(h.s.backend_prefill_tokens(expect) >= GATE);
}

#[test]
fn a_request_goes_where_its_prefix_is_cached_not_where_load_is_lowest() {
    let mut h = H::new(params(2, 8));
    let prompt = chain(1, 20);
    assert_eq!(h.arrive(1, Some(7), &prompt, 20 * BLOCK_TOKENS, false), vec![(1, 0)]);
    h.complete(1);
    // Backend 0 is busier (one request in flight), but holds the prompt's first 20 blocks.
    assert_eq!(h.arrive(2, None, &chain(900, 2), 2 * BLOCK_TOKENS, false), vec![(2, 0)]);
    let follow_up = chain(1, 24);
    assert_eq!(h.arrive(3, Some(7), &follow_up, 24 * BLOCK_TOKENS, false), vec![(3, 0)]);
    assert_eq!(h.s.prefix_index_len(0), 20 + 2 + 4);
    assert_eq!(h.s.prefix_index_len(1), 0);
}

#[test]
fn a_decoding_sequence_costs_more_as_the_kv_cache_runs_fuller() {
    let mut h = H::new(params(2, 8));
    // Backend 0 decodes request 1 (its first byte came); backend 1 has request 2's 128 tokens
    // of prefill still to do.
    assert_eq!(h.arrive(1, None, &chain(10, 2), 2 * BLOCK_TOKENS, true), vec![(1, 0)]);
    h.first_byte(1);
    assert_eq!(h.arrive(2, None, &chain(20, 2), 2 * BLOCK_TOKENS, true), vec![(2, 1)]);
    assert_eq!(h.s.backend_prefill_tokens(1), u64::from(2 * BLOCK_TOKENS));
    // No KV usage or capacity reported: a decoding sequence weighs the blind floor, less than
    // that backlog, and request 3 (nothing cached anywhere) goes to the backend that decodes.
    assert_eq!(h.s.backend_estimates(0).decode_weight, super::DECODE_WEIGHT_BLIND);
    assert!(super::DECODE_WEIGHT_BLIND < u64::from(2 * BLOCK_TOKENS));
    assert_eq!(h.arrive(3, None, &chain(30, 2), 2 * BLOCK_TOKENS, true), vec![(3, 0)]);
    h.complete(3);
    // Backend 0's engine reports its KV cache full, scrape after scrape: the pressure climbs
    // toward one (a 32nd of the way each time) and the weight with it.
    let full = |h: &mut H, scrapes: u32| {
        for _ in 0..scrapes {
            h.send(usage_of(0, 1_000_000));
        }
        h.s.backend_estimates(0)
    };
    let e = full(&mut h, 1);
    let blind = super::DECODE_WEIGHT_BLIND;
    assert_eq!(e.kv_pressure_micro, 31_250);
    assert_eq!(e.decode_weight, blind + super::decode_weight(31_250));
    assert_eq!(e.decode_weight, blind + 1, "a 32nd of full: little more");
    let e = full(&mut h, 99);
    assert!(e.kv_pressure_micro > 950_000, "{e:?}");
    assert!(e.decode_weight > 1_900, "{e:?}");
    assert_eq!(h.s.backend_estimates(1).decode_weight, blind, "its own");
    // The same placement as request 3's now goes to the backend with the backlog.
    assert_eq!(h.arrive(4, None, &chain(40, 2), 2 * BLOCK_TOKENS, true), vec![(4, 1)]);
    // A scrape without the gauge changes nothing; reports of an emptier cache bring it down.
    let before = h.s.backend_estimates(0);
    h.send(snapshot_of(0, EngineCache::NO_COUNTER, EngineCache::NO_COUNTER));
    assert_eq!(h.s.backend_estimates(0).kv_pressure_micro, before.kv_pressure_micro);
    for _ in 0..200 {
        h.send(usage_of(0, 0));
    }
    assert_eq!(h.s.backend_estimates(0).decode_weight, blind);
    // Once the engine exports its KV capacity the router counts what it holds there, and the
    // floor goes: the sequence it decodes (128 tokens) is an eighth of 1,024, 2,000 / 64.
    h.send(report(0, EngineCache { kv_capacity_tokens: 1024, ..EngineCache::UNKNOWN }));
    assert_eq!(h.s.backend_estimates(0).decode_weight, 31);
}

/// The router's own count of the contexts on an engine raises its decode weight before any
/// scrape reports the usage: a stream counts from its first byte to its end, a whole response
/// from its admission. Both engines export 1,024 tokens of KV capacity and report no usage.
#[test]
fn the_contexts_the_router_holds_weigh_before_the_engine_reports_them() {
    let mut h = H::new(params(2, 8));
    for backend in [0, 1] {
        h.send(report(backend, EngineCache { kv_capacity_tokens: 1024, ..EngineCache::UNKNOWN }));
    }
    let held = |h: &H, b: u16| {
        let e = h.s.backend_estimates(b);
        (e.kv_pressure_micro, e.kv_held_micro, e.decode_weight)
    };
    // A 512-token stream in prefill is the engine's backlog, not yet a context it holds.
    assert_eq!(h.arrive(1, None, &chain(10, 8), 8 * BLOCK_TOKENS, true), vec![(1, 0)]);
    assert_eq!(held(&h, 0), (0, 0, 0));
    // Its first byte: half the cache, a weight of 2,000 / 4 per decoding sequence.
    h.first_byte(1);
    assert_eq!(held(&h, 0), (0, 500_000, 500));
    // Backend 1 takes a 128-token stream (its backlog now), and then a 128-token whole
    // response costs 128 + 500 on backend 0 against 128 + 128 + 2 x 128 (it would delay the
    // pending prefill) on backend 1. Weighed by the usage the engines report, nothing, the
    // decoding sequence would cost nothing and it would go to backend 0.
    assert_eq!(h.arrive(2, None, &chain(30, 2), 2 * BLOCK_TOKENS, true), vec![(2, 1)]);
    assert_eq!(h.arrive(3, None, &chain(40, 2), 2 * BLOCK_TOKENS, false), vec![(3, 1)]);
    // A whole response counts from its admission (no first byte tells when its prefill ends).
    assert_eq!(held(&h, 1), (0, 125_000, 31));
    h.first_byte(2);
    assert_eq!(held(&h, 1), (0, 250_000, 125));
    for id in [1, 2, 3] {
        h.complete(id);
    }
    assert_eq!((held(&h, 0), held(&h, 1)), ((0, 0, 0), (0, 0, 0)));
}

/// A system prompt of ten blocks followed by `own`.
fn with_system_prompt(own: &[u64]) -> Vec<u64> {
    [&chain(1, 10)[..], own].concat()
}

/// Two backends whose engines export `kv` tokens of KV capacity, after fifteen admissions of a
/// shared system prompt (three make it hot) to backend 1, which decodes fourteen sequences,
/// against backend 0's one; session 7's first turn completed on backend 1, and its next turn
/// stayed there (it has a home).
fn a_hot_system_prompt_on_backend_1(kv: [u32; 2]) -> H {
    let mut p = params(2, 64);
    p.prefix.hot_touches = 3;
    let mut h = H::new(p);
    // Backend 0's prefill backlog closes its gate (taken before the capacities are known, which
    // would break the idle backends' tie) while backend 1 learns the system prompt: session 7's
    // first turn, then fourteen first turns that share it, all decoding there.
    make_busy(&mut h, 100, 0);
    for (backend, tokens) in [(0, kv[0]), (1, kv[1])] {
        h.send(report(backend, EngineCache { kv_capacity_tokens: tokens, ..EngineCache::UNKNOWN }));
    }
    let prompt = with_system_prompt;
    let tokens = |blocks: &[u64]| blocks.len() as u32 * BLOCK_TOKENS;
    let first = prompt(&[501]);
    assert_eq!(h.arrive(1, Some(7), &first, tokens(&first), true), vec![(1, 1)]);
    h.first_byte(1);
    h.complete(1);
    for id in 2..=15 {
        let own = prompt(&[600 + id]);
        assert_eq!(h.arrive(id, None, &own, tokens(&own), true), vec![(id, 1)]);
        h.first_byte(id);
    }
    h.first_byte(100);
    // Backend 0 decodes one sequence of 2,000 tokens, backend 1 fourteen of 704: 9,856 tokens,
    // a quarter of a 40,000-token cache, so each weighs 2,000 / 16 = 121 there (1,694 in all).
    // Session 7's next turn has a home: its history costs 8 per token on backend 0 (6,144
    // with the system prompt), against 1,694 + 512 at home.
    let follow = prompt(&[501, 502]);
    assert_eq!(h.arrive(16, Some(7), &follow, tokens(&follow), true), vec![(16, 1)]);
    h
}

#[test]
fn a_first_turn_copies_a_hot_shared_prefix_to_a_backend_with_less_to_decode() {
    let mut h = a_hot_system_prompt_on_backend_1([40_000, 40_000]);
    // A new session's first turn finds the system prompt hot on backend 1 (fifteen admissions
    // sent it there): copying it to backend 0 costs its 640 tokens once, 5 + 640 + 8 x 64 in
    // all (backend 0's sequence holds a twentieth of its cache), less than backend 1's load;
    // at 8 per token it would cost 5,637 and stay.
    let fresh = with_system_prompt(&[700]);
    assert_eq!(h.s.stats().prefix_copies, 0);
    assert_eq!(h.arrive(17, None, &fresh, 11 * BLOCK_TOKENS, true), vec![(17, 0)]);
    assert_eq!(h.s.stats().prefix_copies, 1, "counted");
    assert_eq!(h.s.prefix_index_len(0), 40 + 11, "the busy request's chain, then the copy");
}

#[test]
fn a_hot_prefix_is_not_copied_to_a_backend_with_a_smaller_kv_cache() {
    // Backend 0's engine exports a quarter of backend 1's KV capacity (an L4 beside an H100):
    // the sessions that would follow a copy there would be slower, and fewer fit. Its one
    // sequence weighs 80 (a fifth of its cache): a copy would cost 1,232, less than backend 1's
    // load, as in the test before.
    let mut h = a_hot_system_prompt_on_backend_1([10_000, 40_000]);
    let fresh = with_system_prompt(&[700]);
    assert_eq!(h.arrive(17, None, &fresh, 11 * BLOCK_TOKENS, true), vec![(17, 1)]);
    assert_eq!(h.s.stats().prefix_copies, 0);
}

#[test]
fn the_decode_weight_grows_with_the_square_of_the_pressure() {
    use super::super::cost::{decode_weight, DECODE_WEIGHT_KV};
    assert_eq!(decode_weight(0), 0);
    assert_eq!(decode_weight(500_000), DECODE_WEIGHT_KV / 4);
    assert_eq!(decode_weight(1_000_000), DECODE_WEIGHT_KV);
    assert_eq!(decode_weight(u64::MAX), DECODE_WEIGHT_KV, "at most full");
    let mut last = 0;
    for p in (0..=1_000_000).step_by(1_000) {
        assert!(decode_weight(p) >= last, "monotone at {p}");
        last = decode_weight(p);
    }
}

#[test]
fn an_engine_that_restarted_is_placed_as_holding_nothing() {
    let mut h = H::new(params(2, 8));
    let snapshot = |queries, hits| snapshot_of(0, queries, hits);
    h.send(snapshot(50_000, 20_000));
    let prompt = chain(1, 20);
    assert_eq!(h.arrive(1, Some(7), &prompt, 20 * BLOCK_TOKENS, false), vec![(1, 0)]);
    h.complete(1);
    assert_eq!(h.s.prefix_index_len(0), 20);
    // Counters that grew: the same engine, its index kept.
    h.send(snapshot(51_280, 20_000));
    assert_eq!(h.s.prefix_index_len(0), 20);
    assert_eq!(h.s.backend_estimates(0).restarts, 0);
    // Backend 0 is busier (one request in flight) and still holds the prompt: it gets the
    // follow-up, as in the test above.
    assert_eq!(h.arrive(2, None, &chain(900, 2), 2 * BLOCK_TOKENS, false), vec![(2, 0)]);
    // Its counters went down: a new engine process, with an empty cache.
    h.now = 5;
    h.send(snapshot(640, 0));
    assert_eq!(h.s.prefix_index_len(0), 0);
    let estimates = h.s.backend_estimates(0);
    assert_eq!((estimates.restarts, estimates.restarted_at), (1, 5));
    // The follow-up now costs its whole prompt on either: the idle backend takes it.
    assert_eq!(h.arrive(3, Some(7), &chain(1, 24), 24 * BLOCK_TOKENS, false), vec![(3, 1)]);
    assert_eq!(h.s.backend_estimates(1).restarts, 0, "the other backend's count");
    assert_eq!(h.s.prefix_index_len(1), 24);
    // Backend 1's address moves (another engine) and its report says so, with counters that
    // grew: emptied all the same, counted once, and those counters are the new baseline.
    h.send(snapshot_of(1, 900_000, 10));
    let mut moved = Snapshot::new(true, Some(0), 0);
    moved.new_engine = true;
    moved.cache = EngineCache { prefix_queries: 990_000, prefix_hits: 20, ..EngineCache::UNKNOWN };
    h.now = 9;
    h.send(Input::Snapshot { backend: 1, snapshot: moved });
    assert_eq!(h.s.prefix_index_len(1), 0);
    assert_eq!((h.s.backend_estimates(1).restarts, h.s.backend_estimates(1).restarted_at), (1, 9));
    h.send(snapshot_of(1, 995_000, 30));
    assert_eq!(h.s.backend_estimates(1).restarts, 1, "growing counters after it: no restart");
}

/// A healthy report for `backend` with nothing waiting and this about its caches.
fn report(backend: u16, cache: EngineCache) -> Input {
    let mut snapshot = Snapshot::new(true, Some(0), 0);
    snapshot.cache = cache;
    Input::Snapshot { backend, snapshot }
}

/// While one backend is busy, a streaming first turn goes to an idle backend whose decode
/// speed nothing has taught yet, even away from its cached prefix: an engine of unknown speed
/// is otherwise taken to be as fast as the fastest, and the prefix shared by every session
/// would keep them all where the first one landed. A non-streaming request is not sent to
/// explore (its client would wait for a whole response at an unknown speed), nor a backend
/// whose engine exports less than half the largest KV capacity (a smaller card, and the
/// likelier slower one), nor one already serving a request.
#[test]
fn a_streaming_first_turn_explores_an_idle_backend_of_unknown_decode_speed() {
    let mut h = H::new(params(3, 8));
    for (backend, tokens) in [(0, 40_000), (1, 40_000), (2, 10_000)] {
        h.send(report(backend, EngineCache { kv_capacity_tokens: tokens, ..EngineCache::UNKNOWN }));
    }
    let shared = chain(100, 10);
    let tokens = 10 * BLOCK_TOKENS;
    // Nothing is busy: the cost places it (a tie, to the first of the largest capacities).
    assert_eq!(h.arrive(1, None, &shared, tokens, true), vec![(1, 0)]);
    h.first_byte(1);
    assert_eq!(h.arrive(2, None, &shared, tokens, false), vec![(2, 0)], "whole responses stay");
    assert_eq!(h.arrive(3, None, &shared, tokens, true), vec![(3, 1)], "explores backend 1");
    // Backend 1 is serving, backend 2 is small: the cost decides, by the cached prefix.
    assert_ne!(h.arrive(4, None, &shared, tokens, true), vec![(4, 2)]);
}

/// Once an engine's inter-token counters have taught its decode speed, its backend is placed
/// by the cost alone: the same first turn as above stays with its cached prefix.
#[test]
fn a_backend_whose_engine_taught_its_decode_speed_is_not_explored() {
    let mut h = H::new(params(2, 8));
    same_decode_speed(&mut h);
    let shared = chain(100, 10);
    assert_eq!(h.arrive(1, None, &shared, 10 * BLOCK_TOKENS, true), vec![(1, 0)]);
    h.first_byte(1);
    assert_eq!(h.arrive(2, None, &shared, 10 * BLOCK_TOKENS, true), vec![(2, 0)]);
}

/// Before any backend closes a prefill-rate window, a stream's cost still counts the steps of
/// an engine whose steps are longer, at the fastest rate served alone. Backend 0 decodes at
/// 100 ticks a token, backend 1 at 10,000 (its engine's counters say so); backend 0 served
/// ten blocks alone in 64 ticks (10 tokens a tick). With a ten-block prefill pending on
/// backend 0, another costs 640 + 2 x 640 there and 4 x 9,900 x 10 on backend 1; with no rate
/// to count the steps at, backend 1 would cost nothing and take it.
#[test]
fn longer_steps_count_at_the_rate_served_alone_before_any_window() {
    let mut h = H::new(params(2, 8));
    for (backend, ticks) in [(0, 1_600), (1, 160_000)] {
        h.send(itl_of(backend, 0, 0));
        h.send(itl_of(backend, ticks, 16));
    }
    assert_eq!(h.arrive(1, None, &chain(100, 10), 10 * BLOCK_TOKENS, true), vec![(1, 0)]);
    h.now = 64;
    h.first_byte(1);
    h.complete(1);
    assert_eq!(h.s.learned.fastest_rate(), (0, 0), "no window closed");
    assert_eq!(h.s.learned.cost_rate(), (640, 64));
    assert_eq!(h.arrive(2, None, &chain(200, 10), 10 * BLOCK_TOKENS, true), vec![(2, 0)]);
    assert_eq!(h.arrive(3, None, &chain(300, 10), 10 * BLOCK_TOKENS, true), vec![(3, 0)]);
}

/// Reports that teach both of two backends the same decode gap from their engines'
/// inter-token counters (a hundred ticks a token).
fn same_decode_speed(h: &mut H) {
    for (ticks, tokens) in [(0, 0), (1600, 16)] {
        for backend in 0..2 {
            h.send(itl_of(backend, ticks, tokens));
        }
    }
    assert_eq!(h.s.learned.decode[1].gap, 100 * decode::GAP_SCALE);
}

/// A report for `backend` with these inter-token counters (ticks, tokens) and nothing else.
fn itl_of(backend: u16, ticks: u64, tokens: u64) -> Input {
    report(backend, EngineCache { itl_ticks: ticks, itl_count: tokens, ..EngineCache::UNKNOWN })
}

/// A report for `backend` with this KV usage (millionths) and nothing else about its caches.
fn usage_of(backend: u16, usage_micro: u32) -> Input {
    report(backend, EngineCache { kv_usage_micro: usage_micro, ..EngineCache::UNKNOWN })
}

/// A report for `backend` with these prefix-cache counters.
fn snapshot_of(backend: u16, queries: u64, hits: u64) -> Input {
    report(
        backend,
        EngineCache { prefix_queries: queries, prefix_hits: hits, ..EngineCache::UNKNOWN },
    )
}

#[test]
fn a_request_waits_for_its_busy_backend_when_the_other_costs_more_than_the_slack() {
    let mut h = H::new(params(2, 8));
    let prompt = chain(1, 100);
    assert_eq!(h.arrive(1, Some(7), &prompt, 100 * BLOCK_TOKENS, false), vec![(1, 0)]);
    h.complete(1);
    make_busy(&mut h, 2, 0);
    // Backend 1 is eligible and idle, but would prefill 6,400 tokens; backend 0 has them.
    assert_eq!(h.arrive(3, Some(7), &chain(1, 101), 101 * BLOCK_TOKENS, false), vec![]);
    assert_eq!(h.s.stats().placement_waits, 1);
    // A request with no cached prefix anywhere does not wait: it takes backend 1.
    assert_eq!(h.arrive(4, None, &chain(5000, 10), 10 * BLOCK_TOKENS, false), vec![(4, 1)]);
    // The blocker's first byte opens backend 0: the waiting request goes there.
    assert_eq!(h.first_byte(2), vec![(3, 0)]);
    assert_eq!(h.s.stats().placement_waits, 1, "a wait is counted once per request");
}

#[test]
fn a_request_takes_an_eligible_backend_within_the_slack() {
    let mut h = H::new(params(2, 8));
    // 30 blocks: 1,920 tokens, all cached on backend 0 once sent.
    assert_eq!(h.arrive(1, Some(7), &chain(1, 30), 30 * BLOCK_TOKENS, false), vec![(1, 0)]);
    h.complete(1);
    make_busy(&mut h, 2, 0);
    // Backend 0 is the cheapest but busy; backend 1 would prefill 1,984 tokens where 0 would
    // prefill 64: 1,920 more, within the 2,048 tokens of slack.
    assert_eq!(h.arrive(3, Some(7), &chain(1, 31), 31 * BLOCK_TOKENS, false), vec![(3, 1)]);
    assert_eq!(h.s.stats().placement_waits, 0);
}

#[test]
fn after_affinity_wait_max_a_request_takes_any_eligible_backend() {
    let mut h = H::new(params(2, 8));
    assert_eq!(h.arrive(1, Some(7), &chain(1, 100), 100 * BLOCK_TOKENS, false), vec![(1, 0)]);
    h.complete(1);
    make_busy(&mut h, 2, 0);
    assert_eq!(h.arrive(3, Some(7), &chain(1, 101), 101 * BLOCK_TOKENS, false), vec![]);
    let wait_max = PrefixParams::DEFAULT.wait_max;
    // Nothing happens before the bound...
    h.now = wait_max / 2;
    assert_eq!(h.send(Input::Tick), vec![]);
    // ...and the scheduler's own timer places it once the bound has passed.
    let wake = h.s.next_wakeup().expect("the wait's end is a timer");
    assert!(wake >= wait_max && wake < wait_max + 2 * h.s.params().timer_resolution);
    h.now = wake;
    assert_eq!(h.send(Input::Tick), vec![(3, 1)]);
}

#[test]
fn forced_requests_never_wait() {
    let mut p = params(2, 1);
    p.max_overtakes = 1;
    let mut h = H::new(p);
    // Session A's history is on backend 0, session B's on backend 1.
    assert_eq!(h.arrive(1, Some(0xA), &chain(1, 100), 100 * BLOCK_TOKENS, false), vec![(1, 0)]);
    assert_eq!(h.arrive(2, Some(0xB), &chain(500, 100), 100 * BLOCK_TOKENS, false), vec![(2, 1)]);
    h.now = 10;
    h.complete(1);
    h.now = 20;
    h.complete(2);
    make_busy(&mut h, 3, 0);
    assert_eq!(h.arrive(4, None, &chain(9000, 2), 2 * BLOCK_TOKENS, false), vec![(4, 1)]);
    // Both backends are full. A's follow-up, then B's (more recently completed: first in S3).
    assert_eq!(h.arrive(5, Some(0xA), &chain(1, 101), 101 * BLOCK_TOKENS, false), vec![]);
    assert_eq!(h.arrive(6, Some(0xB), &chain(500, 101), 101 * BLOCK_TOKENS, false), vec![]);
    // Backend 1 frees: B's follow-up goes home, overtaking A's once.
    assert_eq!(h.complete(4), vec![(6, 1)]);
    // Backend 1 frees again. A's follow-up is forced now: it does not wait for backend 0.
    assert_eq!(h.complete(6), vec![(5, 1)]);
    assert_eq!(h.s.stats().forced, 1);
}

#[test]
fn two_sessions_with_one_system_prompt_land_together_when_load_allows() {
    let mut h = H::new(params(2, 8));
    let system = chain(1, 30);
    let mut first = system.clone();
    first.extend(chain(100, 3));
    assert_eq!(h.arrive(1, Some(1), &first, 33 * BLOCK_TOKENS, false), vec![(1, 0)]);
    // Another session, same system prompt, while the first is still in flight on backend 0.
    let mut second = system.clone();
    second.extend(chain(200, 3));
    assert_eq!(h.arrive(2, Some(2), &second, 33 * BLOCK_TOKENS, false), vec![(2, 0)]);
    // When backend 0 cannot take more, the shared prompt does not hold the third back.
    make_busy(&mut h, 3, 1);
    let mut third = system;
    third.extend(chain(300, 3));
    let full = params(2, 8).inflight_per_backend;
    for id in 10..10 + u64::from(full) - 2 {
        assert_eq!(h.arrive(id, None, &chain(id * 1000, 1), BLOCK_TOKENS, false), vec![(id, 0)]);
    }
    assert_eq!(h.s.backend_inflight(0), full);
    // Backend 0 is full, backend 1's gate is closed: the third waits.
    assert_eq!(h.arrive(4, Some(3), &third, 33 * BLOCK_TOKENS, false), vec![]);
    // Backend 1 opens: 2,112 tokens there against 192 on the full backend 0, within the slack.
    assert_eq!(h.first_byte(3), vec![(4, 1)]);
}

#[test]
fn requests_without_hashes_cost_their_whole_prompt_and_slots_come_back() {
    let mut h = H::new(params(2, 1));
    let pool = h.s.prompt_pool().expect("pool");
    let capacity = pool.capacity();
    assert_eq!(h.send(Input::Arrive(arrival(1, None, 400, false, NO_PROMPT))), vec![(1, 0)]);
    assert_eq!(h.arrive(2, None, &chain(1, 3), 3 * BLOCK_TOKENS, false), vec![(2, 1)]);
    assert_eq!(h.arrive(3, None, &chain(1, 3), 3 * BLOCK_TOKENS, false), vec![]);
    h.send(Input::Cancel(RequestId(3)));
    h.complete(2);
    h.complete(1);
    assert_eq!(pool.available(), capacity, "every slot is back");
    h.send(Input::Shutdown);
    assert_eq!(h.arrive(5, None, &chain(1, 3), 3 * BLOCK_TOKENS, false), vec![]);
    assert_eq!(pool.available(), capacity, "a refused arrival's slot is back");
}

#[test]
fn only_a_warm_follow_up_is_boosted() {
    let mut h = H::new(params(1, 1));
    assert_eq!(h.arrive(1, Some(7), &chain(1, 10), 10 * BLOCK_TOKENS, false), vec![(1, 0)]);
    h.complete(1);
    assert_eq!(h.arrive(2, None, &chain(900, 1), BLOCK_TOKENS, false), vec![(2, 0)]);
    // Queued behind the running request: a first turn, then a "follow-up" of session 7 that
    // starts afresh (a RAG turn with new passages: nothing of it cached), then one whose first
    // 10 of 12 blocks (turn 1's prompt) are in backend 0's index.
    assert_eq!(h.arrive(3, None, &chain(800, 2), 2 * BLOCK_TOKENS, false), vec![]);
    assert_eq!(h.arrive(4, Some(7), &chain(500, 12), 12 * BLOCK_TOKENS, false), vec![]);
    assert_eq!(h.arrive(5, Some(7), &chain(1, 12), 12 * BLOCK_TOKENS, false), vec![]);
    assert_eq!(h.s.stats().boost_declined, 1);
    assert_eq!(h.s.depth(Lane::Boosted), 1);
    // The warm follow-up goes first; the cold one waits its turn in arrival order.
    assert_eq!(h.complete(2), vec![(5, 0)]);
    assert_eq!(h.complete(5), vec![(3, 0)]);
    assert_eq!(h.complete(3), vec![(4, 0)]);
    h.complete(4);
    // Half of the prompt held by an index (turn 4's first 5 blocks of 10) is warm; 4 is not.
    let mut half = chain(500, 5);
    half.extend(chain(7000, 5));
    let mut less = chain(500, 4);
    less.extend(chain(8000, 6));
    assert_eq!(h.arrive(6, None, &chain(900, 1), BLOCK_TOKENS, false), vec![(6, 0)]);
    assert_eq!(h.arrive(7, Some(7), &less, 10 * BLOCK_TOKENS, false), vec![]);
    assert_eq!(h.arrive(8, Some(7), &half, 10 * BLOCK_TOKENS, false), vec![]);
    assert_eq!(h.s.stats().boost_declined, 2);
    assert_eq!(h.complete(6), vec![(8, 0)]);
}

#[test]
fn admissions_say_the_turn_depth_and_the_predicted_prefix() {
    let mut h = H::new(params(2, 8));
    // Turn 1 of session 7: nothing cached anywhere, cold.
    assert_eq!(h.turn(1, Some(7), &chain(1, 10)), vec![(1, 1, false)]);
    assert_eq!(h.s.sessions_active(), 1);
    h.complete(1);
    assert_eq!(h.s.sessions_active(), 0);
    // Turn 2 repeats turn 1's 10 blocks and adds 2: 10 of 12 on the chosen backend, warm.
    assert_eq!(h.turn(2, Some(7), &chain(1, 12)), vec![(2, 2, true)]);
    h.complete(2);
    // Turn 3 starts afresh: cold however deep the turn.
    assert_eq!(h.turn(3, Some(7), &chain(500, 10)), vec![(3, 3, false)]);
    h.complete(3);
    // Exactly half held is warm.
    let mut half = chain(500, 5);
    half.extend(chain(7000, 5));
    assert_eq!(h.turn(4, Some(7), &half), vec![(4, 4, true)]);
    // A failed turn is not counted: the next is turn 4 again.
    h.send(Input::Complete { id: RequestId(4), success: false, usage: Usage::NONE });
    assert_eq!(h.turn(5, Some(7), &chain(500, 12)), vec![(5, 4, true)]);
    // Concurrent requests of one session share a depth and count one active session; another
    // session and a request without one are turn 1.
    assert_eq!(h.turn(6, Some(7), &chain(500, 12)), vec![(6, 4, true)]);
    assert_eq!(h.turn(7, Some(8), &chain(1, 12)), vec![(7, 1, true)], "shared prefix: warm");
    assert_eq!(h.turn(8, None, &chain(900, 3)), vec![(8, 1, false)]);
    assert_eq!(h.s.sessions_active(), 2);
    for id in [5, 6, 7, 8] {
        h.complete(id);
    }
    assert_eq!(h.s.sessions_active(), 0);
}

#[test]
fn without_prompt_blocks_warm_is_the_sessions_last_backend() {
    let mut h = H::new(params(1, 8));
    assert_eq!(h.turn(1, Some(9), &[]), vec![(1, 1, false)]);
    h.complete(1);
    assert_eq!(h.turn(2, Some(9), &[]), vec![(2, 2, true)], "back on its last backend");
    assert_eq!(h.turn(3, None, &[]), vec![(3, 1, false)], "no session: no last backend");
}

#[path = "derive_tests.rs"]
mod derive_tests;

/// A reload that lowers `max_queued` (so the arena the new limits need is smaller than the
/// one in use) keeps the prompts of the requests queued in the upper slots: they are admitted,
/// cancelled and give their prompt slots back as before.
#[test]
fn a_lowered_max_queued_keeps_the_prompts_of_requests_in_upper_slots() {
    let mut h = H::new(params(1, 1));
    let pool = h.s.prompt_pool().expect("prefix-cost has a pool");
    for id in 1..=40 {
        h.arrive(id, None, &chain(id * 100, 2), BLOCK_TOKENS * 2, false);
    }
    assert_eq!(h.s.queued(), 39);
    let lowered = Params { max_queued: 2, ..params(1, 1) };
    let mut out = Vec::new();
    h.s.reconfigure(h.now, lowered, &[true], &mut out);
    h.s.check_invariants();
    for id in 2..=40 {
        h.send(Input::Cancel(RequestId(id)));
    }
    assert_eq!(h.complete(1), vec![]);
    assert_eq!(h.s.queued(), 0);
    assert_eq!(pool.available(), pool.capacity(), "every prompt slot came back");
}

/// A reload that raises `max_queued` grows the prompt pool with the arena: every request the
/// new limit queues gets a prompt slot (before, the pool kept its starting size and those
/// past it went without their blocks), and they all come back when the requests end.
#[test]
fn a_raised_max_queued_grows_the_prompt_pool() {
    let mut h = H::new(Params { max_queued: 2, ..params(1, 1) });
    let pool = h.s.prompt_pool().expect("prefix-cost has a pool");
    let before = pool.capacity();
    let mut out = Vec::new();
    h.s.reconfigure(h.now, Params { max_queued: 40, ..params(1, 1) }, &[true], &mut out);
    assert!(pool.capacity() >= 41, "{before} slots grew to {}", pool.capacity());
    // `arrive` takes a slot for each request and fails if none is free.
    for id in 1..=41 {
        h.arrive(id, None, &chain(id * 100, 2), BLOCK_TOKENS * 2, false);
    }
    assert_eq!(h.s.queued(), 40);
    for id in 2..=41 {
        h.send(Input::Cancel(RequestId(id)));
    }
    assert_eq!(h.complete(1), vec![]);
    assert_eq!(pool.available(), pool.capacity(), "every prompt slot came back");
}

/// A prompt sent to a backend already prefilling joins that prefill's steps and delays it: its
/// uncached tokens count again there, [`super::JOIN_WEIGHT`] times per pending prefill. Backend
/// 0 decodes one sequence (125 tokens of cost), backend 1 prefills a one-block prompt (64 of
/// backlog); a ten-block prompt no backend holds costs 125 + 640 on backend 0 and
/// 64 + 640 + 2 × 640 on backend 1. Without the rule backend 1 is cheaper (704).
#[test]
fn a_prompt_goes_to_a_backend_not_already_prefilling() {
    let mut h = H::new(params(2, 8));
    assert_eq!(h.arrive(1, None, &chain(100, 1), BLOCK_TOKENS, true), vec![(1, 0)]);
    h.first_byte(1);
    assert_eq!(h.arrive(2, None, &chain(200, 1), BLOCK_TOKENS, true), vec![(2, 1)]);
    assert_eq!(h.s.backend_prefill_tokens(1), u64::from(BLOCK_TOKENS));
    assert_eq!(h.arrive(3, None, &chain(300, 10), 10 * BLOCK_TOKENS, true), vec![(3, 0)]);
    // Once backend 1's prefill is done, it is the cheaper again: no decode there.
    h.first_byte(2);
    h.first_byte(3);
    h.complete(2);
    assert_eq!(h.arrive(4, None, &chain(400, 10), 10 * BLOCK_TOKENS, true), vec![(4, 1)]);
}

/// Of backends of different learned speeds, a prompt no backend holds goes where it would be
/// done soonest: the tokens every backend would compute are weighed as its own prefill, not as
/// [`super::CACHE_WEIGHT`] times it. Backend 0 is learned 10 % faster and decodes one sequence
/// that holds a quarter of its engine's KV cache (125 tokens); a ten-block prompt (640 tokens)
/// costs 125 + 640 there, 640 × 1.1 = 704 on backend 1. Weighted eight times, it would cost
/// 125 + 5,120 against 5,632, and go to backend 0 whatever its queue (and every such prompt
/// with it, on a few per cent of a rate's error).
#[test]
fn an_uncached_prompt_goes_where_it_would_be_done_soonest() {
    let mut h = H::new(params(2, 8));
    h.send(report(0, EngineCache { kv_capacity_tokens: 4 * BLOCK_TOKENS, ..EngineCache::UNKNOWN }));
    assert_eq!(h.arrive(1, None, &chain(100, 1), BLOCK_TOKENS, true), vec![(1, 0)]);
    h.first_byte(1);
    assert_eq!(h.s.backend_estimates(0).decode_weight, 125);
    h.s.learned.prefill[0].rate = (110, 100);
    h.s.learned.prefill[1].rate = (100, 100);
    assert_eq!(h.arrive(2, None, &chain(200, 10), 10 * BLOCK_TOKENS, true), vec![(2, 1)]);
}

/// A backend whose engine never had a second request waiting closes no rate window; until one
/// does, it is compared with the fastest by the requests each served alone
/// (`estimate::Learned::drain_rate`), not taken to be as fast. Backend 0 has learned 10
/// tokens per tick and prefilled ten blocks (640 tokens) alone in 64 ticks; backend 1 prefilled
/// ten blocks alone in 256, a quarter as fast. A ten-block prompt no backend holds then costs
/// 640 + 125 (the sequence backend 0 decodes) there and 640 × 4 on backend 1. Taken to be as
/// fast as backend 0, backend 1 would cost 640, and take it. (Both engines' decode speeds are
/// known, alike, from their inter-token counters: none is left to explore.)
#[test]
fn a_backend_without_a_rate_is_compared_by_the_requests_it_served_alone() {
    let mut h = H::new(params(2, 8));
    same_decode_speed(&mut h);
    assert_eq!(h.arrive(1, None, &chain(100, 10), 10 * BLOCK_TOKENS, true), vec![(1, 0)]);
    h.now = 64;
    h.first_byte(1);
    h.s.learned.prefill[0].rate = (10, 1);
    assert_eq!(h.arrive(2, None, &chain(200, 10), 10 * BLOCK_TOKENS, true), vec![(2, 1)]);
    h.now = 64 + 256;
    h.first_byte(2);
    h.complete(2);
    assert_eq!(h.s.learned.drain_rate(1), (2_500_000, 1_000_000));
    assert_eq!(h.arrive(3, None, &chain(300, 10), 10 * BLOCK_TOKENS, true), vec![(3, 0)]);
}

/// Learned rates within [`RATE_TOLERANCE_PERCENT`] of the fastest count as the fastest: two idle
/// backends, backend 1 learned half again as fast as backend 0, cost a prompt alike, and the
/// tie goes to backend 0 (weighed at its own rate, backend 0 would cost it 1.5 times as much).
/// Three times as fast is beyond the tolerance: the prompt goes to backend 1.
#[test]
fn rates_within_the_tolerance_of_the_fastest_count_as_the_fastest() {
    let mut h = H::new(params(2, 8));
    h.s.learned.prefill[0].rate = (10, 1);
    h.s.learned.prefill[1].rate = (15, 1);
    assert_eq!(h.arrive(1, None, &chain(100, 10), 10 * BLOCK_TOKENS, true), vec![(1, 0)]);
    h.first_byte(1);
    h.complete(1);
    h.s.learned.prefill[1].rate = (30, 1);
    assert_eq!(h.arrive(2, None, &chain(200, 10), 10 * BLOCK_TOKENS, true), vec![(2, 1)]);
}

/// Of two backends with equal prefill backlogs, a prompt goes to the one whose engine began on
/// its backlog longer ago: the cost counts the backlog less what the backend's learned rate has
/// cleared since (a request counts in the backlog until its first byte, but the engine began on
/// it earlier). Both rates are one token per tick. Backend 1 took a ten-block prompt at tick 0;
/// backend 0, idle after its first request's first byte and end, took one at tick 500. At tick
/// 600 a third ten-block prompt costs 640 − 100 + 640 + 2 × 640 on backend 0 and 640 − 600 +
/// 640 + 2 × 640 on backend 1. Counted whole, the backlogs tie, and the tie goes to backend 0
/// (equal inflight, the lower index).
#[test]
fn a_prompt_goes_where_the_engine_began_on_its_backlog_earlier() {
    let mut h = H::new(params(2, 8));
    let tokens = 10 * BLOCK_TOKENS;
    assert_eq!(h.arrive(1, None, &chain(100, 10), tokens, true), vec![(1, 0)]);
    assert_eq!(h.arrive(2, None, &chain(200, 10), tokens, true), vec![(2, 1)]);
    h.now = 100;
    h.first_byte(1);
    h.complete(1);
    h.s.learned.prefill[0].rate = (1, 1);
    h.s.learned.prefill[1].rate = (1, 1);
    h.now = 500;
    assert_eq!(h.arrive(3, None, &chain(300, 10), tokens, true), vec![(3, 0)]);
    assert_eq!(h.s.backend_prefill_tokens(0), h.s.backend_prefill_tokens(1));
    h.now = 600;
    assert_eq!(h.arrive(4, None, &chain(400, 10), tokens, true), vec![(4, 1)]);
}

/// A non-streaming prompt shows no first byte, but its tokens count as prefill left on its
/// backend until an end says otherwise (no rate is known here to drain them), for the
/// streaming requests placed after it: their clients wait for the first token, behind it. A
/// non-streaming request's client waits for the whole response, and its cost counts the
/// sequences decoding there instead. Backend 0 takes a twenty-block non-streaming prompt
/// (1,280 tokens), backend 1 a one-block one; a third, one-block and non-streaming, sees one
/// decoding sequence on each (125 tokens of cost) and its tie goes to backend 0; a fourth to
/// backend 1. A streaming one-block prompt then costs 1,344 + 250 + 64 on backend 0 and
/// 64 + 250 + 64 on backend 1 (a tie without the prefill left, which would go to backend 0).
/// A scrape that finds nothing waiting does not clear the prompts backend 0 began; the long
/// one's end does.
#[test]
fn a_non_streaming_prompt_counts_as_prefill_left_for_streams_until_it_ends() {
    let mut h = H::new(params(2, 8));
    assert_eq!(h.arrive(1, None, &chain(100, 20), 20 * BLOCK_TOKENS, false), vec![(1, 0)]);
    assert_eq!(h.arrive(2, None, &chain(200, 1), BLOCK_TOKENS, false), vec![(2, 1)]);
    assert_eq!(h.arrive(3, None, &chain(300, 1), BLOCK_TOKENS, false), vec![(3, 0)]);
    assert_eq!(h.arrive(4, None, &chain(400, 1), BLOCK_TOKENS, false), vec![(4, 1)]);
    assert_eq!(h.arrive(5, None, &chain(500, 1), BLOCK_TOKENS, true), vec![(5, 1)]);
    h.send(report(0, EngineCache::UNKNOWN));
    assert_eq!(h.arrive(6, None, &chain(600, 1), BLOCK_TOKENS, true), vec![(6, 1)]);
    h.complete(1);
    assert_eq!(h.arrive(7, None, &chain(700, 1), BLOCK_TOKENS, true), vec![(7, 0)]);
}

/// A streamed prompt's cost counts [`super::FIRST_TOKEN_STEPS`] steps at its backend's decode
/// gap beyond the least, the whole difference once the gap is more than twice the least. Both
/// backends clear a token a tick; backend 0 steps at 10 ticks a token and has a ten-block
/// prompt pending, so a second one costs 640 + 640 + 2 × 640 = 2,560 there and 640 + steps ×
/// (gap − 10) on idle backend 1, the same at a gap of 10 + 1,920 / steps. Five ticks above that
/// it goes to backend 0, five below to backend 1 (counted beyond twice the least instead, five
/// above would go to backend 1 too), and at twice the least to backend 1.
#[test]
fn a_streamed_prompt_counts_the_longer_steps_of_its_backend() {
    let even = 10 + 1920 / super::FIRST_TOKEN_STEPS;
    for (gap, to) in [(even + 5, 0), (even - 5, 1), (20, 1)] {
        let mut h = H::new(params(2, 8));
        for b in 0..2 {
            h.s.learned.prefill[b].rate = (1, 1);
        }
        h.s.learned.decode[0].gap = 10 * decode::GAP_SCALE;
        h.s.learned.decode[1].gap = gap * decode::GAP_SCALE;
        let tokens = 10 * BLOCK_TOKENS;
        assert_eq!(h.arrive(1, None, &chain(100, 10), tokens, true), vec![(1, 0)]);
        let placed = h.arrive(2, None, &chain(200, 10), tokens, true);
        assert_eq!(placed, vec![(2, to)], "backend 1 at {gap} ticks a token");
    }
}

/// Of backends that cost a prompt alike and have as many requests in flight (every idle backend
/// before anything is learned), the one whose engine exported the larger KV capacity takes it,
/// then the lower index: where a fleet's first sessions land, and their prefixes with them,
/// does not depend on the order of its backends in the configuration.
#[test]
fn a_tie_goes_to_the_larger_kv_capacity_then_the_lower_index() {
    for (capacities, to) in [([50_000, 100_000], 1), ([100_000, 50_000], 0), ([0, 0], 0)] {
        let mut h = H::new(params(2, 8));
        for (b, capacity) in capacities.into_iter().enumerate() {
            h.s.learned.cache[b].kv_capacity_tokens = capacity;
        }
        let placed = h.arrive(1, None, &chain(100, 10), 10 * BLOCK_TOKENS, true);
        assert_eq!(placed, vec![(1, to)], "capacities {capacities:?}");
    }
}
