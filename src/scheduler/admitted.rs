//! The life of an admitted request in the scheduler: its admission to a backend (`bind`), its
//! first byte, its end, and what each teaches the estimates (`estimate`, `decode`); the
//! per-backend counts S6 and S16 read (in flight, the prefill backlog, the non-streaming
//! backlog, the contexts held) rise and fall here, and `check_invariants` recounts them.

use super::queue::{Entry, Identity, Place};
use super::{Lane, Output, RequestId, Scheduler, Tick, Usage};

impl Scheduler {
    /// The admitted entry of `id`, or `None` (counted as a stale event).
    pub(super) fn admitted(&mut self, id: RequestId) -> Option<u32> {
        let index = self.queue.find(id.0).filter(|&i| self.queue.get(i).place == Place::Admitted);
        if index.is_none() {
            self.stats.stale_events += 1;
        }
        index
    }

    pub(super) fn first_byte(&mut self, now: Tick, id: RequestId) {
        let Some(index) = self.admitted(id) else { return };
        let entry = *self.queue.get(index);
        let b = usize::from(entry.backend);
        self.backends[b].consecutive_failures = 0;
        if !entry.prefill_pending {
            return;
        }
        let tokens = u64::from(self.learned.backlog[index as usize]);
        let backend = &mut self.backends[b];
        backend.prefill_tokens -= tokens;
        backend.prefill_pending -= 1;
        backend.prefill_since = now;
        backend.held_bytes += u64::from(entry.prompt_bytes);
        self.queue.get_mut(index).prefill_pending = false;
        let admitted_at = self.learned.admission[index as usize];
        let alone = backend.prefill_pending == 0;
        self.learned.prefill[b].first_byte(now, admitted_at, tokens, alone);
        // From here the request's end measures its backend's decode speed.
        self.learned.admission[index as usize] = now;
    }

    pub(super) fn complete(&mut self, now: Tick, id: RequestId, success: bool, usage: Usage) {
        let Some(index) = self.queue.unindex(id.0, |entry| entry.place == Place::Admitted) else {
            self.stats.stale_events += 1;
            return;
        };
        let entry = *self.queue.get(index);
        self.learn_usage(now, &entry, usage);
        if success {
            self.learn_output(now, index, &entry, usage.completion_tokens);
        }
        self.release_slot(now, index, true);
        if success && matches!(entry.identity, Identity::Derived | Identity::Fresh) {
            self.record_end(index, entry.session);
        }
        self.drop_prompt(index);
        self.queue.release(index);
        if !success {
            return;
        }
        self.backends[usize::from(entry.backend)].consecutive_failures = 0;
        if entry.has_session() {
            self.tracker.complete(entry.session, now, entry.backend);
            // A fresh derived session is a lone request until a next turn proves otherwise:
            // no slot is held for a follow-up that most such requests never have.
            if entry.identity != Identity::Fresh {
                self.start_hold(now, entry.session, entry.backend);
            }
        }
    }

    /// Admits the (already unqueued) entry `index` to `backend`.
    pub(super) fn bind(
        &mut self,
        now: Tick,
        index: u32,
        backend: u16,
        lane: Lane,
        affinity: bool,
        out: &mut Vec<Output>,
    ) {
        self.count_admission(lane, self.queue.tenant_of(index));
        let (tokens, predicted) = self.record_placement(now, index, backend);
        let entry = self.queue.get_mut(index);
        entry.place = Place::Admitted;
        entry.backend = backend;
        entry.prefill_pending = entry.streaming;
        let (id, waited, pending) = (entry.id, now - entry.arrived_at, entry.prefill_pending);
        let (streaming, bytes) = (entry.streaming, entry.prompt_bytes);
        let (turn, warm) = (entry.turn, predicted.unwrap_or(affinity));
        let derived = entry.identity == Identity::Derived;
        let slot = index as usize;
        let state = &mut self.backends[usize::from(backend)];
        self.learned.backlog[slot] = tokens;
        state.inflight += 1;
        state.cap_filled |= state.inflight + state.holds >= state.cap;
        self.learned.admission[slot] = if streaming {
            now
        } else {
            state.unstreamed += 1;
            state.held_bytes += u64::from(bytes);
            let rate = self.learned.drain_rate(backend);
            state.unstreamed_backlog.sent(u64::from(tokens), rate, now)
        };
        if pending {
            if state.prefill_pending == 0 {
                state.prefill_since = now;
            }
            state.prefill_tokens += u64::from(tokens);
            state.prefill_pending += 1;
            state.arrivals = state.arrivals.saturating_add(1);
            state.budget_filled |= state.budget > 0 && state.prefill_tokens >= state.budget;
        }
        self.inflight += 1;
        self.stats.affinity_hits += u64::from(affinity);
        let admit = Output::Admit {
            id: RequestId(id),
            backend,
            lane,
            waited,
            affinity,
            turn,
            warm,
            derived,
        };
        out.push(admit);
    }

    /// What a completed request's `usage` teaches: tokens per byte, and what the engine found
    /// cached against what the index predicted.
    pub(super) fn learn_usage(&mut self, now: Tick, entry: &Entry, usage: Usage) {
        if usage.prompt_tokens == 0 {
            return;
        }
        let estimated = u64::from(self.learned.tokens.tokens(entry.prompt_bytes));
        self.learned.tokens.observe(entry.prompt_bytes, usage.prompt_tokens, now);
        if usage.cached_tokens != Usage::UNKNOWN_CACHED {
            let cache = &mut self.learned.cache[usize::from(entry.backend)];
            cache.usage(usage.prompt_tokens, usage.cached_tokens, estimated);
            if cache.calibrate(now) {
                self.resize_index(entry.backend);
            }
        }
    }

    /// What a successful response's output of `tokens` teaches: a streamed one that had its
    /// first byte, its backend's decode speed; a non-streaming one, the model's expected
    /// output.
    pub(super) fn learn_output(&mut self, now: Tick, index: u32, entry: &Entry, tokens: u32) {
        if tokens == 0 {
            return;
        }
        if !entry.streaming {
            self.learned.output.observe(tokens);
        } else if !entry.prefill_pending {
            let span = now.saturating_sub(self.learned.admission[index as usize]);
            self.learned.decode[usize::from(entry.backend)].observe(tokens - 1, span, now);
        }
    }

    /// Counts an admission from `lane` of a request of `tenant`, for S4 and S5 (per tenant).
    pub(super) fn count_admission(&mut self, lane: Lane, tenant: u16) {
        self.stats.admitted[lane as usize] += 1;
        let normal_waiting = self.queue.tenant_lane_len(tenant, Lane::Normal) > 0;
        let state = self.fair.get_mut(tenant);
        match lane {
            Lane::Boosted => {
                state.boosted_admits += 1;
                state.streak = if normal_waiting { state.streak + 1 } else { 0 };
            }
            Lane::Forced => state.boosted_admits += 1,
            Lane::Normal => state.streak = 0,
            Lane::Retry => {}
        }
    }

    /// Releases the slot of admitted entry `index` (S12, S14); the entry stays allocated.
    /// `ended`: its response ended, so its prefill is over (not a cancel or a retry).
    pub(super) fn release_slot(&mut self, now: Tick, index: u32, ended: bool) {
        let tokens = u64::from(self.learned.backlog[index as usize]);
        let entry = self.queue.get_mut(index);
        let (backend, pending, streaming) = (entry.backend, entry.prefill_pending, entry.streaming);
        let bytes = entry.prompt_bytes;
        entry.place = Place::Free;
        entry.prefill_pending = false;
        let state = &mut self.backends[usize::from(backend)];
        state.inflight -= 1;
        if !pending {
            state.held_bytes -= u64::from(bytes);
        }
        if !streaming {
            let rate = self.learned.drain_rate(backend);
            state.unstreamed -= 1;
            let (last, backlog) = (state.unstreamed == 0, &mut state.unstreamed_backlog);
            if ended {
                backlog.ended(self.learned.admission[index as usize], last, rate, now);
            } else {
                backlog.dropped(last, rate, now);
            }
        }
        if pending {
            state.prefill_tokens -= tokens;
            state.prefill_pending -= 1;
            state.prefill_since = now;
        }
        self.inflight -= 1;
    }
}
