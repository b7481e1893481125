//! Replay of an allocation trace through a [`StreamPool`] on the CPU model
//! driver: what a training run recorded on a GPU (sizes, streams, steps, in
//! time order) costs in memory and in driver calls with this pool, without
//! a GPU.
//!
//! - **input**: a [`Trace`] in the lake's binary format ("GMLKTRC" v1),
//!   plain or gzip-compressed ([`load`] tells them apart by their first
//!   bytes). The `phase` of each record is the training step; `stream` is
//!   the stream; `addr` only pairs each free with its alloc (frees of
//!   addresses the trace never allocated are counted and skipped);
//! - **driver**: [`ModelVmm::without_data`] (no bytes behind chunks, every
//!   call checked as on the GPU) at the trace's granularity, metered per
//!   call kind;
//! - **events**: [`ReplayEvents`], whose completion rule is the one thing a
//!   trace cannot tell (it has no GPU timeline). [`EventTiming`] picks it:
//!   `AtOnce` (the GPU is idle: optimistic), `AfterOps(k)` (the GPU runs `k`
//!   operations of that stream behind the CPU: an event recorded at a free
//!   completes once `k` more allocs and frees were made on its stream), or
//!   `AtStepEnd` (the CPU waits for the GPU once per step, e.g. at
//!   `loss.item()`: events complete when the next step begins);
//! - **figures** ([`ReplayReport`]): peak active and peak reserved bytes and
//!   their ratio (efficiency), the reserved breakdown at the moment
//!   reserved peaked, the lower bound on reserved that rounding alone
//!   imposes, driver calls per step and their estimated time from a
//!   [`CostModel`] (the model's own timings mean nothing).
//!
//! Concurrency: a replay runs on the calling thread; [`ReplayEvents`] keeps
//! its clock behind a mutex because [`EventSource`] must be `Sync`.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::io::{self, Read};
use std::path::Path;
use std::str::FromStr;
use std::sync::{Mutex, MutexGuard};
use std::time::Instant;

use super::error::{EventFailure, PoolError};
use super::event::{EventId, EventSource, StreamId};
use super::pool::StreamPool;
use super::split::SplitCache;
use super::stats::PoolBreakdown;
use crate::{
    ChunkOptions, DriverCounters, EventKind, Lake, LakeConfig, ModelVmm, Trace, TraceError,
    VmmCall, VmmDriver,
};

/// When an event recorded at a free completes, in a replay.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventTiming {
    /// At once: the GPU keeps up with the CPU (the optimistic case).
    AtOnce,
    /// After this many later allocs and frees on the event's stream.
    AfterOps(u64),
    /// When the next step (trace phase) begins.
    AtStepEnd,
}

impl fmt::Display for EventTiming {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EventTiming::AtOnce => write!(f, "at-once"),
            EventTiming::AfterOps(k) => write!(f, "ops:{k}"),
            EventTiming::AtStepEnd => write!(f, "step"),
        }
    }
}

impl FromStr for EventTiming {
    type Err = String;
    fn from_str(s: &str) -> Result<EventTiming, String> {
        match s {
            "at-once" => Ok(EventTiming::AtOnce),
            "step" => Ok(EventTiming::AtStepEnd),
            _ => s
                .strip_prefix("ops:")
                .and_then(|k| k.parse().ok())
                .map(EventTiming::AfterOps)
                .ok_or_else(|| {
                    format!("event timing {s:?}: expected at-once, step or ops:N (N a count)")
                }),
        }
    }
}

/// Estimated cost of driver calls: per call kind a fixed part per call and
/// a part per granule covered (indexed by [`VmmCall::index`]), and the cost
/// of one event call.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CostModel {
    /// Microseconds per call of each kind.
    pub per_call: [f64; VmmCall::ALL.len()],
    /// Microseconds per granule covered, for each kind.
    pub per_granule: [f64; VmmCall::ALL.len()],
    /// Microseconds per event record or query.
    pub per_event: f64,
}

impl Default for CostModel {
    /// The H100 model for 2 MiB chunks ([`CostModel::h100`]).
    fn default() -> CostModel {
        CostModel::h100(crate::model::H100_GRANULARITY)
    }
}

impl CostModel {
    /// Medians measured on an H100 80GB HBM3 (driver 580, CUDA 13,
    /// `docs/results/h100-vmm/vmm_cost.json`), for a lake whose chunks are
    /// single handles of `chunk_bytes` each. `cuMemSetAccess` and
    /// `cuMemUnmap` cost per *mapping*, not per byte: one call over 256
    /// mapped 2 MiB handles takes 5.4 ms and 3.7 ms, one call over one
    /// 512 MiB handle 49 µs and 28 µs. Per handle of n × 2 MiB (fitted
    /// between 2 and 32 MiB): set access 20.2 + 1.12 (n − 1) µs, unmap
    /// 14.7 + 0.57 (n − 1), create 7.5 + 0.12 (n − 1), release
    /// 9.7 + 0.91 (n − 1), map 1.0; address reserve and free ~1 µs plus
    /// ~0.04 µs per chunk; event record or query 0.5 µs.
    pub fn h100(chunk_bytes: u64) -> CostModel {
        let extra = (chunk_bytes / (2 << 20)).max(1) as f64 - 1.0;
        let mut per_call = [0.0; VmmCall::ALL.len()];
        let mut per_granule = [0.0; VmmCall::ALL.len()];
        for (call, fixed, granule) in [
            (VmmCall::Reserve, 1.0, 0.04),
            (VmmCall::FreeAddress, 1.0, 0.04),
            (VmmCall::Create, 7.5 + 0.12 * extra, 0.0),
            (VmmCall::Release, 9.7 + 0.91 * extra, 0.0),
            (VmmCall::Map, 1.0, 0.0),
            (VmmCall::Unmap, 14.7 + 0.57 * extra, 0.0),
            (VmmCall::SetAccess, 0.0, 20.2 + 1.12 * extra),
        ] {
            per_call[call.index()] = fixed;
            per_granule[call.index()] = granule;
        }
        CostModel {
            per_call,
            per_granule,
            per_event: 0.5,
        }
    }

    /// The default model with overrides `name=µs` or `name=µs+µs_per_granule`,
    /// names as in `reserve, free_address, create, release, map, unmap,
    /// set_access, event`, separated by commas.
    pub fn parse(spec: &str) -> Result<CostModel, String> {
        let mut m = CostModel::default();
        for part in spec.split(',').filter(|p| !p.is_empty()) {
            let (name, value) = part
                .split_once('=')
                .ok_or_else(|| format!("cost {part:?}: expected name=microseconds"))?;
            let (fixed, granule) = value.split_once('+').unwrap_or((value, "0"));
            let num = |v: &str| v.parse::<f64>().map_err(|e| format!("cost {part:?}: {e}"));
            if name == "event" {
                m.per_event = num(fixed)?;
                continue;
            }
            let call = VmmCall::ALL
                .into_iter()
                .find(|c| short_name(*c) == name)
                .ok_or_else(|| format!("cost {part:?}: unknown call {name:?}"))?;
            m.per_call[call.index()] = num(fixed)?;
            m.per_granule[call.index()] = num(granule)?;
        }
        Ok(m)
    }

    /// Estimated microseconds of calls and granules per kind, and events.
    pub fn micros_of(
        &self,
        calls: &[u64; VmmCall::ALL.len()],
        granules: &[u64; VmmCall::ALL.len()],
        events: u64,
    ) -> f64 {
        let mut us = events as f64 * self.per_event;
        for i in 0..VmmCall::ALL.len() {
            us += calls[i] as f64 * self.per_call[i] + granules[i] as f64 * self.per_granule[i];
        }
        us
    }
}

/// The short name of a call used in cost specs and reports.
pub fn short_name(call: VmmCall) -> &'static str {
    match call {
        VmmCall::Reserve => "reserve",
        VmmCall::FreeAddress => "free_address",
        VmmCall::Create => "create",
        VmmCall::Release => "release",
        VmmCall::Map => "map",
        VmmCall::Unmap => "unmap",
        VmmCall::SetAccess => "set_access",
    }
}

/// How to replay.
#[derive(Clone, Copy, Debug)]
pub struct ReplayConfig {
    /// When events complete.
    pub timing: EventTiming,
    /// Cost of driver calls.
    pub cost: CostModel,
    /// Steps (distinct phases, in order) left out of the per-step averages.
    pub warmup_steps: usize,
    /// The lake's limit on physical bytes.
    pub limit_bytes: u64,
    /// The lake's [`LakeConfig::max_stitch_chunks`].
    pub max_stitch_chunks: usize,
    /// The lake's [`LakeConfig::max_cached_stitched`].
    pub max_cached_stitched: usize,
    /// Bytes per chunk of the modelled lake; `None`: the trace's
    /// granularity (what the GPU that recorded it used).
    pub chunk_bytes: Option<u64>,
    /// Bytes of other memory touched between two pool calls (not timed), so
    /// the pool runs with cold caches as inside a training loop (its host
    /// time per call there is ~10x the warm loop's); 0: none.
    pub evict_bytes: usize,
    /// Entries of the pool's reuse cache ([`StreamPool::set_reuse_entries`]).
    pub reuse_entries: usize,
}

impl Default for ReplayConfig {
    fn default() -> ReplayConfig {
        ReplayConfig {
            timing: EventTiming::AtOnce,
            cost: CostModel::default(),
            warmup_steps: 2,
            limit_bytes: 80 << 30,
            max_stitch_chunks: LakeConfig::DEFAULT_MAX_STITCH_CHUNKS,
            max_cached_stitched: LakeConfig::DEFAULT_MAX_CACHED_STITCHED,
            chunk_bytes: None,
            evict_bytes: 0,
            reuse_entries: super::reuse::DEFAULT_ENTRIES,
        }
    }
}

/// Events whose completion follows an [`EventTiming`] over the replay's
/// clock (operations per stream, and the step).
#[derive(Debug)]
pub struct ReplayEvents {
    timing: EventTiming,
    state: Mutex<ClockState>,
}

#[derive(Debug, Default)]
struct ClockState {
    /// Operations replayed so far on each stream.
    ops: HashMap<StreamId, u64>,
    step: u64,
    next: u64,
    /// Live events: stream, that stream's op count and the step at record.
    live: HashMap<EventId, (StreamId, u64, u64)>,
    calls: u64,
    /// Events up to this id completed in a `synchronize_all`.
    synced: u64,
}

impl ReplayEvents {
    /// Events completing by `timing`.
    pub fn new(timing: EventTiming) -> ReplayEvents {
        ReplayEvents {
            timing,
            state: Mutex::new(ClockState::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, ClockState> {
        // Every update is a single insert or counter bump: a poisoned lock
        // still guards consistent state.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts one operation on `stream`.
    pub fn tick(&self, stream: StreamId) {
        *self.state().ops.entry(stream).or_default() += 1;
    }

    /// Moves the clock to `step`.
    pub fn set_step(&self, step: u64) {
        self.state().step = step;
    }
}

impl EventSource for ReplayEvents {
    fn record(&self, stream: StreamId) -> Result<EventId, EventFailure> {
        let mut s = self.state();
        s.calls += 1;
        s.next += 1;
        let id = EventId(s.next);
        let ops = s.ops.get(&stream).copied().unwrap_or(0);
        let step = s.step;
        s.live.insert(id, (stream, ops, step));
        Ok(id)
    }

    fn is_complete(&self, event: EventId) -> Result<bool, EventFailure> {
        let mut s = self.state();
        s.calls += 1;
        let &(stream, ops, step) = s.live.get(&event).ok_or_else(|| EventFailure {
            call: "cuEventQuery",
            cause: format!("refused by the replay model: event {} is not live", event.0),
        })?;
        if event.0 <= s.synced {
            return Ok(true);
        }
        Ok(match self.timing {
            EventTiming::AtOnce => true,
            EventTiming::AfterOps(k) => s.ops.get(&stream).copied().unwrap_or(0) >= ops + k,
            EventTiming::AtStepEnd => s.step > step,
        })
    }

    fn destroy(&self, event: EventId) {
        self.state().live.remove(&event);
    }

    fn synchronize_all(&self) -> Result<(), EventFailure> {
        let mut s = self.state();
        s.calls += 1;
        s.synced = s.next;
        Ok(())
    }

    fn calls(&self) -> u64 {
        self.state().calls
    }
}

/// Figures of one step of a replay.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    /// The trace's phase tag of the step.
    pub phase: u32,
    /// Allocs and frees replayed in it.
    pub ops: u64,
    /// Driver calls made in it, per kind ([`VmmCall::index`]).
    pub calls: [u64; VmmCall::ALL.len()],
    /// Granules those calls covered, per kind.
    pub granules: [u64; VmmCall::ALL.len()],
    /// Event records and queries made in it.
    pub events: u64,
    /// Estimated time of those calls, in microseconds.
    pub micros: f64,
    /// CPU time spent inside the pool's alloc and free calls (this
    /// machine, model driver), in nanoseconds.
    pub pool_nanos: u64,
    /// Highest active bytes during the step.
    pub peak_active: u64,
    /// Reserved bytes at its end.
    pub reserved: u64,
}

/// What a replay found.
#[derive(Clone, Debug, PartialEq)]
pub struct ReplayReport {
    /// The configuration replayed with.
    pub timing: EventTiming,
    /// Allocs and frees replayed.
    pub ops: u64,
    /// Frees of addresses the trace never allocated (skipped).
    pub unmatched_frees: u64,
    /// Highest active bytes (as requested).
    pub peak_active: u64,
    /// Highest reserved bytes.
    pub peak_reserved: u64,
    /// Highest sum over live allocations of their capacity (small ones
    /// rounded to 512 bytes, large ones to whole chunks): the least any
    /// pool with this routing could reserve.
    pub peak_capacity: u64,
    /// The reserved breakdown when reserved last rose to its peak.
    pub at_peak: PoolBreakdown,
    /// Per step, in trace order.
    pub steps: Vec<StepReport>,
    /// Steps left out of the steady-state averages.
    pub warmup_steps: usize,
    /// Stitched views cached at the end, and the chunks they map.
    pub stitched_views: (u64, u64),
    /// How the lake served allocations over the whole replay.
    pub outcomes: crate::Outcomes,
}

impl ReplayReport {
    /// Peak active / peak reserved (0 when nothing was reserved).
    pub fn efficiency(&self) -> f64 {
        ratio(self.peak_active, self.peak_reserved)
    }

    /// The steps after the warm-up (all of them if there are no more).
    pub fn steady_steps(&self) -> &[StepReport] {
        if self.steps.len() > self.warmup_steps {
            &self.steps[self.warmup_steps..]
        } else {
            &self.steps
        }
    }

    /// Mean driver calls per steady step, per kind.
    pub fn steady_calls_per_step(&self) -> [f64; VmmCall::ALL.len()] {
        let steady = self.steady_steps();
        let mut out = [0.0; VmmCall::ALL.len()];
        for st in steady {
            for (o, &c) in out.iter_mut().zip(&st.calls) {
                *o += c as f64;
            }
        }
        out.map(|v| v / steady.len().max(1) as f64)
    }

    /// Mean granules covered per steady step, per kind.
    pub fn steady_granules_per_step(&self) -> [f64; VmmCall::ALL.len()] {
        let steady = self.steady_steps();
        let mut out = [0.0; VmmCall::ALL.len()];
        for st in steady {
            for (o, &c) in out.iter_mut().zip(&st.granules) {
                *o += c as f64;
            }
        }
        out.map(|v| v / steady.len().max(1) as f64)
    }

    /// Mean estimated driver time per steady step, in microseconds.
    pub fn steady_micros_per_step(&self) -> f64 {
        let steady = self.steady_steps();
        steady.iter().map(|s| s.micros).sum::<f64>() / steady.len().max(1) as f64
    }

    /// A human-readable summary.
    pub fn render(&self) -> String {
        const GIB: f64 = (1u64 << 30) as f64;
        let mut out = String::new();
        let _ = writeln!(
            out,
            "events {}: {} ops in {} steps ({} unmatched frees skipped)",
            self.timing,
            self.ops,
            self.steps.len(),
            self.unmatched_frees
        );
        let _ = writeln!(
            out,
            "  peak active {:.3} GiB, peak reserved {:.3} GiB, efficiency {:.3} \
             (rounding bound: {:.3} GiB, {:.3})",
            self.peak_active as f64 / GIB,
            self.peak_reserved as f64 / GIB,
            self.efficiency(),
            self.peak_capacity as f64 / GIB,
            ratio(self.peak_active, self.peak_capacity),
        );
        let _ = writeln!(out, "  reserved at its peak:");
        for (name, bytes) in self.at_peak.parts() {
            let _ = writeln!(
                out,
                "    {name:<24} {:>8.3} GiB {:>6.1}%",
                bytes as f64 / GIB,
                100.0 * ratio(bytes, self.at_peak.total())
            );
        }
        let calls = self.steady_calls_per_step();
        let granules = self.steady_granules_per_step();
        let listed: Vec<String> = VmmCall::ALL
            .into_iter()
            .filter(|c| calls[c.index()] > 0.0)
            .map(|c| {
                let (n, g) = (calls[c.index()], granules[c.index()]);
                if (g - n).abs() > 0.5 {
                    format!("{} {n:.1} ({g:.0} chunks)", short_name(c))
                } else {
                    format!("{} {n:.1}", short_name(c))
                }
            })
            .collect();
        let _ = writeln!(
            out,
            "  driver calls per step after {} warm-up steps: {}; {:.0} event calls \
             (est. {:.0} µs/step)",
            self.warmup_steps.min(self.steps.len()),
            if listed.is_empty() {
                "none".to_string()
            } else {
                listed.join(", ")
            },
            self.steady_steps().iter().map(|s| s.events).sum::<u64>() as f64
                / self.steady_steps().len().max(1) as f64,
            self.steady_micros_per_step()
        );
        let o = &self.outcomes;
        let _ = writeln!(
            out,
            "  lake outcomes: {} window at home, {} window of a stitched view, {} patched \
             ({} of them extended), {} stitched, {} grown, {} grown and stitched; {} stitched \
             views cached, mapping {} chunks",
            o.reuse_home,
            o.reuse_stitched,
            o.patch,
            o.extend,
            o.stitch,
            o.grow,
            o.grow_stitch,
            self.stitched_views.0,
            self.stitched_views.1
        );
        let steady = self.steady_steps();
        let (nanos, ops) = steady
            .iter()
            .fold((0u64, 0u64), |(n, o), s| (n + s.pool_nanos, o + s.ops));
        let _ = writeln!(
            out,
            "  pool CPU time per step after warm-up: {:.1} ms ({:.2} µs per alloc or free; \
             this machine, model driver)",
            nanos as f64 / 1e6 / steady.len().max(1) as f64,
            nanos as f64 / 1e3 / ops.max(1) as f64
        );
        let per_step: Vec<String> = self
            .steps
            .iter()
            .map(|s| {
                format!(
                    "{}:{}calls/{:.0}µs/{:.2}GiB",
                    s.phase,
                    s.calls.iter().sum::<u64>(),
                    s.micros,
                    s.reserved as f64 / GIB
                )
            })
            .collect();
        let _ = writeln!(out, "  per step: {}", per_step.join(" "));
        out
    }
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

/// Why a replay failed.
#[derive(Debug)]
pub enum ReplayError {
    /// The pool refused an operation of the trace.
    Pool {
        /// Index of the record in the trace.
        record: usize,
        /// The pool's error.
        error: PoolError,
    },
    /// The trace allocates an address that is live already.
    Overlap {
        /// Index of the record in the trace.
        record: usize,
        /// The address.
        addr: u64,
    },
    /// The pool's tables broke an invariant (a bug).
    Check(String),
}

impl fmt::Display for ReplayError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ReplayError::Pool { record, error } => write!(f, "replay: record {record}: {error}"),
            ReplayError::Overlap { record, addr } => write!(
                f,
                "replay: record {record} allocates {addr:#x}, which is live already \
                 (a trace missing a free?)"
            ),
            ReplayError::Check(why) => write!(f, "replay: pool invariant broken: {why}"),
        }
    }
}

impl std::error::Error for ReplayError {}

/// Reads a trace file, plain or gzip-compressed.
pub fn load(path: &Path) -> Result<Trace, TraceError> {
    let mut bytes = Vec::new();
    std::fs::File::open(path)?.read_to_end(&mut bytes)?;
    read_bytes(&bytes)
}

/// Reads a trace from bytes, plain or gzip-compressed.
pub fn read_bytes(bytes: &[u8]) -> Result<Trace, TraceError> {
    const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];
    if bytes.starts_with(&GZIP_MAGIC) {
        let mut plain = Vec::new();
        flate2::read::MultiGzDecoder::new(bytes).read_to_end(&mut plain)?;
        Trace::read_from(&mut plain.as_slice())
    } else {
        Trace::read_from(&mut &bytes[..])
    }
}

/// Writes a trace gzip-compressed.
pub fn save_gz(trace: &Trace, path: &Path) -> Result<(), TraceError> {
    let file = std::fs::File::create(path)?;
    let mut gz =
        flate2::write::GzEncoder::new(io::BufWriter::new(file), flate2::Compression::default());
    trace.write_to(&mut gz)?;
    gz.finish()?;
    Ok(())
}

/// A longer trace made of `trace`'s steps: its first step (set-up and
/// the first training step, phase of its first record) as recorded, then
/// `steps` steps drawn at random (seeded) from its later steps, numbered
/// on. Each later step must free everything it allocates (true of a
/// training loop once warm), else the answer says which does not.
pub fn looped(trace: &Trace, steps: u32, seed: u64) -> Result<Trace, String> {
    let mut phases: Vec<u32> = Vec::new();
    let mut by_phase: HashMap<u32, Vec<crate::Event>> = HashMap::new();
    for e in &trace.events {
        if phases.last() != Some(&e.site.phase) {
            if by_phase.contains_key(&e.site.phase) {
                return Err(format!("phase {} comes back after another", e.site.phase));
            }
            phases.push(e.site.phase);
        }
        by_phase.entry(e.site.phase).or_default().push(*e);
    }
    let (first, later) = phases
        .split_first()
        .ok_or_else(|| "an empty trace".to_string())?;
    if later.is_empty() {
        return Err("a trace of one step has nothing to repeat".into());
    }
    for p in later {
        let mut live: HashMap<u64, u64> = HashMap::new();
        for e in &by_phase[p] {
            match e.kind {
                EventKind::Alloc => *live.entry(e.addr).or_default() += 1,
                EventKind::Free => {
                    if let Some(n) = live.get_mut(&e.addr) {
                        *n -= 1;
                        if *n == 0 {
                            live.remove(&e.addr);
                        }
                    }
                }
            }
        }
        if !live.is_empty() {
            return Err(format!(
                "step {p} keeps {} allocations past its end: it cannot be repeated",
                live.len()
            ));
        }
    }
    let mut out = Trace {
        granularity: trace.granularity,
        events: by_phase[first].clone(),
    };
    let mut rng = gpu_kernels::workload::SplitMix64(seed);
    for i in 0..steps {
        let p = later[rng.below(later.len() as u64) as usize];
        out.events.extend(by_phase[&p].iter().map(|e| {
            let mut e = *e;
            e.site.phase = first + 1 + i;
            e
        }));
    }
    Ok(out)
}

/// The pool a replay runs on.
pub type ReplayPool = StreamPool<ModelVmm, ReplayEvents>;

/// A pool on the data-less model at `granularity`, with `config`.
pub fn replay_pool(granularity: u64, config: &ReplayConfig) -> ReplayPool {
    let vmm = ModelVmm::without_data(granularity, ChunkOptions::default());
    let lake = LakeConfig {
        max_stitch_chunks: config.max_stitch_chunks,
        max_cached_stitched: config.max_cached_stitched,
        ..LakeConfig::with_limit(config.limit_bytes)
    };
    let pool = StreamPool::new(Lake::new(vmm, lake), ReplayEvents::new(config.timing));
    pool.set_reuse_entries(config.reuse_entries)
        .expect("an empty pool has nothing to give back");
    pool
}

/// Replays `trace` through a fresh pool. Every 16384 operations and at the
/// end the pool's invariants are checked.
pub fn replay(trace: &Trace, config: &ReplayConfig) -> Result<ReplayReport, ReplayError> {
    let granularity = match (config.chunk_bytes, trace.granularity) {
        (Some(chunk), _) => chunk,
        (None, 0) => crate::model::H100_GRANULARITY,
        (None, recorded) => recorded,
    };
    let pool = replay_pool(granularity, config);
    replay_on(&pool, trace, config)
}

/// Replays `trace` through `pool` (fresh, or warmed by an earlier replay).
pub fn replay_on(
    pool: &ReplayPool,
    trace: &Trace,
    config: &ReplayConfig,
) -> Result<ReplayReport, ReplayError> {
    const CHECK_EVERY: u64 = 16384;
    let granularity = pool.lake().granularity();
    let capacity_of = |size: u64| {
        if size < granularity {
            SplitCache::rounded(size)
        } else {
            size.div_ceil(granularity) * granularity
        }
    };
    let mut report = ReplayReport {
        timing: config.timing,
        ops: 0,
        unmatched_frees: 0,
        peak_active: 0,
        peak_reserved: 0,
        peak_capacity: 0,
        at_peak: PoolBreakdown::default(),
        steps: Vec::new(),
        warmup_steps: config.warmup_steps,
        stitched_views: (0, 0),
        outcomes: crate::Outcomes::default(),
    };
    // Trace address -> (our address, size).
    let mut live: HashMap<u64, (u64, u64)> = HashMap::new();
    let (mut active, mut capacity) = (0u64, 0u64);
    let mut step_start: DriverCounters = pool.lake().driver().counters();
    let evict = vec![1u8; config.evict_bytes];
    let mut evict_round = 0u8;
    let mut current: Option<StepReport> = None;
    for (i, e) in trace.events.iter().enumerate() {
        if current.as_ref().is_none_or(|c| c.phase != e.site.phase) {
            let now = pool.lake().driver().counters();
            if let Some(done) = current.take() {
                report
                    .steps
                    .push(close_step(done, &step_start, &now, pool, config));
            }
            step_start = now;
            pool.events().set_step(report.steps.len() as u64);
            current = Some(StepReport {
                phase: e.site.phase,
                ops: 0,
                calls: [0; VmmCall::ALL.len()],
                granules: [0; VmmCall::ALL.len()],
                events: pool.events().calls(),
                micros: 0.0,
                pool_nanos: 0,
                peak_active: active,
                reserved: 0,
            });
        }
        let stream = StreamId(u64::from(e.site.stream));
        pool.events().tick(stream);
        let step = current.as_mut().expect("opened above");
        step.ops += 1;
        report.ops += 1;
        if !evict.is_empty() {
            // Reads only: no dirty lines left to write back inside the
            // timed call.
            let mut sum = 0u8;
            for line in evict.chunks(64) {
                sum = sum.wrapping_add(line[0]);
            }
            evict_round = evict_round.wrapping_add(std::hint::black_box(sum));
        }
        match e.kind {
            EventKind::Alloc => {
                if live.contains_key(&e.addr) {
                    return Err(ReplayError::Overlap {
                        record: i,
                        addr: e.addr,
                    });
                }
                let t0 = Instant::now();
                let ours = pool
                    .alloc(e.size, stream)
                    .map_err(|error| ReplayError::Pool { record: i, error })?;
                step.pool_nanos += t0.elapsed().as_nanos() as u64;
                live.insert(e.addr, (ours, e.size));
                active += e.size;
                capacity += capacity_of(e.size);
                report.peak_active = report.peak_active.max(active);
                report.peak_capacity = report.peak_capacity.max(capacity);
                step.peak_active = step.peak_active.max(active);
                let reserved = pool.lake().reserved_bytes();
                if reserved > report.peak_reserved {
                    report.peak_reserved = reserved;
                    report.at_peak = pool.stats().breakdown;
                }
            }
            EventKind::Free => {
                let Some((ours, size)) = live.remove(&e.addr) else {
                    report.unmatched_frees += 1;
                    continue;
                };
                let t0 = Instant::now();
                pool.free(ours, stream)
                    .map_err(|error| ReplayError::Pool { record: i, error })?;
                step.pool_nanos += t0.elapsed().as_nanos() as u64;
                active -= size;
                capacity -= capacity_of(size);
            }
        }
        if report.ops.is_multiple_of(CHECK_EVERY) {
            pool.check().map_err(ReplayError::Check)?;
        }
    }
    if let Some(done) = current.take() {
        let now = pool.lake().driver().counters();
        report
            .steps
            .push(close_step(done, &step_start, &now, pool, config));
    }
    pool.check().map_err(ReplayError::Check)?;
    let lake = pool.lake().stats();
    report.stitched_views = (lake.stitched_views, lake.stitched_chunks);
    report.outcomes = lake.outcomes;
    Ok(report)
}

fn close_step(
    mut step: StepReport,
    start: &DriverCounters,
    now: &DriverCounters,
    pool: &ReplayPool,
    config: &ReplayConfig,
) -> StepReport {
    for call in VmmCall::ALL {
        step.calls[call.index()] = now.of(call).calls - start.of(call).calls;
        step.granules[call.index()] = now.of(call).granules - start.of(call).granules;
    }
    // Opened with the event count at the start.
    step.events = pool.events().calls() - step.events;
    step.micros = config
        .cost
        .micros_of(&step.calls, &step.granules, step.events);
    step.reserved = pool.lake().reserved_bytes();
    step
}
