//! DTR's evicted neighbourhood, kept as equivalence classes (DTR §4, "eq"
//! variant): evicted tensors that are graph neighbours (one is an input of the
//! other) are joined in one union-find class whose cost is the sum of its
//! members' compute costs. The projected cost of a resident tensor is its own
//! cost plus the cost of every distinct evicted class next to it: what would
//! have to be recomputed with it.
//!
//! Simplification, as DTR's own "eq" approximation: a class is never split. When
//! a member is recomputed its cost is subtracted from the class, but the class
//! may still join tensors that are no longer connected through evicted ones.
//!
//! Every class whose cost or root changes is noted (`take_changed`), so that
//! cached projected costs that read it can be invalidated (`super::price`).
//!
//! Lookups are the cold part of a projected cost (one per graph neighbour, in
//! a table indexed by tensor id), so the table is dense (a node index is a
//! `u32`, 8 bytes a tensor with its `Option`), and a neighbour above the
//! highest tensor that ever joined a class (most consumers of a recent
//! tensor are ops not run yet) is known to be in none without a lookup.
//!
//! Owned by one [`super::tensor::TensorTable`]; single-threaded, mutated only on
//! eviction, release and recomputation.

use super::tensor::TensorId;

/// Union-find over eviction events; a tensor evicted twice gets a fresh node.
#[derive(Debug, Default, Clone)]
pub struct EvictedClasses {
    parent: Vec<usize>,
    rank: Vec<u8>,
    cost: Vec<f64>,
    /// The node of each tensor now in a class (`u32`: one node per
    /// eviction or release, far below 2^32 in a training step).
    node_of: Vec<Option<u32>>,
    /// One past the highest tensor id ever given a node: tensors at or above
    /// it are in no class (checked before `node_of` is read).
    joined_below: usize,
    /// Roots whose class changed (cost, or merged into another) since the
    /// last `take_changed`, when `noting`.
    changed: Vec<usize>,
    noting: bool,
}

impl EvictedClasses {
    /// Makes room for tensor ids below `count`.
    pub fn grow_to(&mut self, count: usize) {
        if self.node_of.len() < count {
            self.node_of.resize(count, None);
        }
    }

    /// The class root of a node. No path compression, so lookups need only
    /// `&self`; union by rank keeps the depth logarithmic.
    fn root(&self, mut node: usize) -> usize {
        while self.parent[node] != node {
            node = self.parent[node];
        }
        node
    }

    fn union(&mut self, a: usize, b: usize) {
        let (ra, rb) = (self.root(a), self.root(b));
        if ra == rb {
            return;
        }
        if self.noting {
            self.changed.extend([ra, rb]);
        }
        let (low, high) = if self.rank[ra] < self.rank[rb] {
            (ra, rb)
        } else {
            (rb, ra)
        };
        self.parent[low] = high;
        self.cost[high] += self.cost[low];
        if self.rank[low] == self.rank[high] {
            self.rank[high] += 1;
        }
    }

    /// Records that `tensor` (compute cost `cost`) left memory, joining it to the
    /// classes of its evicted `neighbours`.
    pub fn add(&mut self, tensor: TensorId, cost: f64, neighbours: &[TensorId]) {
        let node = self.parent.len();
        self.parent.push(node);
        self.rank.push(0);
        self.cost.push(cost);
        self.node_of[tensor] = Some(Self::compact(node));
        self.joined_below = self.joined_below.max(tensor + 1);
        for &n in neighbours {
            if let Some(other) = self.node_of[n] {
                self.union(node, other as usize);
            }
        }
    }

    /// Records that `tensor` is back in memory; false when it was in no
    /// class (a tensor computed for the first time).
    pub fn remove(&mut self, tensor: TensorId, cost: f64) -> bool {
        let Some(node) = self.node_of[tensor].take() else {
            return false;
        };
        let root = self.root(node as usize);
        self.cost[root] = (self.cost[root] - cost).max(0.0);
        if self.noting {
            self.changed.push(root);
        }
        true
    }

    /// Sum of the costs of the distinct evicted classes among `neighbours`.
    pub fn neighbour_cost(&self, neighbours: &[TensorId]) -> f64 {
        let mut seen: Vec<usize> = Vec::new();
        self.neighbour_cost_roots(neighbours.iter().copied(), &mut seen)
    }

    /// [`Self::neighbour_cost`], leaving the distinct roots it summed in
    /// `roots` (cleared first), in the order it met them; the same additions
    /// in the same order, so the same value to the last bit.
    pub fn neighbour_cost_roots(
        &self,
        neighbours: impl Iterator<Item = TensorId>,
        roots: &mut Vec<usize>,
    ) -> f64 {
        roots.clear();
        let mut total = 0.0;
        for n in neighbours {
            if n >= self.joined_below {
                continue;
            }
            if let Some(node) = self.node_of[n] {
                let root = self.root(node as usize);
                if !roots.contains(&root) {
                    roots.push(root);
                    total += self.cost[root];
                }
            }
        }
        total
    }

    /// [`Self::neighbour_cost_roots`] over the `inputs` that `skip` does not
    /// leave out and then `consumers`, for a consumer list in increasing id
    /// order (as `TensorTable` keeps them): its walk stops at the first
    /// consumer above every tensor that ever joined a class, since none
    /// after it is in one. The same additions in the same order. `skip` is
    /// asked only of inputs in a class (the others add nothing either
    /// way), so that an input in none costs no read of what `skip` reads.
    pub fn neighbour_cost_roots_sorted(
        &self,
        inputs: &[TensorId],
        consumers: &[TensorId],
        skip: impl Fn(TensorId) -> bool,
        roots: &mut Vec<usize>,
    ) -> f64 {
        roots.clear();
        let mut total = 0.0;
        for &n in inputs {
            if let Some(cost) = self.new_root_cost(n, roots, &skip) {
                total += cost;
            }
        }
        let never = |_| false;
        for &n in consumers {
            if n >= self.joined_below {
                break;
            }
            if let Some(cost) = self.new_root_cost(n, roots, never) {
                total += cost;
            }
        }
        total
    }

    /// The cost of the class of `tensor` when it is in one whose root is
    /// not in `roots` yet (the root is then added) and `skip` does not
    /// leave it out, else `None`.
    #[inline]
    fn new_root_cost(
        &self,
        tensor: TensorId,
        roots: &mut Vec<usize>,
        skip: impl Fn(TensorId) -> bool,
    ) -> Option<f64> {
        if tensor >= self.joined_below {
            return None;
        }
        let node = self.node_of[tensor]?;
        if skip(tensor) {
            return None;
        }
        let root = self.root(node as usize);
        if roots.contains(&root) {
            return None;
        }
        roots.push(root);
        Some(self.cost[root])
    }

    /// A node index as stored in `node_of`.
    fn compact(node: usize) -> u32 {
        u32::try_from(node).expect("fewer than 2^32 evictions and releases in a replay")
    }

    /// Number of nodes made so far (one per eviction or release).
    pub fn node_count(&self) -> usize {
        self.parent.len()
    }

    /// Starts (or stops) noting the roots whose class changes.
    pub fn note_changes(&mut self, on: bool) {
        self.noting = on;
        self.changed.clear();
    }

    /// Moves the roots noted as changed since the last call into `into`.
    pub fn take_changed(&mut self, into: &mut Vec<usize>) {
        into.append(&mut self.changed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicted_neighbours_join_one_class_counted_once() {
        let mut classes = EvictedClasses::default();
        classes.grow_to(4);
        classes.add(0, 1.0, &[1]);
        classes.add(2, 2.0, &[1, 3]);
        classes.add(1, 4.0, &[0, 2]);
        assert_eq!(
            classes.neighbour_cost(&[0, 2]),
            7.0,
            "one class, counted once"
        );
        classes.remove(1, 4.0);
        assert_eq!(
            classes.neighbour_cost(&[0]),
            3.0,
            "the recomputed member's cost leaves the class"
        );
        assert_eq!(classes.neighbour_cost(&[3]), 0.0);
    }

    #[test]
    fn sorted_walk_stops_past_the_last_member_with_the_same_sum() {
        let mut classes = EvictedClasses::default();
        classes.grow_to(10);
        classes.add(2, 0.5, &[]);
        classes.add(5, 0.25, &[]);
        classes.add(6, 0.125, &[5]);
        classes.remove(6, 0.125);
        // Tensor 6 left its class but still raised the bound: 7, 8, 9 were
        // never in one.
        let mut roots = Vec::new();
        for (inputs, consumers) in [
            (&[2usize, 5][..], &[5usize, 7, 9][..]),
            (&[9, 8, 2], &[2, 5, 8]),
            (&[], &[6, 7]),
        ] {
            let all: Vec<_> = inputs.iter().chain(consumers).copied().collect();
            let sorted =
                classes.neighbour_cost_roots_sorted(inputs, consumers, |_| false, &mut roots);
            assert_eq!(sorted.to_bits(), classes.neighbour_cost(&all).to_bits());
        }
        assert_eq!(
            classes.neighbour_cost_roots_sorted(&[2], &[5], |_| false, &mut roots),
            0.75,
            "inputs first, then consumers, each class once"
        );
        assert_eq!(roots.len(), 2);
    }

    #[test]
    fn skip_is_asked_only_of_inputs_in_a_class_and_leaves_theirs_out() {
        let mut classes = EvictedClasses::default();
        classes.grow_to(8);
        classes.add(1, 0.5, &[]);
        classes.add(3, 0.25, &[]);
        let asked = std::cell::RefCell::new(Vec::new());
        let skip = |n: TensorId| {
            asked.borrow_mut().push(n);
            n == 3
        };
        let mut roots = Vec::new();
        // Inputs 0 and 2 are in no class, 6 is above every member; 1 and 3
        // are members, 3 skipped. Consumer 3 is never skipped.
        let cost = classes.neighbour_cost_roots_sorted(&[0, 1, 2, 3, 6], &[3], skip, &mut roots);
        assert_eq!(*asked.borrow(), vec![1, 3], "only members are asked");
        assert_eq!(cost, 0.75, "3 skipped as an input, counted as a consumer");
        let all_skipped = classes.neighbour_cost_roots_sorted(&[1, 3], &[], |_| true, &mut roots);
        assert_eq!(all_skipped, 0.0);
        assert!(roots.is_empty(), "a skipped input records no root");
    }
}
