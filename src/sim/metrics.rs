//! The simulated engine's `/metrics`, in the Prometheus text format 0.0.4 under vLLM's names
//! (V1 engine, `vllm/v1/metrics/loggers.py`), each series labelled `model_name` as vLLM does,
//! but for the info gauge `vllm:cache_config_info`, which vLLM labels with the fields of its
//! `CacheConfig` and the engine index instead (`log_metrics_info`): the sim gives
//! `block_size`, `enable_prefix_caching`, `engine` and `num_gpu_blocks` (its KV blocks), so a
//! router reads its KV capacity as it would a vLLM engine's (`num_gpu_blocks` × `block_size`).
//!
//! Latencies are in **simulated engine seconds** (step durations of the step-time model), not
//! wall-clock seconds: under `--time-scale 10` a request that took 0.1 s of real time reports 1 s,
//! which is what the modelled GPU would have taken. One exception: the inter-token histogram
//! `vllm:inter_token_latency_seconds` is in real seconds, because a router reads it to learn
//! how fast the engine decodes and compares that with the streams it times itself (warmpath's
//! decode gap, `scheduler::decode`).

use std::fmt::Write;

use super::engine::Engine;

/// `vllm:time_to_first_token_seconds` buckets, as vLLM V1 defines them.
pub const TTFT_BUCKETS: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// `vllm:e2e_request_latency_seconds` buckets, as vLLM V1 defines them.
pub const E2E_BUCKETS: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// `vllm:inter_token_latency_seconds` buckets, as vLLM V1 defines them.
pub const ITL_BUCKETS: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];

/// A fixed-bucket histogram (non-cumulative counts; cumulated when rendered).
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending upper bounds; `+Inf` is implicit).
    pub fn new(bounds: &'static [f64]) -> Histogram {
        Histogram { bounds, counts: vec![0; bounds.len() + 1], sum: 0.0, count: 0 }
    }

    /// Records one observation.
    pub fn observe(&mut self, value: f64) {
        let i = self.bounds.partition_point(|&b| b < value);
        self.counts[i] += 1;
        self.sum += value;
        self.count += 1;
    }

    /// Observations recorded.
    pub fn count(&self) -> u64 {
        self.count
    }

    /// Sum of the observations.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    fn render(&self, out: &mut String, name: &str, labels: &str, help: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count;
            match self.bounds.get(i) {
                Some(b) => {
                    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{b:?}\"}} {cumulative}");
                }
                None => {
                    let _ = writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}");
                }
            }
        }
        let _ = writeln!(out, "{name}_sum{{{labels}}} {:?}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}

fn scalar(out: &mut String, kind: &str, name: &str, labels: &str, help: &str, value: f64) {
    let _ =
        writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value:?}");
}

type Value = fn(&Engine, u64) -> f64;

/// The engine's counters and gauges: type, name, help, value (given the simulated time).
const SCALARS: &[(&str, &str, &str, Value)] = &[
    ("gauge", "vllm:num_requests_running", "Requests in the running batch.", |e, _| {
        e.running() as f64
    }),
    ("gauge", "vllm:num_requests_waiting", "Requests waiting to be scheduled.", |e, _| {
        e.waiting() as f64
    }),
    ("gauge", "vllm:kv_cache_usage_perc", "KV cache usage; 1 means 100 percent.", |e, _| {
        e.kv_usage()
    }),
    ("counter", "vllm:prefix_cache_queries_total", "Prefix cache queries, in tokens.", |e, _| {
        e.stats().prefix_queries as f64
    }),
    ("counter", "vllm:prefix_cache_hits_total", "Prefix cache hits, in tokens.", |e, _| {
        e.stats().prefix_hits as f64
    }),
    (
        "counter",
        "vllm:prompt_tokens_total",
        "Prompt tokens of requests that finished prefill.",
        |e, _| e.stats().prompt_tokens as f64,
    ),
    ("counter", "vllm:generation_tokens_total", "Generation tokens processed.", |e, _| {
        e.stats().generation_tokens as f64
    }),
    ("counter", "vllm:num_preemptions_total", "Cumulative number of preemptions.", |e, _| {
        e.stats().preemptions as f64
    }),
    ("counter", "vllm:request_success_total", "Requests finished.", |e, _| {
        e.stats().finished as f64
    }),
    // Not vLLM's: what a load test needs to state the engine's utilisation.
    (
        "counter",
        "warmpath_sim_busy_seconds_total",
        "Simulated seconds spent running steps.",
        |e, _| e.stats().busy_ns as f64 / 1e9,
    ),
    (
        "counter",
        "warmpath_sim_time_seconds_total",
        "Simulated seconds since the engine started.",
        |_, now_ns| now_ns as f64 / 1e9,
    ),
    (
        "counter",
        "warmpath_sim_prefill_tokens_total",
        "Prompt tokens computed by prefill (cache hits excluded).",
        |e, _| e.stats().prefill_tokens as f64,
    ),
];

/// Appends the engine's metrics for `model` to `out`; `now_ns` is the simulated time since the
/// engine started.
pub fn render(engine: &Engine, model: &str, now_ns: u64, out: &mut String) {
    let labels = format!("model_name=\"{}\"", model.replace('\\', "\\\\").replace('"', "\\\""));
    let l = labels.as_str();
    for &(kind, name, help, value) in SCALARS {
        scalar(out, kind, name, l, help, value(engine, now_ns));
    }
    let p = engine.params();
    let _ = writeln!(
        out,
        "# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig\n\
         # TYPE vllm:cache_config_info gauge\n\
         vllm:cache_config_info{{block_size=\"{}\",enable_prefix_caching=\"True\",engine=\"0\",\
         num_gpu_blocks=\"{}\"}} 1.0",
        p.block_size, p.kv_blocks
    );
    let s = engine.stats();
    s.ttft.render(out, "vllm:time_to_first_token_seconds", l, "Time to first token in seconds.");
    let e2e_help = "End to end request latency in seconds.";
    s.e2e.render(out, "vllm:e2e_request_latency_seconds", l, e2e_help);
    let itl_help = "Histogram of inter-token latency in seconds.";
    s.itl.render(out, "vllm:inter_token_latency_seconds", l, itl_help);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::engine::EngineParams;

    #[test]
    fn the_cache_config_info_gauge_gives_the_blocks_and_their_size() {
        let params = EngineParams {
            block_size: 32,
            kv_blocks: 1234,
            max_num_seqs: 8,
            max_num_batched_tokens: 512,
            max_model_len: 4096,
            step_base_ns: 1,
            prefill_token_cost_ns: 1,
            decode_seq_cost_ns: 1,
        };
        let mut out = String::new();
        render(&Engine::new(params, 0), "m", 0, &mut out);
        let info = "vllm:cache_config_info{block_size=\"32\",enable_prefix_caching=\"True\",\
                    engine=\"0\",num_gpu_blocks=\"1234\"} 1.0\n";
        assert!(out.contains(info), "{out}");
        assert!(out.contains("# TYPE vllm:cache_config_info gauge\n"), "{out}");
        assert!(out.contains("vllm:prefix_cache_queries_total{model_name=\"m\"} 0.0\n"), "{out}");
        assert!(out.contains("vllm:prefix_cache_hits_total{model_name=\"m\"} 0.0\n"), "{out}");
    }

    #[test]
    fn histogram_buckets_are_cumulative_with_inf() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        h.observe(0.05);
        h.observe(0.1);
        h.observe(0.5);
        h.observe(5.0);
        let mut out = String::new();
        h.render(&mut out, "x", "m=\"a\"", "help");
        assert!(out.contains("x_bucket{m=\"a\",le=\"0.1\"} 2\n"), "{out}");
        assert!(out.contains("x_bucket{m=\"a\",le=\"1.0\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{m=\"a\",le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("x_count{m=\"a\"} 4\n"), "{out}");
        assert!(out.contains("x_sum{m=\"a\"} 5.65\n"), "{out}");
    }
}
