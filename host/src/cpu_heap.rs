//! `CpuHeap`: the device heap in host memory, for host threads. Each host
//! thread acts as a one-lane warp (see `gpu_kernel::arch`), so this runs the
//! exact allocator code the GPU runs, minus warp coalescing.

use std::alloc::{Layout, alloc, dealloc};
use std::collections::BTreeSet;
use std::sync::Mutex;

use gpu_kernel::Heap;
use gpu_kernel::arch::Word;
use gpu_kernel::stats::HeapStats;

use crate::config::HeapConfig;
use crate::error::{Error, Result};

/// Alignment of the data region: the largest slice.
const DATA_ALIGN: usize = 4096;

/// A heap in host memory.
pub struct CpuHeap {
    heap: Heap,
    data: *mut u8,
    data_layout: Layout,
    metadata: Vec<Word>,
    /// Segments in no tree (not yet added, or trimmed).
    absent: Mutex<BTreeSet<u32>>,
}

// SAFETY: all shared state is reached through atomics (`Word`); `data` is
// plain memory handed out to one owner at a time by the allocator.
unsafe impl Send for CpuHeap {}
// SAFETY: as above.
unsafe impl Sync for CpuHeap {}

impl CpuHeap {
    /// A heap of `config.bytes` (required on the CPU) bytes, rounded down
    /// to whole segments.
    pub fn new(config: HeapConfig) -> Result<CpuHeap> {
        CpuHeap::growable(config, u32::MAX)
    }

    /// A heap laid out for `config.bytes` of which only the first `present`
    /// segments are usable until [`CpuHeap::grow`] adds more.
    pub fn growable(config: HeapConfig, present: u32) -> Result<CpuHeap> {
        let bytes = config.bytes.ok_or(Error::HeapSize {
            bytes: 0,
            why: "a CPU heap needs an explicit size",
        })?;
        let layout = config.layout(bytes)?;
        let data_layout = Layout::from_size_align(layout.data_bytes() as usize, DATA_ALIGN)
            .map_err(|_| Error::HeapSize {
                bytes,
                why: "too large for this host",
            })?;
        // SAFETY: the layout has a non-zero size (at least one segment).
        let data = unsafe { alloc(data_layout) };
        if data.is_null() {
            return Err(Error::HeapSize {
                bytes,
                why: "host memory allocation failed",
            });
        }
        let present = present.min(layout.segments());
        let mut image = vec![0u64; layout.metadata_words() as usize];
        layout.write_initial_metadata_with(&mut image, present);
        let metadata: Vec<Word> = image.into_iter().map(Word::new).collect();
        let segments = layout.segments();
        // SAFETY: `data` holds `data_bytes` bytes aligned to 4 KiB and
        // `metadata` the initial image; both are owned by the `CpuHeap`,
        // which hands out the handle only as `&Heap` borrowed from itself
        // and frees them only when dropped (a `Vec`'s buffer does not move
        // when the `Vec` does).
        let heap = unsafe { layout.bind(data as u64, metadata.as_ptr() as u64) };
        Ok(CpuHeap {
            absent: Mutex::new((present..segments).collect()),
            heap,
            data,
            data_layout,
            metadata,
        })
    }

    /// The heap handle (its methods are `malloc` and `free`).
    pub fn heap(&self) -> &Heap {
        &self.heap
    }

    /// Bytes of data the heap manages.
    pub fn bytes(&self) -> u64 {
        self.heap.data_bytes()
    }

    /// Adds up to `count` absent segments (lowest ids first) while other
    /// threads may allocate; returns the ids added. On the CPU the memory is
    /// there from the start: this models the device heap's growth.
    pub fn grow(&self, count: u32) -> Vec<u32> {
        let mut absent = self.absent.lock().unwrap_or_else(|e| e.into_inner());
        let ids: Vec<u32> = absent.iter().copied().take(count as usize).collect();
        for &id in &ids {
            absent.remove(&id);
            let added = self.heap.add_segment(id);
            debug_assert!(added, "absent segment {id} was in use");
        }
        ids
    }

    /// Takes up to `max` wholly free segments out of use (highest first);
    /// returns their ids. Flush first so slots give back partly used blocks.
    pub fn trim(&self, max: u32) -> Vec<u32> {
        let mut absent = self.absent.lock().unwrap_or_else(|e| e.into_inner());
        let ids: Vec<u32> = (0..max)
            .map_while(|_| self.heap.withdraw_free_segment())
            .collect();
        absent.extend(&ids);
        ids
    }

    /// Segments usable now (present).
    pub fn present_segments(&self) -> u32 {
        let absent = self.absent.lock().unwrap_or_else(|e| e.into_inner());
        self.heap.segments() - absent.len() as u32
    }

    /// Empties the per-class slots so partly used blocks go back to their
    /// segments, and gives back segments formatted and never used (safe
    /// while other threads allocate).
    pub fn flush(&self) {
        self.heap.flush_slots();
    }

    /// What the heap holds. Exact when no thread is using it.
    pub fn stats(&self) -> HeapStats {
        let words: Vec<u64> = self
            .metadata
            .iter()
            .map(gpu_kernel::arch::load_relaxed)
            .collect();
        HeapStats::from_snapshot(&self.heap, &words)
    }
}

impl Drop for CpuHeap {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { dealloc(self.data, self.data_layout) };
    }
}
