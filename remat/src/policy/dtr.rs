//! DTR (Kirisame et al., ICLR 2021): evict, one at a time, the resident tensor
//! with the lowest h = c / (m × s), where c is the projected cost (own cost plus
//! the evicted equivalence classes next to it, see `neighbourhood`), m the
//! size and s the staleness; repeat until the new tensor fits. New tensors go
//! first-fit, as in a conventional allocator. Stateless; single-threaded.

use super::{AddedRules, Eviction, EvictionPolicy, Request, SearchContext, evict_lowest_heuristic};

/// The DTR policy.
#[derive(Debug, Default, Clone, Copy)]
pub struct Dtr {
    /// Scale the score by the recompute amplification (not in the
    /// published policy; off by default, for the ablation only).
    pub price_recompute_memory: bool,
    /// Coop's added rules (`super::rules`), all off by default, for the
    /// ablations only.
    pub rules: AddedRules,
    /// Keep projected costs and recompute peaks between searches, as Coop
    /// does (`TensorTable::cache_prices`): the same scores and decisions,
    /// faster. Off by default (the published policy recomputes them), on
    /// for the latency comparison only (`compare::latency_ablation`).
    pub cache_prices: bool,
}

impl EvictionPolicy for Dtr {
    fn name(&self) -> &'static str {
        "DTR"
    }

    fn next_eviction(&mut self, ctx: &SearchContext<'_>, _request: &Request) -> Option<Eviction> {
        evict_lowest_heuristic(ctx, self.rules, self.price_recompute_memory, |_, size| size)
    }

    fn caches_prices(&self) -> bool {
        self.cache_prices
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
