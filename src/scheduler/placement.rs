//! S16 prefix-cost placement inside the scheduler: which queued request goes where.
//!
//! A backend's *cost* for a request is, in time at the backend's learned prefill rate:
//! - what is left of its prefill backlog (S6.3): the backlog less what the backend's learned
//!   rate clears from the moment its engine is taken to have begun on it (`prefill_since`);
//! - the request's prompt tokens the backend's [`PrefixIndex`] says are not cached there
//!   (its estimated tokens less those of the matched blocks' bytes, both at the learned tokens
//!   per byte: `tokens_of_blocks`), each token beyond the least
//!   any usable backend would compute weighted [`CACHE_WEIGHT`] (a request with no home pays 1
//!   per token of a hot shared prefix it would copy there, [`HOT_PREFIX_TOUCHES`]);
//! - those uncached tokens again, [`JOIN_WEIGHT`] times per request the backend is already
//!   prefilling (the prefills this one would join and delay);
//! - for a streaming request, what is left of the prefill of the backend's non-streaming
//!   requests by estimate, which no first byte takes out of a backlog ([`super::unstreamed`]):
//!   the first token its client waits for comes after it (a non-streaming request's client
//!   waits for the whole response, which the decoding count below weighs);
//! - its [`decode_weight`] in tokens per sequence the backend is decoding (more as its KV
//!   cache runs fuller);
//! - for a non-streaming request, whose client waits for the whole response, the time its
//!   expected output would take to decode there beyond what it would on the backend of the
//!   least decode gap, counting only the part of the backend's gap more than
//!   [`GAP_TOLERANCE_PERCENT`] above that least (`decode::Decode`), added in the fastest
//!   backend's time after the rest is;
//! - for a streaming request, [`FIRST_TOKEN_STEPS`] steps at the backend's decode gap beyond the
//!   least, when that gap is more than [`GAP_TOLERANCE_PERCENT`] above the least: the fixed
//!   part of the steps that bring its first token, which no rate per token shows for a short
//!   prompt, added in the fastest backend's time as the decode is.
//!
//! [`GAP_TOLERANCE_PERCENT`]: super::decode::GAP_TOLERANCE_PERCENT
//!
//! An admission scans at most `placement_scan_max` queued requests in S3 order (retry, forced,
//! boosted by completion time, normal; normal before boosted when S5's streak bound is due)
//! and admits the first that can go somewhere now:
//! - a retried or forced request, or one that has waited `affinity_wait_max`, takes its
//!   cheapest *eligible* backend (a retry avoids the backend that failed when it can);
//! - any other request takes its cheapest backend if that one is eligible, or an eligible one
//!   whose cost is within `cost_slack_tokens` of the cheapest; otherwise it stays queued,
//!   *waiting for its backend*, and the scan moves on to the next request.
//!
//! When every scanned request waits, a wheel timer is armed for the earliest moment one of
//! them stops waiting (its arrival plus `affinity_wait_max`), so a request never waits past
//! that bound while a backend is eligible (SPEC section 9, defect 1).
//!
//! Decisions where SPEC S16 is silent:
//! - "Cheapest" is over usable backends (healthy, not ejected, not removed), eligible or not:
//!   that is what makes waiting for a busy home worth it. Ties: fewer inflight, then the larger
//!   exported KV capacity, then the lower index. Before anything is learned every idle backend
//!   costs a prompt alike, and the first sessions' prefixes then keep their backend: in the
//!   fleet lab an L4 listed before an H100 took the agent workload's first sessions and held
//!   them (all-request p99 2.1x that of the other order); with the capacity breaking the tie
//!   both orders give the same figures. A fleet's order in the configuration should not decide
//!   where its work goes.
//! - Under prefix-cost the prefill backlog counts each admitted request at its *uncached*
//!   estimate on the backend it went to, not at its whole prompt: a follow-up whose history is
//!   cached adds only what the engine must compute, so the backlog gate and the cost both
//!   measure work.
//! - The index is updated at admission (every block of the prompt, first to last), so two
//!   requests that share a system prompt and are admitted one after the other see each
//!   other's placement.
//! - A follow-up is boosted (S1) only if it is *warm*: some backend's index holds at least half
//!   of its prompt's blocks. A warm cache is the premise of session boost ("warmest cache
//!   first"); a follow-up whose prefix no engine still holds (its conversation paused longer than
//!   the engines keep prefixes, or a RAG turn with fresh passages) gains nothing from going first
//!   but its own latency, and going first costs every first turn behind it. Measured: on
//!   Mooncake at 95 % load boosting cold follow-ups too made all-request TTFT p99 2.4x worse
//!   (`perf/RESULTS.md`). Counted in `Stats::boost_declined`.
//! - A request without block hashes (its prompt is shorter than a block, it has no prompt text,
//!   or the prompt pool was exhausted) falls back to session affinity: the backend of its
//!   session's previous turn when that one is eligible; otherwise it costs its whole prompt
//!   everywhere and goes where the backlog is lowest.
//!
//! **Exploring.** A backend whose decode speed nothing has taught (no decode gap: its engine
//! exports no inter-token histogram that has grown, and no eight of its streams have ended) is
//! taken to be as fast as the fastest, and one that nothing was sent to learns nothing. When every
//! session shares a prefix (a system prompt), the first backend to hold it keeps them all, and
//! which one that is was a tie. So while a usable backend has requests in flight, a streaming first
//! turn (a turn depth of 1, not a retry) goes to the first eligible backend with nothing in flight
//! or held and no decode gap, whatever the cost says: one at a time, until a gap is learned, which
//! the engine's counters teach within a scrape or two of decoding (on an engine that exports none,
//! eight ended streams). Not a non-streaming request, whose client waits for a whole response at
//! that unknown speed, and not a backend whose engine exported less than half the largest KV
//! capacity among the model's backends: a smaller card is the likelier slower one and holds fewer
//! of the sessions that would follow. Measured in the fleet lab (`perf/RESULTS.md`, twenty-fourth
//! session): an H100 beside a 70B engine whose steps start at 48 ms, on the agent workload, sent
//! every first turn of its first 16 s to the slow engine (by the tie, the larger KV capacity; the
//! shared system prompt then held them there): all-request p99 3.7x `cache_aware`'s, 1.0x
//! exploring. Sending it without the engines' counters and without the capacity condition let an L4
//! beside an H100 take six sessions before eight streams had taught its speed (p99 1.16-1.20x the
//! baseline there).

use std::sync::Arc;

use crate::clock::Tick;
use crate::ring::prompt_pool::{PromptPool, NO_PROMPT};
use crate::wheel::TimerKey;

use super::cost::{
    at_rate, decode_delay, decode_weight, remaining_backlog, step_slower, tolerated_gap,
    CACHE_WEIGHT, DECODE_WEIGHT_BLIND, FIRST_TOKEN_STEPS, JOIN_WEIGHT,
};
use super::estimate::TokenRate;
use super::prefix::PrefixIndex;
use super::queue::NO_BACKEND;
use super::{IndexSize, Lane, Output, Params, Scheduler, Timer};

/// The S16 state of a model whose routing is `prefix-cost`.
#[derive(Debug)]
pub(super) struct Prefix {
    pub pool: Arc<PromptPool>,
    /// One index per backend.
    pub indexes: Vec<PrefixIndex>,
    /// Per arena slot: the prompt-pool slot of the request there, or [`NO_PROMPT`].
    pub prompt_of: Vec<u32>,
    /// The fire time and key of the timer that ends the earliest wait, if armed.
    pub timer: Option<(Tick, TimerKey)>,
    /// Scratch: the scan's candidates, the boosted heap's frontier, the tenants in order.
    candidates: Vec<(u32, Lane)>,
    boosted: Vec<u32>,
    frontier: Vec<u32>,
    tenants: Vec<u32>,
    /// Scratch: matched blocks per backend for one request.
    matched: Vec<usize>,
    /// Scratch: per backend, the estimated tokens of that request's prompt it would compute.
    uncached: Vec<u64>,
    /// Scratch: the leading blocks of that request's prompt that are a hot shared prefix on
    /// some backend ([`HOT_PREFIX_TOUCHES`]); 0 for a request with a home.
    hot: usize,
    /// Scratch, with `hot`: the largest KV capacity a backend exported (tokens; 0 when none
    /// did). Only a backend with that much takes a copy of a hot prefix.
    copy_capacity: u64,
}

/// How many admissions must have sent a prefix block to a backend, while its index held it,
/// for the block to be *hot*: a system prompt, a tool list or a document many sessions share.
///
/// A request with no home (a first turn, or one whose session the router does not hold) finds
/// on other backends only what other sessions left there. Where that is a hot prefix, the part
/// of it a backend lacks costs weight 1 there, not [`CACHE_WEIGHT`]: computing it is this
/// request's own prefill once, and every later session that shares the prefix then finds it
/// on that backend too (prefix replication, as Preble does it for hot prefixes: Srivatsa et al.,
/// "Preble: Efficient Distributed Prompt Scheduling for LLM Serving", 2024). At
/// [`CACHE_WEIGHT`] the first engine to see a shared system prompt kept every later session:
/// in the fleet lab's agent workload (a 1,500-word system prompt every session shares) one of
/// two engines served none of 6,408 requests, and the other decoded them all. Only a backend
/// whose engine exported the largest KV capacity among the model's backends takes a copy: in
/// a fleet of unequal engines the smaller card holds fewer of the sessions that follow the
/// copy and serves them slower (the lab's H100 + L4 agent cell put 1 % of its requests on the
/// L4 without this, and its all-request p99 went from 39 to 57 ms). A session's own
/// turns touch its blocks once each, and only requests without a home are weighed this way, so
/// a conversation's history is never taken for a shared prefix. Chosen by measurement
/// (`perf/RESULTS.md`, "Hot shared prefixes"): 8 touches moved RAGPulse first turns off their
/// documents in a KV-bound cell; 32 left every trace cell's figures unchanged.
pub const HOT_PREFIX_TOUCHES: u16 = 32;

/// The largest auto-sized prefix index, in blocks (64 MiB of prompt text per backend).
pub const INDEX_BLOCKS_MAX: u64 = 1 << 18;

/// Buckets of `warmpath_prefix_match_ratio`: the upper bounds of the matched share of a
/// prompt's blocks at admission, in tenths (the last bucket is 1.0).
pub const MATCH_BUCKETS: usize = 11;

/// The `prefix` label of `warmpath_ttft_seconds` (issue \[10\]) as the prefix index predicts
/// it at admission: warm when the chosen backend's index holds at least half of the prompt's
/// blocks (the same threshold as S16's boost refinement); `None` when the prompt has no blocks
/// to predict from (the caller then decides).
pub(crate) fn predicted_warm(matched: usize, blocks: usize) -> Option<bool> {
    (blocks > 0).then_some(matched * 2 >= blocks)
}

impl Prefix {
    /// The state for `params`, with `arena` queue slots.
    pub fn new(params: &Params, arena: u32) -> Prefix {
        let backends = usize::from(params.backends);
        let scan = params.prefix.scan_max as usize;
        Prefix {
            pool: PromptPool::new(arena),
            indexes: (0..backends)
                .map(|_| PrefixIndex::with_capacity(params.prefix.index_blocks.initial() as usize))
                .collect(),
            prompt_of: vec![NO_PROMPT; arena as usize],
            timer: None,
            candidates: Vec::with_capacity(scan),
            boosted: Vec::with_capacity(scan),
            frontier: Vec::with_capacity(scan + 1),
            tenants: Vec::with_capacity(scan),
            matched: vec![0; backends],
            uncached: vec![0; backends],
            hot: 0,
            copy_capacity: 0,
        }
    }

    /// Room for `arena` queue slots and `backends` backends (a live reconfiguration), and a
    /// prompt-pool slot for each queue slot (the pool grows while the shards use it). Never
    /// shrinks: lower limits make a smaller arena than the queue's, whose upper slots may hold
    /// requests (the queue's arena never shrinks either).
    pub fn grow(&mut self, params: &Params, arena: u32) {
        self.pool.grow(arena);
        let arena = (arena as usize).max(self.prompt_of.len());
        self.prompt_of.resize(arena, NO_PROMPT);
        let backends = usize::from(params.backends);
        while self.indexes.len() < backends {
            self.indexes
                .push(PrefixIndex::with_capacity(params.prefix.index_blocks.initial() as usize));
        }
        self.matched.resize(backends, 0);
        self.uncached.resize(backends, 0);
        let scan = params.prefix.scan_max as usize;
        self.candidates.reserve(scan.saturating_sub(self.candidates.len()));
        self.boosted.reserve(scan);
        self.frontier.reserve(scan + 1);
        self.tenants.reserve(scan);
    }

    pub fn heap_bytes(&self) -> usize {
        self.indexes.iter().map(PrefixIndex::heap_bytes).sum::<usize>()
            + self.prompt_of.capacity() * 4
    }
}

impl Scheduler {
    /// The prompt pool shards hash into, for a `prefix-cost` model.
    pub fn prompt_pool(&self) -> Option<Arc<PromptPool>> {
        self.prefix.as_ref().map(|p| Arc::clone(&p.pool))
    }

    /// Blocks held by `backend`'s prefix index (0 without prefix-cost).
    pub fn prefix_index_len(&self, backend: u16) -> usize {
        self.prefix
            .as_ref()
            .and_then(|p| p.indexes.get(usize::from(backend)))
            .map_or(0, |i| i.len())
    }

    /// Gives a pool slot back when its request could not be queued.
    pub(super) fn return_prompt(&self, prompt: u32) {
        if let (Some(prefix), true) = (&self.prefix, prompt != NO_PROMPT) {
            prefix.pool.release(prompt);
        }
    }

    /// The request in arena slot `index` ends: its prompt slot goes back to the pool.
    pub(super) fn drop_prompt(&mut self, index: u32) {
        if let Some(prefix) = &mut self.prefix {
            let slot = std::mem::replace(&mut prefix.prompt_of[index as usize], NO_PROMPT);
            if slot != NO_PROMPT {
                prefix.pool.release(slot);
            }
        }
    }

    /// Whether the prompt in pool slot `prompt` is *warm*: some backend's index holds at least
    /// half of its blocks (true when its hashes are unknown, and always without prefix-cost).
    pub(super) fn warm(&self, prompt: u32) -> bool {
        match (&self.prefix, prompt) {
            (Some(prefix), slot) if slot != NO_PROMPT => prefix.pool.with(slot, |hashes| {
                let best = prefix.indexes.iter().map(|index| index.matched(hashes)).max();
                best.unwrap_or(0) * 2 >= hashes.len()
            }),
            _ => true,
        }
    }

    /// Fills `prefix.matched` with the blocks of `index`'s prompt each backend holds, and
    /// `prefix.uncached` with the tokens each would compute; returns the prompt's block count.
    fn match_prompt(&mut self, index: u32) -> usize {
        let blocks = self.match_blocks(index);
        let tokens = self.prompt_tokens(index);
        let (block_bytes, rate) = (self.params.prefix.block_bytes, &self.learned.tokens);
        if let Some(prefix) = &mut self.prefix {
            for (uncached, &matched) in prefix.uncached.iter_mut().zip(&prefix.matched) {
                *uncached = tokens.saturating_sub(tokens_of_blocks(rate, block_bytes, matched));
            }
        }
        blocks
    }

    /// [`match_prompt`](Self::match_prompt)'s blocks: `prefix.matched` and the hot depth.
    fn match_blocks(&mut self, index: u32) -> usize {
        let Some(prefix) = &mut self.prefix else { return 0 };
        prefix.matched.iter_mut().for_each(|m| *m = 0);
        prefix.hot = 0;
        let slot = prefix.prompt_of[index as usize];
        if slot == NO_PROMPT {
            return 0;
        }
        let homeless = self.queue.get(index).home == NO_BACKEND;
        let touches = self.params.prefix.hot_touches;
        let (indexes, matched) = (&prefix.indexes, &mut prefix.matched);
        let mut hot = 0;
        let blocks = prefix.pool.with(slot, |hashes| {
            for (m, index) in matched.iter_mut().zip(indexes) {
                *m = index.matched(hashes);
                if homeless && *m > hot {
                    hot = hot.max(index.hot(&hashes[..*m], touches));
                }
            }
            hashes.len()
        });
        prefix.hot = hot;
        if hot > 0 {
            prefix.copy_capacity = self.learned.largest_kv_capacity(self.backends.len());
        }
        blocks
    }

    /// The estimated prompt tokens of entry `index`, at the learned tokens per byte.
    pub(super) fn prompt_tokens(&self, index: u32) -> u64 {
        u64::from(self.learned.tokens.tokens(self.queue.get(index).prompt_bytes))
    }

    /// The estimated tokens of `blocks` prompt blocks.
    fn block_tokens(&self, blocks: usize) -> u64 {
        tokens_of_blocks(&self.learned.tokens, self.params.prefix.block_bytes, blocks)
    }

    /// What computing the last [`match_prompt`](Self::match_prompt)'s uncached prompt on
    /// `backend` adds to its cost: [`CACHE_WEIGHT`] per token, but 1 per token
    /// of a hot shared prefix the backend lacks ([`HOT_PREFIX_TOUCHES`]) if no backend
    /// exported a larger KV capacity than it.
    fn cache_cost(&self, backend: usize) -> u64 {
        let prefix = self.prefix.as_ref().expect("prefix-cost state");
        let uncached = self.uncached(backend);
        let room = self.learned.cache[backend].kv_capacity_tokens >= prefix.copy_capacity;
        let copied = match prefix.hot.checked_sub(prefix.matched[backend]) {
            Some(blocks) if blocks > 0 && room => self.block_tokens(blocks).min(uncached),
            _ => 0,
        };
        CACHE_WEIGHT * (uncached - copied) + copied
    }

    /// The least any usable backend would compute of the last
    /// [`match_prompt`](Self::match_prompt)'s prompt (0 when none is usable).
    fn least_uncached(&self) -> u64 {
        let usable = (0..self.backends.len()).filter(|&b| self.backends[b].usable());
        usable.map(|b| self.uncached(b)).min().unwrap_or(0)
    }

    /// What `backend` would compute of the last [`match_prompt`](Self::match_prompt)'s prompt.
    fn uncached(&self, backend: usize) -> u64 {
        self.prefix.as_ref().expect("prefix-cost state").uncached[backend]
    }

    /// At the binding of entry `index` to `backend`: the tokens it adds to the backend's
    /// prefill backlog (its uncached estimate under prefix-cost, its whole prompt otherwise)
    /// and the index's warm prediction ([`predicted_warm`]; `None` without prompt blocks), and
    /// under prefix-cost the match-ratio observation and the index update.
    pub(super) fn record_placement(
        &mut self,
        now: Tick,
        index: u32,
        backend: u16,
    ) -> (u32, Option<bool>) {
        let tokens = self.prompt_tokens(index);
        if self.prefix.is_none() {
            self.learned.cache[usize::from(backend)].placed(tokens, 0);
            return (u32::try_from(tokens).unwrap_or(u32::MAX), None);
        }
        let blocks = self.match_prompt(index);
        let uncached = self.uncached(usize::from(backend));
        self.learned.cache[usize::from(backend)].placed(tokens, tokens - uncached);
        let prefix = self.prefix.as_mut().expect("checked");
        let matched = prefix.matched[usize::from(backend)];
        self.stats.prefix_copies += u64::from(prefix.hot > matched);
        let bucket = if blocks == 0 { 0 } else { (matched * 10).div_ceil(blocks) };
        self.stats.match_ratio[bucket.min(MATCH_BUCKETS - 1)] += 1;
        self.stats.match_ratio_sum_milli +=
            (matched * 1000).checked_div(blocks).unwrap_or(0) as u64;
        let slot = prefix.prompt_of[index as usize];
        if slot != NO_PROMPT {
            let index = &mut prefix.indexes[usize::from(backend)];
            prefix.pool.with(slot, |hashes| index.insert(hashes, now));
        }
        (u32::try_from(uncached).unwrap_or(u32::MAX), predicted_warm(matched, blocks))
    }

    /// Sizes `backend`'s prefix index to what its engine holds (`prefix_index_blocks =
    /// "auto"`): the exported KV capacity in prompt blocks at the learned tokens per byte, or
    /// the configured default, times the calibrated scale. Rebuilt (an allocation, off the
    /// per-request path: at most once per snapshot or calibration period) only when the size
    /// changes by more than an eighth.
    pub(super) fn resize_index(&mut self, backend: u16) {
        let IndexSize::Auto { default_blocks } = self.params.prefix.index_blocks else { return };
        let Some(prefix) = &mut self.prefix else { return };
        let cache = &self.learned.cache[usize::from(backend)];
        let block_bytes = u64::from(self.params.prefix.block_bytes);
        let nominal = match cache.kv_capacity_tokens {
            0 => u64::from(default_blocks),
            tokens => {
                let block_tokens = u64::from(self.learned.tokens.tokens(block_bytes as u32)).max(1);
                tokens.div_ceil(block_tokens)
            }
        };
        let target = cache.index_blocks(nominal).min(INDEX_BLOCKS_MAX);
        let index = &mut prefix.indexes[usize::from(backend)];
        let current = index.capacity() as u64;
        if target.abs_diff(current) * 8 > current {
            index.resize(target as usize);
        }
    }

    /// S16 admission: admits while some scanned request can be placed.
    pub(super) fn admit_by_cost(&mut self, now: Tick, out: &mut Vec<Output>) {
        while self.queue.queued() > 0
            && self.model_has_room()
            && self.gates.evaluate(&self.backends, now, &mut self.eligible)
        {
            if let Some(tenant) = self.fair.head() {
                self.promote_overtaken(tenant);
            }
            let Some((index, lane, backend)) = self.place(now) else { break };
            let affinity = backend == self.queue.get(index).home;
            self.unqueue_admitted(index);
            self.bind(now, index, backend, lane, affinity, out);
        }
    }

    /// The first scanned request that can be placed now, its lane and backend; or `None`, with
    /// the wait timer armed.
    fn place(&mut self, now: Tick) -> Option<(u32, Lane, u16)> {
        self.collect_candidates();
        let wait_max = self.params.prefix.wait_max;
        let mut earliest: Option<Tick> = None;
        let count = self.prefix.as_ref().expect("prefix-cost state").candidates.len();
        for at in 0..count {
            let (index, lane) = self.prefix.as_ref().expect("checked").candidates[at];
            let entry = *self.queue.get(index);
            let avoid = if lane == Lane::Retry { entry.backend } else { NO_BACKEND };
            let blocks = self.match_prompt(index);
            let home = entry.home;
            if blocks == 0
                && home != NO_BACKEND
                && home != avoid
                && self.eligible[usize::from(home)]
            {
                // No prompt to place by (too short to hash, or no text): session affinity.
                return Some((index, lane, home));
            }
            if entry.streaming && entry.turn == 1 && lane != Lane::Retry {
                if let Some(b) = self.unexplored() {
                    return Some((index, lane, b));
                }
            }
            let Some((cheapest, best)) = self.cheapest(now, avoid, entry.streaming) else {
                continue;
            };
            if best.0 == cheapest.0 || matches!(lane, Lane::Retry | Lane::Forced) {
                return Some((index, lane, best.0));
            }
            // The prefill the eligible backend would do that the cheapest one would not.
            let lost = self
                .uncached(usize::from(best.0))
                .saturating_sub(self.uncached(usize::from(cheapest.0)));
            if lost <= self.params.prefix.slack_tokens {
                return Some((index, lane, best.0));
            }
            // Worth waiting for as long as that prefill, weighted as in the cost, takes there.
            let weighted = self
                .cache_cost(usize::from(best.0))
                .saturating_sub(self.cache_cost(usize::from(cheapest.0)));
            let rate = self.learned.prefill[usize::from(best.0)].rate;
            let wait = match rate {
                (0, _) => wait_max,
                (tokens, ticks) => {
                    let t = u128::from(weighted) * u128::from(ticks) / u128::from(tokens);
                    u64::try_from(t).unwrap_or(u64::MAX).min(wait_max)
                }
            };
            if now.saturating_sub(entry.arrived_at) >= wait {
                return Some((index, lane, best.0));
            }
            if !entry.placement_waited {
                self.queue.get_mut(index).placement_waited = true;
                self.stats.placement_waits += 1;
            }
            let ends = entry.arrived_at.saturating_add(wait);
            earliest = Some(earliest.map_or(ends, |e: Tick| e.min(ends)));
        }
        if let Some(at) = earliest {
            self.arm_placement_timer(at);
        }
        None
    }

    /// What a sequence backend `b` decodes adds to its cost: [`decode_weight`] of its KV
    /// pressure, and [`DECODE_WEIGHT_BLIND`] more while its engine has exported no KV capacity.
    pub(super) fn decode_weight(&self, b: usize) -> u64 {
        let blind = self.learned.cache[b].kv_capacity_tokens == 0;
        decode_weight(self.kv_pressure(b)) + if blind { DECODE_WEIGHT_BLIND } else { 0 }
    }

    /// Backend `b`'s KV pressure in millionths, as [`decode_weight`] takes it: the larger of
    /// its engine's averaged usage and [`held_pressure`](Self::held_pressure).
    pub(super) fn kv_pressure(&self, b: usize) -> u64 {
        self.learned.cache[b].kv_pressure_micro.max(self.held_pressure(b))
    }

    /// The estimated tokens of the prompts admitted to backend `b` past their prefill, over its
    /// engine's exported KV capacity, in millionths; 0 until it exports one.
    pub(super) fn held_pressure(&self, b: usize) -> u64 {
        match self.learned.cache[b].kv_capacity_tokens {
            0 => 0,
            capacity => {
                let held = self.learned.tokens.tokens_u64(self.backends[b].held_bytes);
                held.saturating_mul(1_000_000) / capacity
            }
        }
    }

    /// The cheapest usable backend and the cheapest eligible one, as (backend, cost), for the
    /// request of the last [`match_prompt`](Self::match_prompt), whose client asked for a
    /// stream if `streaming`; `avoid` only when nothing else qualifies.
    fn cheapest(&self, now: Tick, avoid: u16, streaming: bool) -> Option<((u16, u64), (u16, u64))> {
        let fastest = self.learned.cost_rate();
        // What the request must compute wherever it goes is its own prefill, weighted 1.
        let everywhere = (CACHE_WEIGHT - 1) * self.least_uncached();
        // A whole response's client waits for its decode too, at its backend's speed; a
        // stream's client for the steps that bring its first token.
        let least = self.least_gap();
        let tolerated = tolerated_gap(least);
        let output = self.learned.output.mean();
        let rank = |b: usize| {
            let backend = &self.backends[b];
            let pending = u64::from(backend.prefill_pending);
            let decoding = u64::from(backend.inflight) - pending;
            let rate = self.learned.drain_rate(b as u16);
            let mut backlog = remaining_backlog(backend, rate, now);
            if streaming {
                // Its client waits for the first token, behind the prefill left of the
                // non-streaming requests sent there too; a client of a whole response waits
                // for its end, which the decoding count weighs.
                backlog += backend.unstreamed_backlog.remaining(rate, now);
            }
            let work = backlog
                + self.cache_cost(b).saturating_sub(everywhere)
                + JOIN_WEIGHT * pending * self.uncached(b)
                + self.decode_weight(b) * decoding;
            let gap = self.learned.decode[b].gap;
            let decode = if streaming {
                decode_delay(FIRST_TOKEN_STEPS, step_slower(gap, least), fastest)
            } else {
                let slower = if least == 0 { 0 } else { gap.saturating_sub(tolerated) };
                decode_delay(output, slower, fastest)
            };
            let capacity = std::cmp::Reverse(self.learned.cache[b].kv_capacity_tokens);
            (at_rate(work, rate, fastest).saturating_add(decode), backend.inflight, capacity)
        };
        let pick = |filter: &dyn Fn(usize) -> bool| {
            let mut best: Option<(usize, Rank)> = None;
            for b in (0..self.backends.len()).filter(|&b| filter(b)) {
                let r = rank(b);
                if best.is_none_or(|(_, best_rank)| r < best_rank) {
                    best = Some((b, r));
                }
            }
            best.map(|(b, (cost, ..))| (b as u16, cost))
        };
        let not_avoided = |b: usize| b as u16 != avoid;
        let usable = |b: usize| self.backends[b].usable();
        let eligible = |b: usize| self.eligible[b];
        let cheapest = pick(&|b| usable(b) && not_avoided(b)).or_else(|| pick(&usable))?;
        let best = pick(&|b| eligible(b) && not_avoided(b)).or_else(|| pick(&eligible))?;
        Some((cheapest, best))
    }

    /// A backend to explore (module doc, "Exploring"): the first eligible one with nothing in
    /// flight or held, no decode gap learned, and at least half the largest KV capacity the
    /// model's engines exported, while a usable backend has requests in flight.
    fn unexplored(&self) -> Option<u16> {
        let busy = self.backends.iter().any(|b| b.usable() && b.inflight > 0);
        if !busy {
            return None;
        }
        let capacity = |b: usize| self.learned.cache[b].kv_capacity_tokens;
        let largest = self.learned.largest_kv_capacity(self.backends.len());
        (0..self.backends.len())
            .find(|&b| {
                let backend = &self.backends[b];
                self.eligible[b]
                    && backend.inflight == 0
                    && backend.holds == 0
                    && self.learned.decode[b].gap == 0
                    && capacity(b).saturating_mul(2) >= largest
            })
            .map(|b| b as u16)
    }

    /// The least decode gap learned among the usable backends; 0 when none has one.
    fn least_gap(&self) -> u64 {
        let usable = self.backends.iter().zip(&self.learned.decode).filter(|(b, _)| b.usable());
        usable.map(|(_, d)| d.gap).filter(|&gap| gap > 0).min().unwrap_or(0)
    }

    /// The scan's candidates, at most `placement_scan_max`: the retry lane, then the tenants
    /// in tenant order (issue \[11\]), each in its S3 order with S5. A tenant other than the
    /// head (whose S4 check ran before the scan) gets its S4 check when the scan reaches it,
    /// so no tenant admits a boosted request without one.
    fn collect_candidates(&mut self) {
        let scan = (self.params.prefix.scan_max as usize).max(1);
        let head = self.fair.head();
        let prefix = self.prefix.as_mut().expect("prefix-cost state");
        prefix.candidates.clear();
        self.collect_lane(Lane::Retry, 0, scan);
        let prefix = self.prefix.as_mut().expect("checked");
        let room = scan - prefix.candidates.len();
        prefix.tenants.clear();
        if room > 0 {
            self.fair.first_k(room, &mut prefix.frontier, &mut prefix.tenants);
        }
        for at in 0..self.prefix.as_ref().expect("checked").tenants.len() {
            if self.prefix.as_ref().expect("checked").candidates.len() >= scan {
                break;
            }
            let tenant = self.prefix.as_ref().expect("checked").tenants[at] as u16;
            if Some(tenant) != head {
                self.promote_overtaken(tenant);
            }
            for lane in &self.lane_order(tenant)[1..] {
                self.collect_lane(*lane, tenant, scan);
            }
        }
    }

    /// Appends `tenant`'s `lane` in its order to the candidates, up to `scan` in all.
    fn collect_lane(&mut self, lane: Lane, tenant: u16, scan: usize) {
        let prefix = self.prefix.as_mut().expect("prefix-cost state");
        let room = scan - prefix.candidates.len();
        if room == 0 {
            return;
        }
        if lane == Lane::Boosted {
            prefix.boosted.clear();
            let (frontier, boosted) = (&mut prefix.frontier, &mut prefix.boosted);
            self.queue.boosted_first_k(tenant, room, frontier, boosted);
            prefix.candidates.extend(prefix.boosted.iter().map(|&i| (i, lane)));
            return;
        }
        let mut next = self.queue.first(lane, tenant);
        while let (Some(index), true) = (next, prefix.candidates.len() < scan) {
            prefix.candidates.push((index, lane));
            next = self.queue.next_in_lane(index);
        }
    }

    fn arm_placement_timer(&mut self, at: Tick) {
        let prefix = self.prefix.as_mut().expect("prefix-cost state");
        if let Some((armed, key)) = prefix.timer {
            if armed <= at {
                return;
            }
            self.wheel.cancel(key);
        }
        let key = self.wheel.insert(at, Timer::Placement);
        self.prefix.as_mut().expect("checked").timer = Some((at, key));
    }
}

/// A backend's place in [`Scheduler::cheapest`]'s order: its cost, then fewer requests in
/// flight, then the larger exported KV capacity (the lower index last, by the scan's order).
type Rank = (u64, u32, std::cmp::Reverse<u64>);

/// The estimated tokens of `blocks` prompt blocks of `block_bytes` each, at `rate`.
fn tokens_of_blocks(rate: &TokenRate, block_bytes: u32, blocks: usize) -> u64 {
    if blocks == 0 {
        return 0; // most backends hold none of a prompt: no division for them
    }
    let bytes = blocks as u64 * u64::from(block_bytes);
    u64::from(rate.tokens(u32::try_from(bytes).unwrap_or(u32::MAX)))
}

#[cfg(test)]
#[path = "placement_tests.rs"]
mod tests;
