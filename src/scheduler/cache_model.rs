//! What each backend's engine says about its caches, and what the scheduler learns from it
//! (issue \[8\]): the KV capacity that sizes the prefix index and the calibration of that size
//! against the hits the engine reports, the engine's restarts, and the KV pressure that weighs
//! a decoding sequence in S16's cost. Part of what the scheduler learns, with `estimate`, and
//! sans-IO and integer-only like it, so the reference model restates it exactly.
//!
//! ## KV capacity and the prefix index (per backend)
//!
//! The prefix index remembers the prompts sent to a backend so that placement can predict what the
//! engine still holds; it should remember about as much as the engine's KV cache does. An engine
//! that exports its capacity (vLLM's `cache_config_info`, SGLang's `max_total_num_tokens`) gives it
//! in tokens; converted at the learned tokens per byte it is the index's *nominal* size in blocks.
//! How much of its capacity an engine keeps for finished prompts depends on its load and its
//! eviction order, so the size is then calibrated against what the engine reports it found cached:
//! over [`CALIBRATION_TOKENS`] of prompt, the tokens the index predicted cached are compared with
//! the tokens the engine says were (`usage.prompt_tokens_details.cached_tokens` per request, or the
//! difference of its prefix-cache counters between snapshots); an index that predicts half again
//! more than the engine found (it remembers what the engine has evicted) shrinks by a quarter, one
//! whose engine found a quarter again more than it predicted grows by a quarter, within
//! [`INDEX_SCALE_MIN`]–[`INDEX_SCALE_MAX`] times its nominal size. With no exported capacity the
//! calibration starts from the configured default. This is the "learned from hits and misses" path
//! of issue \[8\].
//!
//! ## KV pressure ([`CacheModel::kv_usage`], per backend)
//!
//! How much a sequence a backend is decoding delays the next prefill there depends on how full the
//! engine's KV cache runs: where the workload fills it, a new request waits for a decoding sequence
//! to finish; where it never does, a decoding sequence costs a new request almost nothing. Each
//! scrape's KV usage (vLLM's `kv_cache_usage_perc`, SGLang's `token_usage`) moves the backend's
//! *pressure* a [`KV_PRESSURE_SCRAPES`]th of the way to it, an average over the last half-minute or
//! so: the regime the workload puts the engine in, not one burst. The pressure, or the router's
//! own count of the contexts it holds there when that is larger (`placement`'s held pressure),
//! sets the backend's decode weight in the S16 cost (`cost::decode_weight`).

use crate::clock::Tick;

use super::EngineCache;

/// Prompt tokens per calibration of the prefix index's size.
pub const CALIBRATION_TOKENS: u64 = 1 << 20;
/// Bounds of the index's size, in quarters of its nominal size (0.5x to 8x).
pub const INDEX_SCALE_MIN: u32 = 2;
pub const INDEX_SCALE_MAX: u32 = 32;
/// The nominal size of an auto-sized index, in blocks, until its engine exports a capacity
/// (2 MiB of prompt text, about half a million tokens: a mid-size engine's KV cache).
pub const INDEX_DEFAULT_BLOCKS: u32 = 8_192;
/// The index's starting size, in quarters of its nominal size (2x).
pub const INDEX_SCALE_START: u32 = 8;
/// The scrapes a backend's KV pressure averages over ([`CacheModel::kv_usage`]): about half a
/// minute at the default `metrics_interval` of one second.
pub const KV_PRESSURE_SCRAPES: u64 = 32;

/// What a backend's engine said about its caches, and the calibration of its prefix index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CacheModel {
    /// KV capacity in tokens, as last exported (0: never exported), and when.
    pub kv_capacity_tokens: u64,
    pub kv_capacity_at: Tick,
    /// The engine's prefix-cache counters at the last snapshot that had them.
    counters: Option<(u64, u64)>,
    /// Prompt tokens admitted, tokens the index predicted cached, and tokens the engine found
    /// cached, in the current calibration period.
    period_tokens: u64,
    period_predicted: u64,
    period_engine: u64,
    /// Whether `period_engine` comes from responses (else from counters, or nothing yet).
    period_from_usage: bool,
    /// Hit ratios of the last closed period, in millionths, and when it closed.
    pub predicted_micro: u64,
    pub engine_micro: u64,
    pub hit_ratio_at: Tick,
    /// The engine's ratio over the last snapshot interval, from its counters (millionths).
    pub counter_micro: Option<u64>,
    pub counter_at: Tick,
    /// The index size as a multiple of its nominal size, in quarters.
    pub index_scale: u32,
    /// Restarts of the engine seen in its counters ([`CacheModel::snapshot`]), and when the
    /// last was seen.
    pub restarts: u64,
    pub restarted_at: Tick,
    /// The engine's KV usage averaged over its last scrapes ([`CacheModel::kv_usage`]), in
    /// millionths (with the router's own count it sets the backend's decode weight in S16's
    /// cost), and when a scrape last reported it.
    pub kv_pressure_micro: u64,
    pub kv_pressure_at: Tick,
}

/// What a snapshot's cache report changed ([`CacheModel::snapshot`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reported {
    /// The engine exported a KV capacity other than the last one.
    pub capacity_changed: bool,
    /// The engine restarted since the last snapshot with counters: its caches are empty.
    pub restarted: bool,
}

impl CacheModel {
    pub const NEW: CacheModel = CacheModel {
        kv_capacity_tokens: 0,
        kv_capacity_at: 0,
        counters: None,
        period_tokens: 0,
        period_predicted: 0,
        period_engine: 0,
        period_from_usage: false,
        predicted_micro: 0,
        engine_micro: 0,
        hit_ratio_at: 0,
        counter_micro: None,
        counter_at: 0,
        index_scale: INDEX_SCALE_START,
        restarts: 0,
        restarted_at: 0,
        kv_pressure_micro: 0,
        kv_pressure_at: 0,
    };

    /// The engine is a new one at `now` (its counters went down, or its backend's address
    /// moved): counted; the calibration period under way is dropped, and the next counters
    /// reported start a new baseline.
    pub fn restarted(&mut self, now: Tick) {
        self.restarts += 1;
        self.restarted_at = now;
        (self.period_tokens, self.period_predicted, self.period_engine) = (0, 0, 0);
        self.period_from_usage = false;
        self.counters = None;
    }

    /// A request was placed with `tokens` estimated prompt tokens, of which the index
    /// predicted `cached`.
    pub fn placed(&mut self, tokens: u64, cached: u64) {
        self.period_tokens += tokens;
        self.period_predicted += cached;
    }

    /// A response reported that the engine found `cached` of `prompt` tokens cached (engine
    /// tokens), for a request of `estimated` estimated tokens.
    pub fn usage(&mut self, prompt: u32, cached: u32, estimated: u64) {
        if prompt == 0 {
            return;
        }
        self.period_from_usage = true;
        let scaled = u128::from(cached) * u128::from(estimated) / u128::from(prompt);
        self.period_engine += u64::try_from(scaled).unwrap_or(u64::MAX);
    }

    /// A snapshot's cache report at `now`: whether the exported capacity changed, and whether
    /// the engine restarted.
    ///
    /// A restart is a prefix-cache counter lower than at the last snapshot that had them: the
    /// counters only grow while the engine runs (Prometheus counters restart from zero with
    /// their process), so one that went down belongs to a new process, whose KV cache starts
    /// empty. It is no sample of the hit ratio, and it ends the calibration period without
    /// closing it: what the index predicted before the restart was predicted of a cache that
    /// is gone.
    pub fn snapshot(&mut self, now: Tick, capacity: u32, queries: u64, hits: u64) -> Reported {
        let mut reported = Reported {
            capacity_changed: capacity != 0 && u64::from(capacity) != self.kv_capacity_tokens,
            restarted: false,
        };
        if capacity != 0 {
            self.kv_capacity_tokens = u64::from(capacity);
            self.kv_capacity_at = now;
        }
        let known = queries != EngineCache::NO_COUNTER && hits != EngineCache::NO_COUNTER;
        if !known {
            return reported;
        }
        if let Some((q0, h0)) = self.counters {
            if queries < q0 || hits < h0 {
                reported.restarted = true;
                self.restarted(now);
            } else if queries > q0 {
                let (dq, dh) = (queries - q0, (hits - h0).min(queries - q0));
                self.counter_micro = Some(dh * 1_000_000 / dq);
                self.counter_at = now;
                if !self.period_from_usage {
                    // No per-response figures: the counters' share stands for the period's.
                    let share = u128::from(dh) * u128::from(self.period_tokens) / u128::from(dq);
                    self.period_engine = u64::try_from(share).unwrap_or(u64::MAX);
                }
            }
        }
        self.counters = Some((queries, hits));
        reported
    }

    /// A scrape at `now` reported the engine's KV usage (millionths; [`EngineCache::NO_USAGE`]
    /// when not exported): the pressure moves a [`KV_PRESSURE_SCRAPES`]th of the way to it, so
    /// it follows the workload's hold on the cache over the last few dozen scrapes, not one
    /// burst.
    pub fn kv_usage(&mut self, now: Tick, usage_micro: u32) {
        if usage_micro == EngineCache::NO_USAGE {
            return;
        }
        self.kv_pressure_at = now;
        let usage = u64::from(usage_micro.min(1_000_000));
        self.kv_pressure_micro =
            (self.kv_pressure_micro * (KV_PRESSURE_SCRAPES - 1) + usage) / KV_PRESSURE_SCRAPES;
    }

    /// Closes the calibration period at `now` if it holds enough tokens and the engine's side
    /// is known; returns whether the index scale changed.
    pub fn calibrate(&mut self, now: Tick) -> bool {
        if self.period_tokens < CALIBRATION_TOKENS {
            return false;
        }
        let engine_known = self.period_from_usage || self.counter_micro.is_some();
        let (tokens, predicted, engine) =
            (self.period_tokens, self.period_predicted, self.period_engine);
        (self.period_tokens, self.period_predicted, self.period_engine) = (0, 0, 0);
        self.period_from_usage = false;
        self.predicted_micro = predicted * 1_000_000 / tokens;
        self.engine_micro = engine * 1_000_000 / tokens;
        self.hit_ratio_at = now;
        if !engine_known {
            return false;
        }
        let old = self.index_scale;
        // Markedly: half again more than the engine found, or a quarter again less, and not
        // a rounding of a few blocks (1 % of the period's tokens).
        let slack = tokens / 100;
        if predicted > engine + engine / 2 + slack {
            self.index_scale = (old - old / 4).max(INDEX_SCALE_MIN);
        } else if predicted + predicted / 4 + slack < engine {
            self.index_scale = (old + old.div_ceil(4)).min(INDEX_SCALE_MAX);
        }
        self.index_scale != old
    }

    /// The index size in blocks: `nominal` (from the exported capacity, or the configured
    /// default) times the scale.
    pub fn index_blocks(&self, nominal: u64) -> u64 {
        (nominal * u64::from(self.index_scale) / 4).max(1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_index_grows_when_it_forgets_what_the_engine_holds_and_shrinks_when_it_claims_more() {
        let mut c = CacheModel::NEW;
        let nominal = 1000;
        assert_eq!(c.index_blocks(nominal), 2000, "starts at twice nominal");
        // The index predicted a tenth cached, the engine found half: grow by a quarter.
        c.placed(CALIBRATION_TOKENS, CALIBRATION_TOKENS / 10);
        c.usage(1000, 500, CALIBRATION_TOKENS);
        assert!(c.calibrate(5));
        assert_eq!(c.index_blocks(nominal), 2500);
        // Predicted half, the engine found a tenth: shrink by a quarter.
        c.placed(CALIBRATION_TOKENS, CALIBRATION_TOKENS / 2);
        c.usage(1000, 100, CALIBRATION_TOKENS);
        assert!(c.calibrate(6));
        assert_eq!(c.index_blocks(nominal), 2000);
        // Within the band: no change.
        c.placed(CALIBRATION_TOKENS, CALIBRATION_TOKENS / 10);
        c.usage(1000, 110, CALIBRATION_TOKENS);
        assert!(!c.calibrate(7));
        // Not enough tokens yet: nothing closes.
        c.placed(CALIBRATION_TOKENS / 2, 0);
        assert!(!c.calibrate(8));
    }

    #[test]
    fn engine_counters_stand_in_for_missing_usage_and_a_restart_is_not_a_sample() {
        let mut c = CacheModel::NEW;
        let news = Reported { capacity_changed: true, restarted: false };
        assert_eq!(c.snapshot(1, 442_368, 1_000, 100), news, "a capacity is news");
        let same = c.snapshot(2, 442_368, 1_000, 100);
        assert!(!same.capacity_changed, "the same capacity is not");
        c.placed(CALIBRATION_TOKENS, 0);
        assert!(!c.snapshot(3, 0, 3_000, 1_100).restarted, "counters that grew");
        assert_eq!(c.counter_micro, Some(500_000));
        assert_eq!(c.kv_capacity_tokens, 442_368, "a scrape without capacity keeps it");
        assert!(c.calibrate(4), "predicted nothing, the counters say half: grow");
        // The engine restarted: its counters went down. No sample, the new values kept.
        assert!(c.snapshot(5, 0, 10, 1).restarted);
        assert_eq!((c.restarts, c.restarted_at), (1, 5));
        assert_eq!(c.counter_micro, Some(500_000));
        assert!(!c.snapshot(6, 0, 110, 101).restarted);
        assert_eq!(c.counter_micro, Some(1_000_000));
        // Hits alone going down are a restart too (a new process that already served more).
        assert!(c.snapshot(7, 0, 200, 50).restarted);
        // Counters that disappear leave the last ratio alone, and are no restart.
        assert!(!c.snapshot(8, 0, EngineCache::NO_COUNTER, EngineCache::NO_COUNTER).restarted);
        assert_eq!(c.counter_micro, Some(1_000_000));
        assert_eq!(c.restarts, 2);
    }

    #[test]
    fn a_restart_drops_the_calibration_period_it_interrupts() {
        let mut c = CacheModel::NEW;
        c.snapshot(1, 0, 1_000, 500);
        // Most of a period predicted against the old cache, then the engine restarts: the
        // period starts again, so the misses of the empty cache are not held against the
        // index's size.
        c.placed(CALIBRATION_TOKENS - 1, CALIBRATION_TOKENS / 2);
        assert!(c.snapshot(2, 0, 0, 0).restarted);
        c.placed(1, 0);
        c.usage(1000, 0, 1);
        assert!(!c.calibrate(3), "the interrupted period's tokens are gone");
        assert_eq!(c.index_blocks(1000), 2000, "the scale is as it started");
    }
}
