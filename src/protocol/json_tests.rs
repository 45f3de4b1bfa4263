use super::*;
use crate::protocol::harness::{check_model_field, check_prompt};
use proptest::prelude::*;

/// A JSON value to render with chosen whitespace and key spellings.
#[derive(Debug, Clone)]
enum J {
    Null,
    Bool(bool),
    Number(String),
    Str(String),
    Array(Vec<J>),
    Object(Vec<(String, J)>),
}

/// Keys as they appear between the quotes: plain, escaped forms of `model`, near misses.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just("model".to_owned()),
        1 => Just("mod\\u0065l".to_owned()),
        1 => Just("\\u006dodel".to_owned()),
        1 => Just("modeL".to_owned()),
        1 => Just("messages".to_owned()),
        1 => Just("stream".to_owned()),
        1 => Just("prompt_cache_key".to_owned()),
        1 => Just("us\\u0065r".to_owned()),
        1 => Just("k".to_owned()),
        2 => "[a-z]{0,6}",
    ]
}

fn number() -> impl Strategy<Value = String> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string()),
        any::<f64>().prop_filter("finite", |f| f.is_finite()).prop_map(|f| format!("{f:e}")),
        Just("-0.0E-3".to_owned()),
        Just("1e5".to_owned()),
        Just("0".to_owned()),
    ]
}

fn leaf() -> impl Strategy<Value = J> {
    prop_oneof![
        Just(J::Null),
        any::<bool>().prop_map(J::Bool),
        number().prop_map(J::Number),
        any::<String>().prop_map(J::Str),
        "[a-z\\\"]{0,8}".prop_map(J::Str),
    ]
}

fn value() -> impl Strategy<Value = J> {
    leaf().prop_recursive(5, 48, 6, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 0..6).prop_map(J::Array),
            proptest::collection::vec((key(), inner), 0..6).prop_map(J::Object),
        ]
    })
}

fn pick_style(style: &[u8], at: &mut usize) -> u8 {
    *at += 1;
    style[*at % style.len()]
}

/// Renders `j`, taking whitespace and string spellings from `style` in turn.
fn render(j: &J, style: &[u8], at: &mut usize, out: &mut String) {
    let ws = |p: u8| [" ", "", "\n  ", "", "\t", "", "\r\n", ""][usize::from(p % 8)];
    out.push_str(ws(pick_style(style, at)));
    match j {
        J::Null => out.push_str("null"),
        J::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        J::Number(n) => out.push_str(n),
        J::Str(s) if pick_style(style, at) % 4 == 0 => {
            out.push('"');
            for unit in s.encode_utf16() {
                out.push_str(&format!("\\u{unit:04X}"));
            }
            out.push('"');
        }
        J::Str(s) => {
            let mut bytes = Vec::new();
            write_json_string(s, &mut bytes);
            out.push_str(std::str::from_utf8(&bytes).unwrap());
        }
        J::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                out.push_str(if i > 0 { "," } else { "" });
                render(item, style, at, out);
            }
            out.push(']');
        }
        J::Object(members) => {
            out.push('{');
            for (i, (k, v)) in members.iter().enumerate() {
                out.push_str(if i > 0 { "," } else { "" });
                out.push_str(&format!(
                    "{}\"{k}\"{}:",
                    ws(pick_style(style, at)),
                    ws(pick_style(style, at))
                ));
                render(v, style, at, out);
            }
            out.push('}');
        }
    }
    out.push_str(ws(pick_style(style, at)));
}

/// Rendered JSON objects, most with a top-level `model` of some kind.
fn json_value_strategy() -> impl Strategy<Value = String> {
    let members = proptest::collection::vec((key(), value()), 0..6);
    let model = prop_oneof![
        3 => "[a-zA-Z0-9/._\"\\\\-]{0,12}".prop_map(J::Str),
        1 => any::<String>().prop_map(J::Str),
        1 => value(),
    ];
    (
        members,
        proptest::option::of(model),
        any::<proptest::sample::Index>(),
        proptest::collection::vec(any::<u8>(), 1..16),
    )
        .prop_map(|(mut members, model, at, style)| {
            if let Some(model) = model {
                let i = at.index(members.len() + 1);
                members.insert(i, ("model".to_owned(), model));
            }
            let mut out = String::new();
            render(&J::Object(members), &style, &mut 0, &mut out);
            out
        })
}

/// [`find_model`], after checking that the fused pass (`prompt::find_model_and_prompt`) gives
/// the same result and the prompt the serde_json reference reads (`check_prompt`): every body
/// of these tests goes through both.
fn find(body: &[u8]) -> Result<ModelField<'_>, ModelError> {
    let field = find_model(body);
    check_prompt(body, &field);
    field
}

fn model(body: &str) -> Result<String, ModelError> {
    find(body.as_bytes()).map(|f| f.value.into_owned())
}

#[test]
fn finds_the_top_level_model() {
    let body = r#"{"messages":[{"role":"user","content":"hi"}],"model":"llama","stream":true}"#;
    let f = find(body.as_bytes()).unwrap();
    assert_eq!(f.value, "llama");
    assert!(matches!(f.value, Cow::Borrowed(_)));
    assert_eq!(&body[f.token.clone()], "\"llama\"");
}

#[test]
fn never_picks_a_nested_model() {
    let body = r#"{"messages":[{"model":"inner","content":"{\"model\":\"x\"}"}],
        "metadata":{"model":"meta","deep":[{"model":1}]},"model":"outer"}"#;
    assert_eq!(model(body).unwrap(), "outer");
    assert_eq!(model(r#"{"metadata":{"model":"m"}}"#), Err(ModelError::MissingModel));
    assert_eq!(model(r#"{"a":["model","x"],"b":"model"}"#), Err(ModelError::MissingModel));
    assert_eq!(model(r#"{"x":"\"model\":\"no\"","model":"yes"}"#).unwrap(), "yes");
}

#[test]
fn whitespace_everywhere() {
    assert_eq!(model(" \r\n\t{ \"model\" \n:\t\"m\" , \"a\" : [ 1 , { } ] } \n").unwrap(), "m");
    assert_eq!(model("{\"model\":\"m\"}\u{feff}"), Err(ModelError::InvalidJson { offset: 13 }));
    assert_eq!(model("\u{feff}{\"model\":\"m\"}"), Err(ModelError::NotAnObject));
}

#[test]
fn escapes_in_keys_and_values() {
    assert_eq!(model(r#"{"mod\u0065l":"m"}"#).unwrap(), "m");
    assert_eq!(model(r#"{"mod\u0065l\u0000":"m"}"#), Err(ModelError::MissingModel));
    assert_eq!(model(r#"{"modelx":"m"}"#), Err(ModelError::MissingModel));
    assert_eq!(model(r#"{"mode":"m"}"#), Err(ModelError::MissingModel));
    let f = find(br#"{"model":"a\"b\\c\/d\n\u00e9\ud83d\ude00"}"#).unwrap();
    assert_eq!(f.value, "a\"b\\c/d\n\u{e9}\u{1f600}");
    assert!(matches!(f.value, Cow::Owned(_)));
    assert_eq!(model(r#"{"model":"caf\u00E9"}"#).unwrap(), "café");
    assert_eq!(model("{\"model\":\"café\"}").unwrap(), "café");
}

#[test]
fn missing_non_string_and_duplicate() {
    assert_eq!(model("{}"), Err(ModelError::MissingModel));
    for v in ["1", "null", "true", "[\"m\"]", "{\"model\":\"m\"}", "-0.5e3"] {
        assert_eq!(model(&format!("{{\"model\":{v}}}")), Err(ModelError::ModelNotString), "{v}");
    }
    assert_eq!(model(r#"{"model":"a","model":"a"}"#), Err(ModelError::DuplicateModel));
    assert_eq!(model(r#"{"model":1,"mod\u0065l":"a"}"#), Err(ModelError::DuplicateModel));
}

#[test]
fn not_an_object() {
    for body in ["[]", "\"model\"", "1", "null", " [{\"model\":\"m\"}]"] {
        assert_eq!(model(body), Err(ModelError::NotAnObject), "{body}");
    }
    assert_eq!(model(""), Err(ModelError::InvalidJson { offset: 0 }));
    assert_eq!(model("  "), Err(ModelError::InvalidJson { offset: 2 }));
}

#[test]
fn invalid_json_anywhere_is_an_error() {
    let bad = [
        r#"{"model":"m""#,
        r#"{"model":"m",}"#,
        r#"{"model":"m"}}"#,
        r#"{"model":"m"} x"#,
        r#"{"model" "m"}"#,
        r#"{"model":"m" "a":1}"#,
        r#"{model:"m"}"#,
        r#"{"model":"m","a":[1,]}"#,
        r#"{"model":"m","a":[1 2]}"#,
        r#"{"model":"m","a":01}"#,
        r#"{"model":"m","a":1.}"#,
        r#"{"model":"m","a":.5}"#,
        r#"{"model":"m","a":1e}"#,
        r#"{"model":"m","a":-}"#,
        r#"{"model":"m","a":+1}"#,
        r#"{"model":"m","a":tru}"#,
        r#"{"model":"m","a":nul}"#,
        r#"{"model":"m","a":"\x"}"#,
        r#"{"model":"m","a":"\u12"}"#,
        r#"{"model":"m","a":"\ud800"}"#,
        r#"{"model":"m","a":"\udc00"}"#,
        r#"{"model":"m","a":"\ud800\u0041"}"#,
        "{\"model\":\"m\",\"a\":\"tab\there\"}",
        r#"{"model":"m","a":[}"#,
        r#"{"model":"m","a":{]}"#,
        r#"{"model":"m","a":{"b"}}"#,
    ];
    for body in bad {
        assert!(
            matches!(model(body), Err(ModelError::InvalidJson { .. })),
            "{body}: {:?}",
            model(body)
        );
    }
    assert!(matches!(find(b"{\"model\":\"\xff\"}"), Err(ModelError::InvalidJson { offset: 10 })));
    assert!(matches!(
        find(b"{\"model\":\"m\",\"a\":\"\xc3\"}"),
        Err(ModelError::InvalidJson { .. })
    ));
    assert!(matches!(find(b"{\"model\":\"m\"\xff}"), Err(ModelError::InvalidJson { .. })));
    assert_eq!(model(r#"{"model":"m","a":[1e400,-0,0.5E+2,1E-2]}"#).unwrap(), "m");
}

#[test]
fn depth_limit_at_and_past_the_boundary() {
    let nested = |levels: usize| {
        let inner = levels - 1;
        format!("{{\"model\":\"m\",\"a\":{}{}}}", "[".repeat(inner), "]".repeat(inner))
    };
    assert_eq!(model(&nested(DEPTH_MAX)).unwrap(), "m");
    assert!(matches!(model(&nested(DEPTH_MAX + 1)), Err(ModelError::TooDeep { .. })));
    let objects =
        format!("{}{}", "{\"a\":".repeat(DEPTH_MAX), "1".to_owned() + &"}".repeat(DEPTH_MAX));
    assert_eq!(model(&objects), Err(ModelError::MissingModel));
}

#[test]
fn huge_bodies() {
    let content = "word \\\"quoted\\\" \\n ünï ".repeat(40_000);
    let body = format!(
        r#"{{"messages":[{{"role":"user","content":"{content}","model":"no"}}],"model":"big","n":[{}0]}}"#,
        "1,".repeat(10_000)
    );
    assert!(body.len() > 900_000);
    let f = find(body.as_bytes()).unwrap();
    assert_eq!(f.value, "big");
    check_model_field(body.as_bytes());
}

#[test]
fn utf8_sequences_match_std() {
    for lead in 0x80..=0xffu8 {
        for second in 0..=0xffu8 {
            for (third, fourth) in [(0x80, 0x80), (0xbf, 0xbf), (0x41, 0x80), (0x80, 0x41)] {
                let buf = [lead, second, third, fourth];
                let expected = (2..=4).find(|&n| std::str::from_utf8(&buf[..n]).is_ok());
                assert_eq!(utf8_end(&buf, 0), expected, "{buf:x?}");
            }
        }
    }
}

/// Whether the string scan must look at byte `b`: a quote, a backslash, a control character
/// or a byte of a UTF-8 sequence.
fn special(b: u8) -> bool {
    b == b'"' || b == b'\\' || !(0x20..0x80).contains(&b)
}

/// `N` bytes of `a` with `b` at `at` and `other` every `step` bytes after it: every special byte
/// at every offset, with more of them (or none) behind it.
fn planted<const N: usize>(b: u8, other: u8, at: usize, step: usize) -> [u8; N] {
    let mut buf = [b'a'; N];
    buf[at] = b;
    for slot in buf.iter_mut().skip(at + 1).step_by(step) {
        *slot = other;
    }
    buf
}

const OTHERS: [u8; 6] = [b'a', b'"', 0x00, 0x1f, 0xff, b'\\'];

#[test]
fn swar_test_finds_the_first_special_byte() {
    for b in 0..=0xffu8 {
        for other in OTHERS {
            for at in 0..8 {
                let word: [u8; 8] = planted(b, other, at, 3);
                let first = word.iter().position(|&w| special(w));
                let mask = attention(u64::from_le_bytes(word));
                let found = (mask != 0).then(|| (mask.trailing_zeros() / 8) as usize);
                assert_eq!(found, first, "{word:x?}");
            }
        }
    }
}

/// [`skip_plain`] from `start` in `buf` against the definition: the first special byte when it
/// says it found one; else nothing special before where it stopped, fewer than 16 bytes after.
fn check_skip(buf: &[u8], start: usize) {
    let (pos, found) = skip_plain(buf, start);
    let first = buf[start..].iter().position(|&w| special(w)).map(|i| i + start);
    match found {
        true => assert_eq!(Some(pos), first, "{buf:x?} from {start}"),
        false => {
            assert!(first.is_none_or(|first| first >= pos), "{buf:x?}");
            assert!(pos >= start && (pos == start || buf.len() - pos < 16));
        }
    }
}

#[test]
fn sixteen_byte_skip_finds_the_first_special_byte() {
    for b in 0..=0xffu8 {
        for other in OTHERS {
            for at in 0..40 {
                let buf: [u8; 40] = planted(b, other, at, 5);
                for start in [0, 1, 7, 15] {
                    check_skip(&buf, start);
                }
            }
        }
    }
}

/// Across the 64-byte steps of long runs and the 16-byte steps after them: a special byte at
/// every offset of 200 bytes, from starts on and off the steps' boundaries.
#[test]
fn sixty_four_byte_skip_finds_the_first_special_byte() {
    for b in [b'"', b'\\', 0x00, 0x1f, 0x20, 0x7f, 0x80, 0xc3, 0xff] {
        for other in OTHERS {
            for at in 0..200 {
                let buf: [u8; 200] = planted(b, other, at, 23);
                for start in [0, 1, 15, 48, 63, 64, 65] {
                    check_skip(&buf, start);
                }
            }
        }
    }
}

/// A string's special bytes at every offset around the 16- and 8-byte steps: the scan agrees
/// with serde_json on each.
#[test]
fn strings_with_a_special_byte_at_every_offset_agree_with_serde_json() {
    for len in [0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 47] {
        for at in 0..len {
            for b in [b'"', b'\\', 0x00, 0x1f, 0x20, 0x7f, 0x80, 0xc3, 0xff] {
                let mut text = vec![b'a'; len];
                text[at] = b;
                let mut body = br#"{"model":"m","x":""#.to_vec();
                body.extend_from_slice(&text);
                body.extend_from_slice(br#""}"#);
                check_model_field(&body);
            }
        }
    }
}

/// The top-level fields of `body` named `names`, as [`scan_body`] records them.
fn fields_of(body: &str, names: &[&str]) -> Vec<Option<String>> {
    let names: Vec<Box<[u8]>> = names.iter().map(|n| n.as_bytes().into()).collect();
    let mut values = vec![FieldValue::Absent; names.len()];
    let fields = BodyFields { names: &names, values: &mut values };
    crate::protocol::scan_body(body.as_bytes(), None, fields).expect("a valid body");
    let text = |v: &FieldValue| v.get(body.as_bytes()).map(|b| String::from_utf8_lossy(b).into());
    values.iter().map(text).collect()
}

#[test]
fn top_level_fields_are_found_in_the_same_pass() {
    let body = r#"{"model":"m","prompt_cache_key":"conv-1","messages":[{"user":"no"}],"user":"u"}"#;
    assert_eq!(
        fields_of(body, &["prompt_cache_key", "user", "conversation"]),
        [Some("conv-1".to_owned()), Some("u".to_owned()), None]
    );
    // Keys compare after unescaping; values are as sent.
    let body = r#"{"prompt_c\u0061che_key":"a\"b","model":"m"}"#;
    assert_eq!(fields_of(body, &["prompt_cache_key"]), [Some("a\\\"b".to_owned())]);
    // Not a string, empty or too long: absent. The first member counts.
    let long = "x".repeat(crate::protocol::SESSION_ID_BYTES_MAX + 1);
    let body =
        format!(r#"{{"a":1,"b":"","c":"{long}","d":"first","d":"second","a":"late","model":"m"}}"#);
    assert_eq!(fields_of(&body, &["a", "b", "c", "d"]), [None, None, None, Some("first".into())]);
    let at_limit = "y".repeat(crate::protocol::SESSION_ID_BYTES_MAX);
    let body = format!(r#"{{"model":"m","k":"{at_limit}"}}"#);
    assert_eq!(fields_of(&body, &["k"]), [Some(at_limit)]);
    // Nested keys of the same name never count; the scan still validates the whole body.
    let body = r#"{"model":"m","metadata":{"prompt_cache_key":"nested"}}"#;
    assert_eq!(fields_of(body, &["prompt_cache_key"]), [None]);
    let names: Vec<Box<[u8]>> = vec![b"k"[..].into()];
    let mut values = [FieldValue::Unseen];
    let refused = br#"{"k":"v","model":"m",}"#;
    let scan = BodyFields { names: &names, values: &mut values };
    assert!(crate::protocol::scan_body(refused, None, scan).is_err());
}

#[test]
fn rewrite_keeps_every_other_byte() {
    let body = b"{ \"model\" : \"short\",\n \"messages\":[{\"model\":\"short\"}], \"x\":1 }";
    let f = find(body).unwrap();
    let mut out = b"prefix".to_vec();
    rewrite_model(body, &f, "meta-llama/Llama \"3\"\n", &mut out);
    let expected = b"prefix{ \"model\" : \"meta-llama/Llama \\\"3\\\"\\n\",\n \"messages\":[{\"model\":\"short\"}], \"x\":1 }";
    assert_eq!(out, expected);
    let again = find(&out[6..]).unwrap();
    assert_eq!(again.value, "meta-llama/Llama \"3\"\n");
    assert_eq!(&out[6..6 + f.token.start], &body[..f.token.start]);
}

#[test]
fn json_string_escaping() {
    let mut out = Vec::new();
    write_json_string("a\u{1}\u{1f}\t\"\\é\u{7f}", &mut out);
    assert_eq!(out, "\"a\\u0001\\u001f\\t\\\"\\\\é\u{7f}\"".as_bytes());
    let back: String = serde_json::from_slice(&out).unwrap();
    assert_eq!(back, "a\u{1}\u{1f}\t\"\\é\u{7f}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Generated JSON objects (with and without top-level and nested "model" keys, escaped keys
    /// and random whitespace) agree with serde_json.
    #[test]
    fn agrees_with_serde_json_on_objects(body in json_value_strategy()) {
        check_model_field(body.as_bytes());
    }

    /// Arbitrary bytes: whenever serde_json refuses, so does find_model.
    #[test]
    fn agrees_with_serde_json_on_arbitrary_bytes(body in proptest::collection::vec(any::<u8>(), 0..64)) {
        check_model_field(&body);
    }

    /// Valid bodies with one byte changed: mostly invalid JSON of the shapes that matter.
    #[test]
    fn agrees_with_serde_json_on_mutations(
        body in json_value_strategy(),
        at in any::<proptest::sample::Index>(),
        byte in prop_oneof![Just(b'"'), Just(b'\\'), Just(b','), Just(b'}'), Just(b'{'), Just(b':'), any::<u8>()],
        delete in any::<bool>(),
    ) {
        let mut body = body.into_bytes();
        let i = at.index(body.len());
        if delete { body.remove(i); } else { body.insert(i, byte); }
        check_model_field(&body);
    }
}

#[test]
fn stream_flag_is_the_top_level_true() {
    let stream = |body: &str| find(body.as_bytes()).unwrap().stream;
    assert!(stream(r#"{"model":"m","stream":true}"#));
    assert!(stream(r#"{"stream" : true , "model":"m"}"#));
    assert!(stream(r#"{"str\u0065am":true,"model":"m"}"#));
    assert!(!stream(r#"{"model":"m","stream":false}"#));
    assert!(!stream(r#"{"model":"m","stream":"true"}"#));
    assert!(!stream(r#"{"model":"m","stream":true,"stream":false}"#));
    assert!(!stream(r#"{"model":"m","options":{"stream":true}}"#));
    assert!(!stream(r#"{"model":"m","stream":[true]}"#));
    assert!(!stream(r#"{"model":"m"}"#));
}

/// Issue \[11\]: the largest top-level `max_tokens` or `max_completion_tokens` integer counts;
/// nested ones, other types, fractions, negatives and overflows do not.
#[test]
fn max_tokens_is_the_largest_top_level_integer() {
    let max = |body: &str| find(body.as_bytes()).unwrap().max_tokens;
    assert_eq!(max(r#"{"model":"m"}"#), None);
    assert_eq!(max(r#"{"model":"m","max_tokens":64}"#), Some(64));
    assert_eq!(max(r#"{"max_completion_tokens" : 0 ,"model":"m"}"#), Some(0));
    assert_eq!(max(r#"{"model":"m","max_tokens":5,"max_completion_tokens":7}"#), Some(7));
    assert_eq!(max(r#"{"model":"m","max_tokens":9,"max_tokens":2}"#), Some(9));
    assert_eq!(max(r#"{"model":"m","max_tok\u0065ns":12}"#), Some(12));
    assert_eq!(max(r#"{"model":"m","max_tokens":4294967295}"#), Some(u32::MAX));
    for ignored in ["4294967296", "-1", "1.5", "1e3", "\"64\"", "null", "[64]", "{\"a\":1}"] {
        let body = format!(r#"{{"model":"m","max_tokens":{ignored}}}"#);
        assert_eq!(max(&body), None, "{body}");
    }
    assert_eq!(max(r#"{"model":"m","options":{"max_tokens":64}}"#), None);
}
