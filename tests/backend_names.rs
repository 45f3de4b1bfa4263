//! Backends named by host name (issue-less operations work: what a kubernetes StatefulSet
//! gives, pods that keep their DNS names and change their addresses when they restart): the
//! router follows a name that moves, end to end on loopback, with a test resolver standing in
//! for DNS.

mod support;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use support::backend::Backend;
use support::client::{self, chat_request, Conn};
use support::router::Setup;
use support::wait_until;

/// Where `engine.test:8000` resolves: 127.0.0.1 at this port.
static ENGINE_PORT: AtomicU16 = AtomicU16::new(0);

fn resolver(authority: &str) -> Vec<SocketAddr> {
    match authority {
        "engine.test:8000" => {
            vec![SocketAddr::from(([127, 0, 0, 1], ENGINE_PORT.load(Ordering::Relaxed)))]
        }
        other => warmpath::control::prober::system_resolver(other),
    }
}

fn send(router: &support::router::Router) -> u16 {
    let mut conn = Conn::open(router.addr);
    conn.send(&chat_request("m", None, false));
    conn.response().status
}

/// The engine behind `engine.test:8000` restarts at a new address: connections to the old one
/// are refused, the health checks' next resolution finds the new one, the router re-resolves
/// its backends into a new generation, and requests reach the new engine, with none failed on
/// the way (a request that found the old address refused is retried; the pooled connection to
/// the old engine is closed rather than reused).
#[test]
fn requests_follow_a_backend_whose_name_moves() {
    let old = Backend::start();
    ENGINE_PORT.store(old.addr().port(), Ordering::Relaxed);
    let router = Setup::new()
        .model("m", &["engine.test:8000".to_owned()])
        .upstream("metrics_interval", "100ms")
        .start_with_resolver(resolver);
    assert_eq!(send(&router), 200);
    assert_eq!(old.request_count(), 1);

    let new = Backend::start();
    ENGINE_PORT.store(new.addr().port(), Ordering::Relaxed);
    old.stop_listening();
    wait_until("a request reaches the new address", Duration::from_secs(10), || {
        assert_eq!(send(&router), 200, "no request fails while the name moves");
        (new.request_count() > 0).then_some(())
    });
    let before = old.request_count();
    for _ in 0..5 {
        assert_eq!(send(&router), 200);
    }
    assert_eq!(old.request_count(), before, "nothing goes to the old address any more");
    let metrics = client::metrics(router.admin);
    let generation = client::metric(&metrics, "warmpath_config_generation", &[]);
    assert_eq!(generation, Some(2.0), "one generation with the new address");
    // The engine at the new address is another one, which exports no counters
    // (`engine = "openai"`): the move itself says so, once.
    let labels = [("model", "m"), ("backend", "engine.test:8000")];
    client::wait_metric(router.admin, "warmpath_backend_restarts_total", &labels, |n| n == 1.0);
}
