//! What a bench run sends: a [`Workload`] is a list of [`Session`]s, each a list of [`Turn`]s.
//!
//! A turn is sent no earlier than its own offset [`Turn::at`] from the start of the run, and,
//! when it waits for an earlier turn of its session ([`Turn::after`]), no earlier than that
//! turn's finish plus [`Turn::think`]. A synthetic follow-up has `at` = its session's arrival
//! and a think time; a trace follow-up has its own (time-compressed) timestamp and no think
//! time. `after` is an index into the same session's turns, always a smaller one: Mooncake's
//! derived sessions are trees (two requests may extend the same parent), so a turn names the
//! turn it extends rather than assuming the one before it.
//!
//! Prompts are text made of whitespace-separated words, one word per token of the trace (the
//! simulated engine counts whitespace words as tokens). They are not stored: a [`Prompt`] holds
//! the ids it expands from and [`Workload::messages`] renders it when the request is sent, so a
//! Mooncake replay (inputs average 15,000 tokens) holds a few hundred kilobytes of ids, not tens
//! of megabytes of text. Expansion is deterministic: [`words`] turns a `(stream, index)` pair
//! into a word from a fixed vocabulary of common English words (so a real tokenizer also reads
//! about one token per word) by a SplitMix64 hash ([`crate::splitmix::mix`]). Equal ids give
//! equal text; text for a longer count of one stream extends the text for a shorter count.

use std::fmt::Write as _;
use std::time::Duration;

use super::synthetic::MultiTurn;
use crate::splitmix::mix;

/// Whether the client of session `index` streams when `unstreamed_percent` of the sessions ask
/// for whole responses (0: every session streams; 100: none does). Which sessions is fixed by a
/// hash of their index, so every router of a comparison, and the fleet lab
/// (`fleet::FleetSpec::unstreamed_percent`), meets the same mix.
pub fn session_streams(index: usize, unstreamed_percent: u8) -> bool {
    // A fixed salt, so the choice does not follow any other draw made from the index.
    mix(index as u64 ^ 0x5EED_F00D_5E55_1025) % 100 >= u64::from(unstreamed_percent)
}

/// Words per Mooncake block (the trace's block size in tokens).
pub const BLOCK_WORDS: u32 = 512;

/// A whole workload.
#[derive(Debug, Clone)]
pub struct Workload {
    /// What it is, e.g. `multiturn`, `mooncake`, `ragpulse`.
    pub name: String,
    /// The sessions, in order of their first turn's offset.
    pub sessions: Vec<Session>,
    /// The parameters of a synthetic workload (its prompts are rendered from them).
    pub synthetic: Option<MultiTurn>,
}

/// One conversation.
#[derive(Debug, Clone)]
pub struct Session {
    /// The value of the session header.
    pub id: String,
    /// The seed of this session's synthetic text (unused by traces).
    pub seed: u64,
    /// Its turns; a turn's `after` is always smaller than its own index.
    pub turns: Vec<Turn>,
}

/// One request.
#[derive(Debug, Clone)]
pub struct Turn {
    /// Earliest send time, from the start of the run.
    pub at: Duration,
    /// The turn of the same session this one waits for (None: a first turn).
    pub after: Option<u32>,
    /// Time to wait after `after` finished.
    pub think: Duration,
    /// `max_tokens` of the request.
    pub max_tokens: u32,
    /// What the prompt is made of.
    pub prompt: Prompt,
}

/// The source of a prompt's text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Prompt {
    /// Turn `turn` (0-based) of a synthetic session: system prompt, context, the user turns and
    /// answers so far, rendered from [`Workload::synthetic`] and the session's seed.
    Synthetic {
        /// Index of the turn in its session.
        turn: u32,
    },
    /// A Mooncake row: [`BLOCK_WORDS`] words per id, the last id `last_words` words; one user
    /// message.
    Blocks {
        /// Prefix-block hash ids.
        ids: Vec<u64>,
        /// Words of the last block (1..=512).
        last_words: u32,
    },
    /// A RAGPulse row: chunks `(id, words)`; the system prompt's chunks make the system message,
    /// the other components (in the trace's listed order) the user message.
    Chunks {
        /// Chunks of the system prompt.
        system: Vec<(u64, u32)>,
        /// Chunks of passages, history, web search and user input, in that order.
        user: Vec<(u64, u32)>,
    },
}

/// A chat message as sent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    /// `system`, `user` or `assistant`.
    pub role: &'static str,
    /// Whitespace-separated words.
    pub content: String,
}

/// Domain tags keep the streams of different kinds of text apart.
pub(crate) const TAG_BLOCK: u64 = 0x4d4f_4f4e_0000_0000;
pub(crate) const TAG_CHUNK: u64 = 0x5241_4750_0000_0000;
pub(crate) const TAG_SYSTEM: u64 = 0x5359_5354_0000_0000;
pub(crate) const TAG_CONTEXT: u64 = 0x4354_5854_0000_0000;
pub(crate) const TAG_USER: u64 = 0x5553_4552_0000_0000;
pub(crate) const TAG_ANSWER: u64 = 0x414e_5357_0000_0000;

/// The stream of `tag` and `id` (e.g. a block id, or a session seed and turn).
pub fn stream(tag: u64, id: u64) -> u64 {
    mix(tag ^ mix(id))
}

/// 128 common English words: most tokenizers read each (with its leading space) as one token.
const VOCAB: [&str; 128] = [
    "the", "of", "and", "to", "in", "is", "you", "that", "it", "he", "was", "for", "on", "are",
    "as", "with", "his", "they", "at", "be", "this", "have", "from", "or", "one", "had", "by",
    "word", "but", "not", "what", "all", "were", "we", "when", "your", "can", "said", "there",
    "use", "an", "each", "which", "she", "do", "how", "their", "if", "will", "up", "other",
    "about", "out", "many", "then", "them", "these", "so", "some", "her", "would", "make", "like",
    "him", "into", "time", "has", "look", "two", "more", "write", "go", "see", "number", "no",
    "way", "could", "people", "my", "than", "first", "water", "been", "call", "who", "oil", "its",
    "now", "find", "long", "down", "day", "did", "get", "come", "made", "may", "part", "over",
    "new", "sound", "take", "only", "little", "work", "know", "place", "year", "live", "me",
    "back", "give", "most", "very", "after", "thing", "our", "just", "name", "good", "sentence",
    "man", "think", "say", "great", "where", "help", "through",
];

/// Appends `count` words of `stream` to `out`, separated by single spaces (a space first when
/// `out` is not empty).
pub fn words(stream: u64, count: u32, out: &mut String) {
    for index in 0..count {
        if !out.is_empty() {
            out.push(' ');
        }
        let word = VOCAB
            [(mix(stream ^ u64::from(index).wrapping_mul(0xa076_1d64_78bd_642f)) >> 57) as usize];
        out.push_str(word);
    }
}

impl Workload {
    /// Number of turns (requests) in all sessions.
    pub fn requests(&self) -> usize {
        self.sessions.iter().map(|s| s.turns.len()).sum()
    }

    /// Number of turns that wait for another (follow-ups).
    pub fn follow_ups(&self) -> usize {
        self.sessions.iter().flat_map(|s| &s.turns).filter(|t| t.after.is_some()).count()
    }

    /// The words (the simulated engine's tokens) of the prompt text of turn `turn` of session
    /// `session`, without rendering it (roles and the generation prompt not counted).
    pub fn prompt_words(&self, session: usize, turn: usize) -> u64 {
        match &self.sessions[session].turns[turn].prompt {
            Prompt::Blocks { ids, last_words } => {
                (ids.len() as u64).saturating_sub(1) * u64::from(BLOCK_WORDS)
                    + u64::from(*last_words)
            }
            Prompt::Chunks { system, user } => {
                system.iter().chain(user).map(|&(_, n)| u64::from(n)).sum()
            }
            Prompt::Synthetic { .. } => self
                .messages(session, turn)
                .iter()
                .map(|m| m.content.split(' ').filter(|w| !w.is_empty()).count() as u64)
                .sum(),
        }
    }

    /// The chat messages of turn `turn` of session `session`.
    pub fn messages(&self, session: usize, turn: usize) -> Vec<Message> {
        let s = &self.sessions[session];
        match &s.turns[turn].prompt {
            Prompt::Synthetic { turn } => {
                let params = self.synthetic.as_ref().expect("a synthetic prompt needs parameters");
                params.messages(s.seed, *turn)
            }
            Prompt::Blocks { ids, last_words } => match s.turns[turn].after {
                Some(parent) => self.follow_up_messages(session, turn, parent as usize),
                None => {
                    let mut content = String::new();
                    for (i, id) in ids.iter().enumerate() {
                        let n = if i + 1 == ids.len() { *last_words } else { BLOCK_WORDS };
                        words(stream(TAG_BLOCK, *id), n, &mut content);
                    }
                    vec![Message { role: "user", content }]
                }
            },
            Prompt::Chunks { system, user } => {
                let render = |chunks: &[(u64, u32)]| {
                    let mut content = String::new();
                    for (id, n) in chunks {
                        words(stream(TAG_CHUNK, *id), *n, &mut content);
                    }
                    content
                };
                let mut out = Vec::with_capacity(2);
                if !system.is_empty() {
                    out.push(Message { role: "system", content: render(system) });
                }
                out.push(Message { role: "user", content: render(user) });
                out
            }
        }
    }

    /// A Mooncake follow-up as a chat client sends it: its parent turn's messages as they were
    /// sent, then one user message with the rest of its words (its blocks from the parent's
    /// last, partial one on), so that its text extends the parent's whole text as a next turn
    /// does, and its word count is still the trace's `input_length`.
    fn follow_up_messages(&self, session: usize, turn: usize, parent: usize) -> Vec<Message> {
        let mut out = self.messages(session, parent);
        let new_words = self
            .prompt_words(session, turn)
            .saturating_sub(self.prompt_words(session, parent))
            .max(1);
        let turns = &self.sessions[session].turns;
        let (Prompt::Blocks { ids, .. }, Prompt::Blocks { ids: parent_ids, .. }) =
            (&turns[turn].prompt, &turns[parent].prompt)
        else {
            unreachable!("a Mooncake turn's parent is a Mooncake turn");
        };
        let mut content = String::new();
        let mut left = new_words;
        for id in &ids[parent_ids.len().saturating_sub(1).min(ids.len() - 1)..] {
            let n = left.min(u64::from(BLOCK_WORDS)) as u32;
            words(stream(TAG_BLOCK, *id), n, &mut content);
            left -= u64::from(n);
            if left == 0 {
                break;
            }
        }
        out.push(Message { role: "user", content });
        out
    }

    /// The JSON body of a chat completion for turn `turn` of session `session`, streamed with
    /// usage in its last event (`stream`) or whole, appended to `out`.
    pub fn write_body(
        &self,
        session: usize,
        turn: usize,
        model: &str,
        (ignore_eos, stream): (bool, bool),
        out: &mut Vec<u8>,
    ) {
        let mut body = String::with_capacity(256);
        body.push_str("{\"model\":");
        body.push_str(&serde_json::to_string(model).expect("a string serialises"));
        body.push_str(",\"messages\":[");
        for (i, m) in self.messages(session, turn).iter().enumerate() {
            if i > 0 {
                body.push(',');
            }
            // Roles and words are plain ASCII letters: nothing to escape.
            let _ = write!(body, "{{\"role\":\"{}\",\"content\":\"{}\"}}", m.role, m.content);
        }
        let t = &self.sessions[session].turns[turn];
        let _ = write!(body, "],\"max_tokens\":{}", t.max_tokens);
        if stream {
            body.push_str(",\"stream\":true,\"stream_options\":{\"include_usage\":true}");
        }
        if ignore_eos {
            body.push_str(",\"ignore_eos\":true");
        }
        body.push('}');
        out.extend_from_slice(body.as_bytes());
    }

    /// Divides every turn's offset and think time by `factor` (a time compression).
    pub fn compress(&mut self, factor: f64) {
        for turn in self.sessions.iter_mut().flat_map(|s| &mut s.turns) {
            turn.at = Duration::from_secs_f64(turn.at.as_secs_f64() / factor);
            turn.think = Duration::from_secs_f64(turn.think.as_secs_f64() / factor);
        }
    }

    /// Keeps the turns that start within `duration` and the first `max_requests` of them in
    /// order of (offset, session, turn), dropping any turn whose `after` was dropped, and the
    /// sessions left empty. A turn's predecessor sorts before it, so a prefix keeps chains whole.
    pub fn truncate(&mut self, max_requests: Option<usize>, duration: Option<Duration>) {
        let mut order: Vec<(Duration, usize, usize)> = Vec::with_capacity(self.requests());
        for (s, session) in self.sessions.iter().enumerate() {
            for (t, turn) in session.turns.iter().enumerate() {
                if duration.is_none_or(|d| turn.at <= d) {
                    order.push((turn.at, s, t));
                }
            }
        }
        order.sort_unstable();
        order.truncate(max_requests.unwrap_or(usize::MAX));
        let mut keep: Vec<Vec<bool>> =
            self.sessions.iter().map(|s| vec![false; s.turns.len()]).collect();
        for &(_, s, t) in &order {
            keep[s][t] = true;
        }
        for (session, keep) in self.sessions.iter_mut().zip(&mut keep) {
            retain_turns(session, keep);
        }
        self.sessions.retain(|s| !s.turns.is_empty());
    }
}

/// Keeps the turns marked in `keep` whose predecessors are kept, renumbering `after`.
fn retain_turns(session: &mut Session, keep: &mut [bool]) {
    let mut new_index = vec![u32::MAX; keep.len()];
    let mut next = 0u32;
    for t in 0..keep.len() {
        if let Some(a) = session.turns[t].after {
            keep[t] &= keep[a as usize];
        }
        if keep[t] {
            new_index[t] = next;
            next += 1;
        }
    }
    let mut t = 0;
    session.turns.retain(|_| {
        t += 1;
        keep[t - 1]
    });
    for turn in &mut session.turns {
        turn.after = turn.after.map(|a| new_index[a as usize]);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn words_are_deterministic_and_extend() {
        let (mut a, mut b, mut c) = (String::new(), String::new(), String::new());
        words(stream(TAG_BLOCK, 7), 10, &mut a);
        words(stream(TAG_BLOCK, 7), 20, &mut b);
        words(stream(TAG_BLOCK, 8), 10, &mut c);
        assert_eq!(a.split(' ').count(), 10);
        assert!(b.starts_with(&a));
        assert_ne!(a, c);
    }

    fn turn(at: u64, after: Option<u32>) -> Turn {
        Turn {
            at: Duration::from_secs(at),
            after,
            think: Duration::ZERO,
            max_tokens: 1,
            prompt: Prompt::Blocks { ids: vec![1], last_words: 1 },
        }
    }

    #[test]
    fn truncate_keeps_chains_whole() {
        let mut w = Workload {
            name: "t".into(),
            synthetic: None,
            sessions: vec![
                Session { id: "a".into(), seed: 0, turns: vec![turn(0, None), turn(5, Some(0))] },
                Session { id: "b".into(), seed: 0, turns: vec![turn(1, None), turn(2, Some(0))] },
                Session { id: "c".into(), seed: 0, turns: vec![turn(9, None)] },
            ],
        };
        w.truncate(Some(3), None);
        assert_eq!(w.requests(), 3);
        assert_eq!(w.sessions[0].turns.len(), 1);
        assert_eq!(w.sessions[1].turns[1].after, Some(0));
        w.truncate(None, Some(Duration::from_secs(1)));
        assert_eq!(w.requests(), 2);
        assert_eq!(w.follow_ups(), 0);
    }
}
