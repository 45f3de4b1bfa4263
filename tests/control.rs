//! The control thread's probes against fake backends on loopback: health, vLLM metrics (plain,
//! chunked, oversized, garbage, what the engine says about its caches, a real simulated
//! engine's), a backend that never answers and one that refuses connections, the thread
//! delivering snapshots into a model's inbox, dead backends that do not delay a healthy one's
//! snapshots, a new plan taken while checks are in flight, and a backend's host name that
//! moves.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use socket2::{Domain, Socket, Type};

use warmpath::clock::Clock;
use warmpath::control::probe::{self, ProbeError, ProbeLimits};
use warmpath::control::scrape::{EngineKind, ScrapeLimits};
use warmpath::control::thread::{
    check, ControlSettings, ControlThread, Names, Plan, SharedPlan, Target,
};
use warmpath::ring::{InboxWaker, Ring};
use warmpath::scheduler::{EngineCache, Input};
use warmpath::server::host::Inbox;
use warmpath::sim::SimOptions;

const METRICS: &str = "# HELP vllm:num_requests_waiting Requests waiting.\n\
# TYPE vllm:num_requests_waiting gauge\n\
vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 1.0\n\
vllm:num_requests_waiting{engine=\"1\",model_name=\"m\"} 2.0\n\
vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 7.0\n";

/// A fake backend: answers `connections` connections, each with `respond(path)` (raw bytes; an
/// empty answer means: hold the connection open and say nothing).
fn backend(connections: usize, respond: fn(&str) -> Vec<u8>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    let addr = listener.local_addr().unwrap().to_string();
    std::thread::spawn(move || {
        for stream in listener.incoming().take(connections) {
            let mut stream = stream.unwrap();
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && stream.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let text = String::from_utf8_lossy(&head).into_owned();
            let path = text.split(' ').nth(1).unwrap_or("").to_owned();
            let answer = respond(&path);
            if answer.is_empty() {
                std::thread::sleep(Duration::from_secs(3));
            } else {
                let _ = stream.write_all(&answer);
            }
        }
    });
    addr
}

fn ok(body: &str) -> Vec<u8> {
    format!("HTTP/1.1 200 OK\r\nContent-Length: {}\r\n\r\n{body}", body.len()).into_bytes()
}

fn settings() -> ControlSettings {
    ControlSettings {
        interval: Duration::from_millis(50),
        health_path: "/health".into(),
        probe: ProbeLimits {
            connect_timeout: Duration::from_millis(500),
            exchange_timeout: Duration::from_millis(500),
            head_bytes_max: 16 << 10,
            body_bytes_max: 1 << 20,
        },
        scrape: ScrapeLimits::default(),
    }
}

fn target(addr: String) -> Target {
    let inbox: Arc<Inbox> = Arc::new(Ring::new(16, InboxWaker::default()));
    Target { inbox, backend: 3, addr, resolved: None, engine: Some(EngineKind::Vllm), key: None }
}

fn snapshot(respond: fn(&str) -> Vec<u8>, connections: usize) -> warmpath::scheduler::Snapshot {
    let addr = backend(connections, respond);
    check(&target(addr), &settings(), &Clock::real()).expect("a poll")
}

#[test]
fn healthy_backend_reports_its_summed_waiting_gauge() {
    let snap = snapshot(|path| if path == "/health" { ok("") } else { ok(METRICS) }, 2);
    assert!(snap.healthy);
    assert_eq!(snap.waiting, Some(3));
}

const VLLM_CACHE: &str = "vllm:num_requests_waiting{engine=\"0\",model_name=\"m\"} 2.0\n\
vllm:cache_config_info{block_size=\"16\",engine=\"0\",num_gpu_blocks=\"1000\"} 1.0\n\
vllm:prefix_cache_queries_total{engine=\"0\",model_name=\"m\"} 5000.0\n\
vllm:prefix_cache_hits_total{engine=\"0\",model_name=\"m\"} 1250.0\n\
vllm:num_preemptions_total{engine=\"0\",model_name=\"m\"} 7.0\n\
vllm:kv_cache_usage_perc{engine=\"0\",model_name=\"m\"} 0.375\n";

#[test]
fn snapshots_carry_what_the_engine_says_about_its_caches() {
    let snap = snapshot(|path| if path == "/health" { ok("") } else { ok(VLLM_CACHE) }, 2);
    assert_eq!((snap.healthy, snap.waiting), (true, Some(2)));
    let cache = EngineCache {
        kv_capacity_tokens: 16_000,
        prefix_queries: 5000,
        prefix_hits: 1250,
        preemptions: 7,
        kv_usage_micro: 375_000,
        itl_ticks: EngineCache::NO_COUNTER,
        itl_count: EngineCache::NO_COUNTER,
    };
    assert_eq!(snap.cache, cache);
    // A strange info gauge loses the capacity, not the waiting gauge or the counters.
    let snap = snapshot(
        |path| match path {
            "/health" => ok(""),
            _ => ok(&VLLM_CACHE.replace("num_gpu_blocks=\"1000\"", "num_gpu_blocks=\"None\"")),
        },
        2,
    );
    assert_eq!((snap.healthy, snap.waiting), (true, Some(2)));
    assert_eq!(snap.cache, EngineCache { kv_capacity_tokens: 0, ..cache });
    // Metrics that fail to parse: nothing known.
    let snap = snapshot(
        |path| if path == "/health" { ok("") } else { ok("vllm:num_requests_waiting x") },
        2,
    );
    assert_eq!((snap.waiting, snap.cache), (None, EngineCache::UNKNOWN));
}

#[test]
fn the_router_learns_the_kv_capacity_of_a_simulated_engine() {
    let options = SimOptions { time_scale: 100.0, ..SimOptions::new() };
    let params = options.params;
    let sim = warmpath::sim::start(options).expect("the sim starts");
    let snap = check(&target(sim.addr().to_string()), &settings(), &Clock::real()).expect("a poll");
    sim.stop();
    assert_eq!((snap.healthy, snap.waiting), (true, Some(0)));
    let capacity = params.kv_blocks * params.block_size;
    // An idle engine: nothing in its KV cache.
    let cache = EngineCache {
        kv_capacity_tokens: capacity,
        prefix_queries: 0,
        prefix_hits: 0,
        preemptions: 0,
        kv_usage_micro: 0,
        // Nothing decoded yet: the histogram is exported, empty.
        itl_ticks: 0,
        itl_count: 0,
    };
    assert_eq!(snap.cache, cache);
}

#[test]
fn failed_health_check_is_unhealthy_and_not_scraped() {
    let snap =
        snapshot(|_| b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n".to_vec(), 1);
    assert!(!snap.healthy);
    assert_eq!(snap.waiting, None);
}

#[test]
fn chunked_metrics_are_decoded() {
    let snap = snapshot(
        |path| {
            if path == "/health" {
                return ok("");
            }
            let (a, b) = METRICS.split_at(40);
            format!(
                "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n{:x}\r\n{a}\r\n{:x}\r\n{b}\r\n0\r\n\r\n",
                a.len(),
                b.len()
            )
            .into_bytes()
        },
        2,
    );
    assert_eq!((snap.healthy, snap.waiting), (true, Some(3)));
}

#[test]
fn oversized_or_garbage_metrics_leave_the_gauge_unknown() {
    let huge = snapshot(
        |path| {
            if path == "/health" {
                ok("")
            } else {
                b"HTTP/1.1 200 OK\r\nContent-Length: 10485760\r\n\r\nvllm:".to_vec()
            }
        },
        2,
    );
    assert_eq!((huge.healthy, huge.waiting), (true, None));
    let garbage =
        snapshot(|path| if path == "/health" { ok("") } else { ok("{not prometheus") }, 2);
    assert_eq!((garbage.healthy, garbage.waiting), (true, None));
}

#[test]
fn silent_and_refusing_backends_are_unhealthy_within_the_timeouts() {
    let clock = Clock::real();
    let start = clock.now();
    let silent = snapshot(|_| Vec::new(), 1);
    let elapsed = clock.rate().duration(clock.now() - start);
    assert!(!silent.healthy);
    assert!(elapsed < Duration::from_secs(2), "took {elapsed:?}");
    // A port nobody listens on: bind, learn the port, close.
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let refused = check(&target(format!("127.0.0.1:{port}")), &settings(), &clock).expect("a poll");
    assert!(!refused.healthy);
    let err =
        probe::get(&format!("127.0.0.1:{port}"), "/", &settings().probe, &clock, &mut Vec::new());
    assert!(matches!(err, Err(ProbeError::Connect(_))), "{err:?}");
}

#[test]
fn the_thread_delivers_snapshots_into_the_inbox() {
    let addr = backend(1000, |path| if path == "/health" { ok("") } else { ok(METRICS) });
    let target = target(addr);
    let inbox = Arc::clone(&target.inbox);
    if let InboxWaker::Thread(waker) = inbox.waker() {
        waker.register();
    }
    let thread = ControlThread::spawn(vec![target], settings(), Clock::real()).expect("spawn");
    let clock = Clock::real();
    let start = clock.now();
    let mut seen = 0;
    while seen < 2 {
        assert!(
            clock.rate().duration(clock.now() - start) < Duration::from_secs(10),
            "no snapshot"
        );
        if let Some(input) = inbox.pop() {
            let Input::Snapshot { backend, snapshot } = input else { panic!("{input:?}") };
            assert_eq!((backend, snapshot.healthy, snapshot.waiting), (3, true, Some(3)));
            seen += 1;
        } else if inbox.prepare_sleep() {
            std::thread::park_timeout(Duration::from_millis(20));
        }
        inbox.woke();
    }
    assert_eq!(thread.stop(), 0, "no snapshot dropped");
}

/// A listener on loopback whose accept queue is full and never drained, with the connections
/// that fill it: Linux drops the SYNs of further connects, so they hang until the caller's
/// connect timeout, as to a host that is down.
fn blackhole() -> (Socket, Vec<TcpStream>, String) {
    let socket = Socket::new(Domain::IPV4, Type::STREAM, None).expect("a socket");
    socket.bind(&SocketAddr::from(([127, 0, 0, 1], 0)).into()).expect("bind loopback");
    socket.listen(0).expect("listen");
    let addr = socket.local_addr().unwrap().as_socket().expect("an IPv4 address");
    let mut fillers = Vec::new();
    for _ in 0..16 {
        match TcpStream::connect_timeout(&addr, Duration::from_millis(200)) {
            Ok(stream) => fillers.push(stream),
            Err(_) => return (socket, fillers, addr.to_string()),
        }
    }
    panic!("the accept queue of {addr} does not fill");
}

/// Issue [9]: with blocking probes one after another, each dead backend cost `connect_timeout`
/// per round, so two of them kept every healthy backend's gauges stale. Checked concurrently,
/// the healthy backend reports every interval while the dead ones hang, and each dead one
/// reports unhealthy when its own deadline passes: the blackholes at `connect_timeout`, the
/// backend that accepts and never answers at `exchange_timeout`.
#[test]
fn dead_backends_do_not_delay_a_healthy_ones_snapshots() {
    const STALE_AFTER: Duration = Duration::from_secs(1);
    let connect_timeout = Duration::from_secs(3);
    let (_hole_a, _filled_a, dead_a) = blackhole();
    let (_hole_b, _filled_b, dead_b) = blackhole();
    let silent = backend(1000, |_| Vec::new());
    let healthy = backend(1000, |path| if path == "/health" { ok("") } else { ok(METRICS) });
    let inbox: Arc<Inbox> = Arc::new(Ring::new(1024, InboxWaker::default()));
    if let InboxWaker::Thread(waker) = inbox.waker() {
        waker.register();
    }
    let targets = (0u16..).zip([dead_a, dead_b, silent, healthy]).map(|(backend, addr)| Target {
        inbox: Arc::clone(&inbox),
        backend,
        addr,
        resolved: None,
        engine: Some(EngineKind::Vllm),
        key: None,
    });
    let mut settings = settings();
    settings.interval = Duration::from_millis(100);
    settings.probe.connect_timeout = connect_timeout;
    settings.probe.exchange_timeout = Duration::from_millis(100);
    let clock = Clock::real();
    let start = clock.now();
    let thread = ControlThread::spawn(targets.collect(), settings, clock.clone()).expect("spawn");
    let since_start = |tick| clock.rate().duration(tick - start);
    // Until both blackholes have reported once, and for at least connect_timeout.
    let mut dead_reports = [None, None];
    let mut silent_reports = Vec::new();
    let mut healthy_reports = Vec::new();
    while dead_reports.contains(&None) {
        assert!(since_start(clock.now()) < Duration::from_secs(10), "no report from the dead");
        let Some(input) = inbox.pop() else {
            if inbox.prepare_sleep() {
                std::thread::park_timeout(Duration::from_millis(20));
            }
            inbox.woke();
            continue;
        };
        let Input::Snapshot { backend, snapshot } = input else { panic!("{input:?}") };
        let at = since_start(snapshot.scraped_at);
        match backend {
            0 | 1 => {
                assert!(!snapshot.healthy && snapshot.waiting.is_none(), "{snapshot:?}");
                dead_reports[usize::from(backend)].get_or_insert(at);
            }
            2 => {
                assert!(!snapshot.healthy && snapshot.waiting.is_none(), "{snapshot:?}");
                silent_reports.push(at);
            }
            _ => {
                assert_eq!((snapshot.healthy, snapshot.waiting), (true, Some(3)), "{snapshot:?}");
                healthy_reports.push(at);
            }
        }
    }
    assert_eq!(thread.stop(), 0, "no snapshot dropped");
    for at in dead_reports.into_iter().flatten() {
        let late = connect_timeout + Duration::from_secs(1);
        assert!(at >= connect_timeout && at < late, "a dead backend reported at {at:?}");
    }
    let first_silent = silent_reports.first().expect("the silent backend reported");
    assert!(*first_silent < Duration::from_secs(1), "the silent backend at {first_silent:?}");
    // Every interval, and never a gap in which its gauge would have gone stale.
    assert!(healthy_reports.len() >= 10, "{} healthy reports", healthy_reports.len());
    let mut last = Duration::ZERO;
    for &at in &healthy_reports {
        assert!(at - last < STALE_AFTER, "a gap from {last:?} to {at:?}: {healthy_reports:?}");
        last = at;
    }
}

/// A live reload replaces the plan while checks are in flight: a kept target (moved to another
/// index) goes on reporting, a new one starts, and a removed one, whose connect was hanging,
/// never reports.
#[test]
fn a_new_plan_keeps_kept_targets_drops_removed_ones_and_adds_new_ones() {
    let (_hole, _filled, dead) = blackhole();
    let respond = |path: &str| if path == "/health" { ok("") } else { ok(METRICS) };
    let (kept, added) = (backend(1000, respond), backend(1000, respond));
    let inbox: Arc<Inbox> = Arc::new(Ring::new(1024, InboxWaker::default()));
    if let InboxWaker::Thread(waker) = inbox.waker() {
        waker.register();
    }
    let target = |backend, addr: &String| Target {
        inbox: Arc::clone(&inbox),
        backend,
        addr: addr.clone(),
        resolved: None,
        engine: Some(EngineKind::Vllm),
        key: None,
    };
    let mut settings = settings();
    settings.probe.connect_timeout = Duration::from_millis(1500);
    let first = Plan { targets: vec![target(0, &dead), target(1, &kept)], settings };
    let plan: SharedPlan = Arc::new(Mutex::new(Arc::new(first.clone())));
    let clock = Clock::real();
    let start = clock.now();
    let names = Names::system();
    let thread = ControlThread::spawn_with_plan(Arc::clone(&plan), clock.clone(), names);
    let thread = thread.expect("spawn");
    let mut reports = [0; 3];
    let mut swapped = false;
    // Past the removed target's connect deadline, with reports from the other two after it.
    while clock.rate().duration(clock.now() - start) < Duration::from_secs(2)
        || reports[1] < 4
        || reports[2] < 2
    {
        assert!(
            clock.rate().duration(clock.now() - start) < Duration::from_secs(10),
            "{reports:?}"
        );
        if let Some(input) = inbox.pop() {
            let Input::Snapshot { backend, snapshot } = input else { panic!("{input:?}") };
            assert!(snapshot.healthy, "backend {backend}: {snapshot:?}");
            reports[usize::from(backend)] += 1;
        } else if inbox.prepare_sleep() {
            std::thread::park_timeout(Duration::from_millis(20));
        }
        inbox.woke();
        if !swapped && reports[1] >= 2 {
            let targets = vec![target(1, &kept), target(2, &added)];
            let next = Plan { targets, settings: first.settings.clone() };
            *plan.lock().unwrap() = Arc::new(next);
            swapped = true;
        }
    }
    assert_eq!(thread.stop(), 0, "no snapshot dropped");
    assert_eq!(reports[0], 0, "the removed blackhole reported");
}

/// Where the test resolver sends `engine.test:80`.
static ENGINE_PORT: std::sync::atomic::AtomicU16 = std::sync::atomic::AtomicU16::new(0);

/// `engine.test:80` resolves to 127.0.0.1 at [`ENGINE_PORT`]; `slow.test:80` to nothing after
/// 3 s (a DNS server that hangs); nothing else resolves.
fn test_resolver(authority: &str) -> Vec<SocketAddr> {
    let port = ENGINE_PORT.load(std::sync::atomic::Ordering::Relaxed);
    match authority {
        "engine.test:80" => vec![SocketAddr::from(([127, 0, 0, 1], port))],
        "slow.test:80" => {
            std::thread::sleep(Duration::from_secs(3));
            Vec::new()
        }
        _ => Vec::new(),
    }
}

/// A lookup that hangs holds no check: the other backend's snapshots keep coming every
/// interval (50 ms) while the name's lookup waits on its own thread.
#[test]
fn a_hung_name_lookup_delays_no_check() {
    use warmpath::control::prober::Prober;
    let healthy = backend(100, |_| ok("")).parse::<SocketAddr>().unwrap();
    let inbox: Arc<Inbox> = Arc::new(Ring::new(16, InboxWaker::default()));
    let target = |backend, addr: &str| Target {
        inbox: Arc::clone(&inbox),
        backend,
        addr: addr.to_owned(),
        resolved: Some(healthy),
        engine: None,
        key: None,
    };
    let targets = vec![target(0, "slow.test:80"), target(1, &healthy.to_string())];
    let plan = Arc::new(Plan { targets, settings: settings() });
    let clock = Clock::real();
    let mut prober = Prober::new(plan, clock.rate(), clock.now()).expect("a prober");
    prober.set_resolver(test_resolver);
    let end = clock.now() + clock.rate().ticks(Duration::from_secs(1));
    let mut checks = 0;
    while clock.now() < end {
        prober.turn(&clock, &mut |t, _| checks += usize::from(t.backend == 1));
    }
    assert!(prober.names_pending(), "the slow lookup is still out");
    assert!(checks >= 5, "{checks} checks of the other backend in a second of a hung lookup");
}

/// A target that carries the dataplane's address is probed there, and its host name is
/// watched: while it resolves to that address nothing has moved; once it resolves elsewhere
/// (the engine's pod came back with a new IP), the prober says so once the lookup a check asks
/// for (the first, or one after a failed connect) is answered. An IP address is never
/// resolved.
#[test]
fn a_host_name_that_resolves_elsewhere_is_reported_moved() {
    use warmpath::control::prober::Prober;
    let healthy = backend(8, |_| ok("")).parse::<SocketAddr>().unwrap();
    let inbox: Arc<Inbox> = Arc::new(Ring::new(16, InboxWaker::default()));
    let clock = Clock::real();
    let run = |addr: &str, resolved: SocketAddr| {
        let target = Target {
            inbox: Arc::clone(&inbox),
            backend: 0,
            addr: addr.to_owned(),
            resolved: Some(resolved),
            engine: None,
            key: None,
        };
        let plan = Arc::new(Plan { targets: vec![target], settings: settings() });
        let mut prober = Prober::new(plan, clock.rate(), clock.now()).expect("a prober");
        prober.set_resolver(test_resolver);
        // The name is looked up on the resolver thread; its answer is read at a turn.
        let mut healthy = None;
        while healthy.is_none() || prober.names_pending() {
            prober.turn(&clock, &mut |_, snapshot| healthy = healthy.or(Some(snapshot.healthy)));
        }
        (healthy.expect("a check"), prober.take_moved())
    };
    ENGINE_PORT.store(healthy.port(), std::sync::atomic::Ordering::Relaxed);
    assert_eq!(run("engine.test:80", healthy), (true, false), "resolves where it is probed");
    ENGINE_PORT.store(1, std::sync::atomic::Ordering::Relaxed);
    let moved = run("engine.test:80", healthy);
    assert_eq!(moved, (true, true), "probed where the dataplane sends; the name moved");
    let refused = SocketAddr::from(([127, 0, 0, 1], 1));
    assert_eq!(run("127.0.0.1:1", refused), (false, false), "an address is not resolved");
    assert_eq!(run("nowhere.test:80", refused), (false, false), "resolves to nothing: kept");
}
