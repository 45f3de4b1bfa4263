//! Runs the built `warmpath` binary: `--help`, `--version`, and `check-config` on good and bad
//! files (exit codes, stdout, stderr).

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use warmpath::config::{Config, ENV_VARS};

/// Runs the binary with `args` and an environment without any warmpath variable.
fn warmpath(args: &[&str]) -> Output {
    let mut command = Command::new(env!("CARGO_BIN_EXE_warmpath"));
    command.args(args);
    for (variable, _) in ENV_VARS {
        command.env_remove(variable);
    }
    command.output().expect("the binary runs")
}

fn stdout(output: &Output) -> String {
    String::from_utf8(output.stdout.clone()).unwrap()
}

fn stderr(output: &Output) -> String {
    String::from_utf8(output.stderr.clone()).unwrap()
}

fn example() -> String {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("examples/warmpath.toml").display().to_string()
}

fn write_temp(name: &str, text: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("cli-tests");
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path
}

#[test]
fn help_and_version() {
    let help = warmpath(&["--help"]);
    assert_eq!(help.status.code(), Some(0));
    assert!(stdout(&help).contains("check-config"), "{}", stdout(&help));
    let version = warmpath(&["--version"]);
    assert_eq!(version.status.code(), Some(0));
    assert_eq!(stdout(&version).trim(), format!("warmpath {}", env!("CARGO_PKG_VERSION")));
    let sub_help = warmpath(&["check-config", "--help"]);
    assert_eq!(sub_help.status.code(), Some(0));
    assert!(stdout(&sub_help).contains("--set <KEY=VALUE>"), "{}", stdout(&sub_help));
}

#[test]
fn usage_errors_exit_2() {
    assert_eq!(warmpath(&[]).status.code(), Some(2));
    assert_eq!(warmpath(&["serve"]).status.code(), Some(2));
    assert_eq!(warmpath(&["check-config"]).status.code(), Some(2));
    let bad_set = warmpath(&["check-config", &example(), "--set", "queue.max_overtakes"]);
    assert_eq!(bad_set.status.code(), Some(2));
    assert!(stderr(&bad_set).contains("expected KEY=VALUE"), "{}", stderr(&bad_set));
}

#[test]
fn check_config_prints_the_effective_example() {
    let output = warmpath(&["check-config", &example()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert!(stderr(&output).is_empty());
    let printed = Config::from_toml_str(&stdout(&output)).unwrap();
    let text = std::fs::read_to_string(example()).unwrap();
    assert_eq!(printed, Config::from_toml_str(&text).unwrap());
}

#[test]
fn check_config_applies_set_and_environment() {
    let output = Command::new(env!("CARGO_BIN_EXE_warmpath"))
        .args(["check-config", &example(), "--set", "server.shards=2"])
        .args(["--set", "model.qwen-32b.queue.max_overtakes=5"])
        .env("SESSION_BOOST_MAX_OVERTAKES", "3")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let printed = Config::from_toml_str(&stdout(&output)).unwrap();
    assert_eq!(printed.server.shards, 2);
    assert_eq!(printed.queue.max_overtakes, 3);
    assert_eq!(printed.model("llama-3-8b").unwrap().queue.max_overtakes, 3);
    assert_eq!(printed.model("qwen-32b").unwrap().queue.max_overtakes, 5);
}

#[test]
fn check_config_refuses_a_bad_file_naming_the_key() {
    let text = "[[model]]\nname = \"llama\"\nbackends = [\"127.0.0.1:8001\"]\n\
                [model.queue]\ninflight_per_backend = 0\n";
    let path = write_temp("bad.toml", text);
    let output = warmpath(&["check-config", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stdout(&output).is_empty());
    assert_eq!(
        stderr(&output),
        "error: model \"llama\": queue.inflight_per_backend = 0: must be at least 1\n"
    );
    let path = write_temp("unknown.toml", "[server]\nlisen = \"127.0.0.1:1\"\n");
    let output = warmpath(&["check-config", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("unknown key \"server.lisen\""), "{}", stderr(&output));
}

#[test]
fn check_config_reads_the_engines_key_file_and_prints_only_its_path() {
    let key = write_temp("engine.key", "sk-engine-secret\n");
    let mode = |bits| std::fs::Permissions::from_mode(bits);
    std::fs::set_permissions(&key, mode(0o600)).unwrap();
    let text = format!(
        "[[model]]\nname = \"llama\"\nbackends = [\"127.0.0.1:8001\"]\n\
         backend_api_key_file = {:?}\n",
        key.to_str().unwrap()
    );
    let path = write_temp("engine-key.toml", &text);
    let output = warmpath(&["check-config", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    assert_eq!(
        stderr(&output),
        "warning: model \"llama\": backend_api_key_file is set and no [[tenant]] is configured: \
         anyone who reaches server.listen (127.0.0.1:8080) uses its engines with that key\n"
    );
    let with_tenant =
        format!("{text}[[tenant]]\nname = \"t\"\napi_key_sha256 = [\"{}\"]\n", "0".repeat(64));
    let tenant_path = write_temp("engine-key-tenant.toml", &with_tenant);
    let output = warmpath(&["check-config", tenant_path.to_str().unwrap()]);
    assert_eq!((output.status.code(), stderr(&output)), (Some(0), String::new()));
    // A key file every user can read is named.
    std::fs::set_permissions(&key, mode(0o644)).unwrap();
    let output = warmpath(&["check-config", tenant_path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0));
    let expected = format!(
        "warning: model \"llama\": backend_api_key_file {} is readable by every user (mode \
         644): make it readable by warmpath's user only (chmod 600)\n",
        key.display()
    );
    assert_eq!(stderr(&output), expected);
    let printed = stdout(&output);
    assert!(printed.contains(&format!("backend_api_key_file = {:?}", key.to_str().unwrap())));
    assert!(!printed.contains("sk-engine-secret"), "{printed}");
    // A key that would add a header line is refused, naming the path and never the key.
    std::fs::write(&key, "sk-engine-secret\r\nX-Admin: yes\n").unwrap();
    let output = warmpath(&["check-config", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    let message = stderr(&output);
    assert!(message.starts_with("error: model \"llama\": backend_api_key_file = "), "{message}");
    assert!(message.contains("byte 17 of the key is not a visible ASCII character"), "{message}");
    assert!(!message.contains("sk-engine") && !message.contains("X-Admin"), "{message}");
    std::fs::remove_file(&key).unwrap();
    let output = warmpath(&["check-config", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(2));
    assert!(stderr(&output).contains("engine.key: No such file"), "{}", stderr(&output));
}

#[test]
fn check_config_reports_a_missing_file_with_its_path() {
    let output = warmpath(&["check-config", "/nonexistent/warmpath.toml"]);
    assert_eq!(output.status.code(), Some(2));
    let message = stderr(&output);
    assert!(message.starts_with("error: /nonexistent/warmpath.toml: "), "{message}");
}

#[test]
fn check_config_reports_a_bad_environment_variable() {
    let output = Command::new(env!("CARGO_BIN_EXE_warmpath"))
        .args(["check-config", &example()])
        .env("SESSION_BOOST_TIMEOUT", "forever")
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    let message = stderr(&output);
    assert!(
        message.starts_with("error: environment variable SESSION_BOOST_TIMEOUT = \"forever\": "),
        "{message}"
    );
}

/// `warmpath keygen`: a `wp_` token of 32 random bytes in base64url, then the TOML line with
/// its SHA-256; `--admin` prints the `[server]` line. Two calls never print the same token.
#[test]
fn keygen_prints_a_new_token_and_its_digest_line() {
    use sha2::{Digest, Sha256};
    let mut tokens = Vec::new();
    for args in [&["keygen"][..], &["keygen"], &["keygen", "--admin"]] {
        let output = warmpath(args);
        assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
        assert!(stderr(&output).is_empty(), "{}", stderr(&output));
        let text = stdout(&output);
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        let token = lines[0];
        let random = token.strip_prefix("wp_").unwrap_or_else(|| panic!("no wp_ prefix: {token}"));
        assert_eq!(random.len(), 43, "32 bytes in base64url without padding: {token}");
        let base64url = |c: u8| c.is_ascii_alphanumeric() || c == b'-' || c == b'_';
        assert!(random.bytes().all(base64url), "{token}");
        let digest: String =
            Sha256::digest(token.as_bytes()).iter().map(|b| format!("{b:02x}")).collect();
        let key = if args.len() == 2 { "admin_token_sha256 = \"" } else { "api_key_sha256 = [\"" };
        assert!(lines[1].starts_with(&format!("{key}{digest}\"")), "{}", lines[1]);
        tokens.push(token.to_owned());
    }
    tokens.sort();
    tokens.dedup();
    assert_eq!(tokens.len(), 3, "every call prints a new token");
}

/// The line `keygen` prints is a configuration line: pasted into a `[[tenant]]`, it loads, and
/// `check-config` prints the digest back, never a token.
#[test]
fn keygen_lines_load_and_check_config_prints_digests_only() {
    let output = warmpath(&["keygen"]);
    let text = stdout(&output);
    let (token, line) = text.split_once('\n').unwrap();
    let line = line.split('#').next().unwrap().trim();
    let config = format!(
        "[[tenant]]\nname = \"search-team\"\n{line}\nweight = 3\n\n[[model]]\nname = \"m\"\n\
         backends = [\"127.0.0.1:8001\"]\n"
    );
    let path = write_temp("tenant.toml", &config);
    let output = warmpath(&["check-config", path.to_str().unwrap()]);
    assert_eq!(output.status.code(), Some(0), "{}", stderr(&output));
    let printed = stdout(&output);
    assert!(printed.contains("[[tenant]]\nname = \"search-team\"\n"), "{printed}");
    assert!(printed.contains(line), "{printed}");
    assert!(!printed.contains(token), "a token never appears in the printed configuration");
    assert!(printed.contains("weight = 3\ntokens_per_minute = 0\nrequests_per_minute = 0\n"));
    assert!(printed.contains("[rate_limit]\nstore = \"local\"\n"), "{printed}");
}
