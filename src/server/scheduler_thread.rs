//! A model's scheduler on a thread of its own: a [`SchedulerThread`] drives a
//! [`Host`] in a loop, parking until the next message in its inbox, the next timer the
//! scheduler reports or, while decisions wait for a full shard ring, the next retry.
//!
//! This is the design card's shape (SPEC section 1: one scheduler thread per model).
//! `warmpath serve` does not use it: each host runs inside a shard's event loop instead
//! (ARCHITECTURE.md, "Threads", says why). It stays as a driver of the same [`Host`] for tests
//! (`tests/scheduler_thread.rs`, the ring protocol under real threads) and embedders.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::clock::Clock;
use crate::ring::{InboxWaker, Ring, Wake};
use crate::scheduler::{Output, Scheduler};

use super::host::{Host, Inbox, BATCH};
use super::report::Report;

/// How soon a thread with undelivered decisions looks at the full shard rings again.
pub const BACKLOG_RETRY: Duration = Duration::from_micros(50);

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
    /// scheduler. Send [`Input::Shutdown`](crate::scheduler::Input::Shutdown) first for SPEC
    /// S13's behaviour.
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
        if let InboxWaker::Thread(waker) = self.host.inbox().waker() {
            waker.register();
        }
        loop {
            let handled = self.host.pass(self.clock.now(), None);
            let backlogged = self.host.backlogged();
            if self.stop.load(Ordering::Acquire) && self.host.inbox().is_empty() && !backlogged {
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
        let inbox = self.host.inbox();
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
