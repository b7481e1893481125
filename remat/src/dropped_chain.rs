//! Tensors kept from eviction because their recomputation would run through
//! a chain of tensors the program is consuming as it goes
//! (`keep_dropped_chains` of Coop, DTR and DTE; not in the papers; off by
//! default: in the transformers' forward passes too a tensor can have a
//! dropped input made from a dropped one, and with the rule on Coop's
//! minimum budget on GPT-2 rose from 0.360 to 0.917; `--chain-ablation`).
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
//! Reads the tensor table only (inputs, residency, locks): two levels of
//! inputs per tensor asked about. Single-threaded.

use super::tensor::{Residency, TensorId, TensorTable};

/// Whether `t` is on a dropped chain (module docs).
pub fn on_dropped_chain(tensors: &TensorTable, t: TensorId) -> bool {
    // Dropped because its last use passed, not overwritten in place.
    let dropped = |i: TensorId| {
        !tensors.is_overwritten(i)
            && tensors
                .get(i)
                .is_ok_and(|x| matches!(x.residency, Residency::Released))
    };
    let Ok(tensor) = tensors.get(t) else {
        return false;
    };
    tensor.inputs.iter().any(|&d| {
        dropped(d)
            && tensors.get(d).is_ok_and(|x| {
                x.inputs.iter().any(|&e| {
                    dropped(e) || tensors.state(e).is_ok_and(|s| s.locks > 0 && !s.pinned)
                })
            })
    })
}
