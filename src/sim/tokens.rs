//! The simulated engine's tokenizer and its generated words (SPEC 7: "whitespace-separated words
//! of the rendered prompt").
//!
//! A token is a whitespace-separated word (Unicode whitespace, `str::split_whitespace`), and its
//! id is a 32-bit hash of the word's bytes (FNV-1a 64 folded through splitmix64's mixer): the
//! same word is the same token in every request and every run. A chat prompt is rendered as
//! `role: content` for each message in order, then `assistant:` (the generation prompt a chat
//! template adds): so the next turn of a conversation, which repeats the earlier messages and
//! the assistant's answer, starts with exactly the tokens of the previous prompt followed by
//! the previous answer, and the prefix cache sees what a real engine would.
//!
//! Generated text is words drawn from [`VOCAB`] by a hash of (seed, prompt, position): the same
//! prompt gets the same answer under the same seed (as with temperature 0), and words are
//! joined by single spaces, so re-tokenizing an answer gives back the generated tokens.

use crate::splitmix::mix;

/// The words generated text is made of (plain ASCII: no JSON escaping needed).
pub const VOCAB: [&str; 32] = [
    "the", "engine", "keeps", "a", "warm", "prefix", "cache", "and", "serves", "tokens", "from",
    "blocks", "of", "sixteen", "while", "requests", "wait", "in", "queue", "for", "their", "turn",
    "so", "router", "sends", "follow", "ups", "where", "kv", "lives", "fast", "now",
];

/// The token id of `word`.
pub fn token_id(word: &str) -> u32 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in word.as_bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
    mix(h) as u32
}

/// Appends the tokens of `text` to `out`.
pub fn tokenize(text: &str, out: &mut Vec<u32>) {
    out.extend(text.split_whitespace().map(token_id));
}

/// Appends the tokens of one chat message, `role: content`.
pub fn tokenize_message(role: &str, content: &str, out: &mut Vec<u32>) {
    out.push(token_id(&format!("{role}:")));
    tokenize(content, out);
}

/// Appends the generation prompt that ends a rendered chat (`assistant:`).
pub fn generation_prompt(out: &mut Vec<u32>) {
    out.push(token_id("assistant:"));
}

/// The [`VOCAB`] index of the word generated at `position` for a prompt hashing to `prompt`.
pub fn generated_word(seed: u64, prompt: u64, position: u32) -> u16 {
    (mix(seed ^ mix(prompt ^ u64::from(position))) % VOCAB.len() as u64) as u16
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_tokens_whatever_the_whitespace() {
        let mut a = Vec::new();
        tokenize("hello  world\n\thello", &mut a);
        assert_eq!(a.len(), 3);
        assert_eq!(a[0], a[2]);
        assert_ne!(a[0], a[1]);
        let mut b = Vec::new();
        tokenize_message("user", "hello world hello", &mut b);
        assert_eq!(b[0], token_id("user:"));
        assert_eq!(b[1..], a[..]);
    }

    #[test]
    fn an_answer_re_tokenizes_to_its_generated_tokens() {
        let answer = |seed| -> Vec<u16> { (0..20).map(|i| generated_word(seed, 99, i)).collect() };
        let words: Vec<&str> = answer(7).iter().map(|&w| VOCAB[usize::from(w)]).collect();
        let mut tokens = Vec::new();
        tokenize(&words.join(" "), &mut tokens);
        let expected: Vec<u32> = words.iter().map(|w| token_id(w)).collect();
        assert_eq!(tokens, expected);
        assert_ne!(answer(7), answer(8), "the seed changes the answer");
    }
}
