//! Request bodies shared by the benches (`#[path]`-included: each bench is its own crate).

/// A chat body of at least `bytes` bytes.
pub fn chat_body(bytes: usize) -> Vec<u8> {
    let turn = r#"{"role":"user","content":"Explain the \"prefix cache\" of an inference engine.\nKeep it short; ünïcödé ok."},{"role":"assistant","content":"Blocks of KV state keyed by token prefix, reused when a prompt repeats. \u00e9\t42"},"#;
    let mut body = String::from(r#"{"messages":["#);
    while body.len() + turn.len() < bytes.saturating_sub(120) {
        body.push_str(turn);
    }
    body.push_str(r#"{"role":"user","content":"next"}],"metadata":{"model":"nested"},"#);
    body.push_str(r#""stream":true,"max_tokens":256,"temperature":0.7,"model":"llama-3-8b"}"#);
    body.into_bytes()
}
