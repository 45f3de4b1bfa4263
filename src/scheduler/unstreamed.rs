//! The prefill a backend's engine has left to do for warmpath's non-streaming requests, by
//! estimate ([`UnstreamedBacklog`]), for S16's cost.
//!
//! A non-streaming request shows no first byte before its end, so it is in no prefill backlog
//! (SPEC S6.3). Counted as a decoding sequence only, an engine given long prompts looked as
//! loaded as one given short ones to the streaming requests placed after them, whose clients
//! wait for a first token behind that prefill: in the fleet lab, with half the sessions asking
//! for whole responses, streaming clients' first-turn TTFT p90 was up to 3.2x sglang-router's
//! `cache_aware`'s (`perf/RESULTS.md`, fourteenth session). Only streaming requests are placed
//! by this estimate: a non-streaming client waits for the whole response, and placing those
//! requests by it as well made whole responses later (thirteenth session).
//!
//! The engine is taken to prefill a backend's non-streaming requests in the order they were
//! sent (vLLM and SGLang schedule their waiting queues first come, first served). `sent` counts
//! every estimated token sent there, and a cursor `done` what the engine has cleared of them.
//! Three things move the cursor:
//! - time, at the backend's prefill rate ([`super::estimate::Learned::drain_rate`]: the one
//!   its first bytes taught, else the one its engine's counters did, else the fastest another
//!   backend learned), while tokens are left;
//! - a request's end: its prefill and every one sent before it are over, so the cursor moves
//!   to at least its place; with no non-streaming request left in flight, nothing is left;
//! - a scrape of the engine's waiting gauge ([`UnstreamedBacklog::engine_waiting`]), which
//!   bounds the cursor from both sides, correcting a rate that ran ahead or fell behind.
//!
//! A cancelled or retried request tells nothing of the engine's progress and moves nothing.

use crate::clock::Tick;

use super::estimate::cleared;

/// How many of a backend's latest non-streaming requests the waiting gauge can bound the
/// cursor by ([`UnstreamedBacklog::engine_waiting`]).
pub const RECENT_SENDS: usize = 16;

/// How many of the requests an engine has begun, the latest ones, may still be prefilling when
/// a scrape finds the rest waiting. An engine's step continues the prefills it has begun before
/// it begins the next, within a token budget per step (vLLM's chunked prefill,
/// `max_num_batched_tokens`), so the ones begun earlier have finished unless prompts are much
/// longer than a step. Chosen by measurement over eight workloads in the fleet lab
/// (`perf/RESULTS.md`, thirteenth session): 1 (only the latest begun) took a long-document
/// workload's first-turn p90 from 1.1x `cache_aware`'s to 1.5x, by counting a prompt still
/// being prefilled as done; 3 let the estimate lag on RAGPulse.
pub const BEGUN_PREFILLING: u64 = 2;

/// One backend's non-streaming backlog estimate (see the module documentation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct UnstreamedBacklog {
    /// Estimated uncached tokens sent, ever.
    sent: u64,
    /// Of those, what the engine had cleared at `at`.
    done: u64,
    at: Tick,
    /// Requests sent, ever, and where each of the last [`RECENT_SENDS`] began in the order
    /// (the `i`th at `starts[i % RECENT_SENDS]`).
    sends: u64,
    starts: [u64; RECENT_SENDS],
}

impl UnstreamedBacklog {
    pub const NEW: UnstreamedBacklog =
        UnstreamedBacklog { sent: 0, done: 0, at: 0, sends: 0, starts: [0; RECENT_SENDS] };

    /// Whether nothing is left, whatever the rate (so with nothing in flight).
    pub fn is_empty(&self) -> bool {
        self.sent == self.done
    }

    /// The tokens left at `now` for an engine clearing `rate` tokens per tick.
    pub fn remaining(&self, rate: (u64, u64), now: Tick) -> u64 {
        let left = self.sent - self.done;
        if left == 0 {
            return 0;
        }
        left.saturating_sub(cleared(now.saturating_sub(self.at), rate))
    }

    /// The cursor at `now`, brought up to date.
    fn catch_up(&mut self, rate: (u64, u64), now: Tick) -> u64 {
        let done = self.sent - self.remaining(rate, now);
        self.at = now;
        done
    }

    /// Counts a request of `tokens` sent at `now`; returns its place in the order, the end of
    /// its tokens (for [`ended`](Self::ended)).
    pub fn sent(&mut self, tokens: u64, rate: (u64, u64), now: Tick) -> u64 {
        self.done = self.catch_up(rate, now);
        self.starts[(self.sends % RECENT_SENDS as u64) as usize] = self.sent;
        self.sends += 1;
        self.sent += tokens;
        self.sent
    }

    /// The request at `place` in the order ended at `now` with a response; `last` when no other
    /// non-streaming request is left in flight on the backend.
    pub fn ended(&mut self, place: u64, last: bool, rate: (u64, u64), now: Tick) {
        let done = self.catch_up(rate, now);
        self.done = if last { self.sent } else { done.max(place) };
    }

    /// A request ended without a response (cancelled, or failed and retried); `last` as for
    /// [`ended`](Self::ended).
    pub fn dropped(&mut self, last: bool, rate: (u64, u64), now: Tick) {
        let done = self.catch_up(rate, now);
        self.done = if last { self.sent } else { done };
    }

    /// A scrape says `waiting` of the backend's non-streaming requests wait in its engine, not
    /// begun. In the engine's order those are the latest sent, so the cursor is not past where
    /// the first of them begins, and past where the [`BEGUN_PREFILLING`]th latest begun one
    /// begins. The estimate is brought within those bounds, either way. Only bounds within the
    /// last [`RECENT_SENDS`] requests are known.
    pub fn engine_waiting(&mut self, waiting: u32, rate: (u64, u64), now: Tick) {
        let done = self.catch_up(rate, now);
        let ring = RECENT_SENDS as u64;
        let start = |i: u64| self.starts[(i % ring) as usize];
        let waiting = u64::from(waiting).min(self.sends);
        let first = self.sends - waiting;
        let upper = match waiting {
            0 => self.sent,
            w if w <= ring => start(first),
            _ => start(self.sends - ring),
        };
        let lower = if first >= BEGUN_PREFILLING && waiting + BEGUN_PREFILLING <= ring {
            start(first - BEGUN_PREFILLING)
        } else {
            0
        };
        self.done = done.clamp(lower, upper);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One token per tick.
    const RATE: (u64, u64) = (1, 1);
    const UNKNOWN: (u64, u64) = (0, 0);

    #[test]
    fn a_backlog_drains_at_the_rate_and_not_while_empty() {
        let mut b = UnstreamedBacklog::NEW;
        b.sent(100, RATE, 1_000);
        assert_eq!(b.remaining(RATE, 1_000), 100);
        assert_eq!(b.remaining(RATE, 1_040), 60);
        assert_eq!(b.remaining(RATE, 2_000), 0);
        // Idle time banks nothing: the next request starts full.
        b.sent(50, RATE, 5_000);
        assert_eq!(b.remaining(RATE, 5_000), 50);
        assert_eq!(b.remaining(UNKNOWN, 9_000), 50, "no rate, no drain");
    }

    #[test]
    fn an_end_clears_everything_sent_before_it() {
        let mut b = UnstreamedBacklog::NEW;
        let first = b.sent(100, UNKNOWN, 0);
        let second = b.sent(200, UNKNOWN, 0);
        b.sent(300, UNKNOWN, 0);
        b.ended(second, false, UNKNOWN, 10);
        assert_eq!(b.remaining(UNKNOWN, 10), 300);
        // An earlier request ending later moves nothing back.
        b.ended(first, false, UNKNOWN, 20);
        assert_eq!(b.remaining(UNKNOWN, 20), 300);
        b.dropped(true, UNKNOWN, 30);
        assert_eq!(b.remaining(UNKNOWN, 30), 0, "nothing in flight, nothing left");
    }

    #[test]
    fn a_cancel_tells_nothing_of_the_engine() {
        let mut b = UnstreamedBacklog::NEW;
        b.sent(100, UNKNOWN, 0);
        b.sent(200, UNKNOWN, 0);
        b.dropped(false, UNKNOWN, 10);
        assert_eq!(b.remaining(UNKNOWN, 10), 300);
    }

    #[test]
    fn the_waiting_gauge_bounds_the_cursor_both_ways() {
        let mut b = UnstreamedBacklog::NEW;
        for _ in 0..5 {
            b.sent(100, UNKNOWN, 0);
        }
        // Two wait: three have begun, and all but the last two begun have finished.
        b.engine_waiting(2, UNKNOWN, 10);
        assert_eq!(b.remaining(UNKNOWN, 10), 400, "the lower bound moves a lagging cursor");
        // A rate that ran ahead: at 1 token per tick everything would be done by 1,000.
        b.engine_waiting(4, RATE, 1_000);
        assert_eq!(b.remaining(RATE, 1_000), 400, "four wait: the first 100 tokens at most");
        b.engine_waiting(0, UNKNOWN, 1_000);
        assert_eq!(b.remaining(UNKNOWN, 1_000), 200, "none waits: the last two may prefill");
    }

    #[test]
    fn more_waiting_than_remembered_keeps_the_cursor_before_the_oldest_remembered() {
        let mut b = UnstreamedBacklog::NEW;
        for _ in 0..RECENT_SENDS + 4 {
            b.sent(10, UNKNOWN, 0);
        }
        b.ended(60, false, UNKNOWN, 1);
        b.engine_waiting(RECENT_SENDS as u32 + 2, UNKNOWN, 2);
        assert_eq!(b.remaining(UNKNOWN, 2), RECENT_SENDS as u64 * 10, "before the 5th request");
    }
}
