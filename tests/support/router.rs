//! A configuration builder for loopback tests and a handle on a running router.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::SocketAddr;
use std::sync::mpsc;
use std::time::Duration;

use warmpath::clock::Clock;
use warmpath::config::Config;
use warmpath::server::{self, Running};

use super::PATIENCE;

/// One `[[model]]` of a [`Setup`].
#[derive(Debug, Clone)]
struct Model {
    name: String,
    backends: Vec<String>,
    keys: BTreeMap<String, String>,
}

/// A TOML configuration for loopback tests: both listeners on `127.0.0.1:0`, one unpinned
/// shard, a 2 s drain, metrics scraped every 50 ms, 500 ms connect timeout. Values are given
/// as text and quoted unless they are numbers, booleans or arrays.
#[derive(Debug, Clone)]
pub struct Setup {
    server: BTreeMap<String, String>,
    queue: BTreeMap<String, String>,
    upstream: BTreeMap<String, String>,
    models: Vec<Model>,
    /// `[[tenant]]` tables: a name, the digests of its keys in hex, and its other keys.
    tenants: Vec<(String, Vec<String>, BTreeMap<String, String>)>,
    /// `[rate_limit]`.
    rate_limit: BTreeMap<String, String>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup::new()
    }
}

impl Setup {
    /// The defaults above and no model.
    pub fn new() -> Setup {
        let mut setup = Setup {
            server: BTreeMap::new(),
            queue: BTreeMap::new(),
            upstream: BTreeMap::new(),
            models: Vec::new(),
            tenants: Vec::new(),
            rate_limit: BTreeMap::new(),
        };
        setup = setup
            .server("listen", "127.0.0.1:0")
            .server("admin_listen", "127.0.0.1:0")
            .server("shards", "1")
            .server("pin_cores", "false")
            .server("drain_timeout", "2s")
            .upstream("metrics_interval", "50ms")
            .upstream("connect_timeout", "500ms")
            .upstream("health_path", "/health");
        setup
    }

    /// A `[server]` key.
    pub fn server(mut self, key: &str, value: &str) -> Setup {
        self.server.insert(key.to_owned(), toml_value(value));
        self
    }

    /// A `[queue]` key (every model's default).
    pub fn queue(mut self, key: &str, value: &str) -> Setup {
        self.queue.insert(key.to_owned(), toml_value(value));
        self
    }

    /// An `[upstream]` key.
    pub fn upstream(mut self, key: &str, value: &str) -> Setup {
        self.upstream.insert(key.to_owned(), toml_value(value));
        self
    }

    /// A `[[model]]` with these backends and `engine = "openai"` (no metrics scraping).
    pub fn model(mut self, name: &str, backends: &[String]) -> Setup {
        let mut keys = BTreeMap::new();
        keys.insert("engine".to_owned(), toml_value("openai"));
        self.models.push(Model { name: name.to_owned(), backends: backends.to_vec(), keys });
        self
    }

    /// A `[[tenant]]` whose API keys are `keys` (the tokens; the table lists their digests).
    pub fn tenant(mut self, name: &str, keys: &[&str]) -> Setup {
        let digests = keys.iter().map(|key| digest_hex(key)).collect();
        self.tenants.push((name.to_owned(), digests, BTreeMap::new()));
        self
    }

    /// A key of the last tenant added (`tokens_per_minute`, `requests_per_minute`, `weight`).
    pub fn tenant_key(mut self, key: &str, value: &str) -> Setup {
        let tenant = self.tenants.last_mut().expect("add a tenant first");
        tenant.2.insert(key.to_owned(), toml_value(value));
        self
    }

    /// A `[rate_limit]` key.
    pub fn rate_limit(mut self, key: &str, value: &str) -> Setup {
        self.rate_limit.insert(key.to_owned(), toml_value(value));
        self
    }

    /// `server.admin_token_sha256` for the admin token `token`.
    pub fn admin_token(self, token: &str) -> Setup {
        let digest = digest_hex(token);
        self.server("admin_token_sha256", &digest)
    }

    /// A key of the last model added (`engine`, `routing`, `upstream_model`).
    pub fn model_key(mut self, key: &str, value: &str) -> Setup {
        let model = self.models.last_mut().expect("add a model first");
        model.keys.insert(key.to_owned(), toml_value(value));
        self
    }

    /// The TOML text.
    pub fn toml(&self) -> String {
        let mut text = String::new();
        for (section, keys) in [
            ("server", &self.server),
            ("queue", &self.queue),
            ("upstream", &self.upstream),
            ("rate_limit", &self.rate_limit),
        ] {
            let _ = writeln!(text, "[{section}]");
            for (key, value) in keys {
                let _ = writeln!(text, "{key} = {value}");
            }
            text.push('\n');
        }
        for (name, digests, keys) in &self.tenants {
            let digests: Vec<String> = digests.iter().map(|d| format!("{d:?}")).collect();
            let _ = writeln!(text, "[[tenant]]\nname = {name:?}");
            let _ = writeln!(text, "api_key_sha256 = [{}]", digests.join(", "));
            for (key, value) in keys {
                let _ = writeln!(text, "{key} = {value}");
            }
            text.push('\n');
        }
        for model in &self.models {
            let backends: Vec<String> = model.backends.iter().map(|b| format!("{b:?}")).collect();
            let _ = writeln!(text, "[[model]]\nname = {:?}", model.name);
            let _ = writeln!(text, "backends = [{}]", backends.join(", "));
            for (key, value) in &model.keys {
                let _ = writeln!(text, "{key} = {value}");
            }
            text.push('\n');
        }
        text
    }

    /// The validated configuration (panics with the TOML when it is refused).
    pub fn config(&self) -> Config {
        let toml = self.toml();
        Config::from_toml_str(&toml).unwrap_or_else(|e| panic!("config refused: {e}\n{toml}"))
    }

    /// Starts a router with this configuration on the real clock.
    pub fn start(&self) -> Router {
        Router::start(self.config())
    }

    /// Starts a router with this configuration on `clock` (a simulated one: move it, then
    /// [`Router::wake`]).
    pub fn start_on(&self, clock: Clock) -> Router {
        Router::start_on(self.config(), clock)
    }

    /// Starts a router with this configuration on the real clock, resolving backends' host
    /// names with `resolver` (a stand-in for DNS).
    pub fn start_with_resolver(&self, resolver: warmpath::control::prober::Resolver) -> Router {
        let clock = super::clock().clone();
        let running = server::start_with(self.config(), None, clock, resolver).expect("starts");
        let (addr, admin) = (running.addr(), running.admin_addr());
        Router { running: Some(running), addr, admin }
    }

    /// Writes this configuration to `path` and starts a router that reloads from it
    /// (`POST /admin/reload`), with no environment variables.
    pub fn start_from_file(&self, path: &std::path::Path) -> Router {
        std::fs::write(path, self.toml()).expect("writing the configuration");
        let source = server::ConfigSource {
            path: path.to_owned(),
            overrides: warmpath::config::Overrides::default(),
            env: |_| None,
        };
        let running =
            server::start_with_source(self.config(), Some(source), super::clock().clone())
                .expect("starts");
        let (addr, admin) = (running.addr(), running.admin_addr());
        Router { running: Some(running), addr, admin }
    }
}

/// The SHA-256 of `token` in hex, as a configuration lists it.
pub fn digest_hex(token: &str) -> String {
    warmpath::credential::hex(&warmpath::credential::digest(token.as_bytes()))
}

/// `value` as a TOML value: numbers, booleans and arrays as they are, anything else quoted.
fn toml_value(value: &str) -> String {
    let bare = value.parse::<i64>().is_ok()
        || value == "true"
        || value == "false"
        || value.starts_with('[')
        || value.starts_with('"');
    if bare {
        value.to_owned()
    } else {
        format!("{value:?}")
    }
}

/// A running router; dropping it shuts it down (without waiting for its threads).
#[derive(Debug)]
pub struct Router {
    running: Option<Running>,
    /// The main listener.
    pub addr: SocketAddr,
    /// The admin listener.
    pub admin: SocketAddr,
}

impl Router {
    /// Starts `config` on the real clock (panics when it does not start).
    pub fn start(config: Config) -> Router {
        Router::start_on(config, super::clock().clone())
    }

    /// Starts `config` on `clock` (panics when it does not start).
    pub fn start_on(config: Config, clock: Clock) -> Router {
        let running = server::start(config, clock).expect("the router starts");
        let (addr, admin) = (running.addr(), running.admin_addr());
        Router { running: Some(running), addr, admin }
    }

    /// Wakes the router's shards to read their clock again (after moving a simulated one).
    pub fn wake(&self) {
        self.running.as_ref().expect("running").wake();
    }

    /// S13 shutdown, as on SIGTERM.
    pub fn shutdown(&self) {
        self.running.as_ref().expect("running").shutdown();
    }

    /// Waits (at most `timeout`) for every thread to end after a shutdown; `false` on timeout
    /// (the threads are then left behind).
    pub fn wait_within(mut self, timeout: Duration) -> bool {
        let running = self.running.take().expect("running");
        let (done, finished) = mpsc::channel();
        std::thread::spawn(move || {
            running.wait();
            let _ = done.send(());
        });
        finished.recv_timeout(timeout).is_ok()
    }

    /// Shuts down and waits for every thread (panics after [`PATIENCE`]).
    pub fn stop(self) {
        self.shutdown();
        assert!(self.wait_within(PATIENCE), "the router did not stop within {PATIENCE:?}");
    }
}

impl Drop for Router {
    fn drop(&mut self) {
        if let Some(running) = self.running.take() {
            running.shutdown();
            std::thread::spawn(move || running.wait());
        }
    }
}
