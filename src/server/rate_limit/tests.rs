use std::sync::Arc;

use super::*;
use crate::config::TenantConfig;

fn tenant(rpm: u64, tpm: u64) -> Tenant {
    let mut config = TenantConfig::new("t", Vec::new());
    (config.requests_per_minute, config.tokens_per_minute) = (rpm, tpm);
    Tenant { name: "t".into(), config, live: true }
}

/// Nanosecond ticks.
fn limiter() -> Limiter {
    Limiter::new(TickRate::NANOS, false)
}

const SECOND: u64 = 1_000_000_000;

#[test]
fn a_minute_s_requests_pass_then_one_per_interval() {
    let (l, t) = (limiter(), tenant(60, 0));
    let now = 100 * SECOND;
    for _ in 0..60 {
        assert!(l.reserve(&t, 1, 0, now).is_ok());
    }
    let refused = l.reserve(&t, 1, 0, now);
    assert_eq!(refused, Err(Refusal::Over { limit: Limit::Requests, retry_after_s: 1 }));
    assert_eq!(l.reserve(&t, 1, 0, now + SECOND / 2), refused, "not yet");
    let later = now + SECOND + SECOND / 1000;
    assert!(l.reserve(&t, 1, 0, later).is_ok(), "one more each second");
    assert!(l.reserve(&t, 1, 0, later).is_err());
    assert!(l.reserve(&t, 2, 0, now).is_ok(), "another tenant has its own bucket");
}

#[test]
fn tokens_are_reserved_refunded_and_charged() {
    let (l, t) = (limiter(), tenant(0, 1000));
    let now = 100 * SECOND;
    let a = l.reserve(&t, 1, 600, now).expect("600 of 1000");
    assert_eq!(a.tokens, 600);
    let refused = l.reserve(&t, 1, 600, now);
    // 200 tokens over, at 1000 a minute: 12 s.
    assert_eq!(refused, Err(Refusal::Over { limit: Limit::Tokens, retry_after_s: 12 }));
    l.settle(&t, 1, a, 100);
    let b = l.reserve(&t, 1, 600, now).expect("the unused 500 came back");
    l.settle(&t, 1, b, 900);
    // 100 + 900 used: the bucket is empty, the next token after 60 / 1000 s.
    let refused = l.reserve(&t, 1, 1, now);
    assert_eq!(refused, Err(Refusal::Over { limit: Limit::Tokens, retry_after_s: 1 }));
    assert!(l.reserve(&t, 1, 1, now + SECOND).is_ok());
}

#[test]
fn a_refused_token_reservation_gives_its_request_back() {
    let (l, t) = (limiter(), tenant(2, 100));
    let now = 100 * SECOND;
    assert!(l.reserve(&t, 1, 100, now).is_ok());
    assert!(l.reserve(&t, 1, 1, now).is_err(), "tokens are spent");
    assert!(l.reserve(&t, 1, 0, now).is_ok(), "the refused request's slot came back");
    assert!(matches!(l.reserve(&t, 1, 0, now), Err(Refusal::Over { limit: Limit::Requests, .. })));
}

#[test]
fn a_request_larger_than_the_bucket_is_too_large_not_delayed() {
    let (l, t) = (limiter(), tenant(10, 1000));
    assert_eq!(
        l.reserve(&t, 1, 1001, SECOND),
        Err(Refusal::TooLarge { tokens: 1001, limit: 1000 })
    );
    assert!(l.reserve(&t, 1, 1000, SECOND).is_ok(), "a whole bucket fits");
    assert_eq!(l.backlog(1, Limit::Requests, l.units(SECOND)), cost(1, 10));
}

#[test]
fn refunds_never_fill_more_than_the_bucket() {
    let (l, t) = (limiter(), tenant(0, 100));
    let now = 100 * SECOND;
    let r = l.reserve(&t, 1, 100, now).unwrap();
    l.settle(&t, 1, r, 0);
    l.settle(&t, 1, r, 0);
    assert!(l.reserve(&t, 1, 100, now).is_ok());
    assert!(l.reserve(&t, 1, 1, now).is_err(), "two refunds made no second bucket");
}

#[test]
fn unlimited_tenants_reserve_nothing_and_a_new_limit_applies_at_once() {
    let (l, mut t) = (limiter(), tenant(0, 0));
    for _ in 0..10_000 {
        assert_eq!(l.reserve(&t, 1, 1 << 40, SECOND), Ok(Reservation::default()));
    }
    t.config.tokens_per_minute = 10;
    assert!(l.reserve(&t, 1, 10, SECOND).is_ok());
    assert!(l.reserve(&t, 1, 1, SECOND).is_err());
    t.config.tokens_per_minute = 20;
    assert!(l.reserve(&t, 1, 1, SECOND).is_err(), "the bucket is still full");
    let later = SECOND + 3 * SECOND + SECOND / 1000;
    assert!(l.reserve(&t, 1, 1, later).is_ok(), "but refills twice as fast");
}

/// Threads reserving at once admit exactly what one thread would: the compare-and-swap loses
/// no update.
#[test]
fn concurrent_reservations_admit_exactly_the_limit() {
    let l = Arc::new(limiter());
    let t = Arc::new(tenant(1000, 0));
    let admitted: usize = (0..4)
        .map(|_| {
            let (l, t) = (Arc::clone(&l), Arc::clone(&t));
            std::thread::spawn(move || {
                (0..1000).filter(|_| l.reserve(&t, 1, 0, SECOND).is_ok()).count()
            })
        })
        .collect::<Vec<_>>()
        .into_iter()
        .map(|h| h.join().unwrap())
        .sum();
    assert_eq!(admitted, 1000);
}

#[test]
fn the_store_s_deltas_and_global_backlog() {
    let l = Limiter::new(TickRate::NANOS, true);
    let t = tenant(60, 0);
    let now = 100 * SECOND;
    let r = l.reserve(&t, 1, 0, now).unwrap();
    assert_eq!(r, Reservation::default());
    let unit = cost(1, 60);
    assert_eq!(l.take_unsynced(1, Limit::Requests), unit as i64);
    assert_eq!(l.take_unsynced(1, Limit::Requests), 0, "taken once");
    assert!(l.reserve(&t, 1, 0, now).is_ok());
    // Another replica used 58: the global backlog is 59 requests, plus this one unsynced.
    l.adopt_global(1, Limit::Requests, l.units(now), 59 * unit);
    assert_eq!(l.backlog(1, Limit::Requests, l.units(now)), 60 * unit);
    assert!(l.reserve(&t, 1, 0, now).is_err(), "the global bucket is empty");
}
