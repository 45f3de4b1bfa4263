//! A programmable fake inference engine on `127.0.0.1:0`: one thread per connection, blocking
//! I/O, HTTP/1.1 keep-alive.
//!
//! - `GET /health`: 200, or 503 after [`Backend::set_healthy`]`(false)`.
//! - `GET /metrics`: vLLM gauges `vllm:num_requests_waiting` and `vllm:num_requests_running`
//!   ([`Backend::set_waiting`], [`Backend::set_running`]).
//! - anything else is an inference request: recorded in arrival order ([`Backend::requests`]),
//!   then answered by the next scripted [`Reply`] ([`Backend::script`]) or, when the script is
//!   empty, by the default one ([`Backend::set_default`], initially [`Reply::Complete`]).

use std::collections::VecDeque;
use std::io::{self, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::mpsc;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use serde_json::Value;

use super::wire::{self, Head, Wire};
use super::{Deadline, PATIENCE};

/// The assistant's answer when the test sets none.
pub const DEFAULT_CONTENT: &str = "Hello from the fake backend";

/// The session header the backend reports in [`Recorded::session`].
pub const SESSION_HEADER: &str = "x-session-id";

/// How a backend answers one inference request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Reply {
    /// 200 at once: a `chat.completion` JSON with the content (the request's `x-reply` header,
    /// else [`Backend::set_content`]); or, when the body says `"stream": true`, an SSE stream
    /// of `chat.completion.chunk` events (one per word) ending with `data: [DONE]`.
    Complete,
    /// Like [`Reply::Complete`] once the test releases it ([`Backend::release`]): held
    /// requests are released oldest first.
    Hold,
    /// 200 `text/event-stream`, chunked, whose events the test sends one by one through the
    /// [`StreamHandle`] it takes with [`Backend::next_stream`].
    Stream,
    /// This status with this JSON body (`Content-Length`).
    Status(u16, String),
    /// This status, these extra header lines, this body (`Content-Length` added).
    Custom {
        /// Status code.
        status: u16,
        /// Header lines besides `Content-Length`.
        headers: Vec<(String, String)>,
        /// Body.
        body: Vec<u8>,
    },
    /// Write these bytes as they are (anything, malformed or not), then close the connection.
    Raw(Vec<u8>),
    /// 200 with a `Content-Length` body of this many bytes, written 64 KiB at a time as the
    /// socket takes them; [`Backend::bytes_written`] counts what the socket took, and
    /// [`Backend::bulk_blocked`] says whether the writer waits for room in a full socket.
    Bulk(usize),
    /// Close the connection without reading the request or answering: the unread bytes make
    /// the kernel answer with a reset (RST), before any response byte. Only decided for the
    /// first request on a connection; the request is counted in [`Backend::resets`], not
    /// recorded.
    Reset,
}

/// How `GET /metrics` answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MetricsMode {
    /// vLLM gauges (the default).
    Gauges,
    /// Close the connection without answering.
    Down,
    /// The gauges, once the router has given up on the scrape and closed the connection (or
    /// after [`PATIENCE`]): later than any scrape deadline, however fast or slow the machine.
    Slow,
    /// 200 with a body that is not Prometheus text.
    Garbage,
    /// 200 with a valid body of about this many bytes (comment lines, then the gauges).
    Huge(usize),
}

/// One inference request as the backend received it.
#[derive(Debug, Clone)]
pub struct Recorded {
    /// Arrival index at this backend, from 0.
    pub seq: usize,
    /// Which connection it came on (1 = the first accepted).
    pub conn: u64,
    /// Method.
    pub method: String,
    /// Request target (path and query).
    pub target: String,
    /// Header lines in order, names as sent.
    pub headers: Vec<(String, String)>,
    /// Body, de-chunked if it was chunked.
    pub body: Vec<u8>,
    /// The `X-Session-ID` value, if any.
    pub session: Option<String>,
}

impl Recorded {
    /// The first value of `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        wire::header(&self.headers, name)
    }

    /// Every value of `name`, in order.
    pub fn header_all(&self, name: &str) -> Vec<&str> {
        wire::header_all(&self.headers, name)
    }

    /// The body as JSON (panics if it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("request body is JSON")
    }
}

/// Commands from a [`StreamHandle`] to its connection.
#[derive(Debug)]
enum Command {
    Bytes(Vec<u8>),
    End,
    Die,
}

/// What the connection thread of a [`Reply::Stream`] reports back.
#[derive(Debug, Default)]
struct StreamFlags {
    /// The router closed (or reset) the connection.
    peer_closed: AtomicBool,
}

/// The test's end of one [`Reply::Stream`] response: each call writes to the socket at once.
#[derive(Debug)]
pub struct StreamHandle {
    commands: mpsc::Sender<Command>,
    flags: Arc<StreamFlags>,
    /// The request being answered.
    pub request: Recorded,
}

impl StreamHandle {
    /// Sends one SSE event `data: {data}\n\n` as one chunk.
    pub fn event(&self, data: &str) {
        self.raw(format!("data: {data}\n\n").as_bytes());
    }

    /// Sends `bytes` as one chunk.
    pub fn raw(&self, bytes: &[u8]) {
        let _ = self.commands.send(Command::Bytes(bytes.to_vec()));
    }

    /// Sends `data: [DONE]` and the last chunk: the response is complete and the connection
    /// goes back to keep-alive.
    pub fn done(&self) {
        self.event("[DONE]");
        let _ = self.commands.send(Command::End);
    }

    /// Closes the connection abruptly, without the last chunk.
    pub fn die(&self) {
        let _ = self.commands.send(Command::Die);
    }

    /// Whether the router has closed this connection.
    pub fn peer_closed(&self) -> bool {
        self.flags.peer_closed.load(Ordering::Acquire)
    }
}

#[derive(Debug)]
struct State {
    requests: Vec<Recorded>,
    default: Reply,
    script: VecDeque<Reply>,
    content: String,
    /// Tickets of held requests still waiting, oldest first.
    holding: VecDeque<u64>,
    next_ticket: u64,
    /// Releases granted and not yet used by a held request.
    release_budget: u64,
    release_all: bool,
    streams: VecDeque<StreamHandle>,
    healthy: bool,
    metrics_mode: MetricsMode,
    waiting: u64,
    running: u64,
    /// vLLM's prefix-cache counters (queries, hits), exported when set.
    prefix_counters: Option<(u64, u64)>,
    /// The `Authorization` values of the health checks and scrapes, in arrival order.
    probe_authorizations: Vec<Option<String>>,
    health_checks: u64,
    scrapes: u64,
    resets: u64,
    connections: u64,
    closed_by_peer: u64,
}

#[derive(Debug)]
struct Shared {
    state: Mutex<State>,
    changed: Condvar,
    /// Stop accepting (the accept thread drops the listener).
    stop_accept: AtomicBool,
    /// The backend is dropped: held requests give up.
    stop: AtomicBool,
    /// Body bytes of [`Reply::Bulk`] answers the sockets took.
    bulk_written: AtomicU64,
    /// Times a [`Reply::Bulk`] writer found its socket full.
    bulk_stalls: AtomicU64,
    /// A [`Reply::Bulk`] writer is waiting for room in its socket now.
    bulk_blocked: AtomicBool,
}

impl Shared {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|poison| poison.into_inner())
    }

    fn notify(&self) {
        self.changed.notify_all();
    }
}

/// A fake backend listening on loopback until dropped.
#[derive(Debug)]
pub struct Backend {
    shared: Arc<Shared>,
    addr: SocketAddr,
    accept: Mutex<Option<JoinHandle<()>>>,
}

impl Backend {
    /// Starts listening on `127.0.0.1:0`.
    pub fn start() -> Backend {
        Backend::start_on("127.0.0.1:0")
    }

    /// Starts listening on `addr` (a port another backend gave up: a restarted engine).
    pub fn start_on(addr: &str) -> Backend {
        let listener = TcpListener::bind(addr).unwrap_or_else(|e| panic!("bind {addr}: {e}"));
        let addr = listener.local_addr().expect("local addr");
        let shared = Arc::new(Shared {
            state: Mutex::new(State {
                requests: Vec::new(),
                default: Reply::Complete,
                script: VecDeque::new(),
                content: DEFAULT_CONTENT.to_owned(),
                holding: VecDeque::new(),
                next_ticket: 0,
                release_budget: 0,
                release_all: false,
                streams: VecDeque::new(),
                healthy: true,
                metrics_mode: MetricsMode::Gauges,
                waiting: 0,
                running: 0,
                prefix_counters: None,
                probe_authorizations: Vec::new(),
                health_checks: 0,
                scrapes: 0,
                resets: 0,
                connections: 0,
                closed_by_peer: 0,
            }),
            changed: Condvar::new(),
            stop_accept: AtomicBool::new(false),
            stop: AtomicBool::new(false),
            bulk_written: AtomicU64::new(0),
            bulk_stalls: AtomicU64::new(0),
            bulk_blocked: AtomicBool::new(false),
        });
        let accept_shared = Arc::clone(&shared);
        let accept = std::thread::Builder::new()
            .name(format!("fake-backend-{}", addr.port()))
            .spawn(move || accept_loop(&listener, &accept_shared))
            .expect("spawn accept thread");
        Backend { shared, addr, accept: Mutex::new(Some(accept)) }
    }

    /// The listening address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `127.0.0.1:PORT`, as a configuration lists it.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    /// Stops listening: from now on connections to the port are refused. Open connections
    /// carry on.
    pub fn stop_listening(&self) {
        self.shared.stop_accept.store(true, Ordering::Release);
        let Some(accept) = self.accept.lock().unwrap().take() else { return };
        // Wake the blocking accept; it sees the flag and drops the listener.
        let _ = TcpStream::connect(self.addr);
        accept.join().expect("accept thread");
    }

    /// The reply for inference requests once the script is used up.
    pub fn set_default(&self, reply: Reply) {
        self.shared.lock().default = reply;
    }

    /// Holds every inference request until released: `set_default(Reply::Hold)`.
    pub fn hold(&self) {
        self.set_default(Reply::Hold);
    }

    /// Queues `reply` for the next inference request that has no scripted reply yet.
    pub fn script(&self, reply: Reply) {
        self.shared.lock().script.push_back(reply);
    }

    /// The assistant content of [`Reply::Complete`] answers.
    pub fn set_content(&self, content: &str) {
        self.shared.lock().content = content.to_owned();
    }

    /// Lets the `n` oldest held requests answer (a release granted while none is held is kept
    /// for the next one).
    pub fn release(&self, n: u64) {
        self.shared.lock().release_budget += n;
        self.shared.notify();
    }

    /// Lets every held request, now and later, answer.
    pub fn release_all(&self) {
        self.shared.lock().release_all = true;
        self.shared.notify();
    }

    /// Requests held right now.
    pub fn holding(&self) -> usize {
        self.shared.lock().holding.len()
    }

    /// Waits until exactly `n` requests are held.
    pub fn wait_holding(&self, n: usize) {
        self.wait_for(&format!("{n} held requests"), |state| state.holding.len() == n);
    }

    /// The next [`Reply::Stream`] response that started (waits for it).
    pub fn next_stream(&self) -> StreamHandle {
        let mut state = self.shared.lock();
        let deadline = Deadline::after(PATIENCE);
        loop {
            if let Some(stream) = state.streams.pop_front() {
                return stream;
            }
            assert!(!deadline.passed(), "no stream started within {PATIENCE:?}");
            state = self.shared.changed.wait_timeout(state, deadline.remaining()).unwrap().0;
        }
    }

    /// `GET /health` answers 200 (`true`) or 503.
    pub fn set_healthy(&self, healthy: bool) {
        self.shared.lock().healthy = healthy;
    }

    /// How `GET /metrics` answers from now on.
    pub fn set_metrics(&self, mode: MetricsMode) {
        self.shared.lock().metrics_mode = mode;
    }

    /// Body bytes of [`Reply::Bulk`] answers that the sockets took so far.
    pub fn bytes_written(&self) -> u64 {
        self.shared.bulk_written.load(Ordering::Acquire)
    }

    /// Whether a [`Reply::Bulk`] writer is blocked now: its socket's send buffer is full
    /// because the peer's receive window is (the router does not read), and it waits for room.
    pub fn bulk_blocked(&self) -> bool {
        self.shared.bulk_blocked.load(Ordering::Acquire)
    }

    /// Times a [`Reply::Bulk`] writer has found its socket full so far (counted before
    /// [`Backend::bulk_blocked`] turns true, so an unchanged count and a `true` mean one
    /// uninterrupted stall).
    pub fn bulk_stalls(&self) -> u64 {
        self.shared.bulk_stalls.load(Ordering::Acquire)
    }

    /// The `vllm:num_requests_waiting` gauge.
    pub fn set_waiting(&self, waiting: u64) {
        self.shared.lock().waiting = waiting;
    }

    /// Exports vLLM's prefix-cache counters with these values from now on (lower ones than
    /// before: a restarted engine).
    pub fn set_prefix_counters(&self, queries: u64, hits: u64) {
        self.shared.lock().prefix_counters = Some((queries, hits));
    }

    /// The `vllm:num_requests_running` gauge.
    pub fn set_running(&self, running: u64) {
        self.shared.lock().running = running;
    }

    /// The `Authorization` values of the health checks and scrapes so far, in arrival order.
    pub fn probe_authorizations(&self) -> Vec<Option<String>> {
        self.shared.lock().probe_authorizations.clone()
    }

    /// `GET /health` requests served.
    pub fn health_checks(&self) -> u64 {
        self.shared.lock().health_checks
    }

    /// `GET /metrics` requests served.
    pub fn scrapes(&self) -> u64 {
        self.shared.lock().scrapes
    }

    /// Connections closed by [`Reply::Reset`].
    pub fn resets(&self) -> u64 {
        self.shared.lock().resets
    }

    /// Connections accepted.
    pub fn connections(&self) -> u64 {
        self.shared.lock().connections
    }

    /// Connections the router closed (or reset) while the backend was holding or streaming a
    /// response, or between requests.
    pub fn closed_by_peer(&self) -> u64 {
        self.shared.lock().closed_by_peer
    }

    /// Every inference request so far, in arrival order.
    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().requests.clone()
    }

    /// How many inference requests arrived so far.
    pub fn request_count(&self) -> usize {
        self.shared.lock().requests.len()
    }

    /// Waits until at least `n` inference requests arrived (at most `timeout`); returns them
    /// all. Panics on timeout.
    pub fn wait_for_requests(&self, n: usize, timeout: Duration) -> Vec<Recorded> {
        let mut state = self.shared.lock();
        let deadline = Deadline::after(timeout);
        while state.requests.len() < n {
            assert!(
                !deadline.passed(),
                "backend {} got {} requests, not {n}, within {timeout:?}",
                self.addr,
                state.requests.len()
            );
            state = self.shared.changed.wait_timeout(state, deadline.remaining()).unwrap().0;
        }
        state.requests.clone()
    }

    /// Waits until `condition` holds on the backend's state (at most [`PATIENCE`]).
    fn wait_for(&self, what: &str, condition: impl Fn(&State) -> bool) {
        let mut state = self.shared.lock();
        let deadline = Deadline::after(PATIENCE);
        while !condition(&state) {
            assert!(!deadline.passed(), "backend {}: timed out waiting for {what}", self.addr);
            state = self.shared.changed.wait_timeout(state, deadline.remaining()).unwrap().0;
        }
    }
}

impl Drop for Backend {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        self.shared.lock().release_all = true;
        self.shared.notify();
        self.stop_listening();
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        if shared.stop_accept.load(Ordering::Acquire) {
            return;
        }
        let Ok(stream) = stream else { continue };
        let conn = {
            let mut state = shared.lock();
            state.connections += 1;
            state.connections
        };
        let shared = Arc::clone(shared);
        let _ = std::thread::Builder::new()
            .name(format!("fake-conn-{conn}"))
            .spawn(move || serve_connection(stream, conn, &shared));
    }
}

/// What ended a connection's request loop.
enum End {
    /// Keep serving requests on this connection.
    KeepAlive,
    /// The router closed or reset it.
    PeerClosed,
    /// The backend closed it on purpose.
    Closed,
}

fn serve_connection(stream: TcpStream, conn: u64, shared: &Arc<Shared>) {
    let _ = stream.set_nodelay(true);
    let mut wire = Wire::new(stream);
    let mut first = true;
    loop {
        if first && reset_first_request(&wire.stream, shared) {
            return;
        }
        first = false;
        let end = match wire.read_request_head() {
            Ok(Some(head)) => serve_request(&mut wire, head, conn, shared),
            Ok(None) | Err(_) => End::PeerClosed,
        };
        match end {
            End::KeepAlive => {}
            End::PeerClosed => {
                shared.lock().closed_by_peer += 1;
                shared.notify();
                return;
            }
            End::Closed => return,
        }
    }
}

/// Waits for the first bytes of the connection; when they are an inference request and the
/// next reply is [`Reply::Reset`], takes that reply and closes the socket without reading them
/// (so the kernel resets the connection).
fn reset_first_request(stream: &TcpStream, shared: &Shared) -> bool {
    let mut peeked = [0u8; 16];
    let Ok(n) = stream.peek(&mut peeked) else { return false };
    let start = &peeked[..n];
    if start.starts_with(b"GET /health") || start.starts_with(b"GET /metrics") || n == 0 {
        return false;
    }
    let mut state = shared.lock();
    let next = state.script.front().unwrap_or(&state.default);
    if *next != Reply::Reset {
        return false;
    }
    // A scripted reset is used up; a default one stays.
    state.script.pop_front();
    state.resets += 1;
    drop(state);
    shared.notify();
    true
}

fn serve_request(wire: &mut Wire, head: Head, conn: u64, shared: &Arc<Shared>) -> End {
    let body = match wire.read_body(request_framing(&head)) {
        Ok(body) => body,
        Err(_) => return End::PeerClosed,
    };
    let probe =
        matches!((head.method.as_str(), head.target.as_str()), ("GET", "/health" | "/metrics"));
    if probe {
        let authorization = wire::header(&head.headers, "authorization").map(str::to_owned);
        shared.lock().probe_authorizations.push(authorization);
    }
    let written = match (head.method.as_str(), head.target.as_str()) {
        ("GET", "/health") => health(wire, shared),
        ("GET", "/metrics") => metrics(wire, shared),
        _ => return inference(wire, head, body, conn, shared),
    };
    if written.is_err() {
        return End::PeerClosed;
    }
    End::KeepAlive
}

fn request_framing(head: &Head) -> wire::Framing {
    match head.framing() {
        wire::Framing::Close => wire::Framing::Length(0),
        framing => framing,
    }
}

fn health(wire: &mut Wire, shared: &Shared) -> io::Result<()> {
    let healthy = {
        let mut state = shared.lock();
        state.health_checks += 1;
        state.healthy
    };
    shared.notify();
    if healthy {
        respond(wire, 200, &[("Content-Type", "application/json")], b"{}")
    } else {
        respond(wire, 503, &[("Content-Type", "application/json")], b"{\"status\":\"down\"}")
    }
}

fn metrics(wire: &mut Wire, shared: &Shared) -> io::Result<()> {
    let (mode, gauges) = {
        let mut state = shared.lock();
        state.scrapes += 1;
        let gauges = format!(
            "# HELP vllm:num_requests_waiting Requests waiting to be processed.\n\
             # TYPE vllm:num_requests_waiting gauge\n\
             vllm:num_requests_waiting{{model_name=\"m\"}} {}.0\n\
             # HELP vllm:num_requests_running Requests running on GPU.\n\
             # TYPE vllm:num_requests_running gauge\n\
             vllm:num_requests_running{{model_name=\"m\"}} {}.0\n",
            state.waiting, state.running
        );
        let gauges = match state.prefix_counters {
            None => gauges,
            Some((queries, hits)) => format!(
                "{gauges}# TYPE vllm:prefix_cache_queries_total counter\n\
                 vllm:prefix_cache_queries_total{{model_name=\"m\"}} {queries}.0\n\
                 # TYPE vllm:prefix_cache_hits_total counter\n\
                 vllm:prefix_cache_hits_total{{model_name=\"m\"}} {hits}.0\n"
            ),
        };
        (state.metrics_mode.clone(), gauges)
    };
    shared.notify();
    let text = match mode {
        MetricsMode::Gauges => gauges,
        MetricsMode::Down => {
            let _ = wire.stream.shutdown(Shutdown::Both);
            return Err(io::ErrorKind::ConnectionAborted.into());
        }
        MetricsMode::Slow => {
            wait_for_close(&wire.stream);
            gauges
        }
        MetricsMode::Garbage => "vllm:num_requests_waiting{ 12 ]]\n\u{0}\u{7f}{{{\n".to_owned(),
        MetricsMode::Huge(bytes) => {
            let line = "# padding padding padding padding padding padding padding padding\n";
            let mut text = line.repeat(bytes / line.len() + 1);
            text.push_str(&gauges);
            text
        }
    };
    respond(wire, 200, &[("Content-Type", "text/plain; version=0.0.4")], text.as_bytes())
}

fn inference(wire: &mut Wire, head: Head, body: Vec<u8>, conn: u64, shared: &Arc<Shared>) -> End {
    let (reply, recorded, content) = {
        let mut state = shared.lock();
        let recorded = Recorded {
            seq: state.requests.len(),
            conn,
            session: wire::header(&head.headers, SESSION_HEADER).map(str::to_owned),
            method: head.method,
            target: head.target,
            headers: head.headers,
            body,
        };
        state.requests.push(recorded.clone());
        let reply = state.script.pop_front().unwrap_or_else(|| state.default.clone());
        let content =
            recorded.header("x-reply").map_or_else(|| state.content.clone(), str::to_owned);
        (reply, recorded, content)
    };
    shared.notify();
    let result = match reply {
        Reply::Complete => complete(wire, &recorded, &content),
        Reply::Hold => {
            if !hold(&wire.stream, shared) {
                return End::PeerClosed;
            }
            complete(wire, &recorded, &content)
        }
        Reply::Stream => return stream(wire, recorded, shared),
        Reply::Status(status, body) => {
            respond(wire, status, &[("Content-Type", "application/json")], body.as_bytes())
        }
        Reply::Custom { status, headers, body } => {
            let headers: Vec<(&str, &str)> =
                headers.iter().map(|(n, v)| (n.as_str(), v.as_str())).collect();
            respond(wire, status, &headers, &body)
        }
        Reply::Raw(bytes) => {
            let _ = wire.send(&bytes);
            let _ = wire.stream.shutdown(Shutdown::Both);
            return End::Closed;
        }
        Reply::Bulk(len) => bulk(wire, len, shared),
        Reply::Reset => {
            // Decided too late (not the first request on the connection): just close.
            let _ = wire.stream.shutdown(Shutdown::Both);
            return End::Closed;
        }
    };
    match result {
        Ok(()) => End::KeepAlive,
        Err(_) => End::PeerClosed,
    }
}

/// Waits for this request's release; `false` when the router closed the connection first (or
/// the backend is dropped without a release).
fn hold(stream: &TcpStream, shared: &Shared) -> bool {
    let mut state = shared.lock();
    let ticket = state.next_ticket;
    state.next_ticket += 1;
    state.holding.push_back(ticket);
    shared.notify();
    loop {
        if state.release_all {
            state.holding.retain(|&t| t != ticket);
            shared.notify();
            return true;
        }
        if state.release_budget > 0 && state.holding.front() == Some(&ticket) {
            state.release_budget -= 1;
            state.holding.pop_front();
            shared.notify();
            return true;
        }
        if shared.stop.load(Ordering::Acquire) || peer_closed(stream) {
            state.holding.retain(|&t| t != ticket);
            shared.notify();
            return false;
        }
        state = shared.changed.wait_timeout(state, Duration::from_millis(5)).unwrap().0;
    }
}

/// Blocks until the peer closes or resets `stream`, sends a byte, or [`PATIENCE`] passes.
fn wait_for_close(mut stream: &TcpStream) {
    let _ = stream.set_read_timeout(Some(PATIENCE));
    let _ = stream.read(&mut [0u8; 1]);
}

/// Whether the peer has closed or reset `stream` (a non-blocking peek).
fn peer_closed(stream: &TcpStream) -> bool {
    if stream.set_nonblocking(true).is_err() {
        return true;
    }
    let closed = match stream.peek(&mut [0u8; 1]) {
        Ok(0) => true,
        Ok(_) => false,
        Err(e) => e.kind() != io::ErrorKind::WouldBlock,
    };
    let _ = stream.set_nonblocking(false);
    closed
}

fn stream(wire: &mut Wire, request: Recorded, shared: &Shared) -> End {
    let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
                Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
    if wire.send(head.as_bytes()).is_err() {
        return End::PeerClosed;
    }
    let (commands, receiver) = mpsc::channel();
    let flags = Arc::new(StreamFlags::default());
    shared.lock().streams.push_back(StreamHandle { commands, flags: Arc::clone(&flags), request });
    shared.notify();
    let end = relay_commands(wire, &receiver);
    if let End::PeerClosed = end {
        flags.peer_closed.store(true, Ordering::Release);
    }
    end
}

fn relay_commands(wire: &mut Wire, receiver: &mpsc::Receiver<Command>) -> End {
    loop {
        match receiver.recv_timeout(Duration::from_millis(5)) {
            Ok(Command::Bytes(bytes)) => {
                if wire.send(&wire::chunk(&bytes)).is_err() {
                    return End::PeerClosed;
                }
            }
            Ok(Command::End) => {
                if wire.send(b"0\r\n\r\n").is_err() {
                    return End::PeerClosed;
                }
                return End::KeepAlive;
            }
            Ok(Command::Die) | Err(mpsc::RecvTimeoutError::Disconnected) => {
                let _ = wire.stream.shutdown(Shutdown::Both);
                return End::Closed;
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {
                if peer_closed(&wire.stream) {
                    return End::PeerClosed;
                }
            }
        }
    }
}

/// 200 and `len` bytes of `x`, 64 KiB per write, counted as the socket takes them. The body
/// is written on a non-blocking socket, so that a full one is seen (`bulk_blocked`) rather
/// than hidden inside a blocking `write`.
fn bulk(wire: &mut Wire, len: usize, shared: &Shared) -> io::Result<()> {
    let head = format!("HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\nContent-Length: {len}\r\n\r\n");
    wire.send(head.as_bytes())?;
    wire.stream.set_nonblocking(true)?;
    let written = write_bulk(&wire.stream, len, shared);
    wire.stream.set_nonblocking(false)?;
    written
}

/// Writes `len` bytes of `x` on the non-blocking `stream`, waiting in a mio `Poll` whenever the
/// socket is full.
fn write_bulk(mut stream: &TcpStream, len: usize, shared: &Shared) -> io::Result<()> {
    // A duplicate of the descriptor to register: same socket, same non-blocking flag.
    let mut registered = mio::net::TcpStream::from_std(stream.try_clone()?);
    let mut poll = mio::Poll::new()?;
    poll.registry().register(&mut registered, mio::Token(0), mio::Interest::WRITABLE)?;
    let mut events = mio::Events::with_capacity(4);
    let piece = vec![b'x'; 64 << 10];
    let mut left = len;
    while left > 0 {
        match stream.write(&piece[..left.min(piece.len())]) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                shared.bulk_written.fetch_add(n as u64, Ordering::AcqRel);
                left -= n;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                shared.bulk_stalls.fetch_add(1, Ordering::AcqRel);
                shared.bulk_blocked.store(true, Ordering::Release);
                let room = wait_for_room(&mut poll, &mut events, shared);
                shared.bulk_blocked.store(false, Ordering::Release);
                room?;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Waits for the registered socket's next event: room freed, or an error that the next write
/// reports (edge-triggered, so an event from before the full write only costs one more try).
/// Gives up when the backend is dropped.
fn wait_for_room(
    poll: &mut mio::Poll,
    events: &mut mio::Events,
    shared: &Shared,
) -> io::Result<()> {
    loop {
        match poll.poll(events, Some(PATIENCE)) {
            Ok(()) if !events.is_empty() => return Ok(()),
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
        if shared.stop.load(Ordering::Acquire) {
            return Err(io::ErrorKind::ConnectionAborted.into());
        }
    }
}

/// A `chat.completion` JSON, or its SSE form when the request asked for a stream.
fn complete(wire: &mut Wire, request: &Recorded, content: &str) -> io::Result<()> {
    let json: Option<Value> = serde_json::from_slice(&request.body).ok();
    let model = json
        .as_ref()
        .and_then(|j| j.get("model"))
        .and_then(Value::as_str)
        .unwrap_or("unknown")
        .to_owned();
    let streaming = json.as_ref().and_then(|j| j.get("stream")).and_then(Value::as_bool);
    let id = format!("chatcmpl-fake-{}", request.seq);
    if streaming == Some(true) {
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
                    Cache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n";
        wire.send(head.as_bytes())?;
        for event in sse_events(&id, &model, content) {
            wire.send(&wire::chunk(format!("data: {event}\n\n").as_bytes()))?;
        }
        return wire.send(b"0\r\n\r\n");
    }
    let body = completion_json(&id, &model, content);
    respond(wire, 200, &[("Content-Type", "application/json")], body.as_bytes())
}

/// An OpenAI `chat.completion` object.
pub fn completion_json(id: &str, model: &str, content: &str) -> String {
    serde_json::json!({
        "id": id,
        "object": "chat.completion",
        "created": 1_700_000_000,
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": content},
            "finish_reason": "stop",
        }],
        "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
    })
    .to_string()
}

/// The `data:` payloads of a streamed answer of `content`: a role chunk, one chunk per word
/// (each but the first with its leading space), a finish chunk, then `[DONE]`.
pub fn sse_events(id: &str, model: &str, content: &str) -> Vec<String> {
    let chunk = |delta: Value, finish: Value| {
        serde_json::json!({
            "id": id,
            "object": "chat.completion.chunk",
            "created": 1_700_000_000,
            "model": model,
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
        })
        .to_string()
    };
    let mut events =
        vec![chunk(serde_json::json!({"role": "assistant", "content": ""}), Value::Null)];
    for (i, word) in content.split(' ').enumerate() {
        let piece = if i == 0 { word.to_owned() } else { format!(" {word}") };
        events.push(chunk(serde_json::json!({"content": piece}), Value::Null));
    }
    events.push(chunk(serde_json::json!({}), Value::from("stop")));
    events.push("[DONE]".to_owned());
    events
}

fn respond(wire: &mut Wire, status: u16, headers: &[(&str, &str)], body: &[u8]) -> io::Result<()> {
    let mut out = format!("HTTP/1.1 {status} {}\r\n", reason(status)).into_bytes();
    for (name, value) in headers {
        write!(out, "{name}: {value}\r\n")?;
    }
    write!(out, "Content-Length: {}\r\n\r\n", body.len())?;
    out.extend_from_slice(body);
    wire.send(&out)
}

fn reason(status: u16) -> &'static str {
    match status {
        200 => "OK",
        400 => "Bad Request",
        404 => "Not Found",
        422 => "Unprocessable Entity",
        429 => "Too Many Requests",
        500 => "Internal Server Error",
        503 => "Service Unavailable",
        _ => "Status",
    }
}
