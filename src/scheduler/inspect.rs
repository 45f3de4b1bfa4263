//! Read-only views of a [`Scheduler`]: the accessors its host reads for reports and tests read
//! for assertions, and [`Scheduler::check_invariants`], the debug check of every structure and
//! of S14's accounting that tests and the fuzzer call after each step.

use crate::clock::Tick;
use crate::ring::prompt_pool::NO_PROMPT;

use super::derive::DerivedSessions;
use super::estimate::{BackendEstimates, TokenRate};
use super::policy::Backend;
use super::{placement, Lane, Params, RequestId, Scheduler, Stats, Timer};

/// A queued request as [`Scheduler::oldest_waiting`] lists it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Waiting {
    pub id: RequestId,
    pub arrived_at: Tick,
    pub lane: Lane,
    /// It named a session (any source).
    pub has_session: bool,
    /// Upstream attempts that failed retryably so far.
    pub retries: u8,
}

impl Scheduler {
    /// Whether `backend` was removed by a reconfiguration.
    pub fn backend_removed(&self, backend: u16) -> bool {
        self.backends[usize::from(backend)].removed
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// The parameters.
    pub fn params(&self) -> &Params {
        &self.params
    }

    /// Queued requests in `lane`.
    pub fn depth(&self, lane: Lane) -> u32 {
        self.queue.lane_len(lane)
    }

    /// Queued requests, all lanes.
    pub fn queued(&self) -> u32 {
        self.queue.queued()
    }

    /// Model-wide admitted requests.
    pub fn inflight(&self) -> u32 {
        self.inflight
    }

    /// Admitted requests on `backend`.
    pub fn backend_inflight(&self, backend: u16) -> u32 {
        self.backends[usize::from(backend)].inflight
    }

    /// Prefill backlog of `backend`, in estimated tokens.
    pub fn backend_prefill_tokens(&self, backend: u16) -> u64 {
        self.backends[usize::from(backend)].prefill_tokens
    }

    /// Slots of `backend` held for grace windows.
    pub fn backend_holds(&self, backend: u16) -> u32 {
        self.backends[usize::from(backend)].holds
    }

    /// Whether `backend` is healthy and not ejected.
    pub fn backend_usable(&self, backend: u16) -> bool {
        self.backends[usize::from(backend)].usable()
    }

    /// Whether `backend`'s last health check passed, and whether it is passively ejected.
    pub fn backend_health(&self, backend: u16) -> (bool, bool) {
        let b = &self.backends[usize::from(backend)];
        (b.healthy, b.ejected)
    }

    /// The waiting-queue gauge `backend` last reported, if any, and when it was scraped.
    pub fn backend_waiting(&self, backend: u16) -> (Option<u32>, Tick) {
        let b = &self.backends[usize::from(backend)];
        (b.waiting, b.scraped_at)
    }

    /// Visits the head of every non-empty lane list in arrival order (the forced and normal
    /// lanes are in arrival order and the boosted lane keeps an arrival-ordered list; the retry
    /// lane is in retry order, so a retried request behind an older one's retry is missed,
    /// which the lane's size, a few requests, makes harmless): the retry lane's, then those of
    /// each tenant with requests queued (issue \[11\]), lanes in serving order.
    fn lane_heads(&self, mut visit: impl FnMut(Lane, u32)) {
        if let Some(index) = self.queue.first(Lane::Retry, 0) {
            visit(Lane::Retry, index);
        }
        for tenant in self.fair.backlogged_tenants() {
            let heads = [
                (Lane::Forced, self.queue.first(Lane::Forced, tenant)),
                (Lane::Boosted, self.queue.oldest_boosted(tenant)),
                (Lane::Normal, self.queue.first(Lane::Normal, tenant)),
            ];
            for (lane, head) in heads {
                if let Some(index) = head {
                    visit(lane, index);
                }
            }
        }
    }

    /// The arrival tick of the longest-waiting queued request: the earliest among the lane
    /// heads ([`Scheduler::lane_heads`]), O(1) per tenant with requests queued.
    pub fn oldest_arrival(&self) -> Option<Tick> {
        let mut oldest: Option<Tick> = None;
        self.lane_heads(|_, index| {
            let at = self.queue.get(index).arrived_at;
            oldest = Some(oldest.map_or(at, |o| o.min(at)));
        });
        oldest
    }

    /// Appends to `out` (cleared first) the `max` longest-waiting queued requests, oldest
    /// first (ties: in lane-head order). Each arrival-ordered lane list is walked from its head
    /// while its entries would still make the list, inserting into `out` kept sorted and at
    /// most `max` long: O(`max`² per lane list) at worst whatever the queue's depth, and no
    /// allocation once `out` has room for `max` (the retry lane is in retry order, as for
    /// [`Scheduler::oldest_arrival`]).
    pub fn oldest_waiting(&self, max: usize, out: &mut Vec<Waiting>) {
        out.clear();
        if max == 0 {
            return;
        }
        self.lane_heads(|lane, head| {
            let mut next = Some(head);
            while let Some(index) = next {
                let entry = self.queue.get(index);
                let at = out.partition_point(|w| w.arrived_at <= entry.arrived_at);
                if at >= max {
                    break;
                }
                if out.len() == max {
                    out.pop();
                }
                let waiting = Waiting {
                    id: RequestId(entry.id),
                    arrived_at: entry.arrived_at,
                    lane,
                    has_session: entry.has_session(),
                    retries: entry.retries,
                };
                out.insert(at, waiting);
                next = self.queue.next_in_lane(index);
            }
        });
    }

    /// What the scheduler learned of `backend`.
    pub fn backend_estimates(&self, backend: u16) -> BackendEstimates {
        let b = usize::from(backend);
        let (prefill, cache) = (&self.learned.prefill[b], &self.learned.cache[b]);
        BackendEstimates {
            rate: prefill.rate,
            rate_at: prefill.rate_at,
            budget_at: prefill.budget_at,
            budget: self.backends[b].budget,
            inflight_cap: self.backends[b].cap,
            kv_capacity_tokens: cache.kv_capacity_tokens,
            kv_capacity_at: cache.kv_capacity_at,
            predicted_hit_micro: cache.predicted_micro,
            engine_hit_micro: cache.engine_micro,
            hit_ratio_at: cache.hit_ratio_at,
            counter_hit_micro: cache.counter_micro,
            counter_at: cache.counter_at,
            restarts: cache.restarts,
            restarted_at: cache.restarted_at,
            kv_pressure_micro: cache.kv_pressure_micro,
            kv_pressure_at: cache.kv_pressure_at,
            kv_held_micro: self.held_pressure(b),
            decode_weight: self.decode_weight(b),
            decode_gap: self.learned.decode[b].gap,
            decode_gap_at: self.learned.decode[b].gap_at,
            expected_output: self.learned.output.mean(),
            index_capacity: self
                .prefix
                .as_ref()
                .and_then(|p| p.indexes.get(b))
                .map_or(0, |i| i.capacity() as u64),
        }
    }

    /// The model's learned tokens per byte of request body.
    pub fn token_rate(&self) -> TokenRate {
        self.learned.tokens
    }

    /// Sessions in the tracker.
    pub fn sessions_tracked(&self) -> usize {
        self.tracker.len()
    }

    /// Sessions with a request queued or admitted (`warmpath_sessions_active`).
    pub fn sessions_active(&self) -> u32 {
        self.queue.sessions_active()
    }

    /// Bytes of every buffer the scheduler preallocated.
    pub fn heap_bytes(&self) -> usize {
        self.queue.heap_bytes()
            + self.tracker.heap_bytes()
            + self.wheel.heap_bytes()
            + self.holds.allocation_size()
            + self.backends.capacity() * std::mem::size_of::<Backend>()
            + self.expired.capacity() * std::mem::size_of::<(Tick, Timer)>()
            + self.prefix.as_ref().map_or(0, placement::Prefix::heap_bytes)
            + self.derived.as_ref().map_or(0, DerivedSessions::heap_bytes)
            + self.learned.heap_bytes()
            + self.fair.heap_bytes()
    }

    /// Checks every structure and the accounting of S14; panics on a violation.
    pub fn check_invariants(&self) {
        self.queue.check_invariants();
        self.fair.check_invariants(|tenant| self.queue.tenant_queued(tenant));
        self.tracker.check_invariants();
        self.wheel.check_invariants();
        let count = self.backends.len();
        let (mut inflight, mut prefill) = (vec![0u32; count], vec![0u64; count]);
        let (mut pending, mut unstreamed) = (vec![0u32; count], vec![0u32; count]);
        let mut held = vec![0u64; count];
        self.queue.for_each_admitted(|index, entry| {
            inflight[usize::from(entry.backend)] += 1;
            if !entry.prefill_pending {
                held[usize::from(entry.backend)] += u64::from(entry.prompt_bytes);
            }
            unstreamed[usize::from(entry.backend)] += u32::from(!entry.streaming);
            if entry.prefill_pending {
                prefill[usize::from(entry.backend)] +=
                    u64::from(self.learned.backlog[index as usize]);
                pending[usize::from(entry.backend)] += 1;
            }
        });
        let mut holds = vec![0u32; count];
        for hold in self.holds.values() {
            holds[usize::from(hold.backend)] += 1;
        }
        for (index, backend) in self.backends.iter().enumerate() {
            assert_eq!(backend.inflight, inflight[index], "inflight of backend {index}");
            assert_eq!(backend.prefill_tokens, prefill[index], "prefill backlog of {index}");
            assert_eq!(backend.prefill_pending, pending[index], "prefill requests of {index}");
            assert_eq!(backend.unstreamed, unstreamed[index], "non-streaming of {index}");
            assert_eq!(backend.held_bytes, held[index], "held prompt bytes of {index}");
            let empty = backend.unstreamed_backlog.is_empty();
            assert!(backend.unstreamed > 0 || empty, "non-streaming backlog of {index}");
            assert_eq!(backend.holds, holds[index], "holds of backend {index}");
            // A reconfiguration may lower the cap under a backend's inflight; no slot is held
            // then, and none is admitted until it is under the cap again. A learned cap goes
            // down under a backend's slots, held ones too, and never below the configured one.
            let slots = backend.inflight + backend.holds;
            let over = backend.holds == 0 && backend.inflight >= backend.cap;
            let learned = self.params.inflight_learned;
            assert!(slots <= backend.cap || over || learned, "backend {index} over cap");
            assert!(backend.cap >= self.params.inflight_per_backend, "backend {index} cap");
        }
        assert_eq!(self.inflight, inflight.iter().sum::<u32>(), "model inflight");
        assert_eq!(self.held, holds.iter().sum::<u32>(), "model holds");
        let usable = self.backends.iter().filter(|backend| backend.usable()).count();
        assert_eq!(usize::from(self.usable), usable, "usable backend count");
        let deadlines = if self.params.queue_timeout.is_some() { self.queue.queued() } else { 0 };
        assert_eq!(self.queue.deadlines_armed(), deadlines, "armed queue deadlines");
        let stale = self.backends.iter().filter(|backend| backend.stale_timer.is_some()).count();
        let placement = self.prefix.as_ref().is_some_and(|p| p.timer.is_some());
        assert_eq!(
            self.wheel.len(),
            self.holds.len() + stale + usize::from(placement),
            "timer count"
        );
        if let Some(prefix) = &self.prefix {
            for index in &prefix.indexes {
                index.check_invariants();
            }
            let slots = prefix.prompt_of.iter().filter(|&&p| p != NO_PROMPT).count();
            assert_eq!(slots + prefix.pool.available(), prefix.pool.capacity(), "prompt slots");
        }
        assert!(self.queue.queued() + self.inflight <= self.queue.capacity());
        if self.shutting_down {
            assert_eq!(self.queue.queued(), 0, "queued requests after shutdown");
        }
    }
}
