//! Blocks inside a segment: the free-block bitmap, the per-block free counter
//! of slice classes, and the optional per-slice double-free bits.
//!
//! # Invariants (owned here)
//! - Bit `b` of a segment's bitmap is set while block `b` is free. It is
//!   cleared only by a thread holding a reservation from the segment table,
//!   and set only by the thread returning the block.
//! - A slice block's counter counts slices that will never be handed out
//!   again: freed slices plus those a retired slot left unissued. It is never
//!   reset: each lifetime of the block adds exactly its slice count `S` (a
//!   power of two), and the thread whose add carries it across a multiple of
//!   `S` owns the block and returns it. A count can therefore never be erased by
//!   a reset racing a late add, and a stray add (an undetected bad free on an
//!   unchecked heap) only ends one lifetime early: no block is ever stuck
//!   with a count that can no longer reach the end.
//! - Checked heaps keep a two-bit state per slice (see
//!   [`CHECK_WORDS_PER_BLOCK`]): *never* handed out, *live*, or *freed* (and
//!   not handed out since). `malloc` makes it live; `free` turns live into
//!   freed, and only that transition counts the slice dead; a free finding
//!   freed is a double free, one finding never a pointer never handed out.
//!   Each transition is one CAS on the word holding the state, so of two
//!   racing frees of one slice exactly one is the free and the other is
//!   counted as a double free. Block-class segments keep the same states for
//!   their blocks in the check words of their first slice block. No state is
//!   ever left live when a segment comes back (every unit was freed), so a
//!   segment reformatted for another class finds only never and freed
//!   states: a stale one can only turn an "invalid" into a "double" count.

use crate::arch::{self, Word};
use crate::class::SLICES_PER_BLOCK;

/// Mask of a counter's position within the current lifetime of a block of
/// `per_block` slices.
#[inline(always)]
fn lifetime_mask(per_block: u32) -> u64 {
    per_block as u64 - 1
}

/// Words of misuse-check states per slice block on checked heaps: two bits
/// per slice (32 slices a word). A block-class segment (at most 64 blocks,
/// `class::max_blocks_per_segment`) keeps its blocks' states in those of
/// its first slice block.
pub const CHECK_WORDS_PER_BLOCK: u32 = (SLICES_PER_BLOCK / 32) as u32;

// States: 0 never handed out, LIVE, FREED.
const LIVE: u64 = 1;
const FREED: u64 = 2;
const STATE_MASK: u64 = 3;

/// The bitmap of one segment.
#[derive(Clone, Copy)]
pub struct BlockBitmap<'a> {
    words: &'a [Word],
}

impl<'a> BlockBitmap<'a> {
    /// A view of one segment's bitmap words.
    #[inline(always)]
    pub fn new(words: &'a [Word]) -> BlockBitmap<'a> {
        BlockBitmap { words }
    }

    #[inline(always)]
    fn word(&self, i: u32) -> &'a Word {
        // SAFETY: block ids are below the heap's `max_blocks_per_segment`,
        // so i is below its `bitmap_words_per_segment`, the slice's length.
        unsafe { self.words.get_unchecked(i as usize) }
    }

    /// Formats the bitmap for a class of `blocks` blocks per segment with
    /// blocks `0..taken` taken by the caller. Relaxed stores: the segment
    /// table's release store publishes them.
    #[inline]
    pub fn format(&self, blocks: u32, taken: u32) {
        for i in 0..blocks.div_ceil(64) {
            let low = i * 64;
            let n = (blocks - low).min(64);
            let mut bits = if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
            let gone = taken.saturating_sub(low).min(64);
            if gone == 64 {
                bits = 0;
            } else {
                bits &= u64::MAX << gone;
            }
            arch::store_relaxed(self.word(i), bits);
        }
    }

    /// Takes a free block of a class of `blocks` blocks per segment, scanning from word `start` (mod the word count)
    /// so that threads of one team spread over the bitmap. The caller holds
    /// a reservation, so a free block exists; a bit found set may be taken
    /// by another reserver first, so rescan.
    #[inline]
    pub fn take(&self, blocks: u32, start: u32) -> u32 {
        self.take_trying(blocks, start, 0)
    }

    /// [`BlockBitmap::take`] that first tries the bits `first` of word
    /// `start` with one RMW (no load first; `first` is one bit or none).
    /// Block classes pass the bit of their reservation's ticket plus their
    /// rank ([`crate::segment::Grab::Reserved`]): in a segment no block has
    /// come back to yet, that bit is free and no other reserver aims at it,
    /// so a burst's takers of one bitmap word do not all chase its lowest
    /// set bit one round trip after another. Clearing a bit that is clear
    /// already changes nothing, so a miss costs one RMW. One function for
    /// both (`first` 0 for slices): two inlined copies of the scan cost
    /// `heap_alloc` ten registers on sm_90.
    #[inline]
    pub fn take_trying(&self, blocks: u32, start: u32, first: u64) -> u32 {
        if first != 0 {
            // acq_rel as below: the bit's earlier owner gave it back with
            // a release, which this acquire pairs with.
            if arch::fetch_and_acq_rel(self.word(start), !first) & first != 0 {
                return start * 64 + first.trailing_zeros();
            }
        }
        let words = blocks.div_ceil(64);
        loop {
            for k in 0..words {
                let i = (start + k) % words;
                let w = self.word(i);
                let mut seen = arch::load_relaxed(w);
                while seen != 0 {
                    let bit = 1u64 << seen.trailing_zeros();
                    let old = arch::fetch_and_acq_rel(w, !bit);
                    if old & bit != 0 {
                        return i * 64 + bit.trailing_zeros();
                    }
                    seen = old & !bit;
                }
            }
            arch::backoff(0);
        }
    }

    /// Takes the free blocks among `bits` of word `word` with one RMW and
    /// returns which of them it took (a bit set in `bits` and in the word
    /// before). The caller holds a reservation for at least as many blocks
    /// as `bits` has, so it may take any of them; those it did not get are
    /// taken by [`BlockBitmap::take`] later. acq_rel as in `take_trying`.
    #[inline]
    pub fn take_bits(&self, word: u32, bits: u64) -> u64 {
        arch::fetch_and_acq_rel(self.word(word), !bits) & bits
    }

    /// Marks `block` free; returns false if it already was (a double free).
    /// Release: resets made before are visible to the next owner.
    #[inline]
    pub fn give_back(&self, block: u32) -> bool {
        let bit = 1u64 << (block & 63);
        arch::fetch_or_acq_rel(self.word(block >> 6), bit) & bit == 0
    }

    /// Marks blocks `first..first + count` free (they lie in one bitmap
    /// word: `first % 64 + count <= 64`) with one RMW; returns which of
    /// them were free already (a double free's), shifted so that bit 0 is
    /// `first`. Release, as `give_back`.
    #[inline]
    pub fn give_back_range(&self, first: u32, count: u32) -> u64 {
        debug_assert!(count >= 1 && (first & 63) + count <= 64);
        let bits = run_mask(first & 63, count);
        let old = arch::fetch_or_acq_rel(self.word(first >> 6), bits);
        (old & bits) >> (first & 63)
    }

    /// Word `i` of the bitmap as it is now (relaxed: a snapshot, a hint
    /// for where to take).
    #[inline(always)]
    pub fn snapshot(&self, i: u32) -> u64 {
        arch::load_relaxed(self.word(i))
    }

    /// Whether `block` is free (a snapshot).
    pub fn is_free(&self, block: u32) -> bool {
        arch::load_relaxed(self.word(block >> 6)) & 1u64 << (block & 63) != 0
    }
}

/// Bits `low..low + count` of a bitmap word (`1 <= count`,
/// `low + count <= 64`): a run of adjacent blocks.
#[inline(always)]
pub(crate) fn run_mask(low: u32, count: u32) -> u64 {
    (u64::MAX >> (64 - count)) << low
}

/// Adds `slices` unissued slices of a retired slot to a block counter;
/// true if this add completed the block.
#[inline(always)]
pub fn count_dead_slices(counter: &Word, slices: u64, per_block: u32) -> bool {
    // acq_rel: the completing thread must see every earlier free's writes to
    // the slices before it recycles the block (release by each adder,
    // acquire by the one that completes).
    let old = arch::fetch_add_acq_rel(counter, slices);
    completes(old, slices, per_block)
}

/// Whether adding `slices` (at most a block's worth) to a counter that held
/// `old` carries it across a multiple of `per_block`.
#[inline(always)]
fn completes(old: u64, slices: u64, per_block: u32) -> bool {
    (old & lifetime_mask(per_block)) + slices >= per_block as u64
}

/// Slices counted dead in the current lifetime of a block of `per_block`
/// slices whose counter holds `counter`.
#[inline(always)]
pub fn dead_in_lifetime(counter: u64, per_block: u32) -> u64 {
    counter & lifetime_mask(per_block)
}

/// Adds `slices` freed slices to a block counter; true if this add
/// completed the block. The hot path of `free`.
#[inline(always)]
pub fn count_freed_slices(counter: &Word, slices: u64, per_block: u32) -> bool {
    // Release: the freeing threads' writes to their slices are performed
    // before the count can complete. Only the completing thread needs the
    // acquire side, so it alone pays for the fence (an acquire RMW would
    // invalidate the SM's L1 on every free).
    let old = arch::fetch_add_release(counter, slices);
    let done = completes(old, slices, per_block);
    if done {
        arch::fence_acq_rel();
    }
    done
}

/// What a checked free found for a slice (or a block of a block class).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CheckedFree {
    /// It was live; now it is freed.
    Freed,
    /// It was already freed and not handed out since.
    Double,
    /// It was never handed out (in this block's format).
    NeverHandedOut,
}

/// The word and shift of unit `unit`'s state.
#[inline(always)]
fn state_at(states: &[Word], unit: u32) -> (&Word, u32) {
    // SAFETY: callers pass units below SLICES_PER_BLOCK (slices) or
    // `max_blocks_per_segment` (blocks, at most 128), so the word is below
    // CHECK_WORDS_PER_BLOCK, the length of every check region.
    let w = unsafe { states.get_unchecked((unit >> 5) as usize) };
    (w, (unit & 31) * 2)
}

/// Checked heaps: marks unit `unit` (a slice, or a block of a block class)
/// live as `malloc` hands it out.
#[inline(always)]
pub fn mark_live(states: &[Word], unit: u32) {
    let (w, shift) = state_at(states, unit);
    let mut current = arch::load_relaxed(w);
    loop {
        let next = current & !(STATE_MASK << shift) | LIVE << shift;
        // acq_rel CAS (the only CAS the architecture module offers): the
        // state publishes nothing; a later free of the same pointer is
        // ordered after this malloc by the user.
        match arch::compare_exchange_acq_rel(w, current, next) {
            Ok(_) => return,
            Err(actual) => current = actual,
        }
    }
}

/// Checked heaps: a free of unit `unit`. Only a `Freed` answer may count
/// the unit dead or give it back.
#[inline(always)]
pub fn check_free(states: &[Word], unit: u32) -> CheckedFree {
    let (w, shift) = state_at(states, unit);
    let mut current = arch::load_relaxed(w);
    loop {
        match (current >> shift) & STATE_MASK {
            LIVE => {}
            FREED => return CheckedFree::Double,
            _ => return CheckedFree::NeverHandedOut,
        }
        let next = current & !(STATE_MASK << shift) | FREED << shift;
        // acq_rel CAS: the one transition from live to freed decides which
        // of racing frees is the free.
        match arch::compare_exchange_acq_rel(w, current, next) {
            Ok(_) => return CheckedFree::Freed,
            Err(actual) => current = actual,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_range_goes_back_with_one_word_and_names_the_blocks_free_already() {
        let words: [Word; 2] = core::array::from_fn(|_| Word::new(0));
        let bitmap = BlockBitmap::new(&words);
        assert_eq!(bitmap.give_back_range(70, 5), 0);
        assert!((70..75).all(|b| bitmap.is_free(b)));
        assert!(!bitmap.is_free(69) && !bitmap.is_free(75));
        assert_eq!(
            bitmap.give_back_range(72, 4),
            0b111,
            "72..75 were free already"
        );
        assert_eq!(bitmap.give_back_range(0, 64), 0, "a whole word");
        assert_eq!(arch::load_relaxed(&words[0]), u64::MAX);
        assert_eq!(
            bitmap.give_back_range(124, 4),
            0,
            "up to the word's top bit"
        );
        assert_eq!(arch::load_relaxed(&words[1]) >> 60, 0xf);
    }
}
