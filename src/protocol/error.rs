//! Errors of the HTTP/1.1 and JSON layers, each mapped to the router status and `code` of SPEC
//! section 2 ("Errors the router itself returns").
//!
//! A [`ProtocolError`] is a small `Copy` value: the [`ErrorKind`] that was violated and the
//! [`Side`] that violated it. A downstream (client) error maps to its own 4xx status; an upstream
//! (backend) error is always a 502 `upstream_error`. None of them is retryable: SPEC 2.8 retries
//! only connection failures, which this sans-IO layer never sees.

use std::fmt;

/// Which peer sent the bytes that broke the rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The client: the router answers with a 4xx and closes the connection.
    Downstream,
    /// A backend: the router answers 502 if nothing was relayed yet.
    Upstream,
}

/// What was wrong with a message. The comment on each variant names its downstream status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// 431: the head is longer than `max_header_bytes` (complete or not).
    HeadTooLarge,
    /// 431: more header lines than `max_headers`.
    TooManyHeaders,
    /// 400: the request or status line is malformed (method, target, status code, reason).
    InvalidStartLine,
    /// 400: not `HTTP/1.0` or `HTTP/1.1` (including the HTTP/2 preface `PRI * HTTP/2.0`).
    UnsupportedVersion,
    /// 400: a header name is not a token, or a line starts with whitespace (obs-fold).
    InvalidHeaderName,
    /// 400: a header value holds a control character or a line ending is malformed.
    InvalidHeaderValue,
    /// 400: both `Content-Length` and `Transfer-Encoding` (a smuggling shape).
    ContentLengthWithTransferEncoding,
    /// 400: more than one `Content-Length` line, even with equal values.
    DuplicateContentLength,
    /// 400: a `Content-Length` that is not 1*DIGIT or does not fit in 64 bits.
    InvalidContentLength,
    /// 400: a `Transfer-Encoding` other than exactly one `chunked`.
    UnsupportedTransferEncoding,
    /// 400: `Transfer-Encoding` in an HTTP/1.0 message (RFC 9112 section 6.1).
    TransferEncodingInHttp10,
    /// 400: more than one `Host`, or none in an HTTP/1.1 request (RFC 9112 3.2).
    InvalidHost,
    /// 400: the session header is longer than 256 bytes.
    SessionIdTooLong,
    /// 400: the session header holds a byte that is not visible ASCII, or appears twice.
    InvalidSessionId,
    /// 400: a chunk size that is empty, not hexadecimal or longer than 16 digits.
    InvalidChunkSize,
    /// 400: a chunk-size line (size and extensions) longer than its limit, or with a control
    /// character.
    InvalidChunkExtension,
    /// 400: a chunk line or chunk data not ended by CRLF.
    InvalidChunkFraming,
    /// 400: a trailer section that is malformed or longer than its limit.
    InvalidTrailer,
    /// 413: the body is longer than `max_body_bytes`.
    BodyTooLarge,
}

/// A violation of HTTP/1.1 message syntax or of a configured limit.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ProtocolError {
    kind: ErrorKind,
    side: Side,
}

impl ProtocolError {
    /// An error of `kind` caused by `side`.
    pub const fn new(kind: ErrorKind, side: Side) -> Self {
        Self { kind, side }
    }

    /// A client error.
    pub const fn downstream(kind: ErrorKind) -> Self {
        Self::new(kind, Side::Downstream)
    }

    /// A backend error.
    pub const fn upstream(kind: ErrorKind) -> Self {
        Self::new(kind, Side::Upstream)
    }

    /// What was wrong.
    pub const fn kind(self) -> ErrorKind {
        self.kind
    }

    /// Who was wrong.
    pub const fn side(self) -> Side {
        self.side
    }

    /// The status the router answers with (SPEC 2): 400, 413 or 431 for the client, 502 for
    /// a backend.
    pub const fn status(self) -> u16 {
        if let Side::Upstream = self.side {
            return 502;
        }
        match self.kind {
            ErrorKind::HeadTooLarge | ErrorKind::TooManyHeaders => 431,
            ErrorKind::BodyTooLarge => 413,
            _ => 400,
        }
    }

    /// The `code` of the JSON error body (SPEC 2).
    pub const fn code(self) -> &'static str {
        match self.status() {
            431 => "headers_too_large",
            413 => "body_too_large",
            502 => "upstream_error",
            _ => "invalid_request",
        }
    }

    /// A human-readable message for the JSON error body.
    pub const fn message(self) -> &'static str {
        match self.kind {
            ErrorKind::HeadTooLarge => "request head too large",
            ErrorKind::TooManyHeaders => "too many header fields",
            ErrorKind::InvalidStartLine => "malformed start line",
            ErrorKind::UnsupportedVersion => "unsupported HTTP version",
            ErrorKind::InvalidHeaderName => "invalid header name or folded header line",
            ErrorKind::InvalidHeaderValue => "invalid header value",
            ErrorKind::ContentLengthWithTransferEncoding => {
                "both Content-Length and Transfer-Encoding"
            }
            ErrorKind::DuplicateContentLength => "more than one Content-Length",
            ErrorKind::InvalidContentLength => "invalid Content-Length",
            ErrorKind::UnsupportedTransferEncoding => "unsupported Transfer-Encoding",
            ErrorKind::TransferEncodingInHttp10 => "Transfer-Encoding in an HTTP/1.0 message",
            ErrorKind::InvalidHost => "missing or repeated Host",
            ErrorKind::SessionIdTooLong => "session id longer than 256 bytes",
            ErrorKind::InvalidSessionId => "invalid or repeated session id",
            ErrorKind::InvalidChunkSize => "invalid chunk size",
            ErrorKind::InvalidChunkExtension => "invalid or oversized chunk extension",
            ErrorKind::InvalidChunkFraming => "chunk not terminated by CRLF",
            ErrorKind::InvalidTrailer => "invalid or oversized trailer section",
            ErrorKind::BodyTooLarge => "body too large",
        }
    }
}

impl fmt::Display for ProtocolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let side = match self.side {
            Side::Downstream => "client",
            Side::Upstream => "backend",
        };
        write!(f, "{side}: {}", self.message())
    }
}

impl std::error::Error for ProtocolError {}

/// Why [`find_model`](super::find_model) found no usable top-level `"model"` string. Every
/// variant is a 400 `invalid_request` (SPEC 2.3).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ModelError {
    /// The body is not valid JSON (RFC 8259); `offset` is the first byte found wrong.
    InvalidJson {
        /// Byte offset in the body.
        offset: usize,
    },
    /// Arrays and objects nest deeper than [`DEPTH_MAX`](super::json::DEPTH_MAX).
    TooDeep {
        /// Byte offset of the bracket that went too deep.
        offset: usize,
    },
    /// The body is JSON but its top-level value is not an object.
    NotAnObject,
    /// The top-level object has no `"model"` key.
    MissingModel,
    /// The top-level `"model"` is not a string.
    ModelNotString,
    /// The top-level object has more than one `"model"` key (an ambiguity we refuse rather than
    /// pick the first or the last, as parsers differ).
    DuplicateModel,
}

impl ModelError {
    /// Always 400.
    pub const fn status(self) -> u16 {
        400
    }

    /// Always `invalid_request`.
    pub const fn code(self) -> &'static str {
        "invalid_request"
    }

    /// A human-readable message for the JSON error body.
    pub const fn message(self) -> &'static str {
        match self {
            ModelError::InvalidJson { .. } => "request body is not valid JSON",
            ModelError::TooDeep { .. } => "request body nests too deeply",
            ModelError::NotAnObject => "request body is not a JSON object",
            ModelError::MissingModel => "missing \"model\"",
            ModelError::ModelNotString => "\"model\" is not a string",
            ModelError::DuplicateModel => "\"model\" appears more than once",
        }
    }
}

impl fmt::Display for ModelError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ModelError::InvalidJson { offset } | ModelError::TooDeep { offset } => {
                write!(f, "{} (at byte {offset})", self.message())
            }
            _ => f.write_str(self.message()),
        }
    }
}

impl std::error::Error for ModelError {}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_follow_spec_table() {
        let d = ProtocolError::downstream;
        assert_eq!(d(ErrorKind::HeadTooLarge).status(), 431);
        assert_eq!(d(ErrorKind::HeadTooLarge).code(), "headers_too_large");
        assert_eq!(d(ErrorKind::TooManyHeaders).status(), 431);
        assert_eq!(d(ErrorKind::BodyTooLarge).status(), 413);
        assert_eq!(d(ErrorKind::BodyTooLarge).code(), "body_too_large");
        assert_eq!(d(ErrorKind::DuplicateContentLength).status(), 400);
        assert_eq!(d(ErrorKind::InvalidChunkSize).code(), "invalid_request");
        let u = ProtocolError::upstream(ErrorKind::BodyTooLarge);
        assert_eq!((u.status(), u.code()), (502, "upstream_error"));
        assert_eq!(ModelError::MissingModel.status(), 400);
        assert!(ModelError::InvalidJson { offset: 3 }.to_string().contains("byte 3"));
        assert!(u.to_string().starts_with("backend"));
    }
}
