//! The allocator plug-in: a kernel set plus set-up and tear-down. Each test
//! is written once against [`Allocator`] and run for every plug-in.

use cudarc::driver::CudaSlice;
use host::gpu::Arg;
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
    /// Returns to a fresh state (all memory free, caches cold where it can).
    fn reset(&mut self) -> Result<()>;
    /// Launches the allocation of `n` threads into the array at `ptrs`.
    fn alloc(&mut self, gpu: &Gpu, sizes: Sizes, ptrs: u64, n: u64) -> Result<()>;
    /// Launches the free of `n` pointers at `ptrs`.
    fn free(&mut self, gpu: &Gpu, ptrs: u64, n: u64) -> Result<()>;
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
        let [a, b] = sizes.args();
        gpu.launch(
            "heap_alloc",
            n,
            &[self.heap.arg(), a, b, Arg::U64(ptrs), Arg::U64(n)],
        )
    }
    fn free(&mut self, gpu: &Gpu, ptrs: u64, n: u64) -> Result<()> {
        gpu.launch(
            "heap_free",
            n,
            &[self.heap.arg(), Arg::U64(ptrs), Arg::U64(n)],
        )
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
