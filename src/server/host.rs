//! What runs a model's sans-IO [`Scheduler`]: a [`Host`] drains the model's [`Inbox`] (fed by
//! the shards and the control thread), feeds each input to the scheduler with the current
//! tick, sends every admission and rejection to the ring of the shard that owns the request
//! (the shard index is in the [`RequestId`]), and publishes a [`Report`] for the admin
//! endpoints. Whoever drives the host also sleeps until the next message or the next timer the
//! scheduler reports, so a queue deadline or the end of a grace window is acted on when it
//! falls due, with no traffic to trigger it (SPEC section 9, defect 1).
//!
//! `warmpath serve` runs each host inside a shard's event loop (the shard's own requests then
//! reach their scheduler without crossing threads; see [`super::shard`]). A dedicated scheduler
//! thread, the design card's shape, was measured against it and removed (ARCHITECTURE.md,
//! "Threads"); `tests/host.rs` still drives a host from a thread of its own.
//!
//! Nothing is lost to a full shard ring: decisions that do not fit wait in a per-shard backlog,
//! in order, and the driver retries them until they fit (a shard on every loop iteration,
//! waking at least every 200 µs while some wait). A full
//! inbound ring is the producers' concern: `Ring::push` hands the message back and the shard
//! answers the client itself (503) or retries.
//!
//! The host is the only writer of its scheduler's state (an architecture invariant): the
//! scheduler moves into it and comes back out of [`Host::into_scheduler`].

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};

use crate::clock::Tick;
use crate::ring::{InboxWaker, Ring, Wake};
use crate::scheduler::{Input, Output, Params, RequestId, Scheduler};

use super::report::Report;

/// Inputs handled per pass before delivering and looking at the clock again.
pub(super) const BATCH: usize = 256;

/// A model's inbound ring: shards and the control thread push [`Input`]s into it.
pub type Inbox = Ring<Input, InboxWaker>;

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
    pub fn reconfigure(&mut self, now: Tick, params: Params, live: &[bool]) {
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

fn output_id(output: &Output) -> RequestId {
    match *output {
        Output::Admit { id, .. } | Output::Reject { id, .. } => id,
    }
}
