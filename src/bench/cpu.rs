//! The benchmark without a GPU: the same tests of our allocator, run on the
//! CPU build of the device code by host threads (each a one-lane warp), timed
//! with the wall clock. Records are labelled `ours (cpu)`; they say how the
//! algorithm behaves, not how fast a GPU runs it.

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use gpu_kernel::workload::{fill, mixed_size, verify};
use host::{CpuHeap, HeapConfig, Result};

use super::measure::Summary;
use super::report::Record;
use super::suite::Options;

const NAME: &str = "ours (cpu)";

/// One round's outcome.
struct Round {
    alloc_ms: f64,
    free_ms: f64,
    nulls: u64,
    wrong: u64,
    span_over_requested: f64,
}

/// Allocates `n` requests over all host threads, checks them, frees them.
fn round(heap: &CpuHeap, n: u64, size_of: &(dyn Fn(u64) -> u64 + Sync)) -> Round {
    let workers = std::thread::available_parallelism().map_or(2, |p| p.get()) as u64;
    let ptrs: Vec<AtomicU64> = (0..n).map(|_| AtomicU64::new(0)).collect();
    let phase = |work: &(dyn Fn(u64) + Sync)| -> f64 {
        let barrier = Barrier::new(workers as usize);
        let start = std::sync::Mutex::new(None);
        std::thread::scope(|s| {
            for w in 0..workers {
                let (barrier, start) = (&barrier, &start);
                s.spawn(move || {
                    if barrier.wait().is_leader() {
                        *start.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
                    }
                    let mut id = w;
                    while id < n {
                        work(id);
                        id += workers;
                    }
                });
            }
        });
        let begun = start
            .into_inner()
            .unwrap_or_else(|e| e.into_inner())
            .unwrap_or_else(Instant::now);
        begun.elapsed().as_secs_f64() * 1e3
    };
    let alloc_ms = phase(&|id| {
        ptrs[id as usize].store(heap.heap().malloc(size_of(id)) as u64, Ordering::Relaxed);
    });
    let (mut nulls, mut wrong) = (0, 0);
    let (mut lo, mut hi, mut requested) = (u64::MAX, 0, 0);
    for (id, p) in ptrs.iter().enumerate() {
        let p = p.load(Ordering::Relaxed);
        let size = size_of(id as u64);
        if p == 0 {
            nulls += 1;
            continue;
        }
        // SAFETY: p is a live allocation of `size` bytes owned by this round.
        unsafe { fill(p as *mut u8, size, id as u64) };
        lo = lo.min(p);
        hi = hi.max(p + size);
        requested += size;
    }
    for (id, p) in ptrs.iter().enumerate() {
        let p = p.load(Ordering::Relaxed);
        if p != 0 {
            // SAFETY: as above; filled just before.
            wrong += unsafe { verify(p as *const u8, size_of(id as u64), id as u64) };
        }
    }
    let free_ms = phase(&|id| {
        heap.heap()
            .free(ptrs[id as usize].load(Ordering::Relaxed) as *mut u8)
    });
    Round {
        alloc_ms,
        free_ms,
        nulls,
        wrong,
        span_over_requested: if requested > 0 {
            (hi - lo) as f64 / requested as f64
        } else {
            0.0
        },
    }
}

/// Runs `test` on the CPU.
pub fn run(test: &str, opts: &Options) -> Result<Vec<Record>> {
    let heap = CpuHeap::new(HeapConfig::unchecked(opts.heap))?;
    let mixed_label = format!("{}-{}", opts.lo, opts.hi);
    let (seed, lo, hi) = (opts.seed, opts.lo, opts.hi);
    let mixed = move |id: u64| mixed_size(seed, id, lo, hi);
    let mut out = Vec::new();
    let timed =
        |test: &str, size: u64, label: &str, n: u64, size_of: &(dyn Fn(u64) -> u64 + Sync)| {
            let rounds: Vec<Round> = (0..=opts.iters)
                .map(|_| round(&heap, n, size_of))
                .skip(1)
                .collect();
            let valid = rounds.iter().all(|r| r.nulls == 0 && r.wrong == 0);
            let allocs: Vec<f64> = rounds.iter().map(|r| r.alloc_ms).collect();
            let frees: Vec<f64> = rounds.iter().map(|r| r.free_ms).collect();
            let spans: Vec<f64> = rounds.iter().map(|r| r.span_over_requested).collect();
            let note = "CPU build, host threads, wall clock".to_string();
            let mut v = vec![
                Record::new(
                    test,
                    NAME,
                    size,
                    label,
                    n,
                    "alloc_ms",
                    Summary::of(&allocs),
                    valid,
                    note.clone(),
                ),
                Record::new(
                    test,
                    NAME,
                    size,
                    label,
                    n,
                    "free_ms",
                    Summary::of(&frees),
                    valid,
                    note.clone(),
                ),
            ];
            if test == "frag" {
                v = vec![Record::new(
                    test,
                    NAME,
                    size,
                    label,
                    n,
                    "span_over_requested",
                    Summary::of(&spans),
                    valid,
                    note,
                )];
            }
            v
        };
    let threads_for = |size: u64| opts.threads.min((heap.bytes() / 2 / size).max(1));
    match test {
        "single" | "warm" => {
            for &size in &opts.sizes {
                out.extend(timed(
                    "single",
                    size,
                    &size.to_string(),
                    threads_for(size),
                    &move |_| size,
                ));
            }
            out.extend(timed("mixed", 0, &mixed_label, opts.threads, &mixed));
        }
        "mixed" => out.extend(timed("mixed", 0, &mixed_label, opts.threads, &mixed)),
        "scaling" => {
            let size = opts.scaling_size;
            for p in 0..=opts.threads.ilog2() {
                out.extend(timed(
                    "scaling",
                    size,
                    &size.to_string(),
                    1 << p,
                    &move |_| size,
                ));
            }
        }
        "frag" => {
            for size in [16u64, 256, 1024, 4096] {
                out.extend(timed(
                    "frag",
                    size,
                    &size.to_string(),
                    threads_for(size),
                    &move |_| size,
                ));
            }
            out.extend(timed("frag", 0, &mixed_label, opts.threads, &mixed));
        }
        "oom" => {
            for &size in &opts.oom_sizes {
                let mut shares = Vec::new();
                for _ in 0..2 {
                    let mut ptrs = Vec::new();
                    loop {
                        let p = heap.heap().malloc(size);
                        if p.is_null() {
                            break;
                        }
                        ptrs.push(p);
                    }
                    shares.push(ptrs.len() as f64 * size as f64 / heap.bytes() as f64);
                    for p in ptrs {
                        heap.heap().free(p);
                    }
                }
                for (i, metric) in ["utilization", "utilization_after_free"]
                    .into_iter()
                    .enumerate()
                {
                    out.push(Record::new(
                        "oom",
                        NAME,
                        size,
                        &size.to_string(),
                        1,
                        metric,
                        Summary::of(&[shares[i]]),
                        true,
                        "CPU build, one thread".into(),
                    ));
                }
            }
        }
        "graph" => eprintln!(
            "graph has no CPU run (its kernels need a GPU); `cargo run -p host --release \
             --example graph_host_phases -- SCALE` times its host side, and \
             `cargo test -p host --release --test graph` runs its update logic on host threads"
        ),
        _ => {}
    }
    Ok(out)
}
