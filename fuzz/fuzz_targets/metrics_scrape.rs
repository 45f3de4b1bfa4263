//! `parse_gauges` on arbitrary bodies, for vLLM and SGLang: it agrees with the naive reference
//! parse (every field, the KV capacity from vLLM's info-gauge labels and the prefix-cache
//! counters included, and every error), never panics, returns only finite, non-negative values,
//! `sum_families` over the summed families fails exactly when it does, and its result does not
//! change when an unrelated line is appended, when a comment is prepended (errors move one line
//! down), when LF line endings become CRLF, and it refuses a body one byte over the limit
//! (`warmpath::control::scrape::reference::check_properties`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warmpath::control::scrape::reference::check_properties(data));
