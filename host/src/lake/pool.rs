//! `Lake`: the pool of physical chunks and its best-fit policy (GMLake,
//! Guo et al., ASPLOS 2024), over the block tables of `block.rs`.
//!
//! An allocation of `n` chunks is served by the first of:
//! 1. **exact**: a free pBlock of exactly `n` chunks, else a cached sBlock of
//!    exactly `n` chunks whose pBlocks are all free;
//! 2. **split**: the smallest free pBlock larger than `n` (and at least
//!    [`LakeConfig::min_split_bytes`]), cut after `n` chunks;
//! 3. **stitch**: free pBlocks (each at least the split limit) that together
//!    hold `n` chunks, largest first, the last one chosen as the smallest
//!    that completes the request and split if larger; a new sBlock maps them;
//! 4. **grow and stitch**: new chunks for the shortfall stitched with every
//!    free pBlock that may take part; with nothing free, a new pBlock.
//!
//! Stitching is used only up to [`LakeConfig::max_stitch_chunks`]. `free`
//! only marks blocks inactive; sBlocks stay cached (mapped) for reuse, so a
//! periodic workload converges to exact matches; beyond
//! [`LakeConfig::max_cached_stitched`] inactive sBlocks, the least recently
//! used are unmapped. When new chunks would pass
//! [`LakeConfig::limit_bytes`], free pBlocks that cannot help are released
//! first, then the request fails with [`LakeError::OutOfMemory`].
//!
//! Concurrency: one mutex guards all state (block tables, live allocations,
//! statistics, the trace being recorded); every public call takes it once,
//! and driver calls are made while holding it, so the driver's own lock (if
//! any) always comes second. No call re-enters the lake.

use std::collections::{HashMap, HashSet};
use std::sync::{Mutex, MutexGuard};

use super::block::{Blocks, PId, SId};
use super::config::LakeConfig;
use super::driver::VmmDriver;
use super::error::{LakeError, LakeResult};
use super::stats::{LakeBreakdown, LakeStats, Outcomes};
use super::trace::{EventKind, Site, Trace, TraceRecorder};

/// A contiguous device range handed out by [`Lake::alloc`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct DeviceRange {
    /// Device address of the first byte.
    pub addr: u64,
    /// Bytes asked for (the range is mapped up to whole chunks beyond it).
    pub len: u64,
}

/// What backs a live allocation.
#[derive(Clone, Copy, Debug)]
enum Backing {
    Primitive(PId),
    Stitched(SId),
}

/// A live allocation.
#[derive(Clone, Copy, Debug)]
struct Live {
    backing: Backing,
    len: u64,
}

/// Everything behind the lake's mutex.
struct State {
    blocks: Blocks,
    live: HashMap<u64, Live>,
    /// Addresses handed out and freed since (to tell a double free from a
    /// foreign range); forgotten when their block goes back to the driver.
    freed: HashSet<u64>,
    active_bytes: u64,
    peak_active: u64,
    peak_reserved: u64,
    outcomes: Outcomes,
    frees: u64,
    /// Logical time for the LRU sweep.
    clock: u64,
    trace: Option<TraceRecorder>,
}

/// A pool of physical chunks handing out contiguous device ranges.
pub struct Lake<D: VmmDriver> {
    driver: D,
    config: LakeConfig,
    granularity: u64,
    state: Mutex<State>,
}

impl<D: VmmDriver> Lake<D> {
    /// A lake over `driver` with `config`.
    pub fn new(driver: D, config: LakeConfig) -> Lake<D> {
        let granularity = driver.granularity();
        Lake {
            driver,
            config,
            granularity,
            state: Mutex::new(State {
                blocks: Blocks::new(granularity),
                live: HashMap::new(),
                freed: HashSet::new(),
                active_bytes: 0,
                peak_active: 0,
                peak_reserved: 0,
                outcomes: Outcomes::default(),
                frees: 0,
                clock: 0,
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
        (self.config.limit_bytes / self.granularity) as usize
    }

    fn min_split_chunks(&self) -> usize {
        self.chunks_for(self.config.min_split_bytes).max(1)
    }

    /// Allocates `size` bytes as one contiguous device range.
    pub fn alloc(&self, size: u64) -> LakeResult<DeviceRange> {
        self.alloc_at(size, Site::default())
    }

    /// [`Lake::alloc`], recording `site` (stream and phase) in the trace.
    pub fn alloc_at(&self, size: u64, site: Site) -> LakeResult<DeviceRange> {
        if size == 0 {
            return Err(LakeError::ZeroSize);
        }
        let mut s = self.state();
        let n = self.chunks_for(size);
        s.clock += 1;
        let backing = match self.best_fit(&mut s, n) {
            Ok(b) => b,
            Err(LakeError::OutOfMemory { .. }) => {
                // Release what cannot help this request, then try once more.
                self.release_unhelpful(&mut s, n)?;
                self.best_fit(&mut s, n)?
            }
            Err(e) => return Err(e),
        };
        Ok(self.hand_out(&mut s, backing, size, site))
    }

    /// Allocates `size` bytes from blocks the lake already holds, with no
    /// driver call: an exact match or a split (outcomes 1 and 2). `None`
    /// when neither fits; used while a CUDA graph is being captured.
    pub fn alloc_cached(&self, size: u64) -> LakeResult<Option<DeviceRange>> {
        if size == 0 {
            return Err(LakeError::ZeroSize);
        }
        let mut s = self.state();
        let n = self.chunks_for(size);
        s.clock += 1;
        Ok(self
            .cached_fit(&mut s, n)
            .map(|backing| self.hand_out(&mut s, backing, size, Site::default())))
    }

    /// Records a chosen block as a live allocation of `size` bytes.
    fn hand_out(&self, s: &mut State, backing: Backing, size: u64, site: Site) -> DeviceRange {
        let addr = match backing {
            Backing::Primitive(p) => s.blocks.pblock(p).addr,
            Backing::Stitched(id) => s.blocks.sblock(id).addr,
        };
        s.live.insert(addr, Live { backing, len: size });
        s.freed.remove(&addr);
        s.active_bytes += size;
        s.peak_active = s.peak_active.max(s.active_bytes);
        let reserved = s.blocks.chunk_count() as u64 * self.granularity;
        s.peak_reserved = s.peak_reserved.max(reserved);
        if let Some(t) = s.trace.as_mut() {
            t.record(EventKind::Alloc, size, addr, site);
        }
        DeviceRange { addr, len: size }
    }

    /// Chooses and prepares the block for `n` chunks (outcomes 1–4) and
    /// marks it in use. Errors leave the tables as they were, except that a
    /// split done before a failed stitch stays (both pieces free).
    fn best_fit(&self, s: &mut State, n: usize) -> LakeResult<Backing> {
        if let Some(b) = self.cached_fit(s, n) {
            return Ok(b);
        }
        self.stitch_or_grow(s, n)
    }

    /// Outcomes 1 (exact) and 2 (split): table work only, no driver call.
    fn cached_fit(&self, s: &mut State, n: usize) -> Option<Backing> {
        let min = self.min_split_chunks();
        let clock = s.clock;
        // 1. Exact: a pBlock, else an available sBlock (most recent first).
        if let Some((_, p)) = s
            .blocks
            .smallest_free_at_least(n, 1)
            .filter(|&(len, _)| len == n)
        {
            s.blocks.set_in_use(p, true);
            s.outcomes.exact_primitive += 1;
            return Some(Backing::Primitive(p));
        }
        let cached = s
            .blocks
            .sblocks_of(n)
            .filter(|&id| s.blocks.sblock_available(id))
            .max_by_key(|&id| s.blocks.sblock(id).last_used);
        if let Some(id) = cached {
            s.blocks.set_sblock_active(id, true, clock);
            s.outcomes.exact_stitched += 1;
            return Some(Backing::Stitched(id));
        }
        // 2. Split the smallest larger pBlock.
        if let Some((_, p)) = s.blocks.smallest_free_at_least(n + 1, min) {
            s.blocks.split(p, n);
            s.blocks.set_in_use(p, true);
            s.outcomes.split += 1;
            return Some(Backing::Primitive(p));
        }
        None
    }

    /// Outcomes 3 (stitch) and 4 (grow and stitch): driver calls.
    fn stitch_or_grow(&self, s: &mut State, n: usize) -> LakeResult<Backing> {
        let min = self.min_split_chunks();
        let clock = s.clock;
        let reserved = s.blocks.chunk_count();
        let stitchable = n <= self.config.max_stitch_chunks;
        // Free pBlocks that may take part in a stitch, largest first. None
        // is larger than `n`: step 2 would have split it.
        let mut parts: Vec<(usize, PId)> = if stitchable {
            s.blocks
                .free_pblocks()
                .rev()
                .filter(|&(len, _)| len >= min)
                .collect()
        } else {
            Vec::new()
        };
        let sum: usize = parts.iter().map(|&(len, _)| len).sum();
        if stitchable && sum >= n {
            // 3. Stitch: largest first until the rest fits in one block;
            // that block is the smallest that does, split if larger.
            let mut chosen = Vec::new();
            let mut need = n;
            while need > 0 {
                let last = parts.iter().rposition(|&(len, _)| len >= need);
                let (len, p) = match last {
                    Some(i) => parts.remove(i),
                    None => parts.remove(0),
                };
                if len > need {
                    s.blocks.split(p, need);
                }
                chosen.push(p);
                need -= len.min(need);
            }
            let id = s.blocks.stitch(&self.driver, &chosen, clock)?;
            s.blocks.set_sblock_active(id, true, clock);
            s.outcomes.stitch += 1;
            self.sweep(s);
            return Ok(Backing::Stitched(id));
        }
        // 4. New chunks for the shortfall, stitched with what is free.
        let fresh = n - sum;
        if reserved + fresh > self.limit_chunks() {
            return Err(self.out_of_memory(s, n));
        }
        let new = s.blocks.create_pblock(&self.driver, fresh)?;
        if sum == 0 {
            s.blocks.set_in_use(new, true);
            s.outcomes.fresh += 1;
            return Ok(Backing::Primitive(new));
        }
        let mut chosen: Vec<PId> = parts.iter().map(|&(_, p)| p).collect();
        chosen.push(new);
        match s.blocks.stitch(&self.driver, &chosen, clock) {
            Ok(id) => {
                s.blocks.set_sblock_active(id, true, clock);
                s.outcomes.grow_stitch += 1;
                self.sweep(s);
                Ok(Backing::Stitched(id))
            }
            Err(e) => {
                // Give the new chunks back: the request failed.
                if let Err(undo) = s.blocks.release_pblock(&self.driver, new) {
                    debug_assert!(false, "undoing a new pBlock failed: {undo}");
                }
                Err(e.into())
            }
        }
    }

    fn out_of_memory(&self, s: &State, n: usize) -> LakeError {
        let g = self.granularity;
        let largest = s
            .blocks
            .free_pblocks()
            .next_back()
            .map_or(0, |(len, _)| len);
        let active: usize = s
            .blocks
            .pblocks()
            .filter(|(_, p)| p.in_use)
            .map(|(_, p)| p.chunks.len())
            .sum();
        LakeError::OutOfMemory {
            asked: g * n as u64,
            reserved: g * s.blocks.chunk_count() as u64,
            active: g * active as u64,
            limit: g * self.limit_chunks() as u64,
            largest_free: g * largest as u64,
        }
    }

    /// Releases the free pBlocks that could not serve `n` chunks (below the
    /// split limit, or all of them when `n` is too large to stitch) and the
    /// inactive sBlocks over them.
    fn release_unhelpful(&self, s: &mut State, n: usize) -> LakeResult<()> {
        let min = self.min_split_chunks();
        let everything = n > self.config.max_stitch_chunks;
        let victims: Vec<PId> = s
            .blocks
            .free_pblocks()
            .filter(|&(len, _)| everything || len < min)
            .map(|(_, p)| p)
            .collect();
        self.release_pblocks(s, &victims)
    }

    /// Drops the sBlocks over `victims` (all free) and releases them.
    fn release_pblocks(&self, s: &mut State, victims: &[PId]) -> LakeResult<()> {
        let victim_set: HashSet<PId> = victims.iter().copied().collect();
        let over: Vec<SId> = s
            .blocks
            .sblocks()
            .filter(|(_, sb)| {
                s.blocks
                    .pblocks_under(&sb.chunks)
                    .iter()
                    .any(|p| victim_set.contains(p))
            })
            .map(|(id, _)| id)
            .collect();
        for id in over {
            let addr = s.blocks.sblock(id).addr;
            s.blocks.drop_sblock(&self.driver, id)?;
            s.freed.remove(&addr);
        }
        for &p in victims {
            let addr = s.blocks.pblock(p).addr;
            s.blocks.release_pblock(&self.driver, p)?;
            s.freed.remove(&addr);
        }
        s.blocks.retry_orphans(&self.driver);
        Ok(())
    }

    /// Unmaps the least recently used inactive sBlocks beyond the cache
    /// limit. A failed unmap leaves the sBlock cached (tried again on the
    /// next sweep).
    fn sweep(&self, s: &mut State) {
        let mut inactive: Vec<(u64, SId)> = s
            .blocks
            .sblocks()
            .filter(|(_, sb)| !sb.active)
            .map(|(id, sb)| (sb.last_used, id))
            .collect();
        if inactive.len() <= self.config.max_cached_stitched {
            return;
        }
        inactive.sort_unstable();
        let excess = inactive.len() - self.config.max_cached_stitched;
        for &(_, id) in &inactive[..excess] {
            let addr = s.blocks.sblock(id).addr;
            if s.blocks.drop_sblock(&self.driver, id).is_ok() {
                s.freed.remove(&addr);
            }
        }
    }

    /// Frees a range from [`Lake::alloc`]: its blocks become inactive (no
    /// driver call; an sBlock stays cached).
    pub fn free(&self, range: DeviceRange) -> LakeResult<()> {
        self.free_at(range, Site::default())
    }

    /// [`Lake::free`], recording `site` in the trace.
    pub fn free_at(&self, range: DeviceRange, site: Site) -> LakeResult<()> {
        let mut s = self.state();
        let Some(live) = s.live.get(&range.addr).copied() else {
            return Err(if s.freed.contains(&range.addr) {
                LakeError::DoubleFree { addr: range.addr }
            } else {
                LakeError::NotOurs {
                    addr: range.addr,
                    len: range.len,
                    why: "no live allocation starts there",
                }
            });
        };
        if live.len != range.len {
            return Err(LakeError::NotOurs {
                addr: range.addr,
                len: range.len,
                why: "the allocation there has another length",
            });
        }
        s.clock += 1;
        let clock = s.clock;
        match live.backing {
            Backing::Primitive(p) => s.blocks.set_in_use(p, false),
            Backing::Stitched(id) => s.blocks.set_sblock_active(id, false, clock),
        }
        s.live.remove(&range.addr);
        s.freed.insert(range.addr);
        s.active_bytes -= live.len;
        s.frees += 1;
        if let Some(t) = s.trace.as_mut() {
            t.record(EventKind::Free, live.len, range.addr, site);
        }
        if matches!(live.backing, Backing::Stitched(_)) {
            self.sweep(&mut s);
        }
        Ok(())
    }

    /// Returns every free chunk to the driver and drops every inactive
    /// sBlock. Returns the physical bytes released.
    pub fn trim(&self) -> LakeResult<u64> {
        let mut s = self.state();
        let before = s.blocks.chunk_count();
        let inactive: Vec<SId> = s
            .blocks
            .sblocks()
            .filter(|(_, sb)| !sb.active)
            .map(|(id, _)| id)
            .collect();
        for id in inactive {
            let addr = s.blocks.sblock(id).addr;
            s.blocks.drop_sblock(&self.driver, id)?;
            s.freed.remove(&addr);
        }
        let victims: Vec<PId> = s.blocks.free_pblocks().map(|(_, p)| p).collect();
        self.release_pblocks(&mut s, &victims)?;
        Ok((before - s.blocks.chunk_count()) as u64 * self.granularity)
    }

    /// The device address of each chunk behind `range`, at its home
    /// (primitive) mapping, in the range's order.
    pub fn chunk_homes(&self, range: DeviceRange) -> LakeResult<Vec<u64>> {
        let s = self.state();
        let live = s.live.get(&range.addr).ok_or(LakeError::NotOurs {
            addr: range.addr,
            len: range.len,
            why: "no live allocation starts there",
        })?;
        let chunks = match live.backing {
            Backing::Primitive(p) => s.blocks.pblock(p).chunks.clone(),
            Backing::Stitched(id) => s.blocks.sblock(id).chunks.clone(),
        };
        Ok(chunks.iter().map(|c| s.blocks.chunk(*c).home).collect())
    }

    /// Whether `range` is served by a stitched block.
    pub fn is_stitched(&self, range: DeviceRange) -> bool {
        matches!(
            self.state().live.get(&range.addr),
            Some(Live {
                backing: Backing::Stitched(_),
                ..
            })
        )
    }

    /// A snapshot of the lake's counters.
    pub fn stats(&self) -> LakeStats {
        let s = self.state();
        let g = self.granularity;
        LakeStats {
            active_bytes: s.active_bytes,
            reserved_bytes: g * s.blocks.chunk_count() as u64,
            peak_active_bytes: s.peak_active,
            peak_reserved_bytes: s.peak_reserved,
            live_allocations: s.live.len() as u64,
            primitive_blocks: s.blocks.pblocks().count() as u64,
            stitched_blocks: s.blocks.sblocks().count() as u64,
            outcomes: s.outcomes,
            frees: s.frees,
            driver: self.driver.counters(),
            breakdown: Self::breakdown(&s, g),
        }
    }

    /// Where the reserved bytes are now.
    fn breakdown(s: &State, g: u64) -> LakeBreakdown {
        let mapped: u64 = s
            .live
            .values()
            .map(|l| match l.backing {
                Backing::Primitive(p) => s.blocks.pblock(p).chunks.len(),
                Backing::Stitched(id) => s.blocks.sblock(id).chunks.len(),
            } as u64)
            .sum::<u64>()
            * g;
        let free: u64 = s.blocks.free_pblocks().map(|(n, _)| n as u64).sum::<u64>() * g;
        LakeBreakdown {
            active_bytes: s.active_bytes,
            rounding_bytes: mapped - s.active_bytes,
            free_bytes: free,
        }
    }

    /// Physical bytes held now (cheaper than [`Lake::stats`]).
    pub fn reserved_bytes(&self) -> u64 {
        self.state().blocks.chunk_count() as u64 * self.granularity
    }

    /// Checks every invariant of the tables and of live allocations (no
    /// pBlock under two live allocations); the first broken one, in words.
    pub fn check(&self) -> Result<(), String> {
        let s = self.state();
        s.blocks.check()?;
        let mut owner: HashMap<PId, u64> = HashMap::new();
        for (&addr, live) in &s.live {
            let pblocks = match live.backing {
                Backing::Primitive(p) => vec![p],
                Backing::Stitched(id) => s
                    .blocks
                    .pblocks_under(&s.blocks.sblock(id).chunks)
                    .into_iter()
                    .collect(),
            };
            for p in pblocks {
                if !s.blocks.pblock(p).in_use {
                    return Err(format!("allocation {addr:#x} sits on free pBlock {p}"));
                }
                if let Some(other) = owner.insert(p, addr) {
                    return Err(format!(
                        "pBlock {p} backs allocations {other:#x} and {addr:#x}"
                    ));
                }
            }
        }
        let used = s.blocks.pblocks().filter(|(_, p)| p.in_use).count();
        if used != owner.len() {
            return Err(format!(
                "{used} pBlocks in use but {} under live allocations",
                owner.len()
            ));
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

impl<D: VmmDriver> Drop for Lake<D> {
    fn drop(&mut self) {
        // Everything goes back to the driver, live allocations included:
        // their users must be done with them once the lake is gone. Errors
        // cannot be reported from here; the driver keeps what it refused.
        let s = self.state.get_mut().unwrap_or_else(|e| e.into_inner());
        let live: Vec<Live> = s.live.drain().map(|(_, l)| l).collect();
        for l in live {
            match l.backing {
                Backing::Primitive(p) => s.blocks.set_in_use(p, false),
                Backing::Stitched(id) => s.blocks.set_sblock_active(id, false, s.clock),
            }
        }
        let sblocks: Vec<SId> = s.blocks.sblocks().map(|(id, _)| id).collect();
        for id in sblocks {
            let _ = s.blocks.drop_sblock(&self.driver, id);
        }
        let pblocks: Vec<PId> = s.blocks.pblocks().map(|(id, _)| id).collect();
        for p in pblocks {
            let _ = s.blocks.release_pblock(&self.driver, p);
        }
        s.blocks.retry_orphans(&self.driver);
    }
}
