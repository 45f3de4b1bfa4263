//! The main listener's front door (issue \[11\]): which routes need an API key, and the tenant
//! a request's `Authorization` header names. The digests and their constant-time lookup are
//! [`credential`](crate::credential)'s; the 401 is the client room's.
//!
//! With at least one live `[[tenant]]`, every route needs a key except `GET /healthz` and
//! `GET /readyz` (any method, as their paths): load balancers and orchestrators probe them
//! without credentials, and they say only whether the process is up and whether every model
//! has a healthy backend, nothing a key protects (no model name, no backend address). The key
//! is checked as soon as the head is parsed, before the body is read, so a client without one
//! cannot make the router buffer a body. Only `Authorization: Bearer` counts: a key sent in
//! `api-key`, `x-api-key`, the query string or as `Basic` is refused, and the message says
//! where it belongs.

use crate::credential::{authorize, AuthError, KeyTable};
use crate::protocol::RequestHead;

/// Whether a request for `path` needs an API key when tenants are configured.
pub(super) fn needs_key(path: &[u8]) -> bool {
    !matches!(path, b"/healthz" | b"/readyz")
}

/// The tenant `head`'s `Authorization` header names (its lines' values, in `rbuf`).
pub(super) fn authenticate(
    head: &RequestHead,
    rbuf: &[u8],
    keys: &KeyTable,
) -> Result<u16, AuthError> {
    let values = (head.headers.as_slice().iter())
        .filter(|h| h.name.get(rbuf).eq_ignore_ascii_case(b"authorization"))
        .map(|h| h.value.get(rbuf));
    authorize(values, keys)
}

/// The 401's message: [`AuthError::message`], or for a request with no `Authorization` but
/// an `api-key` or `x-api-key` header (Azure's and others' spelling), where the key goes.
pub(super) fn message(error: AuthError, head: &RequestHead, rbuf: &[u8]) -> &'static str {
    let wrong_header = |name: &[u8]| {
        name.eq_ignore_ascii_case(b"api-key") || name.eq_ignore_ascii_case(b"x-api-key")
    };
    let misplaced = error == AuthError::Missing
        && head.headers.as_slice().iter().any(|h| wrong_header(h.name.get(rbuf)));
    match misplaced {
        true => "API keys go in Authorization: Bearer <key>, not in an api-key or x-api-key header",
        false => error.message(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::credential::digest;
    use crate::protocol::{parse_request_head, Limits};

    fn check(raw: &[u8]) -> Result<u16, AuthError> {
        let keys = KeyTable::new([(digest(b"wp_good"), 3)]);
        let head = parse_request_head(raw, &Limits::default()).unwrap().unwrap();
        authenticate(&head, raw, &keys)
    }

    #[test]
    fn the_bearer_header_names_the_tenant_and_nothing_else_does() {
        assert_eq!(
            check(b"GET / HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer wp_good\r\n\r\n"),
            Ok(3)
        );
        assert_eq!(
            check(b"GET / HTTP/1.1\r\nHost: h\r\nauthorization:bearer wp_good\r\n\r\n"),
            Ok(3)
        );
        assert_eq!(
            check(b"GET / HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer wp_bad\r\n\r\n"),
            Err(AuthError::Unknown)
        );
        assert_eq!(
            check(b"GET /?api_key=wp_good HTTP/1.1\r\nHost: h\r\napi-key: wp_good\r\n\r\n"),
            Err(AuthError::Missing)
        );
        let twice = b"GET / HTTP/1.1\r\nHost: h\r\nAuthorization: Bearer wp_good\r\n\
                      Authorization: Bearer wp_good\r\n\r\n";
        assert_eq!(check(twice), Err(AuthError::Repeated));
    }

    #[test]
    fn a_key_in_another_header_is_told_where_it_goes() {
        let raw = b"GET / HTTP/1.1\r\nHost: h\r\nX-API-Key: wp_good\r\n\r\n";
        let head = parse_request_head(raw, &Limits::default()).unwrap().unwrap();
        assert!(message(AuthError::Missing, &head, raw).contains("not in an api-key"));
        assert_eq!(message(AuthError::Unknown, &head, raw), "invalid API key");
        assert!(needs_key(b"/v1/models") && needs_key(b"/") && needs_key(b"/healthz/x"));
        assert!(!needs_key(b"/healthz") && !needs_key(b"/readyz"));
    }
}
