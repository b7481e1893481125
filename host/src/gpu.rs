//! `Gpu`: one CUDA device with one stream and the loaded PTX module (none
//! for [`Gpu::open_device`], which serves heaps whose kernels the caller
//! launches itself), over cudarc's driver API (loaded at run time). Every
//! failure names the driver call. A second module, the heap kernels
//! ([`HEAP_KERNELS_PTX`]), is loaded the first time a heap needs one, so a
//! heap's flush, growth and trim do not depend on the user's module.
//!
//! Concurrency: a `Gpu` and its clones may be used from several threads;
//! the function caches are behind mutexes.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cudarc::driver::{
    CudaContext, CudaFunction, CudaModule, CudaSlice, CudaStream, DevicePtr, DeviceRepr,
    LaunchConfig, PushKernelArg, ValidAsZeroBits, sys,
};
use cudarc::nvrtc::Ptx;
use gpu_kernel::layout::HeapImage;

use crate::error::{DriverCall, Error, Result};

/// Threads per block of every launch.
pub const BLOCK_THREADS: u32 = 256;

/// PTX of the kernels a heap launches on itself (crate `heap-kernels`:
/// [`HEAP_KERNELS`]), built by this
/// crate's `build.rs`. Every [`Gpu`] loads it on first use, so heaps work on
/// a `Gpu` opened with any module or none.
pub const HEAP_KERNELS_PTX: &str = include_str!(env!("GPUMALLOC_HEAP_KERNELS_PTX_PATH"));

/// The kernels of [`HEAP_KERNELS_PTX`], every one of them: each is
/// loaded when a heap is made ([`Gpu::load_heap_kernels`]). One left out
/// is loaded on its first launch, and under CUDA's lazy loading that load
/// may wait for the kernels running in the context: the growth service's
/// first `heap_take_request`, launched while the kernel whose threads
/// posted the request waits for it, was held until that kernel ended (on
/// an H100 every request timed out and none was taken).
pub const HEAP_KERNELS: [&str; 7] = [
    "heap_flush",
    "heap_grow",
    "heap_trim",
    "heap_adopt_run",
    "heap_take_request",
    "heap_answer_request",
    "heap_free",
];

/// The heap kernels' module in one context, once loaded, and the functions
/// looked up in it.
#[derive(Default)]
struct HeapKernels {
    module: Option<Arc<CudaModule>>,
    functions: HashMap<String, CudaFunction>,
}

/// The environment variable that sets another block size for every
/// [`Gpu::launch`], for measuring how a kernel's occupancy moves its time
/// (a whole number of warps, 32 to 1024; unset: [`BLOCK_THREADS`]).
pub const BLOCK_THREADS_ENV: &str = "GPUMALLOC_BLOCK_THREADS";

/// Threads per block of [`Gpu::launch`]: [`BLOCK_THREADS`], or
/// `GPUMALLOC_BLOCK_THREADS` where it is set to a whole number of warps
/// from 32 to 1024 (said once on stderr; another value is ignored, with one
/// line on stderr that says why). Read once per process.
pub fn block_threads() -> u32 {
    static CHOSEN: std::sync::OnceLock<u32> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let Ok(text) = std::env::var(BLOCK_THREADS_ENV) else {
            return BLOCK_THREADS;
        };
        match text.trim().parse::<u32>() {
            Ok(n) if (32..=1024).contains(&n) && n.is_multiple_of(32) => {
                // Said once, so every log of a run made this way shows it.
                eprintln!("gpumalloc: launching {n}-thread blocks ({BLOCK_THREADS_ENV})");
                n
            }
            _ => {
                eprintln!(
                    "gpumalloc: {BLOCK_THREADS_ENV}={text:?} ignored (it must be a multiple \
                     of 32 from 32 to 1024); launching {BLOCK_THREADS}-thread blocks"
                );
                BLOCK_THREADS
            }
        }
    })
}

/// One-dimensional blocks of [`block_threads`] covering `threads` (at
/// least one block; kernels skip the threads past their count).
fn grid_for(threads: u64) -> LaunchConfig {
    let per_block = block_threads();
    let blocks = threads.div_ceil(per_block as u64).max(1);
    LaunchConfig {
        grid_dim: (blocks as u32, 1, 1),
        block_dim: (per_block, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// A kernel parameter.
#[derive(Clone, Copy, Debug)]
pub enum Arg {
    /// A 64-bit value or device address.
    U64(u64),
    /// A 32-bit value.
    U32(u32),
    /// A heap handle, passed by value.
    Heap(HeapParam),
}

/// A `Heap` as a kernel parameter (its image: the handle's bytes).
#[repr(transparent)]
#[derive(Clone, Copy, Debug)]
pub struct HeapParam(pub HeapImage);

// SAFETY: `HeapImage` is the `#[repr(C)]` `Heap`'s bytes as plain words; the
// kernels declare `Heap` by value.
unsafe impl DeviceRepr for HeapParam {}

/// One GPU, its stream, and the loaded module.
#[derive(Clone)]
pub struct Gpu {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    /// `None` when opened with [`Gpu::open_device`]: no kernel to launch.
    module: Option<Arc<CudaModule>>,
    /// Functions of `module` looked up so far, by name.
    functions: Arc<Mutex<HashMap<String, CudaFunction>>>,
    /// The heap kernels' module ([`HEAP_KERNELS_PTX`]), loaded into the
    /// context on the first [`Gpu::launch_heap_kernel`], and its functions
    /// looked up so far; shared by every clone.
    heap_kernels: Arc<Mutex<HeapKernels>>,
    /// How long [`Gpu::sync`] and [`Gpu::download`] (and so every heap's
    /// `stats`) wait for queued work before [`Error::Timeout`]; `None`:
    /// as long as it takes ([`Gpu::with_wait_limit`]).
    wait_limit: Option<std::time::Duration>,
}

impl Gpu {
    /// Checks that a driver and at least one GPU are present.
    pub fn available() -> Result<()> {
        // SAFETY: only tries to load the library; no CUDA call is made.
        if !unsafe { sys::is_culib_present() } {
            return Err(Error::NoDriver);
        }
        match CudaContext::device_count().call("cuDeviceGetCount")? {
            0 => Err(Error::NoDevice),
            _ => Ok(()),
        }
    }

    /// For `#[ignore]`d GPU tests, which run only when asked for
    /// (`--include-ignored`): panics unless [`Gpu::available`], saying why
    /// and how to run the tests without a GPU, so that a test asked to run
    /// where it cannot fails rather than passes without checking anything.
    pub fn require_for_test() {
        if let Err(e) = Gpu::available() {
            panic!(
                "no GPU ({e}): this test needs one; without a GPU, run the tests without \
                 --include-ignored (cargo then reports them as ignored)"
            );
        }
    }

    /// Opens device `ordinal` and loads `ptx` into it.
    pub fn open(ordinal: usize, ptx: &str) -> Result<Gpu> {
        let mut gpu = Gpu::open_device(ordinal)?;
        let module = gpu
            .ctx
            .load_module(Ptx::from_src(ptx))
            .call("cuModuleLoadData")?;
        gpu.check_layout(&module, "the PTX given to Gpu::open")?;
        gpu.module = Some(module);
        Ok(gpu)
    }

    /// Refuses a module built over another heap layout than this host's
    /// (`gpu_kernel::fingerprint`): its kernels would read and write heaps
    /// laid out differently. A module without the allocator (no
    /// fingerprint global) passes.
    fn check_layout(&self, module: &Arc<CudaModule>, what: &str) -> Result<()> {
        use gpu_kernel::fingerprint::{LAYOUT_FINGERPRINT, LAYOUT_FINGERPRINT_SYMBOL};
        let global = match module.get_global(LAYOUT_FINGERPRINT_SYMBOL, &self.stream) {
            Ok(global) => global,
            Err(e) if e.0 == sys::CUresult::CUDA_ERROR_NOT_FOUND => return Ok(()),
            Err(e) => return Err(e).call("cuModuleGetGlobal(GPUMALLOC_LAYOUT_FINGERPRINT)"),
        };
        let mut bytes = [0u8; 8];
        if global.len() != bytes.len() {
            return Err(Error::Config(format!(
                "{what}: its {LAYOUT_FINGERPRINT_SYMBOL} is {} bytes, not 8",
                global.len()
            )));
        }
        // Synchronised first, as `download` does: a pageable copy waiting
        // on a running kernel would block every thread's driver calls.
        self.stream.synchronize().call("cuStreamSynchronize")?;
        self.stream
            .memcpy_dtoh(&global, &mut bytes)
            .call("cuMemcpyDtoH(GPUMALLOC_LAYOUT_FINGERPRINT)")?;
        check_layout_fingerprint(u64::from_le_bytes(bytes), LAYOUT_FINGERPRINT, what)
    }

    /// Opens device `ordinal` (its primary context, the one the CUDA
    /// runtime uses) with no module: heaps and buffers, but no
    /// [`Gpu::launch`]. For callers that launch their own kernels (the C
    /// API, CUDA C++ programs).
    pub fn open_device(ordinal: usize) -> Result<Gpu> {
        Gpu::available()?;
        let ctx = CudaContext::new(ordinal).call("cuDevicePrimaryCtxRetain")?;
        // One stream, synchronised explicitly: cudarc's per-buffer events
        // would add driver calls around every launch.
        // SAFETY: nothing is in flight yet.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.default_stream();
        Ok(Gpu {
            ctx,
            stream,
            module: None,
            functions: Arc::new(Mutex::new(HashMap::new())),
            heap_kernels: Arc::new(Mutex::new(HeapKernels::default())),
            wait_limit: None,
        })
    }

    /// The same device and module with a stream of its own, created
    /// non-blocking: its work runs alongside kernels on this `Gpu`'s stream
    /// (the legacy default stream) instead of waiting for them. What a heap
    /// uses to grow and trim while user kernels allocate.
    pub fn with_new_stream(&self) -> Result<Gpu> {
        let stream = self.ctx.new_stream().call("cuStreamCreate")?;
        Ok(Gpu {
            stream,
            ..self.clone()
        })
    }

    /// The device's ordinal (what `Gpu::open` was given).
    pub fn ordinal(&self) -> usize {
        self.ctx.ordinal()
    }

    /// The device's name.
    pub fn name(&self) -> Result<String> {
        self.ctx.name().call("cuDeviceGetName")
    }

    /// The driver's CUDA version, e.g. "13.0".
    pub fn driver_version(&self) -> Result<String> {
        let mut v = 0;
        // SAFETY: writes one int.
        unsafe { sys::cuDriverGetVersion(&mut v) }
            .result()
            .call("cuDriverGetVersion")?;
        Ok(format!("{}.{}", v / 1000, (v % 1000) / 10))
    }

    /// (free, total) bytes of device memory.
    pub fn memory(&self) -> Result<(u64, u64)> {
        let (free, total) = self.ctx.mem_get_info().call("cuMemGetInfo")?;
        Ok((free as u64, total as u64))
    }

    /// Sets the size of CUDA's own device-malloc heap (the baseline).
    pub fn set_malloc_heap_size(&self, bytes: u64) -> Result<()> {
        self.ctx
            .set_limit(sys::CUlimit::CU_LIMIT_MALLOC_HEAP_SIZE, bytes as usize)
            .call("cuCtxSetLimit(MALLOC_HEAP_SIZE)")
    }

    /// The stream every call uses.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The same device, module and stream, whose waits give up after
    /// `limit`: [`Gpu::sync`], [`Gpu::download`] and what calls them (a
    /// heap's `stats`, `reset`) answer [`Error::Timeout`] instead of
    /// blocking forever behind a hung kernel. `None` waits as long as it
    /// takes (the default).
    pub fn with_wait_limit(&self, limit: Option<std::time::Duration>) -> Gpu {
        Gpu {
            wait_limit: limit,
            ..self.clone()
        }
    }

    /// Waits for all launched work (for at most the wait limit, if this
    /// `Gpu` has one).
    pub fn sync(&self) -> Result<()> {
        match self.wait_limit {
            Some(limit) => self.sync_timeout(limit),
            None => self.stream.synchronize().call("cuStreamSynchronize"),
        }
    }

    /// Waits for all work launched so far, for at most `limit`: an event
    /// recorded behind it is polled (sleeping 50 µs, doubling up to 1 ms,
    /// between polls) until it completes, else [`Error::Timeout`]. A hung
    /// kernel is not cancelled (CUDA cannot); the error lets the caller
    /// report it instead of blocking forever, as [`Gpu::sync`] would.
    pub fn sync_timeout(&self, limit: std::time::Duration) -> Result<()> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING);
        let done = self.ctx.new_event(flags).call("cuEventCreate")?;
        done.record(&self.stream).call("cuEventRecord")?;
        let start = std::time::Instant::now();
        let mut nap = std::time::Duration::from_micros(50);
        loop {
            if done.try_is_complete().call("cuEventQuery")? {
                return Ok(());
            }
            let waited = start.elapsed();
            if waited >= limit {
                return Err(Error::Timeout {
                    what: "the stream's work",
                    waited,
                });
            }
            std::thread::sleep(nap.min(limit - waited));
            nap = (nap * 2).min(std::time::Duration::from_millis(1));
        }
    }

    /// `n` zeroed words of device memory.
    pub fn zeros(&self, n: usize) -> Result<CudaSlice<u64>> {
        self.zeros_of::<u64>(n)
    }

    /// `n` zeroed values of any type cudarc can hold on the device (at
    /// least one, so the buffer has an address).
    pub fn zeros_of<T: DeviceRepr + ValidAsZeroBits>(&self, n: usize) -> Result<CudaSlice<T>> {
        self.stream
            .alloc_zeros::<T>(n.max(1))
            .call("cuMemAllocAsync")
    }

    /// A device copy of `values` (`u64` words, `f32`s, bytes, …).
    pub fn upload<T: DeviceRepr>(&self, values: &[T]) -> Result<CudaSlice<T>> {
        self.stream.clone_htod(values).call("cuMemcpyHtoD")
    }

    /// A host copy of a device buffer, after the work queued before it on
    /// this `Gpu`'s stream. With a wait limit, that work must finish within
    /// it (else [`Error::Timeout`], and nothing is copied).
    ///
    /// The stream is synchronised before the copy, never inside it: a
    /// copy to pageable memory that waits for a running kernel blocks
    /// every other thread's driver calls in the process until the kernel
    /// ends (measured on an H100: even `cuStreamCreate`), and a VMM heap's
    /// growth service, which must grow the heap and answer run requests
    /// *while* that kernel runs, is such a thread.
    pub fn download<T: DeviceRepr>(&self, buffer: &CudaSlice<T>) -> Result<Vec<T>> {
        self.sync()?;
        self.stream.clone_dtoh(buffer).call("cuMemcpyDtoH")
    }

    /// The device address of a buffer.
    pub fn address<T>(&self, buffer: &CudaSlice<T>) -> u64 {
        buffer.device_ptr(&self.stream).0
    }

    fn function(&self, kernel: &str) -> Result<CudaFunction> {
        let mut map = self.functions.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = map.get(kernel) {
            return Ok(f.clone());
        }
        let Some(module) = &self.module else {
            return Err(Error::Config(format!(
                "kernel {kernel}: this Gpu has no module (opened with Gpu::open_device); \
                 open it with Gpu::open(ordinal, ptx) to launch kernels"
            )));
        };
        let f = module.load_function(kernel).call("cuModuleGetFunction")?;
        map.insert(kernel.to_string(), f.clone());
        Ok(f)
    }

    /// The heap kernel `kernel` (of [`HEAP_KERNELS_PTX`]), loading that
    /// module into this context the first time.
    fn heap_kernel(&self, kernel: &str) -> Result<CudaFunction> {
        let mut loaded = self.heap_kernels.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = loaded.functions.get(kernel) {
            return Ok(f.clone());
        }
        let module = match &loaded.module {
            Some(m) => m.clone(),
            None => {
                let m = self
                    .ctx
                    .load_module(Ptx::from_src(HEAP_KERNELS_PTX))
                    .call("cuModuleLoadData(heap kernels)")?;
                self.check_layout(&m, "the heap kernels' PTX")?;
                loaded.module = Some(m.clone());
                m
            }
        };
        let f = module
            .load_function(kernel)
            .call("cuModuleGetFunction(heap kernels)")?;
        loaded.functions.insert(kernel.to_string(), f.clone());
        Ok(f)
    }

    /// Loads every heap kernel now. A heap calls it when it is made: loaded
    /// on first use instead, the module (and, with CUDA's lazy loading, each
    /// function) would be loaded while user kernels run, perhaps by the
    /// growth service while a kernel waits for it, and a load may wait for
    /// the context.
    pub(crate) fn load_heap_kernels(&self) -> Result<()> {
        for kernel in HEAP_KERNELS {
            self.heap_kernel(kernel)?;
        }
        Ok(())
    }

    /// Launches heap kernel `kernel` (one of [`HEAP_KERNELS`]) over `threads` threads on this
    /// `Gpu`'s stream, whatever module the `Gpu` was opened with.
    ///
    /// # Safety
    /// `args` match the kernel's parameters (`heap-kernels`) in number,
    /// order and type, and every buffer it touches stays alive until the
    /// stream has finished it.
    pub(crate) unsafe fn launch_heap_kernel(
        &self,
        kernel: &str,
        threads: u64,
        args: &[Arg],
    ) -> Result<()> {
        let f = self.heap_kernel(kernel)?;
        // SAFETY: the caller's contract.
        unsafe { self.launch_function(&f, grid_for(threads), args) }
    }

    /// Launches `kernel` over `threads` threads (rounded up to whole blocks
    /// of [`BLOCK_THREADS`]; every kernel takes its thread count and skips
    /// the rest).
    pub fn launch(&self, kernel: &str, threads: u64, args: &[Arg]) -> Result<()> {
        let cfg = grid_for(threads);
        // SAFETY: the argument lists of our kernels are fixed by
        // `gpu_kernels::kernels`; each caller in this crate passes them in
        // order with buffers it keeps alive until it synchronises.
        unsafe { self.launch_with(kernel, cfg, args) }
    }

    /// Launches `kernel` of this `Gpu`'s module with the caller's grid,
    /// block and dynamic shared memory (cudarc's [`LaunchConfig`]) on this
    /// `Gpu`'s stream.
    ///
    /// # Safety
    /// `args` match the kernel's parameters in number, order and type, and
    /// every buffer the kernel touches stays alive until the stream has
    /// finished it (e.g. [`Gpu::sync`]).
    pub unsafe fn launch_with(&self, kernel: &str, cfg: LaunchConfig, args: &[Arg]) -> Result<()> {
        let f = self.function(kernel)?;
        // SAFETY: the caller's contract.
        unsafe { self.launch_function(&f, cfg, args) }
    }

    /// Launches `f` on this `Gpu`'s stream.
    ///
    /// # Safety
    /// As [`Gpu::launch_with`].
    unsafe fn launch_function(
        &self,
        f: &CudaFunction,
        cfg: LaunchConfig,
        args: &[Arg],
    ) -> Result<()> {
        let mut builder = self.stream.launch_builder(f);
        for a in args {
            match a {
                Arg::U64(v) => builder.arg(v),
                Arg::U32(v) => builder.arg(v),
                Arg::Heap(h) => builder.arg(h),
            };
        }
        // SAFETY: the caller's contract.
        unsafe { builder.launch(cfg) }.call("cuLaunchKernel")?;
        Ok(())
    }

    /// Runs `work` between two events and returns the milliseconds between
    /// them (after synchronising).
    pub fn time(&self, work: impl FnOnce() -> Result<()>) -> Result<f64> {
        let flags = Some(sys::CUevent_flags::CU_EVENT_DEFAULT);
        let start = self.ctx.new_event(flags).call("cuEventCreate")?;
        let end = self.ctx.new_event(flags).call("cuEventCreate")?;
        start.record(&self.stream).call("cuEventRecord")?;
        work()?;
        end.record(&self.stream).call("cuEventRecord")?;
        end.synchronize().call("cuEventSynchronize")?;
        Ok(start.elapsed_ms(&end).call("cuEventElapsedTime")? as f64)
    }

    /// As [`Gpu::time`], but the start event waits behind a kernel that
    /// holds the stream for `hold` (`hold_stream`, in the module of
    /// `gpu_kernels`), so `work`'s launches are queued on the GPU before
    /// timing begins. The time is then the GPU's: it leaves out the host's
    /// submission latency (a few microseconds per launch, which `time`
    /// counts whenever the GPU waits for the host) as long as `work` is
    /// submitted within `hold`. For kernels of a few microseconds.
    pub fn time_queued(&self, hold: Duration, work: impl FnOnce() -> Result<()>) -> Result<f64> {
        let ns = u64::try_from(hold.as_nanos()).unwrap_or(u64::MAX);
        self.launch("hold_stream", 1, &[Arg::U64(ns), Arg::U64(1)])?;
        self.time(work)
    }
}

/// The error for a module whose layout fingerprint `found` is not this
/// host's `ours` (`what` names the module); `Ok` when they agree.
pub fn check_layout_fingerprint(found: u64, ours: u64, what: &str) -> Result<()> {
    if found == ours {
        return Ok(());
    }
    Err(Error::Config(format!(
        "{what} was built over another gpumalloc heap layout (its layout fingerprint \
         {found:#018x}, this program's {ours:#018x}): its kernels would corrupt heaps this \
         program lays out. Rebuild the PTX from the same gpumalloc source with the same \
         GPUMALLOC_* settings (ptx_builder::PtxBuilder in the same cargo build does), or \
         remove stale PTX files"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every kernel of the heap kernels' module is in [`HEAP_KERNELS`], so
    /// none is loaded under a running kernel (see there). The request
    /// kernels were once missing: the growth service's first take waited
    /// for the kernel whose requests it was to serve.
    #[test]
    fn every_heap_kernel_is_loaded_when_a_heap_is_made() {
        let mut entries: Vec<&str> = HEAP_KERNELS_PTX
            .lines()
            .filter_map(|line| line.split_once(".entry ").map(|(_, rest)| rest))
            .map(|rest| rest.split(['(', ' ']).next().unwrap_or(rest).trim())
            .collect();
        entries.sort_unstable();
        let mut listed = HEAP_KERNELS.to_vec();
        listed.sort_unstable();
        assert_eq!(entries, listed);
    }
}
