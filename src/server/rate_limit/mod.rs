//! Per-tenant rate limits (issue \[11\]): `requests_per_minute` and `tokens_per_minute`, each a
//! GCRA cell per tenant shared by every shard of the process, and the optional Redis store
//! that shares them across replicas (`store.rs`, `resp.rs`).
//!
//! # The cell: GCRA in one word
//!
//! Each limit of each tenant is one `AtomicU64` holding a *theoretical arrival time* (TAT), the
//! generic cell rate algorithm of ATM traffic policing (ITU-T I.371; the form Brandur Leach's
//! "throttled" and redis-cell use). A limit of `L` per minute lets through a request of cost `c`
//! at time `now` when `max(TAT, now) + c·T ≤ now + τ`, where `T` = one minute / `L` is the
//! emission interval and `τ` = one minute is the burst tolerance: a tenant idle for a minute
//! may spend a whole minute's allowance at once, and then `L` per minute. Admitting sets
//! `TAT = max(TAT, now) + c·T` with one compare-and-swap; a refusal leaves it unchanged and
//! its `Retry-After` is the excess, `max(TAT, now) + c·T − now − τ`.
//!
//! Encoding of the word: time in units of 2^-40 minute (about 55 ps; [`UNITS_PER_MINUTE`])
//! since tick 0 of the process's clock. A cost is `floor(c · 2^40 / L)` units, so the emission
//! interval is exact to a unit at every limit the configuration accepts (up to 10^12 per
//! minute), and a change of `L` on reload changes only the price of the next cost: the TAT keeps
//! meaning "when the bucket is full again", which is GCRA's semantics under a rate change. 2^64
//! units are 2^24 minutes (32 years) of uptime.
//!
//! # Reserve and settle
//!
//! A request pays one unit of `requests_per_minute` and, of `tokens_per_minute`, its prompt's
//! estimated tokens plus its `max_tokens` when the shard queues it (before the scheduler sees
//! it, so a limited request costs nothing downstream), and settles when it ends: the token
//! cell is given back what was reserved and not used, or charged what was used beyond it
//! (a charge is unconditional: a tenant that used more than it reserved is in debt, and its
//! next requests wait for it). A refund can move the TAT below `now`, which the next
//! admission's `max(TAT, now)` clamps: a refund never gives more than a full bucket. A cost
//! larger than the whole bucket (`c > L`) could never be admitted; it is refused outright
//! ([`Refusal::TooLarge`]) instead of with a `Retry-After` that would never come true.
//!
//! # Sharing
//!
//! The cells are a preallocated array indexed by tenant index ([`TENANTS_MAX`], stable across
//! reloads), one 64-byte line per tenant so that two tenants' shards never share a line: no
//! lock and no allocation per request, a compare-and-swap loop per cell. With
//! `rate_limit.store = "redis"` each cell also counts the units it charged since the last sync
//! (`unsynced`), and the store's thread (`store.rs`) moves them to Redis and moves the global
//! TAT back into the cell.
//!
//! Model check: under `cfg(loom)` the cells are loom's atomics, and `tests/loom_rate_limit.rs`
//! checks every interleaving of racing reservations, settlements and the store's takes (no
//! update lost, a last request admitted once, each charge taken once).

// Loom's atomics under `cfg(loom)`, so that `tests/loom_rate_limit.rs` can model-check the
// cells' updates from several threads.
#[cfg(loom)]
use loom::sync::atomic::{AtomicU64, Ordering};
#[cfg(not(loom))]
use std::sync::atomic::{AtomicU64, Ordering};

use crate::clock::{Tick, TickRate};
use crate::server::generation::{Tenant, TENANTS_MAX};

pub mod resp;
pub mod store;

/// Units of time per minute in a cell's word (see the module doc).
pub const UNITS_PER_MINUTE: u64 = 1 << 40;

/// A microsecond in units.
const MICROSECOND: u64 = UNITS_PER_MINUTE / 60_000_000;

/// Which limit: the `limit` label of `warmpath_rate_limited_total` and the access log's
/// `rate_limited`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Limit {
    /// `requests_per_minute`.
    Requests = 0,
    /// `tokens_per_minute`.
    Tokens = 1,
}

impl Limit {
    /// Both, in label order.
    pub const ALL: [Limit; 2] = [Limit::Requests, Limit::Tokens];

    /// The label value.
    pub fn name(self) -> &'static str {
        match self {
            Limit::Requests => "requests",
            Limit::Tokens => "tokens",
        }
    }
}

/// Why a reservation was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// Over `limit` now; the bucket has room again after `retry_after_s` seconds (at least 1).
    Over { limit: Limit, retry_after_s: u64 },
    /// The request alone needs `tokens`, more than the whole `tokens_per_minute` (`limit`).
    TooLarge { tokens: u64, limit: u64 },
}

/// What a request reserved, kept with it until it settles.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Reservation {
    /// Tokens reserved (0 when the tenant has no token limit).
    pub tokens: u64,
    /// Units charged to the token cell for them.
    units: u64,
}

impl Reservation {
    /// What a tenant with no limit holds: nothing charged, so its settlement charges nothing
    /// either, but the request still settles (its tokens are counted).
    pub const NONE: Reservation = Reservation { tokens: 0, units: 0 };
}

/// One GCRA cell.
#[derive(Debug, Default)]
struct Cell {
    /// The theoretical arrival time, in [`UNITS_PER_MINUTE`] units since tick 0.
    tat: AtomicU64,
    /// Net units charged since the store's last sync, an `i64` in two's complement (refunds
    /// are negative); only kept with the Redis store.
    unsynced: AtomicU64,
}

/// A tenant's two cells on a cache line of their own, `[Limit as usize]`.
#[derive(Debug, Default)]
#[repr(align(64))]
struct Cells([Cell; 2]);

/// Every tenant's cells and the clock's conversion to units.
#[derive(Debug)]
pub struct Limiter {
    /// Tenant `t` (from 1) at `t - 1`.
    tenants: Box<[Cells]>,
    /// Units per tick, fixed point: `now_units = now_ticks · per_tick >> 32`.
    per_tick: u128,
    /// Count `unsynced` (the Redis store is on).
    shared: bool,
    /// The store's health (see `store.rs`).
    pub store: store::StoreStats,
}

impl Limiter {
    /// Cells for every possible tenant at `rate`; `shared` when a store syncs them.
    pub fn new(rate: TickRate, shared: bool) -> Limiter {
        Limiter::with_tenants(rate, shared, TENANTS_MAX)
    }

    /// Cells for tenants 1 to `tenants` (the loom models use a few).
    pub fn with_tenants(rate: TickRate, shared: bool, tenants: usize) -> Limiter {
        let ticks_per_minute = rate.ticks(std::time::Duration::from_secs(60)).max(1);
        Limiter {
            tenants: (0..tenants).map(|_| Cells::default()).collect(),
            per_tick: (u128::from(UNITS_PER_MINUTE) << 32) / u128::from(ticks_per_minute),
            shared,
            store: store::StoreStats::default(),
        }
    }

    /// `now` in units.
    pub fn units(&self, now: Tick) -> u64 {
        u64::try_from((u128::from(now) * self.per_tick) >> 32).unwrap_or(u64::MAX)
    }

    fn cell(&self, tenant: u16, limit: Limit) -> &Cell {
        &self.tenants[usize::from(tenant) - 1].0[limit as usize]
    }

    /// Reserves one request and `tokens` tokens for `tenant` (from 1) at `now`, under its
    /// configuration's limits; nothing is charged when it is refused.
    pub fn reserve(
        &self,
        tenant: &Tenant,
        index: u16,
        tokens: u64,
        now: Tick,
    ) -> Result<Reservation, Refusal> {
        let (rpm, tpm) = (tenant.config.requests_per_minute, tenant.config.tokens_per_minute);
        if tpm > 0 && tokens > tpm {
            return Err(Refusal::TooLarge { tokens, limit: tpm });
        }
        let now = self.units(now);
        if rpm > 0 {
            self.admit(index, Limit::Requests, cost(1, rpm), now)?;
        }
        if tpm == 0 {
            return Ok(Reservation::default());
        }
        let units = cost(tokens, tpm);
        if let Err(refusal) = self.admit(index, Limit::Tokens, units, now) {
            if rpm > 0 {
                self.charge(index, Limit::Requests, -(cost(1, rpm) as i64));
            }
            return Err(refusal);
        }
        Ok(Reservation { tokens, units })
    }

    /// Settles a reservation of `tenant` whose request used `used` tokens: the difference is
    /// refunded or charged at the tenant's current `tokens_per_minute`.
    pub fn settle(&self, tenant: &Tenant, index: u16, reservation: Reservation, used: u64) {
        let tpm = tenant.config.tokens_per_minute;
        if reservation.units == 0 && (tpm == 0 || used == 0) {
            return;
        }
        let actual = if tpm == 0 { 0 } else { cost(used, tpm) };
        let delta = i64::try_from(actual).unwrap_or(i64::MAX)
            - i64::try_from(reservation.units).unwrap_or(i64::MAX);
        if delta != 0 {
            self.charge(index, Limit::Tokens, delta);
        }
    }

    /// GCRA's admission of `units` on `tenant`'s `limit` at `now` (units).
    fn admit(&self, tenant: u16, limit: Limit, units: u64, now: u64) -> Result<(), Refusal> {
        let cell = self.cell(tenant, limit);
        let mut tat = cell.tat.load(Ordering::Relaxed);
        loop {
            let next = tat.max(now).saturating_add(units);
            let ahead = next - now;
            if ahead > UNITS_PER_MINUTE {
                // Whole seconds, rounded up after forgiving a microsecond: the clock's
                // conversion to units is exact to a few units, not to zero.
                let excess = u128::from((ahead - UNITS_PER_MINUTE).saturating_sub(MICROSECOND));
                let seconds = (excess * 60).div_ceil(u128::from(UNITS_PER_MINUTE));
                let retry_after_s = u64::try_from(seconds).unwrap_or(u64::MAX).max(1);
                return Err(Refusal::Over { limit, retry_after_s });
            }
            match cell.tat.compare_exchange_weak(tat, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => break,
                Err(actual) => tat = actual,
            }
        }
        self.count_unsynced(cell, units as i64);
        Ok(())
    }

    /// Moves `tenant`'s `limit` cell by `units` (a charge, or a refund when negative) whatever
    /// the bucket holds.
    fn charge(&self, tenant: u16, limit: Limit, units: i64) {
        let cell = self.cell(tenant, limit);
        let _ = cell.tat.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |tat| {
            Some(tat.saturating_add_signed(units))
        });
        self.count_unsynced(cell, units);
    }

    fn count_unsynced(&self, cell: &Cell, units: i64) {
        if self.shared {
            cell.unsynced.fetch_add(units as u64, Ordering::Relaxed);
        }
    }

    /// How far ahead of `now` (units) `tenant`'s `limit` cell is: 0 for a full bucket, a
    /// minute for an empty one, more in debt.
    pub fn backlog(&self, tenant: u16, limit: Limit, now: u64) -> u64 {
        self.cell(tenant, limit).tat.load(Ordering::Relaxed).saturating_sub(now)
    }

    /// For the store: takes the units `tenant`'s `limit` cell charged since the last take.
    pub fn take_unsynced(&self, tenant: u16, limit: Limit) -> i64 {
        self.cell(tenant, limit).unsynced.swap(0, Ordering::Relaxed) as i64
    }

    /// For the store: the global bucket is `backlog` units ahead of `now` (units) with this
    /// replica's charges until the sync included; the cell becomes that plus what it charged
    /// since (still unsynced).
    pub(crate) fn adopt_global(&self, tenant: u16, limit: Limit, now: u64, backlog: u64) {
        let cell = self.cell(tenant, limit);
        let _ = cell.tat.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |_| {
            let since = cell.unsynced.load(Ordering::Relaxed) as i64;
            Some(now.saturating_add(backlog).saturating_add_signed(since))
        });
    }
}

/// `n` at `per_minute` per minute, in units, rounded down: `L` costs of 1 fit a minute exactly,
/// and a unit (55 ps) is the most a cost is under-charged. At least 1 unit for `n > 0`, as a
/// limit is at most 10^12 < 2^40.
fn cost(n: u64, per_minute: u64) -> u64 {
    if n < 1 << 24 {
        return (n << 40) / per_minute;
    }
    let units = u128::from(n) * u128::from(UNITS_PER_MINUTE) / u128::from(per_minute);
    u64::try_from(units).unwrap_or(u64::MAX)
}

#[cfg(all(test, not(loom)))]
mod tests;
