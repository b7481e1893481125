//! `PoolError`: why a [`super::StreamPool`] call failed. Each variant names
//! the cause; event failures name the CUDA call.
//!
//! Concurrency: plain values, built under the pool's lock and returned.

use std::fmt;

use crate::LakeError;

/// Result of pool calls.
pub type PoolResult<T> = Result<T, PoolError>;

/// A failed event call: which call, and why (the driver's words).
#[derive(Debug)]
pub struct EventFailure {
    /// The driver call, e.g. `"cuEventRecord"`.
    pub call: &'static str,
    /// The driver's error, or the model's refusal.
    pub cause: String,
}

impl fmt::Display for EventFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} failed: {}", self.call, self.cause)
    }
}

impl std::error::Error for EventFailure {}

/// What went wrong in a pool call.
#[derive(Debug)]
pub enum PoolError {
    /// Not enough memory for the request, even after returning the split
    /// cache's wholly free chunks to the lake.
    OutOfMemory {
        /// Bytes asked for, as requested.
        asked: u64,
        /// Physical bytes held by the lake.
        reserved: u64,
        /// Bytes in live allocations, as requested.
        active: u64,
        /// The lake's limit on physical bytes.
        limit: u64,
        /// The largest free extent: a free lake block or a free piece of
        /// the split cache, whichever is larger.
        largest_free: u64,
        /// Bytes freed on some stream whose event has not completed yet
        /// (not reusable by the asking stream for now).
        waiting: u64,
        /// What refused last: the lake's limit or the driver, in words.
        cause: String,
    },
    /// A private-pool call that does not fit the pool's state (no window
    /// open, no user to release, ...), in words.
    PrivatePool(String),
    /// `free` of an address this pool did not hand out (or already freed).
    NotOurs {
        /// The address.
        addr: u64,
    },
    /// The lake failed for another reason than memory (a driver call).
    Lake(LakeError),
    /// An event call failed.
    Event(EventFailure),
    /// Loading or dropping a plan does not fit the pool's state (live
    /// allocations, an open window, an arena the lake cannot hold), in
    /// words.
    Plan(String),
}

impl fmt::Display for PoolError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            PoolError::OutOfMemory {
                asked,
                reserved,
                active,
                limit,
                largest_free,
                waiting,
                cause,
            } => write!(
                f,
                "gpumalloc: out of memory: tried to allocate {} ({asked} bytes); {} reserved \
                 of a {} limit, {} in live tensors, largest free extent {}, {} waiting for \
                 other streams' events; the pool already waited for the device and released \
                 its cache. Free tensors or use a smaller batch. ({cause})",
                human(*asked),
                human(*reserved),
                human(*limit),
                human(*active),
                human(*largest_free),
                human(*waiting),
            ),
            PoolError::PrivatePool(why) => write!(f, "gpumalloc pool: {why}"),
            PoolError::NotOurs { addr } => write!(
                f,
                "gpumalloc pool: free of {addr:#x}: not a live allocation of this pool \
                 (foreign pointer or double free)"
            ),
            PoolError::Lake(e) => write!(f, "gpumalloc pool: {e}"),
            PoolError::Event(e) => write!(f, "gpumalloc pool: {e}"),
            PoolError::Plan(why) => write!(f, "gpumalloc plan: {why}"),
        }
    }
}

/// Bytes as PyTorch users read them: `1.50 GiB`.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["bytes", "KiB", "MiB", "GiB", "TiB"];
    let mut v = bytes as f64;
    let mut unit = 0;
    while v >= 1024.0 && unit + 1 < UNITS.len() {
        v /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{bytes} bytes")
    } else {
        format!("{v:.2} {}", UNITS[unit])
    }
}

impl PoolError {
    /// Whether this is an out-of-memory answer (PyTorch raises
    /// `torch.cuda.OutOfMemoryError` for it).
    pub fn is_out_of_memory(&self) -> bool {
        matches!(self, PoolError::OutOfMemory { .. })
    }
}

impl std::error::Error for PoolError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            PoolError::Lake(e) => Some(e),
            PoolError::Event(e) => Some(e),
            _ => None,
        }
    }
}

impl From<EventFailure> for PoolError {
    fn from(e: EventFailure) -> PoolError {
        PoolError::Event(e)
    }
}
