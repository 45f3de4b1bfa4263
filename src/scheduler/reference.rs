//! A naive reference model of SPEC section 3, for property tests and fuzzing.
//!
//! It restates the rules with plain vectors and linear scans: no heap, no lists, no wheel, no
//! index. Timers are deadlines checked on every input against the wheel's firing rule (a
//! deadline `d` fires at `now` once `ceil(d / r) <= floor(now / r)` for the power-of-two
//! resolution `r`). The tracker is the tracker's own linear-scan reference, which states the
//! same CLOCK policy. S16 (`routing = PrefixCost`) is restated the same way: each backend's
//! prefix index is that linear-scan tracker keyed by block hash, the scan sorts the whole queue
//! in S3 order and takes the first `placement_scan_max`, costs are recomputed from scratch.
//! One thing is not restated independently: the matched length of a prompt is the same binary
//! search over its chain as [`super::prefix::PrefixIndex::matched`], because that search *is*
//! the definition of a match (CLOCK may evict an early block of a chain and keep a later one,
//! where a longest-prefix scan and the search disagree; the index is approximate by design).
//!
//! What the scheduler learns (issue \[8\], [`super::estimate`]) is restated from its definition
//! with plain arithmetic: tokens per byte as the two halved sums, each backend's prefill rate as
//! the median of its last closed windows kept in a growing list, the budget's moves on each
//! snapshot, the calibration periods of the index size, the index rebuilt by re-inserting
//! from the hand, and an engine restart (a counter that went down, or a report of a moved
//! address) as a new, empty index. The integer formulas are the definitions, so they are
//! written out the same.
//! [`super::harness`] runs it beside [`Scheduler`](super::Scheduler) and
//! compares every output.
//!
//! Fair share across tenants (issue \[11\], [`super::fair`]) is restated with a key per
//! tenant (`None` while it has nothing queued outside the retry lane) and a linear scan for
//! the smallest `(key, tenant)`: the retry lane first, then the lanes of that tenant in S3
//! order with its own S4 count and S5 streak. A tenant that gets a request queued while it
//! had none takes the key `max(finish, V)`; an admission in tenant order sets
//! `V = max(V, key)`, `finish = max(finish, key) + tokens × SCALE / weight`, and the key to
//! `finish` if the tenant still has requests queued; a grace hit adds its charge to
//! `max(finish, V)`.

use crate::clock::Tick;

use super::tracker::reference::SessionTracker;
use super::{Arrival, Input, Lane, Output, Params, RejectReason, RequestId, Routing, Stats, Usage};
use crate::ring::prompt_pool::NO_PROMPT;
use learned::Learned;
use placement::Unstreamed;

mod learned;
mod placement;

const NONE: u16 = u16::MAX;

#[derive(Debug, Clone)]
struct Queued {
    id: u64,
    session: Option<u64>,
    seq: u64,
    arrived_at: Tick,
    lane: Lane,
    completed_at: Tick,
    boost_mark: u64,
    deadline: Option<Tick>,
    retry_order: u64,
    prompt_bytes: u32,
    streaming: bool,
    retries: u8,
    avoid: u16,
    home: u16,
    /// S16: the prompt's chained block hashes.
    blocks: Vec<u64>,
    placement_waited: bool,
    /// Issue \[10\]: the turn depth, the tracked session's completed turns plus one, else 1.
    turn: u16,
    /// Issue \[11\]: its tenant (0 = none).
    tenant: u16,
}

/// Issue \[11\]: a tenant's fair-share and S4/S5 state.
#[derive(Debug, Clone)]
struct Tenant {
    weight: u64,
    finish: u64,
    /// Its place in the tenant order while it has requests queued.
    key: Option<u64>,
    boosted_admits: u64,
    streak: u32,
}

#[derive(Debug, Clone)]
struct Admitted {
    request: Queued,
    backend: u16,
    prefill_pending: bool,
    /// Tokens counted in the backend's prefill backlog while pending.
    backlog: u32,
    admitted_at: Tick,
    /// When its first byte arrived (a streaming request's; 0 before).
    first_byte_at: Tick,
    /// A non-streaming request's place in its backend's [`Unstreamed`] order: where its tokens
    /// end.
    place: u64,
}

#[derive(Debug, Clone)]
struct Backend {
    healthy: bool,
    ejected: bool,
    /// No longer configured (a reconfiguration): never usable; its requests finish.
    removed: bool,
    ejected_at: Tick,
    failures: u32,
    waiting: Option<u32>,
    scraped_at: Tick,
    stale_deadline: Option<Tick>,
    /// The last time a pending prefill left this backend: its first byte, or its request's
    /// end without one.
    prefill_left_at: Tick,
    unstreamed: Unstreamed,
    /// The engine's preemption counter at the last report that carried one.
    preemptions: Option<u64>,
    /// Streaming requests admitted since the last snapshot under a learned budget, and the
    /// tick of that snapshot.
    arrivals: u64,
    snapshot_at: Tick,
}

impl Backend {
    /// A backend at start, or added by a reconfiguration: healthy, nothing known.
    const NEW: Backend = Backend {
        healthy: true,
        ejected: false,
        removed: false,
        ejected_at: 0,
        failures: 0,
        waiting: None,
        scraped_at: 0,
        stale_deadline: None,
        prefill_left_at: 0,
        arrivals: 0,
        snapshot_at: 0,
        unstreamed: Unstreamed::NEW,
        preemptions: None,
    };
}

impl Tenant {
    fn new(weight: u16) -> Tenant {
        Tenant {
            weight: u64::from(weight.max(1)),
            finish: 0,
            key: None,
            boosted_admits: 0,
            streak: 0,
        }
    }
}

/// The reference scheduler.
#[derive(Debug)]
pub struct Reference {
    p: Params,
    resolution: Tick,
    queued: Vec<Queued>,
    admitted: Vec<Admitted>,
    tracker: SessionTracker,
    backends: Vec<Backend>,
    /// (session, backend, deadline)
    holds: Vec<(u64, u16, Tick)>,
    tenants: Vec<Tenant>,
    /// Virtual time.
    vtime: u64,
    cursor: u16,
    next_seq: u64,
    next_retry: u64,
    shutting_down: bool,
    stats: Stats,
    /// S16: per backend, the block hashes sent there.
    indexes: Vec<SessionTracker>,
    /// S16: when the earliest wait for a cheapest backend ends, if a scan armed it.
    placement_deadline: Option<Tick>,
    /// S16: the block hashes of the next arrival (set by the harness).
    next_blocks: Vec<u64>,
    /// Tokens per byte as (tokens, bytes, samples).
    tokens: (u64, u64, u64),
    /// The output tokens of non-streaming responses and their count.
    output: (u64, u64),
    learned: Vec<Learned>,
    /// Each index's capacity, blocks.
    index_capacity: Vec<usize>,
}

/// What the differential harness compares of a backend's estimates: the prefill rate, the
/// budget, the exported KV capacity, the index's capacity and the restarts; the KV pressure and
/// the router's count of what it holds against the capacity; the decode gap and the model's
/// expected output.
pub type Estimates = ((u64, u64, u64, u64, u64, u64), (u64, u64, u32), (u64, u64));

impl Reference {
    /// A reference scheduler for `params`.
    pub fn new(params: Params) -> Reference {
        Reference {
            resolution: params.timer_resolution.max(1).next_power_of_two(),
            queued: Vec::new(),
            admitted: Vec::new(),
            tracker: SessionTracker::with_capacity(params.max_sessions as usize),
            backends: vec![Backend::NEW; usize::from(params.backends)],
            holds: Vec::new(),
            tenants: std::iter::once(1)
                .chain(params.tenant_weights.iter().copied())
                .map(Tenant::new)
                .collect(),
            vtime: 0,
            cursor: 0,
            next_seq: 0,
            next_retry: 0,
            shutting_down: false,
            stats: Stats::default(),
            indexes: (0..params.backends)
                .map(|_| {
                    SessionTracker::with_capacity(params.prefix.index_blocks.initial() as usize)
                })
                .collect(),
            placement_deadline: None,
            next_blocks: Vec::new(),
            tokens: (1, 4, 0),
            output: (0, 0),
            index_capacity: vec![
                params.prefix.index_blocks.initial() as usize;
                usize::from(params.backends)
            ],
            learned: vec![Learned::new(); usize::from(params.backends)],
            p: params,
        }
    }

    /// [`Scheduler::reconfigure`](super::Scheduler::reconfigure) restated: timers first, every
    /// grace hold ends, new backends start as at start and `live` marks the removed ones,
    /// tenants keep their state under their new weights, a changed queue timeout moves every
    /// queued deadline by the difference (arms them all from `now`, or disarms them), the new
    /// limits apply (`max_sessions` stays; a new prefill budget through [`Reference::budget`]),
    /// and what they allow is admitted.
    pub fn reconfigure(
        &mut self,
        now: Tick,
        mut params: Params,
        live: &[bool],
        out: &mut Vec<Output>,
    ) {
        assert!(params.backends >= self.p.backends, "backends are never renumbered");
        params.max_sessions = self.p.max_sessions;
        self.fire(now, out);
        self.holds.clear();
        let count = usize::from(params.backends);
        self.backends.resize(count, Backend::NEW);
        self.learned.resize(count, Learned::new());
        let index_blocks = params.prefix.index_blocks.initial() as usize;
        self.index_capacity.resize(count, index_blocks);
        while self.indexes.len() < count {
            self.indexes.push(SessionTracker::with_capacity(index_blocks));
        }
        for (backend, &live) in self.backends.iter_mut().zip(live) {
            backend.removed = !live;
        }
        let weights = std::iter::once(1).chain(params.tenant_weights.iter().copied());
        for (t, weight) in weights.enumerate() {
            match self.tenants.get_mut(t) {
                Some(tenant) => tenant.weight = u64::from(weight.max(1)),
                None => self.tenants.push(Tenant::new(weight)),
            }
        }
        // A reload that keeps learning keeps each cap in effect (above the new configured
        // one); any other starts every cap at the configured one.
        let keep = params.inflight_learned && self.p.inflight_learned;
        for b in 0..self.p.backends {
            let cap = if keep { self.cap(b) } else { 0 };
            self.learned[usize::from(b)].cap = cap;
        }
        let timeouts = (self.p.queue_timeout, params.queue_timeout);
        for request in &mut self.queued {
            request.deadline = match timeouts {
                (Some(old), Some(new)) => {
                    request.deadline.map(|d| d.saturating_sub(old).saturating_add(new))
                }
                (None, Some(new)) => Some(now.saturating_add(new)),
                (_, None) => None,
            };
        }
        self.p = params;
        self.fire(now, out);
        self.admit(now, out);
    }

    /// The block hashes the next `Arrive` carries (the real scheduler reads them from its
    /// prompt pool).
    pub fn set_next_blocks(&mut self, blocks: &[u64]) {
        self.next_blocks.clear();
        self.next_blocks.extend_from_slice(blocks);
    }

    /// Counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Queued requests in `lane`.
    pub fn depth(&self, lane: Lane) -> u32 {
        self.queued.iter().filter(|q| q.lane == lane).count() as u32
    }

    /// Distinct sessions with a request queued or admitted (issue \[10\]).
    pub fn sessions_active(&self) -> u32 {
        let admitted = self.admitted.iter().map(|a| &a.request);
        let mut sessions: Vec<u64> =
            self.queued.iter().chain(admitted).filter_map(|q| q.session).collect();
        sessions.sort_unstable();
        sessions.dedup();
        sessions.len() as u32
    }

    /// Admitted requests on `backend`.
    pub fn backend_inflight(&self, backend: u16) -> u32 {
        self.admitted.iter().filter(|a| a.backend == backend).count() as u32
    }

    /// Prefill backlog of `backend`.
    pub fn backend_prefill_tokens(&self, backend: u16) -> u64 {
        self.prefill(backend)
    }

    /// What it learned of `backend`, as the scheduler reports it: rate, budget, KV capacity,
    /// index capacity, engine restarts; KV pressure, held pressure; decode gap and the model's expected output
    /// (the ticks of each change are not restated: the harness compares these fields only).
    pub fn backend_estimates(&self, backend: u16) -> Estimates {
        let b = usize::from(backend);
        let rate = self.rate(backend);
        let index =
            if self.p.routing == Routing::PrefixCost { self.index_capacity[b] as u64 } else { 0 };
        let l = &self.learned[b];
        let decode = (self.gap(backend), self.expected_output());
        let pressure = (l.pressure, self.held_pressure(backend), self.cap(backend));
        ((rate.0, rate.1, self.budget(backend), l.capacity, index, l.restarts), pressure, decode)
    }

    /// The tick at which the earliest timer fires.
    pub fn next_wakeup(&self) -> Option<Tick> {
        let deadlines = self.queued.iter().filter_map(|q| q.deadline);
        let holds = self.holds.iter().map(|hold| hold.2);
        let stale = self.backends.iter().filter_map(|b| b.stale_deadline);
        let r = self.resolution;
        let placement = self.placement_deadline;
        deadlines
            .chain(holds)
            .chain(stale)
            .chain(placement)
            .min()
            .map(|d| d.div_ceil(r).saturating_mul(r))
    }

    fn due(&self, deadline: Tick, now: Tick) -> bool {
        deadline.div_ceil(self.resolution) <= now / self.resolution
    }

    /// Applies `input` at `now`.
    pub fn handle(&mut self, now: Tick, input: Input, out: &mut Vec<Output>) {
        self.fire(now, out);
        match input {
            Input::Arrive(arrival) => self.arrive(now, arrival, out),
            Input::Cancel(id) => self.cancel(now, id),
            Input::FirstByte(id) => self.first_byte(now, id),
            Input::Complete { id, success, usage } => self.complete(now, id, success, usage),
            Input::Retry(id) => self.retry(now, id, out),
            Input::Snapshot { backend, snapshot } if usize::from(backend) < self.backends.len() => {
                self.snapshot(now, backend, snapshot);
            }
            Input::Snapshot { .. } => self.stats.stale_events += 1,
            Input::Tick => {}
            Input::Shutdown => self.shutdown(out),
        }
        self.admit(now, out);
    }

    fn fire(&mut self, now: Tick, out: &mut Vec<Output>) {
        let mut index = 0;
        while index < self.queued.len() {
            if self.queued[index].deadline.is_some_and(|d| self.due(d, now)) {
                let gone = self.queued.remove(index);
                self.stats.timeouts += 1;
                out.push(Output::Reject {
                    id: RequestId(gone.id),
                    reason: RejectReason::QueueTimeout,
                });
            } else {
                index += 1;
            }
        }
        self.settle();
        let resolution = self.resolution;
        self.holds.retain(|hold| hold.2.div_ceil(resolution) > now / resolution);
        for b in 0..self.backends.len() {
            if self.backends[b].stale_deadline.is_some_and(|d| self.due(d, now)) {
                self.backends[b].stale_deadline = None;
            }
        }
        if self.placement_deadline.is_some_and(|d| self.due(d, now)) {
            self.placement_deadline = None;
        }
    }

    fn arrive(&mut self, now: Tick, arrival: Arrival, out: &mut Vec<Output>) {
        let id = arrival.id;
        let blocks = std::mem::take(&mut self.next_blocks);
        if self.shutting_down {
            self.stats.rejected_shutdown += 1;
            return out.push(Output::Reject { id, reason: RejectReason::ShuttingDown });
        }
        if self.queued.len() as u32 >= self.p.max_queued {
            self.stats.rejected_full += 1;
            return out.push(Output::Reject { id, reason: RejectReason::QueueFull });
        }
        let last_turn = arrival.session.and_then(|s| self.tracker.lookup(s));
        // A turn served before its engine restarted: no boost, no home.
        let cold = last_turn.is_some_and(|turn| {
            self.learned.get(usize::from(turn.backend)).is_some_and(|l| turn.at < l.restarted_at)
        });
        let mut completion = last_turn.filter(|_| self.p.boost);
        if completion.is_some() && cold {
            completion = None;
            self.stats.boost_declined += 1;
        }
        // S16: only a follow-up whose prompt is at least half held by some index is boosted.
        let prefix_cost = self.p.routing == Routing::PrefixCost;
        if completion.is_some() && prefix_cost && arrival.prompt != NO_PROMPT {
            let best = (0..self.p.backends).map(|b| self.matched(b, &blocks)).max().unwrap_or(0);
            if best * 2 < blocks.len() {
                completion = None;
                self.stats.boost_declined += 1;
            }
        }
        let tenant =
            if usize::from(arrival.tenant) < self.tenants.len() { arrival.tenant } else { 0 };
        let mut request = Queued {
            tenant,
            id: id.0,
            session: arrival.session,
            seq: self.next_seq,
            arrived_at: now,
            lane: Lane::Normal,
            completed_at: 0,
            boost_mark: self.tenants[usize::from(tenant)].boosted_admits,
            deadline: self.p.queue_timeout.map(|t| now.saturating_add(t)),
            retry_order: 0,
            prompt_bytes: arrival.prompt_bytes,
            streaming: arrival.streaming,
            retries: 0,
            avoid: NONE,
            home: last_turn.filter(|_| !cold).map_or(NONE, |turn| turn.backend),
            blocks,
            placement_waited: false,
            turn: last_turn.map_or(1, |turn| turn.turns.saturating_add(1)),
        };
        self.next_seq += 1;
        if let Some(completion) = completion {
            let session = arrival.session.unwrap_or_default();
            let hold = self.holds.iter().position(|hold| hold.0 == session);
            if let Some(hold) = hold.filter(|&h| self.usable(self.holds[h].1)) {
                let (_, backend, _) = self.holds.remove(hold);
                self.stats.grace_hits += 1;
                let charge = self.charge(&request);
                let t = &mut self.tenants[usize::from(tenant)];
                t.finish = t.finish.max(self.vtime) + charge;
                return self.bind(now, request, backend, Lane::Boosted, true, out);
            }
            request.lane = Lane::Boosted;
            request.completed_at = completion.at;
        }
        if !self.has_queued(tenant) {
            let t = &mut self.tenants[usize::from(tenant)];
            t.key = Some(t.finish.max(self.vtime));
        }
        self.queued.push(request);
    }

    /// Issue \[11\]: whether `tenant` has requests queued outside the retry lane.
    fn has_queued(&self, tenant: u16) -> bool {
        self.queued.iter().any(|q| q.tenant == tenant && q.lane != Lane::Retry)
    }

    /// Issue \[11\]: tenants with nothing queued leave the tenant order.
    fn settle(&mut self) {
        for t in 0..self.tenants.len() {
            if !self.has_queued(t as u16) {
                self.tenants[t].key = None;
            }
        }
    }

    /// Issue \[11\]: the virtual time `request` costs its tenant.
    fn charge(&self, request: &Queued) -> u64 {
        let tokens = self.tokens_of(u64::from(request.prompt_bytes)).max(1);
        tokens * super::fair::SCALE / self.tenants[usize::from(request.tenant)].weight
    }

    /// Issue \[11\]: the tenants with requests queued, by `(key, tenant)`.
    fn tenant_order(&self) -> Vec<u16> {
        let mut order: Vec<(u64, u16)> = (0..self.tenants.len())
            .filter_map(|t| self.tenants[t].key.map(|key| (key, t as u16)))
            .collect();
        order.sort_unstable();
        order.into_iter().map(|(_, t)| t).collect()
    }

    /// Issue \[11\]: `request` was admitted in tenant order.
    fn served(&mut self, request: &Queued) {
        if request.lane == Lane::Retry {
            return;
        }
        let charge = self.charge(request);
        let queued = self.has_queued(request.tenant);
        let t = &mut self.tenants[usize::from(request.tenant)];
        let start = t.key.expect("a served tenant has a key");
        self.vtime = self.vtime.max(start);
        t.finish = t.finish.max(start) + charge;
        t.key = queued.then_some(t.finish);
    }

    fn cancel(&mut self, now: Tick, id: RequestId) {
        if let Some(index) = self.queued.iter().position(|q| q.id == id.0) {
            self.queued.remove(index);
            self.settle();
            self.stats.cancelled += 1;
        } else if let Some(index) = self.admitted.iter().position(|a| a.request.id == id.0) {
            let gone = self.admitted.remove(index);
            self.prefill_left(now, &gone);
            self.unstreamed_gone(now, &gone, false);
        } else {
            self.stats.stale_events += 1;
        }
    }

    fn find_admitted(&mut self, id: RequestId) -> Option<usize> {
        let found = self.admitted.iter().position(|a| a.request.id == id.0);
        if found.is_none() {
            self.stats.stale_events += 1;
        }
        found
    }

    fn complete(&mut self, now: Tick, id: RequestId, success: bool, usage: Usage) {
        let Some(index) = self.find_admitted(id) else { return };
        let done = self.admitted.remove(index);
        self.prefill_left(now, &done);
        self.unstreamed_gone(now, &done, true);
        let backend = done.backend;
        self.learn_usage(&done, usage);
        if !success {
            return;
        }
        self.learn_output(now, &done, usage.completion_tokens);
        self.backends[usize::from(backend)].failures = 0;
        let Some(session) = done.request.session else { return };
        self.tracker.complete(session, now, backend);
        let grace_on = self.p.boost && self.p.grace_period > 0;
        let held = self.holds.iter().any(|hold| hold.0 == session);
        let slots = self.backend_inflight(backend) + self.holds_on(backend);
        if grace_on
            && !self.shutting_down
            && !held
            && self.usable(backend)
            && slots < self.cap(backend)
        {
            self.holds.push((session, backend, now.saturating_add(self.p.grace_period)));
            self.learned[usize::from(backend)].cap_filled |= slots + 1 >= self.cap(backend);
            self.stats.grace_holds += 1;
        }
    }

    fn retry(&mut self, now: Tick, id: RequestId, out: &mut Vec<Output>) {
        let Some(index) = self.find_admitted(id) else { return };
        let failed = self.admitted.remove(index);
        self.prefill_left(now, &failed);
        self.unstreamed_gone(now, &failed, false);
        let state = &mut self.backends[usize::from(failed.backend)];
        state.failures += 1;
        let limit = self.p.eject_after_failures;
        if limit > 0 && state.failures >= limit && !state.ejected {
            state.ejected = true;
            state.ejected_at = now;
            self.stats.ejections += 1;
        }
        let reason = if self.shutting_down {
            self.stats.rejected_shutdown += 1;
            Some(RejectReason::ShuttingDown)
        } else if u32::from(failed.request.retries) >= self.p.max_retries {
            self.stats.retries_exhausted += 1;
            Some(RejectReason::RetriesExhausted)
        } else {
            None
        };
        if let Some(reason) = reason {
            return out.push(Output::Reject { id, reason });
        }
        self.stats.retries += 1;
        let mut request = failed.request;
        request.retries += 1;
        request.lane = Lane::Retry;
        request.avoid = failed.backend;
        request.retry_order = self.next_retry;
        self.next_retry += 1;
        request.deadline = self.p.queue_timeout.map(|t| now.saturating_add(t));
        self.queued.push(request);
    }

    fn shutdown(&mut self, out: &mut Vec<Output>) {
        self.shutting_down = true;
        for gone in self.queued.drain(..) {
            self.stats.rejected_shutdown += 1;
            out.push(Output::Reject { id: RequestId(gone.id), reason: RejectReason::ShuttingDown });
        }
        self.settle();
        self.holds.clear();
    }

    fn usable(&self, backend: u16) -> bool {
        let state = &self.backends[usize::from(backend)];
        state.healthy && !state.ejected && !state.removed
    }

    pub(super) fn holds_on(&self, backend: u16) -> u32 {
        self.holds.iter().filter(|hold| hold.1 == backend).count() as u32
    }

    /// An admitted request left: if it was still prefilling, its backend's backlog lost it.
    fn prefill_left(&mut self, now: Tick, gone: &Admitted) {
        if gone.prefill_pending {
            self.backends[usize::from(gone.backend)].prefill_left_at = now;
        }
    }

    fn prefill(&self, backend: u16) -> u64 {
        let pending = self.admitted.iter().filter(|a| a.backend == backend && a.prefill_pending);
        pending.map(|a| u64::from(a.backlog)).sum()
    }

    fn fresh_waiting(&self, backend: u16, now: Tick) -> Option<u32> {
        let state = &self.backends[usize::from(backend)];
        let fresh = now < state.scraped_at.saturating_add(self.p.metrics_stale_after);
        if fresh {
            state.waiting
        } else {
            None
        }
    }

    fn eligible(&self, backend: u16, now: Tick) -> bool {
        let budget = self.budget(backend);
        self.usable(backend)
            && self.backend_inflight(backend) + self.holds_on(backend) < self.cap(backend)
            && self.fresh_waiting(backend, now).unwrap_or(0) == 0
            && (budget == 0 || self.prefill(backend) < budget)
    }

    fn admit(&mut self, now: Tick, out: &mut Vec<Output>) {
        loop {
            let occupied = (self.admitted.len() + self.holds.len()) as u64;
            let caps = (0..self.p.backends).filter(|&b| self.usable(b)).map(|b| self.cap(b));
            let room = occupied < caps.map(u64::from).sum::<u64>();
            let any = (0..self.p.backends).any(|b| self.eligible(b, now));
            if self.queued.is_empty() || !room || !any {
                return;
            }
            let head = self.tenant_order().first().copied();
            if let Some(head) = head {
                self.force_oldest(head);
            }
            if self.p.routing == Routing::PrefixCost {
                match self.place(now, head) {
                    Some((index, backend)) => {
                        let request = self.queued.remove(index);
                        self.served(&request);
                        let (lane, affinity) = (request.lane, backend == request.home);
                        self.bind(now, request, backend, lane, affinity, out);
                        continue;
                    }
                    None => return,
                }
            }
            let index = self.pick(head);
            let request = self.queued.remove(index);
            self.served(&request);
            let (backend, affinity) = self.choose(&request, now);
            let lane = request.lane;
            self.bind(now, request, backend, lane, affinity, out);
        }
    }

    fn force_oldest(&mut self, tenant: u16) {
        let bound = u64::from(self.p.max_overtakes);
        let oldest = (0..self.queued.len())
            .filter(|&i| self.queued[i].lane == Lane::Boosted && self.queued[i].tenant == tenant)
            .min_by_key(|&i| self.queued[i].seq);
        let admits = self.tenants[usize::from(tenant)].boosted_admits;
        if let Some(i) = oldest {
            if bound > 0 && admits - self.queued[i].boost_mark >= bound {
                self.queued[i].lane = Lane::Forced;
                self.stats.forced += 1;
            }
        }
    }

    /// The first `scan` queued requests in scan order: the retry lane, then the tenants in
    /// tenant order, each in S3 order with S5. Each tenant but the `head` (checked before)
    /// gets its S4 check when the scan reaches it.
    fn in_order(&mut self, head: Option<u16>, scan: usize) -> Vec<usize> {
        let q = &self.queued;
        let mut order: Vec<usize> = (0..q.len()).filter(|&i| q[i].lane == Lane::Retry).collect();
        order.sort_by_key(|&i| q[i].retry_order);
        order.truncate(scan);
        for tenant in self.tenant_order() {
            if order.len() >= scan {
                break;
            }
            if Some(tenant) != head {
                self.force_oldest(tenant);
            }
            order.extend(self.tenant_in_order(tenant));
        }
        order.truncate(scan);
        order
    }

    /// `tenant`'s queued requests (not the retry lane's) in S3 order with S5.
    fn tenant_in_order(&self, tenant: u16) -> Vec<usize> {
        let streak = self.tenants[usize::from(tenant)].streak;
        let normal_due = self.p.boosted_streak_max > 0 && streak >= self.p.boosted_streak_max;
        let rank = |lane: Lane| match (lane, normal_due) {
            (Lane::Retry, _) => 0,
            (Lane::Forced, _) => 1,
            (Lane::Boosted, false) | (Lane::Normal, true) => 2,
            (Lane::Normal, false) | (Lane::Boosted, true) => 3,
        };
        let q = &self.queued;
        let mut order: Vec<usize> =
            (0..q.len()).filter(|&i| q[i].tenant == tenant && q[i].lane != Lane::Retry).collect();
        order.sort_by_key(|&i| {
            let within = match q[i].lane {
                Lane::Retry => (q[i].retry_order, 0),
                Lane::Boosted => (u64::MAX - q[i].completed_at, q[i].seq),
                Lane::Forced | Lane::Normal => (q[i].seq, 0),
            };
            (rank(q[i].lane), within)
        });
        order
    }

    /// The retry lane's first request, else the first of `head`'s in S3 order with S5.
    fn pick(&self, head: Option<u16>) -> usize {
        let q = &self.queued;
        let retry = (0..q.len()).filter(|&i| q[i].lane == Lane::Retry);
        if let Some(index) = retry.min_by_key(|&i| q[i].retry_order) {
            return index;
        }
        let head = head.expect("pick on an empty queue");
        self.tenant_in_order(head)[0]
    }

    fn choose(&mut self, request: &Queued, now: Tick) -> (u16, bool) {
        let home = request.home;
        let avoid = request.avoid;
        let routing = self.p.routing;
        if routing == Routing::SessionAffinity
            && home != NONE
            && home != avoid
            && self.eligible(home, now)
        {
            return (home, true);
        }
        let count = self.p.backends;
        let candidates: Vec<u16> = (0..count)
            .map(|step| (self.cursor + step) % count)
            .filter(|&b| b != avoid && self.eligible(b, now))
            .collect();
        let rotated = match routing {
            Routing::RoundRobin => candidates.first().copied(),
            _ => candidates.iter().copied().min_by_key(|&b| {
                (self.backend_inflight(b), self.fresh_waiting(b, now).unwrap_or(0))
            }),
        };
        let pick = rotated.unwrap_or(avoid);
        self.cursor = (pick + 1) % count;
        (pick, pick == home)
    }

    fn bind(
        &mut self,
        now: Tick,
        request: Queued,
        backend: u16,
        lane: Lane,
        affinity: bool,
        out: &mut Vec<Output>,
    ) {
        self.stats.admitted[lane as usize] += 1;
        let tenant = request.tenant;
        let normal_waiting =
            self.queued.iter().any(|q| q.lane == Lane::Normal && q.tenant == tenant);
        let t = &mut self.tenants[usize::from(tenant)];
        match lane {
            Lane::Boosted => {
                t.boosted_admits += 1;
                t.streak = if normal_waiting { t.streak + 1 } else { 0 };
            }
            Lane::Forced => t.boosted_admits += 1,
            Lane::Normal => t.streak = 0,
            Lane::Retry => {}
        }
        self.stats.affinity_hits += u64::from(affinity);
        let (id, turn) = (RequestId(request.id), request.turn);
        let waited = now - request.arrived_at;
        let prefill_pending = request.streaming;
        let tokens = self.tokens_of(u64::from(request.prompt_bytes));
        let mut backlog = u32::try_from(tokens).unwrap_or(u32::MAX);
        let mut cached = 0;
        // Issue [10]: warm when the chosen backend's index holds at least half of the prompt's
        // blocks; with no blocks, when the request went to its session's last backend.
        let mut warm = affinity;
        if self.p.routing == Routing::PrefixCost {
            let matched = self.matched(backend, &request.blocks);
            let blocks = request.blocks.len();
            if blocks > 0 {
                warm = matched * 2 >= blocks;
            }
            let uncached = self.uncached(&request, backend);
            cached = tokens - uncached;
            backlog = u32::try_from(uncached).unwrap_or(u32::MAX);
            self.stats.prefix_copies += u64::from(self.hot(&request) > matched);
            let bucket = if blocks == 0 { 0 } else { (matched * 10).div_ceil(blocks) };
            self.stats.match_ratio[bucket.min(super::placement::MATCH_BUCKETS - 1)] += 1;
            self.stats.match_ratio_sum_milli +=
                (matched * 1000).checked_div(blocks).unwrap_or(0) as u64;
            for &block in &request.blocks {
                self.indexes[usize::from(backend)].complete(block, now, 0);
            }
        }
        let l = &mut self.learned[usize::from(backend)];
        l.period.0 += tokens;
        l.period.1 += cached;
        let place = if prefill_pending {
            0
        } else {
            let rate = self.drain_rate(backend);
            self.backends[usize::from(backend)].unstreamed.sent(u64::from(backlog), rate, now)
        };
        self.admitted.push(Admitted {
            request,
            backend,
            prefill_pending,
            backlog,
            admitted_at: now,
            first_byte_at: 0,
            place,
        });
        let slots = self.backend_inflight(backend) + self.holds_on(backend);
        self.learned[usize::from(backend)].cap_filled |= slots >= self.cap(backend);
        if prefill_pending {
            self.backends[usize::from(backend)].arrivals += 1;
            let (budget, prefill) = (self.budget(backend), self.prefill(backend));
            self.learned[usize::from(backend)].filled |= budget > 0 && prefill >= budget;
        }
        // Derived sessions need conversation ends, which the harness's prompts never carry.
        let derived = false;
        out.push(Output::Admit { id, backend, lane, waited, affinity, turn, warm, derived });
    }
}
