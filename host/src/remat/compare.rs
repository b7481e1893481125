//! Runs the policies (DTR, DTE, Coop, Coop-G) over one trace at several budget ratios and formats
//! the results as a table (used by the `remat` example and the tests). Plain
//! functions; no shared state.

use std::fmt::Write as _;

use super::executor::{ReplayOptions, Report, budget_for, min_budget_ratio, replay};
use super::policy::{Coop, Dte, Dtr, EvictionPolicy};
use super::trace::Trace;

/// A named way to make a fresh policy.
pub type PolicyMaker = (&'static str, fn() -> Box<dyn EvictionPolicy>);

/// DTR, DTE, Coop (partitioning and in-place on, as published) and Coop-G
/// (Coop with unevictable tensors grouped at the ends of the pool).
pub fn all_policies() -> Vec<PolicyMaker> {
    vec![
        ("DTR", || Box::new(Dtr)),
        ("DTE", || Box::new(Dte)),
        ("Coop", || Box::new(Coop::default())),
        ("Coop-G", || Box::new(Coop::grouped())),
    ]
}

/// One replay per policy per ratio, in that order.
pub fn sweep(trace: &Trace, ratios: &[f64]) -> Vec<(f64, Report)> {
    let mut rows = Vec::new();
    for &ratio in ratios {
        for (_, make) in all_policies() {
            let mut policy = make();
            rows.push((
                ratio,
                replay(
                    trace,
                    budget_for(trace, ratio),
                    policy.as_mut(),
                    ReplayOptions::default(),
                ),
            ));
        }
    }
    rows
}

/// The smallest ratio in `[0.05, 1.2]` at which each policy finishes.
pub fn min_ratios(trace: &Trace) -> Vec<(&'static str, Option<f64>)> {
    all_policies()
        .into_iter()
        .map(|(name, make)| (name, min_budget_ratio(trace, &make, (0.05, 1.2), 0.005)))
        .collect()
}

/// The sweep as a text table.
pub fn table(title: &str, rows: &[(f64, Report)]) -> String {
    let mut out = format!(
        "{title}\n{:>5} {:>6} {:>4} {:>9} {:>9} {:>9} {:>8} {:>11}\n",
        "ratio", "pol", "done", "overhead", "frag avg", "frag max", "evicts", "search µs"
    );
    for (ratio, r) in rows {
        let _ = writeln!(
            out,
            "{ratio:>5.2} {:>6} {:>4} {:>8.1}% {:>8.1}% {:>8.1}% {:>8} {:>11.2}",
            r.policy,
            if r.finished() { "yes" } else { "no" },
            100.0 * r.overhead(),
            100.0 * r.fragmentation_mean(),
            100.0 * r.fragmentation_max(),
            r.evictions,
            r.search_us_mean()
        );
    }
    out
}
