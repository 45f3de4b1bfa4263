//! Issue [8] end to end: what the router learns with no key set, through real sockets. Two
//! simulated engines of different profiles (`h100-8b`, which prefills 8,192 tokens a step, and
//! `l4-3b`, 2,048 a step at about a quarter of the rate) behind one model with the default
//! configuration, a saturating stream of chat requests from `warmpath bench`'s client, and
//! then what `/debug/backends` and `/metrics` say:
//! - tokens per byte learned from the responses' `usage`;
//! - each backend's prefill rate within ±20 % of its profile's true rate after 30 s of engine
//!   time (the sims run 5x faster than real time, so 6 s of real time);
//! - each backend's KV capacity as its engine exports it;
//! - each backend's decode speed: at least a step per token, the L4's over 1.5 times the H100's
//!   (2.0-2.5 times in these runs, whose steps mostly carry prefill chunks);
//! - the admission budget opened wider on the engine that can run more of these requests at
//!   once: 12,000-word prompts decoding 100 tokens fill the L4's KV cache with about nine of
//!   them, so requests wait inside it and its budget closes, while the H100's holds about
//!   thirty-five.
//!
//! And with clients that never stream (no stream to time), each backend's decode speed from
//! its engine's inter-token histogram.

mod support;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde_json::Value;
use warmpath::bench::{run_workload, MultiTurn};
use warmpath::sim::{prefill_capacity, profile, start, RunningSim, SimOptions};

use support::client;
use support::router::Setup;

const TIME_SCALE: f64 = 5.0;
const PROFILES: [&str; 2] = ["h100-8b", "l4-3b"];

/// A sim of each profile at [`TIME_SCALE`], and their addresses.
fn start_sims(profiles: [&str; 2]) -> (Vec<RunningSim>, Vec<String>) {
    let sims: Vec<_> = profiles
        .iter()
        .enumerate()
        .map(|(i, name)| {
            let params = profile(name).expect("a profile");
            let options =
                SimOptions { time_scale: TIME_SCALE, seed: i as u64, params, ..SimOptions::new() };
            start(options).expect("a sim starts")
        })
        .collect();
    let backends = sims.iter().map(|s| s.addr().to_string()).collect();
    (sims, backends)
}

#[test]
#[allow(clippy::too_many_lines)] // one scenario, read top to bottom; older than the lint
fn a_fleet_of_two_profiles_is_learned_with_no_key_set() {
    let (sims, backends) = start_sims(PROFILES);
    let profiles = PROFILES;
    let router = Setup::new()
        .model("sim-8b", &backends)
        .model_key("engine", "vllm")
        .queue("timeout", "60s")
        .start();

    // 30 s of engine time of unshared 12,000-word prompts at about twice what the two engines
    // prefill, 100 tokens each: both engines stay saturated with prefill.
    let capacity: f64 = profiles.iter().map(|p| prefill_capacity(&profile(p).unwrap())).sum();
    let duration = Duration::from_secs_f64(30.0 / TIME_SCALE);
    let workload = MultiTurn {
        rate: 2.0 * capacity * TIME_SCALE / 12_000.0,
        duration,
        turns: 1,
        system_words: 0,
        context_words: 12_000,
        new_words: 10,
        answer_tokens: 100,
        think_mean: Duration::ZERO,
        seed: 3,
    }
    .workload();
    let options = warmpath::bench::RunOptions {
        model: "sim-8b".into(),
        max_inflight: 512,
        stop_after: Some(duration),
        ..Default::default()
    };
    let target = format!("http://{}", router.addr);
    // Each backend's budget every 100 ms while the load runs: the controller moves at every
    // snapshot, by a quarter up or an eighth down, so one final value is a sample of a walk;
    // the medians of the second half say where each walk settled.
    let admin = router.admin;
    let running = Arc::new(AtomicBool::new(true));
    let sampler = {
        let running = Arc::clone(&running);
        std::thread::spawn(move || {
            let mut samples: Vec<[u64; 2]> = Vec::new();
            while running.load(Ordering::Acquire) {
                let debug = client::get(admin, "/debug/backends").json();
                let budget =
                    |i: usize| debug["backends"][i]["learned"]["admission_budget_tokens"].as_u64();
                if let (Some(a), Some(b)) = (budget(0), budget(1)) {
                    samples.push([a, b]);
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            samples
        })
    };
    let result = run_workload(&target, &workload, &options).expect("the run");
    running.store(false, Ordering::Release);
    let samples = sampler.join().expect("the sampler");
    let served = result.samples.iter().filter(|s| s.status == 200).count();
    assert!(served > 20, "requests served: {served}, errors {:?}", result.errors);

    let debug = client::get(router.admin, "/debug/backends").json();
    let backends = debug["backends"].as_array().expect("backends");
    let learned = |i: usize| -> &Value { &backends[i]["learned"] };
    let tokens_per_byte = learned(0)["tokens_per_byte"].as_f64().expect("learned");
    assert!(
        (0.1..0.24).contains(&tokens_per_byte),
        "a word of the bench's vocabulary is about 4.3 bytes with its space, and JSON adds a \
         little: {tokens_per_byte}"
    );
    for (i, name) in profiles.iter().enumerate() {
        let params = profile(name).unwrap();
        let truth = prefill_capacity(&params) * TIME_SCALE;
        let rate = learned(i)["prefill_tokens_per_second"].as_f64().expect("a measured rate");
        assert!(
            (rate / truth - 1.0).abs() <= 0.2,
            "{name}: learned {rate:.0} tokens/s against {truth:.0} (real time)\n{debug:#}"
        );
        let capacity = u64::from(params.kv_blocks) * u64::from(params.block_size);
        assert_eq!(learned(i)["kv_capacity_tokens"].as_u64(), Some(capacity), "{name}");
        // The KV pressure is the engines' usage gauge averaged, and the held pressure the
        // router's count of the contexts it has there: fractions, the larger of which sets the
        // decode weight (2,000 × its square, rounded down in millionths).
        let pressure = learned(i)["kv_pressure"].as_f64().expect("a KV pressure");
        assert!((0.0..=1.0).contains(&pressure), "{name}: {pressure}");
        let held = learned(i)["kv_held"].as_f64().expect("a count against a KV capacity");
        assert!(held >= 0.0, "{name}: {held}");
        let fullness = pressure.max(held).min(1.0);
        let weight = learned(i)["decode_weight_tokens"].as_f64().expect("a decode weight");
        let expected = 2000.0 * fullness * fullness;
        assert!((weight - expected).abs() <= 1.0, "{name}: {weight} for {pressure} and {held}");
        // A decoded token takes at least an engine step (the streams' events, counted when the
        // client asks for no usage, are a little more than its tokens).
        let gap = learned(i)["decode_ms_per_token"].as_f64().expect("a decode gap");
        assert!(learned(i)["decode_ms_per_token_age_ms"].is_number(), "{name}: an age");
        let step_ms = params.step_base_ns as f64 / 1e6 / TIME_SCALE;
        assert!(gap >= 0.9 * step_ms, "{name}: {gap} ms per token, a step is {step_ms} ms");
        assert!(learned(i)["expected_output_tokens"].is_null(), "no whole response was asked");
        // The inflight cap is learned from 256 (`inflight_per_backend = "auto"`, the default)
        // and never goes below it; the gate reads it.
        let cap = learned(i)["inflight_cap"].as_u64().expect("an inflight cap");
        assert!((256..=4096).contains(&cap), "{name}: inflight cap {cap}");
        let inflight = backends[i]["inflight"].as_u64().expect("inflight");
        let holds = backends[i]["held_slots"].as_u64().expect("held slots");
        let slots = if inflight + holds < cap { "open" } else { "full" };
        assert_eq!(backends[i]["gates"]["slots"], slots, "{name}");
        println!("{name}: learned {rate:.0} tokens/s, true {truth:.0}; {}", learned(i));
    }
    let gap = |i: usize| learned(i)["decode_ms_per_token"].as_f64().expect("a decode gap");
    assert!(gap(1) > 1.5 * gap(0), "the L4 decodes slower: {} and {} ms", gap(0), gap(1));
    assert!(samples.len() >= 10, "budget samples: {samples:?}");
    let settled = &samples[samples.len() / 2..];
    let median = |i: usize| {
        let mut v: Vec<u64> = settled.iter().map(|s| s[i]).collect();
        v.sort_unstable();
        v[v.len() / 2]
    };
    println!("budget medians over the second half: {} and {}", median(0), median(1));
    assert!(
        median(0) > median(1),
        "the engine that holds four times the KV takes more: medians {} and {} of {settled:?}",
        median(0),
        median(1)
    );

    let metrics = client::get(router.admin, "/metrics").text();
    for family in [
        "warmpath_backend_prefill_tokens_per_second{",
        "warmpath_backend_admission_budget_tokens{",
        "warmpath_backend_kv_capacity_tokens{",
        "warmpath_tokens_per_byte{",
    ] {
        assert_eq!(
            metrics.lines().filter(|l| l.starts_with(family)).count(),
            if family.starts_with("warmpath_tokens") { 1 } else { 2 },
            "{family} series in\n{metrics}"
        );
    }
    drop(router);
    for sim in sims {
        sim.stop();
    }
}

/// A fleet whose clients never stream gives the router no first byte before a response ends,
/// so no stream to time: each backend's decode speed comes from its engine's inter-token
/// histogram (`vllm:inter_token_latency_seconds`), which the sim reports in real seconds. The
/// L4 profile's steps start at 27 ms of engine time against the H100's 6 (at five engine
/// seconds a real one: 5.4 ms and 1.2 ms).
#[test]
fn a_fleet_whose_clients_never_stream_learns_decode_speeds_from_the_engines() {
    let (sims, backends) = start_sims(PROFILES);
    let profiles = PROFILES;
    let router = Setup::new()
        .model("sim-8b", &backends)
        .model_key("engine", "vllm")
        .upstream("metrics_interval", "100ms")
        .start();
    // Short prompts and 60-token answers, enough at once that both engines decode.
    let duration = Duration::from_secs(3);
    let workload = MultiTurn {
        rate: 40.0,
        duration,
        turns: 1,
        system_words: 0,
        context_words: 50,
        new_words: 10,
        answer_tokens: 60,
        think_mean: Duration::ZERO,
        seed: 5,
    }
    .workload();
    let options = warmpath::bench::RunOptions {
        model: "sim-8b".into(),
        max_inflight: 64,
        stop_after: Some(duration),
        unstreamed_percent: 100,
        ..Default::default()
    };
    let result =
        run_workload(&format!("http://{}", router.addr), &workload, &options).expect("the run");
    let served = result.samples.iter().filter(|s| s.status == 200).count();
    assert!(served > 20, "requests served: {served}, errors {:?}", result.errors);
    let debug = client::get(router.admin, "/debug/backends").json();
    let gap = |i: usize| {
        let learned = &debug["backends"][i]["learned"];
        learned["decode_ms_per_token"].as_f64().unwrap_or_else(|| panic!("a gap: {debug:#}"))
    };
    for (i, name) in profiles.iter().enumerate() {
        let step_ms = profile(name).unwrap().step_base_ns as f64 / 1e6 / TIME_SCALE;
        // At this light load a step is little more than its fixed part, and the gap is the
        // least of the recent samples: within twice a step, in real time (in the engine's
        // simulated seconds it would be five times that).
        let within = (0.9 * step_ms..2.0 * step_ms).contains(&gap(i));
        assert!(within, "{name}: {} ms per token, a step {step_ms} ms", gap(i));
    }
    assert!(gap(1) > 1.5 * gap(0), "the L4 decodes slower: {} and {} ms", gap(0), gap(1));
    drop(router);
    for sim in sims {
        sim.stop();
    }
}
