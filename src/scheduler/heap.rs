//! Intrusive indexed d-ary min-heap.
//!
//! The classic array heap (Williams 1964; `D` children per node, Johnson 1975's d-heap, binary
//! by default) over `u32` indices into an arena the heap does not own,
//! with each entry's heap position stored in the entry itself, so that an entry anywhere in the
//! heap can be removed or re-keyed in O(log n) (the "indexed priority queue" of Sedgewick's
//! *Algorithms*, section 2.4). The owner passes its arena to every mutation through
//! [`HeapArena`], which records positions and breaks ties between equal keys.
//!
//! Each heap slot keeps its `u64` key beside the index, so sifting compares keys without touching
//! the arena; only positions are written back to it, and ties (rare: two requests carrying the
//! same completion time) are resolved through it. A sift down goes bottom-up (see
//! `sift_down`), the smallest child picked with a branch-free select: what a re-keyed head and a
//! removal cost is mostly mispredicted branches otherwise (perf/RESULTS.md).

/// Position of an entry that is not in the heap.
pub const NOT_IN_HEAP: u32 = u32::MAX;

/// The arena side of an intrusive heap.
pub trait HeapArena {
    /// Records that entry `index` now sits at heap position `position` ([`NOT_IN_HEAP`] when
    /// removed).
    fn set_heap_position(&mut self, index: u32, position: u32);
    /// Whether entry `a` goes before entry `b` when their keys are equal.
    fn tie_before(&self, a: u32, b: u32) -> bool;
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    key: u64,
    index: u32,
}

/// A min-heap of arena indices ordered by a `u64` key, ties broken by the arena; `D` children
/// per node (2: binary; the tenant heap takes 4, half the levels of a binary heap, which its
/// sifts, bounded by the levels, pay for in fewer moves and position writes).
#[derive(Debug)]
pub struct IndexedHeap<const D: usize = 2> {
    slots: Vec<Slot>,
}

impl<const D: usize> IndexedHeap<D> {
    /// An empty heap that holds up to `capacity` entries without reallocating.
    pub fn with_capacity(capacity: usize) -> IndexedHeap<D> {
        const { assert!(D >= 2, "a heap node needs at least two children") };
        IndexedHeap { slots: Vec::with_capacity(capacity) }
    }

    /// Room for `capacity` entries in all without reallocating (a live reconfiguration).
    pub fn reserve_total(&mut self, capacity: usize) {
        self.slots.reserve_exact(capacity.saturating_sub(self.slots.len()));
    }

    /// Number of entries.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether the heap is empty.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// Bytes of the preallocated slot array.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
    }

    /// The index at the top (smallest key) without removing it.
    pub fn peek(&self) -> Option<u32> {
        self.slots.first().map(|slot| slot.index)
    }

    /// The indices in the heap, in heap-array order.
    pub fn indices(&self) -> impl Iterator<Item = u32> + '_ {
        self.slots.iter().map(|slot| slot.index)
    }

    /// Appends to `out` the indices of the first `k` entries in heap order (what `k` pops would
    /// return), without changing the heap: a best-first walk of the tree that keeps its frontier
    /// of heap positions, at most `k + 1` of them, in `frontier` (cleared first; reused by the
    /// caller so nothing allocates). O(k²) comparisons: meant for a small `k` (a placement scan).
    pub fn first_k<A: HeapArena>(
        &self,
        k: usize,
        arena: &A,
        frontier: &mut Vec<u32>,
        out: &mut Vec<u32>,
    ) {
        frontier.clear();
        if k == 0 || self.slots.is_empty() {
            return;
        }
        frontier.push(0);
        let mut taken = 0;
        while taken < k {
            // The frontier's best position: a linear pick, the frontier being small.
            let Some((at, &position)) = frontier.iter().enumerate().reduce(|best, next| {
                if self.before(*next.1 as usize, *best.1 as usize, arena) {
                    next
                } else {
                    best
                }
            }) else {
                break;
            };
            frontier.swap_remove(at);
            out.push(self.slots[position as usize].index);
            taken += 1;
            let first = D * position as usize + 1;
            for child in first..(first + D).min(self.slots.len()) {
                frontier.push(child as u32);
            }
        }
    }

    /// Inserts `index` with `key`. The caller guarantees `index` is not already in the heap.
    pub fn push<A: HeapArena>(&mut self, key: u64, index: u32, arena: &mut A) {
        let position = self.slots.len();
        self.slots.push(Slot { key, index });
        self.sift_up(position, arena);
    }

    /// Gives the entry at heap position `position` the key `key` and moves it to its place,
    /// O(log n): the heap's own re-keying (a key is never changed without it).
    pub fn update<A: HeapArena>(&mut self, position: u32, key: u64, arena: &mut A) {
        let position = position as usize;
        self.slots[position].key = key;
        if !self.sift_up(position, arena) {
            self.sift_down(position, arena);
        }
    }

    /// Gives the entry at heap position `position` the key `key`, not smaller than its current
    /// one, and moves it down to its place (the key only grows: no sift up to try).
    pub fn increase<A: HeapArena>(&mut self, position: u32, key: u64, arena: &mut A) {
        let position = position as usize;
        debug_assert!(self.slots[position].key <= key, "increase with a smaller key");
        self.slots[position].key = key;
        self.sift_down(position, arena);
    }

    /// Removes and returns the entry at heap position `position`.
    pub fn remove<A: HeapArena>(&mut self, position: u32, arena: &mut A) -> u32 {
        let position = position as usize;
        let last = self.slots.len() - 1;
        let removed = self.slots[position].index;
        self.slots.swap(position, last);
        self.slots.pop();
        arena.set_heap_position(removed, NOT_IN_HEAP);
        if position < last {
            // The moved slot may belong above or below `position`: one of the two sifts is a no-op.
            let moved_up = self.sift_up(position, arena);
            if !moved_up {
                self.sift_down(position, arena);
            }
        }
        removed
    }

    /// Removes and returns the top entry.
    pub fn pop<A: HeapArena>(&mut self, arena: &mut A) -> Option<u32> {
        if self.slots.is_empty() {
            None
        } else {
            Some(self.remove(0, arena))
        }
    }

    fn before<A: HeapArena>(&self, a: usize, b: usize, arena: &A) -> bool {
        slot_before(self.slot(a), self.slot(b), arena)
    }

    #[inline]
    fn slot(&self, position: usize) -> Slot {
        self.slots[position]
    }

    /// Writes `slot` at `position` and records the position in the arena.
    #[inline]
    fn place<A: HeapArena>(&mut self, position: usize, slot: Slot, arena: &mut A) {
        self.slots[position] = slot;
        arena.set_heap_position(slot.index, position as u32);
    }

    /// Moves the slot at `position` up to its place; returns whether it moved.
    fn sift_up<A: HeapArena>(&mut self, start: usize, arena: &mut A) -> bool {
        let moving = self.slot(start);
        self.rise(moving, start, 0, arena) != start
    }

    /// Places `moving`, whose hole is at `position`: it rises past the ancestors it goes
    /// before, never above position `floor`. Returns where it lands.
    #[inline]
    fn rise<A: HeapArena>(
        &mut self,
        moving: Slot,
        mut position: usize,
        floor: usize,
        arena: &mut A,
    ) -> usize {
        while position > floor {
            let parent = (position - 1) / D;
            let above = self.slot(parent);
            if !slot_before(moving, above, arena) {
                break;
            }
            self.place(position, above, arena);
            position = parent;
        }
        self.place(position, moving, arena);
        position
    }

    /// Moves the slot at `start`, which belongs there or below, down to its place: bottom-up
    /// (Wegener, "Bottom-up heapsort", TCS 1993): the hole at `start` first goes down to a
    /// leaf, each level's smallest child moving up into it, then the slot rises from that
    /// leaf to its place, never above `start`. A slot sifted down is a re-keyed head whose key
    /// grew or the last leaf moved into a hole, so it usually belongs near the bottom: the
    /// rise is short, and the descent compares no child with it. Which child is smallest is a
    /// coin toss to the branch predictor, so it is a [`select`], not a branch.
    fn sift_down<A: HeapArena>(&mut self, start: usize, arena: &mut A) {
        let len = self.slots.len();
        let moving = self.slot(start);
        let mut position = start;
        loop {
            let first = D * position + 1;
            if first >= len {
                break;
            }
            let (mut child, mut best) = (first, self.slot(first));
            for next in first + 1..(first + D).min(len) {
                let candidate = self.slot(next);
                let before = slot_before(candidate, best, arena);
                (child, best) = select(before, (next, candidate), (child, best));
            }
            self.place(position, best, arena);
            position = child;
        }
        self.rise(moving, position, start, arena);
    }

    /// Checks heap order and that `position_of` agrees with every slot; panics otherwise.
    pub fn check_invariants<A: HeapArena>(&self, arena: &A, position_of: impl Fn(u32) -> u32) {
        for (position, slot) in self.slots.iter().enumerate() {
            assert_eq!(
                position_of(slot.index),
                position as u32,
                "heap: entry {} at position {position} records another position",
                slot.index
            );
            if position > 0 {
                let parent = (position - 1) / D;
                assert!(
                    !self.before(position, parent, arena),
                    "heap: order violated between positions {parent} and {position}"
                );
            }
        }
    }
}

/// `if pick { a } else { b }` by masks, without a branch: `std::hint::select_unpredictable`
/// (Rust 1.88) for a crate that supports 1.85. For a choice the branch predictor cannot learn.
#[inline(always)]
fn select(pick: bool, a: (usize, Slot), b: (usize, Slot)) -> (usize, Slot) {
    let mask = 0u64.wrapping_sub(u64::from(pick));
    let choose = |x: u64, y: u64| (x & mask) | (y & !mask);
    let slot = Slot {
        key: choose(a.1.key, b.1.key),
        index: choose(u64::from(a.1.index), u64::from(b.1.index)) as u32,
    };
    (choose(a.0 as u64, b.0 as u64) as usize, slot)
}

/// Whether slot `a` goes before slot `b`: the smaller key, ties by the arena.
#[inline]
fn slot_before<A: HeapArena>(a: Slot, b: Slot, arena: &A) -> bool {
    a.key < b.key || (a.key == b.key && arena.tie_before(a.index, b.index))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A toy arena: positions and a tie-break rank per index.
    struct Toy {
        positions: Vec<u32>,
        rank: Vec<u64>,
    }

    impl HeapArena for Toy {
        fn set_heap_position(&mut self, index: u32, position: u32) {
            self.positions[index as usize] = position;
        }
        fn tie_before(&self, a: u32, b: u32) -> bool {
            self.rank[a as usize] < self.rank[b as usize]
        }
    }

    fn pops_in_key_then_tie_order<const D: usize>() {
        let mut toy = Toy { positions: vec![NOT_IN_HEAP; 5], rank: vec![4, 3, 2, 1, 0] };
        let mut heap = IndexedHeap::<D>::with_capacity(5);
        for (index, key) in [(0, 7), (1, 3), (2, 7), (3, 1), (4, 3)] {
            heap.push(key, index, &mut toy);
        }
        let order: Vec<u32> = std::iter::from_fn(|| heap.pop(&mut toy)).collect();
        assert_eq!(order, vec![3, 4, 1, 2, 0]);
        assert!(toy.positions.iter().all(|&p| p == NOT_IN_HEAP));
    }

    #[test]
    fn pops_in_key_then_tie_order_binary_and_4_ary() {
        pops_in_key_then_tie_order::<2>();
        pops_in_key_then_tie_order::<3>();
        pops_in_key_then_tie_order::<4>();
    }

    fn first_k_is_what_k_pops_return<const D: usize>() {
        let keys = [5u64, 1, 9, 1, 7, 3, 3, 8, 2, 6, 4, 0, 5, 2, 8, 1, 0, 7];
        let n = keys.len();
        let mut toy = Toy { positions: vec![NOT_IN_HEAP; n], rank: (0..n as u64).rev().collect() };
        let mut heap = IndexedHeap::<D>::with_capacity(n);
        for (index, &key) in keys.iter().enumerate() {
            heap.push(key, index as u32, &mut toy);
        }
        let (mut frontier, mut first) = (Vec::new(), Vec::new());
        for k in [0, 1, 5, n, n + 3] {
            first.clear();
            heap.first_k(k, &toy, &mut frontier, &mut first);
            let mut copy = IndexedHeap::<D>::with_capacity(n);
            let mut toy2 = Toy { positions: vec![NOT_IN_HEAP; n], rank: toy.rank.clone() };
            for (index, &key) in keys.iter().enumerate() {
                copy.push(key, index as u32, &mut toy2);
            }
            let popped: Vec<u32> = std::iter::from_fn(|| copy.pop(&mut toy2)).take(k).collect();
            assert_eq!(first, popped, "k = {k}, D = {D}");
        }
        assert_eq!(heap.len(), n);
    }

    #[test]
    fn first_k_is_what_k_pops_return_binary_and_4_ary() {
        first_k_is_what_k_pops_return::<2>();
        first_k_is_what_k_pops_return::<3>();
        first_k_is_what_k_pops_return::<4>();
    }

    #[derive(Debug, Clone)]
    enum Op {
        Push(u64),
        Pop,
        Remove(usize),
        Increase(usize, u64),
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            (0u64..20).prop_map(Op::Push),
            Just(Op::Pop),
            any::<usize>().prop_map(Op::Remove),
            (any::<usize>(), 0u64..10).prop_map(|(pick, by)| Op::Increase(pick, by)),
        ]
    }

    /// Against a reference: a plain Vec of (key, rank, index) scanned for its minimum.
    fn matches_sorted_reference<const D: usize>(ops: &[Op]) -> Result<(), TestCaseError> {
        const N: usize = 64;
        let mut toy = Toy { positions: vec![NOT_IN_HEAP; N], rank: (0..N as u64).collect() };
        let mut heap = IndexedHeap::<D>::with_capacity(N);
        let mut model: Vec<(u64, u64, u32)> = Vec::new();
        let mut free: Vec<u32> = (0..N as u32).rev().collect();
        for op in ops {
            match *op {
                Op::Push(key) => {
                    if let Some(index) = free.pop() {
                        heap.push(key, index, &mut toy);
                        model.push((key, toy.rank[index as usize], index));
                    }
                }
                Op::Pop => {
                    let expected = model.iter().min().copied();
                    model.retain(|entry| Some(*entry) != expected);
                    let got = heap.pop(&mut toy);
                    prop_assert_eq!(got, expected.map(|entry| entry.2));
                    free.extend(got);
                }
                Op::Remove(pick) => {
                    if !model.is_empty() {
                        let (_, _, index) = model.remove(pick % model.len());
                        let position = toy.positions[index as usize];
                        prop_assert_eq!(heap.remove(position, &mut toy), index);
                        free.push(index);
                    }
                }
                Op::Increase(pick, by) => {
                    if !model.is_empty() {
                        let at = pick % model.len();
                        model[at].0 += by;
                        let (key, _, index) = model[at];
                        heap.increase(toy.positions[index as usize], key, &mut toy);
                    }
                }
            }
            prop_assert_eq!(heap.len(), model.len());
            heap.check_invariants(&toy, |index| toy.positions[index as usize]);
        }
        Ok(())
    }

    proptest! {
        #[test]
        fn binary_matches_sorted_reference(ops in proptest::collection::vec(op(), 0..300)) {
            matches_sorted_reference::<2>(&ops)?;
        }

        #[test]
        fn four_ary_matches_sorted_reference(ops in proptest::collection::vec(op(), 0..300)) {
            matches_sorted_reference::<4>(&ops)?;
        }
    }
}
