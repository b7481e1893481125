//! The `graph` test: dynamic-graph updates (faimGraph style, issues 5 and
//! 18) with the page sources and update kernels compared in one run. Sources:
//! our heap (`ours`), CUDA's device malloc (`cuda-malloc`, if chosen) and a
//! pre-allocated page pool (`page-pool`, always); kernels: one warp per vertex
//! (`/warp`) everywhere, one thread per vertex (`/thread`) only in the
//! smallest group unless `--graph-threads` (a thread walks a hub's whole chain
//! per target: seconds per round from 10^6 edges). Single-threaded host code.
//!
//! Sweep: R-MAT scales [`SCALES`] (`--graph-scales`) × batch sizes
//! [`BATCHES`] × {insert/delete rounds, expansion-only rounds}. Per scale the
//! R-MAT stream is generated once, long enough that no insert repeats the
//! stream ([`EDGE_FACTOR`] edges a vertex, or more: the load and every
//! round's batch), and each
//! configuration (source × kernel) gets one graph, loaded once with the
//! first `EDGE_FACTOR / 2` edges a vertex (by the warp kernel, timed apart
//! from the rounds). The groups then run one after another on those graphs,
//! smallest batch first, update before expansion: up to [`ROUNDS`] rounds
//! (fewer where they would insert more than the load: 2 at scale 18 and
//! 10^6 edges, so a small graph does not grow to many times its size) that
//! insert the next `batch` edges of the stream and, unless expansion
//! only, delete `batch` edges picked from those inserted so far; each kernel
//! is timed alone with CUDA events (batches uploaded before). So a group
//! starts from the graph the previous one left, and one host model (an
//! [`EdgeSet`]) is advanced once per round for every configuration in step.
//!
//! A configuration whose kernels take more than [`GROUP_CAP_S`] seconds in
//! one group runs no more rounds there ("cut off after N of M rounds", the
//! mean over the rounds it ran) and goes on from its own copy of the model in
//! the next group; one whose first round alone takes over [`ROUND_CAP_S`] is
//! not run again at that scale or at a larger scale and batch (recorded as
//! skipped).
//!
//! Records per configuration and group: `mean_insert_ms` and
//! `mean_delete_ms` (the mean over rounds, in the record's median field; min
//! and max too) and `bytes_per_edge`: memory the source holds for the graph
//! at the end of the group over the edges held (ours: segments in use,
//! whole; pool: pages taken; CUDA: the bytes requested, its own overhead
//! unseen), with the numbers in the note. After every group each graph is
//! exported and checked against its model (degree of every vertex, then the
//! order-independent fingerprint of all edges; the first differing vertex
//! named if they differ) and must have counted no error; otherwise the
//! group's records are invalid.
//!
//! Time budget: the sweep starts nothing new after [`BUDGET_S`] seconds
//! (`--graph-budget`): what is left gets `skipped` records saying so. Before
//! a configuration's load, its time is predicted from its load at the last
//! smaller scale of the run ([`LOAD_GROWTH`] a scale); if that load and the
//! scale's groups (the last scale's wall time × [`GROUPS_GROWTH`]) would end
//! past the budget, the configuration is not loaded there and its records say
//! "cut off: load would take ~N s" (on the H100 CUDA's malloc at scale 22:
//! 156 s against 7 s for the pool and 2 s for our heap), while the others
//! run every group. Graphs are cleared after a scale only where a later
//! scale will take pages from the same source (our heaps, CUDA's malloc
//! heap; a pool goes with its scale): after the last scale, or once the
//! budget is spent, the pages go with the heaps and the process. Every
//! scale and group logs a line of where its time went (host generation,
//! model, batches; device load, kernels, export and check, each graph's
//! clear), so a slow run says why.
//!
//! Cost note: a chunk of targets walks its vertex's whole chain, so a hub's
//! share of a batch costs O(degree × share / 128) page visits with warps
//! inserting, `/ 32` deleting, and O(degree × share) with threads; the load
//! of scale 22 has hubs of 10^5 edges.

use std::collections::HashSet;
use std::time::Instant;

use gpu_kernels::graph::page::{EDGES_PER_PAGE, PAGE_BYTES};
use graph::batch::GroupedBatch;
use graph::device::{DeviceBatch, DeviceGraph, DevicePool, Pages, UpdateBy};
use graph::edge_set::EdgeSet;
use graph::rmat::{Rmat, SplitMix64};
use host::{DeviceHeap, Gpu, HeapConfig, Result};

use super::measure::Summary;
use super::report::Record;
use super::suite::Options;

/// Rounds per configuration and group, at most; fewer where `ROUNDS`
/// batches would insert more edges than the load (see [`Group::rounds`]).
pub const ROUNDS: usize = 10;
/// R-MAT scales measured by default (`--graph-scales`).
pub const SCALES: [u32; 5] = [18, 19, 20, 21, 22];
/// Edges per vertex of the R-MAT graph; half of them are loaded.
pub const EDGE_FACTOR: u32 = 16;
/// Update batch sizes, in sweep order.
pub const BATCHES: [usize; 3] = [10_000, 100_000, 1_000_000];
/// Seconds after which the sweep starts nothing new, by default
/// (`--graph-budget`).
pub const BUDGET_S: f64 = 450.0;
/// Seconds of kernel time one configuration may take in one group before
/// its remaining rounds there are dropped.
pub const GROUP_CAP_S: f64 = 3.0;
/// Seconds of kernel time of one configuration's first round in a group
/// above which it is not run again at that scale or a larger one, at that
/// batch or a larger one.
pub const ROUND_CAP_S: f64 = 15.0;
/// Factor by which a configuration's load time is taken to grow from one
/// scale to the next when deciding whether its load fits the budget (the
/// H100 log of 2026-11-22: ×2.6–3.5 a scale through CUDA's malloc, 17.5 s,
/// 45 s, 156 s at scales 20–22; ×2–2.5 for ours and the pool).
pub const LOAD_GROWTH: f64 = 4.0;
/// Factor by which a scale's groups are taken to last longer than the last
/// scale's, for the time a load must leave to them (×1.3–1.5 a scale on the
/// H100).
pub const GROUPS_GROWTH: f64 = 2.0;
/// Bytes of each of our heaps (one per kernel kind, so each graph's
/// footprint is its own; pages are 128 bytes).
const HEAP_BYTES: u64 = 4 << 30;
/// The kernel kinds, in the order the heaps and pools are indexed.
const KINDS: [UpdateBy; 2] = [UpdateBy::Warp, UpdateBy::Thread];

/// A page source by name, with the heap or pool of one kernel kind.
#[derive(Clone, Copy)]
struct Source<'a> {
    name: &'static str,
    pages: Pages<'a>,
    heap: Option<&'a DeviceHeap>,
    pool: Option<&'a DevicePool>,
}

/// One configuration's graph at one scale.
struct Run<'a> {
    source: Source<'a>,
    by: UpdateBy,
    graph: DeviceGraph,
    /// Its own model once it has fallen behind the group's rounds; `None`
    /// while it is in step with the sweep's model.
    behind: Option<EdgeSet>,
}

impl Run<'_> {
    fn label(&self) -> String {
        label(self.source.name, self.by)
    }
}

fn label(source: &str, by: UpdateBy) -> String {
    format!("{source}/{}", by.name())
}

/// One run's samples in one group.
#[derive(Default)]
struct Samples {
    insert_ms: Vec<f64>,
    delete_ms: Vec<f64>,
    kernel_s: f64,
    cut: Option<String>,
}

/// One (scale, batch, mode).
#[derive(Clone, Copy)]
struct Group {
    scale: u32,
    batch: usize,
    expansion_only: bool,
    /// Rounds planned.
    rounds: usize,
}

impl Group {
    fn label(&self) -> String {
        let mode = if self.expansion_only {
            "expand"
        } else {
            "update"
        };
        format!("scale{}-{mode}-{}", self.scale, self.batch)
    }

    /// Every group of `scale`, in sweep order.
    fn all(scale: u32) -> impl Iterator<Item = Group> {
        BATCHES.into_iter().flat_map(move |batch| {
            [false, true].map(|expansion_only| Group {
                scale,
                batch,
                expansion_only,
                rounds: Group::rounds(scale, batch),
            })
        })
    }

    /// Rounds of `batch` edges at `scale`: [`ROUNDS`], but no more than
    /// insert as many edges as the load (at least one), so that a group at
    /// most doubles the graph and a small scale stays near its size (scale
    /// 18 at 10^6 edges: 2 rounds).
    fn rounds(scale: u32, batch: usize) -> usize {
        ROUNDS.min(load_edges(scale) / batch).max(1)
    }
}

fn skipped(g: &Group, allocator: &str, why: &str) -> Record {
    not_run(g, allocator, format!("skipped: {why}"))
}

/// A record of a configuration that did not run in `g`, saying why.
fn not_run(g: &Group, allocator: &str, note: String) -> Record {
    Record::new(
        "graph",
        allocator,
        g.batch as u64,
        &g.label(),
        g.batch as u64,
        "mean_insert_ms",
        Summary::default(),
        false,
        note,
    )
}

/// Stream edges one scale needs: the load and every round's inserts, so
/// that no insert repeats the stream (a repeat takes no page and would time
/// the chain walk alone).
fn stream_edges(scale: u32) -> u64 {
    let inserts: usize = Group::all(scale).map(|g| g.rounds * g.batch).sum();
    ((load_edges(scale) + inserts) as u64).max((EDGE_FACTOR as u64) << scale)
}

/// Edges loaded at `scale`: half the R-MAT graph's.
fn load_edges(scale: u32) -> usize {
    (EDGE_FACTOR as usize / 2) << scale
}

/// The sweep's state across scales.
struct Sweep {
    start: Instant,
    budget_s: f64,
    threads: bool,
    first_scale: u32,
    /// Configurations whose first round exceeded [`ROUND_CAP_S`]: label,
    /// scale, batch and the group where it happened.
    cut: Vec<(String, u32, usize, String)>,
    /// Seconds each configuration's load took: label, scale, seconds.
    loads: Vec<(String, u32, f64)>,
    /// Wall seconds of the last loaded scale's groups.
    groups_s: Option<f64>,
    records: Vec<Record>,
}

impl Sweep {
    fn over_budget(&self) -> bool {
        self.start.elapsed().as_secs_f64() > self.budget_s
    }

    fn budget_note(&self) -> String {
        format!("the sweep's {} s budget was spent", self.budget_s)
    }

    /// Whether kernel kind `by` runs in group `g`.
    fn kind_runs(&self, by: UpdateBy, g: &Group) -> bool {
        by == UpdateBy::Warp
            || self.threads
            || (g.scale == self.first_scale && g.batch == BATCHES[0])
    }

    /// Why configuration `name` is not run in `g`, if it is cut off there.
    fn cut_off(&self, name: &str, g: &Group) -> Option<String> {
        self.cut
            .iter()
            .find(|(n, scale, batch, _)| n == name && g.scale >= *scale && g.batch >= *batch)
            .map(|(.., at)| format!("one round took over {ROUND_CAP_S} s at {at}"))
    }

    /// Why configuration `name` is not loaded at `scale` when `elapsed`
    /// seconds of the sweep have gone, if it is cut off there: its load,
    /// predicted from its load at the largest smaller scale of this run
    /// ([`LOAD_GROWTH`] a scale), and the groups after it (the last scale's
    /// × [`GROUPS_GROWTH`]) would end past the budget. Without an earlier
    /// load to go by, none is cut off.
    fn load_cut(&self, name: &str, scale: u32, elapsed: f64) -> Option<String> {
        let &(_, at, seconds) = self
            .loads
            .iter()
            .filter(|(n, s, _)| n == name && *s < scale)
            .max_by_key(|(_, s, _)| *s)?;
        let load_s = seconds * LOAD_GROWTH.powi((scale - at) as i32);
        let groups_s = self.groups_s.unwrap_or(0.0) * GROUPS_GROWTH;
        (elapsed + load_s + groups_s > self.budget_s).then(|| {
            format!(
                "cut off: load would take ~{load_s:.0} s ({seconds:.1} s at scale {at}, ×{LOAD_GROWTH} a scale); \
                 with ~{groups_s:.0} s kept for the groups it would end past the sweep's {} s budget \
                 ({elapsed:.0} s gone)",
                self.budget_s
            )
        })
    }

    /// Runs every group of `scale` for `sources` × [`KINDS`]; `last`: no
    /// later scale follows (its graphs are not cleared).
    fn scale(
        &mut self,
        gpu: &Gpu,
        heaps: &[DeviceHeap; 2],
        scale: u32,
        last: bool,
        opts: &Options,
    ) -> Result<()> {
        let with = |a: &str| opts.allocators.iter().any(|x| x == a);
        let mut names = vec!["page-pool"];
        if with("ours") {
            names.push("ours");
        }
        if with("cuda-malloc") {
            names.push("cuda-malloc");
        }
        if self.over_budget() {
            let why = self.budget_note();
            for g in Group::all(scale) {
                let kinds: Vec<UpdateBy> = KINDS
                    .into_iter()
                    .filter(|&by| self.kind_runs(by, &g))
                    .collect();
                for by in kinds {
                    for name in &names {
                        self.records.push(skipped(&g, &label(name, by), &why));
                    }
                }
            }
            return Ok(());
        }
        let clock = Instant::now();
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get());
        let stream = Rmat::new(scale, EDGE_FACTOR, opts.seed)
            .generate_chunked(stream_edges(scale), threads)
            .map_err(host::Error::Check)?;
        let generate_s = clock.elapsed().as_secs_f64();
        let (load, updates) = stream.edges.split_at(load_edges(scale));
        let clock = Instant::now();
        let mut model = EdgeSet::new(stream.vertices);
        model.insert(load).map_err(host::Error::Check)?;
        let model_s = clock.elapsed().as_secs_f64();
        let clock = Instant::now();
        let loaded = DeviceBatch::new(gpu, &GroupedBatch::new(load))?;
        gpu.sync()?;
        let batch_s = clock.elapsed().as_secs_f64();
        eprintln!(
            "graph: scale {scale}: R-MAT {} edges in {generate_s:.1} s ({threads} threads); host model of the {} loaded ({} distinct) in {model_s:.1} s; load batch grouped and uploaded in {batch_s:.1} s",
            stream.edges.len(),
            load.len(),
            model.edge_count()
        );
        // A chain of d edges holds ceil(d / EDGES_PER_PAGE) pages, and no
        // vertex has more edges than the stream.
        let capacity = (stream.edges.len().div_ceil(EDGES_PER_PAGE) as u64
            + stream.vertices as u64)
            .min(u32::MAX as u64 - 1);
        let threads_here = Group::all(scale).any(|g| self.kind_runs(UpdateBy::Thread, &g));
        let pools = [
            Some(DevicePool::new(gpu, capacity)?),
            threads_here
                .then(|| DevicePool::new(gpu, capacity))
                .transpose()?,
        ];
        let mut runs = Vec::new();
        for (k, by) in KINDS.into_iter().enumerate() {
            if !Group::all(scale).any(|g| self.kind_runs(by, &g)) {
                continue;
            }
            for &name in &names {
                let source = match name {
                    "page-pool" => {
                        let pool = pools[k].as_ref().expect("a pool for every kind that runs");
                        Source {
                            name,
                            pages: Pages::Pool(pool),
                            heap: None,
                            pool: Some(pool),
                        }
                    }
                    "ours" => Source {
                        name,
                        pages: Pages::Heap(&heaps[k]),
                        heap: Some(&heaps[k]),
                        pool: None,
                    },
                    _ => Source {
                        name,
                        pages: Pages::Cuda,
                        heap: None,
                        pool: None,
                    },
                };
                let name_by = label(name, by);
                if Group::all(scale).all(|g| self.cut_off(&name_by, &g).is_some()) {
                    let skips: Vec<Record> = Group::all(scale)
                        .filter(|g| self.kind_runs(by, g))
                        .filter_map(|g| Some(skipped(&g, &name_by, &self.cut_off(&name_by, &g)?)))
                        .collect();
                    self.records.extend(skips);
                    continue;
                }
                let elapsed = self.start.elapsed().as_secs_f64();
                if let Some(why) = self.load_cut(&name_by, scale, elapsed) {
                    eprintln!("graph: scale {scale}: {name_by} {why}");
                    let skips: Vec<Record> = Group::all(scale)
                        .filter(|g| self.kind_runs(by, g))
                        .map(|g| not_run(&g, &name_by, why.clone()))
                        .collect();
                    self.records.extend(skips);
                    continue;
                }
                let clock = Instant::now();
                let graph = DeviceGraph::new(gpu, stream.vertices as u64)?;
                let ms = gpu.time(|| graph.insert_by(source.pages, UpdateBy::Warp, &loaded))?;
                let load_s = clock.elapsed().as_secs_f64();
                eprintln!(
                    "graph: scale {scale}: {name_by} loaded in {load_s:.2} s (kernel {:.2} s)",
                    ms / 1e3
                );
                self.loads.push((name_by, scale, load_s));
                runs.push(Run {
                    source,
                    by,
                    graph,
                    behind: None,
                });
            }
        }
        drop(loaded);
        let mut at = 0;
        let mut picker = SplitMix64(opts.seed ^ scale as u64);
        let groups_clock = Instant::now();
        for g in Group::all(scale) {
            self.group(
                gpu,
                &g,
                &mut runs,
                &mut model,
                updates,
                load,
                &mut at,
                &mut picker,
            )?;
        }
        if !runs.is_empty() {
            self.groups_s = Some(groups_clock.elapsed().as_secs_f64());
        }
        // Pages go back to the sources that outlive this scale: our heaps
        // and CUDA's malloc heap (each pool goes with its scale). After the
        // last scale, or once the budget is spent (no later scale loads a
        // graph), nothing takes pages from them again: our heaps are
        // dropped and CUDA's goes with the process (see [`run`]), so
        // nothing is cleared (66 s at scale 22 on the H100).
        if last || self.over_budget() {
            eprintln!(
                "graph: scale {scale}: graphs not cleared (no later scale: the pages go with the heaps and the process)"
            );
            return Ok(());
        }
        let clock = Instant::now();
        let mut cleared = Vec::new();
        for run in runs.iter().filter(|r| r.source.pool.is_none()) {
            let ms = gpu.time(|| run.graph.clear(run.source.pages))?;
            cleared.push(format!("{} {:.2}", run.label(), ms / 1e3));
        }
        eprintln!(
            "graph: scale {scale}: graphs cleared in {:.2} s (s: {}; pool graphs go with their pools)",
            clock.elapsed().as_secs_f64(),
            cleared.join(", ")
        );
        Ok(())
    }

    /// Runs group `g` on `runs`: the rounds, then a check and records for
    /// every run that took part. `updates[at..]` are the edges not yet
    /// inserted; `load` and `updates[..at]` the ones that were.
    #[allow(clippy::too_many_arguments)]
    fn group(
        &mut self,
        gpu: &Gpu,
        g: &Group,
        runs: &mut [Run],
        model: &mut EdgeSet,
        updates: &[(u32, u32)],
        load: &[(u32, u32)],
        at: &mut usize,
        picker: &mut SplitMix64,
    ) -> Result<()> {
        let label = g.label();
        let group_clock = Instant::now();
        let mut active = Vec::new();
        for (i, run) in runs.iter().enumerate() {
            if !self.kind_runs(run.by, g) {
                continue;
            }
            let name = run.label();
            if self.over_budget() {
                self.records.push(skipped(g, &name, &self.budget_note()));
            } else if let Some(why) = self.cut_off(&name, g) {
                self.records.push(skipped(g, &name, &why));
            } else {
                active.push(i);
            }
        }
        if active.is_empty() {
            return Ok(());
        }
        eprintln!(
            "graph: {label}, {} configurations, {:.0} s into the sweep",
            active.len(),
            self.start.elapsed().as_secs_f64()
        );
        let mut samples: Vec<Samples> = active.iter().map(|_| Samples::default()).collect();
        let (mut batches_s, mut model_s) = (0.0, 0.0);
        let mut round = 0;
        while round < g.rounds && samples.iter().any(|s| s.cut.is_none()) {
            if self.over_budget() {
                let why = format!("{} after {round} rounds", self.budget_note());
                for s in samples.iter_mut().filter(|s| s.cut.is_none()) {
                    s.cut = Some(why.clone());
                }
                break;
            }
            let clock = Instant::now();
            let end = (*at + g.batch).min(updates.len());
            let inserts = &updates[*at..end];
            *at = end;
            let deletes: Vec<(u32, u32)> = if g.expansion_only {
                Vec::new()
            } else {
                let inserted = load.len() + *at;
                (0..g.batch)
                    .map(|_| {
                        let i = picker.below(inserted as u64) as usize;
                        if i < load.len() {
                            load[i]
                        } else {
                            updates[i - load.len()]
                        }
                    })
                    .collect()
            };
            let insert_batch = DeviceBatch::new(gpu, &GroupedBatch::new(inserts))?;
            let delete_batch = if g.expansion_only {
                None
            } else {
                Some(DeviceBatch::new(gpu, &GroupedBatch::new(&deletes))?)
            };
            gpu.sync()?;
            batches_s += clock.elapsed().as_secs_f64();
            let clock = Instant::now();
            // The sweep's model follows every round; a run that fell behind
            // follows its own.
            model.insert(inserts).map_err(host::Error::Check)?;
            model.delete(&deletes).map_err(host::Error::Check)?;
            for (&i, s) in active.iter().zip(&samples) {
                if let (Some(own), None) = (runs[i].behind.as_mut(), &s.cut) {
                    own.insert(inserts).map_err(host::Error::Check)?;
                    own.delete(&deletes).map_err(host::Error::Check)?;
                }
            }
            model_s += clock.elapsed().as_secs_f64();
            for (&i, s) in active.iter().zip(&mut samples) {
                if s.cut.is_some() {
                    continue;
                }
                let run = &runs[i];
                let ms =
                    gpu.time(|| run.graph.insert_by(run.source.pages, run.by, &insert_batch))?;
                s.insert_ms.push(ms);
                s.kernel_s += ms / 1e3;
                if let Some(d) = &delete_batch {
                    let ms = gpu.time(|| run.graph.delete_by(run.source.pages, run.by, d))?;
                    s.delete_ms.push(ms);
                    s.kernel_s += ms / 1e3;
                }
            }
            round += 1;
            for (&i, s) in active.iter().zip(&mut samples) {
                if s.cut.is_some() || s.kernel_s <= GROUP_CAP_S || round == g.rounds {
                    continue;
                }
                s.cut = Some(format!(
                    "cut off after {round} of {} rounds by its {GROUP_CAP_S} s cap ({:.1} s of kernels)",
                    g.rounds, s.kernel_s
                ));
                let run = &mut runs[i];
                if run.behind.is_none() {
                    run.behind = Some(model.clone());
                }
                if round == 1 && s.kernel_s > ROUND_CAP_S {
                    self.cut
                        .push((run.label(), g.scale, g.batch, label.clone()));
                }
            }
        }
        let clock = Instant::now();
        for (&i, s) in active.iter().zip(&samples) {
            let run = &runs[i];
            let model = run.behind.as_ref().unwrap_or(model);
            self.record(g, run, s, model)?;
        }
        let check_s = clock.elapsed().as_secs_f64();
        let kernels: Vec<String> = active
            .iter()
            .zip(&samples)
            .map(|(&i, s)| format!("{} {:.2}", runs[i].label(), s.kernel_s))
            .collect();
        eprintln!(
            "graph: {label}: {round} rounds in {:.1} s: host batches {batches_s:.2} s, host model {model_s:.2} s, kernels (s) {}, export and check {check_s:.2} s; {} edges now",
            group_clock.elapsed().as_secs_f64(),
            kernels.join(", "),
            model.edge_count()
        );
        Ok(())
    }

    /// Checks `run`'s graph against `model`, measures its memory and
    /// records its samples of group `g`.
    fn record(&mut self, g: &Group, run: &Run, s: &Samples, model: &EdgeSet) -> Result<()> {
        let label = g.label();
        let name = run.label();
        let errors = run.graph.errors()?;
        let (degrees, exported) = run.graph.export()?;
        let difference = model.difference(&degrees, &exported);
        let edges = model.edge_count();
        let chain_pages: u64 = degrees
            .iter()
            .map(|&d| d.div_ceil(EDGES_PER_PAGE as u64))
            .sum();
        let (bytes, how) = if let Some(heap) = run.source.heap {
            let stats = heap.stats()?;
            let segment = heap.bytes() / heap.segments();
            let used = (stats.segments - stats.free_segments) as u64 * segment;
            (
                used,
                format!(
                    "{} segments of {segment} B in use, {} B live",
                    stats.segments - stats.free_segments,
                    stats.live_bytes
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
        let mut problems = Vec::new();
        if s.insert_ms.is_empty() {
            problems.push("no round ran".to_string());
        }
        if errors != (0, 0) {
            problems.push(format!(
                "{} page requests failed, {} ids out of range (since the load)",
                errors.0, errors.1
            ));
        }
        if let Some(d) = &difference {
            problems.push(format!("differs from the host model: {d}"));
        }
        let valid = problems.is_empty();
        let mut note = format!(
            "R-MAT scale {}, edge factor {EDGE_FACTOR}, half loaded, groups in turn on one graph; {} of {} rounds; {edges} edges after; {}",
            g.scale,
            s.insert_ms.len(),
            g.rounds,
            if valid {
                "checked against the host model".to_string()
            } else {
                problems.join("; ")
            }
        );
        if let Some(cut) = &s.cut {
            note.push_str("; ");
            note.push_str(cut);
        }
        let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
        let mut metrics = vec![("mean_insert_ms", &s.insert_ms)];
        if !g.expansion_only {
            metrics.push(("mean_delete_ms", &s.delete_ms));
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
/// the graphs of the largest scale. The last scale's pages are left in
/// CUDA's malloc heap, so nothing in the process may use that malloc after
/// this (the program runs each test in a process of its own).
pub fn run(gpu: &Gpu, opts: &Options) -> Result<Vec<Record>> {
    if opts.allocators.iter().any(|x| x == "cuda-malloc") {
        gpu.set_malloc_heap_size(opts.heap)?;
    }
    let heaps = [
        DeviceHeap::new(gpu, HeapConfig::unchecked(HEAP_BYTES))?,
        DeviceHeap::new(gpu, HeapConfig::unchecked(HEAP_BYTES))?,
    ];
    let scales = &opts.graph_scales;
    let mut sweep = Sweep {
        start: Instant::now(),
        budget_s: opts.graph_budget_s,
        threads: opts.graph_threads,
        first_scale: scales.iter().copied().min().unwrap_or(SCALES[0]),
        cut: Vec::new(),
        loads: Vec::new(),
        groups_s: None,
        records: Vec::new(),
    };
    let distinct: HashSet<u32> = scales.iter().copied().collect();
    if distinct.len() != scales.len() {
        return Err(host::Error::Check(format!("repeated scale in {scales:?}")));
    }
    for (i, &scale) in scales.iter().enumerate() {
        // A failure (a driver error, a kernel fault) ends the sweep but keeps
        // what it measured, so a 10-minute run is not lost to its last scale.
        let last = i + 1 == scales.len();
        if let Err(e) = sweep.scale(gpu, &heaps, scale, last, opts) {
            eprintln!("graph: scale {scale} failed, sweep stopped: {e}");
            let g = Group::all(scale).next().expect("every scale has groups");
            sweep
                .records
                .push(skipped(&g, "sweep", &format!("scale {scale} failed: {e}")));
            break;
        }
    }
    eprintln!(
        "graph: sweep took {:.0} s",
        sweep.start.elapsed().as_secs_f64()
    );
    Ok(sweep.records)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sweep(threads: bool) -> Sweep {
        Sweep {
            start: Instant::now(),
            budget_s: BUDGET_S,
            threads,
            first_scale: SCALES[0],
            cut: Vec::new(),
            loads: Vec::new(),
            groups_s: None,
            records: Vec::new(),
        }
    }

    /// No round inserts an edge of the stream twice, at any scale, and no
    /// group inserts more than the load.
    #[test]
    fn the_stream_holds_the_load_and_every_insert() {
        for scale in SCALES {
            let load = (EDGE_FACTOR as u64 / 2) << scale;
            let inserts: u64 = Group::all(scale).map(|g| (g.rounds * g.batch) as u64).sum();
            assert!(stream_edges(scale) >= load + inserts, "scale {scale}");
            assert!(Group::all(scale).all(|g| (1..=ROUNDS).contains(&g.rounds)
                && (g.rounds * g.batch <= load as usize || g.rounds == 1)));
        }
    }

    /// Groups run smallest batch first, update before expansion; threads
    /// only in the first group pair unless asked for; a configuration cut
    /// off at one size is skipped at no smaller scale and batch only.
    #[test]
    fn groups_kinds_and_cut_offs() {
        let order: Vec<String> = Group::all(18).map(|g| g.label()).collect();
        assert_eq!(
            order,
            [
                "scale18-update-10000",
                "scale18-expand-10000",
                "scale18-update-100000",
                "scale18-expand-100000",
                "scale18-update-1000000",
                "scale18-expand-1000000"
            ]
        );
        let mut s = sweep(false);
        let threaded: Vec<Group> = SCALES
            .into_iter()
            .flat_map(Group::all)
            .filter(|g| s.kind_runs(UpdateBy::Thread, g))
            .collect();
        assert_eq!(threaded.len(), 2);
        assert!(
            threaded
                .iter()
                .all(|g| g.scale == 18 && g.batch == BATCHES[0])
        );
        assert!(Group::all(22).all(|g| s.kind_runs(UpdateBy::Warp, &g)));
        assert!(Group::all(22).all(|g| sweep(true).kind_runs(UpdateBy::Thread, &g)));
        s.cut
            .push(("cuda-malloc/warp".into(), 19, 100_000, "here".into()));
        let cut = |scale, batch| {
            let g = Group {
                scale,
                batch,
                expansion_only: false,
                rounds: ROUNDS,
            };
            s.cut_off("cuda-malloc/warp", &g).is_some()
        };
        assert!(cut(19, 100_000) && cut(22, 1_000_000));
        assert!(!cut(18, 1_000_000) && !cut(22, 10_000));
        assert!(
            s.cut_off("ours/warp", &Group::all(22).last().unwrap())
                .is_none()
        );
    }

    /// A load is cut off where its prediction from the last smaller scale
    /// and the groups' share would end past the budget, as scale 22 of
    /// CUDA's malloc on the H100 (45 s at scale 21, 311 s gone, scale 21's
    /// groups 44 s); never without an earlier load to go by.
    #[test]
    fn loads_that_would_end_past_the_budget_are_cut_off() {
        let mut s = sweep(false);
        assert!(s.load_cut("cuda-malloc/warp", 22, 311.0).is_none());
        s.loads.push(("cuda-malloc/warp".into(), 20, 17.5));
        s.loads.push(("cuda-malloc/warp".into(), 21, 45.0));
        s.loads.push(("ours/warp".into(), 21, 0.9));
        s.loads.push(("page-pool/warp".into(), 21, 3.5));
        s.groups_s = Some(44.0);
        let why = s.load_cut("cuda-malloc/warp", 22, 311.0).expect("cut off");
        assert!(
            why.starts_with("cut off: load would take ~180 s (45.0 s at scale 21"),
            "{why}"
        );
        assert!(s.load_cut("ours/warp", 22, 311.0).is_none());
        assert!(s.load_cut("page-pool/warp", 22, 311.0).is_none());
        // Scale 21 of the same run: 17.5 s at scale 20, 166 s gone.
        s.groups_s = Some(34.0);
        assert!(s.load_cut("cuda-malloc/warp", 21, 166.0).is_none());
        // Two scales up: ×16; a larger budget lets it run.
        assert!(s.load_cut("cuda-malloc/warp", 22, 0.0).is_none());
        assert!(s.load_cut("cuda-malloc/warp", 23, 0.0).is_some());
        s.budget_s = 1000.0;
        assert!(s.load_cut("cuda-malloc/warp", 22, 311.0).is_none());
    }
}
