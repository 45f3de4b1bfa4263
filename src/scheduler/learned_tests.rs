//! Tests of what the scheduler learns from its engines' waiting gauges (issue \[8\]): the
//! admission budget, the waiting gauge's reading under it, and the inflight cap.

use super::tests::{admitted, params, Harness};
use super::*;

/// A harness whose backend learns its budget (`auto`), with room for 64 requests in flight.
fn learned_budget() -> Harness {
    let mut p = params();
    p.inflight_per_backend = 64;
    p.prefill_tokens_per_backend = Budget::Auto;
    Harness::new(p)
}

/// The learned budget's value on backend 0.
fn budget(h: &Harness) -> u64 {
    h.s.backend_estimates(0).budget
}

#[test]
fn a_learned_budget_opens_while_the_engine_runs_everything_it_is_sent_and_closes_when_it_queues() {
    use super::estimate::BUDGET_UNLEARNED;
    let mut h = learned_budget();
    // 4,000 estimated tokens each (16,000 bytes at the default rate): four fit the budget.
    for id in 1..=8 {
        h.arrive_with(id, None, 4000, true);
    }
    // Eligible while the backlog is under 16,384: five go, three wait.
    assert_eq!(h.s.backend_prefill_tokens(0), 20_000, "the unlearned budget");
    assert_eq!(h.s.queued(), 3);
    // The engine runs all five (nothing of warmpath's waits in it): a quarter more room.
    h.snapshot(0, true, Some(0));
    assert_eq!(budget(&h), BUDGET_UNLEARNED + BUDGET_UNLEARNED / 4);
    assert_eq!(h.s.queued(), 2, "the new room admitted one more");
    // Three of warmpath's own wait in the engine: they do not gate it (they are its own), but
    // the budget closes by an eighth.
    let before = budget(&h);
    h.at(1).snapshot(0, true, Some(3));
    assert_eq!(budget(&h), before - before / 8);
    assert_eq!(h.s.backend_waiting(0).0, Some(0), "none of the waiting is someone else's");
    // Once nothing is held back the gauge teaches nothing: the budget stays.
    for first in 1..=8 {
        h.send(Input::FirstByte(RequestId(first)));
    }
    assert_eq!(h.s.queued(), 0);
    let held = budget(&h);
    h.at(2).snapshot(0, true, Some(0));
    assert_eq!(budget(&h), held, "nothing queued: nothing learned");
    // A slow engine, running one prefill at a time and queueing the rest of warmpath's
    // requests, closes the budget until two are pending (one running, one waiting: the
    // target); between snapshots it finishes its oldest, which lets the next one in.
    let mut pending = std::collections::VecDeque::new();
    for n in 0..60u64 {
        pending.extend(admitted(&h.arrive_with(100 + n, None, 4000, true)));
    }
    for t in 4..60 {
        let oldest = pending.pop_front().expect("something pending");
        pending.extend(admitted(&h.send(Input::FirstByte(RequestId(oldest)))));
        pending.extend(admitted(&h.complete(oldest)));
        let waiting = (pending.len() as u32).saturating_sub(1);
        pending.extend(admitted(&h.at(t).snapshot(0, true, Some(waiting))));
    }
    assert!(budget(&h) <= 8000 && budget(&h) > 4000, "two requests' worth: {}", budget(&h));
    assert_eq!(pending.len(), 2);
}

#[test]
fn under_a_learned_budget_only_someone_elses_waiting_requests_gate_a_backend() {
    let mut h = learned_budget();
    h.arrive_with(1, None, 100, true);
    // Five waiting, one of them warmpath's: four are someone else's, and they close it.
    h.snapshot(0, true, Some(5));
    assert_eq!(h.s.backend_waiting(0).0, Some(4));
    assert!(h.arrive_with(2, None, 100, true).is_empty(), "someone else's queue gates");
    // The gauge goes: metrics that disappear leave the backend judged without them.
    assert_eq!(admitted(&h.snapshot(0, true, None)), vec![2]);
    assert_eq!(h.s.backend_waiting(0).0, None);
    // With a fixed budget the whole gauge gates, warmpath's own requests included (S6.2).
    let mut p = params();
    p.inflight_per_backend = 64;
    p.prefill_tokens_per_backend = Budget::Tokens(1_000_000);
    let mut h = Harness::new(p);
    h.arrive_with(1, None, 100, true);
    h.snapshot(0, true, Some(1));
    assert!(h.arrive_with(2, None, 100, true).is_empty());
}

/// A non-streaming request gives no first byte before its end, so under a learned budget the
/// engine may be holding it waiting: as many of the waiting requests as warmpath has
/// non-streaming ones there do not gate the backend either. Without this, an engine serving
/// warmpath's own non-streaming requests closed at every scrape that found one waiting, until
/// the next (in the fleet lab, TTFT 1.3-1.7x sglang-router's; perf/RESULTS.md).
#[test]
fn under_a_learned_budget_warmpaths_own_non_streaming_requests_do_not_gate_a_backend() {
    let mut h = learned_budget();
    assert_eq!(admitted(&h.arrive_with(1, None, 100, false)), vec![1]);
    assert_eq!(admitted(&h.arrive_with(2, None, 100, false)), vec![2]);
    // Two waiting, both possibly warmpath's: the backend stays open.
    h.snapshot(0, true, Some(2));
    assert_eq!(h.s.backend_waiting(0).0, Some(0));
    assert_eq!(admitted(&h.arrive_with(3, None, 100, false)), vec![3]);
    // Five waiting with three of warmpath's in flight: two are someone else's, and close it.
    h.snapshot(0, true, Some(5));
    assert_eq!(h.s.backend_waiting(0).0, Some(2));
    assert!(h.arrive_with(4, None, 100, false).is_empty(), "someone else's queue gates");
    // One ends: the next snapshot counts two of warmpath's.
    h.complete(1);
    h.snapshot(0, true, Some(2));
    assert_eq!(admitted(&h.out), vec![4]);
}

/// A KV-starved engine preempts running sequences back into its waiting queue: under a learned
/// budget, as many of warmpath's decoding requests as the engine preempted since the last
/// report may be among the waiting, and do not gate the backend. Without this, an engine short
/// of KV closed to warmpath at every scrape after a preemption (in the fleet lab, RAGPulse on a
/// 24,000-token KV cache: follow-up p50 1.16x sglang-router's, 1.07x with this;
/// perf/RESULTS.md).
/// The requests warmpath sent within the engine's last step wait for its next one whether or
/// not the engine has room, so a learned budget counts as many as it sent per step (at the
/// rate it sent them since the last snapshot, the step being the backend's decode gap) out of
/// the waiting ones before it moves (estimate.rs, "The admission budget"). Without that, an
/// engine of 50 ms steps sent a thousand short prompts a second always had dozens waiting at a
/// scrape: the budget fell to its floor and the engine ran a fifth of what it could (fleet lab,
/// perf/RESULTS.md, twenty-third session).
#[test]
fn a_learned_budget_does_not_close_for_the_requests_sent_within_one_engine_step() {
    use super::decode::GAP_SCALE;
    for (step, closes) in [(0, true), (400, false)] {
        let mut h = learned_budget();
        h.s.learned.decode[0].gap = step * GAP_SCALE;
        h.snapshot(0, true, Some(0));
        // Five of 4,000 estimated tokens fit the unlearned budget; three wait in warmpath.
        for id in 1..=8 {
            h.arrive_with(id, None, 4000, true);
        }
        assert_eq!(h.s.queued(), 3);
        // Three wait in the engine; five were sent in 1,000 ticks, two per step of 400.
        let before = budget(&h);
        h.at(1000).snapshot(0, true, Some(3));
        let after = if closes { before - before / 8 } else { before };
        assert_eq!(budget(&h), after, "step {step}");
    }
}

/// `inflight_per_backend = "auto"` (estimate.rs, "The inflight cap"): a backend's cap grows
/// while it holds requests back and the engine starts all it is sent, shrinks while warmpath's
/// non-streaming requests wait in the engine, never below the configured start; it stays where
/// it is while it holds nothing back, and with nobody's gauge; a fixed cap never moves. (Fleet
/// lab, a thousand one-turn prompts a second into two engines of 50 ms steps and 1,024
/// sequences: TTFT p50 40 s under the fixed 256, 2.3-2.6 s learned with the budget's step
/// allowance, sglang-router's 0.7 s; perf/RESULTS.md, twenty-third session.)
#[test]
fn a_learned_inflight_cap_grows_while_the_engine_starts_everything_and_shrinks_when_it_queues() {
    let mut p = params();
    p.inflight_per_backend = 8;
    p.inflight_learned = true;
    p.prefill_tokens_per_backend = Budget::Auto;
    p.max_queued = 64;
    let mut h = Harness::new(p.clone());
    let cap = |h: &Harness| h.s.backend_estimates(0).inflight_cap;
    // Non-streaming requests: no prefill budget bounds them, only the cap.
    for id in 1..=20 {
        h.arrive_with(id, None, 100, false);
    }
    assert_eq!((h.s.backend_inflight(0), cap(&h)), (8, 8));
    // Nothing waits in the engine: it started all eight. A quarter more, and two admitted.
    h.snapshot(0, true, Some(0));
    assert_eq!((cap(&h), h.s.backend_inflight(0)), (10, 10));
    h.at(1);
    h.snapshot(0, true, Some(0));
    assert_eq!((cap(&h), h.s.backend_inflight(0)), (13, 13));
    // One of warmpath's waiting is the target: still room to grow.
    h.at(3);
    h.snapshot(0, true, Some(1));
    assert_eq!(cap(&h), 17);
    // Three of warmpath's wait: the engine runs all it can; an eighth less, down to the start.
    for (at, want) in [(4, 15), (5, 14), (6, 13), (7, 12), (8, 11), (9, 10), (10, 9), (11, 8)] {
        h.at(at);
        h.snapshot(0, true, Some(3));
        assert_eq!(cap(&h), want);
    }
    h.at(12);
    h.snapshot(0, true, Some(3));
    assert_eq!(cap(&h), 8, "never below the configured start");
    // A report without the gauge moves nothing.
    h.at(13);
    h.snapshot(0, true, None);
    assert_eq!(cap(&h), 8);
    // Nothing queued: the cap held nothing back, and stays.
    let mut h = Harness::new(p.clone());
    for id in 1..=8 {
        h.arrive_with(id, None, 100, false);
    }
    h.snapshot(0, true, Some(0));
    assert_eq!(cap(&h), 8);
    // A fixed cap never moves.
    p.inflight_learned = false;
    let mut h = Harness::new(p);
    for id in 1..=20 {
        h.arrive_with(id, None, 100, false);
    }
    h.snapshot(0, true, Some(0));
    assert_eq!((cap(&h), h.s.backend_inflight(0)), (8, 8));
}

#[test]
fn under_a_learned_budget_warmpaths_preempted_decodes_do_not_gate_a_backend() {
    let mut h = learned_budget();
    let preemptions = |h: &mut Harness, waiting: u32, counter: u64, new_engine: bool| {
        let mut snapshot = Snapshot::new(true, Some(waiting), h.now);
        snapshot.cache = EngineCache { preemptions: counter, ..EngineCache::UNKNOWN };
        snapshot.new_engine = new_engine;
        h.send(Input::Snapshot { backend: 0, snapshot })
    };
    // Three streaming requests past their first byte: decoding.
    for id in 1..=3 {
        assert_eq!(admitted(&h.arrive_with(id, None, 100, true)), vec![id]);
        h.send(Input::FirstByte(RequestId(id)));
    }
    // The first report with the counter sets its baseline: nothing preempted since.
    preemptions(&mut h, 0, 40, false);
    // Two preempted since: two waiting are possibly warmpath's decodes, the backend stays open.
    h.at(1);
    preemptions(&mut h, 2, 42, false);
    assert_eq!(h.s.backend_waiting(0).0, Some(0));
    assert_eq!(admitted(&h.arrive_with(4, None, 100, true)), vec![4]);
    // Five waiting, one of them warmpath's pending request, two preempted since: the other two
    // are someone else's and close it.
    h.at(2);
    preemptions(&mut h, 5, 44, false);
    assert_eq!(h.s.backend_waiting(0).0, Some(2));
    assert!(h.arrive_with(5, None, 100, true).is_empty(), "someone else's queue gates");
    // Nothing preempted since the last report: the same gauge is someone else's queue, but
    // the one pending request.
    h.at(3);
    preemptions(&mut h, 3, 44, false);
    assert_eq!(h.s.backend_waiting(0).0, Some(2));
    // No more preempted than warmpath has decoding there (3; its pending one is counted apart).
    h.at(4);
    preemptions(&mut h, 9, 60, false);
    assert_eq!(h.s.backend_waiting(0).0, Some(5));
    // A new engine's counter counts from its start (this opens the backend to request 5,
    // which is then pending too), and so does one that went down.
    h.at(5);
    preemptions(&mut h, 3, 2, true);
    assert_eq!(h.s.backend_waiting(0).0, Some(0));
    assert_eq!(admitted(&h.out), vec![5]);
    h.at(6);
    preemptions(&mut h, 3, 1, false);
    assert_eq!(h.s.backend_waiting(0).0, Some(0));
    // A report without the counter excuses none and keeps the baseline.
    h.at(7);
    h.snapshot(0, true, Some(3));
    assert_eq!(h.s.backend_waiting(0).0, Some(1));
    h.at(8);
    preemptions(&mut h, 3, 2, false);
    assert_eq!(h.s.backend_waiting(0).0, Some(0));
    // With a fixed budget the whole gauge gates (S6.2).
    let mut p = params();
    p.inflight_per_backend = 64;
    p.prefill_tokens_per_backend = Budget::Tokens(1_000_000);
    let mut h = Harness::new(p);
    h.arrive_with(1, None, 100, true);
    h.send(Input::FirstByte(RequestId(1)));
    preemptions(&mut h, 0, 0, false);
    preemptions(&mut h, 1, 1, false);
    assert!(h.arrive_with(2, None, 100, true).is_empty());
}
