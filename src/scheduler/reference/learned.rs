//! What the reference learns (issue \[8\], [`super::super::estimate`]), restated from its
//! definitions: tokens per byte, each backend's prefill rate from its first bytes, the
//! budget's moves on each snapshot, and what a snapshot reports (KV capacity and pressure,
//! prefix-cache counters, a restart).

use crate::clock::Tick;

use super::super::estimate::{self, rate_order};
use super::super::tracker::reference::SessionTracker;
use super::super::{cache_model, decode};
use super::super::{Budget, EngineCache, RequestId, Routing, Snapshot, Usage};
use super::{Admitted, Reference};

/// What the reference learns of a backend.
#[derive(Debug, Clone)]
pub(super) struct Learned {
    pub(super) last_first_byte: Tick,
    /// The window being filled: tokens, ticks, first bytes, the largest request's tokens.
    pub(super) window: (u64, u64, u32, u64),
    /// Every closed window, oldest first.
    pub(super) windows: Vec<(u64, u64)>,
    /// Tokens and times to first byte of the requests that had the backend's prefill to
    /// themselves, halved past `estimate::ALONE_HORIZON` ticks.
    pub(super) alone: (u64, u64),
    /// The learned prefill budget (in effect under `auto`: [`Reference::budget`]).
    pub(super) budget: u64,
    /// The backlog reached the budget since the last snapshot.
    pub(super) filled: bool,
    /// The learned inflight cap, 0 before any (in effect under `inflight_learned`, never below
    /// the configured one: [`Reference::cap`]).
    pub(super) cap: u32,
    /// Inflight plus holds reached the cap since the last snapshot.
    pub(super) cap_filled: bool,
    pub(super) capacity: u64,
    pub(super) counters: Option<(u64, u64)>,
    /// The calibration period: tokens placed, predicted cached, engine cached; per-response
    /// figures seen.
    pub(super) period: (u64, u64, u64, bool),
    pub(super) counter_seen: bool,
    pub(super) index_scale: u32,
    /// Engine restarts seen in the counters or reported, and the tick of the last.
    pub(super) restarts: u64,
    pub(super) restarted_at: Tick,
    /// The KV usage averaged over the scrapes, millionths: each moves it a
    /// `KV_PRESSURE_SCRAPES`th of the way to the usage it reports.
    pub(super) pressure: u64,
    /// What taught its decode speed, oldest first: each streaming response's output tokens
    /// after the first and ticks from first byte to end, and each sample of the engine's own
    /// inter-token counters.
    pub(super) decode: Vec<DecodeSeen>,
    /// The engine's inter-token counters (ticks, tokens) at the last sample, or at the first
    /// scrape that exported them.
    pub(super) itl: Option<(u64, u64)>,
}

/// One thing that taught a backend's decode speed.
#[derive(Debug, Clone, Copy)]
pub(super) enum DecodeSeen {
    /// A streaming response: output tokens after the first, ticks from first byte to end.
    Response(u64, u64),
    /// The engine's inter-token sum and count grew by (ticks, tokens) since the last sample.
    Engine(u64, u64),
}

impl Learned {
    /// A snapshot's prefix-cache counters: the hits over the queries since the last ones
    /// stand for the calibration period's engine side when no response reported its own.
    pub(super) fn count(&mut self, queries: u64, hits: u64) {
        if let Some((q0, h0)) = self.counters {
            if queries > q0 && hits >= h0 {
                let (dq, dh) = (queries - q0, (hits - h0).min(queries - q0));
                self.counter_seen = true;
                if !self.period.3 {
                    let share = u128::from(dh) * u128::from(self.period.0) / u128::from(dq);
                    self.period.2 = u64::try_from(share).unwrap_or(u64::MAX);
                }
            }
        }
        self.counters = Some((queries, hits));
    }

    /// Nothing learned yet.
    pub(super) fn new() -> Learned {
        Learned {
            last_first_byte: 0,
            window: (0, 0, 0, 0),
            windows: Vec::new(),
            alone: (0, 0),
            budget: estimate::BUDGET_UNLEARNED,
            filled: false,
            cap: 0,
            cap_filled: false,
            capacity: 0,
            counters: None,
            period: (0, 0, 0, false),
            counter_seen: false,
            index_scale: cache_model::INDEX_SCALE_START,
            restarts: 0,
            restarted_at: 0,
            pressure: 0,
            decode: Vec::new(),
            itl: None,
        }
    }
}

impl Reference {
    pub(super) fn first_byte(&mut self, now: Tick, id: RequestId) {
        let Some(index) = self.find_admitted(id) else { return };
        let a = &mut self.admitted[index];
        self.backends[usize::from(a.backend)].failures = 0;
        if !a.prefill_pending {
            return;
        }
        a.prefill_pending = false;
        let (backend, admitted_at, tokens) = (a.backend, a.admitted_at, u64::from(a.backlog));
        self.backends[usize::from(backend)].prefill_left_at = now;
        let others = self.admitted.iter().any(|a| a.backend == backend && a.prefill_pending);
        let l = &mut self.learned[usize::from(backend)];
        // Admitted before the previous first byte: its service began at that first byte.
        if admitted_at < l.last_first_byte {
            l.window.0 += tokens;
            l.window.1 += now - l.last_first_byte;
            l.window.2 += 1;
            l.window.3 = l.window.3.max(tokens);
            // It closes once no one request dominates it, or when it is long.
            let diluted = l.window.0 >= estimate::WINDOW_DOMINANCE * l.window.3;
            if l.window.2 >= estimate::WINDOW_EVENTS_MAX
                || (l.window.2 >= estimate::WINDOW_EVENTS && diluted)
            {
                let closed = (l.window.0, l.window.1.max(1));
                l.window = (0, 0, 0, 0);
                if closed.0 > 0 {
                    l.windows.push(closed);
                }
            }
        } else if !others {
            // Nothing else pending there and no first byte since it was sent: its time to
            // first byte is its own prefill (and the trip).
            l.alone.0 += tokens;
            l.alone.1 += now - admitted_at;
            if l.alone.1 > estimate::ALONE_HORIZON {
                l.alone = (l.alone.0 / 2, l.alone.1 / 2);
            }
        }
        l.last_first_byte = now;
        self.admitted[index].first_byte_at = now;
    }

    /// The learned prefill rate of `backend`: the median of its last windows, or `(0, 0)`.
    pub(super) fn rate(&self, backend: u16) -> (u64, u64) {
        let windows = &self.learned[usize::from(backend)].windows;
        let last = &windows[windows.len().saturating_sub(estimate::RATE_WINDOWS)..];
        let mut sorted = last.to_vec();
        sorted.sort_by(|&a, &b| rate_order(a, b));
        sorted.get(sorted.len() / 2).copied().unwrap_or((0, 0))
    }

    /// The estimated tokens of `bytes` at the learned tokens per byte.
    pub(super) fn tokens_of(&self, bytes: u64) -> u64 {
        let (tokens, per) = (self.tokens.0, self.tokens.1.max(1));
        let estimate = u32::try_from(bytes * tokens / per).unwrap_or(u32::MAX);
        u64::from(estimate.max(u32::from(bytes > 0)))
    }

    /// What a snapshot says of `backend`'s engine caches: its KV capacity and usage, its
    /// prefix-cache counters, a restart.
    fn engine_caches(&mut self, now: Tick, backend: u16, snapshot: &Snapshot) {
        let cache = snapshot.cache;
        let b = usize::from(backend);
        let l = &mut self.learned[b];
        let changed =
            cache.kv_capacity_tokens != 0 && u64::from(cache.kv_capacity_tokens) != l.capacity;
        if cache.kv_capacity_tokens != 0 {
            l.capacity = u64::from(cache.kv_capacity_tokens);
        }
        if cache.kv_usage_micro != EngineCache::NO_USAGE {
            let usage = u64::from(cache.kv_usage_micro).min(1_000_000);
            let n = cache_model::KV_PRESSURE_SCRAPES;
            l.pressure = (l.pressure * (n - 1) + usage) / n;
        }
        let (queries, hits) = (cache.prefix_queries, cache.prefix_hits);
        let counted = queries != EngineCache::NO_COUNTER && hits != EngineCache::NO_COUNTER;
        // A new engine: said by the report (its address moved), or a counter that went down.
        let went_down = l.counters.is_some_and(|(q0, h0)| queries < q0 || hits < h0);
        if snapshot.new_engine || counted && went_down {
            // Its caches are empty: the index forgets every block, the calibration period
            // starts again, and so do the counters' baseline.
            l.restarts += 1;
            l.restarted_at = now;
            l.period = (0, 0, 0, false);
            l.counters = None;
            if self.p.routing == Routing::PrefixCost {
                self.indexes[b] = SessionTracker::with_capacity(self.index_capacity[b]);
            }
        }
        if counted {
            l.count(queries, hits);
        }
        if changed || self.calibrate(backend) {
            self.resize_index(backend);
        }
    }

    pub(super) fn snapshot(&mut self, now: Tick, backend: u16, snapshot: Snapshot) {
        self.engine_caches(now, backend, &snapshot);
        self.engine_itl(backend, snapshot.cache, snapshot.new_engine);
        let (b, cache) = (usize::from(backend), snapshot.cache);
        let stale_after = self.p.metrics_stale_after;
        let (own, unstreamed, decoding) = self.admitted_kinds(backend);
        let queued = !self.queued.is_empty();
        let preempted = self.preempted(backend, cache.preemptions, snapshot.new_engine);
        let state = &mut self.backends[b];
        state.healthy = snapshot.healthy;
        if snapshot.healthy && state.ejected && snapshot.scraped_at > state.ejected_at {
            state.ejected = false;
            state.failures = 0;
        }
        state.waiting = snapshot.waiting;
        state.scraped_at = snapshot.scraped_at;
        self.unstreamed_waiting(now, backend, snapshot.waiting, own, unstreamed);
        // Warmpath's pending requests, then its non-streaming ones, then as many of its
        // decoding ones as the engine preempted since the last report, may be the waiting ones.
        let split = snapshot.waiting.map(|waiting| {
            let mine = waiting.min(own);
            let unseen = (waiting - mine).min(unstreamed);
            let rest = waiting - mine - unseen;
            let requeued = u64::from(rest.min(decoding)).min(preempted) as u32;
            (mine, unseen, rest - requeued)
        });
        if let (true, Some(split)) = (self.p.inflight_learned, split) {
            self.learn_cap(backend, split, queued);
        }
        let step = self.gap(backend) / decode::GAP_SCALE;
        let state = &mut self.backends[b];
        if let (Budget::Auto, Some((mine, _, others))) = (self.p.prefill_tokens_per_backend, split)
        {
            state.waiting = Some(others);
            // As many as were sent in one engine step, at the rate they were sent since the
            // last snapshot, wait for the engine's next step whether or not it has room.
            let arrivals = std::mem::take(&mut state.arrivals);
            let interval = now.saturating_sub(std::mem::replace(&mut state.snapshot_at, now));
            let arriving = (arrivals * step).checked_div(interval).unwrap_or(0);
            let mine = u64::from(mine).saturating_sub(arriving) as u32;
            let l = &mut self.learned[b];
            let held_back = std::mem::take(&mut l.filled) && queued;
            if held_back {
                let old = l.budget;
                if mine < estimate::WAITING_TARGET && own > estimate::WAITING_TARGET {
                    l.budget = (old + old.div_ceil(4)).min(estimate::BUDGET_MAX);
                } else if mine > estimate::WAITING_TARGET {
                    l.budget = (old - old / 8).max(estimate::BUDGET_MIN);
                }
            }
        }
        let state = &mut self.backends[b];
        let stale_at = snapshot.scraped_at.saturating_add(stale_after);
        let positive = state.waiting.is_some_and(|w| w > 0);
        state.stale_deadline = (positive && stale_at > now).then_some(stale_at);
    }

    /// A snapshot's move of `backend`'s learned inflight cap, by the engine's waiting requests
    /// as the budget reads them (`split`: warmpath's pending ones, which steer the budget, its
    /// non-streaming ones and someone else's), when the cap held requests back (`queued` is
    /// whether any are).
    fn learn_cap(&mut self, backend: u16, (_, unseen, others): (u32, u32, u32), queued: bool) {
        let cap = self.cap(backend);
        let full = self.backend_inflight(backend) + self.holds_on(backend) >= cap;
        let l = &mut self.learned[usize::from(backend)];
        if (std::mem::take(&mut l.cap_filled) || full) && queued {
            let floor = self.p.inflight_per_backend;
            let ceiling = estimate::INFLIGHT_MAX.max(floor);
            if unseen <= estimate::WAITING_TARGET && others == 0 {
                l.cap = (cap + cap.div_ceil(4)).min(ceiling);
            } else if unseen > estimate::WAITING_TARGET {
                l.cap = (cap - cap / 8).max(floor);
            }
        }
    }

    /// Warmpath's requests in flight on `backend`: streaming ones without a first byte,
    /// non-streaming ones, and streaming ones past their first byte (decoding).
    fn admitted_kinds(&self, backend: u16) -> (u32, u32, u32) {
        let mut kinds = (0, 0, 0);
        for a in self.admitted.iter().filter(|a| a.backend == backend) {
            match (a.request.streaming, a.prefill_pending) {
                (true, true) => kinds.0 += 1,
                (false, _) => kinds.1 += 1,
                (true, false) => kinds.2 += 1,
            }
        }
        kinds
    }

    /// The engine's preemptions since the last report with its counter (`counter`): all of a
    /// new engine's, or of one whose counter went down; none at the first.
    fn preempted(&mut self, backend: u16, counter: u64, new_engine: bool) -> u64 {
        if counter == EngineCache::NO_COUNTER {
            return 0;
        }
        let last = self.backends[usize::from(backend)].preemptions.replace(counter);
        match last {
            Some(last) if !new_engine && counter >= last => counter - last,
            Some(_) => counter,
            None if new_engine => counter,
            None => 0,
        }
    }

    /// The inflight cap in effect on `backend`: the configured one, or under `inflight_learned`
    /// the learned one, never below it.
    pub(super) fn cap(&self, backend: u16) -> u32 {
        let floor = self.p.inflight_per_backend;
        if self.p.inflight_learned {
            self.learned[usize::from(backend)].cap.max(floor)
        } else {
            floor
        }
    }

    /// The prefill budget in effect on `backend`: the configured one, or under `auto` the
    /// learned one (which moves only under `auto`, and is where it stopped when a reload
    /// switches back to it).
    pub(super) fn budget(&self, backend: u16) -> u64 {
        match self.p.prefill_tokens_per_backend {
            Budget::Auto => self.learned[usize::from(backend)].budget,
            Budget::Tokens(tokens) => tokens,
        }
    }

    /// The fastest learned rate, `(0, 0)` when none is known.
    pub(super) fn fastest(&self) -> (u64, u64) {
        self.fastest_backend().map_or((0, 0), |b| self.rate(b))
    }

    /// The rate S16's cost puts a time in tokens at: the fastest learned rate, else the
    /// fastest rate served alone; `(0, 0)` when neither is known.
    pub(super) fn cost_rate(&self) -> (u64, u64) {
        if let Some(b) = self.fastest_backend() {
            return self.rate(b);
        }
        let mut best = (0, 0);
        for b in 0..self.p.backends {
            let r = self.alone_rate(b);
            if r.0 > 0
                && (best.0 == 0
                    || u128::from(r.0) * u128::from(best.1) > u128::from(best.0) * u128::from(r.1))
            {
                best = r;
            }
        }
        best
    }

    /// The backend of the fastest learned rate, the first of equals.
    fn fastest_backend(&self) -> Option<u16> {
        let mut fastest: Option<u16> = None;
        for b in 0..self.p.backends {
            let r = self.rate(b);
            let faster = |f: u16| {
                let f = self.rate(f);
                u128::from(r.0) * u128::from(f.1) > u128::from(f.0) * u128::from(r.1)
            };
            if r.0 > 0 && fastest.is_none_or(faster) {
                fastest = Some(b);
            }
        }
        fastest
    }

    /// The tokens over the times to first byte of `backend`'s requests served alone.
    fn alone_rate(&self, backend: u16) -> (u64, u64) {
        let (tokens, ticks) = self.learned[usize::from(backend)].alone;
        if tokens > 0 {
            (tokens, ticks.max(1))
        } else {
            (0, 0)
        }
    }

    /// The rate `backend` is taken to clear at: its own; else the fastest's times the ratio of
    /// their rates served alone, when both have one; else the fastest's.
    pub(super) fn drain_rate(&self, backend: u16) -> (u64, u64) {
        let rate = self.rate(backend);
        if rate.0 > 0 {
            return rate;
        }
        let Some(f) = self.fastest_backend() else { return (0, 0) };
        let (of, to) = (self.alone_rate(backend), self.alone_rate(f));
        estimate::scale_rate(self.rate(f), of, to).unwrap_or(self.rate(f))
    }

    /// What a successful response's output tokens teach: a streamed one that had its first
    /// byte, its backend's decode speed; a non-streaming one, the model's expected output.
    pub(super) fn learn_output(&mut self, now: Tick, done: &Admitted, tokens: u32) {
        if tokens == 0 {
            return;
        }
        if !done.request.streaming {
            self.output = (self.output.0 + u64::from(tokens), self.output.1 + 1);
            if self.output.1 > decode::OUTPUT_HORIZON {
                self.output = (self.output.0 / 2, self.output.1 / 2);
            }
        } else if !done.prefill_pending && tokens > 1 {
            let span = now - done.first_byte_at;
            let seen = DecodeSeen::Response(u64::from(tokens - 1), span);
            self.learned[usize::from(done.backend)].decode.push(seen);
        }
    }

    /// `backend`'s ticks per output token in `1 / decode::GAP_SCALE`: windows closed by every
    /// `decode::DECODE_WINDOW_RESPONSES` streaming responses (their tokens over their ticks)
    /// and by each sample of the engine's counters (its own), in the order they closed; the
    /// least of the last `decode::DECODE_WINDOWS`; 0 before the first.
    pub(super) fn gap(&self, backend: u16) -> u64 {
        let ratio = |tokens: u64, ticks: u64| {
            let gap = u128::from(ticks) * u128::from(decode::GAP_SCALE) / u128::from(tokens);
            u64::try_from(gap).unwrap_or(u64::MAX).max(1)
        };
        let mut windows = Vec::new();
        let mut open: Vec<(u64, u64)> = Vec::new();
        for seen in &self.learned[usize::from(backend)].decode {
            match *seen {
                DecodeSeen::Engine(ticks, tokens) => windows.push(ratio(tokens, ticks)),
                DecodeSeen::Response(tokens, ticks) => {
                    open.push((tokens, ticks));
                    if open.len() == decode::DECODE_WINDOW_RESPONSES as usize {
                        let tokens: u64 = open.iter().map(|r| r.0).sum();
                        let ticks = open.iter().fold(0u64, |sum, r| sum.saturating_add(r.1));
                        windows.push(ratio(tokens, ticks));
                        open.clear();
                    }
                }
            }
        }
        let last = &windows[windows.len().saturating_sub(decode::DECODE_WINDOWS)..];
        last.iter().copied().min().unwrap_or(0)
    }

    /// A snapshot's inter-token counters of `backend`'s engine: a sample once the count grew
    /// by `decode::ENGINE_SAMPLE_TOKENS` since the last; a counter that went down, a new
    /// engine or counters not exported start over.
    fn engine_itl(&mut self, backend: u16, cache: EngineCache, new_engine: bool) {
        let l = &mut self.learned[usize::from(backend)];
        let now = (cache.itl_ticks, cache.itl_count);
        if now.0 == EngineCache::NO_COUNTER || now.1 == EngineCache::NO_COUNTER {
            l.itl = None;
            return;
        }
        match l.itl {
            Some(last) if !new_engine && now.0 >= last.0 && now.1 >= last.1 => {
                if now.1 - last.1 >= decode::ENGINE_SAMPLE_TOKENS {
                    l.decode.push(DecodeSeen::Engine(now.0 - last.0, now.1 - last.1));
                    l.itl = Some(now);
                }
            }
            _ => l.itl = Some(now),
        }
    }

    /// The mean output tokens of the model's non-streaming responses; 0 before the first.
    pub(super) fn expected_output(&self) -> u64 {
        self.output.0.checked_div(self.output.1).unwrap_or(0)
    }

    /// What a completed request's `usage` teaches: tokens per byte, and what its engine found
    /// cached for the calibration period.
    pub(super) fn learn_usage(&mut self, done: &Admitted, usage: Usage) {
        if usage.prompt_tokens == 0 {
            return;
        }
        let backend = done.backend;
        let bytes = u64::from(done.request.prompt_bytes);
        let estimated = self.tokens_of(bytes);
        if bytes > 0 {
            if self.tokens.2 == 0 {
                (self.tokens.0, self.tokens.1) = (0, 0);
            }
            self.tokens.0 += u64::from(usage.prompt_tokens);
            self.tokens.1 += bytes;
            while self.tokens.1 > estimate::TOKEN_RATE_HORIZON {
                self.tokens.0 = self.tokens.0.div_ceil(2);
                self.tokens.1 = self.tokens.1.div_ceil(2);
            }
            self.tokens.2 += 1;
        }
        if usage.cached_tokens != Usage::UNKNOWN_CACHED {
            let l = &mut self.learned[usize::from(backend)];
            l.period.3 = true;
            let scaled = u128::from(usage.cached_tokens) * u128::from(estimated)
                / u128::from(usage.prompt_tokens);
            l.period.2 += u64::try_from(scaled).unwrap_or(u64::MAX);
            if self.calibrate(backend) {
                self.resize_index(backend);
            }
        }
    }
}
