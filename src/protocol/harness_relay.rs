//! The response relay against a reference: a backend response, split into reads, through the
//! relay the shard runs ([`parse_response_head`], [`write_client_response_head`],
//! [`BodyRelay`]), parsed back as a client would (see the parent module's doc,
//! [`check_relay`]).

use super::super::relay::UPSTREAM_CHUNK_LIMITS;
use super::super::{
    parse_response_head, write_client_response_head, BodyRelay, ChunkedLimits, ClientInfo,
    ErrorKind, ResponseFraming, Side, Version,
};
use super::{pieces, reference_chunked, reference_pass, take, ChunkedOutcome};

/// How a relayed response ended, as the relay driver saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
enum RelayEnd {
    /// The backend closed before a complete head: retryable when nothing came, else a 502.
    NoHead,
    /// The head was malformed (or a `101`): a 502, nothing relayed.
    BadHead,
    /// The body was malformed after the head was relayed: the client's stream is cut.
    BadBody,
    /// The backend closed before the end of the body: the client's stream is cut.
    Truncated,
    /// The body is complete; this many bytes followed it.
    Done { leftover: usize },
}

/// What the relay driver sent the client.
#[derive(Debug)]
struct Relayed {
    end: RelayEnd,
    /// Head and body as written for the client.
    out: Vec<u8>,
    /// Where the body starts in `out`.
    head_len: usize,
    /// The final status and the client framing chosen.
    status: u16,
    plan_framing: ResponseFraming,
    /// Where the final head ends in the response: its body's first byte.
    body_start: usize,
    /// The body was passed through in its chunks.
    passed: bool,
    /// Body content bytes, as the relay counted them.
    data: usize,
}

/// Runs the shard's relay over `response` arriving in reads of `next()` bytes, then EOF.
fn drive_relay(
    response: &[u8],
    mut next: impl FnMut() -> usize,
    client: &ClientInfo,
    was_head: bool,
) -> Relayed {
    let mut relayed = Relayed {
        end: RelayEnd::NoHead,
        out: Vec::new(),
        head_len: 0,
        status: 0,
        plan_framing: ResponseFraming::None,
        body_start: 0,
        passed: false,
        data: 0,
    };
    let (mut buf, mut scratch) = (Vec::new(), Vec::new());
    let mut body: Option<BodyRelay> = None;
    let mut fed = 0;
    loop {
        let eof = fed == response.len();
        if !eof {
            let n = next().min(response.len() - fed);
            buf.extend_from_slice(&response[fed..fed + n]);
            fed += n;
        }
        while body.is_none() {
            match parse_response_head(&buf, 16_384, was_head) {
                Err(_) => return Relayed { end: RelayEnd::BadHead, ..relayed },
                Ok(None) if eof => return relayed,
                Ok(None) => break,
                Ok(Some(head)) if head.status == 101 => {
                    return Relayed { end: RelayEnd::BadHead, ..relayed }
                }
                Ok(Some(head)) if head.is_interim() => drop(buf.drain(..head.head_len)),
                Ok(Some(head)) => {
                    let plan =
                        write_client_response_head(&head, &buf, &mut relayed.out, client, &[]);
                    relayed.head_len = relayed.out.len();
                    relayed.status = head.status;
                    relayed.plan_framing = plan.framing;
                    let relay = BodyRelay::new(head.framing, plan.framing);
                    relayed.passed = relay.passes_chunks();
                    relayed.body_start = fed - buf.len() + head.head_len;
                    body = Some(relay);
                    buf.drain(..head.head_len);
                }
            }
        }
        if let Some(relay) = body.as_mut() {
            let eof = fed == response.len();
            match relay.feed(&buf, eof, &mut scratch, &mut relayed.out) {
                Err(e) => {
                    assert_eq!(e.side(), Side::Upstream);
                    return Relayed { end: RelayEnd::BadBody, ..relayed };
                }
                Ok(p) if p.done => {
                    relayed.data += p.data;
                    relay.finish(&mut relayed.out);
                    let leftover = buf.len() - p.consumed + response.len() - fed;
                    return Relayed { end: RelayEnd::Done { leftover }, ..relayed };
                }
                Ok(p) => {
                    relayed.data += p.data;
                    assert_eq!(p.consumed, buf.len(), "an unfinished body consumes its input");
                    buf.clear();
                }
            }
        }
        if eof {
            let end = if body.is_some() { RelayEnd::Truncated } else { RelayEnd::NoHead };
            return Relayed { end, ..relayed };
        }
    }
}

/// The final response's status and body found in `response` by whole-buffer parsing: interim
/// heads skipped, the body by its framing (`reference_chunked` for a chunked one), with
/// whether it is complete and the bytes after it. `None` when there is no final head.
fn reference_relay(response: &[u8], was_head: bool) -> Option<(u16, ChunkedOutcome)> {
    let mut rest = response;
    loop {
        let head = parse_response_head(rest, 16_384, was_head).ok()??;
        if head.status == 101 {
            return None;
        }
        let after = &rest[head.head_len..];
        if head.is_interim() {
            rest = after;
            continue;
        }
        let body = match head.framing {
            ResponseFraming::None => Ok((Vec::new(), 0, true)),
            ResponseFraming::ContentLength(n) => {
                let take = usize::try_from(n).map_or(after.len(), |n| n.min(after.len()));
                Ok((after[..take].to_vec(), take, take as u64 == n))
            }
            ResponseFraming::Chunked => reference_chunked(after, &UPSTREAM_CHUNK_LIMITS),
            ResponseFraming::UntilClose => Ok((after.to_vec(), after.len(), true)),
        };
        let body = body.map(|(data, used, complete)| (data, after.len() - used, complete));
        return Some((head.status, body));
    }
}

/// The body a client reads from `out` (the relayed head and body), by the framing its head
/// announces: the data and whether the framing's end was reached.
/// `None` when the relayed head has more lines than the parser keeps (the router adds its
/// framing line to a backend head that had the most): a parser limit, not a relay error.
fn client_reads(
    out: &[u8],
    was_head: bool,
    plan_framing: ResponseFraming,
) -> Option<(Vec<u8>, bool)> {
    let head = match parse_response_head(out, usize::MAX, was_head) {
        Ok(Some(head)) => head,
        Err(e) if e.kind() == ErrorKind::TooManyHeaders => return None,
        other => panic!(
            "the client cannot parse the relayed head {:?}: {other:?}",
            String::from_utf8_lossy(out)
        ),
    };
    assert!(!head.is_interim(), "interim responses are not relayed");
    let body = &out[head.head_len..];
    assert_eq!(head.framing, plan_framing, "the client sees the framing the relay chose");
    let framing_lines = head
        .headers
        .as_slice()
        .iter()
        .filter(|h| {
            let name = h.name.get(out);
            name.eq_ignore_ascii_case(b"content-length")
                || name.eq_ignore_ascii_case(b"transfer-encoding")
        })
        .count();
    assert!(framing_lines <= 1, "one framing header at most: {:?}", String::from_utf8_lossy(out));
    match head.framing {
        ResponseFraming::None => {
            assert!(body.is_empty(), "no body bytes after a bodiless head");
            Some((Vec::new(), true))
        }
        ResponseFraming::ContentLength(n) => {
            assert!(body.len() as u64 <= n, "no more than Content-Length bytes");
            Some((body.to_vec(), body.len() as u64 == n))
        }
        ResponseFraming::Chunked => {
            let limits = ChunkedLimits {
                max_body_bytes: u64::MAX,
                max_line_bytes: 64,
                max_trailer_bytes: 0,
            };
            let (data, used, complete) =
                reference_chunked(body, &limits).expect("the relayed chunks are valid");
            assert_eq!(used, body.len(), "nothing after the last chunk");
            Some((data, complete))
        }
        ResponseFraming::UntilClose => Some((body.to_vec(), true)),
    }
}

/// Backend responses for the relay's unit test and the fuzz target's seeds.
pub const RELAY_SEEDS: [&[u8]; 9] = [
    b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n\
      f\r\ndata: {\"a\":1}\n\n\r\ne;x=y\r\ndata: [DONE]\n\n\r\n0\r\nT: v\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\nConnection: keep-alive, x-a\r\nx-a: 1\r\n\r\nhelloHTTP",
    b"HTTP/1.0 200 OK\r\nContent-Type: application/json\r\n\r\n{\"until\":\"close\"}",
    b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nLink: </a>\r\n\r\n\
      HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\nzz\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\nshort",
    b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n",
    b"HTTP/1.1 502 Bad Gateway\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nbad",
    b"HTTP/1.1 200 OK\r\nConnection: Content-Length\r\nContent-Length: 4\r\n\r\nsome",
];

/// Relays `data` (after two parameter bytes) as a backend response, whole and split into
/// reads; checks both against [`reference_relay`] and the client's view of the bytes.
pub fn check_relay(mut data: &[u8]) {
    let p = take(&mut data);
    let seed = take(&mut data);
    let client = ClientInfo {
        version: if p & 1 == 0 { Version::Http11 } else { Version::Http10 },
        keep_alive: p & 2 == 0,
    };
    let was_head = p & 4 != 0;
    let whole = drive_relay(data, || usize::MAX, &client, was_head);
    let split = drive_relay(data, pieces(seed.max(1)), &client, was_head);
    assert_eq!(whole.end, split.end, "splitting the response changed how it ended");
    assert_eq!(whole.out[..whole.head_len], split.out[..split.head_len], "the relayed head");
    let reference = reference_relay(data, was_head);
    let data_in = data;
    for relayed in [&whole, &split] {
        match (&relayed.end, &reference) {
            (RelayEnd::NoHead | RelayEnd::BadHead, None) => {
                assert!(relayed.out.is_empty(), "nothing is relayed without a final head");
                continue;
            }
            (RelayEnd::NoHead | RelayEnd::BadHead, Some(_)) => {
                panic!("the relay found no head where the reference did: {:?}", relayed.end)
            }
            (_, None) => panic!("the relay found a head the reference did not: {:?}", relayed.end),
            (_, Some((status, _))) => assert_eq!(relayed.status, *status),
        }
        let Some((body, complete)) = client_reads(&relayed.out, was_head, relayed.plan_framing)
        else {
            continue;
        };
        let Some((_, expected)) = &reference else { unreachable!() };
        match (&relayed.end, expected) {
            (RelayEnd::BadBody, Err(_)) => {
                let close_delimited = relayed.plan_framing == ResponseFraming::UntilClose;
                assert!(!complete || close_delimited, "a cut stream does not look complete");
            }
            (RelayEnd::Truncated, Ok((data, 0, false))) => {
                assert!(data.starts_with(&body), "the client got a prefix of the body");
                let close_delimited = relayed.plan_framing == ResponseFraming::UntilClose;
                assert!(!complete || close_delimited, "a truncated body does not look complete");
            }
            (RelayEnd::Done { leftover }, Ok((data, after, true))) => {
                assert_eq!(&body, data, "the client reads the backend's body");
                assert_eq!(relayed.data, data.len(), "the relay counts the body's data");
                if relayed.passed {
                    let raw = &data_in[relayed.body_start..data_in.len() - leftover];
                    let sent = &relayed.out[relayed.head_len..];
                    assert_eq!(sent, reference_pass(raw), "the chunks are passed through");
                }
                assert!(complete, "a finished relay looks complete to the client");
                assert_eq!(leftover, after, "the bytes after the body are left alone");
            }
            (end, expected) => panic!("relay ended {end:?}, reference says {expected:?}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Backend responses of every framing, with interim heads, a malformed chunk and a
    /// truncated body, through [`check_relay`] for every client and split parameter.
    #[test]
    fn relay_matches_the_reference_on_seeds() {
        for response in RELAY_SEEDS {
            for p in 0..8u8 {
                for seed in [0u8, 1, 2, 3, 7, 100, 255] {
                    let mut data = vec![p, seed];
                    data.extend_from_slice(response);
                    check_relay(&data);
                }
            }
        }
    }
}
