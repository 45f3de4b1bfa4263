//! The timer wheel: the timers that do not fall due in the order they are armed.
//!
//! Two kinds of owner, each with its own wheel: a model's scheduler (grace windows of SPEC
//! S8, stale waiting gauges of S6, the end of S16's wait for a cheapest backend), and each
//! shard of the dataplane (its connections' timers: header, body and idle timeouts for
//! clients, connect and response-head timeouts and pool idleness for upstreams). Queue
//! deadlines (S9) are not here: they fall due in enqueue order, so the scheduler keeps them in
//! a list (`scheduler::queue`).
//!
//! A hierarchical timing wheel (G. Varghese and T. Lauck, "Hashed and Hierarchical Timing
//! Wheels", SOSP 1987), laid out as in the Linux kernel's timer wheel and tokio's timer driver.
//! Sans-IO: every time is a `u64` tick passed in, and nothing reads a clock.
//!
//! Time is counted in *units* of `resolution` ticks (a power of two, so a unit is a shift).
//! A timer with deadline `d` is due at `now` iff `ceil(d / r) <= floor(now / r)`: it never
//! fires before its deadline and at most one resolution after it. The wheel's time, `elapsed`,
//! is `floor(now / r)` of the last poll (or of the start).
//!
//! There are 11 levels of 64 slots; a slot of level `l` spans `64^l` units, so the levels cover
//! all 64 bits of a unit count and any deadline can be inserted. A timer whose deadline unit
//! `u` is after `elapsed` lives at the level of the highest 6-bit digit in which `u` and
//! `elapsed` differ, in the slot given by `u`'s digit there; a timer already due lives in a
//! separate *due* list. So every timer of a lower level is earlier than every timer of a higher
//! level, and within a level the slots are in time order. Each level has a `u64` occupancy
//! bitmap, so the next occupied slot is one `trailing_zeros` away and a poll with nothing due
//! costs a few loads, however far apart polls are. When a poll reaches a slot of a level above
//! 0, its timers fire if due, and otherwise cascade down to lower levels.
//!
//! Timers live in an arena allocated by [`TimerWheel::new`]: entries linked by `u32` indices
//! into one doubly linked list per slot, a free list, and a generation per entry that makes a
//! stale [`TimerKey`] harmless; cancel is O(1). Nothing allocates after `new` except the
//! caller's output `Vec` of [`TimerWheel::poll`] and an explicit [`TimerWheel::reserve`].
//!
//! [`TimerWheel::next_fire`] is exact. For a slot of level 0 all timers share one unit. For a
//! higher slot the list is kept sorted by deadline unit while timers arrive in order (appended
//! at the tail, or prepended at the head), the common case when a kind of timer is armed a
//! constant after an event (a grace window after a completion, a stale gauge after a scrape).
//! Then the earliest timer is the head; a list that received a timer out of order is marked
//! unsorted and scanned instead, until it empties.
//!
//! An entry takes 32 bytes for an 8-byte `T` (see the test `memory_per_timer`).

use std::mem::size_of;

/// Bits of a unit count per level.
const SLOT_BITS: u32 = 6;
/// Slots per level.
const SLOTS: usize = 1 << SLOT_BITS;
/// Levels: `ceil(64 / 6)`.
const LEVELS: usize = 11;
/// The list of timers already due; lists `0..DUE` are slot `list % 64` of level `list / 64`.
const DUE: usize = LEVELS * SLOTS;
/// All lists: the slots and the due list.
const LISTS: usize = DUE + 1;
/// Words of the per-list `sorted` bitset.
const SORTED_WORDS: usize = LISTS.div_ceil(64);
/// No entry: an empty list's head and tail, the end of the free list.
const NIL: u32 = u32::MAX;
/// A link with this bit set is not an entry index but `END | list`: the entry is the first
/// (in `prev`) or last (in `next`) of `list`.
const END: u32 = 1 << 31;
/// `prev` of an entry on the free list.
const FREE: u32 = u32::MAX;

/// A handle on one inserted timer, to cancel it or read its deadline.
///
/// Encoding: low 32 bits: entry index in the arena; high 32 bits: the entry's generation when
/// the timer was inserted. An entry's generation is bumped when its timer fires or is
/// cancelled, so an old key no longer matches (until the generation wraps after 2^32 reuses of
/// the same entry).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct TimerKey(u64);

impl TimerKey {
    fn new(index: u32, generation: u32) -> TimerKey {
        TimerKey(u64::from(generation) << 32 | u64::from(index))
    }

    fn index(self) -> u32 {
        self.0 as u32
    }

    fn generation(self) -> u32 {
        (self.0 >> 32) as u32
    }
}

/// One timer, or a free entry.
#[derive(Debug, Clone, Copy)]
struct Entry<T> {
    deadline: u64,
    value: T,
    /// Previous entry of the list, or `END | list` for the first, or [`FREE`].
    prev: u32,
    /// Next entry of the list, or `END | list` for the last; on the free list, the next free
    /// entry or [`NIL`].
    next: u32,
    generation: u32,
}

/// A slot's (or the due list's) first and last entries, [`NIL`] when empty.
#[derive(Debug, Clone, Copy)]
struct List {
    head: u32,
    tail: u32,
}

const EMPTY: List = List { head: NIL, tail: NIL };

/// A hierarchical timer wheel of at most `capacity` timers carrying a `T` each.
#[derive(Debug)]
pub struct TimerWheel<T> {
    /// The arena; its length is the high-water mark of timers, its capacity never changes.
    entries: Vec<Entry<T>>,
    /// First free entry below `entries.len()`, or [`NIL`].
    free_head: u32,
    /// `LISTS` lists, indexed as described at [`DUE`].
    lists: Vec<List>,
    /// Bit `s` of word `l`: slot `s` of level `l` is not empty.
    occupied: [u64; LEVELS],
    /// Bit `i % 64` of word `i / 64`: list `i` is sorted by deadline unit from head to tail.
    /// Set for every empty list.
    sorted: [u64; SORTED_WORDS],
    /// `log2(resolution)`.
    shift: u32,
    /// The wheel's time in units: `now >> shift`.
    elapsed: u64,
    /// The `now` of the last poll, or the start.
    now: u64,
    len: usize,
    capacity: usize,
}

impl<T: Copy + Ord> TimerWheel<T> {
    /// A wheel for at most `capacity` timers, all allocated here, with `resolution` ticks
    /// rounded up to a power of two (0 counts as 1), starting at tick `now`.
    ///
    /// Panics if `capacity` is 2^31 or more, or `resolution` is above 2^63.
    pub fn new(capacity: usize, resolution: u64, now: u64) -> Self {
        assert!(capacity < END as usize, "timer wheel capacity {capacity} is 2^31 or more");
        let resolution = resolution
            .max(1)
            .checked_next_power_of_two()
            .unwrap_or_else(|| panic!("timer wheel resolution {resolution} is above 2^63"));
        let shift = resolution.trailing_zeros();
        TimerWheel {
            entries: Vec::with_capacity(capacity),
            free_head: NIL,
            lists: vec![EMPTY; LISTS],
            occupied: [0; LEVELS],
            sorted: [u64::MAX; SORTED_WORDS],
            shift,
            elapsed: now >> shift,
            now,
            len: 0,
            capacity,
        }
    }

    /// Raises the capacity to `capacity` timers (never lowers it), allocating now: for a live
    /// reconfiguration, off the request path.
    pub fn reserve(&mut self, capacity: usize) {
        assert!(capacity < END as usize, "timer wheel capacity {capacity} is 2^31 or more");
        if capacity > self.capacity {
            self.entries.reserve_exact(capacity - self.entries.len());
            self.capacity = capacity;
        }
    }

    /// The resolution in ticks: the power of two actually used.
    pub fn resolution(&self) -> u64 {
        1 << self.shift
    }

    /// Adds a timer firing at `deadline` (per the rule in the module doc) with `value`.
    /// A deadline at or before the wheel's time fires at the next poll.
    ///
    /// Panics if the wheel already holds `capacity` timers.
    pub fn insert(&mut self, deadline: u64, value: T) -> TimerKey {
        assert!(self.len < self.capacity, "timer wheel full: {} timers", self.capacity);
        let index = match self.free_head {
            NIL => {
                let entry = Entry { deadline, value, prev: FREE, next: NIL, generation: 0 };
                self.entries.push(entry);
                self.entries.len() as u32 - 1
            }
            index => {
                let entry = &mut self.entries[index as usize];
                self.free_head = entry.next;
                entry.deadline = deadline;
                entry.value = value;
                index
            }
        };
        let unit = self.unit(deadline);
        self.push(index, self.list_for(unit), unit);
        self.len += 1;
        TimerKey::new(index, self.entries[index as usize].generation)
    }

    /// Removes the timer of `key` and returns its value; `None` if it already fired or was
    /// cancelled.
    pub fn cancel(&mut self, key: TimerKey) -> Option<T> {
        let index = self.live(key)?;
        self.unlink(index);
        let value = self.entries[index as usize].value;
        self.release(index);
        Some(value)
    }

    /// The deadline of the timer of `key`; `None` if it already fired or was cancelled.
    pub fn deadline(&self, key: TimerKey) -> Option<u64> {
        self.live(key).map(|index| self.entries[index as usize].deadline)
    }

    /// Advances the wheel to `now` and appends every timer due at `now` to `out`, as
    /// `(deadline, value)` sorted by deadline then value. Costs a few loads when nothing is due,
    /// however far `now` jumps. `now` must not decrease.
    pub fn poll(&mut self, now: u64, out: &mut Vec<(u64, T)>) {
        debug_assert!(now >= self.now, "timer wheel polled at {now}, before {}", self.now);
        self.now = self.now.max(now);
        let target = self.now >> self.shift;
        let first = out.len();
        if self.lists[DUE].head != NIL {
            self.expire(DUE, target, out);
        }
        while let Some((list, start)) = self.next_slot() {
            if start > target {
                break;
            }
            self.elapsed = start;
            self.expire(list, target, out);
        }
        self.elapsed = target;
        out[first..].sort_unstable();
    }

    /// The earliest tick at which [`poll`](Self::poll) would return a timer:
    /// `ceil(d / r) * r` for the earliest deadline `d` (saturating at `u64::MAX`); `None` when
    /// the wheel is empty. A value at or before the last `now` means "at the next poll".
    pub fn next_fire(&self) -> Option<u64> {
        let list = if self.lists[DUE].head != NIL {
            DUE
        } else {
            let level = self.occupied.iter().position(|&bits| bits != 0)?;
            level * SLOTS + self.occupied[level].trailing_zeros() as usize
        };
        Some(self.earliest_unit(list).saturating_mul(self.resolution()))
    }

    /// The number of timers.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no timer.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The bytes of the buffers allocated at construction: the arena and the list heads.
    pub fn heap_bytes(&self) -> usize {
        self.entries.capacity() * size_of::<Entry<T>>() + self.lists.capacity() * size_of::<List>()
    }

    /// Panics, saying what is wrong, if the structure is inconsistent: broken links, a timer in
    /// the wrong slot, an occupancy or sorted bit that lies, a count that does not add up.
    pub fn check_invariants(&self) {
        assert!(self.len <= self.capacity, "timer wheel holds {} > capacity", self.len);
        assert!(self.entries.len() <= self.capacity, "timer wheel arena over capacity");
        assert!(self.entries.capacity() >= self.capacity, "timer wheel arena shrank");
        assert_eq!(self.lists.len(), LISTS, "timer wheel list count");
        assert_eq!(self.elapsed, self.now >> self.shift, "timer wheel time is off its now");
        let mut timers = 0;
        for list in 0..LISTS {
            timers += self.check_list(list);
        }
        assert_eq!(timers, self.len, "timer wheel lists hold {timers} timers, len {}", self.len);
        let mut free = 0;
        let mut index = self.free_head;
        while index != NIL {
            let entry = &self.entries[index as usize];
            assert_eq!(entry.prev, FREE, "timer wheel free entry {index} is linked");
            free += 1;
            assert!(free <= self.entries.len(), "timer wheel free list has a cycle");
            index = entry.next;
        }
        assert_eq!(free + self.len, self.entries.len(), "timer wheel leaks entries");
    }

    /// Checks one list (links, placement, occupancy and sorted bits); returns its length.
    fn check_list(&self, list: usize) -> usize {
        let List { head, tail } = self.lists[list];
        let tag = END | list as u32;
        let occupied = list < DUE && self.occupied[list / SLOTS] & 1 << (list % SLOTS) != 0;
        assert_eq!(head == NIL, tail == NIL, "timer wheel list {list}: head {head}, tail {tail}");
        assert!(list == DUE || occupied == (head != NIL), "timer wheel list {list}: occupancy");
        let sorted = self.is_sorted(list);
        assert!(head != NIL || sorted, "timer wheel list {list}: empty but not marked sorted");
        let (mut count, mut prev, mut index, mut last_unit) = (0, tag, head, 0);
        while index & END == 0 {
            let entry = &self.entries[index as usize];
            let unit = self.unit(entry.deadline);
            assert_eq!(entry.prev, prev, "timer wheel list {list}: entry {index} back link");
            assert_eq!(
                self.list_for(unit),
                list,
                "timer wheel: deadline {} misplaced",
                entry.deadline
            );
            assert!(!sorted || unit >= last_unit, "timer wheel list {list} marked sorted is not");
            (count, prev, index, last_unit) = (count + 1, index, entry.next, unit);
            assert!(count <= self.entries.len(), "timer wheel list {list} has a cycle");
        }
        assert!(head == NIL || (index == tag && tail == prev), "timer wheel list {list}: tail");
        count
    }

    /// The live entry of `key`, if any.
    fn live(&self, key: TimerKey) -> Option<u32> {
        let entry = self.entries.get(key.index() as usize)?;
        (entry.generation == key.generation() && entry.prev != FREE).then_some(key.index())
    }

    /// `ceil(deadline / resolution)`.
    fn unit(&self, deadline: u64) -> u64 {
        let below = deadline & ((1 << self.shift) - 1);
        (deadline >> self.shift) + u64::from(below != 0)
    }

    /// The list where a timer due at `unit` belongs at the current `elapsed`.
    fn list_for(&self, unit: u64) -> usize {
        if unit <= self.elapsed {
            return DUE;
        }
        let level = (63 - (unit ^ self.elapsed).leading_zeros()) / SLOT_BITS;
        let slot = (unit >> (level * SLOT_BITS)) as usize % SLOTS;
        level as usize * SLOTS + slot
    }

    /// The earliest occupied slot (of the lowest occupied level) and its first unit.
    fn next_slot(&self) -> Option<(usize, u64)> {
        let level = self.occupied.iter().position(|&bits| bits != 0)?;
        let slot = u64::from(self.occupied[level].trailing_zeros());
        let width = level as u32 * SLOT_BITS;
        let above = width + SLOT_BITS;
        let prefix = if above >= 64 { 0 } else { self.elapsed >> above << above };
        Some((level * SLOTS + slot as usize, prefix | slot << width))
    }

    /// The smallest deadline unit in the non-empty `list`.
    fn earliest_unit(&self, list: usize) -> u64 {
        let mut index = self.lists[list].head;
        if self.is_sorted(list) {
            return self.unit(self.entries[index as usize].deadline);
        }
        let mut earliest = u64::MAX;
        while index & END == 0 {
            let entry = &self.entries[index as usize];
            earliest = earliest.min(self.unit(entry.deadline));
            index = entry.next;
        }
        earliest
    }

    /// Detaches all of `list` and, for each of its timers, appends it to `out` if its `unit`
    /// is at most `target`, or links it again at the current `elapsed` (a lower level).
    fn expire(&mut self, list: usize, target: u64, out: &mut Vec<(u64, T)>) {
        let mut index = self.lists[list].head;
        self.lists[list] = EMPTY;
        self.mark_empty(list);
        while index & END == 0 {
            let Entry { deadline, value, next, .. } = self.entries[index as usize];
            let unit = self.unit(deadline);
            if unit <= target {
                out.push((deadline, value));
                self.release(index);
            } else {
                self.push(index, self.list_for(unit), unit);
            }
            index = next;
        }
    }

    /// Links entry `index`, due at `unit`, into `list`: at the tail, or at the head if that
    /// keeps a sorted list sorted; otherwise at the tail, marking the list unsorted.
    fn push(&mut self, index: u32, list: usize, unit: u64) {
        let tag = END | list as u32;
        let List { head, tail } = self.lists[list];
        if head == NIL {
            self.set_links(index, tag, tag);
            self.lists[list] = List { head: index, tail: index };
            if list < DUE {
                self.occupied[list / SLOTS] |= 1 << (list % SLOTS);
            }
            return;
        }
        let sorted = self.is_sorted(list);
        if sorted && unit < self.unit(self.entries[tail as usize].deadline) {
            if unit <= self.unit(self.entries[head as usize].deadline) {
                self.set_links(index, tag, head);
                self.entries[head as usize].prev = index;
                self.lists[list].head = index;
                return;
            }
            self.sorted[list / 64] &= !(1 << (list % 64));
        }
        self.set_links(index, tail, tag);
        self.entries[tail as usize].next = index;
        self.lists[list].tail = index;
    }

    /// Unlinks the live entry `index` from its list.
    fn unlink(&mut self, index: u32) {
        let Entry { prev, next, .. } = self.entries[index as usize];
        if prev & END == 0 {
            self.entries[prev as usize].next = next;
        } else {
            self.lists[(prev & !END) as usize].head = if next & END == 0 { next } else { NIL };
        }
        if next & END == 0 {
            self.entries[next as usize].prev = prev;
        } else {
            self.lists[(next & !END) as usize].tail = if prev & END == 0 { prev } else { NIL };
        }
        if prev & END != 0 && next & END != 0 {
            self.mark_empty((prev & !END) as usize);
        }
    }

    /// Puts the unlinked entry `index` on the free list, making its keys stale.
    fn release(&mut self, index: u32) {
        let entry = &mut self.entries[index as usize];
        entry.generation = entry.generation.wrapping_add(1);
        entry.prev = FREE;
        entry.next = self.free_head;
        self.free_head = index;
        self.len -= 1;
    }

    fn set_links(&mut self, index: u32, prev: u32, next: u32) {
        let entry = &mut self.entries[index as usize];
        entry.prev = prev;
        entry.next = next;
    }

    /// Clears the occupancy bit of the now empty `list` and marks it sorted.
    fn mark_empty(&mut self, list: usize) {
        if list < DUE {
            self.occupied[list / SLOTS] &= !(1 << (list % SLOTS));
        }
        self.sorted[list / 64] |= 1 << (list % 64);
    }

    fn is_sorted(&self, list: usize) -> bool {
        self.sorted[list / 64] & 1 << (list % 64) != 0
    }
}

/// A naive restatement of the wheel's semantics: a `Vec` of every timer ever inserted, scanned
/// on each poll. The property tests compare the real wheel against it (the scheduler's
/// reference model restates the firing rule on its own deadlines instead). Its keys are its
/// own (indices never reused, generation 0).
#[cfg(any(test, fuzzing))]
pub mod reference {
    use super::TimerKey;

    /// The reference wheel.
    #[derive(Debug)]
    pub struct TimerWheel<T> {
        /// Timer `i` (key index `i`) as `(deadline, value)`, `None` once fired or cancelled.
        timers: Vec<Option<(u64, T)>>,
        live: usize,
        capacity: usize,
        resolution: u64,
        now: u64,
    }

    impl<T: Copy + Ord> TimerWheel<T> {
        /// Same as [`super::TimerWheel::new`].
        pub fn new(capacity: usize, resolution: u64, now: u64) -> Self {
            let resolution = resolution.max(1).checked_next_power_of_two().expect("resolution");
            TimerWheel { timers: Vec::new(), live: 0, capacity, resolution, now }
        }

        /// Same as [`super::TimerWheel::resolution`].
        pub fn resolution(&self) -> u64 {
            self.resolution
        }

        /// Same as [`super::TimerWheel::insert`].
        pub fn insert(&mut self, deadline: u64, value: T) -> TimerKey {
            assert!(self.live < self.capacity, "timer wheel full: {} timers", self.capacity);
            self.timers.push(Some((deadline, value)));
            self.live += 1;
            TimerKey::new(u32::try_from(self.timers.len() - 1).expect("key index"), 0)
        }

        /// Same as [`super::TimerWheel::cancel`].
        pub fn cancel(&mut self, key: TimerKey) -> Option<T> {
            if key.generation() != 0 {
                return None;
            }
            let (_, value) = self.timers.get_mut(key.index() as usize)?.take()?;
            self.live -= 1;
            Some(value)
        }

        /// Same as [`super::TimerWheel::deadline`].
        pub fn deadline(&self, key: TimerKey) -> Option<u64> {
            let timer = self.timers.get(key.index() as usize)?;
            timer.filter(|_| key.generation() == 0).map(|(deadline, _)| deadline)
        }

        /// Same as [`super::TimerWheel::poll`]: fires every timer with
        /// `ceil(d / r) <= floor(now / r)`.
        pub fn poll(&mut self, now: u64, out: &mut Vec<(u64, T)>) {
            self.now = self.now.max(now);
            let first = out.len();
            for timer in &mut self.timers {
                if let Some((deadline, value)) = *timer {
                    if deadline.div_ceil(self.resolution) <= self.now / self.resolution {
                        out.push((deadline, value));
                        *timer = None;
                        self.live -= 1;
                    }
                }
            }
            out[first..].sort_unstable();
        }

        /// Same as [`super::TimerWheel::next_fire`].
        pub fn next_fire(&self) -> Option<u64> {
            let earliest = self.timers.iter().flatten().map(|(d, _)| *d).min()?;
            Some(earliest.div_ceil(self.resolution).saturating_mul(self.resolution))
        }

        /// Same as [`super::TimerWheel::len`].
        pub fn len(&self) -> usize {
            self.live
        }

        /// Same as [`super::TimerWheel::is_empty`].
        pub fn is_empty(&self) -> bool {
            self.live == 0
        }

        /// Panics if the live count is wrong or over capacity.
        pub fn check_invariants(&self) {
            let live = self.timers.iter().flatten().count();
            assert_eq!(live, self.live, "reference wheel live count");
            assert!(live <= self.capacity, "reference wheel over capacity");
        }

        /// The bytes of the timer vector.
        pub fn heap_bytes(&self) -> usize {
            self.timers.capacity() * std::mem::size_of::<Option<(u64, T)>>()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn polled(wheel: &mut TimerWheel<u64>, now: u64) -> Vec<(u64, u64)> {
        let mut out = Vec::new();
        wheel.poll(now, &mut out);
        wheel.check_invariants();
        out
    }

    #[test]
    fn resolution_rounds_up_to_a_power_of_two() {
        let cases = [(0, 1), (1, 1), (3, 4), (1000, 1024), (1 << 20, 1 << 20), (1 << 63, 1 << 63)];
        for (asked, used) in cases {
            assert_eq!(TimerWheel::<u64>::new(1, asked, 0).resolution(), used, "asked {asked}");
        }
    }

    #[test]
    fn fires_at_the_first_resolution_boundary_at_or_after_the_deadline() {
        let mut w = TimerWheel::new(4, 1000, 0);
        w.insert(5000, 7);
        assert_eq!(w.next_fire(), Some(5120));
        assert_eq!(polled(&mut w, 5119), []);
        assert_eq!(polled(&mut w, 5120), [(5000, 7)]);
        assert!(w.is_empty());
        assert_eq!(w.next_fire(), None);
        // A deadline on a boundary fires exactly there.
        w.insert(6144, 8);
        assert_eq!(polled(&mut w, 6143), []);
        assert_eq!(polled(&mut w, 6144), [(6144, 8)]);
    }

    #[test]
    fn past_deadline_fires_at_the_next_poll() {
        let mut w = TimerWheel::new(4, 16, 10_000);
        w.insert(5, 1);
        w.insert(10_000, 2);
        assert_eq!(w.next_fire(), Some(16), "ceil(5 / 16) * 16, already past");
        assert_eq!(polled(&mut w, 10_000), [(5, 1), (10_000, 2)]);
    }

    #[test]
    fn cancel_once_then_the_key_is_stale_even_after_reuse() {
        let mut w = TimerWheel::new(2, 1, 0);
        let a = w.insert(100, 1);
        assert_eq!(w.deadline(a), Some(100));
        assert_eq!(w.cancel(a), Some(1));
        assert_eq!((w.cancel(a), w.deadline(a)), (None, None));
        let b = w.insert(200, 2);
        assert_eq!(a.index(), b.index(), "the entry is reused");
        assert_eq!((w.cancel(a), w.deadline(b)), (None, Some(200)));
        assert_eq!(polled(&mut w, 200), [(200, 2)]);
        assert_eq!(w.cancel(b), None);
        w.check_invariants();
    }

    #[test]
    fn cascades_through_every_level_in_one_jump_and_step_by_step() {
        let deadlines = [1, 63, 64, 4095, 4096, 1 << 20, 1 << 40, 1 << 62, u64::MAX - 1, u64::MAX];
        for stepwise in [false, true] {
            let mut w = TimerWheel::new(deadlines.len(), 1, 0);
            for (value, &d) in deadlines.iter().enumerate().rev() {
                w.insert(d, value as u64);
            }
            w.check_invariants();
            let mut fired = Vec::new();
            if stepwise {
                while let Some(at) = w.next_fire() {
                    let out = polled(&mut w, at);
                    assert!(!out.is_empty(), "next_fire {at} fired nothing");
                    fired.extend(out);
                }
            } else {
                fired = polled(&mut w, u64::MAX);
            }
            let expected: Vec<(u64, u64)> =
                deadlines.iter().enumerate().map(|(v, &d)| (d, v as u64)).collect();
            assert_eq!(fired, expected);
        }
    }

    #[test]
    fn output_is_sorted_by_deadline_then_value() {
        let mut w = TimerWheel::new(8, 64, 0);
        for (d, v) in [(300, 2), (10, 9), (300, 1), (299, 5), (10, 3), (10, 3)] {
            w.insert(d, v);
        }
        let out = polled(&mut w, 1000);
        assert_eq!(out, [(10, 3), (10, 3), (10, 9), (299, 5), (300, 1), (300, 2)]);
    }

    #[test]
    fn next_fire_is_exact_in_an_unsorted_high_slot() {
        let mut w = TimerWheel::new(4, 1, 0);
        for d in [5000, 8000, 6000, 4500] {
            w.insert(d, 0);
        }
        assert_eq!(w.list_for(4500), 2 * SLOTS + 1, "all in level 2, slot 1");
        assert!(!w.is_sorted(2 * SLOTS + 1), "6000 between 5000 and 8000 unsorts the slot");
        assert_eq!(w.next_fire(), Some(4500));
        w.check_invariants();
    }

    #[test]
    fn in_order_inserts_keep_a_high_slot_sorted() {
        let mut w = TimerWheel::new(1000, 1 << 20, 0);
        let second = 1_000_000_000;
        let keys: Vec<TimerKey> =
            (0..1000).map(|i| w.insert(30 * second + i * 1_000_000, i)).collect();
        let list = w.list_for(w.unit(30 * second));
        assert!(list >= SLOTS && w.is_sorted(list), "a high slot, sorted");
        for (i, key) in keys.iter().enumerate().take(999) {
            w.cancel(*key);
            assert_eq!(
                w.next_fire(),
                Some((30 * second + (i as u64 + 1) * 1_000_000).div_ceil(1 << 20) << 20)
            );
        }
        w.check_invariants();
    }

    #[test]
    fn next_fire_saturates() {
        let mut w = TimerWheel::new(1, 1 << 20, 0);
        w.insert(u64::MAX, 0);
        assert_eq!(w.next_fire(), Some(u64::MAX));
        assert_eq!(polled(&mut w, u64::MAX), []);
        assert_eq!(w.len(), 1);
    }

    #[test]
    #[should_panic(expected = "timer wheel full")]
    fn insert_beyond_capacity_panics() {
        let mut w = TimerWheel::new(1, 1, 0);
        w.insert(1, 0);
        w.insert(2, 0);
    }

    #[test]
    fn polls_far_apart_with_nothing_due_change_nothing() {
        let hour = 3_600_000_000_000;
        let mut w = TimerWheel::new(2, 1 << 20, 0);
        w.insert(100 * hour, 1);
        for h in 0..100 {
            assert_eq!(polled(&mut w, h * hour), []);
        }
        assert_eq!(polled(&mut w, 101 * hour), [(100 * hour, 1)]);
    }

    #[test]
    fn memory_per_timer() {
        assert!(size_of::<Entry<u64>>() <= 32, "entry of {} bytes", size_of::<Entry<u64>>());
        for capacity in [10_000, 1_000_000] {
            let w = TimerWheel::<u64>::new(capacity, 1 << 20, 0);
            let per = w.heap_bytes() as f64 / capacity as f64;
            println!(
                "wheel capacity {capacity}: {} heap bytes, {per:.2} bytes/timer",
                w.heap_bytes()
            );
        }
    }

    /// A deadline relative to the current `now`, in units of the resolution plus a remainder.
    #[derive(Debug, Clone)]
    enum When {
        After(u64, u64),
        Before(u64, u64),
        Absolute(u64),
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(When, u64),
        Cancel(usize),
        Poll(When),
        NextFire,
    }

    fn ahead(units_max: u64) -> impl Strategy<Value = When> {
        (0..units_max, any::<u64>()).prop_map(|(units, rest)| When::After(units, rest))
    }

    fn deadline() -> impl Strategy<Value = When> {
        prop_oneof![
            4 => ahead(200),
            3 => ahead(300_000),
            2 => ahead(1 << 24),
            1 => (0..300u64, any::<u64>()).prop_map(|(units, rest)| When::Before(units, rest)),
            1 => prop_oneof![Just(u64::MAX), Just(u64::MAX - 1), any::<u64>()]
                .prop_map(When::Absolute),
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (deadline(), 0..8u64).prop_map(|(when, value)| Op::Insert(when, value)),
            3 => any::<usize>().prop_map(Op::Cancel),
            4 => prop_oneof![
                4 => ahead(4),
                3 => ahead(5_000),
                2 => ahead(1 << 26),
                1 => (0..1u64 << 50).prop_map(When::Absolute),
            ].prop_map(Op::Poll),
            1 => Just(Op::NextFire),
        ]
    }

    fn resolve(when: &When, now: u64, resolution: u64) -> u64 {
        let remainder = |rest: u64| rest % resolution;
        match *when {
            When::After(units, rest) => {
                now.saturating_add(units.saturating_mul(resolution)).saturating_add(remainder(rest))
            }
            When::Before(units, rest) => now.saturating_sub(units * resolution + remainder(rest)),
            When::Absolute(at) => at,
        }
    }

    fn start() -> impl Strategy<Value = u64> {
        prop_oneof![
            Just(0),
            0..1u64 << 40,
            any::<u64>(),
            (0..1u64 << 30).prop_map(|d| u64::MAX - d)
        ]
    }

    fn resolution() -> impl Strategy<Value = u64> {
        prop_oneof![Just(1), Just(3), Just(1000), Just((1 << 20) - 1), Just(1 << 20), Just(1 << 40)]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        /// Random inserts (near, far, past, extreme), cancels of live and stale keys, and polls
        /// at increasing times (small steps to huge jumps) against the reference: every return
        /// value, every key's deadline and both invariant checks after every step.
        #[test]
        fn matches_reference(
            capacity in 1usize..64,
            resolution in resolution(),
            start in start(),
            ops in prop::collection::vec(op(), 1..300),
        ) {
            let mut real = TimerWheel::new(capacity, resolution, start);
            let mut model = reference::TimerWheel::new(capacity, resolution, start);
            prop_assert_eq!(real.resolution(), model.resolution());
            let r = real.resolution();
            let (mut now, mut keys) = (start, Vec::<(TimerKey, TimerKey)>::new());
            let (mut out_real, mut out_model) = (Vec::new(), Vec::new());
            for op in ops {
                match op {
                    Op::Insert(when, value) if real.len() < capacity => {
                        let at = resolve(&when, now, r);
                        keys.push((real.insert(at, value), model.insert(at, value)));
                    }
                    Op::Insert(..) => {}
                    Op::Cancel(i) if !keys.is_empty() => {
                        let (k, m) = keys[i % keys.len()];
                        prop_assert_eq!(real.cancel(k), model.cancel(m));
                    }
                    Op::Cancel(_) => {}
                    Op::Poll(when) => {
                        now = resolve(&when, now, r).max(now);
                        real.poll(now, &mut out_real);
                        model.poll(now, &mut out_model);
                        prop_assert_eq!(&out_real, &out_model, "poll at {}", now);
                    }
                    Op::NextFire => {}
                }
                real.check_invariants();
                model.check_invariants();
                prop_assert_eq!(real.len(), model.len());
                prop_assert_eq!(real.is_empty(), model.is_empty());
                prop_assert_eq!(real.next_fire(), model.next_fire());
                for &(k, m) in &keys {
                    prop_assert_eq!(real.deadline(k), model.deadline(m));
                }
            }
        }
    }
}
