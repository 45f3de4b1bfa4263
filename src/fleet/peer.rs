//! Models of the peers' routing policies, for [`super::run`]. Each sends a request to an engine
//! the moment it arrives (neither peer queues), so its only decision is where.
//!
//! - [`LeastInflight`]: the engine with the fewest requests in flight (ties: the lowest index).
//! - [`CacheAware`]: sglang-router's `cache_aware` policy as its source describes it
//!   (`sgl-router/src/policies/cache_aware.rs`, sglang-router 0.3.2's defaults in
//!   `router_args.py`): when the engines' in-flight counts are imbalanced (max − min > 64 and
//!   max > 1.5 × min) the least loaded engine; otherwise the engine whose approximate radix
//!   tree of past request texts matches the longest prefix of this request's text, if that
//!   match covers more than 30 % of the text, else the engine whose tree holds the fewest
//!   characters. Either way the text is then inserted into the chosen engine's tree. The tree
//!   is modelled by chained hashes of 64-character blocks of the text (the messages' contents
//!   in order), so a match is rounded down to a block; its size limit (2^26 characters per
//!   engine, evicted every 60 s) is never reached in these replays, so it is not modelled.

use std::collections::HashSet;

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::bench::Message;

/// A peer's routing decision.
pub trait Peer: std::fmt::Debug {
    /// The engine for a request with these messages (it is in flight from now).
    fn route(&mut self, messages: &[Message]) -> u16;
    /// A request on `backend` ended.
    fn finished(&mut self, backend: u16);
}

/// Requests in flight per engine, as a router counts them.
#[derive(Debug)]
struct Loads(Vec<u32>);

impl Loads {
    fn least(&self) -> u16 {
        let mut best = 0;
        for (i, &load) in self.0.iter().enumerate() {
            if load < self.0[best] {
                best = i;
            }
        }
        best as u16
    }
}

/// Least requests in flight.
#[derive(Debug)]
pub struct LeastInflight {
    loads: Loads,
}

impl LeastInflight {
    pub fn new(backends: u16) -> LeastInflight {
        LeastInflight { loads: Loads(vec![0; usize::from(backends)]) }
    }
}

impl Peer for LeastInflight {
    fn route(&mut self, _: &[Message]) -> u16 {
        let pick = self.loads.least();
        self.loads.0[usize::from(pick)] += 1;
        pick
    }

    fn finished(&mut self, backend: u16) {
        self.loads.0[usize::from(backend)] -= 1;
    }
}

/// Characters per modelled tree block.
const BLOCK_CHARS: usize = 64;

/// sglang-router's `cache_aware`.
#[derive(Debug)]
pub struct CacheAware {
    loads: Loads,
    /// Per engine, the block chains inserted.
    trees: Vec<HashSet<u64>>,
    /// Per engine, the characters its tree holds (a block counts once).
    sizes: Vec<u64>,
    cache_threshold: f64,
    balance_abs: u32,
    balance_rel: f64,
    text: String,
    chain: Vec<u64>,
}

impl CacheAware {
    pub fn new(backends: u16) -> CacheAware {
        let n = usize::from(backends);
        CacheAware {
            loads: Loads(vec![0; n]),
            trees: vec![HashSet::new(); n],
            sizes: vec![0; n],
            cache_threshold: 0.3,
            balance_abs: 64,
            balance_rel: 1.5,
            text: String::new(),
            chain: Vec::new(),
        }
    }

    fn imbalanced(&self) -> bool {
        let max = self.loads.0.iter().copied().max().unwrap_or(0);
        let min = self.loads.0.iter().copied().min().unwrap_or(0);
        max.saturating_sub(min) > self.balance_abs
            && f64::from(max) > f64::from(min) * self.balance_rel
    }
}

impl Peer for CacheAware {
    fn route(&mut self, messages: &[Message]) -> u16 {
        self.text.clear();
        for (i, m) in messages.iter().enumerate() {
            if i > 0 {
                self.text.push(' ');
            }
            self.text.push_str(&m.content);
        }
        self.chain.clear();
        let mut parent = 0;
        for block in self.text.as_bytes().chunks_exact(BLOCK_CHARS) {
            parent = xxh3_64_with_seed(block, parent);
            self.chain.push(parent);
        }
        let pick = if self.imbalanced() {
            self.loads.least()
        } else {
            let matched =
                |tree: &HashSet<u64>| self.chain.iter().take_while(|h| tree.contains(h)).count();
            let (mut best, mut best_len) = (0usize, 0usize);
            for (i, tree) in self.trees.iter().enumerate() {
                let len = matched(tree);
                if len > best_len {
                    (best, best_len) = (i, len);
                }
            }
            let rate = (best_len * BLOCK_CHARS) as f64 / self.text.len().max(1) as f64;
            if rate > self.cache_threshold {
                best as u16
            } else {
                let mut smallest = 0;
                for (i, &size) in self.sizes.iter().enumerate() {
                    if size < self.sizes[smallest] {
                        smallest = i;
                    }
                }
                smallest as u16
            }
        };
        let tree = &mut self.trees[usize::from(pick)];
        for &h in &self.chain {
            if tree.insert(h) {
                self.sizes[usize::from(pick)] += BLOCK_CHARS as u64;
            }
        }
        self.loads.0[usize::from(pick)] += 1;
        pick
    }

    fn finished(&mut self, backend: u16) {
        self.loads.0[usize::from(backend)] -= 1;
    }
}
