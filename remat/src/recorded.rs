//! Reads an op trace that `python/remat/record.py` recorded from a real
//! PyTorch training step into a [`Trace`].
//!
//! The format ("gpumalloc-remat-trace" version 1) is text, one record a line,
//! usually gzip-compressed (the reader looks at the first two bytes):
//!
//! ```text
//! gpumalloc-remat-trace 1
//! meta KEY VALUE                     any number, free-form, kept as strings
//! op NAME COST_NS FLAG | IN ... | OUT ... | FREE ...
//! ```
//!
//! - One tensor is one *storage* (a view is its base's storage), or one
//!   version of it: an op that writes a storage in place makes a new version.
//!   Tensors are numbered by the order in which ops make them, as [`Trace`]
//!   numbers them; `IN` and `FREE` are such numbers.
//! - `COST_NS` is the op's measured time in nanoseconds (CUDA events on the
//!   GPU, the CPU clock on the CPU); `FLAG` is `i` for an op whose first output
//!   is a new version of its first input (in place), else `-`.
//! - `OUT` is each output's storage size in bytes, with a `p` suffix when it
//!   is pinned (parameters, their gradients, optimizer state, the input batch:
//!   everything that existed before the step, and what is still a parameter's
//!   gradient or an optimizer's state at its end).
//! - `FREE` lists the tensors whose storage died after this op; an in-place
//!   op lists its first input there (that version is overwritten). Tensors
//!   never freed live to the end of the step.
//!
//! The trace's [`CopyCost`](super::trace::CopyCost) is measured from its
//! element-wise ops (`copy_cost`).
//!
//! Sizes are rounded up to [`ALIGN`] bytes, the block size of PyTorch's CUDA
//! caching allocator, so that the pool sees what the device would.
//! The reader checks that the trace is well formed (reads only made and not
//! yet freed tensors, frees each tensor at most once, no size 0) and says on
//! which line it is not. Pure functions; no shared state.

use std::io::Read as _;
use std::path::Path;

use super::copy_cost;
use super::error::{RematError, RematResult};
use super::trace::{Op, OutputSpec, Trace};

/// The first line of a trace.
pub const MAGIC: &str = "gpumalloc-remat-trace";
/// The version this reader understands.
pub const VERSION: u32 = 1;
/// Sizes are rounded up to this many bytes (PyTorch's CUDA block size).
pub const ALIGN: u64 = 512;

/// A recorded trace with what the recorder said about it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Recorded {
    /// The ops, costs in nanoseconds.
    pub trace: Trace,
    /// The op names (`aten::mm`, `leaf`...), one per op.
    pub names: Vec<String>,
    /// The `meta` lines, in order.
    pub meta: Vec<(String, String)>,
    /// The ops named in [`METADATA_ONLY`] that list an input, in order.
    pub metadata_ops: Vec<usize>,
}

/// Ops whose output depends on their inputs' shape, dtype and device only,
/// never on their values: `x.new_empty(shape)` for the drop-path mask of a
/// Swin block (then filled by `bernoulli_`), `x.new_zeros(...)`,
/// `torch.ones_like(loss)` for the seed of the backward pass. The recorder
/// lists the tensor they were called on as an input, and the replay takes
/// it for a data input: recomputing Swin-T's 256-byte drop-path mask then
/// recomputes the block's MLP output it was shaped after, and the 294 MiB
/// GELU output and the MLP's first output before that.
/// [`Recorded::without_metadata_inputs`] gives the trace without those
/// inputs (not the default: `compare::metadata_ablation`).
pub const METADATA_ONLY: [&str; 9] = [
    "aten::new_empty",
    "aten::new_empty_strided",
    "aten::new_zeros",
    "aten::new_ones",
    "aten::new_full",
    "aten::empty_like",
    "aten::zeros_like",
    "aten::ones_like",
    "aten::full_like",
];

impl Recorded {
    /// The value of a `meta` key, if the trace has one.
    pub fn meta(&self, key: &str) -> Option<&str> {
        self.meta
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The trace with the inputs of its [`METADATA_ONLY`] ops left out, so
    /// that a replay neither keeps the tensor such an op was called on
    /// resident to run it nor recomputes that tensor to recompute its
    /// output (which reads none of its values).
    pub fn without_metadata_inputs(&self) -> Trace {
        let mut trace = self.trace.clone();
        for &op in &self.metadata_ops {
            trace.ops[op].inputs.clear();
        }
        trace
    }

    /// Reads a trace file, gzip-compressed or not.
    pub fn read(path: &Path) -> RematResult<Recorded> {
        let bytes = std::fs::read(path)
            .map_err(|e| RematError::BadTrace(format!("{}: {e}", path.display())))?;
        Recorded::from_bytes(&bytes)
            .map_err(|e| RematError::BadTrace(format!("{}: {e}", path.display())))
    }

    /// Parses a trace from its bytes, gzip-compressed or not.
    pub fn from_bytes(bytes: &[u8]) -> RematResult<Recorded> {
        if bytes.starts_with(&[0x1f, 0x8b]) {
            let mut text = String::new();
            flate2::read::MultiGzDecoder::new(bytes)
                .read_to_string(&mut text)
                .map_err(|e| RematError::BadTrace(format!("gzip: {e}")))?;
            Recorded::parse(&text)
        } else {
            let text = std::str::from_utf8(bytes)
                .map_err(|e| RematError::BadTrace(format!("not UTF-8: {e}")))?;
            Recorded::parse(text)
        }
    }

    /// Parses a trace's text.
    pub fn parse(text: &str) -> RematResult<Recorded> {
        let mut lines = text.lines().enumerate();
        let header = lines.next().map(|(_, l)| l.trim()).unwrap_or_default();
        let version = header
            .strip_prefix(MAGIC)
            .and_then(|v| v.trim().parse::<u32>().ok());
        if version != Some(VERSION) {
            return Err(RematError::BadTrace(format!(
                "first line is {header:?}, expected \"{MAGIC} {VERSION}\""
            )));
        }
        let mut reader = Reader::default();
        for (index, line) in lines {
            let line = line.trim();
            let at = |why: String| RematError::BadTrace(format!("line {}: {why}", index + 1));
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(rest) = line.strip_prefix("meta ") {
                let (key, value) = rest.split_once(' ').unwrap_or((rest, ""));
                reader
                    .out
                    .meta
                    .push((key.to_string(), value.trim().to_string()));
            } else if let Some(rest) = line.strip_prefix("op ") {
                reader.op(rest).map_err(at)?;
            } else {
                return Err(at(format!("unknown record {line:?}")));
            }
        }
        let mut out = reader.out;
        out.trace.copy = copy_cost::measured(&out.names, &out.trace);
        Ok(out)
    }
}

/// The parse state: what has been made, freed and how big it is.
#[derive(Default)]
struct Reader {
    out: Recorded,
    sizes: Vec<u64>,
    freed: Vec<bool>,
}

impl Reader {
    fn op(&mut self, rest: &str) -> Result<(), String> {
        let mut fields = rest.split('|');
        let head: Vec<&str> = fields
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        let [name, cost, flag] = head[..] else {
            return Err(format!("expected NAME COST_NS FLAG, got {head:?}"));
        };
        let cost: f64 = cost
            .parse()
            .ok()
            .filter(|c: &f64| c.is_finite() && *c >= 0.0)
            .ok_or_else(|| format!("bad cost {cost:?}"))?;
        let in_place = match flag {
            "i" => true,
            "-" => false,
            _ => return Err(format!("bad flag {flag:?} (i or -)")),
        };
        let mut list = || fields.next().unwrap_or_default().split_whitespace();
        let inputs = list().map(id).collect::<Result<Vec<_>, _>>()?;
        let outputs = list().map(output).collect::<Result<Vec<_>, _>>()?;
        let frees = list().map(id).collect::<Result<Vec<_>, _>>()?;
        if fields.next().is_some() {
            return Err("more than four fields".into());
        }
        for (k, &input) in inputs.iter().enumerate() {
            if input >= self.sizes.len() {
                return Err(format!("reads tensor {input} before it is made"));
            }
            if self.freed[input] {
                return Err(format!("reads tensor {input} after it was freed"));
            }
            if inputs[..k].contains(&input) {
                return Err(format!("reads tensor {input} twice"));
            }
        }
        if in_place {
            let (Some(&source), Some(out)) = (inputs.first(), outputs.first()) else {
                return Err("in-place op without an input and an output".into());
            };
            if !frees.contains(&source) {
                return Err(format!("in-place op does not free its input {source}"));
            }
            if out.size > self.sizes[source] {
                return Err(format!(
                    "in-place output of {} bytes is larger than its input {source}",
                    out.size
                ));
            }
        }
        self.sizes.extend(outputs.iter().map(|o| o.size));
        self.freed.extend(outputs.iter().map(|_| false));
        for &t in &frees {
            match self.freed.get_mut(t) {
                None => return Err(format!("frees tensor {t} before it is made")),
                Some(true) => return Err(format!("frees tensor {t} twice")),
                Some(f) => *f = true,
            }
        }
        if !in_place && !inputs.is_empty() && METADATA_ONLY.contains(&name) {
            self.out.metadata_ops.push(self.out.trace.ops.len());
        }
        self.out.names.push(name.to_string());
        self.out.trace.ops.push(Op {
            inputs,
            outputs,
            cost,
            in_place,
            frees,
        });
        Ok(())
    }
}

fn id(field: &str) -> Result<usize, String> {
    field
        .parse()
        .map_err(|_| format!("bad tensor id {field:?}"))
}

fn output(field: &str) -> Result<OutputSpec, String> {
    let (digits, pinned) = match field.strip_suffix('p') {
        Some(d) => (d, true),
        None => (field, false),
    };
    let size: u64 = digits
        .parse()
        .map_err(|_| format!("bad output size {field:?}"))?;
    if size == 0 {
        return Err("output of size 0".into());
    }
    Ok(OutputSpec {
        size: size.div_ceil(ALIGN) * ALIGN,
        pinned,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const SMALL: &str = "gpumalloc-remat-trace 1
meta model tiny mlp
op leaf 0 - | | 4096p |
op leaf 0 - | | 100p |
op aten::mm 2500 - | 0 1 | 1000 |
op aten::relu_ 300 i | 2 | 1000 | 2
op aten::sum 100 - | 3 | 4 | 3
";

    #[test]
    fn parses_ops_rounds_sizes_and_keeps_meta() -> RematResult<()> {
        let r = Recorded::parse(SMALL)?;
        assert_eq!(r.meta("model"), Some("tiny mlp"));
        assert_eq!(
            r.names,
            ["leaf", "leaf", "aten::mm", "aten::relu_", "aten::sum"]
        );
        let ops = &r.trace.ops;
        assert_eq!(ops.len(), 5);
        assert_eq!(ops[1].outputs[0].size, ALIGN, "100 bytes take one block");
        assert!(ops[0].outputs[0].pinned && !ops[2].outputs[0].pinned);
        assert!(ops[3].in_place && ops[3].frees == vec![2]);
        assert_eq!(ops[2].inputs, vec![0, 1]);
        assert_eq!(r.trace.total_cost(), 2900.0);
        assert_eq!(r.trace.peak_live_bytes(), 4096 + 512 + 1024 + 512);
        Ok(())
    }

    #[test]
    fn metadata_only_ops_lose_their_inputs_on_request() -> RematResult<()> {
        let text = "gpumalloc-remat-trace 1
op leaf 0 - | | 4096p |
op aten::mm 2500 - | 0 | 8192 |
op aten::new_empty 100 - | 1 | 512 |
op aten::bernoulli_.float 100 i | 2 | 512 | 2
op aten::mul.Tensor 100 - | 1 3 | 8192 | 1 3
";
        let r = Recorded::parse(text)?;
        assert_eq!(
            r.metadata_ops,
            vec![2],
            "new_empty; bernoulli_ reads values"
        );
        assert_eq!(r.trace.ops[2].inputs, vec![1], "as recorded by default");
        let t = r.without_metadata_inputs();
        assert!(t.ops[2].inputs.is_empty());
        assert_eq!(t.ops[3].inputs, vec![2]);
        assert_eq!(t.ops[4].inputs, vec![1, 3]);
        Ok(())
    }

    #[test]
    fn gzip_and_plain_text_read_the_same() -> RematResult<()> {
        use std::io::Write as _;
        let mut z = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        z.write_all(SMALL.as_bytes()).expect("memory");
        let gz = z.finish().expect("memory");
        assert_eq!(Recorded::from_bytes(&gz)?, Recorded::parse(SMALL)?);
        Ok(())
    }

    #[test]
    fn malformed_traces_say_which_line() {
        let bad = |body: &str| {
            let text = format!("gpumalloc-remat-trace 1\nop leaf 0 - | | 64 |\n{body}\n");
            match Recorded::parse(&text) {
                Err(RematError::BadTrace(why)) => why,
                other => panic!("{body:?} parsed: {other:?}"),
            }
        };
        assert!(bad("op a 1 - | 1 | 8 |").contains("line 3: reads tensor 1 before"));
        assert!(bad("op a 1 - | 0 | 8 | 0\nop b 1 - | 0 | 8 |").contains("after it was freed"));
        assert!(bad("op a 1 i | 0 | 8 |").contains("does not free its input"));
        assert!(bad("op a 1 - | 0 0 | 8 |").contains("twice"));
        assert!(bad("op a 1 - | 0 | 0 |").contains("size 0"));
        assert!(bad("op a x - | 0 | 8 |").contains("bad cost"));
        assert!(bad("frob").contains("unknown record"));
        assert!(matches!(
            Recorded::parse("something else 1\n"),
            Err(RematError::BadTrace(_))
        ));
    }
}
