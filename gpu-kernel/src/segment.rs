//! The segment table: one state word per segment saying what the segment is
//! (free, formatted for a class with so many free blocks, or part of a
//! multi-segment run), and the transitions between those states.
//!
//! # State word
//! `kind` (bits 24..28), `class` (bits 16..24), `free` blocks (bits 0..16),
//! and for a run head its length in segments (bits 32..64).
//!
//! # Invariants (owned here)
//! - A segment is in the segment tree only while its kind is `Free`.
//! - For an `Active` segment, `free` never exceeds the number of set bits of
//!   its block bitmap: a freed block's bit is set *before* `free` is
//!   incremented, and a claimed block's bit is cleared *after* `free` was
//!   decremented (a reservation). So a thread holding a reservation always
//!   finds a set bit.
//! - An `Active` segment turns `Free` only by a CAS from the word whose
//!   `free` equals the class's blocks per segment (every block returned, or
//!   none ever reserved: a segment a batch formatted for claimers in flight
//!   that found blocks elsewhere, retired by `retire_idle`), so no
//!   reservation can be outstanding when it does.
//!
//! All transitions of a segment others can reach are acq_rel RMWs on the
//! state word (CASes, and the add that returns blocks: see
//! [`SegmentTable::return_blocks`]). A segment only its formatter holds
//! (claimed from the segment tree, in no class tree yet) is published by a
//! release store, or in a batch by one fence and a relaxed store per
//! segment; readers that only need
//! the class of a live allocation use a relaxed device-scope load (the class
//! cannot change while the allocation is live).

use crate::arch::{self, Word};
use crate::class::SizeClass;

const FREE_MASK: u64 = 0xffff;
const CLASS_SHIFT: u32 = 16;
const KIND_SHIFT: u32 = 24;
const RUN_SHIFT: u32 = 32;
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

impl SegmentState {
    /// Decodes a state word.
    #[inline(always)]
    pub fn decode(word: u64) -> SegmentState {
        match (word >> KIND_SHIFT) & 0xf {
            1 => match SizeClass::new(((word >> CLASS_SHIFT) & 0xff) as u32) {
                Some(class) => SegmentState::Active {
                    class,
                    free: (word & FREE_MASK) as u32,
                },
                None => SegmentState::Free,
            },
            2 => SegmentState::RunHead {
                segments: (word >> RUN_SHIFT) as u32,
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
                1 << KIND_SHIFT | (class.index() as u64) << CLASS_SHIFT | free as u64
            }
            SegmentState::RunHead { segments } => 2 << KIND_SHIFT | (segments as u64) << RUN_SHIFT,
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

    /// Publishes a freshly formatted segment. Release: the bitmap written
    /// before is visible to whoever reserves a block after seeing this.
    #[inline]
    pub fn publish_active(&self, segment: u32, class: SizeClass, free: u32) {
        arch::store_release(
            self.word(segment),
            SegmentState::Active { class, free }.encode(),
        );
    }

    /// Publishes freshly formatted segments `first + k`, one for each bit `k`
    /// of `mask`, each with `free` free blocks but `own`, which has
    /// `own_free`. One fence, then a relaxed store per segment: the fence
    /// followed by a store is a release of every bitmap written before the
    /// fence (a release pattern), so whoever reserves after seeing one of
    /// these words sees its bitmap, as with [`SegmentTable::publish_active`];
    /// a batch pays for one fence instead of one release store per segment.
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
            arch::store_relaxed(
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
    #[inline]
    pub fn reserve_blocks_once(&self, segment: u32, class: SizeClass, want: u32) -> Reservation {
        let w = self.word(segment);
        let current = arch::load_relaxed(w);
        let serves = |word| match SegmentState::decode(word) {
            SegmentState::Active { class: c, free } if c == class && free > 0 => Some(free),
            _ => None,
        };
        let Some(free) = serves(current) else {
            return Reservation::Stale;
        };
        let count = want.clamp(1, free);
        // acq_rel: acquire, to see the bitmap published with the word (or
        // the bits set by the returns counted in it); release, so a return
        // that counts after this reservation is ordered after it.
        match arch::compare_exchange_acq_rel(w, current, current - count as u64) {
            Ok(_) => Reservation::Reserved {
                count,
                last: free == count,
            },
            Err(actual) if serves(actual).is_some() => Reservation::Contended,
            Err(_) => Reservation::Stale,
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
        let old = arch::fetch_add_acq_rel(w, count as u64);
        let free = match SegmentState::decode(old) {
            SegmentState::Active { free, class: c } if c == class && free + count <= total => free,
            // Unreachable while the caller holds blocks of this segment:
            // only a bad free on an unchecked heap whose segment changed
            // hands after `release_block`'s check gets here. Undo the add
            // (acq_rel, as the add); a thread that read the word in
            // between saw a wrong free count, which a CAS loop would have
            // avoided, but only for a program that already freed wrongly.
            _ => {
                arch::fetch_add_acq_rel(w, (count as u64).wrapping_neg());
                return Return::Partial;
            }
        };
        let full = old + count as u64;
        if free + count == total
            && arch::compare_exchange_acq_rel(w, full, retired_word(Previous::Active(class)))
                .is_ok()
        {
            return Return::Retired;
        }
        if free == 0 {
            Return::FirstFree
        } else {
            Return::Partial
        }
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

    /// Marks a claimed run of segments as one allocation.
    #[inline]
    pub fn publish_run(&self, head: u32, segments: u32) {
        for s in head + 1..head + segments {
            arch::store_relaxed(self.word(s), SegmentState::RunTail.encode());
        }
        arch::store_release(self.word(head), SegmentState::RunHead { segments }.encode());
    }

    /// Ends a run: `Some(length)` if this call freed it, `None` if `head` is
    /// not the head of a live run (a double or wild free).
    #[inline]
    pub fn end_run(&self, head: u32) -> Option<u32> {
        let w = self.word(head);
        let current = arch::load_relaxed(w);
        let SegmentState::RunHead { segments } = SegmentState::decode(current) else {
            return None;
        };
        arch::compare_exchange_acq_rel(w, current, retired_word(Previous::RunHead)).ok()?;
        for s in head + 1..head + segments {
            arch::store_relaxed(self.word(s), SegmentState::Free.encode());
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
}
