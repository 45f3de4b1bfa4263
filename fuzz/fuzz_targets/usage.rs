//! The response `usage` scanner on arbitrary bodies, raw or wrapped as SSE `data:` events
//! (`warmpath::protocol::harness::check_usage`): the same result fed whole, in pieces and byte
//! by byte; the result serde_json finds wherever it reads the body (JSON, or SSE of JSON); and
//! with a chunk-size line inserted anywhere, for each key nothing or a value the body holds.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warmpath::protocol::harness::check_usage(data));
