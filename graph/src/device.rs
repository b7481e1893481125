//! `DeviceGraph`: the dynamic graph of `gpu_kernels::graph` in GPU memory, and
//! [`DevicePool`], the pre-allocated page pool. Each call launches kernels on
//! the GPU's one stream; the host owns these values and calls them from one
//! thread.
//!
//! Kernel names and parameter orders are fixed by
//! `gpu_kernels::graph::kernels`; this file is their only host caller.

use cudarc::driver::CudaSlice;
use gpu_kernels::graph::adjacency::{ERROR_WORDS, GraphError};
use gpu_kernels::graph::pool::PagePool;

use super::batch::GroupedBatch;
use host::device_heap::DeviceHeap;
use host::error::{DriverCall, Error, Result};
use host::gpu::{Arg, BLOCK_THREADS, Gpu};

// The warp kernels need whole warps: a block is a multiple of a warp.
const _: () = assert!(BLOCK_THREADS.is_multiple_of(gpu_kernel::arch::WARP_SIZE));

/// A pool of pages in GPU memory with its free list.
pub struct DevicePool {
    gpu: Gpu,
    pages: CudaSlice<u8>,
    words: CudaSlice<u64>,
    capacity: u64,
}

impl DevicePool {
    /// A pool of `capacity` pages, all free.
    pub fn new(gpu: &Gpu, capacity: u64) -> Result<DevicePool> {
        if capacity == 0 || capacity >= u32::MAX as u64 {
            return Err(Error::Check(format!(
                "a page pool needs 1..{} pages, not {capacity}",
                u32::MAX
            )));
        }
        // SAFETY: pages are written by the kernel that takes them before any
        // read.
        let pages = unsafe {
            gpu.stream()
                .alloc::<u8>(PagePool::page_bytes(capacity) as usize)
        }
        .call("cuMemAlloc(page pool)")?;
        let mut image = vec![0u64; PagePool::words(capacity) as usize];
        PagePool::write_initial_words(capacity, &mut image);
        let words = gpu.upload(&image)?;
        Ok(DevicePool {
            gpu: gpu.clone(),
            pages,
            words,
            capacity,
        })
    }

    /// The pool's kernel arguments: `pool_pages, pool_words, pool_capacity`.
    pub fn args(&self) -> [Arg; 3] {
        [
            Arg::U64(self.gpu.address(&self.pages)),
            Arg::U64(self.gpu.address(&self.words)),
            Arg::U64(self.capacity),
        ]
    }

    /// Pages in the pool.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// Free pages now (synchronises; call when no kernel uses the pool).
    pub fn free_pages(&self) -> Result<u64> {
        self.gpu.sync()?;
        Ok(PagePool::free_pages(&self.gpu.download(&self.words)?))
    }
}

/// Where the update kernels get their pages.
#[derive(Clone, Copy)]
pub enum Pages<'a> {
    /// Our device heap.
    Heap(&'a DeviceHeap),
    /// CUDA's device `malloc`/`free` (its heap limit must be large enough).
    Cuda,
    /// A pre-allocated pool.
    Pool(&'a DevicePool),
}

impl Pages<'_> {
    /// The kernel-name suffix and name in reports.
    pub fn name(&self) -> &'static str {
        match self {
            Pages::Heap(_) => "heap",
            Pages::Cuda => "cuda",
            Pages::Pool(_) => "pool",
        }
    }

    fn args(&self) -> Vec<Arg> {
        match self {
            Pages::Heap(h) => vec![h.arg()],
            Pages::Cuda => vec![],
            Pages::Pool(p) => p.args().to_vec(),
        }
    }
}

/// Who applies a batch entry (one source vertex and its targets).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum UpdateBy {
    /// One thread per vertex (`graph_insert_heap`, …).
    Thread,
    /// One warp per vertex (`graph_insert_warp_heap`, …).
    Warp,
}

impl UpdateBy {
    /// The name in reports.
    pub fn name(&self) -> &'static str {
        match self {
            UpdateBy::Thread => "thread",
            UpdateBy::Warp => "warp",
        }
    }

    /// Threads to launch for `entries` batch entries.
    fn threads(&self, entries: u64) -> u64 {
        match self {
            UpdateBy::Thread => entries,
            UpdateBy::Warp => entries * gpu_kernel::arch::WARP_SIZE as u64,
        }
    }

    fn kernel_infix(&self) -> &'static str {
        match self {
            UpdateBy::Thread => "",
            UpdateBy::Warp => "warp_",
        }
    }
}

/// A batch in GPU memory.
pub struct DeviceBatch {
    sources: CudaSlice<u64>,
    offsets: CudaSlice<u64>,
    targets: CudaSlice<u64>,
    len: u64,
}

impl DeviceBatch {
    /// Uploads `batch`.
    pub fn new(gpu: &Gpu, batch: &GroupedBatch) -> Result<DeviceBatch> {
        Ok(DeviceBatch {
            sources: gpu.upload(&batch.sources)?,
            offsets: gpu.upload(&batch.offsets)?,
            targets: gpu.upload(&batch.targets)?,
            len: batch.len(),
        })
    }
}

/// A dynamic graph in GPU memory: one head word per vertex and the error
/// counters. Pages belong to the page source the updates used; call
/// [`DeviceGraph::clear`] with the same source before dropping the graph.
pub struct DeviceGraph {
    gpu: Gpu,
    vertices: u64,
    heads: CudaSlice<u64>,
    errors: CudaSlice<u64>,
}

impl DeviceGraph {
    /// An empty graph of `vertices` vertices.
    pub fn new(gpu: &Gpu, vertices: u64) -> Result<DeviceGraph> {
        if vertices == 0 {
            return Err(Error::Check("a graph needs at least one vertex".into()));
        }
        Ok(DeviceGraph {
            gpu: gpu.clone(),
            vertices,
            heads: gpu.zeros(vertices as usize)?,
            errors: gpu.zeros(ERROR_WORDS)?,
        })
    }

    fn graph_args(&self) -> [Arg; 3] {
        [
            Arg::U64(self.gpu.address(&self.heads)),
            Arg::U64(self.vertices),
            Arg::U64(self.gpu.address(&self.errors)),
        ]
    }

    fn update(&self, op: &str, pages: Pages, by: UpdateBy, batch: &DeviceBatch) -> Result<()> {
        let mut args = pages.args();
        args.extend(self.graph_args());
        args.extend([
            Arg::U64(self.gpu.address(&batch.sources)),
            Arg::U64(self.gpu.address(&batch.offsets)),
            Arg::U64(self.gpu.address(&batch.targets)),
            Arg::U64(batch.len),
        ]);
        let kernel = format!("graph_{op}_{}{}", by.kernel_infix(), pages.name());
        self.gpu.launch(&kernel, by.threads(batch.len), &args)
    }

    /// Launches the insertion of `batch` (duplicates ignored), one thread
    /// per vertex.
    pub fn insert(&self, pages: Pages, batch: &DeviceBatch) -> Result<()> {
        self.insert_by(pages, UpdateBy::Thread, batch)
    }

    /// Launches the deletion of `batch` (absent edges ignored), one thread
    /// per vertex.
    pub fn delete(&self, pages: Pages, batch: &DeviceBatch) -> Result<()> {
        self.delete_by(pages, UpdateBy::Thread, batch)
    }

    /// Launches the insertion of `batch` by threads or warps.
    pub fn insert_by(&self, pages: Pages, by: UpdateBy, batch: &DeviceBatch) -> Result<()> {
        self.update("insert", pages, by, batch)
    }

    /// Launches the deletion of `batch` by threads or warps.
    pub fn delete_by(&self, pages: Pages, by: UpdateBy, batch: &DeviceBatch) -> Result<()> {
        self.update("delete", pages, by, batch)
    }

    /// Launches the return of every page to `pages`, emptying the graph.
    pub fn clear(&self, pages: Pages) -> Result<()> {
        let mut args = pages.args();
        args.extend(self.graph_args());
        args.push(Arg::U64(self.vertices));
        let kernel = format!("graph_clear_{}", pages.name());
        self.gpu.launch(&kernel, self.vertices, &args)
    }

    /// Pages that could not be had and ids out of range, counted by the
    /// kernels so far.
    pub fn errors(&self) -> Result<(u64, u64)> {
        self.gpu.sync()?;
        let e = self.gpu.download(&self.errors)?;
        Ok((
            e[GraphError::PageExhausted as usize],
            e[GraphError::OutOfRange as usize],
        ))
    }

    /// Every vertex's degree and all edges, vertex after vertex, each
    /// vertex's in chain order (degree and export kernels).
    pub fn export(&self) -> Result<(Vec<u64>, Vec<u64>)> {
        let n = self.vertices;
        let degrees = self.gpu.zeros(n as usize)?;
        let mut args = self.graph_args().to_vec();
        args.extend([Arg::U64(self.gpu.address(&degrees)), Arg::U64(n)]);
        self.gpu.launch("graph_degrees", n, &args)?;
        let degrees = self.gpu.download(&degrees)?;
        let mut offsets = Vec::with_capacity(n as usize);
        let mut total = 0;
        for d in &degrees {
            offsets.push(total);
            total += d;
        }
        let offsets_device = self.gpu.upload(&offsets)?;
        let out = self.gpu.zeros(total as usize)?;
        let mut args = self.graph_args().to_vec();
        args.extend([
            Arg::U64(self.gpu.address(&offsets_device)),
            Arg::U64(self.gpu.address(&out)),
            Arg::U64(n),
        ]);
        self.gpu.launch("graph_export", n, &args)?;
        let mut edges = self.gpu.download(&out)?;
        edges.truncate(total as usize);
        Ok((degrees, edges))
    }

    /// Every vertex's edges, in chain order (see [`DeviceGraph::export`]).
    pub fn adjacency(&self) -> Result<Vec<Vec<u32>>> {
        let (degrees, edges) = self.export()?;
        Ok(super::split_by_degrees(&degrees, &edges))
    }
}
