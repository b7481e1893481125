//! The allocator plug-in: a kernel set plus set-up and tear-down. Each test
//! is written once against [`Allocator`] and run for every plug-in.
//! Plug-ins: ours on a fixed heap, ours on CUDA virtual memory (a heap that
//! grows), ours on a fixed heap of the size the VMM heap grew to, CUDA's
//! device malloc, a bump-pointer bound.

use cudarc::driver::CudaSlice;
use host::gpu::Arg;
use host::vmm::{ChunkOptions, CudaVmm};
use host::vmm_heap::{CudaVmmHeap, VmmHeapConfig};
use host::{DeviceHeap, Gpu, HeapConfig, Result};

/// Sizes for one allocation kernel.
#[derive(Clone, Copy, Debug)]
pub enum Sizes {
    /// Every thread asks for this many bytes.
    Fixed(u64),
    /// Thread `t` asks for `sizes[t]` (device address of the array).
    PerThread(u64),
}

impl Sizes {
    fn args(self) -> [Arg; 2] {
        match self {
            Sizes::Fixed(s) => [Arg::U64(s), Arg::U64(0)],
            Sizes::PerThread(a) => [Arg::U64(0), Arg::U64(a)],
        }
    }
}

/// An allocator under test.
pub trait Allocator {
    /// Its name in tables and plots.
    fn name(&self) -> &'static str;
    /// Whether it frees memory (the bump bound does not).
    fn frees(&self) -> bool {
        true
    }
    /// Whether it is a baseline (CUDA's malloc, the bump bound): only
    /// baselines are held to a test's time budget; ours is always measured
    /// in full.
    fn is_baseline(&self) -> bool {
        false
    }
    /// Returns to a fresh state (all memory free, caches cold where it can).
    fn reset(&mut self) -> Result<()>;
    /// Launches the allocation of `n` threads into the array at `ptrs`.
    fn alloc(&mut self, gpu: &Gpu, sizes: Sizes, ptrs: u64, n: u64) -> Result<()>;
    /// Launches the free of `n` pointers at `ptrs`.
    fn free(&mut self, gpu: &Gpu, ptrs: u64, n: u64) -> Result<()>;
    /// Maps one more step of memory, when a round got nulls; returns the
    /// bytes added. A heap of fixed size cannot grow: 0 (the default).
    fn grow(&mut self) -> Result<u64> {
        Ok(0)
    }
    /// Bytes of physical memory the heap has mapped, for a heap that grows
    /// (`None`, the default: all of it from the start).
    fn mapped_bytes(&self) -> Result<Option<u64>> {
        Ok(None)
    }
    /// Wholly free segments now, for a heap that grows (`None`, the
    /// default: a heap whose size is fixed is not grown by its use).
    fn free_segments(&self) -> Result<Option<u32>> {
        Ok(None)
    }
    /// What the heap holds now and where its held bytes sit, for ours on a
    /// fixed heap (`None`, the default: an allocator that cannot say).
    fn heap_stats(&self) -> Result<Option<HeapSnapshot>> {
        Ok(None)
    }
    /// Makes the heap `bytes` long, for a heap that follows the size a
    /// growing heap reached in the same test; returns whether it does
    /// (false, the default: the size stays).
    fn size_to(&mut self, _bytes: u64) -> Result<bool> {
        Ok(false)
    }
}

/// Ours: the device heap.
pub struct Ours {
    heap: DeviceHeap,
    name: &'static str,
}

impl Ours {
    /// A heap of `bytes` with checks off (as users run it).
    pub fn new(gpu: &Gpu, bytes: u64) -> Result<Ours> {
        let config = HeapConfig::unchecked(bytes);
        Ours::with_config(gpu, config)
    }

    /// A heap with the given options.
    pub fn with_config(gpu: &Gpu, config: HeapConfig) -> Result<Ours> {
        let name = if config.slot_spares {
            "ours"
        } else {
            "ours-nospares"
        };
        Ok(Ours {
            heap: DeviceHeap::new(gpu, config)?,
            name,
        })
    }

    /// The heap.
    pub fn heap(&self) -> &DeviceHeap {
        &self.heap
    }
}

impl Allocator for Ours {
    fn name(&self) -> &'static str {
        self.name
    }
    fn reset(&mut self) -> Result<()> {
        self.heap.reset()
    }
    fn alloc(&mut self, gpu: &Gpu, sizes: Sizes, ptrs: u64, n: u64) -> Result<()> {
        launch_heap_alloc(gpu, self.heap.arg(), sizes, ptrs, n)
    }
    fn free(&mut self, gpu: &Gpu, ptrs: u64, n: u64) -> Result<()> {
        launch_heap_free(gpu, self.heap.arg(), ptrs, n)
    }
    fn heap_stats(&self) -> Result<Option<HeapSnapshot>> {
        let (stats, segment_map) = if super::suite::map_rounds() {
            let (stats, map) = self.heap.stats_and_segment_map()?;
            (stats, Some(map))
        } else {
            (self.heap.stats()?, None)
        };
        Ok(Some(HeapSnapshot {
            stats,
            segment_bytes: self.heap.bytes() / self.heap.segments(),
            segment_map,
        }))
    }
}

/// A heap's statistics with its segment size.
#[derive(Clone, Debug)]
pub struct HeapSnapshot {
    /// What the heap holds.
    pub stats: host::HeapStats,
    /// Bytes per segment.
    pub segment_bytes: u64,
    /// Each segment's state, where `GPUMALLOC_FRAG_MAP=1` asks for it
    /// (`DeviceHeap::stats_and_segment_map`).
    pub segment_map: Option<String>,
}

/// Ours on CUDA virtual memory (issue 13): a heap that reserves the same
/// virtual size as `ours` (so the same segment size and metadata layout),
/// maps `initial` bytes at first and grows by that much at a time while a
/// warm-up round gets nulls or leaves too few segments free at its peak
/// (see `bench::grow`). Growth uses the driver's minimum chunk (2 MiB on
/// an H100).
pub struct OursVmm {
    heap: CudaVmmHeap,
    step: u64,
}

impl OursVmm {
    /// A heap on device `ordinal` (the one `gpu` runs on) reserving
    /// `bytes`, with `initial` bytes mapped (at most `bytes`); checks off.
    pub fn new(gpu: &Gpu, ordinal: usize, bytes: u64, initial: u64) -> Result<OursVmm> {
        let initial = initial.min(bytes);
        let driver = CudaVmm::open(ordinal, ChunkOptions::default())?;
        let heap = CudaVmmHeap::on_gpu(gpu, driver, VmmHeapConfig::new(bytes, initial))?;
        Ok(OursVmm {
            heap,
            step: initial.max(1),
        })
    }

    /// The heap.
    pub fn heap(&self) -> &CudaVmmHeap {
        &self.heap
    }
}

impl Allocator for OursVmm {
    fn name(&self) -> &'static str {
        "ours-vmm"
    }
    /// Every mapped segment free again; the mapping is kept (a fresh heap
    /// of the size grown to).
    fn reset(&mut self) -> Result<()> {
        self.heap.reset()
    }
    fn alloc(&mut self, gpu: &Gpu, sizes: Sizes, ptrs: u64, n: u64) -> Result<()> {
        launch_heap_alloc(gpu, self.heap.arg(), sizes, ptrs, n)
    }
    fn free(&mut self, gpu: &Gpu, ptrs: u64, n: u64) -> Result<()> {
        launch_heap_free(gpu, self.heap.arg(), ptrs, n)
    }
    fn grow(&mut self) -> Result<u64> {
        self.heap.grow(self.step)
    }
    fn mapped_bytes(&self) -> Result<Option<u64>> {
        Ok(Some(self.heap.stats()?.mapped_bytes))
    }
    fn free_segments(&self) -> Result<Option<u32>> {
        Ok(Some(self.heap.stats()?.free_segments))
    }
}

/// Ours on a fixed heap of the size `ours-vmm` had mapped when its timed
/// rounds ran, with the VMM heap's segment size: the comparison issue 13
/// names (a fixed heap of the same final size). The heap is made again
/// (the old one freed first) when a test's size differs from the last.
pub struct OursSized {
    gpu: Gpu,
    heap: Option<Ours>,
    bytes: u64,
    segment_shift: u32,
}

impl OursSized {
    /// A heap of `bytes` (the VMM heap's first mapping) of segments of
    /// `1 << segment_shift` bytes.
    pub fn new(gpu: &Gpu, bytes: u64, segment_shift: u32) -> Result<OursSized> {
        let mut sized = OursSized {
            gpu: gpu.clone(),
            heap: None,
            bytes: 0,
            segment_shift,
        };
        sized.size_to(bytes)?;
        Ok(sized)
    }

    fn ours(&mut self) -> Result<&mut Ours> {
        self.heap
            .as_mut()
            .ok_or_else(|| host::Error::Check("ours-sized: its last heap could not be made".into()))
    }
}

impl Allocator for OursSized {
    fn name(&self) -> &'static str {
        "ours-sized"
    }
    fn reset(&mut self) -> Result<()> {
        self.ours()?.reset()
    }
    fn alloc(&mut self, gpu: &Gpu, sizes: Sizes, ptrs: u64, n: u64) -> Result<()> {
        self.ours()?.alloc(gpu, sizes, ptrs, n)
    }
    fn free(&mut self, gpu: &Gpu, ptrs: u64, n: u64) -> Result<()> {
        self.ours()?.free(gpu, ptrs, n)
    }
    fn size_to(&mut self, bytes: u64) -> Result<bool> {
        if bytes != self.bytes || self.heap.is_none() {
            // Freed before the next is made: both may not fit.
            self.heap = None;
            let config = HeapConfig {
                segment_shift: Some(self.segment_shift),
                ..HeapConfig::unchecked(bytes)
            };
            self.heap = Some(Ours::with_config(&self.gpu, config)?);
            self.bytes = bytes;
        }
        Ok(true)
    }
}

/// CUDA's device `malloc`/`free`; its heap limit is set once per process
/// (the driver refuses changes after the first kernel that uses it).
pub struct CudaMalloc;

impl CudaMalloc {
    /// Sets CUDA's malloc heap to `bytes`.
    pub fn new(gpu: &Gpu, bytes: u64) -> Result<CudaMalloc> {
        gpu.set_malloc_heap_size(bytes)?;
        Ok(CudaMalloc)
    }
}

impl Allocator for CudaMalloc {
    fn is_baseline(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "cuda-malloc"
    }
    fn reset(&mut self) -> Result<()> {
        Ok(())
    }
    fn alloc(&mut self, gpu: &Gpu, sizes: Sizes, ptrs: u64, n: u64) -> Result<()> {
        let [a, b] = sizes.args();
        gpu.launch("cuda_alloc", n, &[a, b, Arg::U64(ptrs), Arg::U64(n)])
    }
    fn free(&mut self, gpu: &Gpu, ptrs: u64, n: u64) -> Result<()> {
        gpu.launch("cuda_free", n, &[Arg::U64(ptrs), Arg::U64(n)])
    }
}

/// A bump pointer with one atomic per warp over a region of the same size:
/// a bound on speed, not an allocator (it never frees).
pub struct Bump {
    region: CudaSlice<u8>,
    counter: CudaSlice<u64>,
    bytes: u64,
    gpu: Gpu,
}

impl Bump {
    /// A region of `bytes`.
    pub fn new(gpu: &Gpu, bytes: u64) -> Result<Bump> {
        use host::error::DriverCall;
        // SAFETY: the region is written by the check kernel before it is read.
        let region =
            unsafe { gpu.stream().alloc::<u8>(bytes as usize) }.call("cuMemAlloc(bump region)")?;
        Ok(Bump {
            region,
            counter: gpu.zeros(1)?,
            bytes,
            gpu: gpu.clone(),
        })
    }
}

impl Allocator for Bump {
    fn is_baseline(&self) -> bool {
        true
    }
    fn name(&self) -> &'static str {
        "bump-bound"
    }
    fn frees(&self) -> bool {
        false
    }
    fn reset(&mut self) -> Result<()> {
        use host::error::DriverCall;
        self.gpu
            .stream()
            .memset_zeros(&mut self.counter)
            .call("cuMemsetD8")
    }
    fn alloc(&mut self, gpu: &Gpu, sizes: Sizes, ptrs: u64, n: u64) -> Result<()> {
        let [a, b] = sizes.args();
        let args = [
            Arg::U64(gpu.address(&self.counter)),
            Arg::U64(gpu.address(&self.region)),
            Arg::U64(self.bytes),
            a,
            b,
            Arg::U64(ptrs),
            Arg::U64(n),
        ];
        gpu.launch("bump_alloc", n, &args)
    }
    fn free(&mut self, _gpu: &Gpu, _ptrs: u64, _n: u64) -> Result<()> {
        self.reset()
    }
}

/// Thread `t < n` of `heap_alloc` allocates its size of `sizes` from the
/// heap passed as `heap` and writes the pointer to `ptrs[t]`.
fn launch_heap_alloc(gpu: &Gpu, heap: Arg, sizes: Sizes, ptrs: u64, n: u64) -> Result<()> {
    let [a, b] = sizes.args();
    gpu.launch("heap_alloc", n, &[heap, a, b, Arg::U64(ptrs), Arg::U64(n)])
}

/// Thread `t < n` of `heap_free` frees `ptrs[t]` into the heap `heap`.
fn launch_heap_free(gpu: &Gpu, heap: Arg, ptrs: u64, n: u64) -> Result<()> {
    gpu.launch("heap_free", n, &[heap, Arg::U64(ptrs), Arg::U64(n)])
}
