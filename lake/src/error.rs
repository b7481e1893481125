//! `LakeError`: why a lake call failed. Each variant names the cause and, for
//! driver failures, the driver call.
//!
//! Concurrency: plain values, built under the lake's lock and returned.

use std::fmt;

use super::driver::DriverFailure;

/// Result of lake calls.
pub type LakeResult<T> = Result<T, LakeError>;

/// What went wrong in a lake call.
#[derive(Debug)]
pub enum LakeError {
    /// A request of zero bytes.
    ZeroSize,
    /// Not enough physical memory under the limit, even after releasing
    /// every free chunk that could not help.
    OutOfMemory {
        /// Bytes asked for (rounded up to whole chunks).
        asked: u64,
        /// Physical bytes held by the lake.
        reserved: u64,
        /// Bytes in live allocations (rounded up to whole chunks).
        active: u64,
        /// The limit on physical bytes.
        limit: u64,
        /// The largest free primitive block, in bytes.
        largest_free: u64,
    },
    /// `free` of a range this lake never handed out (or with another length).
    NotOurs {
        /// The range's address.
        addr: u64,
        /// The range's length.
        len: u64,
        /// Why it is not ours.
        why: &'static str,
    },
    /// `free` of a range that was handed out and already freed.
    DoubleFree {
        /// The range's address.
        addr: u64,
    },
    /// A driver call failed; whatever the lake had half done was undone.
    Driver(DriverFailure),
}

impl fmt::Display for LakeError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LakeError::ZeroSize => write!(f, "lake: cannot allocate zero bytes"),
            LakeError::OutOfMemory {
                asked,
                reserved,
                active,
                limit,
                largest_free,
            } => write!(
                f,
                "lake: out of physical memory: asked {asked} bytes, reserved {reserved} of a \
                 {limit}-byte limit, {active} active, largest free block {largest_free} bytes \
                 (free something or raise LakeConfig::limit_bytes)"
            ),
            LakeError::NotOurs { addr, len, why } => {
                write!(f, "lake: range {addr:#x} (+{len} bytes) is not ours: {why}")
            }
            LakeError::DoubleFree { addr } => {
                write!(
                    f,
                    "lake: double free of range {addr:#x}: it is already free"
                )
            }
            LakeError::Driver(e) => write!(f, "lake: {e} (the operation was rolled back)"),
        }
    }
}

impl LakeError {
    /// Whether the request failed for lack of memory: the lake's limit, or
    /// the driver's own `CUDA_ERROR_OUT_OF_MEMORY` (other processes, or the
    /// context itself, hold what the limit would allow).
    pub fn is_out_of_memory(&self) -> bool {
        match self {
            LakeError::OutOfMemory { .. } => true,
            LakeError::Driver(e) => e.is_out_of_memory(),
            _ => false,
        }
    }
}

impl std::error::Error for LakeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            LakeError::Driver(e) => Some(e),
            _ => None,
        }
    }
}

impl From<DriverFailure> for LakeError {
    fn from(e: DriverFailure) -> LakeError {
        LakeError::Driver(e)
    }
}
