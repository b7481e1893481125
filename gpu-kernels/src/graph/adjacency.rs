//! `Graph`: the per-vertex page chains and the update operations on them,
//! generic over the [`PageSource`].
//!
//! Concurrency: during one kernel each vertex is handled by at most one thread
//! (a [`Batch`] lists each source vertex once), so a chain and its pages are
//! touched by their owner only. (The warp-per-vertex variants in
//! [`super::warp`] make the owner a warp and say how its lanes share.) The head words are [`Word`]s read and written
//! relaxed: only their owner touches them inside a kernel, and a kernel
//! boundary (a thread join on the host) orders one kernel's writes before the
//! next kernel's reads. The page source is the only state shared between
//! threads, and it is thread-safe itself. The error counters are relaxed
//! atomic adds.
//!
//! Chain invariant (see [`super::page`]): every page but the last is full.

use super::page::Page;
use super::source::PageSource;
use gpu_kernel::arch::{self, Word};

/// Error counters a graph kernel adds to (word index in its error array).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(usize)]
pub enum GraphError {
    /// Edges not inserted because the page source had no page left.
    PageExhausted = 0,
    /// Batch entries naming a vertex id not below the vertex count.
    OutOfRange = 1,
}

/// Words in a graph's error array.
pub const ERROR_WORDS: usize = 2;

/// The graph handle: addresses and a size (built from kernel parameters).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Graph {
    /// Address of `vertices` head words (address of a vertex's first page,
    /// 0 for none); all zero for an empty graph.
    pub heads: u64,
    /// Vertices, numbered `0..vertices`.
    pub vertices: u64,
    /// Address of [`ERROR_WORDS`] counters.
    pub errors: u64,
}

/// One batch of updates grouped by source vertex: entry `i` is the vertex
/// `sources[i]` with the targets `targets[offsets[i]..offsets[i + 1]]`. Each
/// source appears once. Arrays of 64-bit words, addressed like the graph.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Batch {
    /// Address of `len` source vertex ids.
    pub sources: u64,
    /// Address of `len + 1` offsets into `targets`.
    pub offsets: u64,
    /// Address of the target vertex ids.
    pub targets: u64,
    /// Entries (distinct source vertices).
    pub len: u64,
}

impl Batch {
    /// Entry `i`: the source vertex and its targets.
    ///
    /// # Safety
    /// `i < len`, and the arrays are as documented and alive.
    #[inline(always)]
    pub unsafe fn entry(&self, i: u64) -> (u64, &[u64]) {
        // SAFETY: by the caller's contract the arrays hold `len`, `len + 1`
        // and `offsets[len]` words.
        unsafe {
            let source = *(self.sources as *const u64).add(i as usize);
            let offsets = self.offsets as *const u64;
            let start = *offsets.add(i as usize);
            let end = *offsets.add(i as usize + 1);
            let targets = core::slice::from_raw_parts(
                (self.targets as *const u64).add(start as usize),
                (end - start) as usize,
            );
            (source, targets)
        }
    }
}

impl Graph {
    /// Vertex `v`'s head word (`v < vertices`).
    #[inline(always)]
    pub(super) fn head(&self, v: u64) -> &Word {
        // SAFETY: `heads` points to `vertices` words alive while kernels run;
        // callers check `v < vertices`.
        unsafe { &*(self.heads as *const Word).add(v as usize) }
    }

    /// Adds one to error counter `e`.
    #[inline(always)]
    pub fn count_error(&self, e: GraphError) {
        // SAFETY: `errors` points to `ERROR_WORDS` words alive while kernels
        // run.
        let w = unsafe { &*(self.errors as *const Word).add(e as usize) };
        arch::fetch_add_relaxed(w, 1);
    }

    /// Whether `v` names a vertex; counts an error if not.
    #[inline(always)]
    fn check(&self, v: u64) -> bool {
        let ok = v < self.vertices;
        if !ok {
            self.count_error(GraphError::OutOfRange);
        }
        ok
    }

    /// Inserts the edges `v -> t` for each `t` in `targets` that `v` does not
    /// have yet (duplicates, in the graph or in `targets`, are ignored).
    /// The caller is the only thread touching `v` during this kernel.
    pub fn insert<S: PageSource>(&self, source: &S, v: u64, targets: &[u64]) {
        if !self.check(v) {
            return;
        }
        let head = self.head(v);
        for &t in targets {
            if !self.check(t) {
                continue;
            }
            let mut page = arch::load_relaxed(head) as *mut Page;
            let mut last: *mut Page = core::ptr::null_mut();
            let mut present = false;
            // SAFETY: the chain's pages are live pages owned by `v`, and only
            // this thread touches them (see the module docs).
            unsafe {
                while !page.is_null() {
                    if (*page).edges().contains(&(t as u32)) {
                        present = true;
                        break;
                    }
                    last = page;
                    page = (*page).next as *mut Page;
                }
                if present {
                    continue;
                }
                if last.is_null() || (*last).is_full() {
                    let fresh = source.take();
                    if fresh.is_null() {
                        self.count_error(GraphError::PageExhausted);
                        continue;
                    }
                    (*fresh).next = 0;
                    (*fresh).count = 0;
                    if last.is_null() {
                        arch::store_relaxed(head, fresh as u64);
                    } else {
                        (*last).next = fresh as u64;
                    }
                    last = fresh;
                }
                let n = (*last).count as usize;
                (*last).edges[n] = t as u32;
                (*last).count += 1;
            }
        }
    }

    /// Deletes the edges `v -> t` for each `t` in `targets` (absent ones are
    /// ignored). The chain's last edge fills each hole; a last page left
    /// empty is unlinked and given back to `source`.
    pub fn delete<S: PageSource>(&self, source: &S, v: u64, targets: &[u64]) {
        if !self.check(v) {
            return;
        }
        let head = self.head(v);
        for &t in targets {
            if !self.check(t) {
                continue;
            }
            let mut page = arch::load_relaxed(head) as *mut Page;
            let mut before_last: *mut Page = core::ptr::null_mut();
            let mut last: *mut Page = core::ptr::null_mut();
            let mut hole: Option<(*mut Page, usize)> = None;
            // SAFETY: as in `insert`.
            unsafe {
                while !page.is_null() {
                    if hole.is_none()
                        && let Some(slot) = (*page).edges().iter().position(|&e| e == t as u32)
                    {
                        hole = Some((page, slot));
                    }
                    before_last = last;
                    last = page;
                    page = (*page).next as *mut Page;
                }
                let Some((at, slot)) = hole else { continue };
                let n = (*last).count as usize - 1;
                (*at).edges[slot] = (*last).edges[n];
                (*last).count = n as u32;
                if n == 0 {
                    if before_last.is_null() {
                        arch::store_relaxed(head, 0);
                    } else {
                        (*before_last).next = 0;
                    }
                    source.give(last);
                }
            }
        }
    }

    /// The number of edges of `v` (0 for an id out of range).
    pub fn degree(&self, v: u64) -> u64 {
        if v >= self.vertices {
            return 0;
        }
        let mut page = arch::load_relaxed(self.head(v)) as *const Page;
        let mut n = 0;
        // SAFETY: as in `insert`; reading only.
        unsafe {
            while !page.is_null() {
                n += (*page).count as u64;
                page = (*page).next as *const Page;
            }
        }
        n
    }

    /// Writes the edges of `v` (in chain order) to `out`.
    ///
    /// # Safety
    /// `out` has room for `degree(v)` words that no other thread writes.
    pub unsafe fn export(&self, v: u64, out: *mut u64) {
        if v >= self.vertices {
            return;
        }
        let mut page = arch::load_relaxed(self.head(v)) as *const Page;
        let mut at = 0;
        // SAFETY: as in `insert`; `out` by the caller's contract.
        unsafe {
            while !page.is_null() {
                for &e in (*page).edges() {
                    *out.add(at) = e as u64;
                    at += 1;
                }
                page = (*page).next as *const Page;
            }
        }
    }

    /// Gives every page of `v` back to `source` and empties its chain.
    pub fn clear<S: PageSource>(&self, source: &S, v: u64) {
        if v >= self.vertices {
            return;
        }
        let head = self.head(v);
        let mut page = arch::load_relaxed(head) as *mut Page;
        arch::store_relaxed(head, 0);
        // SAFETY: as in `insert`; each page is read before it is given back.
        unsafe {
            while !page.is_null() {
                let next = (*page).next as *mut Page;
                source.give(page);
                page = next;
            }
        }
    }
}
