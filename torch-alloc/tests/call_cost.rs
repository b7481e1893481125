//! Host cost of one `gm_malloc` + `gm_free` through the C ABI, split into
//! the pool's own time (`call_ns` of `gm_stats`) and the rest (the
//! boundary: context and capture-mode save and restore, panic guard). Needs
//! a GPU: ignored by default, run with `--include-ignored` (the GPU suite
//! does). Prints one `call-cost:` line per size.

use std::time::Instant;

use gpumalloc_torch::{GmStats, gm_free, gm_malloc, gm_stats};

fn stats() -> GmStats {
    let mut s = GmStats::default();
    // SAFETY: `s` is a valid, writable `GmStats`.
    let rc = unsafe { gm_stats(0, &mut s) };
    assert_eq!(rc, 0, "gm_stats failed");
    s
}

/// Times `pairs` allocations of `size` bytes on the default stream, each
/// freed at once, after a warm-up; returns (total µs, pool µs) per call.
fn measure(size: isize, pairs: u32) -> (f64, f64) {
    let null = std::ptr::null_mut();
    for _ in 0..1000 {
        let p = gm_malloc(size, 0, null);
        assert!(!p.is_null(), "gm_malloc({size}) failed in the warm-up");
        gm_free(p, size, 0, null);
    }
    let before = stats().call_ns;
    let started = Instant::now();
    for _ in 0..pairs {
        let p = gm_malloc(size, 0, null);
        assert!(!p.is_null(), "gm_malloc({size}) failed");
        gm_free(p, size, 0, null);
    }
    let total = started.elapsed().as_nanos() as f64;
    let pool = (stats().call_ns - before) as f64;
    assert!(
        pool <= total,
        "pool time {pool} ns above the wall time {total} ns"
    );
    let calls = 2.0 * f64::from(pairs);
    (total / calls / 1e3, pool / calls / 1e3)
}

#[test]
#[ignore = "needs a GPU"]
fn malloc_and_free_cost_through_the_c_abi() {
    for (size, pairs) in [
        (512isize, 200_000u32),
        (24 << 20, 20_000),
        (96 << 20, 5_000),
    ] {
        let (total, pool) = measure(size, pairs);
        println!(
            "call-cost: {size} B: {total:.2} µs per call through the C ABI, {pool:.2} µs in the \
             pool, {:.2} µs at the boundary",
            total - pool
        );
    }
}
