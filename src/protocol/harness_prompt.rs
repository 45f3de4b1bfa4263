//! The prompt text of `super::super::prompt`'s module doc restated on serde_json, and the check
//! of the fused pass against it and against [`find_model`].
//!
//! The restatement keeps every member of an object in order with its value unparsed
//! (`serde_json::value::RawValue`: the value's bytes exactly as sent), then follows the
//! definition clause by clause with vectors; it shares no code with the scan.

use serde::de::{Deserialize, Deserializer, MapAccess, Visitor};
use serde_json::value::RawValue;

use super::super::prompt::{find_model_and_prompt, scan_body, PromptHasher};
use super::super::{BodyFields, FieldValue, ModelError, ModelField, SESSION_ID_BYTES_MAX};

/// An object's members in order, repeated keys kept, keys unescaped, values as sent.
struct Members<'a>(Vec<(String, &'a RawValue)>);

impl<'de> Deserialize<'de> for Members<'de> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct InOrder;
        impl<'de> Visitor<'de> for InOrder {
            type Value = Members<'de>;
            fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("an object")
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Members<'de>, A::Error> {
                let mut members = Vec::new();
                while let Some(key) = map.next_key::<String>()? {
                    members.push((key, map.next_value::<&RawValue>()?));
                }
                Ok(Members(members))
            }
        }
        d.deserialize_map(InOrder)
    }
}

/// The members of `value`, if it is an object.
fn members(value: &RawValue) -> Option<Vec<(String, &RawValue)>> {
    serde_json::from_str::<Members<'_>>(value.get()).ok().map(|m| m.0)
}

/// The elements of `value`, if it is an array.
fn elements(value: &RawValue) -> Option<Vec<&RawValue>> {
    serde_json::from_str(value.get()).ok()
}

/// What lies between the quotes of `value`, if it is a string.
fn string(value: &RawValue) -> Option<&[u8]> {
    let text = value.get().as_bytes();
    (text.first() == Some(&b'"')).then(|| &text[1..text.len() - 1])
}

/// The value of the first member named `name`.
fn first<'a>(members: &[(String, &'a RawValue)], name: &str) -> Option<&'a RawValue> {
    members.iter().find(|(key, _)| key == name).map(|(_, value)| *value)
}

/// The prompt text of `body`, or `None` when serde_json does not take it for an object.
pub fn reference_prompt_text(body: &[u8]) -> Option<Vec<u8>> {
    let top = serde_json::from_slice::<Members<'_>>(body).ok()?.0;
    let mut text = Vec::new();
    let mut piece = |raw: &[u8]| {
        text.extend_from_slice(raw);
        text.push(0);
    };
    let messages = top.iter().position(|(key, _)| key == "messages");
    let prompt = top.iter().position(|(key, _)| key == "prompt");
    let mut order = [messages, prompt];
    order.sort_by_key(|at| at.unwrap_or(usize::MAX));
    for at in order.into_iter().flatten() {
        let value = top[at].1;
        if Some(at) == prompt {
            match string(value) {
                Some(raw) => piece(raw),
                None => elements(value)
                    .unwrap_or_default()
                    .into_iter()
                    .filter_map(string)
                    .for_each(&mut piece),
            }
            continue;
        }
        for message in elements(value).unwrap_or_default().into_iter().filter_map(members) {
            if let Some(role) = first(&message, "role").and_then(string) {
                piece(role);
            }
            let Some(content) = first(&message, "content") else { continue };
            if let Some(raw) = string(content) {
                piece(raw);
            }
            for part in elements(content).unwrap_or_default().into_iter().filter_map(members) {
                if let Some(raw) = first(&part, "text").and_then(string) {
                    piece(raw);
                }
            }
        }
    }
    Some(text)
}

/// Block sizes the fused pass is checked with: most pieces straddle a 3-byte block, and
/// 16-byte blocks are hashed in place from the body as well as through the buffer.
const CHECK_BLOCKS: [usize; 2] = [3, 16];

/// [`find_model_and_prompt`] agrees with `find_model` on `body` (`ours`, its result) and,
/// where serde_json reads the body, with [`reference_prompt_text`].
pub fn check_prompt(body: &[u8], ours: &Result<ModelField<'_>, ModelError>) {
    let reference = reference_prompt_text(body);
    let mut expected = Vec::new();
    for block in CHECK_BLOCKS {
        let mut hasher = PromptHasher::new(block);
        let mut hashes = vec![u64::MAX];
        let fused = find_model_and_prompt(body, Some((&mut hasher, &mut hashes)));
        assert_eq!(fused.as_ref().map(|(field, _)| field), ours.as_ref(), "fused vs find_model");
        let Ok((_, bytes)) = fused else {
            assert!(hashes.is_empty(), "a refused body leaves no hashes");
            continue;
        };
        let Some(text) = &reference else { continue };
        assert_eq!(bytes, text.len(), "prompt text of {:?}", String::from_utf8_lossy(text));
        hasher.hash_text(text, &mut expected);
        assert_eq!(hashes, expected, "blocks of {block} of {:?}", String::from_utf8_lossy(text));
    }
}

/// The top-level fields [`check_fields`] asks the scan for: OpenAI's two identity fields, a
/// key that is usually an array, and a short one the fuzzer finds easily.
pub const CHECK_FIELDS: [&str; 4] = ["prompt_cache_key", "user", "messages", "k"];

/// What the `body:` session source `name` gives for `body`, restated on serde_json: the first
/// top-level member of that (unescaped) name, if it is a string of 1 to
/// [`SESSION_ID_BYTES_MAX`] bytes as sent, its contents as sent. `None` inside `Some` when
/// absent; `None` when serde_json does not take the body for an object.
pub fn reference_field(body: &[u8], name: &str) -> Option<Option<Vec<u8>>> {
    let top = serde_json::from_slice::<Members<'_>>(body).ok()?.0;
    let raw = first(&top, name).and_then(string);
    Some(raw.filter(|raw| (1..=SESSION_ID_BYTES_MAX).contains(&raw.len())).map(<[u8]>::to_vec))
}

/// [`scan_body`] with [`CHECK_FIELDS`], with and without a prompt hasher, agrees with
/// `find_model` on `body` (`ours`, its result) and, where both accept the body, finds each
/// field where [`reference_field`] does.
pub fn check_fields(body: &[u8], ours: &Result<ModelField<'_>, ModelError>) {
    let names: Vec<Box<[u8]>> = CHECK_FIELDS.iter().map(|n| n.as_bytes().into()).collect();
    let mut values = vec![FieldValue::String { start: 0, end: 0 }; names.len()];
    let mut hasher = PromptHasher::new(16);
    let mut hashes = Vec::new();
    for hashing in [false, true] {
        let prompt = hashing.then_some((&mut hasher, &mut hashes));
        let fields = BodyFields { names: &names, values: &mut values };
        let scanned = scan_body(body, prompt, fields);
        assert_eq!(scanned.as_ref().map(|(f, _)| f), ours.as_ref(), "scan_body vs find_model");
        if scanned.is_err() {
            continue;
        }
        for (name, value) in CHECK_FIELDS.iter().zip(&values) {
            let Some(expected) = reference_field(body, name) else { continue };
            assert_eq!(value.get(body).map(<[u8]>::to_vec), expected, "top-level {name:?}");
        }
    }
}
