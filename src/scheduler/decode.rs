//! How fast each backend decodes ([`Decode`]) and how long a model's non-streaming answers
//! run ([`OutputLength`]): what S16's cost needs to weigh a whole response's wait on engines
//! that decode at different speeds (issue \[8\]). Like the prefill estimates in `estimate`,
//! which hold these in `Learned`, they are sans-IO, deterministic and integer-only, and
//! `reference::learned` restates them (`learn_output`, `gap`).
//!
//! The client of a non-streaming request waits for the whole response, most of it decoding,
//! and engines of one model decode at speeds the prefill rate does not show: in the sim's
//! profiles an L4's step takes 4.5 times an H100's at a light batch, and its prefill 3.3 times
//! as long per token. Each streaming response that ends successfully adds its output tokens
//! after the first (`usage.completion_tokens`, or the count of its events when the client asked
//! for no usage) and the ticks from its first byte to its end to its backend's window; every
//! [`DECODE_WINDOW_RESPONSES`] responses close a window, whose ticks per token are a sample,
//! and the backend's *gap* is the least of its last [`DECODE_WINDOWS`] samples. A step holds
//! the prefill chunks and the other sequences of its batch, so a sample is the engine's speed
//! as loaded then; the least of the recent ones is its speed at its lightest recent load,
//! nearer what engines of one kind share. (Sums over all responses, tried first, are the speed
//! as loaded on average: in the fleet lab they moved the placements of two equal H100s on
//! RAGPulse at 0.9, streaming clients' first-turn p50 1.11x `cache_aware`'s to 1.23x, and cost
//! a mixed fleet's streaming clients more; `perf/RESULTS.md`, sixteenth session.) Each
//! non-streaming response adds its `completion_tokens` to the model's output-length sums,
//! halved past [`OUTPUT_HORIZON`] responses; their ratio is the output a non-streaming request
//! is expected to have. S16's cost for a non-streaming request adds, on each backend, the
//! expected output times the backend's gap beyond [`GAP_TOLERANCE_PERCENT`] above the least
//! gap of the usable backends (`placement`).
//!
//! **The engine's own counters.** vLLM and SGLang export a histogram of inter-token latencies
//! (vLLM V1: `vllm:inter_token_latency_seconds`, `vllm/v1/metrics/loggers.py`, whose older name
//! `vllm:time_per_output_token_seconds` held the same; SGLang:
//! `sglang:inter_token_latency_seconds`, `python/sglang/srt/metrics/collector.py`). vLLM observes
//! it once per request at each engine step that gave the request tokens after its first
//! (`IterationStats::update_from_output`, `vllm/v1/metrics/stats.py`): with speculative decoding
//! a step may bring several, and the engine's gap then errs slow by that factor, which the
//! streams' windows (they count tokens) undercut in the least. The scrape
//! reads its sum and count ([`EngineCache::itl_ticks`], the sum in ticks). Each time the count
//! has grown by [`ENGINE_SAMPLE_TOKENS`] since the last sample, the growth of the sum over the
//! growth of the count closes a window into the same ring as the streams' windows: the
//! engine's speed over every sequence it decoded, for anyone, with no trip to the client in
//! it. Streams teach a backend's gap only once eight have ended, which on a slow engine with
//! long answers took seconds in which every first turn could go there; a scrape or two of
//! decoding teaches the counters'. A fleet whose clients never stream learns a gap from them
//! too; one whose engines export no histogram (an `openai` backend) and whose clients never
//! stream learns none (a whole response's time holds its queueing and prefill too), and its
//! placement weighs no decode.

use crate::clock::Tick;

use super::policy::EngineCache;

/// Streaming responses per decode window ([`Decode`]).
pub const DECODE_WINDOW_RESPONSES: u32 = 8;
/// Decode windows whose least gap is the backend's gap ([`Decode`]).
pub const DECODE_WINDOWS: usize = 8;
/// A backend's gap is kept in `1 / GAP_SCALE` ticks per output token.
pub const GAP_SCALE: u64 = 1 << 10;
/// How much slower than the least gap a backend's gap must be before its decode counts in the
/// cost, in per cent of the least: a gap holds its engine's load as well as its speed (a step
/// with a prefill chunk in it is long), and the sharper the tolerance, the more often engines
/// of one kind differ past it by load alone. Chosen by measurement in the fleet lab
/// (`perf/RESULTS.md`, sixteenth session): at 50 % the gap moved placements on two equal
/// engines in 34 of 108 runs, at 100 % in 16 (each within the runs' spread), with the gains on
/// an H100 beside an L4 kept.
pub const GAP_TOLERANCE_PERCENT: u64 = 100;
/// Once the output-length sums count this many responses, both halve ([`OutputLength`]).
pub const OUTPUT_HORIZON: u64 = 1 << 10;
/// The engine's own inter-token count must have grown by this many tokens since the last
/// sample before its sums make another ([`Decode::engine_counters`]); below it they wait for
/// a later scrape, so one step of one sequence is never a sample alone.
pub const ENGINE_SAMPLE_TOKENS: u64 = 16;

/// One backend's decode speed, from its streaming responses: windows of
/// [`DECODE_WINDOW_RESPONSES`] responses, each their output tokens after the first over the
/// ticks from first byte to end, and the least of the last [`DECODE_WINDOWS`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Decode {
    /// The window being filled.
    tokens: u64,
    ticks: u64,
    responses: u32,
    /// The last windows' gaps, a ring (0: none yet).
    windows: [u64; DECODE_WINDOWS],
    next: usize,
    /// The least gap of `windows`: ticks per output token of one sequence, in
    /// `1 / GAP_SCALE`; 0 before the first window closes.
    pub gap: u64,
    /// When a window last closed.
    pub gap_at: Tick,
    /// The engine's inter-token counters (ticks, tokens) at its last sample, or at the first
    /// scrape that exported them; `None` when the last scrape did not.
    engine: Option<(u64, u64)>,
}

impl Decode {
    pub const NEW: Decode = Decode {
        tokens: 0,
        ticks: 0,
        responses: 0,
        windows: [0; DECODE_WINDOWS],
        next: 0,
        gap: 0,
        gap_at: 0,
        engine: None,
    };

    /// A streaming response that ended at `now` decoded `tokens` tokens after its first in
    /// `ticks`.
    pub fn observe(&mut self, tokens: u32, ticks: u64, now: Tick) {
        if tokens == 0 {
            return;
        }
        self.tokens += u64::from(tokens);
        self.ticks = self.ticks.saturating_add(ticks);
        self.responses += 1;
        if self.responses < DECODE_WINDOW_RESPONSES {
            return;
        }
        let (tokens, ticks) = (self.tokens, self.ticks);
        (self.tokens, self.ticks, self.responses) = (0, 0, 0);
        self.close(tokens, ticks, now);
    }

    /// A scrape's inter-token counters of the engine (`ticks` summed over `tokens`,
    /// cumulative; [`EngineCache::NO_COUNTER`] when not exported); `new_engine` when the
    /// backend's address moved to another engine since the last report. Once the count has
    /// grown by [`ENGINE_SAMPLE_TOKENS`] since the last sample, the growth of the sum over the
    /// growth of the count closes a window, as [`DECODE_WINDOW_RESPONSES`] responses do. A
    /// counter that went down (the engine restarted) or one not exported starts over.
    pub fn engine_counters(&mut self, ticks: u64, tokens: u64, new_engine: bool, now: Tick) {
        let exported = ticks != EngineCache::NO_COUNTER && tokens != EngineCache::NO_COUNTER;
        let last = self.engine.filter(|&(t0, n0)| !new_engine && ticks >= t0 && tokens >= n0);
        match last {
            _ if !exported => self.engine = None,
            None => self.engine = Some((ticks, tokens)),
            Some((t0, n0)) if tokens - n0 >= ENGINE_SAMPLE_TOKENS => {
                self.engine = Some((ticks, tokens));
                self.close(tokens - n0, ticks - t0, now);
            }
            Some(_) => {}
        }
    }

    /// Closes a window of `tokens` output tokens in `ticks`.
    fn close(&mut self, tokens: u64, ticks: u64, now: Tick) {
        let gap = u128::from(ticks) * u128::from(GAP_SCALE) / u128::from(tokens);
        self.windows[self.next] = u64::try_from(gap).unwrap_or(u64::MAX).max(1);
        self.next = (self.next + 1) % DECODE_WINDOWS;
        self.gap = self.windows.iter().copied().filter(|&gap| gap > 0).min().unwrap_or(0);
        self.gap_at = now;
    }
}

/// The output tokens of a model's non-streaming responses, summed with their count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OutputLength {
    tokens: u64,
    responses: u64,
}

impl OutputLength {
    pub const NEW: OutputLength = OutputLength { tokens: 0, responses: 0 };

    /// A non-streaming response had `tokens` output tokens.
    pub fn observe(&mut self, tokens: u32) {
        self.tokens += u64::from(tokens);
        self.responses += 1;
        if self.responses > OUTPUT_HORIZON {
            (self.tokens, self.responses) = (self.tokens / 2, self.responses / 2);
        }
    }

    /// The mean output tokens; 0 before the first response.
    pub fn mean(&self) -> u64 {
        self.tokens.checked_div(self.responses).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decode_speed_is_the_least_window_and_output_length_a_mean_that_follows() {
        let mut d = Decode::NEW;
        d.observe(0, 5_000, 1);
        assert_eq!(d.responses, 0, "a one-token response teaches nothing");
        for _ in 1..DECODE_WINDOW_RESPONSES {
            d.observe(100, 1_000_000, 1);
        }
        assert_eq!(d.gap, 0, "no window closed yet");
        d.observe(300, 1_000_000, 2);
        assert_eq!(d.gap_at, 2);
        let tokens = u64::from(DECODE_WINDOW_RESPONSES - 1) * 100 + 300;
        let ticks = u64::from(DECODE_WINDOW_RESPONSES) * 1_000_000;
        assert_eq!(d.gap, ticks * GAP_SCALE / tokens, "the window's sums' ratio");
        let first = d.gap;
        // A loaded window (longer steps) leaves the least; a lighter one takes over.
        let window = |d: &mut Decode, ticks: u64| {
            for _ in 0..DECODE_WINDOW_RESPONSES {
                d.observe(100, ticks, 3);
            }
        };
        window(&mut d, 3_000_000);
        assert_eq!(d.gap, first);
        window(&mut d, 500_000);
        assert_eq!(d.gap, 5_000 * GAP_SCALE);
        // A slower engine takes over once the last lighter window is out of the ring.
        for _ in 0..DECODE_WINDOWS - 1 {
            window(&mut d, 1_500_000);
        }
        assert_eq!(d.gap, 5_000 * GAP_SCALE, "still in the ring");
        window(&mut d, 1_500_000);
        assert_eq!(d.gap, 15_000 * GAP_SCALE);
        let mut o = OutputLength::NEW;
        assert_eq!(o.mean(), 0);
        o.observe(100);
        o.observe(300);
        assert_eq!(o.mean(), 200);
        for _ in 0..4 * OUTPUT_HORIZON {
            o.observe(50);
        }
        assert!(o.responses <= OUTPUT_HORIZON);
        assert!((50..=53).contains(&o.mean()), "{} tokens", o.mean());
    }

    #[test]
    fn the_engines_inter_token_counters_close_a_window_per_sixteen_tokens_they_grow() {
        let none = EngineCache::NO_COUNTER;
        let mut d = Decode::NEW;
        d.engine_counters(5_000, 10, false, 1);
        assert_eq!(d.gap, 0, "the first report is only a baseline");
        d.engine_counters(5_000 + 15 * 300, 25, false, 2);
        assert_eq!(d.gap, 0, "15 tokens wait for more");
        d.engine_counters(5_000 + 20 * 300, 30, false, 3);
        assert_eq!((d.gap, d.gap_at), (300 * GAP_SCALE, 3), "20 tokens at 300 ticks each");
        // A slower interval stays out of the least; a faster one takes over.
        d.engine_counters(11_000 + 16 * 900, 46, false, 4);
        assert_eq!(d.gap, 300 * GAP_SCALE);
        d.engine_counters(25_400 + 16 * 100, 62, false, 5);
        assert_eq!(d.gap, 100 * GAP_SCALE);
        // A restart (counters lower) is a baseline; the next report counts from it.
        d.engine_counters(0, 3, false, 6);
        d.engine_counters(16 * 50, 19, false, 7);
        assert_eq!(d.gap, 50 * GAP_SCALE);
        // A new engine's report is a baseline too, whatever its counters: as a sample this
        // one would read 10 ticks a token.
        d.engine_counters(800 + 100 * 10, 119, true, 8);
        assert_eq!(d.gap, 50 * GAP_SCALE, "no sample across engines");
        // A report without the counters forgets the baseline.
        d.engine_counters(none, none, false, 9);
        d.engine_counters(1_800 + 100 * 10, 219, false, 10);
        assert_eq!(d.gap, 50 * GAP_SCALE, "a baseline again");
        d.engine_counters(2_800 + 16 * 20, 235, false, 11);
        assert_eq!(d.gap, 20 * GAP_SCALE);
        // Streamed responses close windows into the same ring.
        for _ in 0..DECODE_WINDOW_RESPONSES {
            d.observe(100, 100 * 15, 12);
        }
        assert_eq!(d.gap, 15 * GAP_SCALE);
    }
}
