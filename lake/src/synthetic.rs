//! A synthetic GPT-2-like training trace, to develop the lake against
//! before traces recorded on a GPU are at hand.
//!
//! The model: GPT-2 124M (12 layers, width 768, vocabulary 50257, bf16
//! tensors), gradient checkpointing per layer, AdamW, a batch of `batch`
//! sequences of 1024 tokens shortened by up to 255 per step. Its pattern:
//! - parameters allocated once (phase 0), Adam states at the first step and
//!   kept, gradients made in backward and dropped at `zero_grad`;
//! - forward: each layer keeps only its input (the checkpoint) and frees its
//!   temporaries (LayerNorm, QKV, attention, MLP of `batch × seq × 3072`);
//! - the loss: bf16 logits, an fp32 copy and its log-softmax
//!   (`batch × seq × 50257 × 4` bytes: over 1 GiB at batch 8);
//! - backward: logits' gradients, then per layer a recompute of its
//!   temporaries and their gradients, freed as they are consumed;
//! - the optimizer: foreach temporaries of every parameter's size;
//! - many small tensors (scalars, statistics, biases' gradients) throughout.
//!
//! Addresses are unique fake ones (they only pair frees with allocs); the
//! phase of each record is the step (0 for set-up); one stream.
//!
//! Concurrency: a pure function of its arguments.

use gpu_kernels::workload::SplitMix64;

use super::trace::{Event, EventKind, Site, Trace};

/// The shape of a synthetic run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gpt2Shape {
    /// Sequences per batch.
    pub batch: u64,
    /// Training steps after set-up.
    pub steps: u32,
    /// Seed of the sequence-length draws.
    pub seed: u64,
}

const LAYERS: usize = 12;
const WIDTH: u64 = 768;
const VOCAB: u64 = 50257;
const HEADS: u64 = 12;
const MAX_SEQ: u64 = 1024;
const SEQ_CUT: u64 = 255;
const BF16: u64 = 2;
const F32: u64 = 4;

/// Builds trace records with fake addresses.
struct Recorder {
    events: Vec<Event>,
    next_addr: u64,
    phase: u32,
    rng: SplitMix64,
}

impl Recorder {
    fn alloc(&mut self, size: u64) -> (u64, u64) {
        let addr = self.next_addr;
        self.next_addr += size.max(1).next_multiple_of(512);
        self.push(EventKind::Alloc, size, addr);
        (addr, size)
    }

    fn free(&mut self, t: (u64, u64)) {
        self.push(EventKind::Free, t.1, t.0);
    }

    fn push(&mut self, kind: EventKind, size: u64, addr: u64) {
        let time_ns = self.events.len() as u64 * 1000;
        self.events.push(Event {
            kind,
            size,
            addr,
            site: Site {
                stream: 0,
                phase: self.phase,
            },
            time_ns,
        });
    }

    /// A few short-lived small tensors (scalars, statistics, indices).
    fn chatter(&mut self) {
        let n = 1 + self.rng.next_u64() % 3;
        let made: Vec<_> = (0..n)
            .map(|_| {
                let size = 4u64 << (self.rng.next_u64() % 14);
                self.alloc(size)
            })
            .collect();
        for t in made {
            self.free(t);
        }
    }
}

/// Per-layer parameter sizes in elements.
fn layer_params() -> [u64; 12] {
    [
        WIDTH,
        WIDTH,
        WIDTH * 3 * WIDTH,
        3 * WIDTH,
        WIDTH * WIDTH,
        WIDTH,
        WIDTH,
        WIDTH,
        WIDTH * 4 * WIDTH,
        4 * WIDTH,
        4 * WIDTH * WIDTH,
        WIDTH,
    ]
}

/// Parameter sizes of the whole model in elements.
fn all_params() -> Vec<u64> {
    let mut p = vec![VOCAB * WIDTH, MAX_SEQ * WIDTH];
    for _ in 0..LAYERS {
        p.extend(layer_params());
    }
    p.extend([WIDTH, WIDTH]);
    p
}

/// One layer's forward temporaries for `tokens` tokens, in allocation
/// order, in bytes.
fn layer_temporaries(tokens: u64, batch: u64, seq: u64) -> Vec<u64> {
    let h = tokens * WIDTH * BF16;
    vec![
        h,                         // ln_1 out
        batch * seq * F32,         // ln_1 mean
        batch * seq * F32,         // ln_1 rstd
        tokens * 3 * WIDTH * BF16, // qkv
        h,                         // attention out
        batch * HEADS * seq * F32, // logsumexp
        h,                         // attn proj
        h,                         // residual
        h,                         // ln_2 out
        tokens * 4 * WIDTH * BF16, // fc
        tokens * 4 * WIDTH * BF16, // gelu
        h,                         // mlp proj
    ]
}

/// A GPT-2-like trace (see the module documentation).
pub fn gpt2_trace(shape: Gpt2Shape) -> Trace {
    let mut r = Recorder {
        events: Vec::new(),
        next_addr: 0x1000_0000,
        phase: 0,
        rng: SplitMix64(shape.seed),
    };
    let params: Vec<(u64, u64)> = all_params()
        .into_iter()
        .map(|n| r.alloc(n * BF16))
        .collect();
    let mut adam: Vec<(u64, u64)> = Vec::new();
    for step in 1..=shape.steps {
        r.phase = step;
        let batch = shape.batch;
        let seq = MAX_SEQ - r.rng.next_u64() % (SEQ_CUT + 1);
        let tokens = batch * seq;
        let h = tokens * WIDTH * BF16;
        let ids = r.alloc(tokens * 8);
        let labels = r.alloc(tokens * 8);
        // Forward: embeddings, then checkpointed layers.
        let tok = r.alloc(h);
        let pos = r.alloc(seq * WIDTH * BF16);
        let mut x = r.alloc(h);
        r.free(tok);
        r.free(pos);
        let mut checkpoints = Vec::with_capacity(LAYERS);
        for _ in 0..LAYERS {
            let temps: Vec<_> = layer_temporaries(tokens, batch, seq)
                .into_iter()
                .map(|b| r.alloc(b))
                .collect();
            r.chatter();
            let out = r.alloc(h);
            for t in temps {
                r.free(t);
            }
            checkpoints.push(x);
            x = out;
        }
        let lnf = r.alloc(h);
        let logits = r.alloc(tokens * VOCAB * BF16);
        let logits32 = r.alloc(tokens * VOCAB * F32);
        let shifted = r.alloc(batch * (seq - 1) * VOCAB * F32);
        let logsm = r.alloc(batch * (seq - 1) * VOCAB * F32);
        r.free(shifted);
        let loss = r.alloc(F32);
        r.chatter();
        // Backward through the loss and the head.
        let g_logsm = r.alloc(batch * (seq - 1) * VOCAB * F32);
        r.free(logsm);
        let g_logits32 = r.alloc(tokens * VOCAB * F32);
        r.free(g_logsm);
        r.free(logits32);
        let g_logits = r.alloc(tokens * VOCAB * BF16);
        r.free(g_logits32);
        r.free(logits);
        let mut grads: Vec<Option<(u64, u64)>> = vec![None; params.len()];
        grads[0] = Some(r.alloc(params[0].1));
        let mut g_x = r.alloc(h);
        r.free(g_logits);
        r.free(lnf);
        r.free(x);
        // Backward through the layers: recompute, then gradients.
        for layer in (0..LAYERS).rev() {
            let mut temps: Vec<_> = layer_temporaries(tokens, batch, seq)
                .into_iter()
                .map(|b| r.alloc(b))
                .collect();
            let base = 2 + layer * 12;
            while let Some(t) = temps.pop() {
                let g = r.alloc(t.1);
                r.chatter();
                r.free(t);
                r.free(g);
                let k = temps.len();
                if grads[base + k].is_none() {
                    grads[base + k] = Some(r.alloc(params[base + k].1));
                }
            }
            let g_in = r.alloc(h);
            r.free(g_x);
            r.free(checkpoints.pop().expect("one per layer"));
            g_x = g_in;
        }
        grads[1] = Some(r.alloc(params[1].1));
        for (g, p) in grads.iter_mut().zip(&params) {
            if g.is_none() {
                *g = Some(r.alloc(p.1));
            }
        }
        r.free(g_x);
        r.free(ids);
        r.free(labels);
        r.free(loss);
        // AdamW: states at the first step, foreach temporaries each step.
        if adam.is_empty() {
            for p in &params {
                adam.push(r.alloc(p.1));
                adam.push(r.alloc(p.1));
            }
        }
        let temps: Vec<_> = params.iter().map(|p| r.alloc(p.1)).collect();
        r.chatter();
        for t in temps {
            r.free(t);
        }
        // zero_grad(set_to_none=True).
        for g in grads.into_iter().flatten() {
            r.free(g);
        }
    }
    Trace {
        granularity: 2 << 20,
        events: r.events,
    }
}
