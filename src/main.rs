//! The `warmpath` binary: subcommands over the library.

use std::process::ExitCode;

#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn main() -> ExitCode {
    warmpath::cli::main()
}
