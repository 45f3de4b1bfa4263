//! Derived sessions (issue \[10\]) under S16's placement: conversations without identity are
//! given a session turn by turn from their prompts' conversation ends (`derive.rs`), checked
//! case by case and against a restatement. A child of the placement tests, whose harness it
//! drives.

use super::*;

/// A chat body of `messages` (role, content).
fn chat(messages: &[(&str, &str)]) -> String {
    let list: Vec<String> = messages
        .iter()
        .map(|(role, content)| format!(r#"{{"role":"{role}","content":"{content}"}}"#))
        .collect();
    format!(r#"{{"model":"m","messages":[{}]}}"#, list.join(","))
}

impl H {
    /// Request `id` with the chat `messages` hashed as a shard does (blocks and conversation
    /// ends): the (id, turn, derived, lane) of the admissions it makes.
    fn chat(
        &mut self,
        id: u64,
        session: Option<u64>,
        messages: &[(&str, &str)],
    ) -> Vec<(u64, u16, bool, Lane)> {
        let body = chat(messages);
        let pool = self.s.prompt_pool().expect("prefix-cost has a pool");
        let prompt = pool.acquire().expect("a free slot");
        let mut hasher = crate::protocol::PromptHasher::new(256);
        pool.with_ends(prompt, |hashes, ends| {
            hasher.hash_body(body.as_bytes(), hashes);
            *ends = hasher.ends();
        });
        let arrival = arrival(id, session, body.len() as u32, false, prompt);
        self.outputs(Input::Arrive(arrival))
            .iter()
            .filter_map(|o| match *o {
                Output::Admit { id, turn, derived, lane, .. } => Some((id.0, turn, derived, lane)),
                Output::Reject { .. } => None,
            })
            .collect()
    }
}

const SYSTEM: (&str, &str) = ("system", "You answer questions about caches, briefly.");

#[test]
fn a_conversation_without_identity_is_derived_turn_by_turn() {
    let mut h = H::new(params(2, 8));
    let turn1 = [SYSTEM, ("user", "What is a prefix cache?")];
    assert_eq!(h.chat(1, None, &turn1), vec![(1, 1, false, Lane::Normal)]);
    assert_eq!(h.s.sessions_active(), 0, "a lone request is no session yet");
    h.complete(1);
    let turn2 = [SYSTEM, turn1[1], ("assistant", "Keys and values kept."), ("user", "How long?")];
    assert_eq!(h.chat(2, None, &turn2), vec![(2, 2, true, Lane::Boosted)]);
    assert_eq!(h.s.sessions_active(), 1);
    h.complete(2);
    let mut turn3 = turn2.to_vec();
    turn3.extend([("assistant", "Until evicted."), ("user", "By whom?")]);
    assert_eq!(h.chat(3, None, &turn3), vec![(3, 3, true, Lane::Boosted)]);
    h.complete(3);
    // Another conversation with the same system prompt: a first turn, not merged.
    let other = [SYSTEM, ("user", "What is a KV block?")];
    assert_eq!(h.chat(4, None, &other), vec![(4, 1, false, Lane::Normal)]);
    h.complete(4);
    // A branch: two next turns of turn 3 both join its session, as turn 4.
    let mut branch = turn3.clone();
    branch.extend([("assistant", "The engine."), ("user", "Why?")]);
    let mut other_branch = turn3.clone();
    other_branch.extend([("assistant", "The scheduler."), ("user", "When?")]);
    assert_eq!(h.chat(5, None, &branch), vec![(5, 4, true, Lane::Boosted)]);
    assert_eq!(h.chat(6, None, &other_branch), vec![(6, 4, true, Lane::Boosted)]);
    assert_eq!(h.s.sessions_active(), 1);
    assert_eq!((h.s.stats().derived_matched, h.s.stats().derived_fresh), (4, 2));
}

#[test]
fn derivation_needs_a_completed_turn_no_identity_and_the_key() {
    let turn1 = [SYSTEM, ("user", "What is a prefix cache?")];
    let turn2 = [SYSTEM, turn1[1], ("assistant", "Keys and values kept."), ("user", "How long?")];
    // A failed turn leaves nothing to continue.
    let mut h = H::new(params(1, 8));
    h.chat(1, None, &turn1);
    h.send(Input::Complete { id: RequestId(1), success: false, usage: Usage::NONE });
    assert_eq!(h.chat(2, None, &turn2), vec![(2, 1, false, Lane::Normal)]);
    // A client's identity wins over derivation.
    h.complete(2);
    assert_eq!(h.chat(3, Some(42), &turn2), vec![(3, 1, false, Lane::Normal)]);
    // With `derive_sessions = false` nothing is derived.
    let mut p = params(1, 8);
    p.prefix.derive_sessions = false;
    let mut h = H::new(p);
    h.chat(1, None, &turn1);
    h.complete(1);
    assert_eq!(h.chat(2, None, &turn2), vec![(2, 1, false, Lane::Normal)]);
    assert_eq!(h.s.stats().derived_fresh, 0);
}

#[test]
fn a_lone_request_holds_no_grace_slot_a_derived_turn_does() {
    let mut p = params(1, 8);
    p.grace_period = 1 << 20;
    let mut h = H::new(p);
    let turn1 = [SYSTEM, ("user", "What is a prefix cache?")];
    let turn2 = [SYSTEM, turn1[1], ("assistant", "Keys and values kept."), ("user", "How long?")];
    h.chat(1, None, &turn1);
    h.complete(1);
    assert_eq!(h.s.stats().grace_holds, 0);
    assert_eq!(h.chat(2, None, &turn2), vec![(2, 2, true, Lane::Boosted)]);
    h.complete(2);
    assert_eq!(h.s.stats().grace_holds, 1);
}

/// The end hash of the whole text of `messages` as a shard hashes it (`protocol::prompt`).
fn whole_end(messages: &[(String, String)]) -> u64 {
    let pairs: Vec<(&str, &str)> = messages.iter().map(|(r, t)| (r.as_str(), t.as_str())).collect();
    let mut hasher = crate::protocol::PromptHasher::new(256);
    hasher.hash_body(chat(&pairs).as_bytes(), &mut Vec::new());
    hasher.ends().whole().expect("a chat prompt ends a message")
}

/// The derivation restated on message lists (issue \[10\]). `completed` is every prompt a
/// successful turn ended with, as the table of conversation ends would hold it: two-way
/// buckets of the newest ends, by the low bits of the end hash (`buckets` of them). The
/// boundaries are those `protocol::prompt` names: after each message once one that is not
/// `system` or `developer` was seen, the last `ENDS` of them; the prompt's own end is not a
/// candidate, the newest earlier one still held is.
#[derive(Default)]
struct Conversations {
    /// Bucket → its (end, session label) pairs, newest first.
    buckets: std::collections::HashMap<usize, Vec<(u64, u32)>>,
    mask: usize,
}

impl Conversations {
    fn new(max_sessions: usize) -> Conversations {
        let buckets = (max_sessions * 2).next_power_of_two().max(64) / 2;
        Conversations { buckets: Default::default(), mask: buckets - 1 }
    }

    fn find(&self, messages: &[(String, String)]) -> Option<u32> {
        let first =
            messages.iter().position(|(role, _)| role != "system" && role != "developer")?;
        let ends = crate::protocol::prompt::ENDS;
        let boundaries = (first + 1..messages.len()).rev().take(ends - 1);
        boundaries.into_iter().find_map(|k| {
            let end = whole_end(&messages[..k]);
            let bucket = self.buckets.get(&(end as usize & self.mask))?;
            bucket.iter().find(|(held, _)| *held == end).map(|&(_, label)| label)
        })
    }

    fn record(&mut self, messages: &[(String, String)], label: u32) {
        let end = whole_end(messages);
        let bucket = self.buckets.entry(end as usize & self.mask).or_default();
        bucket.retain(|(held, _)| *held != end);
        bucket.insert(0, (end, label));
        bucket.truncate(2);
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// Conversations without identity, some sharing a system prompt or their whole first
    /// prompt, take turns in a random order, some turns failing: every turn is derived exactly
    /// when the restatement finds a completed turn it extends, and then it continues that
    /// turn's session (its depth is that session's completed turns plus one). So a follow-up
    /// is found, a shared system prompt merges nothing, and a failed turn's successor
    /// continues the turn before it.
    #[test]
    fn derivation_matches_its_restatement(
        firsts in proptest::collection::vec((0u8..3, 0u8..4, 0usize..40), 1..6),
        steps in proptest::collection::vec((0usize..6, 0u8..5, 0u8..3), 1..40),
    ) {
        check_derivation(&firsts, &steps)?;
    }
}

/// [`derivation_matches_its_restatement`]'s case: conversation `c` starts with an optional
/// system prompt (`system` < 2 names a shared one), a first user message whose content id may
/// repeat across conversations and `words` more words; each step sends conversation `c`'s next
/// turn (after the first, `added` messages of the answer, 0 to 2, and a user message) and fails
/// it when `fail` is 0.
fn check_derivation(
    firsts: &[(u8, u8, usize)],
    steps: &[(usize, u8, u8)],
) -> Result<(), proptest::test_runner::TestCaseError> {
    let mut h = H::new(params(2, 64));
    // Each conversation: an optional shared system prompt, a first user message (content
    // ids may repeat across conversations: identical first prompts), then its turns.
    let mut conversations: Vec<Vec<(String, String)>> = firsts
        .iter()
        .map(|&(system, content, words)| {
            let mut m = Vec::new();
            if system < 2 {
                m.push((
                    "system".to_owned(),
                    format!("You are helper {system}. {}", "word ".repeat(60)),
                ));
            }
            m.push(("user".to_owned(), format!("question {content} {}", "more ".repeat(words))));
            m
        })
        .collect();
    let mut started = vec![false; conversations.len()];
    let mut completed = Conversations::new(100); // `params`' max_sessions
    let mut sessions: Vec<u32> = Vec::new(); // completed turns per session label
    for (id, &(c, fail, added)) in (1u64..).zip(steps) {
        let c = c % conversations.len();
        if started[c] {
            for k in 0..added {
                let role = if k == 0 { "assistant" } else { "tool" };
                conversations[c].push((role.to_owned(), format!("answer {id}.{k}")));
            }
            conversations[c].push(("user".to_owned(), format!("follow-up {id}")));
        }
        started[c] = true;
        let messages = conversations[c].clone();
        let expected = completed.find(&messages);
        let as_pairs: Vec<(&str, &str)> =
            messages.iter().map(|(r, t)| (r.as_str(), t.as_str())).collect();
        let admitted = h.chat(id, None, &as_pairs);
        proptest::prop_assert_eq!(admitted.len(), 1, "admitted at once");
        let (_, turn, derived, _) = admitted[0];
        proptest::prop_assert_eq!(derived, expected.is_some(), "step {}: {:?}", id, messages);
        let label = match expected {
            Some(label) => label,
            None => {
                sessions.push(0);
                sessions.len() as u32 - 1
            }
        };
        proptest::prop_assert_eq!(
            u32::from(turn),
            sessions[label as usize] + 1,
            "depth at step {}",
            id
        );
        if fail == 0 {
            h.send(Input::Complete { id: RequestId(id), success: false, usage: Usage::NONE });
        } else {
            h.complete(id);
            sessions[label as usize] += 1;
            completed.record(&messages, label);
        }
    }
    Ok(())
}
