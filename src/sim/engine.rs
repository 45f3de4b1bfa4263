//! The simulated engine's core: a sans-IO, deterministic model of vLLM V1's scheduler
//! (`vllm/v1/core/sched/scheduler.py`) with continuous batching, chunked prefill and a prefix
//! cache ([`BlockPool`]). It never reads the clock: every entry point takes `now`, a time in
//! simulated nanoseconds.
//!
//! A step is two calls. [`Engine::start_step`] builds the batch and returns its [`StepPlan`],
//! whose duration comes from the step-time model of SPEC 7:
//! `step_base + prefill_token_cost × prefill tokens + decode_seq_cost × decoding sequences`.
//! [`Engine::finish_step`], called at `now + duration`, applies it: tokens computed, full blocks
//! committed to the cache, one token sampled by every sequence that caught up, finished
//! requests released. Requests submitted or aborted in between join the next step.
//!
//! Scheduling, as vLLM V1 does it (one token budget per step, `max_num_batched_tokens`):
//! 1. **Running** sequences, in admission order, each get `min(tokens not yet computed, budget)`
//!    tokens: one for a decoding sequence, a chunk for one still in prefill. A sequence that
//!    needs a new block and finds none free **preempts** the most recently admitted running
//!    sequence (possibly itself): its blocks are released (its full blocks stay cached, so its
//!    recompute usually hits them), it forgets its computed tokens and goes back to the front of
//!    the waiting queue (vLLM V1's recompute preemption).
//! 2. **Waiting** requests, first come first served, while fewer than `max_num_seqs` run, budget
//!    remains and nothing was preempted this step: the longest cached prefix of full blocks is
//!    reused (at most all but the last prompt token, so one token is always computed, as in
//!    vLLM), and the first chunk scheduled. A request whose blocks do not fit waits, and so does
//!    everything behind it (head-of-line, as vLLM's FCFS policy).
//!
//! The prefix cache counters follow vLLM: each time a request is scheduled from the waiting
//! queue, `queries += its tokens` and `hits += its cached tokens`. Output length is exactly
//! `max_tokens`; generated words depend only on the seed, the prompt and the position.

use std::collections::VecDeque;

use hashbrown::HashMap;

use super::cache::{chain_hash, BlockPool, CHAIN_SEED};
use super::metrics::{Histogram, E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS};
use super::tokens::{generated_word, token_id, VOCAB};

/// The engine's parameters (a profile, see `docs/sim.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineParams {
    /// Tokens per KV block.
    pub block_size: u32,
    /// KV capacity in blocks.
    pub kv_blocks: u32,
    /// Most sequences running at once.
    pub max_num_seqs: u32,
    /// Token budget of one step (decode tokens count one each; the rest goes to prefill chunks).
    pub max_num_batched_tokens: u32,
    /// Longest prompt plus output accepted.
    pub max_model_len: u32,
    /// Fixed cost of a step, in nanoseconds.
    pub step_base_ns: u64,
    /// Cost of one prefill token, in nanoseconds.
    pub prefill_token_cost_ns: u64,
    /// Cost of one decoding sequence in a step, in nanoseconds.
    pub decode_seq_cost_ns: u64,
}

/// An engine-wide request id, chosen by the caller and unique among live requests.
pub type RequestId = u64;

/// Why a request was refused at submission (the server answers 400).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubmitError {
    /// The prompt has no token.
    EmptyPrompt,
    /// `max_tokens` is zero.
    NoOutput,
    /// Prompt plus output exceed `max_model_len` or the whole KV capacity.
    TooLong {
        /// Prompt plus `max_tokens`.
        tokens: u64,
        /// The limit.
        limit: u64,
    },
    /// The id is already live.
    DuplicateId,
}

/// Token counts of a finished request.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Prompt tokens found in the prefix cache when the request was first scheduled.
    pub cached_tokens: u32,
}

/// What a finished step did, in the order it happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Event {
    /// Request `id` generated its token number `index` (from 0): word `VOCAB[word]`.
    Token { id: RequestId, index: u32, word: u16, last: bool },
    /// Request `id` finished (after its last `Token`).
    Finished { id: RequestId, usage: Usage },
}

/// The batch of a step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StepPlan {
    /// Simulated duration, by the step-time model.
    pub duration_ns: u64,
    /// Prefill tokens scheduled (chunks of prompts, recomputes).
    pub prefill_tokens: u32,
    /// Sequences decoding one token.
    pub decode_seqs: u32,
    /// Sequences preempted while building the batch.
    pub preempted: u32,
}

/// Cumulative counters for `/metrics`.
#[derive(Debug, Clone)]
pub struct Stats {
    /// Prompt tokens looked up in the prefix cache.
    pub prefix_queries: u64,
    /// Of which found cached.
    pub prefix_hits: u64,
    /// Prompt tokens of requests whose prefill completed, cached ones included (as vLLM's
    /// `prompt_tokens_total` counts them).
    pub prompt_tokens: u64,
    /// Tokens generated.
    pub generation_tokens: u64,
    /// Preemptions.
    pub preemptions: u64,
    /// Requests finished.
    pub finished: u64,
    /// Simulated nanoseconds spent in steps (the engine's busy time: its utilisation is this
    /// over elapsed simulated time).
    pub busy_ns: u64,
    /// Prompt tokens computed by prefill (cached ones excluded; recomputation after preemption
    /// included).
    pub prefill_tokens: u64,
    /// Arrival to first token, simulated seconds.
    pub ttft: Histogram,
    /// Arrival to last token, simulated seconds.
    pub e2e: Histogram,
    /// From each token after a sequence's first to the token before it (vLLM V1 observes
    /// `vllm:inter_token_latency_seconds` so, per request and step), in *real* seconds: the
    /// simulated interval over the time scale ([`Engine::set_time_scale`]). A router reads
    /// this histogram to learn how fast the engine decodes and compares it with what it
    /// measures itself, in real time.
    pub itl: Histogram,
}

#[derive(Debug)]
struct Seq {
    /// Prompt, then generated tokens.
    tokens: Vec<u32>,
    /// Chain hashes of the full blocks of `tokens`.
    hashes: Vec<u64>,
    blocks: Vec<u32>,
    /// Blocks of `blocks` committed to the cache.
    committed: usize,
    /// Tokens whose KV is computed.
    computed: u32,
    /// Tokens scheduled in the current step.
    scheduled: u32,
    prompt_len: u32,
    max_tokens: u32,
    generated: u32,
    prompt_hash: u64,
    arrival: u64,
    /// When its last token was generated.
    last_token_at: u64,
    cached_tokens: Option<u32>,
}

/// The engine: waiting queue, running batch, block pool and counters.
#[derive(Debug)]
pub struct Engine {
    params: EngineParams,
    seed: u64,
    vocab_ids: Vec<u32>,
    pool: BlockPool,
    seqs: HashMap<RequestId, Seq>,
    waiting: VecDeque<RequestId>,
    running: Vec<RequestId>,
    in_step: bool,
    stats: Stats,
    /// Simulated seconds per real second (1 until set).
    time_scale: f64,
}

impl Engine {
    /// An idle engine with an empty cache.
    pub fn new(params: EngineParams, seed: u64) -> Engine {
        assert!(params.block_size > 0 && params.max_num_seqs > 0, "bad engine params");
        assert!(params.max_num_batched_tokens > 0, "bad engine params");
        Engine {
            params,
            seed,
            vocab_ids: VOCAB.iter().map(|w| token_id(w)).collect(),
            pool: BlockPool::new(params.kv_blocks),
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            in_step: false,
            stats: Stats {
                prefix_queries: 0,
                prefix_hits: 0,
                prompt_tokens: 0,
                generation_tokens: 0,
                preemptions: 0,
                finished: 0,
                busy_ns: 0,
                prefill_tokens: 0,
                ttft: Histogram::new(TTFT_BUCKETS),
                e2e: Histogram::new(E2E_BUCKETS),
                itl: Histogram::new(ITL_BUCKETS),
            },
            time_scale: 1.0,
        }
    }

    /// The engine runs `time_scale` simulated seconds per real second (the sim's
    /// `--time-scale`): its inter-token latencies are reported in real seconds ([`Stats::itl`]).
    pub fn set_time_scale(&mut self, time_scale: f64) {
        assert!(time_scale.is_finite() && time_scale > 0.0, "bad time scale {time_scale}");
        self.time_scale = time_scale;
    }

    /// The parameters.
    pub fn params(&self) -> &EngineParams {
        &self.params
    }

    /// Queues a request arriving at `now` with its prompt tokens.
    pub fn submit(
        &mut self,
        id: RequestId,
        prompt: Vec<u32>,
        max_tokens: u32,
        now: u64,
    ) -> Result<(), SubmitError> {
        if prompt.is_empty() {
            return Err(SubmitError::EmptyPrompt);
        }
        if max_tokens == 0 {
            return Err(SubmitError::NoOutput);
        }
        let tokens = prompt.len() as u64 + u64::from(max_tokens);
        let bs = u64::from(self.params.block_size);
        let limit = u64::from(self.params.max_model_len).min(u64::from(self.params.kv_blocks) * bs);
        if tokens > limit {
            return Err(SubmitError::TooLong { tokens, limit });
        }
        if self.seqs.contains_key(&id) {
            return Err(SubmitError::DuplicateId);
        }
        let prompt_hash = chain_hash(CHAIN_SEED, &prompt);
        let mut seq = Seq {
            hashes: Vec::with_capacity(tokens.div_ceil(bs) as usize),
            blocks: Vec::with_capacity(tokens.div_ceil(bs) as usize),
            committed: 0,
            computed: 0,
            scheduled: 0,
            prompt_len: prompt.len() as u32,
            max_tokens,
            generated: 0,
            prompt_hash,
            arrival: now,
            last_token_at: now,
            cached_tokens: None,
            tokens: prompt,
        };
        seq.tokens.reserve(max_tokens as usize);
        extend_hashes(&mut seq, bs as usize);
        self.seqs.insert(id, seq);
        self.waiting.push_back(id);
        Ok(())
    }

    /// Removes a request (its client left), releasing its blocks. False if unknown.
    pub fn abort(&mut self, id: RequestId) -> bool {
        let Some(seq) = self.seqs.remove(&id) else { return false };
        self.pool.release(&seq.blocks);
        self.running.retain(|&r| r != id);
        self.waiting.retain(|&r| r != id);
        true
    }

    /// Whether a step would have anything to do.
    pub fn has_work(&self) -> bool {
        !self.running.is_empty() || !self.waiting.is_empty()
    }

    /// Builds the next batch at `now`; `None` when there is nothing to run (idle, or every
    /// waiting request is blocked and nothing runs). Must be followed by [`finish_step`].
    ///
    /// [`finish_step`]: Engine::finish_step
    pub fn start_step(&mut self, now: u64) -> Option<StepPlan> {
        let _ = now;
        assert!(!self.in_step, "start_step twice without finish_step");
        let mut budget = self.params.max_num_batched_tokens;
        let mut plan = StepPlan { duration_ns: 0, prefill_tokens: 0, decode_seqs: 0, preempted: 0 };
        self.schedule_running(&mut budget, &mut plan);
        if plan.preempted == 0 {
            self.schedule_waiting(&mut budget, &mut plan);
        }
        if plan.prefill_tokens == 0 && plan.decode_seqs == 0 {
            return None;
        }
        let p = &self.params;
        plan.duration_ns = p.step_base_ns
            + p.prefill_token_cost_ns * u64::from(plan.prefill_tokens)
            + p.decode_seq_cost_ns * u64::from(plan.decode_seqs);
        self.stats.busy_ns += plan.duration_ns;
        self.stats.prefill_tokens += u64::from(plan.prefill_tokens);
        self.in_step = true;
        Some(plan)
    }

    fn schedule_running(&mut self, budget: &mut u32, plan: &mut StepPlan) {
        let mut i = 0;
        while i < self.running.len() && *budget > 0 {
            let id = self.running[i];
            let seq = &self.seqs[&id];
            let remaining = seq.tokens.len() as u32 - seq.computed;
            let n = remaining.min(*budget);
            let decoding = remaining == 1 && seq.generated > 0;
            let need = self.blocks_for(seq.computed + n) - seq.blocks.len() as u32;
            while self.pool.free() < need {
                let victim = self.running.pop().expect("running is not empty");
                self.preempt(victim);
                plan.preempted += 1;
                if victim == id {
                    return;
                }
            }
            let seq = self.seqs.get_mut(&id).expect("running seqs exist");
            for _ in 0..need {
                seq.blocks.push(self.pool.allocate().expect("checked free"));
            }
            seq.scheduled = n;
            *budget -= n;
            match decoding {
                true => plan.decode_seqs += 1,
                false => plan.prefill_tokens += n,
            }
            i += 1;
        }
    }

    fn schedule_waiting(&mut self, budget: &mut u32, plan: &mut StepPlan) {
        let bs = self.params.block_size;
        while let Some(&id) = self.waiting.front() {
            if self.running.len() as u32 >= self.params.max_num_seqs || *budget == 0 {
                return;
            }
            let seq = &self.seqs[&id];
            let len = seq.tokens.len() as u32;
            let usable = (len - 1) / bs;
            let cached = self.pool.cached_prefix(&seq.hashes[..usable as usize]);
            let cached_tokens = cached as u32 * bs;
            let n = (len - cached_tokens).min(*budget);
            let fresh = self.blocks_for(cached_tokens + n) - cached as u32;
            let hits = &seq.hashes[..cached];
            if self.pool.free() < fresh + self.pool.free_among(hits) {
                return;
            }
            let seq = self.seqs.get_mut(&id).expect("waiting seqs exist");
            self.pool.take_cached(&seq.hashes[..cached], &mut seq.blocks);
            seq.committed = cached;
            for _ in 0..fresh {
                seq.blocks.push(self.pool.allocate().expect("checked free"));
            }
            seq.computed = cached_tokens;
            seq.scheduled = n;
            seq.cached_tokens.get_or_insert(cached_tokens);
            self.stats.prefix_queries += u64::from(len);
            self.stats.prefix_hits += u64::from(cached_tokens);
            *budget -= n;
            plan.prefill_tokens += n;
            self.waiting.pop_front();
            self.running.push(id);
        }
    }

    fn preempt(&mut self, id: RequestId) {
        let seq = self.seqs.get_mut(&id).expect("running seqs exist");
        self.pool.release(&seq.blocks);
        seq.blocks.clear();
        seq.committed = 0;
        seq.computed = 0;
        seq.scheduled = 0;
        self.waiting.push_front(id);
        self.stats.preemptions += 1;
    }

    /// Applies the step started last, ending at `now`; appends what happened to `events`.
    pub fn finish_step(&mut self, now: u64, events: &mut Vec<Event>) {
        assert!(self.in_step, "finish_step without start_step");
        self.in_step = false;
        let mut i = 0;
        while i < self.running.len() {
            let id = self.running[i];
            if self.advance(id, now, events) {
                let seq = self.seqs.remove(&id).expect("running seqs exist");
                self.pool.release(&seq.blocks);
                self.running.remove(i);
                self.stats.finished += 1;
                self.stats.e2e.observe(seconds(now - seq.arrival));
                let usage = Usage {
                    prompt_tokens: seq.prompt_len,
                    completion_tokens: seq.generated,
                    cached_tokens: seq.cached_tokens.unwrap_or(0),
                };
                events.push(Event::Finished { id, usage });
            } else {
                i += 1;
            }
        }
    }

    /// Applies one sequence's scheduled tokens; true when it has finished.
    fn advance(&mut self, id: RequestId, now: u64, events: &mut Vec<Event>) -> bool {
        let bs = self.params.block_size as usize;
        let seq = self.seqs.get_mut(&id).expect("running seqs exist");
        if seq.scheduled == 0 {
            return false;
        }
        seq.computed += std::mem::take(&mut seq.scheduled);
        let full = (seq.computed as usize / bs).min(seq.hashes.len());
        for j in seq.committed..full {
            self.pool.commit(seq.blocks[j], seq.hashes[j]);
        }
        seq.committed = seq.committed.max(full);
        if (seq.computed as usize) < seq.tokens.len() {
            return false;
        }
        let word = generated_word(self.seed, seq.prompt_hash, seq.generated);
        seq.tokens.push(self.vocab_ids[usize::from(word)]);
        let index = seq.generated;
        seq.generated += 1;
        if index == 0 {
            self.stats.ttft.observe(seconds(now - seq.arrival));
            self.stats.prompt_tokens += u64::from(seq.prompt_len);
        } else {
            self.stats.itl.observe(seconds(now - seq.last_token_at) / self.time_scale);
        }
        seq.last_token_at = now;
        self.stats.generation_tokens += 1;
        let last = seq.generated == seq.max_tokens;
        events.push(Event::Token { id, index, word, last });
        extend_hashes(seq, bs);
        last
    }

    fn blocks_for(&self, tokens: u32) -> u32 {
        tokens.div_ceil(self.params.block_size)
    }

    /// Requests in the running batch.
    pub fn running(&self) -> usize {
        self.running.len()
    }

    /// Requests waiting to be scheduled (new or preempted).
    pub fn waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Fraction of KV blocks held by live sequences.
    pub fn kv_usage(&self) -> f64 {
        self.pool.usage()
    }

    /// The cumulative counters.
    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// Blocks of the pool that are free (cached or not).
    pub fn free_blocks(&self) -> u32 {
        self.pool.free()
    }

    /// Checks the pool, and that the blocks held by running sequences and the free ones add
    /// up to the capacity (a block shared by several sequences counts once).
    #[cfg(test)]
    pub fn check_invariants(&self) {
        self.pool.check_invariants();
        let held: hashbrown::HashSet<u32> =
            self.running.iter().flat_map(|id| self.seqs[id].blocks.iter().copied()).collect();
        assert_eq!(held.len() as u32 + self.pool.free(), self.pool.capacity());
        for id in &self.waiting {
            assert!(self.seqs[id].blocks.is_empty(), "a waiting request holds blocks");
        }
        assert!(self.running.len() as u32 <= self.params.max_num_seqs);
    }
}

/// Adds the chain hashes of `seq`'s blocks (of `bs` tokens) that became full.
fn extend_hashes(seq: &mut Seq, bs: usize) {
    while (seq.hashes.len() + 1) * bs <= seq.tokens.len() {
        let j = seq.hashes.len();
        let parent = seq.hashes.last().copied().unwrap_or(CHAIN_SEED);
        seq.hashes.push(chain_hash(parent, &seq.tokens[j * bs..(j + 1) * bs]));
    }
}

fn seconds(ns: u64) -> f64 {
    ns as f64 / 1e9
}

#[cfg(test)]
#[path = "engine_tests.rs"]
mod tests;
