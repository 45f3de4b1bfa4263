//! The dataplane's view of a scheduler: a [`Report`] of its counters and gauges, which its
//! [`Host`](super::host::Host) publishes under a mutex after every pass that changed something
//! and the admin thread reads for `/metrics`, `/debug/queue` and `/debug/backends`. The
//! scheduler core only offers read-only accessors (`scheduler::inspect`); what to copy, and
//! where it is shared, is the dataplane's concern.

use crate::clock::Tick;
use crate::scheduler::estimate::{BackendEstimates, TokenRate};
use crate::scheduler::{Lane, Scheduler, Stats, Waiting};

/// How many of the longest-waiting requests a report lists (`/debug/queue`'s
/// `oldest_waiting`, the status page): a bound, so a deep queue costs the host's pass and a
/// scrape no more than a shallow one.
pub const OLDEST_WAITING_MAX: usize = 10;

/// A scheduler's counters and gauges as of the end of its host's last pass that changed
/// anything: what the admin endpoints read. The host copies them in place (no allocation)
/// under an uncontended mutex; a scrape holds it for the time of a copy.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub stats: Stats,
    /// Queued requests per lane, indexed by `Lane as usize`.
    pub depth: [u32; 4],
    pub inflight: u32,
    pub sessions_tracked: usize,
    /// Sessions with a request queued or in flight (issue \[10\]).
    pub sessions_active: u32,
    /// See [`Scheduler::oldest_arrival`].
    pub oldest_arrival: Option<Tick>,
    /// The [`OLDEST_WAITING_MAX`] longest-waiting queued requests, oldest first.
    pub oldest_waiting: Vec<Waiting>,
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
    /// What the scheduler learned of the backend (issue \[8\]).
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

    /// Copies `scheduler`'s counters and gauges into this report, reusing its vectors.
    pub(super) fn fill(&mut self, scheduler: &Scheduler) {
        self.stats.clone_from(scheduler.stats());
        for lane in Lane::ALL {
            self.depth[lane as usize] = scheduler.depth(lane);
        }
        self.inflight = scheduler.inflight();
        self.sessions_tracked = scheduler.sessions_tracked();
        self.sessions_active = scheduler.sessions_active();
        self.oldest_arrival = scheduler.oldest_arrival();
        // Reserved once, at the first fill: later fills reuse it and do not allocate.
        self.oldest_waiting.clear();
        self.oldest_waiting.reserve_exact(OLDEST_WAITING_MAX);
        scheduler.oldest_waiting(OLDEST_WAITING_MAX, &mut self.oldest_waiting);
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
