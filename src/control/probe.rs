//! Blocking HTTP/1.1 `GET`s for the control thread: health checks and metrics scrapes.
//!
//! The control thread is off the request path and talks to each backend once per
//! `metrics_interval`, so it uses plain blocking sockets with timeouts: a connect timeout, and
//! one deadline for the whole exchange (a server that drips a byte at a time still ends within
//! it). The response head is parsed by [`crate::protocol::parse_response_head`]; bodies by
//! `Content-Length`, chunked (decoded by [`ChunkedDecoder`]) or until close, never past
//! `body_bytes_max`: a larger body is refused as soon as that is known.

use std::io::{self, Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::time::Duration;

use crate::clock::{Clock, Tick};
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

/// Why a probe failed: every failure makes the backend's result unknown for this round.
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

/// `GET path` from `addr` (`host:port`); the body goes into `body` (cleared first). Returns the
/// status code.
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
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nUser-Agent: warmpath\r\nAccept: text/plain\r\n\
         Connection: close\r\n\r\n"
    );
    conn.arm()?;
    conn.stream.write_all(request.as_bytes()).map_err(ProbeError::Io)?;
    let mut buf = Vec::with_capacity(4096);
    let (status, framing, head_len) = read_head(&mut conn, &mut buf, limits)?;
    let rest = buf.split_off(head_len);
    read_body(&mut conn, framing, rest, limits, body)?;
    Ok(status)
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

    /// Reads some bytes into `buf`; 0 at end of stream.
    fn read_more(&mut self, buf: &mut Vec<u8>) -> Result<usize, ProbeError> {
        self.arm()?;
        let mut chunk = [0u8; 8192];
        let read = self.stream.read(&mut chunk).map_err(ProbeError::Io)?;
        buf.extend_from_slice(&chunk[..read]);
        Ok(read)
    }
}

fn read_head(
    conn: &mut Conn,
    buf: &mut Vec<u8>,
    limits: &ProbeLimits,
) -> Result<(u16, ResponseFraming, usize), ProbeError> {
    loop {
        match parse_response_head(buf, limits.head_bytes_max, false) {
            Ok(Some(head)) if head.is_interim() => {
                buf.drain(..head.head_len);
            }
            Ok(Some(head)) => return Ok((head.status, head.framing, head.head_len)),
            Ok(None) if buf.len() >= limits.head_bytes_max => return Err(ProbeError::TooLarge),
            Ok(None) => {
                if conn.read_more(buf)? == 0 {
                    return Err(ProbeError::Io(io::ErrorKind::UnexpectedEof.into()));
                }
            }
            Err(err) => return Err(ProbeError::Protocol(err)),
        }
    }
}

fn read_body(
    conn: &mut Conn,
    framing: ResponseFraming,
    rest: Vec<u8>,
    limits: &ProbeLimits,
    body: &mut Vec<u8>,
) -> Result<(), ProbeError> {
    match framing {
        ResponseFraming::None => Ok(()),
        ResponseFraming::ContentLength(length) => {
            let length = usize::try_from(length).map_err(|_| ProbeError::TooLarge)?;
            if length > limits.body_bytes_max {
                return Err(ProbeError::TooLarge);
            }
            body.extend_from_slice(&rest[..rest.len().min(length)]);
            while body.len() < length {
                if conn.read_more(body)? == 0 {
                    return Err(ProbeError::Io(io::ErrorKind::UnexpectedEof.into()));
                }
            }
            body.truncate(length);
            Ok(())
        }
        ResponseFraming::Chunked => read_chunked(conn, rest, limits, body),
        ResponseFraming::UntilClose => {
            body.extend_from_slice(&rest);
            while body.len() <= limits.body_bytes_max {
                if conn.read_more(body)? == 0 {
                    return Ok(());
                }
            }
            Err(ProbeError::TooLarge)
        }
    }
}

fn read_chunked(
    conn: &mut Conn,
    mut pending: Vec<u8>,
    limits: &ProbeLimits,
    body: &mut Vec<u8>,
) -> Result<(), ProbeError> {
    let chunked = ChunkedLimits {
        max_body_bytes: limits.body_bytes_max as u64,
        max_line_bytes: 1024,
        max_trailer_bytes: 16 << 10,
    };
    let mut decoder = ChunkedDecoder::new(chunked, Side::Upstream);
    loop {
        let progress = decoder.feed(&pending, body).map_err(|err| {
            if body.len() >= limits.body_bytes_max {
                ProbeError::TooLarge
            } else {
                ProbeError::Protocol(err)
            }
        })?;
        if progress.done {
            return Ok(());
        }
        pending.clear();
        if conn.read_more(&mut pending)? == 0 {
            return Err(ProbeError::Io(io::ErrorKind::UnexpectedEof.into()));
        }
    }
}
