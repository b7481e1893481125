//! Every kind of bad free, on checked and unchecked heaps (CPU; host threads
//! run the device code). Each bad free is followed by the good frees, a
//! normal round, and an allocation of the whole heap: no bad free may lose a
//! segment, corrupt the statistics, or (on a checked heap) change anything.
//!
//! What each kind is counted as (see README, "Defined answers"):
//!
//! | kind | checked | unchecked |
//! |---|---|---|
//! | outside the heap, misaligned, in a free segment, run interior | invalid | invalid |
//! | slice never handed out (live block) | invalid | not detected |
//! | slice freed twice | double | not detected |
//! | block never handed out | invalid | double |
//! | block or run freed twice (also after its segment came back) | double | double |

use gpumalloc::gpu_kernels::workload::{fill, verify};
use gpumalloc::{CpuHeap, HeapConfig};

const MIB: u64 = 1 << 20;
/// A request of the smallest block class (256 KiB since 8 … 128 KiB
/// became slice classes): the bad-free cases named "block" need one.
const BLOCK: u64 = 1 << gpumalloc::gpu_kernel::class::MIN_BLOCK_CLASS_SHIFT;

/// One kind of bad free: sets up live allocations, makes the bad free,
/// returns the good pointers to free afterwards.
struct Kind {
    name: &'static str,
    /// (invalid, double) counted on a checked heap.
    checked: (u64, u64),
    /// (invalid, double) counted on an unchecked heap.
    unchecked: (u64, u64),
    run: fn(&CpuHeap) -> Vec<*mut u8>,
}

fn alloc(h: &CpuHeap, size: u64) -> *mut u8 {
    let p = h.heap().malloc(size);
    assert!(!p.is_null(), "malloc({size})");
    p
}

fn kinds() -> Vec<Kind> {
    vec![
        Kind {
            name: "outside the heap",
            checked: (1, 0),
            unchecked: (1, 0),
            run: |h| {
                let mut x = 0u64;
                h.heap().free(&mut x as *mut u64 as *mut u8);
                vec![]
            },
        },
        Kind {
            name: "inside a slice, not its start",
            checked: (1, 0),
            unchecked: (1, 0),
            run: |h| {
                let p = alloc(h, 64);
                // SAFETY: inside the 64-byte slice.
                h.heap().free(unsafe { p.add(8) });
                vec![p]
            },
        },
        Kind {
            name: "slice never handed out, in a live block",
            checked: (1, 0),
            unchecked: (0, 0),
            run: |h| {
                let p = alloc(h, 64);
                // 100 slices on: in the same block, past what the slot issued.
                h.heap().free(p.wrapping_add(64 * 100));
                vec![p]
            },
        },
        Kind {
            name: "slice freed twice",
            checked: (0, 1),
            unchecked: (0, 0),
            run: |h| {
                let p = alloc(h, 64);
                let q = alloc(h, 64);
                h.heap().free(p);
                h.heap().free(p);
                vec![q]
            },
        },
        Kind {
            name: "block freed twice",
            checked: (0, 1),
            unchecked: (0, 1),
            run: |h| {
                let p = alloc(h, BLOCK);
                let q = alloc(h, BLOCK);
                h.heap().free(p);
                h.heap().free(p);
                vec![q]
            },
        },
        Kind {
            name: "block never handed out",
            checked: (1, 0),
            unchecked: (0, 1),
            run: |h| {
                let p = alloc(h, BLOCK);
                h.heap().free(p.wrapping_add(BLOCK as usize * 5));
                vec![p]
            },
        },
        Kind {
            name: "block freed twice after its segment came back",
            checked: (0, 1),
            unchecked: (0, 1),
            run: |h| {
                let p = alloc(h, 1 << 20);
                h.heap().free(p);
                h.heap().free(p);
                vec![]
            },
        },
        Kind {
            name: "run freed twice",
            checked: (0, 1),
            unchecked: (0, 1),
            run: |h| {
                let p = alloc(h, 3 * h.heap().segment_bytes());
                h.heap().free(p);
                h.heap().free(p);
                vec![]
            },
        },
        Kind {
            name: "inside a run",
            checked: (2, 0),
            unchecked: (2, 0),
            run: |h| {
                let p = alloc(h, 3 * h.heap().segment_bytes());
                h.heap().free(p.wrapping_add(4096));
                h.heap()
                    .free(p.wrapping_add(h.heap().segment_bytes() as usize));
                vec![p]
            },
        },
        Kind {
            name: "in a segment never used",
            checked: (1, 0),
            unchecked: (1, 0),
            run: |h| {
                h.heap().free((h.heap().data() + h.bytes() / 2) as *mut u8);
                vec![]
            },
        },
    ]
}

/// 2,000 allocations of mixed classes, filled, verified, freed.
fn normal_round(h: &CpuHeap) {
    let sizes = [16u64, 64, 256, 4096, 8192, 100_000];
    let ptrs: Vec<(*mut u8, u64)> = (0..2000u64)
        .map(|i| {
            let size = sizes[i as usize % sizes.len()];
            let p = alloc(h, size);
            // SAFETY: a fresh allocation of `size` bytes.
            unsafe { fill(p, size, i) };
            (p, size)
        })
        .collect();
    for (i, &(p, size)) in ptrs.iter().enumerate() {
        // SAFETY: written above.
        assert_eq!(unsafe { verify(p, size, i as u64) }, 0, "overlap");
    }
    for (p, _) in ptrs {
        h.heap().free(p);
    }
}

fn check(config: HeapConfig, checked: bool) {
    for kind in kinds() {
        let h = CpuHeap::new(config).unwrap();
        let good = (kind.run)(&h);
        for p in good {
            h.heap().free(p);
        }
        h.flush();
        let s = h.stats();
        let want = if checked {
            kind.checked
        } else {
            kind.unchecked
        };
        assert_eq!(
            (s.invalid_frees, s.double_frees),
            want,
            "{} ({}): {s:?}",
            kind.name,
            if checked { "checked" } else { "unchecked" }
        );
        assert_eq!(s.live_bytes, 0, "{}: {s:?}", kind.name);
        assert_eq!(s.free_segments, s.segments, "{}: {s:?}", kind.name);
        normal_round(&h);
        let whole = h.heap().malloc(h.bytes());
        assert!(!whole.is_null(), "{}: the whole heap after", kind.name);
        h.heap().free(whole);
        h.flush();
        let after = h.stats();
        assert_eq!(after.live_bytes, 0, "{}: {after:?}", kind.name);
        assert_eq!(
            after.free_segments, after.segments,
            "{}: {after:?}",
            kind.name
        );
        assert_eq!(
            (after.invalid_frees, after.double_frees),
            want,
            "{}: the normal round counted misuse",
            kind.name
        );
    }
}

#[test]
fn bad_frees_on_a_checked_heap() {
    check(HeapConfig::checked(64 * MIB), true);
}

#[test]
fn bad_frees_on_an_unchecked_heap() {
    check(HeapConfig::unchecked(64 * MIB), false);
}

/// Two threads free the same slice (or block) at once, many times: on a
/// checked heap exactly one free counts and the other is a double free.
#[test]
fn racing_double_frees_count_once() {
    let h = CpuHeap::new(HeapConfig::checked(64 * MIB)).unwrap();
    let rounds = 300u64;
    for size in [64u64, BLOCK] {
        let barrier = std::sync::Barrier::new(2);
        for _ in 0..rounds {
            let p = alloc(&h, size) as u64;
            std::thread::scope(|s| {
                for _ in 0..2 {
                    s.spawn(|| {
                        barrier.wait();
                        h.heap().free(p as *mut u8);
                    });
                }
            });
        }
    }
    h.flush();
    let s = h.stats();
    assert_eq!((s.invalid_frees, s.double_frees), (0, 2 * rounds), "{s:?}");
    assert_eq!((s.live_bytes, s.free_segments), (0, s.segments), "{s:?}");
}
