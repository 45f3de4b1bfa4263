//! Environment variables, named as in kthena's router so an operator can carry settings over
//! (SPEC 4). They beat the file: a queue variable sets the `[queue]` default **and** every
//! model's effective queue, `[model.queue]` overrides included. An unset or empty variable is
//! ignored. Values are parsed like `--set` text (integers, Go-style durations, Go booleans).

use super::keys::{boolean, Raw, SetError};
use super::{Config, ConfigError, ConfigErrorKind};

/// Every variable, with the key it sets (`ENABLE_SESSION_BOOST` maps `true` to
/// `"session-boost"` and `false` to `"fifo"`).
pub const ENV_VARS: &[(&str, &str)] = &[
    ("ENABLE_SESSION_BOOST", "queue.strategy"),
    ("SESSION_BOOST_HEADER", "queue.session_header"),
    ("SESSION_BOOST_MAX_SESSIONS", "queue.max_sessions"),
    ("SESSION_BOOST_INFLIGHT_PER_POD", "queue.inflight_per_backend"),
    ("SESSION_BOOST_GRACE_PERIOD", "queue.grace_period"),
    ("SESSION_BOOST_TIMEOUT", "queue.timeout"),
    ("SESSION_BOOST_MAX_OVERTAKES", "queue.max_overtakes"),
    ("METRICS_SCRAPE_INTERVAL", "upstream.metrics_interval"),
    ("DRAIN_TIMEOUT", "server.drain_timeout"),
];

/// Reads a variable of the real process environment (`None` when unset or not Unicode); the
/// `env` argument of [`Config::load`] in production.
pub fn process_env(name: &str) -> Option<String> {
    std::env::var(name).ok()
}

/// Applies every set variable to `config`, in [`ENV_VARS`] order.
pub(crate) fn apply(
    config: &mut Config,
    env: &dyn Fn(&str) -> Option<String>,
) -> Result<(), ConfigError> {
    for (variable, target) in ENV_VARS {
        let Some(value) = env(variable).filter(|value| !value.trim().is_empty()) else {
            continue;
        };
        let bad = |reason: String| {
            ConfigError::new(
                ConfigErrorKind::BadValue,
                format!("environment variable {variable} = {value:?}: {reason}"),
            )
        };
        let text = if *variable == "ENABLE_SESSION_BOOST" {
            let enabled = boolean(Raw::Text(&value)).map_err(bad)?;
            if enabled { "session-boost" } else { "fifo" }.to_owned()
        } else {
            value.clone()
        };
        let (section, key) = target.split_once('.').unwrap_or(("", target));
        set(config, section, key, &text).map_err(|error| match error {
            SetError::BadValue(reason) => bad(reason),
            SetError::UnknownKey => unreachable!("ENV_VARS names a known key: {target}"),
        })?;
    }
    Ok(())
}

/// Sets `key` of `section` from text; a queue key goes to the defaults and every model.
fn set(config: &mut Config, section: &str, key: &str, text: &str) -> Result<(), SetError> {
    let raw = Raw::Text(text);
    match section {
        "queue" => {
            config.queue.set(key, raw)?;
            for model in &mut config.models {
                model.queue.set(key, raw)?;
            }
            Ok(())
        }
        "upstream" => config.upstream.set(key, raw),
        "server" => config.server.set(key, raw),
        _ => Err(SetError::UnknownKey),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{ModelConfig, QueueConfig, Strategy, UpstreamConfig};

    fn config() -> Config {
        Config::with_models(vec![ModelConfig::new("m", vec!["127.0.0.1:1".to_owned()])])
    }

    #[test]
    fn every_variable_targets_a_settable_key() {
        for (variable, target) in ENV_VARS {
            let value = match *target {
                "queue.strategy" => "false",
                "queue.session_header" => "X-S",
                t if t.contains("timeout") || t.contains("period") || t.contains("interval") => {
                    "9s"
                }
                _ => "9",
            };
            let mut config = config();
            let before = config.clone();
            apply(&mut config, &|name| (name == *variable).then(|| value.to_owned())).unwrap();
            assert_ne!(config, before, "{variable}");
        }
    }

    #[test]
    fn empty_variables_are_ignored() {
        let mut config = config();
        apply(&mut config, &|_| Some(" ".to_owned())).unwrap();
        assert_eq!(config, self::config());
    }

    #[test]
    fn enable_session_boost_selects_the_strategy() {
        let mut config = config();
        apply(&mut config, &|name| (name == "ENABLE_SESSION_BOOST").then(|| "0".to_owned()))
            .unwrap();
        assert_eq!(config.queue.strategy, Strategy::Fifo);
        assert_eq!(config.models[0].queue.strategy, Strategy::Fifo);
        assert_eq!(config.upstream, UpstreamConfig::default());
        let error = apply(&mut config, &|name| {
            (name == "ENABLE_SESSION_BOOST").then(|| "maybe".to_owned())
        })
        .unwrap_err();
        assert!(error
            .message()
            .starts_with("environment variable ENABLE_SESSION_BOOST = \"maybe\""));
        assert_eq!(QueueConfig::default().strategy, Strategy::SessionBoost);
    }
}
