//! Shared helpers of the loopback integration tests (`tests/serve.rs`, `tests/openai_client.rs`):
//! - [`backend`]: a programmable fake inference engine (answer, hold, stream, fail, reset) that
//!   records every request it receives; [`silent`]: one that never answers, and a refusing port;
//! - [`client`]: a raw HTTP/1.1 client that sees exactly what the router sends (heads, chunked
//!   framing, SSE events as they arrive) plus admin helpers for `/metrics` and `/debug/queue`;
//! - [`router`]: a TOML configuration builder and a handle on a running `warmpath::server`;
//! - [`ledger`]: every request's one outcome, checked against the router's counters and an
//!   idle `/debug/queue` at the end of a fault-injection or hostile-input test;
//! - [`chromium`]: headless Chromium driven through the DevTools protocol over a pipe
//!   (`tests/browser.rs`).
//!
//! Time is read through `warmpath::clock` (clippy bans `Instant::now` outside it), and every
//! wait is a poll with a deadline, never a fixed sleep used as synchronisation.

#![allow(dead_code)]

pub mod backend;
pub mod chromium;
pub mod client;
pub mod ledger;
pub mod router;
pub mod silent;
pub mod wire;

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::Duration;

use warmpath::clock::{Clock, Tick};

/// A fresh path for `name` (with the process id) in the directory `dir` under the test target
/// directory: the directory exists, nothing is at the path.
pub fn temp_path(dir: &str, name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(dir);
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&path);
    path
}

/// The access log's lines (JSON) at `path`, once it holds at least `n`.
pub fn log_lines(path: &Path, n: usize) -> Vec<serde_json::Value> {
    wait_until(&format!("{n} access-log lines"), PATIENCE, || {
        let text = std::fs::read_to_string(path).ok()?;
        let lines: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
        (lines.len() >= n).then_some(lines)
    })
}

/// How long a test waits for anything that should happen "at once" before failing.
pub const PATIENCE: Duration = Duration::from_secs(5);

/// The poll period of [`wait_until`].
pub const POLL: Duration = Duration::from_millis(5);

/// The process-wide real clock (calibrated once).
pub fn clock() -> &'static Clock {
    static CLOCK: OnceLock<Clock> = OnceLock::new();
    CLOCK.get_or_init(Clock::real)
}

/// The current tick of [`clock`].
pub fn now() -> Tick {
    clock().now()
}

/// Time elapsed since `start` (a tick of [`now`]).
pub fn since(start: Tick) -> Duration {
    clock().rate().duration(now().saturating_sub(start))
}

/// A point in time after which a wait gives up.
#[derive(Debug, Clone, Copy)]
pub struct Deadline {
    start: Tick,
    timeout: Duration,
}

impl Deadline {
    /// `timeout` from now.
    pub fn after(timeout: Duration) -> Deadline {
        Deadline { start: now(), timeout }
    }

    /// Whether the deadline has passed.
    pub fn passed(&self) -> bool {
        since(self.start) >= self.timeout
    }

    /// Time left (zero once passed).
    pub fn remaining(&self) -> Duration {
        self.timeout.saturating_sub(since(self.start))
    }
}

/// Polls `probe` every [`POLL`] until it returns `Some`, for at most `timeout`; panics naming
/// `what` when it never does.
pub fn wait_until<T>(what: &str, timeout: Duration, mut probe: impl FnMut() -> Option<T>) -> T {
    let deadline = Deadline::after(timeout);
    loop {
        if let Some(value) = probe() {
            return value;
        }
        assert!(!deadline.passed(), "timed out after {timeout:?} waiting for {what}");
        std::thread::sleep(POLL);
    }
}

/// Polls `condition` until it holds (at most [`PATIENCE`]); panics naming `what` otherwise.
pub fn eventually(what: &str, mut condition: impl FnMut() -> bool) {
    wait_until(what, PATIENCE, || condition().then_some(()));
}

/// `warmpath serve --config CONFIG` as a child process: no `WARMPATH_*` variable of the test's
/// environment reaches it, and its output is dropped.
pub fn serve_binary(config: &std::path::Path) -> std::process::Child {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_warmpath"));
    command.args(["serve", "--config", config.to_str().expect("a UTF-8 path")]);
    command.stdout(std::process::Stdio::null()).stderr(std::process::Stdio::null());
    for (variable, _) in warmpath::config::ENV_VARS {
        command.env_remove(variable);
    }
    command.spawn().expect("the binary starts")
}

/// Sends signal `name` (`HUP`, `TERM`, ...) to `child`, through kill(1).
pub fn signal(child: &std::process::Child, name: &str) {
    let status = std::process::Command::new("kill")
        .args([&format!("-{name}"), &child.id().to_string()])
        .status();
    assert!(status.expect("kill runs").success(), "kill -{name}");
}
