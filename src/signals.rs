//! The process's signals, for the subcommands that run until told to stop (`serve`, `sim`):
//! signal-hook's self-pipe iterator, so a signal is read on an ordinary thread (the caller's),
//! never handled inside the signal handler.
//!
//! A module of its own at the bottom of the layers (it uses nothing of the crate) so that the
//! command line and every tool can install handlers the same way without one of them importing
//! another: `sim` took this from the command line before, which made the command line and the
//! tools one cycle.

use std::os::raw::c_int;
use std::process::ExitCode;

use signal_hook::consts::{SIGINT, SIGTERM};
use signal_hook::iterator::Signals;

/// Handles `signals` from now on, as an iterator. Call it before starting any thread, so no
/// signal arrives before it is handled. On failure the error is printed (`error: installing
/// signal handlers: ...`) and the exit code to return is [`ExitCode::FAILURE`].
pub fn install(signals: &[c_int]) -> Result<Signals, ExitCode> {
    Signals::new(signals).map_err(|error| {
        eprintln!("error: installing signal handlers: {error}");
        ExitCode::FAILURE
    })
}

/// SIGTERM and SIGINT, through [`install`].
pub fn termination_signals() -> Result<Signals, ExitCode> {
    install(&[SIGTERM, SIGINT])
}
