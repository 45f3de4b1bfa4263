//! Benchmarks of S16's per-request work (issue [7]).
//!
//! Dimensions, on OpenAI chat bodies of about 1 KiB, 64 KiB and 512 KiB (the bodies of
//! `benches/protocol.rs`: user and assistant turns with escapes and non-ASCII text):
//! - `hash`: `find_model_and_prompt` with a hasher of 256-byte blocks, what a shard does per
//!   request of a `prefix-cost` model (the validating scan that finds the model, copying the
//!   prompt's strings as sent into blocks, xxh3 per block), against the baseline `find_model`,
//!   the same scan without the prompt, which every request pays; and `scan_body` with the
//!   hasher and the default `body:` session source (`prompt_cache_key`, issue [10]), what a
//!   shard runs per request of a `prefix-cost` model, and without the hasher, what it runs for
//!   other routings;
//! - `index`: per admission, the scheduler's work on one backend's index of 8,192 blocks: the
//!   binary-search `matched` of the prompt's chain (once cached, once not), `insert`, which
//!   touches every block of the chain (the dominant cost for long prompts), and `hot`, the
//!   second binary search a request with no home adds (its hot shared prefix).
//!
//! Throughput is in bytes of body, so the figures compare to each other across sizes.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use warmpath::protocol::{
    find_model, find_model_and_prompt, scan_body, BodyFields, FieldValue, PromptHasher,
};
use warmpath::scheduler::prefix::PrefixIndex;

#[path = "common/bodies.rs"]
mod bodies;
use bodies::chat_body;

const SIZES: [usize; 3] = [1 << 10, 64 << 10, 512 << 10];

fn hash(c: &mut Criterion) {
    let mut group = c.benchmark_group("prefix/hash");
    let mut hasher = PromptHasher::new(256);
    let mut hashes = Vec::new();
    for size in SIZES {
        let body = chat_body(size);
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("fused", size), &body, |b, body| {
            b.iter(|| {
                let prompt = Some((&mut hasher, &mut hashes));
                find_model_and_prompt(black_box(body), prompt)
                    .map(|(f, bytes)| f.token.start + bytes)
            });
        });
        let names: Vec<Box<[u8]>> = vec![b"prompt_cache_key"[..].into()];
        let mut values = vec![FieldValue::Unseen; names.len()];
        group.bench_with_input(
            BenchmarkId::new("fused + session field", size),
            &body,
            |b, body| {
                b.iter(|| {
                    let prompt = Some((&mut hasher, &mut hashes));
                    let fields = BodyFields { names: &names, values: &mut values };
                    scan_body(black_box(body), prompt, fields)
                        .map(|(f, bytes)| f.token.start + bytes)
                });
            },
        );
        group.bench_with_input(BenchmarkId::new("scan + session field", size), &body, |b, body| {
            b.iter(|| {
                let fields = BodyFields { names: &names, values: &mut values };
                scan_body(black_box(body), None, fields).map(|(f, _)| f.token.start)
            });
        });
        group.bench_with_input(
            BenchmarkId::new("find_model (baseline)", size),
            &body,
            |b, body| {
                b.iter(|| find_model(black_box(body)).map(|f| f.token.start));
            },
        );
    }
    group.finish();
}

fn index(c: &mut Criterion) {
    let mut group = c.benchmark_group("prefix/index");
    let mut hasher = PromptHasher::new(256);
    for size in SIZES {
        let body = chat_body(size);
        let mut chain = Vec::new();
        hasher.hash_body(&body, &mut chain);
        let mut other = Vec::new();
        hasher.hash_text(&body, &mut other);
        group.throughput(Throughput::Bytes(body.len() as u64));
        let mut index = PrefixIndex::with_capacity(8192);
        index.insert(&chain, 0);
        group.bench_with_input(BenchmarkId::new("matched (cached)", size), &chain, |b, chain| {
            b.iter(|| index.matched(black_box(chain)));
        });
        group.bench_with_input(BenchmarkId::new("matched (not cached)", size), &other, |b, o| {
            b.iter(|| index.matched(black_box(o)));
        });
        let mut now = 0;
        group.bench_with_input(BenchmarkId::new("insert", size), &chain, |b, chain| {
            b.iter(|| {
                now += 1;
                index.insert(black_box(chain), now);
            });
        });
        // After the inserts every block is hot: the search a first turn adds to `matched`.
        let touches = warmpath::scheduler::HOT_PREFIX_TOUCHES;
        group.bench_with_input(BenchmarkId::new("hot (shared)", size), &chain, |b, chain| {
            b.iter(|| index.hot(black_box(chain), touches));
        });
    }
    group.finish();
}

criterion_group!(benches, hash, index);
criterion_main!(benches);
