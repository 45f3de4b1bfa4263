//! The control thread: every `metrics_interval` it checks each backend's health
//! (`GET health_path`, healthy on a 2xx), scrapes its `/metrics` when its engine exports
//! metrics we read (vLLM, SGLang) and the health check passed, and pushes one
//! [`Input::Snapshot`] per backend into its model's inbox, stamped with the tick the check
//! ended. A snapshot is an admission trigger for the scheduler (SPEC S6). A backend whose
//! scrape fails reports `waiting: None` and an unknown cache: the scheduler judges it by its
//! other gates, and a positive gauge it reported before goes stale after `metrics_stale_after`.
//!
//! Backends are checked concurrently by a [`Prober`] on non-blocking sockets, each on its own
//! schedule (its next check starts an interval after its last one started, or at once when
//! that one took longer) and with its own deadlines (`connect_timeout`, then
//! `exchange_timeout`): a dead or slow backend delays only its own snapshots. The thread waits
//! in the prober's `poll`; [`ControlThread::stop`] wakes it through a mio `Waker`. The plan is
//! re-read at every wake-up (at least once an interval).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::Clock;
use crate::config::UpstreamConfig;
use crate::credential::BackendKey;
use crate::ring::{InboxWaker, Ring};
use crate::scheduler::{Input, Snapshot};

use super::probe::ProbeLimits;
use super::prober::{Prober, Resolver};
use super::scrape::{EngineKind, ScrapeLimits};

/// One backend to watch.
#[derive(Debug, Clone)]
pub struct Target {
    /// The inbox of the backend's model (what the dataplane calls `server::host::Inbox`).
    pub inbox: Arc<Ring<Input, InboxWaker>>,
    /// The backend's index in its model.
    pub backend: u16,
    /// `host:port`.
    pub addr: String,
    /// The address the dataplane sends the backend's requests to, which the checks then
    /// probe (the prober watches whether a host name still resolves to it, [`Prober`]'s
    /// module doc); `None`: the prober resolves `addr` itself.
    pub resolved: Option<SocketAddr>,
    /// Whose metrics to read; `None` for engines without metrics (`engine = "openai"`).
    pub engine: Option<EngineKind>,
    /// The `Authorization` the engine requires (`backend_api_key_file`), sent with the checks.
    pub key: Option<BackendKey>,
}

/// What the thread needs of the configuration.
#[derive(Debug, Clone)]
pub struct ControlSettings {
    pub interval: Duration,
    pub health_path: String,
    pub probe: ProbeLimits,
    pub scrape: ScrapeLimits,
}

impl ControlSettings {
    /// Settings from `[upstream]`: probes get `connect_timeout` to connect and at most the
    /// scrape interval (capped at 5 s) for the exchange.
    pub fn from_config(upstream: &UpstreamConfig) -> ControlSettings {
        let scrape = ScrapeLimits::default();
        ControlSettings {
            interval: upstream.metrics_interval,
            health_path: upstream.health_path.clone(),
            probe: ProbeLimits {
                connect_timeout: upstream.connect_timeout,
                exchange_timeout: upstream.metrics_interval.min(Duration::from_secs(5)),
                head_bytes_max: 16 << 10,
                body_bytes_max: scrape.body_bytes_max,
            },
            scrape,
        }
    }
}

/// What the thread probes and how: replaced whole on a live reload, taken by the thread at
/// its next wake-up (kept targets keep their checks in flight, `prober`'s module doc).
#[derive(Debug, Clone)]
pub struct Plan {
    pub targets: Vec<Target>,
    pub settings: ControlSettings,
}

/// A [`Plan`] that a reload can replace while the thread runs.
pub type SharedPlan = Arc<Mutex<Arc<Plan>>>;

/// How the thread resolves backends' host names, and whom it tells when one has moved (the
/// router then re-resolves its backends into a new generation, whose plan gives the checks
/// the new address).
pub struct Names {
    pub resolver: Resolver,
    pub moved: Box<dyn FnMut() + Send>,
}

impl Names {
    /// The system's resolver, and nobody told of a moved name.
    pub fn system() -> Names {
        Names { resolver: super::prober::system_resolver, moved: Box::new(|| {}) }
    }
}

impl std::fmt::Debug for Names {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Names").finish_non_exhaustive()
    }
}

/// The running control thread.
#[derive(Debug)]
pub struct ControlThread {
    stop: Arc<AtomicBool>,
    waker: mio::Waker,
    join: JoinHandle<u64>,
}

impl ControlThread {
    /// Starts watching `targets`.
    pub fn spawn(
        targets: Vec<Target>,
        settings: ControlSettings,
        clock: Clock,
    ) -> std::io::Result<ControlThread> {
        let plan = Arc::new(Mutex::new(Arc::new(Plan { targets, settings })));
        ControlThread::spawn_with_plan(plan, clock, Names::system())
    }

    /// Starts watching what `plan` says, re-read at every wake-up; `names.moved` is called on
    /// this thread when a backend's host name no longer resolves to the address its checks
    /// probe.
    pub fn spawn_with_plan(
        plan: SharedPlan,
        clock: Clock,
        names: Names,
    ) -> std::io::Result<ControlThread> {
        let first = Arc::clone(&plan.lock().unwrap_or_else(|e| e.into_inner()));
        let mut prober = Prober::new(first, clock.rate(), clock.now())?;
        prober.set_resolver(names.resolver);
        let waker = prober.waker()?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let mut moved = names.moved;
        let join = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || run(&plan, &clock, &flag, &mut prober, &mut *moved))?;
        Ok(ControlThread { stop, waker, join })
    }

    /// Stops the thread (the exchanges in flight are abandoned); returns how many snapshots
    /// did not fit their model's inbox (they are dropped: the next check sends a fresh one).
    pub fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Release);
        // A waker that fails to wake leaves the thread to see the flag within an interval.
        let _ = self.waker.wake();
        self.join.join().expect("control thread panicked")
    }
}

fn run(
    plan: &SharedPlan,
    clock: &Clock,
    stop: &AtomicBool,
    prober: &mut Prober,
    moved: &mut dyn FnMut(),
) -> u64 {
    let mut dropped = 0;
    while !stop.load(Ordering::Acquire) {
        let current = Arc::clone(&plan.lock().unwrap_or_else(|e| e.into_inner()));
        prober.set_plan(&current, clock.now());
        prober.turn(clock, &mut |target, snapshot| {
            let input = Input::Snapshot { backend: target.backend, snapshot };
            dropped += u64::from(target.inbox.push(input).is_err());
        });
        if prober.take_moved() {
            moved();
        }
    }
    dropped
}

/// One backend's health, waiting gauge and caches, checked now by the same prober as the
/// thread's (blocking until the check ends, within `connect_timeout` plus `exchange_timeout`
/// per exchange).
pub fn check(
    target: &Target,
    settings: &ControlSettings,
    clock: &Clock,
) -> std::io::Result<Snapshot> {
    let plan = Arc::new(Plan { targets: vec![target.clone()], settings: settings.clone() });
    let mut prober = Prober::new(plan, clock.rate(), clock.now())?;
    let mut snapshot = None;
    while snapshot.is_none() {
        prober.turn(clock, &mut |_, finished| snapshot = Some(finished));
    }
    Ok(snapshot.expect("the loop ends with a snapshot"))
}
