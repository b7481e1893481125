//! The planned mode over the pluggable pool, as an explicit opt-in: a
//! [`PlannedPool`] wraps a [`StreamPool`] (which it leaves unchanged) and
//! a [`PlannedArena`]. At creation it takes one range of the plan's arena
//! size from the pool's lake; planned requests get `base + offset` (no
//! driver call, no search for static ones), everything the plan does not
//! serve falls back to the stream pool over the same lake.
//!
//! Streams: the arena reuses addresses in the order the CPU asks, which is
//! safe only on one stream (the GPU runs one stream's work in order). So
//! the arena serves one stream, the one most of the plan's requests were
//! made on; requests on other streams go to the stream pool (which keeps
//! the event rule) and only use up their ordinal. Memory of the arena used
//! on a second stream (PyTorch's `record_stream`) is not tracked: a job
//! that does that must not use the planned mode.
//!
//! Concurrency: `&mut self` (one thread; the C ABI would put it behind the
//! registry's lock, not done).

use std::collections::HashMap;
use std::fmt;

use crate::lake::{
    ChunkOptions, DeviceRange, EventKind, Lake, LakeConfig, LakeError, ModelVmm, Site, Trace,
    VmmDriver,
};
use crate::pluggable::{EventSource, ModelEvents, PoolError, StreamId, StreamPool};

use super::profile::peak_live;
use super::runtime::{PlannedArena, RuntimeStats};
use super::synth::Plan;

/// Why the planned pool could not serve a call.
#[derive(Debug)]
pub enum PlannedPoolError {
    /// The lake could not give the arena's range.
    Arena(LakeError),
    /// The stream pool refused a fallback or a free.
    Pool(PoolError),
}

impl fmt::Display for PlannedPoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PlannedPoolError::Arena(e) => write!(
                f,
                "planned pool: the lake could not reserve the plan's arena ({e}); raise the limit or plan a smaller job"
            ),
            PlannedPoolError::Pool(e) => write!(f, "planned pool: {e}"),
        }
    }
}

impl std::error::Error for PlannedPoolError {}

impl From<PoolError> for PlannedPoolError {
    fn from(e: PoolError) -> PlannedPoolError {
        PlannedPoolError::Pool(e)
    }
}

/// A stream pool with a planned arena in front.
pub struct PlannedPool<D: VmmDriver, E: EventSource> {
    pool: StreamPool<D, E>,
    arena: PlannedArena,
    base: Option<DeviceRange>,
    stream: u32,
    /// Live arena allocations: address to offset.
    planned: HashMap<u64, u64>,
}

impl<D: VmmDriver, E: EventSource> PlannedPool<D, E> {
    /// Takes the plan's arena from `pool`'s lake and serves `plan`.
    pub fn new(pool: StreamPool<D, E>, plan: Plan) -> Result<PlannedPool<D, E>, PlannedPoolError> {
        let mut streams: HashMap<u32, usize> = HashMap::new();
        for r in plan.requests.iter().filter(|r| r.offset.is_some()) {
            *streams.entry(r.request.stream).or_default() += 1;
        }
        let stream = streams
            .into_iter()
            .max_by_key(|&(s, n)| (n, std::cmp::Reverse(s)))
            .map_or(0, |(s, _)| s);
        let base = if plan.arena == 0 {
            None
        } else {
            let site = Site { stream, phase: 0 };
            Some(
                pool.lake()
                    .alloc_at(plan.arena, site)
                    .map_err(PlannedPoolError::Arena)?,
            )
        };
        Ok(PlannedPool {
            pool,
            arena: PlannedArena::new(plan),
            base,
            stream,
            planned: HashMap::new(),
        })
    }

    /// The stream pool behind.
    pub fn pool(&self) -> &StreamPool<D, E> {
        &self.pool
    }

    /// The stream the arena serves.
    pub fn arena_stream(&self) -> StreamId {
        StreamId(u64::from(self.stream))
    }

    /// Counters of the arena (fallbacks include requests of other streams).
    pub fn stats(&self) -> RuntimeStats {
        self.arena.stats()
    }

    /// Marks the start of the next training step.
    pub fn step(&mut self) {
        self.arena.step();
        self.pool.mark_step();
    }

    /// Allocates `size` bytes for use on `stream`; `0` for `size == 0`.
    pub fn alloc(&mut self, size: u64, stream: StreamId) -> Result<u64, PlannedPoolError> {
        if size == 0 {
            return Ok(0);
        }
        let ours = u32::try_from(stream.0).ok() == Some(self.stream);
        if let (Some(base), true) = (self.base, ours) {
            if let Some((off, _)) = self.arena.try_planned(size, self.stream) {
                let addr = base.addr + off;
                self.planned.insert(addr, off);
                return Ok(addr);
            }
        } else {
            self.arena.skip(size);
        }
        Ok(self.pool.alloc(size, stream)?)
    }

    /// Frees `addr` (from [`PlannedPool::alloc`]) last used on `stream`.
    pub fn free(&mut self, addr: u64, stream: StreamId) -> Result<(), PlannedPoolError> {
        match self.planned.remove(&addr) {
            Some(off) => {
                self.arena
                    .free(off)
                    .expect("the arena handed this offset out");
                Ok(())
            }
            None => Ok(self.pool.free(addr, stream)?),
        }
    }
}

impl<D: VmmDriver, E: EventSource> Drop for PlannedPool<D, E> {
    fn drop(&mut self) {
        if let Some(base) = self.base.take() {
            // A failure here is the lake's to report in its own checks;
            // `Drop` never panics.
            let _ = self.pool.lake().free(base);
        }
    }
}

/// What a replay through a planned pool on the CPU model gave.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PoolReplay {
    /// The arena's counters.
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

/// Replays `trace` through a planned pool on the data-less model driver
/// (the trace's granularity, a lake of `limit_bytes`, events complete at
/// once); checks the pool's invariants at the end.
pub fn replay(plan: &Plan, trace: &Trace, limit_bytes: u64) -> Result<PoolReplay, String> {
    let granularity = match trace.granularity {
        0 => crate::lake::model::H100_GRANULARITY,
        g => g,
    };
    let lake = Lake::new(
        ModelVmm::without_data(granularity, ChunkOptions::default()),
        LakeConfig::with_limit(limit_bytes),
    );
    let mut pp = PlannedPool::new(
        StreamPool::new(lake, ModelEvents::completing()),
        plan.clone(),
    )
    .map_err(|e| e.to_string())?;
    let mut at: HashMap<u64, u64> = HashMap::new();
    let mut phase = None;
    let mut peak_reserved = pp.pool().lake().reserved_bytes();
    for e in &trace.events {
        if phase.is_some_and(|p| p != e.site.phase) {
            pp.step();
        }
        phase = Some(e.site.phase);
        let stream = StreamId(u64::from(e.site.stream));
        match e.kind {
            EventKind::Alloc => {
                let addr = pp.alloc(e.size, stream).map_err(|e| e.to_string())?;
                at.insert(e.addr, addr);
            }
            EventKind::Free => {
                if let Some(addr) = at.remove(&e.addr) {
                    pp.free(addr, stream).map_err(|e| e.to_string())?;
                }
            }
        }
        peak_reserved = peak_reserved.max(pp.pool().lake().reserved_bytes());
    }
    pp.pool().check()?;
    Ok(PoolReplay {
        stats: pp.stats(),
        peak_live: peak_live(trace),
        peak_reserved,
    })
}
