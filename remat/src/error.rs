//! Errors of the rematerialization core. Each says what was asked and why it
//! could not be done. Plain data: no shared state.

use std::fmt;

use super::tensor::TensorId;

/// What went wrong while placing, evicting or replaying.
#[derive(Debug, Clone, PartialEq)]
pub enum RematError {
    /// A tensor was placed over space that is not free.
    Overlap {
        /// The tensor being placed.
        tensor: TensorId,
        /// Its start address.
        addr: u64,
        /// Its size in bytes.
        size: u64,
    },
    /// A placement reaches past the end of the pool.
    OutOfPool {
        /// The tensor being placed.
        tensor: TensorId,
        /// Its end address.
        end: u64,
        /// The pool's capacity.
        capacity: u64,
    },
    /// A tensor id the pool or the graph does not hold.
    UnknownTensor(TensorId),
    /// A tensor is placed twice.
    AlreadyResident(TensorId),
    /// No policy choice frees a large enough block: the budget is too small.
    OutOfMemory {
        /// Bytes asked for.
        request: u64,
        /// Bytes free in the pool when it gave up.
        free: u64,
    },
    /// A policy chose a tensor that may not be evicted (pinned, locked by
    /// the running op, or not resident).
    NotEvictable(TensorId),
    /// An op ran while one of its inputs was not resident.
    InputNotResident {
        /// The tensor being computed.
        tensor: TensorId,
        /// The missing input.
        input: TensorId,
    },
    /// A trace refers to a tensor before it is made, or is malformed.
    BadTrace(String),
    /// An internal invariant does not hold (found by a `check()`).
    Invariant(String),
}

impl fmt::Display for RematError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            RematError::Overlap { tensor, addr, size } => write!(
                f,
                "tensor {tensor} placed at {addr:#x} ({size} bytes) overlaps space that is not free"
            ),
            RematError::OutOfPool {
                tensor,
                end,
                capacity,
            } => write!(
                f,
                "tensor {tensor} ends at {end:#x}, past the pool's capacity {capacity:#x}"
            ),
            RematError::UnknownTensor(t) => write!(f, "tensor {t} is not known here"),
            RematError::AlreadyResident(t) => write!(f, "tensor {t} is already in the pool"),
            RematError::OutOfMemory { request, free } => write!(
                f,
                "cannot free a contiguous block of {request} bytes ({free} bytes free in all)"
            ),
            RematError::NotEvictable(t) => {
                write!(
                    f,
                    "tensor {t} was chosen for eviction but may not be evicted"
                )
            }
            RematError::InputNotResident { tensor, input } => write!(
                f,
                "tensor {tensor} was computed while its input {input} was not resident"
            ),
            RematError::BadTrace(why) => write!(f, "bad trace: {why}"),
            RematError::Invariant(why) => write!(f, "invariant broken: {why}"),
        }
    }
}

impl std::error::Error for RematError {}

/// Result of the rematerialization core.
pub type RematResult<T> = Result<T, RematError>;
