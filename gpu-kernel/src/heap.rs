//! `malloc` and `free` on a [`Heap`]: the three tiers put together.
//!
//! - Slice classes (16 B … 128 KiB): a warp team reserves slices from the block
//!   in its slot ([`crate::team`]); the installer claims blocks here.
//! - Block classes (256 KiB … one segment): one block per call, claimed from the
//!   class tree or from a freshly formatted segment.
//! - Above a segment: a run of segments claimed from the top of the segment
//!   tree ([`crate::run`]).
//!
//! Segment, block and slice geometry follow the heap's segment shift
//! (`Heap::segment_shift`, fixed when the heap is laid out), a field of the
//! handle rather than a constant: `docs/PERF.md` has what that costs.
//!
//! Claiming a block: take the lowest segment of the class tree (after a lost
//! race, another of its tree word, picked per warp) and reserve one of its
//! free blocks in the segment table (with one subtract, which may overdraw
//! and give back, `SegmentTable::reserve_blocks_add`; slice classes with a
//! CAS instead when built with `GPUMALLOC_SLICE_CLAIM_ADD=0`), then take a
//! bit of its bitmap; if the class tree is empty, claim the lowest free
//! segment and format it, or, under the class's format lock, as many of
//! them as the claimers in flight want.
//! Returning a block: set its bitmap bit, then count it in the segment table;
//! the segment joins its class tree when it gets its first free block and goes
//! back to the segment tree when its last block comes back.
//!
//! Class-tree membership is a hint kept eventually right: a thread that finds a
//! segment there which cannot serve the class removes it, then re-reads the
//! state and re-inserts it if it can serve after all (the state may have
//! changed between the two). Between that remove and re-insert a segment
//! with free blocks is in no tree: each such drop is a *window*, counted in
//! its class's out-of-tree word, and a claim answers null only after a look
//! at the trees during which no window of its class was open or opened
//! ([`Heap::claim_blocks_settled`]; `docs/PERF.md`, "The null beside free
//! blocks").

use core::ptr;

use crate::arch::{self, Word};
use crate::block::{self, BlockBitmap, CHECK_WORDS_PER_BLOCK, CheckedFree, run_mask};
use crate::class::{
    CLASSES, MIN_SLICE_BLOCK_SHIFT, Request, SizeClass, bitmap_words_per_segment, classes,
};
use crate::layout::{CHECK_DOUBLE_FREE, Heap, Stat, TRAP_ON_MISUSE};
use crate::segment::{Grab, Previous, Reservation, Return, SegmentState, SegmentTable};
use crate::veb::VebTree;

/// With `COUNTED_FORMAT=0` (since the eleventh session of 2026-11-24 the
/// default formats every such slice class counted, and this and
/// `LARGE_HEAP_UNLOCKED_FORMAT_SHIFT` only choose what `COUNTED_FORMAT=1`
/// counts): a slot installer that takes at least 1 / 2^this of a new
/// segment's blocks formats it without the class's format lock (1 unless
/// `GPUMALLOC_UNLOCKED_FORMAT_SHIFT` is set at build time). Installers of a
/// class are at most one per slot, so a herd leaves at most a segment per
/// slot in the class tree, and the next claims of the class use it before
/// any other segment. Under the lock the formats are serial: 128 B slices at
/// 8 MiB segments (16 blocks, slot claims of 4) format 16 segments one after
/// another for 2^20 allocations. 2 (a quarter) made that size 36% faster than
/// be7ddc7 on the H100 (+4% with 1), but left the 256 MiB heap of random
/// 16 B-64 KiB requests 86.7% used at the first null against 91.4% with 1,
/// below issue 12's 90% floor (`docs/PERF.md`, "Issue 12: slice path vs
/// be7ddc7"), so the default stays 1.
const UNLOCKED_FORMAT_SHIFT: u32 =
    crate::class::build_knob(option_env!("GPUMALLOC_UNLOCKED_FORMAT_SHIFT"), 1);
/// `UNLOCKED_FORMAT_SHIFT` on heaps of 2^`team::LARGE_HEAP_SHIFT` bytes
/// and more (`GPUMALLOC_LARGE_HEAP_UNLOCKED_FORMAT_SHIFT`; 2 by default:
/// the quarter rule, 128 B 35% faster than be7ddc7 on the H100's 16 GiB
/// bench heap). Why only there: the quarter rule's herd leaves
/// at most a segment per slot of a class formatted; on the 256 MiB heap that
/// is 8 segments for 32 B slices, whose demand is under one block per round
/// (`docs/PERF.md`, "Where w6 and fmt2 strand"), while on a 16 GiB heap
/// it is at most 32 segments of 8 MiB (1.6%) for 128 B.
const LARGE_HEAP_UNLOCKED_FORMAT_SHIFT: u32 =
    crate::class::build_knob(option_env!("GPUMALLOC_LARGE_HEAP_UNLOCKED_FORMAT_SHIFT"), 2);

/// The format lock's word (one per class): bit 0 says a claimer holds it
/// and formats; the bits from `DEMAND_SHIFT` up count the blocks wanted by
/// the claimers in `claim_blocks` (of the classes that format under the
/// lock): what a format, which runs only when the class tree is empty,
/// should fill.
const FORMAT_HELD: u64 = 1;
const DEMAND_SHIFT: u32 = 1;
/// The formats in flight of a class that formats counted
/// ([`COUNTED_FORMAT`]): the lock word's bits from here up. The demand
/// below them stays far under 2^47 blocks (claimers in flight × at most
/// 64 blocks each).
const FORMATS_SHIFT: u32 = 48;
const FORMAT_ONE: u64 = 1 << FORMATS_SHIFT;
const DEMAND_MASK: u64 = FORMAT_ONE - 1;
/// Most segments one hold of a format lock formats: eight segment-tree
/// words (`VebTree::claim_low_many`, one word per RMW). The bench's block
/// classes at 8 MiB segments want 1,024 segments for half the 16 GiB heap,
/// and the ~1,056 warps `heap_alloc` keeps resident on the H100 want 132
/// (32 KiB, a block class until 2026-11-24), 264 (64 KiB) or 528 (128 KiB;
/// both block classes until 2026-11-25)
/// segments at once: capped at one
/// word (64), every one of these classes took 16 holds of the lock in a
/// row, each a lock hand-off, a format and a drain of the batch by its
/// claimers (`docs/PERF.md`, "Block-class batches beyond one tree word").
/// The batch is sized by the demand in flight, so under light load a block
/// class formats one segment. A slice class that formats locked
/// (`COUNTED_FORMAT=0` or `1`) formats at least one claim for
/// every slot of it (on the bench heap 64 B: four segments, 32 B: two,
/// 16 B: one), since a burst's first claimers arrive over a few
/// microseconds and batches sized by the first few left the rest queued on
/// the lock (`docs/PERF.md`, "A floor under the locked format's batch");
/// what a burst does not use stays formatted for the class until
/// `Heap::retire_idle_segments` gives it back.
const MAX_FORMAT_BATCH: u32 = 512;
/// A class's out-of-tree word (`Heap::out_of_tree`): its low 32 bits count
/// the windows open now (drops between their remove and their re-insert
/// decision, `Heap::drop_from_class_tree`), its high 32 bits the windows
/// ever opened (modulo 2^32). A window opens with one add of
/// `WINDOW_OPENED + WINDOW_OPEN` and closes with one subtract of
/// `WINDOW_OPEN`, so the word is unchanged across a span only if no window
/// opened in it.
const WINDOW_OPEN: u64 = 1;
const WINDOW_OPENED: u64 = 1 << 32;
const WINDOWS_OPEN_MASK: u64 = WINDOW_OPENED - 1;
/// Whether the cold paths reachable from `heap_alloc` are cut into
/// smaller out-of-line functions that keep few values live across their
/// calls (`GPUMALLOC_SPLIT_COLD=1`, the default from 2026-11-23's eighth
/// session to 2026-11-24's fourteenth, when `=3` below became it; 0: the
/// code shape before, kept for comparison). ptxas
/// allocates a kernel's registers over everything it can call, and a
/// callee's registers avoid every register its callers hold across the
/// call, so the deepest chain of cold calls (install, settled claim,
/// claim, format) set `heap_alloc`'s 162 registers on sm_90 though its
/// own code needs about 50 (`docs/PERF.md`, "heap_alloc's registers: where
/// the 162 come from"). Split, the install is called through a pointer,
/// so ptxas compiles the call graph by the ABI: 98 registers, two
/// 256-thread blocks per SM instead of one. Behaviour is the same either
/// way; only which code is out of line and what each call carries changes.
/// On the H100 it made 16 B – 2 KiB allocations 9–17% faster and mixed 3%,
/// block classes 2–9% slower (`docs/PERF.md`, "The split shape becomes
/// the default").
pub(crate) const SPLIT_COLD: bool = SPLIT_COLD_LEVEL != 0;
/// `GPUMALLOC_SPLIT_COLD=3`: `SPLIT_COLD`, and [`Heap::malloc`] keeps a
/// slice allocation's loop at its home slot inline, the wait past a
/// block's end included (`Heap::slice_at_home`), with only the installing
/// leader's [`Heap::install`] called by the ABI; the stealing pass after
/// a failed install, the block classes, runs and the failure count go to
/// one out-of-line call, [`Heap::malloc_cold`], in tail position, so the
/// kernel holds nothing but its own state across it. Waiting teams make
/// no call and touch no local memory; with launch bounds of 64 registers
/// (`GPUMALLOC_ALLOC_BLOCKS_PER_SM=4`) ptxas spills only inside the cold
/// functions (`docs/PERF.md`, "heap_alloc in 64 registers with the wait
/// inline"). The default since 2026-11-24's fourteenth session, with
/// those launch bounds (the root `build.rs`): `heap_alloc` in 64
/// registers without a spill, slices 4-14% faster on the H100 than the
/// 96-register `=1`, block classes of 32-128 KiB 8-24% slower
/// (`docs/PERF.md`, "heap_alloc in 64 registers again").
pub(crate) const SPLIT_HOME: bool = SPLIT_COLD_LEVEL == 3;
const SPLIT_COLD_LEVEL: u32 = crate::class::build_knob(option_env!("GPUMALLOC_SPLIT_COLD"), 3);
// 2 was `split-tail` (only a slice's first step inline, waiting teams sent
// through the cold call): measured 25-45% slower than 1 at slice sizes and
// superseded by 3, so its code was removed (`docs/PERF.md`).
const _: () = assert!(
    SPLIT_COLD_LEVEL <= 3 && SPLIT_COLD_LEVEL != 2,
    "GPUMALLOC_SPLIT_COLD must be 0, 1 or 3 (2, split-tail, was removed)"
);
/// Slice classes reserve blocks with the block classes' one subtract
/// ([`SegmentTable::reserve_blocks_add`], ticketed takes);
/// `GPUMALLOC_SLICE_CLAIM_ADD=0` at build time brings back the
/// CAS reservation (`reserve_blocks_once`) for comparison. Why: at 16–64 B
/// a segment holds 32–128 blocks, more than a slot's claim of 4 shifted by
/// the unlocked-format rule, so the first installs of a burst share one
/// locked format and then raced CAS after CAS on its one table word; with
/// one add each they take 16 B × 2^20 from 0.150 to 0.085 ms, 32 B −40%,
/// 64 B −25%, 256 B −32%, the rest within ±3% (H100, kernel alone;
/// `docs/PERF.md`, "16 B's fixed cost").
pub(crate) const SLICE_CLAIM_ADD: bool =
    crate::class::build_knob(option_env!("GPUMALLOC_SLICE_CLAIM_ADD"), 1) != 0;
/// How the slice classes whose block fills a segment retry a lost race
/// for the segment tree's word (`GPUMALLOC_WHOLE_CLAIM_SALT`): 2, the
/// default, aims zero to three claims' width above the word's lowest ids
/// by [`spread_salt`] (`VebTree::claim_low_many_near`); 1 anywhere in the
/// word (`VebTree::claim_low_many`); 0 at the lowest ids again, as before
/// 2026-11-24. Their installs claim whole segments from the tree's lowest
/// word, and with every loser aiming at the same lowest ids a burst of
/// claimers took one round trip per winner. On the H100 (four processes
/// per build, interleaved): near, mixed 16–4096 B −19%, 2 / 4 / 8 / 16 KiB
/// −9 / −13 / −12 / −15%, spans as lowest-first within the runs' spread
/// (mixed 2.01–2.09 against 1.98–2.08, four runs each); anywhere, as fast
/// but the mixed span 2.01–2.22. The block class of one segment keeps the
/// lowest ids (spread anywhere it was 17% slower: its leaders claim up to
/// 32 ids at once) (`docs/PERF.md`, "Whole-segment claims spread").
pub(crate) const WHOLE_CLAIM_SALT: u32 =
    crate::class::build_knob(option_env!("GPUMALLOC_WHOLE_CLAIM_SALT"), 2);
/// Whether a claim of several whole segments (`Heap::claim_whole_segments`)
/// first aims at the lowest run of adjacent free ids in the tree word
/// (`VebTree::claim_adjacent_many_near`) rather than its lowest ids, which
/// under mixed sizes lie scattered between other classes' segments and cut
/// the claim's slot run short (`GPUMALLOC_WHOLE_CLAIM_ADJACENT`: 0 off,
/// 1 on; lost races aim as `WHOLE_CLAIM_SALT` 2 does).
pub(crate) const WHOLE_CLAIM_ADJACENT: bool =
    crate::class::build_knob(option_env!("GPUMALLOC_WHOLE_CLAIM_ADJACENT"), 0) != 0;
const _: () = assert!(
    WHOLE_CLAIM_SALT <= 2,
    "GPUMALLOC_WHOLE_CLAIM_SALT is 0, 1 or 2"
);

/// Which slice classes format *counted* (`GPUMALLOC_COUNTED_FORMAT`): a
/// claimer that finds the class tree empty formats a segment without the
/// lock only while the formats in flight cannot fill the demand in flight
/// (both counted in the format lock's word), and otherwise waits for
/// their blocks ([`Heap::counted_format_due`]). 2 (the default): every slice
/// class whose claim takes less than its segment; 1: only those that
/// formatted unlocked before (a slot's claim takes 1 /
/// 2^`unlocked_format_shift` of a segment or more); 0: none, the rules
/// before 2026-11-24's eleventh session (the others format locked
/// batches). Why: unlocked, each of a burst's first installers formatted
/// a segment of its own (32 per class on the bench heap) for a demand of
/// a few blocks, which mixed sizes left idle; locked, one thread formatted
/// the burst's batch while every slot's first claim waited. H100, kernel
/// alone, against 0: mixed 16–4096 B −10 … −13% with its idle blocks
/// 0.156 → 0.02 of what was asked, 16 / 32 / 64 B −5 … −10%, but 128 B
/// +20% and 256 B +8 … +11% alone (their bursts now format in waves
/// sized by the demand in flight instead of 32 segments at once); the
/// 128 B span 2.2–2.4 → 1.42 (`docs/PERF.md`, "Counted formats").
pub(crate) const COUNTED_FORMAT: u32 =
    crate::class::build_knob(option_env!("GPUMALLOC_COUNTED_FORMAT"), 2);
const _: () = assert!(COUNTED_FORMAT < 3, "GPUMALLOC_COUNTED_FORMAT is 0, 1 or 2");

/// Spreads salts for `VebTree::pick` over `u32` (2^32 / the golden ratio).
const SPREAD_HASH: u32 = 0x9e37_79b9;

/// A salt that spreads this warp's retries over a tree word
/// (`VebTree::pick`, `VebTree::claim_low_many`): its SM and its slot there,
/// hashed over `u32`; `attempt` varies it. Warps running at once get
/// different salts.
#[inline(always)]
fn spread_salt(attempt: u32) -> u32 {
    (arch::sm_id() << 6 ^ arch::warp_in_sm())
        .wrapping_add(attempt)
        .wrapping_mul(SPREAD_HASH)
}

/// A block claimed for a class: segment and block within it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BlockId {
    segment: u32,
    block: u32,
}

impl BlockId {
    /// Block `block` of segment `segment`.
    #[inline(always)]
    pub(crate) fn new(segment: u32, block: u32) -> BlockId {
        BlockId { segment, block }
    }

    /// The only block of a segment (classes whose block fills a segment).
    #[inline(always)]
    pub(crate) fn whole_segment(segment: u32) -> BlockId {
        BlockId { segment, block: 0 }
    }

    /// Its segment.
    #[inline(always)]
    pub(crate) fn segment(self) -> u32 {
        self.segment
    }

    /// Its index within its segment.
    #[inline(always)]
    pub(crate) fn in_segment(self) -> u32 {
        self.block
    }

    /// The block `j` blocks further on in address order, for segments of
    /// 2^`per_segment_shift` blocks (a slot run's blocks, `slot`).
    #[inline(always)]
    pub(crate) fn advanced(self, j: u32, per_segment_shift: u32) -> BlockId {
        let at = self.block + j;
        BlockId {
            segment: self.segment + (at >> per_segment_shift),
            block: at & ((1 << per_segment_shift) - 1),
        }
    }
}

/// Blocks a team leader claimed for its team, packed in one word so it can
/// be shuffled: `count` blocks of `segment`, either reserved in the segment
/// table (each member takes a bitmap bit; for a block class, first trying
/// the bit at the reservation's ticket plus its rank) or freshly formatted
/// (member `i` owns block `i`). A count of zero: nothing could be claimed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Claim(u64);

impl Claim {
    const FORMATTED: u64 = 1 << 48;
    /// A block class's reservation: bits `TICKET_SHIFT..` hold its ticket.
    const TICKETED: u64 = 1 << 49;
    /// Tickets are below the most blocks a segment holds (128,
    /// `class::max_blocks_per_segment`).
    const TICKET_SHIFT: u32 = 50;
    /// Not blocks but a task (`claim_blocks` with `team_format`): the
    /// leader holds its class's format lock and found the class tree
    /// empty; its team formats a batch of the segment count in the low
    /// bits ([`Heap::format_batch_team`]), which releases the lock. Its
    /// count is 0, so nothing takes it for blocks.
    const TEAM_FORMAT: u64 = 1 << 62;

    fn reserved(segment: u32, count: u32) -> Claim {
        Claim(segment as u64 | (count as u64) << 32)
    }

    fn ticketed(segment: u32, count: u32, ticket: u32) -> Claim {
        Claim(
            Claim::reserved(segment, count).0
                | Claim::TICKETED
                | (ticket as u64) << Claim::TICKET_SHIFT,
        )
    }

    fn formatted(segment: u32, count: u32) -> Claim {
        Claim(Claim::reserved(segment, count).0 | Claim::FORMATTED)
    }

    fn team_format(segments: u32) -> Claim {
        Claim(segments as u64 | Claim::TEAM_FORMAT)
    }

    /// Blocks of a segment this claim formatted: member `i` owns block
    /// `i`, so they lie in address order and taking one needs no RMW.
    #[inline(always)]
    pub(crate) fn is_formatted(self) -> bool {
        self.0 & Claim::FORMATTED != 0
    }

    #[inline(always)]
    fn is_team_format(self) -> bool {
        self.0 & Claim::TEAM_FORMAT != 0
    }

    #[inline(always)]
    pub(crate) fn count(self) -> u32 {
        (self.0 >> 32) as u16 as u32
    }

    #[inline(always)]
    fn segment(self) -> u32 {
        self.0 as u32
    }

    /// A reservation with a ticket (every slice claim with
    /// `SLICE_CLAIM_ADD`): its blocks are hinted at bits
    /// `ticket..ticket + count` of the segment's bitmap.
    #[inline(always)]
    pub(crate) fn is_ticketed(self) -> bool {
        self.0 & Claim::TICKETED != 0
    }

    /// A ticketed claim's ticket: the bit of its first block's hint.
    #[inline(always)]
    fn ticket(self) -> u32 {
        (self.0 >> Claim::TICKET_SHIFT) as u32
    }

    /// The block at a ticketed claim's ticket plus `rank`.
    #[inline(always)]
    pub(crate) fn at_ticket(self, rank: u32) -> BlockId {
        BlockId {
            segment: self.segment(),
            block: self.ticket() + rank,
        }
    }

    /// Takes the blocks of ranks `0..n` of a ticketed claim at their ticket
    /// bits with one RMW (only those in the bitmap word of the ticket, so
    /// `n` may shrink), and returns the ranks it got as a mask (bit r: the
    /// block [`Claim::at_ticket`]`(r)` is the caller's). The other ranks
    /// are taken by [`Claim::take`] as before. `n` is at most 32.
    #[inline(always)]
    pub(crate) fn take_at_ticket(self, heap: &Heap, n: u32) -> u32 {
        let at = self.ticket();
        let n = n.min(64 - (at & 63));
        let bits = ((1u64 << n) - 1) << (at & 63);
        (heap.bitmap(self.segment()).take_bits(at >> 6, bits) >> (at & 63)) as u32
    }

    /// The block of the member of rank `rank < count`.
    #[inline(always)]
    pub(crate) fn take(self, heap: &Heap, class: SizeClass, rank: u32) -> BlockId {
        let segment = self.segment();
        let block = if self.0 & Claim::FORMATTED != 0 {
            rank
        } else {
            // A ticketed claim (every add reservation: block classes, and
            // slices unless `SLICE_CLAIM_ADD` is off) tries the bit of its
            // ticket first, then scans from its word; a CAS reservation
            // starts the scan at word `rank`.
            let (start, first) = if self.0 & Claim::TICKETED != 0 {
                let at = self.ticket() + rank;
                (at >> 6, 1u64 << (at & 63))
            } else {
                (rank, 0)
            };
            heap.bitmap(segment).take_trying(
                class.blocks_per_segment(heap.segment_shift),
                start,
                first,
            )
        };
        BlockId { segment, block }
    }
}

impl Heap {
    #[inline(always)]
    pub(crate) fn region(&self, at: u64, len: u64) -> &[Word] {
        // SAFETY: `metadata` points to `metadata_words` words laid out by
        // `Heap::layout`, which the host keeps alive while kernels run; every
        // region asked for here lies inside it.
        unsafe {
            core::slice::from_raw_parts(
                (self.metadata as *const Word).add(at as usize),
                len as usize,
            )
        }
    }

    #[inline(always)]
    pub(crate) fn segment_tree(&self) -> VebTree<'_> {
        VebTree::new(
            self.region(self.trees_at, self.tree.words as u64),
            &self.tree,
        )
    }

    #[inline(always)]
    fn class_tree(&self, class: SizeClass) -> VebTree<'_> {
        let at = self.trees_at + (1 + class.index() as u64) * self.tree.words as u64;
        VebTree::new(self.region(at, self.tree.words as u64), &self.tree)
    }

    #[inline(always)]
    fn table(&self) -> SegmentTable<'_> {
        SegmentTable::new(self.region(self.states_at, self.segments as u64))
    }

    /// log2 of the slice blocks a segment can hold (16 B slices): what
    /// global block ids count in.
    #[inline(always)]
    fn slice_blocks_shift(&self) -> u32 {
        self.segment_shift - MIN_SLICE_BLOCK_SHIFT
    }

    /// The id slot words and counters use for slice block `b`.
    #[inline(always)]
    pub(crate) fn global(&self, b: BlockId) -> u64 {
        ((b.segment as u64) << self.slice_blocks_shift()) + b.block as u64
    }

    /// The block of global id `g` (see [`Heap::global`]).
    #[inline(always)]
    pub(crate) fn block_id(&self, g: u64) -> BlockId {
        BlockId {
            segment: (g >> self.slice_blocks_shift()) as u32,
            block: (g & ((1 << self.slice_blocks_shift()) - 1)) as u32,
        }
    }

    #[inline(always)]
    pub(crate) fn bitmap(&self, segment: u32) -> BlockBitmap<'_> {
        let per = bitmap_words_per_segment(self.segment_shift) as u64;
        BlockBitmap::new(self.region(self.bitmaps_at + segment as u64 * per, per))
    }

    #[inline(always)]
    pub(crate) fn counter(&self, global_block: u64) -> &Word {
        let b = self.block_id(global_block);
        &self.region(self.counters_at + self.counter_index(b.segment, b.block), 1)[0]
    }

    #[inline(always)]
    pub(crate) fn slice_bits(&self, global_block: u64) -> &[Word] {
        let per = CHECK_WORDS_PER_BLOCK as u64;
        self.region(self.slice_bits_at + global_block * per, per)
    }

    #[inline(always)]
    pub(crate) fn slot(&self, class: SizeClass, slot: u32) -> &Word {
        &self.region(self.slot_at(class.index(), slot), 1)[0]
    }

    #[inline(always)]
    fn format_lock(&self, class: SizeClass) -> &Word {
        &self.region(self.locks_at + class.index() as u64, 1)[0]
    }

    /// `class`'s out-of-tree window word (see `WINDOW_OPEN`).
    #[inline(always)]
    fn out_of_tree(&self, class: SizeClass) -> &Word {
        &self.region(self.out_of_tree_at(class.index()), 1)[0]
    }

    /// The word of [`Heap::whole_segment_runs_taken`].
    #[inline(always)]
    fn whole_segment_runs_word(&self) -> &Word {
        &self.region(self.whole_segment_runs_at(), 1)[0]
    }

    /// The run lock and the count of optimistic run claims in flight (see
    /// `run`).
    #[inline(always)]
    pub(crate) fn run_lock(&self) -> &Word {
        &self.region(self.locks_at + CLASSES as u64, 1)[0]
    }

    /// The run cursor: segments counted down from the top that optimistic
    /// run claims have been given (see `run`).
    #[inline(always)]
    pub(crate) fn run_cursor(&self) -> &Word {
        &self.region(self.run_cursor_at(), 1)[0]
    }

    #[inline(always)]
    pub(crate) fn stat(&self, stat: Stat) -> &Word {
        &self.region(self.stats_at + stat as u64, 1)[0]
    }

    /// Reads one statistics word (a snapshot).
    pub fn stat_value(&self, stat: Stat) -> u64 {
        arch::load_relaxed(self.stat(stat))
    }

    #[inline(always)]
    fn segment_address(&self, segment: u32) -> u64 {
        self.data + ((segment as u64) << self.segment_shift)
    }

    #[inline(always)]
    pub(crate) fn block_address(&self, class: SizeClass, b: BlockId) -> u64 {
        self.segment_address(b.segment)
            + ((b.block as u64) << class.block_shift(self.segment_shift))
    }

    /// Allocates `size` bytes. Returns null for size 0 and when the request
    /// cannot be met (too large, or the heap is exhausted); never blocks on
    /// other threads' progress except to wait for a block being installed.
    ///
    /// Slices are aligned to their size (16 B … 128 KiB), blocks to theirs,
    /// runs to a segment.
    #[inline]
    pub fn malloc(&self, size: u64) -> *mut u8 {
        if SPLIT_HOME {
            return self.malloc_home(size);
        }
        let address = match Request::for_size(size, self.segment_shift) {
            Request::Empty => return ptr::null_mut(),
            Request::Class(class) if class.is_slice() => self.malloc_slice(class),
            Request::Class(class) => self.malloc_block(class),
            Request::Segments(count) => self.by_value().malloc_run(count),
        };
        match address {
            Some(a) => a as *mut u8,
            None => {
                arch::fetch_add_relaxed(self.stat(Stat::FailedMallocs), 1);
                ptr::null_mut()
            }
        }
    }

    /// [`Heap::malloc`] with `SPLIT_HOME`: a slice request's loop at its
    /// home slot inline ([`Heap::slice_at_home`]), and what it leaves (the
    /// stealing pass after an install found no block) or any other request
    /// in one call to [`Heap::malloc_cold`] through a pointer the optimiser
    /// cannot see, so that ptxas calls it by the ABI and allocates it apart.
    #[inline(always)]
    fn malloc_home(&self, size: u64) -> *mut u8 {
        match Request::for_size(size, self.segment_shift) {
            Request::Empty => return ptr::null_mut(),
            Request::Class(class) if class.is_slice() => {
                if let Some(address) = self.slice_at_home(class) {
                    return address as *mut u8;
                }
            }
            _ => {}
        }
        let cold: fn(&Heap, u64) -> u64 = core::hint::black_box(Heap::malloc_cold);
        cold(&self.by_value(), size) as *mut u8
    }

    /// The handle an out-of-line call on the allocation paths gets: a copy
    /// ([`Heap::by_value`]) where these paths are inlined into a kernel,
    /// whose `self` is its parameter; with `SPLIT_HOME`, where they run
    /// inside [`Heap::malloc_cold`] (whose `self` is already
    /// a copy in local memory), `self` itself: a copy from there is a byte
    /// loop, 160 loads and stores.
    #[inline(always)]
    pub(crate) fn with_handle<R>(&self, call: impl FnOnce(&Heap) -> R) -> R {
        if SPLIT_HOME {
            call(self)
        } else {
            call(&self.by_value())
        }
    }

    /// Everything of [`Heap::malloc`] past `malloc_home`'s inline loop: for
    /// a slice class the stealing pass after the install at home found no
    /// block, for any other request the whole path. Returns the address or
    /// 0.
    #[inline(never)]
    #[cold]
    fn malloc_cold(&self, size: u64) -> u64 {
        let address = match Request::for_size(size, self.segment_shift) {
            Request::Empty => return 0,
            Request::Class(class) if class.is_slice() => self.malloc_slice_stealing(class),
            Request::Class(class) => self.malloc_block(class),
            Request::Segments(count) => self.malloc_run(count),
        };
        address.unwrap_or_else(|| {
            arch::fetch_add_relaxed(self.stat(Stat::FailedMallocs), 1);
            0
        })
    }

    /// [`Heap::malloc`] for a heap that the host grows while kernels run (a
    /// VMM heap with its growth service): a request that `malloc` cannot
    /// meet waits up to `wait_ns` nanoseconds (GPU global timer) for the
    /// segment tree to hold a free segment, tries again each time it does,
    /// and returns null when the time is up. `wait_ns` 0 is `malloc`.
    ///
    /// The first attempt is `malloc` itself, so a request that succeeds
    /// pays one comparison more and `malloc` is unchanged. Each failed
    /// attempt counts as a failed malloc in the statistics. While the tree
    /// holds a free segment that cannot serve the request (a run longer
    /// than what is free), the retries go on, with backoff, until the time
    /// is up. A run (more than a segment) that cannot be claimed is
    /// instead posted to the growth service, which stitches one from free
    /// segments that need not be adjacent and hands it back
    /// ([`crate::request`]); with no service, or when it cannot stitch,
    /// the answer is null. On a GPU the publishing kernel must find room to run beside
    /// the waiting kernel: a grid that fills the GPU with waiting threads
    /// gets nulls after `wait_ns`, never a hang.
    #[inline]
    pub fn malloc_waiting(&self, size: u64, wait_ns: u64) -> *mut u8 {
        let p = self.malloc(size);
        if !p.is_null() || wait_ns == 0 || size == 0 {
            return p;
        }
        self.by_value().wait_and_retry(size, wait_ns)
    }

    /// The waiting part of [`Heap::malloc_waiting`], out of line: the
    /// caller's kernel inlines one `malloc`, not two.
    #[cold]
    #[inline(never)]
    fn wait_and_retry(&self, size: u64, wait_ns: u64) -> *mut u8 {
        let deadline = arch::global_nanos().saturating_add(wait_ns);
        // A run: ask the growth service to stitch one from free segments
        // wherever they lie (`request`), retrying `malloc` meanwhile.
        if let Request::Segments(count) = Request::for_size(size, self.segment_shift) {
            return self.request_stitched_run(count, deadline) as *mut u8;
        }
        let mut round = 0;
        while arch::global_nanos() < deadline {
            if self.segment_tree().successor(0).is_some() {
                let p = self.malloc(size);
                if !p.is_null() {
                    return p;
                }
            }
            arch::backoff(round);
            round = round.saturating_add(1);
        }
        ptr::null_mut()
    }

    /// The block path: a warp team's leader claims blocks for the whole
    /// team at once; each member then takes its own.
    #[inline]
    fn malloc_block(&self, class: SizeClass) -> Option<u64> {
        // A whole-segment class whose segment tree had none left falls
        // through: the path below reclaims what slice classes hold idle and
        // tries again before a null.
        if class.blocks_per_segment(self.segment_shift) == 1
            && let Some(address) = self.with_handle(|h| h.malloc_whole_segment_block(class))
        {
            return Some(address);
        }
        loop {
            let (team, lane, leader, rank) = arch::warp_team(class.index());
            let mut claim = 0;
            if lane == leader {
                claim = self
                    .with_handle(|h| h.claim_blocks_for(class, team.count_ones(), true))
                    .0;
            }
            let mut claim = Claim(arch::shfl_u64(team, claim, leader));
            if claim.is_team_format() {
                claim = self.with_handle(|h| h.format_batch_team(class, team, claim.segment()));
            }
            if claim.count() == 0 {
                // Before failing, give back what slice classes hold idle and
                // try once more (the leader alone: one reclaim per team).
                let mut again = 0;
                if lane == leader {
                    again = self
                        .with_handle(|h| h.reclaim_and_claim(class, team.count_ones()))
                        .0;
                }
                claim = Claim(arch::shfl_u64(team, again, leader));
                if claim.count() == 0 {
                    return None;
                }
            }
            if rank < claim.count() {
                let block = claim.take(self, class, rank);
                if self.checked() {
                    mark_handed_out(self.block_bits(block.segment), block.block);
                }
                return Some(self.block_address(class, block));
            }
        }
    }

    /// A block class whose block fills a segment: the team's leader takes
    /// whole segments for the team with one RMW on the segment tree (up to
    /// one tree word's 64, as [`Heap::claim_whole_segments`] does for slice
    /// classes) and each member formats the one it takes, where
    /// the general path's claim serves one member per round (a segment
    /// holds one block), so a warp asking for 32 made 32 claims and format
    /// rounds one after another. Such a class never keeps a segment in its
    /// class tree (a segment in use has no free block), as for the slice
    /// classes whose block fills a segment, so nothing of the class tree or
    /// its format lock is skipped that could hold a block. `None` when the
    /// segment tree has none left for this thread (the caller's general
    /// path then reclaims and tries again).
    #[inline(never)]
    fn malloc_whole_segment_block(&self, class: SizeClass) -> Option<u64> {
        loop {
            let (team, lane, leader, rank) = arch::warp_team(class.index());
            let (mut first, mut taken) = (0u32, 0u64);
            if lane == leader {
                // Only the tree RMW here: each member formats its own
                // segment below, where the leader formatting a team's 32
                // one after another took most of the time.
                if let Some(claimed) = self.segment_tree().claim_lowest_many(team.count_ones()) {
                    (first, taken) = claimed;
                }
            }
            let first = arch::shfl_u32(team, first, leader);
            let taken = arch::shfl_u64(team, taken, leader);
            if taken == 0 {
                return None;
            }
            // At most `team.count_ones()` segments were claimed, so each has
            // a member of rank below the count to format and take it.
            if rank < taken.count_ones() {
                // The segment of the `rank`-th set bit.
                let segment = first + crate::veb::skip_lowest(taken, rank).trailing_zeros();
                self.format_claimed(segment, class, 1);
                let block = BlockId::whole_segment(segment);
                if self.checked() {
                    mark_handed_out(self.block_bits(block.segment), block.block);
                }
                return Some(self.block_address(class, block));
            }
        }
    }

    /// Claims up to `want` blocks of `class` in one segment: from a segment
    /// already formatted for it, else from a newly formatted one. A count of
    /// zero means the heap has no block of this class left.
    ///
    /// The first try is the lowest segment of the class tree, so light load
    /// packs the class low. Block classes reserve with one subtract on the
    /// segment's state word, so every claimer of a segment is served in one
    /// L2 atomic (no CAS chain), after a load that keeps it off a word it
    /// cannot serve (a stale subtract would hide another class's blocks);
    /// one that finds the segment drained (by that load, or by a subtract
    /// it then gives back) tries a segment picked by its SM and warp among
    /// the tree words of the lowest batch (`VebTree::pick_wide`). Slice classes reserve with a CAS (their
    /// path as before), and a claimer whose CAS loses a race spreads the same
    /// way: a burst's claimers spread over the segments of a batch instead
    /// of queueing on one state word.
    ///
    /// Formatting is bounded by the demand in flight (unless the caller
    /// takes the whole segment): when the class tree runs empty, every
    /// waiting thread would otherwise format a segment of its own and
    /// scatter the class over many barely used segments. Instead each
    /// claimer counts its `want` in the format lock's word while it is
    /// here. For a block class (and a slice class with `COUNTED_FORMAT=0`)
    /// the lock's holder, finding the class tree empty, formats as many
    /// segments as that demand fills ([`Heap::format_batch`]): one under
    /// light load, up to eight tree words' worth (512) in a burst. A slice
    /// class's claimers format one segment each, in parallel, while the
    /// formats in flight fall short of the demand ([`Heap::counted_format_due`]).
    #[inline(always)]
    pub(crate) fn claim_blocks(&self, class: SizeClass, want: u32) -> Claim {
        self.claim_blocks_for(class, want, false)
    }

    /// [`Heap::claim_blocks`]; with `team_format`, a block-class caller
    /// that wins the format lock with the class tree empty gets a
    /// [`Claim::team_format`] task instead of formatting the batch alone:
    /// its whole team then formats it ([`Heap::format_batch_team`]), which
    /// releases the lock. Only `malloc_block`'s team leader passes true.
    #[inline(never)]
    fn claim_blocks_for(&self, class: SizeClass, want: u32, team_format: bool) -> Claim {
        if SPLIT_COLD {
            // One copy per tier, each out of line: ptxas allocates each
            // alone, so the larger of the two sets the count, not both
            // inlined together.
            return if class.is_slice() {
                self.claim_slice_blocks(class, want)
            } else {
                self.claim_block_blocks(class, want, team_format)
            };
        }
        self.claim_blocks_in(class, want, team_format, class.is_slice(), true)
    }

    /// [`Heap::claim_blocks_for`] for a slice class (`SPLIT_COLD`).
    #[inline(never)]
    fn claim_slice_blocks(&self, class: SizeClass, want: u32) -> Claim {
        self.claim_blocks_in(class, want, false, true, true)
    }

    /// [`Heap::claim_blocks_for`] for a block class (`SPLIT_COLD`).
    #[inline(never)]
    fn claim_block_blocks(&self, class: SizeClass, want: u32, team_format: bool) -> Claim {
        self.claim_blocks_in(class, want, team_format, false, true)
    }

    /// The body of [`Heap::claim_blocks_for`]; `slice` is
    /// `class.is_slice()`, a constant where a caller passes one. Without
    /// `may_format` (a constant too) a claim that finds the class tree
    /// empty answers nothing instead of formatting
    /// ([`Heap::claim_after_formats`]).
    #[inline(always)]
    fn claim_blocks_in(
        &self,
        class: SizeClass,
        want: u32,
        team_format: bool,
        slice: bool,
        may_format: bool,
    ) -> Claim {
        let tree = self.class_tree(class);
        let table = self.table();
        let lock = self.format_lock(class);
        let blocks = class.blocks_per_segment(self.segment_shift);
        // The caller takes the whole segment: nothing to scatter. Or, with
        // `COUNTED_FORMAT=0`, a slot installer takes a quarter of it or
        // more (see `UNLOCKED_FORMAT_SHIFT`): a herd leaves at most one
        // segment per slot in the class tree, which the next claims use.
        let whole = blocks <= want;
        let unlocked = whole || (slice && blocks <= want << self.unlocked_format_shift());
        // Counted formats (`COUNTED_FORMAT`): the claimer's demand is
        // counted as under the lock, but formats run in parallel, as many
        // as the demand in flight fills.
        let counted = slice
            && !whole
            && match COUNTED_FORMAT {
                0 => false,
                1 => unlocked,
                _ => true,
            };
        let unlocked = unlocked && !counted;
        // Counted from entry, not from finding the tree empty: a format
        // runs only when the class tree is empty, and then every claimer in
        // flight needs blocks from it, including those that were about to
        // drain the last segment (counting them only once they found the
        // tree empty made the first format of each burst wave one segment).
        // Relaxed: the demand only sizes a batch; nothing is published
        // through it, and no one waits for the result.
        let demand = if unlocked {
            0
        } else {
            (want as u64) << DEMAND_SHIFT
        };
        // The add's old value is the demand of the other claimers in
        // flight: at least a segment's worth is a burst, in which a block
        // claimer's first pick is salted over the lowest batch like a
        // retry (`VebTree::pick_wide`), instead of every claimer of the
        // burst loading and subtracting from the lowest segment first (all
        // but its first few then overdraw, give back and drop it from the
        // class tree: three RMWs each on two words). Under light load the
        // first pick stays the lowest segment, which packs the class low.
        let others = if demand != 0 {
            arch::fetch_add_relaxed(lock, demand) >> DEMAND_SHIFT
        } else {
            0
        };
        // Where the next search starts (the start of a tree word) and how
        // it picks in that word: 0 takes the lowest.
        let mut from = 0;
        let mut salt = if !slice && others >= blocks as u64 {
            spread_salt(0)
        } else {
            0
        };
        let mut spread = 0u32;
        let mut round = 0;
        let claim = loop {
            // Block classes pick over the words of a batch (`pick_wide`;
            // `from` stays 0 for them): a burst's claimers spread over a
            // batch of several tree words at once instead of draining its
            // lowest word first.
            let found = if slice {
                tree.pick(from, salt)
                    .or_else(|| if from != 0 { tree.pick(0, salt) } else { None })
            } else {
                tree.pick_wide(0, salt)
            };
            if let Some((segment, choices)) = found {
                // Where a slice claimer looks after a lost race: the
                // segment's tree word again by SM and warp (a different pick
                // each time), or the next word if this one has no other
                // segment. A performance choice only: any segment of the
                // tree serves.
                let elsewhere = if choices > 1 {
                    segment & !63
                } else {
                    (segment | 63).wrapping_add(1)
                };
                if !slice || SLICE_CLAIM_ADD {
                    // Block classes (and slices with `SLICE_CLAIM_ADD`): one
                    // subtract, however many claim here.
                    if let Some((count, ticket)) =
                        self.reserve_in_tree_segment(&table, class, segment, want, blocks)
                    {
                        break Claim::ticketed(segment, count, ticket);
                    }
                    spread += 1;
                    salt = spread_salt(spread);
                    if slice {
                        from = elsewhere;
                    }
                    continue;
                }
                match table.reserve_blocks_once(segment, class, want) {
                    Reservation::Reserved { count, last } => {
                        if last {
                            self.drop_from_class_tree(class, segment);
                        }
                        break Claim::reserved(segment, count);
                    }
                    Reservation::Stale => self.drop_from_class_tree(class, segment),
                    Reservation::Contended => {
                        // Another claimer got there first: pick again
                        // elsewhere.
                        spread += 1;
                        salt = spread_salt(spread);
                        from = elsewhere;
                    }
                }
                continue;
            }
            if !may_format {
                break Claim(0);
            }
            if unlocked {
                break self.format_segment_where_cheap(class, want);
            }
            if counted {
                if self.counted_format_due(class, blocks) {
                    let claim = self.format_segment_where_cheap(class, want);
                    // Release: the format's tree insert happens before the
                    // decrement, so a waiter that reads it (acquire, in
                    // `counted_format_due`) and picks again sees the
                    // segment rather than formatting another. This
                    // claimer's demand goes in the same RMW.
                    arch::fetch_add_release(lock, (FORMAT_ONE + demand).wrapping_neg());
                    if claim.count() == 0 {
                        // The segment tree is empty. A tail call: the loop
                        // holds nothing across the format.
                        return self.claim_after_formats(class, want);
                    }
                    return claim;
                }
                arch::backoff(round);
                round += 1;
                continue;
            }
            // Test, then test-and-set: waiters read the word instead of
            // writing it while a format runs.
            if arch::load_relaxed(lock) & FORMAT_HELD == 0 {
                // Acquire: the lock orders this thread after the previous
                // holder's tree insert, which the re-check below must see
                // (the demand adds in between are relaxed RMWs, which
                // continue the release sequence of the holder's release).
                let held = arch::fetch_or_acq_rel(lock, FORMAT_HELD);
                if held & FORMAT_HELD == 0 {
                    if tree.successor(0).is_some() {
                        // Release (the add is acq_rel): nothing formatted,
                        // but the next holder must see what this one saw.
                        arch::fetch_add_acq_rel(lock, FORMAT_HELD.wrapping_neg());
                        continue;
                    }
                    // A slice class's batch covers at least one claim
                    // of every slot: a burst's claimers arrive over a few
                    // microseconds, and the first holders, reading the
                    // demand of a few, formatted one segment each time
                    // while the rest queued on the lock again. H100,
                    // kernel alone: 64 B −11%, 32 B −6%, spans within
                    // 0.05 (`docs/PERF.md`, "A floor under the locked
                    // format's batch").
                    let floor = if slice {
                        (self.slots_for(class) * want).div_ceil(blocks) as u64
                    } else {
                        1
                    };
                    let segments = (held >> DEMAND_SHIFT)
                        .div_ceil(blocks as u64)
                        .max(floor)
                        .clamp(1, MAX_FORMAT_BATCH as u64)
                        as u32;
                    if team_format && !slice {
                        // The lock stays held and this claimer's demand
                        // counted: `format_batch_team` releases both.
                        return Claim::team_format(segments);
                    }
                    let claim = self.format_batch(class, want, segments);
                    // Release: publishes the formatted segments (their tree
                    // insert) to the next holder; this claimer's demand goes
                    // in the same RMW.
                    arch::fetch_add_acq_rel(lock, (FORMAT_HELD + demand).wrapping_neg());
                    return claim;
                }
            }
            arch::backoff(round);
            round += 1;
        };
        if demand != 0 {
            arch::fetch_add_relaxed(lock, demand.wrapping_neg());
        }
        claim
    }

    /// Reserves up to `want` blocks of `segment`, a class-tree pick of
    /// `class` (`total` blocks to a segment), with one subtract
    /// ([`SegmentTable::reserve_blocks_add`]): the count and ticket, or
    /// none. Keeps the class tree true to what the subtract saw: a
    /// reservation that took the last free block drops the segment, and a
    /// miss acts on the give-back for the segment's class (its first free
    /// block again, or its retirement), then drops the hint, which
    /// re-inserts it if it serves after all.
    #[inline(always)]
    fn reserve_in_tree_segment(
        &self,
        table: &SegmentTable<'_>,
        class: SizeClass,
        segment: u32,
        want: u32,
        total: u32,
    ) -> Option<(u32, u32)> {
        match table.reserve_blocks_add(segment, class, want, total, self.segment_shift) {
            Grab::Reserved {
                count,
                last,
                ticket,
            } => {
                if last {
                    self.drop_from_class_tree(class, segment);
                }
                Some((count, ticket))
            }
            Grab::Missed { gave_back } => {
                if let Some((c, ret)) = gave_back {
                    self.after_return(c, segment, ret);
                }
                self.drop_from_class_tree(class, segment);
                None
            }
        }
    }

    /// A counted claim whose format found the segment tree empty: waits
    /// until no format of `class` is in flight, then claims from the class
    /// tree once more without formatting. So a claim answers null only if
    /// the class tree was empty after every format in flight when its own
    /// failed had inserted its segment (the locked path re-checks the tree
    /// under the lock for the same reason). Bounded: formats never wait,
    /// and one that finds the segment tree empty ends at once. Cold: only
    /// an exhausted heap gets here.
    #[inline(never)]
    #[cold]
    fn claim_after_formats(&self, class: SizeClass, want: u32) -> Claim {
        let lock = self.format_lock(class);
        let mut round = 0;
        // Acquire: pairs with each format's release decrement, so the
        // claim below sees the segments of every format counted before.
        while arch::load_acquire(lock) >> FORMATS_SHIFT != 0 {
            arch::backoff(round);
            round = round.saturating_add(1);
        }
        self.claim_blocks_in(class, want, false, true, false)
    }

    /// A counted format's decision ([`COUNTED_FORMAT`]), for a claimer of
    /// `class` (`blocks` per segment) that found the class tree empty with
    /// its blocks counted in the lock word's demand: true if the formats in
    /// flight, `blocks` each, fall short of the demand in flight, and then
    /// one more is counted in flight for the caller, which formats a
    /// segment and takes the count back with its demand; else false, and
    /// the caller waits and picks again.
    ///
    /// The count only sizes how many formats run at once: any segment in
    /// the class tree serves any claimer, so a stale count costs at most a
    /// segment formatted beyond the demand (which `retire_idle_segments`
    /// gives back if no claim used it) or a wait of one round. The wait
    /// ends: formats never wait, and each ends by taking its count back.
    ///
    /// Inline, with the format called only once it is decided: a call the
    /// claim loop goes on from holds the loop's state across it, which
    /// took `heap_alloc` from 96 to 112 registers on sm_90 (ptxas
    /// allocates the kernel over its callees).
    #[inline(always)]
    fn counted_format_due(&self, class: SizeClass, blocks: u32) -> bool {
        let lock = self.format_lock(class);
        let short = |word: u64| {
            let covered = (word >> FORMATS_SHIFT) * u64::from(blocks);
            covered < (word & DEMAND_MASK) >> DEMAND_SHIFT
        };
        // Test, then add: waiters read the word while formats cover them.
        // Acquire: pairs with a finished format's release decrement, so
        // the caller's next pick sees that format's segment.
        if !short(arch::load_acquire(lock)) {
            return false;
        }
        // Relaxed: the add only counts (nothing is published through it);
        // its old value decides, so two claimers cannot both take the last
        // format the demand needs.
        if !short(arch::fetch_add_relaxed(lock, FORMAT_ONE)) {
            arch::fetch_add_relaxed(lock, FORMAT_ONE.wrapping_neg());
            return false;
        }
        true
    }

    /// For the loom models (`tests/loom.rs`), which reach the allocator
    /// only through the public handle: a slot installer's claim of one
    /// block of the slice class of `size` bytes, as (segment, block), or
    /// `None` if the heap had none. The block stays taken.
    #[cfg(loom)]
    #[doc(hidden)]
    pub fn loom_claim_one_slice_block(&self, size: u64) -> Option<(u32, u32)> {
        let Request::Class(class) = Request::for_size(size, self.segment_shift) else {
            return None;
        };
        let claim = self.claim_blocks(class, 1);
        (claim.count() != 0).then(|| {
            let b = claim.take(self, class, 0);
            (b.segment, b.block)
        })
    }

    /// `UNLOCKED_FORMAT_SHIFT`, or `LARGE_HEAP_UNLOCKED_FORMAT_SHIFT` on a
    /// large heap (a constant unless both diagnostics are set).
    #[inline(always)]
    pub(crate) fn unlocked_format_shift(&self) -> u32 {
        let large = crate::team::LARGE_HEAP_SHIFT;
        if LARGE_HEAP_UNLOCKED_FORMAT_SHIFT != UNLOCKED_FORMAT_SHIFT
            && large != 0
            && self.budget_bytes() >> large != 0
        {
            LARGE_HEAP_UNLOCKED_FORMAT_SHIFT
        } else {
            UNLOCKED_FORMAT_SHIFT
        }
    }

    /// The last try of a block request: reclaim, then claim again. Out of
    /// line and cold: it runs only when a request is about to fail.
    #[inline(never)]
    #[cold]
    fn reclaim_and_claim(&self, class: SizeClass, want: u32) -> Claim {
        self.reclaim();
        self.claim_blocks_settled(class, want)
    }

    /// [`Heap::claim_blocks`] for a request about to fail: a claim that
    /// comes back empty counts only if no out-of-tree window of `class`
    /// was open when it started nor opened while it ran; otherwise it waits
    /// for the windows open to close and claims again. Cold: only the last
    /// try of a request gets here.
    ///
    /// Why: an empty claim saw the class tree empty (under the format lock)
    /// and the segment tree exhausted. A drop in its window has a segment
    /// out of the class tree that its re-check may find serving (a stale
    /// load before the drop, a give-back in between) and put back; a claim
    /// that looked in that window answered null beside free blocks
    /// (`docs/PERF.md`, "The null beside free blocks"). With the word
    /// unchanged and no window open across the claim, every segment of the
    /// class with free blocks was in the class tree when the claim looked
    /// (a return's `FirstFree` insert aside: that free is still in flight,
    /// so a null ordered before it is a valid answer).
    ///
    /// Bounded: windows never wait, so the wait ends when those open close;
    /// each retry means another thread opened a window meanwhile, i.e. made
    /// a claim on a segment of the class tree; once the class tree stays
    /// empty no window opens (a drop follows a pick from the tree, or a
    /// reservation of a segment that was in it).
    #[inline(never)]
    #[cold]
    pub(crate) fn claim_blocks_settled(&self, class: SizeClass, want: u32) -> Claim {
        let word = self.out_of_tree(class);
        let mut round = 0;
        loop {
            // Acquire: a window that closed before this load (its release
            // subtract, read here) has its re-insert ordered before the
            // claim's tree reads, which then see the segment.
            let before = arch::load_acquire(word);
            if before & WINDOWS_OPEN_MASK != 0 {
                arch::backoff(round);
                round = round.saturating_add(1);
                continue;
            }
            let claim = self.claim_blocks(class, want);
            if claim.count() != 0 {
                return claim;
            }
            // The fence orders the claim's (relaxed) tree reads before the
            // load below: a tree read that saw a window's remove (an
            // acq_rel RMW, program-ordered after the window's opening add)
            // synchronises with that remove through the fence, so the load
            // sees the opening add and differs from `before`. Relaxed load:
            // the fence gives it its ordering.
            arch::fence_acq_rel();
            if arch::load_relaxed(word) == before {
                return claim;
            }
            round = 0;
        }
    }

    /// Removes `segment` from the class tree, then puts it back if its state
    /// says it can serve the class after all.
    ///
    /// The remove and the re-insert decision make an out-of-tree window of
    /// the class (see `WINDOW_OPEN`), opened before the remove and closed
    /// after the decision, so that a claim about to answer null sees it
    /// ([`Heap::claim_blocks_settled`]). The opening add may be relaxed:
    /// the remove that follows it is a release RMW, so a claim whose tree
    /// read sees the remove and then fences sees the add. The closing
    /// subtract is a release: a claim that reads it (acquire) and then
    /// looks at the tree sees the re-insert. Cost: two RMWs on the class's
    /// window word per drop (a drop follows a drained or stale pick, about
    /// once per drained segment outside a burst's herd); never a wait.
    #[inline]
    fn drop_from_class_tree(&self, class: SizeClass, segment: u32) {
        let tree = self.class_tree(class);
        let window = self.out_of_tree(class);
        arch::fetch_add_relaxed(window, WINDOW_OPENED + WINDOW_OPEN);
        tree.remove(segment);
        if let SegmentState::Active { class: c, free } = self.table().load(segment)
            && c == class
            && free > 0
        {
            tree.insert(segment);
        }
        arch::fetch_add_release(window, WINDOW_OPEN.wrapping_neg());
    }

    /// The format lock's holder: claims up to `segments`
    /// (1..=`MAX_FORMAT_BATCH`) of the lowest free segments, one segment-tree
    /// word at a time with one RMW each (fewer if the tree has fewer), formats
    /// them all for `class`, keeps the first `min(want, blocks)` blocks of
    /// the lowest for the caller, and publishes each word's segments with one
    /// fence and inserts them into the class tree with one RMW. Called only where a segment has more blocks than
    /// `want`, so every segment of the batch has free blocks.
    ///
    /// Why a batch: one format per lock hold made a burst of 2^19 claims of
    /// 16 KiB (512 segments of 1,024 blocks) 512 formats in sequence, with
    /// every other claimer queueing on one state word meanwhile. The caller
    /// asks for as many segments as the claimers in flight want, so
    /// the batch strands at most a segment's worth of blocks beyond what
    /// was asked for when it was formatted. A segment of it that no claim
    /// used (its claimer found blocks elsewhere) goes back to the segment
    /// tree at the next reclaim or flush ([`Heap::retire_idle_segments`]).
    #[inline(never)]
    fn format_batch(&self, class: SizeClass, want: u32, segments: u32) -> Claim {
        // Salted retries for block classes only, as in `format_segment`.
        let salt = if class.is_slice() { 0 } else { spread_salt(0) };
        let blocks = class.blocks_per_segment(self.segment_shift);
        debug_assert!(want < blocks);
        let taken = want.min(blocks);
        let mut claim = Claim(0);
        let mut left = segments;
        // One segment-tree word per pass: claimed with one RMW, formatted,
        // published with one fence and inserted into the class tree with
        // one RMW before the next word is claimed, so claimers waiting for
        // the batch start on its first word while the rest is formatted.
        while left > 0 {
            let Some((first, taken_ids)) = self.segment_tree().claim_low_many(left.min(64), salt)
            else {
                break;
            };
            left -= taken_ids.count_ones();
            // The caller's blocks come from the batch's first segment; no
            // segment of a later word matches `own`.
            let own = if claim.count() == 0 {
                first + taken_ids.trailing_zeros()
            } else {
                u32::MAX
            };
            let mut rest = taken_ids;
            while rest != 0 {
                let segment = first + rest.trailing_zeros();
                let mine = if segment == own { taken } else { 0 };
                self.write_format(segment, class, blocks, mine);
                rest &= rest - 1;
            }
            self.table()
                .publish_active_many(first, taken_ids, class, blocks, own, blocks - taken);
            self.class_tree(class).insert_many(first, taken_ids);
            if own != u32::MAX {
                claim = Claim::formatted(own, taken);
            }
        }
        claim
    }

    /// [`Heap::format_batch`] made by a whole team, whose leader holds
    /// `class`'s format lock with its `team.count_ones()` blocks of demand
    /// counted (a [`Claim::team_format`] task of `segments` segments): the
    /// leader claims one segment-tree word at a time and shuffles it to
    /// the team; each member formats the bitmaps of every `n`-th segment
    /// of it (`n` the team's size, from its rank) and publishes their state
    /// words after a fence of its own; then the leader inserts the word
    /// into the class tree. A batch of 512 segments is then 16 formats per
    /// lane instead of 512 by one thread while every other claimer of the
    /// class waits. Returns the team's blocks (the first `min(n, blocks)`
    /// of the batch's lowest segment), or nothing if the segment tree had
    /// no segment. Every member of `team` calls it.
    #[inline(never)]
    fn format_batch_team(&self, class: SizeClass, team: u32, segments: u32) -> Claim {
        let lane = arch::lane_id();
        let leader = arch::lowest_lane(team);
        let rank = arch::rank_in(team, lane);
        let size = team.count_ones();
        let blocks = class.blocks_per_segment(self.segment_shift);
        debug_assert!(!class.is_slice() && size < blocks);
        let taken = size.min(blocks);
        let salt = spread_salt(0);
        let mut own = u32::MAX;
        let mut left = segments;
        while left > 0 {
            let mut first = 0u32;
            let mut ids = 0u64;
            if lane == leader
                && let Some((f, t)) = self.segment_tree().claim_low_many(left.min(64), salt)
            {
                (first, ids) = (f, t);
            }
            let ids = arch::shfl_u64(team, ids, leader);
            if ids == 0 {
                break;
            }
            let first = arch::shfl_u32(team, first, leader);
            // The team's blocks come from the batch's first segment; no
            // segment of a later word matches `word_own`.
            let word_own = if own == u32::MAX {
                first + ids.trailing_zeros()
            } else {
                u32::MAX
            };
            // This member's segments of the word: every `size`-th, from
            // its rank.
            let mut mine = 0u64;
            let mut rest = ids;
            let mut turn = 0;
            while rest != 0 {
                if turn == rank {
                    mine |= rest & rest.wrapping_neg();
                }
                turn = if turn + 1 == size { 0 } else { turn + 1 };
                rest &= rest - 1;
            }
            if mine != 0 {
                let mut rest = mine;
                while rest != 0 {
                    let segment = first + rest.trailing_zeros();
                    let gone = if segment == word_own { taken } else { 0 };
                    self.bitmap(segment).format(blocks, gone);
                    rest &= rest - 1;
                }
                // Its fence orders this member's bitmap stores before its
                // state stores, as for a batch formatted by one thread.
                self.table().publish_active_many(
                    first,
                    mine,
                    class,
                    blocks,
                    word_own,
                    blocks - taken,
                );
            }
            // The leader's insert makes the word's segments findable, so
            // every member's state stores must happen before it (a claimer
            // that found a segment in the tree but a stale `Free` state
            // would drop it; the drop's re-check, ordered after the insert
            // by the remove's acquire, must see `Active`). A release orders
            // only the leader's own writes; `bar.warp.sync` over the team
            // orders the members' writes before what the leader does next.
            arch::warp_sync(team);
            if lane == leader {
                self.class_tree(class).insert_many(first, ids);
            }
            if own == u32::MAX {
                own = word_own;
            }
            left -= ids.count_ones();
        }
        if lane == leader {
            // Release, as in `claim_blocks`: publishes the batch (the
            // leader's inserts) to the next holder; the leader's demand
            // (its team's blocks, counted at entry) goes in the same RMW.
            let demand = (size as u64) << DEMAND_SHIFT;
            arch::fetch_add_acq_rel(
                self.format_lock(class),
                (FORMAT_HELD + demand).wrapping_neg(),
            );
        }
        if own == u32::MAX {
            Claim(0)
        } else {
            Claim::formatted(own, taken)
        }
    }

    /// Gives back to the segment tree every segment formatted for a class
    /// and never reserved from: what a batch formatted beyond the blocks
    /// its claimers took (the demand it read counted claimers that found
    /// blocks elsewhere meanwhile). Such a segment would otherwise stay
    /// formatted for its class, where only that class's claims use it,
    /// and never come back whole (no block of it comes back to retire it).
    /// Walks every class tree: run only by [`Heap::reclaim`] (before a
    /// request fails) and [`Heap::flush_slots`] (before the host checks
    /// that the heap is whole). Safe while other threads allocate.
    #[inline(never)]
    pub fn retire_idle_segments(&self) {
        let table = self.table();
        // Only the classes this heap's segments hold: a block class larger
        // than a segment has no blocks per segment to count.
        for class in (0..classes(self.segment_shift)).filter_map(SizeClass::new) {
            let tree = self.class_tree(class);
            let total = class.blocks_per_segment(self.segment_shift);
            let mut from = 0;
            while let Some(segment) = tree.successor(from) {
                if table.retire_idle(segment, class, total) {
                    // As `return_blocks` after the last return: out of the
                    // class tree before anyone can claim it again.
                    tree.remove(segment);
                    self.segment_tree().insert(segment);
                }
                from = segment + 1;
            }
        }
    }

    /// Claims a free segment of the lowest segment-tree word (the lowest,
    /// unless another claimer took it first) and formats it for `class`,
    /// keeping its first `min(want, blocks)` blocks for the caller.
    #[inline]
    fn format_segment(&self, class: SizeClass, want: u32) -> Claim {
        // Salted: a burst of whole-segment claims (512 KiB … 8 MiB blocks
        // at 16 MiB segments, one segment per warp) spreads its retries
        // over the lowest tree word instead of taking one id per round trip.
        // Slice classes keep their segments low, which keeps the span of
        // small allocations tight (H100, `bench frag`: 1 KiB slices spanned
        // 1.42–1.49× what was asked with the salt, 1.09 without):
        // - a slice class whose claim takes the whole segment (512 B and
        //   1 KiB at 8 MiB segments) retries a lost race near the lowest
        //   ids (`claim_low_many_near`): no free block of the segment is
        //   left behind, and the holes a retry leaves are a few segments
        //   wide, where the next first tries land. H100, against the
        //   lowest ids: 512 B −13%, 1 KiB −12%, mixed −5%, spans unchanged
        //   (`docs/PERF.md`, "Near retries for whole-claim slice formats");
        // - the others aim at the lowest ids again: their segments keep
        //   free blocks in the class tree, and near retries there widened
        //   the 256 B span to 1.53–1.63 (the same section's `snear`).
        let tree = self.segment_tree();
        let claimed = if !class.is_slice() {
            tree.claim_low_many(1, spread_salt(0))
        } else if class.blocks_per_segment(self.segment_shift) <= want {
            tree.claim_low_many_near(1, spread_salt(0))
        } else {
            tree.claim_low_many(1, 0)
        };
        let Some((first, taken)) = claimed else {
            return Claim(0);
        };
        let segment = first + taken.trailing_zeros();
        let taken = want.min(class.blocks_per_segment(self.segment_shift));
        if self.format_claimed(segment, class, taken) > 0 {
            self.class_tree(class).insert(segment);
        }
        Claim::formatted(segment, taken)
    }

    /// [`Heap::format_segment`], out of line where `SPLIT_COLD` cuts the
    /// cold paths ([`Heap::format_segment_apart`]), inline otherwise.
    #[inline(always)]
    fn format_segment_where_cheap(&self, class: SizeClass, want: u32) -> Claim {
        if SPLIT_COLD {
            self.format_segment_apart(class, want)
        } else {
            self.format_segment(class, want)
        }
    }

    /// [`Heap::format_segment`] out of line (`SPLIT_COLD`): the claim loop
    /// then holds nothing but its demand across the call, where inlined
    /// it held ~50 registers across `restart_counters`.
    #[inline(never)]
    fn format_segment_apart(&self, class: SizeClass, want: u32) -> Claim {
        self.format_segment(class, want)
    }

    /// Formats a segment this thread claimed for `class`, its first `taken`
    /// blocks taken; returns how many are left free.
    #[inline]
    fn format_claimed(&self, segment: u32, class: SizeClass, taken: u32) -> u32 {
        let blocks = class.blocks_per_segment(self.segment_shift);
        self.write_format(segment, class, blocks, taken);
        let free = blocks - taken;
        self.table().publish_active(segment, class, free);
        free
    }

    /// Writes a claimed segment's format for `class` (`blocks` per segment,
    /// the first `taken` taken): its bitmap and, for a slice class, its
    /// counters. Not yet published: the caller's fence and state store
    /// (`publish_active` or `publish_active_many`) release it.
    #[inline(always)]
    fn write_format(&self, segment: u32, class: SizeClass, blocks: u32, taken: u32) {
        self.bitmap(segment).format(blocks, taken);
        if class.is_slice() {
            self.restart_counters_where_cheap(segment, blocks);
        }
    }

    /// Claims up to `want` (1..=64) free segments for a slice class whose
    /// block fills a segment (512 B … 4 KiB slices at 2 MiB segments, only
    /// 4 KiB at 16 MiB), or whose claim takes whole segments of a few
    /// blocks (`team::SEGMENT_RUNS`), with one RMW on the segment tree, and
    /// formats each with all its blocks taken. Returns the first id of the
    /// tree word they came from and the mask of the segments claimed (bit
    /// `k`: segment `first + k`).
    ///
    /// Such a claim puts no segment in the class tree (its segments have
    /// no free block while in use), so the class tree and the format lock
    /// are skipped: the caller takes whole segments, nothing to scatter.
    /// Every install of these classes claims a segment, so these claims are
    /// the serial part of a whole-GPU burst: one tree RMW now yields
    /// several segments, which the caller keeps as its slot's spares.
    #[inline(never)]
    pub(crate) fn claim_whole_segments(&self, class: SizeClass, want: u32) -> Option<(u32, u64)> {
        debug_assert!(class.is_slice());
        let tree = self.segment_tree();
        let (first, taken) = match WHOLE_CLAIM_SALT {
            _ if WHOLE_CLAIM_ADJACENT && want > 1 => {
                tree.claim_adjacent_many_near(want, spread_salt(0))
            }
            0 => tree.claim_lowest_many(want),
            1 => tree.claim_low_many(want, spread_salt(0)),
            _ => tree.claim_low_many_near(want, spread_salt(0)),
        }?;
        self.format_whole_segments(class, first, taken);
        Some((first, taken))
    }

    /// Takes a run of up to `want` (1..=64) free segments of adjacent ids
    /// for a class's stripe ([`crate::stripe`]), unformatted, with one RMW
    /// on the segment tree (the lowest `want` ids of its lowest word); the
    /// ids of that take outside the run from its lowest go back at once.
    /// Returns the run's first id and length. The run at the lowest free
    /// id, however short, and not the word's lowest run of `want`: after a
    /// lowered stripe's drain, the segments the last burst's slots still
    /// hold cut the runs at the bottom, and stripes that skipped above them
    /// spread a warm burst over the word (256 B span 1.25–1.71 by run where
    /// the lowest free id gives 1.15–1.24, `docs/PERF.md`, "A stripe
    /// lowered after the frees below it"). The caller formats the run
    /// ([`Heap::format_stripe_run`]) or puts it back
    /// ([`Heap::return_stripe_run`]).
    #[inline(never)]
    pub(crate) fn take_stripe_run(&self, want: u32) -> Option<(u32, u32)> {
        let tree = self.segment_tree();
        let (first, taken) = tree.claim_low_many_near(want, spread_salt(0))?;
        let low = taken.trailing_zeros();
        let count = (taken >> low).trailing_ones();
        let run = run_mask(low, count);
        if taken & !run != 0 {
            tree.insert_many(first, taken & !run);
        }
        Some((first + low, count))
    }

    /// Formats the `count` segments from `first` that
    /// [`Heap::take_stripe_run`] took for `class`, with all their blocks
    /// taken.
    #[inline(never)]
    pub(crate) fn format_stripe_run(&self, class: SizeClass, first: u32, count: u32) {
        debug_assert!(class.is_slice());
        self.format_whole_segments(class, first & !63, run_mask(first & 63, count));
    }

    /// Puts the run [`Heap::take_stripe_run`] took back, unformatted.
    #[inline(always)]
    pub(crate) fn return_stripe_run(&self, first: u32, count: u32) {
        self.segment_tree()
            .insert_many(first & !63, run_mask(first & 63, count));
    }

    /// For `class`'s stripe ([`crate::stripe`]): the lowest run of free
    /// blocks of the lowest segment formatted for `class` that has free
    /// blocks, claimed (taken in the bitmap, counted in the segment
    /// table), if that segment lies below segment `below` (the free
    /// segments the caller took start there; `u32::MAX` if there were
    /// none). Returns the run's first block and length; none if the class
    /// tree is empty or its lowest segment is not below `below`, or if the
    /// claim found nothing there.
    ///
    /// Why: stripe classes claimed only whole free segments, so the free
    /// blocks of a segment that a block still held (the last burst's slot
    /// blocks, which hand out their last slices in the next burst) stayed
    /// idle while the next burst's stripes went above them: on the H100,
    /// 256 B warm rounds of `bench frag` left 20–55 MiB of such blocks
    /// inside spans of 1.12–1.23 (`docs/PERF.md`, "Stripes that take the
    /// free blocks of held segments"). `GPUMALLOC_STRIPE_REUSE=0` builds
    /// the rule before.
    ///
    /// The claim: a snapshot of the segment's bitmap word names the lowest
    /// run; one subtract reserves up to that many blocks
    /// ([`SegmentTable::reserve_blocks_add`]) and one RMW takes as many
    /// bits from the run's start. Other claimers may take bits of the run
    /// meanwhile: the bits missing are taken where the bitmap has them, as
    /// an ordinary claim takes its blocks, and of what is held only the
    /// lowest run of adjacent blocks is kept; the rest is returned as any
    /// block is.
    #[inline(never)]
    pub(crate) fn claim_stripe_blocks(
        &self,
        class: SizeClass,
        below: u32,
    ) -> Option<(BlockId, u32)> {
        debug_assert!(class.is_slice());
        if !crate::stripe::STRIPE_REUSE {
            return None;
        }
        // A hint (relaxed inside `successor`): a stale one picks the whole
        // segments, which serve as well.
        let segment = self.class_tree(class).successor(0)?;
        if segment >= below {
            return None;
        }
        let total = class.blocks_per_segment(self.segment_shift);
        // Stripe classes have at most 32 blocks to a segment (`stripe`'s
        // `STRIPE_MAX_BLOCKS_SHIFT`), one bitmap word; a class of more
        // (`GPUMALLOC_STRIPE=3`) takes whole segments only.
        if total > 64 {
            return None;
        }
        let bitmap = self.bitmap(segment);
        let seen = bitmap.snapshot(0);
        if seen == 0 {
            return None;
        }
        let low = seen.trailing_zeros();
        let run = (seen >> low).trailing_ones();
        let (reserved, _) =
            self.reserve_in_tree_segment(&self.table(), class, segment, run, total)?;
        // As many bits as the reservation holds (`reserved <= run`), from
        // the run's start: a reserver may clear only as many bits as it
        // reserved (`BlockBitmap::take_bits`). Bits of the run that other
        // reservers took meanwhile are made up by the scan ordinary claims
        // use, which finds a set bit for every reservation.
        let mut held = bitmap.take_bits(0, run_mask(low, reserved));
        for _ in held.count_ones()..reserved {
            held |= 1u64 << bitmap.take(total, 0);
        }
        let (first, len) = self.keep_lowest_run(class, segment, held);
        Some((
            BlockId {
                segment,
                block: first,
            },
            len,
        ))
    }

    /// Of the blocks `held` (bit `k`: block `k` of `segment`, in the first
    /// bitmap word), all the caller's, keeps the lowest run of adjacent
    /// ones and gives back the rest, run by run, as a drained stripe's
    /// blocks go back; returns the kept run's first block and length.
    /// `held` is not 0.
    #[inline(always)]
    pub(crate) fn keep_lowest_run(&self, class: SizeClass, segment: u32, held: u64) -> (u32, u32) {
        let first = held.trailing_zeros();
        let len = (held >> first).trailing_ones();
        let mut rest = held & !run_mask(first, len);
        while rest != 0 {
            let at = rest.trailing_zeros();
            let count = (rest >> at).trailing_ones();
            self.release_blocks(class, segment, at, count);
            rest &= !run_mask(at, count);
        }
        (first, len)
    }

    /// [`Heap::claim_whole_segments`] of one segment from the top of the
    /// segment tree's lowest word that has one
    /// ([`crate::veb::VebTree::claim_high_in_lowest_word`]), for a class
    /// whose segment holds a few blocks (`team::SEGMENT_RUNS=3`): its
    /// single claims then stay off the lowest ids, where the whole-segment
    /// classes claim their runs of adjacent segments.
    #[inline(never)]
    pub(crate) fn claim_whole_segment_from_top(&self, class: SizeClass) -> Option<(u32, u64)> {
        debug_assert!(class.is_slice());
        let (first, taken) = self
            .segment_tree()
            .claim_high_in_lowest_word(1, spread_salt(0))?;
        self.format_whole_segments(class, first, taken);
        Some((first, taken))
    }

    /// Whether a class whose block fills a segment has claimed segments
    /// for a slot on this heap (`team::SEGMENT_RUNS=4`, which then claims
    /// single segments from the top of the lowest tree word, off the
    /// bottom where those claims take their runs of adjacent segments).
    /// Relaxed: a placement hint; a stale answer puts a claim at the other
    /// end of its word, nothing else.
    #[inline(always)]
    pub(crate) fn whole_segment_runs_taken(&self) -> bool {
        arch::load_relaxed(self.whole_segment_runs_word()) != 0
    }

    /// Records that a class whose block fills a segment has claimed
    /// segments for a slot (see [`Heap::whole_segment_runs_taken`]): set
    /// once and cleared only when the host rewrites the metadata (a
    /// reset), so a heap that has served such a class claims single
    /// segments from the top from then on. A relaxed store, which the
    /// installer does not wait for.
    #[inline(always)]
    pub(crate) fn note_whole_segment_runs(&self) {
        arch::store_relaxed(self.whole_segment_runs_word(), 1);
    }

    /// Formats segments `first + k` (each bit `k` of `taken`, just claimed
    /// from the segment tree) for `class` with all their blocks taken.
    #[inline(always)]
    fn format_whole_segments(&self, class: SizeClass, first: u32, taken: u64) {
        let blocks = class.blocks_per_segment(self.segment_shift);
        // Each segment's bitmap and counter first, then one fence for all
        // of them (`publish_active_many`): the installer's team waits for
        // this claim, and a fence per segment cost a round trip each. H100,
        // kernel alone: 2 / 4 / 8 / 16 KiB −9 / −11 / −9 / −10%, mixed
        // −4% (`docs/PERF.md`, "One fence per whole-segment claim").
        let mut rest = taken;
        while rest != 0 {
            let segment = first + rest.trailing_zeros();
            self.write_format(segment, class, blocks, blocks);
            rest &= rest - 1;
        }
        self.table()
            .publish_active_many(first, taken, class, 0, u32::MAX, 0);
    }

    /// Whether this heap keeps misuse-check bits (`CHECK_DOUBLE_FREE`).
    #[inline(always)]
    pub(crate) fn checked(&self) -> bool {
        self.flags & CHECK_DOUBLE_FREE != 0
    }

    /// Checked heaps: the check bits of a block-class segment's blocks.
    #[inline(always)]
    fn block_bits(&self, segment: u32) -> &[Word] {
        self.slice_bits(self.global(BlockId { segment, block: 0 }))
    }

    /// Counters count in lifetimes of a class's slices per block; the
    /// segment's last class may have had fewer per block, which leaves a
    /// count that is no multiple of the new class's, so a segment formatted
    /// for a slice class starts its counters at zero. Relaxed: published by
    /// `publish_active`'s release, and no add can race (every block of a
    /// free segment is back and no slot holds one). Out of line: it would
    /// cost the claim path registers.
    #[inline(never)]
    fn restart_counters(&self, segment: u32, blocks: u32) {
        self.restart_counters_here(segment, blocks);
    }

    /// [`Heap::restart_counters`], inlined where `SPLIT_COLD` has put its
    /// callers (the formats) out of line: a call there, in a loop over
    /// segments, kept the loop's values in callee-saved registers, which
    /// the calling convention places sparsely (sm_80: `format_batch` 117
    /// registers with the call, the highest of any function `heap_alloc`
    /// can reach).
    #[inline(always)]
    fn restart_counters_where_cheap(&self, segment: u32, blocks: u32) {
        if SPLIT_COLD {
            self.restart_counters_here(segment, blocks);
        } else {
            self.restart_counters(segment, blocks);
        }
    }

    #[inline(always)]
    fn restart_counters_here(&self, segment: u32, blocks: u32) {
        for b in 0..blocks {
            arch::store_relaxed(self.counter(self.global(BlockId { segment, block: b })), 0);
        }
    }

    /// Returns a slice block whose every slice is dead to its segment. The
    /// counter is not reset (see `block`); check states need no reset
    /// either: every live one turned freed at its free, and a freed one turns
    /// live again when its slice is handed out.
    #[inline(never)]
    pub(crate) fn release_block(&self, class: SizeClass, b: BlockId) {
        self.release_blocks(class, b.segment, b.block, 1);
    }

    /// [`Heap::release_block`] of blocks `first..first + count` of one
    /// segment, all in one bitmap word (`first % 64 + count <= 64`), with
    /// one bitmap RMW and one segment-table add: how a stripe gives back
    /// its undrawn blocks.
    #[inline(always)]
    pub(crate) fn release_blocks(&self, class: SizeClass, segment: u32, first: u32, count: u32) {
        // On an unchecked heap an undetected bad free can end a block's
        // lifetime early, even after its segment changed hands: never give a
        // block back to a segment that is not formatted for its class.
        let formatted = matches!(
            self.table().load(segment),
            SegmentState::Active { class: c, .. } if c == class
        );
        // Blocks of the range that were free already (bit 0: `first`):
        // all of them where the segment is not formatted for the class.
        let twice = if formatted {
            self.bitmap(segment).give_back_range(first, count)
        } else {
            run_mask(0, count)
        };
        let set = count - twice.count_ones();
        if set < count {
            // Only an undetected double free can get here (unchecked heaps):
            // count it rather than corrupt the bitmap or the segment table.
            // One count per range (a range is a stripe's undrawn blocks,
            // or one block), naming its first block that came back twice.
            self.misuse(
                Stat::DoubleFrees,
                b"gpumalloc: block %llu came back twice (an undetected double free)\n\0",
                self.global(BlockId {
                    segment,
                    block: first + twice.trailing_zeros(),
                }),
            );
            if set == 0 {
                return;
            }
        }
        self.return_blocks(class, segment, set);
    }

    /// Frees a block-class allocation: each thread sets its block's bit
    /// (which detects a double free), then threads of a warp freeing blocks
    /// of the same segment count them in the segment table together.
    #[inline]
    fn free_block(&self, class: SizeClass, b: BlockId) {
        // Checked heaps: the block's state decides, before the bitmap is
        // touched. Unchecked heaps: the bitmap bit detects a block that is
        // free already, freed before or never handed out (counted double).
        if self.checked() {
            match check_unit_free(self.block_bits(b.segment), b.block) {
                CheckedFree::Freed => {}
                CheckedFree::Double => {
                    return self.misuse(
                        Stat::DoubleFrees,
                        b"gpumalloc: double free of a block in segment %llu\n\0",
                        b.segment as u64,
                    );
                }
                CheckedFree::NeverHandedOut => {
                    return self.misuse(
                        Stat::InvalidFrees,
                        b"gpumalloc: free of a block never handed out in segment %llu\n\0",
                        b.segment as u64,
                    );
                }
            }
        }
        if !self.bitmap(b.segment).give_back(b.block) {
            return self.misuse(
                Stat::DoubleFrees,
                b"gpumalloc: double free of a block in segment %llu\n\0",
                b.segment as u64,
            );
        }
        let mask = arch::active_mask();
        let team = arch::match_any(mask, b.segment);
        // The leader counts the whole team's blocks: the last count may hand
        // the segment to another class or thread, so every member's writes
        // to its block must happen before it. Each member's `give_back`
        // releases only on its bitmap word, which the leader never reads;
        // `match` orders nothing, `bar.warp.sync` over the team does.
        arch::warp_sync(team);
        if arch::lane_id() == arch::lowest_lane(team) {
            self.by_value()
                .return_blocks(class, b.segment, team.count_ones());
        }
    }

    /// Counts `count` blocks (bits already set) free in the segment table
    /// and moves the segment between trees as its state says.
    /// If the segment goes back to the segment tree, the class's stripe
    /// may be asked to move down ([`Heap::lower_stripe`]; here, at the
    /// tail, so that no value lives across a call in `free`'s callers).
    #[inline(never)]
    fn return_blocks(&self, class: SizeClass, segment: u32, count: u32) {
        let total = class.blocks_per_segment(self.segment_shift);
        let ret = self.table().return_blocks(segment, class, count, total);
        if self.after_return(class, segment, ret) {
            self.lower_stripe(class, segment);
        }
    }

    /// Moves `segment` of `class` between trees as an add of free blocks
    /// (a return, or a reservation's give-back) said; returns whether it
    /// went back to the segment tree.
    #[inline(always)]
    fn after_return(&self, class: SizeClass, segment: u32, ret: Return) -> bool {
        match ret {
            Return::FirstFree => self.class_tree(class).insert(segment),
            Return::Partial => {}
            Return::Retired => {
                self.class_tree(class).remove(segment);
                self.segment_tree().insert(segment);
                return true;
            }
        }
        false
    }

    /// A run of `count` segments from the top of the segment tree. If none
    /// is free, give back what slice classes hold idle (their blocks may be
    /// all that holds the segments) and try once more.
    #[inline(never)]
    fn malloc_run(&self, count: u64) -> Option<u64> {
        if count > self.segments as u64 {
            return None;
        }
        self.try_run(count as u32).or_else(|| {
            self.reclaim();
            self.try_run(count as u32)
        })
    }

    /// One claim of a run of `count` segments, published live; no reclaim.
    /// What a waiting run request retries: the reclaim was made by the
    /// `malloc` before the wait, and repeating it each round would keep
    /// [`Heap::reclaim`]'s quiescence wait from ever seeing zero.
    #[inline]
    pub(crate) fn try_run(&self, count: u32) -> Option<u64> {
        let head = self.claim_run(count)?;
        self.table().publish_run(head, count);
        Some(self.segment_address(head))
    }

    /// Publishes an *absent* segment (one the heap was created without, or
    /// that [`Heap::withdraw_free_segment`] took out): inserts it into the
    /// segment tree, where allocations find it. Safe while other threads
    /// allocate: the insert is an acq_rel RMW, so whatever the host did
    /// before the launch (mapping the segment's memory) happens before any
    /// thread that claims it. Returns false (and does nothing) for an id
    /// beyond the heap or a segment in use.
    ///
    /// The caller must pass only absent ids: a present free segment is
    /// already in the tree (inserting it again is harmless), but one that
    /// another thread has just claimed would be handed out twice.
    pub fn add_segment(&self, segment: u32) -> bool {
        if segment >= self.segments || self.table().load(segment) != SegmentState::Free {
            return false;
        }
        self.segment_tree().insert(segment);
        true
    }

    /// Publishes *absent* segments `head..head + count` (mapped by the
    /// host, in no tree) as one live run, as if `malloc` had claimed them:
    /// [`Heap::free`] of the run's address ends it like any run, and its
    /// segments then join the segment tree as free segments. What the VMM
    /// heap's `alloc_large` uses to hand out a range it stitched from
    /// physical memory taken elsewhere. Returns false (and does nothing)
    /// for an empty or out-of-range run, or one with a segment that is not
    /// `Free` (in use) or is in the segment tree (free, not absent).
    ///
    /// The caller must pass only absent ids, and publish nothing else over
    /// them meanwhile: a free segment still in the tree could be claimed by
    /// an allocation as well. No allocation reaches an absent segment, so
    /// the stores need no claim; the head's release store orders the tail
    /// stores before a `free` that reads it.
    pub fn adopt_run(&self, head: u32, count: u32) -> bool {
        let Some(end) = head.checked_add(count) else {
            return false;
        };
        if count == 0 || end > self.segments {
            return false;
        }
        let table = self.table();
        let tree = self.segment_tree();
        if (head..end).any(|s| table.load(s) != SegmentState::Free || tree.contains(s)) {
            return false;
        }
        table.publish_run(head, count);
        true
    }

    /// Takes the highest free segment out of the segment tree and returns
    /// its id: it is now absent, reachable by no allocation, and its memory
    /// may be unmapped. The removal is the same claim allocations make, so a
    /// segment is withdrawn or allocated, never both. `None` when no segment
    /// is wholly free (flush the slots first to return partly used blocks).
    pub fn withdraw_free_segment(&self) -> Option<u32> {
        // Under the run lock, as every claim that must not fail while a
        // free segment exists.
        self.claim_highest_locked()
    }

    /// Wholly free segments in the segment tree now (a snapshot: relaxed
    /// loads of its leaf words). Segments held as slot spares or absent are
    /// not counted. What a growth service watches on a heap whose metadata
    /// it can read directly (the CPU heap); the GPU one downloads the words
    /// [`Heap::segment_tree_leaves`] names and counts their bits.
    pub fn free_segments(&self) -> u32 {
        self.segment_tree().count()
    }

    /// The metadata words (from word 0) that hold the segment tree's leaf
    /// bits: one bit per present, wholly free segment.
    pub fn segment_tree_leaves(&self) -> core::ops::Range<u64> {
        self.trees_at..self.trees_at + self.tree.level_words[0] as u64
    }

    /// Frees memory returned by [`Heap::malloc`]. Null is ignored. A pointer
    /// this heap never handed out is ignored and counted (`InvalidFrees`);
    /// a detected double free is ignored and counted (`DoubleFrees`); with
    /// `TRAP_ON_MISUSE` either also stops the kernel with a message.
    #[inline]
    pub fn free(&self, p: *mut u8) {
        if p.is_null() {
            return;
        }
        let offset = (p as u64).wrapping_sub(self.data);
        if offset >= self.data_bytes() {
            return self.misuse(
                Stat::InvalidFrees,
                b"gpumalloc: free of a pointer outside the heap (%llx)\n\0",
                p as u64,
            );
        }
        let segment = (offset >> self.segment_shift) as u32;
        let within = offset & ((1u64 << self.segment_shift) - 1);
        match self.table().load(segment) {
            SegmentState::Active { class, .. } => {
                let unit_mask = (1u64 << class.unit_shift()) - 1;
                if within & unit_mask != 0 {
                    return self.misuse(
                        Stat::InvalidFrees,
                        b"gpumalloc: free of a misaligned pointer (%llx)\n\0",
                        p as u64,
                    );
                }
                let b = BlockId {
                    segment,
                    block: (within >> class.block_shift(self.segment_shift)) as u32,
                };
                if class.is_slice() {
                    let slice = (within >> class.unit_shift()) as u32
                        & (class.slices_per_block(self.segment_shift) - 1);
                    self.free_slice(class, b, slice);
                } else {
                    self.free_block(class, b);
                }
            }
            SegmentState::RunHead { .. } if within == 0 => match self.table().end_run(segment) {
                Some(count) => self.segment_tree().release_run(segment, count),
                None => self.misuse(
                    Stat::DoubleFrees,
                    b"gpumalloc: double free of a run at %llx\n\0",
                    p as u64,
                ),
            },
            // A segment that came back whole: a pointer that was the start
            // of an allocation there is a double free (as far as the segment
            // remembers: only its last use).
            SegmentState::Free => {
                let double = match self.table().previous(segment) {
                    Previous::Active(class) => within & ((1u64 << class.unit_shift()) - 1) == 0,
                    Previous::RunHead => within == 0,
                    Previous::Nothing => false,
                };
                if double {
                    self.misuse(
                        Stat::DoubleFrees,
                        b"gpumalloc: double free in a free segment (%llx)\n\0",
                        p as u64,
                    )
                } else {
                    self.misuse(
                        Stat::InvalidFrees,
                        b"gpumalloc: free of memory not allocated (%llx)\n\0",
                        p as u64,
                    )
                }
            }
            _ => self.misuse(
                Stat::InvalidFrees,
                b"gpumalloc: free of memory not allocated (%llx)\n\0",
                p as u64,
            ),
        }
    }

    /// Counts a slice dead; threads of a warp freeing slices of the same
    /// block add together.
    #[inline]
    fn free_slice(&self, class: SizeClass, b: BlockId, slice: u32) {
        let global = self.global(b);
        if self.checked() {
            match check_unit_free(self.slice_bits(global), slice) {
                CheckedFree::Freed => {}
                CheckedFree::Double => {
                    return self.misuse(
                        Stat::DoubleFrees,
                        b"gpumalloc: double free of a slice in block %llu\n\0",
                        global,
                    );
                }
                CheckedFree::NeverHandedOut => {
                    return self.misuse(
                        Stat::InvalidFrees,
                        b"gpumalloc: free of a slice never handed out in block %llu\n\0",
                        global,
                    );
                }
            }
        }
        let mask = arch::active_mask();
        let team = arch::match_any64(mask, global);
        // The leader's release add counts every member's slice, so every
        // member's last writes to its slice must happen before that add.
        // A release orders only the leader's own writes (and those it has
        // synchronised with); `match` orders nothing; `bar.warp.sync` over
        // the team orders the members' writes before the leader's add.
        arch::warp_sync(team);
        let lane = arch::lane_id();
        if lane == arch::lowest_lane(team)
            && block::count_freed_slices(
                self.counter(global),
                team.count_ones() as u64,
                class.slices_per_block(self.segment_shift),
            )
        {
            self.by_value().release_block(class, b);
        }
    }

    /// Counts a misuse (and traps, if the heap says so). Inline: it only
    /// picks the counter and the flag, so the handle's address is not
    /// taken; the work is out of line in [`report_misuse`].
    #[inline(always)]
    fn misuse(&self, stat: Stat, message: &'static [u8], value: u64) {
        report_misuse(
            self.stat(stat),
            self.flags & TRAP_ON_MISUSE != 0,
            message,
            value,
        );
    }
}

/// Checked heaps: the state transition of a free. Out of line (it would
/// cost the hot path registers) and a free function: it needs only the
/// check words, not the handle.
#[inline(never)]
#[cold]
fn check_unit_free(states: &[Word], unit: u32) -> CheckedFree {
    block::check_free(states, unit)
}

/// Checked heaps: marks a unit (slice or block) handed out. Out of line
/// and a free function, as [`check_unit_free`].
#[inline(never)]
#[cold]
pub(crate) fn mark_handed_out(states: &[Word], unit: u32) {
    block::mark_live(states, unit);
}

/// Counts a misuse on `counter` (relaxed: a statistic) and, with `trap`,
/// stops the kernel with `message`.
#[inline(never)]
#[cold]
fn report_misuse(counter: &Word, trap: bool, message: &'static [u8], value: u64) {
    arch::fetch_add_relaxed(counter, 1);
    if trap {
        arch::trap_with(message, value);
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    extern crate std;
    use std::vec::Vec;

    use super::*;
    use crate::class::MIN_SEGMENT_SHIFT;

    /// Segments of the block-class tests: 64 blocks of the smallest block
    /// class each (16 MiB since 64 and 128 KiB became slice classes, 4 MiB
    /// since 32 KiB did; 2 MiB before).
    const BLOCK_TEST_SHIFT: u32 = crate::class::MIN_BLOCK_CLASS_SHIFT + 6;

    /// A heap of `segments` segments of the block-class tests' size.
    fn block_test_heap(segments: u64) -> (Heap, Vec<Word>) {
        crate::layout::test_support::test_heap_of(segments, segments as u32, BLOCK_TEST_SHIFT)
    }

    /// The smallest block class: 64 blocks per segment of the tests.
    fn smallest_block_class() -> SizeClass {
        let class = smallest_block_class_on(BLOCK_TEST_SHIFT);
        assert_eq!(class.blocks_per_segment(BLOCK_TEST_SHIFT), 64);
        class
    }

    /// The smallest block class on segments of `1 << shift` bytes.
    fn smallest_block_class_on(shift: u32) -> SizeClass {
        match Request::for_size(1 << crate::class::MIN_BLOCK_CLASS_SHIFT, shift) {
            Request::Class(c) if !c.is_slice() => c,
            r => panic!("{r:?}"),
        }
    }

    /// The format lock's holder formats as many segments as the claimers
    /// in flight want (here its own 32 blocks and two others' 32 each:
    /// 96 blocks, two segments of 64), takes its blocks from the lowest
    /// and leaves the others' demand counted; alone, it formats one. A
    /// segment of the batch no claim used is retired idle.
    #[test]
    fn a_format_fills_the_demand_in_flight() {
        let (h, _words) = block_test_heap(8);
        let class = smallest_block_class();
        let others = 2 * (32 << DEMAND_SHIFT);
        arch::fetch_add_relaxed(h.format_lock(class), others);
        let claim = h.claim_blocks(class, 32);
        assert_eq!((claim.segment(), claim.count()), (0, 32));
        assert_eq!(h.table().load(0), SegmentState::Active { class, free: 32 });
        assert_eq!(h.table().load(1), SegmentState::Active { class, free: 64 });
        assert_eq!(h.table().load(2), SegmentState::Free);
        assert_eq!(h.class_tree(class).count(), 2);
        assert_eq!(arch::load_relaxed(h.format_lock(class)), others);
        // The others found blocks elsewhere: segment 1 was never used, and
        // goes back to the segment tree; segment 0 has blocks out.
        h.retire_idle_segments();
        assert_eq!(h.free_segments(), 7);
        assert_eq!(h.class_tree(class).count(), 1);
        assert_eq!(h.table().load(1), SegmentState::Free);

        let (h, _words) = block_test_heap(8);
        assert_eq!(h.claim_blocks(class, 32).count(), 32);
        assert_eq!(h.class_tree(class).count(), 1);
        assert_eq!(h.free_segments(), 7);
        assert_eq!(arch::load_relaxed(h.format_lock(class)), 0);
    }

    /// A drop in its window (its segment, with 32 free blocks, out of the
    /// class tree and about to go back) on a heap with no free segment: a
    /// plain claim answers nothing beside those blocks; the settled claim
    /// (a request's last try) waits for the window to close and gets them.
    #[test]
    fn a_settled_claim_waits_for_a_drop_in_flight() {
        let (h, _words) = block_test_heap(1);
        let class = smallest_block_class();
        assert_eq!(h.claim_blocks(class, 32).count(), 32);
        assert_eq!(h.free_segments(), 0);
        // A dropper between its remove and its re-insert.
        let window = h.out_of_tree(class);
        arch::fetch_add_relaxed(window, WINDOW_OPENED + WINDOW_OPEN);
        h.class_tree(class).remove(0);
        assert_eq!(h.claim_blocks(class, 8).count(), 0);
        let h = &h;
        std::thread::scope(|s| {
            let waiter = s.spawn(move || h.claim_blocks_settled(class, 8).count());
            std::thread::sleep(std::time::Duration::from_millis(20));
            h.class_tree(class).insert(0);
            arch::fetch_add_release(window, WINDOW_OPEN.wrapping_neg());
            assert_eq!(waiter.join().unwrap(), 8);
        });
        assert_eq!(h.table().load(0), SegmentState::Active { class, free: 24 });
    }

    /// A demand of more than a segment-tree word's worth of segments (here
    /// 150 segments of 64 blocks, on a heap of 200) formats a batch over
    /// three tree words, one claim of the segment tree per word: the
    /// caller's blocks come from the lowest segment, the others' demand
    /// stays counted, and every segment of the batch is in the class tree
    /// with all its blocks free.
    #[test]
    fn a_batch_spans_several_tree_words() {
        let (h, _words) = block_test_heap(200);
        let class = smallest_block_class();
        let others = (150 * 64 - 32) << DEMAND_SHIFT;
        arch::fetch_add_relaxed(h.format_lock(class), others);
        let claim = h.claim_blocks(class, 32);
        assert_eq!((claim.segment(), claim.count()), (0, 32));
        assert_eq!(h.table().load(0), SegmentState::Active { class, free: 32 });
        for s in 1..150 {
            assert_eq!(h.table().load(s), SegmentState::Active { class, free: 64 });
        }
        assert_eq!(h.table().load(150), SegmentState::Free);
        assert_eq!(h.class_tree(class).count(), 150);
        assert_eq!(h.free_segments(), 50);
        assert_eq!(arch::load_relaxed(h.format_lock(class)), others);
        // Claims spread over the batch's words: a salted wide pick lands
        // beyond the first word, and every block is still handed out once.
        let picked = h.class_tree(class).pick_wide(0, 0xc000_0000).unwrap().0;
        assert!(picked >= 64, "{picked}");
    }

    /// A five-lane host warp formats a batch of 150 segments (three
    /// segment-tree words) as a team (`format_batch_team`, as
    /// `malloc_block` does after its leader won the format lock), while
    /// four lone claimers wait for the batch and then claim until the heap
    /// is empty, yielding at every third RMW: the team gets the first five
    /// blocks of the lowest segment, every block of the heap is handed out
    /// once, and the lock ends free with no demand counted.
    #[test]
    fn a_team_formats_a_batch_while_others_claim() {
        use crate::arch::ThreadWarp;
        const LANES: u32 = 5;
        let segments = 200;
        let (h, _words) = block_test_heap(segments);
        let class = smallest_block_class();
        let h = &h;
        // The leader's win: the lock held with its team's demand counted.
        arch::fetch_add_relaxed(
            h.format_lock(class),
            FORMAT_HELD + ((LANES as u64) << DEMAND_SHIFT),
        );
        let warp = ThreadWarp::new(LANES);
        let mut all: Vec<(u32, u32)> = std::thread::scope(|s| {
            let team: Vec<_> = (0..LANES)
                .map(|lane| {
                    let warp = warp.clone();
                    s.spawn(move || {
                        let mask = warp.mask();
                        arch::join_thread_warp(warp, lane);
                        arch::preempt_every(3);
                        let claim = h.format_batch_team(class, mask, 150);
                        assert_eq!((claim.segment(), claim.count()), (0, LANES));
                        let b = claim.take(h, class, arch::rank_in(mask, lane));
                        arch::leave_thread_warp();
                        std::vec![(b.segment, b.block)]
                    })
                })
                .collect();
            let lone: Vec<_> = (0..4u32)
                .map(|t| {
                    s.spawn(move || {
                        arch::preempt_every(3);
                        claim_until_empty(h, class, t)
                    })
                })
                .collect();
            team.into_iter()
                .chain(lone)
                .flat_map(|w| w.join().unwrap())
                .collect()
        });
        all.sort_unstable();
        assert_eq!(
            &all[..LANES as usize],
            &[(0, 0), (0, 1), (0, 2), (0, 3), (0, 4)]
        );
        let total = all.len();
        all.dedup();
        assert_eq!(all.len(), total, "a block handed out twice");
        assert_eq!(total as u64, segments * 64);
        assert_eq!(arch::load_relaxed(h.format_lock(class)), 0);
    }

    /// Eight threads claiming 1–32 blocks at a time, yielding at every
    /// third RMW (races on the lowest segment, on the lock, batches sized
    /// by each other's demand): every block of the heap is handed out
    /// exactly once before the first empty claim, so no batch stranded a
    /// block, and the format lock ends free with no demand counted.
    #[test]
    fn racing_claims_hand_out_every_block_once() {
        race_claims_until_empty(smallest_block_class(), BLOCK_TEST_SHIFT, 16, 0);
    }

    /// As above, with a standing demand of 200 segments counted in the
    /// lock (claimers the host threads stand in for): every batch spans
    /// several segment-tree words, claims spread over them (`pick_wide`),
    /// and still every block is handed out once.
    #[test]
    fn racing_claims_over_batches_of_several_words() {
        race_claims_until_empty(smallest_block_class(), BLOCK_TEST_SHIFT, 300, 200 * 64);
    }

    /// On 2 MiB segments, where the smallest block class (256 KiB since 64
    /// and 128 KiB became slice classes) has 8 blocks, part of one bitmap
    /// word: racing claims hand out every block of the heap once, and none
    /// beyond a segment's 8 (a bit above them would be a block past the
    /// segment's end).
    #[test]
    fn racing_claims_on_part_of_a_bitmap_word() {
        let class = smallest_block_class_on(MIN_SEGMENT_SHIFT);
        let blocks = class.blocks_per_segment(MIN_SEGMENT_SHIFT);
        assert!(blocks < 64, "{blocks} blocks: a whole word");
        race_claims_until_empty(class, MIN_SEGMENT_SHIFT, 16, 0);
    }

    /// The smallest slice class: 16 blocks of 128 KiB (8,192 slices of
    /// 16 B) per 2 MiB segment.
    fn class_16() -> SizeClass {
        match Request::for_size(16, MIN_SEGMENT_SHIFT) {
            Request::Class(c) if c.is_slice() => c,
            r => panic!("{r:?}"),
        }
    }

    /// A counted format runs only while the formats in flight fall short
    /// of the demand in flight: one format in flight (16 blocks) covers a
    /// demand of 16 and the claimer waits, leaving the word as it was; it
    /// does not cover 40, and the claimer counts a format of its own in
    /// flight. A claim with nothing in flight formats one segment, keeps
    /// its blocks, leaves the rest in the class tree and takes its counts
    /// back.
    #[test]
    fn a_counted_format_runs_only_while_the_demand_is_short() {
        let (h, _words) = crate::layout::test_support::test_heap(4, 4);
        let class = class_16();
        let blocks = class.blocks_per_segment(MIN_SEGMENT_SHIFT);
        assert_eq!(blocks, 16);
        let lock = h.format_lock(class);
        arch::fetch_add_relaxed(lock, FORMAT_ONE + (16 << DEMAND_SHIFT));
        assert!(!h.counted_format_due(class, blocks));
        assert_eq!(arch::load_relaxed(lock), FORMAT_ONE + (16 << DEMAND_SHIFT));

        arch::fetch_add_relaxed(lock, 24 << DEMAND_SHIFT);
        assert!(h.counted_format_due(class, blocks));
        assert_eq!(
            arch::load_relaxed(lock),
            2 * FORMAT_ONE + (40 << DEMAND_SHIFT)
        );
        // Through a claim: the one format in flight above covers a claim
        // of 2 alone, so with it taken back the claimer formats segment 0.
        arch::fetch_add_relaxed(lock, (2 * FORMAT_ONE + (40 << DEMAND_SHIFT)).wrapping_neg());
        if COUNTED_FORMAT == 2 {
            let claim = h.claim_blocks(class, 2);
            assert_eq!((claim.segment(), claim.count()), (0, 2));
            assert_eq!(arch::load_relaxed(lock), 0);
            assert_eq!(h.table().load(0), SegmentState::Active { class, free: 14 });
            assert_eq!(h.class_tree(class).successor(0), Some(0));
            assert_eq!(h.free_segments(), 3);
        }
    }

    /// A counted claimer whose own format finds the segment tree empty
    /// answers null only once no format is in flight: here another
    /// claimer's format (counted by hand, with its demand) is in flight
    /// when the segment tree runs out, and its segment, published while
    /// the first claimer waits, serves it.
    #[test]
    fn a_counted_claim_waits_for_the_formats_in_flight_before_a_null() {
        if COUNTED_FORMAT != 2 {
            return;
        }
        let (h, _words) = crate::layout::test_support::test_heap(2, 2);
        let class = class_16();
        let lock = h.format_lock(class);
        // The other claimer: segment 0 claimed for its format, 100 blocks
        // of demand (so this claimer's format is due too), one format in
        // flight.
        let (first, ids) = h.segment_tree().claim_low_many(1, 0).unwrap();
        let segment = first + ids.trailing_zeros();
        arch::fetch_add_relaxed(lock, FORMAT_ONE + (100 << DEMAND_SHIFT));
        // Segment 1 taken by someone else: the tree is empty.
        assert!(h.segment_tree().claim_low_many(1, 0).is_some());
        let h = &h;
        let claim = std::thread::scope(|s| {
            let claimer = s.spawn(move || h.claim_blocks(class, 2));
            std::thread::sleep(std::time::Duration::from_millis(20));
            // The other format completes: published, in the class tree,
            // its counts taken back.
            h.format_claimed(segment, class, 0);
            h.class_tree(class).insert(segment);
            arch::fetch_add_release(lock, (FORMAT_ONE + (100 << DEMAND_SHIFT)).wrapping_neg());
            claimer.join().unwrap()
        });
        assert_eq!((claim.segment(), claim.count()), (segment, 2));
        assert_eq!(arch::load_relaxed(lock), 0);
    }

    /// Eight threads claim 1–32 blocks of the smallest slice class (16
    /// per segment, so every claim of 16 or more takes a segment whole and
    /// the others format counted) on 16 segments until their first empty
    /// claim: every block is handed out once, and the lock word ends with
    /// no demand and no format counted.
    #[test]
    fn racing_slice_claims_hand_out_every_block_once() {
        race_claims_until_empty(class_16(), MIN_SEGMENT_SHIFT, 16, 0);
    }

    /// Thread `t`'s claims of 1–32 blocks of `class` (a size that varies
    /// with `t` and the step) until its first empty claim: the (segment,
    /// block) of every block it took.
    fn claim_until_empty(h: &Heap, class: SizeClass, t: u32) -> Vec<(u32, u32)> {
        let mut mine = Vec::new();
        for step in 0u32.. {
            let claim = h.claim_blocks(class, 1 + (t * 7 + step * 13) % 32);
            if claim.count() == 0 {
                break;
            }
            for rank in 0..claim.count() {
                let b = claim.take(h, class, rank);
                mine.push((b.segment, b.block));
            }
        }
        mine
    }

    /// Eight threads claim blocks of `class` on a heap of `segments`
    /// segments of `1 << shift` bytes until their first empty claim, with
    /// `standing` blocks of demand counted in the format lock throughout:
    /// every block is handed out once, and every one handed out exists.
    fn race_claims_until_empty(class: SizeClass, shift: u32, segments: u64, standing: u64) {
        let (h, _words) =
            crate::layout::test_support::test_heap_of(segments, segments as u32, shift);
        let blocks = class.blocks_per_segment(shift) as u64;
        let h = &h;
        arch::fetch_add_relaxed(h.format_lock(class), standing << DEMAND_SHIFT);
        let mut all: Vec<(u32, u32)> = std::thread::scope(|s| {
            let workers: Vec<_> = (0..8u32)
                .map(|t| {
                    s.spawn(move || {
                        arch::preempt_every(3);
                        claim_until_empty(h, class, t)
                    })
                })
                .collect();
            workers
                .into_iter()
                .flat_map(|w| w.join().unwrap())
                .collect()
        });
        all.sort_unstable();
        let total = all.len();
        all.dedup();
        assert_eq!(all.len(), total, "a block handed out twice");
        assert_eq!(total as u64, segments * blocks);
        assert!(
            all.iter()
                .all(|&(s, b)| (s as u64) < segments && (b as u64) < blocks),
            "a block outside the heap's segments"
        );
        assert_eq!(
            arch::load_relaxed(h.format_lock(class)),
            standing << DEMAND_SHIFT
        );
        h.retire_idle_segments();
        assert_eq!(h.free_segments(), 0, "every segment has blocks out");
    }
}
