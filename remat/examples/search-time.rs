//! Search time of Coop and DTR alone, per evicting allocation, over the
//! sweep's ratios: a steadier A/B harness than whole sweeps on a shared
//! machine (only the replays whose searches are timed, each repeated, the
//! policies alternating), for comparing two builds of Coop's search.
//!
//! ```text
//! cargo run -p remat --release --example search-time -- TRACE.remat.gz... [--reps N] [--coop-only]
//! ```
//! `--coop-only` replays Coop alone (for a profiler; no ratios printed).
//! Per trace and ratio (0.9 down by 0.05 to 0.3, those where both policies
//! finish, as `scripts/remat-latency.py` counts them): the median over N
//! replays (5) of each policy's mean search time per evicting allocation,
//! and DTR's over Coop's; then the median of that ratio over the ratios.
//! Prints Coop's evictions too, which must not change between builds.

use std::path::PathBuf;
use std::process::ExitCode;

use remat::{Coop, Dtr, EvictionPolicy, Recorded, ReplayOptions, Report, budget_for, replay};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("search-time: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let (mut traces, mut reps, mut coop_only) = (Vec::new(), 5usize, false);
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        match a.as_str() {
            "--reps" => {
                let n = args.next().ok_or("--reps needs a count")?;
                reps = n.parse().map_err(|e| format!("--reps {n:?}: {e}"))?;
            }
            "--coop-only" => coop_only = true,
            path => traces.push(PathBuf::from(path)),
        }
    }
    for path in &traces {
        let recorded = Recorded::read(path).map_err(|e| e.to_string())?;
        println!("{}", path.display());
        if coop_only {
            coop_alone(&recorded.trace, reps.max(1));
        } else {
            time_trace(&recorded.trace, reps.max(1));
        }
    }
    Ok(())
}

/// One replay's mean search time per evicting allocation (µs), evictions,
/// and whether it finished.
fn once(trace: &remat::Trace, ratio: f64, policy: &mut dyn EvictionPolicy) -> (f64, usize, bool) {
    let report: Report = replay(
        trace,
        budget_for(trace, ratio),
        policy,
        ReplayOptions::default(),
    );
    (
        report.search_us_mean(),
        report.evictions,
        report.error.is_none(),
    )
}

/// Coop's replays alone at 0.9 down to 0.4, `reps` times each.
fn coop_alone(trace: &remat::Trace, reps: usize) {
    for k in 0..=10 {
        let ratio = 0.9 - 0.05 * k as f64;
        for _ in 0..reps {
            once(trace, ratio, &mut Coop::default());
        }
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

fn time_trace(trace: &remat::Trace, reps: usize) {
    println!("| ratio | Coop µs | DTR µs | DTR / Coop | Coop evictions |");
    println!("| --- | --- | --- | --- | --- |");
    let mut ratios_of = Vec::new();
    for k in 0..=12 {
        let ratio = 0.9 - 0.05 * k as f64;
        let (mut coop, mut dtr) = (Vec::new(), Vec::new());
        let (mut evictions, mut finished) = (0, true);
        // Alternating, so that a noisy stretch of the machine hits both.
        for _ in 0..reps {
            let (us, ev, done) = once(trace, ratio, &mut Coop::default());
            coop.push(us);
            evictions = ev;
            let (us, _, dtr_done) = once(trace, ratio, &mut Dtr::default());
            dtr.push(us);
            finished = done && dtr_done;
        }
        if !finished {
            continue;
        }
        let (c, d) = (median(coop), median(dtr));
        ratios_of.push(d / c);
        println!(
            "| {ratio:.2} | {c:.2} | {d:.2} | {:.1}× | {evictions} |",
            d / c
        );
    }
    if !ratios_of.is_empty() {
        println!("median DTR / Coop: {:.1}×", median(ratios_of));
    }
}
