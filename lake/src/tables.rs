//! The lake's tables and the driver work that changes them: chunks, the
//! views that map them, and the index of free runs. No policy here (that is
//! `pool.rs`): this file keeps the tables consistent and undoes half-done
//! driver work.
//!
//! - A **chunk** is one granule of physical memory (`cuMemCreate`), used by
//!   at most one live allocation, else free.
//! - A **view** is a virtual reservation with chunks mapped in its slots.
//!   A chunk has exactly one **home** slot, in a home view: home views are
//!   large reservations (the lake's limit) filled from the low end as the
//!   lake grows, like PyTorch's expandable segments, so chunks made one
//!   after another are contiguous at home and free neighbours form long
//!   runs by themselves. A **stitched** view (GMLake's sBlock) maps chunks
//!   from anywhere back to back; it costs no physical memory.
//! - A **window** is `len` consecutive slots of one view whose chunks are
//!   all free: any window can serve an allocation of `len` chunks with no
//!   driver call, whether it is a whole view, a prefix of a stitched view
//!   made for a larger request, or a stretch of home slots. An allocation
//!   touches only its own bytes, so the other chunks of the view stay free
//!   and serve other allocations through their other mappings.
//! - A chunk is **used** when the bit of its home slot is clear: each home
//!   view keeps one bit per slot, set while the slot holds a free chunk
//!   (`tables/free_bits.rs`), the one record of use. A **run** is a
//!   maximal stretch of slots holding free chunks.
//! - Taking or giving back a window changes the bits of its home stretches
//!   only (a stitched window's home stretches are its pieces,
//!   `tables/pieces.rs`) and the run index entries around them: a few
//!   updates, whatever the window's length and however many views map its
//!   chunks.
//! - A stitched view's runs are not stored: they are read through its
//!   pieces from the home bits when asked for ([`Tables::stitched_runs`]),
//!   and only a view of a size that may serve the request is asked.
//! - The **run index** lists every run of every home view by length. Best
//!   fit is the shortest run of at least `n`, lowest view and slot among
//!   equals, of the home index and of the stitched views not much larger
//!   than `n` ([`TIGHT`]), whose chunks the requester may reuse (their
//!   fences admit it: always so on one stream).
//!
//! The driver work that makes and unmakes chunks and views (growth,
//! stitching, patching, unmapping, release), all or nothing with rollback,
//! is in `tables/mapping.rs`.
//!
//! Concurrency: none of its own; the tables live inside the lake's state
//! mutex and every method runs under that lock.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;

use super::addr_map::AddrMap;
use super::driver::ChunkHandle;
use super::fence::{Fence, Progress, Requester};

mod free_bits;
mod mapping;
mod pieces;
mod stitched_list;
#[cfg(test)]
mod tests;

use free_bits::FreeBits;
pub use mapping::Spill;
use pieces::Piece;
pub use stitched_list::StitchedList;

/// A stitched view of `m` chunks serves a request of `n` only if
/// `m <= n + n / TIGHT + 1`: a view made for one tensor is reused by the
/// same tensor at the next step even if that is up to a quarter smaller
/// (sequence lengths vary so), but not eaten by a much smaller request
/// that a home window can serve, which would leave the big tensor to
/// stitch anew at every step (seen on the GPT-2 traces: 1500 chunks, about
/// 60 ms of `cuMemSetAccess`, per step).
pub const TIGHT: usize = 3;

/// A stitched view of `n` chunks reserves address space for
/// `n + n / EXTEND_ROOM + 1` (GPT-2's sequence lengths vary by a quarter
/// from step to step, so the logits of a longer step fit): address space
/// costs no memory, and only the new slots are mapped.
pub const EXTEND_ROOM: usize = 2;

/// Index of a chunk: its place in the [`ChunkSlab`], reused after the chunk
/// is released.
pub type ChunkId = u64;
/// Index of a view.
pub type ViewId = u64;

/// One physical chunk.
#[derive(Debug)]
pub struct Chunk {
    /// The driver's handle.
    pub handle: ChunkHandle,
    /// Whether it lives in host memory: made by the spill when the device
    /// was full (`LakeConfig::spill_to_host`). Mapped and used like any
    /// other.
    pub on_host: bool,
    /// Its home view and slot. Whether a live allocation uses it is read
    /// from there ([`Tables::is_used`]).
    pub home: (ViewId, usize),
    /// While free: who may reuse it (see `fence.rs`).
    pub fence: Fence,
    /// Stitched views mapping it, with its slot in each.
    pub stitched: StitchedList,
}

/// A virtual reservation with chunks mapped in its slots.
#[derive(Debug)]
pub struct View {
    /// Start of the reservation.
    pub base: u64,
    /// The chunk mapped at each slot (home views have empty slots).
    pub slots: Vec<Option<ChunkId>>,
    /// Stitched (else home).
    pub stitched: bool,
    /// Live allocations served by a window of this view.
    pub users: usize,
    /// Lake clock when an allocation last left it (for the LRU sweep).
    pub last_used: u64,
    /// Home views: slots at and above this were never filled.
    pub filled_to: usize,
    /// Slots the reservation has room for. Home views: `slots.len()`.
    /// Stitched views reserve more than they map, so that a longer
    /// tensor of the same kind (a longer sequence's logits) extends the
    /// view at its end (`Tables::extend`) instead of stitching anew.
    pub reserved: usize,
    /// Slots holding a chunk (a home view with none left is freed).
    pub occupied: usize,
    /// Stitched views: the fences of every free of a window of this view
    /// since it was mapped, joined: GPU work submitted before those frees may still
    /// read and write through its addresses, so a slot of it is unmapped
    /// only once this fence is settled (`Lake`'s remap rule).
    pub fence: Fence,
    /// Home views: one bit per slot, set while it holds a free chunk: the
    /// record of use. Its maximal stretches of set bits are the view's
    /// runs (listed in the run index). Stitched views: empty (see
    /// [`Tables::stitched_runs`]).
    free: FreeBits,
    /// Stitched views: its stretches of consecutive home slots, by slot.
    /// Shared with the index by size, where best fit reads them without
    /// looking the view up.
    pieces: Arc<[Piece]>,
}

/// `len` consecutive slots of a view, from `start`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Window {
    /// The view.
    pub view: ViewId,
    /// First slot.
    pub start: usize,
    /// Slots.
    pub len: usize,
}

/// Where new chunks go at home.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// `count` slots at the never-filled end of a home view.
    Tail(ViewId, usize),
    /// `count` emptied slots (lowest first), wherever they are.
    Holes(usize),
    /// A new home view of `capacity` slots, `count` filled from its start.
    NewView {
        /// Slots of the new view.
        capacity: usize,
        /// Chunks to make.
        count: usize,
    },
}

/// Driver resources that could not be returned when asked (a release or
/// address free failed after the mapping was gone). Kept and retried on the
/// next [`Tables::retry_orphans`], so nothing is lost.
#[derive(Debug, Default)]
struct Orphans {
    /// Handles, and whether each lives in host memory.
    chunks: Vec<(ChunkHandle, bool)>,
    reservations: Vec<(u64, u64)>,
}

/// The live chunks, by id. Ids are indices into a vector and are reused
/// after a release, so a lookup is one index: the hash map this replaced
/// was the top of the replay's profile (every chunk of a window is looked
/// up when the window is taken and given back). Ids are never kept past a
/// release: views' slots and chunks' stitched lists drop them first.
#[derive(Debug, Default)]
pub struct ChunkSlab {
    entries: Vec<Option<Chunk>>,
    vacant: Vec<ChunkId>,
    len: usize,
}

impl ChunkSlab {
    /// Stores `chunk` and returns its id.
    fn add(&mut self, chunk: Chunk) -> ChunkId {
        self.len += 1;
        match self.vacant.pop() {
            Some(id) => {
                self.entries[id as usize] = Some(chunk);
                id
            }
            None => {
                self.entries.push(Some(chunk));
                self.entries.len() as ChunkId - 1
            }
        }
    }

    /// Takes chunk `id` out; its id may be handed out again.
    fn remove(&mut self, id: &ChunkId) -> Option<Chunk> {
        let chunk = self.entries.get_mut(*id as usize)?.take()?;
        self.vacant.push(*id);
        self.len -= 1;
        Some(chunk)
    }

    /// Live chunks.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no chunk is live.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn get_mut(&mut self, id: &ChunkId) -> Option<&mut Chunk> {
        self.entries.get_mut(*id as usize)?.as_mut()
    }

    fn values(&self) -> impl Iterator<Item = &Chunk> {
        self.entries.iter().flatten()
    }

    fn keys(&self) -> impl Iterator<Item = ChunkId> + '_ {
        self.iter().map(|(id, _)| id)
    }

    fn iter(&self) -> impl Iterator<Item = (ChunkId, &Chunk)> {
        self.entries
            .iter()
            .enumerate()
            .filter_map(|(i, c)| c.as_ref().map(|c| (i as ChunkId, c)))
    }

    fn get(&self, id: &ChunkId) -> Option<&Chunk> {
        self.entries.get(*id as usize)?.as_ref()
    }
}

impl std::ops::Index<&ChunkId> for ChunkSlab {
    type Output = Chunk;

    fn index(&self, id: &ChunkId) -> &Chunk {
        self.entries
            .get(*id as usize)
            .and_then(Option::as_ref)
            .expect("live chunk")
    }
}

/// All chunks and views of a lake.
#[derive(Debug, Default)]
pub struct Tables {
    granularity: u64,
    chunks: ChunkSlab,
    views: BTreeMap<ViewId, View>,
    /// Every free run of every home view, as (length, view, start).
    runs: RunIndex,
    /// Every stitched view, as (slots, view), with its pieces: the ones of
    /// a size that may serve a request are those best fit asks for their
    /// runs.
    stitched_by_size: BTreeMap<(usize, ViewId), Arc<[Piece]>>,
    /// Stitched views no allocation uses (what the LRU sweep may drop).
    idle_stitched: usize,
    /// Home slots emptied by a release, as (view, slot).
    holes: BTreeSet<(ViewId, usize)>,
    free_chunks: usize,
    /// Chunks of `chunks` in host memory (spilled).
    host_chunks: usize,
    /// Chunks ever made in host memory.
    spills: u64,
    /// Per stream, free chunks whose fence names it (to skip fence checks
    /// when no fence can keep the requester out: one stream).
    fenced: AddrMap<usize>,
    orphans: Orphans,
    next_id: u64,
    /// Reused list of `mark` (empty between calls): the window's home
    /// stretches, as (view, first slot, slots). Every alloc and free goes
    /// through it, and a heap allocation there touches the allocator's
    /// cold lines too.
    homes: Vec<(ViewId, usize, usize)>,
    /// Reused list of a window's chunks for the fences of `take` and
    /// `give` (empty between calls).
    window_chunks: Vec<ChunkId>,
    /// Reused list of `take`: per stream, the fenced chunks it made used
    /// (empty between calls).
    unfenced: Vec<(u64, usize)>,
}

/// The run index of the home views: every run as (length, view, start),
/// ordered so, kept as one 128-bit key per run (length, view and start
/// in 32 bits each: slots are below a home view's 2^19 and view ids fit
/// in 32 bits, see `stitched_list.rs`): one comparison per step of a
/// search instead of three, and half the bytes per tree node.
#[derive(Debug, Default, PartialEq, Eq)]
struct RunIndex(BTreeSet<u128>);

fn run_key(len: usize, v: ViewId, start: usize) -> u128 {
    let field = |x: u64| u128::from(u32::try_from(x).expect("runs and view ids fit in 32 bits"));
    field(len as u64) << 64 | field(v) << 32 | field(start as u64)
}

fn run_of(key: u128) -> (usize, ViewId, usize) {
    let low = |shift: u32| (key >> shift) as u32;
    (low(64) as usize, ViewId::from(low(32)), low(0) as usize)
}

impl RunIndex {
    fn insert(&mut self, (len, v, start): (usize, ViewId, usize)) {
        self.0.insert(run_key(len, v, start));
    }

    fn remove(&mut self, &(len, v, start): &(usize, ViewId, usize)) {
        self.0.remove(&run_key(len, v, start));
    }

    /// Runs of at least `n` slots, shortest first (lowest view and start
    /// among equals).
    fn at_least(&self, n: usize) -> impl Iterator<Item = (usize, ViewId, usize)> + '_ {
        self.0.range(run_key(n, 0, 0)..).map(|&k| run_of(k))
    }

    fn iter(&self) -> impl DoubleEndedIterator<Item = (usize, ViewId, usize)> + '_ {
        self.0.iter().map(|&k| run_of(k))
    }
}

/// Slots `[a, b)` of home view `view` (id `v`) stop being free: they lie
/// in one run (they were all free and are consecutive), which is cut
/// around them; `index` follows. The run's ends are found in the free
/// bits (a few word reads for runs of a few hundred slots).
///
/// A function of the view and the index, not of the tables, so that a
/// caller holding the view does not look it up again: every large alloc
/// cuts, with cold caches inside a training loop.
fn cut(view: &mut View, index: &mut RunIndex, v: ViewId, a: usize, b: usize) {
    let bits = &mut view.free;
    debug_assert!(
        bits.free_until(a) >= b,
        "view {v}: slots {a}..{b} taken but not free"
    );
    let (start, end) = (bits.free_from(a), bits.free_until(b));
    bits.put(a, b, false);
    index.remove(&(end - start, v, start));
    if a > start {
        index.insert((a - start, v, start));
    }
    if end > b {
        index.insert((end - b, v, b));
    }
}

/// Slots `[a, b)` of home view `view` (id `v`) become free: they join
/// their neighbours' runs; `index` follows.
fn join(view: &mut View, index: &mut RunIndex, v: ViewId, a: usize, b: usize) {
    let bits = &mut view.free;
    debug_assert!(
        (a..b).all(|i| !bits.get(i)),
        "view {v}: slots {a}..{b} freed twice"
    );
    let (start, end) = (bits.free_from(a), bits.free_until(b));
    bits.put(a, b, true);
    if a > start {
        index.remove(&(a - start, v, start));
    }
    if end > b {
        index.remove(&(end - b, v, b));
    }
    index.insert((end - start, v, start));
}

/// Groups sorted slots into runs of consecutive ones: (start, length).
fn consecutive(slots: &[usize]) -> Vec<(usize, usize)> {
    let mut out: Vec<(usize, usize)> = Vec::new();
    for &s in slots {
        match out.last_mut() {
            Some((start, len)) if *start + *len == s => *len += 1,
            _ => out.push((s, 1)),
        }
    }
    out
}

impl Tables {
    /// Most runs [`Tables::best_window`] looks at.
    pub const SCAN_RUNS: usize = 64;

    /// Empty tables for chunks of `granularity` bytes.
    pub fn new(granularity: u64) -> Tables {
        Tables {
            granularity,
            next_id: 1,
            ..Tables::default()
        }
    }

    fn id(&mut self) -> u64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Live chunks, the ones an orphaned release still holds included.
    pub fn chunk_count(&self) -> usize {
        self.chunks.len() + self.orphans.chunks.len()
    }

    /// Live chunks in host memory (spilled), orphans included.
    pub fn host_chunk_count(&self) -> usize {
        self.host_chunks + self.orphans.chunks.iter().filter(|(_, h)| *h).count()
    }

    /// Live chunks in device memory, orphans included: what the lake's
    /// limit caps.
    pub fn device_chunk_count(&self) -> usize {
        self.chunk_count() - self.host_chunk_count()
    }

    /// Chunks ever made in host memory.
    pub fn spills(&self) -> u64 {
        self.spills
    }

    /// Free chunks.
    pub fn free_chunks(&self) -> usize {
        self.free_chunks
    }

    /// A view.
    pub fn view(&self, id: ViewId) -> &View {
        &self.views[&id]
    }

    /// All views.
    pub fn views(&self) -> impl Iterator<Item = (ViewId, &View)> {
        self.views.iter().map(|(&id, v)| (id, v))
    }

    /// A chunk.
    pub fn chunk(&self, id: ChunkId) -> &Chunk {
        &self.chunks[&id]
    }

    /// The device address of a window's first byte.
    pub fn addr_of(&self, w: Window) -> u64 {
        self.views[&w.view].base + self.granularity * w.start as u64
    }

    /// The chunks of a window, in order.
    pub fn chunks_in(&self, w: Window) -> impl Iterator<Item = ChunkId> + '_ {
        self.views[&w.view].slots[w.start..w.start + w.len]
            .iter()
            .map(|c| c.expect("a window's slots hold chunks"))
    }

    /// The home address of a chunk.
    pub fn home_addr(&self, c: ChunkId) -> u64 {
        let (v, slot) = self.chunks[&c].home;
        self.views[&v].base + self.granularity * slot as u64
    }

    /// The best-fit window of `n` chunks for `req`: in the shortest free
    /// run of at least `n` (lowest view and slot among equals) of a home
    /// view or of a stitched view of at most `n + n / TIGHT + 1` slots, the
    /// first `n` consecutive chunks whose fences admit `req`. Runs are
    /// looked at in best-fit order, at most [`Tables::SCAN_RUNS`] of them
    /// (fenced chunks are rare outside multi-stream programs).
    pub fn best_window(&self, n: usize, req: &Requester<'_>) -> Option<Window> {
        let stitched = self
            .stitched_by_size
            .range((n, 0)..=(n + n / TIGHT + 1, ViewId::MAX));
        // Checked once, not per run: with no fence in the way (one stream)
        // the first run that fits is the answer, with no list built.
        if self.all_admit(req) {
            let mut best = self.runs.at_least(n).next();
            for (&(m, id), pieces) in stitched {
                // Once a run of exactly n is found, only a view of a lower
                // id can do better (a run of n there, lower in the order).
                if best.is_some_and(|(len, view, _)| len == n && view < id) {
                    continue;
                }
                let mut offer = |run: (usize, ViewId, usize)| {
                    if run.0 >= n && best.is_none_or(|b| run < b) {
                        best = Some(run);
                    }
                };
                if m < 2 * n {
                    // One run at most can hold n: the one holding m - n.
                    if let Some((start, len)) = self.stitched_run_at(pieces, m - n) {
                        offer((len, id, start));
                    }
                } else {
                    self.pieces_runs(pieces, |start, len| offer((len, id, start)));
                }
            }
            return best.map(|(_, view, start)| Window {
                view,
                start,
                len: n,
            });
        }
        let mut runs: Vec<(usize, ViewId, usize)> =
            self.runs.at_least(n).take(Self::SCAN_RUNS).collect();
        for (&(_, id), pieces) in stitched {
            self.pieces_runs(pieces, |start, len| {
                if len >= n {
                    runs.push((len, id, start));
                }
            });
        }
        runs.sort_unstable();
        runs.truncate(Self::SCAN_RUNS);
        runs.into_iter().find_map(|(len, view, start)| {
            self.admitted_segments(view, start, len, req)
                .into_iter()
                .find(|&(_, l)| l >= n)
                .map(|(start, _)| Window {
                    view,
                    start,
                    len: n,
                })
        })
    }

    /// The run of free slots of a stitched view with `pieces` holding slot `k`, as
    /// (start, length); `None` if `k` is not free. Found from the piece
    /// holding `k`, extended piece by piece while the free stretch reaches
    /// a piece's end: for a view of fewer than `2n` slots, the only run
    /// that can hold `n` chunks is the one holding slot `m - n`, so best
    /// fit asks this instead of reading every piece.
    fn stitched_run_at(&self, pieces: &[Piece], k: usize) -> Option<(usize, usize)> {
        let mut home: Option<(ViewId, &FreeBits)> = None;
        let mut bits_of = |h: ViewId| match home {
            Some((id, bits)) if id == h => bits,
            _ => {
                let bits = &self.views[&h].free;
                home = Some((h, bits));
                bits
            }
        };
        let i = pieces.partition_point(|p| p.at + p.len <= k);
        let p = pieces[i];
        let bits = bits_of(p.home);
        let hk = p.home_at + (k - p.at);
        if !bits.get(hk) {
            return None;
        }
        let mut start = p.at + (bits.free_from(hk).max(p.home_at) - p.home_at);
        let mut end = p.at + (bits.free_until(hk).min(p.home_at + p.len) - p.home_at);
        let mut j = i;
        while j > 0 && start == pieces[j].at {
            let q = pieces[j - 1];
            let q_end = q.home_at + q.len;
            let from = bits_of(q.home).free_from(q_end).max(q.home_at);
            if from == q_end {
                break;
            }
            start = q.at + (from - q.home_at);
            j -= 1;
        }
        let mut j = i;
        while j + 1 < pieces.len() && end == pieces[j].at + pieces[j].len {
            let q = pieces[j + 1];
            let until = bits_of(q.home).free_until(q.home_at).min(q.home_at + q.len);
            if until == q.home_at {
                break;
            }
            end = q.at + (until - q.home_at);
            j += 1;
        }
        Some((start, end - start))
    }

    /// Calls `f(start, len)` for each run of free slots of stitched view
    /// `v`, in slot order: each piece's free stretches at home (a few word
    /// reads of its home view's free bits), joined across pieces.
    pub fn stitched_runs(&self, v: ViewId, f: impl FnMut(usize, usize)) {
        self.pieces_runs(&self.views[&v].pieces, f);
    }

    /// [`Tables::stitched_runs`] of a view with `pieces`.
    fn pieces_runs(&self, pieces: &[Piece], mut f: impl FnMut(usize, usize)) {
        let mut open: Option<(usize, usize)> = None;
        let mut home: Option<(ViewId, &FreeBits)> = None;
        for p in pieces {
            let bits = match home {
                Some((h, bits)) if h == p.home => bits,
                _ => {
                    let bits = &self.views[&p.home].free;
                    home = Some((p.home, bits));
                    bits
                }
            };
            bits.free_stretches(p.home_at, p.home_at + p.len, |s, len| {
                let at = p.at + (s - p.home_at);
                match &mut open {
                    Some((start, l)) if *start + *l == at => *l += len,
                    _ => {
                        if let Some((start, l)) = open {
                            f(start, l);
                        }
                        open = Some((at, len));
                    }
                }
            });
        }
        if let Some((start, l)) = open {
            f(start, l);
        }
    }

    /// Whether every free chunk's fence admits `req` for sure: none names
    /// another stream (always so in a one-stream program). O(streams).
    fn all_admit(&self, req: &Requester<'_>) -> bool {
        self.fenced
            .iter()
            .all(|(&stream, &n)| n == 0 || stream == req.stream)
    }

    /// Sets the fence of chunk `c`, keeping the per-stream counts (which
    /// count free chunks only: a used chunk's fence is none).
    fn set_fence(&mut self, c: ChunkId, fence: Fence) {
        let chunk = self.chunks.get_mut(&c).expect("live chunk");
        for s in chunk.fence.streams() {
            *self.fenced.get_mut(&s).expect("counted") -= 1;
        }
        for s in fence.streams() {
            *self.fenced.entry(s).or_default() += 1;
        }
        chunk.fence = fence;
    }

    /// The stretches of a free run whose chunks admit `req`, as (start,
    /// length).
    fn admitted_segments(
        &self,
        view: ViewId,
        start: usize,
        len: usize,
        req: &Requester<'_>,
    ) -> Vec<(usize, usize)> {
        if self.all_admit(req) {
            return vec![(start, len)];
        }
        let slots = &self.views[&view].slots[start..start + len];
        let ok: Vec<usize> = slots
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                let c = c.expect("runs hold chunks");
                self.chunks[&c].fence.admits(req)
            })
            .map(|(i, _)| start + i)
            .collect();
        consecutive(&ok)
    }

    /// Free chunks `req` may reuse.
    pub fn admitted_free(&self, req: &Requester<'_>) -> usize {
        if self.all_admit(req) {
            return self.free_chunks;
        }
        self.chunks
            .iter()
            .filter(|&(id, c)| c.fence.admits(req) && !self.is_used(id))
            .count()
    }

    /// Free chunks some stream may not reuse yet (pending fences).
    pub fn pending_free(&self, progress: &Progress) -> usize {
        self.chunks
            .iter()
            .filter(|&(id, c)| c.fence.pending(progress) && !self.is_used(id))
            .count()
    }

    /// The longest free run of any view, in chunks (0 when none).
    pub fn longest_run(&self) -> usize {
        let mut longest = self.runs.iter().next_back().map_or(0, |(len, _, _)| len);
        for pieces in self.stitched_by_size.values() {
            self.pieces_runs(pieces, |_, len| longest = longest.max(len));
        }
        longest
    }

    /// Stretches of free home chunks `req` may reuse, as (length, view,
    /// start), longest first.
    pub fn home_runs_longest_first(&self, req: &Requester<'_>) -> Vec<(usize, ViewId, usize)> {
        let mut out: Vec<(usize, ViewId, usize)> = self
            .runs
            .iter()
            .flat_map(|(len, view, start)| {
                self.admitted_segments(view, start, len, req)
                    .into_iter()
                    .map(move |(s, l)| (l, view, s))
            })
            .collect();
        out.sort_unstable_by(|a, b| b.cmp(a));
        out
    }

    /// Home views with never-filled slots, as (view, free run ending at
    /// the filled end, never-filled slots).
    pub fn home_tails(&self) -> Vec<(ViewId, usize, usize)> {
        self.views
            .iter()
            .filter(|(_, v)| !v.stitched && v.filled_to < v.slots.len())
            .map(|(&id, v)| {
                let tail_run = v.filled_to - v.free.free_from(v.filled_to);
                (id, tail_run, v.slots.len() - v.filled_to)
            })
            .collect()
    }

    /// Stitched views no allocation uses: while they are within the
    /// cache's limit, a sweep has nothing to look at.
    pub fn idle_stitched(&self) -> usize {
        self.idle_stitched
    }

    /// Emptied home slots available for new chunks.
    pub fn hole_count(&self) -> usize {
        self.holes.len()
    }

    /// Marks a window's chunks used by one more allocation; returns its
    /// view (the caller need not look it up again).
    pub fn take(&mut self, w: Window) -> &View {
        // Chunks made used lose their fence. With no fenced free chunk at
        // all (a one-stream program freeing behind no fence) there is none
        // to clear, and the window's chunks are not visited.
        if self.fenced.values().any(|&n| n > 0) {
            self.unfence(w);
        }
        self.mark(w, true);
        let view = self.views.get_mut(&w.view).expect("live view");
        if view.stitched && view.users == 0 {
            self.idle_stitched -= 1;
        }
        view.users += 1;
        view
    }

    /// Clears the fences of window `w`'s chunks, keeping the per-stream
    /// counts.
    fn unfence(&mut self, w: Window) {
        let chunks = self.window_chunks(w);
        let mut unfenced = std::mem::take(&mut self.unfenced);
        for &c in &chunks {
            let chunk = self.chunks.get_mut(&c).expect("live chunk");
            for s in chunk.fence.streams() {
                // Counted here and applied once below: one lookup per
                // stream instead of one per chunk.
                match unfenced.iter_mut().find(|(t, _)| *t == s) {
                    Some((_, n)) => *n += 1,
                    None => unfenced.push((s, 1)),
                }
            }
            chunk.fence = Fence::none();
        }
        for (s, n) in unfenced.drain(..) {
            *self.fenced.get_mut(&s).expect("counted") -= n;
        }
        self.unfenced = unfenced;
        self.window_chunks = chunks;
    }

    /// The chunks of window `w`, in the reused list (to be put back in
    /// `self.window_chunks` after use).
    fn window_chunks(&mut self, w: Window) -> Vec<ChunkId> {
        let mut chunks = std::mem::take(&mut self.window_chunks);
        chunks.clear();
        chunks.extend(self.chunks_in(w));
        chunks
    }

    /// Marks view `v` as used at `clock` (for the LRU sweep).
    pub fn touch(&mut self, v: ViewId, clock: u64) {
        self.views.get_mut(&v).expect("live view").last_used = clock;
    }

    /// Marks a window's chunks free again behind `fence`; the view
    /// remembers `clock`.
    pub fn give(&mut self, w: Window, clock: u64, fence: &Fence) {
        self.mark(w, false);
        // Used chunks carry no fence: only the new one is set and counted,
        // and behind no fence there is nothing to set.
        if !fence.is_none() {
            for s in fence.streams() {
                *self.fenced.entry(s).or_default() += w.len;
            }
            let chunks = self.window_chunks(w);
            for &c in &chunks {
                self.chunks.get_mut(&c).expect("live chunk").fence = fence.clone();
            }
            self.window_chunks = chunks;
        }
        let v = self.views.get_mut(&w.view).expect("live view");
        v.users -= 1;
        v.last_used = clock;
        if v.stitched && v.users == 0 {
            self.idle_stitched += 1;
        }
        if v.stitched {
            // Home views are never unmapped as views: a chunk leaves its
            // home only by `release_chunk`, under the chunk's own fence.
            v.fence.join(fence);
        }
    }

    /// Whether work submitted before the frees of view `v`'s windows may
    /// still use its addresses (its fence is not settled by `progress`).
    pub fn view_in_flight(&self, v: ViewId, progress: &Progress) -> bool {
        self.views[&v].fence.pending(progress)
    }

    /// Whether a live allocation uses chunk `c`: its home slot lies in no
    /// free run of its home view.
    pub fn is_used(&self, c: ChunkId) -> bool {
        let (v, slot) = self.chunks[&c].home;
        !self.views[&v].free.get(slot)
    }

    fn set_used(&mut self, c: ChunkId, used: bool) {
        let (view, start) = self.chunks[&c].home;
        self.mark(
            Window {
                view,
                start,
                len: 1,
            },
            used,
        );
    }

    /// Marks the chunks of window `w` (all of the other state) used or
    /// free: the bits and runs of its home stretches change (a stitched
    /// window's are its pieces), and with them every view's, since a
    /// stitched view's runs are read from there. The caller keeps the
    /// fences.
    fn mark(&mut self, w: Window, used: bool) {
        let (a, b) = (w.start, w.start + w.len);
        let view = self.views.get_mut(&w.view).expect("live view");
        if !view.stitched {
            // One stretch, of the view already at hand.
            if used {
                cut(view, &mut self.runs, w.view, a, b);
            } else {
                join(view, &mut self.runs, w.view, a, b);
            }
        } else {
            let mut homes = std::mem::take(&mut self.homes);
            homes.extend(pieces::homes_of(&view.pieces, a, b));
            for &(h, at, len) in &homes {
                let home = self.views.get_mut(&h).expect("live view");
                if used {
                    cut(home, &mut self.runs, h, at, at + len);
                } else {
                    join(home, &mut self.runs, h, at, at + len);
                }
            }
            homes.clear();
            self.homes = homes;
        }
        if used {
            self.free_chunks -= w.len;
        } else {
            self.free_chunks += w.len;
        }
    }

    /// Recomputes the pieces of stitched view `v` from its slots and its
    /// place in the index by size; forgets it if it was dropped. After a
    /// stitch, patch, extension or drop.
    fn repiece(&mut self, v: ViewId) {
        self.stitched_by_size.retain(|&(_, id), _| id != v);
        if let Some(view) = self.views.get_mut(&v) {
            view.pieces = pieces::pieces_of(
                view.slots
                    .iter()
                    .map(|c| self.chunks[&c.expect("stitched views are full")].home),
            )
            .into();
            self.stitched_by_size
                .insert((view.slots.len(), v), Arc::clone(&view.pieces));
        }
    }

    /// Slots `[a, b)` of home view `v` stop being free (see [`cut`]).
    fn run_cut(&mut self, v: ViewId, a: usize, b: usize) {
        let view = self.views.get_mut(&v).expect("live view");
        cut(view, &mut self.runs, v, a, b);
    }

    /// The slots of `[0, n)` of stitched view `v` whose chunks `req` cannot
    /// take now (used, or fenced against it).
    pub fn bad_prefix_slots(&self, v: ViewId, n: usize, req: &Requester<'_>) -> Vec<usize> {
        self.views[&v].slots[..n]
            .iter()
            .enumerate()
            .filter(|(_, c)| {
                let c = c.expect("stitched views are full");
                self.is_used(c) || !self.chunks[&c].fence.admits(req)
            })
            .map(|(i, _)| i)
            .collect()
    }

    /// Up to `k` free chunks `req` may take that view `v` does not map,
    /// from home runs, longest runs first.
    pub fn replacements(&self, v: ViewId, k: usize, req: &Requester<'_>) -> Vec<ChunkId> {
        let mine: std::collections::HashSet<ChunkId> =
            self.views[&v].slots.iter().flatten().copied().collect();
        let mut out = Vec::with_capacity(k);
        for (len, view, start) in self.home_runs_longest_first(req) {
            for c in self.chunks_in(Window { view, start, len }) {
                if out.len() == k {
                    return out;
                }
                if !mine.contains(&c) {
                    out.push(c);
                }
            }
        }
        out
    }

    /// Free chunks mapped nowhere but at home whose every stream's work is
    /// complete.
    pub fn releasable(&self, progress: &Progress) -> Vec<ChunkId> {
        let mut out: Vec<ChunkId> = self
            .chunks
            .iter()
            .filter(|&(id, c)| {
                c.stitched.is_empty() && !c.fence.pending(progress) && !self.is_used(id)
            })
            .map(|(id, _)| id)
            .collect();
        out.sort_unstable();
        out
    }

    /// Checks the tables' invariants; the first broken one, in words.
    /// What is derived is recomputed from scratch and compared: a home
    /// view's bits must be set over chunks only, each stitched view's
    /// runs as read through its pieces must be those of its slots whose
    /// chunks are free (looked up one by one), the run index must list the
    /// home views' runs (recomputed slot by slot), the pieces and the index
    /// by size must follow the slots. Which chunks are used is checked against the live
    /// allocations by `Lake::check`.
    pub fn check(&self) -> Result<(), String> {
        for (cid, c) in self.chunks.iter() {
            let (v, s) = c.home;
            let view = self
                .views
                .get(&v)
                .ok_or(format!("chunk {cid}: dead home view"))?;
            if view.stitched || view.slots.get(s) != Some(&Some(cid)) {
                return Err(format!("chunk {cid} is not at its home slot"));
            }
            for (v, s) in c.stitched.iter() {
                let view = self
                    .views
                    .get(&v)
                    .ok_or(format!("chunk {cid}: dead view {v}"))?;
                if !view.stitched || view.slots.get(s) != Some(&Some(cid)) {
                    return Err(format!("chunk {cid} is not at slot {s} of view {v}"));
                }
            }
        }
        let mut all_runs = BTreeSet::new();
        for (&vid, v) in &self.views {
            let occupied = v.slots.iter().flatten().count();
            if occupied != v.occupied {
                return Err(format!(
                    "view {vid}: {occupied} chunks, counted {}",
                    v.occupied
                ));
            }
            let mut free = Vec::new();
            for (i, slot) in v.slots.iter().enumerate() {
                let Some(c) = slot else {
                    if v.stitched {
                        return Err(format!("stitched view {vid} has an empty slot {i}"));
                    }
                    if i < v.filled_to && !self.holes.contains(&(vid, i)) {
                        return Err(format!("view {vid}: empty slot {i} is not a hole"));
                    }
                    continue;
                };
                let chunk = self
                    .chunks
                    .get(c)
                    .ok_or(format!("view {vid} maps dead chunk {c}"))?;
                let place = (vid, i);
                if chunk.home != place && !chunk.stitched.contains(&place) {
                    return Err(format!("view {vid} slot {i}: chunk {c} does not know it"));
                }
                if !v.stitched && i >= v.filled_to {
                    return Err(format!("view {vid}: slot {i} filled above filled_to"));
                }
                // A home view's bits are the record of use; a stitched
                // view's slot is free if its chunk's home slot is.
                let free_here = if v.stitched {
                    !self.is_used(*c)
                } else {
                    v.free.get(i)
                };
                if free_here {
                    free.push(i);
                } else if !chunk.fence.is_none() {
                    return Err(format!("used chunk {c} keeps a fence"));
                }
            }
            let want: BTreeMap<usize, usize> = consecutive(&free).into_iter().collect();
            let got = if v.stitched {
                if v.free != FreeBits::default() {
                    return Err(format!("stitched view {vid} keeps free bits"));
                }
                let mut got = BTreeMap::new();
                self.stitched_runs(vid, |s, l| {
                    got.insert(s, l);
                });
                if self
                    .stitched_by_size
                    .get(&(v.slots.len(), vid))
                    .is_none_or(|p| !Arc::ptr_eq(p, &v.pieces))
                {
                    return Err(format!("stitched view {vid} is not indexed by its size"));
                }
                got
            } else {
                // Bits over empty slots would make runs the slots lack.
                let mut got = BTreeMap::new();
                v.free.free_stretches(0, v.slots.len(), |s, l| {
                    got.insert(s, l);
                });
                all_runs.extend(want.iter().map(|(&s, &l)| (l, vid, s)));
                got
            };
            if want != got {
                return Err(format!("view {vid}: runs differ from its free slots"));
            }
            let pieces = if v.stitched {
                pieces::pieces_of(
                    v.slots
                        .iter()
                        .map(|c| self.chunks[&c.expect("checked: stitched views are full")].home),
                )
            } else {
                Vec::new()
            };
            if pieces[..] != v.pieces[..] {
                return Err(format!("view {vid}: pieces differ from its slots"));
            }
        }
        if all_runs.into_iter().ne(self.runs.iter()) {
            return Err("the global run index differs from the views' runs".into());
        }
        let stitched = self.views.values().filter(|v| v.stitched).count();
        if stitched != self.stitched_by_size.len() {
            return Err("the index by size lists dead stitched views".into());
        }
        let idle = self
            .views
            .values()
            .filter(|v| v.stitched && v.users == 0)
            .count();
        if idle != self.idle_stitched {
            return Err(format!(
                "{idle} idle stitched views, counted {}",
                self.idle_stitched
            ));
        }
        let mut fenced: HashMap<u64, usize> = HashMap::new();
        for c in self.chunks.values() {
            for s in c.fence.streams() {
                *fenced.entry(s).or_default() += 1;
            }
        }
        for (s, &n) in &self.fenced {
            if fenced.get(s).copied().unwrap_or(0) != n {
                return Err(format!("stream {s}: {n} fenced chunks counted"));
            }
        }
        let on_host = self.chunks.values().filter(|c| c.on_host).count();
        if on_host != self.host_chunks {
            return Err(format!(
                "{on_host} chunks in host memory, counted {}",
                self.host_chunks
            ));
        }
        let free = self.chunks.keys().filter(|&id| !self.is_used(id)).count();
        if free != self.free_chunks {
            return Err(format!("{free} free chunks counted {}", self.free_chunks));
        }
        Ok(())
    }
}
