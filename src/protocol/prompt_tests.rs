use super::*;
use crate::protocol::harness::{check_model_field, reference_prompt_text};
use proptest::prelude::*;

/// The fused pass on `body` in blocks of `block`: its hashes and prompt length, after checking
/// that it agrees with `find_model` and with the serde_json reference.
fn hashes(body: &str, block: usize) -> (Vec<u64>, usize) {
    assert!(find_model(body.as_bytes()).is_ok(), "test body: {body}");
    check_model_field(body.as_bytes());
    let mut out = Vec::new();
    let mut hasher = PromptHasher::new(block);
    let (_, bytes) = find_model_and_prompt(body.as_bytes(), Some((&mut hasher, &mut out))).unwrap();
    let mut again = Vec::new();
    assert_eq!(hasher.hash_body(body.as_bytes(), &mut again), bytes);
    assert_eq!(again, out);
    (out, bytes)
}

fn of_text(text: &[u8], block: usize) -> Vec<u64> {
    let mut out = Vec::new();
    PromptHasher::new(block).hash_text(text, &mut out);
    out
}

/// The chained hashes by the definition: block k's is xxh3 of block k - 1's hash and xxh3 of
/// its bytes, 16 bytes little-endian.
fn by_hand(text: &[u8], block: usize) -> Vec<u64> {
    let mut chain = 0u64;
    text.chunks_exact(block)
        .map(|b| {
            let pair: Vec<u8> =
                chain.to_le_bytes().into_iter().chain(xxh3_64(b).to_le_bytes()).collect();
            chain = xxh3_64(&pair);
            chain
        })
        .collect()
}

#[test]
fn hash_text_chains_full_blocks_only() {
    let text: Vec<u8> = (0..1000u32).map(|i| (i * 7 % 251) as u8).collect();
    for block in [1, 2, 3, 16, 255, 256, 999, 1000, 1001] {
        assert_eq!(of_text(&text, block), by_hand(&text, block), "block {block}");
    }
    assert_eq!(of_text(b"abc", 4), Vec::<u64>::new());
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
fn strings_are_hashed_as_sent() {
    let parts = r#"{"model":"m","messages":[{"role":"user","content":[
        {"type":"text","text":"a\nb"},{"type":"image_url","image_url":{"url":"x"}},
        {"type":"text","text":"\u00e9"}]}]}"#;
    assert_eq!(hashes(parts, 3).0, of_text(b"user\0a\\nb\0\\u00e9\0", 3));
    let prompt = r#"{"prompt":"once \"upon\"","model":"m"}"#;
    assert_eq!(hashes(prompt, 2).0, of_text(b"once \\\"upon\\\"\0", 2));
    let pieces = r#"{"model":"m","prompt":["ab","cd",7,["ef"]]}"#;
    assert_eq!(hashes(pieces, 2), (of_text(b"ab\0cd\0", 2), 6));
    let tokens = r#"{"model":"m","prompt":[1,2,3]}"#;
    assert_eq!(hashes(tokens, 1), (vec![], 0));
    let utf8 = "{\"model\":\"m\",\"prompt\":\"é\"}";
    assert_eq!(hashes(utf8, 1).0, of_text("é\0".as_bytes(), 1));
    assert_ne!(hashes(utf8, 1).0, hashes(r#"{"model":"m","prompt":"\u00e9"}"#, 1).0);
}

#[test]
fn moving_a_boundary_changes_the_hashes() {
    let a = r#"{"model":"m","messages":[{"role":"user","content":"ab"},{"role":"user","content":"c"}]}"#;
    let b = r#"{"model":"m","messages":[{"role":"user","content":"a"},{"role":"user","content":"bc"}]}"#;
    let (a, b) = (hashes(a, 1), hashes(b, 1));
    assert_eq!(a.1, b.1);
    assert_ne!(a.0, b.0);
    let c = r#"{"model":"m","prompt":["ab","c"]}"#;
    let d = r#"{"model":"m","prompt":["a","bc"]}"#;
    assert_ne!(hashes(c, 2).0, hashes(d, 2).0);
}

#[test]
fn content_before_role_comes_after_it() {
    let string = r#"{"model":"m","messages":[{"content":"hi","name":"x","role":"user"}]}"#;
    assert_eq!(hashes(string, 1).0, of_text(b"user\0hi\0", 1));
    let parts = r#"{"model":"m","messages":[{"content":[{"text":"a"},{"type":"x","text":"b"},
        "c",{"text":1},{"te\u0078t":"d"}],"role":"user"},{"role":"assistant","content":"e"}]}"#;
    assert_eq!(hashes(parts, 1).0, of_text(b"user\0a\0b\0d\0assistant\0e\0", 1));
    let no_role = r#"{"model":"m","messages":[{"content":[{"text":"a"}]},{"content":"b"}]}"#;
    assert_eq!(hashes(no_role, 1).0, of_text(b"a\0b\0", 1));
    let role_object = r#"{"model":"m","messages":[{"content":"a","role":{"role":"x"}}]}"#;
    assert_eq!(hashes(role_object, 1).0, of_text(b"a\0", 1));
}

#[test]
fn the_first_of_a_repeated_key_counts() {
    let body = r#"{"model":"m","messages":[{"role":"user","role":"x","content":"a",
        "content":"b","content":[{"text":"c"}]},{"content":[{"text":"d","text":"e"}],
        "content":"f","role":"r"}],"messages":[{"role":"u","content":"g"}],
        "prompt":"p","prompt":["q"]}"#;
    assert_eq!(hashes(body, 1).0, of_text(b"user\0a\0r\0d\0p\0", 1));
    let role_null = r#"{"model":"m","messages":[{"role":null,"role":"user","content":"a"}]}"#;
    assert_eq!(hashes(role_null, 1).0, of_text(b"a\0", 1));
}

#[test]
fn messages_and_prompt_in_key_order() {
    let body = r#"{"prompt":"p","model":"m","messages":[{"role":"user","content":"a"}]}"#;
    assert_eq!(hashes(body, 1).0, of_text(b"p\0user\0a\0", 1));
    let body = r#"{"messages":[{"role":"user","content":"a"}],"model":"m","prompt":["p"]}"#;
    assert_eq!(hashes(body, 1).0, of_text(b"user\0a\0p\0", 1));
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
        "prompt":"y"},"messages":[{"role":"user","content":"z","x":{"role":"q","content":"w"}},
        [{"role":"user","content":"v"}],"s"],"n":[{"prompt":"u"}]}"#;
    assert_eq!(hashes(body, 1).0, of_text(b"user\0z\0", 1));
    let deep = r#"{"model":"m","messages":[{"role":"user","content":[{"text":"a",
        "x":[{"text":"b"}]},[{"text":"c"}]]}],"x":[[[[[[{"messages":"d"}]]]]]]}"#;
    assert_eq!(hashes(deep, 1).0, of_text(b"user\0a\0", 1));
}

#[test]
fn every_block_size_matches_the_text() {
    let body = r#"{"model":"m","messages":[{"role":"system","content":"You are terse.\n"},
        {"role":"user","content":[{"type":"text","text":"Compare \"a\" and \u00e9."},
        {"type":"text","text":"Then stop."}]},{"content":"Sure \\o/","role":"assistant"}]}"#;
    let text = reference_prompt_text(body.as_bytes()).unwrap();
    assert!(text.starts_with(b"system\0You are terse.\\n\0user\0Compare \\\"a\\\""));
    for block in 1..=text.len() + 1 {
        let (out, bytes) = hashes(body, block);
        assert_eq!(bytes, text.len());
        assert_eq!(out, by_hand(&text, block), "block {block}");
    }
}

#[test]
fn long_strings_are_hashed_in_place_and_across_pieces() {
    let long = "0123456789abcdef".repeat(100);
    let body = format!(
        r#"{{"model":"m","messages":[{{"role":"user","content":"{long}"}},{{"role":"x","content":"{long}"}}]}}"#
    );
    let text = format!("user\0{long}\0x\0{long}\0");
    for block in [7, 64, 256, 1600, 4000] {
        assert_eq!(hashes(&body, block).0, by_hand(text.as_bytes(), block), "block {block}");
    }
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
fn refused_bodies_have_no_prompt_and_the_same_error() {
    let mut hasher = PromptHasher::new(2);
    let mut out = Vec::new();
    let bodies: [&[u8]; 7] = [
        br#"{"prompt":"abcdef"}"#,
        br#"{"prompt":"abcdef","model":1}"#,
        br#"{"prompt":"abcdef","model":"a","model":"b"}"#,
        br#"{"prompt":"abcdef","model":"a","x":[}"#,
        br#"{"messages":[{"role":"user","content":"abcdef"}],"model":"m""#,
        br#"["prompt","abcdef"]"#,
        b"",
    ];
    for body in bodies {
        out.push(1);
        let fused = find_model_and_prompt(body, Some((&mut hasher, &mut out)));
        assert_eq!(fused.map(|(f, _)| f), find_model(body));
        assert!(out.is_empty());
        out.push(1);
        assert_eq!(hasher.hash_body(body, &mut out), 0);
        assert!(out.is_empty());
    }
    let without = find_model_and_prompt(br#"{"model":"m","prompt":"abc"}"#, None).unwrap();
    assert_eq!((without.0.value.as_ref(), without.1), ("m", 0));
}

#[test]
fn truncated_or_odd_input_does_not_panic() {
    let body = br#"{"model":"m","messages":[{"content":[{"text":"abc"}],"role":"user"}]}"#;
    let mut hasher = PromptHasher::new(2);
    let mut out = Vec::new();
    for end in 0..body.len() {
        check_model_field(&body[..end]);
        hasher.hash_body(&body[..end], &mut out);
        assert!(out.is_empty());
    }
    for odd in [&b"[]"[..], b"\"x\"", b"{\"messages\":5}", b"{\"prompt\":{}}", b"{\"a\"}"] {
        check_model_field(odd);
    }
}

/// Chat and completion bodies with the shapes the definition distinguishes: key orders,
/// repeated and escaped keys, parts, values of other types, nesting, whitespace.
fn prompt_body() -> impl Strategy<Value = String> {
    let key = |name: &'static str| {
        prop_oneof![
            6 => Just(name.to_owned()),
            1 => Just(name.replacen(&name[..1], &format!("\\u{:04x}", name.as_bytes()[0]), 1)),
            1 => Just(format!("{name}x")),
        ]
    };
    let text = prop_oneof![
        4 => "[a-z ]{0,12}".prop_map(|s| format!("\"{s}\"")),
        1 => Just(r#""a\"b\\c\n\u00e9\ud83d\ude00""#.to_owned()),
        1 => Just("\"ünï\"".to_owned()),
        1 => Just("null".to_owned()),
        1 => Just("[1,2]".to_owned()),
        1 => Just("{\"text\":\"t\"}".to_owned()),
    ];
    let member = |key: BoxedStrategy<String>, value: BoxedStrategy<String>| {
        (key, value).prop_map(|(k, v)| format!("\"{k}\" : {v}"))
    };
    let object = |members: BoxedStrategy<String>| {
        proptest::collection::vec(members, 0..5).prop_map(|m| format!("{{{}}}", m.join(",")))
    };
    let array = |items: BoxedStrategy<String>| {
        proptest::collection::vec(items, 0..5).prop_map(|i| format!("[ {} ]", i.join(" ,")))
    };
    let part = object(
        prop_oneof![
            3 => member(key("text").boxed(), text.clone().boxed()),
            1 => member(key("type").boxed(), text.clone().boxed()),
        ]
        .boxed(),
    );
    let content = prop_oneof![3 => text.clone(), 2 => array(part.boxed())].boxed();
    let message = object(
        prop_oneof![
            3 => member(key("role").boxed(), text.clone().boxed()),
            3 => member(key("content").boxed(), content),
            1 => member(key("name").boxed(), text.clone().boxed()),
        ]
        .boxed(),
    );
    let messages = prop_oneof![6 => array(message.boxed()), 1 => text.clone()].boxed();
    let prompt = prop_oneof![2 => text.clone(), 1 => array(text.boxed())].boxed();
    let top = prop_oneof![
        3 => member(key("messages").boxed(), messages),
        2 => member(key("prompt").boxed(), prompt),
        1 => member(Just("metadata".to_owned()).boxed(), Just(r#"{"prompt":"x"}"#.to_owned()).boxed()),
        1 => member(Just("stream".to_owned()).boxed(), Just("true".to_owned()).boxed()),
    ];
    (proptest::collection::vec(top, 0..4), any::<proptest::sample::Index>()).prop_map(
        |(mut members, at)| {
            let i = at.index(members.len() + 1);
            members.insert(i, r#""model":"m""#.to_owned());
            format!("{{{}}}", members.join(","))
        },
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    /// Chat and completion bodies: the fused pass agrees with find_model and with the serde_json
    /// reference of the prompt text, in blocks of 3 and 16 (`check_prompt`).
    #[test]
    fn agrees_with_the_reference_on_prompt_bodies(body in prompt_body()) {
        check_model_field(body.as_bytes());
    }

    /// The same with one byte inserted or removed: mostly refusals, which must match.
    #[test]
    fn agrees_with_the_reference_on_mutated_prompt_bodies(
        body in prompt_body(),
        at in any::<proptest::sample::Index>(),
        byte in prop_oneof![Just(b'"'), Just(b'\\'), Just(b','), Just(b'}'), Just(b']'), any::<u8>()],
        delete in any::<bool>(),
    ) {
        let mut body = body.into_bytes();
        let i = at.index(body.len());
        if delete { body.remove(i); } else { body.insert(i, byte); }
        check_model_field(&body);
    }
}

// Conversation ends (issue [10]'s derived sessions).

/// A chat body of `messages` (role, content), content strings as given (no escaping needed).
fn chat(messages: &[(&str, &str)]) -> String {
    let list: Vec<String> = messages
        .iter()
        .map(|(role, content)| format!(r#"{{"role":"{role}","content":"{content}"}}"#))
        .collect();
    format!(r#"{{"model":"m","messages":[{}]}}"#, list.join(","))
}

fn ends_of(body: &str, block: usize) -> Ends {
    let mut hasher = PromptHasher::new(block);
    hasher.hash_body(body.as_bytes(), &mut Vec::new());
    hasher.ends()
}

/// An end hash by the definition: the partial block after the text's full blocks, seeded with
/// the chain of those blocks xor `END_SEED`.
fn end_by_hand(text: &[u8], block: usize) -> u64 {
    let full = text.len() / block * block;
    let chain = by_hand(&text[..full], block).last().copied().unwrap_or(0);
    xxh3_64_with_seed(&text[full..], chain ^ END_SEED)
}

#[test]
fn a_next_turn_holds_the_previous_prompts_end() {
    let turn1 = [("system", "be brief"), ("user", "what is a prefix cache")];
    let turn2 = [
        ("system", "be brief"),
        ("user", "what is a prefix cache"),
        ("assistant", "a cache of attention keys and values"),
        ("user", "and who evicts it"),
    ];
    for block in [1, 4, 16, 256] {
        let first = ends_of(&chat(&turn1), block);
        let whole = first.whole().expect("a chat prompt ends a message");
        let text = b"system\0be brief\0user\0what is a prefix cache\0";
        assert_eq!(whole, end_by_hand(text, block), "block {block}");
        let next = ends_of(&chat(&turn2), block);
        assert_eq!(next.earlier().get(1), Some(&whole), "two messages on, block {block}");
        assert_ne!(next.whole(), Some(whole));
    }
}

#[test]
fn a_shared_system_prompt_alone_shares_no_end() {
    let a = ends_of(&chat(&[("system", "you are a helpful assistant"), ("user", "hi")]), 16);
    let b = ends_of(&chat(&[("system", "you are a helpful assistant"), ("user", "yo")]), 16);
    // No boundary before the first message that is not the system prompt.
    assert_eq!(a.all().len(), 1);
    assert!(b.earlier().is_empty());
    assert_ne!(a.whole(), b.whole());
    let developer = chat(&[("developer", "rules"), ("system", "more rules"), ("user", "hi")]);
    assert_eq!(ends_of(&developer, 16).all().len(), 1);
    // Even when the texts differ only after the last full block (the partial block counts).
    let (x, y) = (chat(&[("user", "aaaaaaaaaaaaaaaa1")]), chat(&[("user", "aaaaaaaaaaaaaaaa2")]));
    assert_ne!(ends_of(&x, 16).whole(), ends_of(&y, 16).whole());
}

#[test]
fn ends_are_kept_newest_first_and_only_for_messages() {
    let many: Vec<(&str, &str)> =
        (0..12).map(|i| (["user", "assistant"][i % 2], "words words")).collect();
    let ends = ends_of(&chat(&many), 8);
    assert_eq!(ends.all().len(), ENDS);
    assert_eq!(ends.earlier().len(), ENDS - 1);
    // The newest is the whole text's; each earlier one is a shorter conversation's whole.
    for k in 0..ENDS {
        let shorter = ends_of(&chat(&many[..many.len() - k]), 8);
        assert_eq!(Some(ends.all()[k]), shorter.whole(), "{k} messages back");
    }
    let completion = r#"{"model":"m","prompt":"once upon a time"}"#;
    assert_eq!(ends_of(completion, 8), Ends::NONE);
    // A prompt after the messages: the newest end is not the whole text's.
    let both = r#"{"model":"m","messages":[{"role":"user","content":"a"}],"prompt":"b"}"#;
    let ends = ends_of(both, 8);
    assert_eq!((ends.all().len(), ends.whole(), ends.earlier().len()), (1, None, 1));
}

#[test]
fn ends_do_not_depend_on_key_order_or_batching() {
    let role_first = chat(&[("user", "hello there"), ("assistant", "hi")]);
    let content_first = r#"{"model":"m","messages":[{"content":"hello there","role":"user"},
        {"content":[{"type":"text","text":"hi"}],"role":"assistant"}]}"#;
    let parts = r#"{"model":"m","messages":[{"role":"user","content":"hello there"},
        {"role":"assistant","content":[{"type":"text","text":"hi"}]}]}"#;
    for block in [1, 3, 256] {
        let a = ends_of(&role_first, block);
        assert_eq!(a, ends_of(content_first, block), "block {block}");
        assert_eq!(a, ends_of(parts, block), "block {block}");
    }
    // More messages than a batch holds pieces.
    let long: Vec<(&str, &str)> = (0..100).map(|_| ("user", "x")).collect();
    let ends = ends_of(&chat(&long), 5);
    let text = b"user\0x\0".repeat(100);
    assert_eq!(ends.whole(), Some(end_by_hand(&text, 5)));
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// A conversation grown by a few messages keeps the earlier prompt's whole end among its
    /// earlier ends, at the right place, for any block size and message lengths; and every end
    /// matches the definition.
    #[test]
    fn a_grown_conversation_finds_its_previous_end(
        lengths in proptest::collection::vec(0usize..300, 2..20),
        grown in 1usize..ENDS,
        block in 1usize..300,
    ) {
        let contents: Vec<String> =
            lengths.iter().enumerate().map(|(i, &n)| "w".repeat(n) + &i.to_string()).collect();
        let roles = ["user", "assistant"];
        let messages: Vec<(&str, &str)> =
            contents.iter().enumerate().map(|(i, c)| (roles[i % 2], c.as_str())).collect();
        let cut = messages.len().saturating_sub(grown).max(1);
        let before = ends_of(&chat(&messages[..cut]), block);
        let after = ends_of(&chat(&messages), block);
        let mut text = Vec::new();
        for (role, content) in &messages[..cut] {
            text.extend_from_slice(role.as_bytes());
            text.push(0);
            text.extend_from_slice(content.as_bytes());
            text.push(0);
        }
        prop_assert_eq!(before.whole(), Some(end_by_hand(&text, block)));
        let back = messages.len() - cut;
        if (1..ENDS).contains(&back) {
            prop_assert_eq!(after.earlier().get(back - 1).copied(), before.whole());
        }
    }
}
