//! Size classes: which class serves a request, and the geometry of each.
//!
//! - Classes `0..SLICE_CLASSES` are *slice classes*: slices of 16 B … 128 KiB
//!   ([`MAX_SLICE_SHIFT`]); a block holds [`SLICES_PER_BLOCK`] slices in the
//!   wide classes (16 B … 128 B, [`WIDE_BLOCK_MAX_UNIT_SHIFT`]) and 4096 in
//!   the others, or as many as fit in one segment if fewer (128 KiB slices:
//!   16 per 2 MiB segment, 128 per 16 MiB), so a block is 128 KiB … one
//!   segment.
//! - The following classes are *block classes*: one allocation is one whole
//!   block of 256 KiB … one segment, for requests above 128 KiB.
//! - Requests above a segment take several contiguous segments.
//!
//! A segment is formatted for one class at a time and holds
//! `segment bytes >> block_shift` blocks of it.
//!
//! The segment size is a property of each heap, fixed when it is laid out
//! (2 MiB … 16 MiB, [`segment_shift_for`]), so every function here whose
//! answer depends on it takes the heap's `segment_shift`.

/// The smallest segment a heap may use: 2 MiB (log2 21), the VMM
/// granularity a growing heap maps in.
pub const MIN_SEGMENT_SHIFT: u32 = 21;
/// The largest segment a heap may use: 16 MiB (log2 24). A block-class
/// segment then holds at most 64 blocks (2048 when the smallest block
/// class was 8 KiB), whose misuse states fit in the check words of one
/// slice block (`block::CHECK_WORDS_PER_BLOCK`).
pub const MAX_SEGMENT_SHIFT: u32 = 24;
/// Segments a heap should have at least: the automatic segment size
/// ([`segment_shift_for`]) is the largest in
/// `MIN_SEGMENT_SHIFT..=MAX_SEGMENT_SHIFT` that still cuts the heap into
/// this many. Each class strands at most part of one segment, and about 20
/// classes can be in use at once, so 2048 segments keep what classes strand
/// near 1% of the heap: heaps below 8 GiB (256 MiB, the 1 GiB and 6.5 GiB
/// test heaps) get 2 MiB segments, 8 GiB up to 16 GiB (the 8.4 GiB
/// demand + 3% heap) 4 MiB, 16 GiB up to 32 GiB (the bench's 16 GiB heaps)
/// 8 MiB, 32 GiB and more 16 MiB. Fewer, larger segments make the
/// 512 B … 4 KiB classes claim segments less often; 1024 (the rule before)
/// gave the demand + 3% heap 8 MiB segments and 96.9–97.2% of its demand
/// on the H100, 2048 98.7% at about the same speed (`docs/PERF.md`).
/// `GPUMALLOC_AUTO_MIN_SEGMENTS` sets it at build time (for builds that
/// compare rules).
pub const AUTO_MIN_SEGMENTS: u64 =
    build_knob(option_env!("GPUMALLOC_AUTO_MIN_SEGMENTS"), 2048) as u64;
/// A build-time segment shift every heap uses unless its configuration
/// names one: `GPUMALLOC_SEGMENT_SHIFT` (21..=24), for builds that compare
/// geometries. 0 (unset): chosen per heap from its size.
pub const BUILD_SEGMENT_SHIFT: u32 = build_knob(option_env!("GPUMALLOC_SEGMENT_SHIFT"), 0);
const _: () = assert!(
    BUILD_SEGMENT_SHIFT == 0 || is_segment_shift(BUILD_SEGMENT_SHIFT),
    "GPUMALLOC_SEGMENT_SHIFT must be 21..=24"
);

/// Whether a heap may have segments of `1 << shift` bytes
/// (`MIN_SEGMENT_SHIFT..=MAX_SEGMENT_SHIFT`).
pub const fn is_segment_shift(shift: u32) -> bool {
    shift >= MIN_SEGMENT_SHIFT && shift <= MAX_SEGMENT_SHIFT
}

/// The segment shift of a heap of `bytes` whose configuration names none:
/// the build's `GPUMALLOC_SEGMENT_SHIFT` if set, else the largest shift in
/// `MIN_SEGMENT_SHIFT..=MAX_SEGMENT_SHIFT` that gives at least
/// [`AUTO_MIN_SEGMENTS`] segments (the smallest if none does).
pub const fn segment_shift_for(bytes: u64) -> u32 {
    if BUILD_SEGMENT_SHIFT != 0 {
        return BUILD_SEGMENT_SHIFT;
    }
    let mut shift = MAX_SEGMENT_SHIFT;
    while shift > MIN_SEGMENT_SHIFT && bytes >> shift < AUTO_MIN_SEGMENTS {
        shift -= 1;
    }
    shift
}

/// log2 of the most slices in a block: what the metadata is laid out for
/// (global block ids, check words). 13 (8,192 slices) unless
/// `GPUMALLOC_SLICES_PER_BLOCK_SHIFT` (12 to 15) is set at build time.
/// Only the *wide* classes ([`WIDE_BLOCK_MAX_UNIT_SHIFT`]) use all of it;
/// the others keep [`STANDARD_SLICES_SHIFT`] (`docs/PERF.md`, "Larger
/// slice blocks"; 12 with every class wide and three spares each is the
/// geometry before 2026-11-24, `scripts/stage-variants.sh narrow`).
pub const SLICES_PER_BLOCK_SHIFT: u32 =
    build_knob(option_env!("GPUMALLOC_SLICES_PER_BLOCK_SHIFT"), 13);
const _: () = assert!(
    SLICES_PER_BLOCK_SHIFT >= 12 && SLICES_PER_BLOCK_SHIFT <= 15,
    "GPUMALLOC_SLICES_PER_BLOCK_SHIFT must be 12..=15"
);
/// log2 of the slices in a block of a class that is not wide: 4096.
pub const STANDARD_SLICES_SHIFT: u32 = 12;
/// Slice classes of at most 2^this bytes (16 B … 128 B) are *wide*: their
/// blocks hold [`SLICES_PER_BLOCK`] slices (or a segment's worth), and
/// their slots keep `slot::WIDE_SPARES_PER_SLOT` spares (one). A slot's
/// installs run one after another, so a class's time grows with the
/// installs per slot; a wider block makes half as many. On the H100 this
/// made 2^20 allocations of 16 B 24% faster, 32 B 8%, 64 B 14%, 128 B 16%,
/// with the spans `bench frag` measures unchanged; wider blocks for larger
/// classes were faster too but widened their spans, and with three spares
/// the 16 B span grew to 1.6 (`docs/PERF.md`, "Wide blocks for the
/// smallest classes only"). `GPUMALLOC_WIDE_BLOCK_MAX_UNIT_SHIFT` sets it
/// at build time; [`MAX_SLICE_SHIFT`] makes every class wide.
pub const WIDE_BLOCK_MAX_UNIT_SHIFT: u32 =
    build_knob(option_env!("GPUMALLOC_WIDE_BLOCK_MAX_UNIT_SHIFT"), 7);
/// The most slices in a block (the wide classes'; the others have 4096,
/// and classes whose blocks would not fit in a segment fewer:
/// [`SizeClass::slices_per_block`]).
pub const SLICES_PER_BLOCK: u64 = 1 << SLICES_PER_BLOCK_SHIFT;
/// log2 of the smallest slice (16 B).
pub const MIN_SLICE_SHIFT: u32 = 4;
/// log2 of the largest slice (128 KiB). 8 KiB was the smallest block class
/// until 2026-11-23: a burst of 2^20 requests then made every warp's claim
/// contend for one segment's state word and took 31.5 ms on the H100; as
/// slices through the slots it takes 0.33 ms (`docs/PERF.md`, "8 KiB
/// becomes a slice class"). 16 KiB followed the same day (a burst of 2^19:
/// 1.70 → 0.32 ms, "16 KiB becomes a slice class"), and 32 KiB on
/// 2026-11-24 (a burst of 2^18: 0.307 → 0.155 ms kernel alone, "32 KiB
/// becomes a slice class"); the smallest block class, 64 KiB, then left
/// a 2 MiB segment 32 blocks, part of one bitmap word. 64 and 128 KiB
/// followed on 2026-11-25 (kernel alone, 2^17 × 64 KiB 0.249 → 0.163 ms,
/// 2^16 × 128 KiB 0.201 → 0.165 ms; "64 and 128 KiB as slice classes?"),
/// so the smallest block class, 256 KiB, leaves a 2 MiB segment 8 blocks.
/// `GPUMALLOC_MAX_SLICE_SHIFT` 14, 15 or 16 builds a geometry before.
pub const MAX_SLICE_SHIFT: u32 = build_knob(option_env!("GPUMALLOC_MAX_SLICE_SHIFT"), 17);
const _: () = assert!(
    MAX_SLICE_SHIFT >= 14 && MAX_SLICE_SHIFT <= 17,
    "GPUMALLOC_MAX_SLICE_SHIFT must be 14..=17"
);
const _: () = assert!(STANDARD_SLICES_SHIFT <= SLICES_PER_BLOCK_SHIFT);
/// Number of slice classes (16 B … 128 KiB).
pub const SLICE_CLASSES: u32 = MAX_SLICE_SHIFT - MIN_SLICE_SHIFT + 1;
/// log2 of the smallest block class (256 KiB).
pub const MIN_BLOCK_CLASS_SHIFT: u32 = MAX_SLICE_SHIFT + 1;
/// Number of block classes on a heap of the largest segments (256 KiB …
/// 16 MiB); a heap uses those up to its own segment size.
pub const BLOCK_CLASSES: u32 = MAX_SEGMENT_SHIFT - MIN_BLOCK_CLASS_SHIFT + 1;
/// Number of classes of both kinds on a heap of the largest segments: what
/// the metadata (format locks, class trees, statistics) is laid out for.
pub const CLASSES: u32 = SLICE_CLASSES + BLOCK_CLASSES;

/// Classes a heap of `1 << segment_shift`-byte segments uses.
#[inline(always)]
pub const fn classes(segment_shift: u32) -> u32 {
    segment_shift - MIN_SLICE_SHIFT + 1
}

/// The most blocks a segment can hold, of any class: the smallest block
/// class's or the smallest slice class's, whichever has the smaller
/// block. Since 64 and 128 KiB became slice classes (the smallest block
/// class 256 KiB) the 16 B class's blocks of 128 KiB are the smaller: 128
/// to a 16 MiB segment, where the smallest block class has 64.
#[inline(always)]
pub const fn max_blocks_per_segment(segment_shift: u32) -> u32 {
    let smallest_block = if MIN_BLOCK_CLASS_SHIFT < MIN_SLICE_BLOCK_SHIFT {
        MIN_BLOCK_CLASS_SHIFT
    } else {
        MIN_SLICE_BLOCK_SHIFT
    };
    1 << (segment_shift - smallest_block)
}

/// log2 of the 16 B class's block (before a segment's size caps it):
/// [`SLICES_PER_BLOCK`] slices, the most of any slice class (the 16 B class
/// is wide, or every class holds the standard count: checked below).
pub(crate) const MIN_SLICE_BLOCK_SHIFT: u32 = MIN_SLICE_SHIFT + SLICES_PER_BLOCK_SHIFT;

/// Words of a segment's free-block bitmap, for the class with the most
/// blocks to a segment (one, partly used, where that is fewer than 64).
#[inline(always)]
pub const fn bitmap_words_per_segment(segment_shift: u32) -> u32 {
    max_blocks_per_segment(segment_shift).div_ceil(64)
}

/// The most blocks of a slice class a segment can hold (16 B slices).
#[inline(always)]
pub const fn slice_blocks_per_segment(segment_shift: u32) -> u32 {
    1 << (segment_shift - MIN_SLICE_BLOCK_SHIFT)
}

const _: () = assert!(MIN_SEGMENT_SHIFT >= MIN_SLICE_BLOCK_SHIFT);
const _: () = assert!(
    WIDE_BLOCK_MAX_UNIT_SHIFT >= MIN_SLICE_SHIFT || SLICES_PER_BLOCK_SHIFT == STANDARD_SLICES_SHIFT,
    "the 16 B class must hold SLICES_PER_BLOCK slices a block (global block ids count them)"
);
const _: () = assert!(MIN_SEGMENT_SHIFT >= MIN_BLOCK_CLASS_SHIFT + 3);

/// A build-time setting (`GPUMALLOC_SEGMENT_SHIFT`, `GPUMALLOC_SLOTS`,
/// `GPUMALLOC_SLOT_BUDGET_SHIFT`, `GPUMALLOC_SEGMENT_SPARE_BUDGET_SHIFT`,
/// `GPUMALLOC_UNLOCKED_FORMAT_SHIFT`, `GPUMALLOC_WHOLE_SLOT_BUDGET_SHIFT`,
/// `GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT`, `GPUMALLOC_LARGE_HEAP_SHIFT`,
/// `GPUMALLOC_LARGE_HEAP_SLOT_BUDGET_SHIFT`,
/// `GPUMALLOC_LARGE_HEAP_UNLOCKED_FORMAT_SHIFT`):
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
    /// The request for `size` bytes on a heap of `1 << segment_shift`-byte
    /// segments.
    #[inline(always)]
    pub fn for_size(size: u64, segment_shift: u32) -> Request {
        if size == 0 {
            Request::Empty
        } else if size <= 1 << segment_shift {
            let shift = ceil_log2(size).max(MIN_SLICE_SHIFT);
            Request::Class(SizeClass::from_unit_shift(shift))
        } else {
            Request::Segments(size.div_ceil(1 << segment_shift))
        }
    }

    /// Bytes the heap hands out for this request (its class's unit, or
    /// whole segments of `1 << segment_shift` bytes; 0 for an empty
    /// request).
    pub fn granted_bytes(self, segment_shift: u32) -> u64 {
        match self {
            Request::Empty => 0,
            Request::Class(c) => 1 << c.unit_shift(),
            Request::Segments(n) => n << segment_shift,
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

    /// Whether this slice class has wide blocks ([`WIDE_BLOCK_MAX_UNIT_SHIFT`]).
    #[inline(always)]
    pub fn is_wide(self) -> bool {
        self.unit_shift() <= WIDE_BLOCK_MAX_UNIT_SHIFT
    }

    /// log2 of the slices in a block of this slice class:
    /// [`SLICES_PER_BLOCK_SHIFT`] for a wide class, else
    /// [`STANDARD_SLICES_SHIFT`], or as many as fill one segment of
    /// `1 << segment_shift` bytes if fewer.
    #[inline(always)]
    pub fn slices_shift(self, segment_shift: u32) -> u32 {
        let fit = segment_shift - self.unit_shift();
        let most = if self.is_wide() {
            SLICES_PER_BLOCK_SHIFT
        } else {
            STANDARD_SLICES_SHIFT
        };
        if fit < most { fit } else { most }
    }

    /// Slices in a block of this slice class (segments of
    /// `1 << segment_shift` bytes).
    #[inline(always)]
    pub fn slices_per_block(self, segment_shift: u32) -> u32 {
        1 << self.slices_shift(segment_shift)
    }

    /// log2 of this class's block size (segments of `1 << segment_shift`
    /// bytes).
    #[inline(always)]
    pub fn block_shift(self, segment_shift: u32) -> u32 {
        if self.is_slice() {
            self.unit_shift() + self.slices_shift(segment_shift)
        } else {
            self.unit_shift()
        }
    }

    /// log2 of [`SizeClass::blocks_per_segment`].
    #[inline(always)]
    pub fn blocks_per_segment_shift(self, segment_shift: u32) -> u32 {
        segment_shift - self.block_shift(segment_shift)
    }

    /// Blocks of this class in one segment of `1 << segment_shift` bytes.
    #[inline(always)]
    pub fn blocks_per_segment(self, segment_shift: u32) -> u32 {
        1 << self.blocks_per_segment_shift(segment_shift)
    }
}

#[cfg(test)]
mod tests {
    extern crate std;
    use super::*;
    use std::vec::Vec;

    #[test]
    fn boundaries() {
        for shift in MIN_SEGMENT_SHIFT..=MAX_SEGMENT_SHIFT {
            let segment = 1u64 << shift;
            assert_eq!(Request::for_size(0, shift), Request::Empty);
            let class = |s| match Request::for_size(s, shift) {
                Request::Class(c) => c,
                r => panic!("{s}: {r:?}"),
            };
            assert_eq!(class(1).unit_shift(), 4);
            assert_eq!(class(16).unit_shift(), 4);
            assert_eq!(class(17).unit_shift(), 5);
            assert_eq!(class(4096).unit_shift(), 12);
            assert!(class(4096).is_slice());
            assert_eq!(class(4097).unit_shift(), 13);
            assert!(class(8192).is_slice());
            assert_eq!(class(8193).unit_shift(), 14);
            assert!(class(16384).is_slice());
            assert_eq!(class(16385).unit_shift(), 15);
            assert_eq!(class(16385).is_slice(), MAX_SLICE_SHIFT >= 15);
            assert_eq!(class(32769).unit_shift(), 16);
            assert_eq!(class(32769).is_slice(), MAX_SLICE_SHIFT >= 16);
            assert_eq!(class(65537).is_slice(), MAX_SLICE_SHIFT >= 17);
            assert!(!class((1 << MAX_SLICE_SHIFT) + 1).is_slice());
            assert_eq!(class(segment).index(), classes(shift) - 1);
            assert_eq!(class(segment).blocks_per_segment(shift), 1);
            assert_eq!(Request::for_size(segment + 1, shift), Request::Segments(2));
            assert_eq!(
                class(16).blocks_per_segment(shift),
                slice_blocks_per_segment(shift)
            );
            assert_eq!(class(4096).slices_per_block(shift), 1 << (shift - 12));
            assert_eq!(class(8192).slices_per_block(shift), 1 << (shift - 13));
            assert_eq!(class(16384).slices_per_block(shift), 1 << (shift - 14));
            if MAX_SLICE_SHIFT >= 15 {
                assert_eq!(class(32768).slices_per_block(shift), 1 << (shift - 15));
            }
            // Every class's blocks fit in the bitmap, and the largest count
            // is some class's (the bitmap is no larger than it must be).
            let counts: Vec<u32> = (0..classes(shift))
                .map(|i| SizeClass(i).blocks_per_segment(shift))
                .collect();
            for (i, &n) in counts.iter().enumerate() {
                assert!(
                    n <= 64 * bitmap_words_per_segment(shift),
                    "2^{shift}: class {i} has {n} blocks to a segment"
                );
            }
            assert_eq!(counts.iter().max(), Some(&max_blocks_per_segment(shift)));
        }
        assert_eq!(classes(MAX_SEGMENT_SHIFT), CLASSES);
    }

    #[test]
    fn segment_size_follows_the_heap_size() {
        const MIB: u64 = 1 << 20;
        if BUILD_SEGMENT_SHIFT != 0 {
            return;
        }
        // The rule for any `GPUMALLOC_AUTO_MIN_SEGMENTS`: the largest shift
        // that still gives that many segments.
        for mib in [1, 256, 1024, 6656, 8428, 16384, 32768, 1 << 20] {
            let shift = segment_shift_for(mib * MIB);
            assert!(is_segment_shift(shift));
            if shift > MIN_SEGMENT_SHIFT {
                assert!((mib * MIB) >> shift >= AUTO_MIN_SEGMENTS, "{mib} MiB");
            }
            if shift < MAX_SEGMENT_SHIFT {
                assert!((mib * MIB) >> (shift + 1) < AUTO_MIN_SEGMENTS, "{mib} MiB");
            }
        }
        if AUTO_MIN_SEGMENTS != 2048 {
            return;
        }
        // The default's sizes, as the docs state them.
        assert_eq!(segment_shift_for(MIB), 21);
        assert_eq!(segment_shift_for(256 * MIB), 21);
        assert_eq!(segment_shift_for(6656 * MIB), 21);
        assert_eq!(segment_shift_for(8192 * MIB - 1), 21);
        assert_eq!(segment_shift_for(8192 * MIB), 22);
        assert_eq!(segment_shift_for(8428 * MIB), 22);
        assert_eq!(segment_shift_for(16384 * MIB), 23);
        assert_eq!(segment_shift_for(32768 * MIB - 1), 23);
        assert_eq!(segment_shift_for(32768 * MIB), 24);
        assert_eq!(segment_shift_for(u64::MAX), 24);
    }
}
