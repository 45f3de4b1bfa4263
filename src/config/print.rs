//! Writes the effective configuration as TOML: every key of every section, in the order of
//! SPEC 4, and each model's whole effective queue as its `[model.queue]` table, so that the
//! output loads back to an equal [`Config`] and shows exactly what a process would run with.

use std::fmt::Write;
use std::time::Duration;

use super::duration::format_duration;
use super::{Config, ModelConfig, QueueConfig, ServerConfig, Setting, TenantConfig};
use super::{RateLimitConfig, UpstreamConfig};
use crate::credential::hex;
use crate::scheduler::cache_model::INDEX_DEFAULT_BLOCKS;
use crate::scheduler::estimate::{
    BUDGET_UNLEARNED, INFLIGHT_MAX, INFLIGHT_UNLEARNED, WAITING_TARGET,
};

/// The whole document.
pub(crate) fn config(config: &Config) -> String {
    let mut out = String::with_capacity(4_096);
    out.push_str("# warmpath effective configuration\n");
    server(&mut out, &config.server);
    out.push_str("\n[queue]  # defaults; each model's effective queue is written below it\n");
    queue(&mut out, &config.queue);
    upstream(&mut out, &config.upstream);
    rate_limit(&mut out, &config.rate_limit);
    for tenant_config in &config.tenants {
        tenant(&mut out, tenant_config);
    }
    for model_config in &config.models {
        model(&mut out, model_config);
    }
    out
}

/// What `prefill_tokens_per_backend = "auto"` resolves to, as comment lines.
fn auto_budget(out: &mut String) {
    let _ = writeln!(
        out,
        "#   auto: per backend, starts at {BUDGET_UNLEARNED} estimated tokens and moves so that \
         the engine's own queue\n#   holds {WAITING_TARGET} of warmpath's requests while \
         warmpath holds more (docs/configuration.md)"
    );
}

/// What `inflight_per_backend = "auto"` resolves to, as comment lines.
fn auto_inflight(out: &mut String) {
    let _ = writeln!(
        out,
        "#   auto: per backend, starts at {INFLIGHT_UNLEARNED} and grows while the engine starts \
         every request sent, up to {INFLIGHT_MAX}\n#   (docs/configuration.md)"
    );
}

/// What `prefix_index_blocks = "auto"` resolves to, as comment lines.
fn auto_index(out: &mut String) {
    let _ = writeln!(
        out,
        "#   auto: per backend, the engine's exported KV capacity in prompt blocks \
         ({INDEX_DEFAULT_BLOCKS} when it exports none),\n#   \
         scaled by a calibration against the cache hits the engine reports (docs/configuration.md)"
    );
}

/// A TOML string literal, escaped as TOML requires.
fn string(text: &str) -> String {
    toml::Value::String(text.to_owned()).to_string()
}

fn duration(value: Duration) -> String {
    string(&format_duration(value))
}

/// Appends `key = value`.
fn line(out: &mut String, key: &str, value: impl std::fmt::Display) {
    // Writing to a String cannot fail.
    let _ = writeln!(out, "{key} = {value}");
}

fn server(out: &mut String, server: &ServerConfig) {
    out.push_str("[server]\n");
    line(out, "listen", string(&server.listen.to_string()));
    line(out, "admin_listen", string(&server.admin_listen.to_string()));
    line(out, "shards", server.shards);
    line(out, "pin_cores", server.pin_cores);
    line(out, "busy_poll", duration(server.busy_poll));
    line(out, "max_connections", server.max_connections);
    line(out, "max_header_bytes", server.max_header_bytes);
    line(out, "max_body_bytes", server.max_body_bytes);
    line(out, "max_buffered_bytes", server.max_buffered_bytes);
    line(out, "header_timeout", duration(server.header_timeout));
    line(out, "body_timeout", duration(server.body_timeout));
    line(out, "idle_timeout", duration(server.idle_timeout));
    line(out, "drain_timeout", duration(server.drain_timeout));
    line(out, "access_log", string(&server.access_log.name()));
    line(out, "debug_headers", server.debug_headers);
    let admin_token = server.admin_token_sha256.as_ref().map_or_else(String::new, hex);
    line(out, "admin_token_sha256", string(&admin_token));
    if server.admin_token_sha256.is_none() {
        out.push_str("#   \"\": the admin listener is open (docs/security.md)\n");
    }
    out.push_str("\n[server.tls]\n");
    let path = |path: &Option<std::path::PathBuf>| {
        string(&path.as_deref().map_or_else(String::new, |p| p.to_string_lossy().into_owned()))
    };
    line(out, "cert", path(&server.tls.cert));
    line(out, "key", path(&server.tls.key));
    if server.tls.files().is_none() {
        out.push_str("#   \"\": the main listener speaks plaintext HTTP (docs/security.md)\n");
    }
}

fn rate_limit(out: &mut String, rate_limit: &RateLimitConfig) {
    out.push_str("\n[rate_limit]\n");
    line(out, "store", string(rate_limit.store.name()));
    line(out, "redis_url", string(&rate_limit.redis_url));
    line(out, "default_max_tokens", rate_limit.default_max_tokens);
}

/// A `[[tenant]]`: its key digests (the only form in which keys exist in a configuration).
fn tenant(out: &mut String, tenant: &TenantConfig) {
    out.push_str("\n[[tenant]]\n");
    line(out, "name", string(&tenant.name));
    let digests: Vec<String> = tenant.api_key_sha256.iter().map(|d| string(&hex(d))).collect();
    line(out, "api_key_sha256", format_args!("[{}]", digests.join(", ")));
    line(out, "weight", tenant.weight);
    line(out, "tokens_per_minute", tenant.tokens_per_minute);
    line(out, "requests_per_minute", tenant.requests_per_minute);
}

fn queue(out: &mut String, queue: &QueueConfig) {
    line(out, "strategy", string(queue.strategy.name()));
    line(out, "timeout", duration(queue.timeout));
    line(out, "max_queued", queue.max_queued);
    line(out, "inflight_per_backend", queue.inflight_per_backend);
    if queue.inflight_per_backend == Setting::Auto {
        auto_inflight(out);
    }
    line(out, "prefill_tokens_per_backend", queue.prefill_tokens_per_backend);
    if queue.prefill_tokens_per_backend == Setting::Auto {
        auto_budget(out);
    }
    line(out, "session_header", string(&queue.session_header));
    session_sources(out, queue);
    line(out, "derive_sessions", queue.derive_sessions);
    line(out, "max_sessions", queue.max_sessions);
    line(out, "max_overtakes", queue.max_overtakes);
    line(out, "boosted_streak_max", queue.boosted_streak_max);
    line(out, "grace_period", duration(queue.grace_period));
    line(out, "prefix_block_bytes", queue.prefix_block_bytes);
    line(out, "prefix_index_blocks", queue.prefix_index_blocks);
    if queue.prefix_index_blocks == Setting::Auto {
        auto_index(out);
    }
    line(out, "placement_scan_max", queue.placement_scan_max);
    line(out, "cost_slack_tokens", queue.cost_slack_tokens);
    line(out, "affinity_wait_max", duration(queue.affinity_wait_max));
}

/// `session_sources = [...]` when set; unset, the default list it resolves to as a comment (so
/// that the output still loads back to an unset key, which follows `session_header`).
fn session_sources(out: &mut String, queue: &QueueConfig) {
    let list = |entries: Vec<String>| {
        let quoted: Vec<String> = entries.iter().map(|entry| string(entry)).collect();
        format!("[{}]", quoted.join(", "))
    };
    match &queue.session_sources {
        Some(entries) => line(out, "session_sources", list(entries.clone())),
        None => {
            let sources = queue.effective_session_sources();
            let entries = sources.iter().map(ToString::to_string).collect();
            let _ = writeln!(
                out,
                "# session_sources unset: the default list, from session_header \
                 (docs/configuration.md):\n#   {}",
                list(entries)
            );
        }
    }
}

fn upstream(out: &mut String, upstream: &UpstreamConfig) {
    out.push_str("\n[upstream]\n");
    line(out, "connect_timeout", duration(upstream.connect_timeout));
    line(out, "header_timeout", duration(upstream.header_timeout));
    line(out, "read_timeout", duration(upstream.read_timeout));
    line(out, "max_retries", upstream.max_retries);
    line(out, "max_idle_per_backend", upstream.max_idle_per_backend);
    line(out, "metrics_interval", duration(upstream.metrics_interval));
    line(out, "metrics_stale_after", duration(upstream.metrics_stale_after));
    line(out, "health_path", string(&upstream.health_path));
    line(out, "eject_after_failures", upstream.eject_after_failures);
}

fn model(out: &mut String, model: &ModelConfig) {
    out.push_str("\n[[model]]\n");
    line(out, "name", string(&model.name));
    if let Some(upstream_model) = &model.upstream_model {
        line(out, "upstream_model", string(upstream_model));
    }
    if let Some(path) = &model.backend_api_key_file {
        line(out, "backend_api_key_file", string(&path.to_string_lossy()));
    }
    line(out, "engine", string(model.engine.name()));
    line(out, "routing", string(model.routing.name()));
    let backends: Vec<String> = model.backends.iter().map(|backend| string(backend)).collect();
    line(out, "backends", format_args!("[{}]", backends.join(", ")));
    out.push_str("\n[model.queue]  # effective\n");
    queue(out, &model.queue);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{file, AccessLog, Engine, Strategy};

    #[test]
    fn output_parses_back_to_the_same_config() {
        let mut config = Config::with_models(vec![
            ModelConfig::new("a \"quoted\" name", vec!["127.0.0.1:1".to_owned()]),
            ModelConfig::new("b", vec!["[::1]:2".to_owned(), "h:3".to_owned()]),
        ]);
        config.server.access_log = AccessLog::File("/var/log/warm path\\x.jsonl".into());
        config.models[0].upstream_model = Some("org/Model-8B".to_owned());
        config.models[1].engine = Engine::Openai;
        config.models[1].queue.strategy = Strategy::Fifo;
        config.models[1].queue.grace_period = Duration::from_micros(1_500);
        config.queue.timeout = Duration::ZERO;
        config.models[1].queue.session_sources =
            Some(vec!["body:conversation_id".to_owned(), "header:X-Conv".to_owned()]);
        config.server.admin_token_sha256 = Some(crate::credential::digest(b"admin"));
        config.rate_limit.store = crate::config::RateLimitStore::Redis;
        config.rate_limit.redis_url = "redis://:pw@cache:6380/1".to_owned();
        let keys = vec![crate::credential::digest(b"a"), crate::credential::digest(b"b")];
        let mut tenant = TenantConfig::new("search-team", keys);
        (tenant.weight, tenant.tokens_per_minute, tenant.requests_per_minute) = (3, 90_000, 60);
        config.tenants = vec![tenant, TenantConfig::new("t2", vec![[0xab; 32]])];
        let text = config.to_toml();
        assert!(text.contains("session_sources = [\"body:conversation_id\", \"header:X-Conv\"]"));
        assert!(text.contains("#   [\"header:X-Session-ID\", \"body:prompt_cache_key\""), "{text}");
        assert!(text.contains(&format!("api_key_sha256 = [\"{}\"]", "ab".repeat(32))), "{text}");
        assert_eq!(file::parse(&text), Ok(config), "{text}");
    }
}
