//! A shard: one mio event loop (edge-triggered) owning its client connections, the upstream
//! connections it opens, its keep-alive pools and a timer wheel for their timeouts.
//!
//! A client connection goes through [`Phase`]s: `Head` (reading the request head), `Body`,
//! `Queued` (the request waits in its model's scheduler), `Upstream` (forwarded; the response is
//! relayed as it arrives), `Done` (the response is complete in the write buffer; once flushed,
//! the request ends and the next pipelined one, if any, is parsed). Router answers (errors,
//! `/v1/models`, health) go straight to `Done`.
//!
//! Every request ends exactly one way (S14): a relayed response, a router error, or its client
//! gone. An admitted request tells its scheduler how it ended exactly once: `Complete` (with
//! `success` for a fully flushed 2xx), or `Cancel` when the client left while it was queued
//! (which also covers an admission still in the ring). Inputs that do not fit a full inbox wait
//! in a backlog, in order, and are retried every loop iteration: nothing is lost.
//!
//! Retries (SPEC 2.8): a connect error, a reset or close before any response byte, on a fresh
//! connection, goes back to the scheduler (`Input::Retry`), which re-admits elsewhere or answers
//! `RetriesExhausted` (502). A *pooled* connection found dead the same way says nothing about
//! the backend (engines close idle keep-alive connections on their own schedule, uvicorn after
//! 5 s), so the shard first replaces it with a fresh connection to the same backend, once,
//! without involving the scheduler or counting towards passive ejection.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use mio::net::{TcpListener, TcpStream};
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use crate::clock::{Clock, Tick, TickRate};
use crate::protocol::{
    find_model, parse_request_head, parse_response_head, write_client_response_head, write_error,
    write_protocol_error, write_upstream_head, ChunkedDecoder, ChunkedEncoder, ClientInfo,
    ErrorKind as ProtoKind, ForwardInfo, Framing, ProtocolError, RelayPlan, RequestHead,
    ResponseFraming, Side, Version, SESSION_ID_BYTES_MAX,
};
use crate::scheduler::wheel::{TimerKey, TimerWheel};
use crate::scheduler::{Arrival, Input, Lane, Output, RejectReason, RequestId};

use super::metrics::{ShardMetrics, UpstreamError};
use super::{ShardHost, ShardRing, Shared};

/// The token of the shard ring's waker.
pub const WAKER: Token = Token(usize::MAX - 1);
const LISTENER: Token = Token(usize::MAX - 2);

/// Bytes read per `read` call at most (the buffer grows to this size in steps).
const READ_CHUNK: usize = 64 << 10;
/// A client buffer larger than this is shrunk back to [`READ_CHUNK`] between requests. Growing
/// a buffer zero-fills it (no `unsafe` here to read into spare capacity), so a connection that
/// keeps sending large bodies keeps its buffer rather than paying a memset per request; 256 KiB
/// bounds what an idle keep-alive connection holds.
const KEEP_BUFFER_MAX: usize = 256 << 10;
/// Unflushed response bytes above which the shard stops reading the backend.
const CLIENT_HIGH_WATER: usize = 256 << 10;
/// How often the loop wakes to run the timer wheel while timers are armed.
const TIMER_TICK: Duration = Duration::from_millis(5);
/// How often the loop retries inputs that did not fit a full scheduler inbox.
const BACKLOG_TICK: Duration = Duration::from_micros(200);
/// Serial numbers carry the connection key in their low bits.
const KEY_BITS: u32 = 24;

/// What a shard thread starts with.
#[derive(Debug)]
pub struct Setup {
    pub index: u16,
    pub poll: Poll,
    /// The schedulers this shard runs.
    pub hosted: Vec<ShardHost>,
    pub listener: TcpListener,
    pub ring: Arc<ShardRing>,
    pub shared: Arc<Shared>,
    pub core: Option<core_affinity::CoreId>,
    pub shard_count: usize,
}

/// Runs a shard until shutdown has drained it.
pub fn run(setup: Setup) {
    if let Some(core) = setup.core {
        core_affinity::set_for_current(core);
    }
    let mut shard = match Shard::new(setup) {
        Ok(shard) => shard,
        Err(e) => {
            eprintln!("warmpath: shard failed to start: {e}");
            return;
        }
    };
    if let Err(e) = shard.run() {
        eprintln!("warmpath: shard {} stopped: {e}", shard.index);
    }
}

/// Where a client connection is in its current exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Head,
    Body,
    Queued,
    Upstream(usize),
    Done,
}

/// The admission of the current request.
#[derive(Debug, Clone, Copy)]
struct Admission {
    backend: u16,
    lane: Lane,
    waited: Tick,
}

/// The request a client connection is working on. Its head's spans point into `Client::rbuf`.
#[derive(Debug)]
struct Request {
    head: RequestHead,
    id: RequestId,
    model: Option<u16>,
    /// Chunked body decoder and the decoded body.
    decoder: Option<ChunkedDecoder>,
    decoded: Vec<u8>,
    /// Bytes of `rbuf` belonging to this request: head plus raw body (known once complete).
    raw_len: usize,
    /// First byte of the request seen.
    started: Tick,
    streaming: bool,
    /// The `"model"` string token in the body (what `upstream_model` replaces).
    model_token: std::ops::Range<usize>,
    admission: Option<Admission>,
    /// Bytes counted in the shard's buffered-bytes gauge while queued.
    buffered: u64,
    /// The pooled connection that died was already replaced once.
    reconnected: bool,
    forwarded_at: Tick,
    first_byte_sent: bool,
    /// The response status, once known.
    status: u16,
    /// Whether the client connection stays open after the response.
    keep_alive: bool,
    /// The response is complete in `wbuf`; `Some(success)` waits for the flush to report it.
    complete: Option<bool>,
}

#[derive(Debug)]
struct Client {
    stream: TcpStream,
    peer: IpAddr,
    rbuf: Vec<u8>,
    rlen: usize,
    wbuf: Vec<u8>,
    wpos: usize,
    phase: Phase,
    timer: Option<TimerKey>,
    /// The client closed its side or the connection failed.
    gone: bool,
    /// epoll reported the peer's FIN: read to the end, short reads included.
    hup: bool,
    /// The last read stopped at the read limit, not at an empty socket: bytes may wait that
    /// no new edge will announce.
    undrained: bool,
    /// Close once the response is flushed.
    closing: bool,
    req: Option<Box<Request>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum UpState {
    Connecting,
    Busy,
    Idle,
}

#[derive(Debug)]
struct Upstream {
    stream: TcpStream,
    model: u16,
    backend: u16,
    state: UpState,
    /// The client key while busy.
    client: usize,
    /// Taken from the pool (the connection served a request before).
    reused: bool,
    wbuf: Vec<u8>,
    wpos: usize,
    rbuf: Vec<u8>,
    rlen: usize,
    eof: bool,
    /// epoll reported the peer's FIN: read to the end, short reads included.
    hup: bool,
    timer: Option<TimerKey>,
    /// Response head parsed: its framing upstream, and the relay plan to the client.
    framing: Option<ResponseFraming>,
    plan: RelayPlan,
    remaining: u64,
    decoder: Option<ChunkedDecoder>,
    keep_alive: bool,
    /// Any response byte received (then nothing is retryable).
    got_bytes: bool,
    /// Stopped reading because the client's buffer is full.
    paused: bool,
    request_was_head: bool,
}

#[derive(Debug)]
enum Conn {
    Client(Client),
    Upstream(Upstream),
}

/// How an upstream exchange ended early.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Failure {
    /// Nothing was received: the request may go elsewhere.
    Retryable(UpstreamError),
    /// Answer 502 if nothing was relayed yet, else cut the client stream.
    Fatal(UpstreamError),
}

struct Shard {
    index: u16,
    poll: Poll,
    /// The schedulers this shard runs, and their decisions for this shard's own requests.
    hosted: Vec<ShardHost>,
    local: std::collections::VecDeque<Output>,
    /// Drained during shutdown (counted off `Shared::shards_busy`).
    drained: bool,
    listener: Option<TcpListener>,
    ring: Arc<ShardRing>,
    shared: Arc<Shared>,
    metrics: Arc<ShardMetrics>,
    conns: Slab<Conn>,
    /// Idle upstream connections, `[model][backend]`.
    pools: Vec<Vec<Vec<usize>>>,
    wheel: TimerWheel<u64>,
    clock: Clock,
    rate: TickRate,
    clients: usize,
    max_clients: usize,
    serial: u64,
    buffered: u64,
    /// Inputs that did not fit their model's inbox, oldest first.
    backlog: std::collections::VecDeque<(u16, Input)>,
    scratch: Vec<u8>,
    /// Models whose inbox received inputs since the last wake.
    dirty: Vec<bool>,
    /// Client connections to read again: their response ended and the next request may be
    /// buffered already.
    again: Vec<usize>,
    timeouts: Timeouts,
    drain_deadline: Option<Tick>,
}

#[derive(Debug, Clone, Copy)]
struct Timeouts {
    header: Tick,
    body: Tick,
    idle: Tick,
    connect: Tick,
    upstream_header: Tick,
}

impl Shard {
    fn new(setup: Setup) -> io::Result<Shard> {
        let shared = setup.shared;
        let model_count = shared.models.len();
        let clock = shared.clock.clone();
        let rate = clock.rate();
        let server = &shared.config.server;
        let upstream = &shared.config.upstream;
        let timeouts = Timeouts {
            header: rate.ticks(server.header_timeout),
            body: rate.ticks(server.body_timeout),
            idle: rate.ticks(server.idle_timeout),
            connect: rate.ticks(upstream.connect_timeout),
            upstream_header: rate.ticks(upstream.header_timeout),
        };
        let max_clients = (server.max_connections as usize).div_ceil(setup.shard_count).max(1);
        let idle_per_backend = upstream.max_idle_per_backend as usize;
        let upstream_conns: usize =
            shared.models.iter().map(|m| m.backends.len() * (idle_per_backend + 1)).sum::<usize>();
        // One timer per connection at most: clients, their upstream exchanges, idle upstreams.
        let timer_capacity = 2 * max_clients + upstream_conns + 16;
        let mut listener = setup.listener;
        setup.poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        let pools = shared.models.iter().map(|m| vec![Vec::new(); m.backends.len()]).collect();
        let now = clock.now();
        Ok(Shard {
            index: setup.index,
            poll: setup.poll,
            hosted: setup.hosted,
            local: std::collections::VecDeque::new(),
            drained: false,
            listener: Some(listener),
            ring: setup.ring,
            metrics: Arc::clone(&shared.shard_metrics[usize::from(setup.index)]),
            shared,
            conns: Slab::with_capacity(1024),
            pools,
            wheel: TimerWheel::new(timer_capacity, rate.ticks(Duration::from_millis(1)), now),
            clock,
            rate,
            clients: 0,
            max_clients,
            serial: 0,
            buffered: 0,
            backlog: std::collections::VecDeque::new(),
            scratch: Vec::with_capacity(16 << 10),
            again: Vec::new(),
            dirty: vec![false; model_count],
            timeouts,
            drain_deadline: None,
        })
    }

    fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut expired = Vec::new();
        loop {
            self.wake_schedulers();
            let timeout = self.poll_timeout();
            // Announce sleep on every ring this loop consumes; any non-empty one means no sleep.
            let mut sleep = self.ring.prepare_sleep();
            for host in &self.hosted {
                sleep &= host.inbox().prepare_sleep();
            }
            let timeout = if sleep { timeout } else { Some(Duration::ZERO) };
            let polled = self.poll.poll(&mut events, timeout);
            self.ring.woke();
            for host in &self.hosted {
                host.inbox().woke();
            }
            if let Err(e) = polled {
                if e.kind() != ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            for event in events.iter() {
                match event.token() {
                    LISTENER => self.accept(),
                    WAKER => {}
                    Token(key) => {
                        let readable = event.is_readable() || event.is_read_closed();
                        self.ready(key, readable, event.is_writable(), event.is_read_closed());
                    }
                }
            }
            self.run_hosted();
            while let Some(output) = self.ring.pop() {
                self.decision(output);
            }
            while let Some(key) = self.again.pop() {
                if matches!(self.conns.get(key), Some(Conn::Client(c)) if c.phase == Phase::Head) {
                    self.read_client(key);
                }
            }
            let now = self.clock.now();
            self.wheel.poll(now, &mut expired);
            for (_, value) in expired.drain(..) {
                self.expired(value);
            }
            self.flush_backlog();
            if self.shared.shutting_down.load(Ordering::Acquire) && self.drain(now) {
                self.wake_schedulers();
                return Ok(());
            }
        }
    }

    /// How long the loop may block: not at all with work pending, until the hosted schedulers'
    /// next timer, and at most [`TIMER_TICK`] while connection timers are armed.
    fn poll_timeout(&self) -> Option<Duration> {
        if !self.again.is_empty() || !self.local.is_empty() {
            return Some(Duration::ZERO);
        }
        let mut timeout = if !self.backlog.is_empty() {
            Some(BACKLOG_TICK)
        } else if !self.wheel.is_empty() || self.drain_deadline.is_some() {
            Some(TIMER_TICK)
        } else {
            None
        };
        let now = self.clock.now();
        for host in &self.hosted {
            let due = match host.backlogged() {
                true => Some(BACKLOG_TICK),
                false => host.next_wakeup().map(|at| self.rate.duration(at.saturating_sub(now))),
            };
            timeout = match (timeout, due) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        timeout
    }

    /// Runs the hosted schedulers over their inboxes and acts on the decisions for this
    /// shard's requests at once; a few rounds, as acting on a decision may send another input
    /// (a retry) to a hosted scheduler.
    fn run_hosted(&mut self) {
        if self.hosted.is_empty() {
            return;
        }
        for _ in 0..4 {
            let now = self.clock.now();
            let mut handled = 0;
            for host in &mut self.hosted {
                handled += host.pass(now, Some((self.index, &mut self.local)));
            }
            let decided = !self.local.is_empty();
            while let Some(output) = self.local.pop_front() {
                self.decision(output);
            }
            if handled == 0 && !decided {
                return;
            }
        }
    }

    // ----- shutdown (S13) -----

    /// Shutdown progress; true when the shard may exit.
    fn drain(&mut self, now: Tick) -> bool {
        if let Some(mut listener) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut listener);
            let drain = self.shared.config.server.drain_timeout;
            self.drain_deadline = Some(now + self.rate.ticks(drain));
            // Idle keep-alive connections close now; busy ones close after their response.
            let idle: Vec<usize> = self
                .conns
                .iter()
                .filter_map(|(key, conn)| match conn {
                    Conn::Client(c) if c.phase == Phase::Head && c.rlen == 0 => Some(key),
                    _ => None,
                })
                .collect();
            for key in idle {
                self.close_client(key);
            }
        }
        let deadline_passed = self.drain_deadline.is_some_and(|d| now >= d);
        if deadline_passed {
            let clients: Vec<usize> = self
                .conns
                .iter()
                .filter_map(|(key, conn)| matches!(conn, Conn::Client(_)).then_some(key))
                .collect();
            for key in clients {
                self.client_gone(key);
            }
        }
        let idle = self.clients == 0
            && self.backlog.is_empty()
            && self.local.is_empty()
            && self.hosted.iter().all(|h| !h.backlogged() && h.inbox().is_empty());
        if idle && !self.drained {
            // Off the busy count; wake the others, whose hosts may be waiting for the last one.
            self.drained = true;
            self.shared.shards_busy.fetch_sub(1, Ordering::AcqRel);
            for ring in &self.shared.rings {
                ring.wake();
            }
        }
        self.drained && self.shared.shards_busy.load(Ordering::Acquire) == 0
    }

    // ----- accept -----

    fn accept(&mut self) {
        loop {
            let Some(listener) = &self.listener else { return };
            let (mut stream, peer) = match listener.accept() {
                Ok(accepted) => accepted,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(_) => return, // EMFILE and friends: try again on the next event.
            };
            if self.clients >= self.max_clients {
                ShardMetrics::bump(&self.metrics.refused);
                self.scratch.clear();
                write_error(
                    503,
                    "unavailable",
                    "too many connections",
                    &mut self.scratch,
                    &[("Connection", b"close")],
                );
                let _ = stream.write(&self.scratch);
                continue;
            }
            let _ = stream.set_nodelay(true);
            let entry = self.conns.vacant_entry();
            let key = entry.key();
            if key >= 1 << KEY_BITS {
                continue;
            }
            let interest = Interest::READABLE | Interest::WRITABLE;
            if self.poll.registry().register(&mut stream, Token(key), interest).is_err() {
                continue;
            }
            entry.insert(Conn::Client(Client {
                stream,
                peer: peer.ip(),
                rbuf: Vec::new(),
                rlen: 0,
                wbuf: Vec::new(),
                wpos: 0,
                phase: Phase::Head,
                timer: None,
                gone: false,
                hup: false,
                undrained: false,
                closing: false,
                req: None,
            }));
            self.clients += 1;
            ShardMetrics::bump(&self.metrics.accepted);
            ShardMetrics::set(&self.metrics.open, self.clients as u64);
            let deadline = self.clock.now() + self.timeouts.header;
            self.set_timer(key, Some(deadline));
        }
    }

    // ----- events -----

    fn ready(&mut self, key: usize, readable: bool, writable: bool, hup: bool) {
        match self.conns.get_mut(key) {
            Some(Conn::Client(c)) => c.hup |= hup,
            Some(Conn::Upstream(u)) => u.hup |= hup,
            None => return,
        }
        match self.conns.get(key) {
            Some(Conn::Client(_)) => {
                if writable {
                    self.flush_client(key);
                }
                if readable && self.conns.contains(key) {
                    self.read_client(key);
                }
            }
            Some(Conn::Upstream(_)) => {
                if writable {
                    self.upstream_writable(key);
                }
                if readable && self.conns.contains(key) {
                    self.upstream_readable(key);
                }
            }
            None => {}
        }
    }

    fn client(&mut self, key: usize) -> &mut Client {
        match &mut self.conns[key] {
            Conn::Client(c) => c,
            Conn::Upstream(_) => unreachable!("key {key} is an upstream connection"),
        }
    }

    fn upstream(&mut self, key: usize) -> &mut Upstream {
        match &mut self.conns[key] {
            Conn::Upstream(u) => u,
            Conn::Client(_) => unreachable!("key {key} is a client connection"),
        }
    }

    // ----- client side -----

    /// Reads what the client sent, then moves its request along.
    fn read_client(&mut self, key: usize) {
        loop {
            let limit = self.read_limit(key);
            let c = self.client(key);
            // Whether the socket is known to be empty; if the read stopped at the limit
            // instead, bytes may wait that no new edge will announce.
            let mut drained = false;
            while !c.gone && c.rlen < limit {
                if c.rbuf.len() == c.rlen {
                    let grow = c.rbuf.len().clamp(4096, READ_CHUNK);
                    c.rbuf.resize(c.rbuf.len() + grow, 0);
                }
                let end = c.rbuf.len().min(limit);
                let want = end - c.rlen;
                match c.stream.read(&mut c.rbuf[c.rlen..end]) {
                    Ok(0) => c.gone = true,
                    Ok(n) => {
                        c.rlen += n;
                        if n < want && !c.hup {
                            // A short read drained the socket: the next byte brings a new
                            // edge, so the read that would only say EAGAIN is skipped.
                            drained = true;
                            break;
                        }
                    }
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        drained = true;
                        break;
                    }
                    Err(e) if e.kind() == ErrorKind::Interrupted => {}
                    Err(_) => c.gone = true,
                }
            }
            c.undrained = !drained && !c.gone;
            let (gone, filled) = (c.gone, c.rlen);
            self.advance(key);
            // Read on only when the read stopped at a limit that the new phase raised (a
            // parsed head lets its body in; a dispatched request, the next head).
            if drained || gone || !self.conns.contains(key) || self.read_limit(key) <= filled {
                return;
            }
        }
    }

    /// How many bytes the client's buffer may hold now: a request being read may fill its
    /// limits (the parser reports the overflow); later phases keep room for one pipelined head.
    fn read_limit(&self, key: usize) -> usize {
        let Some(Conn::Client(c)) = self.conns.get(key) else { return 0 };
        let limits = &self.shared.limits;
        let head_max = limits.max_header_bytes;
        match (c.phase, &c.req) {
            (Phase::Head, _) => head_max + 1,
            (Phase::Body, Some(req)) => match req.head.framing {
                Framing::ContentLength(n) => req.head.head_len + n as usize,
                // Chunk framing adds bytes; the decoder enforces the decoded limit.
                _ => usize::MAX,
            },
            (_, Some(req)) => req.raw_len + head_max,
            _ => head_max,
        }
    }

    /// Moves the client's request through the phases as far as its bytes allow.
    fn advance(&mut self, key: usize) {
        loop {
            let phase = self.client(key).phase;
            let progressed = match phase {
                Phase::Head => self.parse_head(key),
                Phase::Body => self.read_body(key),
                Phase::Queued | Phase::Upstream(_) | Phase::Done => false,
            };
            if !self.conns.contains(key) {
                return;
            }
            if !progressed {
                break;
            }
        }
        let c = self.client(key);
        if c.gone {
            self.client_gone(key);
        }
    }

    fn parse_head(&mut self, key: usize) -> bool {
        let limits = &self.shared.limits;
        let Conn::Client(c) = &mut self.conns[key] else { return false };
        if c.rlen == 0 {
            return false;
        }
        let parsed = parse_request_head(&c.rbuf[..c.rlen], limits);
        let now = self.clock.now();
        match parsed {
            Err(e) => {
                self.protocol_error(key, e, None);
                false
            }
            Ok(None) => {
                // Bytes of a head arrived: the header timeout runs from the first of them.
                if c.req.is_none() && !c.gone {
                    let deadline = now + self.timeouts.header;
                    if self.wheel_deadline(key).is_none_or(|d| d > deadline) {
                        self.set_timer(key, Some(deadline));
                    }
                }
                false
            }
            Ok(Some(head)) => {
                let expect = head.expect_continue && head.framing != Framing::None;
                let keep_alive = head.keep_alive;
                let decoder = (head.framing == Framing::Chunked)
                    .then(|| ChunkedDecoder::new(limits.chunked(), Side::Downstream));
                let raw_len = head.head_len;
                c.req = Some(Box::new(Request {
                    head,
                    id: RequestId(0),
                    model: None,
                    decoder,
                    decoded: Vec::new(),
                    raw_len,
                    started: now,
                    streaming: false,
                    model_token: 0..0,
                    admission: None,
                    buffered: 0,
                    reconnected: false,
                    forwarded_at: 0,
                    first_byte_sent: false,
                    status: 0,
                    keep_alive,
                    complete: None,
                }));
                c.phase = Phase::Body;
                if expect {
                    c.wbuf.extend_from_slice(b"HTTP/1.1 100 Continue\r\n\r\n");
                }
                let deadline = now + self.timeouts.body;
                self.set_timer(key, Some(deadline));
                if expect {
                    self.flush_client(key);
                }
                true
            }
        }
    }

    /// Checks whether the body is complete; dispatches the request when it is.
    fn read_body(&mut self, key: usize) -> bool {
        let Conn::Client(c) = &mut self.conns[key] else { return false };
        let req = c.req.as_mut().expect("a request in the body phase");
        let complete = match req.head.framing {
            Framing::None => true,
            Framing::ContentLength(n) => {
                let end = req.head.head_len + n as usize;
                req.raw_len = end;
                c.rlen >= end
            }
            Framing::Chunked => {
                let decoder = req.decoder.as_mut().expect("a chunked decoder");
                match decoder.feed(&c.rbuf[req.raw_len..c.rlen], &mut req.decoded) {
                    Ok(progress) => {
                        req.raw_len += progress.consumed;
                        progress.done
                    }
                    Err(e) => {
                        let model = req.model;
                        self.protocol_error(key, e, model);
                        return false;
                    }
                }
            }
        };
        if !complete {
            return false;
        }
        self.set_timer(key, None);
        self.dispatch(key);
        true
    }

    /// Routes a complete request.
    fn dispatch(&mut self, key: usize) {
        let Conn::Client(c) = &mut self.conns[key] else { return };
        let req = c.req.as_ref().expect("a request to dispatch");
        let method = req.head.method(&c.rbuf);
        let path = req.head.path(&c.rbuf);
        if method == b"POST" && path.starts_with(b"/v1/") {
            return self.inference(key);
        }
        let shared = Arc::clone(&self.shared);
        match (method, path) {
            (b"GET", b"/v1/models") => self.respond(key, 200, &shared.models_json),
            (b"GET", b"/healthz") => self.respond(key, 200, br#"{"status":"ok"}"#),
            (b"GET", b"/readyz") if shared.ready() => {
                self.respond(key, 200, br#"{"status":"ready"}"#);
            }
            (b"GET", b"/readyz") => self.respond(
                key,
                503,
                br#"{"status":"not ready","reason":"a model has no healthy backend"}"#,
            ),
            _ => self.router_error(key, 404, "model_not_found", "unknown path", None),
        }
    }

    /// An inference request: find its model and session, and queue it.
    fn inference(&mut self, key: usize) {
        let shared = Arc::clone(&self.shared);
        let shard = self.index;
        let Conn::Client(c) = &mut self.conns[key] else { return };
        let req = c.req.as_mut().expect("a request");
        let body = match req.decoder {
            Some(_) => &req.decoded[..],
            None => &c.rbuf[req.head.head_len..req.raw_len],
        };
        let field = match find_model(body) {
            Ok(field) => field,
            Err(e) => {
                let message = e.to_string();
                return self.router_error(key, 400, "invalid_request", &message, None);
            }
        };
        let Some(&model) = shared.by_name.get(&*field.value) else {
            let message = format!("model {:?} is not configured", &*field.value);
            return self.router_error(key, 404, "model_not_found", &message, None);
        };
        let streaming = field.stream;
        let token = field.token.clone();
        let body_len = body.len();
        req.model = Some(model);
        req.streaming = streaming;
        req.model_token = token;
        let m = &shared.models[usize::from(model)];
        let session = if m.session_header == shared.limits.session_header {
            Ok(req.head.session_id(&c.rbuf))
        } else {
            session_value(req.head.headers.get(&c.rbuf, &m.session_header))
        };
        let session = match session {
            Ok(session) => session.map(hash_session),
            Err(message) => {
                return self.router_error(key, 400, "invalid_request", message, Some(model));
            }
        };
        if shared.shutting_down.load(Ordering::Acquire) {
            return self.router_error(key, 503, "unavailable", "shutting down", Some(model));
        }
        let held = req.raw_len as u64 + req.decoded.len() as u64;
        if self.buffered + held > shared.config.server.max_buffered_bytes {
            let message = "buffered request bytes budget exhausted";
            return self.router_error(key, 503, "unavailable", message, Some(model));
        }
        self.serial += 1;
        let serial = self.serial << KEY_BITS | key as u64;
        let id = RequestId::new(shard, serial);
        let arrival = Arrival {
            id,
            session,
            prompt_tokens: u32::try_from(body_len / 4).unwrap_or(u32::MAX),
            streaming: req.streaming,
        };
        if m.inbox.push_quiet(Input::Arrive(arrival)).is_err() {
            let message = "the model's scheduler inbox is full";
            return self.router_error(key, 503, "unavailable", message, Some(model));
        }
        self.dirty[usize::from(model)] = true;
        req.id = id;
        req.buffered = held;
        c.phase = Phase::Queued;
        self.buffered += held;
        ShardMetrics::set(&self.metrics.buffered, self.buffered);
    }

    /// A scheduler's decision about one of this shard's requests.
    fn decision(&mut self, output: Output) {
        let id = match output {
            Output::Admit { id, .. } | Output::Reject { id, .. } => id,
        };
        let key = (id.0 & ((1 << KEY_BITS) - 1)) as usize;
        let Some(Conn::Client(c)) = self.conns.get_mut(key) else { return };
        let current = c.phase == Phase::Queued && c.req.as_ref().is_some_and(|r| r.id == id);
        if !current {
            // The client left (a Cancel is on its way or was handled): nothing to do.
            return;
        }
        let req = c.req.as_mut().expect("queued request");
        self.buffered -= std::mem::take(&mut req.buffered);
        ShardMetrics::set(&self.metrics.buffered, self.buffered);
        let model = req.model;
        match output {
            Output::Admit { backend, lane, waited, .. } => {
                req.admission = Some(Admission { backend, lane, waited });
                if let Some(m) = model {
                    let wait = self.rate.duration(waited);
                    self.metrics.models[usize::from(m)].queue_wait[lane as usize].observe(wait);
                }
                self.forward(key);
            }
            Output::Reject { reason, .. } => {
                let (status, code, message) = match reason {
                    RejectReason::QueueTimeout => {
                        (504, "queue_timeout", "waited in the queue longer than queue.timeout")
                    }
                    RejectReason::QueueFull => (429, "queue_full", "the model's queue is full"),
                    RejectReason::ShuttingDown => (503, "unavailable", "shutting down"),
                    RejectReason::RetriesExhausted => {
                        (502, "upstream_error", "no backend could take the request")
                    }
                };
                self.router_error(key, status, code, message, model);
            }
        }
    }

    /// Sends the admitted request of client `key` to its backend over a pooled or new
    /// connection.
    fn forward(&mut self, key: usize) {
        let shared = Arc::clone(&self.shared);
        let Conn::Client(c) = &mut self.conns[key] else { return };
        let req = c.req.as_mut().expect("an admitted request");
        let model = req.model.expect("an inference request");
        let admission = req.admission.expect("admitted");
        let m = &shared.models[usize::from(model)];
        let backend = &m.backends[usize::from(admission.backend)];
        let body = request_body(req, &c.rbuf);
        let mut out = std::mem::take(&mut self.scratch);
        out.clear();
        // Only the head is built here: the body goes out from the client's buffer, the model
        // token replaced on the way when rewriting (see `flush_upstream`), never copied.
        let body_len = match &m.upstream_model_json {
            Some(json) => body.len() - req.model_token.len() + json.len(),
            None => body.len(),
        };
        let mut request_id = [0u8; 19];
        let request_id = format_request_id(req.id, &mut request_id);
        let info = ForwardInfo {
            client_addr: c.peer,
            request_id,
            default_host: backend.authority.as_bytes(),
            body_len: body_len as u64,
        };
        write_upstream_head(&req.head, &c.rbuf, &mut out, &info);
        let was_head = req.head.method(&c.rbuf) == b"HEAD";
        req.forwarded_at = self.clock.now();
        let addr = backend.addr;
        let up = match self.pools[usize::from(model)][usize::from(admission.backend)].pop() {
            Some(up) => {
                self.set_timer(up, None);
                up
            }
            None => match self.connect(model, admission.backend, addr) {
                Ok(up) => up,
                Err(_) => {
                    self.scratch = out;
                    return self.upstream_failed_before_connect(key, model, admission.backend);
                }
            },
        };
        let u = self.upstream(up);
        u.client = key;
        // The request bytes move into the connection; its old buffer becomes the scratch.
        std::mem::swap(&mut u.wbuf, &mut out);
        out.clear();
        u.wpos = 0;
        u.rlen = 0;
        u.eof = false;
        u.framing = None;
        u.decoder = None;
        u.got_bytes = false;
        u.paused = false;
        u.request_was_head = was_head;
        let connecting = u.state == UpState::Connecting;
        if !connecting {
            u.state = UpState::Busy;
        }
        self.scratch = out;
        self.client(key).phase = Phase::Upstream(up);
        let now = self.clock.now();
        let deadline = match connecting {
            true => now + self.timeouts.connect,
            false => now + self.timeouts.upstream_header,
        };
        self.set_timer(up, Some(deadline));
        if !connecting {
            self.flush_upstream(up);
        }
    }

    /// Opens a connection to a backend; it is `Connecting` until writable.
    fn connect(
        &mut self,
        model: u16,
        backend: u16,
        addr: std::net::SocketAddr,
    ) -> io::Result<usize> {
        let mut stream = TcpStream::connect(addr)?;
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        let interest = Interest::READABLE | Interest::WRITABLE;
        self.poll.registry().register(&mut stream, Token(key), interest)?;
        entry.insert(Conn::Upstream(Upstream {
            stream,
            model,
            backend,
            state: UpState::Connecting,
            client: usize::MAX,
            reused: false,
            wbuf: Vec::new(),
            wpos: 0,
            rbuf: Vec::new(),
            rlen: 0,
            eof: false,
            hup: false,
            timer: None,
            framing: None,
            plan: RelayPlan { framing: ResponseFraming::None, keep_alive: false },
            remaining: 0,
            decoder: None,
            keep_alive: false,
            got_bytes: false,
            paused: false,
            request_was_head: false,
        }));
        Ok(key)
    }

    /// `connect` itself failed: retry through the scheduler.
    fn upstream_failed_before_connect(&mut self, key: usize, model: u16, backend: u16) {
        self.metrics.models[usize::from(model)]
            .count_upstream_error(backend, UpstreamError::Connect);
        self.retry(key);
    }

    /// Sends the request back to its scheduler for another backend (SPEC 2.8).
    fn retry(&mut self, key: usize) {
        let c = self.client(key);
        let req = c.req.as_mut().expect("an admitted request");
        req.admission = None;
        req.reconnected = false;
        let id = req.id;
        let model = req.model.expect("an inference request");
        c.phase = Phase::Queued;
        self.send(model, Input::Retry(id));
    }

    /// Writes a router answer with `status` and a JSON error body, then ends the request.
    fn router_error(
        &mut self,
        key: usize,
        status: u16,
        code: &str,
        message: &str,
        model: Option<u16>,
    ) {
        let Conn::Client(c) = &mut self.conns[key] else { return };
        let keep_alive = c.req.as_ref().is_some_and(|r| r.keep_alive) && !c.closing;
        let version = c.req.as_ref().map_or(Version::Http11, |r| r.head.version);
        let shutting = self.shared.shutting_down.load(Ordering::Acquire);
        let keep_alive = keep_alive && !shutting;
        match connection_header(version, keep_alive) {
            Some(h) => write_error(status, code, message, &mut c.wbuf, &[h]),
            None => write_error(status, code, message, &mut c.wbuf, &[]),
        }
        self.finish_response(key, status, keep_alive, model);
    }

    /// Writes a router answer with `status` and a JSON body, then ends the request.
    fn respond(&mut self, key: usize, status: u16, body: &[u8]) {
        let shutting = self.shared.shutting_down.load(Ordering::Acquire);
        let Conn::Client(c) = &mut self.conns[key] else { return };
        let keep_alive = c.req.as_ref().is_some_and(|r| r.keep_alive) && !shutting;
        let version = c.req.as_ref().map_or(Version::Http11, |r| r.head.version);
        let w = &mut c.wbuf;
        w.extend_from_slice(b"HTTP/1.1 ");
        w.extend_from_slice(status.to_string().as_bytes());
        w.push(b' ');
        w.extend_from_slice(crate::protocol::reason_phrase(status).as_bytes());
        w.extend_from_slice(b"\r\nContent-Type: application/json\r\nContent-Length: ");
        w.extend_from_slice(body.len().to_string().as_bytes());
        w.extend_from_slice(b"\r\n");
        if let Some((name, value)) = connection_header(version, keep_alive) {
            w.extend_from_slice(name.as_bytes());
            w.extend_from_slice(b": ");
            w.extend_from_slice(value);
            w.extend_from_slice(b"\r\n");
        }
        w.extend_from_slice(b"\r\n");
        w.extend_from_slice(body);
        self.finish_response(key, status, keep_alive, None);
    }

    /// A framing error: answer and close (the connection cannot be trusted).
    fn protocol_error(&mut self, key: usize, e: ProtocolError, model: Option<u16>) {
        let c = self.client(key);
        write_protocol_error(e, &mut c.wbuf);
        self.finish_response(key, e.status(), false, model);
    }

    /// The router's response is in the write buffer: count it and flush it.
    fn finish_response(&mut self, key: usize, status: u16, keep_alive: bool, model: Option<u16>) {
        match model {
            Some(m) => self.metrics.models[usize::from(m)].count_status(status),
            None => self.metrics.count_other_status(status),
        }
        let c = self.client(key);
        if let Some(req) = c.req.as_mut() {
            req.status = status;
            req.keep_alive = keep_alive;
            req.complete = Some(false);
        } else {
            c.closing = true;
        }
        c.closing |= !keep_alive;
        c.phase = Phase::Done;
        self.set_timer(key, None);
        self.flush_client(key);
    }

    /// Writes what the client's buffer holds; ends the request once its response is out.
    fn flush_client(&mut self, key: usize) {
        let Conn::Client(c) = &mut self.conns[key] else { return };
        let mut progressed = false;
        while c.wpos < c.wbuf.len() {
            match c.stream.write(&c.wbuf[c.wpos..]) {
                Ok(0) => {
                    c.gone = true;
                    break;
                }
                Ok(n) => {
                    c.wpos += n;
                    progressed = true;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    c.gone = true;
                    break;
                }
            }
        }
        if c.wpos == c.wbuf.len() {
            c.wbuf.clear();
            c.wpos = 0;
        }
        if c.gone {
            return self.client_gone(key);
        }
        let pending = c.wbuf.len() - c.wpos;
        // A client that stops reading its response: the send timeout is `idle_timeout`, from
        // the last byte it accepted.
        let sending = matches!(c.phase, Phase::Upstream(_) | Phase::Done);
        if sending && pending > 0 && (progressed || c.timer.is_none()) {
            let deadline = self.clock.now() + self.timeouts.idle;
            self.set_timer(key, Some(deadline));
        } else if sending && pending == 0 && c.timer.is_some() {
            self.set_timer(key, None);
        }
        let Conn::Client(c) = &mut self.conns[key] else { return };
        match c.phase {
            Phase::Done if pending == 0 => self.end_request(key),
            Phase::Upstream(up) if pending < CLIENT_HIGH_WATER / 2 => {
                if matches!(self.conns.get(up), Some(Conn::Upstream(u)) if u.paused) {
                    self.upstream(up).paused = false;
                    self.upstream_readable(up);
                }
            }
            _ => {}
        }
    }

    /// The response is flushed: report the end to the scheduler, then serve the next request
    /// on the connection or close it.
    fn end_request(&mut self, key: usize) {
        let now = self.clock.now();
        let c = self.client(key);
        let Some(req) = c.req.take() else {
            return self.close_client(key);
        };
        if let (Some(admission), Some(model)) = (req.admission, req.model) {
            let success = req.complete == Some(true);
            let _ = admission;
            self.send(model, Input::Complete { id: req.id, success });
        }
        if let Some(model) = req.model {
            let elapsed = self.rate.duration(now.saturating_sub(req.started));
            self.metrics.models[usize::from(model)].duration.observe(elapsed);
        }
        let shutting = self.shared.shutting_down.load(Ordering::Acquire);
        let c = self.client(key);
        let closing = c.closing || !req.keep_alive || shutting;
        if closing {
            return self.close_client(key);
        }
        // Drop the request's bytes; a pipelined request may follow.
        let used = req.raw_len.min(c.rlen);
        c.rbuf.copy_within(used..c.rlen, 0);
        c.rlen -= used;
        c.phase = Phase::Head;
        if c.rbuf.len() > KEEP_BUFFER_MAX && c.rlen < READ_CHUNK {
            c.rbuf.truncate(READ_CHUNK);
            c.rbuf.shrink_to(READ_CHUNK);
        }
        let pending = c.rlen > 0;
        let undrained = c.undrained;
        let deadline = now + if pending { self.timeouts.header } else { self.timeouts.idle };
        self.set_timer(key, Some(deadline));
        // A pipelined request may be buffered, or bytes may wait in the socket that no edge
        // will announce (the last read stopped at the limit): the loop reads the connection
        // again, not this call, so a long pipeline is served iteratively, not by recursion.
        // Otherwise the next request's bytes will come with a new edge.
        if pending || undrained {
            self.again.push(key);
        }
    }

    /// The client closed or failed: drop its request the way its phase requires (S10).
    fn client_gone(&mut self, key: usize) {
        let Some(Conn::Client(c)) = self.conns.get_mut(key) else { return };
        c.gone = true;
        let phase = c.phase;
        let req = c.req.take();
        if let Some(mut req) = req {
            self.buffered -= std::mem::take(&mut req.buffered);
            ShardMetrics::set(&self.metrics.buffered, self.buffered);
            match (phase, req.model) {
                (Phase::Queued, Some(model)) => {
                    ShardMetrics::bump(&self.metrics.clients_gone);
                    self.send(model, Input::Cancel(req.id));
                }
                (Phase::Upstream(up), Some(model)) => {
                    ShardMetrics::bump(&self.metrics.clients_gone);
                    self.close_upstream(up);
                    self.send(model, Input::Complete { id: req.id, success: false });
                }
                (Phase::Done, Some(model)) if req.admission.is_some() => {
                    self.send(model, Input::Complete { id: req.id, success: false });
                }
                _ => {}
            }
        }
        self.close_client(key);
    }

    fn close_client(&mut self, key: usize) {
        self.set_timer(key, None);
        if let Some(Conn::Client(mut c)) = self.conns.try_remove(key) {
            let _ = self.poll.registry().deregister(&mut c.stream);
            if let Some(mut req) = c.req.take() {
                self.buffered -= std::mem::take(&mut req.buffered);
                ShardMetrics::set(&self.metrics.buffered, self.buffered);
            }
            self.clients -= 1;
            ShardMetrics::set(&self.metrics.open, self.clients as u64);
        }
    }

    // ----- upstream side -----

    fn upstream_writable(&mut self, up: usize) {
        let u = self.upstream(up);
        if u.state == UpState::Connecting {
            let failed = match u.stream.take_error() {
                Ok(Some(_)) | Err(_) => true,
                Ok(None) => match u.stream.peer_addr() {
                    Ok(_) => false,
                    Err(e) if e.kind() == ErrorKind::NotConnected => return,
                    Err(_) => true,
                },
            };
            if failed {
                return self.upstream_failed(up, Failure::Retryable(UpstreamError::Connect));
            }
            let _ = u.stream.set_nodelay(true);
            u.state = if u.client == usize::MAX { UpState::Idle } else { UpState::Busy };
            if u.state == UpState::Busy {
                let deadline = self.clock.now() + self.timeouts.upstream_header;
                self.set_timer(up, Some(deadline));
            }
        }
        self.flush_upstream(up);
    }

    /// Writes the request to the backend: the head from the connection's buffer, then the body
    /// straight from the client's buffer (with the model token swapped for `upstream_model`'s),
    /// in vectored writes.
    fn flush_upstream(&mut self, up: usize) {
        let shared = Arc::clone(&self.shared);
        let Some((Conn::Upstream(u), Conn::Client(c))) = get2(&mut self.conns, up) else {
            return;
        };
        if u.state != UpState::Busy {
            return;
        }
        let req = c.req.as_ref().expect("a forwarded request");
        let body = request_body(req, &c.rbuf);
        let parts: [&[u8]; 4] = match &shared.models[usize::from(u.model)].upstream_model_json {
            Some(json) => {
                let token = req.model_token.clone();
                [&u.wbuf, &body[..token.start], json, &body[token.end..]]
            }
            None => [&u.wbuf, body, &[], &[]],
        };
        let total: usize = parts.iter().map(|p| p.len()).sum();
        while u.wpos < total {
            let mut slices = [io::IoSlice::new(&[]); 4];
            let (mut used, mut skip) = (0, u.wpos);
            for part in parts {
                if skip >= part.len() {
                    skip -= part.len();
                    continue;
                }
                slices[used] = io::IoSlice::new(&part[skip..]);
                skip = 0;
                used += 1;
            }
            match u.stream.write_vectored(&slices[..used]) {
                Ok(0) => return self.upstream_failed(up, Failure::Retryable(UpstreamError::Reset)),
                Ok(n) => u.wpos += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    return self.upstream_failed(up, Failure::Retryable(UpstreamError::Reset))
                }
            }
        }
    }

    /// Reads what the backend sent. A busy connection relays each read as it arrives (SSE
    /// events are not held back); an idle pooled one that speaks or closes is dropped.
    fn upstream_readable(&mut self, up: usize) {
        let mut failed = false;
        loop {
            let Some(Conn::Upstream(u)) = self.conns.get_mut(up) else { return };
            if u.state == UpState::Connecting || u.paused {
                return;
            }
            if u.eof {
                break;
            }
            if u.rbuf.len() == u.rlen {
                let grow = u.rbuf.len().clamp(4096, READ_CHUNK);
                u.rbuf.resize(u.rbuf.len() + grow, 0);
            }
            let want = u.rbuf.len() - u.rlen;
            match u.stream.read(&mut u.rbuf[u.rlen..]) {
                Ok(0) => u.eof = true,
                Ok(_) if u.state == UpState::Idle => return self.close_upstream(up),
                Ok(n) => {
                    u.rlen += n;
                    self.relay(up);
                    let busy = matches!(
                        self.conns.get(up),
                        Some(Conn::Upstream(u)) if u.state == UpState::Busy
                    );
                    let hup = matches!(self.conns.get(up), Some(Conn::Upstream(u)) if u.hup);
                    if !busy || n < want && !hup {
                        // Done, or a short read drained the socket (see `read_client`).
                        return;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    failed = true;
                    break;
                }
            }
        }
        let Some(Conn::Upstream(u)) = self.conns.get(up) else { return };
        if u.state == UpState::Idle || u.client == usize::MAX {
            return self.close_upstream(up);
        }
        if !failed {
            // A close-delimited body ends here; anything else ends early.
            self.relay(up);
        }
        let Some(Conn::Upstream(u)) = self.conns.get(up) else { return };
        if u.state == UpState::Busy && u.client != usize::MAX {
            let failure = match (u.got_bytes, u.framing) {
                (false, _) => Failure::Retryable(UpstreamError::Reset),
                (true, None) => Failure::Fatal(UpstreamError::Malformed),
                (true, Some(_)) => Failure::Fatal(UpstreamError::Truncated),
            };
            self.upstream_failed(up, failure);
        }
    }

    /// Moves response bytes from the backend's buffer to the client's, as the framing says.
    fn relay(&mut self, up: usize) {
        let debug_headers = self.shared.config.server.debug_headers;
        let shared = Arc::clone(&self.shared);
        let max_head = shared.config.server.max_header_bytes as usize;
        let Some((Conn::Upstream(u), Conn::Client(c))) = get2(&mut self.conns, up) else {
            return;
        };
        if u.rlen > 0 {
            u.got_bytes = true;
        }
        let req = c.req.as_mut().expect("a forwarded request");
        let model = usize::from(u.model);
        let mut consumed = 0;
        if u.framing.is_none() {
            let head = match parse_response_head(&u.rbuf[..u.rlen], max_head, u.request_was_head) {
                Ok(Some(head)) => head,
                Ok(None) => return,
                Err(_) => {
                    return self.upstream_failed(up, Failure::Fatal(UpstreamError::Malformed))
                }
            };
            if head.is_interim() {
                if head.status == 101 {
                    return self.upstream_failed(up, Failure::Fatal(UpstreamError::Malformed));
                }
                u.rbuf.copy_within(head.head_len..u.rlen, 0);
                u.rlen -= head.head_len;
                return self.relay(up);
            }
            let now = self.clock.now();
            let ttfb = self.rate.duration(now.saturating_sub(req.forwarded_at));
            self.metrics.models[model].ttfb.observe(ttfb);
            // During a drain (S13) the connection closes after this response.
            let shutting = shared.shutting_down.load(Ordering::Acquire);
            let client =
                ClientInfo { version: req.head.version, keep_alive: req.keep_alive && !shutting };
            let admission = req.admission.expect("admitted");
            let mut wait = [0u8; 20];
            let wait = format_decimal(
                u64::try_from(self.rate.duration(admission.waited).as_micros()).unwrap_or(u64::MAX),
                &mut wait,
            );
            let backend =
                shared.models[model].backends[usize::from(admission.backend)].authority.as_bytes();
            let lane = match admission.lane {
                Lane::Retry | Lane::Normal => b"normal".as_slice(),
                Lane::Boosted => b"boosted",
                Lane::Forced => b"forced",
            };
            let debug: [(&str, &[u8]); 3] = [
                ("x-warmpath-lane", lane),
                ("x-warmpath-queue-wait-us", wait),
                ("x-warmpath-backend", backend),
            ];
            let extra: &[(&str, &[u8])] = if debug_headers { &debug } else { &[] };
            let plan = write_client_response_head(&head, &u.rbuf, &mut c.wbuf, &client, extra);
            u.plan = plan;
            u.framing = Some(head.framing);
            u.keep_alive = head.keep_alive;
            u.remaining = match head.framing {
                ResponseFraming::ContentLength(n) => n,
                _ => 0,
            };
            u.decoder = (head.framing == ResponseFraming::Chunked)
                .then(|| ChunkedDecoder::new(upstream_chunk_limits(), Side::Upstream));
            req.status = head.status;
            req.keep_alive = plan.keep_alive;
            consumed = head.head_len;
            let timer = u.timer.take();
            if let Some(timer) = timer {
                self.wheel.cancel(timer);
            }
            self.metrics.models[model].count_status(head.status);
        }
        let Some((Conn::Upstream(u), Conn::Client(c))) = get2(&mut self.conns, up) else {
            return;
        };
        let req = c.req.as_mut().expect("a forwarded request");
        let input = &u.rbuf[consumed..u.rlen];
        let before = c.wbuf.len();
        let done = match u.framing.expect("head parsed") {
            ResponseFraming::None => true,
            ResponseFraming::ContentLength(_) => {
                let take = input.len().min(usize::try_from(u.remaining).unwrap_or(usize::MAX));
                relay_bytes(&input[..take], u.plan.framing, &mut c.wbuf);
                u.remaining -= take as u64;
                consumed += take;
                u.remaining == 0
            }
            ResponseFraming::Chunked => {
                let decoder = u.decoder.as_mut().expect("chunked decoder");
                self.scratch.clear();
                match decoder.feed(input, &mut self.scratch) {
                    Ok(progress) => {
                        relay_bytes(&self.scratch, u.plan.framing, &mut c.wbuf);
                        consumed += progress.consumed;
                        progress.done
                    }
                    Err(_) => {
                        return self.upstream_failed(up, Failure::Fatal(UpstreamError::Malformed));
                    }
                }
            }
            ResponseFraming::UntilClose => {
                relay_bytes(input, u.plan.framing, &mut c.wbuf);
                consumed += input.len();
                u.eof
            }
        };
        let body_bytes = c.wbuf.len() > before;
        u.rbuf.copy_within(consumed..u.rlen, 0);
        u.rlen -= consumed;
        let first_byte = body_bytes && req.streaming && !req.first_byte_sent;
        if first_byte {
            req.first_byte_sent = true;
        }
        let id = req.id;
        let client = u.client;
        if done {
            if u.plan.framing == ResponseFraming::Chunked {
                ChunkedEncoder::finish(&mut c.wbuf);
            }
            req.complete = Some((200..300).contains(&req.status));
            c.phase = Phase::Done;
            let reusable = u.keep_alive && u.rlen == 0 && !u.eof;
            u.client = usize::MAX;
            if reusable {
                self.return_to_pool(up);
            } else {
                self.close_upstream(up);
            }
        } else if c.wbuf.len() - c.wpos >= CLIENT_HIGH_WATER {
            u.paused = true;
        }
        if first_byte {
            self.send(model as u16, Input::FirstByte(id));
        }
        self.flush_client(client);
    }

    /// An upstream exchange failed. Retryable failures go back to the scheduler (after one
    /// fresh reconnect for a dead pooled connection); fatal ones answer 502 when nothing was
    /// relayed yet, or cut the client's stream.
    fn upstream_failed(&mut self, up: usize, failure: Failure) {
        let Some(Conn::Upstream(u)) = self.conns.get(up) else { return };
        let (model, backend, client, reused) = (u.model, u.backend, u.client, u.reused);
        self.close_upstream(up);
        if client == usize::MAX {
            return;
        }
        let kind = match failure {
            Failure::Retryable(kind) | Failure::Fatal(kind) => kind,
        };
        let metrics = &self.metrics.models[usize::from(model)];
        let Some(Conn::Client(c)) = self.conns.get_mut(client) else { return };
        let req = c.req.as_mut().expect("a forwarded request");
        match failure {
            Failure::Retryable(_) if reused && !req.reconnected => {
                // A pooled connection found dead: one fresh connection to the same backend.
                metrics.count_pool_reconnect();
                req.reconnected = true;
                c.phase = Phase::Queued;
                self.forward_fresh(client);
            }
            Failure::Retryable(_) => {
                metrics.count_upstream_error(backend, kind);
                self.retry(client);
            }
            Failure::Fatal(_) => {
                metrics.count_upstream_error(backend, kind);
                if req.status == 0 {
                    let message = match kind {
                        UpstreamError::Timeout => "the backend sent no response head in time",
                        _ => "the backend sent a malformed response",
                    };
                    self.router_error(client, 502, "upstream_error", message, Some(model));
                } else {
                    // Bytes were relayed: the status stands; end the stream without its end
                    // (no final chunk) and close.
                    req.complete = Some(false);
                    c.closing = true;
                    c.phase = Phase::Done;
                    self.flush_client(client);
                }
            }
        }
    }

    /// Forwards the client's request again over a new connection (the pool is skipped).
    fn forward_fresh(&mut self, key: usize) {
        let c = self.client(key);
        let req = c.req.as_ref().expect("an admitted request");
        let (model, backend) =
            (req.model.expect("model"), req.admission.expect("admitted").backend);
        // Drain the pool of that backend: its other idle connections are likely dead too.
        let idle = std::mem::take(&mut self.pools[usize::from(model)][usize::from(backend)]);
        for up in idle {
            self.close_upstream(up);
        }
        self.client(key).phase = Phase::Queued;
        self.forward(key);
    }

    fn return_to_pool(&mut self, up: usize) {
        let max_idle = self.shared.config.upstream.max_idle_per_backend as usize;
        let u = self.upstream(up);
        let (model, backend) = (usize::from(u.model), usize::from(u.backend));
        let pool = &mut self.pools[model][backend];
        if pool.len() >= max_idle || self.shared.shutting_down.load(Ordering::Acquire) {
            return self.close_upstream(up);
        }
        pool.push(up);
        let u = self.upstream(up);
        u.state = UpState::Idle;
        u.reused = true;
        u.client = usize::MAX;
        let deadline = self.clock.now() + self.timeouts.idle;
        self.set_timer(up, Some(deadline));
    }

    fn close_upstream(&mut self, up: usize) {
        self.set_timer(up, None);
        if let Some(Conn::Upstream(mut u)) = self.conns.try_remove(up) {
            let _ = self.poll.registry().deregister(&mut u.stream);
            let _ = u.stream.shutdown(Shutdown::Both);
            let pool = &mut self.pools[usize::from(u.model)][usize::from(u.backend)];
            if let Some(i) = pool.iter().position(|&k| k == up) {
                pool.swap_remove(i);
            }
        }
    }

    // ----- timers -----

    fn wheel_deadline(&self, key: usize) -> Option<Tick> {
        let timer = match self.conns.get(key)? {
            Conn::Client(c) => c.timer?,
            Conn::Upstream(u) => u.timer?,
        };
        self.wheel.deadline(timer)
    }

    /// Arms (or with `None` disarms) the one timer of connection `key`.
    fn set_timer(&mut self, key: usize, deadline: Option<Tick>) {
        let slot = match self.conns.get_mut(key) {
            Some(Conn::Client(c)) => &mut c.timer,
            Some(Conn::Upstream(u)) => &mut u.timer,
            None => return,
        };
        if let Some(old) = slot.take() {
            self.wheel.cancel(old);
        }
        if let Some(deadline) = deadline {
            *slot = Some(self.wheel.insert(deadline, key as u64));
        }
    }

    fn expired(&mut self, value: u64) {
        let key = value as usize;
        let now = self.clock.now();
        match self.conns.get_mut(key) {
            Some(Conn::Client(c)) => {
                c.timer = None;
                match c.phase {
                    Phase::Head if c.rlen == 0 => self.close_client(key),
                    Phase::Head | Phase::Body => {
                        let message = match c.phase {
                            Phase::Head => "request head not received within server.header_timeout",
                            _ => "request body not received within server.body_timeout",
                        };
                        if c.req.is_none() {
                            c.closing = true;
                        }
                        let model = c.req.as_ref().and_then(|r| r.model);
                        self.router_error(key, 408, "request_timeout", message, model);
                        if let Some(Conn::Client(c)) = self.conns.get_mut(key) {
                            c.closing = true;
                        }
                    }
                    // The client accepted nothing of its response for `idle_timeout`.
                    Phase::Upstream(_) | Phase::Done => self.client_gone(key),
                    Phase::Queued => {}
                }
            }
            Some(Conn::Upstream(u)) => {
                u.timer = None;
                match u.state {
                    UpState::Connecting => {
                        self.upstream_failed(key, Failure::Retryable(UpstreamError::Connect));
                    }
                    UpState::Busy if u.framing.is_none() => {
                        self.upstream_failed(key, Failure::Fatal(UpstreamError::Timeout));
                    }
                    UpState::Idle => self.close_upstream(key),
                    UpState::Busy => {}
                }
            }
            None => {}
        }
        let _ = now;
    }

    // ----- scheduler inputs -----

    /// Sends an input that must not be lost: it waits in the backlog while the inbox is full.
    fn send(&mut self, model: u16, input: Input) {
        if !self.backlog.is_empty() {
            self.backlog.push_back((model, input));
            return;
        }
        match self.shared.models[usize::from(model)].inbox.push_quiet(input) {
            Ok(()) => self.dirty[usize::from(model)] = true,
            Err(input) => self.backlog.push_back((model, input)),
        }
    }

    fn flush_backlog(&mut self) {
        while let Some((model, input)) = self.backlog.pop_front() {
            match self.shared.models[usize::from(model)].inbox.push_quiet(input) {
                Ok(()) => self.dirty[usize::from(model)] = true,
                Err(input) => {
                    self.backlog.push_front((model, input));
                    return;
                }
            }
        }
    }

    /// Wakes the schedulers this iteration sent inputs to: one wake per model per loop
    /// iteration rather than one per input (a futex syscall each, on both threads).
    fn wake_schedulers(&mut self) {
        for (model, dirty) in self.shared.models.iter().zip(&mut self.dirty) {
            if std::mem::take(dirty) {
                model.inbox.wake_if_sleeping();
            }
        }
    }
}

/// The body of a complete request: in the client's buffer after the head, or decoded from
/// chunks.
fn request_body<'a>(req: &'a Request, rbuf: &'a [u8]) -> &'a [u8] {
    match req.decoder {
        Some(_) => &req.decoded,
        None => &rbuf[req.head.head_len..req.raw_len],
    }
}

/// Both connections of an exchange, mutably: the upstream `up` and its client.
fn get2(conns: &mut Slab<Conn>, up: usize) -> Option<(&mut Conn, &mut Conn)> {
    let client = match conns.get(up)? {
        Conn::Upstream(u) if u.client != usize::MAX => u.client,
        _ => return None,
    };
    conns.get2_mut(up, client)
}

/// Appends relayed body bytes in the client's framing: chunks for a re-framed body, raw
/// otherwise.
fn relay_bytes(data: &[u8], framing: ResponseFraming, out: &mut Vec<u8>) {
    if data.is_empty() {
        return;
    }
    match framing {
        ResponseFraming::Chunked => ChunkedEncoder::chunk(data, out),
        _ => out.extend_from_slice(data),
    }
}

/// Chunked response bodies from backends: no size limit (responses stream for as long as the
/// backend generates), the request limits for lines and trailers.
fn upstream_chunk_limits() -> crate::protocol::ChunkedLimits {
    crate::protocol::ChunkedLimits {
        max_body_bytes: u64::MAX,
        max_line_bytes: 4096,
        max_trailer_bytes: 16 << 10,
    }
}

/// The `Connection` header a router answer needs, if any.
fn connection_header(version: Version, keep_alive: bool) -> Option<(&'static str, &'static [u8])> {
    match (keep_alive, version) {
        (false, _) => Some(("Connection", b"close")),
        (true, Version::Http10) => Some(("Connection", b"keep-alive")),
        (true, Version::Http11) => None,
    }
}

/// A session header value under a model's own header name: trimmed, empty is none, over 256
/// bytes or not visible ASCII is refused (SPEC 2.4).
fn session_value(value: Option<&[u8]>) -> Result<Option<&[u8]>, &'static str> {
    let Some(value) = value else { return Ok(None) };
    let value = value.trim_ascii();
    if value.is_empty() {
        return Ok(None);
    }
    if value.len() > SESSION_ID_BYTES_MAX {
        return Err(ProtocolError::downstream(ProtoKind::SessionIdTooLong).message());
    }
    if !value.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(ProtocolError::downstream(ProtoKind::InvalidSessionId).message());
    }
    Ok(Some(value))
}

/// The 64-bit key of a session id, the same in every shard (SipHash with fixed keys).
fn hash_session(id: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    id.hash(&mut hasher);
    hasher.finish()
}

/// `wp-` and the id in hex: the `X-Request-ID` sent when the client sent none.
fn format_request_id(id: RequestId, buf: &mut [u8; 19]) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    buf[..3].copy_from_slice(b"wp-");
    for (i, slot) in buf[3..].iter_mut().enumerate() {
        *slot = HEX[(id.0 >> (60 - 4 * i) & 0xf) as usize];
    }
    &buf[..]
}

/// `n` in decimal, in `buf`.
fn format_decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[start..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_hex_and_decimals_are_decimal() {
        let mut buf = [0; 19];
        assert_eq!(format_request_id(RequestId(0xab), &mut buf), b"wp-00000000000000ab");
        let mut buf = [0; 20];
        assert_eq!(format_decimal(0, &mut buf), b"0");
        assert_eq!(format_decimal(u64::MAX, &mut buf), b"18446744073709551615");
    }

    #[test]
    fn session_values_follow_spec_2_4() {
        assert_eq!(session_value(None), Ok(None));
        assert_eq!(session_value(Some(b"  ")), Ok(None));
        assert_eq!(session_value(Some(b" abc ")), Ok(Some(&b"abc"[..])));
        assert!(session_value(Some(&[b'a'; 257])).is_err());
        assert!(session_value(Some(b"a b")).is_err());
        assert_eq!(hash_session(b"abc"), hash_session(b"abc"));
        assert_ne!(hash_session(b"abc"), hash_session(b"abd"));
    }
}
