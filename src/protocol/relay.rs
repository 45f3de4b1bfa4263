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
//! | chunked | HTTP/1.1 | passed through ([`ChunkedDecoder::pass`]): the backend's chunks as read, less extensions and trailer fields |
//! | chunked | HTTP/1.0 | decoded ([`ChunkedDecoder::feed`]), sent raw, ended by closing |
//! | until close | HTTP/1.1 | each read as one chunk ([`ChunkedEncoder`]); the last chunk when the backend closes |
//! | until close | HTTP/1.0 | raw, ended by closing |
//! | none | none | nothing |
//!
//! Passing a chunked body through, rather than decoding it and re-encoding each read's data as
//! one chunk, copies each read once instead of twice and writes no size lines of its own; the
//! client sees the backend's chunk boundaries. The pass-through still runs the decoder's state
//! machine over the framing, so the end of the body is found exactly (the connection can be
//! reused), limits apply, a malformed chunked body is refused (as an upstream error) before any
//! of its bad read reaches the client, and a backend's chunk extensions and trailers are not
//! forwarded. What a client gets of a body cut by an error is a prefix of valid chunked framing
//! without its last chunk, so it cannot be read as complete. Bytes after the end of the body are
//! not consumed: they are the caller's to judge (a keep-alive connection with stray bytes is not
//! reused).

use super::chunked::{ChunkedDecoder, ChunkedEncoder, ChunkedLimits};
use super::error::ProtocolError;
use super::response::ResponseFraming;
use super::Side;

/// Chunked response bodies from backends: no size limit (a response streams for as long as the
/// backend generates), the request limits for chunk lines and trailers.
pub const UPSTREAM_CHUNK_LIMITS: ChunkedLimits =
    ChunkedLimits { max_body_bytes: u64::MAX, max_line_bytes: 4096, max_trailer_bytes: 16 << 10 };

/// What one [`BodyRelay::feed`] call did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyProgress {
    /// Input bytes consumed. Less than the input only when `done`: the rest is not this body's.
    pub consumed: usize,
    /// The body is complete: call [`BodyRelay::finish`].
    pub done: bool,
    /// Bytes of the body's content among the consumed ones (chunk data, not framing).
    pub data: usize,
}

/// How the body is moved, from the two framings.
#[derive(Debug, Clone)]
enum Mode {
    /// No body.
    None,
    /// `Content-Length` bytes still to relay.
    Length(u64),
    /// A chunked body for a chunked client: passed through.
    Pass(ChunkedDecoder),
    /// A chunked body for a client that does not take chunked: decoded.
    Decode(ChunkedDecoder),
    /// Until the backend closes.
    UntilClose,
}

/// The state of one relayed body, kept between reads.
#[derive(Debug, Clone)]
pub struct BodyRelay {
    mode: Mode,
    /// How the client receives the body.
    client: ResponseFraming,
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
        let decoder = || ChunkedDecoder::new(UPSTREAM_CHUNK_LIMITS, Side::Upstream);
        let mode = match upstream {
            ResponseFraming::None => Mode::None,
            ResponseFraming::ContentLength(n) => Mode::Length(n),
            ResponseFraming::Chunked if client == ResponseFraming::Chunked => Mode::Pass(decoder()),
            ResponseFraming::Chunked => Mode::Decode(decoder()),
            ResponseFraming::UntilClose => Mode::UntilClose,
        };
        BodyRelay { mode, client }
    }

    /// Whether a chunked body is passed through to the client as the backend framed it.
    pub fn passes_chunks(&self) -> bool {
        matches!(self.mode, Mode::Pass(_))
    }

    /// Relays what `input` holds of the body, appending the client's bytes to `out` (`scratch`
    /// holds decoded chunk data on the way, when decoding). `eof` says the backend closed after
    /// `input`: it ends a close-delimited body. `done` means the body is complete (then call
    /// [`BodyRelay::finish`]); `consumed` is less than `input` only then. An error is a
    /// malformed chunked body ([`Side::Upstream`]); nothing of the bad read is appended.
    pub fn feed(
        &mut self,
        input: &[u8],
        eof: bool,
        scratch: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Result<BodyProgress, ProtocolError> {
        let whole = |n: usize, done| BodyProgress { consumed: n, done, data: n };
        let client = self.client;
        let progress = match &mut self.mode {
            Mode::None => whole(0, true),
            Mode::Length(remaining) => {
                let take = input.len().min(usize::try_from(*remaining).unwrap_or(usize::MAX));
                *remaining -= take as u64;
                let done = *remaining == 0;
                send(client, &input[..take], out);
                whole(take, done)
            }
            Mode::Pass(decoder) => {
                let passed = decoder.pass(input, out)?;
                BodyProgress { consumed: passed.consumed, done: passed.done, data: passed.data }
            }
            Mode::Decode(decoder) => {
                scratch.clear();
                let progress = decoder.feed(input, scratch)?;
                let data = scratch.len();
                send(client, scratch, out);
                BodyProgress { consumed: progress.consumed, done: progress.done, data }
            }
            Mode::UntilClose => {
                send(client, input, out);
                whole(input.len(), eof)
            }
        };
        Ok(progress)
    }

    /// Appends the end of the client's framing once [`BodyRelay::feed`] said `done`: the last
    /// chunk of a body the router chunked itself, nothing otherwise (a body passed through
    /// carried its own).
    pub fn finish(&self, out: &mut Vec<u8>) {
        if self.client == ResponseFraming::Chunked && !self.passes_chunks() {
            ChunkedEncoder::finish(out);
        }
    }
}

/// Appends body bytes in the `client`'s framing: one chunk for a body the router chunks
/// itself, raw otherwise.
fn send(client: ResponseFraming, data: &[u8], out: &mut Vec<u8>) {
    match client {
        ResponseFraming::Chunked => ChunkedEncoder::chunk(data, out),
        _ => out.extend_from_slice(data),
    }
}

#[cfg(test)]
mod tests {
    use super::super::ErrorKind;
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

    /// A chunked body for a chunked client, fed as `reads`: the client's bytes, the progress
    /// summed over the reads (data counted per read), or the error with what was appended
    /// before it.
    fn pass(reads: &[&[u8]]) -> (Vec<u8>, Result<BodyProgress, ErrorKind>) {
        use ResponseFraming::Chunked;
        let mut relay = BodyRelay::new(Chunked, Chunked);
        assert!(relay.passes_chunks());
        let (mut out, mut scratch) = (Vec::new(), Vec::new());
        let mut sum = BodyProgress { consumed: 0, done: false, data: 0 };
        for read in reads {
            let before = out.len();
            match relay.feed(read, false, &mut scratch, &mut out) {
                Err(e) => {
                    assert_eq!(out.len(), before, "nothing of a bad read is appended");
                    return (out, Err(e.kind()));
                }
                Ok(p) => {
                    assert!(p.consumed == read.len() || p.done, "only the end stops short");
                    sum = BodyProgress {
                        consumed: sum.consumed + p.consumed,
                        done: p.done,
                        data: sum.data + p.data,
                    };
                    if p.done {
                        relay.finish(&mut out);
                        break;
                    }
                }
            }
        }
        (out, Ok(sum))
    }

    /// Valid chunked bodies without extensions or trailers, as engines send them.
    const PLAIN: [&[u8]; 4] = [
        b"0\r\n\r\n",
        b"1\r\nx\r\n0\r\n\r\n",
        b"f\r\ndata: {\"a\":1}\n\n\r\n0E\r\ndata: [DONE]\n\n\r\n000\r\n\r\n",
        b"10\r\n0123456789abcdef\r\n3\r\n\r\n\n\r\n0\r\n\r\n",
    ];

    #[test]
    fn a_chunked_body_passes_through_unchanged_however_it_is_split() {
        for body in PLAIN {
            let data = reference_data(body);
            let stream = [body, b"HTTP/1.1 200 OK\r\n"].concat();
            let whole = BodyProgress { consumed: body.len(), done: true, data };
            assert_eq!(pass(&[&stream]), (body.to_vec(), Ok(whole)));
            for cut in 0..=stream.len() {
                let (a, b) = stream.split_at(cut);
                assert_eq!(pass(&[a, b]), (body.to_vec(), Ok(whole)), "cut at {cut}");
                for cut2 in cut..=stream.len() {
                    let (b, c) = b.split_at(cut2 - cut);
                    assert_eq!(pass(&[a, b, c]).0, body, "cut at {cut} and {cut2}");
                }
            }
            let bytes: Vec<&[u8]> = stream.chunks(1).collect();
            assert_eq!(pass(&bytes), (body.to_vec(), Ok(whole)), "byte by byte");
        }
    }

    /// The decoded length of a valid body, for the data count.
    fn reference_data(body: &[u8]) -> usize {
        let mut out = Vec::new();
        ChunkedDecoder::new(UPSTREAM_CHUNK_LIMITS, Side::Upstream).feed(body, &mut out).unwrap();
        out.len()
    }

    #[test]
    fn extensions_and_trailers_are_left_out_of_a_body_passed_through() {
        let body: &[u8] =
            b"4 ;a=b\r\nWiki\r\n5;name=\"v\";x\r\npedia\r\n0;last\r\nExpires: x\r\nT: y\r\n\r\n";
        let want: &[u8] = b"4\r\nWiki\r\n5\r\npedia\r\n0\r\n\r\n";
        let whole = BodyProgress { consumed: body.len(), done: true, data: 9 };
        for cut in 0..=body.len() {
            let (a, b) = body.split_at(cut);
            assert_eq!(pass(&[a, b]), (want.to_vec(), Ok(whole)), "cut at {cut}");
        }
        let bytes: Vec<&[u8]> = body.chunks(1).collect();
        assert_eq!(pass(&bytes), (want.to_vec(), Ok(whole)));
    }

    #[test]
    fn a_malformed_body_passed_through_is_an_error_after_a_valid_prefix() {
        let bad: [(&[u8], ErrorKind); 7] = [
            (b"3\r\nabc\r\nzz\r\n", ErrorKind::InvalidChunkSize),
            (b"3\r\nabcX\r\n0\r\n\r\n", ErrorKind::InvalidChunkFraming),
            (b"3\nabc\r\n0\r\n\r\n", ErrorKind::InvalidChunkSize),
            (b"-3\r\nabc\r\n", ErrorKind::InvalidChunkSize),
            (b"00000000000000003\r\nabc\r\n", ErrorKind::InvalidChunkSize),
            (b"3 x\r\nabc\r\n", ErrorKind::InvalidChunkExtension),
            (b"0\r\n: v\r\n\r\n", ErrorKind::InvalidTrailer),
        ];
        for (body, kind) in bad {
            for cut in 0..=body.len() {
                let (a, b) = body.split_at(cut);
                let (out, result) = pass(&[a, b]);
                assert_eq!(result, Err(kind), "{:?} cut at {cut}", String::from_utf8_lossy(body));
                assert!(body.starts_with(&out), "what went out is the body's valid start");
            }
        }
        let long_line = [&b"1;"[..], &[b'e'; 4095], b"\r\nx\r\n"].concat();
        assert_eq!(pass(&[&long_line]).1, Err(ErrorKind::InvalidChunkExtension));
        let long_trailer = [&b"0\r\nT: "[..], &[b'v'; 16 << 10], b"\r\n\r\n"].concat();
        assert_eq!(pass(&[&long_trailer]).1, Err(ErrorKind::InvalidTrailer));
    }

    #[test]
    fn only_chunk_data_counts_as_data() {
        let reads: [&[u8]; 5] = [b"5\r", b"\n", b"hel", b"lo\r\n0\r\n", b"\r\n"];
        let mut relay = BodyRelay::new(ResponseFraming::Chunked, ResponseFraming::Chunked);
        let data: Vec<usize> = reads
            .iter()
            .map(|read| relay.feed(read, false, &mut Vec::new(), &mut Vec::new()).unwrap().data)
            .collect();
        assert_eq!(data, [0, 0, 3, 2, 0]);
    }

    /// The usage scanner reads a stream passed through, size lines and all, as engines frame it
    /// (one chunk per event).
    #[test]
    fn usage_is_read_from_a_stream_passed_through() {
        let events = [
            &b"data: {\"choices\":[{\"delta\":{\"content\":\"hi\"}}]}\n\n"[..],
            b"data: {\"choices\":[],\"usage\":{\"prompt_tokens\":1234,\"total_tokens\":1240,\
              \"completion_tokens\":6,\"prompt_tokens_details\":{\"cached_tokens\":1024}}}\n\n",
            b"data: [DONE]\n\n",
        ];
        let mut body = Vec::new();
        events.iter().for_each(|e| ChunkedEncoder::chunk(e, &mut body));
        ChunkedEncoder::finish(&mut body);
        for cut in 0..=body.len() {
            let (a, b) = body.split_at(cut);
            let (out, _) = pass(&[a, b]);
            let mut scanner = super::super::usage::UsageScanner::new();
            scanner.feed(&out[..cut.min(out.len())]);
            scanner.feed(&out[cut.min(out.len())..]);
            let usage = scanner.usage();
            assert_eq!((usage.prompt_tokens, usage.cached_tokens), (Some(1234), Some(1024)));
        }
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
