//! The benchmark program: the tests of the GPU memory-manager survey that
//! Gallatin was evaluated on, run for several allocators in one process.
//!
//! - [`allocator`]: the plug-in interface and the allocators compared (ours
//!   on a fixed heap and on CUDA virtual memory, CUDA's device malloc, a
//!   bump-pointer bound).
//! - [`grow`]: bringing a heap that grows to what a test needs, and what
//!   that took.
//! - [`measure`]: one timed round (allocate, check, free) and medians.
//! - [`suite`]: the tests (`single`, `mixed`, `scaling`, `frag`, `oom`,
//!   `init`, `warm`).
//! - [`report`]: records, the summary table, CSV and JSON files.
//! - [`plot`]: PNG figures from the records.
//! - [`graph`]: dynamic-graph update rounds per page source (issue 5).
//! - [`cpu`]: the same tests of our allocator on host threads, when no GPU
//!   is present.

pub mod allocator;
pub mod cpu;
pub mod graph;
pub mod grow;
pub mod measure;
pub mod plot;
pub mod report;
pub mod suite;

/// Bytes in a GiB.
pub const GIB: u64 = 1 << 30;
