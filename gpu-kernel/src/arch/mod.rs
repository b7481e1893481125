//! Everything that differs between the GPU and the host build.
//!
//! The allocator is written once against this module. On `nvptx64` it is inline
//! PTX with the memory semantics and scope spelled out (`atom.acq_rel.gpu`,
//! `ld.relaxed.gpu`, …): rustc's `core::sync::atomic` would emit `.sys` scope,
//! which orders against the host and other GPUs and costs more, and some of its
//! read-modify-writes lose their ordering (see `DESIGN.md`). On the host the twin
//! maps each call to `core::sync::atomic` with the same ordering, or to loom's
//! atomics under `--cfg loom`, so the same protocols are model-checked.
//!
//! Naming: the ordering is part of every atomic's name (`fetch_or_acq_rel`), so
//! a call site shows which ordering it relies on. Device-scope (`.gpu`) is the
//! only scope used: heap metadata is never shared with the host while kernels
//! run.
//!
//! Warp operations take the member mask explicitly. A host thread is a warp of
//! one lane: its active mask is its own bit, every vote is its own predicate,
//! and every shuffle returns its own value. Threads that joined a host warp
//! (`HostWarp` under loom, `ThreadWarp` otherwise) exchange values over the
//! whole warp's mask.

#[cfg(target_arch = "nvptx64")]
mod nvptx;
#[cfg(target_arch = "nvptx64")]
pub use nvptx::*;

#[cfg(not(target_arch = "nvptx64"))]
mod host;
#[cfg(not(target_arch = "nvptx64"))]
pub use host::*;

/// Lanes in a warp.
pub const WARP_SIZE: u32 = 32;

/// The lowest lane of a non-empty mask.
#[inline(always)]
pub fn lowest_lane(mask: u32) -> u32 {
    mask.trailing_zeros()
}

/// The number of lanes in `mask` below `lane`: a thread's rank in its team.
#[inline(always)]
pub fn rank_in(mask: u32, lane: u32) -> u32 {
    (mask & ((1u32 << lane) - 1)).count_ones()
}

/// This thread's warp team for `key` among the active lanes: `(members,
/// lane, leader, rank)`, the mask of the lanes whose key equals this
/// lane's (`match.any`), this thread's lane, the lowest member's lane and
/// the number of members below this lane.
#[inline(always)]
pub fn warp_team(key: u32) -> (u32, u32, u32, u32) {
    let members = match_any(active_mask(), key);
    let lane = lane_id();
    (members, lane, lowest_lane(members), rank_in(members, lane))
}
