//! The connection state machine of a real shard fed arbitrary client bytes in arbitrary
//! splits, checked against the connection model of `protocol::harness` (`cfg(test)` /
//! `cfg(fuzzing)`; the `connection` fuzz target and a unit test drive it).
//!
//! One router runs for the life of the process (two shards, so that the kernel puts each
//! input's connection on either and a request's admission crosses shards when the model's
//! scheduler lives on the other; limits small enough for a fuzzer to reach: 1 KiB heads, 2 KiB
//! bodies) in front of a minimal backend that answers every
//! request `200 {}` in two writes: with a `Content-Length` when the request body's length is
//! even (the head, then the body), chunked (an extension, a trailer) when it is odd, so the
//! shard's hold of a fixed-length head for its body, its pass-through of chunked bodies and its
//! reuse of the backend connection after one are driven too. A quarter of the inputs (by their
//! first byte) reload the router's configuration after their first piece, between two versions
//! that answer every request alike (one backend; or two, the second a twin of the first, with
//! one request on each), so the checks below also hold across live reloads: added and removed
//! backends, a changed admission cap, the shard adopting a generation mid-request. For each input,
//! [`check_connection`] opens a connection, writes the bytes
//! in pieces (each piece its own `write`, `TCP_NODELAY`, so the shard sees many splits), reads
//! what comes back as a client would, and checks:
//! - one final response per request the model completes, in order, each with the status its
//!   route gives (the backend's 200, `/v1/models` and health 200, a bad body 400, another model
//!   404, anything else 404), after a `100 Continue` exactly when one is due;
//! - after a framing error the model names, a response with that error's status, then the
//!   connection closed; after a request that does not keep the connection alive, closed;
//! - on a connection left open at a request boundary, one more request is answered (so no
//!   stray response was left queued); nothing else arrives;
//! - afterwards the router is idle: every queue empty, inflight 0, and it counted exactly the
//!   responses read.
//!
//! It is slower than the sans-IO targets (a few thousand executions per second: every input is
//! a real exchange on loopback) and not fully deterministic (how the kernel coalesces writes
//! varies), which is the point: it tests the shard, not a model of it.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use crate::config::Config;
use crate::protocol::harness::{connection_model, pieces, ModelEnd, ModelRequest};
use crate::protocol::{
    find_model, parse_response_head, ChunkedDecoder, ChunkedLimits, Limits, ResponseFraming, Side,
};

use super::{admin, Running};

/// How long a read waits before the router is declared stuck.
const STUCK: Duration = Duration::from_secs(5);

struct Rig {
    addr: SocketAddr,
    running: Running,
    /// Responses the router had counted after the previous input.
    counted: Mutex<u64>,
    limits: Limits,
    /// The configuration file and which of its two versions it holds (see [`Rig::reload`]).
    file: Mutex<(std::path::PathBuf, bool)>,
    backends: [SocketAddr; 2],
}

/// The harness router's configuration: its backends `backends`, at most `inflight`
/// requests on each.
fn harness_toml(backends: &[SocketAddr], inflight: u32) -> String {
    let backends: Vec<String> = backends.iter().map(|b| format!("\"{b}\"")).collect();
    format!(
        "[server]\nlisten = \"127.0.0.1:0\"\nadmin_listen = \"127.0.0.1:0\"\nshards = 2\n\
         pin_cores = false\nmax_header_bytes = 1024\nmax_body_bytes = 2048\n\
         header_timeout = \"10s\"\nbody_timeout = \"10s\"\n\
         [upstream]\nmetrics_interval = \"1s\"\n\
         [[model]]\nname = \"m\"\nengine = \"openai\"\nbackends = [{}]\n\
         [model.queue]\ninflight_per_backend = {inflight}\n",
        backends.join(", ")
    )
}

fn rig() -> &'static Rig {
    static RIG: OnceLock<Rig> = OnceLock::new();
    RIG.get_or_init(|| {
        let backends = [spawn_backend(), spawn_backend()];
        let toml = harness_toml(&backends[..1], 64);
        let path = std::env::temp_dir()
            .join(format!("warmpath-connection-harness-{}.toml", std::process::id()));
        std::fs::write(&path, &toml).expect("write the harness configuration");
        let config = Config::from_toml_str(&toml).expect("the harness configuration");
        let limits = Limits {
            max_header_bytes: 1024,
            max_body_bytes: 2048,
            session_header: config.queue.session_header.to_ascii_lowercase(),
            ..Limits::default()
        };
        let source = super::ConfigSource {
            path: path.clone(),
            overrides: crate::config::Overrides::default(),
            env: |_| None,
        };
        let running = super::start_with_source(config, Some(source), crate::clock::Clock::real())
            .expect("the harness router starts");
        let (counted, file) = (Mutex::new(0), Mutex::new((path, false)));
        Rig { addr: running.addr(), running, counted, limits, file, backends }
    })
}

impl Rig {
    /// A live reload between the two versions of the configuration, which answer every
    /// request alike: one backend and 64 requests on it, or both backends (the second answers
    /// as the first) and one request on each. A request in flight on the second backend when
    /// a reload removes it finishes there.
    fn reload(&self) {
        let mut file = self.file.lock().unwrap_or_else(|e| e.into_inner());
        file.1 = !file.1;
        let toml = match file.1 {
            true => harness_toml(&self.backends, 1),
            false => harness_toml(&self.backends[..1], 64),
        };
        std::fs::write(&file.0, toml).expect("write the harness configuration");
        if let Err(e) = self.running.reload() {
            panic!("the harness configuration was refused: {e}");
        }
    }
}

/// A backend answering every request `200 {}` with keep-alive (health checks included).
fn spawn_backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = listener.local_addr().expect("local addr");
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            std::thread::spawn(move || serve_backend(stream));
        }
    });
    addr
}

/// `stream.read`, again when a signal interrupted it: the fuzzer's timeout alarm lands on any
/// thread of the process, and a blocking read it interrupts is no failure of the router's.
fn read_through_signals(stream: &mut TcpStream, buf: &mut [u8]) -> std::io::Result<usize> {
    loop {
        match stream.read(buf) {
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            read => return read,
        }
    }
}

fn serve_backend(mut stream: TcpStream) {
    let _ = stream.set_nodelay(true);
    let mut buf = Vec::new();
    let mut chunk = [0u8; 16 << 10];
    loop {
        // The router always forwards a Content-Length body.
        let Some(end) = buf.windows(4).position(|w| w == b"\r\n\r\n") else {
            match read_through_signals(&mut stream, &mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
            continue;
        };
        let head = String::from_utf8_lossy(&buf[..end]).to_ascii_lowercase();
        let length = head
            .lines()
            .find_map(|l| l.strip_prefix("content-length:"))
            .and_then(|v| v.trim().parse::<usize>().ok())
            .unwrap_or(0);
        while buf.len() < end + 4 + length {
            match read_through_signals(&mut stream, &mut chunk) {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        buf.drain(..end + 4 + length);
        // Head and body in two writes, as uvicorn sends them (the router holds a fixed-length
        // head for its body). A body of odd length is answered chunked, with an extension and
        // a trailer: the router passes it through to an HTTP/1.1 client, and must find its end
        // to reuse the connection.
        let replies: [&[u8]; 2] = match length % 2 {
            0 => [
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n",
                b"{}",
            ],
            _ => [
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\
                  Transfer-Encoding: chunked\r\n\r\n1;e=1\r\n{",
                b"\r\n1\r\n}\r\n0\r\nX-T: 1\r\n\r\n",
            ],
        };
        if replies.iter().any(|r| stream.write_all(r).is_err()) {
            return;
        }
    }
}

/// Whether the backend gets `request` (and answers it chunked when its body's length is odd).
fn reaches_backend(request: &ModelRequest) -> bool {
    let path = request.target.split(|&b| b == b'?').next().unwrap_or(&[]);
    request.method == b"POST"
        && path.starts_with(b"/v1/")
        && find_model(&request.body).is_ok_and(|f| f.value == "m")
}

/// The status the router's routes give a complete request.
fn route_status(request: &ModelRequest) -> u16 {
    let path = request.target.split(|&b| b == b'?').next().unwrap_or(&[]);
    if request.method == b"POST" && path.starts_with(b"/v1/") {
        return match find_model(&request.body) {
            Ok(field) if field.value == "m" => 200,
            Ok(_) => 404,
            Err(_) => 400,
        };
    }
    match (&request.method[..], path) {
        (b"GET" | b"HEAD", b"/v1/models" | b"/healthz" | b"/readyz") => 200,
        _ => 404,
    }
}

/// One response as a client reads it.
#[derive(Debug)]
struct Answer {
    status: u16,
    close: bool,
}

/// A client's reader: responses framed by `Content-Length`, chunked (a backend's chunked body
/// passed through) or by the close (the same for an HTTP/1.0 client).
struct Client {
    stream: TcpStream,
    buf: Vec<u8>,
    /// Final responses read so far.
    answers: usize,
    /// What the model expects, for failure messages.
    expected: String,
}

impl Client {
    /// A connection to the router at `addr`, `TCP_NODELAY`, its reads and writes bounded by
    /// [`STUCK`].
    fn connect(addr: SocketAddr, expected: String) -> Client {
        let stream = TcpStream::connect(addr).expect("connect to the harness router");
        stream.set_nodelay(true).expect("nodelay");
        stream.set_read_timeout(Some(STUCK)).expect("read timeout");
        stream.set_write_timeout(Some(STUCK)).expect("write timeout");
        Client { stream, buf: Vec::new(), answers: 0, expected }
    }

    /// Writes `bytes` in the pieces `seed` chooses, each its own `write`, and calls `between`
    /// after the first.
    fn write_in_pieces(&mut self, bytes: &[u8], seed: u8, between: impl FnOnce()) {
        let mut next = pieces(seed);
        let mut written = 0;
        let mut between = Some(between);
        while written < bytes.len() {
            if written > 0 {
                if let Some(f) = between.take() {
                    f();
                }
            }
            let n = next().min(bytes.len() - written);
            // After an error the router half-closes and reads on (lingering), so every write
            // succeeds; a failed one means it closed, or reset, while the client was sending.
            if let Err(e) = self.stream.write_all(&bytes[written..written + n]) {
                panic!("writing byte {written} of {}: {e}", bytes.len());
            }
            written += n;
        }
    }

    /// Reads the answer to each of `requests` and checks its status; returns how many.
    fn read_answers(&mut self, requests: &[ModelRequest], rig: &Rig, end: &ModelEnd) -> u64 {
        let mut seen = Vec::new();
        for (i, request) in requests.iter().enumerate() {
            let was_head = request.method == b"HEAD";
            if self.buf.is_empty() && !self.fill() {
                let metrics = admin::render_metrics(&rig.running.shared);
                let counters: Vec<&str> = metrics
                    .lines()
                    .filter(|l| {
                        l.starts_with("warmpath_c") || l.starts_with("warmpath_router_resp")
                    })
                    .collect();
                eprintln!("router: {counters:#?}");
                panic!(
                    "closed before the answer to request {} of {} ({:?} {:?}); end {end:?}; \
                     answers before it {seen:?}",
                    i + 1,
                    requests.len(),
                    String::from_utf8_lossy(&request.method),
                    String::from_utf8_lossy(&request.target),
                );
            }
            let response = self.final_response(request.expect_continue, was_head);
            assert_eq!(
                response.status,
                route_status(request),
                "request {:?} {:?}",
                String::from_utf8_lossy(&request.method),
                String::from_utf8_lossy(&request.target)
            );
            seen.push((response.status, response.close));
        }
        requests.len() as u64
    }

    /// Checks how the connection ends after the last complete request, as the model says;
    /// returns the answers read doing so.
    fn read_end(&mut self, end: ModelEnd) -> u64 {
        match end {
            ModelEnd::Error { kind, after_continue } => {
                let response = self.final_response(after_continue, false);
                let status = crate::protocol::ProtocolError::downstream(kind).status();
                assert_eq!(response.status, status, "the error's status ({kind:?})");
                assert!(response.close, "an error answer says Connection: close");
                assert!(self.response(false).is_none(), "closed after a framing error");
                1
            }
            ModelEnd::Close => {
                assert!(self.response(false).is_none(), "closed after a non-keep-alive answer");
                0
            }
            ModelEnd::Open { clean: true } => {
                self.stream.write_all(b"GET /healthz HTTP/1.1\r\nHost: h\r\n\r\n").expect("send");
                let response = self.final_response(false, false);
                assert_eq!(response.status, 200, "the connection still serves requests");
                1
            }
            ModelEnd::Open { clean: false } => 0,
        }
    }

    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 8192];
        match read_through_signals(&mut self.stream, &mut chunk) {
            Ok(0) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
            // A reset purges answers the router had not sent yet; it closes lingering.
            Err(e) if e.kind() == ErrorKind::ConnectionReset => {
                panic!("the router reset the connection after {:?}", self.shown())
            }
            Err(e) => panic!("the router is stuck or failed: {e} after {:?}", self.shown()),
        }
    }

    fn shown(&self) -> String {
        format!(
            "{:?} ({} final answers read before; {})",
            String::from_utf8_lossy(&self.buf),
            self.answers,
            self.expected
        )
    }

    /// The next response (interim ones included), or `None` at end of stream.
    fn response(&mut self, request_was_head: bool) -> Option<Answer> {
        loop {
            match parse_response_head(&self.buf, 1 << 20, request_was_head) {
                Ok(Some(head)) => {
                    let length = match head.framing {
                        ResponseFraming::ContentLength(n) => n as usize,
                        ResponseFraming::None => 0,
                        ResponseFraming::Chunked => self.chunked_length(head.head_len),
                        // An HTTP/1.0 client's answer to a chunked backend body: to the close.
                        ResponseFraming::UntilClose => {
                            while self.fill() {}
                            self.buf.len() - head.head_len
                        }
                    };
                    while self.buf.len() < head.head_len + length {
                        assert!(self.fill(), "the body was cut: {}", self.shown());
                    }
                    let close = head
                        .headers
                        .get(&self.buf, "connection")
                        .is_some_and(|v| v.eq_ignore_ascii_case(b"close"));
                    self.buf.drain(..head.head_len + length);
                    return Some(Answer { status: head.status, close });
                }
                Ok(None) => {
                    if !self.fill() {
                        assert!(self.buf.is_empty(), "a partial response: {}", self.shown());
                        return None;
                    }
                }
                Err(e) => panic!("the router sent a malformed response ({e}): {}", self.shown()),
            }
        }
    }

    /// The length of the chunked body at `start` (read until it is complete), which must carry
    /// the backend's `{}`.
    fn chunked_length(&mut self, start: usize) -> usize {
        let limits = ChunkedLimits { max_body_bytes: 2, max_line_bytes: 16, max_trailer_bytes: 0 };
        let mut decoder = ChunkedDecoder::new(limits, Side::Upstream);
        let (mut data, mut pos) = (Vec::new(), start);
        loop {
            let fed = decoder.feed(&self.buf[pos..], &mut data);
            let progress = fed.unwrap_or_else(|e| panic!("bad chunks ({e}): {}", self.shown()));
            pos += progress.consumed;
            if progress.done {
                assert_eq!(data, b"{}", "the backend's body: {}", self.shown());
                return pos - start;
            }
            assert!(self.fill(), "the chunked body was cut: {}", self.shown());
        }
    }

    /// The final response to one request, checking the `100 Continue` before it.
    fn final_response(&mut self, expect_continue: bool, was_head: bool) -> Answer {
        let first = self.response(was_head).expect("a response");
        if first.status != 100 {
            self.answers += 1;
            return first;
        }
        assert!(expect_continue, "a 100 Continue nobody asked for");
        let last = self.response(was_head).expect("a response after 100 Continue");
        assert_ne!(last.status, 100, "one 100 Continue per request");
        self.answers += 1;
        last
    }
}

/// Writes `data` (after one byte: the split seed in its low 6 bits, and a reload of the
/// router's configuration after the first piece when its top two are set) to the router in
/// pieces and checks what comes back against [`connection_model`]; see the module doc.
pub fn check_connection(data: &[u8]) {
    let Some((&seed, stream_bytes)) = data.split_first() else { return };
    let (seed, reload) = (seed & 0x3f, seed & 0xc0 == 0xc0);
    let rig = rig();
    let (mut requests, mut end) = connection_model(stream_bytes, &rig.limits);
    // A chunked backend body reaches an HTTP/1.0 client delimited by the close: the
    // connection ends with it.
    let close_delimited =
        |r: &ModelRequest| !r.http11 && reaches_backend(r) && r.body.len() % 2 == 1;
    if let Some(i) = requests.iter().position(close_delimited) {
        requests.truncate(i + 1);
        end = ModelEnd::Close;
    }
    let mut client = Client::connect(rig.addr, expected(&requests, &end));
    client.write_in_pieces(stream_bytes, seed, || {
        if reload {
            rig.reload();
        }
    });
    let mut read = client.read_answers(&requests, rig, &end);
    read += client.read_end(end);
    let _ = client.stream.shutdown(Shutdown::Both);
    drop(client);
    settle(rig, read);
}

/// What the model expects of one input, for failure messages.
fn expected(requests: &[ModelRequest], end: &ModelEnd) -> String {
    format!(
        "expected {} requests: {:?}, then {end:?}",
        requests.len(),
        requests
            .iter()
            .map(|r| format!(
                "{} {}",
                String::from_utf8_lossy(&r.method),
                String::from_utf8_lossy(&r.target)
            ))
            .collect::<Vec<_>>()
    )
}

/// Waits until the router is idle and has counted `read` more responses than before.
fn settle(rig: &Rig, read: u64) {
    let mut counted = rig.counted.lock().unwrap_or_else(|e| e.into_inner());
    let want = *counted + read;
    for _ in 0..2000 {
        let queue = admin::debug_queue(&rig.running.shared);
        let idle = queue["models"]
            .as_array()
            .is_some_and(|models| models.iter().all(|m| m["queued"] == 0 && m["inflight"] == 0));
        let now = responses_counted(rig);
        assert!(now <= want, "the router counted {now} responses, {want} were read");
        if idle && now == want {
            *counted = want;
            return;
        }
        std::thread::sleep(Duration::from_micros(500));
    }
    panic!("the router did not settle: {}", admin::debug_queue(&rig.running.shared));
}

/// Responses the router counted so far, every status, model-bound or not.
fn responses_counted(rig: &Rig) -> u64 {
    use std::sync::atomic::Ordering::Relaxed;
    let shared = &rig.running.shared;
    shared
        .shard_metrics
        .iter()
        .map(|s| {
            let s = Arc::clone(&s.lock().unwrap_or_else(|e| e.into_inner()));
            let other: u64 = s.other_status.iter().map(|c| c.load(Relaxed)).sum();
            let models: u64 =
                s.models.iter().flat_map(|m| m.status.iter()).map(|c| c.load(Relaxed)).sum();
            other + models
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The seeds of `fuzz/corpus/connection`, each in several splits.
    #[test]
    fn seeds_pass_in_several_splits() {
        let streams: [&[u8]; 8] = [
            b"POST /v1/a HTTP/1.1\r\nHost: a\r\nContent-Length: 14\r\n\r\n{\"model\":\"m\"} \
              POST /v1/b HTTP/1.1\r\nHost: a\r\nContent-Length: 13\r\n\r\n{\"model\":\"m\"}\
              POST /v1/c HTTP/1.1\r\nHost: a\r\nContent-Length: 14\r\n\r\n{\"model\":\"m\"} ",
            b"POST /v1/a HTTP/1.0\r\nConnection: keep-alive\r\nContent-Length: 13\r\n\r\n\
              {\"model\":\"m\"}GET /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: a\r\nContent-Length: 13\r\n\r\n{\"model\":\"m\"}",
            b"POST /v1/x HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nExpect: 100-continue\r\n\r\n\
              d\r\n{\"model\":\"m\"}\r\n0\r\n\r\nGET /healthz HTTP/1.1\r\nHost: a\r\n\r\n",
            b"GET /v1/models HTTP/1.0\r\n\r\nGET /nope HTTP/1.1\r\nHost: a\r\n\r\n",
            b"POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc",
            b"POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 9\r\n\r\n{\"model\":",
            b"POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 13\r\n\r\n{\"model\":\"z\"}\
              POST /v1/x HTTP/1.1\r\nHost: a\r\nContent-Length: 2\r\n\r\n[]",
        ];
        for stream in streams {
            // 0xc3: split by seed 3, the configuration reloaded after the first piece.
            for seed in [0u8, 1, 3, 200, 0xc3] {
                let mut data = vec![seed];
                data.extend_from_slice(stream);
                check_connection(&data);
            }
        }
        assert!(rig().running.generation() > 1, "the 0xc3 inputs reloaded the router");
    }
}
