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
//! - **private pool**: memory of a CUDA graph (or a `torch.cuda.MemPool`)
//!   that stays the graph's until the graph is deleted; requests reach it
//!   through an allocation window ([`PrivatePools`]), and while a window is
//!   open the pool does no event work.
//!
//! Files: `block` (blocks, their origins and homes), `event` (the boundary
//! and its model), `cuda_event` (its CUDA side), `split` (the small-request
//! cache, whose free pieces carry fences), `reuse` (freed large blocks kept
//! for requests of their size), `private` (graph pools
//! and windows), `planned` (the planned mode's arena, `lake::plan`), `pool` (the thread-safe [`StreamPool`] over all of them),
//! `stats`, `error`, `registry` (one pool per device).

pub mod block;
pub mod cuda_event;
pub mod error;
pub mod event;
pub mod planned;
pub mod pool;
pub mod private;
pub mod registry;
pub mod replay;
pub mod reuse;
pub mod split;
pub mod stats;

pub use block::PoolId;
pub use cuda_event::CudaEvents;
pub use error::{EventFailure, PoolError, PoolResult};
pub use event::{EventId, EventSource, ModelEvents, StreamId};
pub use planned::PlannedRoute;
pub use pool::{MAX_EVENTS_PER_STREAM, PoolEntry, Restored, StreamPool};
pub use registry::Registry;
pub use split::{Piece, SplitCache};
pub use stats::{PoolBreakdown, PoolStats};
