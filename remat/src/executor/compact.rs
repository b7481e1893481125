//! Holes joined by moving the small tensors that divide them, and what
//! every move of tensors out of a span shares.
//!
//! **Dividers moved** (`AddedRules::compact_dividers`, off in every
//! policy): before the policy evicts anything for a request that fits no
//! free block, the tensors that alone split a run of free blocks long
//! enough for it are moved elsewhere, and the request goes into the joined
//! block.
//!
//! Why: on ResNet-50 a forward BatchNorm's saved statistics (256 B to 8 KiB)
//! sit at the start of the block that the op's 196 MiB output then takes,
//! and outlive it; in the backward pass they split 98 MiB holes that a
//! 196 MiB request cannot use, so the policy evicts beside free space.
//!
//! A *divider* is the group of tensors between two free blocks (a
//! BatchNorm's two statistics lie side by side), all resident, unpinned and
//! unlocked, its bytes fewer than either block's: moving it joins more free
//! bytes than it occupies. Of the runs of free blocks joined by dividers, the one that
//! holds the request with the fewest divider bytes is chosen; each divider
//! goes to the smallest free block outside the run that holds it. Each move
//! is charged as a move (`Executor::charge_move`: a device copy on a
//! recorded trace) and counted in `Report::relocations`, as the other moves
//! are. When a divider finds no block, or the policy still places nothing,
//! every moved tensor goes back and nothing is charged.
//!
//! The general form, holes joined by moves
//! (`AddedRules::join_holes_by_moves`, on in Coop), is `executor/moves.rs`;
//! it empties its window with [`Executor::empty_span_and_place`], shared
//! with the dividers' rule here.
//!
//! Also the executor's half of `AddedRules::move_small_in_windows`
//! (`Executor::move_out_of`): the tensors Coop's window search scored as
//! moved leave the window the same way. That rule and the dividers' are
//! off in every policy (`docs/PERF.md`, "Small tensors moved so holes
//! join"). Part of one executor; single-threaded.

use super::Executor;
use crate::error::RematResult;
use crate::policy::{Request, SearchContext};
use crate::pool::Interval;
use crate::tensor::TensorId;

/// A run of free blocks joined by dividers: `[start, end)` and the dividers
/// inside it as `(address, tensor, size)`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct JoinableRun {
    pub start: u64,
    pub end: u64,
    pub dividers: Vec<(u64, TensorId, u64)>,
}

impl JoinableRun {
    fn divider_bytes(&self) -> u64 {
        self.dividers.iter().map(|d| d.2).sum()
    }
}

/// The run of free blocks joined by dividers that is at least `need` bytes
/// long with the fewest divider bytes (the lowest address on ties), from the
/// pool's intervals in address order; `movable` says whether a tensor may
/// be moved at all. A divider is the group of tensors between two free
/// blocks, all movable, its bytes fewer than either block's.
pub(super) fn cheapest_joinable_run(
    intervals: &[Interval],
    need: u64,
    movable: impl Fn(TensorId) -> bool,
) -> Option<JoinableRun> {
    let mut best: Option<JoinableRun> = None;
    let consider = |chain: &[Interval], best: &mut Option<JoinableRun>| {
        if let Some(run) = cheapest_in_chain(chain, need)
            && best
                .as_ref()
                .is_none_or(|b| run.divider_bytes() < b.divider_bytes())
        {
            *best = Some(run);
        }
    };
    let mut chain: Vec<Interval> = Vec::new();
    let mut group: Vec<Interval> = Vec::new();
    for interval in intervals {
        if interval.tensor.is_some() {
            group.push(*interval);
            continue;
        }
        let group_bytes: u64 = group.iter().map(|i| i.size).sum();
        let left = chain.last().filter(|i| i.tensor.is_none());
        let divides = !group.is_empty()
            && left.is_some_and(|l| l.size > group_bytes)
            && interval.size > group_bytes
            && group.iter().all(|i| i.tensor.is_some_and(&movable));
        if divides {
            chain.append(&mut group);
        } else {
            consider(&chain, &mut best);
            chain.clear();
            group.clear();
        }
        chain.push(*interval);
    }
    consider(&chain, &mut best);
    best
}

/// In one chain (free blocks joined by dividers, first and last free), the
/// sub-run from a free block to a free block that spans `need` bytes with
/// the fewest divider bytes, if it has at least one divider.
fn cheapest_in_chain(chain: &[Interval], need: u64) -> Option<JoinableRun> {
    let free: Vec<usize> = (0..chain.len())
        .filter(|&k| chain[k].tensor.is_none())
        .collect();
    let mut best: Option<JoinableRun> = None;
    for (n, &first) in free.iter().enumerate() {
        let start = chain[first].addr;
        let Some(&last) = free[n + 1..]
            .iter()
            .find(|&&last| chain[last].addr + chain[last].size - start >= need)
        else {
            continue;
        };
        let run = JoinableRun {
            start,
            end: chain[last].addr + chain[last].size,
            dividers: chain[first..=last]
                .iter()
                .filter_map(|i| i.tensor.map(|t| (i.addr, t, i.size)))
                .collect(),
        };
        if best
            .as_ref()
            .is_none_or(|b| run.divider_bytes() < b.divider_bytes())
        {
            best = Some(run);
        }
    }
    best
}

impl Executor<'_> {
    /// Where `request` goes after the dividers of the cheapest joinable run
    /// are moved out of it, or `None` with the pool as it was.
    pub(super) fn place_after_compaction(&mut self, request: &Request) -> RematResult<Option<u64>> {
        let movable = |t| self.movable_now(t);
        let Some(run) = cheapest_joinable_run(self.pool.interval_array(), request.size, movable)
        else {
            return Ok(None);
        };
        self.empty_span_and_place((run.start, run.end), &run.dividers, request)
    }

    /// Whether `t` may be moved now: resident, unpinned, unlocked.
    pub(super) fn movable_now(&self, t: TensorId) -> bool {
        self.tensors
            .state(t)
            .is_ok_and(|s| s.resident && !s.pinned && s.locks == 0)
    }

    /// Moves each of `leaving` (`(address, tensor, size)`, in that order)
    /// into the smallest free block outside `[start, end)` and places
    /// `request` as the policy says; each move charged once the request is
    /// placed. When a tensor finds no block, or the policy places nothing,
    /// every tensor moved goes back (last first) and `None`.
    pub(super) fn empty_span_and_place(
        &mut self,
        (start, end): (u64, u64),
        leaving: &[(u64, TensorId, u64)],
        request: &Request,
    ) -> RematResult<Option<u64>> {
        let mut moved: Vec<(u64, TensorId, u64, u64)> = Vec::with_capacity(leaving.len());
        for &(from, t, size) in leaving {
            let Some(to) = self.pool.best_fit_outside(size, start, end) else {
                self.undo_compaction(&moved)?;
                return Ok(None);
            };
            self.pool.release(t)?;
            self.place(t, to, size)?;
            moved.push((from, t, size, to));
        }
        let ctx = SearchContext {
            pool: &self.pool,
            tensors: &self.tensors,
            now: self.now,
        };
        let Some(addr) = self.policy.place(&ctx, request) else {
            self.undo_compaction(&moved)?;
            return Ok(None);
        };
        for &(_, t, _, to) in &moved {
            self.charge_move(t, to)?;
        }
        Ok(Some(addr))
    }

    /// Moves each tensor of `moved` out of `span` (`(start, bytes)`) into the
    /// smallest free block outside it that holds it, charged as a move
    /// (`Executor::charge_move`); one that finds no block is evicted. Returns how
    /// many tensors left the span (moved or evicted).
    pub(super) fn move_out_of(
        &mut self,
        moved: &[TensorId],
        span: (u64, u64),
    ) -> RematResult<usize> {
        let (start, end) = (span.0, span.0 + span.1);
        for &t in moved {
            let size = self.tensors.get(t)?.size;
            let Some(to) = self.pool.best_fit_outside(size, start, end) else {
                self.evict(t)?;
                continue;
            };
            self.pool.release(t)?;
            self.place(t, to, size)?;
            self.charge_move(t, to)?;
        }
        Ok(moved.len())
    }

    /// Moves the tensors of `moved` (`(old address, tensor, size, new
    /// address)`) back to their old addresses, last first.
    fn undo_compaction(&mut self, moved: &[(u64, TensorId, u64, u64)]) -> RematResult<()> {
        for &(from, t, size, _) in moved.iter().rev() {
            self.pool.release(t)?;
            self.place(t, from, size)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::test_intervals::{free, used};

    #[test]
    fn two_holes_split_by_a_small_tensor_join() {
        // 98 + 1 + 98 free-used-free, then a large tensor, then 50 free.
        let pool = [
            free(0, 98),
            used(98, 1, 7),
            free(99, 98),
            used(197, 200, 8),
            free(397, 50),
        ];
        let run = cheapest_joinable_run(&pool, 196, |_| true).expect("a joinable run");
        assert_eq!((run.start, run.end), (0, 197));
        assert_eq!(run.dividers, vec![(98, 7, 1)]);
    }

    #[test]
    fn a_tensor_larger_than_a_hole_beside_it_is_no_divider() {
        let pool = [free(0, 98), used(98, 99, 7), free(197, 150)];
        assert_eq!(cheapest_joinable_run(&pool, 196, |_| true), None);
    }

    #[test]
    fn an_unmovable_tensor_is_no_divider() {
        let pool = [free(0, 98), used(98, 1, 7), free(99, 98)];
        assert_eq!(cheapest_joinable_run(&pool, 196, |t| t != 7), None);
    }

    #[test]
    fn two_small_tensors_side_by_side_divide_together() {
        // A BatchNorm's mean and inverse deviation between two holes.
        let pool = [free(0, 98), used(98, 1, 7), used(99, 1, 8), free(100, 98)];
        let run = cheapest_joinable_run(&pool, 196, |_| true).expect("a joinable run");
        assert_eq!(run.dividers, vec![(98, 7, 1), (99, 8, 1)]);
    }

    #[test]
    fn the_run_with_the_fewest_divider_bytes_wins() {
        let pool = [
            free(0, 60),
            used(60, 4, 1),
            free(64, 60),
            used(124, 200, 9),
            free(324, 70),
            used(394, 2, 2),
            free(396, 70),
        ];
        let run = cheapest_joinable_run(&pool, 120, |_| true).expect("a joinable run");
        assert_eq!(run.dividers, vec![(394, 2, 2)]);
    }
}
