//! The segment table: one state word per segment saying what the segment is
//! (free, formatted for a class with so many free blocks, or part of a
//! multi-segment run), and the transitions between those states.
//!
//! # State word
//! `kind` (bits 24..28), `class` (bits 16..24), for an `Active` segment its
//! `free` count (bits 32..64, a two's-complement `i32`), and for a run head
//! its length in segments less one (bits 0..24).
//!
//! The `free` field sits at the top of the word so that an add or a
//! subtract of it can never carry or borrow into another field: block
//! classes reserve with one subtract that may overdraw it (see
//! [`SegmentTable::reserve_blocks_add`]), and a claimer holding a stale
//! hint may subtract from the word of a segment that is no longer what it
//! thought (it checks the word first, so only if the segment changed
//! between that check and the subtract). For any kind but `Active` bits
//! 32..64 therefore mean nothing
//! (a stale subtract may have left a value there): every reader ignores
//! them and every transition out of those kinds writes the whole word (a
//! store, or a CAS that retries while only those bits moved).
//!
//! # Invariants (owned here)
//! - A segment is in the segment tree only while its kind is `Free`.
//! - For an `Active` segment, `free = total - out - pending`, where `total`
//!   is the class's blocks per segment, `out` the blocks reserved and not
//!   yet returned, and `pending` what overdrawing reservations subtracted
//!   beyond the blocks they got and have not given back yet. So `free`
//!   never exceeds the number of set bits of its block bitmap (a freed
//!   block's bit is set *before* `free` is incremented, and a claimed
//!   block's bit is cleared *after* `free` was decremented), and a thread
//!   holding a reservation always finds a set bit.
//! - `free == total` exactly when no block is out and no overdraw is
//!   pending. An `Active` segment turns `Free` only by a CAS from that word
//!   (made by the thread whose add brought `free` to `total`, or by
//!   `retire_idle` for a segment a batch formatted that no claim used), so
//!   no reservation, granted or pending, can be outstanding when it does.
//!   While a reservation's subtract is not given back the segment cannot
//!   retire: a give-back always lands on the same incarnation of the
//!   segment it was taken from.
//! - Whoever's RMW takes `free` from above 0 to 0 or below drops the
//!   segment from its class tree (with a re-check); whoever's add takes it
//!   from 0 or below to above 0 inserts it (`Return::FirstFree`).
//!
//! All transitions of a segment others can reach are acq_rel RMWs on the
//! state word (CASes, the add that returns blocks, see
//! [`SegmentTable::return_blocks`], and the subtract that reserves them for
//! block classes). A segment only its formatter holds
//! (claimed from the segment tree, in no class tree yet) is published by a
//! release store, or in a batch by one fence and a relaxed store per
//! segment; readers that only need
//! the class of a live allocation use a relaxed device-scope load (the class
//! cannot change while the allocation is live).

use crate::arch::{self, Word};
use crate::class::SizeClass;

/// The `free` field: bits 32..64, signed (an overdraw makes it negative).
const FREE_SHIFT: u32 = 32;
/// One block in the `free` field.
const ONE_FREE: u64 = 1 << FREE_SHIFT;
const CLASS_SHIFT: u32 = 16;
const KIND_SHIFT: u32 = 24;
/// A run head's length less one (runs of up to 2^24 segments, the largest
/// tree's universe), below the kind.
const RUN_MASK: u64 = (1 << KIND_SHIFT) - 1;
/// Bits 28..30 of a `Free` word: what the segment was before it came back
/// (`free` uses it to tell a double free from a wild pointer).
const HISTORY_SHIFT: u32 = 28;
const WAS_ACTIVE: u64 = 1;
const WAS_RUN: u64 = 2;

/// What a free segment was before it came back to the segment tree.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Previous {
    /// Never used, or a later segment of a run.
    Nothing,
    /// Formatted for this class.
    Active(SizeClass),
    /// The head of a run.
    RunHead,
}

/// What a segment currently is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SegmentState {
    /// Unformatted, in the segment tree (or being claimed or returned).
    Free,
    /// Formatted into blocks of `class`, `free` of which are unclaimed.
    Active {
        /// The class of every block in the segment.
        class: SizeClass,
        /// Blocks not handed out.
        free: u32,
    },
    /// The first segment of a multi-segment allocation of `segments` segments.
    RunHead {
        /// The run's length.
        segments: u32,
    },
    /// A later segment of a multi-segment allocation.
    RunTail,
}

/// The class and signed `free` count of an `Active` word.
#[inline(always)]
fn active(word: u64) -> Option<(SizeClass, i32)> {
    if (word >> KIND_SHIFT) & 0xf != 1 {
        return None;
    }
    let class = SizeClass::new(((word >> CLASS_SHIFT) & 0xff) as u32)?;
    Some((class, (word >> FREE_SHIFT) as u32 as i32))
}

impl SegmentState {
    /// Decodes a state word. An overdrawn `Active` word (a negative `free`
    /// field, for a moment) has no free block.
    #[inline(always)]
    pub fn decode(word: u64) -> SegmentState {
        if let Some((class, free)) = active(word) {
            return SegmentState::Active {
                class,
                free: free.max(0) as u32,
            };
        }
        match (word >> KIND_SHIFT) & 0xf {
            2 => SegmentState::RunHead {
                segments: (word & RUN_MASK) as u32 + 1,
            },
            3 => SegmentState::RunTail,
            _ => SegmentState::Free,
        }
    }

    /// Encodes a state word.
    #[inline(always)]
    pub fn encode(self) -> u64 {
        match self {
            SegmentState::Free => 0,
            SegmentState::Active { class, free } => {
                1 << KIND_SHIFT
                    | (class.index() as u64) << CLASS_SHIFT
                    | (free as u64) << FREE_SHIFT
            }
            SegmentState::RunHead { segments } => {
                2 << KIND_SHIFT | (segments as u64).wrapping_sub(1) & RUN_MASK
            }
            SegmentState::RunTail => 3 << KIND_SHIFT,
        }
    }
}

/// The word of a `Free` segment that was `previous` (decodes as `Free`).
#[inline(always)]
fn retired_word(previous: Previous) -> u64 {
    match previous {
        Previous::Nothing => SegmentState::Free.encode(),
        Previous::Active(class) => {
            WAS_ACTIVE << HISTORY_SHIFT | (class.index() as u64) << CLASS_SHIFT
        }
        Previous::RunHead => WAS_RUN << HISTORY_SHIFT,
    }
}

/// The outcome of [`SegmentTable::reserve_blocks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reservation {
    /// `count` free blocks are now ours to take from the bitmap; `last` if
    /// they were the segment's last free blocks.
    Reserved {
        /// Blocks reserved (at least one).
        count: u32,
        /// The reservation took the last free blocks.
        last: bool,
    },
    /// The segment is not an active segment of that class with free blocks.
    Stale,
    /// Another thread changed the state word first; it can still serve
    /// ([`SegmentTable::reserve_blocks_once`] only).
    Contended,
}

/// The outcome of [`SegmentTable::return_blocks`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Return {
    /// The segment had no free block before (it must join its class tree).
    FirstFree,
    /// The segment still has blocks out and already had free ones.
    Partial,
    /// That was the last block out: the segment is now `Free`.
    Retired,
}

/// The outcome of [`SegmentTable::reserve_blocks_add`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grab {
    /// `count` free blocks are now ours to take from the bitmap; `last` if
    /// the subtract took the segment's `free` to 0 or below (the caller
    /// drops it from its class tree). `ticket`: the class's blocks per
    /// segment less the `free` count the subtract found, where the bitmap
    /// of a segment that no block has come back to yet has this
    /// reservation's blocks (`ticket..ticket + count`), a hint to start
    /// the search at.
    Reserved {
        /// Blocks reserved (at least one).
        count: u32,
        /// The reservation took the last free blocks.
        last: bool,
        /// Where this reservation's blocks are in a fresh bitmap.
        ticket: u32,
    },
    /// Nothing reserved. `None`: the check before the subtract found no
    /// free block of this class there (the usual miss: nothing was
    /// subtracted), or the subtract found a word that is not `Active`
    /// (free or a run; its bits 32..64, which mean nothing there, are left
    /// as they are). `Some`: the word changed between the check and the
    /// subtract, which found an `Active` word of this class with no free
    /// block or of another class, and was given back: the class the
    /// segment is formatted for, and what the give-back did (which the
    /// caller acts on as on a return of blocks of that class).
    Missed {
        /// The segment's class and the give-back's outcome.
        gave_back: Option<(SizeClass, Return)>,
    },
}

/// The state words of all segments.
#[derive(Clone, Copy)]
pub struct SegmentTable<'a> {
    states: &'a [Word],
}

impl<'a> SegmentTable<'a> {
    /// A view of the state words.
    #[inline(always)]
    pub fn new(states: &'a [Word]) -> SegmentTable<'a> {
        SegmentTable { states }
    }

    #[inline(always)]
    fn word(&self, segment: u32) -> &'a Word {
        // SAFETY: callers pass segment ids below the heap's segment count, the
        // length of `states`.
        unsafe { self.states.get_unchecked(segment as usize) }
    }

    /// The current state (relaxed device-scope load: never a stale L1 line).
    #[inline(always)]
    pub fn load(&self, segment: u32) -> SegmentState {
        SegmentState::decode(arch::load_relaxed(self.word(segment)))
    }

    /// What a segment that is `Free` now was before (a snapshot; only
    /// meaningful while the segment stays free).
    #[inline]
    pub fn previous(&self, segment: u32) -> Previous {
        let word = arch::load_relaxed(self.word(segment));
        if SegmentState::decode(word) != SegmentState::Free {
            return Previous::Nothing;
        }
        match (word >> HISTORY_SHIFT) & 3 {
            WAS_ACTIVE => SizeClass::new(((word >> CLASS_SHIFT) & 0xff) as u32)
                .map_or(Previous::Nothing, Previous::Active),
            WAS_RUN => Previous::RunHead,
            _ => Previous::Nothing,
        }
    }

    /// Publishes a freshly formatted segment. Release (a fence, then the
    /// write): the bitmap written before is visible to whoever reserves a
    /// block after seeing this.
    ///
    /// Wherever a segment that was free (or a run) gets a new state, a
    /// stale block reservation may subtract from the word at the same time
    /// (see the module docs): coherence and RMW atomicity order the two
    /// (the subtract comes wholly before the store, which overwrites it, or
    /// after it, and sees the new word), so the write is a plain store on
    /// the GPU and the host. `arch::store_relaxed_racing_rmw` makes it an
    /// exchange under loom only, whose model of a store against another
    /// thread's RMWs broke a model run of these paths. (Branch `blk-add`
    /// made it an exchange everywhere, the likely cause of its runs of
    /// 16/32 MiB allocating 15% slower, `docs/PERF.md`; not measured
    /// apart.)
    #[inline]
    pub fn publish_active(&self, segment: u32, class: SizeClass, free: u32) {
        arch::fence_acq_rel();
        arch::store_relaxed_racing_rmw(
            self.word(segment),
            SegmentState::Active { class, free }.encode(),
        );
    }

    /// Publishes freshly formatted segments `first + k`, one for each bit `k`
    /// of `mask`, each with `free` free blocks but `own`, which has
    /// `own_free`. One fence, then a relaxed store per segment (one that
    /// may race RMWs, as at [`SegmentTable::publish_active`]):
    /// the fence followed by a write is a release of every bitmap written
    /// before the fence (a release pattern), so whoever reserves after
    /// seeing one of these words sees its bitmap; a batch pays for one fence
    /// instead of one per segment.
    #[inline]
    pub fn publish_active_many(
        &self,
        first: u32,
        mask: u64,
        class: SizeClass,
        free: u32,
        own: u32,
        own_free: u32,
    ) {
        arch::fence_acq_rel();
        let mut rest = mask;
        while rest != 0 {
            let segment = first + rest.trailing_zeros();
            let free = if segment == own { own_free } else { free };
            arch::store_relaxed_racing_rmw(
                self.word(segment),
                SegmentState::Active { class, free }.encode(),
            );
            rest &= rest - 1;
        }
    }

    /// Takes up to `want` (at least one) free blocks of an active segment of
    /// `class`, retrying while other threads change the word first.
    #[inline]
    pub fn reserve_blocks(&self, segment: u32, class: SizeClass, want: u32) -> Reservation {
        loop {
            match self.reserve_blocks_once(segment, class, want) {
                Reservation::Contended => {}
                outcome => return outcome,
            }
        }
    }

    /// [`SegmentTable::reserve_blocks`] with one CAS: `Contended` if another
    /// thread changed the word between the load and the CAS (the caller
    /// may try another segment rather than queue on this word again).
    /// Slice claims use it only when built with `GPUMALLOC_SLICE_CLAIM_ADD=0`.
    #[inline]
    pub fn reserve_blocks_once(&self, segment: u32, class: SizeClass, want: u32) -> Reservation {
        let w = self.word(segment);
        let current = arch::load_relaxed(w);
        let serves = |word| match active(word) {
            Some((c, free)) if c == class && free > 0 => Some(free as u32),
            _ => None,
        };
        let Some(free) = serves(current) else {
            return Reservation::Stale;
        };
        let count = want.clamp(1, free);
        // acq_rel: acquire, to see the bitmap published with the word (or
        // the bits set by the returns counted in it); release, so a return
        // that counts after this reservation is ordered after it.
        match arch::compare_exchange_acq_rel(w, current, current - count as u64 * ONE_FREE) {
            Ok(_) => Reservation::Reserved {
                count,
                last: free == count,
            },
            Err(actual) if serves(actual).is_some() => Reservation::Contended,
            Err(_) => Reservation::Stale,
        }
    }

    /// Reserves up to `want` (at least one) free blocks of an active
    /// segment of `class` (`total` blocks per segment) with one subtract of
    /// `want` from its `free` field (heaps of `segment_shift`): every
    /// class's claims, slices' too unless built with
    /// `GPUMALLOC_SLICE_CLAIM_ADD=0`.
    ///
    /// Why not a CAS: a burst's claimers of one segment (up to 32 warps
    /// for a 16 KiB class) then queued one CAS round trip after another on
    /// its word; every subtract is served by the L2 in one pass, in any
    /// order. The price is the overdraw: a subtract that finds fewer than
    /// `want` free takes what there is and gives the rest back with an add
    /// ([`Grab::Reserved`] with a smaller count), one that finds none gives
    /// all of it back ([`Grab::Missed`]). Between the two the word shows
    /// less free than the bitmap holds (the `pending` of the module's
    /// invariant): other claimers may miss blocks that are there, but none
    /// can reserve one that is not, and the segment cannot retire, since
    /// `free` stays below `total` until the give-back.
    ///
    /// A give-back is a return without bitmap bits: the add that brings
    /// `free` to `total` retires the segment with a CAS from exactly that
    /// word, and an add that takes it from 0 or below to above 0 says the
    /// segment must join its class tree again ([`Return::FirstFree`]); the
    /// caller acts on either for the class the word names.
    ///
    /// A relaxed load first: the subtract is made only if the word shows
    /// free blocks of `class`. A claimer's class-tree hint may be stale
    /// (the segment was drained, retired, made a run or formatted for
    /// another class since it was inserted), and a subtract on a word that
    /// cannot serve is not harmless even though it is given back: until
    /// the give-back, the word shows fewer free blocks than the segment
    /// has, so its own class's claimers miss blocks that are there, drop
    /// the segment from their class tree, and, finding the tree empty,
    /// format another segment or answer null on a full heap (the unit test
    /// `a_stale_claimer_never_hides_another_class_blocks` and the loom
    /// model `a_stale_reservation_hides_nothing_from_the_owner` show it
    /// without the load; `docs/PERF.md`, "Block claims look before they
    /// subtract"). A drained segment of this class is left
    /// alone too: no herd of subtracts and give-backs on it. The load is a
    /// filter only, so relaxed: what the claimer may then read is ordered
    /// by the subtract's acquire; a stale value either skips a segment
    /// that could serve (the caller's drop re-checks and re-inserts it) or
    /// lets the subtract through, as below.
    ///
    /// The subtract itself stays blind: between the load and the subtract
    /// the segment may have changed (every block returned, retired, then
    /// claimed for a run or another class). A free or run word keeps the
    /// subtracted top bits (which mean nothing there, and which the next
    /// transition overwrites); an `Active` word of another class gets its
    /// blocks back the same way as an overdraw.
    ///
    /// Acq_rel, as the CAS it replaces: acquire, to see the bitmap
    /// published with the word (the formatter's release store or fence)
    /// and the bits set by the returns counted in it; release, so a return
    /// or retirement that counts after this reservation is ordered after
    /// it.
    #[inline]
    pub fn reserve_blocks_add(
        &self,
        segment: u32,
        class: SizeClass,
        want: u32,
        total: u32,
        segment_shift: u32,
    ) -> Grab {
        let w = self.word(segment);
        match active(arch::load_relaxed(w)) {
            Some((c, free)) if c == class && free > 0 => {}
            _ => return Grab::Missed { gave_back: None },
        }
        self.subtract_blocks(w, class, want, total, segment_shift)
    }

    /// The subtract of [`SegmentTable::reserve_blocks_add`], made without
    /// looking at the word first: what follows when the word changed
    /// between that check and the subtract.
    #[inline]
    fn subtract_blocks(
        &self,
        w: &Word,
        class: SizeClass,
        want: u32,
        total: u32,
        segment_shift: u32,
    ) -> Grab {
        let old = arch::fetch_add_acq_rel(w, (want as u64 * ONE_FREE).wrapping_neg());
        let Some((c, free)) = active(old) else {
            return Grab::Missed { gave_back: None };
        };
        if c != class || free <= 0 {
            // Nothing here for us: give all of it back to the class the
            // segment is formatted for.
            let total = c.blocks_per_segment(segment_shift);
            return Grab::Missed {
                gave_back: Some((c, self.give_back_free(w, c, want, total))),
            };
        }
        let free = free as u32;
        let count = want.min(free);
        if count < want {
            // The overdraw: `last` below makes the caller drop the segment
            // from its class tree, with a re-check made after this add, so
            // a `FirstFree` here needs nothing more; it cannot retire the
            // segment while we hold `count` blocks of it.
            self.give_back_free(w, c, want - count, total);
        }
        Grab::Reserved {
            count,
            last: free <= want,
            ticket: total.saturating_sub(free),
        }
    }

    /// Adds `count` to an `Active` word of `class` (`total` blocks per
    /// segment) whose blocks or overdraw the caller holds, so that the add
    /// cannot carry out of `free` nor find the segment changed; retires it
    /// if the add brought `free` to `total`.
    ///
    /// Acq_rel: the release orders what the caller did before (a returned
    /// block's bitmap bit) before the count, so a claimer that reserves
    /// (acquire) finds the bits; the acquire orders what the previous
    /// returners did before a retirement made here. The retiring CAS fails
    /// only if the word moved on: a claimer subtracted meanwhile (the
    /// segment stays active for it, and whoever brings `free` back to
    /// `total` later retires it), or another retired it (`retire_idle`).
    /// Either way exactly one thread retires it, and never while a block is
    /// reserved or an overdraw pending.
    #[inline]
    fn give_back_free(&self, w: &Word, class: SizeClass, count: u32, total: u32) -> Return {
        let old = arch::fetch_add_acq_rel(w, count as u64 * ONE_FREE);
        let free = (old >> FREE_SHIFT) as u32 as i32;
        self.after_add(w, old, free, class, count, total)
    }

    /// What an add of `count` to the word `old` (`free` its field) did, and
    /// the retiring CAS if it brought `free` to `total`.
    #[inline(always)]
    fn after_add(
        &self,
        w: &Word,
        old: u64,
        free: i32,
        class: SizeClass,
        count: u32,
        total: u32,
    ) -> Return {
        let now = free + count as i32;
        if now == total as i32 {
            let full = old.wrapping_add(count as u64 * ONE_FREE);
            if arch::compare_exchange_acq_rel(w, full, retired_word(Previous::Active(class)))
                .is_ok()
            {
                return Return::Retired;
            }
        }
        if free <= 0 && now > 0 {
            Return::FirstFree
        } else {
            Return::Partial
        }
    }

    /// Counts `count` blocks of an active segment as free again (their
    /// bitmap bits are already set); retires the segment if they were the
    /// last ones out (`total`: the class's blocks per segment).
    ///
    /// One add, not a CAS loop: when the blocks of a burst complete
    /// together, hundreds of returns meet on one segment word, and a CAS
    /// loop retries each failed one. The add cannot carry out of the `free`
    /// field (`free + count <= total < 2^16` while the caller holds the
    /// blocks). Acq_rel: the release orders the caller's `give_back` before
    /// the count, so a claimer that reserves these blocks (acquire) finds
    /// their bits set; the acquire orders what the previous returners did
    /// before a retirement made here.
    ///
    /// The thread whose add brings `free` to `total` retires the segment
    /// with a CAS from exactly that word. It fails only if the word moved
    /// on: a claimer reserved a block meanwhile (the segment stays active
    /// for it), or that claimer returned it and retired the segment itself.
    /// Either way exactly one thread retires it, and never while a block is
    /// reserved.
    #[inline]
    pub fn return_blocks(&self, segment: u32, class: SizeClass, count: u32, total: u32) -> Return {
        let w = self.word(segment);
        let old = arch::fetch_add_acq_rel(w, count as u64 * ONE_FREE);
        let free = match active(old) {
            Some((c, free)) if c == class && free as i64 + count as i64 <= total as i64 => free,
            // Unreachable while the caller holds blocks of this segment:
            // only a bad free on an unchecked heap whose segment changed
            // hands after `release_block`'s check gets here. Undo the add
            // (acq_rel, as the add); a thread that read the word in
            // between saw a wrong free count, which a CAS loop would have
            // avoided, but only for a program that already freed wrongly.
            _ => {
                arch::fetch_add_acq_rel(w, (count as u64 * ONE_FREE).wrapping_neg());
                return Return::Partial;
            }
        };
        // A `free` of 0 or below before the add (below: claimers' pending
        // overdraw) and above after: the segment must join its class tree.
        self.after_add(w, old, free, class, count, total)
    }

    /// Retires an active segment of `class` none of whose `total` blocks is
    /// out: true if this CAS turned it `Free` (the caller then moves it from
    /// the class tree to the segment tree, as after the last return). A
    /// reservation racing it either comes first, and the CAS fails, or
    /// finds the segment stale. A segment formatted and never reserved from
    /// matches; so, for a moment, does one whose last return has added but
    /// not yet made its own retiring CAS: then this CAS wins, the
    /// returner's fails, and the returner leaves the segment to this
    /// caller (a class-tree insert it makes for it is a stale hint that
    /// claimers drop, as any).
    #[inline]
    pub fn retire_idle(&self, segment: u32, class: SizeClass, total: u32) -> bool {
        let idle = SegmentState::Active { class, free: total }.encode();
        // acq_rel, as every transition of a reachable segment: whoever
        // claims it from the segment tree next is ordered after this.
        arch::compare_exchange_acq_rel(
            self.word(segment),
            idle,
            retired_word(Previous::Active(class)),
        )
        .is_ok()
    }

    /// Marks a claimed run of segments as one allocation: stores that may
    /// race a stale subtract, as at [`SegmentTable::publish_active`], the
    /// head's after a fence (release: the tails' words before the head's).
    #[inline]
    pub fn publish_run(&self, head: u32, segments: u32) {
        for s in head + 1..head + segments {
            arch::store_relaxed_racing_rmw(self.word(s), SegmentState::RunTail.encode());
        }
        arch::fence_acq_rel();
        arch::store_relaxed_racing_rmw(
            self.word(head),
            SegmentState::RunHead { segments }.encode(),
        );
    }

    /// Ends a run: `Some(length)` if this call freed it, `None` if `head` is
    /// not the head of a live run (a double or wild free).
    #[inline]
    pub fn end_run(&self, head: u32) -> Option<u32> {
        let w = self.word(head);
        let mut current = arch::load_relaxed(w);
        let SegmentState::RunHead { segments } = SegmentState::decode(current) else {
            return None;
        };
        // A CAS that fails only because a stale block reservation changed
        // bits 32..64 (which mean nothing in a run head) is retried: only
        // a change of the run head itself (another free ending it) makes
        // this free a double one.
        loop {
            match arch::compare_exchange_acq_rel(w, current, retired_word(Previous::RunHead)) {
                Ok(_) => break,
                Err(actual)
                    if SegmentState::decode(actual) == (SegmentState::RunHead { segments }) =>
                {
                    current = actual
                }
                Err(_) => return None,
            }
        }
        for s in head + 1..head + segments {
            arch::store_relaxed_racing_rmw(self.word(s), SegmentState::Free.encode());
        }
        Some(segments)
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    use super::*;

    #[test]
    fn state_words_round_trip() {
        let c = SizeClass::new(3).unwrap();
        for s in [
            SegmentState::Free,
            SegmentState::Active { class: c, free: 0 },
            SegmentState::Active {
                class: c,
                free: 2048,
            },
            SegmentState::RunHead { segments: 77 },
            SegmentState::RunTail,
        ] {
            assert_eq!(SegmentState::decode(s.encode()), s);
        }
    }

    #[test]
    fn reserve_then_return_retires() {
        let states = [Word::new(0)];
        let t = SegmentTable::new(&states);
        let c16 = SizeClass::new(0).unwrap();
        let shift = crate::class::MIN_SEGMENT_SHIFT;
        let c2k = (0..crate::class::SLICE_CLASSES)
            .filter_map(SizeClass::new)
            .find(|c| c.blocks_per_segment(shift) == 2)
            .expect("a slice class with two blocks per segment");
        t.publish_active(0, c2k, 1);
        assert_eq!(t.reserve_blocks(0, c16, 1), Reservation::Stale);
        assert_eq!(
            t.reserve_blocks(0, c2k, 5),
            Reservation::Reserved {
                count: 1,
                last: true
            }
        );
        assert_eq!(t.reserve_blocks(0, c2k, 1), Reservation::Stale);
        assert_eq!(t.reserve_blocks_once(0, c2k, 1), Reservation::Stale);
        assert_eq!(t.return_blocks(0, c2k, 1, 2), Return::FirstFree);
        assert_eq!(t.return_blocks(0, c2k, 1, 2), Return::Retired);
        assert_eq!(t.load(0), SegmentState::Free);
    }

    #[test]
    fn a_batch_is_published_with_its_own_segment_apart() {
        let states: [Word; 3] = core::array::from_fn(|_| Word::new(0));
        let t = SegmentTable::new(&states);
        let c16 = SizeClass::new(0).unwrap();
        t.publish_active_many(0, 0b101, c16, 8, 2, 5);
        assert_eq!(
            t.load(0),
            SegmentState::Active {
                class: c16,
                free: 8
            }
        );
        assert_eq!(t.load(1), SegmentState::Free);
        assert_eq!(
            t.load(2),
            SegmentState::Active {
                class: c16,
                free: 5
            }
        );
        assert_eq!(
            t.reserve_blocks_once(2, c16, 9),
            Reservation::Reserved {
                count: 5,
                last: true
            }
        );
        // Idle: all 8 free. Segment 2 has blocks out.
        assert!(!t.retire_idle(2, c16, 5), "blocks out");
        assert!(!t.retire_idle(0, c16, 9), "not all free");
        assert!(t.retire_idle(0, c16, 8));
        assert_eq!(t.load(0), SegmentState::Free);
        assert_eq!(t.previous(0), Previous::Active(c16));
    }

    /// Segments of the block-class tests: their smallest block class has
    /// 128 blocks there. Since 64 and 128 KiB became slice classes this is
    /// 2^25, above any heap's segments: the table's arithmetic, all these
    /// tests do, does not care.
    const BLOCK_TEST_SHIFT: u32 = crate::class::MIN_BLOCK_CLASS_SHIFT + 7;

    /// The smallest block class (128 blocks per segment of the tests) and
    /// the next (64).
    fn block_classes() -> (SizeClass, SizeClass) {
        let shift = BLOCK_TEST_SHIFT;
        let mut blocks = (0..crate::class::CLASSES)
            .filter_map(SizeClass::new)
            .filter(|c| !c.is_slice());
        let (a, b) = (blocks.next().unwrap(), blocks.next().unwrap());
        assert_eq!(
            (a.blocks_per_segment(shift), b.blocks_per_segment(shift)),
            (128, 64)
        );
        (a, b)
    }

    /// The raw signed `free` field of segment 0.
    fn field(states: &[Word]) -> i32 {
        (arch::load_relaxed(&states[0]) >> FREE_SHIFT) as u32 as i32
    }

    #[test]
    fn an_overdraw_takes_what_is_there_and_gives_the_rest_back() {
        let states = [Word::new(0)];
        let t = SegmentTable::new(&states);
        let (c, _) = block_classes();
        let shift = BLOCK_TEST_SHIFT;
        t.publish_active(0, c, 128);
        let grab = |want| t.reserve_blocks_add(0, c, want, 128, shift);
        assert_eq!(
            grab(100),
            Grab::Reserved {
                count: 100,
                last: false,
                ticket: 0
            }
        );
        assert_eq!(
            grab(32),
            Grab::Reserved {
                count: 28,
                last: true,
                ticket: 100
            }
        );
        assert_eq!(field(&states), 0, "the overdraw was given back");
        // Drained: the check sees no free block and subtracts nothing.
        assert_eq!(grab(1), Grab::Missed { gave_back: None });
        assert_eq!(field(&states), 0);
        // A subtract made after a check that saw free blocks, which others
        // took meanwhile: given back to the same class.
        assert_eq!(
            t.subtract_blocks(&states[0], c, 1, 128, shift),
            Grab::Missed {
                gave_back: Some((c, Return::Partial))
            }
        );
        assert_eq!(field(&states), 0);
        assert_eq!(t.return_blocks(0, c, 28, 128), Return::FirstFree);
        assert_eq!(t.return_blocks(0, c, 100, 128), Return::Retired);
        assert_eq!(t.load(0), SegmentState::Free);
        // A stale reservation on the free word: nothing to give back, the
        // word still reads free and remembers its class, and the next
        // format's store overwrites what the subtract left.
        assert_eq!(grab(7), Grab::Missed { gave_back: None });
        assert_eq!(t.load(0), SegmentState::Free);
        assert_eq!(t.previous(0), Previous::Active(c));
        t.publish_active(0, c, 128);
        assert_eq!(field(&states), 128);
    }

    #[test]
    fn a_stale_reservation_gives_another_class_its_blocks_back() {
        let states = [Word::new(0)];
        let t = SegmentTable::new(&states);
        let (small, next) = block_classes();
        let shift = BLOCK_TEST_SHIFT;
        t.publish_active(0, next, 10);
        // The check sees another class's word: nothing subtracted.
        let before = arch::load_relaxed(&states[0]);
        assert_eq!(
            t.reserve_blocks_add(0, small, 32, 128, shift),
            Grab::Missed { gave_back: None }
        );
        assert_eq!(arch::load_relaxed(&states[0]), before);
        // A subtract whose check saw the smaller class there before the
        // segment was retired and formatted for the next: it took the other
        // class's `free` below 1 for a moment (its claimers may have
        // dropped the segment from their tree), so the give-back says it
        // must join that tree again.
        assert_eq!(
            t.subtract_blocks(&states[0], small, 32, 128, shift),
            Grab::Missed {
                gave_back: Some((next, Return::FirstFree))
            }
        );
        assert_eq!(
            t.load(0),
            SegmentState::Active {
                class: next,
                free: 10
            }
        );
        // An idle segment of the other class: the give-back brings it to
        // every block free, and retires it as the last return would.
        t.publish_active(0, next, 64);
        assert_eq!(
            t.subtract_blocks(&states[0], small, 32, 128, shift),
            Grab::Missed {
                gave_back: Some((next, Return::Retired))
            }
        );
        assert_eq!(t.load(0), SegmentState::Free);
    }

    #[test]
    fn a_run_head_survives_a_stale_reservation() {
        let states: [Word; 3] = core::array::from_fn(|_| Word::new(0));
        let t = SegmentTable::new(&states);
        let (small, _) = block_classes();
        t.publish_run(0, 3);
        let shift = BLOCK_TEST_SHIFT;
        assert_eq!(
            t.reserve_blocks_add(0, small, 32, 128, shift),
            Grab::Missed { gave_back: None }
        );
        // One whose check came before the run was made.
        assert_eq!(
            t.subtract_blocks(&states[0], small, 32, 128, shift),
            Grab::Missed { gave_back: None }
        );
        assert_eq!(t.load(0), SegmentState::RunHead { segments: 3 });
        assert_eq!(t.end_run(0), Some(3));
        assert_eq!(t.end_run(0), None);
        let longest = SegmentState::RunHead { segments: 1 << 24 };
        assert_eq!(SegmentState::decode(longest.encode()), longest);
    }

    /// A claimer of the smallest block class whose hint is stale (segment 0
    /// is the next class's) keeps reserving there while the segment's own
    /// class, alone, reserves its 64 blocks one at a time, returns them
    /// and formats the segment again, 200 times. Nothing else takes its
    /// blocks, so none of the owner's reservations may miss: a stale
    /// claimer must not make another class's free blocks look taken (a
    /// claimer that misses drops the segment from its class tree, and with
    /// the class tree empty it formats another segment or, on a full heap,
    /// answers null). The stale claimer yields at every RMW, so a subtract
    /// it made stays in the word while the owner reserves.
    #[test]
    fn a_stale_claimer_never_hides_another_class_blocks() {
        extern crate std;
        use std::sync::atomic::{AtomicBool, Ordering};
        let states = [Word::new(0)];
        let t = SegmentTable::new(&states);
        let (small, next) = block_classes();
        let shift = BLOCK_TEST_SHIFT;
        t.publish_active(0, next, 64);
        let stop = AtomicBool::new(false);
        let (t, stop) = (&t, &stop);
        let misses = std::thread::scope(|s| {
            s.spawn(move || {
                arch::preempt_every(1);
                while !stop.load(Ordering::Relaxed) {
                    let grab = t.reserve_blocks_add(0, small, 32, 128, shift);
                    assert!(matches!(grab, Grab::Missed { .. }), "{grab:?}");
                }
            });
            let mut misses = 0;
            for _ in 0..200 {
                for _ in 0..64 {
                    if !matches!(
                        t.reserve_blocks_add(0, next, 1, 64, shift),
                        Grab::Reserved { count: 1, .. }
                    ) {
                        misses += 1;
                    }
                    std::thread::yield_now();
                }
                // Give everything back; the last add (ours, or a stale
                // give-back after it) retires the segment; format again.
                let held = 64 - misses.min(64);
                if held > 0 {
                    t.return_blocks(0, next, held, 64);
                }
                while t.load(0) != SegmentState::Free {
                    std::thread::yield_now();
                }
                t.publish_active(0, next, 64);
                if misses > 0 {
                    break;
                }
            }
            stop.store(true, Ordering::Relaxed);
            misses
        });
        assert_eq!(misses, 0, "the owner missed blocks a stale claimer hid");
    }

    /// Eight threads reserve 1–32 blocks of one 128-block segment at a
    /// time with one subtract each, hold them a while and return them in
    /// pieces; a ninth subtracts for another class without the check (a
    /// stale hint whose segment changed after the check) and gives back. Yields at every other RMW. Whoever retires the segment formats
    /// it again (as a claimer of the free segment would). Never more than
    /// 128 blocks out, and at the end every block is back: the segment is
    /// free or whole, with no overdraw left behind.
    #[test]
    fn hammered_add_reservations_never_overdraw_the_bitmap() {
        extern crate std;
        use std::sync::atomic::{AtomicI64, Ordering};
        let states = [Word::new(0)];
        let t = SegmentTable::new(&states);
        let (small, next) = block_classes();
        let shift = BLOCK_TEST_SHIFT;
        t.publish_active(0, small, 128);
        let out = AtomicI64::new(0);
        let (t, out, w0) = (&t, &out, &states[0]);
        let retired = |r| {
            if r == Return::Retired {
                t.publish_active(0, small, 128);
            }
        };
        std::thread::scope(|s| {
            for id in 0..9u32 {
                s.spawn(move || {
                    arch::preempt_every(2);
                    let mut held = 0u32;
                    for step in 0..4000u32 {
                        let want = 1 + (id * 7 + step * 13) % 32;
                        if id == 8 {
                            if let Grab::Missed {
                                gave_back: Some((_, r)),
                            } = t.subtract_blocks(w0, next, want, 64, shift)
                            {
                                retired(r);
                            }
                            continue;
                        }
                        match t.reserve_blocks_add(0, small, want, 128, shift) {
                            Grab::Reserved { count, ticket, .. } => {
                                assert!(ticket + count <= 128);
                                let now = out.fetch_add(count as i64, Ordering::SeqCst);
                                assert!(now + count as i64 <= 128, "{now} + {count} out");
                                held += count;
                            }
                            Grab::Missed {
                                gave_back: Some((_, r)),
                            } => retired(r),
                            Grab::Missed { gave_back: None } => {}
                        }
                        if held > 0 && step % 3 == id % 3 {
                            let back = held.div_ceil(2);
                            out.fetch_sub(back as i64, Ordering::SeqCst);
                            held -= back;
                            retired(t.return_blocks(0, small, back, 128));
                        }
                    }
                    if held > 0 {
                        out.fetch_sub(held as i64, Ordering::SeqCst);
                        retired(t.return_blocks(0, small, held, 128));
                    }
                });
            }
        });
        assert_eq!(out.load(Ordering::SeqCst), 0);
        assert_eq!(
            t.load(0),
            SegmentState::Active {
                class: small,
                free: 128
            }
        );
        assert_eq!(field(&states), 128);
    }
}
