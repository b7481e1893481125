//! Issue 12 on a real GPU: the heap hands back everything it holds, and
//! every bad free is answered. Each test is `#[ignore]`d (and fails, saying
//! so, under `--include-ignored` without a GPU); with one, each prints an `issue12:` line
//! with what it measured (the README quotes them).
//!
//! - `random_sizes_until_first_null`: 4,096 threads (`GPUMALLOC_TEST_THREADS`
//!   lowers it), each asking log-uniform 16 B–64 KiB until its first null,
//!   256 MiB heap, three rounds; ≥ 90% handed out in every round, no drop.
//! - `one_random_size_each_on_demand_plus_three_percent`: 2^20 threads, one
//!   log-uniform 1 B–64 KiB request each, heap = class-rounded demand + 3%;
//!   ≥ 97% of the demand obtained.
//! - `large_requests_next_to_small`: 2^16 threads asking 16 B–4 KiB in the
//!   same launch as 64 asking 32–256 MiB, heap = large requests + 1 GiB; no
//!   large request may fail.
//! - `mixed_class_exhaustion`: 1 GiB heap filled with 4 KiB, freed, 8 KiB,
//!   freed, 4 KiB, runs of 3 segments, 64 KiB.
//! - `bad_frees_checked_and_unchecked`: every kind of bad free (as in
//!   `tests/cpu_bad_frees.rs`), each followed by a normal round and a
//!   whole-heap allocation.

use gpumalloc::bench::allocator::{Allocator, Ours, Sizes};
use gpumalloc::gpu::Arg;
use gpumalloc::gpu_kernel::class::{Request, segment_shift_for};
use gpumalloc::gpu_kernels::workload::log_uniform_size;
use gpumalloc::{Gpu, HeapConfig};

mod common;
use common::gpu;

const MIB: u64 = 1 << 20;
/// A request of the smallest block class (256 KiB since 8 … 128 KiB
/// became slice classes): the bad-free cases named "block" need one.
const BLOCK: u64 = 1 << gpumalloc::gpu_kernel::class::MIN_BLOCK_CLASS_SHIFT;
const GIB: u64 = 1 << 30;

/// `GPUMALLOC_TEST_THREADS` if set (sanitizer runs), else `default`.
fn threads(default: u64) -> u64 {
    std::env::var("GPUMALLOC_TEST_THREADS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(default, |t: u64| t.min(default))
}

/// Segment size of the 1 GiB heaps of `mixed_class_exhaustion` and
/// `bad_frees_checked_and_unchecked`.
const SEGMENT_BYTES: u64 = 1 << segment_shift_for(GIB);

/// Bytes a heap of 1 GiB hands out for a request of `size`: its class's
/// unit (the same on every heap up to 64 KiB) or whole segments. Larger
/// heaps may have larger segments: for their runs (`large_requests_next_to_
/// small`) this is a lower bound, which the overlap check can use.
fn rounded(size: u64) -> u64 {
    let shift = segment_shift_for(GIB);
    Request::for_size(size, shift).granted_bytes(shift)
}

/// Everything freed: nothing live, every segment free.
fn assert_whole(ours: &Ours, what: &str) {
    ours.heap().flush().unwrap();
    let s = ours.heap().stats().unwrap();
    assert_eq!(s.live_bytes, 0, "{what}: {s:?}");
    assert_eq!(s.free_segments, s.segments, "{what}: {s:?}");
}

/// Frees `ptrs` (zeros are skipped by `free`) with one thread each.
fn free_all(gpu: &Gpu, ours: &mut Ours, ptrs: &[u64]) {
    if ptrs.is_empty() {
        return;
    }
    let list = gpu.upload(ptrs).unwrap();
    ours.free(gpu, gpu.address(&list), ptrs.len() as u64)
        .unwrap();
}

/// No two allocations overlap.
/// A fresh unchecked heap of `bytes`, and one allocation per thread of
/// `sizes[thread]` in one kernel: the heap, the addresses on the device (to
/// free them) and on the host (0 for a null).
fn one_allocation_each(
    gpu: &Gpu,
    bytes: u64,
    sizes: &[u64],
) -> (Ours, cudarc::driver::CudaSlice<u64>, Vec<u64>) {
    let mut ours = Ours::with_config(gpu, HeapConfig::unchecked(bytes)).unwrap();
    let sizes_d = gpu.upload(sizes).unwrap();
    let ptrs = gpu.zeros(sizes.len()).unwrap();
    ours.alloc(
        gpu,
        Sizes::PerThread(gpu.address(&sizes_d)),
        gpu.address(&ptrs),
        sizes.len() as u64,
    )
    .unwrap();
    let got = gpu.download(&ptrs).unwrap();
    (ours, ptrs, got)
}

fn assert_disjoint(got: &[(u64, u64)]) {
    let mut spans: Vec<(u64, u64)> = got.iter().map(|&(p, n)| (p, p + rounded(n))).collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlap: {:x?} and {:x?}", w[0], w[1]);
    }
}

/// `n` threads each allocate `log_uniform_size(seed, t, step, lo, hi)`
/// until their first null (at most `per_thread`); returns (pointer, size).
fn until_null(
    gpu: &Gpu,
    ours: &Ours,
    n: u64,
    (seed, lo, hi): (u64, u64, u64),
    per_thread: u64,
) -> Vec<(u64, u64)> {
    let ptrs = gpu.zeros((n * per_thread) as usize).unwrap();
    let counts = gpu.zeros(n as usize).unwrap();
    let args = [
        ours.heap().arg(),
        Arg::U64(seed),
        Arg::U64(lo),
        Arg::U64(hi),
        Arg::U64(per_thread),
        Arg::U64(gpu.address(&ptrs)),
        Arg::U64(gpu.address(&counts)),
        Arg::U64(n),
    ];
    gpu.launch("heap_until_null", n, &args).unwrap();
    let ptrs = gpu.download(&ptrs).unwrap();
    let counts = gpu.download(&counts).unwrap();
    let capped = counts.iter().filter(|&&c| c == per_thread).count();
    assert_eq!(capped, 0, "{capped} threads never saw a null");
    let mut got = Vec::new();
    for t in 0..n {
        for step in 0..counts[t as usize] {
            let p = ptrs[(t * per_thread + step) as usize];
            got.push((p, log_uniform_size(seed, t, step, lo, hi)));
        }
    }
    got
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn random_sizes_until_first_null() {
    let gpu = gpu();
    let mut ours = Ours::with_config(&gpu, HeapConfig::unchecked(256 * MIB)).unwrap();
    let n = threads(4096);
    let mut shares = Vec::new();
    for round in 0..3u64 {
        // About 40,000 allocations fit; room for four times a fair share.
        let per_thread = (160_000 / n).max(512);
        let got = until_null(&gpu, &ours, n, (12 + round, 16, 64 << 10), per_thread);
        assert_disjoint(&got);
        let requested: u64 = got.iter().map(|g| g.1).sum();
        let handed: u64 = got.iter().map(|g| rounded(g.1)).sum();
        let share = handed as f64 / ours.heap().bytes() as f64;
        println!(
            "issue12: {n} threads, random 16 B-64 KiB until first null, 256 MiB heap, round \
             {round}: {} allocations, {:.1}% of the heap handed out ({:.1}% requested)",
            got.len(),
            100.0 * share,
            100.0 * requested as f64 / ours.heap().bytes() as f64
        );
        shares.push(share);
        let ptrs: Vec<u64> = got.iter().map(|g| g.0).collect();
        free_all(&gpu, &mut ours, &ptrs);
        assert_whole(&ours, "random sizes");
    }
    for (round, &s) in shares.iter().enumerate() {
        assert!(s >= 0.90, "round {round}: {:.1}%", 100.0 * s);
        assert!(s >= shares[0] - 0.03, "round {round} dropped: {shares:?}");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn one_random_size_each_on_demand_plus_three_percent() {
    let gpu = gpu();
    let n = threads(1 << 20);
    let sizes: Vec<u64> = (0..n)
        .map(|id| log_uniform_size(20, id, 0, 1, 64 << 10))
        .collect();
    let demand: u64 = sizes.iter().map(|&s| rounded(s)).sum();
    let bytes = (demand as f64 * 1.03) as u64;
    let (mut ours, ptrs, got) = one_allocation_each(&gpu, bytes, &sizes);
    let ok: Vec<(u64, u64)> = got
        .iter()
        .zip(&sizes)
        .filter(|g| *g.0 != 0)
        .map(|(&p, &s)| (p, s))
        .collect();
    assert_disjoint(&ok);
    let obtained: u64 = ok.iter().map(|g| rounded(g.1)).sum();
    let share = obtained as f64 / demand as f64;
    println!(
        "issue12: {n} threads, one random 1 B-64 KiB each, heap {} MiB = class-rounded demand \
         {} MiB + 3%: {:.2}% of the demand obtained, {} nulls",
        ours.heap().bytes() >> 20,
        demand >> 20,
        100.0 * share,
        got.len() - ok.len()
    );
    ours.free(&gpu, gpu.address(&ptrs), n).unwrap();
    assert_whole(&ours, "demand + 3%");
    // The 97% goal is for the full workload (2^20 threads, an 8 GiB heap).
    // Runs shortened by GPUMALLOC_TEST_THREADS (the sanitizer runs: 4096
    // threads, a 32 MiB heap of 16 segments for 13 classes) check safety
    // and the heap's integrity, not the share.
    if n >= 1 << 18 {
        assert!(share >= 0.97, "{:.2}%", 100.0 * share);
    } else {
        println!("issue12: share not checked below 2^18 threads");
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn large_requests_next_to_small() {
    let gpu = gpu();
    let n = threads(1 << 16).max(64 * 32);
    // Every (n / 64)-th thread asks for a large block, one per warp at most.
    let stride = n / 64;
    let sizes: Vec<u64> = (0..n)
        .map(|t| {
            if t % stride == 0 {
                log_uniform_size(31, t, 0, 32 * MIB, 256 * MIB)
            } else {
                log_uniform_size(32, t, 0, 16, 4096)
            }
        })
        .collect();
    let large: u64 = (0..n)
        .filter(|t| t % stride == 0)
        .map(|t| rounded(sizes[t as usize]))
        .sum();
    let bytes = large + GIB;
    let (mut ours, ptrs, got) = one_allocation_each(&gpu, bytes, &sizes);
    let large_nulls = (0..n)
        .filter(|t| t % stride == 0 && got[*t as usize] == 0)
        .count();
    let small_nulls = (0..n)
        .filter(|t| t % stride != 0 && got[*t as usize] == 0)
        .count();
    println!(
        "issue12: {} threads of 16 B-4 KiB with 64 of 32-256 MiB ({} MiB), heap {} MiB: \
         {large_nulls} large and {small_nulls} small requests null",
        n - 64,
        large >> 20,
        ours.heap().bytes() >> 20
    );
    let pairs: Vec<(u64, u64)> = got
        .iter()
        .zip(&sizes)
        .filter(|g| *g.0 != 0)
        .map(|(&p, &s)| (p, s))
        .collect();
    assert_disjoint(&pairs);
    ours.free(&gpu, gpu.address(&ptrs), n).unwrap();
    assert_whole(&ours, "large next to small");
    assert_eq!((large_nulls, small_nulls), (0, 0));
}

/// Pointers `until_null` may keep for all threads together (256 MiB of
/// device memory, downloaded once per phase).
const POINTER_BUDGET: u64 = 1 << 25;

/// How many allocations of `size` each of `n` threads may make in
/// `until_null` so that every thread can reach the end of a heap of `whole`
/// bytes, however unevenly the threads share it: as many as the heap holds
/// (one thread alone could take them all) plus the null, or, where the
/// pointers would not fit in [`POINTER_BUDGET`], what does fit. The
/// fixed cap this replaced (4 fair shares + 4) stopped 746 of 4,096 H100
/// threads short at 8 KiB; the budget leaves 128 fair shares at 4 KiB and
/// 256 at 8 KiB on 1 GiB, and asserts at least 64. A thread that still
/// reaches its cap fails `until_null`, and a heap that stops short fails the
/// share floor.
fn cap_to_reach_the_end(whole: u64, size: u64, n: u64) -> u64 {
    let units = whole / rounded(size);
    let cap = (units + 1).min(POINTER_BUDGET / n);
    assert!(
        cap > units || cap >= 64 * units.div_ceil(n),
        "{n} threads: a cap of {cap} leaves too little room over a fair share of {units} / {n}"
    );
    cap
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn mixed_class_exhaustion() {
    let gpu = gpu();
    let mut ours = Ours::with_config(&gpu, HeapConfig::checked(GIB)).unwrap();
    let whole = ours.heap().bytes();
    let n = threads(4096);
    for (what, size) in [
        ("4 KiB", 4096u64),
        ("8 KiB", 8192),
        ("16 KiB", 16384),
        ("32 KiB", 32768),
        ("the smallest block class", BLOCK),
        ("4 KiB again", 4096),
        ("runs of 3 segments", 3 * SEGMENT_BYTES),
        ("64 KiB", 64 << 10),
    ] {
        let per_thread = cap_to_reach_the_end(whole, size, n);
        let got = until_null(&gpu, &ours, n, (0, size, size), per_thread);
        assert_disjoint(&got);
        let share = got.len() as f64 * rounded(size) as f64 / whole as f64;
        println!(
            "issue12: mixed-class exhaustion, 1 GiB heap, {what}: {:.1}%",
            100.0 * share
        );
        let floor = 1.0 - rounded(size) as f64 / whole as f64 - 0.005;
        assert!(share >= floor.min(0.97), "{what}: {:.1}%", 100.0 * share);
        let ptrs: Vec<u64> = got.iter().map(|g| g.0).collect();
        free_all(&gpu, &mut ours, &ptrs);
        assert_whole(&ours, what);
    }
}

/// One allocation of `size` on one thread.
fn one(gpu: &Gpu, ours: &mut Ours, size: u64) -> u64 {
    let ptrs = gpu.zeros(1).unwrap();
    ours.alloc(gpu, Sizes::Fixed(size), gpu.address(&ptrs), 1)
        .unwrap();
    let p = gpu.download(&ptrs).unwrap()[0];
    assert_ne!(p, 0, "malloc({size})");
    p
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn bad_frees_checked_and_unchecked() {
    let gpu = gpu();
    // (name, sizes to allocate, frees as (allocation index, byte offset)
    // with index usize::MAX for an address relative to the heap's data,
    // checked (invalid, double), unchecked (invalid, double)).
    type Case = (
        &'static str,
        &'static [u64],
        &'static [(usize, u64)],
        (u64, u64),
        (u64, u64),
    );
    const SEG: u64 = SEGMENT_BYTES;
    let cases: &[Case] = &[
        ("inside a slice", &[64], &[(0, 8)], (1, 0), (1, 0)),
        (
            "slice never handed out",
            &[64],
            &[(0, 6400)],
            (1, 0),
            (0, 0),
        ),
        (
            "slice freed twice",
            &[64, 64],
            &[(0, 0), (0, 0)],
            (0, 1),
            (0, 0),
        ),
        (
            "block freed twice",
            &[BLOCK, BLOCK],
            &[(0, 0), (0, 0)],
            (0, 1),
            (0, 1),
        ),
        (
            "block never handed out",
            &[BLOCK],
            &[(0, BLOCK * 5)],
            (1, 0),
            (0, 1),
        ),
        (
            "block twice, segment back",
            &[1 << 20],
            &[(0, 0), (0, 0)],
            (0, 1),
            (0, 1),
        ),
        (
            "run freed twice",
            &[3 * SEG],
            &[(0, 0), (0, 0)],
            (0, 1),
            (0, 1),
        ),
        (
            "inside a run",
            &[3 * SEG],
            &[(0, 4096), (0, SEG)],
            (2, 0),
            (2, 0),
        ),
        (
            "segment never used",
            &[],
            &[(usize::MAX, 512 * MIB)],
            (1, 0),
            (1, 0),
        ),
        (
            "outside the heap",
            &[],
            &[(usize::MAX, 4 * GIB)],
            (1, 0),
            (1, 0),
        ),
    ];
    for checked in [true, false] {
        let config = if checked {
            HeapConfig::checked(GIB)
        } else {
            HeapConfig::unchecked(GIB)
        };
        for &(name, sizes, frees, want_checked, want_unchecked) in cases {
            let mut ours = Ours::with_config(&gpu, config).unwrap();
            let data = ours.heap().handle().data();
            let live: Vec<u64> = sizes.iter().map(|&s| one(&gpu, &mut ours, s)).collect();
            // The frees in order, one launch each (a double free must follow
            // the first free).
            let mut freed = vec![false; live.len()];
            for &(i, offset) in frees {
                let p = if i == usize::MAX {
                    data + offset
                } else {
                    live[i] + offset
                };
                free_all(&gpu, &mut ours, &[p]);
                if i != usize::MAX && offset == 0 {
                    freed[i] = true;
                }
            }
            let rest: Vec<u64> = live
                .iter()
                .zip(&freed)
                .filter(|g| !*g.1)
                .map(|g| *g.0)
                .collect();
            free_all(&gpu, &mut ours, &rest);
            ours.heap().flush().unwrap();
            let s = ours.heap().stats().unwrap();
            let want = if checked {
                want_checked
            } else {
                want_unchecked
            };
            let label = if checked { "checked" } else { "unchecked" };
            assert_eq!(
                (s.invalid_frees, s.double_frees),
                want,
                "{name} ({label}): {s:?}"
            );
            assert_whole(&ours, name);
            // A normal round, then the whole heap in one piece.
            let n = threads(1 << 16);
            let ptrs = gpu.zeros(n as usize).unwrap();
            ours.alloc(&gpu, Sizes::Fixed(256), gpu.address(&ptrs), n)
                .unwrap();
            let got = gpu.download(&ptrs).unwrap();
            assert!(got.iter().all(|&p| p != 0), "{name}: normal round");
            ours.free(&gpu, gpu.address(&ptrs), n).unwrap();
            let bytes = ours.heap().bytes();
            let whole = one(&gpu, &mut ours, bytes);
            free_all(&gpu, &mut ours, &[whole]);
            assert_whole(&ours, name);
            let after = ours.heap().stats().unwrap();
            assert_eq!(
                (after.invalid_frees, after.double_frees),
                want,
                "{name} ({label})"
            );
            println!("issue12: bad free \"{name}\" ({label}): counted {want:?}, heap whole after");
        }
    }
}
