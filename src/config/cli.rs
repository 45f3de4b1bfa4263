//! The command line (SPEC 5), parsed with clap's derive API. For now one subcommand:
//! `warmpath check-config FILE [--set KEY=VALUE]...` loads FILE with the process environment
//! and the overrides applied, validates it, and prints the effective configuration.
//!
//! Exit codes: 0 on success; 2 on a usage error (clap's convention) or an invalid
//! configuration, with `error: <message>` on standard error; 1 if standard output fails.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

use super::{process_env, Config, Overrides};

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
    /// Validate a configuration file (with the environment and --set applied) and print the
    /// effective configuration.
    CheckConfig(CheckConfigArgs),
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
        Command::CheckConfig(args) => check_config(&args),
    }
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
    let mut stdout = std::io::stdout().lock();
    match stdout.write_all(config.to_toml().as_bytes()).and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: writing the configuration to standard output: {error}");
            ExitCode::FAILURE
        }
    }
}
