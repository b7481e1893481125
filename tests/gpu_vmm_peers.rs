//! Issue 13, multi-GPU, on real GPUs: a VMM heap on GPU 0 whose every
//! mapping also grants GPU 1 read-write access (`VmmHeapConfig::
//! peer_access`), so kernels on GPU 1 read and write allocations made by
//! kernels on GPU 0, through the same device addresses. It confirms there
//! what `host/tests/vmm_heap_peers.rs` proves on the CPU model; it passed
//! on two H200s (`docs/results/h200x2-s25-peers/`). Without a GPU it
//! fails, saying so, as every GPU test does under `--include-ignored`.
//! With one GPU it fails, saying it needs two: a test that could not check
//! anything must not count as passed (`scripts/gpu-suite.sh` runs it only
//! where `nvidia-smi` lists two GPUs and logs `skipped: …` otherwise). Where the driver says GPU 1 cannot access GPU 0's memory
//! (`cuDeviceCanAccessPeer`) it fails with the heap's error. With two it
//! prints `issue13 peers:` lines.
//!
//! Workload: a 64 GiB heap (16 MiB segments) on GPU 0 with 1 GiB mapped,
//! peer 1. For the first mapping, then after `grow` by 2 GiB (the new
//! allocations must lie in the grown segments), then for an `alloc_large`
//! range stitched from free segments:
//! 1. a kernel on GPU 0 allocates 1 MiB blocks (`heap_alloc`) and fills
//!    them (`fill_pattern`, thread `t`'s pattern into block `t`);
//! 2. a kernel launched on GPU 1 (`verify_pattern`, a `Gpu` opened on
//!    ordinal 1 with `gpumalloc::PTX`, the block list copied to it) checks
//!    every word: no wrong word; the same list rotated by one must show
//!    wrong words (GPU 1 really read the blocks);
//! 3. GPU 1 fills the blocks in reverse order and GPU 0 verifies that
//!    order: GPU 1's writes landed in GPU 0's memory.
//!
//! Then everything is freed on GPU 0, trimmed, and the heap dropped.
//!
//! Run on a machine with two GPUs:
//! `cargo test --release --test gpu_vmm_peers -- --include-ignored --nocapture`
//! (or `.gpu/test-gpu_vmm_peers --include-ignored --nocapture` after
//! `scripts/stage-gpu.sh`).

use gpumalloc::Gpu;
use gpumalloc::cudarc::driver::{CudaContext, CudaSlice};
use gpumalloc::gpu::Arg;
use gpumalloc::lake::{ChunkOptions, CudaVmm};
use gpumalloc::vmm_heap::{CudaVmmHeap, VmmHeapConfig};

mod common;
use common::gpu;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;

/// Runs `kernel` (`fill_pattern` or `verify_pattern`) on `gpu` over the
/// `ptrs` (1 MiB each, thread `t` on `ptrs[t]`); returns [nulls, wrong
/// words] (the fill counts nulls, the verify wrong words).
fn pattern_on(gpu: &Gpu, kernel: &str, ptrs: &[u64]) -> [u64; 2] {
    let list: CudaSlice<u64> = gpu.upload(ptrs).unwrap();
    let errors = gpu.zeros(2).unwrap();
    let n = ptrs.len() as u64;
    gpu.launch(
        kernel,
        n,
        &[
            Arg::U64(gpu.address(&list)),
            Arg::U64(MIB),
            Arg::U64(0),
            Arg::U64(gpu.address(&errors)),
            Arg::U64(n),
        ],
    )
    .unwrap();
    let e = gpu.download(&errors).unwrap();
    gpu.sync().unwrap();
    [e[0], e[1]]
}

/// Steps 2 and 3 of the workload over `ptrs`, which GPU 0 filled in order.
fn check_across(gpu0: &Gpu, gpu1: &Gpu, what: &str, ptrs: &[u64]) {
    gpu0.sync().unwrap();
    let read = pattern_on(gpu1, "verify_pattern", ptrs);
    assert_eq!(read[1], 0, "{what}: GPU 1 read wrong words");
    let mut rotated = ptrs.to_vec();
    rotated.rotate_left(1);
    let control = pattern_on(gpu1, "verify_pattern", &rotated);
    assert!(
        control[1] > 0,
        "{what}: GPU 1 found no wrong word in the wrong order: it did not read the blocks"
    );
    let reversed: Vec<u64> = ptrs.iter().rev().copied().collect();
    assert_eq!(
        pattern_on(gpu1, "fill_pattern", &reversed),
        [0, 0],
        "{what}: GPU 1's fill"
    );
    assert_eq!(
        pattern_on(gpu0, "verify_pattern", &reversed),
        [0, 0],
        "{what}: GPU 0 reading what GPU 1 wrote"
    );
    println!(
        "issue13 peers: {what}: {} blocks of 1 MiB made on GPU 0 read and rewritten by GPU 1 \
         ({} wrong words in the rotated control)",
        ptrs.len(),
        control[1]
    );
}

#[test]
#[ignore = "needs two NVIDIA GPUs with peer access: run with --include-ignored on such a machine (scripts/gpu-suite.sh)"]
fn a_kernel_on_gpu_1_reads_and_writes_gpu_0s_heap() {
    let gpu0 = gpu();
    let count = CudaContext::device_count().unwrap();
    assert!(
        count >= 2,
        "this machine has {count} GPU; the test needs two with peer access \
         (scripts/gpu-suite.sh skips it on fewer)"
    );
    let gpu1 = Gpu::open(1, gpumalloc::PTX).unwrap();
    println!(
        "issue13 peers: GPU 0 {}, GPU 1 {}",
        gpu0.name().unwrap(),
        gpu1.name().unwrap()
    );
    let vmm = CudaVmm::open(0, ChunkOptions::default()).unwrap();
    let mut config = VmmHeapConfig::new(64 * GIB, GIB);
    config.peer_access = vec![1];
    let heap = CudaVmmHeap::on_gpu(&gpu0, vmm, config)
        .unwrap_or_else(|e| panic!("a heap on GPU 0 with GPU 1 as peer: {e}"));
    let s = heap.stats().unwrap();
    assert_eq!((s.device, s.peer_access.clone()), (0, vec![1]), "{s:?}");
    assert_eq!(s.mapped_bytes, GIB);
    let seg = heap.segment_bytes();
    let alloc = |n: u64| -> Vec<u64> {
        let ptrs = gpu0.zeros(n as usize).unwrap();
        gpu0.launch(
            "heap_alloc",
            n,
            &[
                heap.arg(),
                Arg::U64(MIB),
                Arg::U64(0),
                Arg::U64(gpu0.address(&ptrs)),
                Arg::U64(n),
            ],
        )
        .unwrap();
        let got = gpu0.download(&ptrs).unwrap();
        assert!(got.iter().all(|&p| p != 0), "GPU 0's heap gave a null");
        assert_eq!(pattern_on(&gpu0, "fill_pattern", &got), [0, 0]);
        got
    };

    // The first mapping: 768 MiB of its 1 GiB.
    let first = alloc(768);
    check_across(&gpu0, &gpu1, "first mapping", &first);

    // Grown by 2 GiB: 1.5 GiB more, most of it in the new segments.
    assert_eq!(heap.grow(2 * GIB).unwrap(), 2 * GIB);
    let grown = alloc(1536);
    let top_of_first = heap.data_address() + GIB;
    let in_grown = grown.iter().filter(|&&p| p >= top_of_first).count();
    assert!(
        in_grown >= 1024,
        "only {in_grown} of the new blocks lie in the grown segments"
    );
    check_across(&gpu0, &gpu1, "after grow", &grown);

    // A stitched range: free the first blocks, then 256 MiB in one piece
    // from the segments they leave free, seen by GPU 1 as 1 MiB pieces.
    let list = gpu0.upload(&first).unwrap();
    gpu0.launch(
        "heap_free",
        first.len() as u64,
        &[
            heap.arg(),
            Arg::U64(gpu0.address(&list)),
            Arg::U64(first.len() as u64),
        ],
    )
    .unwrap();
    gpu0.sync().unwrap();
    heap.flush().unwrap();
    let r = heap.alloc_large(256 * MIB).unwrap();
    println!(
        "issue13 peers: alloc_large of 256 MiB: {} segments stitched, {} new",
        r.stitched_segments, r.new_segments
    );
    assert!(r.stitched_segments > 0, "{r:?}");
    let pieces: Vec<u64> = (0..r.bytes / MIB).map(|i| r.address + i * MIB).collect();
    assert_eq!(pieces.len() as u64 * MIB, r.bytes);
    assert_eq!(pattern_on(&gpu0, "fill_pattern", &pieces), [0, 0]);
    check_across(&gpu0, &gpu1, "alloc_large", &pieces);
    assert_eq!(r.bytes % seg, 0);

    // Everything back.
    heap.free_large(r.address).unwrap();
    let list = gpu0.upload(&grown).unwrap();
    gpu0.launch(
        "heap_free",
        grown.len() as u64,
        &[
            heap.arg(),
            Arg::U64(gpu0.address(&list)),
            Arg::U64(grown.len() as u64),
        ],
    )
    .unwrap();
    gpu0.sync().unwrap();
    let hs = heap.heap_stats().unwrap();
    assert_eq!(
        (hs.live_bytes, hs.invalid_frees, hs.double_frees),
        (0, 0, 0),
        "{hs:?}"
    );
    let released = heap.trim().unwrap();
    println!(
        "issue13 peers: trim released {} MiB; {:?}",
        released / MIB,
        heap.stats().unwrap()
    );
}
