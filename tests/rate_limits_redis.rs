//! Issue [11], `rate_limit.store = "redis"` on loopback: two routers sharing one real
//! `redis-server` share a tenant's limit; with Redis refusing connections, or accepting and
//! never answering, requests are still served, limited locally, and the store's metrics say
//! so.
//!
//! The shared-limit test starts Debian's `redis-server` on a free port; where the binary is
//! missing it skips with a message, unless `WARMPATH_REQUIRE_REDIS=1` (set by `.ci/run`) makes
//! that a failure. The routers run on a simulated clock, so their own buckets never refill
//! during a test; Redis's cells follow Redis's clock (`TIME`), which refills a request of
//! `requests_per_minute = 2` only every 30 s, far longer than the test.

mod support;

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::backend::Backend;
use support::client::{self, Conn, Response};
use support::router::{Router, Setup};
use support::silent::{refusing_address, Silent};
use support::{eventually, wait_until, PATIENCE};
use warmpath::clock::Clock;
use warmpath::server::rate_limit::resp::{Connection, RedisUrl, Reply};

const M: &str = "m";
const KEY: &str = "wp_shared-limit-tenant";

/// A `redis-server` child on a free loopback port, killed when dropped.
struct RedisServer {
    child: Child,
    url: String,
}

impl RedisServer {
    /// Starts one and waits until it answers `PING`; `None` (after saying so) where the binary
    /// is missing, unless `WARMPATH_REQUIRE_REDIS=1`.
    fn start() -> Option<RedisServer> {
        let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let spawned = Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--protected-mode", "yes"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn();
        let child = match spawned {
            Ok(child) => child,
            Err(e) if std::env::var("WARMPATH_REQUIRE_REDIS").as_deref() == Ok("1") => {
                panic!("redis-server is required (WARMPATH_REQUIRE_REDIS=1) but: {e}")
            }
            Err(e) => {
                eprintln!(
                    "skipping: redis-server not available ({e}); apt-get install redis-server"
                );
                return None;
            }
        };
        let server = RedisServer { child, url: format!("redis://127.0.0.1:{port}") };
        wait_until("redis-server to answer PING", PATIENCE, || {
            let reply = server.connect().ok()?.command(&[b"PING"]).ok()?;
            (reply == Reply::Simple("PONG".into())).then_some(())
        });
        Some(server)
    }

    fn connect(&self) -> std::io::Result<Connection> {
        Connection::open(&RedisUrl::parse(&self.url).unwrap(), Duration::from_secs(1))
    }

    /// How far ahead of Redis's clock the cell `key` is, in microseconds (0 when absent).
    fn backlog_us(&self, key: &str) -> u64 {
        let mut conn = self.connect().expect("redis answers");
        let tat = match conn.command(&[b"GET", key.as_bytes()]).unwrap() {
            Reply::Bulk(Some(bytes)) => String::from_utf8(bytes).unwrap().parse::<u64>().unwrap(),
            _ => return 0,
        };
        let Reply::Array(Some(time)) = conn.command(&[b"TIME"]).unwrap() else { panic!("TIME") };
        let part = |i: usize| match &time[i] {
            Reply::Bulk(Some(b)) => String::from_utf8(b.clone()).unwrap().parse::<u64>().unwrap(),
            other => panic!("TIME gave {other:?}"),
        };
        tat.saturating_sub(part(0) * 1_000_000 + part(1))
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Tenant `a` with `requests_per_minute = 2` on the Redis store at `url`.
fn setup(backend: &Backend, url: &str) -> Setup {
    Setup::new()
        .model(M, &[backend.address()])
        .tenant("a", &[KEY])
        .tenant_key("requests_per_minute", "2")
        .rate_limit("store", "redis")
        .rate_limit("redis_url", url)
}

fn start(setup: &Setup) -> Router {
    let (clock, sim) = Clock::simulated();
    sim.set(1_000_000_000_000);
    setup.start_on(clock)
}

fn chat() -> Vec<u8> {
    let auth = format!("Bearer {KEY}");
    let headers = [("Content-Type", "application/json"), ("Authorization", auth.as_str())];
    client::request(
        "POST",
        "/v1/chat/completions",
        &headers,
        client::chat_body(M, false).as_bytes(),
    )
}

fn metric(router: &Router, series: &str) -> Option<f64> {
    let text = client::get(router.admin, "/metrics").text();
    text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn assert_limited(response: &Response) {
    response.assert_error(429, "rate_limit_exceeded");
    response.assert_retry_after();
}

/// Router A spends one of the tenant's two requests a minute; once its sync has put that in
/// Redis, router B (started then) has one left, not two.
#[test]
fn two_routers_sharing_one_redis_share_the_limit() {
    let Some(redis) = RedisServer::start() else { return };
    let backend = Backend::start();
    let setup = setup(&backend, &redis.url);
    let a = start(&setup);
    assert_eq!(Conn::open(a.addr).exchange(&chat()).status, 200);
    // One request of two a minute: the global cell is 30 s ahead once A has synced.
    wait_until("A's request in Redis", PATIENCE, || {
        (redis.backlog_us("warmpath:rate:a:requests") > 20_000_000).then_some(())
    });
    let b = start(&setup);
    let mut conn = Conn::open(b.addr);
    assert_eq!(conn.exchange(&chat()).status, 200, "the second of the minute");
    assert_limited(&conn.exchange(&chat()));
    assert_eq!(backend.request_count(), 2);
    for router in [&a, &b] {
        assert_eq!(metric(router, "warmpath_rate_limit_store_up"), Some(1.0));
        assert_eq!(metric(router, "warmpath_rate_limit_store_errors_total"), Some(0.0));
    }
}

/// Redis refusing connections: requests are served and limited by this replica alone, and
/// every failed sync is counted.
#[test]
fn with_redis_down_limits_fall_back_to_local_and_the_metric_counts_it() {
    let backend = Backend::start();
    let router = start(&setup(&backend, &format!("redis://{}", refusing_address())));
    let mut conn = Conn::open(router.addr);
    assert_eq!(conn.exchange(&chat()).status, 200);
    assert_eq!(conn.exchange(&chat()).status, 200);
    assert_limited(&conn.exchange(&chat()));
    eventually("failed syncs to be counted", || {
        metric(&router, "warmpath_rate_limit_store_errors_total").is_some_and(|n| n >= 2.0)
    });
    assert_eq!(metric(&router, "warmpath_rate_limit_store_up"), Some(0.0));
}

/// A "Redis" that accepts and never answers: every sync times out on its own thread while
/// the requests are served and limited locally.
#[test]
fn with_redis_silent_requests_are_served_and_limited_locally() {
    let backend = Backend::start();
    let silent = Silent::start();
    let router = start(&setup(&backend, &format!("redis://{}", silent.address())));
    let mut conn = Conn::open(router.addr);
    assert_eq!(conn.exchange(&chat()).status, 200);
    assert_eq!(conn.exchange(&chat()).status, 200);
    assert_limited(&conn.exchange(&chat()));
    eventually("timed-out syncs to be counted", || {
        metric(&router, "warmpath_rate_limit_store_errors_total").is_some_and(|n| n >= 2.0)
    });
    assert_eq!(metric(&router, "warmpath_rate_limit_store_up"), Some(0.0));
    assert!(silent.held() >= 2, "each sync opened a connection that got no answer");
}
