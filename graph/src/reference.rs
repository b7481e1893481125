//! `Reference`: the host model of a dynamic graph that device results are
//! checked against. Per-vertex sorted edge sets; single-threaded.

use std::collections::BTreeSet;

/// A dynamic directed graph on the host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reference {
    adjacency: Vec<BTreeSet<u32>>,
}

impl Reference {
    /// A graph of `vertices` vertices and no edges.
    pub fn new(vertices: u32) -> Reference {
        Reference {
            adjacency: vec![BTreeSet::new(); vertices as usize],
        }
    }

    /// Vertices.
    pub fn vertices(&self) -> u32 {
        self.adjacency.len() as u32
    }

    /// Inserts a batch (duplicates ignored); returns how many edges are new.
    /// An edge with an id out of range rejects the whole batch.
    pub fn insert(&mut self, edges: &[(u32, u32)]) -> Result<u64, String> {
        super::check_ids(self.vertices(), edges)?;
        Ok(edges
            .iter()
            .filter(|&&(s, t)| self.adjacency[s as usize].insert(t))
            .count() as u64)
    }

    /// Deletes a batch (absent edges ignored); returns how many were there.
    pub fn delete(&mut self, edges: &[(u32, u32)]) -> Result<u64, String> {
        super::check_ids(self.vertices(), edges)?;
        Ok(edges
            .iter()
            .filter(|&&(s, t)| self.adjacency[s as usize].remove(&t))
            .count() as u64)
    }

    /// The targets of `v`, ascending.
    pub fn edges(&self, v: u32) -> impl Iterator<Item = u32> + '_ {
        self.adjacency[v as usize].iter().copied()
    }

    /// Out-degree of `v`.
    pub fn degree(&self, v: u32) -> usize {
        self.adjacency[v as usize].len()
    }

    /// Edges in all.
    pub fn edge_count(&self) -> u64 {
        self.adjacency.iter().map(|s| s.len() as u64).sum()
    }

    /// Like [`Reference::first_difference`], but fast when the graphs agree
    /// (for graphs of 10^7 edges and more): first compares edge counts and
    /// the order-independent [`fingerprint`]s, and only if they differ looks
    /// for the first differing vertex. Equal graphs always pass; a wrong one
    /// passes only if its fingerprint collides (a 64-bit sum of mixed
    /// `(vertex, target)` pairs: about 2^-64 for a given error).
    pub fn quick_difference(&self, adjacency: &[Vec<u32>]) -> Option<String> {
        let edges: u64 = adjacency.iter().map(|l| l.len() as u64).sum();
        if adjacency.len() == self.adjacency.len()
            && edges == self.edge_count()
            && fingerprint(
                adjacency
                    .iter()
                    .enumerate()
                    .flat_map(|(v, l)| l.iter().map(move |&t| (v as u32, t))),
            ) == self.fingerprint()
        {
            return None;
        }
        Some(
            self.first_difference(adjacency)
                .unwrap_or_else(|| "fingerprints differ (an edge repeated?)".into()),
        )
    }

    /// The [`fingerprint`] of this graph.
    pub fn fingerprint(&self) -> u64 {
        fingerprint(
            self.adjacency
                .iter()
                .enumerate()
                .flat_map(|(v, s)| s.iter().map(move |&t| (v as u32, t))),
        )
    }

    /// The first vertex whose edges differ from `adjacency` (one sorted or
    /// unsorted list per vertex), described; `None` if all agree.
    pub fn first_difference(&self, adjacency: &[Vec<u32>]) -> Option<String> {
        if adjacency.len() != self.adjacency.len() {
            return Some(format!(
                "{} vertices, the reference has {}",
                adjacency.len(),
                self.adjacency.len()
            ));
        }
        for (v, (got, want)) in adjacency.iter().zip(&self.adjacency).enumerate() {
            let mut sorted = got.clone();
            sorted.sort_unstable();
            if !sorted.iter().copied().eq(want.iter().copied()) {
                return Some(format!(
                    "vertex {v}: {} edges {:?}…, the reference has {} {:?}…",
                    sorted.len(),
                    &sorted[..sorted.len().min(8)],
                    want.len(),
                    want.iter().take(8).collect::<Vec<_>>()
                ));
            }
        }
        None
    }
}

/// An order-independent fingerprint of an edge multiset: the wrapping sum of
/// the [`mix`] of each `(source, target)` pair packed as `source << 32 |
/// target`.
pub fn fingerprint(edges: impl Iterator<Item = (u32, u32)>) -> u64 {
    edges.fold(0u64, |sum, (s, t)| {
        sum.wrapping_add(mix((s as u64) << 32 | t as u64))
    })
}

/// A 64-bit mix of `x` (SplitMix64's finaliser over `x` plus its increment).
pub fn mix(x: u64) -> u64 {
    let mut z = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}
