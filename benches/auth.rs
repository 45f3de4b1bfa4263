//! Benchmarks of the main listener's key check (issue [11], `warmpath::credential`) and of the
//! tenant's rate-limit buckets (`warmpath::server::rate_limit`): the target is at most 1 µs per
//! request for both together, with no allocation.
//!
//! Dimensions:
//! - 100 tenants × 3 keys (300 digests in the `KeyTable`), tokens as `warmpath keygen` makes
//!   them (`wp_` and 43 base64url characters);
//! - `check/hit` and `check/miss`: the whole check as the shard runs it on a parsed head
//!   (`server::shard::auth::authenticate`, restated here because the shard's module is
//!   private): find the `Authorization` lines among 8 headers, parse `Bearer`, SHA-256 the
//!   token, look the digest up, compare it in constant time; the hit is a listed key, the miss
//!   an unknown one;
//! - `check/missing`: a head without `Authorization` (refused before any hashing);
//! - the parts: `sha256` of one token, `lookup` of a digest (binary search and the 32-byte
//!   constant-time comparison);
//! - baseline `linear_ct_scan`: the obvious alternative to the table, comparing the digest with
//!   all 300 in constant time; and `subtle_bytes_eq`, one comparison as `subtle` makes it on
//!   32-byte slices, against `digests_equal`, which compares 8-byte words.
//!
//! - `limit/reserve_settle`: what the shard does to a tenant's buckets per request
//!   (`server::shard::limits`): reserve one request and its tokens (a compare-and-swap on each
//!   of the two GCRA cells), then settle the tokens to a smaller use (a third update), for
//!   tenants taken in turn from the 100 (limits high enough that nothing is refused);
//! - `limit/check_and_limit`: `check/hit` followed by `limit/reserve_settle` for the tenant the
//!   key named: the whole per-request cost of issue [11] items 1 and 4.
//!
//! Tokens come from a seeded splitmix64 sequence, so runs are comparable; each iteration takes
//! the next of 1,024 pregenerated heads so that one cached digest is not measured. The
//! `limit_*` and `check_and_limit` functions are `#[inline(never)]` so that a callgrind run
//! (`perf/auth_instructions.sh`) can count their instructions per call.

use criterion::{criterion_group, criterion_main, Criterion};
use std::hint::black_box;
use subtle::ConstantTimeEq;
use warmpath::clock::TickRate;
use warmpath::config::TenantConfig;
use warmpath::credential::{authorize, base64url, digest, digests_equal, Digest, KeyTable};
use warmpath::protocol::{parse_request_head, Limits, RequestHead};
use warmpath::server::generation::Tenant;
use warmpath::server::rate_limit::Limiter;
use warmpath::splitmix::SplitMix64;

const TENANTS: u16 = 100;
const KEYS_PER_TENANT: u16 = 3;
const HEADS: usize = 1 << 10;

/// `wp_` and 32 seeded bytes in base64url: a `keygen`-shaped token.
fn token(rng: &mut SplitMix64) -> String {
    let bytes: Vec<u8> = (0..4).flat_map(|_| rng.next_u64().to_le_bytes()).collect();
    format!("wp_{}", base64url(&bytes))
}

/// The listed tokens and their table.
fn table(rng: &mut SplitMix64) -> (Vec<String>, KeyTable) {
    let tokens: Vec<String> = (0..TENANTS * KEYS_PER_TENANT).map(|_| token(rng)).collect();
    let keys = KeyTable::new((0u16..).zip(&tokens).map(|(i, t)| (digest(t.as_bytes()), i / 3 + 1)));
    (tokens, keys)
}

/// A chat request's head with 8 header lines, `Authorization: Bearer <token>` among them
/// (none when `token` is `None`).
fn head(token: Option<&str>) -> (Vec<u8>, RequestHead) {
    let auth = token.map_or_else(String::new, |t| format!("Authorization: Bearer {t}\r\n"));
    let raw = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: router.internal\r\n\
         User-Agent: OpenAI/Python 1.40.0\r\nAccept: application/json\r\n{auth}\
         Content-Type: application/json\r\nX-Session-ID: conversation-42\r\n\
         X-Stainless-Lang: python\r\nContent-Length: 2\r\n\r\n"
    )
    .into_bytes();
    let head = parse_request_head(&raw, &Limits::default()).expect("valid").expect("complete");
    (raw, head)
}

/// The shard's check (`server::shard::auth::authenticate`).
fn authenticate(head: &RequestHead, rbuf: &[u8], keys: &KeyTable) -> Option<u16> {
    let values = (head.headers.as_slice().iter())
        .filter(|h| h.name.get(rbuf).eq_ignore_ascii_case(b"authorization"))
        .map(|h| h.value.get(rbuf));
    authorize(values, keys).ok()
}

fn check(c: &mut Criterion) {
    let mut rng = SplitMix64::new(11);
    let (tokens, keys) = table(&mut rng);
    let hits: Vec<_> = (0..HEADS).map(|i| head(Some(&tokens[i % tokens.len()]))).collect();
    let misses: Vec<_> = (0..HEADS).map(|_| head(Some(&token(&mut rng)))).collect();
    let missing = head(None);
    let mut group = c.benchmark_group("auth/check");
    for (name, heads) in [("hit", &hits), ("miss", &misses)] {
        group.bench_function(name, |b| {
            let mut i = 0;
            b.iter(|| {
                let (raw, head) = &heads[i % HEADS];
                i += 1;
                black_box(authenticate(black_box(head), raw, &keys))
            });
        });
    }
    group.bench_function("missing", |b| {
        b.iter(|| black_box(authenticate(black_box(&missing.1), &missing.0, &keys)));
    });
    group.finish();
}

fn parts(c: &mut Criterion) {
    let mut rng = SplitMix64::new(12);
    let (tokens, keys) = table(&mut rng);
    let digests: Vec<Digest> = tokens.iter().map(|t| digest(t.as_bytes())).collect();
    let mut group = c.benchmark_group("auth/parts");
    group.bench_function("sha256", |b| {
        let mut i = 0;
        b.iter(|| {
            i += 1;
            black_box(digest(black_box(tokens[i % tokens.len()].as_bytes())))
        });
    });
    group.bench_function("lookup", |b| {
        let mut i = 0;
        b.iter(|| {
            i += 1;
            black_box(keys.find(black_box(&digests[i % digests.len()])))
        });
    });
    group.bench_function("digests_equal", |b| {
        let mut i = 0;
        b.iter(|| {
            i += 1;
            black_box(digests_equal(black_box(&digests[i % 300]), black_box(&digests[0])))
        });
    });
    group.bench_function("subtle_bytes_eq", |b| {
        let mut i = 0;
        b.iter(|| {
            i += 1;
            let (a, z) = (black_box(&digests[i % 300]), black_box(&digests[0]));
            black_box(bool::from(a[..].ct_eq(&z[..])))
        });
    });
    group.bench_function("linear_ct_scan", |b| {
        let mut i = 0;
        b.iter(|| {
            i += 1;
            let wanted = black_box(&digests[i % digests.len()]);
            let mut found = None;
            for (index, stored) in digests.iter().enumerate() {
                if digests_equal(stored, wanted) {
                    found = Some(index);
                }
            }
            black_box(found)
        });
    });
    group.finish();
}

/// Tenants limited to 10^9 requests and 10^12 tokens a minute: every reservation passes.
fn tenants() -> Vec<Tenant> {
    (0..TENANTS)
        .map(|i| {
            let mut config = TenantConfig::new(format!("t{i}"), Vec::new());
            config.requests_per_minute = 1_000_000_000;
            config.tokens_per_minute = 1_000_000_000_000;
            Tenant { name: config.name.clone(), config, live: true }
        })
        .collect()
}

/// Reserves a request of tenant `index` (from 1) with 1,300 tokens at `now`, then settles it
/// to 1,212 used.
#[inline(never)]
fn limit_request(limiter: &Limiter, tenants: &[Tenant], index: u16, now: u64) -> bool {
    let tenant = &tenants[usize::from(index) - 1];
    match limiter.reserve(tenant, index, 1_300, now) {
        Ok(reservation) => {
            limiter.settle(tenant, index, reservation, 1_212);
            true
        }
        Err(_) => false,
    }
}

/// The key check, then the limits of the tenant it names.
#[inline(never)]
fn check_and_limit(
    head: &RequestHead,
    rbuf: &[u8],
    keys: &KeyTable,
    limiter: &Limiter,
    tenants: &[Tenant],
    now: u64,
) -> bool {
    match authenticate(head, rbuf, keys) {
        Some(index) => limit_request(limiter, tenants, index, now),
        None => false,
    }
}

fn limit(c: &mut Criterion) {
    let mut rng = SplitMix64::new(13);
    let (tokens, keys) = table(&mut rng);
    let hits: Vec<_> = (0..HEADS).map(|i| head(Some(&tokens[i % tokens.len()]))).collect();
    let tenants = tenants();
    let limiter = Limiter::new(TickRate::NANOS, false);
    let mut group = c.benchmark_group("auth/limit");
    group.bench_function("reserve_settle", |b| {
        let (mut i, mut now) = (0u16, 1_000_000_000u64);
        b.iter(|| {
            i = i % TENANTS + 1;
            now += 1_000;
            black_box(limit_request(&limiter, &tenants, black_box(i), now))
        });
    });
    group.bench_function("check_and_limit", |b| {
        let (mut i, mut now) = (0, 1_000_000_000u64);
        b.iter(|| {
            let (raw, head) = &hits[i % HEADS];
            i += 1;
            now += 1_000;
            black_box(check_and_limit(black_box(head), raw, &keys, &limiter, &tenants, now))
        });
    });
    group.finish();
}

criterion_group!(benches, check, parts, limit);
criterion_main!(benches);
