//! The load generator: one thread, one mio event loop (edge-triggered), HTTP/1.1 keep-alive
//! connections to the target, streaming chat completions.
//!
//! It shares the machine with the engines and the router it measures, so it is built to cost
//! little: a single thread whatever the load, at most `max_inflight` connections, idle
//! connections reused, response heads parsed by [`parse_response_head`] and chunked bodies
//! decoded by [`ChunkedDecoder`] (the dataplane's own sans-IO code), SSE parsed line by line.
//!
//! Scheduling: a timer heap holds the turns whose predecessor has ended, keyed by their due
//! tick: `max(start + at, predecessor's end + think)` (first turns: `start + at`). A turn is
//! sent when it is due and fewer than `max_inflight` requests are in flight (otherwise it waits
//! for one to end, and its latencies are measured from when it was actually sent). When a turn
//! ends, whatever its outcome, its follow-ups are pushed: a conversation goes on after an error,
//! as a user would retry by sending the next message. Past the duration limit nothing new is
//! sent and the run ends when the requests in flight have.
//!
//! Measures per request, from the moment it is handed to a connection (a new connection's
//! connect time included): TTFT (to the first SSE chunk with non-empty `delta.content` or
//! `text`), inter-token latency (mean gap between content chunks), end-to-end (to the end of
//! the body), the status, and output tokens (the usage chunk's `completion_tokens`, else the
//! number of content chunks). A non-streaming 2xx counts its whole body as the first token. A
//! pooled connection found closed before any response byte is replaced once by a fresh one
//! (servers close idle keep-alive connections on their own schedule); any other failure is the
//! request's: `io`, `protocol`, or `timeout` after `request_timeout`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, ErrorKind, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use indicatif::ProgressBar;
use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use serde::Deserialize;
use slab::Slab;

use crate::clock::{Clock, Tick};
use crate::protocol::{parse_response_head, ChunkedDecoder, ChunkedLimits, ResponseFraming, Side};

use super::report::Sample;
use super::workload::Workload;
use super::RunOptions;

/// Largest response head accepted.
const HEAD_BYTES_MAX: usize = 64 << 10;
/// Bytes read per `read` call.
const READ_CHUNK: usize = 64 << 10;
/// How often the loop wakes to check request timeouts when nothing else is due.
const TIMEOUT_CHECK: Duration = Duration::from_millis(100);

/// An OpenAI-compatible base URL, resolved.
#[derive(Debug, Clone)]
pub struct Target {
    /// The URL as given.
    pub url: String,
    /// The resolved address.
    pub addr: SocketAddr,
    /// `host[:port]` for the `Host` header.
    pub host: String,
    /// Path of the chat completions endpoint.
    pub path: String,
}

impl Target {
    /// Parses `http://host[:port][/prefix]`: requests go to `prefix/v1/chat/completions`, or
    /// `prefix/chat/completions` when the prefix already ends in `/v1`. Only plain HTTP.
    pub fn parse(url: &str) -> io::Result<Target> {
        let invalid = |why: &str| io::Error::new(ErrorKind::InvalidInput, format!("{url}: {why}"));
        let (host, prefix) =
            split_url(url).ok_or_else(|| invalid("expected http://HOST[:PORT][/PATH]"))?;
        let with_port = if host.contains(':') && !host.ends_with(']') {
            host.to_owned()
        } else {
            format!("{host}:80")
        };
        let addr = with_port
            .to_socket_addrs()
            .map_err(|e| invalid(&format!("cannot resolve: {e}")))?
            .next()
            .ok_or_else(|| invalid("resolves to no address"))?;
        let prefix = prefix.trim_end_matches('/');
        let path = if prefix.ends_with("/v1") {
            format!("{prefix}/chat/completions")
        } else {
            format!("{prefix}/v1/chat/completions")
        };
        Ok(Target { url: url.to_owned(), addr, host: host.to_owned(), path })
    }
}

/// `http://host[:port][/path]` into `(host[:port], /path or "")`.
pub(crate) fn split_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("http://")?;
    let (host, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    (!host.is_empty()).then_some((host, path))
}

#[derive(Deserialize)]
struct Chunk {
    #[serde(default)]
    choices: Vec<Choice>,
    #[serde(default)]
    usage: Option<Usage>,
}

#[derive(Deserialize)]
struct Choice {
    #[serde(default)]
    delta: Option<Delta>,
    #[serde(default)]
    text: Option<String>,
}

#[derive(Deserialize)]
struct Delta {
    #[serde(default)]
    content: Option<String>,
}

#[derive(Deserialize)]
struct Usage {
    #[serde(default)]
    completion_tokens: Option<u32>,
}

/// A request on a connection and what has been seen of its response.
#[derive(Debug)]
struct Exchange {
    /// Flat index of the turn.
    turn: usize,
    started: Tick,
    deadline: Tick,
    /// Already moved off a dead pooled connection once.
    retried: bool,
    /// The request bytes, kept for a retry.
    request: Vec<u8>,
    written: usize,
    /// Any response byte arrived.
    got_bytes: bool,
    status: u16,
    framing: Option<ResponseFraming>,
    keep_alive: bool,
    event_stream: bool,
    decoder: Option<ChunkedDecoder>,
    /// Body bytes still due under `Content-Length`.
    remaining: u64,
    /// Decoded body bytes not yet parsed (an incomplete SSE line, or a non-SSE body).
    body: Vec<u8>,
    first: Option<Tick>,
    last: Option<Tick>,
    chunks: u32,
    usage: Option<u32>,
}

/// One connection to the target.
#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    connected: bool,
    /// Has carried a request before: a close before any byte may be the server's idle timeout.
    reused: bool,
    /// Undecoded bytes received (a partial response head).
    inbuf: Vec<u8>,
    exchange: Option<Exchange>,
}

/// How an exchange ended.
enum End {
    Complete,
    Failed(&'static str),
    /// The pooled connection was dead before any response byte: send again on a new one.
    Retry,
}

/// The event loop and its state.
struct Driver<'a> {
    target: &'a Target,
    workload: &'a Workload,
    options: &'a RunOptions,
    clock: Clock,
    start: Tick,
    poll: Poll,
    conns: Slab<Conn>,
    idle: Vec<usize>,
    heap: BinaryHeap<Reverse<(Tick, usize)>>,
    /// Flat turn index → (session, turn).
    turns: Vec<(u32, u32)>,
    /// Flat turn index → flat indices of the turns waiting for it.
    children: Vec<Vec<usize>>,
    inflight: usize,
    samples: Vec<Sample>,
    scratch: Vec<u8>,
    progress: &'a ProgressBar,
}

/// Runs `workload` against `target`; returns the samples and the elapsed seconds.
pub(crate) fn drive(
    target: &Target,
    workload: &Workload,
    options: &RunOptions,
    progress: &ProgressBar,
) -> io::Result<(Vec<Sample>, f64)> {
    let clock = Clock::real();
    let mut turns = Vec::with_capacity(workload.requests());
    let mut first_flat = Vec::with_capacity(workload.sessions.len());
    for (s, session) in workload.sessions.iter().enumerate() {
        first_flat.push(turns.len());
        turns.extend((0..session.turns.len()).map(|t| (s as u32, t as u32)));
    }
    let mut children = vec![Vec::new(); turns.len()];
    let mut heap = BinaryHeap::new();
    let start = clock.now();
    for (s, session) in workload.sessions.iter().enumerate() {
        for (t, turn) in session.turns.iter().enumerate() {
            let flat = first_flat[s] + t;
            match turn.after {
                Some(a) => children[first_flat[s] + a as usize].push(flat),
                None => heap.push(Reverse((start + clock.rate().ticks(turn.at), flat))),
            }
        }
    }
    let mut driver = Driver {
        target,
        workload,
        options,
        start,
        poll: Poll::new()?,
        conns: Slab::new(),
        idle: Vec::new(),
        heap,
        turns,
        children,
        inflight: 0,
        samples: Vec::with_capacity(workload.requests()),
        scratch: vec![0; READ_CHUNK],
        progress,
        clock,
    };
    driver.run()?;
    let elapsed = driver.clock.rate().duration(driver.clock.now() - driver.start);
    Ok((driver.samples, elapsed.as_secs_f64()))
}

impl Exchange {
    /// Turn `turn`'s request, sent at `started`, failing at `deadline`; nothing received yet.
    fn new(turn: usize, request: Vec<u8>, started: Tick, deadline: Tick) -> Exchange {
        Exchange {
            turn,
            started,
            deadline,
            retried: false,
            request,
            written: 0,
            got_bytes: false,
            status: 0,
            framing: None,
            keep_alive: false,
            event_stream: false,
            decoder: None,
            remaining: 0,
            body: Vec::new(),
            first: None,
            last: None,
            chunks: 0,
            usage: None,
        }
    }
}

impl Driver<'_> {
    fn run(&mut self) -> io::Result<()> {
        let rate = self.clock.rate();
        let stop_at = self.options.stop_after.map(|d| self.start + rate.ticks(d));
        let mut events = Events::with_capacity(256);
        let mut next_timeout_check = self.start;
        loop {
            let now = self.clock.now();
            if stop_at.is_some_and(|t| now >= t) {
                self.heap.clear();
            }
            if self.heap.is_empty() && self.inflight == 0 {
                return Ok(());
            }
            self.dispatch_due(now);
            if now >= next_timeout_check {
                self.expire(now);
                next_timeout_check = now + rate.ticks(TIMEOUT_CHECK);
            }
            let mut wait = TIMEOUT_CHECK;
            if let Some(Reverse((due, _))) = self.heap.peek() {
                if self.inflight < self.options.max_inflight {
                    wait = wait.min(rate.duration(due.saturating_sub(self.clock.now())));
                }
            }
            if let Some(stop) = stop_at {
                wait = wait.min(rate.duration(stop.saturating_sub(self.clock.now())));
            }
            match self.poll.poll(&mut events, Some(wait)) {
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                other => other?,
            }
            for event in &events {
                self.on_event(event.token().0);
            }
        }
    }

    fn dispatch_due(&mut self, now: Tick) {
        while self.inflight < self.options.max_inflight {
            match self.heap.peek() {
                Some(Reverse((due, _))) if *due <= now => {}
                _ => return,
            }
            let Some(Reverse((_, flat))) = self.heap.pop() else { return };
            self.send(flat);
        }
    }

    /// Builds the request of turn `flat` and hands it to a connection.
    fn send(&mut self, flat: usize) {
        let (s, t) = self.turns[flat];
        let mut body = Vec::with_capacity(4096);
        let o = self.options;
        self.workload.write_body(s as usize, t as usize, &o.model, o.ignore_eos, &mut body);
        let session = match o.anonymous {
            true => String::new(),
            false => format!("{}: {}\r\n", o.session_header, self.workload.sessions[s as usize].id),
        };
        let mut request = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Accept: text/event-stream\r\nUser-Agent: warmpath-bench\r\n{session}\
             Content-Length: {}\r\n\r\n",
            self.target.path,
            self.target.host,
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(&body);
        let now = self.clock.now();
        let deadline = now + self.clock.rate().ticks(o.request_timeout);
        let exchange = Exchange::new(flat, request, now, deadline);
        self.inflight += 1;
        self.attach(exchange);
    }

    /// Puts `exchange` on an idle connection, or a new one.
    fn attach(&mut self, exchange: Exchange) {
        let key = match self.idle.pop() {
            Some(key) => key,
            None => match self.open() {
                Ok(key) => key,
                Err(_) => return self.finish(exchange, End::Failed("io")),
            },
        };
        self.conns[key].exchange = Some(exchange);
        self.on_event(key);
    }

    fn open(&mut self) -> io::Result<usize> {
        let mut stream = TcpStream::connect(self.target.addr)?;
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        self.poll.registry().register(
            &mut stream,
            Token(key),
            Interest::READABLE | Interest::WRITABLE,
        )?;
        entry.insert(Conn {
            stream,
            connected: false,
            reused: false,
            inbuf: Vec::new(),
            exchange: None,
        });
        Ok(key)
    }

    fn close(&mut self, key: usize) -> Option<Exchange> {
        let mut conn = self.conns.remove(key);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        self.idle.retain(|&k| k != key);
        conn.exchange
    }

    /// Readiness (or a new exchange) on connection `key`: connect, write, read.
    fn on_event(&mut self, key: usize) {
        if !self.conns.contains(key) {
            return;
        }
        if self.conns[key].exchange.is_none() {
            return self.check_idle(key);
        }
        let end = self.advance(key);
        let Some(end) = end else { return };
        let conn = &mut self.conns[key];
        let keep = matches!(end, End::Complete)
            && conn.exchange.as_ref().is_some_and(|e| e.keep_alive)
            && conn.inbuf.is_empty();
        let exchange = if keep {
            conn.reused = true;
            let exchange = conn.exchange.take();
            self.idle.push(key);
            exchange
        } else {
            self.close(key)
        };
        let exchange = exchange.expect("an exchange ended");
        match end {
            End::Retry => {
                let mut again = exchange;
                again.retried = true;
                again.written = 0;
                self.attach(again);
            }
            end => self.finish(exchange, end),
        }
    }

    /// An idle connection became readable: the server closed it (or misbehaved): drop it.
    fn check_idle(&mut self, key: usize) {
        match self.conns[key].stream.read(&mut self.scratch) {
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            _ => {
                self.close(key);
            }
        }
    }

    /// Moves the exchange on `key` forward; `Some` when it ended.
    fn advance(&mut self, key: usize) -> Option<End> {
        let conn = &mut self.conns[key];
        if !conn.connected {
            match conn.stream.take_error() {
                Ok(Some(_)) | Err(_) => return Some(End::Failed("io")),
                Ok(None) => match conn.stream.peer_addr() {
                    Ok(_) => {
                        conn.connected = true;
                        let _ = conn.stream.set_nodelay(true);
                    }
                    Err(e) if e.kind() == ErrorKind::NotConnected => return None,
                    Err(_) => return Some(End::Failed("io")),
                },
            }
        }
        let dead = |conn: &Conn| match conn.reused
            && !conn.exchange.as_ref().is_some_and(|e| e.got_bytes || e.retried)
        {
            true => End::Retry,
            false => End::Failed("io"),
        };
        let exchange = conn.exchange.as_mut().expect("an exchange");
        while exchange.written < exchange.request.len() {
            match conn.stream.write(&exchange.request[exchange.written..]) {
                Ok(0) => return Some(dead(conn)),
                Ok(n) => exchange.written += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Some(dead(conn)),
            }
        }
        loop {
            let read = match conn.stream.read(&mut self.scratch) {
                Ok(n) => n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return Some(dead(conn)),
            };
            let exchange = conn.exchange.as_mut().expect("an exchange");
            if read == 0 {
                return Some(match exchange.framing {
                    Some(ResponseFraming::UntilClose) => {
                        exchange.keep_alive = false;
                        End::Complete
                    }
                    _ => dead(conn),
                });
            }
            exchange.got_bytes = true;
            let now = self.clock.now();
            let input = &self.scratch[..read];
            if let Some(end) = receive(exchange, &mut conn.inbuf, input, now) {
                return Some(end);
            }
        }
    }

    /// Ends exchanges past their deadline.
    fn expire(&mut self, now: Tick) {
        let late: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.exchange.as_ref().is_some_and(|e| e.deadline <= now))
            .map(|(k, _)| k)
            .collect();
        for key in late {
            if let Some(exchange) = self.close(key) {
                self.finish(exchange, End::Failed("timeout"));
            }
        }
    }

    /// Records the sample of an ended exchange and releases its follow-ups.
    fn finish(&mut self, e: Exchange, end: End) {
        let now = self.clock.now();
        let rate = self.clock.rate();
        let ms = |ticks: Tick| rate.duration(ticks).as_secs_f64() * 1000.0;
        let failure = match end {
            End::Complete => None,
            End::Failed(kind) => Some(kind),
            End::Retry => Some("io"),
        };
        let ok = failure.is_none() && (200..300).contains(&e.status);
        let first = e.first.or(ok.then_some(now));
        let itl = match (e.first, e.last) {
            (Some(a), Some(b)) if e.chunks > 1 => Some(ms(b - a) / f64::from(e.chunks - 1)),
            _ => None,
        };
        let (s, t) = self.turns[e.turn];
        let follow_up = self.workload.sessions[s as usize].turns[t as usize].after.is_some();
        self.samples.push(Sample {
            session: s,
            turn: t,
            follow_up,
            status: e.status,
            failure,
            sent_ms: ms(e.started - self.start),
            ttft_ms: first.map(|f| ms(f - e.started)),
            itl_ms: itl,
            e2e_ms: ms(now - e.started),
            output_tokens: e.usage.unwrap_or(e.chunks),
        });
        self.inflight -= 1;
        self.progress.inc(1);
        let children = std::mem::take(&mut self.children[e.turn]);
        for child in children {
            let (cs, ct) = self.turns[child];
            let turn = &self.workload.sessions[cs as usize].turns[ct as usize];
            let due = (self.start + rate.ticks(turn.at)).max(now + rate.ticks(turn.think));
            self.heap.push(Reverse((due, child)));
        }
    }
}

/// Feeds response bytes `input`, read at `now`; `Some` when the exchange ended.
fn receive(e: &mut Exchange, inbuf: &mut Vec<u8>, input: &[u8], now: Tick) -> Option<End> {
    let mut rest: &[u8] = input;
    let held: Vec<u8>;
    if e.framing.is_none() {
        inbuf.extend_from_slice(input);
        loop {
            let head = match parse_response_head(inbuf, HEAD_BYTES_MAX, false) {
                Ok(Some(head)) => head,
                Ok(None) => return None,
                Err(_) => return Some(End::Failed("protocol")),
            };
            if head.is_interim() {
                inbuf.drain(..head.head_len);
                continue;
            }
            e.status = head.status;
            e.framing = Some(head.framing);
            e.keep_alive = head.keep_alive;
            e.event_stream = head.is_event_stream;
            match head.framing {
                ResponseFraming::Chunked => {
                    let limits = ChunkedLimits {
                        max_body_bytes: u64::MAX,
                        max_line_bytes: 4096,
                        max_trailer_bytes: 16 << 10,
                    };
                    e.decoder = Some(ChunkedDecoder::new(limits, Side::Upstream));
                }
                ResponseFraming::ContentLength(n) => e.remaining = n,
                ResponseFraming::None | ResponseFraming::UntilClose => {}
            }
            held = inbuf.split_off(head.head_len);
            inbuf.clear();
            rest = &held;
            break;
        }
    }
    let done = match e.framing {
        Some(ResponseFraming::None) => true,
        Some(ResponseFraming::ContentLength(_)) => {
            let take = rest.len().min(usize::try_from(e.remaining).unwrap_or(usize::MAX));
            e.body.extend_from_slice(&rest[..take]);
            e.remaining -= take as u64;
            e.remaining == 0
        }
        Some(ResponseFraming::Chunked) => {
            let decoder = e.decoder.as_mut().expect("a chunked body has a decoder");
            match decoder.feed(rest, &mut e.body) {
                Ok(progress) => progress.done,
                Err(_) => return Some(End::Failed("protocol")),
            }
        }
        Some(ResponseFraming::UntilClose) => {
            e.body.extend_from_slice(rest);
            false
        }
        None => unreachable!("the head was parsed"),
    };
    if e.event_stream {
        parse_events(e, now);
    }
    if done {
        if !e.event_stream {
            e.usage = serde_json::from_slice::<Chunk>(&e.body)
                .ok()
                .and_then(|c| c.usage?.completion_tokens);
        }
        return Some(End::Complete);
    }
    None
}

/// Parses the complete SSE lines in `e.body`, keeping an incomplete last line.
fn parse_events(e: &mut Exchange, now: Tick) {
    let mut consumed = 0;
    while let Some(nl) = memchr::memchr(b'\n', &e.body[consumed..]) {
        let line = &e.body[consumed..consumed + nl];
        consumed += nl + 1;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let Some(data) = line.strip_prefix(b"data:") else { continue };
        let data = data.strip_prefix(b" ").unwrap_or(data);
        if data == b"[DONE]" {
            continue;
        }
        let Ok(chunk) = serde_json::from_slice::<Chunk>(data) else { continue };
        let content = chunk.choices.iter().any(|c| {
            c.delta.as_ref().and_then(|d| d.content.as_deref()).is_some_and(|s| !s.is_empty())
                || c.text.as_deref().is_some_and(|s| !s.is_empty())
        });
        if content {
            e.first.get_or_insert(now);
            e.last = Some(now);
            e.chunks += 1;
        }
        if let Some(tokens) = chunk.usage.and_then(|u| u.completion_tokens) {
            e.usage = Some(tokens);
        }
    }
    e.body.drain(..consumed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(split_url("http://127.0.0.1:8080"), Some(("127.0.0.1:8080", "")));
        assert_eq!(split_url("http://h:1/v1/"), Some(("h:1", "/v1/")));
        assert_eq!(split_url("https://h"), None);
        let t = Target::parse("http://127.0.0.1:9/v1").expect("parses");
        assert_eq!(t.path, "/v1/chat/completions");
        let t = Target::parse("http://127.0.0.1:9").expect("parses");
        assert_eq!((t.path.as_str(), t.addr.port()), ("/v1/chat/completions", 9));
        let t = Target::parse("http://localhost/api").expect("parses");
        assert_eq!((t.path.as_str(), t.addr.port()), ("/api/v1/chat/completions", 80));
    }

    fn exchange() -> Exchange {
        Exchange::new(0, Vec::new(), 0, u64::MAX)
    }

    #[test]
    fn chunked_sse_split_anywhere() {
        let events = "data: {\"choices\":[{\"delta\":{\"role\":\"assistant\"}}]}\n\n\
                      data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\n\
                      data: {\"choices\":[{\"delta\":{\"content\":\" b\"}}],\"usage\":null}\r\n\r\n\
                      data: {\"choices\":[],\"usage\":{\"completion_tokens\":7}}\n\ndata: [DONE]\n\n";
        let body = format!("{:x}\r\n{events}\r\n0\r\n\r\n", events.len());
        let response = format!(
            "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n{body}"
        );
        for split in [1, 7, 50, response.len()] {
            let (mut e, mut inbuf, mut end) = (exchange(), Vec::new(), None);
            for (i, piece) in response.as_bytes().chunks(split).enumerate() {
                assert!(end.is_none(), "ended early");
                end = receive(&mut e, &mut inbuf, piece, 10 + i as u64);
            }
            assert!(matches!(end, Some(End::Complete)), "split {split}");
            assert_eq!((e.status, e.chunks, e.usage, e.keep_alive), (200, 2, Some(7), true));
            assert!(e.first.is_some() && e.first <= e.last);
        }
    }

    #[test]
    fn error_status_with_length() {
        let (mut e, mut inbuf) = (exchange(), Vec::new());
        let r = b"HTTP/1.1 429 Too Many Requests\r\nContent-Length: 2\r\n\r\n{}";
        assert!(matches!(receive(&mut e, &mut inbuf, r, 1), Some(End::Complete)));
        assert_eq!((e.status, e.chunks), (429, 0));
        let (mut e, mut inbuf) = (exchange(), Vec::new());
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 3x\r\n\r\n";
        assert!(matches!(receive(&mut e, &mut inbuf, r, 1), Some(End::Failed("protocol"))));
    }
}
