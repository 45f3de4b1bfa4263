//! The scheduler's vocabulary: what a driver sends it ([`Input`], with an [`Arrival`] and a
//! response's [`Usage`]), what it answers ([`Output`]), what it is built from ([`Params`]) and
//! what it counts ([`Stats`]). Re-exported by the module above; the state machine that uses
//! them is there.

use crate::clock::Tick;

use super::placement;
use super::policy::{Routing, Snapshot};

/// A request's id, unique among the requests a scheduler knows (the shards make them unique).
///
/// Encoding, when made by [`RequestId::new`]: high 16 bits, the index of the shard that owns the
/// client connection (where admissions and rejections are sent back); low 48 bits, that shard's
/// serial number. The scheduler core itself only compares ids.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default)]
pub struct RequestId(pub u64);

impl RequestId {
    /// The id of request `serial` (wrapping at 2^48) of shard `shard`.
    pub fn new(shard: u16, serial: u64) -> RequestId {
        RequestId(u64::from(shard) << 48 | (serial & ((1 << 48) - 1)))
    }

    /// The shard that owns this request.
    pub fn shard(self) -> u16 {
        (self.0 >> 48) as u16
    }
}

/// The queue lanes, in the order admission serves them (S3, with the retry lane of 2.8 first).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Lane {
    /// Sent back after a retryable upstream failure.
    Retry = 0,
    /// Boosted requests promoted by bounded overtaking (S4).
    Forced = 1,
    /// Follow-ups of recently completed sessions (S1).
    Boosted = 2,
    /// Everything else, FIFO.
    Normal = 3,
}

impl Lane {
    /// Every lane, in serving order.
    pub const ALL: [Lane; 4] = [Lane::Retry, Lane::Forced, Lane::Boosted, Lane::Normal];

    /// The lane's name in metrics and debug output.
    pub fn name(self) -> &'static str {
        match self {
            Lane::Retry => "retry",
            Lane::Forced => "forced",
            Lane::Boosted => "boosted",
            Lane::Normal => "normal",
        }
    }
}

/// Why a request was refused; each maps to one router error status (SPEC section 2).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RejectReason {
    /// Waited longer than `queue.timeout` (504).
    QueueTimeout,
    /// The queue holds `max_queued` requests (429).
    QueueFull,
    /// Shutting down (503).
    ShuttingDown,
    /// Retryable upstream failures exhausted `max_retries` (502).
    RetriesExhausted,
}

/// A request entering the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Arrival {
    pub id: RequestId,
    /// Hash of the session header's value; `None` when absent or empty.
    pub session: Option<u64>,
    /// Bytes of the request body; its prompt tokens are estimated from them (S6.3).
    pub prompt_bytes: u32,
    /// Whether the response streams (only streaming requests count in the prefill backlog).
    pub streaming: bool,
    /// S16: the [`PromptPool`](crate::ring::prompt_pool::PromptPool) slot holding the prompt's
    /// block hashes, or [`NO_PROMPT`](crate::ring::prompt_pool::NO_PROMPT). The scheduler
    /// gives the slot back when the request ends.
    pub prompt: u32,
    /// Issue \[11\]: the tenant its API key names, from 1; 0 = no tenant. An index the
    /// scheduler has no weight for (a reload's tenant racing the reconfiguration) counts as 0.
    pub tenant: u16,
}

// The tenant fits in what was padding: an arrival stays 40 bytes on the inbox ring.
const _: () = assert!(std::mem::size_of::<Arrival>() == 40);

/// What a response's `usage` object said about its prompt and its output.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// `usage.prompt_tokens`; 0 when absent.
    pub prompt_tokens: u32,
    /// `usage.prompt_tokens_details.cached_tokens`; [`Usage::UNKNOWN_CACHED`] when absent.
    pub cached_tokens: u32,
    /// `usage.completion_tokens`, or for a stream without `usage` the count of its events; 0
    /// when neither was seen.
    pub completion_tokens: u32,
}

impl Usage {
    /// `cached_tokens` when the response did not say.
    pub const UNKNOWN_CACHED: u32 = u32::MAX;
    /// A response without `usage`.
    pub const NONE: Usage =
        Usage { prompt_tokens: 0, cached_tokens: Usage::UNKNOWN_CACHED, completion_tokens: 0 };
}

/// One event for the scheduler.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Input {
    /// A request arrives (S1, S11).
    Arrive(Arrival),
    /// The client went away: a queued request leaves the queue, an admitted one its slot (S10).
    Cancel(RequestId),
    /// An admitted streaming request received its first response body byte (S6.3).
    FirstByte(RequestId),
    /// An admitted request ended; `success` (a fully relayed 2xx) marks its session (S12).
    /// `usage` is what the response said of its prompt, when it said it.
    Complete { id: RequestId, success: bool, usage: Usage },
    /// An admitted request failed before any response byte, retryably (SPEC 2.8).
    Retry(RequestId),
    /// A backend's health and metrics report.
    Snapshot { backend: u16, snapshot: Snapshot },
    /// Time passed.
    Tick,
    /// Stop admitting; reject everything queued (S13).
    Shutdown,
}

/// A decision.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Output {
    /// Send request `id` to `backend`.
    Admit {
        id: RequestId,
        backend: u16,
        /// The lane it was admitted from (a grace hit is `Boosted`).
        lane: Lane,
        /// Ticks between arrival and admission.
        waited: Tick,
        /// Whether `backend` was the session's last backend.
        affinity: bool,
        /// The request's turn depth in its session (issue \[10\]): 1 without a session or
        /// for a session the tracker does not hold, else its completed turns plus one.
        turn: u16,
        /// The predicted prefix at admission (issue \[10\]): with prompt blocks (S16), whether
        /// `backend`'s prefix index held at least half of them; without, `affinity`.
        warm: bool,
        /// Its session was derived from its prompt (issue \[10\]): it carried no identity and
        /// extends a completed turn.
        derived: bool,
    },
    /// Answer request `id` with the error for `reason`.
    Reject { id: RequestId, reason: RejectReason },
}

// The turn and the prediction fit in what was padding: a decision is still 24 bytes on the
// rings to the shards.
const _: () = assert!(std::mem::size_of::<Output>() == 24);

/// A model's scheduling parameters, with durations already in ticks.
#[derive(Debug, Clone, PartialEq)]
pub struct Params {
    /// `session-boost` (true) or `fifo` (false) (S15).
    pub boost: bool,
    pub routing: Routing,
    /// Number of backends, indexed `0..backends`.
    pub backends: u16,
    /// S9; `None` = no deadline.
    pub queue_timeout: Option<Tick>,
    pub max_queued: u32,
    /// S6.1: the cap on a backend's inflight requests and grace holds; with
    /// `inflight_learned`, the cap each backend's learned one starts from and never goes below.
    pub inflight_per_backend: u32,
    /// `inflight_per_backend = "auto"`: each backend's cap is learned from its engine's waiting
    /// gauge (`estimate`, "The inflight cap").
    pub inflight_learned: bool,
    /// S6.3: the prefill budget per backend.
    pub prefill_tokens_per_backend: Budget,
    pub max_sessions: u32,
    /// S4; 0 = unbounded.
    pub max_overtakes: u32,
    /// S5; 0 = off.
    pub boosted_streak_max: u32,
    /// S8; 0 = off.
    pub grace_period: Tick,
    pub max_retries: u32,
    /// Consecutive retryable failures before passive ejection; 0 = never eject.
    pub eject_after_failures: u32,
    pub metrics_stale_after: Tick,
    /// Timer wheel resolution (rounded up to a power of two).
    pub timer_resolution: Tick,
    /// S16, used when `routing` is `PrefixCost`.
    pub prefix: PrefixParams,
    /// Issue \[11\]: the fair-share weight (1 to 1,000) of each tenant, tenant `t` at
    /// `t - 1`; tenant 0 (no tenant) has weight 1. Empty: no tenants, today's single queue.
    pub tenant_weights: Vec<u16>,
}

/// The prefill budget of each backend (S6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Budget {
    /// Learned per backend ([`estimate`](super::estimate)): the backlog its engine drains in a
    /// few feedback latencies at its measured prefill rate.
    Auto,
    /// A fixed number of estimated tokens; 0 = no budget.
    Tokens(u64),
}

/// How many blocks each backend's prefix index remembers (S16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexSize {
    /// Sized from the engine's exported KV capacity (or `default_blocks` when it exports none)
    /// and calibrated against the hits the engine reports ([`estimate`](super::estimate)).
    Auto { default_blocks: u32 },
    /// A fixed number of blocks.
    Blocks(u32),
}

impl IndexSize {
    /// The blocks an index starts with.
    pub fn initial(self) -> u32 {
        match self {
            IndexSize::Auto { default_blocks } => default_blocks,
            IndexSize::Blocks(blocks) => blocks,
        }
    }
}

/// The S16 parameters of a model.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixParams {
    /// Bytes of prompt text per hashed block.
    pub block_bytes: u32,
    /// Blocks remembered per backend.
    pub index_blocks: IndexSize,
    /// Queued requests looked at per admission.
    pub scan_max: u32,
    /// How much dearer than the cheapest an eligible backend may be and still be taken.
    pub slack_tokens: u64,
    /// How long a request may wait for its cheapest backend.
    pub wait_max: Tick,
    /// Issue \[10\]: a request without identity continues the conversation its prompt extends
    /// ([`derive`]).
    pub derive_sessions: bool,
    /// Admissions that make a prefix block hot ([`placement::HOT_PREFIX_TOUCHES`] in
    /// production; the tests' small indexes set fewer).
    pub hot_touches: u16,
}

impl PrefixParams {
    /// SPEC's defaults, with a small index and `wait_max` of 1,000 ticks (tests).
    pub const DEFAULT: PrefixParams = PrefixParams {
        block_bytes: 256,
        index_blocks: IndexSize::Blocks(4096),
        scan_max: 64,
        slack_tokens: 2048,
        wait_max: 1000,
        derive_sessions: true,
        hot_touches: placement::HOT_PREFIX_TOUCHES,
    };
}

/// Counters, written only by the thread that owns the scheduler.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Stats {
    /// Admissions per lane, indexed by `Lane as usize`.
    pub admitted: [u64; 4],
    pub forced: u64,
    pub timeouts: u64,
    pub cancelled: u64,
    pub rejected_full: u64,
    pub rejected_shutdown: u64,
    pub retries: u64,
    pub retries_exhausted: u64,
    pub grace_holds: u64,
    pub grace_hits: u64,
    pub affinity_hits: u64,
    pub ejections: u64,
    pub stale_events: u64,
    /// Follow-ups of tracked sessions not boosted because they are cold: no backend's prefix
    /// index holds at least half of their prompt's blocks (S16), or their last turn completed
    /// on a backend whose engine restarted since.
    pub boost_declined: u64,
    /// Issue \[10\]: arrivals without identity matched to a completed turn (a derived
    /// session), and those that started a new derived session.
    pub derived_matched: u64,
    pub derived_fresh: u64,
    /// S16: requests a placement scan passed over to wait for their cheapest backend.
    pub placement_waits: u64,
    /// S16: admissions with no home sent to a backend that lacked part of a hot shared prefix
    /// another backend held ([`placement::HOT_PREFIX_TOUCHES`]): copies of a shared prompt.
    pub prefix_copies: u64,
    /// S16: admissions by the share of the prompt's blocks matched on the chosen backend, in
    /// buckets of a tenth ([`placement::MATCH_BUCKETS`]; bucket *i* holds shares in
    /// ((i − 1)/10, i/10], bucket 0 exactly 0).
    pub match_ratio: [u64; placement::MATCH_BUCKETS],
    /// S16: the sum of those shares, in thousandths.
    pub match_ratio_sum_milli: u64,
}
