//! `parse_gauges` on arbitrary bodies, for vLLM and SGLang: it never panics, returns only finite,
//! non-negative gauges, and its result does not change when an unrelated line is appended, when a
//! comment is prepended (errors move one line down), when LF line endings become CRLF, and it
//! refuses a body one byte over the limit (`warmpath::control::scrape::check_properties`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warmpath::control::scrape::check_properties(data));
