//! `StreamPool`: the lake and the split cache behind the stream rule, with
//! private pools for CUDA graphs: the allocator PyTorch calls.
//!
//! Rules:
//! - **routing**: requests under one lake chunk go to a [`SplitCache`]
//!   (pieces of chunks taken from the lake); larger ones to the lake
//!   (exact match, split, stitch, grow). A request for a private pool
//!   ([`StreamPool::alloc_in`]) is served from that pool's store for the
//!   asking stream, else from the lake, and its block stays the pool's;
//! - **one stream**: while a single stream has used the pool, its frees
//!   record no event (nobody else may take its memory); when a second
//!   stream appears, one event is recorded behind them (when no window is
//!   open) and the stream rule below applies from then on;
//! - **stream rule** (fences, `lake/fence.rs`): `free(addr, S)` records an
//!   event on S and on every stream added with
//!   [`StreamPool::record_stream`], numbers the free on each (per-stream
//!   sequence) and gives the block back to the split cache or the lake at
//!   once behind a fence of those numbers: S may reuse it at once for any
//!   request if S is its only user (its later work is ordered after the
//!   free), any other stream once the events are seen complete. Events of
//!   one stream complete in order, so each `alloc` polls every stream's
//!   oldest events until one is not complete; at most
//!   [`MAX_EVENTS_PER_STREAM`] events per stream are kept (beyond, the
//!   oldest is dropped: its frees then wait for a later event, which is
//!   safe). A private block returns to its store (its pool and stream) the
//!   same way, fenced only by the streams added with `record_stream`;
//! - **split chunks**: a general split-cache chunk whose pieces are all
//!   free goes back to the lake at once (one spare kept), where it serves
//!   any size;
//! - **reuse cache** ([`ReuseCache`], off unless
//!   [`StreamPool::set_reuse_entries`] turns it on; `torch-alloc` does): a
//!   freed block of the general pool (a split piece, or a large block of
//!   at most [`reuse::MAX_BLOCK_CHUNKS`] chunks) waits, whole and behind
//!   its fence, for a request of the same capacity, which takes it before
//!   the split cache or the lake is asked. When a miss needs the lake and
//!   no window of its free chunks fits as they lie, when memory runs
//!   short and on `empty_cache`, the whole cache goes home first (pieces
//!   to the split cache, blocks to the lake), so the lake patches,
//!   stitches or grows only seeing every free chunk: the cache never makes
//!   the pool reserve more. Private pools and the plan never use it;
//! - **remapping waits for the device**: the lake never unmaps a stitched
//!   view while work queued before one of its frees may still use its
//!   addresses (its remap rule, `lake/pool.rs`; on one stream that is until
//!   the pool waits for the device, since no event is recorded). When a
//!   placement would patch such a view ([`Lake::placement_waits`]), the
//!   pool waits for the device first (not while a window is open), so the
//!   view is patched rather than a new one stitched: about one wait per
//!   training step on the GPT-2 trace with the reuse cache;
//! - **no event work while a window is open** ([`PrivatePools`]): while
//!   any allocation window is open (a graph may be being captured), frees
//!   that would need events are *parked* and nothing is polled; when the
//!   last window closes, parked blocks get their events;
//! - **planned mode** ([`StreamPool::use_plan`], off unless a plan is
//!   loaded): general requests first ask the [`PlannedRoute`] (one lake
//!   range of the plan's arena, served by `lake::plan`'s arena: planned
//!   offsets in order, dynamic slots, idle planned space), which serves
//!   one stream and keeps its own fences (`planned.rs`); what it does not
//!   serve is routed as above. Private pools never see the plan. Step
//!   marks ([`StreamPool::mark_step`]) move the plan to its next iteration;
//! - **zero size**: `alloc(0)` answers `0` and counts nothing; `free(0)`
//!   does nothing (what `cudaMalloc`/`cudaFree` and PyTorch's allocator do);
//! - **out of memory**: when the lake refuses (its limit, or the driver's
//!   own out-of-memory), the pool waits for the device (unless a window is
//!   open), takes back every block whose events completed, returns wholly
//!   free split chunks and released graphs' memory to the lake, gives the
//!   lake's free chunks back to the driver, and tries once more; then
//!   [`PoolError::OutOfMemory`] says what was asked, what is reserved and
//!   active, the largest free extent and what waits on events. Nothing is
//!   lost: the pool is as usable after the error as before.
//!
//! Concurrency: one mutex guards the pool's state (split cache, live
//! allocations, waiting blocks, private pools, statistics); every public
//! call takes it once. Lake and event calls are made while holding it, so
//! the lock order is always pool, then lake, then driver.

use std::collections::{HashMap, HashSet, VecDeque};
use std::hash::BuildHasherDefault;
use std::sync::{Mutex, MutexGuard};

use super::block::{Block, Home, Origin, PoolId};
use super::error::{PoolError, PoolResult};
use super::event::{EventId, EventSource, StreamId};
use super::planned::PlannedRoute;
use super::private::PrivatePools;
use super::reuse::{self, ReuseCache};
use super::split::{Piece, SplitCache};
use super::stats::{PoolBreakdown, PoolStats};
use crate::plan::{Plan, RuntimeStats};
use crate::{
    AddrHasher, AddrMap, DeviceRange, EventKind, Fence, Lake, LakeError, Progress, Requester, Site,
    Trace, TraceRecorder, VmmDriver,
};

/// Most events kept per stream (see the stream rule).
pub const MAX_EVENTS_PER_STREAM: usize = 64;

/// A live allocation of a private pool, as a checkpoint keeps it
/// (`torch.compile`'s CUDA graph trees restore a pool to a checkpoint when
/// they switch paths).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(C)]
pub struct PoolEntry {
    /// Device address.
    pub addr: u64,
    /// Bytes requested.
    pub size: u64,
    /// The stream it was allocated for.
    pub stream: u64,
}

/// What restoring a checkpoint did: allocations freed (live now, not in the
/// checkpoint) and allocations made again (in the checkpoint, freed since).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Restored {
    /// Addresses freed.
    pub freed: Vec<u64>,
    /// Addresses allocated again, each at its checkpointed address.
    pub allocated: Vec<u64>,
}

/// A live allocation.
#[derive(Clone, Debug)]
struct Live {
    /// Bytes requested.
    size: u64,
    block: Block,
    home: Home,
    /// Streams other than the freeing one that used it (`record_stream`).
    uses: Vec<StreamId>,
}

/// A block freed while a window was open: its events are recorded when the
/// last window closes.
#[derive(Clone, Debug)]
struct Parked {
    live: Live,
    freed_on: StreamId,
}

/// Counters behind [`PoolStats`].
#[derive(Clone, Copy, Debug, Default)]
struct Counters {
    active: u64,
    peak_active: u64,
    /// Requested bytes rounded up to [`PIECE_ALIGN`] (PyTorch's
    /// `allocated_bytes`).
    allocated: u64,
    peak_allocated: u64,
    peak_reserved: u64,
    /// Highest bytes of lake chunks spilled to host memory.
    peak_spilled: u64,
    allocs: u64,
    frees: u64,
    retries: u64,
    ooms: u64,
    placement_waits: u64,
}

/// Everything behind the pool's mutex.
struct State {
    split: SplitCache,
    reuse: ReuseCache,
    live: AddrMap<Live>,
    /// Per stream, the events recorded at its frees with the frees'
    /// numbers, oldest first.
    events: HashMap<StreamId, VecDeque<(u64, EventId)>>,
    /// Per stream, the number of its last free (looked up at every free).
    frees: HashMap<StreamId, u64, BuildHasherDefault<AddrHasher>>,
    /// Per stream, the last free number whose event was seen complete.
    progress: Progress,
    parked: Vec<Parked>,
    private: PrivatePools,
    streams: Streams,
    /// Frees made without events while one stream was alone, that another
    /// stream may only have once an event recorded after them completes;
    /// the event is recorded when no window is open.
    catch_up: Vec<(StreamId, u64)>,
    /// The allocation trace being recorded, if any.
    recording: Option<Recording>,
    /// The planned mode, when a plan is loaded.
    planned: Option<PlannedRoute>,
    counters: Counters,
}

/// A trace being recorded: every request and free with its size, address,
/// stream (a small index, by first appearance) and step (the phase tag,
/// advanced by [`StreamPool::mark_step`]).
struct Recording {
    recorder: TraceRecorder,
    streams: HashMap<StreamId, u32>,
    step: u32,
}

impl Recording {
    fn record(&mut self, kind: EventKind, size: u64, addr: u64, stream: StreamId) {
        let next = self.streams.len() as u32;
        let stream = *self.streams.entry(stream).or_insert(next);
        let site = Site {
            stream,
            phase: self.step,
        };
        self.recorder.record(kind, size, addr, site);
    }
}

/// Which streams have used the pool. While one stream is alone, its frees
/// need no event: nobody else may take its memory, and its own later work
/// is ordered after the free.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Streams {
    /// No request yet.
    None,
    /// Every request, free and `record_stream` so far named this stream.
    Alone(StreamId),
    /// Several streams: every free records an event.
    Several,
}

/// The allocator of one device: lake, split cache, stream rule and
/// private pools.
pub struct StreamPool<D: VmmDriver, E: EventSource> {
    lake: Lake<D>,
    events: E,
    state: Mutex<State>,
}

impl<D: VmmDriver, E: EventSource> StreamPool<D, E> {
    /// A pool over `lake` with events from `events`.
    pub fn new(lake: Lake<D>, events: E) -> StreamPool<D, E> {
        let chunk = lake.granularity();
        StreamPool {
            lake,
            events,
            state: Mutex::new(State {
                split: SplitCache::new(chunk),
                reuse: ReuseCache::new(reuse::DEFAULT_ENTRIES),
                live: AddrMap::default(),
                events: HashMap::new(),
                frees: HashMap::default(),
                progress: Progress::new(),
                parked: Vec::new(),
                private: PrivatePools::new(chunk),
                streams: Streams::None,
                catch_up: Vec::new(),
                recording: None,
                planned: None,
                counters: Counters::default(),
            }),
        }
    }

    /// The lake (for tests and for copying data in and out).
    pub fn lake(&self) -> &Lake<D> {
        &self.lake
    }

    /// The event source.
    pub fn events(&self) -> &E {
        &self.events
    }

    /// Sets how many freed large blocks the reuse cache keeps (0: none;
    /// the default is [`reuse::DEFAULT_ENTRIES`]); what it held goes to the
    /// lake.
    pub fn set_reuse_entries(&self, entries: usize) -> PoolResult<()> {
        let mut s = self.state();
        self.drain_reuse(&mut s)?;
        s.reuse.set_max_entries(entries);
        Ok(())
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every mutation completes or is undone before a fallible step
        // returns, so a poisoned lock still guards consistent tables.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Allocates `size` bytes for use on `stream` from the general pool;
    /// `0` for `size == 0`.
    pub fn alloc(&self, size: u64, stream: StreamId) -> PoolResult<u64> {
        self.alloc_in(size, stream, PoolId::GENERAL)
    }

    /// Allocates `size` bytes for use on `stream` from private pool `pool`
    /// ([`PoolId::GENERAL`]: the general pool). The pool must be held
    /// (a window open on it, or a user added with
    /// [`StreamPool::incref_pool`]).
    pub fn alloc_in(&self, size: u64, stream: StreamId, pool: PoolId) -> PoolResult<u64> {
        if size == 0 {
            return Ok(0);
        }
        let mut s = self.state();
        self.note_stream(&mut s, stream)?;
        if !s.private.any_window() {
            self.settle(&mut s)?;
        }
        let (block, home) = if pool == PoolId::GENERAL {
            (self.alloc_general(&mut s, size, stream)?, Home::General)
        } else {
            let block = self.alloc_private(&mut s, size, stream, pool)?;
            (block, Home::Private(pool, stream))
        };
        s.live.insert(
            block.addr,
            Live {
                size,
                block,
                home,
                uses: Vec::new(),
            },
        );
        self.count(&mut s, size);
        if let Some(r) = s.recording.as_mut() {
            r.record(EventKind::Alloc, size, block.addr, stream);
        }
        Ok(block.addr)
    }

    /// Counts an allocation of `size` bytes.
    fn count(&self, s: &mut State, size: u64) {
        let c = &mut s.counters;
        c.active += size;
        c.peak_active = c.peak_active.max(c.active);
        c.allocated += SplitCache::rounded(size);
        c.peak_allocated = c.peak_allocated.max(c.allocated);
        c.allocs += 1;
    }

    /// Counts the free of `live`.
    fn uncount(&self, s: &mut State, live: &Live) {
        let c = &mut s.counters;
        c.active -= live.size;
        c.allocated -= SplitCache::rounded(live.size);
        c.frees += 1;
    }

    /// Frees `addr` (from an `alloc`) last used on `stream`; nothing for
    /// `addr == 0`.
    pub fn free(&self, addr: u64, stream: StreamId) -> PoolResult<()> {
        if addr == 0 {
            return Ok(());
        }
        let mut s = self.state();
        // One lookup: taken out, and put back if the stream rule fails.
        let Some(live) = s.live.remove(&addr) else {
            return Err(PoolError::NotOurs { addr });
        };
        if let Err(e) = self.note_stream(&mut s, stream) {
            s.live.insert(addr, live);
            return Err(e);
        }
        self.uncount(&mut s, &live);
        if let Some(r) = s.recording.as_mut() {
            r.record(EventKind::Free, live.size, addr, stream);
        }
        let planned_alone = live.block.origin == Origin::Planned
            && live.uses.iter().all(|&u| u == stream)
            && s.planned.as_ref().and_then(PlannedRoute::arena_stream) == Some(stream);
        match live.home {
            Home::Private(..) if live.uses.is_empty() => {
                // Its own stream's later work is ordered after the free,
                // and only that stream reuses the store: no event needed.
                self.go_home(&mut s, live.block, live.home, &Fence::none())
            }
            // Only the arena's stream used it, and only that stream reuses
            // the arena: no event needed, even while a window is open.
            Home::General if planned_alone => {
                self.go_home(&mut s, live.block, live.home, &Fence::none())
            }
            _ if s.private.any_window() => {
                s.parked.push(Parked {
                    live,
                    freed_on: stream,
                });
                Ok(())
            }
            _ => self
                .wait_for_events(&mut s, live, stream)
                .map_err(|failed| {
                    let (e, live) = *failed;
                    // Without an event nobody can tell when the block is safe
                    // for other streams: it stays allocated, and the caller may
                    // retry the free.
                    self.count(&mut s, live.size);
                    let c = &mut s.counters;
                    c.allocs -= 1;
                    c.frees -= 1;
                    s.live.insert(live.block.addr, live);
                    e
                }),
        }
    }

    /// Adds `stream` to the streams that use the allocation at `addr`: when
    /// it is freed, its memory is reused only after `stream`'s work
    /// submitted before the free has completed (`Tensor.record_stream`).
    pub fn record_stream(&self, addr: u64, stream: StreamId) -> PoolResult<()> {
        let mut s = self.state();
        if !s.live.contains_key(&addr) {
            return Err(PoolError::NotOurs { addr });
        }
        self.note_stream(&mut s, stream)?;
        let live = s.live.get_mut(&addr).expect("checked above");
        if !live.uses.contains(&stream) {
            live.uses.push(stream);
        }
        Ok(())
    }

    /// Starts recording every allocation and free (dropping a recording in
    /// progress); the step tag starts at 0.
    pub fn start_trace(&self) {
        self.state().recording = Some(Recording {
            recorder: TraceRecorder::new(self.lake.granularity()),
            streams: HashMap::new(),
            step: 0,
        });
    }

    /// Marks the start of the next training step: in the recording (the
    /// phase tag of later events) and in the plan (its next iteration).
    pub fn mark_step(&self) {
        let mut s = self.state();
        if let Some(r) = s.recording.as_mut() {
            r.step += 1;
        }
        if let Some(p) = s.planned.as_mut() {
            p.step();
        }
    }

    /// Stops recording and returns the trace, if one was being recorded.
    pub fn take_trace(&self) -> Option<Trace> {
        self.state().recording.take().map(|r| r.recorder.finish())
    }

    /// Turns the planned mode on with `plan` (replacing a plan loaded
    /// before): waits for the device, takes the plan's arena from the lake
    /// and serves general requests from it from the next one on (see
    /// [`PlannedRoute`]). The pool must hold no live allocation (the plan's
    /// ordinals count from the first request after this call) and no
    /// allocation window may be open. On failure the pool is as before
    /// (without a plan if one was replaced).
    pub fn use_plan(&self, plan: Plan) -> PoolResult<()> {
        let mut s = self.state();
        if !s.live.is_empty() {
            return Err(PoolError::Plan(format!(
                "cannot load a plan: the pool holds {} live allocations ({} bytes); load it \
                 before the first CUDA tensor (the plan's request order starts there)",
                s.live.len(),
                s.counters.active
            )));
        }
        if s.private.any_window() {
            return Err(PoolError::Plan(
                "cannot load a plan while a CUDA graph capture (allocation window) is open"
                    .to_string(),
            ));
        }
        self.drop_route(&mut s)?;
        // Every earlier free completes first, so the arena may take any
        // free chunk whatever stream freed it.
        self.reclaim(&mut s)?;
        let range = match plan.arena {
            0 => None,
            bytes => Some(
                self.lake_alloc(&mut s, bytes, bytes, StreamId(0))
                    .map_err(|e| {
                        PoolError::Plan(format!(
                            "the lake cannot hold the plan's arena of {bytes} bytes: {e}"
                        ))
                    })?,
            ),
        };
        s.planned = Some(PlannedRoute::new(plan, range, self.lake.granularity()));
        Ok(())
    }

    /// Turns the planned mode off: the arena goes back to the lake (behind
    /// an event on the arena's stream). Fails while a planned allocation is
    /// live or an allocation window is open. The plan's final counters, or
    /// `None` if no plan was loaded.
    pub fn drop_plan(&self) -> PoolResult<Option<RuntimeStats>> {
        let mut s = self.state();
        let stats = s.planned.as_ref().map(PlannedRoute::stats);
        self.drop_route(&mut s)?;
        Ok(stats)
    }

    /// The plan's counters, if a plan is loaded.
    pub fn plan_stats(&self) -> Option<RuntimeStats> {
        self.state().planned.as_ref().map(PlannedRoute::stats)
    }

    /// Gives the planned arena (if any) back to the lake.
    fn drop_route(&self, s: &mut State) -> PoolResult<()> {
        let Some(route) = s.planned.as_ref() else {
            return Ok(());
        };
        if route.in_use() && !s.private.any_window() {
            self.synchronize(s, false)?;
        }
        let route = s.planned.as_ref().expect("checked above");
        if route.in_use() {
            return Err(PoolError::Plan(format!(
                "cannot drop the plan: {} bytes of its arena are still allocated",
                route.physical_bytes() - route.free_bytes()
            )));
        }
        if s.private.any_window() {
            return Err(PoolError::Plan(
                "cannot drop the plan while a CUDA graph capture (allocation window) is open"
                    .to_string(),
            ));
        }
        // The arena's stream reused its memory without events; the range
        // goes to every stream only behind a free numbered on it now.
        let fence = match route.arena_stream() {
            Some(stream) => self.fence_free(s, stream, false)?,
            None => Fence::none(),
        };
        let route = s.planned.take().expect("checked above");
        if let Some(range) = route.into_range() {
            self.lake
                .free_fenced(range, Site::default(), &fence)
                .map_err(PoolError::Lake)?;
        }
        Ok(())
    }

    /// Addresses of the live allocations of private pool `pool`, in
    /// ascending order (CUDA graph trees check them against the tensors
    /// they hold).
    pub fn live_in_pool(&self, pool: PoolId) -> Vec<u64> {
        let s = self.state();
        let mut out: Vec<u64> = s
            .live
            .iter()
            .filter(|(_, l)| matches!(l.home, Home::Private(id, _) if id == pool))
            .map(|(&a, _)| a)
            .collect();
        out.sort_unstable();
        out
    }

    /// The live allocations of private pool `pool` (a checkpoint).
    pub fn checkpoint_pool(&self, pool: PoolId) -> Vec<PoolEntry> {
        let s = self.state();
        let mut out: Vec<PoolEntry> = s
            .live
            .iter()
            .filter_map(|(&addr, l)| entry_of(addr, l, pool))
            .collect();
        out.sort_unstable_by_key(|e| e.addr);
        out
    }

    /// Puts private pool `pool` back to `checkpoint`: frees its live
    /// allocations that the checkpoint does not hold, and allocates again,
    /// at the same addresses, those it holds that were freed since. Fails
    /// if such an allocation's memory was taken by another since (the pool
    /// was used differently); what was restored before the failure stays.
    pub fn restore_pool(&self, pool: PoolId, checkpoint: &[PoolEntry]) -> PoolResult<Restored> {
        let mut s = self.state();
        let mut out = Restored::default();
        let keep: HashSet<PoolEntry> = checkpoint.iter().copied().collect();
        let stale: Vec<u64> = s
            .live
            .iter()
            .filter(|&(&addr, l)| entry_of(addr, l, pool).is_some_and(|e| !keep.contains(&e)))
            .map(|(&a, _)| a)
            .collect();
        for addr in stale {
            let live = s.live.remove(&addr).expect("listed above");
            self.uncount(&mut s, &live);
            if let Home::Private(id, stream) = live.home {
                let st = &mut *s;
                st.private
                    .give_back(id, stream, live.block, &Fence::none(), &st.progress);
            }
            out.freed.push(addr);
        }
        for e in checkpoint {
            if s.live.contains_key(&e.addr) {
                continue;
            }
            let stream = StreamId(e.stream);
            let capacity = self.capacity_for(&s, e.size);
            let block = s
                .private
                .take_at(pool, stream, e.addr, e.size, capacity)
                .ok_or_else(|| {
                    PoolError::PrivatePool(format!(
                        "cannot restore the checkpoint of private pool ({}, {}): the memory \
                         of {:#x} (+{} bytes) is no longer free in it",
                        pool.0, pool.1, e.addr, e.size
                    ))
                })?;
            self.count(&mut s, e.size);
            let home = Home::Private(pool, stream);
            s.live.insert(
                e.addr,
                Live {
                    size: e.size,
                    block,
                    home,
                    uses: Vec::new(),
                },
            );
            out.allocated.push(e.addr);
        }
        Ok(out)
    }

    /// Whether `addr` starts a live allocation of this pool.
    pub fn owns(&self, addr: u64) -> bool {
        self.state().live.contains_key(&addr)
    }

    /// Opens an allocation window on private pool `pool` (a graph capture
    /// begins) and adds a user to it. The caller routes the captured
    /// streams' requests to [`StreamPool::alloc_in`] with `pool` until
    /// [`StreamPool::end_allocate_to_pool`].
    pub fn begin_allocate_to_pool(&self, pool: PoolId) -> PoolResult<()> {
        self.check_private(pool)?;
        self.state()
            .private
            .begin(pool)
            .map_err(PoolError::PrivatePool)
    }

    /// Closes the window on `pool`. When no window is left, blocks freed
    /// meanwhile get their events and released pools give their memory
    /// back.
    pub fn end_allocate_to_pool(&self, pool: PoolId) -> PoolResult<()> {
        let mut s = self.state();
        s.private.end(pool).map_err(PoolError::PrivatePool)?;
        if s.private.any_window() {
            return Ok(());
        }
        self.settle(&mut s)
    }

    /// Adds a user to private pool `pool`, making it if needed
    /// (`torch.cuda.MemPool`).
    pub fn incref_pool(&self, pool: PoolId) -> PoolResult<()> {
        self.check_private(pool)?;
        self.state().private.incref(pool);
        Ok(())
    }

    /// Removes a user of `pool` (a graph was reset or deleted). With no
    /// user left, its free memory returns to general use once the device
    /// has finished the work submitted so far (now, or when the last window
    /// closes), and the rest as it is freed.
    pub fn release_pool(&self, pool: PoolId) -> PoolResult<()> {
        let mut s = self.state();
        let freeable = s.private.release(pool).map_err(PoolError::PrivatePool)?;
        if freeable && !s.private.any_window() {
            self.drain_released(&mut s)?;
        }
        Ok(())
    }

    /// Users of private pool `pool`.
    pub fn pool_use_count(&self, pool: PoolId) -> u32 {
        self.state().private.use_count(pool)
    }

    fn check_private(&self, pool: PoolId) -> PoolResult<()> {
        if pool == PoolId::GENERAL {
            return Err(PoolError::PrivatePool(
                "(0, 0) is the general pool, not a private one".to_string(),
            ));
        }
        Ok(())
    }

    /// Releases cached memory: waits for the device, takes back every
    /// waiting block, returns wholly free split chunks and released
    /// graphs' memory to the lake, and the lake's free chunks to the
    /// driver. Returns the physical bytes released. While a window is open
    /// it only returns what needs no event work.
    pub fn empty_cache(&self) -> PoolResult<u64> {
        let mut s = self.state();
        self.reclaim(&mut s)?;
        self.lake.trim_settled(&s.progress).map_err(PoolError::Lake)
    }

    /// Limits the physical memory the pool may hold (PyTorch's
    /// `set_per_process_memory_fraction`).
    pub fn set_limit_bytes(&self, bytes: u64) {
        self.lake.set_limit_bytes(bytes);
    }

    /// Sets the peaks to the current values.
    pub fn reset_peaks(&self) {
        let reserved = self.lake.reserved_bytes();
        let spilled = self.lake.spilled_bytes();
        let mut s = self.state();
        let c = &mut s.counters;
        c.peak_active = c.active;
        c.peak_allocated = c.allocated;
        c.peak_reserved = reserved;
        c.peak_spilled = spilled;
    }

    /// A snapshot of the pool's counters, with where the reserved bytes
    /// are.
    pub fn stats(&self) -> PoolStats {
        let s = self.state();
        let lake = self.lake.stats_with(&s.progress);
        let c = s.counters;
        let split_waiting = s.split.pending_bytes(&s.progress);
        let reuse_waiting = s.reuse.pending_bytes(&s.progress);
        let parked: u64 = s.parked.iter().map(|p| p.live.block.capacity).sum();
        let planned = s.planned.as_ref();
        let planned_waiting = planned.map_or(0, PlannedRoute::waiting_bytes);
        let waiting =
            parked + split_waiting + reuse_waiting + planned_waiting + lake.breakdown.waiting_bytes;
        let (mut small_rounding, mut large_rounding) = (0, 0);
        for l in s.live.values() {
            match l.block.origin {
                Origin::Small | Origin::Planned => small_rounding += l.block.capacity - l.size,
                Origin::Large(_) => large_rounding += l.block.capacity - l.size,
            }
        }
        let private_free = s.private.free_bytes();
        let breakdown = PoolBreakdown {
            active_bytes: c.active,
            small_rounding_bytes: small_rounding,
            large_rounding_bytes: large_rounding,
            split_free_bytes: s.split.free_bytes() - split_waiting,
            reuse_free_bytes: s.reuse.bytes() - reuse_waiting,
            private_free_bytes: private_free,
            planned_free_bytes: planned.map_or(0, PlannedRoute::free_bytes),
            waiting_bytes: waiting,
            lake_free_bytes: lake.breakdown.free_bytes,
        };
        PoolStats {
            active_bytes: c.active,
            allocated_bytes: c.allocated,
            reserved_bytes: lake.reserved_bytes,
            peak_active_bytes: c.peak_active,
            peak_allocated_bytes: c.peak_allocated,
            peak_reserved_bytes: c.peak_reserved.max(lake.reserved_bytes),
            spilled_chunks: lake.spilled_chunks,
            spilled_bytes: lake.spilled_bytes,
            peak_spilled_bytes: c.peak_spilled.max(lake.spilled_bytes),
            spills: lake.spills,
            placement_waits: c.placement_waits,
            waiting_bytes: waiting,
            split_chunks: (s.split.chunk_count() + s.private.split_chunks()) as u64,
            split_free_bytes: s.split.free_bytes(),
            private_free_bytes: private_free,
            private_pools: s.private.count() as u64,
            largest_free_bytes: lake
                .largest_free_bytes
                .max(s.split.largest_free())
                .max(s.reuse.largest()),
            reuse_free_bytes: s.reuse.bytes(),
            reuse_hits: s.reuse.counts().0,
            reuse_returned: s.reuse.counts().1,
            limit_bytes: self.lake.limit_bytes(),
            live_allocations: s.live.len() as u64,
            allocs: c.allocs,
            frees: c.frees,
            alloc_retries: c.retries,
            ooms: c.ooms,
            driver_calls: lake.driver.total().calls,
            driver_nanos: lake.driver.total().nanos,
            event_calls: self.events.calls(),
            planned_arena_bytes: planned.map_or(0, PlannedRoute::physical_bytes),
            plan: planned.map(PlannedRoute::stats),
            breakdown,
        }
    }

    /// Checks the split caches' tables and the lake's; the first broken
    /// rule, in words.
    pub fn check(&self) -> Result<(), String> {
        let s = self.state();
        s.split.check()?;
        s.reuse.check()?;
        for b in s.reuse.blocks() {
            if s.live.contains_key(&b.addr) {
                return Err(format!("reuse cache: block {:#x} is live", b.addr));
            }
            if b.is_small() && s.split.piece_at(b.addr).map(|p| p.len) != Some(b.capacity) {
                return Err(format!(
                    "reuse cache: piece {:#x} ({} bytes) is not a piece in use of the split cache",
                    b.addr, b.capacity
                ));
            }
        }
        s.private.check()?;
        if let Some(p) = s.planned.as_ref() {
            let live: HashMap<u64, u64> = s
                .live
                .iter()
                .filter(|(_, l)| l.block.origin == Origin::Planned)
                .map(|(&a, l)| (a, l.block.capacity))
                .collect();
            p.check(&live)?;
        }
        drop(s);
        self.lake.check()
    }

    /// The capacity a request of `size` bytes needs from a block.
    fn capacity_for(&self, s: &State, size: u64) -> u64 {
        if s.split.is_small(size) {
            SplitCache::rounded(size)
        } else {
            size.div_ceil(self.lake.granularity()) * self.lake.granularity()
        }
    }

    fn large_block(&self, range: DeviceRange) -> Block {
        Block {
            addr: range.addr,
            capacity: range.len.div_ceil(self.lake.granularity()) * self.lake.granularity(),
            origin: Origin::Large(range),
        }
    }

    /// Serves a general request from the plan, the reuse cache, the split
    /// cache or the lake (growing them), with the out-of-memory retry.
    fn alloc_general(&self, s: &mut State, size: u64, stream: StreamId) -> PoolResult<Block> {
        if let Some(block) = s.planned.as_mut().and_then(|p| p.alloc(size, stream)) {
            return Ok(block);
        }
        let req = Requester {
            stream: stream.0,
            progress: &s.progress,
        };
        let capacity = self.capacity_for(s, size);
        if let Some(block) = s.reuse.take(capacity, &req) {
            return Ok(block);
        }
        if !s.split.is_small(size) {
            let range = match self.lake_window(s, size, stream)? {
                Some(range) => range,
                None => self.lake_alloc(s, size, size, stream)?,
            };
            return Ok(self.large_block(range));
        }
        let req = Requester {
            stream: stream.0,
            progress: &s.progress,
        };
        let piece = match s.split.take(size, &req) {
            Some(p) => p,
            None => self.new_piece(s, size, stream)?,
        };
        Ok(Block {
            addr: piece.addr,
            capacity: piece.len,
            origin: Origin::Small,
        })
    }

    /// A piece for a small request the split cache could not serve: from a
    /// chunk the lake holds free; else, once the reuse cache's pieces are
    /// back in the split cache, from them or from a chunk the lake places
    /// (growing if it must).
    fn new_piece(&self, s: &mut State, size: u64, stream: StreamId) -> PoolResult<Piece> {
        let chunk_bytes = self.lake.granularity();
        let held = !s.reuse.is_empty();
        let chunk = match self.lake_window(s, chunk_bytes, stream)? {
            Some(chunk) => chunk,
            None => {
                let req = Requester {
                    stream: stream.0,
                    progress: &s.progress,
                };
                if held && let Some(p) = s.split.take(size, &req) {
                    return Ok(p);
                }
                self.lake_alloc(s, chunk_bytes, size, stream)?
            }
        };
        s.split.add_chunk(chunk);
        let req = Requester {
            stream: stream.0,
            progress: &s.progress,
        };
        Ok(s.split
            .take(size, &req)
            .expect("a fresh chunk holds any small piece"))
    }

    /// While the reuse cache holds blocks: `bytes` for `stream` from a
    /// window of free chunks the lake already holds (no driver call, no
    /// new memory); else the whole cache goes home (pieces to the split
    /// cache, wholly free chunks and large blocks to the lake) and `None`:
    /// the caller then places the request as if there were no cache, the
    /// lake seeing every free chunk before it patches, stitches or grows,
    /// so the cache never makes the pool reserve more. `None` at once
    /// when the cache is empty.
    fn lake_window(
        &self,
        s: &mut State,
        bytes: u64,
        stream: StreamId,
    ) -> PoolResult<Option<DeviceRange>> {
        if s.reuse.is_empty() {
            return Ok(None);
        }
        let site = Site {
            stream: stream.0 as u32,
            phase: 0,
        };
        let req = Requester {
            stream: stream.0,
            progress: &s.progress,
        };
        if let Some(range) = self
            .lake
            .alloc_cached_at(bytes, site, &req)
            .map_err(PoolError::Lake)?
        {
            return Ok(Some(range));
        }
        self.drain_reuse(s)?;
        Ok(None)
    }

    /// Serves a request of private pool `pool` on `stream`.
    fn alloc_private(
        &self,
        s: &mut State,
        size: u64,
        stream: StreamId,
        pool: PoolId,
    ) -> PoolResult<Block> {
        if !s.private.is_held(pool) {
            return Err(PoolError::PrivatePool(format!(
                "private pool ({}, {}) is not held: open a window or add a user first",
                pool.0, pool.1
            )));
        }
        let capacity = self.capacity_for(s, size);
        if let Some(b) = s.private.take(pool, stream, size, capacity, &s.progress) {
            return Ok(b);
        }
        if s.split.is_small(size) {
            let chunk = self.lake_alloc(s, self.lake.granularity(), size, stream)?;
            s.private.add_chunk(pool, stream, chunk);
            return Ok(s
                .private
                .take(pool, stream, size, capacity, &s.progress)
                .expect("a fresh chunk holds any small piece"));
        }
        let range = self.lake_alloc(s, size, size, stream)?;
        s.private.count_live(pool);
        Ok(self.large_block(range))
    }

    /// `bytes` from the lake for `stream`'s request of `asked` bytes; on a
    /// lack of memory, reclaims everything cached and tries again.
    fn lake_alloc(
        &self,
        s: &mut State,
        bytes: u64,
        asked: u64,
        stream: StreamId,
    ) -> PoolResult<DeviceRange> {
        let site = Site {
            stream: stream.0 as u32,
            phase: 0,
        };
        let try_once = |s: &State| {
            let req = Requester {
                stream: stream.0,
                progress: &s.progress,
            };
            self.lake.alloc_for(bytes, site, &req)
        };
        // The lake places nothing but a window of its free chunks
        // (`lake_window`) while the reuse cache holds blocks: they go back
        // first, so that the lake sees every free chunk before it patches,
        // stitches or grows, as if they had been freed to it.
        self.drain_reuse(s)?;
        // The lake never unmaps a stitched view while work queued before
        // its last free may use it (its remap rule, `lake/pool.rs`); when
        // this placement would patch such a view, waiting for the device
        // settles it, so the view is patched rather than a new one
        // stitched (one wait instead of a stitch per step, and views that
        // pile up). Not while a window is open: no event work then.
        if !s.private.any_window() {
            let req = Requester {
                stream: stream.0,
                progress: &s.progress,
            };
            if let Some(fence) = self.lake.placement_blocker(bytes, &req) {
                s.counters.placement_waits += 1;
                self.wait_for_fence(s, &fence)?;
            }
        }
        let mut out = try_once(s);
        if matches!(&out, Err(e) if e.is_out_of_memory()) {
            // First what nobody uses any more (waiting memory, empty split
            // chunks, released graphs): the lake stitches it.
            s.counters.retries += 1;
            self.reclaim(s)?;
            out = try_once(s);
            if matches!(&out, Err(e) if e.is_out_of_memory()) {
                // Then every free chunk, so that the driver can make new
                // ones in their place (a device that other processes fill).
                self.lake
                    .trim_settled(&s.progress)
                    .map_err(PoolError::Lake)?;
                out = try_once(s);
            }
        }
        let reserved = self.lake.reserved_bytes();
        s.counters.peak_reserved = s.counters.peak_reserved.max(reserved);
        let spilled = self.lake.spilled_bytes();
        s.counters.peak_spilled = s.counters.peak_spilled.max(spilled);
        match out {
            Ok(range) => Ok(range),
            Err(e) if e.is_out_of_memory() => {
                s.counters.ooms += 1;
                Err(self.out_of_memory(s, asked, &e))
            }
            Err(e) => Err(PoolError::Lake(e)),
        }
    }

    fn out_of_memory(&self, s: &State, asked: u64, cause: &LakeError) -> PoolError {
        let lake = self.lake.stats_with(&s.progress);
        let parked: u64 = s.parked.iter().map(|p| p.live.block.capacity).sum();
        PoolError::OutOfMemory {
            asked,
            reserved: lake.reserved_bytes,
            active: s.counters.active,
            limit: self.lake.limit_bytes(),
            largest_free: lake
                .largest_free_bytes
                .max(s.split.largest_free())
                .max(s.reuse.largest()),
            waiting: lake.breakdown.waiting_bytes
                + s.split.pending_bytes(&s.progress)
                + s.reuse.pending_bytes(&s.progress)
                + parked,
            cause: cause.to_string(),
        }
    }

    /// Frees the memory nobody uses any more: with no window open, records
    /// the parked frees, waits for the device and takes every event as
    /// complete, and gives released graphs' memory back; then returns
    /// wholly free split chunks to the lake.
    fn reclaim(&self, s: &mut State) -> PoolResult<()> {
        self.drain_reuse(s)?;
        if !s.private.any_window() {
            self.flush_parked(s)?;
            self.synchronize(s, false)?;
            self.drain_released(s)?;
        }
        self.release_empty_chunks(s, 0)
    }

    /// The work done whenever no window is open: parked blocks get their
    /// events, completed events settle fences, released graphs give memory
    /// back.
    fn settle(&self, s: &mut State) -> PoolResult<()> {
        self.record_catch_up(s)?;
        self.flush_parked(s)?;
        self.poll(s)?;
        self.drain_released(s)
    }

    /// Counts `stream` among the pool's streams. When a second stream
    /// appears, the first one's frees so far had no event: one is recorded
    /// now (or, inside a window, when the last window closes) behind them,
    /// and from then on every free records its own.
    fn note_stream(&self, s: &mut State, stream: StreamId) -> PoolResult<()> {
        match s.streams {
            Streams::None => s.streams = Streams::Alone(stream),
            Streams::Alone(only) if only != stream => {
                s.streams = Streams::Several;
                let done = s.frees.get(&only).copied().unwrap_or(0);
                if done > s.progress.done(only.0) {
                    s.catch_up.push((only, done));
                    if !s.private.any_window() {
                        self.record_catch_up(s)?;
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// Records the events owed for frees made without one (see
    /// [`StreamPool::note_stream`]).
    fn record_catch_up(&self, s: &mut State) -> PoolResult<()> {
        while let Some(&(stream, seq)) = s.catch_up.last() {
            let event = self.events.record(stream)?;
            s.catch_up.pop();
            s.events.entry(stream).or_default().push_back((seq, event));
        }
        Ok(())
    }

    /// Waits until `fence` is settled: for each stream it names, the
    /// oldest recorded event at or after its free number (the work queued
    /// before that free, not what was queued since), else the whole device.
    /// Completed events are taken first without waiting.
    fn wait_for_fence(&self, s: &mut State, fence: &Fence) -> PoolResult<()> {
        self.poll(s)?;
        for (stream, seq) in fence.numbers() {
            if s.progress.done(stream) >= seq {
                continue;
            }
            let id = StreamId(stream);
            let covering = s
                .events
                .get(&id)
                .and_then(|l| l.iter().find(|&&(q, _)| q >= seq).copied());
            let Some((reached, event)) = covering else {
                // A free without an event (a lone stream's): only the
                // device can say.
                return self.synchronize(s, false);
            };
            self.events.synchronize(event)?;
            // It and every older event of the stream are complete now (they
            // complete in order): the poll takes them.
            self.poll_stream(s, id)?;
            s.progress.advance(stream, reached);
        }
        settle_stores(s);
        Ok(())
    }

    /// Waits for the device (if some free is not known complete, or
    /// `always`): every free so far is complete, every event is given back,
    /// fences settle.
    fn synchronize(&self, s: &mut State, always: bool) -> PoolResult<()> {
        let unsettled = s
            .frees
            .iter()
            .any(|(stream, &seq)| seq > s.progress.done(stream.0));
        if !unsettled && !always {
            return Ok(());
        }
        self.events.synchronize_all()?;
        for (&stream, &seq) in &s.frees {
            s.progress.advance(stream.0, seq);
        }
        for (_, event) in s.events.drain().flat_map(|(_, l)| l) {
            self.events.destroy(event);
        }
        s.catch_up.clear();
        settle_stores(s);
        Ok(())
    }

    /// Numbers a free on `stream` and returns the fence it puts the freed
    /// memory behind, recording its event unless `stream` is alone and
    /// `event` is false.
    fn fence_free(&self, s: &mut State, stream: StreamId, event: bool) -> PoolResult<Fence> {
        if s.streams == Streams::Alone(stream) && !event {
            let seq = s.frees.entry(stream).or_default();
            *seq += 1;
            return Ok(Fence::single(stream.0, *seq));
        }
        let event = self.events.record(stream)?;
        let seq = s.frees.entry(stream).or_default();
        *seq += 1;
        let seq = *seq;
        let list = s.events.entry(stream).or_default();
        list.push_back((seq, event));
        if list.len() > MAX_EVENTS_PER_STREAM {
            self.poll_stream(s, stream)?;
            if let Some(list) = s.events.get_mut(&stream)
                && list.len() > MAX_EVENTS_PER_STREAM
                && let Some((_, oldest)) = list.pop_front()
            {
                // Its frees wait for a later event of the stream instead.
                self.events.destroy(oldest);
            }
        }
        Ok(Fence::single(stream.0, seq))
    }

    /// Fences the free of `live` on `freed_on` (and on every stream that
    /// used it) and gives its memory back. If an event cannot be recorded
    /// the block is handed back with the error (events recorded so far
    /// only delay their streams' later reuse, which is safe).
    fn wait_for_events(
        &self,
        s: &mut State,
        live: Live,
        freed_on: StreamId,
    ) -> Result<(), Box<(PoolError, Live)>> {
        let mut fence = Fence::none();
        let home_stream = match live.home {
            // A private store is its stream's own: only the other users
            // need events.
            Home::Private(_, stream) => Some(stream),
            Home::General => None,
        };
        // A block of a stitched view gets its event even on a lone stream:
        // a placement that would patch the view then waits for that event
        // (`wait_for_fence`), not for everything queued since.
        let stitched = matches!(
            (live.home, live.block.origin),
            (Home::General, Origin::Large(range)) if self.lake.is_stitched(range)
        );
        // The freeing stream, then the other users: by index, so that the
        // common free (no other user) allocates no list.
        for i in 0..=live.uses.len() {
            let stream = match i {
                0 => freed_on,
                _ if live.uses[i - 1] == freed_on => continue,
                _ => live.uses[i - 1],
            };
            if Some(stream) == home_stream {
                continue;
            }
            match self.fence_free(s, stream, stitched) {
                Ok(f) => fence.join(&f),
                Err(e) => return Err(Box::new((e, live))),
            }
        }
        self.go_home(s, live.block, live.home, &fence)
            .map_err(|e| Box::new((e, live)))
    }

    /// Records the events of blocks freed while a window was open. A block
    /// whose event fails stays parked (the next flush tries again).
    fn flush_parked(&self, s: &mut State) -> PoolResult<()> {
        while let Some(Parked { live, freed_on }) = s.parked.pop() {
            if let Err(failed) = self.wait_for_events(s, live, freed_on) {
                let (e, live) = *failed;
                s.parked.push(Parked { live, freed_on });
                return Err(e);
            }
        }
        Ok(())
    }

    /// Polls every stream's oldest events, recording what completed.
    fn poll(&self, s: &mut State) -> PoolResult<()> {
        if s.events.is_empty() {
            // No event outstanding (a lone stream records one only at
            // frees of stitched views).
            return Ok(());
        }
        let streams: Vec<StreamId> = s.events.keys().copied().collect();
        for stream in streams {
            self.poll_stream(s, stream)?;
        }
        Ok(())
    }

    /// Pops the completed oldest events of `stream` into the progress;
    /// free split pieces kept apart by now settled fences merge.
    fn poll_stream(&self, s: &mut State, stream: StreamId) -> PoolResult<()> {
        let mut advanced = false;
        while let Some(&(seq, event)) = s.events.get(&stream).and_then(|l| l.front()) {
            if !self.events.is_complete(event)? {
                break;
            }
            s.events.get_mut(&stream).map(VecDeque::pop_front);
            self.events.destroy(event);
            s.progress.advance(stream.0, seq);
            advanced = true;
        }
        if advanced {
            settle_stores(s);
        }
        if s.events.get(&stream).is_some_and(VecDeque::is_empty) {
            s.events.remove(&stream);
        }
        Ok(())
    }

    /// Gives a block back to its home behind `fence`; a general split
    /// chunk left wholly free goes on to the lake.
    fn go_home(&self, s: &mut State, block: Block, home: Home, fence: &Fence) -> PoolResult<()> {
        match (home, block.origin) {
            (Home::Private(id, stream), _) => {
                s.private.give_back(id, stream, block, fence, &s.progress);
                if !s.private.any_window() && !s.private.is_held(id) {
                    self.drain_released(s)?;
                }
                Ok(())
            }
            (Home::General, Origin::Small) => {
                let Err(block) = s.reuse.put(block, fence) else {
                    return Ok(());
                };
                let freed = s.split.give_back(block.addr, fence, &s.progress);
                debug_assert!(freed.is_some(), "piece {:#x} was in use", block.addr);
                self.release_empty_chunks(s, SplitCache::SPARE_EMPTY)
            }
            (Home::General, Origin::Planned) => {
                let st = &mut *s;
                match st.planned.as_mut() {
                    Some(p) => p.give_back(block.addr, fence, &st.progress),
                    None => debug_assert!(false, "a planned block outlived its plan"),
                }
                Ok(())
            }
            (Home::General, Origin::Large(range)) => {
                let kept = block.capacity <= reuse::MAX_BLOCK_CHUNKS * self.lake.granularity()
                    && s.reuse.put(block, fence).is_ok();
                if kept {
                    return Ok(());
                }
                self.lake
                    .free_fenced(range, Site::default(), fence)
                    .map_err(PoolError::Lake)
            }
        }
    }

    /// Gives every block of the reuse cache home: pieces to the split
    /// cache (wholly free chunks beyond the spare on to the lake), large
    /// blocks to the lake.
    fn drain_reuse(&self, s: &mut State) -> PoolResult<()> {
        if s.reuse.is_empty() {
            return Ok(());
        }
        let mut pieces = false;
        for (block, fence) in s.reuse.drain() {
            match block.origin {
                Origin::Small => {
                    let freed = s.split.give_back(block.addr, &fence, &s.progress);
                    debug_assert!(freed.is_some(), "piece {:#x} was in use", block.addr);
                    pieces = true;
                }
                Origin::Large(range) => self
                    .lake
                    .free_fenced(range, Site::default(), &fence)
                    .map_err(PoolError::Lake)?,
                Origin::Planned => debug_assert!(false, "a planned block in the reuse cache"),
            }
        }
        if pieces {
            self.release_empty_chunks(s, SplitCache::SPARE_EMPTY)?;
        }
        Ok(())
    }

    /// Gives wholly free general split chunks beyond `keep` to the lake.
    fn release_empty_chunks(&self, s: &mut State, keep: usize) -> PoolResult<()> {
        for (range, fence) in s.split.take_empty_chunks(keep) {
            self.lake
                .free_fenced(range, Site::default(), &fence)
                .map_err(PoolError::Lake)?;
        }
        Ok(())
    }

    /// Returns the free memory of private pools without users to the lake,
    /// after the device has finished the work submitted so far (a replay
    /// may still be reading it). Only called with no window open.
    fn drain_released(&self, s: &mut State) -> PoolResult<()> {
        if s.private.count() == 0 {
            // No graph pool (eager training): nothing to look through.
            return Ok(());
        }
        if s.private.has_freeable_memory() {
            self.synchronize(s, true)?;
        }
        for range in s.private.drain_freeable() {
            self.lake
                .free_fenced(range, Site::default(), &Fence::none())
                .map_err(PoolError::Lake)?;
        }
        Ok(())
    }
}

/// `live` at `addr` as a checkpoint entry, if it belongs to private pool
/// `pool`.
fn entry_of(addr: u64, live: &Live, pool: PoolId) -> Option<PoolEntry> {
    match live.home {
        Home::Private(id, stream) if id == pool => Some(PoolEntry {
            addr,
            size: live.size,
            stream: stream.0,
        }),
        _ => None,
    }
}

impl<D: VmmDriver, E: EventSource> Drop for StreamPool<D, E> {
    fn drop(&mut self) {
        // The lake gives all memory back when it drops; the events go back
        // to their source here.
        let s = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        for (_, event) in s.events.drain().flat_map(|(_, l)| l) {
            self.events.destroy(event);
        }
    }
}

/// Lets the stores that keep freed memory behind fences (the split cache,
/// private pools, the plan's arena) see the progress made: what it settles
/// merges and serves every stream.
fn settle_stores(s: &mut State) {
    s.split.settle(&s.progress);
    s.private.settle(&s.progress);
    if let Some(p) = s.planned.as_mut() {
        p.settle(&s.progress);
    }
}
