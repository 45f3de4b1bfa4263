//! The incremental chunked decoder, fed in arbitrary pieces, against a whole-buffer reference
//! decoder of RFC 9112 7.1 with the same limits; and its pass-through (`ChunkedDecoder::pass`)
//! in the same pieces: it stops or fails where decoding does, counts the same data, and sends
//! on what a whole-buffer reference keeps (`warmpath::protocol::harness::check_chunked`).
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| warmpath::protocol::harness::check_chunked(data));
