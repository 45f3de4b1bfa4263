//! The session tracker: which sessions completed recently, when, and on which backend (SPEC S1,
//! S2, S12).
//!
//! Eviction is CLOCK second-chance (F. J. Corbató, "A Paging Experiment with the Multics
//! System", 1968), an approximation of LRU that costs one bit per entry and no list surgery on
//! an update. The policy is exact and deterministic, so that the scheduler's reference model
//! (and [`reference`]) can restate it:
//!
//! - Slots `0..capacity`, a `hand` starting at 0; each occupied slot holds a session, its
//!   completion, and a *referenced* bit.
//! - Completing a session already held updates its completion and sets its referenced bit.
//!   Nothing else moves.
//! - Completing a new session while not full fills the next free slot (0, 1, 2, ...), with the
//!   referenced bit clear.
//! - Completing a new session while full sweeps the hand: a referenced slot loses its bit and
//!   the hand moves on; the first unreferenced slot is evicted, takes the new session (bit
//!   clear), and the hand moves past it.
//! - A lookup never changes anything (S1: "a lookup does not change the tracker's recency").
//!
//! This gives SPEC S2's exact cases: with capacity 2, completing a, b, a, c evicts b; x, y, z
//! evicts x.
//!
//! Layout, all allocated in [`SessionTracker::with_capacity`] and never grown:
//! - `slots`: a `Vec` of 24-byte slots (session, completion time, backend, turns completed:
//!   the turn counter of issue \[10\] fills what was padding, so it costs nothing).
//! - `referenced`: one bit per slot, in `u64` words, so that the hand skips 64 referenced slots
//!   with one load and clears them with one store.
//! - `index`: a hashbrown [`HashTable`] of `u32` slot numbers, hashed by the session id stored
//!   in the slot (4 bytes per bucket plus 1 control byte, instead of 16 + 1 for a
//!   `HashMap<u64, u32>`). It is sized for twice the capacity: an eviction removes one entry
//!   and inserts another, which can leave hashbrown tombstones; with a load of at most one half
//!   hashbrown clears them by rehashing in place, where a fuller table would reallocate.
//!   [`SessionTracker::check_invariants`] asserts that the table never reallocated.
//!
//! About 53 bytes per tracked session (see the test `memory_per_session`).

use hashbrown::{DefaultHashBuilder, HashTable};
use std::hash::BuildHasher;

/// What the tracker remembers of a completed session.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Completion {
    /// When the session's last turn completed (a clock tick).
    pub at: u64,
    /// The backend that served it.
    pub backend: u16,
    /// The session's turns completed while the tracker held it (saturating): its next
    /// request's turn depth is one more (issue \[10\]).
    pub turns: u16,
}

/// The turn-depth buckets of the turn-indexed metrics (SPEC section 10's `turn` label), in
/// order.
pub const TURN_BUCKETS: [&str; 5] = ["1", "2", "3-4", "5-8", "9+"];

/// The index in [`TURN_BUCKETS`] of turn depth `turn` (1-based; 0 counts as 1).
pub fn turn_bucket(turn: u16) -> usize {
    match turn {
        0 | 1 => 0,
        2 => 1,
        3 | 4 => 2,
        5..=8 => 3,
        _ => 4,
    }
}

/// One occupied slot: a session and its last completion.
#[derive(Debug, Clone, Copy)]
struct Slot {
    session: u64,
    at: u64,
    backend: u16,
    /// Turns completed; it sits in what was the slot's padding (still 24 bytes).
    turns: u16,
}

const _: () = assert!(std::mem::size_of::<Slot>() == 24);

/// A fixed-capacity map from session id to its last [`Completion`], with CLOCK eviction.
///
/// Session ids are 64-bit hashes of the session header; every value, 0 included, is a valid id.
#[derive(Debug)]
pub struct SessionTracker {
    /// Occupied slots, filled in order; `slots.len()` sessions are held.
    slots: Vec<Slot>,
    /// Referenced bit of slot `i`: bit `i % 64` of word `i / 64`. Bits of unoccupied slots and
    /// bits past `capacity` are always clear.
    referenced: Vec<u64>,
    /// Session id to slot number; hashed with `hasher` on the session stored in the slot.
    index: HashTable<u32>,
    hasher: DefaultHashBuilder,
    /// The CLOCK hand, in `0..capacity`; stays 0 until the tracker is full.
    hand: u32,
    capacity: u32,
    /// `index.allocation_size()` at construction: it must never change.
    index_bytes: usize,
}

impl SessionTracker {
    /// A tracker holding at most `capacity` sessions, with all its memory allocated here.
    ///
    /// Panics if `capacity` is 0 or above `u32::MAX`.
    pub fn with_capacity(capacity: usize) -> Self {
        assert!(capacity >= 1, "session tracker capacity must be at least 1");
        let capacity_u32 = u32::try_from(capacity)
            .unwrap_or_else(|_| panic!("session tracker capacity {capacity} exceeds u32::MAX"));
        let index = HashTable::with_capacity(capacity * 2);
        let index_bytes = index.allocation_size();
        SessionTracker {
            slots: Vec::with_capacity(capacity),
            referenced: vec![0; capacity.div_ceil(64)],
            index,
            hasher: DefaultHashBuilder::default(),
            hand: 0,
            capacity: capacity_u32,
            index_bytes,
        }
    }

    /// The last completion of `session`, if the tracker holds it. Changes nothing.
    pub fn lookup(&self, session: u64) -> Option<Completion> {
        let slot = self.find(session)?;
        let s = &self.slots[slot as usize];
        Some(Completion { at: s.at, backend: s.backend, turns: s.turns })
    }

    /// Records that `session` completed at `at` on `backend`: updates it if held (and marks it
    /// referenced, counting one more turn), otherwise inserts it with one turn, evicting one
    /// session by CLOCK when full.
    pub fn complete(&mut self, session: u64, at: u64, backend: u16) {
        if let Some(slot) = self.find(session) {
            let s = &mut self.slots[slot as usize];
            s.at = at;
            s.backend = backend;
            s.turns = s.turns.saturating_add(1);
            self.referenced[slot as usize / 64] |= 1 << (slot % 64);
            return;
        }
        let new = Slot { session, at, backend, turns: 1 };
        let slot = if self.slots.len() < self.capacity as usize {
            self.slots.push(new);
            self.slots.len() as u32 - 1
        } else {
            let victim = self.sweep();
            self.evict(victim);
            self.slots[victim as usize] = new;
            self.hand = (victim + 1) % self.capacity;
            victim
        };
        let slots = &self.slots;
        let hasher = &self.hasher;
        self.index.insert_unique(hasher.hash_one(session), slot, |&i| {
            hasher.hash_one(slots[i as usize].session)
        });
    }

    /// Calls `f(session, completion tick)` for every session held, in slot order from the
    /// CLOCK hand on (the oldest insertions first once the tracker has been full).
    pub fn for_each_from_hand(&self, mut f: impl FnMut(u64, u64)) {
        let (len, hand) = (self.slots.len(), self.hand as usize);
        for i in (hand..len).chain(0..hand.min(len)) {
            f(self.slots[i].session, self.slots[i].at);
        }
    }

    /// Forgets every session, in place: no allocation, the capacity kept.
    pub fn clear(&mut self) {
        self.slots.clear();
        self.referenced.fill(0);
        self.index.clear();
        self.hand = 0;
    }

    /// The number of sessions held.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Whether no session is held.
    pub fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    /// The most sessions the tracker holds.
    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }

    /// The bytes of the buffers allocated at construction: slots, referenced bits, index.
    pub fn heap_bytes(&self) -> usize {
        self.slots.capacity() * std::mem::size_of::<Slot>()
            + self.referenced.capacity() * std::mem::size_of::<u64>()
            + self.index.allocation_size()
    }

    /// Panics, saying what is wrong, if the structure is inconsistent: the index and the slots
    /// disagree, a bit is set where no session is, the hand moved before the tracker was full,
    /// or a buffer was reallocated.
    pub fn check_invariants(&self) {
        let capacity = self.capacity as usize;
        let len = self.slots.len();
        assert!(len <= capacity, "tracker holds {len} sessions, capacity {capacity}");
        assert!(self.slots.capacity() >= capacity, "tracker slots shrank");
        assert_eq!(self.referenced.len(), capacity.div_ceil(64), "tracker bitset resized");
        assert_eq!(self.index.allocation_size(), self.index_bytes, "tracker index reallocated");
        assert_eq!(
            self.index.len(),
            len,
            "tracker index has {} entries, {len} slots",
            self.index.len()
        );
        assert!(self.hand < self.capacity, "tracker hand {} out of range", self.hand);
        assert!(len == capacity || self.hand == 0, "tracker hand moved before it was full");
        for (i, slot) in self.slots.iter().enumerate() {
            let found = self.find(slot.session);
            assert_eq!(
                found,
                Some(i as u32),
                "session {:#x} in slot {i} indexed as {found:?}",
                slot.session
            );
        }
        for (w, &word) in self.referenced.iter().enumerate() {
            let live = len.saturating_sub(w * 64).min(64);
            let live_mask = if live == 64 { u64::MAX } else { (1u64 << live) - 1 };
            assert_eq!(word & !live_mask, 0, "referenced bit set on an empty slot (word {w})");
        }
    }

    /// The slot holding `session`.
    fn find(&self, session: u64) -> Option<u32> {
        let slots = &self.slots;
        self.index
            .find(self.hasher.hash_one(session), |&i| slots[i as usize].session == session)
            .copied()
    }

    /// Removes the session in slot `victim` from the index.
    fn evict(&mut self, victim: u32) {
        let hash = self.hasher.hash_one(self.slots[victim as usize].session);
        match self.index.find_entry(hash, |&i| i == victim) {
            Ok(entry) => {
                entry.remove();
            }
            Err(_) => panic!("tracker slot {victim} missing from its index"),
        }
    }

    /// Moves the hand to the CLOCK victim: the first slot at or after `hand`, cyclically, whose
    /// referenced bit is clear, clearing the bits of every slot passed over. Works a word of 64
    /// slots at a time; ends within one turn and a word, since a turn clears every bit.
    fn sweep(&mut self) -> u32 {
        let capacity = self.capacity as usize;
        let mut pos = self.hand as usize;
        loop {
            let w = pos / 64;
            let end = (capacity - w * 64).min(64);
            let upto_end = if end == 64 { u64::MAX } else { (1u64 << end) - 1 };
            let window = (u64::MAX << (pos % 64)) & upto_end;
            let word = self.referenced[w];
            let unreferenced = !word & window;
            if unreferenced != 0 {
                let bit = unreferenced.trailing_zeros();
                let passed = window & ((1u64 << bit) - 1);
                self.referenced[w] = word & !passed;
                return (w * 64) as u32 + bit;
            }
            self.referenced[w] = word & !window;
            pos = w * 64 + end;
            if pos >= capacity {
                pos = 0;
            }
        }
    }
}

/// A naive restatement of the tracker's exact policy: linear scans over a `Vec`. The scheduler's
/// reference model and the property tests compare the real tracker against it.
#[cfg(any(test, fuzzing))]
pub mod reference {
    use super::Completion;

    /// The reference tracker: `(session, completion, referenced)` per slot, and a hand.
    #[derive(Debug)]
    pub struct SessionTracker {
        slots: Vec<(u64, Completion, bool)>,
        hand: usize,
        capacity: usize,
    }

    impl SessionTracker {
        /// Same as [`super::SessionTracker::with_capacity`].
        pub fn with_capacity(capacity: usize) -> Self {
            assert!(capacity >= 1, "session tracker capacity must be at least 1");
            SessionTracker { slots: Vec::new(), hand: 0, capacity }
        }

        /// Same as [`super::SessionTracker::lookup`].
        pub fn lookup(&self, session: u64) -> Option<Completion> {
            self.slots.iter().find(|s| s.0 == session).map(|s| s.1)
        }

        /// Same as [`super::SessionTracker::complete`].
        pub fn complete(&mut self, session: u64, at: u64, backend: u16) {
            let completion = Completion { at, backend, turns: 1 };
            if let Some(slot) = self.slots.iter_mut().find(|s| s.0 == session) {
                slot.1 = Completion { turns: slot.1.turns.saturating_add(1), ..completion };
                slot.2 = true;
                return;
            }
            if self.slots.len() < self.capacity {
                self.slots.push((session, completion, false));
                return;
            }
            loop {
                let slot = &mut self.slots[self.hand];
                if slot.2 {
                    slot.2 = false;
                    self.hand = (self.hand + 1) % self.capacity;
                } else {
                    *slot = (session, completion, false);
                    self.hand = (self.hand + 1) % self.capacity;
                    break;
                }
            }
        }

        /// Same as [`super::SessionTracker::len`].
        pub fn len(&self) -> usize {
            self.slots.len()
        }

        /// Same as [`super::SessionTracker::for_each_from_hand`].
        pub fn for_each_from_hand(&self, mut f: impl FnMut(u64, u64)) {
            let hand = self.hand.min(self.slots.len());
            for (session, completion, _) in self.slots[hand..].iter().chain(&self.slots[..hand]) {
                f(*session, completion.at);
            }
        }

        /// Same as [`super::SessionTracker::is_empty`].
        pub fn is_empty(&self) -> bool {
            self.slots.is_empty()
        }

        /// Same as [`super::SessionTracker::capacity`].
        pub fn capacity(&self) -> usize {
            self.capacity
        }

        /// Panics if the slots hold a session twice or exceed the capacity.
        pub fn check_invariants(&self) {
            assert!(self.slots.len() <= self.capacity, "reference tracker over capacity");
            assert!(self.hand < self.capacity, "reference tracker hand out of range");
            for (i, a) in self.slots.iter().enumerate() {
                assert!(
                    self.slots[i + 1..].iter().all(|b| b.0 != a.0),
                    "reference tracker holds session {:#x} twice",
                    a.0
                );
            }
        }

        /// The bytes of the slot vector.
        pub fn heap_bytes(&self) -> usize {
            self.slots.capacity() * std::mem::size_of::<(u64, Completion, bool)>()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const A: u64 = 0xa;
    const B: u64 = 0xb;
    const C: u64 = 0xc;

    fn held(t: &SessionTracker, sessions: &[u64]) -> Vec<bool> {
        sessions.iter().map(|&s| t.lookup(s).is_some()).collect()
    }

    #[test]
    fn spec_s2_update_gives_a_second_chance() {
        let mut t = SessionTracker::with_capacity(2);
        t.complete(A, 1, 0);
        t.complete(B, 2, 1);
        t.complete(A, 3, 2);
        t.complete(C, 4, 3);
        t.check_invariants();
        assert_eq!(held(&t, &[A, B, C]), [true, false, true]);
        assert_eq!(t.lookup(A), Some(Completion { at: 3, backend: 2, turns: 2 }));
        assert_eq!(t.lookup(C), Some(Completion { at: 4, backend: 3, turns: 1 }));
    }

    #[test]
    fn spec_s2_without_updates_evicts_the_oldest() {
        let (x, y, z) = (1, 2, 3);
        let mut t = SessionTracker::with_capacity(2);
        t.complete(x, 10, 0);
        t.complete(y, 11, 0);
        t.complete(z, 12, 0);
        t.check_invariants();
        assert_eq!(held(&t, &[x, y, z]), [false, true, true]);
        assert_eq!(t.len(), 2);
    }

    #[test]
    fn clear_forgets_everything_in_place_and_the_tracker_fills_again() {
        let mut t = SessionTracker::with_capacity(2);
        t.complete(A, 1, 0);
        t.complete(B, 2, 0);
        t.complete(A, 3, 0);
        t.complete(C, 4, 0);
        let bytes = t.heap_bytes();
        t.clear();
        t.check_invariants();
        assert_eq!((t.len(), t.capacity(), t.heap_bytes()), (0, 2, bytes));
        assert_eq!(held(&t, &[A, B, C]), [false, false, false]);
        // Filled again from an unreferenced start: the oldest is evicted first.
        t.complete(B, 5, 1);
        t.complete(C, 6, 1);
        t.complete(A, 7, 1);
        t.check_invariants();
        assert_eq!(held(&t, &[A, B, C]), [true, false, true]);
        assert_eq!(t.lookup(A), Some(Completion { at: 7, backend: 1, turns: 1 }));
    }

    #[test]
    fn lookup_does_not_change_recency() {
        let mut t = SessionTracker::with_capacity(2);
        t.complete(A, 1, 0);
        t.complete(B, 2, 0);
        assert!(t.lookup(A).is_some());
        t.complete(C, 3, 0);
        t.check_invariants();
        assert_eq!(held(&t, &[A, B, C]), [false, true, true]);
    }

    #[test]
    fn all_referenced_clears_a_full_turn_then_evicts_at_the_hand() {
        let mut t = SessionTracker::with_capacity(3);
        for s in [A, B, C] {
            t.complete(s, 0, 0);
        }
        for s in [A, B, C] {
            t.complete(s, 1, 0);
        }
        t.complete(0xd, 2, 0);
        assert_eq!(held(&t, &[A, B, C, 0xd]), [false, true, true, true]);
        // The hand passed A's slot, B and C lost their bits: B goes next.
        t.complete(0xe, 3, 0);
        assert_eq!(held(&t, &[B, C, 0xd, 0xe]), [false, true, true, true]);
        t.check_invariants();
    }

    #[test]
    fn turn_buckets_are_1_2_3to4_5to8_9plus() {
        let names = |turns: &[u16]| -> Vec<&str> {
            turns.iter().map(|&t| TURN_BUCKETS[turn_bucket(t)]).collect()
        };
        assert_eq!(names(&[0, 1, 2, 3, 4, 5, 8]), ["1", "1", "2", "3-4", "3-4", "5-8", "5-8"]);
        assert_eq!(names(&[9, 10, 1000, u16::MAX]), ["9+", "9+", "9+", "9+"]);
    }

    #[test]
    fn turns_count_completions_and_restart_after_eviction() {
        let mut t = SessionTracker::with_capacity(1);
        for at in 1..=3 {
            t.complete(A, at, 0);
        }
        assert_eq!(t.lookup(A).map(|c| c.turns), Some(3));
        t.complete(B, 4, 0);
        t.complete(A, 5, 0);
        assert_eq!(t.lookup(A).map(|c| c.turns), Some(1), "evicted, then seen anew");
        let mut r = reference::SessionTracker::with_capacity(1);
        for at in 1..=3 {
            r.complete(A, at, 0);
        }
        assert_eq!(r.lookup(A).map(|c| c.turns), Some(3));
    }

    #[test]
    fn session_zero_and_max_are_valid_keys() {
        let mut t = SessionTracker::with_capacity(4);
        assert!(t.is_empty());
        t.complete(0, 5, 1);
        t.complete(u64::MAX, 6, 2);
        assert_eq!(t.lookup(0), Some(Completion { at: 5, backend: 1, turns: 1 }));
        assert_eq!(t.lookup(u64::MAX), Some(Completion { at: 6, backend: 2, turns: 1 }));
        assert_eq!(t.lookup(1), None);
        assert_eq!((t.len(), t.capacity()), (2, 4));
        t.check_invariants();
    }

    #[test]
    fn capacity_one_keeps_the_last() {
        let mut t = SessionTracker::with_capacity(1);
        t.complete(A, 1, 0);
        t.complete(A, 2, 0);
        t.complete(B, 3, 0);
        assert_eq!(held(&t, &[A, B]), [false, true]);
        t.check_invariants();
    }

    #[test]
    #[should_panic(expected = "at least 1")]
    fn capacity_zero_panics() {
        let _ = SessionTracker::with_capacity(0);
    }

    /// Long eviction churn at capacities on both sides of hashbrown's bucket-size steps: the
    /// index must never reallocate (`check_invariants` compares its allocation size).
    #[test]
    fn churn_never_grows_the_index() {
        let mut x = 0x1234_5678_9abc_def0_u64;
        for capacity in [7, 8, 14, 15, 28, 29, 448, 449, 3584, 3585] {
            let mut t = SessionTracker::with_capacity(capacity);
            let bytes = t.heap_bytes();
            for i in 0..(capacity as u64 * 40) {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                let session = x % (capacity as u64 * 3);
                t.complete(session, i, 0);
            }
            t.check_invariants();
            assert_eq!(t.heap_bytes(), bytes, "capacity {capacity}");
        }
    }

    #[test]
    fn memory_per_session() {
        for capacity in [4096, 1_000_000] {
            let t = SessionTracker::with_capacity(capacity);
            let per = t.heap_bytes() as f64 / capacity as f64;
            println!(
                "tracker capacity {capacity}: {} heap bytes, {per:.1} bytes/session",
                t.heap_bytes()
            );
            assert!(per <= 64.0, "{per} bytes per session at capacity {capacity}");
        }
    }

    #[derive(Debug, Clone)]
    enum Op {
        Complete {
            session: u64,
            at: u64,
            backend: u16,
        },
        Lookup(u64),
        /// [`SessionTracker::clear`] against a new reference tracker.
        Clear,
    }

    fn op(sessions: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            60 => (0..sessions, any::<u64>(), any::<u16>())
                .prop_map(|(session, at, backend)| Op::Complete { session, at, backend }),
            20 => (0..sessions).prop_map(Op::Lookup),
            1 => Just(Op::Clear),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Random completions and lookups against the reference; after every step, every
        /// session of the domain answers the same.
        #[test]
        fn matches_reference(
            capacity in 1usize..80,
            ops in prop::collection::vec(op(120), 1..400),
        ) {
            let mut real = SessionTracker::with_capacity(capacity);
            let mut model = reference::SessionTracker::with_capacity(capacity);
            for op in ops {
                match op {
                    Op::Complete { session, at, backend } => {
                        real.complete(session, at, backend);
                        model.complete(session, at, backend);
                    }
                    Op::Lookup(session) => {
                        prop_assert_eq!(real.lookup(session), model.lookup(session));
                    }
                    Op::Clear => {
                        real.clear();
                        model = reference::SessionTracker::with_capacity(capacity);
                    }
                }
                real.check_invariants();
                model.check_invariants();
                prop_assert_eq!(real.len(), model.len());
                prop_assert_eq!(real.is_empty(), model.is_empty());
                for s in 0..120 {
                    prop_assert_eq!(real.lookup(s), model.lookup(s), "session {}", s);
                }
            }
        }
    }
}
