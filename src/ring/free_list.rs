//! A lock-free last-in-first-out free list of slot numbers: the prompt pool's
//! ([`super::prompt_pool`]).
//!
//! Treiber's stack (R. K. Treiber, "Systems Programming: Coping with Parallelism", IBM RJ 5118,
//! 1986) over indices: each free slot holds the number of the free slot below it, and one
//! atomic word holds the top. Popping reads the top and the slot below it and swings the top
//! down with a compare-and-swap; pushing links the slot to the top and swings the top to it.
//! The top word also counts the changes made to it, so that a pop that read top `a` and below
//! it `b` fails if meanwhile `a` was popped and pushed back over another slot (the ABA
//! problem: without the count its swap would succeed and put `b`, now taken, back on top).
//! The count is 32 bits: a pop would have to stall through 2³² changes of the top to be
//! fooled. `tests/loom_free_list.rs` model-checks that no slot is handed out twice, through
//! that pattern among others (the atomics are loom's under `cfg(loom)`, `ring/sync.rs`).
//!
//! Why last-in-first-out: a pool slot keeps its buffer's capacity, and a FIFO (crossbeam's
//! `ArrayQueue`, the pool's first free list) hands out every slot in turn, so after as many
//! requests as there are slots (66,560 by default) every slot holds a buffer: 140 MB of
//! resident memory after 108,000 requests of 64 KiB prompts at 32 connections, where the
//! requests in flight needed 32 (perf/RESULTS.md). A stack hands out the slots given back last,
//! so the slots that ever hold a buffer are as many as were ever in use at once, and those are
//! warm in cache.

use super::sync::{AtomicU32, AtomicU64, Ordering};

/// No slot: the end of the list.
const NIL: u32 = u32::MAX;

/// A lock-free stack of the numbers `0..capacity` (module doc).
#[derive(Debug)]
pub struct FreeList {
    /// The top slot (low 32 bits, [`NIL`] when empty) and the count of changes made to it
    /// (high 32 bits, wrapping).
    top: AtomicU64,
    /// For each free slot, the free slot below it ([`NIL`] at the bottom); a taken slot's entry
    /// is stale and never read as a link.
    below: Box<[AtomicU32]>,
}

/// The top word of slot `slot` after `changes` changes.
fn word(slot: u32, changes: u64) -> u64 {
    changes << 32 | u64::from(slot)
}

/// The top word that puts `slot` on top after the top word `top`: one change more.
fn after(top: u64, slot: u32) -> u64 {
    word(slot, (top >> 32).wrapping_add(1) & u64::from(u32::MAX))
}

impl FreeList {
    /// Every slot of `0..capacity` free, slot 0 on top.
    pub fn full(capacity: u32) -> FreeList {
        assert!(capacity < NIL, "the slot numbers must leave NIL free");
        let below = (0..capacity)
            .map(|slot| AtomicU32::new(if slot + 1 < capacity { slot + 1 } else { NIL }));
        let top = if capacity == 0 { NIL } else { 0 };
        FreeList { top: AtomicU64::new(word(top, 0)), below: below.collect() }
    }

    /// Takes the slot on top, or `None` when every slot is taken.
    pub fn pop(&self) -> Option<u32> {
        // Acquire: the link read below was written before the push that published this top.
        let mut top = self.top.load(Ordering::Acquire);
        loop {
            let slot = top as u32;
            if slot == NIL {
                return None;
            }
            // Stale if `slot` was taken meanwhile; then the count has moved and the swap fails.
            let below = self.below[slot as usize].load(Ordering::Relaxed);
            let changed = after(top, below);
            match self.top.compare_exchange_weak(top, changed, Ordering::Acquire, Ordering::Acquire)
            {
                Ok(_) => return Some(slot),
                Err(now) => top = now,
            }
        }
    }

    /// Gives `slot` back (it must be taken: a slot pushed twice would be handed out twice).
    pub fn push(&self, slot: u32) {
        let mut top = self.top.load(Ordering::Relaxed);
        loop {
            self.below[slot as usize].store(top as u32, Ordering::Relaxed);
            let changed = after(top, slot);
            // Release: the link stored above is visible to the pop that takes `slot` off.
            match self.top.compare_exchange_weak(top, changed, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => return,
                Err(now) => top = now,
            }
        }
    }

    /// Slots free now, by walking the list: for checks while no other thread uses it.
    pub fn count(&self) -> usize {
        let mut slot = self.top.load(Ordering::Acquire) as u32;
        let mut count = 0;
        while slot != NIL && count <= self.below.len() {
            count += 1;
            slot = self.below[slot as usize].load(Ordering::Relaxed);
        }
        count
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// The slot given back last is the next one taken; an empty list says so; `len` counts.
    #[test]
    fn last_in_first_out() {
        let list = FreeList::full(3);
        assert_eq!(list.count(), 3);
        assert_eq!((list.pop(), list.pop()), (Some(0), Some(1)));
        list.push(0);
        assert_eq!(list.pop(), Some(0));
        assert_eq!((list.pop(), list.pop()), (Some(2), None));
        assert_eq!(list.count(), 0);
        list.push(2);
        list.push(1);
        assert_eq!((list.count(), list.pop(), list.pop(), list.pop()), (2, Some(1), Some(2), None));
        assert_eq!(FreeList::full(0).pop(), None);
    }

    /// Threads taking and giving back slots as fast as they can: no slot is ever held by two
    /// at once (each marks the slot it holds and checks the mark was clear), and at the end
    /// every slot is free again.
    #[test]
    fn no_slot_is_held_twice_under_contention() {
        const SLOTS: u32 = 4;
        let list = Arc::new(FreeList::full(SLOTS));
        let held: Arc<Vec<AtomicU32>> = Arc::new((0..SLOTS).map(|_| AtomicU32::new(0)).collect());
        let start = Arc::new(std::sync::Barrier::new(4));
        let threads: Vec<_> = (1..=4u32)
            .map(|id| {
                let (list, held, start) =
                    (Arc::clone(&list), Arc::clone(&held), Arc::clone(&start));
                std::thread::spawn(move || {
                    let mut taken = Vec::new();
                    start.wait();
                    for round in 0..200_000u32 {
                        if round % 3 != 2 {
                            if let Some(slot) = list.pop() {
                                let was = held[slot as usize].swap(id, Ordering::AcqRel);
                                assert_eq!(was, 0, "slot {slot} taken by {id} while {was} held it");
                                taken.push(slot);
                            }
                        } else if let Some(slot) = taken.pop() {
                            held[slot as usize].store(0, Ordering::Release);
                            list.push(slot);
                        }
                    }
                    for slot in taken {
                        held[slot as usize].store(0, Ordering::Release);
                        list.push(slot);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().expect("no thread panicked");
        }
        assert_eq!(list.count(), SLOTS as usize);
        let mut slots: Vec<u32> = std::iter::from_fn(|| list.pop()).collect();
        slots.sort_unstable();
        assert_eq!(slots, (0..SLOTS).collect::<Vec<_>>());
    }
}
