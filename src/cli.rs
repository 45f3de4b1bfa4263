//! The command line (SPEC 5), parsed with clap's derive API:
//! - `warmpath serve [--config FILE] [--listen ADDR] [--admin-listen ADDR] [--set KEY=VALUE]...`
//!   runs the router until SIGTERM or SIGINT, then shuts down as S13 says and exits 0;
//! - `warmpath demo [...]` compares fifo and session-boost on simulated engines (`crate::demo`);
//! - `warmpath sim [...]` runs a simulated vLLM engine (`crate::sim`);
//! - `warmpath bench --target URL [...]` drives a workload and reports (`crate::bench`);
//! - `warmpath check-config FILE [--set KEY=VALUE]...` loads FILE with the process environment
//!   and the overrides applied, validates it, and prints the effective configuration;
//! - `warmpath keygen` prints a new random API key or admin token and the configuration line
//!   with its digest (issue \[11\]; `crate::credential`).
//!
//! Exit codes: 0 on success; 2 on a usage error (clap's convention) or an invalid
//! configuration, with `error: <message>` on standard error; 1 if standard output fails or the
//! router cannot start (a listener address in use, for example).
//!
//! This is the top layer (ARCHITECTURE.md, "Layers"): it knows every subcommand and calls the
//! layer below; nothing in the crate uses it but `src/main.rs`.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};

use crate::clock::Clock;
use crate::config::{process_env, Config, Overrides};

/// warmpath: a session-aware router for LLM inference fleets.
#[derive(Debug, Parser)]
#[command(name = "warmpath", version, about, long_about = None)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The subcommands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the router.
    Serve(ServeArgs),
    /// Run a simulated vLLM engine (SPEC section 7): OpenAI API, vLLM metrics, prefix cache,
    /// continuous batching, a step-time model.
    Sim(crate::sim::SimArgs),
    /// Start two simulated engines and the router on loopback, run one multi-turn workload with
    /// `fifo` and with `session-boost`, print the comparison and write a report.
    Demo(crate::demo::DemoArgs),
    /// Drive a workload against an OpenAI-compatible URL (SPEC section 8) and report TTFT,
    /// inter-token and end-to-end latency for first turns and follow-ups.
    Bench(Box<crate::bench::BenchArgs>),
    /// Validate a configuration file (with the environment and --set applied) and print the
    /// effective configuration.
    CheckConfig(CheckConfigArgs),
    /// Print a new random API key (or admin token) and the configuration line with its
    /// SHA-256 digest: give the key to its tenant, put the line in its tenant table (or, with
    /// --admin, in the server table).
    Keygen(KeygenArgs),
}

/// Arguments of `keygen`.
#[derive(Debug, clap::Args)]
pub struct KeygenArgs {
    /// Print the line for `[server] admin_token_sha256` rather than a tenant's
    /// `api_key_sha256`.
    #[arg(long)]
    pub admin: bool,
}

/// Arguments of `check-config`.
#[derive(Debug, clap::Args)]
pub struct CheckConfigArgs {
    /// The TOML configuration file.
    #[arg(value_name = "FILE")]
    pub file: PathBuf,
    /// Override a key, e.g. `--set queue.max_overtakes=4`, `--set model.NAME.routing=round-robin`
    /// (beats the file and the environment; repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_set)]
    pub set: Vec<(String, String)>,
}

/// Arguments of `serve`.
#[derive(Debug, clap::Args)]
pub struct ServeArgs {
    /// The TOML configuration file (without one, the environment must name the models).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The main listener, e.g. `127.0.0.1:8080` (beats the file and the environment).
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<String>,
    /// The admin listener for /metrics and /debug/*.
    #[arg(long = "admin-listen", value_name = "ADDR")]
    pub admin_listen: Option<String>,
    /// Override a key, as for `check-config` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = parse_set)]
    pub set: Vec<(String, String)>,
}

fn parse_set(argument: &str) -> Result<(String, String), String> {
    Overrides::parse_set(argument).map_err(|error| error.to_string())
}

/// Entry point of the binary: parses `std::env::args_os`, runs, and returns the exit code.
pub fn main() -> ExitCode {
    run(std::env::args_os())
}

/// Parses `args` (the first is the program name) and runs the subcommand.
pub fn run(args: impl IntoIterator<Item = OsString>) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(cli) => cli,
        Err(error) => {
            // Prints help or version to stdout (exit 0), usage errors to stderr (exit 2).
            let _ = error.print();
            return ExitCode::from(u8::try_from(error.exit_code()).unwrap_or(2));
        }
    };
    match cli.command {
        Command::Serve(args) => serve(&args),
        Command::Sim(args) => crate::sim::run(&args),
        Command::Demo(args) => crate::demo::run(&args),
        Command::Bench(args) => crate::bench::run(&args),
        Command::CheckConfig(args) => check_config(&args),
        Command::Keygen(args) => keygen(&args),
    }
}

/// `warmpath keygen`: the token on the first line (the only time it is shown), then the TOML
/// line holding its digest.
fn keygen(args: &KeygenArgs) -> ExitCode {
    let token = match crate::credential::new_token() {
        Ok(token) => token,
        Err(error) => {
            eprintln!("error: reading the operating system's random source: {error}");
            return ExitCode::FAILURE;
        }
    };
    let digest = crate::credential::hex(&crate::credential::digest(token.as_bytes()));
    let line = match args.admin {
        true => format!("admin_token_sha256 = \"{digest}\"   # in [server]"),
        false => format!("api_key_sha256 = [\"{digest}\"]   # in the tenant's [[tenant]]"),
    };
    let mut stdout = std::io::stdout().lock();
    match writeln!(stdout, "{token}\n{line}").and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: writing the token to standard output: {error}");
            ExitCode::FAILURE
        }
    }
}

/// `warmpath serve`.
fn serve(args: &ServeArgs) -> ExitCode {
    let overrides = Overrides {
        listen: args.listen.clone(),
        admin_listen: args.admin_listen.clone(),
        set: args.set.clone(),
    };
    let config = match Config::load(args.config.as_deref(), &process_env, &overrides) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    let mut signals = match crate::signals::install(&[SIGTERM, SIGINT, SIGHUP]) {
        Ok(signals) => signals,
        Err(code) => return code,
    };
    let source = args.config.clone().map(|path| crate::server::ConfigSource {
        path,
        overrides: overrides.clone(),
        env: process_env,
    });
    if let (_, Some(warning)) = crate::server::raise_open_file_limit(config.server.max_connections)
    {
        eprintln!("warmpath: warning: {warning}");
    }
    let running = match crate::server::start_with_source(config, source, Clock::real()) {
        Ok(running) => running,
        Err(error) => {
            eprintln!("error: starting the router: {error}");
            return ExitCode::FAILURE;
        }
    };
    eprintln!(
        "warmpath: listening on {} (admin {}); SIGHUP to reload, SIGTERM or SIGINT to stop",
        running.addr(),
        running.admin_addr()
    );
    for signal in signals.forever() {
        if signal == SIGHUP {
            // Logged by the reload itself; a refused file leaves the running configuration.
            let _ = running.reload();
            continue;
        }
        eprintln!("warmpath: signal {signal}: draining (S13)");
        break;
    }
    running.shutdown();
    running.wait();
    eprintln!("warmpath: stopped");
    ExitCode::SUCCESS
}

/// `warmpath check-config`.
fn check_config(args: &CheckConfigArgs) -> ExitCode {
    let overrides = Overrides { set: args.set.clone(), ..Overrides::default() };
    let config = match Config::load(Some(&args.file), &process_env, &overrides) {
        Ok(config) => config,
        Err(error) => {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    };
    // `[server.tls]`'s files are read as `serve` would read them, so that a bad pair shows
    // here rather than at the start or reload it would stop.
    if let Some((cert, key)) = config.server.tls.files() {
        if let Err(error) = crate::server::tls::load(cert, key, crate::clock::wall_time().as_secs())
        {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    }
    // So are the engines' key files (never printed: the output names the path).
    for model in &config.models {
        if let Err(error) = model.backend_key() {
            eprintln!("error: {error}");
            return ExitCode::from(2);
        }
    }
    for warning in config.warnings() {
        eprintln!("warning: {warning}");
    }
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(config.to_toml().as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: writing the configuration to standard output: {error}");
            ExitCode::FAILURE
        }
    }
}
