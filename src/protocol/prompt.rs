//! The prompt text of a request body and its chained block hashes, for prefix-cost placement
//! (SPEC S16).
//!
//! The prompt text is what an engine's prefix cache sees first, in order: for a chat request
//! the `messages` array, each message's `role` then its `content` (a string, or the `text` of
//! each part of an array of parts); for a completion request the `prompt` string (or each
//! string of an array). Each role and each content piece is followed by a `0x00` separator so
//! that moving a boundary changes the text. Other keys, other part types (images), and token
//! arrays add nothing.
//!
//! The text is cut into blocks of `block_bytes` bytes; block *k*'s hash is xxh3-64 of its bytes
//! seeded with block *k − 1*'s hash (0 for the first), so one hash names the whole prefix up to
//! its block's end, as the engine's own block hashes do (vLLM V1 chains its KV-block hashes the
//! same way). Only full blocks are hashed: a trailing partial block can never be matched.
//!
//! The walk runs on a body that [`super::json::find_model`] has already validated, so it only
//! needs to find boundaries: strings end at an unescaped quote, containers are matched by depth
//! with strings skipped. It checks every index it reads and stops, keeping what it hashed so
//! far, on anything unexpected (a truncated or malformed structure); only string escapes are
//! trusted to be valid, which `find_model` checked. It allocates nothing: bytes are
//! copied into the hasher's block buffer (allocated once) and hashes appended to the caller's
//! reused vector.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use super::json::{unescape, unescaped_eq};

/// Cuts text into blocks and chains their hashes; reused across requests.
#[derive(Debug)]
pub struct PromptHasher {
    block_bytes: usize,
    block: Vec<u8>,
    chain: u64,
    text_bytes: usize,
}

impl PromptHasher {
    /// A hasher of `block_bytes`-byte blocks (at least 1).
    pub fn new(block_bytes: usize) -> PromptHasher {
        assert!(block_bytes > 0, "a block holds at least one byte");
        PromptHasher {
            block_bytes,
            block: Vec::with_capacity(block_bytes),
            chain: 0,
            text_bytes: 0,
        }
    }

    /// The bytes per block.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Replaces `out` with the chained hashes of the full blocks of `body`'s prompt text, a
    /// JSON object already validated by `find_model`. Returns the prompt text's length in bytes.
    pub fn hash_body(&mut self, body: &[u8], out: &mut Vec<u64>) -> usize {
        out.clear();
        self.block.clear();
        self.chain = 0;
        self.text_bytes = 0;
        let mut walk = Walk { buf: body, out, hasher: self };
        walk.document();
        self.text_bytes
    }

    /// Replaces `out` with the chained hashes of the full blocks of `text` (what
    /// [`PromptHasher::hash_body`] does with the text it extracts).
    pub fn hash_text(&mut self, text: &[u8], out: &mut Vec<u64>) {
        out.clear();
        self.block.clear();
        self.chain = 0;
        self.text_bytes = 0;
        self.feed(text, out);
    }

    fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<u64>) {
        self.text_bytes += bytes.len();
        while !bytes.is_empty() {
            let room = self.block_bytes - self.block.len();
            let (now, rest) = bytes.split_at(room.min(bytes.len()));
            self.block.extend_from_slice(now);
            bytes = rest;
            if self.block.len() == self.block_bytes {
                self.chain = xxh3_64_with_seed(&self.block, self.chain);
                out.push(self.chain);
                self.block.clear();
            }
        }
    }
}

/// One pass over a validated body.
struct Walk<'a, 'b> {
    buf: &'a [u8],
    out: &'b mut Vec<u64>,
    hasher: &'b mut PromptHasher,
}

/// A member of an object: the key's raw contents (between the quotes) and where its value
/// starts.
struct Member {
    key: (usize, usize),
    value: usize,
}

impl Walk<'_, '_> {
    fn byte(&self, at: usize) -> Option<u8> {
        self.buf.get(at).copied()
    }

    fn skip_ws(&self, mut at: usize) -> usize {
        while matches!(self.byte(at), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            at += 1;
        }
        at
    }

    /// `at` is on an opening quote; the index just past the closing one.
    fn string_end(&self, at: usize) -> Option<usize> {
        let mut i = at + 1;
        loop {
            // Strings are most of a chat body: jump to the next quote or backslash.
            i += memchr::memchr2(b'"', b'\\', self.buf.get(i..)?)?;
            match self.buf[i] {
                b'"' => return Some(i + 1),
                _ => i += 2,
            }
        }
    }

    /// The index just past the value starting at `at`.
    fn value_end(&self, at: usize) -> Option<usize> {
        match self.byte(at)? {
            b'"' => self.string_end(at),
            b'{' | b'[' => {
                let (mut depth, mut i) = (0usize, at);
                loop {
                    match self.byte(i)? {
                        b'"' => {
                            i = self.string_end(i)?;
                            continue;
                        }
                        b'{' | b'[' => depth += 1,
                        b'}' | b']' => {
                            depth -= 1;
                            if depth == 0 {
                                return Some(i + 1);
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            }
            _ => {
                let mut i = at;
                while !matches!(
                    self.byte(i),
                    None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                ) {
                    i += 1;
                }
                Some(i)
            }
        }
    }

    /// Calls `visit` with each member of the object at `at`; stops early when it returns None.
    fn members(&mut self, at: usize, mut visit: impl FnMut(&mut Self, Member) -> Option<()>) {
        let _ = self.try_members(at, &mut visit);
    }

    fn try_members(
        &mut self,
        at: usize,
        visit: &mut impl FnMut(&mut Self, Member) -> Option<()>,
    ) -> Option<()> {
        if self.byte(at)? != b'{' {
            return None;
        }
        let mut i = self.skip_ws(at + 1);
        if self.byte(i)? == b'}' {
            return Some(());
        }
        loop {
            let key_end = self.string_end(i)?;
            let colon = self.skip_ws(key_end);
            if self.byte(colon)? != b':' {
                return None;
            }
            let value = self.skip_ws(colon + 1);
            let end = self.value_end(value)?;
            visit(self, Member { key: (i + 1, key_end - 1), value })?;
            i = self.skip_ws(end);
            match self.byte(i)? {
                b',' => i = self.skip_ws(i + 1),
                _ => return Some(()),
            }
        }
    }

    /// Calls `visit` with where each element of the array at `at` starts.
    fn elements(&mut self, at: usize, mut visit: impl FnMut(&mut Self, usize)) {
        let _ = self.try_elements(at, &mut visit);
    }

    fn try_elements(&mut self, at: usize, visit: &mut impl FnMut(&mut Self, usize)) -> Option<()> {
        if self.byte(at)? != b'[' {
            return None;
        }
        let mut i = self.skip_ws(at + 1);
        if self.byte(i)? == b']' {
            return Some(());
        }
        loop {
            let end = self.value_end(i)?;
            visit(self, i);
            i = self.skip_ws(end);
            match self.byte(i)? {
                b',' => i = self.skip_ws(i + 1),
                _ => return Some(()),
            }
        }
    }

    fn key_is(&self, member: &Member, name: &[u8]) -> bool {
        let (start, end) = member.key;
        self.buf.get(start..end).is_some_and(|raw| unescaped_eq(raw, name))
    }

    /// Feeds the unescaped contents of the string at `at` (nothing if it is not a string),
    /// then a separator.
    fn text(&mut self, at: usize) {
        if self.byte(at) != Some(b'"') {
            return;
        }
        let Some(end) = self.string_end(at) else { return };
        let (buf, hasher, out) = (self.buf, &mut *self.hasher, &mut *self.out);
        unescape(&buf[at + 1..end - 1], |piece| {
            hasher.feed(piece, out);
            true
        });
        hasher.feed(&[0], out);
    }

    fn document(&mut self) {
        let start = self.skip_ws(0);
        self.members(start, |walk, member| {
            if walk.key_is(&member, b"messages") {
                walk.elements(member.value, |walk, message| walk.message(message));
            } else if walk.key_is(&member, b"prompt") {
                match walk.byte(member.value) {
                    Some(b'"') => walk.text(member.value),
                    _ => walk.elements(member.value, |walk, piece| walk.text(piece)),
                }
            }
            Some(())
        });
    }

    /// One chat message: its role, then its content, whatever order the keys come in.
    fn message(&mut self, at: usize) {
        let (mut role, mut content) = (None, None);
        self.members(at, |walk, member| {
            if walk.key_is(&member, b"role") {
                role = Some(member.value);
            } else if walk.key_is(&member, b"content") {
                content = Some(member.value);
            }
            Some(())
        });
        if let Some(role) = role {
            self.text(role);
        }
        let Some(content) = content else { return };
        match self.byte(content) {
            Some(b'"') => self.text(content),
            Some(b'[') => self.elements(content, |walk, part| {
                walk.members(part, |walk, member| {
                    if walk.key_is(&member, b"text") {
                        walk.text(member.value);
                    }
                    Some(())
                });
            }),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hashes(body: &str, block: usize) -> (Vec<u64>, usize) {
        assert!(super::super::json::find_model(body.as_bytes()).is_ok(), "test body: {body}");
        let mut out = Vec::new();
        let bytes = PromptHasher::new(block).hash_body(body.as_bytes(), &mut out);
        (out, bytes)
    }

    fn of_text(text: &[u8], block: usize) -> Vec<u64> {
        let mut out = Vec::new();
        PromptHasher::new(block).hash_text(text, &mut out);
        out
    }

    #[test]
    fn chat_text_is_roles_and_contents_in_order() {
        let body = r#"{"model":"m","messages":[{"role":"system","content":"be brief"},
            {"content":"hi there","role":"user"}],"stream":true}"#;
        let (out, bytes) = hashes(body, 4);
        let text = b"system\0be brief\0user\0hi there\0";
        assert_eq!(bytes, text.len());
        assert_eq!(out, of_text(text, 4));
        assert_eq!(out.len(), text.len() / 4);
    }

    #[test]
    fn escapes_parts_and_prompts_are_read_as_text() {
        let parts = r#"{"model":"m","messages":[{"role":"user","content":[
            {"type":"text","text":"a\nb"},{"type":"image_url","image_url":{"url":"x"}},
            {"type":"text","text":"\u00e9"}]}]}"#;
        assert_eq!(hashes(parts, 3).0, of_text("user\0a\nb\0é\0".as_bytes(), 3));
        let prompt = r#"{"prompt":"once upon","model":"m"}"#;
        assert_eq!(hashes(prompt, 2).0, of_text(b"once upon\0", 2));
        let pieces = r#"{"model":"m","prompt":["ab","cd"]}"#;
        assert_eq!(hashes(pieces, 2).0, of_text(b"ab\0cd\0", 2));
        let tokens = r#"{"model":"m","prompt":[1,2,3]}"#;
        assert_eq!(hashes(tokens, 1), (vec![], 0));
    }

    #[test]
    fn a_longer_conversation_extends_the_chain() {
        let turn1 = r#"{"model":"m","messages":[{"role":"user","content":"the first question"}]}"#;
        let turn2 = r#"{"model":"m","messages":[{"role":"user","content":"the first question"},
            {"role":"assistant","content":"an answer"},{"role":"user","content":"more"}]}"#;
        let (a, _) = hashes(turn1, 8);
        let (b, _) = hashes(turn2, 8);
        assert!(!a.is_empty() && b.len() > a.len());
        assert_eq!(&b[..a.len()], &a[..]);
        let other = r#"{"model":"m","messages":[{"role":"user","content":"The first question"}]}"#;
        assert_ne!(hashes(other, 8).0[0], a[0]);
    }

    #[test]
    fn nested_keys_of_the_same_name_do_not_count() {
        let body = r#"{"model":"m","metadata":{"messages":[{"role":"user","content":"x"}],
            "prompt":"y"},"messages":[{"role":"user","content":"z"}]}"#;
        assert_eq!(hashes(body, 1).0, of_text(b"user\0z\0", 1));
    }

    #[test]
    fn the_hasher_is_reusable() {
        let mut hasher = PromptHasher::new(4);
        let mut out = Vec::new();
        let body = br#"{"model":"m","prompt":"abcdefgh"}"#;
        hasher.hash_body(body, &mut out);
        let first = out.clone();
        hasher.hash_body(br#"{"model":"m","prompt":"zz"}"#, &mut out);
        assert!(out.is_empty());
        hasher.hash_body(body, &mut out);
        assert_eq!(out, first);
    }

    #[test]
    fn truncated_or_odd_input_does_not_panic() {
        let body = br#"{"model":"m","messages":[{"role":"user","content":"abc"}]}"#;
        let mut hasher = PromptHasher::new(2);
        let mut out = Vec::new();
        for end in 0..body.len() {
            hasher.hash_body(&body[..end], &mut out);
        }
        for odd in [&b"[]"[..], b"\"x\"", b"{\"messages\":5}", b"{\"prompt\":{}}", b"{\"a\"}"] {
            hasher.hash_body(odd, &mut out);
        }
    }
}
