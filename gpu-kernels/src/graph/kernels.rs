//! The graph kernels, GPU only: for each page source (`_heap`: our
//! [`Heap`]; `_cuda`: CUDA's device `malloc`/`free`; `_pool`: a
//! [`PagePool`]) an insert, a delete and a clear kernel, the warp-per-vertex
//! insert and delete (`graph_insert_warp_heap`, …; see [`super::warp`]),
//! plus the source-independent degree and export kernels.
//!
//! Parameters, in order (all `u64` but the heap, which is a [`Heap`] by
//! value):
//! - the source: `heap` | nothing | `pool_pages, pool_words, pool_capacity`;
//! - the graph: `heads, vertices, errors` (see [`Graph`]);
//! - insert and delete: the batch `sources, offsets, targets, n` (see
//!   [`Batch`]; one thread per entry, `n` entries; the `_warp_` kernels take
//!   one warp per entry, so launch `32 n` threads in blocks of a multiple of
//!   32);
//! - clear: `n` (= `vertices`; one thread per vertex).
//!
//! `graph_degrees(heads, vertices, errors, degrees, n)` writes each vertex's
//! degree; `graph_export(heads, vertices, errors, offsets, out, n)` writes
//! vertex `v`'s edges to `out[offsets[v]..]`; both one thread per vertex,
//! `n = vertices`. Threads past `n` return at once, so launches may round up.

use super::adjacency::{Batch, Graph};
use super::page::{PAGE_BYTES, Page};
use super::pool::PagePool;
use super::source::PageSource;
use gpu_kernel::Heap;
use gpu_kernel::arch;

unsafe extern "C" {
    /// CUDA's device-side malloc.
    fn malloc(size: usize) -> *mut u8;
    /// CUDA's device-side free.
    fn free(p: *mut u8);
}

/// CUDA's device `malloc`/`free` as a page source (the baseline).
struct CudaMalloc;

impl PageSource for CudaMalloc {
    #[inline(always)]
    fn take(&self) -> *mut Page {
        // SAFETY: CUDA's device malloc may be called from any thread.
        unsafe { malloc(PAGE_BYTES) as *mut Page }
    }

    #[inline(always)]
    fn give(&self, page: *mut Page) {
        // SAFETY: `page` came from `take`, i.e. from CUDA's malloc.
        unsafe { free(page as *mut u8) }
    }
}

/// Thread `i < n` applies batch entry `i` with `op`.
///
/// # Safety
/// The batch arrays are as [`Batch`] documents, each source appears once.
#[inline(always)]
unsafe fn per_entry(graph: Graph, batch: Batch, op: impl Fn(&Graph, u64, &[u64])) {
    let i = arch::global_thread_index();
    if i < batch.len {
        // SAFETY: i < len and the arrays are as documented (caller).
        let (v, targets) = unsafe { batch.entry(i) };
        op(&graph, v, targets);
    }
}

/// Warp `i < n` (all its 32 lanes) applies batch entry `i` with `op`, given
/// the full warp mask.
///
/// # Safety
/// As [`per_entry`]; blocks are a multiple of 32 threads, so every warp is
/// whole and all its lanes take the same branch here.
#[inline(always)]
unsafe fn per_entry_warp(graph: Graph, batch: Batch, op: impl Fn(&Graph, u32, u64, &[u64])) {
    let i = arch::global_thread_index() / arch::WARP_SIZE as u64;
    if i < batch.len {
        // SAFETY: i < len and the arrays are as documented (caller).
        let (v, targets) = unsafe { batch.entry(i) };
        op(&graph, u32::MAX, v, targets);
    }
}

/// Defines the insert, delete and clear kernels of one page source: the
/// kernel names, the source's parameters and the expression that builds it.
macro_rules! source_kernels {
    ($insert:ident, $delete:ident, $insert_warp:ident, $delete_warp:ident, $clear:ident,
     ($($p:ident: $t:ty),*), $source:expr) => {
        /// Inserts a batch of edges (see the module docs for parameters).
        ///
        /// # Safety
        /// The addresses are live arrays as the module docs describe.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $insert(
            $($p: $t,)* heads: u64, vertices: u64, errors: u64,
            sources: u64, offsets: u64, targets: u64, n: u64,
        ) {
            let graph = Graph { heads, vertices, errors };
            let batch = Batch { sources, offsets, targets, len: n };
            let source = $source;
            // SAFETY: the caller's contract.
            unsafe { per_entry(graph, batch, |g, v, t| g.insert(&source, v, t)) }
        }

        /// Deletes a batch of edges (see the module docs for parameters).
        ///
        /// # Safety
        /// The addresses are live arrays as the module docs describe.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $delete(
            $($p: $t,)* heads: u64, vertices: u64, errors: u64,
            sources: u64, offsets: u64, targets: u64, n: u64,
        ) {
            let graph = Graph { heads, vertices, errors };
            let batch = Batch { sources, offsets, targets, len: n };
            let source = $source;
            // SAFETY: the caller's contract.
            unsafe { per_entry(graph, batch, |g, v, t| g.delete(&source, v, t)) }
        }

        /// Inserts a batch of edges, one warp per entry (see the module docs
        /// for parameters).
        ///
        /// # Safety
        /// The addresses are live arrays as the module docs describe.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $insert_warp(
            $($p: $t,)* heads: u64, vertices: u64, errors: u64,
            sources: u64, offsets: u64, targets: u64, n: u64,
        ) {
            let graph = Graph { heads, vertices, errors };
            let batch = Batch { sources, offsets, targets, len: n };
            let source = $source;
            // SAFETY: the caller's contract.
            unsafe {
                per_entry_warp(graph, batch, |g, m, v, t| g.insert_warp(&source, m, v, t))
            }
        }

        /// Deletes a batch of edges, one warp per entry (see the module docs
        /// for parameters).
        ///
        /// # Safety
        /// The addresses are live arrays as the module docs describe.
        #[unsafe(no_mangle)]
        #[allow(clippy::too_many_arguments)]
        pub unsafe extern "ptx-kernel" fn $delete_warp(
            $($p: $t,)* heads: u64, vertices: u64, errors: u64,
            sources: u64, offsets: u64, targets: u64, n: u64,
        ) {
            let graph = Graph { heads, vertices, errors };
            let batch = Batch { sources, offsets, targets, len: n };
            let source = $source;
            // SAFETY: the caller's contract.
            unsafe {
                per_entry_warp(graph, batch, |g, m, v, t| g.delete_warp(&source, m, v, t))
            }
        }

        /// Gives every page back: thread `v < n` clears vertex `v`.
        ///
        /// # Safety
        /// The addresses are live arrays as the module docs describe.
        #[unsafe(no_mangle)]
        pub unsafe extern "ptx-kernel" fn $clear(
            $($p: $t,)* heads: u64, vertices: u64, errors: u64, n: u64,
        ) {
            let graph = Graph { heads, vertices, errors };
            let source = $source;
            let v = arch::global_thread_index();
            if v < n {
                graph.clear(&source, v);
            }
        }
    };
}

source_kernels!(
    graph_insert_heap,
    graph_delete_heap,
    graph_insert_warp_heap,
    graph_delete_warp_heap,
    graph_clear_heap,
    (heap: Heap),
    heap
);
source_kernels!(
    graph_insert_cuda,
    graph_delete_cuda,
    graph_insert_warp_cuda,
    graph_delete_warp_cuda,
    graph_clear_cuda,
    (),
    CudaMalloc
);
source_kernels!(
    graph_insert_pool,
    graph_delete_pool,
    graph_insert_warp_pool,
    graph_delete_warp_pool,
    graph_clear_pool,
    (pool_pages: u64, pool_words: u64, pool_capacity: u64),
    PagePool {
        pages: pool_pages,
        words: pool_words,
        capacity: pool_capacity
    }
);

/// Thread `v < n` writes the degree of vertex `v` to `degrees[v]`.
///
/// # Safety
/// The graph's arrays are live; `degrees` holds `n` words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn graph_degrees(
    heads: u64,
    vertices: u64,
    errors: u64,
    degrees: u64,
    n: u64,
) {
    let graph = Graph {
        heads,
        vertices,
        errors,
    };
    let v = arch::global_thread_index();
    if v < n {
        // SAFETY: v < n and `degrees` holds n words.
        unsafe { *(degrees as *mut u64).add(v as usize) = graph.degree(v) };
    }
}

/// Thread `v < n` writes the edges of vertex `v` to `out[offsets[v]..]`.
///
/// # Safety
/// The graph's arrays are live; `offsets` holds `n` words, each vertex's
/// range in `out` holds its degree and the ranges do not overlap.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn graph_export(
    heads: u64,
    vertices: u64,
    errors: u64,
    offsets: u64,
    out: u64,
    n: u64,
) {
    let graph = Graph {
        heads,
        vertices,
        errors,
    };
    let v = arch::global_thread_index();
    if v < n {
        // SAFETY: by the caller's contract.
        unsafe {
            let at = *(offsets as *const u64).add(v as usize);
            graph.export(v, (out as *mut u64).add(at as usize));
        }
    }
}
