//! The last resort of an allocation that fits nowhere: every tensor that the
//! running op and its recomputation chain hold (resident, unpinned, locked)
//! leaves its place, and the policy finds room for their bytes and the new
//! tensor's as one request (`AddedRules::move_held_tensors`).
//!
//! Why: a window may not hold a locked tensor, so the tensors a deep
//! recomputation chain holds for later cut the run they lie in. On Swin-T at
//! 0.26 the chain that brings back a 294 MiB GELU output holds four tensors
//! (551 MiB) strewn over a 1,089 MiB run between the stage's gradients, with
//! the rest evictable: 845 MiB needed, but no two held tensors 294 MiB apart.
//! Packed together, they and the request fit.
//!
//! When even that finds no room, one pinned tensor (a gradient, never
//! evicted) that alone separates two runs long enough together for the
//! request is moved to a free block outside them, and the held tensors are
//! tried again. On Swin-T at 0.2566 a 9 MiB gradient made at op 942 splits
//! the stage's activations into runs of 286 and 761 MiB where op 1,303 needs
//! 882 MiB at once.
//!
//! Each move is charged as a recomputation of the moved tensor (its op's
//! cost), as `Executor::compute_beside_inputs` charges its moves, and counted
//! in `Report::relocations`. When the policy finds no room, every tensor goes
//! back where it was and the allocation runs out of memory as before.

use super::Executor;
use crate::error::{RematError, RematResult};
use crate::tensor::TensorId;

impl Executor<'_> {
    /// Computes `out` (its inputs resident and locked) with every held tensor
    /// moved beside it, or returns `error` with the pool as it was.
    pub(super) fn compute_with_held_moved(
        &mut self,
        out: TensorId,
        error: RematError,
    ) -> RematResult<()> {
        let moved = self.held_tensors();
        if moved.is_empty() {
            return Err(error);
        }
        self.compute_with_moved_as_one(out, &moved, error)
    }

    /// [`Executor::compute_with_held_moved`], and when that fails, once more
    /// after one pinned tensor that splits a run long enough for the request
    /// and the held tensors is moved out of it (and back if that fails too).
    pub(super) fn compute_with_held_and_pinned_moved(
        &mut self,
        out: TensorId,
        error: RematError,
    ) -> RematResult<()> {
        let error = match self.compute_with_held_moved(out, error) {
            Err(error @ RematError::OutOfMemory { .. }) => error,
            result => return result,
        };
        let need =
            self.request_for(out)?.size + self.held_tensors().iter().map(|m| m.2).sum::<u64>();
        let Some((p, from, size, to)) = self.pinned_splitting_a_run(need) else {
            return Err(error);
        };
        self.move_pinned(p, to, size)?;
        let result = match self.compute(out) {
            Err(error @ RematError::OutOfMemory { .. }) => self.compute_with_held_moved(out, error),
            result => result,
        };
        match result {
            Err(error @ RematError::OutOfMemory { .. }) => {
                self.move_pinned(p, from, size)?;
                let cost = self.move_cost(p)?;
                self.report.recompute_cost -= 2.0 * cost;
                self.report.move_cost -= 2.0 * cost;
                self.report.relocations -= 2;
                Err(error)
            }
            result => result,
        }
    }

    /// The smallest unlocked pinned tensor that alone separates two gaps
    /// between pinned tensors whose span (theirs and its) is at least `need`
    /// bytes, with a free block outside that span to move it to:
    /// `(tensor, address, size, new address)`.
    fn pinned_splitting_a_run(&self, need: u64) -> Option<(TensorId, u64, u64, u64)> {
        let gaps = self.pool.gaps_of_at_least(0);
        let mut best: Option<(u64, u64, TensorId, u64)> = None;
        for pair in gaps.windows(2) {
            let ((start, left_end), (right_start, end)) = (pair[0], pair[1]);
            if end - start < need {
                continue;
            }
            let Some(splitter) = self.pool.intervals_in(left_end, right_start).first() else {
                continue;
            };
            let Some(p) = splitter.tensor else { continue };
            let state = self.tensors.state(p).ok()?;
            if splitter.addr + splitter.size != right_start || !state.pinned || state.locks > 0 {
                continue;
            }
            if best.is_none_or(|b| (splitter.size, splitter.addr) < (b.0, b.1)) {
                best = Some((splitter.size, splitter.addr, p, start));
            }
        }
        let (size, addr, p, start) = best?;
        let end = gaps.iter().find(|g| g.0 == addr + size).map(|g| g.1)?;
        let to = self.pool.best_fit_outside(size, start, end)?;
        Some((p, addr, size, to))
    }

    /// Moves pinned tensor `p` of `size` bytes to `to`, charged as a
    /// recomputation of it and counted as a relocation.
    fn move_pinned(&mut self, p: TensorId, to: u64, size: u64) -> RematResult<()> {
        self.pool.release(p)?;
        self.place(p, to, size)?;
        self.charge_move(p, to)
    }

    /// The resident, unpinned, locked tensors as `(address, tensor, size)`,
    /// in address order.
    fn held_tensors(&self) -> Vec<(u64, TensorId, u64)> {
        self.pool
            .intervals()
            .filter_map(|i| {
                let t = i.tensor?;
                let state = self.tensors.state(t).ok()?;
                (state.resident && !state.pinned && state.locks > 0).then_some((i.addr, t, i.size))
            })
            .collect()
    }
}
