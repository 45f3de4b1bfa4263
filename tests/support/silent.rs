//! Backends that do not answer: [`Silent`], which accepts inference connections and never
//! reads them (split from `backend.rs`), and [`refusing_address`], a port nothing listens on.

use std::io::Write;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use super::wire::Wire;

/// A backend that accepts inference connections and never reads or answers: they stay open,
/// silent, until it is dropped. Health checks (a `GET`) get a 200, so the router keeps it
/// eligible.
#[derive(Debug)]
pub struct Silent {
    addr: SocketAddr,
    /// Connections held unread (health checks excluded).
    held: Arc<AtomicU64>,
    stop: Arc<Stop>,
}

/// Set once when a [`Silent`] backend is dropped; its connection threads wait on it.
#[derive(Debug, Default)]
struct Stop {
    stopped: Mutex<bool>,
    changed: Condvar,
}

impl Stop {
    fn stopped(&self) -> bool {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn stop(&self) {
        *self.stopped.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.changed.notify_all();
    }

    /// Blocks until [`Stop::stop`].
    fn wait(&self) {
        let mut stopped = self.stopped.lock().unwrap_or_else(|e| e.into_inner());
        while !*stopped {
            stopped = self.changed.wait(stopped).unwrap_or_else(|e| e.into_inner());
        }
    }
}

impl Silent {
    /// Starts listening on `127.0.0.1:0`.
    pub fn start() -> Silent {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
        let addr = listener.local_addr().expect("local addr");
        let held_count = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(Stop::default());
        let (count, flag) = (Arc::clone(&held_count), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut held = Vec::new();
            for stream in listener.incoming() {
                if flag.stopped() {
                    return;
                }
                let Ok(stream) = stream else { continue };
                let (flag, count) = (Arc::clone(&flag), Arc::clone(&count));
                held.push(std::thread::spawn(move || silent_connection(stream, &flag, &count)));
            }
        });
        Silent { addr, held: held_count, stop }
    }

    /// `127.0.0.1:PORT`.
    pub fn address(&self) -> String {
        self.addr.to_string()
    }

    /// Connections held unread so far (health checks excluded).
    pub fn held(&self) -> u64 {
        self.held.load(Ordering::Acquire)
    }
}

impl Drop for Silent {
    fn drop(&mut self) {
        self.stop.stop();
        let _ = TcpStream::connect(self.addr);
    }
}

/// Answers a `GET` (a health check) with 200; holds anything else unread until `stop`.
fn silent_connection(stream: TcpStream, stop: &Stop, held: &AtomicU64) {
    let mut first = [0u8; 4];
    if stream.peek(&mut first).is_ok() && first.starts_with(b"GET ") {
        // Read the whole head first: closing on unread bytes would reset the connection.
        let mut wire = Wire::new(stream);
        if !matches!(wire.read_request_head(), Ok(Some(_))) {
            return;
        }
        let mut stream = wire.stream;
        let ok = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}";
        let _ = stream.write_all(ok.as_bytes());
        return;
    }
    held.fetch_add(1, Ordering::AcqRel);
    stop.wait();
    drop(stream);
}

/// A `127.0.0.1` port nothing listens on: connections to it are refused.
pub fn refusing_address() -> String {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind loopback");
    listener.local_addr().expect("local addr").to_string()
}
