//! What a run found: per-request [`Sample`]s summarised into a [`BenchResult`], printed as a
//! table, written as JSON, and plotted as SVG.
//!
//! Percentiles are **nearest-rank** (the smallest observed value with at least p % of the
//! observations at or below it: rank ⌈p/100 · n⌉ of the sorted values), so every reported
//! percentile is a latency some request really had, and p99 of fewer than 100 requests is the
//! maximum. First turns and follow-ups are summarised separately (a follow-up is a turn that
//! waited for an earlier turn of its session), each over the requests that succeeded (2xx and a
//! complete stream); failures are counted by status in `errors` (`io`, `timeout` and `protocol`
//! for requests with no usable HTTP status). Inter-token latency is per request the mean gap
//! between its content chunks (requests with fewer than two chunks have none), then
//! summarised over requests. The prefix-cache hit rate is the ratio of the increases of
//! `vllm:prefix_cache_hits_total` and `vllm:prefix_cache_queries_total` (both in tokens),
//! summed over the engines scraped before and after the run.
//!
//! Plots: [`plot_ttft`] draws, for one or several labelled results (the configurations a
//! `warmpath demo` compares), the empirical CDF of TTFT, first turns and follow-ups side by
//! side, with plotters' SVG backend (no font files needed: SVG text is laid out by the viewer).

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::path::{Path, PathBuf};

use plotters::prelude::*;
use serde::Serialize;

use crate::scheduler::tracker::{turn_bucket, TURN_BUCKETS};

/// One request as measured.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Sample {
    /// Index of the session in the workload.
    pub session: u32,
    /// Index of the turn in its session.
    pub turn: u32,
    /// Whether it waited for an earlier turn.
    pub follow_up: bool,
    /// Whether it asked for a streamed response (else its `ttft_ms` is the whole response's).
    pub stream: bool,
    /// HTTP status; 0 when there was none (connection error, timeout, malformed response).
    pub status: u16,
    /// `io`, `timeout` or `protocol` when `status` is 0, or when the stream broke off.
    pub failure: Option<&'static str>,
    /// Milliseconds from the start of the run to sending.
    pub sent_ms: f64,
    /// Time to the first content chunk, ms.
    pub ttft_ms: Option<f64>,
    /// Mean gap between content chunks, ms.
    pub itl_ms: Option<f64>,
    /// Sending to the end of the response, ms.
    pub e2e_ms: f64,
    /// Output tokens (the usage chunk's `completion_tokens`, else content chunks).
    pub output_tokens: u32,
}

impl Sample {
    /// A 2xx with a complete body.
    pub fn ok(&self) -> bool {
        self.failure.is_none() && (200..300).contains(&self.status)
    }

    fn error_key(&self) -> String {
        match self.failure {
            Some(kind) if self.status == 0 => kind.to_owned(),
            Some(kind) => format!("{}-{kind}", self.status),
            None => self.status.to_string(),
        }
    }
}

/// p50, p90, p99 (nearest rank) and the mean, in milliseconds.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Percentiles {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

/// The nearest-rank `p`-th percentile (0 < p ≤ 100) of `sorted` (ascending, not empty).
pub fn percentile(sorted: &[f64], p: f64) -> f64 {
    assert!(!sorted.is_empty() && p > 0.0 && p <= 100.0);
    // A tolerance absorbs the binary rounding of p (99.9 % of 1000 is 999.0000000000001).
    let exact = p / 100.0 * sorted.len() as f64;
    let rank = (exact * (1.0 - 1e-12)).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

impl Percentiles {
    /// Summary of `values` (any order); None when empty.
    pub fn of(values: &[f64]) -> Option<Percentiles> {
        if values.is_empty() {
            return None;
        }
        let mut sorted = values.to_vec();
        sorted.sort_by(f64::total_cmp);
        Some(Percentiles {
            p50: percentile(&sorted, 50.0),
            p90: percentile(&sorted, 90.0),
            p99: percentile(&sorted, 99.0),
            mean: sorted.iter().sum::<f64>() / sorted.len() as f64,
        })
    }
}

/// Latencies of one kind of turn.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Phase {
    /// Requests sent.
    pub requests: u64,
    /// Requests that succeeded.
    pub ok: u64,
    /// Time to first token of successful requests.
    pub ttft_ms: Option<Percentiles>,
    /// Inter-token latency of successful requests.
    pub itl_ms: Option<Percentiles>,
    /// End-to-end latency of successful requests.
    pub e2e_ms: Option<Percentiles>,
}

impl Phase {
    fn of<'a>(samples: impl Iterator<Item = &'a Sample>) -> Phase {
        let (mut requests, mut ttft, mut itl, mut e2e) = (0, Vec::new(), Vec::new(), Vec::new());
        for s in samples {
            requests += 1;
            if s.ok() {
                ttft.extend(s.ttft_ms);
                itl.extend(s.itl_ms);
                e2e.push(s.e2e_ms);
            }
        }
        Phase {
            requests,
            ok: e2e.len() as u64,
            ttft_ms: Percentiles::of(&ttft),
            itl_ms: Percentiles::of(&itl),
            e2e_ms: Percentiles::of(&e2e),
        }
    }
}

/// Time to first token of the requests of one turn-depth bucket (issue \[10\]: the buckets of
/// the router's `warmpath_ttft_seconds`, so the two can be read side by side).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct TurnDepth {
    /// `1`, `2`, `3-4`, `5-8` or `9+`: the depth of a turn is its index in its session plus
    /// one, as the router counts a session's requests.
    pub turn: &'static str,
    /// Requests sent.
    pub requests: u64,
    /// Requests that succeeded.
    pub ok: u64,
    /// Time to first token of successful requests.
    pub ttft_ms: Option<Percentiles>,
}

impl TurnDepth {
    /// One entry per bucket, in order, each over the samples of its depth.
    fn of(samples: &[Sample]) -> Vec<TurnDepth> {
        let depth = |s: &Sample| turn_bucket(u16::try_from(s.turn + 1).unwrap_or(u16::MAX));
        (0..TURN_BUCKETS.len())
            .map(|bucket| {
                let phase = Phase::of(samples.iter().filter(|s| depth(s) == bucket));
                TurnDepth {
                    turn: TURN_BUCKETS[bucket],
                    requests: phase.requests,
                    ok: phase.ok,
                    ttft_ms: phase.ttft_ms,
                }
            })
            .collect()
    }
}

/// Engines' prefix-cache counters over the run.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct PrefixCache {
    /// Increase of `vllm:prefix_cache_hits_total`, summed over engines.
    pub hits: f64,
    /// Increase of `vllm:prefix_cache_queries_total`, summed over engines.
    pub queries: f64,
    /// hits / queries (None when nothing was queried).
    pub hit_rate: Option<f64>,
    /// The engines' mean utilisation over the run: busy simulated seconds over elapsed
    /// simulated seconds, summed over engines (simulated engines only; None for others).
    pub utilisation: Option<f64>,
}

/// Everything a run found.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct BenchResult {
    /// The label of this run (e.g. the configuration).
    pub label: String,
    /// The workload's name.
    pub workload: String,
    /// The URL requests went to.
    pub target: String,
    /// Seconds from the start to the last response.
    pub elapsed_s: f64,
    /// Turns in the workload.
    pub planned: u64,
    /// Turns not sent (`stop_after` passed before they were due).
    pub not_sent: u64,
    /// First turns.
    pub first_turns: Phase,
    /// Follow-up turns.
    pub follow_ups: Phase,
    /// All turns.
    pub all: Phase,
    /// Time to first token by turn depth (1, 2, 3-4, 5-8, 9+).
    pub by_turn: Vec<TurnDepth>,
    /// Successful requests per second.
    pub requests_per_s: f64,
    /// Output tokens of successful requests per second.
    pub output_tokens_per_s: f64,
    /// Failed requests by status (or failure kind).
    pub errors: BTreeMap<String, u64>,
    /// The engines' prefix-cache hit rate over the run, when engines were scraped.
    pub prefix_cache: Option<PrefixCache>,
    /// Warnings (e.g. a metrics scrape that failed).
    pub notes: Vec<String>,
    /// Every request.
    pub samples: Vec<Sample>,
}

impl BenchResult {
    /// Summarises `samples` of a run that took `elapsed_s` seconds.
    pub fn summarise(
        label: &str,
        workload: &str,
        target: &str,
        planned: u64,
        elapsed_s: f64,
        samples: Vec<Sample>,
    ) -> BenchResult {
        let mut errors = BTreeMap::new();
        let (mut ok, mut tokens) = (0u64, 0u64);
        for s in &samples {
            if s.ok() {
                ok += 1;
                tokens += u64::from(s.output_tokens);
            } else {
                *errors.entry(s.error_key()).or_insert(0) += 1;
            }
        }
        let per_s = |n: u64| if elapsed_s > 0.0 { n as f64 / elapsed_s } else { 0.0 };
        BenchResult {
            label: label.to_owned(),
            workload: workload.to_owned(),
            target: target.to_owned(),
            elapsed_s,
            planned,
            not_sent: planned.saturating_sub(samples.len() as u64),
            first_turns: Phase::of(samples.iter().filter(|s| !s.follow_up)),
            follow_ups: Phase::of(samples.iter().filter(|s| s.follow_up)),
            all: Phase::of(samples.iter()),
            by_turn: TurnDepth::of(&samples),
            requests_per_s: per_s(ok),
            output_tokens_per_s: per_s(tokens),
            errors,
            prefix_cache: None,
            notes: Vec::new(),
            samples,
        }
    }
}

fn cell(p: Option<Percentiles>) -> String {
    match p {
        Some(p) => format!("{:>8.1} {:>8.1} {:>8.1}", p.p50, p.p90, p.p99),
        None => format!("{:>8} {:>8} {:>8}", "-", "-", "-"),
    }
}

/// The terminal table of one or several results.
pub fn table(results: &[BenchResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:<10} {:>6} {:>6} | {:^26} | {:^26} | {:^26}",
        "label",
        "turns",
        "sent",
        "ok",
        "TTFT ms p50 p90 p99",
        "ITL ms p50 p90 p99",
        "E2E ms p50 p90 p99"
    );
    for r in results {
        for (name, phase) in [("first", &r.first_turns), ("follow-up", &r.follow_ups)] {
            let _ = writeln!(
                out,
                "{:<16} {:<10} {:>6} {:>6} | {} | {} | {}",
                r.label,
                name,
                phase.requests,
                phase.ok,
                cell(phase.ttft_ms),
                cell(phase.itl_ms),
                cell(phase.e2e_ms)
            );
        }
    }
    for r in results {
        let errors = if r.errors.is_empty() {
            "none".to_owned()
        } else {
            r.errors.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", ")
        };
        let cache = match &r.prefix_cache {
            Some(PrefixCache { hit_rate: Some(rate), .. }) => format!("{:.1} %", rate * 100.0),
            Some(_) => "no queries".to_owned(),
            None => "not scraped".to_owned(),
        };
        let busy = match r.prefix_cache.as_ref().and_then(|c| c.utilisation) {
            Some(u) => format!("; engines busy {:.1} %", u * 100.0),
            None => String::new(),
        };
        let _ = writeln!(
            out,
            "{}: {:.2} req/s, {:.0} output tok/s over {:.1} s; not sent {}; errors: {errors}; \
             prefix-cache hit rate {cache}{busy}",
            r.label, r.requests_per_s, r.output_tokens_per_s, r.elapsed_s, r.not_sent
        );
        let depths: Vec<String> = r
            .by_turn
            .iter()
            .filter(|d| d.requests > 0)
            .map(|d| match d.ttft_ms {
                Some(p) => format!("{} {:.1}/{:.1} (n={})", d.turn, p.p50, p.p99, d.ok),
                None => format!("{} -/- (n=0)", d.turn),
            })
            .collect();
        let _ = writeln!(out, "{}: TTFT ms p50/p99 by turn: {}", r.label, depths.join(", "));
        for note in &r.notes {
            let _ = writeln!(out, "{}: note: {note}", r.label);
        }
    }
    out
}

/// Writes `result` as pretty JSON to `path`.
pub fn write_json(result: &BenchResult, path: &Path) -> io::Result<()> {
    let text = serde_json::to_string_pretty(result).map_err(io::Error::other)?;
    std::fs::write(path, text)
}

/// A file-name-safe form of a label.
pub fn file_stem(label: &str) -> String {
    let stem: String = label
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() || c == '-' || c == '_' { c } else { '_' })
        .collect();
    if stem.is_empty() {
        "bench".to_owned()
    } else {
        stem
    }
}

/// Writes `DIR/LABEL.json` for each result and `DIR/NAME` with the TTFT plot of all of them;
/// returns the paths written.
pub fn write_report(
    dir: &Path,
    results: &[BenchResult],
    plot_name: &str,
) -> io::Result<Vec<PathBuf>> {
    std::fs::create_dir_all(dir)?;
    let mut written = Vec::new();
    for r in results {
        let path = dir.join(format!("{}.json", file_stem(&r.label)));
        write_json(r, &path)?;
        written.push(path);
    }
    let path = dir.join(plot_name);
    plot_ttft(results, &path)?;
    written.push(path);
    Ok(written)
}

fn sorted_ttft(r: &BenchResult, follow_up: bool) -> Vec<f64> {
    let mut v: Vec<f64> = r
        .samples
        .iter()
        .filter(|s| s.follow_up == follow_up && s.ok())
        .filter_map(|s| s.ttft_ms)
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

/// Plots the TTFT CDF of each result (one line per label), first turns and follow-ups in two
/// panels, as SVG at `path`. The x axis ends at the largest p99 (a few outliers would squash
/// the rest).
pub fn plot_ttft(results: &[BenchResult], path: &Path) -> io::Result<()> {
    let panels = [(false, "first turns"), (true, "follow-ups")];
    let x_max = results
        .iter()
        .flat_map(|r| [&r.first_turns, &r.follow_ups])
        .filter_map(|p| p.ttft_ms.map(|t| t.p99))
        .fold(1.0f64, f64::max)
        * 1.05;
    let root = SVGBackend::new(path, (1100, 460)).into_drawing_area();
    let draw = || -> Result<(), Box<dyn std::error::Error>> {
        root.fill(&WHITE)?;
        for ((follow_up, title), area) in panels.iter().zip(root.split_evenly((1, 2))) {
            let mut chart = ChartBuilder::on(&area)
                .caption(format!("TTFT CDF, {title}"), ("sans-serif", 18))
                .margin(12)
                .x_label_area_size(36)
                .y_label_area_size(44)
                .build_cartesian_2d(0.0..x_max, 0.0..1.0)?;
            chart.configure_mesh().x_desc("TTFT (ms)").y_desc("fraction of requests").draw()?;
            for (i, r) in results.iter().enumerate() {
                let values = sorted_ttft(r, *follow_up);
                let n = values.len() as f64;
                let color = Palette99::pick(i).to_rgba();
                let points =
                    values.iter().enumerate().map(|(k, &x)| (x.min(x_max), (k + 1) as f64 / n));
                chart
                    .draw_series(LineSeries::new(points, color.stroke_width(2)))?
                    .label(format!("{} (n={})", r.label, values.len()))
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 16, y)], color));
            }
            chart
                .configure_series_labels()
                .position(SeriesLabelPosition::LowerRight)
                .background_style(WHITE.mix(0.8))
                .border_style(BLACK)
                .draw()?;
        }
        root.present()?;
        Ok(())
    };
    draw().map_err(|e| io::Error::other(format!("plot {}: {e}", path.display())))
}

/// p50, p90, p99, p99.9 (nearest rank), the maximum and the mean, in microseconds: the
/// latencies of a paced (`fixed-rate`) run.
#[derive(Debug, Clone, Copy, Serialize, PartialEq)]
pub struct Tail {
    /// Median.
    pub p50: f64,
    /// 90th percentile.
    pub p90: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// The largest value.
    pub max: f64,
    /// Arithmetic mean.
    pub mean: f64,
}

impl Tail {
    /// Summary of `nanos` (any order) in microseconds; None when empty.
    pub fn of_nanos(nanos: impl Iterator<Item = u64>) -> Option<Tail> {
        let mut us: Vec<f64> = nanos.map(|n| n as f64 / 1000.0).collect();
        if us.is_empty() {
            return None;
        }
        us.sort_by(f64::total_cmp);
        Some(Tail {
            p50: percentile(&us, 50.0),
            p90: percentile(&us, 90.0),
            p99: percentile(&us, 99.0),
            p999: percentile(&us, 99.9),
            max: us[us.len() - 1],
            mean: us.iter().sum::<f64>() / us.len() as f64,
        })
    }
}

/// One request of a paced run, in nanoseconds. Latencies are measured from the request's
/// *intended* send time, so a send the generator could not make on time (or a server that
/// stalled the connections) shows as latency, not as a request that was never timed.
#[derive(Debug, Clone, PartialEq)]
pub struct RateSample {
    /// Its intended send time, from the start of the run.
    pub offset_ns: u64,
    /// From the intended send time to its first `write` (None: never written, e.g. a refused
    /// connection): the generator's own lag, including any wait for a connection.
    pub lag_ns: Option<u64>,
    /// From the intended send time to the end of the response (or of the failure).
    pub latency_ns: u64,
    /// From the first `write` to the end of the response (what a closed-loop tool reports).
    pub service_ns: Option<u64>,
    /// From the intended send time to the first response byte.
    pub ttfb_ns: Option<u64>,
    /// HTTP status; 0 when there was none.
    pub status: u16,
    /// `io`, `timeout` or `protocol` when the exchange failed.
    pub failure: Option<&'static str>,
    /// It found every connection busy at the bound and waited for one (a late send).
    pub waited: bool,
    /// The response was an event stream.
    pub stream: bool,
}

impl RateSample {
    /// A 2xx with a complete body.
    pub fn ok(&self) -> bool {
        self.failure.is_none() && (200..300).contains(&self.status)
    }

    fn error_key(&self) -> String {
        match self.failure {
            Some(kind) if self.status == 0 => kind.to_owned(),
            Some(kind) => format!("{}-{kind}", self.status),
            None => self.status.to_string(),
        }
    }
}

/// Everything a paced (`fixed-rate`) run found.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct RateResult {
    /// The label of this run.
    pub label: String,
    /// The URL requests went to.
    pub target: String,
    /// `constant` or `poisson`.
    pub arrivals: &'static str,
    /// The offered rate, requests per second.
    pub rate: f64,
    /// The window of intended send times, seconds.
    pub duration_s: f64,
    /// Requests planned (intended send times in the window).
    pub planned: u64,
    /// Requests written (all of them but those whose connection could not be opened).
    pub sent: u64,
    /// Requests that succeeded.
    pub ok: u64,
    /// The achieved send rate: sends over the span of their first writes.
    pub sent_per_s: f64,
    /// Successful requests per second from the start to the last response.
    pub ok_per_s: f64,
    /// Seconds from the start to the last response.
    pub elapsed_s: f64,
    /// Sends that found every connection busy at `connections_max` and waited for one.
    pub late: u64,
    /// Connections opened before the first send (and connected).
    pub connections_warm: u64,
    /// Connections opened in all, the warm ones included.
    pub connections_opened: u64,
    /// The bound on connections.
    pub connections_max: u64,
    /// Intended send time to first write, over every request written: the generator's jitter.
    pub send_lag_us: Option<Tail>,
    /// Intended send time to the end of the response, successful requests.
    pub latency_us: Option<Tail>,
    /// First write to the end of the response, successful requests.
    pub service_us: Option<Tail>,
    /// Intended send time to the first response byte, successful requests.
    pub ttfb_us: Option<Tail>,
    /// Successful responses that were event streams.
    pub streamed: u64,
    /// Failed requests by status (or failure kind).
    pub errors: BTreeMap<String, u64>,
    /// Warnings (e.g. warm connections that did not connect).
    pub notes: Vec<String>,
    /// Every request (not in the JSON: a run at tens of thousands of requests per second has
    /// millions).
    #[serde(skip)]
    pub samples: Vec<RateSample>,
}

/// What [`RateResult::summarise`] is told about a run besides its samples.
#[derive(Debug, Clone)]
pub struct RateRun {
    /// The label.
    pub label: String,
    /// The URL.
    pub target: String,
    /// `constant` or `poisson`.
    pub arrivals: &'static str,
    /// Offered requests per second.
    pub rate: f64,
    /// The window of send times, seconds.
    pub duration_s: f64,
    /// Requests planned.
    pub planned: u64,
    /// Seconds from the start to the last response.
    pub elapsed_s: f64,
    /// Connections connected before the start.
    pub connections_warm: u64,
    /// Connections opened in all.
    pub connections_opened: u64,
    /// The bound on connections.
    pub connections_max: u64,
}

impl RateResult {
    /// Summarises the `samples` of `run`.
    pub fn summarise(run: RateRun, samples: Vec<RateSample>) -> RateResult {
        let mut errors = BTreeMap::new();
        for s in samples.iter().filter(|s| !s.ok()) {
            *errors.entry(s.error_key()).or_insert(0) += 1;
        }
        let ok = || samples.iter().filter(|s| s.ok());
        let n_ok = ok().count() as u64;
        let writes: Vec<u64> =
            samples.iter().filter_map(|s| s.lag_ns.map(|l| s.offset_ns + l)).collect();
        let span = writes.iter().max().zip(writes.iter().min()).map_or(0, |(a, b)| a - b);
        let sent_per_s = match writes.len() {
            n if n > 1 && span > 0 => (n - 1) as f64 / (span as f64 / 1e9),
            _ => 0.0,
        };
        RateResult {
            label: run.label,
            target: run.target,
            arrivals: run.arrivals,
            rate: run.rate,
            duration_s: run.duration_s,
            planned: run.planned,
            sent: writes.len() as u64,
            ok: n_ok,
            sent_per_s,
            ok_per_s: if run.elapsed_s > 0.0 { n_ok as f64 / run.elapsed_s } else { 0.0 },
            elapsed_s: run.elapsed_s,
            late: samples.iter().filter(|s| s.waited).count() as u64,
            connections_warm: run.connections_warm,
            connections_opened: run.connections_opened,
            connections_max: run.connections_max,
            send_lag_us: Tail::of_nanos(samples.iter().filter_map(|s| s.lag_ns)),
            latency_us: Tail::of_nanos(ok().map(|s| s.latency_ns)),
            service_us: Tail::of_nanos(ok().filter_map(|s| s.service_ns)),
            ttfb_us: Tail::of_nanos(ok().filter_map(|s| s.ttfb_ns)),
            streamed: ok().filter(|s| s.stream).count() as u64,
            errors,
            notes: Vec::new(),
            samples,
        }
    }
}

fn tail_cell(t: Option<Tail>) -> String {
    match t {
        Some(t) => {
            format!("{:>7.1} {:>7.1} {:>7.1} {:>8.1} {:>8.1}", t.p50, t.p90, t.p99, t.p999, t.max)
        }
        None => format!("{:>7} {:>7} {:>7} {:>8} {:>8}", "-", "-", "-", "-", "-"),
    }
}

/// The terminal table of paced runs, in µs (p50 p90 p99 p99.9 max): per run a row of latency
/// (from the intended send time), of TTFB when responses streamed, of service time (from the
/// first write) and of the generator's send lag, each with the number of values; then a line
/// of rates, late sends, connections and errors per run.
pub fn rate_table(results: &[RateResult]) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<16} {:<9} {:>8} | {:>7} {:>7} {:>7} {:>8} {:>8}  (us)",
        "label", "measure", "n", "p50", "p90", "p99", "p99.9", "max"
    );
    for r in results {
        let mut rows = vec![("latency", r.ok, r.latency_us)];
        if r.streamed > 0 {
            rows.push(("TTFB", r.ok, r.ttfb_us));
        }
        rows.push(("service", r.ok, r.service_us));
        rows.push(("send lag", r.sent, r.send_lag_us));
        for (name, n, tail) in rows {
            let _ = writeln!(out, "{:<16} {:<9} {:>8} | {}", r.label, name, n, tail_cell(tail));
        }
    }
    for r in results {
        let errors = if r.errors.is_empty() {
            "none".to_owned()
        } else {
            r.errors.iter().map(|(k, v)| format!("{k}: {v}")).collect::<Vec<_>>().join(", ")
        };
        let _ = writeln!(
            out,
            "{}: {:.1} req/s offered ({}), {:.1} sent/s, {:.1} ok/s over {:.2} s; {} of {} sent; \
             late (waited for a connection) {}; connections {} warm, {} opened, at most {}; \
             errors: {errors}",
            r.label,
            r.rate,
            r.arrivals,
            r.sent_per_s,
            r.ok_per_s,
            r.elapsed_s,
            r.sent,
            r.planned,
            r.late,
            r.connections_warm,
            r.connections_opened,
            r.connections_max
        );
        for note in &r.notes {
            let _ = writeln!(out, "{}: note: {note}", r.label);
        }
    }
    out
}

/// Writes `result` as pretty JSON to `DIR/LABEL.json` (the directory created); returns the path.
pub fn write_rate_json(dir: &Path, result: &RateResult) -> io::Result<PathBuf> {
    std::fs::create_dir_all(dir)?;
    let path = dir.join(format!("{}.json", file_stem(&result.label)));
    let text = serde_json::to_string_pretty(result).map_err(io::Error::other)?;
    std::fs::write(&path, text)?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nearest_rank_percentiles_on_known_inputs() {
        let one_to_ten: Vec<f64> = (1..=10).map(f64::from).collect();
        let p = Percentiles::of(&one_to_ten).expect("not empty");
        assert_eq!((p.p50, p.p90, p.p99, p.mean), (5.0, 9.0, 10.0, 5.5));
        let hundred: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        let p = Percentiles::of(&hundred).expect("not empty");
        assert_eq!((p.p50, p.p90, p.p99), (50.0, 90.0, 99.0));
        let p = Percentiles::of(&[7.0]).expect("not empty");
        assert_eq!((p.p50, p.p90, p.p99), (7.0, 7.0, 7.0));
        let p = Percentiles::of(&[3.0, 1.0, 2.0, 4.0]).expect("not empty");
        assert_eq!((p.p50, p.p90, p.p99), (2.0, 4.0, 4.0));
        assert!(Percentiles::of(&[]).is_none());
        let thousand: Vec<f64> = (1..=1000).map(f64::from).collect();
        assert_eq!(percentile(&thousand, 99.0), 990.0);
        assert_eq!(percentile(&thousand, 99.9), 999.0);
    }

    fn sample(follow_up: bool, status: u16, ttft: f64) -> Sample {
        Sample {
            session: 0,
            turn: u32::from(follow_up),
            follow_up,
            stream: true,
            status,
            failure: if status == 0 { Some("io") } else { None },
            sent_ms: 0.0,
            ttft_ms: Some(ttft),
            itl_ms: Some(1.0),
            e2e_ms: ttft + 10.0,
            output_tokens: 4,
        }
    }

    #[test]
    fn summary_splits_turns_and_counts_errors() {
        let samples = vec![
            sample(false, 200, 10.0),
            sample(false, 200, 30.0),
            sample(true, 200, 2.0),
            sample(true, 429, 1.0),
            sample(true, 0, 1.0),
        ];
        let r = BenchResult::summarise("x", "w", "t", 6, 2.0, samples);
        assert_eq!((r.first_turns.requests, r.first_turns.ok), (2, 2));
        assert_eq!((r.follow_ups.requests, r.follow_ups.ok), (3, 1));
        assert_eq!(r.first_turns.ttft_ms.map(|p| p.p50), Some(10.0));
        assert_eq!(r.follow_ups.ttft_ms.map(|p| p.p99), Some(2.0));
        assert_eq!(r.errors.get("429"), Some(&1));
        assert_eq!(r.errors.get("io"), Some(&1));
        assert_eq!((r.requests_per_s, r.output_tokens_per_s, r.not_sent), (1.5, 6.0, 1));
        let text = table(&[r]);
        assert!(text.contains("follow-up") && text.contains("429: 1"), "{text}");
    }

    #[test]
    fn ttft_is_broken_down_by_turn_depth() {
        let at =
            |turn: u32, status: u16, ttft: f64| Sample { turn, ..sample(turn > 0, status, ttft) };
        // Depths 1 to 10 (turn indices 0 to 9), a failure at depth 4, two requests at depth 1.
        let mut samples: Vec<Sample> = (0..10).map(|t| at(t, 200, f64::from(t + 1))).collect();
        samples.push(at(0, 200, 100.0));
        samples.push(at(3, 502, 1.0));
        let r = BenchResult::summarise("x", "w", "t", 12, 1.0, samples);
        type Row<'a> = (&'a str, u64, u64, Option<(f64, f64)>);
        let got: Vec<Row> = r
            .by_turn
            .iter()
            .map(|d| (d.turn, d.requests, d.ok, d.ttft_ms.map(|p| (p.p50, p.p99))))
            .collect();
        assert_eq!(
            got,
            [
                ("1", 2, 2, Some((1.0, 100.0))),
                ("2", 1, 1, Some((2.0, 2.0))),
                ("3-4", 3, 2, Some((3.0, 4.0))),
                ("5-8", 4, 4, Some((6.0, 8.0))),
                ("9+", 2, 2, Some((9.0, 10.0))),
            ]
        );
        let text = table(&[r]);
        assert!(text.contains("by turn: 1 1.0/100.0 (n=2), 2 2.0/2.0 (n=1)"), "{text}");
        let json = serde_json::to_value(BenchResult::summarise("x", "w", "t", 0, 1.0, vec![]))
            .expect("serialisable");
        assert_eq!(json["by_turn"].as_array().map(Vec::len), Some(5), "every bucket, even empty");
    }
}
