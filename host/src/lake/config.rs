//! `LakeConfig`: the limits and policies a user chooses for a lake.
//!
//! Concurrency: a plain value, copied into the lake at creation.

/// Limits of a lake. Sizes are in bytes; the lake works in whole chunks of
/// the driver's granularity and rounds limits down to them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LakeConfig {
    /// Most physical memory the lake may hold.
    pub limit_bytes: u64,
    /// Primitive blocks smaller than this are never split and never take
    /// part in a stitch: they are reused only by an exact match. At the
    /// default (0) every block may be split or stitched.
    pub min_split_bytes: u64,
    /// Most chunks in one stitched block (mapping cost grows with the chunk
    /// count). Larger requests are served by primitive blocks only.
    pub max_stitch_chunks: usize,
    /// Most inactive stitched blocks kept cached; the least recently used
    /// beyond this are unmapped and their address ranges freed.
    pub max_cached_stitched: usize,
}

impl LakeConfig {
    /// Default cap on chunks per stitched block: 1 GiB of 2 MiB chunks.
    pub const DEFAULT_MAX_STITCH_CHUNKS: usize = 512;
    /// Default number of cached inactive stitched blocks.
    pub const DEFAULT_MAX_CACHED_STITCHED: usize = 256;

    /// A lake of at most `limit_bytes` physical bytes, defaults otherwise.
    pub fn with_limit(limit_bytes: u64) -> LakeConfig {
        LakeConfig {
            limit_bytes,
            min_split_bytes: 0,
            max_stitch_chunks: Self::DEFAULT_MAX_STITCH_CHUNKS,
            max_cached_stitched: Self::DEFAULT_MAX_CACHED_STITCHED,
        }
    }
}
