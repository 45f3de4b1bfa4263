//! Prefix-cost placement (SPEC S16): what the scheduler knows of the prompt prefixes it sent to
//! each backend, and what a request would cost there.
//!
//! - [`PromptPool`]: how a request's block hashes reach the scheduler. The shard that parsed
//!   the body takes a slot (a lock-free free list of slot numbers, crossbeam's `ArrayQueue`),
//!   hashes the prompt into that slot's vector ([`crate::protocol::prompt`]) and sends the slot
//!   number in its `Arrival`; the scheduler reads the hashes when it places the request and
//!   gives the slot back when the request ends. A slot's vector keeps its capacity, so after
//!   warm-up nothing allocates. Each slot has its own mutex; it is never contended (one owner at
//!   a time, handed over through the rings), so a lock is one uncontended atomic exchange. A
//!   full pool is not an error: the request goes without hashes, as if nothing of it were cached.
//! - [`PrefixIndex`]: per backend, the block hashes sent there, at most `prefix_index_blocks`,
//!   evicted by the same CLOCK policy as the session tracker (it is a [`SessionTracker`] keyed
//!   by block hash). An admission touches every block of its prompt, first to last, so a
//!   block is always at least as recent as the blocks after it and the cached part of a prompt
//!   is a prefix (up to CLOCK's approximation of LRU). [`PrefixIndex::matched`] therefore finds
//!   the longest indexed prefix by binary search: O(log n) lookups, not n.
//!
//! The index is approximate by design: it records what warmpath sent, not what the engine kept.
//! Size it to the engine's KV capacity (`docs/configuration.md`): an index much larger than the
//! engine's cache claims hits the engine has already evicted.

use std::sync::{Arc, Mutex};

use crossbeam_queue::ArrayQueue;

use super::tracker::SessionTracker;

/// No prompt slot: the request carries no block hashes.
pub const NO_PROMPT: u32 = u32::MAX;

/// Block-hash buffers handed from shards to a model's scheduler.
#[derive(Debug)]
pub struct PromptPool {
    slots: Box<[Mutex<Vec<u64>>]>,
    free: ArrayQueue<u32>,
}

impl PromptPool {
    /// A pool of `capacity` slots (at least 1), all free, their vectors empty.
    pub fn new(capacity: u32) -> Arc<PromptPool> {
        let capacity = capacity.max(1);
        let free = ArrayQueue::new(capacity as usize);
        for slot in 0..capacity {
            free.push(slot).expect("sized for every slot");
        }
        let slots = (0..capacity).map(|_| Mutex::new(Vec::new())).collect();
        Arc::new(PromptPool { slots, free })
    }

    /// Takes a free slot, or `None` when every slot is in use.
    pub fn acquire(&self) -> Option<u32> {
        self.free.pop()
    }

    /// Runs `f` on slot `slot`'s vector (the caller owns the slot).
    pub fn with<R>(&self, slot: u32, f: impl FnOnce(&mut Vec<u64>) -> R) -> R {
        let mut hashes = self.slots[slot as usize].lock().unwrap_or_else(|e| e.into_inner());
        f(&mut hashes)
    }

    /// Gives slot `slot` back; its vector is cleared, its capacity kept.
    pub fn release(&self, slot: u32) {
        self.with(slot, Vec::clear);
        self.free.push(slot).expect("a slot is released once");
    }

    /// Slots not in use.
    pub fn available(&self) -> usize {
        self.free.len()
    }

    /// Slots in all.
    pub fn capacity(&self) -> usize {
        self.slots.len()
    }
}

/// The block hashes warmpath sent to one backend, CLOCK-evicted.
#[derive(Debug)]
pub struct PrefixIndex {
    blocks: SessionTracker,
}

impl PrefixIndex {
    /// An index of at most `capacity` blocks, allocated here.
    pub fn with_capacity(capacity: usize) -> PrefixIndex {
        PrefixIndex { blocks: SessionTracker::with_capacity(capacity) }
    }

    /// How many leading blocks of `hashes` (a prompt's chain) the index holds, assuming the
    /// held ones form a prefix (see the module doc): binary search.
    pub fn matched(&self, hashes: &[u64]) -> usize {
        let (mut low, mut high) = (0, hashes.len());
        while low < high {
            let mid = low + (high - low).div_ceil(2);
            if self.blocks.lookup(hashes[mid - 1]).is_some() {
                low = mid;
            } else {
                high = mid - 1;
            }
        }
        low
    }

    /// Records that `hashes` were sent at `now`, first to last.
    pub fn insert(&mut self, hashes: &[u64], now: u64) {
        for &hash in hashes {
            self.blocks.complete(hash, now, 0);
        }
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    /// The most blocks it holds.
    pub fn capacity(&self) -> usize {
        self.blocks.capacity()
    }

    /// Rebuilds the index to hold at most `capacity` blocks (an allocation: call it off the
    /// per-request path). The blocks held are re-inserted from the CLOCK hand on, the least
    /// recently inserted first, so a smaller index keeps the most recent ones.
    pub fn resize(&mut self, capacity: usize) {
        let mut blocks = SessionTracker::with_capacity(capacity.max(1));
        self.blocks.for_each_from_hand(|hash, at| blocks.complete(hash, at, 0));
        self.blocks = blocks;
    }

    /// Whether no block is held.
    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    /// Bytes allocated at construction.
    pub fn heap_bytes(&self) -> usize {
        self.blocks.heap_bytes()
    }

    /// Panics if the structure is inconsistent.
    pub fn check_invariants(&self) {
        self.blocks.check_invariants();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matched_is_the_longest_indexed_prefix() {
        let mut index = PrefixIndex::with_capacity(16);
        assert_eq!(index.matched(&[1, 2, 3]), 0);
        index.insert(&[1, 2, 3], 0);
        assert_eq!(index.matched(&[1, 2, 3, 4, 5]), 3);
        assert_eq!(index.matched(&[1, 2]), 2);
        assert_eq!(index.matched(&[9, 10, 11]), 0, "a chain that differs from its first block");
        assert_eq!(index.matched(&[]), 0);
        for n in 0..=8 {
            let chain: Vec<u64> = (100..100 + n).collect();
            index.insert(&chain, 1);
            let longer: Vec<u64> = (100..110).collect();
            assert_eq!(index.matched(&longer), n as usize, "after a chain of {n}");
        }
        index.check_invariants();
    }

    #[test]
    fn old_prefixes_are_evicted_first() {
        let mut index = PrefixIndex::with_capacity(4);
        index.insert(&[1, 2], 0);
        index.insert(&[3, 4], 1);
        index.insert(&[5, 6], 2);
        assert_eq!(index.len(), 4);
        assert_eq!(index.matched(&[1, 2]), 0);
        assert_eq!(index.matched(&[5, 6]), 2);
    }

    #[test]
    fn the_pool_hands_out_each_slot_once_and_keeps_capacity() {
        let pool = PromptPool::new(2);
        let a = pool.acquire().expect("free");
        let b = pool.acquire().expect("free");
        assert_ne!(a, b);
        assert_eq!(pool.acquire(), None);
        pool.with(a, |v| v.extend_from_slice(&[1, 2, 3]));
        assert_eq!(pool.with(a, |v| v.clone()), vec![1, 2, 3]);
        pool.release(a);
        let again = pool.acquire().expect("released");
        assert_eq!(again, a);
        pool.with(again, |v| assert!(v.is_empty() && v.capacity() >= 3));
        assert_eq!(pool.available(), 0);
    }
}
