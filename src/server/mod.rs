//! `warmpath serve`: the dataplane around the scheduler core (SPEC sections 1, 2, 6).
//!
//! Threads, as [`start`] builds them:
//! - **shards** ([`shard`]), `server.shards` of them (0 = one per available core), each a mio
//!   event loop pinned to its core with its own `SO_REUSEPORT` listener, its own connection
//!   slab, its own upstream keep-alive pools and its own timer wheel. A shard owns a client
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

pub mod admin;
pub mod metrics;
pub mod shard;

#[cfg(any(test, fuzzing))]
pub mod harness;

use std::io;
use std::net::{SocketAddr, TcpListener as StdListener, ToSocketAddrs};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use hashbrown::HashMap;
use socket2::{Domain, Protocol, Socket, Type};

use crate::clock::Clock;
use crate::config::{Config, Engine};
use crate::control::scrape::EngineKind;
use crate::control::thread::{ControlSettings, ControlThread, Target};
use crate::protocol::Limits;
use crate::ring::Ring;
use crate::scheduler::thread::{Host, Inbox, InboxWaker, Report};
use crate::scheduler::{Input, Output, Params, Scheduler};

use metrics::ShardMetrics;

/// A shard's inbound ring: admissions and rejections from the schedulers.
pub type ShardRing = Ring<Output, Arc<mio::Waker>>;

/// A model's scheduler as a shard hosts it.
pub type ShardHost = Host<Arc<mio::Waker>>;

/// Capacity of each shard's inbound ring and of each model's inbox.
const RING_CAPACITY: usize = 1 << 16;

/// One backend of a model, resolved at start.
#[derive(Debug, Clone)]
pub struct BackendAddr {
    /// The resolved address.
    pub addr: SocketAddr,
    /// `host:port` as configured: the `Host` sent to an HTTP/1.0 client's backend, and the
    /// metrics label.
    pub authority: String,
}

/// A model as the dataplane sees it.
#[derive(Debug)]
pub struct Model {
    pub name: String,
    /// The in-place rewrite of `"model"`: `upstream_model` as a JSON string token.
    pub upstream_model_json: Option<Vec<u8>>,
    /// The session header, lowercase.
    pub session_header: String,
    pub backends: Vec<BackendAddr>,
    pub inbox: Arc<Inbox>,
    pub report: Arc<Mutex<Report>>,
}

/// What every thread shares, read-only after start except the flags.
#[derive(Debug)]
pub struct Shared {
    pub config: Config,
    pub models: Vec<Model>,
    /// Model name to index.
    pub by_name: HashMap<String, u16>,
    /// Request limits of `[server]` with `[queue].session_header`.
    pub limits: Limits,
    /// Every shard's inbound ring (wake a shard through it).
    pub rings: Vec<Arc<ShardRing>>,
    /// Every shard's counters.
    pub shard_metrics: Vec<Arc<ShardMetrics>>,
    /// Set by [`Running::shutdown`] (S13).
    pub shutting_down: AtomicBool,
    /// Shards not yet drained; a shard exits when this reaches 0, as it may host a scheduler
    /// that the others still report to.
    pub shards_busy: AtomicUsize,
    pub clock: Clock,
    /// The body of `GET /v1/models`.
    pub models_json: Vec<u8>,
}

impl Shared {
    /// Whether every model has at least one healthy, non-ejected backend (`/readyz`).
    pub fn ready(&self) -> bool {
        self.models.iter().all(|model| {
            let report = model.report.lock().unwrap_or_else(|e| e.into_inner());
            report.backends.iter().any(|b| b.healthy && !b.ejected)
        })
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

    /// Starts S13: stop accepting, answer every queued request 503, let in-flight responses
    /// finish within `drain_timeout`. Idempotent; returns at once.
    pub fn shutdown(&self) {
        if self.shared.shutting_down.swap(true, Ordering::AcqRel) {
            return;
        }
        for model in &self.shared.models {
            while model.inbox.push(Input::Shutdown).is_err() {
                std::thread::yield_now();
            }
        }
        for ring in &self.shared.rings {
            ring.wake();
        }
    }

    /// Waits for the shards (and the schedulers they host) to drain and stop (call
    /// [`Running::shutdown`] first, or have a signal do it), then stops the control thread and
    /// the admin listener.
    pub fn wait(self) {
        for shard in self.shards {
            if shard.join().is_err() {
                eprintln!("warmpath: a shard thread panicked");
            }
        }
        self.admin.stop();
        let _ = self.control.stop();
    }
}

/// Binds the listeners and starts every thread; returns once the router accepts connections.
pub fn start(config: Config) -> io::Result<Running> {
    config.validate().map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let clock = Clock::real();
    let shard_count = match config.server.shards {
        0 => std::thread::available_parallelism().map_or(1, |n| n.get()),
        n => n as usize,
    };
    let shard_count = shard_count.min(usize::from(u16::MAX));

    // Listeners first, so a bad address fails before any thread starts.
    let first = bind_reuseport(config.server.listen)?;
    let addr = first.local_addr()?;
    let mut listeners = vec![first];
    for _ in 1..shard_count {
        listeners.push(bind_reuseport(addr)?);
    }
    let admin_listener = StdListener::bind(config.server.admin_listen)?;
    let admin_addr = admin_listener.local_addr()?;

    let polls = (0..shard_count).map(|_| mio::Poll::new()).collect::<io::Result<Vec<_>>>()?;
    let mut wakers = Vec::with_capacity(shard_count);
    let mut rings = Vec::with_capacity(shard_count);
    for poll in &polls {
        let waker = Arc::new(mio::Waker::new(poll.registry(), shard::WAKER)?);
        rings.push(Arc::new(Ring::new(RING_CAPACITY, Arc::clone(&waker))));
        wakers.push(waker);
    }

    let mut models = Vec::with_capacity(config.models.len());
    let mut hosted: Vec<Vec<ShardHost>> = (0..shard_count).map(|_| Vec::new()).collect();
    let mut targets = Vec::new();
    for (index, model) in config.models.iter().enumerate() {
        let params = Params::for_model(model, &config.upstream, clock.rate());
        let scheduler = Scheduler::new(params, clock.now());
        let home = index % shard_count;
        let inbox = Arc::new(Ring::new(RING_CAPACITY, InboxWaker::Loop(Arc::clone(&wakers[home]))));
        let host = Host::new(scheduler, Arc::clone(&inbox), rings.clone());
        let mut backends = Vec::with_capacity(model.backends.len());
        for (index, authority) in (0u16..).zip(&model.backends) {
            let resolved = authority.to_socket_addrs().ok().and_then(|mut a| a.next());
            let Some(resolved) = resolved else {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("model {:?}: backend {authority:?} does not resolve", model.name),
                ));
            };
            backends.push(BackendAddr { addr: resolved, authority: authority.clone() });
            targets.push(Target {
                inbox: Arc::clone(&inbox),
                backend: index,
                addr: authority.clone(),
                engine: engine_kind(model.engine),
            });
        }
        models.push(Model {
            name: model.name.clone(),
            upstream_model_json: model.upstream_model.as_deref().map(|name| {
                let mut json = Vec::new();
                crate::protocol::write_json_string(name, &mut json);
                json
            }),
            session_header: model.queue.session_header.to_ascii_lowercase(),
            backends,
            inbox,
            report: Arc::clone(host.report()),
        });
        hosted[home].push(host);
    }
    let by_name = (0u16..).zip(&models).map(|(i, m)| (m.name.clone(), i)).collect();
    let backend_counts: Vec<usize> = models.iter().map(|m| m.backends.len()).collect();
    let shard_metrics =
        (0..shard_count).map(|_| Arc::new(ShardMetrics::new(&backend_counts))).collect();
    let limits = Limits {
        max_header_bytes: config.server.max_header_bytes as usize,
        max_body_bytes: config.server.max_body_bytes,
        session_header: config.queue.session_header.to_ascii_lowercase(),
        ..Limits::default()
    };
    let models_json = models_json(&models);
    let control_settings = ControlSettings::from_config(&config.upstream);
    let shared = Arc::new(Shared {
        config,
        models,
        by_name,
        limits,
        rings: rings.clone(),
        shard_metrics,
        shutting_down: AtomicBool::new(false),
        shards_busy: AtomicUsize::new(shard_count),
        clock: clock.clone(),
        models_json,
    });

    let control = ControlThread::spawn(targets, control_settings, clock.clone())?;
    let cores = match shared.config.server.pin_cores {
        true => core_affinity::get_core_ids().unwrap_or_default(),
        false => Vec::new(),
    };
    let mut shards = Vec::with_capacity(shard_count);
    let shard_parts = polls.into_iter().zip(listeners).zip(hosted);
    for (index, ((poll, listener), hosted)) in shard_parts.enumerate() {
        let setup = shard::Setup {
            index: index as u16,
            poll,
            hosted,
            listener: mio::net::TcpListener::from_std(listener),
            ring: Arc::clone(&rings[index]),
            shared: Arc::clone(&shared),
            core: (!cores.is_empty()).then(|| cores[index % cores.len()]),
            shard_count,
        };
        let handle = std::thread::Builder::new()
            .name(format!("shard-{index}"))
            .spawn(move || shard::run(setup))?;
        shards.push(handle);
    }
    let admin = admin::AdminThread::spawn(admin_listener, Arc::clone(&shared))?;
    Ok(Running { shared, addr, admin_addr, shards, control, admin })
}

/// A non-blocking listener with `SO_REUSEADDR` and `SO_REUSEPORT`, so every shard binds the
/// same address and the kernel spreads connections over them.
fn bind_reuseport(addr: SocketAddr) -> io::Result<std::net::TcpListener> {
    let socket = Socket::new(Domain::for_address(addr), Type::STREAM, Some(Protocol::TCP))?;
    socket.set_reuse_address(true)?;
    socket.set_reuse_port(true)?;
    socket.set_nonblocking(true)?;
    socket.bind(&addr.into())?;
    socket.listen(1024)?;
    Ok(socket.into())
}

fn engine_kind(engine: Engine) -> Option<EngineKind> {
    EngineKind::for_engine(engine)
}

/// `{"object":"list","data":[{"id":...,"object":"model","created":0,"owned_by":"warmpath"}]}`.
fn models_json(models: &[Model]) -> Vec<u8> {
    let data: Vec<serde_json::Value> = models
        .iter()
        .map(|m| {
            serde_json::json!({"id": m.name, "object": "model", "created": 0, "owned_by": "warmpath"})
        })
        .collect();
    serde_json::to_vec(&serde_json::json!({"object": "list", "data": data}))
        .expect("serialising a JSON value")
}
