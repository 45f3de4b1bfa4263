//! The engines' prefix-cache counters, scraped from their Prometheus `/metrics` before and
//! after a run (SPEC 8).
//!
//! The counters are vLLM's `vllm:prefix_cache_queries_total` and `vllm:prefix_cache_hits_total`
//! (tokens; the simulated engine exports the same names), read by the control thread's parser
//! ([`crate::control::scrape::parse_gauges`] for a vLLM engine): every series of a name is
//! summed (an engine may label them per model or per data-parallel engine), the names vLLM
//! used before 0.9 (`vllm:gpu_prefix_cache_*`) stand in when the new ones are absent, and a
//! malformed line of a family the router reads fails the scrape, as it does in the router. The
//! simulated engine also exports its busy time and its simulated clock
//! (`warmpath_sim_busy_seconds_total`, `warmpath_sim_time_seconds_total`, summed under the
//! same rules by [`crate::control::scrape::sum_families`]), from which a run states the
//! engines' utilisation; other engines have no such series and the utilisation is then
//! unknown. Scrapes go through the control's blocking probe ([`crate::control::probe::get`])
//! with short timeouts.

use std::time::Duration;

use crate::clock::Clock;
use crate::control::probe::{self, ProbeLimits};
use crate::control::scrape::{parse_gauges, sum_families, EngineKind, ScrapeLimits};

use super::client::split_url;

/// The hits counter.
pub const HITS: &str = "vllm:prefix_cache_hits_total";
/// The queries counter.
pub const QUERIES: &str = "vllm:prefix_cache_queries_total";
/// The simulated engine's busy time.
pub const BUSY: &str = "warmpath_sim_busy_seconds_total";
/// The simulated engine's clock.
pub const SIM_TIME: &str = "warmpath_sim_time_seconds_total";

/// Largest `/metrics` body read.
const BODY_BYTES_MAX: usize = 8 << 20;

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

/// The counters in a `/metrics` body; an error when it holds no prefix-cache counters or the
/// parser refuses it.
pub fn counters(body: &[u8]) -> Result<Counters, String> {
    let limits = ScrapeLimits { body_bytes_max: BODY_BYTES_MAX, ..ScrapeLimits::default() };
    let gauges = parse_gauges(EngineKind::Vllm, body, &limits).map_err(|e| e.to_string())?;
    let mut sums = [None; 2];
    sum_families(body, &[BUSY, SIM_TIME], &limits, &mut sums).map_err(|e| e.to_string())?;
    match (gauges.prefix_hits, gauges.prefix_queries) {
        (Some(hits), Some(queries)) => Ok(Counters { hits, queries, busy: sums[0].zip(sums[1]) }),
        _ => Err(format!("no {HITS} / {QUERIES}")),
    }
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
        body_bytes_max: BODY_BYTES_MAX,
    };
    let mut body = Vec::new();
    let status =
        probe::get(host, path, &limits, clock, &mut body).map_err(|e| format!("{url}: {e}"))?;
    if status != 200 {
        return Err(format!("{url}: status {status}"));
    }
    counters(&body).map_err(|e| format!("{url}: {e}"))
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
        let expected = Counters { hits: 15.0, queries: 40.0, busy: None };
        assert_eq!(counters(text.as_bytes()), Ok(expected));
        let sim = format!("{text}{BUSY}{{model_name=\"m\"}} 2.5\n{SIM_TIME} 10\n");
        let expected = Counters { busy: Some((2.5, 10.0)), ..expected };
        assert_eq!(counters(sim.as_bytes()), Ok(expected));
        let missing = counters(b"vllm:num_requests_waiting 1\n").unwrap_err();
        assert!(missing.contains(HITS), "{missing}");
    }

    #[test]
    fn older_names_stand_in_and_malformed_counters_are_refused() {
        let old = b"vllm:gpu_prefix_cache_hits_total 3\nvllm:gpu_prefix_cache_queries_total 9\n";
        assert_eq!(counters(old), Ok(Counters { hits: 3.0, queries: 9.0, busy: None }));
        let bad = format!("{QUERIES} 40\n{HITS} lots\n");
        let error = counters(bad.as_bytes()).unwrap_err();
        assert!(error.contains("line 2") && error.contains(HITS), "{error}");
        let bad_busy = format!("{QUERIES} 40\n{HITS} 4\n{BUSY} -1\n");
        assert!(counters(bad_busy.as_bytes()).unwrap_err().contains(BUSY));
    }
}
