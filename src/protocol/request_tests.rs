use super::*;

fn limits() -> Limits {
    Limits::default()
}

fn parse(buf: &[u8]) -> Result<Option<RequestHead>, ProtocolError> {
    parse_request_head(buf, &limits())
}

fn kind(buf: &[u8]) -> ErrorKind {
    parse(buf).expect_err("refused").kind()
}

fn head(buf: &[u8]) -> RequestHead {
    parse(buf).expect("valid").expect("complete")
}

const POST: &[u8] = b"POST /v1/chat/completions?x=1 HTTP/1.1\r\nHost: a\r\nContent-Length: 5\r\n\
X-Session-ID:  abc  \r\nX-Request-ID: r1\r\n\r\nhello";

#[test]
fn parses_a_post() {
    let h = head(POST);
    assert_eq!(h.method(POST), b"POST");
    assert_eq!(h.target(POST), b"/v1/chat/completions?x=1");
    assert_eq!(h.path(POST), b"/v1/chat/completions");
    assert_eq!(h.query(POST), Some(&b"x=1"[..]));
    assert_eq!(h.version, Version::Http11);
    assert_eq!(h.framing, Framing::ContentLength(5));
    assert_eq!(&POST[h.head_len..], b"hello");
    assert!(h.keep_alive);
    assert!(!h.expect_continue);
    assert_eq!(h.session_id(POST), Some(&b"abc"[..]));
    assert_eq!(h.request_id.map(|s| s.get(POST)), Some(&b"r1"[..]));
    assert_eq!(h.headers.as_slice().len(), 4);
    assert_eq!(h.headers.get(POST, "HOST"), Some(&b"a"[..]));
}

#[test]
fn byte_by_byte_is_incomplete_until_the_last_byte() {
    let head_len = head(POST).head_len;
    for end in 0..head_len {
        assert_eq!(parse(&POST[..end]), Ok(None), "prefix of {end} bytes");
    }
    assert_eq!(parse(&POST[..head_len]).unwrap().unwrap().head_len, head_len);
}

#[test]
fn pipelined_requests_in_one_buffer() {
    let buf = b"GET /healthz HTTP/1.1\r\nHost: a\r\n\r\nPOST /v1/x HTTP/1.1\r\nHost: a\r\n\
Transfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET /readyz HTTP/1.1\r\nHost: a\r\n\r\n";
    let first = head(buf);
    assert_eq!(first.framing, Framing::None);
    let rest = &buf[first.head_len..];
    let second = head(rest);
    assert_eq!(second.method(rest), b"POST");
    assert_eq!(second.framing, Framing::Chunked);
    let third = &rest[second.head_len + 5..];
    assert_eq!(head(third).path(third), b"/readyz");
}

#[test]
fn http10_keep_alive_rules() {
    let h = head(b"GET / HTTP/1.0\r\n\r\n");
    assert_eq!((h.version, h.keep_alive), (Version::Http10, false));
    assert!(head(b"GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").keep_alive);
    assert!(!head(b"GET / HTTP/1.0\r\nConnection: keep-alive, close\r\n\r\n").keep_alive);
    assert!(!head(b"GET / HTTP/1.1\r\nHost: a\r\nConnection: foo, CLOSE\r\n\r\n").keep_alive);
    assert_eq!(
        kind(b"POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
        ErrorKind::TransferEncodingInHttp10
    );
}

#[test]
fn expect_continue() {
    let h =
        head(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n");
    assert!(h.expect_continue);
    assert!(!head(b"POST / HTTP/1.1\r\nHost: a\r\nExpect: other\r\n\r\n").expect_continue);
}

#[test]
fn smuggling_shapes_are_400() {
    let cases: [(&[u8], ErrorKind); 12] = [
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", ErrorKind::ContentLengthWithTransferEncoding),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", ErrorKind::ContentLengthWithTransferEncoding),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\n", ErrorKind::DuplicateContentLength),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nContent-Length: 4\r\n\r\n", ErrorKind::DuplicateContentLength),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 3, 3\r\n\r\n", ErrorKind::InvalidContentLength),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: -1\r\n\r\n", ErrorKind::InvalidContentLength),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: +1\r\n\r\n", ErrorKind::InvalidContentLength),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 18446744073709551616\r\n\r\n", ErrorKind::InvalidContentLength),
        (b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length:\r\n\r\n", ErrorKind::InvalidContentLength),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", ErrorKind::UnsupportedTransferEncoding),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n", ErrorKind::UnsupportedTransferEncoding),
        (b"POST / HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: xchunked\r\n\r\n", ErrorKind::UnsupportedTransferEncoding),
    ];
    for (buf, expected) in cases {
        let err = parse(buf).expect_err(&String::from_utf8_lossy(buf));
        assert_eq!(err.kind(), expected, "{}", String::from_utf8_lossy(buf));
        assert_eq!(err.status(), 400);
    }
    let h = head(b"POST / HTTP/1.1\r\nHost: a\r\ntransfer-encoding:  CHUNKED \r\n\r\n");
    assert_eq!(h.framing, Framing::Chunked);
}

#[test]
fn malformed_lines_are_400() {
    assert_eq!(
        kind(b"POST / HTTP/1.1\r\nHost: a\r\nX-A: 1\r\n continued\r\n\r\n"),
        ErrorKind::InvalidHeaderName
    );
    assert_eq!(kind(b"POST / HTTP/1.1\r\n\tHost: a\r\n\r\n"), ErrorKind::InvalidHeaderName);
    assert_eq!(
        kind(b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length : 3\r\n\r\n"),
        ErrorKind::InvalidHeaderName
    );
    assert_eq!(kind(b"POST / HTTP/1.1\r\nHo(st: a\r\n\r\n"), ErrorKind::InvalidHeaderName);
    assert_eq!(kind(b"POST / HTTP/1.1\r\nHost: a\x01b\r\n\r\n"), ErrorKind::InvalidHeaderValue);
    assert_eq!(kind(b"POST / HTTP/1.1\r\nHost: a\rb\r\n\r\n"), ErrorKind::InvalidHeaderValue);
    assert_eq!(kind(b"PO ST / HTTP/1.1\r\n\r\n"), ErrorKind::UnsupportedVersion);
    assert_eq!(kind(b"POST  / HTTP/1.1\r\n\r\n"), ErrorKind::InvalidStartLine);
    assert_eq!(kind(b"POST / HTTP/1.1\r\n\r\n"), ErrorKind::InvalidHost);
    assert_eq!(kind(b"POST / HTTP/1.1\r\nHost: a\r\nhost: b\r\n\r\n"), ErrorKind::InvalidHost);
    assert_eq!(kind(b"GET / HTTP/1.0\r\nHost: a\r\nHost: b\r\n\r\n"), ErrorKind::InvalidHost);
    // Bytes 0x80-0xFF are allowed in values.
    assert!(head(b"GET / HTTP/1.1\r\nHost: a\r\nX-Name: caf\xc3\xa9 \xff\r\n\r\n").keep_alive);
}

#[test]
fn versions_other_than_1x_are_400() {
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
    assert_eq!(kind(preface), ErrorKind::UnsupportedVersion);
    assert_eq!(parse(preface).unwrap_err().status(), 400);
    assert_eq!(kind(b"GET / HTTP/1.2\r\n\r\n"), ErrorKind::UnsupportedVersion);
    assert_eq!(kind(b"GET / HTTP/2\r\n\r\n"), ErrorKind::UnsupportedVersion);
    assert_eq!(kind(b"GET / HTTP/0.9\r\n\r\n"), ErrorKind::UnsupportedVersion);
}

#[test]
fn head_size_limit_at_and_past_the_boundary() {
    let buf = b"GET / HTTP/1.1\r\nHost: a\r\n\r\n";
    let exact = Limits { max_header_bytes: buf.len(), ..limits() };
    assert!(parse_request_head(buf, &exact).unwrap().is_some());
    let under = Limits { max_header_bytes: buf.len() - 1, ..limits() };
    let err = parse_request_head(buf, &under).unwrap_err();
    assert_eq!((err.kind(), err.status()), (ErrorKind::HeadTooLarge, 431));
    // Incomplete but already at the limit: refused without waiting for the rest.
    let err = parse_request_head(&buf[..buf.len() - 1], &under).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeadTooLarge);
    assert_eq!(parse_request_head(&buf[..buf.len() - 2], &under), Ok(None));
}

#[test]
fn header_count_limit_at_and_past_the_boundary() {
    let mut buf = b"GET / HTTP/1.1\r\nHost: a\r\n".to_vec();
    for i in 0..3 {
        buf.extend_from_slice(format!("X-{i}: v\r\n").as_bytes());
    }
    buf.extend_from_slice(b"\r\n");
    let four = Limits { max_headers: 4, ..limits() };
    assert!(parse_request_head(&buf, &four).unwrap().is_some());
    let three = Limits { max_headers: 3, ..limits() };
    let err = parse_request_head(&buf, &three).unwrap_err();
    assert_eq!((err.kind(), err.status()), (ErrorKind::TooManyHeaders, 431));
}

#[test]
fn body_limit_at_and_past_the_boundary() {
    let small = Limits { max_body_bytes: 10, ..limits() };
    let at = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 10\r\n\r\n";
    assert_eq!(
        parse_request_head(at, &small).unwrap().unwrap().framing,
        Framing::ContentLength(10)
    );
    let past = b"POST / HTTP/1.1\r\nHost: a\r\nContent-Length: 11\r\n\r\n";
    let err = parse_request_head(past, &small).unwrap_err();
    assert_eq!((err.kind(), err.status()), (ErrorKind::BodyTooLarge, 413));
}

#[test]
fn session_header_rules() {
    let with =
        |v: &str| format!("GET / HTTP/1.1\r\nHost: a\r\nx-SESSION-id: {v}\r\n\r\n").into_bytes();
    assert_eq!(head(&with("")).session_id, None);
    assert_eq!(head(&with("   ")).session_id, None);
    let at = with(&"s".repeat(256));
    assert_eq!(head(&at).session_id(&at).map(<[u8]>::len), Some(256));
    assert_eq!(kind(&with(&"s".repeat(257))), ErrorKind::SessionIdTooLong);
    assert_eq!(parse(&with(&"s".repeat(257))).unwrap_err().status(), 400);
    assert_eq!(kind(&with("a b")), ErrorKind::InvalidSessionId);
    assert_eq!(
        kind(b"GET / HTTP/1.1\r\nHost: a\r\nX-Session-ID: caf\xc3\xa9\r\n\r\n"),
        ErrorKind::InvalidSessionId
    );
    assert_eq!(
        kind(b"GET / HTTP/1.1\r\nHost: a\r\nX-Session-ID: a\r\nX-Session-ID: a\r\n\r\n"),
        ErrorKind::InvalidSessionId
    );
    let custom = Limits { session_header: "x-conversation".into(), ..limits() };
    let buf = b"GET / HTTP/1.1\r\nHost: a\r\nX-Conversation: c1\r\nX-Session-ID: s\r\n\r\n";
    let h = parse_request_head(buf, &custom).unwrap().unwrap();
    assert_eq!(h.session_id(buf), Some(&b"c1"[..]));
}

#[test]
fn leading_empty_lines_and_bare_lf_are_accepted() {
    let buf = b"\r\nGET / HTTP/1.1\nHost: a\n\n";
    let h = head(buf);
    assert_eq!(h.head_len, buf.len());
    assert_eq!(h.path(buf), b"/");
}

#[test]
fn content_length_parser() {
    assert_eq!(parse_content_length(b"0"), Some(0));
    assert_eq!(parse_content_length(b" 0042 "), Some(42));
    assert_eq!(parse_content_length(b"18446744073709551615"), Some(u64::MAX));
    for bad in [&b""[..], b"1 2", b"0x1", b"1.0", b"1,1", b"\xff"] {
        assert_eq!(parse_content_length(bad), None);
    }
}

/// A head parsed into one kept from an earlier request is the head parsed afresh: every field
/// is rewritten, and the earlier head's extra header lines are not among the new one's.
#[test]
fn a_head_parsed_in_place_over_another_is_the_fresh_parse() {
    let earlier = b"POST /a HTTP/1.1\r\nHost: a\r\nConnection: close\r\nExpect: 100-continue\r\n\
Transfer-Encoding: chunked\r\nX-Session-ID: s1\r\nX-Request-ID: r1\r\nX-One: 1\r\nX-Two: 2\r\n\r\n";
    let later = b"GET /b HTTP/1.1\r\nHost: b\r\n\r\n";
    let mut kept = RequestHead::EMPTY;
    assert_eq!(parse_request_head_into(earlier, &limits(), &mut kept), Ok(true));
    assert_eq!(kept.headers.as_slice().len(), 8);
    assert!(!kept.keep_alive && kept.framing == Framing::Chunked);
    assert_eq!(parse_request_head_into(later, &limits(), &mut kept), Ok(true));
    assert_eq!(kept, head(later));
    assert_eq!(kept.headers.as_slice().len(), 1);
    assert_eq!((kept.session_id, kept.request_id, kept.expect_continue), (None, None, false));
    // An incomplete head says so; a complete one parsed after it is whole.
    assert_eq!(parse_request_head_into(&later[..10], &limits(), &mut kept), Ok(false));
    assert_eq!(parse_request_head_into(POST, &limits(), &mut kept), Ok(true));
    assert_eq!(kept, head(POST));
}
