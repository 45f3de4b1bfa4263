//! The admin listener (SPEC 6): `GET /metrics` (Prometheus text), `GET /debug/queue`,
//! `GET /debug/backends` and `GET /debug/config` (JSON), `GET /status` (the HTML status page,
//! [`status`](super::status)), and `POST /admin/reload` (a live
//! reload, as SIGHUP; 200 with the new generation, 409 with the error when refused). One
//! thread, blocking I/O, one request per connection with short timeouts: scrapes are rare and
//! small, and this keeps the admin path off the shards.
//!
//! With `server.admin_token_sha256` set (issue \[11\]), every route, unknown ones included, needs
//! the admin token: `Authorization: Bearer <token>`, or `Basic` with the token as the password
//! and any user name, so that a browser asked by the 401's challenge can open `/status` (and
//! sends the same credentials with the page's polls). Anything else is a 401 with
//! `WWW-Authenticate: Bearer` and `WWW-Authenticate: Basic realm="warmpath admin"` (two field
//! lines, which RFC 9110 5.3 makes the same as one `Bearer, Basic realm="warmpath admin"`;
//! browsers parse separate lines more reliably). The token is read from the active generation
//! on each request, so a reload that sets, changes or clears it applies to the next one.
//!
//! Out of descriptors (EMFILE), `/metrics` is what an operator needs most, and the shards, which
//! accept until none is left, would take every one. The thread keeps one in reserve
//! ([`Reserve`], opened before the shards start): an `accept` that fails for want of a
//! descriptor gives it back and is tried again at once, and the reserve is taken again as soon
//! as the scrape's connection closes. (Linux's `accept` takes its descriptor when called, not
//! when a connection arrives, so a thread already blocked in it holds one; a thread that came to
//! it late, or after a shard took the number a scrape gave back, held none and was stuck until
//! clients left. tests/descriptors.rs failed that way once, in CI.)

use std::io::{self, Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::{Tick, TickRate};
use crate::config::{QueueConfig, Setting};
use crate::scheduler::decode::GAP_SCALE;
use crate::scheduler::estimate::{BackendEstimates, TokenRate};
use crate::scheduler::Lane;

use super::exposition::{hit_ratios, reports};
use super::generation::{Generation, Model};
use super::report::{BackendReport, Report, OLDEST_WAITING_MAX};
use super::Shared;

/// The 401's challenges (see the module doc).
const CHALLENGE: &str =
    "WWW-Authenticate: Bearer\r\nWWW-Authenticate: Basic realm=\"warmpath admin\"\r\n";
const UNAUTHORIZED: &[u8] = b"the admin listener needs its token: Authorization: Bearer <token>, \
or Basic with the token as the password\n";

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

/// How long the admin thread waits after a failed `accept` before the next.
const ACCEPT_RETRY: std::time::Duration = std::time::Duration::from_millis(100);

/// The descriptor the admin thread holds in reserve for a scrape while the shards have taken
/// every other one (see the module doc): an open `/dev/null`, or none while given back.
#[derive(Debug)]
pub struct Reserve(Option<std::fs::File>);

impl Reserve {
    /// Takes the reserve (none when not even one descriptor is free: the thread then waits for
    /// one like the shards do).
    pub fn open() -> Reserve {
        Reserve(std::fs::File::open("/dev/null").ok())
    }

    /// Gives the descriptor back, for the next `accept` to take; false when none was held.
    fn release(&mut self) -> bool {
        self.0.take().is_some()
    }

    /// Takes a descriptor again if none is held.
    fn refill(&mut self) {
        if self.0.is_none() {
            *self = Reserve::open();
        }
    }
}

impl AdminThread {
    /// Serves `listener` until stopped, keeping `reserve` for when descriptors run out.
    pub fn spawn(
        listener: TcpListener,
        mut reserve: Reserve,
        shared: Arc<Shared>,
    ) -> io::Result<AdminThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let addr = listener.local_addr()?;
        let flag = Arc::clone(&stop);
        let join = std::thread::Builder::new().name("admin".into()).spawn(move || {
            for stream in listener.incoming() {
                if flag.load(Ordering::Acquire) {
                    return;
                }
                match stream {
                    Ok(stream) => {
                        // The connection's descriptor closes within `serve`; the reserve takes
                        // it back at once if it was the reserve's.
                        let _ = serve(stream, &shared);
                        reserve.refill();
                    }
                    // Out of descriptors (EMFILE): the reserve's is free for the next accept.
                    Err(_) if reserve.release() => {}
                    // None in reserve either: the connection stays queued, and a blocking accept
                    // would fail again at once; wait rather than spin on a core.
                    Err(_) => {
                        std::thread::sleep(ACCEPT_RETRY);
                        reserve.refill();
                    }
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

/// An admin request's method, path (without its query) and `Authorization` values.
struct AdminRequest {
    method: String,
    path: String,
    authorization: Vec<Vec<u8>>,
}

/// Reads one request head; `None` when the peer closed first or sent a bad head (answered).
fn read_head(stream: &mut TcpStream) -> io::Result<Option<AdminRequest>> {
    let mut buf = vec![0; HEAD_MAX];
    let mut len = 0;
    loop {
        let n = stream.read(&mut buf[len..])?;
        if n == 0 {
            return Ok(None);
        }
        len += n;
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..len]) {
            Ok(httparse::Status::Complete(_)) => {
                let method = req.method.unwrap_or("").to_owned();
                let path = req.path.unwrap_or("").split('?').next().unwrap_or("").to_owned();
                let authorization = (req.headers.iter())
                    .filter(|h| h.name.eq_ignore_ascii_case("authorization"))
                    .map(|h| h.value.to_vec())
                    .collect();
                return Ok(Some(AdminRequest { method, path, authorization }));
            }
            Ok(httparse::Status::Partial) if len < HEAD_MAX => {}
            _ => {
                respond(stream, 400, "text/plain", b"bad request\n")?;
                return Ok(None);
            }
        }
    }
}

fn serve(mut stream: TcpStream, shared: &Shared) -> io::Result<()> {
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    let Some(AdminRequest { method, path, authorization }) = read_head(&mut stream)? else {
        return Ok(());
    };
    if let Some(expected) = shared.generation().admin_token {
        let values = authorization.iter().map(Vec::as_slice);
        if !crate::credential::admin_allows(values, &expected) {
            return respond_with(&mut stream, 401, "text/plain", CHALLENGE, UNAUTHORIZED);
        }
    }
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
        "/status" => {
            let page = super::status::render(shared);
            let policy = super::status::content_security_policy();
            let headers = format!(
                "Content-Security-Policy: {policy}\r\nCache-Control: no-store\r\n\
                 X-Content-Type-Options: nosniff\r\nReferrer-Policy: no-referrer\r\n"
            );
            respond_with(&mut stream, 200, "text/html; charset=utf-8", &headers, page.as_bytes())
        }
        _ => respond(&mut stream, 404, "text/plain", b"not found\n"),
    }
}

fn respond(stream: &mut TcpStream, status: u16, content_type: &str, body: &[u8]) -> io::Result<()> {
    respond_with(stream, status, content_type, "", body)
}

/// A response with `headers` (complete lines, each ending in CRLF) after the content type.
fn respond_with(
    stream: &mut TcpStream,
    status: u16,
    content_type: &str,
    headers: &str,
    body: &[u8],
) -> io::Result<()> {
    let reason = match status {
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        409 => "Conflict",
        _ => "Method Not Allowed",
    };
    let head = format!(
        "HTTP/1.1 {status} {reason}\r\nContent-Type: {content_type}\r\n{headers}Content-Length: {}\r\n\
         Connection: close\r\n\r\n",
        body.len()
    );
    stream.write_all(head.as_bytes())?;
    stream.write_all(body)?;
    stream.flush()
}

/// `GET /metrics`: see [`exposition`](super::exposition).
pub fn render_metrics(shared: &Shared) -> String {
    super::exposition::render(shared)
}

/// `GET /debug/queue`.
pub fn debug_queue(shared: &Shared) -> serde_json::Value {
    let generation = shared.generation();
    queue_json(&generation, &reports(&generation), shared.clock.now(), shared.clock.rate())
}

/// `/debug/queue`'s document for `generation` with its models' `reports` (in model order), at
/// `now`.
pub fn queue_json(
    generation: &Generation,
    reports: &[Report],
    now: Tick,
    rate: TickRate,
) -> serde_json::Value {
    let models: Vec<serde_json::Value> = generation
        .models
        .iter()
        .zip(reports)
        .map(|(model, report)| model_queue_json(model, report, now, rate))
        .collect();
    serde_json::json!({ "models": models })
}

/// One model of `/debug/queue`.
fn model_queue_json(
    model: &Model,
    report: &Report,
    now: Tick,
    rate: TickRate,
) -> serde_json::Value {
    let per_lane = |values: [u64; 4]| -> serde_json::Map<String, serde_json::Value> {
        Lane::ALL
            .iter()
            .map(|&lane| (lane.name().to_owned(), values[lane as usize].into()))
            .collect()
    };
    let queued: u32 = report.depth.iter().sum();
    let since = |at: Tick| rate.duration(now.saturating_sub(at)).as_secs_f64() * 1e3;
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
    let oldest: Vec<serde_json::Value> = report
        .oldest_waiting
        .iter()
        .map(|w| {
            serde_json::json!({
                "id": format!("wp-{:016x}", w.id.0),
                "lane": w.lane.name(),
                "wait_ms": since(w.arrived_at),
                "session": w.has_session,
                "retries": w.retries,
            })
        })
        .collect();
    serde_json::json!({
        "model": model.name,
        "live": model.live,
        "queued": queued,
        "depth": per_lane(report.depth.map(u64::from)),
        "admitted": per_lane(report.stats.admitted),
        "inflight": report.inflight,
        "sessions_tracked": report.sessions_tracked,
        "sessions_active": report.sessions_active,
        "oldest_wait_ms": report.oldest_arrival.map(since),
        "oldest_waiting": oldest,
        "oldest_waiting_max": OLDEST_WAITING_MAX,
        "limits": limits_json(&model.config.queue),
        "backends": backends,
    })
}

/// A model's queue limits, as `/debug/queue` shows them.
fn limits_json(q: &QueueConfig) -> serde_json::Value {
    serde_json::json!({
        "strategy": q.strategy.name(),
        "max_queued": q.max_queued,
        "inflight_per_backend": setting_json(q.inflight_per_backend),
        "prefill_tokens_per_backend": setting_json(q.prefill_tokens_per_backend),
        "timeout_ms": q.timeout.as_millis() as u64,
        "max_overtakes": q.max_overtakes,
        "boosted_streak_max": q.boosted_streak_max,
        "grace_period_ms": q.grace_period.as_millis() as u64,
        "max_sessions": q.max_sessions,
    })
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
    let generation = shared.generation();
    backends_json(&generation, &reports(&generation), shared.clock.now(), shared.clock.rate())
}

/// `/debug/backends`'s document for `generation` with its models' `reports`, at `now`.
pub fn backends_json(
    generation: &Generation,
    reports: &[Report],
    now: Tick,
    rate: TickRate,
) -> serde_json::Value {
    let mut backends = Vec::new();
    let stale_after = rate.ticks(generation.config.upstream.metrics_stale_after);
    for (model, report) in generation.models.iter().zip(reports) {
        for (backend, b) in model.backends.iter().zip(&report.backends) {
            let scraped = b.scraped_at > 0;
            let age_ms = scraped
                .then(|| rate.duration(now.saturating_sub(b.scraped_at)).as_secs_f64() * 1e3);
            let live = backend.live && model.live;
            let gates = gates_json(b, stale_after, now);
            backends.push(serde_json::json!({
                "model": model.name,
                "backend": backend.authority,
                "healthy": b.healthy,
                "ejected": b.ejected,
                "live": live,
                "waiting": b.waiting,
                "last_scrape_age_ms": age_ms,
                "inflight": b.inflight,
                "held_slots": b.holds,
                "prefill_tokens": b.prefill_tokens,
                "gates": gates,
                "learned": learned_json(&b.estimates, &report.token_rate, now, rate),
            }));
        }
    }
    serde_json::json!({ "backends": backends })
}

/// The states of a backend's admission gates (S6 (b), as `scheduler::policy::Gates::eligible`
/// applies them) as of its report: `slots` (inflight plus grace holds against the backend's
/// inflight cap, `inflight_per_backend` or learned: `open` | `full`), `engine_waiting` (the
/// engine's waiting gauge: `open` when 0, `closed` when positive, `stale` when older than
/// `metrics_stale_after`, `unknown` when never scraped) and `prefill_budget` (the backlog against
/// the admission budget: `open` | `full` | `off`).
fn gates_json(b: &BackendReport, stale_after: Tick, now: Tick) -> serde_json::Value {
    let slots = if b.inflight + b.holds < b.estimates.inflight_cap { "open" } else { "full" };
    let waiting = match b.waiting {
        None => "unknown",
        Some(_) if now >= b.scraped_at.saturating_add(stale_after) => "stale",
        Some(0) => "open",
        Some(_) => "closed",
    };
    let budget = match b.estimates.budget {
        0 => "off",
        budget if b.prefill_tokens < budget => "open",
        _ => "full",
    };
    serde_json::json!({ "slots": slots, "engine_waiting": waiting, "prefill_budget": budget })
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
    let gap_ns = e.decode_gap as f64 / GAP_SCALE as f64 / rate.ticks_per_ns();
    let decode_ms = (e.decode_gap > 0).then_some(gap_ns / 1e6);
    let ratio_at = if e.hit_ratio_at > 0 { e.hit_ratio_at } else { e.counter_at };
    serde_json::json!({
        "prefill_tokens_per_second": prefill,
        "prefill_rate_age_ms": age(e.rate_at, prefill.is_some()),
        "admission_budget_tokens": e.budget,
        "admission_budget_age_ms": age(e.budget_at, e.budget_at > 0),
        "inflight_cap": e.inflight_cap,
        "kv_capacity_tokens": (e.kv_capacity_tokens > 0).then_some(e.kv_capacity_tokens),
        "kv_capacity_age_ms": age(e.kv_capacity_at, e.kv_capacity_tokens > 0),
        "prefix_index_capacity_blocks": e.index_capacity,
        "prefix_hit_ratio_predicted": predicted,
        "prefix_hit_ratio_engine": engine,
        "prefix_hit_ratio_age_ms": age(ratio_at, engine.is_some()),
        "kv_pressure": (e.kv_pressure_at > 0).then(|| e.kv_pressure_micro as f64 / 1e6),
        "kv_pressure_age_ms": age(e.kv_pressure_at, e.kv_pressure_at > 0),
        "kv_held": (e.kv_capacity_tokens > 0).then(|| e.kv_held_micro as f64 / 1e6),
        "decode_weight_tokens": e.decode_weight,
        "decode_ms_per_token": decode_ms,
        "decode_ms_per_token_age_ms": age(e.decode_gap_at, decode_ms.is_some()),
        "expected_output_tokens": (e.expected_output > 0).then_some(e.expected_output),
        "engine_restarts": e.restarts,
        "engine_restart_age_ms": age(e.restarted_at, e.restarts > 0),
        "tokens_per_byte": tokens.per_byte_micro() as f64 / 1e6,
        "tokens_per_byte_samples": tokens.samples,
        "tokens_per_byte_age_ms": age(tokens.updated_at, tokens.samples > 0),
    })
}

/// Words of key names whose values `/debug/config` never shows: a key is secret when one of
/// its `_`-separated words (lowercase) is one of these, or it contains `api_key`, or ends in
/// `_sha256` (a key digest: safe for a random token, but a guessable one could be searched
/// for). So `admin_token_sha256` and `api_key_sha256` are hidden, `tokens_per_minute` is not.
const SECRET_WORDS: [&str; 5] = ["secret", "password", "token", "authorization", "auth"];

/// Whether `/debug/config` hides the value of key `key`.
fn is_secret(key: &str) -> bool {
    let key = key.to_ascii_lowercase();
    key.contains("api_key")
        || key.ends_with("_sha256")
        || key.split('_').any(|word| SECRET_WORDS.contains(&word))
}

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

/// Replaces the values of secret keys ([`is_secret`]) and backends' `user:password@` parts in
/// place.
fn redact(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            for (key, value) in map.iter_mut() {
                if is_secret(key) {
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
        for secret in ["admin_token_sha256", "api_key_sha256", "password", "x_secret", "auth"] {
            assert!(is_secret(secret), "{secret}");
        }
        for open in ["tokens_per_minute", "prefill_tokens_per_backend", "cost_slack_tokens"] {
            assert!(!is_secret(open), "{open}");
        }
    }
}
