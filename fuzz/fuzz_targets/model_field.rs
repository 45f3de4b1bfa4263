//! `find_model` against serde_json on arbitrary bodies: whenever serde_json refuses the body,
//! so does `find_model`; otherwise both find the same top-level "model"
//! (`warmpath::protocol::harness::check_model_field`). The fused pass,
//! `find_model_and_prompt`, must give exactly `find_model`'s result, and its prompt hashes
//! (in blocks of 3 and of 16 bytes) must be those of the prompt text that
//! `harness::reference_prompt_text` reads with serde_json wherever serde_json reads the body.
//! The same pass recording top-level fields (the `body:` session sources, `scan_body`) must
//! give the same result and find each of `harness::CHECK_FIELDS` where
//! `harness::reference_field` does.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warmpath::protocol::harness::check_model_field(data));
