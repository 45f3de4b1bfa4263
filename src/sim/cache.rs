//! The simulated engine's KV block pool and prefix cache, after vLLM V1's `BlockPool` and
//! `FreeKVCacheBlockQueue` (`vllm/v1/core/block_pool.py`, `kv_cache_utils.py`).
//!
//! The pool holds `capacity` blocks of `block_size` tokens, in an arena indexed by `u32`. A
//! block is either **referenced** (held by one or more running sequences, `refs > 0`) or
//! **free**. Free blocks sit in one doubly linked LRU list, evicted from the head: at start every
//! block is free and unhashed; a sequence that finishes (or is preempted) releases its blocks to
//! the tail, **last block first**, so that a sequence's tail is evicted before its head (vLLM
//! does the same: a shorter prefix stays reusable longer).
//!
//! A block that has been filled with computed tokens is **committed** under its chain hash
//! (`hash(parent hash, block tokens)`, see [`chain_hash`]): the hash of a block names its whole
//! prefix, so looking up a prompt's block hashes in order and stopping at the first miss finds
//! the longest cached prefix of full blocks. A free block keeps its hash until it is taken for
//! reuse, which evicts it from the hash index: this is the only eviction, so **a referenced block
//! is never evicted**. Taking a free cached block for a hit removes it from the LRU list and
//! references it again.
//!
//! Usage ([`BlockPool::usage`]) counts referenced blocks only, like vLLM's
//! `kv_cache_usage_perc` (`1 - free / total`, where cached but unreferenced blocks are free).

use hashbrown::HashMap;

use crate::splitmix::{mix, GAMMA};

/// Link value meaning "none" in the LRU list.
const NIL: u32 = u32::MAX;

/// The seed of a sequence's hash chain (the parent hash of its first block).
pub const CHAIN_SEED: u64 = 0x5157_4d50_4154_4821;

/// The hash of a block whose parent block hash is `parent`, holding `tokens`: a multiply-xorshift
/// mix (SplitMix64's, [`mix`]) per token. Deterministic across runs and platforms, unlike
/// `std`'s randomly keyed hasher, so cache behaviour is reproducible for a seed.
pub fn chain_hash(parent: u64, tokens: &[u32]) -> u64 {
    let mut h = mix(parent ^ GAMMA);
    for &t in tokens {
        h = mix(h ^ u64::from(t));
    }
    h
}

#[derive(Debug, Clone, Copy)]
struct Block {
    /// The chain hash this block is indexed under, if committed.
    hash: Option<u64>,
    /// Running sequences holding it.
    refs: u32,
    /// LRU links while free (`NIL` otherwise and at the ends).
    prev: u32,
    next: u32,
}

/// The KV block pool: arena, free LRU list and hash index of committed blocks.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    free: u32,
    index: HashMap<u64, u32>,
    evictions: u64,
}

impl BlockPool {
    /// A pool of `capacity` free, unhashed blocks.
    pub fn new(capacity: u32) -> BlockPool {
        assert!(capacity > 0 && capacity < NIL, "bad KV capacity {capacity}");
        let blocks = (0..capacity)
            .map(|i| Block {
                hash: None,
                refs: 0,
                prev: if i == 0 { NIL } else { i - 1 },
                next: if i + 1 == capacity { NIL } else { i + 1 },
            })
            .collect();
        BlockPool {
            blocks,
            head: 0,
            tail: capacity - 1,
            free: capacity,
            index: HashMap::with_capacity(capacity as usize),
            evictions: 0,
        }
    }

    /// Blocks in the pool.
    pub fn capacity(&self) -> u32 {
        self.blocks.len() as u32
    }

    /// Free blocks (unreferenced, cached or not): what an allocation can take.
    pub fn free(&self) -> u32 {
        self.free
    }

    /// Fraction of blocks referenced by running sequences, in `[0, 1]`.
    pub fn usage(&self) -> f64 {
        f64::from(self.capacity() - self.free) / f64::from(self.capacity())
    }

    /// Committed blocks whose hash was dropped to reuse them.
    pub fn evictions(&self) -> u64 {
        self.evictions
    }

    /// How many of `hashes`, from the first, are cached: the longest cached prefix in blocks.
    /// Does not change recency.
    pub fn cached_prefix(&self, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|h| self.index.contains_key(*h)).count()
    }

    /// Free blocks that taking the first `n` of `hashes` (all cached) would remove from the
    /// free list: the ones not referenced yet.
    pub fn free_among(&self, hashes: &[u64]) -> u32 {
        let unreferenced = |h: &u64| self.blocks[self.index[h] as usize].refs == 0;
        hashes.iter().filter(|h| unreferenced(h)).count() as u32
    }

    /// References the cached blocks of `hashes` (all must be cached) and appends them to `out`.
    pub fn take_cached(&mut self, hashes: &[u64], out: &mut Vec<u32>) {
        for h in hashes {
            let b = self.index[h];
            if self.blocks[b as usize].refs == 0 {
                self.unlink(b);
            }
            self.blocks[b as usize].refs += 1;
            out.push(b);
        }
    }

    /// Takes the least recently used free block, evicting its hash; `None` when none is free.
    pub fn allocate(&mut self) -> Option<u32> {
        let b = self.head;
        if b == NIL {
            return None;
        }
        self.unlink(b);
        let block = &mut self.blocks[b as usize];
        if let Some(h) = block.hash.take() {
            self.index.remove(&h);
            self.evictions += 1;
        }
        block.refs = 1;
        Some(b)
    }

    /// Indexes the full, computed block `b` under `hash`. If another block already holds that
    /// hash (two sequences computed the same prefix at once), the index keeps the first one and
    /// `b` stays unhashed, as in vLLM.
    pub fn commit(&mut self, b: u32, hash: u64) {
        debug_assert!(self.blocks[b as usize].refs > 0, "committing a free block");
        if self.blocks[b as usize].hash.is_some() {
            return;
        }
        if let hashbrown::hash_map::Entry::Vacant(e) = self.index.entry(hash) {
            e.insert(b);
            self.blocks[b as usize].hash = Some(hash);
        }
    }

    /// Drops one reference to each of `blocks`; blocks left unreferenced go to the LRU tail,
    /// the last of `blocks` first (evicted before the earlier ones).
    pub fn release(&mut self, blocks: &[u32]) {
        for &b in blocks.iter().rev() {
            let block = &mut self.blocks[b as usize];
            assert!(block.refs > 0, "block {b} released more often than taken");
            block.refs -= 1;
            if block.refs == 0 {
                self.push_tail(b);
            }
        }
    }

    fn unlink(&mut self, b: u32) {
        let Block { prev, next, .. } = self.blocks[b as usize];
        match prev {
            NIL => self.head = next,
            p => self.blocks[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.blocks[n as usize].prev = prev,
        }
        self.blocks[b as usize].prev = NIL;
        self.blocks[b as usize].next = NIL;
        self.free -= 1;
    }

    fn push_tail(&mut self, b: u32) {
        self.blocks[b as usize].prev = self.tail;
        self.blocks[b as usize].next = NIL;
        match self.tail {
            NIL => self.head = b,
            t => self.blocks[t as usize].next = b,
        }
        self.tail = b;
        self.free += 1;
    }

    /// Checks the list, the free count and the index against each other (tests).
    #[cfg(test)]
    pub fn check_invariants(&self) {
        let mut seen = 0;
        let mut prev = NIL;
        let mut b = self.head;
        while b != NIL {
            let block = &self.blocks[b as usize];
            assert_eq!(block.refs, 0, "referenced block {b} in the free list");
            assert_eq!(block.prev, prev);
            seen += 1;
            prev = b;
            b = block.next;
        }
        assert_eq!(prev, self.tail);
        assert_eq!(seen, self.free);
        let free = self.blocks.iter().filter(|b| b.refs == 0).count() as u32;
        assert_eq!(free, self.free);
        for (h, &b) in &self.index {
            assert_eq!(self.blocks[b as usize].hash, Some(*h));
        }
        let hashed = self.blocks.iter().filter(|b| b.hash.is_some()).count();
        assert_eq!(hashed, self.index.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(n: usize, salt: u64) -> Vec<u64> {
        let mut parent = CHAIN_SEED ^ salt;
        (0..n)
            .map(|i| {
                parent = chain_hash(parent, &[i as u32; 4]);
                parent
            })
            .collect()
    }

    /// Allocates and commits one block per hash, as a sequence computing them would.
    fn fill(pool: &mut BlockPool, hs: &[u64]) -> Vec<u32> {
        hs.iter()
            .map(|&h| {
                let b = pool.allocate().expect("a free block");
                pool.commit(b, h);
                b
            })
            .collect()
    }

    #[test]
    fn chain_hashes_name_the_whole_prefix() {
        let a = chain_hash(CHAIN_SEED, &[1, 2]);
        assert_eq!(a, chain_hash(CHAIN_SEED, &[1, 2]));
        assert_ne!(chain_hash(a, &[3, 4]), chain_hash(chain_hash(CHAIN_SEED, &[9, 2]), &[3, 4]));
        assert_ne!(chain_hash(CHAIN_SEED, &[1, 2]), chain_hash(CHAIN_SEED, &[2, 1]));
    }

    #[test]
    fn released_blocks_are_found_again_and_reused_without_allocation() {
        let mut pool = BlockPool::new(8);
        let hs = hashes(3, 0);
        let blocks = fill(&mut pool, &hs);
        assert_eq!(pool.free(), 5);
        pool.release(&blocks);
        pool.check_invariants();
        assert_eq!((pool.free(), pool.usage()), (8, 0.0));
        assert_eq!(pool.cached_prefix(&hs), 3);
        assert_eq!(pool.cached_prefix(&hashes(3, 1)), 0);
        let mut taken = Vec::new();
        pool.take_cached(&hs[..2], &mut taken);
        assert_eq!(taken, blocks[..2]);
        assert_eq!(pool.free(), 6);
        pool.check_invariants();
    }

    #[test]
    fn eviction_takes_the_least_recently_released_and_the_tail_of_a_sequence_first() {
        let mut pool = BlockPool::new(4);
        let a = hashes(2, 1);
        let b = hashes(2, 2);
        let blocks_a = fill(&mut pool, &a);
        let blocks_b = fill(&mut pool, &b);
        pool.release(&blocks_a);
        pool.release(&blocks_b);
        // The LRU order is a1, a0, b1, b0: the first allocation evicts a's last block.
        pool.allocate().expect("free");
        assert_eq!(pool.cached_prefix(&a), 1);
        assert_eq!(pool.cached_prefix(&b), 2);
        assert_eq!(pool.evictions(), 1);
        pool.allocate().expect("free");
        assert_eq!(pool.cached_prefix(&a), 0);
        pool.check_invariants();
    }

    #[test]
    fn referenced_blocks_are_never_evicted() {
        let mut pool = BlockPool::new(3);
        let a = hashes(2, 1);
        let blocks_a = fill(&mut pool, &a);
        // `a` still runs; the one free block goes, then nothing.
        assert!(pool.allocate().is_some());
        assert!(pool.allocate().is_none());
        assert_eq!(pool.cached_prefix(&a), 2);
        pool.release(&blocks_a[1..]);
        let reused = pool.allocate().expect("a's released tail");
        assert_eq!(reused, blocks_a[1]);
        assert_eq!(pool.cached_prefix(&a), 1, "the referenced head block survives");
        pool.check_invariants();
    }

    #[test]
    fn a_hash_computed_twice_is_indexed_once() {
        let mut pool = BlockPool::new(4);
        let h = hashes(1, 0)[0];
        let x = pool.allocate().expect("free");
        let y = pool.allocate().expect("free");
        pool.commit(x, h);
        pool.commit(y, h);
        pool.release(&[x, y]);
        pool.check_invariants();
        let mut taken = Vec::new();
        pool.take_cached(&[h], &mut taken);
        assert_eq!(taken, [x]);
    }
}
