//! The engines' prefix-cache counters, scraped from their Prometheus `/metrics` before and
//! after a run (SPEC 8).
//!
//! The counters are vLLM's `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total`
//! (tokens; the simulated engine exports the same names). Every series of a name is summed
//! (an engine may label them per model). The simulated engine also exports its busy time and
//! its simulated clock (`warmpath_sim_busy_seconds_total`, `warmpath_sim_time_seconds_total`),
//! from which a run states the engines' utilisation; other engines have no such series and
//! the utilisation is then unknown. Scrapes go through the control thread's blocking
//! probe ([`crate::control::probe::get`]) with short timeouts.

use std::time::Duration;

use crate::clock::Clock;
use crate::control::probe::{self, ProbeLimits};

use super::client::split_url;

/// The hits counter.
pub const HITS: &str = "vllm:prefix_cache_hits_total";
/// The queries counter.
pub const QUERIES: &str = "vllm:prefix_cache_queries_total";
/// The simulated engine's busy time.
pub const BUSY: &str = "warmpath_sim_busy_seconds_total";
/// The simulated engine's clock.
pub const SIM_TIME: &str = "warmpath_sim_time_seconds_total";

/// Prefix-cache counters of one engine (or a sum of several).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Counters {
    /// Sum of the hits series.
    pub hits: f64,
    /// Sum of the queries series.
    pub queries: f64,
    /// Busy and elapsed simulated seconds, summed over engines, when every engine exports them.
    pub busy: Option<(f64, f64)>,
}

/// Sums every sample of `name` in Prometheus text `text` (comments skipped; a sample line is
/// `name[{labels}] value [timestamp]`). None when there is no such sample.
pub fn sum_metric(text: &str, name: &str) -> Option<f64> {
    let mut total = None;
    for line in text.lines() {
        let Some(rest) = line.trim_start().strip_prefix(name) else { continue };
        let rest = match rest.as_bytes().first() {
            Some(b'{') => match rest.rfind('}') {
                Some(close) => &rest[close + 1..],
                None => continue,
            },
            Some(b' ' | b'\t') => rest,
            _ => continue,
        };
        if let Some(value) = rest.split_whitespace().next().and_then(|v| v.parse::<f64>().ok()) {
            *total.get_or_insert(0.0) += value;
        }
    }
    total
}

/// Scrapes `url` (`http://host:port[/path]`, path `/metrics` when absent).
pub fn scrape(url: &str, clock: &Clock) -> Result<Counters, String> {
    let (host, path) =
        split_url(url).ok_or_else(|| format!("{url}: expected http://HOST:PORT[/PATH]"))?;
    let path = if path.is_empty() { "/metrics" } else { path };
    let limits = ProbeLimits {
        connect_timeout: Duration::from_secs(2),
        exchange_timeout: Duration::from_secs(5),
        head_bytes_max: 16 << 10,
        body_bytes_max: 8 << 20,
    };
    let mut body = Vec::new();
    let status =
        probe::get(host, path, &limits, clock, &mut body).map_err(|e| format!("{url}: {e}"))?;
    if status != 200 {
        return Err(format!("{url}: status {status}"));
    }
    let text = String::from_utf8_lossy(&body);
    let busy = sum_metric(&text, BUSY).zip(sum_metric(&text, SIM_TIME));
    match (sum_metric(&text, HITS), sum_metric(&text, QUERIES)) {
        (Some(hits), Some(queries)) => Ok(Counters { hits, queries, busy }),
        _ => Err(format!("{url}: no {HITS} / {QUERIES}")),
    }
}

/// Scrapes every URL and sums; the first failure is the error.
pub fn scrape_all(urls: &[String], clock: &Clock) -> Result<Counters, String> {
    let mut sum = Counters { busy: Some((0.0, 0.0)), ..Counters::default() };
    for url in urls {
        let c = scrape(url, clock)?;
        sum.hits += c.hits;
        sum.queries += c.queries;
        sum.busy = sum.busy.zip(c.busy).map(|(a, b)| (a.0 + b.0, a.1 + b.1));
    }
    Ok(sum)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_series_and_skips_lookalikes() {
        let text = "# HELP vllm:prefix_cache_hits_total x\n\
                    # TYPE vllm:prefix_cache_hits_total counter\n\
                    vllm:prefix_cache_hits_total{model_name=\"a\",x=\"}\"} 10.0\n\
                    vllm:prefix_cache_hits_total{model_name=\"b\"} 5 1700000000\n\
                    vllm:prefix_cache_hits_total_created 99\n\
                    vllm:prefix_cache_queries_total 40\n";
        assert_eq!(sum_metric(text, HITS), Some(15.0));
        assert_eq!(sum_metric(text, QUERIES), Some(40.0));
        assert_eq!(sum_metric(text, "vllm:num_requests_waiting"), None);
    }
}
