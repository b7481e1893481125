//! Reference tests of the tables' derived state. Seeded random sequences of
//! takes and gives (best-fit windows and windows anywhere, fenced or not),
//! stitches, patches, extensions, drops, growth and releases run against
//! the tables, while the test keeps its own plain set of used chunks.
//! After every step, each view's free runs as the tables read them (a home
//! view's stored runs and free bits, a stitched view's through its pieces)
//! are compared with runs recomputed slot by slot from that set, and best
//! fit's answer for every size with a brute-force search over them; then
//! `Tables::check` runs. Another test corrupts the derived state and
//! expects `Tables::check` to say so.
//!
//! Concurrency: none; each test owns its tables and model driver.

use std::collections::HashSet;

use gpu_kernels::workload::SplitMix64;

use super::*;
use crate::{ChunkOptions, ModelVmm};

/// Model chunk size: small, nothing is backed.
const G: u64 = 64 << 10;
/// Slots of the home view.
const HOME_SLOTS: usize = 96;
/// Largest request tried.
const MAX_N: usize = 14;

/// The free runs of view `v` recomputed slot by slot from `used`.
fn expected_runs(t: &Tables, used: &HashSet<ChunkId>, v: ViewId) -> Vec<(usize, usize)> {
    let free: Vec<usize> = t.views[&v]
        .slots
        .iter()
        .enumerate()
        .filter(|(_, c)| c.is_some_and(|c| !used.contains(&c)))
        .map(|(i, _)| i)
        .collect();
    consecutive(&free)
}

/// The free runs of view `v` as the tables read them: a stitched view's
/// through its pieces, a home view's from its bits, which its entries in
/// the run index must match.
fn derived_runs(t: &Tables, v: ViewId) -> Vec<(usize, usize)> {
    let view = &t.views[&v];
    let mut out = Vec::new();
    if view.stitched {
        t.stitched_runs(v, |s, l| out.push((s, l)));
    } else {
        view.free
            .free_stretches(0, view.slots.len(), |s, l| out.push((s, l)));
        let mut indexed: Vec<(usize, usize)> = t
            .runs
            .iter()
            .filter(|&(_, id, _)| id == v)
            .map(|(l, _, s)| (s, l))
            .collect();
        indexed.sort_unstable();
        assert_eq!(indexed, out, "home view {v}: run index and bits disagree");
    }
    out
}

/// Best fit by brute force over `expected_runs` (the rule of
/// `Tables::best_window`: shortest run of at least `n`, lowest view and
/// slot among equals, stitched views of at most `n + n / TIGHT + 1`
/// slots, the first `SCAN_RUNS` such runs searched for `n` chunks that
/// `req` may take).
fn reference_best(
    t: &Tables,
    used: &HashSet<ChunkId>,
    n: usize,
    req: &Requester<'_>,
) -> Option<Window> {
    let mut runs: Vec<(usize, ViewId, usize)> = Vec::new();
    for (&id, v) in &t.views {
        if v.stitched && v.slots.len() > n + n / TIGHT + 1 {
            continue;
        }
        for (start, len) in expected_runs(t, used, id) {
            if len >= n {
                runs.push((len, id, start));
            }
        }
    }
    runs.sort_unstable();
    runs.into_iter()
        .take(Tables::SCAN_RUNS)
        .find_map(|(len, view, start)| {
            let ok: Vec<usize> = (start..start + len)
                .filter(|&i| {
                    let c = t.views[&view].slots[i].expect("runs hold chunks");
                    t.chunks[&c].fence.admits(req)
                })
                .collect();
            consecutive(&ok)
                .into_iter()
                .find(|&(_, l)| l >= n)
                .map(|(start, _)| Window {
                    view,
                    start,
                    len: n,
                })
        })
}

/// Compares everything derived with the reference `used`.
fn compare(t: &Tables, used: &HashSet<ChunkId>, reqs: &[Requester<'_>], step: usize) {
    for &v in t.views.keys() {
        assert_eq!(
            derived_runs(t, v),
            expected_runs(t, used, v),
            "step {step}: runs of view {v}"
        );
    }
    for c in t.chunks.keys() {
        assert_eq!(t.is_used(c), used.contains(&c), "step {step}: chunk {c}");
    }
    assert_eq!(t.free_chunks, t.chunks.len() - used.len(), "step {step}");
    for req in reqs {
        for n in 1..=MAX_N {
            assert_eq!(
                t.best_window(n, req),
                reference_best(t, used, n, req),
                "step {step}: best fit of {n} for stream {}",
                req.stream
            );
        }
    }
    t.check()
        .unwrap_or_else(|e| panic!("step {step}: check: {e}"));
}

/// Up to `k` distinct free chunks not mapped by view `v` (any, if `v` is
/// `None`), picked at random.
fn free_chunks_outside(
    t: &Tables,
    used: &HashSet<ChunkId>,
    v: Option<ViewId>,
    k: usize,
    rng: &mut SplitMix64,
) -> Vec<ChunkId> {
    let mine: HashSet<ChunkId> = v
        .map(|v| t.views[&v].slots.iter().flatten().copied().collect())
        .unwrap_or_default();
    let mut pool: Vec<ChunkId> = t
        .chunks
        .keys()
        .filter(|c| !used.contains(c) && !mine.contains(c))
        .collect();
    let mut out = Vec::new();
    while out.len() < k && !pool.is_empty() {
        out.push(pool.swap_remove(rng.below(pool.len() as u64) as usize));
    }
    out
}

/// A random stitched view no allocation uses.
fn idle_stitched_view(t: &Tables, rng: &mut SplitMix64) -> Option<ViewId> {
    let idle: Vec<ViewId> = t
        .views
        .iter()
        .filter(|(_, v)| v.stitched && v.users == 0)
        .map(|(&id, _)| id)
        .collect();
    (!idle.is_empty()).then(|| idle[rng.below(idle.len() as u64) as usize])
}

#[test]
fn derived_runs_and_best_fit_match_a_recomputation_over_random_sequences() {
    for seed in [1, 2, 3, 4] {
        let driver = ModelVmm::without_data(G, ChunkOptions::default());
        let mut t = Tables::new(G);
        let home_count = HOME_SLOTS * 2 / 3;
        t.grow(
            &driver,
            Placement::NewView {
                capacity: HOME_SLOTS,
                count: home_count,
            },
            Spill::Off,
        )
        .unwrap();
        let mut used: HashSet<ChunkId> = HashSet::new();
        let mut live: Vec<Window> = Vec::new();
        let mut rng = SplitMix64(seed);
        let mut progress = Progress::new();
        let mut seq = 0u64;
        let mut clock = 0u64;
        // Stream 0 frees behind no fence, stream 1 behind its own.
        let (mut stitches, mut stitched_takes) = (0, 0);
        for step in 0..1500 {
            clock += 1;
            match rng.below(100) {
                // A best-fit window for stream 0 or 1.
                0..=29 => {
                    let n = 1 + rng.below(MAX_N as u64) as usize;
                    let req = Requester {
                        stream: rng.below(2),
                        progress: &progress,
                    };
                    if let Some(w) = t.best_window(n, &req) {
                        used.extend(t.chunks_in(w));
                        stitched_takes += usize::from(t.take(w).stitched);
                        live.push(w);
                    }
                }
                // A window anywhere in a free run of any view.
                30..=44 => {
                    let views: Vec<ViewId> = t.views.keys().copied().collect();
                    let v = views[rng.below(views.len() as u64) as usize];
                    let runs = expected_runs(&t, &used, v);
                    if !runs.is_empty() {
                        let (s, l) = runs[rng.below(runs.len() as u64) as usize];
                        let start = s + rng.below(l as u64) as usize;
                        let len = 1 + rng.below((s + l - start) as u64) as usize;
                        let w = Window {
                            view: v,
                            start,
                            len,
                        };
                        used.extend(t.chunks_in(w));
                        stitched_takes += usize::from(t.take(w).stitched);
                        live.push(w);
                    }
                }
                // Give a window back, behind a fence half of the time.
                45..=79 if !live.is_empty() => {
                    let w = live.swap_remove(rng.below(live.len() as u64) as usize);
                    for c in t.chunks_in(w).collect::<Vec<_>>() {
                        used.remove(&c);
                    }
                    let fence = if rng.below(2) == 0 {
                        Fence::none()
                    } else {
                        seq += 1;
                        Fence::single(1, seq)
                    };
                    t.give(w, clock, &fence);
                }
                // Stitch free chunks from anywhere.
                80..=87 => {
                    let k = 1 + rng.below(10) as usize;
                    let chunks = free_chunks_outside(&t, &used, None, k, &mut rng);
                    if !chunks.is_empty() {
                        let room = chunks.len() + chunks.len() / EXTEND_ROOM + 1;
                        t.stitch(&driver, &chunks, room, clock).unwrap();
                        stitches += 1;
                    }
                }
                // Patch, extend or drop an idle stitched view.
                88..=93 => {
                    if let Some(v) = idle_stitched_view(&t, &mut rng) {
                        let (m, reserved) = (t.views[&v].slots.len(), t.views[&v].reserved);
                        match rng.below(3) {
                            0 => {
                                let k = 1 + rng.below(m.min(3) as u64) as usize;
                                let with = free_chunks_outside(&t, &used, Some(v), k, &mut rng);
                                let mut slots: Vec<usize> = (0..m).collect();
                                let mut pick = Vec::new();
                                for _ in 0..with.len() {
                                    pick.push(
                                        slots.swap_remove(rng.below(slots.len() as u64) as usize),
                                    );
                                }
                                pick.sort_unstable();
                                t.patch(&driver, v, &pick, &with).unwrap();
                            }
                            1 if reserved > m => {
                                let k = 1 + rng.below((reserved - m) as u64) as usize;
                                let with = free_chunks_outside(&t, &used, Some(v), k, &mut rng);
                                if !with.is_empty() {
                                    t.extend(&driver, v, &with).unwrap();
                                }
                            }
                            _ => {
                                t.drop_stitched(&driver, v).unwrap();
                            }
                        }
                    }
                }
                // Release a free chunk mapped only at home; grow into the
                // holes and the tail.
                94..=96 => {
                    let lone: Vec<ChunkId> = t
                        .chunks
                        .iter()
                        .filter(|&(id, c)| !used.contains(&id) && c.stitched.is_empty())
                        .map(|(id, _)| id)
                        .collect();
                    if lone.len() > 1 {
                        let c = lone[rng.below(lone.len() as u64) as usize];
                        t.release_chunk(&driver, c).unwrap();
                    }
                }
                97..=98 => {
                    let (home, room) = t
                        .views
                        .iter()
                        .find(|(_, v)| !v.stitched)
                        .map(|(&id, v)| (id, v.slots.len() - v.filled_to))
                        .unwrap();
                    let placement = if t.hole_count() > 0 {
                        Placement::Holes(1 + rng.below(t.hole_count() as u64) as usize)
                    } else if room > 0 {
                        Placement::Tail(home, 1 + rng.below(room.min(4) as u64) as usize)
                    } else {
                        continue;
                    };
                    t.grow(&driver, placement, Spill::Off).unwrap();
                }
                // Stream 1's work completes up to its last free.
                _ => progress.advance(1, seq),
            }
            let reqs = [
                Requester {
                    stream: 0,
                    progress: &progress,
                },
                Requester {
                    stream: 1,
                    progress: &progress,
                },
            ];
            compare(&t, &used, &reqs, step);
        }
        assert!(
            stitches > 20 && stitched_takes > 20,
            "seed {seed}: {stitches} stitches, {stitched_takes} stitched takes"
        );
        for w in live.drain(..) {
            t.give(w, clock, &Fence::none());
        }
        t.teardown(&driver);
    }
}

#[test]
fn check_reports_derived_state_that_disagrees() {
    let driver = ModelVmm::without_data(G, ChunkOptions::default());
    let setup = || {
        let mut t = Tables::new(G);
        let chunks = t
            .grow(
                &driver,
                Placement::NewView {
                    capacity: 16,
                    count: 12,
                },
                Spill::Off,
            )
            .unwrap();
        // Chunks 0, 1, 2 and 6, 7 of home stitched back to back.
        let picked = [chunks[0], chunks[1], chunks[2], chunks[6], chunks[7]];
        let v = t.stitch(&driver, &picked, 8, 0).unwrap();
        let home = t.chunks[&chunks[0]].home.0;
        t.take(Window {
            view: home,
            start: 1,
            len: 1,
        });
        t.check().unwrap();
        (t, home, v)
    };
    // A home slot's bit says free while its chunk is used: the run index
    // does not list the run the bits make.
    let (mut t, home, _) = setup();
    t.views.get_mut(&home).unwrap().free.put(1, 2, true);
    assert!(t.check().unwrap_err().contains("run index"));
    // A bit set over an empty slot.
    let (mut t, home, _) = setup();
    t.views.get_mut(&home).unwrap().free.put(13, 14, true);
    assert!(t.check().unwrap_err().contains("runs differ"));
    // A stitched view's pieces no longer follow its slots.
    let (mut t, _, v) = setup();
    Arc::make_mut(&mut t.views.get_mut(&v).unwrap().pieces)[1].home_at += 1;
    assert!(t.check().is_err());
    // A run at home the index does not list.
    let (mut t, home, _) = setup();
    t.runs.0.retain(|&k| run_of(k).1 != home);
    assert!(t.check().unwrap_err().contains("run index"));
    // A stitched view missing from the index by size.
    let (mut t, _, v) = setup();
    t.stitched_by_size.retain(|&(_, id), _| id != v);
    assert!(t.check().unwrap_err().contains("size"));
}
