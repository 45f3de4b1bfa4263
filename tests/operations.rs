//! Operations end to end on loopback (issue [4/6]): the access log, `/debug/config`, the
//! counters of `/metrics` after a scripted sequence, the drain, and live reconfiguration.
//! Like `tests/serve.rs`, every wait polls with a deadline; each test finishes in seconds.

mod support;

use std::path::PathBuf;

use serde_json::Value;
use support::backend::{Backend, Reply};
use support::client::{self, chat_request, Conn};
use support::router::Setup;
use support::{eventually, wait_until, PATIENCE};

const M: &str = "m";

fn setup(backends: &[&Backend]) -> Setup {
    let addresses: Vec<String> = backends.iter().map(|b| b.address()).collect();
    Setup::new().model(M, &addresses)
}

/// A fresh path under the test target directory.
fn temp_path(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("operations-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// The access log's lines once it holds at least `n`.
fn log_lines(path: &PathBuf, n: usize) -> Vec<Value> {
    wait_until(&format!("{n} access-log lines"), PATIENCE, || {
        let text = std::fs::read_to_string(path).ok()?;
        let lines: Vec<Value> =
            text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
        (lines.len() >= n).then_some(lines)
    })
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
