//! The pool's unit of memory: a `Block` (what an allocation holds), its
//! `Origin` (split-cache piece, lake range or planned arena range) and its `Home` (the general
//! pool, or one stream's store in a private pool).
//!
//! Concurrency: plain values, kept in tables behind the pool's lock.

use crate::DeviceRange;

/// The id of a private pool: PyTorch's `MempoolId_t` (a CUDA graph's pool,
/// shared by graphs captured with the same `graph_pool_handle`, or a
/// `torch.cuda.MemPool`). `(0, 0)` is no private pool.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolId(pub u64, pub u64);

impl PoolId {
    /// The general pool (PyTorch's `{0, 0}`).
    pub const GENERAL: PoolId = PoolId(0, 0);
}

/// Where a block came from, and so where its memory goes back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// A piece of a split cache (general or private).
    Small,
    /// A lake allocation (the range exactly as the lake handed it out).
    Large(DeviceRange),
    /// A range of the planned arena (general pool only, see
    /// `super::planned`).
    Planned,
}

/// Memory handed out: its address, how much it really holds, its origin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Block {
    /// Device address of the first byte.
    pub addr: u64,
    /// Piece length (small), whole chunks (large) or the request rounded
    /// to 512 bytes (planned).
    pub capacity: u64,
    /// Split-cache piece, lake range or planned arena range.
    pub origin: Origin,
}

impl Block {
    /// Whether the block is a split-cache piece.
    pub fn is_small(&self) -> bool {
        matches!(self.origin, Origin::Small)
    }
}

/// Where a block returns once nobody may be using it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Home {
    /// The general split cache or the lake.
    General,
    /// The store of one stream in a private pool: only that pool's later
    /// allocations on that stream may reuse it (graph replays run in
    /// capture order on their streams).
    Private(PoolId, super::event::StreamId),
}
