//! gpumalloc's C API (`include/gpumalloc.h`, `libgpumalloc_c.so`): create a
//! device heap, hand its `gm_heap` to kernels that call `gallatin_malloc` /
//! `gallatin_free`, read its statistics, destroy it. A thin layer over
//! [`host::DeviceHeap`]; the device functions come from `gpu-kernels`' PTX,
//! which the user links into their CUDA C++ program (README, "Linking from
//! CUDA C++").
//!
//! Every entry point goes through [`host::boundary::enter`], as the PyTorch
//! pool's does: no panic crosses the boundary, the calling thread's CUDA
//! context and capture mode are kept, a forked child touches no driver. A
//! call answers a [`GmStatus`]; on failure the thread's last error
//! ([`gm_heap_last_error`]) says what failed, naming the driver call.
//!
//! The header is checked against this crate and `gpu_kernel::Heap` when the
//! crate builds (module `header`) and compiled by the system C compiler in
//! `tests/header.rs`.
//!
//! Concurrency: a heap may be used from several host threads at once (its
//! calls take `&DeviceHeap`), except `gm_heap_destroy`, which must be the
//! last call on it.

mod header;

use std::ffi::{c_char, c_int};

use gpu_kernel::class::CLASSES;
use gpu_kernel::layout::HeapImage;
use host::boundary::{ErrorKind, enter, forked, set_error};
use host::cudarc::driver::sys::CUresult;
use host::vmm::FailureCause;
use host::{DeviceHeap, Error, Gpu, HeapConfig, HeapStats};

/// What a call answers (`gm_status`).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GmStatus {
    /// Done.
    Ok = 0,
    /// A null pointer, a negative device, an unknown flag.
    InvalidArgument = 1,
    /// The size cannot be laid out (0, under a segment, too large).
    HeapSize = 2,
    /// `libcuda` cannot be loaded.
    NoDriver = 3,
    /// The driver reports no GPU.
    NoDevice = 4,
    /// The device has not that much free memory.
    OutOfMemory = 5,
    /// Another driver call failed; the message names it.
    Cuda = 6,
    /// A bug in gpumalloc: a panic caught at the boundary.
    Internal = 7,
    /// The device code linked into the program was built over another heap
    /// layout than this library's (`gm_layout_check`); the message says to
    /// rebuild it.
    Layout = 8,
}

/// `GM_HEAP_CHECKED`: one bit per slice, so double frees of slices are
/// detected.
pub const HEAP_CHECKED: u32 = 1;
/// `GM_HEAP_TRAP_ON_MISUSE`: a wild or double free stops the kernel.
pub const HEAP_TRAP_ON_MISUSE: u32 = 2;

/// What a heap holds (`gm_heap_stats`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GmHeapStats {
    /// Bytes of data (whole segments).
    pub heap_bytes: u64,
    /// Bytes per segment.
    pub segment_bytes: u64,
    /// Segments in the heap.
    pub segments: u64,
    /// Segments in the segment tree.
    pub free_segments: u64,
    /// Bytes handed out and not freed, at class granularity.
    pub live_bytes: u64,
    /// Live allocations of every kind.
    pub live_allocations: u64,
    /// Live multi-segment allocations.
    pub live_runs: u64,
    /// Segments those hold.
    pub run_segments: u64,
    /// `gallatin_malloc` calls that answered null for a non-zero size.
    pub failed_mallocs: u64,
    /// Frees of pointers the heap never handed out.
    pub invalid_frees: u64,
    /// Detected double frees.
    pub double_frees: u64,
    /// Live allocations per class (16 B, 32 B, … one segment).
    pub live_per_class: [u64; CLASSES as usize],
}

impl GmHeapStats {
    fn new(s: &HeapStats, segment_bytes: u64) -> GmHeapStats {
        GmHeapStats {
            heap_bytes: s.segments as u64 * segment_bytes,
            segment_bytes,
            segments: s.segments as u64,
            free_segments: s.free_segments as u64,
            live_bytes: s.live_bytes,
            live_allocations: s.live_allocations(),
            live_runs: s.live_runs,
            run_segments: s.run_segments,
            failed_mallocs: s.failed_mallocs,
            invalid_frees: s.invalid_frees,
            double_frees: s.double_frees,
            live_per_class: s.live_per_class,
        }
    }
}

/// A heap in one device's memory (`gm_device_heap`, opaque to C).
pub struct GmDeviceHeap {
    heap: DeviceHeap,
}

/// Why a call failed: the status and the message for the last error.
struct Failure(GmStatus, String);

impl Failure {
    /// Keeps the message as the thread's last error; answers the status.
    fn report(self) -> GmStatus {
        let kind = match self.0 {
            GmStatus::OutOfMemory => ErrorKind::OutOfMemory,
            _ => ErrorKind::Other,
        };
        set_error(kind, self.1);
        self.0
    }

    /// A host error, with the call (`gm_heap_create(device 0, …)`) in front.
    fn host(call: String, e: Error) -> Failure {
        Failure(status_of(&e), format!("{call}: {e}"))
    }
}

/// The status a host error is answered with.
fn status_of(e: &Error) -> GmStatus {
    match e {
        Error::NoDriver => GmStatus::NoDriver,
        Error::NoDevice => GmStatus::NoDevice,
        Error::HeapSize { .. } => GmStatus::HeapSize,
        Error::Driver { source, .. } if source.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
            GmStatus::OutOfMemory
        }
        Error::Driver { .. } => GmStatus::Cuda,
        // Not made by `DeviceHeap` (the VMM heap's growth); mapped for
        // completeness: a driver call failed.
        Error::Vmm { source, .. } => match &source.cause {
            FailureCause::Cuda(e) if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY => {
                GmStatus::OutOfMemory
            }
            FailureCause::OutOfMemory => GmStatus::OutOfMemory,
            _ => GmStatus::Cuda,
        },
        // Not made by the C API's calls (the VMM heap's `alloc_large`).
        Error::NoRoom(_) => GmStatus::OutOfMemory,
        // Not made by the C API's calls (none waits with a limit).
        Error::Check(_) | Error::Config(_) | Error::Timeout { .. } => GmStatus::Internal,
    }
}

/// Runs `f` as the C call `name`: refused in a forked child (CUDA does not
/// survive `fork`), panics answered with `GM_ERROR_INTERNAL`, the thread's
/// CUDA state kept (see [`host::boundary`]).
fn call(name: &str, f: impl FnOnce() -> Result<(), Failure>) -> GmStatus {
    if forked() {
        return Failure(
            GmStatus::Cuda,
            format!("{name}: refused in a process forked after CUDA was used (CUDA does not survive fork)"),
        )
        .report();
    }
    enter(GmStatus::Internal, None, || match f() {
        Ok(()) => GmStatus::Ok,
        Err(failure) => failure.report(),
    })
}

/// The options of a heap of `bytes` with `flags`, checked before any
/// driver call.
fn config(call: &str, bytes: u64, flags: u32) -> Result<HeapConfig, Failure> {
    let unknown = flags & !(HEAP_CHECKED | HEAP_TRAP_ON_MISUSE);
    if unknown != 0 {
        return Err(Failure(
            GmStatus::InvalidArgument,
            format!(
                "{call}: unknown flags {unknown:#x} (GM_HEAP_CHECKED is 1, GM_HEAP_TRAP_ON_MISUSE 2)"
            ),
        ));
    }
    let mut config = HeapConfig::unchecked(bytes);
    config.check_double_free = flags & HEAP_CHECKED != 0;
    config.trap_on_misuse = flags & HEAP_TRAP_ON_MISUSE != 0;
    // Lays the heap out (no driver call) so a bad size is answered on any
    // machine; `DeviceHeap::new` does it again with the same answer.
    config
        .layout(bytes)
        .map_err(|e| Failure::host(call.to_string(), e))?;
    Ok(config)
}

/// Creates a heap of `bytes` on device `device` with `GM_HEAP_*` flags.
/// On `GM_OK` `*out` is the heap, otherwise null.
///
/// # Safety
/// `out` is null (answered with `GM_ERROR_INVALID_ARGUMENT`) or points to
/// writable memory for one pointer.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_heap_create(
    device: c_int,
    bytes: u64,
    flags: u32,
    out: *mut *mut GmDeviceHeap,
) -> GmStatus {
    let name = format!("gm_heap_create(device {device}, {bytes} bytes, flags {flags:#x})");
    if out.is_null() {
        return Failure(GmStatus::InvalidArgument, format!("{name}: null output")).report();
    }
    // SAFETY: `out` is non-null and writable by the caller's contract.
    unsafe { out.write(std::ptr::null_mut()) };
    call(&name, || {
        let Ok(ordinal) = usize::try_from(device) else {
            return Err(Failure(
                GmStatus::InvalidArgument,
                format!("{name}: negative device"),
            ));
        };
        if bytes == 0 {
            return Err(Failure(
                GmStatus::HeapSize,
                format!("{name}: a heap of 0 bytes"),
            ));
        }
        let config = config(&name, bytes, flags)?;
        host::thread_cuda::before_driver_call();
        let gpu = Gpu::open_device(ordinal).map_err(|e| Failure::host(name.clone(), e))?;
        let heap = DeviceHeap::new(&gpu, config).map_err(|e| Failure::host(name.clone(), e))?;
        let boxed = Box::into_raw(Box::new(GmDeviceHeap { heap }));
        // SAFETY: as above; the caller owns the heap from here on.
        unsafe { out.write(boxed) };
        Ok(())
    })
}

/// The heap behind a C pointer, or the failure for a null one.
///
/// # Safety
/// `heap` is null or came from `gm_heap_create` and was not destroyed.
unsafe fn heap_ref<'a>(name: &str, heap: *const GmDeviceHeap) -> Result<&'a DeviceHeap, Failure> {
    // SAFETY: the caller's contract.
    match unsafe { heap.as_ref() } {
        Some(h) => Ok(&h.heap),
        None => Err(Failure(
            GmStatus::InvalidArgument,
            format!("{name}: null heap"),
        )),
    }
}

/// Copies the heap's handle (`gm_heap`) into `*out`.
///
/// # Safety
/// `heap` is null or a live heap from `gm_heap_create`; `out` is null or
/// points to writable memory for one `gm_heap`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_heap_handle(
    heap: *const GmDeviceHeap,
    out: *mut HeapImage,
) -> GmStatus {
    let name = "gm_heap_handle";
    // No driver call: a forked child may read the handle too.
    enter(GmStatus::Internal, None, || {
        // SAFETY: the caller's contract.
        let result = unsafe { heap_ref(name, heap) }.and_then(|h| {
            if out.is_null() {
                return Err(Failure(
                    GmStatus::InvalidArgument,
                    format!("{name}: null output"),
                ));
            }
            // SAFETY: `out` is non-null and writable for one `gm_heap`, whose
            // layout is `HeapImage`'s (checked by the `header` module).
            unsafe { out.write(h.handle().image()) };
            Ok(())
        });
        match result {
            Ok(()) => GmStatus::Ok,
            Err(f) => f.report(),
        }
    })
}

/// Waits for the heap's stream, then writes its statistics to `*out`.
///
/// # Safety
/// `heap` is null or a live heap from `gm_heap_create`; `out` is null or
/// points to writable memory for one `gm_heap_stats`.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_heap_stats_get(
    heap: *const GmDeviceHeap,
    out: *mut GmHeapStats,
) -> GmStatus {
    let name = "gm_heap_stats_get";
    call(name, || {
        // SAFETY: the caller's contract.
        let h = unsafe { heap_ref(name, heap) }?;
        if out.is_null() {
            return Err(Failure(
                GmStatus::InvalidArgument,
                format!("{name}: null output"),
            ));
        }
        host::thread_cuda::before_driver_call();
        let stats = h.stats().map_err(|e| Failure::host(name.to_string(), e))?;
        let segment_bytes = h.handle().segment_bytes();
        // SAFETY: `out` is non-null and writable by the caller's contract.
        unsafe { out.write(GmHeapStats::new(&stats, segment_bytes)) };
        Ok(())
    })
}

/// Frees the heap's device memory; null does nothing. In a forked child
/// the memory (the parent's) is left alone.
///
/// # Safety
/// `heap` is null or a live heap from `gm_heap_create`, used by no kernel
/// and by no other thread, and not used again.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_heap_destroy(heap: *mut GmDeviceHeap) {
    if heap.is_null() {
        return;
    }
    enter((), None, || {
        host::thread_cuda::before_driver_call();
        // SAFETY: `heap` came from `Box::into_raw` in `gm_heap_create` and
        // the caller gives it up. Dropping frees in stream order; a driver
        // error there is recorded by cudarc, never raised (no panic).
        drop(unsafe { Box::from_raw(heap) });
    })
}

/// This library's heap-layout fingerprint (`gpu_kernel::fingerprint`): the
/// value the device code built with it carries as the global
/// `GPUMALLOC_LAYOUT_FINGERPRINT`.
#[unsafe(no_mangle)]
pub extern "C" fn gm_layout_fingerprint() -> u64 {
    gpu_kernel::fingerprint::LAYOUT_FINGERPRINT
}

/// Compares the fingerprint read from the device code a program linked
/// (`device_c_abi.ptx`; the header's `gm_check_device_layout` reads it)
/// with this library's: `GM_ERROR_LAYOUT`, with a message that says to
/// rebuild, where they differ, since that code would corrupt heaps this
/// library lays out. No driver call.
#[unsafe(no_mangle)]
pub extern "C" fn gm_layout_check(device_fingerprint: u64) -> GmStatus {
    let name = "gm_layout_check";
    enter(GmStatus::Internal, None, || {
        let ours = gm_layout_fingerprint();
        if device_fingerprint == ours {
            return GmStatus::Ok;
        }
        Failure(
            GmStatus::Layout,
            format!(
                "{name}: the device code linked into this program (device_c_abi.ptx) was built \
                 over another gpumalloc heap layout (its layout fingerprint \
                 {device_fingerprint:#018x}, libgpumalloc_c's {ours:#018x}): its \
                 gallatin_malloc / gallatin_free would corrupt heaps this library lays out. \
                 Rebuild device_c_abi.ptx and libgpumalloc_c.so from the same gpumalloc source \
                 with the same GPUMALLOC_* settings (scripts/stage-gpu.sh builds both) and \
                 link again"
            ),
        )
        .report()
    })
}

/// Copies this thread's last error message into `buf` (`len` bytes, NUL
/// terminated, cut to fit) and clears it; answers the message's full
/// length (0: none).
///
/// # Safety
/// `buf` is null or points to `len` writable bytes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn gm_heap_last_error(buf: *mut c_char, len: usize) -> usize {
    // SAFETY: the caller's contract is `write_last_error`'s.
    unsafe { host::boundary::write_last_error(buf, len) }.1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The last error as a string (cleared).
    fn last_error() -> String {
        let mut buf = vec![0 as c_char; 512];
        // SAFETY: `buf` has 512 writable bytes.
        let n = unsafe { gm_heap_last_error(buf.as_mut_ptr(), buf.len()) };
        // SAFETY: NUL-terminated within the buffer.
        let s = unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) };
        let s = s.to_string_lossy().into_owned();
        assert_eq!(n, s.len(), "a message under 512 bytes is not cut");
        s
    }

    fn create(device: c_int, bytes: u64, flags: u32) -> (GmStatus, *mut GmDeviceHeap) {
        // Not null: the call must set it to null on failure.
        let mut heap = std::ptr::dangling_mut::<GmDeviceHeap>();
        // SAFETY: `heap` is writable.
        let status = unsafe { gm_heap_create(device, bytes, flags, &mut heap) };
        (status, heap)
    }

    #[test]
    fn null_output_and_null_heaps_are_answered_not_dereferenced() {
        // SAFETY: null is allowed everywhere and answered.
        unsafe {
            assert_eq!(
                gm_heap_create(0, 1 << 30, 0, std::ptr::null_mut()),
                GmStatus::InvalidArgument
            );
            assert!(
                last_error()
                    .contains("gm_heap_create(device 0, 1073741824 bytes, flags 0x0): null output")
            );
            let mut image = std::mem::MaybeUninit::<HeapImage>::uninit();
            assert_eq!(
                gm_heap_handle(std::ptr::null(), image.as_mut_ptr()),
                GmStatus::InvalidArgument
            );
            assert_eq!(last_error(), "gm_heap_handle: null heap");
            let mut stats = GmHeapStats::default();
            assert_eq!(
                gm_heap_stats_get(std::ptr::null(), &mut stats),
                GmStatus::InvalidArgument
            );
            assert_eq!(last_error(), "gm_heap_stats_get: null heap");
            gm_heap_destroy(std::ptr::null_mut());
            assert_eq!(
                gm_heap_last_error(std::ptr::null_mut(), 0),
                0,
                "destroy(NULL) sets no error"
            );
        }
    }

    #[test]
    fn bad_arguments_fail_before_any_driver_call_and_say_why() {
        let (status, heap) = create(-1, 1 << 30, 0);
        assert_eq!(
            (status, heap),
            (GmStatus::InvalidArgument, std::ptr::null_mut())
        );
        assert!(last_error().ends_with("negative device"));

        let (status, heap) = create(0, 0, 0);
        assert_eq!((status, heap), (GmStatus::HeapSize, std::ptr::null_mut()));
        assert!(last_error().ends_with("a heap of 0 bytes"));

        let (status, _) = create(0, 1 << 20, 0);
        assert_eq!(status, GmStatus::HeapSize);
        let msg = last_error();
        assert!(
            msg.contains("1048576 bytes") && msg.contains("smaller than one segment"),
            "{msg}"
        );

        let (status, _) = create(0, 1 << 50, 0);
        assert_eq!(status, GmStatus::HeapSize);
        assert!(last_error().contains("more segments than the heap supports"));

        let (status, _) = create(0, 1 << 30, 8);
        assert_eq!(status, GmStatus::InvalidArgument);
        assert!(last_error().contains("unknown flags 0x8"));
    }

    #[test]
    fn flags_become_the_kernel_side_flags() {
        let c = config("t", 1 << 30, HEAP_CHECKED | HEAP_TRAP_ON_MISUSE)
            .unwrap_or_else(|f| panic!("{}", f.1));
        assert_eq!(
            c.flags(),
            gpu_kernel::layout::CHECK_DOUBLE_FREE | gpu_kernel::layout::TRAP_ON_MISUSE
        );
        let c = config("t", 1 << 30, 0).unwrap_or_else(|f| panic!("{}", f.1));
        assert_eq!(c.flags(), 0, "unchecked, spares on");
    }

    /// Without a GPU (CI), creation fails with the reason and no heap; with
    /// one it succeeds. Either way no panic and a consistent answer.
    #[test]
    fn create_answers_no_driver_or_a_heap() {
        let (status, heap) = create(0, 64 << 20, 0);
        match status {
            GmStatus::Ok => {
                assert!(!heap.is_null());
                // SAFETY: a live heap, destroyed once.
                unsafe { gm_heap_destroy(heap) };
            }
            GmStatus::NoDriver | GmStatus::NoDevice => {
                assert!(heap.is_null());
                let msg = last_error();
                assert!(
                    msg.starts_with("gm_heap_create(device 0, 67108864 bytes, flags 0x0): "),
                    "{msg}"
                );
                println!("no GPU here: {msg}");
            }
            other => panic!("{other:?}: {}", last_error()),
        }
    }

    /// (A driver error's text comes from libcuda, absent in CI: only the
    /// statuses are checked here; the GPU test sees real messages.)
    #[test]
    fn out_of_memory_is_its_own_status_and_error_kind() {
        let driver = |result| Error::Driver {
            call: "cuMemAlloc(heap data)",
            source: host::cudarc::driver::DriverError(result),
        };
        assert_eq!(
            status_of(&driver(CUresult::CUDA_ERROR_OUT_OF_MEMORY)),
            GmStatus::OutOfMemory
        );
        assert_eq!(
            status_of(&driver(CUresult::CUDA_ERROR_ILLEGAL_ADDRESS)),
            GmStatus::Cuda
        );
        assert_eq!(status_of(&Error::NoDriver), GmStatus::NoDriver);
        let status = Failure(GmStatus::OutOfMemory, "gm_heap_create: oom".into()).report();
        assert_eq!(status, GmStatus::OutOfMemory);
        assert_eq!(
            host::boundary::take_error(),
            (ErrorKind::OutOfMemory, "gm_heap_create: oom".to_string())
        );
    }

    #[test]
    fn device_code_over_another_layout_is_refused_with_a_rebuild_message() {
        let ours = gm_layout_fingerprint();
        assert_eq!(ours, gpu_kernel::fingerprint::LAYOUT_FINGERPRINT);
        assert_eq!(gm_layout_check(ours), GmStatus::Ok);
        assert_eq!(last_error(), "", "a passing check leaves no error");
        assert_eq!(gm_layout_check(ours ^ 1), GmStatus::Layout);
        let message = last_error();
        assert!(
            message.starts_with("gm_layout_check: the device code linked"),
            "{message}"
        );
        assert!(message.contains("Rebuild device_c_abi.ptx"), "{message}");
        // The fingerprint a kernel reads from a missing or zeroed global.
        assert_eq!(gm_layout_check(0), GmStatus::Layout);
    }

    #[test]
    fn long_messages_are_cut_and_their_length_answered() {
        set_error(ErrorKind::Other, "y".repeat(40));
        let mut buf = [1 as c_char; 16];
        // SAFETY: `buf` has 16 writable bytes.
        let n = unsafe { gm_heap_last_error(buf.as_mut_ptr(), buf.len()) };
        assert_eq!(n, 40);
        assert_eq!(buf[15], 0);
    }
}
