//! The top-level `"model"` of a JSON request body (SPEC 2.3) and its in-place rewrite (SPEC 2.6).
//!
//! [`find_model`] is a single forward pass that validates the whole body against RFC 8259 while
//! it looks for the key, without building anything: nesting is a 128-bit stack (bit *d* set when
//! level *d* is an object), and strings, most of a chat body, are skipped eight bytes per step
//! while the bytes are plain ASCII (a SWAR test for `"`, `\`, control characters and bytes over
//! 0x7F); only those bytes are looked at one by one, UTF-8 sequences validated as they come. It
//! costs a fraction of a `serde_json::Value` parse (see `benches/protocol.rs`). The scan reports
//! each key, string value and bracket it passes to an `Observer`: [`find_model`]'s observes
//! nothing (the calls compile away), and `super::prompt`'s hashes the prompt in the same pass.
//!
//! Decisions:
//! - Keys are compared after unescaping, so `"mod\u0065l"` **is** the key `model` (as it is to
//!   every JSON parser the backend may use). Only keys of the top-level object count; a `"model"`
//!   inside `messages`, `metadata` or any nested value is never picked.
//! - A second top-level `"model"` key is an error ([`ModelError::DuplicateModel`]) rather than
//!   first-wins or last-wins: parsers disagree, and the router and the backend must not.
//! - Strings must be valid UTF-8 without raw control characters, and `\u` escapes must pair
//!   surrogates (a lone surrogate is refused, as `serde_json` does).
//! - Numbers are checked for grammar, not range (RFC 8259 section 6 leaves range to the
//!   implementation): `1e400` is accepted and forwarded for the backend to judge.
//! - Nesting deeper than [`DEPTH_MAX`] levels is an error (`serde_json` stops at 127).
//! - Leading and trailing whitespace is allowed; a byte order mark is not.

use std::borrow::Cow;
use std::ops::Range;

use super::error::ModelError;

/// Deepest nesting of arrays and objects accepted; the top-level object is level 1.
pub const DEPTH_MAX: usize = 128;

/// The top-level `"model"` string of a body.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelField<'a> {
    /// The string token in the body, quotes included: what [`rewrite_model`] replaces.
    pub token: Range<usize>,
    /// The decoded value; borrowed from the body unless it contained escapes.
    pub value: Cow<'a, str>,
    /// The top-level `"stream"` is `true` (the last one, if repeated): the response streams.
    pub stream: bool,
    /// Issue \[11\]: the largest top-level `"max_tokens"` or `"max_completion_tokens"` that is
    /// an integer from 0 to `u32::MAX` (any other value is left to the backend to judge). The
    /// largest, not the first or last, because parsers disagree on repeated keys and a
    /// reservation must not be the smaller of two readings.
    pub max_tokens: Option<u32>,
}

/// Finds the top-level `"model"` string of a JSON object body, validating the whole body.
pub fn find_model(body: &[u8]) -> Result<ModelField<'_>, ModelError> {
    find_model_observed(body, &mut Unobserved, BodyFields::none())
}

/// What a scan found of one top-level field it was asked for (a `body:` session source).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FieldValue {
    /// No top-level key of that name (yet).
    #[default]
    Unseen,
    /// Its first member is not a string, is empty, or is longer than
    /// [`super::SESSION_ID_BYTES_MAX`] bytes as sent: it counts as absent.
    Absent,
    /// Its first member is a string whose contents, as sent (escapes left as they are), lie at
    /// `start..end` of the body.
    String { start: usize, end: usize },
}

impl FieldValue {
    /// The value's bytes as sent, if it is present.
    pub fn get(self, body: &[u8]) -> Option<&[u8]> {
        match self {
            FieldValue::String { start, end } => Some(&body[start..end]),
            FieldValue::Unseen | FieldValue::Absent => None,
        }
    }
}

/// The top-level fields a scan looks for besides `model` and `stream`, and where it writes what
/// it finds: `values[i]` for `names[i]`. The caller owns both (the names built once, the
/// values reused), so a scan allocates nothing for them; a key is compared after unescaping,
/// as `"model"` is, and where a key repeats its first member counts.
#[derive(Debug)]
pub struct BodyFields<'f> {
    /// The field names, as their unescaped bytes.
    pub names: &'f [Box<[u8]>],
    /// One per name; the scan starts by setting every one to [`FieldValue::Unseen`].
    pub values: &'f mut [FieldValue],
}

impl BodyFields<'static> {
    /// No fields.
    pub fn none() -> BodyFields<'static> {
        BodyFields { names: &[], values: &mut [] }
    }
}

/// What a scan reports of the tokens it passes, for a caller that reads more of the body in the
/// same pass (`super::prompt`). Depths count open containers: the top-level object is level 1.
/// Ranges are offsets into the scanned body. A scan that fails may have reported anything up to
/// the failure.
pub(super) trait Observer {
    /// A key of the object at `depth`: `raw` is what lies between its quotes, `escaped` whether
    /// that holds escapes.
    fn key(&mut self, depth: usize, raw: Range<usize>, escaped: bool);
    /// A string value in the container at `depth` (0: the document itself); `raw` lies between
    /// its quotes.
    fn string(&mut self, depth: usize, raw: Range<usize>);
    /// A container opens at `at`, becoming level `depth`.
    fn open(&mut self, depth: usize, at: usize, object: bool);
    /// The container at level `depth` closes with the bracket at `at`.
    fn close(&mut self, depth: usize, at: usize);
}

/// The observer of a plain [`find_model`]: nothing, compiled away.
pub(super) struct Unobserved;

impl Observer for Unobserved {
    #[inline(always)]
    fn key(&mut self, _: usize, _: Range<usize>, _: bool) {}
    #[inline(always)]
    fn string(&mut self, _: usize, _: Range<usize>) {}
    #[inline(always)]
    fn open(&mut self, _: usize, _: usize, _: bool) {}
    #[inline(always)]
    fn close(&mut self, _: usize, _: usize) {}
}

/// [`find_model`], reporting every token to `observer` as the scan passes it and recording the
/// top-level `fields` (what they hold is meaningless when the body is refused).
pub(super) fn find_model_observed<'a, O: Observer>(
    body: &'a [u8],
    observer: &mut O,
    fields: BodyFields<'_>,
) -> Result<ModelField<'a>, ModelError> {
    assert_eq!(fields.names.len(), fields.values.len(), "a value per field name");
    fields.values.fill(FieldValue::Unseen);
    let mut s = Scanner::new(body, 0, observer, fields);
    s.skip_ws();
    match s.peek() {
        Some(b'{') => {}
        Some(_) => return Err(ModelError::NotAnObject),
        None => return Err(ModelError::InvalidJson { offset: s.pos }),
    }
    s.document()?;
    match s.found {
        Found::None => Err(ModelError::MissingModel),
        Found::NotString => Err(ModelError::ModelNotString),
        Found::String { token, escaped } => {
            let raw = &body[token.start + 1..token.end - 1];
            let value = match escaped {
                false => Cow::Borrowed(std::str::from_utf8(raw).expect("validated by the scan")),
                true => Cow::Owned(unescape_to_string(raw)),
            };
            Ok(ModelField { token, value, stream: s.stream, max_tokens: s.max_tokens })
        }
    }
}

/// Scans the one JSON value that starts at `start` and ends `buf` (whitespace aside), reporting
/// its tokens to `observer`: a second look at part of a body [`find_model`] already accepted.
/// The value is the document here, so its own container is level 1.
pub(super) fn observe_value<O: Observer>(
    buf: &[u8],
    start: usize,
    observer: &mut O,
) -> Result<(), ModelError> {
    Scanner::new(buf, start, observer, BodyFields::none()).document()
}

/// Appends `body` with the model token replaced by `new_model` as a JSON string; every other
/// byte is copied unchanged (SPEC 2.6).
pub fn rewrite_model(body: &[u8], field: &ModelField<'_>, new_model: &str, out: &mut Vec<u8>) {
    out.reserve(body.len() - field.token.len() + new_model.len() + 2);
    out.extend_from_slice(&body[..field.token.start]);
    write_json_string(new_model, out);
    out.extend_from_slice(&body[field.token.end..]);
}

/// Appends `s` as a JSON string token: quotes, `"` and `\` escaped, control characters as
/// `\n`, `\r`, `\t` or `\u00XX`, everything else (non-ASCII included) as is.
pub fn write_json_string(s: &str, out: &mut Vec<u8>) {
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let escape: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if escape.is_empty() {
            let hex = b"0123456789abcdef";
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                hex[usize::from(b >> 4)],
                hex[usize::from(b & 0xf)],
            ]);
        } else {
            out.extend_from_slice(escape);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// The length of `s` as written by [`write_json_string`].
pub fn json_string_len(s: &str) -> usize {
    let escaped = |b: u8| match b {
        b'"' | b'\\' | b'\n' | b'\r' | b'\t' => 2,
        0..=0x1f => 6,
        _ => 1,
    };
    2 + s.bytes().map(escaped).sum::<usize>()
}

/// What the scan knows about the top-level `"model"`.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Found {
    None,
    NotString,
    String { token: Range<usize>, escaped: bool },
}

/// What the next token may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// After `{`: a key or `}`.
    KeyOrEnd,
    /// After `,` in an object: a key.
    Key,
    /// After `[`: a value or `]`.
    ValueOrEnd,
    /// After `:` or `,` in an array: a value.
    Value,
    /// After a value: `,` or the closing bracket.
    CommaOrEnd,
}

/// The scan's position and nesting.
#[derive(Debug)]
struct Scanner<'a, 'o, 'f, O> {
    buf: &'a [u8],
    pos: usize,
    /// Open arrays and objects.
    depth: usize,
    /// Bit `d - 1` set when level `d` is an object (level 1 is the top-level object).
    objects: u128,
    /// Which top-level key the value being read belongs to.
    next: TopKey,
    found: Found,
    /// The last top-level `"stream"` was `true`.
    stream: bool,
    /// The largest top-level `max_tokens` or `max_completion_tokens` so far.
    max_tokens: Option<u32>,
    observer: &'o mut O,
    /// The other top-level fields looked for, and what was found of them.
    fields: BodyFields<'f>,
}

/// The top-level keys the scan looks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TopKey {
    Model,
    Stream,
    /// `max_tokens` or `max_completion_tokens`.
    MaxTokens,
    /// `fields.names[i]`, the first time it is seen.
    Field(usize),
    Other,
}

impl<'a, 'o, 'f, O: Observer> Scanner<'a, 'o, 'f, O> {
    fn new(buf: &'a [u8], pos: usize, observer: &'o mut O, fields: BodyFields<'f>) -> Self {
        Scanner {
            buf,
            pos,
            depth: 0,
            objects: 0,
            next: TopKey::Other,
            found: Found::None,
            stream: false,
            max_tokens: None,
            observer,
            fields,
        }
    }

    fn peek(&self) -> Option<u8> {
        self.buf.get(self.pos).copied()
    }

    fn invalid(&self) -> ModelError {
        ModelError::InvalidJson { offset: self.pos }
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.peek() {
            self.pos += 1;
        }
    }

    fn in_object(&self) -> bool {
        self.objects >> (self.depth - 1) & 1 == 1
    }

    /// Scans the whole body, starting at its `{`.
    fn document(&mut self) -> Result<(), ModelError> {
        let mut expect = Expect::Value;
        loop {
            self.skip_ws();
            let b = self.peek().ok_or(self.invalid())?;
            expect = match expect {
                Expect::KeyOrEnd if b == b'}' => self.close()?,
                Expect::KeyOrEnd | Expect::Key => self.key(b)?,
                Expect::ValueOrEnd if b == b']' => self.close()?,
                Expect::ValueOrEnd | Expect::Value => self.value(b)?,
                Expect::CommaOrEnd => match b {
                    b',' if self.in_object() => self.advance(Expect::Key),
                    b',' => self.advance(Expect::Value),
                    b'}' if self.in_object() => self.close()?,
                    b']' if !self.in_object() => self.close()?,
                    _ => return Err(self.invalid()),
                },
            };
            if self.depth == 0 {
                break;
            }
        }
        self.skip_ws();
        match self.pos == self.buf.len() {
            true => Ok(()),
            false => Err(self.invalid()),
        }
    }

    fn advance(&mut self, next: Expect) -> Expect {
        self.pos += 1;
        next
    }

    /// A key and its colon.
    fn key(&mut self, b: u8) -> Result<Expect, ModelError> {
        if b != b'"' {
            return Err(self.invalid());
        }
        let start = self.pos;
        let escaped = self.string()?;
        self.observer.key(self.depth, start + 1..self.pos - 1, escaped);
        if self.depth == 1 {
            let raw = &self.buf[start + 1..self.pos - 1];
            let is = |key: &[u8]| match escaped {
                false => raw == key,
                true => unescaped_eq(raw, key),
            };
            self.next = match () {
                () if is(b"model") => TopKey::Model,
                () if is(b"stream") => TopKey::Stream,
                () if is(b"max_tokens") || is(b"max_completion_tokens") => TopKey::MaxTokens,
                () => match self.fields.names.iter().position(|name| is(name)) {
                    Some(i) if self.fields.values[i] == FieldValue::Unseen => TopKey::Field(i),
                    _ => TopKey::Other,
                },
            };
        }
        self.skip_ws();
        if self.peek() != Some(b':') {
            return Err(self.invalid());
        }
        Ok(self.advance(Expect::Value))
    }

    /// The first byte of a value: scalars are read whole, brackets open a level.
    fn value(&mut self, b: u8) -> Result<Expect, ModelError> {
        let start = self.pos;
        let next = match b {
            b'{' | b'[' => self.open(b == b'{')?,
            b'"' => {
                let escaped = self.string()?;
                self.observer.string(self.depth, start + 1..self.pos - 1);
                match self.next {
                    TopKey::Model => {
                        self.found(Found::String { token: start..self.pos, escaped })?;
                    }
                    TopKey::Field(i) => self.field(i, start + 1, self.pos - 1),
                    _ => {}
                }
                Expect::CommaOrEnd
            }
            b'-' | b'0'..=b'9' => self.number()?,
            b't' => self.literal(b"true")?,
            b'f' => self.literal(b"false")?,
            b'n' => self.literal(b"null")?,
            _ => return Err(self.invalid()),
        };
        match self.next {
            TopKey::Model => self.found(Found::NotString)?,
            TopKey::Stream => self.stream = b == b't',
            TopKey::MaxTokens => self.max_tokens(start),
            TopKey::Field(i) if self.fields.values[i] == FieldValue::Unseen => {
                self.fields.values[i] = FieldValue::Absent;
            }
            TopKey::Field(_) | TopKey::Other => {}
        }
        self.next = TopKey::Other;
        Ok(next)
    }

    /// Records a looked-for field's first value, the string whose contents lie at `start..end`:
    /// absent when empty or longer than a session id may be.
    #[inline(never)]
    fn field(&mut self, i: usize, start: usize, end: usize) {
        let usable = (1..=super::SESSION_ID_BYTES_MAX).contains(&(end - start));
        self.fields.values[i] =
            if usable { FieldValue::String { start, end } } else { FieldValue::Absent };
    }

    /// A `max_tokens` value, scanned from `start`: kept when it is an integer that fits `u32`
    /// and is the largest so far.
    #[inline(never)]
    fn max_tokens(&mut self, start: usize) {
        let digits = &self.buf[start..self.pos];
        if digits.is_empty() || digits.len() > 10 || !digits.iter().all(u8::is_ascii_digit) {
            return;
        }
        let value = digits.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
        if let Ok(value) = u32::try_from(value) {
            self.max_tokens = Some(self.max_tokens.map_or(value, |m| m.max(value)));
        }
    }

    /// Records the model value (or its absence of stringness), refusing a second one.
    fn found(&mut self, found: Found) -> Result<(), ModelError> {
        self.next = TopKey::Other;
        if self.found != Found::None {
            return Err(ModelError::DuplicateModel);
        }
        self.found = found;
        Ok(())
    }

    fn open(&mut self, object: bool) -> Result<Expect, ModelError> {
        if self.depth == DEPTH_MAX {
            return Err(ModelError::TooDeep { offset: self.pos });
        }
        self.depth += 1;
        let bit = 1u128 << (self.depth - 1);
        self.objects = if object { self.objects | bit } else { self.objects & !bit };
        self.observer.open(self.depth, self.pos, object);
        self.pos += 1;
        Ok(if object { Expect::KeyOrEnd } else { Expect::ValueOrEnd })
    }

    fn close(&mut self) -> Result<Expect, ModelError> {
        self.observer.close(self.depth, self.pos);
        self.depth -= 1;
        self.pos += 1;
        Ok(Expect::CommaOrEnd)
    }

    fn literal(&mut self, word: &[u8]) -> Result<Expect, ModelError> {
        if !self.buf[self.pos..].starts_with(word) {
            return Err(self.invalid());
        }
        self.pos += word.len();
        Ok(Expect::CommaOrEnd)
    }

    /// `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`
    fn number(&mut self) -> Result<Expect, ModelError> {
        if self.peek() == Some(b'-') {
            self.pos += 1;
        }
        match self.peek() {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => self.digits(),
            _ => return Err(self.invalid()),
        }
        if self.peek() == Some(b'.') {
            self.pos += 1;
            self.some_digits()?;
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.pos += 1;
            }
            self.some_digits()?;
        }
        Ok(Expect::CommaOrEnd)
    }

    fn digits(&mut self) {
        while let Some(b'0'..=b'9') = self.peek() {
            self.pos += 1;
        }
    }

    fn some_digits(&mut self) -> Result<(), ModelError> {
        let start = self.pos;
        self.digits();
        match self.pos > start {
            true => Ok(()),
            false => Err(self.invalid()),
        }
    }

    /// Skips a string starting at its opening quote; returns whether it holds escapes. Plain
    /// ASCII is skipped sixteen bytes at a time ([`skip_plain`]), the last few eight at a time;
    /// quotes, escapes, control characters and UTF-8 sequences are handled a byte (or a
    /// sequence) at a time.
    fn string(&mut self) -> Result<bool, ModelError> {
        let buf = self.buf;
        let mut pos = self.pos + 1;
        let mut escaped = false;
        loop {
            let found;
            (pos, found) = skip_plain(buf, pos);
            while let Some(word) = buf.get(pos..pos + 8).filter(|_| !found) {
                let mask = attention(u64::from_le_bytes(word.try_into().expect("8 bytes")));
                if mask != 0 {
                    // The lowest flagged byte is exact (borrows only run upwards).
                    pos += (mask.trailing_zeros() / 8) as usize;
                    break;
                }
                pos += 8;
            }
            let Some(&b) = buf.get(pos) else {
                return Err(ModelError::InvalidJson { offset: buf.len() });
            };
            let next = match b {
                b'"' => {
                    self.pos = pos + 1;
                    return Ok(escaped);
                }
                b'\\' => {
                    escaped = true;
                    escape_end(buf, pos)
                }
                0..=0x1f => None,
                0x20..=0x7f => Some(pos + 1),
                _ => utf8_end(buf, pos),
            };
            pos = next.ok_or(ModelError::InvalidJson { offset: pos })?;
        }
    }
}

/// Skips plain ASCII from `pos` in `buf`: the position of the first byte that is `"`, `\\`, a
/// control character or not ASCII and `true`, or where fewer than 16 bytes are left and
/// `false` (the caller goes on eight bytes at a time with [`attention`]). SSE2: three compares
/// per 16 bytes; as signed bytes, those below 0x20 are exactly the control characters and the
/// non-ASCII ones. Long runs go 64 bytes a step, the four vectors' flags or-ed into one byte
/// mask test (a prompt's text is long runs of plain bytes), then 16 at a time.
#[cfg(all(target_arch = "x86_64", target_feature = "sse2"))]
#[inline(always)]
fn skip_plain(buf: &[u8], pos: usize) -> (usize, bool) {
    #[target_feature(enable = "sse2")]
    fn skip(buf: &[u8], mut pos: usize) -> (usize, bool) {
        use std::arch::x86_64::{
            _mm_cmpeq_epi8, _mm_cmplt_epi8, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
            _mm_set_epi64x,
        };
        let (quote, backslash, space) =
            (_mm_set1_epi8(b'"' as i8), _mm_set1_epi8(b'\\' as i8), _mm_set1_epi8(0x20));
        // The flags of the 16 bytes of `run` from `at`.
        let flagged = |run: &[u8], at: usize| {
            let word = |at: usize| i64::from_le_bytes(run[at..at + 8].try_into().expect("8"));
            let v = _mm_set_epi64x(word(at + 8), word(at));
            _mm_or_si128(
                _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
                _mm_cmplt_epi8(v, space),
            )
        };
        while let Some(run) = buf.get(pos..pos + 64) {
            let (a, b) = (flagged(run, 0), flagged(run, 16));
            let (c, d) = (flagged(run, 32), flagged(run, 48));
            if _mm_movemask_epi8(_mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d))) != 0 {
                break; // the 16-byte steps below find which byte
            }
            pos += 64;
        }
        while let Some(run) = buf.get(pos..pos + 16) {
            let mask = _mm_movemask_epi8(flagged(run, 0));
            if mask != 0 {
                return (pos + mask.trailing_zeros() as usize, true);
            }
            pos += 16;
        }
        (pos, false)
    }
    // SAFETY: `skip` needs SSE2, which this build enables (the `cfg` above: every x86-64 CPU
    // has it). It reads `buf` through bounds-checked slices only.
    #[allow(unsafe_code)]
    unsafe {
        skip(buf, pos)
    }
}

/// Elsewhere the caller's eight-bytes-at-a-time loop does all the work.
#[cfg(not(all(target_arch = "x86_64", target_feature = "sse2")))]
#[inline(always)]
fn skip_plain(_: &[u8], pos: usize) -> (usize, bool) {
    (pos, false)
}

/// `0x01` in every byte.
const LOW_BITS: u64 = 0x0101_0101_0101_0101;
/// `0x80` in every byte.
const HIGH_BITS: u64 = 0x8080_8080_8080_8080;

/// The high bit of each byte of `word` (little-endian) that is `"`, `\`, a control character
/// (below 0x20) or not ASCII; zero when there is none. SWAR: `v - 0x01.. & !v & 0x80..` flags
/// zero bytes of `v`, and `x - 0x20.. & !x & 0x80..` bytes of `x` below 0x20 (the "has less
/// than" test of Bit Twiddling Hacks, exact for thresholds up to 0x80). A borrow can flag a
/// byte above a true match, never below one, so the lowest flag is always exact.
fn attention(word: u64) -> u64 {
    let has_zero = |v: u64| v.wrapping_sub(LOW_BITS) & !v & HIGH_BITS;
    let quote = has_zero(word ^ (LOW_BITS * u64::from(b'"')));
    let backslash = has_zero(word ^ (LOW_BITS * u64::from(b'\\')));
    let control = word.wrapping_sub(LOW_BITS * 0x20) & !word & HIGH_BITS;
    quote | backslash | control | (word & HIGH_BITS)
}

/// The end of the UTF-8 sequence starting at `at` (a byte of 0x80 or more), or `None` if it is
/// not well-formed (RFC 3629: no overlong forms, no surrogates, nothing past U+10FFFF).
fn utf8_end(buf: &[u8], at: usize) -> Option<usize> {
    let (len, second) = match buf[at] {
        0xc2..=0xdf => (2, 0x80..=0xbf),
        0xe0 => (3, 0xa0..=0xbf),
        0xe1..=0xec | 0xee..=0xef => (3, 0x80..=0xbf),
        0xed => (3, 0x80..=0x9f),
        0xf0 => (4, 0x90..=0xbf),
        0xf1..=0xf3 => (4, 0x80..=0xbf),
        0xf4 => (4, 0x80..=0x8f),
        _ => return None,
    };
    if !second.contains(buf.get(at + 1)?) {
        return None;
    }
    for i in 2..len {
        if buf.get(at + i)? & 0xc0 != 0x80 {
            return None;
        }
    }
    Some(at + len)
}

/// The end of the escape at `at` (a `\`), or `None` if it is invalid (unknown escape, bad hex,
/// unpaired surrogate).
fn escape_end(buf: &[u8], at: usize) -> Option<usize> {
    match buf.get(at + 1)? {
        b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => Some(at + 2),
        b'u' => {
            let unit = hex4(buf.get(at + 2..at + 6)?)?;
            match unit {
                0xd800..=0xdbff => {
                    if buf.get(at + 6..at + 8)? != b"\\u" {
                        return None;
                    }
                    let low = hex4(buf.get(at + 8..at + 12)?)?;
                    (0xdc00..=0xdfff).contains(&low).then_some(at + 12)
                }
                0xdc00..=0xdfff => None,
                _ => Some(at + 6),
            }
        }
        _ => None,
    }
}

fn hex4(digits: &[u8]) -> Option<u32> {
    digits.iter().try_fold(0u32, |n, &d| Some(n << 4 | char::from(d).to_digit(16)?))
}

/// Calls `sink` with the unescaped pieces of a validated string's contents, in order, until it
/// returns `false`.
pub(super) fn unescape(raw: &[u8], mut sink: impl FnMut(&[u8]) -> bool) {
    let mut pos = 0;
    while pos < raw.len() {
        let end = memchr::memchr(b'\\', &raw[pos..]).map_or(raw.len(), |e| pos + e);
        if !sink(&raw[pos..end]) || end == raw.len() {
            return;
        }
        let mut utf8 = [0u8; 4];
        let (piece, next): (&[u8], usize) = match raw[end + 1] {
            b'u' => {
                let unit = hex4(&raw[end + 2..end + 6]).expect("validated");
                let (code, next) = match unit {
                    0xd800..=0xdbff => {
                        let low = hex4(&raw[end + 8..end + 12]).expect("validated");
                        (0x10000 + ((unit - 0xd800) << 10) + (low - 0xdc00), end + 12)
                    }
                    _ => (unit, end + 6),
                };
                let c = char::from_u32(code).expect("surrogates paired");
                (c.encode_utf8(&mut utf8).as_bytes(), next)
            }
            other => (std::slice::from_ref(unescaped(other)), end + 2),
        };
        if !sink(piece) {
            return;
        }
        pos = next;
    }
}

/// The byte a one-character escape stands for.
fn unescaped(escape: u8) -> &'static u8 {
    match escape {
        b'b' => &0x08,
        b'f' => &0x0c,
        b'n' => &b'\n',
        b'r' => &b'\r',
        b't' => &b'\t',
        b'"' => &b'"',
        b'\\' => &b'\\',
        b'/' => &b'/',
        _ => unreachable!("validated escape"),
    }
}

/// Whether a validated string's contents unescape to exactly `target`.
pub(super) fn unescaped_eq(raw: &[u8], target: &[u8]) -> bool {
    let mut matched = 0;
    let mut equal = true;
    unescape(raw, |piece| {
        equal = target[matched..].starts_with(piece);
        matched += piece.len();
        equal
    });
    equal && matched == target.len()
}

fn unescape_to_string(raw: &[u8]) -> String {
    let mut bytes = Vec::with_capacity(raw.len());
    unescape(raw, |piece| {
        bytes.extend_from_slice(piece);
        true
    });
    String::from_utf8(bytes).expect("validated UTF-8 and paired surrogates")
}

#[cfg(test)]
#[path = "json_tests.rs"]
mod tests;
