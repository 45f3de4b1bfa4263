use super::*;
use crate::protocol::harness::{check_usage, reference_usage};

fn usage(prompt: Option<u32>, cached: Option<u32>, completion: Option<u32>) -> Usage {
    Usage { prompt_tokens: prompt, cached_tokens: cached, completion_tokens: completion }
}

/// The usage of `body` fed whole.
fn whole(body: &[u8]) -> Usage {
    let mut scanner = UsageScanner::new();
    scanner.feed(body);
    scanner.usage()
}

/// `body` fed in two pieces split at every offset, and in three pieces at every pair of
/// offsets when it is short, gives what it gives whole.
fn every_split(body: &[u8]) -> Usage {
    let expected = whole(body);
    let mut scanner = UsageScanner::new();
    for at in 0..=body.len() {
        scanner.reset();
        scanner.feed(&body[..at]);
        scanner.feed(&body[at..]);
        assert_eq!(scanner.usage(), expected, "split at {at}");
    }
    if body.len() <= 400 {
        for a in 0..=body.len() {
            for b in a..=body.len() {
                scanner.reset();
                for piece in [&body[..a], &body[a..b], &body[b..]] {
                    scanner.feed(piece);
                }
                assert_eq!(scanner.usage(), expected, "split at {a} and {b}");
            }
        }
    }
    let mut scanner = UsageScanner::new();
    for byte in body {
        scanner.feed(std::slice::from_ref(byte));
    }
    assert_eq!(scanner.usage(), expected, "byte by byte");
    expected
}

const VLLM: &str = r#"{"id":"chatcmpl-8f2c1a","object":"chat.completion","created":1733251200,"model":"meta-llama/Meta-Llama-3-8B-Instruct","choices":[{"index":0,"message":{"role":"assistant","content":"The prefix cache keeps KV blocks of earlier prompts.","tool_calls":[]},"logprobs":null,"finish_reason":"stop","stop_reason":null}],"usage":{"prompt_tokens":1187,"total_tokens":1199,"completion_tokens":12,"prompt_tokens_details":{"cached_tokens":1024}},"prompt_logprobs":null}"#;

const VLLM_NO_DETAILS: &str = r#"{"id":"cmpl-1","object":"text_completion","created":1,"model":"m","choices":[{"index":0,"text":" world","logprobs":null,"finish_reason":"length","stop_reason":null}],"usage":{"prompt_tokens":5,"total_tokens":7,"completion_tokens":2,"prompt_tokens_details":null}}"#;

const SGLANG: &str = "{\"id\":\"3f0c\",\"object\":\"chat.completion\",\"created\":1733251200,\
\"model\":\"qwen\",\"choices\":[{\"index\":0,\"message\":{\"role\":\"assistant\",\"content\":\
\"Hello!\",\"reasoning_content\":null,\"tool_calls\":null},\"logprobs\":null,\
\"finish_reason\":\"stop\",\"matched_stop\":151645}],\"usage\": {\"prompt_tokens\": 21, \
\"total_tokens\": 24, \"completion_tokens\": 3, \"prompt_tokens_details\": {\"cached_tokens\": 16}}}";

/// A vLLM stream with `stream_options.include_usage`: chunks without usage, then the usage
/// chunk with no choices, then `[DONE]`.
fn vllm_stream() -> String {
    let mut body = String::new();
    let chunk = |content: &str| {
        format!(
            "data: {{\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\
             \"model\":\"m\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}},\
             \"logprobs\":null,\"finish_reason\":null}}]}}\n\n"
        )
    };
    body.push_str(&chunk("Prefix"));
    body.push_str(&chunk(" caches \\\"prompt_tokens\\\": 7"));
    body.push_str(&chunk(" help."));
    body.push_str(
        "data: {\"id\":\"chatcmpl-1\",\"object\":\"chat.completion.chunk\",\"created\":1,\
         \"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":42,\"total_tokens\":45,\
         \"completion_tokens\":3,\"prompt_tokens_details\":{\"cached_tokens\":32}}}\n\n",
    );
    body.push_str("data: [DONE]\n\n");
    body
}

#[test]
fn engines_bodies_split_anywhere() {
    assert_eq!(every_split(VLLM.as_bytes()), usage(Some(1187), Some(1024), Some(12)));
    assert_eq!(every_split(VLLM_NO_DETAILS.as_bytes()), usage(Some(5), None, Some(2)));
    assert_eq!(every_split(SGLANG.as_bytes()), usage(Some(21), Some(16), Some(3)));
    assert_eq!(every_split(vllm_stream().as_bytes()), usage(Some(42), Some(32), Some(3)));
    for body in [VLLM, VLLM_NO_DETAILS, SGLANG] {
        check_usage(&[&[0u8, 3][..], body.as_bytes()].concat());
    }
}

#[test]
fn a_body_without_usage_reports_none() {
    let body =
        r#"{"id":"x","choices":[{"message":{"role":"assistant","content":"hi"}}],"usage":null}"#;
    assert_eq!(every_split(body.as_bytes()), Usage::default());
    let stream = "data: {\"choices\":[{\"delta\":{\"content\":\"a\"}}]}\n\ndata: [DONE]\n\n";
    assert_eq!(every_split(stream.as_bytes()), Usage::default());
    assert_eq!(whole(b""), Usage::default());
}

#[test]
fn text_about_the_keys_is_not_read() {
    let content = [
        r#"The field \"prompt_tokens\": 99 counts the prompt."#,
        r#"{\"usage\":{\"prompt_tokens\":99,\"cached_tokens\":98}}"#,
        r#"prompt_tokens"#,
        r#"see prompt_tokens"#,
        r#"\\"#,
        r#"\"cached_tokens\" : 5 , x"#,
        r#"\"completion_tokens\": 99999}"#,
    ];
    for text in content {
        let body = format!(
            r#"{{"choices":[{{"message":{{"role":"assistant","content":"{text}"}}}}],"n":["prompt_tokens",{{"x":"cached_tokens"}}],"usage":{{"prompt_tokens":3,"completion_tokens":1}}}}"#
        );
        serde_json::from_str::<serde_json::Value>(&body).expect("a valid test body");
        assert_eq!(every_split(body.as_bytes()), usage(Some(3), None, Some(1)), "{text}");
        let tokens = format!(
            r#"{{"content":"{text}","other_prompt_tokens":7,"xcached_tokens":8,"a \"prompt_tokens":9}}"#
        );
        serde_json::from_str::<serde_json::Value>(&tokens).expect("a valid test body");
        assert_eq!(every_split(tokens.as_bytes()), Usage::default(), "{text}");
    }
}

#[test]
fn only_integers_that_fit_count() {
    let cases: [(&str, Option<u32>); 16] = [
        ("0", Some(0)),
        ("7", Some(7)),
        ("4294967295", Some(u32::MAX)),
        ("4294967296", None),
        ("99999999999999999999999", None),
        ("-1", None),
        ("-0", None),
        ("1.0", None),
        ("1e3", None),
        ("1E3", None),
        ("012", None),
        ("00", None),
        ("null", None),
        ("\"12\"", None),
        ("{\"cached_tokens\":4}", None),
        ("[5]", None),
    ];
    for (value, expected) in cases {
        for end in [",\"x\":1}", "}", " }", "\n,\"x\":1}"] {
            let body = format!("{{\"prompt_tokens\" : {value}{end}");
            assert_eq!(every_split(body.as_bytes()).prompt_tokens, expected, "{body}");
        }
    }
    let earlier =
        r#"{"a":{"prompt_tokens":5},"b":{"prompt_tokens":1.5},"c":{"prompt_tokens":null}}"#;
    assert_eq!(every_split(earlier.as_bytes()).prompt_tokens, Some(5));
    let nested = r#"{"prompt_tokens":{"cached_tokens":4}}"#;
    assert_eq!(every_split(nested.as_bytes()), usage(None, Some(4), None));
}

#[test]
fn the_last_value_wins_and_an_unfinished_one_does_not_count() {
    let continuous = "data: {\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":1}}\n\n\
                      data: {\"usage\":{\"prompt_tokens\":11,\"completion_tokens\":2,\
                      \"prompt_tokens_details\":{\"cached_tokens\":8}}}\n\n";
    assert_eq!(every_split(continuous.as_bytes()), usage(Some(11), Some(8), Some(2)));
    let cut = b"{\"usage\":{\"prompt_tokens\":12,\"cached_tokens\":34";
    assert_eq!(every_split(cut), usage(Some(12), None, None));
    let cut = b"{\"usage\":{\"prompt_tokens\":12}},{\"prompt_tokens\":345";
    assert_eq!(every_split(cut), usage(Some(12), None, None));
}

#[test]
fn chunk_framing_never_makes_a_wrong_number() {
    let bodies = [VLLM.to_owned(), SGLANG.to_owned(), vllm_stream()];
    for body in &bodies {
        let truth = whole(body.as_bytes());
        for size in ["1f", "20", "5", "400;ext=1", "0"] {
            let framing = format!("\r\n{size}\r\n");
            for at in 0..=body.len() {
                let framed = [&body.as_bytes()[..at], framing.as_bytes(), &body.as_bytes()[at..]];
                let got = whole(&framed.concat());
                for (got, truth) in [
                    (got.prompt_tokens, truth.prompt_tokens),
                    (got.cached_tokens, truth.cached_tokens),
                    (got.completion_tokens, truth.completion_tokens),
                ] {
                    assert!(got.is_none() || got == truth, "framing {size:?} at {at}: {got:?}");
                }
            }
        }
    }
}

#[test]
fn the_reference_agrees_on_these_bodies() {
    let stream = vllm_stream();
    for body in [VLLM, VLLM_NO_DETAILS, SGLANG, &stream] {
        let reference = reference_usage(body.as_bytes()).expect("JSON or SSE of JSON");
        assert_eq!(whole(body.as_bytes()), reference, "{body}");
    }
}

/// Issue \[11\]: a stream's `data:` events are counted at line starts, split anywhere; text
/// inside an event never counts, and a non-stream body has none.
#[test]
fn stream_events_are_counted_at_line_starts() {
    let stream = vllm_stream();
    let count = |body: &[u8]| {
        let mut scanner = UsageScanner::new();
        scanner.feed(body);
        let whole = scanner.events();
        for at in 0..=body.len() {
            let mut scanner = UsageScanner::new();
            scanner.feed(&body[..at]);
            scanner.feed(&body[at..]);
            assert_eq!(scanner.events(), whole, "split at {at}");
        }
        whole
    };
    assert_eq!(count(stream.as_bytes()), 5, "three content events, the usage one and [DONE]");
    assert_eq!(count(VLLM.as_bytes()), 0);
    let text = "data: {\"choices\":[{\"delta\":{\"content\":\"a\\ndata: b data:\"}}]}\n\n";
    assert_eq!(count(text.as_bytes()), 1, "an escaped line feed starts no line");
    assert_eq!(count(b"event: x\r\ndata: 1\r\n\r\ndata:2\n\n"), 2);
}
