//! Random operation sequences applied to the real scheduler and to the naive reference model of
//! SPEC section 3, compared output by output (`warmpath::scheduler::harness`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warmpath::scheduler::harness::run(data));
