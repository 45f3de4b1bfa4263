//! Headless Chromium driven through the DevTools protocol over a pipe
//! (`--remote-debugging-pipe`): the browser reads commands from its descriptor 3 and writes
//! answers and events to its descriptor 4, each message one JSON text ended by a NUL byte. A
//! shell maps the child's stdin and stdout onto 3 and 4 (`exec chromium ... 3<&0 4>&1`), so no
//! port is opened, no websocket client is needed and no `unsafe` descriptor juggling either.
//!
//! [`find`] looks for the binary (`$WARMPATH_CHROMIUM`, else `chromium` or `chromium-browser`
//! on `PATH`); [`Browser::launch`] starts it with a fresh profile in a temporary directory;
//! [`Page`] is one tab, attached in flat mode (commands carry its `sessionId`).

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError};
use std::time::Duration;

use serde_json::{json, Value};

use super::Deadline;

/// The browser's standard error, in its profile directory; its end is quoted when a command
/// fails.
const LOG: &str = "chromium.log";

/// How long one DevTools command may take before the test fails.
const COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// The Chromium binary: `$WARMPATH_CHROMIUM` when set, else the first of `chromium` and
/// `chromium-browser` found on `PATH`.
pub fn find() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("WARMPATH_CHROMIUM") {
        return Some(PathBuf::from(path));
    }
    let dirs = std::env::var_os("PATH")?;
    std::env::split_paths(&dirs).find_map(|dir| {
        ["chromium", "chromium-browser"].iter().map(|name| dir.join(name)).find(|p| p.is_file())
    })
}

/// A running headless Chromium; dropping it closes the browser (killing it if it does not
/// exit within 5 s) and removes its profile directory (which holds its standard error).
#[derive(Debug)]
pub struct Browser {
    child: Child,
    commands: ChildStdin,
    messages: Receiver<Value>,
    next_id: u64,
    profile: PathBuf,
}

impl Browser {
    /// Starts `binary` headless with a `width` × `height` window and an empty profile.
    pub fn launch(binary: &Path, width: u32, height: u32) -> Browser {
        static LAUNCHES: AtomicU64 = AtomicU64::new(0);
        let launch = LAUNCHES.fetch_add(1, Ordering::Relaxed);
        let profile =
            std::env::temp_dir().join(format!("warmpath-chromium-{}-{launch}", std::process::id()));
        std::fs::create_dir_all(&profile).expect("a profile directory");
        // `--no-sandbox`: CI runs as root, where Chromium's sandbox refuses to start;
        // `--disable-dev-shm-usage`: containers often have a small /dev/shm. The rest keep a
        // fresh profile from reaching out to the network or showing first-run pages.
        let mut child = Command::new("sh")
            .arg("-c")
            .arg("exec \"$0\" \"$@\" 3<&0 4>&1 0</dev/null 1>&2")
            .arg(binary)
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--no-first-run",
                "--no-default-browser-check",
                "--disable-extensions",
                "--disable-background-networking",
                "--hide-scrollbars",
                "--remote-debugging-pipe",
                &format!("--window-size={width},{height}"),
                &format!("--user-data-dir={}", profile.display()),
                "about:blank",
            ])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(profile.join(LOG)).expect("a log file"))
            .spawn()
            .unwrap_or_else(|e| panic!("starting {}: {e}", binary.display()));
        let commands = child.stdin.take().expect("the command pipe");
        let answers = child.stdout.take().expect("the answer pipe");
        let (sender, messages) = mpsc::channel();
        std::thread::spawn(move || {
            let mut reader = BufReader::new(answers);
            let mut message = Vec::new();
            while reader.read_until(0, &mut message).is_ok_and(|n| n > 0) {
                if message.last() == Some(&0) {
                    message.pop();
                }
                let Ok(value) = serde_json::from_slice::<Value>(&message) else { break };
                if sender.send(value).is_err() {
                    break;
                }
                message.clear();
            }
        });
        Browser { child, commands, messages, next_id: 0, profile }
    }

    /// Sends `method` with `params` (to the tab `session`, or the browser when `None`) and
    /// returns its `result`; panics on an error answer, a closed pipe or a timeout.
    pub fn call(&mut self, session: Option<&str>, method: &str, params: Value) -> Value {
        self.next_id += 1;
        let id = self.next_id;
        let mut command = json!({"id": id, "method": method, "params": params});
        if let Some(session) = session {
            command["sessionId"] = json!(session);
        }
        let mut bytes = serde_json::to_vec(&command).expect("serialisable");
        bytes.push(0);
        self.commands.write_all(&bytes).unwrap_or_else(|e| panic!("{method}: {e}"));
        let deadline = Deadline::after(COMMAND_TIMEOUT);
        loop {
            let message = match self.messages.recv_timeout(deadline.remaining()) {
                Ok(message) => message,
                Err(RecvTimeoutError::Timeout) => {
                    panic!("{method}: no answer in {COMMAND_TIMEOUT:?}; {}", self.log_end())
                }
                Err(RecvTimeoutError::Disconnected) => {
                    panic!("{method}: the browser went away; {}", self.log_end())
                }
            };
            if message["id"].as_u64() != Some(id) {
                continue; // an event, or the answer to a command given up on
            }
            if let Some(error) = message.get("error") {
                panic!("{method}: {error}");
            }
            return message["result"].clone();
        }
    }

    /// The last 2,000 bytes of the browser's standard error.
    fn log_end(&self) -> String {
        let log = std::fs::read(self.profile.join(LOG)).unwrap_or_default();
        let end = String::from_utf8_lossy(&log[log.len().saturating_sub(2000)..]).into_owned();
        format!("the end of its standard error:\n{end}")
    }

    /// A new tab showing `url`, with a `width` × `height` viewport.
    pub fn open(&mut self, url: &str, width: u32, height: u32) -> Page<'_> {
        let target = self.call(None, "Target.createTarget", json!({"url": "about:blank"}));
        let target = target["targetId"].as_str().expect("a target id").to_owned();
        let attach = json!({"targetId": target, "flatten": true});
        let session = self.call(None, "Target.attachToTarget", attach);
        let session = session["sessionId"].as_str().expect("a session id").to_owned();
        let mut page = Page { browser: self, session };
        let metrics =
            json!({"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false});
        page.call("Emulation.setDeviceMetricsOverride", metrics);
        let navigation = page.call("Page.navigate", json!({"url": url}));
        assert!(navigation.get("errorText").is_none(), "{url}: {navigation}");
        page
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        self.next_id += 1;
        let close = format!("{{\"id\":{},\"method\":\"Browser.close\"}}\0", self.next_id);
        let _ = self.commands.write_all(close.as_bytes());
        let deadline = Deadline::after(Duration::from_secs(5));
        while !matches!(self.child.try_wait(), Ok(Some(_))) {
            if deadline.passed() {
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

/// One tab of a [`Browser`].
#[derive(Debug)]
pub struct Page<'a> {
    browser: &'a mut Browser,
    session: String,
}

impl Page<'_> {
    /// Sends `method` to this tab and returns its `result`.
    pub fn call(&mut self, method: &str, params: Value) -> Value {
        self.browser.call(Some(&self.session), method, params)
    }

    /// The value of the JavaScript `expression` in the page (as JSON; an exception panics).
    pub fn eval(&mut self, expression: &str) -> Value {
        let params = json!({"expression": expression, "returnByValue": true});
        let answer = self.call("Runtime.evaluate", params);
        if let Some(exception) = answer.get("exceptionDetails") {
            panic!("{expression}: {exception}");
        }
        answer["result"].get("value").cloned().unwrap_or(Value::Null)
    }

    /// A PNG of the viewport.
    pub fn screenshot(&mut self) -> Vec<u8> {
        let shot = self.call("Page.captureScreenshot", json!({"format": "png"}));
        base64_decode(shot["data"].as_str().expect("base64 data"))
    }
}

/// Standard base64 (with or without padding) to bytes; panics on any other character.
fn base64_decode(text: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len() / 4 * 3);
    let (mut bits, mut count) = (0u32, 0);
    for c in text.bytes().filter(|&c| c != b'=') {
        let value = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => panic!("not base64: {c:?}"),
        };
        bits = (bits << 6 | u32::from(value)) & 0xffff;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
        }
    }
    out
}

/// The width and height in a PNG's header, or `None` when `png` is not a PNG.
pub fn png_size(png: &[u8]) -> Option<(u32, u32)> {
    let header = png.get(..24)?;
    if &header[..8] != b"\x89PNG\r\n\x1a\n" || &header[12..16] != b"IHDR" {
        return None;
    }
    let word = |at: usize| u32::from_be_bytes(header[at..at + 4].try_into().unwrap());
    Some((word(16), word(20)))
}
