//! The C API on a real GPU, called as C calls it: create a checked heap,
//! take its `gm_heap`, allocate from it in a kernel, read the statistics,
//! free, destroy; a bad device and a heap larger than the GPU answer their
//! statuses with messages naming the driver call. Ignored without a GPU
//! (and fails, saying so, under `--include-ignored` on a machine without
//! one).
//!
//! The kernels are `gpu-kernels`'s `heap_alloc` / `heap_free` from the PTX
//! at `$GPUMALLOC_PTX` (`scripts/build-cpp-example.sh` sets it to
//! `.gpu/gpu_kernels.ptx`); unset, the kernel part prints that it is
//! skipped. The CUDA C++ route through `gallatin_malloc` is
//! `examples/cpp/`.

use std::ffi::c_char;
use std::mem::MaybeUninit;

use gpu_kernel::layout::HeapImage;
use gpumalloc_c::{
    GmDeviceHeap, GmHeapStats, GmStatus, HEAP_CHECKED, gm_heap_create, gm_heap_destroy,
    gm_heap_handle, gm_heap_last_error, gm_heap_stats_get,
};
use host::Gpu;
use host::gpu::{Arg, HeapParam};

const MIB: u64 = 1 << 20;

fn last_error() -> String {
    let mut buf = vec![0 as c_char; 1024];
    // SAFETY: `buf` has 1024 writable bytes and is NUL-terminated after.
    unsafe {
        gm_heap_last_error(buf.as_mut_ptr(), buf.len());
        std::ffi::CStr::from_ptr(buf.as_ptr())
            .to_string_lossy()
            .into_owned()
    }
}

fn create(device: i32, bytes: u64, flags: u32) -> (GmStatus, *mut GmDeviceHeap) {
    let mut heap = std::ptr::null_mut();
    // SAFETY: `heap` is writable.
    let status = unsafe { gm_heap_create(device, bytes, flags, &mut heap) };
    (status, heap)
}

fn stats(heap: *const GmDeviceHeap) -> GmHeapStats {
    let mut s = GmHeapStats::default();
    // SAFETY: a live heap and a writable output.
    let status = unsafe { gm_heap_stats_get(heap, &mut s) };
    assert_eq!(status, GmStatus::Ok, "{}", last_error());
    s
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/build-cpp-example.sh)"]
fn c_api_heap_serves_a_kernel_and_reports_it() {
    Gpu::require_for_test();
    let (status, heap) = create(0, 256 * MIB, HEAP_CHECKED);
    assert_eq!(status, GmStatus::Ok, "{}", last_error());
    let mut image = MaybeUninit::<HeapImage>::uninit();
    // SAFETY: a live heap and a writable output.
    assert_eq!(
        unsafe { gm_heap_handle(heap, image.as_mut_ptr()) },
        GmStatus::Ok
    );
    // SAFETY: written by gm_heap_handle.
    let image = unsafe { image.assume_init() };

    let s = stats(heap);
    assert_eq!(s.heap_bytes, s.segments * s.segment_bytes);
    assert!(
        s.heap_bytes > 200 * MIB && s.heap_bytes <= 256 * MIB,
        "{s:?}"
    );
    assert_eq!((s.live_bytes, s.live_allocations), (0, 0));
    assert_eq!(s.free_segments, s.segments);
    println!("created: {s:?}");

    match std::env::var("GPUMALLOC_PTX") {
        Ok(path) => {
            let ptx = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("GPUMALLOC_PTX={path}: {e}"));
            allocate_in_a_kernel(heap, image, &ptx);
        }
        Err(_) => println!("kernel part skipped: set GPUMALLOC_PTX to gpu_kernels.ptx"),
    }

    // SAFETY: the heap is live, no kernel uses it; destroyed once.
    unsafe { gm_heap_destroy(heap) };
    // SAFETY: null is allowed.
    unsafe { gm_heap_destroy(std::ptr::null_mut()) };
}

/// 100 000 threads take 48 bytes each through the C API's handle, then
/// free them; the statistics follow.
fn allocate_in_a_kernel(heap: *mut GmDeviceHeap, image: HeapImage, ptx: &str) {
    let n = 100_000u64;
    let gpu = Gpu::open(0, ptx).expect("the PTX loads");
    let ptrs = gpu.zeros(n as usize).unwrap();
    let handle = Arg::Heap(HeapParam(image));
    let at = Arg::U64(gpu.address(&ptrs));
    gpu.launch(
        "heap_alloc",
        n,
        &[handle, Arg::U64(48), Arg::U64(0), at, Arg::U64(n)],
    )
    .unwrap();
    gpu.sync().unwrap();
    let mut got = gpu.download(&ptrs).unwrap();
    assert!(got.iter().all(|&p| p != 0), "a null for 48 bytes");
    got.sort_unstable();
    got.dedup();
    assert_eq!(got.len() as u64, n, "two threads got the same pointer");
    let s = stats(heap);
    assert_eq!(s.live_allocations, n, "{s:?}");
    assert_eq!(
        s.live_bytes,
        n * 64,
        "48 bytes are served from the 64 B class"
    );
    gpu.launch("heap_free", n, &[handle, at, Arg::U64(n)])
        .unwrap();
    gpu.sync().unwrap();
    let s = stats(heap);
    assert_eq!((s.live_bytes, s.live_allocations), (0, 0), "{s:?}");
    assert_eq!(s.failed_mallocs + s.invalid_frees + s.double_frees, 0);
    println!("after {n} allocations and frees in a kernel: {s:?}");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/build-cpp-example.sh)"]
fn failures_answer_their_status_and_name_the_call() {
    Gpu::require_for_test();
    let (status, heap) = create(999, 256 * MIB, 0);
    let msg = last_error();
    assert_eq!(
        (status, heap),
        (GmStatus::Cuda, std::ptr::null_mut()),
        "{msg}"
    );
    assert!(
        msg.starts_with("gm_heap_create(device 999") && msg.contains("failed"),
        "{msg}"
    );
    println!("device 999: {msg}");

    // 512 GiB: a size the layout accepts and no GPU has.
    let (status, heap) = create(0, 512 << 30, 0);
    let msg = last_error();
    assert_eq!(
        (status, heap),
        (GmStatus::OutOfMemory, std::ptr::null_mut()),
        "{msg}"
    );
    assert!(msg.contains("cuMemAlloc(heap data) failed"), "{msg}");
    println!("512 GiB: {msg}");
}
