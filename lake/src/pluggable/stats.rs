//! `PoolStats`: what a [`super::StreamPool`] holds, in the terms PyTorch's
//! memory statistics use.
//!
//! Concurrency: a plain snapshot, taken under the pool's lock.

use crate::plan::RuntimeStats;

/// Where a pool's physical bytes are, at one moment. The parts sum to the
/// reserved bytes plus the spilled ones ([`PoolBreakdown::total`]);
/// `tests/torch_pool.rs` checks it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PoolBreakdown {
    /// Bytes of live allocations, as requested.
    pub active_bytes: u64,
    /// Small requests (and planned ones) rounded up to whole 512-byte
    /// pieces.
    pub small_rounding_bytes: u64,
    /// Large requests rounded up to whole lake chunks (2 MiB).
    pub large_rounding_bytes: u64,
    /// Free pieces of chunks the split cache holds.
    pub split_free_bytes: u64,
    /// Freed blocks (split pieces and large blocks) the reuse cache keeps
    /// for requests of their size (fences settled for every stream).
    pub reuse_free_bytes: u64,
    /// Free memory that CUDA graph (private) pools keep for their replays.
    pub private_free_bytes: u64,
    /// Bytes of the planned arena that no live planned allocation holds
    /// (the plan's idle space and the arena's chunk rounding).
    pub planned_free_bytes: u64,
    /// Freed blocks not yet reusable by every stream: their event has not
    /// been seen complete (or they were freed during capture).
    pub waiting_bytes: u64,
    /// Free lake chunks.
    pub lake_free_bytes: u64,
}

impl PoolBreakdown {
    /// The sum of the parts: the reserved bytes plus the spilled ones.
    pub fn total(&self) -> u64 {
        self.active_bytes
            + self.small_rounding_bytes
            + self.large_rounding_bytes
            + self.split_free_bytes
            + self.reuse_free_bytes
            + self.private_free_bytes
            + self.planned_free_bytes
            + self.waiting_bytes
            + self.lake_free_bytes
    }

    /// The parts with their names, in the order of the fields.
    pub fn parts(&self) -> [(&'static str, u64); 9] {
        [
            ("active", self.active_bytes),
            ("small rounding (512 B)", self.small_rounding_bytes),
            ("large rounding (chunk)", self.large_rounding_bytes),
            ("split cache free", self.split_free_bytes),
            ("reuse cache free", self.reuse_free_bytes),
            ("graph pools free", self.private_free_bytes),
            ("planned arena free", self.planned_free_bytes),
            ("waiting on events", self.waiting_bytes),
            ("lake free chunks", self.lake_free_bytes),
        ]
    }
}

/// A snapshot of a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolStats {
    /// Bytes in live allocations, as requested (before any rounding).
    pub active_bytes: u64,
    /// Bytes in live allocations, each rounded up to 512 bytes (what
    /// PyTorch's own allocator calls `allocated_bytes`).
    pub allocated_bytes: u64,
    /// Device bytes the lake holds (split caches and private pools
    /// included; chunks spilled to host memory are not).
    pub reserved_bytes: u64,
    /// Highest `active_bytes` since creation or the last peak reset.
    pub peak_active_bytes: u64,
    /// Highest `allocated_bytes` since creation or the last peak reset.
    pub peak_allocated_bytes: u64,
    /// Highest `reserved_bytes` since creation or the last peak reset.
    pub peak_reserved_bytes: u64,
    /// Lake chunks held in host memory now: made when the device had no
    /// memory left and the spill was on (`LakeConfig::spill_to_host`).
    pub spilled_chunks: u64,
    /// Their bytes, physical memory held besides `reserved_bytes`.
    pub spilled_bytes: u64,
    /// Highest `spilled_bytes` since creation or the last peak reset.
    pub peak_spilled_bytes: u64,
    /// Chunks ever made in host memory.
    pub spills: u64,
    /// Placements that waited for the device first (the event of a stitched
    /// view's last free, or the whole device when it has none), so that
    /// they could patch that view instead of stitching a new one.
    pub placement_waits: u64,
    /// Bytes freed whose events have not been seen complete (reusable only
    /// by the freeing stream), or freed while an allocation window was
    /// open.
    pub waiting_bytes: u64,
    /// Chunks held by split caches (general and private).
    pub split_chunks: u64,
    /// Free bytes in the general split cache's chunks.
    pub split_free_bytes: u64,
    /// Free bytes held by private (CUDA graph) pools.
    pub private_free_bytes: u64,
    /// Bytes of freed blocks (split pieces and large blocks) the reuse
    /// cache keeps.
    pub reuse_free_bytes: u64,
    /// Requests the reuse cache served (since creation).
    pub reuse_hits: u64,
    /// Blocks the reuse cache handed back to the split cache or the lake
    /// because the lake lacked free chunks, or on `empty_cache` (since
    /// creation).
    pub reuse_returned: u64,
    /// Private pools that exist.
    pub private_pools: u64,
    /// The largest free extent: a free lake block or a free piece of the
    /// general split cache.
    pub largest_free_bytes: u64,
    /// The limit on physical bytes.
    pub limit_bytes: u64,
    /// Live allocations (zero-size requests are not counted).
    pub live_allocations: u64,
    /// Allocations made (since creation).
    pub allocs: u64,
    /// Frees made (since creation).
    pub frees: u64,
    /// Requests the lake refused once, retried after reclaiming.
    pub alloc_retries: u64,
    /// Requests answered with out of memory.
    pub ooms: u64,
    /// VMM driver calls made by the lake.
    pub driver_calls: u64,
    /// Nanoseconds spent in those calls.
    pub driver_nanos: u64,
    /// Event calls made by the event source.
    pub event_calls: u64,
    /// Physical bytes of the planned arena (0 without a plan).
    pub planned_arena_bytes: u64,
    /// The plan's counters (hits, dynamic placements, fallbacks), when a
    /// plan is loaded.
    pub plan: Option<RuntimeStats>,
    /// Where the reserved bytes are now.
    pub breakdown: PoolBreakdown,
}

impl PoolStats {
    /// 1 − peak active / peak reserved (0 before anything was reserved).
    /// Device memory only: after a spill it is no measure of the pool's
    /// layout (see `peak_spilled_bytes`).
    pub fn fragmentation(&self) -> f64 {
        match self.peak_reserved_bytes {
            0 => 0.0,
            r => 1.0 - self.peak_active_bytes as f64 / r as f64,
        }
    }
}
