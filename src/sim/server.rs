//! The simulated engine's HTTP/1.1 server: one thread, one mio event loop (edge-triggered), the
//! [`Engine`] stepped on the loop's timer.
//!
//! **Time.** The engine runs on simulated nanoseconds: `virtual = real elapsed × time_scale`.
//! A step that starts at virtual `t` with duration `d` ends at `t + d`, and the loop sleeps
//! (`epoll_wait`, no spinning) until the real instant that maps to it. A busy engine's next step
//! starts exactly when the previous one ends, in virtual time, whenever the loop actually woke:
//! steps shorter than the loop's timer resolution (1 ms in mio) are run in a burst on the next
//! wake-up, so throughput and the latencies the engine reports follow the step-time model
//! exactly at any time scale; only the delivery of tokens to sockets may lag by up to the timer
//! resolution. Each loop iteration first finishes the steps due by now, then reads sockets (new
//! requests arrive at the current virtual time and join the next step), then starts a step if
//! the engine was idle. An idle engine sets no timer: no wake-ups.
//!
//! **HTTP.** Heads are parsed by [`parse_request_head`] (the router's own checks), bodies by
//! `Content-Length` or [`ChunkedDecoder`], JSON by serde_json ([`super::api`]). Keep-alive and
//! pipelining: requests on one connection are answered in order, one at a time. A streamed
//! answer is SSE in chunked transfer coding, one chunk per token, written as the step that
//! generated it ends. A client that closes its connection aborts its request in the engine.

use std::collections::VecDeque;
use std::io::{self, ErrorKind, Read, Write};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use hashbrown::HashMap;
use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token, Waker};
use slab::Slab;

use crate::clock::{Clock, Tick};
use crate::protocol::{
    parse_request_head, write_error, write_protocol_error, ChunkedDecoder, Framing, Limits, Side,
};

use super::api::{self, Endpoint, Responder};
use super::engine::{Engine, Event, RequestId, SubmitError, Usage};
use super::SimOptions;

const LISTENER: Token = Token(usize::MAX - 1);
const WAKER: Token = Token(usize::MAX - 2);
/// Bytes read per call.
const READ_CHUNK: usize = 16 << 10;

/// A running simulated engine (see [`super::start`]).
#[derive(Debug)]
pub struct RunningSim {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    waker: Arc<Waker>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RunningSim {
    /// The address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the loop (open connections are closed, requests dropped) and joins its thread.
    pub fn stop(mut self) {
        self.halt();
    }

    fn halt(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.waker.wake();
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for RunningSim {
    fn drop(&mut self) {
        self.halt();
    }
}

/// Binds `options.listen` and starts the loop on its own thread.
pub fn start(options: SimOptions) -> io::Result<RunningSim> {
    let std_listener = std::net::TcpListener::bind(options.listen)?;
    std_listener.set_nonblocking(true)?;
    let addr = std_listener.local_addr()?;
    let mut listener = TcpListener::from_std(std_listener);
    let poll = Poll::new()?;
    poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
    let waker = Arc::new(Waker::new(poll.registry(), WAKER)?);
    let stop = Arc::new(AtomicBool::new(false));
    let mut server = Server::new(options, poll, listener, Arc::clone(&stop));
    let thread = std::thread::Builder::new().name("sim".into()).spawn(move || {
        if let Err(e) = server.run() {
            eprintln!("warmpath sim: event loop stopped: {e}");
        }
    })?;
    Ok(RunningSim { addr, stop, waker, thread: Some(thread) })
}

/// The request a connection is being answered for.
#[derive(Debug)]
struct Active {
    id: RequestId,
    stream: bool,
    include_usage: bool,
    responder: Responder,
    /// Generated words of a non-streamed answer.
    words: Vec<u16>,
}

#[derive(Debug)]
struct Conn {
    stream: TcpStream,
    rbuf: Vec<u8>,
    wbuf: Vec<u8>,
    wpos: usize,
    active: Option<Active>,
    keep_alive: bool,
    /// `100 Continue` sent for the request being read.
    continued: bool,
    /// Close once `wbuf` is flushed.
    closing: bool,
}

struct Server {
    poll: Poll,
    listener: TcpListener,
    conns: Slab<Conn>,
    engine: Engine,
    model: String,
    clock: Clock,
    start: Tick,
    time_scale: f64,
    /// Virtual end of the step in progress.
    step_end: Option<u64>,
    events: Vec<Event>,
    next_id: RequestId,
    /// Live engine requests and their connection.
    owners: HashMap<RequestId, usize>,
    /// Connections with bytes to flush or requests to parse.
    dirty: VecDeque<usize>,
    limits: Limits,
    stop: Arc<AtomicBool>,
}

impl Server {
    fn new(options: SimOptions, poll: Poll, listener: TcpListener, stop: Arc<AtomicBool>) -> Self {
        let clock = Clock::real();
        let start = clock.now();
        let mut engine = Engine::new(options.params, options.seed);
        engine.set_time_scale(options.time_scale);
        Server {
            poll,
            listener,
            conns: Slab::with_capacity(256),
            engine,
            model: options.model,
            clock,
            start,
            time_scale: options.time_scale,
            step_end: None,
            events: Vec::new(),
            next_id: 1,
            owners: HashMap::new(),
            dirty: VecDeque::new(),
            limits: Limits::default(),
            stop,
        }
    }

    fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(256);
        while !self.stop.load(Ordering::Acquire) {
            let timeout = self.step_end.map(|end| self.real_until(end));
            if let Err(e) = self.poll.poll(&mut events, timeout) {
                if e.kind() != ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            let now = self.virtual_now();
            self.finish_due_steps(now);
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept()?,
                    WAKER => {}
                    Token(key) => {
                        if event.is_readable() || event.is_read_closed() {
                            self.read(key, now);
                        }
                        self.dirty.push_back(key);
                    }
                }
            }
            if self.step_end.is_none() {
                self.start_step(now);
            }
            while let Some(key) = self.dirty.pop_front() {
                self.flush(key);
            }
        }
        Ok(())
    }

    /// Simulated nanoseconds since start.
    fn virtual_now(&self) -> u64 {
        let real = self.clock.rate().duration(self.clock.now().saturating_sub(self.start));
        (real.as_nanos() as f64 * self.time_scale) as u64
    }

    /// Real time until virtual instant `at`.
    fn real_until(&self, at: u64) -> Duration {
        let ahead = at.saturating_sub(self.virtual_now());
        Duration::from_nanos((ahead as f64 / self.time_scale).ceil() as u64)
    }

    fn start_step(&mut self, at: u64) {
        self.step_end = self.engine.start_step(at).map(|plan| at + plan.duration_ns);
    }

    /// Finishes every step that ends by `now`, back to back, delivering their events.
    fn finish_due_steps(&mut self, now: u64) {
        while let Some(end) = self.step_end.filter(|&end| end <= now) {
            let mut events = std::mem::take(&mut self.events);
            self.engine.finish_step(end, &mut events);
            for event in events.drain(..) {
                self.deliver(event);
            }
            self.events = events;
            self.start_step(end);
        }
    }

    fn deliver(&mut self, event: Event) {
        let id = match event {
            Event::Token { id, .. } | Event::Finished { id, .. } => id,
        };
        let Some(&key) = self.owners.get(&id) else { return };
        let conn = &mut self.conns[key];
        let active = conn.active.as_mut().expect("an owned request is active");
        match event {
            Event::Token { index, word, last, .. } => match active.stream {
                true => {
                    let mut event = Vec::with_capacity(256);
                    active.responder.token_event(index, word, last, &mut event);
                    write_chunk(&mut conn.wbuf, &event);
                }
                false => active.words.push(word),
            },
            Event::Finished { usage, .. } => {
                self.owners.remove(&id);
                let active = conn.active.take().expect("checked");
                finish_response(conn, &active, usage);
            }
        }
        self.dirty.push_back(key);
    }

    fn accept(&mut self) -> io::Result<()> {
        loop {
            match self.listener.accept() {
                Ok((mut stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let entry = self.conns.vacant_entry();
                    let interest = Interest::READABLE | Interest::WRITABLE;
                    self.poll.registry().register(&mut stream, Token(entry.key()), interest)?;
                    entry.insert(Conn {
                        stream,
                        rbuf: Vec::new(),
                        wbuf: Vec::new(),
                        wpos: 0,
                        active: None,
                        keep_alive: true,
                        continued: false,
                        closing: false,
                    });
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(e) => {
                    eprintln!("warmpath sim: accept: {e}");
                    return Ok(());
                }
            }
        }
    }

    /// Reads what the socket holds, then answers complete requests.
    fn read(&mut self, key: usize, now: u64) {
        let Some(conn) = self.conns.get_mut(key) else { return };
        let mut chunk = [0u8; READ_CHUNK];
        let mut gone = false;
        loop {
            match conn.stream.read(&mut chunk) {
                Ok(0) => {
                    gone = true;
                    break;
                }
                Ok(n) => conn.rbuf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    gone = true;
                    break;
                }
            }
        }
        if gone {
            self.close(key);
            return;
        }
        self.serve_buffered(key, now);
    }

    /// Answers the requests buffered on `key`, in order, while none is in the engine.
    fn serve_buffered(&mut self, key: usize, now: u64) {
        while let Some(conn) = self.conns.get_mut(key) {
            if conn.active.is_some() || conn.closing || conn.rbuf.is_empty() {
                return;
            }
            let Some(taken) = take_request(conn, &self.limits) else { return };
            conn.rbuf.drain(..taken.used);
            conn.continued = false;
            self.route(key, &taken.method, &taken.path, &taken.body, now);
        }
    }

    fn route(&mut self, key: usize, method: &[u8], path: &[u8], body: &[u8], now: u64) {
        match (method, path) {
            (b"POST", b"/v1/chat/completions") => {
                return self.inference(key, Endpoint::Chat, body, now)
            }
            (b"POST", b"/v1/completions") => {
                return self.inference(key, Endpoint::Completions, body, now)
            }
            _ => {}
        }
        let conn = &mut self.conns[key];
        match (method, path) {
            (b"GET", b"/health") => write_response(conn, "text/plain", ""),
            (b"GET", b"/v1/models") => {
                let body = serde_json::json!({"object": "list", "data": [{
                    "id": self.model, "object": "model", "created": 0, "owned_by": "warmpath-sim",
                    "root": self.model, "max_model_len": self.engine.params().max_model_len,
                }]});
                write_response(conn, "application/json", &body.to_string());
            }
            (b"GET", b"/metrics") => {
                let mut text = String::with_capacity(4096);
                super::metrics::render(&self.engine, &self.model, now, &mut text);
                write_response(conn, "text/plain; version=0.0.4; charset=utf-8", &text);
            }
            _ => write_error(404, "not_found", "no such route", &mut conn.wbuf, &[]),
        }
    }

    fn inference(&mut self, key: usize, endpoint: Endpoint, body: &[u8], now: u64) {
        let conn = &mut self.conns[key];
        let parsed = match api::parse(endpoint, body) {
            Ok(parsed) => parsed,
            Err(message) => {
                return write_error(400, "invalid_request", &message, &mut conn.wbuf, &[])
            }
        };
        if parsed.model != self.model {
            let message = format!("The model `{}` does not exist.", parsed.model);
            return write_error(404, "model_not_found", &message, &mut conn.wbuf, &[]);
        }
        let id = self.next_id;
        self.next_id += 1;
        if let Err(e) = self.engine.submit(id, parsed.prompt, parsed.max_tokens, now) {
            let message = match e {
                SubmitError::TooLong { tokens, limit } => format!(
                    "This model's maximum context length is {limit} tokens; the request needs {tokens}."
                ),
                other => format!("request refused: {other:?}"),
            };
            return write_error(400, "invalid_request", &message, &mut conn.wbuf, &[]);
        }
        if parsed.stream {
            let close = if conn.keep_alive { "" } else { "Connection: close\r\n" };
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream; charset=utf-8\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n{close}\r\n"
            );
            conn.wbuf.extend_from_slice(head.as_bytes());
        }
        let created = now / 1_000_000_000;
        conn.active = Some(Active {
            id,
            stream: parsed.stream,
            include_usage: parsed.include_usage,
            responder: Responder::new(endpoint, id, &self.model, created),
            words: Vec::new(),
        });
        self.owners.insert(id, key);
    }

    /// Writes what `key` has buffered; closes it when done and closing, or when it failed.
    fn flush(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else { return };
        while conn.wpos < conn.wbuf.len() {
            match conn.stream.write(&conn.wbuf[conn.wpos..]) {
                Ok(0) => return self.close(key),
                Ok(n) => conn.wpos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return self.close(key),
            }
        }
        conn.wbuf.clear();
        conn.wpos = 0;
        if conn.closing {
            return self.close(key);
        }
        if conn.active.is_none() && !conn.rbuf.is_empty() {
            let now = self.virtual_now();
            self.serve_buffered(key, now);
            if self.conns.get(key).is_some_and(|c| !c.wbuf.is_empty()) {
                self.dirty.push_back(key);
            }
        }
    }

    fn close(&mut self, key: usize) {
        let Some(conn) = self.conns.try_remove(key) else { return };
        if let Some(active) = conn.active {
            self.owners.remove(&active.id);
            self.engine.abort(active.id);
        }
    }
}

/// A complete request taken from a connection's buffer.
#[derive(Debug)]
struct Taken {
    method: Vec<u8>,
    path: Vec<u8>,
    body: Vec<u8>,
    /// Bytes of the buffer it used.
    used: usize,
}

/// Parses the request at the start of `conn.rbuf`, once it is complete. A malformed one gets its error written and the connection marked closing; an
/// `Expect: 100-continue` gets its interim response.
fn take_request(conn: &mut Conn, limits: &Limits) -> Option<Taken> {
    let fail = |conn: &mut Conn, e| {
        write_protocol_error(e, &mut conn.wbuf);
        conn.closing = true;
        None
    };
    let head = match parse_request_head(&conn.rbuf, limits) {
        Ok(Some(head)) => head,
        Ok(None) => return None,
        Err(e) => return fail(conn, e),
    };
    let rest = &conn.rbuf[head.head_len..];
    let (body, used) = match head.framing {
        Framing::None => (Vec::new(), 0),
        Framing::ContentLength(n) if (rest.len() as u64) < n => (Vec::new(), usize::MAX),
        Framing::ContentLength(n) => (rest[..n as usize].to_vec(), n as usize),
        Framing::Chunked => {
            let mut decoder = ChunkedDecoder::new(limits.chunked(), Side::Downstream);
            let mut body = Vec::new();
            match decoder.feed(rest, &mut body) {
                Ok(p) if p.done => (body, p.consumed),
                Ok(_) => (Vec::new(), usize::MAX),
                Err(e) => return fail(conn, e),
            }
        }
    };
    if used == usize::MAX {
        if head.expect_continue && !conn.continued {
            conn.continued = true;
            conn.wbuf.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
        }
        return None;
    }
    conn.keep_alive = head.keep_alive;
    if !head.keep_alive {
        conn.closing = true;
    }
    let method = head.method(&conn.rbuf).to_vec();
    let path = head.path(&conn.rbuf).to_vec();
    Some(Taken { method, path, body, used: head.head_len + used })
}

/// Appends a complete 200 response.
fn write_response(conn: &mut Conn, content_type: &str, body: &str) {
    let close = if conn.keep_alive { "" } else { "Connection: close\r\n" };
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{close}\r\n",
        body.len()
    );
    conn.wbuf.extend_from_slice(head.as_bytes());
    conn.wbuf.extend_from_slice(body.as_bytes());
}

/// Ends the response of a finished request: the last SSE events, or the whole JSON body.
fn finish_response(conn: &mut Conn, active: &Active, usage: Usage) {
    if active.stream {
        let mut tail = Vec::with_capacity(512);
        if active.include_usage {
            active.responder.usage_event(usage, &mut tail);
        }
        tail.extend_from_slice(b"data: [DONE]\n\n");
        write_chunk(&mut conn.wbuf, &tail);
        conn.wbuf.extend_from_slice(b"0\r\n\r\n");
    } else {
        let body = active.responder.full_body(&active.words, usage);
        write_response(conn, "application/json", &body);
    }
}

/// Appends `data` as one chunk of the chunked transfer coding.
fn write_chunk(out: &mut Vec<u8>, data: &[u8]) {
    crate::protocol::ChunkedEncoder::chunk(data, out);
}
