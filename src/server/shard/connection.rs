//! A client connection ([`Client`]): its socket, its buffers, where its exchange is
//! ([`Phase`]) and the index of its request's slot; reading into it and writing out of it, and
//! reading its input away before a close. The client room ([`Clients`](super::client::Clients))
//! owns every one of them in its slab; the upstream room writes a relayed response into one.

use std::io::{ErrorKind, Read, Write};
use std::net::{IpAddr, Shutdown};

use mio::net::TcpStream;

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
    /// The request being worked on: its slot in `Clients::requests`.
    pub(super) req: Option<u32>,
}

impl Client {
    pub(super) fn new(stream: TcpStream, peer: IpAddr) -> Client {
        Client {
            stream,
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
            req: None,
        }
    }

    /// Whether the connection holds read or write buffer memory.
    pub(super) fn holds_buffers(&self) -> bool {
        self.rbuf.capacity() > 0 || self.wbuf.capacity() > 0
    }

    /// Reads until the socket is empty or the buffer holds `limit` bytes; true when the socket
    /// is known to be empty (if the read stopped at the limit instead, bytes may wait that no
    /// new edge will announce).
    pub(super) fn fill(&mut self, limit: usize) -> bool {
        let mut drained = false;
        while !self.gone && self.rlen < limit {
            if self.rbuf.len() == self.rlen {
                let grow = self.rbuf.len().clamp(4096, READ_CHUNK);
                self.rbuf.resize(self.rbuf.len() + grow, 0);
            }
            let end = self.rbuf.len().min(limit);
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

    /// Writes what the write buffer holds until the socket takes no more; returns the bytes
    /// written.
    pub(super) fn write_out(&mut self) -> u64 {
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
        if self.wpos == self.wbuf.len() {
            self.wbuf.clear();
            self.wpos = 0;
        }
        written
    }
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
