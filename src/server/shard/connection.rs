//! A client connection ([`Client`]): its socket, its buffers, where its exchange is
//! ([`Phase`]) and the index of its request's slot; reading into it and writing out of it, and
//! reading its input away before a close. The client room ([`Clients`](super::client::Clients))
//! owns every one of them in its slab; the upstream room writes a relayed response into one.
//!
//! On a TLS listener (issue \[11\]) a connection also holds its rustls `ServerConnection`, and
//! [`Client::fill`] and [`Client::write_out`] go through it: the handshake and the record
//! layer run here, on the shard, non-blocking, driven by the same edges as plaintext (sans-IO
//! rustls: `read_tls` from the socket, `process_new_packets`, plaintext out of its `reader`;
//! plaintext into its `writer`, `write_tls` to the socket). Everything above sees plaintext
//! in `rbuf` and `wbuf`, so the limits and timeouts apply unchanged. The TLS state is boxed
//! behind an `Option`: a plaintext connection carries one null pointer and pays one
//! predictable branch per read and write, no dynamic dispatch.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown};

use mio::net::TcpStream;
use rustls::ServerConnection;

use crate::wheel::TimerKey;

use super::READ_CHUNK;

/// Bytes of unread input discarded at most before closing a client connection, and per read
/// event of a lingering one.
const DISCARD_MAX: usize = 256 << 10;

/// Where a client connection is in its current exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Head,
    Body,
    Queued,
    /// Forwarded on the upstream connection with this key.
    Upstream(usize),
    Done,
    /// The answer is out and the connection half-closed; input is read and discarded until the
    /// client closes or `LINGER` passes (see `Clients::linger`).
    Lingering,
}

/// A client connection, in the client room's slab. The upstream room writes a relayed response
/// into `wbuf` and moves `phase` along; the rest is the client room's.
#[derive(Debug)]
pub(super) struct Client {
    pub(super) stream: TcpStream,
    /// The TLS session, on a TLS listener: the record layer between `stream` and the buffers.
    pub(super) tls: Option<Box<ServerConnection>>,
    pub(super) peer: IpAddr,
    pub(super) rbuf: Vec<u8>,
    pub(super) rlen: usize,
    pub(super) wbuf: Vec<u8>,
    pub(super) wpos: usize,
    pub(super) phase: Phase,
    pub(super) timer: Option<TimerKey>,
    /// The client closed its side or the connection failed.
    pub(super) gone: bool,
    /// epoll reported the peer's FIN: read to the end, short reads included.
    pub(super) hup: bool,
    /// The last read stopped at the read limit, not at an empty socket: bytes may wait that
    /// no new edge will announce.
    pub(super) undrained: bool,
    /// Close once the response is flushed.
    pub(super) closing: bool,
    /// The TLS session failed (`warmpath_tls_errors_total` counts it at the close).
    pub(super) tls_failed: bool,
    /// The request being worked on: its slot in `Clients::requests`.
    pub(super) req: Option<u32>,
}

impl Client {
    pub(super) fn new(
        stream: TcpStream,
        peer: IpAddr,
        tls: Option<Box<ServerConnection>>,
    ) -> Client {
        Client {
            stream,
            tls,
            peer,
            rbuf: Vec::new(),
            rlen: 0,
            wbuf: Vec::new(),
            wpos: 0,
            phase: Phase::Head,
            timer: None,
            gone: false,
            hup: false,
            undrained: false,
            closing: false,
            tls_failed: false,
            req: None,
        }
    }

    /// Whether the connection holds read or write buffer memory.
    pub(super) fn holds_buffers(&self) -> bool {
        self.rbuf.capacity() > 0 || self.wbuf.capacity() > 0
    }

    /// Response bytes not yet handed to the kernel: the write buffer's, and on TLS whether
    /// records wait in the session (counted as one byte: rustls does not say how many).
    pub(super) fn unsent(&self) -> usize {
        let records = self.tls.as_ref().is_some_and(|tls| tls.wants_write());
        self.wbuf.len() - self.wpos + usize::from(records)
    }

    /// Whether a TLS handshake is still under way (never, on plaintext).
    pub(super) fn handshaking(&self) -> bool {
        self.tls.as_ref().is_some_and(|tls| tls.is_handshaking())
    }

    /// Before a close on TLS: queues a `close_notify` alert and writes what the socket takes
    /// of the session's records (best effort: the connection is closing either way).
    pub(super) fn close_notify(&mut self) {
        if let Some(tls) = &mut self.tls {
            tls.send_close_notify();
            let _ = send_records(tls, &mut self.stream);
        }
    }

    /// Room for the next read in `rbuf`: grows it in steps up to [`READ_CHUNK`] at a time;
    /// returns where a read may end.
    fn read_room(&mut self, limit: usize) -> usize {
        if self.rbuf.len() == self.rlen {
            let grow = self.rbuf.len().clamp(4096, READ_CHUNK);
            self.rbuf.resize(self.rbuf.len() + grow, 0);
        }
        self.rbuf.len().min(limit)
    }

    /// Reads until the socket is empty or the buffer holds `limit` bytes; true when the socket
    /// is known to be empty (if the read stopped at the limit instead, bytes may wait that no
    /// new edge will announce).
    pub(super) fn fill(&mut self, limit: usize) -> bool {
        if self.tls.is_some() {
            return self.fill_tls(limit);
        }
        let mut drained = false;
        while !self.gone && self.rlen < limit {
            let end = self.read_room(limit);
            let want = end - self.rlen;
            match self.stream.read(&mut self.rbuf[self.rlen..end]) {
                Ok(0) => self.gone = true,
                Ok(n) => {
                    self.rlen += n;
                    if n < want && !self.hup {
                        // A short read drained the socket: the next byte brings a new edge, so
                        // the read that would only say EAGAIN is skipped.
                        drained = true;
                        break;
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    drained = true;
                    break;
                }
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => self.gone = true,
            }
        }
        self.undrained = !drained && !self.gone;
        drained
    }

    /// [`Client::fill`] through the TLS session: plaintext it already holds first, then
    /// ciphertext from the socket, decrypted, and the session's own records (handshake
    /// flights, alerts, tickets) written as they appear. A TLS error (garbage, a refused
    /// handshake) writes the alert rustls queued and marks the connection gone.
    fn fill_tls(&mut self, limit: usize) -> bool {
        let mut drained = false;
        while !self.gone && self.rlen < limit {
            let end = self.read_room(limit);
            let tls = self.tls.as_mut().expect("a TLS session");
            match tls.reader().read(&mut self.rbuf[self.rlen..end]) {
                Ok(0) => self.gone = true, // close_notify
                Ok(n) => self.rlen += n,
                Err(e) if e.kind() == ErrorKind::WouldBlock && drained => break,
                Err(e) if e.kind() == ErrorKind::WouldBlock => {
                    drained = self.read_records();
                }
                Err(_) => self.gone = true, // the peer closed without close_notify
            }
        }
        self.undrained = !drained && !self.gone;
        drained
    }

    /// One read of ciphertext into the TLS session, processed, and the records it makes the
    /// session send written; true when the socket is known to be empty.
    fn read_records(&mut self) -> bool {
        let tls = self.tls.as_mut().expect("a TLS session");
        let mut socket = Socket { stream: &mut self.stream, short: false };
        let drained = match tls.read_tls(&mut socket) {
            Ok(0) => false, // EOF: rustls records it, and its reader says so next
            Ok(_) => socket.short && !self.hup,
            Err(e) if e.kind() == ErrorKind::WouldBlock => true,
            Err(e) if e.kind() == ErrorKind::Interrupted => false,
            Err(_) => {
                self.gone = true;
                return false;
            }
        };
        let processed = tls.process_new_packets();
        self.tls_failed |= processed.is_err();
        if send_records(tls, &mut self.stream).is_err() || processed.is_err() {
            self.gone = true;
        }
        drained
    }

    /// Writes what the write buffer holds until the socket takes no more; returns the bytes
    /// written (plaintext bytes, on TLS: those the session took).
    pub(super) fn write_out(&mut self) -> u64 {
        if self.tls.is_some() {
            return self.write_out_tls();
        }
        let mut written = 0;
        while self.wpos < self.wbuf.len() {
            match self.stream.write(&self.wbuf[self.wpos..]) {
                Ok(0) => {
                    self.gone = true;
                    break;
                }
                Ok(n) => {
                    self.wpos += n;
                    written += n as u64;
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => {
                    self.gone = true;
                    break;
                }
            }
        }
        self.reset_when_flushed();
        written
    }
}

impl Client {
    /// [`Client::write_out`] through the TLS session: plaintext into its writer (which takes
    /// up to its buffer limit, 64 KiB by default), records out to the socket, until the socket
    /// or the session takes no more.
    fn write_out_tls(&mut self) -> u64 {
        let tls = self.tls.as_mut().expect("a TLS session");
        let mut written = 0;
        loop {
            let mut took = 0;
            if self.wpos < self.wbuf.len() {
                match tls.writer().write(&self.wbuf[self.wpos..]) {
                    Ok(n) => took = n,
                    Err(_) => {
                        self.gone = true;
                        break;
                    }
                }
            }
            self.wpos += took;
            written += took as u64;
            if send_records(tls, &mut self.stream).is_err() {
                self.gone = true;
                break;
            }
            // Records left: the socket took no more. None left: go on while plaintext is left
            // and the session took some of it.
            if tls.wants_write() || self.wpos == self.wbuf.len() || took == 0 {
                break;
            }
        }
        self.reset_when_flushed();
        written
    }

    /// Empties the write buffer once all of it has gone out.
    fn reset_when_flushed(&mut self) {
        if self.wpos == self.wbuf.len() {
            self.wbuf.clear();
            self.wpos = 0;
        }
    }
}

/// The socket as rustls reads it, remembering whether the last read came back short of the
/// room it was given (the socket is then empty, as for a short plaintext read).
struct Socket<'a> {
    stream: &'a mut TcpStream,
    short: bool,
}

impl Read for Socket<'_> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let n = self.stream.read(buf)?;
        self.short = n < buf.len();
        Ok(n)
    }
}

/// Writes the records a TLS session holds until it holds none or the socket takes no more;
/// an error when the connection failed.
fn send_records(tls: &mut ServerConnection, stream: &mut TcpStream) -> Result<(), ()> {
    while tls.wants_write() {
        match tls.write_tls(stream) {
            Ok(0) => return Err(()),
            Ok(_) => {}
            Err(e) if e.kind() == ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Err(()),
        }
    }
    Ok(())
}

/// Half-closes `stream` and reads away the input that has already arrived, at most
/// [`DISCARD_MAX`] bytes, before it is dropped: closing a socket with unread input makes the
/// kernel send a reset instead of a FIN, and a reset discards the responses still queued for
/// the client (the answers to pipelined requests before a malformed one, or the 400, 408 or
/// 413 itself). RFC 9112 9.6 asks for this "lingering close"; input that arrives after the
/// close can still reset the connection, as with any server that does not keep the socket.
pub(super) fn discard_unread(stream: &mut TcpStream, scratch: &mut Vec<u8>) {
    let _ = stream.shutdown(Shutdown::Write);
    read_away(stream, scratch);
}

/// Reads and drops what `stream` holds, at most [`DISCARD_MAX`] bytes (a flood's next bytes
/// bring a new edge); true when the peer closed or the connection failed.
pub(super) fn read_away(stream: &mut TcpStream, scratch: &mut Vec<u8>) -> bool {
    scratch.clear();
    scratch.resize(16 << 10, 0);
    let mut discarded = 0;
    let closed = loop {
        if discarded >= DISCARD_MAX {
            break false;
        }
        match stream.read(scratch) {
            Ok(0) => break true,
            Ok(n) => discarded += n,
            Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => break true,
        }
    };
    scratch.clear();
    closed
}
