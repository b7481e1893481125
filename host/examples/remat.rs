//! Compares DTR, DTE and Coop on the seeded synthetic traces of
//! `host::remat::synth` (a transformer-like and a ResNet-like training step):
//! overhead, fragmentation, evictions and search latency at several budget
//! ratios, each policy's minimum budget ratio (bisection), and an ablation of
//! Coop's cheap-tensor partitioning and recomputable in-place.
//!
//! ```text
//! cargo run -p host --release --example remat
//! ```

use host::remat::compare::{min_ratios, sweep, table};
use host::remat::synth;
use host::remat::{Coop, RematResult, ReplayOptions, Trace, budget_for, replay};

const RATIOS: [f64; 6] = [0.9, 0.8, 0.7, 0.6, 0.5, 0.4];

fn main() -> RematResult<()> {
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
