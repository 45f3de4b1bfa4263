//! `warmpath sim` end to end on loopback: a real server on `127.0.0.1:0`, a raw HTTP/1.1
//! client that sees the exact framing (chunked SSE), OpenAI bodies parsed with serde_json.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use serde_json::{json, Value};
use warmpath::clock::Clock;
use warmpath::sim::{start, RunningSim, SimOptions};

fn sim(time_scale: f64) -> RunningSim {
    let options = SimOptions { time_scale, seed: 7, ..SimOptions::new() };
    start(options).expect("the sim starts")
}

/// One keep-alive connection.
struct Client {
    reader: BufReader<TcpStream>,
}

/// A response: status, lower-cased headers, body (de-chunked).
struct Response {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Response {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a JSON body")
    }

    /// The SSE `data:` payloads, in order.
    fn events(&self) -> Vec<String> {
        let text = String::from_utf8(self.body.clone()).expect("UTF-8");
        text.split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| e.strip_prefix("data: ").expect("a data line").to_owned())
            .collect()
    }
}

impl Client {
    fn new(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        Client { reader: BufReader::new(stream) }
    }

    fn send(&mut self, method: &str, path: &str, body: Option<&Value>) -> Response {
        let body = body.map(Value::to_string).unwrap_or_default();
        let request = format!(
            "{method} {path} HTTP/1.1\r\nHost: sim\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
            body.len()
        );
        self.reader.get_mut().write_all(request.as_bytes()).unwrap();
        self.read_response()
    }

    fn line(&mut self) -> String {
        let mut line = String::new();
        self.reader.read_line(&mut line).expect("a line");
        line.trim_end_matches(['\r', '\n']).to_owned()
    }

    fn read_response(&mut self) -> Response {
        let status_line = self.line();
        let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status");
        let mut headers = Vec::new();
        loop {
            let line = self.line();
            if line.is_empty() {
                break;
            }
            let (name, value) = line.split_once(':').expect("a header");
            headers.push((name.to_ascii_lowercase(), value.trim().to_owned()));
        }
        let mut response = Response { status, headers, body: Vec::new() };
        if let Some(len) = response.header("content-length") {
            let mut body = vec![0; len.parse().unwrap()];
            self.reader.read_exact(&mut body).unwrap();
            response.body = body;
        } else {
            assert_eq!(response.header("transfer-encoding"), Some("chunked"));
            loop {
                let size = usize::from_str_radix(&self.line(), 16).expect("a chunk size");
                let mut chunk = vec![0; size + 2];
                self.reader.read_exact(&mut chunk).unwrap();
                assert_eq!(&chunk[size..], b"\r\n");
                if size == 0 {
                    break;
                }
                response.body.extend_from_slice(&chunk[..size]);
            }
        }
        response
    }
}

fn chat(content: &str, max_tokens: u32, stream: bool) -> Value {
    json!({
        "model": "sim-8b",
        "messages": [
            {"role": "system", "content": SYSTEM},
            {"role": "user", "content": content},
        ],
        "max_tokens": max_tokens,
        "stream": stream,
        "stream_options": {"include_usage": true},
    })
}

/// A system prompt of 66 words: with its role token, four full blocks of 16 tokens.
const SYSTEM: &str = "you are a helpful assistant that answers questions about routers and caches \
    in plain words without lists and without code unless asked for it and you keep every answer \
    short and to the point so that a reader on a small screen can follow it easily when tired \
    and busy with other things during a long day of work in front of machines that never sleep";

/// The value of the sample `name{model_name="sim-8b"}` in a `/metrics` body.
fn metric(body: &str, name: &str) -> f64 {
    let prefix = format!("{name}{{model_name=\"sim-8b\"}} ");
    body.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .unwrap_or_else(|| panic!("{name} missing from\n{body}"))
        .parse()
        .unwrap()
}

#[test]
fn a_non_streamed_chat_answer_has_exactly_max_tokens_words_and_its_usage() {
    let sim = sim(100.0);
    let mut client = Client::new(sim.addr());
    let response = client.send("POST", "/v1/chat/completions", Some(&chat("hello", 12, false)));
    assert_eq!(response.status, 200);
    let body = response.json();
    assert_eq!(body["object"], "chat.completion");
    assert_eq!(body["model"], "sim-8b");
    let content = body["choices"][0]["message"]["content"].as_str().unwrap();
    assert_eq!(content.split(' ').count(), 12);
    assert_eq!(body["choices"][0]["finish_reason"], "length");
    let words = SYSTEM.split_whitespace().count() as u64;
    // system: + words + user: + hello + assistant:
    assert_eq!(body["usage"]["prompt_tokens"], words + 4);
    assert_eq!(body["usage"]["completion_tokens"], 12);
    // The same request again gets the same answer (same seed, same prompt).
    let again = client.send("POST", "/v1/chat/completions", Some(&chat("hello", 12, false)));
    assert_eq!(again.json()["choices"][0]["message"]["content"], content);
    sim.stop();
}

#[test]
fn a_streamed_answer_is_one_sse_chunk_per_token_then_usage_then_done() {
    let sim = sim(100.0);
    let mut client = Client::new(sim.addr());
    let response = client.send("POST", "/v1/chat/completions", Some(&chat("stream it", 5, true)));
    assert_eq!(response.status, 200);
    assert!(response.header("content-type").unwrap().starts_with("text/event-stream"));
    let events = response.events();
    assert_eq!(events.len(), 5 + 2, "{events:?}");
    assert_eq!(events.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> =
        events[..6].iter().map(|e| serde_json::from_str(e).expect("JSON chunk")).collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String =
        chunks[..5].iter().map(|c| c["choices"][0]["delta"]["content"].as_str().unwrap()).collect();
    assert_eq!(text.split(' ').count(), 5);
    assert_eq!(chunks[4]["choices"][0]["finish_reason"], "length");
    assert_eq!(chunks[5]["choices"], json!([]));
    assert_eq!(chunks[5]["usage"]["completion_tokens"], 5);
    // Completions stream on the same connection; no usage chunk when not asked for.
    let body =
        json!({"model": "sim-8b", "prompt": "one two three", "max_tokens": 3, "stream": true});
    let events = client.send("POST", "/v1/completions", Some(&body)).events();
    assert_eq!(events.len(), 4);
    let first: Value = serde_json::from_str(&events[0]).unwrap();
    assert_eq!(first["object"], "text_completion");
    sim.stop();
}

#[test]
fn a_shared_prefix_shows_as_prefix_cache_hits_in_metrics() {
    let sim = sim(100.0);
    let mut client = Client::new(sim.addr());
    let before = String::from_utf8(client.send("GET", "/metrics", None).body).unwrap();
    assert_eq!(metric(&before, "vllm:prefix_cache_hits_total"), 0.0);
    assert_eq!(metric(&before, "vllm:num_requests_running"), 0.0);
    let first =
        client.send("POST", "/v1/chat/completions", Some(&chat("first question", 4, false)));
    assert_eq!(first.json()["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    let second = client.send("POST", "/v1/chat/completions", Some(&chat("another one", 4, false)));
    // The system prompt (67 tokens with its role) covers four full blocks of 16.
    assert_eq!(second.json()["usage"]["prompt_tokens_details"]["cached_tokens"], 64);
    let after = String::from_utf8(client.send("GET", "/metrics", None).body).unwrap();
    assert_eq!(metric(&after, "vllm:prefix_cache_hits_total"), 64.0);
    let prompt = (SYSTEM.split_whitespace().count() + 5) as f64;
    assert_eq!(metric(&after, "vllm:prefix_cache_queries_total"), 2.0 * prompt);
    assert_eq!(metric(&after, "vllm:time_to_first_token_seconds_count"), 2.0);
    assert_eq!(metric(&after, "vllm:e2e_request_latency_seconds_count"), 2.0);
    assert_eq!(metric(&after, "vllm:num_requests_waiting"), 0.0);
    assert_eq!(metric(&after, "vllm:kv_cache_usage_perc"), 0.0);
    sim.stop();
}

#[test]
fn health_models_and_errors() {
    let sim = sim(100.0);
    let mut client = Client::new(sim.addr());
    assert_eq!(client.send("GET", "/health", None).status, 200);
    let models = client.send("GET", "/v1/models", None);
    assert_eq!(models.json()["data"][0]["id"], "sim-8b");
    let unknown = json!({"model": "other", "prompt": "hi"});
    let response = client.send("POST", "/v1/completions", Some(&unknown));
    assert_eq!(
        (response.status, response.json()["error"]["code"].as_str()),
        (404, Some("model_not_found"))
    );
    let bad = json!({"model": "sim-8b", "messages": "nope"});
    assert_eq!(client.send("POST", "/v1/chat/completions", Some(&bad)).status, 400);
    assert_eq!(client.send("GET", "/nowhere", None).status, 404);
    sim.stop();
}

/// sglang-router asks every worker for its model and server info and, when one answers, tries
/// to fetch that model's tokenizer from a hub on the internet. The peer comparison
/// (`perf/peer_compare.sh`) puts it in front of this engine on a machine that must stay on
/// loopback, so these routes must stay unknown: 404, whatever the method.
#[test]
fn the_info_routes_a_peer_router_probes_are_not_found() {
    let sim = sim(100.0);
    let mut client = Client::new(sim.addr());
    for path in ["/get_model_info", "/model_info", "/get_server_info", "/server_info"] {
        for method in ["GET", "POST"] {
            let response = client.send(method, path, None);
            assert_eq!(response.status, 404, "{method} {path}");
            assert_eq!(response.json()["error"]["code"], "not_found", "{method} {path}");
        }
    }
    sim.stop();
}

#[test]
fn a_client_that_leaves_aborts_its_request() {
    let sim = sim(1.0);
    let mut client = Client::new(sim.addr());
    let body = chat("a very long answer please", 100_000, true);
    let request = format!(
        "POST /v1/chat/completions HTTP/1.1\r\nHost: sim\r\nContent-Length: {}\r\n\r\n{body}",
        body.to_string().len()
    );
    client.reader.get_mut().write_all(request.as_bytes()).unwrap();
    assert!(client.line().starts_with("HTTP/1.1 200"));
    let mut observer = Client::new(sim.addr());
    let running = |c: &mut Client| {
        let text = String::from_utf8(c.send("GET", "/metrics", None).body).unwrap();
        metric(&text, "vllm:num_requests_running")
    };
    assert_eq!(running(&mut observer), 1.0);
    drop(client);
    let clock = Clock::real();
    let start = clock.now();
    while running(&mut observer) != 0.0 {
        assert!(clock.rate().duration(clock.now() - start) < Duration::from_secs(5), "not aborted");
        std::thread::sleep(Duration::from_millis(5));
    }
    sim.stop();
}
