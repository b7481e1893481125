//! Seeded synthetic training steps, so that the executor and the policies can
//! be compared before real traces are recorded: a transformer-like chain
//! (layer norm, attention, MLP, residual adds; activations of one size) and a
//! ResNet-like chain (conv, batch norm, in-place ReLU, residual adds;
//! activations that shrink stage by stage). Each trace is one step: forward,
//! a backward pass derived op by op (each backward op reads the upstream
//! gradient and the tensors its forward op saved, and makes the gradients of
//! its inputs; gradients of a tensor used twice are summed in place), and an
//! in-place SGD update of every parameter.
//!
//! Costs are modelled, not measured: an op costs its output's MiB times a
//! density, drawn around 1 for element-wise ops and around 8–30 for
//! matmul/conv, matching the order-of-magnitude gap the Coop paper reports
//! (its Table 1). Parameters, their gradients and the input batch are pinned;
//! the parameters exist before the step starts (they are made first).
//! Plain functions; no shared state.

use gpu_kernels::workload::SplitMix64;

use super::error::RematResult;
use super::tensor::TensorId;
use super::trace::{OutputSpec, Trace, TraceBuilder};

const MIB: u64 = 1 << 20;

/// How an op's cost scales with its output.
#[derive(Debug, Clone, Copy)]
enum Kind {
    /// Element-wise, normalization, softmax: density around 1.
    Linear,
    /// Matmul, conv: density around 8–30, times a factor.
    SuperLinear(f64),
}

/// What the backward op of a forward op reads besides the upstream gradient.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Saved {
    /// Its inputs (matmul, conv, norm).
    Inputs,
    /// Its output (ReLU, softmax).
    Output,
    /// Nothing (add).
    Nothing,
}

struct ForwardOp {
    inputs: Vec<TensorId>,
    output: TensorId,
    cost: f64,
    saved: Saved,
}

/// A model under construction: the builder plus what autodiff needs.
struct Model {
    trace: TraceBuilder,
    rng: SplitMix64,
    sizes: Vec<u64>,
    params: Vec<TensorId>,
    data: Vec<TensorId>,
    forward: Vec<ForwardOp>,
}

impl Model {
    fn new(seed: u64) -> Model {
        Model {
            trace: TraceBuilder::new(),
            rng: SplitMix64(seed),
            sizes: Vec::new(),
            params: Vec::new(),
            data: Vec::new(),
            forward: Vec::new(),
        }
    }

    fn record(&mut self, ids: &[TensorId], size: u64) {
        self.sizes
            .resize(ids.iter().max().map_or(self.sizes.len(), |m| m + 1), size);
    }

    fn leaf(&mut self, size: u64, is_param: bool) -> RematResult<TensorId> {
        let id = self
            .trace
            .op(&[], &[OutputSpec { size, pinned: true }], 0.0)?[0];
        self.record(&[id], size);
        self.trace.keep(id);
        if is_param {
            self.params.push(id)
        } else {
            self.data.push(id)
        }
        Ok(id)
    }

    fn cost(&mut self, kind: Kind, size: u64) -> f64 {
        let density = match kind {
            Kind::Linear => 0.5 + self.rng.unit(),
            Kind::SuperLinear(factor) => factor * (8.0 + 22.0 * self.rng.unit()),
        };
        density * size as f64 / MIB as f64
    }

    fn forward_op(
        &mut self,
        inputs: &[TensorId],
        size: u64,
        kind: Kind,
        saved: Saved,
        in_place: bool,
    ) -> RematResult<TensorId> {
        let cost = self.cost(kind, size);
        let out = [OutputSpec {
            size,
            pinned: false,
        }];
        let ids = if in_place {
            self.trace.op_in_place(inputs, &out, cost)?
        } else {
            self.trace.op(inputs, &out, cost)?
        };
        self.record(&ids, size);
        self.forward.push(ForwardOp {
            inputs: inputs.to_vec(),
            output: ids[0],
            cost,
            saved,
        });
        Ok(ids[0])
    }

    /// Backward pass and in-place SGD; returns the finished trace.
    fn finish(mut self, loss: TensorId) -> RematResult<Trace> {
        let mut grad: Vec<Option<TensorId>> = vec![None; self.sizes.len() * 4];
        let seed_cost = self.cost(Kind::Linear, self.sizes[loss]);
        let seed = self.trace.op(
            &[loss],
            &[OutputSpec {
                size: self.sizes[loss],
                pinned: false,
            }],
            seed_cost,
        )?;
        self.record(&seed, self.sizes[loss]);
        grad[loss] = Some(seed[0]);
        let forward = std::mem::take(&mut self.forward);
        for op in forward.iter().rev() {
            let Some(upstream) = grad[op.output] else {
                continue;
            };
            let targets: Vec<TensorId> = op
                .inputs
                .iter()
                .copied()
                .filter(|x| !self.data.contains(x))
                .collect();
            if targets.is_empty() {
                continue;
            }
            let mut reads = vec![upstream];
            match op.saved {
                Saved::Inputs => reads.extend(&op.inputs),
                Saved::Output => reads.push(op.output),
                Saved::Nothing => {}
            }
            let outs: Vec<OutputSpec> = targets
                .iter()
                .map(|&x| OutputSpec {
                    size: self.sizes[x],
                    pinned: self.params.contains(&x),
                })
                .collect();
            let ids = self.trace.op(&reads, &outs, 2.0 * op.cost)?;
            for (&x, &g) in targets.iter().zip(&ids) {
                self.record(&[g], self.sizes[x]);
                grad.resize(grad.len().max(g + 1), None);
                grad[x] = Some(match grad[x] {
                    None => g,
                    Some(old) => self.accumulate(old, g, self.params.contains(&x))?,
                });
            }
        }
        for p in self.params.clone() {
            let Some(g) = grad[p] else { continue };
            let cost = self.cost(Kind::Linear, self.sizes[p]);
            let updated = self.trace.op_in_place(
                &[p, g],
                &[OutputSpec {
                    size: self.sizes[p],
                    pinned: true,
                }],
                cost,
            )?;
            self.trace.keep(updated[0]);
        }
        Ok(self.trace.finish())
    }

    fn accumulate(&mut self, old: TensorId, new: TensorId, pinned: bool) -> RematResult<TensorId> {
        let size = self.sizes[old];
        let cost = self.cost(Kind::Linear, size);
        let ids = self
            .trace
            .op_in_place(&[old, new], &[OutputSpec { size, pinned }], cost)?;
        self.record(&ids, size);
        Ok(ids[0])
    }
}

/// A transformer-like step: `layers` blocks of hidden activations of
/// `hidden_mib` MiB (attention scores twice that, the MLP four times).
pub fn transformer(layers: usize, hidden_mib: u64, seed: u64) -> RematResult<Trace> {
    let a = hidden_mib * MIB;
    let mut m = Model::new(seed);
    let mut weights = Vec::with_capacity(layers);
    for _ in 0..layers {
        weights.push([
            m.leaf(a / 2, true)?,
            m.leaf(a / 4, true)?,
            m.leaf(a, true)?,
            m.leaf(a, true)?,
        ]);
    }
    let w_out = m.leaf(a, true)?;
    let mut x = m.leaf(a, false)?;
    for [w_qkv, w_o, w_1, w_2] in weights {
        let mm = Kind::SuperLinear(1.0);
        let ln1 = m.forward_op(&[x], a, Kind::Linear, Saved::Inputs, false)?;
        let qkv = m.forward_op(&[ln1, w_qkv], 3 * a, mm, Saved::Inputs, false)?;
        let scores = m.forward_op(&[qkv], 2 * a, mm, Saved::Inputs, false)?;
        let probs = m.forward_op(&[scores], 2 * a, Kind::Linear, Saved::Output, false)?;
        let ctx = m.forward_op(&[probs, qkv], a, mm, Saved::Inputs, false)?;
        let proj = m.forward_op(&[ctx, w_o], a, mm, Saved::Inputs, false)?;
        let r1 = m.forward_op(&[x, proj], a, Kind::Linear, Saved::Nothing, false)?;
        let ln2 = m.forward_op(&[r1], a, Kind::Linear, Saved::Inputs, false)?;
        let h = m.forward_op(&[ln2, w_1], 4 * a, mm, Saved::Inputs, false)?;
        let g = m.forward_op(&[h], 4 * a, Kind::Linear, Saved::Inputs, false)?;
        let f = m.forward_op(&[g, w_2], a, mm, Saved::Inputs, false)?;
        x = m.forward_op(&[r1, f], a, Kind::Linear, Saved::Nothing, false)?;
    }
    let logits = m.forward_op(&[x, w_out], a, Kind::SuperLinear(1.0), Saved::Inputs, false)?;
    let loss = m.forward_op(&[logits], MIB / 256, Kind::Linear, Saved::Inputs, false)?;
    m.finish(loss)
}

/// A ResNet-like step: `stages` stages of `blocks` residual blocks; the stem
/// activation is `stem_mib` MiB and halves at every stage while the conv
/// density doubles (channels double, spatial size quarters).
pub fn resnet(stages: usize, blocks: usize, stem_mib: u64, seed: u64) -> RematResult<Trace> {
    let mut size = stem_mib * MIB;
    let mut m = Model::new(seed);
    let w_stem = m.leaf(MIB / 8, true)?;
    let mut weights = Vec::with_capacity(stages * blocks);
    for stage in 0..stages {
        let bytes = (MIB / 4) << stage;
        for block in 0..blocks {
            let down = if block == 0 && stage > 0 {
                Some(m.leaf(bytes, true)?)
            } else {
                None
            };
            weights.push((down, m.leaf(bytes, true)?, m.leaf(bytes, true)?));
        }
    }
    let w_fc = m.leaf(MIB / 8, true)?;
    let input = m.leaf(size, false)?;
    let mut weights = weights.into_iter();
    let c = m.forward_op(
        &[input, w_stem],
        size,
        Kind::SuperLinear(1.0),
        Saved::Inputs,
        false,
    )?;
    let b = m.forward_op(&[c], size, Kind::Linear, Saved::Inputs, false)?;
    let mut x = m.forward_op(&[b], size, Kind::Linear, Saved::Output, true)?;
    for stage in 0..stages {
        let conv = Kind::SuperLinear(f64::from(1u32 << stage.min(16)));
        for _ in 0..blocks {
            let Some((down, w1, w2)) = weights.next() else {
                break;
            };
            let shortcut = match down {
                Some(w_down) => {
                    size /= 2;
                    m.forward_op(&[x, w_down], size, conv, Saved::Inputs, false)?
                }
                None => x,
            };
            let c1 = m.forward_op(&[x, w1], size, conv, Saved::Inputs, false)?;
            let b1 = m.forward_op(&[c1], size, Kind::Linear, Saved::Inputs, false)?;
            let r1 = m.forward_op(&[b1], size, Kind::Linear, Saved::Output, true)?;
            let c2 = m.forward_op(&[r1, w2], size, conv, Saved::Inputs, false)?;
            let b2 = m.forward_op(&[c2], size, Kind::Linear, Saved::Inputs, false)?;
            let sum = m.forward_op(&[b2, shortcut], size, Kind::Linear, Saved::Nothing, false)?;
            x = m.forward_op(&[sum], size, Kind::Linear, Saved::Output, true)?;
        }
    }
    let pooled = m.forward_op(&[x], MIB / 64, Kind::Linear, Saved::Inputs, false)?;
    let logits = m.forward_op(
        &[pooled, w_fc],
        MIB / 256,
        Kind::SuperLinear(1.0),
        Saved::Inputs,
        false,
    )?;
    let loss = m.forward_op(&[logits], MIB / 1024, Kind::Linear, Saved::Inputs, false)?;
    m.finish(loss)
}
