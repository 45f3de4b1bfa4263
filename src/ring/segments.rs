//! An array that grows while other threads read it: the storage of the prompt pool's slots and
//! of its free list's links ([`super::prompt_pool`], [`super::free_list`]), which a live reload
//! may need more of while the shards use them.
//!
//! Elements never move. The first segment holds the `base` elements the array was built with;
//! segment `k ≥ 1` holds `base · 2^(k−1)` more, so after `k` added segments the array holds
//! `base · 2^k` and growth wastes at most half of what it allocates (the bucket layout of Dechev,
//! Pirkelbauer and Stroustrup's lock-free vector, "Lock-free dynamically resizable arrays",
//! OPODIS 2006, with a first bucket of any size). An added segment is built whole and then
//! published through a `OnceLock`, so a reader that was handed an index past the first segment
//! (by the free list, whose publishing swap happens after the growth) finds it built, without
//! `unsafe`.
//!
//! Cost on the read path: the first segment is a plain boxed slice, so an index below `base`
//! (every index until a reload grows the array) is one comparison more than a slice index.
//! Growth takes a mutex: only a reload grows, and two growers must not both add a segment.

use std::sync::{Mutex, OnceLock};

/// Added segments at most: with `base ≥ 1` they reach past any `u32` index.
const ADDED: usize = 32;

/// A segmented array (module doc).
#[derive(Debug)]
pub struct Segments<T> {
    first: Box<[T]>,
    added: [OnceLock<Box<[T]>>; ADDED],
    /// Segments added so far; held while adding one.
    grown: Mutex<usize>,
}

impl<T> Segments<T> {
    /// The array of `base` elements (at least 1) made by `make` from their indices.
    pub fn new(base: u32, make: impl FnMut(u32) -> T) -> Segments<T> {
        Segments {
            first: (0..base.max(1)).map(make).collect(),
            added: std::array::from_fn(|_| OnceLock::new()),
            grown: Mutex::new(0),
        }
    }

    /// The length of the first segment.
    fn base(&self) -> u64 {
        self.first.len() as u64
    }

    /// The element at `index`. Panics if the array does not reach it.
    #[inline]
    pub fn get(&self, index: u32) -> &T {
        if let Some(element) = self.first.get(index as usize) {
            return element;
        }
        let (segment, offset) = self.locate(index);
        let added = self.added[segment - 1].get().expect("an index handed out lies in a segment");
        &added[offset]
    }

    /// The segment (0 is the first) and the offset in it of `index`.
    fn locate(&self, index: u32) -> (usize, usize) {
        let base = self.base();
        let index = u64::from(index);
        if index < base {
            return (0, index as usize);
        }
        // Segment k ≥ 1 starts at base · 2^(k−1): k − 1 is the floor of log₂(index / base).
        let segment = (u64::BITS - (index / base).leading_zeros()) as usize;
        (segment, (index - (base << (segment - 1))) as usize)
    }

    /// Elements held now (a growing thread may be adding more).
    pub fn held(&self) -> u64 {
        self.len_with(*self.grown.lock().unwrap_or_else(|e| e.into_inner()))
    }

    /// Elements held with `added` segments added.
    fn len_with(&self, added: usize) -> u64 {
        self.base() << added
    }

    /// Adds segments until the array holds at least `to` elements, made by `make` from their
    /// indices; returns the elements held (never fewer than before).
    pub fn grow(&self, to: u64, mut make: impl FnMut(u32) -> T) -> u64 {
        let mut grown = self.grown.lock().unwrap_or_else(|e| e.into_inner());
        while self.len_with(*grown) < to && *grown < ADDED {
            let start = self.len_with(*grown);
            let segment: Box<[T]> = (start..start * 2).map(|i| make(i as u32)).collect();
            // Only the holder of `grown` sets a segment, once: this cannot already be set.
            let _ = self.added[*grown].set(segment);
            *grown += 1;
        }
        self.len_with(*grown)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every index of a grown array finds the element made for it, across segment bounds and
    /// for bases that are and are not powers of two; growth rounds up to whole segments.
    #[test]
    fn indices_find_their_elements_across_segments() {
        for base in [1u32, 3, 4, 7] {
            let array = Segments::new(base, |i| i);
            assert_eq!(array.held(), u64::from(base));
            let held = array.grow(u64::from(base) * 5, |i| i);
            assert_eq!(held, u64::from(base) * 8, "base {base}: three segments added");
            for i in 0..held as u32 {
                assert_eq!(*array.get(i), i, "base {base}, index {i}");
            }
            assert_eq!(array.grow(2, |_| unreachable!("nothing to add")), held);
        }
        assert_eq!(Segments::new(0, |i| i).held(), 1, "at least one element");
    }

    #[test]
    #[should_panic(expected = "lies in a segment")]
    fn an_index_past_the_array_panics() {
        Segments::new(2, |i| i).get(2);
    }

    /// A reader on another thread, handed indices past the first segment through an atomic
    /// as they are added (as the free list hands them out), finds their elements built.
    #[test]
    fn a_segment_added_while_another_thread_reads_is_whole() {
        use std::sync::atomic::{AtomicU32, Ordering};
        let array = std::sync::Arc::new(Segments::new(2, |i| i));
        let published = std::sync::Arc::new(AtomicU32::new(2));
        let reader = {
            let (array, published) = (std::sync::Arc::clone(&array), published.clone());
            std::thread::spawn(move || loop {
                let held = published.load(Ordering::Acquire);
                assert_eq!(*array.get(held - 1), held - 1);
                if held == 1 << 12 {
                    return;
                }
            })
        };
        for to in 3..=1u64 << 12 {
            let held = array.grow(to, |i| i);
            published.store(held as u32, Ordering::Release);
        }
        reader.join().expect("reader");
    }
}
