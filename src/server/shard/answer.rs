//! The router's own answers, as bytes appended to a client's write buffer: OpenAI-shaped JSON
//! errors, the small JSON answers (`/v1/models`, health), and the answers to a scheduler's
//! rejections. Which connection they go to and what happens next is the client room's.

use crate::protocol::{decimal, reason_phrase, write_error, Version};
use crate::scheduler::RejectReason;

/// An error answer: its status, its OpenAI error `code` and its message.
pub(super) type ErrorAnswer<'m> = (u16, &'m str, &'m str);

/// How a router answer is framed for the request it answers.
#[derive(Debug, Clone, Copy)]
pub(super) struct AnswerTo {
    /// The request's HTTP version (HTTP/1.1 when no request was parsed).
    pub(super) version: Version,
    /// Whether the connection stays open after the answer.
    pub(super) keep_alive: bool,
    /// The request was a `HEAD`: the answer carries no content (RFC 9110 9.3.2).
    pub(super) head: bool,
}

/// Appends an OpenAI-shaped JSON error answer framed for `to`.
pub(super) fn write_router_error(wbuf: &mut Vec<u8>, answer: ErrorAnswer<'_>, to: AnswerTo) {
    write_router_error_with(wbuf, answer, to, None);
}

/// The challenge of a 401 from the main listener (RFC 6750 3).
pub(super) const BEARER_CHALLENGE: (&str, &[u8]) = ("WWW-Authenticate", b"Bearer");

/// [`write_router_error`] with one more header line.
pub(super) fn write_router_error_with(
    wbuf: &mut Vec<u8>,
    answer: ErrorAnswer<'_>,
    to: AnswerTo,
    extra: Option<(&str, &[u8])>,
) {
    let (status, code, message) = answer;
    let start = wbuf.len();
    let headers = [connection_header(to.version, to.keep_alive), extra];
    let mut lines: [(&str, &[u8]); 2] = [("", b""); 2];
    let mut n = 0;
    for header in headers.into_iter().flatten() {
        lines[n] = header;
        n += 1;
    }
    write_error(status, code, message, wbuf, &lines[..n]);
    if to.head {
        // RFC 9110 9.3.2: no content in an answer to HEAD (its Content-Length stays).
        let head_end = wbuf[start..].windows(4).position(|w| w == b"\r\n\r\n");
        wbuf.truncate(start + head_end.expect("write_error ends its head") + 4);
    }
}

/// Appends an answer with `status` and the JSON `body`, framed for `to`.
pub(super) fn write_json(w: &mut Vec<u8>, status: u16, body: &[u8], to: AnswerTo) {
    w.extend_from_slice(b"HTTP/1.1 ");
    w.extend_from_slice(decimal(u64::from(status), &mut [0; 20]));
    w.push(b' ');
    w.extend_from_slice(reason_phrase(status).as_bytes());
    w.extend_from_slice(b"\r\nContent-Type: application/json\r\nContent-Length: ");
    w.extend_from_slice(decimal(body.len() as u64, &mut [0; 20]));
    w.extend_from_slice(b"\r\n");
    if let Some((name, value)) = connection_header(to.version, to.keep_alive) {
        w.extend_from_slice(name.as_bytes());
        w.extend_from_slice(b": ");
        w.extend_from_slice(value);
        w.extend_from_slice(b"\r\n");
    }
    w.extend_from_slice(b"\r\n");
    if !to.head {
        w.extend_from_slice(body);
    }
}

/// The answer to a scheduler's rejection.
pub(super) fn rejection(reason: RejectReason) -> ErrorAnswer<'static> {
    match reason {
        RejectReason::QueueTimeout => {
            (504, "queue_timeout", "waited in the queue longer than queue.timeout")
        }
        RejectReason::QueueFull => (429, "queue_full", "the model's queue is full"),
        RejectReason::ShuttingDown => (503, "unavailable", "shutting down"),
        RejectReason::RetriesExhausted => {
            (502, "upstream_error", "no backend could take the request")
        }
    }
}

/// The `Connection` header a router answer needs, if any.
fn connection_header(version: Version, keep_alive: bool) -> Option<(&'static str, &'static [u8])> {
    match (keep_alive, version) {
        (false, _) => Some(("Connection", b"close")),
        (true, Version::Http10) => Some(("Connection", b"keep-alive")),
        (true, Version::Http11) => None,
    }
}
