//! The ring's synchronisation primitives, swapped for loom's under `cfg(loom)` so that the
//! wake-up protocol can be model-checked (`tests/loom_ring.rs`; crossbeam-epoch's `primitive`
//! module does the same).
//!
//! Normally: `std`'s atomics and fence, and crossbeam's `ArrayQueue` as the queue. The prompt
//! pool's free list ([`super::free_list`]) takes its atomics from here too
//! (`tests/loom_free_list.rs`).
//!
//! Under `RUSTFLAGS="--cfg loom"`: loom's atomics and fence, and [`Queue`], a stand-in for
//! `ArrayQueue` that loom can see into. crossbeam's queue uses `core`'s atomics, invisible to
//! loom, so the model replaces it with what the wake-up protocol relies on and nothing more:
//! - `push` publishes a message by an atomic read-modify-write of `tail` (crossbeam: the
//!   `SeqCst` compare-and-swap of `tail`); `pop` retires one by an atomic read-modify-write of
//!   `head` (crossbeam: the `SeqCst` compare-and-swap of `head`);
//! - `is_empty` and `len` read `head` and `tail` with `SeqCst` loads, as crossbeam's do, and
//!   no lock;
//! - the messages themselves sit in a `loom::sync::Mutex<VecDeque>`, which `push` and `pop`
//!   take (crossbeam: the slots and their stamps). This lock orders pushes and pops with each
//!   other, so the model does not check crossbeam's slot protocol (crossbeam's own tests do);
//!   it does not order `is_empty` with anything, because `is_empty` does not take it.
//!
//! Loom treats `SeqCst` loads, stores and read-modify-writes as `AcqRel` (weaker than they are;
//! `fence(SeqCst)` it models exactly), so the stand-in's accesses give the protocol no more
//! ordering than crossbeam's do: a model that passes does not lean on the queue for the
//! store-buffering guarantee, only on the ring's own fences.

#[cfg(not(loom))]
pub(super) use crossbeam_queue::ArrayQueue as Queue;
#[cfg(not(loom))]
pub(super) use std::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};

#[cfg(loom)]
pub(super) use loom::sync::atomic::{fence, AtomicBool, AtomicU32, AtomicU64, Ordering};
#[cfg(loom)]
pub(super) use model::Queue;

#[cfg(loom)]
mod model {
    use std::collections::VecDeque;
    use std::fmt;

    use loom::sync::atomic::{AtomicUsize, Ordering};
    use loom::sync::Mutex;

    /// A bounded queue with `ArrayQueue`'s interface and the orderings of its `head` and `tail`
    /// (module doc).
    pub struct Queue<T> {
        /// The messages, oldest first; at most `capacity`.
        items: Mutex<VecDeque<T>>,
        /// Messages pushed so far (wrapping). Written under `items`, read without it.
        tail: AtomicUsize,
        /// Messages popped so far (wrapping). Written under `items`, read without it.
        head: AtomicUsize,
        capacity: usize,
    }

    impl<T> Queue<T> {
        pub fn new(capacity: usize) -> Queue<T> {
            assert!(capacity > 0, "capacity must be non-zero");
            Queue {
                items: Mutex::new(VecDeque::with_capacity(capacity)),
                tail: AtomicUsize::new(0),
                head: AtomicUsize::new(0),
                capacity,
            }
        }

        pub fn push(&self, value: T) -> Result<(), T> {
            let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
            if items.len() == self.capacity {
                return Err(value);
            }
            items.push_back(value);
            self.tail.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }

        pub fn pop(&self) -> Option<T> {
            let mut items = self.items.lock().unwrap_or_else(|e| e.into_inner());
            let value = items.pop_front()?;
            self.head.fetch_add(1, Ordering::SeqCst);
            Some(value)
        }

        pub fn len(&self) -> usize {
            let head = self.head.load(Ordering::SeqCst);
            let tail = self.tail.load(Ordering::SeqCst);
            tail.wrapping_sub(head).min(self.capacity)
        }

        pub fn is_empty(&self) -> bool {
            let head = self.head.load(Ordering::SeqCst);
            let tail = self.tail.load(Ordering::SeqCst);
            tail == head
        }

        pub fn capacity(&self) -> usize {
            self.capacity
        }
    }

    impl<T> fmt::Debug for Queue<T> {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.debug_struct("Queue").field("capacity", &self.capacity).finish_non_exhaustive()
        }
    }
}
