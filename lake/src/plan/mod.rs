//! Planned allocation (STWeaver, Huang et al., "Reducing GPU Memory
//! Fragmentation via Spatio-Temporal Planning for Efficient Large-Scale
//! Model Training"): profile a few training iterations of an allocation
//! trace, synthesize offline where every request lives in one address
//! space, and serve a later run from that plan, falling back for what the
//! plan did not foresee.
//!
//! - [`profile`]: the trace cut into steps, a prologue (set-up and warm-up
//!   steps, planned as recorded) and a template iteration (K profiled steps
//!   overlaid request by request; a request is *static* when it has the same
//!   size and stream at the same allocation ordinal in every profiled step,
//!   else *dynamic*, planned at the largest size seen).
//! - [`synth`]: HomoPhase groups (same allocation and free phase) packed
//!   locally, fused by time–memory product, HomoSize layers for the rest,
//!   global placement in descending block height; the idle (dynamic
//!   reusable) space of the plan during any window.
//! - [`file`]: a versioned line-based plan file and its summary.
//! - [`png`]: a picture of the plan (address over time) as a PNG.
//! - [`runtime`]: [`runtime::PlannedArena`], which serves allocations by
//!   offset in one arena (planned offsets in order, best fit into idle
//!   planned space, fallback above the plan), and a trace replay through it.
//! - [`pool`]: a replay through the planned mode of the pluggable pool
//!   (`StreamPool::use_plan`, whose arena route is `pluggable::planned`:
//!   the arena is one lake range, fallbacks go to the stream pool) on the
//!   CPU model driver.
//!
//! Time is counted in trace events: position `i` is the `i`-th alloc or
//! free. The plan's timeline is the prologue (positions `0..P`) followed by
//! one template iteration (`P..P + E`); a template request freed in the next
//! iteration wraps around and holds two spans, the end of this iteration and
//! the start of it (where its previous instance still lives).
//!
//! Concurrency: plain values; a [`runtime::PlannedArena`] is used by one
//! thread at a time (`&mut self`).

pub mod file;
mod place;
pub mod png;
pub mod pool;
pub mod profile;
pub mod runtime;
pub mod synth;

pub use file::PlanFileError;
pub use profile::{Lifetime, Part, Profile, ProfileConfig, Request};
pub use runtime::{Placement, PlanReplay, PlannedArena, RuntimeStats};
pub use synth::{Plan, PlannedRequest, SynthConfig, SynthStats};

/// Every planned offset and size is a multiple of this (PyTorch rounds its
/// requests to 512 bytes, so recorded sizes usually are already).
pub const ALIGN: u64 = 512;

/// What [`synthesize_file`] made.
#[derive(Clone, Debug)]
pub struct Synthesized {
    /// The plan written.
    pub plan: Plan,
    /// Steps in the trace.
    pub trace_steps: usize,
    /// Seconds spent profiling and synthesizing (not reading or writing).
    pub seconds: f64,
}

/// Reads the trace at `trace_path` (the pool's recording, plain or
/// gzip'd), profiles it, synthesizes the plan, checks it and writes it to
/// `plan_path`: the whole of `gpumalloc plan` without the pictures, for
/// the C ABI (`gm_plan_synthesize`). Fails, in words, if the trace cannot
/// be read, has fewer steps than the warm-up and one profiled iteration
/// need, or the plan cannot be written.
pub fn synthesize_file(
    trace_path: &std::path::Path,
    plan_path: &std::path::Path,
    profile: &ProfileConfig,
    synth: &SynthConfig,
) -> Result<Synthesized, String> {
    let trace = crate::pluggable::replay::load(trace_path)
        .map_err(|e| format!("reading the trace {}: {e}", trace_path.display()))?;
    let started = std::time::Instant::now();
    let prof = Profile::of(&trace, profile);
    if prof.iterations == 0 {
        return Err(format!(
            "the trace {} has {} steps: the plan needs {} warm-up steps and at least one \
             profiled step after them (mark steps with gpumalloc_torch.step())",
            trace_path.display(),
            prof.trace_steps,
            profile.warmup_steps
        ));
    }
    let plan = Plan::synthesize(&prof, synth);
    plan.check()
        .map_err(|e| format!("the synthesized plan is unsound: {e}"))?;
    let seconds = started.elapsed().as_secs_f64();
    plan.save(plan_path)
        .map_err(|e| format!("writing the plan {}: {e}", plan_path.display()))?;
    Ok(Synthesized {
        plan,
        trace_steps: prof.trace_steps,
        seconds,
    })
}

/// `n` rounded up to [`ALIGN`], at least one unit.
pub fn align_up(n: u64) -> u64 {
    n.max(1).div_ceil(ALIGN) * ALIGN
}
