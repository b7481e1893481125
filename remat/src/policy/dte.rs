//! DTE (MegTaiChi's Dynamic Tensor Evicting), as the Coop paper describes it:
//! DTR's heuristic with the free blocks next to a tensor counted in its memory
//! term, h = c / ((m + free_left + free_right) × s), so that evicting a tensor
//! that joins free space is preferred. Only recomputation is modelled (no
//! swapping), with the compute-time coefficient 1, as in the paper's own DTE.
//! Stateless; single-threaded.

use super::{AddedRules, Eviction, EvictionPolicy, Request, SearchContext, evict_lowest_heuristic};

/// The DTE policy.
#[derive(Debug, Default, Clone, Copy)]
pub struct Dte {
    /// Scale the score by the recompute amplification (not in the
    /// published policy; off by default, for the ablation only).
    pub price_recompute_memory: bool,
    /// Coop's added rules (`super::rules`), all off by default, for the
    /// ablations only.
    pub rules: AddedRules,
}

impl EvictionPolicy for Dte {
    fn name(&self) -> &'static str {
        "DTE"
    }

    fn next_eviction(&mut self, ctx: &SearchContext<'_>, _request: &Request) -> Option<Eviction> {
        evict_lowest_heuristic(ctx, self.rules, self.price_recompute_memory, |t, size| {
            size + ctx.pool.adjacent_free(t)
        })
    }

    fn rules(&self) -> AddedRules {
        self.rules
    }

    fn place(&mut self, ctx: &SearchContext<'_>, request: &Request) -> Option<u64> {
        super::short_gap::place_first_fit_or_short_gap(
            ctx.pool,
            request,
            self.rules.pinned_in_short_gaps,
        )
    }
}
