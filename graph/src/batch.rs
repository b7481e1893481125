//! `GroupedBatch`: a batch of edge updates grouped by source vertex, as the
//! device kernels take it (`gpu_kernels::graph::adjacency::Batch`): each
//! source once, its targets contiguous. Built on the host; nothing shared.

/// Updates grouped by source: entry `i` is `sources[i]` with targets
/// `targets[offsets[i]..offsets[i + 1]]`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct GroupedBatch {
    /// Distinct source vertices, ascending.
    pub sources: Vec<u64>,
    /// `sources.len() + 1` offsets into `targets`.
    pub offsets: Vec<u64>,
    /// Targets, grouped by source (duplicates kept: the kernels ignore them).
    pub targets: Vec<u64>,
}

impl GroupedBatch {
    /// Groups `edges` by source (stable sort).
    pub fn new(edges: &[(u32, u32)]) -> GroupedBatch {
        let mut sorted = edges.to_vec();
        sorted.sort_by_key(|&(s, _)| s);
        let mut batch = GroupedBatch {
            offsets: vec![0],
            ..GroupedBatch::default()
        };
        for (s, t) in sorted {
            if batch.sources.last() != Some(&(s as u64)) {
                if !batch.sources.is_empty() {
                    batch.offsets.push(batch.targets.len() as u64);
                }
                batch.sources.push(s as u64);
            }
            batch.targets.push(t as u64);
        }
        if !batch.sources.is_empty() {
            batch.offsets.push(batch.targets.len() as u64);
        }
        batch
    }

    /// Entries (distinct sources).
    pub fn len(&self) -> u64 {
        self.sources.len() as u64
    }

    /// Whether the batch has no edges.
    pub fn is_empty(&self) -> bool {
        self.sources.is_empty()
    }

    /// Entry `i`: the source and its targets.
    pub fn entry(&self, i: usize) -> (u64, &[u64]) {
        let (a, b) = (self.offsets[i] as usize, self.offsets[i + 1] as usize);
        (self.sources[i], &self.targets[a..b])
    }
}
