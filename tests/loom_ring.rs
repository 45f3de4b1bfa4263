//! Model check of the ring's wake-up protocol (`src/ring`) under loom: every interleaving, and
//! every value each relaxed load may return under the C11 model as loom implements it, of
//! producers and a consumer that parks whenever the ring lets it.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release --test loom_ring` (`.ci/run` does, in
//! its own target directory). Without `--cfg loom` this file is empty.
//!
//! The property: **a message pushed is never left in the ring while the consumer sleeps for
//! good.** The consumer pops everything, then announces sleep (`prepare_sleep`) and parks
//! until a producer's wake unparks it; it stops once it has every message. A lost wake-up is
//! an execution where it parks with no unpark coming: every other thread has finished, and
//! loom fails the model with a deadlock. Every message must also arrive exactly once.
//!
//! What is checked and what is not: the ring's own atomics (`sleeping`) and its `SeqCst`
//! fences are loom's; crossbeam's `ArrayQueue` is replaced by the stand-in of
//! `src/ring/sync.rs`, whose `head`/`tail` accesses have crossbeam's orderings but whose slots
//! are a loom `Mutex<VecDeque>`: the model checks the protocol around the queue, not
//! crossbeam's queue. The waker is loom's `Notify`, whose token outlives a notification that
//! comes before the wait, as `Thread::unpark`'s and mio's `Waker`'s (an eventfd) do; that
//! property of the real wakers is assumed, not checked. loom also does not explore load buffering (see its README),
//! which this protocol does not rely on.
#![cfg(loom)]

use loom::sync::{Arc, Notify};
use loom::thread;
use warmpath::ring::{Ring, Wake};

/// The consumer's waker: loom's park/unpark token. A notification that comes before the wait
/// is kept for it, and loom also explores spurious wake-ups.
struct Unpark(Notify);

impl Wake for Unpark {
    fn wake(&self) {
        self.0.notify();
    }
}

/// How a producer sends its messages.
#[derive(Clone, Copy, Debug)]
enum Sending {
    /// [`Ring::push`] per message.
    Push,
    /// [`Ring::push_quiet`] per message, then one [`Ring::wake_if_sleeping`] for the batch.
    Batch,
}

/// A model with at most 4 preemptions per execution unless `LOOM_MAX_PREEMPTIONS` says
/// otherwise: the protocol's races need one or two (a producer preempted between its push and
/// its read of `sleeping`, the consumer between its store and its re-check; each broken
/// variant tried fails at 3), and 4 keeps the six models to about 30 s on one core. Unbounded,
/// the two-producer models run for more than 5 minutes each.
fn model(f: impl Fn() + Sync + Send + 'static) {
    let mut builder = loom::model::Builder::new();
    if builder.preemption_bound.is_none() {
        builder.preemption_bound = Some(4);
    }
    builder.check(f);
}

/// Runs `producers` producer threads, producer `p` sending `per_producer` messages numbered
/// `p * per_producer ..` in `mode`, through a ring of `capacity`, to a consumer on the model's
/// main thread that parks whenever `prepare_sleep` allows. Returns when the consumer has every
/// message (a lost wake-up never returns: loom reports the deadlock).
fn run(producers: usize, per_producer: usize, capacity: usize, mode: Sending) {
    let ring = Arc::new(Ring::new(capacity, Unpark(Notify::new())));
    let handles: Vec<_> = (0..producers)
        .map(|p| {
            let ring = Arc::clone(&ring);
            thread::spawn(move || produce(&ring, p, per_producer, mode))
        })
        .collect();
    let total = producers * per_producer;
    let mut seen = vec![false; total];
    let mut received = 0;
    loop {
        while let Some(message) = ring.pop() {
            assert!(!seen[message], "message {message} arrived twice");
            seen[message] = true;
            received += 1;
        }
        if received == total {
            break;
        }
        if ring.prepare_sleep() {
            ring.waker().0.wait();
        }
        ring.woke();
    }
    for handle in handles {
        handle.join().expect("a producer panicked");
    }
    assert!(ring.is_empty(), "nothing is left in the ring");
}

/// Producer `p`'s messages; a full ring is retried after a yield, as the shards back off.
fn produce(ring: &Ring<usize, Unpark>, p: usize, count: usize, mode: Sending) {
    for i in 0..count {
        let mut message = p * count + i;
        loop {
            let sent = match mode {
                Sending::Push => ring.push(message),
                Sending::Batch => ring.push_quiet(message),
            };
            match sent {
                Ok(()) => break,
                Err(back) => {
                    message = back;
                    // A full ring: the consumer must get to run (and the batch be announced,
                    // or a sleeping consumer would never drain it).
                    if let Sending::Batch = mode {
                        ring.wake_if_sleeping();
                    }
                    thread::yield_now();
                }
            }
        }
    }
    if let Sending::Batch = mode {
        ring.wake_if_sleeping();
    }
}

#[test]
fn one_producer_push() {
    model(|| run(1, 2, 4, Sending::Push));
}

#[test]
fn one_producer_push_quiet_then_wake() {
    model(|| run(1, 2, 4, Sending::Batch));
}

#[test]
fn two_producers_push() {
    model(|| run(2, 1, 4, Sending::Push));
}

#[test]
fn two_producers_push_quiet_then_wake() {
    model(|| run(2, 1, 4, Sending::Batch));
}

/// A ring of one slot: producers find it full and retry while the consumer drains and sleeps.
#[test]
fn two_producers_through_a_full_ring() {
    model(|| run(2, 1, 1, Sending::Push));
}

/// The same with batched wake-ups.
#[test]
fn two_producers_batching_through_a_full_ring() {
    model(|| run(2, 1, 1, Sending::Batch));
}
