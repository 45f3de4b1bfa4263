use super::*;

fn limits() -> ChunkedLimits {
    ChunkedLimits { max_body_bytes: 1 << 20, max_line_bytes: 64, max_trailer_bytes: 64 }
}

/// Feeds `input` whole: decoded bytes and progress, or the error kind.
fn decode_with(input: &[u8], limits: ChunkedLimits) -> Result<(Vec<u8>, Progress), ErrorKind> {
    let mut d = ChunkedDecoder::new(limits, Side::Downstream);
    let mut out = Vec::new();
    let p = d.feed(input, &mut out).map_err(ProtocolError::kind)?;
    Ok((out, p))
}

fn decode(input: &[u8]) -> Result<(Vec<u8>, Progress), ErrorKind> {
    decode_with(input, limits())
}

/// Feeds `input` one byte at a time.
fn decode_bytewise(input: &[u8]) -> Result<(Vec<u8>, Progress), ErrorKind> {
    let mut d = ChunkedDecoder::new(limits(), Side::Downstream);
    let mut out = Vec::new();
    let mut consumed = 0;
    for b in input {
        let p = d.feed(std::slice::from_ref(b), &mut out).map_err(ProtocolError::kind)?;
        consumed += p.consumed;
        if p.done {
            return Ok((out, Progress { consumed, done: true }));
        }
    }
    Ok((out, Progress { consumed, done: false }))
}

const BODY: &[u8] = b"4\r\nWiki\r\n5;name=value;x\r\npedia\r\nE\r\n in\r\n\r\nchunks.\r\n0\r\nExpires: x\r\n\r\nNEXT";

#[test]
fn decodes_with_extensions_and_trailers_leaving_pipelined_bytes() {
    let (out, p) = decode(BODY).unwrap();
    assert_eq!(out, b"Wikipedia in\r\n\r\nchunks.");
    assert_eq!(p, Progress { consumed: BODY.len() - 4, done: true });
    assert_eq!(decode_bytewise(BODY).unwrap(), (out, p));
}

#[test]
fn every_split_gives_the_same_result() {
    let whole = decode(BODY).unwrap();
    for cut in 0..whole.1.consumed {
        let mut d = ChunkedDecoder::new(limits(), Side::Downstream);
        let mut out = Vec::new();
        let first = d.feed(&BODY[..cut], &mut out).unwrap();
        assert_eq!(first, Progress { consumed: cut, done: false });
        let second = d.feed(&BODY[cut..], &mut out).unwrap();
        assert_eq!((out, cut + second.consumed), (whole.0.clone(), whole.1.consumed));
        assert!(second.done && d.is_done());
        assert_eq!(d.decoded_bytes(), 23);
    }
}

#[test]
fn incomplete_body_consumes_everything() {
    let (out, p) = decode(b"5\r\nhel").unwrap();
    assert_eq!((out.as_slice(), p), (&b"hel"[..], Progress { consumed: 6, done: false }));
    assert!(!decode(b"0\r\n\r").unwrap().1.done);
}

#[test]
fn bad_sizes_are_refused() {
    for bad in [&b"\r\n"[..], b"g\r\n", b"-1\r\n", b"0x5\r\n", b";ext\r\n", b" 5\r\n", b"+5\r\n"] {
        assert_eq!(decode(bad).unwrap_err(), ErrorKind::InvalidChunkSize, "{bad:?}");
        assert_eq!(decode_bytewise(bad).unwrap_err(), ErrorKind::InvalidChunkSize);
    }
    // 16 digits are fine (leading zeros count), 17 are not.
    assert!(decode(b"0000000000000001\r\nx\r\n").is_ok());
    assert_eq!(decode(b"00000000000000001\r\n").unwrap_err(), ErrorKind::InvalidChunkSize);
    let huge = ChunkedLimits { max_body_bytes: u64::MAX, ..limits() };
    assert!(decode_with(b"ffffffffffffffff\r\nabc", huge).is_ok());
    let total = decode_with(b"ffffffffffffffff\r\n", huge).map(|(_, p)| p.done);
    assert_eq!(total, Ok(false));
}

#[test]
fn body_limit_at_and_past_the_boundary() {
    let ten = ChunkedLimits { max_body_bytes: 10, ..limits() };
    let at = b"6\r\nabcdef\r\n4\r\nghij\r\n0\r\n\r\n";
    assert_eq!(decode_with(at, ten).unwrap().0, b"abcdefghij");
    let past = b"6\r\nabcdef\r\n5\r\nghijk\r\n0\r\n\r\n";
    assert_eq!(decode_with(past, ten).unwrap_err(), ErrorKind::BodyTooLarge);
    let err =
        ChunkedDecoder::new(ten, Side::Downstream).feed(b"b\r\n", &mut Vec::new()).unwrap_err();
    assert_eq!(err.status(), 413);
    let err = ChunkedDecoder::new(ten, Side::Upstream).feed(b"b\r\n", &mut Vec::new()).unwrap_err();
    assert_eq!(err.status(), 502);
    // Overflowing the running total is the same error.
    let max = ChunkedLimits { max_body_bytes: u64::MAX, ..limits() };
    let mut d = ChunkedDecoder::new(max, Side::Downstream);
    d.feed(b"1\r\nx\r\n", &mut Vec::new()).unwrap();
    let err = d.feed(b"ffffffffffffffff\r\n", &mut Vec::new()).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::BodyTooLarge);
}

#[test]
fn line_limit_at_and_past_the_boundary() {
    let mut at = b"1;".to_vec();
    at.resize(64, b'e');
    at.extend_from_slice(b"\r\nx\r\n");
    assert!(decode(&at).is_ok());
    let mut past = b"1;".to_vec();
    past.resize(65, b'e');
    past.extend_from_slice(b"\r\n");
    assert_eq!(decode(&past).unwrap_err(), ErrorKind::InvalidChunkExtension);
}

#[test]
fn trailer_limit_at_and_past_the_boundary() {
    let line = |n: usize| {
        let mut t = b"0\r\nX:".to_vec();
        t.resize(3 + n - 2, b'v');
        t.extend_from_slice(b"\r\n\r\n");
        t
    };
    assert!(decode(&line(64)).unwrap().1.done);
    assert_eq!(decode(&line(65)).unwrap_err(), ErrorKind::InvalidTrailer);
}

#[test]
fn framing_errors() {
    let cases: [(&[u8], ErrorKind); 9] = [
        (b"3\nabc\r\n", ErrorKind::InvalidChunkSize),
        (b"3\r\rabc", ErrorKind::InvalidChunkFraming),
        (b"3\r\nabcX", ErrorKind::InvalidChunkFraming),
        (b"3\r\nabc\r\r", ErrorKind::InvalidChunkFraming),
        (b"3;a\nb\r\n", ErrorKind::InvalidChunkExtension),
        (b"3 \r\n", ErrorKind::InvalidChunkExtension),
        (b"0\r\n\n", ErrorKind::InvalidTrailer),
        (b"0\r\n X: y\r\n\r\n", ErrorKind::InvalidTrailer),
        (b"0\r\n\rX", ErrorKind::InvalidTrailer),
    ];
    for (input, kind) in cases {
        assert_eq!(decode(input).unwrap_err(), kind, "{}", String::from_utf8_lossy(input));
        assert_eq!(decode_bytewise(input).unwrap_err(), kind);
    }
    assert!(decode(b"3 ; a = \"b\"\r\nabc\r\n0\r\n\r\n").unwrap().1.done);
}

#[test]
fn encoder_round_trips_through_the_decoder() {
    let mut out = Vec::new();
    ChunkedEncoder::chunk(b"hello", &mut out);
    ChunkedEncoder::chunk(b"", &mut out);
    ChunkedEncoder::chunk(&[b'x'; 300], &mut out);
    ChunkedEncoder::finish(&mut out);
    assert!(out.starts_with(b"5\r\nhello\r\n12c\r\n"));
    let (decoded, p) = decode(&out).unwrap();
    assert_eq!(decoded.len(), 305);
    assert_eq!(p, Progress { consumed: out.len(), done: true });
}
