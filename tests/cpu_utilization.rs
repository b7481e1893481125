//! How much of the heap `malloc` hands out before it answers null, on the
//! CPU (host threads are one-lane warps running the device code). The
//! workloads of issue 12, scaled to a CPU; each prints what it reached:
//!
//! - `random_sizes_until_first_null`: 8 threads, each asking log-uniform
//!   sizes 16 B–64 KiB until its first null, on a 256 MiB heap; three rounds
//!   with everything freed between them.
//! - `one_random_size_each_on_demand_plus_three_percent`: 2^17 requests of
//!   log-uniform 1 B–64 KiB on a heap of the class-rounded demand + 3%
//!   (1 GiB, 2 MiB segments); `two_to_the_20_…`: 2^20 of them, the GPU
//!   test's 8.4 GiB heap (4 MiB segments).
//! - `large_runs_next_to_small_slices`: the GPU test's requests (64 runs of
//!   32–256 MiB among 65,472 requests of 16 B–4 KiB, heap = runs + 1 GiB),
//!   64 + 32 threads at once; no run may fail while free segments could
//!   hold it.
//! - `runs_from_256_threads_at_once_fill_the_heap`: 256 runs of 32 MiB at
//!   once exactly fill an 8 GiB heap, three rounds; none may fail.
//! - `mixed_class_exhaustion`: fill with 4 KiB, free, fill with 8 KiB, free,
//!   then runs of segments, on a 1 GiB heap.
//!
//! Fixed seeds. Every test ends with the heap whole.

use std::collections::HashSet;

use gpumalloc::gpu_kernel::arch::preempt_every;
use gpumalloc::gpu_kernel::class::{MAX_SEGMENT_SHIFT, MIN_SEGMENT_SHIFT, Request};
use gpumalloc::gpu_kernels::workload::log_uniform_size;
use gpumalloc::{CpuHeap, HeapConfig};

const MIB: u64 = 1 << 20;

/// Bytes `h` hands out for a request of `size` (its class's unit, or whole
/// segments).
fn rounded(h: &CpuHeap, size: u64) -> u64 {
    h.heap().granted_bytes(size)
}

/// Bytes a heap of 2 MiB segments hands out for `size`: sizes a heap
/// before it exists (up to 64 KiB the rounding is the same on every heap).
fn rounded_small(size: u64) -> u64 {
    Request::for_size(size, MIN_SEGMENT_SHIFT).granted_bytes(MIN_SEGMENT_SHIFT)
}

/// Everything freed: nothing live, every segment free, no misuse counted.
fn assert_whole(h: &CpuHeap, what: &str) {
    h.flush();
    let s = h.stats();
    assert_eq!(s.live_bytes, 0, "{what}: {s:?}");
    assert_eq!(s.free_segments, s.segments, "{what}: {s:?}");
    assert_eq!(s.invalid_frees + s.double_frees, 0, "{what}: {s:?}");
}

/// Each of `threads` threads allocates `size(thread, step)` until its first
/// null; returns every (pointer, size) handed out.
fn until_first_null(
    h: &CpuHeap,
    threads: u64,
    size: &(dyn Fn(u64, u64) -> u64 + Sync),
) -> Vec<(u64, u64)> {
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for step in 0.. {
                        let n = size(t, step);
                        let p = h.heap().malloc(n);
                        if p.is_null() {
                            break;
                        }
                        mine.push((p as u64, n));
                    }
                    mine
                })
            })
            .collect();
        hs.into_iter().flat_map(|t| t.join().unwrap()).collect()
    })
}

/// No two allocations overlap.
fn assert_disjoint(h: &CpuHeap, got: &[(u64, u64)]) {
    let mut spans: Vec<(u64, u64)> = got.iter().map(|&(p, n)| (p, p + rounded(h, n))).collect();
    spans.sort_unstable();
    for w in spans.windows(2) {
        assert!(w[0].1 <= w[1].0, "overlap: {:x?} and {:x?}", w[0], w[1]);
    }
}

#[test]
fn random_sizes_until_first_null() {
    let h = CpuHeap::new(HeapConfig::unchecked(256 * MIB)).unwrap();
    let mut shares = Vec::new();
    for round in 0..3u64 {
        let got = until_first_null(&h, 8, &|t, step| {
            log_uniform_size(12 + round, t, step, 16, 64 << 10)
        });
        assert_disjoint(&h, &got);
        let requested: u64 = got.iter().map(|g| g.1).sum();
        let handed: u64 = got.iter().map(|g| rounded(&h, g.1)).sum();
        let share = handed as f64 / h.bytes() as f64;
        println!(
            "random 16 B-64 KiB, 256 MiB heap, round {round}: {} allocations, \
             {:.1}% of the heap handed out ({:.1}% requested)",
            got.len(),
            100.0 * share,
            100.0 * requested as f64 / h.bytes() as f64
        );
        shares.push(share);
        for (p, _) in got {
            h.heap().free(p as *mut u8);
        }
        assert_whole(&h, "random sizes");
    }
    // Issue 12's goal: 90% in every round, and no round loses ground beyond
    // the scatter of the host threads' races (each thread stops at its own
    // first null; on a two-core machine one round went 94.8% -> 91.6%, so
    // 3 points was within the noise). The 90% floor is the goal itself.
    for (round, &s) in shares.iter().enumerate() {
        assert!(s >= 0.90, "round {round}: {:.1}%", 100.0 * s);
        assert!(s >= shares[0] - 0.05, "round {round} dropped: {shares:?}");
    }
}

#[test]
fn one_random_size_each_on_demand_plus_three_percent() {
    demand_plus_three_percent(1 << 17, None);
}

/// The GPU workload's size: 2^20 requests on an 8.4 GiB heap, which gets
/// 4 MiB segments (the smaller test's 1 GiB heap gets 2 MiB ones). The
/// data is reserved, not touched.
#[test]
fn two_to_the_20_random_sizes_on_demand_plus_three_percent() {
    demand_plus_three_percent(1 << 20, None);
}

/// Probes how the segment size trades utilization (`cargo test --release
/// --test cpu_utilization segment_size_sweep -- --ignored --nocapture`):
/// the first-null and demand + 3% workloads at every segment size, on
/// heaps of 256 MiB and 1 GiB.
#[test]
#[ignore = "a probe for choosing `AUTO_MIN_SEGMENTS`; prints, asserts nothing"]
fn segment_size_sweep() {
    for shift in MIN_SEGMENT_SHIFT..=MAX_SEGMENT_SHIFT {
        for bytes in [256 * MIB, 1024 * MIB] {
            let h = CpuHeap::new(HeapConfig {
                segment_shift: Some(shift),
                ..HeapConfig::unchecked(bytes)
            })
            .unwrap();
            let got = until_first_null(&h, 8, &|t, step| {
                log_uniform_size(12, t, step, 16, 64 << 10)
            });
            let handed: u64 = got.iter().map(|g| rounded(&h, g.1)).sum();
            println!(
                "sweep: {} MiB heap, {} segments of {} MiB: first null at {:.1}% of the heap",
                bytes >> 20,
                h.heap().segments(),
                h.heap().segment_bytes() >> 20,
                100.0 * handed as f64 / h.bytes() as f64
            );
        }
        for n in [1u64 << 17, 1 << 18] {
            let share = demand_plus_three_percent_share(n, Some(shift));
            println!(
                "sweep: 2^{} requests on demand + 3%, segments of {} MiB: {:.1}% of the demand",
                n.trailing_zeros(),
                1 << (shift - 20),
                100.0 * share
            );
        }
    }
}

/// `n` requests of log-uniform 1 B-64 KiB on a heap of their class-rounded
/// demand + 3% (segments of `1 << shift` bytes, or the automatic size):
/// at least 97% of the demand obtained.
fn demand_plus_three_percent(n: u64, shift: Option<u32>) {
    let share = demand_plus_three_percent_share(n, shift);
    assert!(share >= 0.97, "{:.1}%", 100.0 * share);
}

fn demand_plus_three_percent_share(n: u64, shift: Option<u32>) -> f64 {
    let size = |id: u64| log_uniform_size(20, id, 0, 1, 64 << 10);
    let demand: u64 = (0..n).map(|id| rounded_small(size(id))).sum();
    let bytes = (demand as f64 * 1.03) as u64;
    let h = &CpuHeap::new(HeapConfig {
        segment_shift: shift,
        ..HeapConfig::unchecked(bytes)
    })
    .unwrap();
    let threads = 8;
    let got: Vec<(u64, u64)> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..threads)
            .map(|t| {
                let size = &size;
                s.spawn(move || {
                    (t..n)
                        .step_by(threads as usize)
                        .map(|id| (h.heap().malloc(size(id)) as u64, size(id)))
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        hs.into_iter().flat_map(|t| t.join().unwrap()).collect()
    });
    let ok: Vec<(u64, u64)> = got.iter().copied().filter(|g| g.0 != 0).collect();
    assert_disjoint(h, &ok);
    let obtained: u64 = ok.iter().map(|g| rounded(h, g.1)).sum();
    let share = obtained as f64 / demand as f64;
    println!(
        "2^{} random 1 B-64 KiB, heap {} MiB = demand {} MiB + 3% ({} MiB segments): {:.1}% \
         of the demand obtained, {} nulls",
        n.trailing_zeros(),
        h.bytes() >> 20,
        demand >> 20,
        h.heap().segment_bytes() >> 20,
        100.0 * share,
        got.len() - ok.len()
    );
    for (p, _) in ok {
        h.heap().free(p as *mut u8);
    }
    assert_whole(h, "demand + 3%");
    share
}

#[test]
fn large_runs_next_to_small_slices() {
    // The GPU test's workload (`tests/gpu_heap_whole.rs`), request for
    // request: of 2^16 request ids every 1024th asks 32-256 MiB (64 runs,
    // 5,472 MiB), the others 16 B-4 KiB, on a heap of the runs + 1 GiB (the
    // runs are 84% of it). One host thread per run and `SMALL_THREADS` for
    // the small requests, all released at once by a barrier. Every thread
    // yields at every second atomic read-modify-write
    // (`arch::preempt_every`), so that run claims interleave as they do on
    // a GPU; without it two cores almost never overlap two claims.
    const IDS: u64 = 1 << 16;
    const STRIDE: u64 = IDS / 64;
    const SMALL_THREADS: u64 = 32;
    let size = |id: u64| {
        if id.is_multiple_of(STRIDE) {
            log_uniform_size(31, id, 0, 32 * MIB, 256 * MIB)
        } else {
            log_uniform_size(32, id, 0, 16, 4096)
        }
    };
    let large_total: u64 = (0..IDS)
        .step_by(STRIDE as usize)
        .map(|id| rounded_small(size(id)))
        .sum();
    let h = &CpuHeap::new(HeapConfig::unchecked(large_total + 1024 * MIB)).unwrap();
    let start = &std::sync::Barrier::new((64 + SMALL_THREADS) as usize);
    let size = &size;
    let (small, runs): (Vec<u64>, Vec<u64>) = std::thread::scope(|s| {
        let smalls: Vec<_> = (0..SMALL_THREADS)
            .map(|t| {
                s.spawn(move || {
                    preempt_every(2);
                    start.wait();
                    (t..IDS)
                        .step_by(SMALL_THREADS as usize)
                        .filter(|id| !id.is_multiple_of(STRIDE))
                        .map(|id| h.heap().malloc(size(id)) as u64)
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        let larges: Vec<_> = (0..64u64)
            .map(|k| {
                s.spawn(move || {
                    preempt_every(2);
                    start.wait();
                    h.heap().malloc(size(k * STRIDE)) as u64
                })
            })
            .collect();
        (
            smalls.into_iter().flat_map(|t| t.join().unwrap()).collect(),
            larges.into_iter().map(|t| t.join().unwrap()).collect(),
        )
    });
    let small_nulls = small.iter().filter(|&&p| p == 0).count();
    let run_nulls = runs.iter().filter(|&&p| p == 0).count();
    let failed: u64 = (0..64u64)
        .filter(|&k| runs[k as usize] == 0)
        .map(|k| rounded(h, size(k * STRIDE)))
        .sum();
    println!(
        "large runs next to small slices, heap {} MiB, {} MiB of runs: {run_nulls} of {} runs \
         null ({} MiB), {small_nulls} of {} small requests null; {} MiB in free segments after",
        h.bytes() >> 20,
        large_total >> 20,
        runs.len(),
        failed >> 20,
        small.len(),
        (h.stats().free_segments as u64 * h.heap().segment_bytes()) >> 20
    );
    assert_eq!(
        run_nulls, 0,
        "a run failed while free segments could hold it"
    );
    assert_eq!(small_nulls, 0);
    for p in small.into_iter().chain(runs).filter(|&p| p != 0) {
        h.heap().free(p as *mut u8);
    }
    assert_whole(h, "large next to small");
}

#[test]
fn runs_from_256_threads_at_once_fill_the_heap() {
    // `gpumalloc bench single`'s 32 MiB point, scaled so the runs fill the
    // heap exactly: 256 threads each ask 32 MiB of an 8 GiB heap (4 MiB
    // segments, runs of 8), all released by one barrier, every thread
    // yielding at every second RMW. No run may fail: runs that each take
    // their own stretch below the run cursor pack without gaps, and any
    // that falls back to the run lock finds what is left. Three rounds,
    // freed in a shuffled order between them (the cursor wraps to the
    // top).
    const THREADS: u64 = 256;
    let h = &CpuHeap::new(HeapConfig::unchecked(THREADS * 32 * MIB)).unwrap();
    let run = h.bytes() / THREADS;
    for round in 0..3u64 {
        let start = &std::sync::Barrier::new(THREADS as usize);
        let got: Vec<u64> = std::thread::scope(|s| {
            let hs: Vec<_> = (0..THREADS)
                .map(|_| {
                    s.spawn(move || {
                        preempt_every(2);
                        start.wait();
                        h.heap().malloc(run) as u64
                    })
                })
                .collect();
            hs.into_iter().map(|t| t.join().unwrap()).collect()
        });
        let nulls = got.iter().filter(|&&p| p == 0).count();
        println!(
            "{THREADS} runs of {} MiB at once on {} MiB ({} MiB segments), round {round}: \
             {nulls} null",
            run >> 20,
            h.bytes() >> 20,
            h.heap().segment_bytes() >> 20
        );
        assert_eq!(nulls, 0, "round {round}");
        let spans: Vec<(u64, u64)> = got.iter().map(|&p| (p, run)).collect();
        assert_disjoint(h, &spans);
        let mut order: Vec<u64> = got;
        order.sort_by_key(|&p| gpumalloc::gpu_kernels::workload::hash64(p ^ round));
        for p in order {
            h.heap().free(p as *mut u8);
        }
        assert_whole(h, "runs");
    }
}

#[test]
fn mixed_class_exhaustion() {
    let h = CpuHeap::new(HeapConfig::checked(1024 * MIB)).unwrap();
    let whole = h.bytes();
    let segment = h.heap().segment_bytes();
    for (what, size) in [
        ("4 KiB", 4096u64),
        ("8 KiB", 8192),
        ("16 KiB", 16384),
        ("32 KiB", 32768),
        (
            "the smallest block class",
            1 << gpumalloc::gpu_kernel::class::MIN_BLOCK_CLASS_SHIFT,
        ),
        ("4 KiB again", 4096),
        ("runs of 3 segments", 3 * segment),
        ("runs of 1 segment + 1 B", segment + 1),
        ("16 B", 16),
    ] {
        let got = until_first_null(&h, 4, &|_, _| size);
        assert_disjoint(&h, &got);
        let handed: u64 = got.iter().map(|g| rounded(&h, g.1)).sum();
        let share = handed as f64 / whole as f64;
        println!(
            "mixed-class exhaustion, 1 GiB heap, {what}: {:.1}%",
            100.0 * share
        );
        // Runs of k segments can leave fewer than k segments over.
        let floor = 1.0 - rounded(&h, size) as f64 / whole as f64 - 0.005;
        assert!(share >= floor.min(0.97), "{what}: {:.1}%", 100.0 * share);
        let distinct: HashSet<u64> = got.iter().map(|g| g.0).collect();
        assert_eq!(distinct.len(), got.len());
        for (p, _) in got {
            h.heap().free(p as *mut u8);
        }
        assert_whole(&h, what);
    }
    let p = h.heap().malloc(whole);
    assert!(!p.is_null(), "the whole heap in one piece");
    h.heap().free(p);
    assert_whole(&h, "whole heap");
}
