//! Runs of segments (requests above one segment): how a run is claimed
//! from the top of the segment tree, first without a lock, then under the
//! run lock if that fails.
//!
//! # Why a lock at all
//! A run is removed from the tree one leaf word at a time, so two run
//! claims that pick overlapping stretches each take part of one; the loser
//! gives its part back, but meanwhile every other search has seen those
//! segments taken and settled lower. Of 64 runs of 32-256 MiB started at
//! once on a heap 19% larger than their sum, 5 came back null on an H100 (and
//! 7-10 on the CPU, with 1.9 GiB in free segments after, in stretches no
//! search looked at again; `docs/device-heap-reclaim.md` section 6). Under
//! the run lock the only rivals of a search are class claims from the
//! bottom, so a search that finds no stretch means none is free.
//!
//! # Why not always the lock
//! Serialising every run claim made 256 threads asking 32 MiB each take
//! 3.3 ms on an H100, against 0.31 ms before the lock. So a claim first
//! tries the next stretch below the *run cursor* without the lock:
//! `fetch_add` on the cursor hands each claimer its own stretch, counted
//! down from the top of the heap, and one RMW per leaf word removes it. A
//! claimer whose stretch would pass segment 0 claims under the lock, which
//! moves the cursor back above the run it finds: the cursor never wraps,
//! because a burst of claims that outran the heap then got stretches out
//! of step with the pass before and left gaps of one or two segments
//! between runs (runs of 3 segments filled 95.5% of a 1 GiB heap on an
//! H100, where 99.6% fit). On a heap whose top is free (runs pack downward, classes
//! grow from the bottom) every such claim succeeds at once, in parallel.
//! A claim whose stretch is partly taken gives back what it took and
//! claims under the lock, which searches the whole tree as before.
//!
//! On a heap that grows (a VMM heap) only a prefix of the segments is
//! present, and the top of the heap is absent: a cursor counted from the
//! very top sent most claims of a burst to absent stretches and then to
//! the lock (256 threads asking 32 MiB on a 16 GiB reservation with 9 GiB
//! mapped: 0.95 ms on an H100, against 0.022 ms on a fixed heap). So the
//! initial image (`Heap::write_initial_metadata_with`) starts the cursor
//! at the top of the present segments; once a locked claim has run, the
//! cursor follows the runs it found anyway.
//!
//! # The guarantee, kept
//! A run claim returns `None` only from the locked claim, after a search
//! that no optimistic claim in flight could have misled: the lock word
//! counts optimistic claims in flight (bits 1..), a claim that finds the
//! lock held does not start, and a lock holder whose search finds nothing
//! waits until the count drops to zero and searches once more. Each
//! optimistic claim either keeps its stretch for good or has given back all
//! of it before its count is dropped (with a release that the holder's
//! acquire load reads), so that last search sees every segment that is
//! free and not claimed by a class meanwhile.
//!
//! # Lock word
//! Bit 0: held. Bits 1..64: optimistic claims in flight, in units of
//! `OPTIMIST`. Every change to it is one RMW, so its modification order
//! decides between a holder and a claim that starts: the claim's add comes
//! either before the holder's CAS (and the holder sees it counted) or after
//! it (and the claim sees the lock held).

use crate::arch;
use crate::layout::Heap;

/// The run lock's held bit.
const RUN_LOCKED: u64 = 1;
/// One optimistic claim in flight, counted in the lock word above the held
/// bit.
const OPTIMIST: u64 = 2;

/// Where a locked claim looks first.
#[derive(Clone, Copy)]
enum Search {
    /// Below the cursor's last stretch, then from the top (runs).
    BelowCursor,
    /// From the top (withdrawing the highest free segment).
    FromTop,
}

impl Heap {
    /// Claims a run of `count` free segments: optimistically at the run
    /// cursor, else under the run lock. `None` only when no run of `count`
    /// free segments was found under the lock with no optimistic claim in
    /// flight.
    #[inline(never)]
    pub(crate) fn claim_run(&self, count: u32) -> Option<u32> {
        self.claim_run_optimistic(count)
            .or_else(|| self.claim_run_locked(count))
    }

    /// The stretch below the run cursor, without the lock. `None` if the
    /// lock is held, if the stretch would pass segment 0, or if part
    /// of it is taken (what was taken is given back first).
    #[inline]
    fn claim_run_optimistic(&self, count: u32) -> Option<u32> {
        let lock = self.run_lock();
        // Relaxed: the add only counts this claim in flight. Whether a
        // holder waits for it is decided by this word's modification order
        // (see the module docs), not by ordering with other memory, and what
        // a holder must see of this claim is published by the release that
        // drops the count below.
        let seen = arch::fetch_add_relaxed(lock, OPTIMIST);
        if seen & RUN_LOCKED != 0 {
            // A holder is searching: step aside and queue on the lock.
            // Relaxed: this claim touched nothing a holder could see.
            arch::fetch_add_relaxed(lock, OPTIMIST.wrapping_neg());
            return None;
        }
        // Relaxed: the cursor is a hint that spreads claimers over
        // distinct stretches; the leaf RMWs below decide who owns what.
        let given = arch::fetch_add_relaxed(self.run_cursor(), count as u64);
        // No wrap past segment 0: a claimer handed a stretch beyond the
        // bottom goes to the lock. Wrapping gave claimers of a burst that
        // outran the heap stretches one or two segments off those of the
        // pass before, and winners of both left unusable gaps between runs.
        let head = (self.segments as u64)
            .checked_sub(given + count as u64)
            .map(|h| h as u32);
        let claimed = match head {
            Some(start) => self.segment_tree().try_remove_range(start, count),
            None => false,
        };
        if claimed {
            // Relaxed: the stretch is this claim's for good; a holder has
            // nothing of it to see.
            arch::fetch_add_relaxed(lock, OPTIMIST.wrapping_neg());
            head
        } else {
            // Release: a failed `try_remove_range` has given back every
            // segment it took (acq_rel inserts) before this; a holder whose
            // acquire load reads this count, or a later one, sees them
            // free again.
            arch::fetch_add_release(lock, OPTIMIST.wrapping_neg());
            None
        }
    }

    /// Claims the highest run of `count` free segments below the cursor's
    /// last stretch, else from the top, holding the run lock. A search
    /// that finds nothing is repeated once no optimistic claim is in
    /// flight, so a `None` means that no run of `count` free segments
    /// existed apart from those classes were claiming meanwhile.
    ///
    /// The search first looks below the start of the last run claimed (the
    /// cursor), because below it the next one most likely fits: searching
    /// from the top every time walked down past every run already taken
    /// (256 threads asking 32 MiB took 12 ms on an H100).
    #[inline]
    pub(crate) fn claim_run_locked(&self, count: u32) -> Option<u32> {
        self.claim_locked(count, Search::BelowCursor)
    }

    /// The highest free segment, claimed under the run lock as
    /// [`Heap::claim_run_locked`] claims, but searched from the top: what
    /// withdrawing a segment takes, so that a trim leaves the present
    /// segments a prefix (a grown heap's cursor may lie below its top).
    #[inline]
    pub(crate) fn claim_highest_locked(&self) -> Option<u32> {
        self.claim_locked(1, Search::FromTop)
    }

    /// The locked claim of `count` segments, searched as `search` says.
    #[inline(never)]
    fn claim_locked(&self, count: u32, search: Search) -> Option<u32> {
        let lock = self.run_lock();
        let mut round = 0;
        let mut seen = arch::load_relaxed(lock) & !RUN_LOCKED;
        loop {
            // Acquire: this holder's tree loads see every removal and
            // give-back the previous holder made (its release below), so it
            // never picks segments another locked claim already holds.
            // Optimistic claims keep changing the count bits: a CAS that
            // fails with the lock free retries at once with what it read.
            match arch::compare_exchange_acq_rel(lock, seen, seen | RUN_LOCKED) {
                Ok(_) => break,
                Err(actual) => {
                    if actual & RUN_LOCKED != 0 {
                        arch::backoff(round);
                        round += 1;
                    }
                    seen = actual & !RUN_LOCKED;
                }
            }
        }
        let tree = self.segment_tree();
        let cursor = self.run_cursor();
        // Relaxed: the cursor is a hint (see `claim_run_optimistic`).
        let given = arch::load_relaxed(cursor);
        let below = (self.segments as u64).saturating_sub(given) as u32;
        let mut head = match search {
            Search::BelowCursor => tree.claim_run_below(below, count),
            Search::FromTop => None,
        }
        .or_else(|| tree.claim_run_from_top(count));
        if head.is_none() {
            // Optimistic claims that started before this lock may hold
            // parts of stretches they are about to give back. New ones see
            // the lock and do not start, so the count drops to zero.
            // Acquire: pairs with each failed claim's release, so the
            // search below sees what it gave back.
            let mut round = 0;
            while arch::load_acquire(lock) & !RUN_LOCKED != 0 {
                arch::backoff(round);
                round += 1;
            }
            head = tree.claim_run_from_top(count);
        }
        if let Some(h) = head {
            // Relaxed: a hint. Optimistic claims continue below this run.
            arch::store_relaxed(cursor, (self.segments - h) as u64);
        }
        // Release: publishes this claim's removals to the next holder.
        // An RMW, not a store: optimistic claims change the count bits
        // while the lock is held. The held bit is set (this thread set
        // it), so adding -1 clears it and leaves the count.
        arch::fetch_add_release(lock, RUN_LOCKED.wrapping_neg());
        head
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    extern crate std;

    use std::vec::Vec;

    use crate::arch::{self, Word};
    use crate::class::MIN_SEGMENT_SHIFT;
    use crate::layout::Heap;

    fn heap(present: u32) -> (Heap, Vec<Word>) {
        crate::layout::test_support::test_heap(128, present)
    }

    #[test]
    fn optimistic_claims_start_at_the_top_of_the_present_segments() {
        let (h, _words) = heap(72);
        assert_eq!(h.claim_run_optimistic(4), Some(68));
        assert_eq!(h.claim_run_optimistic(4), Some(64));
        let (h, _words) = heap(128);
        assert_eq!(
            h.claim_run_optimistic(4),
            Some(124),
            "a whole heap as before"
        );
    }

    #[test]
    fn withdrawing_takes_the_highest_free_segment_whatever_the_cursor() {
        // Created with 4 present (the cursor at 4), then grown to 8.
        let (h, _words) = heap(4);
        for id in 4..8 {
            assert!(h.add_segment(id));
        }
        let taken: Vec<u32> = core::iter::from_fn(|| h.withdraw_free_segment()).collect();
        assert_eq!(taken, [7, 6, 5, 4, 3, 2, 1, 0]);
    }

    /// A run adopted over absent segments is a live run: `free` ends it
    /// and puts its segments in the tree. Segments in use or in the tree
    /// are refused.
    #[test]
    fn an_adopted_run_is_freed_into_the_tree() {
        let (h, _words) = heap(8);
        let seg = 1u64 << MIN_SEGMENT_SHIFT;
        assert!(!h.adopt_run(6, 4), "segments 6 and 7 are in the tree");
        assert!(!h.adopt_run(126, 4), "past the end");
        assert!(!h.adopt_run(20, 0), "empty");
        assert!(h.adopt_run(20, 4));
        assert!(!h.adopt_run(22, 2), "in use by the adopted run");
        assert_eq!(h.free_segments(), 8);
        h.free((h.data + 20 * seg) as *mut u8);
        assert_eq!(h.free_segments(), 12, "freed into the tree");
        assert!((20..24).all(|s| h.segment_tree().contains(s)));
        h.free((h.data + 20 * seg) as *mut u8);
        assert_eq!(h.free_segments(), 12, "a second free is refused");
    }

    /// Many threads claiming runs of 3 at once, each until it gets `None`,
    /// fill the heap as one thread would: every claim that fails leaves
    /// no stretch of 3 free. A cursor that wrapped past segment 0 while
    /// claims were in flight handed later claimers stretches one or two
    /// segments off the first pass's, and the winners of both left gaps
    /// of one or two segments between runs (runs of 3 segments reached
    /// 95.5% of a 1 GiB heap on an H100 where 99.6% fit).
    #[test]
    fn concurrent_runs_leave_no_gaps() {
        let threads = 8;
        for round in 0..300 {
            let (h, _words) = heap(128);
            let h = &h;
            let claimed: usize = std::thread::scope(|s| {
                let workers: Vec<_> = (0..threads)
                    .map(|_| s.spawn(move || core::iter::from_fn(|| h.claim_run(3)).count()))
                    .collect();
                workers.into_iter().map(|w| w.join().unwrap()).sum()
            });
            assert_eq!(claimed, 128 / 3, "round {round}: runs of 3 on 128 segments");
        }
    }

    /// A claimer whose stretch lies past segment 0 (a burst handed out more
    /// stretches than the heap holds) is sent to the lock instead of
    /// wrapping to a stretch out of step with the first pass's.
    #[test]
    fn a_stretch_past_the_bottom_does_not_wrap() {
        let (h, _words) = heap(128);
        // As if 43 stretches of 3 had been handed out and the claimer of
        // the 44th (given 129) came first.
        arch::store_relaxed(h.run_cursor(), 129);
        assert_eq!(h.claim_run_optimistic(3), None, "past the bottom");
        arch::store_relaxed(h.run_cursor(), 0);
        let claimed: Vec<u32> = core::iter::from_fn(|| h.claim_run(3)).collect();
        assert_eq!(claimed.len(), 128 / 3, "runs {claimed:?}");
    }
}
