//! The dynamic-graph workload's host side (issue 5): input graphs, the host
//! models every device result is checked against, and the graph on a GPU.
//! The device side (adjacency pages, update kernels, page sources) is
//! `gpu_kernels::graph`; this crate owns no allocator code and reaches the
//! GPU only through `host` (`Gpu`, `DeviceHeap`). The host models are
//! plain values; the device types launch on their GPU's one stream and are
//! owned and called by one thread.
//!
//! - [`mtx`]: a Matrix Market reader for users' graphs.
//! - [`rmat`]: a deterministic seeded R-MAT generator.
//! - [`reference`](mod@reference): the host model every device result is checked against.
//! - [`edge_set`]: a faster host model for the benchmark's large graphs.
//! - [`batch`]: an update batch grouped by source vertex, the form the
//!   device kernels (`gpu_kernels::graph`) take.
//! - [`device`]: the graph on a GPU, for each page source.
//!
//! Vertex ids are `0..vertices` (the `.mtx` reader converts from 1-based).

pub mod batch;
pub mod device;
pub mod edge_set;
pub mod mtx;
pub mod reference;
pub mod rmat;

/// `Ok` when every edge of `edges` names vertices below `vertices`; else
/// the first edge that does not, named (the host models refuse such a
/// batch whole).
pub(crate) fn check_ids(vertices: u32, edges: &[(u32, u32)]) -> Result<(), String> {
    match edges.iter().find(|&&(s, t)| s >= vertices || t >= vertices) {
        Some(&(s, t)) => Err(format!(
            "edge {s} -> {t} names a vertex outside 0..{vertices} of the graph"
        )),
        None => Ok(()),
    }
}

/// Per-vertex edge lists from an export (see `device::DeviceGraph::export`):
/// vertex `v` has the next `degrees[v]` words of `edges`.
pub fn split_by_degrees(degrees: &[u64], edges: &[u64]) -> Vec<Vec<u32>> {
    let mut at = 0;
    degrees
        .iter()
        .map(|&d| {
            let list = edges[at..at + d as usize]
                .iter()
                .map(|&e| e as u32)
                .collect();
            at += d as usize;
            list
        })
        .collect()
}

/// A directed graph as an edge list.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EdgeList {
    /// Vertices, numbered `0..vertices`.
    pub vertices: u32,
    /// Edges `(source, target)`; may hold duplicates and self-loops.
    pub edges: Vec<(u32, u32)>,
}
