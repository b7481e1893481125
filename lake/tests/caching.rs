//! CPU tests of `lake::caching` (the best-fit caching pool, the lake's
//! baseline) on the model driver, and issue 13's fragmentation criterion
//! on the periodic trace (`lake::periodic`).
//!
//! Workloads: hand-built sequences and seeded random alloc/free mixes
//! (sizes 1 byte to 6 chunks of 64 KiB, data written and read back,
//! invariants checked after every step); the periodic trace at GPU-like
//! sizes (32 MiB units, 2 MiB chunks) on the data-less model, replayed
//! through the lake and the caching pool.

use gpu_kernels::workload::SplitMix64;
use lake::periodic::{self, PeriodShape, Verdict};
use lake::{
    CachingPool, ChunkOptions, DeviceRange, Lake, LakeConfig, LakeError, ModelCensus, ModelVmm,
    VmmCall,
};

/// Model granularity of the correctness tests: small, so host backing is
/// cheap.
const G: u64 = 64 << 10;

fn pool(limit_chunks: u64) -> CachingPool<ModelVmm> {
    CachingPool::new(ModelVmm::new(G, ChunkOptions::default()), limit_chunks * G)
}

/// A byte pattern unique to (tag, position).
fn pattern(tag: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (tag.wrapping_mul(31).wrapping_add(i as u64 * 7) % 251) as u8)
        .collect()
}

#[test]
fn best_fit_splits_and_merges_within_a_segment() {
    let p = pool(64);
    let a = p.alloc(3 * G).unwrap();
    assert_eq!(p.stats().reserved_bytes, 3 * G, "a segment of whole chunks");
    p.free(a).unwrap();
    // Two pieces of the free segment, back to back.
    let b = p.alloc(G).unwrap();
    let c = p.alloc(G).unwrap();
    assert_eq!((b.addr, c.addr), (a.addr, a.addr + G));
    assert_eq!(p.stats().segments, 1, "split, no new segment");
    // A larger free block elsewhere: the smallest that fits is taken.
    let big = p.alloc(5 * G).unwrap();
    p.free(big).unwrap();
    let d = p.alloc(G / 2).unwrap();
    assert_eq!(
        d.addr,
        a.addr + 2 * G,
        "the 1-chunk rest, not the 5-chunk one"
    );
    p.check().unwrap();
    // Freed in any order, the first segment is one block again.
    p.free(c).unwrap();
    p.free(b).unwrap();
    p.free(d).unwrap();
    p.check().unwrap();
    let st = p.stats();
    assert_eq!((st.free_blocks, st.largest_free_bytes), (2, 5 * G));
    // Two free segments of 3 and 5 chunks cannot serve 8 (no stitching).
    let e = p.alloc(8 * G).unwrap();
    assert_eq!(p.stats().reserved_bytes, 16 * G);
    p.free(e).unwrap();
}

#[test]
fn the_limit_releases_free_segments_then_fails() {
    let p = pool(8);
    let a = p.alloc(3 * G).unwrap();
    let b = p.alloc(3 * G).unwrap();
    p.free(a).unwrap();
    // 4 chunks do not fit beside 6: the free segment goes, then they fit.
    let c = p.alloc(4 * G).unwrap();
    let st = p.stats();
    assert_eq!((st.segments, st.segments_released), (2, 1));
    assert_eq!(st.reserved_bytes, 7 * G);
    match p.alloc(2 * G) {
        Err(LakeError::OutOfMemory { limit, .. }) => assert_eq!(limit, 8 * G),
        other => panic!("expected out of memory, got {other:?}"),
    }
    p.free(b).unwrap();
    p.free(c).unwrap();
    p.check().unwrap();
}

#[test]
fn wrong_frees_are_refused() {
    let p = pool(8);
    let a = p.alloc(100).unwrap();
    assert!(matches!(
        p.free(DeviceRange {
            addr: a.addr + 1,
            len: 1
        }),
        Err(LakeError::NotOurs { .. })
    ));
    assert!(matches!(
        p.free(DeviceRange {
            addr: a.addr,
            len: 99
        }),
        Err(LakeError::NotOurs { .. })
    ));
    p.free(a).unwrap();
    assert!(matches!(p.free(a), Err(LakeError::DoubleFree { .. })));
    assert!(matches!(p.alloc(0), Err(LakeError::ZeroSize)));
}

#[test]
fn a_failed_map_is_rolled_back() {
    let p = pool(64);
    let a = p.alloc(G).unwrap();
    p.driver().fail_nth(VmmCall::Map, 3);
    let err = p.alloc(4 * G).unwrap_err();
    assert!(err.to_string().contains("cuMemMap"), "{err}");
    let st = p.stats();
    assert_eq!((st.segments, st.reserved_bytes), (1, G));
    p.check().unwrap();
    // The driver holds only the first segment.
    let census = p.driver().census();
    assert_eq!(census, {
        let one = CachingPool::new(ModelVmm::new(G, ChunkOptions::default()), G);
        let _ = one.alloc(G).unwrap();
        one.driver().census()
    });
    p.free(a).unwrap();
}

#[test]
fn random_mixes_keep_blocks_apart_and_data_intact() {
    for seed in [1, 2, 0xfeed] {
        let p = pool(40);
        let mut rng = SplitMix64(seed);
        let mut live: Vec<(DeviceRange, u64)> = Vec::new();
        let mut ooms = 0;
        for step in 0..1200u64 {
            if live.is_empty() || rng.below(100) < 55 {
                let size = 1 + rng.below(6 * G);
                match p.alloc(size) {
                    Ok(r) => {
                        p.driver()
                            .write(r.addr, &pattern(step, r.len as usize))
                            .unwrap();
                        live.push((r, step));
                    }
                    Err(LakeError::OutOfMemory { .. }) => ooms += 1,
                    Err(e) => panic!("seed {seed} step {step}: {e}"),
                }
            } else {
                let (r, tag) = live.swap_remove(rng.below(live.len() as u64) as usize);
                assert_eq!(
                    p.driver().read(r.addr, r.len as usize).unwrap(),
                    pattern(tag, r.len as usize),
                    "seed {seed} step {step}: block {:#x} overwritten",
                    r.addr
                );
                p.free(r).unwrap();
            }
            p.check()
                .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
            let mut spans: Vec<(u64, u64)> =
                live.iter().map(|(r, _)| (r.addr, r.addr + r.len)).collect();
            spans.sort_unstable();
            assert!(
                spans.windows(2).all(|w| w[0].1 <= w[1].0),
                "seed {seed} step {step}: live blocks overlap"
            );
            assert!(p.stats().reserved_bytes <= 40 * G);
        }
        for (r, tag) in live.drain(..) {
            assert_eq!(
                p.driver().read(r.addr, r.len as usize).unwrap(),
                pattern(tag, r.len as usize)
            );
            p.free(r).unwrap();
        }
        let st = p.stats();
        println!(
            "seed {seed:#x}: {} segments made, {} released, {ooms} out-of-memory answers, fragmentation {:.1}%",
            st.segments_made,
            st.segments_released,
            st.fragmentation() * 100.0
        );
        assert_eq!(st.live_bytes, 0);
    }
}

#[test]
fn dropping_the_pool_unmaps_everything() {
    let driver = std::sync::Arc::new(ModelVmm::new(G, ChunkOptions::default()));
    {
        let p = CachingPool::new(driver.clone(), 64 * G);
        let a = p.alloc(3 * G).unwrap();
        let _kept = p.alloc(2 * G + 1).unwrap();
        p.free(a).unwrap();
        assert_ne!(driver.census(), ModelCensus::default());
    }
    assert_eq!(
        driver.census(),
        ModelCensus::default(),
        "memory left with the driver"
    );
}

/// Issue 13's criterion, fragmentation half, on the model driver: the same
/// trace and chunks as the `periodic` example's default on a GPU (its
/// latency half needs the GPU; times on the model are printed only).
#[test]
fn periodic_trace_lake_under_5_percent_caching_pool_over_20() {
    const PERIODS: usize = 10;
    const WARM_UP: usize = 3;
    let chunk = 2 << 20;
    let limit = 80 << 30;
    let shape = PeriodShape::gpu_like(42);
    let lake = Lake::new(
        ModelVmm::without_data(chunk, ChunkOptions::default()),
        LakeConfig::with_limit(limit),
    );
    let caching = CachingPool::new(
        ModelVmm::without_data(chunk, ChunkOptions::default()),
        limit,
    );
    let l = periodic::measure(&lake, &shape, PERIODS, WARM_UP).unwrap();
    let c = periodic::measure(&caching, &shape, PERIODS, WARM_UP).unwrap();
    lake.check().unwrap();
    caching.check().unwrap();
    for (name, m) in [("lake", &l), ("caching", &c)] {
        println!(
            "{name}: peak live {} MiB, peak reserved {} MiB, fragmentation {:.2}%, alloc median {} ns p99 {} ns",
            m.peaks.live >> 20,
            m.peaks.reserved >> 20,
            m.fragmentation() * 100.0,
            m.alloc.median(),
            m.alloc.p99()
        );
    }
    let verdict = Verdict::new(&l, &c);
    println!("{verdict}");
    assert!(verdict.fragmentation_holds(), "{verdict}");
}
