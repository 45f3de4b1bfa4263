//! HTTP/1.1 `GET`s for the control thread and the bench: health checks and metrics scrapes.
//!
//! The exchange itself is sans-IO: [`write_request`] writes the request and a [`Response`]
//! takes the bytes of the answer as they arrive, in any split. The response head is parsed by
//! [`crate::protocol::parse_response_head`] within `head_bytes_max` (1xx interim heads are
//! skipped); the body is read by `Content-Length`, chunked (decoded by [`ChunkedDecoder`]) or
//! until close, never past `body_bytes_max`: a larger body is refused as soon as that is known.
//! Two drivers feed it:
//! - the control thread's [`super::prober`], which runs every backend's exchanges at once on
//!   non-blocking sockets, each with its own deadlines;
//! - [`get`], one blocking exchange (for the bench and tests): a connect timeout, then one
//!   deadline for the whole exchange (a server that drips a byte at a time still ends within
//!   it).

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::clock::{Clock, Tick};
use crate::credential::BackendKey;
use crate::protocol::{
    parse_response_head, ChunkedDecoder, ChunkedLimits, ProtocolError, ResponseFraming, Side,
};

/// Limits of one probe.
#[derive(Debug, Clone)]
pub struct ProbeLimits {
    /// Time to establish the TCP connection.
    pub connect_timeout: Duration,
    /// Time for the whole exchange after connecting.
    pub exchange_timeout: Duration,
    /// Largest response head.
    pub head_bytes_max: usize,
    /// Largest response body.
    pub body_bytes_max: usize,
}

/// Why a probe failed: every failure makes the backend's result unknown for this check.
#[derive(Debug)]
pub enum ProbeError {
    /// The address did not resolve.
    Resolve(String),
    /// Connecting failed or timed out.
    Connect(io::Error),
    /// Sending or receiving failed, timed out, or the connection closed early.
    Io(io::Error),
    /// The response was not valid HTTP/1.1.
    Protocol(ProtocolError),
    /// The head or body is larger than its limit.
    TooLarge,
}

/// Whether a socket call failed for want of the router's own resources rather than through
/// anything a peer did: descriptors (EMFILE, the process's open-file limit; ENFILE, the
/// system's), kernel memory (ENOBUFS, ENOMEM) or local ports (EADDRNOTAVAIL). Such a failure
/// says nothing of the backend: the shards answer its request 503 without blaming the backend,
/// and a check leaves the backend's health as it was (`prober`).
pub fn short_of_resources(error: &io::Error) -> bool {
    let shortages = [libc::EMFILE, libc::ENFILE, libc::ENOBUFS, libc::ENOMEM, libc::EADDRNOTAVAIL];
    error.raw_os_error().is_some_and(|errno| shortages.contains(&errno))
}

impl std::fmt::Display for ProbeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ProbeError::Resolve(addr) => write!(f, "cannot resolve {addr}"),
            ProbeError::Connect(err) => write!(f, "connect: {err}"),
            ProbeError::Io(err) => write!(f, "i/o: {err}"),
            ProbeError::Protocol(err) => write!(f, "bad response: {err:?}"),
            ProbeError::TooLarge => write!(f, "response over its size limit"),
        }
    }
}

/// Replaces `out` with the request `GET path` to `addr` (`host:port`, sent as `Host`), asking
/// the server to close the connection after its answer; with the engine's API key
/// (`backend_api_key_file`) when it has one.
pub fn write_request(out: &mut Vec<u8>, addr: &str, path: &str, key: Option<&BackendKey>) {
    out.clear();
    // Writing into a Vec cannot fail.
    let _ = write!(
        out,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: warmpath\r\nAccept: text/plain\r\n"
    );
    if let Some(key) = key {
        out.extend_from_slice(b"Authorization: ");
        out.extend_from_slice(key.header_value());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"Connection: close\r\n\r\n");
}

/// Where a [`Response`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Reading the head (interim heads skipped).
    Head,
    /// Reading the body of a final head with this status.
    Body { status: u16, framing: Framing },
    /// The whole response has been read.
    Done { status: u16 },
}

/// How the body ends, with what is left of it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Framing {
    /// After this many more bytes.
    Length(u64),
    /// With the chunked coding's last chunk.
    Chunked,
    /// When the server closes the connection.
    UntilClose,
}

/// One response, read incrementally from the bytes of the connection.
#[derive(Debug)]
pub struct Response {
    phase: Phase,
    decoder: ChunkedDecoder,
}

impl Default for Response {
    fn default() -> Self {
        Response::new()
    }
}

impl Response {
    /// Before the first byte.
    pub fn new() -> Response {
        Response { phase: Phase::Head, decoder: Response::decoder(usize::MAX) }
    }

    fn decoder(body_bytes_max: usize) -> ChunkedDecoder {
        let limits = ChunkedLimits {
            max_body_bytes: body_bytes_max as u64,
            max_line_bytes: 1024,
            max_trailer_bytes: 16 << 10,
        };
        ChunkedDecoder::new(limits, Side::Upstream)
    }

    /// Takes the next bytes read from the connection. `head` holds the bytes of a head not yet
    /// complete between calls (the caller clears it, like `body`, before the first call); the
    /// body goes into `body`. Returns the status once the response is complete (bytes after it
    /// are ignored).
    pub fn read(
        &mut self,
        input: &[u8],
        head: &mut Vec<u8>,
        body: &mut Vec<u8>,
        limits: &ProbeLimits,
    ) -> Result<Option<u16>, ProbeError> {
        if self.phase != Phase::Head {
            return self.read_body(input, body, limits);
        }
        head.extend_from_slice(input);
        let Some((status, framing, head_len)) = self.read_head(head, limits)? else {
            return Ok(None);
        };
        self.phase = Phase::Body { status, framing };
        if framing == Framing::Chunked {
            self.decoder = Response::decoder(limits.body_bytes_max);
        }
        // What followed the head in the buffer is the start of the body.
        let read = self.read_body(&head[head_len..], body, limits);
        head.clear();
        read
    }

    /// Takes bytes of the body; the status once it is complete.
    fn read_body(
        &mut self,
        input: &[u8],
        body: &mut Vec<u8>,
        limits: &ProbeLimits,
    ) -> Result<Option<u16>, ProbeError> {
        let (status, framing) = match self.phase {
            Phase::Body { status, framing } => (status, framing),
            Phase::Done { status } => return Ok(Some(status)),
            Phase::Head => unreachable!("the head is read first"),
        };
        let done = match framing {
            Framing::Length(left) => {
                let take = usize::try_from(left).map_or(input.len(), |left| left.min(input.len()));
                body.extend_from_slice(&input[..take]);
                let left = left - take as u64;
                self.phase = Phase::Body { status, framing: Framing::Length(left) };
                left == 0
            }
            Framing::Chunked => {
                let progress = self.decoder.feed(input, body).map_err(|err| {
                    if body.len() >= limits.body_bytes_max {
                        ProbeError::TooLarge
                    } else {
                        ProbeError::Protocol(err)
                    }
                })?;
                progress.done
            }
            Framing::UntilClose => {
                body.extend_from_slice(input);
                if body.len() > limits.body_bytes_max {
                    return Err(ProbeError::TooLarge);
                }
                false
            }
        };
        if done {
            self.phase = Phase::Done { status };
            return Ok(Some(status));
        }
        Ok(None)
    }

    /// Parses the head buffered so far, skipping interim heads: the status, framing and length
    /// of a final head, or `None` while incomplete.
    fn read_head(
        &mut self,
        head: &mut Vec<u8>,
        limits: &ProbeLimits,
    ) -> Result<Option<(u16, Framing, usize)>, ProbeError> {
        loop {
            match parse_response_head(head, limits.head_bytes_max, false) {
                Ok(Some(parsed)) if parsed.is_interim() => {
                    head.drain(..parsed.head_len);
                }
                Ok(Some(parsed)) => {
                    let framing = match parsed.framing {
                        ResponseFraming::None => Framing::Length(0),
                        ResponseFraming::ContentLength(length) => {
                            if usize::try_from(length).map_or(true, |l| l > limits.body_bytes_max) {
                                return Err(ProbeError::TooLarge);
                            }
                            Framing::Length(length)
                        }
                        ResponseFraming::Chunked => Framing::Chunked,
                        ResponseFraming::UntilClose => Framing::UntilClose,
                    };
                    return Ok(Some((parsed.status, framing, parsed.head_len)));
                }
                Ok(None) if head.len() >= limits.head_bytes_max => {
                    return Err(ProbeError::TooLarge)
                }
                Ok(None) => return Ok(None),
                Err(err) => return Err(ProbeError::Protocol(err)),
            }
        }
    }

    /// The server closed the connection: the status when that ends the response (a body read
    /// until close, or a response already complete), else an error.
    pub fn closed(&mut self) -> Result<u16, ProbeError> {
        match self.phase {
            Phase::Done { status } | Phase::Body { status, framing: Framing::UntilClose } => {
                self.phase = Phase::Done { status };
                Ok(status)
            }
            Phase::Head | Phase::Body { .. } => {
                Err(ProbeError::Io(io::ErrorKind::UnexpectedEof.into()))
            }
        }
    }
}

/// `GET path` from `addr` (`host:port`), blocking; the body goes into `body` (cleared first).
/// Returns the status code.
pub fn get(
    addr: &str,
    path: &str,
    limits: &ProbeLimits,
    clock: &Clock,
    body: &mut Vec<u8>,
) -> Result<u16, ProbeError> {
    body.clear();
    let target = addr
        .to_socket_addrs()
        .ok()
        .and_then(|mut addrs| addrs.next())
        .ok_or_else(|| ProbeError::Resolve(addr.to_owned()))?;
    let mut stream =
        TcpStream::connect_timeout(&target, limits.connect_timeout).map_err(ProbeError::Connect)?;
    let deadline = clock.now().saturating_add(clock.rate().ticks(limits.exchange_timeout));
    let mut conn = Conn { stream: &mut stream, clock, deadline };
    let mut request = Vec::new();
    write_request(&mut request, addr, path, None);
    conn.arm()?;
    conn.stream.write_all(&request).map_err(ProbeError::Io)?;
    let mut response = Response::new();
    let mut head = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        let read = conn.read(&mut chunk)?;
        if read == 0 {
            return response.closed();
        }
        if let Some(status) = response.read(&chunk[..read], &mut head, body, limits)? {
            return Ok(status);
        }
    }
}

/// The socket and the exchange deadline.
struct Conn<'a> {
    stream: &'a mut TcpStream,
    clock: &'a Clock,
    deadline: Tick,
}

impl Conn<'_> {
    /// Sets the socket timeouts to what is left of the deadline.
    fn arm(&mut self) -> Result<(), ProbeError> {
        let now = self.clock.now();
        if now >= self.deadline {
            return Err(ProbeError::Io(io::ErrorKind::TimedOut.into()));
        }
        let left = self.clock.rate().duration(self.deadline - now).max(Duration::from_millis(1));
        self.stream.set_read_timeout(Some(left)).map_err(ProbeError::Io)?;
        self.stream.set_write_timeout(Some(left)).map_err(ProbeError::Io)
    }

    /// Reads some bytes into `chunk`; 0 at end of stream.
    fn read(&mut self, chunk: &mut [u8]) -> Result<usize, ProbeError> {
        self.arm()?;
        self.stream.read(chunk).map_err(ProbeError::Io)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> ProbeLimits {
        ProbeLimits {
            connect_timeout: Duration::from_secs(1),
            exchange_timeout: Duration::from_secs(1),
            head_bytes_max: 256,
            body_bytes_max: 64,
        }
    }

    /// Feeds `bytes` in pieces of `split` bytes; then the close when `close`.
    fn feed(bytes: &[u8], split: usize, close: bool) -> (Result<Option<u16>, String>, Vec<u8>) {
        let (mut response, mut head, mut body) = (Response::new(), Vec::new(), Vec::new());
        for piece in bytes.chunks(split.max(1)) {
            match response.read(piece, &mut head, &mut body, &limits()) {
                Ok(Some(status)) => return (Ok(Some(status)), body),
                Ok(None) => {}
                Err(err) => return (Err(err.to_string()), body),
            }
        }
        if close {
            return (response.closed().map(Some).map_err(|e| e.to_string()), body);
        }
        (Ok(None), body)
    }

    #[test]
    fn bodies_by_each_framing_in_any_split() {
        let cases: [(&[u8], bool, u16, &[u8]); 5] = [
            (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello and more", false, 200, b"hello"),
            (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nhel\r\n2\r\nlo\r\n0\r\n\r\n", false, 200, b"hello"),
            (b"HTTP/1.0 200 OK\r\n\r\nhello", true, 200, b"hello"),
            (b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 204 No Content\r\n\r\n", false, 204, b""),
            (b"HTTP/1.1 503 Busy\r\nContent-Length: 0\r\n\r\n", false, 503, b""),
        ];
        for (bytes, close, expected_status, expected) in cases {
            for split in 1..=bytes.len() {
                let (status, body) = feed(bytes, split, close);
                let status = status.unwrap_or_else(|e| panic!("{e}: {bytes:?} split {split}"));
                assert_eq!(status, Some(expected_status), "{bytes:?} split {split}");
                assert_eq!(body, expected, "{bytes:?} split {split}");
            }
        }
    }

    #[test]
    fn limits_and_early_ends_are_errors() {
        let long_body = format!("HTTP/1.1 200 OK\r\nContent-Length: 65\r\n\r\n{}", "x".repeat(65));
        let chunked = format!(
            "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n41\r\n{}\r\n0\r\n\r\n",
            "x".repeat(65)
        );
        let until_close = format!("HTTP/1.1 200 OK\r\n\r\n{}", "x".repeat(65));
        let long_head = format!("HTTP/1.1 200 OK\r\nX: {}\r\n\r\n", "y".repeat(300));
        for (bytes, close) in [
            (long_body.as_str(), false),
            (chunked.as_str(), false),
            (until_close.as_str(), true),
            (long_head.as_str(), false),
        ] {
            for split in [1, 7, bytes.len()] {
                let (status, _) = feed(bytes.as_bytes(), split, close);
                assert!(status.is_err(), "{bytes} split {split}: {status:?}");
            }
        }
        let (short, _) = feed(b"HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nhello", 3, true);
        assert!(short.unwrap_err().contains("i/o"));
        let (garbage, _) = feed(b"SSH-2.0-OpenSSH\r\n\r\n", 4, false);
        assert!(garbage.unwrap_err().contains("bad response"));
        let (cut, _) = feed(b"HTTP/1.1 200 OK\r\n", 4, true);
        assert!(cut.is_err());
    }

    #[test]
    fn the_request_names_host_and_path_and_asks_to_close() {
        let mut out = b"stale".to_vec();
        write_request(&mut out, "10.0.0.1:8000", "/metrics", None);
        let text = String::from_utf8(out).unwrap();
        assert!(text.starts_with("GET /metrics HTTP/1.1\r\nHost: 10.0.0.1:8000\r\n"), "{text}");
        assert!(text.ends_with("Connection: close\r\n\r\n"), "{text}");
        assert!(!text.contains("Authorization"), "{text}");
        let path = std::env::temp_dir().join(format!("warmpath-probe-key-{}", std::process::id()));
        std::fs::write(&path, "sk-engine\n").unwrap();
        let key = crate::credential::read_backend_key(&path).unwrap();
        std::fs::remove_file(&path).unwrap();
        let mut out = Vec::new();
        write_request(&mut out, "10.0.0.1:8000", "/health", Some(&key));
        let text = String::from_utf8(out).unwrap();
        assert!(text.ends_with("Authorization: Bearer sk-engine\r\nConnection: close\r\n\r\n"));
    }
}
