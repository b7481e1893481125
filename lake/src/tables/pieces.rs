//! Pieces: which stitched slots map which home slots, by stretches. This
//! file owns that description of a stitched view; `tables.rs` keeps it
//! with each view and reads through it.
//!
//! A [`Piece`] is a maximal stretch of a stitched view whose slots map
//! consecutive slots of one home view. A stitched view is made of whole
//! home runs laid back to back (`Lake::stitch`), so it has a few pieces
//! however many chunks it maps (a patch or an extension adds a few). Two
//! things follow, both at a cost per piece instead of per chunk:
//! - a stitched window's chunks are used or freed by updating the runs of
//!   its pieces' home slots ([`homes_of`]);
//! - a stitched view's free runs are its pieces' shares of their home
//!   views' runs (`Tables::stitched_runs`), so they need not be stored
//!   and kept up to date by every alloc and free of a chunk the view maps.
//!
//! Before (the profile of issue 13's periodic trace), each alloc and free
//! visited every chunk of its window (~70) and each of its mappings (~140)
//! to update ~4 stretches of runs, half of all samples.
//!
//! Pieces are derived from the view's slots and the chunks' homes, and
//! rebuilt whenever a stitched view is made, patched or extended (each of
//! which makes driver calls that cost far more); `Tables::check`
//! recomputes them from scratch.
//!
//! Concurrency: plain data inside the lake's state mutex.

use super::ViewId;

/// Stitched slots `[at, at + len)` of a view map home slots
/// `[home_at, home_at + len)` of home view `home`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    /// First stitched slot.
    pub at: usize,
    /// The home view.
    pub home: ViewId,
    /// First home slot.
    pub home_at: usize,
    /// Slots.
    pub len: usize,
}

/// The pieces of a stitched view whose slots' chunks live at `homes`
/// (home view and slot of each slot, in slot order).
pub fn pieces_of(homes: impl IntoIterator<Item = (ViewId, usize)>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::new();
    for (i, (home, slot)) in homes.into_iter().enumerate() {
        match out.last_mut() {
            Some(p) if p.home == home && p.home_at + p.len == slot => p.len += 1,
            _ => out.push(Piece {
                at: i,
                home,
                home_at: slot,
                len: 1,
            }),
        }
    }
    out
}

/// The home stretches behind stitched slots `[a, b)` of a view with
/// `pieces` (sorted by `at`, as [`pieces_of`] makes them), as (home view,
/// first home slot, slots), in slot order.
pub fn homes_of(
    pieces: &[Piece],
    a: usize,
    b: usize,
) -> impl Iterator<Item = (ViewId, usize, usize)> + '_ {
    let first = pieces.partition_point(|p| p.at + p.len <= a);
    pieces[first..]
        .iter()
        .take_while(move |p| p.at < b)
        .map(move |p| {
            let lo = a.max(p.at);
            let hi = b.min(p.at + p.len);
            (p.home, p.home_at + (lo - p.at), hi - lo)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_follow_consecutive_home_slots() {
        // Home view 1 slots 10..13, then home view 1 slot 20, then home
        // view 2 slots 21..23 (the same slot numbers in another view do
        // not continue a piece).
        let homes = [(1, 10), (1, 11), (1, 12), (1, 20), (2, 21), (2, 22)];
        let p = pieces_of(homes);
        assert_eq!(
            p,
            [
                Piece {
                    at: 0,
                    home: 1,
                    home_at: 10,
                    len: 3
                },
                Piece {
                    at: 3,
                    home: 1,
                    home_at: 20,
                    len: 1
                },
                Piece {
                    at: 4,
                    home: 2,
                    home_at: 21,
                    len: 2
                },
            ]
        );
        let homes: Vec<_> = homes_of(&p, 2, 5).collect();
        assert_eq!(homes, [(1, 12, 1), (1, 20, 1), (2, 21, 1)]);
        assert_eq!(homes_of(&p, 6, 6).count(), 0);
    }
}
