//! The router out of file descriptors: `warmpath serve` under a 64-descriptor limit it cannot
//! raise, with more clients than descriptors. `accept` fails (EMFILE) and the connections it
//! could not take wait in the kernel's listen queue, which announces nothing more to an
//! edge-triggered listener; once clients leave, the waiting connections must be accepted
//! without a new connection arriving to wake the listener, and the failures counted. A request
//! that comes while no descriptor is left for its upstream connection is answered 503, and the
//! backend, which did nothing wrong, is not blamed for it. Nor is it by a health check the
//! router cannot open then: the backend stays in service. The admin listener answers
//! throughout, from the descriptor it keeps in reserve.
//!
//! How many of the clients the router takes depends on how many descriptors it inherits (a test
//! harness or CI runner may leave some open): the test holds no more clients open than any
//! count of those leaves room for. (It once kept half the clients and needed 51 of the 64; two
//! inherited descriptors made it fail.)

mod support;

use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use support::backend::Backend;
use support::client::{self, chat_request, Conn};
use support::router::Setup;
use support::{wait_until, PATIENCE};

const M: &str = "m";
/// The descriptor limit the router runs under (soft and hard: it cannot raise it).
const LIMIT: usize = 64;
/// Client connections opened, well past what the limit lets the router accept.
const CLIENTS: usize = 100;

/// `warmpath serve` under the descriptor limit, one backend for model [`M`], checked every
/// `interval`; its standard error goes to a file beside its configuration, named after `name`.
struct Limited {
    child: Child,
    addr: SocketAddr,
    admin: SocketAddr,
    log: PathBuf,
    _backend: Backend,
}

impl Limited {
    fn start(name: &str, interval: &str) -> Limited {
        let backend = Backend::start();
        let (listen, admin) =
            (support::silent::refusing_address(), support::silent::refusing_address());
        let path = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("{name}.toml"));
        let setup = Setup::new()
            .model(M, &[backend.address()])
            .upstream("metrics_interval", interval)
            .upstream("metrics_stale_after", "60s")
            .server("listen", &listen)
            .server("admin_listen", &admin);
        std::fs::write(&path, setup.toml()).unwrap();
        // Its standard error (the start's warning, the failures' log lines) is kept beside the
        // configuration, for a look after a failure.
        let log = path.with_extension("log");
        let script =
            format!("ulimit -n {LIMIT} && exec \"$0\" serve --config \"$1\" 2>\"$2\" >/dev/null");
        let child = Command::new("sh")
            .args(["-c", &script, env!("CARGO_BIN_EXE_warmpath")])
            .args([path.to_str().unwrap(), log.to_str().unwrap()])
            .stdin(Stdio::null())
            .spawn()
            .expect("sh runs");
        let (addr, admin) = (listen.parse().unwrap(), admin.parse().unwrap());
        wait_until("the router to listen", PATIENCE, || TcpStream::connect(addr).ok());
        wait_until("the router to be ready", PATIENCE, || {
            (client::get(addr, "/readyz").status == 200).then_some(())
        });
        Limited { child, addr, admin, log, _backend: backend }
    }

    /// Stops the router; it exits 0.
    fn stop(mut self) {
        support::signal(&self.child, "TERM");
        let child = &mut self.child;
        let status =
            wait_until("exit after SIGTERM", PATIENCE, || child.try_wait().expect("try_wait"));
        assert_eq!(status.code(), Some(0), "{status:?}");
    }
}

#[test]
fn connections_left_in_the_listen_queue_are_accepted_once_descriptors_free_up() {
    // One health check at start and none during the test: no descriptor comes and goes but the
    // clients'.
    let router = Limited::start("descriptors", "60s");
    let (addr, admin) = (router.addr, router.admin);
    // More clients than descriptors: the router accepts what it can, the rest wait.
    let mut clients: Vec<TcpStream> =
        (0..CLIENTS).map(|_| TcpStream::connect(addr).expect("the kernel queues it")).collect();
    std::thread::sleep(Duration::from_millis(300));
    // A scrape meanwhile: the admin thread serves it with the descriptor it keeps in reserve
    // (without it, the scrape waited for clients to leave whenever the admin thread reached its
    // `accept` after the shard had taken every descriptor: checked with the thread's start
    // delayed 1.5 s, fails without the reserve). Then a second of waiting: the shard retries
    // its `accept` without spinning (a spinning thread takes about 100 ticks a second; a retry
    // on every loop turn fails this, checked). The admin thread's pause after a failed
    // `accept` is for when another thread takes the descriptor it gave back, which this test
    // does not provoke.
    let text = client::metrics(admin);
    assert!(client::metric(&text, "warmpath_accept_errors_total", &[]).is_some_and(|n| n >= 1.0));
    let before = cpu_ticks(router.child.id());
    std::thread::sleep(Duration::from_secs(1));
    let spent = cpu_ticks(router.child.id()) - before;
    assert!(spent < 30, "{spent} ticks of CPU in 1 s while out of descriptors");
    // The first client, which the router took, sends a request: no descriptor is left for the
    // upstream connection (any that came free went to a waiting client within the retry's 100
    // ms). A 503 with Retry-After, not a retry elsewhere or a 502, and not the backend's fault.
    let mut first = Conn::from_stream(clients.remove(0));
    let response = first.exchange(&chat_request(M, None, false));
    assert_eq!(response.status, 503, "{}", response.text());
    assert!(response.text().contains("\"unavailable\""), "{}", response.text());
    assert_eq!(response.header("retry-after"), Some("1"));
    drop(first);
    let text = client::metrics(admin);
    let shortages = client::metric(&text, "warmpath_upstream_socket_errors_total", &[]);
    assert_eq!(shortages, Some(1.0));
    let blamed = client::metric(&text, "warmpath_upstream_errors_total", &[("kind", "connect")]);
    assert_eq!(blamed.unwrap_or(0.0), 0.0, "a local shortage counted against the backend");

    // Every client but the last leaves. The last, never accepted so far, sends a request: no
    // new connection comes to wake the listener, and the backend takes it.
    let last = clients.pop().expect("a client");
    drop(clients);
    let mut conn = Conn::from_stream(last);
    let response = conn.exchange(&chat_request(M, None, false));
    assert_eq!(response.status, 200, "{}", response.text());

    // The admin listener serves again too.
    let text = client::metrics(admin);
    assert!(client::metric(&text, "warmpath_accept_errors_total", &[]).is_some_and(|n| n >= 1.0));
    router.stop();
}

/// Health checks the router cannot open for want of descriptors say nothing of the backend:
/// it stays in service. (Counted as failed checks, they took every healthy backend out of
/// service while the router was out of descriptors, and kept them out until the next checks
/// after descriptors freed up: checked, `warmpath_backend_up` 0 before the change.)
#[test]
fn checks_the_router_cannot_open_leave_the_backend_in_service() {
    let router = Limited::start("descriptors-checks", "100ms");
    let (addr, admin) = (router.addr, router.admin);
    let clients: Vec<TcpStream> =
        (0..CLIENTS).map(|_| TcpStream::connect(addr).expect("the kernel queues it")).collect();
    // Checks come due every 100 ms while the clients hold every descriptor; each fails to open
    // its connection, and says so on standard error (once).
    let log = &router.log;
    wait_until("a check to fail for want of descriptors", PATIENCE, || {
        let text = std::fs::read_to_string(log).unwrap_or_default();
        text.contains("cannot open a connection to check").then_some(())
    });
    std::thread::sleep(Duration::from_millis(500));
    let text = client::metrics(admin);
    let up = client::metric(&text, "warmpath_backend_up", &[("model", M)]);
    assert_eq!(up, Some(1.0), "the backend taken out of service by the router's own shortage");
    drop(clients);
    // And a request once the clients have gone is served at once (no check needed first).
    let response = client::exchange(addr, &chat_request(M, None, false));
    assert_eq!(response.status, 200, "{}", response.text());
    router.stop();
}

/// User and system CPU time of process `pid` so far, in clock ticks (`/proc/PID/stat`).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the router's stat");
    // Fields after the command name (which may hold spaces, inside parentheses): utime and
    // stime are the 12th and 13th of them.
    let rest = &stat[stat.rfind(')').expect("a command name") + 2..];
    let fields: Vec<&str> = rest.split(' ').collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}
