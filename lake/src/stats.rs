//! `LakeStats`: what a lake holds and how its requests were served.
//!
//! Concurrency: a plain snapshot, taken under the lake's lock.

use super::driver::DriverCounters;

/// How allocations were served (see `pool.rs` for the rules).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// A window of free chunks at home: no driver call.
    pub reuse_home: u64,
    /// A window of a cached stitched view: no driver call.
    pub reuse_stitched: u64,
    /// A cached stitched view with a few chunks replaced in place.
    pub patch: u64,
    /// Free chunks stitched into a new view: no new physical memory.
    pub stitch: u64,
    /// New chunks at home that completed a window there.
    pub grow: u64,
    /// New chunks for the shortfall, stitched with the free ones.
    pub grow_stitch: u64,
    /// Of the patched ones (counted above under `patch` or `grow_stitch`),
    /// those whose view was also extended at its end (not in `total`).
    pub extend: u64,
}

impl Outcomes {
    /// All allocations counted.
    pub fn total(&self) -> u64 {
        self.reuse_home
            + self.reuse_stitched
            + self.patch
            + self.stitch
            + self.grow
            + self.grow_stitch
    }

    /// Allocations served with no driver call.
    pub fn reused(&self) -> u64 {
        self.reuse_home + self.reuse_stitched
    }

    /// Share of allocations served with no driver call (0 when none).
    pub fn hit_rate(&self) -> f64 {
        match self.total() {
            0 => 0.0,
            n => self.reused() as f64 / n as f64,
        }
    }

    /// The counts accumulated since `earlier`.
    pub fn since(&self, earlier: &Outcomes) -> Outcomes {
        Outcomes {
            reuse_home: self.reuse_home - earlier.reuse_home,
            reuse_stitched: self.reuse_stitched - earlier.reuse_stitched,
            patch: self.patch - earlier.patch,
            stitch: self.stitch - earlier.stitch,
            grow: self.grow - earlier.grow,
            grow_stitch: self.grow_stitch - earlier.grow_stitch,
            extend: self.extend - earlier.extend,
        }
    }
}

/// Where a lake's physical bytes are, at one moment. The parts sum to the
/// reserved bytes plus the spilled ones ([`LakeBreakdown::total`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LakeBreakdown {
    /// Bytes of live allocations, as requested.
    pub active_bytes: u64,
    /// Bytes between each live allocation's size and its whole chunks.
    pub rounding_bytes: u64,
    /// Bytes of free chunks any stream may reuse.
    pub free_bytes: u64,
    /// Bytes of free chunks some stream may not reuse yet (their fences
    /// wait on events; see `fence.rs`).
    pub waiting_bytes: u64,
}

impl LakeBreakdown {
    /// The sum of the parts: the reserved bytes plus the spilled ones.
    pub fn total(&self) -> u64 {
        self.active_bytes + self.rounding_bytes + self.free_bytes + self.waiting_bytes
    }
}

/// A snapshot of a lake.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LakeStats {
    /// Bytes in live allocations, as requested.
    pub active_bytes: u64,
    /// Device bytes held (live chunks in device memory; spilled chunks
    /// are not counted here).
    pub reserved_bytes: u64,
    /// Highest `active_bytes` seen.
    pub peak_active_bytes: u64,
    /// Highest `reserved_bytes` seen.
    pub peak_reserved_bytes: u64,
    /// Live chunks in host memory (the spill, `LakeConfig::spill_to_host`).
    pub spilled_chunks: u64,
    /// Their bytes: physical memory the lake holds besides `reserved_bytes`.
    pub spilled_bytes: u64,
    /// Highest `spilled_bytes` seen.
    pub peak_spilled_bytes: u64,
    /// Chunks ever made in host memory.
    pub spills: u64,
    /// Live allocations.
    pub live_allocations: u64,
    /// Home views (reservations where chunks are made).
    pub home_views: u64,
    /// Stitched views (in use and cached).
    pub stitched_views: u64,
    /// Chunk mappings of the stitched views (their address space, in
    /// chunks; unmapping costs per chunk).
    pub stitched_chunks: u64,
    /// Longest run of free chunks in any view, in bytes.
    pub largest_free_bytes: u64,
    /// How allocations were served.
    pub outcomes: Outcomes,
    /// Frees done.
    pub frees: u64,
    /// Driver calls made and time spent in them.
    pub driver: DriverCounters,
    /// Where the reserved bytes are now.
    pub breakdown: LakeBreakdown,
}

impl LakeStats {
    /// 1 − peak active / peak reserved (0 before anything was reserved).
    /// Device memory only: with spilled chunks it is no measure of the
    /// pool's layout (see `spilled_bytes`).
    pub fn fragmentation(&self) -> f64 {
        match self.peak_reserved_bytes {
            0 => 0.0,
            r => 1.0 - self.peak_active_bytes as f64 / r as f64,
        }
    }
}
