//! The per-thread work of the numbered examples' kernels
//! (`examples/user-kernel`) on the CPU. Host threads are one-lane warps
//! running the same allocator code (`CpuHeap`), so what examples 01, 02
//! and 04 check on a GPU is checked here first: every word read back,
//! every list summed, every allocation freed, and a wrong word caught.

use gpumalloc::{CpuHeap, HeapConfig};
use user_kernel::{WORD_BYTES, count_wrong, fill, list_sum, pattern, write_read_free};

const MIB: u64 = 1 << 20;
/// Host threads per test.
const THREADS: u64 = 8;

fn heap() -> CpuHeap {
    CpuHeap::new(HeapConfig::checked(64 * MIB)).expect("CPU heap")
}

/// Nothing live and no failure or bad free counted.
fn assert_clean(h: &CpuHeap) {
    let s = h.stats();
    assert_eq!(
        (
            s.live_bytes,
            s.failed_mallocs,
            s.invalid_frees,
            s.double_frees
        ),
        (0, 0, 0, 0),
        "{s:?}"
    );
}

#[test]
fn patterns_differ_between_threads_and_words() {
    assert_ne!(pattern(0, 1), pattern(1, 0));
    assert_ne!(pattern(1, 0), pattern(0, 0));
    assert_eq!(pattern(3, 7), (3 << 32) | 7);
}

/// Example 01's kernel: 64 B per thread, written, read back, freed.
#[test]
fn first_alloc_reads_back_every_word_and_frees() {
    let h = heap();
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let h = &h;
            s.spawn(move || {
                for _ in 0..1000 {
                    assert_eq!(write_read_free(h.heap(), t, 8), Some(8));
                }
            });
        }
    });
    assert_clean(&h);
}

/// Example 02's kernel: a 16-node list per thread.
#[test]
fn linked_lists_sum_and_free() {
    let h = heap();
    let len = 16;
    std::thread::scope(|s| {
        for t in 0..THREADS {
            let h = &h;
            s.spawn(move || {
                let want = len * t * 1000 + len * (len - 1) / 2;
                assert_eq!(list_sum(h.heap(), t, len), Some(want));
            });
        }
    });
    assert_clean(&h);
}

/// Example 04's kernels: 1 MiB per thread filled, then checked in a second
/// pass; a block read as another thread's, or with one word changed, is
/// counted wrong.
#[test]
fn growing_heap_fill_and_check_catch_wrong_words() {
    let h = heap();
    let ptrs: Vec<*mut u64> = (0..THREADS)
        .map(|t| {
            let p = h.heap().malloc(MIB) as *mut u64;
            assert!(!p.is_null());
            // SAFETY: a fresh allocation of 1 MiB, aligned to 16.
            unsafe { fill(p, MIB, t) };
            p
        })
        .collect();
    for (t, &p) in ptrs.iter().enumerate() {
        // SAFETY: filled above for thread t.
        assert_eq!(unsafe { count_wrong(p, MIB, t as u64) }, 0);
    }
    // SAFETY: as above; thread 1's block read as thread 0's.
    assert_eq!(unsafe { count_wrong(ptrs[1], MIB, 0) }, MIB / WORD_BYTES);
    // SAFETY: word 5 lies within thread 2's block.
    unsafe { ptrs[2].add(5).write(0) };
    // SAFETY: as above.
    assert_eq!(unsafe { count_wrong(ptrs[2], MIB, 2) }, 1);
    // SAFETY: null is allowed: nothing is read.
    assert_eq!(unsafe { count_wrong(std::ptr::null(), MIB, 0) }, 0);
    for p in ptrs {
        h.heap().free(p as *mut u8);
    }
    assert_clean(&h);
}
