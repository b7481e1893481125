//! `EdgeSet`: the host model of a dynamic graph for the benchmark sweep, where
//! [`super::reference::Reference`] is too slow at R-MAT scale 22 (10^7 edges
//! in per-vertex B-trees, cloned per configuration). One hash set of packed
//! `(source, target)` pairs, per-vertex degrees, and the edge count and
//! order-independent [`fingerprint`] kept up to date on every change, so a
//! device graph is checked in one pass over its exported edges. Cloning is a
//! copy of one table. The set hashes with the lake's one-multiply
//! [`host::addr_map::AddrHasher`] (the keys are R-MAT ids, far from adversarial;
//! SipHash would double the sweep's host time); nothing iterates it, so its
//! order does not matter. Single-threaded.

use host::addr_map::AddrSet;

use super::reference::{fingerprint, mix};

/// A dynamic directed graph on the host as a set of edges.
#[derive(Clone, Debug)]
pub struct EdgeSet {
    edges: AddrSet,
    degrees: Vec<u32>,
    fingerprint: u64,
}

fn pack(s: u32, t: u32) -> u64 {
    (s as u64) << 32 | t as u64
}

impl EdgeSet {
    /// A graph of `vertices` vertices and no edges.
    pub fn new(vertices: u32) -> EdgeSet {
        EdgeSet {
            edges: AddrSet::default(),
            degrees: vec![0; vertices as usize],
            fingerprint: 0,
        }
    }

    /// Vertices.
    pub fn vertices(&self) -> u32 {
        self.degrees.len() as u32
    }

    /// Inserts a batch (duplicates ignored); returns how many edges are new.
    /// An edge with an id out of range rejects the whole batch.
    pub fn insert(&mut self, edges: &[(u32, u32)]) -> Result<u64, String> {
        super::check_ids(self.vertices(), edges)?;
        self.edges.reserve(edges.len());
        let mut new = 0;
        for &(s, t) in edges {
            if self.edges.insert(pack(s, t)) {
                self.degrees[s as usize] += 1;
                self.fingerprint = self.fingerprint.wrapping_add(mix(pack(s, t)));
                new += 1;
            }
        }
        Ok(new)
    }

    /// Deletes a batch (absent edges ignored); returns how many were there.
    pub fn delete(&mut self, edges: &[(u32, u32)]) -> Result<u64, String> {
        super::check_ids(self.vertices(), edges)?;
        let mut gone = 0;
        for &(s, t) in edges {
            if self.edges.remove(&pack(s, t)) {
                self.degrees[s as usize] -= 1;
                self.fingerprint = self.fingerprint.wrapping_sub(mix(pack(s, t)));
                gone += 1;
            }
        }
        Ok(gone)
    }

    /// Whether the edge `s -> t` is present.
    pub fn contains(&self, s: u32, t: u32) -> bool {
        self.edges.contains(&pack(s, t))
    }

    /// Out-degree of `v`.
    pub fn degree(&self, v: u32) -> u32 {
        self.degrees[v as usize]
    }

    /// Edges in all.
    pub fn edge_count(&self) -> u64 {
        self.edges.len() as u64
    }

    /// The [`fingerprint`] of the graph, kept up to date by every change.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// Compares a graph given as per-vertex degrees and their edges laid out
    /// one vertex after the other (the device's export, in any order within
    /// a vertex): `None` if it holds exactly this set. Fast when equal
    /// (degrees, then the fingerprint); otherwise names the first vertex that
    /// differs (a wrong degree, an edge not in the set or repeated), or the
    /// fingerprints if no vertex could be blamed. A wrong graph passes only
    /// if its degrees all agree and its fingerprint collides (about 2^-64).
    pub fn difference(&self, degrees: &[u64], edges: &[u64]) -> Option<String> {
        if degrees.len() != self.degrees.len() {
            return Some(format!(
                "{} vertices, the reference has {}",
                degrees.len(),
                self.degrees.len()
            ));
        }
        let total: u64 = degrees.iter().sum();
        if total != edges.len() as u64 {
            return Some(format!(
                "degrees sum to {total} but {} edges were exported",
                edges.len()
            ));
        }
        if let Some(v) = (0..degrees.len()).find(|&v| degrees[v] != self.degrees[v] as u64) {
            return Some(format!(
                "vertex {v}: degree {}, the reference has {}",
                degrees[v], self.degrees[v]
            ));
        }
        let lists = || {
            degrees.iter().scan(0usize, |at, &d| {
                let list = &edges[*at..*at + d as usize];
                *at += d as usize;
                Some(list)
            })
        };
        let got = fingerprint(
            lists()
                .enumerate()
                .flat_map(|(v, l)| l.iter().map(move |&t| (v as u32, t as u32))),
        );
        if got == self.fingerprint {
            return None;
        }
        // The degrees agree: some vertex holds a foreign or repeated edge.
        let mut blame = None;
        for (v, list) in lists().enumerate() {
            let mut seen = AddrSet::default();
            if let Some(&t) = list
                .iter()
                .find(|&&t| !self.contains(v as u32, t as u32) || !seen.insert(t))
            {
                blame = Some(format!(
                    "vertex {v}: edge {v} -> {t} is not in the reference or repeated"
                ));
                break;
            }
        }
        Some(blame.unwrap_or_else(|| "fingerprints differ but no vertex differs".into()))
    }
}
