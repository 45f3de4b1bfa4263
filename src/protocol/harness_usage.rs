//! The `usage` scanner against serde_json, and against itself under splits and chunk framing.
//!
//! [`reference_usage`] parses a JSON body, or each event of an SSE body, with serde_json and
//! walks every value in document order, keeping each `prompt_tokens`, `cached_tokens` and
//! `completion_tokens` member (keys as sent, without escapes) whose value is an integer that
//! fits `u32`: the scanner's module doc restated on a real parser.

use serde::de::{Deserialize, DeserializeSeed, Deserializer, Error, MapAccess, SeqAccess, Visitor};

use super::super::usage::{Usage, UsageScanner};
use super::pieces;

/// A key as the scanner reads it: exactly `prompt_tokens`, `cached_tokens` or
/// `completion_tokens` as sent.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Field {
    Prompt,
    Cached,
    Completion,
    Other,
}

impl<'de> Deserialize<'de> for Field {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Name;
        impl<'de> Visitor<'de> for Name {
            type Value = Field;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("a key")
            }
            /// serde_json lends the key from the body when it holds no escape.
            fn visit_borrowed_str<E: Error>(self, key: &'de str) -> Result<Field, E> {
                Ok(match key {
                    "prompt_tokens" => Field::Prompt,
                    "cached_tokens" => Field::Cached,
                    "completion_tokens" => Field::Completion,
                    _ => Field::Other,
                })
            }
            /// A key that held escapes: not matched as sent.
            fn visit_str<E: Error>(self, _: &str) -> Result<Field, E> {
                Ok(Field::Other)
            }
        }
        d.deserialize_str(Name)
    }
}

/// Walks a value, recording the fields it finds; `field` is the key the value belongs to.
struct Walk<'v> {
    field: Field,
    found: &'v mut Vec<(Field, u32)>,
}

impl<'de> DeserializeSeed<'de> for Walk<'_> {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Walk<'_> {
    type Value = ();
    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_u64<E: Error>(self, n: u64) -> Result<(), E> {
        let counted = matches!(self.field, Field::Prompt | Field::Cached | Field::Completion);
        if let (true, Ok(n)) = (counted, u32::try_from(n)) {
            self.found.push((self.field, n));
        }
        Ok(())
    }
    fn visit_i64<E: Error>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: Error>(self, _: f64) -> Result<(), E> {
        Ok(())
    }
    fn visit_bool<E: Error>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_str<E: Error>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E: Error>(self) -> Result<(), E> {
        Ok(())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Walk { field: Field::Other, found: self.found })?.is_some() {}
        Ok(())
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        while let Some(field) = map.next_key::<Field>()? {
            map.next_value_seed(Walk { field, found: self.found })?;
        }
        Ok(())
    }
}

/// Every counted member of the JSON value `json`, in order; `None` if serde_json refuses it.
fn json_fields(json: &[u8], found: &mut Vec<(Field, u32)>) -> Option<()> {
    let mut de = serde_json::Deserializer::from_slice(json);
    Walk { field: Field::Other, found }.deserialize(&mut de).ok()?;
    de.end().ok()
}

/// Every counted member of `body`, in order: a JSON body, or an SSE body of `data: ` events
/// separated by blank lines whose payloads are each JSON or `[DONE]`. `None` otherwise.
fn fields(body: &[u8]) -> Option<Vec<(Field, u32)>> {
    let mut found = Vec::new();
    if json_fields(body, &mut found).is_some() {
        return Some(found);
    }
    found.clear();
    let events = body.strip_suffix(b"\n\n")?;
    for event in events.split(|&b| b == b'\n').filter(|line| !line.is_empty()) {
        match event.strip_prefix(b"data: ")? {
            b"[DONE]" => {}
            payload => json_fields(payload, &mut found)?,
        }
    }
    Some(found)
}

/// The usage of `body` by the reference, or `None` when it is neither JSON nor SSE of JSON.
pub fn reference_usage(body: &[u8]) -> Option<Usage> {
    let found = fields(body)?;
    let last = |field| found.iter().rev().find(|(f, _)| *f == field).map(|&(_, n)| n);
    Some(Usage {
        prompt_tokens: last(Field::Prompt),
        cached_tokens: last(Field::Cached),
        completion_tokens: last(Field::Completion),
    })
}

/// Chunk-size lines a relayed body may carry between pieces.
const FRAMING: [&[u8]; 4] = [b"\r\n1f\r\n", b"\r\n20\r\n", b"\r\n400;x=y\r\n", b"\r\n0\r\n"];

/// The usage and event count of `body` read in pieces of sizes from [`pieces`]`(seed)`.
fn scan(body: &[u8], seed: u8) -> (Usage, u32) {
    let mut scanner = UsageScanner::new();
    let mut next = pieces(seed);
    let mut rest = body;
    while !rest.is_empty() {
        let (piece, tail) = rest.split_at(next().min(rest.len()));
        scanner.feed(piece);
        rest = tail;
    }
    (scanner.usage(), scanner.events())
}

/// SSE events a reader would see: lines starting `data:` (the body's first line included).
fn reference_events(body: &[u8]) -> u32 {
    body.split(|&b| b == b'\n').filter(|line| line.starts_with(b"data:")).count() as u32
}

/// Fuzz input: a mode byte (bit 0: the rest is SSE payloads separated by `0xff`, wrapped as
/// `data:` events; bits 1-2: a framing line; the rest: where it goes), a split seed, the body.
/// Checks that the scanner gives the same usage fed whole, in pieces and byte by byte; that it
/// agrees with [`reference_usage`] wherever serde_json reads the body; and that the body with a
/// chunk-size line inserted anywhere reports, for each key, nothing or a value the body holds.
pub fn check_usage(data: &[u8]) {
    let [mode, seed, rest @ ..] = data else { return };
    let body = match mode & 1 {
        0 => rest.to_vec(),
        _ => {
            let mut body = Vec::new();
            for payload in rest.split(|&b| b == 0xff) {
                body.extend_from_slice(b"data: ");
                body.extend_from_slice(payload);
                body.extend_from_slice(b"\n\n");
            }
            body.extend_from_slice(b"data: [DONE]\n\n");
            body
        }
    };
    let whole = scan(&body, 0);
    assert_eq!(scan(&body, *seed), whole, "split with seed {seed}");
    assert_eq!(whole.1, reference_events(&body), "events");
    let mut scanner = UsageScanner::new();
    body.iter().for_each(|b| scanner.feed(std::slice::from_ref(b)));
    assert_eq!((scanner.usage(), scanner.events()), whole, "byte by byte");
    let whole = whole.0;
    let Some(found) = fields(&body) else { return };
    assert_eq!(Some(whole), reference_usage(&body), "against serde_json");
    let framing = FRAMING[usize::from(mode >> 1 & 3)];
    let at = usize::from(mode >> 3) * body.len() / 31;
    let framed = [&body[..at], framing, &body[at..]].concat();
    let (got, _) = scan(&framed, *seed);
    let held = |field, value: Option<u32>| {
        value.is_none_or(|n| found.iter().any(|&(f, m)| f == field && m == n))
    };
    assert!(held(Field::Prompt, got.prompt_tokens), "framing at {at}: {got:?}");
    assert!(held(Field::Cached, got.cached_tokens), "framing at {at}: {got:?}");
    assert!(held(Field::Completion, got.completion_tokens), "framing at {at}: {got:?}");
}
