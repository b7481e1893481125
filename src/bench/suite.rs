//! The tests, each written once over every [`Allocator`].
//!
//! - `single`: `threads` threads each allocate one block of a size, then free
//!   it (16 B … 16 MiB in powers of two, plus one multi-segment size).
//! - `mixed`: sizes drawn uniformly from `[lo, hi]` by a seeded hash of the
//!   thread id.
//! - `scaling`: 2^0 … 2^20 threads for one size and for mixed sizes.
//! - `frag`: highest minus lowest address handed out, over the bytes
//!   requested, over repeated rounds on one heap.
//! - `oom`: allocate one size until the first null; the share of the heap
//!   handed out; again after freeing everything.
//! - `init`: time to create a heap.
//! - `warm`: `single` and `mixed` without resetting the heap between rounds.
//!
//! `single`, `mixed` and `scaling` start every round from a fresh heap
//! (`Allocator::reset`); CUDA's malloc cannot be reset and keeps its state.

use std::time::Instant;

use host::{DeviceHeap, Gpu, HeapConfig, Result};
use indicatif::{ProgressBar, ProgressStyle};

use super::allocator::{Allocator, Bump, CudaMalloc, Ours, OursSized, OursVmm, Sizes};
use super::grow;
use super::measure::{self, Buffers, Summary};
use super::report::Record;
use gpu_kernel::class::MAX_SEGMENT_SHIFT;

/// What the tests run with.
#[derive(Clone, Debug)]
pub struct Options {
    /// Threads (one allocation each).
    pub threads: u64,
    /// Timed rounds after one warm-up round.
    pub iters: usize,
    /// Heap bytes for every allocator.
    pub heap: u64,
    /// Seed of mixed sizes.
    pub seed: u64,
    /// Smallest mixed size.
    pub lo: u64,
    /// Largest mixed size.
    pub hi: u64,
    /// Sizes of `single`.
    pub sizes: Vec<u64>,
    /// Size of `scaling`.
    pub scaling_size: u64,
    /// Sizes of `oom`.
    pub oom_sizes: Vec<u64>,
    /// Heap sizes of `init`.
    pub init_sizes: Vec<u64>,
    /// Allocators to run (`ours`, `ours-nospares`, `ours-vmm`,
    /// `ours-sized` (after `ours-vmm`), `cuda-malloc`, `bump-bound`).
    pub allocators: Vec<String>,
    /// Bytes `ours-vmm` maps at first, and grows by at a time.
    pub vmm_initial: u64,
    /// Seconds after which the graph sweep starts nothing new.
    pub graph_budget_s: f64,
    /// R-MAT scales of the graph sweep.
    pub graph_scales: Vec<u32>,
    /// Whether the graph sweep runs the thread-per-vertex kernels in every
    /// group (else in the smallest only).
    pub graph_threads: bool,
    /// Seconds an allocator may spend in one test before the rest of its
    /// measurements are skipped (and its timed rounds cut short).
    pub allocator_budget_s: f64,
    /// How the kernels of a round are timed (GPU only).
    pub timing: measure::Timing,
}

impl Default for Options {
    fn default() -> Options {
        // Every class: slices 16 B … 128 KiB, blocks 256 KiB … 16 MiB (the
        // largest segment; a heap of smaller segments serves the larger of
        // these as runs). Sizes whose 2^20 requests would pass half the
        // heap run with fewer threads (`threads_for`).
        let mut sizes: Vec<u64> = (4..=MAX_SEGMENT_SHIFT).map(|s| 1u64 << s).collect();
        // A multi-segment request: 32 MiB, fixed so that builds with
        // different segment sizes time the same request.
        sizes.push((32 << 20).max(2 << MAX_SEGMENT_SHIFT));
        Options {
            threads: 1 << 20,
            iters: 10,
            heap: 16 << 30,
            seed: 0x5eed,
            lo: 16,
            hi: 4096,
            sizes,
            scaling_size: 256,
            oom_sizes: vec![256, 1024, 4096],
            init_sizes: vec![1 << 30, 4 << 30, 16 << 30],
            allocators: vec!["ours".into(), "cuda-malloc".into(), "bump-bound".into()],
            vmm_initial: super::GIB,
            graph_budget_s: super::graph::BUDGET_S,
            graph_scales: super::graph::SCALES.to_vec(),
            graph_threads: false,
            allocator_budget_s: ALLOCATOR_BUDGET_S,
            timing: measure::Timing::Launch,
        }
    }
}

/// A request pattern.
#[derive(Clone, Copy, Debug)]
enum SizeSpec {
    Fixed(u64),
    Mixed,
}

/// The allocators of one process and the GPU they run on.
pub struct Bench {
    gpu: Gpu,
    allocators: Vec<Box<dyn Allocator>>,
    opts: Options,
    progress: ProgressBar,
    /// Seconds each allocator has spent in this process's test.
    spent: std::collections::HashMap<&'static str, f64>,
    /// When the test began (the step lines show the seconds since).
    began: Instant,
}

/// Threads of one batch of `oom` (its records' thread count).
pub const OOM_BATCH: u64 = 1 << 16;

/// Seconds an allocator may spend in one test, unless
/// `--allocator-budget` says otherwise, before its remaining measurements
/// are skipped (CUDA's malloc can take seconds per round).
pub const ALLOCATOR_BUDGET_S: f64 = 30.0;

impl Bench {
    /// Sets up the chosen allocators, each with `opts.heap` bytes.
    pub fn new(gpu: &Gpu, opts: Options) -> Result<Bench> {
        let mut allocators: Vec<Box<dyn Allocator>> = Vec::new();
        // The VMM heap's segment shift, for `ours-sized`.
        let mut vmm_shift = None;
        for name in &opts.allocators {
            match name.as_str() {
                "ours" => {
                    let ours = Ours::new(gpu, opts.heap)?;
                    // The segment size is chosen per heap: say which one
                    // this run measured.
                    eprintln!(
                        "ours: {} MiB heap of {} MiB segments",
                        ours.heap().bytes() >> 20,
                        ours.heap().handle().segment_bytes() >> 20
                    );
                    allocators.push(Box::new(ours));
                }
                "ours-nospares" => allocators.push(Box::new(Ours::with_config(
                    gpu,
                    HeapConfig {
                        slot_spares: false,
                        ..HeapConfig::unchecked(opts.heap)
                    },
                )?)),
                "ours-vmm" => {
                    // The bench runs on GPU 0 (`open_gpu(0)`).
                    let ours = OursVmm::new(gpu, 0, opts.heap, opts.vmm_initial)?;
                    let s = ours.heap().stats()?;
                    eprintln!(
                        "ours-vmm: {} MiB reserved, {} MiB mapped at first, {} MiB segments",
                        s.virtual_bytes >> 20,
                        s.mapped_bytes >> 20,
                        s.segment_bytes >> 20
                    );
                    vmm_shift = Some(s.segment_bytes.trailing_zeros());
                    allocators.push(Box::new(ours));
                }
                "ours-sized" => {
                    let Some(shift) = vmm_shift else {
                        return Err(host::Error::Check(
                            "ours-sized takes the size ours-vmm grew to: list it after ours-vmm"
                                .into(),
                        ));
                    };
                    allocators.push(Box::new(OursSized::new(gpu, opts.vmm_initial, shift)?));
                }
                "cuda-malloc" => allocators.push(Box::new(CudaMalloc::new(gpu, opts.heap)?)),
                "bump-bound" => allocators.push(Box::new(Bump::new(gpu, opts.heap)?)),
                other => {
                    return Err(host::Error::Check(format!(
                        "unknown allocator {other:?} (ours, ours-nospares, ours-vmm, ours-sized, \
                         cuda-malloc, bump-bound)"
                    )));
                }
            }
        }
        let progress = ProgressBar::new(0);
        progress.set_style(
            ProgressStyle::with_template("{elapsed_precise} [{bar:30}] {pos}/{len} {msg}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Ok(Bench {
            gpu: gpu.clone(),
            allocators,
            opts,
            progress,
            spent: Default::default(),
            began: Instant::now(),
        })
    }

    fn plan(&self, steps: u64) {
        self.progress
            .set_length(steps * self.allocators.len() as u64);
        self.progress.set_position(0);
    }

    /// Whether baseline `i` has used its time for this test; if so says so
    /// and counts the step as done.
    fn over_budget(&self, i: usize) -> bool {
        let (name, budget) = (self.allocators[i].name(), self.opts.allocator_budget_s);
        let over = self.allocators[i].is_baseline()
            && self.spent.get(name).copied().unwrap_or(0.0) > budget;
        if over {
            eprintln!("skipped: {name} used its {budget} s budget for this test");
            self.progress.inc(1);
        }
        over
    }

    /// Runs `work` for each allocator in turn: shows the step, skips an
    /// allocator that used its budget (`skipped` gives the records saying
    /// so), resets it, and charges the time `work` takes to its budget.
    /// `work` gets the moment the allocator's turn began.
    fn each_allocator(
        &mut self,
        what: &str,
        skipped: impl Fn(&'static str) -> Vec<Record>,
        mut work: impl FnMut(&Gpu, &Options, &mut dyn Allocator, Instant) -> Result<Vec<Record>>,
    ) -> Result<Vec<Record>> {
        let mut out = Vec::new();
        for i in 0..self.allocators.len() {
            let name = self.allocators[i].name();
            self.step(format!("{what}: {name}"));
            if self.over_budget(i) {
                out.extend(skipped(name));
                continue;
            }
            let began = Instant::now();
            let allocator = self.allocators[i].as_mut();
            allocator.reset()?;
            out.extend(work(&self.gpu, &self.opts, allocator, began)?);
            *self.spent.entry(name).or_default() += began.elapsed().as_secs_f64();
            self.progress.inc(1);
        }
        Ok(out)
    }

    /// Shows what runs now: on the bar, or as a line when stderr is not a
    /// terminal (logs of long runs).
    fn step(&self, message: String) {
        use std::io::IsTerminal;
        if !std::io::stderr().is_terminal() {
            eprintln!(
                "[{}/{}, {:.0} s] {message}",
                self.progress.position() + 1,
                self.progress.length().unwrap_or(0),
                self.began.elapsed().as_secs_f64()
            );
        }
        self.progress.set_message(message);
    }

    /// Clears the progress bar and says where the test's time went.
    pub fn finish(&self) {
        self.progress.finish_and_clear();
        let spent = self
            .allocators
            .iter()
            .map(|a| {
                let s = self.spent.get(a.name()).copied().unwrap_or(0.0);
                format!("{} {s:.1} s", a.name())
            })
            .collect::<Vec<_>>()
            .join(", ");
        eprintln!(
            "time: {:.1} s in all; {spent}",
            self.began.elapsed().as_secs_f64()
        );
    }

    /// Times rounds of `threads` threads for every allocator.
    fn measure(
        &mut self,
        test: &str,
        spec: SizeSpec,
        threads: u64,
        cold: bool,
    ) -> Result<Vec<Record>> {
        let (size, label) = match spec {
            SizeSpec::Fixed(s) => (s, s.to_string()),
            SizeSpec::Mixed => (0, format!("{}-{}", self.opts.lo, self.opts.hi)),
        };
        let mut buffers = Buffers::new(&self.gpu, threads)?;
        let sizes = match spec {
            SizeSpec::Fixed(s) => Sizes::Fixed(s),
            SizeSpec::Mixed => {
                buffers.mixed(&self.gpu, self.opts.seed, self.opts.lo, self.opts.hi)?
            }
        };
        let budget = self.opts.allocator_budget_s;
        let skipped = |name: &'static str| {
            let note = format!("skipped: {name} used its {budget} s budget for this test");
            vec![Record::new(
                test,
                name,
                size,
                &label,
                threads,
                "alloc_ms",
                Summary::default(),
                false,
                note,
            )]
        };
        let what = format!("{test} {label} B x {threads} threads");
        // What `ours-vmm` had mapped for this test, for `ours-sized` (the
        // allocators run in the order listed).
        let mut grown_to = None;
        self.each_allocator(&what, skipped, |gpu, opts, allocator, began| {
            let name = allocator.name();
            let mut records = Vec::new();
            if let Some(bytes) = grown_to
                && allocator.size_to(bytes)?
            {
                records.push(Record::new(
                    test,
                    name,
                    size,
                    &label,
                    threads,
                    "heap_mib",
                    Summary::of(&[(bytes >> 20) as f64]),
                    true,
                    "a fixed heap of the size ours-vmm grew to, same segment size".into(),
                ));
            }
            // A heap that grows is brought to what the test needs first;
            // wrong words of every warm-up round count.
            let mut warm_up = Instant::now();
            let mut wrong = 0;
            let peak = measure::Keep {
                peak: true,
                ..Default::default()
            };
            let (first, growth) = grow::until_served(
                allocator,
                grow::low_free_segments(),
                |a| {
                    warm_up = Instant::now();
                    let r = measure::round(gpu, a, &mut buffers, sizes, peak, opts.timing)?;
                    wrong += r.wrong;
                    let peak = grow::Peak {
                        nulls: r.nulls,
                        free_segments: r.peak_free_segments,
                    };
                    Ok((r, peak))
                },
                |a| a.grow(),
                |a| a.reset(),
            )?;
            let slow = warm_up.elapsed().as_secs_f64() > 2.0;
            let iters = if slow { opts.iters.min(3) } else { opts.iters };
            let (mut allocs, mut frees) = (Vec::new(), Vec::new());
            let mut nulls = first.nulls;
            let mut cut = false;
            for _ in 0..iters {
                // At least one timed round, then no more once the budget is spent.
                if allocator.is_baseline()
                    && !allocs.is_empty()
                    && began.elapsed().as_secs_f64() > opts.allocator_budget_s
                {
                    cut = true;
                    break;
                }
                if cold {
                    allocator.reset()?;
                }
                let r = measure::round(
                    gpu,
                    allocator,
                    &mut buffers,
                    sizes,
                    Default::default(),
                    opts.timing,
                )?;
                nulls += r.nulls;
                wrong += r.wrong;
                allocs.push(r.alloc_ms);
                if let Some(f) = r.free_ms {
                    frees.push(f);
                }
            }
            if let Some(mapped) = allocator.mapped_bytes()? {
                // In the log too: the rule and where it stopped.
                eprintln!(
                    "{name}: {mapped} MiB mapped, {free} segments free at the last warm-up's \
                     peak, {steps} steps grown (while nulls or fewer than {low} free \
                     segments at the peak)",
                    mapped = mapped >> 20,
                    free = growth
                        .last
                        .free_segments
                        .map_or("?".into(), |f| f.to_string()),
                    steps = growth.ms_per_gib.len(),
                    low = growth.low_free_segments,
                );
                records.extend(growth.records(test, name, size, &label, threads, mapped));
                grown_to = Some(mapped);
            }
            let valid = nulls == 0 && wrong == 0;
            let mut note = String::new();
            if !valid {
                note = format!(
                    "{nulls} nulls and {wrong} wrong words over {} rounds",
                    allocs.len() + 1
                );
            } else if cut {
                note = format!(
                    "{} rounds: the {} s budget was spent",
                    allocs.len(),
                    opts.allocator_budget_s
                );
            } else if slow {
                note = format!("{iters} rounds: warm-up took over 2 s");
            }
            records.push(Record::new(
                test,
                name,
                size,
                &label,
                threads,
                "alloc_ms",
                Summary::of(&allocs),
                valid,
                note.clone(),
            ));
            if allocator.frees() {
                records.push(Record::new(
                    test,
                    name,
                    size,
                    &label,
                    threads,
                    "free_ms",
                    Summary::of(&frees),
                    valid,
                    note,
                ));
            }
            Ok(records)
        })
    }

    /// Threads for a size: all of them, unless the requests would not fit
    /// in half the heap (the multi-segment size).
    fn threads_for(&self, size: u64) -> u64 {
        self.opts.threads.min((self.opts.heap / 2 / size).max(1))
    }

    /// `single` (fresh heap every round) or, with `warm`, the same on a
    /// heap kept between rounds.
    pub fn single(&mut self, warm: bool) -> Result<Vec<Record>> {
        let test = if warm { "warm-single" } else { "single" };
        self.plan(self.opts.sizes.len() as u64);
        let mut out = Vec::new();
        for size in self.opts.sizes.clone() {
            out.extend(self.measure(test, SizeSpec::Fixed(size), self.threads_for(size), !warm)?);
        }
        Ok(out)
    }

    /// `mixed`, cold or warm.
    pub fn mixed(&mut self, warm: bool) -> Result<Vec<Record>> {
        let test = if warm { "warm-mixed" } else { "mixed" };
        self.plan(1);
        self.measure(test, SizeSpec::Mixed, self.opts.threads, !warm)
    }

    /// `scaling`: 2^0 … threads, for the scaling size and for mixed sizes.
    pub fn scaling(&mut self) -> Result<Vec<Record>> {
        let max = self.opts.threads.ilog2();
        self.plan(2 * (max as u64 + 1));
        let mut out = Vec::new();
        for spec in [SizeSpec::Fixed(self.opts.scaling_size), SizeSpec::Mixed] {
            for p in 0..=max {
                out.extend(self.measure("scaling", spec, 1 << p, true)?);
            }
        }
        Ok(out)
    }

    /// `frag`: (highest end − lowest start) / bytes requested, per round, on a
    /// heap kept between rounds.
    pub fn frag(&mut self) -> Result<Vec<Record>> {
        let specs: Vec<SizeSpec> = [16u64, 256, 1024, 4096]
            .into_iter()
            .map(SizeSpec::Fixed)
            .chain([SizeSpec::Mixed])
            .collect();
        self.plan(specs.len() as u64);
        let mut out = Vec::new();
        let threads = self.opts.threads;
        for spec in specs {
            let mut buffers = Buffers::new(&self.gpu, threads)?;
            let (sizes, size, label, per_thread) = match spec {
                SizeSpec::Fixed(s) => (Sizes::Fixed(s), s, s.to_string(), None),
                SizeSpec::Mixed => {
                    let sizes =
                        buffers.mixed(&self.gpu, self.opts.seed, self.opts.lo, self.opts.hi)?;
                    let host = self.gpu.download(&buffers.sizes)?;
                    (
                        sizes,
                        0,
                        format!("{}-{}", self.opts.lo, self.opts.hi),
                        Some(host),
                    )
                }
            };
            let what = format!("frag {label} B");
            let records = self.each_allocator(
                &what,
                |_| Vec::new(),
                |gpu, opts, allocator, began| {
                    let mut ratios = Vec::new();
                    let mut ranges = Vec::new();
                    let mut parts = HeldParts::default();
                    let mut valid = true;
                    for _ in 0..opts.iters {
                        if allocator.is_baseline()
                            && began.elapsed().as_secs_f64() > opts.allocator_budget_s
                        {
                            break;
                        }
                        let keep = measure::Keep {
                            ptrs: true,
                            stats: true,
                            ..Default::default()
                        };
                        let r =
                            measure::round(gpu, allocator, &mut buffers, sizes, keep, opts.timing)?;
                        valid &= r.nulls == 0 && r.wrong == 0;
                        let ptrs = r.ptrs.unwrap_or_default();
                        let size_of = |t: usize| per_thread.as_ref().map_or(size, |s| s[t]);
                        let (mut lo, mut hi, mut requested) = (u64::MAX, 0u64, 0u64);
                        for (t, &p) in ptrs.iter().enumerate() {
                            if p != 0 {
                                lo = lo.min(p);
                                hi = hi.max(p + size_of(t));
                                requested += size_of(t);
                            }
                        }
                        if requested > 0 {
                            let round = ratios.len();
                            if map_rounds() {
                                let live = ptrs.iter().enumerate().filter(|&(_, &p)| p != 0);
                                let map =
                                    occupancy_map(live.map(|(t, &p)| (p, size_of(t))), lo, hi);
                                println!(
                                    "frag {label} B, {}, round {round}: {map}",
                                    allocator.name(),
                                );
                            }
                            ratios.push((hi - lo) as f64 / requested as f64);
                            ranges.push((lo, hi));
                            if let Some(snapshot) = &r.peak_stats {
                                if let Some(map) = &snapshot.segment_map {
                                    println!(
                                        "frag {label} B, {}, round {round}, segments: {map}",
                                        allocator.name(),
                                    );
                                    println!(
                                        "frag {label} B, {}, round {round}, by class: {}",
                                        allocator.name(),
                                        held_by_class(&snapshot.stats, snapshot.segment_bytes),
                                    );
                                }
                                parts.add(snapshot, requested);
                                // Builds with GPUMALLOC_INSTALL_CLOCK set only (zero otherwise).
                                let clock = snapshot.stats.install_clock;
                                if clock.installs > 0 {
                                    println!("install clock, frag {label} B: {clock}");
                                }
                            }
                        }
                    }
                    let record = |metric: &str, samples: &[f64], note: &str| {
                        Record::new(
                            "frag",
                            allocator.name(),
                            size,
                            &label,
                            threads,
                            metric,
                            Summary::of(samples),
                            valid,
                            note.to_string(),
                        )
                    };
                    println!(
                        "{}",
                        span_rounds(allocator.name(), &label, &ratios, &ranges)
                    );
                    let mut records = vec![record("span_over_requested", &ratios, "")];
                    if !parts.held.is_empty() {
                        records.extend(parts.records(record));
                    }
                    Ok(records)
                },
            )?;
            out.extend(records);
        }
        Ok(out)
    }

    /// `oom`: allocate one size in batches until the first null; the share
    /// of the heap handed out, then again after freeing everything.
    pub fn oom(&mut self) -> Result<Vec<Record>> {
        const BATCH: u64 = OOM_BATCH;
        self.plan(self.opts.oom_sizes.len() as u64);
        let mut out = Vec::new();
        for size in self.opts.oom_sizes.clone() {
            let capacity = (self.opts.heap / size + 2 * BATCH).next_multiple_of(BATCH);
            let mut buffers = Buffers::new(&self.gpu, capacity)?;
            let what = format!("oom {size} B");
            let records = self.each_allocator(
                &what,
                |_| Vec::new(),
                |gpu, opts, allocator, _| {
                    let mut shares = Vec::new();
                    let mut wrong = 0;
                    for pass in 0..2 {
                        let mut handed = 0u64;
                        let mut batch = 0u64;
                        while (batch + 1) * BATCH <= capacity {
                            let ptrs = gpu.address(&buffers.ptrs) + batch * BATCH * 8;
                            allocator.alloc(gpu, Sizes::Fixed(size), ptrs, BATCH)?;
                            let got = count_non_null(gpu, ptrs, BATCH)?;
                            handed += got;
                            batch += 1;
                            if got < BATCH {
                                break;
                            }
                        }
                        let all = gpu.address(&buffers.ptrs);
                        // Check every allocation of the pass, then free them all.
                        wrong += check_range(gpu, &mut buffers, batch * BATCH, size)?;
                        allocator.free(gpu, all, batch * BATCH)?;
                        gpu.sync()?;
                        shares.push((pass, handed as f64 * size as f64 / opts.heap as f64));
                    }
                    let mut records = Vec::new();
                    for (pass, share) in shares {
                        let metric = if pass == 0 {
                            "utilization"
                        } else {
                            "utilization_after_free"
                        };
                        let s = Summary::of(&[share]);
                        records.push(Record::new(
                            "oom",
                            allocator.name(),
                            size,
                            &size.to_string(),
                            BATCH,
                            metric,
                            s,
                            wrong == 0,
                            String::new(),
                        ));
                    }
                    Ok(records)
                },
            )?;
            out.extend(records);
        }
        Ok(out)
    }
}

/// Non-null pointers among `n` at device address `ptrs`.
fn count_non_null(gpu: &Gpu, ptrs: u64, n: u64) -> Result<u64> {
    let counter = gpu.zeros(2)?;
    let args = [
        host::gpu::Arg::U64(ptrs),
        host::gpu::Arg::U64(0),
        host::gpu::Arg::U64(0),
        host::gpu::Arg::U64(gpu.address(&counter)),
        host::gpu::Arg::U64(n),
    ];
    // fill_pattern with size 0 writes nothing and counts nulls.
    gpu.launch("fill_pattern", n, &args)?;
    let c = gpu.download(&counter)?;
    Ok(n - c[0])
}

/// Fills and verifies the first `n` pointers of `buffers`; wrong words.
fn check_range(gpu: &Gpu, buffers: &mut Buffers, n: u64, size: u64) -> Result<u64> {
    let saved = buffers.n;
    buffers.n = n;
    use host::error::DriverCall;
    gpu.stream()
        .memset_zeros(&mut buffers.errors)
        .call("cuMemsetD8")?;
    measure::check(gpu, buffers, Sizes::Fixed(size))?;
    buffers.n = saved;
    Ok(gpu.download(&buffers.errors)?[1])
}

/// `init`: wall-clock time to create (and drop) a heap of each size.
pub fn init(gpu: &Gpu, opts: &Options) -> Result<Vec<Record>> {
    let mut out = Vec::new();
    let free = gpu.memory()?.0;
    for &bytes in &opts.init_sizes {
        if bytes > free / 2 {
            continue;
        }
        let mut times = Vec::new();
        for i in 0..=opts.iters {
            let start = Instant::now();
            let heap = DeviceHeap::new(gpu, HeapConfig::unchecked(bytes))?;
            gpu.sync()?;
            let ms = start.elapsed().as_secs_f64() * 1e3;
            drop(heap);
            if i > 0 {
                times.push(ms);
            }
        }
        out.push(Record::new(
            "init",
            "ours",
            bytes,
            &format!("{} MiB", bytes >> 20),
            0,
            "init_ms",
            Summary::of(&times),
            true,
            "host wall clock: allocation, metadata upload, sync".into(),
        ));
    }
    Ok(out)
}

/// Where the bytes a heap holds at a `frag` round's peak sit, each over the
/// bytes requested, one sample per round: segments formatted for classes
/// (`held`; the span is these plus the free segments between them), and
/// inside them the blocks nobody holds, the slices of slot blocks not yet
/// handed out, the spare blocks, the freed slices of blocks not yet
/// returned (in a warm round, what the last round freed of the blocks its
/// slots still hold), and the class rounding (live bytes at class
/// granularity beyond the request).
#[derive(Default)]
struct HeldParts {
    held: Vec<f64>,
    idle_blocks: Vec<f64>,
    slot_unissued: Vec<f64>,
    spares: Vec<f64>,
    dead: Vec<f64>,
    rounding: Vec<f64>,
}

impl HeldParts {
    fn add(&mut self, snapshot: &super::allocator::HeapSnapshot, requested: u64) {
        let s = &snapshot.stats;
        let over = |bytes: u64| bytes as f64 / requested as f64;
        self.held
            .push(over(s.active_segments as u64 * snapshot.segment_bytes));
        self.idle_blocks.push(over(s.idle_block_bytes));
        self.slot_unissued.push(over(s.slot_unissued_bytes));
        self.spares.push(over(s.spare_block_bytes));
        self.dead.push(over(s.dead_slice_bytes));
        self.rounding
            .push(over(s.live_bytes.saturating_sub(requested)));
    }

    fn records(&self, record: impl Fn(&str, &[f64], &str) -> Record) -> Vec<Record> {
        vec![
            record(
                "held_over_requested",
                &self.held,
                "segments formatted for classes at the peak / requested",
            ),
            record(
                "idle_blocks_over_requested",
                &self.idle_blocks,
                "blocks in formatted segments nobody holds",
            ),
            record(
                "slot_unissued_over_requested",
                &self.slot_unissued,
                "slices of slot blocks not yet handed out",
            ),
            record(
                "spares_over_requested",
                &self.spares,
                "spare blocks parked beside slots",
            ),
            record(
                "dead_slices_over_requested",
                &self.dead,
                "freed slices of blocks not yet returned (a warm round's slot blocks)",
            ),
            record(
                "rounding_over_requested",
                &self.rounding,
                "live bytes at class granularity beyond the request",
            ),
        ]
    }
}

/// Whether `bench frag` prints each round's occupancy map and segment
/// map (`GPUMALLOC_FRAG_MAP=1`): where a warm round's span goes.
pub(super) fn map_rounds() -> bool {
    std::env::var("GPUMALLOC_FRAG_MAP").is_ok_and(|v| v == "1")
}

/// What each class held at a round's peak, in MiB: its segments' bytes,
/// then the live bytes (at class granularity), the free blocks in its
/// segments, the unissued slices of its slot blocks, its spare blocks and
/// the freed slices of its blocks not yet returned;
/// classes that hold no segment left out.
fn held_by_class(stats: &gpu_kernel::stats::HeapStats, segment_bytes: u64) -> String {
    let mib = |bytes: u64| bytes as f64 / (1u64 << 20) as f64;
    let classes = (0..gpu_kernel::class::CLASSES).filter_map(gpu_kernel::class::SizeClass::new);
    classes
        .filter(|c| stats.per_class[c.index() as usize].segments > 0)
        .map(|c| {
            let held = &stats.per_class[c.index() as usize];
            let live = stats.class_live_bytes(c);
            format!(
                "{} B {:.0} (live {:.0}, idle {:.0}, unissued {:.0}, spare {:.0}, dead {:.0})",
                1u64 << c.unit_shift(),
                mib(held.segments as u64 * segment_bytes),
                mib(live),
                mib(held.idle_block_bytes),
                mib(held.slot_unissued_bytes),
                mib(held.spare_block_bytes),
                mib(held.dead_slice_bytes),
            )
        })
        .collect::<Vec<_>>()
        .join("; ")
}

/// Each MiB of `[lo, hi)` as one character: how much of it the live
/// allocations `(address, bytes)` cover, `.` none, `1`…`9` tenths, `#`
/// all of it. A MiB that no allocation touches inside a span is memory
/// the round held apart from its own.
fn occupancy_map(live: impl Iterator<Item = (u64, u64)>, lo: u64, hi: u64) -> String {
    const MIB: u64 = 1 << 20;
    let cells = (hi - lo).div_ceil(MIB) as usize;
    let mut covered = vec![0u64; cells];
    for (mut at, bytes) in live {
        let end = at + bytes;
        while at < end {
            let cell = ((at - lo) / MIB) as usize;
            let cell_end = (lo + (cell as u64 + 1) * MIB).min(end);
            covered[cell] += cell_end - at;
            at = cell_end;
        }
    }
    covered
        .iter()
        .map(|&c| match c * 10 / MIB {
            0 if c == 0 => '.',
            0 => '1',
            10.. => '#',
            d => char::from(b'0' + d as u8),
        })
        .collect()
}

/// One log line of a `frag` run: each round's span over requested and
/// where its addresses lay, in MiB from the lowest address of any round, so
/// that a median can be read back to the rounds that made it (a warm round
/// can spread where a cold one packs).
fn span_rounds(allocator: &str, label: &str, ratios: &[f64], ranges: &[(u64, u64)]) -> String {
    let base = ranges.iter().map(|r| r.0).min().unwrap_or(0);
    let mib = |a: u64| (a - base) as f64 / (1u64 << 20) as f64;
    let rounds: Vec<String> = ratios
        .iter()
        .zip(ranges)
        .map(|(ratio, &(lo, hi))| format!("{ratio:.3} [{:.0}, {:.0})", mib(lo), mib(hi)))
        .collect();
    format!(
        "frag {label} B, {allocator}, span by round (MiB from the lowest): {}",
        rounds.join(" ")
    )
}

#[cfg(test)]
mod tests {
    use super::span_rounds;

    #[test]
    fn occupancy_map_marks_each_mib_by_how_much_is_live() {
        let mib = 1u64 << 20;
        let base = 1u64 << 30;
        // MiB 0 full, MiB 1 half, MiB 2 empty, MiB 3 a sliver; an
        // allocation across the boundary of MiB 4 and 5 counts in both.
        let live = [
            (base, mib),
            (base + mib, mib / 2),
            (base + 3 * mib, 256),
            (base + 4 * mib + mib / 2, mib),
        ];
        let map = super::occupancy_map(live.into_iter(), base, base + 6 * mib);
        assert_eq!(map, "#5.155");
    }

    #[test]
    fn span_rounds_names_each_round_from_the_lowest_address() {
        let mib = 1u64 << 20;
        let line = span_rounds(
            "ours",
            "256",
            &[1.0, 1.25],
            &[(10 * mib, 20 * mib), (8 * mib, 18 * mib)],
        );
        assert_eq!(
            line,
            "frag 256 B, ours, span by round (MiB from the lowest): 1.000 [2, 12) 1.250 [0, 10)"
        );
    }
}
