//! `StreamPool`: the lake and the split cache behind the stream rule, the
//! allocator a `CUDAPluggableAllocator` calls.
//!
//! Rules:
//! - **routing**: requests under one lake chunk go to the [`SplitCache`]
//!   (pieces of chunks taken from the lake); larger ones to the lake
//!   (exact match, split, stitch, grow);
//! - **stream rule**: `free(addr, S)` records an event on S, numbers the
//!   free (per-stream sequence) and gives the block back to the split cache
//!   or the lake at once behind a fence `(S, number)` (`lake/fence.rs`): S
//!   may reuse it at once for any request (its later work is ordered after
//!   the free), another stream once the event is seen complete. Events of
//!   one stream complete in order, so each `alloc` polls every stream's
//!   oldest events until one is not complete; at most
//!   [`MAX_EVENTS_PER_STREAM`] events per stream are kept (beyond, the
//!   oldest is dropped: its frees then wait for a later event, which is
//!   safe);
//! - **zero size**: `alloc(0)` answers the null address `0` and counts
//!   nothing; `free(0)` does nothing (what `cudaMalloc`/`cudaFree` and
//!   PyTorch's own allocator do);
//! - **split chunks**: a split-cache chunk whose pieces are all free goes
//!   back to the lake at once (one spare kept), where it serves any size;
//! - **out of memory**: when the lake refuses, wholly free split-cache
//!   chunks go back to the lake and the request is tried once more; then
//!   [`PoolError::OutOfMemory`] says what was asked, what is reserved and
//!   active, the largest free extent and what waits on events;
//! - **capture**: while capturing (the pool-wide flag, or a per-call flag
//!   for a stream the caller knows is being captured) no driver call is
//!   made, VMM or event: requests are served from the split cache's free
//!   pieces or the lake's free chunks that the asking stream may reuse (its
//!   own frees, others' whose events were seen complete before the capture;
//!   [`Lake::alloc_cached_for`]), else refused with
//!   [`PoolError::CaptureNeedsWarmPool`]; frees are parked, not reusable,
//!   until capture ends, when their events are recorded. Blocks a captured
//!   graph uses must stay allocated while the graph may replay (PyTorch's
//!   graph pools do this).
//!
//! Concurrency: one mutex guards the pool's state (split cache, live
//! allocations, waiting lists, statistics); every public call takes it
//! once. Lake and event calls are made while holding it, so the lock order
//! is always pool, then lake, then driver.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::error::{PoolError, PoolResult};
use super::event::{EventId, EventSource, StreamId};
use super::split::SplitCache;
use super::stats::{PoolBreakdown, PoolStats};
use crate::lake::{DeviceRange, Fence, Lake, LakeError, Progress, Requester, Site, VmmDriver};

/// Most events kept per stream (see the stream rule).
pub const MAX_EVENTS_PER_STREAM: usize = 64;

/// Where a block came from, and so where it goes back.
#[derive(Clone, Copy, Debug)]
enum Origin {
    /// A piece of the split cache.
    Small,
    /// A lake allocation (the range exactly as the lake handed it out).
    Large(DeviceRange),
}

/// Memory handed out: its address, how much it really holds, its origin.
#[derive(Clone, Copy, Debug)]
struct Block {
    addr: u64,
    /// Piece length (small) or whole chunks (large).
    capacity: u64,
    origin: Origin,
}

/// Everything behind the pool's mutex.
struct State {
    split: SplitCache,
    /// Address -> (bytes requested, block).
    live: HashMap<u64, (u64, Block)>,
    /// Per stream, the events recorded at its frees with the frees'
    /// numbers, oldest first.
    events: HashMap<StreamId, VecDeque<(u64, EventId)>>,
    /// Per stream, the number of its last free.
    frees: HashMap<StreamId, u64>,
    /// Per stream, the last free number whose event was seen complete.
    progress: Progress,
    /// Blocks freed during capture, with their stream; no event yet.
    parked: Vec<(StreamId, Block)>,
    active: u64,
    peak_active: u64,
    peak_reserved: u64,
}

/// The allocator of one device: lake, split cache and stream rule.
pub struct StreamPool<D: VmmDriver, E: EventSource> {
    lake: Lake<D>,
    events: E,
    /// The pool-wide capture flag.
    capturing: AtomicBool,
    state: Mutex<State>,
}

impl<D: VmmDriver, E: EventSource> StreamPool<D, E> {
    /// A pool over `lake` with events from `events`.
    pub fn new(lake: Lake<D>, events: E) -> StreamPool<D, E> {
        let split = SplitCache::new(lake.granularity());
        StreamPool {
            lake,
            events,
            capturing: AtomicBool::new(false),
            state: Mutex::new(State {
                split,
                live: HashMap::new(),
                events: HashMap::new(),
                frees: HashMap::new(),
                progress: Progress::new(),
                parked: Vec::new(),
                active: 0,
                peak_active: 0,
                peak_reserved: 0,
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

    fn state(&self) -> MutexGuard<'_, State> {
        // Every mutation completes or is undone before a fallible step
        // returns, so a poisoned lock still guards consistent tables.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Starts capture mode: no driver call until [`StreamPool::end_capture`].
    pub fn begin_capture(&self) {
        // SeqCst is not needed: the flag is read under the state lock by
        // every call that acts on it; Relaxed would do, Release/Acquire
        // documents the hand-over.
        self.capturing.store(true, Ordering::Release);
    }

    /// Ends capture mode and records the events of blocks freed during it.
    pub fn end_capture(&self) -> PoolResult<()> {
        self.capturing.store(false, Ordering::Release);
        let mut s = self.state();
        self.flush_parked(&mut s)
    }

    /// Whether the pool-wide capture flag is set.
    pub fn is_capturing(&self) -> bool {
        self.capturing.load(Ordering::Acquire)
    }

    /// Allocates `size` bytes for use on `stream`; `0` for `size == 0`.
    pub fn alloc(&self, size: u64, stream: StreamId) -> PoolResult<u64> {
        self.alloc_with(size, stream, false)
    }

    /// [`StreamPool::alloc`]; `capturing` says that `stream` is being
    /// captured (capture mode for this call even if the pool-wide flag is
    /// off).
    pub fn alloc_with(&self, size: u64, stream: StreamId, capturing: bool) -> PoolResult<u64> {
        if size == 0 {
            return Ok(0);
        }
        let capturing = capturing || self.is_capturing();
        let mut s = self.state();
        if !capturing {
            self.flush_parked(&mut s)?;
        }
        let block = if capturing {
            self.alloc_cached(&mut s, size, stream)?
        } else {
            self.poll(&mut s)?;
            self.alloc_fresh(&mut s, size, stream)?
        };
        s.live.insert(block.addr, (size, block));
        s.active += size;
        s.peak_active = s.peak_active.max(s.active);
        Ok(block.addr)
    }

    /// Frees `addr` (from [`StreamPool::alloc`]) last used on `stream`;
    /// nothing for `addr == 0`.
    pub fn free(&self, addr: u64, stream: StreamId) -> PoolResult<()> {
        self.free_with(addr, stream, false)
    }

    /// [`StreamPool::free`]; `capturing` as in [`StreamPool::alloc_with`].
    pub fn free_with(&self, addr: u64, stream: StreamId, capturing: bool) -> PoolResult<()> {
        if addr == 0 {
            return Ok(());
        }
        let capturing = capturing || self.is_capturing();
        let mut s = self.state();
        let Some((size, block)) = s.live.remove(&addr) else {
            return Err(PoolError::NotOurs { addr });
        };
        s.active -= size;
        if capturing {
            s.parked.push((stream, block));
            return Ok(());
        }
        match self.fence_free(&mut s, stream) {
            Ok(fence) => {
                self.release(&mut s, block, &fence)?;
                self.flush_parked(&mut s)
            }
            Err(e) => {
                // Without an event nobody can tell when the block is safe
                // for other streams: it stays allocated, the caller may
                // retry the free.
                s.live.insert(addr, (size, block));
                s.active += size;
                Err(e)
            }
        }
    }

    /// Releases cached memory: events are polled, wholly free split-cache
    /// chunks go back to the lake, and the lake returns every free chunk
    /// no stream may still be using to the driver. Returns the physical
    /// bytes released. In capture mode it does nothing.
    pub fn empty_cache(&self) -> PoolResult<u64> {
        if self.is_capturing() {
            return Ok(0);
        }
        let mut s = self.state();
        self.flush_parked(&mut s)?;
        self.poll(&mut s)?;
        self.release_empty_chunks(&mut s)?;
        self.lake.trim_settled(&s.progress).map_err(PoolError::Lake)
    }

    /// Sets the peaks to the current values.
    pub fn reset_peaks(&self) {
        let reserved = self.lake.reserved_bytes();
        let mut s = self.state();
        s.peak_active = s.active;
        s.peak_reserved = reserved;
    }

    /// A snapshot of the pool's counters.
    pub fn stats(&self) -> PoolStats {
        let s = self.state();
        let lake = self.lake.stats_with(&s.progress);
        let split_waiting = s.split.pending_bytes(&s.progress);
        let waiting: u64 = s.parked.iter().map(|(_, b)| b.capacity).sum::<u64>()
            + split_waiting
            + lake.breakdown.waiting_bytes;
        let (mut small_rounding, mut large_rounding) = (0, 0);
        for (size, b) in s.live.values() {
            match b.origin {
                Origin::Small => small_rounding += b.capacity - size,
                Origin::Large(_) => large_rounding += b.capacity - size,
            }
        }
        let breakdown = PoolBreakdown {
            active_bytes: s.active,
            small_rounding_bytes: small_rounding,
            large_rounding_bytes: large_rounding,
            split_free_bytes: s.split.free_bytes() - split_waiting,
            waiting_bytes: waiting,
            lake_free_bytes: lake.breakdown.free_bytes,
        };
        PoolStats {
            active_bytes: s.active,
            reserved_bytes: lake.reserved_bytes,
            peak_active_bytes: s.peak_active,
            peak_reserved_bytes: s.peak_reserved.max(lake.reserved_bytes),
            waiting_bytes: waiting,
            split_chunks: s.split.chunk_count() as u64,
            live_allocations: s.live.len() as u64,
            driver_calls: lake.driver.total().calls,
            event_calls: self.events.calls(),
            breakdown,
        }
    }

    /// Checks the split cache's tables and the lake's; the first broken
    /// rule, in words.
    pub fn check(&self) -> Result<(), String> {
        self.state().split.check()?;
        self.lake.check()
    }

    /// Numbers a free on `stream`, records its event and returns the
    /// fence the freed block goes behind.
    fn fence_free(&self, s: &mut State, stream: StreamId) -> PoolResult<Fence> {
        let event = self.events.record(stream)?;
        let seq = s.frees.entry(stream).or_default();
        *seq += 1;
        let seq = *seq;
        s.events.entry(stream).or_default().push_back((seq, event));
        if s.events[&stream].len() > MAX_EVENTS_PER_STREAM {
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

    /// Polls every stream's oldest events, recording what completed.
    fn poll(&self, s: &mut State) -> PoolResult<()> {
        let streams: Vec<StreamId> = s.events.keys().copied().collect();
        for stream in streams {
            self.poll_stream(s, stream)?;
        }
        Ok(())
    }

    /// Pops the completed oldest events of `stream` into the progress;
    /// free split pieces kept apart by then settled fences merge.
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
            s.split.settle(&s.progress);
        }
        if s.events.get(&stream).is_some_and(VecDeque::is_empty) {
            s.events.remove(&stream);
        }
        Ok(())
    }

    /// Gives a block back to where it came from, behind `fence`; a split
    /// chunk left wholly free goes on to the lake.
    fn release(&self, s: &mut State, block: Block, fence: &Fence) -> PoolResult<()> {
        match block.origin {
            Origin::Small => {
                let freed = s.split.give_back(block.addr, fence, &s.progress);
                debug_assert!(freed.is_some(), "piece {:#x} was in use", block.addr);
                for (range, fence) in s.split.take_empty_chunks(SplitCache::SPARE_EMPTY) {
                    self.lake
                        .free_fenced(range, Site::default(), &fence)
                        .map_err(PoolError::Lake)?;
                }
                Ok(())
            }
            Origin::Large(range) => self
                .lake
                .free_fenced(range, Site::default(), fence)
                .map_err(PoolError::Lake),
        }
    }

    /// Records events for blocks freed during capture and gives them back.
    fn flush_parked(&self, s: &mut State) -> PoolResult<()> {
        while let Some(&(stream, block)) = s.parked.last() {
            let fence = self.fence_free(s, stream)?;
            s.parked.pop();
            self.release(s, block, &fence)?;
        }
        Ok(())
    }

    /// Gives every wholly free split-cache chunk back to the lake.
    fn release_empty_chunks(&self, s: &mut State) -> PoolResult<()> {
        for (range, fence) in s.split.take_empty_chunks(0) {
            self.lake
                .free_fenced(range, Site::default(), &fence)
                .map_err(PoolError::Lake)?;
        }
        Ok(())
    }

    /// Serves a request from cached memory only (capture mode).
    fn alloc_cached(&self, s: &mut State, size: u64, stream: StreamId) -> PoolResult<Block> {
        let refused = PoolError::CaptureNeedsWarmPool {
            asked: size,
            stream: stream.0,
        };
        let req = Requester {
            stream: stream.0,
            progress: &s.progress,
        };
        if s.split.is_small(size) {
            let piece = s.split.take(size, &req).ok_or(refused)?;
            return Ok(Block {
                addr: piece.addr,
                capacity: piece.len,
                origin: Origin::Small,
            });
        }
        let range = self
            .lake
            .alloc_cached_for(size, &req)
            .map_err(PoolError::Lake)?
            .ok_or(refused)?;
        Ok(self.large_block(range))
    }

    fn large_block(&self, range: DeviceRange) -> Block {
        Block {
            addr: range.addr,
            capacity: range.len.div_ceil(self.lake.granularity()) * self.lake.granularity(),
            origin: Origin::Large(range),
        }
    }

    /// Serves a request from the split cache or the lake, growing them.
    fn alloc_fresh(&self, s: &mut State, size: u64, stream: StreamId) -> PoolResult<Block> {
        let out = match self.try_fresh(s, size, stream) {
            Err(LakeError::OutOfMemory { .. }) => {
                self.release_empty_chunks(s)?;
                self.try_fresh(s, size, stream)
            }
            other => other,
        };
        let reserved = self.lake.reserved_bytes();
        s.peak_reserved = s.peak_reserved.max(reserved);
        match out {
            Ok(b) => Ok(b),
            Err(LakeError::OutOfMemory {
                reserved,
                limit,
                largest_free,
                ..
            }) => Err(PoolError::OutOfMemory {
                asked: size,
                reserved,
                active: s.active,
                limit,
                largest_free: largest_free.max(s.split.largest_free()),
                waiting: self.lake.stats_with(&s.progress).breakdown.waiting_bytes
                    + s.split.pending_bytes(&s.progress),
            }),
            Err(e) => Err(PoolError::Lake(e)),
        }
    }

    fn try_fresh(&self, s: &mut State, size: u64, stream: StreamId) -> Result<Block, LakeError> {
        let req = Requester {
            stream: stream.0,
            progress: &s.progress,
        };
        let site = Site {
            stream: stream.0 as u32,
            phase: 0,
        };
        if !s.split.is_small(size) {
            return self
                .lake
                .alloc_for(size, site, &req)
                .map(|r| self.large_block(r));
        }
        let piece = match s.split.take(size, &req) {
            Some(p) => p,
            None => {
                let chunk = self.lake.alloc_for(s.split.chunk_bytes(), site, &req)?;
                s.split.add_chunk(chunk);
                s.split
                    .take(size, &req)
                    .expect("a fresh chunk holds any small piece")
            }
        };
        Ok(Block {
            addr: piece.addr,
            capacity: piece.len,
            origin: Origin::Small,
        })
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
