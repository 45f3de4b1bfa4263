//! The scheduler side of a shard, what talks to the rings: [`Inputs`], what the shard sends to
//! the models' schedulers through their inboxes, and [`Hosted`], the schedulers the shard runs
//! with the decisions they make for its own requests. Neither touches a connection.

use std::collections::VecDeque;
use std::time::Duration;

use crate::clock::{Tick, TickRate};
use crate::scheduler::{Input, Output};
use crate::server::{Generation, ShardHost};

use super::BACKLOG_TICK;

/// The inputs a shard sends to the models' schedulers. One that must not be lost (`Cancel`,
/// `Complete`, `FirstByte`, `Retry`) waits in a backlog, in order, while its inbox is full, and
/// is retried every loop iteration; an `Arrive` that does not fit is the caller's to answer
/// (503). An inbox written to is woken once per loop iteration, not once per input.
#[derive(Debug)]
pub(super) struct Inputs {
    /// Inputs that did not fit their model's inbox, oldest first.
    backlog: VecDeque<(u16, Input)>,
    /// Models whose inbox received inputs since the last wake.
    dirty: Vec<bool>,
}

impl Inputs {
    pub(super) fn new(models: usize) -> Inputs {
        Inputs { backlog: VecDeque::new(), dirty: vec![false; models] }
    }

    /// Room for the models of a new generation.
    pub(super) fn grow(&mut self, models: usize) {
        self.dirty.resize(models, false);
    }

    /// Whether no input waits for a full inbox.
    pub(super) fn is_empty(&self) -> bool {
        self.backlog.is_empty()
    }

    /// Sends an input that must not be lost: it waits in the backlog while the inbox is full
    /// (and behind older inputs that do).
    pub(super) fn send(&mut self, gen: &Generation, model: u16, input: Input) {
        if !self.backlog.is_empty() {
            self.backlog.push_back((model, input));
            return;
        }
        match gen.models[usize::from(model)].inbox.push_quiet(input) {
            Ok(()) => self.dirty[usize::from(model)] = true,
            Err(input) => self.backlog.push_back((model, input)),
        }
    }

    /// Sends an arrival, or hands it back when the model's inbox is full.
    pub(super) fn arrive(
        &mut self,
        gen: &Generation,
        model: u16,
        input: Input,
    ) -> Result<(), Input> {
        gen.models[usize::from(model)].inbox.push_quiet(input)?;
        self.dirty[usize::from(model)] = true;
        Ok(())
    }

    /// Retries the backlog, oldest first, until an inbox is full.
    pub(super) fn flush_backlog(&mut self, gen: &Generation) {
        while let Some((model, input)) = self.backlog.pop_front() {
            match gen.models[usize::from(model)].inbox.push_quiet(input) {
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
    pub(super) fn wake(&mut self, gen: &Generation) {
        for (model, dirty) in gen.models.iter().zip(&mut self.dirty) {
            if std::mem::take(dirty) {
                model.inbox.wake_if_sleeping();
            }
        }
    }
}

/// The schedulers a shard runs ([`ShardHost`]s, model *i* on shard *i* % shards), and the
/// decisions they made for this shard's own requests, which skip its ring.
#[derive(Debug)]
pub(super) struct Hosted {
    hosts: Vec<ShardHost>,
    /// The model of each host.
    models: Vec<u16>,
    /// Decisions for this shard's requests, to act on in this loop iteration.
    local: VecDeque<Output>,
}

impl Hosted {
    pub(super) fn new(hosted: Vec<(u16, ShardHost)>) -> Hosted {
        let (models, hosts) = hosted.into_iter().unzip();
        Hosted { hosts, models, local: VecDeque::new() }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.hosts.is_empty()
    }

    /// One pass of every hosted scheduler at `now`; the decisions for shard `shard` (this one)
    /// go to the local queue. Returns the inputs handled.
    pub(super) fn pass(&mut self, now: Tick, shard: u16) -> usize {
        let mut handled = 0;
        for host in &mut self.hosts {
            handled += host.pass(now, Some((shard, &mut self.local)));
        }
        handled
    }

    /// Whether decisions for this shard wait to be acted on.
    pub(super) fn has_local(&self) -> bool {
        !self.local.is_empty()
    }

    pub(super) fn pop_local(&mut self) -> Option<Output> {
        self.local.pop_front()
    }

    /// Announces sleep on every hosted inbox (each must be told); false if any holds inputs.
    pub(super) fn prepare_sleep(&self) -> bool {
        let mut sleep = true;
        for host in &self.hosts {
            sleep &= host.inbox().prepare_sleep();
        }
        sleep
    }

    pub(super) fn woke(&self) {
        for host in &self.hosts {
            host.inbox().woke();
        }
    }

    /// How soon a hosted scheduler needs the loop: at its next timer, or after
    /// [`BACKLOG_TICK`] while decisions wait for a full shard ring.
    pub(super) fn next_due(&self, now: Tick, rate: TickRate) -> Option<Duration> {
        let mut due: Option<Duration> = None;
        for host in &self.hosts {
            let next = match host.backlogged() {
                true => Some(BACKLOG_TICK),
                false => host.next_wakeup().map(|at| rate.duration(at.saturating_sub(now))),
            };
            due = match (due, next) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        due
    }

    /// Whether no hosted scheduler has inputs to handle or decisions to deliver.
    pub(super) fn is_idle(&self) -> bool {
        self.hosts.iter().all(|h| !h.backlogged() && h.inbox().is_empty())
    }

    /// A new generation: takes `new` schedulers (of models a reload added whose home is this
    /// shard), then reconfigures every hosted one of a live model. A new one is reconfigured
    /// too: it was built for the generation that added its model, and a later reload may have
    /// changed that model before this shard looked (it adopts only the newest generation).
    /// One may also come from a reload newer than `gen` (it filled the mailbox after `gen` was
    /// read): its model is not in `gen`, and it is reconfigured at the next adoption, which
    /// that reload's publication makes sure of.
    pub(super) fn adopt(
        &mut self,
        gen: &Generation,
        now: Tick,
        rate: TickRate,
        new: Vec<(u16, ShardHost)>,
    ) {
        for (model, host) in new {
            self.models.push(model);
            self.hosts.push(host);
        }
        for (model, host) in self.models.iter().zip(&mut self.hosts) {
            let Some(m) = gen.models.get(usize::from(*model)) else { continue };
            if m.live {
                host.reconfigure(now, gen.params(usize::from(*model), rate), &m.live_backends());
            }
        }
    }
}
