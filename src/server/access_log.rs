//! The access log (SPEC 6): one JSON line per request, written off the request path.
//!
//! Each shard formats its lines into a reused scratch buffer and appends them to its own
//! bounded [`ShardLog`] (a byte buffer under a mutex that only the shard and the writer thread
//! touch, so the lock is uncontended but for the writer's swap). A full buffer drops the line
//! and counts the drop (`warmpath_access_log_dropped_total`) instead of blocking the shard.
//! The [`LogWriter`] thread swaps each shard's buffer with an empty one of the same capacity
//! (double buffering: no allocation once both exist) every [`FLUSH_INTERVAL`], or sooner when
//! a shard's buffer passes half full and wakes it, and writes the bytes to the sink with
//! blocking I/O. A sink that fails (disk full) loses those lines, counted as drops too.
//!
//! A file sink is opened again, by path, at the start of the writer's next pass after
//! [`ShardLog::reopen`] (every reload asks for it, and waits for it): after logrotate has moved
//! the file, lines go to a new file at the path, those still pending included. A path that
//! cannot be opened keeps the old file and says so on standard error.
//!
//! The line's fields are in `docs/operations.md` ("Access log").

use std::fs::OpenOptions;
use std::io::{self, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::thread::{JoinHandle, Thread};
use std::time::Duration;

use crate::config::AccessLog;
use crate::protocol::{decimal, write_json_string};
use crate::scheduler::Lane;

/// Bytes a shard's buffer holds before lines are dropped.
pub const SHARD_BUFFER_BYTES: usize = 1 << 20;
/// Longest wait between two flushes of a non-empty buffer.
pub const FLUSH_INTERVAL: Duration = Duration::from_millis(100);
/// Longest wait of [`ShardLog::reopen`] for the writer (one slow write on a full disk).
pub const REOPEN_WAIT: Duration = Duration::from_secs(1);

/// One shard's pending lines.
#[derive(Debug)]
pub struct ShardLog {
    lines: Mutex<Vec<u8>>,
    capacity: usize,
    /// Lines dropped because the buffer was full or the sink failed. Written by the shard
    /// (single writer, a load and a store) except for sink failures, which the writer thread
    /// counts in `sink_dropped`.
    dropped: AtomicU64,
    sink_dropped: AtomicU64,
    /// The buffer passed half full since the writer last swapped it (wake it once per fill).
    signalled: AtomicBool,
    writer: Arc<Writer>,
}

/// What the shards' buffers share of the writer thread: how to wake it, and a request to
/// reopen its file.
#[derive(Debug, Default)]
struct Writer {
    thread: OnceLock<Thread>,
    reopen: AtomicBool,
}

impl Writer {
    fn wake(&self) {
        if let Some(thread) = self.thread.get() {
            thread.unpark();
        }
    }
}

impl ShardLog {
    fn new(capacity: usize, writer: Arc<Writer>) -> ShardLog {
        ShardLog {
            lines: Mutex::new(Vec::with_capacity(capacity)),
            capacity,
            dropped: AtomicU64::new(0),
            sink_dropped: AtomicU64::new(0),
            signalled: AtomicBool::new(false),
            writer,
        }
    }

    /// Appends one complete line (with its newline), or drops and counts it when the buffer is
    /// full. Never blocks for longer than the writer's swap.
    pub fn push(&self, line: &[u8]) {
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        if lines.len() + line.len() > self.capacity {
            drop(lines);
            let n = self.dropped.load(Ordering::Relaxed);
            self.dropped.store(n + 1, Ordering::Relaxed);
            return;
        }
        lines.extend_from_slice(line);
        let half = lines.len() > self.capacity / 2;
        drop(lines);
        if half && !self.signalled.swap(true, Ordering::AcqRel) {
            self.writer.wake();
        }
    }

    /// Has the writer open its file again by path (module doc), and returns once it has (at
    /// most [`REOPEN_WAIT`]); shared by every shard's buffer, so any one asks for all.
    pub fn reopen(&self) {
        self.writer.reopen.store(true, Ordering::Release);
        self.writer.wake();
        // Naps of a millisecond, at most REOPEN_WAIT of them in all.
        let nap = Duration::from_millis(1);
        for _ in 0..REOPEN_WAIT.as_millis() {
            if !self.writer.reopen.load(Ordering::Acquire) {
                return;
            }
            std::thread::sleep(nap);
        }
    }

    /// Lines dropped so far.
    pub fn dropped(&self) -> u64 {
        self.dropped.load(Ordering::Relaxed) + self.sink_dropped.load(Ordering::Relaxed)
    }

    /// Swaps the pending lines into `spare` (which must be empty).
    fn take(&self, spare: &mut Vec<u8>) {
        debug_assert!(spare.is_empty());
        let mut lines = self.lines.lock().unwrap_or_else(|e| e.into_inner());
        std::mem::swap(&mut *lines, spare);
        drop(lines);
        self.signalled.store(false, Ordering::Release);
    }
}

/// Where lines go.
#[derive(Debug)]
enum Sink {
    Stdout,
    Stderr,
    File(std::fs::File, std::path::PathBuf),
}

impl Sink {
    fn open(target: &AccessLog) -> io::Result<Option<Sink>> {
        Ok(match target {
            AccessLog::Off => None,
            AccessLog::Stdout => Some(Sink::Stdout),
            AccessLog::Stderr => Some(Sink::Stderr),
            AccessLog::File(path) => Some(Sink::File(open_file(path)?, path.clone())),
        })
    }

    /// Opens a file sink again by its path (another file after a rotation); a failure keeps
    /// the open file, said on standard error.
    fn reopen(&mut self) {
        let Sink::File(file, path) = self else { return };
        match open_file(path) {
            Ok(new) => *file = new,
            Err(e) => eprintln!("warmpath: access log: reopening failed, kept the open file: {e}"),
        }
    }

    fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        match self {
            Sink::Stdout => io::stdout().lock().write_all(bytes),
            Sink::Stderr => io::stderr().lock().write_all(bytes),
            Sink::File(file, _) => file.write_all(bytes),
        }
    }
}

/// `path` opened for appending, created if missing.
fn open_file(path: &std::path::Path) -> io::Result<std::fs::File> {
    OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(|e| io::Error::new(e.kind(), format!("server.access_log {}: {e}", path.display())))
}

/// The access log's writer thread and the shards' buffers.
#[derive(Debug)]
pub struct LogWriter {
    shards: Vec<Arc<ShardLog>>,
    stop: Arc<AtomicBool>,
    writer: Arc<Writer>,
    join: JoinHandle<()>,
}

impl LogWriter {
    /// Opens the sink of `target` and starts the writer for `shards` buffers; `None` when the
    /// log is off. Fails when the file cannot be opened for appending.
    pub fn start(target: &AccessLog, shards: usize) -> io::Result<Option<LogWriter>> {
        let Some(sink) = Sink::open(target)? else { return Ok(None) };
        let writer = Arc::new(Writer::default());
        let logs: Vec<Arc<ShardLog>> = (0..shards)
            .map(|_| Arc::new(ShardLog::new(SHARD_BUFFER_BYTES, Arc::clone(&writer))))
            .collect();
        let stop = Arc::new(AtomicBool::new(false));
        let worker = Worker {
            shards: logs.clone(),
            stop: Arc::clone(&stop),
            writer: Arc::clone(&writer),
            sink,
        };
        let registered = Arc::clone(&writer);
        let join = std::thread::Builder::new().name("access-log".into()).spawn(move || {
            registered.thread.get_or_init(std::thread::current);
            worker.run();
        })?;
        Ok(Some(LogWriter { shards: logs, stop, writer, join }))
    }

    /// The buffer of each shard, by shard index.
    pub fn shards(&self) -> &[Arc<ShardLog>] {
        &self.shards
    }

    /// Writes what is pending and stops the thread.
    pub fn stop(self) {
        self.stop.store(true, Ordering::Release);
        self.writer.wake();
        let _ = self.join.join();
    }
}

struct Worker {
    shards: Vec<Arc<ShardLog>>,
    stop: Arc<AtomicBool>,
    writer: Arc<Writer>,
    sink: Sink,
}

impl Worker {
    fn run(mut self) {
        let mut spare = Vec::with_capacity(SHARD_BUFFER_BYTES);
        loop {
            // Read the flag before the last pass, so lines pushed before `stop` are written.
            let stopping = self.stop.load(Ordering::Acquire);
            // Before this pass's lines: once the flag is down, every later line goes to the
            // new file.
            if self.writer.reopen.load(Ordering::Acquire) {
                self.sink.reopen();
                self.writer.reopen.store(false, Ordering::Release);
            }
            for shard in &self.shards {
                shard.take(&mut spare);
                if !spare.is_empty() {
                    if self.sink.write(&spare).is_err() {
                        let lines = spare.iter().filter(|&&b| b == b'\n').count() as u64;
                        shard.sink_dropped.fetch_add(lines, Ordering::Relaxed);
                    }
                    spare.clear();
                }
            }
            if let Sink::Stdout = self.sink {
                let _ = io::stdout().flush();
            }
            if stopping {
                return;
            }
            std::thread::park_timeout(FLUSH_INTERVAL);
        }
    }
}

/// How a request ended, the `outcome` field.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// A backend's response was relayed to its end (whatever its status).
    Relayed,
    /// The router answered (an error, `/v1/models`, health).
    Router,
    /// The client went away before its response ended.
    ClientGone,
    /// The backend failed after response bytes were relayed: the stream was cut.
    UpstreamFailed(super::metrics::UpstreamError),
}

impl Outcome {
    /// The field's value.
    pub fn name(self) -> &'static str {
        use super::metrics::UpstreamError as E;
        match self {
            Outcome::Relayed => "relayed",
            Outcome::Router => "router",
            Outcome::ClientGone => "client_gone",
            Outcome::UpstreamFailed(E::Connect) => "upstream_connect",
            Outcome::UpstreamFailed(E::Reset) => "upstream_reset",
            Outcome::UpstreamFailed(E::Timeout) => "upstream_timeout",
            Outcome::UpstreamFailed(E::Malformed) => "upstream_malformed",
            Outcome::UpstreamFailed(E::Truncated) => "upstream_truncated",
        }
    }
}

/// One line's fields; byte strings are the request's own bytes (visible ASCII once parsed).
#[derive(Debug, Clone, Copy)]
pub struct Record<'a> {
    /// Wall-clock time the request ended.
    pub time: Duration,
    /// The client's `X-Request-ID`, or the one warmpath sent upstream.
    pub request_id: Option<&'a [u8]>,
    pub method: &'a [u8],
    pub path: &'a [u8],
    pub model: Option<&'a str>,
    /// Issue \[11\]: the tenant its API key named (`null` when none is configured, or for a
    /// route that needs no key, or a refused key).
    pub tenant: Option<&'a str>,
    /// The session id; a body field's value as sent (escapes left as they are).
    pub session: Option<&'a [u8]>,
    /// Which source gave the session (issue \[10\]): `header`, `body` or `none`.
    pub session_source: &'static str,
    pub backend: Option<&'a str>,
    /// 0 when no status was sent (the client left first).
    pub status: u16,
    pub lane: Option<Lane>,
    pub queue_wait: Option<Duration>,
    /// Forwarded to the backend's response head.
    pub ttfb: Option<Duration>,
    /// First request byte to the end.
    pub total: Duration,
    /// Request bytes read (head and body as sent).
    pub bytes_in: u64,
    /// Response bytes written to the client.
    pub bytes_out: u64,
    pub outcome: Outcome,
    /// Issue \[11\]: the limit that refused the request (`requests` or `tokens`).
    pub rate_limited: Option<&'static str>,
    /// Issue \[11\]: the tokens reserved against the tenant's `tokens_per_minute`, and what the
    /// request settled to (both `null` without a token limit).
    pub tokens_reserved: Option<u64>,
    pub tokens_used: Option<u64>,
}

/// Appends `record` as one JSON line (with its newline) to `out`; no allocation beyond `out`.
pub fn format_line(record: &Record<'_>, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    out.extend_from_slice(b"{\"time\":\"");
    write_rfc3339(record.time, out);
    out.extend_from_slice(b"\",\"request_id\":");
    bytes_or_null(record.request_id, out);
    out.extend_from_slice(b",\"method\":");
    bytes_or_null(Some(record.method), out);
    out.extend_from_slice(b",\"path\":");
    bytes_or_null(Some(record.path), out);
    out.extend_from_slice(b",\"model\":");
    bytes_or_null(record.model.map(str::as_bytes), out);
    out.extend_from_slice(b",\"tenant\":");
    bytes_or_null(record.tenant.map(str::as_bytes), out);
    out.extend_from_slice(b",\"session\":");
    bytes_or_null(record.session, out);
    out.extend_from_slice(b",\"session_source\":\"");
    out.extend_from_slice(record.session_source.as_bytes());
    out.extend_from_slice(b"\",\"backend\":");
    bytes_or_null(record.backend.map(str::as_bytes), out);
    out.extend_from_slice(b",\"status\":");
    match record.status {
        0 => out.extend_from_slice(b"null"),
        status => out.extend_from_slice(decimal(u64::from(status), &mut digits)),
    }
    out.extend_from_slice(b",\"lane\":");
    match record.lane {
        Some(Lane::Retry | Lane::Normal) => out.extend_from_slice(b"\"normal\""),
        Some(Lane::Boosted) => out.extend_from_slice(b"\"boosted\""),
        Some(Lane::Forced) => out.extend_from_slice(b"\"forced\""),
        None => out.extend_from_slice(b"null"),
    }
    for (name, value) in [
        (&b",\"queue_wait_us\":"[..], record.queue_wait),
        (b",\"ttfb_us\":", record.ttfb),
        (b",\"total_us\":", Some(record.total)),
    ] {
        out.extend_from_slice(name);
        match value {
            Some(d) => out.extend_from_slice(decimal(micros(d), &mut digits)),
            None => out.extend_from_slice(b"null"),
        }
    }
    out.extend_from_slice(b",\"bytes_in\":");
    out.extend_from_slice(decimal(record.bytes_in, &mut digits));
    out.extend_from_slice(b",\"bytes_out\":");
    out.extend_from_slice(decimal(record.bytes_out, &mut digits));
    out.extend_from_slice(b",\"outcome\":\"");
    out.extend_from_slice(record.outcome.name().as_bytes());
    out.extend_from_slice(b"\",\"rate_limited\":");
    bytes_or_null(record.rate_limited.map(str::as_bytes), out);
    for (name, value) in [
        (&b",\"tokens_reserved\":"[..], record.tokens_reserved),
        (b",\"tokens_used\":", record.tokens_used),
    ] {
        out.extend_from_slice(name);
        match value {
            Some(n) => out.extend_from_slice(decimal(n, &mut digits)),
            None => out.extend_from_slice(b"null"),
        }
    }
    out.extend_from_slice(b"}\n");
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

/// A JSON string of `bytes` (lossily decoded), or `null`.
fn bytes_or_null(bytes: Option<&[u8]>, out: &mut Vec<u8>) {
    match bytes {
        Some(bytes) => match std::str::from_utf8(bytes) {
            Ok(s) => write_json_string(s, out),
            Err(_) => write_json_string(&String::from_utf8_lossy(bytes), out),
        },
        None => out.extend_from_slice(b"null"),
    }
}

/// `time` since the epoch as `YYYY-MM-DDTHH:MM:SS.mmmZ` (UTC), by Hinnant's
/// `civil_from_days` (<http://howardhinnant.github.io/date_algorithms.html>).
fn write_rfc3339(time: Duration, out: &mut Vec<u8>) {
    let secs = time.as_secs();
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let fields = [
        (year as u64, 4usize, b'-'),
        (month as u64, 2, b'-'),
        (day as u64, 2, b'T'),
        (rem / 3600, 2, b':'),
        (rem / 60 % 60, 2, b':'),
        (rem % 60, 2, b'.'),
        (u64::from(time.subsec_millis()), 3, b'Z'),
    ];
    for (value, width, sep) in fields {
        let mut digits = [0u8; 20];
        let text = decimal(value, &mut digits);
        out.extend(std::iter::repeat_n(b'0', width.saturating_sub(text.len())));
        out.extend_from_slice(text);
        out.push(sep);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> Record<'static> {
        Record {
            time: Duration::from_millis(1_700_000_000_123),
            request_id: Some(b"req-1"),
            method: b"POST",
            path: b"/v1/chat/completions",
            model: Some("m"),
            tenant: Some("search-team"),
            session: Some(b"s\"1"),
            session_source: "body",
            backend: Some("127.0.0.1:8000"),
            status: 200,
            lane: Some(Lane::Boosted),
            queue_wait: Some(Duration::from_micros(1500)),
            ttfb: Some(Duration::from_millis(20)),
            total: Duration::from_millis(35),
            bytes_in: 120,
            bytes_out: 4096,
            outcome: Outcome::Relayed,
            rate_limited: None,
            tokens_reserved: Some(1300),
            tokens_used: Some(1212),
        }
    }

    #[test]
    fn a_line_is_one_json_object_with_every_field() {
        let mut out = Vec::new();
        format_line(&record(), &mut out);
        assert_eq!(out.last(), Some(&b'\n'));
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(value["time"], "2023-11-14T22:13:20.123Z");
        assert_eq!(value["session"], "s\"1");
        assert_eq!(value["tenant"], "search-team");
        assert_eq!(value["session_source"], "body");
        assert_eq!(value["lane"], "boosted");
        assert_eq!(value["queue_wait_us"], 1500);
        assert_eq!(value["ttfb_us"], 20_000);
        assert_eq!(value["total_us"], 35_000);
        assert_eq!(value["bytes_out"], 4096);
        assert_eq!(value["outcome"], "relayed");
        assert!(value["rate_limited"].is_null(), "{value}");
        assert_eq!(
            (&value["tokens_reserved"], &value["tokens_used"]),
            (&1300.into(), &1212.into())
        );

        let mut gone = record();
        gone.status = 0;
        gone.lane = None;
        gone.ttfb = None;
        gone.backend = None;
        gone.tenant = None;
        gone.outcome = Outcome::ClientGone;
        gone.rate_limited = Some("tokens");
        gone.tokens_used = None;
        out.clear();
        format_line(&gone, &mut out);
        let value: serde_json::Value = serde_json::from_slice(&out).unwrap();
        assert!(value["status"].is_null() && value["ttfb_us"].is_null(), "{value}");
        assert!(value["tenant"].is_null(), "{value}");
        assert_eq!(value["outcome"], "client_gone");
        assert_eq!(value["rate_limited"], "tokens");
        assert!(value["tokens_used"].is_null(), "{value}");
    }

    #[test]
    fn rfc3339_handles_the_epoch_and_leap_days() {
        let mut out = Vec::new();
        write_rfc3339(Duration::ZERO, &mut out);
        assert_eq!(out, b"1970-01-01T00:00:00.000Z");
        out.clear();
        // 2024-02-29T12:00:00Z.
        write_rfc3339(Duration::from_secs(1_709_208_000), &mut out);
        assert_eq!(out, b"2024-02-29T12:00:00.000Z");
    }

    #[test]
    fn a_full_buffer_drops_and_counts_lines() {
        let log = ShardLog::new(10, Arc::new(Writer::default()));
        log.push(b"12345\n");
        log.push(b"12345\n");
        assert_eq!(log.dropped(), 1);
        let mut spare = Vec::new();
        log.take(&mut spare);
        assert_eq!(spare, b"12345\n");
        log.push(b"abc\n");
        assert_eq!(log.dropped(), 1);
    }
}
