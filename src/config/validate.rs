//! Validation of a fully layered configuration: ranges, uniqueness and cross-key rules.
//! The first broken rule is reported as `<context><key> = <value>: <reason>`, e.g.
//! `model "llama": queue.inflight_per_backend = 0: must be at least 1`.
//!
//! Upper bounds keep every structure the scheduler preallocates from the config (heap, tracker,
//! index, pools) at a size a machine can hold: "put a limit on everything" (STYLE.md).

use std::fmt::Display;
use std::net::Ipv6Addr;
use std::time::Duration;

use super::duration::format_duration;
use super::sessions::{self, is_header_name};
use super::{Config, ConfigError, ConfigErrorKind, ModelConfig, QueueConfig};
use super::{RateLimitConfig, ServerConfig, Setting, TenantConfig, TlsConfig, UpstreamConfig};
use crate::credential::hex;

/// Most backends one model may list (backend indices are 16-bit).
pub(crate) const BACKENDS_MAX: usize = 65_535;
/// Most queued requests, and most tracked sessions, per model (24-bit indices).
pub(crate) const QUEUED_MAX: u32 = 16_777_216;
/// Most event-loop shards.
pub(crate) const SHARDS_MAX: u32 = 1_024;
/// Longest `server.busy_poll`: a shard spins its core that long before each sleep.
pub(crate) const BUSY_POLL_MAX: Duration = Duration::from_millis(1);
/// Most `[[tenant]]` tables (tenant indices are 16-bit, and a live reload keeps removed ones).
pub(crate) const TENANTS_MAX: usize = 4_096;
/// Most API keys per tenant (two are enough to rotate one).
pub(crate) const KEYS_PER_TENANT_MAX: usize = 64;
/// Largest fair-share weight.
pub(crate) const WEIGHT_MAX: u32 = 1_000;
/// Largest `tokens_per_minute` and `requests_per_minute`: a bucket's arithmetic (a minute's
/// allowance times a tick rate) stays within 64 bits.
pub(crate) const TOKENS_PER_MINUTE_MAX: u64 = 1_000_000_000_000;
pub(crate) const REQUESTS_PER_MINUTE_MAX: u64 = 1_000_000_000;
/// Longest tenant name.
pub(crate) const TENANT_NAME_BYTES_MAX: usize = 64;

type Check = Result<(), ConfigError>;

/// Checks the whole configuration.
pub(crate) fn config(config: &Config) -> Check {
    if config.models.is_empty() {
        return Err(ConfigError::new(
            ConfigErrorKind::MissingKey,
            "no models configured: add a [[model]] table with a name and backends",
        ));
    }
    server(&config.server)?;
    upstream(&config.upstream)?;
    rate_limit(&config.rate_limit)?;
    tenants(&config.tenants)?;
    queue("", &config.queue)?;
    for (index, model) in config.models.iter().enumerate() {
        let context = format!("model {:?}: ", model.name);
        let duplicate = config.models[..index].iter().position(|m| m.name == model.name);
        if let Some(first) = duplicate {
            let reason = format!("the same name as model #{}", first + 1);
            return Err(invalid(
                &format!("model #{}: ", index + 1),
                "name",
                quoted(&model.name),
                &reason,
            ));
        }
        self::model(&context, model)?;
        queue(&context, &model.queue)?;
    }
    Ok(())
}

/// `<context><key> = <shown>: <reason>`.
fn invalid(context: &str, key: &str, shown: impl Display, reason: &str) -> ConfigError {
    ConfigError::new(ConfigErrorKind::Invalid, format!("{context}{key} = {shown}: {reason}"))
}

fn quoted(text: &str) -> String {
    format!("{text:?}")
}

fn shown_duration(duration: Duration) -> String {
    format!("\"{}\"", format_duration(duration))
}

/// `min <= value <= max`.
fn range<T: PartialOrd + Display + Copy>(
    context: &str,
    key: &str,
    value: T,
    min: T,
    max: T,
) -> Check {
    if value < min {
        return Err(invalid(context, key, value, &format!("must be at least {min}")));
    }
    if value > max {
        return Err(invalid(context, key, value, &format!("must be at most {max}")));
    }
    Ok(())
}

fn nonzero(context: &str, key: &str, value: Duration) -> Check {
    if value.is_zero() {
        return Err(invalid(context, key, shown_duration(value), "must be greater than zero"));
    }
    Ok(())
}

fn server(server: &ServerConfig) -> Check {
    let s = "server.";
    if server.admin_listen == server.listen && server.listen.port() != 0 {
        let shown = quoted(&server.admin_listen.to_string());
        return Err(invalid(s, "admin_listen", shown, "must differ from server.listen"));
    }
    range(s, "shards", server.shards, 0, SHARDS_MAX)?;
    if server.busy_poll > BUSY_POLL_MAX {
        let shown = shown_duration(server.busy_poll);
        return Err(invalid(s, "busy_poll", shown, "must be at most \"1ms\" (it spins a core)"));
    }
    range(s, "max_connections", server.max_connections, 1, QUEUED_MAX)?;
    range(s, "max_header_bytes", server.max_header_bytes, 1_024, 1_048_576)?;
    range(s, "max_body_bytes", server.max_body_bytes, 1, u64::MAX)?;
    if server.max_buffered_bytes < server.max_body_bytes {
        let reason = format!(
            "must be at least server.max_body_bytes ({}), or no largest body could queue",
            server.max_body_bytes
        );
        return Err(invalid(s, "max_buffered_bytes", server.max_buffered_bytes, &reason));
    }
    nonzero(s, "header_timeout", server.header_timeout)?;
    nonzero(s, "body_timeout", server.body_timeout)?;
    nonzero(s, "idle_timeout", server.idle_timeout)?;
    tls(&server.tls)
}

/// `[server.tls]`: both files or neither (issue \[11\]). Whether they hold a usable pair is
/// checked when they are read (`server::tls`), at start and on every reload.
fn tls(tls: &TlsConfig) -> Check {
    let shown = |path: &std::path::Path| quoted(&path.display().to_string());
    match (&tls.cert, &tls.key) {
        (Some(cert), None) => Err(invalid(
            "server.",
            "tls.cert",
            shown(cert),
            "server.tls.key is not set: set both the certificate and its key, or neither",
        )),
        (None, Some(key)) => Err(invalid(
            "server.",
            "tls.key",
            shown(key),
            "server.tls.cert is not set: set both the certificate and its key, or neither",
        )),
        _ => Ok(()),
    }
}

fn upstream(upstream: &UpstreamConfig) -> Check {
    let s = "upstream.";
    nonzero(s, "connect_timeout", upstream.connect_timeout)?;
    nonzero(s, "header_timeout", upstream.header_timeout)?;
    nonzero(s, "read_timeout", upstream.read_timeout)?;
    range(s, "max_retries", upstream.max_retries, 0, 64)?;
    range(s, "max_idle_per_backend", upstream.max_idle_per_backend, 0, 65_536)?;
    nonzero(s, "metrics_interval", upstream.metrics_interval)?;
    if upstream.metrics_stale_after < upstream.metrics_interval {
        let reason = format!(
            "must be at least upstream.metrics_interval ({})",
            format_duration(upstream.metrics_interval)
        );
        let shown = shown_duration(upstream.metrics_stale_after);
        return Err(invalid(s, "metrics_stale_after", shown, &reason));
    }
    let path = &upstream.health_path;
    if !path.starts_with('/') || path.chars().any(|c| c.is_whitespace() || c.is_control()) {
        let reason = "must be an absolute path starting with \"/\", without spaces";
        return Err(invalid(s, "health_path", quoted(path), reason));
    }
    Ok(())
}

/// `[rate_limit]`: `redis_url` is checked whatever the store, so that a typo shows before the
/// store is switched.
fn rate_limit(rate_limit: &RateLimitConfig) -> Check {
    if let Err(reason) = check_redis_url(&rate_limit.redis_url) {
        return Err(invalid("rate_limit.", "redis_url", quoted(&rate_limit.redis_url), &reason));
    }
    Ok(())
}

/// `redis://[[user]:password@]host[:port][/db]`, the host a name or an address (IPv6 in
/// brackets), the port 1 to 65535, the database a number.
fn check_redis_url(url: &str) -> Result<(), String> {
    let rest = url.strip_prefix("redis://").ok_or("expected a redis:// URL")?;
    let (authority, db) = rest.split_once('/').unwrap_or((rest, ""));
    if !db.is_empty() && !db.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("database {db:?} is not a number"));
    }
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, host)| host);
    let (host, port) = match host_port.strip_prefix('[') {
        Some(bracketed) => match bracketed.split_once(']') {
            Some((host, rest)) => {
                host.parse::<Ipv6Addr>().map_err(|_| format!("{host:?} is not an IPv6 address"))?;
                (host, rest.strip_prefix(':'))
            }
            None => return Err("expected [IPv6] in brackets".to_owned()),
        },
        None => match host_port.rsplit_once(':') {
            Some((host, port)) => (host, Some(port)),
            None => (host_port, None),
        },
    };
    let name_ok = |h: &str| h.bytes().all(|b| b.is_ascii_alphanumeric() || b"-._".contains(&b));
    if host.is_empty() || !(host_port.starts_with('[') || name_ok(host)) {
        return Err(format!("{host:?} is not a host name or IP address"));
    }
    match port.map(|p| (p, p.parse::<u16>())) {
        None => Ok(()),
        Some((p, Ok(n))) if n > 0 && n.to_string() == p => Ok(()),
        Some((p, _)) => Err(format!("port {p:?} is not a number from 1 to 65535")),
    }
}

/// Every `[[tenant]]`: names, weights and limits, and no key digest listed twice (within a
/// tenant or across tenants: one key must name one tenant).
fn tenants(tenants: &[TenantConfig]) -> Check {
    if tenants.len() > TENANTS_MAX {
        let shown = format!("[{} tables]", tenants.len());
        return Err(invalid("", "tenant", shown, &format!("at most {TENANTS_MAX} tenants")));
    }
    let mut seen: hashbrown::HashMap<[u8; 32], (usize, usize)> = hashbrown::HashMap::new();
    for (index, tenant) in tenants.iter().enumerate() {
        let context = format!("tenant {:?}: ", tenant.name);
        if let Err(reason) = check_tenant_name(&tenant.name) {
            return Err(invalid(&context, "name", quoted(&tenant.name), &reason));
        }
        if let Some(first) = tenants[..index].iter().position(|t| t.name == tenant.name) {
            let reason = format!("the same name as tenant #{}", first + 1);
            let context = format!("tenant #{}: ", index + 1);
            return Err(invalid(&context, "name", quoted(&tenant.name), &reason));
        }
        tenant_values(&context, tenant)?;
        for (key, digest) in tenant.api_key_sha256.iter().enumerate() {
            if let Some(&(other, other_key)) = seen.get(digest) {
                let reason = format!(
                    "the same digest as tenant {:?}'s api_key_sha256[{other_key}]: a key names one \
                     tenant",
                    tenants[other].name
                );
                let at = format!("api_key_sha256[{key}]");
                return Err(invalid(&context, &at, quoted(&hex(digest)), &reason));
            }
            seen.insert(*digest, (index, key));
        }
    }
    Ok(())
}

/// A tenant's keys count, weight and limits.
fn tenant_values(context: &str, tenant: &TenantConfig) -> Check {
    let keys = tenant.api_key_sha256.len();
    if keys == 0 {
        return Err(invalid(context, "api_key_sha256", "[]", "must list at least one digest"));
    }
    if keys > KEYS_PER_TENANT_MAX {
        let reason = format!("at most {KEYS_PER_TENANT_MAX} keys per tenant");
        return Err(invalid(context, "api_key_sha256", format!("[{keys} entries]"), &reason));
    }
    range(context, "weight", tenant.weight, 1, WEIGHT_MAX)?;
    range(context, "tokens_per_minute", tenant.tokens_per_minute, 0, TOKENS_PER_MINUTE_MAX)?;
    range(context, "requests_per_minute", tenant.requests_per_minute, 0, REQUESTS_PER_MINUTE_MAX)
}

/// A tenant name is a metrics label value, a log field and (for the rate limits) part of a
/// Redis key: 1 to 64 ASCII letters, digits, `-`, `_` and `.`.
fn check_tenant_name(name: &str) -> Result<(), String> {
    if name.is_empty() {
        return Err("must not be empty".to_owned());
    }
    if name.len() > TENANT_NAME_BYTES_MAX {
        return Err(format!("at most {TENANT_NAME_BYTES_MAX} characters"));
    }
    if !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b)) {
        return Err("only ASCII letters, digits, \"-\", \"_\" and \".\"".to_owned());
    }
    Ok(())
}

/// A queue table; `context` is empty for `[queue]` and `model "NAME": ` for a model's.
fn queue(context: &str, queue: &QueueConfig) -> Check {
    let c = context;
    range(c, "queue.max_queued", queue.max_queued, 1, QUEUED_MAX)?;
    if let Setting::Fixed(cap) = queue.inflight_per_backend {
        range(c, "queue.inflight_per_backend", cap, 1, 1_048_576)?;
    }
    if !is_header_name(&queue.session_header) {
        let reason = "not a valid HTTP header name (letters, digits and !#$%&'*+-.^_`|~)";
        return Err(invalid(c, "queue.session_header", quoted(&queue.session_header), reason));
    }
    if let Some(entries) = &queue.session_sources {
        if let Err((at, reason)) = sessions::parse_list(entries) {
            let (key, shown) = match at {
                Some(i) => (format!("queue.session_sources[{i}]"), quoted(&entries[i])),
                None => {
                    ("queue.session_sources".to_owned(), format!("[{} entries]", entries.len()))
                }
            };
            return Err(invalid(c, &key, shown, &reason));
        }
    }
    range(c, "queue.max_sessions", queue.max_sessions, 1, QUEUED_MAX)?;
    range(c, "queue.prefix_block_bytes", queue.prefix_block_bytes, 16, 65_536)?;
    if let Setting::Fixed(blocks) = queue.prefix_index_blocks {
        range(c, "queue.prefix_index_blocks", blocks, 1, 67_108_864)?;
    }
    range(c, "queue.placement_scan_max", queue.placement_scan_max, 1, 65_536)
}

/// A model's own keys (not its queue).
fn model(context: &str, model: &ModelConfig) -> Check {
    if model.name.trim().is_empty() {
        return Err(invalid(context, "name", quoted(&model.name), "must not be empty"));
    }
    if let Some(upstream_model) = &model.upstream_model {
        if upstream_model.trim().is_empty() {
            let reason = "must not be empty (leave the key out for no rewrite)";
            return Err(invalid(context, "upstream_model", quoted(upstream_model), reason));
        }
    }
    backends(context, &model.backends)
}

fn backends(context: &str, backends: &[String]) -> Check {
    if backends.is_empty() {
        return Err(invalid(context, "backends", "[]", "must list at least one backend"));
    }
    if backends.len() > BACKENDS_MAX {
        let shown = format!("[{} entries]", backends.len());
        let reason = format!("at most {BACKENDS_MAX} backends per model");
        return Err(invalid(context, "backends", shown, &reason));
    }
    let mut seen = hashbrown::HashMap::with_capacity(backends.len());
    for (index, backend) in backends.iter().enumerate() {
        let key = format!("backends[{index}]");
        if let Err(reason) = check_backend(backend) {
            return Err(invalid(context, &key, quoted(backend), &reason));
        }
        if let Some(first) = seen.insert(backend.to_ascii_lowercase(), index) {
            let reason = format!("the same backend as backends[{first}]");
            return Err(invalid(context, &key, quoted(backend), &reason));
        }
    }
    Ok(())
}

/// `host:port` with a port in 1..=65535; an IPv6 host goes in brackets.
fn check_backend(backend: &str) -> Result<(), String> {
    if backend.contains("://") || backend.contains('/') {
        return Err("expected host:port, without a scheme or path".to_owned());
    }
    let (host, port) = match backend.strip_prefix('[') {
        Some(bracketed) => {
            let (host, port) = bracketed.split_once("]:").ok_or("expected [IPv6]:port")?;
            host.parse::<Ipv6Addr>().map_err(|_| format!("{host:?} is not an IPv6 address"))?;
            (host, port)
        }
        None => backend.rsplit_once(':').ok_or("expected host:port (the port is missing)")?,
    };
    let host_ok = !host.is_empty()
        && (backend.starts_with('[')
            || host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_'));
    if !host_ok {
        return Err(format!("{host:?} is not a host name or IP address (IPv6 needs [brackets])"));
    }
    match port.parse::<u16>() {
        Ok(number) if number > 0 && number.to_string() == port => Ok(()),
        _ => Err(format!("port {port:?} is not a number from 1 to 65535")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::ModelConfig;

    fn valid() -> Config {
        Config::with_models(vec![ModelConfig::new("llama", vec!["127.0.0.1:8001".to_owned()])])
    }

    /// The message of validating `valid()` after `edit`.
    fn refused(edit: impl FnOnce(&mut Config)) -> String {
        let mut config = valid();
        edit(&mut config);
        let error = config.validate().expect_err("should be refused");
        assert_eq!(error.kind() == ConfigErrorKind::Invalid, !config.models.is_empty());
        error.to_string()
    }

    #[test]
    fn defaults_with_one_model_are_valid() {
        valid().validate().unwrap();
    }

    #[test]
    fn needs_a_model() {
        assert!(refused(|c| c.models.clear()).starts_with("no models configured"));
    }

    #[test]
    fn model_names_are_unique_and_non_empty() {
        assert_eq!(
            refused(|c| c.models[0].name.clear()),
            "model \"\": name = \"\": must not be empty"
        );
        let message = refused(|c| c.models.push(c.models[0].clone()));
        assert_eq!(message, "model #2: name = \"llama\": the same name as model #1");
    }

    #[test]
    fn upstream_model_is_not_empty() {
        let message = refused(|c| c.models[0].upstream_model = Some(String::new()));
        assert!(message.starts_with("model \"llama\": upstream_model = \"\": must not be empty"));
    }

    #[test]
    fn prefix_cost_keys_are_bounded() {
        let message = refused(|c| c.queue.prefix_block_bytes = 8);
        assert!(message.contains("queue.prefix_block_bytes = 8"), "{message}");
        let message = refused(|c| c.queue.placement_scan_max = 0);
        assert!(message.contains("queue.placement_scan_max = 0"), "{message}");
    }

    #[test]
    fn backends_are_host_port_unique_and_bounded() {
        assert_eq!(
            refused(|c| c.models[0].backends.clear()),
            "model \"llama\": backends = []: must list at least one backend"
        );
        for bad in [
            "127.0.0.1",
            "127.0.0.1:0",
            "127.0.0.1:65536",
            "h:80x",
            ":80",
            "::1:80",
            "[::1:80",
            "[zz]:80",
            "http://h:80",
            "h:+80",
            "h:080",
            "a b:80",
        ] {
            let message = refused(|c| c.models[0].backends = vec![bad.to_owned()]);
            assert!(
                message.starts_with(&format!("model \"llama\": backends[0] = {bad:?}: ")),
                "{message}"
            );
        }
        for good in ["localhost:1", "[::1]:8000", "engine-0.svc.cluster.local:65535", "10.0.0.1:80"]
        {
            assert!(check_backend(good).is_ok(), "{good}");
        }
        let message = refused(|c| c.models[0].backends.push("127.0.0.1:8001".to_owned()));
        assert_eq!(
            message,
            "model \"llama\": backends[1] = \"127.0.0.1:8001\": the same backend as backends[0]"
        );
        let message = refused(|c| {
            c.models[0].backends = (0..=BACKENDS_MAX).map(|i| format!("h{i}:80")).collect();
        });
        assert!(message.contains("at most 65535 backends"), "{message}");
    }

    #[test]
    fn queue_ranges() {
        let message = refused(|c| c.models[0].queue.inflight_per_backend = Setting::Fixed(0));
        assert_eq!(message, "model \"llama\": queue.inflight_per_backend = 0: must be at least 1");
        assert_eq!(refused(|c| c.queue.max_queued = 0), "queue.max_queued = 0: must be at least 1");
        assert_eq!(
            refused(|c| c.queue.max_queued = QUEUED_MAX + 1),
            "queue.max_queued = 16777217: must be at most 16777216"
        );
        assert_eq!(
            refused(|c| c.queue.max_sessions = 0),
            "queue.max_sessions = 0: must be at least 1"
        );
        assert_eq!(
            refused(|c| c.queue.max_sessions = QUEUED_MAX + 1),
            "queue.max_sessions = 16777217: must be at most 16777216"
        );
        assert_eq!(
            refused(|c| c.queue.prefix_block_bytes = 15),
            "queue.prefix_block_bytes = 15: must be at least 16"
        );
        assert!(refused(|c| c.queue.prefix_index_blocks = Setting::Fixed(0))
            .starts_with("queue.prefix_index_blocks = 0"));
        assert!(
            refused(|c| c.queue.placement_scan_max = 0).starts_with("queue.placement_scan_max = 0")
        );
    }

    #[test]
    fn session_header_is_a_header_name() {
        for bad in ["", "X Session", "X-Session:", "Sessión"] {
            let message = refused(|c| c.models[0].queue.session_header = bad.to_owned());
            assert!(
                message.starts_with(&format!(
                    "model \"llama\": queue.session_header = {bad:?}: not a valid HTTP header name"
                )),
                "{message}"
            );
        }
        assert!(is_header_name("x-session-id"));
    }

    #[test]
    fn session_sources_name_the_bad_entry() {
        let set = |entries: &[&str]| {
            let entries: Vec<String> = entries.iter().map(|e| (*e).to_owned()).collect();
            move |c: &mut Config| c.models[0].queue.session_sources = Some(entries.clone())
        };
        assert_eq!(
            refused(set(&["header:X-A", "X-B"])),
            "model \"llama\": queue.session_sources[1] = \"X-B\": \
             expected \"header:NAME\" or \"body:FIELD\""
        );
        assert_eq!(
            refused(set(&["body:k", "body:k"])),
            "model \"llama\": queue.session_sources[1] = \"body:k\": \
             the same source as session_sources[0]"
        );
        assert!(refused(set(&["header:"])).contains("empty header name"));
        assert!(refused(set(&["header:X:Y"])).contains("not a valid HTTP header name"));
        let many: Vec<String> = (0..17).map(|i| format!("body:f{i}")).collect();
        let message = refused(move |c| c.queue.session_sources = Some(many.clone()));
        assert_eq!(message, "queue.session_sources = [17 entries]: at most 16 entries, found 17");
    }

    #[test]
    fn server_rules() {
        assert_eq!(
            refused(|c| c.server.max_header_bytes = 1023),
            "server.max_header_bytes = 1023: must be at least 1024"
        );
        let message = refused(|c| c.server.max_connections = 0);
        assert!(message.starts_with("server.max_connections = 0"), "{message}");
        assert!(refused(|c| c.server.shards = 1025)
            .starts_with("server.shards = 1025: must be at most 1024"));
        assert!(refused(|c| c.server.max_body_bytes = 0).starts_with("server.max_body_bytes = 0"));
        assert!(refused(|c| c.server.max_buffered_bytes = 1)
            .starts_with("server.max_buffered_bytes = 1: must be at least server.max_body_bytes"));
        assert_eq!(
            refused(|c| c.server.header_timeout = Duration::ZERO),
            "server.header_timeout = \"0s\": must be greater than zero"
        );
        assert!(
            refused(|c| c.server.body_timeout = Duration::ZERO).starts_with("server.body_timeout")
        );
        assert!(
            refused(|c| c.server.idle_timeout = Duration::ZERO).starts_with("server.idle_timeout")
        );
        let message = refused(|c| c.server.admin_listen = c.server.listen);
        assert_eq!(
            message,
            "server.admin_listen = \"127.0.0.1:8080\": must differ from server.listen"
        );
    }

    fn tenant(name: &str, keys: &[&[u8]]) -> TenantConfig {
        let digests = keys.iter().map(|k| crate::credential::digest(k)).collect();
        TenantConfig::new(name, digests)
    }

    #[test]
    fn tenant_names_are_label_values_and_unique() {
        for (bad, reason) in [
            ("", "must not be empty"),
            ("search team", "only ASCII letters"),
            ("équipe", "only ASCII letters"),
            ("a\"b", "only ASCII letters"),
        ] {
            let message = refused(|c| c.tenants = vec![tenant(bad, &[b"k"])]);
            let expected = format!("tenant {bad:?}: name = {bad:?}: {reason}");
            assert!(message.starts_with(&expected), "{message}");
        }
        let long = "a".repeat(65);
        let message = refused(|c| c.tenants = vec![tenant(&long, &[b"k"])]);
        assert!(message.ends_with("at most 64 characters"), "{message}");
        let mut ok = valid();
        ok.tenants = vec![tenant("search-team_2.prod", &[b"k"]), tenant(&"b".repeat(64), &[b"j"])];
        ok.validate().unwrap();
        let message = refused(|c| c.tenants = vec![tenant("a", &[b"k"]), tenant("a", &[b"j"])]);
        assert_eq!(message, "tenant #2: name = \"a\": the same name as tenant #1");
    }

    #[test]
    fn a_digest_names_one_tenant() {
        let k = hex(&crate::credential::digest(b"k"));
        let message = refused(|c| {
            c.tenants =
                vec![tenant("a", &[b"x", b"k"]), tenant("b", &[b"y"]), tenant("c", &[b"k"])];
        });
        assert_eq!(
            message,
            format!(
                "tenant \"c\": api_key_sha256[0] = \"{k}\": the same digest as tenant \"a\"'s \
                 api_key_sha256[1]: a key names one tenant"
            )
        );
        let message = refused(|c| c.tenants = vec![tenant("a", &[b"k", b"x", b"k"])]);
        assert!(
            message.starts_with(&format!(
                "tenant \"a\": api_key_sha256[2] = \"{k}\": the same digest as tenant \"a\"'s \
                 api_key_sha256[0]"
            )),
            "{message}"
        );
    }

    #[test]
    fn tenant_keys_weights_and_limits_are_bounded() {
        let message = refused(|c| c.tenants = vec![tenant("a", &[])]);
        assert_eq!(message, "tenant \"a\": api_key_sha256 = []: must list at least one digest");
        let many: Vec<Vec<u8>> = (0..65u8).map(|i| vec![i]).collect();
        let refs: Vec<&[u8]> = many.iter().map(Vec::as_slice).collect();
        let message = refused(|c| c.tenants = vec![tenant("a", &refs)]);
        assert!(message.contains("at most 64 keys per tenant"), "{message}");
        let with = |edit: fn(&mut TenantConfig)| {
            move |c: &mut Config| {
                let mut t = tenant("a", &[b"k"]);
                edit(&mut t);
                c.tenants = vec![t];
            }
        };
        assert_eq!(refused(with(|t| t.weight = 0)), "tenant \"a\": weight = 0: must be at least 1");
        assert_eq!(
            refused(with(|t| t.weight = 1001)),
            "tenant \"a\": weight = 1001: must be at most 1000"
        );
        assert!(refused(with(|t| t.tokens_per_minute = TOKENS_PER_MINUTE_MAX + 1))
            .starts_with("tenant \"a\": tokens_per_minute = 1000000000001: must be at most"));
        assert!(refused(with(|t| t.requests_per_minute = REQUESTS_PER_MINUTE_MAX + 1))
            .starts_with("tenant \"a\": requests_per_minute = 1000000001: must be at most"));
        let message = refused(|c| {
            c.tenants = (0..=TENANTS_MAX).map(|i| tenant(&format!("t{i}"), &[b"k"])).collect();
        });
        assert_eq!(message, "tenant = [4097 tables]: at most 4096 tenants");
    }

    #[test]
    fn redis_urls_are_checked_whatever_the_store() {
        for good in [
            "redis://127.0.0.1:6379",
            "redis://localhost",
            "redis://:secret@cache.internal:6380/2",
            "redis://user:p%40ss@[::1]:6379/0",
            "redis://[::1]",
        ] {
            assert_eq!(check_redis_url(good), Ok(()), "{good}");
        }
        for (bad, reason) in [
            ("127.0.0.1:6379", "expected a redis:// URL"),
            ("rediss://h:1", "expected a redis:// URL"),
            ("redis://", "is not a host name"),
            ("redis://h:0", "port \"0\""),
            ("redis://h:x", "port \"x\""),
            ("redis://h/db", "database \"db\""),
            ("redis://h h:1", "is not a host name"),
            ("redis://[zz]:1", "is not an IPv6 address"),
        ] {
            let message = refused(|c| c.rate_limit.redis_url = bad.to_owned());
            assert!(message.starts_with(&format!("rate_limit.redis_url = {bad:?}: ")), "{message}");
            assert!(message.contains(reason), "{bad}: {message}");
        }
    }

    #[test]
    fn upstream_rules() {
        assert_eq!(
            refused(|c| c.upstream.connect_timeout = Duration::ZERO),
            "upstream.connect_timeout = \"0s\": must be greater than zero"
        );
        assert!(refused(|c| c.upstream.header_timeout = Duration::ZERO)
            .starts_with("upstream.header_timeout"));
        assert!(refused(|c| c.upstream.read_timeout = Duration::ZERO)
            .starts_with("upstream.read_timeout = \"0s\": must be greater than zero"));
        assert!(refused(|c| c.upstream.metrics_interval = Duration::ZERO)
            .starts_with("upstream.metrics_interval"));
        let message = refused(|c| c.upstream.metrics_stale_after = Duration::from_millis(500));
        let expected = "upstream.metrics_stale_after = \"500ms\": \
                        must be at least upstream.metrics_interval (1s)";
        assert_eq!(message, expected);
        assert!(refused(|c| c.upstream.max_retries = 65).starts_with("upstream.max_retries = 65"));
        assert!(refused(|c| c.upstream.health_path = "health".to_owned())
            .starts_with("upstream.health_path = \"health\""));
    }
}
