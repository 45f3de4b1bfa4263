//! The terms of S16's cost (`placement`), their weights and their arithmetic: how much a
//! token of backlog, a token computed for lack of a cache hit, a prefill joined, a decoding
//! sequence, a longer engine step and a slower decode weigh, and how work on one backend is
//! put in the fastest backend's time. Each weight was chosen by measurement in the fleet lab;
//! its doc says which and where in `perf/RESULTS.md`. `placement` sums the terms per backend and
//! picks; the reference model (`reference::placement`) restates them from these constants.

use crate::clock::Tick;

use super::decode::{GAP_SCALE, GAP_TOLERANCE_PERCENT};
use super::estimate::cleared;
use super::policy::Backend;

/// How much slower than the fastest a backend's learned prefill rate must be before the cost
/// weighs its work at its own rate: rates closer than that count as the fastest. Engines of one
/// kind learn rates that differ by load and by how prompts of different lengths share steps
/// (`estimate`, "Prefill rate"): on 10k-token documents with short follow-ups, two identical
/// H100s learned rates up to 4x apart, while an L4 and an H100 learn about 4x (their prefill
/// capacities differ 3.6x). Weighed as real, that noise sent one of two equal engines the
/// larger share of sessions (all p99 1.16x `cache_aware`'s there, 0.97x with the tolerance and
/// the window rule together); 100 % keeps the engines of another kind apart
/// (`perf/RESULTS.md`, nineteenth session).
pub const RATE_TOLERANCE_PERCENT: u64 = 100;

/// How much more a token the engine must compute for lack of a cache hit costs than a token of
/// backlog, in a backend's cost. A token of backlog delays this request; a token computed for
/// lack of a cache hit delays this request as much *and* takes engine time from everyone after
/// it, and the prefix it then leaves cached on this backend is the one its next turn will look
/// for. Chosen by measurement over traces, engine profiles and loads (`perf/RESULTS.md`):
/// weight 1, the request's own TTFT alone, sent about a fifth of the follow-ups that would have
/// found their prefix away from it under load.
///
/// Only the tokens a backend would compute *beyond* the least any usable backend would are
/// weighed so; the tokens every backend would compute are the request's own prefill wherever it
/// goes, weight 1. The order of backends of one speed is the same either way; between backends
/// of learned rates that differ, the cost is then the request's predicted delay and not eight
/// times its prefill, which let a few per cent of error in a learned rate decide where every
/// request no backend had cached went (`perf/RESULTS.md`, eleventh session, "Where the
/// RAGPulse tail came from").
pub const CACHE_WEIGHT: u64 = 8;

/// What a token a request would compute on a backend adds to the cost there, per request that
/// backend is already prefilling (admitted, streaming, no first byte yet). An engine batches
/// the prompts waiting for prefill into its next steps, up to its token budget per step
/// (vLLM's chunked prefill, `max_num_batched_tokens`), so a prompt sent to an engine with
/// prefills pending delays each of them by about its own prefill, which the backlog term (this
/// request's own wait) does not count. Without it, an engine already prefilling was about as
/// likely a choice as an idle one at an equal backlog, and in fleets of four and eight engines
/// on RAGPulse the first-turn p90 ran 1.13-1.28x sglang-router's `cache_aware`. Chosen by
/// measurement (`perf/RESULTS.md`, eleventh session, "Two changes to the cost"): weight 2
/// against 1 and 3 over 16 cells of two to eight engines.
pub const JOIN_WEIGHT: u64 = 2;

/// The engine steps a streamed request's cost counts at its backend's decode gap beyond the
/// least (`step_slower`): its first token comes at the end of the step that finishes its
/// prefill, which starts after the step under way when it arrives. A step has a fixed part (the
/// engine's launch and its decoding batch) that every prompt in it pays once. The learned rate
/// spreads that part over the tokens of the prompts it saw, so for short prompts the cost counts
/// the prefills pending on an engine as if each took steps of its own, where the engine batches
/// them into one; and an engine whose steps are longer costs its requests more than its rate
/// shows. In the sim's profiles an H100's step starts at 6 ms and an L4's at 27: one-shot
/// requests of a few hundred tokens went to an idle L4 as soon as a few were pending on the
/// H100, whose next step would have taken them all (first-turn p90 1.6-2.3x sglang-router's
/// `cache_aware`, which sends them all to the H100; 1.00-1.07x with 3 steps). A step and a half
/// is what the first token waits on an engine with work (half the step under way, then its
/// own); the rest stands for what the rate misses on the fast engine, whose pending short
/// prompts the backlog counts at a rate that includes a step's fixed part each. 3 was chosen by
/// measurement over 2 (`perf/RESULTS.md`, twentieth session), and 4 over 3 and 5 on fleets
/// whose engines differ in the fixed part alone (an H100 beside one whose steps start at 20 ms:
/// the agent workload's first-turn p90 1.27-1.30x `cache_aware`'s with 3, 1.03-1.11x with 4)
/// and on the mixed fleets by short-prompt shapes, level elsewhere (twenty-first session).
pub const FIRST_TOKEN_STEPS: u64 = 4;

/// What a sequence a backend is decoding (admitted, first byte seen) adds to its cost, in
/// tokens: [`DECODE_WEIGHT_KV`] times the square of the backend's KV pressure
/// (`pressure_micro`, in millionths; `Scheduler::kv_pressure`): the larger of its engine's KV
/// usage averaged over its last scrapes (`cache_model::CacheModel::kv_usage`) and the router's own
/// count, the estimated tokens of the prompts it has on that engine past their prefill (a
/// stream after its first byte, a whole response from its admission) over the engine's
/// exported KV capacity.
///
/// A decoding sequence holds the engine's KV cache until it ends, so on an engine whose cache
/// the workload fills, a backend decoding more starts a new prefill later, which the prefill
/// backlog does not show; on an engine with room to spare it delays the next prefill by little
/// more than its share of a step, and weighing it as much sends follow-ups away from their
/// cached prefixes for nothing. The square keeps the weight small until the cache runs more
/// than half full. The scrapes' average lags a cache that long contexts fill in seconds; the
/// router's count follows each admission at once, but knows neither the engine's prefix
/// sharing nor what it has evicted, so it only ever raises the pressure. A prompt still in
/// prefill is not counted: the engine may hold it waiting, and the prefill backlog weighs it.
///
/// Chosen by measurement over ten engine models, two traces, two synthetic workloads and two
/// loads in the fleet model (`perf/RESULTS.md`, "A decode weight learned from the KV
/// pressure", and the eighteenth session's "The router's count of the contexts it holds"):
/// against the constant 1,000 tokens it replaced, the worst all-request TTFT p99 against
/// sglang-router's `cache_aware` went from 2.3x to 1.25x (a chat workload of short prompts and
/// long answers). The count took the all-request p99 of the coder workload on engines with a
/// small KV cache to 0.15-0.88x what the averaged pressure alone gave, which let the floor of
/// 125 tokens per sequence the averaged pressure needed there go (it cost the chat workload a
/// tenth of its first-turn p90 on engines with room to spare) where the engine exports a KV
/// capacity; where it exports none there is no count, and the floor stays
/// ([`DECODE_WEIGHT_BLIND`], `Scheduler::decode_weight`).
pub const fn decode_weight(pressure_micro: u64) -> u64 {
    let p = if pressure_micro < 1_000_000 { pressure_micro } else { 1_000_000 };
    DECODE_WEIGHT_KV * (p * p / 1_000_000) / 1_000_000
}

/// The decode weight of a full KV cache ([`decode_weight`]).
pub const DECODE_WEIGHT_KV: u64 = 2000;

/// What a decoding sequence weighs beyond [`decode_weight`] on a backend whose engine exports
/// no KV capacity (an `openai` backend, or an engine without the metric), so the router has
/// no count of its own there: the floor every backend had before the count, measured then to
/// keep caches that long contexts fill from taking more than their share (perf/RESULTS.md,
/// "The decode weight's floor, measured again").
pub const DECODE_WEIGHT_BLIND: u64 = 125;

/// What is left of `backend`'s prefill backlog by estimate: the backlog less what its engine
/// clears at its learned `rate` (tokens per tick) from `prefill_since` to `now`, and all of it
/// while the rate is unknown. The backlog counts a request until its first byte, but the engine
/// began on it earlier; of two backends with equal backlogs, the one that began longer ago
/// finishes first.
pub(super) fn remaining_backlog(backend: &Backend, rate: (u64, u64), now: Tick) -> u64 {
    let elapsed = now.saturating_sub(backend.prefill_since);
    backend.prefill_tokens.saturating_sub(cleared(elapsed, rate))
}

/// The gap up to which a backend's decode does not count: [`GAP_TOLERANCE_PERCENT`] above the
/// `least` (0 when no gap is known).
pub(super) fn tolerated_gap(least: u64) -> u64 {
    least.saturating_add(least / 100 * GAP_TOLERANCE_PERCENT)
}

/// How much longer than the least gap's a step of a backend of decode gap `gap` is, as a
/// streamed request's cost counts it: all of the difference once `gap` is more than
/// [`GAP_TOLERANCE_PERCENT`] above the `least`, none within it (engines of one kind differ by
/// load alone); 0 when no gap is known.
pub(super) fn step_slower(gap: u64, least: u64) -> u64 {
    if least == 0 || gap <= tolerated_gap(least) {
        0
    } else {
        gap - least
    }
}

/// What decoding `output` tokens at a gap `slower` (`1 / GAP_SCALE` ticks per token) more than
/// the least adds to a whole response's wait, in tokens of the `fastest` backend's prefill
/// time; 0 while that rate is unknown.
pub(super) fn decode_delay(output: u64, slower: u64, fastest: (u64, u64)) -> u64 {
    if output == 0 || slower == 0 || fastest.0 == 0 {
        return 0;
    }
    let tokens = u128::from(output) * u128::from(slower) * u128::from(fastest.0)
        / (u128::from(GAP_SCALE) * u128::from(fastest.1));
    u64::try_from(tokens).unwrap_or(u64::MAX)
}

/// `work` tokens on a backend of prefill rate `rate`, expressed in tokens of the `fastest`
/// backend's time: `work × fastest / rate`. Unknown rates count as the fastest, and so do rates
/// within [`RATE_TOLERANCE_PERCENT`] of it.
pub(super) fn at_rate(work: u64, rate: (u64, u64), fastest: (u64, u64)) -> u64 {
    if rate.0 == 0 || fastest.0 == 0 || within_tolerance(rate, fastest) {
        return work;
    }
    let scaled = u128::from(work) * u128::from(fastest.0) * u128::from(rate.1)
        / (u128::from(fastest.1) * u128::from(rate.0));
    u64::try_from(scaled).unwrap_or(u64::MAX)
}

/// Whether `rate` is within [`RATE_TOLERANCE_PERCENT`] of `fastest` (both known): `fastest /
/// rate` at most `1 + tolerance / 100`.
pub(super) fn within_tolerance(rate: (u64, u64), fastest: (u64, u64)) -> bool {
    u128::from(fastest.0) * u128::from(rate.1) * 100
        <= u128::from(rate.0) * u128::from(fastest.1) * u128::from(100 + RATE_TOLERANCE_PERCENT)
}
