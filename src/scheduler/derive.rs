//! Derived sessions (issue \[10\]): a request that carries no session identity, whose prompt
//! extends a prompt this model completed recently, continues that prompt's conversation.
//!
//! The shard hashes each chat prompt's *conversation ends* (`protocol::prompt`, "Conversation
//! ends"): at each of the last message boundaries past the system prompt, a hash of all the
//! text up to it. When a request completes, the end of its whole prompt is recorded here with
//! its session key; when a request without identity arrives, its earlier ends are looked up,
//! newest first. A client that resends a conversation with one or a few more messages finds the
//! previous turn where it ended; no prompt text is kept, and each lookup is one probe.
//!
//! What this does *not* merge: two conversations that share only a system prompt (no end lies
//! inside or at the end of the system prompt), nor two that share a first user message but
//! differ in its length (the end hash covers the partial block). What it does: a *branch*, two
//! requests that both extend one completed turn (a regenerated answer, an edited last message,
//! an agent that forks), joins the session of the turn it extends; each branch then carries the
//! session on, and the tracker sees one session with turns from both.
//!
//! The table is two-way set-associative: `2 × max_sessions` slots rounded up to a power of two,
//! in buckets of two (32 bytes, half a cache line), allocated once. An end goes to the front of
//! its bucket and the bucket's older end is evicted, so a bucket keeps its two newest ends and
//! the table keeps close to its capacity's newest ends, where a direct-mapped table keeps an
//! end through `n` later records with probability `e^(-n / slots)` only (61 % after
//! `max_sessions` records). A follow-up long after its previous turn may still start a new
//! session, which is what a cold conversation is anyway.

/// Where conversations ended: end hash to session key, one bucket probed per lookup.
#[derive(Debug)]
pub(crate) struct DerivedSessions {
    /// Buckets of two `(end hash, session key)` pairs, the newer first; an end hash of 0 marks
    /// an empty pair (0 is never recorded).
    buckets: Box<[[(u64, u64); 2]]>,
    mask: usize,
}

impl DerivedSessions {
    /// A table for about `sessions` conversations.
    pub fn with_capacity(sessions: usize) -> DerivedSessions {
        let slots = sessions.saturating_mul(2).next_power_of_two().max(64);
        let buckets = slots / 2;
        DerivedSessions {
            buckets: vec![[(0, 0); 2]; buckets].into_boxed_slice(),
            mask: buckets - 1,
        }
    }

    /// The session of the conversation that ended at `end`, if it is still held.
    pub fn find(&self, end: u64) -> Option<u64> {
        if end == 0 {
            return None;
        }
        let bucket = &self.buckets[end as usize & self.mask];
        bucket.iter().find(|&&(held, _)| held == end).map(|&(_, session)| session)
    }

    /// Records that the conversation of `session` ended at `end`: at the front of its bucket,
    /// evicting the bucket's older end unless `end` was the one held there.
    pub fn record(&mut self, end: u64, session: u64) {
        if end == 0 {
            return;
        }
        let bucket = &mut self.buckets[end as usize & self.mask];
        if bucket[0].0 != end {
            bucket[1] = bucket[0];
        }
        bucket[0] = (end, session);
    }

    /// The session key of a new conversation started by request `id`: its own, not its
    /// prompt's (two identical first prompts are two conversations, and a repeated one-off
    /// prompt is no follow-up of itself); apart from keys hashed from client-sent ids.
    pub fn new_session(id: u64) -> u64 {
        crate::splitmix::mix(id) ^ 0x6465_7269_7665_6421
    }

    pub fn heap_bytes(&self) -> usize {
        self.buckets.len() * std::mem::size_of::<[(u64, u64); 2]>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_was_recorded_and_keeps_each_buckets_two_newest() {
        let mut table = DerivedSessions::with_capacity(10);
        assert_eq!(table.buckets.len(), 32, "64 slots in buckets of two");
        assert_eq!(table.find(5), None);
        table.record(5, 50);
        assert_eq!(table.find(5), Some(50));
        assert_eq!(table.find(5 + 32), None, "same bucket, another end");
        table.record(5 + 32, 70);
        assert_eq!((table.find(5), table.find(5 + 32)), (Some(50), Some(70)), "two ways");
        table.record(5, 51);
        table.record(5 + 64, 90);
        // 5 was recorded again, so 5 + 32 is the older one and goes.
        assert_eq!(
            (table.find(5), table.find(5 + 32), table.find(5 + 64)),
            (Some(51), None, Some(90))
        );
        table.record(0, 1);
        assert_eq!(table.find(0), None, "0 is never an end");
        assert_ne!(DerivedSessions::new_session(5), DerivedSessions::new_session(6));
    }

    /// Against a direct-mapped table of the same size, the two-way table keeps more of the
    /// newest ends: after `max_sessions` records of random ends, about 97 % of the last
    /// `max_sessions / 2` are held (a direct-mapped table of as many slots loses about one in
    /// nine of them).
    #[test]
    fn keeps_the_newest_ends() {
        let mut table = DerivedSessions::with_capacity(4096);
        let mut rng = crate::splitmix::SplitMix64::new(7);
        let ends: Vec<u64> = (0..4096).map(|_| rng.next_u64().max(1)).collect();
        for (i, &end) in ends.iter().enumerate() {
            table.record(end, i as u64);
        }
        let held = ends[2048..].iter().filter(|&&end| table.find(end).is_some()).count();
        assert!(held * 100 >= 2048 * 95, "{held} of the newest 2048 held"); // 96.7 % expected
    }
}
