//! `warmpath bench`: the workload driver of SPEC section 8.
//!
//! It sends multi-turn chat sessions to any OpenAI-compatible URL (warmpath, a peer router, an
//! engine directly) and measures what a user of that URL sees:
//! - [`workload`]: what is sent: sessions of turns, each with its earliest send time, the turn
//!   it waits for, a think time, `max_tokens`, and a prompt rendered when sent (a follow-up's
//!   prompt textually extends its predecessor's, so prefix caches hit as in the trace).
//! - [`synthetic`]: the `multiturn` workload (Poisson arrivals, fixed turns, a shared system
//!   prompt, exponential think times), deterministic for a seed.
//! - [`trace`]: replays of the traces in `data/`: Mooncake with sessions derived from
//!   prefix-block links as its README says, RAGPulse with its own sessions, both
//!   time-compressed.
//! - [`client`]: the load generator: one thread, one mio loop, keep-alive connections,
//!   streaming chat completions; follow-ups wait for their predecessor and their think time.
//! - [`fixed_rate`]: the `fixed-rate` workload: one small request sent at exact intended
//!   times (constant or Poisson), open loop, latency measured from the intended time
//!   (coordinated omission corrected), the generator's send lag reported.
//! - [`pool`]: the keep-alive connections and response parsing both drivers share.
//! - [`engines`]: the engines' prefix-cache counters from their `/metrics`.
//! - [`report`]: nearest-rank p50/p90/p99 of TTFT, inter-token and end-to-end latency for first
//!   turns and follow-ups, throughput, errors by status; a table, JSON and SVG plots; for
//!   paced runs p50/p90/p99/p99.9/max in microseconds.
//!
//! Decisions (where SPEC 8 is silent):
//! - Tokens are words: a trace token becomes one whitespace-separated word (the simulated
//!   engine's tokeniser); words come from a 128-word English vocabulary so a real tokenizer
//!   reads about one token each too.
//! - `--duration` bounds when requests *start* (turns whose offset is past it are dropped, and
//!   with them their follow-ups); requests already planned run to completion. For `multiturn`
//!   it is the window over which sessions arrive, so every session runs all its turns.
//! - `--time-scale` defaults to 1 for Mooncake (about 17 minutes) and 1000 for RAGPulse (its 7
//!   days in about 10 minutes).
//! - A follow-up is sent after its predecessor ended whatever the outcome (an error does not
//!   end a conversation); it is not sent before its own offset (traces) or before its
//!   predecessor's end plus its think time (synthetic).
//! - Requests in flight are bounded (`--max-inflight`, default 256): a due turn beyond that
//!   waits, and is measured from when it was sent.
//! - Only plain `http://` targets (the fleets this measures are on a private network).

pub mod client;
pub mod engines;
pub mod fixed_rate;
pub mod load;
mod pool;
pub mod report;
pub mod synthetic;
pub mod trace;
pub mod workload;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressStyle};

use crate::clock::Clock;
use crate::config::duration::parse_duration;

pub use client::Target;
pub use fixed_rate::{run_fixed_rate, Arrivals, FixedRate};
pub use report::{
    plot_ttft, rate_table, table, write_json, write_report, BenchResult, Percentiles, RateResult,
    RateSample, Sample, Tail,
};
pub use synthetic::MultiTurn;
pub use workload::{Message, Prompt, Session, Turn, Workload};

/// Which workload `warmpath bench` runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum WorkloadKind {
    /// Synthetic multi-turn chat sessions.
    Multiturn,
    /// A replay of the Mooncake trace with derived sessions.
    Mooncake,
    /// A replay of the RAGPulse trace.
    Ragpulse,
    /// One small chat request at `--rate` per second for `--duration`, open loop (paced:
    /// latency from each request's intended send time).
    FixedRate,
}

/// Arguments of `warmpath bench`.
#[derive(Debug, Clone, clap::Args)]
pub struct BenchArgs {
    /// Base URL of an OpenAI-compatible server, e.g. `http://127.0.0.1:8080` (requests go to
    /// `/v1/chat/completions` under it).
    #[arg(long, value_name = "URL")]
    pub target: String,
    /// The `model` of every request.
    #[arg(long, value_name = "NAME", default_value = "default")]
    pub model: String,
    /// The workload.
    #[arg(long, value_enum, default_value = "multiturn")]
    pub workload: WorkloadKind,
    /// Directory holding the traces, each as NAME.jsonl or NAME.jsonl.gz [default:
    /// $WARMPATH_DATA_DIR, else data/ in the source tree this binary was built from, else
    /// data/ beside the binary].
    #[arg(long, value_name = "DIR")]
    pub trace_dir: Option<PathBuf>,
    /// Trace time compression: trace seconds per second of replay [default: 1 for mooncake,
    /// 1000 for ragpulse].
    #[arg(long, value_name = "FACTOR")]
    pub time_scale: Option<f64>,
    /// Replay a trace, or run multiturn, at this fraction of the capacity of simulated engines
    /// (`warmpath sim`) instead of `--time-scale`: needs `--engine-profile`, one per engine
    /// (see `src/bench/load.rs` for what capacity means). Multiturn's arrivals and think
    /// times are compressed alike.
    #[arg(long, value_name = "FRACTION", conflicts_with = "time_scale")]
    pub load: Option<f64>,
    /// With `--load`: the profile of each engine behind the target, in order (repeat it per
    /// engine; `warmpath sim --profile list` names them).
    #[arg(long = "engine-profile", value_name = "NAME", requires = "load")]
    pub engine_profiles: Vec<String>,
    /// With `--load`: the engines' `--time-scale` (simulated seconds per real second).
    #[arg(long, value_name = "FACTOR", default_value_t = 1.0, requires = "load")]
    pub sim_scale: f64,
    /// Only requests starting within this time (e.g. `60s`); for multiturn the window over
    /// which sessions arrive, for fixed-rate the window of send times [default: 30s for
    /// multiturn, 10s for fixed-rate, the whole trace otherwise].
    #[arg(long, value_name = "DURATION", value_parser = parse_duration)]
    pub duration: Option<Duration>,
    /// At most this many requests (the earliest).
    #[arg(long, value_name = "N")]
    pub max_requests: Option<usize>,
    /// multiturn: new sessions per second; fixed-rate: requests per second.
    #[arg(long, default_value_t = 2.0)]
    pub rate: f64,
    /// fixed-rate: send times evenly spaced (`constant`) or a Poisson process (`poisson`,
    /// seeded by `--seed`).
    #[arg(long, value_enum, default_value = "constant")]
    pub arrivals: Arrivals,
    /// fixed-rate: keep-alive connections opened before the first send; a send finding them
    /// all busy opens another, up to `--max-inflight`, and beyond that waits (a late send).
    #[arg(long, value_name = "N", default_value_t = 16)]
    pub connections: usize,
    /// fixed-rate: the request body: `small` (perf/proxy_compare.sh's small chat request,
    /// with `--model`) or a file sent as is.
    #[arg(long, value_name = "small|FILE", default_value = "small")]
    pub body: String,
    /// fixed-rate: with `--body small`, ask for a streamed response (`"stream": true`); TTFB
    /// is reported.
    #[arg(long)]
    pub stream: bool,
    /// multiturn: turns per session.
    #[arg(long, default_value_t = 4)]
    pub turns: u32,
    /// multiturn: words of the system prompt shared by all sessions.
    #[arg(long, default_value_t = 512)]
    pub system_words: u32,
    /// multiturn: words of context in a session's first turn.
    #[arg(long, default_value_t = 2000)]
    pub context_words: u32,
    /// multiturn: words of the user's message in each turn.
    #[arg(long, default_value_t = 100)]
    pub new_words: u32,
    /// multiturn: `max_tokens` of each turn.
    #[arg(long, default_value_t = 100)]
    pub answer_tokens: u32,
    /// multiturn: mean think time between turns, in milliseconds (exponential; 0: none).
    #[arg(long, default_value_t = 2000)]
    pub think_ms: u64,
    /// The session header.
    #[arg(long, value_name = "NAME", default_value = "X-Session-ID")]
    pub session_header: String,
    /// An engine's metrics URL (e.g. `http://127.0.0.1:8001/metrics`) for the prefix-cache hit
    /// rate; repeatable.
    #[arg(long = "engine-metrics", value_name = "URL")]
    pub engine_metrics: Vec<String>,
    /// Directory for the JSON result and the SVG plot.
    #[arg(long, value_name = "DIR", default_value = "bench-results")]
    pub out: PathBuf,
    /// Seed of the synthetic workload.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Label of this run in the table, file names and plots [default: the workload's name].
    #[arg(long)]
    pub label: Option<String>,
    /// Requests in flight at most (fixed-rate: connections open at most).
    #[arg(long, default_value_t = 256)]
    pub max_inflight: usize,
    /// A request not finished after this long fails as `timeout`.
    #[arg(long, value_name = "DURATION", value_parser = parse_duration, default_value = "300s")]
    pub request_timeout: Duration,
    /// Add `"ignore_eos": true` (vLLM: generate exactly `max_tokens`).
    #[arg(long)]
    pub ignore_eos: bool,
    /// No progress bar.
    #[arg(long)]
    pub no_progress: bool,
    /// Send no session identity (no session header): the router must derive sessions from the
    /// prompts (issue 10, `derive_sessions`), as it must for clients that send none.
    #[arg(long)]
    pub anonymous: bool,
    /// multiturn, trace: ask for whole responses (no `"stream": true`), as the OpenAI SDKs do
    /// by default; the time to the first token is then the time to the whole response.
    /// `--no-stream=PERCENT`: only that share of the sessions does (chosen by a hash of the
    /// session's index, the same ones every run), the others stream: a fleet whose clients mix
    /// both. Each request's JSON sample says which it asked for (`stream`).
    #[arg(
        long,
        value_name = "PERCENT",
        num_args = 0..=1,
        require_equals = true,
        default_missing_value = "100",
        value_parser = clap::value_parser!(u8).range(0..=100)
    )]
    pub no_stream: Option<u8>,
    /// An API key sent as `Authorization: Bearer KEY` on every request (the tenants of issue 11;
    /// run one bench per tenant to load several). Also read from `$WARMPATH_API_KEY`.
    #[arg(long, value_name = "KEY", env = "WARMPATH_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
}

/// How [`run_workload`] sends and what it scrapes.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// The `model` of every request.
    pub model: String,
    /// The session header's name.
    pub session_header: String,
    /// The label of the result.
    pub label: String,
    /// Requests in flight at most.
    pub max_inflight: usize,
    /// A request not finished after this long fails as `timeout`.
    pub request_timeout: Duration,
    /// Stop sending after this long from the start (requests in flight finish); None: send
    /// everything.
    pub stop_after: Option<Duration>,
    /// Engines' metrics URLs, scraped before and after for the prefix-cache hit rate.
    pub engine_metrics: Vec<String>,
    /// Show a progress bar on standard error.
    pub progress: bool,
    /// Add `"ignore_eos": true` to requests.
    pub ignore_eos: bool,
    /// Send no session header.
    pub anonymous: bool,
    /// The share of sessions, in percent, that ask for whole responses instead of streams
    /// ([`workload::session_streams`]; 0: every request streams).
    pub unstreamed_percent: u8,
    /// Sent as `Authorization: Bearer KEY` on every request.
    pub api_key: Option<String>,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            model: "default".into(),
            session_header: "X-Session-ID".into(),
            label: "bench".into(),
            max_inflight: 256,
            request_timeout: Duration::from_secs(300),
            stop_after: None,
            engine_metrics: Vec::new(),
            progress: false,
            ignore_eos: false,
            anonymous: false,
            unstreamed_percent: 0,
            api_key: None,
        }
    }
}

/// Runs `workload` against `target` (`http://host:port[/prefix]`) and summarises it.
pub fn run_workload(
    target: &str,
    workload: &Workload,
    options: &RunOptions,
) -> std::io::Result<BenchResult> {
    assert!(options.max_inflight > 0, "max_inflight must be positive");
    let target = Target::parse(target)?;
    let clock = Clock::real();
    let mut notes = Vec::new();
    let before = scrape(&options.engine_metrics, &clock, &mut notes);
    let planned = workload.requests() as u64;
    let progress = if options.progress {
        let bar = ProgressBar::new(planned);
        let style = ProgressStyle::with_template(
            "{spinner} [{elapsed_precise}] {wide_bar} {pos}/{len} requests ({per_sec})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar());
        bar.set_style(style);
        bar
    } else {
        ProgressBar::hidden()
    };
    let (samples, elapsed) = client::drive(&target, workload, options, &progress)?;
    progress.finish_and_clear();
    let after = scrape(&options.engine_metrics, &clock, &mut notes);
    let mut result = BenchResult::summarise(
        &options.label,
        &workload.name,
        &target.url,
        planned,
        elapsed,
        samples,
    );
    if let (Some(b), Some(a)) = (before, after) {
        let (hits, queries) = (a.hits - b.hits, a.queries - b.queries);
        let hit_rate = (queries > 0.0).then(|| hits / queries);
        let utilisation = b
            .busy
            .zip(a.busy)
            .and_then(|((busy0, t0), (busy1, t1))| (t1 > t0).then(|| (busy1 - busy0) / (t1 - t0)));
        result.prefix_cache = Some(report::PrefixCache { hits, queries, hit_rate, utilisation });
    }
    result.notes = notes;
    Ok(result)
}

fn scrape(urls: &[String], clock: &Clock, notes: &mut Vec<String>) -> Option<engines::Counters> {
    if urls.is_empty() {
        return None;
    }
    engines::scrape_all(urls, clock).map_err(|e| notes.push(format!("metrics: {e}"))).ok()
}

/// The workload `args` describe.
pub fn build_workload(args: &BenchArgs) -> std::io::Result<Workload> {
    let mut workload = match args.workload {
        WorkloadKind::Multiturn => MultiTurn {
            rate: args.rate,
            duration: args.duration.unwrap_or(Duration::from_secs(30)),
            turns: args.turns,
            system_words: args.system_words,
            context_words: args.context_words,
            new_words: args.new_words,
            answer_tokens: args.answer_tokens,
            think_mean: Duration::from_millis(args.think_ms),
            seed: args.seed,
        }
        .workload(),
        WorkloadKind::Mooncake => {
            let rows = trace::read_mooncake(&trace_path(args, trace::MOONCAKE_FILE)?)?;
            let scale = if args.load.is_some() { 1.0 } else { args.time_scale.unwrap_or(1.0) };
            trace::mooncake(&rows, scale)
        }
        WorkloadKind::Ragpulse => {
            let rows = trace::read_ragpulse(&trace_path(args, trace::RAGPULSE_FILE)?)?;
            let scale = if args.load.is_some() { 1.0 } else { args.time_scale.unwrap_or(1000.0) };
            trace::ragpulse(&rows, scale)
        }
        WorkloadKind::FixedRate => {
            return Err(std::io::Error::new(
                std::io::ErrorKind::InvalidInput,
                "fixed-rate sends no sessions: see bench::fixed_rate_plan",
            ))
        }
    };
    if let Some(target) = args.load {
        let profiles = args
            .engine_profiles
            .iter()
            .map(|name| {
                crate::sim::profile(name).ok_or_else(|| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidInput,
                        format!("--engine-profile {name:?}: no such profile"),
                    )
                })
            })
            .collect::<std::io::Result<Vec<_>>>()?;
        let scale = load::compression_for(&workload, &profiles, target) * args.sim_scale;
        workload.compress(scale);
    }
    // A multiturn workload's duration is the window its sessions arrived in before any
    // compression; all of it is sent.
    let window = if args.workload == WorkloadKind::Multiturn { None } else { args.duration };
    workload.truncate(args.max_requests, window);
    Ok(workload)
}

/// The trace `name` in `--trace-dir`, else in [`trace::data_dir`].
fn trace_path(args: &BenchArgs, name: &str) -> std::io::Result<PathBuf> {
    let dir = match &args.trace_dir {
        Some(dir) => dir.clone(),
        None => trace::data_dir()?,
    };
    trace::trace_file(&dir, name)
}

fn check(args: &BenchArgs) -> Result<(), String> {
    let scale_ok = args.time_scale.is_none_or(|s| s.is_finite() && s > 0.0);
    let load_ok = args.load.is_none_or(|l| l.is_finite() && l > 0.0);
    match () {
        _ if !scale_ok => Err("--time-scale must be a positive number".into()),
        _ if !load_ok => Err("--load must be a positive number".into()),
        _ if args.load.is_some() && args.engine_profiles.is_empty() => {
            Err("--load needs --engine-profile, once per engine behind the target".into())
        }
        _ if args.load.is_some() && args.workload == WorkloadKind::FixedRate => {
            Err("--load applies to trace replays and multiturn, not to fixed-rate".into())
        }
        _ if !(args.sim_scale.is_finite() && args.sim_scale > 0.0) => {
            Err("--sim-scale must be a positive number".into())
        }
        _ if !(args.rate.is_finite() && args.rate > 0.0) => Err("--rate must be positive".into()),
        _ if args.turns == 0 => Err("--turns must be at least 1".into()),
        _ if args.max_inflight == 0 => Err("--max-inflight must be at least 1".into()),
        _ if !args.api_key.as_deref().is_none_or(key_ok) => Err(
            "--api-key must be 1 to 512 visible ASCII characters without spaces (a bearer token)"
                .into(),
        ),
        _ => Ok(()),
    }
}

/// Whether `key` can go into an `Authorization: Bearer` line as is: visible ASCII, no space,
/// at most 512 bytes (so it cannot end the line or add a header).
fn key_ok(key: &str) -> bool {
    !key.is_empty() && key.len() <= 512 && key.bytes().all(|b| b.is_ascii_graphic())
}

/// Requests a paced run may plan at most (`--rate` × `--duration`): its samples are kept in
/// memory, about 80 bytes each.
pub const FIXED_RATE_REQUESTS_MAX: f64 = 10_000_000.0;

/// The paced run `args` describe (`--workload fixed-rate`); `Err` names a bad argument.
pub fn fixed_rate_plan(args: &BenchArgs) -> Result<FixedRate, String> {
    let duration = args.duration.unwrap_or(Duration::from_secs(10));
    let body = match args.body.as_str() {
        "small" => fixed_rate::small_body(&args.model, args.stream),
        _ if args.stream => {
            return Err("--stream applies to --body small (a file is sent as it is)".into())
        }
        path => std::fs::read(path).map_err(|e| format!("--body {path}: {e}"))?,
    };
    let plan = FixedRate {
        rate: args.rate,
        duration,
        arrivals: args.arrivals,
        seed: args.seed,
        connections: args.connections,
        connections_max: args.max_inflight,
        body,
        request_timeout: args.request_timeout,
        label: args.label.clone().unwrap_or_else(|| "fixed-rate".into()),
        api_key: args.api_key.clone(),
    };
    match () {
        _ if duration.is_zero() => Err("--duration must be positive".into()),
        _ if args.connections == 0 => Err("--connections must be at least 1".into()),
        _ if args.connections > args.max_inflight => {
            Err("--connections must be at most --max-inflight (the bound on connections)".into())
        }
        _ if plan.expected() > FIXED_RATE_REQUESTS_MAX => Err(format!(
            "--rate x --duration plans {:.0} requests, over {FIXED_RATE_REQUESTS_MAX:.0}",
            plan.expected()
        )),
        _ => Ok(plan),
    }
}

/// `warmpath bench --workload fixed-rate` once the arguments are checked.
fn run_paced(args: &BenchArgs) -> ExitCode {
    let plan = match fixed_rate_plan(args) {
        Ok(plan) => plan,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    eprintln!(
        "{}: {} arrivals at {} req/s for {:?} to {} ({} connections, at most {})",
        plan.label,
        plan.arrivals.name(),
        plan.rate,
        plan.duration,
        args.target,
        plan.connections,
        plan.connections_max
    );
    let result = match run_fixed_rate(&args.target, &plan) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    print!("{}", rate_table(std::slice::from_ref(&result)));
    match report::write_rate_json(&args.out, &result) {
        Ok(path) => eprintln!("wrote {}", path.display()),
        Err(e) => {
            eprintln!("error: writing the report into {}: {e}", args.out.display());
            return ExitCode::from(1);
        }
    }
    if result.ok == 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}

/// `warmpath bench`: builds the workload, runs it, prints the table, writes JSON and SVG into
/// `--out` (a paced `fixed-rate` run: the table and JSON). Exit code 0 when at least one
/// request succeeded, 1 when none did or the run could not start, 2 on a bad argument.
pub fn run(args: &BenchArgs) -> ExitCode {
    if let Err(e) = check(args) {
        eprintln!("error: {e}");
        return ExitCode::from(2);
    }
    if args.workload == WorkloadKind::FixedRate {
        return run_paced(args);
    }
    let workload = match build_workload(args) {
        Ok(w) => w,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    let label = args.label.clone().unwrap_or_else(|| workload.name.clone());
    eprintln!(
        "{label}: {} sessions, {} requests ({} follow-ups) to {}",
        workload.sessions.len(),
        workload.requests(),
        workload.follow_ups(),
        args.target
    );
    let options = RunOptions {
        model: args.model.clone(),
        session_header: args.session_header.clone(),
        label,
        max_inflight: args.max_inflight,
        request_timeout: args.request_timeout,
        stop_after: None,
        engine_metrics: args.engine_metrics.clone(),
        progress: !args.no_progress,
        ignore_eos: args.ignore_eos,
        anonymous: args.anonymous,
        unstreamed_percent: args.no_stream.unwrap_or(0),
        api_key: args.api_key.clone(),
    };
    let result = match run_workload(&args.target, &workload, &options) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(1);
        }
    };
    print!("{}", table(std::slice::from_ref(&result)));
    let plot = format!("{}-ttft.svg", report::file_stem(&result.label));
    match write_report(&args.out, std::slice::from_ref(&result), &plot) {
        Ok(paths) => {
            for p in paths {
                eprintln!("wrote {}", p.display());
            }
        }
        Err(e) => {
            eprintln!("error: writing the report into {}: {e}", args.out.display());
            return ExitCode::from(1);
        }
    }
    if result.all.ok == 0 {
        ExitCode::from(1)
    } else {
        ExitCode::SUCCESS
    }
}
