//! `Page`: the fixed-size unit of a vertex's edge chain.
//!
//! A page is owned by one vertex at a time, and during an update kernel by the
//! one thread that owns that vertex ([`super::adjacency`]), so its fields are
//! plain memory: kernel boundaries (or thread joins on the host) order the
//! writes of one kernel before the reads of the next.
//!
//! Chain invariant: every page but the last is full. Insertion appends at the
//! tail; deletion moves the chain's last edge into the hole, so the chain stays
//! compact and a page is freed exactly when its last edge goes.

/// Bytes of a page: one 128-byte cache line of the GPU's L2.
pub const PAGE_BYTES: usize = 128;

/// Bytes of the page header (`next` and `count`).
const HEADER_BYTES: usize = core::mem::size_of::<u64>() + core::mem::size_of::<u32>();

/// Edge slots in a page.
pub const EDGES_PER_PAGE: usize = (PAGE_BYTES - HEADER_BYTES) / core::mem::size_of::<u32>();

/// A page of edges (destination vertex ids).
///
/// Layout (128 bytes): `next` (8 bytes, address of the next page or 0),
/// `count` (4 bytes, edges in use, `1..=EDGES_PER_PAGE` while chained), then
/// `EDGES_PER_PAGE` = 29 edge slots of 4 bytes; slots `count..` are garbage.
#[repr(C)]
pub struct Page {
    /// Address of the next page of the chain, 0 for the last.
    pub next: u64,
    /// Edges in use.
    pub count: u32,
    /// Destination vertex ids; the first `count` are valid.
    pub edges: [u32; EDGES_PER_PAGE],
}

const _: () = assert!(core::mem::size_of::<Page>() == PAGE_BYTES);

impl Page {
    /// Whether no slot is left.
    #[inline(always)]
    pub fn is_full(&self) -> bool {
        self.count as usize == EDGES_PER_PAGE
    }

    /// The valid edges.
    #[inline(always)]
    pub fn edges(&self) -> &[u32] {
        &self.edges[..self.count as usize]
    }
}
