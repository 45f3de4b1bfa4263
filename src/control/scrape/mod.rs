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
mod tests;
