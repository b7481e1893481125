//! The kernels the host's heap API launches on a heap, and nothing else:
//! `heap_flush` (empty the per-class slots, give back segments formatted
//! and never used), `heap_grow` (publish absent
//! segments), `heap_trim` (withdraw wholly free segments),
//! `heap_adopt_run` (publish a range the host stitched as one live run),
//! `heap_take_request` and `heap_answer_request` (the growth service's
//! side of device run requests) and `heap_free` (free pointers the host
//! holds, such as `alloc_large`'s). `host::gpu::HEAP_KERNELS` must name
//! every one: a heap loads them all when it is made.
//!
//! `host`'s `build.rs` compiles this crate to PTX and embeds it; a `Gpu`
//! loads that module into its context the first time a heap needs one of
//! these kernels, beside whatever module the user opened it with. So a heap
//! works the same on a `Gpu` opened with the user's own PTX, with the
//! allocator's benchmark kernels, or with none: the user's PTX never has
//! to carry our kernels, and our kernels never need the user's.
//!
//! Concurrency: each kernel is safe while other kernels allocate and free
//! on the same heap; what makes it so is the `Heap` method it calls
//! (`flush_slot`, `add_segment`, `withdraw_free_segment`, `adopt_run`).
//!
//! On the host (CPU tests, clippy) the crate is empty.

#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx))]

#[cfg(target_arch = "nvptx64")]
mod kernels;
