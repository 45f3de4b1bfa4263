//! The status page (issue [10], item 4): `GET /status` on the admin listener only, a
//! self-contained HTML page whose server-rendered numbers are `/debug/queue`'s and
//! `/debug/backends'`, with every configured string escaped and nothing loaded from elsewhere.
//! Behaviour only; what it costs to render is `benches/status.rs`'s business, and what the
//! page's script does in a browser is `tests/browser.rs`'s.

mod support;

use serde_json::Value;
use sha2::{Digest, Sha256};
use support::backend::Backend;
use support::client::{self, chat_request, Conn};
use support::router::Setup;
use support::{wait_until, PATIENCE};

const M: &str = "m";
/// A model name with every HTML metacharacter.
const HOSTILE: &str = "<b>&'\"x";

/// `/debug/queue` or `/debug/backends` with the ages taken out (they move while the numbers
/// stand still).
fn without_ages(mut value: Value) -> Value {
    match &mut value {
        Value::Object(map) => {
            map.retain(|key, _| !key.ends_with("_ms"));
            for item in map.values_mut() {
                *item = without_ages(item.take());
            }
        }
        Value::Array(items) => {
            for item in items.iter_mut() {
                *item = without_ages(item.take());
            }
        }
        _ => {}
    }
    value
}

/// The page with both documents as they were just before and just after it, once the
/// documents agree (the state stood still while the page was rendered).
fn quiet_page(admin: std::net::SocketAddr) -> (client::Response, Value, Value) {
    wait_until("a quiet state", PATIENCE, || {
        let queue = client::get(admin, "/debug/queue").json();
        let backends = client::get(admin, "/debug/backends").json();
        let page = client::get(admin, "/status");
        let queue_after = client::get(admin, "/debug/queue").json();
        let backends_after = client::get(admin, "/debug/backends").json();
        let quiet = without_ages(queue.clone()) == without_ages(queue_after)
            && without_ages(backends.clone()) == without_ages(backends_after);
        quiet.then_some((page, queue, backends))
    })
}

/// The `data-v` of the first cell naming `pointer` in `html`.
fn shown(html: &str, pointer: &str) -> String {
    let marker = format!("data-p=\"{pointer}\" data-f=\"");
    let at = html.find(&marker).unwrap_or_else(|| panic!("no cell {pointer} in {html}"));
    let rest = &html[at + marker.len()..];
    let value = &rest[rest.find("data-v=\"").expect("a data-v") + 8..];
    value[..value.find('"').expect("a closing quote")].to_owned()
}

/// The part of the page of the model card whose `data-model` is `escaped`.
fn card<'a>(html: &'a str, escaped: &str) -> &'a str {
    let marker = format!("data-model=\"{escaped}\"");
    let at = html.find(&marker).unwrap_or_else(|| panic!("no card for {escaped}"));
    let rest = &html[at..];
    &rest[..rest.find("</section>").expect("the card's end")]
}

/// The backends table's row of `backend` (a row is `<tr>` ... `</tr>`, after the table's id).
fn backend_row<'a>(html: &'a str, backend: &str) -> &'a str {
    let table = &html[html.find("id=\"backends\"").expect("the backends table")..];
    let rows = &table[table.find("<tbody>").expect("a body")..table.find("</tbody>").unwrap()];
    rows.split("<tr>")
        .find(|row| row.contains(&format!(">{backend}</td>")))
        .unwrap_or_else(|| panic!("no row for {backend} in {rows}"))
}

/// Standard base64 with padding, as CSP hash sources are written.
fn base64(bytes: &[u8]) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = (0..3).fold(0u32, |n, i| n << 8 | u32::from(*chunk.get(i).unwrap_or(&0)));
        for i in 0..4 {
            let c =
                if i <= chunk.len() { ALPHABET[(n >> (18 - 6 * i) & 63) as usize] } else { b'=' };
            out.push(char::from(c));
        }
    }
    out
}

/// The text between `open` and the next `close` (panics unless there is exactly one `open`).
fn only_element<'a>(html: &'a str, open: &str, close: &str) -> &'a str {
    assert_eq!(html.matches(open).count(), 1, "one {open}");
    let start = html.find(open).unwrap() + open.len();
    &html[start..start + html[start..].find(close).expect("its end")]
}

#[test]
fn the_status_page_shows_what_the_debug_endpoints_show() {
    let (a, b) = (Backend::start(), Backend::start());
    a.hold();
    let router = Setup::new()
        .queue("inflight_per_backend", "1")
        .model(M, &[a.address()])
        .model(HOSTILE, &[b.address()])
        .start();
    let mut first = Conn::open(router.addr);
    first.send(&chat_request(M, Some("s1"), false));
    a.wait_holding(1);
    let mut second = Conn::open(router.addr);
    second.send(&chat_request(M, None, false));
    client::wait_queued(router.admin, M, 1);

    let (page, queue, backends) = quiet_page(router.admin);
    assert_eq!(page.status, 200);
    assert_eq!(page.header("content-type"), Some("text/html; charset=utf-8"));
    let html = page.text();

    let m = card(&html, M);
    let entry = queue["models"].as_array().unwrap().iter().find(|e| e["model"] == M).unwrap();
    for pointer in
        ["/queued", "/inflight", "/sessions_tracked", "/depth/normal", "/admitted/normal"]
    {
        assert_eq!(shown(m, pointer), entry.pointer(pointer).unwrap().to_string(), "{pointer}");
    }
    assert_eq!((shown(m, "/queued"), shown(m, "/inflight")), ("1".into(), "1".into()));
    let waiting = entry["oldest_waiting"].as_array().unwrap();
    assert_eq!(waiting.len(), 1, "{entry}");
    assert!(m.contains(&format!(">{}</td>", waiting[0]["id"].as_str().unwrap())), "{m}");

    for backend in backends["backends"].as_array().unwrap() {
        let address = backend["backend"].as_str().unwrap();
        let row = backend_row(&html, address);
        assert_eq!(shown(row, "/inflight"), backend["inflight"].to_string(), "{row}");
        let gate = backend["gates"]["slots"].as_str().unwrap();
        assert_eq!(shown(row, "/gates/slots"), gate, "{row}");
        assert_eq!(shown(row, ""), "up", "{row}");
    }
    assert_eq!(shown(backend_row(&html, &a.address()), "/inflight"), "1");
    assert_eq!(shown(backend_row(&html, &a.address()), "/gates/slots"), "full");
    assert_eq!(shown(backend_row(&html, &b.address()), "/inflight"), "0");

    // The hostile name appears only escaped, as the card's name and in the backends table.
    assert!(!html.contains(HOSTILE), "an unescaped model name");
    card(&html, "&lt;b&gt;&amp;&#39;&quot;x");
    assert!(html.contains(">&lt;b&gt;&amp;&#39;&quot;x</td>"));

    a.release_all();
    assert_eq!(first.response().status, 200);
    assert_eq!(second.response().status, 200);
}

#[test]
fn the_status_page_is_self_contained_under_a_strict_policy() {
    let backend = Backend::start();
    let router = Setup::new().model(M, &[backend.address()]).start();
    let page = client::get(router.admin, "/status");
    assert_eq!(page.status, 200);
    let html = page.text();
    let policy = page.header("content-security-policy").expect("a Content-Security-Policy");
    assert!(policy.contains("default-src 'none'"), "{policy}");
    assert!(!policy.contains("unsafe-inline") && !policy.contains('*'), "{policy}");

    // The one inline script and the one style sheet are exactly those the policy admits.
    let script = only_element(&html, "<script>", "</script>");
    let style = only_element(&html, "<style>", "</style>");
    let digest = |text: &str| format!("'sha256-{}'", base64(&Sha256::digest(text.as_bytes())));
    assert!(policy.contains(&format!("script-src {}", digest(script))), "{policy}");
    assert!(policy.contains(&format!("style-src {}", digest(style))), "{policy}");
    assert_eq!(html.matches("<script").count(), 1);
    assert!(!html.contains("<link") && !html.contains("@import") && !html.contains("url("));

    // Every src or href is a path on this listener: no scheme, no other host.
    for attribute in ["src=", "href="] {
        for (at, _) in html.match_indices(attribute) {
            let value = html[at + attribute.len()..].trim_start_matches(['"', '\'']);
            assert!(value.starts_with('/') && !value.starts_with("//"), "{attribute}{value:.40}");
        }
    }
    assert!(html.contains("<noscript>"), "a refresh without JavaScript");
}

#[test]
fn the_oldest_waiting_requests_are_bounded_and_oldest_first() {
    let backend = Backend::start();
    backend.hold();
    let router =
        Setup::new().queue("inflight_per_backend", "1").model(M, &[backend.address()]).start();
    let mut conns: Vec<Conn> = Vec::new();
    for i in 0..13 {
        let mut conn = Conn::open(router.addr);
        conn.send(&chat_request(M, Some(&format!("s{i}")), false));
        conns.push(conn);
        if i == 0 {
            backend.wait_holding(1);
        }
    }
    client::wait_queued(router.admin, M, 12);
    let entry = client::model_queue(router.admin, M);
    let waiting = entry["oldest_waiting"].as_array().unwrap();
    assert_eq!((waiting.len(), entry["oldest_waiting_max"].as_u64()), (10, Some(10)), "{entry}");
    let waits: Vec<f64> = waiting.iter().map(|w| w["wait_ms"].as_f64().unwrap()).collect();
    assert!(waits.windows(2).all(|pair| pair[0] >= pair[1]), "oldest first: {waits:?}");
    assert!(waiting.iter().all(|w| w["lane"] == "normal" && w["session"] == true), "{entry}");

    let html = client::get(router.admin, "/status").text();
    let table = card(&html, M);
    let table = &table[table.find("class=\"waiting\"").unwrap()..];
    assert_eq!(table.matches("<tr>").count(), 11, "a heading and 10 rows: {table}");

    backend.release_all();
    for mut conn in conns {
        assert_eq!(conn.response().status, 200);
    }
}

#[test]
fn the_main_listener_does_not_serve_the_status_page() {
    let backend = Backend::start();
    let router = Setup::new().model(M, &[backend.address()]).start();
    let status = client::get(router.addr, "/status");
    let unknown = client::get(router.addr, "/no-such-page");
    assert_eq!(status.status, 404);
    assert_eq!((status.status, status.json()), (unknown.status, unknown.json()));
    assert_eq!(client::get(router.admin, "/status").status, 200);
}
