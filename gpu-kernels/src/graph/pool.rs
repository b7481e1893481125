//! `PagePool`: a pre-allocated array of pages with a lock-free free list, the
//! way faimGraph manages its own memory. Any thread may take or give a page at
//! any time.
//!
//! The free list is a Treiber stack (Treiber, IBM RJ 5118, 1986) of page
//! indices. It lives in an array of words the host sets up: word 0 is the
//! *head*, word `1 + i` the *link* of page `i` (the next free page below it).
//! Both hold a page number `i + 1`, with 0 for "none", so an all-zero link
//! array is a valid empty tail.
//!
//! ABA: a pop reads the head page's link and swings the head to it with a CAS;
//! if, in between, the page was popped, pushed back and the link changed, a
//! plain CAS on the page number would succeed with a stale link. So the head
//! also carries a tag in its high half that every successful push and pop
//! increments, and the CAS compares both. (The tag wraps after 2^32 updates of
//! one head; a stalled thread would have to sleep through exactly that many to
//! be fooled.)

use super::page::{PAGE_BYTES, Page};
use super::source::PageSource;
use gpu_kernel::arch::{self, Word};

/// Bits of the head word that hold the page number; the tag is above them.
const NUMBER_BITS: u32 = 32;
/// Mask of the page number in the head word.
const NUMBER_MASK: u64 = (1 << NUMBER_BITS) - 1;
/// Word index of the head in the pool's word array.
const HEAD: usize = 0;
/// Word index of page 0's link.
const FIRST_LINK: usize = 1;

/// The pool handle: addresses and a size, nothing else (passed by value).
#[repr(C)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PagePool {
    /// Address of page 0 (`capacity` pages of [`PAGE_BYTES`], back to back).
    pub pages: u64,
    /// Address of the word array (`PagePool::words(capacity)` words).
    pub words: u64,
    /// Pages in the pool (at most `u32::MAX - 1`).
    pub capacity: u64,
}

impl PagePool {
    /// Words of the free-list array for `capacity` pages.
    pub const fn words(capacity: u64) -> u64 {
        FIRST_LINK as u64 + capacity
    }

    /// Bytes of page memory for `capacity` pages.
    pub const fn page_bytes(capacity: u64) -> u64 {
        capacity * PAGE_BYTES as u64
    }

    /// Writes the initial free list into `words` (`words(capacity)` long):
    /// every page free, page 0 on top.
    pub fn write_initial_words(capacity: u64, words: &mut [u64]) {
        for i in 0..capacity {
            // Link of page i: page i + 1 (number i + 2), the last one none.
            words[FIRST_LINK + i as usize] = if i + 1 < capacity { i + 2 } else { 0 };
        }
        words[HEAD] = if capacity > 0 { 1 } else { 0 };
    }

    /// The free pages in `words` (a snapshot taken while no kernel runs).
    pub fn free_pages(words: &[u64]) -> u64 {
        let mut n = 0;
        let mut at = words[HEAD] & NUMBER_MASK;
        while at != 0 && n <= words.len() as u64 {
            n += 1;
            at = words[FIRST_LINK + at as usize - 1];
        }
        n
    }

    #[inline(always)]
    fn word(&self, index: usize) -> &Word {
        // SAFETY: `words` points to `words(capacity)` words set up by the
        // host and alive while kernels run; callers pass an index below that.
        unsafe { &*(self.words as *const Word).add(index) }
    }

    #[inline(always)]
    fn page(&self, number: u64) -> *mut Page {
        (self.pages + (number - 1) * PAGE_BYTES as u64) as *mut Page
    }
}

impl PageSource for PagePool {
    fn take(&self) -> *mut Page {
        let head = self.word(HEAD);
        // Acquire: the link of the page on top was written (by the push that
        // put it there) before that push's release CAS.
        let mut current = arch::load_acquire(head);
        loop {
            let number = current & NUMBER_MASK;
            if number == 0 {
                return core::ptr::null_mut();
            }
            let below = arch::load_relaxed(self.word(FIRST_LINK + number as usize - 1));
            let tag = (current >> NUMBER_BITS).wrapping_add(1);
            match arch::compare_exchange_acq_rel(head, current, tag << NUMBER_BITS | below) {
                Ok(_) => return self.page(number),
                Err(actual) => current = actual,
            }
        }
    }

    fn give(&self, page: *mut Page) {
        let number = (page as u64 - self.pages) / PAGE_BYTES as u64 + 1;
        let head = self.word(HEAD);
        let link = self.word(FIRST_LINK + number as usize - 1);
        let mut current = arch::load_relaxed(head);
        loop {
            arch::store_relaxed(link, current & NUMBER_MASK);
            let tag = (current >> NUMBER_BITS).wrapping_add(1);
            // Release (in the acq_rel CAS): the link store above and the
            // giver's last writes to the page happen before a taker's
            // acquire of the head.
            match arch::compare_exchange_acq_rel(head, current, tag << NUMBER_BITS | number) {
                Ok(_) => return,
                Err(actual) => current = actual,
            }
        }
    }
}
