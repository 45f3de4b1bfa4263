//! The request head sent to a backend (SPEC 2.6, RFC 9110 section 7.6).
//!
//! Same method and target, always `HTTP/1.1` (the router's upstream connections are persistent
//! HTTP/1.1 whatever the client spoke), every header line in its original order and spelling
//! except:
//! - hop-by-hop fields (`Connection` and every field it names, `Keep-Alive`, `Proxy-Connection`,
//!   `TE`, `Trailer`, `Transfer-Encoding`, `Upgrade`, `Proxy-Authorization`,
//!   `Proxy-Authenticate`), except that `Host`, `X-Forwarded-For` and `X-Request-ID` stay when
//!   `Connection` names them ([`KEPT`]);
//! - `Content-Length`, written anew with the length of the body actually sent (decoded from
//!   chunks, possibly rewritten): upstream bodies are always sent with a length;
//! - `Expect`: the router has read the whole body before forwarding, so a backend's
//!   `100 Continue` would only be noise;
//! - `Authorization`, when [`ForwardInfo::authorization`] says so: the header carried the
//!   router's own API key (issue \[11\]), which an engine must not see (nor log); or the
//!   model's engines take a key of their own (`backend_api_key_file`), which is sent in its
//!   place, after the client's other fields.
//!
//! `Host` is kept (and added, as `ForwardInfo::default_host`, for an HTTP/1.0 client that sent
//! none, since the forwarded request is HTTP/1.1). The client address is appended to the last
//! `X-Forwarded-For` line (or a line is added), and `X-Request-ID` is added when the client sent
//! none.

use std::net::IpAddr;

use super::request::{Framing, RequestHead};
use super::{write_decimal, write_header, write_ip, HopByHop};

/// What the router adds to a forwarded request.
#[derive(Debug, Clone, Copy)]
pub struct ForwardInfo<'a> {
    /// The client's address, appended to `X-Forwarded-For`.
    pub client_addr: IpAddr,
    /// The id to send as `X-Request-ID` when the client sent none.
    pub request_id: &'a [u8],
    /// The `Host` to send when the client sent none (an HTTP/1.0 client): the backend's
    /// authority, e.g. `10.0.0.11:8000`.
    pub default_host: &'a [u8],
    /// The length of the body that follows the head.
    pub body_len: u64,
    /// What becomes of the client's `Authorization`.
    pub authorization: Authorization<'a>,
}

/// The `Authorization` a forwarded request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authorization<'a> {
    /// The client's, as sent (no tenants, no engine key: the engines' own keys apply).
    Forward,
    /// None: the client's held a key of the router's tenants.
    Strip,
    /// This value (`Bearer <the engine's key>`), in place of the client's.
    Set(&'a [u8]),
}

/// Appends the head of `head` (parsed from `buf`) as sent to a backend.
pub fn write_upstream_head(
    head: &RequestHead,
    buf: &[u8],
    out: &mut Vec<u8>,
    extra: &ForwardInfo<'_>,
) {
    out.extend_from_slice(head.method(buf));
    out.push(b' ');
    out.extend_from_slice(head.target(buf));
    out.extend_from_slice(b" HTTP/1.1\r\n");
    let headers = head.headers.as_slice();
    if head.headers.get(buf, "host").is_none() {
        write_header(out, b"Host", extra.default_host);
    }
    let is_xff = |name: &[u8]| name.eq_ignore_ascii_case(b"x-forwarded-for");
    let last_xff = headers.iter().rposition(|h| is_xff(h.name.get(buf)));
    let hop_by_hop = HopByHop::of(&head.headers, buf, &KEPT);
    for (i, h) in headers.iter().enumerate() {
        let name = h.name.get(buf);
        if hop_by_hop.contains(name)
            || name.eq_ignore_ascii_case(b"content-length")
            || name.eq_ignore_ascii_case(b"expect")
            || extra.authorization != Authorization::Forward
                && name.eq_ignore_ascii_case(b"authorization")
        {
            continue;
        }
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        let value = h.value.get(buf);
        out.extend_from_slice(value);
        if Some(i) == last_xff {
            if !value.is_empty() {
                out.extend_from_slice(b", ");
            }
            write_ip(out, extra.client_addr);
        }
        out.extend_from_slice(b"\r\n");
    }
    if last_xff.is_none() {
        out.extend_from_slice(b"X-Forwarded-For: ");
        write_ip(out, extra.client_addr);
        out.extend_from_slice(b"\r\n");
    }
    if head.request_id.is_none() {
        write_header(out, b"X-Request-ID", extra.request_id);
    }
    if let Authorization::Set(value) = extra.authorization {
        write_header(out, b"Authorization", value);
    }
    if head.framing != Framing::None || extra.body_len > 0 {
        out.extend_from_slice(b"Content-Length: ");
        write_decimal(out, extra.body_len);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// Fields a `Connection` listing does not remove: the `Host` an HTTP/1.1 request must carry,
/// and the `X-Forwarded-For` and `X-Request-ID` the router appends to or keeps in place of its
/// own. RFC 9110 section 7.6.1 forbids a sender to list a field meant for every recipient;
/// honouring such a listing would let a client send a backend a request without a `Host`
/// (invalid), or without the client address the router vouches for or the id that ties the
/// request to the router's access log (found by the `http_request` fuzz target).
const KEPT: [&str; 3] = ["host", "x-forwarded-for", "x-request-id"];

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{parse_request_head, Limits};

    fn forward(req: &[u8], body_len: u64) -> String {
        forward_with(req, body_len, Authorization::Forward)
    }

    fn forward_with(req: &[u8], body_len: u64, authorization: Authorization<'_>) -> String {
        let head = parse_request_head(req, &Limits::default()).unwrap().unwrap();
        let info = ForwardInfo {
            client_addr: "10.0.0.9".parse().unwrap(),
            request_id: b"gen-1",
            default_host: b"b:80",
            body_len,
            authorization,
        };
        let mut out = Vec::new();
        write_upstream_head(&head, req, &mut out, &info);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn strips_hop_by_hop_and_rewrites_length() {
        let req = b"POST /v1/chat/completions?a=b HTTP/1.0\r\nHost: api\r\nConnection: keep-alive, X-Secret\r\n\
Keep-Alive: timeout=5\r\nX-Secret: s\r\nProxy-Connection: x\r\nTE: trailers\r\nTrailer: X\r\n\
Upgrade: h2c\r\nProxy-Authorization: p\r\nProxy-Authenticate: q\r\nContent-Length: 4\r\n\
Expect: 100-continue\r\nAuthorization: Bearer k\r\nx-forwarded-for: 1.2.3.4\r\n\r\n";
        assert_eq!(
            forward(req, 12),
            "POST /v1/chat/completions?a=b HTTP/1.1\r\nHost: api\r\nAuthorization: Bearer k\r\n\
x-forwarded-for: 1.2.3.4, 10.0.0.9\r\nX-Request-ID: gen-1\r\nContent-Length: 12\r\n\r\n"
        );
    }

    #[test]
    fn a_tenant_s_authorization_is_not_forwarded() {
        let req = b"POST /v1/x HTTP/1.1\r\nHost: h\r\nauthorization: Bearer wp_k\r\nX-A: 1\r\n\r\n";
        assert_eq!(
            forward_with(req, 2, Authorization::Strip),
            "POST /v1/x HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nX-Forwarded-For: 10.0.0.9\r\n\
X-Request-ID: gen-1\r\nContent-Length: 2\r\n\r\n"
        );
        assert!(
            forward_with(req, 2, Authorization::Forward).contains("authorization: Bearer wp_k\r\n")
        );
    }

    #[test]
    fn an_engine_key_replaces_whatever_the_client_sent() {
        let key = Authorization::Set(b"Bearer sk-engine");
        let req = b"POST /v1/x HTTP/1.1\r\nHost: h\r\nauthorization: Bearer wp_k\r\n\
Authorization: Basic YTpi\r\nX-A: 1\r\n\r\n";
        assert_eq!(
            forward_with(req, 2, key),
            "POST /v1/x HTTP/1.1\r\nHost: h\r\nX-A: 1\r\nX-Forwarded-For: 10.0.0.9\r\n\
X-Request-ID: gen-1\r\nAuthorization: Bearer sk-engine\r\nContent-Length: 2\r\n\r\n"
        );
        // A client that sent none gets it too; a Connection listing cannot remove it.
        let bare = b"GET /v1/models HTTP/1.1\r\nHost: h\r\nConnection: Authorization\r\n\r\n";
        let forwarded = forward_with(bare, 0, key);
        assert_eq!(forwarded.matches("Authorization").count(), 1, "{forwarded}");
        assert!(forwarded.contains("\r\nAuthorization: Bearer sk-engine\r\n"), "{forwarded}");
    }

    #[test]
    fn every_connection_line_names_hop_by_hop_fields_however_many() {
        // More `Connection` lines than `HopByHop` keeps: the names on the last still count.
        let req = b"GET / HTTP/1.1\r\nHost: h\r\nConnection: x-1\r\nConnection: x-2\r\n\
Connection: x-3\r\nConnection: x-4\r\nConnection: x-5, x-6\r\nx-1: a\r\nx-6: b\r\nx-7: c\r\n\r\n";
        assert_eq!(
            forward(req, 0),
            "GET / HTTP/1.1\r\nHost: h\r\nx-7: c\r\nX-Forwarded-For: 10.0.0.9\r\nX-Request-ID: gen-1\r\n\r\n"
        );
    }

    #[test]
    fn a_connection_listing_does_not_remove_host_or_what_the_router_adds_to() {
        let req = b"GET / HTTP/1.1\r\nHost: h\r\nConnection: Host, X-Forwarded-For, x-request-id, X-A\r\n\
X-Forwarded-For: 1.2.3.4\r\nX-Request-ID: mine\r\nX-A: gone\r\n\r\n";
        assert_eq!(
            forward(req, 0),
            "GET / HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 1.2.3.4, 10.0.0.9\r\n\
X-Request-ID: mine\r\n\r\n"
        );
    }

    #[test]
    fn host_stays_when_more_names_are_listed_than_the_set_keeps() {
        let req = b"GET / HTTP/1.1\r\nHost: h\r\nConnection: x-1, x-2, x-3, x-4, x-5, x-6, x-7, x-8, x-9, Host\r\n\
x-9: a\r\n\r\n";
        assert_eq!(
            forward(req, 0),
            "GET / HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: 10.0.0.9\r\nX-Request-ID: gen-1\r\n\r\n"
        );
    }

    #[test]
    fn chunked_request_gets_a_length_and_keeps_its_request_id() {
        let req = b"POST /v1/x HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\nX-Request-ID: mine\r\n\r\n";
        assert_eq!(
            forward(req, 7),
            "POST /v1/x HTTP/1.1\r\nHost: h\r\nX-Request-ID: mine\r\nX-Forwarded-For: 10.0.0.9\r\n\
Content-Length: 7\r\n\r\n"
        );
    }

    #[test]
    fn get_without_body_has_no_length_and_xff_goes_on_the_last_line() {
        let req = b"GET /v1/models HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: a\r\nX-Forwarded-For: b\r\n\r\n";
        assert_eq!(
            forward(req, 0),
            "GET /v1/models HTTP/1.1\r\nHost: h\r\nX-Forwarded-For: a\r\nX-Forwarded-For: b, 10.0.0.9\r\n\
X-Request-ID: gen-1\r\n\r\n"
        );
    }
}
