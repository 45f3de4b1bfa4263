//! Keep-alive HTTP/1.1 connections to one target in one mio event loop (edge-triggered), shared
//! by the bench's two drivers: the workload driver ([`super::client`]) and the paced one
//! ([`super::fixed_rate`]). A driver hands an [`Exchange`] (a request's bytes) to
//! [`Pool::attach`], which puts it on an idle connection or a new one; readiness events go to
//! [`Pool::on_event`]; either returns the exchange once it ended, with how ([`End`]).
//!
//! Response heads are parsed by [`parse_response_head`] and chunked bodies decoded by
//! [`ChunkedDecoder`] (the dataplane's own sans-IO code), SSE parsed line by line. A pooled
//! connection found closed before any response byte is replaced once by a fresh one (servers
//! close idle keep-alive connections on their own schedule); any other failure is the
//! request's: `io`, `protocol`, or `timeout` (the driver's deadline, [`Pool::expire`]).
//!
//! Times an exchange records: when its first request byte was handed to the socket (`sent_at`,
//! read just before that `write`), and, read right after the `read` that saw each, its first
//! response byte (`first_byte`), its first and last SSE content chunks (`first`, `last`), and
//! the end of its response (`ended`).

use std::io::{self, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Token};
use serde::Deserialize;
use slab::Slab;

use crate::clock::{Clock, Tick};
use crate::protocol::{parse_response_head, ChunkedDecoder, ChunkedLimits, ResponseFraming, Side};

/// Largest response head accepted.
const HEAD_BYTES_MAX: usize = 64 << 10;
/// Bytes read per `read` call.
const READ_CHUNK: usize = 64 << 10;

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
pub(super) struct Exchange {
    /// The driver's index of the request.
    pub id: usize,
    /// The driver's reference time: when it handed the request over (the workload driver), or
    /// the request's intended send time (the paced one).
    pub started: Tick,
    /// It fails as `timeout` when still running at this tick.
    pub deadline: Tick,
    /// Already moved off a dead pooled connection once.
    retried: bool,
    /// The request bytes, kept for a retry (shared: a paced run sends one request many times).
    request: Rc<[u8]>,
    written: usize,
    /// Just before the first `write` of the request on a connected socket.
    pub sent_at: Option<Tick>,
    /// Any response byte arrived.
    got_bytes: bool,
    /// When the first response byte was read.
    pub first_byte: Option<Tick>,
    /// When the response ended (the read that completed it).
    pub ended: Option<Tick>,
    /// Parse a non-SSE body as JSON for its `usage` (the workload driver's output tokens).
    pub count_usage: bool,
    /// The response status; 0 before its head.
    pub status: u16,
    framing: Option<ResponseFraming>,
    keep_alive: bool,
    /// The response is `text/event-stream`.
    pub event_stream: bool,
    decoder: Option<ChunkedDecoder>,
    /// Body bytes still due under `Content-Length`.
    remaining: u64,
    /// Decoded body bytes not yet parsed (an incomplete SSE line, or a non-SSE body).
    body: Vec<u8>,
    /// The first SSE chunk with content.
    pub first: Option<Tick>,
    /// The last SSE chunk with content.
    pub last: Option<Tick>,
    /// SSE chunks with content.
    pub chunks: u32,
    /// `usage.completion_tokens` of the response, when it had one.
    pub usage: Option<u32>,
}

impl Exchange {
    /// Request `id` (`request`'s bytes), handed over at `started`, failing at `deadline`;
    /// nothing received yet.
    pub fn new(id: usize, request: Rc<[u8]>, started: Tick, deadline: Tick) -> Exchange {
        Exchange {
            id,
            started,
            deadline,
            retried: false,
            request,
            written: 0,
            sent_at: None,
            got_bytes: false,
            first_byte: None,
            ended: None,
            count_usage: true,
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum End {
    /// The whole response arrived.
    Complete,
    /// `io`, `protocol` or `timeout`.
    Failed(&'static str),
    /// The pooled connection was dead before any response byte: send again on a new one.
    Retry,
}

/// The connections and their event loop.
#[derive(Debug)]
pub(super) struct Pool {
    addr: SocketAddr,
    clock: Clock,
    poll: Poll,
    conns: Slab<Conn>,
    /// Connections without an exchange; the most recently freed last (reused first).
    idle: Vec<usize>,
    /// Connections opened so far.
    opened: u64,
    scratch: Vec<u8>,
}

impl Pool {
    /// No connection yet to `addr`; times from `clock`.
    pub fn new(addr: SocketAddr, clock: Clock) -> io::Result<Pool> {
        Ok(Pool {
            addr,
            clock,
            poll: Poll::new()?,
            conns: Slab::new(),
            idle: Vec::new(),
            opened: 0,
            scratch: vec![0; READ_CHUNK],
        })
    }

    /// Waits for readiness events (at most `timeout`); an interrupted wait returns no events.
    pub fn poll(&mut self, events: &mut Events, timeout: Option<Duration>) -> io::Result<()> {
        match self.poll.poll(events, timeout) {
            Err(e) if e.kind() == ErrorKind::Interrupted => {
                events.clear();
                Ok(())
            }
            other => other,
        }
    }

    /// Connections open.
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Connections open and without an exchange.
    pub fn idle(&self) -> usize {
        self.idle.len()
    }

    /// Connections opened since the start, closed ones included.
    pub fn opened(&self) -> u64 {
        self.opened
    }

    /// Opens `n` idle connections and waits until they are connected, at most `limit`;
    /// returns how many are connected (a refused or failed one is closed).
    pub fn warm(&mut self, n: usize, limit: Duration) -> io::Result<usize> {
        for _ in 0..n {
            let key = self.open()?;
            self.idle.push(key);
        }
        let rate = self.clock.rate();
        let give_up = self.clock.now() + rate.ticks(limit);
        let mut events = Events::with_capacity(256);
        loop {
            let connected = self.conns.iter().filter(|(_, c)| c.connected).count();
            let now = self.clock.now();
            if connected == self.conns.len() || now >= give_up {
                return Ok(connected);
            }
            self.poll(&mut events, Some(rate.duration(give_up - now)))?;
            for event in &events {
                self.on_event(event.token().0);
            }
        }
    }

    /// Puts `exchange` on an idle connection, or a new one; `Some` when it ended at once.
    pub fn attach(&mut self, exchange: Exchange) -> Option<(Exchange, End)> {
        let key = match self.idle.pop() {
            Some(key) => key,
            None => match self.open() {
                Ok(key) => key,
                Err(_) => return Some((exchange, End::Failed("io"))),
            },
        };
        self.conns[key].exchange = Some(exchange);
        self.on_event(key)
    }

    fn open(&mut self) -> io::Result<usize> {
        let mut stream = TcpStream::connect(self.addr)?;
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
        self.opened += 1;
        Ok(key)
    }

    fn close(&mut self, key: usize) -> Option<Exchange> {
        let mut conn = self.conns.remove(key);
        let _ = self.poll.registry().deregister(&mut conn.stream);
        self.idle.retain(|&k| k != key);
        conn.exchange
    }

    /// Readiness (or a new exchange) on connection `key`: connect, write, read; `Some` when
    /// its exchange ended.
    pub fn on_event(&mut self, key: usize) -> Option<(Exchange, End)> {
        if !self.conns.contains(key) {
            return None;
        }
        if self.conns[key].exchange.is_none() {
            self.check_idle(key);
            return None;
        }
        let end = self.advance(key)?;
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
                self.attach(again)
            }
            end => Some((exchange, end)),
        }
    }

    /// Readiness on an idle connection: its connect finishing, or the server closing it (or
    /// misbehaving): then it is dropped.
    fn check_idle(&mut self, key: usize) {
        let conn = &mut self.conns[key];
        if !conn.connected {
            if let Some(Err(_)) = connect_done(conn) {
                self.close(key);
            }
            return;
        }
        match conn.stream.read(&mut self.scratch) {
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
            match connect_done(conn)? {
                Ok(()) => {}
                Err(()) => return Some(End::Failed("io")),
            }
        }
        let dead = |conn: &Conn| match conn.reused
            && !conn.exchange.as_ref().is_some_and(|e| e.got_bytes || e.retried)
        {
            true => End::Retry,
            false => End::Failed("io"),
        };
        let exchange = conn.exchange.as_mut().expect("an exchange");
        if exchange.written == 0 && exchange.sent_at.is_none() {
            exchange.sent_at = Some(self.clock.now());
        }
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
            let now = self.clock.now();
            let exchange = conn.exchange.as_mut().expect("an exchange");
            if read == 0 {
                return Some(match exchange.framing {
                    Some(ResponseFraming::UntilClose) => {
                        exchange.keep_alive = false;
                        exchange.ended = Some(now);
                        End::Complete
                    }
                    _ => dead(conn),
                });
            }
            if !exchange.got_bytes {
                exchange.got_bytes = true;
                exchange.first_byte = Some(now);
            }
            let input = &self.scratch[..read];
            if let Some(end) = receive(exchange, &mut conn.inbuf, input, now) {
                exchange.ended = Some(now);
                return Some(end);
            }
        }
    }

    /// Ends the exchanges whose deadline is at or before `now` (their connections closed).
    pub fn expire(&mut self, now: Tick) -> Vec<Exchange> {
        let late: Vec<usize> = self
            .conns
            .iter()
            .filter(|(_, c)| c.exchange.as_ref().is_some_and(|e| e.deadline <= now))
            .map(|(k, _)| k)
            .collect();
        late.into_iter().filter_map(|key| self.close(key)).collect()
    }
}

/// Whether a connect in progress on `conn` has finished: `None` while it has not, `Some(Ok)`
/// once connected (`TCP_NODELAY` set), `Some(Err)` when it failed.
fn connect_done(conn: &mut Conn) -> Option<Result<(), ()>> {
    match conn.stream.take_error() {
        Ok(Some(_)) | Err(_) => Some(Err(())),
        Ok(None) => match conn.stream.peer_addr() {
            Ok(_) => {
                conn.connected = true;
                let _ = conn.stream.set_nodelay(true);
                Some(Ok(()))
            }
            Err(e) if e.kind() == ErrorKind::NotConnected => None,
            Err(_) => Some(Err(())),
        },
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
        if !e.event_stream && e.count_usage {
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

    fn exchange() -> Exchange {
        Exchange::new(0, Rc::from(Vec::new()), 0, u64::MAX)
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

    #[test]
    fn usage_of_a_plain_body_only_when_asked() {
        let r = b"HTTP/1.1 200 OK\r\nContent-Length: 39\r\n\r\n{\"usage\":{\"completion_tokens\":9},\"x\":1}";
        for (count, want) in [(true, Some(9)), (false, None)] {
            let (mut e, mut inbuf) = (exchange(), Vec::new());
            e.count_usage = count;
            assert_eq!(receive(&mut e, &mut inbuf, r, 1), Some(End::Complete));
            assert_eq!(e.usage, want);
        }
    }
}
