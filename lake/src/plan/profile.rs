//! The profiler: requests of a trace, with their lifetimes on the plan's
//! timeline and whether they are static or dynamic.
//!
//! Steps are the trace's runs of one phase tag (the recorder stamps the
//! training step there). The first `warmup_steps` steps (set-up and the
//! first step, whose optimizer creates its states) form the *prologue*:
//! its requests are planned one by one as recorded, keyed by their
//! allocation ordinal in the prologue. The next `iterations` steps are the
//! profiled iterations: overlaid by allocation ordinal within the step,
//! they form the *template* iteration that every later step repeats.
//! Small and large requests (under and over
//! [`ProfileConfig::small_below`], 1 MiB by default as in PyTorch's two
//! pools) have ordinals of their own, so chatter of small tensors whose
//! number varies from step to step does not misalign the large ones.
//!
//! Positions count large events only, so that small ones whose number
//! varies do not shift them: within a step, the `k`-th large event is at
//! `2k + 1`, and a small event after `k` large ones at `2k`; a small
//! request lives from its gap to just past the gap of its free, so two
//! small requests of one gap always count as overlapping (conservative),
//! and a step of `L` large events is `2L + 1` positions long.
//!
//! A template request's lifetime is the widest seen: earliest allocation
//! position, latest free position (positions counted within the step; a
//! free in the next step counts `E` + its position there, `E` the longest
//! profiled step). Requests alive longer than one iteration cycle cannot be
//! repeated every step at one address: they are left unplanned (counted).
//!
//! Concurrency: pure functions over a [`Trace`].

use std::collections::HashMap;

use crate::{EventKind, Trace};

use super::align_up;

/// One or two half-open spans `[start, end)` of plan positions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lifetime {
    spans: [(u64, u64); 2],
    len: u8,
}

impl Lifetime {
    /// A single span; `start < end`.
    pub fn one(start: u64, end: u64) -> Lifetime {
        debug_assert!(start < end, "empty span {start}..{end}");
        Lifetime {
            spans: [(start, end), (0, 0)],
            len: 1,
        }
    }

    /// Two disjoint spans, each non-empty.
    pub fn two(a: (u64, u64), b: (u64, u64)) -> Lifetime {
        debug_assert!(a.0 < a.1 && b.0 < b.1 && (a.1 <= b.0 || b.1 <= a.0));
        Lifetime {
            spans: [a, b],
            len: 2,
        }
    }

    /// The spans.
    pub fn spans(&self) -> &[(u64, u64)] {
        &self.spans[..self.len as usize]
    }

    /// Whether some position lies in both.
    pub fn overlaps(&self, other: &Lifetime) -> bool {
        self.spans()
            .iter()
            .any(|&(s, e)| other.spans().iter().any(|&(s2, e2)| s < e2 && s2 < e))
    }

    /// The first position.
    pub fn start(&self) -> u64 {
        self.spans().iter().map(|s| s.0).min().unwrap_or(0)
    }

    /// One past the last position.
    pub fn end(&self) -> u64 {
        self.spans().iter().map(|s| s.1).max().unwrap_or(0)
    }

    /// Positions covered.
    pub fn duration(&self) -> u64 {
        self.spans().iter().map(|s| s.1 - s.0).sum()
    }
}

/// Which part of the plan a request belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Part {
    /// Set-up and warm-up steps, planned as recorded.
    Prologue,
    /// The iteration every later step repeats.
    Template,
}

/// One planned request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    /// Prologue or template.
    pub part: Part,
    /// Counted among small requests (under [`ProfileConfig::small_below`]
    /// bytes) rather than large ones.
    pub small: bool,
    /// Allocation ordinal among the small or the large requests of the
    /// prologue or of a step.
    pub ordinal: u32,
    /// The stream it was allocated on.
    pub stream: u32,
    /// Bytes planned (the largest size seen, aligned).
    pub size: u64,
    /// The smallest size seen, aligned.
    pub min_size: u64,
    /// Size or stream varied, or it was missing from a profiled step.
    pub dynamic: bool,
    /// When it lives on the plan's timeline.
    pub life: Lifetime,
}

/// How to profile.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProfileConfig {
    /// Steps planned as recorded before the profiled iterations.
    pub warmup_steps: usize,
    /// Profiled iterations overlaid into the template (K).
    pub iterations: usize,
    /// Requests under this many bytes (aligned) are matched among
    /// themselves: a varying number of small tensors (scalars, statistics)
    /// then does not shift the ordinals of the large ones. 0: one lane.
    pub small_below: u64,
}

impl Default for ProfileConfig {
    fn default() -> ProfileConfig {
        ProfileConfig {
            warmup_steps: 1,
            iterations: 3,
            small_below: 1 << 20,
        }
    }
}

/// The profile of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Profile {
    /// The small-request bound it was made with.
    pub small_below: u64,
    /// Steps in the prologue.
    pub prologue_steps: usize,
    /// Profiled iterations (K; fewer when the trace is short).
    pub iterations: usize,
    /// Positions of the prologue (P).
    pub prologue_len: u64,
    /// Positions of the template iteration (E, the longest profiled step).
    pub template_len: u64,
    /// The requests, prologue first, each part in ordinal order.
    pub requests: Vec<Request>,
    /// Template ordinals left out: alive longer than one iteration.
    pub unplanned: usize,
    /// Steps in the whole trace.
    pub trace_steps: usize,
    /// Peak of live bytes over the whole trace (sizes as recorded).
    pub trace_peak_live: u64,
}

/// One allocation of the trace and where its free came.
#[derive(Clone, Copy, Debug)]
struct AllocRec {
    step: usize,
    rel: u64,
    size: u64,
    stream: u32,
    free: Option<(usize, u64)>,
}

/// Steps as `(first event, events)`: maximal runs of one phase tag.
pub fn steps_of(trace: &Trace) -> Vec<(usize, usize)> {
    let mut steps: Vec<(usize, usize)> = Vec::new();
    let mut phase = None;
    for (i, e) in trace.events.iter().enumerate() {
        if phase != Some(e.site.phase) {
            steps.push((i, 0));
            phase = Some(e.site.phase);
        }
        if let Some(last) = steps.last_mut() {
            last.1 += 1;
        }
    }
    steps
}

/// Peak of live bytes of a trace, frees paired with allocs by address
/// (frees of unknown addresses ignored).
pub fn peak_live(trace: &Trace) -> u64 {
    let mut live: HashMap<u64, u64> = HashMap::new();
    let (mut now, mut peak) = (0u64, 0u64);
    for e in &trace.events {
        match e.kind {
            EventKind::Alloc => {
                if let Some(old) = live.insert(e.addr, e.size) {
                    now -= old;
                }
                now += e.size;
                peak = peak.max(now);
            }
            EventKind::Free => now -= live.remove(&e.addr).unwrap_or(0),
        }
    }
    peak
}

impl Profile {
    /// Profiles `trace`.
    pub fn of(trace: &Trace, config: &ProfileConfig) -> Profile {
        let steps = steps_of(trace);
        let small_below = config.small_below;
        let mut recs: Vec<AllocRec> = Vec::new();
        let mut open: HashMap<u64, usize> = HashMap::new();
        // Positions within each step (see the module documentation) and
        // each step's length and first position on a clock of all steps.
        let mut step_len: Vec<u64> = Vec::with_capacity(steps.len());
        for (s, &(first, n)) in steps.iter().enumerate() {
            let mut large_before = 0u64;
            for e in &trace.events[first..first + n] {
                // A free is classed as its allocation was.
                let size = match e.kind {
                    EventKind::Free => open.get(&e.addr).map_or(e.size, |&i| recs[i].size),
                    EventKind::Alloc => e.size,
                };
                let large = align_up(size) >= small_below;
                let (alloc_at, free_at) = (2 * large_before + large as u64, 2 * large_before + 1);
                large_before += large as u64;
                match e.kind {
                    EventKind::Alloc => {
                        open.insert(e.addr, recs.len());
                        recs.push(AllocRec {
                            step: s,
                            rel: alloc_at,
                            size: align_up(e.size),
                            stream: e.site.stream,
                            free: None,
                        });
                    }
                    EventKind::Free => {
                        if let Some(i) = open.remove(&e.addr) {
                            recs[i].free = Some((s, free_at));
                        }
                    }
                }
            }
            step_len.push(2 * large_before + 1);
        }
        let prologue_steps = config.warmup_steps.min(steps.len());
        let template_end = (prologue_steps + config.iterations).min(steps.len());
        let iterations = template_end - prologue_steps;
        let step_start: Vec<u64> = step_len
            .iter()
            .scan(0, |at, len| {
                let start = *at;
                *at += len;
                Some(start)
            })
            .collect();
        let prologue_len: u64 = step_len[..prologue_steps].iter().sum();
        let template_len = step_len[prologue_steps..template_end]
            .iter()
            .copied()
            .max()
            .unwrap_or(0);
        let (p, e) = (prologue_len, template_len);
        let mut requests = Vec::new();

        // Prologue: as recorded; alive past the first template step = for good.
        let forever = p + e;
        let mut next = [0u32; 2];
        for r in recs.iter().filter(|r| r.step < prologue_steps) {
            let small = r.size < small_below;
            let ordinal = next[small as usize];
            next[small as usize] += 1;
            let start = step_start[r.step] + r.rel;
            let end = match r.free {
                Some((s, rel)) if s < prologue_steps => step_start[s] + rel,
                Some((s, rel)) if s == prologue_steps && iterations > 0 => p + rel,
                _ => forever,
            };
            requests.push(Request {
                part: Part::Prologue,
                small,
                ordinal,
                stream: r.stream,
                size: r.size,
                min_size: r.size,
                dynamic: false,
                life: Lifetime::one(start, end.max(start + 1)),
            });
        }

        // Template: the profiled steps overlaid by allocation ordinal, small
        // and large requests counted apart.
        let mut per_lane: [Vec<Vec<&AllocRec>>; 2] =
            [vec![Vec::new(); iterations], vec![Vec::new(); iterations]];
        for r in recs
            .iter()
            .filter(|r| (prologue_steps..template_end).contains(&r.step))
        {
            per_lane[(r.size < small_below) as usize][r.step - prologue_steps].push(r);
        }
        let mut unplanned = 0;
        for (small, per_step) in [(false, &per_lane[0]), (true, &per_lane[1])] {
            let ordinals = per_step.iter().map(Vec::len).max().unwrap_or(0);
            for ordinal in 0..ordinals {
                let seen: Vec<&AllocRec> = per_step
                    .iter()
                    .filter_map(|s| s.get(ordinal).copied())
                    .collect();
                let first = seen[0];
                let dynamic = seen.len() < iterations
                    || seen
                        .iter()
                        .any(|r| r.size != first.size || r.stream != first.stream);
                let start = seen.iter().map(|r| r.rel).min().unwrap_or(0);
                // The free's position counted from this step's start; `None`
                // when it is unknown (no later step recorded) and `Some(MAX)`
                // when it lives past the next step.
                let ends: Vec<Option<u64>> = seen
                    .iter()
                    .map(|r| match r.free {
                        Some((s, rel)) if s == r.step => Some(rel),
                        Some((s, rel)) if s == r.step + 1 => Some(e + rel),
                        Some(_) => Some(u64::MAX),
                        None if r.step + 1 >= steps.len() => None,
                        None => Some(u64::MAX),
                    })
                    .collect();
                let Some(end) = ends.iter().flatten().copied().max() else {
                    unplanned += 1;
                    continue;
                };
                let life = if end <= e {
                    Lifetime::one(p + start, p + end.max(start + 1))
                } else if end != u64::MAX && end - e <= start && start < e {
                    let wrap = end - e;
                    if wrap == 0 {
                        Lifetime::one(p + start, p + e)
                    } else {
                        Lifetime::two((p, p + wrap), (p + start, p + e))
                    }
                } else {
                    unplanned += 1;
                    continue;
                };
                requests.push(Request {
                    part: Part::Template,
                    small,
                    ordinal: ordinal as u32,
                    stream: first.stream,
                    size: seen.iter().map(|r| r.size).max().unwrap_or(first.size),
                    min_size: seen.iter().map(|r| r.size).min().unwrap_or(first.size),
                    dynamic,
                    life,
                });
            }
        }
        Profile {
            small_below,
            prologue_steps,
            iterations,
            prologue_len: p,
            template_len: e,
            requests,
            unplanned,
            trace_steps: steps.len(),
            trace_peak_live: peak_live(trace),
        }
    }

    /// Requests that are static.
    pub fn static_count(&self) -> usize {
        self.requests.iter().filter(|r| !r.dynamic).count()
    }
}
