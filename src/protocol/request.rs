//! Request heads (RFC 9112 sections 2-3, 6): tokenised by httparse, then checked for framing,
//! smuggling shapes and the router's own headers.
//!
//! [`parse_request_head`] is called with everything buffered so far; it returns `Ok(None)` until
//! the empty line that ends the head has arrived and parses from the start each time (heads are
//! short and bounded by `max_header_bytes`, and httparse scans at SIMD speed). It never looks past
//! `max_header_bytes` bytes, so the answer for a given byte stream does not depend on how the
//! stream was split into reads. Bytes after the head (a body, or a pipelined request) are left
//! for the caller: the head ends at [`RequestHead::head_len`].

use std::mem::MaybeUninit;

use super::error::{ErrorKind, ProtocolError};
use super::{
    map_httparse, tokens, trim, HeaderList, Limits, Side, Span, Version, HEADERS_MAX,
    SESSION_ID_BYTES_MAX,
};

/// How a request body is delimited (RFC 9112 6.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Framing {
    /// No `Content-Length` nor `Transfer-Encoding`: no body.
    None,
    /// `Content-Length: n` (already checked against `max_body_bytes`).
    ContentLength(u64),
    /// `Transfer-Encoding: chunked`: decode with a [`ChunkedDecoder`](super::ChunkedDecoder).
    Chunked,
}

/// A parsed and checked request head. Text fields are [`Span`]s into the buffer it was parsed
/// from, so headers are forwarded later without copying.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestHead {
    /// The method token.
    pub method: Span,
    /// The request target as sent: path and query.
    pub target: Span,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// Every header line, in order.
    pub headers: HeaderList,
    /// Bytes of the head, request line to empty line included; the body starts here.
    pub head_len: usize,
    /// How the body is delimited.
    pub framing: Framing,
    /// Whether the connection stays open after this exchange: HTTP/1.1 unless `Connection:
    /// close`; HTTP/1.0 only with `Connection: keep-alive` (and no `close`).
    pub keep_alive: bool,
    /// `Expect: 100-continue` was sent: answer `100 Continue` before reading the body.
    pub expect_continue: bool,
    /// The session header's value, trimmed; `None` when absent or empty (SPEC 2.4).
    pub session_id: Option<Span>,
    /// The first `X-Request-ID` value, if any.
    pub request_id: Option<Span>,
}

impl Default for RequestHead {
    fn default() -> RequestHead {
        RequestHead::EMPTY
    }
}

impl RequestHead {
    /// An empty head, for a parser to fill ([`parse_request_head_into`]).
    pub const EMPTY: RequestHead = RequestHead {
        method: Span::EMPTY,
        target: Span::EMPTY,
        version: Version::Http11,
        headers: HeaderList::EMPTY,
        head_len: 0,
        framing: Framing::None,
        keep_alive: false,
        expect_continue: false,
        session_id: None,
        request_id: None,
    };

    /// The method, e.g. `b"POST"`.
    pub fn method<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        self.method.get(buf)
    }

    /// The request target, path and query.
    pub fn target<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        self.target.get(buf)
    }

    /// The path: the target up to `?`.
    pub fn path<'b>(&self, buf: &'b [u8]) -> &'b [u8] {
        let target = self.target(buf);
        target.split(|&b| b == b'?').next().unwrap_or(target)
    }

    /// The query after `?`, if there is one.
    pub fn query<'b>(&self, buf: &'b [u8]) -> Option<&'b [u8]> {
        let target = self.target(buf);
        target.iter().position(|&b| b == b'?').map(|q| &target[q + 1..])
    }

    /// The session id's bytes (visible ASCII), if any.
    pub fn session_id<'b>(&self, buf: &'b [u8]) -> Option<&'b [u8]> {
        self.session_id.map(|s| s.get(buf))
    }
}

/// What the header lines say, gathered in one pass.
#[derive(Debug, Default)]
struct Facts {
    content_length: Option<u64>,
    transfer_encoding: bool,
    close: bool,
    keep_alive: bool,
    expect_continue: bool,
    hosts: u32,
    session_id: Option<Span>,
    session_seen: bool,
    request_id: Option<Span>,
}

/// Parses and checks the request head at the start of `buf`.
///
/// Returns `Ok(None)` while the head is incomplete, `Ok(Some(head))` once it is complete, or the
/// first rule it breaks (see the [module docs](super) for the list). Duplicate `Content-Length`
/// lines are refused even when their values are equal.
pub fn parse_request_head(
    buf: &[u8],
    limits: &Limits,
) -> Result<Option<RequestHead>, ProtocolError> {
    let mut head = RequestHead::EMPTY;
    Ok(parse_request_head_into(buf, limits, &mut head)?.then_some(head))
}

/// [`parse_request_head`] into `head`, which a connection keeps from one request to the next:
/// `Ok(true)` when the head was complete and `head` is it. On `Ok(false)` or an error `head` is
/// left in some state nothing should read. The router's hot path parses this way, so that a
/// head's 2 KiB of header spans are written once, where they are kept, and neither cleared
/// beforehand nor copied afterwards.
pub fn parse_request_head_into(
    buf: &[u8],
    limits: &Limits,
    head: &mut RequestHead,
) -> Result<bool, ProtocolError> {
    let err = ProtocolError::downstream;
    let window = &buf[..buf.len().min(limits.max_header_bytes).min(u32::MAX as usize)];
    let mut raw = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; HEADERS_MAX];
    let max_headers = limits.max_headers.min(HEADERS_MAX);
    let mut req = httparse::Request::new(&mut []);
    let status = req
        .parse_with_uninit_headers(window, &mut raw[..max_headers])
        .map_err(|e| map_httparse(e, Side::Downstream))?;
    let httparse::Status::Complete(head_len) = status else {
        return match window.len() >= limits.max_header_bytes {
            true => Err(err(ErrorKind::HeadTooLarge)),
            false => Ok(false),
        };
    };
    let (Some(method), Some(target), Some(minor)) = (req.method, req.path, req.version) else {
        return Err(err(ErrorKind::InvalidStartLine));
    };
    let version = Version::from_minor(minor);
    head.headers.fill(buf, req.headers);
    let facts = gather(buf, &head.headers, limits)?;
    let framing = framing(&facts, version, limits)?;
    if facts.hosts > 1 || version == Version::Http11 && facts.hosts == 0 {
        return Err(err(ErrorKind::InvalidHost));
    }
    // Every field but the spans already written, named so that a new field cannot be missed.
    let RequestHead {
        method: head_method,
        target: head_target,
        version: head_version,
        headers: _,
        head_len: head_head_len,
        framing: head_framing,
        keep_alive,
        expect_continue,
        session_id,
        request_id,
    } = head;
    *head_method = Span::of(buf, method.as_bytes());
    *head_target = Span::of(buf, target.as_bytes());
    *head_version = version;
    *head_head_len = head_len;
    *head_framing = framing;
    *keep_alive = match version {
        Version::Http11 => !facts.close,
        Version::Http10 => facts.keep_alive && !facts.close,
    };
    *expect_continue = facts.expect_continue;
    *session_id = facts.session_id;
    *request_id = facts.request_id;
    Ok(true)
}

/// One pass over the header lines.
fn gather(buf: &[u8], headers: &HeaderList, limits: &Limits) -> Result<Facts, ProtocolError> {
    let err = ProtocolError::downstream;
    let mut facts = Facts::default();
    for h in headers.as_slice() {
        let name = h.name.get(buf);
        let value = h.value.get(buf);
        if name.eq_ignore_ascii_case(b"content-length") {
            if facts.content_length.is_some() {
                return Err(err(ErrorKind::DuplicateContentLength));
            }
            let length = parse_content_length(value).ok_or(err(ErrorKind::InvalidContentLength))?;
            facts.content_length = Some(length);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            // Exactly one line holding exactly `chunked`: a list, a second line or another coding
            // is refused rather than interpreted.
            if facts.transfer_encoding || !trim(value).eq_ignore_ascii_case(b"chunked") {
                return Err(err(ErrorKind::UnsupportedTransferEncoding));
            }
            facts.transfer_encoding = true;
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in tokens(value) {
                facts.close |= token.eq_ignore_ascii_case(b"close");
                facts.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case(b"expect") {
            facts.expect_continue |= trim(value).eq_ignore_ascii_case(b"100-continue");
        } else if name.eq_ignore_ascii_case(b"host") {
            facts.hosts += 1;
        } else if name.eq_ignore_ascii_case(b"x-request-id") {
            facts.request_id = facts.request_id.or(Some(h.value));
        } else if name.eq_ignore_ascii_case(limits.session_header.as_bytes()) {
            if facts.session_seen {
                return Err(err(ErrorKind::InvalidSessionId));
            }
            facts.session_seen = true;
            facts.session_id = session_id(buf, h.value)?;
        }
    }
    Ok(facts)
}

/// The body framing, refusing the smuggling shapes of RFC 9112 6.1 and 6.3.
fn framing(facts: &Facts, version: Version, limits: &Limits) -> Result<Framing, ProtocolError> {
    let err = ProtocolError::downstream;
    match (facts.content_length, facts.transfer_encoding) {
        (Some(_), true) => Err(err(ErrorKind::ContentLengthWithTransferEncoding)),
        (None, true) if version == Version::Http10 => Err(err(ErrorKind::TransferEncodingInHttp10)),
        (None, true) => Ok(Framing::Chunked),
        (Some(n), false) if n > limits.max_body_bytes => Err(err(ErrorKind::BodyTooLarge)),
        (Some(n), false) => Ok(Framing::ContentLength(n)),
        (None, false) => Ok(Framing::None),
    }
}

/// `1*DIGIT` as a `u64`; `None` for anything else (empty, sign, list, overflow).
pub(super) fn parse_content_length(value: &[u8]) -> Option<u64> {
    let value = trim(value);
    if value.is_empty() {
        return None;
    }
    value.iter().try_fold(0u64, |n, &b| {
        let digit = b.checked_sub(b'0').filter(|d| *d < 10)?;
        n.checked_mul(10)?.checked_add(u64::from(digit))
    })
}

/// The session id (SPEC 2.4): trimmed; empty is none; over 256 bytes or not visible ASCII is an
/// error.
fn session_id(buf: &[u8], value: Span) -> Result<Option<Span>, ProtocolError> {
    let bytes = value.get(buf);
    let trimmed = trim(bytes);
    if trimmed.is_empty() {
        return Ok(None);
    }
    if trimmed.len() > SESSION_ID_BYTES_MAX {
        return Err(ProtocolError::downstream(ErrorKind::SessionIdTooLong));
    }
    if !trimmed.iter().all(|b| (0x21..=0x7e).contains(b)) {
        return Err(ProtocolError::downstream(ErrorKind::InvalidSessionId));
    }
    Ok(Some(Span::of(buf, trimmed)))
}

#[cfg(test)]
#[path = "request_tests.rs"]
mod tests;
