//! `warmpath serve`: the dataplane around the scheduler core (SPEC sections 1, 2, 6).
//!
//! Threads, as [`start`] builds them:
//! - **shards** ([`shard`]), `server.shards` of them (0 = one per available core), each a mio
//!   event loop pinned to its core with its own `SO_REUSEPORT` listener, its own slabs of
//!   client and upstream connections, its own upstream keep-alive pools and its own timer
//!   wheel, in rooms with their own state (see [`shard`]). A shard owns a client
//!   connection from accept to close and every upstream connection it opens.
//! - **no scheduler threads**: each model's sans-IO scheduler runs in a [`Host`] inside one
//!   shard's event loop (model `i` on shard `i % shards`), so that shard's requests reach it
//!   without crossing threads, and the others through the model's inbox ring.
//! - **the control thread** ([`ControlThread`]): health checks and metric scrapes, sent to the
//!   schedulers as snapshots.
//! - **the admin thread** ([`admin`]): `/metrics`, `/debug/queue`, `/debug/backends`.
//!
//! Rings: every shard pushes [`Input`]s into each model's inbox (`Ring<Input, InboxWaker>`,
//! bounded MPSC, waking the hosting shard's event loop); every scheduler pushes [`Output`]s into
//! the ring of the shard that owns the request (`Ring<Output, Arc<mio::Waker>>`), waking its
//! event loop only when it sleeps. Decisions for the hosting shard itself skip the ring.

pub mod access_log;
pub mod admin;
pub mod exposition;
pub mod generation;
pub mod host;
pub mod metrics;
pub mod rate_limit;
pub mod reload;
pub mod report;
pub mod shard;
pub mod status;
pub mod tls;

#[cfg(any(test, fuzzing))]
pub mod harness;

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use socket2::{Domain, Protocol, Socket, Type};

use crate::clock::Clock;
use crate::config::{Config, Overrides, RateLimitStore};
use crate::control::prober::{system_resolver, Resolver};
use crate::control::thread::{ControlSettings, ControlThread, Names, Plan, SharedPlan};
use crate::ring::Ring;
use crate::scheduler::{Input, Output};

pub use generation::{BackendAddr, Generation, Model};
use host::Host;
use metrics::ShardMetrics;

/// A shard's inbound ring: admissions and rejections from the schedulers.
pub type ShardRing = Ring<Output, Arc<mio::Waker>>;

/// A model's scheduler as a shard hosts it.
pub type ShardHost = Host<Arc<mio::Waker>>;

/// Capacity of each shard's inbound ring and of each model's inbox.
const RING_CAPACITY: usize = 1 << 16;

/// Where the configuration came from, to read it again on a reload (SIGHUP,
/// `POST /admin/reload`): the file, with the same environment and command-line overrides.
#[derive(Debug, Clone)]
pub struct ConfigSource {
    pub path: PathBuf,
    pub overrides: Overrides,
    /// The environment lookup (`config::process_env` for the real one).
    pub env: fn(&str) -> Option<String>,
}

/// What every thread shares. The configuration lives in generations (`generation.rs`): each
/// thread holds an `Arc` of the one it works with and swaps it when `generation_number` moves.
#[derive(Debug)]
pub struct Shared {
    /// The active generation.
    current: Mutex<Arc<Generation>>,
    /// The active generation's number, read by every shard once per loop iteration (written
    /// only by a reload, so the line stays shared-clean).
    pub generation_number: AtomicU64,
    /// The generation each shard runs on, by shard index (written by the shard when it adopts
    /// one; a reload waits for every shard to reach the generation it published).
    pub adopted: Vec<AtomicU64>,
    /// The configuration file, when there is one to reload.
    pub source: Option<ConfigSource>,
    /// Schedulers of models added by a reload, waiting for their home shard to adopt them.
    pub new_hosts: Vec<Mutex<Vec<(u16, ShardHost)>>>,
    /// Every shard's inbound ring (wake a shard through it).
    pub rings: Vec<Arc<ShardRing>>,
    /// Every shard's counters; a shard replaces its own when a reload adds models or backends.
    pub shard_metrics: Vec<Mutex<Arc<ShardMetrics>>>,
    /// Every shard's access-log buffer, by shard index; empty when the log is off.
    pub access_logs: Vec<Arc<access_log::ShardLog>>,
    /// What the control thread probes.
    pub control_plan: SharedPlan,
    /// Serialises reloads (SIGHUP and `POST /admin/reload` may race).
    pub reload_lock: Mutex<()>,
    /// Reloads refused so far.
    pub reloads_refused: AtomicU64,
    /// How backends' host names resolve (the system's resolver, or a test's stand-in).
    pub resolver: Resolver,
    /// Set by [`Running::shutdown`] (S13).
    pub shutting_down: AtomicBool,
    /// Shards not yet drained; a shard exits when this reaches 0, as it may host a scheduler
    /// that the others still report to.
    pub shards_busy: AtomicUsize,
    pub clock: Clock,
    /// Issue \[11\]: every tenant's rate-limit cells, shared by the shards (and the Redis
    /// store's thread).
    pub limiter: rate_limit::Limiter,
}

impl Shared {
    /// What the threads of a router on `generation` share, with one ring per shard.
    fn new(
        generation: Arc<Generation>,
        source: Option<ConfigSource>,
        rings: Vec<Arc<ShardRing>>,
        plan: Plan,
        access_logs: Vec<Arc<access_log::ShardLog>>,
        clock: &Clock,
        resolver: Resolver,
    ) -> Shared {
        let shard_count = rings.len();
        let store = generation.config.rate_limit.store;
        let shard_metrics = (0..shard_count)
            .map(|_| Mutex::new(Arc::new(ShardMetrics::for_generation(&generation))))
            .collect();
        Shared {
            generation_number: AtomicU64::new(generation.number),
            adopted: (0..shard_count).map(|_| AtomicU64::new(generation.number)).collect(),
            current: Mutex::new(generation),
            source,
            new_hosts: (0..shard_count).map(|_| Mutex::new(Vec::new())).collect(),
            rings,
            shard_metrics,
            access_logs,
            control_plan: Arc::new(Mutex::new(Arc::new(plan))),
            reload_lock: Mutex::new(()),
            reloads_refused: AtomicU64::new(0),
            resolver,
            shutting_down: AtomicBool::new(false),
            shards_busy: AtomicUsize::new(shard_count),
            limiter: rate_limit::Limiter::new(clock.rate(), store == RateLimitStore::Redis),
            clock: clock.clone(),
        }
    }

    /// The active generation.
    pub fn generation(&self) -> Arc<Generation> {
        Arc::clone(&self.current.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Publishes `generation` (its number one above the active one's).
    fn publish(&self, generation: Arc<Generation>) {
        let number = generation.number;
        *self.current.lock().unwrap_or_else(|e| e.into_inner()) = generation;
        self.generation_number.store(number, Ordering::Release);
        for ring in &self.rings {
            ring.wake();
        }
    }

    /// Waits until every shard runs on generation `number` or a newer one, for about
    /// `timeout` (in sleeps of 100 µs: a simulated clock may stand still); returns the shards
    /// that had not by then.
    pub(crate) fn await_adoption(&self, number: u64, timeout: Duration) -> Vec<usize> {
        const NAP: Duration = Duration::from_micros(100);
        let naps = timeout.as_micros() / NAP.as_micros();
        let mut napped = 0;
        loop {
            let behind: Vec<usize> = (self.adopted.iter().enumerate())
                .filter(|(_, adopted)| adopted.load(Ordering::Acquire) < number)
                .map(|(shard, _)| shard)
                .collect();
            if behind.is_empty() || napped == naps {
                return behind;
            }
            std::thread::sleep(NAP);
            napped += 1;
        }
    }

    /// Every shard's counters as of now.
    pub fn shard_metrics(&self) -> Vec<Arc<ShardMetrics>> {
        let lock =
            |m: &Mutex<Arc<ShardMetrics>>| Arc::clone(&m.lock().unwrap_or_else(|e| e.into_inner()));
        self.shard_metrics.iter().map(lock).collect()
    }
}

/// A running router.
#[derive(Debug)]
pub struct Running {
    shared: Arc<Shared>,
    addr: SocketAddr,
    admin_addr: SocketAddr,
    shards: Vec<JoinHandle<()>>,
    control: ControlThread,
    admin: admin::AdminThread,
    access_log: Option<access_log::LogWriter>,
    /// The Redis store's thread (`rate_limit.store = "redis"`).
    store: Option<rate_limit::store::StoreThread>,
}

impl Running {
    /// The main listener's address (the actual port when the configuration said 0).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The admin listener's address.
    pub fn admin_addr(&self) -> SocketAddr {
        self.admin_addr
    }

    /// Re-reads the configuration file and applies it live (see [`reload::reload`]); returns
    /// the new generation's number, or why the file was refused (the old one stays).
    pub fn reload(&self) -> Result<u64, String> {
        reload::reload(&self.shared)
    }

    /// Wakes every shard's event loop, which then runs its hosted schedulers and its timers at
    /// the clock's current reading. Nothing needs this on the real clock; a test that moves a
    /// simulated clock calls it after each move, as no thread watches that clock (a shard
    /// blocked in `epoll_wait` would otherwise see the new time only at its next event or
    /// poll timeout, which is real time).
    pub fn wake(&self) {
        for ring in &self.shared.rings {
            ring.wake();
        }
    }

    /// The active generation's number.
    pub fn generation(&self) -> u64 {
        self.shared.generation_number.load(Ordering::Acquire)
    }

    /// Starts S13: stop accepting, answer every queued request 503, let in-flight responses
    /// finish within `drain_timeout`. Idempotent; returns at once.
    pub fn shutdown(&self) {
        if self.shared.shutting_down.swap(true, Ordering::AcqRel) {
            return;
        }
        // Under the reload lock, so that a model a concurrent reload adds gets its Shutdown too.
        let _reload = self.shared.reload_lock.lock().unwrap_or_else(|e| e.into_inner());
        for model in &self.shared.generation().models {
            while model.inbox.push(Input::Shutdown).is_err() {
                std::thread::yield_now();
            }
        }
        for ring in &self.shared.rings {
            ring.wake();
        }
    }

    /// Waits for the shards (and the schedulers they host) to drain and stop (call
    /// [`Running::shutdown`] first, or have a signal do it), then stops the control thread,
    /// the admin listener and the access log (after writing what it holds).
    pub fn wait(self) {
        for shard in self.shards {
            if shard.join().is_err() {
                eprintln!("warmpath: a shard thread panicked");
            }
        }
        self.admin.stop();
        let _ = self.control.stop();
        if let Some(store) = self.store {
            store.stop();
        }
        if let Some(log) = self.access_log {
            log.stop();
        }
    }
}

/// Binds the listeners and starts every thread on `clock`; returns once the router accepts
/// connections. Without a [`ConfigSource`] there is nothing to reload from.
///
/// `serve` passes [`Clock::real`]. Every thread reads time from `clock` only: the shards (and
/// the schedulers they host), the control thread, the admin thread and the generations built
/// by reloads. With [`Clock::simulated`] every deadline, timer and measured duration follows
/// the simulated clock, but how long a thread blocks waiting for I/O is real time, so after
/// moving the clock call [`Running::wake`] for the shards to look at it (ARCHITECTURE.md,
/// "Time").
pub fn start(config: Config, clock: Clock) -> io::Result<Running> {
    start_with_source(config, None, clock)
}

/// The most descriptors [`raise_open_file_limit`] asks for: Linux's default `fs.nr_open`, the
/// ceiling of any process's limit unless the system raised it.
const OPEN_FILES_CEILING: u64 = 1 << 20;

/// Raises this process's soft open-file limit (`RLIMIT_NOFILE`) to its hard limit (at most
/// [`OPEN_FILES_CEILING`]), as `warmpath serve` does at start: systemd and many shells start
/// services at a soft limit of 1,024, which a router with thousands of connections exhausts
/// (new connections then wait in the listen queue: `warmpath_accept_errors_total`). Returns
/// the soft limit in force after, and a warning when it is still below what
/// `max_connections` needs.
pub fn raise_open_file_limit(max_connections: u32) -> (Option<u64>, Option<String>) {
    let limit = rlimit::increase_nofile_limit(OPEN_FILES_CEILING)
        .or_else(|_| rlimit::getrlimit(rlimit::Resource::NOFILE).map(|(soft, _)| soft))
        .ok();
    (limit, limit.and_then(|limit| open_files_warning(limit, max_connections)))
}

/// Descriptors the router needs besides one per client connection and one per upstream
/// connection: listeners, epoll instances, wakers, the access log, the admin and control
/// threads' sockets.
const OPEN_FILES_SPARE: u64 = 1024;

/// The warning when `limit` descriptors cannot hold `max_connections` clients and their
/// upstream connections.
fn open_files_warning(limit: u64, max_connections: u32) -> Option<String> {
    let needed = 2 * u64::from(max_connections) + OPEN_FILES_SPARE;
    (limit < needed).then(|| {
        format!(
            "the open-file limit is {limit}, below the {needed} that server.max_connections = \
             {max_connections} may need (a descriptor per client and per upstream connection): \
             past it new connections wait in the listen queue; raise it (LimitNOFILE=, ulimit \
             -n) or lower max_connections"
        )
    })
}

/// [`start`], remembering where `config` came from so that it can be reloaded.
pub fn start_with_source(
    config: Config,
    source: Option<ConfigSource>,
    clock: Clock,
) -> io::Result<Running> {
    start_with(config, source, clock, system_resolver)
}

/// [`start_with_source`], resolving backends' host names with `resolver` (a test's stand-in
/// for DNS; the router uses the system's).
pub fn start_with(
    config: Config,
    source: Option<ConfigSource>,
    clock: Clock,
    resolver: Resolver,
) -> io::Result<Running> {
    config.validate().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let shard_count = match config.server.shards {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n as usize,
    };
    let shard_count = shard_count.min(usize::from(u16::MAX));
    // Listeners first, so a bad address fails before any thread starts.
    let (listeners, addr) = bind_shard_listeners(config.server.listen, shard_count)?;
    let admin_listener = StdListener::bind(config.server.admin_listen)?;
    let admin_addr = admin_listener.local_addr()?;
    let access_log = access_log::LogWriter::start(&config.server.access_log, shard_count)?;
    let (polls, rings) = shard_polls(shard_count)?;
    let control_settings = ControlSettings::from_config(&config.upstream);
    let (generation, new_hosts) = Generation::build(1, config, None, &clock, &rings, resolver)
        .map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
    for warning in generation.config.warnings() {
        eprintln!("warmpath: warning: {warning}");
    }
    let mut hosted: Vec<Vec<(u16, ShardHost)>> = (0..shard_count).map(|_| Vec::new()).collect();
    for new in new_hosts {
        hosted[new.home].push((new.model, new.host));
    }
    let plan = Plan { targets: generation.targets(), settings: control_settings };
    let pin_cores = generation.config.server.pin_cores;
    let logs = access_log.as_ref().map_or_else(Vec::new, |log| log.shards().to_vec());
    let generation = Arc::new(generation);
    let shared =
        Arc::new(Shared::new(Arc::clone(&generation), source, rings, plan, logs, &clock, resolver));
    let names = {
        let shared = Arc::clone(&shared);
        Names { resolver, moved: Box::new(move || reload::refresh(&shared)) }
    };
    let control = ControlThread::spawn_with_plan(Arc::clone(&shared.control_plan), clock, names)?;
    // Before the shards: a replica starts serving with the global buckets (issue [11]).
    let limits = &generation.config.rate_limit;
    let store = match limits.store {
        RateLimitStore::Redis => {
            Some(rate_limit::store::StoreThread::spawn(Arc::clone(&shared), &limits.redis_url)?)
        }
        RateLimitStore::Local => None,
    };
    // Before the shards, which may take every descriptor there is as soon as they start.
    let reserve = admin::Reserve::open();
    let parts = polls.into_iter().zip(listeners).zip(hosted);
    let shards = spawn_shards(parts, &shared, &generation, pin_cores)?;
    let admin = admin::AdminThread::spawn(admin_listener, reserve, Arc::clone(&shared))?;
    Ok(Running { shared, addr, admin_addr, shards, control, admin, access_log, store })
}

/// One `SO_REUSEPORT` listener per shard on `listen`, and the address they listen on (the
/// actual port when `listen`'s is 0).
fn bind_shard_listeners(
    listen: SocketAddr,
    shard_count: usize,
) -> io::Result<(Vec<StdListener>, SocketAddr)> {
    let first = bind_reuseport(listen)?;
    let addr = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..shard_count {
        listeners.push(bind_reuseport(addr)?);
    }
    Ok((listeners, addr))
}

/// Each shard's `Poll`, and its inbound ring, which wakes that poll.
fn shard_polls(shard_count: usize) -> io::Result<(Vec<mio::Poll>, Vec<Arc<ShardRing>>)> {
    let polls = (0..shard_count).map(|_| mio::Poll::new()).collect::<io::Result<Vec<_>>>()?;
    let mut rings = Vec::with_capacity(shard_count);
    for poll in &polls {
        let waker = Arc::new(mio::Waker::new(poll.registry(), shard::WAKER)?);
        rings.push(Arc::new(Ring::new(RING_CAPACITY, waker)));
    }
    Ok((polls, rings))
}

/// Starts one shard thread per `((poll, listener), hosted schedulers)`, pinned to the cores
/// when `pin_cores`; `generation` is the one the hosted schedulers were built on.
fn spawn_shards(
    parts: impl Iterator<Item = ((mio::Poll, StdListener), Vec<(u16, ShardHost)>)>,
    shared: &Arc<Shared>,
    generation: &Arc<Generation>,
    pin_cores: bool,
) -> io::Result<Vec<JoinHandle<()>>> {
    let shard_count = shared.rings.len();
    let cores = match pin_cores {
        true => core_affinity::get_core_ids().unwrap_or_default(),
        false => Vec::new(),
    };
    if pin_cores && cores.is_empty() {
        eprintln!(
            "warmpath: warning: pin_cores is set but no core id is available; all {shard_count} \
             shards run unpinned"
        );
    }
    let mut shards = Vec::with_capacity(shard_count);
    for (index, ((poll, listener), hosted)) in parts.enumerate() {
        let setup = shard::Setup {
            index: index as u16,
            poll,
            hosted,
            gen: Arc::clone(generation),
            listener: mio::net::TcpListener::from_std(listener),
            ring: Arc::clone(&shared.rings[index]),
            shared: Arc::clone(shared),
            core: (!cores.is_empty()).then(|| cores[index % cores.len()]),
            shard_count,
        };
        let handle = std::thread::Builder::new()
            .name(format!("shard-{index}"))
            .spawn(move || shard::run(setup))?;
        shards.push(handle);
    }
    Ok(shards)
}

/// A non-blocking listener with `SO_REUSEADDR` and `SO_REUSEPORT`, so every shard binds the
/// same address and the kernel spreads connections over them.
fn bind_reuseport(addr: SocketAddr) -> io::Result<StdListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_open_file_limit_is_raised_to_the_hard_limit_and_a_short_one_is_named() {
        let (limit, _) = raise_open_file_limit(1);
        let (soft, hard) = rlimit::getrlimit(rlimit::Resource::NOFILE).expect("getrlimit");
        assert_eq!(limit, Some(soft));
        assert_eq!(soft, hard.min(OPEN_FILES_CEILING).max(soft), "raised as far as allowed");
        assert_eq!(open_files_warning(200_000, 65_536), None);
        let warning = open_files_warning(1024, 65_536).expect("1,024 is short");
        assert!(warning.starts_with("the open-file limit is 1024, below the 132096"), "{warning}");
    }
}
