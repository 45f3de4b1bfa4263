//! Rule-by-rule tests of SPEC section 3, written as event sequences with the expected
//! admissions and rejections, plus the differential property test against the reference.

use proptest::prelude::*;

use super::*;

/// A "millisecond" of 2^20 ticks: a whole number of wheel resolutions, so that deadlines in
/// the tests fire exactly when they fall due.
const MS: Tick = 1 << 20;

pub(super) fn params() -> Params {
    Params {
        boost: true,
        routing: Routing::SessionAffinity,
        backends: 1,
        queue_timeout: None,
        max_queued: 1000,
        inflight_per_backend: 1,
        inflight_learned: false,
        prefill_tokens_per_backend: Budget::Tokens(0),
        max_sessions: 1000,
        max_overtakes: 16,
        boosted_streak_max: 0,
        grace_period: 0,
        max_retries: 2,
        eject_after_failures: 0,
        metrics_stale_after: 5_000 * MS,
        timer_resolution: 1 << 10,
        prefix: super::PrefixParams::DEFAULT,
        tenant_weights: Vec::new(),
    }
}

/// A scheduler on a simulated clock, recording what it decided.
pub(super) struct Harness {
    pub(super) s: Scheduler,
    pub(super) now: Tick,
    pub(super) out: Vec<Output>,
}

impl Harness {
    pub(super) fn new(params: Params) -> Harness {
        Harness { s: Scheduler::new(params, 0), now: 0, out: Vec::new() }
    }

    pub(super) fn at(&mut self, now: Tick) -> &mut Harness {
        assert!(now >= self.now);
        self.now = now;
        self
    }

    pub(super) fn send(&mut self, input: Input) -> Vec<Output> {
        self.out.clear();
        self.s.handle(self.now, input, &mut self.out);
        self.s.check_invariants();
        self.out.clone()
    }

    fn arrive(&mut self, id: u64, session: Option<u64>) -> Vec<Output> {
        self.arrive_with(id, session, 0, false)
    }

    pub(super) fn arrive_with(
        &mut self,
        id: u64,
        session: Option<u64>,
        tokens: u32,
        streaming: bool,
    ) -> Vec<Output> {
        let arrival = Arrival {
            id: RequestId(id),
            session,
            prompt_bytes: tokens * 4,
            streaming,
            prompt: crate::ring::prompt_pool::NO_PROMPT,
            tenant: 0,
        };
        self.send(Input::Arrive(arrival))
    }

    pub(super) fn complete(&mut self, id: u64) -> Vec<Output> {
        self.send(Input::Complete { id: RequestId(id), success: true, usage: Usage::NONE })
    }

    /// Runs request `id` of `session` to completion on an idle scheduler at the current time.
    fn serve(&mut self, id: u64, session: u64) {
        assert_eq!(admitted(&self.arrive(id, Some(session))), vec![id]);
        self.complete(id);
    }

    pub(super) fn snapshot(
        &mut self,
        backend: u16,
        healthy: bool,
        waiting: Option<u32>,
    ) -> Vec<Output> {
        let snapshot = Snapshot::new(healthy, waiting, self.now);
        self.send(Input::Snapshot { backend, snapshot })
    }
}

pub(super) fn admitted(outputs: &[Output]) -> Vec<u64> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Admit { id, .. } => Some(id.0),
            Output::Reject { .. } => None,
        })
        .collect()
}

fn admitted_to(outputs: &[Output]) -> Vec<(u64, u16)> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Admit { id, backend, .. } => Some((id.0, *backend)),
            Output::Reject { .. } => None,
        })
        .collect()
}

fn rejected(outputs: &[Output]) -> Vec<(u64, RejectReason)> {
    outputs
        .iter()
        .filter_map(|o| match o {
            Output::Reject { id, reason } => Some((id.0, *reason)),
            Output::Admit { .. } => None,
        })
        .collect()
}

const A: u64 = 0xA;
const B: u64 = 0xB;
const C: u64 = 0xC;

/// Occupies the single slot with a sessionless request; returns its id.
fn block(h: &mut Harness, id: u64) -> u64 {
    assert_eq!(admitted(&h.arrive(id, None)), vec![id]);
    id
}

/// Completes requests one by one from `first`, returning the order of admissions.
fn drain(h: &mut Harness, first: u64) -> Vec<u64> {
    let mut order = Vec::new();
    let mut running = first;
    loop {
        let next = admitted(&h.complete(running));
        match next.as_slice() {
            [] => return order,
            [id] => {
                order.push(*id);
                running = *id;
            }
            more => panic!("one slot admitted {more:?}"),
        }
    }
}

#[test]
fn s3_example_order() {
    let mut h = Harness::new(params());
    h.at(10).serve(1, A);
    h.at(11).serve(2, B);
    h.at(12).serve(3, C);
    let blocker = block(&mut h, 4);
    for (id, session) in [(5, Some(B)), (6, Some(C)), (7, Some(A)), (8, None)] {
        assert!(h.arrive(id, session).is_empty());
    }
    assert_eq!(h.s.depth(Lane::Boosted), 3);
    assert_eq!(h.s.depth(Lane::Normal), 1);
    assert_eq!(drain(&mut h, blocker), vec![6, 5, 7, 8]);
}

#[test]
fn boost_decision_is_final_and_lookup_keeps_recency() {
    let mut p = params();
    p.max_sessions = 2;
    let mut h = Harness::new(p);
    h.at(1).serve(1, A);
    h.at(2).serve(2, B);
    assert_eq!(admitted(&h.arrive(3, Some(C))), vec![3], "C: not tracked, runs at once");
    assert!(h.arrive(4, Some(A)).is_empty(), "A: boosted, queued; this lookup keeps A's recency");
    // C's completion evicts the least recently completed session: A, not B.
    let out = h.at(3).complete(3);
    assert!(
        matches!(out[..], [Output::Admit { lane: Lane::Boosted, .. }]),
        "S1: decision is final"
    );
    h.arrive(5, Some(A));
    assert_eq!(h.s.depth(Lane::Normal), 1, "A was evicted: its next turn is normal");
    h.arrive(6, Some(B));
    assert_eq!(h.s.depth(Lane::Boosted), 1, "B is still tracked");
}

#[test]
fn s2_eviction_cases_through_the_scheduler() {
    for (completions, evicted, held) in
        [(&[A, B, A, C][..], B, [A, C]), (&[A, B, C][..], A, [B, C])]
    {
        let mut p = params();
        p.max_sessions = 2;
        let mut h = Harness::new(p);
        for (step, &session) in completions.iter().enumerate() {
            h.at(step as u64 + 1).serve(100 + step as u64, session);
        }
        let blocker = block(&mut h, 1);
        h.arrive(2, Some(evicted));
        assert_eq!(h.s.depth(Lane::Normal), 1, "evicted session is not boosted");
        h.arrive(3, Some(held[0]));
        h.arrive(4, Some(held[1]));
        assert_eq!(h.s.depth(Lane::Boosted), 2, "held sessions are boosted");
        assert_eq!(drain(&mut h, blocker), vec![4, 3, 2]);
    }
}

/// Bounded overtaking: before every admission a follow-up of a newer completion arrives.
/// Returns how many boosted admissions happened before the victim was admitted, if it was.
fn overtaking_run(max_overtakes: u32, rounds: u64) -> Option<usize> {
    let mut p = params();
    p.max_overtakes = max_overtakes;
    let mut h = Harness::new(p);
    h.at(1).serve(1, 1000); // the victim's session completes first
    for session in 0..rounds {
        h.at(2 + session).serve(10 + session, session);
    }
    let mut running = block(&mut h, 2);
    h.arrive(3, Some(1000));
    for (boosted_before, session) in (0..rounds).enumerate() {
        h.arrive(100 + session, Some(session));
        let next = admitted(&h.complete(running));
        assert_eq!(next.len(), 1);
        if next[0] == 3 {
            return Some(boosted_before);
        }
        running = next[0];
    }
    None
}

#[test]
fn bounded_overtaking_forces_the_victim() {
    for bound in [1, 2, 5, 16] {
        let overtaken = overtaking_run(bound, 40).expect("victim admitted");
        assert!(overtaken <= bound as usize, "bound {bound}: overtaken {overtaken} times");
        assert_eq!(overtaken, bound as usize, "bound {bound}: forced exactly at the bound");
    }
}

#[test]
fn zero_max_overtakes_is_pure_completion_order() {
    assert_eq!(overtaking_run(0, 40), None, "the victim waits while newer follow-ups arrive");
}

#[test]
fn forced_lane_is_reported_and_counted() {
    let mut p = params();
    p.max_overtakes = 1;
    let mut h = Harness::new(p);
    h.at(1).serve(1, A);
    h.at(2).serve(2, B);
    let blocker = block(&mut h, 3);
    h.arrive(4, Some(A));
    h.arrive(5, Some(B));
    let first = h.complete(blocker);
    assert_eq!(admitted(&first), vec![5], "B completed last");
    let second = h.complete(5);
    assert!(matches!(second[0], Output::Admit { lane: Lane::Forced, .. }));
    assert_eq!(h.s.stats().forced, 1);
}

fn grace_params() -> Params {
    let mut p = params();
    p.grace_period = 100 * MS;
    p
}

#[test]
fn grace_admits_the_follow_up_at_once_and_before_older_normal() {
    let mut h = Harness::new(grace_params());
    assert_eq!(admitted(&h.at(0).arrive(1, Some(A))), vec![1]);
    h.at(10 * MS).complete(1);
    assert_eq!(h.s.backend_holds(0), 1);
    assert!(h.arrive(2, None).is_empty(), "the held slot is not given to others");
    let hit = h.at(20 * MS).arrive(3, Some(A));
    assert_eq!(admitted(&hit), vec![3], "the follow-up takes the held slot at once");
    assert!(matches!(hit[0], Output::Admit { lane: Lane::Boosted, backend: 0, .. }));
    assert_eq!(h.s.stats().grace_hits, 1);
    assert!(h.at(30 * MS).complete(3).is_empty(), "A completes again: a new hold");
    assert_eq!(admitted(&h.at(130 * MS).send(Input::Tick)), vec![2]);
}

#[test]
fn grace_without_follow_up_releases_the_slot_when_the_window_ends() {
    let mut h = Harness::new(grace_params());
    h.at(0).arrive(1, Some(A));
    h.at(10 * MS).complete(1);
    h.arrive(2, None);
    assert!(h.at(109 * MS).send(Input::Tick).is_empty(), "not before the window ends");
    assert_eq!(h.s.next_wakeup(), Some(110 * MS));
    assert_eq!(admitted(&h.at(110 * MS).send(Input::Tick)), vec![2]);
}

#[test]
fn grace_never_delays_an_arrival_on_an_idle_queue() {
    let mut p = grace_params();
    p.inflight_per_backend = 3;
    let mut h = Harness::new(p);
    assert_eq!(admitted(&h.at(0).arrive(1, None)), vec![1], "idle queue: admitted at once");
    h.arrive(2, Some(A));
    h.at(MS).complete(2);
    assert_eq!(admitted(&h.arrive(3, None)), vec![3], "free capacity beside the held slot");
    assert_eq!(h.s.backend_holds(0), 1);
}

#[test]
fn cancel_at_any_heap_position() {
    for victim in 0..8u64 {
        let mut h = Harness::new(params());
        for session in 0..8 {
            h.at(session + 1).serve(100 + session, session);
        }
        let blocker = block(&mut h, 1);
        for session in [3, 7, 1, 5, 0, 6, 2, 4] {
            h.arrive(10 + session, Some(session));
        }
        assert!(h.send(Input::Cancel(RequestId(10 + victim))).is_empty());
        assert_eq!(h.s.stats().cancelled, 1);
        let expected: Vec<u64> = (0..8).rev().filter(|&s| s != victim).map(|s| 10 + s).collect();
        assert_eq!(drain(&mut h, blocker), expected);
    }
}

#[test]
fn timeout_at_any_heap_position() {
    let mut p = params();
    p.queue_timeout = Some(100 * MS);
    let mut h = Harness::new(p);
    for session in 0..6 {
        h.at(session + 1).serve(100 + session, session);
    }
    let blocker = block(&mut h, 1);
    // Arrivals 10 ms apart, in an order unrelated to their boost priority.
    for (step, session) in [4u64, 1, 5, 0, 3, 2].into_iter().enumerate() {
        h.at(10 * MS * (step as u64 + 1)).arrive(10 + session, Some(session));
    }
    let expired = h.at(125 * MS).send(Input::Tick);
    assert_eq!(
        rejected(&expired),
        vec![(14, RejectReason::QueueTimeout), (11, RejectReason::QueueTimeout)]
    );
    assert_eq!(h.s.stats().timeouts, 2);
    assert_eq!(drain(&mut h, blocker), vec![15, 13, 12, 10]);
}

#[test]
fn inflight_gate_and_reopening_by_completion() {
    let mut p = params();
    p.inflight_per_backend = 2;
    let mut h = Harness::new(p);
    assert_eq!(admitted(&h.arrive(1, None)), vec![1]);
    assert_eq!(admitted(&h.arrive(2, None)), vec![2]);
    assert!(h.arrive(3, None).is_empty(), "inflight cap reached");
    assert_eq!(
        admitted(&h.send(Input::Complete { id: RequestId(1), success: false, usage: Usage::NONE })),
        vec![3]
    );
}

#[test]
fn waiting_gauge_closes_until_a_snapshot_reopens() {
    let mut h = Harness::new({
        let mut p = params();
        p.inflight_per_backend = 8;
        p
    });
    h.at(MS).snapshot(0, true, Some(3));
    assert!(h.arrive(1, None).is_empty(), "engine reports a waiting queue");
    assert_eq!(admitted(&h.at(2 * MS).snapshot(0, true, Some(0))), vec![1], "snapshot triggers");
}

#[test]
fn stale_waiting_gauge_falls_back_to_the_other_gates() {
    let mut h = Harness::new({
        let mut p = params();
        p.inflight_per_backend = 8;
        p
    });
    h.at(MS).snapshot(0, true, Some(3));
    assert!(h.arrive(1, None).is_empty());
    assert_eq!(h.s.next_wakeup(), Some(5_001 * MS), "a timer for the gauge going stale");
    assert!(h.at(5_000 * MS).send(Input::Tick).is_empty(), "still fresh");
    assert_eq!(admitted(&h.at(5_001 * MS).send(Input::Tick)), vec![1], "stale: judged without it");
}

#[test]
fn prefill_backlog_gate_and_first_byte_reopening() {
    let mut p = params();
    p.inflight_per_backend = 8;
    p.prefill_tokens_per_backend = Budget::Tokens(1000);
    let mut h = Harness::new(p);
    assert_eq!(
        admitted(&h.arrive_with(1, None, 5000, true)),
        vec![1],
        "one huge prompt gets through"
    );
    assert_eq!(h.s.backend_prefill_tokens(0), 5000);
    assert!(h.arrive_with(2, None, 100, true).is_empty(), "backlog over budget");
    assert_eq!(admitted(&h.send(Input::FirstByte(RequestId(1)))), vec![2], "first byte reopens");
    assert_eq!(h.s.backend_prefill_tokens(0), 100);
    assert_eq!(admitted(&h.arrive_with(3, None, 100, false)), vec![3], "below budget");
    assert_eq!(admitted(&h.arrive_with(4, None, 900, true)), vec![4]);
    assert!(h.arrive_with(5, None, 1, false).is_empty(), "1000 tokens pending: closed");
    assert_eq!(h.s.backend_prefill_tokens(0), 1000, "non-streaming requests do not count");
}

#[test]
fn streak_bound_lets_the_oldest_normal_request_through() {
    let mut p = params();
    p.boosted_streak_max = 2;
    let mut h = Harness::new(p);
    for session in 0..5 {
        h.at(session + 1).serve(100 + session, session);
    }
    let blocker = block(&mut h, 1);
    h.arrive(2, None);
    h.arrive(3, None);
    for session in 0..5 {
        h.arrive(10 + session, Some(session));
    }
    assert_eq!(drain(&mut h, blocker), vec![14, 13, 2, 12, 11, 3, 10]);
}

#[test]
fn session_affinity_prefers_home_and_falls_back_to_least_loaded() {
    let mut p = params();
    p.backends = 3;
    p.inflight_per_backend = 2;
    let mut h = Harness::new(p);
    // Put session A's last turn on backend 2.
    let placed = admitted_to(&h.arrive(1, None));
    assert_eq!(placed, vec![(1, 0)]);
    assert_eq!(admitted_to(&h.arrive(2, None)), vec![(2, 1)]);
    assert_eq!(admitted_to(&h.arrive(3, Some(A))), vec![(3, 2)]);
    h.complete(3);
    let home = h.arrive(4, Some(A));
    assert!(matches!(home[0], Output::Admit { backend: 2, affinity: true, .. }));
    assert_eq!(admitted_to(&h.arrive(5, None)), vec![(5, 0)], "rotation on ties");
    assert_eq!(admitted_to(&h.arrive(6, Some(A))), vec![(6, 2)]);
    // Backend 2 now full (4 and 6); session A's next turn goes to the least loaded (1).
    assert_eq!(h.s.backend_inflight(2), 2);
    let away = h.arrive(7, Some(A));
    assert!(matches!(away[0], Output::Admit { backend: 1, affinity: false, .. }), "{away:?}");
    assert_eq!(h.s.stats().affinity_hits, 2);
}

#[test]
fn a_turn_served_before_its_engine_restarted_is_neither_boosted_nor_sent_home() {
    let mut p = params();
    p.backends = 2;
    p.inflight_per_backend = 2;
    let mut h = Harness::new(p);
    let counters = |h: &mut Harness, queries, hits| {
        let mut snapshot = Snapshot::new(true, Some(0), h.now);
        let cache =
            EngineCache { prefix_queries: queries, prefix_hits: hits, ..EngineCache::UNKNOWN };
        snapshot.cache = cache;
        h.send(Input::Snapshot { backend: 1, snapshot })
    };
    counters(&mut h, 5_000, 1_000);
    // Session A completes on backend 1.
    assert_eq!(admitted_to(&h.arrive(1, None)), vec![(1, 0)]);
    assert_eq!(admitted_to(&h.arrive(2, Some(A))), vec![(2, 1)]);
    h.complete(2);
    h.complete(1);
    // Backend 1's engine restarts (its counters go down); then session B completes there.
    h.at(2 * MS);
    counters(&mut h, 100, 0);
    assert_eq!(h.s.backend_estimates(1).restarts, 1);
    h.at(3 * MS);
    assert_eq!(admitted_to(&h.arrive(10, None)), vec![(10, 0)]);
    assert_eq!(admitted_to(&h.arrive(11, None)), vec![(11, 1)]);
    assert_eq!(admitted_to(&h.arrive(12, None)), vec![(12, 0)]);
    assert_eq!(admitted_to(&h.arrive(3, Some(B))), vec![(3, 1)]);
    h.complete(3);
    assert_eq!(admitted_to(&h.arrive(13, None)), vec![(13, 1)]);
    // Both backends full; then a normal request, A's follow-up and B's queue.
    assert!(admitted(&h.arrive(14, None)).is_empty());
    assert!(admitted(&h.arrive(4, Some(A))).is_empty());
    assert!(admitted(&h.arrive(5, Some(B))).is_empty());
    // A's last turn predates the restart: not boosted (counted as declined), no home. B's
    // turn on the new engine is boosted and goes home.
    assert_eq!(h.s.stats().boost_declined, 1);
    let next = h.complete(11);
    assert!(
        matches!(
            next[..],
            [Output::Admit {
                id: RequestId(5),
                backend: 1,
                affinity: true,
                lane: Lane::Boosted,
                ..
            }]
        ),
        "{next:?}"
    );
    assert_eq!(admitted_to(&h.complete(10)), vec![(14, 0)]);
    let next = h.complete(12);
    assert!(
        matches!(
            next[..],
            [Output::Admit {
                id: RequestId(4),
                backend: 0,
                affinity: false,
                lane: Lane::Normal,
                turn: 2,
                ..
            }]
        ),
        "{next:?}"
    );
}

#[test]
fn least_inflight_ignores_the_session() {
    let mut p = params();
    p.backends = 2;
    p.inflight_per_backend = 4;
    p.routing = Routing::LeastInflight;
    let mut h = Harness::new(p);
    h.arrive(1, Some(A));
    h.complete(1); // A on backend 0
    h.arrive(2, None); // backend 1 (rotation)
    assert_eq!(admitted_to(&h.arrive(3, Some(A))), vec![(3, 0)]);
    assert_eq!(admitted_to(&h.arrive(4, Some(A))), vec![(4, 1)], "least inflight, not home");
}

#[test]
fn shutdown_rejects_everything_queued_and_later_arrivals() {
    let mut h = Harness::new(params());
    h.at(1).serve(1, A);
    block(&mut h, 2);
    h.arrive(3, Some(A));
    h.arrive(4, None);
    let out = h.send(Input::Shutdown);
    let mut gone = rejected(&out);
    gone.sort();
    assert_eq!(gone, vec![(3, RejectReason::ShuttingDown), (4, RejectReason::ShuttingDown)]);
    assert_eq!(rejected(&h.arrive(5, None)), vec![(5, RejectReason::ShuttingDown)]);
    assert!(admitted(&h.complete(2)).is_empty(), "in-flight requests finish; nothing new");
    assert_eq!(h.s.inflight(), 0);
    assert_eq!(h.s.queued(), 0);
}

#[test]
fn queue_bound_rejects_with_queue_full() {
    let mut p = params();
    p.max_queued = 2;
    let mut h = Harness::new(p);
    block(&mut h, 1);
    h.arrive(2, None);
    h.arrive(3, None);
    assert_eq!(rejected(&h.arrive(4, None)), vec![(4, RejectReason::QueueFull)]);
}

#[test]
fn retry_goes_first_to_another_backend_then_exhausts() {
    let mut p = params();
    p.backends = 2;
    p.max_retries = 1;
    let mut h = Harness::new(p);
    assert_eq!(admitted_to(&h.arrive(1, None)), vec![(1, 0)]);
    assert_eq!(admitted_to(&h.arrive(2, None)), vec![(2, 1)]);
    h.arrive(3, None);
    let again = h.send(Input::Retry(RequestId(1)));
    assert_eq!(admitted_to(&again), vec![(1, 0)], "only backend 0 has room: the same one");
    assert!(matches!(again[0], Output::Admit { lane: Lane::Retry, .. }));
    let out = h.send(Input::Retry(RequestId(1)));
    assert_eq!(rejected(&out), vec![(1, RejectReason::RetriesExhausted)]);
    assert_eq!(admitted_to(&out), vec![(3, 0)]);
}

#[test]
fn retry_prefers_a_backend_other_than_the_failed_one() {
    let mut p = params();
    p.backends = 2;
    p.inflight_per_backend = 2;
    let mut h = Harness::new(p);
    assert_eq!(admitted_to(&h.arrive(1, None)), vec![(1, 0)]);
    assert_eq!(admitted_to(&h.send(Input::Retry(RequestId(1)))), vec![(1, 1)]);
}

#[test]
fn repeated_failures_eject_until_a_later_health_check_passes() {
    let mut p = params();
    p.backends = 2;
    p.inflight_per_backend = 8;
    p.eject_after_failures = 2;
    p.max_retries = 5;
    p.routing = Routing::RoundRobin;
    let mut h = Harness::new(p);
    h.at(10);
    assert_eq!(admitted_to(&h.arrive(1, None)), vec![(1, 0)]);
    assert_eq!(admitted_to(&h.arrive(2, None)), vec![(2, 1)]);
    h.send(Input::Retry(RequestId(1))); // re-admitted on 1
    assert_eq!(admitted_to(&h.arrive(3, None)), vec![(3, 0)]);
    h.send(Input::Retry(RequestId(3))); // second failure on 0: ejected
    assert!(!h.s.backend_usable(0));
    assert_eq!(h.s.stats().ejections, 1);
    assert_eq!(admitted_to(&h.arrive(4, None)), vec![(4, 1)]);
    assert_eq!(admitted_to(&h.arrive(5, None)), vec![(5, 1)], "ejected backend gets nothing");
    // A snapshot taken before the ejection does not bring it back; a later one does.
    h.at(20).send(Input::Snapshot { backend: 0, snapshot: Snapshot::new(true, Some(0), 5) });
    assert!(!h.s.backend_usable(0));
    h.at(30).snapshot(0, true, Some(0));
    assert!(h.s.backend_usable(0));
}

#[test]
fn unhealthy_backend_is_not_eligible() {
    let mut p = params();
    p.backends = 2;
    p.inflight_per_backend = 4;
    let mut h = Harness::new(p);
    h.snapshot(0, false, None);
    for id in 1..4 {
        assert_eq!(admitted_to(&h.arrive(id, None)), vec![(id, 1)]);
    }
}

#[test]
fn fifo_has_no_boost_lane() {
    let mut p = params();
    p.boost = false;
    let mut h = Harness::new(p);
    h.at(1).serve(1, A);
    let blocker = block(&mut h, 2);
    h.arrive(3, None);
    h.arrive(4, Some(A));
    assert_eq!(h.s.depth(Lane::Boosted), 0);
    assert_eq!(drain(&mut h, blocker), vec![3, 4], "FIFO: the follow-up waits its turn");
}

#[test]
fn fifo_follow_up_goes_home_when_eligible() {
    let mut p = params();
    p.boost = false;
    p.backends = 2;
    p.inflight_per_backend = 2;
    let mut h = Harness::new(p);
    h.arrive(1, None);
    h.arrive(2, Some(A));
    h.complete(2); // A's home is backend 1
    let out = h.arrive(3, Some(A));
    assert!(matches!(out[0], Output::Admit { backend: 1, affinity: true, lane: Lane::Normal, .. }));
}

#[test]
fn client_gone_after_admission_releases_the_slot() {
    let mut h = Harness::new(params());
    block(&mut h, 1);
    h.arrive(2, None);
    assert_eq!(admitted(&h.send(Input::Cancel(RequestId(1)))), vec![2]);
    assert_eq!(h.s.stats().cancelled, 0, "a cancel after admission is a release, not a cancel");
}

#[test]
fn stale_events_change_nothing() {
    let mut h = Harness::new(params());
    block(&mut h, 1);
    h.arrive(2, None);
    for input in [
        Input::Complete { id: RequestId(2), success: true, usage: Usage::NONE },
        Input::FirstByte(RequestId(2)),
        Input::Retry(RequestId(9)),
        Input::Cancel(RequestId(9)),
        // A backend a reload adds, probed before the reconfiguration reaches the scheduler.
        Input::Snapshot {
            backend: h.s.params().backends,
            snapshot: Snapshot::new(true, Some(0), 0),
        },
    ] {
        assert!(h.send(input).is_empty());
    }
    assert_eq!(h.s.stats().stale_events, 5);
    assert_eq!(h.s.queued(), 1);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2048, ..ProptestConfig::default() })]

    /// The scheduler against the naive reference model, output by output.
    #[test]
    fn matches_reference_model(data in proptest::collection::vec(any::<u8>(), 0..3000)) {
        harness::run(&data);
    }
}

#[test]
fn memory_per_queued_request_and_per_session() {
    // The default configuration's shape: 65,536 queued, 2 backends of 256 slots, 4,096 sessions.
    let mut p = params();
    p.max_queued = 65_536;
    p.backends = 2;
    p.inflight_per_backend = 256;
    p.max_sessions = 4_096;
    p.queue_timeout = Some(30_000 * MS);
    let total = Scheduler::new(p.clone(), 0).heap_bytes();
    p.max_sessions = 1;
    let without_tracker = Scheduler::new(p, 0).heap_bytes();
    let per_request = without_tracker as f64 / 65_536.0;
    let per_session = (total - without_tracker) as f64 / 4_095.0;
    println!(
        "scheduler bytes per queued request {per_request:.1}, per tracked session {per_session:.1}"
    );
    assert!(per_request <= 160.0, "{per_request:.1} bytes per queued request");
    assert!(per_session <= 64.0, "{per_session:.1} bytes per tracked session");
}

// ---------------------------------------------------------------------------------------------
// Live reconfiguration.

impl Harness {
    fn reconfigure(&mut self, params: Params, live: &[bool]) -> Vec<Output> {
        self.out.clear();
        self.s.reconfigure(self.now, params, live, &mut self.out);
        self.s.check_invariants();
        self.out.clone()
    }
}

#[test]
fn an_added_backend_takes_queued_requests_at_once() {
    let mut h = Harness::new(params());
    block(&mut h, 1);
    h.arrive(2, None);
    h.arrive(3, Some(A));
    assert_eq!(h.s.queued(), 2);
    let grown = Params { backends: 2, ..params() };
    assert_eq!(admitted_to(&h.reconfigure(grown, &[true, true])), vec![(2, 1)]);
    assert_eq!(admitted_to(&h.complete(1)), vec![(3, 0)]);
}

/// Requests admitted under a higher `inflight_per_backend` stay admitted when a reload lowers
/// it; the arena must still hold a full queue beside them, also when the same reload raises
/// `max_queued` (found by the `scheduler_model` fuzz target once it reconfigured: the arena
/// was sized for the new caps only, and the next arrival found it exhausted).
#[test]
fn a_full_queue_fits_beside_requests_admitted_over_a_lowered_cap() {
    let wide = Params { max_queued: 1, inflight_per_backend: 3, ..params() };
    let mut h = Harness::new(wide);
    for id in 1..=3 {
        block(&mut h, id);
    }
    h.arrive(4, None);
    assert_eq!(h.s.queued(), 1);
    let narrow = Params { max_queued: 3, inflight_per_backend: 1, ..params() };
    assert!(h.reconfigure(narrow, &[true]).is_empty());
    for id in 5..=6 {
        assert!(h.arrive(id, None).is_empty(), "queued behind the three admitted");
    }
    assert_eq!(h.s.queued(), 3);
    assert_eq!(rejected(&h.arrive(7, None)), vec![(7, RejectReason::QueueFull)]);
    for id in 1..=2 {
        assert!(admitted(&h.complete(id)).is_empty(), "still over the lowered cap");
    }
    assert_eq!(admitted(&h.complete(3)), vec![4]);
}

#[test]
fn a_removed_backend_finishes_its_requests_and_gets_no_new_ones() {
    let two = Params { backends: 2, ..params() };
    let mut h = Harness::new(two.clone());
    assert_eq!(admitted_to(&h.arrive(1, None)), vec![(1, 0)]);
    assert_eq!(admitted_to(&h.arrive(2, None)), vec![(2, 1)]);
    assert!(h.reconfigure(two.clone(), &[true, false]).is_empty());
    assert!(h.s.backend_removed(1));
    h.arrive(3, None);
    assert!(admitted(&h.complete(2)).is_empty(), "nothing goes to the removed backend");
    assert_eq!(h.s.backend_inflight(1), 0, "its in-flight request released its slot");
    assert_eq!(admitted_to(&h.complete(1)), vec![(3, 0)]);
    // Configured again: it takes requests again.
    h.arrive(4, None);
    assert_eq!(admitted_to(&h.reconfigure(two, &[true, true])), vec![(4, 1)]);
}

#[test]
fn a_new_queue_timeout_applies_to_queued_requests_from_their_enqueue() {
    let timed = |ms: Tick| Params { queue_timeout: Some(ms * MS), ..params() };
    let mut h = Harness::new(timed(100));
    block(&mut h, 1);
    h.at(0).arrive(2, None);
    h.at(20 * MS).arrive(3, None);
    h.at(30 * MS);
    assert!(h.reconfigure(timed(50), &[true]).is_empty());
    assert_eq!(rejected(&h.at(50 * MS).send(Input::Tick)), vec![(2, RejectReason::QueueTimeout)]);
    assert!(rejected(&h.at(69 * MS).send(Input::Tick)).is_empty());
    assert_eq!(rejected(&h.at(70 * MS).send(Input::Tick)), vec![(3, RejectReason::QueueTimeout)]);

    // Off, then on again: armed from the reconfiguration.
    h.at(80 * MS).arrive(4, None);
    assert!(h.reconfigure(params(), &[true]).is_empty());
    assert!(rejected(&h.at(500 * MS).send(Input::Tick)).is_empty());
    assert!(h.reconfigure(timed(10), &[true]).is_empty());
    assert_eq!(rejected(&h.at(510 * MS).send(Input::Tick)), vec![(4, RejectReason::QueueTimeout)]);
}

#[test]
fn raised_limits_grow_the_queue_and_lowered_ones_apply_to_new_arrivals() {
    let small = Params { max_queued: 2, ..params() };
    let mut h = Harness::new(small.clone());
    block(&mut h, 1);
    h.arrive(2, None);
    h.arrive(3, None);
    assert_eq!(rejected(&h.arrive(4, None)), vec![(4, RejectReason::QueueFull)]);
    let big = Params { max_queued: 4, inflight_per_backend: 2, ..params() };
    assert_eq!(admitted(&h.reconfigure(big, &[true])), vec![2], "a second slot");
    h.arrive(5, None);
    h.arrive(6, None);
    h.arrive(7, None);
    assert_eq!(h.s.queued(), 4);
    // Lowered under what is queued and in flight: nothing is dropped, nothing new admitted.
    assert!(h.reconfigure(small, &[true]).is_empty());
    assert_eq!(rejected(&h.arrive(8, None)), vec![(8, RejectReason::QueueFull)]);
    assert!(admitted(&h.complete(1)).is_empty(), "inflight 1 is at the lowered cap");
    assert_eq!(admitted(&h.complete(2)), vec![3]);
}

/// `warmpath_sessions_active`: a session counts once however many of its requests are live,
/// and a grown arena holds as many sessions as it holds requests.
#[test]
fn sessions_active_counts_live_sessions_in_a_grown_queue() {
    let mut h = Harness::new(Params { max_queued: 2, ..params() });
    h.arrive(1, Some(7));
    h.arrive(2, Some(7));
    h.arrive(3, None);
    assert_eq!(h.s.sessions_active(), 1, "two requests of one session, one without");
    let big = Params { max_queued: 8, inflight_per_backend: 2, ..params() };
    assert_eq!(admitted(&h.reconfigure(big, &[true])), vec![2]);
    h.complete(1);
    h.complete(2);
    h.complete(3);
    assert_eq!(h.s.sessions_active(), 0);
    // The arena is now 8 queued + 2 slots: every slot a session of its own.
    for id in 10..20 {
        h.arrive(id, Some(id));
    }
    assert_eq!((h.s.sessions_active(), h.s.queued()), (10, 8));
    h.complete(10);
    assert_eq!(h.s.sessions_active(), 9);
}

/// `oldest_waiting` merges the lanes by arrival and stops at its bound.
#[test]
fn oldest_waiting_lists_the_longest_waiting_across_lanes() {
    let mut h = Harness::new(params());
    h.at(MS).arrive(1, Some(7));
    h.at(2 * MS).complete(1);
    h.at(3 * MS).arrive(2, None); // admitted: the one slot
    h.at(4 * MS).arrive(3, None);
    h.at(5 * MS).arrive(4, Some(7));
    h.at(6 * MS).arrive(5, None);
    h.at(7 * MS).arrive(6, Some(7));
    let mut out = Vec::new();
    h.s.oldest_waiting(3, &mut out);
    let seen: Vec<(u64, Lane, Tick, bool)> =
        out.iter().map(|w| (w.id.0, w.lane, w.arrived_at, w.has_session)).collect();
    assert_eq!(
        seen,
        [
            (3, Lane::Normal, 4 * MS, false),
            (4, Lane::Boosted, 5 * MS, true),
            (5, Lane::Normal, 6 * MS, false),
        ]
    );
    h.s.oldest_waiting(10, &mut out);
    assert_eq!(out.iter().map(|w| w.id.0).collect::<Vec<_>>(), [3, 4, 5, 6]);
    assert_eq!(out[0].arrived_at, h.s.oldest_arrival().unwrap());
}
