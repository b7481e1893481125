//! gpumalloc: a fast concurrent `malloc`/`free` for GPU kernels.
//!
//! This facade re-exports the host API ([`host`]), the lake crate (as
//! [`lake`], with its [`pluggable`] pool and [`plan`]ner) and embeds the PTX of the
//! device allocator ([`PTX`]), compiled by `build.rs` with rustc's NVPTX
//! backend. [`open_gpu`] loads it onto a GPU.
//!
//! ```no_run
//! let gpu = gpumalloc::open_gpu(0)?;
//! let heap = gpumalloc::DeviceHeap::new(&gpu, gpumalloc::HeapConfig::with_bytes(1 << 30))?;
//! println!("{:?}", heap.stats()?);
//! # Ok::<(), gpumalloc::Error>(())
//! ```

pub use gpu_kernel;
pub use gpu_kernels;
pub use host::*;
pub use lake;
pub use lake::{plan, pluggable};

pub mod bench;

/// The PTX of `gpu-kernels`: every kernel the host launches (heap service,
/// self-test, benchmarks, workloads, graph) over the `gpu-kernel` allocator.
pub const PTX: &str = include_str!(env!("GPUMALLOC_PTX_PATH"));

/// Opens GPU `ordinal` with the allocator's PTX loaded.
pub fn open_gpu(ordinal: usize) -> Result<Gpu> {
    Gpu::open(ordinal, PTX)
}
