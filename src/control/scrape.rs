//! Extracting an engine's scheduling gauges from its `/metrics` body, written in the Prometheus
//! text exposition format 0.0.4
//! (<https://prometheus.io/docs/instrumenting/exposition_formats/#text-based-format>).
//!
//! [`parse_gauges`] reads the whole body once, line by line, on byte slices: nothing is
//! allocated and no line is decoded as UTF-8 unless it belongs to a family we need. The
//! families (SPEC section 4, "Backend metrics scraped"):
//!
//! | gauge         | vLLM                                                          | SGLang                   |
//! |---------------|---------------------------------------------------------------|--------------------------|
//! | `waiting`     | `vllm:num_requests_waiting`                                   | `sglang:num_queue_reqs`  |
//! | `running`     | `vllm:num_requests_running`                                   | `sglang:num_running_reqs`|
//! | `cache_usage` | `vllm:kv_cache_usage_perc`, else `vllm:gpu_cache_usage_perc`  | `sglang:token_usage`     |
//!
//! The older vLLM name is used only when the body holds no series of the newer one.
//!
//! Grammar accepted, per line (`\n`-separated, one trailing `\r` dropped, leading and trailing
//! blanks and tabs allowed):
//! - empty lines, and comments (`#` first: `# HELP`, `# TYPE` and any other) are skipped;
//! - a sample is `name [{labels}] value [timestamp]`. The name is the token up to the first
//!   `{`, blank or tab, and a family matches only when the whole token equals its name:
//!   `vllm:num_requests_waiting_total` is not `vllm:num_requests_waiting`;
//! - labels are `label="value"` pairs separated by commas, with an optional trailing comma and
//!   blanks around tokens; a label value is a quoted string whose only escapes are `\"`, `\\`
//!   and `\n`, and which may hold `}`, `,`, blanks and any other byte (label values are not
//!   decoded: we never use them);
//! - the value is a float as Rust's `f64::from_str` reads it (`1`, `1.5e3`, `+Inf`, `-Inf`,
//!   `NaN`), the timestamp an `i64` of milliseconds, which we ignore.
//!
//! A line whose name is not one we need is skipped without looking further, whatever it holds
//! (garbage, bytes that are not UTF-8, lines over the length limit). A line of a family we need
//! must be well formed, within `line_bytes_max`, and have a finite, non-negative value; otherwise
//! the whole scrape is a [`ScrapeError`] (a value of `-0` counts as zero). We refuse rather
//! than skip such a line because skipping one series of a summed family would under-report the
//! engine's queue. A body longer than `body_bytes_max` is refused before any of it is read.
//!
//! **Several series of one family are summed** (SPEC section 4): vLLM exports one series per
//! `model_name` and per data-parallel `engine`, SGLang one per `model_name` (and rank labels).
//! Waiting and running counts add up exactly. Cache usage is summed too, as SPEC says: with one
//! series it is the engine's fraction in `[0, 1]`; with several (data-parallel ranks each
//! reporting its own cache) it is the sum of their fractions and may exceed 1. A consumer that
//! wants a fraction divides by the number of ranks it knows of. Nothing checks that two series
//! have different labels: a duplicated series is counted twice. A sum that overflows to
//! infinity is an error, like an infinite sample.
//!
//! Every error is the backend's (upstream) fault and none is retried: the control thread treats
//! it as "metrics unavailable" for this interval (the snapshot carries `waiting: None`) and tries
//! again at the next one.

use std::fmt;

use crate::config::Engine;

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

    /// The families this engine exports its gauges in, each with the gauge it feeds.
    fn families(self) -> &'static [(&'static str, Field)] {
        match self {
            Self::Vllm => &[
                ("vllm:num_requests_waiting", Field::Waiting),
                ("vllm:num_requests_running", Field::Running),
                ("vllm:kv_cache_usage_perc", Field::CacheUsage),
                ("vllm:gpu_cache_usage_perc", Field::CacheUsageLegacy),
            ],
            Self::Sglang => &[
                ("sglang:num_queue_reqs", Field::Waiting),
                ("sglang:num_running_reqs", Field::Running),
                ("sglang:token_usage", Field::CacheUsage),
            ],
        }
    }
}

/// Which gauge a family feeds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Waiting,
    Running,
    CacheUsage,
    /// vLLM's older cache-usage name, used only when the newer one is absent.
    CacheUsageLegacy,
}

/// The gauges of one scrape, each summed over the series of its family; `None` when the body
/// holds no series of that family. Every value present is finite and not negative.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineGauges {
    /// Requests queued inside the engine, not yet running.
    pub waiting: Option<f64>,
    /// Requests the engine is running (decoding or prefilling).
    pub running: Option<f64>,
    /// KV-cache usage: a fraction in `[0, 1]` for one series, the sum of the fractions when the
    /// engine exports several (see the module doc).
    pub cache_usage: Option<f64>,
}

impl EngineGauges {
    /// The waiting gauge as `scheduler::Snapshot::waiting` takes it: rounded to the nearest
    /// integer, saturating at `u32::MAX`.
    pub fn waiting_count(&self) -> Option<u32> {
        // `as` saturates for floats; the value is finite and not negative (parse_gauges checks).
        self.waiting.map(|waiting| waiting.round() as u32)
    }
}

/// Bounds on one scrape, both inclusive.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ScrapeLimits {
    /// A longer body is refused before any of it is parsed.
    pub body_bytes_max: usize,
    /// A longer line (without its `\r\n`) of a family we need is an error; a longer line of any
    /// other family is skipped like the rest of that family.
    pub line_bytes_max: usize,
}

impl Default for ScrapeLimits {
    /// 4 MiB bodies, 64 KiB lines: a vLLM `/metrics` body is tens of KiB, its longest lines
    /// (histogram buckets, LoRA adapter lists) a few hundred bytes.
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

/// Sums of each field while the body is read; the legacy cache name is kept apart until the end.
#[derive(Default)]
struct Sums {
    waiting: Option<f64>,
    running: Option<f64>,
    cache_usage: Option<f64>,
    cache_usage_legacy: Option<f64>,
}

impl Sums {
    fn slot(&mut self, field: Field) -> &mut Option<f64> {
        match field {
            Field::Waiting => &mut self.waiting,
            Field::Running => &mut self.running,
            Field::CacheUsage => &mut self.cache_usage,
            Field::CacheUsageLegacy => &mut self.cache_usage_legacy,
        }
    }
}

/// Extracts `kind`'s gauges from a `/metrics` body (the module doc gives the grammar and what is
/// refused). Reads the body once; allocates nothing.
pub fn parse_gauges(
    kind: EngineKind,
    text: &[u8],
    limits: &ScrapeLimits,
) -> Result<EngineGauges, ScrapeError> {
    if text.len() > limits.body_bytes_max {
        return Err(ScrapeError::BodyTooLarge {
            body_bytes: text.len(),
            body_bytes_max: limits.body_bytes_max,
        });
    }
    let families = kind.families();
    let mut sums = Sums::default();
    for (index, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        let line = trim_blanks_start(line);
        let name_len = line.iter().position(|&b| matches!(b, b'{' | b' ' | b'\t'));
        let name = &line[..name_len.unwrap_or(line.len())];
        let Some(&(family, field)) = families.iter().find(|(f, _)| f.as_bytes() == name) else {
            continue; // comments, blank lines and every family we do not need
        };
        let number = index + 1;
        if line.len() > limits.line_bytes_max {
            return Err(ScrapeError::LineTooLong { line: number, family });
        }
        let value = sample_value(&line[name.len()..])
            .ok_or(ScrapeError::Malformed { line: number, family })?;
        let slot = sums.slot(field);
        let sum = slot.unwrap_or(0.0) + value;
        // A NaN or infinite sample makes the sum NaN or infinite, as does an overflow.
        if value < 0.0 || !sum.is_finite() {
            return Err(ScrapeError::BadValue { line: number, family });
        }
        *slot = Some(sum);
    }
    Ok(EngineGauges {
        waiting: sums.waiting,
        running: sums.running,
        cache_usage: sums.cache_usage.or(sums.cache_usage_legacy),
    })
}

/// Reads what follows a needed family's name: optional labels, the value, an optional
/// timestamp. Returns the value (NaN and infinities included: the caller judges them), or `None`
/// when the rest of the line does not follow the grammar.
fn sample_value(rest: &[u8]) -> Option<f64> {
    let mut rest = trim_blanks_start(rest);
    if rest.first() == Some(&b'{') {
        rest = trim_blanks_start(skip_labels(rest)?);
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

/// Skips a label set starting at its `{`; returns what follows its `}`, or `None` when the set
/// is malformed or not closed on this line.
fn skip_labels(line: &[u8]) -> Option<&[u8]> {
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
        rest = trim_blanks_start(&rest[name_len..]);
        rest = trim_blanks_start(rest.strip_prefix(b"=")?);
        rest = trim_blanks_start(skip_quoted(rest.strip_prefix(b"\"")?)?);
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

/// Checks the parser's properties on arbitrary bytes, for both engines; panics on a violation.
/// Shared by the unit tests and the `metrics_scrape` fuzz target.
///
/// - Parsing never panics, and every gauge it returns is finite and not negative.
/// - Appending an unrelated line (a comment, a sample of another family with an awkward label)
///   changes nothing, errors included: each line is judged alone and the first error wins.
/// - Prepending a comment line changes nothing but shifts an error's line number by one.
/// - When the body holds no `\r`, writing every line ending as CRLF changes nothing.
/// - The body limit: with `body_bytes_max` one byte short, the body is refused.
#[cfg(any(test, fuzzing))]
pub fn check_properties(data: &[u8]) {
    let limits = ScrapeLimits { body_bytes_max: usize::MAX, line_bytes_max: 256 };
    for kind in [EngineKind::Vllm, EngineKind::Sglang] {
        let parsed = parse_gauges(kind, data, &limits);
        if let Ok(gauges) = parsed {
            for value in [gauges.waiting, gauges.running, gauges.cache_usage].into_iter().flatten()
            {
                assert!(value.is_finite() && value >= 0.0, "{value} from {data:?}");
            }
        }
        let mut appended = data.to_vec();
        appended.extend_from_slice(b"\n# TYPE other gauge\nvllm:other{a=\"}\\\" 1\"} NaN\n");
        assert_eq!(parse_gauges(kind, &appended, &limits), parsed, "appended to {data:?}");
        let mut prepended = b"# HELP x y\n".to_vec();
        prepended.extend_from_slice(data);
        assert_eq!(parse_gauges(kind, &prepended, &limits), parsed.map_err(shift), "{data:?}");
        if !data.contains(&b'\r') {
            let mut crlf = Vec::with_capacity(data.len() * 2);
            for &b in data {
                if b == b'\n' {
                    crlf.push(b'\r');
                }
                crlf.push(b);
            }
            assert_eq!(parse_gauges(kind, &crlf, &limits), parsed, "CRLF of {data:?}");
        }
        if let Some(short) = data.len().checked_sub(1) {
            let limits = ScrapeLimits { body_bytes_max: short, ..limits };
            let refused = parse_gauges(kind, data, &limits);
            assert!(matches!(refused, Err(ScrapeError::BodyTooLarge { .. })), "{data:?}");
        }
    }
}

/// The same error one line further down.
#[cfg(any(test, fuzzing))]
fn shift(error: ScrapeError) -> ScrapeError {
    match error {
        ScrapeError::BodyTooLarge { .. } => error,
        ScrapeError::LineTooLong { line, family } => {
            ScrapeError::LineTooLong { line: line + 1, family }
        }
        ScrapeError::Malformed { line, family } => {
            ScrapeError::Malformed { line: line + 1, family }
        }
        ScrapeError::BadValue { line, family } => ScrapeError::BadValue { line: line + 1, family },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VLLM: &str = r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3-8B"} 3.0
vllm:num_requests_running{engine="1",model_name="meta-llama/Llama-3-8B"} 4.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="meta-llama/Llama-3-8B"} 5.0
vllm:num_requests_waiting{engine="1",model_name="meta-llama/Llama-3-8B"} 2.0
# HELP vllm:kv_cache_usage_perc KV-cache usage. 1 means 100 percent usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3-8B"} 0.25
vllm:kv_cache_usage_perc{engine="1",model_name="meta-llama/Llama-3-8B"} 0.125
# HELP vllm:lora_requests_info Running stats on lora requests.
# TYPE vllm:lora_requests_info gauge
vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 1.7453e+09
# HELP vllm:prompt_tokens_total Number of prefill tokens processed.
# TYPE vllm:prompt_tokens_total counter
vllm:prompt_tokens_total{engine="0",model_name="meta-llama/Llama-3-8B"} 1.234567e+06
# HELP vllm:time_to_first_token_seconds Histogram of time to first token in seconds.
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.001",model_name="meta-llama/Llama-3-8B"} 0.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="meta-llama/Llama-3-8B"} 120.0
vllm:time_to_first_token_seconds_count{engine="0",model_name="meta-llama/Llama-3-8B"} 120.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="meta-llama/Llama-3-8B"} 20.5
# HELP python_gc_objects_collected_total Objects collected during gc
# TYPE python_gc_objects_collected_total counter
python_gc_objects_collected_total{generation="0"} 12345.0
process_start_time_seconds 1.74529e+09
"#;

    const SGLANG: &str = r#"# HELP sglang:num_running_reqs The number of running requests.
# TYPE sglang:num_running_reqs gauge
sglang:num_running_reqs{model_name="Qwen/Qwen2.5-32B-Instruct",pp_rank="0",tp_rank="0"} 12.0
# HELP sglang:num_queue_reqs The number of requests in the waiting queue.
# TYPE sglang:num_queue_reqs gauge
sglang:num_queue_reqs{model_name="Qwen/Qwen2.5-32B-Instruct",pp_rank="0",tp_rank="0"} 7.0
# HELP sglang:token_usage The token usage.
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="Qwen/Qwen2.5-32B-Instruct",pp_rank="0",tp_rank="0"} 0.5
# HELP sglang:gen_throughput The generation throughput (token/s).
# TYPE sglang:gen_throughput gauge
sglang:gen_throughput{model_name="Qwen/Qwen2.5-32B-Instruct",pp_rank="0",tp_rank="0"} 345.6
# HELP sglang:cache_hit_rate The prefix cache hit rate.
# TYPE sglang:cache_hit_rate gauge
sglang:cache_hit_rate{model_name="Qwen/Qwen2.5-32B-Instruct",pp_rank="0",tp_rank="0"} 0.42
"#;

    fn parse(kind: EngineKind, text: &[u8]) -> Result<EngineGauges, ScrapeError> {
        parse_gauges(kind, text, &ScrapeLimits::default())
    }

    fn vllm(text: &str) -> Result<EngineGauges, ScrapeError> {
        parse(EngineKind::Vllm, text.as_bytes())
    }

    fn gauges(waiting: f64, running: f64, cache_usage: f64) -> EngineGauges {
        EngineGauges {
            waiting: Some(waiting),
            running: Some(running),
            cache_usage: Some(cache_usage),
        }
    }

    fn waiting(value: f64) -> EngineGauges {
        EngineGauges { waiting: Some(value), ..EngineGauges::default() }
    }

    const WAITING: &str = "vllm:num_requests_waiting";

    #[test]
    fn vllm_sample_sums_the_series_of_each_family() {
        assert_eq!(vllm(VLLM), Ok(gauges(7.0, 7.0, 0.375)));
        assert_eq!(vllm(VLLM).unwrap().waiting_count(), Some(7));
    }

    #[test]
    fn sglang_sample() {
        assert_eq!(parse(EngineKind::Sglang, SGLANG.as_bytes()), Ok(gauges(7.0, 12.0, 0.5)));
    }

    #[test]
    fn each_engine_reads_only_its_own_families() {
        assert_eq!(parse(EngineKind::Sglang, VLLM.as_bytes()), Ok(EngineGauges::default()));
        assert_eq!(vllm(SGLANG), Ok(EngineGauges::default()));
        assert_eq!(vllm(""), Ok(EngineGauges::default()));
    }

    #[test]
    fn older_vllm_cache_name_is_a_fallback() {
        let old = "vllm:gpu_cache_usage_perc{model_name=\"m\"} 0.5\n\
                   vllm:gpu_cache_usage_perc{model_name=\"n\"} 0.25\n";
        assert_eq!(vllm(old).unwrap().cache_usage, Some(0.75));
        let both = format!("{old}vllm:kv_cache_usage_perc{{model_name=\"m\"}} 0.125\n");
        assert_eq!(vllm(&both).unwrap().cache_usage, Some(0.125));
        let new_first = format!("vllm:kv_cache_usage_perc 0\n{old}");
        assert_eq!(vllm(&new_first).unwrap().cache_usage, Some(0.0));
        // The fallback's lines are still checked: a malformed one fails the scrape.
        let bad_old = "vllm:kv_cache_usage_perc 0.5\nvllm:gpu_cache_usage_perc oops\n";
        let family = "vllm:gpu_cache_usage_perc";
        assert_eq!(vllm(bad_old), Err(ScrapeError::Malformed { line: 2, family }));
    }

    #[test]
    fn families_match_whole_names_only() {
        let text = "vllm:num_requests_waiting_total 9\n\
                    vllm:num_requests_waitingX{a=\"b\"} 9\n\
                    vllm:num_requests_waiting:x 9\n\
                    vllm:num_requests_wait 9\n\
                    xvllm:num_requests_waiting 9\n\
                    vllm:num_requests_waiting-bad 9\n\
                    vllm:num_requests_waiting_total{garbage\n";
        assert_eq!(vllm(text), Ok(EngineGauges::default()));
        assert_eq!(vllm(&format!("{text}{WAITING} 2\n")), Ok(waiting(2.0)));
    }

    #[test]
    fn label_values_may_hold_escapes_braces_commas_and_blanks() {
        let lines = [
            r#"vllm:num_requests_waiting{model_name="a} b, \"c\" \\ d\ne",engine="0"} 1"#,
            r#"vllm:num_requests_waiting{ model_name = "x" , engine="1", } 1"#,
            r#"vllm:num_requests_waiting{} 1"#,
            r#"vllm:num_requests_waiting {engine="2"}	1"#,
            r#"vllm:num_requests_waiting{engine="3"}1"#,
            r#"vllm:num_requests_waiting{a="\\"} 1"#,
            "vllm:num_requests_waiting{a=\"\u{e9}\u{4e2d}\"} 1",
            "  \tvllm:num_requests_waiting 1 \t",
        ];
        for line in lines {
            assert_eq!(vllm(line), Ok(waiting(1.0)), "{line}");
        }
        assert_eq!(vllm(&lines.join("\n")), Ok(waiting(8.0)));
        let non_utf8 = b"vllm:num_requests_waiting{a=\"\xff\xfe\"} 1";
        assert_eq!(parse(EngineKind::Vllm, non_utf8), Ok(waiting(1.0)));
    }

    #[test]
    fn values_and_timestamps() {
        for (value, expected) in
            [("1", 1.0), ("1.5e3", 1500.0), ("+2", 2.0), ("0", 0.0), ("3.", 3.0)]
        {
            assert_eq!(vllm(&format!("{WAITING} {value}")), Ok(waiting(expected)), "{value}");
        }
        assert_eq!(vllm(&format!("{WAITING} -0")).unwrap().waiting_count(), Some(0));
        for timestamp in ["1712345678901", "-5", "0", "+7"] {
            let line = format!("{WAITING}{{engine=\"0\"}} 4 {timestamp}");
            assert_eq!(vllm(&line), Ok(waiting(4.0)), "{line}");
        }
    }

    #[test]
    fn crlf_and_blank_lines_are_tolerated() {
        let crlf = VLLM.replace('\n', "\r\n");
        assert_eq!(vllm(&crlf), Ok(gauges(7.0, 7.0, 0.375)));
        let blanks = format!("\n\n  \n\t\r\n{WAITING} 3\r\n\r\n");
        assert_eq!(vllm(&blanks), Ok(waiting(3.0)));
        assert_eq!(vllm(&format!("{WAITING} 3\r")), Ok(waiting(3.0)));
    }

    #[test]
    fn garbage_and_non_utf8_in_unrelated_lines_are_skipped() {
        let mut body =
            b"\xff\xfe\x00garbage line\n{\"json\": true}\nfoo{bar=\"unclosed 1\n".to_vec();
        body.extend_from_slice(b"vllm:other\xff 1\nvllm:other{a=\"\\q\"} NaN\nbar -Inf\n");
        body.extend_from_slice(b"# TYPE vllm:num_requests_waiting \xff\n=== \t\n");
        body.extend_from_slice(format!("{}\n{}", "x".repeat(100_000), VLLM).as_bytes());
        assert_eq!(parse(EngineKind::Vllm, &body), Ok(gauges(7.0, 7.0, 0.375)));
    }

    #[test]
    fn malformed_lines_of_needed_families_are_errors() {
        let bodies = [
            WAITING.to_string(),
            format!("{WAITING} "),
            format!("{WAITING}{{engine=\"0\"}}"),
            format!("{WAITING}{{engine=\"0\" 1"),
            format!("{WAITING}{{engine=\"0}} 1"),
            format!("{WAITING}{{engine=0}} 1"),
            format!("{WAITING}{{engine=\"\\t\"}} 1"),
            format!("{WAITING}{{0engine=\"0\"}} 1"),
            format!("{WAITING}{{engine-x=\"0\"}} 1"),
            format!("{WAITING}{{engine=\"0\" model=\"m\"}} 1"),
            format!("{WAITING}{{,}} 1"),
            format!("{WAITING}{{engine}} 1"),
            format!("{WAITING} abc"),
            format!("{WAITING} 1 2 3"),
            format!("{WAITING} 1 1.5"),
            format!("{WAITING} 1 ts"),
            format!("{WAITING} 0x10"),
            format!("{WAITING} 1_000"),
            format!("{WAITING}\t{{a=\"b\"}} 1 }}"),
        ];
        for body in &bodies {
            let family = WAITING;
            assert_eq!(vllm(body), Err(ScrapeError::Malformed { line: 1, family }), "{body}");
        }
        let non_utf8_value = b"vllm:num_requests_running 1\xff";
        let family = "vllm:num_requests_running";
        let error = ScrapeError::Malformed { line: 1, family };
        assert_eq!(parse(EngineKind::Vllm, non_utf8_value), Err(error));
    }

    #[test]
    fn nan_infinite_and_negative_values_are_errors() {
        for value in ["NaN", "nan", "+Inf", "-Inf", "inf", "-1", "-0.5", "1e400"] {
            for family in ["vllm:num_requests_waiting", "vllm:kv_cache_usage_perc"] {
                let body = format!("# TYPE {family} gauge\n{family}{{engine=\"0\"}} {value}\n");
                assert_eq!(vllm(&body), Err(ScrapeError::BadValue { line: 2, family }), "{body}");
            }
        }
        let family = "sglang:num_queue_reqs";
        let body = format!("{family} 1\n{family} NaN\n");
        let error = ScrapeError::BadValue { line: 2, family };
        assert_eq!(parse(EngineKind::Sglang, body.as_bytes()), Err(error));
    }

    #[test]
    fn a_sum_that_overflows_is_an_error() {
        let body = format!("{WAITING}{{a=\"1\"}} 1e308\n{WAITING}{{a=\"2\"}} 1e308\n");
        assert_eq!(vllm(&body), Err(ScrapeError::BadValue { line: 2, family: WAITING }));
    }

    #[test]
    fn the_first_error_wins_and_names_its_line() {
        let body = format!("{VLLM}{WAITING} x\n{WAITING} NaN\n");
        let line = VLLM.lines().count() + 1;
        assert_eq!(vllm(&body), Err(ScrapeError::Malformed { line, family: WAITING }));
        let message = vllm(&body).unwrap_err().to_string();
        assert!(
            message.contains(&format!("line {line}")) && message.contains(WAITING),
            "{message}"
        );
    }

    #[test]
    fn long_lines_are_refused_only_in_needed_families() {
        let limits = ScrapeLimits { line_bytes_max: 64, ..ScrapeLimits::default() };
        let labels = "x".repeat(64);
        let other = format!("vllm:other{{a=\"{labels}\"}} 1\n");
        let ours = format!("{WAITING}{{a=\"{labels}\"}} 1\n");
        let parsed = parse_gauges(EngineKind::Vllm, other.as_bytes(), &limits);
        assert_eq!(parsed, Ok(EngineGauges::default()));
        let parsed = parse_gauges(EngineKind::Vllm, format!("{other}{ours}").as_bytes(), &limits);
        assert_eq!(parsed, Err(ScrapeError::LineTooLong { line: 2, family: WAITING }));
        // The limit counts the line without its CRLF, inclusive.
        let exact = format!("{WAITING} {}\r\n", "0".repeat(64 - WAITING.len() - 1));
        assert_eq!(parse_gauges(EngineKind::Vllm, exact.as_bytes(), &limits), Ok(waiting(0.0)));
    }

    #[test]
    fn a_body_over_the_limit_is_refused_before_it_is_read() {
        // The first line would be malformed: the limit is checked before any line is read.
        let mut body = format!("{WAITING} x\n").into_bytes();
        body.resize(10 << 20, b'#');
        let error = ScrapeError::BodyTooLarge { body_bytes: 10 << 20, body_bytes_max: 4 << 20 };
        assert_eq!(parse(EngineKind::Vllm, &body), Err(error));
        let limits = ScrapeLimits { body_bytes_max: VLLM.len(), ..ScrapeLimits::default() };
        assert!(parse_gauges(EngineKind::Vllm, VLLM.as_bytes(), &limits).is_ok());
        let limits = ScrapeLimits { body_bytes_max: VLLM.len() - 1, ..limits };
        let parsed = parse_gauges(EngineKind::Vllm, VLLM.as_bytes(), &limits);
        assert!(matches!(parsed, Err(ScrapeError::BodyTooLarge { .. })));
    }

    #[test]
    fn waiting_count_rounds_and_saturates() {
        for (value, expected) in [
            (0.0, 0),
            (2.4, 2),
            (2.5, 3),
            (7.0, 7),
            (4e9, 4_000_000_000),
            (5e9, u32::MAX),
            (1e300, u32::MAX),
        ] {
            assert_eq!(waiting(value).waiting_count(), Some(expected), "{value}");
        }
        assert_eq!(EngineGauges::default().waiting_count(), None);
    }

    #[test]
    fn engine_kinds_follow_the_configured_engine() {
        assert_eq!(EngineKind::for_engine(Engine::Vllm), Some(EngineKind::Vllm));
        assert_eq!(EngineKind::for_engine(Engine::Sglang), Some(EngineKind::Sglang));
        assert_eq!(EngineKind::for_engine(Engine::Openai), None);
    }

    #[test]
    fn properties_hold_on_samples_and_edge_cases() {
        let cases: [&[u8]; 9] = [
            VLLM.as_bytes(),
            SGLANG.as_bytes(),
            b"",
            b"\n",
            b"vllm:num_requests_waiting 1",
            b"vllm:num_requests_waiting NaN",
            b"sglang:token_usage{a=\"\\",
            b"vllm:kv_cache_usage_perc 1e308\nvllm:kv_cache_usage_perc 1e308",
            b"\xff\nvllm:num_requests_running{a=\"}\"} 2 3\n",
        ];
        for case in cases {
            check_properties(case);
        }
    }
}
