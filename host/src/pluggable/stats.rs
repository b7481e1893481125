//! `PoolStats`: what a [`super::StreamPool`] holds, in the terms PyTorch's
//! memory statistics use.
//!
//! Concurrency: a plain snapshot, taken under the pool's lock.

/// A snapshot of a pool.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PoolStats {
    /// Bytes in live allocations, as requested (before any rounding).
    pub active_bytes: u64,
    /// Physical bytes the lake holds (the split cache's chunks included).
    pub reserved_bytes: u64,
    /// Highest `active_bytes` since creation or the last peak reset.
    pub peak_active_bytes: u64,
    /// Highest `reserved_bytes` since creation or the last peak reset.
    pub peak_reserved_bytes: u64,
    /// Bytes freed whose event has not been seen complete yet (reusable
    /// only by the freeing stream), or freed during capture.
    pub waiting_bytes: u64,
    /// Chunks held by the split cache.
    pub split_chunks: u64,
    /// Live allocations (zero-size requests are not counted).
    pub live_allocations: u64,
    /// VMM driver calls made by the lake.
    pub driver_calls: u64,
    /// Event calls made by the event source.
    pub event_calls: u64,
}

impl PoolStats {
    /// 1 − peak active / peak reserved (0 before anything was reserved).
    pub fn fragmentation(&self) -> f64 {
        match self.peak_reserved_bytes {
            0 => 0.0,
            r => 1.0 - self.peak_active_bytes as f64 / r as f64,
        }
    }
}
