//! Synthesizes a STWeaver-style allocation plan from a trace, prints its
//! summary, and replays the trace through the planned arena
//! (see `lake::plan`).
//!
//! ```text
//! cargo run -p lake --release --example plan -- TRACE[.gz] [OPTIONS]
//!   -o PLAN             write the plan file
//!   --iterations K      profiled iterations (3)
//!   --warmup N          steps planned as recorded before them (1)
//!   --phases N          timeline spans for HomoPhase groups (32)
//!   --no-fuse           no fusion of HomoPhase groups
//!   --no-dynamic-slots  leave dynamic requests to the idle space
//!   --headroom PCT      dynamic slots PCT percent over their largest size (0)
//!   --png PATH          a picture of the plan (address up, time right;
//!                       static blue, dynamic orange), 1600 × 900
//!   --csv PATH          placed requests as CSV (start,end,offset,size,
//!                       dynamic), for plotting address over time
//!   --replay TRACE      replay this trace instead of the profiled one
//!   --pool              also replay through the planned pool (arena in the
//!                       lake, fallbacks to the stream pool; CPU model)
//! ```
//!
//! A TRACE of the form `synthetic:BATCH:STEPS:SEED` is the synthetic GPT-2
//! trace (`lake::synthetic`) of that shape: a plan made from one seed
//! and replayed on another shows how it serves sequence lengths it never
//! saw.

#[path = "common/usage.rs"]
mod usage;

use std::io::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

use lake::Trace;
use lake::plan::{Plan, Profile, ProfileConfig, SynthConfig, runtime};
use lake::pluggable::replay;
use lake::synthetic::{Gpt2Shape, gpt2_trace};

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("plan: {e}");
            ExitCode::FAILURE
        }
    }
}

/// A trace file, or `synthetic:BATCH:STEPS:SEED`.
fn load(path: &str) -> Result<Trace, String> {
    let Some(spec) = path.strip_prefix("synthetic:") else {
        return replay::load(path.as_ref()).map_err(|e| format!("{path}: {e}"));
    };
    let n: Vec<u64> = spec
        .split(':')
        .map(|v| v.parse::<u64>().map_err(|e| format!("{path}: {v:?}: {e}")))
        .collect::<Result<_, _>>()?;
    let [batch, steps, seed] = n[..] else {
        return Err(format!("{path}: expected synthetic:BATCH:STEPS:SEED"));
    };
    let steps = u32::try_from(steps).map_err(|e| format!("{path}: {e}"))?;
    Ok(gpt2_trace(Gpt2Shape { batch, steps, seed }))
}

fn run() -> Result<(), String> {
    let mut trace_path: Option<String> = None;
    let mut replay_path: Option<String> = None;
    let mut out: Option<PathBuf> = None;
    let mut csv: Option<PathBuf> = None;
    let mut png: Option<PathBuf> = None;
    let mut through_pool = false;
    let mut pconf = ProfileConfig::default();
    let mut sconf = SynthConfig::default();
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut value = |what: &str| args.next().ok_or(format!("{a} needs {what}"));
        let count = |v: String| v.parse::<usize>().map_err(|e| format!("{v:?}: {e}"));
        match a.as_str() {
            "-o" => out = Some(PathBuf::from(value("a path")?)),
            "--csv" => csv = Some(PathBuf::from(value("a path")?)),
            "--png" => png = Some(PathBuf::from(value("a path")?)),
            "--replay" => replay_path = Some(value("a trace")?),
            "--iterations" => pconf.iterations = count(value("a count")?)?,
            "--warmup" => pconf.warmup_steps = count(value("a count")?)?,
            "--phases" => sconf.phases = count(value("a count")?)? as u64,
            "--no-fuse" => sconf.fuse = false,
            "--pool" => through_pool = true,
            "--no-dynamic-slots" => sconf.plan_dynamic = false,
            "--headroom" => sconf.dynamic_headroom_pct = count(value("a percent")?)? as u64,
            "-h" | "--help" => {
                println!("{}", usage::from_module_doc(include_str!("plan.rs")));
                return Ok(());
            }
            path if trace_path.is_none() => trace_path = Some(path.to_string()),
            other => return Err(format!("unexpected argument {other:?}; --help says more")),
        }
    }
    let path = trace_path.ok_or("no trace given; --help says more")?;
    let trace = load(&path)?;
    let profile = Profile::of(&trace, &pconf);
    let plan = Plan::synthesize(&profile, &sconf);
    plan.check()
        .map_err(|e| format!("plan check failed: {e}"))?;
    println!(
        "== {path}: {} records, {} steps",
        trace.events.len(),
        profile.trace_steps
    );
    print!("{}", plan.summary());
    if let Some(o) = &out {
        plan.save(o).map_err(|e| format!("{}: {e}", o.display()))?;
        let back = Plan::load(o).map_err(|e| format!("{}: {e}", o.display()))?;
        if back.requests != plan.requests || back.arena != plan.arena {
            return Err(format!(
                "{}: read back differs from what was written",
                o.display()
            ));
        }
        println!("wrote {}", o.display());
    }
    if let Some(p) = &png {
        std::fs::write(p, plan.to_png(1600, 900)).map_err(|e| format!("{}: {e}", p.display()))?;
        println!("drew {}", p.display());
    }
    if let Some(c) = &csv {
        let mut f = std::fs::File::create(c).map_err(|e| format!("{}: {e}", c.display()))?;
        let mut text = String::from("start,end,offset,size,dynamic\n");
        for p in &plan.requests {
            if let Some(off) = p.offset {
                for (s, e) in p.request.life.spans() {
                    text.push_str(&format!(
                        "{s},{e},{off},{},{}\n",
                        p.request.size, p.request.dynamic as u8
                    ));
                }
            }
        }
        f.write_all(text.as_bytes())
            .map_err(|e| format!("{}: {e}", c.display()))?;
    }
    let (name, target) = match &replay_path {
        Some(r) => (r.clone(), load(r)?),
        None => (path.clone(), trace),
    };
    let started = std::time::Instant::now();
    let r = runtime::replay(&plan, &target);
    let replay_ns = started.elapsed().as_nanos() as f64 / target.events.len().max(1) as f64;
    let s = r.stats;
    let mib = |b: u64| b as f64 / (1u64 << 20) as f64;
    println!(
        "replay of {name} ({} steps): peak live {:.1} MiB, reserved {:.1} MiB (arena {:.1}), efficiency {:.4}",
        r.steps,
        mib(r.peak_live),
        mib(r.reserved),
        mib(r.arena),
        r.efficiency()
    );
    println!(
        "  plan hits {}, dynamic in slot {}, dynamic in idle space {}, fallbacks {} ({} unmatched)",
        s.plan_hits, s.dynamic_slot, s.dynamic_idle, s.fallbacks, s.unmatched
    );
    println!(
        "  replay CPU time {replay_ns:.0} ns per alloc or free (this machine, trace bookkeeping included)"
    );
    if through_pool {
        let started = std::time::Instant::now();
        let r = lake::plan::pool::replay(&plan, &target, 80 << 30)?;
        let s = r.stats;
        println!(
            "planned pool (model driver, lake of 80 GiB): peak live {:.1} MiB, peak reserved {:.1} MiB, efficiency {:.4}; plan hits {}, dynamic {} + {}, fallbacks {}; {:.2} s",
            mib(r.peak_live),
            mib(r.peak_reserved),
            r.efficiency(),
            s.plan_hits,
            s.dynamic_slot,
            s.dynamic_idle,
            s.fallbacks,
            started.elapsed().as_secs_f64()
        );
    }
    Ok(())
}
