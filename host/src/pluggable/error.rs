//! `PoolError`: why a [`super::StreamPool`] call failed. Each variant names
//! the cause; event failures name the CUDA call.
//!
//! Concurrency: plain values, built under the pool's lock and returned.

use std::fmt;

use crate::lake::LakeError;

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
    },
    /// A request during graph capture that cached memory cannot serve.
    CaptureNeedsWarmPool {
        /// Bytes asked for.
        asked: u64,
        /// The capturing stream.
        stream: u64,
    },
    /// `free` of an address this pool did not hand out (or already freed).
    NotOurs {
        /// The address.
        addr: u64,
    },
    /// The lake failed for another reason than memory (a driver call).
    Lake(LakeError),
    /// An event call failed.
    Event(EventFailure),
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
            } => write!(
                f,
                "gpumalloc pool: out of memory: asked {asked} bytes; {reserved} bytes reserved \
                 of a {limit}-byte limit, {active} active, largest free extent {largest_free} \
                 bytes, {waiting} bytes waiting for another stream's event (free tensors, \
                 synchronize the streams, or call empty_cache)"
            ),
            PoolError::CaptureNeedsWarmPool { asked, stream } => write!(
                f,
                "gpumalloc pool: cannot allocate {asked} bytes on stream {stream:#x} during CUDA \
                 graph capture: no cached block fits and capture forbids driver calls; capture \
                 needs a warmed pool (run the captured region once before capturing)"
            ),
            PoolError::NotOurs { addr } => write!(
                f,
                "gpumalloc pool: free of {addr:#x}: not a live allocation of this pool \
                 (foreign pointer or double free)"
            ),
            PoolError::Lake(e) => write!(f, "gpumalloc pool: {e}"),
            PoolError::Event(e) => write!(f, "gpumalloc pool: {e}"),
        }
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
