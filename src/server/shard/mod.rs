//! A shard: one mio event loop (edge-triggered) owning its client connections, the upstream
//! connections it opens, its keep-alive pools, a timer wheel for their timeouts, and the
//! schedulers it hosts. This file has the loop, accept, shutdown, timers and scheduler inputs;
//! `client.rs` the client side, `upstream.rs` the backend side.
//!
//! A client connection goes through [`Phase`]s: `Head` (reading the request head), `Body`,
//! `Queued` (the request waits in its model's scheduler), `Upstream` (forwarded; the response is
//! relayed as it arrives), `Done` (the response is complete in the write buffer; once flushed,
//! the request ends and the next pipelined one, if any, is parsed), `Lingering` (the connection
//! closes after that answer: half-closed, its input discarded until the client closes or
//! `LINGER` passes, so that a reset cannot destroy the answer). Router answers (errors,
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
use crate::protocol::prompt::PromptHasher;
use crate::protocol::usage::UsageScanner;
use crate::protocol::{
    find_model_and_prompt, parse_request_head, parse_response_head, write_client_response_head,
    write_error, write_protocol_error, write_upstream_head, BodyRelay, ChunkedDecoder, ClientInfo,
    ErrorKind as ProtoKind, ForwardInfo, Framing, ProtocolError, RelayPlan, RequestHead,
    ResponseFraming, Side, Version, SESSION_ID_BYTES_MAX,
};
use crate::ring::prompt_pool::{PromptPool, NO_PROMPT};
use crate::scheduler::{Arrival, Input, Lane, Output, RejectReason, RequestId, Usage};
use crate::wheel::{TimerKey, TimerWheel};

use super::access_log::{self, Outcome, ShardLog};
use super::metrics::{ShardMetrics, UpstreamError};
use super::{Generation, ShardHost, ShardRing, Shared};

mod client;
mod upstream;

/// The token of the shard ring's waker.
pub const WAKER: Token = Token(usize::MAX - 1);
const LISTENER: Token = Token(usize::MAX - 2);

/// Bytes read per `read` call at most (the buffer grows to this size in steps).
const READ_CHUNK: usize = 64 << 10;
/// A client buffer larger than this is shrunk back to [`READ_CHUNK`] between requests. Growing
/// a buffer zero-fills it (no `unsafe` here to read into spare capacity), so a connection that
/// keeps sending large bodies keeps its buffer rather than paying a memset per request; 256 KiB
/// bounds what a busy keep-alive connection holds between requests.
const KEEP_BUFFER_MAX: usize = 256 << 10;
/// How long a keep-alive connection may sit idle holding its buffers: after this it gives them
/// back and holds none until its next request (which allocates again), so the memory of idle
/// connections does not drift up to their number times their largest request.
const IDLE_RELEASE: Duration = Duration::from_secs(1);
/// Unflushed response bytes above which the shard stops reading the backend.
const CLIENT_HIGH_WATER: usize = 256 << 10;
/// How often the loop wakes to run the timer wheel while timers are armed.
const TIMER_TICK: Duration = Duration::from_millis(5);
/// How often the loop retries inputs that did not fit a full scheduler inbox.
const BACKLOG_TICK: Duration = Duration::from_micros(200);
/// How long a closing client connection keeps reading (and discarding) its input after its
/// last answer, so that a reset does not destroy that answer (RFC 9112 9.6).
const LINGER: Duration = Duration::from_secs(2);
/// Serial numbers carry the connection key in their low bits.
const KEY_BITS: u32 = 24;

/// What a shard thread starts with.
#[derive(Debug)]
pub struct Setup {
    pub index: u16,
    pub poll: Poll,
    /// The schedulers this shard runs, with their models' indices.
    pub hosted: Vec<(u16, ShardHost)>,
    pub listener: TcpListener,
    pub ring: Arc<ShardRing>,
    pub shared: Arc<Shared>,
    pub core: Option<core_affinity::CoreId>,
    pub shard_count: usize,
}

/// Runs a shard until shutdown has drained it.
pub fn run(setup: Setup) {
    if let Some(core) = setup.core {
        if let Err(warning) = pin(setup.index, core) {
            eprintln!("{warning}");
        }
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

/// Pins the calling thread, shard `index`, to `core`. If the kernel refuses (a core outside
/// the process's cpuset, for one), the shard runs unpinned and this is the line to warn with.
fn pin(index: u16, core: core_affinity::CoreId) -> Result<(), String> {
    match core_affinity::set_for_current(core) {
        true => Ok(()),
        false => Err(format!(
            "warmpath: warning: shard {index}: pinning to core {} failed; running unpinned",
            core.id
        )),
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
    /// The answer is out and the connection half-closed; input is read and discarded until the
    /// client closes or [`LINGER`] passes (see `Shard::linger`).
    Lingering,
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
    /// Response bytes written to the client (the access log's `bytes_out`).
    bytes_out: u64,
    /// Forwarded to the backend's response head, once it came.
    ttfb: Option<Tick>,
    /// The backend failed after response bytes were relayed (the stream was cut).
    failure: Option<UpstreamError>,
    /// Reads the `usage` of a 2xx response as it is relayed (what the scheduler learns from).
    usage: UsageScanner,
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

impl Client {
    /// Whether the connection holds read or write buffer memory.
    fn holds_buffers(&self) -> bool {
        self.rbuf.capacity() > 0 || self.wbuf.capacity() > 0
    }
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
    /// The body being relayed (framing, bytes left, chunked decoder).
    body: BodyRelay,
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
    /// The model of each hosted scheduler.
    hosted_models: Vec<u16>,
    local: std::collections::VecDeque<Output>,
    /// Drained during shutdown (counted off `Shared::shards_busy`).
    drained: bool,
    listener: Option<TcpListener>,
    ring: Arc<ShardRing>,
    shared: Arc<Shared>,
    /// The configuration generation this shard works with (see `refresh`).
    gen: Arc<Generation>,
    metrics: Arc<ShardMetrics>,
    conns: Slab<Conn>,
    /// Idle upstream connections, `[model][backend]`.
    pools: Vec<Vec<Vec<usize>>>,
    wheel: TimerWheel<u64>,
    clock: Clock,
    rate: TickRate,
    clients: usize,
    max_clients: usize,
    shard_count: usize,
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
    /// This shard's access-log buffer, when the log is on, and the line being formatted.
    log: Option<Arc<ShardLog>>,
    log_line: Vec<u8>,
    /// S16: cuts prompts into hashed blocks (its buffer is one block, reused).
    prompt_hasher: PromptHasher,
    /// The block hashes of the last body scanned (see `client.rs`, `inference`).
    prompt_scratch: Vec<u64>,
}

#[derive(Debug, Clone, Copy)]
struct Timeouts {
    header: Tick,
    body: Tick,
    idle: Tick,
    connect: Tick,
    upstream_header: Tick,
}

impl Timeouts {
    fn of(gen: &Generation, rate: TickRate) -> Timeouts {
        let (server, upstream) = (&gen.config.server, &gen.config.upstream);
        Timeouts {
            header: rate.ticks(server.header_timeout),
            body: rate.ticks(server.body_timeout),
            idle: rate.ticks(server.idle_timeout),
            connect: rate.ticks(upstream.connect_timeout),
            upstream_header: rate.ticks(upstream.header_timeout),
        }
    }
}

/// This shard's share of `max_connections`.
fn max_clients(gen: &Generation, shard_count: usize) -> usize {
    (gen.config.server.max_connections as usize).div_ceil(shard_count).max(1)
}

/// Timers a shard may hold at once, one per connection at most: its clients, their upstream
/// exchanges, and idle upstream connections.
fn timer_capacity(gen: &Generation, max_clients: usize) -> usize {
    let idle_per_backend = gen.config.upstream.max_idle_per_backend as usize;
    let upstream_conns: usize =
        gen.models.iter().map(|m| m.backends.len() * (idle_per_backend + 1)).sum();
    2 * max_clients + upstream_conns + 16
}

impl Shard {
    fn new(setup: Setup) -> io::Result<Shard> {
        let shared = setup.shared;
        let gen = shared.generation();
        let model_count = gen.models.len();
        let clock = shared.clock.clone();
        let rate = clock.rate();
        let timeouts = Timeouts::of(&gen, rate);
        let max_clients = max_clients(&gen, setup.shard_count);
        // A reload that raises the bounds grows the wheel (`refresh`).
        let timer_capacity = timer_capacity(&gen, max_clients);
        let mut listener = setup.listener;
        setup.poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        let pools = gen.models.iter().map(|m| vec![Vec::new(); m.backends.len()]).collect();
        let now = clock.now();
        let log = shared.access_logs.get(usize::from(setup.index)).cloned();
        let metrics = Arc::clone(
            &shared.shard_metrics[usize::from(setup.index)]
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        let (hosted_models, hosted) = setup.hosted.into_iter().unzip();
        Ok(Shard {
            index: setup.index,
            poll: setup.poll,
            hosted,
            hosted_models,
            local: std::collections::VecDeque::new(),
            drained: false,
            listener: Some(listener),
            ring: setup.ring,
            metrics,
            gen,
            shared,
            conns: Slab::with_capacity(1024),
            pools,
            wheel: TimerWheel::new(timer_capacity, rate.ticks(Duration::from_millis(1)), now),
            clock,
            rate,
            clients: 0,
            max_clients,
            shard_count: setup.shard_count,
            serial: 0,
            buffered: 0,
            backlog: std::collections::VecDeque::new(),
            scratch: Vec::with_capacity(16 << 10),
            again: Vec::new(),
            dirty: vec![false; model_count],
            timeouts,
            drain_deadline: None,
            log,
            log_line: Vec::with_capacity(1024),
            prompt_hasher: PromptHasher::new(256),
            prompt_scratch: Vec::new(),
        })
    }

    fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut expired = Vec::new();
        loop {
            self.refresh();
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
                let reading = |c: &Client| matches!(c.phase, Phase::Head | Phase::Body);
                if matches!(self.conns.get(key), Some(Conn::Client(c)) if reading(c)) {
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

    // ----- live reconfiguration -----

    /// Adopts the newest configuration generation, if a reload published one: one atomic load
    /// when there is none.
    pub(super) fn refresh(&mut self) {
        let number = self.shared.generation_number.load(Ordering::Acquire);
        if number != self.gen.number {
            self.adopt(self.shared.generation());
        }
    }

    /// Switches to `gen`: grows the pools, counters and per-model scratch to its tables (indices
    /// are stable across generations), closes idle connections to backends it removed, takes
    /// the schedulers of new models this shard hosts and reconfigures the ones it hosted.
    fn adopt(&mut self, gen: Arc<Generation>) {
        for (index, model) in gen.models.iter().enumerate() {
            if index == self.pools.len() {
                self.pools.push(Vec::new());
            }
            self.pools[index].resize(model.backends.len(), Vec::new());
            for (backend, addr) in model.backends.iter().enumerate() {
                if !addr.live {
                    for up in std::mem::take(&mut self.pools[index][backend]) {
                        self.close_upstream(up);
                    }
                }
            }
        }
        self.dirty.resize(gen.models.len(), false);
        let grown = Arc::new(self.metrics.grown(&gen));
        let slot = &self.shared.shard_metrics[usize::from(self.index)];
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&grown);
        self.metrics = grown;
        self.timeouts = Timeouts::of(&gen, self.rate);
        self.max_clients = max_clients(&gen, self.shard_count);
        self.wheel.reserve(timer_capacity(&gen, self.max_clients));
        let slot = &self.shared.new_hosts[usize::from(self.index)];
        let new = std::mem::take(&mut *slot.lock().unwrap_or_else(|e| e.into_inner()));
        let now = self.clock.now();
        for (model, host) in &mut self.hosted_models.iter().zip(&mut self.hosted) {
            let m = &gen.models[usize::from(*model)];
            if m.live {
                host.reconfigure(
                    now,
                    gen.params(usize::from(*model), self.rate),
                    &m.live_backends(),
                );
            }
        }
        for (model, host) in new {
            self.hosted_models.push(model);
            self.hosted.push(host);
        }
        self.gen = gen;
    }

    // ----- shutdown (S13) -----

    /// Shutdown progress; true when the shard may exit.
    fn drain(&mut self, now: Tick) -> bool {
        if let Some(mut listener) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut listener);
            let drain = self.gen.config.server.drain_timeout;
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
                // No slot to linger in: read away what already arrived, so that the close is a
                // FIN after the 503 rather than a reset (input arriving later still resets).
                client::discard_unread(&mut stream, &mut self.scratch);
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
                    Phase::Lingering => {
                        c.gone = true;
                        self.close_client(key);
                    }
                    // Idle for IDLE_RELEASE with buffers: give them back, and close when the
                    // rest of `idle_timeout` has passed too.
                    Phase::Head if c.rlen == 0 && c.holds_buffers() => {
                        c.rbuf = Vec::new();
                        c.wbuf = Vec::new();
                        let rest = self.timeouts.idle.saturating_sub(self.rate.ticks(IDLE_RELEASE));
                        self.set_timer(key, Some(now + rest));
                    }
                    Phase::Head if c.rlen == 0 => self.close_client(key),
                    Phase::Head | Phase::Body => {
                        let message = match c.phase {
                            Phase::Head => "request head not received within server.header_timeout",
                            _ => "request body not received within server.body_timeout",
                        };
                        // The rest of the head or body may still arrive: it must not be read
                        // as a next request, so close (set before answering, which may flush
                        // and end the request at once).
                        c.closing = true;
                        let model = c.req.as_ref().and_then(|r| r.model);
                        self.router_error(key, 408, "request_timeout", message, model);
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
        match self.gen.models[usize::from(model)].inbox.push_quiet(input) {
            Ok(()) => self.dirty[usize::from(model)] = true,
            Err(input) => self.backlog.push_back((model, input)),
        }
    }

    fn flush_backlog(&mut self) {
        while let Some((model, input)) = self.backlog.pop_front() {
            match self.gen.models[usize::from(model)].inbox.push_quiet(input) {
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
        for (model, dirty) in self.gen.models.iter().zip(&mut self.dirty) {
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_hex_and_decimals_are_decimal() {
        let mut buf = [0; 19];
        assert_eq!(format_request_id(RequestId(0xab), &mut buf), b"wp-00000000000000ab");
        let mut buf = [0; 20];
        assert_eq!(crate::protocol::decimal(0, &mut buf), b"0");
        assert_eq!(crate::protocol::decimal(u64::MAX, &mut buf), b"18446744073709551615");
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

    /// Each attempt runs on a thread of its own, so a pin that works does not pin the test
    /// runner's thread.
    fn pin_on_a_new_thread(core: core_affinity::CoreId) -> Result<(), String> {
        std::thread::spawn(move || pin(3, core)).join().unwrap()
    }

    #[test]
    fn a_failed_pin_is_one_warning_naming_the_shard_and_core() {
        // CPU 1023 is the last bit of a `cpu_set_t`; the kernel drops the bits past its CPUs,
        // so on a machine with fewer than 1,024 the set is empty and sched_setaffinity fails.
        let warning = pin_on_a_new_thread(core_affinity::CoreId { id: 1023 });
        assert_eq!(
            warning,
            Err("warmpath: warning: shard 3: pinning to core 1023 failed; running unpinned".into())
        );
        // A core this process may run on pins without a word.
        let allowed = core_affinity::get_core_ids().expect("the affinity mask is readable");
        assert_eq!(pin_on_a_new_thread(allowed[0]), Ok(()));
    }
}
