//! The placement primitive of the synthesizer: the lowest offset at which
//! a rigid block of requests (each at its own offset within the block)
//! collides with nothing already placed, where two requests collide when
//! they overlap both in lifetime and in address.
//!
//! For one member at block offset `r` with `s` bytes and one placed request
//! at `o` with `z` bytes whose lifetimes overlap, the block's base `b`
//! collides when `b + r < o + z` and `o < b + r + s`: `b` in the half-open
//! range `(o - r - s, o + z - r)`. The answer is the least `b >= 0` outside
//! the union of these ranges: a sweep over them sorted by start.
//!
//! Concurrency: pure functions.

use super::profile::Lifetime;

/// A request at an offset: placed (absolute) or in a block (relative).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Slot {
    /// Index of the request in the profile.
    pub req: usize,
    /// Offset.
    pub off: u64,
    /// Bytes.
    pub size: u64,
    /// Lifetime.
    pub life: Lifetime,
}

/// The least base at which every member of `block` (offsets relative to
/// the base) avoids every slot of `placed` that it overlaps in time.
pub(super) fn lowest_fit(placed: &[Slot], block: &[Slot]) -> u64 {
    let mut forbidden: Vec<(i128, i128)> = Vec::new();
    for m in block {
        for p in placed {
            if m.life.overlaps(&p.life) {
                let lo = p.off as i128 - m.off as i128 - m.size as i128 + 1;
                let hi = p.off as i128 + p.size as i128 - m.off as i128;
                if hi > 0 {
                    forbidden.push((lo, hi));
                }
            }
        }
    }
    forbidden.sort_unstable();
    let mut base: i128 = 0;
    for (lo, hi) in forbidden {
        if lo > base {
            break;
        }
        base = base.max(hi);
    }
    base as u64
}

/// The first pair of slots that overlap in both time and address, if any.
pub(super) fn first_collision(slots: &[Slot]) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..slots.len()).collect();
    order.sort_unstable_by_key(|&i| slots[i].off);
    // Sweep by address: only slots whose ranges overlap need a time check.
    for (k, &i) in order.iter().enumerate() {
        let end = slots[i].off + slots[i].size;
        for &j in &order[k + 1..] {
            if slots[j].off >= end {
                break;
            }
            if slots[i].life.overlaps(&slots[j].life) {
                return Some((slots[i].req, slots[j].req));
            }
        }
    }
    None
}

/// Max over slots of offset + size.
pub(super) fn height(slots: &[Slot]) -> u64 {
    slots.iter().map(|s| s.off + s.size).max().unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slot(req: usize, off: u64, size: u64, s: u64, e: u64) -> Slot {
        Slot {
            req,
            off,
            size,
            life: Lifetime::one(s, e),
        }
    }

    #[test]
    fn lowest_fit_finds_gaps_in_space_and_time() {
        let placed = [
            slot(0, 0, 10, 0, 5),
            slot(1, 20, 10, 0, 5),
            slot(2, 10, 10, 5, 9),
        ];
        // Fits in the hole between 10 and 20 during 0..5.
        assert_eq!(lowest_fit(&placed, &[slot(3, 0, 10, 0, 5)]), 10);
        // Too big for the hole: above everything.
        assert_eq!(lowest_fit(&placed, &[slot(3, 0, 11, 0, 5)]), 30);
        // Later in time only slot 2 is in the way.
        assert_eq!(lowest_fit(&placed, &[slot(3, 0, 10, 6, 8)]), 0);
        assert_eq!(lowest_fit(&placed, &[slot(3, 0, 11, 6, 8)]), 20);
        // A block whose second member sits 10 above its first.
        let block = [slot(3, 0, 5, 0, 5), slot(4, 10, 5, 5, 9)];
        assert_eq!(lowest_fit(&placed, &block), 10);
        assert_eq!(first_collision(&placed), None);
        assert_eq!(
            first_collision(&[slot(0, 0, 10, 0, 5), slot(1, 9, 1, 4, 5)]),
            Some((0, 1))
        );
    }
}
