//! Benchmarks of the hierarchical timer wheel (`warmpath::wheel`).
//!
//! Dimensions: ticks are nanoseconds, resolution 2^20 ns (about 1 ms), about 10,000 live timers
//! with deadlines spread uniformly over 0–30 s ahead (a shard's connection timeouts, a
//! model's grace windows), `T = u64`. Deadlines come from 64 Ki pregenerated splitmix64 draws.
//! - `insert_cancel/same`: insert a timer and cancel it at once (the entry stays hot);
//! - `insert_cancel/oldest`: insert a timer and cancel the one inserted 10,000 earlier (cold
//!   entries, like a timeout cancelled long after it was armed);
//! - `insert_expire`: steady state: insert one timer, advance `now` by 1.5 ms (so that as many
//!   expire as arrive: 10,000 live timers over a mean life of 15 s) and poll;
//! - `poll_idle`: poll at an unchanged `now` with nothing due;
//! - `next_fire/steady`: in the `insert_expire` steady state;
//! - `next_fire/in_order_far`: 10,000 timers 29–30 s ahead inserted in deadline order (one
//!   sorted level-2 slot: the head is the earliest);
//! - `next_fire/shuffled_far`: the same deadlines inserted in random order (the slot is
//!   unsorted and scanned: the worst case).
//!
//! Baseline in the same run: a `BTreeMap<(deadline, id), u64>` doing the same work (`baseline_*`).

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use std::collections::BTreeMap;
use std::hint::black_box;
use warmpath::splitmix::SplitMix64;
use warmpath::wheel::{TimerKey, TimerWheel};

const RESOLUTION: u64 = 1 << 20;
const LIVE: usize = 10_000;
const SECOND: u64 = 1_000_000_000;
const SPREAD: u64 = 30 * SECOND;
const STEP: u64 = SPREAD / 2 / LIVE as u64;
const DRAWS: usize = 1 << 16;

/// Offsets uniform in `0..spread`.
fn offsets(seed: u64, spread: u64) -> Vec<u64> {
    let mut rng = SplitMix64::new(seed);
    (0..DRAWS).map(|_| rng.next_u64() % spread).collect()
}

/// A wheel at time 0 holding `LIVE` timers spread over `SPREAD`, room for twice as many.
fn loaded(offsets: &[u64]) -> TimerWheel<u64> {
    let mut wheel = TimerWheel::new(2 * LIVE, RESOLUTION, 0);
    for (i, &offset) in offsets.iter().take(LIVE).enumerate() {
        wheel.insert(offset, i as u64);
    }
    wheel
}

fn insert_cancel(c: &mut Criterion) {
    let offsets = offsets(1, SPREAD);
    let mut group = c.benchmark_group("wheel/insert_cancel");
    let mut wheel = loaded(&offsets);
    let mut i = 0;
    group.bench_function("same", |b| {
        b.iter(|| {
            i += 1;
            let key = wheel.insert(black_box(offsets[i % DRAWS]), i as u64);
            wheel.cancel(key)
        });
    });
    let mut wheel = TimerWheel::new(2 * LIVE, RESOLUTION, 0);
    let mut ring: Vec<TimerKey> = (0..LIVE).map(|i| wheel.insert(offsets[i], i as u64)).collect();
    group.bench_function("oldest", |b| {
        b.iter(|| {
            i += 1;
            let slot = i % LIVE;
            let value = wheel.cancel(ring[slot]);
            ring[slot] = wheel.insert(black_box(offsets[i % DRAWS]), i as u64);
            value
        });
    });
    let mut tree = BTreeMap::new();
    for (n, &offset) in offsets.iter().take(LIVE).enumerate() {
        tree.insert((offset, n as u64), n as u64);
    }
    let mut ring: Vec<(u64, u64)> = tree.keys().copied().collect();
    group.bench_function("baseline_oldest", |b| {
        b.iter(|| {
            i += 1;
            let slot = i % LIVE;
            let value = tree.remove(&ring[slot]);
            ring[slot] = (black_box(offsets[i % DRAWS]), i as u64 + LIVE as u64);
            tree.insert(ring[slot], i as u64);
            value
        });
    });
    group.finish();
}

fn insert_expire(c: &mut Criterion) {
    let offsets = offsets(2, SPREAD);
    let mut group = c.benchmark_group("wheel/insert_expire");
    let mut wheel = loaded(&offsets);
    let (mut now, mut i, mut out) = (0, 0, Vec::with_capacity(LIVE));
    group.bench_function("wheel", |b| {
        b.iter(|| {
            i += 1;
            wheel.insert(now + offsets[i % DRAWS], i as u64);
            now += STEP;
            out.clear();
            wheel.poll(black_box(now), &mut out);
            out.len()
        });
    });
    let mut tree = BTreeMap::new();
    for (n, &offset) in offsets.iter().take(LIVE).enumerate() {
        tree.insert((offset, n as u64), n as u64);
    }
    let mut now = 0;
    group.bench_function("baseline", |b| {
        b.iter(|| {
            i += 1;
            tree.insert((now + offsets[i % DRAWS], i as u64 + LIVE as u64), i as u64);
            now += STEP;
            out.clear();
            while let Some(entry) = tree.first_entry() {
                if entry.key().0 > black_box(now) {
                    break;
                }
                let ((deadline, _), value) = entry.remove_entry();
                out.push((deadline, value));
            }
            out.len()
        });
    });
    group.finish();
}

fn idle(c: &mut Criterion) {
    let offsets = offsets(3, SPREAD);
    let mut group = c.benchmark_group("wheel");
    let mut wheel = loaded(&offsets);
    let mut out = Vec::with_capacity(LIVE);
    let mut now = 0;
    for _ in 0..LIVE {
        wheel.insert(now + offsets[now as usize % DRAWS], 0);
        now += STEP;
        out.clear();
        wheel.poll(now, &mut out);
    }
    group.bench_function("poll_idle", |b| {
        b.iter(|| {
            wheel.poll(black_box(now), &mut out);
            out.len()
        });
    });
    group.bench_with_input(BenchmarkId::new("next_fire", "steady"), &(), |b, _| {
        b.iter(|| black_box(&wheel).next_fire());
    });
    let far: Vec<u64> =
        (0..LIVE as u64).map(|n| 29 * SECOND + n * (SECOND / LIVE as u64)).collect();
    let mut shuffled = far.clone();
    let mut rng = SplitMix64::new(4);
    for n in (1..shuffled.len()).rev() {
        shuffled.swap(n, rng.next_u64() as usize % (n + 1));
    }
    for (name, deadlines) in [("in_order_far", &far), ("shuffled_far", &shuffled)] {
        let mut wheel = TimerWheel::new(LIVE, RESOLUTION, 0);
        for &deadline in deadlines {
            wheel.insert(deadline, 0);
        }
        group.bench_with_input(BenchmarkId::new("next_fire", name), &(), |b, _| {
            b.iter(|| black_box(&wheel).next_fire());
        });
    }
    group.finish();
}

criterion_group!(benches, insert_cancel, insert_expire, idle);
criterion_main!(benches);
