//! S16's prefix-cost placement in the reference model: the matched length of a prompt, its
//! uncached tokens, work in the fastest backend's time, the placement scan, and the index's
//! learned size (its calibration periods and the rebuild). Restated as [`super`]'s module doc
//! says: linear-scan trackers, costs recomputed from scratch.

use crate::clock::Tick;

use super::super::cost::{
    CACHE_WEIGHT, DECODE_WEIGHT_BLIND, DECODE_WEIGHT_KV, FIRST_TOKEN_STEPS, JOIN_WEIGHT,
    RATE_TOLERANCE_PERCENT,
};
use super::super::placement::INDEX_BLOCKS_MAX;
use super::super::tracker::reference::SessionTracker;
use super::super::unstreamed::{BEGUN_PREFILLING, RECENT_SENDS};
use super::super::{cache_model, decode};
use super::super::{IndexSize, Lane, Routing};
use super::{Admitted, Queued, Reference, NONE};

impl Reference {
    /// Closes `backend`'s calibration period if it holds enough tokens; whether the index
    /// scale changed.
    pub(super) fn calibrate(&mut self, backend: u16) -> bool {
        let l = &mut self.learned[usize::from(backend)];
        let (tokens, predicted, engine, from_usage) = l.period;
        if tokens < cache_model::CALIBRATION_TOKENS {
            return false;
        }
        l.period = (0, 0, 0, false);
        if !(from_usage || l.counter_seen) {
            return false;
        }
        let old = l.index_scale;
        let slack = tokens / 100;
        if predicted > engine + engine / 2 + slack {
            l.index_scale = (old - old / 4).max(cache_model::INDEX_SCALE_MIN);
        } else if predicted + predicted / 4 + slack < engine {
            l.index_scale = (old + old.div_ceil(4)).min(cache_model::INDEX_SCALE_MAX);
        }
        l.index_scale != old
    }

    /// Rebuilds `backend`'s index at its learned size (auto-sized prefix-cost only).
    pub(super) fn resize_index(&mut self, backend: u16) {
        let IndexSize::Auto { default_blocks } = self.p.prefix.index_blocks else { return };
        if self.p.routing != Routing::PrefixCost {
            return;
        }
        let b = usize::from(backend);
        let l = &self.learned[b];
        let nominal = match l.capacity {
            0 => u64::from(default_blocks),
            tokens => tokens.div_ceil(self.tokens_of(u64::from(self.p.prefix.block_bytes)).max(1)),
        };
        let target = (nominal * u64::from(l.index_scale) / 4).clamp(1, INDEX_BLOCKS_MAX);
        let current = self.index_capacity[b] as u64;
        if target.abs_diff(current) * 8 > current {
            let mut rebuilt = SessionTracker::with_capacity(target as usize);
            self.indexes[b].for_each_from_hand(|hash, at| rebuilt.complete(hash, at, 0));
            self.indexes[b] = rebuilt;
            self.index_capacity[b] = target as usize;
        }
    }

    /// The binary search of `PrefixIndex::matched`, over the reference tracker.
    pub(super) fn matched(&self, backend: u16, blocks: &[u64]) -> usize {
        self.leading(backend, blocks, 1)
    }

    /// The binary search of `PrefixIndex::hot`: the leading `blocks` `backend`'s index holds,
    /// each sent there by at least `touches` admissions.
    fn leading(&self, backend: u16, blocks: &[u64], touches: u16) -> usize {
        let index = &self.indexes[usize::from(backend)];
        let (mut low, mut high) = (0, blocks.len());
        while low < high {
            let mid = low + (high - low).div_ceil(2);
            if index.lookup(blocks[mid - 1]).is_some_and(|block| block.turns >= touches) {
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        low
    }

    pub(super) fn uncached(&self, request: &Queued, backend: u16) -> u64 {
        let matched = self.matched(backend, &request.blocks) as u64;
        let bytes = (matched * u64::from(self.p.prefix.block_bytes)).min(u64::from(u32::MAX));
        let cached = self.tokens_of(bytes);
        self.tokens_of(u64::from(request.prompt_bytes)).saturating_sub(cached)
    }

    /// The leading blocks of a homeless request's prompt that some backend holds, each sent
    /// there by at least `hot_touches` admissions (0 for a request with a home).
    pub(super) fn hot(&self, request: &Queued) -> usize {
        if request.home != NONE {
            return 0;
        }
        let touches = self.p.prefix.hot_touches;
        let held = |b| &request.blocks[..self.matched(b, &request.blocks)];
        (0..self.p.backends).map(|b| self.leading(b, held(b), touches)).max().unwrap_or(0)
    }

    /// The uncached prompt's share of `backend`'s cost: [`CACHE_WEIGHT`] per token, 1 per
    /// token of the hot shared prefix the backend lacks when no backend's KV capacity is
    /// larger than its.
    fn cache_cost(&self, request: &Queued, backend: u16) -> u64 {
        let uncached = self.uncached(request, backend);
        let largest = (0..self.p.backends).map(|b| self.learned[usize::from(b)].capacity).max();
        let mut lacking = self.hot(request).saturating_sub(self.matched(backend, &request.blocks));
        if self.learned[usize::from(backend)].capacity < largest.unwrap_or(0) {
            lacking = 0;
        }
        let bytes =
            (lacking as u64 * u64::from(self.p.prefix.block_bytes)).min(u64::from(u32::MAX));
        let copied = if lacking == 0 { 0 } else { self.tokens_of(bytes).min(uncached) };
        CACHE_WEIGHT * (uncached - copied) + copied
    }

    /// `backend`'s prefill backlog less what its engine has cleared of it at its learned rate
    /// since it began on it: the later of the last time a prefill left the backlog and the
    /// earliest admission in it.
    fn remaining(&self, backend: u16, now: Tick) -> u64 {
        let backlog = self.prefill(backend);
        let pending = self.admitted.iter().filter(|a| a.backend == backend && a.prefill_pending);
        let Some(earliest) = pending.map(|a| a.admitted_at).min() else { return backlog };
        let began = earliest.max(self.backends[usize::from(backend)].prefill_left_at);
        match self.drain_rate(backend) {
            (0, _) | (_, 0) => backlog,
            (tokens, ticks) => {
                let cleared = u128::from(now - began) * u128::from(tokens) / u128::from(ticks);
                backlog.saturating_sub(u64::try_from(cleared).unwrap_or(u64::MAX))
            }
        }
    }

    /// `backend`'s S16 cost for `request` at `now`, in tokens of the fastest backend's time.
    fn cost(&self, request: &Queued, backend: u16, now: Tick) -> u64 {
        // Tokens every usable backend would compute weigh 1: the request's own prefill.
        let least = (0..self.p.backends)
            .filter(|&b| self.usable(b))
            .map(|b| self.uncached(request, b))
            .min()
            .unwrap_or(0);
        let on = |pending: bool| {
            let here = self.admitted.iter().filter(|a| a.backend == backend);
            here.filter(|a| a.prefill_pending == pending).count() as u64
        };
        // The decode weight grows with the square of the KV pressure (at most a full cache);
        // the pressure is the larger of the engine's averaged usage and the contexts the
        // router holds there (the decoding streams' and every whole response's prompts).
        let p = self.pressure(backend).min(1_000_000);
        let mut weight = DECODE_WEIGHT_KV * (p * p / 1_000_000) / 1_000_000;
        // An engine that exports no KV capacity gives the router no count: a floor instead.
        if self.learned[usize::from(backend)].capacity == 0 {
            weight += DECODE_WEIGHT_BLIND;
        }
        // Each prefill pending there is delayed by this request's uncached tokens.
        let joined = JOIN_WEIGHT * on(true) * self.uncached(request, backend);
        let cached = self.cache_cost(request, backend).saturating_sub((CACHE_WEIGHT - 1) * least);
        // A streaming request's client waits for its first token, behind the prefill left of
        // the non-streaming requests sent there; any other client waits for the whole response,
        // which the decoding count weighs.
        let unstreamed = if request.streaming {
            self.backends[usize::from(backend)].unstreamed.left(self.drain_rate(backend), now)
        } else {
            0
        };
        let work = self.remaining(backend, now) + unstreamed + cached + joined + weight * on(false);
        let decode = if request.streaming {
            self.first_token_delay(backend)
        } else {
            self.decode_delay(backend)
        };
        self.at_fastest(work, backend).saturating_add(decode)
    }

    /// `backend`'s KV pressure in millionths: the larger of its engine's averaged usage and
    /// [`held_pressure`](Self::held_pressure).
    fn pressure(&self, backend: u16) -> u64 {
        self.learned[usize::from(backend)].pressure.max(self.held_pressure(backend))
    }

    /// The estimated tokens of the prompts admitted to `backend` that its engine holds (a
    /// streaming one after its first byte, a non-streaming one from its admission) over its
    /// KV capacity, in millionths; 0 while it has exported none.
    pub(super) fn held_pressure(&self, backend: u16) -> u64 {
        let capacity = self.learned[usize::from(backend)].capacity;
        if capacity == 0 {
            return 0;
        }
        let here = self.admitted.iter().filter(|a| a.backend == backend && !a.prefill_pending);
        let bytes: u64 = here.map(|a| u64::from(a.request.prompt_bytes)).sum();
        let (tokens, per) = (self.tokens.0, self.tokens.1.max(1));
        let held = u128::from(bytes) * u128::from(tokens) / u128::from(per);
        u64::try_from(held * 1_000_000 / u128::from(capacity)).unwrap_or(u64::MAX)
    }

    /// The least decode gap of the usable backends, if any has one.
    fn least_gap(&self) -> Option<u64> {
        let usable = (0..self.p.backends).filter(|&b| self.usable(b));
        usable.map(|b| self.gap(b)).filter(|&gap| gap > 0).min()
    }

    /// `tokens` output tokens at `slower` ticks per token (in `1 / GAP_SCALE`) in the fastest
    /// backend's prefill time (its rate served alone before any window); 0 while no rate is
    /// known.
    fn in_fastest_time(&self, tokens: u64, slower: u64) -> u64 {
        let fastest = self.cost_rate();
        if fastest.0 == 0 {
            return 0;
        }
        let delay = u128::from(tokens) * u128::from(slower) * u128::from(fastest.0)
            / (u128::from(decode::GAP_SCALE) * u128::from(fastest.1));
        u64::try_from(delay).unwrap_or(u64::MAX)
    }

    /// A whole response's client waits for its decode too: the expected output at `backend`'s
    /// gap beyond the least gap of the usable backends and the tolerance above it, in the
    /// fastest backend's prefill time.
    fn decode_delay(&self, backend: u16) -> u64 {
        let Some(least) = self.least_gap() else { return 0 };
        let tolerated = least + least / 100 * decode::GAP_TOLERANCE_PERCENT;
        let slower = self.gap(backend).saturating_sub(tolerated);
        self.in_fastest_time(self.expected_output(), slower)
    }

    /// A stream's client waits for the steps that bring its first token: `FIRST_TOKEN_STEPS`
    /// at the whole of `backend`'s gap beyond the least, once it is more than the tolerance
    /// above the least (none within it), in the fastest backend's prefill time.
    fn first_token_delay(&self, backend: u16) -> u64 {
        let Some(least) = self.least_gap() else { return 0 };
        let gap = self.gap(backend);
        if gap <= least + least / 100 * decode::GAP_TOLERANCE_PERCENT {
            return 0;
        }
        self.in_fastest_time(FIRST_TOKEN_STEPS, gap - least)
    }

    /// `work` tokens on `backend` in tokens of the fastest backend's time.
    pub(super) fn at_fastest(&self, work: u64, backend: u16) -> u64 {
        let fastest = self.fastest();
        let rate = self.drain_rate(backend);
        if rate.0 == 0 || fastest.0 == 0 {
            return work;
        }
        // A rate within the tolerance of the fastest counts as the fastest.
        let (slow, fast) = (
            u128::from(fastest.0) * u128::from(rate.1) * 100,
            u128::from(rate.0) * u128::from(fastest.1),
        );
        if slow <= fast * u128::from(100 + RATE_TOLERANCE_PERCENT) {
            return work;
        }
        let scaled = u128::from(work) * u128::from(fastest.0) * u128::from(rate.1)
            / (u128::from(fastest.1) * u128::from(rate.0));
        u64::try_from(scaled).unwrap_or(u64::MAX)
    }

    /// The first eligible backend with nothing in flight or held whose decode speed is not
    /// known and whose engine exported at least half the largest KV capacity, while a usable
    /// backend has requests in flight.
    fn unexplored(&self, now: Tick) -> Option<u16> {
        let busy = (0..self.p.backends).any(|b| self.usable(b) && self.backend_inflight(b) > 0);
        if !busy {
            return None;
        }
        let capacity = |b: u16| self.learned[usize::from(b)].capacity;
        let largest = (0..self.p.backends).map(capacity).max().unwrap_or(0);
        (0..self.p.backends).find(|&b| {
            self.eligible(b, now)
                && self.backend_inflight(b) == 0
                && self.holds_on(b) == 0
                && self.gap(b) == 0
                && capacity(b).saturating_mul(2) >= largest
        })
    }

    /// S16: the first request of the scan that can be placed, and where.
    pub(super) fn place(&mut self, now: Tick, head: Option<u16>) -> Option<(usize, u16)> {
        let scan = (self.p.prefix.scan_max as usize).max(1);
        let mut earliest: Option<Tick> = None;
        for index in self.in_order(head, scan) {
            let request = &self.queued[index];
            let home = request.home;
            if request.blocks.is_empty()
                && home != NONE
                && home != request.avoid
                && self.eligible(home, now)
            {
                return Some((index, home));
            }
            if request.streaming && request.turn == 1 && request.lane != Lane::Retry {
                if let Some(b) = self.unexplored(now) {
                    return Some((index, b));
                }
            }
            let cost = |b: u16| self.cost(request, b, now);
            let best = |filter: &dyn Fn(u16) -> bool| {
                (0..self.p.backends).filter(|&b| filter(b)).min_by_key(|&b| {
                    let capacity = self.learned[usize::from(b)].capacity;
                    (cost(b), self.backend_inflight(b), std::cmp::Reverse(capacity))
                })
            };
            let avoid = request.avoid;
            let Some(cheapest) =
                best(&|b| self.usable(b) && b != avoid).or_else(|| best(&|b| self.usable(b)))
            else {
                continue;
            };
            let eligible = |b: u16| self.eligible(b, now);
            let Some(taken) = best(&|b| eligible(b) && b != avoid).or_else(|| best(&eligible))
            else {
                continue;
            };
            if taken == cheapest || matches!(request.lane, Lane::Retry | Lane::Forced) {
                return Some((index, taken));
            }
            let lost =
                self.uncached(request, taken).saturating_sub(self.uncached(request, cheapest));
            if lost <= self.p.prefix.slack_tokens {
                return Some((index, taken));
            }
            let weighted =
                self.cache_cost(request, taken).saturating_sub(self.cache_cost(request, cheapest));
            let wait = match self.rate(taken) {
                (0, _) => self.p.prefix.wait_max,
                (tokens, ticks) => {
                    let t = u128::from(weighted) * u128::from(ticks) / u128::from(tokens);
                    u64::try_from(t).unwrap_or(u64::MAX).min(self.p.prefix.wait_max)
                }
            };
            if now.saturating_sub(request.arrived_at) >= wait {
                return Some((index, taken));
            }
            let ends = request.arrived_at.saturating_add(wait);
            earliest = Some(earliest.map_or(ends, |e| e.min(ends)));
            if !request.placement_waited {
                self.queued[index].placement_waited = true;
                self.stats.placement_waits += 1;
            }
        }
        if let Some(at) = earliest {
            if self.placement_deadline.is_none_or(|armed| armed > at) {
                self.placement_deadline = Some(at);
            }
        }
        None
    }
}

/// S16's estimate of a backend's non-streaming backlog ([`super::super::unstreamed`]), restated
/// with the whole history of where each request began.
#[derive(Debug, Clone)]
pub(super) struct Unstreamed {
    starts: Vec<u64>,
    sent: u64,
    /// What the engine had cleared at `at`.
    done: u64,
    at: Tick,
}

impl Unstreamed {
    pub(super) const NEW: Unstreamed = Unstreamed { starts: Vec::new(), sent: 0, done: 0, at: 0 };

    /// What is left at `now` for an engine clearing `rate` tokens per tick.
    pub(super) fn left(&self, rate: (u64, u64), now: Tick) -> u64 {
        let cleared = match rate {
            (0, _) | (_, 0) => 0,
            (tokens, ticks) => u128::from(now - self.at) * u128::from(tokens) / u128::from(ticks),
        };
        let cleared = u64::try_from(cleared).unwrap_or(u64::MAX);
        (self.sent - self.done).saturating_sub(cleared)
    }

    /// The cleared tokens at `now`, from which the next change counts.
    fn now(&mut self, rate: (u64, u64), now: Tick) -> u64 {
        let done = self.sent - self.left(rate, now);
        self.at = now;
        done
    }

    /// A request of `tokens` sent at `now`; where its tokens end.
    pub(super) fn sent(&mut self, tokens: u64, rate: (u64, u64), now: Tick) -> u64 {
        self.done = self.now(rate, now);
        self.starts.push(self.sent);
        self.sent += tokens;
        self.sent
    }

    /// A scrape found `waiting` of these requests not begun: the latest ones.
    pub(super) fn bound(&mut self, waiting: u32, rate: (u64, u64), now: Tick) {
        let done = self.now(rate, now);
        let n = self.starts.len();
        let waiting = (waiting as usize).min(n);
        // Only the last RECENT_SENDS starts are known to the scheduler.
        let known = |i: usize| (i + RECENT_SENDS >= n).then(|| self.starts[i]);
        let upper = if waiting == 0 {
            self.sent
        } else {
            known(n - waiting).unwrap_or_else(|| self.starts[n - RECENT_SENDS])
        };
        let begun = BEGUN_PREFILLING as usize;
        let lower = (n - waiting).checked_sub(begun).and_then(|i| {
            // Known and at least BEGUN_PREFILLING short of the oldest known.
            (waiting + begun <= RECENT_SENDS).then(|| known(i)).flatten()
        });
        self.done = done.max(lower.unwrap_or(0)).min(upper);
    }
}

impl Reference {
    /// A scrape found `waiting` requests waiting on `backend`, where warmpath has `own`
    /// pending and `unstreamed` non-streaming requests: of what waits after the pending ones,
    /// its non-streaming ones bound its non-streaming backlog.
    pub(super) fn unstreamed_waiting(
        &mut self,
        now: Tick,
        backend: u16,
        waiting: Option<u32>,
        own: u32,
        unstreamed: u32,
    ) {
        let Some(waiting) = waiting else { return };
        let theirs = (waiting - waiting.min(own)).min(unstreamed);
        let rate = self.drain_rate(backend);
        self.backends[usize::from(backend)].unstreamed.bound(theirs, rate, now);
    }

    /// An admitted request left: a non-streaming one moves its backend's cursor to its place
    /// when it ended with a response (`ended`), and clears the rest when it was the last.
    pub(super) fn unstreamed_gone(&mut self, now: Tick, gone: &Admitted, ended: bool) {
        if gone.request.streaming {
            return;
        }
        let backend = gone.backend;
        let rate = self.drain_rate(backend);
        let last = !self.admitted.iter().any(|a| a.backend == backend && !a.request.streaming);
        let u = &mut self.backends[usize::from(backend)].unstreamed;
        let done = u.now(rate, now);
        u.done = if last {
            u.sent
        } else if ended {
            done.max(gone.place)
        } else {
            done
        };
    }
}
