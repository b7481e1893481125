//! Blocks inside a segment: the free-block bitmap, the per-block free counter
//! of slice classes, and the optional per-slice double-free bits.
//!
//! # Invariants (owned here)
//! - Bit `b` of a segment's bitmap is set while block `b` is free. It is
//!   cleared only by a thread holding a reservation from the segment table,
//!   and set only by the thread returning the block.
//! - A slice block's counter counts slices that will never be handed out
//!   again: freed slices plus those a retired slot left unissued. The thread
//!   whose add brings it to `SLICES_PER_BLOCK` owns the block and returns it,
//!   after storing the counter back to zero.
//! - A slice's double-free bit (checked heaps only) is set by its free and
//!   cleared when its block returns.

use crate::arch::{self, Word};
use crate::class::{SLICES_PER_BLOCK, SizeClass};

/// Words of double-free bits per slice block.
pub const SLICE_BIT_WORDS: u32 = (SLICES_PER_BLOCK / 64) as u32;

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
pub fn count_dead_slices(counter: &Word, slices: u64) -> bool {
    // acq_rel: the completing thread must see every earlier free's writes to
    // the slices before it recycles the block (release by each adder,
    // acquire by the one that completes).
    let old = arch::fetch_add_acq_rel(counter, slices);
    old + slices == SLICES_PER_BLOCK
}

/// Adds `slices` freed slices to a block counter; true if this add
/// completed the block. The hot path of `free`.
#[inline(always)]
pub fn count_freed_slices(counter: &Word, slices: u64) -> bool {
    // Release: the freeing threads' writes to their slices are performed
    // before the count can complete. Only the completing thread needs the
    // acquire side, so it alone pays for the fence (an acquire RMW would
    // invalidate the SM's L1 on every free).
    let old = arch::fetch_add_release(counter, slices);
    let done = old + slices == SLICES_PER_BLOCK;
    if done {
        arch::fence_acq_rel();
    }
    done
}

/// Sets a slice's double-free bit; false if it was already set.
#[inline(always)]
pub fn mark_slice_freed(bits: &[Word], slice: u32) -> bool {
    let bit = 1u64 << (slice & 63);
    // SAFETY: slice < SLICES_PER_BLOCK, so the word index is in range.
    let w = unsafe { bits.get_unchecked((slice >> 6) as usize) };
    arch::fetch_or_acq_rel(w, bit) & bit == 0
}

/// Clears all double-free bits of a block being recycled.
#[inline]
pub fn clear_slice_bits(bits: &[Word]) {
    for w in bits {
        arch::store_relaxed(w, 0);
    }
}
