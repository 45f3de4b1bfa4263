//! Operations end to end on loopback (issue [4/6]): the access log, `/debug/config`, the
//! counters of `/metrics` after a scripted sequence, the drain, and live reconfiguration.
//! Like `tests/serve.rs`, every wait polls with a deadline; each test finishes in seconds.

mod support;

use std::path::PathBuf;

use serde_json::Value;
use support::backend::{Backend, Reply};
use support::client::{self, chat_request, Conn};
use support::router::Setup;
use support::{eventually, log_lines, wait_until, PATIENCE};

const M: &str = "m";

fn setup(backends: &[&Backend]) -> Setup {
    let addresses: Vec<String> = backends.iter().map(|b| b.address()).collect();
    Setup::new().model(M, &addresses)
}

/// A fresh path under the test target directory.
fn temp_path(name: &str) -> PathBuf {
    support::temp_path("operations-tests", name)
}

// ---------------------------------------------------------------------------------------------
// Access log.

/// SPEC 6: a streamed request's line carries its request id, model, session, backend, status,
/// lane, queue wait, TTFB, total time and bytes both ways; a router answer and a client that
/// left get lines of their own.
#[test]
fn the_access_log_has_a_line_per_request_with_waits_and_bytes() {
    let backend = Backend::start();
    backend.set_default(Reply::Stream);
    let path = temp_path("access.jsonl");
    let router = setup(&[&backend]).server("access_log", path.to_str().unwrap()).start();

    let mut conn = Conn::open(router.addr);
    let request = chat_request(M, Some("conv-1"), true);
    conn.send(&request);
    let stream = backend.next_stream();
    conn.read_head().unwrap();
    stream.event("{\"i\":0}");
    assert_eq!(conn.next_event().unwrap().as_deref(), Some("data: {\"i\":0}"));
    stream.done();
    assert_eq!(conn.next_event().unwrap().as_deref(), Some("data: [DONE]"));
    assert_eq!(conn.next_event().unwrap(), None);
    let line = &log_lines(&path, 1)[0];
    assert_eq!(line["model"], M, "{line}");
    assert_eq!(line["session"], "conv-1");
    assert_eq!(line["session_source"], "header");
    assert_eq!(line["backend"], backend.address());
    assert_eq!(line["status"], 200);
    assert_eq!(line["lane"], "normal");
    assert_eq!(line["outcome"], "relayed");
    assert_eq!(line["method"], "POST");
    assert_eq!(line["path"], "/v1/chat/completions");
    let sent_id = backend.requests()[0].header("x-request-id").unwrap().to_owned();
    assert_eq!(line["request_id"], sent_id.as_str(), "the id the backend saw");
    assert!(line["queue_wait_us"].is_u64(), "{line}");
    let (ttfb, total) = (line["ttfb_us"].as_u64().unwrap(), line["total_us"].as_u64().unwrap());
    assert!(ttfb <= total, "{line}");
    assert_eq!(line["bytes_in"], request.len() as u64);
    // Head, two events re-chunked and the last chunk: more than the two events' data.
    assert!(line["bytes_out"].as_u64().unwrap() > 40, "{line}");
    assert!(line["time"].as_str().unwrap().ends_with('Z'), "{line}");

    let missing = client::exchange(router.addr, &chat_request("nope", None, false));
    assert_eq!(missing.status, 404);
    let line = &log_lines(&path, 2)[1];
    assert_eq!((line["status"].as_u64(), line["outcome"].as_str()), (Some(404), Some("router")));
    assert!(line["model"].is_null() && line["backend"].is_null(), "{line}");
    assert_eq!(line["session_source"], "none");

    let mut leaving = Conn::open(router.addr);
    leaving.send(&chat_request(M, Some("gone"), true));
    let _stream = backend.next_stream();
    drop(leaving);
    let line = &log_lines(&path, 3)[2];
    assert_eq!(line["outcome"], "client_gone", "{line}");
    assert_eq!(line["session"], "gone");
    client::wait_idle(router.admin, M);
    let metrics = client::metrics(router.admin);
    assert_eq!(client::metric(&metrics, "warmpath_access_log_dropped_total", &[]), Some(0.0));
}

/// After logrotate moves the access log away, a reload (its `postrotate`) makes the router
/// write to a new file at the path; the moved file keeps what was written before. A reload
/// whose configuration is refused reopens the file all the same.
#[test]
fn a_reload_reopens_the_access_log_after_a_rotation() {
    let backend = Backend::start();
    let (path, config) = (temp_path("rotated.jsonl"), temp_path("rotated.toml"));
    let rotated = path.with_extension("jsonl.1");
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&rotated);
    let router =
        setup(&[&backend]).server("access_log", path.to_str().unwrap()).start_from_file(&config);
    let exchange = || client::exchange(router.addr, &chat_request(M, None, false)).status;
    assert_eq!(exchange(), 200);
    log_lines(&path, 1);
    std::fs::rename(&path, &rotated).unwrap();
    // Before the reload the open file is the moved one.
    assert_eq!(exchange(), 200);
    log_lines(&rotated, 2);
    assert_eq!(reload(&router).0, 200);
    assert_eq!(exchange(), 200);
    assert_eq!(log_lines(&path, 1).len(), 1, "the new file has the line after the reload");
    assert_eq!(log_lines(&rotated, 2).len(), 2, "the moved file has no more");
    // Again, with a configuration the reload refuses.
    std::fs::rename(&path, &rotated).unwrap();
    std::fs::write(&config, "[queue]\ntimeout = \"soon\"\n").unwrap();
    assert_eq!(reload(&router).0, 409);
    assert_eq!(exchange(), 200);
    assert_eq!(log_lines(&path, 1).len(), 1);
    client::wait_idle(router.admin, M);
}

// ---------------------------------------------------------------------------------------------
// Live reconfiguration and /debug/config.

/// `POST /admin/reload`: the status and the JSON body.
fn reload(router: &support::router::Router) -> (u16, Value) {
    let response =
        client::exchange(router.admin, &client::request("POST", "/admin/reload", &[], b""));
    (response.status, response.json())
}

fn debug_config(router: &support::router::Router) -> Value {
    let response = client::get(router.admin, "/debug/config");
    assert_eq!(response.status, 200, "{}", response.text());
    response.json()
}

/// The proof: a reload that adds a backend (it starts receiving traffic), one that
/// removes a backend (its in-flight response completes, no new request reaches it), and a bad
/// file (refused with its error, the running configuration kept); `/debug/config` names the
/// active generation throughout.
#[test]
fn a_reload_adds_and_removes_backends_and_refuses_a_bad_file() {
    let (a, b) = (Backend::start(), Backend::start());
    let path = temp_path("reload-backends.toml");
    let one = setup(&[&a]).model_key("routing", "round-robin");
    let router = one.start_from_file(&path);
    let config = debug_config(&router);
    assert_eq!(config["generation"], 1);
    assert_eq!(config["source"], path.to_str().unwrap());
    assert_eq!(config["config"]["model"][0]["backends"], serde_json::json!([a.address()]));

    // Added: b takes its share of the next requests.
    let two = setup(&[&a, &b]).model_key("routing", "round-robin");
    std::fs::write(&path, two.toml()).unwrap();
    assert_eq!(reload(&router), (200, serde_json::json!({"generation": 2})));
    for _ in 0..4 {
        let response = client::exchange(router.addr, &chat_request(M, None, false));
        assert_eq!(response.status, 200);
    }
    assert!(b.request_count() >= 1, "the added backend receives traffic");
    assert_eq!(a.request_count() + b.request_count(), 4);

    // Removed while it serves a request: that response completes; nothing new reaches it.
    b.hold();
    a.hold();
    let mut held = Vec::new();
    for _ in 0..2 {
        let mut conn = Conn::open(router.addr);
        conn.send(&chat_request(M, None, false));
        held.push(conn);
    }
    a.wait_holding(1);
    b.wait_holding(1);
    let b_before = b.request_count();
    std::fs::write(&path, one.toml()).unwrap();
    assert_eq!(reload(&router).0, 200);
    eventually("the removed backend is reported not live", || {
        let backends = client::debug_queue(router.admin)["models"][0]["backends"].clone();
        backends[1]["live"] == false && backends[0]["live"] == true
    });
    b.release_all();
    a.release_all();
    for mut conn in held {
        assert_eq!(conn.response().status, 200, "in-flight responses complete");
    }
    for _ in 0..3 {
        let response = client::exchange(router.addr, &chat_request(M, None, false));
        assert_eq!(response.status, 200);
    }
    assert_eq!(b.request_count(), b_before, "no new request reaches the removed backend");
    let b_address = b.address();
    client::wait_metric(router.admin, "warmpath_inflight", &[("backend", &b_address)], |n| {
        n == 0.0
    });

    // Refused: the error names the key; generation 3 stays, and still serves.
    std::fs::write(&path, "[queue]\ntimeout = \"soon\"\n").unwrap();
    let (status, body) = reload(&router);
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().contains("timeout"), "{body}");
    assert_eq!(body["generation"], 3);
    let config = debug_config(&router);
    assert_eq!(config["generation"], 3);
    assert_eq!(config["config"]["model"][0]["backends"], serde_json::json!([a.address()]));
    let response = client::exchange(router.addr, &chat_request(M, None, false));
    assert_eq!(response.status, 200);
    let metrics = client::metrics(router.admin);
    assert_eq!(client::metric(&metrics, "warmpath_config_generation", &[]), Some(3.0));
    assert_eq!(client::metric(&metrics, "warmpath_config_reloads_refused_total", &[]), Some(1.0));
    let up = [("model", M), ("backend", b_address.as_str())];
    assert_eq!(client::metric(&metrics, "warmpath_backend_up", &up), Some(0.0), "removed");
    client::wait_idle(router.admin, M);
}

/// Under prefix-cost the prompt pool has a slot per queue and admission slot, and grows with a
/// reload that raises them: after a reload raises `max_queued`, a request past the starting
/// pool's slots gets one (it carries its blocks; none is counted as exhausted) and is served.
#[test]
fn a_reload_raising_max_queued_grows_the_prompt_pool() {
    let backend = Backend::start();
    let path = temp_path("reload-prompt-pool.toml");
    let small = setup(&[&backend]).queue("max_queued", "1").queue("inflight_per_backend", "1");
    let router = small.start_from_file(&path);
    backend.hold();
    let send = |session| {
        let mut conn = Conn::open(router.addr);
        conn.send(&chat_request(M, Some(session), false));
        conn
    };
    let mut held = vec![send("one")];
    backend.wait_holding(1);
    held.push(send("two"));
    client::wait_queued(router.admin, M, 1);
    let larger = setup(&[&backend]).queue("max_queued", "3").queue("inflight_per_backend", "1");
    std::fs::write(&path, larger.toml()).unwrap();
    assert_eq!(reload(&router).0, 200);
    held.push(send("three"));
    client::wait_queued(router.admin, M, 2);
    let metrics = client::metrics(router.admin);
    let exhausted =
        client::metric(&metrics, "warmpath_prompt_pool_exhausted_total", &[("model", M)]);
    assert_eq!(exhausted, Some(0.0), "the starting two slots are taken; the pool grew a third");
    backend.release_all();
    for mut conn in held {
        assert_eq!(conn.response().status, 200);
    }
    client::wait_idle(router.admin, M);
}

/// A reload adds a model (served at once, listed in `/v1/models`), removes one (404 for new
/// requests) and changes queue parameters, without dropping a queued request.
#[test]
fn a_reload_adds_and_removes_models_and_keeps_queued_requests() {
    let (a, b) = (Backend::start(), Backend::start());
    let path = temp_path("reload-models.toml");
    let first = setup(&[&a]).queue("inflight_per_backend", "1");
    let router = first.start_from_file(&path);
    a.hold();
    let mut occupant = Conn::open(router.addr);
    occupant.send(&chat_request(M, Some("occupant"), false));
    a.wait_holding(1);
    let mut queued = Conn::open(router.addr);
    queued.send(&chat_request(M, Some("queued"), false));
    client::wait_queued(router.admin, M, 1);

    let second = setup(&[&a])
        .queue("inflight_per_backend", "2")
        .model("m2", &[b.address()])
        .queue("max_overtakes", "3");
    std::fs::write(&path, second.toml()).unwrap();
    assert_eq!(reload(&router).0, 200);
    // The raised cap admits the queued request: nothing queued was lost.
    a.wait_holding(2);
    let response = client::exchange(router.addr, &chat_request("m2", None, false));
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(b.request_count(), 1);
    let models = client::get(router.addr, "/v1/models").json();
    let ids: Vec<&str> =
        models["data"].as_array().unwrap().iter().map(|m| m["id"].as_str().unwrap()).collect();
    assert_eq!(ids, [M, "m2"]);
    let limits = &client::model_queue(router.admin, M)["limits"];
    assert_eq!(
        (limits["inflight_per_backend"].as_u64(), limits["max_overtakes"].as_u64()),
        (Some(2), Some(3))
    );

    // m removed: new requests 404, its in-flight ones finish.
    std::fs::write(&path, Setup::new().model("m2", &[b.address()]).toml()).unwrap();
    assert_eq!(reload(&router).0, 200);
    let response = client::exchange(router.addr, &chat_request(M, None, false));
    response.assert_error(404, "model_not_found");
    a.release_all();
    assert_eq!(occupant.response().status, 200);
    assert_eq!(queued.response().status, 200);
    assert_eq!(debug_config(&router)["generation"], 3);
}

// ---------------------------------------------------------------------------------------------
// /metrics after a scripted sequence.

/// The proof: a retried, three warm-ups, boosted and forced follow-ups, a cancelled and
/// a timed-out request, then every counter of SPEC 6 that they touch has its exact value.
#[test]
#[allow(clippy::too_many_lines)] // one script, read top to bottom; older than the lint
fn metrics_count_a_scripted_sequence_exactly() {
    let backend = Backend::start();
    let router = setup(&[&backend])
        .queue("inflight_per_backend", "1")
        .queue("max_overtakes", "1")
        .queue("timeout", "1s")
        .start();
    let ok = |session: Option<&str>| {
        let response = client::exchange(router.addr, &chat_request(M, session, false));
        assert_eq!(response.status, 200, "{}", response.text());
    };
    // Retried: reset before any response byte on a fresh connection, then answered.
    backend.script(Reply::Reset);
    ok(None);
    // Warm-ups: sessions A, B, C complete in that order. The anonymous request before them
    // started a derived session of its own (issue [10], `derive_sessions`), tracked like any.
    for (n, session) in (2..).zip(["A", "B", "C"]) {
        ok(Some(session));
        eventually("the session is tracked", || {
            client::model_queue(router.admin, M)["sessions_tracked"].as_u64() == Some(n)
        });
    }
    // Boosted and forced: behind an occupant, follow-ups A, B, C wait; C (most recent) goes
    // first, boosted; that overtakes A and B once each, so both are then forced (S4), in
    // arrival order.
    backend.hold();
    let mut occupant = Conn::open(router.addr);
    occupant.send(&chat_request(M, None, false));
    backend.wait_holding(1);
    let mut follow_ups = Vec::new();
    for (n, session) in (1..).zip(["A", "B", "C"]) {
        let mut conn = Conn::open(router.addr);
        conn.send(&chat_request(M, Some(session), false));
        client::wait_queued(router.admin, M, n);
        follow_ups.push(conn);
    }
    let before = backend.request_count();
    let mut order = Vec::new();
    for n in 1..=3 {
        backend.release(1);
        let requests = backend.wait_for_requests(before + n, PATIENCE);
        order.push(requests.last().unwrap().session.clone().unwrap());
    }
    assert_eq!(order, ["C", "A", "B"]);
    // The occupant, C and A were released; B is held while two more queue behind it.
    let mut b = follow_ups.remove(1);
    for mut conn in follow_ups.into_iter().chain([occupant]) {
        assert_eq!(conn.response().status, 200);
    }
    // Cancelled: queued behind B, the client leaves. Timed out: queued past 1 s.
    let mut cancelled = Conn::open(router.addr);
    cancelled.send(&chat_request(M, None, false));
    client::wait_queued(router.admin, M, 1);
    drop(cancelled);
    client::wait_metric(router.admin, "warmpath_queue_cancelled_total", &[("model", M)], |n| {
        n == 1.0
    });
    let late = client::exchange(router.addr, &chat_request(M, None, false));
    late.assert_error(504, "queue_timeout");
    backend.release_all();
    assert_eq!(b.response().status, 200);
    client::wait_idle(router.admin, M);

    let text = wait_until("the last completion counted", PATIENCE, || {
        let text = client::metrics(router.admin);
        let done = client::metric(&text, "warmpath_requests_total", &[("status", "200")]);
        (done == Some(8.0)).then_some(text)
    });
    let value = |name: &str, labels: &[(&str, &str)]| {
        let mut labels = labels.to_vec();
        labels.push(("model", M));
        client::metric(&text, name, &labels).unwrap_or_else(|| panic!("{name}{labels:?}"))
    };
    type Expected<'a> = (&'a str, &'a [(&'a str, &'a str)], f64);
    let expected: [Expected; 17] = [
        ("warmpath_requests_total", &[("status", "200")], 8.0),
        ("warmpath_requests_total", &[("status", "504")], 1.0),
        ("warmpath_admitted_total", &[("lane", "retry")], 1.0),
        ("warmpath_admitted_total", &[("lane", "normal")], 5.0),
        ("warmpath_admitted_total", &[("lane", "boosted")], 1.0),
        ("warmpath_admitted_total", &[("lane", "forced")], 2.0),
        ("warmpath_forced_total", &[], 2.0),
        ("warmpath_retries_total", &[], 1.0),
        ("warmpath_upstream_errors_total", &[("kind", "reset")], 1.0),
        ("warmpath_queue_timeouts_total", &[], 1.0),
        ("warmpath_queue_cancelled_total", &[], 1.0),
        ("warmpath_queue_rejected_total", &[("reason", "queue_full")], 0.0),
        ("warmpath_affinity_hits_total", &[], 3.0),
        // A, B, C, and the two anonymous requests that completed (the retried one and the
        // occupant), each a derived session of its own.
        ("warmpath_sessions_tracked", &[], 5.0),
        ("warmpath_queue_wait_seconds_count", &[("lane", "forced")], 2.0),
        ("warmpath_upstream_ttfb_seconds_count", &[], 8.0),
        ("warmpath_request_duration_seconds_count", &[], 9.0),
    ];
    for (name, labels, want) in expected {
        assert_eq!(value(name, labels), want, "{name}{labels:?}");
    }
    assert_eq!(client::metric(&text, "warmpath_clients_gone_total", &[]), Some(1.0));
    for lane in ["boosted", "normal", "forced"] {
        assert_eq!(value("warmpath_queue_depth", &[("lane", lane)]), 0.0);
    }
    assert_eq!(value("warmpath_inflight", &[]), 0.0);
}

// ---------------------------------------------------------------------------------------------
// The binary: SIGHUP reloads, SIGTERM drains (S13).

/// `warmpath serve --config FILE`: SIGHUP reloads the file (a model appears); SIGTERM with one
/// streaming response in flight and one request queued answers the queued one 503 at once,
/// lets the stream run to its end, and exits 0.
#[test]
fn the_binary_reloads_on_sighup_and_drains_a_stream_on_sigterm() {
    use std::net::SocketAddr;

    let backend = Backend::start();
    backend.set_default(Reply::Stream);
    let path = temp_path("binary.toml");
    let (listen, admin) =
        (support::silent::refusing_address(), support::silent::refusing_address());
    let first = setup(&[&backend])
        .server("listen", &listen)
        .server("admin_listen", &admin)
        .server("drain_timeout", "5s")
        .queue("inflight_per_backend", "1");
    std::fs::write(&path, first.toml()).unwrap();
    let mut child = support::serve_binary(&path);
    let (addr, admin): (SocketAddr, SocketAddr) = (listen.parse().unwrap(), admin.parse().unwrap());
    wait_until("the binary to listen", PATIENCE, || std::net::TcpStream::connect(addr).ok());

    std::fs::write(&path, first.clone().model("m2", &[backend.address()]).toml()).unwrap();
    support::signal(&child, "HUP");
    eventually("the reloaded model is listed", || {
        client::get(addr, "/v1/models").text().contains("\"m2\"")
    });
    assert_eq!(client::get(admin, "/debug/config").json()["generation"], 2);

    let mut streaming = Conn::open(addr);
    streaming.send(&chat_request(M, Some("s"), true));
    let stream = backend.next_stream();
    assert_eq!(streaming.read_head().unwrap().status, 200);
    stream.event("one");
    assert_eq!(streaming.next_event().unwrap().as_deref(), Some("data: one"));
    let mut queued = Conn::open(addr);
    queued.send(&chat_request(M, None, false));
    client::wait_queued(admin, M, 1);

    support::signal(&child, "TERM");
    queued.response().assert_error(503, "unavailable");
    stream.event("two");
    assert_eq!(streaming.next_event().unwrap().as_deref(), Some("data: two"));
    stream.done();
    assert_eq!(streaming.next_event().unwrap().as_deref(), Some("data: [DONE]"));
    assert_eq!(streaming.next_event().unwrap(), None, "the stream ends cleanly");
    let status = wait_until("exit after SIGTERM", PATIENCE, || child.try_wait().expect("try_wait"));
    assert_eq!(status.code(), Some(0), "{status:?}");
}

// ---------------------------------------------------------------------------------------------
// Docs against the scrape.

/// `docs/metrics.md` lists every family `/metrics` exports, and the Grafana dashboard uses
/// only families that exist.
#[test]
fn the_metrics_doc_and_the_dashboard_match_the_scrape() {
    let backend = Backend::start();
    let router = setup(&[&backend]).start();
    let text = client::metrics(router.admin);
    let families: Vec<&str> =
        text.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.split(' ').next()).collect();
    assert!(families.len() > 30, "{families:?}");
    let root = env!("CARGO_MANIFEST_DIR");
    let doc = std::fs::read_to_string(format!("{root}/docs/metrics.md")).unwrap();
    for family in &families {
        assert!(doc.contains(&format!("`{family}")), "docs/metrics.md does not list {family}");
    }
    let dashboard = std::fs::read_to_string(format!("{root}/docs/grafana-dashboard.json")).unwrap();
    let _: Value = serde_json::from_str(&dashboard).expect("the dashboard is JSON");
    for used in dashboard.split(|c: char| !(c.is_ascii_alphanumeric() || c == '_')) {
        if let Some(name) = used.strip_prefix("warmpath_") {
            let base = name.trim_end_matches("_bucket");
            let known = families.iter().any(|f| f.strip_prefix("warmpath_") == Some(base));
            assert!(known, "the dashboard uses unknown series warmpath_{name}");
        }
    }
}
