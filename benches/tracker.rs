//! Benchmarks of the CLOCK session tracker (`warmpath::scheduler::tracker`).
//!
//! Dimensions:
//! - capacity: 4,096 (fits in L2) and 1,000,000 (a large fleet's `max_sessions`; misses cache);
//! - `complete`: on a full tracker, session ids drawn uniformly from a universe of twice the
//!   capacity, so about half the calls update a held session and half insert a new one,
//!   evicting by CLOCK;
//! - `lookup_hit` / `lookup_miss`: sessions known to be held / never completed;
//! - baseline `hashmap_lookup_hit`: the same hits in a plain hashbrown `HashMap<u64, Completion>`
//!   (no eviction), the floor for any hashed index.
//!
//! Sessions come from a seeded splitmix64 sequence; each benchmark cycles through 64 Ki
//! pregenerated ids so that the generator is not measured.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::hint::black_box;
use warmpath::scheduler::tracker::{Completion, SessionTracker};
use warmpath::splitmix::{mix, SplitMix64};

const CAPACITIES: [usize; 2] = [4_096, 1_000_000];
const IDS: usize = 1 << 16;

/// The session id of the `n`th member of the universe: a hash, like a real session id.
fn session(n: u64) -> u64 {
    mix(n)
}

/// A full tracker holding sessions `0..capacity` of the universe.
fn full(capacity: usize) -> SessionTracker {
    let mut t = SessionTracker::with_capacity(capacity);
    for n in 0..capacity as u64 {
        t.complete(session(n), n, (n % 8) as u16);
    }
    t
}

fn ids(seed: u64, universe: u64) -> Vec<u64> {
    let mut rng = SplitMix64::new(seed);
    (0..IDS).map(|_| session(rng.next_u64() % universe)).collect()
}

fn complete(c: &mut Criterion) {
    let mut group = c.benchmark_group("tracker/complete");
    for capacity in CAPACITIES {
        let mut t = full(capacity);
        let ids = ids(1, 2 * capacity as u64);
        group.bench_with_input(BenchmarkId::from_parameter(capacity), &capacity, |b, _| {
            let mut i = 0;
            b.iter(|| {
                let id = ids[i % IDS];
                t.complete(black_box(id), i as u64, 3);
                i += 1;
            });
        });
    }
    group.finish();
}

fn lookup(c: &mut Criterion) {
    let mut group = c.benchmark_group("tracker/lookup");
    for capacity in CAPACITIES {
        let t = full(capacity);
        let hits = ids(2, capacity as u64);
        let misses = ids(3, u64::MAX); // members far past `capacity`: never completed
        let mut map = hashbrown::HashMap::with_capacity(capacity);
        for n in 0..capacity as u64 {
            map.insert(session(n), Completion { at: n, backend: 0, turns: 1 });
        }
        let cases: [(&str, &Vec<u64>); 2] = [("hit", &hits), ("miss", &misses)];
        for (name, ids) in cases {
            group.bench_with_input(BenchmarkId::new(name, capacity), &capacity, |b, _| {
                let mut i = 0;
                b.iter(|| {
                    i += 1;
                    t.lookup(black_box(ids[i % IDS]))
                });
            });
        }
        group.bench_with_input(BenchmarkId::new("hashmap_hit", capacity), &capacity, |b, _| {
            let mut i = 0;
            b.iter(|| {
                i += 1;
                map.get(&black_box(hits[i % IDS])).copied()
            });
        });
    }
    group.finish();
}

criterion_group!(benches, complete, lookup);
criterion_main!(benches);
