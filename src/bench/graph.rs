//! The `graph` test: dynamic-graph updates (faimGraph style, issue 5) with
//! the page sources compared in one run: our heap (`ours`), CUDA's device
//! malloc (`cuda-malloc`, if chosen) and a pre-allocated page pool
//! (`page-pool`, always). Single-threaded host code; one graph at a time.
//!
//! For each R-MAT scale and batch size: load half of the R-MAT stream, then
//! [`ROUNDS`] rounds, timed with CUDA events around the kernels only (batches
//! are uploaded before): insert/delete rounds insert the next `batch` edges
//! of the stream and delete `batch` edges picked from it; expansion rounds
//! only insert. The metric is the mean milliseconds per round (`mean_round_ms`, in the record's median field;
//! median, min and max over rounds are in the record too). A round with a
//! page request that failed or an id out of range marks the record invalid.
//! The host reference is checked by `tests/graph_gpu.rs`, not here.
//!
//! Cost note: one thread owns a vertex for a whole batch and scans its chain
//! per edge, so a hub's share of a batch costs O(degree x share): this is
//! why the default scales stop at 18.

use gpu_kernel::graph::page::EDGES_PER_PAGE;
use host::graph::batch::GroupedBatch;
use host::graph::device::{DeviceBatch, DeviceGraph, DevicePool, Pages};
use host::graph::rmat::{Rmat, SplitMix64};
use host::{DeviceHeap, Gpu, HeapConfig, Result};

use super::measure::Summary;
use super::report::Record;
use super::suite::Options;

/// Timed rounds per configuration.
pub const ROUNDS: usize = 100;
/// R-MAT scales measured.
pub const SCALES: [u32; 1] = [18];
/// Edges per vertex of the R-MAT stream.
pub const EDGE_FACTOR: u32 = 16;
/// Update batch sizes.
pub const BATCHES: [usize; 2] = [10_000, 100_000];
/// Bytes of our heap for the graph (pages are 128 bytes).
const HEAP_BYTES: u64 = 4 << 30;

/// One configuration's rounds; returns per-round milliseconds and whether
/// no kernel counted an error.
fn rounds(
    gpu: &Gpu,
    pages: Pages,
    stream: &[(u32, u32)],
    vertices: u32,
    batch: usize,
    expansion_only: bool,
    seed: u64,
) -> Result<(Vec<f64>, bool)> {
    let graph = DeviceGraph::new(gpu, vertices as u64)?;
    let loaded = stream.len() / 2;
    graph.insert(
        pages,
        &DeviceBatch::new(gpu, &GroupedBatch::new(&stream[..loaded]))?,
    )?;
    let mut picker = SplitMix64(seed);
    let mut at = loaded;
    let mut samples = Vec::with_capacity(ROUNDS);
    for _ in 0..ROUNDS {
        let inserts: Vec<(u32, u32)> = (0..batch)
            .map(|i| stream[(at + i) % stream.len()])
            .collect();
        at = (at + batch) % stream.len();
        let inserts = DeviceBatch::new(gpu, &GroupedBatch::new(&inserts))?;
        let deletes = if expansion_only {
            None
        } else {
            let d: Vec<(u32, u32)> = (0..batch)
                .map(|_| stream[picker.below(stream.len() as u64) as usize])
                .collect();
            Some(DeviceBatch::new(gpu, &GroupedBatch::new(&d))?)
        };
        gpu.sync()?;
        samples.push(gpu.time(|| {
            graph.insert(pages, &inserts)?;
            match &deletes {
                Some(d) => graph.delete(pages, d),
                None => Ok(()),
            }
        })?);
    }
    let ok = graph.errors()? == (0, 0);
    graph.clear(pages)?;
    gpu.sync()?;
    Ok((samples, ok))
}

/// Runs the test for `opts.allocators` (`ours`, `cuda-malloc`) and the page
/// pool. With `cuda-malloc` it sets CUDA's malloc heap to `opts.heap`, which
/// must come before any kernel of the process uses that malloc.
pub fn run(gpu: &Gpu, opts: &Options) -> Result<Vec<Record>> {
    if opts.allocators.iter().any(|a| a == "cuda-malloc") {
        gpu.set_malloc_heap_size(opts.heap)?;
    }
    let heap = DeviceHeap::new(gpu, HeapConfig::unchecked(HEAP_BYTES))?;
    let mut records = Vec::new();
    for scale in SCALES {
        let rmat = Rmat::new(scale, EDGE_FACTOR, opts.seed);
        let stream = rmat.generate().map_err(host::Error::Check)?;
        // A chain of d edges holds ceil(d / EDGES_PER_PAGE) pages, and no
        // vertex has more edges than the stream.
        let capacity = stream.edges.len().div_ceil(EDGES_PER_PAGE) as u64 + stream.vertices as u64;
        let pool = DevicePool::new(gpu, capacity.min(u32::MAX as u64 - 1))?;
        let mut sources: Vec<(&str, Pages)> = vec![("page-pool", Pages::Pool(&pool))];
        if opts.allocators.iter().any(|a| a == "ours") {
            sources.push(("ours", Pages::Heap(&heap)));
        }
        if opts.allocators.iter().any(|a| a == "cuda-malloc") {
            sources.push(("cuda-malloc", Pages::Cuda));
        }
        for batch in BATCHES {
            for expansion_only in [false, true] {
                let mode = if expansion_only { "expand" } else { "update" };
                for &(name, pages) in &sources {
                    eprintln!("graph: scale {scale}, batch {batch}, {mode}, {name}");
                    let (samples, ok) = rounds(
                        gpu,
                        pages,
                        &stream.edges,
                        stream.vertices,
                        batch,
                        expansion_only,
                        opts.seed,
                    )?;
                    let mean = samples.iter().sum::<f64>() / samples.len() as f64;
                    let mut summary = Summary::of(&samples);
                    let median = summary.median;
                    summary.median = mean;
                    records.push(Record::new(
                        "graph",
                        name,
                        batch as u64,
                        &format!("scale{scale}-{mode}-{batch}"),
                        batch as u64,
                        "mean_round_ms",
                        summary,
                        ok,
                        format!(
                            "mean of {ROUNDS} rounds (median {median:.3} ms); R-MAT scale {scale}, edge factor {EDGE_FACTOR}; {}",
                            if ok { "no failed page request" } else { "page requests failed or ids out of range" }
                        ),
                    ));
                }
            }
        }
    }
    Ok(records)
}
