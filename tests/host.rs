//! A model's [`Host`] across real threads, rings and the real clock: shard threads send
//! arrivals and completions, decisions come back on each request's own shard ring (through the
//! host's backlog when a ring is full), every request is admitted exactly once, and a queue
//! deadline fires with no traffic to trigger it. `warmpath serve` drives each host inside a
//! shard's event loop; here a thread of the test's own drives it, so that the host's ring
//! protocol is exercised with its consumer and producers on different threads.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::Duration;

use warmpath::clock::Clock;
use warmpath::ring::{InboxWaker, Ring, ThreadWaker};
use warmpath::scheduler::{
    Arrival, Budget, Input, Output, Params, RejectReason, RequestId, Routing, Scheduler, Usage,
};
use warmpath::server::host::{Host, Inbox};

type ShardRing = Ring<Output, ThreadWaker>;

fn params(timeout: Option<u64>) -> Params {
    Params {
        boost: true,
        routing: Routing::SessionAffinity,
        backends: 2,
        queue_timeout: timeout,
        max_queued: 100_000,
        inflight_per_backend: 4,
        inflight_learned: false,
        prefill_tokens_per_backend: Budget::Tokens(0),
        max_sessions: 64,
        max_overtakes: 4,
        boosted_streak_max: 0,
        grace_period: 0,
        max_retries: 1,
        eject_after_failures: 0,
        metrics_stale_after: u64::MAX / 4,
        timer_resolution: 1 << 20,
        prefix: warmpath::scheduler::PrefixParams::DEFAULT,
        tenant_weights: Vec::new(),
    }
}

/// A host on a thread of its own: passes until a pass handles nothing, then parks until a
/// message, the scheduler's next timer or (while decisions wait for a full shard ring) a short
/// retry.
#[derive(Debug)]
struct HostThread {
    inbox: Arc<Inbox>,
    stop: Arc<AtomicBool>,
    join: JoinHandle<Scheduler>,
}

impl HostThread {
    fn spawn(host: Host<ThreadWaker>) -> HostThread {
        let inbox = Arc::clone(host.inbox());
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let join = std::thread::spawn(move || drive(host, &flag));
        HostThread { inbox, stop, join }
    }

    fn inbox(&self) -> &Arc<Inbox> {
        &self.inbox
    }

    /// Stops the thread once its inbox is drained and every decision delivered.
    fn stop(self) -> Scheduler {
        self.stop.store(true, Ordering::Release);
        self.inbox.wake();
        self.join.join().expect("the host's thread panicked")
    }
}

fn drive(mut host: Host<ThreadWaker>, stop: &AtomicBool) -> Scheduler {
    const RETRY: Duration = Duration::from_micros(50);
    let clock = Clock::real();
    if let InboxWaker::Thread(waker) = host.inbox().waker() {
        waker.register();
    }
    loop {
        let handled = host.pass(clock.now(), None);
        let backlogged = host.backlogged();
        if stop.load(Ordering::Acquire) && host.inbox().is_empty() && !backlogged {
            return host.into_scheduler();
        }
        if handled > 0 {
            continue;
        }
        let now = clock.now();
        let timer = host.next_wakeup().map(|at| clock.rate().duration(at.saturating_sub(now)));
        let timeout = if backlogged { Some(timer.map_or(RETRY, |t| t.min(RETRY))) } else { timer };
        let inbox = Arc::clone(host.inbox());
        if inbox.prepare_sleep() && !stop.load(Ordering::Acquire) {
            match timeout {
                Some(timeout) if timeout.is_zero() => {}
                Some(timeout) => std::thread::park_timeout(timeout),
                None => std::thread::park(),
            }
        }
        inbox.woke();
    }
}

fn start(params: Params, shards: u16, ring_capacity: usize) -> (HostThread, Vec<Arc<ShardRing>>) {
    let rings: Vec<Arc<ShardRing>> =
        (0..shards).map(|_| Arc::new(Ring::new(ring_capacity, ThreadWaker::default()))).collect();
    let scheduler = Scheduler::new(params, Clock::real().now());
    let inbox = Arc::new(Ring::new(1024, InboxWaker::default()));
    (HostThread::spawn(Host::new(scheduler, inbox, rings.clone())), rings)
}

/// Pushes `input`, waiting while the inbox is full.
fn send(thread: &HostThread, mut input: Input) {
    while let Err(back) = thread.inbox().push(input) {
        input = back;
        std::thread::yield_now();
    }
}

/// Waits on `ring` for its next decision, up to `limit`.
fn next(ring: &ShardRing, limit: Duration) -> Option<Output> {
    let clock = Clock::real();
    let start = clock.now();
    loop {
        if let Some(output) = ring.pop() {
            ring.woke();
            return Some(output);
        }
        if clock.rate().duration(clock.now() - start) > limit {
            return None;
        }
        if ring.prepare_sleep() {
            std::thread::park_timeout(Duration::from_millis(50));
        }
        ring.woke();
    }
}

/// A shard: sends `count` requests and completes each as soon as it is admitted.
fn shard(index: u16, count: u64, thread: Arc<HostThread>, ring: Arc<ShardRing>) -> u64 {
    ring.waker().register();
    let mut admitted = vec![false; count as usize];
    let (mut sent, mut done) = (0, 0);
    while done < count {
        if sent < count {
            let id = RequestId::new(index, sent);
            let session = (sent % 3 != 0).then_some(sent % 16 + 100 * u64::from(index));
            let arrival = Arrival {
                id,
                session,
                prompt_bytes: 40,
                streaming: false,
                prompt: warmpath::ring::prompt_pool::NO_PROMPT,
                tenant: 0,
            };
            send(&thread, Input::Arrive(arrival));
            sent += 1;
            while let Some(output) = ring.pop() {
                done += complete(&thread, &mut admitted, index, output);
            }
        } else if let Some(output) = next(&ring, Duration::from_secs(10)) {
            done += complete(&thread, &mut admitted, index, output);
        } else {
            panic!("shard {index}: no decision for 10 s with {} outstanding", count - done);
        }
    }
    done
}

fn complete(thread: &HostThread, admitted: &mut [bool], index: u16, output: Output) -> u64 {
    let Output::Admit { id, .. } = output else { panic!("unexpected {output:?}") };
    assert_eq!(id.shard(), index, "decision sent to the wrong shard");
    let serial = (id.0 & ((1 << 48) - 1)) as usize;
    assert!(!admitted[serial], "{id:?} admitted twice");
    admitted[serial] = true;
    send(thread, Input::Complete { id, success: true, usage: Usage::NONE });
    1
}

#[test]
fn shards_and_a_host_on_its_own_thread_settle_every_request() {
    const SHARDS: u16 = 2;
    const EACH: u64 = 5_000;
    // Small shard rings, so that decisions also go through the scheduler's backlog.
    let (thread, rings) = start(params(None), SHARDS, 4);
    let thread = Arc::new(thread);
    let workers: Vec<_> = (0..SHARDS)
        .map(|index| {
            let (thread, ring) = (Arc::clone(&thread), Arc::clone(&rings[usize::from(index)]));
            std::thread::spawn(move || shard(index, EACH, thread, ring))
        })
        .collect();
    let total: u64 = workers.into_iter().map(|worker| worker.join().unwrap()).sum();
    assert_eq!(total, u64::from(SHARDS) * EACH);
    let scheduler = Arc::try_unwrap(thread).expect("the shards are done").stop();
    scheduler.check_invariants();
    assert_eq!((scheduler.queued(), scheduler.inflight()), (0, 0));
    assert_eq!(scheduler.stats().admitted.iter().sum::<u64>(), u64::from(SHARDS) * EACH);
}

#[test]
fn a_queue_deadline_fires_without_traffic() {
    let rate = Clock::real().rate();
    let (thread, rings) = start(params(Some(rate.ticks(Duration::from_millis(30)))), 1, 16);
    rings[0].waker().register();
    let arrive = |serial| {
        let id = RequestId::new(0, serial);
        Input::Arrive(Arrival {
            id,
            session: None,
            prompt_bytes: 0,
            streaming: false,
            prompt: warmpath::ring::prompt_pool::NO_PROMPT,
            tenant: 0,
        })
    };
    for serial in 0..9 {
        send(&thread, arrive(serial));
    }
    // 8 slots (2 backends x 4): 8 admissions; the ninth waits for its deadline, and nothing else
    // is sent: the host's thread must wake for the timer by itself.
    for _ in 0..8 {
        let output = next(&rings[0], Duration::from_secs(10)).expect("an admission");
        assert!(matches!(output, Output::Admit { .. }), "{output:?}");
    }
    let late = next(&rings[0], Duration::from_secs(10)).expect("the deadline fired");
    let expected = Output::Reject { id: RequestId::new(0, 8), reason: RejectReason::QueueTimeout };
    assert_eq!(late, expected);
    let scheduler = thread.stop();
    assert_eq!(scheduler.stats().timeouts, 1);
    assert_eq!(scheduler.inflight(), 8);
}
