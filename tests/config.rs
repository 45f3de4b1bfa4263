//! Integration tests of `warmpath::config`: precedence (default < file < environment <
//! command line), per-model queue overrides, unknown keys, every environment variable, and
//! the round trip through the printed effective configuration.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use warmpath::config::{
    AccessLog, Config, ConfigErrorKind, Engine, Overrides, Routing, Setting, Strategy, ENV_VARS,
};

const MINIMAL: &str = r#"
[[model]]
name = "llama"
backends = ["127.0.0.1:8001"]
"#;

const TWO_MODELS: &str = r#"
[queue]
max_overtakes = 10
timeout = "20s"

[[model]]
name = "llama"
backends = ["127.0.0.1:8001"]

[model.queue]
max_overtakes = 4
strategy = "fifo"

[[model]]
name = "qwen"
backends = ["127.0.0.1:8002"]
"#;

fn no_env(_: &str) -> Option<String> {
    None
}

/// An environment holding exactly `vars`.
fn env_of(vars: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
    let map: HashMap<String, String> =
        vars.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    move |name| map.get(name).cloned()
}

fn sets(pairs: &[(&str, &str)]) -> Overrides {
    let set = pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect();
    Overrides { set, ..Overrides::default() }
}

/// Writes `text` to a fresh file under the target directory and returns its path.
fn write_temp(name: &str, text: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("config-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

fn example_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/warmpath.toml")
}

fn error_of(text: &str) -> String {
    Config::from_toml_str(text).expect_err("should be refused").to_string()
}

#[test]
fn minimal_file_takes_every_default() {
    let config = Config::from_toml_str(MINIMAL).unwrap();
    let expected = Config::with_models(vec![warmpath::config::ModelConfig::new(
        "llama",
        vec!["127.0.0.1:8001".to_owned()],
    )]);
    assert_eq!(config, expected);
    assert_eq!(config.queue.max_queued, 65_536);
    assert_eq!(config.queue.inflight_per_backend, Setting::Auto);
    assert_eq!(config.queue.grace_period, Duration::ZERO);
    assert_eq!(config.upstream.header_timeout, Duration::from_secs(600));
    assert_eq!(config.upstream.eject_after_failures, 3);
    assert_eq!(config.server.listen.to_string(), "127.0.0.1:8080");
    assert_eq!(config.server.access_log, AccessLog::Off);
    assert_eq!(config.models[0].routing, Routing::PrefixCost, "chosen by the [8] matrix");
    assert_eq!(config.models[0].engine, Engine::Vllm);
    assert_eq!(config.queue.prefill_tokens_per_backend, Setting::Auto);
    assert_eq!(config.queue.prefix_index_blocks, Setting::Auto);
}

#[test]
fn precedence_is_default_file_env_set() {
    let key = "queue.max_overtakes";
    let from_default = Config::load(None, &no_env, &sets(&[])).map(|_| ());
    assert!(from_default.is_err(), "no file means no models");

    let path = write_temp("precedence.toml", &format!("[queue]\nmax_overtakes = 5\n{MINIMAL}"));
    let file = Config::load(Some(&path), &no_env, &Overrides::default()).unwrap();
    assert_eq!(file.queue.max_overtakes, 5);
    assert_eq!(file.models[0].queue.max_overtakes, 5);

    let env = env_of(&[("SESSION_BOOST_MAX_OVERTAKES", "6")]);
    let with_env = Config::load(Some(&path), &env, &Overrides::default()).unwrap();
    assert_eq!(with_env.queue.max_overtakes, 6);
    assert_eq!(with_env.models[0].queue.max_overtakes, 6);

    let with_set = Config::load(Some(&path), &env, &sets(&[(key, "7")])).unwrap();
    assert_eq!(with_set.queue.max_overtakes, 7);
    assert_eq!(with_set.models[0].queue.max_overtakes, 7);
}

#[test]
fn precedence_for_server_and_upstream_keys() {
    let text = format!("[server]\ndrain_timeout = \"5s\"\n[upstream]\nmax_retries = 1\n{MINIMAL}");
    let path = write_temp("precedence-server.toml", &text);
    let env = env_of(&[("DRAIN_TIMEOUT", "6s"), ("METRICS_SCRAPE_INTERVAL", "2s")]);
    let config = Config::load(Some(&path), &env, &Overrides::default()).unwrap();
    assert_eq!(config.server.drain_timeout, Duration::from_secs(6));
    assert_eq!(config.upstream.metrics_interval, Duration::from_secs(2));
    assert_eq!(config.upstream.max_retries, 1);
    let overrides = sets(&[
        ("server.drain_timeout", "7s"),
        ("upstream.max_retries", "0"),
        ("server.shards", "2"),
    ]);
    let config = Config::load(Some(&path), &env, &overrides).unwrap();
    assert_eq!(config.server.drain_timeout, Duration::from_secs(7));
    assert_eq!(config.upstream.max_retries, 0);
    assert_eq!(config.server.shards, 2);
}

#[test]
fn listen_flags_beat_file_and_set_beats_them() {
    let text = format!("[server]\nlisten = \"127.0.0.1:1000\"\n{MINIMAL}");
    let path = write_temp("listen.toml", &text);
    let overrides = Overrides {
        listen: Some("127.0.0.1:2000".to_owned()),
        admin_listen: Some("[::1]:3000".to_owned()),
        set: Vec::new(),
    };
    let config = Config::load(Some(&path), &no_env, &overrides).unwrap();
    assert_eq!(config.server.listen.to_string(), "127.0.0.1:2000");
    assert_eq!(config.server.admin_listen.to_string(), "[::1]:3000");
    let overrides =
        Overrides { set: vec![("server.listen".into(), "127.0.0.1:4000".into())], ..overrides };
    let config = Config::load(Some(&path), &no_env, &overrides).unwrap();
    assert_eq!(config.server.listen.to_string(), "127.0.0.1:4000");
    let bad = Overrides { listen: Some("nope".to_owned()), ..Overrides::default() };
    let error = Config::load(Some(&path), &no_env, &bad).unwrap_err();
    assert!(error.to_string().starts_with("--listen = \"nope\": not a socket address"), "{error}");
}

#[test]
fn model_queue_overrides_only_its_model() {
    let config = Config::from_toml_str(TWO_MODELS).unwrap();
    assert_eq!(config.queue.max_overtakes, 10);
    assert_eq!(config.queue.strategy, Strategy::SessionBoost);
    let llama = config.model("llama").unwrap();
    assert_eq!(llama.queue.max_overtakes, 4);
    assert_eq!(llama.queue.strategy, Strategy::Fifo);
    assert_eq!(llama.queue.timeout, Duration::from_secs(20), "inherits [queue]");
    let qwen = config.model("qwen").unwrap();
    assert_eq!(qwen.queue, config.queue);
}

#[test]
fn queue_table_may_come_after_the_models_and_inline() {
    let text = r#"
[[model]]
name = "llama"
backends = ["127.0.0.1:8001"]
queue = { max_sessions = 9 }

[queue]
max_sessions = 100
max_queued = 7
"#;
    let config = Config::from_toml_str(text).unwrap();
    assert_eq!(config.models[0].queue.max_sessions, 9);
    assert_eq!(config.models[0].queue.max_queued, 7);
}

#[test]
fn env_beats_model_queue_overrides_too() {
    let path = write_temp("env-models.toml", TWO_MODELS);
    let env = env_of(&[("SESSION_BOOST_MAX_OVERTAKES", "3"), ("ENABLE_SESSION_BOOST", "true")]);
    let config = Config::load(Some(&path), &env, &Overrides::default()).unwrap();
    for model in &config.models {
        assert_eq!(model.queue.max_overtakes, 3, "{}", model.name);
        assert_eq!(model.queue.strategy, Strategy::SessionBoost, "{}", model.name);
        assert_eq!(model.queue.timeout, Duration::from_secs(20), "{}", model.name);
    }
}

#[test]
fn set_reaches_models_and_per_model_set_wins() {
    let path = write_temp("set-models.toml", TWO_MODELS);
    let overrides = sets(&[
        ("model.llama.queue.max_overtakes", "1"),
        ("queue.max_overtakes", "2"),
        ("model.qwen.routing", "round-robin"),
        ("model.qwen.backends", "127.0.0.1:9001, 127.0.0.1:9002"),
        ("model.qwen.upstream_model", "Qwen/Qwen2-32B"),
    ]);
    let config = Config::load(Some(&path), &no_env, &overrides).unwrap();
    assert_eq!(config.queue.max_overtakes, 2);
    assert_eq!(config.model("llama").unwrap().queue.max_overtakes, 1);
    let qwen = config.model("qwen").unwrap();
    assert_eq!(qwen.queue.max_overtakes, 2);
    assert_eq!(qwen.routing, Routing::RoundRobin);
    assert_eq!(qwen.backends, ["127.0.0.1:9001", "127.0.0.1:9002"]);
    assert_eq!(qwen.upstream_model.as_deref(), Some("Qwen/Qwen2-32B"));
}

#[test]
fn set_finds_model_names_with_dots() {
    let text = r#"
[[model]]
name = "llama-3.1"
backends = ["127.0.0.1:8001"]

[[model]]
name = "llama-3.1.queue"
backends = ["127.0.0.1:8002"]
"#;
    let path = write_temp("dots.toml", text);
    let overrides = sets(&[("model.llama-3.1.queue.max_queued", "5")]);
    let config = Config::load(Some(&path), &no_env, &overrides).unwrap();
    assert_eq!(config.models[0].queue.max_queued, 5);
    assert_eq!(config.models[1].queue.max_queued, 65_536);
    let overrides = sets(&[("model.llama-3.1.queue.routing", "least-inflight")]);
    let config = Config::load(Some(&path), &no_env, &overrides).unwrap();
    assert_eq!(config.models[1].routing, Routing::LeastInflight);
}

#[test]
fn bad_set_keys_and_values_are_named() {
    let path = write_temp("bad-set.toml", MINIMAL);
    let cases = [
        (
            ("queue.max_overtakes", "many"),
            "--set queue.max_overtakes = \"many\": not an unsigned integer",
        ),
        (
            ("queue.max_overtake", "4"),
            "--set unknown key \"queue.max_overtake\" (did you mean \"queue.max_overtakes\"?)",
        ),
        (("servr.shards", "4"), "--set unknown key \"servr.shards\""),
        (
            ("model.nope.routing", "fifo"),
            "--set model.nope.routing = \"fifo\": no configured model matches",
        ),
        (("model.llama.queue", "x"), "--set unknown key \"model.llama.queue\""),
        (("server.pin_cores", "maybe"), "--set server.pin_cores = \"maybe\": not a boolean"),
        (("upstream.connect_timeout", "3"), "--set upstream.connect_timeout = \"3\": missing unit"),
    ];
    for ((key, value), expected) in cases {
        let error = Config::load(Some(&path), &no_env, &sets(&[(key, value)])).unwrap_err();
        assert!(error.to_string().starts_with(expected), "{key}={value}: {error}");
    }
    let error = Overrides::parse_set("queue.max_overtakes").unwrap_err();
    assert!(error.to_string().contains("expected KEY=VALUE"), "{error}");
    assert_eq!(Overrides::parse_set(" a.b =c=d").unwrap(), ("a.b".to_owned(), "c=d".to_owned()));
}

#[test]
fn every_env_var_is_applied() {
    let path = write_temp("env-all.toml", TWO_MODELS);
    let vars = [
        ("ENABLE_SESSION_BOOST", "false"),
        ("SESSION_BOOST_HEADER", "X-Conversation"),
        ("SESSION_BOOST_MAX_SESSIONS", "1000"),
        ("SESSION_BOOST_INFLIGHT_PER_POD", "16"),
        ("SESSION_BOOST_GRACE_PERIOD", "150ms"),
        ("SESSION_BOOST_TIMEOUT", "1m30s"),
        ("SESSION_BOOST_MAX_OVERTAKES", "0"),
        ("METRICS_SCRAPE_INTERVAL", "250ms"),
        ("DRAIN_TIMEOUT", "0"),
    ];
    assert_eq!(vars.len(), ENV_VARS.len());
    let config = Config::load(Some(&path), &env_of(&vars), &Overrides::default()).unwrap();
    for queue in std::iter::once(&config.queue).chain(config.models.iter().map(|m| &m.queue)) {
        assert_eq!(queue.strategy, Strategy::Fifo);
        assert_eq!(queue.session_header, "X-Conversation");
        assert_eq!(queue.max_sessions, 1000);
        assert_eq!(queue.inflight_per_backend, Setting::Fixed(16));
        assert_eq!(queue.grace_period, Duration::from_millis(150));
        assert_eq!(queue.timeout, Duration::from_secs(90));
        assert_eq!(queue.max_overtakes, 0);
    }
    assert_eq!(config.upstream.metrics_interval, Duration::from_millis(250));
    assert_eq!(config.server.drain_timeout, Duration::ZERO);
}

#[test]
fn bad_env_values_name_the_variable_and_value() {
    let path = write_temp("env-bad.toml", MINIMAL);
    let cases = [
        ("ENABLE_SESSION_BOOST", "yes"),
        ("SESSION_BOOST_MAX_SESSIONS", "lots"),
        ("SESSION_BOOST_INFLIGHT_PER_POD", "-1"),
        ("SESSION_BOOST_GRACE_PERIOD", "10"),
        ("SESSION_BOOST_TIMEOUT", "30 seconds"),
        ("SESSION_BOOST_MAX_OVERTAKES", "1.5"),
        ("METRICS_SCRAPE_INTERVAL", "1d"),
        ("DRAIN_TIMEOUT", "-5s"),
    ];
    for (variable, value) in cases {
        let error = Config::load(Some(&path), &env_of(&[(variable, value)]), &Overrides::default())
            .unwrap_err();
        let prefix = format!("environment variable {variable} = {value:?}: ");
        assert!(error.to_string().starts_with(&prefix), "{error}");
        assert_eq!(error.kind(), ConfigErrorKind::BadValue);
    }
    // Parses, but breaks a rule: reported by validation with the key.
    let env = env_of(&[("SESSION_BOOST_INFLIGHT_PER_POD", "0")]);
    let error = Config::load(Some(&path), &env, &Overrides::default()).unwrap_err();
    assert_eq!(error.to_string(), "queue.inflight_per_backend = 0: must be at least 1");
}

#[test]
fn unknown_keys_anywhere_are_named() {
    let cases = [
        ("servers = 1\n", "unknown key \"servers\" (did you mean \"server\"?)"),
        ("[server]\nlisten_addr = \"127.0.0.1:1\"\n", "unknown key \"server.listen_addr\""),
        (
            "[queue]\nmax_overtake = 1\n",
            "unknown key \"queue.max_overtake\" (did you mean \"queue.max_overtakes\"?)",
        ),
        ("[upstream]\nretries = 1\n", "unknown key \"upstream.retries\""),
        ("[queue]\nlisten = \"127.0.0.1:1\"\n", "unknown key \"queue.listen\""),
    ];
    for (prefix, expected) in cases {
        let error = Config::from_toml_str(&format!("{prefix}{MINIMAL}")).unwrap_err();
        assert_eq!(error.kind(), ConfigErrorKind::UnknownKey, "{error}");
        assert_eq!(error.to_string(), expected);
    }
    let in_model = format!("{MINIMAL}backend = [\"127.0.0.1:2\"]\n");
    assert_eq!(
        error_of(&in_model),
        "model \"llama\": unknown key \"backend\" (did you mean \"backends\"?)"
    );
    let in_model_queue = format!("{MINIMAL}[model.queue]\nmax_sesions = 3\n");
    assert_eq!(
        error_of(&in_model_queue),
        "model \"llama\": unknown key \"queue.max_sesions\" (did you mean \"queue.max_sessions\"?)"
    );
}

#[test]
fn bad_file_values_name_the_key_and_value() {
    let cases = [
        ("[server]\nlisten = \"nope\"\n", "server.listen = \"nope\": not a socket address"),
        ("[server]\nshards = -1\n", "server.shards = -1: must not be negative"),
        (
            "[server]\npin_cores = \"yes\"\n",
            "server.pin_cores = \"yes\": expected a boolean, found a string",
        ),
        (
            "[queue]\ntimeout = 30\n",
            "queue.timeout = 30: expected a duration string such as \"30s\"",
        ),
        ("[queue]\ntimeout = \"30\"\n", "queue.timeout = \"30\": missing unit"),
        (
            "[queue]\nstrategy = \"lifo\"\n",
            "queue.strategy = \"lifo\": expected one of session-boost, fifo",
        ),
        ("[upstream]\nheader_timeout = \"1x\"\n", "upstream.header_timeout = \"1x\": unknown unit"),
        (
            "[server]\nbusy_poll = \"2ms\"\n",
            "server.busy_poll = \"2ms\": must be at most \"1ms\" (it spins a core)",
        ),
    ];
    for (prefix, expected) in cases {
        let message = error_of(&format!("{prefix}{MINIMAL}"));
        assert!(message.starts_with(expected), "{message}");
    }
    let engine = MINIMAL.replace("name = \"llama\"", "name = \"llama\"\nengine = \"tgi\"");
    assert_eq!(
        error_of(&engine),
        "model \"llama\": engine = \"tgi\": expected one of vllm, sglang, openai"
    );
}

#[test]
fn validation_errors_name_the_model_and_key() {
    let text = format!("{MINIMAL}[model.queue]\ninflight_per_backend = 0\n");
    assert_eq!(
        error_of(&text),
        "model \"llama\": queue.inflight_per_backend = 0: must be at least 1"
    );
    let text = format!("{MINIMAL}[model.queue]\nprefix_block_bytes = 4\n");
    let message = error_of(&text);
    assert!(message.starts_with("model \"llama\": queue.prefix_block_bytes = 4"), "{message}");
    let error = Config::from_toml_str(&text).unwrap_err();
    assert_eq!(error.kind(), ConfigErrorKind::Invalid);
    let prefix_cost =
        MINIMAL.replace("name = \"llama\"", "name = \"llama\"\nrouting = \"prefix-cost\"");
    let config = Config::from_toml_str(&prefix_cost).expect("prefix-cost is a routing");
    assert_eq!(config.models[0].routing, warmpath::config::Routing::PrefixCost);
}

#[test]
fn models_need_a_name_and_backends() {
    assert!(error_of("").starts_with("no models configured"));
    assert_eq!(
        error_of("[[model]]\nbackends = [\"127.0.0.1:1\"]\n"),
        "model #1: missing key \"name\""
    );
    assert_eq!(error_of("[[model]]\nname = \"a\"\n"), "model \"a\": missing key \"backends\"");
    assert_eq!(
        error_of("[[model]]\nname = \"a\"\nbackends = []\n"),
        "model \"a\": backends = []: must list at least one backend"
    );
    assert!(error_of("[model]\nname = \"a\"\n").contains("write [[model]]"));
    assert!(error_of("[[model]]\nname = \"a\"\nbackends = \"127.0.0.1:1\"\n")
        .starts_with("model \"a\": backends = \"127.0.0.1:1\": expected an array of strings"));
}

#[test]
fn syntax_and_read_errors() {
    let error = Config::from_toml_str("[server\n").unwrap_err();
    assert_eq!(error.kind(), ConfigErrorKind::Syntax);
    assert!(error.to_string().starts_with("invalid TOML"), "{error}");
    let path = write_temp("syntax.toml", "[queue]\ntimeout = \n");
    let error = Config::load(Some(&path), &no_env, &Overrides::default()).unwrap_err();
    assert!(error.to_string().starts_with(&format!("{}: invalid TOML", path.display())), "{error}");
    let missing = Path::new("/nonexistent/warmpath.toml");
    let error = Config::load(Some(missing), &no_env, &Overrides::default()).unwrap_err();
    assert_eq!(error.kind(), ConfigErrorKind::Read);
    assert!(error.to_string().starts_with("/nonexistent/warmpath.toml: "), "{error}");
}

#[test]
fn example_file_is_valid() {
    let config = Config::load(Some(&example_path()), &no_env, &Overrides::default()).unwrap();
    assert_eq!(config.models.len(), 2);
    let llama = config.model("llama-3-8b").unwrap();
    assert_eq!(llama.backends, ["127.0.0.1:8001", "127.0.0.1:8002"]);
    assert_eq!(llama.queue.max_overtakes, 8);
    assert_eq!(llama.queue.grace_period, Duration::from_millis(250));
    let qwen = config.model("qwen-32b").unwrap();
    assert_eq!(qwen.engine, Engine::Sglang);
    assert_eq!(qwen.queue, config.queue);
}

#[test]
fn printed_config_round_trips() {
    let env = env_of(&[("SESSION_BOOST_TIMEOUT", "0"), ("DRAIN_TIMEOUT", "1m30s")]);
    let overrides = sets(&[
        ("server.access_log", "/tmp/warm path.jsonl"),
        ("model.qwen-32b.routing", "least-inflight"),
    ]);
    let config = Config::load(Some(&example_path()), &env, &overrides).unwrap();
    let text = config.to_toml();
    let reloaded = Config::from_toml_str(&text).unwrap();
    assert_eq!(reloaded, config, "{text}");
    assert_eq!(reloaded.to_toml(), text);
    assert_eq!(config.to_string(), text);
    assert!(text.matches("[model.queue]").count() == 2, "{text}");
}

#[test]
fn docs_describe_every_key_and_variable() {
    let docs_path = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/configuration.md");
    let docs = std::fs::read_to_string(docs_path).unwrap();
    let mut config = Config::from_toml_str(&format!("{TENANT}{MINIMAL}")).unwrap();
    config.models[0].upstream_model = Some("x".to_owned());
    for line in config.to_toml().lines() {
        if let Some((key, _)) = line.split_once(" = ") {
            assert!(docs.contains(&format!("| `{key}` |")), "docs/configuration.md lacks {key}");
        }
    }
    for (variable, target) in ENV_VARS {
        assert!(docs.contains(&format!("| `{variable}` | `{target}` |")), "{variable}");
    }
}

/// `queue.session_sources` (issue [10]): unset, the default list follows `session_header`
/// wherever that was set; set in the file, by `--set` (comma-separated) or per model, it
/// replaces the list; a bad entry is named by index; printed, it loads back the same.
#[test]
fn session_sources_default_set_and_refused() {
    use warmpath::config::SessionSource;
    let env = env_of(&[("SESSION_BOOST_HEADER", "X-Conversation")]);
    let config =
        Config::load(Some(&write_temp("sources.toml", MINIMAL)), &env, &sets(&[])).expect("valid");
    let sources = config.models[0].queue.effective_session_sources();
    assert_eq!(sources[0], SessionSource::Header("X-Conversation".to_owned()));
    assert_eq!(sources[1], SessionSource::Body("prompt_cache_key".to_owned()));
    assert_eq!(config.models[0].queue.session_sources, None);

    let text = format!(
        "[queue]\nsession_sources = [\"body:conversation_id\"]\n{MINIMAL}\
         [model.queue]\nsession_sources = [\"header:X-Thread\", \"body:prompt_cache_key\"]\n"
    );
    let path = write_temp("sources-set.toml", &text);
    let config = Config::load(Some(&path), &no_env, &Overrides::default()).unwrap();
    assert_eq!(config.queue.session_sources, Some(vec!["body:conversation_id".to_owned()]));
    assert_eq!(
        config.models[0].queue.effective_session_sources(),
        [
            SessionSource::Header("X-Thread".to_owned()),
            SessionSource::Body("prompt_cache_key".to_owned())
        ]
    );
    let printed = config.to_toml();
    assert_eq!(Config::from_toml_str(&printed).unwrap(), config, "{printed}");

    let overrides = sets(&[("queue.session_sources", "header:X-A, body:thread")]);
    let config = Config::load(Some(&path), &no_env, &overrides).unwrap();
    let expected = Some(vec!["header:X-A".to_owned(), "body:thread".to_owned()]);
    assert_eq!(config.models[0].queue.session_sources, expected);

    let bad = sets(&[("model.llama.queue.session_sources", "header:X-A,X-B")]);
    let error = Config::load(Some(&path), &no_env, &bad).unwrap_err();
    assert_eq!(
        error.to_string(),
        "model \"llama\": queue.session_sources[1] = \"X-B\": \
         expected \"header:NAME\" or \"body:FIELD\""
    );
    let message = error_of("[queue]\nsession_sources = [\"body:a\", 3]\n");
    assert_eq!(
        message,
        "queue.session_sources = [\"body:a\", 3]: expected strings, found an integer"
    );
}

/// SHA-256("key-a") and SHA-256("key-b"), for the tenant tests.
const KEY_A: &str = "f10f781241e2246678b6b45c857069208152a53863e47fac33f607ab405006f4";
const KEY_B: &str = "a30534a53b23547377ddccbd1ac85a8a84c13db43493c16e55a6abc7b0eba634";

const TENANT: &str = r#"
[server]
admin_token_sha256 = "F10F781241E2246678B6B45C857069208152A53863E47FAC33F607AB405006F4"

[rate_limit]
store = "redis"
redis_url = "redis://cache.internal:6380/2"

[[tenant]]
name = "search-team"
api_key_sha256 = ["f10f781241e2246678b6b45c857069208152a53863e47fac33f607ab405006f4"]
weight = 3
tokens_per_minute = 90000
requests_per_minute = 600
"#;

/// Issue [11]'s keys (SPEC 10): tenants with their digests (either case, normalised), weights
/// and limits, the admin digest, the rate-limit store; defaults; the printed round trip.
#[test]
fn tenants_rate_limits_and_the_admin_token_load() {
    use warmpath::config::RateLimitStore;
    let config = Config::from_toml_str(&format!("{TENANT}{MINIMAL}")).unwrap();
    let digest = |hex: &str| -> [u8; 32] {
        std::array::from_fn(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).unwrap())
    };
    assert_eq!(config.server.admin_token_sha256, Some(digest(KEY_A)));
    assert_eq!(config.rate_limit.store, RateLimitStore::Redis);
    assert_eq!(config.rate_limit.redis_url, "redis://cache.internal:6380/2");
    let tenant = &config.tenants[0];
    assert_eq!(tenant.name, "search-team");
    assert_eq!(tenant.api_key_sha256, vec![digest(KEY_A)]);
    assert_eq!(
        (tenant.weight, tenant.tokens_per_minute, tenant.requests_per_minute),
        (3, 90_000, 600)
    );
    let text = config.to_toml();
    assert!(text.contains(&format!("admin_token_sha256 = \"{KEY_A}\"")), "lowercase: {text}");
    assert_eq!(Config::from_toml_str(&text).unwrap(), config, "{text}");

    let defaults = Config::from_toml_str(MINIMAL).unwrap();
    assert!(defaults.tenants.is_empty() && defaults.server.admin_token_sha256.is_none());
    assert_eq!(defaults.rate_limit.store, RateLimitStore::Local);
    assert_eq!(defaults.rate_limit.redis_url, "redis://127.0.0.1:6379");
    let minimal =
        format!("[[tenant]]\nname = \"t\"\napi_key_sha256 = [\"{KEY_A}\", \"{KEY_B}\"]\n{MINIMAL}");
    let config = Config::from_toml_str(&minimal).unwrap();
    let tenant = &config.tenants[0];
    assert_eq!((tenant.weight, tenant.tokens_per_minute, tenant.requests_per_minute), (1, 0, 0));
    assert_eq!(tenant.api_key_sha256.len(), 2);
    let set = sets(&[("rate_limit.store", "redis"), ("server.admin_token_sha256", KEY_B)]);
    let path = write_temp("tenant.toml", &minimal);
    let config = Config::load(Some(&path), &no_env, &set).unwrap();
    assert_eq!(config.rate_limit.store, RateLimitStore::Redis);
    assert_eq!(config.server.admin_token_sha256, Some(digest(KEY_B)));
}

#[test]
fn tenant_tables_refuse_what_they_should_and_name_it() {
    let tenant = |body: &str| format!("[[tenant]]\n{body}\n{MINIMAL}");
    let cases = [
        (tenant("api_key_sha256 = []"), "tenant #1: missing key \"name\""),
        (tenant("name = \"t\""), "tenant \"t\": missing key \"api_key_sha256\""),
        (
            tenant("name = \"t\"\napi_key_sha256 = []"),
            "tenant \"t\": api_key_sha256 = []: must list at least one digest",
        ),
        (
            tenant("name = \"t\"\napi_key_sha256 = [\"wp_abc\"]"),
            "tenant \"t\": api_key_sha256 = [\"wp_abc\"]: entry 0: expected 64 hex digits, found 6 \
             characters (the SHA-256 of the token, never the token",
        ),
        (
            tenant(&format!("name = \"t\"\napi_key_sha256 = [\"{KEY_A}\"]\nweigth = 2")),
            "tenant \"t\": unknown key \"weigth\" (did you mean \"weight\"?)",
        ),
        (
            tenant(&format!("name = \"t\"\napi_key_sha256 = [\"{KEY_A}\"]\nweight = 0")),
            "tenant \"t\": weight = 0: must be at least 1",
        ),
        (
            tenant(&format!("name = \"t t\"\napi_key_sha256 = [\"{KEY_A}\"]")),
            "tenant \"t t\": name = \"t t\": only ASCII letters, digits",
        ),
        (
            tenant(&format!("name = \"t\"\napi_key_sha256 = \"{KEY_A}\"")),
            "tenant \"t\": api_key_sha256 = ",
        ),
        (format!("[tenant]\nname = \"t\"\n{MINIMAL}"), "tenant must be an array of tables"),
        (format!("[rate_limit]\nstore = \"memcached\"\n{MINIMAL}"), "rate_limit.store = \"memcached\": expected one of local, redis"),
        (format!("[rate_limit]\nredis = \"x\"\n{MINIMAL}"), "unknown key \"rate_limit.redis\""),
        (
            format!("[rate_limit]\nredis_url = \"http://h\"\n{MINIMAL}"),
            "rate_limit.redis_url = \"http://h\": expected a redis:// URL",
        ),
        (format!("[server]\nadmin_token_sha256 = \"secret\"\n{MINIMAL}"), "server.admin_token_sha256 = \"secret\": expected 64 hex digits"),
        (format!("tenants = []\n{MINIMAL}"), "unknown key \"tenants\" (did you mean \"tenant\"?)"),
    ];
    for (text, expected) in cases {
        let message = error_of(&text);
        assert!(message.starts_with(expected), "expected {expected:?}, got {message:?}");
    }
    let twice = format!(
        "[[tenant]]\nname = \"a\"\napi_key_sha256 = [\"{KEY_B}\", \"{KEY_A}\"]\n\
         [[tenant]]\nname = \"b\"\napi_key_sha256 = [\"{}\"]\n{MINIMAL}",
        KEY_A.to_ascii_uppercase()
    );
    assert_eq!(
        error_of(&twice),
        format!(
            "tenant \"b\": api_key_sha256[0] = \"{KEY_A}\": the same digest as tenant \"a\"'s \
             api_key_sha256[1]: a key names one tenant"
        ),
        "digests compare case-insensitively"
    );
    let same_name = format!(
        "[[tenant]]\nname = \"a\"\napi_key_sha256 = [\"{KEY_A}\"]\n\
         [[tenant]]\nname = \"a\"\napi_key_sha256 = [\"{KEY_B}\"]\n{MINIMAL}"
    );
    assert_eq!(error_of(&same_name), "tenant #2: name = \"a\": the same name as tenant #1");
}
