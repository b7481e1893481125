//! `LakeStats`: what a lake holds and how its requests were served.
//!
//! Concurrency: a plain snapshot, taken under the lake's lock.

use super::driver::DriverCounters;

/// How allocations were served: the four outcomes of best fit, with exact
/// matches split by block kind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Outcomes {
    /// A free primitive block of exactly the size.
    pub exact_primitive: u64,
    /// A cached stitched block of exactly the size.
    pub exact_stitched: u64,
    /// A larger primitive block, split.
    pub split: u64,
    /// Several free primitive blocks, stitched (the last one split).
    pub stitch: u64,
    /// New chunks stitched with every free block that could take part.
    pub grow_stitch: u64,
    /// New chunks alone (nothing free could help).
    pub fresh: u64,
}

impl Outcomes {
    /// All allocations counted.
    pub fn total(&self) -> u64 {
        self.exact_primitive
            + self.exact_stitched
            + self.split
            + self.stitch
            + self.grow_stitch
            + self.fresh
    }

    /// Exact matches of either kind.
    pub fn exact(&self) -> u64 {
        self.exact_primitive + self.exact_stitched
    }

    /// Share of allocations that were exact matches (0 when none).
    pub fn hit_rate(&self) -> f64 {
        match self.total() {
            0 => 0.0,
            n => self.exact() as f64 / n as f64,
        }
    }

    /// The counts accumulated since `earlier`.
    pub fn since(&self, earlier: &Outcomes) -> Outcomes {
        Outcomes {
            exact_primitive: self.exact_primitive - earlier.exact_primitive,
            exact_stitched: self.exact_stitched - earlier.exact_stitched,
            split: self.split - earlier.split,
            stitch: self.stitch - earlier.stitch,
            grow_stitch: self.grow_stitch - earlier.grow_stitch,
            fresh: self.fresh - earlier.fresh,
        }
    }
}

/// Where a lake's physical bytes are, at one moment. The parts sum to the
/// reserved bytes ([`LakeBreakdown::total`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LakeBreakdown {
    /// Bytes of live allocations, as requested.
    pub active_bytes: u64,
    /// Bytes between each live allocation's size and its whole chunks.
    pub rounding_bytes: u64,
    /// Bytes of free chunks (usable by the next request without new
    /// physical memory).
    pub free_bytes: u64,
}

impl LakeBreakdown {
    /// The sum of the parts: the reserved bytes.
    pub fn total(&self) -> u64 {
        self.active_bytes + self.rounding_bytes + self.free_bytes
    }
}

/// A snapshot of a lake.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct LakeStats {
    /// Bytes in live allocations, as requested.
    pub active_bytes: u64,
    /// Physical bytes held (live chunks).
    pub reserved_bytes: u64,
    /// Highest `active_bytes` seen.
    pub peak_active_bytes: u64,
    /// Highest `reserved_bytes` seen.
    pub peak_reserved_bytes: u64,
    /// Live allocations.
    pub live_allocations: u64,
    /// Primitive blocks.
    pub primitive_blocks: u64,
    /// Stitched blocks (active and cached).
    pub stitched_blocks: u64,
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
    pub fn fragmentation(&self) -> f64 {
        match self.peak_reserved_bytes {
            0 => 0.0,
            r => 1.0 - self.peak_active_bytes as f64 / r as f64,
        }
    }
}
