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

use gpu_kernels::workload::SplitMix64;
use lake::plan::pool::{drive, model_pool};
use lake::plan::profile::peak_live;
use lake::plan::{
    Part, Placement, Plan, PlannedArena, Profile, ProfileConfig, RuntimeStats, SynthConfig,
    align_up,
};
use lake::pluggable::replay;
use lake::pluggable::{PoolError, StreamId};
use lake::synthetic::{Gpt2Shape, gpt2_trace};
use lake::{Event, EventKind, Site, Trace};

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
    let r = lake::plan::runtime::replay(&plan, &trace);
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

/// Replays `trace` through the pool's planned mode on the data-less model
/// (64 GiB lake), checking every address handed out against every live one
/// (arena and fallback alike) with its own list, the pool's breakdown
/// against its reserved bytes every 97 events, and the pool at the end;
/// the plan's counters.
fn checked_pool_replay(plan: &Plan, trace: &Trace) -> RuntimeStats {
    let pool = model_pool(2 << 20, 64 << 30);
    pool.use_plan(plan.clone())
        .expect("the arena fits the lake");
    let mut live: Vec<(u64, u64)> = Vec::new();
    let mut at: HashMap<u64, (u64, StreamId)> = HashMap::new();
    let mut phase = None;
    for (i, e) in trace.events.iter().enumerate() {
        if phase.is_some_and(|p| p != e.site.phase) {
            pool.mark_step();
        }
        phase = Some(e.site.phase);
        let stream = StreamId(u64::from(e.site.stream));
        match e.kind {
            EventKind::Alloc => {
                let addr = pool.alloc(e.size, stream).expect("served");
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
                    pool.free(addr, stream).expect("freed");
                }
            }
        }
        if i % 97 == 0 {
            let st = pool.stats();
            assert_eq!(
                st.breakdown.total(),
                st.reserved_bytes,
                "{:?}",
                st.breakdown
            );
        }
    }
    pool.check().unwrap();
    let st = pool.stats();
    assert_eq!(
        st.breakdown.total(),
        st.reserved_bytes,
        "{:?}",
        st.breakdown
    );
    pool.plan_stats().expect("a plan is loaded")
}

#[test]
fn planned_pool_replays_recorded_gpt2_on_the_model_driver() {
    let trace = gpt2_b16();
    let plan = default_plan(&trace);
    let r = lake::plan::pool::replay(&plan, &trace, 80 << 30).unwrap();
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
    let pool = model_pool(2 << 20, 1 << 30);
    match pool.use_plan(plan) {
        Err(e @ PoolError::Plan(_)) => assert!(e.to_string().contains("arena"), "{e}"),
        Err(e) => panic!("wrong error {e}"),
        Ok(()) => panic!("a 12 GiB arena in a 1 GiB lake"),
    }
    // Nothing was taken, and the pool serves without a plan.
    assert_eq!(pool.stats().reserved_bytes, 0);
    assert!(pool.plan_stats().is_none());
    let a = pool.alloc(3 << 20, StreamId(0)).unwrap();
    pool.free(a, StreamId(0)).unwrap();
}

/// The b16 plan with steps 1–3 profiled (the longest sequence, 1021
/// tokens, is step 2), through the pool's planned mode: efficiency
/// against the pool's own counters (peak active over peak reserved, what
/// `gpumalloc_torch.stats()` reports on the GPU), breakdown exact.
#[test]
fn planned_mode_reaches_097_by_the_pools_own_counters() {
    let trace = gpt2_b16();
    let plan = default_plan(&trace);
    let stats = checked_pool_replay(&plan, &trace);
    assert_eq!(stats.fallbacks, 0, "{stats:?}");
    assert!(
        stats.plan_hits > 4000 && stats.dynamic_slot > 4000,
        "{stats:?}"
    );
    // The pool's view, as the C ABI's `gm_stats` reads it.
    let pool = model_pool(2 << 20, 64 << 30);
    pool.use_plan(plan.clone()).unwrap();
    let calls = pool.stats().driver_calls;
    drive(&pool, &trace).unwrap();
    let st = pool.stats();
    let eff = st.peak_active_bytes as f64 / st.peak_reserved_bytes as f64;
    eprintln!(
        "planned mode, b16: peak active {} / peak reserved {} = {eff:.4}",
        st.peak_active_bytes, st.peak_reserved_bytes
    );
    assert!(eff >= 0.97, "pool efficiency {eff:.4}: {st:?}");
    assert_eq!(
        st.planned_arena_bytes,
        plan.arena.div_ceil(2 << 20) * (2 << 20)
    );
    assert_eq!(st.plan, pool.plan_stats());
    // No driver call after the arena was mapped: the plan served it all.
    assert_eq!(st.driver_calls, calls);
}

/// Another model (synthetic GPT-2 at batch 4 and at batch 32) and another
/// run of this one with its sizes grown (a larger batch): served, never an
/// error, no overlap, breakdown exact, counted as fallbacks.
#[test]
fn planned_mode_falls_back_on_mismatching_traces() {
    let plan = default_plan(&gpt2_b16());
    for (name, trace) in [
        (
            "synthetic b4",
            gpt2_trace(Gpt2Shape {
                batch: 4,
                steps: 5,
                seed: 3,
            }),
        ),
        (
            "synthetic b32",
            gpt2_trace(Gpt2Shape {
                batch: 32,
                steps: 4,
                seed: 9,
            }),
        ),
        ("b16 grown", strayed(&gpt2_b16())),
    ] {
        let stats = checked_pool_replay(&plan, &trace);
        eprintln!("b16 plan serving {name}: {stats:?}");
        assert!(stats.fallbacks > 0, "{name}: {stats:?}");
    }
}

/// The pool refuses a plan while it holds live allocations or a window is
/// open, refuses to drop a plan whose arena is in use, and gives the arena
/// back when dropped; private pools never see the plan.
#[test]
fn use_plan_and_drop_plan_keep_the_pool_consistent() {
    use lake::pluggable::PoolId;
    let plan = default_plan(&gpt2_b16());
    let pool = model_pool(2 << 20, 64 << 30);
    let s0 = StreamId(0);
    let a = pool.alloc(1 << 20, s0).unwrap();
    let e = pool.use_plan(plan.clone()).unwrap_err();
    assert!(e.to_string().contains("live allocations"), "{e}");
    pool.free(a, s0).unwrap();
    let graph = PoolId(1, 1);
    pool.begin_allocate_to_pool(graph).unwrap();
    let e = pool.use_plan(plan.clone()).unwrap_err();
    assert!(e.to_string().contains("capture"), "{e}");
    pool.end_allocate_to_pool(graph).unwrap();
    pool.use_plan(plan.clone()).unwrap();
    let arena = pool.stats().planned_arena_bytes;
    assert!(arena >= plan.arena);
    // A private pool's request leaves the plan's counters alone.
    pool.begin_allocate_to_pool(graph).unwrap();
    let g = pool.alloc_in(5 << 20, s0, graph).unwrap();
    assert_eq!(pool.plan_stats().unwrap(), RuntimeStats::default());
    pool.end_allocate_to_pool(graph).unwrap();
    // The first general request is the plan's first (ordinal 0).
    let first = plan
        .requests
        .iter()
        .find(|r| r.request.part == Part::Prologue && !r.request.small && r.request.ordinal == 0)
        .expect("a first large request");
    let p = pool.alloc(first.request.size, s0).unwrap();
    let st = pool.plan_stats().unwrap();
    assert_eq!(st.plan_hits + st.dynamic_slot, 1, "{st:?}");
    let e = pool.drop_plan().unwrap_err();
    assert!(e.to_string().contains("still allocated"), "{e}");
    pool.free(p, s0).unwrap();
    let before = pool.stats();
    assert_eq!(before.breakdown.total(), before.reserved_bytes);
    let last = pool.drop_plan().unwrap().expect("a plan was loaded");
    assert_eq!(last.plan_hits + last.dynamic_slot, 1);
    let after = pool.stats();
    assert_eq!(after.planned_arena_bytes, 0);
    assert!(after.plan.is_none());
    assert_eq!(after.breakdown.total(), after.reserved_bytes);
    // The arena's chunks are lake memory now (free, or behind the fence of
    // the arena's stream until its work is seen complete).
    assert_eq!(after.reserved_bytes, before.reserved_bytes);
    assert!(after.breakdown.lake_free_bytes + after.breakdown.waiting_bytes >= arena);
    pool.free(g, s0).unwrap();
    pool.check().unwrap();
    assert!(pool.drop_plan().unwrap().is_none());
}

/// A planned block used by a second stream (`record_stream`) goes back to
/// the arena only once that stream's event completed; meanwhile the arena
/// keeps it live and the bytes count as waiting.
#[test]
fn planned_blocks_used_by_other_streams_wait_for_their_events() {
    use lake::pluggable::{ModelEvents, StreamPool};
    use lake::{ChunkOptions, Lake, LakeConfig, ModelVmm};
    let trace = gpt2_b16();
    let plan = default_plan(&trace);
    let lake = Lake::new(
        ModelVmm::without_data(2 << 20, ChunkOptions::default()),
        LakeConfig::with_limit(64 << 30),
    );
    let pool = StreamPool::new(lake, ModelEvents::new());
    pool.use_plan(plan.clone()).unwrap();
    let (s0, s1) = (StreamId(0), StreamId(1));
    let first = plan
        .requests
        .iter()
        .find(|r| r.request.part == Part::Prologue && !r.request.small && r.request.ordinal == 0)
        .unwrap();
    let a = pool.alloc(first.request.size, s0).unwrap();
    pool.record_stream(a, s1).unwrap();
    pool.free(a, s0).unwrap();
    let st = pool.stats();
    assert!(st.waiting_bytes >= align_up(first.request.size), "{st:?}");
    assert_eq!(st.breakdown.total(), st.reserved_bytes);
    pool.check().unwrap();
    // Events complete: the next request may take the space again.
    pool.events().complete_stream(s1);
    pool.events().complete_stream(s0);
    let b = pool.alloc(4096, s0).unwrap();
    let st = pool.stats();
    assert_eq!(st.waiting_bytes, 0, "{st:?}");
    assert_eq!(st.breakdown.total(), st.reserved_bytes);
    pool.free(b, s0).unwrap();
    pool.check().unwrap();
}

/// Trace file → plan file (`plan::synthesize_file`, what
/// `gm_plan_synthesize` calls) → `Plan::load` → the pool's planned mode:
/// the same plan, served as in memory; a trace too short for a plan and a
/// missing trace are refused in words.
#[test]
fn plan_file_from_a_trace_file_serves_the_pool() {
    let dir = std::env::temp_dir().join(format!("gm-plan-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let trace_path =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-b16-6steps.trace.gz");
    let plan_path = dir.join("b16.plan");
    let made = lake::plan::synthesize_file(
        &trace_path,
        &plan_path,
        &ProfileConfig::default(),
        &SynthConfig::default(),
    )
    .unwrap();
    assert!(made.seconds < 10.0, "synthesis {:.2} s", made.seconds);
    assert_eq!(made.trace_steps, 6);
    let back = Plan::load(&plan_path).unwrap();
    assert_eq!(back.requests, made.plan.requests);
    assert_eq!(back.arena, default_plan(&gpt2_b16()).arena);
    let r = lake::plan::pool::replay(&back, &gpt2_b16(), 80 << 30).unwrap();
    assert!(r.efficiency() >= 0.97, "{r:?}");
    assert_eq!(r.stats.fallbacks, 0);
    // One step only: nothing to profile after the warm-up.
    let short = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/gpt2-b16-2steps.trace.gz");
    let one = ProfileConfig {
        warmup_steps: 2,
        ..ProfileConfig::default()
    };
    let e = lake::plan::synthesize_file(&short, &dir.join("x.plan"), &one, &SynthConfig::default())
        .unwrap_err();
    assert!(e.contains("at least one profiled step"), "{e}");
    let e = lake::plan::synthesize_file(
        &dir.join("missing.trace"),
        &dir.join("y.plan"),
        &ProfileConfig::default(),
        &SynthConfig::default(),
    )
    .unwrap_err();
    assert!(e.contains("reading the trace"), "{e}");
    std::fs::remove_dir_all(&dir).ok();
}

/// The GPU benchmark's pipeline on the CPU, step for step: a profile run
/// (`train_gpt2.py --plan-profile 3`) records the pool's own trace from
/// the start with a step mark before steps 1.., saves it after step 3 and
/// synthesizes the plan from the file (`gm_plan_synthesize`); a planned
/// run (`--plan`) loads it into a fresh pool, marks steps the same way,
/// resets the peaks before step 2 and reads efficiency from the pool's own
/// counters, as `train_gpt2.py` does. The recorded GPT-2 b16 trace stands
/// in for the model's requests.
#[test]
fn profile_run_then_planned_run_as_the_benchmark_does() {
    let trace = gpt2_b16();
    let dir = std::env::temp_dir().join(format!("gm-plan-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let steps_of = |t: &Trace| {
        let mut phases: Vec<u32> = t.events.iter().map(|e| e.site.phase).collect();
        phases.dedup();
        phases
    };
    assert_eq!(steps_of(&trace).len(), 6);
    // Runs `trace`'s steps through `pool`, calling `at_step(step)` at the
    // start of each and stopping after step `last`.
    let drive =
        |pool: &lake::pluggable::StreamPool<_, _>, last: u32, at_step: &mut dyn FnMut(u32)| {
            let mut at: HashMap<u64, u64> = HashMap::new();
            let mut step = None;
            for e in &trace.events {
                if step != Some(e.site.phase) {
                    if e.site.phase > last {
                        break;
                    }
                    step = Some(e.site.phase);
                    at_step(e.site.phase);
                }
                match e.kind {
                    EventKind::Alloc => {
                        at.insert(e.addr, pool.alloc(e.size, StreamId(0)).unwrap());
                    }
                    EventKind::Free => {
                        if let Some(a) = at.remove(&e.addr) {
                            pool.free(a, StreamId(0)).unwrap();
                        }
                    }
                }
            }
        };
    // Profile run: ours with 16 MiB chunks (the C ABI's default).
    let profile_pool = model_pool(16 << 20, 80 << 30);
    profile_pool.start_trace();
    drive(&profile_pool, 3, &mut |s| {
        if s > 0 {
            profile_pool.mark_step();
        }
    });
    let recorded = profile_pool.take_trace().expect("recording");
    let trace_path = dir.join("b16.plan.trace");
    recorded.save(&trace_path).unwrap();
    let plan_path = dir.join("b16.plan");
    let made = lake::plan::synthesize_file(
        &trace_path,
        &plan_path,
        &ProfileConfig::default(),
        &SynthConfig::default(),
    )
    .unwrap();
    assert_eq!(made.trace_steps, 4);
    // Planned run.
    let pool = model_pool(16 << 20, 80 << 30);
    pool.use_plan(Plan::load(&plan_path).unwrap()).unwrap();
    drive(&pool, 5, &mut |s| {
        if s > 0 {
            pool.mark_step();
        }
        if s == 2 {
            pool.reset_peaks();
        }
    });
    let st = pool.stats();
    let plan = st.plan.expect("planned");
    let eff = st.peak_active_bytes as f64 / st.peak_reserved_bytes as f64;
    eprintln!(
        "benchmark pipeline, b16, 16 MiB chunks: synthesis {:.3} s, efficiency {eff:.4} \
         (peak active {} / peak reserved {}), {plan:?}",
        made.seconds, st.peak_active_bytes, st.peak_reserved_bytes
    );
    assert_eq!(plan.fallbacks, 0, "{plan:?}");
    assert!(eff >= 0.97, "efficiency {eff:.4}");
    assert_eq!(st.breakdown.total(), st.reserved_bytes);
    pool.check().unwrap();
    std::fs::remove_dir_all(&dir).ok();
}
