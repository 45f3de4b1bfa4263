//! The prompt of a request body and its chained block hashes, for prefix-cost placement
//! (SPEC S16), read in the same pass that validates the body and finds its model.
//!
//! # What is hashed
//!
//! The prompt text is what an engine's prefix cache sees first, in order, taken from the body
//! **as sent**: each piece is the bytes between the quotes of a JSON string, escapes left as they
//! are (`"a\nb"` gives the four bytes `a`, `\`, `n`, `b`), followed by one `0x00` byte. A JSON
//! string cannot hold a raw `0x00` (RFC 8259 section 7: control characters are escaped), so the
//! separator marks every boundary, and moving one changes the text. The pieces:
//!
//! - for each element of the top-level `messages` array that is an object, its `role` if that
//!   is a string, then its `content`: the string itself, or for an array of parts the `text` of
//!   each part that is an object whose `text` is a string. The role comes first whatever the
//!   order of the message's keys;
//! - for the top-level `prompt`, the string itself, or each string of an array of them;
//! - both, in the order of their keys, in a body that has both.
//!
//! Keys are compared after unescaping, as [`super::json::find_model`] compares `"model"`. Where
//! a key repeats within one object, its first member counts and the later ones add nothing (a
//! single pass cannot know that a later duplicate is coming; parsers disagree on duplicates
//! anyway). Anything else adds nothing: other keys, other part types (images), values of other
//! types, token arrays, keys of these names anywhere but where listed.
//!
//! The text is cut into blocks of `block_bytes` bytes; block *k*'s hash is xxh3-64 of the 16
//! bytes made of block *k − 1*'s hash (0 for the first) and the xxh3-64 of block *k*'s bytes
//! ([`chain_block`]), so one hash names the whole prefix up to its block's end, as the engine's
//! own block hashes do (vLLM V1 chains its KV-block hashes the same way). Only full blocks are
//! hashed: a trailing partial block can never be matched.
//!
//! Hashing the text as sent rather than unescaped costs nothing in correctness: the hashes are
//! only compared with each other, so the same words escaped two ways (`é` and `\u00e9`) merely
//! miss a match, which misjudges a cache, never a response. A client resends a conversation
//! with the same escaping turn after turn, so follow-ups still match. It is what lets the pass
//! copy each string's bytes as one run instead of decoding them.
//!
//! # One pass
//!
//! [`find_model_and_prompt`] runs [`super::json`]'s validating scan with an observer that
//! follows where each token is: what each open container is, for the five levels the prompt
//! lives in (the top-level object, `messages`, a message, its parts, a part), and what the value
//! after the last key is. A string of the prompt is recorded as its range in the body; every
//! 64 ranges, and at the end of the scan, the [`PromptHasher`] copies them into its block buffer
//! (allocated once, with 32 bytes of slack so that pieces are copied in whole 32-byte chunks
//! instead of through `memcpy`), hashes each block as it fills, and hashes a block that lies
//! whole inside one string where it lies. Batching keeps the scan's loop and the copying and
//! hashing each tight: interleaved piece by piece, hashing added about twice as much to the
//! scan (`perf/RESULTS.md`). A message whose content comes before its role keeps the content's
//! range and feeds it when the message ends, after the role; a deferred array of parts is then
//! scanned a second time (that array only). Nothing allocates once the caller's vector has
//! grown to the longest prompt: the pending ranges are on the stack.
//!
//! # Conversation ends
//!
//! For sessions derived without an identity (issue \[10\], `derive_sessions`), the hasher also
//! names the text up to each message boundary: at the end of every element of `messages`,
//! once a message whose role is neither `system` nor `developer` has been seen, its **end
//! hash** is xxh3-64 of the current partial block's bytes seeded with the chain so far (xor
//! [`END_SEED`], so that an end hash is never a block hash). Equal texts give equal end hashes
//! however they are cut into pieces, and a text's end hash changes with any of its bytes, the
//! partial block included, so two prompts that share a system prompt but not the first user
//! message never share one. The last [`ENDS`] are kept ([`Ends`]): the next turn of a
//! conversation resends the previous prompt's messages and appends one or a few, so one of its
//! last ends is where the previous prompt ended. Only the `messages` form has boundaries; a
//! `prompt` body has no ends.
//!
//! The prompt text is not checked against this definition here but in
//! `harness::reference_prompt_text`, a restatement on serde_json that the unit tests, the
//! proptests and the `model_field` fuzz target compare the pass with.

use std::ops::Range;

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use super::error::ModelError;
#[cfg(any(doc, test))]
use super::json::find_model;
use super::json::{
    find_model_observed, observe_value, unescaped_eq, BodyFields, ModelField, Observer, Unobserved,
};

/// The chain hash of a block after the chain `prev` (0 before the first block): xxh3-64 of the
/// block, unseeded, then xxh3-64 of the 16 bytes `prev ‖ that` (both little-endian).
///
/// Seeding xxh3 with `prev` instead would name the same thing, but above 240 bytes (the default
/// block is 256) a seeded xxh3 derives a 192-byte secret from the seed on every call, which
/// cost as much as hashing the block (`perf/RESULTS.md`); the unseeded hash uses the built-in
/// secret, and the 16-byte fold is xxh3's short path.
#[inline(always)]
fn chain_block(prev: u64, block: &[u8]) -> u64 {
    let mut pair = [0u8; 16];
    pair[..8].copy_from_slice(&prev.to_le_bytes());
    pair[8..].copy_from_slice(&xxh3_64(block).to_le_bytes());
    xxh3_64(&pair)
}

/// Message boundaries whose end hashes a prompt keeps: its whole text's and up to
/// `ENDS - 1` before it.
pub const ENDS: usize = 8;

/// Seeds end hashes apart from block hashes (xor with the chain): "ENDHASH\0".
pub const END_SEED: u64 = 0x454e_4448_4153_4800;

/// The end hashes of a prompt's last message boundaries ([module docs](self)), newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Ends {
    /// `hashes[..len]`, newest first.
    hashes: [u64; ENDS],
    len: u8,
    /// The newest end is the end of the whole prompt text (no piece came after it).
    whole: bool,
}

impl Ends {
    /// No ends: a prompt without conversation boundaries.
    pub const NONE: Ends = Ends { hashes: [0; ENDS], len: 0, whole: false };

    /// The end hashes, newest first.
    pub fn all(&self) -> &[u64] {
        &self.hashes[..usize::from(self.len)]
    }

    /// The end hash of the whole prompt text, when its last piece ended a message.
    pub fn whole(&self) -> Option<u64> {
        self.all().first().copied().filter(|_| self.whole)
    }

    /// The ends before the whole prompt's, newest first: where an earlier turn of the same
    /// conversation may have ended.
    pub fn earlier(&self) -> &[u64] {
        let all = self.all();
        match self.whole {
            true => &all[1..],
            false => all,
        }
    }
}

/// [`find_model`] and, when `prompt` is given, the chained hashes of the body's prompt, in one
/// pass. Returns the same result as `find_model`, with the prompt text's length in bytes (0
/// without a hasher). With a hasher, `out` is replaced by the hashes of the full blocks; it is
/// left empty when the body is refused.
pub fn find_model_and_prompt<'a>(
    body: &'a [u8],
    prompt: Option<(&mut PromptHasher, &mut Vec<u64>)>,
) -> Result<(ModelField<'a>, usize), ModelError> {
    scan_body(body, prompt, BodyFields::none())
}

/// [`find_model_and_prompt`] that also records the top-level `fields` (the `body:` session
/// sources) in the same pass: what the shard runs on every inference request.
pub fn scan_body<'a>(
    body: &'a [u8],
    prompt: Option<(&mut PromptHasher, &mut Vec<u64>)>,
    fields: BodyFields<'_>,
) -> Result<(ModelField<'a>, usize), ModelError> {
    let Some((hasher, out)) = prompt else {
        return find_model_observed(body, &mut Unobserved, fields).map(|field| (field, 0));
    };
    hasher.reset(out);
    let mut walk = PromptWalk::new(body, hasher, out, Level::Top);
    let found = find_model_observed(body, &mut walk, fields);
    if found.is_ok() {
        walk.flush_batch();
    }
    match found {
        Ok(field) => Ok((field, hasher.text_bytes)),
        Err(e) => {
            hasher.reset(out);
            Err(e)
        }
    }
}

/// Cuts text into blocks and chains their hashes; reused across requests.
#[derive(Debug)]
pub struct PromptHasher {
    block_bytes: usize,
    /// `block_bytes` bytes, of which the first `filled` are the current partial block, and
    /// [`CHUNK`] bytes of slack, so that a piece can be copied in whole chunks.
    block: Box<[u8]>,
    /// Bytes of the current block so far; less than `block_bytes` between calls.
    filled: usize,
    /// The hash of the last full block (0 before the first).
    chain: u64,
    text_bytes: usize,
    /// End hashes of the message boundaries, a ring: the newest at `(end_count - 1) % ENDS`.
    ends: [u64; ENDS],
    end_count: usize,
    /// `text_bytes` at the newest boundary.
    end_at: usize,
}

impl PromptHasher {
    /// A hasher of `block_bytes`-byte blocks (at least 1).
    pub fn new(block_bytes: usize) -> PromptHasher {
        assert!(block_bytes > 0, "a block holds at least one byte");
        PromptHasher {
            block_bytes,
            block: vec![0; block_bytes + CHUNK].into_boxed_slice(),
            filled: 0,
            chain: 0,
            text_bytes: 0,
            ends: [0; ENDS],
            end_count: 0,
            end_at: 0,
        }
    }

    /// The bytes per block.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// Replaces `out` with the chained hashes of the full blocks of `body`'s prompt text and
    /// returns the text's length in bytes: [`find_model_and_prompt`] without the model. A body
    /// `find_model` refuses has no prompt (0, `out` empty).
    pub fn hash_body(&mut self, body: &[u8], out: &mut Vec<u64>) -> usize {
        find_model_and_prompt(body, Some((self, out))).map_or(0, |(_, bytes)| bytes)
    }

    /// Replaces `out` with the chained hashes of the full blocks of `text` (what
    /// [`PromptHasher::hash_body`] does with the text it takes from a body).
    pub fn hash_text(&mut self, text: &[u8], out: &mut Vec<u64>) {
        self.reset(out);
        self.feed(text, out);
    }

    /// The end hashes of the last prompt's message boundaries ([module docs](self)).
    pub fn ends(&self) -> Ends {
        let mut ends = Ends::NONE;
        let len = self.end_count.min(ENDS);
        for (k, end) in ends.hashes[..len].iter_mut().enumerate() {
            *end = self.ends[(self.end_count - 1 - k) % ENDS];
        }
        ends.len = len as u8;
        ends.whole = len > 0 && self.end_at == self.text_bytes;
        ends
    }

    fn reset(&mut self, out: &mut Vec<u64>) {
        out.clear();
        self.filled = 0;
        self.chain = 0;
        self.text_bytes = 0;
        self.end_count = 0;
        self.end_at = 0;
    }

    /// A message boundary: the end hash of the text so far.
    #[inline(never)]
    fn boundary(&mut self) {
        let end = xxh3_64_with_seed(&self.block[..self.filled], self.chain ^ END_SEED);
        self.ends[self.end_count % ENDS] = end;
        self.end_count += 1;
        self.end_at = self.text_bytes;
    }

    /// Appends the piece `buf[raw]` and its `0x00` separator. Most pieces of a chat are short
    /// and fit in the current block with their separator without completing it: those are
    /// copied inline, in whole chunks. Unless the piece ends within a [`CHUNK`] of the end of
    /// `buf` (then it goes through [`PromptHasher::feed`]), every copy is in whole chunks.
    #[inline(always)]
    fn piece(&mut self, buf: &[u8], raw: Range<usize>, out: &mut Vec<u64>) {
        if raw.end + CHUNK > buf.len() {
            return self.piece_near_the_end(&buf[raw], out);
        }
        let end = self.filled + raw.len();
        if end + 1 >= self.block_bytes {
            return self.piece_across(buf, raw, out);
        }
        self.text_bytes += raw.len() + 1;
        self.copy(buf, raw.start, raw.len());
        self.block[end] = 0;
        self.filled = end + 1;
    }

    /// [`PromptHasher::piece`] for a piece that completes the current block: copies up to each
    /// block boundary, hashes full blocks of the piece where they lie.
    #[inline(never)]
    fn piece_across(&mut self, buf: &[u8], raw: Range<usize>, out: &mut Vec<u64>) {
        self.text_bytes += raw.len() + 1;
        let mut at = raw.start;
        while at < raw.end {
            let take = (raw.end - at).min(self.block_bytes - self.filled);
            if take == self.block_bytes {
                self.chain = chain_block(self.chain, &buf[at..at + take]);
                out.push(self.chain);
            } else {
                self.copy(buf, at, take);
                self.filled += take;
                self.complete(out);
            }
            at += take;
        }
        self.block[self.filled] = 0;
        self.filled += 1;
        self.complete(out);
    }

    /// [`PromptHasher::piece`] for a piece too close to the end of the body to copy in chunks.
    #[inline(never)]
    fn piece_near_the_end(&mut self, bytes: &[u8], out: &mut Vec<u64>) {
        self.feed(bytes, out);
        self.feed(&[0], out);
    }

    /// Copies `buf[at..at + len]` to the block after its `filled` bytes, in whole chunks: up
    /// to `CHUNK - 1` bytes past them are overwritten too (the block's slack at most, since
    /// `filled + len` is at most `block_bytes`), and as many past the copy are read from `buf`.
    #[inline(always)]
    fn copy(&mut self, buf: &[u8], at: usize, len: usize) {
        let (from, to) = (&buf[at..], &mut self.block[self.filled..]);
        let mut i = 0;
        while i < len {
            let chunk: [u8; CHUNK] = from[i..i + CHUNK].try_into().expect("a chunk");
            to[i..i + CHUNK].copy_from_slice(&chunk);
            i += CHUNK;
        }
    }

    /// Hashes the block if it is full.
    #[inline(always)]
    fn complete(&mut self, out: &mut Vec<u64>) {
        if self.filled == self.block_bytes {
            self.chain = chain_block(self.chain, &self.block[..self.block_bytes]);
            out.push(self.chain);
            self.filled = 0;
        }
    }

    /// Appends `bytes` to the text: the partial block is completed by copying, then every full
    /// block of what is left is hashed where it lies, and the remainder starts the next block.
    #[inline(never)]
    fn feed(&mut self, mut bytes: &[u8], out: &mut Vec<u64>) {
        self.text_bytes += bytes.len();
        let room = self.block_bytes - self.filled;
        if bytes.len() < room {
            self.block[self.filled..self.filled + bytes.len()].copy_from_slice(bytes);
            self.filled += bytes.len();
            return;
        }
        if self.filled > 0 {
            let (fill, rest) = bytes.split_at(room);
            self.block[self.filled..self.block_bytes].copy_from_slice(fill);
            self.chain = chain_block(self.chain, &self.block[..self.block_bytes]);
            out.push(self.chain);
            self.filled = 0;
            bytes = rest;
        }
        let mut blocks = bytes.chunks_exact(self.block_bytes);
        for block in &mut blocks {
            self.chain = chain_block(self.chain, block);
            out.push(self.chain);
        }
        let rest = blocks.remainder();
        self.block[..rest.len()].copy_from_slice(rest);
        self.filled = rest.len();
    }
}

/// The unit of a piece's copy: two SSE2 moves.
const CHUNK: usize = 32;

/// Levels kept: 0 (unused, the document) to 5 (a part); deeper containers hold no prompt.
const LEVELS: usize = 6;

/// What an open container is, as far as the prompt goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Level {
    /// Holds no prompt, nor anything that does.
    Other,
    /// The top-level object.
    Top,
    /// The top-level `messages` array.
    Messages,
    /// An object element of `messages`.
    Message,
    /// A message's `content` array.
    Parts,
    /// An object element of a `content` array.
    Part,
    /// The top-level `prompt` array.
    Prompts,
}

/// What the next value is, as far as the prompt goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Slot {
    None,
    /// The first top-level `messages`.
    Messages,
    /// An element of `messages`.
    Message,
    /// The first top-level `prompt`.
    Prompt,
    /// An element of a `prompt` array.
    Piece,
    /// A message's first `role`.
    Role,
    /// A message's first `content`.
    Content,
    /// An element of a `content` array.
    Part,
    /// A part's first `text`, fed as it comes.
    Text,
}

/// A message's content seen before its role, fed when the message ends.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Deferred {
    None,
    /// The raw contents of a string.
    String(Range<usize>),
    /// An array of parts, brackets included (the end is set when it closes).
    Parts(Range<usize>),
}

/// The observer that follows the prompt through a scan and feeds its pieces.
struct PromptWalk<'a, 'h> {
    body: &'a [u8],
    hasher: &'h mut PromptHasher,
    out: &'h mut Vec<u64>,
    /// `levels[d]`: what the open container at level `d` is, for `d < LEVELS`.
    levels: [Level; LEVELS],
    /// What the innermost open container is (`Other` below level `LEVELS - 1`).
    here: Level,
    /// What the container at level 1 is: `Top` for a body, `Parts` for deferred parts.
    root: Level,
    /// What the value after the last key is.
    slot: Slot,
    messages_seen: bool,
    prompt_seen: bool,
    /// Of the current message.
    role_seen: bool,
    content_seen: bool,
    /// The current parts array feeds its texts as they come (its message's role came first).
    parts_live: bool,
    deferred: Deferred,
    /// Of the current part.
    text_seen: bool,
    /// A message whose role is neither `system` nor `developer` was seen: boundaries from
    /// here on have end hashes.
    conversation: bool,
    /// Pieces found and not fed yet, as ranges of `body`: fed [`BATCH`] at a time, so that
    /// the scan and the copying and hashing each run in a tight loop.
    batch: [(usize, usize); BATCH],
    batched: usize,
}

/// Pieces fed at a time.
const BATCH: usize = 64;

/// A batch entry that is a message boundary, not a piece (no body is this long).
const BOUNDARY: usize = usize::MAX;

impl<'a, 'h> PromptWalk<'a, 'h> {
    fn new(
        body: &'a [u8],
        hasher: &'h mut PromptHasher,
        out: &'h mut Vec<u64>,
        root: Level,
    ) -> Self {
        PromptWalk {
            body,
            hasher,
            out,
            levels: [Level::Other; LEVELS],
            here: Level::Other,
            root,
            slot: Slot::None,
            messages_seen: false,
            prompt_seen: false,
            role_seen: false,
            content_seen: false,
            parts_live: root == Level::Parts,
            deferred: Deferred::None,
            text_seen: false,
            conversation: false,
            batch: [(0, 0); BATCH],
            batched: 0,
        }
    }

    /// What a value in the innermost open container is.
    fn slot(&self) -> Slot {
        match self.here {
            Level::Top | Level::Message | Level::Part => self.slot,
            Level::Messages => Slot::Message,
            Level::Prompts => Slot::Piece,
            Level::Parts => Slot::Part,
            Level::Other => Slot::None,
        }
    }

    /// Feeds a piece: a string's raw contents and the separator.
    #[inline(always)]
    fn piece(&mut self, raw: Range<usize>) {
        self.batch[self.batched] = (raw.start, raw.end);
        self.batched += 1;
        if self.batched == BATCH {
            self.flush_batch();
        }
    }

    /// Marks a message boundary among the batched pieces.
    fn boundary(&mut self) {
        self.piece(BOUNDARY..BOUNDARY);
    }

    /// Feeds the pieces (and boundaries) batched so far.
    #[inline(never)]
    fn flush_batch(&mut self) {
        for &(start, end) in &self.batch[..self.batched] {
            match start {
                BOUNDARY => self.hasher.boundary(),
                _ => self.hasher.piece(self.body, start..end, self.out),
            }
        }
        self.batched = 0;
    }

    /// Feeds a content that came before its message's role.
    #[inline(never)]
    fn flush_deferred(&mut self) {
        match std::mem::replace(&mut self.deferred, Deferred::None) {
            Deferred::None => {}
            Deferred::String(raw) => self.piece(raw),
            Deferred::Parts(parts) => {
                self.flush_batch();
                let buf = &self.body[..parts.end];
                let mut walk = PromptWalk::new(buf, self.hasher, self.out, Level::Parts);
                let seen = observe_value(buf, parts.start, &mut walk);
                seen.expect("an array the scan has accepted");
                walk.flush_batch();
            }
        }
    }
}

/// The keys the prompt is found under.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Name {
    Messages,
    Prompt,
    Role,
    Content,
    Text,
    Other,
}

impl Name {
    /// The name of a key from its raw contents (compared after unescaping, as `find_model`
    /// compares `"model"`).
    #[inline(always)]
    fn of(raw: &[u8], escaped: bool) -> Name {
        if escaped {
            return Name::unescaped(raw);
        }
        match raw {
            b"messages" => Name::Messages,
            b"prompt" => Name::Prompt,
            b"role" => Name::Role,
            b"content" => Name::Content,
            b"text" => Name::Text,
            _ => Name::Other,
        }
    }

    #[inline(never)]
    fn unescaped(raw: &[u8]) -> Name {
        let names = [
            (&b"messages"[..], Name::Messages),
            (b"prompt", Name::Prompt),
            (b"role", Name::Role),
            (b"content", Name::Content),
            (b"text", Name::Text),
        ];
        let found = names.iter().find(|(name, _)| unescaped_eq(raw, name));
        found.map_or(Name::Other, |&(_, name)| name)
    }
}

/// `slot` the first time (`seen` then set), `Slot::None` after.
fn first(seen: &mut bool, slot: Slot) -> Slot {
    match std::mem::replace(seen, true) {
        false => slot,
        true => Slot::None,
    }
}

impl Observer for PromptWalk<'_, '_> {
    #[inline(always)]
    fn key(&mut self, _: usize, raw: Range<usize>, escaped: bool) {
        if self.here == Level::Other {
            self.slot = Slot::None;
            return;
        }
        self.slot = match (self.here, Name::of(&self.body[raw], escaped)) {
            (Level::Top, Name::Messages) => first(&mut self.messages_seen, Slot::Messages),
            (Level::Top, Name::Prompt) => first(&mut self.prompt_seen, Slot::Prompt),
            (Level::Message, Name::Role) => first(&mut self.role_seen, Slot::Role),
            (Level::Message, Name::Content) => first(&mut self.content_seen, Slot::Content),
            (Level::Part, Name::Text) if self.parts_live => first(&mut self.text_seen, Slot::Text),
            _ => Slot::None,
        };
    }

    #[inline(always)]
    fn string(&mut self, _: usize, raw: Range<usize>) {
        match self.slot() {
            Slot::Role => {
                self.conversation |= !matches!(&self.body[raw.clone()], b"system" | b"developer");
                self.piece(raw);
            }
            Slot::Prompt | Slot::Piece | Slot::Text => self.piece(raw),
            Slot::Content if self.role_seen => self.piece(raw),
            Slot::Content => self.deferred = Deferred::String(raw),
            _ => {}
        }
    }

    #[inline(always)]
    fn open(&mut self, depth: usize, at: usize, object: bool) {
        self.here = match (self.slot(), object) {
            _ if depth == 1 => self.root,
            (Slot::Messages, false) => Level::Messages,
            (Slot::Prompt, false) => Level::Prompts,
            (Slot::Message, true) => {
                self.role_seen = false;
                self.content_seen = false;
                Level::Message
            }
            (Slot::Content, false) => {
                self.parts_live = self.role_seen;
                if !self.parts_live {
                    self.deferred = Deferred::Parts(at..at);
                }
                Level::Parts
            }
            (Slot::Part, true) => {
                self.text_seen = false;
                Level::Part
            }
            _ => Level::Other,
        };
        if let Some(level) = self.levels.get_mut(depth) {
            *level = self.here;
        }
    }

    #[inline(always)]
    fn close(&mut self, depth: usize, at: usize) {
        match self.here {
            Level::Message => {
                if self.deferred != Deferred::None {
                    self.flush_deferred();
                }
                if self.conversation {
                    self.boundary();
                }
            }
            Level::Parts => {
                if let Deferred::Parts(parts) = &mut self.deferred {
                    parts.end = at + 1;
                }
            }
            _ => {}
        }
        self.here = match self.levels.get(depth - 1) {
            Some(&level) => level,
            None => Level::Other,
        };
    }
}

#[cfg(test)]
#[path = "prompt_tests.rs"]
mod tests;
