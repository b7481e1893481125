//! The lake: a pool of physical GPU memory in chunks of the driver's
//! granularity (2 MiB on H100), handed out as contiguous device ranges by
//! stitching non-contiguous chunks into new virtual ranges with CUDA's
//! virtual memory management (the GMLake idea: Guo et al., "GMLake: Efficient
//! and Transparent GPU Memory Defragmentation for Large-scale DNN Training
//! with Virtual Memory Stitching", ASPLOS 2024).
//!
//! The crate also holds what is built on the lake: [`pluggable`], the lake
//! as a PyTorch pluggable allocator (split cache, private pools of CUDA
//! graphs, stream rule, one pool per device, `replay` of allocation traces),
//! and [`plan`], planned allocation (addresses synthesized offline from
//! profiled steps of an allocation trace, served by the pool).
//!
//! Glossary:
//! - **chunk**: one granule of physical memory (`cuMemCreate`), mapped at its
//!   *home* slot for as long as it lives;
//! - **home view**: a large reservation whose slots receive new chunks in
//!   order (PyTorch's expandable segments), so neighbours form runs;
//! - **stitched view** (GMLake's sBlock): a second virtual range mapping
//!   chunks from anywhere back to back: no copy, no new physical memory;
//! - **window**: consecutive slots of a view whose chunks are all free,
//!   what an allocation takes (no driver call);
//! - **driver**: the [`VmmDriver`] boundary, real ([`CudaVmm`]) or modelled
//!   on the CPU ([`ModelVmm`]).
//!
//! The driver layer (`driver`, the boundary; `cuda` and `model`, its two
//! sides) and `addr_map` (hash maps keyed by device address) live in the
//! `host` crate (`host::vmm`, `host::addr_map`), where the VMM heap uses
//! them too; they are re-exported here under their old names.
//!
//! Files: `tables` (chunks, views, free runs), `tables/free_bits` (which
//! home slots are free), `tables/pieces` (which home slots a stitched view
//! maps) and `tables/mapping` (the driver work that changes them, with
//! rollback), `fence`
//! (the stream rule kept on free memory), `pool`
//! (the policy and the thread-safe [`Lake`]), `config`, `stats`, `error`,
//! `trace`, `synthetic` (a GPT-2-like trace generator), `periodic` (the
//! periodic training-like trace and the replay that measures fragmentation
//! and call times on it), `caching` (a best-fit caching pool over the same
//! driver: the baseline the lake is measured against).

pub mod caching;
pub mod config;
pub mod error;
pub mod fence;
pub mod periodic;
pub mod plan;
pub mod pluggable;
pub mod pool;
pub mod stats;
pub mod synthetic;
pub mod tables;
pub mod trace;

pub use caching::{CachingPool, CachingStats};
pub use config::LakeConfig;
pub use cuda::CudaVmm;
pub use driver::{
    CallCount, ChunkHandle, ChunkOptions, DriverCounters, DriverFailure, FailureCause, VmmCall,
    VmmDriver,
};
pub use error::{LakeError, LakeResult};
pub use fence::{Fence, Progress, Requester};
pub use host::addr_map::{self, AddrHasher, AddrMap, AddrSet};
pub use host::vmm::{cuda, driver, model};
pub use model::{ModelCensus, ModelVmm};
pub use pool::{DeviceRange, Lake};
pub use stats::{LakeBreakdown, LakeStats, Outcomes};
pub use trace::{Event, EventKind, Site, Trace, TraceError, TraceRecorder};
