//! `find_model` against serde_json on arbitrary bodies: whenever serde_json refuses the body,
//! so does `find_model`; otherwise both find the same top-level "model"
//! (`warmpath::protocol::harness::check_model_field`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warmpath::protocol::harness::check_model_field(data));
