//! The body of a relayed backend response (SPEC 2.7): bytes read from the backend in, bytes for
//! the client out, as each read arrives.
//!
//! The backend's framing ([`ResponseHead::framing`](super::ResponseHead)) says where the body
//! ends; the client's framing (the [`RelayPlan`](super::RelayPlan) that
//! [`write_client_response_head`](super::write_client_response_head) chose) says how it is sent:
//!
//! | backend | client | relayed as |
//! |---|---|---|
//! | `Content-Length: n` | the same | the first `n` bytes, verbatim |
//! | chunked | HTTP/1.1 | decoded ([`ChunkedDecoder`]), each read's data re-sent as one chunk |
//! | chunked | HTTP/1.0 | decoded, sent raw, ended by closing |
//! | until close | HTTP/1.1 | each read as one chunk; the last chunk when the backend closes |
//! | until close | HTTP/1.0 | raw, ended by closing |
//! | none | none | nothing |
//!
//! Re-framing rather than passing chunks through means a backend's chunk extensions and
//! trailers never reach the client, and a malformed chunked body is refused (as an upstream
//! error) before its bytes could be read by the client as anything but data. Bytes after the
//! end of the body are not consumed: they are the caller's to judge (a keep-alive connection
//! with stray bytes is not reused).

use super::chunked::{ChunkedDecoder, ChunkedEncoder, ChunkedLimits, Progress};
use super::error::ProtocolError;
use super::response::ResponseFraming;
use super::Side;

/// Chunked response bodies from backends: no size limit (a response streams for as long as the
/// backend generates), the request limits for chunk lines and trailers.
pub const UPSTREAM_CHUNK_LIMITS: ChunkedLimits =
    ChunkedLimits { max_body_bytes: u64::MAX, max_line_bytes: 4096, max_trailer_bytes: 16 << 10 };

/// The state of one relayed body, kept between reads.
#[derive(Debug, Clone)]
pub struct BodyRelay {
    /// How the backend delimits the body.
    upstream: ResponseFraming,
    /// How the client receives it.
    client: ResponseFraming,
    /// `Content-Length` bytes still to relay.
    remaining: u64,
    /// The decoder of a chunked backend body.
    decoder: Option<ChunkedDecoder>,
}

impl Default for BodyRelay {
    /// A relay of no body (before a response head was parsed).
    fn default() -> Self {
        BodyRelay::new(ResponseFraming::None, ResponseFraming::None)
    }
}

impl BodyRelay {
    /// A relay from a body framed as `upstream` to a client receiving it as `client`.
    pub fn new(upstream: ResponseFraming, client: ResponseFraming) -> Self {
        let remaining = match upstream {
            ResponseFraming::ContentLength(n) => n,
            _ => 0,
        };
        let decoder = (upstream == ResponseFraming::Chunked)
            .then(|| ChunkedDecoder::new(UPSTREAM_CHUNK_LIMITS, Side::Upstream));
        BodyRelay { upstream, client, remaining, decoder }
    }

    /// Relays what `input` holds of the body, appending the client's bytes to `out` (`scratch`
    /// holds decoded chunk data on the way). `eof` says the backend closed after `input`: it
    /// ends a close-delimited body. `done` means the body is complete (then call
    /// [`BodyRelay::finish`]); `consumed` is less than `input` only then. An error
    /// is a malformed chunked body ([`Side::Upstream`]); nothing of the bad piece is appended.
    pub fn feed(
        &mut self,
        input: &[u8],
        eof: bool,
        scratch: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<Progress, ProtocolError> {
        let progress = match self.upstream {
            ResponseFraming::None => Progress { consumed: 0, done: true },
            ResponseFraming::ContentLength(_) => {
                let take = input.len().min(usize::try_from(self.remaining).unwrap_or(usize::MAX));
                self.send(&input[..take], out);
                self.remaining -= take as u64;
                Progress { consumed: take, done: self.remaining == 0 }
            }
            ResponseFraming::Chunked => {
                let decoder = self.decoder.as_mut().expect("a chunked body has a decoder");
                scratch.clear();
                let progress = decoder.feed(input, scratch)?;
                self.send(scratch, out);
                progress
            }
            ResponseFraming::UntilClose => {
                self.send(input, out);
                Progress { consumed: input.len(), done: eof }
            }
        };
        Ok(progress)
    }

    /// Appends the end of the client's framing once [`BodyRelay::feed`] said `done`: the last
    /// chunk of a re-framed body, nothing otherwise.
    pub fn finish(&self, out: &mut Vec<u8>) {
        if self.client == ResponseFraming::Chunked {
            ChunkedEncoder::finish(out);
        }
    }

    /// Appends body bytes in the client's framing: one chunk for a re-framed body, raw
    /// otherwise.
    fn send(&self, data: &[u8], out: &mut Vec<u8>) {
        match self.client {
            ResponseFraming::Chunked => ChunkedEncoder::chunk(data, out),
            _ => out.extend_from_slice(data),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relay(
        upstream: ResponseFraming,
        client: ResponseFraming,
        reads: &[&[u8]],
        eof: bool,
    ) -> (Vec<u8>, usize, bool) {
        let mut relay = BodyRelay::new(upstream, client);
        let (mut out, mut scratch, mut consumed) = (Vec::new(), Vec::new(), 0);
        for (i, read) in reads.iter().enumerate() {
            let last = i + 1 == reads.len();
            let progress = relay.feed(read, eof && last, &mut scratch, &mut out).unwrap();
            consumed += progress.consumed;
            if progress.done {
                relay.finish(&mut out);
                return (out, consumed, true);
            }
        }
        (out, consumed, false)
    }

    #[test]
    fn each_framing_is_relayed_as_the_table_says() {
        use ResponseFraming::*;
        let (out, consumed, done) =
            relay(ContentLength(5), ContentLength(5), &[b"ab", b"cdeXX"], false);
        assert_eq!((out.as_slice(), consumed, done), (&b"abcde"[..], 5, true));
        let chunked: &[&[u8]] = &[b"3\r\nabc\r", b"\n2;x=y\r\nde\r\n0\r\nT: v\r\n\r\nNEXT"];
        let (out, consumed, done) = relay(Chunked, Chunked, chunked, false);
        assert_eq!(out, b"3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n");
        assert_eq!((consumed, done), (chunked[0].len() + chunked[1].len() - 4, true));
        let (out, _, done) = relay(Chunked, UntilClose, chunked, false);
        assert_eq!((out.as_slice(), done), (&b"abcde"[..], true));
        let (out, _, done) = relay(UntilClose, Chunked, &[b"ab", b"c"], true);
        assert_eq!((out.as_slice(), done), (&b"2\r\nab\r\n1\r\nc\r\n0\r\n\r\n"[..], true));
        let (out, _, done) = relay(UntilClose, UntilClose, &[b"ab", b"c"], false);
        assert_eq!((out.as_slice(), done), (&b"abc"[..], false));
        assert_eq!(relay(None, None, &[b"x"], false), (Vec::new(), 0, true));
    }

    #[test]
    fn a_malformed_chunked_body_is_an_upstream_error_and_appends_nothing() {
        let mut relay = BodyRelay::new(ResponseFraming::Chunked, ResponseFraming::Chunked);
        let mut out = Vec::new();
        let err = relay.feed(b"zz\r\n", false, &mut Vec::new(), &mut out).unwrap_err();
        assert_eq!((err.side(), err.status()), (Side::Upstream, 502));
        assert!(out.is_empty());
    }
}
