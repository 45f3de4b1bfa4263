//! Issue [11], rate limits end to end on loopback, on a simulated clock (the buckets refill
//! only when the test moves it): `requests_per_minute` and `tokens_per_minute` refuse with
//! SPEC 10's 429 `rate_limit_exceeded` and the bucket's `Retry-After`, reaching no backend; a
//! request larger than the whole bucket is a 400 `request_too_large`; reservations settle to
//! the response's `usage` (non-stream, stream with the usage event, stream without it: one
//! token per SSE event) and are refunded when the backend fails; the access log and the
//! metrics say so. The Redis store's tests are in `tests/rate_limits_redis.rs`.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;
use support::backend::{Backend, Reply};
use support::client::{self, Conn, Response};
use support::router::{Router, Setup};
use support::{eventually, log_lines, wait_until, PATIENCE};
use warmpath::clock::{Clock, SimClock};

const M: &str = "m";
const KEY_A: &str = "wp_rate-limited-tenant-a";
const KEY_B: &str = "wp_unlimited-tenant-b";

/// A fresh path under the test target directory.
fn temp_path(name: &str) -> PathBuf {
    support::temp_path("rate-limit-tests", name)
}

/// Tenant `a` with these limits (`requests_per_minute`, `tokens_per_minute`) and the
/// unlimited tenant `b`, in front of `backend`, logging to `log`.
fn setup(backend: &Backend, rpm: u64, tpm: u64, log: &Path) -> Setup {
    Setup::new()
        .model(M, &[backend.address()])
        .tenant("a", &[KEY_A])
        .tenant_key("requests_per_minute", &rpm.to_string())
        .tenant_key("tokens_per_minute", &tpm.to_string())
        .tenant("b", &[KEY_B])
        .server("access_log", log.to_str().unwrap())
}

fn start(setup: &Setup) -> (Router, SimClock) {
    let (clock, sim) = Clock::simulated();
    sim.set(1_000_000_000_000);
    (setup.start_on(clock), sim)
}

/// A chat completion body, with `max_tokens` when given.
fn body(stream: bool, max_tokens: Option<u64>) -> String {
    let max = max_tokens.map_or_else(String::new, |n| format!(",\"max_tokens\":{n}"));
    format!(
        "{{\"model\":\"{M}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}],\
         \"stream\":{stream}{max}}}"
    )
}

/// The prompt estimate of `body`: its bytes / 4, rounded up.
fn estimate(body: &str) -> u64 {
    (body.len() as u64).div_ceil(4)
}

fn chat(key: &str, body: &str) -> Vec<u8> {
    let auth = format!("Bearer {key}");
    let headers = [("Content-Type", "application/json"), ("Authorization", auth.as_str())];
    client::request("POST", "/v1/chat/completions", &headers, body.as_bytes())
}

/// Asserts SPEC 10's 429: status, `Retry-After: {seconds}`, and exactly
/// `{"error":{"message":"...","type":"rate_limit_error","code":"rate_limit_exceeded"}}`.
fn assert_limited(response: &Response, seconds: u64) {
    response.assert_error(429, "rate_limit_exceeded");
    assert_eq!(response.header("retry-after"), Some(seconds.to_string().as_str()));
    let text = response.text();
    assert!(
        text.ends_with("\",\"type\":\"rate_limit_error\",\"code\":\"rate_limit_exceeded\"}}"),
        "{text}"
    );
}

/// The value of the series `series` (the whole `name{labels}` text) in a scrape.
fn metric(router: &Router, series: &str) -> Option<f64> {
    let text = client::get(router.admin, "/metrics").text();
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

/// `requests_per_minute = 2`: two requests pass, the third is a 429 with a 30 s
/// `Retry-After` that reaches no backend, the other tenant is unaffected, and after 30 s one
/// more passes.
#[test]
fn requests_per_minute_refuses_with_429_and_the_bucket_s_retry_after() {
    let backend = Backend::start();
    let log = temp_path("requests.jsonl");
    let (router, sim) = start(&setup(&backend, 2, 0, &log));
    let mut conn = Conn::open(router.addr);
    let request = chat(KEY_A, &body(false, None));
    for _ in 0..2 {
        assert_eq!(conn.exchange(&request).status, 200);
    }
    assert_limited(&conn.exchange(&request), 30);
    assert_eq!(backend.request_count(), 2, "a limited request reaches no backend");
    assert_eq!(conn.exchange(&chat(KEY_B, &body(false, None))).status, 200, "b is unlimited");
    sim.advance(Duration::from_secs(29));
    router.wake();
    assert_limited(&conn.exchange(&request), 1);
    sim.advance(Duration::from_secs(2));
    router.wake();
    assert_eq!(conn.exchange(&request).status, 200, "one more every 30 s");
    assert_eq!(
        metric(&router, "warmpath_rate_limited_total{tenant=\"a\",limit=\"requests\"}"),
        Some(2.0)
    );
    assert_eq!(
        metric(&router, "warmpath_rate_limited_total{tenant=\"b\",limit=\"requests\"}"),
        Some(0.0)
    );
    assert_eq!(
        metric(&router, "warmpath_requests_total{model=\"m\",status=\"429\",tenant=\"a\"}"),
        Some(2.0)
    );
    let lines = log_lines(&log, 6);
    let limited: Vec<&Value> = lines.iter().filter(|l| l["status"] == 429).collect();
    assert_eq!(limited.len(), 2);
    assert!(limited.iter().all(|l| l["rate_limited"] == "requests" && l["tenant"] == "a"));
    assert!(lines.iter().filter(|l| l["status"] == 200).all(|l| l["rate_limited"].is_null()));
}

/// `tokens_per_minute = 1000`: a request reserves its prompt estimate plus `max_tokens`; what
/// the bucket lacks is a 429 whose `Retry-After` is the time it takes to refill; the
/// reservation settles to the response's `usage` (here 5 + 5 tokens), so the next large
/// request fits; one larger than the whole bucket is a 400 that never waits.
#[test]
fn tokens_per_minute_reserves_settles_to_usage_and_refuses_what_cannot_fit() {
    let backend = Backend::start();
    let log = temp_path("tokens.jsonl");
    let (router, _sim) = start(&setup(&backend, 0, 1000, &log));
    let mut conn = Conn::open(router.addr);
    let first = body(false, Some(600));
    let reserved = estimate(&first) + 600;
    // Held, the first request keeps its whole reservation.
    backend.set_default(Reply::Hold);
    conn.send(&chat(KEY_A, &first));
    backend.wait_holding(1);
    let mut other = Conn::open(router.addr);
    let second = body(false, Some(600));
    let over = reserved + estimate(&second) + 600 - 1000;
    // `over` tokens at 1000 a minute: 60 ms each, rounded up to whole seconds.
    let response = other.exchange(&chat(KEY_A, &second));
    assert_limited(&response, (over * 60).div_ceil(1000));
    backend.release_all();
    assert_eq!(conn.response().status, 200);
    // Settled to usage: 10 tokens used, so 990 are free again.
    let fits = body(false, Some(990 - 1 - estimate(&body(false, Some(990)))));
    backend.set_default(Reply::Complete);
    assert_eq!(other.exchange(&chat(KEY_A, &fits)).status, 200, "the reservation was settled");
    let too_large = other.exchange(&chat(KEY_A, &body(false, Some(1000))));
    too_large.assert_error(400, "request_too_large");
    assert_eq!(too_large.header("retry-after"), None, "it would never fit: no Retry-After");
    assert!(too_large.json()["error"]["message"].as_str().unwrap().contains("tokens_per_minute"));
    assert_eq!(backend.request_count(), 2);
    let lines = log_lines(&log, 4);
    let ok: Vec<&Value> = lines.iter().filter(|l| l["status"] == 200).collect();
    assert_eq!(ok[0]["tokens_reserved"], reserved);
    assert!(ok.iter().all(|l| l["tokens_used"] == 10), "{ok:?}");
    let refused: Vec<&Value> = lines.iter().filter(|l| l["status"] != 200).collect();
    assert!(refused.iter().all(|l| l["rate_limited"] == "tokens" && l["tokens_used"].is_null()));
    assert_eq!(
        metric(&router, "warmpath_tenant_tokens_total{tenant=\"a\",kind=\"prompt\"}"),
        Some(10.0)
    );
    assert_eq!(
        metric(&router, "warmpath_tenant_tokens_total{tenant=\"a\",kind=\"completion\"}"),
        Some(10.0)
    );
    assert_eq!(
        metric(&router, "warmpath_rate_limited_total{tenant=\"a\",limit=\"tokens\"}"),
        Some(2.0)
    );
    // A tenant without any limit has its tokens counted too (the backend's usage: 5 + 5).
    assert_eq!(other.exchange(&chat(KEY_B, &body(false, None))).status, 200);
    // The shard settles a request after writing its response: the client can scrape first.
    let settled = || metric(&router, "warmpath_tenant_tokens_total{tenant=\"b\",kind=\"prompt\"}");
    eventually("tenant b's request settled", || settled().is_some_and(|v| v > 0.0));
    assert_eq!(
        metric(&router, "warmpath_tenant_tokens_total{tenant=\"b\",kind=\"prompt\"}"),
        Some(5.0)
    );
    assert_eq!(
        metric(&router, "warmpath_tenant_tokens_total{tenant=\"b\",kind=\"completion\"}"),
        Some(5.0)
    );
}

/// A stream settles to its usage event when the client asked for one (here 7 + 3), and to its
/// prompt estimate plus one token per `data:` event when it did not; a request without
/// `max_tokens` reserves `rate_limit.default_max_tokens`.
#[test]
fn streams_settle_to_their_usage_event_or_their_event_count() {
    let backend = Backend::start();
    let log = temp_path("streams.jsonl");
    let setup = setup(&backend, 0, 100_000, &log).rate_limit("default_max_tokens", "300");
    let (router, _sim) = start(&setup);
    let mut conn = Conn::open(router.addr);
    // With the usage event (`stream_options.include_usage`).
    backend.set_default(Reply::Stream);
    let with_usage = body(true, Some(50));
    conn.send(&chat(KEY_A, &with_usage));
    let stream = backend.next_stream();
    for word in ["a", "b", "c"] {
        stream.event(&format!("{{\"choices\":[{{\"delta\":{{\"content\":\"{word}\"}}}}]}}"));
    }
    stream.event(
        "{\"choices\":[],\"usage\":{\"prompt_tokens\":7,\"completion_tokens\":3,\"total_tokens\":10}}",
    );
    stream.done();
    assert_eq!(conn.response().status, 200);
    // Without it: the fake backend's default stream, a role event, five words, a finish
    // event and [DONE].
    backend.set_default(Reply::Complete);
    let without = body(true, None);
    assert_eq!(conn.exchange(&chat(KEY_A, &without)).status, 200);
    let lines = log_lines(&log, 2);
    assert_eq!(
        (lines[0]["tokens_reserved"].as_u64(), lines[0]["tokens_used"].as_u64()),
        (Some(estimate(&with_usage) + 50), Some(10))
    );
    assert_eq!(lines[1]["tokens_reserved"], estimate(&without) + 300, "the default max_tokens");
    assert_eq!(lines[1]["tokens_used"], estimate(&without) + 8, "one token per event");
}

/// A request whose backend fails, or whose client leaves while it is queued, gives its
/// tokens back: a full bucket's worth can be reserved again at once.
#[test]
fn failed_and_cancelled_requests_are_refunded() {
    let backend = Backend::start();
    let log = temp_path("refunds.jsonl");
    let (router, _sim) = start(&setup(&backend, 0, 1000, &log).queue("inflight_per_backend", "1"));
    let whole = |stream| body(stream, Some(1000 - estimate(&body(stream, Some(999)))));
    let mut conn = Conn::open(router.addr);
    backend.set_default(Reply::Status(500, "{\"error\":\"engine failure\"}".into()));
    assert_eq!(conn.exchange(&chat(KEY_A, &whole(false))).status, 500);
    backend.set_default(Reply::Hold);
    let small = body(false, Some(1));
    conn.send(&chat(KEY_A, &small));
    backend.wait_holding(1);
    // Queued behind the held one (one in flight per backend), then abandoned.
    let mut leaving = Conn::open(router.addr);
    leaving.send(&chat(KEY_A, &body(false, Some(500))));
    wait_until("a queued request", PATIENCE, || {
        (client::queued(router.admin, M) == 1).then_some(())
    });
    drop(leaving);
    wait_until("the queue to empty", PATIENCE, || {
        (client::queued(router.admin, M) == 0).then_some(())
    });
    backend.release_all();
    assert_eq!(conn.response().status, 200);
    backend.set_default(Reply::Complete);
    let full = whole(false);
    let refilled = 1000 - 10;
    let fits = body(false, Some(refilled - estimate(&full) - 1));
    assert_eq!(
        conn.exchange(&chat(KEY_A, &fits)).status,
        200,
        "the failure and the cancel were refunded"
    );
    let lines = log_lines(&log, 4);
    assert_eq!(lines[0]["status"], 500);
    assert_eq!(lines[0]["tokens_used"], 0, "a backend error used nothing");
    let gone: Vec<&Value> = lines.iter().filter(|l| l["outcome"] == "client_gone").collect();
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0]["tokens_used"], 0);
}
