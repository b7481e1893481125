//! CPU tests of `lake::pluggable` (the PyTorch pluggable pool) on the model
//! driver and model events.
//!
//! Workloads: a seeded random mix of small requests checked for overlap and
//! data survival; the stream rule with events completed by hand; zero
//! size; out of memory (text, waiting for events first, the driver's own,
//! a changed limit); record_stream; private pools of CUDA graphs and their
//! windows (no event call while one is open); four threads on four streams
//! with events that complete at once.

use gpu_kernels::workload::SplitMix64;
use std::sync::Arc;

use lake::pluggable::{ModelEvents, PoolError, PoolId, Registry, SplitCache, StreamId, StreamPool};
use lake::{ChunkOptions, Lake, LakeConfig, ModelVmm};

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

/// Allocates `size` on `stream` and checks that the pool did not grow for
/// it (freed memory served it), then frees it and checks the tables.
fn serves_without_growing(p: &Pool, size: u64, stream: StreamId) {
    let reserved = p.stats().reserved_bytes;
    let a = p.alloc(size, stream).unwrap();
    assert_eq!(
        p.stats().reserved_bytes,
        reserved,
        "freed memory served {stream:?}"
    );
    p.free(a, stream).unwrap();
    p.check().unwrap();
}

/// A pool that has seen two streams, so that the event rule applies from
/// the first free on.
fn multi_stream_pool(limit_chunks: u64, events: ModelEvents) -> Pool {
    let p = pool(limit_chunks, events);
    for stream in [S1, S2] {
        p.alloc(1, stream).and_then(|a| p.free(a, stream)).unwrap();
    }
    p.events().complete_stream(S1);
    p.events().complete_stream(S2);
    p
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
        let p = multi_stream_pool(16, ModelEvents::new());
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
fn a_stream_reuses_its_own_frees_at_once_for_any_size() {
    let p = pool(16, ModelEvents::new());
    let a = p.alloc(3 * G, S1).unwrap();
    p.free(a, S1).unwrap();
    // Another size on the same stream gets the same memory at once, though
    // the event of the free is not complete.
    let b = p.alloc(2 * G, S1).unwrap();
    assert_eq!(b, a);
    p.free(b, S1).unwrap();
    let reserved = p.stats().reserved_bytes;
    assert!(p.stats().waiting_bytes > 0);
    // Another stream may not have it before the event completes...
    let c = p.alloc(3 * G, S2).unwrap();
    assert_ne!(c, a);
    assert!(p.stats().reserved_bytes > reserved);
    p.free(c, S2).unwrap();
    // ...and may once it has.
    p.events().complete_stream(S1);
    serves_without_growing(&p, 3 * G, StreamId(3));
}

#[test]
fn a_stream_alone_records_no_event_until_a_second_one_appears() {
    let p = pool(16, ModelEvents::new());
    for round in 0..10u64 {
        let a = p.alloc(3 * G, S1).unwrap();
        let b = p.alloc(1000 + round, S1).unwrap();
        p.free(b, S1).unwrap();
        p.free(a, S1).unwrap();
    }
    assert_eq!(p.stats().event_calls, 0, "one stream: no event");
    let reserved = p.stats().reserved_bytes;
    // A second stream: one event is recorded behind S1's frees; S2 gets
    // S1's memory once it completes.
    let c = p.alloc(3 * G, S2).unwrap();
    assert_eq!(p.stats().event_calls, 2, "the catch-up event and one query");
    assert!(
        p.stats().reserved_bytes > reserved,
        "not before S1's work is done"
    );
    p.free(c, S2).unwrap();
    p.events().complete_stream(S1);
    p.events().complete_stream(S2);
    serves_without_growing(&p, 3 * G, StreamId(3));
}

#[test]
fn empty_cache_of_a_lone_stream_waits_and_releases_everything() {
    let p = pool(16, ModelEvents::new());
    let a = p.alloc(3 * G, S1).unwrap();
    let b = p.alloc(1000, S1).unwrap();
    p.free(a, S1).unwrap();
    p.free(b, S1).unwrap();
    assert_eq!(p.empty_cache().unwrap(), 4 * G);
    assert_eq!(p.stats().event_calls, 1, "one synchronisation");
    assert_eq!(p.lake().driver().census(), Default::default());
}

#[test]
fn reuse_cache_serves_a_freed_size_without_the_lake_and_never_grows_the_pool() {
    let p = pool(16, ModelEvents::completing());
    p.set_reuse_entries(lake::pluggable::reuse::SUGGESTED_ENTRIES)
        .unwrap();
    let a = p.alloc(3 * G, S1).unwrap();
    let b = p.alloc(3 * G, S1).unwrap();
    p.free(a, S1).unwrap();
    p.free(b, S1).unwrap();
    let stats = p.stats();
    assert_eq!(stats.reuse_free_bytes, 6 * G, "both blocks wait whole");
    // A lone stream's frees have no event: idle, but waiting for others.
    assert_eq!(stats.breakdown.reuse_free_bytes, 0);
    assert_eq!(stats.breakdown.waiting_bytes, 6 * G);
    assert_eq!(stats.breakdown.total(), stats.reserved_bytes);
    // The same size comes back from the cache: the lake sees nothing.
    let lake_live = p.lake().stats().live_allocations;
    let c = p.alloc(3 * G, S1).unwrap();
    assert_eq!(c, b, "the newest block of that capacity");
    assert_eq!(p.lake().stats().live_allocations, lake_live);
    p.free(c, S1).unwrap();
    // Another size: the cache goes back to the lake first, which then finds
    // the two blocks side by side instead of growing.
    let reserved = p.stats().reserved_bytes;
    let d = p.alloc(6 * G, S1).unwrap();
    assert_eq!(p.stats().reserved_bytes, reserved, "no growth for a miss");
    assert_eq!(p.stats().reuse_free_bytes, 0);
    p.free(d, S1).unwrap();
    p.check().unwrap();
    // empty_cache gives what the cache holds back to the driver.
    p.empty_cache().unwrap();
    assert_eq!(p.stats().reserved_bytes, 0);
    assert_eq!(p.lake().driver().census(), Default::default());
}

#[test]
fn reuse_cache_off_leaves_every_free_to_the_lake() {
    let p = pool(16, ModelEvents::completing());
    p.set_reuse_entries(0).unwrap();
    let a = p.alloc(3 * G, S1).unwrap();
    p.free(a, S1).unwrap();
    assert_eq!(p.stats().reuse_free_bytes, 0);
    assert_eq!(p.lake().stats().live_allocations, 0);
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
    assert!(err.is_out_of_memory());
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
        "gpumalloc: out of memory".to_string(),
        format!("({} bytes)", 2 * G),
        "256.00 KiB reserved".to_string(),
        "largest free extent 63.50 KiB".to_string(),
    ] {
        assert!(msg.contains(&part), "{msg:?} lacks {part:?}");
    }
    let st = p.stats();
    assert_eq!((st.alloc_retries, st.ooms), (1, 1));
    // Wholly free split chunks go back to the lake before giving up.
    p.free(small, S1).unwrap();
    p.free(a, S1).unwrap();
    p.events().complete_stream(S1);
    let big = p.alloc(4 * G, S2).unwrap();
    p.free(big, S2).unwrap();
}

#[test]
fn out_of_memory_waits_for_pending_events_first() {
    // Freed on S1, its event not complete: S2 cannot have it until the pool
    // waits for the device, which it does before declaring out of memory.
    let p = multi_stream_pool(4, ModelEvents::new());
    p.empty_cache().unwrap();
    let a = p.alloc(3 * G, S1).unwrap();
    p.free(a, S1).unwrap();
    let b = p.alloc(3 * G, S2).unwrap();
    assert_eq!(b, a, "served after waiting for S1's event");
    let st = p.stats();
    assert_eq!((st.alloc_retries, st.ooms), (1, 0));
    p.free(b, S2).unwrap();
    p.check().unwrap();
}

#[test]
fn driver_out_of_memory_is_out_of_memory_and_the_pool_recovers() {
    // The lake's limit allows 16 chunks but the device holds only 3 (other
    // processes, the context): the driver refuses, the pool answers out of
    // memory and stays usable.
    let p = pool(16, ModelEvents::completing());
    p.lake().driver().set_device_bytes(Some(3 * G));
    let err = p.alloc(4 * G, S1).unwrap_err();
    assert!(err.is_out_of_memory(), "{err}");
    assert!(err.to_string().contains("device memory is full"), "{err}");
    let a = p.alloc(2 * G, S1).unwrap();
    let b = p.alloc(100, S1).unwrap();
    p.free(a, S1).unwrap();
    p.free(b, S1).unwrap();
    assert_eq!(p.stats().ooms, 1);
    p.check().unwrap();
}

#[test]
fn memory_limit_can_change() {
    let p = pool(16, ModelEvents::completing());
    p.set_limit_bytes(2 * G);
    assert!(p.alloc(3 * G, S1).unwrap_err().is_out_of_memory());
    p.set_limit_bytes(16 * G);
    let a = p.alloc(3 * G, S1).unwrap();
    p.free(a, S1).unwrap();
    assert_eq!(p.stats().limit_bytes, 16 * G);
}

#[test]
fn record_stream_delays_reuse_until_every_stream_is_done() {
    for size in [1000, 3 * G] {
        let p = pool(16, ModelEvents::new());
        let a = p.alloc(size, S1).unwrap();
        p.record_stream(a, S2).unwrap();
        p.free(a, S1).unwrap();
        let b = p.alloc(size, S1).unwrap();
        assert_ne!(b, a, "S2 may still use it: not even S1 takes it back");
        p.events().complete_stream(S1);
        let c = p.alloc(size, StreamId(3)).unwrap();
        assert_ne!(c, a, "S2's event is still pending (size {size})");
        p.events().complete_stream(S2);
        let d = p.alloc(size, StreamId(3)).unwrap();
        assert_eq!(d, a, "both events done: reusable (size {size})");
        for x in [b, c, d] {
            p.free(x, StreamId(3)).unwrap();
        }
        assert!(matches!(
            p.record_stream(a, S2),
            Err(PoolError::NotOurs { .. })
        ));
        p.check().unwrap();
    }
}

const GRAPH: PoolId = PoolId(7, 0);
const OTHER_GRAPH: PoolId = PoolId(8, 0);

#[test]
fn graph_memory_stays_the_graphs_until_released() {
    let p = pool(64, ModelEvents::completing());
    p.begin_allocate_to_pool(GRAPH).unwrap();
    let small = p.alloc_in(4096, S1, GRAPH).unwrap();
    let large = p.alloc_in(3 * G, S1, GRAPH).unwrap();
    p.free(small, S1).unwrap(); // freed during capture: the graph's again at once
    let again = p.alloc_in(4096, S1, GRAPH).unwrap();
    assert_eq!(
        again, small,
        "the graph reuses its own memory in capture order"
    );
    p.end_allocate_to_pool(GRAPH).unwrap();
    p.free(again, S1).unwrap();
    p.free(large, S1).unwrap();
    // Eager code never gets the graph's memory.
    let mut eager = Vec::new();
    for _ in 0..10 {
        let e = p.alloc(4096, S1).unwrap();
        let f = p.alloc(3 * G, S1).unwrap();
        assert!(e != small && f != large, "eager request got graph memory");
        eager.extend([e, f]);
    }
    for e in eager {
        p.free(e, S1).unwrap();
    }
    // A second graph sharing the pool reuses it; another stream does not.
    p.begin_allocate_to_pool(GRAPH).unwrap();
    assert_eq!(p.pool_use_count(GRAPH), 2);
    assert_eq!(p.alloc_in(3 * G, S1, GRAPH).unwrap(), large);
    assert_ne!(p.alloc_in(4096, S2, GRAPH).unwrap(), small);
    p.end_allocate_to_pool(GRAPH).unwrap();
    let st = p.stats();
    assert!(st.private_free_bytes > 0 && st.private_pools == 1, "{st:?}");
    // Both graphs deleted: the free memory goes back to general use, the
    // rest when its tensors are freed.
    p.release_pool(GRAPH).unwrap();
    p.release_pool(GRAPH).unwrap();
    assert_eq!(p.pool_use_count(GRAPH), 0);
    // What stays is the rest of the chunk whose S2 piece is still live.
    assert!(p.stats().private_free_bytes < G);
    let reused = p.alloc(G, S1).unwrap();
    assert_eq!(reused, small, "the released chunk serves general requests");
    p.free(reused, S1).unwrap();
    let live = p.live_in_pool(GRAPH);
    assert_eq!(live.len(), 2, "{live:x?}");
    for a in live {
        p.free(a, if a == large { S1 } else { S2 }).unwrap();
    }
    assert_eq!(p.stats().private_pools, 0);
    p.check().unwrap();
}

#[test]
fn no_event_work_while_a_window_is_open() {
    let p = pool(64, ModelEvents::new());
    let warm = p.alloc(3 * G, S1).unwrap();
    let kept = p.alloc(1000, S2).unwrap();
    p.free(warm, S1).unwrap();
    let before = p.stats().event_calls;
    p.begin_allocate_to_pool(GRAPH).unwrap();
    // Eager work on other threads continues: allocations (growing the lake
    // is allowed), frees of general blocks, and graph work.
    let x = p.alloc(5 * G, S2).unwrap();
    p.free(kept, S2).unwrap();
    p.free(x, S2).unwrap();
    let y = p.alloc(5 * G, StreamId(9)).unwrap();
    assert_ne!(y, x, "a block freed during a window waits for its event");
    let g = p.alloc_in(2 * G, S1, GRAPH).unwrap();
    p.record_stream(g, S2).unwrap();
    p.free(g, S1).unwrap(); // used on S2 too: parked
    assert!(p.empty_cache().is_ok());
    assert_eq!(
        p.stats().event_calls,
        before,
        "no event call while a window is open"
    );
    assert!(p.stats().waiting_bytes >= 7 * G);
    p.end_allocate_to_pool(GRAPH).unwrap();
    assert!(
        p.stats().event_calls > before,
        "parked frees get their events"
    );
    p.free(y, StreamId(9)).unwrap();
    p.events().complete_stream(S1);
    p.events().complete_stream(S2);
    p.events().complete_stream(StreamId(9));
    p.release_pool(GRAPH).unwrap();
    p.empty_cache().unwrap();
    let st = p.stats();
    assert_eq!(
        (st.active_bytes, st.reserved_bytes, st.private_pools),
        (0, 0, 0),
        "{st:?}"
    );
}

#[test]
fn private_pool_calls_that_do_not_fit_are_refused() {
    let p = pool(16, ModelEvents::completing());
    assert!(matches!(
        p.release_pool(GRAPH),
        Err(PoolError::PrivatePool(_))
    ));
    assert!(matches!(
        p.end_allocate_to_pool(GRAPH),
        Err(PoolError::PrivatePool(_))
    ));
    assert!(matches!(
        p.alloc_in(100, S1, GRAPH),
        Err(PoolError::PrivatePool(_))
    ));
    assert!(p.begin_allocate_to_pool(PoolId::GENERAL).is_err());
    p.begin_allocate_to_pool(GRAPH).unwrap();
    assert!(
        p.begin_allocate_to_pool(GRAPH).is_err(),
        "one window per pool"
    );
    p.begin_allocate_to_pool(OTHER_GRAPH).unwrap();
    p.end_allocate_to_pool(GRAPH).unwrap();
    p.end_allocate_to_pool(OTHER_GRAPH).unwrap();
    p.incref_pool(GRAPH).unwrap();
    assert_eq!(p.pool_use_count(GRAPH), 2);
    p.release_pool(GRAPH).unwrap();
    p.release_pool(GRAPH).unwrap();
    p.release_pool(OTHER_GRAPH).unwrap();
    assert_eq!(p.stats().private_pools, 0);
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

#[test]
fn a_graph_pool_returns_to_its_checkpoint() {
    let p = pool(64, ModelEvents::completing());
    p.begin_allocate_to_pool(GRAPH).unwrap();
    let a = p.alloc_in(4096, S1, GRAPH).unwrap();
    let b = p.alloc_in(3 * G, S1, GRAPH).unwrap();
    let checkpoint = p.checkpoint_pool(GRAPH);
    assert_eq!(checkpoint.len(), 2);
    p.free(a, S1).unwrap();
    let c = p.alloc_in(10_000, S1, GRAPH).unwrap();
    let d = p.alloc_in(5 * G, S1, GRAPH).unwrap();
    p.end_allocate_to_pool(GRAPH).unwrap();
    // `c` took `a`'s place: the restore frees it first, then gives `a` back.
    let restored = p.restore_pool(GRAPH, &checkpoint).unwrap();
    let mut freed = restored.freed.clone();
    freed.sort_unstable();
    let mut want = vec![c, d];
    want.sort_unstable();
    assert_eq!(freed, want);
    assert_eq!(restored.allocated, vec![a]);
    assert_eq!(p.live_in_pool(GRAPH), {
        let mut v = vec![a, b];
        v.sort_unstable();
        v
    });
    assert_eq!(p.checkpoint_pool(GRAPH), checkpoint);
    assert_eq!(p.stats().active_bytes, 4096 + 3 * G);
    // Restoring to the current state changes nothing.
    assert_eq!(
        p.restore_pool(GRAPH, &checkpoint).unwrap(),
        Default::default()
    );
    // A checkpoint whose memory another pool took cannot be restored.
    for x in [a, b] {
        p.free(x, S1).unwrap();
    }
    p.release_pool(GRAPH).unwrap();
    p.incref_pool(GRAPH).unwrap();
    let err = p.restore_pool(GRAPH, &checkpoint).unwrap_err();
    assert!(
        err.to_string().contains("cannot restore the checkpoint"),
        "{err}"
    );
    p.check().unwrap();
}

#[test]
fn a_recorded_trace_replays_to_the_same_peak() {
    let p = pool(256, ModelEvents::completing());
    p.start_trace();
    let mut rng = SplitMix64(99);
    let mut live: Vec<(u64, StreamId)> = Vec::new();
    for step in 0..3u64 {
        for i in 0..200u64 {
            let stream = if i % 7 == 0 { S2 } else { S1 };
            if live.len() > 20 || (!live.is_empty() && rng.below(3) == 0) {
                let (a, s) = live.swap_remove(rng.below(live.len() as u64) as usize);
                p.free(a, s).unwrap();
            } else {
                let size = 1 + rng.below(if i % 5 == 0 { 6 * G } else { G });
                live.push((p.alloc(size, stream).unwrap(), stream));
            }
        }
        if step < 2 {
            p.mark_step();
        }
    }
    for (a, s) in live.drain(..) {
        p.free(a, s).unwrap();
    }
    let trace = p.take_trace().expect("a trace was recording");
    assert!(p.take_trace().is_none(), "taking it stops the recording");
    let st = p.stats();
    assert_eq!(trace.events.len() as u64, st.allocs + st.frees);
    let phases: std::collections::BTreeSet<u32> =
        trace.events.iter().map(|e| e.site.phase).collect();
    assert_eq!(phases.into_iter().collect::<Vec<_>>(), vec![0, 1, 2]);
    let streams: std::collections::BTreeSet<u32> =
        trace.events.iter().map(|e| e.site.stream).collect();
    assert_eq!(streams.len(), 2, "two streams, small indices");
    // Through a file and back, then replayed: the same peak of live bytes.
    let path = std::env::temp_dir().join(format!("gm-trace-{}.bin", std::process::id()));
    trace.save(&path).unwrap();
    let back = lake::pluggable::replay::load(&path).unwrap();
    std::fs::remove_file(&path).ok();
    assert_eq!(back.events, trace.events);
    let report =
        lake::pluggable::replay::replay(&back, &lake::pluggable::replay::ReplayConfig::default())
            .unwrap();
    assert_eq!(report.unmatched_frees, 0);
    assert_eq!(report.peak_active, st.peak_active_bytes);
}
