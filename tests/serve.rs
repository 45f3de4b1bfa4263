//! The dataplane end to end on loopback: `warmpath::server::start` in front of programmable fake
//! backends (`tests/support`), driven by a raw HTTP/1.1 client. Each test has its own router and
//! backends, waits by polling `/debug/queue`, `/metrics` or the backends (never by a fixed
//! sleep), and finishes well under 5 s.

mod support;

use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::backend::{Backend, Reply, DEFAULT_CONTENT};
use support::client::{self, chat_request, Conn};
use support::router::{Router, Setup};
use support::{eventually, now, since, wait_until, PATIENCE};

// ---------------------------------------------------------------------------------------------
// The fake backend itself.

#[test]
fn fake_backend_answers_holds_and_reports_gauges() {
    let backend = Backend::start();
    backend.set_waiting(3);
    let metrics = client::get(backend.addr(), "/metrics");
    assert_eq!(metrics.status, 200);
    assert!(metrics.text().contains("vllm:num_requests_waiting{model_name=\"m\"} 3.0"));
    assert_eq!(client::get(backend.addr(), "/health").status, 200);
    backend.set_healthy(false);
    assert_eq!(client::get(backend.addr(), "/health").status, 503);
    assert_eq!((backend.health_checks(), backend.scrapes()), (2, 1));

    let answer = client::exchange(backend.addr(), &chat_request("m", Some("s1"), false));
    assert_eq!((answer.status, answer.content()), (200, DEFAULT_CONTENT.to_owned()));

    backend.hold();
    let mut held = Conn::open(backend.addr());
    held.send(&chat_request("m", Some("s2"), false));
    backend.wait_holding(1);
    held.set_read_timeout(Duration::from_millis(50));
    assert!(held.read_response().is_err(), "a held request does not answer");
    held.set_read_timeout(PATIENCE);
    backend.release(1);
    assert_eq!(held.response().status, 200);
    let sessions: Vec<_> = backend.requests().into_iter().map(|r| r.session).collect();
    assert_eq!(sessions, [Some("s1".to_owned()), Some("s2".to_owned())]);
}

#[test]
fn fake_backend_streams_on_command_and_sees_the_client_leave() {
    let backend = Backend::start();
    backend.set_default(Reply::Stream);
    let mut conn = Conn::open(backend.addr());
    conn.send(&chat_request("m", None, true));
    let stream = backend.next_stream();
    let head = conn.read_head().unwrap();
    assert_eq!(head.header("content-type"), Some("text/event-stream"));
    stream.event("one");
    assert_eq!(conn.next_event().unwrap().as_deref(), Some("data: one"));
    stream.event("two");
    assert_eq!(conn.next_event().unwrap().as_deref(), Some("data: two"));
    drop(conn);
    eventually("the backend to see the client leave", || stream.peer_closed());

    let mut conn = Conn::open(backend.addr());
    conn.send(&chat_request("m", None, true));
    let stream = backend.next_stream();
    conn.read_head().unwrap();
    stream.event("one");
    assert_eq!(conn.next_event().unwrap().as_deref(), Some("data: one"));
    stream.die();
    let err = conn.next_event().unwrap_err();
    assert_eq!(err.kind(), std::io::ErrorKind::UnexpectedEof);
}

#[test]
fn fake_backend_auto_streams_and_resets() {
    let backend = Backend::start();
    let mut conn = Conn::open(backend.addr());
    conn.send(&chat_request("m", None, true));
    conn.read_head().unwrap();
    let mut content = String::new();
    while let Some(event) = conn.next_event().unwrap() {
        let data = event.strip_prefix("data: ").unwrap();
        if data == "[DONE]" {
            continue;
        }
        let chunk: serde_json::Value = serde_json::from_str(data).unwrap();
        content.push_str(chunk["choices"][0]["delta"]["content"].as_str().unwrap_or(""));
    }
    assert_eq!(content, DEFAULT_CONTENT);

    backend.script(Reply::Reset);
    let mut conn = Conn::open(backend.addr());
    conn.send(&chat_request("m", None, false));
    assert!(conn.read_response().is_err());
    assert_eq!(backend.resets(), 1);
    backend.stop_listening();
    assert!(std::net::TcpStream::connect(backend.addr()).is_err(), "refused after stop");
}

// ---------------------------------------------------------------------------------------------
// Streaming and scheduling through HTTP.

const M: &str = "m";

/// One model `m` on `backends`, every other key as [`Setup::new`].
fn setup(backends: &[&Backend]) -> Setup {
    let addresses: Vec<String> = backends.iter().map(|b| b.address()).collect();
    Setup::new().model(M, &addresses)
}

/// Sends a sessionless request that the (holding) backend keeps, and waits until it holds it.
fn occupy(router: &Router, backend: &Backend) -> Conn {
    let held_before = backend.holding();
    let mut conn = Conn::open(router.addr);
    conn.send(&chat_request(M, Some("occupant"), false));
    backend.wait_holding(held_before + 1);
    conn
}

#[test]
fn sse_events_reach_the_client_before_the_backend_sends_the_next() {
    let backend = Backend::start();
    backend.set_default(Reply::Stream);
    let router = setup(&[&backend]).start();
    let mut conn = Conn::open(router.addr);
    conn.send(&chat_request(M, Some("s"), true));
    let stream = backend.next_stream();
    stream.event("{\"i\":0}");
    let head = conn.read_head().expect("response head");
    assert_eq!(head.status, 200);
    assert_eq!(head.header("content-type"), Some("text/event-stream"));
    assert_eq!(conn.next_event().unwrap().as_deref(), Some("data: {\"i\":0}"));
    for i in 1..6 {
        let data = format!("{{\"i\":{i}}}");
        stream.event(&data);
        assert_eq!(conn.next_event().unwrap(), Some(format!("data: {data}")), "event {i}");
    }
    stream.done();
    assert_eq!(conn.next_event().unwrap().as_deref(), Some("data: [DONE]"));
    assert_eq!(conn.next_event().unwrap(), None, "the body ends cleanly");
    client::wait_idle(router.admin, M);
}

/// A chunked stream is passed through in the backend's own chunks, and its end is found
/// exactly: the backend connection goes back to the pool and carries the next stream. A
/// backend's chunk extensions and trailer fields do not reach the client.
#[test]
fn chunked_bodies_pass_through_and_their_backend_connection_is_reused() {
    let backend = Backend::start();
    let router = setup(&[&backend]).start();
    let mut conn = Conn::open(router.addr);
    for session in ["a", "b", "c"] {
        let response = conn.exchange(&chat_request(M, Some(session), true));
        assert_eq!((response.status, response.header("transfer-encoding")), (200, Some("chunked")));
        assert!(response.text().ends_with("data: [DONE]\n\n"), "{}", response.text());
    }
    let chats: Vec<u64> = backend
        .requests()
        .iter()
        .filter(|r| r.target == "/v1/chat/completions")
        .map(|r| r.conn)
        .collect();
    assert_eq!(chats.len(), 3);
    assert!(chats.iter().all(|&c| c == chats[0]), "one backend connection: {chats:?}");

    backend.script(Reply::Raw(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
          9;ext=\"v\"\r\ndata: a\n\n\r\n009\r\ndata: b\n\n\r\n0;last\r\nX-Trailer: t\r\n\r\n"
            .to_vec(),
    ));
    conn.send(&chat_request(M, Some("d"), true));
    let mut raw = Vec::new();
    let mut buf = [0u8; 4096];
    while !raw.ends_with(b"0\r\n\r\n") {
        let n = std::io::Read::read(&mut conn.stream(), &mut buf).expect("the relayed stream");
        assert!(n > 0, "closed early: {:?}", String::from_utf8_lossy(&raw));
        raw.extend_from_slice(&buf[..n]);
    }
    let start = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
    let want = b"9\r\ndata: a\n\n\r\n009\r\ndata: b\n\n\r\n0\r\n\r\n";
    assert_eq!(&raw[start..], want, "{:?}", String::from_utf8_lossy(&raw));
    client::wait_idle(router.admin, M);
}

/// SPEC S3's example through HTTP, on two shards: completions A, B, C; then B, C, A and a
/// sessionless request queue behind an occupied slot and are admitted C, B, A, sessionless.
#[test]
fn follow_ups_are_admitted_most_recently_completed_session_first() {
    let backend = Backend::start();
    let router =
        setup(&[&backend]).server("shards", "2").queue("inflight_per_backend", "1").start();
    for (tracked, session) in (1..).zip(["A", "B", "C"]) {
        let response = client::exchange(router.addr, &chat_request(M, Some(session), false));
        assert_eq!(response.status, 200, "warm-up {session}: {}", response.text());
        eventually(&format!("{tracked} tracked sessions"), || {
            client::model_queue(router.admin, M)["sessions_tracked"].as_u64() == Some(tracked)
        });
    }
    backend.hold();
    let mut occupant = occupy(&router, &backend);
    let mut queued = Vec::new();
    for (n, session) in (1..).zip([Some("B"), Some("C"), Some("A"), None]) {
        let mut conn = Conn::open(router.addr);
        conn.send(&chat_request(M, session, false));
        client::wait_queued(router.admin, M, n);
        queued.push(conn);
    }
    let depth = &client::model_queue(router.admin, M)["depth"];
    assert_eq!(
        (depth["boosted"].as_u64(), depth["normal"].as_u64()),
        (Some(3), Some(1)),
        "{depth}"
    );
    for (lane, depth) in [("boosted", 3.0), ("normal", 1.0), ("forced", 0.0)] {
        let labels = [("model", M), ("lane", lane)];
        client::wait_metric(router.admin, "warmpath_queue_depth", &labels, |n| n == depth);
    }
    let address = backend.address();
    let labels = [("model", M), ("backend", address.as_str())];
    client::wait_metric(router.admin, "warmpath_inflight", &labels, |n| n == 1.0);

    backend.release(1);
    assert_eq!(occupant.response().status, 200);
    let mut order = Vec::new();
    for n in 0..4 {
        let requests = backend.wait_for_requests(3 + 1 + n + 1, PATIENCE);
        order.push(requests.last().unwrap().session.clone());
        backend.release(1);
    }
    let expected = [Some("C"), Some("B"), Some("A"), None].map(|s| s.map(str::to_owned));
    assert_eq!(order, expected);
    for mut conn in queued {
        assert_eq!(conn.response().status, 200);
    }
    client::wait_idle(router.admin, M);
}

#[test]
fn a_request_queued_past_the_queue_timeout_gets_504() {
    let backend = Backend::start();
    backend.hold();
    let router =
        setup(&[&backend]).queue("inflight_per_backend", "1").queue("timeout", "200ms").start();
    let mut occupant = occupy(&router, &backend);
    let start = now();
    let response = client::exchange(router.addr, &chat_request(M, Some("late"), false));
    let waited = since(start);
    response.assert_error(504, "queue_timeout");
    response.assert_retry_after();
    assert!(waited >= Duration::from_millis(190), "answered after {waited:?}");
    assert!(waited < Duration::from_secs(3), "answered after {waited:?}");
    assert_eq!(backend.request_count(), 1, "the timed-out request never reached the backend");
    client::wait_metric(router.admin, "warmpath_queue_timeouts_total", &[("model", M)], |n| {
        n == 1.0
    });
    backend.release_all();
    assert_eq!(occupant.response().status, 200);
    client::wait_idle(router.admin, M);
}

/// With `server.busy_poll` a shard spins before it sleeps: a stream's events still reach the
/// client one at a time, and a queued request's deadline still fires (the spin ends at the
/// loop's timeout, not later).
#[test]
fn a_busy_polling_shard_relays_events_and_fires_deadlines() {
    let backend = Backend::start();
    backend.set_default(Reply::Stream);
    let router = setup(&[&backend])
        .server("busy_poll", "500us")
        .queue("inflight_per_backend", "1")
        .queue("timeout", "200ms")
        .start();
    let mut conn = Conn::open(router.addr);
    conn.send(&chat_request(M, Some("s"), true));
    let stream = backend.next_stream();
    for i in 0..4 {
        let data = format!("{{\"i\":{i}}}");
        stream.event(&data);
        if i == 0 {
            assert_eq!(conn.read_head().expect("response head").status, 200);
        }
        assert_eq!(conn.next_event().unwrap(), Some(format!("data: {data}")), "event {i}");
    }
    let start = now();
    let response = client::exchange(router.addr, &chat_request(M, Some("late"), false));
    response.assert_error(504, "queue_timeout");
    let waited = since(start);
    assert!(waited >= Duration::from_millis(190), "answered after {waited:?}");
    assert!(waited < Duration::from_secs(3), "answered after {waited:?}");
    stream.done();
    assert_eq!(conn.next_event().unwrap().as_deref(), Some("data: [DONE]"));
    assert_eq!(conn.next_event().unwrap(), None, "the body ends cleanly");
    client::wait_idle(router.admin, M);
}

#[test]
fn a_request_beyond_max_queued_gets_429() {
    let backend = Backend::start();
    backend.hold();
    let router =
        setup(&[&backend]).queue("inflight_per_backend", "1").queue("max_queued", "2").start();
    let mut occupant = occupy(&router, &backend);
    let mut queued = Vec::new();
    for n in 1..=2 {
        let mut conn = Conn::open(router.addr);
        conn.send(&chat_request(M, None, false));
        client::wait_queued(router.admin, M, n);
        queued.push(conn);
    }
    let start = now();
    let response = client::exchange(router.addr, &chat_request(M, None, false));
    response.assert_error(429, "queue_full");
    response.assert_retry_after();
    assert!(since(start) < Duration::from_secs(1), "429 comes at once");
    let labels = [("model", M), ("reason", "queue_full")];
    client::wait_metric(router.admin, "warmpath_queue_rejected_total", &labels, |n| n == 1.0);
    backend.release_all();
    assert_eq!(occupant.response().status, 200);
    for mut conn in queued {
        assert_eq!(conn.response().status, 200);
    }
    assert_eq!(backend.request_count(), 3);
}

/// S13: on shutdown, queued requests get 503 at once while the in-flight one runs to its end;
/// then every thread stops and the listener is closed.
#[test]
fn shutdown_answers_queued_requests_503_and_drains_the_inflight_one() {
    let backend = Backend::start();
    backend.hold();
    let router =
        setup(&[&backend]).queue("inflight_per_backend", "1").server("drain_timeout", "5s").start();
    let addr = router.addr;
    let mut occupant = occupy(&router, &backend);
    let mut queued = Vec::new();
    for n in 1..=2 {
        let mut conn = Conn::open(router.addr);
        conn.send(&chat_request(M, Some(&format!("q{n}")), false));
        client::wait_queued(router.admin, M, n);
        queued.push(conn);
    }
    router.shutdown();
    for mut conn in queued {
        let response = conn.response();
        response.assert_error(503, "unavailable");
        response.assert_retry_after();
    }
    assert_eq!(backend.holding(), 1, "the in-flight request is still running");
    backend.release(1);
    let response = occupant.response();
    assert_eq!((response.status, response.content()), (200, DEFAULT_CONTENT.to_owned()));
    drop(occupant);
    assert!(router.wait_within(PATIENCE), "the router stops after draining");
    assert!(TcpStream::connect(addr).is_err(), "the listener is closed after wait()");
    assert_eq!(backend.request_count(), 1);
}

/// S13: when the last in-flight response has been relayed during a drain, its connection is
/// closed (`Connection: close`) and the router stops at once, even though the client would
/// keep the connection open: `drain_timeout` bounds the drain, it is not a wait.
#[test]
fn a_drain_ends_when_the_last_inflight_response_is_relayed() {
    let backend = Backend::start();
    backend.hold();
    let router = setup(&[&backend]).server("drain_timeout", "10s").start();
    let mut occupant = occupy(&router, &backend);
    router.shutdown();
    backend.release(1);
    let response = occupant.response();
    assert_eq!(response.status, 200);
    assert_eq!(response.header("connection"), Some("close"), "{:?}", response.headers);
    assert!(occupant.closed_within(Duration::from_secs(1)), "closed after the response");
    let start = now();
    assert!(router.wait_within(PATIENCE), "the router stops");
    assert!(since(start) < Duration::from_secs(2), "stopped after {:?}", since(start));
}

// ---------------------------------------------------------------------------------------------
// Backends failing, refusing, busy.

#[test]
fn backend_error_statuses_are_relayed_as_sent_and_not_retried() {
    let (first, second) = (Backend::start(), Backend::start());
    let router = setup(&[&first, &second]).model_key("routing", "round-robin").start();
    let cases = [
        (400, r#"{"error":{"message":"bad","type":"invalid_request_error","code":"bad_thing"}}"#),
        (503, r#"{"error":{"message":"busy","type":"server_error","code":null}}"#),
        (429, r#"{"error":{"message":"slow down","type":"rate_limit","code":"rl"}}"#),
    ];
    for (n, (status, body)) in (1..).zip(cases) {
        first.set_default(Reply::Status(status, body.to_owned()));
        second.set_default(Reply::Status(status, body.to_owned()));
        let response = client::exchange(router.addr, &chat_request(M, None, false));
        assert_eq!(response.status, status);
        assert_eq!(response.text(), body, "the backend's body, unchanged");
        assert_eq!(first.request_count() + second.request_count(), n, "sent exactly once");
    }
    for (status, _) in cases {
        let labels = [("model", M), ("status", &status.to_string())];
        client::wait_metric(router.admin, "warmpath_requests_total", &labels, |n| n == 1.0);
    }
    client::wait_idle(router.admin, M);
    assert_eq!(first.request_count() + second.request_count(), 3, "no late retry");
}

/// Two healthy backends; the first then stops listening (before its next health check, 30 s
/// away): requests sent to it are refused at connect and retried on the second.
#[test]
fn a_refused_connection_is_retried_on_another_backend() {
    let (dead, live) = (Backend::start(), Backend::start());
    let router = setup(&[&dead, &live])
        .model_key("routing", "round-robin")
        .upstream("metrics_interval", "30s")
        .upstream("metrics_stale_after", "60s")
        .start();
    eventually("both backends checked once", || {
        dead.health_checks() > 0 && live.health_checks() > 0
    });
    dead.stop_listening();
    for n in 1..=2 {
        let response = client::exchange(router.addr, &chat_request(M, None, false));
        assert_eq!((response.status, response.content()), (200, DEFAULT_CONTENT.to_owned()));
        assert_eq!(live.request_count(), n);
    }
    client::wait_metric(router.admin, "warmpath_retries_total", &[("model", M)], |n| n >= 1.0);
    client::wait_idle(router.admin, M);
}

/// A backend that resets the connection before any response byte: retried on the other one.
#[test]
fn a_reset_before_any_response_byte_is_retried_on_another_backend() {
    let (resetting, live) = (Backend::start(), Backend::start());
    resetting.set_default(Reply::Reset);
    let router = setup(&[&resetting, &live]).model_key("routing", "round-robin").start();
    for n in 1..=2 {
        let response = client::exchange(router.addr, &chat_request(M, None, false));
        assert_eq!((response.status, response.content()), (200, DEFAULT_CONTENT.to_owned()));
        assert_eq!(live.request_count(), n);
    }
    assert!(resetting.resets() >= 1, "the resetting backend was tried");
    client::wait_metric(router.admin, "warmpath_retries_total", &[("model", M)], |n| n >= 1.0);
    client::wait_idle(router.admin, M);
}

/// SPEC 2.8: every attempt resets before a response byte; after `max_retries` retries the
/// client gets 502 `upstream_error`, and no attempt is made beyond them.
#[test]
fn retries_exhausted_is_a_502_after_max_retries() {
    let (first, second) = (Backend::start(), Backend::start());
    first.set_default(Reply::Reset);
    second.set_default(Reply::Reset);
    let router = setup(&[&first, &second]).upstream("max_retries", "2").start();
    let response = client::exchange(router.addr, &chat_request(M, None, false));
    response.assert_error(502, "upstream_error");
    assert_eq!(first.resets() + second.resets(), 3, "one attempt and two retries");
    let reason = [("model", M), ("reason", "retries_exhausted")];
    client::wait_metric(router.admin, "warmpath_queue_rejected_total", &reason, |n| n == 1.0);
    client::wait_metric(router.admin, "warmpath_retries_total", &[("model", M)], |n| n == 2.0);
    client::wait_idle(router.admin, M);
    assert_eq!(first.request_count() + second.request_count(), 0, "nothing was answered");
}

/// A backend that takes the request but sends no response head within
/// `upstream.header_timeout`: 502, not retried (the request may be running), slot released.
#[test]
fn no_response_head_within_the_upstream_header_timeout_is_a_502() {
    let (slow, other) = (Backend::start(), Backend::start());
    slow.hold();
    other.hold();
    let router = setup(&[&slow, &other]).upstream("header_timeout", "200ms").start();
    let start = now();
    let response = client::exchange(router.addr, &chat_request(M, None, false));
    response.assert_error(502, "upstream_error");
    assert!(since(start) >= Duration::from_millis(200), "not before the timeout");
    assert_eq!(slow.request_count() + other.request_count(), 1, "sent once, not retried");
    let labels = [("model", M), ("kind", "timeout")];
    client::wait_metric(router.admin, "warmpath_upstream_errors_total", &labels, |n| n == 1.0);
    client::wait_metric(router.admin, "warmpath_retries_total", &[("model", M)], |n| n == 0.0);
    client::wait_idle(router.admin, M);
}

/// S6.2: a vLLM backend whose `num_requests_waiting` is positive gets nothing, through several
/// fresh snapshots, until a snapshot says 0.
#[test]
fn a_backend_with_waiting_requests_gets_nothing_until_its_gauge_is_zero() {
    let backend = Backend::start();
    backend.set_waiting(2);
    let router = setup(&[&backend]).model_key("engine", "vllm").start();
    // The scheduler's own view of the gauge, not the backend's count of scrapes: a scrape is
    // answered before its snapshot reaches the scheduler, and a request that arrived in between
    // was admitted (the flake this replaced, seen under load).
    client::wait_metric(router.admin, "warmpath_backend_waiting", &[("model", M)], |n| n == 2.0);
    let mut conn = Conn::open(router.addr);
    conn.send(&chat_request(M, Some("s"), false));
    client::wait_queued(router.admin, M, 1);
    let scrapes = backend.scrapes();
    eventually("three more scrapes", || backend.scrapes() >= scrapes + 3);
    assert_eq!(client::queued(router.admin, M), 1, "still queued");
    assert_eq!(backend.request_count(), 0, "nothing sent to a backend with a queue");
    backend.set_waiting(0);
    let response = conn.response();
    assert_eq!(response.status, 200);
    assert_eq!(backend.request_count(), 1);
    client::wait_idle(router.admin, M);
}

#[test]
fn a_backend_dying_mid_stream_ends_the_client_stream_without_a_retry() {
    let (first, second) = (Backend::start(), Backend::start());
    first.set_default(Reply::Stream);
    second.set_default(Reply::Stream);
    let router = setup(&[&first, &second]).start();
    let mut conn = Conn::open(router.addr);
    conn.send(&chat_request(M, None, true));
    let (stream, other) = wait_until("a stream on either backend", PATIENCE, || {
        if first.request_count() > 0 {
            Some((first.next_stream(), &second))
        } else if second.request_count() > 0 {
            Some((second.next_stream(), &first))
        } else {
            None
        }
    });
    stream.event("one");
    let head = conn.read_head().unwrap();
    assert_eq!(head.status, 200);
    assert_eq!(conn.next_event().unwrap().as_deref(), Some("data: one"));
    stream.die();
    match head.header("transfer-encoding") {
        Some(_) => {
            let end = conn.next_event();
            assert!(end.is_err(), "a chunked body ends without its last chunk: {end:?}");
        }
        None => assert_eq!(conn.next_event().unwrap(), None, "the connection closes"),
    }
    assert!(conn.closed_within(PATIENCE), "the client connection is closed");
    client::wait_idle(router.admin, M);
    assert_eq!(other.request_count(), 0, "bytes were relayed: no retry");
}

// ---------------------------------------------------------------------------------------------
// Clients going away.

#[test]
fn a_client_gone_while_queued_is_dropped_and_counted() {
    let backend = Backend::start();
    backend.hold();
    let router = setup(&[&backend]).queue("inflight_per_backend", "1").start();
    let mut occupant = occupy(&router, &backend);
    let mut gone = Conn::open(router.addr);
    gone.send(&chat_request(M, Some("gone"), false));
    client::wait_queued(router.admin, M, 1);
    drop(gone);
    client::wait_queued(router.admin, M, 0);
    client::wait_metric(router.admin, "warmpath_queue_cancelled_total", &[("model", M)], |n| {
        n == 1.0
    });
    backend.release_all();
    assert_eq!(occupant.response().status, 200);
    let after = client::exchange(router.addr, &chat_request(M, Some("after"), false));
    assert_eq!(after.status, 200);
    let sessions: Vec<_> = backend.requests().into_iter().map(|r| r.session).collect();
    let expected = [Some("occupant"), Some("after")].map(|s| s.map(str::to_owned));
    assert_eq!(sessions, expected, "the cancelled request never reached the backend");
    client::wait_idle(router.admin, M);
}

#[test]
fn a_client_gone_mid_stream_closes_the_backend_connection() {
    let backend = Backend::start();
    backend.set_default(Reply::Stream);
    let router = setup(&[&backend]).start();
    let mut conn = Conn::open(router.addr);
    conn.send(&chat_request(M, Some("s"), true));
    let stream = backend.next_stream();
    stream.event("one");
    assert_eq!(conn.read_head().unwrap().status, 200);
    assert_eq!(conn.next_event().unwrap().as_deref(), Some("data: one"));
    assert_eq!(client::inflight(router.admin, M), 1);
    drop(conn);
    // The engine keeps producing tokens; the router must abort the upstream request.
    wait_until("the backend to see its connection close", PATIENCE, || {
        stream.event("more");
        stream.peer_closed().then_some(())
    });
    client::wait_idle(router.admin, M);
    assert_eq!(client::backend_inflight(router.admin, M, &backend.address()), 0);
}

// ---------------------------------------------------------------------------------------------
// Connections and forwarding.

#[test]
fn keep_alive_serves_two_requests_on_one_connection() {
    let backend = Backend::start();
    let router = setup(&[&backend]).server("shards", "2").start();
    let mut conn = Conn::open(router.addr);
    for session in ["a", "b"] {
        let response = conn.exchange(&chat_request(M, Some(session), false));
        assert_eq!((response.status, response.content()), (200, DEFAULT_CONTENT.to_owned()));
    }
    assert_eq!(backend.request_count(), 2);
    let labels = [("model", M), ("status", "200")];
    client::wait_metric(router.admin, "warmpath_requests_total", &labels, |n| n == 2.0);
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let backend = Backend::start();
    let router = setup(&[&backend]).start();
    let mut conn = Conn::open(router.addr);
    let body = client::chat_body(M, false).into_bytes();
    let mut both = Vec::new();
    for tag in ["first", "second", "third"] {
        let headers = [("Content-Type", "application/json"), ("X-Reply", tag)];
        both.extend(client::request("POST", "/v1/chat/completions", &headers, &body));
    }
    conn.send(&both);
    for tag in ["first", "second", "third"] {
        let response = conn.response();
        assert_eq!((response.status, response.content()), (200, tag.to_owned()));
    }
}

/// The odd spacing and key order of a client's body, a `"model"` inside a string and a nested
/// one: all untouched, only the top-level value changes.
const ODD_BODY: &str = r#"{ "stream":false ,"model" :  "m","messages":[{"role":"user","content":"say \"model\": \"m\""}],"z":{"model":"m"} }"#;

#[test]
fn upstream_model_is_rewritten_in_place() {
    let backend = Backend::start();
    let router = setup(&[&backend]).model_key("upstream_model", "org/Upstream-7B").start();
    let request = client::request(
        "POST",
        "/v1/chat/completions?api-version=1",
        &[("Content-Type", "application/json")],
        ODD_BODY.as_bytes(),
    );
    assert_eq!(client::exchange(router.addr, &request).status, 200);
    let received = &backend.wait_for_requests(1, PATIENCE)[0];
    let expected = ODD_BODY.replacen(r#"  "m","#, r#"  "org/Upstream-7B","#, 1);
    assert_eq!(String::from_utf8_lossy(&received.body), expected);
    assert_eq!(received.header("content-length"), Some(expected.len().to_string().as_str()));
    assert_eq!(
        (received.method.as_str(), received.target.as_str()),
        ("POST", "/v1/chat/completions?api-version=1")
    );
}

#[test]
fn bodies_are_forwarded_byte_for_byte_and_chunked_ones_with_a_length() {
    let backend = Backend::start();
    let router = setup(&[&backend]).start();
    assert_eq!(client::exchange(router.addr, &client::post_json(ODD_BODY.as_bytes())).status, 200);
    let mut conn = Conn::open(router.addr);
    conn.send(
        b"POST /v1/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
          Transfer-Encoding: chunked\r\n\r\n",
    );
    let (a, b) = ODD_BODY.split_at(20);
    let mut chunks = support::wire::chunk(a.as_bytes());
    chunks.extend(support::wire::chunk(b.as_bytes()));
    chunks.extend(b"0\r\n\r\n");
    conn.send(&chunks);
    assert_eq!(conn.response().status, 200);
    let received = backend.wait_for_requests(2, PATIENCE);
    for request in &received {
        assert_eq!(String::from_utf8_lossy(&request.body), ODD_BODY);
        assert_eq!(request.header("content-length"), Some(ODD_BODY.len().to_string().as_str()));
        assert_eq!(request.header("transfer-encoding"), None);
    }
    assert_eq!(received[1].target, "/v1/completions");
}

/// Bodies far larger than a head and than one read: the head-phase read stops at
/// `max_header_bytes`, and the rest of the body must still be read without a new epoll edge
/// (a regression: bodies over 16 KB stalled), in one write and as a pipelined pair.
#[test]
fn large_bodies_are_read_whole_and_forwarded_intact() {
    let backend = Backend::start();
    let router = setup(&[&backend]).start();
    let content = "0123456789abcdef".repeat(200_000 / 16);
    let body = format!(r#"{{"model":"{M}","messages":[{{"role":"user","content":"{content}"}}]}}"#);
    let one = client::post_json(body.as_bytes());
    assert_eq!(client::exchange(router.addr, &one).status, 200);
    let mut conn = Conn::open(router.addr);
    conn.send(&[one.clone(), one].concat());
    assert_eq!(conn.response().status, 200);
    assert_eq!(conn.response().status, 200);
    let received = backend.wait_for_requests(3, PATIENCE);
    for request in &received {
        assert_eq!(request.body, body.as_bytes(), "the body, whole and unchanged");
    }

    // With a rewrite, the body goes out in three pieces around the new model token; 2 MB
    // overflows the socket buffers, so the vectored writes stop and resume mid-body.
    let backend = Backend::start();
    let router = setup(&[&backend]).model_key("upstream_model", "org/Up-\\u00e9").start();
    let content = "0123456789abcdef".repeat(2_000_000 / 16);
    let body =
        format!(r#"{{"model" : "{M}","messages":[{{"role":"user","content":"{content}"}}]}}"#);
    assert_eq!(client::exchange(router.addr, &client::post_json(body.as_bytes())).status, 200);
    let received = backend.wait_for_requests(1, PATIENCE);
    let expected = body.replacen(&format!("\"{M}\""), r#""org/Up-\\u00e9""#, 1);
    assert!(received[0].body == expected.as_bytes(), "the rewritten body, whole");
}

#[test]
fn forwarding_headers_are_added_and_hop_by_hop_ones_removed() {
    let backend = Backend::start();
    let router = setup(&[&backend]).start();
    let headers = [
        ("Content-Type", "application/json"),
        ("Authorization", "Bearer sk-test"),
        ("X-Custom", "kept"),
        ("X-Forwarded-For", "10.1.2.3"),
        ("Connection", "keep-alive, X-Hop"),
        ("X-Hop", "dropped"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Connection", "keep-alive"),
        ("TE", "trailers"),
    ];
    let first = client::request(
        "POST",
        "/v1/chat/completions",
        &headers,
        &client::chat_body(M, false).into_bytes(),
    );
    let second = client::request(
        "POST",
        "/v1/chat/completions",
        &[("X-Request-ID", "req-42"), ("Content-Type", "application/json")],
        &client::chat_body(M, false).into_bytes(),
    );
    backend.set_default(Reply::Custom {
        status: 200,
        headers: vec![
            ("Content-Type".into(), "application/json".into()),
            ("X-Backend".into(), "yes".into()),
            ("Keep-Alive".into(), "timeout=99".into()),
            ("Connection".into(), "X-Secret".into()),
            ("X-Secret".into(), "1".into()),
        ],
        body: b"{\"ok\":true}".to_vec(),
    });
    let response = client::exchange(router.addr, &first);
    assert_eq!((response.status, response.text().as_str()), (200, "{\"ok\":true}"));
    assert_eq!(response.header("x-backend"), Some("yes"));
    assert_ne!(response.header("keep-alive"), Some("timeout=99"), "{:?}", response.headers);
    assert_eq!(response.header("x-secret"), None, "{:?}", response.headers);
    assert_eq!(client::exchange(router.addr, &second).status, 200);

    let received = backend.wait_for_requests(2, PATIENCE);
    let sent = &received[0];
    assert_eq!(sent.header_all("x-forwarded-for").join(", "), "10.1.2.3, 127.0.0.1");
    let id = sent.header("x-request-id").expect("X-Request-ID added");
    assert!(!id.is_empty());
    assert_eq!(sent.header("authorization"), Some("Bearer sk-test"));
    assert_eq!(sent.header("x-custom"), Some("kept"));
    for hop in ["x-hop", "keep-alive", "proxy-connection", "te"] {
        assert_eq!(sent.header(hop), None, "{hop} forwarded: {:?}", sent.headers);
    }
    let sent = &received[1];
    assert_eq!(sent.header_all("x-request-id"), ["req-42"]);
    assert_eq!(sent.header_all("x-forwarded-for"), ["127.0.0.1"]);
    assert_ne!(received[0].header("x-request-id"), Some("req-42"));
}

// ---------------------------------------------------------------------------------------------
// The binary.

/// `warmpath serve --config FILE --listen ... --admin-listen ...` serves, and exits 0 on
/// SIGTERM and on SIGINT.
#[test]
fn the_binary_serves_and_exits_0_on_sigterm_and_sigint() {
    let backend = Backend::start();
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("serve-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("serve-{}.toml", backend.addr().port()));
    std::fs::write(&path, setup(&[&backend]).toml()).unwrap();
    for signal in ["TERM", "INT"] {
        let (listen, admin) = (free_address(), free_address());
        let mut command = Command::new(env!("CARGO_BIN_EXE_warmpath"));
        command.args(["serve", "--config", path.to_str().unwrap(), "--listen", &listen]);
        command.args(["--admin-listen", &admin]).stdout(Stdio::null()).stderr(Stdio::null());
        for (variable, _) in warmpath::config::ENV_VARS {
            command.env_remove(variable);
        }
        let mut child = command.spawn().expect("the binary starts");
        let addr: SocketAddr = listen.parse().unwrap();
        wait_until("the binary to listen", PATIENCE, || TcpStream::connect(addr).ok().map(|_| ()));
        assert_eq!(client::get(addr, "/healthz").status, 200);
        let response = client::exchange(addr, &chat_request(M, Some("bin"), false));
        assert_eq!(response.status, 200);
        let admin: SocketAddr = admin.parse().unwrap();
        assert_eq!(client::get(admin, "/metrics").status, 200);
        let mut kill = Command::new("kill");
        kill.args([&format!("-{signal}"), &child.id().to_string()]);
        assert!(kill.status().unwrap().success());
        let status = wait_until(&format!("exit after SIG{signal}"), PATIENCE, || {
            child.try_wait().expect("try_wait")
        });
        assert_eq!(status.code(), Some(0), "SIG{signal}: {status:?}");
    }
}

/// A loopback address with a port that was free a moment ago.
fn free_address() -> String {
    support::silent::refusing_address()
}

/// SPEC 6: with `debug_headers = true` a response says its lane, its queue wait and its
/// backend; a follow-up of a completed session says `boosted`. Without it, none of them.
#[test]
fn debug_headers_name_the_lane_the_wait_and_the_backend() {
    let backend = Backend::start();
    let router = setup(&[&backend]).server("debug_headers", "true").start();
    let first = client::exchange(router.addr, &chat_request(M, Some("conv"), false));
    assert_eq!(first.status, 200);
    assert_eq!(first.header("x-warmpath-lane"), Some("normal"));
    assert_eq!(first.header("x-warmpath-backend"), Some(backend.address().as_str()));
    let wait = first.header("x-warmpath-queue-wait-us").expect("a queue wait header");
    assert!(wait.parse::<u64>().is_ok(), "a number of microseconds: {wait:?}");
    // The first turn's completion is reported when its response has been flushed: wait until
    // the tracker holds the session, then the next turn is boosted.
    eventually("the session is tracked", || {
        client::model_queue(router.admin, M)["sessions_tracked"].as_u64() == Some(1)
    });
    let second = client::exchange(router.addr, &chat_request(M, Some("conv"), false));
    assert_eq!(second.header("x-warmpath-lane"), Some("boosted"));

    let plain = setup(&[&backend]).start();
    let response = client::exchange(plain.addr, &chat_request(M, Some("conv"), false));
    assert_eq!(response.status, 200);
    for name in ["x-warmpath-lane", "x-warmpath-queue-wait-us", "x-warmpath-backend"] {
        assert_eq!(response.header(name), None, "{name} only with debug_headers");
    }
}

/// A client that stops reading its response: once the router has buffered what it may and the
/// client has accepted nothing for `idle_timeout`, the exchange is abandoned — the backend sees
/// its connection close and the slot is released — instead of holding both forever.
#[test]
fn a_client_that_stops_reading_is_dropped_after_idle_timeout() {
    let backend = Backend::start();
    backend.set_default(Reply::Stream);
    let router = setup(&[&backend]).server("idle_timeout", "300ms").start();
    let mut conn = Conn::open(router.addr);
    conn.send(&chat_request(M, Some("s"), true));
    let stream = backend.next_stream();
    // 16 MiB: far more than the socket buffers and the router's 256 KiB high-water mark.
    let chunk = vec![b'x'; 64 << 10];
    for _ in 0..256 {
        stream.raw(&chunk);
    }
    eventually("the backend sees its connection closed", || stream.peer_closed());
    client::wait_idle(router.admin, M);
    drop(conn);
}
