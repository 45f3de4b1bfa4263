//! `rate_limit.store = "redis"`: the limits shared across replicas through Redis, by a thread
//! of their own, so that the request path never waits on Redis.
//!
//! Every [`SYNC_INTERVAL`] the thread takes, for each live tenant and each limit it has, the
//! units its cell charged since the last sync (`Limiter::take_unsynced`, net of refunds), and
//! sends them all in one `EVALSHA` of [`SCRIPT`] (`EVAL` when Redis does not know the script
//! yet). The script runs atomically in Redis: for each key it moves the global GCRA cell by the
//! replica's delta (in microseconds of Redis's own `TIME`, so that replicas need no common
//! clock) and returns how far ahead of now the cell is. The thread then sets each local cell
//! to that backlog plus what the cell charged since the sync began (`Limiter::adopt_global`).
//! Each replica so admits against the global bucket as of the last sync plus its own
//! traffic since: tenants may overshoot by what the other replicas admit within one interval,
//! which is the price of keeping Redis off the request path (kthena-router and SGLang's router
//! make the same trade).
//!
//! Keys: `warmpath:rate:{tenant}:{requests|tokens}`, a decimal TAT in microseconds since the
//! Unix epoch, expiring a minute after the bucket is full again. Tenant names are valid key
//! parts (`docs/configuration.md`); a Redis Cluster is not supported (the keys of one sync
//! are not in one hash slot).
//!
//! Fallback: a sync that fails (Redis unreachable, refusing, or silent past [`TIMEOUT`])
//! counts in `warmpath_rate_limit_store_errors_total`, sets `warmpath_rate_limit_store_up` to
//! 0, drops the connection (the next sync reconnects) and drops the deltas it was sending:
//! while Redis is away the cells are purely local, each replica limiting on its own, and
//! when it is back the global cells resume from what they held.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use super::resp::{Connection, RedisUrl, Reply};
use super::{Limit, UNITS_PER_MINUTE};
use crate::server::Shared;

/// How often the thread syncs.
pub const SYNC_INTERVAL: Duration = Duration::from_millis(100);
/// Deadline of each socket operation with Redis (connect, write, read).
pub const TIMEOUT: Duration = Duration::from_millis(250);

/// The script of one sync. `KEYS[i]` a cell, `ARGV[i]` this replica's delta for it in
/// microseconds (signed); returns each cell's backlog in microseconds.
pub const SCRIPT: &str = "\
if redis.replicate_commands then redis.replicate_commands() end
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local out = {}
for i, key in ipairs(KEYS) do
  local tat = tonumber(redis.call('GET', key)) or now
  if tat < now then tat = now end
  tat = tat + tonumber(ARGV[i])
  if tat < now then tat = now end
  local backlog = tat - now
  redis.call('SET', key, string.format('%.0f', tat), 'PX', math.floor(backlog / 1000) + 60000)
  out[i] = backlog
end
return out
";

/// The store's health, for `/metrics`.
#[derive(Debug, Default)]
pub struct StoreStats {
    /// Syncs that failed (single writer: the store thread).
    pub errors: AtomicU64,
    /// 1 when the last sync succeeded, 0 otherwise (and with the local store).
    pub up: AtomicU64,
}

/// The store's thread.
#[derive(Debug)]
pub struct StoreThread {
    stop: Arc<AtomicBool>,
    thread: Thread,
    join: JoinHandle<()>,
}

impl StoreThread {
    /// Syncs `shared`'s limiter with the Redis at `url` once, on the calling thread (so that
    /// a replica that starts serving already knows the global buckets, unless Redis is away:
    /// then the start waits at most [`TIMEOUT`] per socket operation), then every
    /// [`SYNC_INTERVAL`] on a thread of its own.
    pub fn spawn(shared: Arc<Shared>, url: &str) -> std::io::Result<StoreThread> {
        let url = RedisUrl::parse(url).map_err(std::io::Error::other)?;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let mut sync = Sync { url, conn: None, sha: Vec::new() };
        sync.round(&shared);
        let thread = std::thread::Builder::new().name("rate-limit-store".into());
        let join = thread.spawn(move || {
            while !flag.load(Ordering::Acquire) {
                std::thread::park_timeout(SYNC_INTERVAL);
                sync.round(&shared);
            }
        })?;
        Ok(StoreThread { stop, thread: join.thread().clone(), join })
    }

    /// Stops the thread (after its current sync, at most [`TIMEOUT`] per socket operation).
    pub fn stop(self) {
        self.stop.store(true, Ordering::Release);
        self.thread.unpark();
        let _ = self.join.join();
    }
}

/// The thread's state between syncs.
struct Sync {
    url: RedisUrl,
    conn: Option<Connection>,
    /// The script's SHA-1 as `SCRIPT LOAD` returned it, for `EVALSHA`.
    sha: Vec<u8>,
}

impl Sync {
    /// One sync; its outcome lands in the limiter's [`StoreStats`].
    fn round(&mut self, shared: &Shared) {
        let limiter = &shared.limiter;
        let gen = shared.generation();
        let mut cells = Vec::new();
        for (tenant, index) in gen.tenants.iter().zip(1u16..).filter(|(t, _)| t.live) {
            let limits = [tenant.config.requests_per_minute, tenant.config.tokens_per_minute];
            for limit in Limit::ALL.into_iter().filter(|l| limits[*l as usize] > 0) {
                let key = format!("warmpath:rate:{}:{}", tenant.name, limit.name());
                cells.push((index, limit, key, limiter.take_unsynced(index, limit)));
            }
        }
        if cells.is_empty() {
            return;
        }
        match self.exchange(&cells) {
            Ok(backlogs) => {
                let now = limiter.units(shared.clock.now());
                for ((index, limit, _, _), backlog_us) in cells.iter().zip(backlogs) {
                    limiter.adopt_global(*index, *limit, now, us_to_units(backlog_us));
                }
                limiter.store.up.store(1, Ordering::Relaxed);
            }
            Err(_) => {
                self.conn = None;
                let errors = &limiter.store.errors;
                errors.store(errors.load(Ordering::Relaxed) + 1, Ordering::Relaxed);
                limiter.store.up.store(0, Ordering::Relaxed);
            }
        }
    }

    /// Runs the script over `cells` (tenant, limit, key, delta in units); the backlogs in
    /// microseconds, one per cell.
    fn exchange(&mut self, cells: &[(u16, Limit, String, i64)]) -> std::io::Result<Vec<u64>> {
        if self.conn.is_none() {
            let mut conn = Connection::open(&self.url, TIMEOUT)?;
            self.sha = match conn.command(&[b"SCRIPT", b"LOAD", SCRIPT.as_bytes()])? {
                Reply::Bulk(Some(sha)) => sha,
                other => return Err(std::io::Error::other(format!("SCRIPT LOAD: {other:?}"))),
            };
            self.conn = Some(conn);
        }
        let conn = self.conn.as_mut().expect("connected above");
        let count = cells.len().to_string();
        let deltas: Vec<String> = cells.iter().map(|c| units_to_us(c.3).to_string()).collect();
        let mut args: Vec<&[u8]> = vec![b"EVALSHA", &self.sha, count.as_bytes()];
        args.extend(cells.iter().map(|c| c.2.as_bytes()));
        args.extend(deltas.iter().map(|d| d.as_bytes()));
        let mut reply = conn.command(&args)?;
        if matches!(&reply, Reply::Error(e) if e.starts_with("NOSCRIPT")) {
            args[0] = b"EVAL";
            args[1] = SCRIPT.as_bytes();
            reply = conn.command(&args)?;
        }
        let backlogs = match reply {
            Reply::Array(Some(items)) if items.len() == cells.len() => items
                .into_iter()
                .map(|item| match item {
                    Reply::Integer(n) => Ok(u64::try_from(n).unwrap_or(0)),
                    other => Err(other),
                })
                .collect::<Result<Vec<u64>, Reply>>()
                .map_err(|r| std::io::Error::other(format!("unexpected item {r:?}")))?,
            other => return Err(std::io::Error::other(format!("unexpected reply {other:?}"))),
        };
        Ok(backlogs)
    }
}

/// Units (of [`UNITS_PER_MINUTE`]) as microseconds, rounded towards zero.
fn units_to_us(units: i64) -> i64 {
    (i128::from(units) * 60_000_000 / i128::from(UNITS_PER_MINUTE)) as i64
}

/// Microseconds as units.
fn us_to_units(us: u64) -> u64 {
    let units = u128::from(us) * u128::from(UNITS_PER_MINUTE) / 60_000_000;
    u64::try_from(units).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn units_and_microseconds_convert_both_ways() {
        assert_eq!(units_to_us(UNITS_PER_MINUTE as i64), 60_000_000);
        assert_eq!(units_to_us(-(UNITS_PER_MINUTE as i64) / 2), -30_000_000);
        assert_eq!(us_to_units(60_000_000), UNITS_PER_MINUTE);
        assert_eq!(us_to_units(u64::MAX), u64::MAX);
    }
}
