//! `VebTree`: a set of ids in `0..universe` stored as a 64-ary tree of 64-bit
//! words, the van Emde Boas-style structure Gallatin uses for segments.
//!
//! Level 0 holds one bit per id. A bit of level `l + 1` says that word `b` of
//! level `l` *may* be non-empty. Leaf bits are the truth; upper bits are hints
//! kept conservative: once every operation in flight has finished, a non-empty
//! word always has its parent bit set. A search that follows a stale hint into
//! an empty word just moves past it.
//!
//! # Concurrency
//! Any number of threads may call any operation at once; every word is touched
//! only through `arch` atomics with device scope.
//! - `insert` sets the leaf bit (acq_rel RMW), then walks up setting each parent
//!   bit that an acquire load shows clear.
//! - `remove` clears the leaf bit; if that emptied the word it clears the parent
//!   bit and then *re-reads the child with an RMW* (`fetch_or(0)`). If the child
//!   is non-empty again it re-sets the parent. The re-read must be an RMW: with a
//!   plain load this is the store-buffer pattern (insert: write child, read
//!   parent; remove: write parent, read child) and both sides could miss the
//!   other's write. With the RMW, either the remover's read follows the
//!   inserter's write in the child's modification order (and sees it), or it
//!   precedes it, and then the inserter's acq_rel RMW on the child synchronises
//!   with the remover's and its later parent load sees the cleared bit.
//! - Searches use relaxed device-scope loads (never stale L1 lines) and claim
//!   with an acq_rel `fetch_and`, which is what orders the winner after the
//!   thread that inserted the id.

use crate::arch::{self, Word};

/// Most levels a tree has: 64^4 = 16 M ids.
pub const MAX_LEVELS: usize = 4;

/// The geometry of a tree over `universe` ids; shared by host and device.
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct TreeShape {
    /// Ids are `0..universe`.
    pub universe: u32,
    /// Levels in use (1..=4).
    pub levels: u32,
    /// First word of each level; level 0 holds the leaves.
    pub level_start: [u32; MAX_LEVELS],
    /// Words of level `l` (0 for unused levels).
    pub level_words: [u32; MAX_LEVELS],
    /// Words in the whole tree.
    pub words: u32,
    /// Padding to a multiple of 8 bytes.
    pub _pad: u32,
}

impl TreeShape {
    /// The shape of a tree over `universe` ids (`1..=64^4`).
    pub const fn new(universe: u32) -> TreeShape {
        assert!(universe >= 1 && (universe as u64) <= 1 << (6 * MAX_LEVELS));
        let mut level_start = [0u32; MAX_LEVELS];
        let mut level_words = [0u32; MAX_LEVELS];
        let mut count = universe.div_ceil(64);
        let mut start = 0;
        let mut levels = 0;
        loop {
            level_start[levels] = start;
            level_words[levels] = count;
            start += count;
            levels += 1;
            if count == 1 {
                break;
            }
            count = count.div_ceil(64);
        }
        TreeShape {
            universe,
            levels: levels as u32,
            level_start,
            level_words,
            words: start,
            _pad: 0,
        }
    }

    /// The words of a tree holding every id of the universe.
    pub fn full_image(&self, out: &mut [u64]) {
        self.prefix_image(self.universe, out);
    }

    /// The words of a tree holding the ids `0..count` (`count <= universe`).
    pub fn prefix_image(&self, count: u32, out: &mut [u64]) {
        assert!(out.len() >= self.words as usize && count <= self.universe);
        // Set bits at each level: `count` leaves, then one per non-empty word.
        let mut bits = count as u64;
        for l in 0..self.levels as usize {
            for w in 0..self.level_words[l] as u64 {
                let n = bits.saturating_sub(w * 64).min(64);
                out[(self.level_start[l] as u64 + w) as usize] =
                    if n == 64 { u64::MAX } else { (1u64 << n) - 1 };
            }
            bits = bits.div_ceil(64);
        }
    }
}

/// A tree over words the caller owns.
#[derive(Clone, Copy)]
pub struct VebTree<'a> {
    words: &'a [Word],
    shape: &'a TreeShape,
}

#[inline(always)]
fn bit(i: u32) -> u64 {
    1u64 << (i & 63)
}

/// The bits of ids `from..to` within their leaf word (`from < to`, both in
/// the word of `from`, `to` at most its end).
#[inline]
fn word_mask(from: u32, to: u32) -> u64 {
    let n = to - from;
    let low = if n >= 64 { !0 } else { (1u64 << n) - 1 };
    low << (from & 63)
}

/// The lowest `count` set bits of `x` (all of them if it has fewer).
#[inline(always)]
fn lowest_bits(mut x: u64, count: u32) -> u64 {
    let mut out = 0;
    for _ in 0..count {
        out |= x & x.wrapping_neg();
        x &= x.wrapping_sub(1);
    }
    out
}

/// What [`VebTree::claim_high_in_lowest_word`] aims at in a word showing
/// `seen`: its highest `count` ids, or after a lost race (`lost`) those
/// below zero to three claims' width of them (the near spread of
/// [`skip_claims`], mirrored; the highest if that would leave none). The
/// low aims on the word's ids in reverse order.
#[inline(always)]
fn aim_from_top(seen: u64, count: u32, salt: u32, lost: bool) -> u64 {
    let reversed = seen.reverse_bits();
    let spread = if lost {
        skip_claims(reversed, count, salt)
    } else {
        reversed
    };
    lowest_bits(spread, count).reverse_bits()
}

/// The lowest run of `count` (at least 1) adjacent set bits of `x`, or 0
/// if it has none.
#[inline(always)]
fn lowest_run(x: u64, count: u32) -> u64 {
    let mut starts = x;
    for i in 1..count {
        starts &= x >> i;
    }
    if starts == 0 {
        0
    } else {
        (u64::MAX >> (64 - count)) << starts.trailing_zeros()
    }
}

/// Draws [`VebTree::pick_wide`]'s salt within a leaf word from its salt
/// for the word (an odd multiplier: a bijection of `u32`, so distinct
/// salts stay distinct, and 0 stays 0).
const WITHIN_WORD_HASH: u32 = 0x85eb_ca6b;

/// `x` (not 0) without as many of its lowest set bits as `salt` picks: the
/// fraction `salt / 2^32` of them, scaled by the salt's high bits (no
/// division); none for salt 0, never all.
#[inline(always)]
fn skip_by_salt(x: u64, salt: u32) -> u64 {
    skip_lowest(x, ((salt as u64 * x.count_ones() as u64) >> 32) as u32)
}

/// `x` (not 0) without its lowest `(salt >> 30) * count` set bits: a
/// retry aimed zero to three claims' width above the lowest ids, or at the
/// lowest if that would leave none.
#[inline(always)]
fn skip_claims(x: u64, count: u32, salt: u32) -> u64 {
    let rest = skip_lowest(x, (salt >> 30) * count);
    if rest == 0 { x } else { rest }
}

/// `x` without its lowest `n` set bits (0 if it has no more than `n`).
#[inline(always)]
pub(crate) fn skip_lowest(mut x: u64, n: u32) -> u64 {
    for _ in 0..n {
        x &= x.wrapping_sub(1);
    }
    x
}

impl<'a> VebTree<'a> {
    /// A view of `words` (at least `shape.words` long) as a tree.
    #[inline(always)]
    pub fn new(words: &'a [Word], shape: &'a TreeShape) -> VebTree<'a> {
        debug_assert!(words.len() >= shape.words as usize);
        VebTree { words, shape }
    }

    /// The number of ids.
    #[inline(always)]
    pub fn universe(&self) -> u32 {
        self.shape.universe
    }

    /// Word `index` of `level`.
    #[inline(always)]
    fn word(&self, level: u32, index: u32) -> &'a Word {
        let at = self.shape.level_start[level as usize] + index;
        // SAFETY: callers pass index < level_words[level]; the slice holds
        // every word of the shape (checked in `new` in debug builds).
        unsafe { self.words.get_unchecked(at as usize) }
    }

    /// Whether `i` is in the set (a snapshot).
    pub fn contains(&self, i: u32) -> bool {
        arch::load_relaxed(self.word(0, i >> 6)) & bit(i) != 0
    }

    /// Adds `i`. Idempotent.
    #[inline]
    pub fn insert(&self, i: u32) {
        arch::fetch_or_acq_rel(self.word(0, i >> 6), bit(i));
        self.mark_up_from(1, i >> 6);
    }

    /// Sets the hint bit `b` at `level` and above, stopping at a bit that is
    /// already set (its ancestors are then set or being set).
    #[inline]
    fn mark_up_from(&self, level: u32, mut b: u32) {
        let mut l = level;
        while l < self.shape.levels {
            let w = self.word(l, b >> 6);
            if arch::load_acquire(w) & bit(b) != 0 {
                return;
            }
            arch::fetch_or_acq_rel(w, bit(b));
            b >>= 6;
            l += 1;
        }
    }

    /// Removes `i`; returns whether this call removed it (false if it was
    /// absent or another thread removed it first).
    #[inline]
    pub fn remove(&self, i: u32) -> bool {
        let old = arch::fetch_and_acq_rel(self.word(0, i >> 6), !bit(i));
        if old & bit(i) == 0 {
            return false;
        }
        if old & !bit(i) == 0 {
            self.unmark_up_from(1, i >> 6);
        }
        true
    }

    /// Clears hint bit `b` at `level` (its child word was seen empty), then
    /// re-checks the child and repairs the hint if it filled again.
    fn unmark_up_from(&self, level: u32, mut b: u32) {
        let mut l = level;
        while l < self.shape.levels {
            let w = self.word(l, b >> 6);
            let old = arch::fetch_and_acq_rel(w, !bit(b));
            // An RMW, not a load: see the module docs.
            if arch::fetch_or_acq_rel(self.word(l - 1, b), 0) != 0 {
                self.mark_up_from(l, b);
                return;
            }
            if old & !bit(b) != 0 {
                return;
            }
            b >>= 6;
            l += 1;
        }
    }

    /// The lowest id `>= from` in the set, if any (a snapshot).
    pub fn successor(&self, from: u32) -> Option<u32> {
        self.successor_with_leaf(from).map(|(id, _)| id)
    }

    /// An id at or after `from`, chosen by `salt` among the ids of the
    /// first non-empty leaf word at or after `from` (those at or after
    /// `from`), with how many it was chosen from (a snapshot). Salt 0 picks
    /// the lowest, as [`VebTree::successor`]; salts spread evenly over
    /// `u32` spread racing callers evenly over the word's ids (64 at most),
    /// each a different one while they are fewer than the ids.
    #[inline]
    pub fn pick(&self, from: u32, salt: u32) -> Option<(u32, u32)> {
        let (id, leaf) = self.successor_with_leaf(from)?;
        let ids = leaf & (u64::MAX << (id & 63));
        let picked = skip_by_salt(ids, salt).trailing_zeros();
        Some(((id & !63) | picked, ids.count_ones()))
    }

    /// [`VebTree::pick`] over more than one leaf word: the leaf word is
    /// itself chosen by `salt` among those that the level-1 word above the
    /// first non-empty one marks (at or after it: up to 64 leaf words,
    /// 4,096 ids), then the id among that word's ids by a second salt drawn
    /// from `salt`. What racing claimers use when the ids they want span
    /// several leaf words (a format batch of more than 64 segments): with
    /// `pick` they would all search the lowest word until it ran empty, then
    /// the next. Salt 0 picks the lowest id, as `pick`. A level-1 bit is a
    /// hint: a chosen word found empty falls back to the first non-empty
    /// one. Returns the id and how many ids its leaf word offered.
    #[inline]
    pub fn pick_wide(&self, from: u32, salt: u32) -> Option<(u32, u32)> {
        let (id, mut leaf) = self.successor_with_leaf(from)?;
        let mut index = id >> 6;
        leaf &= u64::MAX << (id & 63);
        if self.shape.levels > 1 && salt != 0 {
            let above = arch::load_relaxed(self.word(1, index >> 6)) & (u64::MAX << (index & 63));
            let chosen = (index & !63) | skip_by_salt(above | bit(index), salt).trailing_zeros();
            if chosen != index && chosen < self.shape.level_words[0] {
                let other = arch::load_relaxed(self.word(0, chosen));
                if other != 0 {
                    index = chosen;
                    leaf = other;
                }
            }
        }
        let within = salt.wrapping_mul(WITHIN_WORD_HASH);
        let picked = skip_by_salt(leaf, within).trailing_zeros();
        Some((index << 6 | picked, leaf.count_ones()))
    }

    /// [`VebTree::successor`], with the value its search read from the id's
    /// leaf word (bits below the id may be cleared).
    #[inline]
    fn successor_with_leaf(&self, from: u32) -> Option<(u32, u64)> {
        let mut x = from;
        'search: loop {
            if x >= self.shape.universe {
                return None;
            }
            // Climb until a word shows a set bit at or after our position.
            let mut l = 0;
            let mut b = x;
            let mut leaf: u64;
            loop {
                let masked = arch::load_relaxed(self.word(l, b >> 6)) & (u64::MAX << (b & 63));
                if masked != 0 {
                    b = (b & !63) | masked.trailing_zeros();
                    leaf = masked;
                    break;
                }
                l += 1;
                if l == self.shape.levels {
                    return None;
                }
                b = (b >> 6) + 1;
                if b >= self.shape.level_words[l as usize - 1] {
                    return None;
                }
            }
            // Descend along the lowest set bits.
            while l > 0 {
                l -= 1;
                let w = arch::load_relaxed(self.word(l, b));
                if w == 0 {
                    // A stale hint: skip the subtree under word `b` of level `l`.
                    x = (b + 1) << (6 * (l + 1));
                    continue 'search;
                }
                b = b * 64 + w.trailing_zeros();
                leaf = w;
            }
            if b < from {
                x = from;
                continue;
            }
            return (b < self.shape.universe).then_some((b, leaf));
        }
    }

    /// Removes and returns the lowest id, retrying when another thread takes
    /// the one found first. `None` when the set is empty.
    #[inline]
    pub fn claim_lowest(&self) -> Option<u32> {
        self.claim_lowest_many(1)
            .map(|(first, taken)| first + taken.trailing_zeros())
    }

    /// Removes up to `count` (1..=64) of the lowest ids with one RMW on one
    /// leaf word: the lowest `count` ids of the lowest non-empty word.
    /// Returns the word's first id and the mask of the ids this call removed
    /// (bit `k`: id `first + k`; at least one). `None` when the set is empty.
    ///
    /// Racing claimers all aim at the same lowest ids. A claimer that lost
    /// every id it aimed at tries again at once on what the `fetch_and`
    /// returned, the word's ids after the winner's claim, instead of searching
    /// the tree again: under contention each retry costs one round trip to
    /// the word, not a walk down the tree.
    #[inline]
    pub fn claim_lowest_many(&self, count: u32) -> Option<(u32, u64)> {
        self.claim_low_many(count, 0)
    }

    /// [`VebTree::claim_lowest_many`], except that a claimer that lost a
    /// race aims next at the ids `salt` picks among those the word still
    /// has, not at its lowest: claimers with different
    /// salts then aim at different ids, and a burst of `n` of them on one
    /// word no longer takes `n` round trips, one winner each. The first
    /// aim is still the lowest ids, so without a race ids go lowest first.
    /// Salt 0 is `claim_lowest_many`.
    #[inline]
    pub fn claim_low_many(&self, count: u32, salt: u32) -> Option<(u32, u64)> {
        self.claim_low_many_aiming(count, salt, false, false)
    }

    /// [`VebTree::claim_low_many`] whose lost race aims zero to three
    /// claims' width (`count` ids each, by the salt's top two bits) above
    /// the word's lowest ids, not anywhere in the word: a burst's claimers
    /// still spread, and the holes they leave lie where the next first
    /// tries (lowest ids) fill them.
    #[inline]
    pub fn claim_low_many_near(&self, count: u32, salt: u32) -> Option<(u32, u64)> {
        self.claim_low_many_aiming(count, salt, true, false)
    }

    /// [`VebTree::claim_low_many_near`] whose first aim is the word's
    /// lowest run of `count` adjacent ids, where it has one (its lowest
    /// ids otherwise): a caller that makes one range of adjacent ids (a
    /// slot run of whole segments) gets it where the lowest ids are
    /// scattered by others' claims and returns.
    #[inline]
    pub fn claim_adjacent_many_near(&self, count: u32, salt: u32) -> Option<(u32, u64)> {
        self.claim_low_many_aiming(count, salt, true, true)
    }

    /// Removes up to `count` (1..=64) of the *highest* ids of the lowest
    /// non-empty leaf word, with one RMW on it; a claimer that lost a race
    /// aims zero to three claims' width below the highest ids left (by the
    /// salt's top two bits, as [`VebTree::claim_low_many_near`] does above
    /// the lowest). Returns as [`VebTree::claim_lowest_many`]. Callers that
    /// take one id at a time from the top of the word stay apart from those
    /// that take runs of adjacent ids from its bottom, so they do not cut
    /// those runs, while both still fill the lowest word first.
    #[inline]
    pub fn claim_high_in_lowest_word(&self, count: u32, salt: u32) -> Option<(u32, u64)> {
        self.claim_in_lowest_word(|seen, lost| aim_from_top(seen, count, salt, lost))
    }

    #[inline(always)]
    fn claim_low_many_aiming(
        &self,
        count: u32,
        salt: u32,
        near: bool,
        adjacent: bool,
    ) -> Option<(u32, u64)> {
        self.claim_in_lowest_word(|seen, lost| {
            let spread = if !lost {
                seen
            } else if near {
                skip_claims(seen, count, salt)
            } else {
                skip_by_salt(seen, salt)
            };
            let run = if adjacent && !lost {
                lowest_run(seen, count)
            } else {
                0
            };
            if run != 0 {
                run
            } else {
                lowest_bits(spread, count)
            }
        })
    }

    /// Removes from the lowest non-empty leaf word the ids that
    /// `aim(seen, lost)` picks among those it shows (`seen`; `lost` after a
    /// race lost on this word), with one RMW each try; a claimer that lost
    /// tries again on what its RMW returned, without searching the tree,
    /// until the word runs empty. Returns the word's first id and the mask
    /// of the ids taken (at least one); `None` when the set is empty.
    #[inline(always)]
    fn claim_in_lowest_word(&self, aim: impl Fn(u64, bool) -> u64) -> Option<(u32, u64)> {
        loop {
            let (id, mut seen) = self.successor_with_leaf(0)?;
            let index = id >> 6;
            let word = self.word(0, index);
            let mut lost = false;
            loop {
                let aim = aim(seen, lost);
                if aim == 0 {
                    // The word ran empty: search the tree again.
                    break;
                }
                // acq_rel, as in `remove`: orders this claimer after the
                // thread that inserted the ids it takes.
                let old = arch::fetch_and_acq_rel(word, !aim);
                let taken = old & aim;
                if taken != 0 {
                    if old & !aim == 0 {
                        // This call emptied the word.
                        self.unmark_up_from(1, index);
                    }
                    return Some((index << 6, taken));
                }
                seen = old;
                lost = true;
            }
        }
    }

    /// Removes a run of `count` consecutive ids, searching from the top so
    /// that runs and single ids (taken from the bottom by `claim_lowest`)
    /// stay apart. Returns the first id of the run.
    ///
    /// Never hands out an id twice, whoever runs at once. Runs pack without
    /// gaps only if callers serialise their claims from the top (the heap's
    /// run lock): a concurrent run search that sees part of a run taken
    /// settles lower, even if the part is given back later. When a removal
    /// fails (a claim from the bottom got there first, or an unserialised
    /// caller), the ids taken are given back and the search starts over
    /// from the top, where ids may have been freed since the last look.
    pub fn claim_run_from_top(&self, count: u32) -> Option<u32> {
        self.claim_run_below(self.shape.universe, count)
    }

    /// [`VebTree::claim_run_from_top`] with a run that ends at or before
    /// `end`: the heap passes the start of its last run, below which the
    /// next one most likely fits, so the search does not walk down past
    /// every run already taken (256 runs of 16 segments each used to scan
    /// 64 words apiece).
    pub fn claim_run_below(&self, end: u32, count: u32) -> Option<u32> {
        if count == 0 || count > self.shape.universe {
            return None;
        }
        let end = end.min(self.shape.universe);
        loop {
            let start = self.find_run_below(end, count)?;
            if self.try_remove_range(start, count) {
                return Some(start);
            }
        }
    }

    /// Removes ids `start..start + count` (all below the universe), one
    /// RMW per word (not per id): true if this call removed them all;
    /// otherwise the ones it removed are put back (acq_rel RMWs, before
    /// this returns) and nothing changed for good.
    pub fn try_remove_range(&self, start: u32, count: u32) -> bool {
        let end = start + count;
        let mut i = start;
        while i < end {
            let w = i >> 6;
            let next = end.min((w + 1) << 6);
            let mask = word_mask(i, next);
            // Acq_rel as `remove`: the winner of each id sees the frees
            // before its insert, and its own later writes stay after.
            let old = arch::fetch_and_acq_rel(self.word(0, w), !mask);
            let got = old & mask;
            if got != 0 && old & !mask == 0 {
                self.unmark_up_from(1, w);
            }
            if got != mask {
                self.insert_mask(w, got);
                self.release_run(start, i - start);
                return false;
            }
            i = next;
        }
        true
    }

    /// Inserts the ids `first + k` for each bit `k` of `mask` (`first` a
    /// multiple of 64: the ids of one leaf word) with one RMW on the leaf,
    /// as [`VebTree::claim_lowest_many`] removes them.
    #[inline]
    pub fn insert_many(&self, first: u32, mask: u64) {
        debug_assert!(first.is_multiple_of(64));
        self.insert_mask(first >> 6, mask);
    }

    /// Inserts the ids of `mask` in leaf word `w` with one RMW.
    fn insert_mask(&self, w: u32, mask: u64) {
        if mask != 0 {
            arch::fetch_or_acq_rel(self.word(0, w), mask);
            self.mark_up_from(1, w);
        }
    }

    /// The start of the highest run of `count` set ids that ends at or
    /// before `end` (a snapshot).
    fn find_run_below(&self, end: u32, count: u32) -> Option<u32> {
        let mut run = 0;
        let mut i = end;
        let mut cached_index = u32::MAX;
        let mut cached = 0u64;
        while i > 0 {
            i -= 1;
            if i >> 6 != cached_index {
                cached_index = i >> 6;
                cached = arch::load_relaxed(self.word(0, cached_index));
                if cached == 0 {
                    run = 0;
                    i &= !63;
                    continue;
                }
            }
            if cached & bit(i) != 0 {
                run += 1;
                if run == count {
                    return Some(i);
                }
            } else {
                run = 0;
            }
        }
        None
    }

    /// Inserts the ids `start..start + count`, one RMW per word.
    pub fn release_run(&self, start: u32, count: u32) {
        let end = start + count;
        let mut i = start;
        while i < end {
            let w = i >> 6;
            let next = end.min((w + 1) << 6);
            self.insert_mask(w, word_mask(i, next));
            i = next;
        }
    }

    /// The number of ids in the set (a snapshot; host-side checks).
    pub fn count(&self) -> u32 {
        (0..self.shape.level_words[0])
            .map(|w| arch::load_relaxed(self.word(0, w)).count_ones())
            .sum()
    }
}

#[cfg(all(test, not(loom)))]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    fn words(n: u32) -> Vec<Word> {
        (0..n).map(|_| Word::new(0)).collect()
    }

    #[test]
    fn lowest_run_finds_adjacent_bits() {
        assert_eq!(lowest_run(0b1011_0111, 3), 0b0000_0111);
        assert_eq!(lowest_run(0b1110_1101, 3), 0b1110_0000);
        assert_eq!(lowest_run(0b0101_0101, 2), 0);
        assert_eq!(lowest_run(0b0101_0100, 1), 0b0100);
        assert_eq!(lowest_run(u64::MAX, 64), u64::MAX);
        assert_eq!(lowest_run(u64::MAX << 60, 4), u64::MAX << 60);
        assert_eq!(lowest_run(u64::MAX << 61, 4), 0);
    }

    /// A claim of four ids aims at the lowest four adjacent free ids of the
    /// word, past scattered lower ones; without such a run it takes the
    /// lowest four.
    #[test]
    fn an_adjacent_claim_skips_scattered_ids() {
        let shape = TreeShape::new(128);
        let w = words(shape.words);
        let t = VebTree::new(&w, &shape);
        for id in [1u32, 3, 5, 8, 9, 10, 11, 12, 70] {
            t.insert(id);
        }
        assert_eq!(t.claim_adjacent_many_near(4, 0), Some((0, 0b1111 << 8)));
        assert_eq!(
            t.claim_adjacent_many_near(4, 0),
            Some((0, 1 << 1 | 1 << 3 | 1 << 5 | 1 << 12))
        );
    }

    #[test]
    fn shape_levels() {
        assert_eq!(TreeShape::new(1).levels, 1);
        assert_eq!(TreeShape::new(64).levels, 1);
        assert_eq!(TreeShape::new(65).levels, 2);
        assert_eq!(TreeShape::new(4096).levels, 2);
        assert_eq!(TreeShape::new(4097).levels, 3);
        assert_eq!(TreeShape::new(4097).words, 65 + 2 + 1);
    }

    #[test]
    fn insert_remove_successor_against_a_model() {
        for universe in [1u32, 63, 64, 65, 200, 4096, 5000, 300_000] {
            let shape = TreeShape::new(universe);
            let w = words(shape.words);
            let t = VebTree::new(&w, &shape);
            let mut model = std::collections::BTreeSet::new();
            let mut seed = 0x9e37_79b9_7f4a_7c15u64 ^ universe as u64;
            for _ in 0..4000 {
                seed ^= seed << 13;
                seed ^= seed >> 7;
                seed ^= seed << 17;
                let i = (seed % universe as u64) as u32;
                match seed >> 62 {
                    0 | 1 => {
                        t.insert(i);
                        model.insert(i);
                    }
                    2 => assert_eq!(t.remove(i), model.remove(&i)),
                    _ => assert_eq!(t.successor(i), model.range(i..).next().copied()),
                }
            }
            assert_eq!(t.count() as usize, model.len());
            assert_eq!(t.successor(0), model.iter().next().copied());
        }
    }

    /// The first aim is the highest ids; a lost race's aims lie zero to
    /// three claims' width below them, or at the highest if that leaves none.
    #[test]
    fn aim_from_top_stays_near_the_highest_ids() {
        let all = u64::MAX;
        assert_eq!(aim_from_top(all, 1, 3 << 30, false), 1 << 63);
        assert_eq!(aim_from_top(all, 1, 0, true), 1 << 63);
        assert_eq!(aim_from_top(all, 1, 3 << 30, true), 1 << 60);
        assert_eq!(aim_from_top(all, 2, 1 << 30, true), 0b11 << 60);
        assert_eq!(aim_from_top(0b1011, 2, 3 << 30, true), 0b1010, "none left");
        assert_eq!(
            aim_from_top(0b1011, 4, 0, false),
            0b1011,
            "fewer than asked"
        );
    }

    #[test]
    fn claim_high_in_lowest_word_takes_the_top_of_the_lowest_word() {
        let shape = TreeShape::new(200);
        let w = words(shape.words);
        let t = VebTree::new(&w, &shape);
        for i in [3, 5, 40, 63, 64, 130] {
            t.insert(i);
        }
        // The lowest word (ids 0..64) first, from its top.
        assert_eq!(t.claim_high_in_lowest_word(1, 0), Some((0, 1 << 63)));
        assert_eq!(
            t.claim_high_in_lowest_word(2, 0),
            Some((0, 1 << 40 | 1 << 5))
        );
        assert_eq!(t.claim_high_in_lowest_word(4, 0), Some((0, 1 << 3)));
        // That word is empty now: the next one, then the last.
        assert_eq!(t.claim_high_in_lowest_word(1, 0), Some((64, 1)));
        assert_eq!(t.claim_high_in_lowest_word(1, 0), Some((128, 1 << 2)));
        assert_eq!(t.claim_high_in_lowest_word(1, 0), None);
        assert_eq!(t.count(), 0);
    }

    #[test]
    fn full_image_claims_every_id_in_order() {
        let shape = TreeShape::new(4200);
        let mut image = std::vec![0u64; shape.words as usize];
        shape.full_image(&mut image);
        let w: Vec<Word> = image.iter().map(|&v| Word::new(v)).collect();
        let t = VebTree::new(&w, &shape);
        for i in 0..4200 {
            assert_eq!(t.claim_lowest(), Some(i));
        }
        assert_eq!(t.claim_lowest(), None);
    }

    #[test]
    fn claim_lowest_many_takes_the_lowest_ids_of_one_word() {
        let shape = TreeShape::new(200);
        let w = words(shape.words);
        let t = VebTree::new(&w, &shape);
        for i in [3u32, 5, 9, 60, 64, 70, 199] {
            t.insert(i);
        }
        // The lowest word's four lowest ids.
        assert_eq!(
            t.claim_lowest_many(4),
            Some((0, 1 << 3 | 1 << 5 | 1 << 9 | 1 << 60))
        );
        // Fewer than asked for when the word has fewer; never across words.
        assert_eq!(t.claim_lowest_many(4), Some((64, 1 << 0 | 1 << 6)));
        assert_eq!(t.successor(0), Some(199));
        assert_eq!(t.claim_lowest_many(64), Some((192, 1 << 7)));
        assert_eq!(t.claim_lowest_many(1), None);
        assert_eq!(t.count(), 0);
        // The emptied words' hints were cleared: an insert is found again.
        t.insert(100);
        assert_eq!(t.claim_lowest(), Some(100));
    }

    /// A near retry skips 0 to 3 claims' width of the lowest ids by the
    /// salt's top bits, and falls back to the lowest when that leaves none.
    #[test]
    fn skip_claims_stays_near_the_lowest_ids() {
        let all = u64::MAX;
        assert_eq!(skip_claims(all, 4, 0), all);
        assert_eq!(skip_claims(all, 4, 1 << 30), all << 4);
        assert_eq!(skip_claims(all, 4, 3 << 30), all << 12);
        assert_eq!(skip_claims(0b1011, 2, 3 << 30), 0b1011, "none left");
        assert_eq!(skip_claims(0b1011_0000, 1, 2 << 30), 0b1000_0000);
    }

    /// `pick_wide` chooses the leaf word by its salt among the non-empty
    /// words at or after the first one (under one level-1 word), then the id
    /// in it; salt 0 is the lowest id, and a word whose hint is stale (set
    /// above, empty below) falls back to the first word.
    #[test]
    fn pick_wide_spreads_over_several_words() {
        let shape = TreeShape::new(64 * 64 * 2);
        let w = words(shape.words);
        let t = VebTree::new(&w, &shape);
        t.insert_many(64, 1 << 3 | 1 << 7);
        t.insert_many(128, 1 << 5);
        t.insert_many(256, 1 << 2 | 1 << 60);
        t.insert(5000);
        assert_eq!(t.pick_wide(0, 0), Some((67, 2)));
        let mut words_seen: Vec<u32> = (0..64u32)
            .map(|k| t.pick_wide(0, k << 26 | 1).unwrap().0 >> 6)
            .collect();
        words_seen.sort_unstable();
        words_seen.dedup();
        // Leaf words 1, 2 and 4; never 5000's, under the next level-1 word.
        assert_eq!(words_seen, [1, 2, 4]);
        // From beyond the first word: only the words at or after it.
        assert!((0..64u32).all(|k| t.pick_wide(134, k << 26 | 1).unwrap().0 >= 256));
        // A stale hint: word 2 emptied without clearing its parent bit.
        arch::fetch_and_acq_rel(&w[shape.level_start[0] as usize + 2], 0);
        assert!((0..64u32).all(|k| t.pick_wide(0, k << 26 | 1).unwrap().0 >> 6 != 2));
    }

    #[test]
    fn pick_spreads_over_one_word_and_salt_zero_is_the_lowest() {
        let shape = TreeShape::new(200);
        let w = words(shape.words);
        let t = VebTree::new(&w, &shape);
        t.insert_many(64, 1 << 1 | 1 << 4 | 1 << 9 | 1 << 33);
        t.insert(150);
        assert_eq!(t.pick(0, 0), Some((65, 4)));
        // Each quarter of the salts picks its own id of the word.
        let picked: Vec<u32> = (0..4u32)
            .map(|q| t.pick(0, q << 30 | 7).unwrap().0)
            .collect();
        assert_eq!(picked, [65, 68, 73, 97]);
        // Only the ids at or after `from`; then the next word.
        assert_eq!(t.pick(70, u32::MAX), Some((97, 2)));
        assert_eq!(t.pick(98, u32::MAX), Some((150, 1)));
        assert_eq!(t.pick(151, 0), None);
        assert_eq!(t.count(), 5);
    }

    #[test]
    fn prefix_image_holds_exactly_the_prefix() {
        for (universe, count) in [
            (300u32, 0u32),
            (300, 1),
            (300, 64),
            (300, 65),
            (5000, 4097),
            (5000, 5000),
        ] {
            let shape = TreeShape::new(universe);
            let mut image = std::vec![0u64; shape.words as usize];
            shape.prefix_image(count, &mut image);
            let w: Vec<Word> = image.iter().map(|&v| Word::new(v)).collect();
            let t = VebTree::new(&w, &shape);
            assert_eq!(t.count(), count);
            assert_eq!(t.successor(0), (count > 0).then_some(0));
            if count > 0 {
                assert_eq!(t.successor(count - 1), Some(count - 1));
            }
            assert_eq!(t.successor(count), None);
        }
    }

    #[test]
    fn runs_from_the_top() {
        let shape = TreeShape::new(300);
        let w = words(shape.words);
        let t = VebTree::new(&w, &shape);
        t.release_run(0, 300);
        t.remove(297);
        assert_eq!(t.claim_run_from_top(3), Some(294));
        assert_eq!(t.claim_run_from_top(2), Some(298));
        assert_eq!(t.claim_run_from_top(300), None);
        assert_eq!(t.count(), 300 - 6);
        t.release_run(294, 3);
        assert_eq!(t.claim_run_from_top(297), Some(0));
        assert_eq!(t.count(), 0);
    }

    #[test]
    fn salted_claims_take_each_id_once() {
        salted_threads_take_each_id_once(|t, count, salt| t.claim_low_many(count, salt));
    }

    /// The same for retries aimed near the lowest ids: four threads whose
    /// salts' top bits differ (skips of 0 to 3 claims' width).
    #[test]
    fn near_claims_take_each_id_once() {
        salted_threads_take_each_id_once(|t, count, salt| t.claim_low_many_near(count, salt));
    }

    /// Four threads claim 1 or 2 ids at a time with their own salts until
    /// the tree is empty: every id is taken exactly once.
    fn salted_threads_take_each_id_once(claim: fn(&VebTree<'_>, u32, u32) -> Option<(u32, u64)>) {
        let shape = TreeShape::new(1000);
        let mut image = std::vec![0u64; shape.words as usize];
        shape.full_image(&mut image);
        let w: Vec<Word> = image.iter().map(|&v| Word::new(v)).collect();
        let t = VebTree::new(&w, &shape);
        // Without a race the salt changes nothing: the lowest ids first.
        assert_eq!(claim(&t, 3, 0x8000_0000), Some((0, 0b111)));
        let taken: Vec<Vec<u32>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4u32)
                .map(|k| {
                    let t = &t;
                    s.spawn(move || {
                        crate::arch::preempt_every(2);
                        let salt = k.wrapping_mul(0x9e37_79b9);
                        let mut mine = Vec::new();
                        while let Some((first, mut ids)) = claim(t, 1 + k % 2, salt) {
                            while ids != 0 {
                                mine.push(first + ids.trailing_zeros());
                                ids &= ids - 1;
                            }
                        }
                        mine
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<u32> = taken.into_iter().flatten().collect();
        all.sort();
        assert_eq!(all, (3..1000).collect::<Vec<_>>());
    }

    #[test]
    fn threads_claim_each_id_once() {
        let shape = TreeShape::new(10_000);
        let mut image = std::vec![0u64; shape.words as usize];
        shape.full_image(&mut image);
        let w: Vec<Word> = image.iter().map(|&v| Word::new(v)).collect();
        let t = VebTree::new(&w, &shape);
        let taken: Vec<Vec<u32>> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..4)
                .map(|_| {
                    s.spawn(|| {
                        let mut mine = Vec::new();
                        // Claim, give back a third, claim again: churn.
                        while let Some(i) = t.claim_lowest() {
                            if i % 3 == 0 && mine.len() % 2 == 0 {
                                t.insert(i);
                                mine.push(u32::MAX);
                            } else {
                                mine.push(i);
                            }
                        }
                        mine.retain(|&i| i != u32::MAX);
                        mine
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap()).collect()
        });
        let mut all: Vec<u32> = taken.into_iter().flatten().collect();
        all.sort();
        assert_eq!(all, (0..10_000).collect::<Vec<_>>());
        assert_eq!(t.successor(0), None);
    }
}
