//! warmpath: a router for LLM inference fleets that serves follow-up turns first, on the engine
//! that still holds their prefix (KV) cache.
//!
//! The crate is laid out along the request path (see `ARCHITECTURE.md`):
//! - [`bench`](mod@bench): `warmpath bench`, the workload driver: synthetic sessions and trace
//!   replays.
//! - [`cli`]: the command line: clap's definitions and the dispatch to the subcommands.
//! - [`clock`]: the one place that reads time (TSC ticks through quanta) and a simulated clock.
//! - [`config`]: the configuration of SPEC section 4: file, environment, flags, validation.
//! - [`control`]: the control thread's sans-IO parts: parsing backends' Prometheus metrics.
//! - [`demo`]: `warmpath demo`: two simulated engines behind the router, fifo against boost.
//! - [`protocol`]: sans-IO HTTP/1.1 for the dataplane: heads, chunked bodies, the `model` field.
//! - [`ring`]: bounded MPSC rings between threads, with their wake-up protocol.
//! - [`scheduler`]: the per-model sans-IO scheduling state machine (SPEC section 3).
//! - [`server`]: `warmpath serve`, the dataplane: shards, rings, upstream pools, admin.
//! - [`signals`]: SIGTERM, SIGINT and SIGHUP for the subcommands that run until stopped.
//! - [`sim`]: `warmpath sim`, a simulated vLLM engine (SPEC section 7).
//! - [`splitmix`]: SplitMix64, the seeded sequence and 64-bit mix behind the sim's hashes and
//!   the synthetic workloads.
//! - [`wheel`]: the hierarchical timer wheel, sans-IO: the schedulers' grace windows, stale
//!   gauges and placement waits, and the shards' connection timers.
//!
//! Layers point one way (ARCHITECTURE.md, "Layers"): [`cli`] on top; the tools ([`demo`] over
//! [`bench`](mod@bench) and [`sim`]) below it; the dataplane ([`server`] over [`control`]); the
//! [`scheduler`]; and at the bottom [`config`], [`protocol`], [`ring`], [`clock`], [`signals`]
//! and [`splitmix`], which use nothing of the crate. `tests/layers.rs` fails on a cycle.

pub mod bench;
pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod demo;
pub mod fleet;
pub mod protocol;
pub mod ring;
pub mod scheduler;
pub mod server;
pub mod signals;
pub mod sim;
pub mod splitmix;
pub mod wheel;
