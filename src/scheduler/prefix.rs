//! Prefix-cost placement (SPEC S16): what the scheduler knows of the prompt prefixes it sent to
//! each backend.
//!
//! A [`PrefixIndex`] holds, per backend, the block hashes sent there, at most
//! `prefix_index_blocks`, evicted by the same CLOCK policy as the session tracker (it is a
//! [`SessionTracker`] keyed by block hash). An admission touches every block of its prompt,
//! first to last, so a block is always at least as recent as the blocks after it and the cached
//! part of a prompt is a prefix (up to CLOCK's approximation of LRU). [`PrefixIndex::matched`]
//! therefore finds the longest indexed prefix by binary search: O(log n) lookups, not n.
//!
//! A request's block hashes reach the scheduler through its model's
//! [`PromptPool`](crate::ring::prompt_pool::PromptPool), shared with the shards; what a request
//! would cost on each backend is `placement.rs`.
//!
//! The index is approximate by design: it records what warmpath sent, not what the engine kept.
//! Size it to the engine's KV capacity (`docs/configuration.md`): an index much larger than the
//! engine's cache claims hits the engine has already evicted.

use super::tracker::SessionTracker;

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
    /// held ones form a prefix (see the module doc): binary search. The blocks [`hot`](Self::hot)
    /// finds at one touch, but searched on presence alone: written as `hot(hashes, 1)` it took
    /// 3.5 times as long on a 64 KiB prompt (`benches/prefix.rs`), and every admission runs it.
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

    /// How many leading blocks of `hashes` the index holds that at least `touches` admissions
    /// sent here while it held them (a prefix many prompts share): binary search. A block is
    /// touched by every admission that touches a block after it, so the touches fall along the
    /// chain and the hot blocks form a prefix. A [`resize`](Self::resize) starts every block's
    /// count again at one.
    pub fn hot(&self, hashes: &[u64], touches: u16) -> usize {
        let (mut low, mut high) = (0, hashes.len());
        while low < high {
            let mid = low + (high - low).div_ceil(2);
            if self.blocks.lookup(hashes[mid - 1]).is_some_and(|block| block.turns >= touches) {
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

    /// Forgets every block (the backend's engine restarted), in place.
    pub fn clear(&mut self) {
        self.blocks.clear();
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
    fn hot_blocks_are_the_prefix_enough_admissions_touched() {
        let mut index = PrefixIndex::with_capacity(64);
        let shared = [11, 12, 13];
        for session in 0..5u64 {
            index.insert(&[shared[0], shared[1], shared[2], 100 + session], session);
        }
        index.insert(&[11, 12], 9);
        let prompt = [11, 12, 13, 100, 7];
        assert_eq!(index.hot(&prompt, 1), 4, "every held block is touched once");
        assert_eq!(index.hot(&prompt, 5), 3, "the shared blocks five sessions sent");
        assert_eq!(index.hot(&prompt, 6), 2, "the first two, sent once more");
        assert_eq!(index.hot(&prompt, 7), 0);
        assert_eq!(index.hot(&[], 1), 0);
        index.resize(64);
        assert_eq!(index.hot(&prompt, 2), 0, "a rebuild counts every block once again");
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
        index.clear();
        assert_eq!((index.len(), index.capacity()), (0, 4), "cleared, the same size");
        assert_eq!(index.matched(&[5, 6]), 0);
        index.insert(&[5, 6], 3);
        assert_eq!(index.matched(&[5, 6]), 2);
    }
}
