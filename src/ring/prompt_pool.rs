//! The prompt pool: how a request's S16 block hashes reach its model's scheduler, a
//! cross-thread hand-off beside the rings.
//!
//! A prompt's chain of block hashes is variable length (a 512 KiB prompt is 2,048 hashes), and
//! the rings carry fixed-size `Copy` messages, so the chain travels through a pool of
//! preallocated vectors instead. The shard that parsed the body takes a slot (a lock-free
//! last-in-first-out free list of slot numbers, [`super::free_list`], so that the slots ever
//! used, and the memory their vectors keep, are as many as were in use at once), hashes the
//! prompt into that slot's vector (`protocol::PromptHasher`) and sends the
//! slot number in its `Arrival`; the scheduler reads the hashes when it places the request and
//! gives the slot back when the request ends. Ownership of a slot moves with the message that
//! names it, so at any moment one thread owns it.
//!
//! Shared state: one pool per model (built with its scheduler, an `Arc` held by the scheduler
//! and by every shard's view of the model), a `Mutex<Vec<u64>>` per slot. A slot's mutex is
//! never contended (one owner at a time, handed over through the rings), so a lock is one
//! uncontended atomic exchange; it is there so that the hand-off needs no `unsafe`. A slot's
//! vector keeps its capacity, so after warm-up nothing allocates. A full pool is not an error:
//! the request goes without hashes, as if nothing of it were cached.
//!
//! The pool grows when its scheduler's arena does (a live reload that raises `max_queued`,
//! `inflight_per_backend` or the backends, [`PromptPool::grow`]): the slots and the free list's
//! links are [`Segments`] arrays, so the slots in use never move, and the new slots reach the
//! shards through the free list alone.
//!
//! A slot also carries the prompt's conversation [`Ends`] (issue \[10\]'s derived sessions):
//! a fixed-size array beside the vector, so the scheduler can match a request without an
//! identity to the conversation it continues.

use std::sync::{Arc, Mutex};

pub use crate::protocol::Ends;

use super::free_list::FreeList;
use super::segments::Segments;

/// One slot's contents.
#[derive(Debug, Default)]
struct Slot {
    hashes: Vec<u64>,
    ends: Ends,
}

/// No prompt slot: the request carries no block hashes.
pub const NO_PROMPT: u32 = u32::MAX;

/// Block-hash buffers handed from shards to a model's scheduler.
#[derive(Debug)]
pub struct PromptPool {
    slots: Segments<Mutex<Slot>>,
    free: FreeList,
}

impl PromptPool {
    /// A pool of `capacity` slots (at least 1), all free, their vectors empty.
    pub fn new(capacity: u32) -> Arc<PromptPool> {
        let capacity = capacity.max(1);
        let free = FreeList::full(capacity);
        let slots = Segments::new(capacity, |_| Mutex::default());
        Arc::new(PromptPool { slots, free })
    }

    /// Room for at least `capacity` slots, the new ones free, while other threads use the pool
    /// (module doc).
    pub fn grow(&self, capacity: u32) {
        // The slots first: a slot number reaches the shards only through the free list.
        self.slots.grow(u64::from(capacity), |_| Mutex::default());
        self.free.grow(capacity);
    }

    /// Takes a free slot, or `None` when every slot is in use.
    pub fn acquire(&self) -> Option<u32> {
        self.free.pop()
    }

    /// Runs `f` on slot `slot`'s vector (the caller owns the slot).
    pub fn with<R>(&self, slot: u32, f: impl FnOnce(&mut Vec<u64>) -> R) -> R {
        self.with_ends(slot, |hashes, _| f(hashes))
    }

    /// Runs `f` on slot `slot`'s vector and conversation ends (the caller owns the slot).
    pub fn with_ends<R>(&self, slot: u32, f: impl FnOnce(&mut Vec<u64>, &mut Ends) -> R) -> R {
        let mut held = self.slots.get(slot).lock().unwrap_or_else(|e| e.into_inner());
        let Slot { hashes, ends } = &mut *held;
        f(hashes, ends)
    }

    /// Slot `slot`'s conversation ends (the caller owns the slot).
    pub fn ends(&self, slot: u32) -> Ends {
        self.with_ends(slot, |_, ends| *ends)
    }

    /// Gives slot `slot` back; its vector is cleared, its capacity kept.
    pub fn release(&self, slot: u32) {
        self.with_ends(slot, |hashes, ends| {
            hashes.clear();
            *ends = Ends::NONE;
        });
        self.free.push(slot);
    }

    /// Slots not in use (a walk of the free list: for checks, not while other threads use
    /// the pool).
    pub fn available(&self) -> usize {
        self.free.count()
    }

    /// Slots in all.
    pub fn capacity(&self) -> usize {
        self.slots.held() as usize
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    /// A grown pool hands out its new slots, each with its own vector, and keeps the old
    /// slots' contents.
    #[test]
    fn a_grown_pool_hands_out_new_slots_and_keeps_the_old() {
        let pool = PromptPool::new(1);
        let old = pool.acquire().expect("free");
        pool.with(old, |v| v.push(7));
        assert_eq!(pool.acquire(), None);
        pool.grow(3);
        assert_eq!((pool.capacity(), pool.available()), (4, 3));
        let new: Vec<u32> = std::iter::from_fn(|| pool.acquire()).collect();
        assert_eq!(new, [1, 2, 3]);
        for &slot in &new {
            pool.with(slot, |v| v.push(slot.into()));
        }
        assert_eq!(pool.with(old, |v| v.clone()), [7]);
        assert_eq!(pool.with(3, |v| v.clone()), [3]);
    }
}
