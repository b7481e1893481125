//! CPU tests of `host::pluggable` (the PyTorch pluggable pool) on the model
//! driver and model events.
//!
//! Workloads: a seeded random mix of small requests checked for overlap and
//! data survival; the stream rule with events completed by hand; zero
//! size; out-of-memory text; capture mode with driver-call counters; four
//! threads on four streams with events that complete at once.

use gpu_kernel::workload::SplitMix64;
use std::sync::Arc;

use host::lake::{ChunkOptions, Lake, LakeConfig, ModelVmm};
use host::pluggable::{ModelEvents, PoolError, Registry, SplitCache, StreamId, StreamPool};

/// Model granularity: small, so host backing is cheap.
const G: u64 = 64 << 10;
const S1: StreamId = StreamId(1);
const S2: StreamId = StreamId(2);

type Pool = StreamPool<ModelVmm, ModelEvents>;

fn pool(limit_chunks: u64, events: ModelEvents) -> Pool {
    let lake = Lake::new(
        ModelVmm::new(G, ChunkOptions::default()),
        LakeConfig::with_limit(limit_chunks * G),
    );
    StreamPool::new(lake, events)
}

fn pattern(tag: u64, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| (tag.wrapping_mul(131).wrapping_add(i as u64 * 7) % 251) as u8)
        .collect()
}

#[test]
fn split_pieces_never_overlap_and_keep_data_and_all_returns() {
    let p = pool(256, ModelEvents::completing());
    let mut rng = SplitMix64(7);
    let mut live: Vec<(u64, u64, u64)> = Vec::new(); // addr, size, tag
    for step in 0..2000u64 {
        if live.is_empty() || (live.len() < 48 && rng.below(2) == 0) {
            let size = 1 + rng.below(G - 1);
            let addr = p.alloc(size, S1).unwrap();
            assert_eq!(addr % 512, 0, "pieces are 512-byte aligned");
            let len = SplitCache::rounded(size);
            for &(a, s, _) in &live {
                let l = SplitCache::rounded(s);
                assert!(
                    addr + len <= a || a + l <= addr,
                    "{addr:#x} overlaps {a:#x}"
                );
            }
            p.lake()
                .driver()
                .write(addr, &pattern(step, size as usize))
                .unwrap();
            live.push((addr, size, step));
        } else {
            let i = rng.below(live.len() as u64) as usize;
            let (addr, _, _) = live.swap_remove(i);
            p.free(addr, S1).unwrap();
            // Neighbours keep their bytes.
            for &(a, s, tag) in &live {
                assert_eq!(
                    p.lake().driver().read(a, s as usize).unwrap(),
                    pattern(tag, s as usize)
                );
            }
        }
        p.check().unwrap();
    }
    let active: u64 = live.iter().map(|&(_, s, _)| s).sum();
    assert_eq!(p.stats().active_bytes, active);
    for (a, _, _) in live.drain(..) {
        p.free(a, S1).unwrap();
    }
    p.alloc(G, S2).and_then(|a| p.free(a, S2)).unwrap(); // polls the events
    p.empty_cache().unwrap();
    let st = p.stats();
    assert_eq!(st.active_bytes, 0);
    assert_eq!(st.reserved_bytes, 0, "everything returns after empty_cache");
    assert_eq!(st.split_chunks, 0);
    assert!(st.peak_active_bytes > 0 && st.peak_reserved_bytes >= st.peak_active_bytes);
    assert_eq!(p.lake().driver().census(), Default::default());
}

#[test]
fn stream_rule_small_and_large() {
    for size in [1000, 3 * G] {
        let p = pool(16, ModelEvents::new());
        let a = p.alloc(size, S1).unwrap();
        p.free(a, S1).unwrap();
        // Same stream: immediate reuse.
        let b = p.alloc(size, S1).unwrap();
        assert_eq!(a, b, "same-stream reuse is immediate (size {size})");
        p.free(b, S1).unwrap();
        // Other stream: not before the event completes.
        let c = p.alloc(size, S2).unwrap();
        assert_ne!(c, a, "handed to stream 2 before the event (size {size})");
        p.free(c, S2).unwrap();
        p.events().complete_stream(S1);
        let d = p.alloc(size, StreamId(3)).unwrap();
        assert_eq!(
            d, a,
            "after the event, another stream reuses it (size {size})"
        );
        p.free(d, StreamId(3)).unwrap();
        p.check().unwrap();
    }
}

#[test]
fn zero_size_is_null_and_counts_nothing() {
    let p = pool(4, ModelEvents::new());
    assert_eq!(p.alloc(0, S1).unwrap(), 0);
    p.free(0, S1).unwrap();
    let st = p.stats();
    assert_eq!(
        (st.active_bytes, st.live_allocations, st.driver_calls),
        (0, 0, 0)
    );
    assert!(matches!(
        p.free(0x1234, S1),
        Err(PoolError::NotOurs { addr: 0x1234 })
    ));
}

#[test]
fn out_of_memory_says_asked_reserved_active_largest() {
    let p = pool(4, ModelEvents::new());
    let a = p.alloc(3 * G, S1).unwrap();
    let small = p.alloc(100, S1).unwrap();
    let err = p.alloc(2 * G, S2).unwrap_err();
    let msg = err.to_string();
    match err {
        PoolError::OutOfMemory {
            asked,
            reserved,
            active,
            largest_free,
            ..
        } => {
            assert_eq!(asked, 2 * G);
            assert_eq!(reserved, 4 * G);
            assert_eq!(active, 3 * G + 100);
            assert_eq!(largest_free, G - 512, "the split chunk's free rest");
        }
        other => panic!("expected out of memory, got {other}"),
    }
    for part in [
        format!("asked {}", 2 * G),
        format!("{} bytes reserved", 4 * G),
        format!("{} active", 3 * G + 100),
        format!("largest free extent {}", G - 512),
    ] {
        assert!(msg.contains(&part), "{msg:?} lacks {part:?}");
    }
    // Wholly free split chunks go back to the lake before giving up.
    p.free(small, S1).unwrap();
    p.free(a, S1).unwrap();
    p.events().complete_stream(S1);
    let big = p.alloc(4 * G, S2).unwrap();
    p.free(big, S2).unwrap();
}

#[test]
fn capture_makes_no_driver_call() {
    let p = pool(16, ModelEvents::new());
    // Warm: one small piece and one large block, freed and completed.
    let a = p.alloc(4096, S1).unwrap();
    let b = p.alloc(2 * G, S1).unwrap();
    p.free(a, S1).unwrap();
    p.free(b, S1).unwrap();
    p.events().complete_stream(S1);
    let c = p.alloc(100, S1).unwrap(); // polls: a and b return to the caches
    p.free(c, S1).unwrap();
    let before = p.stats();
    p.begin_capture();
    let x = p.alloc(4096, S2).unwrap();
    let y = p.alloc(2 * G, S2).unwrap();
    let z = p.alloc(100, S1).unwrap(); // S1's own waiting block
    assert_eq!(z, c);
    let err = p.alloc(8 * G, S2).unwrap_err();
    assert!(
        matches!(err, PoolError::CaptureNeedsWarmPool { .. }),
        "{err}"
    );
    assert!(err.to_string().contains("capture needs a warmed pool"));
    p.free(x, S2).unwrap();
    p.free(y, S2).unwrap();
    let during = p.stats();
    assert_eq!(
        during.driver_calls, before.driver_calls,
        "no VMM call in capture"
    );
    assert_eq!(
        during.event_calls, before.event_calls,
        "no event call in capture"
    );
    // Parked frees are not reusable by another stream during capture.
    let w = p.alloc(4096, StreamId(9)).unwrap();
    assert_ne!(w, x);
    p.end_capture().unwrap();
    assert!(
        p.stats().event_calls > before.event_calls,
        "events recorded at end"
    );
    p.free(z, S1).unwrap();
    p.free(w, StreamId(9)).unwrap();
    p.check().unwrap();
}

#[test]
fn threads_on_their_own_streams() {
    let p = Arc::new(pool(256, ModelEvents::completing()));
    let threads: Vec<_> = (0..4u64)
        .map(|t| {
            let p = Arc::clone(&p);
            std::thread::spawn(move || {
                let stream = StreamId(t + 1);
                let mut rng = SplitMix64(100 + t);
                let mut live = Vec::new();
                for step in 0..500u64 {
                    if live.len() < 8 && rng.below(2) == 0 {
                        let size = 1 + if rng.below(8) == 0 {
                            rng.below(3 * G)
                        } else {
                            rng.below(G)
                        };
                        let addr = p.alloc(size, stream).unwrap();
                        let tag = t << 32 | step;
                        p.lake()
                            .driver()
                            .write(addr, &pattern(tag, size as usize))
                            .unwrap();
                        live.push((addr, size, tag));
                    } else if let Some((addr, size, tag)) = live.pop() {
                        let back = p.lake().driver().read(addr, size as usize).unwrap();
                        assert_eq!(back, pattern(tag, size as usize), "thread {t} data");
                        p.free(addr, stream).unwrap();
                    }
                }
                for (addr, _, _) in live {
                    p.free(addr, stream).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    p.check().unwrap();
    assert_eq!(p.stats().active_bytes, 0);
    p.alloc(1, S1).and_then(|a| p.free(a, S1)).unwrap();
    p.empty_cache().unwrap();
    assert_eq!(p.stats().reserved_bytes, 0);
}

#[test]
fn registry_keeps_one_pool_per_device() {
    let r: Registry<Pool> = Registry::new();
    let make = |_d: i32| Ok::<_, ()>(pool(4, ModelEvents::new()));
    let a = r.get_or_make(0, make).unwrap();
    let b = r.get_or_make(0, make).unwrap();
    let c = r.get_or_make(1, make).unwrap();
    assert!(Arc::ptr_eq(&a, &b));
    assert!(!Arc::ptr_eq(&a, &c));
    assert!(r.get_or_make(2, |_| Err::<Pool, _>("no device")).is_err());
    assert_eq!(r.devices(), vec![0, 1]);
}
