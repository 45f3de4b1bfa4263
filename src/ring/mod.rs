//! Bounded MPSC rings between threads, with a wake-up protocol that costs no syscall while the
//! consumer is awake.
//!
//! A [`Ring`] carries messages from any number of producers (the shards, or the model
//! schedulers) to one consumer (a scheduler thread, or a shard). The queue is crossbeam's
//! `ArrayQueue`, a bounded lock-free ring after Vyukov's bounded MPMC queue: one preallocated
//! buffer, one compare-and-swap per push or pop, no allocation after construction.
//!
//! Waking: a consumer about to block announces it with [`Ring::prepare_sleep`], which sets
//! `sleeping` and then looks at the queue once more; a producer pushes and then reads
//! `sleeping`, calling the consumer's [`Wake`] only when it is set. Both sides put a `SeqCst`
//! fence between their write and their read (the store-buffering pattern of Dekker's
//! algorithm), so at least one of them sees the other: either the consumer finds the message,
//! or the producer finds the flag and wakes it. A wake that arrives before the consumer blocks
//! is not lost either: thread park tokens and mio's `Waker` both stay set until consumed.
//! [`ThreadWaker`] wakes a consumer thread that registered itself; [`InboxWaker`] wakes the
//! consumer of a model's inbox, whichever of the two kinds it is.
//!
//! Beside the rings, [`prompt_pool`]: the other hand-off between the shards and a model's
//! scheduler, for a prompt's block hashes, which are too long for a ring's fixed-size message.
//!
//! Model check: the ring's atomics, its fences and its queue come from `sync`, which swaps
//! them for loom's under `cfg(loom)`; `tests/loom_ring.rs` explores every interleaving of one
//! or two producers (`push`, or `push_quiet` then `wake_if_sleeping`) against a consumer that
//! parks whenever [`Ring::prepare_sleep`] lets it, and fails if the consumer can park for good
//! with a message in the ring. `sync`'s module doc says what the queue's stand-in models.

pub mod free_list;
pub mod prompt_pool;
pub mod segments;
mod sync;

use std::sync::{Arc, OnceLock};
use std::thread::Thread;

use sync::{fence, AtomicBool, Ordering, Queue};

/// How a producer wakes a ring's consumer: `Thread::unpark` for a scheduler thread, a mio
/// `Waker` for a shard's event loop.
pub trait Wake: Send + Sync {
    /// Wakes the consumer, or makes its next block return at once.
    fn wake(&self);
}

impl Wake for std::thread::Thread {
    fn wake(&self) {
        self.unpark();
    }
}

impl<W: Wake + ?Sized> Wake for Arc<W> {
    fn wake(&self) {
        (**self).wake();
    }
}

impl Wake for mio::Waker {
    /// Writes the event loop's eventfd. It fails only when the counter would overflow, which
    /// means the loop has wakes pending already, so the error is nothing to act on.
    fn wake(&self) {
        let _ = mio::Waker::wake(self);
    }
}

/// Wakes the thread that registered as a ring's consumer (before it registers, it has not slept
/// yet, so there is nothing to wake).
#[derive(Debug, Default)]
pub struct ThreadWaker(OnceLock<Thread>);

impl ThreadWaker {
    /// Makes the calling thread the one to wake; the first registration stays.
    pub fn register(&self) {
        self.0.get_or_init(std::thread::current);
    }
}

impl Wake for ThreadWaker {
    fn wake(&self) {
        if let Some(thread) = self.0.get() {
            thread.unpark();
        }
    }
}

/// Wakes whatever drives a model's scheduler, the consumer of its inbox (the dataplane's
/// `server::host::Inbox`): a thread of its own (the tests' drivers), or a shard's event loop.
#[derive(Debug)]
pub enum InboxWaker {
    /// A thread that consumes the inbox itself (the tests' drivers of a host or of the
    /// control thread's inbox), once it registered.
    Thread(ThreadWaker),
    /// A shard's mio `Poll` (one `Waker` per `Poll`, shared with the shard's own ring).
    Loop(Arc<mio::Waker>),
}

impl Default for InboxWaker {
    fn default() -> Self {
        InboxWaker::Thread(ThreadWaker::default())
    }
}

impl Wake for InboxWaker {
    fn wake(&self) {
        match self {
            InboxWaker::Thread(thread) => thread.wake(),
            InboxWaker::Loop(waker) => waker.wake(),
        }
    }
}

/// A bounded multi-producer, single-consumer ring with a sleeping consumer's wake-up.
#[derive(Debug)]
pub struct Ring<T, W> {
    queue: Queue<T>,
    /// Set by the consumer between [`Ring::prepare_sleep`] and [`Ring::woke`].
    sleeping: AtomicBool,
    waker: W,
}

impl<T, W: Wake> Ring<T, W> {
    /// A ring of `capacity` messages whose consumer is woken through `waker`.
    pub fn new(capacity: usize, waker: W) -> Ring<T, W> {
        Ring { queue: Queue::new(capacity), sleeping: AtomicBool::new(false), waker }
    }

    /// Sends `message`; gives it back when the ring is full (the caller applies backpressure).
    pub fn push(&self, message: T) -> Result<(), T> {
        self.push_quiet(message)?;
        self.wake_if_sleeping();
        Ok(())
    }

    /// Sends `message` without waking the consumer: a producer that sends a batch calls
    /// [`Ring::wake_if_sleeping`] once after it, which must happen (the consumer may be asleep
    /// with the message waiting until then).
    pub fn push_quiet(&self, message: T) -> Result<(), T> {
        self.queue.push(message)
    }

    /// Wakes the consumer if it announced sleep: the second half of [`Ring::push`].
    pub fn wake_if_sleeping(&self) {
        // SeqCst fence: the pushes before are ordered before the read of `sleeping` below,
        // pairing with the fence in `prepare_sleep` (store `sleeping`, fence, read the queue).
        fence(Ordering::SeqCst);
        if self.sleeping.load(Ordering::Relaxed) {
            self.waker.wake();
        }
    }

    /// Takes the oldest message. Only the consumer calls this.
    pub fn pop(&self) -> Option<T> {
        self.queue.pop()
    }

    /// Messages waiting.
    pub fn len(&self) -> usize {
        self.queue.len()
    }

    /// Whether no message waits.
    pub fn is_empty(&self) -> bool {
        self.queue.is_empty()
    }

    /// The ring's capacity.
    pub fn capacity(&self) -> usize {
        self.queue.capacity()
    }

    /// The consumer announces it is about to block. Returns `false` when a message is already
    /// waiting: the consumer must then not block (and should call [`Ring::woke`]).
    pub fn prepare_sleep(&self) -> bool {
        self.sleeping.store(true, Ordering::Relaxed);
        // SeqCst fence: the store above is ordered before the read of the queue below, pairing
        // with the fence in `push`.
        fence(Ordering::SeqCst);
        self.queue.is_empty()
    }

    /// The consumer is awake again: producers stop waking it.
    pub fn woke(&self) {
        self.sleeping.store(false, Ordering::Relaxed);
    }

    /// The consumer's waker.
    pub fn waker(&self) -> &W {
        &self.waker
    }

    /// Wakes the consumer whether or not a message is waiting (to stop it, for example).
    pub fn wake(&self) {
        self.waker.wake();
    }
}

// Under `cfg(loom)` the ring's atomics exist only inside `loom::model`: these tests run
// without it (`tests/loom_ring.rs` is the loom run).
#[cfg(all(test, not(loom)))]
mod tests {
    use std::sync::atomic::AtomicUsize;
    use std::sync::Arc;
    use std::time::Duration;

    use super::*;

    struct Count(AtomicUsize);

    impl Wake for Count {
        fn wake(&self) {
            self.0.fetch_add(1, Ordering::Relaxed);
        }
    }

    #[test]
    fn full_ring_gives_the_message_back() {
        let ring = Ring::new(2, Count(AtomicUsize::new(0)));
        assert_eq!(ring.push(1), Ok(()));
        assert_eq!(ring.push(2), Ok(()));
        assert_eq!(ring.push(3), Err(3));
        assert_eq!(ring.pop(), Some(1));
        assert_eq!(ring.push(3), Ok(()));
        assert_eq!((ring.pop(), ring.pop(), ring.pop()), (Some(2), Some(3), None));
    }

    #[test]
    fn wakes_only_a_sleeping_consumer() {
        let ring = Ring::new(8, Count(AtomicUsize::new(0)));
        ring.push(1).unwrap();
        assert_eq!(ring.waker.0.load(Ordering::Relaxed), 0, "awake consumer: no wake");
        assert!(!ring.prepare_sleep(), "a message waits: do not block");
        ring.woke();
        ring.pop();
        assert!(ring.prepare_sleep());
        ring.push(2).unwrap();
        assert_eq!(ring.waker.0.load(Ordering::Relaxed), 1, "sleeping consumer: woken");
        ring.woke();
    }

    /// Producers on other threads and a consumer that parks whenever the ring is empty: every
    /// message arrives and the consumer never sleeps through one (a lost wake-up would hang
    /// this test until its park timeout, which is long, and the count would come up short).
    #[test]
    fn no_lost_wake_ups_under_contention() {
        const PRODUCERS: usize = 3;
        const EACH: usize = 20_000;
        let ring = Arc::new(Ring::new(64, std::thread::current()));
        let producers: Vec<_> = (0..PRODUCERS)
            .map(|p| {
                let ring = Arc::clone(&ring);
                std::thread::spawn(move || {
                    for i in 0..EACH {
                        let mut message = p * EACH + i;
                        while let Err(back) = ring.push(message) {
                            message = back;
                            std::thread::yield_now();
                        }
                    }
                })
            })
            .collect();
        let mut seen = vec![false; PRODUCERS * EACH];
        let mut received = 0;
        let mut long_parks = 0;
        while received < PRODUCERS * EACH {
            while let Some(message) = ring.pop() {
                assert!(!seen[message], "message {message} twice");
                seen[message] = true;
                received += 1;
            }
            if received < PRODUCERS * EACH && ring.prepare_sleep() {
                let parked = crate::clock::Clock::real();
                let before = parked.now();
                std::thread::park_timeout(Duration::from_secs(2));
                if parked.rate().duration(parked.now() - before) >= Duration::from_secs(2) {
                    long_parks += 1;
                }
            }
            ring.woke();
        }
        for producer in producers {
            producer.join().unwrap();
        }
        assert_eq!(long_parks, 0, "the consumer slept through a message");
    }
}
