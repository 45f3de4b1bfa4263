//! Response heads from backends, the heads relayed to clients (SPEC 2.7) and the router's own
//! JSON error responses (SPEC 2, error table).
//!
//! Framing of a backend response (RFC 9112 6.3): none for 1xx, 204, 304 and answers to `HEAD`;
//! otherwise chunked, `Content-Length`, or until the backend closes. The smuggling shapes refused
//! in requests are refused here too (as 502s): both length headers, repeated or malformed
//! `Content-Length`, codings other than one `chunked`.
//!
//! Relaying to the client: the status line is always `HTTP/1.1` (RFC 9110 2.5: a server sends its
//! own version); a known length is kept; a chunked body goes to an HTTP/1.1 client
//! chunked (passed through, [`BodyRelay`](super::BodyRelay)) and a close-delimited one is
//! chunked for it (each read one chunk, [`ChunkedEncoder`](super::ChunkedEncoder)); both are
//! delimited by closing the connection for an HTTP/1.0 client. Interim 1xx responses are for the caller to skip: the
//! router sends no `Expect` or `Upgrade` upstream, so a `100` or `103` is dropped and a `101` is
//! an upstream error.

use std::mem::MaybeUninit;

use super::error::{ErrorKind, ProtocolError};
use super::json::{json_string_len, write_json_string};
use super::request::parse_content_length;
use super::{
    map_httparse, tokens, trim, write_decimal, write_header, HeaderList, HopByHop, Side, Span,
    Version, HEADERS_MAX,
};

/// How a backend response body is delimited, or how the router delimits it for the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ResponseFraming {
    /// No body: 1xx, 204, 304, or an answer to `HEAD`.
    None,
    /// `Content-Length: n`.
    ContentLength(u64),
    /// The chunked coding.
    Chunked,
    /// The body ends when the connection closes.
    UntilClose,
}

/// A parsed backend response head; text fields are [`Span`]s into the parsed buffer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseHead {
    /// The status code.
    pub status: u16,
    /// The reason phrase (may be empty).
    pub reason: Span,
    /// HTTP/1.0 or HTTP/1.1.
    pub version: Version,
    /// Every header line, in order.
    pub headers: HeaderList,
    /// Bytes of the head; the body starts here.
    pub head_len: usize,
    /// How the body is delimited.
    pub framing: ResponseFraming,
    /// Whether the backend connection can be reused after the body.
    pub keep_alive: bool,
    /// `Content-Type: text/event-stream`: flush every piece as it arrives.
    pub is_event_stream: bool,
}

impl ResponseHead {
    /// An empty head, for a parser to fill ([`parse_response_head_into`]).
    pub const EMPTY: ResponseHead = ResponseHead {
        status: 0,
        reason: Span::EMPTY,
        version: Version::Http11,
        headers: HeaderList::EMPTY,
        head_len: 0,
        framing: ResponseFraming::None,
        keep_alive: false,
        is_event_stream: false,
    };

    /// A 1xx interim response: another head follows.
    pub fn is_interim(&self) -> bool {
        (100..200).contains(&self.status)
    }
}

/// Parses a backend response head at the start of `buf`; `Ok(None)` while incomplete. Pass
/// `request_was_head` when the request was `HEAD` (its response has no body). Every error is an
/// [`Side::Upstream`] error (502).
pub fn parse_response_head(
    buf: &[u8],
    max_header_bytes: usize,
    request_was_head: bool,
) -> Result<Option<ResponseHead>, ProtocolError> {
    let mut head = ResponseHead::EMPTY;
    let complete = parse_response_head_into(buf, max_header_bytes, request_was_head, &mut head)?;
    Ok(complete.then_some(head))
}

/// [`parse_response_head`] into `head`, which a shard keeps from one response to the next:
/// `Ok(true)` when the head was complete and `head` is it; on `Ok(false)` or an error `head` is
/// left in some state nothing should read (as
/// [`parse_request_head_into`](super::parse_request_head_into)).
pub fn parse_response_head_into(
    buf: &[u8],
    max_header_bytes: usize,
    request_was_head: bool,
    head: &mut ResponseHead,
) -> Result<bool, ProtocolError> {
    let err = ProtocolError::upstream;
    let window = &buf[..buf.len().min(max_header_bytes).min(u32::MAX as usize)];
    let mut raw = [const { MaybeUninit::<httparse::Header<'_>>::uninit() }; HEADERS_MAX];
    let mut res = httparse::Response::new(&mut []);
    let status = httparse::ParserConfig::default()
        .parse_response_with_uninit_headers(&mut res, window, &mut raw)
        .map_err(|e| map_httparse(e, Side::Upstream))?;
    let httparse::Status::Complete(head_len) = status else {
        return match window.len() >= max_header_bytes {
            true => Err(err(ErrorKind::HeadTooLarge)),
            false => Ok(false),
        };
    };
    let (Some(code), Some(minor)) = (res.code, res.version) else {
        return Err(err(ErrorKind::InvalidStartLine));
    };
    // httparse takes any three digits; RFC 9110 15 defines 100 to 599. Anything else would be
    // relayed as a status line the client cannot parse (`004` is written as `4`).
    if !(100..=599).contains(&code) {
        return Err(err(ErrorKind::InvalidStartLine));
    }
    let version = Version::from_minor(minor);
    head.headers.fill(buf, res.headers);
    let facts = gather(buf, &head.headers, version)?;
    let framing = if request_was_head || matches!(code, 100..=199 | 204 | 304) {
        ResponseFraming::None
    } else if facts.chunked {
        ResponseFraming::Chunked
    } else if let Some(n) = facts.content_length {
        ResponseFraming::ContentLength(n)
    } else {
        ResponseFraming::UntilClose
    };
    let persistent = match version {
        Version::Http11 => !facts.close,
        Version::Http10 => facts.keep_alive && !facts.close,
    };
    // Every field but the spans already written, named so that a new field cannot be missed.
    let ResponseHead {
        status,
        reason,
        version: head_version,
        headers: _,
        head_len: head_head_len,
        framing: head_framing,
        keep_alive,
        is_event_stream,
    } = head;
    *status = code;
    *reason = res.reason.map_or(Span::EMPTY, |r| Span::of(buf, r.as_bytes()));
    *head_version = version;
    *head_head_len = head_len;
    *head_framing = framing;
    *keep_alive = persistent && framing != ResponseFraming::UntilClose;
    *is_event_stream = facts.event_stream;
    Ok(true)
}

#[derive(Debug, Default)]
struct Facts {
    content_length: Option<u64>,
    chunked: bool,
    close: bool,
    keep_alive: bool,
    event_stream: bool,
}

fn gather(buf: &[u8], headers: &HeaderList, version: Version) -> Result<Facts, ProtocolError> {
    let err = ProtocolError::upstream;
    let mut facts = Facts::default();
    for h in headers.as_slice() {
        let (name, value) = (h.name.get(buf), h.value.get(buf));
        if name.eq_ignore_ascii_case(b"content-length") {
            if facts.content_length.is_some() {
                return Err(err(ErrorKind::DuplicateContentLength));
            }
            facts.content_length =
                Some(parse_content_length(value).ok_or(err(ErrorKind::InvalidContentLength))?);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            if facts.chunked || !trim(value).eq_ignore_ascii_case(b"chunked") {
                return Err(err(ErrorKind::UnsupportedTransferEncoding));
            }
            facts.chunked = true;
        } else if name.eq_ignore_ascii_case(b"connection") {
            for token in tokens(value) {
                facts.close |= token.eq_ignore_ascii_case(b"close");
                facts.keep_alive |= token.eq_ignore_ascii_case(b"keep-alive");
            }
        } else if name.eq_ignore_ascii_case(b"content-type") {
            let media = value.split(|&b| b == b';').next().unwrap_or(value);
            facts.event_stream = trim(media).eq_ignore_ascii_case(b"text/event-stream");
        }
    }
    match (facts.content_length.is_some(), facts.chunked) {
        (true, true) => Err(err(ErrorKind::ContentLengthWithTransferEncoding)),
        (_, true) if version == Version::Http10 => Err(err(ErrorKind::TransferEncodingInHttp10)),
        _ => Ok(facts),
    }
}

/// The client side of a relayed response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ClientInfo {
    /// The client's HTTP version.
    pub version: Version,
    /// Whether the client connection may stay open (the request's keep-alive decision).
    pub keep_alive: bool,
}

/// How the router sends a relayed body to the client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RelayPlan {
    /// Body framing towards the client.
    pub framing: ResponseFraming,
    /// Whether the client connection stays open afterwards.
    pub keep_alive: bool,
}

/// Appends the head relayed to the client for backend response `head` (parsed from `buf`):
/// its status and reason, its headers minus hop-by-hop ones (a `Content-Length` stays when the
/// client framing is that length, whatever `Connection` names), the framing chosen for the
/// client, `Connection` when needed, then `extra_headers`. Returns how to send the body.
pub fn write_client_response_head(
    head: &ResponseHead,
    buf: &[u8],
    out: &mut Vec<u8>,
    client: &ClientInfo,
    extra_headers: &[(&str, &[u8])],
) -> RelayPlan {
    let framing = match head.framing {
        ResponseFraming::Chunked | ResponseFraming::UntilClose
            if client.version == Version::Http11 =>
        {
            ResponseFraming::Chunked
        }
        ResponseFraming::Chunked | ResponseFraming::UntilClose => ResponseFraming::UntilClose,
        other => other,
    };
    let keep_alive = client.keep_alive && framing != ResponseFraming::UntilClose;
    let drop_length = framing != ResponseFraming::None
        && !matches!(framing, ResponseFraming::ContentLength(_))
        || matches!(head.status, 100..=199 | 204);
    out.extend_from_slice(b"HTTP/1.1 ");
    write_decimal(out, u64::from(head.status));
    out.push(b' ');
    out.extend_from_slice(head.reason.get(buf));
    out.extend_from_slice(b"\r\n");
    // The length goes by the framing chosen for the client alone: a `Connection` header naming
    // it must not take it out of a length-framed response (the client could not find the
    // body's end on a connection kept alive).
    let hop_by_hop = HopByHop::of(&head.headers, buf, &["content-length"]);
    for h in head.headers.as_slice() {
        let name = h.name.get(buf);
        let is_length = name.eq_ignore_ascii_case(b"content-length");
        if hop_by_hop.contains(name) || is_length && drop_length {
            continue;
        }
        write_header(out, name, h.value.get(buf));
    }
    if framing == ResponseFraming::Chunked {
        out.extend_from_slice(b"Transfer-Encoding: chunked\r\n");
    }
    write_connection(out, client.version, keep_alive);
    for (name, value) in extra_headers {
        write_header(out, name.as_bytes(), value);
    }
    out.extend_from_slice(b"\r\n");
    RelayPlan { framing, keep_alive }
}

/// `Connection: close` when closing, `Connection: keep-alive` when keeping an HTTP/1.0 client.
fn write_connection(out: &mut Vec<u8>, version: Version, keep_alive: bool) {
    match (keep_alive, version) {
        (false, _) => out.extend_from_slice(b"Connection: close\r\n"),
        (true, Version::Http10) => out.extend_from_slice(b"Connection: keep-alive\r\n"),
        (true, Version::Http11) => {}
    }
}

/// Appends a router error response (SPEC 2): status line, `Content-Type: application/json`,
/// `Content-Length`, `Retry-After: 1` for 429, 503 and 504 unless `extra_headers` has one, the
/// extra headers (e.g. `Connection: close`), and the body
/// `{"error":{"message":...,"type":...,"code":...}}`. `type` is `invalid_request_error` for
/// 4xx, `rate_limit_error` for 429 and `server_error` for 5xx, as OpenAI's API names them.
pub fn write_error(
    status: u16,
    code: &str,
    message: &str,
    out: &mut Vec<u8>,
    extra_headers: &[(&str, &[u8])],
) {
    let kind = match status {
        429 => "rate_limit_error",
        500.. => "server_error",
        _ => "invalid_request_error",
    };
    const PARTS: [&str; 4] = ["{\"error\":{\"message\":", ",\"type\":\"", "\",\"code\":", "}}"];
    let body_len = PARTS.iter().map(|p| p.len()).sum::<usize>()
        + json_string_len(message)
        + kind.len()
        + json_string_len(code);
    out.extend_from_slice(b"HTTP/1.1 ");
    write_decimal(out, u64::from(status));
    out.push(b' ');
    out.extend_from_slice(reason_phrase(status).as_bytes());
    out.extend_from_slice(b"\r\nContent-Type: application/json\r\nContent-Length: ");
    write_decimal(out, body_len as u64);
    out.extend_from_slice(b"\r\n");
    let has_retry_after = extra_headers.iter().any(|(n, _)| n.eq_ignore_ascii_case("retry-after"));
    if matches!(status, 429 | 503 | 504) && !has_retry_after {
        out.extend_from_slice(b"Retry-After: 1\r\n");
    }
    for (name, value) in extra_headers {
        write_header(out, name.as_bytes(), value);
    }
    out.extend_from_slice(b"\r\n");
    let body_start = out.len();
    out.extend_from_slice(PARTS[0].as_bytes());
    write_json_string(message, out);
    out.extend_from_slice(PARTS[1].as_bytes());
    out.extend_from_slice(kind.as_bytes());
    out.extend_from_slice(PARTS[2].as_bytes());
    write_json_string(code, out);
    out.extend_from_slice(PARTS[3].as_bytes());
    debug_assert_eq!(out.len() - body_start, body_len);
}

/// Appends the error response for a protocol error, with `Connection: close` (the connection
/// cannot be trusted after a framing error).
pub fn write_protocol_error(err: ProtocolError, out: &mut Vec<u8>) {
    write_error(err.status(), err.code(), err.message(), out, &[("Connection", b"close")]);
}

/// The reason phrase of the statuses the router produces (RFC 9110 section 15).
pub fn reason_phrase(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        200 => "OK",
        400 => "Bad Request",
        401 => "Unauthorized",
        404 => "Not Found",
        408 => "Request Timeout",
        413 => "Content Too Large",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

#[cfg(test)]
#[path = "response_tests.rs"]
mod tests;
