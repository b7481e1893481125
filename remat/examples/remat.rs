//! Rematerialization under a memory budget (issue 16): DTR, DTE and Coop
//! replay a training step recorded from PyTorch (`python/remat/record.py`)
//! at budget ratios of its peak live bytes; with no trace, they run on the
//! seeded synthetic steps of `remat::synth` (a transformer-like and a
//! ResNet-like one) with an ablation of Coop's layout modules.
//!
//! ```text
//! cargo run -p remat --release --example remat -- [OPTIONS] [TRACE.remat.gz]...
//!   --budget R     replay the four policies at budget ratio R (repeatable;
//!                  0.5 when neither --budget nor --sweep is given)
//!   --sweep        each policy's minimum ratio (bisection) and steady minimum
//!                  (it finishes at every 0.005 from 1.0 down to it), then
//!                  every policy from 0.9 down to the lowest bisected minimum;
//!                  writes NAME.sweep.csv, NAME.overhead.png and NAME.sweep.txt
//!   --step S       ratio step of the sweep (0.05)
//!   --out DIR      where the sweep's files go (results/remat)
//!   --memory-ablation  each policy with recompute-memory pricing off and on
//!                  (minimum ratio, overhead at 0.9, 0.7, 0.5)
//!   --ranking-ablation  Coop and Coop-G with windows ranked by summed score
//!                  (the paper) and per byte (the default): minimum ratio,
//!                  overhead at 0.9, 0.7, 0.5
//!   --merge-ablation  Coop and Coop-G with an expensive tensor placed so
//!                  that its window's leftover joins the free block next to
//!                  the window, and without (minimum ratio, overhead at
//!                  0.9, 0.7, 0.5)
//!   --dead-ablation  each policy with a recomputed input that the program
//!                  had dropped freed again once nothing holds it, and left
//!                  resident (minimum ratio, overhead at 0.9, 0.7, 0.5)
//!   --relocate-ablation  each policy with an op's locked inputs moved
//!                  beside its output when the output fits nowhere, and
//!                  without (minimum ratio, overhead at 0.9, 0.7, 0.5)
//!   --held-ablation  each policy with the tensors an op and its
//!                  recomputation chain hold moved together when a tensor
//!                  still fits nowhere, and without (minimum ratio, overhead
//!                  at 0.9, 0.7, 0.5)
//!   --gap-ablation  DTR, DTE and Coop with unevictable requests placed in
//!                  the shortest run between pinned tensors that has room,
//!                  and as before (minimum ratio, overhead at 0.9, 0.7, 0.5)
//!   --hole-ablation  Coop with the free bytes inside a window counted
//!                  twice in its per-byte ranking, and without (minimum
//!                  ratio, overhead at 0.9, 0.7, 0.5)
//!   --frag-ablation  Coop with its two fragmentation rules (amplification
//!                  over the run an eviction frees; holes of at least half
//!                  the request absorbed) off, alone and together: minimum
//!                  ratio, largest mean fragmentation, overhead at 0.9,
//!                  0.7, 0.5
//!   --borrow-ablation  each policy with a tensor's prices leaving out its
//!                  inputs that are evicted and not dropped (the projected
//!                  cost their classes, the recompute peak their bytes), and
//!                  as before (minimum ratio, overhead at 0.9, 0.7, 0.5)
//!   --side-ablation  each policy with an op's outputs other than its
//!                  largest placed in the smallest free block that holds
//!                  them, and as before (minimum ratio, overhead at 0.9,
//!                  0.7, 0.5)
//!   --moves-ablation  each policy with the tensors of the window that
//!                  holds the request with the fewest of them moved out
//!                  before evicting, when the free bytes would hold it, and
//!                  without (minimum ratio, overhead at 0.9, 0.7, 0.5)
//!   --compact-ablation  each policy with the small tensors that divide a
//!                  run of free blocks moved out of it before evicting, and
//!                  without (minimum ratio, overhead at 0.9, 0.7, 0.5)
//!   --chain-ablation  each policy with an op's and a recomputation's
//!                  inputs brought back resident first, then deepest chain
//!                  first, and tensors on a dropped chain (a backward
//!                  gradient) kept, and without (minimum ratio, overhead at
//!                  0.9, 0.7, 0.5)
//!   --metadata-ablation  every policy on the trace as recorded and with
//!                  the inputs of ops that read only their inputs' shape
//!                  (new_empty, ones_like...) left out (minimum ratio,
//!                  overhead at 0.9, 0.7, 0.5)
//!   --copy-ablation  every policy at every ratio of the sweep with a move
//!                  of a resident tensor charged as a device copy (the
//!                  default) and as a recomputation of its op: the moves,
//!                  their charge and the overhead each way where a tensor
//!                  moved, and whether every decision was the same
//!   --latency-ablation  search time of DTR, DTR with Coop's price cache
//!                  and Coop at 0.9 to 0.5 (median of 5 replays each)
//! ```
//! The ablations that switch one setting (all but --frag, --metadata,
//! --copy and --latency) print the steady minimum beside the bisected one
//! and the largest mean fragmentation over the sweep's ratios.
//! The same runs as `gpumalloc remat TRACE --budget R` / `--sweep`.

// The usage helper shared with host's examples (one file, included by path).
#[path = "../../lake/examples/common/usage.rs"]
mod usage;

use std::path::PathBuf;
use std::process::ExitCode;

use remat::compare::{
    borrow_ablation, chain_ablation, compact_ablation, copy_ablation, dead_ablation, frag_ablation,
    gap_ablation, held_ablation, hole_ablation, latency_ablation, memory_ablation, merge_ablation,
    metadata_ablation, min_ratios, moves_ablation, ranking_ablation, relocate_ablation,
    side_ablation, sweep, table,
};
use remat::sweep::{Command, run_command};
use remat::synth;
use remat::{Coop, RematResult, ReplayOptions, Trace, budget_for, replay};

const RATIOS: [f64; 6] = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4];

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("remat: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let (mut traces, mut budgets, mut do_sweep) = (Vec::new(), Vec::new(), false);
    let (mut do_ablation, mut do_latency, mut do_ranking) = (false, false, false);
    let (mut do_merge, mut do_dead, mut do_metadata) = (false, false, false);
    let (mut do_relocate, mut do_held, mut do_gap) = (false, false, false);
    let (mut do_side, mut do_borrow) = (false, false);
    let (mut do_compact, mut do_copy, mut do_moves) = (false, false, false);
    let (mut do_hole, mut do_chain, mut do_frag) = (false, false, false);
    let (mut out, mut step) = (PathBuf::from("results/remat"), 0.05);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |what: &str| args.next().ok_or(format!("{a} needs {what}"));
        let number = |s: String| s.parse::<f64>().map_err(|e| format!("{a} {s:?}: {e}"));
        match a.as_str() {
            "--budget" => budgets.push(number(value("a ratio")?)?),
            "--sweep" => do_sweep = true,
            "--memory-ablation" => do_ablation = true,
            "--latency-ablation" => do_latency = true,
            "--ranking-ablation" => do_ranking = true,
            "--merge-ablation" => do_merge = true,
            "--dead-ablation" => do_dead = true,
            "--metadata-ablation" => do_metadata = true,
            "--relocate-ablation" => do_relocate = true,
            "--held-ablation" => do_held = true,
            "--gap-ablation" => do_gap = true,
            "--hole-ablation" => do_hole = true,
            "--frag-ablation" => do_frag = true,
            "--side-ablation" => do_side = true,
            "--borrow-ablation" => do_borrow = true,
            "--compact-ablation" => do_compact = true,
            "--moves-ablation" => do_moves = true,
            "--chain-ablation" => do_chain = true,
            "--copy-ablation" => do_copy = true,
            "--step" => step = number(value("a ratio step")?)?,
            "--out" => out = PathBuf::from(value("a folder")?),
            "-h" | "--help" => {
                println!("{}", usage::from_module_doc(include_str!("remat.rs")));
                return Ok(());
            }
            flag if flag.starts_with("--") => return Err(format!("unknown option {flag}")),
            path => traces.push(PathBuf::from(path)),
        }
    }
    if traces.is_empty() {
        return synthetic().map_err(|e| e.to_string());
    }
    let ablations = [
        do_ablation,
        do_latency,
        do_ranking,
        do_merge,
        do_dead,
        do_metadata,
        do_relocate,
        do_held,
        do_gap,
        do_hole,
        do_chain,
        do_frag,
        do_side,
        do_borrow,
        do_compact,
        do_copy,
        do_moves,
    ];
    if ablations.iter().any(|&on| on) {
        for path in &traces {
            let recorded = remat::Recorded::read(path).map_err(|e| e.to_string())?;
            if do_ablation {
                println!("{}\n{}", path.display(), memory_ablation(&recorded.trace));
            }
            if do_ranking {
                println!("{}\n{}", path.display(), ranking_ablation(&recorded.trace));
            }
            if do_merge {
                println!("{}\n{}", path.display(), merge_ablation(&recorded.trace));
            }
            if do_dead {
                println!("{}\n{}", path.display(), dead_ablation(&recorded.trace));
            }
            if do_relocate {
                println!("{}\n{}", path.display(), relocate_ablation(&recorded.trace));
            }
            if do_held {
                println!("{}\n{}", path.display(), held_ablation(&recorded.trace));
            }
            if do_gap {
                println!("{}\n{}", path.display(), gap_ablation(&recorded.trace));
            }
            if do_hole {
                println!("{}\n{}", path.display(), hole_ablation(&recorded.trace));
            }
            if do_chain {
                println!("{}\n{}", path.display(), chain_ablation(&recorded.trace));
            }
            if do_frag {
                println!("{}\n{}", path.display(), frag_ablation(&recorded.trace));
            }
            if do_compact {
                println!("{}\n{}", path.display(), compact_ablation(&recorded.trace));
            }
            if do_moves {
                println!("{}\n{}", path.display(), moves_ablation(&recorded.trace));
            }
            if do_side {
                println!("{}\n{}", path.display(), side_ablation(&recorded.trace));
            }
            if do_borrow {
                println!("{}\n{}", path.display(), borrow_ablation(&recorded.trace));
            }
            if do_copy {
                println!("{}\n{}", path.display(), copy_ablation(&recorded.trace));
            }
            if do_metadata {
                println!("{}\n{}", path.display(), metadata_ablation(&recorded));
            }
            if do_latency {
                println!(
                    "{}\n{}",
                    path.display(),
                    latency_ablation(&recorded.trace, 5)
                );
            }
        }
        return Ok(());
    }
    if budgets.is_empty() && !do_sweep {
        budgets.push(0.5);
    }
    for trace in traces {
        run_command(&Command {
            trace,
            budgets: budgets.clone(),
            sweep_dir: do_sweep.then(|| out.clone()),
            step,
        })?;
    }
    Ok(())
}

fn synthetic() -> RematResult<()> {
    let traces: [(&str, Trace); 2] = [
        (
            "transformer-like, 8 layers, 8 MiB hidden, seed 1",
            synth::transformer(8, 8, 1)?,
        ),
        (
            "ResNet-like, 4 stages x 3 blocks, 64 MiB stem, seed 2",
            synth::resnet(4, 3, 64, 2)?,
        ),
    ];
    for (name, trace) in &traces {
        let peak = trace.peak_live_bytes() as f64 / (1 << 20) as f64;
        let title = format!("{name}: {} ops, peak {peak:.0} MiB", trace.ops.len());
        println!("{}", table(&title, &sweep(trace, &RATIOS)));
        for (policy, ratio) in min_ratios(trace) {
            match ratio {
                Some(r) => println!("  minimum budget ratio {policy:>4}: {r:.3}"),
                None => println!("  minimum budget ratio {policy:>4}: does not finish at 1.2"),
            }
        }
        ablation(trace);
        println!();
    }
    Ok(())
}
/// Coop with each of its two layout modules switched off.
fn ablation(trace: &Trace) {
    println!("  Coop ablation (overhead / mean fragmentation / evictions):");
    for ratio in [0.7, 0.5] {
        let mut line = format!("  {ratio:.1}");
        for (label, partition, in_place) in [
            ("full", true, true),
            ("no partition", false, true),
            ("no in-place", true, false),
            ("window only", false, false),
        ] {
            let mut coop = Coop {
                partition,
                in_place,
                ..Coop::default()
            };
            let r = replay(
                trace,
                budget_for(trace, ratio),
                &mut coop,
                ReplayOptions::default(),
            );
            let done = if r.finished() { "" } else { " OOM" };
            line += &format!(
                "  {label}: {:.1}%/{:.1}%/{}{done}",
                100.0 * r.overhead(),
                100.0 * r.fragmentation_mean(),
                r.evictions
            );
        }
        println!("{line}");
    }
}
