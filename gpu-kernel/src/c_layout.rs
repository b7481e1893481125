//! The [`Heap`] handle as C sees it: the name, offset and size of every
//! field, in order, for the `gm_heap` mirror in `include/gpumalloc.h`.
//! The `capi` crate compares this table with the header at build time
//! (the numbers the header states) and at test time (what a C compiler
//! makes of the header). Constants only: nothing here runs on the GPU.
//!
//! The table is complete by construction: the asserts below check that the
//! fields follow each other with no gap and end at `size_of::<Heap>()`,
//! and each entry's size comes from a closure that type-checks the field.

use core::mem::{offset_of, size_of};

use crate::layout::Heap;
use crate::veb::MAX_LEVELS;

/// One field of the handle as C names it (`tree.universe` for a field of
/// the nested tree shape).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CField {
    /// The C member designator, as `offsetof(gm_heap, …)` takes it.
    pub name: &'static str,
    /// Byte offset in the handle.
    pub offset: usize,
    /// Bytes of the field (whole arrays for arrays).
    pub size: usize,
}

/// Bytes of the handle: `sizeof(gm_heap)`.
pub const HEAP_BYTES: usize = size_of::<Heap>();

/// Alignment of the handle: `_Alignof(gm_heap)`.
pub const HEAP_ALIGN: usize = core::mem::align_of::<Heap>();

/// The size of a field, named by a closure that borrows it (which checks
/// its type against the one stated in the table).
const fn field_size<F>(_: fn(&Heap) -> &F) -> usize {
    size_of::<F>()
}

macro_rules! fields {
    ($($name:literal => $($path:ident).+ : $ty:ty),+ $(,)?) => {
        /// Every field of the handle, in memory order.
        pub const HEAP_FIELDS: &[CField] = &[$(CField {
            name: $name,
            offset: offset_of!(Heap, $($path).+),
            size: field_size::<$ty>(|h| &h.$($path).+),
        }),+];
    };
}

fields! {
    "data" => data: u64,
    "metadata" => metadata: u64,
    "metadata_words" => metadata_words: u64,
    "segments" => segments: u32,
    "flags" => flags: u32,
    "segment_shift" => segment_shift: u32,
    "budget_segments" => budget_segments: u32,
    "stats_at" => stats_at: u64,
    "slots_at" => slots_at: u64,
    "locks_at" => locks_at: u64,
    "spares_at" => spares_at: u64,
    "states_at" => states_at: u64,
    "bitmaps_at" => bitmaps_at: u64,
    "counters_at" => counters_at: u64,
    "trees_at" => trees_at: u64,
    "slice_bits_at" => slice_bits_at: u64,
    "tree.universe" => tree.universe: u32,
    "tree.levels" => tree.levels: u32,
    "tree.level_start" => tree.level_start: [u32; MAX_LEVELS],
    "tree.level_words" => tree.level_words: [u32; MAX_LEVELS],
    "tree.words" => tree.words: u32,
    "tree._pad" => tree._pad: u32,
}

/// Whether the fields tile the handle: each starts where the one before
/// ends, the first at 0 and the last ending at [`HEAP_BYTES`].
const fn fields_tile_the_heap() -> bool {
    let mut end = 0;
    let mut i = 0;
    while i < HEAP_FIELDS.len() {
        if HEAP_FIELDS[i].offset != end {
            return false;
        }
        end += HEAP_FIELDS[i].size;
        i += 1;
    }
    end == HEAP_BYTES
}

const _: () = assert!(
    fields_tile_the_heap(),
    "HEAP_FIELDS misses a field of Heap (or the handle gained padding)"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_names_each_field_once() {
        for (i, a) in HEAP_FIELDS.iter().enumerate() {
            for b in &HEAP_FIELDS[i + 1..] {
                assert_ne!(a.name, b.name);
            }
        }
        assert_eq!(HEAP_ALIGN, 8);
    }
}
