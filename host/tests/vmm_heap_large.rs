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

use std::collections::BTreeSet;
use std::sync::Arc;

use host::Error;
use host::vmm::{ChunkOptions, ModelCensus, ModelVmm, VmmCall, VmmDriver};
use host::vmm_heap::{ModelVmmHeap, VmmHeapConfig};

mod common;
use common::{assert_mapping_consistent, pattern};

const KIB: u64 = 1 << 10;
const MIB: u64 = 1 << 20;
/// Chunks of a segment: 2 MiB segments on 512 KiB chunks.
const CHUNKS_PER_SEGMENT: u64 = 4;
/// Segments mapped at creation.
const PRESENT: u64 = 32;

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
