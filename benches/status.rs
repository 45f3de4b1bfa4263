//! The status page (issue [10], item 4; target: rendered in under 100 ms of server time with
//! 10,000 queued requests and 64 backends).
//!
//! Dimensions:
//! - `status/render/64x10000`: `server::status::render_generation`, the whole of `GET /status`
//!   but the socket: `/debug/queue`'s and `/debug/backends'` documents built from the reports
//!   and the page rendered from them. One model with 64 backends (4 slots each, all busy) and
//!   10,000 queued requests (half follow-ups of tracked sessions in the boosted lane, half
//!   first turns in the normal lane), a real `Generation` built from a configuration and its
//!   model's `Report` taken from a real `Scheduler` in that state.
//! - `status/oldest_waiting/10000`: `Scheduler::oldest_waiting(10)` at that depth, the part of
//!   the host's report copy that the page added (it runs after every scheduler pass that
//!   changed something).

use std::hint::black_box;
use std::sync::Arc;

use criterion::{criterion_group, criterion_main, Criterion};
use warmpath::clock::Clock;
use warmpath::config::Config;
use warmpath::ring::prompt_pool::NO_PROMPT;
use warmpath::ring::Ring;
use warmpath::scheduler::{Arrival, Input, RequestId, Scheduler, Usage};
use warmpath::server::generation::Generation;
use warmpath::server::report::Report;
use warmpath::server::status::render_generation;

const BACKENDS: usize = 64;
const SLOTS: usize = 4;
const QUEUED: u64 = 10_000;

/// One model, 64 backends, session-affinity routing (so follow-ups are boosted without
/// prompt hashes), room for the queue.
fn config() -> Config {
    let backends: Vec<String> =
        (0..BACKENDS).map(|i| format!("\"10.0.{}.{}:8000\"", i / 200, i % 200 + 1)).collect();
    let text = format!(
        "[queue]\nmax_queued = 20000\ninflight_per_backend = {SLOTS}\n\n\
         [[model]]\nname = \"llama-3-8b\"\nrouting = \"session-affinity\"\nbackends = [{}]\n",
        backends.join(", ")
    );
    Config::from_toml_str(&text).expect("a valid configuration")
}

/// Every slot busy, `QUEUED` requests waiting.
fn scheduler(generation: &Generation, clock: &Clock) -> Scheduler {
    let start = clock.now();
    let mut s = Scheduler::new(generation.params(0, clock.rate()), start);
    let mut out = Vec::new();
    let mut id = 0;
    let mut arrive = |s: &mut Scheduler, session: Option<u64>, out: &mut Vec<_>| {
        id += 1;
        let arrival = Arrival {
            id: RequestId(id),
            session,
            prompt_bytes: 4000,
            streaming: true,
            prompt: NO_PROMPT,
            tenant: 0,
        };
        s.handle(start + id, Input::Arrive(arrival), out);
        id
    };
    let slots = (BACKENDS * SLOTS) as u64;
    for session in 0..slots {
        let id = arrive(&mut s, Some(session), &mut out);
        let input = Input::Complete { id: RequestId(id), success: true, usage: Usage::NONE };
        s.handle(start + id, input, &mut out);
    }
    for _ in 0..slots {
        arrive(&mut s, None, &mut out);
    }
    for n in 0..QUEUED {
        arrive(&mut s, (n % 2 == 0).then_some(n % slots), &mut out);
    }
    assert_eq!(u64::from(s.queued()), QUEUED, "every slot busy, the rest queued");
    s
}

fn bench(c: &mut Criterion) {
    let clock = Clock::real();
    let poll = mio::Poll::new().expect("a poll");
    let waker = Arc::new(mio::Waker::new(poll.registry(), mio::Token(0)).expect("a waker"));
    let rings = vec![Arc::new(Ring::new(1024, waker))];
    let resolver = warmpath::control::prober::system_resolver;
    let (generation, _hosts) =
        Generation::build(1, config(), None, &clock, &rings, resolver).expect("a generation");
    let s = scheduler(&generation, &clock);
    let reports = vec![Report::of(&s)];
    let page = render_generation(&generation, &reports, clock.now(), clock.rate());
    assert!(page.len() > 10_000 && page.contains("10.0.0.64:8000"));
    eprintln!("status page: {} bytes", page.len());

    let mut group = c.benchmark_group("status");
    group.bench_function("render/64x10000", |b| {
        b.iter(|| render_generation(&generation, black_box(&reports), clock.now(), clock.rate()));
    });
    let mut out = Vec::with_capacity(10);
    group.bench_function("oldest_waiting/10000", |b| {
        b.iter(|| {
            s.oldest_waiting(10, &mut out);
            black_box(out.len())
        });
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
