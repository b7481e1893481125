//! Tensor metadata of a replay: size, the compute cost of the op that made the
//! tensor, the op's inputs, whether it may be evicted, where it lives, when it
//! was last used, and how many running ops hold it (locks). Also the evicted
//! neighbourhood used by the DTR-style costs.
//!
//! A [`TensorTable`] belongs to one executor and is touched by one thread; the
//! policies read it through `&TensorTable` while they search.

use super::error::{RematError, RematResult};
use super::neighbourhood::EvictedClasses;

/// Index of a tensor in its trace (outputs are numbered in order of creation).
pub type TensorId = usize;

/// Where a tensor's value is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Residency {
    /// Not computed yet.
    Unborn,
    /// In the pool at this address.
    Resident(u64),
    /// Dropped by a policy; recomputable from its inputs.
    Evicted,
    /// Dropped by the program (its last use passed, or an in-place op wrote
    /// over it); kept as metadata because an evicted tensor may still need it.
    Released,
}

/// Everything the executor and the policies know about one tensor.
#[derive(Debug, Clone)]
pub struct Tensor {
    /// Bytes.
    pub size: u64,
    /// Compute cost of the op that makes it (same unit as the trace's costs).
    pub cost: f64,
    /// Inputs of the op that makes it.
    pub inputs: Vec<TensorId>,
    /// Parameters, gradients, optimizer state: never evicted.
    pub pinned: bool,
    /// Logical time (op index) of the last use.
    pub last_access: u64,
    /// Where the value is.
    pub residency: Residency,
    /// Running ops that need it resident; a locked tensor is not evictable.
    pub locks: u32,
}

impl Tensor {
    /// Compute cost per byte; the cheap/expensive split of Coop uses it.
    pub fn cost_density(&self) -> f64 {
        self.cost / self.size.max(1) as f64
    }
}

/// All tensors of a replay plus who consumes whom and the evicted classes.
#[derive(Debug, Clone, Default)]
pub struct TensorTable {
    tensors: Vec<Tensor>,
    consumers: Vec<Vec<TensorId>>,
    classes: EvictedClasses,
}

impl TensorTable {
    /// Adds a tensor made by an op with these inputs; returns its id.
    pub fn add(
        &mut self,
        size: u64,
        cost: f64,
        inputs: Vec<TensorId>,
        pinned: bool,
    ) -> RematResult<TensorId> {
        let id = self.tensors.len();
        for &input in &inputs {
            let list = self.consumers.get_mut(input).ok_or_else(|| {
                RematError::BadTrace(format!("tensor {id} uses tensor {input} before it is made"))
            })?;
            list.push(id);
        }
        self.tensors.push(Tensor {
            size,
            cost,
            inputs,
            pinned,
            last_access: 0,
            residency: Residency::Unborn,
            locks: 0,
        });
        self.consumers.push(Vec::new());
        self.classes.grow_to(id + 1);
        Ok(id)
    }

    /// Number of tensors.
    pub fn len(&self) -> usize {
        self.tensors.len()
    }

    /// True when there are no tensors.
    pub fn is_empty(&self) -> bool {
        self.tensors.is_empty()
    }

    /// One tensor.
    pub fn get(&self, id: TensorId) -> RematResult<&Tensor> {
        self.tensors.get(id).ok_or(RematError::UnknownTensor(id))
    }

    /// One tensor, to change.
    pub fn get_mut(&mut self, id: TensorId) -> RematResult<&mut Tensor> {
        self.tensors
            .get_mut(id)
            .ok_or(RematError::UnknownTensor(id))
    }

    /// True when the tensor is in the pool.
    pub fn is_resident(&self, id: TensorId) -> bool {
        matches!(
            self.tensors.get(id).map(|t| t.residency),
            Some(Residency::Resident(_))
        )
    }

    /// True when a policy may evict it now: resident, not pinned, not locked.
    pub fn is_evictable(&self, id: TensorId) -> bool {
        self.tensors.get(id).is_some_and(|t| {
            !t.pinned && t.locks == 0 && matches!(t.residency, Residency::Resident(_))
        })
    }

    /// Inputs and consumers of a tensor: its graph neighbourhood.
    pub fn neighbours(&self, id: TensorId) -> Vec<TensorId> {
        let mut all = self.tensors[id].inputs.clone();
        all.extend_from_slice(&self.consumers[id]);
        all
    }

    /// DTR's projected cost: own cost plus the evicted classes next to it.
    pub fn projected_cost(&self, id: TensorId) -> f64 {
        self.tensors[id].cost + self.classes.neighbour_cost(&self.neighbours(id))
    }

    /// Bytes that must be resident at once to recompute `id` from what is
    /// resident now: the tensor, its missing (evicted or released) inputs,
    /// and, for each of those in turn, what recomputing it needs on top of
    /// the missing siblings recomputed before it (the executor recomputes
    /// inputs in order and holds each until its consumer runs). Followed
    /// `depth` levels up the graph of missing tensors; deeper ancestors count
    /// as resident, so this is a lower bound on the true peak.
    pub fn recompute_peak(&self, id: TensorId, depth: u32) -> u64 {
        let tensor = &self.tensors[id];
        let inputs = &tensor.inputs;
        // Missing inputs, each once (an op may read a tensor twice); input
        // lists are short, so the quadratic check allocates nothing.
        let missing = inputs
            .iter()
            .enumerate()
            .filter(|&(k, &i)| !self.is_resident(i) && !inputs[..k].contains(&i))
            .map(|(_, &i)| i);
        let (mut held, mut chain) = (0u64, 0u64);
        for input in missing {
            if depth > 0 {
                chain = chain.max(held + self.recompute_peak(input, depth - 1));
            }
            held += self.tensors[input].size;
        }
        (tensor.size + held).max(chain)
    }

    /// Logical time since the last use, at least 1.
    pub fn staleness(&self, id: TensorId, now: u64) -> f64 {
        (now.saturating_sub(self.tensors[id].last_access) + 1) as f64
    }

    /// Marks a resident tensor as gone (`Evicted` or `Released`) and joins it
    /// to its evicted neighbours.
    pub fn drop_value(&mut self, id: TensorId, to: Residency) -> RematResult<()> {
        let neighbours = self.neighbours(id);
        let tensor = self.get_mut(id)?;
        tensor.residency = to;
        let cost = tensor.cost;
        self.classes.add(id, cost, &neighbours);
        Ok(())
    }

    /// Marks a tensor as computed at `addr`.
    pub fn set_resident(&mut self, id: TensorId, addr: u64, now: u64) -> RematResult<()> {
        let tensor = self.get_mut(id)?;
        let cost = tensor.cost;
        tensor.residency = Residency::Resident(addr);
        tensor.last_access = now;
        self.classes.remove(id, cost);
        Ok(())
    }
}
