//! Eviction policies behind one interface. The executor asks a policy where a
//! new tensor goes; when nothing fits it asks for the next eviction, evicts
//! what it was given, and asks again until the tensor fits or the policy gives
//! up. DTR and DTE give one victim per call (they search in a loop, as
//! published); Coop gives one contiguous window that fits the request.
//!
//! A policy is owned by one executor and called from one thread; it reads the
//! pool and the tensor table through shared references while it searches.

pub mod coop;
pub mod dte;
pub mod dtr;
pub mod rules;
pub mod short_gap;

pub use coop::Coop;
pub use dte::Dte;
pub use dtr::Dtr;
pub use rules::AddedRules;

use super::dropped_chain::on_dropped_chain;
use super::pool::Pool;
use super::tensor::{TensorId, TensorTable};

/// What a policy sees while it searches.
#[derive(Debug, Clone, Copy)]
pub struct SearchContext<'a> {
    /// The pool, in address order.
    pub pool: &'a Pool,
    /// Tensor metadata (costs, staleness, evicted classes, locks).
    pub tensors: &'a TensorTable,
    /// Logical time (index of the running op).
    pub now: u64,
}

/// What the executor asks a policy to find room for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    /// Bytes.
    pub size: u64,
    /// The op that makes the tensor has a low cost density (Coop's
    /// cheap-tensor partitioning).
    pub cheap: bool,
    /// The tensor can never be evicted (a parameter's gradient, optimizer
    /// state): it will split whatever contiguous space it lands in.
    pub pinned: bool,
}

/// One step of eviction chosen by a policy.
#[derive(Debug, Clone, PartialEq)]
pub struct Eviction {
    /// Tensors to evict.
    pub victims: Vec<TensorId>,
    /// For a window policy: the contiguous span `(start, bytes)` that will be
    /// free once the victims are gone and that fits the request.
    pub window: Option<(u64, u64)>,
    /// For a window policy: where the request goes inside that span.
    pub addr: Option<u64>,
    /// Tensors inside the window that are moved out of it rather than
    /// evicted (`AddedRules::move_small_in_windows`); not among `victims`.
    pub moved: Vec<TensorId>,
}

/// An eviction policy.
pub trait EvictionPolicy {
    /// Short name for tables.
    fn name(&self) -> &'static str;

    /// The next victims to make room for `request` bytes, or `None` when no
    /// evictable tensor is left (the request cannot be met).
    fn next_eviction(&mut self, ctx: &SearchContext<'_>, request: &Request) -> Option<Eviction>;

    /// Where the request goes without evicting, if anywhere. The baselines
    /// place first-fit, as a conventional framework allocator does.
    fn place(&mut self, ctx: &SearchContext<'_>, request: &Request) -> Option<u64> {
        ctx.pool.first_fit(request.size)
    }

    /// Whether an in-place op writes its output at its input's address
    /// (Coop's recomputable in-place) instead of copying on write (DTR).
    fn recomputes_in_place(&self) -> bool {
        false
    }

    /// Which of the rules not in the published policies this policy follows
    /// (`rules`); the executor reads the ones that act outside a search.
    fn rules(&self) -> AddedRules {
        AddedRules::NONE
    }

    /// Whether the executor should keep projected costs and recompute peaks
    /// between searches (`TensorTable::cache_prices`, at
    /// [`RECOMPUTE_DEPTH`]). The scores are the same either way; only the
    /// time to compute them changes.
    fn caches_prices(&self) -> bool {
        false
    }
}

/// Levels of missing inputs followed when a tensor's recompute peak is
/// priced (`TensorTable::recompute_peak`).
pub const RECOMPUTE_DEPTH: u32 = 3;

/// Recompute amplification of an evictable tensor of `size` bytes: the bytes
/// that recomputing it from what is resident now needs at once, over the
/// bytes that evicting it frees (at least 1; exactly 1 when its inputs are
/// all resident). A policy that prices recompute memory multiplies its score
/// by it, so that a small tensor whose inputs are gone (GPT-2's embedding
/// gradient, 147 MiB, needing three 785 MiB logits-sized tensors back) is
/// evicted only when nothing cheaper is left.
pub fn recompute_amplification(ctx: &SearchContext<'_>, t: TensorId, size: u64) -> f64 {
    amplification(ctx.tensors.recompute_peak(t, RECOMPUTE_DEPTH), size)
}

/// The recompute amplification of a tensor of `size` bytes whose recompute
/// peak is `peak` bytes (see [`recompute_amplification`]).
pub fn amplification(peak: u64, size: u64) -> f64 {
    peak.max(size) as f64 / size.max(1) as f64
}

/// DTR's and DTE's eviction: the one resident, evictable tensor with the
/// lowest h = c / (memory × s) (c the projected cost, s the staleness,
/// memory what `memory` says of the tensor and its size: its size for DTR,
/// with the free blocks beside it for DTE), times its recompute
/// amplification with `price_recompute_memory`; with the rule
/// `keep_dropped_chains`, none on a dropped chain (`dropped_chain`).
pub(crate) fn evict_lowest_heuristic(
    ctx: &SearchContext<'_>,
    rules: AddedRules,
    price_recompute_memory: bool,
    memory: impl Fn(TensorId, u64) -> u64,
) -> Option<Eviction> {
    let victim = ctx
        .pool
        .intervals()
        .filter_map(|i| i.tensor)
        .filter(|&t| ctx.tensors.is_evictable(t))
        .filter(|&t| !(rules.keep_dropped_chains && on_dropped_chain(ctx.tensors, t)))
        .map(|t| {
            let size = ctx.pool.interval_of(t).map_or(1, |i| i.size.max(1));
            let h = ctx.tensors.projected_cost(t)
                / (memory(t, size) as f64 * ctx.tensors.staleness(t, ctx.now));
            let h = if price_recompute_memory {
                h * recompute_amplification(ctx, t, size)
            } else {
                h
            };
            (h, t)
        })
        .min_by(|a, b| a.0.total_cmp(&b.0))
        .map(|(_, t)| t)?;
    Some(Eviction {
        victims: vec![victim],
        window: None,
        addr: None,
        moved: Vec::new(),
    })
}
