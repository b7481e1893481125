//! `DeviceHeap`: a heap in GPU memory. Lays out the data and the metadata,
//! writes the initial image, hands out the `Heap` handle kernels take, and
//! reads statistics back. Dropping it frees both allocations.

use cudarc::driver::CudaSlice;
use gpu_kernel::Heap;
use gpu_kernel::stats::HeapStats;

use crate::config::HeapConfig;
use crate::error::{DriverCall, Result};
use crate::gpu::{Arg, Gpu, HeapParam};

/// A heap in GPU memory.
pub struct DeviceHeap {
    gpu: Gpu,
    heap: Heap,
    _data: CudaSlice<u8>,
    metadata: CudaSlice<u64>,
}

impl DeviceHeap {
    /// Creates a heap of `config.bytes` (default: most of the free memory).
    pub fn new(gpu: &Gpu, config: HeapConfig) -> Result<DeviceHeap> {
        // Before anything is allocated: nothing to undo if it fails.
        gpu.load_heap_kernels()?;
        let bytes = match config.bytes {
            Some(b) => b,
            None => (gpu.memory()?.0 as f64 * HeapConfig::DEFAULT_FREE_FRACTION) as u64,
        };
        let layout = config.layout(bytes)?;
        // Segments start aligned to their size, so blocks and runs are
        // aligned to theirs (`Heap::malloc`): the data region starts at the
        // first multiple of a segment in the allocation.
        let align = 1u64 << layout.segment_shift();
        // SAFETY: the data region is written by its users before it is read.
        let data = unsafe {
            gpu.stream()
                .alloc::<u8>((layout.data_bytes() + align) as usize)
        }
        .call("cuMemAlloc(heap data)")?;
        let mut image = vec![0u64; layout.metadata_words() as usize];
        layout.write_initial_metadata(&mut image);
        let metadata = gpu.upload(&image)?;
        // SAFETY: `data` holds the data bytes past the alignment padding and
        // `metadata` the initial image, both device memory owned by this
        // `DeviceHeap`; it frees them only when dropped, after the stream's
        // work (cudarc frees in stream order), and hands the handle out only
        // as `&Heap` or as images passed to launches on that stream.
        let heap = unsafe {
            layout.bind(
                gpu.address(&data).next_multiple_of(align),
                gpu.address(&metadata),
            )
        };
        gpu.sync()?;
        Ok(DeviceHeap {
            gpu: gpu.clone(),
            heap,
            _data: data,
            metadata,
        })
    }

    /// The handle (borrowed: it must not outlive this heap).
    pub fn handle(&self) -> &Heap {
        &self.heap
    }

    /// The handle as a kernel argument.
    pub fn arg(&self) -> Arg {
        Arg::Heap(HeapParam(self.heap.image()))
    }

    /// Bytes of data the heap manages.
    pub fn bytes(&self) -> u64 {
        self.heap.data_bytes()
    }

    /// Segments in the heap.
    pub fn segments(&self) -> u64 {
        self.heap.segments() as u64
    }

    /// Empties the per-class slots so partly used blocks go back to their
    /// segments, and gives back segments formatted and never used (a
    /// kernel; safe while other kernels allocate).
    pub fn flush(&self) -> Result<()> {
        let threads = (gpu_kernel::class::SLICE_CLASSES * gpu_kernel::slot::SLOTS_PER_CLASS) as u64;
        // SAFETY: `heap_flush` takes the heap by value; no buffer.
        unsafe {
            self.gpu
                .launch_heap_kernel("heap_flush", threads, &[self.arg()])
        }
    }

    /// Waits for the stream, then reads what the heap holds. Call it when no
    /// kernel is using the heap.
    pub fn stats(&self) -> Result<HeapStats> {
        Ok(HeapStats::from_snapshot(&self.heap, &self.snapshot()?))
    }

    /// [`DeviceHeap::stats`] and, from the same snapshot, a map of where
    /// the heap's segments stand: one character each up to the last
    /// segment not free ([`gpu_kernel::stats::segment_mark`]). A
    /// diagnostic of `bench frag`.
    pub fn stats_and_segment_map(&self) -> Result<(HeapStats, String)> {
        let words = self.snapshot()?;
        let marks: Vec<u8> = (0..self.heap.segments())
            .map(|segment| gpu_kernel::stats::segment_mark(&self.heap, &words, segment))
            .collect();
        let used = marks.iter().rposition(|&m| m != b'.').map_or(0, |i| i + 1);
        let map = String::from_utf8_lossy(&marks[..used]).into_owned();
        Ok((HeapStats::from_snapshot(&self.heap, &words), map))
    }

    /// Waits for the stream, then copies the heap's metadata words.
    fn snapshot(&self) -> Result<Vec<u64>> {
        self.gpu.sync()?;
        self.gpu.download(&self.metadata)
    }

    /// Returns every allocation at once: rewrites the initial metadata.
    /// Only when no kernel uses the heap and no pointer into it is kept.
    pub fn reset(&mut self) -> Result<()> {
        let mut image = vec![0u64; self.heap.metadata_words() as usize];
        self.heap.write_initial_metadata(&mut image);
        self.gpu
            .stream()
            .memcpy_htod(&image, &mut self.metadata)
            .call("cuMemcpyHtoD")?;
        self.gpu.sync()
    }
}
