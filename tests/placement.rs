//! S16 end to end: `routing = "prefix-cost"` through the dataplane, with two fake backends.
//! The shard hashes each prompt, the scheduler places it where its prefix was sent, and the
//! metrics say so.

mod support;

use support::backend::Backend;
use support::client::{self, request, Conn};
use support::router::Setup;

const M: &str = "m";

/// A chat body: a shared system prompt (`system` repeated) and a user message.
fn chat(system: &str, user: &str, session: Option<&str>) -> Vec<u8> {
    chat_body(system, user, session, false)
}

/// [`chat`], streamed: held by the backend before its first byte, it is prefill backlog, not a
/// sequence the engine decodes (which S16's cost weighs at least `DECODE_WEIGHT_MIN` tokens,
/// more than the fake backend's five-token prompts make any prefix worth).
fn chat_streamed(system: &str, user: &str) -> Vec<u8> {
    chat_body(system, user, None, true)
}

fn chat_body(system: &str, user: &str, session: Option<&str>, stream: bool) -> Vec<u8> {
    let body = serde_json::json!({
        "model": M,
        "stream": stream,
        "messages": [
            {"role": "system", "content": system.repeat(40)},
            {"role": "user", "content": user},
        ],
    })
    .to_string();
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(session) = session {
        headers.push(("X-Session-ID", session));
    }
    request("POST", "/v1/chat/completions", &headers, body.as_bytes())
}

#[test]
fn requests_go_where_their_prefix_was_sent_and_others_where_the_load_is_lowest() {
    let (x, y) = (Backend::start(), Backend::start());
    let router = Setup::new()
        .model(M, &[x.address(), y.address()])
        .model_key("routing", "\"prefix-cost\"")
        .server("debug_headers", "true")
        .start();
    let system = "You answer questions about the warmpath router, briefly and exactly. ";
    let first = client::exchange(router.addr, &chat(system, "What is S16?", Some("a")));
    assert_eq!(first.status, 200);
    let home = first.header("x-warmpath-backend").expect("a backend header").to_owned();
    let (home_backend, other) = if home == x.address() { (&x, &y) } else { (&y, &x) };

    // The home backend gets busier: a held request with the same system prompt goes there.
    home_backend.hold();
    let mut held = Conn::open(router.addr);
    held.send(&chat_streamed(system, "Hold this one."));
    home_backend.wait_holding(1);
    // Least-inflight would pick the idle backend; the shared prefix wins.
    let mut second = Conn::open(router.addr);
    second.send(&chat(system, "And S7?", Some("b")));
    home_backend.wait_holding(2);
    assert_eq!(other.request_count(), 0);
    // A prompt sharing nothing costs the same everywhere: it goes to the less loaded backend.
    let unrelated = client::exchange(router.addr, &chat("Something else entirely. ", "x", None));
    assert_eq!(unrelated.status, 200);
    assert_eq!(unrelated.header("x-warmpath-backend"), Some(other.address().as_str()));
    home_backend.release_all();
    assert_eq!(held.response().status, 200);
    assert_eq!(second.response().status, 200);

    let metrics = client::get(router.admin, "/metrics").text();
    let line = |name: &str| {
        metrics
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("{name} missing from\n{metrics}"))
            .rsplit(' ')
            .next()
            .and_then(|v| v.parse::<f64>().ok())
            .expect("a value")
    };
    let home_label = format!("warmpath_prefix_index_blocks{{model=\"{M}\",backend=\"{home}\"}}");
    assert!(line(&home_label) > 0.0, "the home backend's index holds the prompt");
    assert_eq!(line(&format!("warmpath_prefix_match_ratio_count{{model=\"{M}\"}}")), 4.0);
    // The two requests that found their prefix matched most of it.
    assert_eq!(
        line(&format!("warmpath_prefix_match_ratio_bucket{{model=\"{M}\",le=\"0.5\"}}")),
        2.0
    );
    assert_eq!(line(&format!("warmpath_placement_waits_total{{model=\"{M}\"}}")), 0.0);
    assert_eq!(line(&format!("warmpath_prefix_copies_total{{model=\"{M}\"}}")), 0.0);
    eventually_idle(&router);
}

#[test]
fn an_engine_restart_empties_its_prefix_index_and_placement_stops_counting_on_it() {
    let (x, y) = (Backend::start(), Backend::start());
    for backend in [&x, &y] {
        backend.set_prefix_counters(900_000, 300_000);
    }
    let router = Setup::new()
        .model(M, &[x.address(), y.address()])
        .model_key("routing", "\"prefix-cost\"")
        .model_key("engine", "vllm")
        .server("debug_headers", "true")
        .start();
    // Two scrapes each: the router holds both engines' counters.
    support::eventually("two scrapes of each backend", || x.scrapes() >= 2 && y.scrapes() >= 2);
    let system = "Summarise the operator's runbook for an engine restart, step by step. ";
    let first = client::exchange(router.addr, &chat(system, "Step one?", Some("a")));
    assert_eq!(first.status, 200);
    let home = first.header("x-warmpath-backend").expect("a backend header").to_owned();
    let (home_backend, other) = if home == x.address() { (&x, &y) } else { (&y, &x) };
    let blocks = [("model", M), ("backend", home.as_str())];
    let index =
        client::metric(&client::metrics(router.admin), "warmpath_prefix_index_blocks", &blocks);
    assert!(index.is_some_and(|n| n > 0.0), "the home backend's index holds the prompt");

    // The home backend gets busier; the shared prefix still wins.
    home_backend.hold();
    let mut held = Conn::open(router.addr);
    held.send(&chat_streamed(system, "Hold this one."));
    home_backend.wait_holding(1);
    let mut second = Conn::open(router.addr);
    second.send(&chat(system, "Step two?", None));
    home_backend.wait_holding(2);
    assert_eq!(other.request_count(), 0);

    // The home engine restarts: its counters start again from zero.
    home_backend.set_prefix_counters(120, 0);
    client::wait_metric(router.admin, "warmpath_backend_restarts_total", &blocks, |n| n == 1.0);
    client::wait_metric(router.admin, "warmpath_prefix_index_blocks", &blocks, |n| n == 0.0);
    // Its cache is gone: the same prefix costs the same on both, and the less loaded backend
    // takes it.
    let third = client::exchange(router.addr, &chat(system, "Step three?", None));
    assert_eq!(third.status, 200);
    assert_eq!(third.header("x-warmpath-backend"), Some(other.address().as_str()));
    let other_labels = [("model", M), ("backend", &other.address()[..])];
    let text = client::metrics(router.admin);
    assert_eq!(client::metric(&text, "warmpath_backend_restarts_total", &other_labels), Some(0.0));
    home_backend.release_all();
    assert_eq!(held.response().status, 200);
    assert_eq!(second.response().status, 200);
    eventually_idle(&router);
}

fn eventually_idle(router: &support::router::Router) {
    support::eventually("queue and inflight back to 0", || {
        let q = client::model_queue(router.admin, M);
        client::queued(router.admin, M) == 0
            && q["backends"].as_array().is_some_and(|b| b.iter().all(|b| b["inflight"] == 0))
    });
}
