//! Kernel entry points, GPU only. Each takes the heap by value (the image
//! the host passes) and returns early for threads past its work.

use gpu_kernel::Heap;
use gpu_kernel::arch::{self, Word};

/// One thread per slot empties the slots, and thread 0 then gives back the
/// segments formatted and never used (`Heap::flush_slots`).
#[unsafe(no_mangle)]
pub extern "ptx-kernel" fn heap_flush(heap: Heap) {
    let t = arch::global_thread_index();
    let slots = gpu_kernel::slot::SLOTS_PER_CLASS as u64;
    if let Some(class) = gpu_kernel::class::SizeClass::new((t / slots) as u32)
        && class.is_slice()
    {
        heap.flush_slot(class, (t % slots) as u32);
    }
    if t == 0 {
        heap.retire_idle_segments();
    }
}

/// Thread `t` publishes absent segment `ids[t]` (`Heap::add_segment`);
/// `added` counts those published.
///
/// # Safety
/// `ids` holds `n` words of absent segment ids; `added` is one word.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn heap_grow(
    heap: Heap,
    ids: *const u64,
    added: *const Word,
    n: u64,
) {
    let t = arch::global_thread_index();
    if t < n {
        // SAFETY: t < n; added is one word.
        unsafe {
            if heap.add_segment(*ids.add(t as usize) as u32) {
                arch::fetch_add_relaxed(&*added, 1);
            }
        }
    }
}

/// One thread publishes absent segments `head..head + count` as one live
/// run (`Heap::adopt_run`), the range the host's `alloc_large` stitched;
/// `ok` is 1 if it did, 0 if not.
///
/// # Safety
/// `ok` is one word; the segments are absent and mapped with access.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn heap_adopt_run(heap: Heap, head: u64, count: u64, ok: *mut u64) {
    if arch::global_thread_index() != 0 {
        return;
    }
    let adopted = u32::try_from(head)
        .ok()
        .zip(u32::try_from(count).ok())
        .is_some_and(|(h, c)| heap.adopt_run(h, c));
    // SAFETY: ok is one word.
    unsafe { *ok = adopted as u64 };
}

/// One thread takes a posted run request (`Heap::take_run_request`):
/// `out[0]` is 1 and `out[1..3]` the slot and segment count if it did,
/// `out[0]` 0 if no request was posted.
///
/// # Safety
/// `out` holds 3 words.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn heap_take_request(heap: Heap, out: *mut u64) {
    if arch::global_thread_index() != 0 {
        return;
    }
    let taken = heap.take_run_request();
    // SAFETY: out holds 3 words.
    unsafe {
        let (slot, count) = taken.unwrap_or((0, 0));
        *out = taken.is_some() as u64;
        *out.add(1) = slot as u64;
        *out.add(2) = count;
    }
}

/// One thread answers the run request taken from `slot` with `address`
/// (`Heap::answer_run_request`: freed here if its thread gave up); `got`
/// is 1 if the thread got it.
///
/// # Safety
/// `got` is one word; `slot` was taken by `heap_take_request` and not yet
/// answered; `address` is 0 or a live run nobody else holds.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn heap_answer_request(
    heap: Heap,
    slot: u64,
    address: u64,
    got: *mut u64,
) {
    if arch::global_thread_index() != 0 {
        return;
    }
    let delivered = u32::try_from(slot).is_ok_and(|s| heap.answer_run_request(s, address));
    // SAFETY: got is one word.
    unsafe { *got = delivered as u64 };
}

/// One thread withdraws up to `max` wholly free segments from the top
/// (`Heap::withdraw_free_segment`) into `ids` and their count into `count`.
///
/// # Safety
/// `ids` holds `max` words; `count` is one word.
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn heap_trim(heap: Heap, max: u64, ids: *mut u64, count: *mut u64) {
    if arch::global_thread_index() != 0 {
        return;
    }
    let mut k = 0;
    while k < max {
        let Some(segment) = heap.withdraw_free_segment() else {
            break;
        };
        // SAFETY: k < max.
        unsafe { *ids.add(k as usize) = segment as u64 };
        k += 1;
    }
    // SAFETY: count is one word.
    unsafe { *count = k };
}

/// Thread `t < n` frees `ptrs[t]` (`Heap::free`): how the host frees what
/// it allocated on a heap (`alloc_large`'s ranges).
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
