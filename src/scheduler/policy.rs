//! Per-backend state, the admission gates of S6 and the backend choice of S7.
//!
//! A backend is *eligible* when it is healthy and not ejected, has a free slot (inflight plus grace
//! holds below its cap, `inflight_per_backend` or learned by [`super::estimate`]), has no fresh
//! waiting-queue gauge above zero that counts against it, and its prefill backlog is below its
//! budget (fixed, or learned by [`super::estimate`]). Eligibility reads `now` only to decide
//! whether a scraped gauge is still fresh; a wheel timer fires when a positive gauge goes stale so
//! that admission is re-evaluated then (SPEC section 9, defect 1).
//!
//! The waiting gauge (S6.2) under a learned budget: an engine's waiting queue holds the
//! prefills warmpath itself sent and the engine has not started yet, which a budget of more than
//! one step of prefill always leaves there. So of the waiting requests a snapshot reports, as
//! many as warmpath has streaming requests awaiting their first byte there are taken to be
//! those, then as many as it has non-streaming requests in flight there (they give no
//! first-byte signal at all, so any may be waiting); only the rest, someone else's queue
//! (another router, a direct client), closes the backend. With a fixed budget S6.2 applies as
//! SPEC states it.

use crate::clock::Tick;
use crate::wheel::TimerKey;

use super::unstreamed::UnstreamedBacklog;

/// How a model picks the backend of an admitted request (SPEC S7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Routing {
    /// The session's last backend when eligible, else the least-inflight one.
    SessionAffinity,
    /// The eligible backend with the fewest inflight requests; ties by waiting gauge, then
    /// rotation.
    LeastInflight,
    /// The next eligible backend in rotation.
    RoundRobin,
    /// S16: the backend where the request's uncached prompt plus the backlog costs least
    /// (placed by `Scheduler::place`; [`choose`] treats it as least-inflight).
    PrefixCost,
}

/// The latest health and metrics report for a backend (from the control thread).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// Whether the health check passed.
    pub healthy: bool,
    /// The engine's waiting-queue gauge, or `None` when its metrics could not be scraped.
    pub waiting: Option<u32>,
    /// When the health check and scrape were taken.
    pub scraped_at: Tick,
    /// What the engine exports about its caches (all unknown when not scraped).
    pub cache: EngineCache,
    /// The engine behind the backend is another one since the last report, whatever its
    /// counters say: the backend's host name moved to a new address (another pod).
    pub new_engine: bool,
}

impl Snapshot {
    /// A report of health and the waiting gauge only, as from an engine that exports nothing
    /// about its caches.
    pub const fn new(healthy: bool, waiting: Option<u32>, scraped_at: Tick) -> Snapshot {
        Snapshot { healthy, waiting, scraped_at, cache: EngineCache::UNKNOWN, new_engine: false }
    }
}

/// What an engine's `/metrics` says about its KV cache and its prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineCache {
    /// KV-cache capacity in tokens; 0 when not exported. vLLM: `num_gpu_blocks` ×
    /// `block_size` (or `kv_cache_size_tokens`) from the labels of `vllm:cache_config_info`;
    /// SGLang: `sglang:max_total_num_tokens`.
    pub kv_capacity_tokens: u32,
    /// The engine's prefix-cache counters, in tokens, as exported (cumulative since the
    /// engine started): queries and hits (vLLM `vllm:prefix_cache_queries_total` and
    /// `vllm:prefix_cache_hits_total`); [`EngineCache::NO_COUNTER`] when not exported.
    pub prefix_queries: u64,
    pub prefix_hits: u64,
    /// Running requests the engine preempted back into its waiting queue (their KV blocks
    /// taken for others; they are recomputed), cumulative since it started: vLLM
    /// `vllm:num_preemptions_total`, SGLang `sglang:num_retracted_requests_total`;
    /// [`EngineCache::NO_COUNTER`] when not exported.
    pub preemptions: u64,
    /// The share of the KV cache in use, in millionths (at most 1,000,000); vLLM
    /// `vllm:kv_cache_usage_perc` (or `vllm:gpu_cache_usage_perc`), SGLang `sglang:token_usage`;
    /// [`EngineCache::NO_USAGE`] when not exported.
    pub kv_usage_micro: u32,
    /// The engine's inter-token latencies, cumulative since it started: their sum in ticks
    /// and their count, one per output token after a sequence's first (vLLM and SGLang
    /// `*:inter_token_latency_seconds_sum` and `_count`); [`EngineCache::NO_COUNTER`] when not
    /// exported. What the engine decoded for anyone teaches the backend's decode gap
    /// (`decode`).
    pub itl_ticks: u64,
    pub itl_count: u64,
}

impl EngineCache {
    /// A counter the engine does not export.
    pub const NO_COUNTER: u64 = u64::MAX;
    /// A KV usage the engine does not export.
    pub const NO_USAGE: u32 = u32::MAX;
    /// Nothing known.
    pub const UNKNOWN: EngineCache = EngineCache {
        kv_capacity_tokens: 0,
        prefix_queries: EngineCache::NO_COUNTER,
        prefix_hits: EngineCache::NO_COUNTER,
        preemptions: EngineCache::NO_COUNTER,
        kv_usage_micro: EngineCache::NO_USAGE,
        itl_ticks: EngineCache::NO_COUNTER,
        itl_count: EngineCache::NO_COUNTER,
    };
}

/// The scheduler's view of one backend.
#[derive(Debug, Clone)]
pub(crate) struct Backend {
    pub healthy: bool,
    /// Passively ejected after repeated retryable failures (SPEC 2.8), since `ejected_at`.
    pub ejected: bool,
    pub ejected_at: Tick,
    pub consecutive_failures: u32,
    pub inflight: u32,
    /// Prompt bytes of the admitted requests whose context the engine holds, by the router's
    /// count: streaming ones past their first byte, and every non-streaming one.
    pub held_bytes: u64,
    /// Slots held for a grace window (S8).
    pub holds: u32,
    /// Estimated prompt tokens of admitted streaming requests without a first body byte (S6.3).
    pub prefill_tokens: u64,
    /// How many requests those are.
    pub prefill_pending: u32,
    /// Admitted non-streaming requests in flight: they give no first byte before their end, so
    /// any of them may be one the engine has waiting (their part of its waiting gauge does not
    /// gate the backend under an `auto` budget).
    pub unstreamed: u32,
    /// The prefill their engine has left to do for them, by estimate (S16's cost).
    pub unstreamed_backlog: UnstreamedBacklog,
    /// When the engine is taken to have begun on the backlog as it stands: the last time a
    /// request left it (its first byte, or its end without one), or the admission that made it
    /// non-empty. S16's cost counts the backlog less what the backend's learned prefill rate
    /// clears from then on (`cost::remaining_backlog`).
    pub prefill_since: Tick,
    /// The prefill budget: `prefill_tokens` must be below it; 0 = no budget.
    pub budget: u64,
    /// The backlog reached the budget since the last snapshot.
    pub budget_filled: bool,
    /// S6.1's cap on `inflight + holds`: `inflight_per_backend`, or the learned one.
    pub cap: u32,
    /// An admission or a hold brought `inflight + holds` to the cap since the last snapshot.
    pub cap_filled: bool,
    /// Streaming requests admitted since the last snapshot, and its tick.
    pub arrivals: u32,
    pub snapshot_at: Tick,

    pub waiting: Option<u32>,
    pub scraped_at: Tick,
    /// The engine's preemption counter at the last report that carried it
    /// ([`EngineCache::NO_COUNTER`] before any).
    pub preemptions: u64,
    /// Fires when a positive waiting gauge goes stale.
    pub stale_timer: Option<TimerKey>,
    /// Taken out of the configuration by a live reload: no new admissions; its in-flight
    /// requests finish.
    pub removed: bool,
}

impl Backend {
    pub const NEW: Backend = Backend {
        healthy: true,
        ejected: false,
        ejected_at: 0,
        consecutive_failures: 0,
        inflight: 0,
        held_bytes: 0,
        holds: 0,
        prefill_tokens: 0,
        prefill_pending: 0,
        unstreamed: 0,
        unstreamed_backlog: UnstreamedBacklog::NEW,
        prefill_since: 0,
        budget: 0,
        budget_filled: false,
        cap: 0,
        cap_filled: false,
        arrivals: 0,
        snapshot_at: 0,
        waiting: None,
        scraped_at: 0,
        preemptions: EngineCache::NO_COUNTER,
        stale_timer: None,
        removed: false,
    };

    /// Configured, healthy and not ejected: counts toward the model's capacity (S6a).
    pub fn usable(&self) -> bool {
        self.healthy && !self.ejected && !self.removed
    }

    /// How many requests the engine preempted since the last report that carried its counter
    /// (`counter`, cumulative; [`EngineCache::NO_COUNTER`] when this report has none): every
    /// one it counts when it is a new engine (`new_engine`, or a counter that went down), none
    /// at the first report. Keeps `counter` for the next report.
    pub fn preempted(&mut self, counter: u64, new_engine: bool) -> u32 {
        if counter == EngineCache::NO_COUNTER {
            return 0;
        }
        let last = std::mem::replace(&mut self.preemptions, counter);
        let since = match last {
            _ if new_engine => counter,
            EngineCache::NO_COUNTER => 0,
            last if counter < last => counter,
            last => counter - last,
        };
        u32::try_from(since).unwrap_or(u32::MAX)
    }

    /// How an `auto` budget reads the engine's `waiting` gauge (docs/configuration.md, "The
    /// waiting gauge itself"): as many as warmpath has pending there are its own; of the rest,
    /// as many as it has non-streaming requests there may be those (they show no first byte);
    /// of the rest, as many of its decoding requests as the engine preempted (`preempted`, since
    /// the last report) may be back in the queue. Returns the first two counts and what is
    /// left after all three: someone else's queue.
    pub fn waiting_split(&self, waiting: u32, preempted: u32) -> (u32, u32, u32) {
        let own = waiting.min(self.prefill_pending);
        let unseen = (waiting - own).min(self.unstreamed);
        let decoding = self.inflight.saturating_sub(self.prefill_pending + self.unstreamed);
        let rest = waiting - own - unseen;
        (own, unseen, rest - rest.min(preempted).min(decoding))
    }

    /// The waiting gauge if it is fresh at `now`.
    pub fn fresh_waiting(&self, now: Tick, stale_after: Tick) -> Option<u32> {
        let fresh = now < self.scraped_at.saturating_add(stale_after);
        self.waiting.filter(|_| fresh)
    }
}

/// The limits the gates apply (the caps and budgets are per backend, in [`Backend::cap`] and
/// [`Backend::budget`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Gates {
    pub stale_after: Tick,
}

impl Gates {
    pub fn of(params: &super::Params) -> Gates {
        Gates { stale_after: params.metrics_stale_after }
    }

    /// S6 (b): whether `backend` can take one more request at `now`.
    pub fn eligible(&self, backend: &Backend, now: Tick) -> bool {
        backend.usable()
            && backend.inflight + backend.holds < backend.cap
            && backend.fresh_waiting(now, self.stale_after).is_none_or(|waiting| waiting == 0)
            && (backend.budget == 0 || backend.prefill_tokens < backend.budget)
    }
}

impl Gates {
    /// Fills `eligible[b]` for every backend at `now`; returns whether any is eligible. One pass
    /// per admission: [`choose`] then reads the flags instead of re-evaluating the gates.
    pub fn evaluate(&self, backends: &[Backend], now: Tick, eligible: &mut [bool]) -> bool {
        let mut any = false;
        for (flag, backend) in eligible.iter_mut().zip(backends) {
            *flag = self.eligible(backend, now);
            any |= *flag;
        }
        any
    }
}

/// Chooses a backend among the `eligible` ones, never `avoid` unless it is the only one.
/// `home` is the session's last backend (or `NO_BACKEND`). Returns the backend and whether it
/// was the session's home. `cursor` is the rotation point, advanced past a rotated choice.
#[allow(clippy::too_many_arguments)]
pub(crate) fn choose(
    routing: Routing,
    backends: &[Backend],
    eligible: &[bool],
    gates: &Gates,
    now: Tick,
    home: u16,
    avoid: u16,
    cursor: &mut u16,
) -> Option<(u16, bool)> {
    let is_eligible = |index: u16| eligible.get(usize::from(index)).copied().unwrap_or(false);
    if routing == Routing::SessionAffinity && home != avoid && is_eligible(home) {
        return Some((home, true));
    }
    let pick = rotate(routing, backends, eligible, gates, now, avoid, *cursor)
        .or_else(|| is_eligible(avoid).then_some(avoid))?;
    *cursor = if usize::from(pick) + 1 == backends.len() { 0 } else { pick + 1 };
    Some((pick, pick == home))
}

/// Least-inflight (ties: lower fresh waiting gauge, then the first from `cursor`) or plain
/// rotation, over eligible backends other than `avoid`.
fn rotate(
    routing: Routing,
    backends: &[Backend],
    eligible: &[bool],
    gates: &Gates,
    now: Tick,
    avoid: u16,
    cursor: u16,
) -> Option<u16> {
    let count = backends.len();
    let mut best: Option<(u16, (u32, u32))> = None;
    let mut index = usize::from(cursor);
    for _ in 0..count {
        if index as u16 != avoid && eligible[index] {
            if routing == Routing::RoundRobin {
                return Some(index as u16);
            }
            let backend = &backends[index];
            let waiting = backend.fresh_waiting(now, gates.stale_after).unwrap_or(0);
            let load = (backend.inflight, waiting);
            if best.is_none_or(|(_, best_load)| load < best_load) {
                best = Some((index as u16, load));
            }
        }
        index = if index + 1 == count { 0 } else { index + 1 };
    }
    best.map(|(index, _)| index)
}
