//! The in-memory op trace a replay runs: ops in program order, each with its
//! input tensors, its outputs' sizes (and which are pinned), a compute cost,
//! whether it writes its first output over its first input (in-place), and the
//! tensors the program drops after it. Output tensors are numbered in order of
//! creation. A trace may also say what a device-to-device copy costs in its
//! cost unit ([`CopyCost`]; recorded traces do, built ones do not).
//! [`TraceBuilder`] makes traces and works out the drops from the last uses.
//! Plain data, no shared state.

use super::error::{RematError, RematResult};
use super::tensor::TensorId;

/// One output of an op.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputSpec {
    /// Bytes.
    pub size: u64,
    /// Never evicted (parameters, gradients, optimizer state).
    pub pinned: bool,
}

/// One op of the program.
#[derive(Debug, Clone, PartialEq)]
pub struct Op {
    /// Tensors it reads.
    pub inputs: Vec<TensorId>,
    /// Tensors it makes.
    pub outputs: Vec<OutputSpec>,
    /// Its measured (or modelled) compute cost.
    pub cost: f64,
    /// Its first output overwrites its first input, which dies with it.
    pub in_place: bool,
    /// Tensors the program drops after this op.
    pub frees: Vec<TensorId>,
}

/// What a device-to-device copy costs, in the trace's cost unit: the bytes
/// it reads and writes (twice its size) over `bytes_per_cost`, and at least
/// `launch`. A move of a resident tensor (Coop's layout rules) is such a
/// copy (`ReplayOptions::moves_as_copies`).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct CopyCost {
    /// Bytes read plus bytes written per unit of cost (per ns in a recorded
    /// trace).
    pub bytes_per_cost: f64,
    /// The cost of the smallest copy (a kernel launch).
    pub launch: f64,
}

impl CopyCost {
    /// The cost of copying `size` bytes.
    pub fn of(&self, size: u64) -> f64 {
        (2.0 * size as f64 / self.bytes_per_cost).max(self.launch)
    }
}

/// A program: ops in order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Trace {
    /// The ops.
    pub ops: Vec<Op>,
    /// What a copy costs, when the trace knows (`None`: a move is charged as
    /// a recomputation of the moved tensor).
    pub copy: Option<CopyCost>,
}

impl Trace {
    /// Number of tensors the trace makes.
    pub fn tensor_count(&self) -> usize {
        self.ops.iter().map(|op| op.outputs.len()).sum()
    }

    /// Sum of all op costs: the cost of one run without recomputation.
    pub fn total_cost(&self) -> f64 {
        self.ops.iter().map(|op| op.cost).sum()
    }

    /// Peak of the bytes held at once when nothing is evicted (in-place
    /// outputs reuse their input's bytes).
    pub fn peak_live_bytes(&self) -> u64 {
        let sizes: Vec<u64> = self
            .ops
            .iter()
            .flat_map(|op| op.outputs.iter().map(|o| o.size))
            .collect();
        let (mut live, mut peak) = (0u64, 0u64);
        for op in &self.ops {
            for (k, out) in op.outputs.iter().enumerate() {
                let reused = if op.in_place && k == 0 {
                    sizes[op.inputs[0]].min(out.size)
                } else {
                    0
                };
                live += out.size - reused;
            }
            peak = peak.max(live);
            if op.in_place {
                live += sizes[op.inputs[0]].min(op.outputs[0].size);
            }
            live -= op.frees.iter().map(|&t| sizes[t]).sum::<u64>();
        }
        peak
    }
}

/// Builds a trace op by op; `finish` adds the drops.
#[derive(Debug, Default)]
pub struct TraceBuilder {
    ops: Vec<Op>,
    next_tensor: TensorId,
    keep: Vec<bool>,
}

impl TraceBuilder {
    /// An empty builder.
    pub fn new() -> TraceBuilder {
        TraceBuilder::default()
    }

    /// Appends an op; returns the ids of its outputs.
    pub fn op(
        &mut self,
        inputs: &[TensorId],
        outputs: &[OutputSpec],
        cost: f64,
    ) -> RematResult<Vec<TensorId>> {
        self.push(inputs, outputs, cost, false)
    }

    /// Appends an op whose first output overwrites its first input (same size
    /// or smaller); the input dies with the op.
    pub fn op_in_place(
        &mut self,
        inputs: &[TensorId],
        outputs: &[OutputSpec],
        cost: f64,
    ) -> RematResult<Vec<TensorId>> {
        self.push(inputs, outputs, cost, true)
    }

    /// Keeps a tensor until the end of the trace (never dropped).
    pub fn keep(&mut self, id: TensorId) {
        if let Some(k) = self.keep.get_mut(id) {
            *k = true;
        }
    }

    fn push(
        &mut self,
        inputs: &[TensorId],
        outputs: &[OutputSpec],
        cost: f64,
        in_place: bool,
    ) -> RematResult<Vec<TensorId>> {
        if let Some(&bad) = inputs.iter().find(|&&i| i >= self.next_tensor) {
            return Err(RematError::BadTrace(format!(
                "op {} reads tensor {bad} before it is made",
                self.ops.len()
            )));
        }
        if in_place && (inputs.is_empty() || outputs.is_empty()) {
            return Err(RematError::BadTrace(format!(
                "in-place op {} needs an input and an output",
                self.ops.len()
            )));
        }
        let ids: Vec<TensorId> = (self.next_tensor..self.next_tensor + outputs.len()).collect();
        self.next_tensor += outputs.len();
        self.keep.extend(std::iter::repeat_n(false, outputs.len()));
        self.ops.push(Op {
            inputs: inputs.to_vec(),
            outputs: outputs.to_vec(),
            cost,
            in_place,
            frees: Vec::new(),
        });
        Ok(ids)
    }

    /// The trace: every tensor not kept is dropped after its last use (right
    /// after it is made if it is never used); the input of an in-place op is
    /// dropped by that op.
    pub fn finish(mut self) -> Trace {
        let mut last_use: Vec<usize> = Vec::with_capacity(self.next_tensor);
        for (index, op) in self.ops.iter().enumerate() {
            last_use.extend(std::iter::repeat_n(index, op.outputs.len()));
        }
        for (index, op) in self.ops.iter().enumerate() {
            for &input in &op.inputs {
                last_use[input] = last_use[input].max(index);
            }
            if op.in_place {
                self.keep[op.inputs[0]] = false;
                last_use[op.inputs[0]] = index;
            }
        }
        for (tensor, &index) in last_use.iter().enumerate() {
            if !self.keep[tensor] {
                self.ops[index].frees.push(tensor);
            }
        }
        Trace {
            ops: self.ops,
            copy: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(size: u64) -> OutputSpec {
        OutputSpec {
            size,
            pinned: false,
        }
    }

    #[test]
    fn drops_follow_last_use_and_in_place_reuses_bytes() -> RematResult<()> {
        let mut b = TraceBuilder::new();
        let x = b.op(&[], &[out(10)], 0.0)?[0];
        let y = b.op(&[x], &[out(20)], 1.0)?[0];
        let z = b.op_in_place(&[y], &[out(20)], 1.0)?[0];
        let w = b.op(&[x, z], &[out(5)], 1.0)?[0];
        b.keep(w);
        let trace = b.finish();
        assert_eq!(
            trace.ops[2].frees,
            vec![y],
            "the in-place input dies with its op"
        );
        assert_eq!(trace.ops[3].frees, vec![x, z]);
        assert_eq!(trace.peak_live_bytes(), 35, "x + z + w; z reuses y's bytes");
        assert_eq!(trace.tensor_count(), 4);
        Ok(())
    }

    #[test]
    fn reading_a_tensor_before_it_is_made_is_an_error() {
        let mut b = TraceBuilder::new();
        assert!(matches!(
            b.op(&[0], &[out(1)], 1.0),
            Err(RematError::BadTrace(_))
        ));
    }
}
