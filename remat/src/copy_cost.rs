//! What a device-to-device copy costs on the GPU that recorded a trace,
//! measured from the trace itself, so that a move of a resident tensor
//! (Coop's layout rules) is charged as the copy it is rather than as a
//! recomputation of the moved tensor's op (`ReplayOptions::moves_as_copies`).
//!
//! A copy is an element-wise op with one input: it is bound by memory
//! bandwidth, as every contiguous element-wise op is. The bandwidth is the
//! trace's own: over its ops named in [`ELEMENT_WISE`] with one output of at
//! least [`MIN_BYTES`] (launch time amortized) whose every input is a
//! storage of the output's size (no broadcast, no view of a larger storage:
//! contiguous), the bytes they read and write over the time they took. On
//! the four committed H100 traces this is 2,760 (GPT-2), 2,805 (BERT-Large),
//! 2,891 (ResNet-50) and 2,837 (Swin-T) bytes per ns, read plus written
//! (each op's own rate has a median of 2,752–2,951); the H100's HBM3 peaks
//! at 3,350. `aten::clone` is left out: in these traces it copies a strided
//! view into a contiguous tensor (1,610–2,120 bytes per ns), which a move is
//! not; so are the `_foreach_` ops, whose measured time the recorder splits
//! evenly over the tensors of the list. Measured per trace rather than
//! fixed, so that a trace recorded on another GPU is charged that GPU's
//! copies, in the same run's timing as its ops.
//!
//! The floor, [`LAUNCH_NS`], is a constant: a trace has no op that times a
//! launch alone. The smallest single-kernel element-wise ops of the traces
//! (`arange`, a small `add`, `div_`, `bernoulli_`) took 3.3–3.9 µs.
//! Pure functions; no shared state.

use super::trace::{CopyCost, Trace};

/// Element-wise ops whose measured rate stands for a copy's.
pub const ELEMENT_WISE: [&str; 16] = [
    "aten::add.Tensor",
    "aten::add_.Tensor",
    "aten::sub.Tensor",
    "aten::mul.Tensor",
    "aten::mul_.Tensor",
    "aten::mul.Scalar",
    "aten::div.Tensor",
    "aten::div_.Tensor",
    "aten::pow.Tensor_Scalar",
    "aten::gelu",
    "aten::gelu_backward",
    "aten::tanh",
    "aten::tanh_backward",
    "aten::relu",
    "aten::relu_",
    "aten::threshold_backward",
];

/// Smallest output counted: below it, launch time weighs on the rate.
pub const MIN_BYTES: u64 = 1 << 20;

/// The cost of the smallest copy, in ns.
pub const LAUNCH_NS: f64 = 4_000.0;

/// The copy cost of a trace recorded in ns whose op names are `names` (one
/// per op): `None` when it has no op to measure.
pub fn measured(names: &[String], trace: &Trace) -> Option<CopyCost> {
    let sizes: Vec<u64> = trace
        .ops
        .iter()
        .flat_map(|op| op.outputs.iter().map(|o| o.size))
        .collect();
    let (mut bytes, mut time) = (0.0, 0.0);
    for (op, name) in trace.ops.iter().zip(names) {
        let [out] = op.outputs[..] else { continue };
        let contiguous = op.inputs.iter().all(|&i| sizes[i] == out.size);
        if !ELEMENT_WISE.contains(&name.as_str())
            || out.size < MIN_BYTES
            || op.inputs.is_empty()
            || !contiguous
            || op.cost <= 0.0
        {
            continue;
        }
        bytes += ((op.inputs.len() + 1) as u64 * out.size) as f64;
        time += op.cost;
    }
    (time > 0.0).then(|| CopyCost {
        bytes_per_cost: bytes / time,
        launch: LAUNCH_NS,
    })
}
