//! A real router (one shard on loopback, in front of a backend that answers `200 {}`) fed
//! arbitrary client bytes in arbitrary splits: every request the connection model completes
//! gets one response with its route's status, in order; framing errors are answered and close;
//! the router ends idle and counted exactly the responses read
//! (`warmpath::server::harness::check_connection`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warmpath::server::harness::check_connection(data));
