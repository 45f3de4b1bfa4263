//! The workload driver: one thread, one mio event loop over a [`Pool`] of HTTP/1.1 keep-alive
//! connections to the target, streaming chat completions.
//!
//! It shares the machine with the engines and the router it measures, so it is built to cost
//! little: a single thread whatever the load, at most `max_inflight` requests in flight, idle
//! connections reused (the pool's connection handling and response parsing are in
//! [`super::pool`]).
//!
//! Scheduling: a timer heap holds the turns whose predecessor has ended, keyed by their due
//! tick: `max(start + at, predecessor's end + think)` (first turns: `start + at`). A turn is
//! sent when it is due and fewer than `max_inflight` requests are in flight (otherwise it waits
//! for one to end, and its latencies are measured from when it was actually sent). When a turn
//! ends, whatever its outcome, its follow-ups are pushed: a conversation goes on after an error,
//! as a user would retry by sending the next message. Past the duration limit nothing new is
//! sent and the run ends when the requests in flight have.
//!
//! Measures per request, from the moment it is handed to a connection (a new connection's
//! connect time included): TTFT (to the first SSE chunk with non-empty `delta.content` or
//! `text`), inter-token latency (mean gap between content chunks), end-to-end (to the end of
//! the body), the status, and output tokens (the usage chunk's `completion_tokens`, else the
//! number of content chunks). A non-streaming 2xx counts its whole body as the first token.
//! Failures are the pool's: `io`, `protocol`, or `timeout` after `request_timeout`.

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::io::{self, ErrorKind};
use std::net::{SocketAddr, ToSocketAddrs};
use std::time::Duration;

use indicatif::ProgressBar;
use mio::Events;

use crate::clock::{Clock, Tick};

use super::pool::{End, Exchange, Pool};
use super::report::Sample;
use super::workload::{session_streams, Workload};
use super::RunOptions;

/// How often the loop wakes to check request timeouts when nothing else is due.
pub(super) const TIMEOUT_CHECK: Duration = Duration::from_millis(100);

/// An OpenAI-compatible base URL, resolved.
#[derive(Debug, Clone)]
pub struct Target {
    /// The URL as given.
    pub url: String,
    /// The resolved address.
    pub addr: SocketAddr,
    /// `host[:port]` for the `Host` header.
    pub host: String,
    /// Path of the chat completions endpoint.
    pub path: String,
}

impl Target {
    /// Parses `http://host[:port][/prefix]`: requests go to `prefix/v1/chat/completions`, or
    /// `prefix/chat/completions` when the prefix already ends in `/v1`, or to `prefix` itself
    /// when it already ends in `/chat/completions`. Only plain HTTP.
    pub fn parse(url: &str) -> io::Result<Target> {
        let invalid = |why: &str| io::Error::new(ErrorKind::InvalidInput, format!("{url}: {why}"));
        let (host, prefix) =
            split_url(url).ok_or_else(|| invalid("expected http://HOST[:PORT][/PATH]"))?;
        let with_port = if host.contains(':') && !host.ends_with(']') {
            host.to_owned()
        } else {
            format!("{host}:80")
        };
        let addr = with_port
            .to_socket_addrs()
            .map_err(|e| invalid(&format!("cannot resolve: {e}")))?
            .next()
            .ok_or_else(|| invalid("resolves to no address"))?;
        let prefix = prefix.trim_end_matches('/');
        let path = if prefix.ends_with("/chat/completions") {
            prefix.to_owned()
        } else if prefix.ends_with("/v1") {
            format!("{prefix}/chat/completions")
        } else {
            format!("{prefix}/v1/chat/completions")
        };
        Ok(Target { url: url.to_owned(), addr, host: host.to_owned(), path })
    }
}

/// `http://host[:port][/path]` into `(host[:port], /path or "")`.
pub(crate) fn split_url(url: &str) -> Option<(&str, &str)> {
    let rest = url.strip_prefix("http://")?;
    let (host, path) = match rest.find('/') {
        Some(i) => rest.split_at(i),
        None => (rest, ""),
    };
    (!host.is_empty()).then_some((host, path))
}

/// The event loop and its state.
struct Driver<'a> {
    workload: &'a Workload,
    options: &'a RunOptions,
    target: &'a Target,
    clock: Clock,
    start: Tick,
    pool: Pool,
    heap: BinaryHeap<Reverse<(Tick, usize)>>,
    /// Flat turn index → (session, turn).
    turns: Vec<(u32, u32)>,
    /// Flat turn index → flat indices of the turns waiting for it.
    children: Vec<Vec<usize>>,
    inflight: usize,
    samples: Vec<Sample>,
    progress: &'a ProgressBar,
}

/// Runs `workload` against `target`; returns the samples and the elapsed seconds.
pub(crate) fn drive(
    target: &Target,
    workload: &Workload,
    options: &RunOptions,
    progress: &ProgressBar,
) -> io::Result<(Vec<Sample>, f64)> {
    let clock = Clock::real();
    let mut turns = Vec::with_capacity(workload.requests());
    let mut first_flat = Vec::with_capacity(workload.sessions.len());
    for (s, session) in workload.sessions.iter().enumerate() {
        first_flat.push(turns.len());
        turns.extend((0..session.turns.len()).map(|t| (s as u32, t as u32)));
    }
    let mut children = vec![Vec::new(); turns.len()];
    let mut heap = BinaryHeap::new();
    let start = clock.now();
    for (s, session) in workload.sessions.iter().enumerate() {
        for (t, turn) in session.turns.iter().enumerate() {
            let flat = first_flat[s] + t;
            match turn.after {
                Some(a) => children[first_flat[s] + a as usize].push(flat),
                None => heap.push(Reverse((start + clock.rate().ticks(turn.at), flat))),
            }
        }
    }
    let mut driver = Driver {
        workload,
        options,
        target,
        start,
        pool: Pool::new(target.addr, clock.clone())?,
        heap,
        turns,
        children,
        inflight: 0,
        samples: Vec::with_capacity(workload.requests()),
        progress,
        clock,
    };
    driver.run()?;
    let elapsed = driver.clock.rate().duration(driver.clock.now() - driver.start);
    Ok((driver.samples, elapsed.as_secs_f64()))
}

impl Driver<'_> {
    fn run(&mut self) -> io::Result<()> {
        let rate = self.clock.rate();
        let stop_at = self.options.stop_after.map(|d| self.start + rate.ticks(d));
        let mut events = Events::with_capacity(256);
        let mut next_timeout_check = self.start;
        loop {
            let now = self.clock.now();
            if stop_at.is_some_and(|t| now >= t) {
                self.heap.clear();
            }
            if self.heap.is_empty() && self.inflight == 0 {
                return Ok(());
            }
            self.dispatch_due(now);
            if now >= next_timeout_check {
                for exchange in self.pool.expire(now) {
                    self.finish(exchange, End::Failed("timeout"));
                }
                next_timeout_check = now + rate.ticks(TIMEOUT_CHECK);
            }
            let mut wait = TIMEOUT_CHECK;
            if let Some(Reverse((due, _))) = self.heap.peek() {
                if self.inflight < self.options.max_inflight {
                    wait = wait.min(rate.duration(due.saturating_sub(self.clock.now())));
                }
            }
            if let Some(stop) = stop_at {
                wait = wait.min(rate.duration(stop.saturating_sub(self.clock.now())));
            }
            self.pool.poll(&mut events, Some(wait))?;
            for event in &events {
                if let Some((exchange, end)) = self.pool.on_event(event.token().0) {
                    self.finish(exchange, end);
                }
            }
        }
    }

    fn dispatch_due(&mut self, now: Tick) {
        while self.inflight < self.options.max_inflight {
            match self.heap.peek() {
                Some(Reverse((due, _))) if *due <= now => {}
                _ => return,
            }
            let Some(Reverse((_, flat))) = self.heap.pop() else { return };
            self.send(flat);
        }
    }

    /// Builds the request of turn `flat` and hands it to a connection.
    fn send(&mut self, flat: usize) {
        let (s, t) = self.turns[flat];
        let mut body = Vec::with_capacity(4096);
        let o = self.options;
        let stream = session_streams(s as usize, o.unstreamed_percent);
        let flags = (o.ignore_eos, stream);
        self.workload.write_body(s as usize, t as usize, &o.model, flags, &mut body);
        let session = match o.anonymous {
            true => String::new(),
            false => format!("{}: {}\r\n", o.session_header, self.workload.sessions[s as usize].id),
        };
        let accept = if stream { "text/event-stream" } else { "application/json" };
        let mut request = format!(
            "POST {} HTTP/1.1\r\nHost: {}\r\nContent-Type: application/json\r\n\
             Accept: {accept}\r\nUser-Agent: warmpath-bench\r\n{session}{}\
             Content-Length: {}\r\n\r\n",
            self.target.path,
            self.target.host,
            authorization(o.api_key.as_deref()),
            body.len()
        )
        .into_bytes();
        request.extend_from_slice(&body);
        let now = self.clock.now();
        let deadline = now + self.clock.rate().ticks(o.request_timeout);
        let exchange = Exchange::new(flat, request.into(), now, deadline);
        self.inflight += 1;
        if let Some((exchange, end)) = self.pool.attach(exchange) {
            self.finish(exchange, end);
        }
    }

    /// Records the sample of an ended exchange and releases its follow-ups.
    fn finish(&mut self, e: Exchange, end: End) {
        let now = self.clock.now();
        let rate = self.clock.rate();
        let ms = |ticks: Tick| rate.duration(ticks).as_secs_f64() * 1000.0;
        let failure = match end {
            End::Complete => None,
            End::Failed(kind) => Some(kind),
            End::Retry => Some("io"),
        };
        let ok = failure.is_none() && (200..300).contains(&e.status);
        let first = e.first.or(ok.then_some(now));
        let itl = match (e.first, e.last) {
            (Some(a), Some(b)) if e.chunks > 1 => Some(ms(b - a) / f64::from(e.chunks - 1)),
            _ => None,
        };
        let (s, t) = self.turns[e.id];
        let follow_up = self.workload.sessions[s as usize].turns[t as usize].after.is_some();
        self.samples.push(Sample {
            session: s,
            turn: t,
            follow_up,
            stream: session_streams(s as usize, self.options.unstreamed_percent),
            status: e.status,
            failure,
            sent_ms: ms(e.started - self.start),
            ttft_ms: first.map(|f| ms(f - e.started)),
            itl_ms: itl,
            e2e_ms: ms(now - e.started),
            output_tokens: e.usage.unwrap_or(e.chunks),
        });
        self.inflight -= 1;
        self.progress.inc(1);
        let children = std::mem::take(&mut self.children[e.id]);
        for child in children {
            let (cs, ct) = self.turns[child];
            let turn = &self.workload.sessions[cs as usize].turns[ct as usize];
            let due = (self.start + rate.ticks(turn.at)).max(now + rate.ticks(turn.think));
            self.heap.push(Reverse((due, child)));
        }
    }
}

/// The `Authorization` header line of a request sent with `api_key`, or nothing.
pub(super) fn authorization(api_key: Option<&str>) -> String {
    match api_key {
        Some(key) => format!("Authorization: Bearer {key}\r\n"),
        None => String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        assert_eq!(split_url("http://127.0.0.1:8080"), Some(("127.0.0.1:8080", "")));
        assert_eq!(split_url("http://h:1/v1/"), Some(("h:1", "/v1/")));
        assert_eq!(split_url("https://h"), None);
        let t = Target::parse("http://127.0.0.1:9/v1").expect("parses");
        assert_eq!(t.path, "/v1/chat/completions");
        let t = Target::parse("http://127.0.0.1:9").expect("parses");
        assert_eq!((t.path.as_str(), t.addr.port()), ("/v1/chat/completions", 9));
        let t = Target::parse("http://localhost/api").expect("parses");
        assert_eq!((t.path.as_str(), t.addr.port()), ("/api/v1/chat/completions", 80));
        let t = Target::parse("http://127.0.0.1:9/v1/stream/chat/completions").expect("parses");
        assert_eq!(t.path, "/v1/stream/chat/completions");
    }
}
