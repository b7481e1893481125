//! An example of a user's kernel crate: kernels that allocate from the
//! gpumalloc heap they receive as an argument.
//!
//! Compile it to PTX with `ptx_builder::PtxBuilder` from a `build.rs` (see
//! `examples/user_kernel.rs` in the root package, which builds and runs it).
//! The PTX contains these kernels and nothing else: the allocator crate
//! `gpu-kernel` exports no kernel and no `#[no_mangle]` function, so none of
//! its code appears under a global name (`tests/user_ptx.rs` checks the
//! `.entry` lines). The host sets up the heap without launching a kernel
//! (`host::DeviceHeap::new`); a heap that grows on the device
//! (`host::VmmHeap`) needs the host's own module, `gpumalloc::PTX`.

#![no_std]
#![cfg_attr(target_arch = "nvptx64", feature(abi_ptx, stdarch_nvptx))]

use gpu_kernel::Heap;

/// Builds a linked list of `len` nodes per thread in heap memory, sums it
/// and frees it. Returns the sum, so the host can check it.
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

/// Kernel: thread `t` stores `list_sum(heap, t, len)` (or `u64::MAX` if an
/// allocation failed) into `out[t]`.
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
