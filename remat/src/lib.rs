//! Tensor rematerialization under a memory budget (issue 16): an
//! address-ordered pool, tensor metadata, an op-trace executor that evicts and
//! recomputes, and three eviction policies behind one trait — DTR, DTE and
//! Coop (Zhang et al., "Coop: Memory is not a Commodity", NeurIPS 2023).
//!
//! - [`pool`]: the pool as intervals (free or one resident tensor), `check()`.
//! - [`tensor`]: tensor metadata and residency; [`neighbourhood`]: DTR's
//!   evicted equivalence classes; [`price`]: projected costs and recompute
//!   peaks cached between searches.
//! - [`trace`]: the in-memory op trace; [`synth`]: seeded synthetic traces;
//!   [`recorded`]: traces recorded from PyTorch (`python/remat/record.py`);
//!   [`copy_cost`]: what a device copy costs, measured from a recorded trace.
//! - [`policy`]: the `EvictionPolicy` trait, DTR, DTE, Coop.
//! - [`executor`]: replay, measurements, minimum-budget bisection.
//! - [`compare`]: the policies (with Coop-G) over a trace, as a table; [`sweep`]: the
//!   budget sweep of `gpumalloc remat` (CSV, and a PNG drawn by [`plot`]).
//!
//! Everything here is single-threaded and CPU-only: a simulator of the
//! policies, not an allocator; it owns no GPU memory and uses `lake` only
//! for its PNG encoder (`lake::plan::png`).

pub mod chain_order;
pub mod compare;
pub mod copy_cost;
pub mod dropped_chain;
pub mod error;
pub mod executor;
pub mod neighbourhood;
pub mod plot;
pub mod policy;
pub mod pool;
pub mod price;
pub mod recorded;
pub mod sweep;
pub mod synth;
pub mod tensor;
pub mod trace;

pub use error::{RematError, RematResult};
pub use executor::{
    ReplayOptions, Report, budget_for, min_budget_ratio, replay, steady_min_ratio, steady_minimum,
};
pub use policy::{Coop, Dte, Dtr, EvictionPolicy};
pub use recorded::Recorded;
pub use trace::{CopyCost, Op, OutputSpec, Trace, TraceBuilder};
