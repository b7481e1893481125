//! The planned allocator: serves allocations as offsets in one arena from a
//! [`Plan`], and a trace replay through it.
//!
//! Each allocation is matched to a planned request by its allocation
//! ordinal among the small or the large ones (see
//! [`super::profile`]; within the prologue, or within the current step once the
//! prologue's steps are over; [`PlannedArena::step`] marks a step's start,
//! as `gpumalloc_torch.step()` would). Then, in order:
//! 1. **planned**: a static request of the planned size and stream gets its
//!    planned offset, no search;
//! 2. **dynamic slot**: a request no larger than its planned slot (a dynamic
//!    one, or a static one that came smaller) takes the slot;
//! 3. **dynamic idle**: otherwise, best fit into the plan's idle space
//!    during the planned request's window (the dynamic reusable space);
//! 4. **fallback**: everything else (no planned request at that ordinal,
//!    another stream, nothing fits) best-fits above the plan's arena, which
//!    grows as needed. A request never fails because of the plan.
//!
//! Steps 1–3 take a range only if no live allocation holds any byte of it:
//! a run that strays from the plan (a tensor kept longer, sizes that grew)
//! costs memory, never correctness. Live ranges are kept in an ordered map,
//! so the freedom check is one predecessor lookup.
//!
//! Concurrency: one thread at a time (`&mut self`).

use std::collections::{BTreeMap, HashMap};
use std::fmt;

use crate::{EventKind, Trace};

use super::align_up;
use super::profile::{Part, peak_live};
use super::synth::Plan;

/// How an allocation was served.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Placement {
    /// At its planned offset.
    Planned,
    /// In its planned slot, smaller than planned.
    DynamicSlot,
    /// Best fit into space the plan leaves idle during its window.
    DynamicIdle,
    /// Above the plan.
    Fallback,
}

/// Counters of a planned arena.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuntimeStats {
    /// Served at the planned offset.
    pub plan_hits: u64,
    /// Served in their planned slot, smaller than planned.
    pub dynamic_slot: u64,
    /// Served in idle planned space.
    pub dynamic_idle: u64,
    /// Served above the plan.
    pub fallbacks: u64,
    /// Fallbacks with no planned request at their ordinal and stream.
    pub unmatched: u64,
    /// Highest end of any range handed out.
    pub high_water: u64,
}

/// A free of an offset that is not live.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NotLive {
    /// The offset freed.
    pub offset: u64,
}

impl fmt::Display for NotLive {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "offset {} is not a live allocation of this arena (double free, or never allocated)",
            self.offset
        )
    }
}

impl std::error::Error for NotLive {}

/// Allocations served from a plan.
#[derive(Debug)]
pub struct PlannedArena {
    plan: Plan,
    /// Request index by lane (large, small) and ordinal.
    prologue: [Vec<Option<usize>>; 2],
    template: [Vec<Option<usize>>; 2],
    idle: HashMap<usize, Vec<(u64, u64)>>,
    live: BTreeMap<u64, u64>,
    step: usize,
    ordinal: [usize; 2],
    stats: RuntimeStats,
}

impl PlannedArena {
    /// An empty arena serving `plan`, at the first step.
    pub fn new(plan: Plan) -> PlannedArena {
        let mut prologue = [Vec::new(), Vec::new()];
        let mut template = [Vec::new(), Vec::new()];
        for (i, p) in plan.requests.iter().enumerate() {
            let table = match p.request.part {
                Part::Prologue => &mut prologue[p.request.small as usize],
                Part::Template => &mut template[p.request.small as usize],
            };
            let k = p.request.ordinal as usize;
            if table.len() <= k {
                table.resize(k + 1, None);
            }
            table[k] = Some(i);
        }
        PlannedArena {
            plan,
            prologue,
            template,
            idle: HashMap::new(),
            live: BTreeMap::new(),
            step: 0,
            ordinal: [0; 2],
            stats: RuntimeStats::default(),
        }
    }

    /// The plan served.
    pub fn plan(&self) -> &Plan {
        &self.plan
    }

    /// Counters so far.
    pub fn stats(&self) -> RuntimeStats {
        self.stats
    }

    /// Marks the start of the next step.
    pub fn step(&mut self) {
        self.step += 1;
        if self.step >= self.plan.prologue_steps {
            self.ordinal = [0; 2];
        }
    }

    /// Whether no live range holds a byte of `[off, off + size)`.
    pub fn is_free(&self, off: u64, size: u64) -> bool {
        match self.live.range(..off + size).next_back() {
            Some((_, &end)) => end <= off,
            None => true,
        }
    }

    /// Serves `size` bytes on `stream`: the offset and how it was found.
    pub fn alloc(&mut self, size: u64, stream: u32) -> (u64, Placement) {
        if let Some(hit) = self.try_planned(size, stream) {
            return hit;
        }
        let size = align_up(size);
        let off = self.fallback_place(size);
        self.insert(off, size);
        (off, Placement::Fallback)
    }

    /// Steps 1–3 only: the offset and how it was found, or `None` when the
    /// request falls back (counted as a fallback; the caller serves it
    /// elsewhere, e.g. from the pool over the lake).
    pub fn try_planned(&mut self, size: u64, stream: u32) -> Option<(u64, Placement)> {
        let size = align_up(size);
        let lane = (size < self.plan.small_below) as usize;
        let table = if self.step < self.plan.prologue_steps {
            &self.prologue[lane]
        } else {
            &self.template[lane]
        };
        let planned = table.get(self.ordinal[lane]).copied().flatten();
        self.ordinal[lane] += 1;
        let matched = planned.filter(|&i| self.plan.requests[i].request.stream == stream);
        let Some((off, how)) = matched.and_then(|i| self.planned_place(i, size)) else {
            self.stats.fallbacks += 1;
            if matched.is_none() {
                self.stats.unmatched += 1;
            }
            return None;
        };
        match how {
            Placement::Planned => self.stats.plan_hits += 1,
            Placement::DynamicSlot => self.stats.dynamic_slot += 1,
            _ => self.stats.dynamic_idle += 1,
        }
        self.insert(off, size);
        Some((off, how))
    }

    /// Counts a request of `size` bytes served elsewhere without looking
    /// at the plan (its ordinal is used up, so later ones still match);
    /// counted as an unmatched fallback.
    pub fn skip(&mut self, size: u64) {
        let lane = (align_up(size) < self.plan.small_below) as usize;
        self.ordinal[lane] += 1;
        self.stats.fallbacks += 1;
        self.stats.unmatched += 1;
    }

    /// Marks `[off, off + size)` live; it must be free.
    fn insert(&mut self, off: u64, size: u64) {
        assert!(
            self.is_free(off, size),
            "planned arena: {off}+{size} overlaps a live range"
        );
        self.live.insert(off, off + size);
        self.stats.high_water = self.stats.high_water.max(off + size);
    }

    /// Frees the allocation at `offset`; its size.
    pub fn free(&mut self, offset: u64) -> Result<u64, NotLive> {
        self.live
            .remove(&offset)
            .map(|end| end - offset)
            .ok_or(NotLive { offset })
    }

    /// Steps 1–3 for planned request `i`.
    fn planned_place(&mut self, i: usize, size: u64) -> Option<(u64, Placement)> {
        let p = self.plan.requests[i];
        if let Some(off) = p.offset
            && size <= p.request.size
            && self.is_free(off, size)
        {
            let exact = !p.request.dynamic && size == p.request.size;
            let how = if exact {
                Placement::Planned
            } else {
                Placement::DynamicSlot
            };
            return Some((off, how));
        }
        let plan = &self.plan;
        let idle = self
            .idle
            .entry(i)
            .or_insert_with(|| plan.idle_during(&p.request.life, Some(i)));
        let mut best: Option<(u64, u64)> = None;
        for &(lo, hi) in idle.iter() {
            best_fit_in(&self.live, lo, hi, size, &mut best);
        }
        best.map(|(_, off)| (off, Placement::DynamicIdle))
    }

    /// Step 4: best fit above the plan, else at the top.
    fn fallback_place(&self, size: u64) -> u64 {
        let floor = self.plan.arena;
        let top = self
            .live
            .iter()
            .next_back()
            .map_or(floor, |(_, &end)| end.max(floor));
        let mut best = None;
        best_fit_in(&self.live, floor, top, size, &mut best);
        best.map_or(top, |(_, off)| off)
    }
}

/// Updates `best` (gap length, offset) with the smallest free gap of
/// `[lo, hi)` that holds `size` bytes.
fn best_fit_in(
    live: &BTreeMap<u64, u64>,
    lo: u64,
    hi: u64,
    size: u64,
    best: &mut Option<(u64, u64)>,
) {
    let mut consider = |from: u64, to: u64| {
        let len = to - from;
        if len >= size && best.is_none_or(|(b, _)| len < b) {
            *best = Some((len, from));
        }
    };
    let mut at = lo;
    if let Some((_, &end)) = live.range(..lo).next_back() {
        at = at.max(end);
    }
    for (&s, &e) in live.range(lo..hi) {
        if s > at {
            consider(at, s);
        }
        at = at.max(e);
    }
    if hi > at {
        consider(at, hi);
    }
}

/// What a replay through a planned arena gave.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlanReplay {
    /// Counters at the end.
    pub stats: RuntimeStats,
    /// Peak live bytes of the trace (sizes as recorded).
    pub peak_live: u64,
    /// The plan's arena.
    pub arena: u64,
    /// Bytes the run needed: the arena, or more where fallbacks went above.
    pub reserved: u64,
    /// Steps replayed.
    pub steps: usize,
}

impl PlanReplay {
    /// Peak live over reserved.
    pub fn efficiency(&self) -> f64 {
        if self.reserved == 0 {
            1.0
        } else {
            self.peak_live as f64 / self.reserved as f64
        }
    }
}

/// Replays `trace` through a fresh arena serving `plan`: steps at changes
/// of the phase tag, frees paired with allocs by address (frees of unknown
/// addresses skipped).
pub fn replay(plan: &Plan, trace: &Trace) -> PlanReplay {
    let mut arena = PlannedArena::new(plan.clone());
    let mut at: HashMap<u64, u64> = HashMap::new();
    let mut phase = None;
    let mut steps = 0;
    for e in &trace.events {
        if phase != Some(e.site.phase) {
            if phase.is_some() {
                arena.step();
            }
            steps += 1;
            phase = Some(e.site.phase);
        }
        match e.kind {
            EventKind::Alloc => {
                let (off, _) = arena.alloc(e.size, e.site.stream);
                if let Some(old) = at.insert(e.addr, off) {
                    // The trace reused a live address: treat as a free first.
                    let _ = arena.free(old);
                }
            }
            EventKind::Free => {
                if let Some(off) = at.remove(&e.addr) {
                    arena.free(off).expect("the arena handed this offset out");
                }
            }
        }
    }
    let stats = arena.stats();
    PlanReplay {
        stats,
        peak_live: peak_live(trace),
        arena: plan.arena,
        reserved: stats.high_water.max(plan.arena),
        steps,
    }
}
