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
//! team add (relaxed, dependency-ordered: it hands out indices, see
//! `malloc_slice`), the installer's exchange, a flush's CAS and a reclaim's CAS
//! of an idle word (acq_rel); spare words by the installer's CAS from 0 and
//! by swaps. `reclaim` runs only on the way to a null and returns when no
//! other reclaim is in flight.

use crate::arch::{self, Word};
use crate::block;
use crate::class::{SLICE_CLASSES, SizeClass};
use crate::heap::{BlockId, Claim};
use crate::install_clock::Interval;
use crate::layout::{Heap, NO_SPARES, RECLAIMS_WORD};
use crate::slot::{
    RUNS, SLOT_RUN_MAX, SLOTS_PER_CLASS, SPARES_PER_SLOT, SlotWord, WIDE_SPARES_PER_SLOT,
};

/// Slot blocks of one class stay within heap / 2^this (8 unless
/// `GPUMALLOC_SLOT_BUDGET_SHIFT` is set at build time). "Heap" in this
/// budget and those below is the handle's budget (`Heap::budget_bytes`):
/// the heap's size, or on a heap that maps memory as it grows, what is
/// mapped (a heap reserving 16 GiB with 4 GiB mapped gets a 4 GiB heap's
/// budgets).
const SLOT_BUDGET_SHIFT: u32 =
    crate::class::build_knob(option_env!("GPUMALLOC_SLOT_BUDGET_SHIFT"), 8);
/// Slot blocks of a class whose block fills a segment stay within heap /
/// 2^this (`SLOT_BUDGET_SHIFT` unless `GPUMALLOC_WHOLE_SLOT_BUDGET_SHIFT`
/// is set at build time). A diagnostic for issue 12's 2 KiB gap: on the
/// bench's 16 GiB heaps (8 MiB segments) 2 and 4 KiB get 8 slots at 1/256,
/// where be7ddc7 gave every class 32, so each slot installs four times as
/// many blocks one after another; 6 gives them 32 again without raising
/// the slot count of any other class (`docs/PERF.md`).
const WHOLE_SLOT_BUDGET_SHIFT: u32 = crate::class::build_knob(
    option_env!("GPUMALLOC_WHOLE_SLOT_BUDGET_SHIFT"),
    SLOT_BUDGET_SHIFT,
);
/// Slot blocks of every class whose block fills a segment, all of them
/// together, stay within heap / 2^this (5 by default; 0: off, and
/// `WHOLE_SLOT_BUDGET_SHIFT` rules). Chosen for issue 12: at the
/// first null every slot beyond a class's first strands about a whole
/// segment when the class's demand is a few blocks (`docs/PERF.md`, "Where
/// w6 and fmt2 strand"), so the budget is shared by the classes that hold
/// whole segments rather than given to each: with 5, the bench's 16 GiB
/// heap (8 MiB segments, 2 such classes when this was chosen) gave 2 and
/// 4 KiB 32 slots as `w6` did, the 8.4 GiB demand + 3% heap (4 MiB, 3
/// classes) 16 where `w6` gave 32, and the 256 MiB heap (2 MiB, 4
/// classes) 1 as the default. Since 8 and 16 KiB became slice classes the
/// bench heap has 4 such classes (2 … 16 KiB, 16 slots each), and 32, 64
/// and 128 KiB share without being counted ([`whole_segment_shares`]).
const WHOLE_SLOT_SHARE_SHIFT: u32 =
    crate::class::build_knob(option_env!("GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT"), 5);
/// Heaps of at least 2^this bytes of budget (16 GiB by default; 0: none) follow the
/// large-heap rules: the unlocked-format rule of `heap.rs`
/// (`LARGE_HEAP_UNLOCKED_FORMAT_SHIFT`) and, where
/// `LARGE_HEAP_SLOT_BUDGET_SHIFT` is set, that slot budget. Issue 12: a
/// herd that formats without the lock strands at most a segment per slot,
/// 1.6% of a 16 GiB heap but a tenth of a 256 MiB one, so only large heaps
/// take the faster rule (`docs/PERF.md`, "wshare5f2").
pub(crate) const LARGE_HEAP_SHIFT: u32 =
    crate::class::build_knob(option_env!("GPUMALLOC_LARGE_HEAP_SHIFT"), 34);
/// The slot budget of every slice class on heaps of `LARGE_HEAP_SHIFT` and
/// more, as heap / 2^this (`GPUMALLOC_LARGE_HEAP_SLOT_BUDGET_SHIFT`; 0, the
/// default: none, the budgets of other heaps). A diagnostic for issue 12
/// (`big34` sets 6): it made 2 and 4 KiB as fast as the shared budget
/// does, but frees of 4 KiB 23-25% slower than be7ddc7 on the H100.
const LARGE_HEAP_SLOT_BUDGET_SHIFT: u32 =
    crate::class::build_knob(option_env!("GPUMALLOC_LARGE_HEAP_SLOT_BUDGET_SHIFT"), 0);
/// Slot and spare blocks of one class stay within heap / 2^this.
const SPARE_BUDGET_SHIFT: u32 = 3;
/// Slot and spare blocks of a class whose block fills a segment, counted for
/// every slot it could use, stay within heap / 2^this: 3 (the same share as
/// other classes) unless `GPUMALLOC_SEGMENT_SPARE_BUDGET_SHIFT` is set at
/// build time. So such spares need a heap of 1024 segments or more: with
/// the segment size each heap chooses (`class::segment_shift_for`, at
/// least 2048 segments from 4 GiB up) the 16 GiB bench heaps (8 MiB
/// segments) and the 8.4 GiB demand + 3% heap (4 MiB) keep them, 2 GiB of
/// 2 MiB segments just does, and the 256 MiB and 1 GiB heaps keep none.
/// Idle spares are reclaimed before any request fails. 6 (1/64, the rule
/// before) left every heap below 8192 segments without them, and cost the
/// bench's 4 KiB allocations 20% on the H100 (`docs/PERF.md`).
const SEGMENT_SPARE_BUDGET_SHIFT: u32 =
    crate::class::build_knob(option_env!("GPUMALLOC_SEGMENT_SPARE_BUDGET_SHIFT"), 3);

/// Whether a slot's first install claims spares too
/// (`GPUMALLOC_FIRST_INSTALL_SPARES`): 2, the default, not where its claim
/// with them would take less than a segment (16–256 B on the bench heap);
/// 1: always, the rule before 2026-11-24's eleventh session; 0: never.
/// Why: at a mixed burst's peak, spares were 0.37 of what was asked, since
/// every slot of a class whose demand is a few slices claims its spares
/// with its first block and never pops them. H100, kernel alone, against
/// 1: mixed −6% with its spares 0.37 → 0.27 and its span 1.94 → 1.85;
/// 256 B +7% alone (a burst's first wave claims one block per slot, so
/// its second comes sooner), other sizes ±4%. With 0, the mixed span fell
/// to 1.74–1.79 but 512 B and 1 KiB alone were 13–16% slower: their first
/// claims no longer took a whole segment (`docs/PERF.md`, "A slot's first
/// block without spares").
const FIRST_INSTALL_SPARES: u32 =
    crate::class::build_knob(option_env!("GPUMALLOC_FIRST_INSTALL_SPARES"), 2);

/// Claims sized by the demand waiting on the slot (`GPUMALLOC_DEMAND_CLAIM`,
/// 8 unless set at build time; 0 turns it off): an installer that has to
/// claim reads its slot word again, and the teams that added past the
/// displaced version's end while it got here are the demand it knows of.
/// It then claims at most the blocks that `DEMAND_CLAIM` times that demand
/// fills (at least one), so spares and runs come only where waiting teams
/// will use them; a class that claims whole segments keeps doing so, one
/// at least. Why: at a mixed burst's peak, 512 B held 256 MiB for 32 MiB
/// handed out, every slot's first claim a whole segment as one run. H100,
/// three processes each against 0: the mixed span 1.99 → 1.74, 512 B's
/// held segments 256 → 96 MiB, mixed allocation −3% (kernel alone −9%),
/// 512 B and 1 KiB +8% and +4% (+2%, +3% kernel alone), other sizes
/// within the spread; demand + 3% 100.00% against 99.78%. With 1 the span
/// fell to 1.59 but 512 B took 2.5 times as long: a burst of one size has
/// less than a block waiting at most claims too (`docs/PERF.md`, "Claims
/// sized by the waiting demand").
const DEMAND_CLAIM: u32 = crate::class::build_knob(option_env!("GPUMALLOC_DEMAND_CLAIM"), 8);

/// The size-dependent rules of a heap ([`Heap::rules`]): what its size
/// selects, for tests that compare heaps and for reports.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapRules {
    /// Slots in use per slice class, 16 B first (`Heap::slots_for`).
    pub slots: [u32; SLICE_CLASSES as usize],
    /// Spare blocks an install claims per slice class (0 or
    /// `SPARES_PER_SLOT`).
    pub spares: [u32; SLICE_CLASSES as usize],
    /// Segments a claim for the class's stripe takes (`crate::stripe`;
    /// 0: the class draws from none).
    pub stripes: [u32; SLICE_CLASSES as usize],
    /// With `GPUMALLOC_COUNTED_FORMAT=0`: a slot installer that takes
    /// 1 / 2^this of a new segment's blocks formats it without the class's
    /// format lock (`heap.rs`; with `=1` such installers format counted).
    /// The default formats every slice class counted and ignores it.
    pub unlocked_format_shift: u32,
}

/// Which claims of blocks inside a segment (16 B … 1 KiB on the bench heap)
/// install runs (`GPUMALLOC_SLOT_RUN_BLOCKS`; runs of whole segments need
/// only `GPUMALLOC_SLOT_RUN`): 0 none; 1 those of classes that are not
/// wide (256 B … 1 KiB on the bench heap) that formatted their segment,
/// whose blocks lie in order and need no RMW to take; 2 any, taking the
/// next blocks of a reserved claim from the bitmap before the word is
/// published, one RMW each; 3 (the default) as 1, and a reserved claim of
/// those classes too, whose first blocks are taken at their ticket bits
/// with the one RMW that took its first block alone
/// ([`Claim::take_at_ticket`]). H100, kernel alone, 1 against 0: 512 B
/// −21%, 1 KiB −14%, 256 B −2%, other sizes and mixed within ±5%; with wide
/// classes too, 32 B was +11% (not traced; its claims take two blocks, so
/// every install then claims where every other one popped a spare). 3
/// against 1: 256 B −8 … −11% in three runs, other sizes and mixed within
/// ±3% (`docs/PERF.md`, "Reserved claims' runs in one RMW").
const RUN_BLOCKS: u32 = crate::class::build_knob(option_env!("GPUMALLOC_SLOT_RUN_BLOCKS"), 3);

/// How a slot claim of a class whose segment holds a few blocks, fewer
/// than the claim wants (1 + spares) and no more than a run
/// (`SLOT_RUN_MAX`), gets them (1 KiB at 8 MiB segments, 512 B at 4 MiB,
/// 256 B at 2 MiB: two blocks to a segment). `GPUMALLOC_SEGMENT_RUNS`:
/// 0, one segment through the class tree (`Heap::claim_blocks`, which
/// formats it for the claim alone); 1, whole segments from one
/// segment-tree word ([`Heap::claim_whole_segments`], as the classes whose
/// block fills a segment), as many as the claim wants, so that adjacent
/// segments make one run (two segments of two blocks: a run of four); 2,
/// one segment by that path (the same run of two as 0, without the class
/// tree and its format lock); 3, as 2, but the segment from the top of the
/// lowest tree word that has one, so that these single claims stay off the
/// lowest ids, where the whole-segment classes take runs of adjacent
/// segments (`Heap::claim_whole_segment_from_top`); 4 (the default since
/// 2026-11-24's fifteenth session), as 3 once a class whose block fills a
/// segment has claimed segments on the heap, as 2 before
/// (`Heap::whole_segment_runs_taken`), so that a burst of these claims
/// alone packs from the lowest ids. H100, kernel alone, 4 against 0, two
/// runs: 1 KiB −14% and −13%, mixed −3% and +4%, the 1 KiB span 1.06–1.10
/// (3: mixed −10% but the 1 KiB span 1.49; 2: mixed +5%; `docs/PERF.md`,
/// "1 KiB's single claims beside the runs").
const SEGMENT_RUNS: u32 = crate::class::build_knob(option_env!("GPUMALLOC_SEGMENT_RUNS"), 4);

/// What [`Heap::reserve_if_open`] answers for a slot with nothing left (not
/// a valid slot word: its block field is all ones).
const CLOSED: u64 = u64::MAX;

/// Blocks an install claimed beyond the one it installs, parked as spares
/// after the slot word is replaced.
#[derive(Clone, Copy)]
enum Extra {
    Nothing,
    /// Blocks `from..count` of a claim (the ones before `from` are taken:
    /// the installed block, and with runs those that joined it or were
    /// parked already). `held`: ranks at or after `from` whose blocks are
    /// taken already, at their ticket ([`Claim::take_at_ticket`]).
    Blocks {
        claim: Claim,
        from: u32,
        held: u32,
    },
    /// Whole segments `first + k` for each bit `k` of `rest`, each of
    /// `1 << shift` blocks (0 for a class whose block fills a segment), all
    /// taken by the claim; the installed block is block 0 of the segment
    /// before them, whose other blocks join its run.
    Segments {
        first: u32,
        rest: u64,
        shift: u32,
    },
}

impl Extra {
    /// With runs: how many blocks the install of `installed` takes as one
    /// run (up to [`SLOT_RUN_MAX`]), taking them out of `self` so that only
    /// the others are parked. The run is the whole
    /// segments right after `installed` that this claim took; a claim of
    /// blocks inside a segment is [`Heap::take_run`]'s.
    #[inline(always)]
    fn take_run(&mut self, installed: BlockId) -> u32 {
        let Extra::Segments { first, rest, shift } = self else {
            return 1;
        };
        // Bits of `rest` above the installed segment's, as offsets from it.
        let offset = installed.segment() - *first;
        let adjacent = (1 + (*rest >> offset >> 1).trailing_ones()) << *shift;
        // Every adjacent block up to the most a run holds, in whole
        // segments (segments of several blocks: `SEGMENT_RUNS`). A claim of
        // such segments is made only where one fits in a run, so the run
        // holds at least the installed segment.
        let run = (adjacent.min(SLOT_RUN_MAX) >> *shift) << *shift;
        // The run's other segments: bits offset + 1 .. offset + segments
        // (none beyond the installed one when it is the word's last id,
        // offset 63, where the shift below would pass the word).
        let segments = run >> *shift;
        if segments > 1 {
            *rest &= !((((1u64 << segments) >> 1) - 1) << (offset + 1));
        }
        run
    }
}

#[cfg(loom)]
impl Heap {
    /// Loom models: claims `run` adjacent whole segments for `class` (a
    /// whole-segment class, on a heap whose lowest segments are free) and
    /// installs them in slot `slot` as one run with no slice taken, as an
    /// install with runs would. The word it displaces is retired.
    #[doc(hidden)]
    pub fn loom_install_run(&self, class: SizeClass, slot: u32, run: u32) {
        let (first, taken) = self
            .claim_whole_segments(class, run)
            .expect("free segments");
        let installed = BlockId::whole_segment(first + taken.trailing_zeros());
        let mut extra = Extra::Segments {
            first,
            rest: taken & (taken - 1),
            shift: 0,
        };
        assert_eq!(extra.take_run(installed), run, "adjacent segments");
        let word = self.slot(class, slot);
        let seen = SlotWord(arch::load_relaxed(word));
        let next = SlotWord::new_run(
            self.global(installed),
            run,
            0,
            seen.generation().wrapping_add(1),
        );
        let displaced = SlotWord(arch::swap_acq_rel(word, next.0));
        self.retire(class, displaced);
    }
}

/// Waits while `word` shows `seen`'s version with more slices reserved than
/// its capacity: an installer then owns index `cap` (exactly one per version,
/// see [`crate::slot`]) and its exchange will change the word. Within one
/// version `reserved` only grows, so the wait ends with that exchange. A
/// word with `seen`'s block and generation but `reserved <= cap` is a later
/// version whose 8-bit generation wrapped (ABA): the caller retries rather
/// than waiting for a change that may never come.
#[inline(always)]
fn wait_for_install(word: &Word, seen: SlotWord, per_block: u32, round: &mut u32) {
    loop {
        let now = SlotWord(arch::load_relaxed(word));
        if now.version() != seen.version() || now.reserved() <= now.capacity(per_block) {
            return;
        }
        arch::backoff(*round);
        *round += 1;
    }
}

/// How many slice classes up to `2^top` bytes have a block that fills a
/// segment of `1 << segment_shift` bytes: the units `u <= top` with
/// `u + slices_shift(u) >= segment_shift`, where a wide class's slices
/// shift is `SLICES_PER_BLOCK_SHIFT` and any other's `STANDARD_SLICES_SHIFT`
/// (`class::SizeClass::slices_shift`), counted in closed form (the slot
/// count is on the fast path).
#[inline(always)]
fn whole_segment_classes(segment_shift: u32, top: u32) -> u32 {
    use crate::class::{SLICES_PER_BLOCK_SHIFT, STANDARD_SLICES_SHIFT, WIDE_BLOCK_MAX_UNIT_SHIFT};
    // Wide units in [segment_shift - SLICES_PER_BLOCK_SHIFT, cut], the
    // others in [segment_shift - STANDARD_SLICES_SHIFT, top] above the
    // cut; both bounds are above MIN_SLICE_SHIFT for every segment size.
    let wide_from = segment_shift - SLICES_PER_BLOCK_SHIFT;
    if WIDE_BLOCK_MAX_UNIT_SHIFT >= top {
        // Every class counted wide (`top` as the cut): one range.
        return top + 1 - wide_from;
    }
    let cut = WIDE_BLOCK_MAX_UNIT_SHIFT;
    let wide = (cut + 1).saturating_sub(wide_from);
    let standard_from = (segment_shift - STANDARD_SLICES_SHIFT).max(cut + 1);
    let standard = (top + 1).saturating_sub(standard_from);
    wide + standard
}

/// How many ways the classes whose block fills a segment split the
/// whole-segment slot share ([`WHOLE_SLOT_SHARE_SHIFT`]): those classes up
/// to 16 KiB ([`SHARED_UP_TO_SHIFT`]). 32 KiB joined the slice classes on 2026-11-24 without a
/// share of its own: counted, it made the bench heap's (8 MiB segments)
/// four classes five, which rounded up to eight shares and halved 2 …
/// 16 KiB's slots (+49 … +57% allocation time on the H100, `docs/PERF.md`,
/// "32 KiB becomes a slice class"). Uncounted, every heap keeps the slot
/// counts it had, 32 KiB gets 16 KiB's, and the classes together may hold
/// up to 5/4 of the share. 64 and 128 KiB followed on 2026-11-25 the same
/// way: up to 7/4 of the share on the bench heap, 3/2 on 16 MiB segments.
#[inline(always)]
fn whole_segment_shares(segment_shift: u32) -> u32 {
    whole_segment_classes(segment_shift, SHARED_UP_TO_SHIFT)
}

/// log2 of the largest class counted in the whole-segment share's split
/// (16 KiB, every slice class of `GPUMALLOC_MAX_SLICE_SHIFT=14`;
/// [`whole_segment_shares`]).
const SHARED_UP_TO_SHIFT: u32 = 14;

impl Heap {
    /// The slice path: warp teams reserve slices from their slot's block.
    #[inline]
    pub(crate) fn malloc_slice(&self, class: SizeClass) -> Option<u64> {
        let slots = self.slots_for(class);
        let per_block = class.slices_per_block(self.segment_shift);
        let home = arch::sm_id() & (slots - 1);
        self.slice_loop(class, per_block, home, home, false)
    }

    /// The loop of [`Heap::malloc_slice`] from `slot`: adding (or, when
    /// `stealing`, reserving from open words only) until a hand-out, or
    /// until every slot after `home` was visited in stealing mode.
    /// `per_block` is the class's slices per block.
    #[inline(always)]
    fn slice_loop(
        &self,
        class: SizeClass,
        per_block: u32,
        home: u32,
        mut slot: u32,
        mut stealing: bool,
    ) -> Option<u64> {
        // After the home slot found the heap exhausted, visit every other
        // slot once for slices left in its block before giving up: all
        // `SLOTS_PER_CLASS` of them, not only this handle's `slots`. A
        // handle with a smaller budget (made before a VMM heap grew, or
        // after it trimmed) has fewer slots than others that installed
        // blocks, and would otherwise answer null beside their slices.
        let all = SLOTS_PER_CLASS - 1;
        let mut round = 0;
        loop {
            let (team, lane, leader, rank) =
                arch::warp_team(class.index() * SLOTS_PER_CLASS + slot);
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
                    self.reserve_if_open(word, size, per_block)
                } else {
                    arch::fetch_add_dependent(word, size as u64)
                };
            }
            let seen = SlotWord(arch::shfl_u64(team, seen, leader));
            if seen.0 == CLOSED {
                slot = (slot + 1) & all;
                if slot == home {
                    return None;
                }
                continue;
            }
            let (first, cap) = (seen.reserved(), seen.capacity(per_block));
            let index = first + rank;
            // Whether this team installs is decided for the whole team before
            // any member leaves: the leader installs even when its own slice
            // came from the old block, since every member must reach the
            // shuffle.
            let installer = first <= cap && cap < first + size;
            let mut fresh = 0;
            if installer {
                if lane == leader {
                    let taken = first + size - cap;
                    let called = crate::install_clock::start();
                    fresh = if crate::heap::SPLIT_COLD {
                        // Through a pointer the optimiser cannot see: ptxas
                        // then calls it by the ABI, and `install`'s chain
                        // does not stack on this loop's live registers.
                        let install: fn(&Heap, SizeClass, u32, u32, u64) -> u64 =
                            core::hint::black_box(Heap::install);
                        self.with_handle(|h| install(h, class, slot, taken, seen.0))
                    } else {
                        self.with_handle(|h| h.install(class, slot, taken, seen.0))
                    };
                    self.count_install(class, Interval::Call, called, false);
                }
                fresh = arch::shfl_u64(team, fresh, leader);
            }
            if index < cap {
                return Some(self.hand_out(class, seen.block().unwrap_or(0), index));
            }
            if fresh != 0 {
                return Some(self.hand_out(class, fresh - 1, index - cap));
            }
            if installer {
                // Out of blocks: look for slices left in the other slots.
                stealing = true;
            }
            if stealing {
                slot = (slot + 1) & all;
                if slot == home {
                    return None;
                }
                continue;
            }
            // Past the end: our team's range lies wholly past the capacity
            // (else it would hold index `cap` and install), so wait until the
            // installer replaces the word.
            let began = crate::install_clock::start();
            wait_for_install(word, seen, per_block, &mut round);
            if lane == leader {
                self.count_wait(class, began);
            }
        }
    }

    /// [`Heap::malloc_slice`]'s stealing pass alone (`heap::SPLIT_HOME`,
    /// inside `Heap::malloc_cold`): after [`Heap::slice_at_home`]'s install
    /// found no block, every slot after home once for slices left in its
    /// block.
    #[inline(always)]
    pub(crate) fn malloc_slice_stealing(&self, class: SizeClass) -> Option<u64> {
        let per_block = class.slices_per_block(self.segment_shift);
        let home = arch::sm_id() & (self.slots_for(class) - 1);
        let next = (home + 1) & (SLOTS_PER_CLASS - 1);
        if next == home {
            return None;
        }
        self.slice_loop(class, per_block, home, next, true)
    }

    /// [`Heap::malloc_slice`]'s loop at the home slot alone
    /// (`heap::SPLIT_HOME`), inline in the kernel: the team's add, the
    /// hand-out, the wait past the end and the install, whose leader alone
    /// calls [`Heap::install`] by the ABI. The installing branch ends the
    /// loop whatever the install returns (a hand-out, or `None` when it
    /// found no block: the caller then runs the stealing pass out of
    /// line), so the call holds only what that branch needs after it.
    #[inline(always)]
    pub(crate) fn slice_at_home(&self, class: SizeClass) -> Option<u64> {
        let per_block = class.slices_per_block(self.segment_shift);
        let home = arch::sm_id() & (self.slots_for(class) - 1);
        let word = self.slot(class, home);
        let mut round = 0;
        loop {
            let (team, lane, leader, rank) =
                arch::warp_team(class.index() * SLOTS_PER_CLASS + home);
            let size = team.count_ones();
            let mut seen = 0u64;
            if lane == leader {
                // Relaxed and dependency-ordered, as in `slice_loop`.
                seen = arch::fetch_add_dependent(word, size as u64);
            }
            let seen = SlotWord(arch::shfl_u64(team, seen, leader));
            let (first, cap) = (seen.reserved(), seen.capacity(per_block));
            let index = first + rank;
            if first <= cap && cap < first + size {
                let mut fresh = 0;
                if lane == leader {
                    let taken = first + size - cap;
                    let called = crate::install_clock::start();
                    // Through a pointer the optimiser cannot see, as in
                    // `slice_loop`.
                    let install: fn(&Heap, SizeClass, u32, u32, u64) -> u64 =
                        core::hint::black_box(Heap::install);
                    fresh = install(&self.by_value(), class, home, taken, seen.0);
                    self.count_install(class, Interval::Call, called, false);
                }
                let fresh = arch::shfl_u64(team, fresh, leader);
                if index < cap {
                    return Some(self.hand_out(class, seen.block().unwrap_or(0), index));
                }
                if fresh != 0 {
                    return Some(self.hand_out(class, fresh - 1, index - cap));
                }
                return None;
            }
            if index < cap {
                return Some(self.hand_out(class, seen.block().unwrap_or(0), index));
            }
            // Past the end: wait until the installer replaces the word.
            let began = crate::install_clock::start();
            wait_for_install(word, seen, per_block, &mut round);
            if lane == leader {
                self.count_wait(class, began);
            }
        }
    }

    /// Slots in use for `class` (a power of two, 1 ..= `SLOTS_PER_CLASS`):
    /// as many as keep one block per slot within 1/256 of the heap (its
    /// budget, `Heap::budget_bytes`: what is mapped on a VMM heap), so the
    /// partly used blocks slots hold (which no other class can use) scale
    /// with the heap; the classes whose block fills a segment share 1/32 of
    /// the heap (`WHOLE_SLOT_SHARE_SHIFT`). A 16 GiB heap (8 MiB segments)
    /// uses all 32 slots for 16 B … 512 B (blocks up to 2 MiB), 16 for 1 KiB
    /// (4 MiB blocks) and 16 for 2 … 128 KiB (8 MiB, whole segments); a
    /// 256 MiB heap one slot for 4 KiB slices (2 MiB blocks) and 8 for
    /// 16 B (128 KiB blocks) (`fixed_heaps_keep_their_rules` lists them).
    ///
    /// Build-time settings change the budget: `WHOLE_SLOT_BUDGET_SHIFT`
    /// and `WHOLE_SLOT_SHARE_SHIFT` for classes whose block fills a segment,
    /// `LARGE_HEAP_SLOT_BUDGET_SHIFT` for every class on large heaps. Off,
    /// each condition below is a constant false and folds away.
    #[inline(always)]
    pub(crate) fn slots_for(&self, class: SizeClass) -> u32 {
        let block_shift = class.block_shift(self.segment_shift);
        let shift = if LARGE_HEAP_SHIFT != 0
            && LARGE_HEAP_SLOT_BUDGET_SHIFT != 0
            && self.budget_bytes() >> LARGE_HEAP_SHIFT != 0
        {
            LARGE_HEAP_SLOT_BUDGET_SHIFT
        } else if block_shift == self.segment_shift {
            if WHOLE_SLOT_SHARE_SHIFT != 0 {
                // The classes whose block fills a segment split the share
                // ([`whole_segment_shares`]), rounded up to a power of two
                // (default geometry: 6 at 2 MiB segments, 5 at 4 MiB, 4 at
                // 8 MiB, 3 at 16 MiB; `ceil(log2(n))` = bits of n - 1).
                let others = whole_segment_shares(self.segment_shift) - 1;
                WHOLE_SLOT_SHARE_SHIFT + (32 - others.leading_zeros())
            } else {
                WHOLE_SLOT_BUDGET_SHIFT
            }
        } else {
            SLOT_BUDGET_SHIFT
        };
        let budget = self.budget_bytes() >> (shift + block_shift);
        let slots = budget.clamp(1, SLOTS_PER_CLASS as u64) as u32;
        1 << (31 - slots.leading_zeros())
    }

    /// Spare blocks an install of `class` claims beyond the one it
    /// installs: `SPARES_PER_SLOT`, or none where the class's slots with
    /// all their spares would take more than its share of the heap (see
    /// [`Heap::claim_for_slot`]) or the heap keeps no spares (`NO_SPARES`).
    #[inline(always)]
    fn spares_for(&self, class: SizeClass) -> u32 {
        if self.stripe_segments(class) > 0 {
            // The class's stripe holds what spares held, for every slot.
            return 0;
        }
        let whole_segments = class.blocks_per_segment(self.segment_shift) == 1;
        let (budget, slots, spares) = if whole_segments {
            (SEGMENT_SPARE_BUDGET_SHIFT, SLOTS_PER_CLASS, SPARES_PER_SLOT)
        } else if class.is_wide() {
            (
                SPARE_BUDGET_SHIFT,
                self.slots_for(class),
                WIDE_SPARES_PER_SLOT,
            )
        } else {
            (SPARE_BUDGET_SHIFT, self.slots_for(class), SPARES_PER_SLOT)
        };
        let cached = (slots * (1 + spares)) as u64;
        let room = self.budget_bytes() >> (budget + class.block_shift(self.segment_shift));
        if self.flags & NO_SPARES != 0 || room < cached {
            0
        } else {
            spares
        }
    }

    /// The size-dependent rules this handle applies: slots and spares per
    /// slice class, and the unlocked-format threshold. For tests and
    /// reports (nothing on the allocation paths calls it).
    pub fn rules(&self) -> HeapRules {
        let class = |i: u32| SizeClass::new(i).expect("a slice class index");
        HeapRules {
            slots: core::array::from_fn(|i| self.slots_for(class(i as u32))),
            spares: core::array::from_fn(|i| self.spares_for(class(i as u32))),
            stripes: core::array::from_fn(|i| self.stripe_segments(class(i as u32))),
            unlocked_format_shift: self.unlocked_format_shift(),
        }
    }

    /// Slice `slice` of global block `global`: its address. On checked heaps
    /// it is marked live, so a free can tell it from one never handed out.
    #[inline(always)]
    fn hand_out(&self, class: SizeClass, global: u64, slice: u32) -> u64 {
        if self.checked() {
            if RUNS {
                // A copy made here, not `with_handle`: with `SPLIT_HOME`
                // this runs inline in the kernel too (`slice_at_home`),
                // where `with_handle` would pass the kernel's parameter
                // itself, and taking its address made every thread copy
                // the handle to local memory at entry (+25 ... +64% on
                // the H100, `docs/PERF.md`). Inside `malloc_cold` it costs
                // a second copy, on checked heaps only.
                self.by_value().mark_handed_out_in_run(class, global, slice);
            } else {
                crate::heap::mark_handed_out(self.slice_bits(global), slice);
            }
        }
        self.block_address(class, self.block_id(global)) + ((slice as u64) << class.unit_shift())
    }

    /// Checked heaps with runs: marks index `index` of a slot version whose
    /// run starts at global block `global` live, in the check bits of the
    /// run's block that holds it. A run's blocks lie at adjacent addresses,
    /// so an address needs none of this; the per-block state does. Out of
    /// line, through the handle's copy as the other cold calls: only
    /// checked heaps come here.
    #[inline(never)]
    #[cold]
    fn mark_handed_out_in_run(&self, class: SizeClass, global: u64, index: u32) {
        let shift = class.slices_shift(self.segment_shift);
        let block = self.run_block(class, global, index >> shift);
        crate::heap::mark_handed_out(self.slice_bits(block), index & ((1 << shift) - 1));
    }

    /// The global id of block `j` of the run that starts at global block
    /// `global`: the block `j` blocks of this class further on in the
    /// heap's address order.
    #[inline(always)]
    pub(crate) fn run_block(&self, class: SizeClass, global: u64, j: u32) -> u64 {
        let shift = class.blocks_per_segment_shift(self.segment_shift);
        self.global(self.block_id(global).advanced(j, shift))
    }

    /// In stealing mode, reserve only from a word that still has slices, so
    /// a thread that found the heap exhausted does not become an installer
    /// again. Returns [`CLOSED`] when the word has no slices left and no
    /// install in flight.
    ///
    /// A word with more reserved than its capacity has an installer in
    /// flight (the team whose range held the index equal to the capacity,
    /// see [`crate::slot`]): it has taken a block out of every place a
    /// stealer looks (a spare popped, or blocks claimed from a tree) and
    /// will put it in this word with its exchange. Passing such a word by
    /// answered null beside a block about to be installed (one warp's 32
    /// of 524,288 4 KiB allocations short on the GPU, main's code as well
    /// as `blk-add`'s; `a_stealer_waits_for_an_install_in_flight`), so the
    /// leader waits for the exchange, as a team past the end at home does,
    /// and looks at the new word. The wait ends: an installer never waits
    /// for a slot (it claims, reclaims, and exchanges), and each team
    /// installs at most once at home and once per open word it crosses, so
    /// installs in flight come to an end with the kernel's teams.
    #[inline]
    fn reserve_if_open(&self, word: &Word, size: u32, per_block: u32) -> u64 {
        let mut round = 0;
        loop {
            let current = SlotWord(arch::load_relaxed(word));
            let cap = current.capacity(per_block);
            if current.reserved() < cap {
                // Relaxed (dependency-ordered), as in `malloc_slice`.
                return arch::fetch_add_dependent(word, size as u64);
            }
            if current.reserved() == cap {
                // Exhausted (or empty) with no index taken past it: no one
                // installs here until a team adds again.
                return CLOSED;
            }
            wait_for_install(word, current, per_block, &mut round);
        }
    }

    /// Replaces the slot word with a fresh block (or with an empty word if
    /// none can be had), keeping `taken` slices of the fresh block for the
    /// installing team. `seen` is the word the team saw (the version it
    /// installs for). Retires the displaced word. Returns the fresh block's
    /// global id + 1, or 0.
    #[inline(never)]
    fn install(&self, class: SizeClass, slot: u32, taken: u32, seen: u64) -> u64 {
        let began = crate::install_clock::start();
        let seen = SlotWord(seen);
        let generation = seen.generation();
        // The slot's first block: its word had none (the heap was just
        // made, the slot was flushed or reclaimed, or its last install
        // found no block). See `FIRST_INSTALL_SPARES`.
        let first_block = seen.block().is_none();
        let word = self.slot(class, slot);
        // Own spare, else a claim, else (the heap has no block left) another
        // slot's spare, else reclaim what every class holds idle and claim
        // again: only then may this class's requests fail.
        let mut extra = Extra::Nothing;
        // A class with a stripe draws its block there first (one add; none
        // only from a closed stripe, on a heap that had no segment for its
        // refill: then it claims as before, with no spares, `spares_for`).
        let drawn = if self.stripe_segments(class) > 0 {
            self.draw_from_stripe(class)
        } else {
            None
        };
        let fresh = drawn
            .or_else(|| self.pop_spare(class, slot))
            .or_else(|| {
                let demand = self.claim_demand(class, word, seen);
                self.claim_for_slot(class, first_block, demand, &mut extra)
            })
            .or_else(|| (0..SLOTS_PER_CLASS).find_map(|s| self.pop_spare(class, s)))
            .or_else(|| {
                self.reclaim();
                let demand = self.claim_demand(class, word, seen);
                self.claim_for_slot_settled(class, first_block, demand, &mut extra)
            })
            .map(|b| self.global(b));
        // With runs, the claim's blocks right after this one join it in
        // the word (`SLOT_RUN_MAX`); a popped spare is one block.
        let run = match fresh {
            Some(g) if RUNS => self.take_run(class, slot, &mut extra, self.block_id(g)),
            _ => 1,
        };
        // Only for the clock: with it off this is a constant `false`, and
        // the default build's `install` keeps its shape.
        let claimed = crate::install_clock::INSTALL_CLOCK
            && (!matches!(extra, Extra::Nothing) || fresh.is_none());
        self.count_install(class, Interval::Obtain, began, claimed);
        let reserved = if fresh.is_some() { taken } else { 0 };
        // A new generation relative to the version this team installs for
        // (`generation`), so that threads waiting on it see the change.
        let next = match fresh {
            Some(g) => SlotWord::new_run(g, run, reserved, generation.wrapping_add(1)),
            None => SlotWord::new(None, reserved, generation.wrapping_add(1)),
        };
        // An exchange, not a load and a CAS loop: teams keep adding to the
        // word while the claim runs, so a CAS from an earlier load failed
        // and cost another round trip. The exchange returns the exact word
        // it displaced, which is all `retire` needs. The word is normally
        // still this team's version (only its installer replaces an
        // exhausted word); if a flush replaced it meanwhile, the exchange
        // displaces what the flush left, as the CAS loop did. A version
        // equal to ours is impossible with a block (`fresh` was just
        // claimed); without one, waiters on an empty word with our
        // generation see `reserved <= capacity` and retry (see
        // `malloc_slice`). acq_rel: as every replacement of a slot word.
        let displaced = SlotWord(arch::swap_acq_rel(word, next.0));
        self.count_install(class, Interval::Publish, began, claimed);
        self.retire(class, displaced);
        // The extra blocks of a claim become spares only now: the teams
        // waiting on this slot resume at the CAS above, not after parking.
        self.park_extra(class, slot, extra);
        fresh.map_or(0, |g| g + 1)
    }

    #[inline(always)]
    fn spare(&self, class: SizeClass, slot: u32, i: u32) -> &Word {
        &self.region(self.spare_index(class.index(), slot, i), 1)[0]
    }

    /// Takes one of the slot's spare blocks, if it has one.
    #[inline]
    fn pop_spare(&self, class: SizeClass, slot: u32) -> Option<BlockId> {
        // All spare words are read before any is taken: independent loads
        // overlap, where a load per word after the previous one came back
        // empty cost a round trip each (parking fills word 0 first, and pops
        // empty it first).
        let mut seen = [0u64; SPARES_PER_SLOT as usize];
        for (i, s) in seen.iter_mut().enumerate() {
            *s = arch::load_relaxed(self.spare(class, slot, i as u32));
        }
        for (i, s) in seen.iter().enumerate() {
            if *s != 0 {
                // acq_rel swap: pairs with the pushing CAS, so the claim that
                // produced the block happens before this thread uses it.
                let g = arch::swap_acq_rel(self.spare(class, slot, i as u32), 0);
                if g != 0 {
                    return Some(self.block_id(g - 1));
                }
            }
        }
        None
    }

    /// Claims `1 + ` the class's spares blocks (fewer if the segment has
    /// fewer, or if `demand`, [`Heap::claim_demand`], asks for fewer; for a
    /// class whose block fills a segment, as many whole segments as one
    /// segment-tree word gives), returns the first and leaves the others
    /// in `extra` for [`Heap::park_extra`].
    #[inline]
    fn claim_for_slot(
        &self,
        class: SizeClass,
        first_block: bool,
        demand: u32,
        extra: &mut Extra,
    ) -> Option<BlockId> {
        self.claim_for_slot_as(class, first_block, demand, extra, false)
    }

    /// The most blocks a claim for `slot_word` should take, by the demand
    /// waiting on it ([`DEMAND_CLAIM`]; `u32::MAX` with the rule off): the
    /// slices reserved past the end of `seen`, the version being replaced,
    /// times `DEMAND_CLAIM`, as blocks of `class` (rounded up, at least one).
    #[inline(always)]
    fn claim_demand(&self, class: SizeClass, slot_word: &Word, seen: SlotWord) -> u32 {
        if DEMAND_CLAIM == 0 {
            return u32::MAX;
        }
        let slices_shift = class.slices_shift(self.segment_shift);
        let per = 1u32 << slices_shift;
        // Relaxed: a hint. The word is this version until the exchange
        // below (only its installer replaces an exhausted word); if a
        // flush replaced it, the count is of another version, and any
        // count only sizes the claim.
        let now = SlotWord(arch::load_relaxed(slot_word));
        let waiting = now.reserved().saturating_sub(seen.capacity(per)) as u64;
        // Unit tests run one thread: they stand in for a burst's waiting
        // teams here (`with_waiting_slices`).
        #[cfg(all(test, not(loom)))]
        let waiting = waiting + test_waiting::SLICES.with(|w| w.get()) as u64;
        // Rounded up; a shift, since blocks hold a power of two of slices.
        let blocks = (waiting * DEMAND_CLAIM as u64 + per as u64 - 1) >> slices_shift;
        blocks.clamp(1, u32::MAX as u64) as u32
    }

    /// [`Heap::claim_for_slot`] as the last try of an install: a class
    /// claim that comes back empty is settled first
    /// ([`Heap::claim_blocks_settled`]: no null beside free blocks out of
    /// the class tree for a moment). Out of line and cold.
    #[inline(never)]
    #[cold]
    fn claim_for_slot_settled(
        &self,
        class: SizeClass,
        first_block: bool,
        demand: u32,
        extra: &mut Extra,
    ) -> Option<BlockId> {
        self.claim_for_slot_as(class, first_block, demand, extra, true)
    }

    #[inline(always)]
    fn claim_for_slot_as(
        &self,
        class: SizeClass,
        first_block: bool,
        demand: u32,
        extra: &mut Extra,
        settled: bool,
    ) -> Option<BlockId> {
        // Spares only where the class's slots with all their spares stay
        // within 1/8 of the heap (and they are reclaimed before any request
        // fails): a small heap is not eaten by idle blocks.
        // A class whose block fills a segment holds whole segments idle, so
        // its budget is tighter, and counts every slot the class could have
        // (the slot count grows with the heap, which would keep the share
        // the same on every heap): heaps of 1024 segments and more keep
        // these spares (see `SEGMENT_SPARE_BUDGET_SHIFT`).
        let spares = self.spares_for(class);
        // A slot's first block comes without them where
        // `FIRST_INSTALL_SPARES` says so: a class whose demand is a few
        // slices never pops them.
        let spares = if first_block
            && match FIRST_INSTALL_SPARES {
                0 => true,
                1 => false,
                _ => class.blocks_per_segment(self.segment_shift) > 1 + spares,
            } {
            0
        } else {
            spares
        };
        // No more than the waiting demand asks for (`DEMAND_CLAIM`). The
        // path below is chosen by the spares the class would take without
        // it, so that a class that claims whole segments (1 KiB on the
        // bench heap) keeps doing so, one segment at least.
        let wanted = spares.min(demand - 1);
        let shift = class.blocks_per_segment_shift(self.segment_shift);
        if shift == 0
            || (SEGMENT_RUNS != 0 && 1 << shift <= SLOT_RUN_MAX && 1 << shift < 1 + spares)
        {
            // Only a claim of segments of several blocks reads the flag.
            let from_top = shift > 0
                && match SEGMENT_RUNS {
                    3 => true,
                    4 => self.whole_segment_runs_taken(),
                    _ => false,
                };
            let (first, taken) = if from_top {
                self.claim_whole_segment_from_top(class)?
            } else if SEGMENT_RUNS >= 2 && shift > 0 {
                self.claim_whole_segments(class, 1)?
            } else {
                self.claim_whole_segments(class, ((1 + wanted) >> shift).max(1))?
            };
            *extra = Extra::Segments {
                first,
                rest: taken & (taken - 1),
                shift,
            };
            return Some(BlockId::whole_segment(first + taken.trailing_zeros()));
        }
        let claim = if settled {
            self.claim_blocks_settled(class, 1 + wanted)
        } else {
            self.claim_blocks(class, 1 + wanted)
        };
        if claim.count() == 0 {
            return None;
        }
        if RUNS && RUN_BLOCKS == 3 && !class.is_wide() && claim.is_ticketed() && claim.count() > 1 {
            // The first blocks of a reserved claim at their ticket bits,
            // with the one RMW that would take the first alone: they
            // usually lie in order after it, and join its run
            // (`Heap::take_run`) with no RMW more before the publish.
            let held = claim.take_at_ticket(self, claim.count().min(SLOT_RUN_MAX));
            let first = if held & 1 != 0 {
                claim.at_ticket(0)
            } else {
                claim.take(self, class, 0)
            };
            *extra = Extra::Blocks {
                claim,
                from: 1,
                held: held & !1,
            };
            return Some(first);
        }
        *extra = Extra::Blocks {
            claim,
            from: 1,
            held: 0,
        };
        Some(claim.take(self, class, 0))
    }

    /// With runs: how many blocks the install of `installed` takes as one
    /// run (up to [`SLOT_RUN_MAX`]). Whole segments: those
    /// of the claim right after `installed` ([`Extra::take_run`]). Blocks
    /// inside a segment: the claim's next blocks are taken now, before the
    /// word is published, while each lies right after the one before (a
    /// freshly formatted segment's always do, a reserved claim's usually:
    /// its bits are tried at its ticket first); a taken block that does not
    /// join the run is parked at once, and those not taken yet are parked
    /// after the publish as before.
    #[inline(never)]
    fn take_run(&self, class: SizeClass, slot: u32, extra: &mut Extra, installed: BlockId) -> u32 {
        let Extra::Blocks { claim, from, held } = extra else {
            return extra.take_run(installed);
        };
        if *held != 0 {
            // A reserved claim's blocks taken at their tickets: those right
            // after the installed one, in rank order, join it.
            if installed != claim.at_ticket(0) {
                return 1;
            }
            let run = (1 + (*held >> 1).trailing_ones()).min(SLOT_RUN_MAX);
            *held &= !((1 << run) - 1);
            *from = run;
            return run;
        }
        if RUN_BLOCKS == 0 || (RUN_BLOCKS != 2 && (class.is_wide() || !claim.is_formatted())) {
            return 1;
        }
        let per_segment_shift = class.blocks_per_segment_shift(self.segment_shift);
        let ahead = claim.count().min(SLOT_RUN_MAX);
        let mut adjacent = 1;
        while adjacent < ahead {
            let b = claim.take(self, class, adjacent);
            *from = adjacent + 1;
            if b != installed.advanced(adjacent, per_segment_shift) {
                self.park_spare(class, slot, 0, b);
                break;
            }
            adjacent += 1;
        }
        adjacent
    }

    /// Parks the blocks a claim took beyond the first as the slot's spares.
    #[inline(never)]
    fn park_extra(&self, class: SizeClass, slot: u32, extra: Extra) {
        match extra {
            Extra::Nothing => {}
            Extra::Blocks { claim, from, held } => {
                for i in from..claim.count() {
                    let b = if i < 32 && held >> i & 1 != 0 {
                        claim.at_ticket(i)
                    } else {
                        claim.take(self, class, i)
                    };
                    self.park_spare(class, slot, i - 1, b);
                }
            }
            Extra::Segments {
                first,
                mut rest,
                shift,
            } => {
                // After the publish, so that the slot's waiters do not
                // wait for it either.
                if SEGMENT_RUNS == 4 && shift == 0 {
                    self.note_whole_segment_runs();
                }
                let mut i = 0;
                while rest != 0 {
                    let segment = first + rest.trailing_zeros();
                    for block in 0..1 << shift {
                        let b = BlockId::new(segment, block);
                        self.park_spare(class, slot, i, b);
                        i += 1;
                    }
                    rest &= rest - 1;
                }
            }
        }
    }

    /// Parks a claimed block as one of the slot's spares (trying spare word
    /// `start` first), or returns it if the slot has no room.
    #[inline]
    fn park_spare(&self, class: SizeClass, slot: u32, start: u32, b: BlockId) {
        let parked = (0..SPARES_PER_SLOT).any(|k| {
            let w = self.spare(class, slot, (start + k) % SPARES_PER_SLOT);
            arch::compare_exchange_acq_rel(w, 0, self.global(b) + 1).is_ok()
        });
        if !parked {
            self.release_block(class, b);
        }
    }

    /// Accounts for the slices a replaced slot word never handed out.
    #[inline(never)]
    fn retire(&self, class: SizeClass, displaced: SlotWord) {
        let Some(global) = displaced.block() else {
            return;
        };
        if RUNS && displaced.run() > 1 {
            return self.retire_run(class, global, displaced);
        }
        let per_block = class.slices_per_block(self.segment_shift);
        let unissued = displaced.unissued(per_block);
        if unissued > 0 {
            self.count_dead(class, global, unissued, per_block);
        }
    }

    /// Counts `slices` of global block `global` (of `per_block` slices)
    /// dead, slices no slot will hand out, and gives the block back if that
    /// completes it.
    #[inline(always)]
    fn count_dead(&self, class: SizeClass, global: u64, slices: u32, per_block: u32) {
        if block::count_dead_slices(self.counter(global), slices as u64, per_block) {
            self.release_block(class, self.block_id(global));
        }
    }

    /// [`Heap::retire`] of a word holding a run: each block's unissued
    /// slices are counted dead on its own counter, so a block of the run the
    /// word never reached comes back whole at once.
    #[inline(never)]
    #[cold]
    fn retire_run(&self, class: SizeClass, global: u64, displaced: SlotWord) {
        let per_block = class.slices_per_block(self.segment_shift);
        for j in 0..displaced.run() {
            let unissued = per_block - displaced.issued_in(j, per_block);
            if unissued > 0 {
                self.count_dead(class, self.run_block(class, global, j), unissued, per_block);
            }
        }
    }

    /// Gives back what classes hold idle: every spare block, every slot
    /// block none of whose handed-out slices is live, and every segment
    /// formatted and never used ([`Heap::retire_idle_segments`]). Partly used slot
    /// blocks stay (emptying them would strand their unissued slices until
    /// their live ones are freed). Safe while other threads allocate; runs
    /// only when a request is about to fail.
    ///
    /// Returns only when no reclaim is in flight: a thread that ran dry
    /// while another reclaim had taken a block off a slot but not yet given
    /// it back would otherwise fail a request the heap can serve.
    #[inline(never)]
    pub fn reclaim(&self) {
        let in_flight = &self.region(self.stats_at + RECLAIMS_WORD, 1)[0];
        // Relaxed: every block this reclaim takes is taken by an acq_rel RMW
        // (slot CAS, spare swap) that comes after this add in program order,
        // so whoever sees a block gone also sees this add.
        arch::fetch_add_relaxed(in_flight, 1);
        for class in (0..crate::class::SLICE_CLASSES).filter_map(SizeClass::new) {
            self.drain_stripe(class);
            for s in 0..SLOTS_PER_CLASS {
                while let Some(b) = self.pop_spare(class, s) {
                    self.release_block(class, b);
                }
                if RUNS {
                    self.trim_run(class, s);
                }
                self.retire_if_idle(class, s);
            }
        }
        self.retire_idle_segments();
        // Release: what this reclaim gave back (segments in the segment
        // tree) happens before a waiter's acquire load that sees the count
        // it leaves.
        arch::fetch_add_release(in_flight, u64::MAX);
        let mut round = 0;
        while arch::load_acquire(in_flight) != 0 {
            arch::backoff(round);
            round += 1;
        }
    }

    /// Shortens the run of slot `slot` to the blocks its version has
    /// reached, giving back the others (none of their slices was handed
    /// out): a run's untouched blocks are what spares were, and a reclaim
    /// gives those back too. The CAS fails if a team reserved meanwhile;
    /// then the slot is busy and keeps its run.
    #[inline(never)]
    #[cold]
    fn trim_run(&self, class: SizeClass, slot: u32) {
        let word = self.slot(class, slot);
        let current = arch::load_relaxed(word);
        let seen = SlotWord(current);
        let Some(global) = seen.block() else {
            return;
        };
        let per_block = class.slices_per_block(self.segment_shift);
        // The blocks its indices reached (a version that reached three of
        // four keeps three; until runs of any length, all four).
        let reached = seen.reserved().div_ceil(per_block).max(1);
        if reached >= seen.run() {
            return;
        }
        let next = SlotWord::new_run(
            global,
            reached,
            seen.reserved(),
            seen.generation().wrapping_add(1),
        );
        // acq_rel, as every replacement of a slot word (see `install`): a
        // team that reserves after this sees the shorter run, and every
        // index reserved before it lies in the blocks kept.
        if arch::compare_exchange_acq_rel(word, current, next.0).is_ok() {
            for j in reached..seen.run() {
                self.count_dead(
                    class,
                    self.run_block(class, global, j),
                    per_block,
                    per_block,
                );
            }
        }
    }

    /// Empties slot `slot` if every slice its block handed out is dead.
    #[inline]
    fn retire_if_idle(&self, class: SizeClass, slot: u32) {
        let word = self.slot(class, slot);
        let current = arch::load_relaxed(word);
        let seen = SlotWord(current);
        let Some(global) = seen.block() else {
            return;
        };
        let per_block = class.slices_per_block(self.segment_shift);
        if seen.reserved() >= seen.capacity(per_block) {
            // Exhausted: its installer is replacing it.
            return;
        }
        // Relaxed: a snapshot. The block is in this lifetime (slices remain
        // unissued, so it cannot have completed). If a team reserves after
        // this load the CAS below fails; frees only make the count larger.
        // A block of a run whose slices were all handed out is no longer
        // the slot's: it completes (and may be reused) with its last free,
        // so only the others are read.
        let idle = (0..seen.run()).all(|j| {
            let issued = seen.issued_in(j, per_block);
            let counter = self.counter(self.run_block(class, global, j));
            issued == per_block
                || block::dead_in_lifetime(arch::load_relaxed(counter), per_block) >= issued as u64
        });
        if !idle {
            return;
        }
        let next = SlotWord::new(None, 0, seen.generation().wrapping_add(1));
        // acq_rel, as every replacement of a slot word (see `install`).
        if arch::compare_exchange_acq_rel(word, current, next.0).is_ok() {
            self.retire(class, seen);
        }
    }

    /// Empties every slot, returning the slices they hold to their blocks
    /// (partly used ones come back when their last live slice is freed).
    /// Safe while other threads allocate; used by the host before it checks
    /// that the heap is whole (a failing request uses [`Heap::reclaim`]).
    pub fn flush_slots(&self) {
        for class in (0..crate::class::SLICE_CLASSES).filter_map(SizeClass::new) {
            for s in 0..SLOTS_PER_CLASS {
                self.flush_slot(class, s);
            }
        }
        self.retire_idle_segments();
    }

    /// Empties one slot and its spares (see [`Heap::flush_slots`]); slot 0
    /// also the class's stripe (`crate::stripe`), so that a flush kernel
    /// of one thread per slot (`heap_flush`) empties them too.
    pub fn flush_slot(&self, class: SizeClass, slot: u32) {
        if slot == 0 {
            self.drain_stripe(class);
        }
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::class::Request;

    /// Slots `slots_for` gives requests of `size` on a heap of `segments`
    /// segments of 2^`shift` bytes.
    fn slots(segments: u64, shift: u32, size: u64) -> u32 {
        let layout = Heap::layout(segments, shift, 0).unwrap();
        // SAFETY: the handle is used only for `slots_for`, which reads its
        // geometry fields and touches neither data nor metadata.
        let heap = unsafe { layout.bind(0, 0) };
        match Request::for_size(size, shift) {
            Request::Class(c) => heap.slots_for(c),
            r => panic!("{size}: {r:?}"),
        }
    }

    /// A run takes the adjacent segments right after the installed one, up
    /// to `SLOT_RUN_MAX` (any number: three adjacent make a run of three),
    /// and leaves the others to be parked. Without runs, none.
    #[test]
    fn a_run_takes_the_adjacent_segments_after_the_installed_one() {
        let run_of = |rest: u64, installed: u32| {
            let mut extra = Extra::Segments {
                first: 10,
                rest,
                shift: 0,
            };
            let run = extra.take_run(BlockId::whole_segment(10 + installed));
            let Extra::Segments { rest, .. } = extra else {
                unreachable!()
            };
            (run, rest)
        };
        let (two, three, four) = (
            SLOT_RUN_MAX.min(2),
            SLOT_RUN_MAX.min(3),
            SLOT_RUN_MAX.min(4),
        );
        // Segments 11, 12, 13 after 10: a run of four with runs of 4.
        let kept = |run: u32, all: u64| all & !(((1u64 << run) >> 1) - 1) << 1;
        assert_eq!(run_of(0b1110, 0), (four, kept(four, 0b1110)));
        // 11 and 12 (three adjacent): a run of three, none parked (until
        // runs of any length: a run of two, 12 parked).
        assert_eq!(run_of(0b0110, 0), (three, kept(three, 0b0110)));
        // 12 and 13 but not 11: one block, both parked.
        assert_eq!(run_of(0b1100, 0), (1, 0b1100));
        // The tree word's last id installed (offset 63): a run of one.
        assert_eq!(run_of(0b0110, 63), (1, 0b0110));
        // Installed 12 (offset 2), 13 after it: two; 11 below it stays.
        assert_eq!(run_of(0b1010, 2), (two, if RUNS { 0b0010 } else { 0b1010 }));
    }

    /// The slot counts of 1, 2 and 4 KiB of the default build on the bench
    /// heap (16 GiB of 8 MiB segments), the demand + 3% heap (2,107
    /// segments of 4 MiB) and the 256 MiB heap (2 MiB). Since 8 KiB became
    /// a slice class, 2 and 4 KiB on the bench heap share the whole-segment
    /// budget with it: 16 slots each where `wshare5f2` gave them 32
    /// (`docs/PERF.md`; the counts of the issue 12 variants before it are
    /// there too). Since 16 KiB became one too, the demand + 3% heap's
    /// whole-segment classes (1 … 16 KiB on 4 MiB segments) split it five
    /// ways (eight shares): 1, 2 and 4 KiB have 8 slots there, not 16;
    /// 32 KiB (a slice class since 2026-11-24) is not counted in the split.
    /// Other builds check nothing.
    #[test]
    fn issue12_slot_counts() {
        let got = |segments, shift| [1024, 2048, 4096].map(|s| slots(segments, shift, s));
        let seen = (got(2048, 23), got(2107, 22), got(128, 21));
        let default = SLOTS_PER_CLASS == 32
            && SLOT_BUDGET_SHIFT == 8
            && (
                WHOLE_SLOT_BUDGET_SHIFT,
                WHOLE_SLOT_SHARE_SHIFT,
                LARGE_HEAP_SHIFT,
            ) == (8, 5, 34)
            && LARGE_HEAP_SLOT_BUDGET_SHIFT == 0
            && option_env!("GPUMALLOC_SLICES_PER_BLOCK_SHIFT").is_none()
            && option_env!("GPUMALLOC_WIDE_BLOCK_MAX_UNIT_SHIFT").is_none()
            && option_env!("GPUMALLOC_WIDE_SPARES").is_none()
            && option_env!("GPUMALLOC_MAX_SLICE_SHIFT").is_none();
        if default {
            assert_eq!(seen, ([16, 16, 16], [8, 8, 8], [1, 1, 1]));
        }
    }
}

#[cfg(all(test, not(loom)))]
mod stealing_tests {
    extern crate std;
    use std::vec::Vec;

    use crate::class::{MIN_SEGMENT_SHIFT, Request};

    /// A thread whose handle has a small budget (one slot per class) still
    /// takes the slices left in blocks that threads with a larger budget
    /// installed in other slots, before it answers null: the heap hands
    /// out every 16 B slice of its one present segment. Before stealing
    /// visited every slot, it stopped at its own slot and left the other
    /// slots' slices unreachable.
    #[test]
    fn a_smaller_budget_steals_from_every_slot() {
        let (heap, _words) = crate::layout::test_support::test_heap(64, 1);
        let Request::Class(class) = Request::for_size(16, MIN_SEGMENT_SHIFT) else {
            panic!("16 B is a slice class");
        };
        let large = heap.with_budget(64);
        // 8 homes with the default geometry (fewer with larger slice
        // blocks, `GPUMALLOC_SLICES_PER_BLOCK_SHIFT`).
        let installers = large.slots_for(class).min(8);
        if installers < 2 {
            // Only with 16 B blocks of 512 KiB (a measuring build): this
            // 128 MiB heap gives one slot, nothing to steal from.
            return;
        }
        let kept: Vec<u64> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..installers)
                .map(|_| s.spawn(|| large.malloc(16) as u64))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(kept.iter().all(|&p| p != 0), "{kept:x?}");
        let small = heap.with_budget(1);
        assert_eq!(small.slots_for(class), 1);
        let mut got = 0u64;
        while !small.malloc(16).is_null() {
            got += 1;
        }
        let slices = 1u64 << (MIN_SEGMENT_SHIFT - 4);
        assert_eq!(got + kept.len() as u64, slices, "every slice handed out");
    }
}

/// `FIRST_INSTALL_SPARES=2` (the default): a slot's first block of 16 B
/// (16 blocks per 2 MiB segment, claims of 1 + 1) comes without a spare;
/// the slot's next install, once the block's 8,192 slices are handed out,
/// claims with its spare. Other builds check nothing.
#[cfg(all(test, not(loom)))]
#[test]
fn a_slots_first_install_claims_no_spare() {
    extern crate std;
    use crate::class::{MIN_SEGMENT_SHIFT, Request};
    if FIRST_INSTALL_SPARES != 2 {
        return;
    }
    let (heap, _words) = crate::layout::test_support::test_heap(64, 64);
    let Request::Class(class) = Request::for_size(16, MIN_SEGMENT_SHIFT) else {
        panic!("16 B is a slice class");
    };
    let spares = heap.spares_for(class);
    let per_block = class.slices_per_block(MIN_SEGMENT_SHIFT);
    if spares == 0 || class.blocks_per_segment(MIN_SEGMENT_SHIFT) <= 1 + spares {
        return;
    }
    std::thread::scope(|s| {
        s.spawn(|| {
            with_waiting_slices(per_block * 16, || {
                let slot = arch::sm_id() & (heap.slots_for(class) - 1);
                assert!(!heap.malloc(16).is_null());
                assert_eq!(
                    parked(&heap, class, slot),
                    0,
                    "the first install parked a spare"
                );
                for _ in 1..=per_block {
                    assert!(!heap.malloc(16).is_null());
                }
                assert_eq!(
                    parked(&heap, class, slot),
                    spares,
                    "the second install parked none"
                );
            })
        });
    });
}

/// A team that found the heap exhausted and steals from other slots waits
/// for an install in flight there: the block that installer claimed (or
/// popped from a spare) is in no tree, no spare word and no slot word until
/// its exchange, so a stealer that passed it by answered null beside a
/// block about to be installed. Here the one segment of the heap is such a
/// block, held by a simulated installer of slot 1 (its word shows an index
/// taken past the capacity, so an installer owns it); this thread's own
/// slot (0) is empty and the segment tree too. The malloc must wait for
/// the install and take a slice of that block, not answer null.
#[cfg(all(test, not(loom)))]
#[test]
fn a_stealer_waits_for_an_install_in_flight() {
    extern crate std;
    use crate::class::{MIN_SEGMENT_SHIFT, Request};
    let (heap, _words) = crate::layout::test_support::test_heap(1, 1);
    let Request::Class(class) = Request::for_size(4096, MIN_SEGMENT_SHIFT) else {
        panic!("4 KiB is a slice class");
    };
    assert_eq!(heap.slots_for(class), 1, "every thread's home is slot 0");
    // The installer of slot 1 claimed the segment (its block taken) and
    // has not yet replaced its word.
    let (first, taken) = heap.claim_whole_segments(class, 1).unwrap();
    let block = BlockId::whole_segment(first + taken.trailing_zeros());
    let slot1 = heap.slot(class, 1);
    arch::store_relaxed(slot1, SlotWord::new(None, 1, 0).0);
    let heap = &heap;
    let p = std::thread::scope(|s| {
        let t = s.spawn(move || heap.malloc(4096) as u64);
        std::thread::sleep(std::time::Duration::from_millis(200));
        // The install completes: a new version with the block, none of
        // its slices taken (the installing team took its own elsewhere).
        arch::swap_acq_rel(slot1, SlotWord::new(Some(heap.global(block)), 0, 1).0);
        t.join().unwrap()
    });
    assert_eq!(
        p,
        heap.block_address(class, block),
        "null (or another slice) beside the block being installed"
    );
    heap.free(p as *mut u8);
    heap.flush_slots();
    assert_eq!(heap.free_segments(), 1, "the heap is whole again");
}

#[cfg(test)]
mod rules_tests {
    use super::*;

    /// The rules of a fixed heap of `segments` segments of 2^`shift` bytes.
    fn rules(segments: u64, shift: u32) -> HeapRules {
        let layout = Heap::layout(segments, shift, 0).unwrap();
        // SAFETY: the handle is used only for `rules`, which reads its
        // geometry fields and touches neither data nor metadata.
        unsafe { layout.bind(0, 0) }.rules()
    }

    /// The closed form of `whole_segment_classes` counts what the classes'
    /// geometry says, for every segment size this build allows, over all
    /// slice classes and over those the share's split counts (up to
    /// `SHARED_UP_TO_SHIFT`).
    #[test]
    fn whole_segment_classes_match_the_geometry() {
        for shift in crate::class::MIN_SEGMENT_SHIFT..=crate::class::MAX_SEGMENT_SHIFT {
            let counted = |top: u32| {
                (0..SLICE_CLASSES)
                    .filter_map(SizeClass::new)
                    .filter(|c| c.unit_shift() <= top && c.blocks_per_segment(shift) == 1)
                    .count() as u32
            };
            let all = crate::class::MAX_SLICE_SHIFT;
            assert_eq!(
                super::whole_segment_classes(shift, all),
                counted(all),
                "2^{shift}"
            );
            assert_eq!(
                super::whole_segment_shares(shift),
                counted(super::SHARED_UP_TO_SHIFT),
                "2^{shift}, shares"
            );
        }
    }

    /// Whether this build sets none of the knobs the rules depend on.
    fn default_build() -> bool {
        [
            option_env!("GPUMALLOC_SLOTS"),
            option_env!("GPUMALLOC_SLOT_BUDGET_SHIFT"),
            option_env!("GPUMALLOC_WHOLE_SLOT_BUDGET_SHIFT"),
            option_env!("GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT"),
            option_env!("GPUMALLOC_LARGE_HEAP_SHIFT"),
            option_env!("GPUMALLOC_LARGE_HEAP_SLOT_BUDGET_SHIFT"),
            option_env!("GPUMALLOC_SEGMENT_SPARE_BUDGET_SHIFT"),
            option_env!("GPUMALLOC_UNLOCKED_FORMAT_SHIFT"),
            option_env!("GPUMALLOC_LARGE_HEAP_UNLOCKED_FORMAT_SHIFT"),
            option_env!("GPUMALLOC_SPARES"),
            option_env!("GPUMALLOC_SLICES_PER_BLOCK_SHIFT"),
            option_env!("GPUMALLOC_WIDE_BLOCK_MAX_UNIT_SHIFT"),
            option_env!("GPUMALLOC_WIDE_SPARES"),
            option_env!("GPUMALLOC_MAX_SLICE_SHIFT"),
            option_env!("GPUMALLOC_STRIPE"),
            option_env!("GPUMALLOC_STRIPE_BLOCKS"),
            option_env!("GPUMALLOC_STRIPE_REUSE"),
        ]
        .iter()
        .all(Option::is_none)
    }

    /// The rules fixed heaps get with the default build (a snapshot: a
    /// change to them must be deliberate). Since 8 KiB became a slice
    /// class (2026-11-23), the classes whose block fills a segment split
    /// the shared slot budget one way more, so 2 and 4 KiB on the bench's
    /// 16 GiB heap have 16 slots, not 32. Heaps: 256 MiB,
    /// 1 GiB and 4 GiB of 2 MiB segments, 4, 8 and 16 GiB of 8 MiB (the
    /// bench's `ours-sized` and `ours`), the demand + 3% heap (2,107 of
    /// 4 MiB) and the largest heap of 16 MiB segments. Slots and spares
    /// list the slice classes, 16 B … 32 KiB (16 KiB since the third
    /// session of 2026-11-23: 1 … 16 KiB on the demand + 3% heap have 8
    /// slots, not 16). Since 2026-11-24 the classes of 16 B … 128 B have
    /// blocks of 8,192 slices and one spare (`class::WIDE_BLOCK_MAX_UNIT_SHIFT`):
    /// where a budget sets their slot count (heaps of 2 MiB segments) it
    /// halved with the doubled block; the bench heap keeps 32. Since the
    /// sixteenth session of 2026-11-24 the list ends with 32 KiB, a slice
    /// class with 16 KiB's slots and spares: it is not counted in the
    /// whole-segment share's split (`whole_segment_shares`), so no other
    /// class's count moved. Since 2026-11-25's twentieth session the
    /// classes of 8 to 32 blocks to a segment draw from a stripe
    /// (`crate::stripe`) and keep no spares; the rules list the segments
    /// of each class's stripe (fewer since the twenty-first session's
    /// stripes of 48 blocks: 6 segments of 8 blocks where 8 were, 3 of 16
    /// where 4). Since the twenty-second session the list ends with 128 KiB:
    /// 64 and 128 KiB are slice classes with 32 KiB's rules, and no other
    /// class's count moved.
    #[test]
    fn fixed_heaps_keep_their_rules() {
        if !default_build() {
            return;
        }
        // The default build's 14 slice classes, as the rules' arrays (the
        // same length there; a build of other classes returns above, and
        // still compiles).
        let per_class = |v: [u32; 14]| core::array::from_fn(|i| v.get(i).copied().unwrap_or(0));
        let r = |slots, spares, stripes, unlocked_format_shift| HeapRules {
            slots: per_class(slots),
            spares: per_class(spares),
            stripes: per_class(stripes),
            unlocked_format_shift,
        };
        // Wide classes (16 B … 128 B) keep one spare, the others three; a
        // class with a stripe (`crate::stripe`: 8 to 32 blocks to a
        // segment and a stripe of two segments or more, within 1/128 of
        // the heap) keeps none.
        let expected = [
            (
                (128, 21),
                r(
                    [8, 4, 2, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1],
                    [0, 0, 1, 1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    [1, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    1,
                ),
            ),
            (
                (512, 21),
                r(
                    [32, 16, 8, 4, 4, 2, 2, 2, 2, 2, 2, 2, 2, 2],
                    [0, 0, 1, 1, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    [3, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    1,
                ),
            ),
            (
                (2048, 21),
                r(
                    [32, 32, 32, 16, 16, 8, 8, 8, 8, 8, 8, 8, 8, 8],
                    [0, 0, 1, 1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3],
                    [3, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    1,
                ),
            ),
            (
                (512, 23),
                r(
                    [32, 32, 32, 16, 16, 8, 4, 4, 4, 4, 4, 4, 4, 4],
                    [1, 0, 0, 0, 0, 3, 3, 0, 0, 0, 0, 0, 0, 0],
                    [0, 2, 3, 4, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    1,
                ),
            ),
            (
                (1024, 23),
                r(
                    [32, 32, 32, 32, 32, 16, 8, 8, 8, 8, 8, 8, 8, 8],
                    [1, 0, 0, 0, 0, 3, 3, 3, 3, 3, 3, 3, 3, 3],
                    [0, 2, 3, 6, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    1,
                ),
            ),
            (
                (2048, 23),
                r(
                    [32, 32, 32, 32, 32, 32, 16, 16, 16, 16, 16, 16, 16, 16],
                    [1, 0, 0, 0, 0, 3, 3, 3, 3, 3, 3, 3, 3, 3],
                    [0, 2, 3, 6, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    2,
                ),
            ),
            (
                (2107, 22),
                r(
                    [32, 32, 32, 32, 32, 16, 8, 8, 8, 8, 8, 8, 8, 8],
                    [0, 0, 0, 1, 3, 3, 3, 3, 3, 3, 3, 3, 3, 3],
                    [2, 3, 6, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0],
                    1,
                ),
            ),
            (
                (65535, 24),
                r(
                    [32; 14],
                    [1, 1, 0, 0, 0, 0, 3, 3, 3, 3, 3, 3, 3, 3],
                    [0, 0, 2, 3, 3, 6, 0, 0, 0, 0, 0, 0, 0, 0],
                    2,
                ),
            ),
        ];
        for ((segments, shift), want) in expected {
            assert_eq!(
                rules(segments, shift),
                want,
                "{segments} segments of 2^{shift}"
            );
        }
    }

    /// A heap that reserves 16 GiB (2,048 segments of 8 MiB) with 4 GiB
    /// mapped follows the rules of a fixed 4 GiB heap of the same segments,
    /// and those of 8 and 16 GiB as it grows (before budgets it kept the
    /// 16 GiB heap's rules whatever was mapped). The copy keeps the
    /// handle's addresses and geometry; the budget is capped at its
    /// segments.
    #[test]
    fn a_budget_gives_the_rules_of_a_heap_of_its_size() {
        let layout = Heap::layout(2048, 23, 0).unwrap();
        // SAFETY: as in `rules`.
        let heap = unsafe { layout.bind(0x1000_0000, 0x2000) };
        assert_eq!(heap.budget_segments(), 2048, "a fixed heap counts all");
        for mapped in [0, 1, 128, 512, 1024, 2048] {
            let budgeted = heap.with_budget(mapped);
            assert_eq!(budgeted.budget_segments(), mapped);
            if mapped > 0 {
                assert_eq!(
                    budgeted.rules(),
                    rules(mapped as u64, 23),
                    "{mapped} mapped"
                );
            }
            let geometry = |h: &Heap| (h.data(), h.metadata(), h.metadata_words(), h.segments());
            assert_eq!(geometry(&budgeted), geometry(&heap));
            assert_eq!(budgeted.data_bytes(), heap.data_bytes());
            assert_eq!(budgeted.image() == heap.image(), mapped == 2048);
        }
        assert_eq!(heap.with_budget(u32::MAX).budget_segments(), 2048);
        assert_ne!(
            heap.with_budget(512).rules(),
            heap.rules(),
            "a 4 GiB budget differs from the 16 GiB heap's"
        );
    }
}

/// The run tests' heap: 2048 segments (of 2 MiB, enough for whole-segment
/// spares, unless a test names another size), metadata only.
#[cfg(all(test, not(loom)))]
const RUN_TEST_SEGMENTS: u32 = 2048;

/// Runs `body` on a fresh heap of [`RUN_TEST_SEGMENTS`] segments of 2 MiB,
/// in a thread of its own (the host's SM id, and so the home slot, is per
/// thread), with the slice class of `size`, its slices per block and the
/// thread's home slot.
#[cfg(all(test, not(loom)))]
fn on_a_fresh_heap(size: u64, body: impl Fn(&Heap, SizeClass, u32, u32) + Send + Sync) {
    on_a_fresh_heap_of(crate::class::MIN_SEGMENT_SHIFT, size, body);
}

/// [`on_a_fresh_heap`] with segments of `1 << shift` bytes.
#[cfg(all(test, not(loom)))]
fn on_a_fresh_heap_of(
    shift: u32,
    size: u64,
    body: impl Fn(&Heap, SizeClass, u32, u32) + Send + Sync,
) {
    extern crate std;
    use crate::class::Request;
    let (heap, _words) = crate::layout::test_support::test_heap_of(
        RUN_TEST_SEGMENTS as u64,
        RUN_TEST_SEGMENTS,
        shift,
    );
    let Request::Class(class) = Request::for_size(size, shift) else {
        panic!("{size} B is a slice class");
    };
    // These tests are about slot runs and spares, which a class that draws
    // from a stripe does not keep (`crate::stripe` has its own tests): such
    // a class runs them through a handle whose budget (64 segments) leaves
    // no room for a stripe and keeps its spares.
    let budgeted;
    let heap: &Heap = if heap.stripe_segments(class) > 0 {
        budgeted = heap.with_budget(64);
        assert_eq!(budgeted.stripe_segments(class), 0, "{size} B");
        &budgeted
    } else {
        &heap
    };
    let per_block = class.slices_per_block(shift);
    std::thread::scope(|s| {
        s.spawn(|| {
            let slot = arch::sm_id() & (heap.slots_for(class) - 1);
            // A burst's demand: every claim may take all it would.
            with_waiting_slices(per_block * 16, || body(heap, class, per_block, slot));
        });
    });
}

/// Slices that unit tests add to the demand an installer sees waiting on
/// its slot ([`Heap::claim_demand`]), for this thread: one thread is one
/// team, where a burst has hundreds waiting by the time an installer
/// claims.
#[cfg(all(test, not(loom)))]
mod test_waiting {
    extern crate std;
    std::thread_local! {
        pub(super) static SLICES: core::cell::Cell<u32> = const { core::cell::Cell::new(0) };
    }
}

/// Runs `body` on this thread as if `slices` more were waiting on every
/// slot an install claims for (`test_waiting`); the count before comes
/// back after it.
#[cfg(all(test, not(loom)))]
fn with_waiting_slices<R>(slices: u32, body: impl FnOnce() -> R) -> R {
    let before = test_waiting::SLICES.with(|w| w.replace(slices));
    let r = body();
    test_waiting::SLICES.with(|w| w.set(before));
    r
}

/// The version slot `slot` of `class` holds now.
#[cfg(all(test, not(loom)))]
fn slot_word(heap: &Heap, class: SizeClass, slot: u32) -> SlotWord {
    SlotWord(arch::load_relaxed(heap.slot(class, slot)))
}

/// Spare words of slot `slot` of `class` that hold a block.
#[cfg(all(test, not(loom)))]
fn parked(heap: &Heap, class: SizeClass, slot: u32) -> u32 {
    (0..SPARES_PER_SLOT)
        .filter(|&i| arch::load_relaxed(heap.spare(class, slot, i)) != 0)
        .count() as u32
}

/// Allocates `size` bytes once for each index in `indices` and checks that
/// allocation `i` lands at `base + i * size` (a run handed out in address
/// order); the addresses go into `held`.
#[cfg(all(test, not(loom)))]
fn malloc_in_order(
    heap: &Heap,
    size: u64,
    base: u64,
    indices: core::ops::Range<u64>,
    held: &mut impl Extend<u64>,
) {
    for i in indices {
        let p = heap.malloc(size) as u64;
        assert_eq!(p, base + i * size, "index {i} of the run");
        held.extend([p]);
    }
}

/// Flushes the slots, frees `held`, and checks that every segment is back.
#[cfg(all(test, not(loom)))]
fn free_all_and_check_whole(heap: &Heap, held: &[u64]) {
    heap.flush_slots();
    for &p in held {
        assert_ne!(p, 0);
        heap.free(p as *mut u8);
    }
    heap.flush_slots();
    assert_eq!(
        heap.free_segments(),
        RUN_TEST_SEGMENTS,
        "every segment is back"
    );
}

/// `DEMAND_CLAIM`: a claim takes no more blocks than `DEMAND_CLAIM` times
/// the slices waiting on the slot fill. On a fresh heap with spares, a
/// 4 KiB slot (whole 2 MiB segments of 512 slices) whose installer is the
/// only team waiting claims one segment: a run of one, nothing parked,
/// where the full claim takes 1 + spares. Its next install, with
/// `per_block / DEMAND_CLAIM` more slices waiting, takes two: a run of two.
/// Everything comes back after the frees and a flush. Other builds check
/// nothing.
#[cfg(all(test, not(loom)))]
#[test]
fn a_claim_takes_the_blocks_the_waiting_teams_fill() {
    extern crate std;
    if DEMAND_CLAIM == 0 || !RUNS || SLOT_RUN_MAX < 2 {
        return;
    }
    on_a_fresh_heap(4096, |heap, class, per_block, slot| {
        if DEMAND_CLAIM >= per_block {
            // The installer's own slice already asks for a block more.
            return;
        }
        assert_eq!(class.blocks_per_segment(heap.segment_shift), 1);
        assert!(heap.spares_for(class) > 0, "the full claim takes spares");
        let mut held = std::vec::Vec::new();
        with_waiting_slices(0, || {
            held.push(heap.malloc(4096) as u64);
            assert_eq!(slot_word(heap, class, slot).run(), 1, "one block");
            assert_eq!(parked(heap, class, slot), 0, "no spare");
            for _ in 1..per_block {
                held.push(heap.malloc(4096) as u64);
            }
        });
        with_waiting_slices(per_block / DEMAND_CLAIM.max(1), || {
            held.push(heap.malloc(4096) as u64);
        });
        assert_eq!(slot_word(heap, class, slot).run(), 2, "two blocks");
        assert_eq!(parked(heap, class, slot), 0, "no spare");
        free_all_and_check_whole(heap, &held);
    });
}

/// `DEMAND_CLAIM` cuts how many blocks a claim takes, not which path takes
/// them: a 1 KiB slot on a heap of 8 MiB segments (two 4 MiB blocks each)
/// whose full claim goes through whole segments (`SEGMENT_RUNS`) still
/// claims a whole segment, both its blocks as one run, when only its
/// installer waits, where the class tree's claim of one block was slower
/// (`docs/PERF.md`, "Claims sized by the waiting demand"). Other builds
/// check nothing.
#[cfg(all(test, not(loom)))]
#[test]
fn a_small_demand_keeps_the_whole_segment_path() {
    extern crate std;
    if DEMAND_CLAIM == 0 || !RUNS || SEGMENT_RUNS == 0 || SLOT_RUN_MAX < 2 {
        return;
    }
    on_a_fresh_heap_of(23, 1024, |heap, class, per_block, slot| {
        assert_eq!(class.blocks_per_segment(heap.segment_shift), 2);
        // The full claim (1 + spares) must want more than the segment's
        // two blocks to take the whole-segment path at all.
        if heap.spares_for(class) < 2 || DEMAND_CLAIM >= per_block {
            return;
        }
        let first = with_waiting_slices(0, || heap.malloc(1024) as u64);
        expect_one_run_in_order(heap, class, slot, 1024, first, 2);
    });
}

/// The slot's word holds `run` blocks from `first` on, with no spare
/// parked; its slices come in address order from `first` to the run's end
/// (allocations of `size`), and everything comes back after the frees and
/// a flush.
#[cfg(all(test, not(loom)))]
fn expect_one_run_in_order(
    heap: &Heap,
    class: SizeClass,
    slot: u32,
    size: u64,
    first: u64,
    run: u32,
) {
    extern crate std;
    assert_eq!(slot_word(heap, class, slot).run(), run, "blocks in the run");
    assert_eq!(parked(heap, class, slot), 0, "spares parked");
    let per_block = class.slices_per_block(heap.segment_shift);
    let mut held = std::vec![first];
    malloc_in_order(heap, size, first, 1..(run * per_block) as u64, &mut held);
    free_all_and_check_whole(heap, &held);
}

/// With runs (`GPUMALLOC_SLOT_RUN` above 1): a 4 KiB install on a fresh
/// heap with spares claims adjacent whole segments and installs them as one
/// run; the slot hands out the run's slices in address order before its
/// next install; a reclaim trims the run to the blocks reached and gives
/// the others back; a flush and the frees give back the rest. Other builds
/// check nothing.
#[cfg(all(test, not(loom)))]
#[test]
fn a_claim_of_adjacent_segments_installs_one_run() {
    extern crate std;
    if !RUNS {
        return;
    }
    on_a_fresh_heap(4096, |heap, class, per_block, slot| {
        assert_eq!(class.blocks_per_segment(heap.segment_shift), 1);
        let spares = heap.spares_for(class);
        assert!(
            spares > 0,
            "a heap of {RUN_TEST_SEGMENTS} segments keeps whole-segment spares"
        );
        let run = (1 + spares).min(SLOT_RUN_MAX);
        let first = heap.malloc(4096) as u64;
        assert_ne!(first, 0);
        let installed = slot_word(heap, class, slot);
        assert_eq!(
            installed.run(),
            run,
            "the claim's adjacent segments form one run"
        );
        assert_eq!(
            parked(heap, class, slot),
            1 + spares - run,
            "only the rest is parked"
        );
        assert_eq!(heap.free_segments(), RUN_TEST_SEGMENTS - 1 - spares);
        // Two blocks' worth and one more slice, in address order, with no
        // install between them.
        let mut held = std::vec![first];
        malloc_in_order(heap, 4096, first, 1..per_block as u64 + 2, &mut held);
        assert_eq!(
            slot_word(heap, class, slot).version(),
            installed.version(),
            "no install within the run"
        );
        // A reclaim keeps the two blocks reached, gives back the others.
        heap.reclaim();
        let trimmed = slot_word(heap, class, slot);
        assert_eq!((trimmed.run(), trimmed.reserved()), (2, per_block + 2));
        assert_eq!(
            parked(heap, class, slot),
            0,
            "a reclaim gives back the spares"
        );
        assert_eq!(heap.free_segments(), RUN_TEST_SEGMENTS - 2);
        // The slot goes on from where it was, then installs afresh.
        let per_block = per_block as u64;
        malloc_in_order(heap, 4096, first, per_block + 2..2 * per_block, &mut held);
        held.push(heap.malloc(4096) as u64);
        assert_ne!(
            slot_word(heap, class, slot).version(),
            trimmed.version(),
            "the next install"
        );
        free_all_and_check_whole(heap, &held);
    });
}

/// With runs: a slot whose run's first block was wholly handed out and
/// freed (so it came back and may serve anyone) is still emptied by a
/// reclaim once its other blocks' slices are freed: the idle test reads
/// only the blocks the slot still holds. Other builds check nothing.
#[cfg(all(test, not(loom)))]
#[test]
fn a_run_whose_first_block_came_back_is_still_reclaimed() {
    extern crate std;
    use std::vec::Vec;
    if !RUNS {
        return;
    }
    on_a_fresh_heap(4096, |heap, class, per_block, slot| {
        let held: Vec<u64> = (0..=per_block).map(|_| heap.malloc(4096) as u64).collect();
        assert!(held.iter().all(|&p| p != 0));
        assert!(slot_word(heap, class, slot).run() > 1);
        for p in held {
            heap.free(p as *mut u8);
        }
        heap.reclaim();
        assert_eq!(slot_word(heap, class, slot).block(), None);
        assert_eq!(
            heap.free_segments(),
            RUN_TEST_SEGMENTS,
            "every segment is back"
        );
    });
}

/// With runs of 4: a reclaim trims a run whose version reached its third
/// block to those three (runs may have any length up to four) and gives
/// the fourth back, and after every reclaim the slot word can still hand
/// out what it reserved. A trim to three blocks once wrote a run of one
/// under two blocks' reservations when runs were powers of two: the
/// version looked exhausted with no installer, and the GPU's demand + 3%
/// test hung or lost two segments. Other builds check nothing.
#[cfg(all(test, not(loom)))]
#[test]
fn a_reclaim_trims_a_run_to_the_three_blocks_it_reached() {
    extern crate std;
    use std::vec::Vec;
    if SLOT_RUN_MAX != 4 {
        return;
    }
    on_a_fresh_heap(4096, |heap, class, per_block, slot| {
        let mut held: Vec<u64> = (0..=2 * per_block)
            .map(|_| heap.malloc(4096) as u64)
            .collect();
        assert_eq!(
            slot_word(heap, class, slot).run(),
            4,
            "a fresh heap's claim is a run of four"
        );
        let free_before = heap.free_segments();
        heap.reclaim();
        let after = slot_word(heap, class, slot);
        assert!(after.reserved() <= after.capacity(per_block), "{after:?}");
        assert_eq!(after.run(), 3, "three blocks reached: three kept");
        assert_eq!(
            heap.free_segments(),
            free_before + 1,
            "the fourth segment is back"
        );
        // The rest of the third block is still handed out in order, and
        // the slot installs again after it.
        malloc_in_order(
            heap,
            4096,
            held[0],
            2 * per_block as u64 + 1..3 * per_block as u64,
            &mut held,
        );
        let next = heap.malloc(4096) as u64;
        assert_ne!(next, 0);
        assert_ne!(
            slot_word(heap, class, slot).version(),
            after.version(),
            "a new version past the third block"
        );
        held.push(next);
        free_all_and_check_whole(heap, &held);
    });
}

/// With runs: a 256 B slot's first install on a fresh heap (whose claim
/// with spares takes a whole 2 MiB segment, so it keeps them,
/// `FIRST_INSTALL_SPARES`) formats a segment and installs both its 1 MiB
/// blocks as one run: 8,192 slices in address order, no spare parked, and
/// everything comes back after the frees and a flush. Other builds check
/// nothing.
#[cfg(all(test, not(loom)))]
#[test]
fn a_claim_of_adjacent_blocks_in_a_segment_installs_one_run() {
    extern crate std;
    if !RUNS || RUN_BLOCKS == 0 {
        return;
    }
    on_a_fresh_heap(256, |heap, class, per_block, slot| {
        assert_eq!(class.blocks_per_segment(heap.segment_shift), 2);
        assert!(
            heap.spares_for(class) > 0,
            "a heap of {RUN_TEST_SEGMENTS} segments keeps spares"
        );
        let first = heap.malloc(256) as u64;
        // With `SEGMENT_RUNS=1`, the claim takes two segments of two blocks.
        let run = if SEGMENT_RUNS == 1 { 4 } else { 2 };
        assert_eq!(
            slot_word(heap, class, slot).run(),
            run,
            "the blocks of the formatted segments"
        );
        assert_eq!(parked(heap, class, slot), 0);
        let mut held = std::vec![first];
        malloc_in_order(heap, 256, first, 1..(run * per_block) as u64, &mut held);
        free_all_and_check_whole(heap, &held);
    });
}

/// With `GPUMALLOC_SLOT_RUN_BLOCKS=3`: a reserved claim's blocks, taken at
/// their ticket bits with one RMW, join the installed block as one run. On
/// a heap of 8 MiB segments (eight 1 MiB blocks of 256 B), a slot's first
/// install claims one block and formats the segment
/// (`FIRST_INSTALL_SPARES`); its next claims four more, reserved at
/// tickets 1 … 4, and installs them as one run that continues in address
/// order. When another claim took one of those bits first (bit 3 here),
/// the run stops before it (blocks 1 and 2), and the claim's other blocks
/// (bit 4, taken at its ticket, and one scanned for) are parked as spares.
/// Everything comes back after the frees and a flush. Other builds check
/// nothing.
#[cfg(all(test, not(loom)))]
#[test]
fn a_reserved_claim_installs_its_ticket_blocks_as_one_run() {
    extern crate std;
    if !RUNS || RUN_BLOCKS != 3 || SLOT_RUN_MAX < 4 {
        return;
    }
    for taken_first in [None, Some(3u32)] {
        on_a_fresh_heap_of(23, 256, |heap, class, per_block, slot| {
            assert_eq!(class.blocks_per_segment(heap.segment_shift), 8);
            assert!(heap.spares_for(class) >= 3, "a claim of four blocks");
            let first = heap.malloc(256) as u64;
            assert_eq!(
                slot_word(heap, class, slot).run(),
                1,
                "the first claim: one block"
            );
            let mut held = std::vec![first];
            malloc_in_order(heap, 256, first, 1..per_block as u64, &mut held);
            let segment = (first - heap.data()) as u32 >> heap.segment_shift;
            if let Some(bit) = taken_first {
                assert_eq!(heap.bitmap(segment).take_bits(0, 1 << bit), 1 << bit);
            }
            let next = heap.malloc(256) as u64;
            assert_eq!(
                next,
                first + per_block as u64 * 256,
                "block 1 follows block 0"
            );
            held.push(next);
            let (run, spares) = if taken_first.is_some() {
                (2, 2)
            } else {
                (4, 0)
            };
            assert_eq!(slot_word(heap, class, slot).run(), run);
            assert_eq!(parked(heap, class, slot), spares);
            // Every block is taken once: blocks 0 … 4 by the two claims
            // (or 0 … 2, 4 and the one scanned for, 5, with bit 3 taken
            // first), the others still free in the bitmap.
            let free: std::vec::Vec<u32> = (0..8)
                .filter(|&b| heap.bitmap(segment).is_free(b))
                .collect();
            let expected: &[u32] = if taken_first.is_some() {
                &[6, 7]
            } else {
                &[5, 6, 7]
            };
            assert_eq!(free, expected, "blocks free in the bitmap");
            malloc_in_order(heap, 256, next, 1..(run * per_block) as u64, &mut held);
            if let Some(bit) = taken_first {
                assert!(heap.bitmap(segment).give_back(bit));
            }
            free_all_and_check_whole(heap, &held);
        });
    }
}

/// With `GPUMALLOC_SEGMENT_RUNS=4`: on a heap of 8 MiB segments, a 1 KiB
/// slot claim (one segment of two blocks) takes the lowest free segment
/// while no class whose block fills a segment has claimed, and the top of
/// the lowest tree word once 4 KiB has taken its segments from the
/// bottom; everything comes back after the frees and a flush. Other
/// builds check nothing.
#[cfg(all(test, not(loom)))]
#[test]
fn single_segment_claims_take_the_top_once_runs_are_taken() {
    extern crate std;
    if SEGMENT_RUNS != 4 {
        return;
    }
    on_a_fresh_heap_of(23, 1024, |heap, class, per_block, _slot| {
        assert_eq!(class.blocks_per_segment(heap.segment_shift), 2);
        let segment_of = |p: u64| (p - heap.data) >> heap.segment_shift;
        // The slot's first install comes through the class tree; fill its
        // segment so that the next install claims one whole.
        let first = heap.malloc(1024) as u64;
        let mut held = std::vec![first];
        malloc_in_order(heap, 1024, first, 1..2 * per_block as u64, &mut held);
        let packed = heap.malloc(1024) as u64;
        held.push(packed);
        assert_eq!(segment_of(packed), 1, "no runs yet: the lowest segment");
        assert!(!heap.whole_segment_runs_taken());
        held.push(heap.malloc(4096) as u64);
        assert_eq!(
            segment_of(held[held.len() - 1]),
            2,
            "the run from the bottom"
        );
        assert!(heap.whole_segment_runs_taken());
        malloc_in_order(heap, 1024, packed, 1..2 * per_block as u64, &mut held);
        let next = heap.malloc(1024) as u64;
        held.push(next);
        assert_eq!(segment_of(next), 63, "beside runs: the word's top");
        free_all_and_check_whole(heap, &held);
    });
}

/// With `GPUMALLOC_SEGMENT_RUNS=1`: a 1 KiB slot's claim on a heap of
/// 8 MiB segments (two 4 MiB blocks each) takes two adjacent segments and
/// installs their four blocks as one run, 16,384 slices in address order
/// across the segment boundary, with no spare parked; everything comes back
/// after the frees and a flush. Other builds check nothing.
#[cfg(all(test, not(loom)))]
#[test]
fn a_claim_of_two_segments_of_two_blocks_installs_one_run() {
    extern crate std;
    if !RUNS || SEGMENT_RUNS != 1 || SLOT_RUN_MAX < 4 {
        return;
    }
    on_a_fresh_heap_of(23, 1024, |heap, class, _per_block, slot| {
        assert_eq!(class.blocks_per_segment(heap.segment_shift), 2);
        assert!(heap.spares_for(class) >= 3, "a claim of four blocks");
        let first = heap.malloc(1024) as u64;
        // Two segments' blocks.
        expect_one_run_in_order(heap, class, slot, 1024, first, 4);
    });
}
