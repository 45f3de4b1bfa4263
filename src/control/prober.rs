//! Every backend's checks at once, on non-blocking sockets: one mio `Poll` in the control
//! thread, one [`Slot`] per backend (issue \[9\]).
//!
//! A check is the health exchange (`GET health_path`), then, when that answered 2xx and the
//! engine exports metrics we read, the metrics exchange (`GET /metrics`); it ends with one
//! [`Snapshot`] handed to the caller, except when its health exchange cannot open a connection
//! for want of the router's own descriptors or memory (`probe::short_of_resources`): that says
//! nothing of the backend, which keeps the health the last check gave it, and the check ends
//! without a snapshot. Each exchange opens its own connection (the request asks
//! the server to close it) and has its own deadlines: `connect_timeout` from the `connect`
//! until the connection is established, then `exchange_timeout` for the request and the whole
//! answer. A slot starts its next check `metrics_interval` after its last one started, or at
//! once when that check took longer. No slot waits for another: a backend whose connect hangs
//! for `connect_timeout` delays only its own snapshots, so a healthy backend's gauges stay
//! fresh however many dead backends share the thread (with blocking probes, two dead backends
//! cost 6 s per round and the gauges of every other backend went stale).
//!
//! The loop ([`Prober::turn`]) waits in `poll` until an event, the earliest due slot (a start
//! or a deadline) or at most one interval (so that a new plan is taken soon), moves every slot
//! that has an event on, and, once the earliest due tick has passed, scans the slots to start
//! due checks and fail expired exchanges. Events are edge-triggered and every action re-reads
//! the socket (`take_error`, `peer_addr`, reads and writes until `WouldBlock`), so a spurious or
//! stale event does nothing. The answer is parsed by [`super::probe::Response`] under the same
//! limits as the blocking probe.
//!
//! Buffers are per slot and reused: the request, the head being read, the body (which keeps
//! the capacity of the largest answer of its backend, at most `body_bytes_max`) and the
//! response reader; the read scratch is shared. After the first check of each backend, a check
//! that connects allocates nothing.
//!
//! Addresses: a target that carries the dataplane's address ([`Target::resolved`]) is probed
//! there, so that its checks judge the address its requests go to. When its backend is named
//! by a host name, the prober also watches the name: it has it resolved at the first check,
//! after a connect failed, and every [`RESOLVE_EVERY`], by a thread of its own (`getaddrinfo`
//! through the [`Resolver`] blocks, for as long as the DNS server takes: on the control
//! thread a hung server would hold every backend's checks; started at the first lookup, it
//! answers through a channel the prober reads at each turn); when the name no longer resolves
//! to the dataplane's address
//! (an engine's pod restarted with a new IP behind the same DNS name), [`Prober::take_moved`]
//! says so, and the router re-resolves its backends into a new generation (kubernetes
//! StatefulSet pods keep their names and change their addresses; nginx without `resolver`
//! resolves once and keeps the old address, the classic failure this avoids). A target without
//! the dataplane's address (a one-off check) is resolved by the prober when its slot has no
//! address yet or its last connect failed. An IP address is only parsed.
//!
//! A new plan (a live reload) keeps the slots of the targets it keeps (same inbox, backend
//! index, address and engine), with their exchanges in flight (a kept target that the plan
//! reaches at another address, its name having moved, reports a new engine at its next
//! snapshot, `Snapshot::new_engine`); the slots of removed targets
//! close their connections and send nothing more; new targets are checked at once. The
//! matching is quadratic in the number of targets, once per reload.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{mpsc, Arc};
use std::time::Duration;

use mio::net::TcpStream;
use mio::{Events, Interest, Poll, Registry, Token, Waker};

use crate::clock::{Clock, Tick, TickRate};
use crate::scheduler::{EngineCache, Snapshot};

use super::probe::{short_of_resources, write_request, ProbeError, ProbeLimits, Response};
use super::scrape::{parse_gauges, EngineGauges};
use super::thread::{Plan, Target};

/// How a backend's `host:port` resolves: every address it names, in the resolver's order
/// (empty when it does not resolve).
pub type Resolver = fn(&str) -> Vec<SocketAddr>;

/// The system's resolver (`getaddrinfo`); an IP address is only parsed.
pub fn system_resolver(authority: &str) -> Vec<SocketAddr> {
    match authority.parse() {
        Ok(addr) => vec![addr],
        Err(_) => authority.to_socket_addrs().map(Iterator::collect).unwrap_or_default(),
    }
}

/// Whether `authority` names its host by name (so that what it resolves to can change).
pub fn is_host_name(authority: &str) -> bool {
    authority.parse::<SocketAddr>().is_err()
}

/// Where a backend reached at `current` has moved, given what its host name resolves to
/// (`found`): the first address found, when there is one and `current` is not among them.
/// The one rule both the prober (to notice) and a new generation (to follow) apply, so that
/// they cannot disagree.
pub fn moved_to(found: &[SocketAddr], current: SocketAddr) -> Option<SocketAddr> {
    found.first().copied().filter(|_| !found.contains(&current))
}

/// How often a backend's host name is resolved again while its connects succeed.
pub const RESOLVE_EVERY: Duration = Duration::from_secs(30);

/// The token of the waker that [`super::thread::ControlThread::stop`] uses.
const WAKER: Token = Token(usize::MAX);

/// The least time between two log lines about checks the router could not open for want of its
/// own descriptors ([`Slots::short_of_resources`]).
const SHORTAGE_LOG_EVERY: Duration = Duration::from_secs(60);

/// Read scratch, shared by the slots.
const SCRATCH_BYTES: usize = 64 << 10;

/// The two exchanges of a check.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    Health,
    Metrics,
}

/// What a slot is doing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Between checks; the next starts at `Slot::due`.
    Idle,
    /// Connecting for this exchange, until `Slot::due` (`connect_timeout`).
    Connecting(Step),
    /// Sending the request and reading the answer, until `Slot::due` (`exchange_timeout`).
    Exchanging(Step),
}

/// One backend's checks.
#[derive(Debug)]
struct Slot {
    state: State,
    /// Idle: when the next check starts; otherwise when the current phase times out.
    due: Tick,
    /// When the current (or last) check started.
    started: Tick,
    /// The connection of the exchange in flight.
    stream: Option<TcpStream>,
    /// The resolved address of a target without the dataplane's; forgotten when a connect
    /// fails.
    addr: Option<SocketAddr>,
    /// When the target's host name was last resolved, to see whether it moved.
    named_at: Option<Tick>,
    /// A lookup of the name is in flight.
    asking: bool,
    /// The last connect failed (the name is resolved again at the next check).
    connect_failed: bool,
    /// The health exchange of the current check answered 2xx.
    healthy: bool,
    /// A new plan moved the target to another address (its host name moved: another engine):
    /// the next snapshot says so (`Snapshot::new_engine`).
    new_engine: bool,
    /// The request of the exchange in flight, and how much of it is sent.
    request: Vec<u8>,
    written: usize,
    /// The response head read so far, and the body.
    head: Vec<u8>,
    body: Vec<u8>,
    response: Response,
}

impl Slot {
    /// A slot whose first check starts at `now`.
    fn new(now: Tick) -> Slot {
        Slot {
            state: State::Idle,
            due: now,
            started: now,
            stream: None,
            addr: None,
            named_at: None,
            asking: false,
            connect_failed: false,
            healthy: false,
            new_engine: false,
            request: Vec::new(),
            written: 0,
            head: Vec::new(),
            body: Vec::new(),
            response: Response::new(),
        }
    }

    /// Sends what is left of the request, then reads what has arrived. `None` until the socket
    /// would block before the exchange ends; then its result (the status).
    fn pump(
        &mut self,
        scratch: &mut [u8],
        limits: &ProbeLimits,
    ) -> Option<Result<u16, ProbeError>> {
        let stream = self.stream.as_mut()?;
        while self.written < self.request.len() {
            match stream.write(&self.request[self.written..]) {
                Ok(0) => return Some(Err(ProbeError::Io(io::ErrorKind::WriteZero.into()))),
                Ok(n) => self.written += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Some(Err(ProbeError::Io(e))),
            }
        }
        loop {
            match stream.read(scratch) {
                Ok(0) => return Some(self.response.closed()),
                Ok(n) => {
                    let read = &scratch[..n];
                    match self.response.read(read, &mut self.head, &mut self.body, limits) {
                        Ok(None) => {}
                        Ok(Some(status)) => return Some(Ok(status)),
                        Err(err) => return Some(Err(err)),
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return None,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Some(Err(ProbeError::Io(e))),
            }
        }
    }
}

/// Whether a non-blocking connect has completed: `Ok(false)` while in progress.
fn connected(stream: &TcpStream) -> io::Result<bool> {
    if let Some(err) = stream.take_error()? {
        return Err(err);
    }
    match stream.peer_addr() {
        Ok(_) => Ok(true),
        Err(e) if e.kind() == io::ErrorKind::NotConnected => Ok(false),
        Err(e) => Err(e),
    }
}

/// A finished check as the scheduler takes it, durations in ticks of `rate`.
fn snapshot(
    healthy: bool,
    gauges: Option<EngineGauges>,
    (now, rate): (Tick, TickRate),
    new_engine: bool,
) -> Snapshot {
    Snapshot {
        healthy,
        waiting: gauges.and_then(|g| g.waiting_count()),
        scraped_at: now,
        cache: gauges.map_or(EngineCache::UNKNOWN, |g| g.cache(rate)),
        new_engine,
    }
}

/// What receives each finished check: the target and its snapshot.
pub type Done<'a> = dyn FnMut(&Target, Snapshot) + 'a;

/// The concurrent checks of a [`Plan`]'s targets.
#[derive(Debug)]
pub struct Prober {
    poll: Poll,
    events: Events,
    slots: Slots,
}

/// The slots and what they share; apart from the `Poll` so that events can be read while
/// slots change.
#[derive(Debug)]
struct Slots {
    plan: Arc<Plan>,
    /// `slots[i]` checks `plan.targets[i]`; its socket is registered with token `i`.
    slots: Vec<Slot>,
    rate: TickRate,
    scratch: Box<[u8]>,
    /// No slot is due before this tick.
    next_due: Tick,
    resolver: Resolver,
    /// The lookup thread, once a name needed one.
    lookups: Option<Lookups>,
    /// Some target's host name stopped resolving to the dataplane's address.
    moved: bool,
    /// When a check that could not open its connection for want of descriptors was last logged.
    shortage_logged: Option<Tick>,
}

/// Name lookups off the control thread (module doc): a thread that resolves one `host:port`
/// at a time, asked and answered through channels; it ends when the prober drops its end.
#[derive(Debug)]
struct Lookups {
    ask: mpsc::Sender<String>,
    answers: mpsc::Receiver<(String, Vec<SocketAddr>)>,
}

impl Lookups {
    fn start(resolver: Resolver) -> io::Result<Lookups> {
        let (ask, questions) = mpsc::channel::<String>();
        let (tell, answers) = mpsc::channel();
        std::thread::Builder::new().name("resolver".into()).spawn(move || {
            for authority in questions {
                let found = resolver(&authority);
                if tell.send((authority, found)).is_err() {
                    return;
                }
            }
        })?;
        Ok(Lookups { ask, answers })
    }
}

impl Prober {
    /// A prober of `plan`'s targets, each checked first at `now`.
    pub fn new(plan: Arc<Plan>, rate: TickRate, now: Tick) -> io::Result<Prober> {
        let slots = (0..plan.targets.len()).map(|_| Slot::new(now)).collect();
        Ok(Prober {
            poll: Poll::new()?,
            events: Events::with_capacity(1024),
            slots: Slots {
                plan,
                slots,
                rate,
                scratch: vec![0; SCRATCH_BYTES].into_boxed_slice(),
                next_due: now,
                resolver: system_resolver,
                lookups: None,
                moved: false,
                shortage_logged: None,
            },
        })
    }

    /// Resolves host names with `resolver` from now on.
    pub fn set_resolver(&mut self, resolver: Resolver) {
        self.slots.resolver = resolver;
    }

    /// Whether some target's host name stopped resolving to the address its checks probe since
    /// the last call (module doc).
    pub fn take_moved(&mut self) -> bool {
        std::mem::take(&mut self.slots.moved)
    }

    /// Whether a lookup of some target's host name has not been answered yet.
    pub fn names_pending(&self) -> bool {
        self.slots.slots.iter().any(|slot| slot.asking)
    }

    /// A waker that interrupts [`Prober::turn`]'s wait.
    pub fn waker(&self) -> io::Result<Waker> {
        Waker::new(self.poll.registry(), WAKER)
    }

    /// Takes `plan` if it is not the one in force (module doc: what a slot keeps).
    pub fn set_plan(&mut self, plan: &Arc<Plan>, now: Tick) {
        if !Arc::ptr_eq(&self.slots.plan, plan) {
            self.slots.replan(self.poll.registry(), plan, now);
        }
    }

    /// Waits for an event, the next due slot or one interval, whichever comes first, then moves
    /// every slot on; each check that ends goes to `done`.
    ///
    /// # Panics
    /// When `poll` fails other than by a signal (a bug: a bad descriptor or argument).
    pub fn turn(&mut self, clock: &Clock, done: &mut Done<'_>) {
        let Prober { poll, events, slots } = self;
        let now = clock.now();
        let interval = slots.plan.settings.interval;
        let wait = slots.rate.duration(slots.next_due.saturating_sub(now)).min(interval);
        match poll.poll(events, Some(wait)) {
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return,
            Err(e) => panic!("control thread: poll failed: {e}"),
        }
        let now = clock.now();
        slots.read_answers();
        for event in events.iter() {
            let index = event.token().0;
            if index < slots.slots.len() {
                slots.on_event(poll.registry(), index, now, done);
            }
        }
        if now >= slots.next_due {
            slots.scan(poll.registry(), now, done);
        }
    }
}

impl Slots {
    fn ticks(&self, duration: Duration) -> Tick {
        self.rate.ticks(duration)
    }

    /// Sets slot `index` due at `due`, keeping `next_due` a lower bound.
    fn set_due(&mut self, index: usize, due: Tick) {
        self.slots[index].due = due;
        self.next_due = self.next_due.min(due);
    }

    fn on_event(&mut self, registry: &Registry, index: usize, now: Tick, done: &mut Done<'_>) {
        match self.slots[index].state {
            State::Idle => {}
            State::Connecting(step) => {
                let Some(stream) = self.slots[index].stream.as_ref() else { return };
                match connected(stream) {
                    Ok(false) => {}
                    Ok(true) => {
                        self.slots[index].state = State::Exchanging(step);
                        let timeout = self.plan.settings.probe.exchange_timeout;
                        self.set_due(index, now.saturating_add(self.ticks(timeout)));
                        self.pump(registry, index, step, now, done);
                    }
                    Err(e) => {
                        self.end_exchange(
                            registry,
                            index,
                            step,
                            Err(ProbeError::Connect(e)),
                            now,
                            done,
                        );
                    }
                }
            }
            State::Exchanging(step) => self.pump(registry, index, step, now, done),
        }
    }

    fn pump(
        &mut self,
        registry: &Registry,
        index: usize,
        step: Step,
        now: Tick,
        done: &mut Done<'_>,
    ) {
        let limits = &self.plan.settings.probe;
        if let Some(result) = self.slots[index].pump(&mut self.scratch, limits) {
            self.end_exchange(registry, index, step, result, now, done);
        }
    }

    /// Starts due checks and fails expired exchanges; recomputes `next_due`.
    fn scan(&mut self, registry: &Registry, now: Tick, done: &mut Done<'_>) {
        let mut next_due = Tick::MAX;
        for index in 0..self.slots.len() {
            let slot = &self.slots[index];
            if slot.due <= now {
                match slot.state {
                    State::Idle => self.start_check(registry, index, now, done),
                    State::Connecting(step) => {
                        let timed_out = ProbeError::Connect(io::ErrorKind::TimedOut.into());
                        self.end_exchange(registry, index, step, Err(timed_out), now, done);
                    }
                    State::Exchanging(step) => {
                        let timed_out = ProbeError::Io(io::ErrorKind::TimedOut.into());
                        self.end_exchange(registry, index, step, Err(timed_out), now, done);
                    }
                }
            }
            next_due = next_due.min(self.slots[index].due);
        }
        self.next_due = next_due;
    }

    fn start_check(&mut self, registry: &Registry, index: usize, now: Tick, done: &mut Done<'_>) {
        self.watch_name(index, now);
        let slot = &mut self.slots[index];
        slot.started = now;
        slot.healthy = false;
        self.start_exchange(registry, index, Step::Health, now, done);
    }

    /// Asks for target `index`'s host name to be resolved when that is due (module doc).
    fn watch_name(&mut self, index: usize, now: Tick) {
        let target = &self.plan.targets[index];
        if target.resolved.is_none() || !is_host_name(&target.addr) {
            return;
        }
        let every = self.rate.ticks(RESOLVE_EVERY);
        let slot = &mut self.slots[index];
        let due = slot.connect_failed || slot.named_at.is_none_or(|at| now >= at + every);
        if !due || slot.asking {
            return;
        }
        if self.lookups.is_none() {
            match Lookups::start(self.resolver) {
                Ok(lookups) => self.lookups = Some(lookups),
                // Tried again at the next check that is due.
                Err(e) => return eprintln!("warmpath: control: no resolver thread: {e}"),
            }
        }
        let lookups = self.lookups.as_ref().expect("started above");
        slot.named_at = Some(now);
        slot.connect_failed = false;
        slot.asking = lookups.ask.send(target.addr.clone()).is_ok();
    }

    /// Takes the lookups answered since the last turn: a target whose name resolves (to
    /// anything) but not to the dataplane's address has moved.
    fn read_answers(&mut self) {
        let Some(lookups) = &self.lookups else { return };
        while let Ok((authority, found)) = lookups.answers.try_recv() {
            let targets = self.plan.targets.iter().zip(&mut self.slots);
            for (target, slot) in targets.filter(|(t, _)| t.addr == authority) {
                slot.asking = false;
                self.moved |= target.resolved.and_then(|addr| moved_to(&found, addr)).is_some();
            }
        }
    }

    /// Opens the connection of `step`'s exchange; a failure to start ends it at once.
    fn start_exchange(
        &mut self,
        registry: &Registry,
        index: usize,
        step: Step,
        now: Tick,
        done: &mut Done<'_>,
    ) {
        let plan = Arc::clone(&self.plan);
        let (target, settings) = (&plan.targets[index], &plan.settings);
        let slot = &mut self.slots[index];
        let path = match step {
            Step::Health => settings.health_path.as_str(),
            Step::Metrics => "/metrics",
        };
        write_request(&mut slot.request, &target.addr, path, target.key.as_ref());
        slot.written = 0;
        slot.head.clear();
        slot.body.clear();
        slot.response = Response::new();
        let resolver = self.resolver;
        let first = || resolver(&target.addr).first().copied();
        let Some(addr) = target.resolved.or(slot.addr).or_else(first) else {
            let failed = ProbeError::Resolve(target.addr.clone());
            return self.end_exchange(registry, index, step, Err(failed), now, done);
        };
        slot.addr = Some(addr);
        let connect = TcpStream::connect(addr).and_then(|mut stream| {
            registry.register(
                &mut stream,
                Token(index),
                Interest::READABLE | Interest::WRITABLE,
            )?;
            Ok(stream)
        });
        match connect {
            Ok(stream) => {
                slot.stream = Some(stream);
                slot.state = State::Connecting(step);
                let due = now.saturating_add(self.ticks(settings.probe.connect_timeout));
                self.set_due(index, due);
            }
            Err(e) => {
                self.end_exchange(registry, index, step, Err(ProbeError::Connect(e)), now, done);
            }
        }
    }

    /// Closes `step`'s exchange with its `result`: the health exchange goes on to the metrics
    /// one or ends the check; the metrics exchange ends it.
    fn end_exchange(
        &mut self,
        registry: &Registry,
        index: usize,
        step: Step,
        result: Result<u16, ProbeError>,
        now: Tick,
        done: &mut Done<'_>,
    ) {
        let slot = &mut self.slots[index];
        if let Some(mut stream) = slot.stream.take() {
            // Closing the socket removes it from the epoll set anyway.
            let _ = registry.deregister(&mut stream);
        }
        if let (Step::Health, Err(ProbeError::Connect(e))) = (step, &result) {
            if short_of_resources(e) {
                return self.short_of_resources(index, e, now);
            }
        }
        if matches!(result, Err(ProbeError::Connect(_) | ProbeError::Resolve(_))) {
            slot.addr = None;
            slot.connect_failed = true;
        }
        let ok = matches!(result, Ok(status) if (200..300).contains(&status));
        let engine = self.plan.targets[index].engine;
        let gauges = match (step, engine) {
            (Step::Health, Some(_)) if ok => {
                slot.healthy = true;
                return self.start_exchange(registry, index, Step::Metrics, now, done);
            }
            (Step::Health, _) => {
                slot.healthy = ok;
                None
            }
            (Step::Metrics, Some(kind)) if ok => {
                parse_gauges(kind, &slot.body, &self.plan.settings.scrape).ok()
            }
            (Step::Metrics, _) => None,
        };
        let new_engine = std::mem::take(&mut slot.new_engine);
        done(
            &self.plan.targets[index],
            snapshot(slot.healthy, gauges, (now, self.rate), new_engine),
        );
        self.end_check(index, now);
    }

    /// Slot `index`'s check is over: it idles until its next one, `metrics_interval` after this
    /// one started (at once if that has passed).
    fn end_check(&mut self, index: usize, now: Tick) {
        let interval = self.ticks(self.plan.settings.interval);
        let slot = &mut self.slots[index];
        slot.state = State::Idle;
        let next = slot.started.saturating_add(interval).max(now);
        self.set_due(index, next);
    }

    /// A check of slot `index` could not open its connection for want of the router's own
    /// descriptors or memory (`error`). That says nothing of the backend: no snapshot, so its
    /// health and gauges stay as the last check left them (the gauges age towards
    /// `metrics_stale_after` as any unanswered scrape's do), and the next check is at its usual
    /// time. Counted as a failed health check, a router out of descriptors took every healthy
    /// backend out of service until its next checks after they freed up. Logged once a minute
    /// at most.
    fn short_of_resources(&mut self, index: usize, error: &io::Error, now: Tick) {
        let every = self.ticks(SHORTAGE_LOG_EVERY);
        if self.shortage_logged.is_none_or(|at| now.saturating_sub(at) >= every) {
            self.shortage_logged = Some(now);
            eprintln!(
                "warmpath: control: cannot open a connection to check {}: {error}; its health \
                 stays as it was (raise the open-file limit, e.g. LimitNOFILE)",
                self.plan.targets[index].addr
            );
        }
        self.end_check(index, now);
    }

    /// Replaces the plan: kept targets keep their slots (re-registered under their new index),
    /// removed ones close theirs, new ones are due at once.
    fn replan(&mut self, registry: &Registry, plan: &Arc<Plan>, now: Tick) {
        let same = |a: &Target, b: &Target| {
            Arc::ptr_eq(&a.inbox, &b.inbox)
                && a.backend == b.backend
                && a.addr == b.addr
                && a.engine == b.engine
        };
        let mut old: Vec<Option<Slot>> =
            std::mem::take(&mut self.slots).into_iter().map(Some).collect();
        for (index, target) in plan.targets.iter().enumerate() {
            let kept = (self.plan.targets.iter().enumerate())
                .position(|(j, t)| old[j].is_some() && same(t, target));
            // Kept with another address: its name moved, to another engine.
            let moved = kept.is_some_and(|j| {
                let was = self.plan.targets[j].resolved;
                was.is_some() && target.resolved.is_some() && was != target.resolved
            });
            let mut slot = kept.and_then(|j| old[j].take()).unwrap_or_else(|| Slot::new(now));
            slot.new_engine |= moved;
            if let Some(stream) = slot.stream.as_mut() {
                let interest = Interest::READABLE | Interest::WRITABLE;
                if registry.reregister(stream, Token(index), interest).is_err() {
                    // Cannot happen to a registered socket; if it did, the exchange times out.
                    slot.stream = None;
                }
            }
            self.slots.push(slot);
        }
        for mut stream in old.into_iter().flatten().filter_map(|slot| slot.stream) {
            let _ = registry.deregister(&mut stream);
        }
        self.plan = Arc::clone(plan);
        self.next_due = now;
    }
}
