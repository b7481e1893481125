//! Records of a benchmark run and how they are written: a summary table on
//! stdout, one CSV per test, and a JSON file holding the run's description
//! (GPU, driver, heap size, command line) with every record.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io;
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::measure::Summary;

/// Where and how a run was made.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunInfo {
    /// "gpu" or "cpu".
    pub device: String,
    /// The GPU's (or CPU's) name.
    pub device_name: String,
    /// The driver's CUDA version ("" on the CPU).
    pub driver: String,
    /// Heap bytes given to every allocator.
    pub heap_bytes: u64,
    /// The exact command line.
    pub command: String,
    /// Seconds since the Unix epoch when the run started.
    pub started: u64,
}

/// One measured quantity.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Record {
    /// The test (`single`, `mixed`, …).
    pub test: String,
    /// The allocator.
    pub allocator: String,
    /// Bytes per allocation (0 for mixed sizes).
    pub size: u64,
    /// A label for the size ("256", "16-4096").
    pub size_label: String,
    /// Threads.
    pub threads: u64,
    /// What was measured (`alloc_ms`, `free_ms`, `fragmentation`, …).
    pub metric: String,
    /// Median of the samples.
    pub median: f64,
    /// Smallest sample.
    pub min: f64,
    /// Largest sample.
    pub max: f64,
    /// Number of samples.
    pub samples: usize,
    /// False when a check failed (a null while memory sufficed, or a wrong
    /// value): the numbers are then not a valid measurement.
    pub valid: bool,
    /// Why invalid, or anything else a reader needs.
    pub note: String,
}

impl Record {
    /// A record of `summary`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        test: &str,
        allocator: &str,
        size: u64,
        size_label: &str,
        threads: u64,
        metric: &str,
        summary: Summary,
        valid: bool,
        note: String,
    ) -> Record {
        Record {
            test: test.into(),
            allocator: allocator.into(),
            size,
            size_label: size_label.into(),
            threads,
            metric: metric.into(),
            median: summary.median,
            min: summary.min,
            max: summary.max,
            samples: summary.samples,
            valid,
            note,
        }
    }
}

/// Results of one test (or of several merged).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Results {
    /// The run.
    pub info: RunInfo,
    /// The records.
    pub records: Vec<Record>,
}

impl Results {
    /// Writes `<name>.json` and `<name>.csv` into `dir`.
    pub fn write(&self, dir: &Path, name: &str) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let json = serde_json::to_string_pretty(self).map_err(io::Error::other)?;
        std::fs::write(dir.join(format!("{name}.json")), json)?;
        std::fs::write(dir.join(format!("{name}.csv")), self.csv())
    }

    /// Reads `<name>.json` from `dir`.
    pub fn read(dir: &Path, name: &str) -> io::Result<Results> {
        let text = std::fs::read_to_string(dir.join(format!("{name}.json")))?;
        serde_json::from_str(&text).map_err(io::Error::other)
    }

    /// The records as CSV, preceded by `#` lines describing the run.
    pub fn csv(&self) -> String {
        let i = &self.info;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "# device: {} ({}), driver {}",
            i.device, i.device_name, i.driver
        );
        let _ = writeln!(out, "# heap bytes: {}", i.heap_bytes);
        let _ = writeln!(out, "# command: {}", i.command);
        out.push_str(
            "test,allocator,size,size_label,threads,metric,median,min,max,samples,valid,note\n",
        );
        for r in &self.records {
            let _ = writeln!(
                out,
                "{},{},{},{},{},{},{},{},{},{},{},\"{}\"",
                r.test,
                r.allocator,
                r.size,
                r.size_label,
                r.threads,
                r.metric,
                r.median,
                r.min,
                r.max,
                r.samples,
                r.valid,
                r.note.replace('"', "'")
            );
        }
        out
    }

    /// A table per (test, metric): one row per size and thread count, one
    /// column per allocator, and our ratio to each other allocator (and
    /// `ours-sized/ours-vmm`, issue 13's comparison, when both ran).
    pub fn table(&self) -> String {
        let mut groups: BTreeMap<(String, String), Vec<&Record>> = BTreeMap::new();
        for r in &self.records {
            groups
                .entry((r.test.clone(), r.metric.clone()))
                .or_default()
                .push(r);
        }
        let mut out = String::new();
        for ((test, metric), records) in groups {
            let mut allocators: Vec<&str> = Vec::new();
            for r in &records {
                if !allocators.contains(&r.allocator.as_str()) {
                    allocators.push(&r.allocator);
                }
            }
            let _ = writeln!(out, "\n{test} — {metric} (median)");
            let mut header = format!("{:>14} {:>8}", "size", "threads");
            for a in &allocators {
                let _ = write!(header, " {a:>14}");
            }
            let has = |a: &str| allocators.contains(&a);
            let mut ratios: Vec<(&str, &str)> = allocators
                .iter()
                .filter(|a| has("ours") && **a != "ours")
                .map(|a| ("ours", *a))
                .collect();
            if has("ours-sized") && has("ours-vmm") {
                ratios.push(("ours-sized", "ours-vmm"));
            }
            // 16 wide as before, wider for a longer heading.
            let width = |a: &str, b: &str| (a.len() + b.len() + 1).max(16);
            for (a, b) in &ratios {
                let _ = write!(header, " {:>w$}", format!("{a}/{b}"), w = width(a, b));
            }
            let _ = writeln!(out, "{header}");
            let mut rows: BTreeMap<(u64, u64, String), BTreeMap<&str, &Record>> = BTreeMap::new();
            for r in &records {
                rows.entry((r.size, r.threads, r.size_label.clone()))
                    .or_default()
                    .insert(&r.allocator, r);
            }
            for ((_, threads, label), by) in rows {
                let mut line = format!("{label:>14} {threads:>8}");
                for a in &allocators {
                    let cell = match by.get(a) {
                        Some(r) if r.valid => format!("{:.4}", r.median),
                        Some(r) if r.samples == 0 => "skipped".to_string(),
                        Some(_) => "invalid".to_string(),
                        None => "-".to_string(),
                    };
                    let _ = write!(line, " {cell:>14}");
                }
                let valid = |a: &str| by.get(a).filter(|r| r.valid);
                for (a, b) in &ratios {
                    let cell = match (valid(a), valid(b)) {
                        (Some(x), Some(y)) if y.median > 0.0 => {
                            format!("{:.3}", x.median / y.median)
                        }
                        _ => "-".to_string(),
                    };
                    let _ = write!(line, " {cell:>w$}", w = width(a, b));
                }
                let _ = writeln!(out, "{line}");
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::{Record, Results};
    use crate::bench::measure::Summary;

    #[test]
    fn the_table_compares_the_sized_heap_with_the_vmm_heap() {
        let record = |allocator: &str, ms: f64| {
            let s = Summary::of(&[ms]);
            Record::new(
                "single",
                allocator,
                1024,
                "1024",
                8,
                "alloc_ms",
                s,
                true,
                "".into(),
            )
        };
        let results = Results {
            records: vec![
                record("ours", 1.0),
                record("ours-vmm", 2.0),
                record("ours-sized", 1.5),
            ],
            ..Results::default()
        };
        let table = results.table();
        let words = |needle: &str| -> Vec<String> {
            let line = table.lines().find(|l| l.contains(needle)).unwrap();
            line.split_whitespace().map(String::from).collect()
        };
        let header = words("size");
        let row = words("1024");
        assert_eq!(
            header[5..],
            ["ours/ours-vmm", "ours/ours-sized", "ours-sized/ours-vmm"],
            "{table}"
        );
        assert_eq!(row[5..], ["0.500", "0.667", "0.750"], "{table}");
    }
}
