//! Slot words: the per-class buffers that hold the block warps are carving
//! slices from. Each slice class has [`SLOTS_PER_CLASS`] slots; a warp picks
//! one by its SM id so the whole GPU does not contend on one word.
//!
//! # Slot word
//! `reserved` (bits 0..32): slices handed out of the current version,
//! counting past the block's end; `block` (bits 32..56): global block id + 1,
//! 0 for none; `generation` (bits 56..64): changes on every replacement, so a
//! waiting thread sees that the word was replaced even by an identical one.
//! With runs ([`SLOT_RUN_MAX`] above 1) the generation has bits 56..62 and
//! bits 62..64 hold the version's *run* less one: the version holds that
//! many blocks of adjacent addresses (1 to 4; `block` names the first),
//! and its indices run through them in order, so its capacity is the
//! class's slices per block times the run (a few instructions on the
//! allocation path, after the add that returns the word).
//!
//! # Protocol
//! A team adds its size `n` to `reserved` (one relaxed add, see `team`) and
//! so owns the indices `[r, r + n)` of this version. Indices below the
//! capacity (the class's slices per block with a block, 0 without) are
//! slices. The team whose range holds the index equal
//! to the capacity is the *installer*: exactly one per version. It claims a
//! new block, replaces the word by an exchange (new version, `reserved` = the slices
//! its own members take) and retires the word it displaced. Teams past the
//! capacity wait for the replacement (while the word still shows their
//! version with `reserved` past the capacity: a word with their version bits
//! and fewer reserved is a later version whose generation wrapped) and try
//! again. Whoever replaces a word
//! (installer or flush) retires it: the slices it never handed out are counted
//! dead on the block's counter (each block of a run on its own), so every
//! block is accounted for exactly. A reclaim may also replace a word that is
//! not exhausted by the same word with a shorter run (a CAS, so no team's
//! reservation is lost): the blocks it keeps are those its `reserved` has
//! reached, and those it drops, which no index has reached, go back whole.

/// Slots per slice class: the most a class uses (see `Heap::slots_for`).
/// 32 unless `GPUMALLOC_SLOTS` (a power of two up to 256) is set at build
/// time.
pub const SLOTS_PER_CLASS: u32 = crate::class::build_knob(option_env!("GPUMALLOC_SLOTS"), 32);
const _: () = assert!(SLOTS_PER_CLASS.is_power_of_two() && SLOTS_PER_CLASS <= 256);

/// Metadata words from one slot word to the next (`Heap`'s layout): 16,
/// so each slot word has a 128-byte line of its own. Packed (1), a class's
/// 32 slot words shared two lines, which every team's add and every waiting
/// team's polling load met on; a line each made 2 / 4 KiB allocation 10%
/// faster and mixed 8% (`docs/PERF.md`, "Slot words a line apart?").
/// `GPUMALLOC_SLOT_STRIDE` at build time (a power of two up to 16) sets
/// another stride, for measuring.
pub const SLOT_STRIDE_WORDS: u32 =
    crate::class::build_knob(option_env!("GPUMALLOC_SLOT_STRIDE"), 16);
const _: () = assert!(SLOT_STRIDE_WORDS.is_power_of_two() && SLOT_STRIDE_WORDS <= 16);

/// Claimed blocks a slot keeps ready for its next installs. An installer
/// that finds none claims up to `1 + SPARES_PER_SLOT` blocks at once (as
/// many as the teams waiting on the slot will use, `team.rs`'s
/// `DEMAND_CLAIM`) and parks the extra ones here, so in a burst only one
/// install in four waits for a claim (claims contend on the class tree and
/// on one segment's state word).
///
/// Spare words hold a global block id + 1 (0: empty). They are pushed only
/// by the slot's installer (one at a time per slot) with a CAS from 0, and
/// popped with a swap by installers and by flushes. A spare block is
/// claimed (its bitmap bit clear) with a zero counter and no slice handed
/// out. `GPUMALLOC_SPARES` (1 to 7) at build time sets another count, for
/// measuring what spares cost in span against what they save in time
/// (`docs/PERF.md`, "Where slice allocation waits": fewer made 128 B …
/// 16 KiB up to 40% slower).
pub const SPARES_PER_SLOT: u32 = crate::class::build_knob(option_env!("GPUMALLOC_SPARES"), 3);
const _: () = assert!(SPARES_PER_SLOT >= 1 && SPARES_PER_SLOT <= 7);
/// Spares of a slot of a wide class (`class::WIDE_BLOCK_MAX_UNIT_SHIFT`)
/// whose block does not fill a segment: 1 unless `GPUMALLOC_WIDE_SPARES`
/// (1 to `SPARES_PER_SLOT`) is set at build time. A wide block holds twice
/// the slices, so each spare holds twice the idle bytes; with one, those
/// classes were as fast as with three and their spans stayed as before
/// (`docs/PERF.md`, "Wide blocks for the smallest classes only").
pub const WIDE_SPARES_PER_SLOT: u32 =
    crate::class::build_knob(option_env!("GPUMALLOC_WIDE_SPARES"), 1);
const _: () = assert!(WIDE_SPARES_PER_SLOT >= 1 && WIDE_SPARES_PER_SLOT <= SPARES_PER_SLOT);

const RESERVED_MASK: u64 = 0xffff_ffff;
const BLOCK_SHIFT: u32 = 32;
const BLOCK_MASK: u64 = 0xff_ffff;
const GENERATION_SHIFT: u32 = 56;

/// Largest global block id a slot can hold.
pub const MAX_SLOT_BLOCK: u64 = BLOCK_MASK - 1;

/// The most blocks one slot version holds (`GPUMALLOC_SLOT_RUN`, 1 to
/// 4; 4 unless set at build time, 1 for none, the rule before 2026-11-24's
/// twelfth session). A claim whose extra blocks lie right after the one it
/// installs (whole segments of adjacent ids, on a heap that is not
/// fragmented; the blocks of a segment the claim formatted, or those of a
/// reserved claim taken in order at their ticket bits, `team::RUN_BLOCKS`)
/// installs them with it as one run instead of parking
/// them as spares: the same blocks are held, but the slot's
/// teams carve through all of them before the next install, so a burst
/// waits for a quarter of the installs. A run's blocks are separate blocks
/// to everything else (counters, frees, retire); only the slot sees them
/// as one range of indices. H100, kernel alone, against 1: 2 / 4 / 8 /
/// 16 KiB −33 / −41 / −43 / −43%, mixed −12%, 16 B … 1 KiB +2 … +4% (the
/// run's two instructions on the allocation path), spans unchanged
/// (`docs/PERF.md`, "Which class a mixed burst waits on, and slot runs").
pub const SLOT_RUN_MAX: u32 = crate::class::build_knob(option_env!("GPUMALLOC_SLOT_RUN"), 4);
const _: () = assert!(matches!(SLOT_RUN_MAX, 1..=4));
/// Whether this build installs runs.
pub const RUNS: bool = SLOT_RUN_MAX > 1;
const RUN_SHIFT: u32 = 62;
const GENERATION_MASK: u64 = if RUNS { 0x3f } else { 0xff };

/// A decoded slot word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotWord(pub u64);

impl SlotWord {
    /// A word holding `block` (or none) with `reserved` slices taken.
    #[inline(always)]
    pub fn new(block: Option<u64>, reserved: u32, generation: u8) -> SlotWord {
        let b = block.map_or(0, |b| b + 1) & BLOCK_MASK;
        let generation = if RUNS {
            generation as u64 & GENERATION_MASK
        } else {
            generation as u64
        };
        SlotWord(generation << GENERATION_SHIFT | b << BLOCK_SHIFT | reserved as u64)
    }

    /// A word holding a run of `run` blocks (1 ..= [`SLOT_RUN_MAX`]: the
    /// word's two run bits hold `run - 1`) from global block `block`, of
    /// adjacent addresses.
    #[inline(always)]
    pub fn new_run(block: u64, run: u32, reserved: u32, generation: u8) -> SlotWord {
        debug_assert!((1..=SLOT_RUN_MAX).contains(&run));
        let word = SlotWord::new(Some(block), reserved, generation);
        if RUNS {
            SlotWord(word.0 | ((run - 1) as u64) << RUN_SHIFT)
        } else {
            word
        }
    }

    /// Blocks this version holds (1 without runs, and for a word without a
    /// block). Any length up to `SLOT_RUN_MAX`: until 2026-11-24's
    /// fourteenth session a power of two, so a claim of three adjacent
    /// blocks installed two and parked one for a later install.
    #[inline(always)]
    pub fn run(self) -> u32 {
        if RUNS {
            (self.0 >> RUN_SHIFT) as u32 + 1
        } else {
            1
        }
    }

    /// The global block id, if a block is installed.
    #[inline(always)]
    pub fn block(self) -> Option<u64> {
        let b = (self.0 >> BLOCK_SHIFT) & BLOCK_MASK;
        (b != 0).then(|| b - 1)
    }

    /// Indices handed out of this version, including those past the end.
    #[inline(always)]
    pub fn reserved(self) -> u32 {
        (self.0 & RESERVED_MASK) as u32
    }

    /// Replacement counter.
    #[inline(always)]
    pub fn generation(self) -> u8 {
        ((self.0 >> GENERATION_SHIFT) & GENERATION_MASK) as u8
    }

    /// Slices this version can hand out, for a class of `per_block` slices
    /// per block.
    #[inline(always)]
    pub fn capacity(self, per_block: u32) -> u32 {
        if self.block().is_some() {
            per_block * self.run()
        } else {
            0
        }
    }

    /// Block and generation: what identifies a version.
    #[inline(always)]
    pub fn version(self) -> u64 {
        self.0 & !RESERVED_MASK
    }

    /// Slices of this version's block that were never handed out.
    #[inline(always)]
    pub fn unissued(self, per_block: u32) -> u32 {
        let cap = self.capacity(per_block);
        cap - self.reserved().min(cap)
    }

    /// Slices of block `j` of this version's run handed out.
    #[inline(always)]
    pub fn issued_in(self, j: u32, per_block: u32) -> u32 {
        let before = j * per_block;
        self.reserved()
            .min(self.capacity(per_block))
            .saturating_sub(before)
            .min(per_block)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields() {
        let w = SlotWord::new(Some(12345), 4000, 7);
        assert_eq!(w.block(), Some(12345));
        assert_eq!(w.reserved(), 4000);
        assert_eq!(w.generation(), 7);
        assert_eq!(w.unissued(4096), 96);
        let e = SlotWord::new(None, 0, 0);
        assert_eq!(e.0, 0);
        assert_eq!(e.capacity(4096), 0);
        assert_eq!(SlotWord(w.0 + 200).unissued(4096), 0);
        // A generation wraps within its bits and never reaches the run's.
        let g = SlotWord::new(Some(3), 0, u8::MAX);
        assert_eq!(g.run(), 1);
        assert_eq!(
            SlotWord::new(Some(3), 0, g.generation().wrapping_add(1)).generation(),
            0
        );
    }

    #[test]
    fn runs() {
        if !RUNS {
            return;
        }
        let w = SlotWord::new_run(40, SLOT_RUN_MAX, 5000, 63);
        assert_eq!(
            (w.block(), w.run(), w.reserved(), w.generation()),
            (Some(40), SLOT_RUN_MAX, 5000, 63)
        );
        assert_eq!(w.capacity(4096), 4096 * SLOT_RUN_MAX);
        assert_eq!(w.unissued(4096), 4096 * SLOT_RUN_MAX - 5000);
        assert_eq!((w.issued_in(0, 4096), w.issued_in(1, 4096)), (4096, 904));
        if SLOT_RUN_MAX == 4 {
            assert_eq!((w.issued_in(2, 4096), w.issued_in(3, 4096)), (0, 0));
        }
        // Adds count in `reserved` only; the run is part of the version.
        assert_eq!(SlotWord(w.0 + 7).run(), SLOT_RUN_MAX);
        assert_ne!(w.version(), SlotWord::new(Some(40), 5000, 63).version());
        // Every length up to the most, three included, and the largest
        // generation beside each.
        for run in 1..=SLOT_RUN_MAX {
            let w = SlotWord::new_run(MAX_SLOT_BLOCK, run, 2 * 4096 + 1, 63);
            assert_eq!(
                (w.block(), w.run(), w.generation()),
                (Some(MAX_SLOT_BLOCK), run, 63)
            );
            assert_eq!(w.capacity(4096), 4096 * run);
            let issued: u32 = (0..run).map(|j| w.issued_in(j, 4096)).sum();
            assert_eq!(issued + w.unissued(4096), 4096 * run);
        }
    }
}
