//! The allocator's C ABI on the device: `gallatin_malloc` and
//! `gallatin_free` (declared in `include/gpumalloc.h`), and nothing else.
//!
//! CUDA C++ links this crate's PTX (`device_c_abi.ptx`, built by the root
//! `build.rs`; `examples/cpp`), so a C++ program gets these two functions
//! and no kernel or other global name it did not write. The host's PTX
//! (`gpu-kernels`) links this crate too, so both hold the same two
//! functions. GPU only: on the host the crate is empty.
//!
//! Concurrency: each call is one `Heap::malloc` or `Heap::free`, callable
//! from any number of threads at once (see `gpu_kernel::heap`).

#![no_std]

#[cfg(target_arch = "nvptx64")]
mod c_abi {
    use gpu_kernel::Heap;

    /// Allocates `size` bytes from the heap at `heap` (null on failure).
    ///
    /// # Safety
    /// `heap` points to a `Heap` set up by the host and alive for the call.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn gallatin_malloc(heap: *const Heap, size: u64) -> *mut u8 {
        // SAFETY: the caller passes a live heap.
        unsafe { (*heap).malloc(size) }
    }

    /// Frees `p` into the heap at `heap` (see `Heap::free` for bad pointers).
    ///
    /// # Safety
    /// `heap` points to a `Heap` set up by the host and alive for the call.
    #[unsafe(no_mangle)]
    pub unsafe extern "C" fn gallatin_free(heap: *const Heap, p: *mut u8) {
        // SAFETY: the caller passes a live heap.
        unsafe { (*heap).free(p) }
    }
}
