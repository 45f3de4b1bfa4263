//! The control thread: every `metrics_interval` it checks each backend's health
//! (`GET health_path`, healthy on a 2xx), scrapes its `/metrics` when its engine exports
//! metrics we read (vLLM, SGLang) and the health check passed, and pushes one
//! [`Input::Snapshot`] per backend into its model's inbox, stamped with the tick of the check.
//! A snapshot is an admission trigger for the scheduler (SPEC S6). A backend whose scrape fails
//! reports `waiting: None`: the scheduler judges it by its other gates, and a positive gauge it
//! reported before goes stale after `metrics_stale_after`.
//!
//! Backends are probed one after another, each within `connect_timeout` plus
//! `exchange_timeout`; a round that takes longer than the interval starts the next one at once.
//! Between rounds the thread parks; [`ControlThread::stop`] unparks it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::Clock;
use crate::config::UpstreamConfig;
use crate::scheduler::thread::Inbox;
use crate::scheduler::{EngineCache, Input, Snapshot};

use super::probe::{self, ProbeLimits};
use super::scrape::{parse_gauges, EngineKind, ScrapeLimits};

/// One backend to watch.
#[derive(Debug, Clone)]
pub struct Target {
    /// The inbox of the backend's model.
    pub inbox: Arc<Inbox>,
    /// The backend's index in its model.
    pub backend: u16,
    /// `host:port`.
    pub addr: String,
    /// Whose metrics to read; `None` for engines without metrics (`engine = "openai"`).
    pub engine: Option<EngineKind>,
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

/// What the thread probes and how: replaced whole on a live reload, read at the start of
/// each round.
#[derive(Debug, Clone)]
pub struct Plan {
    pub targets: Vec<Target>,
    pub settings: ControlSettings,
}

/// A [`Plan`] that a reload can replace while the thread runs.
pub type SharedPlan = Arc<Mutex<Arc<Plan>>>;

/// The running control thread.
#[derive(Debug)]
pub struct ControlThread {
    stop: Arc<AtomicBool>,
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
        ControlThread::spawn_with_plan(plan, clock)
    }

    /// Starts watching what `plan` says, re-read every round.
    pub fn spawn_with_plan(plan: SharedPlan, clock: Clock) -> std::io::Result<ControlThread> {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let join = std::thread::Builder::new()
            .name("control".into())
            .spawn(move || run(&plan, &clock, &flag))?;
        Ok(ControlThread { stop, join })
    }

    /// Stops the thread after its current probe; returns how many snapshots did not fit their
    /// model's inbox (they are dropped: the next round sends fresh ones).
    pub fn stop(self) -> u64 {
        self.stop.store(true, Ordering::Release);
        self.join.thread().unpark();
        self.join.join().expect("control thread panicked")
    }
}

fn run(plan: &SharedPlan, clock: &Clock, stop: &AtomicBool) -> u64 {
    let mut body = Vec::with_capacity(64 << 10);
    let mut dropped = 0;
    while !stop.load(Ordering::Acquire) {
        let started = clock.now();
        let round = Arc::clone(&plan.lock().unwrap_or_else(|e| e.into_inner()));
        let settings = &round.settings;
        for target in &round.targets {
            if stop.load(Ordering::Acquire) {
                break;
            }
            let snapshot = check(target, settings, clock, &mut body);
            let input = Input::Snapshot { backend: target.backend, snapshot };
            dropped += u64::from(target.inbox.push(input).is_err());
        }
        let spent = clock.rate().duration(clock.now().saturating_sub(started));
        if let Some(rest) = settings.interval.checked_sub(spent) {
            if !stop.load(Ordering::Acquire) {
                std::thread::park_timeout(rest);
            }
        }
    }
    dropped
}

/// One backend's health, waiting gauge and caches, now.
pub fn check(
    target: &Target,
    settings: &ControlSettings,
    clock: &Clock,
    body: &mut Vec<u8>,
) -> Snapshot {
    let health = probe::get(&target.addr, &settings.health_path, &settings.probe, clock, body);
    let healthy = matches!(health, Ok(status) if (200..300).contains(&status));
    let gauges = match target.engine {
        Some(kind) if healthy => {
            let scraped = probe::get(&target.addr, "/metrics", &settings.probe, clock, body);
            match scraped {
                Ok(status) if (200..300).contains(&status) => {
                    parse_gauges(kind, body, &settings.scrape).ok()
                }
                _ => None,
            }
        }
        _ => None,
    };
    Snapshot {
        healthy,
        waiting: gauges.and_then(|g| g.waiting_count()),
        scraped_at: clock.now(),
        cache: gauges.map_or(EngineCache::UNKNOWN, |g| g.cache()),
    }
}
