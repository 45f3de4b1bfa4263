//! TLS on the main listener (issue [11] item 2), end to end on loopback: requests and a stream
//! through rustls as a client, ALPN, TLS garbage (each a row of docs/security.md), and reloads
//! that must refuse an expired, not-yet-valid or mismatched pair while the running certificate
//! and the open connections keep working, and that switch the certificate for new connections
//! only.
//!
//! The certificates are made here with rcgen at run time (self-signed for `localhost` and
//! 127.0.0.1), so that no private key is committed; the client trusts each one it is given.

mod support;

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, ClientConnection, RootCertStore, StreamOwned};
use serde_json::Value;
use warmpath::config::{Config, Overrides};
use warmpath::server::{self, ConfigSource, Running};
use warmpath::splitmix::SplitMix64;

use support::backend::{Backend, DEFAULT_CONTENT};
use support::client::{self, chat_request, get_request, Conn};
use support::router::Setup;
use support::PATIENCE;

const M: &str = "tls-model";

// ---------------------------------------------------------------------------------------------
// Certificates and files.

/// A certificate and its key, PEM, and the certificate's DER (what a client sees).
struct Pair {
    cert_pem: String,
    key_pem: String,
    der: Vec<u8>,
}

/// A self-signed certificate for `localhost` and 127.0.0.1, valid from `from` to `until`
/// (years, January 1st).
fn pair(from: i32, until: i32) -> Pair {
    let key = rcgen::KeyPair::generate().expect("a key");
    let mut params =
        rcgen::CertificateParams::new(vec!["localhost".to_owned()]).expect("certificate params");
    params.subject_alt_names.push(rcgen::SanType::IpAddress([127, 0, 0, 1].into()));
    params.not_before = rcgen::date_time_ymd(from, 1, 1);
    params.not_after = rcgen::date_time_ymd(until, 1, 1);
    let cert = params.self_signed(&key).expect("self-signed");
    Pair { cert_pem: cert.pem(), key_pem: key.serialize_pem(), der: cert.der().to_vec() }
}

/// A pair valid now and for a long time.
fn valid() -> Pair {
    pair(2000, 4000)
}

/// A fresh directory for one test's files.
fn dir(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("warmpath-tls-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}

/// Writes a certificate and a key PEM into `dir` as `cert.pem` and `key.pem`.
fn write_pair(dir: &Path, cert_pem: &str, key_pem: &str) {
    std::fs::write(dir.join("cert.pem"), cert_pem).expect("cert.pem");
    std::fs::write(dir.join("key.pem"), key_pem).expect("key.pem");
}

/// The test router's configuration with `[server.tls]` naming `dir`'s files.
fn toml(setup: &Setup, dir: &Path) -> String {
    let (cert, key) = (dir.join("cert.pem"), dir.join("key.pem"));
    format!("{}\n[server.tls]\ncert = {:?}\nkey = {:?}\n", setup.toml(), cert, key)
}

fn setup(backend: &Backend) -> Setup {
    Setup::new().model(M, &[backend.address()]).server("header_timeout", "1s")
}

/// Starts a router on `dir`'s files, reloadable from `dir/warmpath.toml`.
fn start(setup: &Setup, dir: &Path) -> io::Result<Running> {
    let path = dir.join("warmpath.toml");
    let text = toml(setup, dir);
    std::fs::write(&path, &text).expect("warmpath.toml");
    let config = Config::from_toml_str(&text).expect("a valid configuration");
    let source = ConfigSource { path, overrides: Overrides::default(), env: |_| None };
    server::start_with_source(config, Some(source), support::clock().clone())
}

// ---------------------------------------------------------------------------------------------
// A TLS client.

/// A client configuration trusting `certs`, offering `alpn`.
fn client_config(certs: &[&Pair], alpn: &[&[u8]]) -> Arc<ClientConfig> {
    let mut roots = RootCertStore::empty();
    for pair in certs {
        roots.add(CertificateDer::from(pair.der.clone())).expect("a trust anchor");
    }
    #[allow(deprecated)] // ring, as in the router (Cargo.toml)
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("protocol versions")
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Arc::new(config)
}

/// A TLS connection to the router with a buffer of what was read and not yet consumed.
struct Tls {
    stream: StreamOwned<ClientConnection, TcpStream>,
    buf: Vec<u8>,
}

impl Tls {
    /// Connects and completes the handshake (an error when it fails).
    fn connect(addr: SocketAddr, config: &Arc<ClientConfig>) -> io::Result<Tls> {
        let socket = TcpStream::connect(addr)?;
        socket.set_read_timeout(Some(PATIENCE))?;
        let name = ServerName::try_from("localhost").expect("a name");
        let conn = ClientConnection::new(Arc::clone(config), name).map_err(io::Error::other)?;
        let mut stream = StreamOwned::new(conn, socket);
        while stream.conn.is_handshaking() {
            stream.conn.complete_io(&mut stream.sock)?;
        }
        Ok(Tls { stream, buf: Vec::new() })
    }

    /// The certificate the router presented.
    fn peer_cert(&self) -> Vec<u8> {
        self.stream.conn.peer_certificates().expect("a certificate")[0].to_vec()
    }

    /// Sends `request` and reads one response: status, head and body (de-chunked).
    fn exchange(&mut self, request: &[u8]) -> io::Result<(u16, String, Vec<u8>)> {
        self.stream.write_all(request)?;
        self.stream.flush()?;
        let head = loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head: Vec<u8> = self.buf.drain(..end + 4).collect();
                break String::from_utf8_lossy(&head).into_owned();
            }
            self.fill()?;
        };
        let status = head[9..12].parse().expect("a status");
        let lower = head.to_ascii_lowercase();
        let body = if lower.contains("transfer-encoding: chunked") {
            self.chunked()?
        } else {
            let length = lower
                .split("content-length:")
                .nth(1)
                .and_then(|rest| rest.split("\r\n").next())
                .map_or(0, |n| n.trim().parse().expect("a length"));
            while self.buf.len() < length {
                self.fill()?;
            }
            self.buf.drain(..length).collect()
        };
        Ok((status, head, body))
    }

    /// A chunked body, de-chunked.
    fn chunked(&mut self) -> io::Result<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let line_end = loop {
                match self.buf.windows(2).position(|w| w == b"\r\n") {
                    Some(end) => break end,
                    None => self.fill()?,
                };
            };
            let line = String::from_utf8_lossy(&self.buf[..line_end]).into_owned();
            let size = usize::from_str_radix(line.trim(), 16).expect("a chunk size");
            while self.buf.len() < line_end + 2 + size + 2 {
                self.fill()?;
            }
            body.extend_from_slice(&self.buf[line_end + 2..line_end + 2 + size]);
            self.buf.drain(..line_end + 2 + size + 2);
            if size == 0 {
                return Ok(body);
            }
        }
    }

    fn fill(&mut self) -> io::Result<()> {
        let mut chunk = [0u8; 16 << 10];
        match self.stream.read(&mut chunk)? {
            0 => Err(io::ErrorKind::UnexpectedEof.into()),
            n => {
                self.buf.extend_from_slice(&chunk[..n]);
                Ok(())
            }
        }
    }
}

/// `GET /healthz` through a new TLS connection trusting `certs`: the certificate the router
/// presented (panics unless the answer is 200).
fn healthy_with(addr: SocketAddr, certs: &[&Pair]) -> Vec<u8> {
    let mut tls = Tls::connect(addr, &client_config(certs, &[b"http/1.1"])).expect("handshake");
    let (status, _, body) = tls.exchange(&get_request("/healthz")).expect("a response");
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    tls.peer_cert()
}

/// `POST /admin/reload`: the status and the JSON body.
fn reload(admin: SocketAddr) -> (u16, Value) {
    let response = client::exchange(admin, &client::request("POST", "/admin/reload", &[], b""));
    (response.status, response.json())
}

/// Waits until the router has closed `socket` (end of stream or a reset), discarding what it
/// sends first (an alert).
fn assert_closed(socket: &mut TcpStream, what: &str) {
    socket.set_read_timeout(Some(PATIENCE)).expect("read timeout");
    let mut scratch = [0u8; 4096];
    loop {
        match socket.read(&mut scratch) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => {
                panic!("{what}: the router did not close the connection within {PATIENCE:?}")
            }
            Err(_) => return,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The tests.

/// A request, a keep-alive follow-up and an SSE stream through TLS to a fake backend; ALPN
/// selects http/1.1 when offered, and a client offering no ALPN is served too.
#[test]
fn requests_and_a_stream_go_through_tls() {
    let backend = Backend::start();
    let dir = dir("requests");
    let cert = valid();
    write_pair(&dir, &cert.cert_pem, &cert.key_pem);
    let running = start(&setup(&backend), &dir).expect("starts with TLS");
    let addr = running.addr();

    let mut tls = Tls::connect(addr, &client_config(&[&cert], &[b"h2", b"http/1.1"])).unwrap();
    assert_eq!(tls.stream.conn.alpn_protocol(), Some(b"http/1.1".as_slice()));
    assert_eq!(tls.peer_cert(), cert.der);
    let (status, _, body) = tls.exchange(&chat_request(M, Some("s1"), false)).unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    let json: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["choices"][0]["message"]["content"], DEFAULT_CONTENT);
    // The same connection, kept alive: a stream, relayed chunk by chunk.
    let (status, head, body) = tls.exchange(&chat_request(M, Some("s1"), true)).unwrap();
    assert_eq!(status, 200);
    assert!(head.to_ascii_lowercase().contains("text/event-stream"), "{head}");
    let text = String::from_utf8_lossy(&body);
    assert!(text.contains("chat.completion.chunk"), "{text}");
    assert!(text.trim_end().ends_with("data: [DONE]"), "{text}");
    assert_eq!(backend.request_count(), 2);

    // No ALPN offered: HTTP/1.1 all the same.
    let mut plain_alpn = Tls::connect(addr, &client_config(&[&cert], &[])).unwrap();
    assert_eq!(plain_alpn.stream.conn.alpn_protocol(), None);
    let (status, _, _) = plain_alpn.exchange(&get_request("/v1/models")).unwrap();
    assert_eq!(status, 200);
    running.shutdown();
    running.wait();
}

/// Hostile input (docs/security.md, "TLS"): plaintext HTTP, random bytes, a ClientHello cut
/// short and then closed, one that stalls, and a client that offers only h2 each lose only
/// their own connection; the router keeps serving TLS clients.
#[test]
fn tls_garbage_closes_the_connection_and_the_router_keeps_serving() {
    let backend = Backend::start();
    let dir = dir("garbage");
    let cert = valid();
    write_pair(&dir, &cert.cert_pem, &cert.key_pem);
    let running = start(&setup(&backend), &dir).expect("starts with TLS");
    let addr = running.addr();

    // Plaintext HTTP on the TLS port: an alert at most, never an HTTP answer, then a close.
    let mut conn = Conn::open(addr);
    conn.send(&get_request("/healthz"));
    let mut socket = conn.stream().try_clone().unwrap();
    let mut first = [0u8; 5];
    let n = socket.read(&mut first).unwrap_or(0);
    assert!(!first[..n].starts_with(b"HTTP"), "an HTTP answer to plaintext: {first:?}");
    assert_closed(&mut socket, "plaintext HTTP");

    // Random bytes, seeded: closed.
    let mut random = SplitMix64::new(11);
    let bytes: Vec<u8> = (0..4096).map(|_| random.next_u64() as u8).collect();
    let mut socket = TcpStream::connect(addr).unwrap();
    let _ = socket.write_all(&bytes);
    assert_closed(&mut socket, "random bytes");

    // A real ClientHello, cut in half, then the client's end closed: closed.
    let hello = client_hello(&cert);
    let mut socket = TcpStream::connect(addr).unwrap();
    socket.write_all(&hello[..hello.len() / 2]).unwrap();
    socket.shutdown(std::net::Shutdown::Write).unwrap();
    assert_closed(&mut socket, "a truncated ClientHello");

    // The same cut ClientHello, and then nothing: closed by the header timeout (1 s here).
    let mut socket = TcpStream::connect(addr).unwrap();
    socket.write_all(&hello[..hello.len() / 2]).unwrap();
    assert_closed(&mut socket, "a stalled handshake");

    // A client that offers only h2: the handshake fails (no_application_protocol).
    let h2_only = Tls::connect(addr, &client_config(&[&cert], &[b"h2"]));
    let Err(error) = h2_only else { panic!("an h2-only client was served") };
    assert!(error.to_string().contains("NoApplicationProtocol"), "{error}");

    // Counted: the plaintext request, the random bytes and the h2-only client (not the cut
    // ClientHellos: a client that leaves or stalls is not a TLS error).
    let admin = running.admin_addr();
    client::wait_metric(admin, "warmpath_tls_errors_total", &[], |n| n == 3.0);

    // A plaintext client of the router's admin listener and a TLS client are both served.
    assert_eq!(healthy_with(addr, &[&cert]), cert.der);
    let (status, _) = reload(running.admin_addr());
    assert_eq!(status, 200, "the admin listener serves");
    assert_eq!(healthy_with(addr, &[&cert]), cert.der);
    running.shutdown();
    running.wait();
}

/// The first flight of a TLS client trusting `cert`: a ClientHello record.
fn client_hello(cert: &Pair) -> Vec<u8> {
    let name = ServerName::try_from("localhost").unwrap();
    let mut conn = ClientConnection::new(client_config(&[cert], &[b"http/1.1"]), name).unwrap();
    let mut hello = Vec::new();
    conn.write_tls(&mut hello).unwrap();
    assert_eq!(hello[0], 0x16, "a handshake record");
    hello
}

/// Reloads re-read the PEM files: an expired, a not-yet-valid and a mismatched pair, and an
/// unreadable file, are refused with errors naming the file (counted in
/// `warmpath_config_reloads_refused_total`), while an open keep-alive connection and new
/// connections keep the running certificate; a valid new pair is taken by new connections
/// only, and the open connection keeps going on the old one.
#[test]
fn reloads_refuse_bad_pairs_and_switch_certificates_for_new_connections_only() {
    let backend = Backend::start();
    let dir = dir("reload");
    let (old, new) = (valid(), valid());
    write_pair(&dir, &old.cert_pem, &old.key_pem);
    let running = start(&setup(&backend), &dir).expect("starts with TLS");
    let (addr, admin) = (running.addr(), running.admin_addr());
    let both = [&old, &new];
    let mut open = Tls::connect(addr, &client_config(&both, &[b"http/1.1"])).unwrap();
    assert_eq!(open.exchange(&get_request("/healthz")).unwrap().0, 200);
    assert_eq!(open.peer_cert(), old.der);

    let (expired, early) = (pair(2001, 2002), pair(3000, 3001));
    let refusals: [(&str, &str, &str, &str); 4] = [
        (&expired.cert_pem, &expired.key_pem, "expired at 2002-01-01 00:00:00 UTC", "expired"),
        (&early.cert_pem, &early.key_pem, "not valid before 3000-01-01", "not yet valid"),
        (&new.cert_pem, &old.key_pem, "does not belong to the certificate", "mismatched"),
        (&new.cert_pem, "not a key", "no private key block", "no key"),
    ];
    for (count, (cert_pem, key_pem, expected, what)) in (1..).zip(refusals) {
        write_pair(&dir, cert_pem, key_pem);
        let (status, body) = reload(admin);
        assert_eq!(status, 409, "{what}: {body}");
        let error = body["error"].as_str().unwrap();
        assert!(error.contains(expected), "{what}: {error}");
        assert!(error.contains(&*dir.to_string_lossy()), "{what} names the file: {error}");
        assert_eq!(body["generation"], 1, "{what}");
        let metrics = client::metrics(admin);
        let refused = client::metric(&metrics, "warmpath_config_reloads_refused_total", &[]);
        assert_eq!(refused, Some(f64::from(count)), "{what}");
        assert_eq!(healthy_with(addr, &both), old.der, "{what}: new connections keep the old");
        assert_eq!(open.exchange(&get_request("/healthz")).unwrap().0, 200, "{what}");
    }
    std::fs::remove_file(dir.join("cert.pem")).unwrap();
    let (status, body) = reload(admin);
    assert_eq!(status, 409, "{body}");
    assert!(body["error"].as_str().unwrap().contains("cannot read it"), "{body}");

    // A valid new pair: new connections get it; the open one keeps going on the old one.
    write_pair(&dir, &new.cert_pem, &new.key_pem);
    assert_eq!(reload(admin), (200, serde_json::json!({"generation": 2})));
    assert_eq!(healthy_with(addr, &both), new.der);
    let (status, _, body) = open.exchange(&chat_request(M, None, false)).unwrap();
    assert_eq!(status, 200, "{}", String::from_utf8_lossy(&body));
    assert_eq!(open.peer_cert(), old.der);
    running.shutdown();
    running.wait();
}

/// At start the same pairs are start-up errors naming the file, and `[server.tls]` with one
/// file of the two is a configuration error.
#[test]
fn bad_pairs_stop_the_start_and_half_a_table_is_refused() {
    let backend = Backend::start();
    let dir = dir("start");
    let (expired, other) = (pair(2001, 2002), valid());
    for (cert_pem, key_pem, expected) in [
        (&expired.cert_pem, &expired.key_pem, "expired at"),
        (&expired.cert_pem, &other.key_pem, "expired at"),
        (&other.cert_pem, &expired.key_pem, "does not belong"),
        (&other.cert_pem, &other.cert_pem, "no private key block"),
    ] {
        write_pair(&dir, cert_pem, key_pem);
        let Err(error) = start(&setup(&backend), &dir) else { panic!("started with {expected}") };
        let message = error.to_string();
        assert!(message.contains(expected), "{message}");
        assert!(message.contains("server.tls."), "{message}");
    }
    let base = setup(&backend).toml();
    let half = format!("{base}\n[server.tls]\ncert = \"/etc/warmpath/cert.pem\"\n");
    let error = Config::from_toml_str(&half).unwrap_err().to_string();
    assert_eq!(
        error,
        "server.tls.cert = \"/etc/warmpath/cert.pem\": server.tls.key is not set: set both the \
         certificate and its key, or neither"
    );
    // `warmpath check-config` reads the files as `serve` would: exit 2 and the error.
    write_pair(&dir, &other.cert_pem, &expired.key_pem);
    let path = dir.join("warmpath.toml");
    std::fs::write(&path, toml(&setup(&backend), &dir)).unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_warmpath"))
        .arg("check-config")
        .arg(&path)
        .output()
        .expect("runs warmpath");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("does not belong to the certificate"), "{stderr}");
    write_pair(&dir, &other.cert_pem, &other.key_pem);
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_warmpath"))
        .arg("check-config")
        .arg(&path)
        .output()
        .expect("runs warmpath");
    assert_eq!(output.status.code(), Some(0), "{}", String::from_utf8_lossy(&output.stderr));
    assert!(String::from_utf8_lossy(&output.stdout).contains("[server.tls]\ncert = "));
    // `--set server.tls.K` reaches the same keys.
    let path = dir.join("base.toml");
    std::fs::write(&path, &base).unwrap();
    let set = |pairs: &[(&str, &str)]| Overrides {
        set: pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        ..Overrides::default()
    };
    let both = set(&[("server.tls.cert", "/c.pem"), ("server.tls.key", "/k.pem")]);
    let config = Config::load(Some(&path), &|_| None, &both).unwrap();
    assert_eq!(config.server.tls.files(), Some((Path::new("/c.pem"), Path::new("/k.pem"))));
    let one = set(&[("server.tls.key", "/k.pem")]);
    let error = Config::load(Some(&path), &|_| None, &one).unwrap_err().to_string();
    assert!(error.contains("server.tls.cert is not set"), "{error}");
    let typo = format!("{base}\n[server.tls]\ncert = \"c\"\nkeys = \"k\"\n");
    let error = Config::from_toml_str(&typo).unwrap_err().to_string();
    assert!(error.contains("unknown key \"server.tls.keys\""), "{error}");
    assert!(error.contains("did you mean \"server.tls.key\""), "{error}");
}

/// The plaintext listener is untouched by all this: a configuration without `[server.tls]`
/// serves plain HTTP (the rest of the suite covers it; this checks the printed table).
#[test]
fn the_printed_configuration_shows_the_tls_table() {
    let backend = Backend::start();
    let dir = dir("print");
    let text = toml(&setup(&backend), &dir);
    let config = Config::from_toml_str(&text).unwrap();
    let printed = config.to_toml();
    let cert = format!("cert = {:?}", dir.join("cert.pem"));
    assert!(printed.contains(&format!("[server.tls]\n{cert}\n")), "{printed}");
    assert_eq!(Config::from_toml_str(&printed).unwrap(), config, "round trip");
    let plain = Config::from_toml_str(&setup(&backend).toml()).unwrap().to_toml();
    assert!(plain.contains("[server.tls]\ncert = \"\"\nkey = \"\"\n#   \"\": the main"), "{plain}");
}

/// `warmpath serve --config FILE`: SIGHUP re-reads the PEM files, as `POST /admin/reload`
/// does: new connections get the new certificate, an open keep-alive one keeps going; SIGTERM
/// then stops the process with status 0.
#[test]
fn the_binary_reloads_the_certificate_on_sighup() {
    let backend = Backend::start();
    let dir = dir("sighup");
    let (old, new) = (valid(), valid());
    write_pair(&dir, &old.cert_pem, &old.key_pem);
    let (listen, admin) =
        (support::silent::refusing_address(), support::silent::refusing_address());
    let setup = setup(&backend).server("listen", &listen).server("admin_listen", &admin);
    let path = dir.join("warmpath.toml");
    std::fs::write(&path, toml(&setup, &dir)).unwrap();
    let mut child = support::serve_binary(&path);
    let (addr, admin): (SocketAddr, SocketAddr) = (listen.parse().unwrap(), admin.parse().unwrap());
    let both = [&old, &new];
    let config = client_config(&both, &[b"http/1.1"]);
    let mut open = support::wait_until("the binary to serve TLS", PATIENCE, || {
        Tls::connect(addr, &config).ok()
    });
    assert_eq!(open.peer_cert(), old.der);

    write_pair(&dir, &new.cert_pem, &new.key_pem);
    support::signal(&child, "HUP");
    support::wait_until("generation 2", PATIENCE, || {
        (client::get(admin, "/debug/config").json()["generation"] == 2).then_some(())
    });
    assert_eq!(healthy_with(addr, &both), new.der);
    let (status, _, _) = open.exchange(&chat_request(M, None, false)).unwrap();
    assert_eq!(status, 200, "the open connection keeps going");
    assert_eq!(open.peer_cert(), old.der);
    drop(open);

    support::signal(&child, "TERM");
    let status =
        support::wait_until("exit after SIGTERM", PATIENCE, || child.try_wait().expect("wait"));
    assert_eq!(status.code(), Some(0), "{status:?}");
}

/// The limits apply through TLS as to plaintext: a head over `max_header_bytes` is 431, a head
/// that never ends is 408 once `header_timeout` (1 s here) has passed; both close.
#[test]
fn limits_apply_through_tls() {
    let backend = Backend::start();
    let dir = dir("limits");
    let cert = valid();
    write_pair(&dir, &cert.cert_pem, &cert.key_pem);
    let running = start(&setup(&backend).server("max_header_bytes", "1024"), &dir).unwrap();
    let config = client_config(&[&cert], &[b"http/1.1"]);

    let mut tls = Tls::connect(running.addr(), &config).unwrap();
    let big = format!("GET /healthz HTTP/1.1\r\nHost: x\r\nX-Pad: {}\r\n\r\n", "a".repeat(2000));
    let (status, head, _) = tls.exchange(big.as_bytes()).unwrap();
    assert_eq!(status, 431, "{head}");
    let closed = tls.fill().map_err(|e| e.kind());
    assert_eq!(closed, Err(io::ErrorKind::UnexpectedEof), "closed after the 431");

    let mut tls = Tls::connect(running.addr(), &config).unwrap();
    let (status, head, _) = tls.exchange(b"GET /healthz HTTP/1.1\r\nHost: x\r\n").unwrap();
    assert_eq!(status, 408, "{head}");
    let closed = tls.fill().map_err(|e| e.kind());
    assert_eq!(closed, Err(io::ErrorKind::UnexpectedEof), "closed after the 408");
    running.shutdown();
    running.wait();
}
