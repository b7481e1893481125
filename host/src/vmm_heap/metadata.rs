//! Where a VMM heap's metadata lives, and how the host publishes and
//! withdraws segments in it: [`SegmentTree`], with [`HostMetadata`] (host
//! memory; host threads allocate, as in `CpuHeap`) and
//! [`super::GpuMetadata`] (device memory; kernels allocate, and the host
//! reaches the tree through small kernels on a stream of its own).
//!
//! Concurrency: every method may be called while other threads (or
//! kernels) allocate and free. The [`super::VmmHeap`] serialises `add`,
//! `withdraw` and `flush` under its ledger lock; `free_segments`,
//! `take_request` and `answer_request` are called by the growth service
//! without it (only the service calls the last two).

use std::sync::atomic::{AtomicU32, Ordering};

use gpu_kernel::Heap;
use gpu_kernel::arch::Word;
use gpu_kernel::layout::{BudgetedHeap, HeapLayout};
use gpu_kernel::stats::HeapStats;

use crate::error::Result;

/// The host's handle on a heap's segment tree.
pub trait SegmentTree: Send + Sync {
    /// Publishes absent segments `ids` (mapped, with access, by the caller)
    /// to the segment tree ([`Heap::add_segment`]); returns how many were
    /// published (all of them, unless an id was not absent: a bug).
    fn add(&self, ids: &[u32]) -> Result<u32>;

    /// Withdraws up to `max` wholly free segments, highest first
    /// ([`Heap::withdraw_free_segment`]); they are absent on return, so no
    /// allocation can reach them and their memory may be unmapped.
    fn withdraw(&self, max: u32) -> Result<Vec<u32>>;

    /// Publishes absent segments `head..head + count` (mapped, with
    /// access, by the caller) as one live run ([`Heap::adopt_run`]); false
    /// if it could not (a segment was not absent: a bug).
    fn adopt_run(&self, head: u32, count: u32) -> Result<bool>;

    /// Frees `address` as device code would ([`Heap::free`]).
    fn free(&self, address: u64) -> Result<()>;

    /// Takes one run request a device thread posted
    /// ([`Heap::take_run_request`]): its slot and the segments it asks for.
    fn take_request(&self) -> Result<Option<(u32, u64)>>;

    /// Answers the request taken from `slot` with run `address` (live,
    /// published; 0: none) ([`Heap::answer_run_request`]): true if the
    /// thread got it, false if it had given up and the run was freed.
    fn answer_request(&self, slot: u32, address: u64) -> Result<bool>;

    /// Empties the per-class slots, so partly used blocks and spare
    /// segments go back to the trees (safe while others allocate).
    fn flush(&self) -> Result<()>;

    /// Wholly free segments in the tree now (a snapshot).
    fn free_segments(&self) -> Result<u32>;

    /// What the heap holds; exact when no one is using it.
    fn stats(&self) -> Result<HeapStats>;

    /// Rewrites the metadata to its initial image with segments
    /// `0..present` in the segment tree and every other segment absent:
    /// every allocation is forgotten at once. Only when nothing uses the
    /// heap and no pointer into it is kept.
    fn reset(&self, present: u32) -> Result<()>;

    /// Sets the heap's budget: handles made from now on (each launch's, each
    /// `heap()`) follow the size-dependent rules of a heap of `segments`
    /// segments (`gpu_kernel::Heap::with_budget`). Correctness never
    /// depends on it: handles made before keep working with their own.
    fn set_budget(&self, segments: u32);

    /// Waits until nothing runs on the heap that this handle launched or
    /// can see (the GPU: both streams idle). Called before the heap's
    /// memory is unmapped for good.
    fn quiesce(&self) -> Result<()>;
}

/// A heap's metadata in host memory, its data in the VMM reservation: host
/// threads call `malloc` and `free` on [`HostMetadata::heap`]. With the
/// CPU model of the driver the data addresses are not host memory: read
/// and write allocations through `ModelVmm::read` / `write`, which refuse
/// any byte that is not mapped with access (what a GPU would fault on).
pub struct HostMetadata {
    heap: Heap,
    /// Segments the handles [`HostMetadata::heap`] makes count for their
    /// rules (relaxed: a tuning value, see [`SegmentTree::set_budget`]).
    budget: AtomicU32,
    /// The words `heap` is bound to (a `Vec`'s buffer does not move when
    /// the `Vec` does).
    words: Vec<Word>,
}

impl HostMetadata {
    /// Metadata for `layout` with every segment absent, bound to data at
    /// `data`.
    ///
    /// # Safety
    /// `data` is the start of `layout.data_bytes()` bytes of address space
    /// aligned to a segment that nothing else uses while this value lives.
    /// The allocator never touches data bytes itself; whoever uses the
    /// pointers it hands out must reach only segments that are mapped.
    pub unsafe fn new(layout: HeapLayout, data: u64) -> HostMetadata {
        let mut image = vec![0u64; layout.metadata_words() as usize];
        layout.write_initial_metadata_with(&mut image, 0);
        let words: Vec<Word> = image.into_iter().map(Word::new).collect();
        // SAFETY: `words` holds the initial image and lives as long as the
        // handle (both are fields of this value, which hands the handle out
        // only as `&Heap` or as a `BudgetedHeap` borrowed from it); the
        // caller vouches for `data`.
        let heap = unsafe { layout.bind(data, words.as_ptr() as u64) };
        HostMetadata {
            heap,
            budget: AtomicU32::new(0),
            words,
        }
    }

    /// The heap handle host threads allocate with, with the budget set
    /// last (see [`SegmentTree::set_budget`]).
    pub fn heap(&self) -> BudgetedHeap<'_> {
        self.heap.with_budget(self.budget.load(Ordering::Relaxed))
    }
}

impl SegmentTree for HostMetadata {
    fn add(&self, ids: &[u32]) -> Result<u32> {
        Ok(ids.iter().filter(|&&id| self.heap.add_segment(id)).count() as u32)
    }

    fn withdraw(&self, max: u32) -> Result<Vec<u32>> {
        Ok((0..max)
            .map_while(|_| self.heap.withdraw_free_segment())
            .collect())
    }

    fn adopt_run(&self, head: u32, count: u32) -> Result<bool> {
        Ok(self.heap.adopt_run(head, count))
    }

    fn free(&self, address: u64) -> Result<()> {
        self.heap.free(address as *mut u8);
        Ok(())
    }

    fn take_request(&self) -> Result<Option<(u32, u64)>> {
        Ok(self.heap.take_run_request())
    }

    fn answer_request(&self, slot: u32, address: u64) -> Result<bool> {
        Ok(self.heap.answer_run_request(slot, address))
    }

    fn flush(&self) -> Result<()> {
        self.heap.flush_slots();
        Ok(())
    }

    fn free_segments(&self) -> Result<u32> {
        Ok(self.heap.free_segments())
    }

    fn stats(&self) -> Result<HeapStats> {
        let words: Vec<u64> = self
            .words
            .iter()
            .map(gpu_kernel::arch::load_relaxed)
            .collect();
        Ok(HeapStats::from_snapshot(&self.heap, &words))
    }

    fn reset(&self, present: u32) -> Result<()> {
        let mut image = vec![0u64; self.words.len()];
        self.heap.write_initial_metadata_with(&mut image, present);
        // Relaxed stores: the caller vouches that no thread uses the heap;
        // threads that use it later are started (or woken) after this call,
        // which orders these stores before their loads.
        for (w, &v) in self.words.iter().zip(&image) {
            gpu_kernel::arch::store_relaxed(w, v);
        }
        Ok(())
    }

    fn set_budget(&self, segments: u32) {
        self.budget.store(segments, Ordering::Relaxed);
    }

    fn quiesce(&self) -> Result<()> {
        Ok(())
    }
}
