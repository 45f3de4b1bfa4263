//! Engines that require an API key (vLLM's and SGLang's `--api-key`): `backend_api_key_file`
//! end to end. The key goes to the engine on every request in place of the client's
//! `Authorization`, tenants or not, and with the health checks and scrapes; a reload takes a
//! rotated key; a reload whose key file went bad is refused and the running key kept.

mod support;

use std::path::PathBuf;

use serde_json::Value;
use support::backend::Backend;
use support::client::{self, chat_body, request};
use support::router::{Router, Setup};

const M: &str = "m";

fn temp_path(name: &str) -> PathBuf {
    let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("engine-keys");
    std::fs::create_dir_all(&dir).unwrap();
    dir.join(name)
}

/// A model on `backend` whose engine takes the key in `key_file`, scraped as vLLM.
fn setup(backend: &Backend, key_file: &std::path::Path) -> Setup {
    Setup::new()
        .model(M, &[backend.address()])
        .model_key("engine", "vllm")
        .model_key("backend_api_key_file", key_file.to_str().unwrap())
}

/// A chat request carrying `authorization`, if any.
fn chat_with(authorization: Option<&str>) -> Vec<u8> {
    let mut headers = vec![("Content-Type", "application/json")];
    if let Some(value) = authorization {
        headers.push(("Authorization", value));
    }
    request("POST", "/v1/chat/completions", &headers, chat_body(M, false).as_bytes())
}

/// Every `Authorization` line of the backend's last inference request.
fn last_authorizations(backend: &Backend) -> Vec<String> {
    let requests = backend.requests();
    let last = requests.last().expect("a request reached the backend");
    let lines = last.headers.iter().filter(|(n, _)| n.eq_ignore_ascii_case("authorization"));
    lines.map(|(_, v)| v.clone()).collect()
}

fn reload(router: &Router) -> (u16, Value) {
    let response =
        client::exchange(router.admin, &client::request("POST", "/admin/reload", &[], b""));
    (response.status, response.json())
}

#[test]
fn the_engine_key_replaces_the_client_s_and_a_reload_rotates_it() {
    let backend = Backend::start();
    let (key_file, config_file) = (temp_path("rotate.key"), temp_path("rotate.toml"));
    std::fs::write(&key_file, "sk-engine-1\n").unwrap();
    let router = setup(&backend, &key_file).start_from_file(&config_file);

    for client_header in [Some("Bearer the-client-s-own"), None] {
        let response = client::exchange(router.addr, &chat_with(client_header));
        assert_eq!(response.status, 200, "{}", response.text());
        assert_eq!(last_authorizations(&backend), ["Bearer sk-engine-1"], "{client_header:?}");
    }
    // The health checks and scrapes carry it too (an engine that guards them as well).
    support::eventually("a check and a scrape", || backend.scrapes() >= 1);
    let probes = backend.probe_authorizations();
    assert!(!probes.is_empty());
    assert!(probes.iter().all(|p| p.as_deref() == Some("Bearer sk-engine-1")), "{probes:?}");

    // Rotated: the file changes, a reload reads it again.
    std::fs::write(&key_file, "sk-engine-2").unwrap();
    assert_eq!(reload(&router), (200, serde_json::json!({"generation": 2})));
    let response = client::exchange(router.addr, &chat_with(Some("Bearer x")));
    assert_eq!(response.status, 200);
    assert_eq!(last_authorizations(&backend), ["Bearer sk-engine-2"]);
    let checks = backend.probe_authorizations().len();
    support::eventually("a check after the rotation", || {
        let probes = backend.probe_authorizations();
        probes.len() > checks + 1 && probes.last().unwrap().as_deref() == Some("Bearer sk-engine-2")
    });

    // A key file gone bad refuses the reload, naming the key and path but not the content;
    // the running key stays.
    std::fs::write(&key_file, "sk-engine-3 with spaces\n").unwrap();
    let (status, body) = reload(&router);
    assert_eq!(status, 409, "{body}");
    let error = body["error"].as_str().unwrap();
    assert!(error.contains("backend_api_key_file"), "{error}");
    assert!(error.contains(key_file.to_str().unwrap()), "{error}");
    assert!(!error.contains("sk-engine"), "{error}");
    let response = client::exchange(router.addr, &chat_with(None));
    assert_eq!(response.status, 200);
    assert_eq!(last_authorizations(&backend), ["Bearer sk-engine-2"]);
    // Nothing on the admin listener shows a key: the configuration names the file.
    let config = client::get(router.admin, "/debug/config").text();
    assert!(config.contains("backend_api_key_file"), "{config}");
    assert!(!config.contains("sk-engine"), "{config}");
    client::wait_idle(router.admin, M);
}

#[test]
fn with_tenants_the_engine_gets_its_key_and_never_the_tenant_s() {
    let backend = Backend::start();
    let key_file = temp_path("tenants.key");
    std::fs::write(&key_file, "sk-engine\n").unwrap();
    let router = setup(&backend, &key_file).tenant("team", &["wp_team_key"]).start();
    let refused = client::exchange(router.addr, &chat_with(Some("Bearer wrong")));
    assert_eq!(refused.status, 401, "the engine key does not open the router");
    let response = client::exchange(router.addr, &chat_with(Some("Bearer wp_team_key")));
    assert_eq!(response.status, 200, "{}", response.text());
    assert_eq!(last_authorizations(&backend), ["Bearer sk-engine"]);
    assert_eq!(backend.request_count(), 1);
    client::wait_idle(router.admin, M);
}

#[test]
fn an_engine_that_refuses_the_key_is_counted_per_backend_and_a_client_s_401_is_not() {
    let refusal = r#"{"error": "Unauthorized"}"#.to_string();
    let (keyed, open) = (Backend::start(), Backend::start());
    keyed.set_default(support::backend::Reply::Status(401, refusal.clone()));
    open.set_default(support::backend::Reply::Status(401, refusal));
    let key_file = temp_path("refused.key");
    std::fs::write(&key_file, "sk-stale\n").unwrap();
    // Model m sends the key; model o relays the client's own Authorization.
    let router = setup(&keyed, &key_file).model("o", &[open.address()]).start();
    for _ in 0..3 {
        let response = client::exchange(router.addr, &chat_with(Some("Bearer c")));
        assert_eq!(response.status, 401, "relayed as the engine sent it");
    }
    let body = chat_body("o", false);
    let to_open =
        request("POST", "/v1/chat/completions", &[("Authorization", "Bearer c")], body.as_bytes());
    assert_eq!(client::exchange(router.addr, &to_open).status, 401);
    let text = client::metrics(router.admin);
    let refused = |model: &str, backend: &Backend| {
        let labels = [("model", model), ("backend", &backend.address())];
        client::metric(&text, "warmpath_backend_key_refused_total", &labels)
    };
    assert_eq!(refused(M, &keyed), Some(3.0), "{text}");
    assert_eq!(refused("o", &open), Some(0.0), "the client's key, not the router's");
    client::wait_idle(router.admin, M);
}

#[test]
fn a_missing_key_file_stops_the_start_with_its_path() {
    let backend = Backend::start();
    let key_file = temp_path("missing.key");
    let _ = std::fs::remove_file(&key_file);
    let config = setup(&backend, &key_file).config();
    let error = warmpath::server::start_with_source(config, None, support::clock().clone())
        .expect_err("no key, no start");
    let message = error.to_string();
    assert!(message.contains("backend_api_key_file"), "{message}");
    assert!(message.contains(key_file.to_str().unwrap()), "{message}");
}
