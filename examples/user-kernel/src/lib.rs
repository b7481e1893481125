//! An example of a user's kernel crate: kernels that allocate from the
//! gpumalloc heap they receive as an argument. The numbered host programs
//! in the root package's `examples/` launch them, in the order a newcomer
//! reads them:
//!
//! - `01_first_alloc.rs`: [`user_first_alloc`], each thread takes a few
//!   bytes, writes them, reads them back and frees them;
//! - `02_linked_list.rs`: [`user_list_sum`], a linked list per thread;
//! - `04_growing_heap.rs`: [`user_grow_fill`] and [`user_grow_check_free`],
//!   more memory than the heap has mapped, waiting for it to grow.
//!
//! (Example 03 is CUDA C++: `examples/cpp/alloc_check.cu`.)
//!
//! Compile it to PTX with `ptx_builder::PtxBuilder` from a `build.rs` (the
//! root package's `build.rs` does, as a user's own would). The PTX contains
//! these kernels and nothing else: the allocator crate `gpu-kernel` exports
//! no kernel and no `#[no_mangle]` function, so none of its code appears
//! under a global name (`tests/user_ptx.rs` checks the `.entry` lines). The
//! host sets up a heap without launching a kernel (`host::DeviceHeap::new`);
//! the kernels a heap launches on itself (flush, grow, trim) are the host
//! crate's own (`heap-kernels`), loaded beside this PTX when first needed.
//!
//! The per-thread work is in plain functions (`write_read_free`,
//! `list_sum`, `fill`, `count_wrong`), so they build for the host too; the
//! kernels only pick the thread's index and store the result.

#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, stdarch_nvptx))]

use gpu_kernel::Heap;

/// Bytes of one word of the test pattern.
pub const WORD_BYTES: u64 = core::mem::size_of::<u64>() as u64;

/// The value word `word` of thread `thread`'s allocation holds: distinct
/// for every thread and word, so two threads handed overlapping memory
/// see each other's words.
pub fn pattern(thread: u64, word: u64) -> u64 {
    (thread << 32) | word
}

/// Example 01: takes `words` words from `heap`, writes [`pattern`] into
/// them, reads them back and frees them. Returns how many words read back
/// right, or `None` if `malloc` returned null.
pub fn write_read_free(heap: &Heap, thread: u64, words: u64) -> Option<u64> {
    let p = heap.malloc(words * WORD_BYTES) as *mut u64;
    if p.is_null() {
        return None;
    }
    // Volatile: a plain write followed by a read of the same word may be
    // folded into a constant, and the memory would go unchecked.
    for i in 0..words as usize {
        // SAFETY: p is a fresh allocation of `words` words, aligned to 16.
        unsafe { p.add(i).write_volatile(pattern(thread, i as u64)) };
    }
    let right = (0..words as usize)
        // SAFETY: as above; every word was written.
        .filter(|&i| unsafe { p.add(i).read_volatile() } == pattern(thread, i as u64))
        .count() as u64;
    heap.free(p as *mut u8);
    Some(right)
}

/// Kernel of example 01: thread `t` stores `write_read_free(heap, t,
/// words)` (or `u64::MAX` if `malloc` returned null) into `out[t]`.
///
/// # Safety
/// `out` holds `n` words.
#[cfg(target_arch = "nvptx64")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn user_first_alloc(heap: Heap, words: u64, out: *mut u64, n: u64) {
    let t = gpu_kernel::arch::global_thread_index();
    if t < n {
        let right = write_read_free(&heap, t, words).unwrap_or(u64::MAX);
        // SAFETY: t < n.
        unsafe { *out.add(t as usize) = right };
    }
}

/// Example 02: builds a linked list of `len` nodes per thread in heap
/// memory, sums it and frees it. Returns the sum, so the host can check it.
pub fn list_sum(heap: &Heap, id: u64, len: u64) -> Option<u64> {
    #[repr(C)]
    struct Node {
        value: u64,
        next: *mut Node,
    }
    let mut head: *mut Node = core::ptr::null_mut();
    for i in 0..len {
        let node = heap.malloc(core::mem::size_of::<Node>() as u64) as *mut Node;
        if node.is_null() {
            break;
        }
        // SAFETY: node is a fresh allocation of size_of::<Node>() bytes,
        // aligned to 16.
        unsafe {
            node.write(Node {
                value: id * 1000 + i,
                next: head,
            })
        };
        head = node;
    }
    let mut sum = 0;
    let mut count = 0;
    while !head.is_null() {
        // SAFETY: every node was written above and is freed once.
        let node = unsafe { head.read() };
        sum += node.value;
        count += 1;
        heap.free(head as *mut u8);
        head = node.next;
    }
    (count == len).then_some(sum)
}

/// Kernel of example 02: thread `t` stores `list_sum(heap, t, len)` (or
/// `u64::MAX` if an allocation failed) into `out[t]`.
///
/// # Safety
/// `out` holds `n` words.
#[cfg(target_arch = "nvptx64")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn user_list_sum(heap: Heap, len: u64, out: *mut u64, n: u64) {
    let t = gpu_kernel::arch::global_thread_index();
    if t < n {
        // SAFETY: t < n.
        unsafe { *out.add(t as usize) = list_sum(&heap, t, len).unwrap_or(u64::MAX) };
    }
}

/// Example 04: writes [`pattern`]`(thread, i)` into word `i` of the
/// `bytes` bytes at `p`.
///
/// # Safety
/// `p` is null (nothing is written) or an allocation of at least `bytes`
/// bytes, aligned to 8, that nothing else uses.
pub unsafe fn fill(p: *mut u64, bytes: u64, thread: u64) {
    if p.is_null() {
        return;
    }
    for i in 0..bytes / WORD_BYTES {
        // SAFETY: i < bytes / 8, within the caller's allocation.
        unsafe { p.add(i as usize).write(pattern(thread, i)) };
    }
}

/// Example 04: how many words of the `bytes` bytes at `p` do not hold what
/// [`fill`] wrote for `thread` (0 for null).
///
/// # Safety
/// As for [`fill`], and `fill(p, bytes, thread)` ran before (in an earlier
/// kernel, or earlier in this thread).
pub unsafe fn count_wrong(p: *const u64, bytes: u64, thread: u64) -> u64 {
    if p.is_null() {
        return 0;
    }
    (0..bytes / WORD_BYTES)
        // SAFETY: i < bytes / 8, within the caller's allocation.
        .filter(|&i| unsafe { p.add(i as usize).read() } != pattern(thread, i))
        .count() as u64
}

/// Kernel of example 04: thread `t` takes `bytes` bytes with
/// `Heap::malloc_waiting` (a request the heap cannot meet yet waits up to
/// `wait_ns` nanoseconds for the host to grow it), fills them with
/// [`fill`] and stores the pointer (null if the heap did not grow in time)
/// into `ptrs[t]`. The memory stays allocated for
/// [`user_grow_check_free`].
///
/// # Safety
/// `ptrs` holds `n` words; `bytes` is a multiple of 8.
#[cfg(target_arch = "nvptx64")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn user_grow_fill(
    heap: Heap,
    bytes: u64,
    wait_ns: u64,
    ptrs: *mut u64,
    n: u64,
) {
    let t = gpu_kernel::arch::global_thread_index();
    if t < n {
        let p = heap.malloc_waiting(bytes, wait_ns) as *mut u64;
        // SAFETY: p is null or a fresh allocation of `bytes` bytes, aligned
        // to 16; t < n.
        unsafe {
            fill(p, bytes, t);
            *ptrs.add(t as usize) = p as u64;
        }
    }
}

/// Kernel of example 04, after [`user_grow_fill`] on the same `ptrs`:
/// thread `t` stores `count_wrong(ptrs[t], bytes, t)` into `wrong[t]` and
/// frees `ptrs[t]`.
///
/// # Safety
/// `ptrs` and `wrong` hold `n` words; `ptrs` is what `user_grow_fill` left
/// with the same `heap`, `bytes` and `n`, and is freed once.
#[cfg(target_arch = "nvptx64")]
#[unsafe(no_mangle)]
pub unsafe extern "ptx-kernel" fn user_grow_check_free(
    heap: Heap,
    bytes: u64,
    ptrs: *const u64,
    wrong: *mut u64,
    n: u64,
) {
    let t = gpu_kernel::arch::global_thread_index();
    if t < n {
        // SAFETY: t < n; the pointer was filled by `user_grow_fill` for
        // thread t and is freed here only.
        unsafe {
            let p = *ptrs.add(t as usize) as *mut u64;
            *wrong.add(t as usize) = count_wrong(p, bytes, t);
            heap.free(p as *mut u8);
        }
    }
}
