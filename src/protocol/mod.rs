//! Sans-IO HTTP/1.1 for the dataplane: the caller feeds bytes it read and gets back parsed heads,
//! decoded bodies and bytes to write. Nothing here touches a socket or reads the clock, and
//! nothing allocates except into buffers the caller passes in (a `Cow` holding an escaped model
//! name is the one exception).
//!
//! Message syntax follows RFC 9112 (HTTP/1.1) and the semantics of RFC 9110; request and response
//! heads are tokenised by `httparse`, then checked here. JSON follows RFC 8259.
//!
//! - [`request`]: [`parse_request_head`] (framing, keep-alive, `Expect`, session id, request id).
//! - [`chunked`]: the incremental [`ChunkedDecoder`] (RFC 9112 section 7.1) and [`ChunkedEncoder`].
//! - [`json`]: [`find_model`], a one-pass validating scan for the top-level `"model"` string, and
//!   [`rewrite_model`] (SPEC 2.3, 2.6).
//! - [`prompt`]: [`find_model_and_prompt`], the same scan also cutting the prompt into chained
//!   block hashes for prefix-cost placement (SPEC S16), and its [`PromptHasher`]; [`scan_body`]
//!   also records the top-level fields of the `body:` session sources ([`BodyFields`]).
//! - [`usage`]: [`UsageScanner`], the `prompt_tokens` and `cached_tokens` an engine reports in a
//!   response body, read as the body is relayed.
//! - [`forward`]: [`write_upstream_head`], the request head sent to a backend (SPEC 2.6).
//! - [`response`]: [`parse_response_head`], [`write_client_response_head`] and the router's own
//!   JSON errors, [`write_error`] (SPEC 2.7 and the error table).
//! - [`relay`]: [`BodyRelay`], a backend response body relayed to the client read by read (a
//!   chunked one passed through, others re-framed as the client needs).
//! - [`error`]: [`ProtocolError`] (which side broke which rule, with its status) and [`ModelError`].
//!
//! What is refused (400 unless stated; every refusal means "answer and close"):
//! - heads longer than `max_header_bytes` or with more than `max_headers` lines (431), whether
//!   complete or not;
//! - any version other than HTTP/1.0 and HTTP/1.1, including the HTTP/2 preface;
//! - request smuggling shapes: `Content-Length` together with `Transfer-Encoding`; more than one
//!   `Content-Length` line, **even with equal values** (RFC 9112 6.3 lets a recipient merge equal
//!   values; we refuse instead, as proxies disagree); a `Content-Length` that is not 1*DIGIT
//!   (sign, comma list, overflow); a `Transfer-Encoding` other than one `chunked`; any
//!   `Transfer-Encoding` in an HTTP/1.0 request; obs-fold (a header line starting with SP or
//!   HTAB); whitespace between a header name and its colon; control characters in names or values;
//! - chunked bodies with empty, non-hex or over-16-digit sizes, bare LF or a missing CRLF, or chunk
//!   lines and trailers over their limits (RFC 9112 7.1); bodies over `max_body_bytes` (413);
//! - more than one `Host`, or none in an HTTP/1.1 request (RFC 9112 3.2);
//! - a session header that is repeated, over 256 bytes, or not visible ASCII.
//!
//! What is accepted: empty lines before the request line and a bare LF ending head lines (RFC
//! 9112 2.2 allows both; the head is rewritten with CRLF before forwarding), bytes 0x80-0xFF in
//! header values, any `Expect` value (only `100-continue` is reported; the router reads whole
//! bodies, so it answers `100 Continue` itself and does not forward `Expect`).

pub mod chunked;
pub mod error;
pub mod forward;
pub mod json;
pub mod prompt;
pub mod relay;
pub mod request;
pub mod response;
pub mod usage;

#[cfg(any(test, fuzzing))]
pub mod harness;

pub use chunked::{ChunkedDecoder, ChunkedEncoder, ChunkedLimits, Passed, Progress};
pub use error::{ErrorKind, ModelError, ProtocolError, Side};
pub use forward::{write_upstream_head, Authorization, ForwardInfo};
pub use json::{find_model, rewrite_model, write_json_string, BodyFields, FieldValue, ModelField};
pub use prompt::{find_model_and_prompt, scan_body, Ends, PromptHasher};
pub use relay::{BodyProgress, BodyRelay};
pub use request::{parse_request_head, parse_request_head_into, Framing, RequestHead};
pub use response::{
    parse_response_head, parse_response_head_into, reason_phrase, write_client_response_head,
    write_error, write_protocol_error, ClientInfo, RelayPlan, ResponseFraming, ResponseHead,
};
pub use usage::{Usage, UsageScanner};

/// Header lines kept per head: the ceiling of [`Limits::max_headers`]. Heads store their header
/// spans inline (16 bytes each), so a head is a fixed-size value that never allocates.
pub const HEADERS_MAX: usize = 128;

/// The longest session id accepted (SPEC 2.4).
pub const SESSION_ID_BYTES_MAX: usize = 256;

/// Limits applied to every request, from the configuration (SPEC 4).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Limits {
    /// Longest request head, request line to the empty line included (431 beyond).
    pub max_header_bytes: usize,
    /// Most header lines (431 beyond); values above [`HEADERS_MAX`] act as `HEADERS_MAX`.
    pub max_headers: usize,
    /// Longest body, by `Content-Length` or decoded chunked size (413 beyond).
    pub max_body_bytes: u64,
    /// The session header's name, compared ASCII case-insensitively (e.g. `x-session-id`).
    pub session_header: String,
    /// Longest chunk-size line, extensions included, CRLF excluded.
    pub max_chunk_line_bytes: usize,
    /// Longest trailer section, CRLFs included.
    pub max_trailer_bytes: usize,
}

impl Default for Limits {
    /// SPEC 4's defaults, 100 header lines, 4 KiB chunk lines and 16 KiB of trailers.
    fn default() -> Self {
        Self {
            max_header_bytes: 16_384,
            max_headers: 100,
            max_body_bytes: 16_777_216,
            session_header: "x-session-id".to_owned(),
            max_chunk_line_bytes: 4_096,
            max_trailer_bytes: 16_384,
        }
    }
}

impl Limits {
    /// The limits of a chunked request body.
    pub fn chunked(&self) -> ChunkedLimits {
        ChunkedLimits {
            max_body_bytes: self.max_body_bytes,
            max_line_bytes: self.max_chunk_line_bytes,
            max_trailer_bytes: self.max_trailer_bytes,
        }
    }
}

/// A byte range in the buffer a head was parsed from: `start..end`, offsets as `u32` (heads
/// are bounded by `max_header_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct Span {
    /// First byte.
    pub start: u32,
    /// One past the last byte.
    pub end: u32,
}

impl Span {
    /// The empty span at 0.
    pub const EMPTY: Span = Span { start: 0, end: 0 };

    /// The bytes of this span in `buf`, the buffer the head was parsed from.
    ///
    /// # Panics
    /// If `buf` is shorter than the span (a different buffer).
    pub fn get(self, buf: &[u8]) -> &[u8] {
        &buf[self.start as usize..self.end as usize]
    }

    /// Length in bytes.
    pub fn len(self) -> usize {
        (self.end - self.start) as usize
    }

    /// Whether the span is empty.
    pub fn is_empty(self) -> bool {
        self.start == self.end
    }

    /// The span of `part`, a subslice of `buf`. An empty part (which httparse may hand out as
    /// a static `""`) is the empty span at 0.
    pub fn of(buf: &[u8], part: &[u8]) -> Span {
        if part.is_empty() {
            return Span::default();
        }
        let start = part.as_ptr() as usize - buf.as_ptr() as usize;
        debug_assert!(start + part.len() <= buf.len(), "part lies inside buf");
        Span { start: start as u32, end: (start + part.len()) as u32 }
    }
}

/// One header line: name and value (value without surrounding whitespace).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Hash)]
pub struct HeaderSpan {
    /// The field name as sent (case preserved).
    pub name: Span,
    /// The field value, trimmed of leading and trailing whitespace.
    pub value: Span,
}

impl HeaderSpan {
    const EMPTY: HeaderSpan = HeaderSpan { name: Span::EMPTY, value: Span::EMPTY };
}

/// The header lines of a head, in order, stored inline: [`HEADERS_MAX`] spans, 2 KiB. A
/// parser fills a list in place ([`parse_request_head_into`], [`parse_response_head_into`]) and
/// writes only the lines the head has, so a list kept with its connection is neither cleared
/// nor copied per message; the spans past `len` are left from earlier heads and never read.
#[derive(Clone)]
pub struct HeaderList {
    spans: [HeaderSpan; HEADERS_MAX],
    len: u8,
}

impl PartialEq for HeaderList {
    fn eq(&self, other: &HeaderList) -> bool {
        self.as_slice() == other.as_slice()
    }
}

impl Eq for HeaderList {}

impl std::fmt::Debug for HeaderList {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

impl HeaderList {
    /// No lines.
    pub const EMPTY: HeaderList = HeaderList { spans: [HeaderSpan::EMPTY; HEADERS_MAX], len: 0 };

    /// Makes the list `headers`, spans into `buf`.
    fn fill(&mut self, buf: &[u8], headers: &[httparse::Header<'_>]) {
        debug_assert!(headers.len() <= HEADERS_MAX);
        for (slot, h) in self.spans.iter_mut().zip(headers) {
            *slot = HeaderSpan {
                name: Span::of(buf, h.name.as_bytes()),
                value: Span::of(buf, h.value),
            };
        }
        self.len = headers.len() as u8;
    }

    /// The header lines in order.
    pub fn as_slice(&self) -> &[HeaderSpan] {
        &self.spans[..usize::from(self.len)]
    }

    /// The first value of header `name` (ASCII case-insensitive).
    pub fn get<'b>(&self, buf: &'b [u8], name: &str) -> Option<&'b [u8]> {
        self.as_slice()
            .iter()
            .find(|h| h.name.get(buf).eq_ignore_ascii_case(name.as_bytes()))
            .map(|h| h.value.get(buf))
    }
}

/// The HTTP version of a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Version {
    /// HTTP/1.0: close by default, no chunked coding.
    Http10,
    /// HTTP/1.1: keep-alive by default.
    Http11,
}

impl Version {
    fn from_minor(minor: u8) -> Version {
        if minor == 0 {
            Version::Http10
        } else {
            Version::Http11
        }
    }
}

/// Hop-by-hop header names (RFC 9110 7.6.1), never forwarded in either direction. Headers named
/// by `Connection` are removed too, as are `Content-Length` and `Expect` on the way up (the head
/// writers put their own framing).
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
    "proxy-authorization",
    "proxy-authenticate",
];

/// The hop-by-hop header names of one head: those of [`HOP_BY_HOP`] and those its `Connection`
/// lines name, but for the `kept` ones, which the other side needs whatever `Connection` says
/// (RFC 9110 section 7.6.1 forbids listing a field meant for every recipient): a request's
/// `Host`, a response's `Content-Length`. Built once per head, so that asking about each of its
/// lines neither scans the whole list again for `Connection` lines nor splits their values
/// again (a head's writer asks once per line).
struct HopByHop<'a> {
    /// The names the `Connection` lines list, but for those of [`HOP_BY_HOP`], `close` and
    /// `kept`.
    named: [&'a [u8]; HopByHop::NAMED],
    count: usize,
    /// More names than kept: ask the whole list (never seen from real peers).
    overflow: Option<(&'a HeaderList, &'a [u8])>,
    kept: &'static [&'static str],
}

impl<'a> HopByHop<'a> {
    const NAMED: usize = 8;

    fn of(headers: &'a HeaderList, buf: &'a [u8], kept: &'static [&'static str]) -> HopByHop<'a> {
        let mut set = HopByHop { named: [&[]; Self::NAMED], count: 0, overflow: None, kept };
        let connection = headers.as_slice().iter().filter(|h| is_connection(h.name.get(buf)));
        for token in connection.flat_map(|h| tokens(h.value.get(buf))) {
            if is_listed(token) || token.eq_ignore_ascii_case(b"close") || set.is_kept(token) {
                continue;
            }
            if set.count == Self::NAMED {
                set.overflow = Some((headers, buf));
                break;
            }
            set.named[set.count] = token;
            set.count += 1;
        }
        set
    }

    /// Whether `name` is hop-by-hop: listed in [`HOP_BY_HOP`] or named by a `Connection` line.
    fn contains(&self, name: &[u8]) -> bool {
        if is_listed(name) {
            return true;
        }
        match self.overflow {
            None => self.named[..self.count].iter().any(|t| t.eq_ignore_ascii_case(name)),
            Some(_) if self.is_kept(name) => false,
            Some((headers, buf)) => headers
                .as_slice()
                .iter()
                .filter(|h| is_connection(h.name.get(buf)))
                .any(|h| tokens(h.value.get(buf)).any(|t| t.eq_ignore_ascii_case(name))),
        }
    }

    fn is_kept(&self, name: &[u8]) -> bool {
        self.kept.iter().any(|k| name.eq_ignore_ascii_case(k.as_bytes()))
    }
}

fn is_connection(name: &[u8]) -> bool {
    name.eq_ignore_ascii_case(b"connection")
}

/// Bit `n` is set when a name of [`HOP_BY_HOP`] is `n` bytes long.
const LISTED_LENGTHS: u32 = {
    let mut lengths = 0;
    let mut i = 0;
    while i < HOP_BY_HOP.len() {
        lengths |= 1 << HOP_BY_HOP[i].len();
        i += 1;
    }
    lengths
};

/// Whether `name` is one of [`HOP_BY_HOP`]. Most header names have a length no listed name has,
/// and cost one bit test.
fn is_listed(name: &[u8]) -> bool {
    name.len() < 32
        && LISTED_LENGTHS & (1 << name.len()) != 0
        && HOP_BY_HOP.iter().any(|h| name.eq_ignore_ascii_case(h.as_bytes()))
}

/// The comma-separated tokens of a list-valued header, trimmed, empty elements skipped.
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(trim).filter(|t| !t.is_empty())
}

/// `value` without leading and trailing SP and HTAB.
fn trim(value: &[u8]) -> &[u8] {
    let start = value.iter().position(|b| !matches!(b, b' ' | b'\t')).unwrap_or(value.len());
    let end = value.iter().rposition(|b| !matches!(b, b' ' | b'\t')).map_or(start, |e| e + 1);
    &value[start..end]
}

/// The decimal digits of `n`, written at the end of `buf` (no allocation).
pub fn decimal(mut n: u64, buf: &mut [u8; 20]) -> &[u8] {
    let mut start = buf.len();
    loop {
        start -= 1;
        buf[start] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    &buf[start..]
}

/// Appends the decimal digits of `n` (no allocation).
fn write_decimal(out: &mut Vec<u8>, n: u64) {
    out.extend_from_slice(decimal(n, &mut [0; 20]));
}

/// Appends `addr` as text: an IPv4 address octet by octet (`Display` costs about twenty times
/// as much, and one is written per forwarded request), an IPv6 address through `Display`.
fn write_ip(out: &mut Vec<u8>, addr: std::net::IpAddr) {
    match addr {
        std::net::IpAddr::V4(v4) => {
            for (i, octet) in v4.octets().into_iter().enumerate() {
                if i > 0 {
                    out.push(b'.');
                }
                write_decimal(out, u64::from(octet));
            }
        }
        std::net::IpAddr::V6(v6) => {
            use std::io::Write;
            write!(out, "{v6}").expect("writing to a Vec");
        }
    }
}

/// Appends `name: value\r\n`.
fn write_header(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.extend_from_slice(name);
    out.extend_from_slice(b": ");
    out.extend_from_slice(value);
    out.extend_from_slice(b"\r\n");
}

/// An httparse error as a typed error caused by `side`.
fn map_httparse(err: httparse::Error, side: Side) -> ProtocolError {
    let kind = match err {
        httparse::Error::HeaderName => ErrorKind::InvalidHeaderName,
        httparse::Error::HeaderValue | httparse::Error::NewLine => ErrorKind::InvalidHeaderValue,
        httparse::Error::TooManyHeaders => ErrorKind::TooManyHeaders,
        httparse::Error::Version => ErrorKind::UnsupportedVersion,
        httparse::Error::Status | httparse::Error::Token => ErrorKind::InvalidStartLine,
    };
    ProtocolError::new(kind, side)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listed_names_are_found_in_any_case_and_only_they() {
        for name in HOP_BY_HOP {
            assert!(is_listed(name.as_bytes()), "{name}");
            assert!(is_listed(name.to_ascii_uppercase().as_bytes()), "{name}");
        }
        let others =
            ["", "t", "host", "tea", "trailers", "upgrades", "content-length", "x-connection"];
        for name in others {
            assert!(!is_listed(name.as_bytes()), "{name}");
        }
        assert!(!is_listed(&[b'a'; 40]));
    }

    #[test]
    fn addresses_are_written_as_display_writes_them() {
        let addrs = [
            "0.0.0.0",
            "10.0.0.9",
            "127.0.0.1",
            "255.255.255.255",
            "::1",
            "fe80::1:2",
            "::ffff:10.0.0.1",
        ];
        for text in addrs {
            let addr: std::net::IpAddr = text.parse().unwrap();
            let mut out = b"for=".to_vec();
            write_ip(&mut out, addr);
            assert_eq!(String::from_utf8(out).unwrap(), format!("for={addr}"), "{text}");
        }
    }

    #[test]
    fn helpers() {
        assert_eq!(trim(b" \tab c\t "), b"ab c");
        assert_eq!(trim(b"   "), b"");
        assert_eq!(
            tokens(b" close, ,Keep-Alive ").collect::<Vec<_>>(),
            [&b"close"[..], b"Keep-Alive"]
        );
        let mut out = Vec::new();
        write_decimal(&mut out, 0);
        write_decimal(&mut out, u64::MAX);
        assert_eq!(out, b"018446744073709551615");
    }
}
