//! The device side of gpumalloc: `malloc` and `free` for threads of GPU
//! kernels, after the Gallatin design (Hunt & Johnson, PPoPP 2024).
//!
//! # Glossary
//! - **Segment**: 2 MiB … 16 MiB of heap, a size each heap fixes when it is
//!   laid out (see [`class::segment_shift_for`]); free segments are ids in
//!   the segment tree.
//! - **Class**: a slice class (16 B … 128 KiB slices) or a block class (256 KiB …
//!   one segment); a segment is formatted for one class at a time.
//! - **Block**: a class's unit of segment space: 4096 slices of a slice class
//!   (fewer where they would not fit in a segment), or one allocation of a
//!   block class.
//! - **Slice**: one allocation of a slice class.
//! - **Tree** ([`veb::VebTree`]): a set of segment ids in 64-bit words; one for
//!   free segments and one per class for segments with free blocks.
//! - **Slot** ([`slot`]): a per-class buffer word holding the block that warps
//!   carve slices from.
//! - **Team** ([`team`]): the threads of a warp that ask for the same class
//!   and slot at once; they reserve their slices with one atomic add.
//!
//! The crate builds for `nvptx64-nvidia-cuda` and for the host, where a host
//! thread acts as a one-lane warp so the same code is tested on a CPU. Only
//! [`arch`] differs between the two.
//!
//! It holds the allocator only and exports no symbol: no kernel, no
//! `#[no_mangle]` function. A user's kernel crate that depends on it gets
//! only its own kernels in its PTX. The kernels the host launches (heap
//! service, self-test, benchmarks, workloads, the dynamic graph) and the
//! `extern "C"` functions for CUDA C++ live in the `gpu-kernels` crate.

#![no_std]
#![cfg_attr(
    target_arch = "nvptx64",
    feature(abi_ptx, asm_experimental_arch, stdarch_nvptx)
)]

pub mod arch;
pub mod block;
pub mod c_layout;
pub mod class;
pub mod fingerprint;
pub mod heap;
pub mod install_clock;
pub mod layout;
pub mod request;
pub mod run;
pub mod segment;
pub mod slot;
pub mod stats;
pub mod stripe;
pub mod team;
pub mod veb;

pub use layout::Heap;
