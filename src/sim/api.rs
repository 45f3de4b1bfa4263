//! The OpenAI side of the simulated engine: request bodies in, response bodies and SSE chunks
//! out. No I/O: the server calls these with whole bodies and appends what they return.
//!
//! Accepted (anything else is a 400 `invalid_request`, in vLLM's error shape):
//! - `/v1/chat/completions`: `messages`, an array of `{role, content}` where `content` is a
//!   string, `null`, or an array of parts whose `text` fields are used;
//! - `/v1/completions`: `prompt`, a string, an array of one string, an array of token ids (used
//!   as token ids directly), or an array of one such array;
//! - `max_completion_tokens`, else `max_tokens`, else 16 (vLLM's default for completions; its
//!   chat default, "whatever fits the context", would make runs without a limit needlessly
//!   long), at least 1; `stream`; `stream_options.include_usage`; `n` must be 1 if given.
//!
//! Responses follow vLLM's: the finish reason is always `length` (the output is exactly the
//! requested length), `usage` carries `prompt_tokens_details.cached_tokens` (vLLM does with
//! `--enable-prompt-tokens-details`: the benchmark driver reads it), and a streamed chat answer's
//! first chunk carries the role together with the first token, so no client mistakes an empty
//! role chunk for the first token.

use serde_json::Value;

use super::engine::Usage;
use super::tokens::{generation_prompt, tokenize, tokenize_message, VOCAB};

/// Output length when the request names none.
pub const DEFAULT_MAX_TOKENS: u32 = 16;

/// Which endpoint a request came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    /// `/v1/chat/completions`.
    Chat,
    /// `/v1/completions`.
    Completions,
}

/// A parsed inference request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Parsed {
    /// The `model` field.
    pub model: String,
    /// The prompt's tokens.
    pub prompt: Vec<u32>,
    /// Tokens to generate.
    pub max_tokens: u32,
    /// Answer as SSE.
    pub stream: bool,
    /// Send a usage chunk before `[DONE]`.
    pub include_usage: bool,
}

/// Parses a request body for `endpoint`; the error is the message of a 400.
pub fn parse(endpoint: Endpoint, body: &[u8]) -> Result<Parsed, String> {
    let v: Value = serde_json::from_slice(body).map_err(|e| format!("invalid JSON: {e}"))?;
    let Some(obj) = v.as_object() else { return Err("the body must be a JSON object".into()) };
    let model = match obj.get("model") {
        Some(Value::String(m)) => m.clone(),
        _ => return Err("`model` must be a string".into()),
    };
    if obj.get("n").is_some_and(|n| n.as_u64() != Some(1)) {
        return Err("only `n` = 1 is supported".into());
    }
    let limit = obj.get("max_completion_tokens").or_else(|| obj.get("max_tokens"));
    let max_tokens = match limit {
        None | Some(Value::Null) => DEFAULT_MAX_TOKENS,
        Some(n) => match n.as_u64().and_then(|n| u32::try_from(n).ok()) {
            Some(n) if n > 0 => n,
            _ => return Err("`max_tokens` must be a positive integer".into()),
        },
    };
    let stream = obj.get("stream").and_then(Value::as_bool).unwrap_or(false);
    let include_usage = obj
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let mut prompt = Vec::new();
    match endpoint {
        Endpoint::Chat => render_chat(obj.get("messages"), &mut prompt)?,
        Endpoint::Completions => render_prompt(obj.get("prompt"), &mut prompt)?,
    }
    Ok(Parsed { model, prompt, max_tokens, stream, include_usage })
}

fn render_chat(messages: Option<&Value>, out: &mut Vec<u32>) -> Result<(), String> {
    let Some(messages) = messages.and_then(Value::as_array) else {
        return Err("`messages` must be an array".into());
    };
    for m in messages {
        let Some(role) = m.get("role").and_then(Value::as_str) else {
            return Err("each message needs a string `role`".into());
        };
        match m.get("content") {
            None | Some(Value::Null) => tokenize_message(role, "", out),
            Some(Value::String(text)) => tokenize_message(role, text, out),
            Some(Value::Array(parts)) => {
                tokenize_message(role, "", out);
                for part in parts {
                    if let Some(text) = part.get("text").and_then(Value::as_str) {
                        tokenize(text, out);
                    }
                }
            }
            Some(_) => return Err("`content` must be a string, an array or null".into()),
        }
    }
    generation_prompt(out);
    Ok(())
}

fn render_prompt(prompt: Option<&Value>, out: &mut Vec<u32>) -> Result<(), String> {
    let ids = |items: &[Value], out: &mut Vec<u32>| -> Result<(), String> {
        for t in items {
            match t.as_u64().and_then(|t| u32::try_from(t).ok()) {
                Some(t) => out.push(t),
                None => return Err("token ids must be integers".into()),
            }
        }
        Ok(())
    };
    match prompt {
        Some(Value::String(text)) => tokenize(text, out),
        Some(Value::Array(items)) => match items.as_slice() {
            [Value::String(text)] => tokenize(text, out),
            [Value::Array(inner)] => ids(inner, out)?,
            items if items.iter().all(Value::is_number) => ids(items, out)?,
            _ => return Err("one prompt per request: a string or token ids".into()),
        },
        _ => return Err("`prompt` must be a string or token ids".into()),
    }
    Ok(())
}

/// The fixed parts of one request's responses.
#[derive(Debug, Clone)]
pub struct Responder {
    endpoint: Endpoint,
    /// `"id":"...","object":"...","created":N,"model":"..."` for chunks.
    chunk_head: String,
    /// The same for the whole response.
    full_head: String,
}

impl Responder {
    /// The responder of request `id` for `model` (raw), created at unix-like second `created`.
    pub fn new(endpoint: Endpoint, id: u64, model: &str, created: u64) -> Responder {
        let model = serde_json::to_string(model).expect("strings serialise");
        let (prefix, chunk, full) = match endpoint {
            Endpoint::Chat => ("chatcmpl", "chat.completion.chunk", "chat.completion"),
            Endpoint::Completions => ("cmpl", "text_completion", "text_completion"),
        };
        let head = |object: &str| {
            format!(
                "\"id\":\"{prefix}-{id}\",\"object\":\"{object}\",\"created\":{created},\"model\":{model}"
            )
        };
        Responder { endpoint, chunk_head: head(chunk), full_head: head(full) }
    }

    /// Appends the SSE event of generated token `index` (word `word`) to `out`.
    pub fn token_event(&self, index: u32, word: u16, last: bool, out: &mut Vec<u8>) {
        let space = if index == 0 { "" } else { " " };
        let text = VOCAB[usize::from(word)];
        let finish = if last { "\"length\"" } else { "null" };
        let choice = match (self.endpoint, index) {
            (Endpoint::Chat, 0) => {
                format!("\"delta\":{{\"role\":\"assistant\",\"content\":\"{text}\"}}")
            }
            (Endpoint::Chat, _) => format!("\"delta\":{{\"content\":\"{space}{text}\"}}"),
            (Endpoint::Completions, _) => format!("\"text\":\"{space}{text}\""),
        };
        let event = format!(
            "data: {{{},\"choices\":[{{\"index\":0,{choice},\"logprobs\":null,\"finish_reason\":{finish}}}]}}\n\n",
            self.chunk_head
        );
        out.extend_from_slice(event.as_bytes());
    }

    /// Appends the usage event (`choices` empty) to `out`.
    pub fn usage_event(&self, usage: Usage, out: &mut Vec<u8>) {
        let event = format!(
            "data: {{{},\"choices\":[],\"usage\":{}}}\n\n",
            self.chunk_head,
            usage_json(usage)
        );
        out.extend_from_slice(event.as_bytes());
    }

    /// The whole non-streamed response body for the generated `words`.
    pub fn full_body(&self, words: &[u16], usage: Usage) -> String {
        let mut text = String::new();
        for (i, &w) in words.iter().enumerate() {
            if i > 0 {
                text.push(' ');
            }
            text.push_str(VOCAB[usize::from(w)]);
        }
        let choice = match self.endpoint {
            Endpoint::Chat => {
                format!("\"message\":{{\"role\":\"assistant\",\"content\":\"{text}\"}}")
            }
            Endpoint::Completions => format!("\"text\":\"{text}\""),
        };
        format!(
            "{{{},\"choices\":[{{\"index\":0,{choice},\"logprobs\":null,\"finish_reason\":\"length\"}}],\"usage\":{}}}",
            self.full_head,
            usage_json(usage)
        )
    }
}

fn usage_json(u: Usage) -> String {
    let total = u.prompt_tokens + u.completion_tokens;
    format!(
        "{{\"prompt_tokens\":{},\"total_tokens\":{total},\"completion_tokens\":{},\"prompt_tokens_details\":{{\"cached_tokens\":{}}}}}",
        u.prompt_tokens, u.completion_tokens, u.cached_tokens
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::tokens::token_id;

    #[test]
    fn chat_messages_render_with_roles_and_a_generation_prompt() {
        let body = br#"{"model":"m","messages":[{"role":"system","content":"be brief"},
            {"role":"user","content":[{"type":"text","text":"hi there"}]}],"max_tokens":3}"#;
        let p = parse(Endpoint::Chat, body).unwrap();
        let words = ["system:", "be", "brief", "user:", "hi", "there", "assistant:"];
        let expected: Vec<u32> = words.iter().map(|w| token_id(w)).collect();
        assert_eq!(p.prompt, expected);
        assert_eq!((p.max_tokens, p.stream, p.include_usage), (3, false, false));
    }

    #[test]
    fn completion_prompts_and_limits() {
        let p = parse(
            Endpoint::Completions,
            br#"{"model":"m","prompt":[5,6,7],"stream":true,
            "stream_options":{"include_usage":true},"max_completion_tokens":4,"max_tokens":9}"#,
        )
        .unwrap();
        assert_eq!(
            (p.prompt, p.max_tokens, p.stream, p.include_usage),
            (vec![5, 6, 7], 4, true, true)
        );
        let p = parse(Endpoint::Completions, br#"{"model":"m","prompt":["a b"]}"#).unwrap();
        assert_eq!((p.prompt.len(), p.max_tokens), (2, DEFAULT_MAX_TOKENS));
        for bad in [
            &br#"{"model":"m","prompt":["a","b"]}"#[..],
            br#"{"model":"m","prompt":"a","max_tokens":0}"#,
            br#"{"model":"m","prompt":"a","n":2}"#,
            br#"{"prompt":"a"}"#,
            br#"[1]"#,
        ] {
            assert!(parse(Endpoint::Completions, bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn chunks_and_bodies_are_valid_openai_json() {
        let r = Responder::new(Endpoint::Chat, 7, "sim\"8b", 3);
        let mut out = Vec::new();
        r.token_event(0, 1, false, &mut out);
        r.token_event(1, 2, true, &mut out);
        let usage = Usage { prompt_tokens: 5, completion_tokens: 2, cached_tokens: 4 };
        r.usage_event(usage, &mut out);
        let text = String::from_utf8(out).unwrap();
        let chunks: Vec<Value> = text
            .split("\n\n")
            .filter(|e| !e.is_empty())
            .map(|e| serde_json::from_str(e.strip_prefix("data: ").unwrap()).unwrap())
            .collect();
        assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
        assert_eq!(chunks[0]["model"], "sim\"8b");
        assert_eq!(chunks[1]["choices"][0]["delta"]["content"], format!(" {}", VOCAB[2]));
        assert_eq!(chunks[1]["choices"][0]["finish_reason"], "length");
        assert_eq!(chunks[2]["usage"]["prompt_tokens_details"]["cached_tokens"], 4);
        assert_eq!(chunks[2]["usage"]["total_tokens"], 7);
        let full: Value = serde_json::from_str(&r.full_body(&[1, 2], usage)).unwrap();
        assert_eq!(full["object"], "chat.completion");
        assert_eq!(full["choices"][0]["message"]["content"], format!("{} {}", VOCAB[1], VOCAB[2]));
        let c = Responder::new(Endpoint::Completions, 8, "m", 3);
        let full: Value = serde_json::from_str(&c.full_body(&[3], usage)).unwrap();
        assert_eq!(
            (full["object"].as_str(), full["choices"][0]["text"].as_str()),
            (Some("text_completion"), Some(VOCAB[3]))
        );
    }
}
