//! Offered load: how much of a fleet of simulated engines a workload asks for, so that a
//! replay can be run at a chosen fraction of their capacity (`warmpath bench --load`,
//! `perf/matrix.sh`).
//!
//! The capacity of an engine of a `warmpath sim` profile is the engine time a workload asks of
//! it, counted from the profile's step-time model without cache hits: each prompt token at its
//! share of a full prefill chunk (the step's base cost shared by the chunk), each output token
//! at one decoding sequence's cost plus its share of a decode step's base cost among the
//! sequences that fit in the KV cache at once. A load of 1 asks all of every engine's time. It
//! is an estimate, the same for every router compared: cache hits lower the real work, and
//! steps that mix prefill and decoding cost less than the two counted apart.

use crate::sim::engine::EngineParams;

use super::Workload;

/// The engine time a workload asks of engines of `params`, in simulated seconds, ignoring
/// cache hits: each prompt token at its share of a full prefill chunk (the step's base cost
/// shared by the chunk), each output token at one decoding sequence's cost plus its share of a
/// decode step's base cost among the sequences that fit in the KV cache at once (at most
/// `max_num_seqs`; with the workload's mean prompt and output per sequence). On engines whose
/// KV cache holds few of the workload's sequences (a small card, long prompts) decoding is
/// what limits them, and this counts it.
pub fn work_seconds(workload: &Workload, params: &EngineParams) -> f64 {
    let (mut prompt, mut output, mut n) = (0.0, 0.0, 0.0);
    for (s, session) in workload.sessions.iter().enumerate() {
        for (t, turn) in session.turns.iter().enumerate() {
            prompt += workload.prompt_words(s, t) as f64;
            output += f64::from(turn.max_tokens);
            n += 1.0;
        }
    }
    if n == 0.0 {
        return 0.0;
    }
    let kv_tokens = f64::from(params.kv_blocks) * f64::from(params.block_size);
    let resident = (kv_tokens / ((prompt + output) / n)).clamp(1.0, f64::from(params.max_num_seqs));
    let per_prompt_token = 1.0 / crate::sim::prefill_capacity(params);
    let per_output_token =
        (params.decode_seq_cost_ns as f64 + params.step_base_ns as f64 / resident) / 1e9;
    prompt * per_prompt_token + output * per_output_token
}

/// The offered load of `workload` (its offsets as they are) on `engines` engines of
/// `params`: the engine time it asks for over the engine time its span gives.
pub fn offered_load(workload: &Workload, params: &EngineParams, engines: usize) -> f64 {
    let span = workload
        .sessions
        .iter()
        .flat_map(|s| &s.turns)
        .map(|t| t.at.as_secs_f64())
        .fold(0.0, f64::max);
    work_seconds(workload, params) / (span.max(1e-9) * engines as f64)
}

/// The trace compression (trace seconds per simulated second) at which `workload` (with its
/// offsets at compression 1) offers `load` to `engines`, a fleet that may mix profiles.
pub fn compression_for(workload: &Workload, engines: &[EngineParams], load: f64) -> f64 {
    let capacity: f64 = engines.iter().map(|e| 1.0 / offered_load(workload, e, 1)).sum();
    load * capacity
}
