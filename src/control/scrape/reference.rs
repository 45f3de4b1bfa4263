//! A naive restatement of [`super::parse_gauges`] (the module doc's grammar and rules, written
//! again with vectors, decoded label values and no shared helper) and the properties that the
//! unit tests and the `metrics_scrape` fuzz target check on arbitrary bodies.

use super::{
    parse_gauges as parse_fast, sum_families, EngineGauges, EngineKind, Field, ScrapeError,
    ScrapeLimits,
};

/// What a family feeds, by name; `*_old` are the older vLLM names.
fn families(kind: EngineKind) -> &'static [(&'static str, &'static str)] {
    match kind {
        EngineKind::Vllm => &[
            ("vllm:num_requests_waiting", "waiting"),
            ("vllm:num_requests_running", "running"),
            ("vllm:kv_cache_usage_perc", "usage"),
            ("vllm:gpu_cache_usage_perc", "usage_old"),
            ("vllm:prefix_cache_queries_total", "queries"),
            ("vllm:prefix_cache_hits_total", "hits"),
            ("vllm:gpu_prefix_cache_queries_total", "queries_old"),
            ("vllm:gpu_prefix_cache_hits_total", "hits_old"),
            ("vllm:num_preemptions_total", "preemptions"),
            ("vllm:inter_token_latency_seconds_sum", "itl_sum"),
            ("vllm:inter_token_latency_seconds_count", "itl_count"),
            ("vllm:time_per_output_token_seconds_sum", "itl_sum_old"),
            ("vllm:time_per_output_token_seconds_count", "itl_count_old"),
            ("vllm:cache_config_info", "info"),
        ],
        EngineKind::Sglang => &[
            ("sglang:num_queue_reqs", "waiting"),
            ("sglang:num_running_reqs", "running"),
            ("sglang:token_usage", "usage"),
            ("sglang:max_total_num_tokens", "capacity"),
            ("sglang:prompt_tokens_total", "queries"),
            ("sglang:cached_tokens_total", "hits"),
            ("sglang:num_retracted_requests_total", "preemptions"),
            ("sglang:inter_token_latency_seconds_sum", "itl_sum"),
            ("sglang:inter_token_latency_seconds_count", "itl_count"),
        ],
    }
}

/// One sample line after its name: labels with decoded values, and the value.
struct Sample {
    labels: Vec<(Vec<u8>, Vec<u8>)>,
    value: f64,
}

/// The reference parse of a body.
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
    let mut sums: Vec<(&str, f64, f64)> = Vec::new();
    let mut capacities: Vec<Option<u64>> = Vec::new();
    for (index, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        let line: Vec<u8> = line.iter().copied().skip_while(|&b| b == b' ' || b == b'\t').collect();
        let name: Vec<u8> =
            line.iter().copied().take_while(|&b| b != b'{' && b != b' ' && b != b'\t').collect();
        let Some(&(family, key)) = families(kind).iter().find(|(f, _)| f.as_bytes() == name) else {
            continue;
        };
        let number = index + 1;
        let too_long = line.len() > limits.line_bytes_max;
        let sample = sample(&line[name.len()..]);
        if key == "info" {
            let capacity = if too_long { None } else { sample.and_then(|s| capacity(&s.labels)) };
            capacities.push(capacity);
            continue;
        }
        if too_long {
            return Err(ScrapeError::LineTooLong { line: number, family });
        }
        let value = sample.ok_or(ScrapeError::Malformed { line: number, family })?.value;
        let sum = match sums.iter_mut().find(|(k, _, _)| *k == key) {
            Some((_, sum, series)) => {
                *sum += value;
                *series += 1.0;
                *sum
            }
            None => {
                sums.push((key, value, 1.0));
                value
            }
        };
        if value.is_nan() || value < 0.0 || sum.is_nan() || sum.is_infinite() {
            return Err(ScrapeError::BadValue { line: number, family });
        }
    }
    let get = |key: &str| sums.iter().find(|(k, _, _)| *k == key).map(|&(_, sum, _)| sum);
    let mean = |key: &str| sums.iter().find(|(k, _, _)| *k == key).map(|&(_, sum, n)| sum / n);
    let info = if capacities.is_empty() || capacities.contains(&None) {
        None
    } else {
        capacities.iter().try_fold(0u64, |total, c| total.checked_add(c.unwrap()))
    };
    let queries = get("queries").or(get("queries_old"));
    let mut hits = get("hits").or(get("hits_old"));
    if kind == EngineKind::Sglang && queries.is_some() && hits.is_none() {
        hits = Some(0.0);
    }
    Ok(EngineGauges {
        waiting: get("waiting"),
        running: get("running"),
        cache_usage: mean("usage").or(mean("usage_old")),
        kv_capacity_tokens: get("capacity").or(info.map(|tokens| tokens as f64)),
        prefix_queries: queries,
        prefix_hits: hits,
        preemptions: get("preemptions"),
        itl: match (get("itl_sum"), get("itl_count")) {
            (Some(sum), Some(count)) => Some((sum, count)),
            _ => get("itl_sum_old").zip(get("itl_count_old")),
        },
    })
}

/// Parses what follows a family's name: `[{labels}] value [timestamp]`.
fn sample(rest: &[u8]) -> Option<Sample> {
    let mut at = skip_blanks(rest, 0);
    let mut labels = Vec::new();
    if rest.get(at) == Some(&b'{') {
        at = label_set(rest, at + 1, &mut labels)?;
    }
    let tokens: Vec<&[u8]> = rest[at..].split(|&b| blank(b)).filter(|t| !t.is_empty()).collect();
    let (value, timestamp) = match tokens.as_slice() {
        [value] => (value, None),
        [value, timestamp] => (value, Some(timestamp)),
        _ => return None,
    };
    if let Some(timestamp) = timestamp {
        std::str::from_utf8(timestamp).ok()?.parse::<i64>().ok()?;
    }
    let value = std::str::from_utf8(value).ok()?.parse::<f64>().ok()?;
    Some(Sample { labels, value })
}

fn blank(b: u8) -> bool {
    b == b' ' || b == b'\t'
}

fn skip_blanks(rest: &[u8], mut at: usize) -> usize {
    while rest.get(at).is_some_and(|&b| blank(b)) {
        at += 1;
    }
    at
}

/// The labels after a `{` at `at`, into `labels`; where the set ends (after its `}`).
fn label_set(rest: &[u8], mut at: usize, labels: &mut Vec<(Vec<u8>, Vec<u8>)>) -> Option<usize> {
    loop {
        at = skip_blanks(rest, at);
        if rest.get(at) == Some(&b'}') {
            return Some(at + 1);
        }
        let start = at;
        while rest.get(at).is_some_and(|b| b.is_ascii_alphanumeric() || *b == b'_') {
            at += 1;
        }
        let name = rest[start..at].to_vec();
        if name.is_empty() || name[0].is_ascii_digit() {
            return None;
        }
        at = skip_blanks(rest, at);
        if rest.get(at) != Some(&b'=') {
            return None;
        }
        at = skip_blanks(rest, at + 1);
        if rest.get(at) != Some(&b'"') {
            return None;
        }
        let (value, end) = label_value(rest, at + 1)?;
        labels.push((name, value));
        at = skip_blanks(rest, end);
        let separator = *rest.get(at)?;
        at += 1;
        match separator {
            b',' => {}
            b'}' => return Some(at),
            _ => return None,
        }
    }
}

/// A quoted label value starting after its opening quote at `at`, unescaped; and where it ends
/// (after the closing quote).
fn label_value(rest: &[u8], mut at: usize) -> Option<(Vec<u8>, usize)> {
    let mut value = Vec::new();
    loop {
        let b = *rest.get(at)?;
        at += 1;
        match b {
            b'"' => return Some((value, at)),
            b'\\' => {
                let escaped = *rest.get(at)?;
                at += 1;
                value.push(match escaped {
                    b'"' => b'"',
                    b'\\' => b'\\',
                    b'n' => b'\n',
                    _ => return None,
                });
            }
            other => value.push(other),
        }
    }
}

/// The capacity of one info-gauge series from its decoded labels.
fn capacity(labels: &[(Vec<u8>, Vec<u8>)]) -> Option<u64> {
    let keys: [&[u8]; 3] = [b"kv_cache_size_tokens", b"num_gpu_blocks", b"block_size"];
    let mut values = [None; 3];
    for (slot, key) in values.iter_mut().zip(keys) {
        let mut found = labels.iter().filter(|(name, _)| name == key);
        *slot = found.next().map(|(_, value)| value.as_slice());
        if found.next().is_some() {
            return None;
        }
    }
    let number = |value: &[u8]| -> Option<u64> {
        if value.is_empty() || !value.iter().all(u8::is_ascii_digit) {
            return None;
        }
        std::str::from_utf8(value).ok()?.parse().ok()
    };
    let [tokens, blocks, block_size] = values;
    tokens.and_then(number).or_else(|| number(blocks?)?.checked_mul(number(block_size?)?))
}

/// Checks the parser's properties on arbitrary bytes, for both engines; panics on a violation.
/// Shared by the unit tests and the `metrics_scrape` fuzz target.
///
/// - Parsing never panics, agrees with the reference parse above (values and errors), and
///   every value it returns is finite and not negative.
/// - [`sum_families`] over the engine's summed families fails exactly as `parse_gauges` does
///   (the info gauge never fails a scrape) and agrees with it on waiting and running.
/// - Appending an unrelated line (a comment, a sample of another family with an awkward label)
///   changes nothing, errors included: each line is judged alone and the first error wins.
/// - Prepending a comment line changes nothing but shifts an error's line number by one.
/// - When the body holds no `\r`, writing every line ending as CRLF changes nothing.
/// - The body limit: with `body_bytes_max` one byte short, the body is refused.
pub fn check_properties(data: &[u8]) {
    let limits = ScrapeLimits { body_bytes_max: usize::MAX, line_bytes_max: 256 };
    for kind in [EngineKind::Vllm, EngineKind::Sglang] {
        let parsed = parse_fast(kind, data, &limits);
        assert_eq!(parsed, parse_gauges(kind, data, &limits), "reference, {kind:?}, {data:?}");
        if let Ok(gauges) = parsed {
            let EngineGauges {
                waiting,
                running,
                cache_usage,
                kv_capacity_tokens,
                prefix_queries,
                prefix_hits,
                preemptions,
                itl,
            } = gauges;
            let values = [waiting, running, cache_usage, kv_capacity_tokens, prefix_queries];
            let itl = [itl.map(|i| i.0), itl.map(|i| i.1)];
            for value in values.into_iter().chain([prefix_hits, preemptions]).chain(itl).flatten() {
                assert!(value.is_finite() && value >= 0.0, "{value} from {data:?}");
            }
        }
        check_sum_families(kind, data, &limits, parsed);
        let mut appended = data.to_vec();
        appended.extend_from_slice(b"\n# TYPE other gauge\nvllm:other{a=\"}\\\" 1\"} NaN\n");
        assert_eq!(parse_fast(kind, &appended, &limits), parsed, "appended to {data:?}");
        let mut prepended = b"# HELP x y\n".to_vec();
        prepended.extend_from_slice(data);
        assert_eq!(parse_fast(kind, &prepended, &limits), parsed.map_err(shift), "{data:?}");
        if !data.contains(&b'\r') {
            let mut crlf = Vec::with_capacity(data.len() * 2);
            for &b in data {
                if b == b'\n' {
                    crlf.push(b'\r');
                }
                crlf.push(b);
            }
            assert_eq!(parse_fast(kind, &crlf, &limits), parsed, "CRLF of {data:?}");
        }
        if let Some(short) = data.len().checked_sub(1) {
            let limits = ScrapeLimits { body_bytes_max: short, ..limits };
            let refused = parse_fast(kind, data, &limits);
            assert!(matches!(refused, Err(ScrapeError::BodyTooLarge { .. })), "{data:?}");
        }
    }
}

fn check_sum_families(
    kind: EngineKind,
    data: &[u8],
    limits: &ScrapeLimits,
    parsed: Result<EngineGauges, ScrapeError>,
) {
    let summed: Vec<&'static str> = (kind.families().iter())
        .filter(|(_, field)| matches!(field, Field::Sum(_)))
        .map(|&(name, _)| name)
        .collect();
    let mut sums = vec![Some(-1.0); summed.len()];
    let result = sum_families(data, &summed, limits, &mut sums);
    assert_eq!(result.err(), parsed.err(), "sum_families, {kind:?}, {data:?}");
    if let Ok(gauges) = parsed {
        // The first two summed families are the waiting and running gauges.
        assert_eq!((sums[0], sums[1]), (gauges.waiting, gauges.running), "{data:?}");
    }
}

/// The same error one line further down.
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
