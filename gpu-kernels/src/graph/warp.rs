//! Warp-per-vertex updates: [`Graph::insert_warp`] and
//! [`Graph::delete_warp`], the same operations as [`Graph::insert`] and
//! [`Graph::delete`] done by a whole warp for one vertex (faimGraph's way,
//! Winter et al., SC 2018), so a hub vertex's share of a batch is handled by
//! 32 lanes instead of one thread. The one-thread-per-vertex path stays for
//! comparison; both keep the same chain invariant (see [`super::page`]).
//!
//! Ownership (the invariant that replaces "one thread per vertex"): during
//! a kernel each vertex belongs to one warp (a [`super::adjacency::Batch`]
//! lists each source once, one warp per entry). Inside that warp:
//! - the targets go in chunks of one target per lane (insertion: [`ROWS`]
//!   such rows per chunk, appended one after the other);
//! - a chunk first *reads* the chain (every lane walks it), then *writes*
//!   it: lanes write only the edge slots of the new edges they own (distinct
//!   slots), and only the leader (lane 0) writes page headers (`next`,
//!   `count`), the head word, deletion fills, and calls the page source;
//! - a [`arch::warp_sync`] separates the walk's reads from the writes, one
//!   follows each page the leader takes (so its take and header writes
//!   happen before the lanes fill the page), and another ends the chunk (each
//!   row of an insertion chunk), so its writes (by any lane) happen before
//!   the next row's or chunk's reads (by every lane). `ballot`, `shfl` and `match` order no memory on the
//!   GPU; only these syncs are relied on. A page the leader gives back was
//!   last read by the lanes before the sync that precedes the fills, so the
//!   source's release orders those reads before any later owner's writes.
//!
//! Every lane of `mask` executes every collective (`match`, `ballot`,
//! `shfl`, `warp_sync`) in the same order: all branches around them depend
//! on values every lane holds alike (chunk bounds, ballots, shuffled
//! values). `mask` is lanes `0..width` of the warp: `u32::MAX` on the GPU,
//! `arch::ThreadWarp::mask` on the host.
//!
//! Insertion, per chunk of [`ROWS`] targets a lane (rows of one target a
//! lane): `match` drops repeats inside a row; each lane scans every page of
//! the chain for its own targets (a page is one 128-byte line that all lanes
//! read at once, so the reads are broadcasts, and one walk serves up to
//! `ROWS * 32` targets). Then row by row: a later row first rescans the
//! pages the earlier rows appended to (a repeat across rows is there); a
//! `ballot` of the lanes whose target is new gives each new edge its
//! position after the tail (`rank_in`); the leader takes a page when the
//! tail is full and broadcasts it with `shfl`; each lane writes its edge
//! into its slot. With 32 lanes and 29 slots a page, a row needs at most two
//! fresh pages.
//!
//! Deletion, per chunk: each lane finds its target's slot (the hole) while
//! every lane walks the chain and remembers its last [`RING`] pages. The
//! holes are then filled in decreasing position order, each with the
//! chain's current last edge: when a hole is filled, every hole above it has
//! been, so the last edge is either this hole itself (it just goes) or not a
//! hole at all. The leader does the fills; a last page left empty is
//! unlinked and given back, as in [`Graph::delete`].

use super::adjacency::{Graph, GraphError};
use super::page::{EDGES_PER_PAGE, Page};
use super::source::PageSource;
use gpu_kernel::arch::{self, WARP_SIZE};

/// The lane that writes headers and calls the page source.
const LEADER: u32 = 0;

/// Set in a lane's match key when it holds no valid target (past the chunk's
/// end, or an id out of range): with the lane number below it, the key
/// matches no vertex id (< 2^32) and no other lane.
const NOT_A_TARGET: u64 = 1 << 32;

/// Targets per lane in one insertion chunk: one walk of the chain checks
/// `ROWS * 32` targets, so a hub's walks drop by this factor; each page
/// costs every lane `ROWS * EDGES_PER_PAGE` compares of a cached line.
pub const ROWS: usize = 4;

/// Pages of the chain's tail a deletion chunk remembers: its at most
/// `WARP_SIZE` removed positions span at most `(WARP_SIZE - 1) /
/// EDGES_PER_PAGE + 2` pages, and emptying the first of them needs the page
/// before it.
pub const RING: usize = (WARP_SIZE as usize - 1) / EDGES_PER_PAGE + 3;

/// One lane's share of a chunk: its target if it is valid and the first of
/// its value in the chunk.
struct Chunk {
    lane: u32,
    target: Option<u32>,
}

impl Graph {
    /// Lane `lane`'s target in `chunk`, with range errors counted and
    /// repeats inside the chunk dropped (a collective: every lane calls it).
    #[inline(always)]
    fn chunk_target(&self, mask: u32, chunk: &[u64]) -> Chunk {
        let lane = arch::lane_id();
        let raw = chunk.get(lane as usize).copied();
        if raw.is_some_and(|t| t >= self.vertices) {
            self.count_error(GraphError::OutOfRange);
        }
        let valid = raw.filter(|&t| t < self.vertices);
        let key = valid.unwrap_or(NOT_A_TARGET | lane as u64);
        let same = arch::match_any64(mask, key);
        let first = arch::lowest_lane(same) == lane;
        Chunk {
            lane,
            target: valid.filter(|_| first).map(|t| t as u32),
        }
    }

    /// Whether `v` names a vertex (uniform over the warp); the leader counts
    /// an error if not.
    #[inline(always)]
    fn check_warp(&self, v: u64) -> bool {
        let ok = v < self.vertices;
        if !ok && arch::lane_id() == LEADER {
            self.count_error(GraphError::OutOfRange);
        }
        ok
    }

    /// [`Graph::insert`] by the warp `mask` (every lane calls it with the
    /// same `v` and `targets`; see the module docs for the protocol).
    pub fn insert_warp<S: PageSource>(&self, source: &S, mask: u32, v: u64, targets: &[u64]) {
        debug_assert!(mask & 1 != 0 && (mask == u32::MAX || (mask + 1).is_power_of_two()));
        if !self.check_warp(v) {
            return;
        }
        let head = self.head(v);
        let width = mask.count_ones() as usize;
        for chunk in targets.chunks(width * ROWS) {
            // Row `r` of the chunk: its targets `r * width ..`, one a lane.
            let mut rows = [None; ROWS];
            let mut lane = LEADER;
            for (r, row) in rows.iter_mut().enumerate() {
                let part = chunk.get(r * width..).unwrap_or(&[]);
                let c = self.chunk_target(mask, &part[..part.len().min(width)]);
                (lane, *row) = (c.lane, c.target);
            }
            let mut new = rows.map(|t| t.is_some());
            // Relaxed: only this warp touches `v`'s head during the kernel,
            // and the previous chunk's warp_sync (or the kernel boundary)
            // orders its last write before this read.
            let mut page = arch::load_relaxed(head) as *mut Page;
            let mut tail: *mut Page = core::ptr::null_mut();
            // SAFETY: the chain's pages are live pages owned by `v`, and only
            // this warp touches them, writing after the syncs below.
            unsafe {
                while !page.is_null() {
                    let edges = (*page).edges();
                    for (target, new) in rows.iter().zip(&mut new) {
                        if let Some(t) = target
                            && *new
                            && edges.contains(t)
                        {
                            *new = false;
                        }
                    }
                    tail = page;
                    page = (*page).next as *mut Page;
                }
            }
            let walked_to = tail;
            for (r, (&target, &new)) in rows.iter().zip(&new).enumerate() {
                // A later row's target may repeat an earlier row's, which is
                // now in the pages from `walked_to` on (written before the
                // earlier row's closing sync): check those pages again.
                let new = new && (r == 0 || !self.appended(head, walked_to, target));
                tail = self.append_row(source, mask, head, tail, lane, target, new);
            }
        }
    }

    /// Whether `target` is in the pages from `from` to the chain's end (from
    /// the head if `from` is null); false for no target.
    #[inline(always)]
    fn appended(&self, head: &arch::Word, from: *mut Page, target: Option<u32>) -> bool {
        let Some(t) = target else { return false };
        let mut page = if from.is_null() {
            // Relaxed: as in `insert_warp`; an earlier row's first page was
            // stored before that row's closing warp_sync.
            arch::load_relaxed(head) as *mut Page
        } else {
            from
        };
        // SAFETY: as in `insert_warp`.
        unsafe {
            while !page.is_null() {
                if (*page).edges().contains(&t) {
                    return true;
                }
                page = (*page).next as *mut Page;
            }
        }
        false
    }

    /// Appends one row of a chunk after `tail` (the chain's last page, null
    /// for none): the lanes whose `target` is `new` write it into the next
    /// free slots in lane order. Returns the new last page. A collective.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn append_row<S: PageSource>(
        &self,
        source: &S,
        mask: u32,
        head: &arch::Word,
        mut tail: *mut Page,
        lane: u32,
        target: Option<u32>,
        new: bool,
    ) -> *mut Page {
        let fresh = arch::ballot(mask, new);
        if fresh == 0 {
            return tail;
        }
        // SAFETY: `tail` is the chain's live last page or null; its count
        // was written before the last warp_sync.
        let mut used = if tail.is_null() {
            EDGES_PER_PAGE
        } else {
            unsafe { (*tail).count as usize }
        };
        // The walk's reads (every lane) happen before the writes below.
        arch::warp_sync(mask);
        let total = fresh.count_ones() as usize;
        let at = arch::rank_in(fresh, lane) as usize;
        let mut placed = 0;
        while placed < total {
            if used == EDGES_PER_PAGE {
                let mut taken = 0u64;
                if lane == LEADER {
                    taken = self.append_page(source, head, tail) as u64;
                }
                let page = arch::shfl_u64(mask, taken, LEADER) as *mut Page;
                if page.is_null() {
                    if new && at >= placed {
                        self.count_error(GraphError::PageExhausted);
                    }
                    break;
                }
                // The leader's take (the source's acquire) and header
                // writes happen before the lanes write the page's slots;
                // `shfl` alone orders no memory.
                arch::warp_sync(mask);
                tail = page;
                used = 0;
            }
            let n = (EDGES_PER_PAGE - used).min(total - placed);
            // SAFETY: `tail` is the chain's live last page; each lane writes
            // its own slot `used + at - placed < EDGES_PER_PAGE`, the leader
            // the header.
            unsafe {
                if let Some(t) = target
                    && new
                    && (placed..placed + n).contains(&at)
                {
                    (*tail).edges[used + at - placed] = t;
                }
                if lane == LEADER {
                    (*tail).count = (used + n) as u32;
                }
            }
            used += n;
            placed += n;
        }
        // This row's writes happen before the next row's or chunk's reads.
        arch::warp_sync(mask);
        tail
    }

    /// Leader only: takes a page, makes it the empty last page after `tail`
    /// (or the first page of `head` if `tail` is null); null if the source
    /// had none.
    #[inline(always)]
    fn append_page<S: PageSource>(
        &self,
        source: &S,
        head: &arch::Word,
        tail: *mut Page,
    ) -> *mut Page {
        let fresh = source.take();
        if fresh.is_null() {
            return fresh;
        }
        // SAFETY: `fresh` is a page the source gave this warp; `tail` is the
        // chain's live last page, written only by the leader.
        unsafe {
            (*fresh).next = 0;
            (*fresh).count = 0;
            if tail.is_null() {
                // Relaxed: read only by this warp, after its next
                // warp_sync (see the module docs).
                arch::store_relaxed(head, fresh as u64);
            } else {
                (*tail).next = fresh as u64;
            }
        }
        fresh
    }

    /// [`Graph::delete`] by the warp `mask` (every lane calls it with the
    /// same `v` and `targets`; see the module docs for the protocol).
    pub fn delete_warp<S: PageSource>(&self, source: &S, mask: u32, v: u64, targets: &[u64]) {
        debug_assert!(mask & 1 != 0 && (mask == u32::MAX || (mask + 1).is_power_of_two()));
        if !self.check_warp(v) {
            return;
        }
        let head = self.head(v);
        let width = mask.count_ones() as usize;
        for chunk in targets.chunks(width) {
            let Chunk { lane, target } = self.chunk_target(mask, chunk);
            // Relaxed: as in `insert_warp`.
            let mut page = arch::load_relaxed(head) as *mut Page;
            let mut pages = 0u64;
            let mut ring = [core::ptr::null_mut::<Page>(); RING];
            // (page, slot, position in the chain) of this lane's target.
            let mut hole: Option<(*mut Page, u32, u64)> = None;
            // SAFETY: as in `insert_warp`.
            unsafe {
                while !page.is_null() {
                    if let Some(t) = target
                        && hole.is_none()
                        && let Some(slot) = (*page).edges().iter().position(|&e| e == t)
                    {
                        let position = pages * EDGES_PER_PAGE as u64 + slot as u64;
                        hole = Some((page, slot as u32, position));
                    }
                    ring[(pages % RING as u64) as usize] = page;
                    pages += 1;
                    page = (*page).next as *mut Page;
                }
            }
            let holes = arch::ballot(mask, hole.is_some());
            if holes == 0 {
                continue;
            }
            let last = ring[((pages - 1) % RING as u64) as usize];
            // SAFETY: a hole was found, so the chain has a live last page.
            let mut size = (pages - 1) * EDGES_PER_PAGE as u64 + unsafe { (*last).count } as u64;
            // This lane's hole's rank in decreasing position order.
            let position = hole.map_or(0, |h| h.2);
            let mut rank = 0;
            let mut others = holes;
            while others != 0 {
                let other = arch::lowest_lane(others);
                others &= others - 1;
                if arch::shfl_u64(mask, position, other) > position {
                    rank += 1;
                }
            }
            // The walk's reads (every lane) happen before the fills.
            arch::warp_sync(mask);
            for k in 0..holes.count_ones() {
                let src = arch::lowest_lane(arch::ballot(mask, hole.is_some() && rank == k));
                let (at, slot, position) = hole.unwrap_or((core::ptr::null_mut(), 0, 0));
                let at = arch::shfl_u64(mask, at as u64, src) as *mut Page;
                let slot = arch::shfl_u32(mask, slot, src) as usize;
                let position = arch::shfl_u64(mask, position, src);
                if lane == LEADER {
                    // SAFETY: `size - 1` and the pages around it are within
                    // the ring (see `RING`); `at` holds a hole not filled yet.
                    unsafe { self.fill_hole(source, head, &ring, size, at, slot, position) };
                }
                size -= 1;
            }
            // This chunk's writes happen before the next chunk's reads.
            arch::warp_sync(mask);
        }
    }

    /// Leader only: fills the hole at `position` (page `at`, `slot`) of a
    /// chain of `size` edges with its last edge, and unlinks and gives back
    /// the last page if it empties.
    ///
    /// # Safety
    /// `ring[p % RING]` is page `p` of the chain for the last `RING` pages;
    /// `at` is live and `position < size`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    unsafe fn fill_hole<S: PageSource>(
        &self,
        source: &S,
        head: &arch::Word,
        ring: &[*mut Page; RING],
        size: u64,
        at: *mut Page,
        slot: usize,
        position: u64,
    ) {
        let end = size - 1;
        let index = end / EDGES_PER_PAGE as u64;
        let last_slot = (end % EDGES_PER_PAGE as u64) as usize;
        let last = ring[(index % RING as u64) as usize];
        // SAFETY: by the caller's contract.
        unsafe {
            if position != end {
                (*at).edges[slot] = (*last).edges[last_slot];
            }
            (*last).count = last_slot as u32;
            if last_slot == 0 {
                if index == 0 {
                    // Relaxed: as in `append_page`.
                    arch::store_relaxed(head, 0);
                } else {
                    (*ring[((index - 1) % RING as u64) as usize]).next = 0;
                }
                source.give(last);
            }
        }
    }
}
