//! `Lake`: the pool of physical chunks and its best-fit policy (GMLake,
//! Guo et al., ASPLOS 2024), over the tables of `tables.rs` (chunks, home
//! and stitched views, the run index).
//!
//! An allocation of `n` chunks is served by the first of:
//! 1. **reuse**: the best-fit window, the shortest run of at least `n` free
//!    chunks in any view (home or stitched), taken from its start: no
//!    driver call. A stitched view made for a larger request serves smaller
//!    ones by its prefix (up to a quarter smaller: [`super::tables::TIGHT`])
//!    while its other chunks serve others at home;
//! 2. **patch**: when a cached stitched view of at least `n` (and at most a
//!    quarter more) chunks has its first `n` chunks all free but for at
//!    most `n / 4`, those are replaced by other free chunks in place (unmap,
//!    map, grant access to just them): the same tensor at the next step
//!    finds its view again even if a few chunks were taken meanwhile, at
//!    the cost of a few chunks instead of a whole new stitch;
//! 3. **stitch**: when the free chunks number at least `n` but no run is
//!    long enough: home runs longest first, the last one the shortest that
//!    completes the request (its prefix), mapped back to back in a new
//!    stitched view: no new physical memory;
//! 4. **grow**: only the shortfall, `n` minus the free chunks, is made, at
//!    the end of the home view whose free tail run is longest (so that run
//!    grows; often no stitch is then needed), else in emptied home slots,
//!    else in a new home view; then 1, 2 or 3.
//!
//! **Remap rule**: a stitched view's slots are unmapped (patch, sweep,
//! trim) only once every free of its windows is settled: the work a
//! stream submitted before such a free may still be queued, reading and
//! writing through the view's addresses, and `cuMemUnmap` does not wait
//! for it (the kernels would fault, or, once another chunk is mapped
//! there, use the wrong memory). Reusing the chunks themselves needs no
//! such wait on the freeing stream (its later work is ordered after the
//! free), so a view freed but not settled still serves windows as it
//! lies, and a patch it would have needed becomes a stitch of a new view;
//! [`Lake::views_held_back`] counts those, so that the caller may wait for
//! the device ([`Lake::alloc_for`]'s `Requester::progress` then settles
//! them). Each view keeps the joined fences of its frees
//! (`View::fence`); the rule is checked in `patch`, `sweep` and
//! `trim_settled`, where the unmapping is decided.
//!
//! "Free chunks" means those the requester may take: a chunk freed behind
//! a fence ([`Lake::free_fenced`], `fence.rs`) is skipped by every outcome
//! for a stream its fence does not admit (it counts as waiting), and growth
//! makes what the admitted free chunks lack. So reserved memory grows only
//! when the free chunks cannot cover a request. Requests over [`LakeConfig::max_stitch_chunks`] (unlimited by
//! default) are never stitched: they take a window or grow a home run to
//! their size. `free` only marks chunks free (no driver call); stitched
//! views stay mapped for reuse and, beyond
//! [`LakeConfig::max_cached_stitched`] unused ones, the least recently used
//! are unmapped. Physical memory goes back to the driver only on
//! [`Lake::trim`]. When new chunks would pass [`LakeConfig::limit_bytes`],
//! the request fails with [`LakeError::OutOfMemory`].
//!
//! **Spill** ([`LakeConfig::spill_to_host`], off by default): when the
//! driver has no device memory for a new chunk, or the chunk would pass
//! the limit, the chunk is made in host memory and mapped at the same slot, so the placement, every address
//! and the trace are what they would be on a larger device; kernels read
//! and write those chunks over the bus. Spilled chunks are not reserved
//! bytes (which are device memory, what the limit caps): the statistics
//! count them apart ([`LakeStats::spilled_bytes`]), and [`Lake::trim`]
//! releases them like the others.
//!
//! Concurrency: one mutex guards all state (tables, live allocations,
//! statistics, the trace being recorded); every public call takes it once,
//! and driver calls are made while holding it, so the driver's own lock (if
//! any) always comes second. No call re-enters the lake.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use super::addr_map::AddrMap;
use super::config::LakeConfig;
use super::driver::VmmDriver;
use super::error::{LakeError, LakeResult};
use super::fence::{Fence, Progress, Requester};
use super::stats::{LakeBreakdown, LakeStats, Outcomes};
use super::tables::{ChunkId, Placement, Spill, Tables, ViewId, Window};
use super::trace::{EventKind, Site, Trace, TraceRecorder};

/// A contiguous device range handed out by [`Lake::alloc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceRange {
    /// Device address of the first byte.
    pub addr: u64,
    /// Bytes asked for (the range is mapped up to whole chunks beyond it).
    pub len: u64,
}

/// A live allocation: its window and the bytes asked for.
#[derive(Clone, Copy, Debug)]
struct Live {
    window: Window,
    len: u64,
}

/// What the lake knows of an address it handed out.
#[derive(Clone, Copy, Debug)]
enum Handed {
    /// A live allocation starts there.
    Live(Live),
    /// Freed since (to tell a double free from a foreign range); forgotten
    /// when its view goes back to the driver.
    Freed,
}

/// Everything behind the lake's mutex.
struct State {
    tables: Tables,
    /// Every address handed out, live or freed: one map, so that an alloc
    /// and a free each make one lookup (they made two and three with a
    /// set of freed addresses beside the live ones).
    handed: AddrMap<Handed>,
    /// Live allocations (entries of `handed` that are live).
    live_count: usize,
    active_bytes: u64,
    peak_active: u64,
    peak_reserved: u64,
    peak_spilled: u64,
    outcomes: Outcomes,
    frees: u64,
    /// Logical time for the LRU sweep.
    clock: u64,
    /// Patches and drops of stitched views refused by the remap rule.
    held_back: u64,
    trace: Option<TraceRecorder>,
}

/// A pool of physical chunks handing out contiguous device ranges.
pub struct Lake<D: VmmDriver> {
    driver: D,
    config: LakeConfig,
    /// The limit on physical bytes: `config.limit_bytes` until
    /// [`Lake::set_limit_bytes`] changes it.
    limit_bytes: AtomicU64,
    granularity: u64,
    state: Mutex<State>,
}

/// Most slots of one home view: 1 TiB of 2 MiB chunks (address space only).
const MAX_HOME_SLOTS: usize = 1 << 19;

impl<D: VmmDriver> Lake<D> {
    /// A lake over `driver` with `config`.
    pub fn new(driver: D, config: LakeConfig) -> Lake<D> {
        let granularity = driver.granularity();
        Lake {
            driver,
            limit_bytes: AtomicU64::new(config.limit_bytes),
            config,
            granularity,
            state: Mutex::new(State {
                tables: Tables::new(granularity),
                handed: AddrMap::default(),
                live_count: 0,
                active_bytes: 0,
                peak_active: 0,
                peak_reserved: 0,
                peak_spilled: 0,
                outcomes: Outcomes::default(),
                frees: 0,
                clock: 0,
                held_back: 0,
                trace: None,
            }),
        }
    }

    /// The driver (for tests and for copying data in and out).
    pub fn driver(&self) -> &D {
        &self.driver
    }

    /// The chunk size.
    pub fn granularity(&self) -> u64 {
        self.granularity
    }

    fn state(&self) -> MutexGuard<'_, State> {
        // Every mutation of the state completes or is undone before a
        // fallible step returns, so a poisoned lock still guards consistent
        // tables.
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn chunks_for(&self, bytes: u64) -> usize {
        bytes.div_ceil(self.granularity) as usize
    }

    fn limit_chunks(&self) -> usize {
        // Relaxed: the limit is read under the state lock by the only
        // decision that uses it; a change racing with a request applies to
        // the next one, as with any setting.
        (self.limit_bytes.load(Ordering::Relaxed) / self.granularity) as usize
    }

    /// The limit on physical bytes.
    pub fn limit_bytes(&self) -> u64 {
        self.limit_bytes.load(Ordering::Relaxed)
    }

    /// Changes the limit on device bytes (PyTorch's
    /// `set_per_process_memory_fraction`). Memory already held above a
    /// lowered limit stays until it is freed and trimmed; new chunks are
    /// refused while the lake holds more than the limit (made in host
    /// memory instead when [`LakeConfig::spill_to_host`] is on).
    pub fn set_limit_bytes(&self, bytes: u64) {
        // Relaxed: see `limit_chunks`.
        self.limit_bytes.store(bytes, Ordering::Relaxed);
    }

    /// Slots of a new home view: the limit (address space is cheap).
    fn home_slots(&self, at_least: usize) -> usize {
        self.limit_chunks().clamp(1, MAX_HOME_SLOTS).max(at_least)
    }

    /// Allocates `size` bytes as one contiguous device range.
    pub fn alloc(&self, size: u64) -> LakeResult<DeviceRange> {
        self.alloc_at(size, Site::default())
    }

    /// [`Lake::alloc`], recording `site` (stream and phase) in the trace.
    /// Takes only unfenced chunks (see [`Lake::alloc_for`]).
    pub fn alloc_at(&self, size: u64, site: Site) -> LakeResult<DeviceRange> {
        self.alloc_for(size, site, &Requester::unfenced())
    }

    /// [`Lake::alloc_at`] for `req`: free chunks whose fences do not admit
    /// it are left alone (they count as waiting, not as free).
    pub fn alloc_for(&self, size: u64, site: Site, req: &Requester<'_>) -> LakeResult<DeviceRange> {
        if size == 0 {
            return Err(LakeError::ZeroSize);
        }
        let mut s = self.state();
        let n = self.chunks_for(size);
        s.clock += 1;
        let window = self.best_fit(&mut s, n, req)?;
        Ok(self.hand_out(&mut s, window, size, site))
    }

    /// Allocates `size` bytes from chunks the lake already holds, with no
    /// driver call: a window of a view (outcome 1). `None` when none fits;
    /// used while a CUDA graph is being captured. Unfenced chunks only.
    pub fn alloc_cached(&self, size: u64) -> LakeResult<Option<DeviceRange>> {
        self.alloc_cached_for(size, &Requester::unfenced())
    }

    /// [`Lake::alloc_cached`] for `req`.
    pub fn alloc_cached_for(
        &self,
        size: u64,
        req: &Requester<'_>,
    ) -> LakeResult<Option<DeviceRange>> {
        self.alloc_cached_at(size, Site::default(), req)
    }

    /// [`Lake::alloc_cached_for`], recording `site` in the trace.
    pub fn alloc_cached_at(
        &self,
        size: u64,
        site: Site,
        req: &Requester<'_>,
    ) -> LakeResult<Option<DeviceRange>> {
        if size == 0 {
            return Err(LakeError::ZeroSize);
        }
        let mut s = self.state();
        let n = self.chunks_for(size);
        s.clock += 1;
        Ok(self
            .reuse(&mut s, n, req)
            .map(|w| self.hand_out(&mut s, w, size, site)))
    }

    /// Records a taken window as a live allocation of `size` bytes.
    fn hand_out(&self, s: &mut State, window: Window, size: u64, site: Site) -> DeviceRange {
        let addr = s.tables.addr_of(window);
        let before = s
            .handed
            .insert(addr, Handed::Live(Live { window, len: size }));
        debug_assert!(
            !matches!(before, Some(Handed::Live(_))),
            "{addr:#x} handed out twice"
        );
        s.live_count += 1;
        s.active_bytes += size;
        s.peak_active = s.peak_active.max(s.active_bytes);
        let reserved = s.tables.device_chunk_count() as u64 * self.granularity;
        s.peak_reserved = s.peak_reserved.max(reserved);
        let spilled = s.tables.host_chunk_count() as u64 * self.granularity;
        s.peak_spilled = s.peak_spilled.max(spilled);
        if let Some(t) = s.trace.as_mut() {
            t.record(EventKind::Alloc, size, addr, site);
        }
        DeviceRange { addr, len: size }
    }

    /// Chooses, prepares and takes the window for `n` chunks (outcomes
    /// 1–3). A failure leaves the tables as they were.
    fn best_fit(&self, s: &mut State, n: usize, req: &Requester<'_>) -> LakeResult<Window> {
        if let Some(w) = self.reuse(s, n, req) {
            return Ok(w);
        }
        let free = s.tables.admitted_free(req);
        if n <= self.config.max_stitch_chunks && free >= n {
            if let Some(w) = self.patch(s, n, req)? {
                s.outcomes.patch += 1;
                return Ok(w);
            }
            let w = self.stitch(s, n, req)?;
            s.outcomes.stitch += 1;
            self.sweep(s, req.progress);
            return Ok(w);
        }
        self.grow(s, n, free, req)
    }

    /// Outcome 1: the best-fit window, taken; no driver call.
    fn reuse(&self, s: &mut State, n: usize, req: &Requester<'_>) -> Option<Window> {
        let w = s.tables.best_window(n, req)?;
        if s.tables.take(w).stitched {
            s.outcomes.reuse_stitched += 1;
        } else {
            s.outcomes.reuse_home += 1;
        }
        Some(w)
    }

    /// Outcome 2: the cached stitched view needing the fewest new mappings
    /// (at most `n / 4`) to serve `n`, patched and taken; `None` when there
    /// is none (or not enough free chunks to patch with). A view of at
    /// least `n` chunks (and at most a quarter more) replaces the chunks of
    /// its first `n` slots that are taken; a view up to a quarter shorter
    /// also maps free chunks at its end, in the room its reservation kept
    /// ([`super::tables::EXTEND_ROOM`]): a longer sequence's logits extend
    /// the last ones' view.
    fn patch(&self, s: &mut State, n: usize, req: &Requester<'_>) -> LakeResult<Option<Window>> {
        let (best, held_back) = best_patch(&s.tables, n, req, true);
        if held_back {
            s.held_back += 1;
        }
        let Some((bad, extra, view)) = best else {
            return Ok(None);
        };
        let with = s.tables.replacements(view, bad.len() + extra, req);
        if with.len() < bad.len() + extra {
            return Ok(None);
        }
        let (replace, append) = with.split_at(bad.len());
        if !bad.is_empty() {
            s.tables.patch(&self.driver, view, &bad, replace)?;
        }
        if !append.is_empty() {
            s.tables.extend(&self.driver, view, append)?;
            s.outcomes.extend += 1;
        }
        let w = Window {
            view,
            start: 0,
            len: n,
        };
        s.tables.take(w);
        s.tables.touch(view, s.clock);
        Ok(Some(w))
    }

    /// Outcome 3: stitches `n` free chunks (there are enough) into a new
    /// view and takes all of it.
    fn stitch(&self, s: &mut State, n: usize, req: &Requester<'_>) -> LakeResult<Window> {
        let mut runs = s.tables.home_runs_longest_first(req);
        let mut chosen: Vec<ChunkId> = Vec::with_capacity(n);
        let mut need = n;
        while need > 0 {
            // The shortest run that completes the request, else the longest.
            let i = runs
                .iter()
                .rposition(|&(len, _, _)| len >= need)
                .unwrap_or(0);
            let (len, view, start) = runs.remove(i);
            let take = len.min(need);
            chosen.extend(s.tables.chunks_in(Window {
                view,
                start,
                len: take,
            }));
            need -= take;
        }
        let clock = s.clock;
        let room = n + n / super::tables::EXTEND_ROOM + 1;
        let view = s.tables.stitch(&self.driver, &chosen, room, clock)?;
        let w = Window {
            view,
            start: 0,
            len: n,
        };
        s.tables.take(w);
        Ok(w)
    }

    /// Outcome 4: makes the chunks `n` lacks beyond the `free` ones `req`
    /// may reuse, then reuses or stitches.
    fn grow(
        &self,
        s: &mut State,
        n: usize,
        free: usize,
        req: &Requester<'_>,
    ) -> LakeResult<Window> {
        let tails = s.tables.home_tails();
        let stitchable = n <= self.config.max_stitch_chunks;
        let (placement, fresh) = if stitchable {
            let fresh = n - free;
            let longest_tail = tails
                .iter()
                .filter(|&&(_, _, room)| room >= fresh)
                .max_by_key(|&&(_, run, _)| run);
            let placement = match longest_tail {
                Some(&(v, _, _)) => Placement::Tail(v, fresh),
                None if s.tables.hole_count() >= fresh => Placement::Holes(fresh),
                None => Placement::NewView {
                    capacity: self.home_slots(fresh),
                    count: fresh,
                },
            };
            (placement, fresh)
        } else {
            // Never stitched: extend the home tail run that needs the
            // fewest new chunks to reach `n`. A run of `n` or more that
            // best fit did not take is not `req`'s to reuse (behind another
            // stream's fence): extending it would add nothing.
            tails
                .iter()
                .filter(|&&(_, run, room)| run < n && room >= n - run)
                .min_by_key(|&&(_, run, _)| n - run)
                .map(|&(v, run, _)| (Placement::Tail(v, n - run), n - run))
                .unwrap_or((
                    Placement::NewView {
                        capacity: self.home_slots(n),
                        count: n,
                    },
                    n,
                ))
        };
        let spill = self.spill_for(s, fresh, n)?;
        let new = s.tables.grow(&self.driver, placement, spill)?;
        if let Some(w) = s.tables.best_window(n, req) {
            s.tables.take(w);
            s.outcomes.grow += 1;
            return Ok(w);
        }
        if !stitchable {
            // The extended tail run holds free chunks `req` may not reuse
            // yet (fenced): give the new ones back and make `n` chunks of
            // a view of their own. Never a stitch over the cap.
            self.give_back_new(s, new);
            return self.grow_own_view(s, n, req);
        }
        let patched = match self.patch(s, n, req) {
            Ok(Some(w)) => Ok(w),
            Ok(None) => self.stitch(s, n, req),
            Err(e) => Err(e),
        };
        match patched {
            Ok(w) => {
                s.outcomes.grow_stitch += 1;
                self.sweep(s, req.progress);
                Ok(w)
            }
            Err(e) => {
                // Give the new chunks back: the request failed.
                self.give_back_new(s, new);
                Err(e)
            }
        }
    }

    /// Where `fresh` new chunks for a request of `n` may go. The limit
    /// caps device memory; with the spill on, what passes it goes to host
    /// memory like what the driver has no memory for; without it, a
    /// request that needs more than the room left is out of memory.
    fn spill_for(&self, s: &State, fresh: usize, n: usize) -> LakeResult<Spill> {
        let device_room = self
            .limit_chunks()
            .saturating_sub(s.tables.device_chunk_count());
        if self.config.spill_to_host {
            Ok(Spill::On { device_room })
        } else if fresh > device_room {
            Err(self.out_of_memory(s, n))
        } else {
            Ok(Spill::Off)
        }
    }

    /// Releases chunks a failed placement made.
    fn give_back_new(&self, s: &mut State, new: Vec<ChunkId>) {
        for c in new {
            if let Err(undo) = s.tables.release_chunk(&self.driver, c) {
                debug_assert!(false, "undoing new chunks failed: {undo}");
            }
        }
    }

    /// Outcome 4 for a request over the stitch cap whose tail extension
    /// `req` could not use: `n` new chunks in a view of their own.
    fn grow_own_view(&self, s: &mut State, n: usize, req: &Requester<'_>) -> LakeResult<Window> {
        let spill = self.spill_for(s, n, n)?;
        let placement = Placement::NewView {
            capacity: self.home_slots(n),
            count: n,
        };
        let new = s.tables.grow(&self.driver, placement, spill)?;
        match s.tables.best_window(n, req) {
            Some(w) => {
                s.tables.take(w);
                s.outcomes.grow += 1;
                Ok(w)
            }
            None => {
                self.give_back_new(s, new);
                Err(self.out_of_memory(s, n))
            }
        }
    }

    fn out_of_memory(&self, s: &State, n: usize) -> LakeError {
        let g = self.granularity;
        let used = s.tables.chunk_count() - s.tables.free_chunks();
        LakeError::OutOfMemory {
            asked: g * n as u64,
            reserved: g * s.tables.device_chunk_count() as u64,
            active: g * used as u64,
            limit: g * self.limit_chunks() as u64,
            largest_free: g * s.tables.longest_run() as u64,
        }
    }

    /// Unmaps the least recently used unused stitched views beyond the
    /// cache limit. A failed unmap leaves the view cached (tried again on
    /// the next sweep).
    fn sweep(&self, s: &mut State, progress: &Progress) {
        // Counted as the views come and go: most sweeps (one per free of a
        // stitched window) stop here without a look at every view.
        if s.tables.idle_stitched() <= self.config.max_cached_stitched {
            return;
        }
        let mut idle: Vec<(u64, ViewId)> = s
            .tables
            .views()
            .filter(|(_, v)| v.stitched && v.users == 0)
            .map(|(id, v)| (v.last_used, id))
            .collect();
        if idle.len() <= self.config.max_cached_stitched {
            return;
        }
        let excess = idle.len() - self.config.max_cached_stitched;
        // The remap rule: views whose last users' work may be queued stay
        // mapped (dropped by a later sweep, once settled).
        let before = idle.len();
        idle.retain(|&(_, id)| !s.tables.view_in_flight(id, progress));
        if idle.len() < before {
            s.held_back += 1;
        }
        idle.sort_unstable();
        for &(_, id) in &idle[..excess.min(idle.len())] {
            if let Ok(range) = s.tables.drop_stitched(&self.driver, id) {
                forget(s, range);
            }
        }
    }

    /// Frees a range from [`Lake::alloc`]: its chunks become free (no
    /// driver call; a stitched view stays cached).
    pub fn free(&self, range: DeviceRange) -> LakeResult<()> {
        self.free_at(range, Site::default())
    }

    /// [`Lake::free`], recording `site` in the trace.
    pub fn free_at(&self, range: DeviceRange, site: Site) -> LakeResult<()> {
        self.free_fenced(range, site, &Fence::none())
    }

    /// [`Lake::free_at`]: the chunks become free behind `fence` (only
    /// requesters it admits may take them; see `fence.rs`).
    pub fn free_fenced(&self, range: DeviceRange, site: Site, fence: &Fence) -> LakeResult<()> {
        let mut s = self.state();
        let live = match s.handed.get_mut(&range.addr) {
            Some(entry @ Handed::Live(_)) => {
                let Handed::Live(live) = *entry else {
                    unreachable!("matched as live")
                };
                if live.len != range.len {
                    return Err(LakeError::NotOurs {
                        addr: range.addr,
                        len: range.len,
                        why: "the allocation there has another length",
                    });
                }
                *entry = Handed::Freed;
                live
            }
            Some(Handed::Freed) => return Err(LakeError::DoubleFree { addr: range.addr }),
            None => {
                return Err(LakeError::NotOurs {
                    addr: range.addr,
                    len: range.len,
                    why: "no live allocation starts there",
                });
            }
        };
        s.live_count -= 1;
        s.clock += 1;
        let clock = s.clock;
        s.tables.give(live.window, clock, fence);
        s.active_bytes -= live.len;
        s.frees += 1;
        if let Some(t) = s.trace.as_mut() {
            t.record(EventKind::Free, live.len, range.addr, site);
        }
        if s.tables.view(live.window.view).stitched {
            // No progress here: only views freed behind no fence (or
            // none pending at all) may go; the next placement's sweep,
            // which knows the requester's progress, drops the others.
            self.sweep(&mut s, &Progress::new());
        }
        Ok(())
    }

    /// Drops every unused stitched view freed behind no fence and returns
    /// every unfenced free chunk mapped nowhere else to the driver. Returns
    /// the physical bytes released.
    pub fn trim(&self) -> LakeResult<u64> {
        self.trim_settled(&Progress::new())
    }

    /// [`Lake::trim`], releasing also fenced chunks whose streams' work
    /// `progress` says is complete (never memory a stream may still use).
    pub fn trim_settled(&self, progress: &Progress) -> LakeResult<u64> {
        let mut s = self.state();
        let before = s.tables.chunk_count();
        // The remap rule: a view whose last users' work `progress` does
        // not show complete stays mapped.
        let idle: Vec<ViewId> = s
            .tables
            .views()
            .filter(|&(id, v)| v.stitched && v.users == 0 && !s.tables.view_in_flight(id, progress))
            .map(|(id, _)| id)
            .collect();
        for id in idle {
            let range = s.tables.drop_stitched(&self.driver, id)?;
            forget(&mut s, range);
        }
        for c in s.tables.releasable(progress) {
            if let Some(range) = s.tables.release_chunk(&self.driver, c)? {
                forget(&mut s, range);
            }
        }
        s.tables.retry_orphans(&self.driver);
        Ok((before - s.tables.chunk_count()) as u64 * self.granularity)
    }

    /// The device address of each chunk behind `range`, at its home
    /// mapping, in the range's order.
    pub fn chunk_homes(&self, range: DeviceRange) -> LakeResult<Vec<u64>> {
        let s = self.state();
        let live = live_at(&s, range.addr).ok_or(LakeError::NotOurs {
            addr: range.addr,
            len: range.len,
            why: "no live allocation starts there",
        })?;
        Ok(s.tables
            .chunks_in(live.window)
            .map(|c| s.tables.home_addr(c))
            .collect())
    }

    /// Patches and drops of stitched views the remap rule has refused so
    /// far (see the module docs): when this grows, waiting for the device
    /// and placing with the progress that gives lets the next placement
    /// patch and sweep them.
    pub fn views_held_back(&self) -> u64 {
        self.state().held_back
    }

    /// Whether placing `size` bytes for `req` now would patch a stitched
    /// view that the remap rule holds back: no window of free chunks fits,
    /// and the view a patch would pick, were the rule not there, may still
    /// be used by queued work. A caller that can wait for the device (the
    /// pool, with no capture open) does so first, so that the placement
    /// patches that view instead of stitching a new one. No driver call,
    /// nothing changed.
    pub fn placement_waits(&self, size: u64, req: &Requester<'_>) -> bool {
        self.placement_blocker(size, req).is_some()
    }

    /// What [`Lake::placement_waits`] waits for: the fence of the view a
    /// patch would pick (the joined fences of its frees), whose settling
    /// lets the placement patch it; `None` when the placement would not
    /// wait. A caller that can wait for that fence alone (an event at the
    /// view's last free) need not wait for everything queued since.
    pub fn placement_blocker(&self, size: u64, req: &Requester<'_>) -> Option<Fence> {
        let s = self.state();
        let n = self.chunks_for(size.max(1));
        if n > self.config.max_stitch_chunks || s.tables.best_window(n, req).is_some() {
            return None;
        }
        match best_patch(&s.tables, n, req, false).0 {
            Some((bad, _, view))
                if !bad.is_empty() && s.tables.view_in_flight(view, req.progress) =>
            {
                Some(s.tables.view(view).fence.clone())
            }
            _ => None,
        }
    }

    /// Whether `range` is served by a stitched view.
    pub fn is_stitched(&self, range: DeviceRange) -> bool {
        let s = self.state();
        live_at(&s, range.addr).is_some_and(|l| s.tables.view(l.window.view).stitched)
    }

    /// Device bytes held now (cheaper than [`Lake::stats`]); spilled
    /// chunks are not counted ([`Lake::spilled_bytes`]).
    pub fn reserved_bytes(&self) -> u64 {
        self.state().tables.device_chunk_count() as u64 * self.granularity
    }

    /// Bytes of chunks held in host memory now (the spill; 0 unless
    /// [`LakeConfig::spill_to_host`]).
    pub fn spilled_bytes(&self) -> u64 {
        self.state().tables.host_chunk_count() as u64 * self.granularity
    }

    /// A snapshot of the lake's counters; fenced free chunks count as
    /// waiting (see [`Lake::stats_with`]).
    pub fn stats(&self) -> LakeStats {
        self.stats_with(&Progress::new())
    }

    /// A snapshot of the lake's counters; free chunks whose fences
    /// `progress` does not settle count as waiting.
    pub fn stats_with(&self, progress: &Progress) -> LakeStats {
        let s = self.state();
        let pending = s.tables.pending_free(progress) as u64;
        let g = self.granularity;
        let mapped: u64 = lives(&s).map(|(_, l)| l.window.len as u64).sum::<u64>() * g;
        let stitched = s.tables.views().filter(|(_, v)| v.stitched).count() as u64;
        let stitched_chunks: u64 = s
            .tables
            .views()
            .filter(|(_, v)| v.stitched)
            .map(|(_, v)| v.slots.len() as u64)
            .sum();
        LakeStats {
            active_bytes: s.active_bytes,
            reserved_bytes: g * s.tables.device_chunk_count() as u64,
            peak_active_bytes: s.peak_active,
            peak_reserved_bytes: s.peak_reserved,
            spilled_chunks: s.tables.host_chunk_count() as u64,
            spilled_bytes: g * s.tables.host_chunk_count() as u64,
            peak_spilled_bytes: s.peak_spilled,
            spills: s.tables.spills(),
            live_allocations: s.live_count as u64,
            home_views: s.tables.views().count() as u64 - stitched,
            stitched_views: stitched,
            stitched_chunks,
            largest_free_bytes: g * s.tables.longest_run() as u64,
            outcomes: s.outcomes,
            frees: s.frees,
            driver: self.driver.counters(),
            breakdown: LakeBreakdown {
                active_bytes: s.active_bytes,
                rounding_bytes: mapped - s.active_bytes,
                free_bytes: g * (s.tables.free_chunks() as u64 - pending),
                waiting_bytes: g * pending,
            },
        }
    }

    /// Checks every invariant of the tables and of live allocations (every
    /// chunk of a live window used, none under two, no used chunk outside
    /// them, each view's user count); the first broken one, in words.
    pub fn check(&self) -> Result<(), String> {
        let s = self.state();
        s.tables.check()?;
        let mut owner: HashMap<ChunkId, u64> = HashMap::new();
        let mut users: HashMap<ViewId, usize> = HashMap::new();
        if lives(&s).count() != s.live_count {
            return Err(format!("{} live allocations counted", s.live_count));
        }
        for (addr, live) in lives(&s) {
            if s.tables.addr_of(live.window) != addr {
                return Err(format!("allocation {addr:#x} is not at its window"));
            }
            *users.entry(live.window.view).or_default() += 1;
            for c in s.tables.chunks_in(live.window) {
                if !s.tables.is_used(c) {
                    return Err(format!("allocation {addr:#x} sits on free chunk {c}"));
                }
                if let Some(other) = owner.insert(c, addr) {
                    return Err(format!(
                        "chunk {c} backs allocations {other:#x} and {addr:#x}"
                    ));
                }
            }
        }
        let used = s.tables.chunk_count() - s.tables.free_chunks();
        if used != owner.len() {
            return Err(format!(
                "{used} chunks used but {} under live allocations",
                owner.len()
            ));
        }
        for (id, v) in s.tables.views() {
            if v.users != users.get(&id).copied().unwrap_or(0) {
                return Err(format!("view {id} counts {} users", v.users));
            }
        }
        Ok(())
    }

    /// Starts recording every alloc and free (dropping a trace in progress).
    pub fn start_trace(&self) {
        self.state().trace = Some(TraceRecorder::new(self.granularity));
    }

    /// Stops recording and returns the trace, if one was being recorded.
    pub fn take_trace(&self) -> Option<Trace> {
        self.state().trace.take().map(TraceRecorder::finish)
    }
}

/// The cached stitched view needing the fewest new mappings (at most
/// `n / 4`) to serve `n` chunks for `req` (see `Lake::patch`): its slots
/// of `[0, n)` to replace, the slots to append, the view. With `rule`, a
/// view whose slots would be replaced is passed over while its last
/// users' work may be queued (the remap rule), and the second answer says
/// whether one was.
fn best_patch(
    tables: &Tables,
    n: usize,
    req: &Requester<'_>,
    rule: bool,
) -> (Option<(Vec<usize>, usize, ViewId)>, bool) {
    let mut held_back = false;
    let best = tables
        .views()
        .filter(|(_, v)| {
            let m = v.slots.len();
            v.stitched
                && v.users == 0
                && m <= n + n / super::tables::TIGHT + 1
                && (m >= n || (m + n / 4 >= n && v.reserved >= n))
        })
        .map(|(id, v)| {
            let m = v.slots.len().min(n);
            (tables.bad_prefix_slots(id, m, req), n - m, id)
        })
        .filter(|(bad, _, id)| {
            // Replacing a slot unmaps it; extending maps only slots
            // nobody used, which is allowed.
            let keep = !rule || bad.is_empty() || !tables.view_in_flight(*id, req.progress);
            held_back |= !keep;
            keep
        })
        .min_by_key(|(bad, extra, _)| bad.len() + extra);
    (
        best.filter(|(bad, extra, _)| bad.len() + extra <= n / 4),
        held_back,
    )
}

/// The live allocation starting at `addr`, if any.
fn live_at(s: &State, addr: u64) -> Option<Live> {
    match s.handed.get(&addr) {
        Some(&Handed::Live(live)) => Some(live),
        _ => None,
    }
}

/// Every live allocation, with its address.
fn lives(s: &State) -> impl Iterator<Item = (u64, Live)> + '_ {
    s.handed.iter().filter_map(|(&a, h)| match *h {
        Handed::Live(live) => Some((a, live)),
        Handed::Freed => None,
    })
}

/// Forgets freed addresses inside a range given back to the driver (no
/// live allocation lies there: its view had no users).
fn forget(s: &mut State, (base, size): (u64, u64)) {
    // A scan of the map: rare (a stitched view dropped, a trim), while
    // every alloc and free looks one address up.
    s.handed
        .retain(|&a, h| matches!(h, Handed::Live(_)) || !(base..base + size).contains(&a));
}

impl<D: VmmDriver> Drop for Lake<D> {
    fn drop(&mut self) {
        // Everything goes back to the driver, live allocations included:
        // their users must be done with them once the lake is gone. Errors
        // cannot be reported from here; the driver keeps what it refused.
        let s = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        s.handed.clear();
        s.live_count = 0;
        s.tables.teardown(&self.driver);
    }
}
