//! DTE (MegTaiChi's Dynamic Tensor Evicting), as the Coop paper describes it:
//! DTR's heuristic with the free blocks next to a tensor counted in its memory
//! term, h = c / ((m + free_left + free_right) × s), so that evicting a tensor
//! that joins free space is preferred. Only recomputation is modelled (no
//! swapping), with the compute-time coefficient 1, as in the paper's own DTE.
//! Stateless; single-threaded.

use super::{
    Eviction, EvictionPolicy, Request, SearchContext, lowest_score_kept, recompute_amplification,
};

/// The DTE policy.
#[derive(Debug, Default, Clone, Copy)]
pub struct Dte {
    /// Scale the score by the recompute amplification (not in the
    /// published policy; off by default, for the ablation only).
    pub price_recompute_memory: bool,
    /// Free a recomputed input that the program had dropped once nothing
    /// holds it (`EvictionPolicy::drops_dead_inputs`; Coop's rule, off by
    /// default, for the ablation only).
    pub drop_dead_inputs: bool,
    /// Move an op's locked inputs beside its output when the output fits
    /// nowhere (`EvictionPolicy::relocates_inputs`; Coop's rule, off by
    /// default, for the ablation only).
    pub relocate_inputs: bool,
    /// Move every tensor the op and its recomputation chain hold, and if
    /// need be one pinned tensor splitting a run, when a tensor still fits
    /// nowhere (`EvictionPolicy::moves_held_tensors`; Coop's rule, off by
    /// default, for the ablation only).
    pub move_held_tensors: bool,
    /// Place an unevictable request in the shortest run between pinned
    /// tensors with a free block for it (`super::short_gap`; Coop's rule,
    /// off by default, for the ablation only) instead of first-fit.
    pub pinned_in_short_gaps: bool,
    /// Bring an op's or a recomputation's inputs back in `chain_order`'s
    /// order (`EvictionPolicy::orders_inputs`; Coop's rule, off by default,
    /// for the ablation only).
    pub order_inputs: bool,
    /// Never evict a tensor on a dropped chain (`dropped_chain`; Coop's
    /// rule, off by default, for the ablation only).
    pub keep_dropped_chains: bool,
}

impl EvictionPolicy for Dte {
    fn name(&self) -> &'static str {
        "DTE"
    }

    fn next_eviction(&mut self, ctx: &SearchContext<'_>, _request: &Request) -> Option<Eviction> {
        let victim = lowest_score_kept(ctx, self.keep_dropped_chains, |t| {
            let size = ctx.pool.interval_of(t).map_or(1, |i| i.size.max(1));
            let span = (size + ctx.pool.adjacent_free(t)) as f64;
            let h = ctx.tensors.projected_cost(t) / (span * ctx.tensors.staleness(t, ctx.now));
            if self.price_recompute_memory {
                h * recompute_amplification(ctx, t, size)
            } else {
                h
            }
        })?;
        Some(Eviction {
            victims: vec![victim],
            window: None,
            addr: None,
        })
    }

    fn drops_dead_inputs(&self) -> bool {
        self.drop_dead_inputs
    }

    fn relocates_inputs(&self) -> bool {
        self.relocate_inputs
    }

    fn moves_held_tensors(&self) -> bool {
        self.move_held_tensors
    }

    fn place(&mut self, ctx: &SearchContext<'_>, request: &Request) -> Option<u64> {
        super::short_gap::place_first_fit_or_short_gap(ctx.pool, request, self.pinned_in_short_gaps)
    }

    fn orders_inputs(&self) -> bool {
        self.order_inputs
    }
}
