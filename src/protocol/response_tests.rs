use super::*;

fn parse(buf: &[u8]) -> ResponseHead {
    parse_response_head(buf, 4096, false).unwrap().unwrap()
}

fn relay(buf: &[u8], version: Version, keep_alive: bool) -> (String, RelayPlan) {
    let head = parse(buf);
    let mut out = Vec::new();
    let plan =
        write_client_response_head(&head, buf, &mut out, &ClientInfo { version, keep_alive }, &[]);
    (String::from_utf8(out).unwrap(), plan)
}

#[test]
fn framing_of_backend_responses() {
    let sse = b"HTTP/1.1 200 OK\r\nContent-Type: Text/Event-Stream; charset=utf-8\r\nTransfer-Encoding: chunked\r\n\r\n";
    let h = parse(sse);
    assert_eq!((h.status, h.reason.get(sse)), (200, &b"OK"[..]));
    assert_eq!(h.framing, ResponseFraming::Chunked);
    assert!(h.is_event_stream && h.keep_alive);
    let h = parse(b"HTTP/1.1 200 OK\r\nContent-Length: 12\r\n\r\n");
    assert_eq!(h.framing, ResponseFraming::ContentLength(12));
    assert!(!h.is_event_stream);
    let h = parse(b"HTTP/1.1 200 OK\r\n\r\n");
    assert_eq!((h.framing, h.keep_alive), (ResponseFraming::UntilClose, false));
    for status in [b"100", b"103", b"204", b"304"] {
        let buf = [&b"HTTP/1.1 "[..], status, b" X\r\nContent-Length: 5\r\n\r\n"].concat();
        assert_eq!(parse(&buf).framing, ResponseFraming::None);
    }
    assert!(parse(b"HTTP/1.1 100 Continue\r\n\r\n").is_interim());
    let head =
        parse_response_head(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", 4096, true).unwrap();
    assert_eq!(head.unwrap().framing, ResponseFraming::None);
    let h = parse(b"HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n");
    assert!(!h.keep_alive);
    assert!(
        parse(b"HTTP/1.0 200 OK\r\nConnection: keep-alive\r\nContent-Length: 1\r\n\r\n").keep_alive
    );
    assert!(
        !parse(b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 1\r\n\r\n").keep_alive
    );
    assert_eq!(parse(b"HTTP/1.1 200\r\n\r\n").reason, Span::default());
}

#[test]
fn malformed_backend_responses_are_502() {
    let bad: [&[u8]; 8] = [
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nContent-Length: x\r\n\r\n",
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n",
        b"HTTP/2 200 OK\r\n\r\n",
        b"HTTP/1.1 2000 OK\r\n\r\n",
        // Three digits, but not a status (RFC 9110 15): relayed, `004` would become `4`.
        b"HTTP/1.1 004 OK\r\n\r\n",
        b"HTTP/1.1 600 OK\r\n\r\n",
    ];
    for buf in bad {
        let err = parse_response_head(buf, 4096, false).unwrap_err();
        assert_eq!((err.side(), err.status(), err.code()), (Side::Upstream, 502, "upstream_error"));
    }
    let err = parse_response_head(b"HTTP/1.1 200 OK\r\nX: 1234\r\n", 20, false).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::HeadTooLarge);
    assert_eq!(parse_response_head(b"HTTP/1.1 200 OK\r\nX: 1", 4096, false), Ok(None));
}

#[test]
fn relays_length_and_strips_hop_by_hop() {
    let buf =
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nConnection: keep-alive, X-Hop\r\n\
X-Hop: 1\r\nKeep-Alive: timeout=5\r\nContent-Length: 2\r\n\r\n{}";
    let (head, plan) = relay(buf, Version::Http11, true);
    assert_eq!(
        head,
        "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2\r\n\r\n"
    );
    assert_eq!(plan, RelayPlan { framing: ResponseFraming::ContentLength(2), keep_alive: true });
    let (head, plan) = relay(buf, Version::Http10, true);
    assert!(head.ends_with("Content-Length: 2\r\nConnection: keep-alive\r\n\r\n"));
    assert!(plan.keep_alive);
    let (head, plan) = relay(buf, Version::Http11, false);
    assert!(head.ends_with("Connection: close\r\n\r\n"));
    assert!(!plan.keep_alive);
}

#[test]
fn chunked_or_close_delimited_bodies_are_rechunked_for_http11_clients() {
    let sse =
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n";
    let (head, plan) = relay(sse, Version::Http11, true);
    assert_eq!(
        head,
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
    );
    assert_eq!(plan, RelayPlan { framing: ResponseFraming::Chunked, keep_alive: true });
    let (head, plan) = relay(b"HTTP/1.0 200 OK\r\nX: y\r\n\r\n", Version::Http11, true);
    assert_eq!(head, "HTTP/1.1 200 OK\r\nX: y\r\nTransfer-Encoding: chunked\r\n\r\n");
    assert_eq!(plan.framing, ResponseFraming::Chunked);
    let (head, plan) = relay(sse, Version::Http10, true);
    assert_eq!(
        head,
        "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nConnection: close\r\n\r\n"
    );
    assert_eq!(plan, RelayPlan { framing: ResponseFraming::UntilClose, keep_alive: false });
}

#[test]
fn no_body_statuses_keep_or_drop_length() {
    let (head, plan) =
        relay(b"HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n", Version::Http11, true);
    assert_eq!(head, "HTTP/1.1 304 Not Modified\r\nContent-Length: 9\r\n\r\n");
    assert_eq!(plan.framing, ResponseFraming::None);
    let (head, _) =
        relay(b"HTTP/1.1 204 No Content\r\nContent-Length: 0\r\n\r\n", Version::Http11, true);
    assert_eq!(head, "HTTP/1.1 204 No Content\r\n\r\n");
}

#[test]
fn extra_headers_are_appended() {
    let buf = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
    let head = parse(buf);
    let mut out = Vec::new();
    let client = ClientInfo { version: Version::Http11, keep_alive: true };
    write_client_response_head(&head, buf, &mut out, &client, &[("x-warmpath-lane", b"boosted")]);
    assert!(out.ends_with(b"Content-Length: 0\r\nx-warmpath-lane: boosted\r\n\r\n"));
}

fn error_response(
    status: u16,
    code: &str,
    message: &str,
    extra: &[(&str, &[u8])],
) -> (String, serde_json::Value) {
    let mut out = Vec::new();
    write_error(status, code, message, &mut out, extra);
    let text = String::from_utf8(out).unwrap();
    let (head, body) = text.split_once("\r\n\r\n").unwrap();
    let length: usize = head
        .split("Content-Length: ")
        .nth(1)
        .unwrap()
        .split("\r\n")
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_eq!(length, body.len());
    (head.to_owned(), serde_json::from_str(body).unwrap())
}

#[test]
fn router_errors_are_openai_shaped() {
    let (head, body) = error_response(404, "model_not_found", "model \"x\" is not configured", &[]);
    assert!(head.starts_with("HTTP/1.1 404 Not Found\r\nContent-Type: application/json\r\n"));
    assert!(!head.contains("Retry-After"));
    assert_eq!(
        body,
        serde_json::json!({"error": {"message": "model \"x\" is not configured", "type": "invalid_request_error", "code": "model_not_found"}})
    );
    for status in [429, 503, 504] {
        let (head, body) = error_response(status, "queue_full", "full\n", &[]);
        assert!(head.contains("\r\nRetry-After: 1"), "{status}");
        assert_eq!(body["error"]["message"], "full\n");
    }
    let (head, body) = error_response(
        503,
        "unavailable",
        "bye",
        &[("Retry-After", b"7"), ("Connection", b"close")],
    );
    assert!(head.ends_with("\r\nRetry-After: 7\r\nConnection: close"));
    assert_eq!(body["error"]["type"], "server_error");
    assert_eq!(error_response(429, "queue_full", "", &[]).1["error"]["type"], "rate_limit_error");
}

#[test]
fn protocol_errors_close_the_connection() {
    let mut out = Vec::new();
    write_protocol_error(ProtocolError::downstream(ErrorKind::HeadTooLarge), &mut out);
    let text = String::from_utf8(out).unwrap();
    assert!(text.starts_with("HTTP/1.1 431 Request Header Fields Too Large\r\n"));
    assert!(text.contains("Connection: close\r\n"));
    assert!(text.contains("\"code\":\"headers_too_large\""));
}

/// A response head parsed into one kept from an earlier response is the head parsed afresh.
#[test]
fn a_head_parsed_in_place_over_another_is_the_fresh_parse() {
    let earlier: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\
Transfer-Encoding: chunked\r\nX-One: 1\r\nX-Two: 2\r\n\r\n";
    let later: &[u8] = b"HTTP/1.0 404 Not Found\r\nContent-Length: 0\r\n\r\n";
    let mut kept = ResponseHead::EMPTY;
    assert_eq!(parse_response_head_into(earlier, 4096, false, &mut kept), Ok(true));
    assert!(kept.is_event_stream && kept.headers.as_slice().len() == 4);
    assert_eq!(parse_response_head_into(later, 4096, false, &mut kept), Ok(true));
    assert_eq!(kept, parse(later));
    assert_eq!(kept.headers.as_slice().len(), 1);
    assert_eq!(parse_response_head_into(&earlier[..20], 4096, false, &mut kept), Ok(false));
}

/// A backend's `Connection` header that names `Content-Length` does not take the length out
/// of the relayed head: the client would have no way to find the body's end on a connection
/// kept alive. The framing the router relays with is always stated.
#[test]
fn a_connection_listing_does_not_remove_the_relayed_length() {
    let buf = b"HTTP/1.1 200 OK\r\nConnection: Content-Length, X-A\r\nContent-Length: 5\r\nX-A: 1\r\n\r\n";
    let (head, plan) = relay(buf, Version::Http11, true);
    assert_eq!(plan.framing, ResponseFraming::ContentLength(5));
    assert_eq!(head, "HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n");
}
