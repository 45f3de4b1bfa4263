//! Differential tests against the reference on scripts: what random inputs seldom reach (a
//! learned prefill rate needs eight clean first bytes in one window on one backend), and the
//! fuzzer's finds worth keeping.

use super::tests::params;
use super::*;

/// The arrival of streaming request `id` without a session, a prompt of 4,096 bytes whose 16
/// blocks are its own (`id * 100` on), for the scripted reference tests.
fn sixteen_block_prompt(id: u64) -> (Input, Vec<u64>) {
    let arrival = Arrival {
        id: RequestId(id),
        session: None,
        prompt_bytes: 4096,
        streaming: true,
        prompt: crate::ring::prompt_pool::NO_PROMPT,
        tenant: 0,
    };
    (Input::Arrive(arrival), (id * 100..id * 100 + 16).collect())
}

/// S16's cost counts what is left of a backend's prefill backlog at its learned rate, which the
/// random inputs above seldom reach (a rate needs eight first bytes in a window on one
/// backend): a script, against the reference. Thirty prompts at tick 0 and their first bytes
/// one every 1,000 ticks teach both backends a rate (about half a token a tick); then backend 1
/// takes a prompt at 100,000 and backend 0 one at 103,000 (after one it had ended), and a
/// prompt at 104,000 goes to backend 1, whose engine began on its backlog earlier (counted
/// whole, the backlogs tie and the tie goes to backend 0). Then the same with a request that
/// leaves without a first byte (a cancel): the engine is taken to begin on what is left then.
#[test]
fn matches_reference_model_on_what_is_left_of_a_backlog() {
    let params =
        Params { routing: Routing::PrefixCost, backends: 2, inflight_per_backend: 64, ..params() };
    let arrive = sixteen_block_prompt;
    let done = |id: u64| Input::Complete { id: RequestId(id), success: true, usage: Usage::NONE };
    let first_byte = |id: u64| (Input::FirstByte(RequestId(id)), Vec::new());
    let mut script = Vec::new();
    for id in 1..=30 {
        let (input, blocks) = arrive(id);
        script.push((0, input, blocks));
    }
    for id in 1..=30 {
        let (input, blocks) = first_byte(id);
        script.push((id * 1000, input, blocks));
        script.push((id * 1000, done(id), Vec::new()));
    }
    // Backend 0's earlier prefill ends with its first byte; backend 1's began at 100,000.
    let round = [
        (100_000, arrive(100)),
        (100_000, arrive(101)),
        (101_000, first_byte(100)),
        (101_000, (done(100), Vec::new())),
        (103_000, arrive(102)),
        (104_000, arrive(103)),
    ];
    script.extend(round.into_iter().map(|(at, (input, blocks))| (at, input, blocks)));
    // Backend 0 takes two prefills, the first of which is cancelled: its engine is taken to
    // begin on the other then, 200 ticks after backend 1 began on its own.
    let round = [
        (200_000, arrive(110)),
        (200_000, arrive(111)),
        (200_100, arrive(112)),
        (200_200, (Input::Cancel(RequestId(110)), Vec::new())),
        (201_000, arrive(113)),
    ];
    script.extend(round.into_iter().map(|(at, (input, blocks))| (at, input, blocks)));
    for (at, ids) in [(150_000, [101, 102, 103]), (250_000, [111, 112, 113])] {
        for id in ids {
            script.push((at, first_byte(id).0, Vec::new()));
            script.push((at, done(id), Vec::new()));
        }
    }
    script.sort_by_key(|step| step.0);
    let outputs = harness::run_script(&params, &script);
    let went = |id: u64| {
        outputs.iter().find_map(|o| match *o {
            Output::Admit { id: admitted, backend, .. } if admitted.0 == id => Some(backend),
            _ => None,
        })
    };
    for id in [100, 110] {
        let placed = [went(id), went(id + 1), went(id + 2), went(id + 3)];
        assert_eq!(placed, [Some(0), Some(1), Some(0), Some(1)], "round of {id}");
    }
}

/// A backend that has closed no rate window is compared with the fastest by the requests each
/// served alone (`estimate::Learned::drain_rate`), in the reference as in the scheduler. Twenty
/// prompts at tick 0 split between the backends; backend 0's first bytes come every 1,000 ticks
/// (a window closes), backend 1's requests are cancelled. Then request 50 is alone on backend 0
/// (first byte after 500 ticks, and it stays, decoding), 51 alone on backend 1 (after 4,000
/// ticks): backend 1 is taken to be an eighth as fast as backend 0, and prompt 52 goes to
/// backend 0 despite the sequence decoding there. Taken to be as fast, backend 1 would get it.
#[test]
fn matches_reference_model_on_a_backend_known_only_by_requests_served_alone() {
    let params =
        Params { routing: Routing::PrefixCost, backends: 2, inflight_per_backend: 64, ..params() };
    let arrive = |at: Tick, id: u64| {
        let (input, blocks) = sixteen_block_prompt(id);
        (at, input, blocks)
    };
    let step = |at: Tick, input: Input| (at, input, Vec::new());
    let first_byte = |at: Tick, id: u64| step(at, Input::FirstByte(RequestId(id)));
    let done = |id: u64| Input::Complete { id: RequestId(id), success: true, usage: Usage::NONE };
    let mut script: Vec<_> = (1..=20).map(|id| arrive(0, id)).collect();
    let went = |outputs: &[Output], id: u64| {
        outputs.iter().find_map(|o| match *o {
            Output::Admit { id: admitted, backend, .. } if admitted.0 == id => Some(backend),
            _ => None,
        })
    };
    let split = harness::run_script(&params, &script);
    let mut served = 0;
    for id in 1..=20 {
        if went(&split, id) == Some(0) {
            served += 1;
            script.push(first_byte(served * 1000, id));
            script.push(step(served * 1000, done(id)));
        } else {
            script.push(step(1, Input::Cancel(RequestId(id))));
        }
    }
    assert!(served > u64::from(crate::scheduler::estimate::WINDOW_EVENTS), "{served} on 0");
    // Both engines' inter-token counters teach the same decode gap: none is left to explore.
    for (at, itl) in [(90_000, (0, 0)), (95_000, (1600, 16))] {
        for backend in 0..2 {
            let mut snapshot = Snapshot::new(true, None, at);
            snapshot.cache.itl_ticks = itl.0;
            snapshot.cache.itl_count = itl.1;
            script.push(step(at, Input::Snapshot { backend, snapshot }));
        }
    }
    script.extend([
        arrive(100_000, 50),
        first_byte(100_500, 50),
        arrive(110_000, 51),
        first_byte(114_000, 51),
        step(114_000, done(51)),
        arrive(120_000, 52),
    ]);
    script.sort_by_key(|step| step.0);
    let outputs = harness::run_script(&params, &script);
    assert_eq!([went(&outputs, 50), went(&outputs, 51)], [Some(0), Some(1)]);
    assert_eq!(went(&outputs, 52), Some(0));
}

/// A non-streaming request's cost counts its expected output at its backend's decode gap beyond
/// the tolerance above the least (`decode::Decode`), in the reference as in the scheduler.
/// Thirty streaming prompts teach both backends a prefill rate, as above, and each response
/// decodes 100 tokens after its first, at 10 ticks a token on backend 0 and 100 on backend 1
/// (a window or more on each); a non-streaming response of 200 tokens sets the expected
/// output. Then a streaming prompt goes to backend 0 (both idle: the lower index), and a
/// non-streaming prompt goes there too, behind its prefill, since decoding its 200 tokens on
/// backend 1 would take 16,000 ticks longer than the tolerance allows; a streaming prompt
/// after it goes to backend 1, whose decode its client does not wait for (its first token's
/// steps, 90 ticks longer each than backend 0's, count for less than the two prefills on
/// backend 0). At 30 ticks a token on backend 1, of which only the 10 beyond twice the least
/// count (2,000 ticks for 200 tokens; the 20 beyond the least, 4,000, would tip it), the
/// non-streaming prompt goes to backend 1. When backend 1's responses teach no gap (no output
/// tokens), its decode counts nothing, and the prompt goes to backend 1.
#[test]
fn matches_reference_model_on_a_backend_that_decodes_slower() {
    let tail = || {
        vec![
            arrive_as(120_000, 102, false),
            done_with(130_000, 102, 200),
            arrive_as(140_000, 103, true),
            arrive_as(140_000, 104, false),
            arrive_as(140_000, 105, true),
        ]
    };
    let outputs = slower_decode_script(Some(100), tail());
    assert_eq!(went(&outputs, 103), Some(0), "both idle: the lower index");
    assert_eq!(went(&outputs, 104), Some(0), "a whole response waits for its decode");
    assert_eq!(went(&outputs, 105), Some(1), "a stream's client waits for its first token");
    let outputs = slower_decode_script(Some(30), tail());
    assert_eq!([went(&outputs, 103), went(&outputs, 104)], [Some(0), Some(1)], "tolerated");
    let outputs = slower_decode_script(None, tail());
    assert_eq!([went(&outputs, 103), went(&outputs, 104)], [Some(0), Some(1)], "no gap");
}

/// A streamed request's cost counts `FIRST_TOKEN_STEPS` steps at its backend's decode gap
/// beyond the least, once that gap is more than the tolerance above it. Backends taught as
/// above, backend 1's steps at 10,000 ticks a token against backend 0's 10: two streaming
/// prompts arrive together; the first goes to backend 0, and so does the second, behind the
/// first's prefill (about 4,000 tokens of cost with the join against about 10,000 a step for
/// backend 1's longer steps). At 15 ticks a token, within twice the least, backend 1's steps
/// count nothing and the second goes to idle backend 1; so it does where backend 1 learned no
/// gap.
#[test]
fn matches_reference_model_on_a_backend_of_longer_steps() {
    let tail = || vec![arrive_as(3_000_000, 103, true), arrive_as(3_000_000, 104, true)];
    let outputs = slower_decode_script(Some(10_000), tail());
    assert_eq!([went(&outputs, 103), went(&outputs, 104)], [Some(0), Some(0)], "longer steps");
    let outputs = slower_decode_script(Some(15), tail());
    assert_eq!([went(&outputs, 103), went(&outputs, 104)], [Some(0), Some(1)], "tolerated");
    let outputs = slower_decode_script(None, tail());
    assert_eq!([went(&outputs, 103), went(&outputs, 104)], [Some(0), Some(1)], "no gap");
}

/// The backend `Output::Admit` sent request `id` to.
fn went(outputs: &[Output], id: u64) -> Option<u16> {
    outputs.iter().find_map(|o| match *o {
        Output::Admit { id: admitted, backend, .. } if admitted.0 == id => Some(backend),
        _ => None,
    })
}

/// A scripted step: its tick, its input and the prompt's block hashes.
type Step = (Tick, Input, Vec<u64>);

/// The arrival at `at` of [`sixteen_block_prompt`] `id`, streaming or not.
fn arrive_as(at: Tick, id: u64, streaming: bool) -> Step {
    let (mut input, blocks) = sixteen_block_prompt(id);
    if let Input::Arrive(arrival) = &mut input {
        arrival.streaming = streaming;
    }
    (at, input, blocks)
}

/// Request `id`'s successful end at `at`, with `completion_tokens` in its usage.
fn done_with(at: Tick, id: u64, completion_tokens: u32) -> Step {
    let usage = Usage { completion_tokens, ..Usage::NONE };
    (at, Input::Complete { id: RequestId(id), success: true, usage }, Vec::new())
}

/// Thirty streaming prompts that teach two backends a prefill rate and a decode gap, backend 1
/// decoding at `slow_gap` ticks a token (`None`: its responses carry no output tokens) and
/// backend 0 at 10, then `tail`, run against the reference.
fn slower_decode_script(slow_gap: Option<u64>, tail: Vec<Step>) -> Vec<Output> {
    let params =
        Params { routing: Routing::PrefixCost, backends: 2, inflight_per_backend: 64, ..params() };
    let first_byte = |at: Tick, id: u64| (at, Input::FirstByte(RequestId(id)), Vec::new());
    let mut script: Vec<_> = (1..=30).map(|id| arrive_as(0, id, true)).collect();
    let placed = harness::run_script(&params, &script);
    let on_0 = (1..=30).filter(|&id| went(&placed, id) == Some(0)).count();
    let window = decode::DECODE_WINDOW_RESPONSES as usize;
    assert!(on_0 >= window && 30 - on_0 >= window, "{on_0} of 30 on backend 0");
    let mut served = [0, 0];
    for id in 1..=30 {
        let on_1 = went(&placed, id) == Some(1);
        served[usize::from(on_1)] += 1;
        let at = served[usize::from(on_1)] * 1000;
        let (gap, tokens) = match (on_1, slow_gap) {
            (false, _) => (10, 101),
            (true, Some(gap)) => (gap, 101),
            (true, None) => (10, 0),
        };
        script.extend([first_byte(at, id), done_with(at + 100 * gap, id, tokens)]);
    }
    script.extend(tail);
    script.sort_by_key(|step| step.0);
    harness::run_script(&params, &script)
}

/// A fuzzer's find, kept: a request with no prompt blocks after one that found a hot shared
/// prefix was costed (and counted as a copy) with the earlier request's hot depth, which the
/// scan's scratch kept.
#[test]
fn matches_reference_model_on_a_stale_hot_prefix() {
    let data = std::fs::read("fuzz/corpus/scheduler_model/seed-stale-hot-prefix").expect("seed");
    harness::run(&data);
}
