//! Issue \[11\]'s fair-share targets in the fleet model (`warmpath::fleet`, virtual time): the
//! real scheduler, simulated engines, a trace's sessions split among tenants.
//!
//! cargo run --release --example fair_share -- TRACE PROFILE LOAD [ROUTING]
//!
//! Prints two experiments, each against its baseline in the same run:
//! 1. *A heavy neighbour*: tenant 1 sends one session in 101, tenant 2 the other 100 (100x the
//!    rate), weights 1:1, at LOAD of the two engines' capacity for the whole trace. Tenant 1's
//!    TTFT p50 and p90 with the neighbour against its solo run (its sessions alone, same
//!    offsets), and through one queue for both (no tenants configured); then where its time
//!    goes: its queue wait in the router, the rest of its TTFT (the engine's), and its
//!    prefix-cache hit rate, solo and beside the neighbour.
//! 2. *Boost within tenants*: the follow-up TTFT p50 gain of session-boost over fifo for the
//!    whole trace as one tenant, against the gain within each of two tenants of weights 3:1
//!    (sessions split 3:1); and each tenant's gain against the gain of *its own sessions* in
//!    the one-queue runs (the same split labelled, no weights: one tenant to the scheduler), so
//!    that the two gains compare the same follow-ups.
//!
//! ROUTING: `session-affinity` (default) or `prefix-cost`. `WINDOW=seconds` truncates the trace.

use std::time::Duration;

use warmpath::bench::{trace, Workload};
use warmpath::clock::TickRate;
use warmpath::config::Config;
use warmpath::fleet::{self, FleetReport, FleetSpec, Outcome, Router};
use warmpath::scheduler::Params;
use warmpath::sim::engine::EngineParams;

fn params(strategy: &str, routing: &str, weights: &[u16]) -> Params {
    let text = format!(
        "[queue]\ntimeout = \"300s\"\nstrategy = \"{strategy}\"\n[upstream]\n\
         metrics_interval = \"100ms\"\n[[model]]\nname = \"sim-8b\"\nengine = \"vllm\"\n\
         routing = \"{routing}\"\nbackends = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n"
    );
    let config = Config::from_toml_str(&text).expect("config");
    // Ticks are simulated nanoseconds; the engines run 8 simulated seconds per real second in
    // the real replays, as in examples/fleet.rs.
    let mut params = warmpath::server::generation::scheduler_params(
        &config.models[0],
        &config.upstream,
        TickRate::new(8.0),
    );
    params.tenant_weights = weights.to_vec();
    params
}

fn run(
    workload: &Workload,
    engines: &[EngineParams],
    params: Params,
    tenants: Vec<u16>,
) -> FleetReport {
    let spec = FleetSpec {
        session_tenants: tenants,
        ..FleetSpec::lab(engines.to_vec(), Router::Warmpath(params))
    };
    fleet::run(workload, &spec)
}

/// The trace, compressed so that it offers `load` of `engines`' capacity.
fn load_workload(trace_name: &str, engines: &[EngineParams], load: f64) -> Workload {
    let dir = trace::data_dir().expect("the traces");
    let mut workload = match trace_name {
        "mooncake" => trace::mooncake(
            &trace::read_mooncake(&trace::trace_file(&dir, trace::MOONCAKE_FILE).unwrap()).unwrap(),
            1.0,
        ),
        "ragpulse" => trace::ragpulse(
            &trace::read_ragpulse(&trace::trace_file(&dir, trace::RAGPULSE_FILE).unwrap()).unwrap(),
            1.0,
        ),
        other => panic!("unknown trace {other}"),
    };
    if let Ok(w) = std::env::var("WINDOW") {
        workload.truncate(None, Some(Duration::from_secs_f64(w.parse().unwrap())));
    }
    let compress = warmpath::bench::load::compression_for(&workload, engines, load);
    for session in &mut workload.sessions {
        for turn in &mut session.turns {
            turn.at = Duration::from_secs_f64(turn.at.as_secs_f64() / compress);
        }
    }
    workload
}

/// The `p`th percentile of `tenant`'s TTFT less its queue wait: the engine's part (with the
/// network's few milliseconds).
fn engine_time(report: &FleetReport, tenant: u16, p: f64) -> f64 {
    let mut v: Vec<f64> = (report.outcomes.iter())
        .filter(|o| o.tenant == tenant)
        .filter_map(|o| o.ttft.map(|ttft| ttft - o.queued))
        .collect();
    fleet::percentile(&mut v, p)
}

/// Of the requests `keep` picks, the prompt tokens the engines found cached over their prompt
/// tokens.
fn hit_rate(report: &FleetReport, keep: impl Fn(&Outcome) -> bool) -> f64 {
    let (cached, prompt) = (report.outcomes.iter().filter(|o| keep(o)))
        .fold((0, 0), |(c, p), o| (c + u64::from(o.cached_tokens), p + u64::from(o.prompt_tokens)));
    cached as f64 / prompt.max(1) as f64
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [trace_name, profile, load, rest @ ..] = &args[..] else {
        eprintln!("usage: fair_share TRACE PROFILE LOAD [ROUTING]");
        std::process::exit(2);
    };
    let routing = rest.first().map_or("session-affinity", String::as_str);
    let load: f64 = load.parse().expect("LOAD");
    let engines = vec![warmpath::sim::profile(profile).expect("profile"); 2];
    let workload = load_workload(trace_name, &engines, load);
    let label = format!("{trace_name} {profile} {load} {routing}");
    neighbour(&label, &workload, &engines, routing);
    boost_within(&label, &workload, &engines, routing);
}

fn ms(v: f64) -> String {
    format!("{:.0}", v * 1000.0)
}

/// Experiment 1: a heavy neighbour.
fn neighbour(label: &str, workload: &Workload, engines: &[EngineParams], routing: &str) {
    let light: Vec<u16> =
        (0..workload.sessions.len()).map(|s| if s % 101 == 0 { 1 } else { 2 }).collect();
    let mut solo = workload.clone();
    solo.sessions = (workload.sessions.iter().enumerate())
        .filter(|(s, _)| s % 101 == 0)
        .map(|(_, session)| session.clone())
        .collect();
    let boost = |weights: &[u16]| params("session-boost", routing, weights);
    let alone = run(&solo, engines, boost(&[1, 1]), vec![1; solo.sessions.len()]);
    let mixed = run(workload, engines, boost(&[1, 1]), light.clone());
    // The same mix through today's single queue: no weights, so every tenant counts as none.
    let single = run(workload, engines, boost(&[]), light);
    let (a50, m50) = (alone.ttft_of(Some(1), None, 50.0), mixed.ttft_of(Some(1), None, 50.0));
    let (a90, m90) = (alone.ttft_of(Some(1), None, 90.0), mixed.ttft_of(Some(1), None, 90.0));
    println!(
        "{label}: light tenant ({} requests) TTFT p50 solo {} ms, \
         beside a 100x tenant {} ms ({:+.1} %) (one queue for both: {} ms); p90 {} -> {} ms; \
         heavy tenant p50 {} ms",
        alone.outcomes.len(),
        ms(a50),
        ms(m50),
        (m50 / a50 - 1.0) * 100.0,
        ms(single.ttft_of(Some(1), None, 50.0)),
        ms(a90),
        ms(m90),
        ms(mixed.ttft_of(Some(2), None, 50.0)),
    );

    println!(
        "  where the light tenant's time goes: queue wait p50 solo {} ms, beside {} ms; TTFT minus \
         queue wait p50 solo {} ms, beside {} ms; its prefix-cache hit rate solo {:.1} %, beside \
         {:.1} %",
        ms(alone.queued_of(Some(1), 50.0)),
        ms(mixed.queued_of(Some(1), 50.0)),
        ms(engine_time(&alone, 1, 50.0)),
        ms(engine_time(&mixed, 1, 50.0)),
        hit_rate(&alone, |o| o.tenant == 1) * 100.0,
        hit_rate(&mixed, |o| o.tenant == 1) * 100.0,
    );
}

/// Experiment 2: the boost within tenants.
fn boost_within(label: &str, workload: &Workload, engines: &[EngineParams], routing: &str) {
    let split: Vec<u16> =
        (0..workload.sessions.len()).map(|s| if s % 4 == 0 { 2 } else { 1 }).collect();
    let fifo = |weights: &[u16]| params("fifo", routing, weights);
    let boost = |weights: &[u16]| params("session-boost", routing, weights);
    // One queue (no weights), the sessions labelled with their tenants of the split.
    let one_fifo = run(workload, engines, fifo(&[]), split.clone());
    let one_boost = run(workload, engines, boost(&[]), split.clone());
    let two_fifo = run(workload, engines, fifo(&[3, 1]), split.clone());
    let two_boost = run(workload, engines, boost(&[3, 1]), split);
    let gain = |f: &FleetReport, b: &FleetReport, t: Option<u16>| {
        f.ttft_of(t, Some(true), 50.0) - b.ttft_of(t, Some(true), 50.0)
    };
    let one = gain(&one_fifo, &one_boost, None);
    let (own1, own2) = (gain(&one_fifo, &one_boost, Some(1)), gain(&one_fifo, &one_boost, Some(2)));
    let (two1, two2) = (gain(&two_fifo, &two_boost, Some(1)), gain(&two_fifo, &two_boost, Some(2)));
    println!(
        "{label}: follow-up p50 gain of boost over fifo: one tenant \
         {} ms ({} -> {}); weight-3 tenant {} ms ({:.0} % of it); weight-1 tenant {} ms ({:.0} %)",
        ms(one),
        ms(one_fifo.ttft(Some(true), 50.0)),
        ms(one_boost.ttft(Some(true), 50.0)),
        ms(two1),
        two1 / one * 100.0,
        ms(two2),
        two2 / one * 100.0,
    );
    println!(
        "  against its own sessions' gain in one queue: weight-3 tenant {} ms of {} ms ({:.0} %), \
         weight-1 tenant {} ms of {} ms ({:.0} %)",
        ms(two1),
        ms(own1),
        two1 / own1 * 100.0,
        ms(two2),
        ms(own2),
        two2 / own2 * 100.0,
    );
    let p50 = |r: &FleetReport, t: u16| ms(r.ttft_of(Some(t), Some(true), 50.0));
    // A tenant's follow-ups: queue wait p50 and the share of their prompt found cached.
    let follow = |r: &FleetReport, t: u16| {
        let mut waits: Vec<f64> = (r.outcomes.iter())
            .filter(|o| o.tenant == t && o.follow_up)
            .map(|o| o.queued)
            .collect();
        let hit = hit_rate(r, |o| o.tenant == t && o.follow_up) * 100.0;
        format!("wait p50 {} ms, hit {hit:.0} %", ms(fleet::percentile(&mut waits, 50.0)))
    };
    println!(
        "  boosted follow-ups: weight-3 tenant {} in one queue, {} as a tenant; weight-1 tenant \
         {}, {}",
        follow(&one_boost, 1),
        follow(&two_boost, 1),
        follow(&one_boost, 2),
        follow(&two_boost, 2),
    );
    println!(
        "  follow-up p50 fifo -> boost: weight-3 tenant {} -> {} ms in one queue, {} -> {} ms as \
         a tenant; weight-1 tenant {} -> {} ms, {} -> {} ms",
        p50(&one_fifo, 1),
        p50(&one_boost, 1),
        p50(&two_fifo, 1),
        p50(&two_boost, 1),
        p50(&one_fifo, 2),
        p50(&one_boost, 2),
        p50(&two_fifo, 2),
        p50(&two_boost, 2),
    );
}
