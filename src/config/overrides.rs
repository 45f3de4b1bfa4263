//! Command-line overrides, the top layer: `--listen`, `--admin-listen`, and repeatable
//! `--set KEY=VALUE` with dotted keys.
//!
//! Keys: `server.K`, `upstream.K`, `rate_limit.K`, `queue.K` (the default **and** every
//! model's effective queue, like an environment variable), `model.NAME.K` (`name`,
//! `upstream_model`, `backend_api_key_file`, `engine`, `routing`, `backends` as comma-separated
//! text) and
//! `model.NAME.queue.K`; `[[tenant]]` tables come from the file only. Order: `--listen`,
//! `--admin-listen`, then every `--set` that is not per model, in command-line order, then the
//! per-model ones, in command-line order; so a per-model `--set` beats a `queue.K` one. A model
//! name may contain dots: of the configured names that fit, the longest one followed by a known
//! key is taken.

use super::keys::{Raw, SetError, MODEL_KEYS, QUEUE_KEYS};
use super::{Config, ConfigError, ConfigErrorKind};

/// What the command line sets; the [`Default`] sets nothing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Overrides {
    /// `--listen ADDR`: `server.listen`.
    pub listen: Option<String>,
    /// `--admin-listen ADDR`: `server.admin_listen`.
    pub admin_listen: Option<String>,
    /// `--set KEY=VALUE`, in command-line order, split at the first `=`.
    pub set: Vec<(String, String)>,
}

impl Overrides {
    /// Splits one `--set` argument at its first `=` into a trimmed key and the value.
    pub fn parse_set(argument: &str) -> Result<(String, String), ConfigError> {
        match argument.split_once('=') {
            Some((key, value)) if !key.trim().is_empty() => {
                Ok((key.trim().to_owned(), value.to_owned()))
            }
            _ => Err(ConfigError::new(
                ConfigErrorKind::BadValue,
                format!("--set {argument:?}: expected KEY=VALUE, e.g. queue.max_overtakes=4"),
            )),
        }
    }

    /// Applies the overrides to `config`, in the order described in the module docs.
    pub(crate) fn apply(&self, config: &mut Config) -> Result<(), ConfigError> {
        let flags = [
            ("--listen", "listen", &self.listen),
            ("--admin-listen", "admin_listen", &self.admin_listen),
        ];
        for (flag, key, value) in flags {
            if let Some(value) = value {
                let raw = Raw::Text(value);
                config
                    .server
                    .set(key, raw)
                    .map_err(|error| error.into_config_error("", flag, raw))?;
            }
        }
        let (per_model, global): (Vec<_>, Vec<_>) =
            self.set.iter().partition(|(key, _)| key.starts_with("model."));
        for (key, value) in global.into_iter().chain(per_model) {
            let raw = Raw::Text(value);
            set(config, key, raw).map_err(|error| error.into_config_error("--set ", key, raw))?;
        }
        Ok(())
    }
}

/// Sets one dotted key.
fn set(config: &mut Config, key: &str, raw: Raw<'_>) -> Result<(), SetError> {
    let (section, rest) = key.split_once('.').unwrap_or((key, ""));
    match section {
        "server" => config.server.set(rest, raw),
        "upstream" => config.upstream.set(rest, raw),
        "rate_limit" => config.rate_limit.set(rest, raw),
        "queue" => {
            config.queue.set(rest, raw)?;
            for model in &mut config.models {
                model.queue.set(rest, raw)?;
            }
            Ok(())
        }
        "model" => set_model(config, rest, raw),
        _ => Err(SetError::UnknownKey),
    }
}

/// Sets `NAME.K` or `NAME.queue.K` of the model called `NAME`. Names may contain dots, so
/// of the models whose name fits, the longest one whose remainder is a known key is taken.
fn set_model(config: &mut Config, rest: &str, raw: Raw<'_>) -> Result<(), SetError> {
    let mut candidates: Vec<(usize, &str)> = config
        .models
        .iter()
        .enumerate()
        .filter_map(|(index, model)| {
            let after = rest.strip_prefix(model.name.as_str())?.strip_prefix('.')?;
            Some((index, after))
        })
        .collect();
    candidates.sort_by_key(|(index, _)| std::cmp::Reverse(config.models[*index].name.len()));
    let chosen = candidates.iter().find(|(_, key)| is_model_key(key)).or(candidates.first());
    let Some(&(index, key)) = chosen else {
        let names: Vec<String> = config.models.iter().map(|m| format!("{:?}", m.name)).collect();
        return Err(SetError::BadValue(format!(
            "no configured model matches (expected model.NAME.KEY; models: {})",
            names.join(", ")
        )));
    };
    let model = &mut config.models[index];
    match key.strip_prefix("queue.") {
        Some(queue_key) => model.queue.set(queue_key, raw),
        None if key == "queue" => Err(SetError::UnknownKey),
        None => model.set(key, raw),
    }
}

/// `K` of a model, or `queue.K`.
fn is_model_key(key: &str) -> bool {
    match key.strip_prefix("queue.") {
        Some(queue_key) => QUEUE_KEYS.contains(&queue_key),
        None => key != "queue" && MODEL_KEYS.contains(&key),
    }
}
