//! Replays allocation traces through the pluggable pool on the CPU model
//! driver and prints efficiency, the reserved breakdown at its peak, and
//! driver calls per step (see `lake::pluggable::replay`).
//!
//! ```text
//! cargo run -p lake --release --example replay -- [OPTIONS] TRACE[.gz]...
//!   --events at-once|step|ops:N   event completion (repeatable; default:
//!                                 at-once, step and ops:2000)
//!   --cost name=µs[+µs/chunk],... call costs over the H100 defaults; names:
//!                                 reserve, free_address, create, release,
//!                                 map, unmap, set_access, event
//!   --warmup N                    steps left out of per-step averages (2)
//!   --limit-gib G                 the lake's limit (80)
//!   --max-stitch N                the lake's max_stitch_chunks (unlimited)
//!   --max-cached N                the lake's max_cached_stitched (256)
//!   --reuse N                     entries of the pool's reuse cache (0: off,
//!                                 the default)
//!   --evict-mib N                 touch N MiB of other memory between pool
//!                                 calls (cold caches, as in training)
//!   --chunk-mib N                 chunk size of the lake (the trace's, 2);
//!                                 costs follow unless --cost comes later
//!   --synthetic BATCH[:STEPS]     replay a synthetic GPT-2 trace instead
//!   --save PATH.gz                write the (first) trace
//!   --loop STEPS                  also replay each trace lengthened to
//!                                 STEPS steps drawn from its later ones
//! ```

#[path = "common/usage.rs"]
mod usage;

use std::path::PathBuf;
use std::process::ExitCode;

use lake::pluggable::replay::{self, CostModel, EventTiming, ReplayConfig};
use lake::synthetic::{Gpt2Shape, gpt2_trace};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("replay: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), String> {
    let mut timings = Vec::new();
    let mut config = ReplayConfig::default();
    let mut traces: Vec<(String, lake::Trace)> = Vec::new();
    let mut save: Option<PathBuf> = None;
    let mut loop_steps: Option<u32> = None;
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |what: &str| args.next().ok_or(format!("{a} needs {what}"));
        match a.as_str() {
            "--events" => timings.push(value("a timing")?.parse::<EventTiming>()?),
            "--cost" => config.cost = CostModel::parse(&value("costs")?)?,
            "--warmup" => {
                config.warmup_steps = value("a count")?.parse().map_err(|e| format!("{e}"))?
            }
            "--limit-gib" => {
                let g: f64 = value("GiB")?.parse().map_err(|e| format!("{e}"))?;
                config.limit_bytes = (g * (1u64 << 30) as f64) as u64;
            }
            "--max-stitch" => {
                config.max_stitch_chunks = value("chunks")?.parse().map_err(|e| format!("{e}"))?
            }
            "--max-cached" => {
                config.max_cached_stitched = value("views")?.parse().map_err(|e| format!("{e}"))?
            }
            "--reuse" => {
                config.reuse_entries = value("entries")?.parse().map_err(|e| format!("{e}"))?
            }
            "--evict-mib" => {
                let mib: usize = value("MiB")?.parse().map_err(|e| format!("{e}"))?;
                config.evict_bytes = mib << 20;
            }
            "--chunk-mib" => {
                let mib: u64 = value("MiB")?.parse().map_err(|e| format!("{e}"))?;
                if !mib.is_power_of_two() || mib < 2 {
                    return Err(format!("--chunk-mib {mib}: a power of two, at least 2"));
                }
                config.chunk_bytes = Some(mib << 20);
                config.cost = CostModel::h100(mib << 20);
            }
            "--synthetic" => {
                let spec = value("BATCH[:STEPS]")?;
                let (b, s) = spec.split_once(':').unwrap_or((&spec, "6"));
                let shape = Gpt2Shape {
                    batch: b.parse().map_err(|e| format!("batch {b:?}: {e}"))?,
                    steps: s.parse().map_err(|e| format!("steps {s:?}: {e}"))?,
                    seed: 7,
                };
                traces.push((format!("synthetic GPT-2 batch {b}"), gpt2_trace(shape)));
            }
            "--save" => save = Some(PathBuf::from(value("a path")?)),
            "--loop" => loop_steps = Some(value("steps")?.parse().map_err(|e| format!("{e}"))?),
            "-h" | "--help" => {
                println!("{}", usage::from_module_doc(include_str!("replay.rs")));
                return Ok(());
            }
            path => {
                let t = replay::load(path.as_ref()).map_err(|e| format!("{path}: {e}"))?;
                traces.push((path.to_string(), t));
            }
        }
    }
    if traces.is_empty() {
        return Err("no trace given (a path, or --synthetic BATCH); --help says more".into());
    }
    if let Some(steps) = loop_steps {
        let longer: Vec<(String, lake::Trace)> = traces
            .iter()
            .map(|(name, t)| {
                replay::looped(t, steps, 11)
                    .map(|l| (format!("{name} looped to {steps} steps"), l))
                    .map_err(|e| format!("{name}: {e}"))
            })
            .collect::<Result<_, _>>()?;
        traces.extend(longer);
    }
    if let Some(path) = save {
        replay::save_gz(&traces[0].1, &path).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    if timings.is_empty() {
        timings = vec![
            EventTiming::AtOnce,
            EventTiming::AtStepEnd,
            EventTiming::AfterOps(2000),
        ];
    }
    for (name, trace) in &traces {
        println!("== {name}: {} records", trace.events.len());
        for &timing in &timings {
            let report = replay::replay(trace, &ReplayConfig { timing, ..config })
                .map_err(|e| format!("{name}: {e}"))?;
            print!("{}", report.render());
        }
    }
    Ok(())
}
