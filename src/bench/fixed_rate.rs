//! The `fixed-rate` workload: an open-loop (paced) load generator for latency at a fixed rate,
//! with coordinated omission corrected as wrk2 does it (Gil Tene's term: a closed-loop tool
//! waits for a slow response before sending the next request, so it stops sampling exactly
//! while the server is slow).
//!
//! - **Intended send times** are fixed before the run: `i / rate` for `constant` arrivals, a
//!   Poisson process (exponential gaps of mean `1 / rate`, seeded) for `poisson`, every time
//!   in `[0, duration)`. So the count of requests is `rate × duration` whatever the server
//!   does.
//! - **Latency is measured from the intended send time**, not from when the request went out:
//!   a send that was late (the generator descheduled, or no connection free) is charged to the
//!   request, and so is a server stall. What a closed-loop tool would report (first `write` to
//!   the end of the response) is reported beside it as `service`.
//! - **Connections**: `connections` keep-alive connections are opened and connected before the
//!   first send; a send that finds all of them busy opens another, up to `connections_max`.
//!   One that finds `connections_max` busy waits in a FIFO for the first to come free and is
//!   counted as **late**. The most recently freed connection is reused first.
//! - **Pacing precision**: `epoll_wait` takes whole milliseconds (mio rounds a shorter timeout
//!   up), so the loop sleeps in `epoll_wait` only while the next send is more than
//!   [`SPIN_WINDOW`] away, waking [`WAKE_EARLY`] before it; closer than that it polls without
//!   blocking, yielding the core (`sched_yield`) when there is nothing to read, so a server on
//!   the same core still runs. At rates above about 500 requests/s it therefore never sleeps
//!   and takes one core. The generator's own jitter is measured, not assumed: **send lag**,
//!   from the intended time to the first `write` of the request, is reported for every send.
//!
//! One thread, one mio loop, the connections and response parsing of [`super::pool`], times
//! from [`crate::clock`] (TSC ticks). Requests are all the same bytes, built once.

use std::collections::VecDeque;
use std::io;
use std::rc::Rc;
use std::time::Duration;

use mio::Events;

use crate::clock::{Clock, Tick, TickRate};

use super::client::{Target, TIMEOUT_CHECK};
use super::pool::{End, Exchange, Pool};
use super::report::{RateResult, RateRun, RateSample};
use super::synthetic::Rng;

/// Closer than this to the next send, the loop polls without blocking.
pub const SPIN_WINDOW: Duration = Duration::from_millis(2);
/// How long before the next send a sleep in `epoll_wait` ends at the latest (its timeout is in
/// whole milliseconds, and the kernel may add its timer slack, 50 µs by default).
pub const WAKE_EARLY: Duration = Duration::from_millis(1);
/// How long the warm connections have to connect before the first send.
const WARM_LIMIT: Duration = Duration::from_secs(2);
/// The small chat body of `perf/proxy_compare.sh`, `MODEL` replaced by `--model`.
const SMALL_BODY: &str =
    r#"{"model":"MODEL","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}"#;

/// How intended send times are spaced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Arrivals {
    /// Evenly, `1 / rate` apart.
    Constant,
    /// A Poisson process: exponential gaps of mean `1 / rate`.
    Poisson,
}

impl Arrivals {
    /// The name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Arrivals::Constant => "constant",
            Arrivals::Poisson => "poisson",
        }
    }
}

/// A paced run.
#[derive(Debug, Clone)]
pub struct FixedRate {
    /// Requests per second (positive, finite).
    pub rate: f64,
    /// The window of intended send times.
    pub duration: Duration,
    /// How send times are spaced.
    pub arrivals: Arrivals,
    /// Seed of Poisson arrivals.
    pub seed: u64,
    /// Connections opened and connected before the first send (at least 1).
    pub connections: usize,
    /// Connections open at most (at least `connections`).
    pub connections_max: usize,
    /// The request body (JSON, sent as is).
    pub body: Vec<u8>,
    /// A request not finished this long after its intended send time fails as `timeout`.
    pub request_timeout: Duration,
    /// The label of the result.
    pub label: String,
    /// Sent as `Authorization: Bearer KEY` on every request.
    pub api_key: Option<String>,
}

/// The `small` body for `model`, streamed (`"stream": true`) or not.
pub fn small_body(model: &str, stream: bool) -> Vec<u8> {
    let model = serde_json::to_string(model).expect("a string serialises");
    let body = SMALL_BODY.replace("\"MODEL\"", &model);
    match stream {
        true => format!("{},\"stream\":true}}", &body[..body.len() - 1]).into_bytes(),
        false => body.into_bytes(),
    }
}

impl FixedRate {
    /// The intended send times in nanoseconds from the start, ascending, all before
    /// `duration`: `round(i × 10⁹ / rate)` (constant), or the partial sums of exponential gaps
    /// from the seeded [`Rng`] (Poisson).
    pub fn offsets(&self) -> Vec<u64> {
        assert!(self.rate.is_finite() && self.rate > 0.0, "rate must be positive");
        let end = u64::try_from(self.duration.as_nanos()).unwrap_or(u64::MAX);
        let mut out = Vec::with_capacity((self.rate * self.duration.as_secs_f64()) as usize + 1);
        match self.arrivals {
            Arrivals::Constant => {
                let interval = 1e9 / self.rate;
                for i in 0u64.. {
                    let at = (i as f64 * interval).round() as u64;
                    if at >= end {
                        break;
                    }
                    out.push(at);
                }
            }
            Arrivals::Poisson => {
                let (mut rng, mut t) = (Rng::new(self.seed), 0.0f64);
                loop {
                    t += rng.exponential(1.0 / self.rate);
                    let at = (t * 1e9) as u64;
                    if at >= end {
                        break;
                    }
                    out.push(at);
                }
            }
        }
        out
    }

    /// Requests the run is expected to plan, `rate × duration` (exactly so for `constant`,
    /// up to rounding; the mean for `poisson`), without building them.
    pub fn expected(&self) -> f64 {
        self.rate * self.duration.as_secs_f64()
    }
}

/// The request bytes: a POST of `body` to `target`'s chat completions path.
fn request(target: &Target, body: &[u8], api_key: Option<&str>) -> Rc<[u8]> {
    let mut bytes = format!(
        "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
         User-Agent: warmpath-bench\r\n{}Content-Length: {}\r\n\r\n",
        target.path,
        target.host,
        super::client::authorization(api_key),
        body.len()
    )
    .into_bytes();
    bytes.extend_from_slice(body);
    bytes.into()
}

/// Runs `plan` against `target` (`http://host:port[/prefix]`) and summarises it.
pub fn run_fixed_rate(target: &str, plan: &FixedRate) -> io::Result<RateResult> {
    assert!(plan.connections >= 1 && plan.connections <= plan.connections_max);
    let target = Target::parse(target)?;
    let clock = Clock::real();
    let offsets = plan.offsets();
    let mut pool = Pool::new(target.addr, clock.clone())?;
    let warm = pool.warm(plan.connections, WARM_LIMIT)?;
    let mut notes = Vec::new();
    if warm < plan.connections {
        notes
            .push(format!("{warm} of {} connections connected before the start", plan.connections));
    }
    let rate = clock.rate();
    let start = clock.now();
    let mut pacer = Pacer {
        waited: vec![false; offsets.len()],
        samples: Vec::with_capacity(offsets.len()),
        offsets,
        request: request(&target, &plan.body, plan.api_key.as_deref()),
        timeout: rate.ticks(plan.request_timeout),
        connections_max: plan.connections_max,
        backlog: VecDeque::new(),
        next: 0,
        inflight: 0,
        start,
        rate,
        pool,
        clock,
    };
    pacer.run()?;
    let elapsed = pacer.rate.duration(pacer.clock.now() - start).as_secs_f64();
    let run = RateRun {
        label: plan.label.clone(),
        target: target.url.clone(),
        arrivals: plan.arrivals.name(),
        rate: plan.rate,
        duration_s: plan.duration.as_secs_f64(),
        planned: pacer.offsets.len() as u64,
        elapsed_s: elapsed,
        connections_warm: warm as u64,
        connections_opened: pacer.pool.opened(),
        connections_max: plan.connections_max as u64,
    };
    let mut result = RateResult::summarise(run, std::mem::take(&mut pacer.samples));
    result.notes = notes;
    Ok(result)
}

/// The paced loop and its state.
struct Pacer {
    clock: Clock,
    rate: TickRate,
    start: Tick,
    /// Intended send times, ns from `start`.
    offsets: Vec<u64>,
    /// The next request to become due.
    next: usize,
    /// Due requests waiting for a connection, oldest first.
    backlog: VecDeque<usize>,
    /// Per request: it waited for a connection.
    waited: Vec<bool>,
    pool: Pool,
    connections_max: usize,
    request: Rc<[u8]>,
    /// `request_timeout` in ticks.
    timeout: Tick,
    inflight: usize,
    samples: Vec<RateSample>,
}

impl Pacer {
    /// The intended send tick of request `i`.
    fn due(&self, i: usize) -> Tick {
        self.start + self.rate.ticks(Duration::from_nanos(self.offsets[i]))
    }

    fn run(&mut self) -> io::Result<()> {
        let mut events = Events::with_capacity(1024);
        let mut next_check = self.start + self.rate.ticks(TIMEOUT_CHECK);
        loop {
            let now = self.clock.now();
            self.dispatch(now);
            if self.next == self.offsets.len() && self.backlog.is_empty() && self.inflight == 0 {
                return Ok(());
            }
            if now >= next_check {
                for exchange in self.pool.expire(now) {
                    self.finish(exchange, End::Failed("timeout"));
                }
                next_check = now + self.rate.ticks(TIMEOUT_CHECK);
            }
            let wait = self.wait(self.clock.now(), next_check);
            self.pool.poll(&mut events, Some(wait))?;
            if wait.is_zero() && events.is_empty() {
                std::thread::yield_now();
            }
            for event in &events {
                if let Some((exchange, end)) = self.pool.on_event(event.token().0) {
                    self.finish(exchange, end);
                }
            }
        }
    }

    /// How long the next poll may block at `now`.
    fn wait(&self, now: Tick, next_check: Tick) -> Duration {
        let until_check = self.rate.duration(next_check.saturating_sub(now)).min(TIMEOUT_CHECK);
        if !self.backlog.is_empty() || self.next == self.offsets.len() {
            // Only a response (a free connection) or the timeout check can change anything.
            return until_check;
        }
        let ahead = self.rate.duration(self.due(self.next).saturating_sub(now));
        if ahead <= SPIN_WINDOW {
            return Duration::ZERO;
        }
        // Whole milliseconds, rounded down, so that mio passes them to epoll unchanged.
        let sleep = (ahead - WAKE_EARLY).min(until_check);
        Duration::from_millis(u64::try_from(sleep.as_millis()).unwrap_or(u64::MAX))
    }

    /// Sends what is due at `now`: the backlog first, then requests whose time has come; a
    /// request that finds no connection free at the bound joins the backlog.
    fn dispatch(&mut self, now: Tick) {
        while !self.backlog.is_empty() && self.can_send() {
            let i = self.backlog.pop_front().expect("not empty");
            self.send(i);
        }
        while self.next < self.offsets.len() && self.due(self.next) <= now {
            let i = self.next;
            self.next += 1;
            if self.backlog.is_empty() && self.can_send() {
                self.send(i);
            } else {
                self.waited[i] = true;
                self.backlog.push_back(i);
            }
        }
    }

    fn can_send(&self) -> bool {
        self.pool.idle() > 0 || self.pool.connections() < self.connections_max
    }

    fn send(&mut self, i: usize) {
        let due = self.due(i);
        let mut exchange = Exchange::new(i, Rc::clone(&self.request), due, due + self.timeout);
        exchange.count_usage = false;
        self.inflight += 1;
        if let Some((exchange, end)) = self.pool.attach(exchange) {
            self.finish(exchange, end);
        }
    }

    /// Records the sample of an ended exchange.
    fn finish(&mut self, e: Exchange, end: End) {
        let intended = e.started;
        let ended = e.ended.unwrap_or_else(|| self.clock.now());
        let rate = self.rate;
        let ns = |from: Tick, to: Tick| {
            u64::try_from(rate.duration(to.saturating_sub(from)).as_nanos()).unwrap_or(u64::MAX)
        };
        let failure = match end {
            End::Complete => None,
            End::Failed(kind) => Some(kind),
            End::Retry => Some("io"),
        };
        self.samples.push(RateSample {
            offset_ns: self.offsets[e.id],
            lag_ns: e.sent_at.map(|s| ns(intended, s)),
            latency_ns: ns(intended, ended),
            service_ns: e.sent_at.map(|s| ns(s, ended)),
            ttfb_ns: e.first_byte.map(|f| ns(intended, f)),
            status: e.status,
            failure,
            waited: self.waited[e.id],
            stream: e.event_stream,
        });
        self.inflight -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan(rate: f64, duration: Duration, arrivals: Arrivals) -> FixedRate {
        FixedRate {
            rate,
            duration,
            arrivals,
            seed: 1,
            connections: 1,
            connections_max: 1,
            body: Vec::new(),
            request_timeout: Duration::from_secs(1),
            label: "t".into(),
            api_key: None,
        }
    }

    #[test]
    fn a_key_is_one_authorization_line_of_the_head() {
        let target = Target::parse("http://127.0.0.1:9").expect("parses");
        let keyed = request(&target, b"{}", Some("wp_k"));
        let text = std::str::from_utf8(&keyed).expect("ascii");
        assert_eq!(text.matches("\r\nAuthorization: Bearer wp_k\r\n").count(), 1, "{text}");
        assert!(text.ends_with("\r\n\r\n{}"), "{text}");
        let plain = request(&target, b"{}", None);
        assert!(!std::str::from_utf8(&plain).expect("ascii").contains("Authorization"));
    }

    #[test]
    fn constant_arrivals_are_rate_times_duration_evenly_spaced() {
        for (rate, ms, n) in [(200.0, 1000, 200), (3.0, 1000, 3), (7.0, 500, 4), (1e5, 10, 1000)] {
            let p = plan(rate, Duration::from_millis(ms), Arrivals::Constant);
            let offsets = p.offsets();
            assert_eq!(offsets.len(), n, "rate {rate}, {ms} ms");
            assert!((p.expected() - n as f64).abs() < 1.0);
            assert_eq!(offsets[0], 0);
            let interval = 1e9 / rate;
            for (i, &at) in offsets.iter().enumerate() {
                assert!((at as f64 - i as f64 * interval).abs() <= 0.5, "{i}: {at}");
            }
        }
    }

    #[test]
    fn poisson_arrivals_have_the_rate_and_exponential_gaps() {
        let p = plan(10_000.0, Duration::from_secs(2), Arrivals::Poisson);
        let offsets = p.offsets();
        assert_eq!(offsets, p.offsets(), "seeded");
        // 20,000 expected; the count is Poisson, sd 141: 5 sd either way.
        assert!((offsets.len() as i64 - 20_000).abs() < 710, "{}", offsets.len());
        assert!(offsets.windows(2).all(|w| w[0] <= w[1]));
        // An exponential gap exceeds its mean with probability 1/e.
        let gaps: Vec<u64> = offsets.windows(2).map(|w| w[1] - w[0]).collect();
        let over = gaps.iter().filter(|&&g| g > 100_000).count() as f64 / gaps.len() as f64;
        assert!((over - (-1.0f64).exp()).abs() < 0.02, "{over}");
        let other = FixedRate { seed: 2, ..p };
        assert_ne!(other.offsets()[..10], offsets[..10]);
    }

    #[test]
    fn the_small_body_is_proxy_compares() {
        assert_eq!(
            String::from_utf8(small_body("bench-model", false)).expect("utf-8"),
            r#"{"model":"bench-model","messages":[{"role":"user","content":"Say hello."}],"max_tokens":16}"#
        );
        let streamed: serde_json::Value =
            serde_json::from_slice(&small_body("a\"b", true)).expect("JSON");
        assert_eq!(
            (streamed["model"].as_str(), streamed["stream"].as_bool()),
            (Some("a\"b"), Some(true))
        );
    }
}
