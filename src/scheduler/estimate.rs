//! What the scheduler learns online about its model and each backend (issue \[8\]), so that the
//! operator does not have to: how many tokens a byte of prompt is, how fast each engine
//! prefills, the admission budget that keeps each engine fed without queueing inside it, and
//! how much of its prompts the prefix index should remember. How fast each backend decodes and
//! how long the model's answers run are learned in `decode` and held here, in [`Learned`].
//!
//! Everything here is sans-IO and deterministic, like the rest of the scheduler: it is fed
//! the events the scheduler already sees (an admission, a first response byte, a completion
//! with the engine's `usage`, a control-thread snapshot), stamped with their tick, and it uses
//! integer arithmetic only, so that the scheduler's reference model can restate it exactly.
//! Nothing allocates after construction; the work per event is a handful of additions, and a
//! window of [`WINDOW_EVENTS`] first bytes closes with a sort of [`RATE_WINDOWS`] values on
//! the stack.
//!
//! ## Tokens per byte ([`TokenRate`], per model)
//!
//! The backlog is counted in tokens but a request arrives as bytes. Each completion whose
//! response carried `usage.prompt_tokens` adds (body bytes, prompt tokens) to two sums; an
//! estimate is `bytes × tokens / bytes`. When the byte sum passes [`TOKEN_RATE_HORIZON`] both
//! sums are halved, so the ratio follows a change of client or tokenizer within a few
//! megabytes of traffic. Until the first sample the ratio is 1 token per 4 bytes (OpenAI's
//! rule of thumb for English text, and SPEC S6.3's former constant).
//!
//! ## Prefill rate ([`Prefill::rate`], per backend)
//!
//! The router sees an engine finish a request's prefill as the request's first response byte. The
//! rate is measured only over *clean* intervals, in which the engine had warmpath's next request
//! already waiting when it finished the previous one: a first byte counts when its request was
//! admitted before the backend's previous first byte, and then the time since that previous first
//! byte is its service time, with neither idle time nor the trip to the engine in it.
//! [`WINDOW_EVENTS`] such first bytes close a window `(tokens, ticks)` (the requests' estimated
//! uncached tokens over their service times), once no one request is more than a
//! [`WINDOW_DOMINANCE`]th of its tokens (or at [`WINDOW_EVENTS_MAX`] first bytes). An engine that
//! batches prefills does not serve them one after another: short prompts that share steps with a
//! long one reach their first bytes first, so the service times the long one took are charged to
//! the short ones and its tokens land after them, maybe in the next window. A window that ends
//! between the two then reads a rate several times too low or too high. On a workload of 10k-token
//! documents followed by short follow-ups, two identical H100s learned rates up to four times
//! apart, and the placement sent the slower-looking one the wrong share of sessions (all p99 1.16x
//! `cache_aware`'s; `perf/RESULTS.md`, nineteenth session); a window that holds several long
//! prompts takes the boundary's error a few times smaller. The rate is the median of the last
//! [`RATE_WINDOWS`] windows (ordered exactly, by cross-multiplication), robust to the outlier
//! windows that a preemption or a burst of long decodes makes. It follows a step change in engine
//! speed within about half of [`RATE_WINDOWS`] windows. Decode interference (long steps because
//! many sequences decode) lowers the measured rate, as it should: it is the rate at which this
//! engine, as loaded, clears prefill. The rate ranks backends of different speeds in prefix-cost
//! placement and is exported; the budget does not depend on it.
//!
//! An engine that seldom has a second request waiting (a light load, or a slow engine in a
//! mixed fleet that few sessions live on) closes no window for a long time: in the fleet lab's
//! coder workload on an H100 and an L4 at 0.9 of their capacity, half its sessions streaming,
//! the L4 had 8 clean first bytes in 96 and closed its first window after 558 of 1,978 seconds.
//! Each backend therefore also sums the estimated tokens and the times from admission to first
//! byte of the requests that had its prefill to themselves (no first byte there since their
//! admission, none other pending at theirs): its *rate served alone*
//! ([`Prefill::alone_rate`]). The trip to the engine, the step a request lands in and any
//! non-streaming prefill beside it are in those times, so it errs slow, by as much as the
//! engine is busy: taken as a rate (tried first), it made an H100 that had not closed a window
//! look a third as fast as its twin that had, and on RAGPulse with half the sessions streaming
//! the streaming first-turn p90 went from 1.07x `cache_aware`'s to 1.30x. What it is good for
//! is comparing engines that err alike: a backend without a window is taken to clear at the
//! fastest backend's rate times the ratio of their rates served alone
//! ([`Learned::drain_rate`]), and at the fastest's only when either has none. (Before, a
//! backend without a window was taken to be as fast as the fastest, and in that coder cell the
//! L4 took 24 of the 397 sessions while the H100 had room, 46 when every session streams;
//! `perf/RESULTS.md`, fifteenth session.)
//!
//! Non-streaming requests give no first byte before their end, so a backend serving only those
//! learns no rate; one that has learned none is taken to clear as fast as the fastest that has
//! ([`Learned::drain_rate`]), as S16's cost takes an unknown rate to be. (A rate from the
//! engine's prefix-cache counters over scrape intervals busy at both ends was tried: placing
//! non-streaming requests at it made their whole responses later in the fleet lab,
//! `perf/RESULTS.md`, fourteenth session.)
//!
//! ## The admission budget ([`Prefill::budget`], per backend)
//!
//! A backend is eligible while its prefill backlog (estimated uncached tokens of admitted
//! streaming requests without a first byte, SPEC S6.3) is below its budget. With `auto`, the
//! budget is a controller in the spirit of TCP Vegas (Brakmo and Peterson, "TCP Vegas: End to
//! End Congestion Avoidance on a Global Internet", IEEE JSAC 13(8), 1995), which keeps a small
//! steady queue at the bottleneck instead of probing until it overflows, and of Netflix's
//! concurrency-limits (its `VegasLimit` and `GradientLimit`), which apply the idea to a
//! server's concurrency. The bottleneck is the engine, and its queue is visible: the engine's
//! waiting gauge (`vllm:num_requests_waiting`), of which warmpath takes its own pending
//! requests (streaming, no first byte yet) to be the waiting ones, up to their number. At each
//! snapshot in which the budget held requests back ([`Prefill::engine_queue`]), the budget
//! moves to keep [`WAITING_TARGET`] of warmpath's requests waiting in the engine: a quarter
//! larger when none waits although more than that many are pending (every request sent is
//! running: the engine would run dry when they finish), an eighth smaller when more wait (they
//! wait in the engine's arrival order, where warmpath can no longer put a follow-up first).
//! Multiplicative in both directions, within [`BUDGET_MIN`] and [`BUDGET_MAX`], from
//! [`BUDGET_UNLEARNED`]. An engine that slows down, a KV cache too full to start more requests,
//! or someone else's load all show up as waiting requests and close the budget; an engine that
//! batches more runs more at once and opens it. The rule that a backend with nothing pending
//! always takes one request (S6.3) stays: it lets a prompt larger than the budget through.
//!
//! A request sent while the engine is in a step waits for the next one, room or not, and a
//! scrape finds all of those waiting: out of warmpath's waiting requests the controller counts
//! as many as warmpath sent to the backend per engine step, at the rate it sent them since the
//! last snapshot, the step being the backend's decode gap (`decode`; none while it is unknown).
//! At a few requests a step that is none, and the controller is as above. At a thousand short
//! prompts a second into engines of 50 ms steps, dozens waited at every scrape although the
//! engines started them all at their next step: the budget fell to its floor, which held a
//! fifth of what the engines could run, and warmpath's queue grew without bound (fleet lab,
//! perf/RESULTS.md, twenty-third session).
//!
//! This was chosen by measurement (perf/RESULTS.md, issue \[8\], "What the lab found") over a
//! BBR-like budget (`gain × measured rate × feedback latency`, Cardwell et al., ACM Queue
//! 14(5), 2016) that an earlier version of this module used: the feedback latency, measured
//! as the residual of a first byte over the work ahead of it, is mostly the engine step the
//! request lands in, and under load it swung a hundredfold, and the budget with it.
//!
//! ## The inflight cap ([`next_cap`], per backend)
//!
//! S6.1 caps a backend's inflight requests as a safety bound, to be sized like the engine's own
//! limit on running sequences (vLLM's `--max-num-seqs`, SGLang's `--max-running-requests`). No
//! metric of either engine exports that limit, and it differs by GPU and version: vLLM's V1
//! default is 1,024 on a GPU of 70 GiB or more other than an A100 and 256 on the rest
//! (`vllm/engine/arg_utils.py`, `get_batch_defaults`). A cap of 256 in front of an engine that
//! runs 1,024 holds requests in warmpath that the engine would have started: short requests at
//! a high rate, or long decodes, then wait for a slot while the engine has room (in the fleet
//! lab, one-turn prompts of a few tokens at 0.95 of two engines with 50 ms steps and 1,024
//! sequences each: the queue grew without bound, TTFT p50 40 s against `cache_aware`'s 0.7 s,
//! which has no cap; `perf/RESULTS.md`, twenty-third session). With `inflight_per_backend =
//! "auto"`, each backend's cap starts at [`INFLIGHT_UNLEARNED`] and moves at each snapshot in
//! which it held requests back (the backend reached it since the last snapshot, or is at it,
//! and requests are queued), by the engine's waiting gauge as the budget reads it: a quarter
//! larger when at most [`WAITING_TARGET`] of warmpath's non-streaming requests and nobody
//! else's wait in the engine, an eighth smaller when more of warmpath's non-streaming ones
//! wait (the engine runs all it can, and they wait there out of warmpath's order), never below
//! the configured start and never above [`INFLIGHT_MAX`]. Warmpath's streaming requests waiting
//! there move the budget, not the cap: the budget bounds how many of those are sent, and no
//! budget bounds the non-streaming ones (their prefill shows no first byte). A backend whose
//! engine exports no waiting gauge keeps the start.
//!
//! What each backend's engine says of its caches (KV capacity, hit ratios, usage) and the
//! prefix index's calibration are learned in `cache_model`, and held here, in [`Learned`].

use crate::clock::Tick;

use super::cache_model::CacheModel;
use super::decode::{Decode, OutputLength};

/// First bytes per rate sample.
pub const WINDOW_EVENTS: u32 = 8;
/// A window of first bytes closes only once its tokens are at least this many times its
/// largest request's, or at [`WINDOW_EVENTS_MAX`] first bytes (module doc, "Prefill rate").
pub const WINDOW_DOMINANCE: u64 = 4;
/// First bytes after which a window closes whatever its largest request.
pub const WINDOW_EVENTS_MAX: u32 = 64;
/// Rate samples in the windowed maximum.
pub const RATE_WINDOWS: usize = 8;
/// Once the times to first byte of a backend's requests served alone sum past this many ticks,
/// both of its sums halve ([`Prefill::alone_rate`] follows the engine as it is now).
pub const ALONE_HORIZON: u64 = 1 << 40;
/// Warmpath's requests the budget aims to keep waiting (not started) in an engine's queue:
/// one, so that the engine has its next prefill when a running one finishes, and no more, so
/// that the rest of the queue is ordered in warmpath.
pub const WAITING_TARGET: u32 = 1;
/// Bounds of a learned budget, estimated tokens.
pub const BUDGET_MIN: u64 = 1024;
pub const BUDGET_MAX: u64 = 1 << 24;
/// The budget, in estimated tokens, before the rate and latency of a backend are known.
pub const BUDGET_UNLEARNED: u64 = 16_384;
/// A learned inflight cap's start and floor: S6.1's former default, vLLM's default
/// `max_num_seqs` on GPUs below 70 GB.
pub const INFLIGHT_UNLEARNED: u32 = 256;
/// The most a learned inflight cap grows to: vLLM's default `max_num_seqs` on large GPUs four
/// times over.
pub const INFLIGHT_MAX: u32 = 4096;
/// Body bytes after which the token-rate sums are halved.
pub const TOKEN_RATE_HORIZON: u64 = 1 << 24;

/// A backend's learned inflight cap after a snapshot (module doc, "The inflight cap"): `cap`
/// before it, `floor` the configured start, `unseen` warmpath's non-streaming requests and
/// `others` someone else's that the engine reports waiting, `capped` whether the cap held
/// requests back since the previous snapshot.
pub fn next_cap(cap: u32, floor: u32, unseen: u32, others: u32, capped: bool) -> u32 {
    if !capped {
        cap
    } else if unseen <= WAITING_TARGET && others == 0 {
        (cap + cap.div_ceil(4)).min(INFLIGHT_MAX.max(floor))
    } else if unseen > WAITING_TARGET {
        (cap - cap / 8).max(floor)
    } else {
        cap
    }
}

/// Tokens per byte of request body, learned from responses' `usage.prompt_tokens`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TokenRate {
    tokens: u64,
    bytes: u64,
    /// Samples taken, and the tick of the last one.
    pub samples: u64,
    pub updated_at: Tick,
}

impl Default for TokenRate {
    fn default() -> Self {
        TokenRate::NEW
    }
}

impl TokenRate {
    /// Nothing learned: 1 token per 4 bytes.
    pub const NEW: TokenRate = TokenRate { tokens: 1, bytes: 4, samples: 0, updated_at: 0 };

    /// A completed request had `bytes` of body and `tokens` of prompt by the engine's count.
    pub fn observe(&mut self, bytes: u32, tokens: u32, now: Tick) {
        if bytes == 0 || tokens == 0 {
            return;
        }
        if self.samples == 0 {
            (self.tokens, self.bytes) = (0, 0);
        }
        self.tokens += u64::from(tokens);
        self.bytes += u64::from(bytes);
        while self.bytes > TOKEN_RATE_HORIZON {
            self.tokens = self.tokens.div_ceil(2);
            self.bytes = self.bytes.div_ceil(2);
        }
        self.samples += 1;
        self.updated_at = now;
    }

    /// The estimated tokens of a body of `bytes` (at least 1 for a non-empty body).
    pub fn tokens(&self, bytes: u32) -> u32 {
        let estimate = u64::from(bytes) * self.tokens / self.bytes.max(1);
        u32::try_from(estimate).unwrap_or(u32::MAX).max(u32::from(bytes > 0))
    }

    /// The estimated tokens of `bytes`, however many.
    pub fn tokens_u64(&self, bytes: u64) -> u64 {
        u64::try_from(u128::from(bytes) * u128::from(self.tokens) / u128::from(self.bytes.max(1)))
            .unwrap_or(u64::MAX)
    }

    /// Tokens per byte, in millionths (for reports).
    pub fn per_byte_micro(&self) -> u64 {
        self.tokens * 1_000_000 / self.bytes.max(1)
    }
}

/// One backend's measured prefill rate and its learned admission budget.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prefill {
    /// When the last first byte from this backend arrived.
    last_first_byte: Tick,
    window_tokens: u64,
    window_ticks: u64,
    window_events: u32,
    /// The largest request's tokens in the window ([`WINDOW_DOMINANCE`]).
    window_largest: u64,
    /// Closed windows.
    windows: RateWindows,
    /// Estimated tokens and ticks (admission to first byte) of the first bytes of requests that
    /// had their backend's prefill to themselves ([`Prefill::alone_rate`]).
    alone: (u64, u64),
    /// The median of `windows`: the rate is `rate.0 / rate.1` tokens per tick; `(0, 0)`
    /// until the first window closes.
    pub rate: (u64, u64),
    pub rate_at: Tick,
    /// The budget in force under `auto`, estimated tokens, and when it last changed.
    pub budget: u64,
    pub budget_at: Tick,
}

impl Prefill {
    pub const NEW: Prefill = Prefill {
        last_first_byte: 0,
        window_tokens: 0,
        window_ticks: 0,
        window_events: 0,
        window_largest: 0,
        windows: RateWindows::NEW,
        alone: (0, 0),
        rate: (0, 0),
        rate_at: 0,
        budget: BUDGET_UNLEARNED,
        budget_at: 0,
    };

    /// The first byte of a request of `tokens` estimated tokens, admitted at `admitted_at`,
    /// arrived at `now`; `alone`: no other request of the backend's is pending prefill now.
    pub fn first_byte(&mut self, now: Tick, admitted_at: Tick, tokens: u64, alone: bool) {
        // A request admitted before the previous first byte was waiting at the engine when the
        // previous one finished: the time since then is its service, with no idle time in it.
        if admitted_at < self.last_first_byte {
            self.window_tokens += tokens;
            self.window_ticks += now - self.last_first_byte;
            self.window_events += 1;
            self.window_largest = self.window_largest.max(tokens);
            let diluted = self.window_tokens >= WINDOW_DOMINANCE * self.window_largest;
            if self.window_events >= WINDOW_EVENTS_MAX
                || (self.window_events >= WINDOW_EVENTS && diluted)
            {
                self.close_window(now);
            }
        } else if alone {
            // No first byte since its admission and none other pending: it had the engine's
            // prefill to itself, and its time to first byte is its service plus the trip.
            self.alone = (self.alone.0 + tokens, self.alone.1 + (now - admitted_at));
            if self.alone.1 > ALONE_HORIZON {
                self.alone = (self.alone.0 / 2, self.alone.1 / 2);
            }
        }
        self.last_first_byte = now;
    }

    /// The estimated tokens over the times to first byte of the requests that had this
    /// backend's prefill to themselves (`(0, 0)` before the first): a rate that errs slow by
    /// the trip and the step each landed in, for comparing backends that have no window with
    /// one that has ([`Learned::drain_rate`]).
    pub fn alone_rate(&self) -> (u64, u64) {
        if self.alone.0 > 0 {
            (self.alone.0, self.alone.1.max(1))
        } else {
            (0, 0)
        }
    }

    /// A snapshot at `now` says `waiting` of warmpath's `pending` streaming requests on this
    /// engine have not been started by it; `held_back`: the backlog reached the budget since the
    /// last snapshot and warmpath's queue still holds requests. Moves the budget so that the
    /// engine keeps [`WAITING_TARGET`] of warmpath's requests waiting.
    pub fn engine_queue(&mut self, now: Tick, waiting: u32, pending: u32, held_back: bool) {
        if !held_back {
            return;
        }
        let old = self.budget;
        if waiting < WAITING_TARGET && pending > WAITING_TARGET {
            // Every request sent is running: the engine could take more than the budget
            // lets through, and would run dry when they finish.
            self.budget = (old + old.div_ceil(4)).min(BUDGET_MAX);
        } else if waiting > WAITING_TARGET {
            // More is waiting inside the engine, in its arrival order, than it needs.
            self.budget = (old - old / 8).max(BUDGET_MIN);
        }
        if self.budget != old {
            self.budget_at = now;
        }
    }

    fn close_window(&mut self, now: Tick) {
        let sample = (self.window_tokens, self.window_ticks.max(1));
        (self.window_tokens, self.window_ticks, self.window_events) = (0, 0, 0);
        self.window_largest = 0;
        if sample.0 == 0 {
            return;
        }
        self.rate = self.windows.push(sample);
        self.rate_at = now;
    }

    /// Prefill rate in tokens per second at `ticks_per_second`, if measured.
    pub fn tokens_per_second(&self, ticks_per_second: f64) -> Option<f64> {
        (self.rate.0 > 0).then(|| self.rate.0 as f64 / self.rate.1 as f64 * ticks_per_second)
    }
}

/// The tokens an engine of prefill `rate` (tokens per tick; `(0, 0)` unknown, which clears
/// nothing) clears in `elapsed` ticks.
pub fn cleared(elapsed: Tick, rate: (u64, u64)) -> u64 {
    if rate.0 == 0 || rate.1 == 0 {
        return 0;
    }
    // One 64-bit division where the product fits, which it does but after hours idle: this
    // runs for every backend of every request the placement scan looks at.
    match elapsed.checked_mul(rate.0) {
        Some(product) => product / rate.1,
        None => {
            let cleared = u128::from(elapsed) * u128::from(rate.0) / u128::from(rate.1);
            u64::try_from(cleared).unwrap_or(u64::MAX)
        }
    }
}

/// `rate` times the ratio of the rates `of` to `to` (all `(tokens, ticks)`), that ratio in
/// millionths between 1 and 16,000,000; `None` when `of` or `to` is unknown.
pub fn scale_rate(rate: (u64, u64), of: (u64, u64), to: (u64, u64)) -> Option<(u64, u64)> {
    if of.0 == 0 || to.0 == 0 {
        return None;
    }
    let micro =
        u128::from(of.0) * u128::from(to.1) * 1_000_000 / (u128::from(of.1) * u128::from(to.0));
    let (mut tokens, mut ticks) =
        (u128::from(rate.0) * micro.clamp(1, 16_000_000), u128::from(rate.1) * 1_000_000);
    while (tokens > u128::from(u64::MAX) || ticks > u128::from(u64::MAX)) && ticks > 1 {
        (tokens, ticks) = (tokens >> 1, ticks >> 1);
    }
    Some((u64::try_from(tokens).unwrap_or(u64::MAX), ticks as u64))
}

/// The last [`RATE_WINDOWS`] rate samples `(tokens, ticks)`, a ring, and their median.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct RateWindows {
    samples: [(u64, u64); RATE_WINDOWS],
    next: usize,
    len: usize,
}

impl RateWindows {
    const NEW: RateWindows = RateWindows { samples: [(0, 0); RATE_WINDOWS], next: 0, len: 0 };

    /// Adds `sample` (over the oldest when full); returns the median of the samples.
    fn push(&mut self, sample: (u64, u64)) -> (u64, u64) {
        self.samples[self.next] = sample;
        self.next = (self.next + 1) % RATE_WINDOWS;
        self.len = (self.len + 1).min(RATE_WINDOWS);
        // The median by rate (ties by tokens, then ticks: a total order, so the median does not
        // depend on where the samples sit in the ring).
        let mut sorted = self.samples;
        let live = &mut sorted[..self.len];
        live.sort_unstable_by(|&a, &b| rate_order(a, b));
        live[live.len() / 2]
    }
}

/// Rates `(tokens, ticks)` ordered slowest first, ties by tokens then ticks.
pub fn rate_order(a: (u64, u64), b: (u64, u64)) -> std::cmp::Ordering {
    let (x, y) = (u128::from(a.0) * u128::from(b.1), u128::from(b.0) * u128::from(a.1));
    x.cmp(&y).then(a.0.cmp(&b.0)).then(a.1.cmp(&b.1))
}

/// A backend's learned estimates as reports show them, each with the tick it last changed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BackendEstimates {
    /// Prefill rate as `(tokens, ticks)`; `(0, 0)` until measured.
    pub rate: (u64, u64),
    pub rate_at: Tick,
    /// When a learned budget last changed.
    pub budget_at: Tick,
    /// The budget in force (0 = none), learned or fixed.
    pub budget: u64,
    /// The inflight cap in force (S6.1), learned or fixed.
    pub inflight_cap: u32,
    /// KV capacity the engine exported, tokens (0: never), and when.
    pub kv_capacity_tokens: u64,
    pub kv_capacity_at: Tick,
    /// Hit ratios of the last calibration period, millionths: predicted by the index and
    /// found by the engine; and the engine's counters' ratio over its last scrape interval.
    pub predicted_hit_micro: u64,
    pub engine_hit_micro: u64,
    pub hit_ratio_at: Tick,
    pub counter_hit_micro: Option<u64>,
    pub counter_at: Tick,
    /// Blocks the prefix index may hold (0 without prefix-cost).
    pub index_capacity: u64,
    /// Restarts of its engine seen in its counters, and when the last was seen.
    pub restarts: u64,
    pub restarted_at: Tick,
    /// Its KV usage averaged over the last scrapes (millionths) and when last reported; the
    /// router's count of the contexts it holds there against its KV capacity (millionths,
    /// `placement`'s held pressure); the decode weight the larger of the two sets in S16's
    /// cost (tokens per decoding sequence).
    pub kv_pressure_micro: u64,
    pub kv_pressure_at: Tick,
    pub kv_held_micro: u64,
    pub decode_weight: u64,
    /// Its decode gap ([`Decode::gap`]: ticks per output token of one sequence, in
    /// `1 / GAP_SCALE`; 0 before its first window of streamed responses closes) and when a
    /// window last closed, and the output tokens a non-streaming request of the model is
    /// expected to have (0 before the first).
    pub decode_gap: u64,
    pub decode_gap_at: Tick,
    pub expected_output: u64,
}

/// Everything a scheduler learns, and what it needs to remember per admitted request to learn
/// it. Allocated with the scheduler; per-request state is indexed by arena slot.
#[derive(Debug)]
pub(crate) struct Learned {
    pub tokens: TokenRate,
    /// Per backend.
    pub prefill: Vec<Prefill>,
    pub cache: Vec<CacheModel>,
    pub decode: Vec<Decode>,
    /// Of the model's non-streaming responses.
    pub output: OutputLength,
    /// Per arena slot, while admitted: what its request's admission left to learn from. For a
    /// streaming request, the admission tick (its first byte measures the prefill rate), then
    /// the first byte's (its end measures the decode speed); for a non-streaming one, its place
    /// in its backend's `unstreamed::UnstreamedBacklog` (its end moves the cursor there). One vector for both keeps a queued request within its memory
    /// budget (`tests::memory_per_queued_request_and_per_session`).
    pub admission: Vec<u64>,
    /// Per arena slot, while admitted: the tokens the request added to its backend's prefill
    /// backlog (streaming) or non-streaming backlog.
    pub backlog: Vec<u32>,
}

impl Learned {
    pub fn new(backends: usize, arena: usize) -> Learned {
        Learned {
            tokens: TokenRate::NEW,
            prefill: vec![Prefill::NEW; backends],
            cache: vec![CacheModel::NEW; backends],
            decode: vec![Decode::NEW; backends],
            output: OutputLength::NEW,
            admission: vec![0; arena],
            backlog: vec![0; arena],
        }
    }

    /// The fastest learned prefill rate among the backends, `(0, 0)` when none is known.
    pub fn fastest_rate(&self) -> (u64, u64) {
        self.fastest().map_or((0, 0), |b| self.prefill[b].rate)
    }

    /// The rate S16's cost puts a time in tokens at: the fastest learned prefill rate, else
    /// (no window closed yet) the fastest [`Prefill::alone_rate`], which errs slow; `(0, 0)`
    /// when neither is known.
    pub fn cost_rate(&self) -> (u64, u64) {
        let fastest = self.fastest_rate();
        if fastest.0 > 0 {
            return fastest;
        }
        let alone = self.prefill.iter().map(Prefill::alone_rate).filter(|r| r.0 > 0);
        alone.fold((0, 0), |best, r| {
            let faster = best.0 == 0
                || u128::from(r.0) * u128::from(best.1) > u128::from(best.0) * u128::from(r.1);
            if faster {
                r
            } else {
                best
            }
        })
    }

    /// The largest KV capacity the engines of the first `backends` backends exported, in
    /// tokens; 0 when none did.
    pub fn largest_kv_capacity(&self, backends: usize) -> u64 {
        self.cache.iter().take(backends).map(|c| c.kv_capacity_tokens).max().unwrap_or(0)
    }

    /// The backend of the fastest learned prefill rate (the first of equals), if any.
    fn fastest(&self) -> Option<usize> {
        let mut fastest: Option<(usize, (u64, u64))> = None;
        for (b, prefill) in self.prefill.iter().enumerate() {
            let rate = prefill.rate;
            if rate.0 > 0
                && fastest.is_none_or(|(_, f)| {
                    u128::from(rate.0) * u128::from(f.1) > u128::from(f.0) * u128::from(rate.1)
                })
            {
                fastest = Some((b, rate));
            }
        }
        fastest.map(|(b, _)| b)
    }

    /// The prefill rate `backend` is taken to clear at, by S16's cost and by the estimates of
    /// what is left of its backlogs: its own; else (no window closed yet) the fastest backend's
    /// rate times the ratio of their [`Prefill::alone_rate`]s, which err slow alike, when both
    /// have one; else the fastest's.
    pub fn drain_rate(&self, backend: u16) -> (u64, u64) {
        let own = &self.prefill[usize::from(backend)];
        if own.rate.0 > 0 {
            return own.rate;
        }
        let Some(f) = self.fastest() else { return (0, 0) };
        let fastest = &self.prefill[f];
        scale_rate(fastest.rate, own.alone_rate(), fastest.alone_rate()).unwrap_or(fastest.rate)
    }

    /// Room for `backends` backends and `arena` slots (a reconfiguration; never shrinks).
    pub fn grow(&mut self, backends: usize, arena: usize) {
        self.prefill.resize(backends.max(self.prefill.len()), Prefill::NEW);
        self.cache.resize(backends.max(self.cache.len()), CacheModel::NEW);
        self.decode.resize(backends.max(self.decode.len()), Decode::NEW);
        let arena = arena.max(self.admission.len());
        self.admission.resize(arena, 0);
        self.backlog.resize(arena, 0);
    }

    pub fn heap_bytes(&self) -> usize {
        self.prefill.capacity() * std::mem::size_of::<Prefill>()
            + self.cache.capacity() * std::mem::size_of::<CacheModel>()
            + self.decode.capacity() * std::mem::size_of::<Decode>()
            + self.admission.capacity() * 8
            + self.backlog.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `n` requests of `tokens` each served back to back by an engine clearing `rate` tokens
    /// per tick: each admitted while its predecessor is still pending. Returns the last tick.
    fn back_to_back(p: &mut Prefill, mut now: Tick, n: u32, tokens: u64, rate: u64) -> Tick {
        for _ in 0..n {
            let admitted = now.saturating_sub(1);
            now += tokens / rate;
            p.first_byte(now, admitted, tokens, false);
        }
        now
    }

    #[test]
    fn token_rate_learns_and_forgets() {
        let mut r = TokenRate::NEW;
        assert_eq!(r.tokens(400), 100, "a quarter before any sample");
        r.observe(1000, 300, 1);
        assert_eq!(r.tokens(1000), 300);
        for _ in 0..100_000 {
            r.observe(1000, 200, 2);
        }
        assert_eq!(r.tokens(1000), 200, "old samples fade once past the horizon");
        assert_eq!(r.tokens(1), 1, "a non-empty body is at least one token");
        assert_eq!(r.tokens(0), 0);
        r.observe(0, 5, 3);
        r.observe(5, 0, 3);
        assert_eq!(r.samples, 100_001, "empty samples are ignored");
    }

    #[test]
    fn the_rate_counts_only_time_the_engine_had_the_next_request() {
        let mut p = Prefill::NEW;
        // 10 tokens per tick, back to back: the first of a busy period measures nothing (its
        // start includes the trip to the engine), the others their own service.
        let now = back_to_back(&mut p, 1000, 2 * WINDOW_EVENTS + 1, 1000, 10);
        assert_eq!(p.tokens_per_second(1.0), Some(10.0));
        // An idle gap, then a request admitted after the last first byte: no sample from it.
        let windows = p.windows.len;
        p.first_byte(now + 1_000_000 + 150, now + 1_000_000, 1000, true);
        assert_eq!((p.windows.len, p.window_events), (windows, 0), "idle starts are not service");
        assert_eq!(p.tokens_per_second(1.0), Some(10.0));
    }

    /// A window does not close while one prompt is more than a [`WINDOW_DOMINANCE`]th of its
    /// tokens: seven short prompts and a long one (8 first bytes) stay open; three more long
    /// ones close it, at the true rate. At [`WINDOW_EVENTS_MAX`] first bytes it closes whatever
    /// it holds.
    #[test]
    fn a_window_closes_once_no_one_prompt_dominates_it() {
        let mut p = Prefill::NEW;
        // The first of a busy period measures nothing: eight short, seven counted.
        let now = back_to_back(&mut p, 1_000, 8, 100, 10);
        let now = back_to_back(&mut p, now, 1, 10_000, 10);
        assert_eq!((p.windows.len, p.window_events), (0, 8), "10,700 tokens, one of 10,000");
        let now = back_to_back(&mut p, now, 2, 10_000, 10);
        assert_eq!(p.windows.len, 0, "30,700 tokens: still under four times 10,000");
        let now = back_to_back(&mut p, now, 1, 10_000, 10);
        assert_eq!((p.windows.len, p.window_events), (1, 0));
        assert_eq!(p.tokens_per_second(1.0), Some(10.0));
        let now = back_to_back(&mut p, now, 1, 1_000_000, 10);
        let now = back_to_back(&mut p, now, WINDOW_EVENTS_MAX - 2, 100, 10);
        assert_eq!(p.windows.len, 1, "one short of the cap");
        back_to_back(&mut p, now, 1, 100, 10);
        assert_eq!((p.windows.len, p.window_events), (2, 0), "closed at the cap");
    }

    /// The first bytes of requests that had the backend's prefill to themselves (no first byte
    /// since their admission, none other pending) sum into the rate served alone, before and
    /// after windows close; nothing else does, and the sums halve past [`ALONE_HORIZON`].
    #[test]
    fn requests_served_alone_sum_into_their_own_rate() {
        let mut p = Prefill::NEW;
        p.first_byte(1_100, 1_000, 1_000, false);
        assert_eq!(p.alone_rate(), (0, 0), "another request was pending: no sample");
        p.first_byte(2_100, 2_000, 1_000, true);
        p.first_byte(3_300, 3_000, 2_000, true);
        assert_eq!(p.alone_rate(), (3_000, 400), "7.5 tokens per tick");
        assert_eq!(p.rate, (0, 0), "no window: the learned rate stays unknown");
        let now = back_to_back(&mut p, 10_000, WINDOW_EVENTS + 1, 1_000, 10);
        assert_eq!(p.alone_rate(), (3_000, 400), "clean first bytes are not alone");
        p.first_byte(now + ALONE_HORIZON, now, 1_000, true);
        assert_eq!(p.alone_rate(), (2_000, (400 + ALONE_HORIZON) / 2), "halved past the horizon");
    }

    /// A backend with no window is taken to clear at the fastest's rate times the ratio of their
    /// rates served alone; without both of those, at the fastest's; with none learned, unknown.
    #[test]
    fn a_backend_without_a_window_is_scaled_from_the_fastest() {
        let mut l = Learned::new(3, 1);
        assert_eq!(l.drain_rate(1), (0, 0));
        l.prefill[0].rate = (30, 1);
        assert_eq!(l.drain_rate(1), (30, 1), "nothing served alone: as fast as the fastest");
        l.prefill[0].first_byte(200, 100, 2_000, true);
        l.prefill[1].first_byte(500, 100, 2_000, true);
        assert_eq!(l.drain_rate(1), (30 * 250_000, 1_000_000), "a quarter as fast alone");
        assert_eq!(l.drain_rate(2), (30, 1));
        assert_eq!(l.drain_rate(0), (30, 1), "its own rate once it has one");
        assert_eq!(scale_rate((u64::MAX, 1), (1, 1), (1, 1)), Some((u64::MAX, 1)), "saturates");
        let (tokens, ticks) = scale_rate((1 << 62, 1 << 62), (1, 2), (1, 1)).expect("known");
        assert_eq!(ticks, 2 * tokens, "half of one token per tick, scaled down to fit");
    }

    #[test]
    fn a_step_change_in_engine_speed_is_followed_within_half_the_windows() {
        let mut p = Prefill::NEW;
        let now = back_to_back(&mut p, 1, WINDOW_EVENTS * RATE_WINDOWS as u32 + 1, 1000, 10);
        assert_eq!(p.tokens_per_second(1.0), Some(10.0));
        // Half the speed: the median moves once more than half the windows are slow.
        let half = RATE_WINDOWS as u32 / 2;
        let now = back_to_back(&mut p, now, WINDOW_EVENTS * half, 1000, 5);
        assert_eq!(p.tokens_per_second(1.0), Some(10.0), "half the windows are not enough");
        let now = back_to_back(&mut p, now, WINDOW_EVENTS, 1000, 5);
        assert_eq!(p.tokens_per_second(1.0), Some(5.0));
        // And back up.
        back_to_back(&mut p, now, WINDOW_EVENTS * (half + 1), 1000, 10);
        assert_eq!(p.tokens_per_second(1.0), Some(10.0));
    }

    #[test]
    fn an_engine_that_never_answers_teaches_nothing() {
        let p = Prefill::NEW;
        assert_eq!(p.tokens_per_second(1.0), None);
        assert_eq!(p.budget, BUDGET_UNLEARNED);
    }

    #[test]
    fn the_budget_keeps_one_request_waiting_in_the_engine() {
        let mut p = Prefill::NEW;
        // Not held back (the queue is empty or the budget never filled): nothing to learn.
        p.engine_queue(1, 0, 4, false);
        assert_eq!(p.budget, BUDGET_UNLEARNED);
        // Held back, and the engine runs every request it was sent: a quarter more.
        p.engine_queue(2, 0, 4, true);
        assert_eq!(p.budget, BUDGET_UNLEARNED + BUDGET_UNLEARNED / 4);
        assert_eq!(p.budget_at, 2);
        // One request pending and running says nothing about room: it may fill the steps.
        let b = p.budget;
        p.engine_queue(3, 0, 1, true);
        assert_eq!(p.budget, b);
        // Exactly the target waiting: hold.
        p.engine_queue(4, WAITING_TARGET, 4, true);
        assert_eq!(p.budget, b);
        // More waiting than the target: an eighth less, down to the floor.
        p.engine_queue(5, 3, 4, true);
        assert_eq!(p.budget, b - b / 8);
        for t in 6..1000 {
            p.engine_queue(t, 3, 4, true);
        }
        assert_eq!(p.budget, BUDGET_MIN);
        for t in 1000..2000 {
            p.engine_queue(t, 0, 4, true);
        }
        assert_eq!(p.budget, BUDGET_MAX);
    }
}
