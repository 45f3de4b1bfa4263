//! A raw HTTP/1.1 test client: requests are bytes the test writes (so it can send malformed,
//! slow or pipelined ones), responses are read exactly as framed by the router, and SSE events
//! are yielded as they arrive. Plus helpers for the admin listener.

use std::io;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::Value;

use super::wire::{self, Framing, Head, Wire};
use super::{wait_until, Deadline, PATIENCE, POLL};

/// A client connection with a read timeout of [`PATIENCE`].
#[derive(Debug)]
pub struct Conn {
    wire: Wire,
    /// SSE text received and not yet returned as an event.
    pending: Vec<u8>,
    /// The body framing of the streamed response being read.
    framing: Option<Framing>,
}

/// A complete response.
#[derive(Debug, Clone)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Header lines in order.
    pub headers: Vec<(String, String)>,
    /// Body, de-chunked.
    pub body: Vec<u8>,
}

impl Response {
    /// The first value of `name` (case-insensitive).
    pub fn header(&self, name: &str) -> Option<&str> {
        wire::header(&self.headers, name)
    }

    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (panics with the body when it is not).
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("response body is not JSON ({e}): {}", self.text()))
    }

    /// Asserts a router error of SPEC 2's table: this status, a JSON body
    /// `{"error":{"message","type","code"}}` with this code.
    pub fn assert_error(&self, status: u16, code: &str) {
        assert_eq!(self.status, status, "status; body: {}", self.text());
        let json = self.json();
        let error = json.get("error").unwrap_or_else(|| panic!("no \"error\" in {json}"));
        assert_eq!(error.get("code").and_then(Value::as_str), Some(code), "code in {json}");
        assert!(error.get("message").and_then(Value::as_str).is_some(), "message in {json}");
        assert!(error.get("type").and_then(Value::as_str).is_some(), "type in {json}");
    }

    /// Asserts a `Retry-After` header with a whole number of seconds.
    pub fn assert_retry_after(&self) {
        let value = self
            .header("retry-after")
            .unwrap_or_else(|| panic!("no Retry-After on a {}: {:?}", self.status, self.headers));
        assert!(value.trim().parse::<u64>().is_ok(), "Retry-After: {value:?}");
    }

    /// The assistant content of a `chat.completion` body.
    pub fn content(&self) -> String {
        let json = self.json();
        json["choices"][0]["message"]["content"].as_str().unwrap_or_default().to_owned()
    }
}

impl Conn {
    /// Connects to `addr` (panics when refused).
    pub fn open(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        stream.set_read_timeout(Some(PATIENCE)).expect("read timeout");
        let _ = stream.set_nodelay(true);
        Conn { wire: Wire::new(stream), pending: Vec::new(), framing: None }
    }

    /// A client on a connection the test opened itself (e.g. to read interim responses raw).
    pub fn from_stream(stream: TcpStream) -> Conn {
        stream.set_read_timeout(Some(PATIENCE)).expect("read timeout");
        Conn { wire: Wire::new(stream), pending: Vec::new(), framing: None }
    }

    /// Writes `bytes` (panics on error).
    pub fn send(&mut self, bytes: &[u8]) {
        self.wire.send(bytes).expect("send to the router");
    }

    /// Writes `bytes`, ignoring errors (the router may have closed the connection already).
    pub fn send_lossy(&mut self, bytes: &[u8]) {
        let _ = self.wire.send(bytes);
    }

    /// Sets the read timeout.
    pub fn set_read_timeout(&self, timeout: Duration) {
        self.wire.stream.set_read_timeout(Some(timeout)).expect("read timeout");
    }

    /// Reads one whole response.
    pub fn read_response(&mut self) -> io::Result<Response> {
        let head = self.wire.read_response_head()?;
        let framing = match (head.status, head.framing()) {
            (204 | 304, _) => Framing::Length(0),
            (_, framing) => framing,
        };
        let body = self.wire.read_body(framing)?;
        Ok(Response { status: head.status, headers: head.headers, body })
    }

    /// Reads one whole response (panics on error).
    pub fn response(&mut self) -> Response {
        self.read_response().expect("a response from the router")
    }

    /// Sends `request` and reads its response.
    pub fn exchange(&mut self, request: &[u8]) -> Response {
        self.send(request);
        self.response()
    }

    /// Reads the head of a response whose body is then read with [`next_event`].
    ///
    /// [`next_event`]: Conn::next_event
    pub fn read_head(&mut self) -> io::Result<Head> {
        let head = self.wire.read_response_head()?;
        self.framing = Some(head.framing());
        self.pending.clear();
        Ok(head)
    }

    /// The next SSE event (its text without the blank line that ends it) as soon as it has
    /// arrived; `Ok(None)` at the clean end of the body; an error when the connection closed
    /// inside a chunk or before the last chunk (`UnexpectedEof`).
    pub fn next_event(&mut self) -> io::Result<Option<String>> {
        loop {
            if let Some(end) = self.pending.windows(2).position(|w| w == b"\n\n") {
                let event: Vec<u8> = self.pending.drain(..end + 2).collect();
                return Ok(Some(String::from_utf8_lossy(&event[..end]).into_owned()));
            }
            let piece = match self.framing.expect("read_head first") {
                Framing::Chunked => self.wire.chunk()?,
                Framing::Close | Framing::Length(_) => {
                    let taken = std::mem::take(&mut self.wire.buf);
                    if !taken.is_empty() {
                        Some(taken)
                    } else if self.wire.fill()? == 0 {
                        None
                    } else {
                        Some(std::mem::take(&mut self.wire.buf))
                    }
                }
            };
            match piece {
                Some(data) => self.pending.extend_from_slice(&data),
                None if self.pending.is_empty() => return Ok(None),
                None => {
                    let rest = std::mem::take(&mut self.pending);
                    return Ok(Some(String::from_utf8_lossy(&rest).into_owned()));
                }
            }
        }
    }

    /// Whether the router closed the connection: a read within `timeout` sees end of stream or
    /// a reset. Bytes that arrive instead are kept for the next read.
    pub fn closed_within(&mut self, timeout: Duration) -> bool {
        self.set_read_timeout(timeout);
        let closed = match self.wire.fill() {
            Ok(0) => true,
            Ok(_) => false,
            Err(e) => !matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut),
        };
        self.set_read_timeout(PATIENCE);
        closed
    }

    /// Waits until the router closes the connection (at most [`PATIENCE`]), discarding
    /// anything else it sends.
    pub fn assert_closed(&mut self) {
        wait_until("the router to close the connection", PATIENCE, || {
            self.closed_within(Duration::from_millis(50)).then_some(())
        });
    }

    /// The socket (e.g. to shut it down).
    pub fn stream(&self) -> &TcpStream {
        &self.wire.stream
    }
}

/// A request with `Host`, and `Content-Length` when there is a body or the method is POST.
pub fn request(method: &str, target: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
    let mut out = format!("{method} {target} HTTP/1.1\r\nHost: warmpath.test\r\n");
    for (name, value) in headers {
        out.push_str(&format!("{name}: {value}\r\n"));
    }
    if !body.is_empty() || method == "POST" {
        out.push_str(&format!("Content-Length: {}\r\n", body.len()));
    }
    out.push_str("\r\n");
    let mut out = out.into_bytes();
    out.extend_from_slice(body);
    out
}

/// `GET target` without a body.
pub fn get_request(target: &str) -> Vec<u8> {
    request("GET", target, &[], b"")
}

/// A chat completion body for `model`.
pub fn chat_body(model: &str, stream: bool) -> String {
    format!(
        "{{\"model\":\"{model}\",\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}],\
         \"stream\":{stream}}}"
    )
}

/// `POST /v1/chat/completions` with `body` as JSON.
pub fn post_json(body: &[u8]) -> Vec<u8> {
    request("POST", "/v1/chat/completions", &[("Content-Type", "application/json")], body)
}

/// `POST /v1/chat/completions` for `model`, with the session header when `session` is given.
pub fn chat_request(model: &str, session: Option<&str>, stream: bool) -> Vec<u8> {
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(session) = session {
        headers.push(("X-Session-ID", session));
    }
    request("POST", "/v1/chat/completions", &headers, chat_body(model, stream).as_bytes())
}

/// A one-shot exchange on a new connection.
pub fn exchange(addr: SocketAddr, request: &[u8]) -> Response {
    Conn::open(addr).exchange(request)
}

/// `GET path` on a new connection.
pub fn get(addr: SocketAddr, path: &str) -> Response {
    exchange(addr, &get_request(path))
}

/// The admin listener's `/debug/queue` JSON.
pub fn debug_queue(admin: SocketAddr) -> Value {
    let response = get(admin, "/debug/queue");
    assert_eq!(response.status, 200, "/debug/queue: {}", response.text());
    response.json()
}

/// The `/debug/queue` entry of `model`.
pub fn model_queue(admin: SocketAddr, model: &str) -> Value {
    let all = debug_queue(admin);
    let models = all["models"].as_array().unwrap_or_else(|| panic!("no models array: {all}"));
    models
        .iter()
        .find(|m| m["model"].as_str() == Some(model))
        .unwrap_or_else(|| panic!("model {model:?} not in /debug/queue: {all}"))
        .clone()
}

/// Requests of `model` queued right now (all lanes).
pub fn queued(admin: SocketAddr, model: &str) -> u64 {
    let entry = model_queue(admin, model);
    entry["queued"].as_u64().unwrap_or_else(|| panic!("no \"queued\" count: {entry}"))
}

/// Requests of `model` in flight right now (all backends).
pub fn inflight(admin: SocketAddr, model: &str) -> u64 {
    let entry = model_queue(admin, model);
    entry["inflight"].as_u64().unwrap_or_else(|| panic!("no \"inflight\" count: {entry}"))
}

/// Inflight of one backend of `model`, from `/debug/queue`.
pub fn backend_inflight(admin: SocketAddr, model: &str, backend: &str) -> u64 {
    let entry = model_queue(admin, model);
    let backends = entry["backends"].as_array().unwrap_or_else(|| panic!("no backends: {entry}"));
    let found = backends.iter().find(|b| b["backend"].as_str() == Some(backend));
    let found = found.unwrap_or_else(|| panic!("backend {backend} not in {entry}"));
    found["inflight"].as_u64().unwrap_or_else(|| panic!("no backend inflight: {entry}"))
}

/// Waits until exactly `n` requests of `model` are queued.
pub fn wait_queued(admin: SocketAddr, model: &str, n: u64) {
    let deadline = Deadline::after(PATIENCE);
    loop {
        let seen = queued(admin, model);
        if seen == n {
            return;
        }
        assert!(!deadline.passed(), "{n} requests of {model:?} never queued: last seen {seen}");
        std::thread::sleep(POLL);
    }
}

/// Waits until `model` has nothing queued or in flight.
pub fn wait_idle(admin: SocketAddr, model: &str) {
    wait_until(&format!("{model:?} to be idle"), PATIENCE, || {
        let entry = model_queue(admin, model);
        (entry["queued"].as_u64() == Some(0) && entry["inflight"].as_u64() == Some(0)).then_some(())
    });
}

/// The admin listener's `/metrics` text.
pub fn metrics(admin: SocketAddr) -> String {
    let response = get(admin, "/metrics");
    assert_eq!(response.status, 200, "/metrics: {}", response.text());
    response.text()
}

/// Waits until the samples of `name` with `labels` (summed, see [`metric`]) on the admin
/// listener's `/metrics` satisfy `ok` (counters are published after the response, so poll);
/// returns the value. Panics with the family's lines after [`PATIENCE`].
pub fn wait_metric(
    admin: SocketAddr,
    name: &str,
    labels: &[(&str, &str)],
    ok: impl Fn(f64) -> bool,
) -> f64 {
    let deadline = Deadline::after(PATIENCE);
    loop {
        let text = metrics(admin);
        let value = metric(&text, name, labels);
        if let Some(value) = value.filter(|v| ok(*v)) {
            return value;
        }
        if deadline.passed() {
            let family: Vec<&str> = text.lines().filter(|l| l.contains(name)).collect();
            panic!("{name}{labels:?} = {value:?} never matched:\n{}", family.join("\n"));
        }
        std::thread::sleep(POLL);
    }
}

/// The sum of the samples of `name` whose labels include every pair of `labels` (`None` when no
/// series matches). Label order in the text does not matter.
pub fn metric(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in text.lines() {
        let Some((series, labels_text, value)) = split_sample(line) else { continue };
        if series != name {
            continue;
        }
        let pairs = parse_labels(labels_text);
        let matches = labels.iter().all(|(k, v)| pairs.iter().any(|(pk, pv)| pk == k && pv == v));
        if matches {
            *found.get_or_insert(0.0) += value;
        }
    }
    found
}

/// `name{labels} value` (labels may be absent) of a sample line.
fn split_sample(line: &str) -> Option<(&str, &str, f64)> {
    if line.starts_with('#') || line.trim().is_empty() {
        return None;
    }
    let (series, labels, rest) = match line.find('{') {
        Some(open) => {
            let close = line.rfind('}')?;
            (&line[..open], &line[open + 1..close], &line[close + 1..])
        }
        None => {
            let space = line.find(' ')?;
            (&line[..space], "", &line[space..])
        }
    };
    let value = rest.split_whitespace().next()?.parse().ok()?;
    Some((series, labels, value))
}

fn parse_labels(text: &str) -> Vec<(String, String)> {
    let mut pairs = Vec::new();
    let mut rest = text;
    while let Some(eq) = rest.find('=') {
        let key = rest[..eq].trim().trim_start_matches(',').trim().to_owned();
        let after = &rest[eq + 1..];
        let Some(quoted) = after.strip_prefix('"') else { break };
        let mut value = String::new();
        let mut chars = quoted.char_indices();
        let mut end = quoted.len();
        while let Some((i, c)) = chars.next() {
            match c {
                '\\' => {
                    if let Some((_, escaped)) = chars.next() {
                        value.push(if escaped == 'n' { '\n' } else { escaped });
                    }
                }
                '"' => {
                    end = i + 1;
                    break;
                }
                c => value.push(c),
            }
        }
        pairs.push((key, value));
        rest = &quoted[end..];
    }
    pairs
}
