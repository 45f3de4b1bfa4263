//! `warmpath demo` (SPEC section 5): the embedded default. With no configuration it starts two
//! simulated engines ([`crate::sim`]) and the router ([`crate::server`]) on free loopback
//! ports, drives the same multi-turn workload ([`crate::bench`]) through the router twice —
//! once as a plain load balancer would (`queue.strategy = "fifo"`, least-inflight routing),
//! once as warmpath does (`"session-boost"` with prefix-cost routing, S16) — prints the
//! comparison and writes a report (markdown, JSON per run, a TTFT plot) to an output folder it
//! names.
//!
//! Each run gets fresh engines (empty prefix caches) and a fresh router, so neither inherits
//! the other's warm caches. The workload is the same for both (same seed). The defaults model
//! a chat over a pasted document: 4 sessions per second for 12 s, 4 turns, a 512-word shared
//! system prompt and 12,000 words of context in each first turn, engines at the modelled speed.
//! That offers the two engines about 88 % of their prefill capacity once follow-ups hit their
//! cache (4 x (12,600 + 3 x 300) tokens per second against 61,100; `docs/sim.md`), and their
//! caches hold about as many sessions as are live, so where a follow-up goes decides whether
//! its history is recomputed. Chosen on the 2-core development machine (perf/RESULTS.md, the
//! demo section): at this load the fifo baseline recomputes about half of the follow-ups'
//! history on the wrong engine, and warmpath's follow-ups start 20–25x sooner. Lighter
//! workloads (2,000 words of context) left both runs' follow-ups unqueued and cached, with
//! nothing to tell apart; heavier ones overloaded the engines and made the comparison depend
//! on the run. The whole demo takes a little over a minute there.

use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;

use crate::bench::{self, BenchResult, MultiTurn, RunOptions};
use crate::config::Config;
use crate::sim::{self, RunningSim, SimOptions};

/// Arguments of `warmpath demo`.
#[derive(Debug, Clone, clap::Args)]
pub struct DemoArgs {
    /// How long sessions keep arriving, per strategy (the run then waits for their last turns).
    #[arg(long, default_value = "12s", value_parser = parse_duration)]
    pub duration: Duration,
    /// New sessions per second.
    #[arg(long, default_value_t = 4.0)]
    pub rate: f64,
    /// Turns per session.
    #[arg(long, default_value_t = 4)]
    pub turns: u32,
    /// Words of context in each session's first turn (a pasted document; the system prompt of
    /// 512 words is shared by all sessions).
    #[arg(long, default_value_t = 12000)]
    pub context_words: u32,
    /// Simulated seconds per real second in the engines (below 1: slower than the modelled
    /// GPU, so fewer requests saturate them and the machine has room for everything else).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Where to write the report (created; default `warmpath-demo/` in the current directory).
    #[arg(long, value_name = "DIR", default_value = "warmpath-demo")]
    pub out: PathBuf,
    /// The router's backend choice under session-boost: `prefix-cost` (S16: where the prompt's
    /// prefix is cached, which follows sessions too) or `session-affinity` (S7). The fifo
    /// baseline always routes to the least-loaded engine.
    #[arg(long, default_value = "prefix-cost", value_parser = ["prefix-cost", "session-affinity", "least-inflight", "round-robin"])]
    pub routing: String,
    /// Seed of the workload and the engines.
    #[arg(long, default_value_t = 7)]
    pub seed: u64,
    /// No progress bars.
    #[arg(long)]
    pub no_progress: bool,
}

fn parse_duration(text: &str) -> Result<Duration, String> {
    crate::config::duration::parse_duration(text).map_err(|e| e.to_string())
}

/// The model name the engines serve and the router routes.
const MODEL: &str = "sim-8b";

/// Runs the demo; prints the table and where the report went.
pub fn run(args: &DemoArgs) -> ExitCode {
    match demo(args) {
        Ok(dir) => {
            println!("report: {}", dir.join("report.md").display());
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("error: demo: {error}");
            ExitCode::FAILURE
        }
    }
}

/// The whole demo: both strategies, the table, the report. Returns the report's folder.
pub fn demo(args: &DemoArgs) -> io::Result<PathBuf> {
    let workload = MultiTurn {
        rate: args.rate,
        duration: args.duration,
        turns: args.turns,
        context_words: args.context_words,
        seed: args.seed,
        ..MultiTurn::default()
    }
    .workload();
    let mut results = Vec::with_capacity(2);
    // The baseline is what a plain load balancer does: arrival order, least-loaded engine.
    for (strategy, routing) in
        [("fifo", "least-inflight"), ("session-boost", args.routing.as_str())]
    {
        eprintln!(
            "demo: {strategy} + {routing}: two engines, the router, {} sessions",
            workload.sessions.len()
        );
        results.push(run_strategy(args, strategy, routing, &workload)?);
    }
    let table = bench::table(&results);
    println!("{table}");
    println!("{}", comparison(&results[0], &results[1]));
    write_report(&args.out, args, &results, &table)?;
    Ok(args.out.clone())
}

/// One strategy on fresh engines and a fresh router.
fn run_strategy(
    args: &DemoArgs,
    strategy: &str,
    routing: &str,
    workload: &bench::Workload,
) -> io::Result<BenchResult> {
    let engines = start_engines(args)?;
    let addrs: Vec<String> = engines.iter().map(|e| e.addr().to_string()).collect();
    let config = router_config(strategy, routing, &addrs)?;
    let router = crate::server::start(config, crate::clock::Clock::real())?;
    let options = RunOptions {
        model: MODEL.into(),
        label: format!("{strategy}/{routing}"),
        engine_metrics: addrs.iter().map(|a| format!("http://{a}/metrics")).collect(),
        progress: !args.no_progress,
        ..RunOptions::default()
    };
    let result = bench::run_workload(&format!("http://{}", router.addr()), workload, &options);
    router.shutdown();
    router.wait();
    for engine in engines {
        engine.stop();
    }
    result
}

fn start_engines(args: &DemoArgs) -> io::Result<Vec<RunningSim>> {
    (0..2u64)
        .map(|i| {
            sim::start(SimOptions {
                model: MODEL.into(),
                time_scale: args.time_scale,
                seed: args.seed + i,
                ..SimOptions::default()
            })
        })
        .collect()
}

/// The router's configuration: loopback, one shard, fast scrapes, the strategy under test.
fn router_config(strategy: &str, routing: &str, backends: &[String]) -> io::Result<Config> {
    let backends: Vec<String> = backends.iter().map(|b| format!("{b:?}")).collect();
    let text = format!(
        r#"[server]
listen = "127.0.0.1:0"
admin_listen = "127.0.0.1:0"
shards = 1
pin_cores = false

[queue]
strategy = "{strategy}"

[upstream]
metrics_interval = "100ms"

[[model]]
name = "{MODEL}"
engine = "vllm"
routing = "{routing}"
backends = [{}]
"#,
        backends.join(", ")
    );
    Config::from_toml_str(&text)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))
}

/// Follow-up TTFT p50 and p99, first-turn TTFT p50, hit rate: session-boost against fifo.
fn comparison(fifo: &BenchResult, boost: &BenchResult) -> String {
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "n/a".into(),
    };
    let p = |r: &BenchResult, follow: bool, q: fn(&bench::Percentiles) -> f64| {
        let phase = if follow { &r.follow_ups } else { &r.first_turns };
        phase.ttft_ms.as_ref().map(q)
    };
    let hit = |r: &BenchResult| r.prefix_cache.as_ref().and_then(|c| c.hit_rate);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fifo / session-boost: follow-up TTFT p50 {}, p99 {}; first-turn TTFT p50 {}",
        ratio(p(fifo, true, |x| x.p50), p(boost, true, |x| x.p50)),
        ratio(p(fifo, true, |x| x.p99), p(boost, true, |x| x.p99)),
        ratio(p(fifo, false, |x| x.p50), p(boost, false, |x| x.p50)),
    );
    let _ = write!(
        out,
        "prefix-cache hit rate: fifo {}, session-boost {}",
        hit(fifo).map_or("n/a".into(), |h| format!("{:.1} %", h * 100.0)),
        hit(boost).map_or("n/a".into(), |h| format!("{:.1} %", h * 100.0)),
    );
    out
}

fn write_report(
    dir: &Path,
    args: &DemoArgs,
    results: &[BenchResult],
    table: &str,
) -> io::Result<()> {
    bench::write_report(dir, results, "ttft.svg")?;
    let mut md = String::new();
    let _ = writeln!(md, "# warmpath demo\n");
    let _ = writeln!(
        md,
        "Two simulated engines (`warmpath sim`, profile h100-8b, time scale {}) behind warmpath \
         (one shard); the same multi-turn workload ({} sessions per second for {:?}, {} turns \
         each, {} words of context in each first turn, seed {}) run twice, each time on fresh \
         engines: as a plain load balancer would (`fifo`, least-inflight routing) and as \
         warmpath does (`session-boost`, {} routing).\n",
        args.time_scale,
        args.rate,
        args.duration,
        args.turns,
        args.context_words,
        args.seed,
        args.routing
    );
    let _ = writeln!(md, "```\n{table}\n```\n");
    let _ = writeln!(md, "{}\n", comparison(&results[0], &results[1]));
    for result in results {
        let errors: u64 = result.errors.values().sum();
        let _ = writeln!(
            md,
            "- `{}`: {:.2} requests/s, {} errors, {} of {} turns not sent; raw data in `{}.json`",
            result.label,
            result.requests_per_s,
            errors,
            result.not_sent,
            result.planned,
            bench::report::file_stem(&result.label)
        );
    }
    let _ = writeln!(md, "\n![TTFT distribution](ttft.svg)");
    std::fs::write(dir.join("report.md"), md)
}
