//! `Heap`: the handle a kernel receives, and where each piece of metadata
//! lives. The host computes a [`HeapLayout`] with [`Heap::layout`], allocates
//! the data and metadata, writes the initial image (all zero but the segment
//! tree, which holds every segment), binds the addresses with the `unsafe`
//! [`HeapLayout::bind`], and passes the `Heap` by value to kernels (as a
//! [`HeapImage`]) or by pointer to `gallatin_malloc`.
//!
//! `malloc` and `free` are safe methods, so a `Heap` must never exist
//! without live memory behind it: its fields are private, it is neither
//! `Clone` nor `Copy`, and the only way to make one is `bind`, whose caller
//! promises that the memory outlives the handle. The owner on the host hands
//! out `&Heap` (tied to its own lifetime) and opaque images for launches.
//!
//! Metadata is one array of 64-bit words, in this order: statistics, slot
//! words, locks (one format lock per class, then the run lock and the run
//! cursor), run request slots ([`crate::request`]), spare
//! blocks, class stripes ([`crate::stripe`], each word on a line of its
//! own), segment states, block bitmaps, block counters, trees (the segment
//! tree, then one per class), and, on checked heaps, double-free bits.

use crate::block::CHECK_WORDS_PER_BLOCK;
use crate::class::{
    CLASSES, SLICE_CLASSES, bitmap_words_per_segment, is_segment_shift, segment_shift_for,
    slice_blocks_per_segment,
};
use crate::request::REQUEST_SLOTS;
use crate::slot::{MAX_SLOT_BLOCK, SLOT_STRIDE_WORDS, SLOTS_PER_CLASS, SPARES_PER_SLOT};
use crate::veb::TreeShape;

/// Flag: keep one bit per slice to detect double frees of slices.
pub const CHECK_DOUBLE_FREE: u32 = 1;
/// Flag: stop the kernel (panic on the host) on a wild or double free,
/// after counting it.
pub const TRAP_ON_MISUSE: u32 = 2;

/// Flag: slots keep no spare blocks (each install claims one block); a
/// tuning knob for measuring what spares buy.
pub const NO_SPARES: u32 = 4;

/// Statistics words.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Stat {
    /// `malloc` calls that returned null for a non-zero size.
    FailedMallocs = 0,
    /// `free` calls with a pointer the heap never handed out.
    InvalidFrees = 1,
    /// `free` calls on memory already freed (where detected).
    DoubleFrees = 2,
    /// Measuring builds only (`install_clock`): installs in the low 32
    /// bits, installs that popped no spare in the high 32.
    Installs = 3,
    /// Measuring builds only: SM cycles of installs, summed.
    InstallCycles = 4,
    /// Measuring builds only: team waits for an install.
    Waits = 5,
    /// Measuring builds only: SM cycles of those waits, summed.
    WaitCycles = 6,
}

/// Words reserved for statistics.
pub const STAT_WORDS: u64 = 8;

/// The last statistics word is no statistic: the number of reclaims in
/// flight (see `Heap::reclaim`).
pub(crate) const RECLAIMS_WORD: u64 = STAT_WORDS - 1;

/// The device heap handle: addresses and word offsets, nothing else.
#[repr(C)]
#[derive(Debug, PartialEq, Eq)]
pub struct Heap {
    /// Address of segment 0.
    pub(crate) data: u64,
    /// Address of metadata word 0.
    pub(crate) metadata: u64,
    /// Metadata words in all.
    pub(crate) metadata_words: u64,
    /// Number of segments.
    pub(crate) segments: u32,
    /// `CHECK_DOUBLE_FREE`, `TRAP_ON_MISUSE`, `NO_SPARES`.
    pub(crate) flags: u32,
    /// log2 of the segment size (`MIN_SEGMENT_SHIFT..=MAX_SEGMENT_SHIFT`),
    /// fixed when the heap is laid out.
    pub(crate) segment_shift: u32,
    /// Segments the size-dependent rules count (`Heap::budget_bytes`): slot
    /// and spare budgets (`team`) and the large-heap format rule (`heap`).
    /// `segments` on a fixed heap; on a heap that maps its memory as it
    /// grows (the host's VMM heap) the segments mapped when the handle was
    /// made ([`Heap::with_budget`]), so a heap that reserves 16 GiB and maps
    /// 4 GiB follows the rules of a 4 GiB heap. At most `segments`.
    ///
    /// Correctness never depends on it, so handles with different budgets
    /// may be used at once (a kernel launched before the heap grew keeps
    /// the smaller heap's rules until it ends). It only chooses among
    /// correct behaviours: how many of the `SLOTS_PER_CLASS` slots of a
    /// class a thread uses (every slot word exists whatever the budget, and
    /// `flush_slots` and `reclaim` visit all of them, so blocks left in a
    /// slot a smaller budget no longer uses still come back), how many
    /// spares an install parks (every spare word is popped by whoever looks,
    /// whatever its own budget), and whether a formatting installer takes
    /// the format lock (formatting claims a free segment from the segment
    /// tree either way; the lock only serialises). Addresses and bounds
    /// (`free`'s range check, ids in the trees) follow `segments`.
    pub(crate) budget_segments: u32,
    /// Word offset of the statistics.
    pub(crate) stats_at: u64,
    /// Word offset of the slot words.
    pub(crate) slots_at: u64,
    /// Word offset of the per-class format locks, followed by the run lock
    /// (word `locks_at + CLASSES`), the run cursor (the next word), the
    /// `REQUEST_SLOTS` run request slots (`Heap::request_words`), one
    /// out-of-tree window word per class (`Heap::out_of_tree_at`), then on
    /// a line of its own the whole-segment runs' word
    /// (`Heap::whole_segment_runs_at`).
    pub(crate) locks_at: u64,
    /// Word offset of the slots' spare blocks.
    pub(crate) spares_at: u64,
    /// Word offset of the segment states.
    pub(crate) states_at: u64,
    /// Word offset of the block bitmaps.
    pub(crate) bitmaps_at: u64,
    /// Word offset of the block counters.
    pub(crate) counters_at: u64,
    /// Word offset of the trees.
    pub(crate) trees_at: u64,
    /// Word offset of the double-free bits (checked heaps).
    pub(crate) slice_bits_at: u64,
    /// Shape shared by every tree.
    pub(crate) tree: TreeShape,
}

/// A copy of a [`Heap`] handle with another budget ([`Heap::with_budget`]):
/// use it as the `Heap` it dereferences to, or launch with its image. It
/// borrows the handle it copies, so it lives no longer than its memory.
#[derive(Debug)]
pub struct BudgetedHeap<'a> {
    heap: Heap,
    _original: core::marker::PhantomData<&'a Heap>,
}

impl core::ops::Deref for BudgetedHeap<'_> {
    type Target = Heap;

    fn deref(&self) -> &Heap {
        &self.heap
    }
}

/// Words of a [`HeapImage`].
const IMAGE_WORDS: usize = core::mem::size_of::<Heap>() / 8;
const _: () = assert!(core::mem::size_of::<Heap>() == IMAGE_WORDS * 8);
const _: () = assert!(core::mem::align_of::<Heap>() == 8);

/// The bytes of a bound [`Heap`] as a kernel parameter: what a kernel taking
/// `heap: Heap` by value receives. Opaque: safe code cannot turn it back
/// into a `Heap`.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapImage([u64; IMAGE_WORDS]);

/// A heap's layout before memory is bound to it: geometry and word offsets,
/// addresses zero. It has no `malloc`; [`HeapLayout::bind`] makes the handle.
#[derive(Debug, PartialEq, Eq)]
pub struct HeapLayout(Heap);

impl Clone for HeapLayout {
    fn clone(&self) -> HeapLayout {
        HeapLayout(self.0.duplicate())
    }
}

impl HeapLayout {
    /// Binds the data and metadata addresses: the heap handle.
    ///
    /// # Safety
    /// - `data` is the address of `self.data_bytes()` bytes aligned to 4 KiB,
    ///   and `metadata` that of `self.metadata_words()` 8-byte words holding
    ///   the image [`HeapLayout::write_initial_metadata`] wrote (or a state a
    ///   heap of this layout left), both readable and writable by every
    ///   thread that uses the handle;
    /// - both stay allocated and are used by nothing else for as long as the
    ///   returned `Heap`, or any kernel launched with its image, is in use.
    pub unsafe fn bind(self, data: u64, metadata: u64) -> Heap {
        Heap {
            data,
            metadata,
            ..self.0
        }
    }

    /// Bytes of data (whole segments).
    pub fn data_bytes(&self) -> u64 {
        self.0.data_bytes()
    }

    /// Metadata words in all.
    pub fn metadata_words(&self) -> u64 {
        self.0.metadata_words
    }

    /// Bytes of metadata.
    pub fn metadata_bytes(&self) -> u64 {
        self.0.metadata_bytes()
    }

    /// Number of segments.
    pub fn segments(&self) -> u32 {
        self.0.segments
    }

    /// log2 of the segment size.
    pub fn segment_shift(&self) -> u32 {
        self.0.segment_shift
    }

    /// See [`Heap::write_initial_metadata`].
    pub fn write_initial_metadata(&self, words: &mut [u64]) {
        self.0.write_initial_metadata(words);
    }

    /// See [`Heap::write_initial_metadata_with`].
    pub fn write_initial_metadata_with(&self, words: &mut [u64], present: u32) {
        self.0.write_initial_metadata_with(words, present);
    }
}

/// Why a heap cannot be laid out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LayoutError {
    /// Fewer bytes than one segment.
    TooSmall,
    /// More segments than slot words can name.
    TooLarge,
    /// A segment shift outside `MIN_SEGMENT_SHIFT..=MAX_SEGMENT_SHIFT`.
    BadSegmentShift,
}

impl Heap {
    /// The most segments one heap of `1 << segment_shift`-byte segments can
    /// have (slot words name 2^24 slice blocks: 1 TiB whatever the shift).
    pub const fn max_segments(segment_shift: u32) -> u64 {
        (MAX_SLOT_BLOCK + 1) / slice_blocks_per_segment(segment_shift) as u64
    }

    /// The layout of a heap of `segments` segments of `1 << segment_shift`
    /// bytes (addresses left zero).
    pub fn layout(
        segments: u64,
        segment_shift: u32,
        flags: u32,
    ) -> Result<HeapLayout, LayoutError> {
        if !is_segment_shift(segment_shift) {
            return Err(LayoutError::BadSegmentShift);
        }
        if segments == 0 {
            return Err(LayoutError::TooSmall);
        }
        if segments > Heap::max_segments(segment_shift) {
            return Err(LayoutError::TooLarge);
        }
        let slice_blocks = slice_blocks_per_segment(segment_shift) as u64;
        let tree = TreeShape::new(segments as u32);
        let stats_at = 0;
        let slots_at = stats_at + STAT_WORDS;
        let locks_at = slots_at + (SLICE_CLASSES * SLOTS_PER_CLASS * SLOT_STRIDE_WORDS) as u64;
        let out_of_tree_end = locks_at + CLASSES as u64 + 2 + REQUEST_SLOTS as u64 + CLASSES as u64;
        // The whole-segment runs' word on a 128-byte line of its own.
        let spares_at = out_of_tree_end.next_multiple_of(LINE_WORDS) + LINE_WORDS;
        let spares_end = spares_at + (SLICE_CLASSES * SLOTS_PER_CLASS * SPARES_PER_SLOT) as u64;
        // The class stripes end where the segment states begin
        // (`Heap::stripe_at` counts back from `states_at`).
        let states_at = spares_end.next_multiple_of(LINE_WORDS) + STRIPE_REGION_WORDS;
        let bitmaps_at = states_at + segments;
        let counters_at = bitmaps_at + segments * bitmap_words_per_segment(segment_shift) as u64;
        let trees_at = counters_at + segments * slice_blocks;
        let slice_bits_at = trees_at + (1 + CLASSES as u64) * tree.words as u64;
        let slice_bits = if flags & CHECK_DOUBLE_FREE != 0 {
            segments * slice_blocks * CHECK_WORDS_PER_BLOCK as u64
        } else {
            0
        };
        Ok(HeapLayout(Heap {
            data: 0,
            metadata: 0,
            metadata_words: slice_bits_at + slice_bits,
            segments: segments as u32,
            flags,
            segment_shift,
            budget_segments: segments as u32,
            stats_at,
            slots_at,
            locks_at,
            spares_at,
            states_at,
            bitmaps_at,
            counters_at,
            trees_at,
            slice_bits_at,
            tree,
        }))
    }

    /// A field-by-field copy, for the crate's own use (a layout's clone).
    #[inline(always)]
    fn duplicate(&self) -> Heap {
        Heap {
            tree: self.tree,
            ..*self
        }
    }

    /// A copy of this handle for a call out of line (crate-private, so no
    /// `Heap` escapes to safe code). Why it exists: a kernel receives its
    /// `Heap` by value in the parameter space; passing `&self` of that
    /// parameter to a function that is not inlined takes its address, and
    /// the compiler then copies the whole handle (160 bytes) to local
    /// memory at kernel entry, in every thread, whether the call happens
    /// or not. Out-of-line paths get `&` of this copy instead (a statement
    /// temporary), so the copy is made only where the call is. `black_box`
    /// keeps the copy there: without it LLVM passes the parameter's own
    /// address again (the callee only reads it), and the entry copy is back.
    /// Out-of-line helpers that need only a few words (check bits, a
    /// statistic) take those instead and need no copy at all.
    #[inline(always)]
    pub(crate) fn by_value(&self) -> Heap {
        core::hint::black_box(self.duplicate())
    }

    /// The handle's bytes as a kernel parameter.
    pub fn image(&self) -> HeapImage {
        // SAFETY: `Heap` is `repr(C)`, 8-byte aligned, made of integers with
        // no padding (the asserts above check its size), so its bytes are
        // `IMAGE_WORDS` initialised words.
        HeapImage(unsafe { core::ptr::read(self as *const Heap as *const [u64; IMAGE_WORDS]) })
    }

    /// Address of segment 0.
    pub fn data(&self) -> u64 {
        self.data
    }

    /// Address of metadata word 0.
    pub fn metadata(&self) -> u64 {
        self.metadata
    }

    /// Metadata words in all.
    pub fn metadata_words(&self) -> u64 {
        self.metadata_words
    }

    /// Number of segments.
    pub fn segments(&self) -> u32 {
        self.segments
    }

    /// The kernel-side flags (`CHECK_DOUBLE_FREE`, `TRAP_ON_MISUSE`, `NO_SPARES`).
    pub fn flags(&self) -> u32 {
        self.flags
    }

    /// log2 of the segment size, fixed when the heap was laid out.
    #[inline(always)]
    pub fn segment_shift(&self) -> u32 {
        self.segment_shift
    }

    /// Bytes in a segment.
    #[inline(always)]
    pub fn segment_bytes(&self) -> u64 {
        1 << self.segment_shift
    }

    /// Bytes this heap hands out for a request of `size` bytes (its
    /// class's unit, or whole segments; 0 for size 0).
    pub fn granted_bytes(&self, size: u64) -> u64 {
        crate::class::Request::for_size(size, self.segment_shift).granted_bytes(self.segment_shift)
    }

    /// The layout of the largest heap whose data fits in `bytes`, with
    /// segments of `1 << segment_shift` bytes, or (`None`) of the size
    /// [`segment_shift_for`] chooses for `bytes`.
    pub fn layout_for_bytes(
        bytes: u64,
        segment_shift: Option<u32>,
        flags: u32,
    ) -> Result<HeapLayout, LayoutError> {
        let shift = segment_shift.unwrap_or(segment_shift_for(bytes));
        if !is_segment_shift(shift) {
            return Err(LayoutError::BadSegmentShift);
        }
        Heap::layout(bytes >> shift, shift, flags)
    }

    /// Word offset of spare `i` of `slot` of slice class `class`.
    #[inline(always)]
    pub fn spare_index(&self, class: u32, slot: u32, i: u32) -> u64 {
        self.spares_at + ((class * SLOTS_PER_CLASS + slot) * SPARES_PER_SLOT + i) as u64
    }

    /// Word offset (from `counters_at`) of the counter of slice block
    /// `block` of `segment`. Counters are stored block-major: the counters of
    /// one segment's blocks lie `segments` words apart, so a segment whose
    /// blocks are all being freed at once (the 16 B class of a whole kernel)
    /// does not put every atomic on the same few cache lines.
    #[inline(always)]
    pub fn counter_index(&self, segment: u32, block: u32) -> u64 {
        block as u64 * self.segments as u64 + segment as u64
    }

    /// Bytes of data (whole segments).
    pub fn data_bytes(&self) -> u64 {
        (self.segments as u64) << self.segment_shift
    }

    /// Segments the size-dependent rules count (see the field's docs):
    /// [`Heap::segments`] unless the handle came from [`Heap::with_budget`].
    pub fn budget_segments(&self) -> u32 {
        self.budget_segments
    }

    /// Bytes the size-dependent rules count: the budget's segments. Read
    /// where `data_bytes` was before budgets (the fast path of `malloc`
    /// reads this field instead of `segments`: one handle field either way).
    #[inline(always)]
    pub(crate) fn budget_bytes(&self) -> u64 {
        (self.budget_segments as u64) << self.segment_shift
    }

    /// A copy of this handle whose size-dependent rules count `segments`
    /// segments (at most [`Heap::segments`]): what a heap that maps its
    /// memory as it grows hands to threads and launches, with the segments
    /// it has mapped. Safe: the copy has the same addresses and borrows
    /// this handle, so it cannot outlive the memory behind it, and no
    /// budget makes `malloc` or `free` incorrect (see the field's docs).
    pub fn with_budget(&self, segments: u32) -> BudgetedHeap<'_> {
        BudgetedHeap {
            heap: Heap {
                budget_segments: segments.min(self.segments),
                ..self.duplicate()
            },
            _original: core::marker::PhantomData,
        }
    }

    /// Bytes of metadata.
    pub fn metadata_bytes(&self) -> u64 {
        self.metadata_words * 8
    }

    /// Writes the initial metadata image into `words` (which must be zero):
    /// every segment free, in the segment tree.
    pub fn write_initial_metadata(&self, words: &mut [u64]) {
        self.write_initial_metadata_with(words, self.segments);
    }

    /// Like [`Heap::write_initial_metadata`], with only the first `present`
    /// segments in the segment tree: the rest are absent until
    /// [`Heap::add_segment`] publishes them (a heap that grows). The run
    /// cursor starts at the top of the present segments, so optimistic run
    /// claims start where runs can be (`run`); on a whole heap it is 0, as
    /// before.
    pub fn write_initial_metadata_with(&self, words: &mut [u64], present: u32) {
        let at = self.trees_at as usize;
        self.tree
            .prefix_image(present, &mut words[at..at + self.tree.words as usize]);
        words[self.run_cursor_at() as usize] = (self.segments - present.min(self.segments)) as u64;
    }

    /// The metadata word of slot `slot` of slice class `class_index`
    /// (`SLOT_STRIDE_WORDS` apart).
    #[inline(always)]
    pub(crate) fn slot_at(&self, class_index: u32, slot: u32) -> u64 {
        self.slots_at + ((class_index * SLOTS_PER_CLASS + slot) * SLOT_STRIDE_WORDS) as u64
    }

    /// The metadata word of the run cursor (after the run lock).
    pub(crate) fn run_cursor_at(&self) -> u64 {
        self.locks_at + CLASSES as u64 + 1
    }

    /// The metadata words (from word 0) of the run request slots, after
    /// the run cursor ([`crate::request`]): what the host's growth service
    /// reads to find posted requests.
    pub fn request_words(&self) -> core::ops::Range<u64> {
        let at = self.run_cursor_at() + 1;
        at..at + REQUEST_SLOTS as u64
    }

    /// The metadata word of class `class_index`'s out-of-tree windows
    /// (after the request slots): see `Heap::drop_from_class_tree`.
    pub(crate) fn out_of_tree_at(&self, class_index: u32) -> u64 {
        self.request_words().end + class_index as u64
    }

    /// The metadata word of slice class `class_index`'s stripe
    /// ([`crate::stripe`]), the first of a 128-byte line of its own (the
    /// next word is its lowering request), in the region that ends where
    /// the segment states begin.
    pub(crate) fn stripe_at(&self, class_index: u32) -> u64 {
        self.states_at - STRIPE_REGION_WORDS + class_index as u64 * LINE_WORDS
    }

    /// The metadata word (the first of the 128-byte line after the
    /// out-of-tree words, alone on it) that says whether a class whose
    /// block fills a segment has claimed segments for a slot:
    /// `Heap::whole_segment_runs_taken`.
    pub(crate) fn whole_segment_runs_at(&self) -> u64 {
        self.out_of_tree_at(CLASSES).next_multiple_of(LINE_WORDS)
    }
}

/// Metadata words on one 128-byte L2 cache line.
const LINE_WORDS: u64 = 16;

/// Words of the class stripes: a line per slice class.
const STRIPE_REGION_WORDS: u64 = SLICE_CLASSES as u64 * LINE_WORDS;

/// Unit-test support shared by the crate's modules.
#[cfg(all(test, not(loom)))]
pub(crate) mod test_support {
    extern crate std;
    use std::vec::Vec;

    use super::Heap;
    use crate::arch::Word;
    use crate::class::MIN_SEGMENT_SHIFT;

    /// A heap of `segments` 2 MiB segments whose first `present` are in
    /// the segment tree, on host words: the data address is fake (never
    /// touched by the tests that use it), the metadata is the returned
    /// words (a `Vec`'s buffer does not move while it lives).
    pub(crate) fn test_heap(segments: u64, present: u32) -> (Heap, Vec<Word>) {
        test_heap_of(segments, present, MIN_SEGMENT_SHIFT)
    }

    /// [`test_heap`] with segments of `1 << shift` bytes.
    pub(crate) fn test_heap_of(segments: u64, present: u32, shift: u32) -> (Heap, Vec<Word>) {
        let layout =
            Heap::layout_for_bytes(segments << shift, Some(shift), 0).expect("a test heap");
        let mut image = std::vec![0u64; layout.metadata_words() as usize];
        layout.write_initial_metadata_with(&mut image, present);
        let words: Vec<Word> = image.into_iter().map(Word::new).collect();
        // SAFETY: `words` holds the initial image and is returned with the
        // handle; no data byte is read or written by the tests using it.
        let heap = unsafe { layout.bind(1 << 40, words.as_ptr() as u64) };
        (heap, words)
    }
}
