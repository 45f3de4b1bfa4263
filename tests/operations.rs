//! Operations end to end on loopback (issue [4/6]): the access log, `/debug/config`, the
//! counters of `/metrics` after a scripted sequence, the drain, and live reconfiguration.
//! Like `tests/serve.rs`, every wait polls with a deadline; each test finishes in seconds.

mod support;

use std::path::PathBuf;

use serde_json::Value;
use support::backend::{Backend, Reply};
use support::client::{self, chat_request, Conn};
use support::router::Setup;
use support::{wait_until, PATIENCE};

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
