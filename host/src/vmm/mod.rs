//! The CUDA virtual memory driver layer: the one narrow boundary between
//! the VMM users (the [`crate::vmm_heap::VmmHeap`] here, the lake's pool in
//! the `lake` crate) and the driver.
//!
//! Files: `driver` (the [`VmmDriver`] trait, its calls, counters and
//! failures), `cuda` (the real driver, [`CudaVmm`]) and `model` (a CPU model
//! of the driver, [`ModelVmm`], so every user runs unchanged in tests).

pub mod cuda;
pub mod driver;
pub mod model;

pub use cuda::CudaVmm;
pub use driver::{
    CallCount, ChunkHandle, ChunkOptions, DriverCounters, DriverFailure, FailureCause, VmmCall,
    VmmDriver,
};
pub use model::{ModelCensus, ModelVmm};
