//! The C ABI of gpumalloc's pool for PyTorch: the allocation calls of
//! `CUDAPluggableAllocator` (`gm_malloc`, `gm_free`), and what the C++
//! extension of `python/gpumalloc_torch` needs to stand in for PyTorch's
//! whole CUDA allocator: private pools for CUDA graphs, `record_stream`,
//! the memory fraction, `empty_cache`, statistics, and the last error's
//! text so that out of memory becomes `torch.cuda.OutOfMemoryError`.
//! Backed by the real CUDA driver ([`CudaVmm`] and [`CudaEvents`]), one
//! [`StreamPool`] per device, made on first use.
//!
//! Every entry point goes through [`host::boundary::enter`]: no panic crosses the
//! boundary, the calling thread's CUDA context and capture mode are as
//! they were, and a forked child touches no driver. A call that fails
//! answers null (or -1) and leaves its message as the thread's last error
//! (`gm_last_error`).
//!
//! Environment: `GPUMALLOC_LIMIT_BYTES` caps the physical memory of each
//! device's pool (default: the device's total memory);
//! `GPUMALLOC_CHUNK_MIB` sets the lake's chunk size (default
//! [`DEFAULT_CHUNK_MIB`]); `GPUMALLOC_REUSE_ENTRIES` sets how
//! many freed blocks (split pieces and large blocks) the pool's reuse cache
//! keeps for requests of their size (default 0: off; `512`, the
//! suggested [`lake::pluggable::reuse::SUGGESTED_ENTRIES`], turns it on:
//! on the CPU replay of the GPT-2 trace it serves ~70% of requests without
//! the split cache's or the lake's trees, `docs/PERF.md`, "Reuse cache for
//! every size"; it is off by default because on the H100 a GPT-2 batch of
//! 112 with it computed a wrong first loss and batch 120 failed in cuBLAS;
//! the cause found on the CPU, a stitched view remapped under queued work,
//! is fixed in the lake, not yet confirmed on the GPU);
//! `GPUMALLOC_SPILL_TO_HOST=1` turns the lake's spill on (default off:
//! `0` or unset): when the GPU has no memory left for a new chunk (or the
//! chunk would pass the limit above), the chunk is made in pinned host
//! memory through the VMM API and mapped at the same device address, so
//! the program goes on with the same allocations, correct but slower (for
//! a profiling run that does not quite fit, e.g. the planned mode's
//! profile). With the spill on and no `GPUMALLOC_LIMIT_BYTES`, the pool
//! takes device memory only up to what was free when it opened less
//! `GPUMALLOC_SPILL_HEADROOM_MIB` (default 1024), left to CUDA itself
//! (kernel code loaded on first use, libraries' handles); past that its
//! chunks go to host memory. Spilled bytes are not
//! `reserved` (device memory): `GmStats` reports them as `spilled`,
//! `peak_spilled` and `spills`. Needs CUDA 12.2+ host-NUMA VMM support;
//! where the driver has none, the chunk's `cuMemCreate` error says so.
//!
//! Planned mode (STWeaver, `lake::plan`): `gm_plan_synthesize` turns a
//! trace saved with `gm_trace_save` into a plan file (no device needed),
//! `gm_plan_load` serves a device's general pool from it (before its
//! first allocation), `gm_trace_step` marks iterations for the plan as for
//! the recording, `gm_plan_stats` reads the plan's counters and
//! `gm_plan_drop` turns it off.
//!
//! ABI rules: functions are only added; `GmStats` and `GmPlanStats` only
//! grow at their end (the C++ extension and the ctypes mirror are updated
//! with them).
//!
//! Concurrency: the registry of pools is a process-wide static; each pool
//! is thread-safe (see `lake::pluggable::pool`).

mod call_stats;

use std::ffi::{c_char, c_void};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use call_stats::{CallKind, CallStats};
use cudarc::driver::CudaContext;
use host::boundary::{ErrorKind, enter, set_error};
use lake::pluggable::{CudaEvents, PoolEntry, PoolId, PoolStats, Registry, StreamId, StreamPool};
use lake::{ChunkOptions, CudaVmm, Lake, LakeConfig};

/// The pool of one device on the real driver.
type CudaPool = StreamPool<CudaVmm, CudaEvents>;

/// The pool of one device on the real driver, with its total memory and
/// the fraction of it the user allows.
struct Device {
    pool: CudaPool,
    total_bytes: u64,
    /// The fraction set with `gm_set_memory_fraction` (1.0 at first).
    fraction: Mutex<f64>,
    /// Host time spent inside `gm_malloc`/`gm_free` for this device: what
    /// the allocator costs the program, by kind of call.
    calls: CallStats,
}

/// Environment variable capping each pool's physical memory, in bytes.
const LIMIT_ENV: &str = "GPUMALLOC_LIMIT_BYTES";

/// Environment variable setting the lake's chunk size, in MiB.
const CHUNK_ENV: &str = "GPUMALLOC_CHUNK_MIB";

/// The lake's chunk size unless `GPUMALLOC_CHUNK_MIB` says otherwise: 16
/// MiB. Each new chunk costs a `cuMemSetAccess` of ~20 µs on an H100
/// whatever its size, and the pool's table work grows with the chunks of a
/// request, so 2 MiB chunks (the driver's granularity) cost GPT-2 at
/// batch 16 up to 150 ms of driver time in a step that grows the pool
/// (15-20 ms with 16 MiB) and twice the host time per call; they reserve
/// 2.3% less (efficiency 0.982 against 0.960 at batch 16, 0.991 against
/// 0.983 at batch 32; batch 112 fits either way). `docs/PERF.md`.
pub const DEFAULT_CHUNK_MIB: u64 = 16;

/// Environment variable setting the reuse cache's entries.
const REUSE_ENV: &str = "GPUMALLOC_REUSE_ENTRIES";

/// Environment variable turning the lake's spill to host memory on (`1`).
const SPILL_ENV: &str = "GPUMALLOC_SPILL_TO_HOST";

/// Environment variable: with the spill on and no `GPUMALLOC_LIMIT_BYTES`,
/// the MiB of device memory the pool leaves to CUDA itself.
const SPILL_HEADROOM_ENV: &str = "GPUMALLOC_SPILL_HEADROOM_MIB";

/// Device memory a spilling pool leaves free unless
/// `GPUMALLOC_SPILL_HEADROOM_MIB` says otherwise: 1 GiB. A pool that takes
/// the device to its last chunk leaves nothing for what CUDA allocates
/// outside it (kernel code loaded on first use, libraries' handles): a
/// planned GPT-2 run at batch 113 on an H100, whose arena took every chunk
/// the driver had at the start, failed in its first kernels with
/// `CUDA error: out of memory` (2026-11-23).
pub const DEFAULT_SPILL_HEADROOM_MIB: u64 = 1024;

/// The most device memory a pool takes: `explicit` (`GPUMALLOC_LIMIT_BYTES`)
/// if given; else, with the spill on, what was `free` when the pool opened
/// less `headroom` (past it, chunks go to host memory); else the device's
/// `total` (the driver's out-of-memory is the limit).
fn device_limit(explicit: Option<u64>, spill: bool, free: u64, total: u64, headroom: u64) -> u64 {
    match explicit {
        Some(limit) => limit,
        None if spill => free.saturating_sub(headroom),
        None => total,
    }
}

/// Whether `GPUMALLOC_SPILL_TO_HOST` asks for the spill: `1` yes, `0` or
/// unset no, anything else an error (a typo must not silently run
/// without the spill).
fn spill_to_host(value: Option<&str>) -> Result<bool, String> {
    match value {
        None | Some("0") => Ok(false),
        Some("1") => Ok(true),
        Some(v) => Err(format!("{SPILL_ENV}={v:?}: expected 1 (on) or 0 (off)")),
    }
}

/// What a forked child is told when it asks for memory.
const IN_CHILD: &str = "gpumalloc: CUDA memory cannot be used in a process forked after CUDA \
                        was initialised (use the 'spawn' start method for workers that need \
                        the GPU)";

/// Statistics of one device's pool, as `gm_stats` fills them. The first
/// six fields keep their order from earlier versions.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GmStats {
    /// Bytes in live allocations, as requested.
    pub active: u64,
    /// Physical bytes held.
    pub reserved: u64,
    /// Highest `active` since start or the last `gm_reset_peaks`.
    pub peak_active: u64,
    /// Highest `reserved` since start or the last `gm_reset_peaks`.
    pub peak_reserved: u64,
    /// 1 − peak active / peak reserved.
    pub fragmentation: f64,
    /// VMM driver calls made.
    pub driver_calls: u64,
    /// Bytes in live allocations, each rounded up to 512 bytes.
    pub allocated: u64,
    /// Highest `allocated` since start or the last `gm_reset_peaks`.
    pub peak_allocated: u64,
    /// Bytes freed and waiting for other streams' events.
    pub waiting: u64,
    /// Free bytes in the general split cache.
    pub split_free: u64,
    /// Free bytes held by private (CUDA graph) pools.
    pub private_free: u64,
    /// The largest free extent.
    pub largest_free: u64,
    /// The limit on physical bytes.
    pub limit: u64,
    /// Live allocations.
    pub live_allocations: u64,
    /// Allocations made.
    pub allocs: u64,
    /// Frees made.
    pub frees: u64,
    /// Requests retried after reclaiming the cache.
    pub alloc_retries: u64,
    /// Requests answered with out of memory.
    pub ooms: u64,
    /// Event calls made.
    pub event_calls: u64,
    /// Chunks held by split caches.
    pub split_chunks: u64,
    /// Private pools that exist.
    pub private_pools: u64,
    /// Reserved bytes lost to rounding small requests up to 512 bytes.
    pub small_rounding: u64,
    /// Reserved bytes lost to rounding large requests up to whole chunks.
    pub large_rounding: u64,
    /// Free lake chunks every stream may use.
    pub lake_free: u64,
    /// Nanoseconds spent in VMM driver calls.
    pub driver_ns: u64,
    /// Nanoseconds spent inside `gm_malloc`/`gm_free` (driver calls
    /// included).
    pub call_ns: u64,
    /// Of `call_ns`, nanoseconds inside allocations.
    pub alloc_call_ns: u64,
    /// Of `call_ns`, nanoseconds inside frees.
    pub free_call_ns: u64,
    /// Timed allocation calls (zero-size and forked-child calls are not).
    pub alloc_calls: u64,
    /// Timed free calls.
    pub free_calls: u64,
    /// Calls longer than 10 µs.
    pub slow_calls: u64,
    /// Nanoseconds of those calls.
    pub slow_call_ns: u64,
    /// Calls made from another thread than the call before.
    pub thread_switches: u64,
    /// Bytes of the planned arena that no live planned allocation holds
    /// (0 without a plan); part of `reserved`.
    pub planned_free: u64,
    /// Physical bytes of the planned arena (0 without a plan).
    pub planned_arena: u64,
    /// Bytes of lake chunks held in host memory (the spill,
    /// `GPUMALLOC_SPILL_TO_HOST`); not part of `reserved`.
    pub spilled: u64,
    /// Highest `spilled` since start or the last `gm_reset_peaks`.
    pub peak_spilled: u64,
    /// Chunks ever made in host memory.
    pub spills: u64,
    /// Placements that waited for the device first, so that they could
    /// patch a stitched view still in use by queued work.
    pub placement_waits: u64,
}

impl From<PoolStats> for GmStats {
    fn from(s: PoolStats) -> GmStats {
        GmStats {
            active: s.active_bytes,
            reserved: s.reserved_bytes,
            peak_active: s.peak_active_bytes,
            peak_reserved: s.peak_reserved_bytes,
            fragmentation: s.fragmentation(),
            driver_calls: s.driver_calls,
            allocated: s.allocated_bytes,
            peak_allocated: s.peak_allocated_bytes,
            waiting: s.waiting_bytes,
            split_free: s.split_free_bytes,
            private_free: s.private_free_bytes,
            largest_free: s.largest_free_bytes,
            limit: s.limit_bytes,
            live_allocations: s.live_allocations,
            allocs: s.allocs,
            frees: s.frees,
            alloc_retries: s.alloc_retries,
            ooms: s.ooms,
            event_calls: s.event_calls,
            split_chunks: s.split_chunks,
            private_pools: s.private_pools,
            small_rounding: s.breakdown.small_rounding_bytes,
            large_rounding: s.breakdown.large_rounding_bytes,
            lake_free: s.breakdown.lake_free_bytes,
            driver_ns: s.driver_nanos,
            call_ns: 0,
            alloc_call_ns: 0,
            free_call_ns: 0,
            alloc_calls: 0,
            free_calls: 0,
            slow_calls: 0,
            slow_call_ns: 0,
            thread_switches: 0,
            planned_free: s.breakdown.planned_free_bytes,
            planned_arena: s.planned_arena_bytes,
            spilled: s.spilled_bytes,
            peak_spilled: s.peak_spilled_bytes,
            spills: s.spills,
            placement_waits: s.placement_waits,
        }
    }
}

/// The planned mode's counters of one device's pool, as `gm_plan_stats`
/// fills them.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GmPlanStats {
    /// 1 while a plan is loaded, else 0 (and every other field 0).
    pub loaded: u64,
    /// Physical bytes of the arena.
    pub arena: u64,
    /// Requests served at their planned offset.
    pub plan_hits: u64,
    /// Requests served in their planned slot, smaller than planned.
    pub dynamic_slot: u64,
    /// Requests served in planned space idle during their window.
    pub dynamic_idle: u64,
    /// Requests the plan did not serve (served by the pool).
    pub fallbacks: u64,
    /// Fallbacks with no planned request at their position and stream.
    pub unmatched: u64,
    /// Highest offset + size handed out in the arena.
    pub high_water: u64,
}

impl GmPlanStats {
    fn of(pool: &lake::pluggable::PoolStats) -> GmPlanStats {
        match pool.plan {
            None => GmPlanStats::default(),
            Some(p) => GmPlanStats {
                loaded: 1,
                arena: pool.planned_arena_bytes,
                plan_hits: p.plan_hits,
                dynamic_slot: p.dynamic_slot,
                dynamic_idle: p.dynamic_idle,
                fallbacks: p.fallbacks,
                unmatched: p.unmatched,
                high_water: p.high_water,
            },
        }
    }
}

fn devices() -> &'static Registry<Device> {
    static DEVICES: OnceLock<Registry<Device>> = OnceLock::new();
    DEVICES.get_or_init(Registry::new)
}

/// Makes the pool of `device`: its VMM driver, lake and events.
fn make_device(device: i32) -> Result<Device, String> {
    host::thread_cuda::before_driver_call();
    let ordinal = usize::try_from(device).map_err(|_| format!("bad device {device}"))?;
    let chunk = match std::env::var(CHUNK_ENV) {
        Ok(v) => Some(
            v.parse::<u64>()
                .map_err(|e| format!("{CHUNK_ENV}={v:?} is not a number of MiB: {e}"))?
                << 20,
        ),
        Err(_) => Some(DEFAULT_CHUNK_MIB << 20),
    };
    let vmm = CudaVmm::open_with_chunk(ordinal, ChunkOptions::default(), chunk)
        .map_err(|e| format!("opening device {device}: {e}"))?;
    let ctx = CudaContext::new(ordinal)
        .map_err(|e| format!("cuDevicePrimaryCtxRetain failed on device {device}: {e}"))?;
    let total_bytes = ctx
        .total_mem()
        .map_err(|e| format!("cuDeviceTotalMem failed on device {device}: {e}"))?
        as u64;
    let explicit = match std::env::var(LIMIT_ENV) {
        Ok(v) => Some(
            v.parse::<u64>()
                .map_err(|e| format!("{LIMIT_ENV}={v:?} is not a byte count: {e}"))?,
        ),
        Err(_) => None,
    };
    let spill = spill_to_host(std::env::var(SPILL_ENV).ok().as_deref())?;
    let headroom = match std::env::var(SPILL_HEADROOM_ENV) {
        Ok(v) => {
            v.parse::<u64>()
                .map_err(|e| format!("{SPILL_HEADROOM_ENV}={v:?} is not a number of MiB: {e}"))?
                << 20
        }
        Err(_) => DEFAULT_SPILL_HEADROOM_MIB << 20,
    };
    let free_bytes = if spill && explicit.is_none() {
        ctx.mem_get_info()
            .map_err(|e| format!("cuMemGetInfo failed on device {device}: {e}"))?
            .0 as u64
    } else {
        total_bytes
    };
    let limit = device_limit(explicit, spill, free_bytes, total_bytes, headroom);
    let config = LakeConfig {
        spill_to_host: spill,
        ..LakeConfig::with_limit(limit)
    };
    let events = CudaEvents::open(ordinal).map_err(|e| e.to_string())?;
    let pool = StreamPool::new(Lake::new(vmm, config), events);
    let entries = match std::env::var(REUSE_ENV) {
        Ok(v) => v
            .parse::<usize>()
            .map_err(|e| format!("{REUSE_ENV}={v:?} is not a number of blocks: {e}"))?,
        Err(_) => 0,
    };
    pool.set_reuse_entries(entries)
        .map_err(|e| format!("{REUSE_ENV}: {e}"))?;
    Ok(Device {
        pool,
        total_bytes,
        fraction: Mutex::new(1.0),
        calls: CallStats::default(),
    })
}

/// The pool of `device`, made on first use; on failure the reason is the
/// thread's last error.
fn device(device: i32) -> Option<Arc<Device>> {
    match devices().get_or_make(device, make_device) {
        Ok(d) => Some(d),
        Err(e) => {
            set_error(
                ErrorKind::Other,
                format!("gpumalloc: no pool for device {device}: {e}"),
            );
            None
        }
    }
}

fn stream_id(stream: *mut c_void) -> StreamId {
    StreamId(stream as u64)
}

/// Runs `f` on the pool of `device`; 0 on success, -1 with the thread's
/// last error set otherwise.
fn with_device(dev: i32, f: impl FnOnce(&Device) -> Result<(), String>) -> i32 {
    enter(-1, Some(IN_CHILD), || {
        let Some(d) = device(dev) else {
            return -1;
        };
        match f(&d) {
            Ok(()) => 0,
            Err(e) => {
                set_error(ErrorKind::Other, e);
                -1
            }
        }
    })
}

/// Runs `call` on private pool `(hi, lo)` of `device`'s pool; 0, or -1
/// with the thread's last error set.
fn with_private_pool(
    device: i32,
    hi: u64,
    lo: u64,
    call: impl FnOnce(&CudaPool, PoolId) -> lake::pluggable::PoolResult<()>,
) -> i32 {
    with_device(device, |d| {
        call(&d.pool, PoolId(hi, lo)).map_err(|e| e.to_string())
    })
}

/// Allocates `size` bytes on `device` for `stream`, in private pool
/// `(pool_hi, pool_lo)` (`(0, 0)`: the general pool). Null for `size == 0`
/// (with no error) and on failure (with the thread's last error set:
/// `gm_last_error`).
#[unsafe(no_mangle)]
pub extern "C" fn gm_malloc_in(
    size: u64,
    device_index: i32,
    stream: *mut c_void,
    pool_hi: u64,
    pool_lo: u64,
) -> *mut c_void {
    enter(std::ptr::null_mut(), Some(IN_CHILD), || {
        if size == 0 {
            return std::ptr::null_mut();
        }
        let Some(d) = device(device_index) else {
            return std::ptr::null_mut();
        };
        let started = Instant::now();
        let result = d
            .pool
            .alloc_in(size, stream_id(stream), PoolId(pool_hi, pool_lo));
        d.calls.record(CallKind::Alloc, started);
        match result {
            Ok(addr) => addr as *mut c_void,
            Err(e) => {
                let kind = if e.is_out_of_memory() {
                    ErrorKind::OutOfMemory
                } else {
                    ErrorKind::Other
                };
                set_error(
                    kind,
                    format!("{e} [device {device_index}, stream {:#x}]", stream as u64),
                );
                std::ptr::null_mut()
            }
        }
    })
}

/// Allocates `size` bytes on `device` for `stream` from the general pool,
/// with the signature `CUDAPluggableAllocator` calls. Null for `size <= 0`
/// and on failure (see `gm_last_error`).
#[unsafe(no_mangle)]
pub extern "C" fn gm_malloc(size: isize, device: i32, stream: *mut c_void) -> *mut c_void {
    match u64::try_from(size) {
        Ok(size) => gm_malloc_in(size, device, stream, 0, 0),
        Err(_) => {
            set_error(ErrorKind::Other, format!("gm_malloc: negative size {size}"));
            std::ptr::null_mut()
        }
    }
}

/// Frees `ptr` (from `gm_malloc`/`gm_malloc_in` on `device`), last used on
/// `stream`. `size` is not needed (the pool knows each allocation's size).
/// A pointer the pool does not know is ignored, with the thread's last
/// error set. In a forked child, does nothing.
#[unsafe(no_mangle)]
pub extern "C" fn gm_free(ptr: *mut c_void, _size: isize, device_index: i32, stream: *mut c_void) {
    enter((), None, || {
        if ptr.is_null() {
            return;
        }
        let Some(d) = device(device_index) else {
            return;
        };
        let started = Instant::now();
        let result = d.pool.free(ptr as u64, stream_id(stream));
        d.calls.record(CallKind::Free, started);
        if let Err(e) = result {
            set_error(
                ErrorKind::Other,
                format!("gm_free on device {device_index}: {e}"),
            );
        }
    })
}

/// Adds `stream` to the streams that use the allocation at `ptr`
/// (`Tensor.record_stream`), on whichever device's pool holds it. 0, or -1
/// if no pool holds it.
#[unsafe(no_mangle)]
pub extern "C" fn gm_record_stream(ptr: *mut c_void, stream: *mut c_void) -> i32 {
    enter(-1, Some(IN_CHILD), || {
        for dev in devices().devices() {
            let Some(d) = devices().get(dev) else {
                continue;
            };
            if d.pool.owns(ptr as u64) {
                return match d.pool.record_stream(ptr as u64, stream_id(stream)) {
                    Ok(()) => 0,
                    Err(e) => {
                        set_error(ErrorKind::Other, e.to_string());
                        -1
                    }
                };
            }
        }
        set_error(
            ErrorKind::Other,
            format!(
                "gpumalloc: record_stream of {:#x}: not a live allocation",
                ptr as u64
            ),
        );
        -1
    })
}

/// Opens an allocation window on private pool `(hi, lo)` of `device` (a
/// CUDA graph capture begins). 0, or -1 (see `gm_last_error`).
#[unsafe(no_mangle)]
pub extern "C" fn gm_begin_allocate_to_pool(device: i32, hi: u64, lo: u64) -> i32 {
    with_private_pool(device, hi, lo, StreamPool::begin_allocate_to_pool)
}

/// Closes the window on private pool `(hi, lo)` of `device`.
#[unsafe(no_mangle)]
pub extern "C" fn gm_end_allocate_to_pool(device: i32, hi: u64, lo: u64) -> i32 {
    with_private_pool(device, hi, lo, StreamPool::end_allocate_to_pool)
}

/// Adds a user to private pool `(hi, lo)` of `device`.
#[unsafe(no_mangle)]
pub extern "C" fn gm_incref_pool(device: i32, hi: u64, lo: u64) -> i32 {
    with_private_pool(device, hi, lo, StreamPool::incref_pool)
}

/// Removes a user of private pool `(hi, lo)` of `device` (a graph was
/// deleted); its memory returns to general use when it has none left.
#[unsafe(no_mangle)]
pub extern "C" fn gm_release_pool(device: i32, hi: u64, lo: u64) -> i32 {
    with_private_pool(device, hi, lo, StreamPool::release_pool)
}

/// Users of private pool `(hi, lo)` of `device`; -1 on failure.
#[unsafe(no_mangle)]
pub extern "C" fn gm_pool_use_count(device_index: i32, hi: u64, lo: u64) -> i32 {
    enter(-1, Some(IN_CHILD), || match device(device_index) {
        Some(d) => i32::try_from(d.pool.pool_use_count(PoolId(hi, lo))).unwrap_or(i32::MAX),
        None => -1,
    })
}

/// Writes the addresses of the live allocations of private pool
/// `(hi, lo)` of `device` into `out` (at most `cap` of them) and returns
/// how many there are (possibly more than `cap`); -1 on failure.
///
/// # Safety
/// `out` is null with `cap == 0`, or points to `cap` writable `u64`s.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_pool_live_allocations(
    device_index: i32,
    hi: u64,
    lo: u64,
    out: *mut u64,
    cap: usize,
) -> i64 {
    let live = enter(None, Some(IN_CHILD), || {
        device(device_index).map(|d| d.pool.live_in_pool(PoolId(hi, lo)))
    });
    let Some(live) = live else {
        return -1;
    };
    // SAFETY: by the caller's contract.
    unsafe { copy_out(&live, out, cap) };
    i64::try_from(live.len()).unwrap_or(i64::MAX)
}

/// Writes the live allocations of private pool `(hi, lo)` of `device` (a
/// checkpoint) into `out` (at most `cap`) and returns how many there are;
/// -1 on failure.
///
/// # Safety
/// `out` is null with `cap == 0`, or points to `cap` writable entries.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_checkpoint_pool(
    device_index: i32,
    hi: u64,
    lo: u64,
    out: *mut PoolEntry,
    cap: usize,
) -> i64 {
    let entries = enter(None, Some(IN_CHILD), || {
        device(device_index).map(|d| d.pool.checkpoint_pool(PoolId(hi, lo)))
    });
    let Some(entries) = entries else {
        return -1;
    };
    // SAFETY: by the caller's contract.
    unsafe { copy_out(&entries, out, cap) };
    i64::try_from(entries.len()).unwrap_or(i64::MAX)
}

/// Puts private pool `(hi, lo)` of `device` back to the checkpoint
/// `entries[..n]`: writes the addresses it freed into `freed` (at most
/// `freed_cap`, their number into `*n_freed`) and those it allocated again
/// into `allocated` (at most `alloc_cap`, their number into `*n_allocated`).
/// 0, or -1 (see `gm_last_error`).
///
/// # Safety
/// `entries` points to `n` entries; `freed` and `allocated` point to
/// `freed_cap` and `alloc_cap` writable `u64`s (or are null with a zero
/// capacity); `n_freed` and `n_allocated` are writable.
#[unsafe(no_mangle)]
#[allow(clippy::too_many_arguments)]
pub unsafe extern "C" fn gm_restore_pool(
    device_index: i32,
    hi: u64,
    lo: u64,
    entries: *const PoolEntry,
    n: usize,
    freed: *mut u64,
    freed_cap: usize,
    n_freed: *mut usize,
    allocated: *mut u64,
    alloc_cap: usize,
    n_allocated: *mut usize,
) -> i32 {
    let checkpoint: Vec<PoolEntry> = if n == 0 {
        Vec::new()
    } else {
        // SAFETY: `entries` points to `n` entries, by the caller's contract.
        unsafe { std::slice::from_raw_parts(entries, n) }.to_vec()
    };
    let restored = enter(None, Some(IN_CHILD), || {
        let d = device(device_index)?;
        match d.pool.restore_pool(PoolId(hi, lo), &checkpoint) {
            Ok(r) => Some(r),
            Err(e) => {
                set_error(ErrorKind::Other, e.to_string());
                None
            }
        }
    });
    let Some(r) = restored else {
        return -1;
    };
    // SAFETY: the output pointers are valid, by the caller's contract.
    unsafe {
        copy_out(&r.freed, freed, freed_cap);
        copy_out(&r.allocated, allocated, alloc_cap);
        n_freed.write(r.freed.len());
        n_allocated.write(r.allocated.len());
    }
    0
}

/// Copies at most `cap` of `items` to `out`.
///
/// # Safety
/// `out` is null, or points to `cap` writable items.
unsafe fn copy_out<T: Copy>(items: &[T], out: *mut T, cap: usize) {
    if !out.is_null() {
        let n = items.len().min(cap);
        // SAFETY: `out` has `cap >= n` writable slots; `items` is a
        // distinct allocation.
        unsafe { std::ptr::copy_nonoverlapping(items.as_ptr(), out, n) };
    }
}

/// Starts recording every allocation and free of `device`'s pool (the
/// GMLKTRC format of `lake::trace`). 0, or -1.
#[unsafe(no_mangle)]
pub extern "C" fn gm_trace_start(device: i32) -> i32 {
    with_device(device, |d| {
        d.pool.start_trace();
        Ok(())
    })
}

/// Marks the start of the next training step of `device`'s pool: in the
/// recording, and in the plan (its next iteration) when one is loaded.
#[unsafe(no_mangle)]
pub extern "C" fn gm_trace_step(device: i32) -> i32 {
    with_device(device, |d| {
        d.pool.mark_step();
        Ok(())
    })
}

/// Stops `device`'s recording and writes it to the file `path` (a
/// NUL-terminated UTF-8 path). 0, or -1 (no recording, a bad path, or the
/// write failed; see `gm_last_error`).
///
/// # Safety
/// `path` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_trace_save(device: i32, path: *const c_char) -> i32 {
    if path.is_null() {
        set_error(ErrorKind::Other, "gm_trace_save: null path".to_string());
        return -1;
    }
    // SAFETY: `path` is NUL-terminated, by the caller's contract.
    let path = unsafe { std::ffi::CStr::from_ptr(path) }
        .to_string_lossy()
        .into_owned();
    with_device(device, |d| {
        let trace = d
            .pool
            .take_trace()
            .ok_or_else(|| "gm_trace_save: no trace is being recorded".to_string())?;
        trace
            .save(std::path::Path::new(&path))
            .map_err(|e| format!("gm_trace_save: writing {path}: {e}"))
    })
}

/// Reads a NUL-terminated UTF-8 path; `None` (with the thread's last error
/// set, naming `what`) for null.
///
/// # Safety
/// `path` is null or a NUL-terminated string.
unsafe fn path_arg(path: *const c_char, what: &str) -> Option<std::path::PathBuf> {
    if path.is_null() {
        set_error(ErrorKind::Other, format!("{what}: null path"));
        return None;
    }
    // SAFETY: `path` is NUL-terminated, by the caller's contract.
    let text = unsafe { std::ffi::CStr::from_ptr(path) }.to_string_lossy();
    Some(std::path::PathBuf::from(text.into_owned()))
}

/// Synthesizes a plan from the trace at `trace_path` (saved by
/// `gm_trace_save`, plain or gzip'd) and writes it to `plan_path`:
/// `warmup` steps (set-up and the first step: 1) are planned as recorded,
/// the next `iterations` steps (3) are overlaid into the iteration every
/// later step repeats; the other settings are `lake::plan`'s defaults.
/// Needs no device. Returns the synthesis time in milliseconds (profile
/// and synthesis, not reading or writing), or -1 (see `gm_last_error`:
/// unreadable trace, too few steps, unwritable plan).
///
/// # Safety
/// Both paths are NUL-terminated strings.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_plan_synthesize(
    trace_path: *const c_char,
    plan_path: *const c_char,
    iterations: u32,
    warmup: u32,
) -> i64 {
    // SAFETY: by the caller's contract.
    let Some(trace) = (unsafe { path_arg(trace_path, "gm_plan_synthesize") }) else {
        return -1;
    };
    // SAFETY: by the caller's contract.
    let Some(plan) = (unsafe { path_arg(plan_path, "gm_plan_synthesize") }) else {
        return -1;
    };
    enter(-1, None, || {
        let profile = lake::plan::ProfileConfig {
            iterations: iterations as usize,
            warmup_steps: warmup as usize,
            ..lake::plan::ProfileConfig::default()
        };
        let synth = lake::plan::SynthConfig::default();
        match lake::plan::synthesize_file(&trace, &plan, &profile, &synth) {
            Ok(made) => (made.seconds * 1000.0).round() as i64,
            Err(e) => {
                set_error(ErrorKind::Other, format!("gm_plan_synthesize: {e}"));
                -1
            }
        }
    })
}

/// Reads the plan file at `path` and serves `device`'s general pool from
/// it (`StreamPool::use_plan`), replacing a plan loaded before. Call it
/// before the device's first allocation: the plan's request order starts
/// there. 0, or -1 (see `gm_last_error`: the file is missing, damaged or
/// of another version; the pool holds live allocations; a capture is in
/// progress; the arena does not fit the memory limit). The file is read
/// before the device is touched.
///
/// # Safety
/// `path` is a NUL-terminated string.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_plan_load(device: i32, path: *const c_char) -> i32 {
    // SAFETY: by the caller's contract.
    let Some(path) = (unsafe { path_arg(path, "gm_plan_load") }) else {
        return -1;
    };
    let plan = enter(None, None, || match lake::plan::Plan::load(&path) {
        Ok(plan) => Some(plan),
        Err(e) => {
            set_error(
                ErrorKind::Other,
                format!("gm_plan_load: {}: {e}", path.display()),
            );
            None
        }
    });
    let Some(plan) = plan else {
        return -1;
    };
    with_device(device, |d| {
        d.pool
            .use_plan(plan)
            .map_err(|e| format!("gm_plan_load on device {device}: {e}"))
    })
}

/// Turns `device`'s planned mode off (its arena goes back to the pool).
/// 0 (also when no plan was loaded), or -1 while a planned allocation is
/// live (see `gm_last_error`).
#[unsafe(no_mangle)]
pub extern "C" fn gm_plan_drop(device: i32) -> i32 {
    with_device(device, |d| {
        d.pool
            .drop_plan()
            .map(|_| ())
            .map_err(|e| format!("gm_plan_drop on device {device}: {e}"))
    })
}

/// Fills `*out` with the planned mode's counters of `device` (all zero
/// when no plan is loaded). 0, or -1.
///
/// # Safety
/// `out` is null or points to writable memory for one `GmPlanStats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_plan_stats(device_index: i32, out: *mut GmPlanStats) -> i32 {
    if out.is_null() {
        set_error(ErrorKind::Other, "gm_plan_stats: null output".to_string());
        return -1;
    }
    let stats = enter(None, Some(IN_CHILD), || {
        device(device_index).map(|d| GmPlanStats::of(&d.pool.stats()))
    });
    match stats {
        Some(s) => {
            // SAFETY: `out` is non-null and, by the caller's contract,
            // points to writable memory for one `GmPlanStats`.
            unsafe { out.write(s) };
            0
        }
        None => -1,
    }
}

/// Limits `device`'s pool to `fraction` (0 < fraction <= 1) of the
/// device's memory (`torch.cuda.set_per_process_memory_fraction`).
#[unsafe(no_mangle)]
pub extern "C" fn gm_set_memory_fraction(device: i32, fraction: f64) -> i32 {
    with_device(device, |d| {
        if !(fraction > 0.0 && fraction <= 1.0) {
            return Err(format!(
                "gpumalloc: memory fraction {fraction} is not in (0, 1]"
            ));
        }
        *d.fraction.lock().unwrap_or_else(|e| e.into_inner()) = fraction;
        d.pool
            .set_limit_bytes((d.total_bytes as f64 * fraction) as u64);
        Ok(())
    })
}

/// The fraction last set with `gm_set_memory_fraction` (1.0 if none);
/// -1.0 on failure.
#[unsafe(no_mangle)]
pub extern "C" fn gm_get_memory_fraction(device_index: i32) -> f64 {
    enter(-1.0, Some(IN_CHILD), || match device(device_index) {
        Some(d) => *d.fraction.lock().unwrap_or_else(|e| e.into_inner()),
        None => -1.0,
    })
}

/// Copies this thread's last error message into `buf` (`len` bytes, NUL
/// terminated, cut to fit) and returns its kind: 0 none, 1 out of memory,
/// 2 other. The error is cleared.
///
/// # Safety
/// `buf` is null (the message is dropped) or points to `len` writable
/// bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_last_error(buf: *mut c_char, len: usize) -> i32 {
    // SAFETY: the caller's contract is `write_last_error`'s.
    unsafe { host::boundary::write_last_error(buf, len).0 as i32 }
}

/// Fills `*out` with the statistics of `device`'s pool. Returns 0, or -1
/// when `out` is null or the pool cannot be made.
///
/// # Safety
/// `out` is null or points to writable memory for one `GmStats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_stats(device_index: i32, out: *mut GmStats) -> i32 {
    if out.is_null() {
        set_error(ErrorKind::Other, "gm_stats: null output".to_string());
        return -1;
    }
    let stats = enter(None, Some(IN_CHILD), || {
        device(device_index).map(|d| {
            let c = d.calls.counts();
            GmStats {
                call_ns: c.alloc_nanos + c.free_nanos,
                alloc_call_ns: c.alloc_nanos,
                free_call_ns: c.free_nanos,
                alloc_calls: c.allocs,
                free_calls: c.frees,
                slow_calls: c.slow_calls,
                slow_call_ns: c.slow_nanos,
                thread_switches: c.thread_switches,
                ..GmStats::from(d.pool.stats())
            }
        })
    });
    match stats {
        Some(s) => {
            // SAFETY: `out` is non-null and, by the caller's contract,
            // points to writable memory for one `GmStats`.
            unsafe { out.write(s) };
            0
        }
        None => -1,
    }
}

/// Sets the peaks of `device`'s pool to the current values.
#[unsafe(no_mangle)]
pub extern "C" fn gm_reset_peaks(device_index: i32) {
    enter((), None, || {
        if let Some(d) = device(device_index) {
            d.pool.reset_peaks();
        }
    })
}

/// Releases `device`'s cached memory to the driver (like
/// `torch.cuda.empty_cache()`); a negative device means every device with
/// a pool. Returns the bytes released (0 on failure, see `gm_last_error`).
#[unsafe(no_mangle)]
pub extern "C" fn gm_empty_cache(device_index: i32) -> u64 {
    enter(0, None, || {
        let all = devices().devices();
        let list: Vec<i32> = if device_index < 0 {
            all
        } else {
            vec![device_index]
        };
        let mut released = 0;
        for dev in list {
            let Some(d) = device(dev) else {
                continue;
            };
            match d.pool.empty_cache() {
                Ok(bytes) => released += bytes,
                Err(e) => set_error(
                    ErrorKind::Other,
                    format!("gm_empty_cache on device {dev}: {e}"),
                ),
            }
        }
        released
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_and_zero_answers_need_no_gpu() {
        assert!(gm_malloc(0, 0, std::ptr::null_mut()).is_null());
        assert!(gm_malloc(-5, 0, std::ptr::null_mut()).is_null());
        let mut buf = [0 as c_char; 128];
        // SAFETY: `buf` has 128 writable bytes.
        let kind = unsafe { gm_last_error(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(kind, ErrorKind::Other as i32);
        // SAFETY: gm_last_error NUL-terminates within the buffer.
        let msg = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        assert!(
            msg.to_string_lossy().contains("negative size -5"),
            "{msg:?}"
        );
        // SAFETY: the error was taken: a second call finds none.
        assert_eq!(unsafe { gm_last_error(std::ptr::null_mut(), 0) }, 0);
        gm_free(std::ptr::null_mut(), 0, 0, std::ptr::null_mut());
        // SAFETY: a null `out` is allowed and answered with -1.
        assert_eq!(unsafe { gm_stats(0, std::ptr::null_mut()) }, -1);
    }

    fn last_error() -> (i32, String) {
        let mut buf = [0 as c_char; 4096];
        // SAFETY: `buf` has 4096 writable bytes.
        let kind = unsafe { gm_last_error(buf.as_mut_ptr(), buf.len()) };
        // SAFETY: gm_last_error NUL-terminates within the buffer.
        let msg = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        (kind, msg.to_string_lossy().into_owned())
    }

    fn c_path(p: &std::path::Path) -> std::ffi::CString {
        std::ffi::CString::new(p.to_str().unwrap()).unwrap()
    }

    /// Synthesis and the plan file's checks need no GPU: the repository's
    /// GPT-2 trace becomes a plan file that reads back; a bad trace, a bad
    /// plan file and null paths are refused with a message (a bad file
    /// before any device is touched).
    #[test]
    fn plan_synthesis_and_file_checks_need_no_gpu() {
        let dir = std::env::temp_dir().join(format!("gm-abi-plan-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let trace = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../lake/tests/data/gpt2-b16-6steps.trace.gz");
        let plan = dir.join("b16.plan");
        // SAFETY: both are NUL-terminated strings.
        let ms =
            unsafe { gm_plan_synthesize(c_path(&trace).as_ptr(), c_path(&plan).as_ptr(), 3, 1) };
        assert!((0..10_000).contains(&ms), "{ms} ms: {:?}", last_error());
        let back = lake::plan::Plan::load(&plan).unwrap();
        assert!(
            back.arena > 11 << 30 && back.arena < 13 << 30,
            "{}",
            back.arena
        );
        // A missing trace.
        let missing = dir.join("missing.trace");
        // SAFETY: both are NUL-terminated strings.
        let r =
            unsafe { gm_plan_synthesize(c_path(&missing).as_ptr(), c_path(&plan).as_ptr(), 3, 1) };
        assert_eq!(r, -1);
        let (kind, msg) = last_error();
        assert_eq!(kind, ErrorKind::Other as i32);
        assert!(msg.contains("reading the trace"), "{msg}");
        // A damaged plan file: refused before the device.
        let bad = dir.join("bad.plan");
        let text = std::fs::read_to_string(&plan).unwrap();
        std::fs::write(&bad, &text[..text.len() / 2]).unwrap();
        // SAFETY: a NUL-terminated string.
        assert_eq!(unsafe { gm_plan_load(0, c_path(&bad).as_ptr()) }, -1);
        let (_, msg) = last_error();
        assert!(
            msg.starts_with("gm_plan_load: ") && msg.contains("bad.plan"),
            "{msg}"
        );
        // SAFETY: a NUL-terminated string.
        assert_eq!(unsafe { gm_plan_load(0, c_path(&missing).as_ptr()) }, -1);
        assert!(last_error().1.contains("missing.trace"));
        // SAFETY: null paths and outputs are allowed and refused.
        unsafe {
            assert_eq!(gm_plan_load(0, std::ptr::null()), -1);
            assert!(last_error().1.contains("null path"));
            assert_eq!(
                gm_plan_synthesize(std::ptr::null(), std::ptr::null(), 3, 1),
                -1
            );
            assert_eq!(gm_plan_stats(0, std::ptr::null_mut()), -1);
        }
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn plan_stats_mirror_the_pools_counters() {
        let mut pool = lake::pluggable::PoolStats::default();
        assert_eq!(GmPlanStats::of(&pool), GmPlanStats::default());
        pool.planned_arena_bytes = 12 << 30;
        pool.plan = Some(lake::plan::RuntimeStats {
            plan_hits: 5,
            dynamic_slot: 4,
            dynamic_idle: 3,
            fallbacks: 2,
            unmatched: 1,
            high_water: 7,
        });
        let s = GmPlanStats::of(&pool);
        assert_eq!(
            (
                s.loaded,
                s.arena,
                s.plan_hits,
                s.dynamic_slot,
                s.dynamic_idle
            ),
            (1, 12 << 30, 5, 4, 3)
        );
        assert_eq!((s.fallbacks, s.unmatched, s.high_water), (2, 1, 7));
        // The C mirror: 8 u64 fields (GmStats' mirrors are checked by
        // `layout_tests`).
        assert_eq!(std::mem::size_of::<GmPlanStats>(), 8 * 8);
    }

    #[test]
    fn spill_env_is_on_only_for_1_and_refuses_typos() {
        assert_eq!(spill_to_host(None), Ok(false));
        assert_eq!(spill_to_host(Some("0")), Ok(false));
        assert_eq!(spill_to_host(Some("1")), Ok(true));
        for bad in ["", "yes", "true", "2"] {
            let e = spill_to_host(Some(bad)).unwrap_err();
            assert!(e.starts_with("GPUMALLOC_SPILL_TO_HOST="), "{e}");
        }
    }

    /// A spilling pool stops taking device memory `headroom` short of what
    /// was free when it opened; an explicit limit wins; without the spill
    /// the device's total is the limit (the driver's out-of-memory decides).
    #[test]
    fn a_spilling_pool_leaves_headroom_on_the_device() {
        let (gib, free, total) = (1u64 << 30, 78u64 << 30, 80u64 << 30);
        assert_eq!(device_limit(None, true, free, total, gib), 77 * gib);
        assert_eq!(device_limit(None, false, free, total, gib), total);
        assert_eq!(
            device_limit(Some(10 * gib), true, free, total, gib),
            10 * gib
        );
        assert_eq!(
            device_limit(None, true, gib / 2, total, gib),
            0,
            "all of it spills"
        );
    }

    #[test]
    fn gm_stats_reports_spilled_bytes_apart_from_reserved() {
        let pool = lake::pluggable::PoolStats {
            reserved_bytes: 7 << 30,
            spilled_bytes: 3 << 30,
            peak_spilled_bytes: 4 << 30,
            spills: 200,
            ..lake::pluggable::PoolStats::default()
        };
        let s = GmStats::from(pool);
        assert_eq!(
            (s.reserved, s.spilled, s.peak_spilled, s.spills),
            (7 << 30, 3 << 30, 4 << 30, 200)
        );
    }

    #[test]
    fn messages_are_cut_to_the_buffer_and_terminated() {
        set_error(ErrorKind::OutOfMemory, "x".repeat(100));
        let mut buf = [1 as c_char; 8];
        // SAFETY: `buf` has 8 writable bytes.
        let kind = unsafe { gm_last_error(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(kind, ErrorKind::OutOfMemory as i32);
        assert_eq!(buf[7], 0);
        assert!(buf[..7].iter().all(|&c| c == b'x' as c_char));
    }
}

#[cfg(test)]
mod layout_tests {
    use super::GmStats;

    /// Field names of the `GmStats` mirror in `text`, between `start` and
    /// the first `end` after it, for `split` separated declarations.
    fn mirror_fields(text: &str, start: &str, end: &str) -> Vec<String> {
        let from = text.find(start).expect("the mirror is there") + start.len();
        let body = &text[from..from + text[from..].find(end).expect("it ends")];
        body.split([',', ';', '\n'])
            .map(|f| f.split_whitespace().last().unwrap_or("").to_string())
            .map(|f| f.trim_matches(|c| c == '(' || c == '"').to_string())
            .filter(|f| !f.is_empty() && f.chars().all(|c| c.is_ascii_alphanumeric() || c == '_'))
            .collect()
    }

    /// The C++ extension and the Python ctypes binding copy `GmStats` whole:
    /// a mirror with fewer fields would be overrun by `gm_stats`. Both must
    /// have one 8-byte field per field of the Rust struct.
    #[test]
    fn gm_stats_mirrors_have_every_field() {
        let fields = std::mem::size_of::<GmStats>() / 8;
        let root = concat!(env!("CARGO_MANIFEST_DIR"), "/../python/gpumalloc_torch");
        let cpp = std::fs::read_to_string(format!("{root}/csrc/gpumalloc_ext.cpp")).unwrap();
        let cpp_fields = mirror_fields(&cpp, "struct GmStats {", "};");
        // `uint64_t`/`double` type words are followed by names; drop them.
        let cpp_fields: Vec<_> = cpp_fields
            .into_iter()
            .filter(|f| f != "uint64_t" && f != "double")
            .collect();
        assert_eq!(cpp_fields.len(), fields, "C++ mirror: {cpp_fields:?}");
        let py = std::fs::read_to_string(format!("{root}/__init__.py")).unwrap();
        let py_fields = py[py.find("class GmStats").unwrap()..]
            .lines()
            .skip_while(|l| !l.contains("_fields_"))
            .take_while(|l| !l.trim_start().starts_with(']'))
            .filter(|l| l.contains("ctypes.c_"))
            .count();
        assert_eq!(py_fields, fields, "Python mirror");
    }
}
