//! A backend response, split into arbitrary reads, through the relay the shard runs (response
//! head, the head written for the client, `BodyRelay` passing a chunked body through or
//! re-framing the body): the client's bytes, parsed back as a client would, carry the body a
//! whole-buffer reference decode finds, a passed-through body is the backend's chunks less
//! extensions and trailers, and the split changes nothing
//! (`warmpath::protocol::harness::check_relay`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warmpath::protocol::harness::check_relay(data));
