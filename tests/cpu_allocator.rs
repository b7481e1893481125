//! The allocator on the CPU: host threads are one-lane warps running the same
//! code as the GPU. Boundaries of every class, churn by many threads with
//! patterns written and verified, exhaustion and recovery, bad input.

use std::collections::HashSet;

use gpumalloc::gpu_kernel::class::{SLICE_CLASSES, segment_shift_for};

/// The segment size of every heap here (all below 2 GiB): the smallest,
/// unless the build sets `GPUMALLOC_SEGMENT_SHIFT`.
const SEGMENT_BYTES: u64 = 1 << segment_shift_for(1 << 30);
use gpumalloc::gpu_kernels::workload::{fill, hash64, verify};
use gpumalloc::{CpuHeap, HeapConfig};

const MIB: u64 = 1 << 20;

fn heap(bytes: u64) -> CpuHeap {
    CpuHeap::new(HeapConfig::checked(bytes)).expect("CPU heap")
}

/// Allocates, fills and verifies `size` bytes; returns the pointer.
fn alloc_checked(h: &CpuHeap, size: u64, id: u64) -> *mut u8 {
    let p = h.heap().malloc(size);
    assert!(!p.is_null(), "malloc({size}) returned null");
    let offset = p as u64 - h.heap().data();
    assert!(offset + size <= h.bytes(), "malloc({size}) out of the heap");
    // SAFETY: p is a fresh allocation of at least `size` bytes.
    unsafe { fill(p, size, id) };
    p
}

#[test]
fn every_boundary_size() {
    let h = heap(256 * MIB);
    let whole = h.bytes();
    assert!(h.heap().malloc(0).is_null(), "malloc(0) must be null");
    assert!(
        h.heap().malloc(whole + 1).is_null(),
        "heap + 1 must be null"
    );
    let sizes = [
        1,
        16,
        17,
        4096,
        4097,
        SEGMENT_BYTES,
        SEGMENT_BYTES + 1,
        3 * SEGMENT_BYTES,
    ];
    let ptrs: Vec<_> = sizes
        .iter()
        .enumerate()
        .map(|(i, &s)| alloc_checked(&h, s, i as u64))
        .collect();
    for (i, (&p, &s)) in ptrs.iter().zip(&sizes).enumerate() {
        // SAFETY: p holds `s` bytes written with pattern i.
        assert_eq!(unsafe { verify(p, s, i as u64) }, 0, "size {s} overwritten");
        let align = s.next_power_of_two().clamp(16, 4096);
        assert_eq!(p as u64 % align, 0, "size {s} misaligned");
    }
    let stats = h.stats();
    assert_eq!(stats.live_allocations(), sizes.len() as u64);
    for p in ptrs {
        h.heap().free(p);
    }
    let stats = h.stats();
    assert_eq!(stats.live_bytes, 0, "{stats:?}");
    assert_eq!(stats.failed_mallocs, 1, "only heap + 1 should have failed");
    // The whole heap in one piece, after the slots give back their blocks.
    let p = alloc_checked(&h, whole, 99);
    h.heap().free(p);
    assert_eq!(h.stats().free_segments, h.stats().segments);
}

#[test]
fn each_slice_class_fills_blocks_without_overlap() {
    let h = heap(512 * MIB);
    for c in 0..SLICE_CLASSES {
        let size = 16u64 << c;
        let count = (8 * MIB / size).min(20_000);
        let ptrs: Vec<_> = (0..count).map(|i| alloc_checked(&h, size, i)).collect();
        let distinct: HashSet<_> = ptrs.iter().collect();
        assert_eq!(distinct.len(), ptrs.len());
        for (i, &p) in ptrs.iter().enumerate() {
            // SAFETY: p holds `size` bytes written with pattern i.
            assert_eq!(
                unsafe { verify(p, size, i as u64) },
                0,
                "class {size}: slice {i} overwritten"
            );
            h.heap().free(p);
        }
        let s = h.stats();
        assert_eq!(s.live_bytes, 0, "class {size}: {s:?}");
    }
}

/// Workload: 8 threads, each keeping up to 64 live allocations of random
/// sizes (mostly slices, some blocks, rarely runs), filling each with its own
/// pattern and verifying it before freeing. Fixed seeds.
#[test]
fn threads_churn_random_sizes() {
    // Peak need is about 50 segments (slot blocks, one segment per block
    // class, live runs); 128 leave room for the runs' contiguity.
    let h = heap(2048 * MIB);
    std::thread::scope(|s| {
        for t in 0..8u64 {
            let h = &h;
            s.spawn(move || {
                let mut live: Vec<(*mut u8, u64, u64)> = Vec::new();
                for i in 0..4000u64 {
                    let r = hash64(t << 32 | i);
                    let size = match r % 100 {
                        0 => SEGMENT_BYTES + r % SEGMENT_BYTES,
                        1..=10 => 4097 + r % (256 * 1024),
                        _ => 1 + r % 4096,
                    };
                    let id = t << 32 | i;
                    let p = h.heap().malloc(size);
                    if p.is_null() {
                        panic!(
                            "thread {t}: malloc({size}) null with memory to spare: {:?}",
                            h.stats()
                        );
                    }
                    // SAFETY: fresh allocation of `size` bytes.
                    unsafe { fill(p, size, id) };
                    live.push((p, size, id));
                    if live.len() > 64 || (r >> 40).is_multiple_of(3) {
                        let k = (r >> 20) as usize % live.len();
                        let (p, size, id) = live.swap_remove(k);
                        // SAFETY: p holds `size` bytes written with pattern id.
                        assert_eq!(unsafe { verify(p, size, id) }, 0, "overlap detected");
                        h.heap().free(p);
                    }
                }
                for (p, size, id) in live {
                    // SAFETY: as above.
                    assert_eq!(unsafe { verify(p, size, id) }, 0, "overlap detected");
                    h.heap().free(p);
                }
            });
        }
    });
    let stats = h.stats();
    assert_eq!(stats.live_bytes, 0, "{stats:?}");
    assert_eq!(stats.live_allocations(), 0);
    assert_eq!(stats.invalid_frees + stats.double_frees, 0);
    let whole = h.heap().malloc(h.bytes());
    assert!(
        !whole.is_null(),
        "the whole heap should be free again: {:?}",
        h.stats()
    );
    h.heap().free(whole);
}

#[test]
fn exhaustion_returns_null_and_the_heap_recovers() {
    let h = heap(64 * MIB);
    for size in [16u64, 256, 4096, 100_000] {
        let mut ptrs = Vec::new();
        loop {
            let p = h.heap().malloc(size);
            if p.is_null() {
                break;
            }
            ptrs.push(p);
        }
        let handed = ptrs.len() as u64 * size;
        let utilization = handed as f64 / h.bytes() as f64;
        let floor = if size == 100_000 { 0.7 } else { 0.97 };
        assert!(
            utilization >= floor,
            "size {size}: utilization {utilization}"
        );
        let first = ptrs.len();
        for p in ptrs.drain(..) {
            h.heap().free(p);
        }
        assert_eq!(h.stats().live_bytes, 0);
        // A second round gets as much again.
        loop {
            let p = h.heap().malloc(size);
            if p.is_null() {
                break;
            }
            ptrs.push(p);
        }
        assert!(
            ptrs.len() >= first,
            "size {size}: {} after recovery, {first} before",
            ptrs.len()
        );
        for p in ptrs {
            h.heap().free(p);
        }
        h.flush();
        assert_eq!(h.stats().free_segments, h.stats().segments, "size {size}");
    }
}

#[test]
fn bad_frees_are_ignored_and_counted() {
    let h = heap(64 * MIB);
    h.heap().free(std::ptr::null_mut());
    let mut outside = 0u64;
    h.heap().free(&mut outside as *mut u64 as *mut u8);
    let p = h.heap().malloc(64);
    // SAFETY: a pointer inside the slice, not its start.
    h.heap().free(unsafe { p.add(8) });
    h.heap().free(p);
    h.heap().free(p);
    let big = h.heap().malloc(2 * SEGMENT_BYTES);
    h.heap().free(big);
    h.heap().free(big);
    let s = h.stats();
    // The second free of the run finds a free segment that remembers it
    // was a run's head: a double free.
    assert_eq!(s.invalid_frees, 2, "{s:?}");
    assert_eq!(s.double_frees, 2, "{s:?}");
    assert_eq!(s.live_bytes, 0);
}

#[test]
#[should_panic(expected = "double free")]
fn trap_on_misuse_stops_on_double_free() {
    let h = CpuHeap::new(HeapConfig {
        trap_on_misuse: true,
        ..HeapConfig::checked(64 * MIB)
    })
    .unwrap();
    let p = h.heap().malloc(32);
    h.heap().free(p);
    h.heap().free(p);
}

#[test]
fn heap_sizes_that_cannot_be_laid_out_are_errors() {
    let e = CpuHeap::new(HeapConfig::with_bytes(MIB))
        .err()
        .expect("too small");
    assert!(e.to_string().contains("smaller than one segment"), "{e}");
}

#[test]
fn a_bad_segment_shift_is_an_error() {
    for shift in [20, 25] {
        let e = CpuHeap::new(HeapConfig {
            segment_shift: Some(shift),
            ..HeapConfig::unchecked(256 * MIB)
        })
        .err()
        .expect("a shift outside 21..=24");
        assert!(e.to_string().contains("segment shift"), "{e}");
    }
}

/// Heaps of 256 MiB … 16 GiB get 2 … 8 MiB segments (at least 2048 of
/// them, unless the build or the configuration names the size; 16 MiB from
/// 32 GiB, checked in `class.rs`: a host may refuse to reserve 32 GiB), and
/// every class, a run and a whole-heap run work at each size. The data of
/// the large heaps is reserved, not touched: each class writes one
/// allocation.
#[test]
fn the_segment_size_follows_the_heap_and_the_configuration() {
    use gpumalloc::gpu_kernel::class::{AUTO_MIN_SEGMENTS, BUILD_SEGMENT_SHIFT};
    let auto = BUILD_SEGMENT_SHIFT == 0 && AUTO_MIN_SEGMENTS == 2048;
    for (bytes, shift, configured) in [
        (256 * MIB, 21, None),
        (4096 * MIB, 21, None),
        (8192 * MIB, 22, None),
        (16384 * MIB, 23, None),
        (512 * MIB, 24, Some(24)),
        (16384 * MIB, 21, Some(21)),
    ] {
        let h = CpuHeap::new(HeapConfig {
            segment_shift: configured,
            ..HeapConfig::checked(bytes)
        })
        .unwrap();
        if auto || configured.is_some() {
            assert_eq!(h.heap().segment_shift(), shift, "{} MiB", bytes >> 20);
        }
        let segment = h.heap().segment_bytes();
        assert_eq!(h.bytes(), bytes / segment * segment);
        let mut ptrs = Vec::new();
        let mut size = 1;
        while size <= 2 * segment {
            ptrs.push(alloc_checked(&h, size, size));
            ptrs.push(alloc_checked(&h, size + 1, size));
            size *= 2;
        }
        let distinct: HashSet<_> = ptrs.iter().collect();
        assert_eq!(distinct.len(), ptrs.len());
        for p in ptrs {
            h.heap().free(p);
        }
        h.flush();
        let s = h.stats();
        assert_eq!(s.live_bytes, 0, "{s:?}");
        assert_eq!(s.free_segments, s.segments, "{s:?}");
        assert_eq!(s.invalid_frees + s.double_frees, 0, "{s:?}");
        let whole = h.heap().malloc(h.bytes());
        assert!(!whole.is_null(), "{} MiB in one run", bytes >> 20);
        h.heap().free(whole);
    }
}

/// Workload: 8 threads (8 slots) allocate 256 B until each sees null; the
/// heap must be nearly all handed out, so slots that ran dry took slices
/// left in other slots' blocks and their spare blocks.
#[test]
fn threads_exhaust_the_heap_together() {
    let h = heap(256 * MIB);
    let size = 256u64;
    let counts: Vec<Vec<u64>> = std::thread::scope(|s| {
        let hs: Vec<_> = (0..8)
            .map(|_| {
                s.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let p = h.heap().malloc(size);
                        if p.is_null() {
                            return mine;
                        }
                        mine.push(p as u64);
                    }
                })
            })
            .collect();
        hs.into_iter().map(|t| t.join().unwrap()).collect()
    });
    let all: HashSet<u64> = counts.iter().flatten().copied().collect();
    let handed = counts.iter().map(Vec::len).sum::<usize>();
    assert_eq!(all.len(), handed, "a slice was handed out twice");
    let share = (handed as u64 * size) as f64 / h.bytes() as f64;
    assert!(share >= 0.97, "utilization {share}");
    for p in all {
        h.heap().free(p as *mut u8);
    }
    h.flush();
    let s = h.stats();
    assert_eq!((s.live_bytes, s.free_segments), (0, s.segments), "{s:?}");
}

/// Allocates `size` until null; returns the pointers.
fn exhaust(h: &CpuHeap, size: u64) -> Vec<*mut u8> {
    std::iter::from_fn(|| Some(h.heap().malloc(size)))
        .take_while(|p| !p.is_null())
        .collect()
}

#[test]
fn a_heap_grows_and_trims_segments() {
    let h = CpuHeap::growable(HeapConfig::checked(256 * MIB), 4).unwrap();
    assert_eq!(h.present_segments(), 4);
    let size = 4096;
    let first = exhaust(&h, size);
    assert_eq!(
        first.len() as u64 * size,
        4 * SEGMENT_BYTES,
        "only the present segments are used"
    );
    assert_eq!(h.grow(4), vec![4, 5, 6, 7]);
    let second = exhaust(&h, size);
    assert_eq!(
        second.len() as u64 * size,
        4 * SEGMENT_BYTES,
        "the grown segments are used"
    );
    for p in first.into_iter().chain(second) {
        h.heap().free(p);
    }
    h.flush();
    // All 8 present segments are free: trim takes them, highest first.
    assert_eq!(h.trim(100), vec![7, 6, 5, 4, 3, 2, 1, 0]);
    assert_eq!(h.present_segments(), 0);
    assert!(
        h.heap().malloc(64).is_null(),
        "a trimmed heap has nothing to give"
    );
    assert_eq!(h.grow(u32::MAX).len() as u64, h.bytes() / SEGMENT_BYTES);
    let whole = h.heap().malloc(h.bytes());
    assert!(
        !whole.is_null(),
        "after growing back the whole heap is one run"
    );
    h.heap().free(whole);
    assert_eq!(h.stats().live_bytes, 0);
}

/// Workload: 4 threads churn 256 B allocations (fill, verify, free) while
/// the main thread grows the heap one segment at a time, then trims what it
/// can; nothing overlaps and nothing is lost.
#[test]
fn a_heap_grows_while_threads_allocate() {
    let h = CpuHeap::growable(HeapConfig::checked(512 * MIB), 1).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        for t in 0..4u64 {
            let (h, stop) = (&h, &stop);
            s.spawn(move || {
                let mut live = Vec::new();
                let mut i = 0u64;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    let p = h.heap().malloc(256);
                    if !p.is_null() {
                        let id = t << 40 | i;
                        // SAFETY: fresh allocation of 256 bytes.
                        unsafe { fill(p, 256, id) };
                        live.push((p, id));
                    }
                    if live.len() > 2000 || (p.is_null() && !live.is_empty()) {
                        for (p, id) in live.drain(..) {
                            // SAFETY: written above with pattern id.
                            assert_eq!(unsafe { verify(p, 256, id) }, 0, "overlap");
                            h.heap().free(p);
                        }
                    }
                    i += 1;
                }
                for (p, id) in live {
                    // SAFETY: as above.
                    assert_eq!(unsafe { verify(p, 256, id) }, 0, "overlap");
                    h.heap().free(p);
                }
            });
        }
        for _ in 0..31 {
            std::thread::sleep(std::time::Duration::from_millis(2));
            h.grow(1);
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
    });
    assert_eq!(h.present_segments(), 32);
    h.flush();
    let s = h.stats();
    assert_eq!(
        (s.live_bytes, s.invalid_frees, s.double_frees),
        (0, 0, 0),
        "{s:?}"
    );
    assert_eq!(h.trim(32).len(), 32, "every segment is free again");
}

/// The stats account for every byte of the segments formatted for slices:
/// with one class in use and nothing freed, live + idle blocks + unissued
/// slot slices + spare blocks = the formatted segments, exactly (what
/// `bench frag` reports to say where a span's excess sits).
#[test]
fn stats_account_for_every_byte_of_formatted_segments() {
    for (size, threads) in [(256u64, 4), (1024, 4), (16, 1)] {
        let h = heap(256 * MIB);
        std::thread::scope(|s| {
            for _ in 0..threads {
                s.spawn(|| {
                    for _ in 0..20_000 / threads {
                        assert!(!h.heap().malloc(size).is_null());
                    }
                });
            }
        });
        let st = h.stats();
        let held = st.live_bytes + st.idle_block_bytes + st.slot_unissued_bytes;
        assert!(st.active_segments > 0, "{st:?}");
        assert_eq!(
            held + st.spare_block_bytes,
            st.active_segments as u64 * SEGMENT_BYTES,
            "{size} B: {st:?}"
        );
        assert_eq!(
            st.live_bytes,
            20_000 / threads as u64 * threads as u64 * size
        );
    }
}

/// With several classes in use the same account holds class by class
/// (`HeapStats::per_class`, what `bench frag`'s map prints for a mixed
/// round): each class's live + idle + unissued + spare bytes = its
/// formatted segments, and the classes sum to the totals, at the peak of
/// a first round and of warm rounds after everything was freed (where
/// slots keep their blocks from round to round).
#[test]
fn stats_account_for_every_byte_class_by_class() {
    let h = heap(256 * MIB);
    let sizes = [16u64, 48, 256, 700, 1024, 3000, 4096];
    for round in 0..3 {
        let ptrs: Vec<Vec<u64>> = std::thread::scope(|s| {
            let threads: Vec<_> = (0..4u64)
                .map(|t| {
                    let h = &h;
                    s.spawn(move || {
                        (0..6_000u64)
                            .map(|i| {
                                let size =
                                    sizes[((i * 7 + t + round) % sizes.len() as u64) as usize];
                                let p = h.heap().malloc(size);
                                assert!(!p.is_null());
                                p as u64
                            })
                            .collect()
                    })
                })
                .collect();
            threads.into_iter().map(|t| t.join().unwrap()).collect()
        });
        check_class_accounts(&h.stats(), round);
        std::thread::scope(|s| {
            for mine in &ptrs {
                let h = &h;
                s.spawn(move || {
                    for &p in mine {
                        h.heap().free(p as *mut u8);
                    }
                });
            }
        });
    }
}

/// [`stats_account_for_every_byte_class_by_class`]'s account of one peak.
fn check_class_accounts(st: &gpu_kernel::stats::HeapStats, round: u64) {
    let mut segments = 0;
    for c in (0..gpu_kernel::class::CLASSES).filter_map(gpu_kernel::class::SizeClass::new) {
        let held = &st.per_class[c.index() as usize];
        let live = st.class_live_bytes(c);
        if c.is_slice() {
            assert_eq!(
                live + held.idle_block_bytes
                    + held.slot_unissued_bytes
                    + held.spare_block_bytes
                    + held.dead_slice_bytes,
                held.segments as u64 * SEGMENT_BYTES,
                "round {round}, class {} B: {held:?}",
                1u64 << c.unit_shift()
            );
        }
        segments += held.segments;
    }
    assert_eq!(segments, st.active_segments);
    let sum = |f: fn(&gpu_kernel::stats::ClassHeld) -> u64| st.per_class.iter().map(f).sum::<u64>();
    assert_eq!(sum(|c| c.idle_block_bytes), st.idle_block_bytes);
    assert_eq!(sum(|c| c.slot_unissued_bytes), st.slot_unissued_bytes);
    assert_eq!(sum(|c| c.spare_block_bytes), st.spare_block_bytes);
    assert_eq!(sum(|c| c.dead_slice_bytes), st.dead_slice_bytes);
}
