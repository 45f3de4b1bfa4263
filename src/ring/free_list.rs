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
//!
//! Growth: [`FreeList::grow`] adds slots while other threads pop and push (a live reload that
//! raises a model's limits). The links live in a [`Segments`] array, whose elements never
//! move; the new slots are linked to each other first, then pushed as one chain by the same
//! swap of the top a single push makes, so a pop sees either none of them or a whole chain
//! whose links were written before that swap.

use std::sync::Mutex;

use super::segments::Segments;
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
    below: Segments<AtomicU32>,
    /// The slots made so far (`0..made`, free or taken); held while adding more.
    made: Mutex<u32>,
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
        let below = Segments::new(capacity, |slot| {
            AtomicU32::new(if slot + 1 < capacity { slot + 1 } else { NIL })
        });
        let top = if capacity == 0 { NIL } else { 0 };
        FreeList { top: AtomicU64::new(word(top, 0)), below, made: Mutex::new(capacity) }
    }

    /// Makes slots up to at least `to` and pushes the new ones, lowest on top; returns the
    /// slots made in all. Safe while other threads pop and push (module doc).
    pub fn grow(&self, to: u32) -> u32 {
        let mut made = self.made.lock().unwrap_or_else(|e| e.into_inner());
        if to <= *made {
            return *made;
        }
        let held = self.below.grow(u64::from(to), |_| AtomicU32::new(NIL));
        let (first, end) = (*made, held.min(u64::from(NIL)) as u32);
        for slot in first..end - 1 {
            self.below.get(slot).store(slot + 1, Ordering::Relaxed);
        }
        let mut top = self.top.load(Ordering::Relaxed);
        loop {
            self.below.get(end - 1).store(top as u32, Ordering::Relaxed);
            let changed = after(top, first);
            // Release: the chain's links stored above are visible to the pops that take it.
            match self.top.compare_exchange_weak(top, changed, Ordering::Release, Ordering::Relaxed)
            {
                Ok(_) => break,
                Err(now) => top = now,
            }
        }
        *made = end;
        end
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
            let below = self.below.get(slot).load(Ordering::Relaxed);
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
            self.below.get(slot).store(top as u32, Ordering::Relaxed);
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
        let made = *self.made.lock().unwrap_or_else(|e| e.into_inner()) as usize;
        let mut slot = self.top.load(Ordering::Acquire) as u32;
        let mut count = 0;
        while slot != NIL && count <= made {
            count += 1;
            slot = self.below.get(slot).load(Ordering::Relaxed);
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

    /// Growth pushes the new slots, lowest on top, above the free ones; it makes none when it
    /// has them; an empty list grows too.
    #[test]
    fn growth_pushes_the_new_slots_over_the_free_ones() {
        let list = FreeList::full(2);
        assert_eq!(list.pop(), Some(0));
        assert_eq!(list.grow(3), 4, "a whole segment of two more");
        assert_eq!(list.grow(4), 4);
        assert_eq!(list.count(), 3);
        let order: Vec<u32> = std::iter::from_fn(|| list.pop()).collect();
        assert_eq!(order, [2, 3, 1]);
        let empty = FreeList::full(0);
        assert_eq!(empty.grow(1), 1);
        assert_eq!((empty.pop(), empty.pop()), (Some(0), None));
    }

    /// Threads taking and giving back slots as fast as they can: no slot is ever held by two
    /// at once (each marks the slot it holds and checks the mark was clear), and at the end
    /// every slot is free again.
    #[test]
    fn no_slot_is_held_twice_under_contention() {
        contend(4, 4);
    }

    /// The same while the main thread grows the list from 4 slots to 64, one segment at a time:
    /// every slot added is handed out once at a time, and none is lost.
    #[test]
    fn no_slot_is_held_twice_while_the_list_grows() {
        contend(4, 64);
    }

    /// Four threads take and give back slots of a list of `start` slots, each checking that no
    /// other holds the slot it took, while this thread grows the list to `end`; then every slot
    /// is on the list once.
    fn contend(start: u32, end: u32) {
        const SLOTS: u32 = 64;
        let list = Arc::new(FreeList::full(start));
        let held: Arc<Vec<AtomicU32>> = Arc::new((0..SLOTS).map(|_| AtomicU32::new(0)).collect());
        let barrier = Arc::new(std::sync::Barrier::new(5));
        let threads: Vec<_> = (1..=4u32)
            .map(|id| {
                let (list, held, barrier) =
                    (Arc::clone(&list), Arc::clone(&held), Arc::clone(&barrier));
                std::thread::spawn(move || {
                    let mut taken = Vec::new();
                    barrier.wait();
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
        barrier.wait();
        let mut made = start;
        while made < end {
            made = list.grow(made + 1);
            std::thread::yield_now();
        }
        for thread in threads {
            thread.join().expect("no thread panicked");
        }
        assert_eq!(list.count(), end as usize);
        let mut slots: Vec<u32> = std::iter::from_fn(|| list.pop()).collect();
        slots.sort_unstable();
        assert_eq!(slots, (0..end).collect::<Vec<_>>());
    }
}
