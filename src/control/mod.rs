//! The control thread: what the router knows about each backend besides its own inflight count.
//!
//! Its job (SPEC sections 1 and 4): every `upstream.metrics_interval` it requests each
//! backend's `upstream.health_path` and, when that answers 2xx, scrapes its Prometheus
//! `/metrics` (engines `vllm` and `sglang`; `openai` backends are not scraped), then sends each
//! model's scheduler a backend snapshot (`scheduler::Snapshot`: healthy, waiting gauge, when it
//! was taken, and what the engine exports about its caches: KV capacity and prefix-cache
//! counters, issue \[8\]). A snapshot is also an admission trigger: a backend that reported room
//! may take queued requests. A waiting gauge older than `upstream.metrics_stale_after` no
//! longer holds requests back (the scheduler arms that timer from the snapshot's tick), and a
//! failed scrape sends `waiting: None` and an unknown cache, so the scheduler judges the backend
//! on its inflight count alone. The scraped gauges also reach `GET /debug/backends` and
//! `warmpath_backend_waiting` (SPEC section 6), through each scheduler's report.
//!
//! - [`scrape`]: the Prometheus text exposition format 0.0.4 parser that extracts each engine's
//!   waiting, running and cache-usage gauges, its KV capacity and its prefix-cache counters
//!   ([`scrape::parse_gauges`]); sans-IO.
//! - [`probe`]: the HTTP/1.1 `GET` of a check, sans-IO (a response read in any split, with head
//!   and body limits), built on `crate::protocol`, and a blocking driver for the bench and tests.
//! - [`prober`]: every backend's checks at once on non-blocking sockets in one mio `Poll`, each
//!   backend on its own schedule and with its own deadlines (issue \[9\]).
//! - [`thread`]: the control thread itself: runs the prober, one snapshot per backend per
//!   check pushed into its model's inbox; takes a new plan on a live reload.

pub mod probe;
pub mod prober;
pub mod scrape;
pub mod thread;
