//! The C ABI of gpumalloc's pool for PyTorch's
//! `torch.cuda.memory.CUDAPluggableAllocator`: `gm_malloc` and `gm_free`
//! with the signatures PyTorch calls, plus statistics, peak reset and
//! cache release. Backed by the real CUDA driver ([`CudaVmm`] and
//! [`CudaEvents`]), one [`StreamPool`] per device, made on first use.
//!
//! Nothing panics across the boundary: every entry point runs under
//! `catch_unwind`; a failure is written to stderr once per kind (the first
//! message of each kind) and answered with null (or, for `gm_stats`, `-1`).
//!
//! Environment: `GPUMALLOC_LIMIT_BYTES` caps the physical memory of each
//! device's pool (default: the device's total memory).
//!
//! Concurrency: the registry of pools is a process-wide static; each pool
//! is thread-safe (see `host::pluggable::pool`).

use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};

use cudarc::driver::{CudaContext, sys};
use host::lake::{ChunkOptions, CudaVmm, Lake, LakeConfig};
use host::pluggable::{CudaEvents, Registry, StreamId, StreamPool};

/// The pool of one device on the real driver.
type CudaPool = StreamPool<CudaVmm, CudaEvents>;

/// Environment variable capping each pool's physical memory, in bytes.
const LIMIT_ENV: &str = "GPUMALLOC_LIMIT_BYTES";

/// Statistics of one device's pool, as `gm_stats` fills them.
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
}

/// Kinds of failure, each reported to stderr once.
#[derive(Clone, Copy)]
enum Failure {
    Setup,
    Malloc,
    Free,
    Stats,
    EmptyCache,
    Panic,
}

const FAILURE_KINDS: usize = 6;

static REPORTED: [AtomicBool; FAILURE_KINDS] = [const { AtomicBool::new(false) }; FAILURE_KINDS];

/// Writes `msg` to stderr if no failure of `kind` was written before.
fn report(kind: Failure, msg: &str) {
    // Relaxed: only decides whether to print; no data is published.
    if !REPORTED[kind as usize].swap(true, Ordering::Relaxed) {
        eprintln!("gpumalloc_torch: {msg} (further errors of this kind are not printed)");
    }
}

fn pools() -> &'static Registry<CudaPool> {
    static POOLS: OnceLock<Registry<CudaPool>> = OnceLock::new();
    POOLS.get_or_init(Registry::new)
}

/// Makes the pool of `device`: its VMM driver, lake and events.
fn make_pool(device: i32) -> Result<CudaPool, String> {
    let ordinal = usize::try_from(device).map_err(|_| format!("bad device {device}"))?;
    let vmm = CudaVmm::open(ordinal, ChunkOptions::default())
        .map_err(|e| format!("opening device {device}: {e}"))?;
    let limit = match std::env::var(LIMIT_ENV) {
        Ok(v) => v
            .parse::<u64>()
            .map_err(|e| format!("{LIMIT_ENV}={v:?} is not a byte count: {e}"))?,
        Err(_) => {
            let ctx = CudaContext::new(ordinal)
                .map_err(|e| format!("cuDevicePrimaryCtxRetain failed on device {device}: {e}"))?;
            ctx.total_mem()
                .map_err(|e| format!("cuDeviceTotalMem failed on device {device}: {e}"))?
                as u64
        }
    };
    let events = CudaEvents::open(ordinal).map_err(|e| e.to_string())?;
    Ok(StreamPool::new(
        Lake::new(vmm, LakeConfig::with_limit(limit)),
        events,
    ))
}

fn pool(device: i32) -> Option<std::sync::Arc<CudaPool>> {
    match pools().get_or_make(device, make_pool) {
        Ok(p) => Some(p),
        Err(e) => {
            report(Failure::Setup, &format!("no pool for device {device}: {e}"));
            None
        }
    }
}

/// Runs `f`, turning a panic into `fallback` (reported once).
fn guarded<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        report(Failure::Panic, "internal panic caught at the C boundary");
        fallback
    })
}

/// Whether `stream` is being captured into a CUDA graph (a failed query
/// counts as not capturing; the allocation then proceeds normally).
fn is_capturing(stream: *mut c_void) -> bool {
    let mut status = sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_NONE;
    // SAFETY: `stream` is the stream PyTorch passed for this device (0 is
    // the legacy default stream); `status` is a valid out-pointer. The query
    // is allowed during capture and makes no allocation.
    let r = unsafe { sys::cuStreamIsCapturing(stream as sys::CUstream, &mut status) };
    r == sys::CUresult::CUDA_SUCCESS
        && status == sys::CUstreamCaptureStatus::CU_STREAM_CAPTURE_STATUS_ACTIVE
}

/// Allocates `size` bytes on `device` for `stream`. Null on failure and for
/// `size <= 0` (zero-size requests are answered with null by design).
#[unsafe(no_mangle)]
pub extern "C" fn gm_malloc(size: isize, device: i32, stream: *mut c_void) -> *mut c_void {
    guarded(std::ptr::null_mut(), || {
        let Ok(size) = u64::try_from(size) else {
            report(Failure::Malloc, &format!("gm_malloc: negative size {size}"));
            return std::ptr::null_mut();
        };
        if size == 0 {
            return std::ptr::null_mut();
        }
        let Some(pool) = pool(device) else {
            return std::ptr::null_mut();
        };
        let capturing = is_capturing(stream);
        match pool.alloc_with(size, StreamId(stream as u64), capturing) {
            Ok(addr) => addr as *mut c_void,
            Err(e) => {
                report(
                    Failure::Malloc,
                    &format!("gm_malloc on device {device}: {e}"),
                );
                std::ptr::null_mut()
            }
        }
    })
}

/// Frees `ptr` (from `gm_malloc` on `device`), last used on `stream`.
/// `size` is not needed (the pool knows each allocation's size).
#[unsafe(no_mangle)]
pub extern "C" fn gm_free(ptr: *mut c_void, _size: isize, device: i32, stream: *mut c_void) {
    guarded((), || {
        if ptr.is_null() {
            return;
        }
        let Some(pool) = pool(device) else {
            return;
        };
        let capturing = is_capturing(stream);
        if let Err(e) = pool.free_with(ptr as u64, StreamId(stream as u64), capturing) {
            report(Failure::Free, &format!("gm_free on device {device}: {e}"));
        }
    })
}

/// Fills `*out` with the statistics of `device`'s pool. Returns 0, or -1
/// when `out` is null or the pool cannot be made.
///
/// # Safety
/// `out` is null or points to writable memory for one `GmStats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_stats(device: i32, out: *mut GmStats) -> i32 {
    let stats = guarded(None, || {
        let s = pool(device)?.stats();
        Some(GmStats {
            active: s.active_bytes,
            reserved: s.reserved_bytes,
            peak_active: s.peak_active_bytes,
            peak_reserved: s.peak_reserved_bytes,
            fragmentation: s.fragmentation(),
            driver_calls: s.driver_calls,
        })
    });
    match (stats, out.is_null()) {
        (Some(s), false) => {
            // SAFETY: `out` is non-null and, by the caller's contract,
            // points to writable memory for one `GmStats`.
            unsafe { out.write(s) };
            0
        }
        _ => {
            report(
                Failure::Stats,
                &format!("gm_stats: no statistics for device {device}"),
            );
            -1
        }
    }
}

/// Sets the peaks of `device`'s pool to the current values.
#[unsafe(no_mangle)]
pub extern "C" fn gm_reset_peaks(device: i32) {
    guarded((), || {
        if let Some(p) = pool(device) {
            p.reset_peaks();
        }
    })
}

/// Releases `device`'s cached memory to the driver (like
/// `torch.cuda.empty_cache()`). Returns the bytes released, or 0.
#[unsafe(no_mangle)]
pub extern "C" fn gm_empty_cache(device: i32) -> u64 {
    guarded(0, || match pool(device).map(|p| p.empty_cache()) {
        Some(Ok(bytes)) => bytes,
        Some(Err(e)) => {
            report(
                Failure::EmptyCache,
                &format!("gm_empty_cache on device {device}: {e}"),
            );
            0
        }
        None => 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn null_and_zero_answers_need_no_gpu() {
        assert!(gm_malloc(0, 0, std::ptr::null_mut()).is_null());
        assert!(gm_malloc(-5, 0, std::ptr::null_mut()).is_null());
        gm_free(std::ptr::null_mut(), 0, 0, std::ptr::null_mut());
        // SAFETY: a null `out` is allowed and answered with -1.
        assert_eq!(unsafe { gm_stats(0, std::ptr::null_mut()) }, -1);
    }
}
