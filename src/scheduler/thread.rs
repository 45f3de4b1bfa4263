//! What runs a model's sans-IO [`Scheduler`]: a [`Host`] drains the model's inbound ring (from
//! the shards and the control thread), feeds each input to the scheduler with the current
//! tick, sends every admission and rejection to the ring of the shard that owns the request
//! (the shard index is in the [`RequestId`]), and publishes a [`Report`] for the admin
//! endpoints. Whoever drives the host also sleeps until the next message or the next timer the
//! scheduler reports, so a queue deadline or the end of a grace window is acted on when it
//! falls due, with no traffic to trigger it (SPEC section 9, defect 1).
//!
//! Two drivers: `warmpath serve` runs each host inside a shard's event loop (the shard's own
//! requests then reach their scheduler without crossing threads; see `server::shard`), and
//! [`SchedulerThread`] runs one on a dedicated thread (used by tests and embedders).
//!
//! Nothing is lost to a full shard ring: decisions that do not fit wait in a per-shard backlog,
//! in order, and the driver retries them every [`BACKLOG_RETRY`] until they fit. A full inbound
//! ring is the producers' concern: `Ring::push` hands the message back and the shard answers
//! the client itself (503) or retries.
//!
//! The host is the only writer of its scheduler's state (an architecture invariant): the
//! scheduler moves into it and comes back out of [`Host::into_scheduler`].

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use crate::clock::{Clock, Tick};
use crate::ring::{Ring, Wake};

use super::estimate::{BackendEstimates, TokenRate};
use super::{Input, Lane, Output, Scheduler, Stats};

/// Inputs handled per pass before delivering and looking at the clock again.
const BATCH: usize = 256;
/// How soon a thread with undelivered decisions looks at the full shard rings again.
pub const BACKLOG_RETRY: Duration = Duration::from_micros(50);

/// Wakes the thread that registered as a ring's consumer (before it registers, it has not slept
/// yet, so there is nothing to wake).
#[derive(Debug, Default)]
pub struct ThreadWaker(OnceLock<Thread>);

impl ThreadWaker {
    /// Makes the calling thread the one to wake; the first registration stays.
    pub fn register(&self) {
        self.0.get_or_init(std::thread::current);
    }
}

impl Wake for ThreadWaker {
    fn wake(&self) {
        if let Some(thread) = self.0.get() {
            thread.unpark();
        }
    }
}

/// Wakes whatever drives a model's [`Host`]: a dedicated thread, or a shard's event loop.
#[derive(Debug)]
pub enum InboxWaker {
    /// A [`SchedulerThread`].
    Thread(ThreadWaker),
    /// A shard's mio `Poll` (one `Waker` per `Poll`, shared with the shard's own ring).
    Loop(Arc<mio::Waker>),
}

impl Default for InboxWaker {
    fn default() -> Self {
        InboxWaker::Thread(ThreadWaker::default())
    }
}

impl Wake for InboxWaker {
    fn wake(&self) {
        match self {
            InboxWaker::Thread(thread) => thread.wake(),
            InboxWaker::Loop(waker) => waker.wake(),
        }
    }
}

/// A model's inbound ring: shards and the control thread push [`Input`]s into it.
pub type Inbox = Ring<Input, InboxWaker>;

/// A scheduler's counters and gauges as of the end of its thread's last pass that changed
/// anything: what the admin endpoints read. The thread copies them in place (no allocation)
/// under an uncontended mutex; a scrape holds it for the time of a copy.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub stats: Stats,
    /// Queued requests per lane, indexed by `Lane as usize`.
    pub depth: [u32; 4],
    pub inflight: u32,
    pub sessions_tracked: usize,
    /// See [`Scheduler::oldest_arrival`].
    pub oldest_arrival: Option<Tick>,
    pub backends: Vec<BackendReport>,
    /// The model's learned tokens per byte of request body.
    pub token_rate: TokenRate,
}

/// One backend in a [`Report`].
#[derive(Debug, Clone, Copy, Default)]
pub struct BackendReport {
    pub inflight: u32,
    pub prefill_tokens: u64,
    pub holds: u32,
    pub healthy: bool,
    pub ejected: bool,
    /// Removed from the configuration by a reload (its in-flight requests finish).
    pub removed: bool,
    pub waiting: Option<u32>,
    pub scraped_at: Tick,
    /// S16: blocks in the backend's prefix index.
    pub index_blocks: u64,
    /// What the scheduler learned of the backend (issue [8]).
    pub estimates: BackendEstimates,
}

impl Report {
    /// The report of `scheduler` now.
    pub fn of(scheduler: &Scheduler) -> Report {
        let mut report = Report {
            backends: vec![BackendReport::default(); usize::from(scheduler.params().backends)],
            ..Report::default()
        };
        report.fill(scheduler);
        report
    }

    fn fill(&mut self, scheduler: &Scheduler) {
        self.stats.clone_from(scheduler.stats());
        for lane in Lane::ALL {
            self.depth[lane as usize] = scheduler.depth(lane);
        }
        self.inflight = scheduler.inflight();
        self.sessions_tracked = scheduler.sessions_tracked();
        self.oldest_arrival = scheduler.oldest_arrival();
        self.token_rate = scheduler.token_rate();
        self.backends.resize(usize::from(scheduler.params().backends), BackendReport::default());
        for (index, backend) in (0u16..).zip(&mut self.backends) {
            let (healthy, ejected) = scheduler.backend_health(index);
            let (waiting, scraped_at) = scheduler.backend_waiting(index);
            *backend = BackendReport {
                inflight: scheduler.backend_inflight(index),
                prefill_tokens: scheduler.backend_prefill_tokens(index),
                holds: scheduler.backend_holds(index),
                healthy,
                ejected,
                removed: scheduler.backend_removed(index),
                waiting,
                scraped_at,
                index_blocks: scheduler.prefix_index_len(index) as u64,
                estimates: scheduler.backend_estimates(index),
            };
        }
    }
}

/// A model's scheduler with its inbox, its outbound rings and its published report: one pass
/// of the loop that drives it, whoever the driver is.
#[derive(Debug)]
pub struct Host<W> {
    scheduler: Scheduler,
    inbox: Arc<Inbox>,
    report: Arc<Mutex<Report>>,
    shards: Vec<Arc<Ring<Output, W>>>,
    /// Decisions that did not fit their shard's ring, oldest first.
    backlog: Vec<VecDeque<Output>>,
    out: Vec<Output>,
    /// Which shards received decisions in this pass (reused).
    sent: Vec<bool>,
    /// A timer fired since the report was published.
    ticked: bool,
}

impl<W: Wake> Host<W> {
    /// Hosts `scheduler`, reading `inbox`; decisions go to `shards[request.shard()]`.
    pub fn new(scheduler: Scheduler, inbox: Arc<Inbox>, shards: Vec<Arc<Ring<Output, W>>>) -> Self {
        let report = Arc::new(Mutex::new(Report::of(&scheduler)));
        Host {
            scheduler,
            inbox,
            report,
            backlog: shards.iter().map(|_| VecDeque::new()).collect(),
            sent: vec![false; shards.len()],
            shards,
            out: Vec::with_capacity(BATCH * 2),
            ticked: false,
        }
    }

    /// The ring to push inputs into.
    pub fn inbox(&self) -> &Arc<Inbox> {
        &self.inbox
    }

    /// The scheduler's counters and gauges, as of the last published pass.
    pub fn report(&self) -> &Arc<Mutex<Report>> {
        &self.report
    }

    /// A live reconfiguration of the hosted scheduler (see [`Scheduler::reconfigure`]); its
    /// decisions go out with the next [`Host::pass`], which also publishes the report.
    pub fn reconfigure(&mut self, now: Tick, params: super::Params, live: &[bool]) {
        self.scheduler.reconfigure(now, params, live, &mut self.out);
        self.ticked = true;
    }

    /// When the scheduler next needs a tick.
    pub fn next_wakeup(&self) -> Option<Tick> {
        self.scheduler.next_wakeup()
    }

    /// Whether decisions wait for a full shard ring.
    pub fn backlogged(&self) -> bool {
        self.backlog.iter().any(|queue| !queue.is_empty())
    }

    /// Handles up to [`BATCH`] inputs (or a tick when a timer is due and no input came),
    /// delivers the decisions and publishes the report if anything changed. Decisions for shard
    /// `local`, when given, are appended to `local_out` instead of its ring: the caller is that
    /// shard. Returns the inputs handled.
    pub fn pass(&mut self, now: Tick, local: Option<(u16, &mut VecDeque<Output>)>) -> usize {
        let mut handled = 0;
        while handled < BATCH {
            let Some(input) = self.inbox.pop() else { break };
            self.scheduler.handle(now, input, &mut self.out);
            handled += 1;
        }
        if handled == 0 && self.scheduler.next_wakeup().is_some_and(|at| at <= now) {
            self.scheduler.handle(now, Input::Tick, &mut self.out);
            self.ticked = true;
        }
        if let Some((shard, local_out)) = local {
            let shard = usize::from(shard);
            let backlog_empty = self.backlog[shard].is_empty();
            // The local shard's decisions skip its ring (there is no backlog for it to respect).
            debug_assert!(backlog_empty, "the local shard has no ring backlog");
            self.out.retain(|output| {
                let mine = usize::from(output_id(output).shard()) == shard;
                if mine {
                    local_out.push_back(*output);
                }
                !mine
            });
        }
        self.deliver();
        if handled > 0 || self.ticked {
            self.ticked = false;
            let mut report = self.report.lock().unwrap_or_else(|e| e.into_inner());
            report.fill(&self.scheduler);
        }
        handled
    }

    /// Sends this pass's decisions, after any older ones still waiting for the same shard, and
    /// wakes each shard that received some once (one eventfd write per pass, not per decision).
    fn deliver(&mut self) {
        let sent = &mut self.sent;
        sent.fill(false);
        for ((shard, backlog), sent) in
            self.shards.iter().zip(&mut self.backlog).zip(sent.iter_mut())
        {
            while let Some(output) = backlog.pop_front() {
                if let Err(output) = shard.push_quiet(output) {
                    backlog.push_front(output);
                    break;
                }
                *sent = true;
            }
        }
        for output in self.out.drain(..) {
            let index = usize::from(output_id(&output).shard());
            let backlog = &mut self.backlog[index];
            if !backlog.is_empty() {
                backlog.push_back(output);
            } else if let Err(output) = self.shards[index].push_quiet(output) {
                backlog.push_back(output);
            } else {
                sent[index] = true;
            }
        }
        for (shard, &sent) in self.shards.iter().zip(sent.iter()) {
            if sent {
                shard.wake_if_sleeping();
            }
        }
    }

    /// The scheduler, back from its host.
    pub fn into_scheduler(self) -> Scheduler {
        self.scheduler
    }
}

/// A running scheduler thread: a [`Host`] on a dedicated thread.
#[derive(Debug)]
pub struct SchedulerThread {
    inbox: Arc<Inbox>,
    report: Arc<Mutex<Report>>,
    stop: Arc<AtomicBool>,
    join: JoinHandle<Scheduler>,
}

impl SchedulerThread {
    /// Starts a thread named `name` running `scheduler`, with an inbox of `inbox_capacity`
    /// inputs; decisions go to `shards[request.shard()]`.
    pub fn spawn<W: Wake + 'static>(
        name: String,
        scheduler: Scheduler,
        inbox_capacity: usize,
        shards: Vec<Arc<Ring<Output, W>>>,
        clock: Clock,
    ) -> std::io::Result<SchedulerThread> {
        let inbox = Arc::new(Ring::new(inbox_capacity, InboxWaker::default()));
        let host = Host::new(scheduler, Arc::clone(&inbox), shards);
        let report = Arc::clone(host.report());
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker { host, stop: Arc::clone(&stop), clock };
        let join = std::thread::Builder::new().name(name).spawn(move || worker.run())?;
        Ok(SchedulerThread { inbox, report, stop, join })
    }

    /// The ring to push inputs into.
    pub fn inbox(&self) -> &Arc<Inbox> {
        &self.inbox
    }

    /// The scheduler's counters and gauges, as of the thread's last pass.
    pub fn report(&self) -> &Arc<Mutex<Report>> {
        &self.report
    }

    /// Stops the thread once its inbox is drained and every decision delivered; returns the
    /// scheduler. Send [`Input::Shutdown`] first for SPEC S13's behaviour.
    pub fn stop(self) -> Scheduler {
        self.stop.store(true, Ordering::Release);
        self.inbox.wake();
        self.join.join().expect("scheduler thread panicked")
    }
}

struct Worker<W> {
    host: Host<W>,
    stop: Arc<AtomicBool>,
    clock: Clock,
}

impl<W: Wake> Worker<W> {
    fn run(mut self) -> Scheduler {
        if let InboxWaker::Thread(waker) = self.host.inbox.waker() {
            waker.register();
        }
        loop {
            let handled = self.host.pass(self.clock.now(), None);
            let backlogged = self.host.backlogged();
            if self.stop.load(Ordering::Acquire) && self.host.inbox.is_empty() && !backlogged {
                return self.host.into_scheduler();
            }
            if handled < BATCH {
                self.sleep(backlogged);
            }
        }
    }

    /// Blocks until a message, the next timer, or (with a backlog) the next retry.
    fn sleep(&mut self, backlogged: bool) {
        let now = self.clock.now();
        let until_timer =
            self.host.next_wakeup().map(|at| self.clock.rate().duration(at.saturating_sub(now)));
        let timeout = match (backlogged, until_timer) {
            (true, Some(timer)) => Some(timer.min(BACKLOG_RETRY)),
            (true, None) => Some(BACKLOG_RETRY),
            (false, timer) => timer,
        };
        let inbox = &self.host.inbox;
        if inbox.prepare_sleep() && !self.stop.load(Ordering::Acquire) {
            match timeout {
                Some(timeout) if timeout.is_zero() => {}
                Some(timeout) => std::thread::park_timeout(timeout),
                None => std::thread::park(),
            }
        }
        inbox.woke();
    }
}

fn output_id(output: &Output) -> super::RequestId {
    match *output {
        Output::Admit { id, .. } | Output::Reject { id, .. } => id,
    }
}
