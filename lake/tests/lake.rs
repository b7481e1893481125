//! CPU tests of `lake` on the model driver.
//!
//! Workloads: seeded random alloc/free sequences (sizes 1 byte to 12 chunks,
//! a small granularity so chunks are cheap host memory) checked after every
//! step; a periodic training-like trace (forward phase grows, backward phase
//! shrinks, recompute-like irregular temporaries) that must converge to
//! exact matches; injected map failures that must roll back; error messages.

use gpu_kernels::workload::SplitMix64;
use lake::periodic::{self, PeriodShape};
use lake::{
    ChunkOptions, DeviceRange, Lake, LakeConfig, LakeError, ModelCensus, ModelVmm, Site, Trace,
    VmmCall,
};

/// Model granularity in these tests: small, so host backing is cheap.
const G: u64 = 64 << 10;

fn new_lake(limit_chunks: u64) -> Lake<ModelVmm> {
    Lake::new(
        ModelVmm::new(G, ChunkOptions::default()),
        LakeConfig::with_limit(limit_chunks * G),
    )
}

/// A byte pattern unique to (tag, position).
fn pattern(tag: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (tag.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
        .collect()
}

/// Writes a tag pattern through each chunk's home (primitive) mapping and
/// reads it back through the allocation's own (possibly stitched) range.
fn write_through_homes(lake: &Lake<ModelVmm>, r: DeviceRange, tag: u64) {
    let homes = lake.chunk_homes(r).unwrap();
    let data = pattern(tag, (homes.len() as u64 * G) as usize);
    for (i, &h) in homes.iter().enumerate() {
        let part = &data[i * G as usize..(i + 1) * G as usize];
        lake.driver().write(h, part).unwrap();
    }
    assert_eq!(
        lake.driver().read(r.addr, data.len()).unwrap(),
        data,
        "range {:#x} reads back",
        r.addr
    );
}

/// Checks that the allocation still holds its tag's pattern.
fn still_holds(lake: &Lake<ModelVmm>, r: DeviceRange, tag: u64) {
    let len = (r.len.div_ceil(G) * G) as usize;
    assert_eq!(
        lake.driver().read(r.addr, len).unwrap(),
        pattern(tag, len),
        "allocation {:#x} was overwritten",
        r.addr
    );
}

fn empty() -> ModelCensus {
    ModelCensus::default()
}

#[test]
fn random_sequences_keep_every_invariant() {
    for seed in [1, 2, 3, 0xdead_beef] {
        let limit = 48;
        let lake = new_lake(limit);
        let mut rng = SplitMix64(seed);
        let mut live: Vec<(DeviceRange, u64)> = Vec::new();
        let (mut ooms, mut stitched) = (0, 0);
        for step in 0..1500u64 {
            let grow = live.is_empty() || rng.below(100) < 55;
            if grow {
                let size = 1 + rng.below(12 * G);
                match lake.alloc(size) {
                    Ok(r) => {
                        stitched += u64::from(lake.is_stitched(r));
                        write_through_homes(&lake, r, step);
                        live.push((r, step));
                    }
                    Err(LakeError::OutOfMemory { .. }) => ooms += 1,
                    Err(e) => panic!("seed {seed} step {step}: {e}"),
                }
            } else {
                let (r, tag) = live.swap_remove(rng.below(live.len() as u64) as usize);
                still_holds(&lake, r, tag);
                lake.free(r).unwrap();
            }
            lake.check()
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
            let st = lake.stats();
            assert!(
                st.reserved_bytes <= limit * G,
                "reserved {} over the limit",
                st.reserved_bytes
            );
            // No chunk backs two live allocations.
            let mut homes: Vec<u64> = live
                .iter()
                .flat_map(|(r, _)| lake.chunk_homes(*r).unwrap())
                .collect();
            let n = homes.len();
            homes.sort_unstable();
            homes.dedup();
            assert_eq!(
                homes.len(),
                n,
                "seed {seed} step {step}: a chunk backs two allocations"
            );
        }
        for (r, tag) in live.drain(..) {
            still_holds(&lake, r, tag);
            lake.free(r).unwrap();
        }
        let st = lake.stats();
        assert_eq!((st.active_bytes, st.live_allocations), (0, 0));
        lake.trim().unwrap();
        assert_eq!(lake.stats().reserved_bytes, 0);
        assert_eq!(
            lake.driver().census(),
            empty(),
            "seed {seed}: memory left with the driver"
        );
        println!(
            "seed {seed:#x}: {stitched} stitched allocations, {ooms} out-of-memory answers, outcomes {:?}",
            st.outcomes
        );
        assert!(stitched > 0, "the workload never stitched");
    }
}

#[test]
fn stitched_range_reads_what_primitive_ranges_wrote() {
    let lake = new_lake(64);
    let a: Vec<DeviceRange> = (0..4).map(|_| lake.alloc(2 * G).unwrap()).collect();
    // Free every other block: 4 free chunks, no two adjacent.
    for (i, r) in a.iter().enumerate() {
        lake.driver()
            .write(r.addr, &pattern(i as u64, 2 * G as usize))
            .unwrap();
    }
    lake.free(a[0]).unwrap();
    lake.free(a[2]).unwrap();
    let reserved = lake.stats().reserved_bytes;
    let big = lake.alloc(4 * G).unwrap();
    assert!(lake.is_stitched(big));
    assert_eq!(
        lake.stats().reserved_bytes,
        reserved,
        "stitching made no new memory"
    );
    // Whatever order the stitch chose, each chunk reads the same through
    // the stitched range as at its home in a primitive range.
    let homes = lake.chunk_homes(big).unwrap();
    let mut want = Vec::new();
    for &h in &homes {
        want.extend(lake.driver().read(h, G as usize).unwrap());
    }
    assert!(
        lake.driver().read(big.addr, 4 * G as usize).unwrap() == want,
        "stitched range differs"
    );
    let freed: Vec<u8> = [pattern(0, 2 * G as usize), pattern(2, 2 * G as usize)].concat();
    let mut sorted_want = want
        .chunks(G as usize)
        .map(<[u8]>::to_vec)
        .collect::<Vec<_>>();
    let mut sorted_freed = freed
        .chunks(G as usize)
        .map(<[u8]>::to_vec)
        .collect::<Vec<_>>();
    sorted_want.sort();
    sorted_freed.sort();
    assert!(
        sorted_want == sorted_freed,
        "the stitch is made of the freed chunks"
    );
    // And the other way: written through the stitch, read at home.
    lake.driver().write(big.addr + 3 * G, &[7; 16]).unwrap();
    assert_eq!(lake.driver().read(homes[3], 16).unwrap(), vec![7; 16]);
}

#[test]
fn five_outcomes_and_window_reuse() {
    let lake = new_lake(64);
    // Slots 0-1, 2, 3-4, 5 of one home view, each made as it is asked for.
    let a = lake.alloc(2 * G).unwrap();
    let b = lake.alloc(G).unwrap();
    let c = lake.alloc(2 * G).unwrap();
    let _d = lake.alloc(G).unwrap();
    assert_eq!(lake.stats().home_views, 1, "one home view grows");
    lake.free(a).unwrap();
    lake.free(c).unwrap();
    // 4 free chunks in two runs of 2: stitched, no new memory.
    let u = lake.alloc(4 * G).unwrap();
    assert!(lake.is_stitched(u));
    assert_eq!(lake.stats().reserved_bytes, 6 * G);
    lake.free(u).unwrap();
    // The cached view serves the same size again...
    let v = lake.alloc(4 * G).unwrap();
    assert_eq!(v.addr, u.addr);
    lake.free(v).unwrap();
    // ...and a smaller one by its prefix.
    let w = lake.alloc(3 * G).unwrap();
    assert_eq!(w.addr, u.addr);
    // Its last chunk still serves others at home (the run of 2 it sits in
    // is cut to 1, the other run of 2 stays).
    let x = lake.alloc(G).unwrap();
    assert!(!lake.is_stitched(x));
    lake.free(x).unwrap();
    lake.free(w).unwrap();
    // 6 chunks: 4 free, 2 made at the tail, all stitched.
    let y = lake.alloc(6 * G).unwrap();
    assert!(lake.is_stitched(y));
    assert_eq!(lake.stats().reserved_bytes, 8 * G);
    lake.free(y).unwrap();
    lake.free(b).unwrap();
    let o = lake.stats().outcomes;
    assert_eq!(
        (
            o.grow,
            o.reuse_home,
            o.reuse_stitched,
            o.stitch,
            o.grow_stitch
        ),
        (4, 1, 2, 1, 1)
    );
    lake.check().unwrap();
}

#[test]
fn growth_extends_the_free_tail_run_instead_of_stitching() {
    let lake = new_lake(64);
    let a = lake.alloc(2 * G).unwrap();
    let b = lake.alloc(3 * G).unwrap();
    lake.free(b).unwrap();
    // 3 free at the tail + 2 new right after them: one home run of 5.
    let big = lake.alloc(5 * G).unwrap();
    assert!(!lake.is_stitched(big));
    assert_eq!(big.addr, b.addr);
    assert_eq!(lake.stats().reserved_bytes, 7 * G);
    assert_eq!(lake.stats().outcomes.grow, 3);
    lake.free(big).unwrap();
    lake.free(a).unwrap();
    lake.check().unwrap();
}

#[test]
fn stitch_cap_grows_a_home_run_instead() {
    let mut config = LakeConfig::with_limit(64 * G);
    config.max_stitch_chunks = 4;
    let lake = Lake::new(ModelVmm::new(G, ChunkOptions::default()), config);
    let a = lake.alloc(2 * G).unwrap();
    let _b = lake.alloc(G).unwrap();
    let c = lake.alloc(2 * G).unwrap();
    let _d = lake.alloc(G).unwrap();
    lake.free(a).unwrap();
    lake.free(c).unwrap();
    // 5 chunks is over the cap: 5 new ones at home, no stitch.
    let five = lake.alloc(5 * G).unwrap();
    assert!(!lake.is_stitched(five));
    assert_eq!(lake.stats().reserved_bytes, 11 * G);
    // 4 is within it: the two free runs are stitched.
    let four = lake.alloc(4 * G).unwrap();
    assert!(lake.is_stitched(four));
    let o = lake.stats().outcomes;
    assert_eq!((o.stitch, o.grow_stitch), (1, 0));
    lake.check().unwrap();
}

#[test]
fn lru_sweep_drops_stitched_views_over_the_limit() {
    let mut config = LakeConfig::with_limit(64 * G);
    config.max_cached_stitched = 1;
    let lake = Lake::new(ModelVmm::new(G, ChunkOptions::default()), config);
    let parts: Vec<DeviceRange> = (0..8).map(|_| lake.alloc(G).unwrap()).collect();
    for r in parts.iter().step_by(2) {
        lake.free(*r).unwrap();
    }
    let a = lake.alloc(2 * G).unwrap();
    let b = lake.alloc(2 * G).unwrap();
    assert!(lake.is_stitched(a) && lake.is_stitched(b));
    lake.free(a).unwrap();
    lake.free(b).unwrap();
    assert_eq!(lake.stats().stitched_views, 1, "one cached view kept");
    // The most recently used (b) is the one kept.
    let again = lake.alloc(2 * G).unwrap();
    assert_eq!(again.addr, b.addr);
    lake.check().unwrap();
}

#[test]
fn failed_map_halfway_through_a_stitch_is_rolled_back() {
    for k in 1..=3 {
        let lake = new_lake(64);
        let a: Vec<DeviceRange> = (0..4).map(|_| lake.alloc(G).unwrap()).collect();
        lake.free(a[0]).unwrap();
        lake.free(a[2]).unwrap();
        let census = lake.driver().census();
        let stats = lake.stats();
        // A 2-chunk stitch maps 2 granules; fail the k-th (k = 3: the
        // stitch succeeds, the injected fault is not reached).
        lake.driver().fail_nth(VmmCall::Map, k);
        match lake.alloc(2 * G) {
            Err(e) => {
                assert!(k <= 2);
                assert!(e.to_string().contains("cuMemMap failed"), "{e}");
                assert_eq!(
                    lake.driver().census(),
                    census,
                    "k = {k}: a mapping or reservation leaked"
                );
                assert_eq!(lake.stats().reserved_bytes, stats.reserved_bytes);
                lake.check().unwrap();
                // The pool still works afterwards.
                let r = lake.alloc(2 * G).unwrap();
                assert!(lake.is_stitched(r));
            }
            Ok(r) => {
                assert_eq!(k, 3);
                assert!(lake.is_stitched(r));
            }
        }
    }
}

#[test]
fn failed_map_while_growing_releases_the_new_chunks() {
    let lake = new_lake(64);
    let a = lake.alloc(G).unwrap();
    let _b = lake.alloc(G).unwrap();
    let census = lake.driver().census();
    // 3 new chunks map 3 granules; fail the 2nd.
    lake.driver().fail_nth(VmmCall::Map, 2);
    let e = lake.alloc(3 * G).unwrap_err();
    assert!(
        e.to_string().contains("cuMemMap failed: injected fault"),
        "{e}"
    );
    assert_eq!(
        lake.driver().census(),
        census,
        "new chunks or their reservation leaked"
    );
    // Grow-and-stitch: free 1 chunk + 2 new (not next to it); fail the
    // stitch's last map.
    lake.free(a).unwrap();
    let census = lake.driver().census();
    lake.driver().fail_nth(VmmCall::Map, 2 + 3);
    assert!(lake.alloc(3 * G).is_err());
    assert_eq!(lake.driver().census(), census);
    lake.check().unwrap();
    assert_eq!(lake.stats().live_allocations, 1);
}

#[test]
fn errors_name_their_cause() {
    let lake = new_lake(8);
    let r = lake.alloc(3 * G).unwrap();
    let e = lake.alloc(6 * G).unwrap_err();
    let text = e.to_string();
    assert!(
        matches!(e, LakeError::OutOfMemory { asked, active, .. } if asked == 6 * G && active == 3 * G),
        "{text}"
    );
    assert!(
        text.contains("out of physical memory") && text.contains("largest free block"),
        "{text}"
    );
    assert!(
        lake.alloc(0)
            .unwrap_err()
            .to_string()
            .contains("zero bytes")
    );
    let foreign = DeviceRange {
        addr: 0x1234_0000,
        len: 8,
    };
    assert!(matches!(lake.free(foreign), Err(LakeError::NotOurs { .. })));
    let e = lake
        .free(DeviceRange {
            addr: r.addr,
            len: r.len + 1,
        })
        .unwrap_err();
    assert!(e.to_string().contains("another length"), "{e}");
    lake.free(r).unwrap();
    let e = lake.free(r).unwrap_err();
    assert!(
        matches!(e, LakeError::DoubleFree { .. }) && e.to_string().contains("double free"),
        "{e}"
    );
    // The model refuses what CUDA would: mapping over a mapping.
    use lake::VmmDriver;
    let m = lake.driver();
    let c = m.create().unwrap();
    let e = m.map(r.addr, c).unwrap_err();
    assert!(
        e.to_string()
            .starts_with("cuMemMap failed: refused by the CPU model"),
        "{e}"
    );
    let e = m.map(0x10, c).unwrap_err();
    assert!(e.to_string().contains("not aligned"), "{e}");
    m.release(c).unwrap();
}

#[test]
fn a_request_over_the_stitch_cap_takes_a_home_run() {
    let mut config = LakeConfig::with_limit(8 * G);
    config.max_stitch_chunks = 2;
    let lake = Lake::new(ModelVmm::new(G, ChunkOptions::default()), config);
    let a: Vec<DeviceRange> = (0..8).map(|_| lake.alloc(G).unwrap()).collect();
    for r in &a {
        lake.free(*r).unwrap();
    }
    // 6 chunks cannot be stitched (cap 2), but the 8 freed chunks are one
    // run at home: no new memory.
    let big = lake.alloc(6 * G).unwrap();
    assert!(!lake.is_stitched(big));
    assert_eq!(lake.stats().reserved_bytes, 8 * G);
    lake.check().unwrap();
}

#[test]
fn options_reach_the_driver() {
    let options = ChunkOptions {
        rdma_capable: true,
        peers: vec![1],
    };
    let lake = Lake::new(ModelVmm::new(G, options), LakeConfig::with_limit(8 * G));
    let r = lake.alloc(2 * G).unwrap();
    assert_eq!(lake.driver().census().rdma_chunks, 2);
    let st = lake.stats();
    assert_eq!(st.driver.of(VmmCall::Create).calls, 2);
    assert_eq!(st.driver.of(VmmCall::SetAccess).calls, 1);
    assert!(st.driver.total().calls >= 5);
    lake.free(r).unwrap();
}

/// One training-like period (`lake::periodic`: a forward phase that keeps
/// activations and frees recompute-like temporaries, then a backward phase
/// that frees the activations in reverse while making gradients of
/// irregular sizes), in units of one chunk.
fn period(lake: &Lake<ModelVmm>, rng_seed: u64) {
    let shape = PeriodShape {
        layers: 12,
        unit: G,
        seed: rng_seed,
    };
    periodic::play(lake, &periodic::period(&shape)).unwrap();
}

#[test]
fn periodic_trace_converges_to_exact_matches() {
    const PERIODS: usize = 8;
    const WARM_UP: usize = 3;
    const SEED: u64 = 42;
    let lake = new_lake(512);
    lake.start_trace();
    let mut rates = Vec::new();
    let mut after_warm_up = None;
    for p in 0..PERIODS {
        let before = lake.stats().outcomes;
        period(&lake, SEED);
        let o = lake.stats().outcomes.since(&before);
        rates.push(o.hit_rate());
        if p == WARM_UP {
            after_warm_up = Some(before);
        }
        lake.check().unwrap();
    }
    let converged = lake.stats().outcomes.since(&after_warm_up.unwrap());
    let st = lake.stats();
    println!(
        "hit rate per period: {:?}",
        rates
            .iter()
            .map(|r| format!("{:.1}%", r * 100.0))
            .collect::<Vec<_>>()
    );
    println!(
        "hit rate after {WARM_UP} warm-up periods: {:.1}% ({} of {}); fragmentation {:.1}%; reserved {} chunks; driver calls {}",
        converged.hit_rate() * 100.0,
        converged.reused(),
        converged.total(),
        st.fragmentation() * 100.0,
        st.peak_reserved_bytes / G,
        st.driver.total().calls,
    );
    assert!(
        converged.hit_rate() >= 0.95,
        "hit rate {:.3} after convergence",
        converged.hit_rate()
    );
    assert_eq!(
        *rates.last().unwrap(),
        1.0,
        "the last period is all exact matches"
    );

    // The trace round-trips through its file format and replays.
    let trace = lake.take_trace().unwrap();
    assert_eq!(trace.events.len(), PERIODS * 12 * 6);
    let path = std::env::temp_dir().join(format!("lake-trace-{}.bin", std::process::id()));
    trace.save(&path).unwrap();
    let back = Trace::load(&path).unwrap();
    std::fs::remove_file(&path).unwrap();
    assert_eq!(back, trace);
    let replay = new_lake(512);
    let outcomes = back.replay(&replay).unwrap();
    assert_eq!(
        outcomes,
        lake.stats().outcomes,
        "replay on a fresh lake serves the same way"
    );
    assert_eq!(replay.stats().live_allocations, 0);
}

#[test]
fn trace_files_are_checked() {
    let mut bytes = Vec::new();
    Trace {
        granularity: G,
        events: vec![],
    }
    .write_to(&mut bytes)
    .unwrap();
    assert_eq!(
        Trace::read_from(&mut bytes.as_slice()).unwrap().granularity,
        G
    );
    let mut bad = bytes.clone();
    bad[0] = b'X';
    assert!(
        Trace::read_from(&mut bad.as_slice())
            .unwrap_err()
            .to_string()
            .contains("magic")
    );
    let mut bad = bytes.clone();
    bad[8] = 9;
    assert!(
        Trace::read_from(&mut bad.as_slice())
            .unwrap_err()
            .to_string()
            .contains("version 9")
    );
    bytes.push(0);
    assert!(Trace::read_from(&mut bytes.as_slice()).is_err());
}

#[test]
fn threads_share_one_lake() {
    let lake = new_lake(256);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let lake = &lake;
            s.spawn(move || {
                let mut rng = SplitMix64(t + 100);
                let mut mine = Vec::new();
                for i in 0..300u64 {
                    if mine.len() < 8 && rng.below(2) == 0 {
                        let r = lake.alloc(1 + rng.below(4 * G)).unwrap();
                        let tag = t << 32 | i;
                        let len = (r.len.div_ceil(G) * G) as usize;
                        lake.driver().write(r.addr, &pattern(tag, len)).unwrap();
                        mine.push((r, tag));
                    } else if let Some((r, tag)) = mine.pop() {
                        still_holds(lake, r, tag);
                        lake.free(r).unwrap();
                    }
                }
                for (r, _) in mine {
                    lake.free(r).unwrap();
                }
            });
        }
    });
    lake.check().unwrap();
    assert_eq!(lake.stats().active_bytes, 0);
    lake.trim().unwrap();
    assert_eq!(lake.driver().census(), empty());
}

#[test]
fn dropping_the_lake_returns_everything() {
    let model = std::sync::Arc::new(ModelVmm::new(G, ChunkOptions::default()));
    let lake = Lake::new(model.clone(), LakeConfig::with_limit(32 * G));
    let _live = lake.alloc(3 * G).unwrap();
    let r = lake.alloc(2 * G).unwrap();
    let _after = lake.alloc(G).unwrap();
    lake.free(r).unwrap();
    let s = lake.alloc(5 * G).unwrap();
    assert!(lake.is_stitched(s));
    assert!(model.census().chunks > 0);
    drop(lake);
    assert_eq!(
        model.census(),
        empty(),
        "live and cached blocks all went back"
    );
}

#[test]
fn trimmed_home_slots_are_filled_again() {
    // A home view spans the limit: 6 slots.
    let lake = new_lake(6);
    let a = lake.alloc(2 * G).unwrap();
    let b = lake.alloc(2 * G).unwrap();
    let c = lake.alloc(2 * G).unwrap();
    lake.free(b).unwrap();
    assert_eq!(lake.trim().unwrap(), 2 * G, "b's chunks go back");
    assert_eq!(lake.stats().reserved_bytes, 4 * G);
    lake.check().unwrap();
    // No slot is left at the end of the view: new chunks fill b's holes
    // and serve the request there, with no stitch.
    let d = lake.alloc(2 * G).unwrap();
    assert_eq!(d.addr, b.addr);
    assert!(!lake.is_stitched(d));
    assert_eq!(lake.stats().home_views, 1);
    lake.check().unwrap();
    for r in [a, c, d] {
        lake.free(r).unwrap();
    }
    lake.trim().unwrap();
    assert_eq!(lake.driver().census(), empty(), "the view went back too");
}

#[test]
fn a_longer_request_extends_the_cached_view_at_its_end() {
    let lake = new_lake(64);
    let singles: Vec<DeviceRange> = (0..16).map(|_| lake.alloc(G).unwrap()).collect();
    for r in singles.iter().step_by(2) {
        lake.free(*r).unwrap();
    }
    // 8 scattered free chunks: stitched into one view.
    let first = lake.alloc(8 * G).unwrap();
    assert!(lake.is_stitched(first));
    lake.free(first).unwrap();
    lake.free(singles[1]).unwrap();
    lake.free(singles[3]).unwrap();
    // 10 chunks, a quarter more: the cached view keeps its 8 mappings and
    // maps the 2 new free chunks after them, in the room it reserved.
    let longer = lake.alloc(10 * G).unwrap();
    assert_eq!(longer.addr, first.addr);
    let o = lake.stats().outcomes;
    assert_eq!((o.stitch, o.patch, o.extend), (1, 1, 1));
    assert_eq!(lake.stats().reserved_bytes, 16 * G, "no growth");
    write_through_homes(&lake, longer, 42);
    lake.check().unwrap();
    lake.free(longer).unwrap();
    lake.check().unwrap();
}

#[test]
fn a_failed_extension_leaves_the_view_as_it_was() {
    let lake = new_lake(64);
    let singles: Vec<DeviceRange> = (0..16).map(|_| lake.alloc(G).unwrap()).collect();
    for r in singles.iter().step_by(2) {
        lake.free(*r).unwrap();
    }
    let first = lake.alloc(8 * G).unwrap();
    lake.free(first).unwrap();
    lake.free(singles[1]).unwrap();
    lake.free(singles[3]).unwrap();
    let census = lake.driver().census();
    // The second of the two new mappings fails: the first is undone.
    lake.driver().fail_nth(VmmCall::Map, 2);
    let e = lake.alloc(10 * G).unwrap_err();
    assert!(e.to_string().contains("cuMemMap failed"), "{e}");
    assert_eq!(lake.driver().census(), census, "a mapping leaked");
    lake.check().unwrap();
    // The view still serves its old size, and the longer request works now.
    let again = lake.alloc(8 * G).unwrap();
    assert_eq!(again.addr, first.addr);
    lake.free(again).unwrap();
    let longer = lake.alloc(10 * G).unwrap();
    assert_eq!(longer.addr, first.addr);
    write_through_homes(&lake, longer, 7);
    lake.check().unwrap();
}

#[test]
fn a_view_freed_behind_a_pending_fence_is_not_remapped_until_settled() {
    use lake::{Fence, Progress, Requester};
    let lake = new_lake(64);
    let singles: Vec<DeviceRange> = (0..16).map(|_| lake.alloc(G).unwrap()).collect();
    for r in singles.iter().step_by(2) {
        lake.free(*r).unwrap();
    }
    let mut progress = Progress::new();
    fn on(progress: &Progress) -> Requester<'_> {
        Requester {
            stream: 1,
            progress,
        }
    }
    // 8 scattered free chunks stitched into one view, used and freed on
    // stream 1 as its free 1: its kernels may still be queued.
    let first = lake
        .alloc_for(8 * G, Site::default(), &on(&progress))
        .unwrap();
    assert!(lake.is_stitched(first));
    lake.free_fenced(first, Site::default(), &Fence::single(1, 1))
        .unwrap();
    // One of its chunks is taken at home; another chunk comes free.
    let taker = lake.alloc_for(G, Site::default(), &on(&progress)).unwrap();
    assert!(!lake.is_stitched(taker));
    lake.free(singles[1]).unwrap();
    // The view would be patched (one slot replaced, an unmap under the
    // queued work): refused, a new view is stitched.
    assert!(lake.placement_waits(8 * G, &on(&progress)));
    let second = lake
        .alloc_for(8 * G, Site::default(), &on(&progress))
        .unwrap();
    assert_ne!(second.addr, first.addr, "the pending view was remapped");
    assert_eq!(lake.views_held_back(), 1);
    let o = lake.stats().outcomes;
    assert_eq!((o.patch, o.stitch), (0, 2));
    lake.free_fenced(second, Site::default(), &Fence::single(1, 2))
        .unwrap();
    // Trim leaves both views mapped while stream 1's work may be queued,
    // and drops them once it is seen complete.
    lake.trim_settled(&progress).unwrap();
    assert_eq!(lake.stats().stitched_views, 2);
    progress.advance(1, 2);
    lake.trim_settled(&progress).unwrap();
    assert_eq!(lake.stats().stitched_views, 0);
    let third = lake
        .alloc_for(8 * G, Site::default(), &on(&progress))
        .unwrap();
    lake.check().unwrap();
    lake.free(third).unwrap();
    lake.free(taker).unwrap();
    lake.check().unwrap();
}

/// A request over the stitch cap from a stream that may not reuse the home
/// tail run (freed behind another stream's pending fence) gets new chunks;
/// it is never stitched (it used to reach `stitch` with nothing to stitch
/// and panic: the tail run was long enough, only fenced).
#[test]
fn a_request_over_the_cap_beside_a_fenced_tail_gets_new_chunks() {
    use lake::{Fence, Progress, Requester};
    for freed in [4u64, 6, 7] {
        let mut config = LakeConfig::with_limit(64 * G);
        config.max_stitch_chunks = 2;
        let lake = Lake::new(ModelVmm::new(G, ChunkOptions::default()), config);
        let first = lake.alloc(freed * G).unwrap();
        lake.free_fenced(first, Site::default(), &Fence::single(1, 1))
            .unwrap();
        let progress = Progress::new();
        let other = Requester {
            stream: 2,
            progress: &progress,
        };
        let six = lake.alloc_for(6 * G, Site::default(), &other).unwrap();
        assert!(!lake.is_stitched(six), "{freed} freed");
        assert_ne!(six.addr, first.addr, "{freed} freed: not the fenced chunks");
        assert_eq!(
            lake.stats().reserved_bytes,
            (freed + 6) * G,
            "{freed} freed"
        );
        lake.check().unwrap();
    }
}
