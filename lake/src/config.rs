//! `LakeConfig`: the limits and policies a user chooses for a lake.
//!
//! Concurrency: a plain value, copied into the lake at creation.

/// Limits of a lake. Sizes are in bytes; the lake works in whole chunks of
/// the driver's granularity and rounds limits down to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LakeConfig {
    /// Most physical memory the lake may hold.
    pub limit_bytes: u64,
    /// Most chunks in one stitched view (mapping cost grows with the chunk
    /// count). Larger requests are served by runs of chunks at home only.
    /// Unlimited by default: a request that stitches once is served by
    /// the cached view afterwards, and a cap would make large requests
    /// (a GPT-2 batch's logits exceed 1 GiB) grow the lake instead.
    pub max_stitch_chunks: usize,
    /// Most unused stitched views kept cached; the least recently used
    /// beyond this are unmapped and their address ranges freed.
    pub max_cached_stitched: usize,
    /// When the driver runs out of device memory making a chunk
    /// (`cuMemCreate`'s `CUDA_ERROR_OUT_OF_MEMORY`), make it in host memory
    /// instead ([`super::VmmDriver::create_on_host`]), mapped at the same
    /// place and granted to the device: allocations keep their addresses
    /// and kernels their results, only slower. For profiling a workload
    /// that does not quite fit (the planned mode's profile). Spilled chunks
    /// are counted apart ([`super::LakeStats::spilled_bytes`]), not as
    /// reserved, and not under `limit_bytes`, which caps device memory:
    /// with the spill on, chunks past the limit go to host memory too (so
    /// a limit below the device's size simulates a smaller device). Off by
    /// default.
    pub spill_to_host: bool,
}

impl LakeConfig {
    /// Default cap on chunks per stitched view: none.
    pub const DEFAULT_MAX_STITCH_CHUNKS: usize = usize::MAX;
    /// Default number of cached unused stitched views.
    pub const DEFAULT_MAX_CACHED_STITCHED: usize = 256;

    /// A lake of at most `limit_bytes` physical bytes, defaults otherwise.
    pub fn with_limit(limit_bytes: u64) -> LakeConfig {
        LakeConfig {
            limit_bytes,
            max_stitch_chunks: Self::DEFAULT_MAX_STITCH_CHUNKS,
            max_cached_stitched: Self::DEFAULT_MAX_CACHED_STITCHED,
            spill_to_host: false,
        }
    }
}
