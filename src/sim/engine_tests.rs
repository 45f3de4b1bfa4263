//! Tests of the engine core, step by step on simulated nanoseconds.

use super::*;

fn params() -> EngineParams {
    EngineParams {
        block_size: 4,
        kv_blocks: 64,
        max_num_seqs: 8,
        max_num_batched_tokens: 64,
        max_model_len: 1024,
        step_base_ns: 1_000,
        prefill_token_cost_ns: 10,
        decode_seq_cost_ns: 100,
    }
}

/// Prompt tokens `base..base + len`.
fn prompt(base: u32, len: u32) -> Vec<u32> {
    (base..base + len).collect()
}

/// Runs steps until the engine is idle; returns the events, the plans and the end time.
fn run(engine: &mut Engine, mut now: u64) -> (Vec<Event>, Vec<StepPlan>, u64) {
    let (mut events, mut plans) = (Vec::new(), Vec::new());
    while let Some(plan) = engine.start_step(now) {
        engine.check_invariants();
        now += plan.duration_ns;
        engine.finish_step(now, &mut events);
        engine.check_invariants();
        plans.push(plan);
        assert!(plans.len() < 10_000, "the engine does not converge");
    }
    (events, plans, now)
}

fn finished(events: &[Event], id: RequestId) -> Usage {
    events
        .iter()
        .find_map(|e| match e {
            Event::Finished { id: i, usage } if *i == id => Some(*usage),
            _ => None,
        })
        .unwrap_or_else(|| panic!("request {id} did not finish"))
}

fn tokens_of(events: &[Event], id: RequestId) -> Vec<u16> {
    let words = events.iter().filter_map(|e| match e {
        Event::Token { id: i, word, .. } if *i == id => Some(*word),
        _ => None,
    });
    words.collect()
}

#[test]
fn a_shared_prefix_of_full_blocks_is_a_cache_hit() {
    let mut engine = Engine::new(params(), 1);
    engine.submit(1, prompt(0, 22), 3, 0).unwrap();
    let (events, _, now) = run(&mut engine, 0);
    assert_eq!(finished(&events, 1).cached_tokens, 0);
    assert_eq!(engine.stats().prefix_hits, 0);
    // 13 shared tokens: three full blocks of 4 are reusable, the fourth differs.
    let mut second = prompt(0, 13);
    second.extend(prompt(500, 9));
    engine.submit(2, second, 3, now).unwrap();
    let plan = engine.start_step(now).expect("work");
    assert_eq!(plan.prefill_tokens, 22 - 12, "only the uncached suffix is prefilled");
    let mut events = Vec::new();
    engine.finish_step(now + plan.duration_ns, &mut events);
    let (rest, _, _) = run(&mut engine, now + plan.duration_ns);
    events.extend(rest);
    assert_eq!(
        finished(&events, 2),
        Usage { prompt_tokens: 22, completion_tokens: 3, cached_tokens: 12 }
    );
    assert_eq!(engine.stats().prefix_queries, 44);
    assert_eq!(engine.stats().prefix_hits, 12);
}

#[test]
fn a_follow_up_turn_hits_the_previous_answer_too() {
    let mut engine = Engine::new(params(), 1);
    engine.submit(1, prompt(0, 10), 8, 0).unwrap();
    let (events, _, now) = run(&mut engine, 0);
    // The next turn repeats the prompt and the answer, then adds a question.
    let mut next = prompt(0, 10);
    next.extend(tokens_of(&events, 1).iter().map(|&w| engine.vocab_ids[usize::from(w)]));
    next.extend(prompt(900, 6));
    engine.submit(2, next, 1, now).unwrap();
    let (events, _, _) = run(&mut engine, now);
    // Blocks hold prompt + answer = 18 tokens of which the 17 computed: 4 full blocks.
    assert_eq!(finished(&events, 2).cached_tokens, 16);
}

#[test]
fn a_whole_cached_prompt_still_computes_its_last_token() {
    let mut engine = Engine::new(params(), 1);
    engine.submit(1, prompt(0, 16), 1, 0).unwrap();
    let (_, _, now) = run(&mut engine, 0);
    engine.submit(2, prompt(0, 16), 1, now).unwrap();
    let plan = engine.start_step(now).expect("work");
    assert_eq!(plan.prefill_tokens, 4, "the last block is recomputed, as in vLLM");
}

#[test]
fn cached_blocks_are_evicted_least_recently_used_under_pressure() {
    let p = EngineParams { kv_blocks: 12, ..params() };
    let mut engine = Engine::new(p, 1);
    engine.submit(1, prompt(0, 16), 1, 0).unwrap();
    let (_, _, now) = run(&mut engine, 0);
    engine.submit(2, prompt(100, 16), 1, now).unwrap();
    let (_, _, now) = run(&mut engine, now);
    assert_eq!(engine.free_blocks(), 12, "finished requests hold nothing");
    // 7 new blocks: the 4 never used go first, then 3 of the least recent request (1).
    engine.submit(3, prompt(200, 27), 1, now).unwrap();
    let (_, _, now) = run(&mut engine, now);
    engine.submit(4, prompt(100, 16), 1, now).unwrap();
    engine.submit(5, prompt(0, 16), 1, now).unwrap();
    let (events, _, _) = run(&mut engine, now);
    assert_eq!(finished(&events, 4).cached_tokens, 12, "request 2's prefix survived");
    assert_eq!(finished(&events, 5).cached_tokens, 0, "request 1's first block was evicted");
}

#[test]
fn blocks_in_use_are_never_evicted_and_a_request_that_does_not_fit_waits() {
    let p = EngineParams { kv_blocks: 10, ..params() };
    let mut engine = Engine::new(p, 1);
    engine.submit(1, prompt(0, 24), 8, 0).unwrap();
    let plan = engine.start_step(0).expect("work");
    let mut events = Vec::new();
    engine.finish_step(plan.duration_ns, &mut events);
    // Request 1 holds 7 blocks (25 tokens with its first output); 2 needs 6 of the 3 free.
    engine.submit(2, prompt(100, 24), 1, plan.duration_ns).unwrap();
    let plan2 = engine.start_step(plan.duration_ns).expect("work");
    assert_eq!((plan2.decode_seqs, plan2.prefill_tokens), (1, 0));
    assert_eq!((engine.running(), engine.waiting()), (1, 1));
    engine.finish_step(plan.duration_ns + plan2.duration_ns, &mut events);
    let (rest, _, _) = run(&mut engine, plan.duration_ns + plan2.duration_ns);
    events.extend(rest);
    assert_eq!(tokens_of(&events, 1).len(), 8);
    assert_eq!(tokens_of(&events, 2).len(), 1);
    assert_eq!(engine.stats().preemptions, 0);
}

#[test]
fn max_num_seqs_leaves_the_rest_waiting() {
    let p = EngineParams { max_num_seqs: 2, ..params() };
    let mut engine = Engine::new(p, 1);
    for id in 0..5 {
        engine.submit(id, prompt(id as u32 * 100, 8), 4, 0).unwrap();
    }
    let plan = engine.start_step(0).expect("work");
    assert_eq!(plan.prefill_tokens, 16);
    assert_eq!((engine.running(), engine.waiting()), (2, 3));
    let mut events = Vec::new();
    engine.finish_step(plan.duration_ns, &mut events);
    let (rest, _, _) = run(&mut engine, plan.duration_ns);
    events.extend(rest);
    let order: Vec<RequestId> = events
        .iter()
        .filter_map(|e| match e {
            Event::Finished { id, .. } => Some(*id),
            _ => None,
        })
        .collect();
    assert_eq!(order, [0, 1, 2, 3, 4], "first come, first served");
}

#[test]
fn chunked_prefill_respects_the_token_budget() {
    let p = EngineParams { max_num_batched_tokens: 32, ..params() };
    let mut engine = Engine::new(p, 1);
    engine.submit(1, prompt(0, 8), 50, 0).unwrap();
    let plan = engine.start_step(0).expect("work");
    let mut now = plan.duration_ns;
    engine.finish_step(now, &mut Vec::new());
    engine.submit(2, prompt(100, 100), 1, now).unwrap();
    let mut chunks = Vec::new();
    while engine.waiting() > 0 || chunks.len() < 4 {
        let plan = engine.start_step(now).expect("work");
        assert!(plan.prefill_tokens + plan.decode_seqs <= 32);
        chunks.push((plan.decode_seqs, plan.prefill_tokens));
        now += plan.duration_ns;
        engine.finish_step(now, &mut Vec::new());
    }
    // Request 1 decodes (1 token of the budget), request 2 prefills with the other 31.
    assert_eq!(chunks, [(1, 31), (1, 31), (1, 31), (1, 7)]);
}

#[test]
fn step_time_follows_the_model() {
    let mut engine = Engine::new(params(), 1);
    engine.submit(1, prompt(0, 10), 2, 0).unwrap();
    engine.submit(2, prompt(100, 6), 2, 0).unwrap();
    let (_, plans, end) = run(&mut engine, 0);
    let durations: Vec<u64> = plans.iter().map(|p| p.duration_ns).collect();
    // Prefill of 16 tokens, then one decode step of two sequences.
    assert_eq!(durations, [1_000 + 16 * 10, 1_000 + 2 * 100]);
    assert_eq!(end, 2_360);
    // Each second token came one decode step after its first: two inter-token latencies.
    let itl = &engine.stats().itl;
    assert_eq!((itl.count(), itl.sum()), (2, 2.0 * 1_200e-9));
}

#[test]
fn kv_pressure_preempts_the_latest_request_and_everything_still_finishes() {
    let p = EngineParams { kv_blocks: 8, ..params() };
    let mut engine = Engine::new(p, 1);
    engine.submit(1, prompt(0, 8), 20, 0).unwrap();
    engine.submit(2, prompt(100, 8), 20, 0).unwrap();
    let (events, _, _) = run(&mut engine, 0);
    assert!(engine.stats().preemptions > 0);
    assert_eq!(tokens_of(&events, 1).len(), 20);
    assert_eq!(tokens_of(&events, 2).len(), 20);
    assert_eq!(engine.free_blocks(), 8);
}

#[test]
fn metrics_move_as_requests_run_and_finish() {
    let mut engine = Engine::new(params(), 1);
    engine.submit(1, prompt(0, 20), 4, 0).unwrap();
    assert_eq!((engine.running(), engine.waiting(), engine.kv_usage()), (0, 1, 0.0));
    let plan = engine.start_step(0).expect("work");
    assert_eq!((engine.running(), engine.waiting()), (1, 0));
    assert_eq!(engine.kv_usage(), 5.0 / 64.0);
    engine.finish_step(plan.duration_ns, &mut Vec::new());
    assert_eq!(engine.stats().ttft.count(), 1);
    assert_eq!(engine.stats().ttft.sum(), plan.duration_ns as f64 / 1e9);
    assert_eq!(engine.stats().e2e.count(), 0);
    let (_, _, end) = run(&mut engine, plan.duration_ns);
    assert_eq!((engine.running(), engine.kv_usage()), (0, 0.0));
    let s = engine.stats();
    assert_eq!((s.e2e.count(), s.finished, s.generation_tokens, s.prompt_tokens), (1, 1, 4, 20));
    // Busy from 0 to `end` without a gap; the prompt computed once, no cache hit.
    assert_eq!((s.busy_ns, s.prefill_tokens), (end, 20));
    let mut text = String::new();
    crate::sim::metrics::render(&engine, "m", 2 * end, &mut text);
    let busy =
        format!("warmpath_sim_busy_seconds_total{{model_name=\"m\"}} {:?}", end as f64 / 1e9);
    let time =
        format!("warmpath_sim_time_seconds_total{{model_name=\"m\"}} {:?}", 2.0 * end as f64 / 1e9);
    assert!(text.contains(&busy) && text.contains(&time), "{busy} / {time} missing from\n{text}");
    for line in [
        "vllm:num_requests_running{model_name=\"m\"} 0.0",
        "vllm:prefix_cache_queries_total{model_name=\"m\"} 20.0",
        "vllm:time_to_first_token_seconds_count{model_name=\"m\"} 1",
        "vllm:inter_token_latency_seconds_count{model_name=\"m\"} 3",
        "vllm:e2e_request_latency_seconds_bucket{model_name=\"m\",le=\"+Inf\"} 1",
    ] {
        assert!(text.contains(line), "{line} missing from\n{text}");
    }
}

#[test]
fn aborting_releases_blocks_and_forgets_the_request() {
    let mut engine = Engine::new(params(), 1);
    engine.submit(1, prompt(0, 20), 4, 0).unwrap();
    engine.submit(2, prompt(100, 20), 4, 0).unwrap();
    let plan = engine.start_step(0).expect("work");
    assert!(engine.abort(1));
    assert!(!engine.abort(1));
    let mut events = Vec::new();
    engine.finish_step(plan.duration_ns, &mut events);
    engine.check_invariants();
    let (rest, _, _) = run(&mut engine, plan.duration_ns);
    events.extend(rest);
    assert!(tokens_of(&events, 1).is_empty());
    assert_eq!(tokens_of(&events, 2).len(), 4);
    assert_eq!(engine.free_blocks(), 64);
}

#[test]
fn submissions_are_checked() {
    let mut engine = Engine::new(EngineParams { max_model_len: 30, ..params() }, 1);
    assert_eq!(engine.submit(1, Vec::new(), 1, 0), Err(SubmitError::EmptyPrompt));
    assert_eq!(engine.submit(1, prompt(0, 3), 0, 0), Err(SubmitError::NoOutput));
    assert_eq!(
        engine.submit(1, prompt(0, 25), 6, 0),
        Err(SubmitError::TooLong { tokens: 31, limit: 30 })
    );
    engine.submit(1, prompt(0, 3), 1, 0).unwrap();
    assert_eq!(engine.submit(1, prompt(0, 3), 1, 0), Err(SubmitError::DuplicateId));
}

/// A mixed workload: shared prefixes, staggered arrivals, KV pressure.
fn workload(seed: u64) -> (Vec<Event>, Vec<StepPlan>) {
    let p = EngineParams { kv_blocks: 24, max_num_seqs: 3, max_num_batched_tokens: 20, ..params() };
    let mut engine = Engine::new(p, seed);
    let (mut events, mut plans, mut now) = (Vec::new(), Vec::new(), 0);
    for id in 0..12u64 {
        let mut tokens = prompt(0, 8 + (id as u32 % 3) * 4);
        tokens.extend(prompt(1000 + id as u32 * 10, 5));
        engine.submit(id, tokens, 3 + id as u32 % 5, now).unwrap();
        if let Some(plan) = engine.start_step(now) {
            now += plan.duration_ns;
            engine.finish_step(now, &mut events);
            plans.push(plan);
        }
    }
    let (rest, more, _) = run(&mut engine, now);
    events.extend(rest);
    plans.extend(more);
    (events, plans)
}

#[test]
fn the_same_inputs_and_seed_give_the_same_steps_and_outputs() {
    let (events, plans) = workload(42);
    assert_eq!(workload(42), (events.clone(), plans));
    assert_eq!(events.iter().filter(|e| matches!(e, Event::Finished { .. })).count(), 12);
    let (other, _) = workload(43);
    assert_ne!(tokens_of(&events, 0), tokens_of(&other, 0), "the seed picks the words");
}
