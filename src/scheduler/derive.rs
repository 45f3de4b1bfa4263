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
//! The table is direct-mapped, `2 × max_sessions` slots rounded up to a power of two, allocated
//! once: a newer end evicts an older one in its slot, so a follow-up long after its previous
//! turn may start a new session, which is what a cold conversation is anyway.

/// Where conversations ended: end hash to session key, one probe per lookup.
#[derive(Debug)]
pub(crate) struct DerivedSessions {
    /// `(end hash, session key)`; an end hash of 0 marks an empty slot (0 is never recorded).
    slots: Box<[(u64, u64)]>,
    mask: usize,
}

impl DerivedSessions {
    /// A table for about `sessions` conversations.
    pub fn with_capacity(sessions: usize) -> DerivedSessions {
        let slots = sessions.saturating_mul(2).next_power_of_two().max(64);
        DerivedSessions { slots: vec![(0, 0); slots].into_boxed_slice(), mask: slots - 1 }
    }

    /// The session of the conversation that ended at `end`, if it is still held.
    pub fn find(&self, end: u64) -> Option<u64> {
        let (held, session) = self.slots[end as usize & self.mask];
        (held == end && end != 0).then_some(session)
    }

    /// Records that the conversation of `session` ended at `end`.
    pub fn record(&mut self, end: u64, session: u64) {
        if end != 0 {
            self.slots[end as usize & self.mask] = (end, session);
        }
    }

    /// The session key of a new conversation started by request `id`: its own, not its
    /// prompt's (two identical first prompts are two conversations, and a repeated one-off
    /// prompt is no follow-up of itself); apart from keys hashed from client-sent ids.
    pub fn new_session(id: u64) -> u64 {
        crate::splitmix::mix(id) ^ 0x6465_7269_7665_6421
    }

    pub fn heap_bytes(&self) -> usize {
        self.slots.len() * std::mem::size_of::<(u64, u64)>()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_what_was_recorded_and_forgets_on_collision() {
        let mut table = DerivedSessions::with_capacity(10);
        assert_eq!(table.slots.len(), 64);
        assert_eq!(table.find(5), None);
        table.record(5, 50);
        assert_eq!(table.find(5), Some(50));
        assert_eq!(table.find(5 + 64), None, "same slot, another end");
        table.record(5 + 64, 70);
        assert_eq!((table.find(5), table.find(5 + 64)), (None, Some(70)));
        table.record(0, 1);
        assert_eq!(table.find(0), None, "0 is never an end");
        assert_ne!(DerivedSessions::new_session(5), DerivedSessions::new_session(6));
    }
}
