//! What `gpumalloc remat TRACE` (and the `remat` example) prints and writes:
//! one budget ratio for the policies (DTR, DTE, Coop, Coop-G), or a sweep
//! from 0.9 down to the lowest ratio any policy finishes at (found by
//! bisection first), written as CSV and as a PNG of compute overhead against
//! budget ratio, like the Coop paper's figures. Plain functions; no shared state.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use super::compare::{all_policies, min_ratios, steady_min_ratios, sweep, table};
use super::executor::Report;
use super::plot::{Series, line_chart};
use super::trace::Trace;

/// Where a sweep starts.
pub const TOP_RATIO: f64 = 0.9;

/// A line saying what a trace holds: ops, tensors, peak, pinned bytes, time.
pub fn summary(trace: &Trace) -> String {
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    // An in-place op's first output is a new version of bytes already
    // counted, so only the other outputs add pinned bytes.
    let pinned: u64 = trace
        .ops
        .iter()
        .flat_map(|op| op.outputs.iter().skip(usize::from(op.in_place)))
        .filter(|o| o.pinned)
        .map(|o| o.size)
        .sum();
    let peak = trace.peak_live_bytes();
    format!(
        "{} ops, {} tensors, peak {:.1} MiB, pinned {:.1} MiB ({:.0}% of peak), cost {:.3} s",
        trace.ops.len(),
        trace.tensor_count(),
        mib(peak),
        mib(pinned),
        100.0 * pinned as f64 / peak.max(1) as f64,
        trace.total_cost() / 1e9
    )
}

/// The policies at one budget ratio, as a table.
pub fn at_ratio(trace: &Trace, ratio: f64) -> String {
    table(&format!("budget ratio {ratio}"), &sweep(trace, &[ratio]))
}

/// The ratios of a sweep: `TOP_RATIO` down in steps of `step` while not
/// below `lowest`, then `lowest` itself.
pub fn ratios_down_to(lowest: f64, step: f64) -> Vec<f64> {
    let mut ratios = Vec::new();
    let mut k = 0;
    loop {
        // Computed from the step count so that 0.9 - 0.05k prints exactly.
        let ratio = ((TOP_RATIO - step * k as f64) * 1000.0).round() / 1000.0;
        if ratio < lowest - 1e-9 || ratio <= 0.0 {
            break;
        }
        ratios.push(ratio);
        k += 1;
    }
    if ratios.last().is_none_or(|&r| r - lowest > 1e-9) && lowest > 0.0 {
        ratios.push(lowest);
    }
    ratios
}

/// A sweep's results.
#[derive(Debug, Clone)]
pub struct Sweep {
    /// Each policy's minimum budget ratio (bisection), `None` when it does
    /// not finish at 1.2.
    pub min_ratios: Vec<(&'static str, Option<f64>)>,
    /// Each policy's steady minimum ratio (`steady_min_ratio`: it finishes
    /// at every 0.005 from 1.0 down to it), `None` when it fails at 1.0.
    pub steady_min_ratios: Vec<(&'static str, Option<f64>)>,
    /// One row per ratio per policy.
    pub rows: Vec<(f64, Report)>,
}

/// Bisects each policy's minimum ratio and scans for its steady minimum,
/// then replays every policy at every ratio from 0.9 down to the lowest
/// bisected minimum.
pub fn run(trace: &Trace, step: f64) -> Sweep {
    let min_ratios = min_ratios(trace);
    let lowest = min_ratios
        .iter()
        .filter_map(|&(_, r)| r)
        .fold(f64::INFINITY, f64::min);
    let ratios = ratios_down_to(
        if lowest.is_finite() {
            lowest
        } else {
            TOP_RATIO
        },
        step,
    );
    Sweep {
        rows: sweep(trace, &ratios),
        min_ratios,
        steady_min_ratios: steady_min_ratios(trace),
    }
}

impl Sweep {
    /// The lowest ratio of the sweep at which `policy` finished. Finishing is
    /// not monotone in the budget, so this can lie below the bisected minimum.
    pub fn lowest_finished(&self, policy: &str) -> Option<f64> {
        self.rows
            .iter()
            .filter(|(_, r)| r.policy == policy && r.finished())
            .map(|(ratio, _)| *ratio)
            .reduce(f64::min)
    }

    /// The bisected minimum ratio of `policy`, if it finishes at 1.2.
    pub fn min(&self, policy: &str) -> Option<f64> {
        ratio_of(&self.min_ratios, policy)
    }

    /// The steady minimum ratio of `policy`, if it finishes at 1.0.
    pub fn steady_min(&self, policy: &str) -> Option<f64> {
        ratio_of(&self.steady_min_ratios, policy)
    }

    /// The rows as a table, then the minimum ratios.
    pub fn text(&self, title: &str) -> String {
        let mut out = table(title, &self.rows);
        for (policy, ratio) in &self.min_ratios {
            let _ = match ratio {
                Some(r) => write!(out, "minimum budget ratio {policy:>6}: {r:.3} (bisection)"),
                None => write!(
                    out,
                    "minimum budget ratio {policy:>6}: does not finish at 1.2"
                ),
            };
            let _ = match self.lowest_finished(policy) {
                Some(r) => write!(out, "; lowest finished in the sweep {r:.3}"),
                None => Ok(()),
            };
            let _ = match self.steady_min(policy) {
                Some(r) => writeln!(out, "; steady {r:.3}"),
                None => writeln!(out, "; fails at 1.0"),
            };
        }
        out
    }

    /// CSV, one row per ratio per policy; `min_ratio` (the policy's bisected
    /// minimum), `lowest_finished` and `steady_min_ratio` repeat on each of
    /// its rows.
    pub fn csv(&self) -> String {
        let mut out = String::from(
            "ratio,policy,budget_bytes,finished,ops_done,overhead,fragmentation_mean,\
             fragmentation_max,evictions,recomputations,search_us_per_evicting_alloc,\
             search_us_per_eviction,min_ratio,lowest_finished,steady_min_ratio\n",
        );
        for (ratio, r) in &self.rows {
            let min = self
                .min(r.policy)
                .map_or(String::new(), |m| format!("{m:.4}"));
            let lowest = self
                .lowest_finished(r.policy)
                .map_or(String::new(), |l| format!("{l:.4}"));
            let steady = self
                .steady_min(r.policy)
                .map_or(String::new(), |s| format!("{s:.4}"));
            let search_total: u64 = r.search_ns.iter().sum();
            let per_eviction = search_total as f64 / 1e3 / r.evictions.max(1) as f64;
            let _ = writeln!(
                out,
                "{ratio:.4},{},{},{},{},{:.6},{:.6},{:.6},{},{},{:.3},{:.3},{min},{lowest},{steady}",
                r.policy,
                r.budget,
                r.finished(),
                r.ops_done,
                r.overhead(),
                r.fragmentation_mean(),
                r.fragmentation_max(),
                r.evictions,
                r.recomputations,
                r.search_us_mean(),
                per_eviction
            );
        }
        out
    }

    /// Compute overhead (%) against budget ratio, one line per policy over
    /// the ratios at which it finished.
    pub fn png(&self, width: u32, height: u32) -> Vec<u8> {
        let series: Vec<Series> = all_policies()
            .into_iter()
            .map(|(name, _)| Series {
                name,
                points: self
                    .rows
                    .iter()
                    .filter(|(_, r)| r.policy == name && r.finished())
                    .map(|(ratio, r)| (*ratio, 100.0 * r.overhead()))
                    .collect(),
            })
            .collect();
        line_chart(&series, width, height)
    }

    /// Writes `NAME.sweep.csv`, `NAME.overhead.png` and `NAME.sweep.txt`
    /// into `dir`; returns their paths.
    pub fn write(&self, dir: &Path, name: &str, title: &str) -> std::io::Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir)?;
        let files = [
            (format!("{name}.sweep.csv"), self.csv().into_bytes()),
            (format!("{name}.overhead.png"), self.png(800, 500)),
            (format!("{name}.sweep.txt"), self.text(title).into_bytes()),
        ];
        let mut paths = Vec::new();
        for (file, bytes) in files {
            let path = dir.join(file);
            std::fs::write(&path, bytes)?;
            paths.push(path);
        }
        Ok(paths)
    }
}

/// The ratio `policy` has in a list of per-policy ratios.
fn ratio_of(ratios: &[(&'static str, Option<f64>)], policy: &str) -> Option<f64> {
    ratios
        .iter()
        .find(|(p, _)| *p == policy)
        .and_then(|(_, m)| *m)
}

/// What `gpumalloc remat` was asked to do with one trace.
#[derive(Debug, Clone)]
pub struct Command {
    /// The recorded trace (`python/remat/record.py`).
    pub trace: PathBuf,
    /// Budget ratios to replay the policies at.
    pub budgets: Vec<f64>,
    /// Sweep from 0.9 down to the lowest minimum ratio, writing the files
    /// into this folder.
    pub sweep_dir: Option<PathBuf>,
    /// Ratio step of the sweep.
    pub step: f64,
}

/// Runs a [`Command`], printing as it goes.
pub fn run_command(command: &Command) -> Result<(), String> {
    let recorded = super::recorded::Recorded::read(&command.trace).map_err(|e| e.to_string())?;
    let trace = &recorded.trace;
    let name = trace_name(&command.trace);
    let config = recorded.meta("config").unwrap_or("");
    let mut title = format!("{name} ({config}): {}", summary(trace));
    if let Some(bytes) = recorded
        .meta("peak_allocated")
        .and_then(|p| p.parse::<f64>().ok())
    {
        let _ = write!(
            title,
            "; PyTorch's peak allocated {:.1} MiB",
            bytes / (1u64 << 20) as f64
        );
    }
    if command.sweep_dir.is_none() || !command.budgets.is_empty() {
        println!("{title}");
    }
    for &ratio in &command.budgets {
        println!("{}", at_ratio(trace, ratio));
    }
    if let Some(dir) = &command.sweep_dir {
        let sweep = run(trace, command.step);
        print!("{}", sweep.text(&title));
        let files = sweep
            .write(dir, &name, &title)
            .map_err(|e| format!("{}: {e}", dir.display()))?;
        for f in files {
            println!("wrote {}", f.display());
        }
    }
    Ok(())
}

/// A trace's file name without `.gz`, `.remat` or `.txt`.
pub fn trace_name(path: &Path) -> String {
    let mut name = path
        .file_name()
        .map_or_else(|| "trace".to_string(), |n| n.to_string_lossy().into_owned());
    for suffix in [".gz", ".txt", ".remat"] {
        if let Some(stem) = name.strip_suffix(suffix) {
            name = stem.to_string();
        }
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ratios_run_from_the_top_down_to_the_lowest_minimum() {
        assert_eq!(ratios_down_to(0.72, 0.05), [0.9, 0.85, 0.8, 0.75, 0.72]);
        assert_eq!(ratios_down_to(0.8, 0.05), [0.9, 0.85, 0.8]);
        assert_eq!(
            ratios_down_to(0.95, 0.05),
            [0.95],
            "above the top: just the minimum"
        );
        assert_eq!(trace_name(Path::new("traces/gpt2.remat.gz")), "gpt2");
    }
}
