//! Class stripes: blocks of adjacent addresses that a slice class's slot
//! installs draw one at a time, with one add on a word the class's slots
//! share, instead of each slot claiming its own block (and holding spares
//! and runs ahead of its need).
//!
//! Why: at a burst's end every slot holds what it took ahead: at 256 B the
//! 32 slots' runs of up to four 1 MiB blocks held 0.30 of what was asked
//! unissued (span 1.38 against issue 15's 1.15), and slots without spares
//! or runs spanned 1.06 but allocated 52% slower, since each install then
//! claimed (about 11 µs on the H100, `docs/PERF.md`, "Class stripes"). A
//! stripe keeps the blocks taken ahead in one place for the whole class,
//! in address order, so a slot holds one block and, within a burst, the
//! blocks not yet drawn lie above every block drawn. Across bursts on a
//! warm heap a burst first drew what the last one left, high, then
//! refilled from the low segments its frees gave back (the 256 B span
//! 1.26–1.37); now a segment given back below the stripe asks the next
//! draw to drain it ([`Heap::lower_stripe`]), and a refill takes the run
//! at the lowest free id, so a warm burst fills from the bottom (1.15–1.24
//! by run; the segments the last burst's slots still hold lie among its
//! blocks).
//!
//! # Stripe line
//! Each slice class has a 128-byte line in the stripe region: word 0 is
//! the stripe word below, word 1 the lowering request
//! ([`Heap::lower_stripe`]: 1 asks the next draw to drain the stripe).
//!
//! # Stripe word
//! `drawn` (bits 0..32): draws of this version, counting past its end;
//! `block` (bits 32..56): the global id + 1 of its first block (0: none);
//! `len` (bits 56..64): its blocks (0..=255). Its blocks are the `len`
//! blocks of the class from `block` on in address order (`BlockId::advanced`),
//! taken in their segments' bitmaps with no slice handed out (as a spare
//! is): whole segments formatted for the class, or one run of adjacent
//! free blocks of a segment formatted for it that other blocks still hold
//! ([`STRIPE_REUSE`]: the lowest such segment, when it lies below every
//! free segment).
//!
//! # Protocol
//! - A draw is one acq_rel add of 1. The add's old value decides: index
//!   `i = drawn` below `len` is block `i`, the drawer's alone (each index of
//!   a version goes to one add); `i == len` makes the drawer the version's
//!   *refiller*, exactly one per version.
//! - The refiller claims a held segment's run of free blocks or adjacent
//!   whole segments and replaces the word by
//!   an exchange with `drawn` = 1 (block 0 is its own). If the heap had
//!   none it publishes a *closed* word (no blocks, `drawn` = [`CLOSED`]).
//! - A drawer past `len` waits while the word shows its version (`block`
//!   and `len`) with `drawn` past `len`: the refiller's exchange ends the
//!   wait, and the drawer adds again. A later version with the same
//!   blocks and `drawn` past its `len` has a refiller of its own, so the
//!   wait ends then. Waiting instead of claiming elsewhere keeps every
//!   block a burst takes in the stripes' address order, so the blocks not
//!   yet drawn lie above all those drawn (claims elsewhere during a
//!   refill landed above the new stripe and put its undrawn blocks inside
//!   the span).
//! - A closed word answers a draw with none (the install claims
//!   elsewhere, and a request about to fail reclaims) while the segment
//!   tree is empty; a drawer that finds it closed with a segment in the
//!   tree swaps it back to empty (once per draw) and draws again, whose
//!   first add refills. A reclaim or a flush empties it too.
//! - Whoever replaces a stripe word (refiller, reclaim, flush, a draw
//!   asked to lower the stripe) retires the
//!   word it displaced: its blocks from `min(drawn, len)` on were never
//!   drawn and go back to their segments.
//!
//! Claiming the next stripe ahead, at half of this one, was measured and
//! not kept: 256 B allocated 2.6× slower than without it (`docs/PERF.md`,
//! "Class stripes").
//!
//! # Ordering
//! The exchange that publishes a version is acq_rel, and every draw is an
//! acq_rel RMW on the same word: the draws after it are in its release
//! sequence, so a drawer's acquire sees the format of the blocks it draws
//! (their counters and the segment states written before the exchange).

use crate::arch::{self, Word};
use crate::class::SizeClass;
use crate::heap::BlockId;
use crate::layout::{Heap, NO_SPARES};

/// Which slice classes draw from a stripe (`GPUMALLOC_STRIPE`, at build
/// time): 0 none (the rule before 2026-11-25's twentieth session); 1
/// those that are not wide and whose segment holds 2^[`STRIPE_MIN_BLOCKS_SHIFT`]
/// to 2^[`STRIPE_MAX_BLOCKS_SHIFT`] blocks (256 B on the bench heap's 8 MiB
/// segments); 2, the default, the same with the wide classes too (32 B …
/// 256 B there); 3 every slice class. H100, kernel alone, 2 against 0:
/// 32 / 64 / 128 / 256 B −14 / −22 / −25 / −6%, mixed −8%, other sizes
/// within ±3%, the 256 B span 1.35–1.47 → 1.26–1.37. Left out: 16 B (64
/// blocks to a segment there), whose stripe of one segment spanned
/// 1.53–1.61 where issue 15 asks 1.5, and 512 B and larger classes, which
/// lost 64–183% with a stripe (one block per install where their slots
/// carve runs of four) (`docs/PERF.md`, "Class stripes").
pub const STRIPE: u32 = crate::class::build_knob(option_env!("GPUMALLOC_STRIPE"), 2);
const _: () = assert!(STRIPE <= 3);

/// Blocks per segment from which a class draws from a stripe (with
/// `STRIPE` 1 or 2): 8.
const STRIPE_MIN_BLOCKS_SHIFT: u32 = 3;
/// Blocks per segment up to which a class draws from a stripe (with
/// `STRIPE` 1 or 2): 32, so that a stripe of two segments holds at most
/// 64 blocks.
const STRIPE_MAX_BLOCKS_SHIFT: u32 = 5;

/// Blocks a stripe aims to hold (`GPUMALLOC_STRIPE_BLOCKS`, at most 255;
/// 48 unless set at build time): a claim of whole segments takes
/// `max(2, this / blocks per segment)` of them, up to 64 (one
/// segment-tree word) and within [`STRIPE_BUDGET_SHIFT`]. A trade: what a
/// stripe leaves undrawn scales with it, and each refill makes the
/// class's drawers wait. H100, kernel alone: without the lowered stripe
/// ([`Heap::lower_stripe`]), 256 B against no stripes 64 blocks −7% and
/// span 1.26, 32 blocks +10% and span 1.14, 16 blocks +22%; with it, 48
/// against 64 blocks 64 / 128 / 256 B −10 / −10 / −4% (three interleaved
/// rounds; the default timing, noisier, −10 / −20 / −9%), spans alike (256 B
/// 1.15–1.24 by run for both), and 32 against 64 +18 / +13 / +15%
/// (`docs/PERF.md`, "Class stripes", "A stripe lowered after the frees
/// below it").
pub const STRIPE_BLOCKS: u32 = crate::class::build_knob(option_env!("GPUMALLOC_STRIPE_BLOCKS"), 48);
const _: () = assert!(STRIPE_BLOCKS >= 1 && STRIPE_BLOCKS <= 255);

/// Whether a refill first takes the lowest run of free blocks of the
/// class's lowest partly used segment, where that lies below every free
/// segment (`GPUMALLOC_STRIPE_REUSE`, 1 unless set to 0 at build time;
/// [`Heap::claim_stripe_blocks`]). Such a stripe is one run inside one
/// segment; the next refill takes the next run or whole segments.
pub const STRIPE_REUSE: bool =
    crate::class::build_knob(option_env!("GPUMALLOC_STRIPE_REUSE"), 1) != 0;

/// Refills that took a held segment's run (the CPU tests' witness that
/// the path ran).
#[cfg(test)]
pub(crate) static REUSED_RUNS: core::sync::atomic::AtomicUsize =
    core::sync::atomic::AtomicUsize::new(0);

/// A stripe stays within heap / 2^this (its budget, `Heap::budget_bytes`);
/// a heap where one segment passes that keeps no stripes.
const STRIPE_BUDGET_SHIFT: u32 = 7;

/// `drawn` of a closed word (see the module docs): far past any `len`,
/// and 2^31 draws from wrapping into the block field.
pub const CLOSED: u32 = 1 << 31;

const DRAWN_MASK: u64 = 0xffff_ffff;
const BLOCK_SHIFT: u32 = 32;
const BLOCK_MASK: u64 = 0xff_ffff;
const LEN_SHIFT: u32 = 56;
// Global block ids fit as a slot word's do (`Heap::max_segments` bounds
// them by `MAX_SLOT_BLOCK`).
const _: () = assert!(BLOCK_MASK - 1 == crate::slot::MAX_SLOT_BLOCK);

/// A decoded stripe word.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StripeWord(pub u64);

impl StripeWord {
    /// No blocks: its first draw refills.
    pub const EMPTY: StripeWord = StripeWord(0);

    /// `len` blocks from global block `first`, `drawn` of them drawn.
    #[inline(always)]
    pub fn new(first: u64, len: u32, drawn: u32) -> StripeWord {
        debug_assert!(len <= 255 && first < BLOCK_MASK);
        StripeWord(
            (len as u64) << LEN_SHIFT | ((first + 1) & BLOCK_MASK) << BLOCK_SHIFT | drawn as u64,
        )
    }

    /// Global id of its first block, if it has blocks.
    #[inline(always)]
    pub fn first(self) -> Option<u64> {
        let b = (self.0 >> BLOCK_SHIFT) & BLOCK_MASK;
        (b != 0).then(|| b - 1)
    }

    /// Its blocks.
    #[inline(always)]
    pub fn len(self) -> u32 {
        (self.0 >> LEN_SHIFT) as u32
    }

    /// Whether it holds no block.
    #[inline(always)]
    pub fn is_empty(self) -> bool {
        self.len() == 0
    }

    /// Draws of this version, past its end included.
    #[inline(always)]
    pub fn drawn(self) -> u32 {
        (self.0 & DRAWN_MASK) as u32
    }

    /// The same blocks with `drawn` set.
    #[inline(always)]
    fn with_drawn(self, drawn: u32) -> StripeWord {
        StripeWord(self.0 & !DRAWN_MASK | drawn as u64)
    }

    /// Blocks and first block: what identifies a version.
    #[inline(always)]
    fn version(self) -> u64 {
        self.0 & !DRAWN_MASK
    }

    /// Whether the word is closed (no blocks; see the module docs).
    #[inline(always)]
    pub fn is_closed(self) -> bool {
        self.is_empty() && self.drawn() >= CLOSED
    }

    /// Blocks never drawn: indices `min(drawn, len)..len`.
    #[inline(always)]
    pub fn undrawn(self) -> core::ops::Range<u32> {
        self.drawn().min(self.len())..self.len()
    }
}

impl Heap {
    /// Segments a claim for `class`'s stripe takes on this heap, 0 where
    /// the class draws from none (see [`STRIPE`]; heaps that keep no
    /// spares keep no stripes either).
    #[inline(always)]
    pub(crate) fn stripe_segments(&self, class: SizeClass) -> u32 {
        // Slice classes only: a stripe's word is on its class's line of
        // the stripe region, which has one line per slice class (a block
        // class's index would point past it, into the segment states).
        if !class.is_slice() {
            return 0;
        }
        let shift = class.blocks_per_segment_shift(self.segment_shift);
        // 8 to 32 blocks to a segment, so that a stripe of two segments
        // holds at most 64 blocks (a class of 64 to a segment would hold a
        // whole segment ahead, as its spare does); at least two segments
        // whatever `STRIPE_BLOCKS` says, fewer only where the budget below
        // allows fewer.
        let several = (STRIPE_MIN_BLOCKS_SHIFT..=STRIPE_MAX_BLOCKS_SHIFT).contains(&shift);
        // Within the word's 255 blocks: with `STRIPE` 3 a class of 128
        // blocks to a segment (16 B at 16 MiB) gets one segment.
        let want = (STRIPE_BLOCKS >> shift)
            .clamp(2, 64)
            .min((255 >> shift).max(1));
        let on = match STRIPE {
            0 => false,
            1 => several && !class.is_wide(),
            2 => several,
            _ => true,
        };
        if !on || self.flags & NO_SPARES != 0 {
            return 0;
        }
        let room = self.budget_bytes() >> (STRIPE_BUDGET_SHIFT + self.segment_shift);
        (want as u64).min(room) as u32
    }

    #[inline(always)]
    fn stripe(&self, class: SizeClass) -> &Word {
        &self.region(self.stripe_at(class.index()), 1)[0]
    }

    /// The block `j` of stripe `word` of `class`.
    #[inline(always)]
    pub(crate) fn stripe_block(&self, class: SizeClass, word: StripeWord, j: u32) -> BlockId {
        let shift = class.blocks_per_segment_shift(self.segment_shift);
        self.block_id(word.first().unwrap_or(0)).advanced(j, shift)
    }

    /// A slot install's draw from `class`'s stripe (the class must have
    /// one: [`Heap::stripe_segments`] above 0): a block, or none (the
    /// stripe is closed: claim it elsewhere). See the module docs.
    #[inline(never)]
    pub(crate) fn draw_from_stripe(&self, class: SizeClass) -> Option<BlockId> {
        if self.take_lower_request(class) {
            self.drain_stripe(class);
        }
        let word = self.stripe(class);
        let mut round = 0;
        let mut reopened = false;
        loop {
            // acq_rel: the acquire reads the format of the drawn block
            // through the publishing exchange's release sequence (module
            // docs); the release orders nothing and comes with the RMW.
            let seen = StripeWord(arch::fetch_add_acq_rel(word, 1));
            let (i, len) = (seen.drawn(), seen.len());
            if i < len {
                return Some(self.stripe_block(class, seen, i));
            }
            if i == len {
                return self.refill_stripe(class, seen);
            }
            if seen.is_closed() {
                // Reopened once per draw where the segment tree has a
                // segment again (the heap ran out for a moment): else the
                // class would claim on every install, spareless, until the
                // next reclaim or flush. A CAS from the closed word as it
                // is now (a closed word holds no block, so nothing is
                // retired; if another drawer reopened it first the CAS
                // fails and this one draws from what is there). acq_rel,
                // as every replacement.
                if reopened || self.segment_tree().successor(0).is_none() {
                    return None;
                }
                reopened = true;
                let now = arch::load_relaxed(word);
                if StripeWord(now).is_closed() {
                    let _ = arch::compare_exchange_acq_rel(word, now, StripeWord::EMPTY.0);
                }
                continue;
            }
            // Past the end: wait for the refiller's exchange.
            loop {
                // Relaxed: only a change is waited for; the add above
                // acquires what the new version published.
                let now = StripeWord(arch::load_relaxed(word));
                if now.version() != seen.version() || now.drawn() <= len || now.is_closed() {
                    break;
                }
                arch::backoff(round);
                round += 1;
            }
        }
    }

    /// The refiller's part: publishes a fresh stripe with its first block
    /// drawn for the caller, or a closed word; retires what it displaced.
    #[inline(never)]
    fn refill_stripe(&self, class: SizeClass, exhausted: StripeWord) -> Option<BlockId> {
        let fresh = self.claim_stripe(class, exhausted);
        let published = if fresh.is_empty() {
            StripeWord(CLOSED as u64)
        } else {
            fresh.with_drawn(1)
        };
        // acq_rel, as every replacement (module docs). An exchange: draws
        // keep adding to the word meanwhile.
        let displaced = StripeWord(arch::swap_acq_rel(self.stripe(class), published.0));
        self.retire_stripe(class, displaced);
        (!fresh.is_empty()).then(|| self.stripe_block(class, fresh, 0))
    }

    /// A fresh stripe for `class`, none drawn, to follow `exhausted` (the
    /// version its refiller found drawn out, or an empty word): adjacent
    /// whole segments from the lowest free one, or, where those skip
    /// segments formatted for the class that have free blocks
    /// ([`STRIPE_REUSE`]), the lowest run of such blocks instead. Empty if
    /// the heap had neither.
    ///
    /// The class tree is looked at only when the free segments taken
    /// suggest a skip: their run is shorter than asked (a segment that is
    /// not free cuts it), or it does not start where a refill in address
    /// order would go on (the segment after `exhausted`'s last block, that
    /// block's own segment if the segment has blocks after it, segment 0
    /// after a drain); then the taken segments go back to the segment tree
    /// if the class tree has a lower segment. A burst on a fresh heap,
    /// whose stripes follow one another, never looks: the two loads of the
    /// class tree on every refill made 32–256 B allocation 7–10% slower
    /// (the class's drawers wait for each refill).
    #[inline(always)]
    fn claim_stripe(&self, class: SizeClass, exhausted: StripeWord) -> StripeWord {
        // `stripe_segments` keeps `len` within 255 blocks; 1 where the
        // class has no stripe on this heap (the loom hooks, the tests).
        let want = self.stripe_segments(class).max(1);
        let shift = class.blocks_per_segment_shift(self.segment_shift);
        let run_blocks = |b: BlockId, len: u32| StripeWord::new(self.global(b), len, 0);
        let Some((first, count)) = self.take_stripe_run(want) else {
            // No free segment: only the class's own free blocks are left.
            return self
                .claim_stripe_blocks(class, u32::MAX)
                .map_or(StripeWord::EMPTY, |(b, len)| run_blocks(b, len));
        };
        let next = if exhausted.is_empty() {
            0
        } else {
            let last = self.stripe_block(class, exhausted, exhausted.len() - 1);
            last.segment() + (last.in_segment() + 1 == 1 << shift) as u32
        };
        if (count < want || first != next)
            && let Some((b, len)) = self.claim_stripe_blocks(class, first)
        {
            #[cfg(test)]
            REUSED_RUNS.fetch_add(1, core::sync::atomic::Ordering::Relaxed);
            self.return_stripe_run(first, count);
            return run_blocks(b, len);
        }
        self.format_stripe_run(class, first, count);
        let first = self.global(BlockId::whole_segment(first));
        StripeWord::new(first, count << shift, 0)
    }

    /// Gives back the blocks of `displaced` never drawn: one bitmap RMW
    /// and one segment-table add per segment (per bitmap word where a
    /// segment holds more than 64 blocks), not per block, since a drain
    /// runs inside a draw ([`Heap::lower_stripe`]).
    #[inline(never)]
    fn retire_stripe(&self, class: SizeClass, displaced: StripeWord) {
        let shift = class.blocks_per_segment_shift(self.segment_shift);
        let undrawn = displaced.undrawn();
        let mut j = undrawn.start;
        while j < undrawn.end {
            let b = self.stripe_block(class, displaced, j);
            // To the end of the block's segment or bitmap word.
            let at = b.in_segment();
            let room = ((1u32 << shift) - at).min(64 - (at & 63));
            let count = room.min(undrawn.end - j);
            self.release_blocks(class, b.segment(), at, count);
            j += count;
        }
    }

    /// After a block's return gave `segment` of `class` back to the
    /// segment tree (a `free`, mostly): if the class's stripe starts above
    /// that segment and has blocks undrawn, asks the class's next draw to
    /// drain it first ([`Heap::draw_from_stripe`]), so that the draw
    /// refills from the lowest free segments instead of drawing what lies
    /// above. Without it a warm burst (one after frees emptied the heap)
    /// drew the last burst's leftover, high, then refilled low, and the
    /// blocks it left undrawn at its end lay inside its span: 256 B spanned
    /// 1.26–1.37 of what was asked (`docs/PERF.md`, "A stripe lowered after
    /// the frees below it"). A request, not the drain itself: the drain's
    /// give-back inside `free` cost `heap_free` spills under its
    /// 32-register bound. A segment retires once per lifetime, so this is
    /// one relaxed load per retirement, and a store where the stripe lies
    /// above.
    #[inline(never)]
    pub(crate) fn lower_stripe(&self, class: SizeClass, segment: u32) {
        if self.stripe_segments(class) == 0 {
            return;
        }
        // Relaxed, both: a hint. Any stripe the next draw finds is drained
        // safely (the drain swaps whatever is there), so a stale read
        // costs at most one needless refill or one burst drawn high.
        let seen = StripeWord(arch::load_relaxed(self.stripe(class)));
        let above = seen
            .first()
            .is_some_and(|f| self.block_id(f).segment() > segment);
        if above && !seen.undrawn().is_empty() {
            arch::store_relaxed(self.stripe_lower_request(class), 1);
        }
    }

    /// Whether a draw should drain the stripe first ([`Heap::lower_stripe`]):
    /// the second word of the stripe's line.
    #[inline(always)]
    fn stripe_lower_request(&self, class: SizeClass) -> &Word {
        &self.region(self.stripe_at(class.index()) + 1, 1)[0]
    }

    /// Takes a lowering request if there is one: true for the one caller
    /// that should drain.
    #[inline(always)]
    fn take_lower_request(&self, class: SizeClass) -> bool {
        let request = self.stripe_lower_request(class);
        // A load first: the word is almost always 0, and every draw reads
        // it. The swap is acq_rel only because no relaxed swap is wrapped;
        // the drain orders itself (module docs).
        arch::load_relaxed(request) != 0 && arch::swap_acq_rel(request, 0) != 0
    }

    /// Empties `class`'s stripe, giving back every block not drawn
    /// (reclaim, flush, and a draw asked to lower it). Safe while others
    /// draw: a draw after the swap refills.
    pub(crate) fn drain_stripe(&self, class: SizeClass) {
        let word = self.stripe(class);
        // A load first: most classes have no stripe, and an empty word
        // with nothing drawn needs no RMW. Relaxed: a stripe published
        // after this load is as new as any the class claims after the
        // drain, and its blocks serve the class's next draws.
        if arch::load_relaxed(word) == StripeWord::EMPTY.0 {
            return;
        }
        // acq_rel, as every replacement.
        let displaced = StripeWord(arch::swap_acq_rel(word, StripeWord::EMPTY.0));
        self.retire_stripe(class, displaced);
    }

    /// Blocks of `class`'s stripe never drawn, from a snapshot of the
    /// metadata (`HeapStats`).
    pub(crate) fn undrawn_in_snapshot(&self, class: SizeClass, words: &[u64]) -> u32 {
        let word = StripeWord(words[self.stripe_at(class.index()) as usize]);
        word.undrawn().len() as u32
    }
}

/// Loom models (`tests/loom.rs`), which reach the allocator through the
/// public handle: a draw from the stripe of the slice class of `size`
/// bytes whatever [`STRIPE`] says (a claim of one segment when it
/// refills), as a global block id; giving such a block back; draining.
#[cfg(loom)]
impl Heap {
    #[doc(hidden)]
    pub fn loom_draw_from_stripe(&self, size: u64) -> Option<u64> {
        let class = slice_class_of(size, self.segment_shift);
        self.draw_from_stripe(class).map(|b| self.global(b))
    }

    #[doc(hidden)]
    pub fn loom_release_drawn(&self, size: u64, global: u64) {
        let class = slice_class_of(size, self.segment_shift);
        self.release_block(class, self.block_id(global));
    }

    /// Gives back block `block` of `segment` of the slice class of `size`
    /// bytes (as `loom_claim_one_slice_block` names it).
    #[doc(hidden)]
    pub fn loom_release_claimed(&self, size: u64, (segment, block): (u32, u32)) {
        let class = slice_class_of(size, self.segment_shift);
        self.release_block(class, BlockId::new(segment, block));
    }

    #[doc(hidden)]
    pub fn loom_drain_stripe(&self, size: u64) {
        self.drain_stripe(slice_class_of(size, self.segment_shift));
    }
}

/// The slice class of `size` bytes at segments of 2^`segment_shift`
/// bytes, for the loom hooks and the tests.
#[cfg(any(test, loom))]
fn slice_class_of(size: u64, segment_shift: u32) -> SizeClass {
    match crate::class::Request::for_size(size, segment_shift) {
        crate::class::Request::Class(c) if c.is_slice() => c,
        r => panic!("{size} B is no slice class: {r:?}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields() {
        let w = StripeWord::new(12345, 64, 3);
        assert_eq!((w.first(), w.len(), w.drawn()), (Some(12345), 64, 3));
        assert_eq!(w.undrawn(), 3..64);
        assert_eq!(StripeWord(w.0 + 100).undrawn(), 64..64, "past the end");
        assert_eq!(StripeWord(w.0 + 100).len(), 64, "adds count in drawn only");
        assert!(StripeWord::EMPTY.is_empty() && !StripeWord::EMPTY.is_closed());
        let closed = StripeWord(CLOSED as u64 + 5);
        assert!(closed.is_closed() && closed.undrawn().is_empty());
        assert_eq!(closed.version(), StripeWord::EMPTY.version());
        assert_eq!(StripeWord::EMPTY.first(), None);
        let top = StripeWord::new(BLOCK_MASK - 1, 255, 0);
        assert_eq!((top.first(), top.len()), (Some(BLOCK_MASK - 1), 255));
    }
}

/// The protocol on a heap in memory, whatever `GPUMALLOC_STRIPE` says:
/// these call the draw itself, whose claims take one segment when the
/// class has no stripe on the heap (`claim_stripe`).
#[cfg(all(test, not(loom)))]
mod heap_tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::class::MIN_SEGMENT_SHIFT;
    use crate::layout::Stat;
    use crate::layout::test_support::test_heap_of;
    use std::string::String;
    use std::vec;

    /// The 256 B class at 2 MiB segments: two 1 MiB blocks a segment.
    fn class_256() -> SizeClass {
        slice_class_of(256, MIN_SEGMENT_SHIFT)
    }

    #[test]
    fn draws_take_the_stripes_blocks_in_address_order() {
        let (h, _words) = test_heap_of(8, 8, MIN_SEGMENT_SHIFT);
        let class = class_256();
        let addresses: Vec<u64> = (0..6)
            .map(|_| h.block_address(class, h.draw_from_stripe(class).expect("a block")))
            .collect();
        let block = 1u64 << class.block_shift(MIN_SEGMENT_SHIFT);
        // Stripes of one segment on this small heap, claimed from the
        // lowest ids: every block right after the one before.
        for pair in addresses.windows(2) {
            assert_eq!(pair[1], pair[0] + block, "{addresses:x?}");
        }
        assert_eq!(h.free_segments(), 5, "three segments drawn");
    }

    /// Threads draw until the heap is out: every block of every segment
    /// is drawn exactly once, the last draws see the closed word instead
    /// of waiting for ever, and the heap comes back whole once the blocks
    /// are given back and the stripe drained. Fails if a refill published
    /// its own block as undrawn (two drawers of one block), or if a
    /// waiter could miss the closed word (the test hangs).
    #[test]
    fn racing_draws_take_every_block_once() {
        for round in 0..50 {
            let (h, _words) = test_heap_of(16, 16, MIN_SEGMENT_SHIFT);
            let class = class_256();
            let h = &h;
            let mut drawn: Vec<u64> = std::thread::scope(|s| {
                let workers: Vec<_> = (0..4)
                    .map(|_| {
                        s.spawn(move || {
                            core::iter::from_fn(|| h.draw_from_stripe(class))
                                .map(|b| h.global(b))
                                .collect::<Vec<_>>()
                        })
                    })
                    .collect();
                workers
                    .into_iter()
                    .flat_map(|w| w.join().unwrap())
                    .collect()
            });
            drawn.sort_unstable();
            let count = drawn.len();
            drawn.dedup();
            assert_eq!((count, drawn.len()), (32, 32), "round {round}");
            assert_eq!(h.free_segments(), 0);
            for g in drawn {
                h.release_block(class, h.block_id(g));
            }
            h.drain_stripe(class);
            assert_eq!(h.free_segments(), 16, "round {round}: whole again");
            assert!(h.draw_from_stripe(class).is_some(), "the drain reopened it");
        }
    }

    /// A held segment's claim that ends up with blocks in several runs
    /// (another claimer took one in the middle) keeps the lowest run and
    /// gives back each of the others with their counts: the blocks it
    /// gives back are free again and the segment comes back whole with
    /// the rest. Fails if a run of the rest is skipped or given back
    /// twice.
    #[test]
    fn a_claim_in_several_runs_keeps_the_lowest() {
        let Some((h, _words, class)) = striped_heap() else {
            return;
        };
        let shift = class.blocks_per_segment_shift(MIN_SEGMENT_SHIFT);
        let per = 1u32 << shift;
        let segment0: Vec<BlockId> = (0..per)
            .map(|_| h.draw_from_stripe(class).expect("a block"))
            .collect();
        assert!(segment0.iter().all(|b| b.segment() == 0));
        // Blocks 1, 2, 4, 5, 6 and the last: runs at 1, 4 and per - 1.
        let held = 0b0111_0110u64 | 1 << (per - 1);
        assert_eq!(h.keep_lowest_run(class, 0, held), (1, 2));
        let bitmap = h.bitmap(0);
        for k in 0..per {
            let given_back = held & 1 << k != 0 && !(1..3).contains(&k);
            assert_eq!(bitmap.is_free(k), given_back, "block {k}");
        }
        for b in segment0 {
            if !bitmap.is_free(b.in_segment()) {
                h.release_block(class, b);
            }
        }
        h.drain_stripe(class);
        assert_eq!(h.free_segments(), 256, "whole again");
    }

    /// Threads draw and give back blocks in random order while another
    /// claims and returns blocks of the same class the ordinary way, so
    /// refills keep finding partly used segments and race other claimers
    /// for their bits: no block is ever held twice at once, and the heap
    /// comes back whole. Fails if a held segment's claim kept bits of
    /// another reservation or lost a reservation with no bit (a block held
    /// twice, a scan that never ends, or a heap not whole).
    #[test]
    fn refills_from_held_segments_race_other_claims() {
        use std::sync::atomic::{AtomicBool, Ordering};
        let class = (0..crate::class::SLICE_CLASSES)
            .filter_map(SizeClass::new)
            .find(|c| (3..=5).contains(&c.blocks_per_segment_shift(MIN_SEGMENT_SHIFT)))
            .expect("a class of 8 to 32 blocks to a segment");
        let reused_before = REUSED_RUNS.load(core::sync::atomic::Ordering::Relaxed);
        for round in 0..50u64 {
            let (h, _words) = test_heap_of(16, 16, MIN_SEGMENT_SHIFT);
            let h = &h;
            let held: Vec<AtomicBool> = (0..1 << 16).map(|_| AtomicBool::new(false)).collect();
            let held = &held;
            let take = move |b: BlockId| {
                let was = held[h.global(b) as usize].swap(true, Ordering::Relaxed);
                assert!(!was, "round {round}: {b:?} handed out twice");
                b
            };
            let give = move |b: BlockId| {
                held[h.global(b) as usize].store(false, Ordering::Relaxed);
                h.release_block(class, b);
            };
            std::thread::scope(|s| {
                for t in 0..3u64 {
                    s.spawn(move || {
                        let mut rng = round * 7919 + t * 104_729 + 1;
                        let mut mine: Vec<BlockId> = Vec::new();
                        for _ in 0..400 {
                            rng ^= rng << 13;
                            rng ^= rng >> 7;
                            rng ^= rng << 17;
                            if mine.len() < 12 && rng % 3 != 0 {
                                if let Some(b) = h.draw_from_stripe(class) {
                                    mine.push(take(b));
                                }
                            } else if !mine.is_empty() {
                                give(mine.swap_remove(rng as usize % mine.len()));
                            }
                        }
                        mine.into_iter().for_each(give);
                    });
                }
                s.spawn(move || {
                    for _ in 0..200 {
                        let claim = h.claim_blocks(class, 3);
                        let got: Vec<BlockId> = (0..claim.count())
                            .map(|r| take(claim.take(h, class, r)))
                            .collect();
                        got.into_iter().for_each(give);
                    }
                });
            });
            h.drain_stripe(class);
            h.retire_idle_segments();
            assert_eq!(h.free_segments(), 16, "round {round}: whole again");
            assert_eq!(h.stat_value(Stat::DoubleFrees), 0, "round {round}");
        }
        assert!(
            REUSED_RUNS.load(core::sync::atomic::Ordering::Relaxed) > reused_before,
            "no refill took a held segment's blocks"
        );
    }

    /// A slice class that draws from a stripe on a heap of 256 segments of
    /// 2 MiB (budget room for it), and that heap.
    /// None with `GPUMALLOC_STRIPE=0`, which gives no class a stripe.
    fn striped_heap() -> Option<(Heap, Vec<Word>, SizeClass)> {
        let (h, words) = test_heap_of(256, 256, MIN_SEGMENT_SHIFT);
        let class = (0..crate::class::SLICE_CLASSES)
            .filter_map(SizeClass::new)
            .find(|&c| h.stripe_segments(c) > 0);
        assert!(class.is_some() || STRIPE == 0, "a class with a stripe");
        class.map(|c| (h, words, c))
    }

    /// Draws every block of `class`'s first stripe, then the second
    /// stripe's first block: (the first stripe's blocks in order, that
    /// block).
    fn draw_a_stripe_and_one(h: &Heap, class: SizeClass) -> (Vec<BlockId>, BlockId) {
        let shift = class.blocks_per_segment_shift(MIN_SEGMENT_SHIFT);
        let first: Vec<BlockId> = (0..h.stripe_segments(class) << shift)
            .map(|_| h.draw_from_stripe(class).expect("a block"))
            .collect();
        let high = h
            .draw_from_stripe(class)
            .expect("the second stripe's first block");
        (first, high)
    }

    /// Block classes have no stripe line, whatever their blocks per
    /// segment: `lower_stripe` runs on their frees too and must not read
    /// or write past the stripe region (a block class of 8 to 32 blocks
    /// to a segment would index into the segment states). Fails without
    /// the slice-class check in `stripe_segments`.
    #[test]
    fn block_classes_have_no_stripe() {
        let (h, _words) = test_heap_of(256, 256, MIN_SEGMENT_SHIFT);
        for class in (0..crate::class::CLASSES).filter_map(SizeClass::new) {
            if !class.is_slice() {
                assert_eq!(h.stripe_segments(class), 0, "{class:?}");
            }
        }
    }

    /// A free that gives back a segment below the stripe has the next
    /// draw drain it and refill from the lowest segments: the warm burst's
    /// order that kept the 256 B span at 1.26. Fails without
    /// `lower_stripe` (the next draw takes one of the second stripe's
    /// undrawn blocks, high) and if the drain's batched give-back lost or
    /// doubled a block (the heap would not come back whole).
    #[test]
    fn a_free_below_the_stripe_has_the_next_draw_lower_it() {
        let Some((h, _words, class)) = striped_heap() else {
            return;
        };
        let segments = h.stripe_segments(class);
        let (first, high) = draw_a_stripe_and_one(&h, class);
        assert!(first.iter().all(|b| b.segment() < high.segment()));
        assert_eq!(h.free_segments(), 256 - 2 * segments);
        for &b in &first {
            h.release_block(class, b);
        }
        assert_eq!(h.free_segments(), 256 - segments, "the first stripe back");
        let next = h.draw_from_stripe(class).expect("a block");
        assert_eq!(
            next.segment(),
            0,
            "drained, and refilled from the lowest ids"
        );
        assert_eq!(
            h.free_segments(),
            256 - segments - 1,
            "the second stripe's undrawn blocks back, but the drawn one's segment"
        );
        // Nothing below the new stripe: freeing the high block asks nothing.
        h.release_block(class, high);
        let again = h.draw_from_stripe(class).expect("a block");
        assert_eq!(again.segment(), next.segment(), "{again:?} after {next:?}");
        h.release_block(class, next);
        h.release_block(class, again);
        h.drain_stripe(class);
        assert_eq!(h.free_segments(), 256, "whole again");
    }

    /// A segment that one block still holds (a slot's, from the last
    /// burst) lies below the free segments after the frees: the refill
    /// after the drain takes its first run of free blocks, and the next
    /// refill its second run although a whole stripe's worth of free
    /// segments follows it (the last stripe ended inside the segment), so a
    /// warm burst does not leave them idle inside its span. Fails without
    /// `claim_stripe_blocks` (the draw after the drain goes to segment 1),
    /// if the second run is skipped, if a run's claim loses or doubles a
    /// block (the heap would not come back whole), or if it hands out the
    /// held block again.
    #[test]
    fn a_refill_takes_the_free_blocks_of_a_held_segment_first() {
        let Some((h, _words, class)) = striped_heap() else {
            return;
        };
        if !STRIPE_REUSE {
            return;
        }
        let shift = class.blocks_per_segment_shift(MIN_SEGMENT_SHIFT);
        let per = 1u32 << shift;
        let (first, high) = draw_a_stripe_and_one(&h, class);
        // Block 2 of segment 0 stays held; everything else comes back, so
        // every other segment is free and the free run right after segment
        // 0 is as long as a stripe asks.
        let held = first[2];
        assert_eq!((held.segment(), held.in_segment()), (0, 2));
        for &b in first.iter().filter(|&&b| b != held) {
            h.release_block(class, b);
        }
        h.release_block(class, high);
        let drawn: Vec<(u32, u32)> = (0..per)
            .map(|_| {
                let b = h.draw_from_stripe(class).expect("a block");
                (b.segment(), b.in_segment())
            })
            .collect();
        let want: Vec<(u32, u32)> = (0..per)
            .filter(|&j| j != 2)
            .map(|j| (0, j))
            .chain([(1, 0)])
            .collect();
        assert_eq!(
            drawn, want,
            "segment 0's runs, then the lowest free segment"
        );
        for &(segment, block) in &drawn {
            h.release_block(class, BlockId::new(segment, block));
        }
        h.release_block(class, held);
        h.drain_stripe(class);
        assert_eq!(h.free_segments(), 256, "whole again");
    }

    /// `bench frag`'s segment map: free blocks of a partly used segment
    /// by count, a stripe's undrawn blocks as `u`, free segments as `.`.
    #[test]
    fn the_segment_map_names_what_each_segment_holds() {
        let Some((h, words, class)) = striped_heap() else {
            return;
        };
        let segments = h.stripe_segments(class);
        let (first, high) = draw_a_stripe_and_one(&h, class);
        h.release_block(class, first[0]);
        h.release_block(class, first[1]);
        let snapshot: Vec<u64> = words.iter().map(arch::load_relaxed).collect();
        let marks: Vec<u8> = (0..3 * segments + 1)
            .map(|s| crate::stats::segment_mark(&h, &snapshot, s))
            .collect();
        let mut want = vec![b'2'];
        want.extend((1..segments).map(|_| b'0'));
        want.extend((0..segments).map(|_| b'u'));
        want.extend((0..segments + 1).map(|_| b'.'));
        assert_eq!(
            String::from_utf8_lossy(&marks),
            String::from_utf8_lossy(&want)
        );
        for b in first.into_iter().skip(2).chain([high]) {
            h.release_block(class, b);
        }
        h.drain_stripe(class);
        assert_eq!(h.free_segments(), 256, "whole again");
    }

    /// The flush kernel empties stripes through slot 0's flush
    /// (`heap_flush` runs one thread per slot, not `flush_slots`).
    #[test]
    fn slot_0s_flush_gives_back_the_undrawn_blocks() {
        let (h, _words) = test_heap_of(8, 8, MIN_SEGMENT_SHIFT);
        let class = class_256();
        let b = h.draw_from_stripe(class).expect("a block");
        assert_eq!(h.free_segments(), 7);
        h.flush_slot(class, 1);
        assert_eq!(h.free_segments(), 7, "another slot's flush leaves it");
        h.flush_slot(class, 0);
        h.release_block(class, b);
        assert_eq!(h.free_segments(), 8);
    }
}
