//! `HeapStats`: what a heap holds, computed from a snapshot of its metadata
//! taken while no kernel uses the heap. The host copies the metadata words
//! and calls [`HeapStats::from_snapshot`]; nothing on the hot path counts.
//!
//! Live slices of a block = slices issued − slices counted dead, where a
//! block outside any slot has issued all its slices, and one in a slot has
//! issued `min(reserved, slices per block)`.

use crate::block::dead_in_lifetime;
use crate::class::{CLASSES, SLICE_CLASSES, SizeClass, bitmap_words_per_segment};
use crate::install_clock::InstallClock;
use crate::layout::{Heap, Stat};
use crate::segment::SegmentState;
use crate::slot::{SLOTS_PER_CLASS, SPARES_PER_SLOT, SlotWord};
use crate::stripe::StripeWord;

/// What a heap holds.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeapStats {
    /// Segments in the heap.
    pub segments: u32,
    /// Segments in the segment tree.
    pub free_segments: u32,
    /// Bytes handed out and not freed (at class granularity).
    pub live_bytes: u64,
    /// Live allocations per class.
    pub live_per_class: [u64; CLASSES as usize],
    /// Live multi-segment allocations.
    pub live_runs: u64,
    /// Segments held by live multi-segment allocations.
    pub run_segments: u64,
    /// `malloc` calls that returned null for a non-zero size.
    pub failed_mallocs: u64,
    /// `free` calls with pointers the heap never handed out.
    pub invalid_frees: u64,
    /// Detected double frees.
    pub double_frees: u64,
    /// Where memory that is held but not live sits (what makes a heap's
    /// span exceed what was asked): segments formatted for a class.
    pub active_segments: u32,
    /// Bytes of blocks in formatted segments that nobody holds (free in
    /// their segment's bitmap): formatted ahead of demand, or given back.
    pub idle_block_bytes: u64,
    /// Bytes of slices in slot blocks not yet handed out.
    pub slot_unissued_bytes: u64,
    /// Bytes of spare blocks parked beside slots, and of blocks of class
    /// stripes not yet drawn (`crate::stripe`).
    pub spare_block_bytes: u64,
    /// Bytes of slices counted dead in blocks not yet returned: freed
    /// slices of a block that a slot still holds or that has live slices
    /// left, and the slices a replaced slot version never handed out.
    pub dead_slice_bytes: u64,
    /// A measuring build's install and wait counts (zero in others).
    pub install_clock: InstallClock,
    /// The same held bytes class by class (`bench frag`'s map).
    pub per_class: [ClassHeld; CLASSES as usize],
}

/// What one class holds: its share of [`HeapStats`]' held bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ClassHeld {
    /// Segments formatted for the class.
    pub segments: u32,
    /// Bytes of its blocks free in their segments' bitmaps.
    pub idle_block_bytes: u64,
    /// Bytes of its slot blocks' slices not yet handed out.
    pub slot_unissued_bytes: u64,
    /// Bytes of its spare blocks and undrawn stripe blocks.
    pub spare_block_bytes: u64,
    /// Bytes of slices counted dead in its blocks not yet returned.
    pub dead_slice_bytes: u64,
}

impl HeapStats {
    /// Live allocations of every kind.
    pub fn live_allocations(&self) -> u64 {
        self.live_per_class.iter().sum::<u64>() + self.live_runs
    }

    /// Reads a snapshot of `heap`'s metadata words (`words[i]` is word `i`).
    pub fn from_snapshot(heap: &Heap, words: &[u64]) -> HeapStats {
        let at = |offset: u64| words[offset as usize];
        let mut s = HeapStats {
            segments: heap.segments,
            failed_mallocs: at(heap.stats_at + Stat::FailedMallocs as u64),
            invalid_frees: at(heap.stats_at + Stat::InvalidFrees as u64),
            double_frees: at(heap.stats_at + Stat::DoubleFrees as u64),
            install_clock: InstallClock::from_words(|stat| at(heap.stats_at + stat as u64)),
            ..HeapStats::default()
        };
        let leaves = heap.tree.level_words[0] as u64;
        s.free_segments = (0..leaves)
            .map(|w| at(heap.trees_at + w).count_ones())
            .sum();
        let shift = heap.segment_shift;
        for segment in 0..heap.segments as u64 {
            match SegmentState::decode(at(heap.states_at + segment)) {
                SegmentState::Active { class, .. } => {
                    let held = &mut s.per_class[class.index() as usize];
                    held.segments += 1;
                    let bitmap = bitmap_in_snapshot(heap, words, segment as u32);
                    for block in 0..class.blocks_per_segment(shift) {
                        if is_free_in(bitmap, block) {
                            held.idle_block_bytes += 1 << class.block_shift(shift);
                            continue;
                        }
                        let live = if class.is_slice() {
                            let g = heap.counter_index(segment as u32, block);
                            let per = class.slices_per_block(shift);
                            let dead = dead_in_lifetime(at(heap.counters_at + g), per);
                            held.dead_slice_bytes += dead.min(per as u64) << class.unit_shift();
                            (per as u64).saturating_sub(dead)
                        } else {
                            1
                        };
                        s.live_per_class[class.index() as usize] += live;
                    }
                }
                SegmentState::RunHead { segments } => {
                    s.live_runs += 1;
                    s.run_segments += segments as u64;
                }
                _ => {}
            }
        }
        // Blocks in slots have not issued their unissued slices yet, and
        // spare blocks none at all. Saturating: after an undetected bad free
        // on an unchecked heap a block in a slot can be free already, and a
        // snapshot must still never wrap.
        for class in (0..SLICE_CLASSES).filter_map(SizeClass::new) {
            let (c, per) = (class.index(), class.slices_per_block(shift));
            // Blocks of the class's stripe never drawn: taken, with no
            // slice handed out, as spares are.
            let undrawn = heap.undrawn_in_snapshot(class, words) as u64;
            let live = &mut s.live_per_class[c as usize];
            *live = live.saturating_sub(undrawn * per as u64);
            let held = &mut s.per_class[c as usize];
            held.spare_block_bytes += undrawn << class.block_shift(shift);
            for slot in 0..SLOTS_PER_CLASS {
                let word = SlotWord(at(heap.slot_at(c, slot)));
                let live = &mut s.live_per_class[c as usize];
                *live = live.saturating_sub(word.unissued(per) as u64);
                held.slot_unissued_bytes += (word.unissued(per) as u64) << class.unit_shift();
                for i in 0..SPARES_PER_SLOT {
                    if at(heap.spare_index(c, slot, i)) != 0 {
                        let live = &mut s.live_per_class[c as usize];
                        *live = live.saturating_sub(per as u64);
                        held.spare_block_bytes += 1 << class.block_shift(shift);
                    }
                }
            }
        }
        // The totals are the classes' sums: one account, kept per class.
        let sum = |part: fn(&ClassHeld) -> u64| s.per_class.iter().map(part).sum::<u64>();
        s.active_segments = sum(|c| c.segments as u64) as u32;
        s.idle_block_bytes = sum(|c| c.idle_block_bytes);
        s.slot_unissued_bytes = sum(|c| c.slot_unissued_bytes);
        s.spare_block_bytes = sum(|c| c.spare_block_bytes);
        s.dead_slice_bytes = sum(|c| c.dead_slice_bytes);
        s.live_bytes = (0..CLASSES)
            .filter_map(SizeClass::new)
            .map(|c| s.class_live_bytes(c))
            .sum::<u64>()
            + (s.run_segments << shift);
        s
    }

    /// Bytes handed out and not freed in `class` (at class granularity).
    pub fn class_live_bytes(&self, class: SizeClass) -> u64 {
        self.live_per_class[class.index() as usize] << class.unit_shift()
    }
}

/// One character for `segment` in a snapshot of `heap`'s metadata
/// (`words`, as [`HeapStats::from_snapshot`] takes it), for a map of where
/// a heap's held bytes sit (`bench frag` with `GPUMALLOC_FRAG_MAP=1`):
/// `.` free, `S` a slice segment holding a block of one of its class's
/// slots, `u` one holding blocks of its class's stripe not yet drawn, else
/// the blocks it has free in its bitmap (`0`…`9`, `+` for more), `r` a
/// multi-segment allocation.
pub fn segment_mark(heap: &Heap, words: &[u64], segment: u32) -> u8 {
    let class = match SegmentState::decode(words[(heap.states_at + segment as u64) as usize]) {
        SegmentState::Active { class, .. } => class,
        SegmentState::Free => return b'.',
        _ => return b'r',
    };
    if class.is_slice() {
        let per = class.slices_per_block(heap.segment_shift);
        let in_segment = |global: u64| heap.block_id(global).segment() == segment;
        let held_by_slot = (0..SLOTS_PER_CLASS).any(|slot| {
            let word = SlotWord(words[heap.slot_at(class.index(), slot) as usize]);
            word.unissued(per) > 0
                && word.block().is_some_and(|g| {
                    (0..word.run()).any(|j| in_segment(heap.run_block(class, g, j)))
                })
        });
        if held_by_slot {
            return b'S';
        }
        let stripe = StripeWord(words[heap.stripe_at(class.index()) as usize]);
        if !stripe.is_empty()
            && stripe
                .undrawn()
                .any(|j| heap.stripe_block(class, stripe, j).segment() == segment)
        {
            return b'u';
        }
    }
    // The class's blocks only: a format writes the words its blocks
    // cover, and a word past them may keep an earlier class's bits.
    let bitmap = bitmap_in_snapshot(heap, words, segment);
    let idle = (0..class.blocks_per_segment(heap.segment_shift))
        .filter(|&block| is_free_in(bitmap, block))
        .count();
    match idle {
        0..=9 => b'0' + idle as u8,
        _ => b'+',
    }
}

/// `segment`'s block bitmap in a snapshot of `heap`'s metadata.
fn bitmap_in_snapshot<'a>(heap: &Heap, words: &'a [u64], segment: u32) -> &'a [u64] {
    let per = bitmap_words_per_segment(heap.segment_shift) as usize;
    let at = heap.bitmaps_at as usize + segment as usize * per;
    &words[at..at + per]
}

/// Whether `block` is free in a snapshot of a segment's bitmap.
fn is_free_in(bitmap: &[u64], block: u32) -> bool {
    bitmap[(block / 64) as usize] & 1 << (block % 64) != 0
}
