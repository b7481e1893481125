//! Warp teams on slots: the slice path of `malloc`.
//!
//! Threads of a warp asking for the same class and slot form a team
//! (`match.any` over the active mask at the call); the leader makes one add on
//! the slot word and every member takes base + rank. The slot-word protocol
//! (who installs, who waits, how a displaced word is retired) is described in
//! [`crate::slot`]; this file carries it out, keeps each slot's spare blocks,
//! and empties slots on request.
//!
//! Concurrency: any number of warps at once. Slot words change only by the
//! team add (relaxed: it hands out indices, see `malloc_slice`), the
//! installer's CAS and a flush's CAS (acq_rel); spare words by the installer's
//! CAS from 0 and by swaps.

use crate::arch::{self, Word};
use crate::block;
use crate::class::SizeClass;
use crate::heap::BlockId;
use crate::layout::{Heap, NO_SPARES};
use crate::slot::{SLOTS_PER_CLASS, SPARES_PER_SLOT, SlotWord};

/// What [`Heap::reserve_if_open`] answers for a slot with nothing left (not
/// a valid slot word: its block field is all ones).
const CLOSED: u64 = u64::MAX;

impl Heap {
    /// The slice path: warp teams reserve slices from their slot's block.
    #[inline]
    pub(crate) fn malloc_slice(&self, class: SizeClass) -> Option<u64> {
        let home = arch::sm_id() % SLOTS_PER_CLASS;
        let mut slot = home;
        // After the home slot found the heap exhausted, visit every other
        // slot once for slices left in its block before giving up.
        let mut stealing = false;
        let mut round = 0;
        loop {
            let mask = arch::active_mask();
            let team = arch::match_any(mask, class.index() * SLOTS_PER_CLASS + slot);
            let lane = arch::lane_id();
            let leader = arch::lowest_lane(team);
            let rank = arch::rank_in(team, lane);
            let size = team.count_ones();
            let word = self.slot(class, slot);

            let mut seen = 0u64;
            if lane == leader {
                // Relaxed: the add only hands out indices. The slices' memory
                // was last written by threads that freed them with a release
                // add (see `block::count_freed_slices`), and every write this
                // thread makes to its slice has an address dependency on the
                // value returned here, so it cannot be performed before the
                // add. An acquire would invalidate this SM's L1 on every call.
                seen = if stealing {
                    self.reserve_if_open(word, size)
                } else {
                    arch::fetch_add_relaxed(word, size as u64)
                };
            }
            let seen = SlotWord(arch::shfl_u64(team, seen, leader));
            if seen.0 == CLOSED {
                slot = (slot + 1) % SLOTS_PER_CLASS;
                if slot == home {
                    return None;
                }
                continue;
            }
            let (first, cap) = (seen.reserved(), seen.capacity());
            let index = first + rank;
            // Whether this team installs is decided for the whole team before
            // any member leaves: the leader installs even when its own slice
            // came from the old block, since every member must reach the
            // shuffle.
            let installer = first <= cap && cap < first + size;
            let mut fresh = 0;
            if installer {
                if lane == leader {
                    fresh = self.install(class, slot, first + size - cap);
                }
                fresh = arch::shfl_u64(team, fresh, leader);
            }
            if index < cap {
                let block = BlockId::from_global(seen.block().unwrap_or(0));
                return Some(
                    self.block_address(class, block) + ((index as u64) << class.unit_shift()),
                );
            }
            if fresh != 0 {
                let block = BlockId::from_global(fresh - 1);
                let k = (index - cap) as u64;
                return Some(self.block_address(class, block) + (k << class.unit_shift()));
            }
            if installer {
                // Out of blocks: look for slices left in the other slots.
                stealing = true;
            }
            if stealing {
                slot = (slot + 1) % SLOTS_PER_CLASS;
                if slot == home {
                    return None;
                }
                continue;
            }
            // Past the end: wait until the installer replaces the word.
            while SlotWord(arch::load_relaxed(word)).version() == seen.version() {
                arch::backoff(round);
                round += 1;
            }
        }
    }

    /// In stealing mode, reserve only from a word that still has slices, so
    /// a thread that found the heap exhausted does not become an installer
    /// again. Returns [`CLOSED`] when the word has no slices left.
    #[inline]
    fn reserve_if_open(&self, word: &Word, size: u32) -> u64 {
        let current = SlotWord(arch::load_relaxed(word));
        if current.reserved() >= current.capacity() {
            return CLOSED;
        }
        // Relaxed, as in `malloc_slice`.
        arch::fetch_add_relaxed(word, size as u64)
    }

    /// Replaces the slot word with a fresh block (or with an empty word if
    /// none can be had), keeping `taken` slices of the fresh block for the
    /// installing team. Retires the displaced word. Returns the fresh block's
    /// global id + 1, or 0.
    #[inline(never)]
    fn install(&self, class: SizeClass, slot: u32, taken: u32) -> u64 {
        let word = self.slot(class, slot);
        // Own spare, else a claim, else (the heap has no block left) another
        // slot's spare.
        let fresh = self
            .pop_spare(class, slot)
            .or_else(|| self.claim_for_slot(class, slot))
            .or_else(|| (0..SLOTS_PER_CLASS).find_map(|s| self.pop_spare(class, s)))
            .map(BlockId::global);
        let reserved = if fresh.is_some() { taken } else { 0 };
        let mut current = arch::load_relaxed(word);
        let displaced = loop {
            // A new generation relative to the word replaced, so that threads
            // waiting on that version see the change.
            let generation = SlotWord(current).generation().wrapping_add(1);
            let next = SlotWord::new(fresh, reserved, generation);
            match arch::compare_exchange_acq_rel(word, current, next.0) {
                Ok(old) => break SlotWord(old),
                Err(actual) => current = actual,
            }
        };
        self.retire(class, displaced);
        fresh.map_or(0, |g| g + 1)
    }

    #[inline(always)]
    fn spare(&self, class: SizeClass, slot: u32, i: u32) -> &Word {
        &self.region(self.spare_index(class.index(), slot, i), 1)[0]
    }

    /// Takes one of the slot's spare blocks, if it has one.
    #[inline]
    fn pop_spare(&self, class: SizeClass, slot: u32) -> Option<BlockId> {
        for i in 0..SPARES_PER_SLOT {
            let w = self.spare(class, slot, i);
            // acq_rel swap: pairs with the pushing CAS, so the claim that
            // produced the block happens before this thread uses it.
            if arch::load_relaxed(w) != 0 {
                let g = arch::swap_acq_rel(w, 0);
                if g != 0 {
                    return Some(BlockId::from_global(g - 1));
                }
            }
        }
        None
    }

    /// Claims `1 + SPARES_PER_SLOT` blocks (fewer if the segment has fewer),
    /// returns the first and parks the others as the slot's spares.
    #[inline]
    fn claim_for_slot(&self, class: SizeClass, slot: u32) -> Option<BlockId> {
        let spares = if self.flags & NO_SPARES != 0 {
            0
        } else {
            SPARES_PER_SLOT
        };
        let claim = self.claim_blocks(class, 1 + spares);
        if claim.count() == 0 {
            return None;
        }
        let first = claim.take(self, class, 0);
        for i in 1..claim.count() {
            let b = claim.take(self, class, i);
            let parked = (0..SPARES_PER_SLOT).any(|k| {
                arch::compare_exchange_acq_rel(self.spare(class, slot, k), 0, b.global() + 1)
                    .is_ok()
            });
            if !parked {
                self.release_block(class, b);
            }
        }
        Some(first)
    }

    /// Accounts for the slices a replaced slot word never handed out.
    #[inline]
    fn retire(&self, class: SizeClass, displaced: SlotWord) {
        let Some(global) = displaced.block() else {
            return;
        };
        let unissued = displaced.unissued();
        if unissued > 0 && block::count_dead_slices(self.counter(global), unissued as u64) {
            self.release_block(class, BlockId::from_global(global));
        }
    }

    /// Empties every slot, returning the slices they hold to their blocks.
    /// Safe while other threads allocate; used when a large request fails
    /// and by the host before it checks that the heap is whole.
    pub fn flush_slots(&self) {
        for class in (0..crate::class::SLICE_CLASSES).filter_map(SizeClass::new) {
            for s in 0..SLOTS_PER_CLASS {
                self.flush_slot(class, s);
            }
        }
    }

    /// Empties one slot and its spares (see [`Heap::flush_slots`]).
    pub fn flush_slot(&self, class: SizeClass, slot: u32) {
        while let Some(b) = self.pop_spare(class, slot) {
            // A spare never handed out a slice: its counter is zero, and
            // recycling it is returning the block.
            self.release_block(class, b);
        }
        let word = self.slot(class, slot);
        let mut current = arch::load_relaxed(word);
        loop {
            let seen = SlotWord(current);
            if seen.block().is_none() {
                return;
            }
            let next = SlotWord::new(None, 0, seen.generation().wrapping_add(1));
            match arch::compare_exchange_acq_rel(word, current, next.0) {
                Ok(_) => break,
                Err(actual) => current = actual,
            }
        }
        self.retire(class, SlotWord(current));
    }
}
