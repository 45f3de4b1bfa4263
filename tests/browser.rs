//! The status page in a real browser (issue [10], item 5). Headless Chromium, driven through
//! the DevTools protocol (`support::chromium`), loads `GET /status` from a router in front of
//! two simulated engines (`warmpath sim`). The page first shows the idle router; then requests
//! arrive and stay in the engines (slow simulated time, long answers) or wait in the queue,
//! and the same page, never reloaded, shows the new numbers: its script's polls rewrote them.
//! Both times every count on the page must equal `/debug/queue`'s and `/debug/backends'`
//! read right after it; the comparison is retried for a bounded time, since the page shows
//! what its last poll (at most 2 s old) saw. It also checks what only a browser can: the
//! inline script and style run under the page's Content-Security-Policy, and the script
//! draws the queue's sparkline. Last, a screenshot of the viewport (1280 × 900), written to
//! `$WARMPATH_STATUS_SCREENSHOT` when set (`docs/status-page.png` is one), else to
//! `status-page.png` in Cargo's temporary directory for integration tests.
//!
//! Without Chromium the test prints "skipped: chromium not installed" and passes, unless
//! `WARMPATH_REQUIRE_BROWSER=1` (as `.ci/run` sets), which makes that a failure.

mod support;

use std::io::Write as _;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde_json::Value;
use warmpath::sim::{self, RunningSim, SimOptions};

use support::chromium::{self, png_size, Browser, Page};
use support::client::{self, request, Conn};
use support::router::Setup;
use support::{now, since, Deadline};

const MODEL: &str = "sim-8b";
const WIDTH: u32 = 1280;
const HEIGHT: u32 = 900;
/// Requests sent once the page is up: two engines × `inflight_per_backend` 2 admitted, the
/// rest queued.
const REQUESTS: usize = 7;
const ADMITTED: usize = 4;
/// How long the page may take to show a state (a shared CI machine may be slow to start a
/// browser; the page itself polls every 2 s).
const BROWSER_PATIENCE: Duration = Duration::from_secs(40);

/// What the page shows, read in the page: the model card's cells (`[pointer, format, shown]`,
/// the oldest-waiting rows aside, the count in that table's caption included), the ids in
/// those rows, each backend's row
/// (`pointer: shown`), the header's live marker, whether the inline style applied (the body's
/// margin is 0 only under status.css) and the queue sparkline's points and label; `null`
/// while the page is still loading.
const READ_PAGE: &str = r##"(() => {
  // Not loaded yet: a document still being parsed may hold the card's start and not its end.
  if (document.readyState !== "complete") return null;
  const card = document.querySelector("section.model");
  if (!card || !document.getElementById("live")) return null;
  const cells = [];
  card.querySelectorAll("[data-p]:not(th)").forEach((c) => {
    if (!c.closest("table.waiting > tbody"))
      cells.push([c.getAttribute("data-p"), c.getAttribute("data-f"), c.getAttribute("data-v")]);
  });
  const waiting = Array.from(card.querySelectorAll("table.waiting tbody tr"))
    .map((tr) => tr.cells[0].textContent);
  const backends = {};
  document.querySelectorAll("#backends tbody tr").forEach((tr) => {
    const row = {};
    tr.querySelectorAll("td[data-p]").forEach((td) => {
      row[td.getAttribute("data-p")] = td.getAttribute("data-v");
    });
    backends[row["/backend"]] = row;
  });
  const spark = card.querySelector("svg.spark");
  const line = spark.querySelector("polyline");
  const label = spark.querySelector("text");
  return {
    live: document.getElementById("live").getAttribute("data-v"),
    styled: getComputedStyle(document.body).marginTop === "0px",
    same_document: window.warmpathTestMark === true,
    cells, waiting, backends,
    samples: line ? line.getAttribute("points").trim().split(/\s+/).length : 0,
    chart: label ? label.textContent : "",
  };
})()"##;

/// The Chromium binary, or `None` after saying why the test is skipped.
fn chromium_or_skip() -> Option<PathBuf> {
    let required = std::env::var("WARMPATH_REQUIRE_BROWSER").is_ok_and(|v| v == "1");
    match chromium::find() {
        Some(binary) => Some(binary),
        None if required => panic!(
            "WARMPATH_REQUIRE_BROWSER=1 and no chromium: install it (apt-get install chromium) \
             or name it in WARMPATH_CHROMIUM"
        ),
        None => {
            // Straight to stderr, past the test harness's capture, so that a skip is seen.
            let _ = writeln!(
                std::io::stderr(),
                "tests/browser.rs: skipped: chromium not installed (apt-get install chromium, \
                 or WARMPATH_CHROMIUM=/path/to/chromium; WARMPATH_REQUIRE_BROWSER=1 fails instead)"
            );
            None
        }
    }
}

/// A chat request that holds its engine for minutes of real time: 2,000 tokens to generate
/// at a tenth of the simulated engine's speed.
fn held_request(i: usize) -> Vec<u8> {
    let body = format!(
        "{{\"model\":\"{MODEL}\",\"max_tokens\":2000,\"messages\":[{{\"role\":\"user\",\
         \"content\":\"question {i}: what does a router do with a warm cache?\"}}]}}"
    );
    request(
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
}

/// `value` as the page shows a count (`int`): JSON's text, `–` for null.
fn as_count(value: Option<&Value>) -> String {
    match value {
        None | Some(Value::Null) => "\u{2013}".to_owned(),
        Some(Value::String(text)) => text.clone(),
        Some(other) => other.to_string(),
    }
}

/// Where what the page shows differs from `queue` (the model's entry of `/debug/queue`) and
/// `backends` (`/debug/backends`' list): every count of the card, the oldest waiting requests'
/// ids, and each backend's state, inflight, held slots and slots gate. Times are left out:
/// they move between the page's poll and this read.
fn mismatches(shown: &Value, queue: &Value, backends: &[Value]) -> Vec<String> {
    let mut out = Vec::new();
    let cells = shown["cells"].as_array().expect("the card's cells");
    for cell in cells {
        let [pointer, format, text] = [0, 1, 2].map(|i| cell[i].as_str().unwrap_or(""));
        let expected = as_count(queue.pointer(pointer));
        if format == "int" && text != expected {
            out.push(format!("card {pointer}: page {text}, /debug/queue {expected}"));
        }
    }
    let waiting: Vec<Value> = queue["oldest_waiting"]
        .as_array()
        .map(|list| list.iter().map(|w| w["id"].clone()).collect())
        .unwrap_or_default();
    if shown["waiting"].as_array() != Some(&waiting) {
        out.push(format!("oldest waiting: page {}, /debug/queue {waiting:?}", shown["waiting"]));
    }
    for backend in backends {
        let address = backend["backend"].as_str().expect("an address");
        let Some(row) = shown["backends"].get(address) else {
            out.push(format!("no row for {address}"));
            continue;
        };
        let state = match (backend["live"].as_bool(), backend["ejected"].as_bool()) {
            (Some(false), _) => "removed",
            (_, Some(true)) => "ejected",
            _ if backend["healthy"] == true => "up",
            _ => "down",
        };
        let expected = [
            ("", state.to_owned()),
            ("/inflight", as_count(backend.get("inflight"))),
            ("/held_slots", as_count(backend.get("held_slots"))),
            ("/gates/slots", as_count(backend.pointer("/gates/slots"))),
        ];
        for (pointer, expected) in expected {
            let text = row[pointer].as_str().unwrap_or("");
            if text != expected {
                out.push(format!("{address} {pointer:?}: page {text}, /debug/backends {expected}"));
            }
        }
    }
    out
}

/// Reads the page until it is live, `wanted` holds of what it shows, and it matches the debug
/// documents read just after; returns what it showed. Panics after [`BROWSER_PATIENCE`] with
/// the last reading and its differences.
fn matching(page: &mut Page<'_>, admin: SocketAddr, wanted: impl Fn(&Value) -> bool) -> Value {
    let deadline = Deadline::after(BROWSER_PATIENCE);
    loop {
        let shown = page.eval(READ_PAGE);
        let loaded = !shown.is_null();
        let differences = if loaded && shown["live"] == "live" && wanted(&shown) {
            let queue = client::model_queue(admin, MODEL);
            let backends = client::get(admin, "/debug/backends").json();
            let backends = backends["backends"].as_array().cloned().unwrap_or_default();
            let differences = mismatches(&shown, &queue, &backends);
            if differences.is_empty() {
                return shown;
            }
            differences
        } else if loaded {
            vec!["not live yet, or not the state waited for".to_owned()]
        } else {
            vec!["the page has not loaded yet".to_owned()]
        };
        assert!(
            !deadline.passed(),
            "the page never matched within {BROWSER_PATIENCE:?}: {differences:?}\nlast shown: {shown}"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// The first card cell naming `pointer`, as shown.
fn cell<'a>(shown: &'a Value, pointer: &str) -> &'a str {
    let cells = shown["cells"].as_array().expect("the card's cells");
    let found = cells.iter().find(|cell| cell[0] == pointer).and_then(|cell| cell[2].as_str());
    found.unwrap_or_else(|| panic!("no cell {pointer}: {shown}"))
}

/// Waits for the queue's sparkline to have several samples and checks that its maximum is at
/// least the `queued` the page shows now (and no more than every request sent: a poll may
/// have caught them before their admissions); then writes a screenshot of the viewport and
/// returns where.
fn chart_and_screenshot(page: &mut Page<'_>, queued: usize) -> PathBuf {
    let deadline = Deadline::after(BROWSER_PATIENCE);
    let chart = loop {
        let shown = page.eval(READ_PAGE);
        if shown["samples"].as_u64() >= Some(4) {
            break shown;
        }
        assert!(!deadline.passed(), "the sparkline was never drawn: {shown}");
        std::thread::sleep(Duration::from_millis(200));
    };
    let label = chart["chart"].as_str().unwrap_or("");
    let max = label.strip_prefix("queued (max ").and_then(|rest| rest.strip_suffix(')'));
    let max: usize = max.and_then(|max| max.parse().ok()).unwrap_or_else(|| panic!("{chart}"));
    assert!((queued..=REQUESTS).contains(&max), "{chart}");

    let png = page.screenshot();
    assert_eq!(png_size(&png), Some((WIDTH, HEIGHT)), "not a {WIDTH}x{HEIGHT} PNG");
    let path = std::env::var_os("WARMPATH_STATUS_SCREENSHOT").map_or_else(
        || PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("status-page.png"),
        PathBuf::from,
    );
    std::fs::write(&path, &png).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
    path
}

#[test]
fn the_status_page_updates_live_in_a_real_browser() {
    let Some(binary) = chromium_or_skip() else { return };
    let start = now();
    let sims: Vec<RunningSim> = (0..2)
        .map(|seed| {
            let options = SimOptions { time_scale: 0.1, seed, ..SimOptions::new() };
            sim::start(options).expect("a sim starts")
        })
        .collect();
    let addresses: Vec<String> = sims.iter().map(|s| s.addr().to_string()).collect();
    let router = Setup::new()
        .queue("inflight_per_backend", "2")
        .queue("timeout", "300s")
        .model(MODEL, &addresses)
        .model_key("routing", "least-inflight")
        .start();

    let mut browser = Browser::launch(&binary, WIDTH, HEIGHT);
    let mut page = browser.open(&format!("http://{}/status", router.admin), WIDTH, HEIGHT);

    // The idle router, as the page shows it once its script has polled.
    let idle = matching(&mut page, router.admin, |shown| {
        cell(shown, "/queued") == "0" && cell(shown, "/inflight") == "0"
    });
    assert_eq!(idle["styled"], true, "the inline style did not apply (CSP?): {idle}");
    page.eval("window.warmpathTestMark = true");

    // Traffic: four requests in the engines, three queued behind them.
    let mut conns = Vec::new();
    for i in 0..REQUESTS {
        let mut conn = Conn::open(router.addr);
        conn.send(&held_request(i));
        conns.push(conn);
    }
    client::wait_queued(router.admin, MODEL, (REQUESTS - ADMITTED) as u64);
    let queued = (REQUESTS - ADMITTED).to_string();
    let busy = matching(&mut page, router.admin, |shown| {
        shown["same_document"] == true
            && cell(shown, "/queued") == queued
            && cell(shown, "/inflight") == ADMITTED.to_string()
    });
    assert_eq!(busy["waiting"].as_array().map(Vec::len), Some(REQUESTS - ADMITTED), "{busy}");
    for pointer in ["/queued", "/inflight", "/depth/normal", "/admitted/normal"] {
        assert_ne!(cell(&idle, pointer), cell(&busy, pointer), "{pointer} did not change");
    }
    for address in &addresses {
        assert_eq!(busy["backends"][address]["/gates/slots"], "full", "{busy}");
    }

    let path = chart_and_screenshot(&mut page, REQUESTS - ADMITTED);
    let _ = writeln!(
        std::io::stderr(),
        "tests/browser.rs: the page updated and matched the debug documents in {:.1?}; \
         screenshot: {}",
        since(start),
        path.display()
    );

    drop(browser);
    drop(conns);
    drop(router);
    for sim in sims {
        sim.stop();
    }
}
