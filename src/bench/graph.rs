//! The `graph` test: dynamic-graph updates (faimGraph style, issues 5 and
//! 18) with the page sources and update kernels compared in one run. Sources:
//! our heap (`ours`), CUDA's device malloc (`cuda-malloc`, if chosen) and a
//! pre-allocated page pool (`page-pool`, always); kernels: one thread per
//! vertex (`/thread`) and one warp per vertex (`/warp`). Single-threaded host
//! code.
//!
//! Sweep: R-MAT scales [`SCALES`] (edge factor [`EDGE_FACTOR`]) × batch
//! sizes [`BATCHES`] × {insert/delete rounds, expansion-only rounds}. For one
//! (scale, batch, mode) every configuration (source × kernel) holds its own
//! graph, loaded with the first half of the R-MAT stream (by the warp
//! kernel, untimed: the load is the same chain layout whoever applies it).
//! Then [`ROUNDS`] rounds: insert the next `batch` edges of the stream and,
//! unless expansion only, delete `batch` edges picked from the stream; each
//! kernel is timed alone with CUDA events (batches uploaded before). The
//! configurations run round by round side by side, so the host reference is
//! advanced once per round for all of them.
//!
//! Records per configuration: `mean_insert_ms` and `mean_delete_ms` (the mean
//! over rounds, in the record's median field; min and max too) and
//! `bytes_per_edge`: memory the source holds for the graph at the end over
//! the edges held (ours: segments in use, whole; pool: pages taken; CUDA:
//! the bytes requested, its own overhead unseen), with the numbers in the
//! note. Every configuration's final graph is checked against the host
//! reference (edge count and an order-independent fingerprint, the exact
//! per-vertex comparison if they differ) and must have counted no error;
//! otherwise its records are invalid.
//!
//! Time budget: the whole sweep stops starting work after [`BUDGET_S`]
//! seconds (`--graph-budget`) (what is left gets `skipped` records saying so), and a
//! configuration whose kernels took more than [`RUN_BUDGET_S`] seconds in
//! one (scale, batch, mode) stops there (checked at that round) and is not
//! run again at that scale and batch or any larger one (larger scale and
//! batch both). So the sweep fits in 10 minutes
//! with the host's R-MAT generation and checks.
//!
//! Cost note: a chunk of targets walks its vertex's whole chain, so a hub's
//! share of a batch costs O(degree × share / 128) page visits with warps
//! inserting, `/ 32` deleting, and O(degree × share) with threads; the load
//! of scale 22 has hubs of 10^5 edges.

use std::collections::HashSet;
use std::time::Instant;

use gpu_kernel::graph::page::{EDGES_PER_PAGE, PAGE_BYTES};
use host::graph::batch::GroupedBatch;
use host::graph::device::{DeviceBatch, DeviceGraph, DevicePool, Pages, UpdateBy};
use host::graph::reference::Reference;
use host::graph::rmat::{Rmat, SplitMix64};
use host::{DeviceHeap, Gpu, HeapConfig, Result};

use super::measure::Summary;
use super::report::Record;
use super::suite::Options;

/// Timed rounds per configuration.
pub const ROUNDS: usize = 10;
/// R-MAT scales measured.
pub const SCALES: [u32; 5] = [18, 19, 20, 21, 22];
/// Edges per vertex of the R-MAT stream.
pub const EDGE_FACTOR: u32 = 16;
/// Update batch sizes.
pub const BATCHES: [usize; 3] = [10_000, 100_000, 1_000_000];
/// Seconds after which the sweep starts nothing new, by default
/// (`--graph-budget`).
pub const BUDGET_S: f64 = 540.0;
/// Seconds of kernel time one configuration may take in one (scale, batch,
/// mode) before it is cut off there and at every larger size.
pub const RUN_BUDGET_S: f64 = 60.0;
/// Bytes of each of our heaps (one per kernel kind, so each graph's
/// footprint is its own; pages are 128 bytes).
const HEAP_BYTES: u64 = 4 << 30;
/// The kernel kinds compared.
const KINDS: [UpdateBy; 2] = [UpdateBy::Warp, UpdateBy::Thread];

/// A page source by name, with the heap or pool of one kernel kind.
#[derive(Clone, Copy)]
struct Source<'a> {
    name: &'static str,
    pages: Pages<'a>,
    heap: Option<&'a DeviceHeap>,
    pool: Option<&'a DevicePool>,
}

/// One configuration's graph and samples in one (scale, batch, mode).
struct Run<'a> {
    source: Source<'a>,
    by: UpdateBy,
    graph: DeviceGraph,
    insert_ms: Vec<f64>,
    delete_ms: Vec<f64>,
    kernel_s: f64,
}

impl Run<'_> {
    fn label(&self) -> String {
        format!("{}/{}", self.source.name, self.by.name())
    }
}

/// What one (scale, batch, mode) shares.
struct Group<'a> {
    scale: u32,
    batch: usize,
    expansion_only: bool,
    stream: &'a [(u32, u32)],
    loaded: &'a DeviceBatch,
    base: &'a Reference,
}

impl Group<'_> {
    fn label(&self) -> String {
        let mode = if self.expansion_only {
            "expand"
        } else {
            "update"
        };
        format!("scale{}-{mode}-{}", self.scale, self.batch)
    }
}

fn skipped(test_label: &str, batch: usize, allocator: &str, why: &str) -> Record {
    Record::new(
        "graph",
        allocator,
        batch as u64,
        test_label,
        batch as u64,
        "mean_insert_ms",
        Summary::default(),
        false,
        format!("skipped: {why}"),
    )
}

/// The sweep's state across groups.
struct Sweep {
    start: Instant,
    budget_s: f64,
    /// Configurations cut off by [`RUN_BUDGET_S`]: label, scale, batch and
    /// group label where it happened.
    cut: Vec<(String, u32, usize, String)>,
    records: Vec<Record>,
}

impl Sweep {
    fn over_budget(&self) -> bool {
        self.start.elapsed().as_secs_f64() > self.budget_s
    }

    fn budget_note(&self) -> String {
        format!("the sweep's {} s budget was spent", self.budget_s)
    }

    /// Runs one group for `sources` × [`KINDS`].
    fn group(&mut self, gpu: &Gpu, g: &Group, sources: &[[Source; 2]], seed: u64) -> Result<()> {
        let label = g.label();
        let mut runs = Vec::new();
        for (k, &by) in KINDS.iter().enumerate() {
            for per_kind in sources {
                let source = per_kind[k];
                let name = format!("{}/{}", source.name, by.name());
                if self.over_budget() {
                    self.records
                        .push(skipped(&label, g.batch, &name, &self.budget_note()));
                } else if let Some((.., at)) = self.cut.iter().find(|(n, scale, batch, _)| {
                    *n == name && g.scale >= *scale && g.batch >= *batch
                }) {
                    let why = format!("cut off at {at} by its {RUN_BUDGET_S} s budget");
                    self.records.push(skipped(&label, g.batch, &name, &why));
                } else {
                    let graph = DeviceGraph::new(gpu, g.base.vertices() as u64)?;
                    graph.insert_by(source.pages, UpdateBy::Warp, g.loaded)?;
                    runs.push(Run {
                        source,
                        by,
                        graph,
                        insert_ms: Vec::new(),
                        delete_ms: Vec::new(),
                        kernel_s: 0.0,
                    });
                }
            }
        }
        if runs.is_empty() {
            return Ok(());
        }
        eprintln!("graph: {label}, {} configurations", runs.len());
        let mut reference = g.base.clone();
        let mut picker = SplitMix64(seed ^ g.batch as u64);
        let mut at = g.stream.len() / 2;
        let mut round = 0;
        while round < ROUNDS && !runs.is_empty() {
            if self.over_budget() {
                let why = format!("{} after {round} rounds", self.budget_note());
                for run in runs.drain(..) {
                    self.finish(gpu, g, run, &reference, Some(&why))?;
                }
                break;
            }
            let inserts: Vec<(u32, u32)> = (0..g.batch)
                .map(|i| g.stream[(at + i) % g.stream.len()])
                .collect();
            at = (at + g.batch) % g.stream.len();
            reference.insert(&inserts).map_err(host::Error::Check)?;
            let inserts = DeviceBatch::new(gpu, &GroupedBatch::new(&inserts))?;
            let deletes = if g.expansion_only {
                None
            } else {
                let d: Vec<(u32, u32)> = (0..g.batch)
                    .map(|_| g.stream[picker.below(g.stream.len() as u64) as usize])
                    .collect();
                reference.delete(&d).map_err(host::Error::Check)?;
                Some(DeviceBatch::new(gpu, &GroupedBatch::new(&d))?)
            };
            gpu.sync()?;
            for run in &mut runs {
                let ms = gpu.time(|| run.graph.insert_by(run.source.pages, run.by, &inserts))?;
                run.insert_ms.push(ms);
                run.kernel_s += ms / 1e3;
            }
            if let Some(d) = &deletes {
                for run in &mut runs {
                    let ms = gpu.time(|| run.graph.delete_by(run.source.pages, run.by, d))?;
                    run.delete_ms.push(ms);
                    run.kernel_s += ms / 1e3;
                }
            }
            round += 1;
            let (over, within): (Vec<Run>, Vec<Run>) =
                runs.drain(..).partition(|r| r.kernel_s > RUN_BUDGET_S);
            runs = within;
            for run in over {
                let why = format!(
                    "cut off after {round} rounds by its {RUN_BUDGET_S} s budget ({:.1} s)",
                    run.kernel_s
                );
                self.cut
                    .push((run.label(), g.scale, g.batch, label.clone()));
                self.finish(gpu, g, run, &reference, Some(&why))?;
            }
        }
        for run in runs {
            self.finish(gpu, g, run, &reference, None)?;
        }
        Ok(())
    }

    /// Checks `run`'s graph against `reference`, measures its memory, gives
    /// its pages back and records it.
    fn finish(
        &mut self,
        gpu: &Gpu,
        g: &Group,
        run: Run,
        reference: &Reference,
        cut: Option<&str>,
    ) -> Result<()> {
        let label = g.label();
        let name = run.label();
        let errors = run.graph.errors()?;
        let adjacency = run.graph.adjacency()?;
        let difference = reference.quick_difference(&adjacency);
        let edges = reference.edge_count();
        let chain_pages: u64 = adjacency
            .iter()
            .map(|l| l.len().div_ceil(EDGES_PER_PAGE) as u64)
            .sum();
        let (bytes, how) = if let Some(heap) = run.source.heap {
            let s = heap.stats()?;
            let segment = heap.bytes() / heap.segments();
            let used = (s.segments - s.free_segments) as u64 * segment;
            (
                used,
                format!(
                    "{} segments of {segment} B in use, {} B live",
                    s.segments - s.free_segments,
                    s.live_bytes
                ),
            )
        } else if let Some(pool) = run.source.pool {
            let taken = pool.capacity() - pool.free_pages()?;
            (
                taken * PAGE_BYTES as u64,
                format!(
                    "{taken} of {} pre-allocated pages taken ({} B reserved)",
                    pool.capacity(),
                    pool.capacity() * PAGE_BYTES as u64
                ),
            )
        } else {
            (
                chain_pages * PAGE_BYTES as u64,
                "bytes requested from CUDA's malloc (its overhead not seen)".to_string(),
            )
        };
        run.graph.clear(run.source.pages)?;
        gpu.sync()?;
        let mut problems = Vec::new();
        if run.insert_ms.is_empty() {
            problems.push("no round ran".to_string());
        }
        if errors != (0, 0) {
            problems.push(format!(
                "{} page requests failed, {} ids out of range",
                errors.0, errors.1
            ));
        }
        if let Some(d) = &difference {
            problems.push(format!("differs from the host reference: {d}"));
        }
        let valid = problems.is_empty();
        let mut note = format!(
            "R-MAT scale {}, edge factor {EDGE_FACTOR}; {} rounds; {}",
            g.scale,
            run.insert_ms.len(),
            if valid {
                "checked against the host reference".to_string()
            } else {
                problems.join("; ")
            }
        );
        if let Some(cut) = cut {
            note.push_str("; ");
            note.push_str(cut);
        }
        let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len().max(1) as f64;
        let mut metrics = vec![("mean_insert_ms", &run.insert_ms)];
        if !g.expansion_only {
            metrics.push(("mean_delete_ms", &run.delete_ms));
        }
        for (metric, samples) in metrics {
            let mut summary = Summary::of(samples);
            summary.median = mean(samples);
            self.records.push(Record::new(
                "graph",
                &name,
                g.batch as u64,
                &label,
                g.batch as u64,
                metric,
                summary,
                valid,
                note.clone(),
            ));
        }
        let per_edge = bytes as f64 / edges.max(1) as f64;
        self.records.push(Record::new(
            "graph",
            &name,
            g.batch as u64,
            &label,
            g.batch as u64,
            "bytes_per_edge",
            Summary::of(&[per_edge]),
            valid,
            format!(
                "{bytes} B for {edges} edges in {chain_pages} pages ({} B of edge ids); {how}",
                edges * 4
            ),
        ));
        Ok(())
    }
}

/// Runs the sweep for `opts.allocators` (`ours`, `cuda-malloc`) and the page
/// pool. With `cuda-malloc` it sets CUDA's malloc heap to `opts.heap`, which
/// must come before any kernel of the process uses that malloc, and must hold
/// two graphs of the largest scale (one per kernel kind).
pub fn run(gpu: &Gpu, opts: &Options) -> Result<Vec<Record>> {
    let with = |a: &str| opts.allocators.iter().any(|x| x == a);
    if with("cuda-malloc") {
        gpu.set_malloc_heap_size(opts.heap)?;
    }
    let heaps = [
        DeviceHeap::new(gpu, HeapConfig::unchecked(HEAP_BYTES))?,
        DeviceHeap::new(gpu, HeapConfig::unchecked(HEAP_BYTES))?,
    ];
    let mut sweep = Sweep {
        start: Instant::now(),
        budget_s: opts.graph_budget_s,
        cut: Vec::new(),
        records: Vec::new(),
    };
    for scale in SCALES {
        if sweep.over_budget() {
            let names: HashSet<String> =
                sweep.records.iter().map(|r| r.allocator.clone()).collect();
            let why = sweep.budget_note();
            for batch in BATCHES {
                for mode in ["update", "expand"] {
                    for name in &names {
                        sweep.records.push(skipped(
                            &format!("scale{scale}-{mode}-{batch}"),
                            batch,
                            name,
                            &why,
                        ));
                    }
                }
            }
            continue;
        }
        let rmat = Rmat::new(scale, EDGE_FACTOR, opts.seed);
        let stream = rmat.generate().map_err(host::Error::Check)?;
        // A chain of d edges holds ceil(d / EDGES_PER_PAGE) pages, and no
        // vertex has more edges than the stream.
        let capacity = stream.edges.len().div_ceil(EDGES_PER_PAGE) as u64 + stream.vertices as u64;
        let capacity = capacity.min(u32::MAX as u64 - 1);
        let pools = [
            DevicePool::new(gpu, capacity)?,
            DevicePool::new(gpu, capacity)?,
        ];
        let mut sources = vec![[0, 1].map(|k| Source {
            name: "page-pool",
            pages: Pages::Pool(&pools[k]),
            heap: None,
            pool: Some(&pools[k]),
        })];
        if with("ours") {
            sources.push([0, 1].map(|k| Source {
                name: "ours",
                pages: Pages::Heap(&heaps[k]),
                heap: Some(&heaps[k]),
                pool: None,
            }));
        }
        if with("cuda-malloc") {
            sources.push([0, 1].map(|_| Source {
                name: "cuda-malloc",
                pages: Pages::Cuda,
                heap: None,
                pool: None,
            }));
        }
        let half = &stream.edges[..stream.edges.len() / 2];
        let loaded = DeviceBatch::new(gpu, &GroupedBatch::new(half))?;
        let mut base = Reference::new(stream.vertices);
        base.insert(half).map_err(host::Error::Check)?;
        for batch in BATCHES {
            for expansion_only in [false, true] {
                let group = Group {
                    scale,
                    batch,
                    expansion_only,
                    stream: &stream.edges,
                    loaded: &loaded,
                    base: &base,
                };
                sweep.group(gpu, &group, &sources, opts.seed)?;
            }
        }
    }
    eprintln!(
        "graph: sweep took {:.0} s",
        sweep.start.elapsed().as_secs_f64()
    );
    Ok(sweep.records)
}
