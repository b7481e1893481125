//! Tensors kept from eviction because their recomputation would run through
//! a chain of tensors the program is consuming as it goes
//! (`keep_dropped_chains` of Coop, DTR and DTE; not in the papers; on in
//! Coop, off in the others; `--chain-ablation`).
//!
//! A tensor is *on a dropped chain* when one of its inputs has been dropped
//! by the program and that dropped input was itself made from a tensor that
//! is dropped too, or that the running op holds (locked). Such is a
//! gradient in the backward pass: it was made from the incoming gradient,
//! which the program drops once it is used, and that one from the gradient
//! before it, dropped the same way, back to the loss. Its recomputation
//! needs the whole chain back, and the chain grows with every op the
//! program runs after the eviction, so no price taken at the eviction sees
//! it. On ResNet-50 at 0.32 Coop evicted one 196 MiB gradient, made at op
//! 845 and read at op 854, whose only dropped input was one op deep when
//! it was evicted (that input's own input was held by the running op, op
//! 846, and dropped after it); at op 854 bringing it back recomputed 250
//! tensors, much of the step, and the replay ran out of memory in that
//! chain. In the forward pass a dropped input (a BatchNorm output overwritten
//! in place by its ReLU) was made from a tensor the program keeps for the
//! backward pass, so a forward activation is not on a dropped chain.
//!
//! The first version asked for two links (a dropped input made from a
//! dropped or held tensor). In the transformers' forward passes, and where
//! their backward passes begin, such short chains are common (GPT-2 ran
//! out of memory at 0.8 with nothing evictable), so a tensor now needs a
//! path of [`CHAIN_DEPTH`] links; a gradient deep in a backward pass has
//! one as long as the layers behind it.
//!
//! Reads the tensor table only (inputs, residency, locks): at most
//! [`CHAIN_DEPTH`] levels of inputs per tensor asked about, a failed
//! (tensor, depth) not walked twice. Single-threaded.

use super::tensor::{Residency, TensorId, TensorTable};

/// Links of a dropped chain that must lead up from a tensor before it
/// counts as on one (module docs). In the forward passes, and near the loss,
/// chains of dropped tensors are a few links long; with 2, 3 or 4 GPT-2
/// ran out of memory at 0.8 (nothing it could evict where the backward pass
/// begins), and 6 to 24 gave the same replays on the four traces at the
/// ratios probed (ResNet-50 at 0.3195, 0.33, 0.35; GPT-2 at 0.8, 0.5, 0.4;
/// BERT-Large at 0.5, 0.4; Swin-T at 0.5, 0.3).
pub const CHAIN_DEPTH: u32 = 8;

/// Whether `t` is on a dropped chain (module docs): it has an input dropped
/// because its last use passed, from which a path of [`CHAIN_DEPTH`] links
/// in all (tensors dropped the same way, or held by the running op) leads
/// up the graph.
pub fn on_dropped_chain(tensors: &TensorTable, t: TensorId) -> bool {
    let Ok(tensor) = tensors.get(t) else {
        return false;
    };
    // (tensor, links still needed) from which no path was found: a
    // residual add joins two chains that meet again further up.
    let mut failed = Vec::new();
    tensor
        .inputs
        .iter()
        .any(|&d| dropped(tensors, d) && reaches(tensors, d, CHAIN_DEPTH - 1, &mut failed))
}

/// Dropped because its last use passed, not overwritten in place.
fn dropped(tensors: &TensorTable, i: TensorId) -> bool {
    !tensors.is_overwritten(i)
        && tensors
            .get(i)
            .is_ok_and(|x| matches!(x.residency, Residency::Released))
}

/// Whether a path of `left` more links (dropped as above, or held by the
/// running op) leads up from `t`'s inputs.
fn reaches(
    tensors: &TensorTable,
    t: TensorId,
    left: u32,
    failed: &mut Vec<(TensorId, u32)>,
) -> bool {
    if left == 0 {
        return true;
    }
    if failed.iter().any(|&(f, l)| f == t && l <= left) {
        return false;
    }
    let held = |e: TensorId| tensors.state(e).is_ok_and(|s| s.locks > 0 && !s.pinned);
    let found = tensors.get(t).is_ok_and(|x| {
        x.inputs
            .iter()
            .any(|&e| (dropped(tensors, e) || held(e)) && reaches(tensors, e, left - 1, failed))
    });
    if !found {
        failed.push((t, left));
    }
    found
}
