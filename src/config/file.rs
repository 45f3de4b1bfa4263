//! The TOML file: walks the document's tables and hands each key to its section's setter
//! (`keys.rs`). Any key the setters do not know is an error that names it, wherever it
//! is. The result is not validated yet.

use super::keys::{unknown_key, Raw, SetError, SECTIONS};
use super::{Config, ConfigError, ConfigErrorKind, ModelConfig, QueueConfig, TenantConfig};

/// Parses a whole document into a configuration (defaults for absent keys, not validated).
pub(crate) fn parse(text: &str) -> Result<Config, ConfigError> {
    let document: toml::Table = toml::from_str(text).map_err(|error| {
        let message = error.to_string();
        ConfigError::new(ConfigErrorKind::Syntax, format!("invalid TOML: {}", message.trim_end()))
    })?;
    let mut config = Config::with_models(Vec::new());
    for key in document.keys() {
        if !SECTIONS.contains(&key.as_str()) {
            return Err(unknown_key("", key));
        }
    }
    if let Some(value) = document.get("server") {
        let table = section(value, "server")?;
        // `[server.tls]` is a table of its own; a dotted key written in `[server]` is unknown.
        apply(table, "server", "", |key, raw| match key {
            "tls" => Ok(()),
            _ if key.contains('.') => Err(SetError::UnknownKey),
            _ => config.server.set(key, raw),
        })?;
        if let Some(value) = table.get("tls") {
            let tls = section(value, "server.tls")?;
            apply(tls, "server.tls", "", |k, raw| config.server.set(&format!("tls.{k}"), raw))?;
        }
    }
    if let Some(value) = document.get("queue") {
        apply(section(value, "queue")?, "queue", "", |k, raw| config.queue.set(k, raw))?;
    }
    if let Some(value) = document.get("upstream") {
        apply(section(value, "upstream")?, "upstream", "", |k, raw| config.upstream.set(k, raw))?;
    }
    if let Some(value) = document.get("rate_limit") {
        let table = section(value, "rate_limit")?;
        apply(table, "rate_limit", "", |k, raw| config.rate_limit.set(k, raw))?;
    }
    if let Some(value) = document.get("tenant") {
        let toml::Value::Array(items) = value else {
            return Err(syntax(
                "tenant must be an array of tables: write [[tenant]], not [tenant]",
            ));
        };
        for (index, item) in items.iter().enumerate() {
            config.tenants.push(parse_tenant(item, index)?);
        }
    }
    if let Some(value) = document.get("model") {
        let toml::Value::Array(items) = value else {
            return Err(syntax("model must be an array of tables: write [[model]], not [model]"));
        };
        for (index, item) in items.iter().enumerate() {
            let model = parse_model(item, index, &config.queue)?;
            config.models.push(model);
        }
    }
    Ok(config)
}

/// A table's entries, or an error saying `name` must be a table.
fn section<'a>(value: &'a toml::Value, name: &str) -> Result<&'a toml::Table, ConfigError> {
    match value {
        toml::Value::Table(table) => Ok(table),
        _ => Err(syntax(&format!("{name} must be a table ([{name}])"))),
    }
}

fn syntax(message: &str) -> ConfigError {
    ConfigError::new(ConfigErrorKind::Syntax, message)
}

/// Hands every entry of `table` to `setter`; errors name `prefix.key` after `context` (e.g.
/// `model "llama": `).
fn apply(
    table: &toml::Table,
    prefix: &str,
    context: &str,
    mut setter: impl FnMut(&str, Raw<'_>) -> Result<(), SetError>,
) -> Result<(), ConfigError> {
    for (key, value) in table {
        let raw = Raw::Toml(value);
        setter(key, raw).map_err(|error| {
            let qualified =
                if prefix.is_empty() { key.to_owned() } else { format!("{prefix}.{key}") };
            error.into_config_error(context, &qualified, raw)
        })?;
    }
    Ok(())
}

/// One `[[model]]` table; its queue starts from the `[queue]` defaults.
fn parse_model(
    item: &toml::Value,
    index: usize,
    defaults: &QueueConfig,
) -> Result<ModelConfig, ConfigError> {
    let toml::Value::Table(table) = item else {
        return Err(syntax("model must be an array of tables ([[model]])"));
    };
    let context = match table.get("name") {
        Some(toml::Value::String(name)) => format!("model {name:?}: "),
        _ => format!("model #{}: ", index + 1),
    };
    let mut model = ModelConfig::new("", Vec::new());
    model.queue = defaults.clone();
    apply(table, "", &context, |key, raw| match key {
        "queue" => Ok(()),
        _ => model.set(key, raw),
    })?;
    match table.get("queue") {
        None => {}
        Some(toml::Value::Table(queue)) => {
            apply(queue, "queue", &context, |key, raw| model.queue.set(key, raw))?;
        }
        Some(_) => return Err(syntax(&format!("{context}queue must be a table ([model.queue])"))),
    }
    for required in ["name", "backends"] {
        if !table.contains_key(required) {
            let message = format!("{context}missing key \"{required}\"");
            return Err(ConfigError::new(ConfigErrorKind::MissingKey, message));
        }
    }
    Ok(model)
}

/// One `[[tenant]]` table.
fn parse_tenant(item: &toml::Value, index: usize) -> Result<TenantConfig, ConfigError> {
    let toml::Value::Table(table) = item else {
        return Err(syntax("tenant must be an array of tables ([[tenant]])"));
    };
    let context = match table.get("name") {
        Some(toml::Value::String(name)) => format!("tenant {name:?}: "),
        _ => format!("tenant #{}: ", index + 1),
    };
    let mut tenant = TenantConfig::new("", Vec::new());
    apply(table, "", &context, |key, raw| tenant.set(key, raw))?;
    for required in ["name", "api_key_sha256"] {
        if !table.contains_key(required) {
            let message = format!("{context}missing key \"{required}\"");
            return Err(ConfigError::new(ConfigErrorKind::MissingKey, message));
        }
    }
    Ok(tenant)
}
