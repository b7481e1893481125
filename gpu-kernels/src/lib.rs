//! The kernels the gpumalloc host program launches, kept out of the
//! allocator crate (`gpu-kernel`) so that a user's kernel crate, which
//! depends on the allocator only, gets none of them in its PTX.
//!
//! - [`kernels`] (GPU only): the self-test, the test and benchmark kernels,
//!   the baselines (CUDA's `malloc`, a bump allocator). The kernels a heap
//!   launches on itself (flush, grow, trim) are in `heap-kernels`, which the
//!   host crate embeds.
//!   The `extern "C"` functions `gallatin_malloc` / `gallatin_free` are
//!   `device-c-abi`'s, linked here so the host's PTX holds them too (CUDA
//!   C++ links `device-c-abi`'s own PTX, see `examples/cpp`).
//! - [`selftest`]: the self-test's output layout, shared with the host check.
//! - [`workload`]: the seeded sizes and byte patterns of tests and
//!   benchmarks, shared by the GPU kernels and their CPU twins.
//! - [`graph`]: the dynamic graph whose pages come from our heap, CUDA's
//!   `malloc` or a page pool.
//!
//! The root `build.rs` compiles this crate to the PTX the host loads
//! (`gpumalloc::PTX`, file `gpu_kernels.ptx`). Like `gpu-kernel` it builds for
//! the host too, where only the kernels themselves are absent, so the graph
//! logic and the workloads run in CPU tests.

#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

pub mod graph;
pub mod selftest;
pub mod workload;

#[cfg(target_arch = "nvptx64")]
pub mod kernels;

// The C ABI's two device functions, exported from this PTX as well.
#[cfg(target_arch = "nvptx64")]
extern crate device_c_abi;
