//! Experiments on a fleet in virtual time (`warmpath::fleet`): one configuration, one trace,
//! one engine profile, one load; prints one line of results.
//!
//! cargo run --release --example fleet -- TRACE PROFILE[,PROFILE] LOAD ROUTER [KEY=VALUE ...]
//! ROUTER: fifo-li | boost-sa | boost-pc | fifo-pc | li | cache_aware; KEY=VALUE as `--set`.
//! PROFILE may override a named profile's values: `l4-3b/kv_blocks=4000/max_num_seqs=64`.
//! TRACE `custom` is a synthetic workload shaped by MULTITURN (see `custom`).
//! DETAIL=1 prints what it learned and each engine's share; TRACE_BUDGET=1 each control round.
//! UNSTREAMED=PCT makes that share of sessions ask for whole responses (no first byte for the
//! router before the end; `FleetSpec::unstreamed_percent`); NO_STREAM=1 is UNSTREAMED=100.
//! The latencies printed are what each client waits for (`Outcome::seen`): the first token of
//! a streamed response, the whole of any other. SEEN=streamed or SEEN=unstreamed restricts
//! them to one kind of client (a mixed run is then run once for each).
//! DUMP=FILE writes one line per request: follow-up (0/1), backend, prompt tokens, cached
//! tokens, TTFT and queue wait (seconds, -1 when it failed), send time (simulated seconds),
//! send to last token (seconds: what a non-streaming client waits for), streamed (0/1).

use std::time::Duration;

use warmpath::bench::trace;
use warmpath::clock::TickRate;
use warmpath::config::{Config, Overrides};
use warmpath::fleet::{self, FleetSpec, Router};

fn sim_scale() -> f64 {
    std::env::var("SIM_SCALE").map(|v| v.parse().unwrap()).unwrap_or(8.0)
}

/// A named profile with overrides: `l4-3b/kv_blocks=2000/max_num_seqs=32` (an engine model the
/// named profiles do not cover, for robustness sweeps).
fn engine_profile(spec: &str) -> warmpath::sim::engine::EngineParams {
    let mut parts = spec.split('/');
    let name = parts.next().unwrap();
    let mut p = warmpath::sim::profile(name).unwrap_or_else(|| panic!("unknown profile {name}"));
    for part in parts {
        let (key, value) = part.split_once('=').expect("KEY=VALUE");
        let v: u64 = value.parse().expect("an integer");
        match key {
            "kv_blocks" => p.kv_blocks = v as u32,
            "max_num_seqs" => p.max_num_seqs = v as u32,
            "max_num_batched_tokens" => p.max_num_batched_tokens = v as u32,
            "step_base_us" => p.step_base_ns = v * 1000,
            "prefill_token_cost_ns" => p.prefill_token_cost_ns = v,
            "decode_seq_cost_us" => p.decode_seq_cost_ns = v * 1000,
            other => panic!("unknown profile key {other}"),
        }
    }
    p
}

/// Workloads unlike both traces, from the synthetic multi-turn generator (arrival times are
/// compressed to the load like a trace's): `chat`, short prompts and long answers (a chat
/// assistant: a few hundred tokens a turn, answers of 300); `agent`, a long shared system
/// prompt (tool definitions), short steps and answers, many turns in quick succession;
/// `coder`, a coding agent whose context grows by a file and an answer each turn to about 16k
/// tokens (a few dozen such sessions fill an H100's KV cache); `summarize`, one turn each of a
/// long document nobody else sends (nothing to reuse but a short instruction); `reason`, short
/// questions with answers of 2,000 tokens (a reasoning model: decoding dominates, and the KV
/// cache fills with what the engines generate, not with prompts).
fn synthetic(name: &str) -> warmpath::bench::workload::Workload {
    use warmpath::bench::synthetic::MultiTurn;
    let base = MultiTurn { rate: 5.0, duration: Duration::from_secs(400), ..MultiTurn::default() };
    let spec = match name {
        "chat" => MultiTurn {
            turns: 5,
            system_words: 80,
            context_words: 150,
            new_words: 40,
            answer_tokens: 300,
            think_mean: Duration::from_secs(8),
            ..base
        },
        "coder" => MultiTurn {
            rate: 1.0,
            turns: 12,
            system_words: 2000,
            context_words: 3000,
            new_words: 600,
            answer_tokens: 350,
            think_mean: Duration::from_secs(3),
            ..base
        },
        "reason" => MultiTurn {
            rate: 1.0,
            turns: 3,
            system_words: 100,
            context_words: 150,
            new_words: 50,
            answer_tokens: 2000,
            think_mean: Duration::from_secs(20),
            ..base
        },
        "summarize" => MultiTurn {
            rate: 5.0,
            turns: 1,
            system_words: 60,
            context_words: 5000,
            new_words: 20,
            answer_tokens: 200,
            ..base
        },
        "custom" => custom(base),
        _ => MultiTurn {
            rate: 2.0,
            turns: 8,
            system_words: 1500,
            context_words: 300,
            new_words: 80,
            answer_tokens: 60,
            think_mean: Duration::from_millis(500),
            ..base
        },
    };
    spec.workload()
}

/// `custom`: `base` with the fields MULTITURN names, e.g.
/// `MULTITURN=turns=2,system_words=50,context_words=0,new_words=30,answer_tokens=5,think_ms=500`
/// (a shape no named workload has, for a sweep); `duration_s` (400 by default) sets how many
/// sessions start, at 5 a second before compression.
fn custom(base: warmpath::bench::synthetic::MultiTurn) -> warmpath::bench::synthetic::MultiTurn {
    let mut spec = base;
    let fields = std::env::var("MULTITURN").expect("MULTITURN=KEY=VALUE,... for custom");
    for field in fields.split(',').filter(|f| !f.is_empty()) {
        let (key, value) = field.split_once('=').expect("KEY=VALUE");
        let v: u32 = value.parse().expect("an integer");
        match key {
            "turns" => spec.turns = v,
            "system_words" => spec.system_words = v,
            "context_words" => spec.context_words = v,
            "new_words" => spec.new_words = v,
            "answer_tokens" => spec.answer_tokens = v,
            "think_ms" => spec.think_mean = Duration::from_millis(u64::from(v)),
            // More sessions at the same rate: a longer run once compressed to the load.
            "duration_s" => spec.duration = Duration::from_secs(u64::from(v)),
            other => panic!("unknown MULTITURN key {other}"),
        }
    }
    spec
}

#[allow(clippy::too_many_lines)] // the fleet lab's driver, older than the lint (issue [9])
fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [trace_name, profiles, load, router, sets @ ..] = &args[..] else {
        eprintln!("usage: fleet TRACE PROFILE[,PROFILE] LOAD ROUTER [KEY=VALUE ...]");
        std::process::exit(2);
    };
    let load: f64 = load.parse().expect("LOAD");
    let engines: Vec<_> = profiles.split(',').map(engine_profile).collect();
    let engines = if engines.len() == 1 { vec![engines[0]; 2] } else { engines };
    let dir = trace::data_dir().expect("the traces");
    let mut workload = match trace_name.as_str() {
        "mooncake" => trace::mooncake(
            &trace::read_mooncake(&trace::trace_file(&dir, trace::MOONCAKE_FILE).unwrap()).unwrap(),
            1.0,
        ),
        "ragpulse" => trace::ragpulse(
            &trace::read_ragpulse(&trace::trace_file(&dir, trace::RAGPULSE_FILE).unwrap()).unwrap(),
            1.0,
        ),
        "chat" | "agent" | "coder" | "summarize" | "reason" | "custom" => synthetic(trace_name),
        other => panic!("unknown trace {other}"),
    };
    let window: Option<f64> = std::env::var("WINDOW").ok().map(|w| w.parse().unwrap());
    if let Some(w) = window {
        workload.truncate(None, Some(Duration::from_secs_f64(w)));
    }
    let compress = warmpath::bench::load::compression_for(&workload, &engines, load);
    if std::env::var("DETAIL").is_ok() {
        eprintln!("compression {compress:.6} trace seconds per simulated second");
    }
    // JITTER=seed: each turn's offset moves by up to 200 simulated ms (another sample path).
    let mut jitter: u64 = std::env::var("JITTER").map(|v| v.parse().unwrap()).unwrap_or(0);
    for session in &mut workload.sessions {
        for turn in &mut session.turns {
            let mut at = turn.at.as_secs_f64() / compress;
            if jitter != 0 {
                jitter = warmpath::splitmix::mix(jitter);
                at += (jitter % 200_000) as f64 / 1e6;
            }
            turn.at = Duration::from_secs_f64(at);
        }
    }
    let net_ns: u64 =
        std::env::var("NET_US").map(|v| v.parse::<u64>().unwrap() * 1000).unwrap_or(4_000_000);
    let scrape_ns: u64 = std::env::var("SCRAPE_MS")
        .map(|v| v.parse::<u64>().unwrap() * 1_000_000)
        .unwrap_or(800_000_000);
    let router = match router.as_str() {
        "li" => Router::LeastInflight,
        "cache_aware" => Router::CacheAware,
        name => {
            let (strategy, routing) = match name {
                "fifo-li" => ("fifo", "least-inflight"),
                "boost-sa" => ("session-boost", "session-affinity"),
                "boost-pc" => ("session-boost", "prefix-cost"),
                "fifo-pc" => ("fifo", "prefix-cost"),
                "default" => ("", ""),
                other => panic!("unknown router {other}"),
            };
            let mut text = String::from("[queue]\ntimeout = \"300s\"\n");
            if !strategy.is_empty() {
                text += &format!("strategy = \"{strategy}\"\n");
            }
            text += "[upstream]\nmetrics_interval = \"100ms\"\n[[model]]\nname = \"sim-8b\"\nengine = \"vllm\"\n";
            if !routing.is_empty() {
                text += &format!("routing = \"{routing}\"\n");
            }
            text += "backends = [\"127.0.0.1:1\", \"127.0.0.1:2\"]\n";
            let path = std::env::temp_dir().join(format!("fleet-{}.toml", std::process::id()));
            std::fs::write(&path, text).unwrap();
            let set = sets.iter().map(|s| Overrides::parse_set(s).unwrap()).collect();
            let overrides = Overrides { set, ..Overrides::default() };
            let config = Config::load(Some(&path), &|_| None, &overrides).expect("config");
            let _ = std::fs::remove_file(&path);
            // Ticks are simulated nanoseconds; the router's durations are real time, and the
            // engines of the real replays run SIM_SCALE simulated seconds per real second.
            let rate = TickRate::new(sim_scale());
            Router::Warmpath(warmpath::server::generation::scheduler_params(
                &config.models[0],
                &config.upstream,
                rate,
            ))
        }
    };
    let spec = FleetSpec {
        net_ns,
        scrape_ns,
        report_waiting: std::env::var("NO_WAITING").is_err(),
        trace_budget: std::env::var("TRACE_BUDGET").is_ok(),
        unstreamed_percent: match (std::env::var("UNSTREAMED"), std::env::var("NO_STREAM")) {
            (Ok(pct), _) => pct.parse().ok().filter(|&p| p <= 100).expect("UNSTREAMED: 0 to 100"),
            (Err(_), Ok(_)) => 100,
            _ => 0,
        },
        ..FleetSpec::lab(engines, router)
    };
    let clock = warmpath::clock::Clock::real();
    let started = clock.now();
    let report = fleet::run(&workload, &spec);
    if std::env::var("DETAIL").is_ok() {
        for follow in [false, true] {
            let (mut p, mut c, mut n) = (0u64, 0u64, 0u64);
            for o in report.outcomes.iter().filter(|o| o.follow_up == follow) {
                p += u64::from(o.prompt_tokens);
                c += u64::from(o.cached_tokens);
                n += 1;
            }
            eprintln!(
                "follow={follow}: n {n} prompt {:.1}M cached {:.1}M ({:.3})",
                p as f64 / 1e6,
                c as f64 / 1e6,
                c as f64 / p as f64
            );
        }
    }
    if std::env::var("DETAIL").is_ok() {
        let mut i = 0;
        let (mut home, mut total) = (0, 0);
        for session in &workload.sessions {
            for turn in &session.turns {
                if let Some(a) = turn.after {
                    let parent = i - (session.turns.len() - session.turns.len());
                    let _ = parent;
                    let start =
                        i - session.turns.iter().position(|t| std::ptr::eq(t, turn)).unwrap();
                    total += 1;
                    if report.outcomes[start + a as usize].backend == report.outcomes[i].backend {
                        home += 1;
                    }
                }
                i += 1;
            }
        }
        eprintln!("follow-ups on their parent's backend: {home} of {total}");
        if let Some(st) = &report.stats {
            eprintln!(
                "predicted match share: mean {:.3} buckets {:?}",
                st.match_ratio_sum_milli as f64 / 1000.0 / st.admitted.iter().sum::<u64>() as f64,
                st.match_ratio
            );
        }
        let (p, c): (u64, u64) = report.outcomes.iter().fold((0, 0), |(p, c), o| {
            (p + u64::from(o.prompt_tokens), c + u64::from(o.cached_tokens))
        });
        eprintln!("engine cached share of prompt tokens: {:.3}", c as f64 / p as f64);
    }
    if std::env::var("DETAIL").is_ok() {
        for (b, e) in report.estimates.iter().enumerate() {
            let rate = if e.rate.1 > 0 { e.rate.0 as f64 / e.rate.1 as f64 * 1e9 } else { 0.0 };
            eprintln!(
                "backend {b}: rate {rate:.0} tok/s (true {:.0}) budget set at {:.1}s budget {} kv {} index {} hit pred {:.3} engine {:.3} counter {:?} kv pressure {:.2} decode weight {}",
                warmpath::sim::prefill_capacity(&spec.engines[b]),
                e.budget_at as f64 / 1e9, e.budget, e.kv_capacity_tokens, e.index_capacity,
                e.predicted_hit_micro as f64 / 1e6, e.engine_hit_micro as f64 / 1e6, e.counter_hit_micro,
                e.kv_pressure_micro as f64 / 1e6, e.decode_weight
            );
        }
        eprintln!("tokens per byte {:?}", report.tokens_per_byte.map(|t| t as f64 / 1e6));
    }
    if std::env::var("DETAIL").is_ok() {
        for (b, e) in report.engines.iter().enumerate() {
            let served: Vec<_> =
                report.outcomes.iter().filter(|o| o.backend as usize == b).collect();
            let mut ttft: Vec<f64> = served.iter().filter_map(|o| o.ttft).collect();
            let mut queued: Vec<f64> = served.iter().map(|o| o.queued).collect();
            ttft.sort_by(f64::total_cmp);
            queued.sort_by(f64::total_cmp);
            let mid = |v: &[f64]| if v.is_empty() { 0.0 } else { v[v.len() / 2] * 1000.0 };
            eprintln!(
                "engine {b}: requests {} ttft p50 {:.0} ms queued p50 {:.0} ms busy {:.0}s preempt {} prefill {:.1}M hit {:.3}",
                ttft.len(), mid(&ttft), mid(&queued), e.2 as f64 / 1e9, e.3, e.4 as f64 / 1e6,
                e.1 as f64 / e.0.max(1) as f64
            );
        }
    }
    if let Ok(path) = std::env::var("DUMP") {
        let mut text = String::new();
        for o in &report.outcomes {
            text += &format!(
                "{} {} {} {} {:.5} {:.5} {:.6} {:.5} {}\n",
                u8::from(o.follow_up),
                o.backend,
                o.prompt_tokens,
                o.cached_tokens,
                o.ttft.unwrap_or(-1.0),
                o.queued,
                o.sent,
                o.e2e,
                u8::from(o.streamed)
            );
        }
        std::fs::write(path, text).unwrap();
    }
    let class = match std::env::var("SEEN").as_deref() {
        Ok("streamed") => Some(true),
        Ok("unstreamed") => Some(false),
        Ok(other) => panic!("SEEN: streamed or unstreamed, not {other}"),
        Err(_) => None,
    };
    let seen = |follow_up, p| report.seen(class, follow_up, p);
    if std::env::var("CSV").is_ok() {
        println!(
            "{trace_name},{profiles},{load},{},{},{},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{:.4},{},{},{:.1}",
            args[3],
            sets.join(" "),
            std::env::var("JITTER").unwrap_or_else(|_| "0".into()),
            seen(Some(true), 50.0),
            seen(Some(true), 90.0),
            seen(Some(true), 99.0),
            seen(Some(false), 50.0),
            seen(Some(false), 90.0),
            seen(Some(false), 99.0),
            seen(None, 99.0),
            report.hit_rate(),
            report.errors(),
            report.engines.iter().map(|e| e.3).sum::<u64>(),
            report.elapsed,
        );
        return;
    }
    let ms = |v: f64| format!("{:.0}", v * 1000.0);
    println!(
        "{trace_name} {profiles} {load} {} {}: follow {}/{}/{} first {}/{}/{} all-p99 {} hit {:.3} err {} n {} elapsed {:.0}s (wall {:.1}s){}",
        args[3],
        sets.join(" "),
        ms(seen(Some(true), 50.0)),
        ms(seen(Some(true), 90.0)),
        ms(seen(Some(true), 99.0)),
        ms(seen(Some(false), 50.0)),
        ms(seen(Some(false), 90.0)),
        ms(seen(Some(false), 99.0)),
        ms(seen(None, 99.0)),
        report.hit_rate(),
        report.errors(),
        report.outcomes.len(),
        report.elapsed,
        clock.rate().duration(clock.now() - started).as_secs_f64(),
        report.stats.as_ref().map(|s| format!(" waits {} declined {}", s.placement_waits, s.boost_declined)).unwrap_or_default()
            + &format!(" preempt {} prefill {:.1}M", report.engines.iter().map(|e| e.3).sum::<u64>(), report.engines.iter().map(|e| e.4).sum::<u64>() as f64 / 1e6),
    );
}
