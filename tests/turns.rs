//! Turn-indexed observability end to end (issue [10], SPEC section 10): a session's turns 1 to
//! 5 through the router and a fake backend land in `warmpath_ttft_seconds` and
//! `warmpath_queue_wait_by_turn_seconds` under `turn="1"`, `"2"`, `"3-4"` and `"5-8"`, with the
//! prefix predicted at admission (by the prefix index for prompts of several blocks, by
//! affinity for shorter ones); `warmpath_sessions_active` counts the sessions while turns are
//! in flight and returns to 0 after. Waits are for the router's own state, never for a fixed
//! time.

mod support;

use support::backend::Backend;
use support::client::{self, chat_request, metric, wait_metric};
use support::router::{Router, Setup};

const M: &str = "m";

/// One model on one fake backend. Its prompts ("hi") are shorter than a prefix block, so the
/// prediction falls back to affinity: a follow-up admitted to its session's last backend is
/// warm, a first turn cold.
fn start(backend: &Backend) -> Router {
    Setup::new().model(M, &[backend.address()]).start()
}

/// The `_count` of a histogram family's series with `labels` in the scrape `text` (0 if none).
fn count(text: &str, family: &str, labels: &[(&str, &str)]) -> f64 {
    let labels: Vec<(&str, &str)> =
        [("model", M)].into_iter().chain(labels.iter().copied()).collect();
    metric(text, &format!("{family}_count"), &labels).unwrap_or(0.0)
}

#[test]
fn a_sessions_turns_are_counted_by_turn_depth_and_predicted_prefix() {
    let backend = Backend::start();
    let router = start(&backend);
    for (turn, stream) in (1..=5).zip([false, true, false, true, false]) {
        let response = client::exchange(router.addr, &chat_request(M, Some("conv-1"), stream));
        assert_eq!(response.status, 200, "turn {turn}: {}", response.text());
        // The next turn is a follow-up once this one's completion reached the scheduler.
        client::wait_idle(router.admin, M);
    }
    // A request without a session is turn 1.
    let response = client::exchange(router.addr, &chat_request(M, None, false));
    assert_eq!(response.status, 200, "{}", response.text());
    client::wait_idle(router.admin, M);

    let ttft = "warmpath_ttft_seconds";
    wait_metric(router.admin, &format!("{ttft}_count"), &[("model", M)], |n| n == 6.0);
    let text = client::metrics(router.admin);
    let expected = [
        ("1", "cold", 2.0),
        ("1", "warm", 0.0),
        ("2", "warm", 1.0),
        ("2", "cold", 0.0),
        ("3-4", "warm", 2.0),
        ("3-4", "cold", 0.0),
        ("5-8", "warm", 1.0),
        ("9+", "warm", 0.0),
        ("9+", "cold", 0.0),
    ];
    for (turn, prefix, n) in expected {
        let seen = count(&text, ttft, &[("turn", turn), ("prefix", prefix)]);
        assert_eq!(seen, n, "{ttft} turn={turn} prefix={prefix}:\n{text}");
    }
    let wait = "warmpath_queue_wait_by_turn_seconds";
    for (turn, n) in [("1", 2.0), ("2", 1.0), ("3-4", 2.0), ("5-8", 1.0), ("9+", 0.0)] {
        assert_eq!(count(&text, wait, &[("turn", turn)]), n, "{wait} turn={turn}:\n{text}");
    }
    let active = metric(&text, "warmpath_sessions_active", &[("model", M)]);
    assert_eq!(active, Some(0.0), "no session is active after the turns:\n{text}");
}

#[test]
fn sessions_active_counts_sessions_with_a_request_in_flight() {
    let backend = Backend::start();
    backend.hold();
    let router = start(&backend);
    let senders: Vec<_> = ["a", "a", "b"]
        .into_iter()
        .map(|session| {
            let addr = router.addr;
            std::thread::spawn(move || {
                client::exchange(addr, &chat_request(M, Some(session), false)).status
            })
        })
        .collect();
    let anonymous = {
        let addr = router.addr;
        std::thread::spawn(move || client::exchange(addr, &chat_request(M, None, false)).status)
    };
    backend.wait_holding(4);
    // Two sessions (two requests of "a", one of "b"); the request without one is not counted.
    wait_metric(router.admin, "warmpath_sessions_active", &[("model", M)], |n| n == 2.0);
    assert_eq!(client::model_queue(router.admin, M)["sessions_active"], 2, "/debug/queue");
    backend.release_all();
    for sender in senders {
        assert_eq!(sender.join().expect("a sender"), 200);
    }
    assert_eq!(anonymous.join().expect("a sender"), 200);
    wait_metric(router.admin, "warmpath_sessions_active", &[("model", M)], |n| n == 0.0);
}

/// A chat completion of session `session` (if any) whose user message is `content`.
fn long_chat(session: Option<&str>, content: &str) -> Vec<u8> {
    let body = format!(
        "{{\"model\":\"{M}\",\"messages\":[{{\"role\":\"user\",\"content\":\"{content}\"}}]}}"
    );
    let mut headers = vec![("Content-Type", "application/json")];
    headers.extend(session.map(|s| ("X-Session-ID", s)));
    client::request("POST", "/v1/chat/completions", &headers, body.as_bytes())
}

/// With prompts of several blocks (`prefix-cost`, the default routing, hashes them) the
/// prediction is the prefix index's: a first turn is cold, a follow-up that repeats it warm,
/// and a prompt the index holds is warm even without a session, while a new one is cold.
#[test]
fn the_prefix_index_predicts_warm_and_cold() {
    let backend = Backend::start();
    let router = start(&backend);
    let words = |from: usize, n: usize| -> String {
        (from..from + n).map(|i| format!("word{i}")).collect::<Vec<_>>().join(" ")
    };
    let (first, follow_up) = (words(0, 400), words(0, 440));
    let sends = [
        (Some("conv-1"), first.clone()),
        (Some("conv-1"), follow_up),
        (None, first),
        (None, words(10_000, 400)),
    ];
    for (session, content) in &sends {
        let response = client::exchange(router.addr, &long_chat(*session, content));
        assert_eq!(response.status, 200, "{}", response.text());
        client::wait_idle(router.admin, M);
    }
    let ttft = "warmpath_ttft_seconds";
    wait_metric(router.admin, &format!("{ttft}_count"), &[("model", M)], |n| n == 4.0);
    let text = client::metrics(router.admin);
    for (turn, prefix, n) in [("1", "cold", 2.0), ("1", "warm", 1.0), ("2", "warm", 1.0)] {
        let seen = count(&text, ttft, &[("turn", turn), ("prefix", prefix)]);
        assert_eq!(seen, n, "{ttft} turn={turn} prefix={prefix}:\n{text}");
    }
}
