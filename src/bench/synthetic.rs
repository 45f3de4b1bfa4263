//! The synthetic `multiturn` workload (SPEC 8): sessions arriving as a Poisson process, each a
//! chat of a fixed number of turns.
//!
//! Turn k's prompt is: one system message (shared by every session: the same words for the
//! whole run), a user message made of the session's context followed by its first question,
//! then for each earlier turn its answer (assistant) and the next question (user). So turn k+1's
//! messages are turn k's messages plus two more: its prompt textually extends its
//! predecessor's, as a chat client's does, and an engine with a prefix cache can reuse it. The
//! answers sent back are placeholder words of the answer length, not the text the engine
//! generated: what a follow-up repeats of its predecessor's *prompt* is exact, and that is what
//! session scheduling acts on. Think times are exponential with the given mean (a memoryless
//! user), arrivals exponential gaps at `rate` (inverse-CDF sampling from a seeded SplitMix64
//! stream): the same seed gives the same workload.

use std::time::Duration;

use super::workload::{
    stream, words, Message, Prompt, Session, Turn, Workload, TAG_ANSWER, TAG_CONTEXT, TAG_SYSTEM,
    TAG_USER,
};
use crate::splitmix::{mix, SplitMix64, GAMMA};

/// Parameters of the synthetic multi-turn workload.
#[derive(Debug, Clone, PartialEq)]
pub struct MultiTurn {
    /// New sessions per second.
    pub rate: f64,
    /// How long sessions keep arriving.
    pub duration: Duration,
    /// Turns per session.
    pub turns: u32,
    /// Words of the system prompt shared by all sessions.
    pub system_words: u32,
    /// Words of context in a session's first turn (e.g. a pasted document).
    pub context_words: u32,
    /// Words of the user's message in each turn.
    pub new_words: u32,
    /// `max_tokens` of each turn, and the words of the answer repeated in later turns.
    pub answer_tokens: u32,
    /// Mean think time between a turn's finish and the next turn (exponential; zero: none).
    pub think_mean: Duration,
    /// Seed of arrivals, think times and text.
    pub seed: u64,
}

impl Default for MultiTurn {
    fn default() -> Self {
        MultiTurn {
            rate: 2.0,
            duration: Duration::from_secs(30),
            turns: 4,
            system_words: 512,
            context_words: 2000,
            new_words: 100,
            answer_tokens: 100,
            think_mean: Duration::from_secs(2),
            seed: 1,
        }
    }
}

/// A seeded uniform source: the [`SplitMix64`] sequence of `seed + GAMMA` (one step ahead of
/// `seed`'s, as it has always been: a seed keeps giving the same workload).
#[derive(Debug, Clone)]
pub(crate) struct Rng(SplitMix64);

impl Rng {
    pub(crate) fn new(seed: u64) -> Rng {
        Rng(SplitMix64::new(seed.wrapping_add(GAMMA)))
    }

    /// Uniform in (0, 1].
    pub(crate) fn unit(&mut self) -> f64 {
        let bits = self.0.next_u64() >> 11;
        (bits as f64 + 1.0) / (1u64 << 53) as f64
    }

    /// Exponential with mean `mean` seconds.
    pub(crate) fn exponential(&mut self, mean: f64) -> f64 {
        -mean * self.unit().ln()
    }
}

impl MultiTurn {
    /// The workload: sessions arriving over `duration`.
    pub fn workload(&self) -> Workload {
        assert!(self.rate > 0.0 && self.rate.is_finite(), "rate must be positive");
        assert!(self.turns > 0, "a session has at least one turn");
        let mut rng = Rng::new(self.seed);
        let mut sessions = Vec::new();
        let mut t = 0.0;
        loop {
            t += rng.exponential(1.0 / self.rate);
            let at = Duration::from_secs_f64(t);
            if at > self.duration {
                break;
            }
            let n = sessions.len() as u64;
            let turns = (0..self.turns)
                .map(|k| Turn {
                    at,
                    after: k.checked_sub(1),
                    think: if k == 0 {
                        Duration::ZERO
                    } else {
                        Duration::from_secs_f64(rng.exponential(self.think_mean.as_secs_f64()))
                    },
                    max_tokens: self.answer_tokens.max(1),
                    prompt: Prompt::Synthetic { turn: k },
                })
                .collect();
            sessions.push(Session {
                id: format!("mt-{}-{n}", self.seed),
                seed: mix(self.seed ^ mix(n)),
                turns,
            });
        }
        Workload { name: "multiturn".into(), sessions, synthetic: Some(self.clone()) }
    }

    /// The messages of turn `turn` of the session seeded `seed`.
    pub fn messages(&self, seed: u64, turn: u32) -> Vec<Message> {
        let mut out = Vec::with_capacity(2 + 2 * turn as usize);
        let mut system = String::new();
        words(stream(TAG_SYSTEM, self.seed), self.system_words, &mut system);
        out.push(Message { role: "system", content: system });
        let mut first = String::new();
        words(stream(TAG_CONTEXT, seed), self.context_words, &mut first);
        words(stream(TAG_USER, seed), self.new_words, &mut first);
        out.push(Message { role: "user", content: first });
        for k in 1..=u64::from(turn) {
            let mut answer = String::new();
            words(stream(TAG_ANSWER, seed ^ mix(k)), self.answer_tokens, &mut answer);
            out.push(Message { role: "assistant", content: answer });
            let mut user = String::new();
            words(stream(TAG_USER, seed ^ mix(k)), self.new_words, &mut user);
            out.push(Message { role: "user", content: user });
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn small() -> MultiTurn {
        MultiTurn {
            rate: 5.0,
            duration: Duration::from_secs(20),
            turns: 3,
            system_words: 8,
            context_words: 16,
            new_words: 4,
            answer_tokens: 5,
            think_mean: Duration::from_millis(500),
            seed: 42,
        }
    }

    #[test]
    fn deterministic_for_a_seed() {
        let (a, b) = (small().workload(), small().workload());
        assert_eq!(a.sessions.len(), b.sessions.len());
        for (x, y) in a.sessions.iter().zip(&b.sessions) {
            assert_eq!(x.id, y.id);
            let times = |s: &Session| s.turns.iter().map(|t| (t.at, t.think)).collect::<Vec<_>>();
            assert_eq!(times(x), times(y));
        }
        assert_eq!(a.messages(3, 2), b.messages(3, 2));
        let other = MultiTurn { seed: 43, ..small() }.workload();
        assert_ne!(other.sessions[0].turns[0].at, a.sessions[0].turns[0].at);
    }

    #[test]
    fn rate_and_think_times_have_their_means() {
        let w = MultiTurn { duration: Duration::from_secs(400), ..small() }.workload();
        let n = w.sessions.len() as f64;
        assert!((n / 400.0 - 5.0).abs() < 0.5, "{n} sessions in 400 s at 5/s");
        let thinks: Vec<f64> =
            w.sessions.iter().flat_map(|s| &s.turns[1..]).map(|t| t.think.as_secs_f64()).collect();
        let mean = thinks.iter().sum::<f64>() / thinks.len() as f64;
        assert!((mean - 0.5).abs() < 0.05, "mean think {mean}");
        assert!(w.sessions.iter().all(|s| s.turns.len() == 3 && s.turns[0].think.is_zero()));
    }

    #[test]
    fn a_follow_up_extends_its_predecessor() {
        let w = small().workload();
        let first = w.messages(1, 0);
        let second = w.messages(1, 1);
        assert_eq!(second.len(), first.len() + 2);
        assert_eq!(&second[..first.len()], &first[..]);
        assert_eq!(first[0], w.messages(0, 0)[0], "the system prompt is shared");
        assert_ne!(first[1], w.messages(0, 0)[1], "contexts differ between sessions");
        assert_eq!(first[1].content.split(' ').count(), 16 + 4);
        assert_eq!(second[2].content.split(' ').count(), 5);
        let mut body = Vec::new();
        w.write_body(1, 1, "m", (false, true), &mut body);
        let json: serde_json::Value = serde_json::from_slice(&body).expect("valid JSON");
        assert_eq!(json["messages"].as_array().map(Vec::len), Some(4));
        assert_eq!(json["stream"], true);
        assert_eq!(json["max_tokens"], 5);
        // `bench --no-stream`: the same request, answered whole.
        let mut whole = Vec::new();
        w.write_body(1, 1, "m", (true, false), &mut whole);
        let whole: serde_json::Value = serde_json::from_slice(&whole).expect("valid JSON");
        assert_eq!(whole["messages"], json["messages"]);
        assert!(whole.get("stream").is_none() && whole.get("stream_options").is_none());
        assert_eq!(whole["ignore_eos"], true);
    }
}
