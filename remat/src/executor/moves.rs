//! Holes joined by moves (`AddedRules::join_holes_by_moves`, on in Coop):
//! when a request fits no free block but the pool's free bytes would hold
//! it, the executor empties the window of whole intervals that holds it
//! with the fewest bytes of tensors, moving them, largest first, each into
//! the smallest free block outside the window (charged as moves:
//! `Executor::charge_move`, a device copy on a recorded trace), and the
//! request goes in. Only that window is tried: when one of its tensors
//! finds no block, nothing moves and the policy evicts. (Trying the next
//! windows too, up to 4, 16 or all of them, moved more and left Swin-T's
//! fragmentation higher, 6.9–7.8% against 5.0%: `docs/PERF.md`, "Holes
//! joined by moves".) It generalizes the dividers' move of
//! `executor/compact.rs` (which moves only groups smaller than the holes on
//! both sides), and empties its window with the same code.
//!
//! The window search is Coop's two-pointer sweep with a tensor's bytes as
//! its score, over the gaps between pinned tensors only, and reading a
//! tensor's state only when its pick holds a locked one
//! ([`window_to_empty`]). Part of one executor; single-threaded.

use std::ops::Range;

use super::Executor;
use crate::error::RematResult;
use crate::policy::Request;
use crate::pool::Interval;
use crate::tensor::TensorId;

/// The window of whole intervals that holds `need` bytes with the fewest
/// bytes of tensors in it (free space counts nothing; a tensor that
/// `movable` refuses may not be in it), fewer total bytes and then the
/// lowest address on ties: its index range in `intervals` and its tensor
/// bytes. Only windows inside one of `runs` (index ranges in address
/// order; a window never crosses from one to the next) are candidates, the
/// shortest ending at each interval, as in Coop's sweep: two pointers, one
/// pass over each run. It is Coop's `Sweeper` ranking by summed score with a
/// tensor's bytes as its score, kept apart in integers on purpose: served
/// by that sweeper (f64 sums, each score asked for again as the left end
/// moves) Coop's search time per evicting allocation on Swin-T grew about
/// 8% (`docs/PERF.md`, "The window sweep kept apart from Coop's").
pub(super) fn fewest_moved_window(
    intervals: &[Interval],
    runs: impl IntoIterator<Item = Range<usize>>,
    need: u64,
    movable: impl Fn(TensorId) -> bool,
) -> Option<(Range<usize>, u64)> {
    // (first, last, tensor bytes, window bytes) of the best window so far.
    let mut best: Option<(usize, usize, u64, u64)> = None;
    for run in runs {
        let (mut left, mut window_bytes, mut tensor_bytes) = (run.start, 0u64, 0u64);
        for right in run {
            let interval = &intervals[right];
            match interval.tensor {
                Some(t) if !movable(t) => {
                    (left, window_bytes, tensor_bytes) = (right + 1, 0, 0);
                    continue;
                }
                Some(_) => tensor_bytes += interval.size,
                None => {}
            }
            window_bytes += interval.size;
            while left < right && window_bytes - intervals[left].size >= need {
                window_bytes -= intervals[left].size;
                if intervals[left].tensor.is_some() {
                    tensor_bytes -= intervals[left].size;
                }
                left += 1;
            }
            let key = (tensor_bytes, window_bytes);
            if window_bytes >= need && best.is_none_or(|b| key < (b.2, b.3)) {
                best = Some((left, right, tensor_bytes, window_bytes));
            }
        }
    }
    best.map(|(first, last, tensor_bytes, _)| (first..last + 1, tensor_bytes))
}

/// [`fewest_moved_window`] over `runs` (the gaps between pinned tensors,
/// where only a locked tensor blocks), read lazily: the sweep first runs
/// without asking `movable` at all, and its pick stands when every tensor
/// in it is movable, because the full sweep's candidates are the unread
/// sweep's candidates that hold no refused tensor (a refused tensor only
/// cuts the windows that cross it), in the same order. Otherwise the full
/// sweep. Few tensors are locked at a time, so the state of most tensors
/// is never read.
pub(super) fn window_to_empty(
    intervals: &[Interval],
    runs: &[Range<usize>],
    need: u64,
    movable: impl Fn(TensorId) -> bool,
) -> Option<Range<usize>> {
    let unchecked_pick = fewest_moved_window(intervals, runs.iter().cloned(), need, |_| true);
    let all_movable = |w: &Range<usize>| {
        intervals[w.clone()]
            .iter()
            .all(|i| i.tensor.is_none_or(&movable))
    };
    match unchecked_pick {
        Some((window, _)) if all_movable(&window) => Some(window),
        Some(_) => fewest_moved_window(intervals, runs.iter().cloned(), need, &movable)
            .map(|(window, _)| window),
        None => None,
    }
}

impl Executor<'_> {
    /// With `AddedRules::join_holes_by_moves`: where `request` goes after
    /// the tensors of [`fewest_moved_window`] are moved out of it, or `None`
    /// with the pool as it was (the free bytes cannot hold the request, no
    /// window holds it, one of its tensors finds no free block outside it,
    /// or the policy still places nothing).
    pub(super) fn place_after_moves(&mut self, request: &Request) -> RematResult<Option<u64>> {
        if self.pool.free_bytes() < request.size {
            return Ok(None);
        }
        // No window holds a pinned tensor, so only the gaps between pinned
        // tensors that are long enough are read (as Coop's search reads
        // them).
        let mut runs = Vec::new();
        self.pool.gap_runs_of_at_least_into(request.size, &mut runs);
        let intervals = self.pool.interval_array();
        let movable = |t| self.movable_now(t);
        let Some(window) = window_to_empty(intervals, &runs, request.size, movable) else {
            return Ok(None);
        };
        let start = intervals[window.start].addr;
        let end = intervals[window.end - 1].addr + intervals[window.end - 1].size;
        let mut leaving: Vec<(u64, TensorId, u64)> = intervals[window]
            .iter()
            .filter_map(|i| i.tensor.map(|t| (i.addr, t, i.size)))
            .collect();
        // Largest first (the lowest address among equals), so that the
        // large ones take the blocks that fit them before small ones cut
        // those blocks down.
        leaving.sort_by_key(|&(addr, _, size)| (std::cmp::Reverse(size), addr));
        self.empty_span_and_place((start, end), &leaving, request)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::test_intervals::{free, used};

    /// 60 free, `1` (40), 30 free, `2` (10), 70 free.
    fn holes_and_two_tensors() -> [Interval; 5] {
        [
            free(0, 60),
            used(60, 40, 1),
            free(100, 30),
            used(130, 10, 2),
            free(140, 70),
        ]
    }

    #[test]
    fn the_window_with_the_fewest_tensor_bytes_is_emptied() {
        let pool = holes_and_two_tensors();
        // [60 free, 1] holds 100 and moves 40; [30 free, 2, 70 free] holds
        // 110 and moves 10.
        assert_eq!(
            fewest_moved_window(&pool, std::iter::once(0..5), 100, |_| true),
            Some((2..5, 10))
        );
    }

    #[test]
    fn a_refused_tensor_cuts_the_windows_that_cross_it() {
        let pool = holes_and_two_tensors();
        assert_eq!(
            fewest_moved_window(&pool, std::iter::once(0..5), 100, |t| t != 2),
            Some((0..2, 40))
        );
        assert_eq!(
            fewest_moved_window(&pool, std::iter::once(0..5), 100, |_| false),
            None
        );
    }

    #[test]
    fn no_window_crosses_from_one_run_to_the_next() {
        let pool = holes_and_two_tensors();
        // Split between `2` and the last hole: no run holds 100 but the
        // first, whose only window moves `1`.
        assert_eq!(
            fewest_moved_window(&pool, [0..4, 4..5], 100, |_| true),
            Some((0..2, 40))
        );
        assert_eq!(
            fewest_moved_window(&pool, [0..4, 4..5], 200, |_| true),
            None
        );
    }

    #[test]
    fn equal_moves_go_to_the_smaller_window_then_the_lower_address() {
        let pool = [
            used(0, 10, 1),
            free(10, 95),
            used(105, 10, 2),
            free(115, 90),
            used(205, 10, 3),
            free(215, 90),
        ];
        // Each window moves 10 bytes: [1, 95] and [95, 2] hold 105,
        // [2, 90] and [90, 3] and [3, 90] 100.
        assert_eq!(
            fewest_moved_window(&pool, std::iter::once(0..6), 100, |_| true),
            Some((2..4, 10))
        );
    }

    /// The lazy read picks what the full sweep picks, on random pools with
    /// a few refused (locked) tensors.
    #[test]
    fn reading_states_lazily_picks_the_full_sweeps_window() {
        let mut rng = gpu_kernels::workload::SplitMix64(16);
        for _ in 0..2_000 {
            let count = 1 + rng.below(24) as usize;
            let mut pool = Vec::with_capacity(count);
            let (mut addr, mut last_free) = (0u64, false);
            for k in 0..count {
                let size = 1 + rng.below(64);
                // Two free intervals never touch.
                let is_free = !last_free && rng.below(3) == 0;
                pool.push(if is_free {
                    free(addr, size)
                } else {
                    used(addr, size, k)
                });
                (addr, last_free) = (addr + size, is_free);
            }
            let refused: Vec<bool> = (0..count).map(|_| rng.below(6) == 0).collect();
            let movable = |t: TensorId| !refused[t];
            let cut = rng.below(count as u64 + 1) as usize;
            let runs = [0..cut, cut..count];
            let need = 1 + rng.below(200);
            let full = fewest_moved_window(&pool, runs.iter().cloned(), need, movable);
            assert_eq!(
                window_to_empty(&pool, &runs, need, movable),
                full.map(|(window, _)| window),
                "{pool:?} need {need} refused {refused:?} runs {runs:?}"
            );
        }
    }
}
