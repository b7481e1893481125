//! A trace replay through the planned mode of the pluggable pool
//! ([`StreamPool::use_plan`], owned by `pluggable::planned`) on the CPU
//! model driver: what the plan gives PyTorch's pool, measured as the
//! lake's peak of physical bytes (the arena's whole chunks plus what
//! fallbacks reserved).
//!
//! Concurrency: one replay per call, on its own pool.

use std::collections::HashMap;

use crate::pluggable::{ModelEvents, StreamId, StreamPool};
use crate::{ChunkOptions, EventKind, Lake, LakeConfig, ModelVmm, Trace};

use super::profile::peak_live;
use super::runtime::RuntimeStats;
use super::synth::Plan;

/// What a replay through a planned pool on the CPU model gave.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolReplay {
    /// The plan's counters.
    pub stats: RuntimeStats,
    /// Peak live bytes of the trace.
    pub peak_live: u64,
    /// Peak of the lake's physical bytes (arena and fallbacks).
    pub peak_reserved: u64,
}

impl PoolReplay {
    /// Peak live over peak reserved.
    pub fn efficiency(&self) -> f64 {
        self.peak_live as f64 / self.peak_reserved.max(1) as f64
    }
}

/// A pool on the data-less model driver (granularity `granularity`, 0 for
/// the H100's, a lake of `limit_bytes`, events complete at once).
pub fn model_pool(granularity: u64, limit_bytes: u64) -> StreamPool<ModelVmm, ModelEvents> {
    let granularity = match granularity {
        0 => crate::model::H100_GRANULARITY,
        g => g,
    };
    let lake = Lake::new(
        ModelVmm::without_data(granularity, ChunkOptions::default()),
        LakeConfig::with_limit(limit_bytes),
    );
    StreamPool::new(lake, ModelEvents::completing())
}

/// Replays `trace` through a pool on the model driver (the trace's
/// granularity, a lake of `limit_bytes`) serving `plan`: a step mark at
/// each change of the phase tag, as `gpumalloc_torch.step()` gives. Checks
/// the pool's invariants at the end.
pub fn replay(plan: &Plan, trace: &Trace, limit_bytes: u64) -> Result<PoolReplay, String> {
    let pool = model_pool(trace.granularity, limit_bytes);
    pool.use_plan(plan.clone()).map_err(|e| e.to_string())?;
    let peak_reserved = drive(&pool, trace)?;
    pool.check()?;
    Ok(PoolReplay {
        stats: pool.plan_stats().unwrap_or_default(),
        peak_live: peak_live(trace),
        peak_reserved,
    })
}

/// Sends `trace`'s requests and frees to `pool` on their streams, with a
/// step mark at each change of the phase tag; the peak of the lake's
/// physical bytes meanwhile.
pub fn drive(pool: &StreamPool<ModelVmm, ModelEvents>, trace: &Trace) -> Result<u64, String> {
    let mut at: HashMap<u64, u64> = HashMap::new();
    let mut phase = None;
    let mut peak_reserved = pool.lake().reserved_bytes();
    for e in &trace.events {
        if phase.is_some_and(|p| p != e.site.phase) {
            pool.mark_step();
        }
        phase = Some(e.site.phase);
        let stream = StreamId(u64::from(e.site.stream));
        match e.kind {
            EventKind::Alloc => {
                let addr = pool.alloc(e.size, stream).map_err(|e| e.to_string())?;
                at.insert(e.addr, addr);
            }
            EventKind::Free => {
                if let Some(addr) = at.remove(&e.addr) {
                    pool.free(addr, stream).map_err(|e| e.to_string())?;
                }
            }
        }
        peak_reserved = peak_reserved.max(pool.lake().reserved_bytes());
    }
    Ok(peak_reserved)
}
