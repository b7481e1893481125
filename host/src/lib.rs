//! Host side of gpumalloc: sets up the device heap on a GPU through the CUDA
//! driver (loaded at run time with `cudarc`, so nothing here needs a CUDA
//! toolkit to build) or on the CPU, reports what it holds, and runs the
//! architecture self-test.
//!
//! - [`gpu::Gpu`]: one device, one stream, the loaded PTX module.
//! - [`device_heap::DeviceHeap`]: a heap in GPU memory.
//! - [`cpu_heap::CpuHeap`]: the same heap in host memory, used by host threads
//!   (tests, and the benchmark when no GPU is present).
//! - [`vmm`]: the CUDA virtual memory driver layer ([`vmm::VmmDriver`],
//!   real [`vmm::CudaVmm`] and CPU model [`vmm::ModelVmm`]) that
//!   [`vmm_heap`] and the `lake` crate's pool are written against.
//! - [`addr_map`]: hash maps and sets keyed by device address.
//! - [`boundary`]: what every C entry point goes through (panic guard,
//!   CUDA context and capture mode kept, fork refused, last error).
//! - [`selftest`]: runs `gpumalloc_selftest` and checks every result.
//! - [`thread_cuda`]: a caller's CUDA context and capture mode kept across
//!   a library call, saved only if the call reaches the driver.
//! - [`vmm_heap::VmmHeap`]: a heap on CUDA virtual memory: a large virtual
//!   range reserved at creation, physical memory mapped per segment as it
//!   grows (`grow`, a growth service) and given back by `trim`.
//!
//! The lake (the CUDA VMM stitching pool), the PyTorch pool and the planner
//! are the `lake` crate, built on this one.

pub mod addr_map;
pub mod boundary;
pub mod config;
pub mod cpu_heap;
pub mod device_heap;
pub mod error;
pub mod gpu;
pub mod selftest;
pub mod thread_cuda;
pub mod vmm;
pub mod vmm_heap;

pub use config::HeapConfig;
pub use cpu_heap::CpuHeap;
/// The CUDA driver bindings the host API is written against (streams,
/// events, buffers), so users need not match our cudarc version and features.
pub use cudarc;
pub use device_heap::DeviceHeap;
pub use error::{Error, Result};
pub use gpu::Gpu;
pub use gpu_kernel::stats::HeapStats;
pub use vmm_heap::{GrowthPolicy, VmmHeap, VmmHeapConfig, VmmHeapStats};
