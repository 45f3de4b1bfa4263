//! Model check of the rate-limit cells (`src/server/rate_limit`) under loom: every
//! interleaving of shards reserving, settling and the Redis store taking the unsynced charges,
//! on one tenant's cells.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release --test loom_rate_limit` (`.ci/run`
//! does, in its own target directory). Without `--cfg loom` this file is empty.
//!
//! The properties: **no update is lost** (whatever the interleaving, the cells end where one
//! thread doing the same operations in some order would leave them) and **a bucket never
//! admits more than it holds** (two threads racing for the last request of a minute: exactly
//! one wins); and the store's `take_unsynced` loses and doubles no charge. The cells are
//! updated with `Relaxed` compare-and-swaps: each cell is its own single variable, so the
//! model needs no ordering between them, and loom explores every value a relaxed load may
//! return.
//!
//! Replacing the admission's compare-and-swap with a load and a store fails the first model
//! (both racers admitted), as it should.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use warmpath::clock::TickRate;
use warmpath::config::TenantConfig;
use warmpath::server::generation::Tenant;
use warmpath::server::rate_limit::{Limit, Limiter, Refusal};

const NOW: u64 = 100_000_000_000;

fn tenant(rpm: u64, tpm: u64) -> Tenant {
    let mut config = TenantConfig::new("t", Vec::new());
    (config.requests_per_minute, config.tokens_per_minute) = (rpm, tpm);
    Tenant { name: "t".into(), config, live: true }
}

fn limiter(shared: bool) -> Limiter {
    Limiter::with_tenants(TickRate::NANOS, shared, 1)
}

/// Two shards race for the last request of the minute: exactly one is admitted.
#[test]
fn the_last_request_of_a_minute_is_admitted_once() {
    loom::model(|| {
        let limiter = Arc::new(limiter(false));
        let t = Arc::new(tenant(2, 0));
        assert!(limiter.reserve(&t, 1, 0, NOW).is_ok());
        let racers: Vec<_> = (0..2)
            .map(|_| {
                let (limiter, t) = (Arc::clone(&limiter), Arc::clone(&t));
                thread::spawn(move || limiter.reserve(&t, 1, 0, NOW).is_ok())
            })
            .collect();
        let admitted = racers.into_iter().map(|h| h.join().unwrap());
        assert_eq!(admitted.filter(|&ok| ok).count(), 1);
    });
}

/// A reservation and another request's settlement at once end where they would one after
/// the other: the refund is not lost under the reservation's compare-and-swap.
#[test]
fn a_settlement_racing_a_reservation_loses_nothing() {
    loom::model(|| {
        let limiter = Arc::new(limiter(true));
        let t = Arc::new(tenant(0, 100));
        let first = limiter.reserve(&t, 1, 60, NOW).expect("60 of 100");
        let settler = {
            let (limiter, t) = (Arc::clone(&limiter), Arc::clone(&t));
            thread::spawn(move || limiter.settle(&t, 1, first, 10))
        };
        let second = limiter.reserve(&t, 1, 50, NOW);
        settler.join().unwrap();
        // 60 reserved, settled to 10: 50 fit whenever the refund lands, or wait for it.
        let units = |tokens: u64| (tokens << 40) / 100;
        let backlog = limiter.backlog(1, Limit::Tokens, limiter.units(NOW));
        match second {
            Ok(_) => assert_eq!(backlog, units(10) + units(50)),
            Err(Refusal::Over { .. }) => assert_eq!(backlog, units(10)),
            Err(other) => panic!("{other:?}"),
        }
        // Every charge is in the unsynced count exactly once.
        assert_eq!(limiter.take_unsynced(1, Limit::Tokens), backlog as i64);
    });
}

/// The store takes the unsynced charges while a shard reserves: what it took and what is
/// left add up to every charge, once.
#[test]
fn the_store_takes_each_charge_once() {
    loom::model(|| {
        let limiter = Arc::new(limiter(true));
        let t = Arc::new(tenant(10, 0));
        let shard = {
            let (limiter, t) = (Arc::clone(&limiter), Arc::clone(&t));
            thread::spawn(move || {
                for _ in 0..2 {
                    assert!(limiter.reserve(&t, 1, 0, NOW).is_ok());
                }
            })
        };
        let taken = limiter.take_unsynced(1, Limit::Requests);
        shard.join().unwrap();
        let left = limiter.take_unsynced(1, Limit::Requests);
        let one = ((1u64 << 40) / 10) as i64;
        assert_eq!(taken + left, 2 * one);
        assert!(taken == 0 || taken == one || taken == 2 * one, "{taken}");
    });
}
