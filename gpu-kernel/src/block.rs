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
//! - Checked heaps keep two bits per slice (see [`CHECK_WORDS_PER_BLOCK`]):
//!   the *live* bit, set by `malloc` and cleared by `free`, and the *freed*
//!   bit, set by `free` and cleared when the slice is handed out again. A
//!   free whose live bit is clear is a bad free: a double free if the freed
//!   bit is set, else a pointer never handed out.

use crate::arch::{self, Word};
use crate::class::{SLICES_PER_BLOCK, SizeClass};

/// Mask of a counter's position within the current lifetime of a block of
/// `per_block` slices.
#[inline(always)]
fn lifetime_mask(per_block: u32) -> u64 {
    per_block as u64 - 1
}

/// Words of one bit per slice of a block.
pub const SLICE_BIT_WORDS: u32 = (SLICES_PER_BLOCK / 64) as u32;
/// Words of misuse-check bits per slice block on checked heaps: the live
/// bits, then the freed bits. A segment of a block class keeps the freed
/// bits of its blocks in the freed words of its first slice block.
pub const CHECK_WORDS_PER_BLOCK: u32 = 2 * SLICE_BIT_WORDS;

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
        // SAFETY: block ids are below MAX_BLOCKS_PER_SEGMENT, so i is below
        // BITMAP_WORDS_PER_SEGMENT, the slice's length.
        unsafe { self.words.get_unchecked(i as usize) }
    }

    /// Formats the bitmap for `class` with blocks `0..taken` taken by the
    /// caller. Relaxed stores: the segment table's release store publishes
    /// them.
    #[inline]
    pub fn format(&self, class: SizeClass, taken: u32) {
        let blocks = class.blocks_per_segment();
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

    /// Takes a free block, scanning from word `start` (mod the word count)
    /// so that threads of one team spread over the bitmap. The caller holds
    /// a reservation, so a free block exists; a bit found set may be taken
    /// by another reserver first, so rescan.
    #[inline]
    pub fn take(&self, class: SizeClass, start: u32) -> u32 {
        let words = class.blocks_per_segment().div_ceil(64);
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

    /// Marks `block` free; returns false if it already was (a double free).
    /// Release: resets made before are visible to the next owner.
    #[inline]
    pub fn give_back(&self, block: u32) -> bool {
        let bit = 1u64 << (block & 63);
        arch::fetch_or_acq_rel(self.word(block >> 6), bit) & bit == 0
    }

    /// Whether `block` is free (a snapshot).
    pub fn is_free(&self, block: u32) -> bool {
        arch::load_relaxed(self.word(block >> 6)) & 1u64 << (block & 63) != 0
    }
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

#[inline(always)]
fn bit_word(bits: &[Word], word: u32) -> &Word {
    // SAFETY: callers pass words below CHECK_WORDS_PER_BLOCK, the length of
    // every check-bit region.
    unsafe { bits.get_unchecked(word as usize) }
}

/// Checked heaps: marks slice `slice` live as `malloc` hands it out.
#[inline(always)]
pub fn mark_slice_live(bits: &[Word], slice: u32) {
    let bit = 1u64 << (slice & 63);
    // acq_rel RMWs (the only kind the architecture module offers for bit
    // operations): nothing is published through these bits, they are read
    // only by a later free of the same pointer, which the user orders after
    // this malloc.
    arch::fetch_or_acq_rel(bit_word(bits, slice >> 6), bit);
    let freed = bit_word(bits, SLICE_BIT_WORDS + (slice >> 6));
    if arch::load_relaxed(freed) & bit != 0 {
        arch::fetch_and_acq_rel(freed, !bit);
    }
}

/// Checked heaps: a free of slice `slice`. Only a `Freed` answer may count
/// the slice dead.
#[inline(always)]
pub fn check_slice_free(bits: &[Word], slice: u32) -> CheckedFree {
    let bit = 1u64 << (slice & 63);
    // The live bit's clear decides: of two frees of one live slice, exactly
    // one finds the bit set.
    if arch::fetch_and_acq_rel(bit_word(bits, slice >> 6), !bit) & bit != 0 {
        arch::fetch_or_acq_rel(bit_word(bits, SLICE_BIT_WORDS + (slice >> 6)), bit);
        return CheckedFree::Freed;
    }
    if arch::load_relaxed(bit_word(bits, SLICE_BIT_WORDS + (slice >> 6))) & bit != 0 {
        CheckedFree::Double
    } else {
        CheckedFree::NeverHandedOut
    }
}

/// Checked heaps, block classes: records that block `block` was freed
/// (`freed` words of the segment's first slice block).
#[inline(always)]
pub fn mark_block_freed(bits: &[Word], block: u32, freed: bool) {
    let bit = 1u64 << (block & 63);
    let w = bit_word(bits, SLICE_BIT_WORDS + (block >> 6));
    if freed {
        arch::fetch_or_acq_rel(w, bit);
    } else if arch::load_relaxed(w) & bit != 0 {
        arch::fetch_and_acq_rel(w, !bit);
    }
}

/// Checked heaps, block classes: whether block `block` was freed since it
/// was last handed out.
#[inline(always)]
pub fn block_was_freed(bits: &[Word], block: u32) -> bool {
    let bit = 1u64 << (block & 63);
    arch::load_relaxed(bit_word(bits, SLICE_BIT_WORDS + (block >> 6))) & bit != 0
}
