//! `warmpath sim` (SPEC section 7): a simulated vLLM server, for trying configurations and
//! benchmarking the router without GPUs. It speaks the OpenAI HTTP API, exports vLLM's metric
//! names, and models what makes scheduling decisions matter: a prefix cache with finite KV
//! capacity, continuous batching with chunked prefill, and a step-time model.
//!
//! - [`engine`]: the sans-IO core, a deterministic model of vLLM V1's scheduler: FCFS waiting
//!   queue, `max_num_seqs`, a token budget per step, recompute preemption; `submit`,
//!   `start_step(now)`, `finish_step(now)`, `abort`.
//! - [`cache`]: the KV block pool and prefix cache: chained block hashes, reference counts, LRU
//!   eviction of unreferenced blocks.
//! - [`tokens`]: whitespace tokens, chat rendering, generated words.
//! - [`api`]: OpenAI request parsing and response/SSE rendering.
//! - [`metrics`]: `/metrics` under vLLM's names.
//! - [`server`]: one thread, one mio loop, the engine stepped on its timer (`--time-scale`).
//!
//! Decisions (SPEC 7 leaves them open):
//! - **Time** is simulated nanoseconds (`real × time_scale`); the latencies in `/metrics` are in
//!   simulated seconds, what the modelled GPU would take. `created` in responses is the
//!   simulated second of arrival (the sim has no wall clock: output depends on inputs and seed).
//! - **Output** is exactly `max_tokens` tokens (finish reason `length`); the words are a hash of
//!   (seed, prompt, position) over a small vocabulary, so the same prompt gets the same answer.
//! - **A request that cannot get KV blocks waits** (FCFS, head of line). A *running* sequence
//!   that needs a block when none is free preempts the most recently admitted one, which
//!   recomputes later (vLLM V1's policy); its full blocks stay cached meanwhile.
//! - **Prefix cache counters** count tokens per scheduling from the waiting queue, as vLLM's.
//! - **One model** per process, named by `--model`; other names get 404 `model_not_found`.
//!
//! The default profile, `h100-8b`, and where each number comes from: `docs/sim.md`.

pub mod api;
pub mod cache;
pub mod engine;
pub mod metrics;
pub mod server;
pub mod tokens;

use std::net::SocketAddr;
use std::process::ExitCode;

pub use engine::{Engine, EngineParams};
pub use server::{start, RunningSim};

/// The profiles `--profile` accepts, each with a one-line description.
pub const PROFILES: &[(&str, &str)] = &[
    ("h100-8b", "Llama-3.1-8B (BF16) on one H100 SXM 80 GB, vLLM V1 defaults"),
    (
        "h100x4-70b",
        "Llama-3.1-70B (BF16) on four H100 SXM 80 GB (tensor parallel), vLLM V1 defaults",
    ),
    ("l4-3b", "Llama-3.2-3B (BF16) on one L4 24 GB, vLLM V1 defaults, --max-model-len 65536"),
];

/// The parameters of profile `name`, if it exists. The derivation of every number is in
/// `docs/sim.md`.
pub fn profile(name: &str) -> Option<EngineParams> {
    match name {
        "h100-8b" => Some(EngineParams {
            block_size: 16,
            // 54 GiB of KV at 128 KiB per token = 442,368 tokens = 27,648 blocks of 16.
            kv_blocks: 27_648,
            max_num_seqs: 1024,
            max_num_batched_tokens: 8192,
            max_model_len: 131_072,
            step_base_ns: 6_000_000,
            prefill_token_cost_ns: 32_000,
            decode_seq_cost_ns: 50_000,
        }),
        "h100x4-70b" => Some(EngineParams {
            block_size: 16,
            // 4 x 35.3 GiB of KV at 320 KiB per token = 462,000 tokens = 28,875 blocks.
            kv_blocks: 28_875,
            max_num_seqs: 1024,
            max_num_batched_tokens: 8192,
            max_model_len: 131_072,
            step_base_ns: 16_000_000,
            prefill_token_cost_ns: 89_000,
            decode_seq_cost_ns: 35_000,
        }),
        "l4-3b" => Some(EngineParams {
            block_size: 16,
            // 13.0 GiB of KV at 112 KiB per token = 121,700 tokens = 7,606 blocks.
            kv_blocks: 7_606,
            max_num_seqs: 256,
            max_num_batched_tokens: 2048,
            max_model_len: 65_536,
            step_base_ns: 27_000_000,
            prefill_token_cost_ns: 106_000,
            decode_seq_cost_ns: 600_000,
        }),
        _ => None,
    }
}

/// `warmpath sim --profile list`: each profile, what it models, and its key figures.
pub fn profile_list() -> String {
    let mut out = String::new();
    for (name, about) in PROFILES {
        let p = profile(name).expect("a listed profile exists");
        out.push_str(&format!(
            "{name:<12} {about}\n{:<12} KV {} tokens, max_num_seqs {}, max_num_batched_tokens {}, \
             prefill {:.0} tokens/s, decode step {:.1} ms + {:.0} us per sequence\n",
            "",
            u64::from(p.kv_blocks) * u64::from(p.block_size),
            p.max_num_seqs,
            p.max_num_batched_tokens,
            prefill_capacity(&p),
            p.step_base_ns as f64 / 1e6,
            p.decode_seq_cost_ns as f64 / 1e3,
        ));
    }
    out
}

/// Prompt tokens per second an engine of `params` prefills when every step is a full chunk
/// with nothing decoding: its prefill capacity.
pub fn prefill_capacity(params: &EngineParams) -> f64 {
    let chunk = f64::from(params.max_num_batched_tokens);
    let step_ns = params.step_base_ns as f64 + params.prefill_token_cost_ns as f64 * chunk;
    chunk / (step_ns / 1e9)
}

/// What [`start`] needs.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// Address to bind (`127.0.0.1:0` for any free port).
    pub listen: SocketAddr,
    /// The served model name.
    pub model: String,
    /// Simulated seconds per real second (> 0).
    pub time_scale: f64,
    /// Seed of the generated words.
    pub seed: u64,
    /// Engine parameters.
    pub params: EngineParams,
}

impl SimOptions {
    /// The default profile on `127.0.0.1:0`, model `sim-8b`, real time, seed 0.
    pub fn new() -> SimOptions {
        SimOptions {
            listen: SocketAddr::from(([127, 0, 0, 1], 0)),
            model: "sim-8b".to_owned(),
            time_scale: 1.0,
            seed: 0,
            params: profile("h100-8b").expect("the default profile exists"),
        }
    }
}

impl Default for SimOptions {
    fn default() -> Self {
        SimOptions::new()
    }
}

/// `warmpath sim`: a simulated vLLM server.
#[derive(Debug, Clone, clap::Args)]
pub struct SimArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8001")]
    pub listen: SocketAddr,
    /// Served model name.
    #[arg(long, default_value = "sim-8b")]
    pub model: String,
    /// Simulated seconds per real second: 10 runs ten times faster than the modelled GPU.
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Seed of the generated text.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Engine profile (`list` prints them; docs/sim.md derives them); the flags below override
    /// its values.
    #[arg(long, default_value = "h100-8b")]
    pub profile: String,
    /// Tokens per KV block.
    #[arg(long)]
    pub block_size: Option<u32>,
    /// KV cache capacity in blocks.
    #[arg(long)]
    pub kv_blocks: Option<u32>,
    /// Most running sequences.
    #[arg(long)]
    pub max_num_seqs: Option<u32>,
    /// Token budget per step (chunked prefill).
    #[arg(long)]
    pub max_num_batched_tokens: Option<u32>,
    /// Longest prompt plus output, in tokens.
    #[arg(long)]
    pub max_model_len: Option<u32>,
    /// Fixed cost of a step, microseconds.
    #[arg(long)]
    pub step_base_us: Option<u64>,
    /// Cost of one prefill token, nanoseconds.
    #[arg(long)]
    pub prefill_token_cost_ns: Option<u64>,
    /// Cost of one decoding sequence per step, microseconds.
    #[arg(long)]
    pub decode_seq_cost_us: Option<u64>,
}

impl SimArgs {
    /// The options these arguments describe, or what is wrong with them.
    pub fn options(&self) -> Result<SimOptions, String> {
        let Some(mut p) = profile(&self.profile) else {
            let known: Vec<&str> = PROFILES.iter().map(|(name, _)| *name).collect();
            return Err(format!(
                "unknown profile {:?} (known: {}; --profile list describes them)",
                self.profile,
                known.join(", ")
            ));
        };
        p.block_size = self.block_size.unwrap_or(p.block_size);
        p.kv_blocks = self.kv_blocks.unwrap_or(p.kv_blocks);
        p.max_num_seqs = self.max_num_seqs.unwrap_or(p.max_num_seqs);
        p.max_num_batched_tokens = self.max_num_batched_tokens.unwrap_or(p.max_num_batched_tokens);
        p.max_model_len = self.max_model_len.unwrap_or(p.max_model_len);
        p.step_base_ns = self.step_base_us.map_or(p.step_base_ns, |us| us.saturating_mul(1000));
        p.prefill_token_cost_ns = self.prefill_token_cost_ns.unwrap_or(p.prefill_token_cost_ns);
        p.decode_seq_cost_ns =
            self.decode_seq_cost_us.map_or(p.decode_seq_cost_ns, |us| us.saturating_mul(1000));
        let positive = [
            ("--block-size", p.block_size),
            ("--kv-blocks", p.kv_blocks),
            ("--max-num-seqs", p.max_num_seqs),
            ("--max-num-batched-tokens", p.max_num_batched_tokens),
            ("--max-model-len", p.max_model_len),
        ];
        if let Some((flag, _)) = positive.iter().find(|(_, v)| *v == 0) {
            return Err(format!("{flag} must be positive"));
        }
        if p.kv_blocks == u32::MAX {
            return Err("--kv-blocks is too large".into());
        }
        if !(self.time_scale.is_finite() && self.time_scale > 0.0) {
            return Err(format!("--time-scale must be positive, got {}", self.time_scale));
        }
        Ok(SimOptions {
            listen: self.listen,
            model: self.model.clone(),
            time_scale: self.time_scale,
            seed: self.seed,
            params: p,
        })
    }
}

/// Runs `warmpath sim` until SIGTERM or SIGINT.
pub fn run(args: &SimArgs) -> ExitCode {
    if args.profile == "list" {
        print!("{}", profile_list());
        return ExitCode::SUCCESS;
    }
    let options = match args.options() {
        Ok(options) => options,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let mut signals = match crate::signals::termination_signals() {
        Ok(signals) => signals,
        Err(code) => return code,
    };
    let (model, scale, p) = (options.model.clone(), options.time_scale, options.params);
    let running = match start(options) {
        Ok(running) => running,
        Err(error) => {
            eprintln!("error: starting the simulated engine on {}: {error}", args.listen);
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "warmpath sim: model {model:?} on http://{} (time scale {scale}, {} KV blocks of {}, \
         max_num_seqs {}, max_num_batched_tokens {}); SIGTERM or SIGINT to stop",
        running.addr(),
        p.kv_blocks,
        p.block_size,
        p.max_num_seqs,
        p.max_num_batched_tokens
    );
    if let Some(signal) = signals.forever().next() {
        eprintln!("warmpath sim: signal {signal}: stopping");
    }
    running.stop();
    ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        sim: SimArgs,
    }

    #[test]
    fn flags_override_the_profile_and_are_checked() {
        let cli =
            Cli::parse_from(["x", "--kv-blocks", "100", "--step-base-us", "7", "--seed", "3"]);
        let o = cli.sim.options().unwrap();
        let p = profile("h100-8b").unwrap();
        assert_eq!(o.params, EngineParams { kv_blocks: 100, step_base_ns: 7_000, ..p });
        assert_eq!((o.seed, o.time_scale, o.model.as_str()), (3, 1.0, "sim-8b"));
        assert_eq!(o.listen, "127.0.0.1:8001".parse().unwrap());
        for bad in [
            &["x", "--profile", "a100"][..],
            &["x", "--time-scale", "0"],
            &["x", "--block-size", "0"],
        ] {
            assert!(Cli::parse_from(bad).sim.options().is_err(), "{bad:?}");
        }
    }
}
