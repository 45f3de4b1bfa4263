//! Benchmarks of the sans-IO HTTP/1.1 layer (`warmpath::protocol`).
//!
//! Dimensions:
//! - `find_model` on OpenAI chat bodies of about 1 KiB, 64 KiB and 512 KiB (a conversation of
//!   user and assistant turns with escapes and non-ASCII text, `"model"` after `"messages"` so
//!   the whole body is scanned either way), against the baseline
//!   `serde_json::from_slice::<serde_json::Value>` + lookup, which is what a router that parses
//!   the body pays;
//! - `rewrite_model` on the same bodies (one copy of the body);
//! - `parse_request_head` on a typical 9-header request head (about 330 bytes);
//! - `chunked_decode`: a 64 KiB body in 4 KiB chunks;
//! - `usage`: `UsageScanner` on a vLLM-style stream of 50 `chat.completion.chunk` events, a
//!   final usage event and `[DONE]`, fed one event per read (about 10 KiB), and on a 2 KiB
//!   non-streaming chat completion fed in one read, against the baseline
//!   `serde_json::from_slice::<serde_json::Value>` of that body (what reading `usage` by parsing
//!   costs).
//! - `relay`: the body of that stream as a backend chunks it (one chunk per event, one read
//!   per chunk) relayed to an HTTP/1.1 client by `BodyRelay`, which passes the chunks through
//!   (issue [12]), against the baseline of the relay before it: each read decoded
//!   (`ChunkedDecoder::feed`) and its data re-sent as one chunk (`ChunkedEncoder::chunk`).
//!
//! Throughput is reported in bytes, so the figures compare to memory bandwidth.

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use warmpath::protocol::{
    find_model, parse_request_head, rewrite_model, BodyRelay, ChunkedDecoder, ChunkedEncoder,
    Limits, ResponseFraming, Side, UsageScanner,
};

#[path = "common/bodies.rs"]
mod bodies;
use bodies::chat_body;

fn model(c: &mut Criterion) {
    let mut group = c.benchmark_group("protocol/find_model");
    for size in [1 << 10, 64 << 10, 512 << 10] {
        let body = chat_body(size);
        assert_eq!(find_model(&body).unwrap().value, "llama-3-8b");
        group.throughput(Throughput::Bytes(body.len() as u64));
        group.bench_with_input(BenchmarkId::new("scan", size), &body, |b, body| {
            b.iter(|| find_model(black_box(body)).map(|f| f.token.start));
        });
        group.bench_with_input(BenchmarkId::new("serde_json_value", size), &body, |b, body| {
            b.iter(|| {
                let v: serde_json::Value = serde_json::from_slice(black_box(body)).unwrap();
                v.get("model").and_then(|m| m.as_str()).map(str::len)
            });
        });
        let mut out = Vec::with_capacity(body.len() + 64);
        group.bench_with_input(BenchmarkId::new("rewrite", size), &body, |b, body| {
            let field = find_model(body).unwrap();
            b.iter(|| {
                out.clear();
                rewrite_model(
                    black_box(body),
                    &field,
                    "meta-llama/Meta-Llama-3-8B-Instruct",
                    &mut out,
                );
                out.len()
            });
        });
    }
    group.finish();
}

fn head(c: &mut Criterion) {
    let head = b"POST /v1/chat/completions HTTP/1.1\r\nHost: router.internal:8080\r\n\
User-Agent: OpenAI/Python 1.40.0\r\nAccept: application/json\r\nContent-Type: application/json\r\n\
Authorization: Bearer sk-0123456789abcdef0123456789abcdef\r\nX-Session-ID: 7f3c9a0e-4b1d-4c2e-9f6a-123456789abc\r\n\
X-Request-ID: req-000001\r\nContent-Length: 1024\r\nConnection: keep-alive\r\n\r\n";
    let limits = Limits::default();
    let mut group = c.benchmark_group("protocol/parse_request_head");
    group.throughput(Throughput::Bytes(head.len() as u64));
    group.bench_function("typical", |b| {
        b.iter(|| parse_request_head(black_box(head), &limits).unwrap().map(|h| h.head_len));
    });
    group.finish();
}

fn chunked(c: &mut Criterion) {
    let data = chat_body(64 << 10);
    let mut encoded = Vec::new();
    for piece in data.chunks(4096) {
        ChunkedEncoder::chunk(piece, &mut encoded);
    }
    ChunkedEncoder::finish(&mut encoded);
    let limits = Limits::default().chunked();
    let mut out = Vec::with_capacity(data.len());
    let mut group = c.benchmark_group("protocol/chunked_decode");
    group.throughput(Throughput::Bytes(encoded.len() as u64));
    group.bench_function("64KiB_in_4KiB_chunks", |b| {
        b.iter(|| {
            out.clear();
            let mut decoder = ChunkedDecoder::new(limits, Side::Downstream);
            decoder.feed(black_box(&encoded), &mut out).unwrap().consumed
        });
    });
    group.finish();
}

/// A vLLM stream with `include_usage`: `events` content chunks, the usage chunk, `[DONE]`; one
/// element per event (one read each).
fn sse_events(events: usize) -> Vec<Vec<u8>> {
    let mut out: Vec<Vec<u8>> = (0..events)
        .map(|i| {
            format!(
                "data: {{\"id\":\"chatcmpl-9c1f7e0d2b\",\"object\":\"chat.completion.chunk\",\
                 \"created\":1733251200,\"model\":\"meta-llama/Meta-Llama-3-8B-Instruct\",\
                 \"choices\":[{{\"index\":0,\"delta\":{{\"content\":\" word{i}\"}},\
                 \"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
            )
            .into_bytes()
        })
        .collect();
    out.push(
        b"data: {\"id\":\"chatcmpl-9c1f7e0d2b\",\"object\":\"chat.completion.chunk\",\
          \"created\":1733251200,\"model\":\"meta-llama/Meta-Llama-3-8B-Instruct\",\
          \"choices\":[],\"usage\":{\"prompt_tokens\":1187,\"total_tokens\":1237,\
          \"completion_tokens\":50,\"prompt_tokens_details\":{\"cached_tokens\":1024}}}\n\n"
            .to_vec(),
    );
    out.push(b"data: [DONE]\n\n".to_vec());
    out
}

/// A non-streaming chat completion of about `bytes` bytes.
fn completion_body(bytes: usize) -> Vec<u8> {
    let head = r#"{"id":"chatcmpl-9c1f7e0d2b","object":"chat.completion","created":1733251200,"model":"meta-llama/Meta-Llama-3-8B-Instruct","choices":[{"index":0,"message":{"role":"assistant","content":""#;
    let tail = r#"","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":1187,"total_tokens":1699,"completion_tokens":512,"prompt_tokens_details":{"cached_tokens":1024}},"prompt_logprobs":null}"#;
    let mut body = head.to_owned();
    let words = r#"Prefix caches keep the KV state of \"earlier\" prompts; ünïcödé ok.\n "#;
    while body.len() + words.len() + tail.len() < bytes {
        body.push_str(words);
    }
    body.push_str(tail);
    body.into_bytes()
}

fn usage(c: &mut Criterion) {
    let mut group = c.benchmark_group("protocol/usage");
    let events = sse_events(50);
    let total: usize = events.iter().map(Vec::len).sum();
    let mut scanner = UsageScanner::new();
    group.throughput(Throughput::Bytes(total as u64));
    group.bench_function("sse_50_events", |b| {
        b.iter(|| {
            scanner.reset();
            for event in &events {
                scanner.feed(black_box(event));
            }
            scanner.usage()
        });
    });
    assert_eq!(scanner.usage().prompt_tokens, Some(1187));
    let body = completion_body(2048);
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("json_2KiB", |b| {
        b.iter(|| {
            scanner.reset();
            scanner.feed(black_box(&body));
            scanner.usage()
        });
    });
    assert_eq!(scanner.usage().cached_tokens, Some(1024));
    group.bench_function("json_2KiB serde_json_value (baseline)", |b| {
        b.iter(|| {
            let v: serde_json::Value = serde_json::from_slice(black_box(&body)).unwrap();
            v["usage"]["prompt_tokens"].as_u64()
        });
    });
    group.finish();
}

fn relay(c: &mut Criterion) {
    let mut reads: Vec<Vec<u8>> = sse_events(50)
        .iter()
        .map(|event| {
            let mut read = Vec::new();
            ChunkedEncoder::chunk(event, &mut read);
            read
        })
        .collect();
    reads.push(ChunkedEncoder::LAST_CHUNK.to_vec());
    let total: usize = reads.iter().map(Vec::len).sum();
    let (mut out, mut scratch) = (Vec::with_capacity(16 << 10), Vec::with_capacity(4096));
    let mut group = c.benchmark_group("protocol/relay");
    group.throughput(Throughput::Bytes(total as u64));
    group.bench_function("sse_50_events pass-through", |b| {
        b.iter(|| {
            out.clear();
            let mut relay = BodyRelay::new(ResponseFraming::Chunked, ResponseFraming::Chunked);
            for read in &reads {
                relay.feed(black_box(read), false, &mut scratch, &mut out).unwrap();
            }
            out.len()
        });
    });
    assert_eq!(out.len(), total, "passed through unchanged");
    let limits = warmpath::protocol::relay::UPSTREAM_CHUNK_LIMITS;
    group.bench_function("sse_50_events decode and re-chunk (baseline)", |b| {
        b.iter(|| {
            out.clear();
            let mut decoder = ChunkedDecoder::new(limits, Side::Upstream);
            for read in &reads {
                scratch.clear();
                decoder.feed(black_box(read), &mut scratch).unwrap();
                ChunkedEncoder::chunk(&scratch, &mut out);
            }
            ChunkedEncoder::finish(&mut out);
            out.len()
        });
    });
    group.finish();
}

criterion_group!(benches, model, head, chunked, usage, relay);
criterion_main!(benches);
