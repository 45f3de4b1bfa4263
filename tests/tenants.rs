//! Issue [11], tenants end to end on loopback: a tenant's key is served and its tenant shows in
//! the access log and the metrics; every hostile key of `docs/security.md`'s "API keys" rows
//! is a 401 `invalid_api_key` with `WWW-Authenticate: Bearer` that reaches no backend; live
//! reloads add a key, remove a tenant and set the admin token; the admin token guards every
//! admin route, as `Bearer` or as `Basic`'s password; two saturating tenants of weights 3:1
//! split a backend's admissions about 3:1.

mod support;

use std::path::PathBuf;

use serde_json::Value;
use support::backend::Backend;
use support::client::{self, chat_body, Conn, Response};
use support::ledger::Ledger;
use support::router::{Router, Setup};
use support::{eventually, log_lines, PATIENCE};

const M: &str = "m";
const KEY_A: &str = "wp_tenant-a-key-0123456789";
const KEY_A2: &str = "wp_tenant-a-second-key";
const KEY_B: &str = "wp_tenant-b-key-9876543210";
const ADMIN: &str = "wp_admin-token-abcdef";

/// A fresh path under the test target directory.
fn temp_path(name: &str) -> PathBuf {
    support::temp_path("tenants-tests", name)
}

/// Tenants `a` (two keys) and `b` in front of `backend`.
fn two_tenants(backend: &Backend) -> Setup {
    Setup::new().model(M, &[backend.address()]).tenant("a", &[KEY_A, KEY_A2]).tenant("b", &[KEY_B])
}

/// A chat completion with these extra header lines.
fn chat(headers: &[(&str, &str)], stream: bool) -> Vec<u8> {
    let mut all = vec![("Content-Type", "application/json")];
    all.extend_from_slice(headers);
    client::request("POST", "/v1/chat/completions", &all, chat_body(M, stream).as_bytes())
}

fn bearer(token: &str) -> String {
    format!("Bearer {token}")
}

/// `Basic` credentials for `user:password`.
fn basic(user: &str, password: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes = format!("{user}:{password}").into_bytes();
    let mut out = String::from("Basic ");
    for group in bytes.chunks(3) {
        let n = group.iter().enumerate().fold(0u32, |n, (i, &b)| n | u32::from(b) << (16 - 8 * i));
        for i in 0..4 {
            match i <= group.len() {
                true => out.push(char::from(ALPHABET[(n >> (18 - 6 * i) & 63) as usize])),
                false => out.push('='),
            }
        }
    }
    out
}

/// Asserts SPEC 10's 401: status, the challenge, and exactly
/// `{"error":{"message":"...","type":"invalid_request_error","code":"invalid_api_key"}}`.
fn assert_unauthorized(response: &Response, what: &str) {
    assert_eq!(response.status, 401, "{what}: {}", response.text());
    assert_eq!(response.header("www-authenticate"), Some("Bearer"), "{what}");
    let text = response.text();
    assert!(text.starts_with("{\"error\":{\"message\":\""), "{what}: {text}");
    assert!(
        text.ends_with("\",\"type\":\"invalid_request_error\",\"code\":\"invalid_api_key\"}}"),
        "{what}: {text}"
    );
    let json = response.json();
    let keys: Vec<&String> = json["error"].as_object().unwrap().keys().collect();
    assert_eq!(keys.len(), 3, "{what}: {json}");
}

/// A valid key is served; its tenant is in the access log and in the `tenant` label of the
/// three families; its `Authorization` never reaches the engine; `/healthz` and `/readyz`
/// need no key, `/v1/models` does.
#[test]
fn a_tenant_s_key_is_served_logged_and_counted() {
    let backend = Backend::start();
    let log = temp_path("access.jsonl");
    let router = two_tenants(&backend).server("access_log", log.to_str().unwrap()).start();
    let a = bearer(KEY_A);
    let a2 = bearer(KEY_A2);
    let b = bearer(KEY_B);
    let mut conn = Conn::open(router.addr);
    for (auth, stream) in [(&a, false), (&a2, true), (&b, false)] {
        let response = conn.exchange(&chat(&[("Authorization", auth)], stream));
        assert_eq!(response.status, 200, "{}", response.text());
    }
    for recorded in backend.requests() {
        assert_eq!(recorded.header("authorization"), None, "a tenant's key stays in the router");
    }
    assert_eq!(client::get(router.addr, "/healthz").status, 200, "probes need no key");
    assert_ne!(client::get(router.addr, "/readyz").status, 401, "probes need no key");
    assert_unauthorized(&client::get(router.addr, "/v1/models"), "/v1/models without a key");
    let models =
        conn.exchange(&client::request("GET", "/v1/models", &[("Authorization", &b)], b""));
    assert_eq!(models.status, 200);

    let lines = log_lines(&log, 7);
    let chats: Vec<&Value> = lines
        .iter()
        .filter(|l| l["path"] == "/v1/chat/completions")
        .map(|l| &l["tenant"])
        .collect();
    assert_eq!(chats, [&Value::from("a"), &Value::from("a"), &Value::from("b")]);
    let by_path = |path: &str| -> Vec<Value> {
        lines.iter().filter(|l| l["path"] == path).map(|l| l["tenant"].clone()).collect()
    };
    assert_eq!(by_path("/healthz"), [Value::Null]);
    assert_eq!(by_path("/v1/models"), [Value::Null, Value::from("b")], "refused, then b's");

    let a_ok = [("model", M), ("status", "200"), ("tenant", "a")];
    client::wait_metric(router.admin, "warmpath_requests_total", &a_ok, |n| n == 2.0);
    let text = client::metrics(router.admin);
    let metric = |name: &str, labels: &[(&str, &str)]| client::metric(&text, name, labels);
    let b_ok = [("model", M), ("status", "200"), ("tenant", "b")];
    assert_eq!(metric("warmpath_requests_total", &b_ok), Some(1.0));
    assert_eq!(metric("warmpath_admitted_total", &[("model", M), ("tenant", "a")]), Some(2.0));
    assert_eq!(metric("warmpath_admitted_total", &[("model", M), ("tenant", "b")]), Some(1.0));
    assert_eq!(metric("warmpath_ttft_seconds_count", &[("model", M), ("tenant", "a")]), Some(2.0));
    assert_eq!(metric("warmpath_ttft_seconds_count", &[("model", M), ("tenant", "b")]), Some(1.0));
    let unlabelled =
        |name: &str| text.lines().filter(|l| l.starts_with(name) && !l.contains("tenant=")).count();
    assert!(unlabelled("warmpath_admitted_total{") == 4, "the tenant-less lanes stay: {text}");
    assert_eq!(
        metric("warmpath_router_responses_total", &[("status", "401")]),
        Some(1.0),
        "a refused key counts before any model is known"
    );
}

/// Without any `[[tenant]]` the router is open as before: no key needed, `Authorization` goes
/// to the engine as sent, and no series has a `tenant` label.
#[test]
fn without_tenants_nothing_changes() {
    let backend = Backend::start();
    let router = Setup::new().model(M, &[backend.address()]).start();
    let response =
        client::exchange(router.addr, &chat(&[("Authorization", "Bearer engine-key")], false));
    assert_eq!(response.status, 200);
    let response = client::exchange(router.addr, &chat(&[], false));
    assert_eq!(response.status, 200);
    let recorded = backend.requests();
    assert_eq!(recorded[0].header("authorization"), Some("Bearer engine-key"));
    let ok = [("model", M), ("status", "200")];
    client::wait_metric(router.admin, "warmpath_requests_total", &ok, |n| n == 2.0);
    let text = client::metrics(router.admin);
    assert!(!text.contains("tenant="), "no tenant label anywhere:\n{text}");
    assert!(text.contains("warmpath_requests_total{model=\"m\",status=\"200\"} 2\n"));
    let admitted = client::metric(&text, "warmpath_admitted_total", &[("model", M)]);
    assert_eq!(admitted, Some(2.0), "from the scheduler's count, as before");
}

/// A request's extra header lines, name and value.
type Headers = Vec<(&'static str, String)>;

/// `docs/security.md`, "API keys": every row is a 401 `invalid_api_key` with the challenge,
/// nothing reaches the backend; a request with a body closes after it (its body was not read),
/// one without keeps the connection. The scheme is case-insensitive.
#[test]
fn hostile_keys_are_401_and_reach_no_backend() {
    let backend = Backend::start();
    let router = two_tenants(&backend).server("max_header_bytes", "2048").start();
    let mut ledger = Ledger::new();
    let basic_key = basic("user", KEY_A);
    let two = [("Authorization", bearer(KEY_A)), ("Authorization", bearer(KEY_A))];
    let rows: Vec<(&str, Headers, &str)> = vec![
        ("no key", vec![], "no API key"),
        ("an unknown key", vec![("Authorization", bearer("wp_unknown"))], "invalid API key"),
        (
            "a key of another case",
            vec![("Authorization", bearer(&KEY_A.to_uppercase()))],
            "invalid API key",
        ),
        ("a key in api-key", vec![("api-key", KEY_A.to_owned())], "not in an api-key"),
        ("a key in X-API-Key", vec![("X-API-Key", KEY_A.to_owned())], "not in an api-key"),
        ("Basic with the key", vec![("Authorization", basic_key)], "no other scheme"),
        ("the key without a scheme", vec![("Authorization", KEY_A.to_owned())], "malformed"),
        ("Bearer and nothing", vec![("Authorization", "Bearer ".to_owned())], "malformed"),
        ("two tokens", vec![("Authorization", format!("Bearer {KEY_A} {KEY_B}"))], "malformed"),
        ("a quote in the token", vec![("Authorization", "Bearer wp\"x".to_owned())], "malformed"),
        ("two Authorization headers", two.to_vec(), "more than one"),
    ];
    for (what, headers, message) in &rows {
        let headers: Vec<(&str, &str)> = headers.iter().map(|(n, v)| (*n, v.as_str())).collect();
        let mut conn = Conn::open(router.addr);
        let response = conn.exchange(&chat(&headers, false));
        ledger.exchange(response.status);
        assert_unauthorized(&response, what);
        let text = response.json()["error"]["message"].as_str().unwrap().to_owned();
        assert!(text.contains(message), "{what}: {text}");
        assert!(conn.closed_within(PATIENCE), "{what}: a refused body is not read: close");
    }
    // In the query string, and a GET without a body: 401, and the connection stays usable.
    let mut conn = Conn::open(router.addr);
    let query = format!("/v1/models?api_key={KEY_A}");
    let response = conn.exchange(&client::request("GET", &query, &[], b""));
    ledger.exchange(response.status);
    assert_unauthorized(&response, "a key in the query string");
    let auth = format!("bEaReR {KEY_B}");
    let response = conn.exchange(&chat(&[("Authorization", &auth)], false));
    ledger.exchange(response.status);
    assert_eq!(response.status, 200, "the scheme is case-insensitive: {}", response.text());
    // An oversized Authorization header: 431, as any oversized head.
    let huge = format!("Bearer {}", "a".repeat(4096));
    let mut conn = Conn::open(router.addr);
    conn.send_lossy(&chat(&[("Authorization", &huge)], false));
    let response = conn.response();
    ledger.exchange(response.status);
    response.assert_error(431, "headers_too_large");
    assert_eq!(backend.request_count(), 1, "only the valid key reached the backend");
    ledger.settle(router.admin);
}

/// `POST /admin/reload` with the admin token when there is one.
fn reload(router: &Router, token: Option<&str>) -> Response {
    let auth = token.map(bearer);
    let headers: Vec<(&str, &str)> = auth.iter().map(|a| ("Authorization", a.as_str())).collect();
    client::exchange(router.admin, &client::request("POST", "/admin/reload", &headers, b""))
}

/// Live reloads: a key added works at once; a tenant removed is refused at once while its
/// request already admitted finishes; the admin token set by a reload guards the next admin
/// request; removing every tenant opens the main listener again.
#[test]
fn reloads_add_keys_remove_tenants_and_set_the_admin_token() {
    let backend = Backend::start();
    let path = temp_path("reload.toml");
    let base = || Setup::new().model(M, &[backend.address()]);
    let router = base().tenant("a", &[KEY_A]).start_from_file(&path);
    let a = bearer(KEY_A);
    let b = bearer(KEY_B);
    let ask = |auth: &str| client::exchange(router.addr, &chat(&[("Authorization", auth)], false));
    assert_eq!(ask(&a).status, 200);
    assert_unauthorized(&ask(&b), "b before it is configured");

    std::fs::write(&path, base().tenant("a", &[KEY_A]).tenant("b", &[KEY_B]).toml()).unwrap();
    assert_eq!(reload(&router, None).status, 200);
    assert_eq!(ask(&b).status, 200, "a key added by a reload works at once");

    // Tenant a has a request in flight when it is removed: that one finishes; the next is 401.
    backend.hold();
    let mut held = Conn::open(router.addr);
    held.send(&chat(&[("Authorization", &a)], false));
    backend.wait_holding(1);
    std::fs::write(&path, base().tenant("b", &[KEY_B]).toml()).unwrap();
    assert_eq!(reload(&router, None).status, 200);
    assert_unauthorized(&ask(&a), "a removed tenant's key");
    backend.release_all();
    assert_eq!(held.response().status, 200, "its admitted request finishes");
    backend.set_default(support::backend::Reply::Complete);
    let a_ok = [("model", M), ("status", "200"), ("tenant", "a")];
    client::wait_metric(router.admin, "warmpath_requests_total", &a_ok, |n| n == 2.0);

    // The admin token, set by a reload, guards the next admin request (this reload's answer
    // still came before it).
    let with_token = base().tenant("b", &[KEY_B]).admin_token(ADMIN);
    std::fs::write(&path, with_token.toml()).unwrap();
    assert_eq!(reload(&router, None).status, 200);
    assert_eq!(client::get(router.admin, "/metrics").status, 401);
    assert_eq!(reload(&router, None).status, 401, "a reload needs the token now");
    let metrics = admin_get(&router, "/metrics", &bearer(ADMIN));
    assert_eq!(metrics.status, 200);
    let kept = client::metric(&metrics.text(), "warmpath_requests_total", &a_ok);
    assert_eq!(kept, Some(2.0), "a removed tenant's series keep their values");

    // No tenant left: open again, as without tenants.
    std::fs::write(&path, base().admin_token(ADMIN).toml()).unwrap();
    assert_eq!(reload(&router, Some(ADMIN)).status, 200);
    assert_eq!(client::exchange(router.addr, &chat(&[], false)).status, 200);
    let response = ask(&a);
    assert_eq!(response.status, 200, "with no tenant a key is not checked");
    eventually("the last request reached the backend with its Authorization", || {
        backend.requests().last().and_then(|r| r.header("authorization").map(str::to_owned))
            == Some(a.clone())
    });
}

fn admin_get(router: &Router, path: &str, authorization: &str) -> Response {
    let headers = [("Authorization", authorization)];
    client::exchange(router.admin, &client::request("GET", path, &headers, b""))
}

/// The admin token guards every admin route, unknown ones included; `Bearer` and `Basic` with
/// the token as the password (any user) pass; the 401 offers both schemes; `/debug/config`
/// shows no digest.
#[test]
fn the_admin_token_guards_every_admin_route() {
    let backend = Backend::start();
    let router = two_tenants(&backend).admin_token(ADMIN).start();
    let routes =
        ["/metrics", "/debug/queue", "/debug/backends", "/debug/config", "/status", "/nope"];
    let refused = [
        String::new(),
        bearer("wp_wrong"),
        bearer(KEY_A),
        basic("admin", "wp_wrong"),
        basic(ADMIN, ""),
        format!("Token {ADMIN}"),
    ];
    for path in routes {
        for authorization in &refused {
            let response = match authorization.is_empty() {
                true => client::get(router.admin, path),
                false => admin_get(&router, path, authorization),
            };
            assert_eq!(response.status, 401, "{path} with {authorization:?}");
            let challenges = support::wire::header_all(&response.headers, "www-authenticate");
            assert_eq!(challenges, ["Bearer", "Basic realm=\"warmpath admin\""], "{path}");
        }
        let expected = if path == "/nope" { 404 } else { 200 };
        for authorization in [bearer(ADMIN), basic("anyone", ADMIN), basic("", ADMIN)] {
            let response = admin_get(&router, path, &authorization);
            assert_eq!(response.status, expected, "{path} with {authorization:?}");
        }
    }
    assert_eq!(reload(&router, Some("wp_wrong")).status, 401);
    assert_eq!(reload(&router, Some(ADMIN)).status, 409, "allowed (no file to reload: refused)");
    let config = admin_get(&router, "/debug/config", &bearer(ADMIN)).text();
    assert!(!config.contains(&support::router::digest_hex(ADMIN)), "{config}");
    assert!(!config.contains(&support::router::digest_hex(KEY_A)), "{config}");
    assert!(config.contains("\"weight\": 1"), "non-secret tenant keys stay: {config}");
    let main = client::exchange(router.addr, &chat(&[("Authorization", &bearer(ADMIN))], false));
    assert_unauthorized(&main, "the admin token is no API key");
}

/// Issue [11]'s fair share through the real router: tenants `a` (weight 3) and `b` (weight 1)
/// each queue 40 equal requests behind one slot; as the engine answers them one by one, the
/// next 40 admissions go about 3:1 (exactly 30:10 by the rule; a generous band here, since
/// the first arrivals may be admitted before both tenants are queued).
#[test]
fn two_saturating_tenants_split_admissions_by_weight() {
    let backend = Backend::start();
    backend.hold();
    let setup = two_tenants(&backend).queue("inflight_per_backend", "1");
    let toml = setup.toml().replace("name = \"a\"\n", "name = \"a\"\nweight = 3\n");
    assert!(toml.contains("weight = 3"), "{toml}");
    let config = warmpath::config::Config::from_toml_str(&toml).expect("valid");
    let router = Router::start(config);
    let (a, b) = (bearer(KEY_A), bearer(KEY_B));
    let mut conns = Vec::new();
    for _ in 0..40 {
        for (auth, mark) in [(&a, "a"), (&b, "b")] {
            let mut conn = Conn::open(router.addr);
            conn.send(&chat(&[("Authorization", auth), ("X-Tenant-Mark", mark)], false));
            conns.push(conn);
        }
    }
    backend.wait_holding(1);
    let depth = [("model", M), ("lane", "normal")];
    client::wait_metric(router.admin, "warmpath_queue_depth", &depth, |n| n == 79.0);
    for served in 1..=40 {
        backend.release(1);
        backend.wait_for_requests(served + 1, PATIENCE);
    }
    let requests = backend.requests();
    let marks: Vec<&str> =
        requests[1..41].iter().map(|r| r.header("x-tenant-mark").unwrap_or("?")).collect();
    let a_count = marks.iter().filter(|&&m| m == "a").count();
    assert!((26..=34).contains(&a_count), "a got {a_count} of 40 admissions: {marks:?}");
    assert_eq!(marks.iter().filter(|&&m| m == "b").count(), 40 - a_count, "{marks:?}");
    backend.release_all();
    for mut conn in conns {
        assert_eq!(conn.read_response().expect("a response").status, 200);
    }
}
