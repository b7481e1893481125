//! CPU tests of `VmmHeap::alloc_large` on the model driver: one contiguous
//! range stitched from free segments that are not adjacent, published as a
//! live run that the allocator's own `free` ends.
//!
//! Workload (every test): a 128 MiB reservation of 2 MiB segments with 64
//! MiB (32 segments) mapped, on chunks of 512 KiB (4 per segment, so the
//! order of a segment's chunks is seen); all 32 segments taken by
//! segment-sized allocations, every other one (in address order) freed: 16
//! free segments, no two adjacent. Then half the mapped heap in one piece:
//! `malloc` gets null (what a fixed heap answers), `alloc_large` stitches
//! it. Allocations are written and read through `ModelVmm::write` / `read`,
//! which refuse any byte not mapped with access.
//!
//! The last four tests ask from device code (host threads running
//! `Heap::malloc_waiting`): a run longer than any free run is posted to the
//! growth service, which stitches it (`gpu_kernel::request`).

use std::collections::BTreeSet;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use host::Error;
use host::vmm::{ChunkOptions, ModelCensus, ModelVmm, VmmCall, VmmDriver};
use host::vmm_heap::{GrowthPolicy, ModelVmmHeap, VmmHeapConfig};

mod common;
use common::{assert_mapping_consistent, pattern};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Chunks of a segment: 2 MiB segments on 512 KiB chunks.
const CHUNKS_PER_SEGMENT: u64 = 4;
/// Segments mapped at creation.
const PRESENT: u64 = 32;

/// The end of a request test: frees `live` (what `every_other_free` kept),
/// after which every present segment is free, so a trim gives back all of
/// them, and dropping the heap leaves the model holding nothing.
fn free_live_and_give_everything_back(h: ModelVmmHeap, vmm: &ModelVmm, live: &[u64]) {
    for &q in live {
        h.heap().free(q as *mut u8);
    }
    assert_eq!(h.trim().unwrap(), PRESENT * h.segment_bytes());
    drop(h);
    assert_eq!(vmm.census(), ModelCensus::default());
}

/// The workload's heap with every other segment free; returns the heap,
/// the model, and the live segment-sized allocations (each filled with
/// `pattern(its address, …)`).
fn every_other_free(limit: Option<u64>) -> (ModelVmmHeap, Arc<ModelVmm>, Vec<u64>) {
    let vmm = Arc::new(ModelVmm::new(512 * KIB, ChunkOptions::default()));
    let mut config = VmmHeapConfig::new(128 * MIB, PRESENT * 2 * MIB);
    config.max_mapped_bytes = limit;
    let h = ModelVmmHeap::on_model(vmm.clone(), config).unwrap();
    let seg = h.segment_bytes();
    assert_eq!(seg, 2 * MIB);
    // Segment-sized blocks until null; a flush returns what the slots
    // hold as spares, and the second pass takes those too.
    let mut taken = Vec::new();
    for _ in 0..2 {
        taken.extend(std::iter::from_fn(|| {
            let p = h.heap().malloc(seg) as u64;
            (p != 0).then_some(p)
        }));
        h.flush().unwrap();
    }
    taken.sort_unstable();
    assert_eq!(taken.len() as u64, PRESENT, "one allocation per segment");
    let mut live = Vec::new();
    for (i, &p) in taken.iter().enumerate() {
        if i % 2 == 1 {
            h.heap().free(p as *mut u8);
        } else {
            vmm.write(p, &pattern(p, seg as usize)).unwrap();
            live.push(p);
        }
    }
    h.flush().unwrap();
    assert_eq!(h.stats().unwrap().free_segments as u64, PRESENT / 2);
    (h, vmm, live)
}

/// The live allocations still hold their patterns.
fn assert_live_intact(vmm: &ModelVmm, live: &[u64], seg: u64) {
    for &p in live {
        assert_eq!(
            vmm.read(p, seg as usize).unwrap(),
            pattern(p, seg as usize),
            "live allocation at {p:#x}"
        );
    }
}

#[test]
fn half_the_heap_in_one_piece_is_stitched_from_every_other_segment() {
    let (h, vmm, live) = every_other_free(None);
    let seg = h.segment_bytes();
    let half = PRESENT / 2 * seg;
    let census = vmm.census();

    // A fixed heap's answer: no two free segments are adjacent.
    assert!(h.heap().malloc(half).is_null(), "malloc finds no run");
    assert!(h.heap().malloc(2 * seg).is_null(), "not even of two");

    // The chunks of each free segment, in address order.
    let granule = vmm.granularity();
    let chunks_of = |base: u64| -> Vec<_> {
        (base..base + seg)
            .step_by(granule as usize)
            .map(|a| vmm.chunk_at(a).map(|(c, _)| c))
            .collect()
    };
    let live_set: BTreeSet<u64> = live.iter().copied().collect();
    let freed: Vec<u64> = (0..PRESENT)
        .map(|i| h.data_address() + i * seg)
        .filter(|a| !live_set.contains(a))
        .collect();
    assert_eq!(freed.len() as u64, PRESENT / 2);
    let free_chunks: BTreeSet<Vec<_>> = freed.iter().map(|&a| chunks_of(a)).collect();

    let r = h.alloc_large(half).unwrap();
    assert_eq!(
        (r.bytes, r.stitched_segments, r.new_segments),
        (half, 16, 0)
    );
    // Each segment of the range holds one free segment's chunks in their
    // order, and every free segment went into it.
    let stitched: BTreeSet<Vec<_>> = (r.address..r.address + r.bytes)
        .step_by(seg as usize)
        .map(chunks_of)
        .collect();
    assert_eq!(stitched, free_chunks);
    assert_eq!(
        r.address,
        h.data_address() + PRESENT * seg,
        "the lowest stretch of absent segments: right above the mapped ones"
    );
    assert_eq!(
        vmm.census(),
        census,
        "no chunk created or released, none mapped twice after the move"
    );
    assert_mapping_consistent(&h, &vmm);

    // Every granule of the range is mapped, with access, to a distinct
    // chunk, and the freed segments' addresses are unmapped: their chunks
    // moved.
    let chunks: BTreeSet<_> = (r.address..r.address + r.bytes)
        .step_by(granule as usize)
        .map(|a| {
            let (chunk, access) = vmm.chunk_at(a).expect("mapped");
            assert!(access, "access at {a:#x}");
            chunk
        })
        .collect();
    assert_eq!(chunks.len() as u64, PRESENT / 2 * CHUNKS_PER_SEGMENT);
    for &a in &freed {
        assert!(vmm.chunk_at(a).is_none(), "segment at {a:#x} still mapped");
    }

    // Data written through the range reads back, and the live allocations
    // around the freed segments are untouched.
    let data = pattern(0x1a12e, r.bytes as usize);
    vmm.write(r.address, &data).unwrap();
    assert_eq!(vmm.read(r.address, r.bytes as usize).unwrap(), data);
    assert_live_intact(&vmm, &live, seg);

    let s = h.stats().unwrap();
    assert_eq!((s.present_segments, s.free_segments), (32, 0), "{s:?}");
    assert_eq!((s.large_allocs, s.segments_stitched), (1, 16), "{s:?}");
    let hs = h.heap_stats().unwrap();
    assert_eq!((hs.live_runs, hs.run_segments), (1, 16), "{hs:?}");

    // Device code's free ends it like any run: its segments are free
    // segments of the tree, mapped, and serve a contiguous malloc.
    h.heap().free(r.address as *mut u8);
    let hs = h.heap_stats().unwrap();
    assert_eq!((hs.live_runs, hs.double_frees, hs.invalid_frees), (0, 0, 0));
    assert_eq!(h.stats().unwrap().free_segments, 16);
    let again = h.heap().malloc(half) as u64;
    assert_eq!(again, r.address, "the stitched segments form a run now");
    assert_eq!(vmm.read(again, r.bytes as usize).unwrap(), data);
    h.free_large(again).unwrap();

    // Grow maps the lowest absent ids: the holes the chunks left.
    assert_eq!(h.grow(2 * seg).unwrap(), 2 * seg);
    assert!(vmm.chunk_at(freed[0]).is_some() && vmm.chunk_at(freed[1]).is_some());
    assert_mapping_consistent(&h, &vmm);

    // Everything freed, the trim gives back every segment wherever it lies.
    for &p in &live {
        h.heap().free(p as *mut u8);
    }
    assert_eq!(h.trim().unwrap(), (PRESENT + 2) * seg);
    assert_eq!(vmm.census().chunks, 0);
    drop(h);
    assert_eq!(vmm.census(), ModelCensus::default());
}

/// Free segments fall short: the rest is created and mapped as `grow`
/// does, within the limit; beyond it, nothing changes.
#[test]
fn what_free_segments_lack_is_mapped_new_within_the_limit() {
    let (h, vmm, live) = every_other_free(Some(40 * 2 * MIB));
    let seg = h.segment_bytes();
    let census = vmm.census();
    let e = h.alloc_large(25 * seg).unwrap_err();
    assert!(matches!(e, Error::NoRoom(_)), "{e}");
    assert!(e.to_string().contains("16 free segments"), "{e}");
    assert_eq!(vmm.census(), census, "nothing changed");
    assert_eq!(h.stats().unwrap().free_segments, 16, "sources republished");

    let r = h.alloc_large(24 * seg).unwrap();
    assert_eq!((r.stitched_segments, r.new_segments), (16, 8));
    let data = pattern(24, r.bytes as usize);
    vmm.write(r.address, &data).unwrap();
    assert_eq!(vmm.read(r.address, r.bytes as usize).unwrap(), data);
    assert_live_intact(&vmm, &live, seg);
    assert_eq!(h.stats().unwrap().present_segments, 40);
    assert_mapping_consistent(&h, &vmm);
    h.free_large(r.address).unwrap();
    assert_eq!(h.stats().unwrap().free_segments, 24);
    drop(h);
    assert_eq!(vmm.census(), ModelCensus::default());
}

/// A driver call failing at each step: the call is named, the half-made
/// range undone, the free segments back in the tree with their data; after
/// all that the stitch succeeds; nothing is left after drop.
#[test]
fn failing_driver_calls_in_alloc_large_are_rolled_back() {
    let (h, vmm, live) = every_other_free(Some(33 * 2 * MIB));
    let seg = h.segment_bytes();
    let half = PRESENT / 2 * seg;
    let census = vmm.census();
    let unchanged = |h: &ModelVmmHeap, what: &str| {
        assert_eq!(vmm.census(), census, "{what}");
        let s = h.stats().unwrap();
        assert_eq!(
            (s.present_segments, s.free_segments, s.stranded_segments),
            (32, 16, 0),
            "{what}: {s:?}"
        );
        assert_eq!(s.large_allocs, 0, "{what}");
        assert_mapping_consistent(h, &vmm);
        assert_live_intact(&vmm, &live, seg);
    };

    // The 6th map: the 2nd chunk of the 2nd stitched segment.
    vmm.fail_nth(VmmCall::Map, 6);
    let e = h.alloc_large(half).unwrap_err().to_string();
    assert!(e.contains("cuMemMap") && e.contains("alloc_large"), "{e}");
    unchanged(&h, "a failed map");

    vmm.fail_nth(VmmCall::SetAccess, 3);
    let e = h.alloc_large(half).unwrap_err().to_string();
    assert!(e.contains("cuMemSetAccess"), "{e}");
    unchanged(&h, "a failed set-access");

    // 17 segments: 16 stitched and one new, whose 2nd chunk fails.
    vmm.fail_nth(VmmCall::Create, 2);
    let e = h.alloc_large(half + seg).unwrap_err().to_string();
    assert!(e.contains("cuMemCreate"), "{e}");
    unchanged(&h, "a failed create");

    // An unmap failing while an undo runs strands that target segment;
    // the sources go back all the same.
    vmm.fail_nth(VmmCall::Map, 9);
    vmm.fail_nth(VmmCall::Unmap, 1);
    let e = h.alloc_large(half).unwrap_err().to_string();
    assert!(e.contains("cuMemMap"), "{e}");
    let s = h.stats().unwrap();
    assert_eq!(
        (s.present_segments, s.free_segments, s.stranded_segments),
        (32, 16, 1),
        "{s:?}"
    );
    assert_live_intact(&vmm, &live, seg);

    // The stitch works after all that (above the stranded segment), and
    // its free segments held their place: the data of the live ones is
    // intact.
    let r = h.alloc_large(half).unwrap();
    assert_eq!(r.address, h.data_address() + (PRESENT + 1) * seg);
    let data = pattern(7, half as usize);
    vmm.write(r.address, &data).unwrap();
    assert_eq!(vmm.read(r.address, half as usize).unwrap(), data);
    assert_live_intact(&vmm, &live, seg);

    // An unmap failing in the move strands that source (mapped twice,
    // until drop); the range is handed out all the same. 8 segments: the
    // reservation's 64 hold no other stretch of 16 absent ones now.
    h.free_large(r.address).unwrap();
    vmm.fail_nth(VmmCall::Unmap, 1);
    let r = h.alloc_large(8 * seg).unwrap();
    assert_eq!(r.address, h.data_address() + (PRESENT + 17) * seg);
    let data = pattern(8, r.bytes as usize);
    vmm.write(r.address, &data).unwrap();
    assert_eq!(vmm.read(r.address, r.bytes as usize).unwrap(), data);
    assert_eq!(h.stats().unwrap().stranded_segments, 2);
    h.free_large(r.address).unwrap();
    assert_live_intact(&vmm, &live, seg);

    // No stretch of absent segments that long: refused, nothing changed.
    let e = h.alloc_large(64 * seg).unwrap_err();
    assert!(
        matches!(e, Error::NoRoom(_)) && e.to_string().contains("absent"),
        "{e}"
    );
    drop(h);
    assert_eq!(vmm.census(), ModelCensus::default());
}

/// The growth service as the device's stitcher: it only serves requests
/// here (the free segments never fall under its mark of 1 while it has
/// something to stitch; at the limit it cannot grow anyway).
fn serving() -> GrowthPolicy {
    GrowthPolicy {
        low_free_segments: 1,
        step_segments: 1,
        poll: Duration::from_micros(200),
    }
}

/// A device thread's `malloc_waiting` of half the heap, longer than any
/// free run: with the service running it gets a stitched run, writes and
/// reads it, and frees it with the device `free`; nothing leaks.
#[test]
fn a_waiting_device_request_is_stitched_by_the_service() {
    let (mut h, vmm, live) = every_other_free(Some(PRESENT * 2 * MIB));
    let seg = h.segment_bytes();
    let half = PRESENT / 2 * seg;
    let census = vmm.census();
    assert!(h.heap().malloc(half).is_null(), "no free run of 16");
    h.start_growth(serving()).unwrap();
    let bound = Duration::from_secs(10);
    let (p, waited) = std::thread::scope(|s| {
        s.spawn(|| {
            let start = Instant::now();
            let p = h.heap().malloc_waiting(half, bound.as_nanos() as u64) as u64;
            (p, start.elapsed())
        })
        .join()
        .unwrap()
    });
    println!("a stitched run of 16 segments after {waited:?}");
    assert_ne!(p, 0, "the service stitched the run");
    assert!(waited < bound, "{waited:?}");
    assert_eq!(p % seg, 0);
    let data = pattern(p, half as usize);
    vmm.write(p, &data).unwrap();
    assert_eq!(vmm.read(p, half as usize).unwrap(), data);
    assert_live_intact(&vmm, &live, seg);
    let s = h.stats().unwrap();
    assert_eq!(
        (s.run_requests_served, s.large_allocs, s.segments_stitched),
        (1, 1, 16),
        "{s:?}"
    );
    assert_eq!(vmm.census(), census, "stitched from the free segments only");
    assert_eq!(h.heap().request_slot_values(), [0; 8], "every slot free");

    h.heap().free(p as *mut u8);
    assert_eq!(h.stop_growth(), None);
    let hs = h.heap_stats().unwrap();
    assert_eq!((hs.live_runs, hs.double_frees, hs.invalid_frees), (0, 0, 0));
    assert_eq!(h.stats().unwrap().free_segments, 16);
    free_live_and_give_everything_back(h, &vmm, &live);
}

/// No service (never started, or stopped): the request gets null after
/// its bound, not before, no slot stays taken and nothing is made.
#[test]
fn without_the_service_a_device_request_times_out() {
    let (mut h, vmm, _live) = every_other_free(Some(PRESENT * 2 * MIB));
    let seg = h.segment_bytes();
    let half = PRESENT / 2 * seg;
    let census = vmm.census();
    let wait = Duration::from_millis(30);
    for started in [false, true] {
        if started {
            h.start_growth(serving()).unwrap();
            assert_eq!(h.stop_growth(), None);
        }
        let start = Instant::now();
        assert!(
            h.heap()
                .malloc_waiting(half, wait.as_nanos() as u64)
                .is_null()
        );
        let waited = start.elapsed();
        assert!(
            waited >= wait && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        assert_eq!(h.heap().request_slot_values(), [0; 8]);
        let s = h.stats().unwrap();
        assert_eq!((s.free_segments, s.large_allocs), (16, 0), "{s:?}");
        assert_eq!(vmm.census(), census);
    }
}

/// Stitching fails (an injected `cuMemMap` failure): the request is
/// answered with none, the thread gets null long before its bound, the
/// free segments are back with nothing leaked, and the service names the
/// error. The next request is stitched.
#[test]
fn a_failed_stitch_answers_the_device_with_null() {
    let (mut h, vmm, live) = every_other_free(Some(PRESENT * 2 * MIB));
    let seg = h.segment_bytes();
    let half = PRESENT / 2 * seg;
    let census = vmm.census();
    let bound = Duration::from_secs(10);
    vmm.fail_nth(VmmCall::Map, 6);
    h.start_growth(serving()).unwrap();
    let start = Instant::now();
    assert!(
        h.heap()
            .malloc_waiting(half, bound.as_nanos() as u64)
            .is_null()
    );
    assert!(start.elapsed() < bound / 2, "answered, not timed out");
    let e = h.growth_error().expect("the failure is recorded");
    assert!(e.contains("cuMemMap") && e.contains("alloc_large"), "{e}");
    let s = h.stats().unwrap();
    assert_eq!(
        (
            s.run_requests_refused,
            s.run_requests_served,
            s.free_segments
        ),
        (1, 0, 16),
        "{s:?}"
    );
    assert_eq!(vmm.census(), census, "nothing leaked");
    assert_mapping_consistent(&h, &vmm);
    assert_live_intact(&vmm, &live, seg);

    let p = h.heap().malloc_waiting(half, bound.as_nanos() as u64) as u64;
    assert_ne!(p, 0, "the next request is stitched");
    h.heap().free(p as *mut u8);
    let _ = h.stop_growth();
    free_live_and_give_everything_back(h, &vmm, &live);
}

/// More threads than request slots (12 of 8) each ask for a run of 4
/// segments (no two free segments are adjacent) while holding what they
/// got until all have answers: each gets a run or null, no two runs
/// overlap, data written through each reads back, and after the frees
/// every segment is free and a trim gives back every chunk.
#[test]
fn many_device_requests_at_once_get_distinct_runs_or_null() {
    let (mut h, vmm, live) = every_other_free(None);
    let seg = h.segment_bytes();
    let run = 4 * seg;
    let threads = 12;
    h.start_growth(serving()).unwrap();
    let barrier = Barrier::new(threads);
    let bound = Duration::from_secs(10).as_nanos() as u64;
    let got: Vec<u64> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|_| {
                s.spawn(|| {
                    let p = h.heap().malloc_waiting(run, bound) as u64;
                    if p != 0 {
                        vmm.write(p, &pattern(p, run as usize)).unwrap();
                    }
                    // Everyone holds their run until all have answers.
                    barrier.wait();
                    if p != 0 {
                        assert_eq!(vmm.read(p, run as usize).unwrap(), pattern(p, run as usize));
                    }
                    p
                })
            })
            .collect();
        handles.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let runs: Vec<u64> = got.iter().copied().filter(|&p| p != 0).collect();
    println!("{} of {threads} requests got a run", runs.len());
    assert!(!runs.is_empty());
    let mut sorted = runs.clone();
    sorted.sort_unstable();
    for pair in sorted.windows(2) {
        assert!(pair[0] + run <= pair[1], "overlap: {pair:x?}");
    }
    for &p in &live {
        assert!(
            sorted.iter().all(|&r| p + seg <= r || r + run <= p),
            "a run over a live segment at {p:#x}"
        );
    }
    assert_live_intact(&vmm, &live, seg);
    let s = h.stats().unwrap();
    assert_eq!(
        s.run_requests_served - s.run_requests_abandoned,
        runs.len() as u64,
        "{s:?}"
    );
    // Requests beyond the reservation's absent stretches were refused.
    if let Some(e) = h.stop_growth() {
        assert!(e.contains("alloc_large"), "{e}");
    }
    assert_eq!(h.heap().request_slot_values(), [0; 8]);
    for &p in &runs {
        h.heap().free(p as *mut u8);
    }
    for &p in &live {
        h.heap().free(p as *mut u8);
    }
    let hs = h.heap_stats().unwrap();
    assert_eq!((hs.live_runs, hs.double_frees, hs.invalid_frees), (0, 0, 0));
    let s = h.stats().unwrap();
    assert_eq!(s.free_segments, s.present_segments, "{s:?}");
    assert_mapping_consistent(&h, &vmm);
    h.trim().unwrap();
    assert_eq!(vmm.census().chunks, 0);
    drop(h);
    assert_eq!(vmm.census(), ModelCensus::default());
}
