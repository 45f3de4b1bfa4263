//! The request arena and the four lanes of a model's queue.
//!
//! Every request the scheduler knows, queued or admitted, lives in one preallocated arena of
//! [`Entry`] addressed by `u32` index; free entries form a singly linked free list through
//! `next`. A request id finds its entry through a `hashbrown::HashTable<u32>` that stores only
//! the index (the id is read back from the entry), so the index costs about 5 bytes per slot.
//!
//! Lanes (SPEC S3, S4, 2.8), each intrusive through the entries' `prev`/`next` links:
//! - `retry`: requests sent back after a retryable upstream failure, FIFO, served first;
//! - `forced`: boosted requests promoted by bounded overtaking, FIFO (promotion always takes the
//!   oldest boosted request, so appending keeps arrival order);
//! - `boosted`: an [`IndexedHeap`] keyed by completion time (most recent first, ties by
//!   arrival), plus an arrival-ordered list of the same entries, whose head is the oldest boosted
//!   request in O(1) for the overtaking check;
//! - `normal`: FIFO by arrival.
//!
//! A queued entry is in exactly one list; a boosted one is also in the heap.

use hashbrown::HashTable;

use super::heap::{HeapArena, IndexedHeap, NOT_IN_HEAP};
use super::Lane;
use crate::clock::Tick;

/// End of a list / no entry.
pub(crate) const NIL: u32 = u32::MAX;
/// No backend.
pub(crate) const NO_BACKEND: u16 = u16::MAX;
/// An entry without a queue deadline.
pub(crate) const NO_DEADLINE: Tick = Tick::MAX;

/// Where an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Place {
    Free,
    Queued(Lane),
    Admitted,
}

/// One request, queued or admitted. 72 bytes.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub id: u64,
    /// Session hash; meaningful only when `has_session`.
    pub session: u64,
    /// Arrival sequence number (S3 ties).
    pub seq: u64,
    /// Tick of arrival (queue wait is measured from it).
    pub arrived_at: Tick,
    /// Boosted admissions counted when this request arrived (S4).
    pub boost_mark: u64,
    /// Queue deadline while queued with one, else [`NO_DEADLINE`].
    pub deadline: Tick,
    pub prev: u32,
    pub next: u32,
    /// Links of the deadline list (enqueue order).
    pub deadline_prev: u32,
    pub deadline_next: u32,
    pub heap_position: u32,
    /// Estimated prompt tokens (body bytes / 4), for the prefill backlog (S6.3).
    pub prompt_tokens: u32,
    /// The admitted backend; for a request in the retry lane, the backend that failed.
    pub backend: u16,
    pub place: Place,
    pub retries: u8,
    pub has_session: bool,
    pub streaming: bool,
    /// Admitted, streaming, and no response body byte yet: counted in the prefill backlog.
    pub prefill_pending: bool,
}

impl Entry {
    const FREE: Entry = Entry {
        id: 0,
        session: 0,
        seq: 0,
        arrived_at: 0,
        boost_mark: 0,
        deadline: NO_DEADLINE,
        prev: NIL,
        next: NIL,
        deadline_prev: NIL,
        deadline_next: NIL,
        heap_position: NOT_IN_HEAP,
        prompt_tokens: 0,
        backend: NO_BACKEND,
        place: Place::Free,
        retries: 0,
        has_session: false,
        streaming: false,
        prefill_pending: false,
    };

    /// A fresh entry for an arriving request.
    pub fn new(id: u64, session: Option<u64>, seq: u64, arrived_at: Tick) -> Entry {
        Entry {
            id,
            session: session.unwrap_or(0),
            has_session: session.is_some(),
            seq,
            arrived_at,
            ..Entry::FREE
        }
    }
}

/// The arena, as the heap sees it.
#[derive(Debug)]
struct Entries(Vec<Entry>);

impl HeapArena for Entries {
    fn set_heap_position(&mut self, index: u32, position: u32) {
        self.0[index as usize].heap_position = position;
    }
    fn tie_before(&self, a: u32, b: u32) -> bool {
        self.0[a as usize].seq < self.0[b as usize].seq
    }
}

/// An intrusive doubly linked list of entries.
#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl List {
    const EMPTY: List = List { head: NIL, tail: NIL, len: 0 };
}

/// The arena, the id index and the lanes.
#[derive(Debug)]
pub(crate) struct Queue {
    entries: Entries,
    free_head: u32,
    ids: HashTable<u32>,
    /// One list per lane, indexed by `Lane as usize`; the boosted one is in arrival order.
    lists: [List; 4],
    /// Queued entries with a deadline, in enqueue (= deadline) order.
    deadlines: List,
    boosted: IndexedHeap,
    live: u32,
}

/// splitmix64's finaliser (Steele, Lea, Flood 2014): request ids are often sequential, and
/// hashbrown takes the bucket from the low bits and the tag from the high ones.
fn hash_id(id: u64) -> u64 {
    let mut z = id.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

impl Queue {
    /// A queue whose arena holds `capacity` requests, queued and admitted together.
    pub fn with_capacity(capacity: u32) -> Queue {
        assert!(capacity > 0 && capacity < NIL, "queue capacity {capacity} out of range");
        let mut entries = vec![Entry::FREE; capacity as usize];
        for (index, entry) in entries.iter_mut().enumerate() {
            entry.next = if index + 1 < capacity as usize { index as u32 + 1 } else { NIL };
        }
        Queue {
            entries: Entries(entries),
            free_head: 0,
            ids: HashTable::with_capacity(capacity as usize),
            lists: [List::EMPTY; 4],
            deadlines: List::EMPTY,
            boosted: IndexedHeap::with_capacity(capacity as usize),
            live: 0,
        }
    }

    /// Bytes of every preallocated buffer.
    pub fn heap_bytes(&self) -> usize {
        self.entries.0.capacity() * std::mem::size_of::<Entry>()
            + self.ids.allocation_size()
            + self.boosted.heap_bytes()
    }

    /// Arena capacity.
    pub fn capacity(&self) -> u32 {
        self.entries.0.len() as u32
    }

    pub fn get(&self, index: u32) -> &Entry {
        &self.entries.0[index as usize]
    }

    pub fn get_mut(&mut self, index: u32) -> &mut Entry {
        &mut self.entries.0[index as usize]
    }

    /// The entry of request `id`, queued or admitted.
    pub fn find(&self, id: u64) -> Option<u32> {
        let entries = &self.entries.0;
        self.ids.find(hash_id(id), |&index| entries[index as usize].id == id).copied()
    }

    /// Takes a free entry for `entry` and indexes its id. Panics when the arena is full: the
    /// owner sizes it for `max_queued` plus every admission slot.
    pub fn alloc(&mut self, entry: Entry) -> u32 {
        let index = self.free_head;
        assert!(index != NIL, "request arena exhausted (capacity {})", self.capacity());
        self.free_head = self.entries.0[index as usize].next;
        self.entries.0[index as usize] = entry;
        let entries = &self.entries.0;
        self.ids.insert_unique(hash_id(entry.id), index, |&i| hash_id(entries[i as usize].id));
        self.live += 1;
        index
    }

    /// Finds the entry of `id` and, if `keep` accepts it, drops `id` from the index in the same
    /// probe; the entry stays allocated until [`Queue::release`].
    pub fn unindex(&mut self, id: u64, keep: impl Fn(&Entry) -> bool) -> Option<u32> {
        let entries = &self.entries.0;
        let found = self.ids.find_entry(hash_id(id), |&i| entries[i as usize].id == id).ok()?;
        let index = *found.get();
        if !keep(&entries[index as usize]) {
            return None;
        }
        found.remove();
        Some(index)
    }

    /// Returns an entry that is in no lane to the free list, dropping its id from the index.
    pub fn free(&mut self, index: u32) {
        let id = self.get(index).id;
        let unindexed = self.unindex(id, |_| true);
        assert_eq!(unindexed, Some(index), "freeing entry {index} whose id {id} is not indexed");
        self.release(index);
    }

    /// Returns an entry already dropped from the index (by [`Queue::unindex`]) to the free list.
    pub fn release(&mut self, index: u32) {
        debug_assert!(
            !matches!(self.get(index).place, Place::Queued(_)),
            "releasing a queued entry"
        );
        let free_head = self.free_head;
        let entry = self.get_mut(index);
        *entry = Entry::FREE;
        entry.next = free_head;
        self.free_head = index;
        self.live -= 1;
    }

    /// Number of queued requests in `lane`.
    pub fn lane_len(&self, lane: Lane) -> u32 {
        self.lists[lane as usize].len
    }

    /// Number of queued requests, all lanes.
    pub fn queued(&self) -> u32 {
        self.lists.iter().map(|list| list.len).sum()
    }

    /// Head of a FIFO lane (`Retry`, `Forced`, `Normal`) or the top of the boosted heap.
    pub fn first(&self, lane: Lane) -> Option<u32> {
        if lane == Lane::Boosted {
            return self.boosted.peek();
        }
        let head = self.lists[lane as usize].head;
        (head != NIL).then_some(head)
    }

    /// The oldest boosted (not forced) request.
    pub fn oldest_boosted(&self) -> Option<u32> {
        let head = self.lists[Lane::Boosted as usize].head;
        (head != NIL).then_some(head)
    }

    /// Queues `index` in `lane`. `boost_key` orders the boosted heap (most recent completion
    /// first); it is ignored for other lanes.
    pub fn enqueue(&mut self, index: u32, lane: Lane, completed_at: Tick) {
        self.get_mut(index).place = Place::Queued(lane);
        if lane == Lane::Boosted {
            self.boosted.push(u64::MAX - completed_at, index, &mut self.entries);
        }
        Self::push_back(&mut self.entries.0, &mut self.lists[lane as usize], index);
    }

    /// Takes `index` out of its lane; it stays allocated.
    pub fn dequeue(&mut self, index: u32) -> Lane {
        let Place::Queued(lane) = self.get(index).place else {
            panic!("dequeue of entry {index} that is not queued");
        };
        if lane == Lane::Boosted {
            let position = self.get(index).heap_position;
            self.boosted.remove(position, &mut self.entries);
        }
        Self::unlink(&mut self.entries.0, &mut self.lists[lane as usize], index);
        self.get_mut(index).place = Place::Free;
        lane
    }

    /// Arms the deadline of queued entry `index`; deadlines must not decrease across calls.
    pub fn arm_deadline(&mut self, index: u32, deadline: Tick) {
        let tail = self.deadlines.tail;
        debug_assert!(tail == NIL || self.get(tail).deadline <= deadline, "deadline out of order");
        let entries = &mut self.entries.0;
        entries[index as usize].deadline = deadline;
        entries[index as usize].deadline_prev = tail;
        entries[index as usize].deadline_next = NIL;
        if tail == NIL {
            self.deadlines.head = index;
        } else {
            entries[tail as usize].deadline_next = index;
        }
        self.deadlines.tail = index;
        self.deadlines.len += 1;
    }

    /// Disarms the deadline of `index`, if it has one.
    pub fn disarm_deadline(&mut self, index: u32) {
        let entries = &mut self.entries.0;
        let Entry { deadline, deadline_prev: prev, deadline_next: next, .. } =
            entries[index as usize];
        if deadline == NO_DEADLINE {
            return;
        }
        if prev == NIL {
            self.deadlines.head = next;
        } else {
            entries[prev as usize].deadline_next = next;
        }
        if next == NIL {
            self.deadlines.tail = prev;
        } else {
            entries[next as usize].deadline_prev = prev;
        }
        let entry = &mut entries[index as usize];
        (entry.deadline, entry.deadline_prev, entry.deadline_next) = (NO_DEADLINE, NIL, NIL);
        self.deadlines.len -= 1;
    }

    /// The queued entry with the earliest deadline, and that deadline.
    pub fn earliest_deadline(&self) -> Option<(u32, Tick)> {
        let head = self.deadlines.head;
        (head != NIL).then(|| (head, self.get(head).deadline))
    }

    /// Moves a boosted request to the forced lane (S4).
    pub fn force(&mut self, index: u32) {
        let lane = self.dequeue(index);
        debug_assert_eq!(lane, Lane::Boosted);
        self.enqueue(index, Lane::Forced, 0);
    }

    fn push_back(entries: &mut [Entry], list: &mut List, index: u32) {
        entries[index as usize].prev = list.tail;
        entries[index as usize].next = NIL;
        if list.tail == NIL {
            list.head = index;
        } else {
            entries[list.tail as usize].next = index;
        }
        list.tail = index;
        list.len += 1;
    }

    fn unlink(entries: &mut [Entry], list: &mut List, index: u32) {
        let Entry { prev, next, .. } = entries[index as usize];
        if prev == NIL {
            list.head = next;
        } else {
            entries[prev as usize].next = next;
        }
        if next == NIL {
            list.tail = prev;
        } else {
            entries[next as usize].prev = prev;
        }
        entries[index as usize].prev = NIL;
        entries[index as usize].next = NIL;
        list.len -= 1;
    }

    /// Visits every admitted entry.
    pub fn for_each_admitted(&self, mut visit: impl FnMut(u32, &Entry)) {
        for (index, entry) in self.entries.0.iter().enumerate() {
            if entry.place == Place::Admitted {
                visit(index as u32, entry);
            }
        }
    }

    /// Checks lists, heap, id index and free list against each other; panics on a violation.
    pub fn check_invariants(&self) {
        let entries = &self.entries.0;
        for lane in Lane::ALL {
            self.check_list(lane, self.lists[lane as usize]);
        }
        self.boosted.check_invariants(&self.entries, |index| entries[index as usize].heap_position);
        assert_eq!(self.boosted.len() as u32, self.lane_len(Lane::Boosted), "heap/list size");
        self.check_deadlines();
        let mut free = 0;
        let mut index = self.free_head;
        while index != NIL {
            assert_eq!(entries[index as usize].place, Place::Free, "free list holds a live entry");
            free += 1;
            index = entries[index as usize].next;
        }
        assert_eq!(free + self.live, self.capacity(), "free list + live != capacity");
        assert_eq!(self.ids.len() as u32, self.live, "id index size");
        for (index, entry) in entries.iter().enumerate() {
            if entry.place != Place::Free {
                assert_eq!(self.find(entry.id), Some(index as u32), "id {} not indexed", entry.id);
            }
        }
    }

    fn check_deadlines(&self) {
        let entries = &self.entries.0;
        let (mut count, mut prev, mut index) = (0, NIL, self.deadlines.head);
        while index != NIL {
            let entry = &entries[index as usize];
            assert!(matches!(entry.place, Place::Queued(_)), "deadline of an unqueued entry");
            assert_eq!(entry.deadline_prev, prev, "broken deadline link at {index}");
            if prev != NIL {
                assert!(
                    entries[prev as usize].deadline <= entry.deadline,
                    "deadlines out of order"
                );
            }
            count += 1;
            prev = index;
            index = entry.deadline_next;
        }
        assert_eq!(self.deadlines.tail, prev, "deadline list tail");
        assert_eq!(self.deadlines.len, count, "deadline list length");
        let armed = entries.iter().filter(|entry| entry.deadline != NO_DEADLINE).count();
        assert_eq!(armed as u32, count, "armed deadlines outside the list");
    }

    /// Queued entries with a deadline.
    pub fn deadlines_armed(&self) -> u32 {
        self.deadlines.len
    }

    fn check_list(&self, lane: Lane, list: List) {
        let entries = &self.entries.0;
        let (mut count, mut prev, mut index) = (0, NIL, list.head);
        while index != NIL {
            let entry = &entries[index as usize];
            assert_eq!(entry.place, Place::Queued(lane), "entry {index} in the wrong list");
            assert_eq!(entry.prev, prev, "broken prev link at {index}");
            if lane != Lane::Retry && prev != NIL {
                assert!(entries[prev as usize].seq < entry.seq, "{lane:?} list out of order");
            }
            let in_heap = entry.heap_position != NOT_IN_HEAP;
            assert_eq!(in_heap, lane == Lane::Boosted, "heap membership of entry {index}");
            count += 1;
            prev = index;
            index = entry.next;
        }
        assert_eq!(list.tail, prev, "{lane:?} tail");
        assert_eq!(list.len, count, "{lane:?} length");
    }
}
