//! The request arena and the four lanes of a model's queue.
//!
//! Every request the scheduler knows, queued or admitted, lives in one preallocated arena
//! addressed by `u32` index, split in two arrays (structure of arrays): the 64-byte [`Entry`]
//! payloads, read when a request arrives, is admitted or ends, and the 20-byte [`Links`] that
//! the heap and the lists rewrite while requests move around them. Sifting the heap and
//! unlinking a neighbour then touch the dense link array, not a cold payload line per step.
//! Free slots form a singly linked free list through `Links::lane.next`. A request id finds its
//! slot through a `hashbrown::HashTable<u32>` that stores only the index (the id is read back
//! from the entry), so the index costs about 5 bytes per slot.
//!
//! Lanes (SPEC S3, S4, 2.8), each an intrusive list through `Links::lane`:
//! - `retry`: requests sent back after a retryable upstream failure, FIFO, served first; one
//!   for the whole model;
//! - per tenant (issue \[11\]; tenant 0 is "no tenant", the only one without `[[tenant]]`):
//!   - `forced`: boosted requests promoted by bounded overtaking, FIFO (promotion always takes
//!     the oldest boosted request, so appending keeps arrival order);
//!   - `boosted`: an [`IndexedHeap`] keyed by completion time (most recent first, ties by
//!     arrival), plus an arrival-ordered list of the same entries, whose head is the oldest
//!     boosted request in O(1) for the overtaking check;
//!   - `normal`: FIFO by arrival.
//!
//! A queued entry is in exactly one lane list, of its own tenant (`Entry::tenant`); a boosted
//! one is also in its tenant's heap. Tenant 0's lanes sit inline in the [`Queue`] (with no
//! tenants configured, the only ones, found without an indirection), the others' in a `Vec`.
//! Tenant 0's heap is preallocated for the whole arena; another tenant's starts
//! with [`TENANT_HEAP_START`] slots and grows to its high-water mark (doubling, so at most
//! log2(arena) allocations per tenant over a process's life, none in a steady state): a heap
//! per tenant sized for the arena would take `tenants × arena × 16` bytes.
//!
//! Queue deadlines (S9) are `enqueue tick + queue.timeout`, so they grow in enqueue order: a
//! FIFO of the queued entries in enqueue order (a second intrusive list, through
//! `Links::deadline`) is an exact timer queue for them, O(1) to arm, disarm and expire, with the
//! earliest deadline at its head.

use hashbrown::HashTable;

use super::heap::{HeapArena, IndexedHeap, NOT_IN_HEAP};
use super::Lane;
use crate::clock::Tick;
use crate::splitmix::mix;

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

/// Where a request's session came from, as far as the scheduler goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Identity {
    /// No session.
    None,
    /// An id the client sent (a header or a body field).
    Client,
    /// Derived (issue \[10\]): the prompt extends a completed turn of this session.
    Derived,
    /// A new derived session: no identity, a chat prompt no completed turn matched.
    Fresh,
}

/// One request's payload, queued or admitted. 64 bytes: one cache line.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Entry {
    pub id: u64,
    /// Session hash; meaningful only with an identity.
    pub session: u64,
    /// Arrival sequence number (S3 ties).
    pub seq: u64,
    /// Tick of arrival (queue wait is measured from it).
    pub arrived_at: Tick,
    /// Its tenant's boosted admissions counted when this request arrived (S4), modulo 2^32:
    /// S4 compares a wrapping difference, exact while fewer than 2^32 boosted admissions
    /// overtake one request (32 bits, so that the tenant fits in the entry's cache line).
    pub boost_mark: u32,
    /// Issue \[11\]: its tenant (0 = none).
    pub tenant: u16,
    /// Queue deadline while queued with one, else [`NO_DEADLINE`].
    pub deadline: Tick,
    /// Bytes of the request body: its prompt tokens are estimated from them at admission,
    /// at the model's learned tokens per byte (S6.3).
    pub prompt_bytes: u32,
    /// The admitted backend; for a request in the retry lane, the backend that failed.
    pub backend: u16,
    /// The backend of the session's last completed turn when the request arrived (S7).
    pub home: u16,
    pub place: Place,
    pub retries: u8,
    pub identity: Identity,
    pub streaming: bool,
    /// Admitted, streaming, and no response body byte yet: counted in the prefill backlog.
    pub prefill_pending: bool,
    /// S16: a placement scan passed it over to wait for its cheapest backend (counted once).
    pub placement_waited: bool,
    /// The request's turn depth in its session (issue \[10\]): 1 without a session or for a
    /// session the tracker does not hold, else the session's completed turns plus one
    /// (saturating).
    pub turn: u16,
}

const _: () = assert!(std::mem::size_of::<Entry>() == 64);

impl Entry {
    const FREE: Entry = Entry {
        id: 0,
        session: 0,
        seq: 0,
        arrived_at: 0,
        boost_mark: 0,
        tenant: 0,
        deadline: NO_DEADLINE,
        prompt_bytes: 0,
        backend: NO_BACKEND,
        home: NO_BACKEND,
        place: Place::Free,
        retries: 0,
        identity: Identity::None,
        streaming: false,
        prefill_pending: false,
        placement_waited: false,
        turn: 1,
    };

    /// A fresh entry whose session (`session`, meaningless without an identity) came from
    /// `identity`.
    pub fn with_identity(
        id: u64,
        session: u64,
        identity: Identity,
        seq: u64,
        arrived_at: Tick,
    ) -> Entry {
        Entry { id, session, identity, seq, arrived_at, ..Entry::FREE }
    }

    /// Whether the request belongs to a session.
    pub fn has_session(&self) -> bool {
        self.identity != Identity::None
    }

    /// Whether the request counts in `warmpath_sessions_active`: a session a client named or
    /// one derived from an earlier turn (a fresh derived session is a lone request so far).
    pub fn counts_as_session(&self) -> bool {
        matches!(self.identity, Identity::Client | Identity::Derived)
    }
}

/// A doubly linked list position: previous and next slot, [`NIL`] at the ends.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Link {
    prev: u32,
    next: u32,
}

impl Link {
    const NONE: Link = Link { prev: NIL, next: NIL };
}

/// The positions of one slot in the queue's intrusive structures.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Links {
    /// In its lane list (or, for a free slot, `next` in the free list).
    lane: Link,
    /// In the deadline list.
    deadline: Link,
    heap_position: u32,
}

impl Links {
    const NONE: Links =
        Links { lane: Link::NONE, deadline: Link::NONE, heap_position: NOT_IN_HEAP };
}

/// Which of a slot's two links a list runs through.
#[derive(Debug, Clone, Copy)]
enum Via {
    Lane,
    Deadline,
}

impl Links {
    fn via(&mut self, via: Via) -> &mut Link {
        match via {
            Via::Lane => &mut self.lane,
            Via::Deadline => &mut self.deadline,
        }
    }
}

/// The arena: payloads and links, as the heap sees it.
#[derive(Debug)]
struct Arena {
    entries: Vec<Entry>,
    links: Vec<Links>,
}

impl HeapArena for Arena {
    fn set_heap_position(&mut self, index: u32, position: u32) {
        self.links[index as usize].heap_position = position;
    }
    fn tie_before(&self, a: u32, b: u32) -> bool {
        self.entries[a as usize].seq < self.entries[b as usize].seq
    }
}

impl Arena {
    fn push_back(&mut self, list: &mut List, via: Via, index: u32) {
        *self.links[index as usize].via(via) = Link { prev: list.tail, next: NIL };
        if list.tail == NIL {
            list.head = index;
        } else {
            self.links[list.tail as usize].via(via).next = index;
        }
        list.tail = index;
        list.len += 1;
    }

    fn unlink(&mut self, list: &mut List, via: Via, index: u32) {
        let Link { prev, next } = *self.links[index as usize].via(via);
        if prev == NIL {
            list.head = next;
        } else {
            self.links[prev as usize].via(via).next = next;
        }
        if next == NIL {
            list.tail = prev;
        } else {
            self.links[next as usize].via(via).prev = prev;
        }
        *self.links[index as usize].via(via) = Link::NONE;
        list.len -= 1;
    }
}

/// An intrusive doubly linked list of slots.
#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
    len: u32,
}

impl List {
    const EMPTY: List = List { head: NIL, tail: NIL, len: 0 };
}

/// Slots a tenant's boosted heap starts with (tenant 0's has the whole arena).
pub(crate) const TENANT_HEAP_START: usize = 16;

/// One tenant's lanes: the forced, boosted (arrival order) and normal lists, indexed by
/// `Lane as usize - 1`, the boosted heap, and its queued requests (the three lists' lengths
/// summed, kept so that the tenant order's checks read one counter).
#[derive(Debug)]
struct Lanes {
    lists: [List; 3],
    queued: u32,
    boosted: IndexedHeap,
}

impl Lanes {
    fn with_heap(capacity: usize) -> Lanes {
        Lanes { lists: [List::EMPTY; 3], queued: 0, boosted: IndexedHeap::with_capacity(capacity) }
    }
}

/// The lanes of `tenant`: tenant 0's inline, the others' in a `Vec` from tenant 1 (with no
/// tenants configured, the only lanes are found without an indirection).
#[inline]
fn lanes_of<'a>(first: &'a mut Lanes, others: &'a mut [Lanes], tenant: u16) -> &'a mut Lanes {
    match tenant {
        0 => first,
        t => &mut others[usize::from(t) - 1],
    }
}

/// The arena, the id index and the lanes.
#[derive(Debug)]
pub(crate) struct Queue {
    arena: Arena,
    free_head: u32,
    ids: HashTable<u32>,
    /// The model's retry lane.
    retry: List,
    /// Tenant 0's lanes.
    first: Lanes,
    /// The lanes of tenants 1.. (tenant `t` at `t - 1`).
    others: Vec<Lanes>,
    /// Queued entries per lane, all tenants, indexed by `Lane as usize`.
    lens: [u32; 4],
    /// Queued entries with a deadline, in enqueue (= deadline) order.
    deadlines: List,
    live: u32,
    /// Live entries (queued or admitted) per session: `warmpath_sessions_active`.
    sessions: Sessions,
}

/// The sessions with at least one live entry, and how many each has (issue \[10\]): a slab of
/// `(session, live entries)` with one slot per arena slot (there cannot be more such sessions
/// than live entries) and a free list threaded through the `session` field of free slots, and
/// a hashbrown [`HashTable`] of slab indices hashed by session (4 bytes a bucket plus a control
/// byte). The table is sized for twice the slab, so that hashbrown clears the tombstones of
/// removals by rehashing in place and never reallocates (as the tracker's index). About 36
/// bytes per arena slot.
#[derive(Debug)]
struct Sessions {
    slab: Vec<(u64, u32)>,
    free_head: u32,
    index: HashTable<u32>,
    /// `index.allocation_size()` at construction: it must never change.
    index_bytes: usize,
}

impl Sessions {
    fn with_capacity(capacity: u32) -> Sessions {
        let next = |i: u32| if i + 1 < capacity { u64::from(i + 1) } else { u64::from(NIL) };
        let index = HashTable::with_capacity(2 * capacity as usize);
        Sessions {
            slab: (0..capacity).map(|i| (next(i), 0)).collect(),
            free_head: 0,
            index_bytes: index.allocation_size(),
            index,
        }
    }

    /// One more live entry of `session`.
    fn add(&mut self, session: u64) {
        let Sessions { slab, free_head, index, .. } = self;
        let hash = mix(session);
        if let Some(&i) = index.find(hash, |&i| slab[i as usize].0 == session) {
            slab[i as usize].1 += 1;
            return;
        }
        let i = *free_head;
        assert!(i != NIL, "more live sessions than arena slots");
        *free_head = slab[i as usize].0 as u32;
        slab[i as usize] = (session, 1);
        index.insert_unique(hash, i, |&j| mix(slab[j as usize].0));
    }

    /// One live entry of `session` fewer; the session leaves with its last.
    fn remove(&mut self, session: u64) {
        let Sessions { slab, free_head, index, .. } = self;
        let found = index.find_entry(mix(session), |&i| slab[i as usize].0 == session);
        let entry = found.unwrap_or_else(|_| panic!("session {session:#x} has no live entry"));
        let i = *entry.get();
        slab[i as usize].1 -= 1;
        if slab[i as usize].1 == 0 {
            entry.remove();
            slab[i as usize] = (u64::from(*free_head), 0);
            *free_head = i;
        }
    }

    /// Grows the slab to `capacity` slots (the arena's) and the index to twice that.
    fn grow(&mut self, capacity: u32) {
        let old = self.slab.len() as u32;
        if capacity <= old {
            return;
        }
        self.slab.resize(capacity as usize, (0, 0));
        for i in (old..capacity).rev() {
            self.slab[i as usize].0 = u64::from(self.free_head);
            self.free_head = i;
        }
        let Sessions { slab, index, .. } = self;
        let additional = 2 * capacity as usize - index.len();
        index.reserve(additional, |&j| mix(slab[j as usize].0));
        self.index_bytes = self.index.allocation_size();
    }

    fn heap_bytes(&self) -> usize {
        self.slab.capacity() * std::mem::size_of::<(u64, u32)>() + self.index.allocation_size()
    }

    /// Live entries by session, summed.
    fn live(&self) -> u32 {
        self.index.iter().map(|&i| self.slab[i as usize].1).sum()
    }
}

/// A request id's hash, SplitMix64's [`mix`]: request ids are often sequential, and hashbrown
/// takes the bucket from the low bits and the tag from the high ones.
fn hash_id(id: u64) -> u64 {
    mix(id)
}

impl Queue {
    /// A queue whose arena holds `capacity` requests, queued and admitted together.
    pub fn with_capacity(capacity: u32) -> Queue {
        assert!(capacity > 0 && capacity < NIL, "queue capacity {capacity} out of range");
        let mut links = vec![Links::NONE; capacity as usize];
        for (index, link) in links.iter_mut().enumerate() {
            link.lane.next = if index + 1 < capacity as usize { index as u32 + 1 } else { NIL };
        }
        Queue {
            arena: Arena { entries: vec![Entry::FREE; capacity as usize], links },
            free_head: 0,
            ids: HashTable::with_capacity(capacity as usize),
            retry: List::EMPTY,
            first: Lanes::with_heap(capacity as usize),
            others: Vec::new(),
            lens: [0; 4],
            deadlines: List::EMPTY,
            live: 0,
            sessions: Sessions::with_capacity(capacity),
        }
    }

    /// Bytes of every preallocated buffer.
    pub fn heap_bytes(&self) -> usize {
        self.arena.entries.capacity() * std::mem::size_of::<Entry>()
            + self.arena.links.capacity() * std::mem::size_of::<Links>()
            + self.ids.allocation_size()
            + self.first.boosted.heap_bytes()
            + self.others.iter().map(|t| t.boosted.heap_bytes()).sum::<usize>()
            + self.others.capacity() * std::mem::size_of::<Lanes>()
            + self.sessions.heap_bytes()
    }

    /// Room for tenants `0..count` (a reload; never shrinks).
    pub fn grow_tenants(&mut self, count: usize) {
        let start = TENANT_HEAP_START.min(self.capacity() as usize);
        while self.tenants() < count {
            self.others.push(Lanes::with_heap(start));
        }
    }

    /// Tenants the queue has lanes for.
    pub fn tenants(&self) -> usize {
        1 + self.others.len()
    }

    #[inline]
    fn lanes(&self, tenant: u16) -> &Lanes {
        match tenant {
            0 => &self.first,
            t => &self.others[usize::from(t) - 1],
        }
    }

    /// Sessions with a request queued or admitted.
    pub fn sessions_active(&self) -> u32 {
        self.sessions.index.len() as u32
    }

    /// Grows the arena (and the id index and heap with it) to `capacity` slots, the new ones
    /// free; never shrinks. For a live reconfiguration, off the request path.
    pub fn grow(&mut self, capacity: u32) {
        let old = self.capacity();
        if capacity <= old {
            return;
        }
        assert!(capacity < NIL, "queue capacity {capacity} out of range");
        self.arena.entries.resize(capacity as usize, Entry::FREE);
        self.arena.links.resize(capacity as usize, Links::NONE);
        for index in (old..capacity).rev() {
            self.arena.links[index as usize].lane.next = self.free_head;
            self.free_head = index;
        }
        let entries = &self.arena.entries;
        let additional = (capacity - self.live) as usize;
        self.ids.reserve(additional, |&i| hash_id(entries[i as usize].id));
        self.first.boosted.reserve_total(capacity as usize);
        self.sessions.grow(capacity);
    }

    /// Rewrites every armed deadline through `f`, which must not decrease the order of two
    /// deadlines (a uniform shift, saturating): the list stays sorted.
    pub fn map_deadlines(&mut self, f: impl Fn(Tick) -> Tick) {
        let mut index = self.deadlines.head;
        while index != NIL {
            let entry = &mut self.arena.entries[index as usize];
            entry.deadline = f(entry.deadline);
            index = self.arena.links[index as usize].deadline.next;
        }
    }

    /// Disarms every queue deadline.
    pub fn disarm_all_deadlines(&mut self) {
        while self.deadlines.head != NIL {
            self.disarm_deadline(self.deadlines.head);
        }
    }

    /// Arms `deadline` on every queued entry (none may have one).
    pub fn arm_all_deadlines(&mut self, deadline: Tick) {
        debug_assert_eq!(self.deadlines.len, 0, "deadlines armed already");
        for index in 0..self.capacity() {
            if matches!(self.get(index).place, Place::Queued(_)) {
                self.arm_deadline(index, deadline);
            }
        }
    }

    /// Arena capacity.
    pub fn capacity(&self) -> u32 {
        self.arena.entries.len() as u32
    }

    pub fn get(&self, index: u32) -> &Entry {
        &self.arena.entries[index as usize]
    }

    pub fn get_mut(&mut self, index: u32) -> &mut Entry {
        &mut self.arena.entries[index as usize]
    }

    /// The entry of request `id`, queued or admitted.
    pub fn find(&self, id: u64) -> Option<u32> {
        let entries = &self.arena.entries;
        self.ids.find(hash_id(id), |&index| entries[index as usize].id == id).copied()
    }

    /// Takes a free entry for `entry` and indexes its id. Panics when the arena is full: the
    /// owner sizes it for `max_queued` plus every admission slot.
    pub fn alloc(&mut self, entry: Entry) -> u32 {
        let tenant = entry.tenant;
        debug_assert!(usize::from(tenant) < self.tenants(), "tenant {tenant} has no lanes");
        let index = self.free_head;
        assert!(index != NIL, "request arena exhausted (capacity {})", self.capacity());
        self.free_head = self.arena.links[index as usize].lane.next;
        self.arena.links[index as usize] = Links::NONE;
        self.arena.entries[index as usize] = entry;
        let entries = &self.arena.entries;
        self.ids.insert_unique(hash_id(entry.id), index, |&i| hash_id(entries[i as usize].id));
        self.live += 1;
        if entry.counts_as_session() {
            self.sessions.add(entry.session);
        }
        index
    }

    /// Finds the entry of `id` and, if `keep` accepts it, drops `id` from the index in the same
    /// probe; the entry stays allocated until [`Queue::release`].
    pub fn unindex(&mut self, id: u64, keep: impl Fn(&Entry) -> bool) -> Option<u32> {
        let entries = &self.arena.entries;
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
        let place = self.get(index).place;
        debug_assert!(!matches!(place, Place::Queued(_)), "releasing a queued entry");
        let entry = self.arena.entries[index as usize];
        if entry.counts_as_session() {
            self.sessions.remove(entry.session);
        }
        self.arena.entries[index as usize] = Entry::FREE;
        self.arena.links[index as usize].lane.next = self.free_head;
        self.free_head = index;
        self.live -= 1;
    }

    /// Number of queued requests in `lane`, all tenants.
    #[inline]
    pub fn lane_len(&self, lane: Lane) -> u32 {
        self.lens[lane as usize]
    }

    /// Number of queued requests, all lanes.
    pub fn queued(&self) -> u32 {
        self.lens.iter().sum()
    }

    /// The tenant of entry `index`.
    #[inline]
    pub fn tenant_of(&self, index: u32) -> u16 {
        self.arena.entries[index as usize].tenant
    }

    /// Queued requests of `tenant` (the retry lane is nobody's).
    #[inline]
    pub fn tenant_queued(&self, tenant: u16) -> u32 {
        self.lanes(tenant).queued
    }

    /// Queued requests of `tenant` in `lane` (not `Retry`).
    #[inline]
    pub fn tenant_lane_len(&self, tenant: u16, lane: Lane) -> u32 {
        self.lanes(tenant).lists[lane as usize - 1].len
    }

    /// Head of a FIFO lane (`Retry`, `Forced`, `Normal`) or the top of the boosted heap, of
    /// `tenant` (the retry lane is the model's).
    #[inline]
    pub fn first(&self, lane: Lane, tenant: u16) -> Option<u32> {
        let head = match lane {
            Lane::Retry => self.retry.head,
            Lane::Boosted => return self.lanes(tenant).boosted.peek(),
            _ => self.lanes(tenant).lists[lane as usize - 1].head,
        };
        (head != NIL).then_some(head)
    }

    /// The request after `index` in its FIFO lane (`Retry`, `Forced`, `Normal`), or in the
    /// boosted lane's arrival order.
    pub fn next_in_lane(&self, index: u32) -> Option<u32> {
        let next = self.arena.links[index as usize].lane.next;
        (next != NIL).then_some(next)
    }

    /// Appends the first `k` boosted requests of `tenant` in admission order (S3) to `out`;
    /// `frontier` is scratch space.
    pub fn boosted_first_k(
        &self,
        tenant: u16,
        k: usize,
        frontier: &mut Vec<u32>,
        out: &mut Vec<u32>,
    ) {
        self.lanes(tenant).boosted.first_k(k, &self.arena, frontier, out);
    }

    /// The oldest boosted (not forced) request of `tenant`.
    #[inline]
    pub fn oldest_boosted(&self, tenant: u16) -> Option<u32> {
        let head = self.lanes(tenant).lists[Lane::Boosted as usize - 1].head;
        (head != NIL).then_some(head)
    }

    /// Queues `index` in `lane` of its tenant. `completed_at` orders the boosted heap (most
    /// recent completion first); it is ignored for other lanes.
    pub fn enqueue(&mut self, index: u32, lane: Lane, completed_at: Tick) {
        self.get_mut(index).place = Place::Queued(lane);
        let tenant = self.arena.entries[index as usize].tenant;
        self.lens[lane as usize] += 1;
        if lane == Lane::Retry {
            return self.arena.push_back(&mut self.retry, Via::Lane, index);
        }
        let lanes = lanes_of(&mut self.first, &mut self.others, tenant);
        if lane == Lane::Boosted {
            lanes.boosted.push(u64::MAX - completed_at, index, &mut self.arena);
        }
        lanes.queued += 1;
        self.arena.push_back(&mut lanes.lists[lane as usize - 1], Via::Lane, index);
    }

    /// Takes `index` out of its lane; it stays allocated.
    pub fn dequeue(&mut self, index: u32) -> Lane {
        let Place::Queued(lane) = self.get(index).place else {
            panic!("dequeue of entry {index} that is not queued");
        };
        let tenant = self.arena.entries[index as usize].tenant;
        self.lens[lane as usize] -= 1;
        self.get_mut(index).place = Place::Free;
        if lane == Lane::Retry {
            self.arena.unlink(&mut self.retry, Via::Lane, index);
            return lane;
        }
        let lanes = lanes_of(&mut self.first, &mut self.others, tenant);
        if lane == Lane::Boosted {
            let position = self.arena.links[index as usize].heap_position;
            lanes.boosted.remove(position, &mut self.arena);
        }
        lanes.queued -= 1;
        self.arena.unlink(&mut lanes.lists[lane as usize - 1], Via::Lane, index);
        lane
    }

    /// Arms the deadline of queued entry `index`; deadlines must not decrease across calls.
    pub fn arm_deadline(&mut self, index: u32, deadline: Tick) {
        let tail = self.deadlines.tail;
        debug_assert!(tail == NIL || self.get(tail).deadline <= deadline, "deadline out of order");
        self.arena.entries[index as usize].deadline = deadline;
        self.arena.push_back(&mut self.deadlines, Via::Deadline, index);
    }

    /// Disarms the deadline of `index`, if it has one.
    pub fn disarm_deadline(&mut self, index: u32) {
        if self.get(index).deadline != NO_DEADLINE {
            self.arena.unlink(&mut self.deadlines, Via::Deadline, index);
            self.arena.entries[index as usize].deadline = NO_DEADLINE;
        }
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

    /// Visits every admitted entry.
    pub fn for_each_admitted(&self, mut visit: impl FnMut(u32, &Entry)) {
        for (index, entry) in self.arena.entries.iter().enumerate() {
            if entry.place == Place::Admitted {
                visit(index as u32, entry);
            }
        }
    }

    /// Checks lists, heap, id index and free list against each other; panics on a violation.
    pub fn check_invariants(&self) {
        let Arena { entries, links } = &self.arena;
        let mut lens = [self.retry.len, 0, 0, 0];
        self.check_list(Lane::Retry, None, self.retry, Via::Lane);
        for (tenant, lanes) in (0u16..).zip(std::iter::once(&self.first).chain(&self.others)) {
            for lane in [Lane::Forced, Lane::Boosted, Lane::Normal] {
                let list = lanes.lists[lane as usize - 1];
                self.check_list(lane, Some(tenant), list, Via::Lane);
                lens[lane as usize] += list.len;
            }
            let queued: u32 = lanes.lists.iter().map(|list| list.len).sum();
            assert_eq!(lanes.queued, queued, "queued count of tenant {tenant}");
            let heap = &lanes.boosted;
            heap.check_invariants(&self.arena, |index| links[index as usize].heap_position);
            let boosted = lanes.lists[Lane::Boosted as usize - 1].len;
            assert_eq!(heap.len() as u32, boosted, "heap/list size of tenant {tenant}");
        }
        assert_eq!(lens, self.lens, "lane lengths");
        self.check_list(Lane::Normal, None, self.deadlines, Via::Deadline);
        let armed = entries.iter().filter(|entry| entry.deadline != NO_DEADLINE).count();
        assert_eq!(armed as u32, self.deadlines.len, "armed deadlines outside the list");
        let mut free = 0;
        let mut index = self.free_head;
        while index != NIL {
            assert_eq!(entries[index as usize].place, Place::Free, "free list holds a live entry");
            free += 1;
            index = links[index as usize].lane.next;
        }
        assert_eq!(free + self.live, self.capacity(), "free list + live != capacity");
        assert_eq!(self.ids.len() as u32, self.live, "id index size");
        let with_session =
            entries.iter().filter(|e| e.place != Place::Free && e.counts_as_session());
        let counted = self.sessions.live();
        assert_eq!(with_session.count() as u32, counted, "live entries by session");
        let sessions = &self.sessions;
        let empty = sessions.index.iter().any(|&i| sessions.slab[i as usize].1 == 0);
        assert!(!empty, "a session counted with no live entry");
        let bytes = sessions.index.allocation_size();
        assert_eq!(bytes, sessions.index_bytes, "session index reallocated");
        for (index, entry) in entries.iter().enumerate() {
            if entry.place != Place::Free {
                assert_eq!(self.find(entry.id), Some(index as u32), "id {} not indexed", entry.id);
            }
        }
    }

    /// Queued entries with a deadline.
    pub fn deadlines_armed(&self) -> u32 {
        self.deadlines.len
    }

    /// Checks one list's links, length and order: a lane list (`lane`, of `tenant` but for the
    /// retry lane) or the deadline list.
    fn check_list(&self, lane: Lane, tenant: Option<u16>, list: List, via: Via) {
        let Arena { entries, links } = &self.arena;
        let link = |index: u32| match via {
            Via::Lane => links[index as usize].lane,
            Via::Deadline => links[index as usize].deadline,
        };
        let (mut count, mut prev, mut index) = (0, NIL, list.head);
        while index != NIL {
            let entry = &entries[index as usize];
            assert_eq!(link(index).prev, prev, "broken {via:?} link at {index}");
            if let Via::Deadline = via {
                assert!(matches!(entry.place, Place::Queued(_)), "deadline of unqueued {index}");
                let earlier = prev == NIL || entries[prev as usize].deadline <= entry.deadline;
                assert!(earlier, "deadlines out of order at {index}");
            } else {
                assert_eq!(entry.place, Place::Queued(lane), "entry {index} in the wrong list");
                let owner = entry.tenant;
                assert!(tenant.is_none_or(|t| t == owner), "entry {index} in another's lane");
                let ordered =
                    lane == Lane::Retry || prev == NIL || entries[prev as usize].seq < entry.seq;
                assert!(ordered, "{lane:?} list out of order");
                let in_heap = links[index as usize].heap_position != NOT_IN_HEAP;
                assert_eq!(in_heap, lane == Lane::Boosted, "heap membership of entry {index}");
            }
            count += 1;
            prev = index;
            index = link(index).next;
        }
        assert_eq!(list.tail, prev, "{via:?} list tail");
        assert_eq!(list.len, count, "{via:?} list length");
    }
}
