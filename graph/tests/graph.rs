//! CPU tests of the dynamic-graph workload (issue 5): the `.mtx` reader
//! (valid, malformed, symmetric, general), the R-MAT generator (determinism,
//! degree skew), the reference model, batch grouping, and the device graph
//! logic itself (`gpu_kernels::graph`) run by host threads over a `CpuHeap` and
//! over a host-memory page pool, checked against the reference after every
//! round. Fixed seeds throughout.
//!
//! The warp-per-vertex updates (`gpu_kernels::graph::warp`, issue 18) run the
//! same rounds on host warps (`arch::ThreadWarp`: one std thread per lane,
//! several warps at once, each warp owning every `warps`-th batch entry),
//! plus a hub vertex whose chunks need two fresh pages and whose deletions
//! span several pages, repeats inside a chunk, an exhausted pool, and the
//! thread and warp paths taking turns on one graph.

use std::io::Cursor;

use gpu_kernel::arch::{self, ThreadWarp, Word};
use gpu_kernels::graph::adjacency::{ERROR_WORDS, Graph, GraphError};
use gpu_kernels::graph::page::{EDGES_PER_PAGE, PAGE_BYTES};
use gpu_kernels::graph::pool::PagePool;
use gpu_kernels::graph::source::PageSource;
use graph::batch::GroupedBatch;
use graph::edge_set::EdgeSet;
use graph::mtx::{self, MtxError};
use graph::reference::Reference;
use graph::rmat::{CHUNK_EDGES, Rmat, SplitMix64};
use host::{CpuHeap, HeapConfig};

fn read(text: &str) -> Result<graph::EdgeList, MtxError> {
    mtx::read(Cursor::new(text))
}

#[test]
fn mtx_general_pattern_and_comments() {
    let g = read(
        "%%MatrixMarket matrix coordinate pattern general\n% a comment\n\n3 3 3\n1 2\n2 3\n% late\n3 1\n",
    )
    .unwrap();
    assert_eq!(g.vertices, 3);
    assert_eq!(g.edges, vec![(0, 1), (1, 2), (2, 0)]);
}

#[test]
fn mtx_symmetric_real_gives_both_directions() {
    let g =
        read("%%MatrixMarket matrix coordinate real symmetric\n3 3 3\n2 1 0.5\n3 3 1e3\n3 1 -2\n")
            .unwrap();
    assert_eq!(g.edges, vec![(1, 0), (0, 1), (2, 2), (2, 0), (0, 2)]);
}

#[test]
fn mtx_integer_general_rectangular() {
    let g =
        read("%%MatrixMarket matrix coordinate integer general\n2 4 2\n1 4 7\n2 1 -3\n").unwrap();
    assert_eq!((g.vertices, g.edges), (4, vec![(0, 3), (1, 0)]));
}

fn line_of(e: MtxError) -> usize {
    match e {
        MtxError::Malformed { line, .. } | MtxError::OutOfRange { line, .. } => line,
        other => panic!("expected a line number, got {other}"),
    }
}

#[test]
fn mtx_malformed_files_name_the_line() {
    let cases = [
        ("", 1),
        ("%%MatrixMarket matrix array real general\n2 2\n", 1),
        ("%%MatrixMarket matrix coordinate complex general\n", 1),
        ("%%MatrixMarket matrix coordinate pattern hermitian\n", 1),
        ("%%MatrixMarket matrix coordinate pattern general\n", 1),
        ("%%MatrixMarket matrix coordinate pattern general\n2 2\n", 2),
        (
            "%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 x\n",
            3,
        ),
        (
            "%%MatrixMarket matrix coordinate real general\n2 2 1\n1 2\n",
            3,
        ),
        (
            "%%MatrixMarket matrix coordinate integer general\n2 2 1\n1 2 1.5\n",
            3,
        ),
        (
            "%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 2\n2 1\n",
            4,
        ),
        (
            "%%MatrixMarket matrix coordinate pattern general\n2 2 3\n1 2\n2 1\n",
            4,
        ),
        (
            "%%MatrixMarket matrix coordinate pattern symmetric\n2 3 1\n1 2\n",
            2,
        ),
        (
            "%%MatrixMarket matrix coordinate pattern general\n2 2 1\n3 1\n",
            3,
        ),
        (
            "%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 0\n",
            3,
        ),
    ];
    for (text, line) in cases {
        let e = read(text).expect_err(text);
        let message = e.to_string();
        assert_eq!(line_of(e), line, "{text:?}: {message}");
        assert!(message.contains(&format!("line {line}")), "{message}");
    }
}

#[test]
fn mtx_out_of_range_and_empty() {
    let e = read("%%MatrixMarket matrix coordinate pattern general\n2 2 1\n1 9\n").unwrap_err();
    assert!(
        matches!(
            e,
            MtxError::OutOfRange {
                line: 3,
                vertex: 9,
                vertices: 2
            }
        ),
        "{e}"
    );
    for text in [
        "%%MatrixMarket matrix coordinate pattern general\n0 0 0\n",
        "%%MatrixMarket matrix coordinate pattern general\n5 5 0\n",
    ] {
        assert!(matches!(read(text), Err(MtxError::Empty)), "{text}");
    }
    assert!(matches!(
        mtx::read_file(std::path::Path::new("/nonexistent/graph.mtx")),
        Err(MtxError::Io(_))
    ));
}

#[test]
fn rmat_is_deterministic_and_skewed() {
    let a = Rmat::new(14, 16, 7).generate().unwrap();
    let b = Rmat::new(14, 16, 7).generate().unwrap();
    let c = Rmat::new(14, 16, 8).generate().unwrap();
    assert_eq!(a, b);
    assert_ne!(a.edges, c.edges);
    assert_eq!(a.vertices, 1 << 14);
    assert_eq!(a.edges.len(), 16 << 14);
    assert!(
        a.edges
            .iter()
            .all(|&(s, t)| s < a.vertices && t < a.vertices)
    );
    let mut degree = vec![0u64; a.vertices as usize];
    for &(s, _) in &a.edges {
        degree[s as usize] += 1;
    }
    let mean = a.edges.len() as f64 / a.vertices as f64;
    let max = *degree.iter().max().unwrap() as f64;
    assert!(max > 20.0 * mean, "max degree {max}, mean {mean}");
    assert!(Rmat::new(0, 16, 1).generate().is_err());
    assert!(Rmat::new(10, 0, 1).generate().is_err());
    let mut bad = Rmat::new(10, 4, 1);
    bad.a = 0.9;
    assert!(bad.generate().is_err());
}

#[test]
fn reference_model_inserts_and_deletes_sets() {
    let mut r = Reference::new(4);
    assert_eq!(r.insert(&[(0, 1), (0, 1), (0, 2), (3, 3)]).unwrap(), 3);
    assert_eq!(r.insert(&[(0, 2), (1, 0)]).unwrap(), 1);
    assert_eq!(r.edges(0).collect::<Vec<_>>(), vec![1, 2]);
    assert_eq!(r.edge_count(), 4);
    assert_eq!(r.delete(&[(0, 1), (0, 1), (2, 0)]).unwrap(), 1);
    assert_eq!((r.degree(0), r.edge_count()), (1, 3));
    assert!(r.insert(&[(0, 4)]).is_err());
    assert!(r.delete(&[(7, 0)]).is_err());
    assert_eq!(r.edge_count(), 3, "a rejected batch changes nothing");
    let same = vec![vec![2], vec![0], vec![], vec![3]];
    assert_eq!(r.first_difference(&same), None);
    let other = vec![vec![2], vec![], vec![], vec![3]];
    assert!(r.first_difference(&other).unwrap().starts_with("vertex 1"));
}

#[test]
fn chunked_rmat_depends_on_seed_and_count_only() {
    let count = CHUNK_EDGES as u64 + 1000;
    let one = Rmat::new(10, 16, 7).generate_chunked(count, 1).unwrap();
    let three = Rmat::new(10, 16, 7).generate_chunked(count, 3).unwrap();
    assert_eq!(one, three);
    assert_eq!(one.edges.len() as u64, count);
    assert_eq!(one.vertices, 1 << 10);
    assert!(one.edges.iter().all(|&(s, t)| s < 1 << 10 && t < 1 << 10));
    // The second chunk is not the first again.
    assert_ne!(one.edges[..1000], one.edges[CHUNK_EDGES..]);
    let other = Rmat::new(10, 16, 8).generate_chunked(count, 2).unwrap();
    assert_ne!(one.edges, other.edges);
    let mut degree = vec![0u64; 1 << 10];
    for &(s, _) in &one.edges {
        degree[s as usize] += 1;
    }
    let mean = count as f64 / (1 << 10) as f64;
    assert!(*degree.iter().max().unwrap() as f64 > 10.0 * mean);
    assert!(Rmat::new(0, 16, 1).generate_chunked(10, 2).is_err());
}

/// A graph as the device exports it: degrees, then the edges vertex after
/// vertex.
fn export_of(r: &Reference) -> (Vec<u64>, Vec<u64>) {
    let degrees = (0..r.vertices()).map(|v| r.degree(v) as u64).collect();
    let edges = (0..r.vertices())
        .flat_map(|v| r.edges(v).map(u64::from))
        .collect();
    (degrees, edges)
}

/// The edge set agrees with the B-tree reference through R-MAT inserts and
/// deletes (count, degrees, fingerprint), and its check of an export fails,
/// naming the vertex, for a missing, foreign or repeated edge.
#[test]
fn edge_set_follows_the_reference_and_its_check_fails() {
    let g = Rmat::new(10, 16, 3).generate().unwrap();
    let mut reference = Reference::new(g.vertices);
    let mut set = EdgeSet::new(g.vertices);
    let mut picker = SplitMix64(9);
    for chunk in g.edges.chunks(g.edges.len() / 4) {
        assert_eq!(set.insert(chunk), reference.insert(chunk));
        let doomed: Vec<(u32, u32)> = (0..chunk.len() / 2)
            .map(|_| g.edges[picker.below(g.edges.len() as u64) as usize])
            .collect();
        assert_eq!(set.delete(&doomed), reference.delete(&doomed));
        assert_eq!(set.edge_count(), reference.edge_count());
        assert_eq!(set.fingerprint(), reference.fingerprint());
        assert!((0..g.vertices).all(|v| set.degree(v) as usize == reference.degree(v)));
    }
    assert!(set.insert(&[(0, g.vertices)]).is_err());
    assert!(set.delete(&[(g.vertices, 0)]).is_err());
    assert_eq!(
        set.edge_count(),
        reference.edge_count(),
        "a rejected batch changes nothing"
    );

    let (degrees, edges) = export_of(&reference);
    assert_eq!(set.difference(&degrees, &edges), None);
    let mut reversed = edges.clone();
    let v = (0..g.vertices).find(|&v| reference.degree(v) > 1).unwrap();
    let start: u64 = degrees[..v as usize].iter().sum();
    reversed[start as usize..(start + degrees[v as usize]) as usize].reverse();
    assert_eq!(
        set.difference(&degrees, &reversed),
        None,
        "order within a vertex is free"
    );

    let absent = (0..g.vertices).find(|&t| !set.contains(v, t)).unwrap();
    let first = reference.edges(v).next().unwrap() as u64;
    let second = reference.edges(v).nth(1).unwrap() as u64;
    let at = edges
        .iter()
        .skip(start as usize)
        .position(|&t| t == first)
        .unwrap()
        + start as usize;
    let blame = format!("vertex {v}:");
    for (what, wrong) in [("foreign", absent as u64), ("repeated", second)] {
        let mut bad = edges.clone();
        bad[at] = wrong;
        let d = set.difference(&degrees, &bad).expect(what);
        assert!(d.starts_with(&blame), "{what}: {d}");
    }
    let mut missing = (degrees.clone(), edges.clone());
    missing.0[v as usize] -= 1;
    missing.1.remove(at);
    let d = set.difference(&missing.0, &missing.1).unwrap();
    assert!(d.starts_with(&blame), "{d}");
    assert!(set.difference(&degrees, &edges[1..]).is_some());
    assert!(set.difference(&degrees[1..], &edges).is_some());
}

#[test]
fn batches_group_by_source() {
    let b = GroupedBatch::new(&[(3, 1), (0, 2), (3, 0), (0, 2)]);
    assert_eq!(b.sources, vec![0, 3]);
    assert_eq!(b.offsets, vec![0, 2, 4]);
    assert_eq!(b.entry(1), (3, &[1u64, 0][..]));
    assert!(GroupedBatch::new(&[]).is_empty());
}

/// A page pool in host memory.
struct HostPool {
    _pages: Vec<u64>,
    words: Vec<Word>,
    pool: PagePool,
}

impl HostPool {
    fn new(capacity: u64) -> HostPool {
        let pages = vec![0u64; (PagePool::page_bytes(capacity) / 8) as usize];
        let mut image = vec![0u64; PagePool::words(capacity) as usize];
        PagePool::write_initial_words(capacity, &mut image);
        let words: Vec<Word> = image.into_iter().map(Word::new).collect();
        let pool = PagePool {
            pages: pages.as_ptr() as u64,
            words: words.as_ptr() as u64,
            capacity,
        };
        HostPool {
            _pages: pages,
            words,
            pool,
        }
    }

    fn free_pages(&self) -> u64 {
        let words: Vec<u64> = self
            .words
            .iter()
            .map(gpu_kernel::arch::load_relaxed)
            .collect();
        PagePool::free_pages(&words)
    }
}

/// The device graph in host memory.
struct HostGraph {
    heads: Vec<Word>,
    errors: Vec<Word>,
}

const THREADS: usize = 4;

/// Who applies a batch.
#[derive(Clone, Copy, Debug)]
enum Apply {
    /// `THREADS` threads, one per entry (`Graph::insert`).
    Threads,
    /// `warps` host warps of `lanes` lanes, one warp per entry
    /// (`Graph::insert_warp`).
    Warps { warps: usize, lanes: u32 },
}

impl HostGraph {
    fn new(vertices: u32) -> HostGraph {
        HostGraph {
            heads: (0..vertices).map(|_| Word::new(0)).collect(),
            errors: (0..ERROR_WORDS).map(|_| Word::new(0)).collect(),
        }
    }

    fn graph(&self) -> Graph {
        Graph {
            heads: self.heads.as_ptr() as u64,
            vertices: self.heads.len() as u64,
            errors: self.errors.as_ptr() as u64,
        }
    }

    /// Applies `batch` with `THREADS` host threads, entry `i` on thread
    /// `i % THREADS` (each source once, as on the GPU).
    fn apply<S: PageSource + Sync>(&self, source: &S, batch: &GroupedBatch, insert: bool) {
        let graph = self.graph();
        std::thread::scope(|s| {
            for t in 0..THREADS {
                s.spawn(move || {
                    for i in (t..batch.len() as usize).step_by(THREADS) {
                        let (v, targets) = batch.entry(i);
                        if insert {
                            graph.insert(source, v, targets);
                        } else {
                            graph.delete(source, v, targets);
                        }
                    }
                });
            }
        });
    }

    /// Applies `batch` with `warps` host warps of `lanes` threads, entry `i`
    /// on warp `i % warps` (each source once, as on the GPU).
    fn apply_warps<S: PageSource + Sync>(
        &self,
        source: &S,
        batch: &GroupedBatch,
        insert: bool,
        warps: usize,
        lanes: u32,
    ) {
        let graph = self.graph();
        std::thread::scope(|s| {
            for w in 0..warps {
                let warp = ThreadWarp::new(lanes);
                for lane in 0..lanes {
                    let warp = warp.clone();
                    s.spawn(move || {
                        let mask = warp.mask();
                        arch::join_thread_warp(warp, lane);
                        // Lanes of other warps run inside the page
                        // source's protocols, as on a GPU.
                        arch::preempt_every(3);
                        for i in (w..batch.len() as usize).step_by(warps) {
                            let (v, targets) = batch.entry(i);
                            if insert {
                                graph.insert_warp(source, mask, v, targets);
                            } else {
                                graph.delete_warp(source, mask, v, targets);
                            }
                        }
                        arch::preempt_every(0);
                        arch::leave_thread_warp();
                    });
                }
            }
        });
    }

    fn apply_by<S: PageSource + Sync>(
        &self,
        how: Apply,
        source: &S,
        batch: &GroupedBatch,
        insert: bool,
    ) {
        match how {
            Apply::Threads => self.apply(source, batch, insert),
            Apply::Warps { warps, lanes } => self.apply_warps(source, batch, insert, warps, lanes),
        }
    }

    fn adjacency(&self) -> Vec<Vec<u32>> {
        let graph = self.graph();
        (0..graph.vertices)
            .map(|v| {
                let mut out = vec![0u64; graph.degree(v) as usize];
                // SAFETY: `out` holds degree(v) words.
                unsafe { graph.export(v, out.as_mut_ptr()) };
                out.into_iter().map(|e| e as u32).collect()
            })
            .collect()
    }

    fn clear<S: PageSource>(&self, source: &S) {
        let graph = self.graph();
        for v in 0..graph.vertices {
            graph.clear(source, v);
        }
    }

    fn error(&self, e: GraphError) -> u64 {
        gpu_kernel::arch::load_relaxed(&self.errors[e as usize])
    }
}

/// Rounds of insert (fresh R-MAT edges, with duplicates) and delete (a third
/// of the live edges plus absent ones), checked after every batch.
fn rounds<S: PageSource + Sync>(
    source: &S,
    how: Apply,
    scale: u32,
    rounds: usize,
    delete: bool,
) -> HostGraph {
    let g = Rmat::new(scale, 16, 3).generate().unwrap();
    let mut reference = Reference::new(g.vertices);
    let graph = HostGraph::new(g.vertices);
    let per_round = g.edges.len() / rounds;
    let mut picker = SplitMix64(5);
    for (r, chunk) in g.edges.chunks(per_round).take(rounds).enumerate() {
        reference.insert(chunk).unwrap();
        graph.apply_by(how, source, &GroupedBatch::new(chunk), true);
        if let Some(d) = reference.first_difference(&graph.adjacency()) {
            panic!("{how:?} round {r} insert: {d}");
        }
        if delete {
            let live: Vec<(u32, u32)> = (0..g.vertices)
                .flat_map(|v| reference.edges(v).map(move |t| (v, t)))
                .collect();
            let mut doomed: Vec<(u32, u32)> = (0..live.len() / 3)
                .map(|_| live[picker.below(live.len() as u64) as usize])
                .collect();
            doomed.extend((0..16).map(|i| (i, g.vertices - 1 - i)));
            reference.delete(&doomed).unwrap();
            graph.apply_by(how, source, &GroupedBatch::new(&doomed), false);
            if let Some(d) = reference.first_difference(&graph.adjacency()) {
                panic!("{how:?} round {r} delete: {d}");
            }
        }
    }
    assert_eq!(graph.error(GraphError::PageExhausted), 0);
    assert_eq!(graph.error(GraphError::OutOfRange), 0);
    graph
}

fn cpu_heap() -> CpuHeap {
    CpuHeap::new(HeapConfig {
        trap_on_misuse: true,
        ..HeapConfig::checked(64 << 20)
    })
    .unwrap()
}

/// Rounds with and without deletion on a fresh CPU heap, updated `how`;
/// after clearing, the heap is whole.
fn rounds_on_the_cpu_heap_leave_it_whole(how: Apply) {
    let heap = cpu_heap();
    for delete in [true, false] {
        let graph = rounds(heap.heap(), how, 10, 20, delete);
        graph.clear(heap.heap());
        heap.flush();
        let s = heap.stats();
        assert_eq!(s.live_bytes, 0, "{s:?}");
        assert_eq!(s.free_segments, s.segments, "{s:?}");
    }
}

#[test]
fn graph_on_the_cpu_heap_matches_the_reference() {
    rounds_on_the_cpu_heap_leave_it_whole(Apply::Threads);
}

#[test]
fn graph_on_the_page_pool_matches_the_reference() {
    let capacity = 1 << 16;
    let pool = HostPool::new(capacity);
    assert_eq!(pool.free_pages(), capacity);
    for delete in [true, false] {
        let graph = rounds(&pool.pool, Apply::Threads, 10, 20, delete);
        assert!(pool.free_pages() < capacity);
        graph.clear(&pool.pool);
        assert_eq!(pool.free_pages(), capacity, "every page back in the pool");
    }
}

#[test]
fn exhausted_pool_and_bad_ids_are_counted() {
    let pool = HostPool::new(2);
    let graph = HostGraph::new(4);
    let edges: Vec<(u32, u32)> = (0..(3 * EDGES_PER_PAGE) as u32)
        .map(|t| (0, t % 4))
        .collect();
    graph.apply(&pool.pool, &GroupedBatch::new(&edges), true);
    assert_eq!(graph.adjacency()[0].len(), 4, "duplicates ignored");
    let many: Vec<(u32, u32)> = (0..3).map(|s| (s, 1)).collect();
    graph.apply(&pool.pool, &GroupedBatch::new(&many), true);
    assert_eq!(
        graph.error(GraphError::PageExhausted),
        1,
        "third vertex gets no page"
    );
    graph.apply(&pool.pool, &GroupedBatch::new(&[(9, 0), (1, 9)]), true);
    assert_eq!(graph.error(GraphError::OutOfRange), 2);
    assert_eq!(pool.free_pages(), 0);
    graph.clear(&pool.pool);
    assert_eq!(pool.free_pages(), 2);
    assert_eq!(PAGE_BYTES, 128);
}

/// Several host warps at once (3 of 4 lanes: 12 threads on the test
/// machine's cores, so lanes get preempted inside the protocol).
const WARPS: Apply = Apply::Warps { warps: 3, lanes: 4 };

#[test]
fn warp_graph_on_the_cpu_heap_matches_the_reference() {
    rounds_on_the_cpu_heap_leave_it_whole(WARPS);
}

#[test]
fn warp_graph_on_the_page_pool_matches_the_reference() {
    let capacity = 1 << 16;
    let pool = HostPool::new(capacity);
    let how = Apply::Warps { warps: 2, lanes: 8 };
    for delete in [true, false] {
        let graph = rounds(&pool.pool, how, 10, 20, delete);
        assert!(pool.free_pages() < capacity);
        graph.clear(&pool.pool);
        assert_eq!(pool.free_pages(), capacity, "every page back in the pool");
    }
}

/// One hub vertex and a few small ones, with full 32-lane warps: insert
/// chunks that need two fresh pages, repeats inside a chunk and against the
/// graph, deletion chunks whose holes and fills span several pages (the
/// chain's tail region, where holes fill each other, and its middle),
/// and the thread path taking turns with the warp path on the same graph.
#[test]
fn warp_hub_expands_and_shrinks_across_pages() {
    let heap = cpu_heap();
    let vertices = 4096u32;
    let graph = HostGraph::new(vertices);
    let mut reference = Reference::new(vertices);
    let mut picker = SplitMix64(11);
    let full = Apply::Warps {
        warps: 2,
        lanes: 32,
    };
    for round in 0..12 {
        // The hub gets 3 chunks' worth, a third of them repeats.
        let mut edges: Vec<(u32, u32)> = (0..96)
            .map(|i| {
                let t = if i % 3 == 0 {
                    (picker.below(64)) as u32
                } else {
                    picker.below(vertices as u64) as u32
                };
                (0, t)
            })
            .collect();
        edges.extend((1..8).map(|s| (s, picker.below(vertices as u64) as u32)));
        let how = if round % 4 == 3 { Apply::Threads } else { full };
        reference.insert(&edges).unwrap();
        graph.apply_by(how, heap.heap(), &GroupedBatch::new(&edges), true);
        if let Some(d) = reference.first_difference(&graph.adjacency()) {
            panic!("{how:?} round {round} insert: {d}");
        }
        // Delete the hub's last 40 edges in chain order (the tail region:
        // holes that fill each other), some from its middle, repeats and
        // absent ones.
        let chain = graph.adjacency()[0].clone();
        let mut doomed: Vec<(u32, u32)> = chain.iter().rev().take(40).map(|&t| (0, t)).collect();
        doomed.extend(chain.iter().step_by(7).map(|&t| (0, t)));
        doomed.extend([(0, chain[0]), (0, chain[0]), (3, vertices - 1)]);
        let how = if round % 4 == 1 { Apply::Threads } else { full };
        reference.delete(&doomed).unwrap();
        graph.apply_by(how, heap.heap(), &GroupedBatch::new(&doomed), false);
        if let Some(d) = reference.first_difference(&graph.adjacency()) {
            panic!("{how:?} round {round} delete: {d}");
        }
    }
    // Everything goes, by warps: the hub's chain empties from 100s of edges.
    let all: Vec<(u32, u32)> = (0..vertices)
        .flat_map(|v| reference.edges(v).map(move |t| (v, t)))
        .collect();
    reference.delete(&all).unwrap();
    graph.apply_by(full, heap.heap(), &GroupedBatch::new(&all), false);
    assert_eq!(reference.first_difference(&graph.adjacency()), None);
    assert_eq!(graph.error(GraphError::PageExhausted), 0);
    assert_eq!(graph.error(GraphError::OutOfRange), 0);
    heap.flush();
    let s = heap.stats();
    assert_eq!(
        s.live_bytes, 0,
        "deleting every edge gives every page back: {s:?}"
    );
}

#[test]
fn warp_exhausted_pool_and_bad_ids_are_counted() {
    let pool = HostPool::new(2);
    let graph = HostGraph::new(4);
    let how = Apply::Warps { warps: 1, lanes: 8 };
    let edges: Vec<(u32, u32)> = (0..(3 * EDGES_PER_PAGE) as u32)
        .map(|t| (0, t % 4))
        .collect();
    graph.apply_by(how, &pool.pool, &GroupedBatch::new(&edges), true);
    assert_eq!(graph.adjacency()[0].len(), 4, "duplicates ignored");
    let many: Vec<(u32, u32)> = (0..3).map(|s| (s, 1)).collect();
    graph.apply_by(how, &pool.pool, &GroupedBatch::new(&many), true);
    assert_eq!(
        graph.error(GraphError::PageExhausted),
        1,
        "third vertex gets no page"
    );
    // A full page and a chunk that needs a second one: the edges that do
    // not fit are counted, one each.
    let pool = HostPool::new(1);
    let graph = HostGraph::new(64);
    let how = Apply::Warps {
        warps: 1,
        lanes: 32,
    };
    let edges: Vec<(u32, u32)> = (0..32).map(|t| (0, t)).collect();
    graph.apply_by(how, &pool.pool, &GroupedBatch::new(&edges), true);
    assert_eq!(graph.adjacency()[0].len(), EDGES_PER_PAGE);
    assert_eq!(
        graph.error(GraphError::PageExhausted),
        (32 - EDGES_PER_PAGE) as u64
    );
    graph.apply_by(
        how,
        &pool.pool,
        &GroupedBatch::new(&[(99, 0), (1, 99)]),
        true,
    );
    graph.apply_by(how, &pool.pool, &GroupedBatch::new(&[(70, 0)]), false);
    assert_eq!(graph.error(GraphError::OutOfRange), 3);
    graph.clear(&pool.pool);
    assert_eq!(pool.free_pages(), 1);
}

#[test]
fn quick_difference_agrees_with_the_exact_check() {
    let mut r = Reference::new(3);
    r.insert(&[(0, 1), (0, 2), (2, 0)]).unwrap();
    assert_eq!(r.quick_difference(&[vec![2, 1], vec![], vec![0]]), None);
    for wrong in [
        vec![vec![2, 2], vec![], vec![0]],
        vec![vec![2, 1, 1], vec![], vec![0]],
        vec![vec![2], vec![1], vec![0]],
        vec![vec![2, 1], vec![]],
    ] {
        assert!(r.quick_difference(&wrong).is_some(), "{wrong:?}");
    }
}

/// The page boundaries of one chunk of a 32-lane warp, counted in pool
/// pages: a full tail and 32 new edges take two fresh pages; a deletion of
/// the chain's last 32 edges (1 + 29 + 2 over three pages) empties two pages
/// and gives them back; a deletion of 32 edges from the front fills every
/// hole from the tail.
#[test]
fn warp_chunks_cross_page_boundaries() {
    let pool = HostPool::new(16);
    let graph = HostGraph::new(256);
    let mut reference = Reference::new(256);
    let full = Apply::Warps {
        warps: 1,
        lanes: 32,
    };
    let pages_in_use = |pool: &HostPool| 16 - pool.free_pages();
    let mut step = |edges: &[(u32, u32)], insert: bool, how: Apply| {
        if insert {
            reference.insert(edges).unwrap();
        } else {
            reference.delete(edges).unwrap();
        }
        graph.apply_by(how, &pool.pool, &GroupedBatch::new(edges), insert);
        if let Some(d) = reference.first_difference(&graph.adjacency()) {
            panic!("{how:?}: {d}");
        }
        graph.adjacency()[0].clone()
    };
    let two_pages: Vec<(u32, u32)> = (0..2 * EDGES_PER_PAGE as u32).map(|t| (0, t)).collect();
    step(&two_pages, true, Apply::Threads);
    assert_eq!(pages_in_use(&pool), 2);
    let next: Vec<(u32, u32)> = (100..132).map(|t| (0, t)).collect();
    step(&next, true, full);
    assert_eq!(pages_in_use(&pool), 4, "29 + 29 + 29 + 3 edges");
    // 90 edges; drop 31 from the front by threads: 59 = 29 + 29 + 1.
    let chain = step(&[], true, full);
    let front: Vec<(u32, u32)> = chain[..31].iter().map(|&t| (0, t)).collect();
    let chain = step(&front, false, Apply::Threads);
    assert_eq!((chain.len(), pages_in_use(&pool)), (59, 3));
    let tail: Vec<(u32, u32)> = chain[27..].iter().map(|&t| (0, t)).collect();
    let chain = step(&tail, false, full);
    assert_eq!(
        (chain.len(), pages_in_use(&pool)),
        (27, 1),
        "two pages emptied"
    );
    let more: Vec<(u32, u32)> = (200..256).map(|t| (0, t)).collect();
    let chain = step(&more, true, full);
    assert_eq!((chain.len(), pages_in_use(&pool)), (83, 3));
    let front: Vec<(u32, u32)> = chain[..32].iter().map(|&t| (0, t)).collect();
    let chain = step(&front, false, full);
    assert_eq!((chain.len(), pages_in_use(&pool)), (51, 2));
    assert_eq!(graph.error(GraphError::PageExhausted), 0);
}
