//! The order in which an op, or a recomputation, brings back its inputs
//! (`AddedRules::order_inputs`; not in the papers; off by default
//! since the held-tensor move joined it, see `policy::coop`;
//! `--chain-ablation`): the resident
//! inputs first, so that they are locked before anything is recomputed and
//! no search evicts them while a sibling's chain runs, then the missing
//! ones, the one whose recomputation holds the most bytes beyond its own
//! first (Sethi and Ullman's order for evaluating an expression tree with
//! the fewest registers, here bytes).
//!
//! Why: the executor holds each recomputed input until its consumer runs.
//! In program order, an input whose chain is short is brought back first
//! and then held, locked, through the long chain of a later sibling. On
//! ResNet-50 at 0.32 the chain of one stage-2 input reaches back to the
//! stem through every stage-1 block: at each residual add one 196 MiB
//! branch was recomputed and locked before the other's long chain began,
//! and four of them (882 MiB, half the pool) were locked at once when the
//! stem's output found no room. A resident input later in the list, not
//! yet locked, could also be evicted during that chain and then cost a
//! chain of its own (a backward-pass gradient, whose chain runs back
//! through every gradient the program has dropped since the loss).
//!
//! The bytes a missing tensor's recomputation needs at its peak, `need`,
//! are computed over the graph of missing tensors as a tree (a tensor
//! shared by two branches is counted in both; an upper bound on a DAG),
//! with each tensor's inputs in the order this module gives them:
//! `need(t) = max(max_k(held_k + need(m_k)), held_all + size(t))`, where
//! the `m_k` are its missing inputs in order and `held_k` the bytes of
//! those before `m_k`. Ordering by `need(m) - size(m)`, descending, makes
//! that maximum smallest (the exchange argument of Sethi and Ullman).
//! Within one call each tensor's need is computed once (memoized), by an
//! explicit stack, so a chain as long as the trace costs time linear in
//! it and no call-stack depth.
//!
//! Reads the tensor table only; single-threaded, called by the executor.

use std::collections::HashMap;

use super::tensor::{TensorId, TensorTable};

/// `inputs` (an op's, or a recomputed tensor's), reordered: the resident
/// ones first, in their order, then the missing ones by `need - size`,
/// descending (ties in their order). A permutation: duplicates stay, so
/// that locks taken and released per entry still balance.
pub fn ordered_inputs(tensors: &TensorTable, inputs: &[TensorId]) -> Vec<TensorId> {
    let mut needs = HashMap::new();
    let mut order: Vec<TensorId> = inputs
        .iter()
        .copied()
        .filter(|&i| tensors.is_resident(i))
        .collect();
    let mut missing: Vec<(u64, usize, TensorId)> = Vec::new();
    for (k, &i) in inputs.iter().enumerate() {
        if !tensors.is_resident(i) {
            let beyond = need(tensors, i, &mut needs).saturating_sub(size(tensors, i));
            missing.push((beyond, k, i));
        }
    }
    // Descending by bytes beyond its own, then in input order.
    missing.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
    order.extend(missing.into_iter().map(|(_, _, i)| i));
    order
}

fn size(tensors: &TensorTable, t: TensorId) -> u64 {
    tensors.get(t).map_or(0, |t| t.size)
}

/// The distinct missing inputs of `t`.
fn missing_inputs(tensors: &TensorTable, t: TensorId) -> Vec<TensorId> {
    let mut found = Vec::new();
    if let Ok(tensor) = tensors.get(t) {
        for &i in &tensor.inputs {
            if !tensors.is_resident(i) && !found.contains(&i) {
                found.push(i);
            }
        }
    }
    found
}

/// The bytes resident at once, at the peak, while the missing tensor `root`
/// is recomputed with its missing inputs in this module's order (module
/// docs), memoized in `needs`.
pub fn need(tensors: &TensorTable, root: TensorId, needs: &mut HashMap<TensorId, u64>) -> u64 {
    if let Some(&n) = needs.get(&root) {
        return n;
    }
    // Post-order over the missing graph: a tensor is settled once all its
    // missing inputs are. `expanded` marks tensors whose inputs were pushed.
    let mut stack = vec![(root, false)];
    while let Some((t, expanded)) = stack.pop() {
        if needs.contains_key(&t) {
            continue;
        }
        let missing = missing_inputs(tensors, t);
        if !expanded {
            stack.push((t, true));
            // A tensor on the stack already (a cycle cannot occur: inputs are
            // made before their consumers) is settled before it is read.
            stack.extend(
                missing
                    .iter()
                    .filter(|m| !needs.contains_key(m))
                    .map(|&m| (m, false)),
            );
            continue;
        }
        let mut beyond: Vec<(u64, u64)> = missing
            .iter()
            .map(|&m| {
                let n = needs.get(&m).copied().unwrap_or(0);
                let s = size(tensors, m);
                (n.saturating_sub(s), s)
            })
            .collect();
        beyond.sort_by_key(|b| std::cmp::Reverse(b.0));
        let (mut held, mut peak) = (0u64, 0u64);
        for (extra, s) in beyond {
            peak = peak.max(held + s + extra);
            held += s;
        }
        needs.insert(t, peak.max(held + size(tensors, t)));
    }
    needs.get(&root).copied().unwrap_or(0)
}
