//! Kernel entry points and the `extern "C"` device functions, GPU only.
//!
//! - `gallatin_malloc` / `gallatin_free` come from `device-c-abi` (linked
//!   in `lib.rs`), so this PTX holds them too.
//! - `gpumalloc_selftest`: exercises every `arch` primitive; the host checks
//!   the results (`host::selftest`).
//! - `heap_*`: test and benchmark kernels over a `Heap`.
//! - `cuda_*` and `bump_*`: the baselines the benchmark compares against.
//!
//! Every kernel takes its thread count `n` and returns early for threads past
//! it, so launches may round up to whole blocks.

use crate::selftest::SELFTEST_WORDS;
use crate::workload;
use gpu_kernel::Heap;
use gpu_kernel::arch::{self, Word, Word32};

/// The size thread `t` works on: `sizes[t]`, or `size` when `sizes` is null.
///
/// # Safety
/// A non-null `sizes` holds more than `t` words.
#[inline(always)]
unsafe fn size_for(size: u64, sizes: *const u64, t: u64) -> u64 {
    if sizes.is_null() {
        size
    } else {
        // SAFETY: the caller's contract.
        unsafe { *sizes.add(t as usize) }
    }
}

/// The architecture self-test. Thread `t < n` writes, at `out[t * 8 ..]`:
/// 0: ballot of (lane even) over the active mask; 1: match_any of lane / 4;
/// 2: shuffle of `t << 32 | t` from lane + 1 (wrapping within the active
/// lanes' range); 3: old value of a 64-bit acq_rel add on `w64[0]`; 4: old
/// value of a 32-bit acq_rel add on `w32[0]`; 5: old value of an acq_rel or
/// of bit `t % 64` into `w64[1 + t / 64]`; 6: old value of an exchange of
/// `t + 1` into `w64[1 + n.div_ceil(64)]`; 7: active mask | lane << 32 |
/// (CAS retries) << 40 for a CAS increment of `w32[1]`.
///
/// # Safety
/// `out` holds `8 * n` words, `w64` `2 + n / 64` zeroed words, `w32` two.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn gpumalloc_selftest(
    out: *mut u64,
    w64: *const Word,
    w32: *const Word32,
    n: u64,
) {
    let t = arch::global_thread_index();
    if t >= n {
        return;
    }
    let mask = arch::active_mask();
    let lane = arch::lane_id();
    let ballot = arch::ballot(mask, lane % 2 == 0);
    let matched = arch::match_any(mask, lane / 4);
    let src = if mask & (1 << ((lane + 1) % 32)) != 0 {
        (lane + 1) % 32
    } else {
        arch::lowest_lane(mask)
    };
    let shuffled = arch::shfl_u64(mask, t << 32 | t, src);
    // SAFETY: the caller sized w64 and w32 as documented.
    let (add64, add32, or, swap, retries) = unsafe {
        let add64 = arch::fetch_add_acq_rel(&*w64, 1);
        let add32 = arch::fetch_add_acq_rel32(&*w32, 1) as u64;
        let or = arch::fetch_or_acq_rel(&*w64.add(1 + (t / 64) as usize), 1 << (t % 64));
        let swap = arch::swap_acq_rel(&*w64.add(1 + n.div_ceil(64) as usize), t + 1);
        let counter = &*w32.add(1);
        let mut retries = 0u64;
        let mut current = arch::load_relaxed32(counter);
        while let Err(actual) = arch::compare_exchange_acq_rel32(counter, current, current + 1) {
            current = actual;
            retries += 1;
        }
        (add64, add32, or, swap, retries)
    };
    let values = [
        ballot as u64,
        matched as u64,
        shuffled,
        add64,
        add32,
        or,
        swap,
        mask as u64 | (lane as u64) << 32 | retries.min(0xff_ffff) << 40,
    ];
    for (i, v) in values.into_iter().enumerate() {
        // SAFETY: out holds 8 * n words and t < n.
        unsafe { *out.add(t as usize * SELFTEST_WORDS + i) = v };
    }
}

/// Holds the stream for `ns` nanoseconds: thread 0 spins on the GPU's
/// global timer. `Gpu::time_queued` launches it before its start event,
/// so the kernels it times are already queued when timing begins.
///
/// # Safety
/// None beyond a valid launch (it touches no memory).
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn hold_stream(ns: u64, n: u64) {
    if arch::global_thread_index() < n.min(1) {
        let end = arch::global_nanos().saturating_add(ns);
        while arch::global_nanos() < end {}
    }
}

/// Thread `t` allocates `size` bytes (or `sizes[t]` if `sizes` is not
/// null) into `ptrs[t]`.
///
/// # Safety
/// `ptrs` (and `sizes`, if not null) hold `n` words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn heap_alloc(
    heap: Heap,
    size: u64,
    sizes: *const u64,
    ptrs: *mut u64,
    n: u64,
) {
    let t = arch::global_thread_index();
    if t < n {
        // SAFETY: t < n and the arrays hold n words.
        unsafe {
            let s = size_for(size, sizes, t);
            *ptrs.add(t as usize) = heap.malloc(s) as u64;
        }
    }
}

/// `heap_alloc` with [`Heap::malloc_waiting`]: a request the heap cannot
/// meet waits up to `wait_ns` nanoseconds for the host to grow it.
///
/// # Safety
/// As for `heap_alloc`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn heap_alloc_waiting(
    heap: Heap,
    size: u64,
    sizes: *const u64,
    ptrs: *mut u64,
    n: u64,
    wait_ns: u64,
) {
    let t = arch::global_thread_index();
    if t < n {
        // SAFETY: t < n and the arrays hold n words.
        unsafe {
            let s = size_for(size, sizes, t);
            *ptrs.add(t as usize) = heap.malloc_waiting(s, wait_ns) as u64;
        }
    }
}

/// Thread `t` allocates `log_uniform_size(seed, t, step, lo, hi)` bytes for
/// step 0, 1, … until its first null or `per_thread` allocations, writes the
/// pointers to `ptrs[t * per_thread ..]` and their count to `counts[t]`
/// (utilization workloads; the host recomputes the sizes).
///
/// # Safety
/// `ptrs` holds `n * per_thread` words, `counts` `n` words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn heap_until_null(
    heap: Heap,
    seed: u64,
    lo: u64,
    hi: u64,
    per_thread: u64,
    ptrs: *mut u64,
    counts: *mut u64,
    n: u64,
) {
    let t = arch::global_thread_index();
    if t < n {
        let mut step = 0;
        while step < per_thread {
            let p = heap.malloc(workload::log_uniform_size(seed, t, step, lo, hi));
            if p.is_null() {
                break;
            }
            // SAFETY: t < n and step < per_thread.
            unsafe { *ptrs.add((t * per_thread + step) as usize) = p as u64 };
            step += 1;
        }
        // SAFETY: t < n.
        unsafe { *counts.add(t as usize) = step };
    }
}

/// Thread `t` frees `ptrs[t]`.
///
/// # Safety
/// `ptrs` holds `n` words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn heap_free(heap: Heap, ptrs: *const u64, n: u64) {
    let t = arch::global_thread_index();
    if t < n {
        // SAFETY: t < n.
        unsafe { heap.free(*ptrs.add(t as usize) as *mut u8) };
    }
}

/// Sizes for a mixed run: `sizes[t] = mixed_size(seed, t, lo, hi)`.
///
/// # Safety
/// `sizes` holds `n` words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn mixed_sizes(
    seed: u64,
    lo: u64,
    hi: u64,
    sizes: *mut u64,
    n: u64,
) {
    let t = arch::global_thread_index();
    if t < n {
        // SAFETY: t < n.
        unsafe { *sizes.add(t as usize) = workload::mixed_size(seed, t, lo, hi) };
    }
}

/// Thread `t` writes its pattern into `ptrs[t]` (`size` or `sizes[t]`
/// bytes); a null pointer counts in `errors[0]`.
///
/// # Safety
/// `ptrs` (and `sizes`) hold `n` words; each non-null pointer is an
/// allocation of at least that size; `errors` holds 2 words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn fill_pattern(
    ptrs: *const u64,
    size: u64,
    sizes: *const u64,
    errors: *const Word,
    n: u64,
) {
    let t = arch::global_thread_index();
    if t < n {
        // SAFETY: as documented.
        unsafe {
            let p = *ptrs.add(t as usize) as *mut u8;
            let s = size_for(size, sizes, t);
            if p.is_null() {
                arch::fetch_add_relaxed(&*errors, 1);
            } else {
                workload::fill(p, s, t);
            }
        }
    }
}

/// Thread `t` checks its pattern; wrong words count in `errors[1]`.
///
/// # Safety
/// As for `fill_pattern`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn verify_pattern(
    ptrs: *const u64,
    size: u64,
    sizes: *const u64,
    errors: *const Word,
    n: u64,
) {
    let t = arch::global_thread_index();
    if t < n {
        // SAFETY: as documented.
        unsafe {
            let p = *ptrs.add(t as usize) as *const u8;
            let s = size_for(size, sizes, t);
            if !p.is_null() {
                let wrong = workload::verify(p, s, t);
                if wrong != 0 {
                    arch::fetch_add_relaxed(&*errors.add(1), wrong);
                }
            }
        }
    }
}

/// `fill_pattern` for `n` allocations of one large `size`, a thread per
/// [`workload::PATTERN_PIECE`] of each (one thread filling 32 MiB alone
/// takes about a second): thread `g` fills piece `g % pieces` of
/// allocation `g / pieces`; a null pointer counts in `errors[0]` once.
///
/// # Safety
/// `ptrs` holds `n` words; each non-null pointer is an allocation of at
/// least `size` bytes; `errors` holds 2 words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn fill_pattern_pieces(
    ptrs: *const u64,
    size: u64,
    errors: *const Word,
    n: u64,
) {
    if let Some((t, piece)) = this_piece(size, n) {
        // SAFETY: as documented.
        unsafe {
            let p = *ptrs.add(t as usize) as *mut u8;
            if p.is_null() {
                if piece == 0 {
                    arch::fetch_add_relaxed(&*errors, 1);
                }
            } else {
                workload::fill_piece(p, size, t, piece);
            }
        }
    }
}

/// This thread's allocation and piece in the piecewise pattern kernels
/// (thread `g`: piece `g % pieces` of allocation `g / pieces`), if its
/// allocation is one of the `n`.
fn this_piece(size: u64, n: u64) -> Option<(u64, u64)> {
    let pieces = size.div_ceil(workload::PATTERN_PIECE).max(1);
    let g = arch::global_thread_index();
    (g / pieces < n).then_some((g / pieces, g % pieces))
}

/// `verify_pattern` piecewise, as `fill_pattern_pieces` fills; wrong words
/// count in `errors[1]`.
///
/// # Safety
/// As for `fill_pattern_pieces`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn verify_pattern_pieces(
    ptrs: *const u64,
    size: u64,
    errors: *const Word,
    n: u64,
) {
    if let Some((t, piece)) = this_piece(size, n) {
        // SAFETY: as documented.
        unsafe {
            let p = *ptrs.add(t as usize) as *const u8;
            if !p.is_null() {
                let wrong = workload::verify_piece(p, size, t, piece);
                if wrong != 0 {
                    arch::fetch_add_relaxed(&*errors.add(1), wrong);
                }
            }
        }
    }
}

/// Each thread loops `rounds` times: allocate a seeded size in `lo..=hi`,
/// fill, verify, free. `errors[0]` counts nulls, `errors[1]` wrong words.
///
/// # Safety
/// `errors` holds 2 words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn heap_churn(
    heap: Heap,
    rounds: u32,
    lo: u64,
    hi: u64,
    seed: u64,
    errors: *const Word,
    n: u64,
) {
    let t = arch::global_thread_index();
    if t >= n {
        return;
    }
    for round in 0..rounds as u64 {
        let id = t * rounds as u64 + round;
        let size = workload::mixed_size(seed, id, lo, hi);
        let p = heap.malloc(size);
        // SAFETY: p is null or an allocation of `size` bytes owned by this
        // thread; errors holds 2 words.
        unsafe {
            if p.is_null() {
                arch::fetch_add_relaxed(&*errors, 1);
                continue;
            }
            workload::fill(p, size, id);
            let wrong = workload::verify(p, size, id);
            if wrong != 0 {
                arch::fetch_add_relaxed(&*errors.add(1), wrong);
            }
        }
        heap.free(p);
    }
}

unsafe extern "C" {
    /// CUDA's device-side malloc.
    fn malloc(size: usize) -> *mut u8;
    /// CUDA's device-side free.
    fn free(p: *mut u8);
}

/// Baseline: CUDA's device malloc, same contract as `heap_alloc`.
///
/// # Safety
/// As for `heap_alloc`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn cuda_alloc(size: u64, sizes: *const u64, ptrs: *mut u64, n: u64) {
    let t = arch::global_thread_index();
    if t < n {
        // SAFETY: as documented.
        unsafe {
            let s = size_for(size, sizes, t);
            *ptrs.add(t as usize) = malloc(s as usize) as u64;
        }
    }
}

/// Baseline: CUDA's device free.
///
/// # Safety
/// As for `heap_free`.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn cuda_free(ptrs: *const u64, n: u64) {
    let t = arch::global_thread_index();
    if t < n {
        // SAFETY: t < n; the pointers came from `cuda_alloc`.
        unsafe { free(*ptrs.add(t as usize) as *mut u8) };
    }
}

/// Bound: a bump pointer with one atomic add per warp. Sizes round up to
/// 16 bytes; threads past `capacity` get null. It manages nothing.
///
/// # Safety
/// As for `heap_alloc`; `bump` is one word, `base` a region of `capacity`
/// bytes.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn bump_alloc(
    bump: *const Word,
    base: u64,
    capacity: u64,
    size: u64,
    sizes: *const u64,
    ptrs: *mut u64,
    n: u64,
) {
    let t = arch::global_thread_index();
    if t >= n {
        return;
    }
    // SAFETY: as documented.
    unsafe {
        let s = size_for(size, sizes, t);
        let s = s.div_ceil(16) * 16;
        let mask = arch::active_mask();
        let lane = arch::lane_id();
        let leader = arch::lowest_lane(mask);
        // Exclusive prefix sum of sizes over the active lanes.
        let mut offset = 0u64;
        let mut total = 0u64;
        let mut m = mask;
        while m != 0 {
            let l = m.trailing_zeros();
            let v = arch::shfl_u64(mask, s, l);
            if l < lane {
                offset += v;
            }
            total += v;
            m &= m - 1;
        }
        let mut start = 0;
        if lane == leader {
            start = arch::fetch_add_relaxed(&*bump, total);
        }
        let start = arch::shfl_u64(mask, start, leader);
        let at = start + offset;
        *ptrs.add(t as usize) = if at + s <= capacity { base + at } else { 0 };
    }
}
