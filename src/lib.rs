//! warmpath: a router for LLM inference fleets that serves follow-up turns first, on the engine
//! that still holds their prefix (KV) cache.
//!
//! The crate is laid out along the request path (see `ARCHITECTURE.md`, whose code map names
//! every file):
//! - [`bench`](mod@bench): `warmpath bench`, the workload driver: synthetic sessions and trace
//!   replays, a one-thread load generator, reports.
//! - [`cli`]: the command line: clap's definitions and the dispatch to the subcommands.
//! - [`clock`]: the one place that reads time (TSC ticks through quanta) and a simulated clock.
//! - [`config`]: the configuration of SPEC section 4: file, environment, flags, validation and
//!   printing.
//! - [`credential`]: API keys and the admin token: SHA-256 digests, the constant-time lookup
//!   of a tenant by digest, `Authorization: Bearer` and `Basic`, new random tokens.
//! - [`control`]: the control thread: every backend's health checks and metric scrapes at once
//!   on non-blocking sockets, their sans-IO HTTP reader and Prometheus parser, and the
//!   snapshots it sends the schedulers.
//! - [`demo`]: `warmpath demo`: two simulated engines behind the router, fifo against boost.
//! - [`fleet`]: a fleet in virtual time: a bench workload through the real scheduler onto the
//!   sim's engine cores in one thread, to judge a design in seconds.
//! - [`protocol`]: sans-IO HTTP/1.1 for the dataplane: heads, chunked bodies, the `model` field,
//!   the prompt's block hashes, a response's `usage`.
//! - [`ring`]: the cross-thread hand-offs: bounded MPSC rings with their wake-up protocol and
//!   wakers, and the prompt pool that carries a prompt's block hashes to its scheduler.
//! - [`scheduler`]: the per-model sans-IO scheduling state machine (SPEC section 3 and S16),
//!   and nothing else: no thread, no I/O, no clock (the prompt pool it shares with the shards
//!   is in [`ring`], what drives it in [`server`]).
//! - [`server`]: `warmpath serve`, the dataplane: shards, the hosts that run each model's
//!   scheduler, upstream pools, generations and reloads, admin, access log.
//! - [`signals`]: SIGTERM, SIGINT and SIGHUP for the subcommands that run until stopped.
//! - [`sim`]: `warmpath sim`, a simulated vLLM engine (SPEC section 7).
//! - [`splitmix`]: SplitMix64, the seeded sequence and 64-bit mix behind the scheduler's
//!   request-id table, the sim's hashes and the synthetic workloads.
//! - [`wheel`]: the hierarchical timer wheel, sans-IO: the schedulers' grace windows, stale
//!   gauges and placement waits, and the shards' connection timers.
//!
//! Layers point one way (ARCHITECTURE.md, "Layers"): [`cli`] on top; the tools ([`demo`] over
//! [`bench`](mod@bench) and [`sim`], and [`fleet`]) below it; the dataplane ([`server`] over
//! [`control`]); [`config`]; the [`scheduler`]; and at the bottom [`protocol`], [`ring`],
//! [`wheel`], [`clock`], [`credential`], [`signals`] and [`splitmix`], which use nothing of
//! the crate. `tests/layers.rs` fails on a cycle.

// The docs are written for the engineers who work on the router and are built with
// `--document-private-items` (`.ci/run` checks them): a public item may link a private one.
#![allow(rustdoc::private_intra_doc_links)]

pub mod bench;
pub mod cli;
pub mod clock;
pub mod config;
pub mod control;
pub mod credential;
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
