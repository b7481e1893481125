//! Size classes: which class serves a request, and the geometry of each.
//!
//! - Classes `0..SLICE_CLASSES` are *slice classes*: slices of 16 B … 4 KiB;
//!   a block holds [`SLICES_PER_BLOCK`] slices, or as many as fit in one
//!   segment if fewer (4 KiB slices: 512 per 2 MiB block), so a block is
//!   64 KiB … one segment.
//! - The following classes are *block classes*: one allocation is one whole
//!   block of 8 KiB … one segment, for requests above 4 KiB.
//! - Requests above a segment take several contiguous segments.
//!
//! A segment is formatted for one class at a time and holds
//! `SEGMENT_BYTES >> block_shift` blocks of it.

/// log2 of the segment size. Set `GPUMALLOC_SEGMENT_SHIFT` at compile time to
/// change it (21 = 2 MiB, the default; 16..=28 are accepted). Small segments
/// keep a small heap usable by every class at once: each class strands at
/// most part of one segment (see `docs/device-heap-reclaim.md`); 2 MiB is
/// also the VMM granularity a growing heap maps in.
pub const SEGMENT_SHIFT: u32 = build_knob(option_env!("GPUMALLOC_SEGMENT_SHIFT"), 21);
/// Bytes in a segment.
pub const SEGMENT_BYTES: u64 = 1 << SEGMENT_SHIFT;
/// log2 of the most slices in a block.
pub const SLICES_PER_BLOCK_SHIFT: u32 = 12;
/// The most slices in a block (classes whose 4096 slices would not fit in a
/// segment have fewer: [`SizeClass::slices_per_block`]).
pub const SLICES_PER_BLOCK: u64 = 1 << SLICES_PER_BLOCK_SHIFT;
/// log2 of the smallest slice (16 B).
pub const MIN_SLICE_SHIFT: u32 = 4;
/// log2 of the largest slice (4 KiB).
pub const MAX_SLICE_SHIFT: u32 = 12;
/// Number of slice classes (16 B … 4 KiB).
pub const SLICE_CLASSES: u32 = MAX_SLICE_SHIFT - MIN_SLICE_SHIFT + 1;
/// log2 of the smallest block class (8 KiB).
pub const MIN_BLOCK_CLASS_SHIFT: u32 = MAX_SLICE_SHIFT + 1;
/// Number of block classes (8 KiB … one segment).
pub const BLOCK_CLASSES: u32 = SEGMENT_SHIFT - MIN_BLOCK_CLASS_SHIFT + 1;
/// Number of classes of both kinds.
pub const CLASSES: u32 = SLICE_CLASSES + BLOCK_CLASSES;
/// The most blocks a segment can hold (the smallest block class).
pub const MAX_BLOCKS_PER_SEGMENT: u32 = 1 << (SEGMENT_SHIFT - MIN_BLOCK_CLASS_SHIFT);
/// Words of a segment's free-block bitmap.
pub const BITMAP_WORDS_PER_SEGMENT: u32 = MAX_BLOCKS_PER_SEGMENT / 64;
/// The most blocks of a slice class a segment can hold (16 B slices).
pub const SLICE_BLOCKS_PER_SEGMENT: u32 =
    1 << (SEGMENT_SHIFT - MIN_SLICE_SHIFT - SLICES_PER_BLOCK_SHIFT);

const _: () = assert!(SEGMENT_SHIFT >= MIN_SLICE_SHIFT + SLICES_PER_BLOCK_SHIFT);
const _: () = assert!(SEGMENT_SHIFT <= 28);

/// A build-time setting (`GPUMALLOC_SEGMENT_SHIFT`, `GPUMALLOC_SLOTS`,
/// `GPUMALLOC_SLOT_BUDGET_SHIFT`, `GPUMALLOC_SEGMENT_SPARE_BUDGET_SHIFT`):
/// the decimal number in `text`, else
/// `default`. The root `build.rs` reruns the PTX build when one changes.
pub(crate) const fn build_knob(text: Option<&str>, default: u32) -> u32 {
    let Some(text) = text else { return default };
    let bytes = text.as_bytes();
    let mut value = 0u32;
    let mut i = 0;
    while i < bytes.len() {
        assert!(
            bytes[i].is_ascii_digit(),
            "GPUMALLOC_* build settings must be decimal numbers"
        );
        value = value * 10 + (bytes[i] - b'0') as u32;
        i += 1;
    }
    value
}

/// What a request of some size needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Request {
    /// Size zero: answered with null.
    Empty,
    /// One slice or one block of this class.
    Class(SizeClass),
    /// This many contiguous segments.
    Segments(u64),
}

impl Request {
    /// The request for `size` bytes.
    #[inline(always)]
    pub fn for_size(size: u64) -> Request {
        if size == 0 {
            Request::Empty
        } else if size <= SEGMENT_BYTES {
            let shift = ceil_log2(size).max(MIN_SLICE_SHIFT);
            Request::Class(SizeClass::from_unit_shift(shift))
        } else {
            Request::Segments(size.div_ceil(SEGMENT_BYTES))
        }
    }

    /// Bytes the heap hands out for this request (its class's unit, or
    /// whole segments; 0 for an empty request).
    pub fn granted_bytes(self) -> u64 {
        match self {
            Request::Empty => 0,
            Request::Class(c) => 1 << c.unit_shift(),
            Request::Segments(n) => n * SEGMENT_BYTES,
        }
    }
}

/// ceil(log2(x)) for x ≥ 1.
#[inline(always)]
pub fn ceil_log2(x: u64) -> u32 {
    64 - (x - 1).leading_zeros()
}

/// One class: a slice size or a block size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SizeClass(u32);

impl SizeClass {
    /// The class with this index, if it exists.
    #[inline(always)]
    pub fn new(index: u32) -> Option<SizeClass> {
        (index < CLASSES).then_some(SizeClass(index))
    }

    /// The class whose unit (slice or block) is `1 << shift` bytes.
    #[inline(always)]
    fn from_unit_shift(shift: u32) -> SizeClass {
        SizeClass(shift - MIN_SLICE_SHIFT)
    }

    /// Index in `0..CLASSES`.
    #[inline(always)]
    pub fn index(self) -> u32 {
        self.0
    }

    /// Whether this class hands out slices of blocks (else whole blocks).
    #[inline(always)]
    pub fn is_slice(self) -> bool {
        self.0 < SLICE_CLASSES
    }

    /// log2 of the bytes one allocation of this class gets.
    #[inline(always)]
    pub fn unit_shift(self) -> u32 {
        self.0 + MIN_SLICE_SHIFT
    }

    /// log2 of the slices in a block of this slice class: 4096, or as many
    /// as fill one segment.
    #[inline(always)]
    pub fn slices_shift(self) -> u32 {
        let fit = SEGMENT_SHIFT - self.unit_shift();
        if fit < SLICES_PER_BLOCK_SHIFT {
            fit
        } else {
            SLICES_PER_BLOCK_SHIFT
        }
    }

    /// Slices in a block of this slice class.
    #[inline(always)]
    pub fn slices_per_block(self) -> u32 {
        1 << self.slices_shift()
    }

    /// log2 of this class's block size.
    #[inline(always)]
    pub fn block_shift(self) -> u32 {
        if self.is_slice() {
            self.unit_shift() + self.slices_shift()
        } else {
            self.unit_shift()
        }
    }

    /// Blocks of this class in one segment.
    #[inline(always)]
    pub fn blocks_per_segment(self) -> u32 {
        1 << (SEGMENT_SHIFT - self.block_shift())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boundaries() {
        assert_eq!(Request::for_size(0), Request::Empty);
        let class = |s| match Request::for_size(s) {
            Request::Class(c) => c,
            r => panic!("{s}: {r:?}"),
        };
        assert_eq!(class(1).unit_shift(), 4);
        assert_eq!(class(16).unit_shift(), 4);
        assert_eq!(class(17).unit_shift(), 5);
        assert_eq!(class(4096).unit_shift(), 12);
        assert!(class(4096).is_slice());
        assert_eq!(class(4097).unit_shift(), 13);
        assert!(!class(4097).is_slice());
        assert_eq!(class(SEGMENT_BYTES).index(), CLASSES - 1);
        assert_eq!(class(SEGMENT_BYTES).blocks_per_segment(), 1);
        assert_eq!(Request::for_size(SEGMENT_BYTES + 1), Request::Segments(2));
        assert_eq!(class(16).blocks_per_segment(), SLICE_BLOCKS_PER_SEGMENT);
        assert_eq!(class(4096).blocks_per_segment(), 1);
        assert_eq!(class(8192).blocks_per_segment(), MAX_BLOCKS_PER_SEGMENT);
    }
}
