//! Extracting an engine's scheduling gauges and what it says about its caches from its
//! `/metrics` body, written in the Prometheus text exposition format 0.0.4
//! (<https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format>).
//!
//! [`parse_gauges`] reads the whole body once, line by line, on byte slices: nothing is
//! allocated and no line is decoded as UTF-8 unless it belongs to a family we need. The
//! families (SPEC section 4, "Backend metrics scraped", and issue \[8\]):
//!
//! | field                | vLLM                                                                      | SGLang                        |
//! |----------------------|---------------------------------------------------------------------------|-------------------------------|
//! | `waiting`            | `vllm:num_requests_waiting`                                               | `sglang:num_queue_reqs`       |
//! | `running`            | `vllm:num_requests_running`                                               | `sglang:num_running_reqs`     |
//! | `cache_usage`        | `vllm:kv_cache_usage_perc`, else `vllm:gpu_cache_usage_perc`              | `sglang:token_usage`          |
//! | `kv_capacity_tokens` | labels of `vllm:cache_config_info` (below)                                | `sglang:max_total_num_tokens` |
//! | `prefix_queries`     | `vllm:prefix_cache_queries_total`, else `vllm:gpu_prefix_cache_queries_total` | `sglang:prompt_tokens_total`  |
//! | `prefix_hits`        | `vllm:prefix_cache_hits_total`, else `vllm:gpu_prefix_cache_hits_total`   | `sglang:cached_tokens_total`  |
//! | `preemptions`        | `vllm:num_preemptions_total`                                              | `sglang:num_retracted_requests_total` |
//! | `itl`                | `vllm:inter_token_latency_seconds_sum` and `_count`, else `vllm:time_per_output_token_seconds_sum` and `_count` | `sglang:inter_token_latency_seconds_sum` and `_count` |
//!
//! An older vLLM name is used only when the body holds no series of the newer one. Each field
//! is summed over its family's series (one per data-parallel engine), except `cache_usage`, a
//! fraction of each engine's own cache, which is their mean.
//!
//! Where the names come from:
//! - **vLLM** (V1 engine): `vllm/v1/metrics/loggers.py`, `PrometheusStatLogger`. The gauges and
//!   the counters `vllm:prefix_cache_queries` and `vllm:prefix_cache_hits` ("in terms of number
//!   of queried/cached tokens"; `prometheus_client` exports a counter as `NAME_total`) carry the
//!   labels `model_name` and `engine`, one series per data-parallel engine. The `gpu_` names
//!   are the same counters under their names before vLLM 0.9, which deprecated them and exports
//!   both. `vllm:cache_config_info` is an info gauge: `log_metrics_info("cache_config", ...)`
//!   sets one series per engine to 1 with a label for every attribute of the engine's
//!   `CacheConfig` (`metrics_info()` in `vllm/config/cache.py`: `str(value)` of each field), so
//!   among others `block_size` (tokens per block), `num_gpu_blocks` (set after profiling; the
//!   string `None` before) and, in newer releases, `kv_cache_size_tokens` ("per-DP-engine KV
//!   cache capacity in tokens (group-aware)", which `num_gpu_blocks` × `block_size` gets wrong
//!   for hybrid models).
//! - **SGLang**: `python/sglang/srt/metrics/collector.py`. `sglang:max_total_num_tokens` is a
//!   gauge of `SchedulerMetricsCollector` ("Maximum total number of tokens in the KV cache
//!   pool"). SGLang exports no prefix-cache query counter as vLLM does, but
//!   `TokenizerMetricsCollector` counts `sglang:prompt_tokens_total` (prompt tokens) and
//!   `sglang:cached_tokens_total` ("Number of cached prompt tokens") for every finished
//!   request, which are queries and hits in vLLM's sense, counted when a request finishes
//!   rather than when it is scheduled. `observe_one_finished_request` increments the cached
//!   counter only when a request had cached tokens, so its series appears with the first hit:
//!   for SGLang a body with prompt tokens and no cached-tokens series means 0 hits. Its
//!   `sglang:cache_hit_rate` gauge is a rate, not a counter, and is not read.
//! - **Preemptions**: vLLM's counter `vllm:num_preemptions` ("Cumulative number of preemption
//!   from the engine": a running request whose KV blocks were taken back, which goes to the
//!   front of the waiting queue to be recomputed) and SGLang's `sglang:num_retracted_requests`
//!   ("Total number of retracted requests", its name for the same; the older gauge
//!   `sglang:num_retracted_reqs` is not a count since start and is not read). Both are
//!   exported as `NAME_total`.
//! - **Inter-token latencies**: vLLM V1's histogram `vllm:inter_token_latency_seconds`
//!   (`loggers.py`; its deprecated twin `vllm:time_per_output_token_seconds` carries the same
//!   observations and is read only when the newer is absent) and SGLang's
//!   `sglang:inter_token_latency_seconds` (`collector.py`): one observation per output token
//!   after a request's first. Only the histogram's `_sum` and `_count` series are read, each
//!   summed over engines, and only as a pair from one name; the scheduler learns a decode
//!   speed from their growth (`scheduler::decode`).
//!
//! **The KV capacity of vLLM** is read from the labels of `vllm:cache_config_info`: per
//! series, `kv_cache_size_tokens` when it is a decimal integer, else `num_gpu_blocks` ×
//! `block_size` when both are; the capacities of several series (data-parallel engines) are
//! summed. Only those three labels are read, as written (a value with an escape is not a
//! number); the sample's value (1) is not read. **A strange info gauge leaves the capacity
//! unknown and fails nothing**: a series that is malformed, longer than `line_bytes_max`,
//! repeats one of the three labels or gives no capacity (`num_gpu_blocks="None"`), or a sum
//! that overflows `u64`, makes `kv_capacity_tokens` `None` for the whole scrape (a partial sum
//! would under-report), while the waiting gauge and everything else are read as usual. The
//! capacity is a tuning input; the waiting gauge gates admission and must not be lost to it.
//!
//! Grammar accepted, per line (`\n`-separated, one trailing `\r` dropped, leading and trailing
//! blanks and tabs allowed):
//! - empty lines, and comments (`#` first: `# HELP`, `# TYPE` and any other) are skipped;
//! - a sample is `name [{labels}] value [timestamp]`. The name is the token up to the first
//!   `{`, blank or tab, and a family matches only when the whole token equals its name:
//!   `vllm:num_requests_waiting_total` is not `vllm:num_requests_waiting`;
//! - labels are `label="value"` pairs separated by commas, with an optional trailing comma and
//!   blanks around tokens; a label name is `[a-zA-Z_][a-zA-Z0-9_]*`; a label value is a quoted
//!   string whose only escapes are `\"`, `\\` and `\n`, and which may hold `}`, `,`, blanks and
//!   any other byte (label values are not decoded: only the info gauge's three numbers are
//!   read, and those hold digits only);
//! - the value is a float as Rust's `f64::from_str` reads it (`1`, `1.5e3`, `+Inf`, `-Inf`,
//!   `NaN`), the timestamp an `i64` of milliseconds, which we ignore.
//!
//! A line whose name is not one we need is skipped without looking further, whatever it holds
//! (garbage, bytes that are not UTF-8, lines over the length limit). A line of a summed family
//! (every family but the info gauge) must be well formed, within `line_bytes_max`, and have a
//! finite, non-negative value; otherwise the whole scrape is a [`ScrapeError`] (a value of `-0`
//! counts as zero). We refuse rather than skip such a line because skipping one series of a
//! summed family would under-report the engine's queue. A body longer than `body_bytes_max` is
//! refused before any of it is read.
//!
//! **Several series of one family are summed** (SPEC section 4): vLLM exports one series per
//! `model_name` and per data-parallel `engine`, SGLang one per `model_name` (and rank labels).
//! Waiting and running counts, capacities and counters add up exactly. Cache usage is summed
//! too, as SPEC says: with one series it is the engine's fraction in `[0, 1]`; with several
//! (data-parallel ranks each reporting its own cache) it is the sum of their fractions and may
//! exceed 1. A consumer that wants a fraction divides by the number of ranks it knows of.
//! Nothing checks that two series have different labels: a duplicated series is counted
//! twice. A sum that overflows to infinity is an error, like an infinite sample.
//!
//! Every error is the backend's (upstream) fault and none is retried: the control thread treats
//! it as "metrics unavailable" for this interval (the snapshot carries `waiting: None` and an
//! unknown cache) and tries again at the next one.
//!
//! [`sum_families`] sums arbitrary families under the same grammar and refusals, for tools
//! that read other series (the bench reads the simulated engine's busy time).

use std::fmt;

use crate::clock::TickRate;
use crate::config::Engine;
use crate::scheduler::EngineCache;

#[cfg(any(test, fuzzing))]
pub mod reference;

/// The exposition dialect of an engine: which metric families hold its gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum EngineKind {
    /// vLLM: `vllm:*` families.
    Vllm,
    /// SGLang: `sglang:*` families.
    Sglang,
}

impl EngineKind {
    /// The dialect to scrape for a configured engine; `None` for `openai`, which is not scraped.
    pub fn for_engine(engine: Engine) -> Option<Self> {
        match engine {
            Engine::Vllm => Some(Self::Vllm),
            Engine::Sglang => Some(Self::Sglang),
            Engine::Openai => None,
        }
    }

    /// The families this engine exports what we read in, each with what it feeds.
    fn families(self) -> &'static [(&'static str, Field)] {
        use Field::{CacheConfigInfo, Sum as S};
        match self {
            Self::Vllm => &[
                ("vllm:num_requests_waiting", S(Sum::Waiting)),
                ("vllm:num_requests_running", S(Sum::Running)),
                ("vllm:kv_cache_usage_perc", S(Sum::CacheUsage)),
                ("vllm:gpu_cache_usage_perc", S(Sum::CacheUsageLegacy)),
                ("vllm:prefix_cache_queries_total", S(Sum::PrefixQueries)),
                ("vllm:prefix_cache_hits_total", S(Sum::PrefixHits)),
                ("vllm:gpu_prefix_cache_queries_total", S(Sum::PrefixQueriesLegacy)),
                ("vllm:gpu_prefix_cache_hits_total", S(Sum::PrefixHitsLegacy)),
                ("vllm:num_preemptions_total", S(Sum::Preemptions)),
                ("vllm:inter_token_latency_seconds_sum", S(Sum::ItlSeconds)),
                ("vllm:inter_token_latency_seconds_count", S(Sum::ItlCount)),
                ("vllm:time_per_output_token_seconds_sum", S(Sum::ItlSecondsLegacy)),
                ("vllm:time_per_output_token_seconds_count", S(Sum::ItlCountLegacy)),
                ("vllm:cache_config_info", CacheConfigInfo),
            ],
            Self::Sglang => &[
                ("sglang:num_queue_reqs", S(Sum::Waiting)),
                ("sglang:num_running_reqs", S(Sum::Running)),
                ("sglang:token_usage", S(Sum::CacheUsage)),
                ("sglang:max_total_num_tokens", S(Sum::KvCapacity)),
                ("sglang:prompt_tokens_total", S(Sum::PrefixQueries)),
                ("sglang:cached_tokens_total", S(Sum::PrefixHits)),
                ("sglang:num_retracted_requests_total", S(Sum::Preemptions)),
                ("sglang:inter_token_latency_seconds_sum", S(Sum::ItlSeconds)),
                ("sglang:inter_token_latency_seconds_count", S(Sum::ItlCount)),
            ],
        }
    }
}

/// What a family feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    /// The sum of its samples.
    Sum(Sum),
    /// vLLM's info gauge: the KV capacity in its labels.
    CacheConfigInfo,
}

/// The summed quantities, each an index into the sums of one scrape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Sum {
    Waiting,
    Running,
    CacheUsage,
    /// vLLM's older cache-usage name, used only when the newer one is absent.
    CacheUsageLegacy,
    KvCapacity,
    PrefixQueries,
    PrefixQueriesLegacy,
    PrefixHits,
    PrefixHitsLegacy,
    Preemptions,
    ItlSeconds,
    ItlCount,
    /// vLLM's older name of the inter-token histogram, used only when the newer is absent.
    ItlSecondsLegacy,
    ItlCountLegacy,
}

/// How many [`Sum`]s there are.
const SUMS: usize = 14;

/// What one scrape read, each summed over the series of its family; `None` when the body holds
/// no series of that family (or, for vLLM's capacity, a strange info gauge: see the module
/// doc). Every value present is finite and not negative.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineGauges {
    /// Requests queued inside the engine, not yet running.
    pub waiting: Option<f64>,
    /// Requests the engine is running (decoding or prefilling).
    pub running: Option<f64>,
    /// KV-cache usage, a fraction in `[0, 1]`: the mean over the family's series when the
    /// engine exports several (one per data-parallel engine, each with its own cache).
    pub cache_usage: Option<f64>,
    /// KV-cache capacity in tokens.
    pub kv_capacity_tokens: Option<f64>,
    /// Prefix-cache queries in tokens, cumulative since the engine started.
    pub prefix_queries: Option<f64>,
    /// Prefix-cache hits in tokens, cumulative since the engine started.
    pub prefix_hits: Option<f64>,
    /// Running requests the engine preempted back into its waiting queue, cumulative since it
    /// started.
    pub preemptions: Option<f64>,
    /// The engine's inter-token latencies since it started, in seconds, and their count (one
    /// per output token after a sequence's first); both or neither.
    pub itl: Option<(f64, f64)>,
}

impl EngineGauges {
    /// The waiting gauge as `scheduler::Snapshot::waiting` takes it: rounded to the nearest
    /// integer, saturating at `u32::MAX`.
    pub fn waiting_count(&self) -> Option<u32> {
        // `as` saturates for floats; the value is finite and not negative (parse_gauges checks).
        self.waiting.map(|waiting| waiting.round() as u32)
    }

    /// What the scrape says about the engine's caches and its decoding, as
    /// `scheduler::Snapshot::cache` takes it: values rounded to the nearest integer; a capacity
    /// saturating at `u32::MAX` (0 when unknown), counters at one below
    /// [`EngineCache::NO_COUNTER`] (which stands for a counter not exported), the KV usage in
    /// millionths and at most one whole, the inter-token sum in ticks of `rate`.
    pub fn cache(&self, rate: TickRate) -> EngineCache {
        let counter = |value: Option<f64>| {
            value.map_or(EngineCache::NO_COUNTER, |v| {
                (v.round() as u64).min(EngineCache::NO_COUNTER - 1)
            })
        };
        EngineCache {
            kv_capacity_tokens: self.kv_capacity_tokens.map_or(0, |v| v.round() as u32),
            prefix_queries: counter(self.prefix_queries),
            prefix_hits: counter(self.prefix_hits),
            preemptions: counter(self.preemptions),
            kv_usage_micro: self
                .cache_usage
                .map_or(EngineCache::NO_USAGE, |usage| (usage.min(1.0) * 1e6).round() as u32),
            itl_ticks: counter(self.itl.map(|(seconds, _)| seconds * 1e9 * rate.ticks_per_ns())),
            itl_count: counter(self.itl.map(|(_, count)| count)),
        }
    }
}

/// Bounds on one scrape, both inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrapeLimits {
    /// A longer body is refused before any of it is parsed.
    pub body_bytes_max: usize,
    /// A longer line (without its `\r\n` and leading blanks) of a summed family is an error; a
    /// longer line of the info gauge leaves the capacity unknown; a longer line of any other
    /// family is skipped like the rest of that family.
    pub line_bytes_max: usize,
}

impl Default for ScrapeLimits {
    /// 4 MiB bodies, 64 KiB lines: a vLLM `/metrics` body is tens of KiB, its longest lines
    /// (the cache-config info gauge, histogram buckets, LoRA adapter lists) about a kilobyte.
    fn default() -> Self {
        Self { body_bytes_max: 4 << 20, line_bytes_max: 64 << 10 }
    }
}

/// Why a scrape gave no gauges. Line numbers count from 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScrapeError {
    /// The body is longer than `body_bytes_max`.
    BodyTooLarge {
        /// The body's length.
        body_bytes: usize,
        /// The limit it broke.
        body_bytes_max: usize,
    },
    /// A line of a needed family is longer than `line_bytes_max`.
    LineTooLong {
        /// Where the line is.
        line: usize,
        /// The family it belongs to.
        family: &'static str,
    },
    /// A line of a needed family does not follow the grammar (labels, value, timestamp).
    Malformed {
        /// Where the line is.
        line: usize,
        /// The family it belongs to.
        family: &'static str,
    },
    /// A sample of a needed family is NaN, infinite or negative, or the family's sum overflowed.
    BadValue {
        /// Where the line is.
        line: usize,
        /// The family it belongs to.
        family: &'static str,
    },
}

impl fmt::Display for ScrapeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Self::BodyTooLarge { body_bytes, body_bytes_max } => write!(
                f,
                "metrics body of {body_bytes} bytes is over the limit of {body_bytes_max}"
            ),
            Self::LineTooLong { line, family } => {
                write!(f, "metrics line {line} ({family}) is over the line length limit")
            }
            Self::Malformed { line, family } => {
                write!(f, "metrics line {line} ({family}) is malformed")
            }
            Self::BadValue { line, family } => write!(
                f,
                "metrics line {line} ({family}) has a NaN, infinite or negative value, \
                 or the family's sum overflows"
            ),
        }
    }
}

impl std::error::Error for ScrapeError {}

/// Extracts what `kind` exports from a `/metrics` body (the module doc gives the grammar, the
/// families and what is refused). Reads the body once; allocates nothing.
pub fn parse_gauges(
    kind: EngineKind,
    text: &[u8],
    limits: &ScrapeLimits,
) -> Result<EngineGauges, ScrapeError> {
    check_body(text, limits)?;
    let families = kind.families();
    let mut sums = [None; SUMS];
    let mut series = [0u32; SUMS];
    let mut capacity = Capacity::Unseen;
    for (number, line, name) in lines(text) {
        let Some(&(family, field)) = families.iter().find(|(f, _)| f.as_bytes() == name) else {
            continue; // comments, blank lines and every family we do not need
        };
        match field {
            Field::Sum(sum) => {
                add_sample(line, number, family, limits, &mut sums[sum as usize])?;
                series[sum as usize] += 1;
            }
            Field::CacheConfigInfo => {
                capacity = capacity.add(series_capacity(line, family, limits));
            }
        }
    }
    let sum = |s: Sum| sums[s as usize];
    let mean = |s: Sum| sum(s).map(|total| total / f64::from(series[s as usize]));
    let both = |a: Sum, b: Sum| sum(a).zip(sum(b));
    let prefix_queries = sum(Sum::PrefixQueries).or(sum(Sum::PrefixQueriesLegacy));
    let mut prefix_hits = sum(Sum::PrefixHits).or(sum(Sum::PrefixHitsLegacy));
    if kind == EngineKind::Sglang && prefix_queries.is_some() {
        // SGLang creates the cached-tokens series at the first hit (module doc).
        prefix_hits = prefix_hits.or(Some(0.0));
    }
    Ok(EngineGauges {
        waiting: sum(Sum::Waiting),
        running: sum(Sum::Running),
        cache_usage: mean(Sum::CacheUsage).or(mean(Sum::CacheUsageLegacy)),
        kv_capacity_tokens: sum(Sum::KvCapacity).or(capacity.tokens()),
        prefix_queries,
        prefix_hits,
        preemptions: sum(Sum::Preemptions),
        itl: both(Sum::ItlSeconds, Sum::ItlCount)
            .or(both(Sum::ItlSecondsLegacy, Sum::ItlCountLegacy)),
    })
}

/// Sums the samples of each family of `names` into `sums[i]` (`None` when the body holds no
/// series of `names[i]`), under the grammar and refusals of [`parse_gauges`]'s summed families.
/// Reads the body once; allocates nothing.
///
/// # Panics
/// When `sums` and `names` differ in length.
pub fn sum_families(
    text: &[u8],
    names: &[&'static str],
    limits: &ScrapeLimits,
    sums: &mut [Option<f64>],
) -> Result<(), ScrapeError> {
    assert_eq!(names.len(), sums.len(), "one sum per family");
    sums.fill(None);
    check_body(text, limits)?;
    for (number, line, name) in lines(text) {
        if let Some(index) = names.iter().position(|n| n.as_bytes() == name) {
            add_sample(line, number, names[index], limits, &mut sums[index])?;
        }
    }
    Ok(())
}

fn check_body(text: &[u8], limits: &ScrapeLimits) -> Result<(), ScrapeError> {
    if text.len() > limits.body_bytes_max {
        return Err(ScrapeError::BodyTooLarge {
            body_bytes: text.len(),
            body_bytes_max: limits.body_bytes_max,
        });
    }
    Ok(())
}

/// Each line of `text`: its number (from 1), the line without its `\r` and leading blanks, and
/// its name token (up to the first `{`, blank or tab).
fn lines(text: &[u8]) -> impl Iterator<Item = (usize, &[u8], &[u8])> {
    text.split(|&b| b == b'\n').enumerate().map(|(index, raw)| {
        let line = trim_blanks_start(raw.strip_suffix(b"\r").unwrap_or(raw));
        let name_len = line.iter().position(|&b| matches!(b, b'{' | b' ' | b'\t'));
        (index + 1, line, &line[..name_len.unwrap_or(line.len())])
    })
}

/// Adds the sample on `line` (of `family`, line `number`) to `slot`, or says why the scrape is
/// refused.
fn add_sample(
    line: &[u8],
    number: usize,
    family: &'static str,
    limits: &ScrapeLimits,
    slot: &mut Option<f64>,
) -> Result<(), ScrapeError> {
    if line.len() > limits.line_bytes_max {
        return Err(ScrapeError::LineTooLong { line: number, family });
    }
    let value = parse_sample(&line[family.len()..], |_, _| {})
        .ok_or(ScrapeError::Malformed { line: number, family })?;
    let sum = slot.unwrap_or(0.0) + value;
    // A NaN or infinite sample makes the sum NaN or infinite, as does an overflow.
    if value < 0.0 || !sum.is_finite() {
        return Err(ScrapeError::BadValue { line: number, family });
    }
    *slot = Some(sum);
    Ok(())
}

/// The KV capacity over the series of vLLM's info gauge seen so far.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Capacity {
    /// No series yet.
    Unseen,
    /// The sum of the capacities of every series so far.
    Tokens(u64),
    /// A series gave no capacity, or the sum overflowed: unknown for this scrape.
    Unknown,
}

impl Capacity {
    /// With one more series, which gave `series` tokens (`None`: no capacity).
    fn add(self, series: Option<u64>) -> Capacity {
        match (self, series) {
            (Capacity::Unknown, _) | (_, None) => Capacity::Unknown,
            (Capacity::Unseen, Some(tokens)) => Capacity::Tokens(tokens),
            (Capacity::Tokens(sum), Some(tokens)) => {
                sum.checked_add(tokens).map_or(Capacity::Unknown, Capacity::Tokens)
            }
        }
    }

    fn tokens(self) -> Option<f64> {
        match self {
            // Exact below 2^53 tokens.
            Capacity::Tokens(tokens) => Some(tokens as f64),
            Capacity::Unseen | Capacity::Unknown => None,
        }
    }
}

/// The capacity one `vllm:cache_config_info` line gives, or `None` (module doc).
fn series_capacity(line: &[u8], family: &str, limits: &ScrapeLimits) -> Option<u64> {
    if line.len() > limits.line_bytes_max {
        return None;
    }
    let mut labels = CacheLabels::default();
    parse_sample(&line[family.len()..], |name, value| labels.see(name, value))?;
    labels.tokens()
}

/// The labels of one info-gauge series that give the KV capacity, as written.
#[derive(Debug, Default)]
struct CacheLabels<'a> {
    num_gpu_blocks: Option<&'a [u8]>,
    block_size: Option<&'a [u8]>,
    kv_cache_size_tokens: Option<&'a [u8]>,
    /// One of them appeared twice.
    repeated: bool,
}

impl<'a> CacheLabels<'a> {
    fn see(&mut self, name: &[u8], value: &'a [u8]) {
        let slot = match name {
            b"num_gpu_blocks" => &mut self.num_gpu_blocks,
            b"block_size" => &mut self.block_size,
            b"kv_cache_size_tokens" => &mut self.kv_cache_size_tokens,
            _ => return,
        };
        self.repeated |= slot.replace(value).is_some();
    }

    /// `kv_cache_size_tokens` when it is a number, else `num_gpu_blocks` × `block_size`.
    fn tokens(&self) -> Option<u64> {
        if self.repeated {
            return None;
        }
        self.kv_cache_size_tokens
            .and_then(decimal)
            .or_else(|| decimal(self.num_gpu_blocks?)?.checked_mul(decimal(self.block_size?)?))
    }
}

/// A label value of ASCII digits only (at least one) as a `u64`; `None` otherwise or on
/// overflow.
fn decimal(value: &[u8]) -> Option<u64> {
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        let digit = b.is_ascii_digit().then(|| u64::from(b - b'0'))?;
        n.checked_mul(10)?.checked_add(digit)
    })
}

/// Reads what follows a needed family's name: optional labels (each name and raw value given
/// to `label`), the value, an optional timestamp. Returns the value (NaN and infinities
/// included: the caller judges them), or `None` when the rest of the line does not follow the
/// grammar.
fn parse_sample<'a>(rest: &'a [u8], label: impl FnMut(&'a [u8], &'a [u8])) -> Option<f64> {
    let mut rest = trim_blanks_start(rest);
    if rest.first() == Some(&b'{') {
        rest = trim_blanks_start(walk_labels(rest, label)?);
    }
    let (value, rest) = split_token(rest);
    let (timestamp, rest) = split_token(trim_blanks_start(rest));
    if !trim_blanks_start(rest).is_empty() {
        return None;
    }
    if !timestamp.is_empty() {
        std::str::from_utf8(timestamp).ok()?.parse::<i64>().ok()?;
    }
    if value.is_empty() {
        return None;
    }
    std::str::from_utf8(value).ok()?.parse::<f64>().ok()
}

/// Walks a label set starting at its `{`, giving each label's name and value (between its
/// quotes, escapes not decoded) to `label`; returns what follows the `}`, or `None` when the
/// set is malformed or not closed on this line.
fn walk_labels<'a>(line: &'a [u8], mut label: impl FnMut(&'a [u8], &'a [u8])) -> Option<&'a [u8]> {
    let mut rest = &line[1..];
    loop {
        rest = trim_blanks_start(rest);
        if let Some(after) = rest.strip_prefix(b"}") {
            return Some(after);
        }
        let name_len = rest.iter().position(|&b| !is_label_name_byte(b)).unwrap_or(rest.len());
        if name_len == 0 || rest[0].is_ascii_digit() {
            return None;
        }
        let name = &rest[..name_len];
        rest = trim_blanks_start(&rest[name_len..]);
        rest = trim_blanks_start(rest.strip_prefix(b"=")?);
        let quoted = rest.strip_prefix(b"\"")?;
        let after = skip_quoted(quoted)?;
        label(name, &quoted[..quoted.len() - after.len() - 1]);
        rest = trim_blanks_start(after);
        match rest.split_first()? {
            (b',', after) => rest = after,
            (b'}', after) => return Some(after),
            _ => return None,
        }
    }
}

/// Skips a label value after its opening quote; returns what follows the closing quote, or
/// `None` on an unknown escape or a missing closing quote.
fn skip_quoted(value: &[u8]) -> Option<&[u8]> {
    let mut i = 0;
    loop {
        match *value.get(i)? {
            b'"' => return Some(&value[i + 1..]),
            b'\\' => match *value.get(i + 1)? {
                b'"' | b'\\' | b'n' => i += 2,
                _ => return None,
            },
            _ => i += 1,
        }
    }
}

/// `[a-zA-Z0-9_]`: a label name byte (the first one may not be a digit; the caller checks).
fn is_label_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// Drops leading blanks and tabs.
fn trim_blanks_start(bytes: &[u8]) -> &[u8] {
    let start = bytes.iter().position(|&b| b != b' ' && b != b'\t').unwrap_or(bytes.len());
    &bytes[start..]
}

/// Splits at the first blank or tab: the token before it and the rest from it.
fn split_token(bytes: &[u8]) -> (&[u8], &[u8]) {
    let end = bytes.iter().position(|&b| b == b' ' || b == b'\t').unwrap_or(bytes.len());
    bytes.split_at(end)
}

#[cfg(test)]
mod tests;
