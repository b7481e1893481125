//! `PageSource`: where the update kernels get pages and return them, called by
//! many threads at once (each impl is itself thread-safe).
//!
//! Implementations: [`gpu_kernel::Heap`] here (`malloc`/`free` of [`PAGE_BYTES`]),
//! [`super::pool::PagePool`], and CUDA's device `malloc` in
//! `super::kernels` (GPU only).

use super::page::{PAGE_BYTES, Page};
use gpu_kernel::Heap;

/// An allocator of [`Page`]s, usable by many threads at once.
pub trait PageSource {
    /// A page (contents undefined), or null when none is left.
    fn take(&self) -> *mut Page;

    /// Returns a page that came from [`PageSource::take`] of this source and
    /// is no longer reachable from any chain.
    fn give(&self, page: *mut Page);
}

impl PageSource for Heap {
    #[inline(always)]
    fn take(&self) -> *mut Page {
        self.malloc(PAGE_BYTES as u64) as *mut Page
    }

    #[inline(always)]
    fn give(&self, page: *mut Page) {
        self.free(page as *mut u8)
    }
}
