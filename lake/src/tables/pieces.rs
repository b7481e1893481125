//! Pieces and covers: which stitched slots map which home slots, by
//! stretches. This file owns that index; `tables.rs` uses it to carry a
//! window's change of use to every view that maps its chunks.
//!
//! - A [`Piece`] is a maximal stretch of a stitched view whose slots map
//!   consecutive slots of one home view. A stitched view is made of whole
//!   home runs laid back to back (`Lake::stitch`), so it has a few pieces
//!   however many chunks it maps (a patch or an extension adds a few).
//! - A [`Cover`] is the same pieces seen from one home view: every stitched
//!   view's pieces over its slots, sorted by home slot, so that the pieces
//!   overlapping a stretch of home slots are found by one binary search.
//!
//! So taking or giving back a window of `n` chunks costs a few run updates
//! per view its chunks lie in, found through the pieces, instead of a visit
//! to each of the `n` chunks and each of its mappings (the profile of issue
//! 13's periodic trace: 70 chunks and 140 mappings for 4 stretches per
//! call).
//!
//! Both are derived from the views' slots and the chunks' homes, and
//! rebuilt whenever a stitched view is made, patched, extended or dropped
//! (each of which makes driver calls that cost far more);
//! `Tables::check` recomputes them from scratch.
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

/// A piece of a stitched view seen from its home view.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Layer {
    /// First home slot.
    pub home_at: usize,
    /// The stitched view.
    pub view: ViewId,
    /// First stitched slot.
    pub at: usize,
    /// Slots.
    pub len: usize,
}

/// Every stitched view's pieces over one home view's slots.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Cover {
    /// Sorted by home slot (then view).
    layers: Vec<Layer>,
    /// `reach[i]`: the highest end (`home_at + len`) among `layers[..=i]`;
    /// never decreasing, so the first layer that may reach past a slot is
    /// found by binary search although layers of different views overlap.
    reach: Vec<usize>,
}

impl Cover {
    /// The cover made of `layers` (any order).
    pub fn new(mut layers: Vec<Layer>) -> Cover {
        layers.sort_unstable();
        let mut end = 0;
        let reach = layers
            .iter()
            .map(|l| {
                end = end.max(l.home_at + l.len);
                end
            })
            .collect();
        Cover { layers, reach }
    }

    /// The stitched stretches mapping home slots `[a, b)`, as (stitched
    /// view, first stitched slot, slots): each piece overlapping them, cut
    /// to the overlap.
    pub fn over(&self, a: usize, b: usize) -> impl Iterator<Item = (ViewId, usize, usize)> + '_ {
        let first = self.reach.partition_point(|&r| r <= a);
        self.layers[first..]
            .iter()
            .take_while(move |l| l.home_at < b)
            .filter(move |l| l.home_at + l.len > a)
            .map(move |l| {
                let lo = a.max(l.home_at);
                let hi = b.min(l.home_at + l.len);
                (l.view, l.at + (lo - l.home_at), hi - lo)
            })
    }
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

    #[test]
    fn cover_finds_every_overlapping_layer_and_only_those() {
        // A long layer from slot 0 and short ones after it: the short
        // ones end before slot 50, the long one reaches past it.
        let layer = |home_at, view, at, len| Layer {
            home_at,
            view,
            at,
            len,
        };
        let cover = Cover::new(vec![
            layer(10, 3, 0, 5),
            layer(0, 2, 7, 100),
            layer(20, 4, 1, 10),
            layer(60, 5, 0, 4),
        ]);
        let mut got: Vec<_> = cover.over(50, 62).collect();
        got.sort_unstable();
        assert_eq!(got, [(2, 57, 12), (5, 0, 2)]);
        // Compared with a scan of every layer, over many stretches.
        for a in 0..110 {
            for b in a + 1..112 {
                let mut want: Vec<_> = cover
                    .layers
                    .iter()
                    .filter(|l| l.home_at < b && l.home_at + l.len > a)
                    .map(|l| {
                        let lo = a.max(l.home_at);
                        (l.view, l.at + lo - l.home_at, b.min(l.home_at + l.len) - lo)
                    })
                    .collect();
                let mut got: Vec<_> = cover.over(a, b).collect();
                want.sort_unstable();
                got.sort_unstable();
                assert_eq!(got, want, "[{a}, {b})");
            }
        }
    }
}
