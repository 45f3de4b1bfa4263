//! Model check of the prompt pool's free list (`src/ring/free_list.rs`, a Treiber stack of
//! slot numbers with a change count in its top word) under loom: every interleaving of a
//! thread popping against one that pops, pops again and pushes the first slot back (the ABA
//! pattern: a pop that read the top and the slot below it must not succeed once both were taken
//! and the top put back), of two threads that each pop and push, and of a thread growing the
//! list (a live reload) against one that pops and pushes.
//!
//! Run with `RUSTFLAGS="--cfg loom" cargo test --release --test loom_free_list` (`.ci/run`
//! does). Without `--cfg loom` this file is empty.
//!
//! The property: **no slot is handed out twice, and none is lost.** At the end, the slots the
//! threads still hold and the slots left on the list are exactly `0..SLOTS`, each once.
#![cfg(loom)]

use loom::sync::Arc;
use loom::thread;
use warmpath::ring::free_list::FreeList;

const SLOTS: u32 = 3;

/// The slots held at the end and the slots on the list are `0..SLOTS`, each once.
fn check(held: &[Option<u32>], list: &FreeList) {
    check_made(held, list, SLOTS);
}

/// The slots held at the end and the slots on the list are `0..made`, each once.
fn check_made(held: &[Option<u32>], list: &FreeList, made: u32) {
    let mut all: Vec<u32> = held.iter().flatten().copied().collect();
    all.extend(std::iter::from_fn(|| list.pop()));
    all.sort_unstable();
    assert_eq!(all, (0..made).collect::<Vec<_>>(), "held {held:?}");
}

/// Pops twice, pushes the first slot back, and returns the second (the ABA pattern).
fn pop_pop_push_back(list: &FreeList) -> Option<u32> {
    let first = list.pop();
    let second = list.pop();
    if let Some(slot) = first {
        list.push(slot);
    }
    second
}

#[test]
fn a_pop_against_pop_pop_push_back_hands_out_no_slot_twice() {
    loom::model(|| {
        let list = Arc::new(FreeList::full(SLOTS));
        let other = Arc::clone(&list);
        let thief = thread::spawn(move || pop_pop_push_back(&other));
        let mine = list.pop();
        let second = thief.join().expect("the other thread");
        assert!(mine.is_none() || mine != second, "slot {mine:?} handed out twice");
        check(&[mine, second], &list);
    });
}

#[test]
fn two_threads_popping_and_pushing_lose_no_slot() {
    loom::model(|| {
        let list = Arc::new(FreeList::full(SLOTS));
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let list = Arc::clone(&list);
                thread::spawn(move || {
                    let slot = list.pop().expect("a slot for each thread");
                    list.push(slot);
                    list.pop()
                })
            })
            .collect();
        let held: Vec<Option<u32>> =
            workers.into_iter().map(|w| w.join().expect("a worker")).collect();
        assert_ne!(held[0], held[1], "one slot held by both");
        check(&held, &list);
    });
}

/// A list of one slot grows to two while another thread pops twice and pushes its first slot
/// back: the new slot's link, written before the swap that publishes it, is what a pop reads.
#[test]
fn growth_against_pop_pop_push_hands_out_no_slot_twice() {
    loom::model(|| {
        let list = Arc::new(FreeList::full(1));
        let other = Arc::clone(&list);
        let worker = thread::spawn(move || pop_pop_push_back(&other));
        let made = list.grow(2);
        let mine = list.pop();
        let second = worker.join().expect("the other thread");
        assert!(mine.is_none() || mine != second, "slot {mine:?} handed out twice");
        check_made(&[mine, second], &list, made);
    });
}
