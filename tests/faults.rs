//! Fault injection on loopback (issue [5/6]): backends that die, stall, refuse, lie or flood;
//! metrics endpoints that fail; clients that vanish or read slowly; many idle connections and
//! the connection limit. Every test ends with [`Ledger::settle`]: each request sent got exactly
//! one outcome, the router counted the same outcomes, and `/debug/queue` shows every queue
//! empty and every inflight count 0.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Command, Stdio};
use std::time::Duration;

use support::backend::{Backend, MetricsMode, Reply};
use support::client::{self, chat_request, Conn};
use support::ledger::Ledger;
use support::router::Setup;
use support::silent::Silent;
use support::{eventually, wait_until, PATIENCE};

const M: &str = "m";

/// How long a keep-alive connection keeps its buffers while idle (`server::shard`'s
/// `IDLE_RELEASE`).
const IDLE_RELEASE: Duration = Duration::from_secs(1);

fn setup(backends: &[String]) -> Setup {
    Setup::new().model(M, backends)
}

fn sessions_tracked(admin: SocketAddr) -> u64 {
    client::model_queue(admin, M)["sessions_tracked"].as_u64().expect("sessions_tracked")
}

/// The `/debug/backends` entry of `backend`.
fn debug_backend(admin: SocketAddr, backend: &str) -> serde_json::Value {
    let all = client::get(admin, "/debug/backends").json();
    let list = all["backends"].as_array().cloned().unwrap_or_default();
    list.into_iter()
        .find(|b| b["backend"].as_str() == Some(backend))
        .unwrap_or_else(|| panic!("{backend} not in /debug/backends: {all}"))
}

// ---------------------------------------------------------------------------------------------
// Backends that fail.

/// A backend killed in the middle of a stream: the client's chunked stream ends without its
/// last chunk and the connection closes; the slot is released; the session is not marked, so
/// its next turn is not boosted.
#[test]
fn a_backend_killed_mid_stream_ends_the_stream_and_marks_no_session() {
    let backend = Backend::start();
    backend.set_default(Reply::Stream);
    let router = setup(&[backend.address()]).server("debug_headers", "true").start();
    let mut ledger = Ledger::new();
    let mut conn = Conn::open(router.addr);
    conn.send(&chat_request(M, Some("killed"), true));
    ledger.sent();
    let stream = backend.next_stream();
    stream.event("one");
    let head = conn.read_head().expect("a response head");
    ledger.answered(head.status);
    assert_eq!(head.status, 200);
    assert_eq!(conn.next_event().unwrap().as_deref(), Some("data: one"));
    stream.die();
    let end = conn.next_event();
    assert!(end.is_err(), "the stream ends without its last chunk: {end:?}");
    assert!(conn.closed_within(PATIENCE), "the client connection is closed");
    client::wait_idle(router.admin, M);
    assert_eq!(sessions_tracked(router.admin), 0, "a cut stream marks no session");

    backend.set_default(Reply::Complete);
    let next = client::exchange(router.addr, &chat_request(M, Some("killed"), false));
    ledger.exchange(next.status);
    assert_eq!(next.header("x-warmpath-lane"), Some("normal"), "the next turn is not boosted");
    eventually("the completed turn marks the session", || sessions_tracked(router.admin) == 1);
    ledger.settle(router.admin);
}

/// Backends that accept the connection and never read or answer: after
/// `upstream.header_timeout` the client gets 502; the request was sent, so it is not retried
/// on the other one (it may be running there). The slot is released each time.
#[test]
fn a_backend_that_accepts_and_never_answers_is_a_502_after_the_header_timeout() {
    let (first, second) = (Silent::start(), Silent::start());
    let router =
        setup(&[first.address(), second.address()]).upstream("header_timeout", "300ms").start();
    let mut ledger = Ledger::new();
    for n in 1..=2 {
        let response = client::exchange(router.addr, &chat_request(M, None, false));
        ledger.exchange(response.status);
        response.assert_error(502, "upstream_error");
        assert_eq!(first.held() + second.held(), n, "sent once per request, never retried");
        client::wait_idle(router.admin, M);
    }
    let labels = [("model", M), ("kind", "timeout")];
    client::wait_metric(router.admin, "warmpath_upstream_errors_total", &labels, |n| n == 2.0);
    ledger.settle(router.admin);
}

/// A backend that goes silent in the middle of a stream (a hung engine): after
/// `upstream.read_timeout` without a byte the stream is cut and the slot released, as when the
/// backend dies; a stream that is slow but steady, longer in all than the timeout, is not.
#[test]
fn a_stream_silent_for_the_read_timeout_is_cut_and_a_slow_steady_one_is_not() {
    let backend = Backend::start();
    backend.set_default(Reply::Stream);
    let router = setup(&[backend.address()]).upstream("read_timeout", "1s").start();
    let mut ledger = Ledger::new();

    // An event every 150 ms for 1.8 s: no silence reaches the timeout.
    let mut steady = Conn::open(router.addr);
    steady.send(&chat_request(M, None, true));
    ledger.sent();
    let stream = backend.next_stream();
    stream.event("0");
    let head = steady.read_head().expect("a response head");
    ledger.answered(head.status);
    for i in 1..12 {
        std::thread::sleep(Duration::from_millis(150));
        stream.event(&i.to_string());
    }
    stream.done();
    let mut events = Vec::new();
    while let Some(event) = steady.next_event().expect("the whole stream") {
        events.push(event);
    }
    assert_eq!(events.len(), 13, "twelve events and [DONE]: {events:?}");
    client::wait_idle(router.admin, M);

    // One event, then nothing: cut after the timeout.
    let mut silent = Conn::open(router.addr);
    silent.send(&chat_request(M, None, true));
    ledger.sent();
    let stream = backend.next_stream();
    stream.event("one");
    let head = silent.read_head().expect("a response head");
    ledger.answered(head.status);
    assert_eq!(silent.next_event().unwrap().as_deref(), Some("data: one"));
    let end = silent.next_event();
    assert!(end.is_err(), "the stream ends without its last chunk: {end:?}");
    assert!(silent.closed_within(PATIENCE), "the client connection is closed");
    client::wait_idle(router.admin, M);
    let labels = [("model", M), ("kind", "timeout")];
    client::wait_metric(router.admin, "warmpath_upstream_errors_total", &labels, |n| n == 1.0);
    drop(stream);
    ledger.settle(router.admin);
}

/// A backend that refuses connections: its requests are retried on the other backend, it is
/// passively ejected after `eject_after_failures` refusals, and it comes back (restarted on the
/// same port) once a health check passes again.
#[test]
fn a_refusing_backend_is_retried_elsewhere_ejected_and_recovers_on_a_passing_health_check() {
    let (dead, live) = (Backend::start(), Backend::start());
    let dead_address = dead.address();
    let router = setup(&[dead.address(), live.address()])
        .model_key("routing", "round-robin")
        .upstream("eject_after_failures", "2")
        .upstream("metrics_interval", "1s")
        .start();
    // Right after a health check, the next one is a second away: the refusals come first.
    let checks = dead.health_checks();
    eventually("a fresh health check", || dead.health_checks() > checks);
    dead.stop_listening();
    let mut ledger = Ledger::new();
    for _ in 0..4 {
        let response = client::exchange(router.addr, &chat_request(M, None, false));
        ledger.exchange(response.status);
        assert_eq!(response.status, 200, "{}", response.text());
    }
    assert_eq!(live.request_count(), 4, "every request was served by the live backend");
    client::wait_metric(router.admin, "warmpath_ejections_total", &[("model", M)], |n| n >= 1.0);
    client::wait_metric(router.admin, "warmpath_retries_total", &[("model", M)], |n| n >= 2.0);
    let state = debug_backend(router.admin, &dead_address);
    assert!(state["ejected"] == true || state["healthy"] == false, "not usable: {state}");

    let restarted = Backend::start_on(&dead_address);
    wait_until("the restarted backend to be usable", PATIENCE, || {
        let state = debug_backend(router.admin, &dead_address);
        (state["healthy"] == true && state["ejected"] == false).then_some(())
    });
    for _ in 0..4 {
        let response = client::exchange(router.addr, &chat_request(M, None, false));
        ledger.exchange(response.status);
        assert_eq!(response.status, 200);
    }
    assert!(restarted.request_count() >= 1, "the recovered backend gets requests again");
    ledger.settle(router.admin);
}

/// Backends that send malformed HTTP: nothing relayed yet is a 502 (not retried: the request
/// was sent); a malformed or truncated body after the head was relayed cuts the client's
/// stream. A response far larger than every buffer is relayed intact.
#[test]
fn malformed_responses_are_502_or_cut_and_a_huge_one_is_relayed_intact() {
    let backend = Backend::start();
    let router = setup(&[backend.address()]).start();
    let mut ledger = Ledger::new();
    let big_head = format!("HTTP/1.1 200 OK\r\nX-Big: {}\r\n\r\n", "b".repeat(20_000));
    let before_head: [&[u8]; 5] = [
        b"NOT HTTP AT ALL\r\n\r\n",
        b"HTTP/1.1 004 OK\r\nContent-Length: 0\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 3\r\n\r\nok",
        big_head.as_bytes(),
    ];
    for (n, raw) in before_head.iter().enumerate() {
        backend.script(Reply::Raw(raw.to_vec()));
        let response = client::exchange(router.addr, &chat_request(M, None, false));
        ledger.exchange(response.status);
        let shown = String::from_utf8_lossy(&raw[..raw.len().min(60)]);
        assert_eq!(response.status, 502, "{shown:?}: {}", response.text());
        response.assert_error(502, "upstream_error");
        assert_eq!(backend.request_count(), n + 1, "not retried");
    }
    let after_head: [&[u8]; 2] = [
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\nzz\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",
    ];
    for raw in after_head {
        backend.script(Reply::Raw(raw.to_vec()));
        let mut conn = Conn::open(router.addr);
        conn.send(&chat_request(M, None, false));
        ledger.sent();
        let response = conn.read_response();
        let head = response.as_ref().map(|r| r.status);
        assert!(response.is_err(), "the body is cut, not completed: {head:?}");
        ledger.answered(200);
        assert!(conn.closed_within(PATIENCE), "and the connection closed");
    }
    let len = 24 << 20;
    backend.script(Reply::Bulk(len));
    let response = client::exchange(router.addr, &chat_request(M, None, false));
    ledger.exchange(response.status);
    assert_eq!(response.status, 200);
    assert_eq!(response.body.len(), len, "every byte relayed");
    assert!(response.body.iter().all(|&b| b == b'x'), "and unchanged");
    ledger.settle(router.admin);
}

/// Metrics endpoints that are down, slow, answer garbage or a 10 MB body: each scrape fails on
/// its own (within its deadline or its body limit), the backend is judged without its gauges
/// and serves requests, and health checks carry on. A backend with working metrics beside them
/// shows its gauge, so scraping does happen in this configuration.
#[test]
fn failing_metrics_endpoints_leave_their_backends_usable() {
    let modes = [
        ("down", MetricsMode::Down),
        ("slow", MetricsMode::Slow),
        ("garbage", MetricsMode::Garbage),
        ("huge", MetricsMode::Huge(10 << 20)),
    ];
    let backends: Vec<(&str, Backend)> = modes
        .iter()
        .map(|(name, mode)| {
            let backend = Backend::start();
            backend.set_metrics(mode.clone());
            backend.set_waiting(5);
            (*name, backend)
        })
        .collect();
    let working = Backend::start();
    working.set_waiting(3);
    let mut setup = Setup::new().upstream("metrics_interval", "200ms");
    for (name, backend) in &backends {
        setup = setup.model(name, &[backend.address()]).model_key("engine", "vllm");
    }
    let router = setup.model("working", &[working.address()]).model_key("engine", "vllm").start();
    wait_until("the working backend's gauge", PATIENCE, || {
        (debug_backend(router.admin, &working.address())["waiting"] == 3).then_some(())
    });
    let mut ledger = Ledger::new();
    for (name, backend) in &backends {
        let scrapes = backend.scrapes();
        let checks = backend.health_checks();
        eventually("two more scrapes and health checks", || {
            backend.scrapes() >= scrapes + 2 && backend.health_checks() >= checks + 2
        });
        let state = debug_backend(router.admin, &backend.address());
        assert_eq!(state["healthy"], true, "{name}: {state}");
        assert!(state["waiting"].is_null(), "{name}: no gauge: {state}");
        let response = client::exchange(router.addr, &chat_request(name, None, false));
        ledger.exchange(response.status);
        assert_eq!(response.status, 200, "{name}: {}", response.text());
    }
    assert_eq!(client::get(router.addr, "/readyz").status, 200);
    ledger.exchange(200);
    ledger.settle(router.admin);
}

// ---------------------------------------------------------------------------------------------
// Clients that go away or read slowly.

/// A client that leaves while its request is queued: dropped, counted, never sent upstream.
#[test]
fn a_client_vanishing_while_queued_is_cancelled() {
    let backend = Backend::start();
    backend.hold();
    let router = setup(&[backend.address()]).queue("inflight_per_backend", "1").start();
    let mut ledger = Ledger::new();
    let mut occupant = Conn::open(router.addr);
    occupant.send(&chat_request(M, Some("occupant"), false));
    ledger.sent();
    backend.wait_holding(1);
    let mut gone = Conn::open(router.addr);
    gone.send(&chat_request(M, Some("gone"), false));
    ledger.sent();
    client::wait_queued(router.admin, M, 1);
    drop(gone);
    ledger.vanished();
    client::wait_queued(router.admin, M, 0);
    backend.release_all();
    ledger.answered(occupant.response().status);
    assert_eq!(backend.request_count(), 1, "the cancelled request never reached the backend");
    ledger.settle(router.admin);
}

/// A client that leaves while its 15 MiB body is still being written to a backend that does
/// not read: the upstream connection is closed and the slot released at once (the response
/// header timeout, 600 s, plays no part).
#[test]
fn a_client_vanishing_while_its_request_is_sent_upstream_releases_the_slot() {
    let silent = Silent::start();
    let router = setup(&[silent.address()]).server("max_body_bytes", "16777216").start();
    let mut ledger = Ledger::new();
    let pad = "p".repeat(15 << 20);
    let body = format!("{{\"model\":\"{M}\",\"pad\":\"{pad}\"}}");
    let request = client::request("POST", "/v1/chat/completions", &[], body.as_bytes());
    let mut conn = Conn::open(router.addr);
    conn.send(&request);
    ledger.sent();
    wait_until("the request to be forwarded", PATIENCE, || (silent.held() == 1).then_some(()));
    assert_eq!(client::inflight(router.admin, M), 1);
    drop(conn);
    ledger.vanished();
    ledger.settle(router.admin);
}

/// A client that leaves mid-stream: the upstream request is aborted (the backend sees its
/// connection close), the slot released, the session not marked.
#[test]
fn a_client_vanishing_mid_stream_aborts_the_upstream_request() {
    let backend = Backend::start();
    backend.set_default(Reply::Stream);
    let router = setup(&[backend.address()]).start();
    let mut ledger = Ledger::new();
    let mut conn = Conn::open(router.addr);
    conn.send(&chat_request(M, Some("s"), true));
    ledger.sent();
    let stream = backend.next_stream();
    stream.event("one");
    ledger.answered(conn.read_head().expect("a head").status);
    assert_eq!(conn.next_event().unwrap().as_deref(), Some("data: one"));
    drop(conn);
    ledger.left_mid_response();
    wait_until("the backend to see its connection close", PATIENCE, || {
        stream.event("more");
        stream.peer_closed().then_some(())
    });
    ledger.settle(router.admin);
    assert_eq!(sessions_tracked(router.admin), 0, "an abandoned response marks no session");
}

/// The resident set of this process, in bytes (`VmRSS` of `/proc/self/status`, or of `pid`).
fn rss_bytes(pid: Option<u32>) -> u64 {
    let path = match pid {
        Some(pid) => format!("/proc/{pid}/status"),
        None => "/proc/self/status".to_owned(),
    };
    let status = std::fs::read_to_string(&path).expect("read /proc status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("a VmRSS line");
    let kib: u64 = line.split_whitespace().nth(1).and_then(|v| v.parse().ok()).expect("VmRSS kB");
    kib << 10
}

/// A client that reads its 64 MiB response one byte per `read`, then stops: the router stops
/// reading the backend (backpressure), so the bytes in transit stay bounded by the socket
/// buffers and the router's 256 KiB high-water mark, and so does the memory of the process
/// that runs the router. Then it reads the rest at once, intact.
#[test]
fn a_client_reading_one_byte_at_a_time_holds_back_the_backend() {
    let backend = Backend::start();
    let len: usize = 64 << 20;
    backend.set_default(Reply::Bulk(len));
    let router = setup(&[backend.address()]).start();
    let mut ledger = Ledger::new();
    let rss_before = rss_bytes(None);
    let mut stream = TcpStream::connect(router.addr).expect("connect");
    stream.set_read_timeout(Some(PATIENCE)).unwrap();
    stream.write_all(&chat_request(M, None, false)).unwrap();
    ledger.sent();
    let mut received = Vec::new();
    let mut byte = [0u8; 1];
    for i in 0..20_000 {
        assert_eq!(stream.read(&mut byte).expect("a byte"), 1);
        received.push(byte[0]);
        if i % 1000 == 0 {
            // The client is slow on purpose; nothing below depends on how slow.
            std::thread::sleep(Duration::from_millis(1));
        }
    }
    // The backend writes until every buffer on the way is full, then blocks: held back once it
    // is blocked and stays blocked, with nothing more written, across a round trip through the
    // router's event loop (one shard), which would have read the backend's socket, had it been
    // reading, before answering.
    let last = wait_until("the backend to be held back", PATIENCE, || {
        let (stalls, written) = (backend.bulk_stalls(), backend.bytes_written());
        if !backend.bulk_blocked() {
            return None;
        }
        let response = client::exchange(router.addr, &client::get_request("/healthz"));
        ledger.exchange(response.status);
        let held = backend.bulk_blocked()
            && backend.bulk_stalls() == stalls
            && backend.bytes_written() == written;
        held.then_some(written)
    });
    let in_transit = last - received.len() as u64;
    let rss_growth = rss_bytes(None).saturating_sub(rss_before);
    eprintln!("slow client: {in_transit} bytes in transit, RSS +{} KiB", rss_growth >> 10);
    assert!(last < len as u64, "the backend could not write everything: {last}");
    assert!(in_transit < 24 << 20, "bounded buffering: {in_transit} bytes in transit");
    assert!(rss_growth < 32 << 20, "bounded memory: RSS grew {rss_growth} bytes");

    let head_end = received.windows(4).position(|w| w == b"\r\n\r\n").expect("a head") + 4;
    let head = String::from_utf8_lossy(&received[..head_end]).into_owned();
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains(&format!("Content-Length: {len}")), "{head}");
    let mut buf = vec![0u8; 1 << 20];
    while received.len() < head_end + len {
        let n = stream.read(&mut buf).expect("the rest of the body");
        assert!(n > 0, "the body ended early at {}", received.len() - head_end);
        received.extend_from_slice(&buf[..n]);
    }
    assert_eq!(received.len(), head_end + len, "nothing after the body");
    assert!(received[head_end..].iter().all(|&b| b == b'x'), "the body is intact");
    ledger.answered(200);
    drop(stream);
    ledger.settle(router.admin);
}

// ---------------------------------------------------------------------------------------------
// Many connections.

/// Raises this process's soft `RLIMIT_NOFILE` to its hard limit (inherited by children) and
/// returns it.
#[allow(unsafe_code)] // two libc calls; this test crate has no other way to raise the limit
fn raise_fd_limit() -> u64 {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed by pointer.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit), 0, "getrlimit");
        limit.rlim_cur = limit.rlim_max;
        assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &limit), 0, "setrlimit");
    }
    limit.rlim_cur
}

/// `warmpath serve` as a child process (its own descriptor table and resident set).
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn spawn_router(setup: &Setup, name: &str) -> (Child, SocketAddr, SocketAddr) {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("fault-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}-{}.toml", std::process::id()));
    std::fs::write(&path, setup.toml()).unwrap();
    let (listen, admin) =
        (support::silent::refusing_address(), support::silent::refusing_address());
    let mut command = Command::new(env!("CARGO_BIN_EXE_warmpath"));
    command.args(["serve", "--config", path.to_str().unwrap(), "--listen", &listen]);
    command.args(["--admin-listen", &admin]).stdout(Stdio::null()).stderr(Stdio::null());
    for (variable, _) in warmpath::config::ENV_VARS {
        command.env_remove(variable);
    }
    // mimalloc returns freed pages to the system only on later allocator activity by default;
    // without that delay the RSS these tests read is what the router holds.
    command.env("MIMALLOC_PURGE_DELAY", "0");
    let child = Child(command.spawn().expect("the binary starts"));
    let addr: SocketAddr = listen.parse().unwrap();
    wait_until("the binary to listen", PATIENCE, || TcpStream::connect(addr).ok().map(|_| ()));
    (child, addr, admin.parse().unwrap())
}

/// One `GET /healthz` on `stream`, keeping the connection open; the status.
fn healthz(stream: &mut TcpStream) -> u16 {
    stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n").expect("send");
    let mut buf = [0u8; 512];
    let mut len = 0;
    loop {
        let n = stream.read(&mut buf[len..]).expect("read");
        assert!(n > 0, "closed before a response");
        len += n;
        let text = &buf[..len];
        if let Some(end) = text.windows(4).position(|w| w == b"\r\n\r\n") {
            let head = String::from_utf8_lossy(&text[..end]).to_lowercase();
            let body = head
                .lines()
                .find_map(|l| l.strip_prefix("content-length:"))
                .and_then(|v| v.trim().parse::<usize>().ok())
                .expect("a Content-Length");
            if len >= end + 4 + body {
                return head[9..12].parse().expect("a status");
            }
        }
    }
}

/// 10,000 idle keep-alive connections, each after one request: the router (a child process)
/// holds them all, reports them open, serves the first and the last again, and its resident
/// set grows by a bounded amount per connection (printed). Closing them leaves nothing open.
#[test]
fn ten_thousand_idle_keep_alive_connections() {
    const CONNECTIONS: usize = 10_000;
    let limit = raise_fd_limit();
    assert!(limit >= CONNECTIONS as u64 + 512, "RLIMIT_NOFILE hard limit {limit} is too low");
    let backend = Backend::start();
    let setup = setup(&[backend.address()]).server("max_connections", "20000");
    let (child, addr, admin) = spawn_router(&setup, "idle");
    let pid = child.0.id();
    let mut ledger = Ledger::new();
    let mut warm = TcpStream::connect(addr).expect("connect");
    ledger.exchange(healthz(&mut warm));
    drop(warm);
    let rss_before = rss_bytes(Some(pid));
    let mut conns = Vec::with_capacity(CONNECTIONS);
    for _ in 0..CONNECTIONS {
        let mut stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(PATIENCE)).unwrap();
        ledger.exchange(healthz(&mut stream));
        conns.push(stream);
    }
    let open = client::metric(&client::metrics(admin), "warmpath_connections_open", &[]);
    assert_eq!(open, Some(CONNECTIONS as f64));
    let growth = rss_bytes(Some(pid)).saturating_sub(rss_before);
    let per_connection = growth / CONNECTIONS as u64;
    eprintln!("{CONNECTIONS} idle connections: RSS +{} KiB, {per_connection} B each", growth >> 10);
    assert!(per_connection < 16 << 10, "{per_connection} bytes per idle connection");
    // After a second idle a connection gives its buffers back (`IDLE_RELEASE`): the resident
    // set falls to under 1 KiB per connection (waited for, on the router's real clock, for at
    // most that second and PATIENCE more).
    let idle = support::now();
    let mut released = per_connection;
    wait_until("idle connections to give their buffers back", PATIENCE + IDLE_RELEASE, || {
        released = rss_bytes(Some(pid)).saturating_sub(rss_before) / CONNECTIONS as u64;
        (released < 1 << 10).then_some(())
    });
    let after = support::since(idle);
    eprintln!("{CONNECTIONS} connections idle: {released} B each after {after:?}");
    for i in [0, CONNECTIONS / 2, CONNECTIONS - 1] {
        ledger.exchange(healthz(&mut conns[i]));
    }
    let response = client::exchange(addr, &chat_request(M, None, false));
    ledger.exchange(response.status);
    assert_eq!(response.status, 200);
    drop(conns);
    wait_until("every connection closed", PATIENCE, || {
        let open = client::metric(&client::metrics(admin), "warmpath_connections_open", &[]);
        (open == Some(0.0)).then_some(())
    });
    ledger.settle(admin);
}

/// At `max_connections` a new connection gets 503 and is closed at once; the open ones are
/// served as before, and once one closes a new connection is accepted again.
#[test]
fn max_connections_refuses_new_connections_cleanly() {
    let backend = Backend::start();
    let router = setup(&[backend.address()]).server("max_connections", "8").start();
    let mut ledger = Ledger::new();
    let mut conns: Vec<TcpStream> = (0..8)
        .map(|_| {
            let mut stream = TcpStream::connect(router.addr).expect("connect");
            stream.set_read_timeout(Some(PATIENCE)).unwrap();
            ledger.exchange(healthz(&mut stream));
            stream
        })
        .collect();
    let mut refused = Conn::open(router.addr);
    let response = refused.response();
    response.assert_error(503, "unavailable");
    assert_eq!(response.header("connection"), Some("close"));
    refused.assert_closed();
    client::wait_metric(router.admin, "warmpath_connections_refused_total", &[], |n| n == 1.0);
    for conn in &mut conns {
        ledger.exchange(healthz(conn));
    }
    drop(conns.pop());
    wait_until("seven connections open", PATIENCE, || {
        let open = client::metric(&client::metrics(router.admin), "warmpath_connections_open", &[]);
        (open == Some(7.0)).then_some(())
    });
    let response = client::exchange(router.addr, &chat_request(M, None, false));
    ledger.exchange(response.status);
    assert_eq!(response.status, 200);
    ledger.settle(router.admin);
}
