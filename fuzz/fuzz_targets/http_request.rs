//! Arbitrary client bytes, split at arbitrary points, through request head parsing, fixed and
//! chunked body reading, forwarding and the response head parser: never a panic, and the same
//! events however the stream is split (`warmpath::protocol::harness::check_http_request`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warmpath::protocol::harness::check_http_request(data));
