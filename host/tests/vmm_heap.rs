//! CPU tests of `host::vmm_heap` on the model driver: the heap's memory is
//! reserved, mapped per segment, published, withdrawn and unmapped through
//! `ModelVmm`, while host threads allocate with the device allocator's own
//! code. Allocations are written and read through `ModelVmm::write` /
//! `read`, which refuse any byte that is not mapped with access: an
//! allocation in an unmapped segment, or a segment unmapped under a live
//! allocation, fails the test where a GPU would fault.
//!
//! Workloads (fixed seeds):
//! - a 1 TiB reservation with 4 segments mapped (model without data);
//! - 16 GiB reserved with 4 GiB mapped, grown to 8 and trimmed back: the
//!   size-dependent rules are those of a heap of what is mapped;
//! - 3 threads allocating and freeing log-uniform 16 B–64 KiB, each
//!   allocation filled and verified, every live range checked against all
//!   others, while the main thread grows and trims; after each step mapped
//!   bytes equal present segments × segment size;
//! - driver calls failing at every step of growth and trim: rolled back,
//!   named, and nothing left behind after drop;
//! - the growth service feeding a paced workload (no null), then stopping
//!   at its limit (nulls, no hang), then dropped while running.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gpu_kernels::workload::{SplitMix64, log_uniform_size};
use host::HeapConfig;
use host::vmm::{ChunkOptions, ModelCensus, ModelVmm, VmmCall};
use host::vmm_heap::{GrowthPolicy, ModelVmmHeap, VmmHeapConfig};

mod common;
use common::{assert_mapping_consistent, pattern};

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const TIB: u64 = 1 << 40;

fn model(granularity: u64) -> Arc<ModelVmm> {
    Arc::new(ModelVmm::new(granularity, ChunkOptions::default()))
}

fn model_without_data(granularity: u64) -> Arc<ModelVmm> {
    Arc::new(ModelVmm::without_data(granularity, ChunkOptions::default()))
}

#[test]
fn a_terabyte_reservation_costs_only_what_is_mapped() {
    let vmm = model_without_data(2 * MIB);
    let h = ModelVmmHeap::on_model(vmm.clone(), VmmHeapConfig::new(TIB, 64 * MIB)).unwrap();
    let s = h.stats().unwrap();
    println!(
        "1 TiB heap: {} segments of {} MiB, {} mapped, {} MiB of metadata",
        s.virtual_bytes / s.segment_bytes,
        s.segment_bytes / MIB,
        s.present_segments,
        s.metadata_bytes / MIB
    );
    assert_eq!(s.segment_bytes, 16 * MIB, "1 TiB heaps get 16 MiB segments");
    // Slot words name 2^24 - 1 slice blocks; with blocks of 8,192 16 B
    // slices (since 2026-11-24) that is 2^17 - 1 segments of 16 MiB, so the
    // whole terabyte is nameable (with 4,096 it was one segment short).
    assert_eq!(s.virtual_bytes, TIB, "the whole terabyte");
    assert_eq!(
        s.reserved_bytes,
        TIB + s.segment_bytes,
        "and one segment of alignment slack"
    );
    assert_eq!(s.present_segments, 4);
    assert_eq!(s.mapped_bytes, 64 * MIB);
    assert_eq!(
        vmm.census(),
        ModelCensus {
            reservations: 1,
            chunks: 32,
            mappings: 32,
            rdma_chunks: 0,
            host_chunks: 0,
        }
    );
    // Only the mapped segments are handed out: 1 MiB blocks, 16 a segment.
    let ptrs: Vec<u64> = std::iter::from_fn(|| Some(h.heap().malloc(MIB) as u64))
        .take_while(|&p| p != 0)
        .collect();
    assert_eq!(ptrs.len(), 64);
    for &p in &ptrs {
        let seg = (p - h.data_address()) / s.segment_bytes;
        assert!(seg < 4, "allocation in segment {seg}, which is not mapped");
    }
    assert_eq!(h.grow(1).unwrap(), 16 * MIB, "grow rounds up to a segment");
    assert!(!h.heap().malloc(MIB).is_null(), "the grown segment serves");
    assert_eq!(h.stats().unwrap().mapped_bytes, 80 * MIB);
    for p in ptrs {
        h.heap().free(p as *mut u8);
    }
    // One segment is still in use: trim keeps it.
    assert_eq!(h.trim().unwrap(), 64 * MIB);
    assert_eq!(h.stats().unwrap().present_segments, 1);
    assert_mapping_consistent(&h, &vmm);
    drop(h);
    assert_eq!(vmm.census(), ModelCensus::default(), "drop gives back all");
}

/// Shared by the stress workload's threads: every live range, to check that
/// none overlaps another.
#[derive(Default)]
struct LiveRanges(Mutex<BTreeMap<u64, u64>>);

impl LiveRanges {
    fn insert(&self, at: u64, len: u64) {
        let mut m = self.0.lock().unwrap();
        if let Some((&a, &l)) = m.range(..at + len).next_back() {
            assert!(a + l <= at, "[{at:#x}, +{len}) overlaps [{a:#x}, +{l})");
        }
        m.insert(at, len);
    }

    fn remove(&self, at: u64) {
        self.0.lock().unwrap().remove(&at);
    }
}

/// Workload: 3 threads, each 12,000 steps; a step allocates a log-uniform
/// 16 B–64 KiB size (nulls are expected: the heap is trimmed under them)
/// and writes a pattern over all of it through the model, or verifies and
/// frees a random live allocation. The main thread meanwhile grows by 1–4
/// segments and trims keeping 0–3 free, checking mapped == present ×
/// segment after each step. At the end everything is freed and a trim
/// returns every segment.
/// A VMM heap of 8 MiB segments with `initial` of its `reserve` bytes
/// mapped (model without data).
fn heap_of_8mib_segments(reserve: u64, initial: u64) -> ModelVmmHeap {
    let config = VmmHeapConfig {
        heap: HeapConfig {
            segment_shift: Some(23),
            ..HeapConfig::unchecked(reserve)
        },
        initial_bytes: initial,
        max_mapped_bytes: None,
        peer_access: Vec::new(),
    };
    ModelVmmHeap::on_model(model_without_data(2 * MIB), config).unwrap()
}

/// The size-dependent rules (slots, spares, unlocked formats) of a heap of
/// `bytes` that has all its memory: what a fixed heap of that size gets.
fn rules_of_a_whole_heap(bytes: u64) -> gpu_kernel::team::HeapRules {
    let h = heap_of_8mib_segments(bytes, bytes);
    let heap = h.heap();
    assert_eq!(heap.budget_segments(), heap.segments(), "all of it counts");
    heap.rules()
}

/// Issue 13: a heap reserving 16 GiB with 4 GiB mapped (the bench's
/// `ours-vmm` once grown) applies the rules of a 4 GiB heap of the same
/// segments (the bench's `ours-sized`), not those of 16 GiB, and follows
/// as it grows and trims. Before budgets it kept the 16 GiB rules whatever
/// was mapped. A handle taken before the growth stays usable.
#[test]
fn the_rules_follow_what_is_mapped() {
    let h = heap_of_8mib_segments(16 * GIB, 4 * GIB);
    assert_eq!(
        h.heap().segments(),
        2048,
        "16 GiB of 8 MiB segments reserved"
    );
    assert_eq!(h.heap().budget_segments(), 512, "4 GiB mapped");
    let (four, eight) = (
        rules_of_a_whole_heap(4 * GIB),
        rules_of_a_whole_heap(8 * GIB),
    );
    assert_eq!(h.heap().rules(), four);
    assert_ne!(h.heap().rules(), rules_of_a_whole_heap(16 * GIB));

    let before = h.heap();
    assert_eq!(h.grow(4 * GIB).unwrap(), 4 * GIB);
    assert_eq!(h.heap().rules(), eight, "grown to 8 GiB");
    assert_eq!(before.rules(), four, "a handle keeps its own budget");
    // Both handles allocate from the same heap; either frees.
    let (a, b) = (before.malloc(2048), h.heap().malloc(2048));
    assert!(!a.is_null() && !b.is_null() && a != b);
    h.heap().free(a);
    before.free(b);

    assert_eq!(h.trim_keeping(512).unwrap(), 4 * GIB);
    assert_eq!(h.heap().budget_segments(), 512);
    assert_eq!(h.heap().rules(), four, "trimmed back to 4 GiB");
}

#[test]
fn grow_and_trim_while_threads_allocate() {
    let vmm = model(2 * MIB);
    let mut config = VmmHeapConfig::new(128 * MIB, 4 * MIB);
    config.heap = HeapConfig::checked(128 * MIB);
    let h = ModelVmmHeap::on_model(vmm.clone(), config).unwrap();
    assert_eq!(h.segment_bytes(), 2 * MIB);
    let live = LiveRanges::default();
    let done = AtomicU64::new(0);
    let nulls = AtomicU64::new(0);
    const THREADS: u64 = 3;
    const STEPS: u64 = 12_000;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let (h, vmm, live, done, nulls) = (&h, &vmm, &live, &done, &nulls);
            s.spawn(move || {
                let mut rng = SplitMix64(0x5eed ^ t);
                let mut mine: Vec<(u64, u64, u64)> = Vec::new();
                for step in 0..STEPS {
                    if mine.is_empty() || rng.below(100) < 55 {
                        let size = log_uniform_size(7, t, step, 16, 64 << 10);
                        let p = h.heap().malloc(size) as u64;
                        if p == 0 {
                            nulls.fetch_add(1, Ordering::Relaxed);
                            continue;
                        }
                        live.insert(p, size);
                        let tag = t << 32 | step;
                        vmm.write(p, &pattern(tag, size as usize))
                            .unwrap_or_else(|e| panic!("write {size} B at {p:#x}: {e}"));
                        mine.push((p, size, tag));
                    } else {
                        let (p, size, tag) =
                            mine.swap_remove(rng.below(mine.len() as u64) as usize);
                        let got = vmm
                            .read(p, size as usize)
                            .unwrap_or_else(|e| panic!("read {size} B at {p:#x}: {e}"));
                        assert!(got == pattern(tag, size as usize), "data lost at {p:#x}");
                        live.remove(p);
                        h.heap().free(p as *mut u8);
                    }
                }
                for (p, size, tag) in mine {
                    let got = vmm.read(p, size as usize).unwrap();
                    assert!(got == pattern(tag, size as usize), "data lost at {p:#x}");
                    live.remove(p);
                    h.heap().free(p as *mut u8);
                }
                done.fetch_add(1, Ordering::Release);
            });
        }
        let mut rng = SplitMix64(99);
        let (mut grown, mut trimmed) = (0u64, 0u64);
        while done.load(Ordering::Acquire) < THREADS {
            grown += h.grow((1 + rng.below(4)) * 2 * MIB).unwrap();
            assert_mapping_consistent(&h, &vmm);
            std::thread::sleep(Duration::from_millis(1));
            trimmed += h.trim_keeping(rng.below(4) as u32).unwrap();
            assert_mapping_consistent(&h, &vmm);
        }
        println!(
            "grew {} MiB, trimmed {} MiB, {} nulls",
            grown / MIB,
            trimmed / MIB,
            nulls.load(Ordering::Relaxed)
        );
        assert!(grown > 0 && trimmed > 0, "the test grew and trimmed");
    });
    let hs = h.heap_stats().unwrap();
    assert_eq!(
        (hs.live_bytes, hs.invalid_frees, hs.double_frees),
        (0, 0, 0),
        "{hs:?}"
    );
    h.trim().unwrap();
    let s = h.stats().unwrap();
    assert_eq!((s.present_segments, s.mapped_bytes), (0, 0), "{s:?}");
    assert_eq!(s.segments_grown, s.segments_trimmed, "{s:?}");
    assert_eq!(vmm.census().chunks, 0, "every chunk released");
    drop(h);
    assert_eq!(vmm.census(), ModelCensus::default());
}

#[test]
fn failing_driver_calls_are_rolled_back_and_named() {
    // 512 KiB chunks: a 2 MiB segment is 4 maps, so a failure can land in
    // the middle of one.
    let vmm = model_without_data(512 << 10);
    let h = ModelVmmHeap::on_model(vmm.clone(), VmmHeapConfig::new(64 * MIB, 2 * MIB)).unwrap();
    let census = |chunks| ModelCensus {
        reservations: 1,
        chunks,
        mappings: chunks,
        rdma_chunks: 0,
        host_chunks: 0,
    };
    assert_eq!(vmm.census(), census(4));

    // The 6th map: the 2nd chunk of the 2nd segment of this grow.
    vmm.fail_nth(VmmCall::Map, 6);
    let e = h.grow(3 * 2 * MIB).unwrap_err().to_string();
    println!("{e}");
    assert!(e.contains("cuMemMap") && e.contains("segment 2"), "{e}");
    assert_eq!(
        h.stats().unwrap().present_segments,
        2,
        "the completed segment stays"
    );
    assert_eq!(vmm.census(), census(8), "the half-made one is undone");

    vmm.fail_nth(VmmCall::SetAccess, 1);
    let e = h.grow(2 * MIB).unwrap_err().to_string();
    assert!(e.contains("cuMemSetAccess"), "{e}");
    assert_eq!(vmm.census(), census(8));

    vmm.fail_nth(VmmCall::Create, 3);
    let e = h.grow(2 * MIB).unwrap_err().to_string();
    assert!(e.contains("cuMemCreate"), "{e}");
    assert_eq!(vmm.census(), census(8));

    vmm.set_device_bytes(Some(10 * (512 << 10)));
    let e = h.grow(2 * MIB).unwrap_err().to_string();
    assert!(e.contains("cuMemCreate") && e.contains("full"), "{e}");
    assert_eq!(vmm.census(), census(8));
    vmm.set_device_bytes(None);

    // The grown heap still works after all that.
    assert_eq!(h.grow(2 * MIB).unwrap(), 2 * MIB);
    assert_eq!(h.stats().unwrap().present_segments, 3);
    let p = h.heap().malloc(3 * MIB);
    assert!(!p.is_null(), "a 2-segment run fits");

    // An unmap failing in a trim strands that segment, mapped, until drop.
    vmm.fail_nth(VmmCall::Unmap, 1);
    let e = h.trim().unwrap_err().to_string();
    assert!(e.contains("cuMemUnmap") && e.contains("trimming"), "{e}");
    let s = h.stats().unwrap();
    assert_eq!((s.present_segments, s.stranded_segments), (2, 1), "{s:?}");
    assert_mapping_consistent(&h, &vmm);
    h.heap().free(p);
    assert_eq!(h.trim().unwrap(), 4 * MIB, "the run's segments trim");
    assert_eq!(
        h.stats().unwrap().mapped_bytes,
        2 * MIB,
        "only the stranded segment"
    );
    // Drop gives back the stranded segment's chunks and the reservation.
    drop(h);
    assert_eq!(vmm.census(), ModelCensus::default());

    // A failure at creation leaves nothing behind.
    let vmm = model_without_data(2 * MIB);
    vmm.fail_nth(VmmCall::Map, 3);
    let e = ModelVmmHeap::on_model(vmm.clone(), VmmHeapConfig::new(64 * MIB, 8 * MIB))
        .err()
        .expect("creation fails")
        .to_string();
    assert!(e.contains("cuMemMap"), "{e}");
    assert_eq!(vmm.census(), ModelCensus::default());

    // Segments smaller than the driver's chunks are refused up front.
    let e = ModelVmmHeap::on_model(model_without_data(4 * MIB), VmmHeapConfig::new(64 * MIB, 0))
        .err()
        .expect("2 MiB segments on 4 MiB chunks")
        .to_string();
    assert!(e.contains("granularity"), "{e}");

    // A segment size the allocator does not have is refused, not a panic.
    let mut bad = VmmHeapConfig::new(64 * MIB, 0);
    bad.heap.segment_shift = Some(12);
    let e = ModelVmmHeap::on_model(model_without_data(2 * MIB), bad)
        .err()
        .expect("4 KiB segments")
        .to_string();
    assert!(e.contains("segment shift"), "{e}");
}

/// Workload: 2 threads allocate 64 KiB blocks, 8 and then a 1 ms pause
/// (about 1 MiB/ms together), 160 MiB in all, on a heap that starts with 1
/// segment and has a service keeping 64 segments (128 MiB) free: no null.
/// Then the main thread allocates without pause until null: the service stops at its
/// limit (192 segments) and the nulls come, with no hang. After a trim it
/// grows back; stopped, it grows no more (nulls at what is mapped); the heap
/// is then dropped with the service running.
#[test]
fn the_growth_service_feeds_a_workload_up_to_its_limit() {
    let vmm = model_without_data(2 * MIB);
    let mut config = VmmHeapConfig::new(GIB, 2 * MIB);
    config.max_mapped_bytes = Some(384 * MIB);
    let mut h = ModelVmmHeap::on_model(vmm.clone(), config).unwrap();
    let policy = GrowthPolicy {
        low_free_segments: 64,
        step_segments: 16,
        poll: Duration::from_micros(100),
    };
    h.start_growth(policy).unwrap();
    assert!(h.start_growth(policy).is_err(), "one service at a time");
    common::wait_for("the service never grew", || {
        (h.stats().unwrap().present_segments >= 64).then_some(())
    });
    const BLOCK: u64 = 64 << 10;
    let failed = AtomicBool::new(false);
    let per_thread = 80 * MIB / BLOCK;
    let ptrs: Vec<Vec<u64>> = std::thread::scope(|s| {
        let workers: Vec<_> = (0..2)
            .map(|_| {
                let (h, failed) = (&h, &failed);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    for i in 0..per_thread {
                        let p = h.heap().malloc(BLOCK) as u64;
                        if p == 0 {
                            failed.store(true, Ordering::Relaxed);
                        } else {
                            mine.push(p);
                        }
                        if i % 8 == 7 {
                            std::thread::sleep(Duration::from_millis(1));
                        }
                    }
                    mine
                })
            })
            .collect();
        workers.into_iter().map(|w| w.join().unwrap()).collect()
    });
    let s = h.stats().unwrap();
    println!(
        "paced workload: {} segments mapped in {} steps ({} µs growing)",
        s.present_segments,
        s.grows,
        s.grow_nanos / 1000
    );
    assert!(
        !failed.load(Ordering::Relaxed),
        "a paced request saw null: {s:?}"
    );
    assert!(h.growth_error().is_none(), "{:?}", h.growth_error());

    // Unpaced: nulls come when the service lags; once it has reached its
    // limit they stay. Only a null that comes after the limit was seen
    // ends the loop: a null followed by the service's last growth would
    // otherwise leave that growth's segments unused (the test failed that
    // way about 1 run in 13 on a busy 2-core machine).
    let mut more = Vec::new();
    let cap = GIB / BLOCK;
    let start = Instant::now();
    loop {
        let at_limit = h.stats().unwrap().present_segments == 192;
        let p = h.heap().malloc(BLOCK) as u64;
        if p != 0 {
            more.push(p);
            assert!((more.len() as u64) < cap, "the limit did not hold");
            continue;
        }
        if at_limit {
            break;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "the service stopped short of its limit"
        );
        std::thread::sleep(Duration::from_micros(200));
    }
    let s = h.stats().unwrap();
    assert_eq!(s.present_segments, 192, "{s:?}");
    assert_eq!(s.mapped_bytes, 384 * MIB);
    let total = ptrs.iter().map(Vec::len).sum::<usize>() + more.len();
    assert_eq!(
        total as u64 * BLOCK,
        384 * MIB,
        "the whole limit was handed out"
    );
    assert!(h.heap().malloc(BLOCK).is_null(), "still null at the limit");
    assert_eq!(s.segments_in_use(), 192, "{s:?}");
    for p in ptrs.into_iter().flatten().chain(more) {
        h.heap().free(p as *mut u8);
    }
    assert_eq!(h.trim_keeping(0).unwrap(), 384 * MIB);
    // The service grows back to its low mark; dropping the heap stops it.
    common::wait_for("the service stopped growing", || {
        (h.stats().unwrap().present_segments >= 64).then_some(())
    });
    // Stopped, it grows no more: the heap's nulls come at what is mapped.
    assert_eq!(h.stop_growth(), None, "the service met no error");
    let present = h.stats().unwrap().present_segments;
    let got = std::iter::from_fn(|| Some(h.heap().malloc(BLOCK)))
        .take_while(|p| !p.is_null())
        .count() as u64;
    std::thread::sleep(Duration::from_millis(5));
    assert!(h.heap().malloc(BLOCK).is_null());
    assert_eq!(got * BLOCK, present as u64 * 2 * MIB);
    assert_eq!(h.stats().unwrap().present_segments, present);
    // Started again, then dropped while it runs: no hang.
    h.start_growth(policy).unwrap();
    drop(h);
    assert_eq!(vmm.census(), ModelCensus::default());
}

/// The service on a device that fills up: it maps what fits, reports the
/// failed `cuMemCreate`, keeps looking, and grows again once memory is
/// there; stopping it returns the error it met.
#[test]
fn the_growth_service_reports_driver_failures_and_keeps_going() {
    let vmm = model_without_data(2 * MIB);
    vmm.set_device_bytes(Some(32 * 2 * MIB));
    let mut h = ModelVmmHeap::on_model(vmm.clone(), VmmHeapConfig::new(GIB, 2 * MIB)).unwrap();
    let policy = GrowthPolicy {
        low_free_segments: 64,
        ..GrowthPolicy::default()
    };
    h.start_growth(policy).unwrap();
    let e = common::wait_for("no error came", || h.growth_error());
    assert!(e.contains("cuMemCreate") && e.contains("full"), "{e}");
    assert_eq!(
        h.stats().unwrap().present_segments,
        32,
        "it mapped what fits"
    );
    vmm.set_device_bytes(None);
    common::wait_for("it never grew again", || {
        (h.stats().unwrap().present_segments >= 64).then_some(())
    });
    let stopped = h.stop_growth().expect("the error is kept");
    assert!(stopped.contains("cuMemCreate"), "{stopped}");
    drop(h);
    assert_eq!(vmm.census(), ModelCensus::default());
}

/// `reset` forgets every allocation and keeps what is mapped, also when the
/// mapped segments are not the lowest ids: a request of several segments
/// takes them from the back of the tree, so a trim under it leaves the back
/// mapped and the front absent. Workload: 64 MiB reserved, 2 MiB segments,
/// 16 mapped; 100 × 256 B and one 4-segment request.
#[test]
fn reset_forgets_allocations_and_keeps_the_mapping() {
    let vmm = model(2 * MIB);
    let mut config = VmmHeapConfig::new(64 * MIB, 32 * MIB);
    config.heap = HeapConfig::checked(64 * MIB);
    let mut h = ModelVmmHeap::on_model(vmm.clone(), config).unwrap();
    let seg = h.segment_bytes();
    assert_eq!(seg, 2 * MIB);
    let small: Vec<*mut u8> = (0..100).map(|_| h.heap().malloc(256)).collect();
    let big = h.heap().malloc(4 * seg);
    assert!(small.iter().all(|p| !p.is_null()) && !big.is_null());
    for &p in &small {
        h.heap().free(p);
    }
    assert_eq!(h.trim().unwrap(), 12 * seg, "all but the big request's 4");
    assert_eq!(h.stats().unwrap().present_segments, 4);
    let big_segment = (big as u64 - h.data_address()) / seg;
    assert!(big_segment >= 4, "the big request sits at the back");

    // Reset with the big request live: it is forgotten.
    h.reset().unwrap();
    let s = h.stats().unwrap();
    assert_eq!((s.present_segments, s.free_segments), (4, 4), "{s:?}");
    assert_eq!(h.heap_stats().unwrap().live_bytes, 0);
    assert_mapping_consistent(&h, &vmm);

    // The 4 segments serve a 4-segment request again, and its bytes are
    // mapped (the model refuses a write anywhere else).
    let again = h.heap().malloc(4 * seg) as u64;
    assert_ne!(again, 0);
    vmm.write(again, &pattern(1, (4 * seg) as usize)).unwrap();
    assert!(h.heap().malloc(seg).is_null(), "nothing more is mapped");
    h.heap().free(again as *mut u8);

    // Growing after a reset maps the lowest absent ids and they serve too.
    assert_eq!(h.grow(2 * seg).unwrap(), 2 * seg);
    h.reset().unwrap();
    let s = h.stats().unwrap();
    assert_eq!((s.present_segments, s.free_segments), (6, 6), "{s:?}");
    let ptrs: Vec<u64> = (0..6).map(|_| h.heap().malloc(seg) as u64).collect();
    for (i, &p) in ptrs.iter().enumerate() {
        assert_ne!(p, 0, "segment-sized request {i}");
        vmm.write(p, &pattern(i as u64, seg as usize)).unwrap();
    }
    drop(h);
    assert_eq!(vmm.census(), ModelCensus::default());
}

/// The bounded wait of `Heap::malloc_waiting` (device code, run here by host
/// threads): on a heap whose 2 segments a run holds, a request waits for
/// growth. No growth: null once the wait is over, not before, no hang. A
/// grow 20 ms into a 5 s wait: the request is met, long before the bound.
/// A wait of 0 is `malloc`: null at once.
#[test]
fn malloc_waiting_meets_a_request_once_the_heap_grows() {
    let vmm = model(2 * MIB);
    let h = ModelVmmHeap::on_model(vmm.clone(), VmmHeapConfig::new(64 * MIB, 4 * MIB)).unwrap();
    let seg = h.segment_bytes();
    assert_eq!(seg, 2 * MIB);
    let run = h.heap().malloc(2 * seg);
    assert!(!run.is_null(), "the run takes both mapped segments");
    assert!(h.heap().malloc_waiting(seg, 0).is_null());

    let wait = Duration::from_millis(30);
    let start = Instant::now();
    let p = h.heap().malloc_waiting(seg, wait.as_nanos() as u64);
    let waited = start.elapsed();
    assert!(p.is_null(), "nothing grew");
    assert!(
        waited >= wait && waited < Duration::from_secs(5),
        "{waited:?}"
    );

    let bound = Duration::from_secs(5);
    let (got, waited) = std::thread::scope(|s| {
        let waiter = s.spawn(|| {
            let start = Instant::now();
            let p = h.heap().malloc_waiting(seg, bound.as_nanos() as u64) as u64;
            (p, start.elapsed())
        });
        std::thread::sleep(Duration::from_millis(20));
        assert_eq!(h.grow(seg).unwrap(), seg);
        waiter.join().unwrap()
    });
    println!("a request met by growth after {waited:?}");
    assert_ne!(got, 0, "the grown segment serves the waiting request");
    assert!(waited < bound, "{waited:?}");
    vmm.write(got, &pattern(3, seg as usize)).unwrap();
    h.heap().free(got as *mut u8);
    h.heap().free(run);
}
