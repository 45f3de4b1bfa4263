//! The admin listener (SPEC 6): `GET /metrics` (Prometheus text), `GET /debug/queue`,
//! `GET /debug/backends` and `GET /debug/config` (JSON), and `POST /admin/reload` (a live
//! reload, as SIGHUP; 200 with the new generation, 409 with the error when refused). One thread, blocking I/O, one request per connection with
//! short timeouts: scrapes are rare and small, and this keeps the admin path off the shards.

use std::fmt::Write as _;
use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::{Tick, TickRate};
use crate::config::Setting;
use crate::scheduler::estimate::{BackendEstimates, TokenRate};
use crate::scheduler::Lane;

use super::metrics::{Histogram, ModelMetrics, ShardMetrics, UpstreamError, STATUS_SLOTS};
use super::report::{BackendReport, Report};
use super::{Generation, Shared};

/// Longest admin request head read.
const HEAD_MAX: usize = 8 << 10;
const IO_TIMEOUT: Duration = Duration::from_secs(2);

/// The running admin thread.
#[derive(Debug)]
pub struct AdminThread {
    stop: Arc<AtomicBool>,
    addr: std::net::SocketAddr,
    join: JoinHandle<()>,
}

impl AdminThread {
    /// Serves `listener` until stopped.
    pub fn spawn(listener: TcpListener, shared: Arc<Shared>) -> io::Result<AdminThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let addr = listener.local_addr()?;
        let flag = Arc::clone(&stop);
        let join = std::thread::Builder::new().name("admin".into()).spawn(move || {
            for stream in listener.incoming() {
                if flag.load(Ordering::Acquire) {
                    return;
                }
                if let Ok(stream) = stream {
                    let _ = serve(stream, &shared);
                }
            }
        })?;
        Ok(AdminThread { stop, addr, join })
    }

    /// Stops the thread (a connection to itself unblocks its `accept`).
    pub fn stop(self) {
        self.stop.store(true, Ordering::Release);
        let _ = TcpStream::connect_timeout(&self.addr, IO_TIMEOUT);
        let _ = self.join.join();
    }
}

fn serve(mut stream: TcpStream, shared: &Shared) -> io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let mut buf = vec![0; HEAD_MAX];
    let mut len = 0;
    let (method, path) = loop {
        let n = stream.read(&mut buf[len..])?;
        if n == 0 {
            return Ok(());
        }
        len += n;
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..len]) {
            Ok(httparse::Status::Complete(_)) => {
                let method = req.method.unwrap_or("").to_owned();
                let path = req.path.unwrap_or("").split('?').next().unwrap_or("").to_owned();
                break (method, path);
            }
            Ok(httparse::Status::Partial) if len < HEAD_MAX => {}
            _ => return respond(&mut stream, 400, "text/plain", b"bad request\n"),
        }
    };
    if method == "POST" && path == "/admin/reload" {
        let (status, body) = match super::reload::reload(shared) {
            Ok(number) => (200, serde_json::json!({ "generation": number })),
            Err(error) => (
                409,
                serde_json::json!({ "error": error, "generation": shared.generation().number }),
            ),
        };
        let body = serde_json::to_vec(&body).map_err(io::Error::other)?;
        return respond(&mut stream, status, "application/json", &body);
    }
    if method != "GET" {
        return respond(&mut stream, 405, "text/plain", b"method not allowed\n");
    }
    match path.as_str() {
        "/metrics" => {
            let text = render_metrics(shared);
            respond(&mut stream, 200, "text/plain; version=0.0.4", text.as_bytes())
        }
        "/debug/queue" => {
            let body = serde_json::to_vec_pretty(&debug_queue(shared)).map_err(io::Error::other)?;
            respond(&mut stream, 200, "application/json", &body)
        }
        "/debug/backends" => {
            let body =
                serde_json::to_vec_pretty(&debug_backends(shared)).map_err(io::Error::other)?;
            respond(&mut stream, 200, "application/json", &body)
        }
        "/debug/config" => {
            let body =
                serde_json::to_vec_pretty(&debug_config(shared)).map_err(io::Error::other)?;
            respond(&mut stream, 200, "application/json", &body)
        }
        _ => respond(&mut stream, 404, "text/plain", b"not found\n"),
    }
}

fn respond(stream: &mut TcpStream, status: u16, content_type: &str, body: &[u8]) -> io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        409 => "Conflict",
        _ => "Method Not Allowed",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

fn reports(generation: &Generation) -> Vec<Report> {
    generation
        .models
        .iter()
        .map(|m| m.report.lock().unwrap_or_else(|e| e.into_inner()).clone())
        .collect()
}

/// A Prometheus label value, escaped.
fn label(value: &str) -> String {
    value.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

/// The scrape: shard counters summed over shards, scheduler reports as published.
pub fn render_metrics(shared: &Shared) -> String {
    let generation = shared.generation();
    let shards = shared.shard_metrics();
    let gen = &*generation;
    let reports = reports(gen);
    let mut out = String::with_capacity(16 << 10);
    family(&mut out, "warmpath_requests_total", "counter", "Responses by model and status.");
    for (index, model) in gen.models.iter().enumerate() {
        let m = label(&model.name);
        for status in 100..STATUS_SLOTS {
            let n = sum_models(&shards, index, |m| &m.status[status]);
            if n > 0 {
                let _ = writeln!(
                    out,
                    "warmpath_requests_total{{model=\"{m}\",status=\"{status}\"}} {n}"
                );
            }
        }
    }
    family(
        &mut out,
        "warmpath_router_responses_total",
        "counter",
        "Router answers before a model was known, by status.",
    );
    for status in 100..STATUS_SLOTS {
        let n = sum_shards(&shards, |s| &s.other_status[status]);
        if n > 0 {
            let _ = writeln!(out, "warmpath_router_responses_total{{status=\"{status}\"}} {n}");
        }
    }
    type PickHistogram = fn(&ModelMetrics) -> &Histogram;
    let histograms: [(&str, &str, PickHistogram); 2] = [
        ("warmpath_request_duration_seconds", "Arrival to last byte.", |m| &m.duration),
        ("warmpath_upstream_ttfb_seconds", "Forwarded to first response byte.", |m| &m.ttfb),
    ];
    for (name, help, pick) in histograms {
        family(&mut out, name, "histogram", help);
        for (index, model) in gen.models.iter().enumerate() {
            let labels = format!("model=\"{}\"", label(&model.name));
            let picked = shards.iter().filter_map(|s| s.models.get(index)).map(pick);
            histogram(&mut out, name, &labels, picked);
        }
    }
    family(&mut out, "warmpath_queue_wait_seconds", "histogram", "Arrival to admission, by lane.");
    for (index, model) in gen.models.iter().enumerate() {
        for lane in Lane::ALL {
            let labels = format!("model=\"{}\",lane=\"{}\"", label(&model.name), lane.name());
            let picked = shards
                .iter()
                .filter_map(|s| s.models.get(index))
                .map(|m| &m.queue_wait[lane as usize]);
            histogram(&mut out, "warmpath_queue_wait_seconds", &labels, picked);
        }
    }

    family(&mut out, "warmpath_queue_depth", "gauge", "Queued requests by lane.");
    for (model, report) in gen.models.iter().zip(&reports) {
        for lane in Lane::ALL {
            let depth = report.depth[lane as usize];
            let _ = writeln!(
                out,
                "warmpath_queue_depth{{model=\"{}\",lane=\"{}\"}} {depth}",
                label(&model.name),
                lane.name()
            );
        }
    }
    family(&mut out, "warmpath_admitted_total", "counter", "Admissions by lane.");
    for (model, report) in gen.models.iter().zip(&reports) {
        for lane in Lane::ALL {
            let n = report.stats.admitted[lane as usize];
            let _ = writeln!(
                out,
                "warmpath_admitted_total{{model=\"{}\",lane=\"{}\"}} {n}",
                label(&model.name),
                lane.name()
            );
        }
    }
    type Pick = fn(&Report) -> u64;
    let per_model: [(&str, &str, &str, Pick); 12] = [
        (
            "warmpath_forced_total",
            "counter",
            "Boosted requests forced by bounded overtaking (S4).",
            |r| r.stats.forced,
        ),
        (
            "warmpath_queue_timeouts_total",
            "counter",
            "Requests that waited past queue.timeout.",
            |r| r.stats.timeouts,
        ),
        (
            "warmpath_queue_cancelled_total",
            "counter",
            "Requests whose client left while queued.",
            |r| r.stats.cancelled,
        ),
        (
            "warmpath_grace_holds_total",
            "counter",
            "Slots held for a session's follow-up (S8).",
            |r| r.stats.grace_holds,
        ),
        ("warmpath_grace_hits_total", "counter", "Follow-ups admitted into a held slot.", |r| {
            r.stats.grace_hits
        }),
        ("warmpath_sessions_tracked", "gauge", "Recently completed sessions remembered.", |r| {
            r.sessions_tracked as u64
        }),
        (
            "warmpath_affinity_hits_total",
            "counter",
            "Admissions to the session's last backend.",
            |r| r.stats.affinity_hits,
        ),
        ("warmpath_retries_total", "counter", "Requests sent back for another backend.", |r| {
            r.stats.retries
        }),
        (
            "warmpath_boost_declined_total",
            "counter",
            "Follow-ups not boosted: their prompt repeats less than half the previous turn's (S16).",
            |r| r.stats.boost_declined,
        ),
        (
            "warmpath_placement_waits_total",
            "counter",
            "Requests that waited for their cheapest backend (S16).",
            |r| r.stats.placement_waits,
        ),
        ("warmpath_ejections_total", "counter", "Backends passively ejected.", |r| {
            r.stats.ejections
        }),
        ("warmpath_model_inflight", "gauge", "Admitted requests not yet released.", |r| {
            u64::from(r.inflight)
        }),
    ];
    for (name, kind, help, pick) in per_model {
        family(&mut out, name, kind, help);
        for (model, report) in gen.models.iter().zip(&reports) {
            let _ = writeln!(out, "{name}{{model=\"{}\"}} {}", label(&model.name), pick(report));
        }
    }
    family(
        &mut out,
        "warmpath_prefix_match_ratio",
        "histogram",
        "Share of a prompt's blocks cached on the chosen backend at admission (S16).",
    );
    for (model, report) in gen.models.iter().zip(&reports) {
        let m = label(&model.name);
        let buckets = &report.stats.match_ratio;
        let mut cumulative = 0;
        for (tenth, n) in buckets.iter().enumerate() {
            cumulative += n;
            let le = tenth as f64 / 10.0;
            let _ = writeln!(
                out,
                "warmpath_prefix_match_ratio_bucket{{model=\"{m}\",le=\"{le}\"}} {cumulative}"
            );
        }
        let sum = report.stats.match_ratio_sum_milli as f64 / 1000.0;
        let _ = writeln!(
            out,
            "warmpath_prefix_match_ratio_bucket{{model=\"{m}\",le=\"+Inf\"}} {cumulative}\n\
             warmpath_prefix_match_ratio_sum{{model=\"{m}\"}} {sum}\n\
             warmpath_prefix_match_ratio_count{{model=\"{m}\"}} {cumulative}"
        );
    }
    family(
        &mut out,
        "warmpath_queue_rejected_total",
        "counter",
        "Requests refused by the queue, by reason.",
    );
    for (model, report) in gen.models.iter().zip(&reports) {
        let m = label(&model.name);
        let reasons = [
            ("queue_full", report.stats.rejected_full),
            ("shutting_down", report.stats.rejected_shutdown),
            ("retries_exhausted", report.stats.retries_exhausted),
        ];
        for (reason, n) in reasons {
            let _ = writeln!(
                out,
                "warmpath_queue_rejected_total{{model=\"{m}\",reason=\"{reason}\"}} {n}"
            );
        }
    }

    type PickBackend = fn(&BackendReport) -> u64;
    let per_backend: [(&str, &str, PickBackend); 5] = [
        ("warmpath_inflight", "Admitted requests on the backend.", |b| u64::from(b.inflight)),
        (
            "warmpath_prefill_backlog_tokens",
            "Estimated prompt tokens awaiting a first byte (S6.3).",
            |b| b.prefill_tokens,
        ),
        ("warmpath_backend_up", "1 when configured, healthy and not ejected.", |b| {
            u64::from(b.healthy && !b.ejected && !b.removed)
        }),
        ("warmpath_backend_waiting", "The engine's last scraped waiting-queue gauge.", |b| {
            u64::from(b.waiting.unwrap_or(0))
        }),
        (
            "warmpath_prefix_index_blocks",
            "Prompt blocks in the backend's prefix index (S16; 0 for other routings).",
            |b| b.index_blocks,
        ),
    ];
    for (name, help, pick) in per_backend {
        family(&mut out, name, "gauge", help);
        for (model, report) in gen.models.iter().zip(&reports) {
            for (backend, b) in model.backends.iter().zip(&report.backends) {
                let _ = writeln!(
                    out,
                    "{name}{{model=\"{}\",backend=\"{}\"}} {}",
                    label(&model.name),
                    label(&backend.authority),
                    pick(b)
                );
            }
        }
    }
    learned_metrics(&mut out, gen, &reports, shared.clock.rate());
    family(&mut out, "warmpath_upstream_errors_total", "counter", "Upstream failures by kind.");
    for (index, model) in gen.models.iter().enumerate() {
        for (b, backend) in model.backends.iter().enumerate() {
            for kind in UpstreamError::ALL {
                let n = sum_models(&shards, index, |m| {
                    m.upstream_errors.get(b).map_or(&ZERO, |k| &k[kind as usize])
                });
                let _ = writeln!(
                    out,
                    "warmpath_upstream_errors_total{{model=\"{}\",backend=\"{}\",kind=\"{}\"}} {n}",
                    label(&model.name),
                    label(&backend.authority),
                    kind.name()
                );
            }
        }
    }
    family(
        &mut out,
        "warmpath_pool_reconnects_total",
        "counter",
        "Dead pooled connections replaced by a fresh one.",
    );
    for (index, model) in gen.models.iter().enumerate() {
        let n = sum_models(&shards, index, |m| &m.pool_reconnects);
        let _ =
            writeln!(out, "warmpath_pool_reconnects_total{{model=\"{}\"}} {n}", label(&model.name));
    }
    type PickShard = fn(&ShardMetrics) -> &std::sync::atomic::AtomicU64;
    let shard_gauges: [(&str, &str, &str, PickShard); 5] = [
        ("warmpath_connections_accepted_total", "counter", "Client connections accepted.", |s| {
            &s.accepted
        }),
        (
            "warmpath_connections_refused_total",
            "counter",
            "Client connections refused at max_connections.",
            |s| &s.refused,
        ),
        ("warmpath_connections_open", "gauge", "Open client connections.", |s| &s.open),
        ("warmpath_buffered_bytes", "gauge", "Request bytes held while queued.", |s| &s.buffered),
        (
            "warmpath_clients_gone_total",
            "counter",
            "Requests whose client left before the response ended.",
            |s| &s.clients_gone,
        ),
    ];
    for (name, kind, help, pick) in shard_gauges {
        family(&mut out, name, kind, help);
        let _ = writeln!(out, "{name} {}", sum_shards(&shards, pick));
    }
    family(
        &mut out,
        "warmpath_access_log_dropped_total",
        "counter",
        "Access-log lines dropped because a shard's buffer was full or the sink failed.",
    );
    let dropped: u64 = shared.access_logs.iter().map(|log| log.dropped()).sum();
    let _ = writeln!(out, "warmpath_access_log_dropped_total {dropped}");
    family(&mut out, "warmpath_config_generation", "gauge", "The active configuration generation.");
    let _ = writeln!(out, "warmpath_config_generation {}", gen.number);
    family(
        &mut out,
        "warmpath_config_reloads_refused_total",
        "counter",
        "Reloads refused (the file did not load or validate); the active generation stayed.",
    );
    let refused = shared.reloads_refused.load(Ordering::Relaxed);
    let _ = writeln!(out, "warmpath_config_reloads_refused_total {refused}");
    out
}

/// A family's `# HELP` and `# TYPE` lines.
fn family(out: &mut String, name: &str, kind: &str, help: &str) {
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// What the schedulers learned (issue [8], SPEC section 10): one family per estimate, a series
/// per backend; an estimate not measured yet has no series.
fn learned_metrics(out: &mut String, gen: &Generation, reports: &[Report], rate: TickRate) {
    type Pick = fn(&BackendEstimates, f64) -> Option<f64>;
    let families: [(&str, &str, Pick); 3] = [
        (
            "warmpath_backend_prefill_tokens_per_second",
            "Learned prefill rate: estimated prompt tokens the engine clears per second while it \
             has the next request waiting.",
            |e, ticks_per_second| {
                (e.rate.0 > 0).then(|| e.rate.0 as f64 / e.rate.1 as f64 * ticks_per_second)
            },
        ),
        (
            "warmpath_backend_admission_budget_tokens",
            "The prefill budget in force (S6.3; learned under auto): estimated uncached prompt \
             tokens awaiting a first byte the backend may have; 0 = none.",
            |e, _| Some(e.budget as f64),
        ),
        (
            "warmpath_backend_kv_capacity_tokens",
            "KV-cache capacity the engine exports, tokens.",
            |e, _| (e.kv_capacity_tokens > 0).then_some(e.kv_capacity_tokens as f64),
        ),
    ];
    let ticks_per_second = rate.ticks_per_ns() * 1e9;
    for (name, help, pick) in families {
        family(out, name, "gauge", help);
        for (model, report) in gen.models.iter().zip(reports) {
            for (backend, b) in model.backends.iter().zip(&report.backends) {
                if let Some(value) = pick(&b.estimates, ticks_per_second) {
                    let (m, a) = (label(&model.name), label(&backend.authority));
                    let _ = writeln!(out, "{name}{{model=\"{m}\",backend=\"{a}\"}} {value}");
                }
            }
        }
    }
    family(
        out,
        "warmpath_backend_prefix_hit_ratio",
        "gauge",
        "Share of prompt tokens found cached: predicted by the prefix index, and reported by \
         the engine, over the last calibration period (engine: else over the last scrape \
         interval, from its counters).",
    );
    for (model, report) in gen.models.iter().zip(reports) {
        for (backend, b) in model.backends.iter().zip(&report.backends) {
            let (m, a) = (label(&model.name), label(&backend.authority));
            for (source, ratio) in hit_ratios(&b.estimates) {
                if let Some(ratio) = ratio {
                    let _ = writeln!(
                        out,
                        "warmpath_backend_prefix_hit_ratio{{model=\"{m}\",backend=\"{a}\",source=\"{source}\"}} {ratio}"
                    );
                }
            }
        }
    }
    family(
        out,
        "warmpath_tokens_per_byte",
        "gauge",
        "Learned prompt tokens per byte of request body (from responses' usage.prompt_tokens).",
    );
    for (model, report) in gen.models.iter().zip(reports) {
        let per_byte = report.token_rate.per_byte_micro() as f64 / 1e6;
        let m = label(&model.name);
        let _ = writeln!(out, "warmpath_tokens_per_byte{{model=\"{m}\"}} {per_byte}");
    }
}

/// The predicted and the engine-reported hit ratio of a backend, when known: the last closed
/// calibration period's; for the engine, before any period closed, its counters' last interval.
fn hit_ratios(e: &BackendEstimates) -> [(&'static str, Option<f64>); 2] {
    let closed = e.hit_ratio_at > 0;
    let engine = if closed { Some(e.engine_hit_micro) } else { e.counter_hit_micro };
    [
        ("predicted", closed.then(|| e.predicted_hit_micro as f64 / 1e6)),
        ("engine", engine.map(|micro| micro as f64 / 1e6)),
    ]
}

/// A zero for counters a shard does not have yet (it has not adopted the newest generation).
static ZERO: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

fn sum_shards(
    shards: &[Arc<ShardMetrics>],
    pick: impl Fn(&ShardMetrics) -> &std::sync::atomic::AtomicU64,
) -> u64 {
    shards.iter().map(|s| pick(s).load(Ordering::Relaxed)).sum()
}

/// A counter of model `index` summed over the shards that know the model.
fn sum_models(
    shards: &[Arc<ShardMetrics>],
    index: usize,
    pick: impl Fn(&ModelMetrics) -> &std::sync::atomic::AtomicU64,
) -> u64 {
    let models = shards.iter().filter_map(|s| s.models.get(index));
    models.map(|m| pick(m).load(Ordering::Relaxed)).sum()
}

/// One histogram's series from the shards' histograms (same buckets; non-cumulative in,
/// cumulative out).
fn histogram<'a>(
    out: &mut String,
    name: &str,
    labels: &str,
    parts: impl Iterator<Item = &'a Histogram>,
) {
    let mut bounds: &[u64] = &[];
    let mut sums = Vec::new();
    for part in parts {
        if sums.is_empty() {
            bounds = part.bounds();
            sums = vec![0; bounds.len() + 2];
        }
        part.sum_into(&mut sums);
    }
    if sums.is_empty() {
        return;
    }
    let mut cumulative = 0;
    for (i, bound) in bounds.iter().enumerate() {
        cumulative += sums[i];
        let le = *bound as f64 / 1e6;
        let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
    }
    cumulative += sums[bounds.len()];
    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
    let sum = sums[bounds.len() + 1] as f64 / 1e6;
    let _ = writeln!(out, "{name}_sum{{{labels}}} {sum}\n{name}_count{{{labels}}} {cumulative}");
}

/// `GET /debug/queue`.
pub fn debug_queue(shared: &Shared) -> serde_json::Value {
    let now = shared.clock.now();
    let rate = shared.clock.rate();
    let generation = shared.generation();
    let models: Vec<serde_json::Value> = generation
        .models
        .iter()
        .zip(reports(&generation))
        .map(|(model, report)| {
            let config = &model.config;
            let depth: serde_json::Map<String, serde_json::Value> = Lane::ALL
                .iter()
                .map(|&lane| (lane.name().to_owned(), report.depth[lane as usize].into()))
                .collect();
            let queued: u32 = report.depth.iter().sum();
            let oldest_wait_ms = report
                .oldest_arrival
                .map(|at| rate.duration(now.saturating_sub(at)).as_secs_f64() * 1e3);
            let backends: Vec<serde_json::Value> = model
                .backends
                .iter()
                .zip(&report.backends)
                .map(|(backend, b)| {
                    serde_json::json!({
                        "backend": backend.authority,
                        "inflight": b.inflight,
                        "prefill_tokens": b.prefill_tokens,
                        "held_slots": b.holds,
                        "usable": b.healthy && !b.ejected && backend.live,
                        "live": backend.live,
                    })
                })
                .collect();
            let q = &config.queue;
            serde_json::json!({
                "model": model.name,
                "live": model.live,
                "queued": queued,
                "depth": depth,
                "inflight": report.inflight,
                "sessions_tracked": report.sessions_tracked,
                "oldest_wait_ms": oldest_wait_ms,
                "limits": {
                    "strategy": q.strategy.name(),
                    "max_queued": q.max_queued,
                    "inflight_per_backend": q.inflight_per_backend,
                    "prefill_tokens_per_backend": setting_json(q.prefill_tokens_per_backend),
                    "timeout_ms": q.timeout.as_millis() as u64,
                    "max_overtakes": q.max_overtakes,
                    "boosted_streak_max": q.boosted_streak_max,
                    "grace_period_ms": q.grace_period.as_millis() as u64,
                    "max_sessions": q.max_sessions,
                },
                "backends": backends,
            })
        })
        .collect();
    serde_json::json!({ "models": models })
}

/// A setting as JSON: the string `"auto"` or its value.
fn setting_json<T: Into<serde_json::Value>>(setting: Setting<T>) -> serde_json::Value {
    match setting {
        Setting::Auto => "auto".into(),
        Setting::Fixed(value) => value.into(),
    }
}

/// `GET /debug/backends`.
pub fn debug_backends(shared: &Shared) -> serde_json::Value {
    let now = shared.clock.now();
    let rate = shared.clock.rate();
    let mut backends = Vec::new();
    let generation = shared.generation();
    for (model, report) in generation.models.iter().zip(reports(&generation)) {
        for (backend, b) in model.backends.iter().zip(&report.backends) {
            let scraped = b.scraped_at > 0;
            let age_ms = scraped
                .then(|| rate.duration(now.saturating_sub(b.scraped_at)).as_secs_f64() * 1e3);
            backends.push(serde_json::json!({
                "model": model.name,
                "backend": backend.authority,
                "healthy": b.healthy,
                "ejected": b.ejected,
                "live": backend.live && model.live,
                "waiting": b.waiting,
                "last_scrape_age_ms": age_ms,
                "inflight": b.inflight,
                "prefill_tokens": b.prefill_tokens,
                "learned": learned_json(&b.estimates, &report.token_rate, now, rate),
            }));
        }
    }
    serde_json::json!({ "backends": backends })
}

/// A backend's learned estimates, each with its age (milliseconds since it last changed; null
/// while never measured).
fn learned_json(
    e: &BackendEstimates,
    tokens: &TokenRate,
    now: Tick,
    rate: TickRate,
) -> serde_json::Value {
    let age = |at: Tick, known: bool| {
        known.then(|| rate.duration(now.saturating_sub(at)).as_secs_f64() * 1e3)
    };
    let per_second = rate.ticks_per_ns() * 1e9;
    let prefill = (e.rate.0 > 0).then(|| e.rate.0 as f64 / e.rate.1 as f64 * per_second);
    let [(_, predicted), (_, engine)] = hit_ratios(e);
    let ratio_at = if e.hit_ratio_at > 0 { e.hit_ratio_at } else { e.counter_at };
    serde_json::json!({
        "prefill_tokens_per_second": prefill,
        "prefill_rate_age_ms": age(e.rate_at, prefill.is_some()),
        "admission_budget_tokens": e.budget,
        "admission_budget_age_ms": age(e.budget_at, e.budget_at > 0),
        "kv_capacity_tokens": (e.kv_capacity_tokens > 0).then_some(e.kv_capacity_tokens),
        "kv_capacity_age_ms": age(e.kv_capacity_at, e.kv_capacity_tokens > 0),
        "prefix_index_capacity_blocks": e.index_capacity,
        "prefix_hit_ratio_predicted": predicted,
        "prefix_hit_ratio_engine": engine,
        "prefix_hit_ratio_age_ms": age(ratio_at, engine.is_some()),
        "tokens_per_byte": tokens.per_byte_micro() as f64 / 1e6,
        "tokens_per_byte_samples": tokens.samples,
        "tokens_per_byte_age_ms": age(tokens.updated_at, tokens.samples > 0),
    })
}

/// Key names whose values `/debug/config` never shows (matched as substrings, lowercase).
const SECRET_KEYS: [&str; 5] = ["secret", "password", "token", "api_key", "authorization"];

/// `GET /debug/config`: the active generation and its effective configuration (the document
/// `warmpath check-config` prints, as JSON), with the values of secret-looking keys replaced by
/// `"<redacted>"`.
pub fn debug_config(shared: &Shared) -> serde_json::Value {
    let generation = shared.generation();
    let text = generation.config.to_toml();
    let mut config = match toml::from_str::<toml::Table>(&text) {
        Ok(table) => serde_json::to_value(table).unwrap_or(serde_json::Value::Null),
        Err(e) => serde_json::Value::String(format!("unprintable configuration: {e}")),
    };
    redact(&mut config);
    serde_json::json!({
        "generation": generation.number,
        "source": shared.source.as_ref().map(|s| s.path.display().to_string()),
        "config": config,
    })
}

/// Replaces the values of [`SECRET_KEYS`] (and of backends' `user:password@` parts) in place.
fn redact(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                let key = key.to_ascii_lowercase();
                if SECRET_KEYS.iter().any(|secret| key.contains(secret)) {
                    *value = serde_json::Value::String("<redacted>".into());
                } else {
                    redact(value);
                }
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(redact),
        serde_json::Value::String(text) => {
            if let Some((_, host)) = text.rsplit_once('@') {
                *text = format!("<redacted>@{host}");
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_and_credentials_in_addresses_are_redacted() {
        let mut value = serde_json::json!({
            "server": {"listen": "127.0.0.1:8080", "api_key": "k", "Auth_Token": "t"},
            "model": [{"backends": ["user:pw@10.0.0.1:8000", "10.0.0.2:8000"]}],
        });
        redact(&mut value);
        assert_eq!(value["server"]["listen"], "127.0.0.1:8080");
        assert_eq!(value["server"]["api_key"], "<redacted>");
        assert_eq!(value["server"]["Auth_Token"], "<redacted>");
        assert_eq!(value["model"][0]["backends"][0], "<redacted>@10.0.0.1:8000");
        assert_eq!(value["model"][0]["backends"][1], "10.0.0.2:8000");
    }
}
