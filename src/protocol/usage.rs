//! The token counts an engine reports in a response body (`usage`), read as the body is relayed.
//!
//! # What is read
//!
//! An OpenAI-style response ends with a `usage` object:
//! `"usage":{"prompt_tokens":N,"total_tokens":T,"completion_tokens":C,`
//! `"prompt_tokens_details":{"cached_tokens":M}}`. A non-streaming body carries it once; a stream
//! whose client asked for `stream_options.include_usage` sends it in a last `data:` event (with
//! `"choices":[]`) before `data: [DONE]`, and vLLM with continuous usage stats sends one in
//! every event. vLLM and SGLang follow OpenAI's shape; `prompt_tokens_details` and its
//! `cached_tokens` may be absent or `null`. [`UsageScanner`] is fed every read of a response
//! body, split anywhere (in a key, in a number), and reports the last `prompt_tokens`, the
//! last `completion_tokens` and the last `cached_tokens` it saw ([`Usage`]), wherever they are
//! in the body, and how many SSE `data:` events began a line (issue \[11\]: a stream without
//! `usage` is charged a token per event). It is sans-IO, holds
//! a few dozen bytes of state, allocates nothing, and does not parse the body.
//!
//! # How
//!
//! The three keys end in `tokens"`. The scanner skips from one `tokens"` to the next with
//! `memchr::memmem`: a vectorised search for two of the needle's bytes (the "packed pair" form of
//! Muła's generic SIMD substring search, with AVX2 when the CPU has it, chosen at run time), each
//! candidate confirmed, and Two-Way (Crochemore and Perrin 1991) where that does not apply. Most
//! bytes are only touched by the vector compare. At each occurrence it checks the bytes before
//! (`"prompt_`, `"cached_` or `"completion_`) and the one before those (`{`, `,` or JSON
//! whitespace), then
//! reads the rest a byte at a time through a small state machine: whitespace, `:`, whitespace, the
//! digits, whitespace, and `,`, `}` or `]`. The last 24 bytes of each read are kept, so a key cut
//! by the end of a read is found when the next read completes it; the state machine itself carries
//! a value across reads.
//!
//! Events: a second `memmem` search counts `\ndata:` (an SSE `data:` field at the start of a
//! line; the body's start counts as a line start), joined across reads the same way. A JSON
//! string cannot hold a raw line feed, so text inside an event never counts. Chunk framing
//! between pieces can hide an event (a count too low by one), never make one.
//!
//! # Why text inside a string cannot match
//!
//! Inside a JSON string every `"` byte is escaped, so it directly follows a `\` (RFC 8259
//! section 7). The needle's quote directly follows `s`, so it is outside every string: it ends
//! one. The quote before the key's first letter directly follows `{`, `,` or whitespace, never
//! `\`, so it is outside a string too and begins one: the string between them is exactly
//! `prompt_tokens` (or `cached_tokens`, `completion_tokens`). The `:` that must follow makes
//! that string a key, not a value that spells the word (`"content":"prompt_tokens"`). An assistant's text that mentions
//! `"prompt_tokens": 5` is sent as `\"prompt_tokens\": 5` and matches nothing.
//!
//! # Numbers
//!
//! A value counts when it is a JSON integer (`0`, or a digit 1-9 and more digits) no greater
//! than `u32::MAX`, followed by optional whitespace and `,`, `}` or `]`. A sign, a fraction, an
//! exponent, a leading zero, an overflow, `null` or any other value is ignored, and the previous
//! value stands. The end of a value is only known at its terminator, so a number cut by the end
//! of a read is continued by the next read, and a number cut by the end of the body is not
//! reported.
//!
//! # Chunked framing
//!
//! The shard feeds it the bytes the client gets (`server::shard::upstream`), which for a chunked
//! backend body carry chunked framing: the backend's own chunks when the relay passes them
//! through, the relay's when it re-chunks. Decoded data would be exact; framed bytes are what
//! is at hand without a second copy, and this is what they cost. The framing lies between
//! pieces of the body: `\r\n`, a hexadecimal size, `\r\n`, possibly an extension. A piece boundary inside a key leaves the key
//! unmatched. Inside or just after a number, the number is followed by whitespace and a hexadecimal
//! digit or letter, never by `,`, `}` or `]`: it is dropped. Between the colon and the number, a
//! size of decimal digits reads as a number, but whitespace and the real digits follow it, not a
//! terminator: dropped too. So framing can make the scanner miss a value (the previous one, or
//! `None`, stands), never read a wrong one. A size line holds no `"` (unless it carries a quoted
//! extension, which engines do not send), so framing cannot complete a key either.
//!
//! # What it trusts
//!
//! The body is what an engine sent: JSON, or SSE events of JSON. The scanner does not validate
//! it, and does not know whether a key is inside `usage`; a non-JSON body (an HTML error page)
//! that happens to contain `{"prompt_tokens":5,` would be read as saying so. Keys are matched
//! as sent: an escaped spelling (`"prompt\u005ftokens"`) is not recognised; engines do not
//! escape ASCII keys.

use std::sync::LazyLock;

use memchr::memmem::Finder;

/// What every key looked for ends with.
const NEEDLE: &[u8] = b"tokens\"";

/// The bytes checked before the needle at most: one that may precede a key's opening quote,
/// and the quote with the first part of the longest key (`"completion_`).
const LOOKBEHIND: usize = 13;

/// Bytes of the previous reads kept: a needle begun in them (at most `NEEDLE.len() - 1` bytes)
/// with its lookbehind.
const TAIL: usize = 24;

/// An SSE `data:` field at the start of a line.
const EVENT: &[u8] = b"\ndata:";

/// The keys: the bytes before the needle, and which key they make.
const KEYS: [(&[u8], Key); 3] =
    [(b"\"prompt_", Key::Prompt), (b"\"cached_", Key::Cached), (b"\"completion_", Key::Completion)];

static FINDER: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(NEEDLE));
static EVENTS: LazyLock<Finder<'static>> = LazyLock::new(|| Finder::new(EVENT));

/// The token counts read from a response body; `None` when none was seen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Usage {
    /// The last `prompt_tokens`.
    pub prompt_tokens: Option<u32>,
    /// The last `cached_tokens` (OpenAI's `prompt_tokens_details.cached_tokens`).
    pub cached_tokens: Option<u32>,
    /// The last `completion_tokens`.
    pub completion_tokens: Option<u32>,
}

/// Reads [`Usage`] from a response body fed in pieces; one per response, or [`reset`] between
/// responses.
///
/// [`reset`]: UsageScanner::reset
#[derive(Debug, Clone)]
pub struct UsageScanner {
    state: State,
    /// The last bytes fed: `tail[..tail_len]`, oldest first.
    tail: [u8; TAIL],
    tail_len: usize,
    usage: Usage,
    /// `data:` events begun at a line start so far.
    events: u32,
}

/// The keys read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Prompt,
    Cached,
    Completion,
}

/// Where the scanner is, between bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Looking for a key.
    Seek,
    /// After a key's closing quote: whitespace, then `:`.
    Colon(Key),
    /// After the colon: whitespace, then the first digit.
    Value(Key),
    /// In the digits: `value` so far (`None` past `u32::MAX`); `zero` when the first was `0`.
    Digits { key: Key, value: Option<u32>, zero: bool },
    /// After the digits: whitespace, then `,`, `}` or `]`.
    End { key: Key, value: Option<u32> },
}

impl Default for UsageScanner {
    fn default() -> Self {
        Self::new()
    }
}

impl UsageScanner {
    /// A scanner that has seen nothing.
    pub fn new() -> Self {
        // The body's start is a line start: a virtual line feed begins the tail.
        let mut tail = [0; TAIL];
        tail[0] = b'\n';
        UsageScanner { state: State::Seek, tail, tail_len: 1, usage: Usage::default(), events: 0 }
    }

    /// Forgets everything, for the next response.
    pub fn reset(&mut self) {
        *self = Self::new();
    }

    /// What the body fed so far reports: the last complete value of each key.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// SSE `data:` events begun at a line start in the body fed so far.
    pub fn events(&self) -> u32 {
        self.events
    }

    /// Reads the next piece of the body.
    pub fn feed(&mut self, bytes: &[u8]) {
        self.count_events(bytes);
        let mut at = match self.state {
            State::Seek => self.junction(bytes),
            _ => 0,
        };
        loop {
            while self.state != State::Seek && at < bytes.len() {
                if self.step(bytes[at]) {
                    at += 1;
                }
            }
            if at >= bytes.len() {
                break;
            }
            let Some(found) = FINDER.find(&bytes[at..]) else { break };
            let needle = at + found;
            at = needle + NEEDLE.len();
            if let Some(key) = self.key_at(bytes, needle) {
                self.state = State::Colon(key);
            }
        }
        self.remember(bytes);
    }

    /// Counts the events that end in `bytes`: one begun in the previous reads, then those
    /// wholly in `bytes`.
    fn count_events(&mut self, bytes: &[u8]) {
        let head = bytes.len().min(EVENT.len() - 1);
        let kept = self.tail_len.min(EVENT.len() - 1);
        let mut joint = [0u8; 2 * EVENT.len()];
        joint[..kept].copy_from_slice(&self.tail[self.tail_len - kept..self.tail_len]);
        joint[kept..kept + head].copy_from_slice(&bytes[..head]);
        let joint = &joint[..kept + head];
        let across = (0..kept).filter(|&start| joint[start..].starts_with(EVENT)).count();
        let within = EVENTS.find_iter(bytes).count();
        self.events = self.events.saturating_add((across + within) as u32);
    }

    /// A needle begun in the previous reads and ended in `bytes`: when it is a key, the state
    /// after it, and where in `bytes` it ends; 0 otherwise.
    fn junction(&mut self, bytes: &[u8]) -> usize {
        let head = bytes.len().min(NEEDLE.len() - 1);
        let mut joint = [0u8; TAIL + NEEDLE.len() - 1];
        joint[..self.tail_len].copy_from_slice(&self.tail[..self.tail_len]);
        joint[self.tail_len..self.tail_len + head].copy_from_slice(&bytes[..head]);
        let joint = &joint[..self.tail_len + head];
        let first = self.tail_len.saturating_sub(NEEDLE.len() - 1);
        for start in first..self.tail_len {
            if joint[start..].starts_with(NEEDLE) {
                if let Some(key) = key_after(&joint[start.saturating_sub(LOOKBEHIND)..start]) {
                    self.state = State::Colon(key);
                    return start + NEEDLE.len() - self.tail_len;
                }
            }
        }
        0
    }

    /// The key whose needle starts at `bytes[needle]`, if it is one, looking back into the
    /// previous reads when the lookbehind starts before `bytes`.
    fn key_at(&self, bytes: &[u8], needle: usize) -> Option<Key> {
        if needle >= LOOKBEHIND {
            return key_after(&bytes[needle - LOOKBEHIND..needle]);
        }
        let from_tail = (LOOKBEHIND - needle).min(self.tail_len);
        let mut back = [0u8; LOOKBEHIND];
        back[..from_tail].copy_from_slice(&self.tail[self.tail_len - from_tail..self.tail_len]);
        back[from_tail..from_tail + needle].copy_from_slice(&bytes[..needle]);
        key_after(&back[..from_tail + needle])
    }

    /// Moves the state machine by one byte after a key; whether the byte was used (a byte that
    /// ends a match is looked at again from `Seek`).
    fn step(&mut self, b: u8) -> bool {
        let white = matches!(b, b' ' | b'\t' | b'\n' | b'\r');
        let end = matches!(b, b',' | b'}' | b']');
        let (next, used) = match self.state {
            State::Seek => (State::Seek, false),
            _ if white => match self.state {
                State::Digits { key, value, .. } => (State::End { key, value }, true),
                state => (state, true),
            },
            State::Colon(key) if b == b':' => (State::Value(key), true),
            State::Value(key) if b.is_ascii_digit() => {
                let value = Some(u32::from(b - b'0'));
                (State::Digits { key, value, zero: b == b'0' }, true)
            }
            State::Digits { key, value, zero: false } if b.is_ascii_digit() => {
                let value = value.and_then(|v| v.checked_mul(10)?.checked_add(u32::from(b - b'0')));
                (State::Digits { key, value, zero: false }, true)
            }
            State::Digits { key, value, .. } | State::End { key, value } if end => {
                self.commit(key, value);
                (State::Seek, true)
            }
            _ => (State::Seek, false),
        };
        self.state = next;
        used
    }

    fn commit(&mut self, key: Key, value: Option<u32>) {
        let Some(value) = value else { return };
        match key {
            Key::Prompt => self.usage.prompt_tokens = Some(value),
            Key::Cached => self.usage.cached_tokens = Some(value),
            Key::Completion => self.usage.completion_tokens = Some(value),
        }
    }

    /// Keeps the last `TAIL` bytes seen.
    fn remember(&mut self, bytes: &[u8]) {
        if bytes.len() >= TAIL {
            self.tail.copy_from_slice(&bytes[bytes.len() - TAIL..]);
            self.tail_len = TAIL;
            return;
        }
        let keep = self.tail_len.min(TAIL - bytes.len());
        self.tail.copy_within(self.tail_len - keep..self.tail_len, 0);
        self.tail[keep..keep + bytes.len()].copy_from_slice(bytes);
        self.tail_len = keep + bytes.len();
    }
}

/// The key whose needle follows `back` (up to `LOOKBEHIND` bytes before it): `back` ends with
/// a byte that may precede a key's opening quote, then the quote and `prompt_`, `cached_` or
/// `completion_`.
fn key_after(back: &[u8]) -> Option<Key> {
    KEYS.iter().find_map(|&(start, key)| {
        let before = back.len().checked_sub(start.len() + 1)?;
        let opens = matches!(back[before], b'{' | b',' | b' ' | b'\t' | b'\n' | b'\r');
        (opens && back.ends_with(start)).then_some(key)
    })
}

#[cfg(test)]
#[path = "usage_tests.rs"]
mod tests;
