//! The key setters shared by the file, the environment and `--set`: one `match` per section
//! that turns a raw value into the typed field, so a key parses identically and fails with the
//! same reason wherever its value came from.
//!
//! A raw value is either a TOML value (from the file) or text (from the environment or the
//! command line). Text is parsed as the field's type: `"4"` for an integer, `"true"` for a
//! boolean, `"30s"` for a duration, `"a:1,b:2"` (comma-separated) for a list.

use std::net::SocketAddr;

use super::duration::parse_duration;
use super::UpstreamConfig;
use super::{
    AccessLog, Engine, ModelConfig, QueueConfig, Routing, ServerConfig, Setting, Strategy,
};
use super::{ConfigError, ConfigErrorKind, RateLimitConfig, RateLimitStore, TenantConfig};
use crate::credential::{parse_hex_digest, Digest};

/// Keys of `[server]`, in documentation order.
pub(crate) const SERVER_KEYS: &[&str] = &[
    "listen",
    "admin_listen",
    "shards",
    "pin_cores",
    "busy_poll",
    "max_connections",
    "max_header_bytes",
    "max_body_bytes",
    "max_buffered_bytes",
    "header_timeout",
    "body_timeout",
    "idle_timeout",
    "drain_timeout",
    "access_log",
    "debug_headers",
    "admin_token_sha256",
];

/// Keys of `[server.tls]`, in documentation order (`server.tls.K` for `--set`).
pub(crate) const TLS_KEYS: &[&str] = &["cert", "key"];

/// Keys of `[queue]` and `[model.queue]`, in documentation order.
pub(crate) const QUEUE_KEYS: &[&str] = &[
    "strategy",
    "timeout",
    "max_queued",
    "inflight_per_backend",
    "prefill_tokens_per_backend",
    "session_header",
    "session_sources",
    "derive_sessions",
    "max_sessions",
    "max_overtakes",
    "boosted_streak_max",
    "grace_period",
    "prefix_block_bytes",
    "prefix_index_blocks",
    "placement_scan_max",
    "cost_slack_tokens",
    "affinity_wait_max",
];

/// Keys of `[upstream]`, in documentation order.
pub(crate) const UPSTREAM_KEYS: &[&str] = &[
    "connect_timeout",
    "header_timeout",
    "read_timeout",
    "max_retries",
    "max_idle_per_backend",
    "metrics_interval",
    "metrics_stale_after",
    "health_path",
    "eject_after_failures",
];

/// Keys of `[rate_limit]`, in documentation order.
pub(crate) const RATE_LIMIT_KEYS: &[&str] = &["store", "redis_url", "default_max_tokens"];

/// Keys of `[[tenant]]`, in documentation order.
pub(crate) const TENANT_KEYS: &[&str] =
    &["name", "api_key_sha256", "weight", "tokens_per_minute", "requests_per_minute"];

/// The sections of a configuration file.
pub(crate) const SECTIONS: &[&str] =
    &["server", "queue", "upstream", "rate_limit", "tenant", "model"];

/// Keys of `[[model]]` (besides its `queue` table), in documentation order.
pub(crate) const MODEL_KEYS: &[&str] =
    &["name", "upstream_model", "backend_api_key_file", "engine", "routing", "backends", "queue"];

/// A value before it is typed.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Raw<'a> {
    /// From the TOML file.
    Toml(&'a toml::Value),
    /// From an environment variable or the command line.
    Text(&'a str),
}

impl Raw<'_> {
    /// The value as an error message shows it: TOML syntax, text quoted.
    pub(crate) fn shown(&self) -> String {
        match self {
            Raw::Toml(value) => value.to_string(),
            Raw::Text(text) => format!("{text:?}"),
        }
    }
}

/// Why a setter refused a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum SetError {
    /// The section has no such key.
    UnknownKey,
    /// The value does not parse as the key's type; the reason.
    BadValue(String),
}

impl From<String> for SetError {
    fn from(reason: String) -> Self {
        SetError::BadValue(reason)
    }
}

impl SetError {
    /// The error for `key` (already qualified, e.g. `server.listen`) set to `raw`, with
    /// `context` (e.g. `model "llama": `) in front.
    pub(crate) fn into_config_error(self, context: &str, key: &str, raw: Raw<'_>) -> ConfigError {
        match self {
            SetError::UnknownKey => unknown_key(context, key),
            SetError::BadValue(reason) => ConfigError::new(
                ConfigErrorKind::BadValue,
                format!("{context}{key} = {}: {reason}", raw.shown()),
            ),
        }
    }
}

/// `unknown key "server.lisen"`, with a suggestion when a known key is close.
pub(crate) fn unknown_key(context: &str, key: &str) -> ConfigError {
    let (section, last) = key.rsplit_once('.').unwrap_or(("", key));
    let known: &[&str] = match section.rsplit('.').next().unwrap_or("") {
        "server" => SERVER_KEYS,
        "tls" => TLS_KEYS,
        "queue" => QUEUE_KEYS,
        "upstream" => UPSTREAM_KEYS,
        "rate_limit" => RATE_LIMIT_KEYS,
        "" if context.starts_with("model") => MODEL_KEYS,
        "" if context.starts_with("tenant") => TENANT_KEYS,
        "" => SECTIONS,
        _ => &[],
    };
    let hint = match known.iter().find(|candidate| edit_distance(candidate, last) <= 2) {
        Some(candidate) if section.is_empty() => format!(" (did you mean \"{candidate}\"?)"),
        Some(candidate) => format!(" (did you mean \"{section}.{candidate}\"?)"),
        None => String::new(),
    };
    ConfigError::new(ConfigErrorKind::UnknownKey, format!("{context}unknown key \"{key}\"{hint}"))
}

/// Levenshtein distance, for "did you mean" hints on short key names.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut previous: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut current = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let substitution = previous[j] + usize::from(ca != *cb);
            current[j + 1] = substitution.min(previous[j + 1] + 1).min(current[j] + 1);
        }
        previous = current;
    }
    previous[b.len()]
}

impl ServerConfig {
    /// Sets one `[server]` key.
    pub(crate) fn set(&mut self, key: &str, raw: Raw<'_>) -> Result<(), SetError> {
        match key {
            "listen" => self.listen = socket_addr(raw)?,
            "admin_listen" => self.admin_listen = socket_addr(raw)?,
            "shards" => self.shards = unsigned(raw)?,
            "pin_cores" => self.pin_cores = boolean(raw)?,
            "busy_poll" => self.busy_poll = duration(raw)?,
            "max_connections" => self.max_connections = unsigned(raw)?,
            "max_header_bytes" => self.max_header_bytes = unsigned(raw)?,
            "max_body_bytes" => self.max_body_bytes = unsigned(raw)?,
            "max_buffered_bytes" => self.max_buffered_bytes = unsigned(raw)?,
            "header_timeout" => self.header_timeout = duration(raw)?,
            "body_timeout" => self.body_timeout = duration(raw)?,
            "idle_timeout" => self.idle_timeout = duration(raw)?,
            "drain_timeout" => self.drain_timeout = duration(raw)?,
            "access_log" => {
                self.access_log = AccessLog::from_name(&string(raw)?).ok_or_else(|| {
                    "expected \"off\", \"stdout\", \"stderr\" or a file path".to_owned()
                })?;
            }
            "debug_headers" => self.debug_headers = boolean(raw)?,
            "admin_token_sha256" => {
                let text = string(raw)?;
                self.admin_token_sha256 = match text.trim() {
                    "" => None,
                    digest => Some(hex_digest(digest)?),
                };
            }
            "tls.cert" => self.tls.cert = optional_path(raw)?,
            "tls.key" => self.tls.key = optional_path(raw)?,
            _ => return Err(SetError::UnknownKey),
        }
        Ok(())
    }
}

impl QueueConfig {
    /// Sets one `[queue]` (or `[model.queue]`) key.
    pub(crate) fn set(&mut self, key: &str, raw: Raw<'_>) -> Result<(), SetError> {
        match key {
            "strategy" => self.strategy = named(raw, Strategy::ALL, Strategy::name)?,
            "timeout" => self.timeout = duration(raw)?,
            "max_queued" => self.max_queued = unsigned(raw)?,
            "inflight_per_backend" => self.inflight_per_backend = auto_or(raw, unsigned)?,
            "prefill_tokens_per_backend" => {
                self.prefill_tokens_per_backend = auto_or(raw, unsigned)?;
            }
            "session_header" => self.session_header = string(raw)?,
            "session_sources" => self.session_sources = Some(string_list(raw)?),
            "derive_sessions" => self.derive_sessions = boolean(raw)?,
            "max_sessions" => self.max_sessions = unsigned(raw)?,
            "max_overtakes" => self.max_overtakes = unsigned(raw)?,
            "boosted_streak_max" => self.boosted_streak_max = unsigned(raw)?,
            "grace_period" => self.grace_period = duration(raw)?,
            "prefix_block_bytes" => self.prefix_block_bytes = unsigned(raw)?,
            "prefix_index_blocks" => self.prefix_index_blocks = auto_or(raw, unsigned)?,
            "placement_scan_max" => self.placement_scan_max = unsigned(raw)?,
            "cost_slack_tokens" => self.cost_slack_tokens = unsigned(raw)?,
            "affinity_wait_max" => self.affinity_wait_max = duration(raw)?,
            _ => return Err(SetError::UnknownKey),
        }
        Ok(())
    }
}

impl UpstreamConfig {
    /// Sets one `[upstream]` key.
    pub(crate) fn set(&mut self, key: &str, raw: Raw<'_>) -> Result<(), SetError> {
        match key {
            "connect_timeout" => self.connect_timeout = duration(raw)?,
            "header_timeout" => self.header_timeout = duration(raw)?,
            "read_timeout" => self.read_timeout = duration(raw)?,
            "max_retries" => self.max_retries = unsigned(raw)?,
            "max_idle_per_backend" => self.max_idle_per_backend = unsigned(raw)?,
            "metrics_interval" => self.metrics_interval = duration(raw)?,
            "metrics_stale_after" => self.metrics_stale_after = duration(raw)?,
            "health_path" => self.health_path = string(raw)?,
            "eject_after_failures" => self.eject_after_failures = unsigned(raw)?,
            _ => return Err(SetError::UnknownKey),
        }
        Ok(())
    }
}

impl ModelConfig {
    /// Sets one `[[model]]` key other than its `queue` table.
    pub(crate) fn set(&mut self, key: &str, raw: Raw<'_>) -> Result<(), SetError> {
        match key {
            "name" => self.name = string(raw)?,
            "upstream_model" => self.upstream_model = Some(string(raw)?),
            "backend_api_key_file" => self.backend_api_key_file = optional_path(raw)?,
            "engine" => self.engine = named(raw, Engine::ALL, Engine::name)?,
            "routing" => self.routing = named(raw, Routing::ALL, Routing::name)?,
            "backends" => self.backends = string_list(raw)?,
            _ => return Err(SetError::UnknownKey),
        }
        Ok(())
    }
}

impl RateLimitConfig {
    /// Sets one `[rate_limit]` key.
    pub(crate) fn set(&mut self, key: &str, raw: Raw<'_>) -> Result<(), SetError> {
        match key {
            "store" => self.store = named(raw, RateLimitStore::ALL, RateLimitStore::name)?,
            "redis_url" => self.redis_url = string(raw)?,
            "default_max_tokens" => self.default_max_tokens = unsigned(raw)?,
            _ => return Err(SetError::UnknownKey),
        }
        Ok(())
    }
}

impl TenantConfig {
    /// Sets one `[[tenant]]` key.
    pub(crate) fn set(&mut self, key: &str, raw: Raw<'_>) -> Result<(), SetError> {
        match key {
            "name" => self.name = string(raw)?,
            "api_key_sha256" => {
                let entries = string_list(raw)?;
                let digests = entries.iter().enumerate().map(|(i, entry)| {
                    hex_digest(entry.trim()).map_err(|reason| format!("entry {i}: {reason}"))
                });
                self.api_key_sha256 = digests.collect::<Result<_, _>>()?;
            }
            "weight" => self.weight = unsigned(raw)?,
            "tokens_per_minute" => self.tokens_per_minute = unsigned(raw)?,
            "requests_per_minute" => self.requests_per_minute = unsigned(raw)?,
            _ => return Err(SetError::UnknownKey),
        }
        Ok(())
    }
}

/// A file path, `""` for none.
fn optional_path(raw: Raw<'_>) -> Result<Option<std::path::PathBuf>, SetError> {
    let text = string(raw)?;
    Ok((!text.is_empty()).then(|| text.into()))
}

/// A SHA-256 digest in hex (either case), with a reason that says what is expected.
fn hex_digest(text: &str) -> Result<Digest, String> {
    parse_hex_digest(text).map_err(|reason| {
        format!(
            "{reason} (the SHA-256 of the token, never the token; `warmpath keygen` prints one)"
        )
    })
}

/// A TOML value's type, for "expected X, found Y".
fn type_name(value: &toml::Value) -> &'static str {
    match value {
        toml::Value::String(_) => "a string",
        toml::Value::Integer(_) => "an integer",
        toml::Value::Float(_) => "a float",
        toml::Value::Boolean(_) => "a boolean",
        toml::Value::Datetime(_) => "a datetime",
        toml::Value::Array(_) => "an array",
        toml::Value::Table(_) => "a table",
    }
}

fn string(raw: Raw<'_>) -> Result<String, String> {
    match raw {
        Raw::Toml(toml::Value::String(text)) => Ok(text.clone()),
        Raw::Toml(other) => Err(format!("expected a string, found {}", type_name(other))),
        Raw::Text(text) => Ok(text.to_owned()),
    }
}

/// An unsigned integer of type `T` (`u32` or `u64`).
fn unsigned<T>(raw: Raw<'_>) -> Result<T, String>
where
    T: TryFrom<i64> + TryFrom<u64> + std::fmt::Display + Bounded,
{
    let too_large = || format!("too large (at most {})", T::MAX_VALUE);
    match raw {
        Raw::Toml(toml::Value::Integer(n)) if *n < 0 => Err("must not be negative".to_owned()),
        Raw::Toml(toml::Value::Integer(n)) => T::try_from(*n).map_err(|_| too_large()),
        Raw::Toml(other) => Err(format!("expected an integer, found {}", type_name(other))),
        Raw::Text(text) => {
            let text = text.trim();
            if text.is_empty() || !text.bytes().all(|b| b.is_ascii_digit()) {
                return Err("not an unsigned integer".to_owned());
            }
            let n: u64 = text.parse().map_err(|_| too_large())?;
            T::try_from(n).map_err(|_| too_large())
        }
    }
}

/// `"auto"`, or a value of the key's type.
fn auto_or<T>(raw: Raw<'_>, value: fn(Raw<'_>) -> Result<T, String>) -> Result<Setting<T>, String> {
    let is_auto = match raw {
        Raw::Toml(toml::Value::String(text)) => text == "auto",
        Raw::Text(text) => text.trim() == "auto",
        Raw::Toml(_) => false,
    };
    if is_auto {
        return Ok(Setting::Auto);
    }
    match raw {
        Raw::Toml(toml::Value::String(text)) => {
            Err(format!("expected \"auto\" or an integer, found the string {text:?}"))
        }
        _ => value(raw).map(Setting::Fixed).map_err(|reason| format!("{reason} (or \"auto\")")),
    }
}

/// The largest value of an unsigned type, for error messages.
pub(crate) trait Bounded {
    const MAX_VALUE: Self;
}

impl Bounded for u32 {
    const MAX_VALUE: u32 = u32::MAX;
}

impl Bounded for u64 {
    const MAX_VALUE: u64 = u64::MAX;
}

/// A boolean; text accepts Go's `strconv.ParseBool` spellings, as kthena did.
pub(crate) fn boolean(raw: Raw<'_>) -> Result<bool, String> {
    match raw {
        Raw::Toml(toml::Value::Boolean(value)) => Ok(*value),
        Raw::Toml(other) => Err(format!("expected a boolean, found {}", type_name(other))),
        Raw::Text(text) => match text.trim() {
            "1" | "t" | "T" | "true" | "TRUE" | "True" => Ok(true),
            "0" | "f" | "F" | "false" | "FALSE" | "False" => Ok(false),
            _ => Err("not a boolean (expected true or false)".to_owned()),
        },
    }
}

fn duration(raw: Raw<'_>) -> Result<std::time::Duration, String> {
    match raw {
        Raw::Toml(toml::Value::String(text)) => {
            parse_duration(text).map_err(|error| error.to_string())
        }
        Raw::Text(text) => parse_duration(text).map_err(|error| error.to_string()),
        Raw::Toml(toml::Value::Integer(0)) => Ok(std::time::Duration::ZERO),
        Raw::Toml(other) => {
            Err(format!("expected a duration string such as \"30s\", found {}", type_name(other)))
        }
    }
}

fn socket_addr(raw: Raw<'_>) -> Result<SocketAddr, String> {
    let text = string(raw)?;
    text.trim().parse().map_err(|_| {
        "not a socket address (expected IP:PORT such as \"127.0.0.1:8080\" or \"[::1]:8080\")"
            .to_owned()
    })
}

/// One of an enum's spellings.
fn named<T: Copy>(raw: Raw<'_>, all: &[T], name: fn(T) -> &'static str) -> Result<T, String> {
    let text = string(raw)?;
    all.iter().copied().find(|value| name(*value) == text).ok_or_else(|| {
        let names: Vec<&str> = all.iter().map(|value| name(*value)).collect();
        format!("expected one of {}", names.join(", "))
    })
}

/// A TOML array of strings, or comma-separated text.
fn string_list(raw: Raw<'_>) -> Result<Vec<String>, String> {
    match raw {
        Raw::Toml(toml::Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                toml::Value::String(text) => Ok(text.clone()),
                other => Err(format!("expected strings, found {}", type_name(other))),
            })
            .collect(),
        Raw::Toml(other) => {
            Err(format!("expected an array of strings, found {}", type_name(other)))
        }
        Raw::Text(text) if text.trim().is_empty() => Ok(Vec::new()),
        Raw::Text(text) => Ok(text.split(',').map(|item| item.trim().to_owned()).collect()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn toml_value(text: &str) -> toml::Value {
        let table: toml::Table = toml::from_str(&format!("v = {text}")).unwrap();
        table["v"].clone()
    }

    #[test]
    fn every_listed_key_is_settable() {
        let defaults = QueueConfig::default();
        for key in QUEUE_KEYS {
            let mut queue = defaults.clone();
            let raw = match *key {
                "strategy" => "fifo",
                "session_header" => "X-Other",
                "session_sources" => "body:conversation",
                "derive_sessions" => "false",
                k if k.contains("timeout") || k.contains("period") || k.contains("wait") => "7s",
                _ => "7",
            };
            queue.set(key, Raw::Text(raw)).unwrap();
            assert_ne!(queue, defaults, "{key}");
        }
        let mut server = ServerConfig::default();
        for key in SERVER_KEYS {
            assert_ne!(server.set(key, Raw::Text("")), Err(SetError::UnknownKey), "{key}");
        }
        for key in TLS_KEYS {
            let (key, raw) = (format!("tls.{key}"), Raw::Text("/etc/x.pem"));
            assert_ne!(server.set(&key, raw), Err(SetError::UnknownKey), "{key}");
        }
        assert!(server.tls.files().is_some());
        let mut upstream = UpstreamConfig::default();
        for key in UPSTREAM_KEYS {
            assert_ne!(upstream.set(key, Raw::Text("")), Err(SetError::UnknownKey), "{key}");
        }
        let mut rate_limit = RateLimitConfig::default();
        for key in RATE_LIMIT_KEYS {
            assert_ne!(rate_limit.set(key, Raw::Text("")), Err(SetError::UnknownKey), "{key}");
        }
        let mut tenant = TenantConfig::new("t", Vec::new());
        for key in TENANT_KEYS {
            assert_ne!(tenant.set(key, Raw::Text("")), Err(SetError::UnknownKey), "{key}");
        }
    }

    #[test]
    fn digests_are_hex_of_either_case_and_an_empty_admin_token_is_off() {
        let upper = "BA7816BF8F01CFEA414140DE5DAE2223B00361A396177A9CB410FF61F20015AD";
        let mut tenant = TenantConfig::new("t", Vec::new());
        tenant.set("api_key_sha256", Raw::Text(&format!(" {upper} "))).unwrap();
        assert_eq!(tenant.api_key_sha256, vec![crate::credential::digest(b"abc")]);
        let error = tenant.set("api_key_sha256", Raw::Text(&format!("{upper},wp_abc")));
        let Err(SetError::BadValue(reason)) = error else { panic!("{error:?}") };
        assert!(reason.starts_with("entry 1: expected 64 hex digits"), "{reason}");
        assert!(reason.contains("never the token"), "{reason}");
        let mut server = ServerConfig::default();
        server.set("admin_token_sha256", Raw::Text(upper)).unwrap();
        assert!(server.admin_token_sha256.is_some());
        server.set("admin_token_sha256", Raw::Text("")).unwrap();
        assert_eq!(server.admin_token_sha256, None);
    }

    #[test]
    fn integers_refuse_negative_large_and_wrong_types() {
        let mut queue = QueueConfig::default();
        fn bad(queue: &mut QueueConfig, raw: Raw<'_>) -> String {
            match queue.set("max_overtakes", raw) {
                Err(SetError::BadValue(reason)) => reason,
                other => panic!("{other:?}"),
            }
        }
        assert_eq!(bad(&mut queue, Raw::Toml(&toml_value("-1"))), "must not be negative");
        assert!(bad(&mut queue, Raw::Toml(&toml_value("4294967296"))).starts_with("too large"));
        assert_eq!(
            bad(&mut queue, Raw::Toml(&toml_value("\"4\""))),
            "expected an integer, found a string"
        );
        assert_eq!(bad(&mut queue, Raw::Text("four")), "not an unsigned integer");
        assert_eq!(bad(&mut queue, Raw::Text("-4")), "not an unsigned integer");
        assert!(bad(&mut queue, Raw::Text("99999999999999999999")).starts_with("too large"));
        queue.set("max_overtakes", Raw::Text(" 4 ")).unwrap();
        assert_eq!(queue.max_overtakes, 4);
    }

    #[test]
    fn booleans_accept_go_spellings_from_text() {
        for (text, expected) in
            [("true", true), ("1", true), ("T", true), ("False", false), ("0", false)]
        {
            assert_eq!(boolean(Raw::Text(text)), Ok(expected), "{text}");
        }
        assert!(boolean(Raw::Text("yes")).is_err());
        assert!(boolean(Raw::Toml(&toml_value("\"true\""))).is_err());
    }

    #[test]
    fn lists_come_from_arrays_or_commas() {
        let array = toml_value("[\"a:1\", \"b:2\"]");
        assert_eq!(string_list(Raw::Toml(&array)), Ok(vec!["a:1".to_owned(), "b:2".to_owned()]));
        assert_eq!(
            string_list(Raw::Text("a:1, b:2")),
            Ok(vec!["a:1".to_owned(), "b:2".to_owned()])
        );
        assert!(string_list(Raw::Toml(&toml_value("[1]"))).is_err());
    }

    #[test]
    fn enums_list_their_spellings() {
        let mut model = ModelConfig::new("m", Vec::new());
        let error = model.set("routing", Raw::Text("random")).unwrap_err();
        assert_eq!(
            error,
            SetError::BadValue(
                "expected one of session-affinity, prefix-cost, least-inflight, round-robin"
                    .to_owned()
            )
        );
    }

    #[test]
    fn unknown_keys_suggest_close_names() {
        let error = unknown_key("", "server.lisen");
        assert_eq!(
            error.message(),
            "unknown key \"server.lisen\" (did you mean \"server.listen\"?)"
        );
        let error = unknown_key("model \"m\": ", "backend");
        assert_eq!(
            error.message(),
            "model \"m\": unknown key \"backend\" (did you mean \"backends\"?)"
        );
        let error = unknown_key("", "zzz");
        assert_eq!(error.message(), "unknown key \"zzz\"");
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
