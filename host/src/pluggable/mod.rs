//! The pluggable pool: the lake behind the allocator interface PyTorch
//! expects of a CUDA caching allocator (`CUDAPluggableAllocator`: allocate
//! with size, device and stream; free with pointer, size, device and
//! stream).
//!
//! Glossary:
//! - **large** request: at least one lake chunk (2 MiB on H100); served by
//!   the lake itself, with stitching;
//! - **small** request: under one chunk; served by the [`SplitCache`], which
//!   carves chunks taken from the lake into pieces;
//! - **stream rule**: memory freed on stream S is reused at once by S, and
//!   by another stream only after an event recorded on S at the free has
//!   completed ([`StreamPool`]);
//! - **event source**: the [`EventSource`] boundary, real ([`CudaEvents`])
//!   or modelled ([`ModelEvents`]);
//! - **capture**: while a CUDA graph is captured no driver call is made;
//!   requests are served from cached memory or refused.
//!
//! Files: `event` (the boundary and its model), `cuda_event` (its CUDA
//! side), `split` (the small-request cache), `pool` (the stream rule and the
//! thread-safe [`StreamPool`]), `stats`, `error`, `registry` (one pool per
//! device).

pub mod cuda_event;
pub mod error;
pub mod event;
pub mod pool;
pub mod registry;
pub mod replay;
pub mod split;
pub mod stats;

pub use cuda_event::CudaEvents;
pub use error::{EventFailure, PoolError, PoolResult};
pub use event::{EventId, EventSource, ModelEvents, StreamId};
pub use pool::StreamPool;
pub use registry::Registry;
pub use split::{Piece, SplitCache};
pub use stats::{PoolBreakdown, PoolStats};
