//! A dynamic graph on the device heap, in the style of faimGraph (Winter et
//! al., SC 2018): every vertex owns a chain of fixed-size [`page::Page`]s of
//! edges, and the update kernels take and return pages *inside* the kernel
//! through a [`source::PageSource`]: our [`gpu_kernel::Heap`], CUDA's device
//! `malloc` (GPU only, in `kernels`) or a pre-allocated
//! [`pool::PagePool`] with a lock-free free list (faimGraph's own way).
//!
//! Updates come in batches grouped by source vertex ([`adjacency::Batch`]):
//! one thread owns one source vertex for the whole kernel, so no two threads
//! ever touch the same chain and no per-vertex lock is needed. The host sorts
//! the batch once (it builds it anyway); the price is load imbalance on hub
//! vertices, which an R-MAT batch has, but a lock per vertex would serialise
//! those same hub updates anyway and add spinning threads to the warp.
//!
//! [`warp`] does the same updates with a warp per vertex: the lanes check up to
//! 32 targets in one walk of the chain and fill a page's slots together, so a
//! hub vertex no longer serialises a batch on one thread. The kernels come in
//! both forms (`graph_insert_heap` and `graph_insert_warp_heap`, …).
//!
//! The logic ([`adjacency`], [`warp`]) is generic over the page source and builds for the
//! host as well, so a CPU test runs it with host threads over a
//! `host::CpuHeap` and compares with a reference model.

pub mod adjacency;
pub mod page;
pub mod pool;
pub mod source;
pub mod warp;

#[cfg(target_arch = "nvptx64")]
pub mod kernels;
