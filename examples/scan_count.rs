//! The body scan alone, for instruction counts under callgrind (`perf/RESULTS.md`, "the string
//! scan"): `find_model` and the prompt's block hashes (`PromptHasher::hash_body`) of one 64 KiB
//! body, repeated.
//!
//! cargo build --release --example scan_count
//! MODE=hash|model|both valgrind --tool=callgrind target/release/examples/scan_count BODY N
//!
//! BODY: `x` (perf/proxy_compare.sh's body64k: one user message padded with `x`) or `chat`
//! (`benches/common/bodies.rs`'s chat body: short strings, escapes and UTF-8). The cost of one
//! scan is the difference of the totals for two values of N over their difference.

use std::hint::black_box;

use warmpath::protocol::{find_model, PromptHasher};

#[path = "../benches/common/bodies.rs"]
mod bodies;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [body, n] = &args[..] else {
        eprintln!("usage: scan_count x|chat N");
        std::process::exit(2);
    };
    let n: usize = n.parse().expect("N");
    let mode = std::env::var("MODE").unwrap_or_else(|_| "both".into());
    let body: Vec<u8> = match body.as_str() {
        "x" => {
            let head = r#"{"model":"bench-model","messages":[{"role":"user","content":"Say hello."#;
            let tail = r#""}],"max_tokens":16}"#;
            let pad = "x".repeat(65_536 - head.len() - tail.len());
            format!("{head}{pad}{tail}").into_bytes()
        }
        "chat" => bodies::chat_body(65_536),
        other => panic!("unknown body {other}"),
    };
    let mut hasher = PromptHasher::new(256);
    let mut hashes = Vec::new();
    let mut total = 0;
    for _ in 0..n {
        if mode != "model" {
            total += hasher.hash_body(black_box(&body), &mut hashes);
        }
        if mode != "hash" {
            total += find_model(black_box(&body)).map_or(0, |f| f.token.start);
        }
    }
    println!("{} bytes, {total}", body.len());
}
