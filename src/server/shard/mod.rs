//! A shard: one mio event loop (edge-triggered) on one core, and the rooms it owns, each a type
//! with its own state in its own file:
//! - [`Clients`] (`client.rs`): the listener and the client connections, from accept to
//!   close: reading requests (parsed by `protocol`), routing them, queueing them, answering and
//!   ending them, and their access-log lines; a connection and its socket I/O
//!   (`connection.rs`), the router's answers as bytes (`answer.rs`), each request's state in a
//!   reused slot (`request.rs`), which routes need an API key and the tenant it names
//!   (`auth.rs`);
//! - [`Upstreams`] (`upstream.rs`): the upstream connections and their keep-alive pools:
//!   forwarding admitted requests, relaying responses, retries;
//! - the scheduler side (`schedulers.rs`): [`Inputs`], what the shard sends to the models'
//!   inboxes, and [`Hosted`], the schedulers it runs with the decisions they make for it;
//! - the loop itself, [`Shard`] (this file): polling, timers, the configuration generation,
//!   shutdown. It owns what the rooms share and lends it to them for one call at a time, as a
//!   [`Cx`] of borrows: the generation, the counters, the clock, the timer wheel, the poll's
//!   registry and the inputs. Where a call of one connection room reaches the other (an
//!   admission forwards a request; a relay flushes the client), the other room is an argument.
//!
//! A request's walk: the shard's poll → [`Clients`] (its head and body read, parsed by
//! `protocol`) → its model's inbox ([`Inputs`], a ring) → the model's scheduler (in [`Hosted`],
//! on this shard or another) → this shard's ring (or [`Hosted`]'s local queue) → [`Upstreams`]
//! (forwarded, the response relayed as it arrives) → [`Clients`] (flushed, the request ended).
//!
//! A client connection goes through phases (`client::Phase`): `Head` (reading the request
//! head), `Body`, `Queued` (the request waits in its model's scheduler), `Upstream` (forwarded;
//! the response is relayed as it arrives), `Done` (the response is complete in the write
//! buffer; once flushed, the request ends and the next pipelined one, if any, is parsed),
//! `Lingering` (the connection closes after that answer: half-closed, its input discarded until
//! the client closes or `LINGER` passes, so that a reset cannot destroy the answer). Router
//! answers (errors, `/v1/models`, health) go straight to `Done`.
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
//! without involving the scheduler or counting towards passive ejection. Nor does a connection
//! the router cannot open for want of its own descriptors or memory: that request is answered
//! 503 (`Upstreams::short_of_resources`).

use std::io::{self, ErrorKind};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use mio::event::Event;
use mio::net::TcpListener;
use mio::{Events, Interest, Poll, Registry, Token};

use crate::clock::{Clock, Tick, TickRate};
use crate::scheduler::{Input, Output};
use crate::wheel::{TimerKey, TimerWheel};

use super::metrics::ShardMetrics;
use super::{Generation, ShardHost, ShardRing, Shared};

mod answer;
mod auth;
mod client;
mod connection;
mod limits;
mod request;
mod schedulers;
mod upstream;

use client::Clients;
use schedulers::{Hosted, Inputs};
use upstream::Upstreams;

/// The token of the shard ring's waker.
pub const WAKER: Token = Token(usize::MAX - 1);
const LISTENER: Token = Token(usize::MAX - 2);

/// Bytes read per `read` call at most (a connection's read buffer grows to this in steps).
const READ_CHUNK: usize = 64 << 10;
/// A client buffer larger than this is shrunk back to [`READ_CHUNK`] between requests. Growing
/// a buffer zero-fills it (no `unsafe` here to read into spare capacity), so a connection that
/// keeps sending large bodies keeps its buffer rather than paying a memset per request; 256 KiB
/// bounds what a busy keep-alive connection holds between requests.
const KEEP_BUFFER_MAX: usize = 256 << 10;
/// Unflushed response bytes above which the shard stops reading the backend.
const CLIENT_HIGH_WATER: usize = 256 << 10;
/// How often the loop wakes to run the timer wheel while timers are armed.
const TIMER_TICK: Duration = Duration::from_millis(5);
/// How often the loop retries inputs that did not fit a full scheduler inbox.
const BACKLOG_TICK: Duration = Duration::from_micros(200);
/// `server.busy_poll`: at most one non-blocking poll per this many nanoseconds of the spin.
const SPIN_POLL_NS: u128 = 100;

/// What a shard thread starts with.
#[derive(Debug)]
pub struct Setup {
    pub index: u16,
    pub poll: Poll,
    /// The schedulers this shard runs, with their models' indices.
    pub hosted: Vec<(u16, ShardHost)>,
    /// The generation `hosted` were built on. A reload may publish a newer one before the
    /// shard's thread starts; the shard starts on this one and adopts that at its first
    /// [`Shard::refresh`], so its schedulers are reconfigured (taking the active generation
    /// as its first would skip that, and leave them on the backends of this one).
    pub gen: Arc<Generation>,
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

/// Whose a mio token or a wheel timer is. Client and upstream connections live in two slabs
/// (one per room), so a key says which room it belongs to by a tag bit. Encoding (a token's
/// `usize`, a timer's `u64` the same value): a client connection's key in [`Clients`] as is; an
/// upstream connection's key in [`Upstreams`] with bit `usize::BITS - 2` ([`Owner::UPSTREAM`])
/// set. Client keys stay below 2^24 (`client::KEY_BITS`), upstream keys below that bit
/// (checked when one connects); [`LISTENER`] and [`WAKER`] have the top bit set, which no
/// connection's token has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Owner {
    Client(usize),
    Upstream(usize),
}

impl Owner {
    /// The tag bit of an upstream connection's token.
    const UPSTREAM: usize = 1 << (usize::BITS - 2);

    fn token(self) -> Token {
        match self {
            Owner::Client(key) => Token(key),
            Owner::Upstream(key) => Token(key | Owner::UPSTREAM),
        }
    }

    /// The owner of a connection's token (not [`LISTENER`]'s or [`WAKER`]'s).
    fn of_token(token: Token) -> Owner {
        match token.0 & Owner::UPSTREAM {
            0 => Owner::Client(token.0),
            _ => Owner::Upstream(token.0 & !Owner::UPSTREAM),
        }
    }

    fn timer(self) -> u64 {
        self.token().0 as u64
    }

    fn of_timer(value: u64) -> Owner {
        Owner::of_token(Token(value as usize))
    }
}

/// What the rooms of a shard share, lent to one call of a room: borrows of the loop's own
/// state, so that nothing is cloned per request (no `Arc` count is touched on the request
/// path). The loop makes one with [`Shard::split`] for each call it makes into a room.
struct Cx<'a> {
    /// The configuration generation the shard works with.
    gen: &'a Generation,
    /// The shard's counters (single-writer atomics).
    metrics: &'a ShardMetrics,
    clock: &'a Clock,
    rate: TickRate,
    timeouts: Timeouts,
    /// Every connection's one timer, client and upstream alike (valued by [`Owner::timer`]).
    wheel: &'a mut TimerWheel<u64>,
    /// The poll's registry: connections register and deregister themselves.
    registry: &'a Registry,
    /// The inputs to the models' schedulers.
    inputs: &'a mut Inputs,
    /// `Shared::shutting_down` (S13).
    shutting_down: &'a AtomicBool,
    /// This shard's index, the high bits of its request ids.
    shard: u16,
    /// Issue \[11\]: every tenant's rate-limit cells.
    limiter: &'a super::rate_limit::Limiter,
}

impl Cx<'_> {
    fn now(&self) -> Tick {
        self.clock.now()
    }

    /// Whether a shutdown has begun (S13).
    fn shutting_down(&self) -> bool {
        self.shutting_down.load(Ordering::Acquire)
    }

    /// Sends an input that must not be lost (see [`Inputs::send`]).
    fn send(&mut self, model: u16, input: Input) {
        self.inputs.send(self.gen, model, input);
    }

    /// Arms (or with `None` disarms) the one timer of a connection, kept in `slot`.
    fn set_timer(&mut self, slot: &mut Option<TimerKey>, owner: Owner, deadline: Option<Tick>) {
        if let Some(old) = slot.take() {
            self.wheel.cancel(old);
        }
        if let Some(deadline) = deadline {
            *slot = Some(self.wheel.insert(deadline, owner.timer()));
        }
    }
}

/// The least time between two log lines about one kind of failure that can repeat thousands
/// of times a second (running out of descriptors); a counter counts each.
const LOG_EVERY: Duration = Duration::from_secs(60);

/// When a failure of one kind was last logged: [`Occasional::due`] says whether to log it
/// again (at most once per [`LOG_EVERY`]).
#[derive(Debug, Default)]
struct Occasional(Option<Tick>);

impl Occasional {
    /// Whether a line is due now; if so, it counts as said.
    fn due(&mut self, cx: &Cx) -> bool {
        let (now, quiet) = (cx.now(), cx.rate.ticks(LOG_EVERY));
        let due = self.0.is_none_or(|at| now.saturating_sub(at) >= quiet);
        if due {
            self.0 = Some(now);
        }
        due
    }
}

/// The loop: it owns the rooms and what they share, and lends the latter to each call into a
/// room (see [`Cx`]).
struct Shard {
    index: u16,
    shard_count: usize,
    poll: Poll,
    /// Admissions and rejections from the schedulers that other shards host.
    ring: Arc<ShardRing>,
    shared: Arc<Shared>,
    /// The configuration generation this shard works with (see `refresh`).
    gen: Arc<Generation>,
    metrics: Arc<ShardMetrics>,
    clock: Clock,
    rate: TickRate,
    timeouts: Timeouts,
    wheel: TimerWheel<u64>,
    clients: Clients,
    upstreams: Upstreams,
    inputs: Inputs,
    hosted: Hosted,
    /// When a drain closes every client connection left (S13).
    drain_deadline: Option<Tick>,
    /// Drained during shutdown (counted off `Shared::shards_busy`).
    drained: bool,
}

/// A generation's timeouts, in ticks.
#[derive(Debug, Clone, Copy)]
struct Timeouts {
    header: Tick,
    body: Tick,
    idle: Tick,
    connect: Tick,
    upstream_header: Tick,
    upstream_read: Tick,
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
            upstream_read: rate.ticks(upstream.read_timeout),
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
        let (shared, gen) = (setup.shared, setup.gen);
        let clock = shared.clock.clone();
        let rate = clock.rate();
        let max_clients = max_clients(&gen, setup.shard_count);
        // A reload that raises the bounds grows the wheel (`adopt`).
        let timer_capacity = timer_capacity(&gen, max_clients);
        let mut listener = setup.listener;
        setup.poll.registry().register(&mut listener, LISTENER, Interest::READABLE)?;
        let now = clock.now();
        let log = shared.access_logs.get(usize::from(setup.index)).cloned();
        let metrics = Arc::clone(
            &shared.shard_metrics[usize::from(setup.index)]
                .lock()
                .unwrap_or_else(|e| e.into_inner()),
        );
        Ok(Shard {
            index: setup.index,
            shard_count: setup.shard_count,
            poll: setup.poll,
            ring: setup.ring,
            timeouts: Timeouts::of(&gen, rate),
            wheel: TimerWheel::new(timer_capacity, rate.ticks(Duration::from_millis(1)), now),
            clients: Clients::new(listener, max_clients, log),
            upstreams: Upstreams::new(&gen),
            inputs: Inputs::new(gen.models.len()),
            hosted: Hosted::new(setup.hosted),
            metrics,
            gen,
            shared,
            clock,
            rate,
            drain_deadline: None,
            drained: false,
        })
    }

    /// The rooms and, lent to them for one call, what they share.
    fn split(&mut self) -> (&mut Clients, &mut Upstreams, Cx<'_>) {
        let cx = Cx {
            gen: &self.gen,
            metrics: &self.metrics,
            clock: &self.clock,
            rate: self.rate,
            timeouts: self.timeouts,
            wheel: &mut self.wheel,
            registry: self.poll.registry(),
            inputs: &mut self.inputs,
            shutting_down: &self.shared.shutting_down,
            shard: self.index,
            limiter: &self.shared.limiter,
        };
        (&mut self.clients, &mut self.upstreams, cx)
    }

    fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut expired = Vec::new();
        loop {
            self.refresh();
            self.inputs.wake(&self.gen);
            let timeout = self.poll_timeout();
            // Announce sleep on every ring this loop consumes; any non-empty one means no sleep.
            let sleep = self.ring.prepare_sleep() & self.hosted.prepare_sleep();
            let timeout = if sleep { timeout } else { Some(Duration::ZERO) };
            let polled = self.poll_events(&mut events, timeout);
            self.ring.woke();
            self.hosted.woke();
            if let Err(e) = polled {
                if e.kind() != ErrorKind::Interrupted {
                    return Err(e);
                }
            }
            for event in events.iter() {
                self.event(event);
            }
            self.run_hosted();
            while let Some(output) = self.ring.pop() {
                self.decision(output);
            }
            if self.clients.accept_stalled() {
                // As for the listener's event: a connection accepted now is the newest
                // generation's.
                self.refresh();
            }
            let (clients, upstreams, mut cx) = self.split();
            clients.read_again(upstreams, &mut cx);
            clients.retry_accept(&mut cx);
            let now = self.clock.now();
            self.wheel.poll(now, &mut expired);
            for (_, value) in expired.drain(..) {
                self.expired(Owner::of_timer(value));
            }
            self.inputs.flush_backlog(&self.gen);
            if self.shared.shutting_down.load(Ordering::Acquire) && self.drain(now) {
                self.inputs.wake(&self.gen);
                return Ok(());
            }
        }
    }

    /// Waits for readiness events up to `timeout`. With `server.busy_poll` set and a wait ahead,
    /// it first polls without blocking for up to that long, so that an event which comes soon
    /// is taken without the sleep and the wake-up; the rings' wakers are eventfds registered
    /// with the poll, so a message pushed during the spin ends it too. The spin is timed on the
    /// shard's clock and also ends after one poll per [`SPIN_POLL_NS`] of it (each poll is a
    /// system call, longer than that), so a clock that does not move cannot hold it.
    fn poll_events(&mut self, events: &mut Events, timeout: Option<Duration>) -> io::Result<()> {
        let spin = self.gen.config.server.busy_poll;
        if spin.is_zero() || timeout == Some(Duration::ZERO) {
            return self.poll.poll(events, timeout);
        }
        let spin = timeout.map_or(spin, |timeout| spin.min(timeout));
        let (start, end) = (self.clock.now(), self.rate.ticks(spin));
        for _ in 0..spin.as_nanos() / SPIN_POLL_NS {
            self.poll.poll(events, Some(Duration::ZERO))?;
            if !events.is_empty() || self.clock.now().saturating_sub(start) >= end {
                break;
            }
            std::hint::spin_loop();
        }
        if !events.is_empty() {
            return Ok(());
        }
        let spent = self.rate.duration(self.clock.now().saturating_sub(start));
        self.poll.poll(events, timeout.map(|timeout| timeout.saturating_sub(spent)))
    }

    /// One readiness event: the listener's, the waker's, or a connection's (for its room).
    fn event(&mut self, event: &Event) {
        if event.token() == LISTENER {
            // A connection accepted after a reload is the new generation's (its TLS
            // certificate, for one), even when the shard slept through the publication.
            self.refresh();
        }
        let readable = event.is_readable() || event.is_read_closed();
        let (writable, hup) = (event.is_writable(), event.is_read_closed());
        let (clients, upstreams, mut cx) = self.split();
        match event.token() {
            LISTENER => clients.accept(&mut cx),
            WAKER => {}
            token => match Owner::of_token(token) {
                Owner::Client(key) => {
                    clients.ready(key, readable, writable, hup, upstreams, &mut cx);
                }
                Owner::Upstream(up) => {
                    upstreams.ready(up, readable, writable, hup, clients, &mut cx);
                }
            },
        }
    }

    /// A connection's timer fired.
    fn expired(&mut self, owner: Owner) {
        let (clients, upstreams, mut cx) = self.split();
        match owner {
            Owner::Client(key) => clients.expired(key, upstreams, &mut cx),
            Owner::Upstream(up) => upstreams.expired(up, clients, &mut cx),
        }
    }

    /// A scheduler's decision about one of this shard's requests.
    fn decision(&mut self, output: Output) {
        // An admission may name a backend that a reload added and this shard has not seen yet.
        self.refresh();
        let (clients, upstreams, mut cx) = self.split();
        clients.decision(output, upstreams, &mut cx);
    }

    /// How long the loop may block: not at all with work pending, until the hosted schedulers'
    /// next timer, and at most [`TIMER_TICK`] while connection timers are armed.
    fn poll_timeout(&self) -> Option<Duration> {
        if self.clients.has_again() || self.hosted.has_local() {
            return Some(Duration::ZERO);
        }
        let timeout = if !self.inputs.is_empty() {
            Some(BACKLOG_TICK)
        } else if !self.wheel.is_empty()
            || self.drain_deadline.is_some()
            || self.clients.accept_stalled()
        {
            Some(TIMER_TICK)
        } else {
            None
        };
        match (timeout, self.hosted.next_due(self.clock.now(), self.rate)) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// Runs the hosted schedulers over their inboxes and acts on the decisions for this
    /// shard's requests at once; a few rounds, as acting on a decision may send another input
    /// (a retry) to a hosted scheduler.
    fn run_hosted(&mut self) {
        if self.hosted.is_empty() {
            return;
        }
        for _ in 0..4 {
            let handled = self.hosted.pass(self.clock.now(), self.index);
            let decided = self.hosted.has_local();
            while let Some(output) = self.hosted.pop_local() {
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
    fn refresh(&mut self) {
        let number = self.shared.generation_number.load(Ordering::Acquire);
        if number != self.gen.number {
            self.adopt(self.shared.generation());
        }
    }

    /// Switches to `gen`: grows the pools, counters and per-model state to its tables (indices
    /// are stable across generations), closes idle connections to backends it removed, takes
    /// the schedulers of new models this shard hosts and reconfigures the ones it hosted.
    fn adopt(&mut self, gen: Arc<Generation>) {
        let grown = Arc::new(self.metrics.grown(&gen));
        let slot = &self.shared.shard_metrics[usize::from(self.index)];
        *slot.lock().unwrap_or_else(|e| e.into_inner()) = Arc::clone(&grown);
        self.metrics = grown;
        self.timeouts = Timeouts::of(&gen, self.rate);
        let max_clients = max_clients(&gen, self.shard_count);
        self.clients.set_max(max_clients);
        self.wheel.reserve(timer_capacity(&gen, max_clients));
        self.inputs.grow(gen.models.len());
        let slot = &self.shared.new_hosts[usize::from(self.index)];
        let new = std::mem::take(&mut *slot.lock().unwrap_or_else(|e| e.into_inner()));
        self.hosted.adopt(&gen, self.clock.now(), self.rate, new);
        self.gen = gen;
        let (_, upstreams, mut cx) = self.split();
        upstreams.adopt(&mut cx);
        let adopted = &self.shared.adopted[usize::from(self.index)];
        adopted.store(self.gen.number, Ordering::Release);
    }

    // ----- shutdown (S13) -----

    /// Shutdown progress; true when the shard may exit.
    fn drain(&mut self, now: Tick) -> bool {
        let drain = self.gen.config.server.drain_timeout;
        let (clients, _, mut cx) = self.split();
        // The first call stops accepting and closes idle keep-alive connections; busy ones
        // close after their response, or when the deadline passes.
        if clients.stop_accepting(&mut cx) {
            self.drain_deadline = Some(now + self.rate.ticks(drain));
        }
        if self.drain_deadline.is_some_and(|d| now >= d) {
            let (clients, upstreams, mut cx) = self.split();
            clients.all_gone(upstreams, &mut cx);
        }
        let idle = self.clients.is_empty()
            && self.inputs.is_empty()
            && !self.hosted.has_local()
            && self.hosted.is_idle();
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn owners_round_trip_through_tokens_and_timers() {
        for owner in [Owner::Client(0), Owner::Client((1 << 24) - 1), Owner::Upstream(0)] {
            assert_eq!(Owner::of_token(owner.token()), owner);
            assert_eq!(Owner::of_timer(owner.timer()), owner);
            assert_ne!(owner.token(), LISTENER);
            assert_ne!(owner.token(), WAKER);
        }
        assert_ne!(Owner::Client(5).token(), Owner::Upstream(5).token());
    }

    /// A shard not yet started, on generation 1 of `models` (name, backends), whose
    /// configuration file is `path`, as `server::start_with_source` leaves it for its thread.
    fn unstarted(path: &std::path::Path, models: &[(&str, &[&str])]) -> (Setup, Arc<Shared>) {
        use crate::control::thread::{ControlSettings, Plan};

        let config = fleet(models);
        std::fs::write(path, config.to_toml()).unwrap();
        let source = super::super::ConfigSource {
            path: path.to_owned(),
            overrides: Default::default(),
            env: |_| None,
        };
        let clock = Clock::real();
        let (mut polls, rings) = super::super::shard_polls(1).unwrap();
        let resolver = test_resolver;
        let (first, hosts) = Generation::build(1, config, None, &clock, &rings, resolver).unwrap();
        let first = Arc::new(first);
        let settings = ControlSettings::from_config(&first.config.upstream);
        let plan = Plan { targets: Vec::new(), settings };
        let logs = Vec::new();
        let shared =
            Shared::new(Arc::clone(&first), Some(source), rings, plan, logs, &clock, resolver);
        let shared = Arc::new(shared);
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        listener.set_nonblocking(true).unwrap();
        let setup = Setup {
            index: 0,
            poll: polls.remove(0),
            hosted: hosts.into_iter().map(|h| (h.model, h.host)).collect(),
            gen: first,
            listener: TcpListener::from_std(listener),
            ring: Arc::clone(&shared.rings[0]),
            shared: Arc::clone(&shared),
            core: None,
            shard_count: 1,
        };
        (setup, shared)
    }

    fn fleet(models: &[(&str, &[&str])]) -> crate::config::Config {
        let model = |(name, backends): &(&str, &[&str])| {
            let backends = backends.iter().map(|b| b.to_string()).collect();
            crate::config::ModelConfig::new(*name, backends)
        };
        crate::config::Config::with_models(models.iter().map(model).collect())
    }

    /// Writes `models` to the configuration file and reloads it, as `POST /admin/reload` does.
    fn reload(shared: &Shared, models: &[(&str, &[&str])]) {
        let path = &shared.source.as_ref().unwrap().path;
        std::fs::write(path, fleet(models).to_toml()).unwrap();
        super::super::reload::publish(shared).unwrap();
    }

    /// The backends model `model`'s hosted scheduler has, after a pass.
    fn scheduler_backends(shard: &mut Shard, model: usize) -> usize {
        shard.hosted.pass(shard.clock.now(), shard.index);
        let report = shard.gen.models[model].report.lock().unwrap();
        report.backends.len()
    }

    fn temp_config(name: &str) -> std::path::PathBuf {
        std::env::temp_dir().join(format!("warmpath-shard-{}-{name}.toml", std::process::id()))
    }

    /// The window a flaky reload test found: a reload that publishes generation 2 before a
    /// shard's thread has started. The shard starts on the generation its schedulers were built
    /// on and adopts 2 at its first refresh, so the hosted scheduler gets the added backend.
    #[test]
    fn a_reload_published_before_a_shard_starts_reaches_its_schedulers() {
        let path = temp_config("before-start");
        let (setup, shared) = unstarted(&path, &[("m", &["127.0.0.1:1"])]);
        reload(&shared, &[("m", &["127.0.0.1:1", "127.0.0.1:2"])]);
        let mut shard = Shard::new(setup).unwrap();
        shard.refresh();
        assert_eq!(shard.gen.number, 2);
        assert_eq!(scheduler_backends(&mut shard, 0), 2, "the added backend");
        let _ = std::fs::remove_file(path);
    }

    /// Two reloads before the home shard's next loop iteration: the first adds a model (its
    /// scheduler waits in the shard's mailbox, built for generation 2), the second adds a
    /// backend to it. The shard goes from 1 to 3 at once, and the new scheduler must be
    /// reconfigured to 3 as the others are.
    #[test]
    fn a_model_added_and_changed_before_its_shard_looks_gets_the_last_change() {
        let path = temp_config("two-reloads");
        let (setup, shared) = unstarted(&path, &[("m", &["127.0.0.1:1"])]);
        let mut shard = Shard::new(setup).unwrap();
        shard.refresh();
        assert_eq!(shard.gen.number, 1);
        reload(&shared, &[("m", &["127.0.0.1:1"]), ("n", &["127.0.0.1:3"])]);
        reload(&shared, &[("m", &["127.0.0.1:1"]), ("n", &["127.0.0.1:3", "127.0.0.1:4"])]);
        shard.refresh();
        assert_eq!(shard.gen.number, 3);
        assert_eq!(scheduler_backends(&mut shard, 1), 2, "the second reload's backend");
        assert_eq!(scheduler_backends(&mut shard, 0), 1);
        let _ = std::fs::remove_file(path);
    }

    /// A reload that fills the mailbox after a shard has read the generation it is adopting:
    /// the shard takes a scheduler whose model that generation does not have yet, keeps it,
    /// and configures it at the next adoption.
    #[test]
    fn a_scheduler_newer_than_the_generation_adopted_waits_for_the_next() {
        let path = temp_config("newer-host");
        let (setup, shared) = unstarted(&path, &[("m", &["127.0.0.1:1"])]);
        let mut shard = Shard::new(setup).unwrap();
        let first = shared.generation();
        reload(&shared, &[("m", &["127.0.0.1:1"]), ("n", &["127.0.0.1:3"])]);
        shard.adopt(first);
        assert_eq!(shard.gen.number, 1);
        shard.refresh();
        assert_eq!(shard.gen.number, 2);
        assert_eq!(scheduler_backends(&mut shard, 1), 1, "model n is hosted");
        let _ = std::fs::remove_file(path);
    }

    /// A reload waits for the shards: until this shard adopts the published generation, a
    /// wait for it names the shard; once it has, the wait returns at once with none behind.
    #[test]
    fn a_shard_says_which_generation_it_adopted() {
        let path = temp_config("adopted");
        let (setup, shared) = unstarted(&path, &[("m", &["127.0.0.1:1"])]);
        let mut shard = Shard::new(setup).unwrap();
        reload(&shared, &[("m", &["127.0.0.1:1", "127.0.0.1:2"])]);
        let wait = std::time::Duration::from_millis(1);
        assert_eq!(shared.await_adoption(2, wait), vec![0], "shard 0 is on generation 1");
        shard.refresh();
        assert_eq!(shared.adopted[0].load(Ordering::Acquire), 2);
        assert_eq!(shared.await_adoption(2, wait), Vec::<usize>::new());
        let _ = std::fs::remove_file(path);
    }

    /// Where `engine.test:80` resolves in these tests: 127.0.0.3 at this port.
    static ENGINE_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(1);

    fn test_resolver(authority: &str) -> Vec<std::net::SocketAddr> {
        match authority {
            "engine.test:80" => {
                let port = ENGINE_PORT.load(Ordering::Relaxed);
                vec![std::net::SocketAddr::from(([127, 0, 0, 3], port))]
            }
            other => crate::control::prober::system_resolver(other),
        }
    }

    /// A refresh (the control thread saw a backend's name move) publishes a generation only
    /// when an address changed, and the shard adopts it like a reload's.
    #[test]
    fn a_refresh_publishes_only_a_moved_address() {
        let path = temp_config("refresh");
        let (setup, shared) = unstarted(&path, &[("m", &["engine.test:80", "127.0.0.1:1"])]);
        let mut shard = Shard::new(setup).unwrap();
        super::super::reload::refresh(&shared);
        assert_eq!(shared.generation().number, 1, "nothing moved: nothing published");
        ENGINE_PORT.store(2, Ordering::Relaxed);
        super::super::reload::refresh(&shared);
        assert_eq!(shared.generation().number, 2);
        shard.refresh();
        let addrs: Vec<String> =
            shard.gen.models[0].backends.iter().map(|b| b.addr.to_string()).collect();
        assert_eq!(addrs, ["127.0.0.3:2", "127.0.0.1:1"]);
        let _ = std::fs::remove_file(path);
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
