//! The allocator on a real GPU. The tests are `#[ignore]`d; run with
//! `--include-ignored` on a machine without a GPU each fails, saying so.
//!
//! Workloads (fixed seeds): every class with 2^20 threads (fewer where the
//! requests would pass half the heap) × 10 rounds of allocate, fill, verify,
//! free; mixed sizes; a churn kernel looping allocate/free of random sizes;
//! exhaustion and recovery; bad frees. After each, the heap must be whole.
//! `GPUMALLOC_TEST_THREADS` shrinks the thread count (for compute-sanitizer).

use gpumalloc::bench::allocator::{Allocator, Ours, Sizes};
use gpumalloc::bench::measure::{Buffers, Timing};
use gpumalloc::gpu::Arg;
use gpumalloc::{Gpu, HeapConfig};

mod common;
use common::{clean_round, gpu};

const GIB: u64 = 1 << 30;

fn threads() -> u64 {
    std::env::var("GPUMALLOC_TEST_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1 << 20)
}

fn checked(gpu: &Gpu, bytes: u64) -> Ours {
    Ours::with_config(gpu, HeapConfig::checked(bytes)).expect("heap")
}

/// Everything freed: nothing live, every segment back in the segment tree.
fn assert_whole(ours: &Ours, what: &str) {
    ours.heap().flush().unwrap();
    let s = ours.heap().stats().unwrap();
    assert_eq!(s.live_bytes, 0, "{what}: {s:?}");
    assert_eq!(s.free_segments, s.segments, "{what}: {s:?}");
    assert_eq!(s.invalid_frees + s.double_frees, 0, "{what}: {s:?}");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn selftest_of_the_architecture_module() {
    let gpu = gpu();
    for n in [1000, 100_003] {
        let r = host::selftest::run(&gpu, n).expect("self-test");
        println!(
            "self-test {n} threads: {}/{} warps converged, {} CAS retries",
            r.converged_warps, r.warps, r.cas_retries
        );
    }
}

/// `Gpu::time_queued` times the work and leaves out the hold it queues
/// the work behind: a 50 µs kernel behind a 2 ms hold measures at least
/// the 50 µs and well under the 2 ms.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn queued_timing_leaves_out_the_hold() {
    let gpu = gpu();
    let work = || gpu.launch("hold_stream", 1, &[Arg::U64(50_000), Arg::U64(1)]);
    for _ in 0..5 {
        let ms = gpu
            .time_queued(std::time::Duration::from_millis(2), work)
            .unwrap();
        println!("a 50 us kernel queued behind a 2 ms hold: {ms:.4} ms");
        assert!((0.045..1.0).contains(&ms), "{ms} ms");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn every_class_million_threads_ten_rounds() {
    let gpu = gpu();
    let heap_bytes = 16 * GIB;
    let mut ours = checked(&gpu, heap_bytes);
    let sizes = (4..=13).map(|s| 1u64 << s).chain([
        65536,
        1 << gpumalloc::gpu_kernel::class::MIN_BLOCK_CLASS_SHIFT,
        3 << 23,
        40 << 20,
    ]);
    for size in sizes {
        let n = threads().min(heap_bytes / 2 / size);
        let mut buffers = Buffers::new(&gpu, n).unwrap();
        for r in 0..10 {
            clean_round(
                &gpu,
                &mut ours,
                &mut buffers,
                Sizes::Fixed(size),
                Timing::Queued,
                &format!("size {size}, round {r}, {n} threads"),
            );
        }
        assert_whole(&ours, &format!("size {size}"));
        println!("size {size}: {n} threads x 10 rounds ok");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn mixed_sizes_and_churn() {
    let gpu = gpu();
    let mut ours = checked(&gpu, 8 * GIB);
    let n = threads();
    let mut buffers = Buffers::new(&gpu, n).unwrap();
    let sizes = buffers.mixed(&gpu, 7, 16, 4096).unwrap();
    for r in 0..10 {
        clean_round(
            &gpu,
            &mut ours,
            &mut buffers,
            sizes,
            Timing::Launch,
            &format!("mixed round {r}"),
        );
    }
    assert_whole(&ours, "mixed");
    let errors = gpu.zeros(2).unwrap();
    let churn_threads = (n / 4).max(1);
    let args = [
        ours.heap().arg(),
        Arg::U32(16),
        Arg::U64(16),
        // Up to the smallest block class (256 KiB since 64 and 128 KiB
        // became slice classes), so churn crosses the
        // slice/block boundary.
        Arg::U64(1 << gpumalloc::gpu_kernel::class::MIN_BLOCK_CLASS_SHIFT),
        Arg::U64(11),
        Arg::U64(gpu.address(&errors)),
        Arg::U64(churn_threads),
    ];
    gpu.launch("heap_churn", churn_threads, &args).unwrap();
    let e = gpu.download(&errors).unwrap();
    assert_eq!(e, vec![0, 0], "churn: [nulls, wrong words]");
    assert_whole(&ours, "churn");
    // The whole heap in one piece.
    let one = Buffers::new(&gpu, 1).unwrap();
    let bytes = ours.heap().bytes();
    ours.alloc(&gpu, Sizes::Fixed(bytes), gpu.address(&one.ptrs), 1)
        .unwrap();
    assert_ne!(
        gpu.download(&one.ptrs).unwrap()[0],
        0,
        "whole-heap allocation failed"
    );
    ours.free(&gpu, gpu.address(&one.ptrs), 1).unwrap();
    assert_whole(&ours, "whole heap");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn exhaustion_returns_null_and_recovers() {
    let gpu = gpu();
    let heap_bytes = 2 * GIB;
    let mut ours = checked(&gpu, heap_bytes);
    for size in [256u64, 4096] {
        let batch = 1u64 << 16;
        let capacity = (heap_bytes / size + 2 * batch).next_multiple_of(batch);
        let buffers = Buffers::new(&gpu, capacity).unwrap();
        let mut first = 0;
        for pass in 0..2 {
            let mut got = 0;
            let mut used = 0;
            while used + batch <= capacity {
                let at = gpu.address(&buffers.ptrs) + used * 8;
                ours.alloc(&gpu, Sizes::Fixed(size), at, batch).unwrap();
                used += batch;
                let ptrs = gpu.download(&buffers.ptrs).unwrap();
                let fresh = ptrs[(used - batch) as usize..used as usize]
                    .iter()
                    .filter(|&&p| p != 0)
                    .count() as u64;
                got += fresh;
                if fresh < batch {
                    break;
                }
            }
            let share = (got * size) as f64 / heap_bytes as f64;
            println!(
                "size {size} pass {pass}: {:.2}% of the heap before the first null",
                100.0 * share
            );
            assert!(share >= 0.97, "size {size}: utilization {share}");
            if pass == 0 {
                first = got;
            } else {
                assert!(
                    got >= first,
                    "size {size}: {got} after recovery, {first} before"
                );
            }
            ours.free(&gpu, gpu.address(&buffers.ptrs), used).unwrap();
            assert_whole(&ours, &format!("oom {size}"));
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn bad_frees_are_counted_not_fatal() {
    let gpu = gpu();
    let ours = checked(&gpu, GIB);
    let buffers = Buffers::new(&gpu, 1).unwrap();
    let mut dummy = ours;
    dummy
        .alloc(&gpu, Sizes::Fixed(64), gpu.address(&buffers.ptrs), 1)
        .unwrap();
    let p = gpu.download(&buffers.ptrs).unwrap()[0];
    let wild = gpu.upload(&[0, 0xdead_0000, p + 8, p, p]).unwrap();
    dummy.free(&gpu, gpu.address(&wild), 5).unwrap();
    let s = dummy.heap().stats().unwrap();
    assert_eq!((s.invalid_frees, s.double_frees), (2, 1), "{s:?}");
    assert_eq!(s.live_bytes, 0);
}

/// `Gpu::sync_timeout` answers at once on an idle stream, gives up with
/// `Error::Timeout` (naming the wait) while the churn of
/// `mixed_sizes_and_churn` runs, and the kernel still completes, with no
/// null and no wrong word, afterwards.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn a_wait_with_a_limit_gives_up_instead_of_blocking() {
    use std::time::Duration;
    let gpu = gpu();
    gpu.sync_timeout(Duration::from_secs(1))
        .expect("an idle stream completes at once");
    let ours = checked(&gpu, 8 * GIB);
    let errors = gpu.zeros(2).unwrap();
    let n = (threads() / 4).max(1);
    let args = [
        ours.heap().arg(),
        Arg::U32(16),
        Arg::U64(16),
        // Up to the smallest block class (256 KiB since 64 and 128 KiB
        // became slice classes), so churn crosses the
        // slice/block boundary.
        Arg::U64(1 << gpumalloc::gpu_kernel::class::MIN_BLOCK_CLASS_SHIFT),
        Arg::U64(5),
        Arg::U64(gpu.address(&errors)),
        Arg::U64(n),
    ];
    gpu.launch("heap_churn", n, &args).unwrap();
    match gpu.sync_timeout(Duration::from_micros(1)) {
        Err(e @ gpumalloc::Error::Timeout { .. }) => println!("timeout: {e}"),
        other => panic!("a 1 µs limit on a churn of {n} threads answered {other:?}"),
    }
    // The same limit on every wait of a `Gpu`: download and the heap's
    // stats give up too, while the churn still runs.
    let impatient = gpu.with_wait_limit(Some(Duration::from_micros(1)));
    match impatient.download(&errors) {
        Err(e @ gpumalloc::Error::Timeout { .. }) => println!("download: {e}"),
        other => panic!("download with a 1 µs limit during the churn answered {other:?}"),
    }
    match impatient.sync() {
        Err(gpumalloc::Error::Timeout { .. }) => {}
        other => panic!("sync with a 1 µs limit during the churn answered {other:?}"),
    }
    gpu.sync_timeout(Duration::from_secs(60))
        .expect("the churn ends");
    assert_eq!(
        gpu.download(&errors).unwrap(),
        vec![0, 0],
        "churn: [nulls, wrong words]"
    );
    assert_whole(&ours, "after the churn");
}

/// `Gpu::launch_with` runs a kernel with the caller's own grid and block:
/// the piecewise pattern kernels, launched with 96-thread and 1024-thread
/// blocks (not the 256 of `Gpu::launch`), fill and check 1 MiB
/// allocations from the heap; a wrong word or a piece no thread covered
/// would show in the check.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn a_launch_with_its_own_grid_and_block() {
    use gpumalloc::gpu_kernels::workload::PATTERN_PIECE;
    use host::cudarc::driver::LaunchConfig;
    let gpu = gpu();
    let mut ours = checked(&gpu, GIB);
    let (n, size) = (300, 1 << 20);
    let buffers = Buffers::new(&gpu, n).unwrap();
    let ptrs = gpu.address(&buffers.ptrs);
    ours.alloc(&gpu, Sizes::Fixed(size), ptrs, n).unwrap();
    let args = [
        Arg::U64(ptrs),
        Arg::U64(size),
        Arg::U64(gpu.address(&buffers.errors)),
        Arg::U64(n),
    ];
    let threads = n * size.div_ceil(PATTERN_PIECE);
    for (kernel, block) in [("fill_pattern_pieces", 96), ("verify_pattern_pieces", 1024)] {
        let cfg = LaunchConfig {
            grid_dim: (threads.div_ceil(block) as u32, 1, 1),
            block_dim: (block as u32, 1, 1),
            shared_mem_bytes: 0,
        };
        // SAFETY: the pattern kernels take (ptrs, size, errors, n); the
        // buffers live until the download below has synchronised.
        unsafe { gpu.launch_with(kernel, cfg, &args) }.unwrap();
    }
    assert_eq!(
        gpu.download(&buffers.errors).unwrap(),
        vec![0, 0],
        "[nulls, wrong words]"
    );
    ours.free(&gpu, ptrs, n).unwrap();
    assert_whole(&ours, "after launch_with");
}

/// Buffers of other types than `u64` go up and come back unchanged
/// (`Gpu::upload`, `Gpu::download`, `Gpu::zeros_of`).
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn typed_buffers_round_trip() {
    let gpu = gpu();
    let floats: Vec<f32> = (0..1000).map(|i| i as f32 * 0.5 - 7.25).collect();
    let on_device = gpu.upload(&floats).unwrap();
    assert_eq!(gpu.download(&on_device).unwrap(), floats);
    let bytes: Vec<u8> = (0..=255).collect();
    assert_eq!(gpu.download(&gpu.upload(&bytes).unwrap()).unwrap(), bytes);
    let zeros = gpu.zeros_of::<i32>(17).unwrap();
    assert_eq!(gpu.download(&zeros).unwrap(), vec![0i32; 17]);
}

/// A heap's own kernels come with the `host` crate: a heap made on a `Gpu`
/// opened with the user's PTX only, or with no module, still flushes its
/// slots (before `heap-kernels`, `flush` failed there: `heap_flush` was in
/// `gpumalloc::PTX` only). The allocations are made by our kernels from
/// another handle on the same device and context.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn a_heap_flushes_on_a_gpu_without_our_module() {
    let ours = gpu();
    const USER_PTX: &str = include_str!(env!("GPUMALLOC_USER_KERNEL_PTX_PATH"));
    let n = threads().min(1 << 16);
    for (what, user) in [
        (
            "the user's PTX",
            Gpu::open(0, USER_PTX).expect("user PTX loads"),
        ),
        ("no module", Gpu::open_device(0).expect("device opens")),
    ] {
        let heap = host::DeviceHeap::new(&user, HeapConfig::checked(GIB)).expect("heap");
        let ptrs = ours.zeros(n as usize).unwrap();
        let p = Arg::U64(ours.address(&ptrs));
        ours.launch(
            "heap_alloc",
            n,
            &[heap.arg(), Arg::U64(64), Arg::U64(0), p, Arg::U64(n)],
        )
        .unwrap();
        ours.launch("heap_free", n, &[heap.arg(), p, Arg::U64(n)])
            .unwrap();
        ours.sync().unwrap();
        let before = heap.stats().unwrap();
        assert!(
            before.free_segments < before.segments,
            "{what}: the slots hold blocks before the flush: {before:?}"
        );
        heap.flush()
            .unwrap_or_else(|e| panic!("{what}: flush: {e}"));
        let after = heap.stats().unwrap();
        assert_eq!(after.live_bytes, 0, "{what}: {after:?}");
        assert_eq!(after.free_segments, after.segments, "{what}: {after:?}");
        println!(
            "{what}: flushed, {} of {} segments free",
            after.free_segments, after.segments
        );
    }
}

/// A PTX built over another heap layout (here: gpumalloc's own PTX with
/// its layout fingerprint changed, as a stale build from other sources or
/// `GPUMALLOC_*` settings would carry) is refused by `Gpu::open` with an
/// error that names both fingerprints; the real one loads.
#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn a_ptx_of_another_heap_layout_is_refused() {
    // Opened (and dropped) only to fail here, saying so, without a GPU.
    drop(gpu());
    let initializer = |value: u64| {
        let bytes: Vec<String> = value.to_le_bytes().iter().map(|b| b.to_string()).collect();
        format!("{{{}}}", bytes.join(", "))
    };
    let ours = gpumalloc::gpu_kernel::fingerprint::LAYOUT_FINGERPRINT;
    let stale = gpumalloc::PTX.replacen(&initializer(ours), &initializer(ours ^ 1), 1);
    assert_ne!(
        stale,
        gpumalloc::PTX,
        "the fingerprint's initializer was found"
    );
    let err = Gpu::open(0, &stale).err().expect("a stale PTX is refused");
    let text = err.to_string();
    println!("issue17: stale PTX refused: {text}");
    assert!(text.contains("another gpumalloc heap layout"), "{text}");
    assert!(text.contains(&format!("{ours:#018x}")), "{text}");
    Gpu::open(0, gpumalloc::PTX).expect("the matching PTX loads");
}
