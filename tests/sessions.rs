//! Session sources end to end (issue [10], SPEC section 10): a request's session identity from a
//! header other than `X-Session-ID`, from OpenAI's `prompt_cache_key` in the body, from a
//! `body:` field the operator names, and the first present source when several are. Each test
//! runs a first turn, waits until the router tracks its session, and checks that the next turn
//! of the same identity is boosted (the session is honoured) and that
//! `x-warmpath-session-source` names the source. Waits are for the router's own state, never
//! for a fixed time.

mod support;

use support::backend::Backend;
use support::client::{self, request, Response};
use support::eventually;
use support::router::{Router, Setup};

const M: &str = "m";

/// A chat completion with `headers` and these extra top-level body `fields` (JSON members).
fn chat(headers: &[(&str, &str)], fields: &str) -> Vec<u8> {
    let body = format!(
        "{{\"model\":\"{M}\",{fields}\"messages\":[{{\"role\":\"user\",\"content\":\"hi\"}}]}}"
    );
    let mut all = vec![("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    request("POST", "/v1/chat/completions", &all, body.as_bytes())
}

/// One model on one fake backend, debug headers on, `queue` keys as given.
fn start(backend: &Backend, queue: &[(&str, &str)]) -> Router {
    let mut setup = Setup::new().model(M, &[backend.address()]).server("debug_headers", "true");
    for (key, value) in queue {
        setup = setup.queue(key, value);
    }
    setup.start()
}

/// Sends `request`, checks its answer, lane and session source.
fn turn(router: &Router, request: &[u8], lane: &str, source: &str) -> Response {
    let response = client::exchange(router.addr, request);
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-warmpath-lane"), Some(lane), "lane");
    assert_eq!(response.header("x-warmpath-session-source"), Some(source), "session source");
    response
}

/// Waits until the router tracks `n` completed sessions (a first turn's completion is reported
/// once its response is flushed).
fn wait_tracked(router: &Router, n: u64) {
    eventually(&format!("{n} tracked sessions"), || {
        client::model_queue(router.admin, M)["sessions_tracked"].as_u64() == Some(n)
    });
}

/// A session header of an agent harness in the default list (Claude Code's), without
/// `X-Session-ID`: the session is honoured and named `header`.
#[test]
fn a_harness_session_header_identifies_the_session() {
    let backend = Backend::start();
    let router = start(&backend, &[]);
    let first = chat(&[("X-Claude-Code-Session-Id", "cc-1")], "");
    turn(&router, &first, "normal", "header");
    wait_tracked(&router, 1);
    turn(&router, &first, "boosted", "header");
    // Another harness's header with another id is another session.
    let other = chat(&[("session_id", "codex-1")], "");
    turn(&router, &other, "normal", "header");
    client::wait_idle(router.admin, M);
}

/// OpenAI's `prompt_cache_key` in the body: the session is honoured and named `body`; a
/// request with no identity at all says `none`.
#[test]
fn prompt_cache_key_identifies_the_session() {
    let backend = Backend::start();
    let router = start(&backend, &[]);
    let keyed = chat(&[], "\"prompt_cache_key\":\"conv-7\",");
    turn(&router, &keyed, "normal", "body");
    wait_tracked(&router, 1);
    turn(&router, &keyed, "boosted", "body");
    // Not a string, or no source: no session.
    turn(&router, &chat(&[], "\"prompt_cache_key\":7,"), "normal", "none");
    turn(&router, &chat(&[], ""), "normal", "none");
    // The body reached the backend unchanged.
    assert_eq!(backend.requests()[0].json()["prompt_cache_key"], "conv-7");
    client::wait_idle(router.admin, M);
}

/// A `body:` field the operator names: honoured and named `body`; with the list replaced,
/// `X-Session-ID` is no longer a source.
#[test]
fn a_configured_body_field_identifies_the_session() {
    let backend = Backend::start();
    let router = start(&backend, &[("session_sources", "[\"body:conversation_id\"]")]);
    let turn_of = chat(&[], "\"conversation_id\":\"thread-3\",");
    turn(&router, &turn_of, "normal", "body");
    wait_tracked(&router, 1);
    turn(&router, &turn_of, "boosted", "body");
    turn(&router, &chat(&[("X-Session-ID", "thread-3")], ""), "normal", "none");
    client::wait_idle(router.admin, M);
}

/// Two sources present: the first in the list wins. With the default list, `X-Session-ID`
/// comes before `prompt_cache_key`: the first turn is session `a`, so a turn carrying only
/// `prompt_cache_key: b` is not a follow-up, and one carrying `X-Session-ID: a` (with another
/// key) is. With the order reversed, the body field wins.
#[test]
fn the_first_present_source_wins() {
    let backend = Backend::start();
    let router = start(&backend, &[]);
    let both = chat(&[("X-Session-ID", "a")], "\"prompt_cache_key\":\"b\",");
    turn(&router, &both, "normal", "header");
    wait_tracked(&router, 1);
    turn(&router, &chat(&[], "\"prompt_cache_key\":\"b\","), "normal", "body");
    let header_first = chat(&[("X-Session-ID", "a")], "\"prompt_cache_key\":\"z\",");
    turn(&router, &header_first, "boosted", "header");
    client::wait_idle(router.admin, M);

    let sources = "[\"body:prompt_cache_key\", \"header:X-Session-ID\"]";
    let reversed = start(&backend, &[("session_sources", sources)]);
    turn(&reversed, &both, "normal", "body");
    wait_tracked(&reversed, 1);
    turn(&reversed, &chat(&[("X-Session-ID", "b")], ""), "boosted", "header");
    client::wait_idle(reversed.admin, M);
}

/// `session_sources` changes on a live reload: the next request uses the new list.
#[test]
fn a_reload_changes_the_sources() {
    let backend = Backend::start();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sessions-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(format!("reload-{}.toml", std::process::id()));
    let setup = |sources: &str| {
        Setup::new()
            .model(M, &[backend.address()])
            .server("debug_headers", "true")
            .queue("session_sources", sources)
    };
    let router = setup("[\"header:X-Thread\"]").start_from_file(&path);
    let keyed = chat(&[("X-Thread", "t")], "\"prompt_cache_key\":\"k\",");
    turn(&router, &keyed, "normal", "header");
    std::fs::write(&path, setup("[\"body:prompt_cache_key\"]").toml()).unwrap();
    let reload = request("POST", "/admin/reload", &[], b"");
    assert_eq!(client::exchange(router.admin, &reload).status, 200);
    turn(&router, &keyed, "normal", "body");
    client::wait_idle(router.admin, M);
}

/// Hostile values of the other sources (docs/security.md, "Session sources"): under a header
/// that is not `session_header`, a value with a space or over 256 bytes counts as absent, and so
/// does a body field that is too long, empty or not a string; each request is served (200) with
/// no session. `X-Session-ID` keeps its 400.
#[test]
fn hostile_session_sources_count_as_absent() {
    let backend = Backend::start();
    let router = start(&backend, &[]);
    let long = "x".repeat(257);
    let headers: [(&str, &str); 3] =
        [("session_id", "a b"), ("x-session-affinity", long.as_str()), ("session_id", "\u{ff}")];
    for header in headers {
        turn(&router, &chat(&[header], ""), "normal", "none");
    }
    for field in [format!("\"prompt_cache_key\":\"{long}\","), "\"prompt_cache_key\":\"\",".into()]
    {
        turn(&router, &chat(&[], &field), "normal", "none");
    }
    turn(&router, &chat(&[], "\"prompt_cache_key\":{\"id\":\"k\"},"), "normal", "none");
    let refused = client::exchange(router.addr, &chat(&[("X-Session-ID", "a b")], ""));
    refused.assert_error(400, "invalid_request");
    client::wait_idle(router.admin, M);
}

/// A chat completion of `messages` (role, content) with no identity anywhere.
fn conversation(messages: &[(&str, &str)]) -> Vec<u8> {
    let list: Vec<String> = messages
        .iter()
        .map(|(role, content)| format!("{{\"role\":\"{role}\",\"content\":\"{content}\"}}"))
        .collect();
    let body = format!("{{\"model\":\"{M}\",\"messages\":[{}]}}", list.join(","));
    request(
        "POST",
        "/v1/chat/completions",
        &[("Content-Type", "application/json")],
        body.as_bytes(),
    )
}

/// Issue [10]'s derived sessions: a client that sends no identity but resends its
/// conversation with the answer and a new message is recognised as that conversation's next
/// turn (boosted, `derived` in the debug header and the access log); another conversation with
/// the same system prompt is not; with `derive_sessions = false` nothing is derived.
#[test]
fn a_conversation_without_identity_is_derived() {
    let backend = Backend::start();
    let dir = std::path::PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("sessions-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let log = dir.join(format!("derived-{}.jsonl", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let router = Setup::new()
        .model(M, &[backend.address()])
        .server("debug_headers", "true")
        .server("access_log", log.to_str().unwrap())
        .start();
    let system = ("system", "You are terse.");
    let first = [system, ("user", "What is a prefix cache?")];
    turn(&router, &conversation(&first), "normal", "none");
    wait_tracked(&router, 1);
    let second = [system, first[1], ("assistant", "Reused attention state."), ("user", "And?")];
    turn(&router, &conversation(&second), "boosted", "derived");
    // Same system prompt, another question: a conversation of its own.
    turn(&router, &conversation(&[system, ("user", "What is KV?")]), "normal", "none");
    client::wait_idle(router.admin, M);
    let lines = support::wait_until("three access-log lines", support::PATIENCE, || {
        let text = std::fs::read_to_string(&log).ok()?;
        let lines: Vec<serde_json::Value> =
            text.lines().map(|l| serde_json::from_str(l).expect("a JSON line")).collect();
        (lines.len() >= 3).then_some(lines)
    });
    let sources: Vec<&str> = lines.iter().map(|l| l["session_source"].as_str().unwrap()).collect();
    assert_eq!(sources, ["none", "derived", "none"]);
    assert!(lines[1]["session"].is_null(), "a derived session has no client id: {}", lines[1]);

    let off = start(&backend, &[("derive_sessions", "false")]);
    turn(&off, &conversation(&first), "normal", "none");
    client::wait_idle(off.admin, M);
    turn(&off, &conversation(&second), "normal", "none");
    client::wait_idle(off.admin, M);
}
