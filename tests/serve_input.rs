//! Bad input and the router's own routes, end to end on loopback (split from `serve.rs`, whose
//! conventions it keeps): bodies without a usable model, oversized and slow heads and bodies,
//! smuggling shapes, `/v1/models`, `/healthz`, `/readyz` and unknown paths.

mod support;

use std::time::Duration;

use support::backend::Backend;
use support::client::{self, chat_request, Conn};
use support::router::{Router, Setup};
use support::{eventually, now, since};

const M: &str = "m";

/// One model `m` on `backends`, every other key as [`Setup::new`].
fn setup(backends: &[&Backend]) -> Setup {
    let addresses: Vec<String> = backends.iter().map(|b| b.address()).collect();
    Setup::new().model(M, &addresses)
}

/// A router with small limits: 1 KiB heads, 1000-byte bodies, 200 ms to send either.
fn strict(backend: &Backend) -> Router {
    setup(&[backend])
        .server("max_header_bytes", "1024")
        .server("max_body_bytes", "1000")
        .server("header_timeout", "200ms")
        .server("body_timeout", "200ms")
        .start()
}

#[test]
fn bodies_without_a_usable_model_are_400_and_unknown_models_404() {
    let backend = Backend::start();
    let router = strict(&backend);
    let invalid: [&[u8]; 6] = [
        b"{not json",
        b"{\"messages\":[]}",
        b"{\"model\":5}",
        b"{\"x\":{\"model\":\"m\"}}",
        b"[\"m\"]",
        b"",
    ];
    for body in invalid {
        let response = client::exchange(router.addr, &client::post_json(body));
        let shown = String::from_utf8_lossy(body);
        assert_eq!(response.status, 400, "body {shown:?}: {}", response.text());
        response.assert_error(400, "invalid_request");
    }
    let response = client::exchange(router.addr, &client::post_json(b"{\"model\":\"nope\"}"));
    response.assert_error(404, "model_not_found");
    let long = "s".repeat(300);
    let response = client::exchange(router.addr, &chat_request(M, Some(&long), false));
    response.assert_error(400, "invalid_request");
    assert_eq!(backend.request_count(), 0);
}

#[test]
fn oversized_heads_and_bodies_are_refused() {
    let backend = Backend::start();
    let router = strict(&backend);
    let big = "a".repeat(2000);
    let response = client::exchange(
        router.addr,
        &client::request("GET", "/v1/models", &[("X-Big", &big)], b""),
    );
    response.assert_error(431, "headers_too_large");

    // A declared length over the limit: refused from the head alone.
    let mut conn = Conn::open(router.addr);
    let head =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
                Content-Length: 5000\r\n\r\n";
    conn.send(head.as_bytes());
    conn.response().assert_error(413, "body_too_large");

    // A chunked body growing past the limit.
    let mut conn = Conn::open(router.addr);
    let head =
        "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
                Transfer-Encoding: chunked\r\n\r\n";
    conn.send(head.as_bytes());
    let piece = format!("{{\"model\":\"m\",\"pad\":\"{}", "x".repeat(400));
    for _ in 0..3 {
        conn.send_lossy(&support::wire::chunk(piece.as_bytes()));
    }
    conn.response().assert_error(413, "body_too_large");
    assert_eq!(backend.request_count(), 0);
}

#[test]
fn slow_heads_and_bodies_get_408() {
    let backend = Backend::start();
    let router = strict(&backend);
    let mut slow_head = Conn::open(router.addr);
    let start = now();
    slow_head.send(b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\n");
    slow_head.response().assert_error(408, "request_timeout");
    let waited = since(start);
    assert!(waited >= Duration::from_millis(150) && waited < Duration::from_secs(3), "{waited:?}");

    let mut slow_body = Conn::open(router.addr);
    let start = now();
    slow_body.send(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: 100\r\n\r\n{\"model\":",
    );
    slow_body.response().assert_error(408, "request_timeout");
    let waited = since(start);
    assert!(waited >= Duration::from_millis(150) && waited < Duration::from_secs(3), "{waited:?}");
    assert_eq!(backend.request_count(), 0);
}

#[test]
fn smuggling_shapes_are_400_and_close_the_connection() {
    let backend = Backend::start();
    let router = strict(&backend);
    let body = client::chat_body(M, false).into_bytes();
    let shapes = [
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\
             Transfer-Encoding: chunked\r\n\r\n",
            body.len()
        ),
        format!(
            "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\
             Content-Length: {}\r\n\r\n",
            body.len(),
            body.len() + 1
        ),
        "POST /v1/chat/completions HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n\
         zz\r\n"
            .to_owned(),
    ];
    for shape in shapes {
        let mut conn = Conn::open(router.addr);
        conn.send(shape.as_bytes());
        conn.send_lossy(&body);
        let response = conn.response();
        assert_eq!(response.status, 400, "{shape:?}: {}", response.text());
        response.assert_error(400, "invalid_request");
        conn.assert_closed();
    }
    assert_eq!(backend.request_count(), 0);
}

#[test]
fn models_health_readiness_and_unknown_paths() {
    let backend = Backend::start();
    let router = setup(&[&backend]).start();
    let models = client::get(router.addr, "/v1/models");
    assert_eq!(models.status, 200);
    let json = models.json();
    assert_eq!(json["object"], "list", "{json}");
    let data = json["data"].as_array().expect("data array");
    assert_eq!(data.len(), 1, "{json}");
    assert_eq!((data[0]["id"].as_str(), data[0]["object"].as_str()), (Some(M), Some("model")));

    let healthz = client::get(router.addr, "/healthz");
    assert_eq!(healthz.status, 200);
    let _ = healthz.json();
    let readyz = client::get(router.addr, "/readyz");
    assert_eq!(readyz.status, 200, "{}", readyz.text());
    let _ = readyz.json();

    for request in [
        client::get_request("/nope"),
        client::get_request("/v1/chat/completions"),
        client::request(
            "POST",
            "/chat/completions",
            &[],
            &client::chat_body(M, false).into_bytes(),
        ),
    ] {
        let response = client::exchange(router.addr, &request);
        response.assert_error(404, "model_not_found");
    }
    assert_eq!(backend.request_count(), 0);
}

#[test]
fn readyz_follows_the_health_of_the_only_backend() {
    let backend = Backend::start();
    backend.set_healthy(false);
    let router = setup(&[&backend]).start();
    eventually("/readyz to say 503", || client::get(router.addr, "/readyz").status == 503);
    backend.set_healthy(true);
    eventually("/readyz to say 200", || client::get(router.addr, "/readyz").status == 200);
}
