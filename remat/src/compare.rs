//! Runs the policies (DTR, DTE, Coop, Coop-G) over one trace at several budget ratios and formats
//! the results as a table (used by the `remat` example and the tests). Plain
//! functions; no shared state.

use std::fmt::Write as _;

use super::executor::{
    ReplayOptions, Report, budget_for, min_budget_ratio, replay, steady_min_ratio,
};
use super::policy::{AddedRules, Coop, Dte, Dtr, EvictionPolicy};
use super::recorded::Recorded;
use super::sweep::{TOP_RATIO, ratios_down_to};
use super::trace::Trace;

/// A named way to make a fresh policy.
pub type PolicyMaker = (&'static str, fn() -> Box<dyn EvictionPolicy>);

/// DTR, DTE, Coop (partitioning and in-place on, as published) and Coop-G
/// (Coop with unevictable tensors grouped at the ends of the pool).
pub fn all_policies() -> Vec<PolicyMaker> {
    vec![
        ("DTR", || Box::new(Dtr::default())),
        ("DTE", || Box::new(Dte::default())),
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

/// Each policy's steady minimum ratio (`steady_min_ratio`): the lowest
/// ratio down to which it finishes at every 0.005 from 1.0, not below 0.05.
pub fn steady_min_ratios(trace: &Trace) -> Vec<(&'static str, Option<f64>)> {
    all_policies()
        .into_iter()
        .map(|(name, make)| (name, steady_min_ratio(trace, &make, 0.05)))
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

/// A policy with one switch off and on: its name, whether the switch is on
/// by default, and the policy with the switch off or on.
type Switched = (&'static str, bool, fn(bool) -> Box<dyn EvictionPolicy>);

/// Each policy with recompute-memory pricing off and on: the bisected
/// minimum budget ratio, the steady minimum, the largest mean fragmentation
/// over the sweep's ratios down to that minimum (with its ratio) and the
/// overhead at a few ratios (✗: fails). Coop
/// and Coop-G price it by default and DTR and DTE do not; this shows what
/// the pricing alone does to each.
pub fn memory_ablation(trace: &Trace) -> String {
    let makers: [Switched; 4] = [
        ("DTR", false, |on| {
            Box::new(Dtr {
                price_recompute_memory: on,
                ..Dtr::default()
            })
        }),
        ("DTE", false, |on| {
            Box::new(Dte {
                price_recompute_memory: on,
                ..Dte::default()
            })
        }),
        ("Coop", true, |on| {
            Box::new(Coop {
                price_recompute_memory: on,
                ..Coop::default()
            })
        }),
        ("Coop-G", true, |on| {
            Box::new(Coop {
                price_recompute_memory: on,
                ..Coop::grouped()
            })
        }),
    ];
    switch_ablation(trace, "recompute-memory pricing", &makers)
}

/// Coop and Coop-G with windows ranked by summed score (the paper) and per
/// byte (`Coop::rank_per_byte`, the default): minimum ratio and overhead at
/// a few ratios, as [`memory_ablation`].
pub fn ranking_ablation(trace: &Trace) -> String {
    let makers: [Switched; 2] = [
        ("Coop", true, |on| {
            Box::new(Coop {
                rank_per_byte: on,
                ..Coop::default()
            })
        }),
        ("Coop-G", true, |on| {
            Box::new(Coop {
                rank_per_byte: on,
                ..Coop::grouped()
            })
        }),
    ];
    switch_ablation(trace, "per-byte window ranking", &makers)
}

/// Coop with the window's leftover merged into the free block next to it
/// (`Coop::merge_leftover`, the default) and without, and Coop-G (whose
/// default is off) with and without it: minimum ratio and overhead at a few
/// ratios, as [`memory_ablation`].
pub fn merge_ablation(trace: &Trace) -> String {
    let makers: [Switched; 2] = [
        ("Coop", true, |on| {
            Box::new(Coop {
                merge_leftover: on,
                ..Coop::default()
            })
        }),
        ("Coop-G", false, |on| {
            Box::new(Coop {
                merge_leftover: on,
                ..Coop::grouped()
            })
        }),
    ];
    switch_ablation(trace, "leftover merged", &makers)
}

/// Each policy with a recomputed input that the program had dropped freed
/// again once nothing holds it (`AddedRules::drop_dead_inputs`; on by
/// default in Coop only) and left resident: minimum ratio and overhead at a
/// few ratios, as [`memory_ablation`].
pub fn dead_ablation(trace: &Trace) -> String {
    rule_ablation(
        trace,
        "dropped inputs freed again",
        |r, on| r.drop_dead_inputs = on,
        true,
    )
}

/// Each policy with an op's locked inputs moved beside its output when the
/// output fits nowhere (`AddedRules::relocate_inputs`; on by default in
/// Coop only) and without: minimum ratio and overhead at a few ratios, as
/// [`memory_ablation`]. The rule acts only where a replay would otherwise
/// run out of memory, so a row that finishes either way is the same.
pub fn relocate_ablation(trace: &Trace) -> String {
    rule_ablation(
        trace,
        "locked inputs moved beside the output",
        |r, on| r.relocate_inputs = on,
        true,
    )
}

/// Each policy with the tensors that an op and its recomputation chain hold
/// moved together (and if need be one pinned tensor splitting a run moved
/// out of it) when a tensor still fits nowhere
/// (`AddedRules::move_held_tensors`; on by default in Coop only) and
/// without: minimum ratio and overhead at a few ratios, as
/// [`memory_ablation`]. Like the rule before it, it acts only where a replay
/// would otherwise run out of memory.
pub fn held_ablation(trace: &Trace) -> String {
    rule_ablation(
        trace,
        "held tensors moved together",
        |r, on| r.move_held_tensors = on,
        true,
    )
}

/// Each policy with unevictable requests placed in the shortest run between
/// pinned tensors that has a free block for them (`policy::short_gap`; on by
/// default in Coop only) and as before (first-fit, or Coop's partitioning):
/// minimum ratio and overhead at a few ratios, as [`memory_ablation`]. Coop-G
/// places them against its anchors either way.
pub fn gap_ablation(trace: &Trace) -> String {
    rule_ablation(
        trace,
        "pinned requests in the shortest run",
        |r, on| r.pinned_in_short_gaps = on,
        false,
    )
}

/// Each policy with its prices leaving out the inputs that a policy
/// evicted and the program still holds (`AddedRules::borrow_live_inputs`,
/// on by default in Coop only) and without: minimum ratio and overhead at
/// a few ratios, as [`memory_ablation`].
pub fn borrow_ablation(trace: &Trace) -> String {
    rule_ablation(
        trace,
        "live inputs borrowed",
        |r, on| r.borrow_live_inputs = on,
        true,
    )
}

/// Each policy with the side outputs of an op (its outputs other than the
/// largest) placed best-fit (`AddedRules::side_outputs_best_fit`, on by
/// default in Coop only) and without: minimum ratio and overhead at a few
/// ratios, as [`memory_ablation`].
pub fn side_ablation(trace: &Trace) -> String {
    rule_ablation(
        trace,
        "side outputs best-fit",
        |r, on| r.side_outputs_best_fit = on,
        true,
    )
}

/// Each policy with the tensors that divide a run of free blocks moved out
/// of it before evicting (`AddedRules::compact_dividers`), then with small
/// tensors scored as moved in Coop's windows
/// (`AddedRules::move_small_in_windows`), each against without: minimum
/// ratio and overhead at a few ratios, as [`memory_ablation`].
pub fn compact_ablation(trace: &Trace) -> String {
    let dividers = rule_ablation(
        trace,
        "dividers moved so holes join",
        |r, on| r.compact_dividers = on,
        true,
    );
    let windows = rule_ablation(
        trace,
        "small tensors moved out of windows",
        |r, on| r.move_small_in_windows = on,
        true,
    );
    format!("{dividers}\n{windows}")
}

/// Each policy with holes joined by moves before evicting
/// (`AddedRules::join_holes_by_moves`, on by default in Coop only) and
/// without: minimum ratio, largest mean fragmentation and overhead at a
/// few ratios, as [`memory_ablation`].
pub fn moves_ablation(trace: &Trace) -> String {
    rule_ablation(
        trace,
        "holes joined by moves",
        |r, on| r.join_holes_by_moves = on,
        true,
    )
}

/// Coop with the free bytes inside a window counted twice in its per-byte
/// ranking (`Coop::credit_holes`, off by default) and without: minimum ratio
/// and overhead at a few ratios, as [`memory_ablation`]. DTR and DTE have no
/// windows (DTE's score already counts the free blocks beside a tensor).
pub fn hole_ablation(trace: &Trace) -> String {
    let makers: [Switched; 1] = [("Coop", false, |on| {
        Box::new(Coop {
            credit_holes: on,
            ..Coop::default()
        })
    })];
    switch_ablation(trace, "holes credited in the per-byte ranking", &makers)
}

/// Coop with each of its two fragmentation rules (`Coop::amplify_over_run`:
/// a tensor's recompute amplification over the run its eviction frees;
/// `Coop::absorb_holes`: a window holding a hole of at least half the
/// request taken when it evicts fewer bytes and costs no more per byte with
/// its free bytes counted twice) off and on, alone and together: per
/// setting, the bisected minimum ratio, the largest mean fragmentation over
/// the sweep's ratios (0.9 down to that minimum, step 0.05) with its ratio,
/// the number of those ratios above 5%, and the overhead at a few ratios.
/// Both on is Coop's default.
pub fn frag_ablation(trace: &Trace) -> String {
    type Setting = (&'static str, bool, bool);
    const SETTINGS: [Setting; 4] = [
        ("neither", false, false),
        ("run pricing", true, false),
        ("holes absorbed", false, true),
        ("both (default)", true, true),
    ];
    let mut out = String::from(
        "fragmentation rules: Coop with, min ratio, largest mean fragmentation (ratio), ratios above 5%, overhead at",
    );
    for r in ABLATION_RATIOS {
        let _ = write!(out, " {r}");
    }
    out.push('\n');
    for (name, over_run, absorb) in SETTINGS {
        let make = move || -> Box<dyn EvictionPolicy> {
            Box::new(Coop {
                amplify_over_run: over_run,
                absorb_holes: absorb,
                ..Coop::default()
            })
        };
        let min = min_budget_ratio(trace, &make, (0.05, 1.2), 0.005);
        let run = |ratio: f64| {
            replay(
                trace,
                budget_for(trace, ratio),
                make().as_mut(),
                ReplayOptions::default(),
            )
        };
        let (worst, worst_at, above) = largest_mean_fragmentation(trace, &make, min);
        let min = min.map_or("-".to_string(), |m| format!("{m:.3}"));
        let _ = write!(
            out,
            "  {name:>15} {min:>6} {:>5.1}% ({worst_at:.3}) {above:>2}",
            worst * 100.0
        );
        for ratio in ABLATION_RATIOS {
            let _ = write!(out, " {:>7}", overhead_cell(&run(ratio)));
        }
        out.push('\n');
    }
    out
}

/// Each policy with the two recomputation-chain rules of branch
/// `remat-resnet` (`AddedRules::order_inputs`: inputs brought back
/// resident first, then deepest chain first; `keep_dropped_chains`: no
/// tensor on a dropped chain evicted; the second on by default in Coop
/// only, the first off since the held-tensor move; they paid only together
/// on ResNet-50) and without: minimum ratio and overhead at a
/// few ratios, as [`memory_ablation`].
pub fn chain_ablation(trace: &Trace) -> String {
    rule_ablation(
        trace,
        "inputs ordered and dropped chains kept",
        |r, on| {
            r.order_inputs = on;
            r.keep_dropped_chains = on;
        },
        true,
    )
}

/// Every policy on the trace as recorded and on the trace without the
/// inputs of its metadata-only ops (`Recorded::without_metadata_inputs`;
/// off by default): minimum ratio and overhead at a few ratios, as
/// [`memory_ablation`]. The trace is the same for every policy, so this is
/// a question of the replay's model, not of any one policy.
pub fn metadata_ablation(recorded: &Recorded) -> String {
    let traces = [
        ("as recorded", recorded.trace.clone()),
        ("dropped", recorded.without_metadata_inputs()),
    ];
    let mut out = format!(
        "inputs of metadata-only ops ({} ops): policy, trace, min ratio, overhead at",
        recorded.metadata_ops.len()
    );
    for r in ABLATION_RATIOS {
        let _ = write!(out, " {r}");
    }
    out.push('\n');
    for (name, make) in all_policies() {
        for (label, trace) in &traces {
            let min = min_budget_ratio(trace, &make, (0.05, 1.2), 0.005);
            let min = min.map_or("-".to_string(), |m| format!("{m:.3}"));
            let _ = write!(out, "  {name:>6} {label:>11} {min:>6}");
            for ratio in ABLATION_RATIOS {
                let r = replay(
                    trace,
                    budget_for(trace, ratio),
                    make().as_mut(),
                    ReplayOptions::default(),
                );
                let _ = write!(out, " {:>7}", overhead_cell(&r));
            }
            out.push('\n');
        }
    }
    out
}

/// Over the sweep's ratios (0.9 down to `min`, step 0.05; 0.9 alone when
/// the policy has no minimum), the largest mean fragmentation of a replay
/// that finished, the ratio where it is, and how many of those replays read
/// 5% or more.
fn largest_mean_fragmentation(
    trace: &Trace,
    make: &dyn Fn() -> Box<dyn EvictionPolicy>,
    min: Option<f64>,
) -> (f64, f64, usize) {
    let (mut worst, mut worst_at, mut above) = (0.0f64, 0.0f64, 0usize);
    for ratio in ratios_down_to(min.unwrap_or(TOP_RATIO), 0.05) {
        let r = replay(
            trace,
            budget_for(trace, ratio),
            make().as_mut(),
            ReplayOptions::default(),
        );
        let frag = r.fragmentation_mean();
        if r.finished() && frag > worst {
            (worst, worst_at) = (frag, ratio);
        }
        above += usize::from(r.finished() && frag >= 0.05);
    }
    (worst, worst_at, above)
}

/// The ratios at which the ablations give the overhead.
const ABLATION_RATIOS: [f64; 3] = [0.9, 0.7, 0.5];

/// A replay's overhead as a table cell (✗: it did not finish).
fn overhead_cell(r: &Report) -> String {
    if r.finished() {
        format!("{:.1}%", 100.0 * r.overhead())
    } else {
        "✗".to_string()
    }
}

/// Each policy of `makers` with its switch off and on: the bisected minimum
/// budget ratio, the steady minimum, the largest mean fragmentation
/// ([`largest_mean_fragmentation`]) and the overhead at 0.9, 0.7 and 0.5
/// (✗: fails).
fn switch_ablation(trace: &Trace, switch: &str, makers: &[Switched]) -> String {
    let rows: Vec<SwitchedRow<'_>> = makers
        .iter()
        .map(|(name, default, make)| (*name, Some(*default), make as &dyn Fn(bool) -> _))
        .collect();
    ablation_table(trace, switch, &rows)
}

/// A policy with one switch, as [`Switched`], made by any function; the
/// default is `None` when the policy's defaults are neither all off nor all
/// on (a switch of two rules).
type SwitchedRow<'a> = (
    &'static str,
    Option<bool>,
    &'a dyn Fn(bool) -> Box<dyn EvictionPolicy>,
);

/// DTR, DTE, Coop and (with `with_grouped`) Coop-G, each with one of the
/// added rules (`AddedRules`, as `set` switches it) off and on over its own
/// defaults: minimum ratio and overhead at a few ratios, as
/// [`memory_ablation`]. A row is marked default where switching the rule
/// that way changes nothing in that policy's defaults.
fn rule_ablation(
    trace: &Trace,
    switch: &str,
    set: fn(&mut AddedRules, bool),
    with_grouped: bool,
) -> String {
    let switched = move |mut rules: AddedRules, on: bool| {
        set(&mut rules, on);
        rules
    };
    let default = |rules: AddedRules| {
        [false, true]
            .into_iter()
            .find(|&on| switched(rules, on) == rules)
    };
    let dtr = move |on| -> Box<dyn EvictionPolicy> {
        Box::new(Dtr {
            rules: switched(AddedRules::NONE, on),
            ..Dtr::default()
        })
    };
    let dte = move |on| -> Box<dyn EvictionPolicy> {
        Box::new(Dte {
            rules: switched(AddedRules::NONE, on),
            ..Dte::default()
        })
    };
    let coop = move |on| -> Box<dyn EvictionPolicy> {
        let coop = Coop::default();
        Box::new(Coop {
            rules: switched(coop.rules, on),
            ..coop
        })
    };
    let grouped = move |on| -> Box<dyn EvictionPolicy> {
        let grouped = Coop::grouped();
        Box::new(Coop {
            rules: switched(grouped.rules, on),
            ..grouped
        })
    };
    let mut rows: Vec<SwitchedRow<'_>> = vec![
        ("DTR", Some(false), &dtr),
        ("DTE", Some(false), &dte),
        ("Coop", default(Coop::default().rules), &coop),
    ];
    if with_grouped {
        rows.push(("Coop-G", default(Coop::grouped().rules), &grouped));
    }
    ablation_table(trace, switch, &rows)
}

/// The table of [`switch_ablation`] and [`rule_ablation`].
fn ablation_table(trace: &Trace, switch: &str, rows: &[SwitchedRow<'_>]) -> String {
    let mut out = format!(
        "{switch}: policy, switch, min ratio, steady min, largest mean fragmentation (ratio), overhead at"
    );
    for r in ABLATION_RATIOS {
        let _ = write!(out, " {r}");
    }
    out.push('\n');
    for &(name, default, make) in rows {
        for on in [false, true] {
            let min = min_budget_ratio(trace, &|| make(on), (0.05, 1.2), 0.005);
            let (frag, frag_at, _) = largest_mean_fragmentation(trace, &|| make(on), min);
            let min = min.map_or("-".to_string(), |m| format!("{m:.3}"));
            let steady = steady_min_ratio(trace, &|| make(on), 0.05);
            let steady = steady.map_or("-".to_string(), |m| format!("{m:.3}"));
            let mark = if default == Some(on) {
                " (default)"
            } else {
                ""
            };
            let _ = write!(
                out,
                "  {name:>6} {:>3}{mark:10} {min:>6} {steady:>6} {:>5.1}% ({frag_at:.3})",
                if on { "on" } else { "off" },
                frag * 100.0
            );
            for ratio in ABLATION_RATIOS {
                let r = replay(
                    trace,
                    budget_for(trace, ratio),
                    make(on).as_mut(),
                    ReplayOptions::default(),
                );
                let _ = write!(out, " {:>7}", overhead_cell(&r));
            }
            out.push('\n');
        }
    }
    out
}

/// Search latency of DTR as published, DTR with Coop's price cache
/// (`Dtr::cache_prices`: same decisions, checked) and Coop, per evicting
/// allocation, at a few ratios: the mean of each replay, median over
/// `repeats` replays (wall time; the median drops a replay whose few
/// searches were preempted). Shows how much of Coop's lead is the cache,
/// which any policy could have, and how much is its single pass.
pub fn latency_ablation(trace: &Trace, repeats: usize) -> String {
    const RATIOS: [f64; 5] = [0.9, 0.8, 0.7, 0.6, 0.5];
    type Maker = (&'static str, fn() -> Box<dyn EvictionPolicy>);
    let makers: [Maker; 3] = [
        ("DTR", || Box::new(Dtr::default())),
        ("DTR+cache", || {
            Box::new(Dtr {
                cache_prices: true,
                ..Dtr::default()
            })
        }),
        ("Coop", || Box::new(Coop::default())),
    ];
    let mut out = format!(
        "search µs per evicting allocation (median of {repeats} replays): ratio, {}, \
         DTR / Coop, DTR+cache / Coop\n",
        makers.map(|(name, _)| name).join(", ")
    );
    for ratio in RATIOS {
        let mut means = Vec::new();
        let mut decisions = Vec::new();
        for (_, make) in makers {
            let mut times = Vec::new();
            for _ in 0..repeats.max(1) {
                let r = replay(
                    trace,
                    budget_for(trace, ratio),
                    make().as_mut(),
                    ReplayOptions::default(),
                );
                times.push(r.search_us_mean());
                decisions.push((r.finished(), r.evictions, r.recompute_cost.to_bits()));
            }
            times.sort_by(f64::total_cmp);
            means.push(times[times.len() / 2]);
        }
        let runs = repeats.max(1);
        let same = decisions[..runs] == decisions[runs..2 * runs];
        let _ = writeln!(
            out,
            "  {ratio:.2} {:>9.2} {:>9.2} {:>9.2} {:>7.1}x {:>7.1}x{}",
            means[0],
            means[1],
            means[2],
            means[0] / means[2].max(1e-9),
            means[1] / means[2].max(1e-9),
            if same {
                ""
            } else {
                "  (DTR+cache decided differently!)"
            }
        );
    }
    out
}

/// Every policy at every ratio of the sweep (0.9 down to the lowest minimum)
/// with moves charged as device copies (`ReplayOptions::moves_as_copies`,
/// the default) and as recomputations (before): for each replay that moved
/// a tensor, the moves, what they were charged each way (in the trace's
/// cost unit, ms for a recorded trace) and the overhead each way, and
/// whether everything but the charge was the same (evictions,
/// recomputations, fragmentation, ops run).
pub fn copy_ablation(trace: &Trace) -> String {
    let lowest = min_ratios(trace)
        .iter()
        .filter_map(|&(_, r)| r)
        .fold(TOP_RATIO, f64::min);
    let mut out = format!(
        "moves as copies (trace: {}): ratio, policy, moves, charged as copies / as recomputations (ms), overhead as copies / as recomputations, same decisions\n",
        match trace.copy {
            Some(c) => format!(
                "{:.0} bytes per ns, floor {:.1} µs",
                c.bytes_per_cost,
                c.launch / 1e3
            ),
            None => "no copy cost".to_string(),
        }
    );
    let (mut replays, mut same) = (0usize, 0usize);
    for ratio in ratios_down_to(lowest, 0.05) {
        for (name, make) in all_policies() {
            let run = |copies: bool| {
                let options = ReplayOptions {
                    moves_as_copies: copies,
                    ..ReplayOptions::default()
                };
                replay(trace, budget_for(trace, ratio), make().as_mut(), options)
            };
            let (copies, recomputes) = (run(true), run(false));
            let decided = |r: &Report| (r.ops_done, r.evictions, r.recomputations, r.relocations);
            let alike = decided(&copies) == decided(&recomputes)
                && copies.fragmentation == recomputes.fragmentation;
            replays += 1;
            same += usize::from(alike);
            if copies.relocations == 0 && alike {
                continue;
            }
            let _ = writeln!(
                out,
                "  {ratio:>5.3} {name:>6} {:>4} {:>9.3} / {:>9.3} {:>7} / {:>7} {}",
                copies.relocations,
                copies.move_cost / 1e6,
                recomputes.move_cost / 1e6,
                overhead_cell(&copies),
                overhead_cell(&recomputes),
                if alike { "yes" } else { "NO" }
            );
        }
    }
    let _ = writeln!(out, "  same decisions in {same} of {replays} replays");
    out
}
