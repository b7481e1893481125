//! CPU tests of the pool's reuse cache (`lake::pluggable::reuse`) on the
//! model driver and model events: a freed piece or large block serves the
//! next request of its size with neither the split cache nor the lake
//! touched; the stream rule and `record_stream` still hold; private pools
//! (CUDA graphs) never see the general pool's blocks nor give theirs; the
//! cache goes home before the lake would grow or fail, and on
//! `empty_cache`; blocks over the bound go straight to the lake.

use lake::pluggable::reuse::{MAX_BLOCK_CHUNKS, SUGGESTED_ENTRIES};
use lake::pluggable::{ModelEvents, PoolId, StreamId, StreamPool};
use lake::{ChunkOptions, Lake, LakeConfig, ModelVmm};

/// Model granularity: small, so host backing is cheap.
const G: u64 = 64 << 10;
const S1: StreamId = StreamId(1);
const S2: StreamId = StreamId(2);
const GRAPH: PoolId = PoolId(7, 1);

type Pool = StreamPool<ModelVmm, ModelEvents>;

fn pool(limit_chunks: u64, events: ModelEvents) -> Pool {
    let lake = Lake::new(
        ModelVmm::new(G, ChunkOptions::default()),
        LakeConfig::with_limit(limit_chunks * G),
    );
    let p = StreamPool::new(lake, events);
    p.set_reuse_entries(SUGGESTED_ENTRIES).unwrap();
    p
}

/// The split cache's free bytes, the lake's live allocations and the
/// driver's calls: what a request served by the cache leaves unchanged.
fn untouched(p: &Pool) -> (u64, u64, u64) {
    let st = p.stats();
    (
        st.split_free_bytes,
        p.lake().stats().live_allocations,
        st.driver_calls,
    )
}

#[test]
fn a_freed_size_comes_back_without_the_split_cache_or_the_lake() {
    let p = pool(64, ModelEvents::new());
    let small = p.alloc(1000, S1).unwrap();
    let large = p.alloc(3 * G + 5, S1).unwrap();
    let other = p.alloc(2000, S1).unwrap();
    p.free(small, S1).unwrap();
    p.free(large, S1).unwrap();
    let st = p.stats();
    assert_eq!(st.reuse_free_bytes, 1024 + 4 * G, "a piece and four chunks");
    assert_eq!(st.breakdown.total(), st.reserved_bytes);
    p.check().unwrap();

    let before = untouched(&p);
    // Same rounded size, not the same request: 1000 and 1020 both take a
    // 1024-byte piece; 3G + 5 and 4G both take four chunks.
    assert_eq!(p.alloc(1020, S1).unwrap(), small);
    assert_eq!(p.alloc(4 * G, S1).unwrap(), large);
    assert_eq!(untouched(&p), before, "served by the cache alone");
    let st = p.stats();
    assert_eq!((st.reuse_hits, st.reuse_free_bytes), (2, 0));
    // A size the cache does not hold goes on to the split cache.
    let third = p.alloc(512, S1).unwrap();
    assert_ne!(third, small);
    for a in [small, large, other, third] {
        p.free(a, S1).unwrap();
    }
    p.check().unwrap();
}

#[test]
fn another_stream_waits_for_the_event_of_the_free() {
    let p = pool(64, ModelEvents::new());
    // Two streams from the start: every free records an event.
    for s in [S1, S2] {
        p.alloc(1, s).and_then(|a| p.free(a, s)).unwrap();
    }
    p.events().complete_stream(S1);
    p.events().complete_stream(S2);
    for size in [4096, 2 * G] {
        let a = p.alloc(size, S1).unwrap();
        p.free(a, S1).unwrap();
        let b = p.alloc(size, S2).unwrap();
        assert_ne!(a, b, "S1's work may still use it (size {size})");
        p.events().complete_stream(S1);
        let c = p.alloc(size, S2).unwrap();
        assert_eq!(c, a, "after the event (size {size})");
        p.free(b, S2).unwrap();
        p.free(c, S2).unwrap();
        p.events().complete_stream(S2);
    }
    p.check().unwrap();
}

#[test]
fn record_stream_keeps_the_block_from_its_freeing_stream_too() {
    let p = pool(64, ModelEvents::new());
    let a = p.alloc(2 * G, S1).unwrap();
    p.record_stream(a, S2).unwrap();
    p.free(a, S1).unwrap();
    assert_ne!(p.alloc(2 * G, S1).unwrap(), a, "S2 may still read it");
    p.events().complete_stream(S2);
    assert_eq!(p.alloc(2 * G, S1).unwrap(), a);
    p.check().unwrap();
}

#[test]
fn graph_pools_and_the_cache_never_mix() {
    let p = pool(64, ModelEvents::new());
    let piece = p.alloc(4096, S1).unwrap();
    p.free(piece, S1).unwrap();
    p.begin_allocate_to_pool(GRAPH).unwrap();
    let graph = p.alloc_in(4096, S1, GRAPH).unwrap();
    assert_ne!(graph, piece, "a graph never takes the general pool's piece");
    let cached = p.stats().reuse_free_bytes;
    p.free(graph, S1).unwrap();
    assert_eq!(
        p.stats().reuse_free_bytes,
        cached,
        "a graph's free stays in its pool"
    );
    p.end_allocate_to_pool(GRAPH).unwrap();
    let general = p.alloc(4096, S1).unwrap();
    assert_ne!(general, graph, "the general pool never takes the graph's");
    p.free(general, S1).unwrap();
    p.check().unwrap();
}

/// Pieces, then other sizes that need their memory; the pool's reserved
/// bytes and the blocks the reuse cache handed back.
fn pieces_then_other_sizes(entries: usize) -> (u64, u64) {
    let p = pool(64, ModelEvents::new());
    p.set_reuse_entries(entries).unwrap();
    // Eight chunks, each nearly filled by one piece.
    let pieces: Vec<u64> = (0..8).map(|_| p.alloc(G - 4096, S1).unwrap()).collect();
    for a in pieces {
        p.free(a, S1).unwrap();
    }
    let a = p.alloc(3 * G, S1).unwrap();
    p.free(a, S1).unwrap();
    let b = p.alloc(7 * G, S1).unwrap();
    let c = p.alloc(2 * G, S1).unwrap();
    let st = p.stats();
    for x in [b, c] {
        p.free(x, S1).unwrap();
    }
    p.check().unwrap();
    (st.peak_reserved_bytes, st.reuse_returned)
}

#[test]
fn the_cache_goes_home_before_the_lake_grows() {
    let (without, _) = pieces_then_other_sizes(0);
    let (with, returned) = pieces_then_other_sizes(SUGGESTED_ENTRIES);
    assert_eq!(with, without, "the cache made the pool reserve more");
    assert!(returned >= 9, "eight pieces and a block went home");
}

#[test]
fn at_the_limit_the_cache_goes_home_instead_of_failing() {
    // Eight chunks in all: everything the cache keeps is needed below.
    let p = pool(8, ModelEvents::new());
    let pieces: Vec<u64> = (0..8).map(|_| p.alloc(G - 4096, S1).unwrap()).collect();
    for a in pieces {
        p.free(a, S1).unwrap();
    }
    let a = p.alloc(3 * G, S1).unwrap();
    p.free(a, S1).unwrap();
    assert!(p.stats().reuse_free_bytes > 0);
    let reserved = p.stats().reserved_bytes;
    // Another size, all the memory: served from what the cache gave back.
    let all = p.alloc(8 * G, S1).unwrap();
    let st = p.stats();
    assert_eq!(st.ooms, 0);
    assert_eq!(st.reuse_free_bytes, 0);
    assert!(st.reuse_returned > 0);
    assert!(st.reserved_bytes <= 8 * G && st.reserved_bytes >= reserved);
    p.free(all, S1).unwrap();
    p.check().unwrap();
}

#[test]
fn a_miss_that_fits_a_free_window_keeps_the_cache() {
    let p = pool(64, ModelEvents::new());
    let a = p.alloc(2 * G, S1).unwrap();
    let b = p.alloc(3 * G, S1).unwrap();
    p.free(b, S1).unwrap();
    p.free(a, S1).unwrap();
    // The lake's free chunks (the three of `b` are cached, not free) hold
    // none: a new size makes the cache go home first.
    let c = p.alloc(5 * G, S1).unwrap();
    assert_eq!(p.stats().reuse_free_bytes, 0);
    p.free(c, S1).unwrap();
    // Now 5 chunks are cached and the lake holds none free: a one-chunk
    // request empties the cache, then takes a chunk of the lake.
    assert_eq!(p.stats().reuse_free_bytes, 5 * G);
    let d = p.alloc(G, S1).unwrap();
    assert_eq!(p.stats().reuse_free_bytes, 0);
    // A window of free chunks (four left) serves a miss with the cache
    // kept.
    p.free(d, S1).unwrap();
    let e = p.alloc(2 * G, S1).unwrap();
    let kept = p.stats().reuse_free_bytes;
    assert_eq!(kept, G, "d's chunk stays cached");
    p.free(e, S1).unwrap();
    p.check().unwrap();
}

#[test]
fn empty_cache_returns_what_the_cache_holds() {
    let p = pool(64, ModelEvents::completing());
    let a = p.alloc(3 * G, S1).unwrap();
    let b = p.alloc(100, S1).unwrap();
    p.free(a, S1).unwrap();
    p.free(b, S1).unwrap();
    assert!(p.stats().reuse_free_bytes > 0);
    p.empty_cache().unwrap();
    let st = p.stats();
    assert_eq!((st.reuse_free_bytes, st.reserved_bytes), (0, 0));
    assert_eq!(p.lake().driver().census(), Default::default());
}

#[test]
fn blocks_over_the_bound_go_to_the_lake() {
    let p = pool(4 * MAX_BLOCK_CHUNKS, ModelEvents::new());
    let big = p.alloc((MAX_BLOCK_CHUNKS + 1) * G, S1).unwrap();
    let kept = p.alloc(MAX_BLOCK_CHUNKS * G, S1).unwrap();
    p.free(big, S1).unwrap();
    p.free(kept, S1).unwrap();
    assert_eq!(p.stats().reuse_free_bytes, MAX_BLOCK_CHUNKS * G);
    assert_eq!(p.lake().stats().live_allocations, 1, "the kept one");
    p.check().unwrap();
}

#[test]
fn the_bound_on_entries_holds() {
    let p = pool(64, ModelEvents::new());
    p.set_reuse_entries(2).unwrap();
    let blocks: Vec<u64> = (0..3).map(|_| p.alloc(4096, S1).unwrap()).collect();
    for a in blocks {
        p.free(a, S1).unwrap();
    }
    assert_eq!(p.stats().reuse_free_bytes, 2 * 4096);
    p.check().unwrap();
    p.set_reuse_entries(0).unwrap();
    assert_eq!(p.stats().reuse_free_bytes, 0, "turning it off empties it");
    p.check().unwrap();
}
