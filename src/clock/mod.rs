//! The one place that reads time.
//!
//! Everything time-dependent in warmpath takes `now` as an argument, a [`Tick`]. Only the event
//! loops read the clock, through [`Clock`], and `clippy.toml` bans `Instant::now` everywhere else.
//!
//! A [`Tick`] is a raw reading of the clock source: on x86-64 with an invariant TSC, the
//! time-stamp counter as read by quanta (`rdtsc`, a few nanoseconds per read, no syscall);
//! otherwise quanta's monotonic fallback in nanoseconds. The simulated clock of tests counts
//! nanoseconds, set by the test. Ticks are compared and subtracted, never mixed with wall time;
//! [`TickRate`] converts configured durations into ticks once, at startup.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// A point in time in clock-source ticks (TSC cycles, or nanoseconds on the simulated clock).
pub type Tick = u64;

/// Conversion between [`Duration`] and [`Tick`] for one clock source.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TickRate {
    ticks_per_ns: f64,
}

impl TickRate {
    /// One tick per nanosecond: the simulated clock, and quanta's non-TSC fallback.
    pub const NANOS: TickRate = TickRate { ticks_per_ns: 1.0 };

    /// A rate of `ticks_per_ns` ticks per nanosecond; must be positive and finite.
    pub fn new(ticks_per_ns: f64) -> TickRate {
        assert!(ticks_per_ns.is_finite() && ticks_per_ns > 0.0, "bad tick rate {ticks_per_ns}");
        TickRate { ticks_per_ns }
    }

    /// Ticks per nanosecond.
    pub fn ticks_per_ns(self) -> f64 {
        self.ticks_per_ns
    }

    /// `duration` in ticks, rounded up so that a deadline never comes early; saturates.
    pub fn ticks(self, duration: Duration) -> Tick {
        let ticks = (duration.as_nanos() as f64 * self.ticks_per_ns).ceil();
        if ticks >= u64::MAX as f64 {
            u64::MAX
        } else {
            ticks as u64
        }
    }

    /// `ticks` as a duration, rounded to the nanosecond.
    pub fn duration(self, ticks: Tick) -> Duration {
        Duration::from_nanos((ticks as f64 / self.ticks_per_ns).round() as u64)
    }
}

/// A clock: the real one (quanta) or a simulated one that only moves when told to.
#[derive(Debug, Clone)]
pub struct Clock {
    source: Source,
    rate: TickRate,
}

#[derive(Debug, Clone)]
enum Source {
    Real(quanta::Clock),
    Simulated(Arc<AtomicU64>),
}

impl Clock {
    /// The real clock. Calibrates quanta's TSC source once (quanta does it on first use, a few
    /// milliseconds) and derives the tick rate from its calibration.
    pub fn real() -> Clock {
        let clock = quanta::Clock::new();
        // `delta_as_nanos` scales a raw delta by quanta's calibration: probing it with a large
        // delta yields the ticks-per-nanosecond ratio without a second measurement.
        let probe: u64 = 1 << 40;
        let nanos = clock.delta_as_nanos(0, probe).max(1);
        let rate = TickRate::new(probe as f64 / nanos as f64);
        Clock { source: Source::Real(clock), rate }
    }

    /// A simulated clock at 0 ns and its handle to move it.
    pub fn simulated() -> (Clock, SimClock) {
        let now = Arc::new(AtomicU64::new(0));
        let clock = Clock { source: Source::Simulated(Arc::clone(&now)), rate: TickRate::NANOS };
        (clock, SimClock { now })
    }

    /// The current tick.
    #[inline]
    pub fn now(&self) -> Tick {
        match &self.source {
            Source::Real(clock) => clock.raw(),
            Source::Simulated(now) => now.load(Ordering::Acquire),
        }
    }

    /// This clock's tick rate.
    pub fn rate(&self) -> TickRate {
        self.rate
    }
}

/// Wall-clock time since the Unix epoch, for timestamps that leave the process (access-log
/// lines). Never used to measure durations: those are [`Tick`]s. A clock set before 1970 reads
/// as the epoch.
#[allow(clippy::disallowed_methods)]
pub fn wall_time() -> Duration {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or(Duration::ZERO)
}

/// The handle that moves a simulated [`Clock`]. Time never goes backwards.
#[derive(Debug, Clone)]
pub struct SimClock {
    now: Arc<AtomicU64>,
}

impl SimClock {
    /// Moves the clock forward by `by`.
    pub fn advance(&self, by: Duration) {
        let nanos = u64::try_from(by.as_nanos()).unwrap_or(u64::MAX);
        self.now.fetch_add(nanos, Ordering::AcqRel);
    }

    /// Sets the clock to `tick` nanoseconds; panics if that is in the past.
    pub fn set(&self, tick: Tick) {
        let before = self.now.swap(tick, Ordering::AcqRel);
        assert!(before <= tick, "simulated clock moved backwards: {before} -> {tick}");
    }

    /// The current tick.
    pub fn now(&self) -> Tick {
        self.now.load(Ordering::Acquire)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simulated_clock_moves_only_when_told() {
        let (clock, sim) = Clock::simulated();
        assert_eq!(clock.now(), 0);
        sim.advance(Duration::from_millis(3));
        assert_eq!(clock.now(), 3_000_000);
        sim.set(5_000_000);
        assert_eq!(clock.now(), 5_000_000);
        assert_eq!(clock.rate().ticks(Duration::from_micros(7)), 7_000);
    }

    #[test]
    #[should_panic(expected = "backwards")]
    fn simulated_clock_refuses_to_go_back() {
        let (_clock, sim) = Clock::simulated();
        sim.set(10);
        sim.set(9);
    }

    #[test]
    fn real_clock_is_monotonic_and_rate_roundtrips() {
        let clock = Clock::real();
        let a = clock.now();
        let b = clock.now();
        assert!(b >= a);
        let rate = clock.rate();
        let second = rate.ticks(Duration::from_secs(1));
        assert!(second > 0);
        let back = rate.duration(second);
        assert!(back.as_nanos().abs_diff(1_000_000_000) <= 1, "{back:?}");
    }

    #[test]
    fn rate_rounds_up_and_saturates() {
        let rate = TickRate::new(2.5);
        assert_eq!(rate.ticks(Duration::from_nanos(1)), 3);
        assert_eq!(rate.ticks(Duration::MAX), u64::MAX);
    }
}
