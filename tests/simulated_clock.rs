//! The dataplane on a simulated clock (issue [9]): `server::start` takes its `Clock`, and what
//! the router measures and decides by time follows that clock, not the time it really takes.
//! ARCHITECTURE.md ("Time") lists what runs on the given clock and what stays real.

mod support;

use support::backend::Backend;
use support::client::{self, chat_request, Conn};
use support::ledger::Ledger;
use support::router::Setup;
use warmpath::clock::Clock;

const M: &str = "m";

/// A queued request times out when the simulated clock passes its deadline, and not before,
/// however long it really waits; an admitted request reports, in `x-warmpath-queue-wait-us`
/// and in the queue-wait histogram, exactly the simulated time it waited. No outcome depends
/// on real time: each step waits for an event (a request held, a queue count, a response).
#[test]
fn queue_deadlines_and_waits_follow_a_simulated_clock() {
    let (clock, sim) = Clock::simulated();
    let backend = Backend::start();
    backend.hold();
    let router = Setup::new()
        .model(M, &[backend.address()])
        .queue("inflight_per_backend", "1")
        .queue("timeout", "60s")
        .server("debug_headers", "true")
        .start_on(clock);
    let mut ledger = Ledger::new();

    // At 0 s: the occupant takes the only slot, the second request queues (deadline 60 s:
    // longer than any wait of this test, so on the real clock it would never time out here).
    let mut occupant = Conn::open(router.addr);
    occupant.send(&chat_request(M, None, false));
    ledger.sent();
    backend.wait_holding(1);
    let mut late = Conn::open(router.addr);
    late.send(&chat_request(M, None, false));
    ledger.sent();
    client::wait_queued(router.admin, M, 1);

    // At 59.999 s a third request arrives. The scheduler handles its arrival at 59.999 s,
    // firing every deadline due by then first: with two queued, the first one's has not fired.
    sim.set(59_999_000_000);
    router.wake();
    let mut third = Conn::open(router.addr);
    third.send(&chat_request(M, None, false));
    ledger.sent();
    client::wait_queued(router.admin, M, 2);

    // At 60.001 s (the deadline, plus the wheel's 1 ms resolution) the first queued request is
    // answered 504; the third (deadline 119.999 s) still waits.
    sim.set(60_001_000_000);
    router.wake();
    let response = late.response();
    ledger.answered(response.status);
    response.assert_error(504, "queue_timeout");
    client::wait_queued(router.admin, M, 1);

    // The occupant ends at 60.001 s; the third request is admitted then, after 2 ms in the
    // queue by the simulated clock.
    backend.release_all();
    let response = occupant.response();
    ledger.answered(response.status);
    assert_eq!(response.status, 200);
    let response = third.response();
    ledger.answered(response.status);
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(response.header("x-warmpath-queue-wait-us"), Some("2000"));
    let labels = [("model", M), ("lane", "normal")];
    let count = "warmpath_queue_wait_seconds_count";
    client::wait_metric(router.admin, count, &labels, |n| n == 2.0);
    let text = client::metrics(router.admin);
    let sum = client::metric(&text, "warmpath_queue_wait_seconds_sum", &labels).expect("a sum");
    assert!((sum - 0.002).abs() < 1e-9, "queue waits 0 s and 2 ms, summed: {sum}");
    let bucket = |le: &str| {
        let labels = [("model", M), ("lane", "normal"), ("le", le)];
        client::metric(&text, "warmpath_queue_wait_seconds_bucket", &labels)
    };
    assert_eq!(bucket("0.001"), Some(1.0), "the occupant waited 0 s");
    assert_eq!(bucket("0.0025"), Some(2.0), "the third request waited 2 ms");
    drop((occupant, late, third));
    ledger.settle(router.admin);
    router.stop();
}
