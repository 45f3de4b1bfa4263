//! A client's request ([`Request`]), the slots that hold them ([`Requests`]), and what names a
//! request: its session key and its `X-Request-ID`.
//!
//! A request's state (its parsed head, 2 KiB of header spans; its chunked decoder and decoded
//! body; its admission; what was relayed) lives in a slot of an arena that the client room
//! owns, found by a `u32` index (STYLE.md, "Index, don't point"), not in a box of its own: a
//! client connection parses a head into the slot it will take ([`Requests::next_head`]), takes
//! it once the head is complete ([`Requests::start`], which resets every other field in place)
//! and gives it back when the request ends. The free list is last in, first out, so a keep-alive connection's next request
//! usually takes the slot its last one gave back: a request's state costs no allocation once
//! the arena has grown to the requests in flight, and a slot keeps its decoded-body buffer up to
//! [`DECODED_KEEP_MAX`]. Not inline in the connection: 2.3 KiB on every idle connection would be
//! ten times what one holds after its idle release. The arena grows to the most requests in
//! flight at once (at most one per open connection); when none is in flight, an arena grown past
//! [`SLOTS_KEPT_IDLE`] slots is freed, so a burst does not leave its memory behind.

use std::ops::{Index, IndexMut, Range};

use crate::clock::Tick;
use crate::protocol::usage::UsageScanner;
use crate::protocol::SESSION_ID_BYTES_MAX;
use crate::protocol::{ChunkedDecoder, ErrorKind, ProtocolError, RequestHead, Span};
use crate::scheduler::{Lane, RequestId};
use crate::server::metrics::UpstreamError;
use crate::server::rate_limit::{Limit, Reservation};

/// A free slot keeps a decoded body's buffer up to this capacity (a larger one is freed).
const DECODED_KEEP_MAX: usize = 64 << 10;
/// Slots the arena keeps when no request is in flight; past this it is freed then.
const SLOTS_KEPT_IDLE: usize = 64;

/// The admission of the current request.
#[derive(Debug, Clone, Copy)]
pub(super) struct Admission {
    pub(super) backend: u16,
    pub(super) lane: Lane,
    pub(super) waited: Tick,
    /// Issue \[10\]: the turn depth's bucket
    /// ([`turn_bucket`](crate::scheduler::tracker::turn_bucket)) and the prefix predicted at
    /// admission.
    pub(super) turn: usize,
    pub(super) warm: bool,
}

/// Which session source identified the request (issue \[10\]) and where the value lies: what
/// the session key was hashed from, the debug header names and the access log writes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Session {
    /// No source was present (or none was looked for yet).
    #[default]
    None,
    /// A header: the trimmed value's span in the client's `rbuf`.
    Header(Span),
    /// A body field: its string's contents, as sent, at `start..end` of [`Request::body`].
    Body { start: usize, end: usize },
    /// None was sent; the scheduler matched the prompt to a completed turn (set at admission).
    Derived,
}

impl Session {
    /// The `x-warmpath-session-source` value and the access log's `session_source`.
    pub(super) fn source_name(self) -> &'static str {
        match self {
            Session::None => "none",
            Session::Header(_) => "header",
            Session::Body { .. } => "body",
            Session::Derived => "derived",
        }
    }
}

/// The request a client connection is working on. Its head's spans point into `Client::rbuf`.
#[derive(Debug, Default)]
pub(super) struct Request {
    pub(super) head: RequestHead,
    pub(super) id: RequestId,
    pub(super) model: Option<u16>,
    /// Issue \[11\]: the tenant its API key names, from 1 (`generation::Tenant` at index - 1);
    /// [`NO_TENANT`](crate::server::generation::NO_TENANT) when no tenant is configured or the
    /// route needs no key.
    pub(super) tenant: u16,
    /// Chunked body decoder and the decoded body.
    pub(super) decoder: Option<ChunkedDecoder>,
    pub(super) decoded: Vec<u8>,
    /// Bytes of `rbuf` belonging to this request: head plus raw body (known once complete).
    pub(super) raw_len: usize,
    /// First byte of the request seen.
    pub(super) started: Tick,
    pub(super) streaming: bool,
    /// The `"model"` string token in the body (what `upstream_model` replaces).
    pub(super) model_token: Range<usize>,
    /// Where its session identity came from (set when it is routed).
    pub(super) session: Session,
    pub(super) admission: Option<Admission>,
    /// Bytes counted in the shard's buffered-bytes gauge while queued.
    pub(super) buffered: u64,
    /// The pooled connection that died was already replaced once.
    pub(super) reconnected: bool,
    pub(super) forwarded_at: Tick,
    pub(super) first_byte_sent: bool,
    /// The response status, once known.
    pub(super) status: u16,
    /// Whether the client connection stays open after the response.
    pub(super) keep_alive: bool,
    /// The response is complete in `wbuf`; `Some(success)` waits for the flush to report it.
    pub(super) complete: Option<bool>,
    /// Response bytes written to the client (the access log's `bytes_out`).
    pub(super) bytes_out: u64,
    /// Forwarded to the backend's response head, once it came.
    pub(super) ttfb: Option<Tick>,
    /// The backend failed after response bytes were relayed (the stream was cut).
    pub(super) failure: Option<UpstreamError>,
    /// Reads the `usage` of a 2xx response as it is relayed (what the scheduler learns from).
    pub(super) usage: UsageScanner,
    /// Issue \[11\]: what it reserved of its tenant's limits, until it settles (`limits.rs`).
    pub(super) reservation: Option<Reservation>,
    /// The prompt's estimated tokens, as reserved.
    pub(super) prompt_estimate: u64,
    /// The limit that refused it.
    pub(super) limited: Option<Limit>,
    /// The tokens it reserved (with a token limit) and settled to, for the access log.
    pub(super) tokens_reserved: Option<u64>,
    pub(super) tokens_used: Option<u64>,
}

impl Request {
    /// Starts the slot over for the request whose head was just parsed into it at `now`: every
    /// field but the head as a new request has it; the decoded body's buffer, emptied, keeps
    /// its capacity.
    fn reset(&mut self, decoder: Option<ChunkedDecoder>, now: Tick) {
        // Every field named, so that a new one cannot be left out of the reset.
        let Request {
            head,
            id,
            model,
            tenant,
            decoder: chunked,
            decoded,
            raw_len,
            started,
            streaming,
            model_token,
            session,
            admission,
            buffered,
            reconnected,
            forwarded_at,
            first_byte_sent,
            status,
            keep_alive,
            complete,
            bytes_out,
            ttfb,
            failure,
            usage,
            reservation,
            prompt_estimate,
            limited,
            tokens_reserved,
            tokens_used,
        } = self;
        *id = RequestId(0);
        *model = None;
        *tenant = crate::server::generation::NO_TENANT;
        *chunked = decoder;
        decoded.clear();
        *raw_len = head.head_len;
        *started = now;
        *streaming = false;
        *model_token = 0..0;
        *session = Session::None;
        *admission = None;
        *buffered = 0;
        *reconnected = false;
        *forwarded_at = 0;
        *first_byte_sent = false;
        *status = 0;
        *keep_alive = head.keep_alive;
        *complete = None;
        *bytes_out = 0;
        *ttfb = None;
        *failure = None;
        *usage = UsageScanner::new();
        *reservation = None;
        *prompt_estimate = 0;
        *limited = None;
        *tokens_reserved = None;
        *tokens_used = None;
    }

    /// The body of a complete request: in the client's buffer `rbuf` after the head, or
    /// decoded from chunks.
    pub(super) fn body<'a>(&'a self, rbuf: &'a [u8]) -> &'a [u8] {
        match self.decoder {
            Some(_) => &self.decoded,
            None => &rbuf[self.head.head_len..self.raw_len],
        }
    }

    /// The session id's bytes, from whichever source gave them.
    pub(super) fn session_value<'a>(&'a self, rbuf: &'a [u8]) -> Option<&'a [u8]> {
        match self.session {
            Session::None | Session::Derived => None,
            Session::Header(span) => Some(span.get(rbuf)),
            Session::Body { start, end } => Some(&self.body(rbuf)[start..end]),
        }
    }

    /// Whether it is a `HEAD` (its answer carries no content).
    pub(super) fn is_head(&self, rbuf: &[u8]) -> bool {
        self.head.method(rbuf) == b"HEAD"
    }
}

/// The request slots of a shard's client connections: an arena indexed by `u32`, with a free
/// list (see the module doc).
#[derive(Debug, Default)]
pub(super) struct Requests {
    slots: Vec<Request>,
    /// Slots no request holds, the last given back on top.
    free: Vec<u32>,
}

impl Requests {
    /// The head the next [`start`](Requests::start) takes: the head of the free slot given
    /// back last, or of a new slot. The request's head is parsed into it in place
    /// ([`parse_request_head_into`](crate::protocol::parse_request_head_into)), so its 2 KiB
    /// of header spans are not copied into the slot afterwards.
    pub(super) fn next_head(&mut self) -> &mut RequestHead {
        let slot = match self.free.last() {
            Some(&slot) => slot,
            None => {
                let slot = u32::try_from(self.slots.len()).expect("fewer slots than connections");
                self.slots.push(Request::default());
                self.free.push(slot);
                slot
            }
        };
        &mut self.slots[slot as usize].head
    }

    /// Takes the slot whose head [`next_head`](Requests::next_head) gave, for the request
    /// parsed into it at `now`; every other field starts over.
    pub(super) fn start(&mut self, decoder: Option<ChunkedDecoder>, now: Tick) -> u32 {
        let slot = self.free.pop().expect("a head parsed into next_head's slot");
        self.slots[slot as usize].reset(decoder, now);
        slot
    }

    /// The request in `slot` ended: the slot is free (its decoded body's buffer kept up to
    /// [`DECODED_KEEP_MAX`]), and when no request is left in flight an arena grown past
    /// [`SLOTS_KEPT_IDLE`] slots is freed down to that many.
    pub(super) fn release(&mut self, slot: u32) {
        let decoded = &mut self.slots[slot as usize].decoded;
        if decoded.capacity() > DECODED_KEEP_MAX {
            *decoded = Vec::new();
        }
        self.free.push(slot);
        if self.free.len() == self.slots.len() && self.slots.len() > SLOTS_KEPT_IDLE {
            self.slots.truncate(SLOTS_KEPT_IDLE);
            self.slots.shrink_to_fit();
            self.free.clear();
            self.free.shrink_to(SLOTS_KEPT_IDLE);
            self.free.extend((0..SLOTS_KEPT_IDLE as u32).rev());
        }
    }

    /// Requests in flight (slots held).
    #[cfg(test)]
    fn in_flight(&self) -> usize {
        self.slots.len() - self.free.len()
    }
}

impl Index<u32> for Requests {
    type Output = Request;

    fn index(&self, slot: u32) -> &Request {
        &self.slots[slot as usize]
    }
}

impl IndexMut<u32> for Requests {
    fn index_mut(&mut self, slot: u32) -> &mut Request {
        &mut self.slots[slot as usize]
    }
}

/// A session header value under a model's own header name: trimmed, empty is none, over 256
/// bytes or not visible ASCII is refused (SPEC 2.4).
pub(super) fn session_value(value: Option<&[u8]>) -> Result<Option<&[u8]>, &'static str> {
    let Some(value) = value else { return Ok(None) };
    let value = value.trim_ascii();
    if value.is_empty() {
        return Ok(None);
    }
    if value.len() > SESSION_ID_BYTES_MAX {
        return Err(ProtocolError::downstream(ErrorKind::SessionIdTooLong).message());
    }
    if !value.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(ProtocolError::downstream(ErrorKind::InvalidSessionId).message());
    }
    Ok(Some(value))
}

/// The 64-bit key of a session id, the same in every shard (SipHash with fixed keys).
pub(super) fn hash_session(id: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    id.hash(&mut hasher);
    hasher.finish()
}

/// `wp-` and the id in hex: the `X-Request-ID` sent when the client sent none.
pub(super) fn format_request_id(id: RequestId, buf: &mut [u8; 19]) -> &[u8] {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    buf[..3].copy_from_slice(b"wp-");
    for (i, slot) in buf[3..].iter_mut().enumerate() {
        *slot = HEX[(id.0 >> (60 - 4 * i) & 0xf) as usize];
    }
    &buf[..]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_ids_are_hex_and_decimals_are_decimal() {
        let mut buf = [0; 19];
        assert_eq!(format_request_id(RequestId(0xab), &mut buf), b"wp-00000000000000ab");
        let mut buf = [0; 20];
        assert_eq!(crate::protocol::decimal(0, &mut buf), b"0");
        assert_eq!(crate::protocol::decimal(u64::MAX, &mut buf), b"18446744073709551615");
    }

    #[test]
    fn session_values_follow_spec_2_4() {
        assert_eq!(session_value(None), Ok(None));
        assert_eq!(session_value(Some(b"  ")), Ok(None));
        assert_eq!(session_value(Some(b" abc ")), Ok(Some(&b"abc"[..])));
        assert!(session_value(Some(&[b'a'; 257])).is_err());
        assert!(session_value(Some(b"a b")).is_err());
        assert_eq!(hash_session(b"abc"), hash_session(b"abc"));
        assert_ne!(hash_session(b"abc"), hash_session(b"abd"));
    }

    /// Starts a `GET` at `now` as the client room does: its head parsed into the next slot.
    fn start_get(requests: &mut Requests, now: Tick) -> u32 {
        let limits = crate::protocol::Limits::default();
        let text = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
        let parsed = crate::protocol::parse_request_head_into(text, &limits, requests.next_head());
        assert_eq!(parsed, Ok(true));
        requests.start(None, now)
    }

    /// The slot given back last is the next one taken, every field started over and its
    /// decoded body's buffer kept (up to `DECODED_KEEP_MAX`).
    #[test]
    fn slots_are_reused_last_in_first_out() {
        let mut requests = Requests::default();
        let a = start_get(&mut requests, 1);
        let b = start_get(&mut requests, 1);
        assert_ne!(a, b);
        requests[a].decoded.extend_from_slice(b"chunk");
        requests[a].status = 200;
        requests.release(a);
        let again = start_get(&mut requests, 2);
        assert_eq!(again, a);
        assert_eq!((requests[a].status, requests[a].started), (0, 2), "every field starts over");
        assert!(requests[a].decoded.is_empty() && requests[a].decoded.capacity() >= 5);
        requests[a].decoded.reserve(DECODED_KEEP_MAX + 1);
        requests.release(a);
        assert_eq!(requests[a].decoded.capacity(), 0, "a large buffer is not kept");
        assert_eq!(requests.in_flight(), 1);
    }

    /// With no request in flight, an arena grown past `SLOTS_KEPT_IDLE` is freed down to it;
    /// a smaller one stays.
    #[test]
    fn an_idle_arena_gives_a_burst_back() {
        let mut requests = Requests::default();
        let burst: Vec<u32> =
            (0..SLOTS_KEPT_IDLE + 10).map(|_| start_get(&mut requests, 1)).collect();
        for &slot in &burst[1..] {
            requests.release(slot);
        }
        assert_eq!(requests.slots.len(), SLOTS_KEPT_IDLE + 10, "one is still in flight");
        requests.release(burst[0]);
        assert_eq!((requests.slots.len(), requests.in_flight()), (SLOTS_KEPT_IDLE, 0));
        let taken: Vec<u32> = (0..SLOTS_KEPT_IDLE).map(|_| start_get(&mut requests, 2)).collect();
        assert!(taken.iter().all(|&slot| (slot as usize) < SLOTS_KEPT_IDLE));
        assert_eq!(requests.slots.len(), SLOTS_KEPT_IDLE, "the kept slots are reused");
    }
}
