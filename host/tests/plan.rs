//! CPU tests of the planned allocator (issue 14): the plan never places two
//! requests alive at once on a common byte, its arena is at least the
//! trace's peak of live bytes, the plan file reads back to the same plan
//! and refuses damage, and a run that strays from the plan (other sizes,
//! extra or missing requests, another model) is served by fallback without
//! any overlap.
//!
//! Workloads: seeded random "training" traces (a fixed pattern of
//! allocations per step, some of varying size, some freed in the next
//! step, persistent ones in the first step); the repository's GPT-2 trace
//! (batch 16, six steps, recorded on an H100); the synthetic GPT-2 trace.
//! Every replay here checks each range handed out against every live one
//! with its own list, independent of the arena's map.

use std::collections::HashMap;
use std::path::Path;
use std::time::Instant;

use gpu_kernel::workload::SplitMix64;
use host::lake::synthetic::{Gpt2Shape, gpt2_trace};
use host::lake::{ChunkOptions, Lake, LakeConfig, ModelVmm};
use host::lake::{Event, EventKind, Site, Trace};
use host::plan::pool::{PlannedPool, PlannedPoolError};
use host::plan::profile::peak_live;
use host::plan::{
    Part, Placement, Plan, PlannedArena, Profile, ProfileConfig, RuntimeStats, SynthConfig,
    align_up,
};
use host::pluggable::replay;
use host::pluggable::{ModelEvents, StreamId, StreamPool};

fn gpt2_b16() -> Trace {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-b16-6steps.trace.gz");
    replay::load(&path).expect("the repository's GPT-2 trace")
}

/// The plan of `trace` with the default profile and synthesis settings.
fn default_plan(trace: &Trace) -> Plan {
    Plan::synthesize(
        &Profile::of(trace, &ProfileConfig::default()),
        &SynthConfig::default(),
    )
}

/// Builds a trace from (step, alloc-or-free, size, addr) in order.
struct Builder {
    events: Vec<Event>,
    next_addr: u64,
}

impl Builder {
    fn new() -> Builder {
        Builder {
            events: Vec::new(),
            next_addr: 1 << 20,
        }
    }

    fn alloc(&mut self, step: u32, size: u64) -> (u64, u64) {
        let addr = self.next_addr;
        self.next_addr += 1 << 40 >> 10;
        self.push(EventKind::Alloc, step, (addr, size));
        (addr, size)
    }

    fn free(&mut self, step: u32, allocation: (u64, u64)) {
        self.push(EventKind::Free, step, allocation);
    }

    fn push(&mut self, kind: EventKind, step: u32, (addr, size): (u64, u64)) {
        self.events.push(Event {
            kind,
            size,
            addr,
            site: Site {
                stream: 0,
                phase: step,
            },
            time_ns: self.events.len() as u64,
        });
    }

    fn finish(self) -> Trace {
        Trace {
            granularity: 2 << 20,
            events: self.events,
        }
    }
}

/// One allocation of a step's pattern.
#[derive(Clone, Copy, Debug)]
struct Op {
    size: u64,
    dynamic: bool,
    /// Ops later in the step it is freed (before that op's alloc).
    life: usize,
    /// Freed in the next step, before this op index, instead.
    next_step: Option<usize>,
}

/// A seeded training-like trace: `persistent` allocations first, then
/// `steps` steps of `ops` allocations each repeating one pattern (dynamic
/// ones scaled per step), with frees within the step or early in the next.
fn random_trace(seed: u64, steps: u32, ops: usize, persistent: usize) -> Trace {
    let mut rng = SplitMix64(seed);
    let pattern: Vec<Op> = (0..ops)
        .map(|i| {
            // Small (under 33 KiB) or large (1 to 32 MiB): no size crosses
            // the default 1 MiB lane bound when scaled.
            let size = (512 * (1 + rng.below(64)) + rng.below(512)) << (11 * rng.below(2));
            let next_step = (rng.below(10) == 0 && i > 0).then(|| rng.below(i as u64) as usize);
            Op {
                size,
                dynamic: rng.below(3) == 0,
                life: 1 + rng.below(ops as u64 / 2 + 1) as usize,
                next_step,
            }
        })
        .collect();
    let mut b = Builder::new();
    for _ in 0..persistent {
        let size = 512 * (1 + rng.below(256));
        b.alloc(0, size);
    }
    let mut carried: Vec<(usize, (u64, u64))> = Vec::new();
    for step in 0..steps {
        let scale = 4 + rng.below(5); // dynamic sizes × 1 … 2
        let mut due: Vec<(usize, (u64, u64))> = std::mem::take(&mut carried);
        for (i, op) in pattern.iter().enumerate() {
            due.sort_by_key(|d| d.0);
            while due.first().is_some_and(|d| d.0 <= i) {
                let d = due.remove(0);
                b.free(step, d.1);
            }
            let size = if op.dynamic {
                op.size * scale / 4
            } else {
                op.size
            };
            let a = b.alloc(step, size);
            match op.next_step {
                Some(at) => carried.push((at, a)),
                None => due.push((i + op.life, a)),
            }
        }
        for d in due {
            b.free(step, d.1);
        }
    }
    b.finish()
}

/// Replays `trace` through an arena serving `plan`, checking every range
/// against every live one; the counters and the highest end.
fn checked_replay(plan: &Plan, trace: &Trace) -> RuntimeStats {
    let mut arena = PlannedArena::new(plan.clone());
    let mut live: Vec<(u64, u64)> = Vec::new(); // (offset, end)
    let mut at: HashMap<u64, u64> = HashMap::new();
    let mut phase = None;
    for e in &trace.events {
        if phase.is_some_and(|p| p != e.site.phase) {
            arena.step();
        }
        phase = Some(e.site.phase);
        match e.kind {
            EventKind::Alloc => {
                let (off, _) = arena.alloc(e.size, e.site.stream);
                let end = off + align_up(e.size);
                if let Some(&(o, x)) = live.iter().find(|&&(o, x)| off < x && o < end) {
                    panic!("{off}..{end} overlaps the live {o}..{x}");
                }
                live.push((off, end));
                at.insert(e.addr, off);
            }
            EventKind::Free => {
                if let Some(off) = at.remove(&e.addr) {
                    let k = live.iter().position(|l| l.0 == off).expect("live");
                    live.swap_remove(k);
                    arena.free(off).expect("the arena knows what it handed out");
                }
            }
        }
    }
    let stats = arena.stats();
    assert!(stats.high_water >= live.iter().map(|l| l.1).max().unwrap_or(0));
    stats
}

/// `trace` strayed from: sizes grown by a quarter from step 3 on (one in
/// four), an extra request every 50 allocations (kept to the step's end),
/// every 97th allocation dropped (with its free).
fn strayed(trace: &Trace) -> Trace {
    let mut rng = SplitMix64(3);
    let mut b = Builder::new();
    let mut addr_of: HashMap<u64, (u64, u64)> = HashMap::new();
    let mut extras: Vec<(u64, u64)> = Vec::new();
    let mut phase = trace.events[0].site.phase;
    for (i, e) in trace.events.iter().enumerate() {
        if e.site.phase != phase {
            for x in extras.drain(..) {
                b.free(phase, x);
            }
            phase = e.site.phase;
        }
        match e.kind {
            EventKind::Alloc if i % 97 == 0 => {}
            EventKind::Alloc => {
                let size = if e.site.phase >= 3 && rng.below(4) == 0 {
                    e.size + e.size / 4
                } else {
                    e.size
                };
                addr_of.insert(e.addr, b.alloc(e.site.phase, size));
                if i % 50 == 0 {
                    extras.push(b.alloc(e.site.phase, 1 + rng.below(64 << 20)));
                }
            }
            EventKind::Free => {
                if let Some(a) = addr_of.remove(&e.addr) {
                    b.free(e.site.phase, a);
                }
            }
        }
    }
    b.finish()
}

#[test]
fn profile_classifies_static_dynamic_and_wrapping_requests() {
    // Step 0: one persistent; steps 1-3: a static, a dynamic, one freed in
    // the next step.
    let mut b = Builder::new();
    b.alloc(0, 4096);
    let mut carry = None;
    for step in 1..=3u32 {
        let s = b.alloc(step, 1024);
        if let Some(c) = carry.take() {
            b.free(step, c);
        }
        let d = b.alloc(step, 1024 * u64::from(step));
        carry = Some(b.alloc(step, 2048));
        b.free(step, d);
        b.free(step, s);
    }
    let trace = b.finish();
    let one_lane = ProfileConfig {
        small_below: 0,
        ..ProfileConfig::default()
    };
    let profile = Profile::of(&trace, &one_lane);
    assert_eq!((profile.prologue_steps, profile.iterations), (1, 3));
    // One large event: positions 1 (the event) and 0, 2 (gaps).
    assert_eq!(profile.prologue_len, 3);
    let t: Vec<_> = profile
        .requests
        .iter()
        .filter(|r| r.part == Part::Template)
        .collect();
    assert_eq!(t.len(), 3);
    assert!(!t[0].dynamic && t[0].size == 1024);
    assert!(t[1].dynamic && t[1].size == 3072 && t[1].min_size == 1024);
    // Freed at position 1 of the next step, after the next step's first
    // allocation: it wraps (its previous instance holds the step's start).
    assert_eq!(t[2].life.spans().len(), 2, "{:?}", t[2].life);
    let p = &profile.requests[0];
    assert_eq!(
        (p.part, p.life.end()),
        (Part::Prologue, profile.prologue_len + profile.template_len)
    );
    let plan = Plan::synthesize(&profile, &SynthConfig::default());
    plan.check().unwrap();
    assert!(plan.arena >= profile.trace_peak_live);
    let stats = checked_replay(&plan, &trace);
    assert_eq!(stats.fallbacks, 0, "{stats:?}");
}

#[test]
fn random_traces_never_overlap_and_cover_the_peak() {
    let (mut bounded, mut wrapping, mut dynamic) = (0, 0, 0);
    for seed in 0..24 {
        let steps = 2 + (seed % 4) as u32;
        let trace = random_trace(seed, steps, 40 + 7 * seed as usize, (seed % 5) as usize);
        for config in [
            SynthConfig::default(),
            SynthConfig {
                phases: 4,
                fuse: false,
                ..SynthConfig::default()
            },
            SynthConfig {
                plan_dynamic: false,
                min_group: 1,
                ..SynthConfig::default()
            },
        ] {
            // Profile every step: the plan then bounds the whole trace.
            // One lane, or two (small under 1 MiB).
            let small_below = if seed % 2 == 0 { 0 } else { 1 << 20 };
            let profile = Profile::of(
                &trace,
                &ProfileConfig {
                    warmup_steps: 1,
                    iterations: steps as usize,
                    small_below,
                },
            );
            let plan = Plan::synthesize(&profile, &config);
            plan.check()
                .unwrap_or_else(|e| panic!("seed {seed} {config:?}: {e}"));
            wrapping += plan
                .requests
                .iter()
                .filter(|r| r.request.life.spans().len() == 2)
                .count();
            dynamic += plan.counts().1;
            assert!(plan.arena >= plan.planned_peak(), "seed {seed}");
            let stats = checked_replay(&plan, &trace);
            if config.plan_dynamic && profile.unplanned == 0 {
                assert!(plan.arena >= profile.trace_peak_live, "seed {seed}");
                assert_eq!(stats.fallbacks, 0, "seed {seed} {config:?}: {stats:?}");
                assert!(stats.high_water <= plan.arena, "seed {seed}");
                bounded += 1;
            }
            // Fewer profiled steps: later ones stray and must still be served.
            let short = Profile::of(
                &trace,
                &ProfileConfig {
                    warmup_steps: 1,
                    iterations: 1,
                    small_below,
                },
            );
            let plan = Plan::synthesize(&short, &config);
            plan.check().unwrap();
            checked_replay(&plan, &trace);
        }
    }
    // The workload exercises what it claims to.
    assert!(
        bounded >= 12 && wrapping > 0 && dynamic > 0,
        "{bounded} {wrapping} {dynamic}"
    );
}

#[test]
fn recorded_gpt2_plan_is_sound_tight_and_fast() {
    let trace = gpt2_b16();
    let started = Instant::now();
    let profile = Profile::of(&trace, &ProfileConfig::default());
    let plan = Plan::synthesize(&profile, &SynthConfig::default());
    let seconds = started.elapsed().as_secs_f64();
    assert!(seconds < 10.0, "profile and synthesis took {seconds:.1} s");
    plan.check().unwrap();
    assert_eq!(profile.trace_peak_live, peak_live(&trace));
    assert!(plan.arena >= profile.trace_peak_live);
    assert!(plan.arena >= plan.planned_peak());
    let stats = checked_replay(&plan, &trace);
    assert_eq!(stats.fallbacks, 0, "{stats:?}");
    let r = host::plan::runtime::replay(&plan, &trace);
    assert!(
        r.efficiency() >= 0.97,
        "planned efficiency {:.4} ({r:?})",
        r.efficiency()
    );
    assert!(stats.plan_hits > 0 && stats.dynamic_slot > 0, "{stats:?}");
}

#[test]
fn deviating_runs_fall_back_without_overlap() {
    let trace = gpt2_b16();
    let plan = default_plan(&trace);
    let strayed = strayed(&trace);
    let stats = checked_replay(&plan, &strayed);
    assert!(stats.fallbacks > 0 && stats.plan_hits > 0, "{stats:?}");
    // Another model altogether (the synthetic GPT-2 at batch 4).
    let other = gpt2_trace(Gpt2Shape {
        batch: 4,
        steps: 3,
        seed: 5,
    });
    let stats = checked_replay(&plan, &other);
    assert!(stats.fallbacks + stats.dynamic_idle > 0, "{stats:?}");
    // A second stream the plan never saw: all unmatched.
    let mut moved = gpt2_trace(Gpt2Shape {
        batch: 2,
        steps: 2,
        seed: 1,
    });
    for e in &mut moved.events {
        e.site.stream = 9;
    }
    let stats = checked_replay(&plan, &moved);
    assert_eq!(stats.unmatched, stats.fallbacks);
    assert_eq!(stats.plan_hits + stats.dynamic_slot + stats.dynamic_idle, 0);
}

#[test]
fn arena_serves_planned_offsets_and_refuses_bad_frees() {
    let trace = random_trace(5, 3, 30, 2);
    let plan = default_plan(&trace);
    let first = plan.requests[0];
    let mut arena = PlannedArena::new(plan.clone());
    let (off, how) = arena.alloc(first.request.size, first.request.stream);
    assert_eq!((Some(off), how), (first.offset, Placement::Planned));
    assert!(arena.free(off + 1).is_err());
    assert_eq!(arena.free(off), Ok(first.request.size));
    assert!(arena.free(off).is_err(), "double free");
}

#[test]
fn plan_file_round_trips_and_refuses_damage() {
    let trace = random_trace(11, 4, 60, 3);
    let plan = default_plan(&trace);
    let mut bytes = Vec::new();
    plan.write_to(&mut bytes).unwrap();
    let text = String::from_utf8(bytes).unwrap();
    assert!(text.starts_with("gpumalloc-plan 1\n# plan arena"));
    let back = Plan::read_from(&text).unwrap();
    assert_eq!(back, plan);

    let newer = text.replacen("gpumalloc-plan 1", "gpumalloc-plan 2", 1);
    assert!(Plan::read_from(&newer).is_err());
    let cut = &text[..text.len() / 2];
    assert!(Plan::read_from(cut).is_err());
    // Two requests alive together moved onto one offset: refused.
    let placed: Vec<_> = plan
        .requests
        .iter()
        .filter(|r| r.offset.is_some())
        .collect();
    let (a, b) = placed
        .iter()
        .flat_map(|a| placed.iter().map(move |b| (a, b)))
        .find(|(a, b)| a.offset != b.offset && a.request.life.overlaps(&b.request.life))
        .expect("two overlapping lifetimes");
    let mut damaged = plan.clone();
    let k = damaged
        .requests
        .iter()
        .position(|r| r == *b)
        .expect("present");
    damaged.requests[k].offset = a.offset;
    assert!(damaged.check().is_err());
    let mut bytes = Vec::new();
    damaged.write_to(&mut bytes).unwrap();
    assert!(Plan::read_from(&String::from_utf8(bytes).unwrap()).is_err());
}

#[test]
fn degenerate_traces_give_plans_that_serve_them() {
    // Empty; one step (all prologue); frees of addresses never allocated.
    let empty = Trace::default();
    let mut one = Builder::new();
    let a = one.alloc(0, 3 << 20);
    let b = one.alloc(0, 100);
    one.free(0, a);
    one.free(0, (77, 5)); // never allocated: skipped
    one.free(0, b);
    let one = one.finish();
    for trace in [empty, one] {
        let profile = Profile::of(&trace, &ProfileConfig::default());
        assert_eq!(profile.iterations, 0);
        let plan = Plan::synthesize(&profile, &SynthConfig::default());
        plan.check().unwrap();
        assert!(plan.arena >= profile.trace_peak_live);
        let stats = checked_replay(&plan, &trace);
        assert_eq!(stats.fallbacks, 0, "{stats:?}");
    }
}

/// Replays `trace` through a planned pool on the data-less model (64 GiB
/// lake), checking every address handed out against every live one (arena
/// and fallback alike) and the pool at the end; the arena's counters.
fn checked_pool_replay(plan: &Plan, trace: &Trace) -> RuntimeStats {
    let lake = Lake::new(
        ModelVmm::without_data(2 << 20, ChunkOptions::default()),
        LakeConfig::with_limit(64 << 30),
    );
    let mut pp = PlannedPool::new(
        StreamPool::new(lake, ModelEvents::completing()),
        plan.clone(),
    )
    .expect("the arena fits the lake");
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut at: HashMap<u64, (u64, StreamId)> = HashMap::new();
    let mut phase = None;
    for e in &trace.events {
        if phase.is_some_and(|p| p != e.site.phase) {
            pp.step();
        }
        phase = Some(e.site.phase);
        let stream = StreamId(u64::from(e.site.stream));
        match e.kind {
            EventKind::Alloc => {
                let addr = pp.alloc(e.size, stream).expect("served");
                let end = addr + e.size.max(1);
                if let Some(&(o, x)) = live.iter().find(|&&(o, x)| addr < x && o < end) {
                    panic!("{addr:#x}..{end:#x} overlaps the live {o:#x}..{x:#x}");
                }
                live.push((addr, end));
                at.insert(e.addr, (addr, stream));
            }
            EventKind::Free => {
                if let Some((addr, stream)) = at.remove(&e.addr) {
                    let k = live.iter().position(|l| l.0 == addr).expect("live");
                    live.swap_remove(k);
                    pp.free(addr, stream).expect("freed");
                }
            }
        }
    }
    pp.pool().check().unwrap();
    pp.stats()
}

#[test]
fn planned_pool_replays_recorded_gpt2_on_the_model_driver() {
    let trace = gpt2_b16();
    let plan = default_plan(&trace);
    let r = host::plan::pool::replay(&plan, &trace, 80 << 30).unwrap();
    assert_eq!(r.stats.fallbacks, 0, "{r:?}");
    assert!(
        r.efficiency() >= 0.97,
        "planned pool efficiency {:.4}",
        r.efficiency()
    );
    let stats = checked_pool_replay(&plan, &trace);
    assert_eq!(stats.fallbacks, 0);
}

#[test]
fn planned_pool_serves_strayed_runs_and_other_streams_from_the_lake() {
    let trace = gpt2_b16();
    let plan = default_plan(&trace);
    let stats = checked_pool_replay(&plan, &strayed(&trace));
    assert!(stats.fallbacks > 0 && stats.plan_hits > 0, "{stats:?}");
    // Every other allocation moved to a second stream: those go to the
    // stream pool, the rest still match their ordinals.
    let mut two = gpt2_b16();
    let mut stream_of: HashMap<u64, u32> = HashMap::new();
    for (i, e) in two.events.iter_mut().enumerate() {
        if e.kind == EventKind::Alloc {
            e.site.stream = (i % 2) as u32 * 7;
            stream_of.insert(e.addr, e.site.stream);
        } else if let Some(&s) = stream_of.get(&e.addr) {
            e.site.stream = s;
        }
    }
    let stats = checked_pool_replay(&plan, &two);
    assert!(stats.plan_hits > 0 && stats.unmatched > 0, "{stats:?}");
}

#[test]
fn planned_pool_refuses_an_arena_over_the_lake_limit() {
    let trace = gpt2_b16();
    let plan = default_plan(&trace);
    let lake = Lake::new(
        ModelVmm::without_data(2 << 20, ChunkOptions::default()),
        LakeConfig::with_limit(1 << 30),
    );
    match PlannedPool::new(StreamPool::new(lake, ModelEvents::completing()), plan) {
        Err(e @ PlannedPoolError::Arena(_)) => assert!(e.to_string().contains("arena")),
        Err(e) => panic!("wrong error {e}"),
        Ok(_) => panic!("a 12 GiB arena in a 1 GiB lake"),
    }
}
