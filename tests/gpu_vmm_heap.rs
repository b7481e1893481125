//! Issue 13 on a real GPU: a heap on CUDA virtual memory (`CudaVmmHeap`).
//! Not yet run on a GPU: it confirms there what `host/tests/vmm_heap.rs`
//! proves on the CPU model. Without a GPU it prints `skipped: no GPU (…)`
//! and passes; with one it prints `issue13:` lines with what it measured.
//!
//! Workload: a 1 TiB heap with 1 GiB mapped (cuMemGetInfo must show about
//! 1 GiB plus the metadata taken, not 1 TiB); `heap_churn` (16 B–4 KiB,
//! fill, verify, free) runs on the user stream while the host grows the
//! heap by 7 × 1 GiB (each grow maps, then publishes with `heap_grow` on the
//! heap's own non-blocking stream): no wrong word (nulls are counted, not
//! failed: there is no device-side wait for growth yet); churn again, no
//! null; then 1 MiB blocks for 7.5 GiB, filled
//! and verified; everything freed; `trim` must give at least 90% of what
//! was mapped back to the driver, as cuMemGetInfo sees it; dropping the
//! heap gives back the rest.

use std::time::Instant;

use gpumalloc::gpu::Arg;
use gpumalloc::lake::{ChunkOptions, CudaVmm};
use gpumalloc::vmm_heap::{CudaVmmHeap, VmmHeapConfig};

mod common;
use common::gpu;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn a_terabyte_heap_grows_under_a_kernel_and_trims_back_to_the_driver() {
    let Some(gpu) = gpu() else { return };
    let (free0, total) = gpu.memory().unwrap();
    let vmm = CudaVmm::open(0, ChunkOptions::default()).unwrap();
    let heap = CudaVmmHeap::on_gpu(&gpu, vmm, VmmHeapConfig::new(TIB, GIB)).unwrap();
    let s = heap.stats().unwrap();
    let (free1, _) = gpu.memory().unwrap();
    println!(
        "issue13: 1 TiB heap on a {} GiB GPU: {} segments of {} MiB mapped ({} MiB), \
         metadata {} MiB, cuMemGetInfo: {} MiB taken",
        total / GIB,
        s.present_segments,
        s.segment_bytes / MIB,
        s.mapped_bytes / MIB,
        s.metadata_bytes / MIB,
        (free0 - free1) / MIB
    );
    assert_eq!(s.mapped_bytes, GIB);
    assert!(
        free0 - free1 <= s.mapped_bytes + s.metadata_bytes + 256 * MIB,
        "creating the heap took more than what it mapped"
    );

    // Churn on the user stream while the host grows the heap.
    let churn_threads = 1 << 16;
    let churn = |errors: &gpumalloc::cudarc::driver::CudaSlice<u64>, seed: u64| {
        gpu.launch(
            "heap_churn",
            churn_threads,
            &[
                heap.arg(),
                Arg::U32(64),
                Arg::U64(16),
                Arg::U64(4096),
                Arg::U64(seed),
                Arg::U64(gpu.address(errors)),
                Arg::U64(churn_threads),
            ],
        )
        .unwrap()
    };
    let errors = gpu.zeros(2).unwrap();
    churn(&errors, 13);
    let start = Instant::now();
    for _ in 0..7 {
        assert_eq!(heap.grow(GIB).unwrap(), GIB);
    }
    let grow_ms = start.elapsed().as_secs_f64() * 1e3;
    gpu.sync().unwrap();
    let churn_ms = start.elapsed().as_secs_f64() * 1e3;
    let e = gpu.download(&errors).unwrap();
    println!(
        "issue13: grew 7 GiB in {grow_ms:.1} ms while heap_churn ran ({churn_ms:.1} ms until it ended; \
         overlapped: {}); per GiB {:.1} ms",
        grow_ms < churn_ms,
        grow_ms / 7.0
    );
    // Nulls are possible while the growth has not landed: the slots of a
    // 1 TiB heap may hold more than the 1 GiB first mapped (their budget
    // follows the virtual size). Wrong words never are.
    println!(
        "issue13: churn during growth: {} nulls of {}",
        e[0],
        churn_threads * 64
    );
    assert_eq!(e[1], 0, "churn during growth: wrong words");
    assert_eq!(heap.stats().unwrap().mapped_bytes, 8 * GIB);
    let errors = gpu.zeros(2).unwrap();
    churn(&errors, 14);
    assert_eq!(
        gpu.download(&errors).unwrap(),
        vec![0, 0],
        "churn after growth: [nulls, wrong words]"
    );
    heap.flush().unwrap();

    // 7.5 GiB of 1 MiB blocks, all in the grown heap.
    let n = 7 * 1024 + 512;
    let ptrs = gpu.zeros(n as usize).unwrap();
    let check = gpu.zeros(2).unwrap();
    gpu.launch(
        "heap_alloc",
        n,
        &[
            heap.arg(),
            Arg::U64(MIB),
            Arg::U64(0),
            Arg::U64(gpu.address(&ptrs)),
            Arg::U64(n),
        ],
    )
    .unwrap();
    for kernel in ["fill_pattern", "verify_pattern"] {
        gpu.launch(
            kernel,
            n,
            &[
                Arg::U64(gpu.address(&ptrs)),
                Arg::U64(MIB),
                Arg::U64(0),
                Arg::U64(gpu.address(&check)),
                Arg::U64(n),
            ],
        )
        .unwrap();
    }
    assert_eq!(
        gpu.download(&check).unwrap(),
        vec![0, 0],
        "[nulls, wrong words]"
    );
    gpu.launch(
        "heap_free",
        n,
        &[heap.arg(), Arg::U64(gpu.address(&ptrs)), Arg::U64(n)],
    )
    .unwrap();
    gpu.sync().unwrap();

    let hs = heap.heap_stats().unwrap();
    assert_eq!(
        (hs.live_bytes, hs.invalid_frees, hs.double_frees),
        (0, 0, 0),
        "{hs:?}"
    );
    let (before, _) = gpu.memory().unwrap();
    let start = Instant::now();
    let released = heap.trim().unwrap();
    let trim_ms = start.elapsed().as_secs_f64() * 1e3;
    let (after, _) = gpu.memory().unwrap();
    println!(
        "issue13: trim released {} MiB in {trim_ms:.1} ms; cuMemGetInfo free +{} MiB",
        released / MIB,
        (after - before) / MIB
    );
    assert!(released * 10 >= 8 * GIB * 9, "trim gave back under 90%");
    assert!(
        (after - before) * 10 >= released * 9,
        "the driver does not show the trimmed memory free"
    );
    let st = heap.stats().unwrap();
    println!("issue13: {st:?}");
    drop(heap);
    let (free2, _) = gpu.memory().unwrap();
    assert!(
        free2 + 64 * MIB >= free0,
        "dropping the heap left {} MiB taken",
        (free0 - free2) / MIB
    );
}
