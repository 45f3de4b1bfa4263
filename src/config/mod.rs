//! The configuration of SPEC section 4: typed structs, loading with precedence, validation and
//! printing of the effective configuration.
//!
//! Layers, lowest first (SPEC 4: "command-line flag > environment variable > file > default"):
//! 1. the defaults of SPEC 4 ([`QueueConfig::default`] and friends);
//! 2. the TOML file (`file.rs`): `[server]`, `[queue]`, `[upstream]`, `[rate_limit]`,
//!    `[[tenant]]`, `[[model]]`; a model's effective queue is the `[queue]` table overridden by
//!    its own `[model.queue]` table (tenants come from the file only);
//! 3. the kthena environment variables ([`mod@env`]), which beat the file for the `[queue]`
//!    defaults **and** for every model's effective queue, `[model.queue]` overrides included;
//! 4. the command line ([`mod@overrides`]): `--listen`, `--admin-listen`, then `--set KEY=VALUE`
//!    (`--set queue.K` reaches every model like an environment variable does; a
//!    `--set model.NAME.queue.K` is applied after all others, so it wins for that model).
//!
//! The file, the environment and `--set` all go through one table of key setters (`keys.rs`),
//! so a key parses the same way and fails with the same message wherever it comes from.
//! [`Config::validate`] then checks the cross-key rules and ranges on the result. Every error
//! names the key and the bad value (see `docs/configuration.md` for every key).

pub mod duration;
pub mod env;
mod file;
mod keys;
pub mod overrides;
mod print;
pub mod sessions;
mod validate;

use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::credential::Digest;

pub use duration::{format_duration, parse_duration, DurationError};
pub use env::{process_env, ENV_VARS};
pub use overrides::Overrides;
pub use sessions::SessionSource;

/// The whole effective configuration of one warmpath process.
#[derive(Debug, Clone, PartialEq)]
pub struct Config {
    /// `[server]`: listeners, limits on clients, shutdown.
    pub server: ServerConfig,
    /// `[queue]`: the queue defaults every model starts from. The values a model actually uses
    /// are in its [`ModelConfig::queue`].
    pub queue: QueueConfig,
    /// `[upstream]`: connections to backends, retries, metrics scraping and health.
    pub upstream: UpstreamConfig,
    /// `[[model]]`, in file order. Never empty in a validated configuration.
    pub models: Vec<ModelConfig>,
    /// `[[tenant]]`, in file order (issue \[11\]). With at least one, every request to the main
    /// listener but `/healthz` and `/readyz` needs one of their API keys.
    pub tenants: Vec<TenantConfig>,
    /// `[rate_limit]`: where the tenants' limits are counted (issue \[11\]).
    pub rate_limit: RateLimitConfig,
}

/// One `[[tenant]]` (issue \[11\], SPEC section 10).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantConfig {
    /// Its name: the `tenant` label and the access log's `tenant` field; 1 to 64 ASCII
    /// letters, digits, `-`, `_` and `.`.
    pub name: String,
    /// SHA-256 digests of its API keys (never the keys), at least one.
    pub api_key_sha256: Vec<Digest>,
    /// Fair-share weight, 1 to 1000.
    pub weight: u32,
    /// Prompt plus completion tokens per minute; 0 = unlimited.
    pub tokens_per_minute: u64,
    /// Requests per minute; 0 = unlimited.
    pub requests_per_minute: u64,
}

/// `[rate_limit]` (issue \[11\]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RateLimitConfig {
    /// Where the limits are counted: per replica, or shared through Redis.
    pub store: RateLimitStore,
    /// The Redis server of `store = "redis"`: `redis://[user:password@]host[:port][/db]`.
    pub redis_url: String,
    /// Completion tokens reserved for a request that names no `max_tokens`.
    pub default_max_tokens: u32,
}

/// `rate_limit.store`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum RateLimitStore {
    /// Each replica counts its own.
    #[default]
    Local,
    /// Shared across replicas through Redis.
    Redis,
}

/// `[server]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ServerConfig {
    /// Main listener (OpenAI API).
    pub listen: SocketAddr,
    /// Admin listener (`/metrics`, `/debug/*`).
    pub admin_listen: SocketAddr,
    /// Event-loop shards; 0 = one per available core.
    pub shards: u32,
    /// Pin each shard to its own core.
    pub pin_cores: bool,
    /// Issue \[12\]: before blocking in `epoll_wait`, a shard polls without blocking for up to this
    /// long (`0` = never; it blocks at once).
    pub busy_poll: Duration,
    /// Open client connections, across all shards.
    pub max_connections: u32,
    /// Largest request head (request line and headers); over it: 431.
    pub max_header_bytes: u32,
    /// Largest request body; over it: 413.
    pub max_body_bytes: u64,
    /// Per shard: request bodies held while queued; over it: 503.
    pub max_buffered_bytes: u64,
    /// Time to receive the request head; over it: 408.
    pub header_timeout: Duration,
    /// Time to receive the request body; over it: 408.
    pub body_timeout: Duration,
    /// Keep-alive connection idle time before it is closed.
    pub idle_timeout: Duration,
    /// On shutdown, time in-flight responses get before connections close.
    pub drain_timeout: Duration,
    /// Where the JSON-lines access log goes.
    pub access_log: AccessLog,
    /// Add `x-warmpath-*` response headers (SPEC 6).
    pub debug_headers: bool,
    /// Issue \[11\]: the SHA-256 digest of the bearer token every admin route then requires;
    /// `None` (written `""`) = the admin listener is open.
    pub admin_token_sha256: Option<Digest>,
    /// `[server.tls]` (issue \[11\]): the main listener's certificate and key; both or neither.
    pub tls: TlsConfig,
}

/// `[server.tls]`: PEM files of the main listener's certificate chain and private key (issue
/// \[11\]). Both set = the main listener speaks TLS; neither = plaintext; one alone is refused
/// by validation. The files are read when a generation is built (at start and on every
/// reload), not here. A relative path is relative to the working directory.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TlsConfig {
    /// The certificate chain, leaf first (`cert`; `""` = unset).
    pub cert: Option<PathBuf>,
    /// The leaf's private key: PKCS#8, PKCS#1 or SEC1 (`key`; `""` = unset).
    pub key: Option<PathBuf>,
}

impl TlsConfig {
    /// Both files, when TLS is on.
    pub fn files(&self) -> Option<(&Path, &Path)> {
        Some((self.cert.as_deref()?, self.key.as_deref()?))
    }
}

/// `server.access_log`: `"off"`, `"stdout"`, `"stderr"`, or a file path.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum AccessLog {
    /// No access log.
    #[default]
    Off,
    /// JSON lines on standard output.
    Stdout,
    /// JSON lines on standard error.
    Stderr,
    /// JSON lines appended to this file.
    File(PathBuf),
}

/// A key that warmpath can learn (`"auto"`, the default) or that the operator fixes (an
/// integer). SPEC section 10.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Setting<T> {
    /// Learned at run time; what it resolves to is in `docs/configuration.md` and printed by
    /// `warmpath check-config`.
    Auto,
    /// The operator's value.
    Fixed(T),
}

impl<T: std::fmt::Display> std::fmt::Display for Setting<T> {
    /// `"auto"` (a TOML string) or the value.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Setting::Auto => f.write_str("\"auto\""),
            Setting::Fixed(value) => value.fmt(f),
        }
    }
}

/// A queue table: `[queue]` (defaults) or a model's effective queue.
#[derive(Debug, Clone, PartialEq)]
pub struct QueueConfig {
    /// S15: session-boost or fifo.
    pub strategy: Strategy,
    /// S9: queue-wait deadline, measured from arrival; [`Duration::ZERO`] = none.
    pub timeout: Duration,
    /// S11: queued requests per model; beyond that, 429.
    pub max_queued: u32,
    /// S6.1: safety cap on one backend's inflight requests: learned per backend from 256
    /// (`auto`), or fixed.
    pub inflight_per_backend: Setting<u32>,
    /// S6.3: prefill backlog budget per backend, in estimated prompt tokens: learned per
    /// backend (`auto`), or fixed (`0` = off).
    pub prefill_tokens_per_backend: Setting<u64>,
    /// Request header carrying the session id (matched case-insensitively); the first entry of
    /// the default `session_sources`.
    pub session_header: String,
    /// Issue \[10\]: where the session identity comes from, `"header:NAME"` and `"body:FIELD"`
    /// entries in order, the first present winning (`sessions.rs`); `None` = the default list,
    /// which starts with `session_header` ([`QueueConfig::effective_session_sources`]).
    pub session_sources: Option<Vec<String>>,
    /// Issue \[10\]: with `prefix-cost` routing, a request with no session identity continues
    /// the conversation whose completed prompt its own extends (`scheduler::derive`).
    pub derive_sessions: bool,
    /// S2: capacity of the tracker of recently completed sessions.
    pub max_sessions: u32,
    /// S4: boosted admissions a boosted request may wait through before it is forced; 0 = off.
    pub max_overtakes: u32,
    /// S5: non-forced boosted admissions in a row while normal requests wait; 0 = off.
    pub boosted_streak_max: u32,
    /// S8: how long a slot freed by a completion is held for that session's follow-up; 0 = off.
    pub grace_period: Duration,
    /// S16: bytes of prompt text per hashed block of the prefix index.
    pub prefix_block_bytes: u32,
    /// S16: blocks remembered per backend by the prefix index: sized from the engine's KV
    /// capacity and calibrated (`auto`), or fixed.
    pub prefix_index_blocks: Setting<u32>,
    /// S16: queued requests examined per admission.
    pub placement_scan_max: u32,
    /// S16: a backend within this many tokens of the cheapest one is acceptable.
    pub cost_slack_tokens: u64,
    /// S16: after this wait a request takes the cheapest eligible backend.
    pub affinity_wait_max: Duration,
}

/// `[upstream]`.
#[derive(Debug, Clone, PartialEq)]
pub struct UpstreamConfig {
    /// Time to establish a TCP connection to a backend.
    pub connect_timeout: Duration,
    /// Time from sending a request to receiving the response head.
    pub header_timeout: Duration,
    /// After the response head, the longest a backend may go without sending a byte while
    /// its response is unfinished (a hung engine); the response is then cut.
    pub read_timeout: Duration,
    /// Retries of a request that failed before any byte was relayed (SPEC 2.8).
    pub max_retries: u32,
    /// Idle keep-alive connections kept per backend, per shard.
    pub max_idle_per_backend: u32,
    /// How often each backend's `/metrics` and health are scraped.
    pub metrics_interval: Duration,
    /// Scraped gauges older than this are ignored by the admission gates (S6.2).
    pub metrics_stale_after: Duration,
    /// Path of the backend health check.
    pub health_path: String,
    /// Consecutive retryable failures after which a backend is ejected until its health check
    /// passes again (passive health, SPEC 2.8); 0 = never eject.
    pub eject_after_failures: u32,
}

/// One `[[model]]`.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelConfig {
    /// Matched against the request body's top-level `"model"`.
    pub name: String,
    /// When set, the body's `"model"` value is rewritten to this in place.
    pub upstream_model: Option<String>,
    /// A file holding the API key the model's engines require (vLLM's and SGLang's
    /// `--api-key`): sent as `Authorization: Bearer` on every request to them, in place of the
    /// client's; read at start and at every reload, never printed.
    pub backend_api_key_file: Option<std::path::PathBuf>,
    /// Which metrics the control thread scrapes.
    pub engine: Engine,
    /// S7 backend choice.
    pub routing: Routing,
    /// Backends as `"host:port"`, in file order.
    pub backends: Vec<String>,
    /// The effective queue of this model: `[queue]`, then `[model.queue]`, then environment
    /// and command line.
    pub queue: QueueConfig,
}

/// `queue.strategy` (S15).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Strategy {
    /// Follow-up turns of recently completed sessions first (S1 to S8).
    #[default]
    SessionBoost,
    /// The same machinery without the boost lane.
    Fifo,
}

/// `model.routing` (S7, S16).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Routing {
    /// The session's previous backend when eligible, else the least loaded eligible one.
    SessionAffinity,
    /// S16 prefix-cost placement: where the prompt's prefix is cached, weighed against the
    /// backlog (the default: chosen by the issue \[8\] matrix, `perf/RESULTS.md`).
    #[default]
    PrefixCost,
    /// The eligible backend with the fewest inflight requests.
    LeastInflight,
    /// Eligible backends in rotation.
    RoundRobin,
}

/// `model.engine`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Engine {
    /// vLLM: `vllm:*` metrics.
    #[default]
    Vllm,
    /// SGLang: `sglang:*` metrics.
    Sglang,
    /// Any OpenAI-compatible server: no metrics scraping.
    Openai,
}

macro_rules! named_enum {
    ($ty:ident { $($variant:ident => $name:literal),+ $(,)? }) => {
        impl $ty {
            /// Every value, in documentation order.
            pub const ALL: &'static [$ty] = &[$($ty::$variant),+];

            /// The configuration spelling of this value.
            pub fn name(self) -> &'static str {
                match self {
                    $($ty::$variant => $name),+
                }
            }

            /// The value spelled `name` in a configuration, if any.
            pub fn from_name(name: &str) -> Option<Self> {
                Self::ALL.iter().copied().find(|value| value.name() == name)
            }
        }

        impl fmt::Display for $ty {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.name())
            }
        }
    };
}

named_enum!(Strategy { SessionBoost => "session-boost", Fifo => "fifo" });
named_enum!(Routing {
    SessionAffinity => "session-affinity",
    PrefixCost => "prefix-cost",
    LeastInflight => "least-inflight",
    RoundRobin => "round-robin",
});
named_enum!(Engine { Vllm => "vllm", Sglang => "sglang", Openai => "openai" });
named_enum!(RateLimitStore { Local => "local", Redis => "redis" });

impl AccessLog {
    /// Parses `"off"`, `"stdout"`, `"stderr"` or a file path; `None` for an empty string.
    pub fn from_name(text: &str) -> Option<Self> {
        match text {
            "" => None,
            "off" => Some(AccessLog::Off),
            "stdout" => Some(AccessLog::Stdout),
            "stderr" => Some(AccessLog::Stderr),
            path => Some(AccessLog::File(PathBuf::from(path))),
        }
    }

    /// The configuration spelling (a path is written as is, lossily if not UTF-8).
    pub fn name(&self) -> String {
        match self {
            AccessLog::Off => "off".to_owned(),
            AccessLog::Stdout => "stdout".to_owned(),
            AccessLog::Stderr => "stderr".to_owned(),
            AccessLog::File(path) => path.to_string_lossy().into_owned(),
        }
    }
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 8080)),
            admin_listen: SocketAddr::from((Ipv4Addr::LOCALHOST, 9090)),
            shards: 0,
            pin_cores: true,
            busy_poll: Duration::ZERO,
            max_connections: 65_536,
            max_header_bytes: 16_384,
            max_body_bytes: 16_777_216,
            max_buffered_bytes: 1_073_741_824,
            header_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(60),
            drain_timeout: Duration::from_secs(30),
            access_log: AccessLog::Off,
            debug_headers: false,
            admin_token_sha256: None,
            tls: TlsConfig::default(),
        }
    }
}

impl Default for QueueConfig {
    fn default() -> Self {
        QueueConfig {
            strategy: Strategy::SessionBoost,
            timeout: Duration::from_secs(30),
            max_queued: 65_536,
            inflight_per_backend: Setting::Auto,
            prefill_tokens_per_backend: Setting::Auto,
            session_header: "X-Session-ID".to_owned(),
            session_sources: None,
            derive_sessions: true,
            max_sessions: 4_096,
            max_overtakes: 16,
            boosted_streak_max: 0,
            grace_period: Duration::ZERO,
            prefix_block_bytes: 256,
            prefix_index_blocks: Setting::Auto,
            placement_scan_max: 64,
            cost_slack_tokens: 2_048,
            affinity_wait_max: Duration::from_secs(1),
        }
    }
}

impl Default for UpstreamConfig {
    fn default() -> Self {
        UpstreamConfig {
            connect_timeout: Duration::from_secs(3),
            header_timeout: Duration::from_secs(600),
            read_timeout: Duration::from_secs(300),
            max_retries: 2,
            max_idle_per_backend: 64,
            metrics_interval: Duration::from_secs(1),
            metrics_stale_after: Duration::from_secs(5),
            health_path: "/health".to_owned(),
            eject_after_failures: 3,
        }
    }
}

impl Default for RateLimitConfig {
    fn default() -> Self {
        RateLimitConfig {
            store: RateLimitStore::Local,
            redis_url: "redis://127.0.0.1:6379".to_owned(),
            default_max_tokens: 1024,
        }
    }
}

impl TenantConfig {
    /// A tenant with the given name and key digests and every other key at its default.
    pub fn new(name: impl Into<String>, api_key_sha256: Vec<Digest>) -> Self {
        TenantConfig {
            name: name.into(),
            api_key_sha256,
            weight: 1,
            tokens_per_minute: 0,
            requests_per_minute: 0,
        }
    }
}

impl QueueConfig {
    /// The session sources in effect: the configured list, or the default one built from
    /// `session_header`. Entries that do not parse are left out (validation refuses them).
    pub fn effective_session_sources(&self) -> Vec<SessionSource> {
        match &self.session_sources {
            None => sessions::default_sources(&self.session_header),
            Some(entries) => {
                entries.iter().filter_map(|entry| SessionSource::parse(entry).ok()).collect()
            }
        }
    }
}

impl ModelConfig {
    /// A model with the given name and backends and every other key at its default.
    pub fn new(name: impl Into<String>, backends: Vec<String>) -> Self {
        ModelConfig {
            name: name.into(),
            upstream_model: None,
            backend_api_key_file: None,
            engine: Engine::default(),
            routing: Routing::default(),
            backends,
            queue: QueueConfig::default(),
        }
    }

    /// The key of this model's engines, read from its `backend_api_key_file` if it names one;
    /// the error names the model and the key, as the start, a reload and `check-config` say it.
    pub fn backend_key(&self) -> Result<Option<crate::credential::BackendKey>, String> {
        let Some(path) = &self.backend_api_key_file else { return Ok(None) };
        crate::credential::read_backend_key(path)
            .map(Some)
            .map_err(|error| format!("model {:?}: backend_api_key_file = {error}", self.name))
    }
}

impl Config {
    /// Defaults for every section and these models (not validated).
    pub fn with_models(models: Vec<ModelConfig>) -> Self {
        Config {
            server: ServerConfig::default(),
            queue: QueueConfig::default(),
            upstream: UpstreamConfig::default(),
            models,
            tenants: Vec::new(),
            rate_limit: RateLimitConfig::default(),
        }
    }

    /// Parses and validates a TOML document, without environment or command line.
    pub fn from_toml_str(text: &str) -> Result<Config, ConfigError> {
        let config = file::parse(text)?;
        config.validate()?;
        Ok(config)
    }

    /// Loads the effective configuration: defaults, then `file` (if any), then the environment
    /// (`env` returns a variable's value; pass [`process_env`] for the real one), then the
    /// command-line `overrides`; validates the result.
    pub fn load(
        file: Option<&Path>,
        env: &dyn Fn(&str) -> Option<String>,
        overrides: &Overrides,
    ) -> Result<Config, ConfigError> {
        let mut config = match file {
            Some(path) => Config::read_file(path)?,
            None => Config::with_models(Vec::new()),
        };
        env::apply(&mut config, env)?;
        overrides.apply(&mut config)?;
        config.validate()?;
        Ok(config)
    }

    /// Reads and parses a file (not validated); errors start with the path.
    fn read_file(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|error| {
            ConfigError::new(ConfigErrorKind::Read, format!("{}: {error}", path.display()))
        })?;
        file::parse(&text).map_err(|error| error.in_file(path))
    }

    /// Checks every rule of section 4 (ranges, uniqueness, cross-key rules); the error names
    /// the first offending key and its value.
    pub fn validate(&self) -> Result<(), ConfigError> {
        validate::config(self)
    }

    /// What is valid but likely not meant, one line each (printed at start, at each reload and
    /// by `check-config`): a model whose engines take a key from `backend_api_key_file` while
    /// no tenant is configured, so that anyone who reaches the main listener uses that key; a
    /// key file that every user of the machine can read.
    pub fn warnings(&self) -> Vec<String> {
        use std::os::unix::fs::PermissionsExt as _;
        let mut warnings = Vec::new();
        for model in &self.models {
            let Some(path) = &model.backend_api_key_file else { continue };
            if self.tenants.is_empty() {
                warnings.push(format!(
                    "model {:?}: backend_api_key_file is set and no [[tenant]] is configured: \
                     anyone who reaches server.listen ({}) uses its engines with that key",
                    model.name, self.server.listen
                ));
            }
            let mode = std::fs::metadata(path).map_or(0, |m| m.permissions().mode());
            if mode & 0o004 != 0 {
                warnings.push(format!(
                    "model {:?}: backend_api_key_file {} is readable by every user (mode {:o}): \
                     make it readable by warmpath's user only (chmod 600)",
                    model.name,
                    path.display(),
                    mode & 0o777
                ));
            }
        }
        warnings
    }

    /// The configuration as a TOML document that loads back to an equal `Config`, with every
    /// key written out, including each model's whole effective queue table.
    pub fn to_toml(&self) -> String {
        print::config(self)
    }

    /// The model called `name`, if configured.
    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|model| model.name == name)
    }
}

impl fmt::Display for Config {
    /// Same as [`Config::to_toml`].
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_toml())
    }
}

/// What kind of configuration error happened.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConfigErrorKind {
    /// The file could not be read.
    Read,
    /// The file is not valid TOML, or a section has the wrong shape.
    Syntax,
    /// A key that warmpath does not know (a typo, or a key in the wrong section).
    UnknownKey,
    /// A required key is missing.
    MissingKey,
    /// A value of the wrong type or spelling (from the file, environment or command line).
    BadValue,
    /// Values that parse but break a rule: out of range, duplicated, or inconsistent.
    Invalid,
}

/// A configuration error. Its `Display` is one line naming the key and the bad value, e.g.
/// `model "llama": queue.inflight_per_backend = 0: must be at least 1`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    kind: ConfigErrorKind,
    message: String,
}

impl ConfigError {
    pub(crate) fn new(kind: ConfigErrorKind, message: impl Into<String>) -> Self {
        ConfigError { kind, message: message.into() }
    }

    /// What kind of error this is.
    pub fn kind(&self) -> ConfigErrorKind {
        self.kind
    }

    /// The message, as displayed.
    pub fn message(&self) -> &str {
        &self.message
    }

    /// Prefixes the message with the file it came from.
    fn in_file(self, path: &Path) -> Self {
        ConfigError { kind: self.kind, message: format!("{}: {}", path.display(), self.message) }
    }
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for ConfigError {}
