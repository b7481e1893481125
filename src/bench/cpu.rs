//! The benchmark without a GPU: the same tests of our allocator, run on the
//! CPU build of the device code by host threads (each a one-lane warp), timed
//! with the wall clock. Records are labelled `ours (cpu)`; they say how the
//! algorithm behaves, not how fast a GPU runs it.
//!
//! With `ours-vmm` among the allocators, the same rounds also run on a heap
//! over the CPU model of the VMM driver (`ours-vmm (cpu)`): it reserves the
//! heap size, maps `vmm_initial` at first and grows as on the GPU
//! (`bench::grow`). Its allocations are not host memory: the untimed check
//! writes and reads them through the model, which refuses any byte that is
//! not mapped with access. Both heaps run each size in turn, same rounds.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::time::Instant;

use gpu_kernels::workload::{fill, mixed_size, verify};
use host::vmm::ModelVmm;
use host::vmm_heap::{ModelVmmHeap, VmmHeapConfig};
use host::{CpuHeap, HeapConfig, Result};

use super::grow;
use super::measure::Summary;
use super::report::Record;
use super::suite::Options;

const NAME: &str = "ours (cpu)";
const VMM_NAME: &str = "ours-vmm (cpu)";

/// A heap the CPU bench runs.
enum Target {
    /// Ours on host memory.
    Host(CpuHeap),
    /// Ours on the model VMM driver, grown by `step` bytes at a time.
    Vmm {
        heap: ModelVmmHeap,
        vmm: Arc<ModelVmm>,
        step: u64,
    },
}

impl Target {
    fn vmm(opts: &Options) -> Result<Target> {
        let vmm = Arc::new(ModelVmm::h100());
        let initial = opts.vmm_initial.min(opts.heap);
        let heap = ModelVmmHeap::on_model(vmm.clone(), VmmHeapConfig::new(opts.heap, initial))?;
        Ok(Target::Vmm {
            heap,
            vmm,
            step: initial.max(1),
        })
    }

    fn name(&self) -> &'static str {
        match self {
            Target::Host(_) => NAME,
            Target::Vmm { .. } => VMM_NAME,
        }
    }

    /// The handle to allocate with: the VMM heap's has the rules of the
    /// size it has grown to (its budget), taken afresh for each round.
    fn heap(&self) -> gpu_kernel::layout::BudgetedHeap<'_> {
        match self {
            Target::Host(h) => h.heap().with_budget(h.heap().budget_segments()),
            Target::Vmm { heap, .. } => heap.heap(),
        }
    }

    fn grow(&self) -> Result<u64> {
        match self {
            Target::Host(_) => Ok(0),
            Target::Vmm { heap, step, .. } => heap.grow(*step),
        }
    }

    fn mapped_bytes(&self) -> Result<Option<u64>> {
        match self {
            Target::Host(_) => Ok(None),
            Target::Vmm { heap, .. } => Ok(Some(heap.stats()?.mapped_bytes)),
        }
    }

    /// Wholly free segments now, for the heap that grows.
    fn free_segments(&self) -> Result<Option<u32>> {
        match self {
            Target::Host(_) => Ok(None),
            Target::Vmm { heap, .. } => Ok(Some(heap.stats()?.free_segments)),
        }
    }

    /// Writes `id`'s pattern into the `size` bytes at `p`; false if they
    /// cannot be written (the model: not mapped).
    fn fill(&self, p: u64, size: u64, id: u64) -> bool {
        match self {
            // SAFETY: p is a live allocation of `size` bytes owned by this
            // round (the allocator aligns every block to at least 16 B).
            Target::Host(_) => unsafe { fill(p as *mut u8, size, id) },
            Target::Vmm { vmm, .. } => {
                let mut words = vec![0u64; size.div_ceil(8) as usize];
                // SAFETY: `words` holds at least `size` bytes, 8-aligned.
                unsafe { fill(words.as_mut_ptr().cast(), size, id) };
                return vmm.write(p, &bytes_of(&words)[..size as usize]).is_ok();
            }
        }
        true
    }

    /// Words at `p` that do not hold `id`'s pattern (all of them if they
    /// cannot be read).
    fn verify(&self, p: u64, size: u64, id: u64) -> u64 {
        match self {
            // SAFETY: as in `fill`; filled just before.
            Target::Host(_) => unsafe { verify(p as *const u8, size, id) },
            Target::Vmm { vmm, .. } => {
                let Ok(bytes) = vmm.read(p, size as usize) else {
                    return size.div_ceil(8);
                };
                let mut words = vec![0u64; size.div_ceil(8) as usize];
                bytes_of_mut(&mut words)[..size as usize].copy_from_slice(&bytes);
                // SAFETY: `words` holds at least `size` bytes, 8-aligned.
                unsafe { verify(words.as_ptr().cast(), size, id) }
            }
        }
    }
}

fn bytes_of(words: &[u64]) -> &[u8] {
    // SAFETY: any u64 is 8 initialised bytes; the view borrows `words`.
    unsafe { std::slice::from_raw_parts(words.as_ptr().cast(), words.len() * 8) }
}

fn bytes_of_mut(words: &mut [u64]) -> &mut [u8] {
    // SAFETY: as in `bytes_of`, and any 8 bytes are a valid u64; the view
    // borrows `words` exclusively.
    unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast(), words.len() * 8) }
}

/// One round's outcome.
struct Round {
    alloc_ms: f64,
    free_ms: f64,
    nulls: u64,
    wrong: u64,
    span_over_requested: f64,
    /// Wholly free segments after the allocations, before the frees (when
    /// asked for, on the heap that grows).
    peak_free_segments: Option<u32>,
}

/// Allocates `n` requests over all host threads, checks them, frees them;
/// with `peak`, counts the free segments between the allocations and the
/// frees (untimed).
fn round(
    target: &Target,
    n: u64,
    size_of: &(dyn Fn(u64) -> u64 + Sync),
    peak: bool,
) -> Result<Round> {
    let heap = target.heap();
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
        ptrs[id as usize].store(heap.malloc(size_of(id)) as u64, Ordering::Relaxed);
    });
    let peak_free_segments = if peak { target.free_segments()? } else { None };
    let (mut nulls, mut wrong) = (0, 0);
    let (mut lo, mut hi, mut requested) = (u64::MAX, 0, 0);
    for (id, p) in ptrs.iter().enumerate() {
        let p = p.load(Ordering::Relaxed);
        let size = size_of(id as u64);
        if p == 0 {
            nulls += 1;
            continue;
        }
        if !target.fill(p, size, id as u64) {
            wrong += size.div_ceil(8);
        }
        lo = lo.min(p);
        hi = hi.max(p + size);
        requested += size;
    }
    for (id, p) in ptrs.iter().enumerate() {
        let p = p.load(Ordering::Relaxed);
        if p != 0 {
            wrong += target.verify(p, size_of(id as u64), id as u64);
        }
    }
    let free_ms = phase(&|id| heap.free(ptrs[id as usize].load(Ordering::Relaxed) as *mut u8));
    Ok(Round {
        alloc_ms,
        free_ms,
        nulls,
        wrong,
        span_over_requested: if requested > 0 {
            (hi - lo) as f64 / requested as f64
        } else {
            0.0
        },
        peak_free_segments,
    })
}

/// Brings `target` to what `n` requests need (a heap that grows; see
/// `bench::grow`), then times `opts.iters` rounds on it.
#[allow(clippy::too_many_arguments)]
fn timed_on(
    target: &Target,
    opts: &Options,
    test: &str,
    size: u64,
    label: &str,
    n: u64,
    size_of: &(dyn Fn(u64) -> u64 + Sync),
) -> Result<Vec<Record>> {
    let name = target.name();
    let mut wrong = 0;
    let (_, growth) = grow::until_served(
        &mut (),
        grow::low_free_segments(),
        |_| {
            let r = round(target, n, size_of, true)?;
            wrong += r.wrong;
            let peak = grow::Peak {
                nulls: r.nulls,
                free_segments: r.peak_free_segments,
            };
            Ok(((), peak))
        },
        |_| target.grow(),
        // As on the GPU's warm test: rounds free all they took, and the
        // CPU bench never resets its heap.
        |_| Ok(()),
    )?;
    let rounds = (0..opts.iters)
        .map(|_| round(target, n, size_of, false))
        .collect::<Result<Vec<Round>>>()?;
    let valid = wrong == 0 && rounds.iter().all(|r| r.nulls == 0 && r.wrong == 0);
    let allocs: Vec<f64> = rounds.iter().map(|r| r.alloc_ms).collect();
    let frees: Vec<f64> = rounds.iter().map(|r| r.free_ms).collect();
    let spans: Vec<f64> = rounds.iter().map(|r| r.span_over_requested).collect();
    let note = match target {
        Target::Host(_) => "CPU build, host threads, wall clock".to_string(),
        Target::Vmm { .. } => {
            "CPU build, host threads, wall clock; model VMM driver (checks through it)".to_string()
        }
    };
    let record = |metric: &str, samples: &[f64]| {
        Record::new(
            test,
            name,
            size,
            label,
            n,
            metric,
            Summary::of(samples),
            valid,
            note.clone(),
        )
    };
    let mut v = if test == "frag" {
        vec![record("span_over_requested", &spans)]
    } else {
        vec![record("alloc_ms", &allocs), record("free_ms", &frees)]
    };
    if let Some(mapped) = target.mapped_bytes()? {
        v.extend(growth.records(test, name, size, label, n, mapped));
    }
    Ok(v)
}

/// Runs `test` on the CPU: ours, and ours on the model VMM driver when
/// `opts.allocators` names `ours-vmm` (not in `oom`, which measures a
/// fixed heap's utilisation).
pub fn run(test: &str, opts: &Options) -> Result<Vec<Record>> {
    let host_heap = CpuHeap::new(HeapConfig::unchecked(opts.heap))?;
    let host_bytes = host_heap.bytes();
    let mut targets = vec![Target::Host(host_heap)];
    if opts.allocators.iter().any(|a| a == "ours-vmm") {
        targets.push(Target::vmm(opts)?);
    }
    let heap = targets[0].heap();
    let mixed_label = format!("{}-{}", opts.lo, opts.hi);
    let (seed, lo, hi) = (opts.seed, opts.lo, opts.hi);
    let mixed = move |id: u64| mixed_size(seed, id, lo, hi);
    let mut out = Vec::new();
    // Every heap runs each size in turn: the same rounds, interleaved.
    let timed = |test: &str,
                 size: u64,
                 label: &str,
                 n: u64,
                 size_of: &(dyn Fn(u64) -> u64 + Sync)|
     -> Result<Vec<Record>> {
        let mut v = Vec::new();
        for t in &targets {
            v.extend(timed_on(t, opts, test, size, label, n, size_of)?);
        }
        Ok(v)
    };
    let threads_for = |size: u64| opts.threads.min((host_bytes / 2 / size).max(1));
    match test {
        "single" | "warm" => {
            for &size in &opts.sizes {
                out.extend(timed(
                    "single",
                    size,
                    &size.to_string(),
                    threads_for(size),
                    &move |_| size,
                )?);
            }
            out.extend(timed("mixed", 0, &mixed_label, opts.threads, &mixed)?);
        }
        "mixed" => out.extend(timed("mixed", 0, &mixed_label, opts.threads, &mixed)?),
        "scaling" => {
            let size = opts.scaling_size;
            for p in 0..=opts.threads.ilog2() {
                out.extend(timed(
                    "scaling",
                    size,
                    &size.to_string(),
                    1 << p,
                    &move |_| size,
                )?);
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
                )?);
            }
            out.extend(timed("frag", 0, &mixed_label, opts.threads, &mixed)?);
        }
        "oom" => {
            for &size in &opts.oom_sizes {
                let mut shares = Vec::new();
                for _ in 0..2 {
                    let mut ptrs = Vec::new();
                    loop {
                        let p = heap.malloc(size);
                        if p.is_null() {
                            break;
                        }
                        ptrs.push(p);
                    }
                    shares.push(ptrs.len() as f64 * size as f64 / host_bytes as f64);
                    for p in ptrs {
                        heap.free(p);
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
            "graph has no CPU run (its kernels need a GPU); `cargo run -p graph --release \
             --example graph_host_phases -- SCALE` times its host side, and \
             `cargo test -p graph --release --test graph` runs its update logic on host threads"
        ),
        _ => {}
    }
    Ok(out)
}
