//! `GpuMetadata`: a VMM heap's metadata in device memory. Kernels allocate
//! with the handle ([`GpuMetadata::arg`]); the host publishes and withdraws
//! segments with the `heap_grow`, `heap_trim`, `heap_adopt_run`, `heap_flush`,
//! `heap_take_request` and `heap_answer_request` kernels on a
//! non-blocking stream of its own, so they run while user kernels on the
//! `Gpu`'s stream allocate, and counts free segments by copying the
//! segment tree's leaf words (a few KiB) on that stream.
//!
//! Concurrency: one mutex serialises this handle's own stream work (the
//! heap's ledger lock and the growth service both call in); user kernels
//! on the main stream run alongside, as the device code allows.
//!
//! Dropping it frees the metadata and waits for the free to land: cudarc
//! frees device buffers with `cuMemFreeAsync`, which returns the memory to
//! the stream's pool, and the pool gives it back to the driver only at the
//! next synchronisation. Without the wait, `cuMemGetInfo` right after a
//! heap is dropped still counts its metadata as taken (on an H100,
//! `tests/gpu_vmm_heap.rs` saw 162 MiB still taken after dropping a 1 TiB
//! heap whose metadata is 144 MiB).

use std::mem::ManuallyDrop;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use cudarc::driver::CudaSlice;
use gpu_kernel::Heap;
use gpu_kernel::layout::HeapLayout;
use gpu_kernel::stats::HeapStats;

use super::metadata::SegmentTree;
use crate::error::{DriverCall, Result};
use crate::gpu::{Arg, Gpu, HeapParam};

/// A heap's metadata on a GPU.
pub struct GpuMetadata {
    /// The user's device and stream (kernels that allocate run there).
    gpu: Gpu,
    /// The same device with a non-blocking stream for growth and trims.
    side: Gpu,
    heap: Heap,
    /// Segments the handles [`GpuMetadata::arg`] makes count for their
    /// rules (relaxed: a tuning value, see [`SegmentTree::set_budget`]).
    budget: AtomicU32,
    /// Dropped by hand in `Drop`, before the wait that makes the free land.
    metadata: ManuallyDrop<CudaSlice<u64>>,
    /// Serialises work on `side`.
    lock: Mutex<()>,
}

impl GpuMetadata {
    /// Metadata for `layout` with every segment absent, uploaded to `gpu`
    /// and bound to data at `data`.
    ///
    /// # Safety
    /// `data` is the start of `layout.data_bytes()` bytes of device address
    /// space aligned to a segment that nothing else uses while this value
    /// lives; only segments mapped with access are ever published.
    pub unsafe fn new(gpu: &Gpu, layout: HeapLayout, data: u64) -> Result<GpuMetadata> {
        let mut image = vec![0u64; layout.metadata_words() as usize];
        layout.write_initial_metadata_with(&mut image, 0);
        let metadata = gpu.upload(&image)?;
        gpu.sync()?;
        let side = gpu.with_new_stream()?;
        // Now, not under a running kernel (`Gpu::load_heap_kernels`).
        side.load_heap_kernels()?;
        // SAFETY: `metadata` holds the initial image in device memory owned
        // by this value, which frees it only when dropped (after `quiesce`)
        // and hands the handle out only as an image for launches; the
        // caller vouches for `data`.
        let heap = unsafe { layout.bind(data, gpu.address(&metadata)) };
        Ok(GpuMetadata {
            gpu: gpu.clone(),
            side,
            heap,
            budget: AtomicU32::new(0),
            metadata: ManuallyDrop::new(metadata),
            lock: Mutex::new(()),
        })
    }

    /// The handle as a kernel argument (the only way out: its addresses are
    /// device addresses, so no `&Heap` is handed to host code), with the
    /// budget set last (see [`SegmentTree::set_budget`]).
    pub fn arg(&self) -> Arg {
        let budget = self.budget.load(Ordering::Relaxed);
        Arg::Heap(HeapParam(self.heap.with_budget(budget).image()))
    }

    fn side(&self) -> std::sync::MutexGuard<'_, ()> {
        self.lock.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl SegmentTree for GpuMetadata {
    fn add(&self, ids: &[u32]) -> Result<u32> {
        if ids.is_empty() {
            return Ok(0);
        }
        let _side = self.side();
        let words: Vec<u64> = ids.iter().map(|&id| id as u64).collect();
        let ids_dev = self.side.upload(&words)?;
        let added = self.side.zeros(1)?;
        // SAFETY: `heap_grow(heap, ids, added, n)`; both buffers live until
        // the sync below.
        unsafe {
            self.side.launch_heap_kernel(
                "heap_grow",
                words.len() as u64,
                &[
                    self.arg(),
                    Arg::U64(self.side.address(&ids_dev)),
                    Arg::U64(self.side.address(&added)),
                    Arg::U64(words.len() as u64),
                ],
            )
        }?;
        self.side.sync()?;
        Ok(self.side.download(&added)?[0] as u32)
    }

    fn withdraw(&self, max: u32) -> Result<Vec<u32>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let _side = self.side();
        let ids = self.side.zeros(max as usize)?;
        let count = self.side.zeros(1)?;
        // SAFETY: `heap_trim(heap, max, ids, count)`; both buffers live
        // until the sync below.
        unsafe {
            self.side.launch_heap_kernel(
                "heap_trim",
                1,
                &[
                    self.arg(),
                    Arg::U64(max as u64),
                    Arg::U64(self.side.address(&ids)),
                    Arg::U64(self.side.address(&count)),
                ],
            )
        }?;
        self.side.sync()?;
        let n = self.side.download(&count)?[0] as usize;
        let ids = self.side.download(&ids)?;
        Ok(ids[..n].iter().map(|&id| id as u32).collect())
    }

    fn adopt_run(&self, head: u32, count: u32) -> Result<bool> {
        let _side = self.side();
        let ok = self.side.zeros(1)?;
        // SAFETY: `heap_adopt_run(heap, head, count, ok)`; `ok` lives until
        // the sync below.
        unsafe {
            self.side.launch_heap_kernel(
                "heap_adopt_run",
                1,
                &[
                    self.arg(),
                    Arg::U64(head as u64),
                    Arg::U64(count as u64),
                    Arg::U64(self.side.address(&ok)),
                ],
            )
        }?;
        self.side.sync()?;
        Ok(self.side.download(&ok)?[0] == 1)
    }

    fn take_request(&self) -> Result<Option<(u32, u64)>> {
        let _side = self.side();
        // A look at the slot words first (a copy, as `free_segments`
        // makes): the kernel is launched only when a request is posted.
        let slots = self.heap.request_words();
        let view = self
            .metadata
            .slice(slots.start as usize..slots.end as usize);
        let words = self
            .side
            .stream()
            .clone_dtoh(&view)
            .call("cuMemcpyDtoH(run request slots)")?;
        if !words
            .iter()
            .any(|&w| gpu_kernel::request::RequestSlot::is_posted(w))
        {
            return Ok(None);
        }
        let out = self.side.zeros(3)?;
        // SAFETY: `heap_take_request(heap, out)`; `out` (3 words) lives
        // until the sync below.
        unsafe {
            self.side.launch_heap_kernel(
                "heap_take_request",
                1,
                &[self.arg(), Arg::U64(self.side.address(&out))],
            )
        }?;
        self.side.sync()?;
        let out = self.side.download(&out)?;
        Ok((out[0] == 1).then_some((out[1] as u32, out[2])))
    }

    fn answer_request(&self, slot: u32, address: u64) -> Result<bool> {
        let _side = self.side();
        let got = self.side.zeros(1)?;
        // SAFETY: `heap_answer_request(heap, slot, address, got)`; `got`
        // lives until the sync below; the service took `slot` and made
        // `address` for it alone.
        unsafe {
            self.side.launch_heap_kernel(
                "heap_answer_request",
                1,
                &[
                    self.arg(),
                    Arg::U64(slot as u64),
                    Arg::U64(address),
                    Arg::U64(self.side.address(&got)),
                ],
            )
        }?;
        self.side.sync()?;
        Ok(self.side.download(&got)?[0] == 1)
    }

    fn free(&self, address: u64) -> Result<()> {
        let _side = self.side();
        let ptrs = self.side.upload(&[address])?;
        // SAFETY: `heap_free(heap, ptrs, n)`; `ptrs` lives until the sync
        // below.
        unsafe {
            self.side.launch_heap_kernel(
                "heap_free",
                1,
                &[self.arg(), Arg::U64(self.side.address(&ptrs)), Arg::U64(1)],
            )
        }?;
        self.side.sync()
    }

    fn flush(&self) -> Result<()> {
        let _side = self.side();
        let threads = (gpu_kernel::class::SLICE_CLASSES * gpu_kernel::slot::SLOTS_PER_CLASS) as u64;
        // SAFETY: `heap_flush(heap)`; no buffer.
        unsafe {
            self.side
                .launch_heap_kernel("heap_flush", threads, &[self.arg()])
        }?;
        self.side.sync()
    }

    fn free_segments(&self) -> Result<u32> {
        let _side = self.side();
        let leaves = self.heap.segment_tree_leaves();
        let view = self
            .metadata
            .slice(leaves.start as usize..leaves.end as usize);
        let words = self
            .side
            .stream()
            .clone_dtoh(&view)
            .call("cuMemcpyDtoH(segment tree leaves)")?;
        Ok(words.iter().map(|w| w.count_ones()).sum())
    }

    fn stats(&self) -> Result<HeapStats> {
        self.quiesce()?;
        let words = self.gpu.download(&self.metadata)?;
        Ok(HeapStats::from_snapshot(&self.heap, &words))
    }

    fn reset(&self, present: u32) -> Result<()> {
        self.quiesce()?;
        let _side = self.side();
        let mut image = vec![0u64; self.metadata.len()];
        self.heap.write_initial_metadata_with(&mut image, present);
        let stream = self.side.stream();
        stream.context().bind_to_thread().call("cuCtxSetCurrent")?;
        // SAFETY: the destination is this value's own metadata allocation,
        // exactly `image.len()` words long; nothing runs on the heap (both
        // streams were idle and the caller vouches that no kernel is
        // launched meanwhile); `image` outlives the copy, which the sync
        // below waits for. (cudarc's safe copy wants `&mut` of the buffer,
        // which this shared handle cannot give.)
        unsafe {
            cudarc::driver::result::memcpy_htod_async(
                self.side.address(&*self.metadata),
                &image,
                stream.cu_stream(),
            )
        }
        .call("cuMemcpyHtoDAsync(initial metadata)")?;
        self.side.sync()
    }

    fn set_budget(&self, segments: u32) {
        self.budget.store(segments, Ordering::Relaxed);
    }

    fn quiesce(&self) -> Result<()> {
        self.gpu.sync()?;
        let _side = self.side();
        self.side.sync()
    }
}

impl Drop for GpuMetadata {
    /// Frees the metadata and synchronises, so the memory is back with the
    /// driver (and `cuMemGetInfo` shows it free) when the drop returns.
    /// Never panics: a failed wait is reported on stderr.
    fn drop(&mut self) {
        // SAFETY: `metadata` is dropped once, here, and not used after; no
        // work on `side` is in flight (every call waits for its own), and
        // work on the user's stream that may still read the metadata comes
        // before the free in that stream's order.
        unsafe { ManuallyDrop::drop(&mut self.metadata) };
        if let Err(e) = self.gpu.sync() {
            eprintln!("gpumalloc: dropping a VMM heap's metadata: {e}");
        }
    }
}
