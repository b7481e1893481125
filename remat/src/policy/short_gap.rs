//! Where an unevictable tensor goes when it fits in a free block: in the
//! *shortest* run between pinned tensors that has a free block large enough,
//! against the nearer end of that run (not Algorithm 1's lowest or highest
//! free block), so that the long runs, the only ones that can hold the
//! largest activations, stay whole.
//!
//! A parameter's gradient is made during the backward pass and never evicted;
//! placed first-fit it lands in the middle of the activations and cuts every
//! later window in two. On Swin-T at 0.2566 a 9 MiB gradient made at op 942
//! sits at 542 MiB and leaves a run of 856 MiB where op 1,303 needs three
//! 294 MiB tensors at once (882 MiB). Coop-G anchors gradients by evicting
//! whatever lies next to other pinned tensors, which costs recomputation at
//! every ratio; this rule only chooses among free blocks, evicts nothing, and
//! leaves a gradient that fits no free block to the policy's usual search.

use crate::pool::Pool;

/// The address for a pinned request of `size` bytes in a free block of the
/// shortest gap between pinned tensors that has one large enough (ties: the
/// lowest gap), against the end of the block nearer to an end of its gap; or
/// `None` when no free block fits.
pub fn place_in_shortest_gap(pool: &Pool, size: u64) -> Option<u64> {
    let mut best: Option<(u64, u64)> = None;
    for (start, end) in pool.gaps_of_at_least(size) {
        if best.is_some_and(|(length, _)| end - start >= length) {
            continue;
        }
        let fits = pool
            .intervals_in(start, end)
            .iter()
            .filter(|i| i.tensor.is_none() && i.size >= size)
            .map(|i| {
                // The block's side nearer to an end of the gap.
                let left_distance = i.addr - start;
                let right_distance = end - (i.addr + i.size);
                let addr = if left_distance <= right_distance {
                    i.addr
                } else {
                    i.addr + i.size - size
                };
                (left_distance.min(right_distance), addr)
            })
            .min();
        if let Some((_, addr)) = fits {
            best = Some((end - start, addr));
        }
    }
    best.map(|(_, addr)| addr)
}

/// DTR's and DTE's placement: a pinned request in the shortest gap when
/// `pinned_in_short_gaps` (Coop's rule, given to them for the ablation),
/// else first-fit.
pub fn place_first_fit_or_short_gap(
    pool: &Pool,
    request: &super::Request,
    pinned_in_short_gaps: bool,
) -> Option<u64> {
    if request.pinned && pinned_in_short_gaps {
        place_in_shortest_gap(pool, request.size)
    } else {
        pool.first_fit(request.size)
    }
}
