//! The dynamic graph (issue 5) on a real GPU. The tests are `#[ignore]`d;
//! run with `--include-ignored` on a machine without a GPU each fails,
//! saying so.
//!
//! Workload (fixed seeds): an R-MAT graph of scale 16, edge factor 16
//! (1 Mi edges, Graph500 probabilities). Half of it is loaded first; then
//! 100 rounds each insert the next slice of the R-MAT stream plus re-inserts
//! of loaded edges (duplicates), and delete 5,000 edges picked from
//! everything inserted so far (some already gone) plus edges never inserted.
//! After every insert and every delete the GPU adjacency must equal the host
//! reference and no page request may have failed. Expansion only: the whole
//! stream inserted in 100 batches, checked every 10. Sources: our heap, the
//! page pool and (its own test) CUDA's device malloc; each with one thread
//! per vertex and with one warp per vertex (issue 18). At the end every page
//! goes back: the heap is whole, the pool full.

use gpumalloc::{DeviceHeap, Gpu, HeapConfig};
use graph::batch::GroupedBatch;
use graph::device::{DeviceBatch, DeviceGraph, DevicePool, Pages, UpdateBy};
use graph::reference::Reference;
use graph::rmat::{Rmat, SplitMix64};

mod common;
use common::gpu;

const SCALE: u32 = 16;
const EDGE_FACTOR: u32 = 16;
const SEED: u64 = 2024;
const ROUNDS: usize = 100;
const DELETES_PER_ROUND: usize = 5_000;
const DUPLICATES_PER_ROUND: usize = 1_000;
const ABSENT_PER_ROUND: usize = 100;
/// Pages for the pool: the graph never holds more than the stream's edges,
/// and each vertex wastes at most one partly filled page.
const POOL_PAGES: u64 = 1 << 18;
const HEAP_BYTES: u64 = 1 << 30;
const CUDA_HEAP_BYTES: u64 = 1 << 30;

/// One graph on the GPU with its page source and host reference.
struct Run<'a> {
    gpu: &'a Gpu,
    pages: Pages<'a>,
    by: UpdateBy,
    graph: DeviceGraph,
    reference: Reference,
}

impl Run<'_> {
    /// Applies one batch on the GPU and in the reference, then (if `check`)
    /// compares; returns the kernel's milliseconds.
    fn step(&mut self, edges: &[(u32, u32)], insert: bool, check: bool, what: &str) -> f64 {
        let (gpu, graph, pages, by) = (self.gpu, &self.graph, self.pages, self.by);
        let batch = DeviceBatch::new(gpu, &GroupedBatch::new(edges)).unwrap();
        let ms = gpu
            .time(|| {
                if insert {
                    graph.insert_by(pages, by, &batch)
                } else {
                    graph.delete_by(pages, by, &batch)
                }
            })
            .unwrap();
        if insert {
            self.reference.insert(edges).unwrap();
        } else {
            self.reference.delete(edges).unwrap();
        }
        if check {
            assert_eq!(
                graph.errors().unwrap(),
                (0, 0),
                "{what}: (pages missing, ids out of range)"
            );
            if let Some(d) = self.reference.first_difference(&graph.adjacency().unwrap()) {
                panic!("{} pages by {}, {what}: {d}", pages.name(), by.name());
            }
        }
        ms
    }
}

/// The update rounds (or expansion only) with `pages`; returns the mean
/// milliseconds of one round's kernels.
fn rounds(gpu: &Gpu, pages: Pages, by: UpdateBy, expansion_only: bool) -> f64 {
    let stream = Rmat::new(SCALE, EDGE_FACTOR, SEED).generate().unwrap();
    let mut run = Run {
        gpu,
        pages,
        by,
        graph: DeviceGraph::new(gpu, stream.vertices as u64).unwrap(),
        reference: Reference::new(stream.vertices),
    };
    let mut picker = SplitMix64(SEED);
    let (loaded, per_round) = if expansion_only {
        (0, stream.edges.len() / ROUNDS)
    } else {
        (stream.edges.len() / 2, stream.edges.len() / 2 / ROUNDS)
    };
    let mut total_ms = 0.0;
    if loaded > 0 {
        let initial = &stream.edges[..loaded];
        run.step(initial, true, true, "initial load");
    }
    for r in 0..ROUNDS {
        let at = loaded + r * per_round;
        let mut inserts = stream.edges[at..at + per_round].to_vec();
        let check = !expansion_only || (r + 1) % 10 == 0;
        if !expansion_only {
            inserts.extend(
                (0..DUPLICATES_PER_ROUND).map(|_| stream.edges[picker.below(at as u64) as usize]),
            );
        }
        let what = format!("round {r} insert");
        total_ms += run.step(&inserts, true, check, &what);
        if expansion_only {
            continue;
        }
        let end = at + per_round;
        let mut deletes: Vec<(u32, u32)> = (0..DELETES_PER_ROUND)
            .map(|_| stream.edges[picker.below(end as u64) as usize])
            .collect();
        // Edges R-MAT almost never makes: between the two sparsest corners.
        let last = stream.vertices - 1;
        deletes.extend((0..ABSENT_PER_ROUND as u32).map(|i| (last - i, last - 2 * i)));
        let what = format!("round {r} delete");
        total_ms += run.step(&deletes, false, true, &what);
    }
    println!(
        "{} pages by {}, {}: {} edges at the end, {:.3} ms per round",
        pages.name(),
        by.name(),
        if expansion_only {
            "expansion only"
        } else {
            "insert/delete"
        },
        run.reference.edge_count(),
        total_ms / ROUNDS as f64
    );
    run.graph.clear(pages).unwrap();
    gpu.sync().unwrap();
    total_ms / ROUNDS as f64
}

fn assert_heap_whole(heap: &DeviceHeap, what: &str) {
    heap.flush().unwrap();
    let s = heap.stats().unwrap();
    assert_eq!(s.live_bytes, 0, "{what}: {s:?}");
    assert_eq!(s.free_segments, s.segments, "{what}: {s:?}");
    assert_eq!(s.invalid_frees + s.double_frees, 0, "{what}: {s:?}");
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn graph_updates_on_our_heap() {
    let gpu = gpu();
    let config = HeapConfig::checked(HEAP_BYTES);
    let heap = DeviceHeap::new(&gpu, config).unwrap();
    for by in [UpdateBy::Thread, UpdateBy::Warp] {
        for expansion_only in [false, true] {
            rounds(&gpu, Pages::Heap(&heap), by, expansion_only);
            assert_heap_whole(&heap, &format!("{by:?}, expansion only: {expansion_only}"));
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn graph_updates_on_the_page_pool() {
    let gpu = gpu();
    let pool = DevicePool::new(&gpu, POOL_PAGES).unwrap();
    for by in [UpdateBy::Thread, UpdateBy::Warp] {
        for expansion_only in [false, true] {
            rounds(&gpu, Pages::Pool(&pool), by, expansion_only);
            assert_eq!(
                pool.free_pages().unwrap(),
                POOL_PAGES,
                "every page back in the pool"
            );
        }
    }
}

#[test]
#[ignore = "needs an NVIDIA GPU: run with --include-ignored on a GPU machine (scripts/gpu-suite.sh)"]
fn graph_updates_on_cuda_malloc() {
    let gpu = gpu();
    // The limit can only be set before the first kernel that uses CUDA's
    // malloc; no other test of this binary uses it.
    if let Err(e) = gpu.set_malloc_heap_size(CUDA_HEAP_BYTES) {
        println!("skipped: CUDA malloc heap limit could not be set ({e})");
        return;
    }
    for by in [UpdateBy::Thread, UpdateBy::Warp] {
        rounds(&gpu, Pages::Cuda, by, false);
    }
}
