//! The per-model scheduler: a sans-IO, deterministic state machine implementing SPEC section 3.
//!
//! [`Scheduler::handle`] takes one [`Input`] and the current tick and appends what it decided to
//! a caller-owned `Vec<Output>`: admissions (request, backend) and rejections. It performs no I/O
//! and never reads the clock, so the same sequence of inputs always produces the same outputs;
//! tests, the fuzzer and the deterministic simulation drive it on a simulated clock.
//!
//! Each call runs three phases: (1) fire what is due at `now` (queue deadlines S9 from the
//! deadline list; grace windows S8, stale waiting gauges S6 and the end of S16's placement
//! wait from the wheel); (2) apply the input; (3) admit as many queued requests as the gates
//! allow (S6), in the order of S3-S5, each bound to a backend by S7 (or S16's placement).
//!
//! Structures, all preallocated from [`Params`] at construction (nothing allocates per request):
//! - `queue`: the request arena, the id index, the lanes (the model's retry lane; per tenant,
//!   forced, boosted and normal), with each boosted lane an intrusive indexed [`heap`], and the
//!   deadline list;
//! - [`fair`]: fair share across tenants (issue \[11\]), start-time fair queuing over
//!   estimated prompt tokens: which tenant's lanes the next admission takes from;
//! - [`tracker`]: the CLOCK session tracker of S1/S2;
//! - [`wheel`](crate::wheel): the hierarchical timer wheel (grace windows, stale gauges, the
//!   placement wait), a module of its own because the shards use it too;
//! - [`policy`]: per-backend state, gates and backend choice;
//! - [`estimate`]: what it learns of its model and each backend (issue \[8\]), with
//!   [`decode`] for each backend's decode speed and the model's output length and
//!   [`cache_model`] for what each engine says of its caches;
//! - [`prefix`] and `placement`: S16's per-backend prefix indexes and placement scan;
//! - `admitted`: an admitted request's binding, first byte and end, and the per-backend counts
//!   they move.
//!
//! All of it belongs to whoever owns the `Scheduler` (a driver, which calls [`Scheduler::handle`]
//! from one thread); nothing in it is shared or atomic but the `Arc` of its model's
//! [`PromptPool`](crate::ring::prompt_pool::PromptPool), whose slots the shards fill with
//! prompts' block hashes (S16).
//!
//! Decisions where SPEC is silent (also in ARCHITECTURE.md):
//! - A retried request (SPEC 2.8) waits in a `retry` lane served before every other lane, keeps
//!   its arrival time for the queue-wait figure and gets a fresh queue deadline from the retry.
//! - S5's streak counts non-forced boosted admissions made while a normal request waits; a
//!   normal admission, or a boosted one with no normal request waiting, resets it. Forced and
//!   retry admissions neither count nor reset. When the streak reaches the bound the oldest
//!   normal request goes next, after the retry and forced lanes.
//! - Forced admissions count as boosted admissions for S4 (a forced request is boosted).
//! - Tenants (issue \[11\], SPEC S15's "per-user fairness" seam): S3-S5 apply within each
//!   tenant's lanes (S4's count and S5's streak are the tenant's own), and [`fair`] picks the
//!   tenant of each admission; the retry lane is the model's and goes first. The S4 check runs
//!   before each admission for the head of the tenant order (under S16 also for each tenant the
//!   placement scan reaches), so no tenant admits a boosted request without one.
//! - S7's "backend recorded for the request's session" is read when the request arrives, by the
//!   same tracker lookup as the boost decision (a follow-up arrives after its previous turn
//!   completed, so the two moments agree but for concurrent requests of one session).
//! - A grace hit (S8) is admitted into the held slot directly, if that backend is still healthy,
//!   and counts as a boosted admission. Grace applies only under `session-boost`.
//! - A backend ejected after `eject_after_failures` consecutive retryable failures returns when
//!   a snapshot taken after the ejection reports it healthy.
//! - Events naming a request that is not in the state they need (a completion of an unknown or
//!   still-queued request, a cancel racing an admission already released), and snapshots of a
//!   backend the scheduler does not have yet (a reload's, probed before its reconfiguration
//!   reached the scheduler), change nothing and are counted in [`Stats::stale_events`].

mod admitted;
mod api;
pub mod cache_model;
mod cost;
pub mod decode;
mod derive;
pub mod estimate;
pub mod fair;
pub mod heap;
mod inspect;
mod placement;
pub mod policy;
pub mod prefix;
mod queue;
pub mod tracker;
mod unstreamed;

#[cfg(test)]
mod fair_tests;
#[cfg(any(test, fuzzing))]
pub mod harness;
#[cfg(test)]
mod learned_tests;
#[cfg(any(test, fuzzing))]
pub mod reference;
#[cfg(test)]
mod script_tests;
#[cfg(test)]
mod tests;

use hashbrown::HashMap;

use crate::clock::Tick;
use crate::ring::prompt_pool::NO_PROMPT;
use crate::wheel::{TimerKey, TimerWheel};
pub use api::{
    Arrival, Budget, IndexSize, Input, Lane, Output, Params, PrefixParams, RejectReason, RequestId,
    Stats, Usage,
};
use derive::DerivedSessions;
use estimate::Learned;
pub use inspect::Waiting;
pub use placement::HOT_PREFIX_TOUCHES;
use policy::{Backend, Gates};
pub use policy::{EngineCache, Routing, Snapshot};
use queue::{Entry, Identity, Place, Queue, NIL, NO_BACKEND};
use tracker::SessionTracker;

/// Timers expected to fall due in one poll; a burst beyond it grows the buffer once.
const EXPIRED_BATCH: usize = 1024;

/// A timer's purpose.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Timer {
    /// End of the grace hold of a session.
    GraceEnd(u64),
    /// A backend's positive waiting gauge goes stale.
    Stale(u16),
    /// S16: the earliest wait for a cheapest backend ends.
    Placement,
}

/// A slot held for a session's follow-up (S8).
#[derive(Debug, Clone, Copy)]
struct Hold {
    backend: u16,
    timer: TimerKey,
}

/// The scheduler of one model.
#[derive(Debug)]
pub struct Scheduler {
    params: Params,
    gates: Gates,
    queue: Queue,
    tracker: SessionTracker,
    wheel: TimerWheel<Timer>,
    backends: Vec<Backend>,
    /// Per backend, whether it passed the gates in this admission round (scratch).
    eligible: Vec<bool>,
    /// Grace holds by session; one per session at most.
    holds: HashMap<u64, Hold>,
    holds_max: usize,
    /// Model-wide admitted requests (S6a).
    inflight: u32,
    /// Model-wide held slots.
    held: u32,
    /// Healthy, non-ejected backends.
    usable: u16,
    next_seq: u64,
    /// Per tenant: virtual time and keys (issue \[11\]), boosted admissions (S4) and the
    /// streak (S5).
    fair: fair::Fair,
    cursor: u16,
    shutting_down: bool,
    expired: Vec<(Tick, Timer)>,
    stats: Stats,
    /// S16 state, for `routing = "prefix-cost"` only.
    prefix: Option<placement::Prefix>,
    /// Issue \[10\]: where conversations without identity ended, with `prefix` and
    /// `derive_sessions` only.
    derived: Option<DerivedSessions>,
    /// What it learned of the model and its backends (issue \[8\]).
    learned: Learned,
}

impl Scheduler {
    /// A scheduler with every structure allocated for `params`, starting at `now`.
    pub fn new(params: Params, now: Tick) -> Scheduler {
        assert!(params.backends > 0 && params.backends < NO_BACKEND, "backends out of range");
        assert!(
            params.inflight_per_backend > 0 && params.max_queued > 0 && params.max_sessions > 0
        );
        let slots = u64::from(params.inflight_per_backend) * u64::from(params.backends);
        let arena = u64::from(params.max_queued) + slots;
        assert!(arena < u64::from(NIL), "max_queued + admission slots too large");
        let holds_max = if params.boost && params.grace_period > 0 { slots as usize } else { 0 };
        let timers = holds_max + usize::from(params.backends) + 1;
        let prefix = (params.routing == Routing::PrefixCost)
            .then(|| placement::Prefix::new(&params, arena as u32));
        let derived = (prefix.is_some() && params.prefix.derive_sessions)
            .then(|| DerivedSessions::with_capacity(params.max_sessions as usize));
        let mut backends = vec![Backend::NEW; usize::from(params.backends)];
        for backend in &mut backends {
            backend.budget = initial_budget(params.prefill_tokens_per_backend);
            backend.cap = params.inflight_per_backend;
        }
        let fair = fair::Fair::new(&params.tenant_weights);
        let mut queue = Queue::with_capacity(arena as u32);
        queue.grow_tenants(fair.len());
        Scheduler {
            prefix,
            derived,
            learned: Learned::new(usize::from(params.backends), arena as usize),
            gates: Gates::of(&params),
            queue,
            tracker: SessionTracker::with_capacity(params.max_sessions as usize),
            wheel: TimerWheel::new(timers, params.timer_resolution.max(1), now),
            backends,
            eligible: vec![false; usize::from(params.backends)],
            holds: HashMap::with_capacity(holds_max),
            holds_max,
            inflight: 0,
            held: 0,
            usable: params.backends,
            next_seq: 0,
            fair,
            cursor: 0,
            shutting_down: false,
            // Grows (once, then keeps its capacity) only if more timers fall due in one poll.
            expired: Vec::with_capacity(timers.min(EXPIRED_BATCH)),
            stats: Stats::default(),
            params,
        }
    }

    /// Applies `input` at `now`, appending decisions to `out`. `now` never decreases.
    pub fn handle(&mut self, now: Tick, input: Input, out: &mut Vec<Output>) {
        self.fire_timers(now, out);
        match input {
            Input::Arrive(arrival) => self.arrive(now, arrival, out),
            Input::Cancel(id) => self.cancel(now, id),
            Input::FirstByte(id) => self.first_byte(now, id),
            Input::Complete { id, success, usage } => self.complete(now, id, success, usage),
            Input::Retry(id) => self.retry(now, id, out),
            Input::Snapshot { backend, snapshot } if backend < self.params.backends => {
                self.snapshot(now, backend, snapshot);
            }
            Input::Snapshot { .. } => self.stats.stale_events += 1,
            Input::Tick => {}
            Input::Shutdown => self.shutdown(out),
        }
        self.admit_ready(now, out);
    }

    /// A live reconfiguration (issue [4/6]): applies `params` at `now`, with `live[b]` saying
    /// whether backend `b` is still configured, and admits what the new limits allow.
    ///
    /// - Backends are never renumbered: `params.backends` may only grow (new backends start
    ///   healthy, like at start); a backend that is not `live` is *removed*: not eligible, not
    ///   counted in the model's capacity, its in-flight requests finish and release as usual.
    /// - The arena, id index, heap, hold table and wheel grow when the new limits need more
    ///   room (an allocation, off the request path); they never shrink. A lowered `max_queued`
    ///   refuses new arrivals until the queue is below it; a lowered `inflight_per_backend`
    ///   admits nothing to a backend until its inflight is below it, and the arena keeps room
    ///   for a full queue beside the requests admitted over it.
    /// - Grace holds end (their slots return to admission): they were taken under the old caps.
    /// - A new `queue.timeout` applies to the requests already queued too, measured from when
    ///   each was enqueued (arrival or retry): every armed deadline shifts by the difference, a
    ///   uniform shift that keeps the deadline list in order, so it needs no re-sort. A timeout
    ///   turned on arms every queued request from `now`; turned off, disarms them.
    /// - `max_sessions` is kept: the tracker's capacity is fixed at start.
    pub fn reconfigure(
        &mut self,
        now: Tick,
        mut params: Params,
        live: &[bool],
        out: &mut Vec<Output>,
    ) {
        assert!(params.backends >= self.params.backends, "backends are never renumbered");
        assert_eq!(live.len(), usize::from(params.backends), "one live flag per backend");
        assert!(params.inflight_per_backend > 0 && params.max_queued > 0);
        params.max_sessions = self.params.max_sessions;
        self.fire_timers(now, out);
        self.end_holds();
        let count = usize::from(params.backends);
        let mut new_backend = Backend::NEW;
        new_backend.budget = initial_budget(params.prefill_tokens_per_backend);
        new_backend.cap = params.inflight_per_backend;
        self.backends.resize(count, new_backend);
        if params.prefill_tokens_per_backend != self.params.prefill_tokens_per_backend {
            for (backend, prefill) in self.backends.iter_mut().zip(&self.learned.prefill) {
                backend.budget = budget_of(params.prefill_tokens_per_backend, prefill);
            }
        }
        // A learned cap keeps what it learned across a reload that keeps learning, above the
        // new start; any other reload sets every cap to the configured one.
        let keep = params.inflight_learned && self.params.inflight_learned;
        for backend in &mut self.backends {
            let learned = if keep { backend.cap } else { 0 };
            backend.cap = learned.max(params.inflight_per_backend);
        }
        self.eligible.resize(count, false);
        for (backend, &live) in self.backends.iter_mut().zip(live) {
            backend.removed = !live;
        }
        self.usable = self.backends.iter().filter(|b| b.usable()).count() as u16;
        self.fair.grow(&params.tenant_weights);
        self.queue.grow_tenants(self.fair.len());
        match (self.params.queue_timeout, params.queue_timeout) {
            (Some(old), Some(new)) if old != new => {
                self.queue.map_deadlines(|d| d.saturating_sub(old).saturating_add(new));
            }
            (Some(_), None) => self.queue.disarm_all_deadlines(),
            (None, Some(new)) => self.queue.arm_all_deadlines(now.saturating_add(new)),
            _ => {}
        }
        self.gates = Gates::of(&params);
        self.params = params;
        self.grow_arena();
        self.fire_timers(now, out);
        self.admit_ready(now, out);
    }

    /// Grows the arena and what is sized by it to `max_queued` plus every backend's slots under
    /// the parameters: its cap, or its inflight where that is more (requests admitted under a
    /// higher cap stay until they finish, and no new admission goes past the new one). Allocates
    /// only when the arena grows: at a reload, or when a learned cap rises past what it held.
    fn grow_arena(&mut self) {
        let arena = self.arena_needed();
        let slots = arena - u64::from(self.params.max_queued);
        assert!(arena < u64::from(NIL), "max_queued + admission slots too large");
        self.queue.grow(arena as u32);
        self.learned.grow(self.backends.len(), arena as usize);
        if let Some(prefix) = &mut self.prefix {
            prefix.grow(&self.params, arena as u32);
        }
        let holding = self.params.boost && self.params.grace_period > 0;
        self.holds_max = if holding { slots as usize } else { 0 };
        self.holds.reserve(self.holds_max);
        self.wheel.reserve(self.holds_max + self.backends.len() + 1);
    }

    /// Ends every grace hold (its slot returns to admission).
    fn end_holds(&mut self) {
        // Taken out and put back so that `release_hold` can borrow `self`; the map keeps its
        // allocation.
        let mut holds = std::mem::take(&mut self.holds);
        for (_, hold) in holds.drain() {
            self.wheel.cancel(hold.timer);
            self.release_hold(hold.backend);
        }
        self.holds = holds;
    }

    /// The tick at which the next timer fires, for the thread to sleep until.
    pub fn next_wakeup(&self) -> Option<Tick> {
        let resolution = self.wheel.resolution();
        let deadline = self
            .queue
            .earliest_deadline()
            .map(|(_, deadline)| deadline.div_ceil(resolution).saturating_mul(resolution));
        match (deadline, self.wheel.next_fire()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    fn fire_timers(&mut self, now: Tick, out: &mut Vec<Output>) {
        let resolution = self.wheel.resolution();
        while let Some((index, deadline)) = self.queue.earliest_deadline() {
            // The wheel's rule, so that deadlines and wheel timers fire alike.
            if deadline.div_ceil(resolution) > now / resolution {
                break;
            }
            let id = RequestId(self.queue.get(index).id);
            self.unqueue(index);
            self.drop_prompt(index);
            self.queue.free(index);
            self.stats.timeouts += 1;
            out.push(Output::Reject { id, reason: RejectReason::QueueTimeout });
        }
        if self.wheel.is_empty() {
            return;
        }
        let mut expired = std::mem::take(&mut self.expired);
        self.wheel.poll(now, &mut expired);
        for &(_, timer) in &expired {
            match timer {
                Timer::GraceEnd(session) => {
                    let hold = self.holds.remove(&session).expect("grace timer without its hold");
                    self.release_hold(hold.backend);
                }
                Timer::Stale(backend) => self.backends[usize::from(backend)].stale_timer = None,
                Timer::Placement => {
                    if let Some(prefix) = &mut self.prefix {
                        prefix.timer = None;
                    }
                }
            }
        }
        expired.clear();
        self.expired = expired;
    }

    fn arrive(&mut self, now: Tick, arrival: Arrival, out: &mut Vec<Output>) {
        let id = arrival.id;
        // Ids are unique by contract (the shards make them so); checked where checks are free.
        debug_assert!(self.queue.find(id.0).is_none(), "request id {} arrived twice", id.0);
        if self.shutting_down {
            self.return_prompt(arrival.prompt);
            self.stats.rejected_shutdown += 1;
            return out.push(Output::Reject { id, reason: RejectReason::ShuttingDown });
        }
        if self.queue.queued() >= self.params.max_queued {
            self.return_prompt(arrival.prompt);
            self.stats.rejected_full += 1;
            return out.push(Output::Reject { id, reason: RejectReason::QueueFull });
        }
        let (session, identity) = match arrival.session {
            Some(session) => (session, Identity::Client),
            None => self.derive(id, arrival.prompt),
        };
        // One lookup serves the boost decision (S1) and the session's backend (S7).
        let last_turn = match identity {
            Identity::None => None,
            _ => self.tracker.lookup(session),
        };
        // A turn that completed before its backend's engine restarted left nothing cached:
        // the session has no warm home to go to first or to return to.
        let cold = last_turn.is_some_and(|turn| {
            let cache = self.learned.cache.get(usize::from(turn.backend));
            cache.is_some_and(|cache| turn.at < cache.restarted_at)
        });
        let mut completion = last_turn.filter(|_| self.params.boost);
        if completion.is_some() && (cold || !self.warm(arrival.prompt)) {
            // S16 refinement: a follow-up whose prefix no engine is predicted to hold has no
            // warm cache to gain from going first.
            completion = None;
            self.stats.boost_declined += 1;
        }
        let seq = self.next_seq;
        self.next_seq += 1;
        let tenant = if usize::from(arrival.tenant) < self.fair.len() { arrival.tenant } else { 0 };
        let mut entry = Entry::with_identity(id.0, session, identity, seq, now);
        entry.prompt_bytes = arrival.prompt_bytes;
        entry.streaming = arrival.streaming;
        entry.boost_mark = self.fair.get(tenant).boosted_admits as u32;
        entry.tenant = tenant;
        entry.home = last_turn.filter(|_| !cold).map_or(NO_BACKEND, |turn| turn.backend);
        entry.turn = last_turn.map_or(1, |turn| turn.turns.saturating_add(1));
        let index = self.queue.alloc(entry);
        match &mut self.prefix {
            Some(prefix) => prefix.prompt_of[index as usize] = arrival.prompt,
            None => debug_assert_eq!(arrival.prompt, NO_PROMPT, "a prompt without S16"),
        }
        if let Some(completion) = completion {
            if self.grace_hit(now, index, out) {
                return;
            }
            self.queue.enqueue(index, Lane::Boosted, completion.at);
        } else {
            self.queue.enqueue(index, Lane::Normal, 0);
        }
        if self.queue.tenant_queued(tenant) == 1 {
            self.fair.enter(tenant);
        }
        self.arm_deadline(now, index);
    }

    /// S8: admits a boosted arrival into the slot held for its session, if there is one.
    fn grace_hit(&mut self, now: Tick, index: u32, out: &mut Vec<Output>) -> bool {
        let session = self.queue.get(index).session;
        let Some(hold) = self.holds.get(&session).copied() else {
            return false;
        };
        if !self.backends[usize::from(hold.backend)].usable() {
            return false;
        }
        self.holds.remove(&session);
        self.wheel.cancel(hold.timer);
        self.release_hold(hold.backend);
        self.stats.grace_hits += 1;
        let tokens = self.prompt_tokens(index);
        self.fair.charge_direct(self.queue.tenant_of(index), tokens);
        self.bind(now, index, hold.backend, Lane::Boosted, true, out);
        true
    }

    fn arm_deadline(&mut self, now: Tick, index: u32) {
        if let Some(timeout) = self.params.queue_timeout {
            self.queue.arm_deadline(index, now.saturating_add(timeout));
        }
    }

    /// Takes a queued entry out of its lane and disarms its deadline; its tenant leaves the
    /// tenant order with its last queued request.
    fn unqueue(&mut self, index: u32) -> Lane {
        self.queue.disarm_deadline(index);
        let lane = self.queue.dequeue(index);
        let tenant = self.queue.tenant_of(index);
        if lane != Lane::Retry && self.queue.tenant_queued(tenant) == 0 {
            self.fair.leave(tenant);
        }
        lane
    }

    /// Takes a queued entry out of its lane to admit it: its tenant is charged its estimated
    /// prompt tokens and takes its next place in the tenant order (a retry is not charged).
    fn unqueue_admitted(&mut self, index: u32) {
        self.queue.disarm_deadline(index);
        if self.queue.dequeue(index) == Lane::Retry {
            return;
        }
        let tenant = self.queue.tenant_of(index);
        let queued = self.queue.tenant_queued(tenant) > 0;
        if self.fair.len() == 1 {
            // No tenants configured: one tenant's order needs no virtual time.
            if !queued {
                self.fair.leave(tenant);
            }
            return;
        }
        self.fair.served(tenant, self.prompt_tokens(index), queued);
    }

    fn cancel(&mut self, now: Tick, id: RequestId) {
        let Some(index) = self.queue.unindex(id.0, |_| true) else {
            self.stats.stale_events += 1;
            return;
        };
        if self.queue.get(index).place == Place::Admitted {
            self.release_slot(now, index, false);
        } else {
            self.unqueue(index);
            self.stats.cancelled += 1;
        }
        self.drop_prompt(index);
        self.queue.release(index);
    }

    /// Issue \[10\]: the session of an arrival without identity, from its prompt's
    /// conversation ends: the session of the newest earlier end that a completed turn left,
    /// else a new session of its own when its prompt has a conversation end, else none
    /// (derivation off, no prompt hashes, or a prompt with no conversation boundary).
    fn derive(&mut self, id: RequestId, prompt: u32) -> (u64, Identity) {
        let (Some(derived), Some(prefix)) = (&self.derived, &self.prefix) else {
            return (0, Identity::None);
        };
        if prompt == NO_PROMPT {
            return (0, Identity::None);
        }
        let ends = prefix.pool.ends(prompt);
        if let Some(session) = ends.earlier().iter().find_map(|&end| derived.find(end)) {
            self.stats.derived_matched += 1;
            return (session, Identity::Derived);
        }
        match ends.whole() {
            Some(_) => {
                self.stats.derived_fresh += 1;
                (DerivedSessions::new_session(id.0), Identity::Fresh)
            }
            None => (0, Identity::None),
        }
    }

    /// Issue \[10\]: entry `index`'s turn of `session` completed: its whole prompt's end is
    /// where the conversation's next turn will look for it.
    fn record_end(&mut self, index: u32, session: u64) {
        let (Some(derived), Some(prefix)) = (&mut self.derived, &self.prefix) else { return };
        let slot = prefix.prompt_of[index as usize];
        if slot == NO_PROMPT {
            return;
        }
        if let Some(end) = prefix.pool.ends(slot).whole() {
            derived.record(end, session);
        }
    }

    /// S8: holds the slot `backend` just freed for a follow-up of `session`.
    fn start_hold(&mut self, now: Tick, session: u64, backend: u16) {
        let grace = self.params.grace_period;
        if self.holds_max == 0 || self.shutting_down || self.holds.contains_key(&session) {
            return;
        }
        let state = &mut self.backends[usize::from(backend)];
        if !state.usable() || state.inflight + state.holds >= state.cap {
            return;
        }
        state.holds += 1;
        state.cap_filled |= state.inflight + state.holds >= state.cap;
        self.held += 1;
        let timer = self.wheel.insert(now.saturating_add(grace), Timer::GraceEnd(session));
        self.holds.insert(session, Hold { backend, timer });
        self.stats.grace_holds += 1;
    }

    fn release_hold(&mut self, backend: u16) {
        self.backends[usize::from(backend)].holds -= 1;
        self.held -= 1;
    }

    fn retry(&mut self, now: Tick, id: RequestId, out: &mut Vec<Output>) {
        let Some(index) = self.admitted(id) else { return };
        let entry = *self.queue.get(index);
        self.release_slot(now, index, false);
        self.note_failure(now, entry.backend);
        let reason = if self.shutting_down {
            Some(RejectReason::ShuttingDown)
        } else if u32::from(entry.retries) >= self.params.max_retries {
            Some(RejectReason::RetriesExhausted)
        } else {
            None
        };
        if let Some(reason) = reason {
            self.drop_prompt(index);
            self.queue.free(index);
            self.count_reject(reason);
            return out.push(Output::Reject { id, reason });
        }
        self.stats.retries += 1;
        let requeued = self.queue.get_mut(index);
        requeued.retries += 1;
        requeued.place = Place::Free;
        self.queue.enqueue(index, Lane::Retry, 0);
        self.arm_deadline(now, index);
    }

    fn count_reject(&mut self, reason: RejectReason) {
        match reason {
            RejectReason::QueueTimeout => self.stats.timeouts += 1,
            RejectReason::QueueFull => self.stats.rejected_full += 1,
            RejectReason::ShuttingDown => self.stats.rejected_shutdown += 1,
            RejectReason::RetriesExhausted => self.stats.retries_exhausted += 1,
        }
    }

    /// Passive health (SPEC 2.8): eject a backend after repeated retryable failures.
    fn note_failure(&mut self, now: Tick, backend: u16) {
        let limit = self.params.eject_after_failures;
        let state = &mut self.backends[usize::from(backend)];
        state.consecutive_failures += 1;
        if limit > 0 && state.consecutive_failures >= limit && !state.ejected {
            let was_usable = state.usable();
            state.ejected = true;
            state.ejected_at = now;
            if was_usable {
                self.usable -= 1;
            }
            self.stats.ejections += 1;
        }
    }

    fn snapshot(&mut self, now: Tick, backend: u16, snapshot: Snapshot) {
        let cache = snapshot.cache;
        let model = &mut self.learned.cache[usize::from(backend)];
        if snapshot.new_engine {
            // Counted before this report's counters, which are then the new engine's first.
            model.restarted(now);
        }
        model.kv_usage(now, cache.kv_usage_micro);
        let decode = &mut self.learned.decode[usize::from(backend)];
        decode.engine_counters(cache.itl_ticks, cache.itl_count, snapshot.new_engine, now);
        let reported =
            model.snapshot(now, cache.kv_capacity_tokens, cache.prefix_queries, cache.prefix_hits);
        if reported.restarted || snapshot.new_engine {
            // A new engine process: its prefix cache is empty, whatever warmpath sent before.
            if let Some(prefix) = &mut self.prefix {
                prefix.indexes[usize::from(backend)].clear();
            }
        }
        if reported.capacity_changed || model.calibrate(now) {
            self.resize_index(backend);
        }
        let stale_after = self.params.metrics_stale_after;
        let auto = self.params.prefill_tokens_per_backend == Budget::Auto;
        let queued = self.queue.queued() > 0;
        let state = &mut self.backends[usize::from(backend)];
        let was_usable = state.usable();
        state.healthy = snapshot.healthy;
        if snapshot.healthy && state.ejected && snapshot.scraped_at > state.ejected_at {
            state.ejected = false;
            state.consecutive_failures = 0;
        }
        state.waiting = snapshot.waiting;
        state.scraped_at = snapshot.scraped_at;
        let preempted = state.preempted(cache.preemptions, snapshot.new_engine);
        let split = snapshot.waiting.map(|waiting| state.waiting_split(waiting, preempted));
        if let Some((_, unseen, _)) = split {
            let rate = self.learned.drain_rate(backend);
            state.unstreamed_backlog.engine_waiting(unseen, rate, now);
        }
        if let (true, Some((_, unseen, others))) = (self.params.inflight_learned, split) {
            // Warmpath's non-streaming requests in the engine's queue, and someone else's,
            // steer the cap; its streaming ones steer the budget (estimate.rs, "The inflight
            // cap").
            let full = state.inflight + state.holds >= state.cap;
            let capped = (std::mem::take(&mut state.cap_filled) || full) && queued;
            let floor = self.params.inflight_per_backend;
            state.cap = estimate::next_cap(state.cap, floor, unseen, others, capped);
        }
        if let (true, Some((own, _, others))) = (auto, split) {
            // Of the engine's waiting requests, as many as warmpath has pending there are taken
            // to be its own (a request it sent and the engine has not started has no first
            // byte): those steer the budget. Of the rest, its non-streaming requests there
            // (they show no first byte at all) and its decoding ones the engine preempted since
            // the last report may be its own too. Only what is left, someone else's, gates the
            // backend (policy.rs).
            state.waiting = Some(others);
            self.learn_budget(now, backend, own, queued);
        }
        let state = &mut self.backends[usize::from(backend)];
        let is_usable = state.usable();
        let old_timer = state.stale_timer.take();
        let stale_at = snapshot.scraped_at.saturating_add(stale_after);
        let arm = state.waiting.is_some_and(|waiting| waiting > 0) && stale_at > now;
        if let Some(key) = old_timer {
            self.wheel.cancel(key);
        }
        if arm {
            let key = self.wheel.insert(stale_at, Timer::Stale(backend));
            self.backends[usize::from(backend)].stale_timer = Some(key);
        }
        match (was_usable, is_usable) {
            (true, false) => self.usable -= 1,
            (false, true) => self.usable += 1,
            _ => {}
        }
        if self.arena_needed() > u64::from(self.queue.capacity()) {
            self.grow_arena();
        }
    }

    /// The arena `max_queued` and every backend's slots need: its cap, or its inflight where
    /// that is more.
    fn arena_needed(&self) -> u64 {
        let slots: u64 = self.backends.iter().map(|b| u64::from(b.inflight.max(b.cap))).sum();
        u64::from(self.params.max_queued) + slots
    }

    /// A snapshot's move of `backend`'s learned budget, `own` of the engine's waiting requests
    /// being warmpath's pending ones (`queued`: warmpath's queue holds requests).
    fn learn_budget(&mut self, now: Tick, backend: u16, own: u32, queued: bool) {
        let state = &mut self.backends[usize::from(backend)];
        // The budget held requests back since the last snapshot, and requests are queued.
        let held_back = std::mem::take(&mut state.budget_filled) && queued;
        // Those sent within the engine's last step wait for its next one, started or not.
        let arrivals = u64::from(std::mem::take(&mut state.arrivals));
        let interval = now.saturating_sub(std::mem::replace(&mut state.snapshot_at, now));
        let step = self.learned.decode[usize::from(backend)].gap / decode::GAP_SCALE;
        let arriving = (arrivals * step).checked_div(interval).unwrap_or(0);
        let own = own.saturating_sub(u32::try_from(arriving).unwrap_or(u32::MAX));
        let prefill = &mut self.learned.prefill[usize::from(backend)];
        prefill.engine_queue(now, own, state.prefill_pending, held_back);
        state.budget = prefill.budget;
    }

    fn shutdown(&mut self, out: &mut Vec<Output>) {
        self.shutting_down = true;
        for tenant in 0..self.queue.tenants() as u16 {
            while let Some(index) =
                Lane::ALL.iter().find_map(|&lane| self.queue.first(lane, tenant))
            {
                let id = RequestId(self.queue.get(index).id);
                self.unqueue(index);
                self.drop_prompt(index);
                self.queue.free(index);
                self.stats.rejected_shutdown += 1;
                out.push(Output::Reject { id, reason: RejectReason::ShuttingDown });
            }
        }
        self.end_holds();
    }

    /// S6: admits queued requests while a backend is eligible.
    fn admit_ready(&mut self, now: Tick, out: &mut Vec<Output>) {
        if self.prefix.is_some() && self.params.routing == Routing::PrefixCost {
            return self.admit_by_cost(now, out);
        }
        while self.queue.queued() > 0
            && self.model_has_room()
            && self.gates.evaluate(&self.backends, now, &mut self.eligible)
        {
            let tenant = self.fair.head();
            if let Some(tenant) = tenant {
                self.promote_overtaken(tenant);
            }
            let (index, lane) = self.next_in_order(tenant);
            let entry = self.queue.get(index);
            let home = entry.home;
            let avoid = if lane == Lane::Retry { entry.backend } else { NO_BACKEND };
            let (backend, affinity) = policy::choose(
                self.params.routing,
                &self.backends,
                &self.eligible,
                &self.gates,
                now,
                home,
                avoid,
                &mut self.cursor,
            )
            .expect("an eligible backend exists");
            self.unqueue_admitted(index);
            self.bind(now, index, backend, lane, affinity, out);
        }
    }

    /// S6a: the model's admitted requests and held slots are below its capacity.
    fn model_has_room(&self) -> bool {
        let capacity = if self.params.inflight_learned {
            self.backends.iter().filter(|b| b.usable()).map(|b| u64::from(b.cap)).sum()
        } else {
            u64::from(self.params.inflight_per_backend) * u64::from(self.usable)
        };
        u64::from(self.inflight + self.held) < capacity
    }

    /// S4: before an admission, force `tenant`'s oldest boosted request once it has been
    /// overtaken `max_overtakes` times by the tenant's boosted admissions.
    fn promote_overtaken(&mut self, tenant: u16) {
        let bound = u64::from(self.params.max_overtakes);
        let Some(oldest) = self.queue.oldest_boosted(tenant) else { return };
        let admits = self.fair.get(tenant).boosted_admits;
        let overtakes = (admits as u32).wrapping_sub(self.queue.get(oldest).boost_mark);
        if bound > 0 && u64::from(overtakes) >= bound {
            self.queue.force(oldest);
            self.stats.forced += 1;
        }
    }

    /// S3 with S5 for `tenant`: its lanes in serving order (the retry lane first).
    fn lane_order(&self, tenant: u16) -> [Lane; 4] {
        let streak_max = self.params.boosted_streak_max;
        if streak_max > 0 && self.fair.get(tenant).streak >= streak_max {
            [Lane::Retry, Lane::Forced, Lane::Normal, Lane::Boosted]
        } else {
            Lane::ALL
        }
    }

    /// The next request to admit and its lane: the retry lane's head, else S3 with S5 in the
    /// lanes of `tenant`, the head of the tenant order.
    fn next_in_order(&self, tenant: Option<u16>) -> (u32, Lane) {
        if let Some(index) = self.queue.first(Lane::Retry, 0) {
            return (index, Lane::Retry);
        }
        let tenant = tenant.expect("admission with an empty queue");
        self.lane_order(tenant)
            .iter()
            .find_map(|&lane| self.queue.first(lane, tenant).map(|index| (index, lane)))
            .expect("a backlogged tenant with an empty queue")
    }
}

/// A new backend's budget: the configured one, or the unlearned start of an `auto` one.
fn initial_budget(budget: Budget) -> u64 {
    match budget {
        Budget::Auto => estimate::BUDGET_UNLEARNED,
        Budget::Tokens(tokens) => tokens,
    }
}

/// A backend's budget under `budget` with what `prefill` has learned (0 = no budget).
fn budget_of(budget: Budget, prefill: &estimate::Prefill) -> u64 {
    match budget {
        Budget::Auto => prefill.budget,
        Budget::Tokens(tokens) => tokens,
    }
}
