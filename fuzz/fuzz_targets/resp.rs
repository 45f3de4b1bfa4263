//! The rate-limit store's RESP reply parser on arbitrary bytes, as a hostile or broken Redis
//! could send them (`warmpath::server::rate_limit::resp::check_parse`): no panic, bounded
//! work, and a reply read the same from exactly its own bytes, never from fewer.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warmpath::server::rate_limit::resp::check_parse(data));
