//! The layout fingerprint: one number that differs between two builds of
//! this crate whose heaps must not meet, because their metadata layout or
//! the `Heap` handle they pass to kernels differ (another class count, slot
//! count, request area, build setting, …).
//!
//! Every PTX built over this crate carries it as the global
//! [`LAYOUT_FINGERPRINT_SYMBOL`], and the host compares it with its own
//! [`LAYOUT_FINGERPRINT`] when it loads a module (`host::Gpu::open`): a
//! stale PTX (from an older source or other `GPUMALLOC_*` settings) is
//! refused with an error that says to rebuild it, instead of corrupting a
//! heap laid out differently. A plain constant computed at compile time;
//! nothing here is touched at run time except the one global's load.

use crate::class::{
    CLASSES, MAX_SEGMENT_SHIFT, MAX_SLICE_SHIFT, MIN_SEGMENT_SHIFT, MIN_SLICE_SHIFT,
    SLICES_PER_BLOCK_SHIFT,
};
use crate::layout::STAT_WORDS;
use crate::request::REQUEST_SLOTS;
use crate::slot::{SLOTS_PER_CLASS, SPARES_PER_SLOT};

/// Bump when a change alters the metadata layout or the handle without
/// changing any constant hashed below.
/// 2: one out-of-tree window word per class after the request slots
/// (`Heap::drop_from_class_tree`).
/// 3: slot words `SLOT_STRIDE_WORDS` (16) apart.
/// 4: a class stripe line per slice class before the segment states
/// (`crate::stripe`).
/// 5: a segment's bitmap sized for the class with the most blocks to a
/// segment, slice classes included (`class::max_blocks_per_segment`).
const LAYOUT_VERSION: u64 = 5;

/// The name of the PTX global that holds a PTX's fingerprint.
pub const LAYOUT_FINGERPRINT_SYMBOL: &str = "GPUMALLOC_LAYOUT_FINGERPRINT";

/// The build settings hashed, in the order of their values in
/// [`SETTING_VALUES`]: every `GPUMALLOC_*` variable this crate reads with
/// `option_env!`. `ptx_builder::ALLOCATOR_SETTINGS` is this list (cargo
/// reruns PTX builds when one changes).
pub const SETTINGS: [&str; 32] = [
    "GPUMALLOC_SEGMENT_SHIFT",
    "GPUMALLOC_SLOTS",
    "GPUMALLOC_SLOT_BUDGET_SHIFT",
    "GPUMALLOC_SEGMENT_SPARE_BUDGET_SHIFT",
    "GPUMALLOC_AUTO_MIN_SEGMENTS",
    "GPUMALLOC_UNLOCKED_FORMAT_SHIFT",
    "GPUMALLOC_WHOLE_SLOT_BUDGET_SHIFT",
    "GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT",
    "GPUMALLOC_LARGE_HEAP_SHIFT",
    "GPUMALLOC_LARGE_HEAP_SLOT_BUDGET_SHIFT",
    "GPUMALLOC_LARGE_HEAP_UNLOCKED_FORMAT_SHIFT",
    "GPUMALLOC_SLOT_STRIDE",
    "GPUMALLOC_SPLIT_COLD",
    "GPUMALLOC_SLICE_CLAIM_ADD",
    "GPUMALLOC_SPARES",
    "GPUMALLOC_BACKOFF_MAX_DOUBLINGS",
    "GPUMALLOC_INSTALL_CLOCK",
    "GPUMALLOC_SLICES_PER_BLOCK_SHIFT",
    "GPUMALLOC_WIDE_BLOCK_MAX_UNIT_SHIFT",
    "GPUMALLOC_WIDE_SPARES",
    "GPUMALLOC_WHOLE_CLAIM_SALT",
    "GPUMALLOC_COUNTED_FORMAT",
    "GPUMALLOC_FIRST_INSTALL_SPARES",
    "GPUMALLOC_INSTALL_CLOCK_CLASS",
    "GPUMALLOC_SLOT_RUN",
    "GPUMALLOC_SLOT_RUN_BLOCKS",
    "GPUMALLOC_SEGMENT_RUNS",
    "GPUMALLOC_WHOLE_CLAIM_ADJACENT",
    "GPUMALLOC_MAX_SLICE_SHIFT",
    "GPUMALLOC_STRIPE",
    "GPUMALLOC_STRIPE_BLOCKS",
    "GPUMALLOC_STRIPE_REUSE",
];

/// What this build saw of each of [`SETTINGS`].
const SETTING_VALUES: [Option<&str>; 32] = [
    option_env!("GPUMALLOC_SEGMENT_SHIFT"),
    option_env!("GPUMALLOC_SLOTS"),
    option_env!("GPUMALLOC_SLOT_BUDGET_SHIFT"),
    option_env!("GPUMALLOC_SEGMENT_SPARE_BUDGET_SHIFT"),
    option_env!("GPUMALLOC_AUTO_MIN_SEGMENTS"),
    option_env!("GPUMALLOC_UNLOCKED_FORMAT_SHIFT"),
    option_env!("GPUMALLOC_WHOLE_SLOT_BUDGET_SHIFT"),
    option_env!("GPUMALLOC_WHOLE_SLOT_SHARE_SHIFT"),
    option_env!("GPUMALLOC_LARGE_HEAP_SHIFT"),
    option_env!("GPUMALLOC_LARGE_HEAP_SLOT_BUDGET_SHIFT"),
    option_env!("GPUMALLOC_LARGE_HEAP_UNLOCKED_FORMAT_SHIFT"),
    option_env!("GPUMALLOC_SLOT_STRIDE"),
    option_env!("GPUMALLOC_SPLIT_COLD"),
    option_env!("GPUMALLOC_SLICE_CLAIM_ADD"),
    option_env!("GPUMALLOC_SPARES"),
    option_env!("GPUMALLOC_BACKOFF_MAX_DOUBLINGS"),
    option_env!("GPUMALLOC_INSTALL_CLOCK"),
    option_env!("GPUMALLOC_SLICES_PER_BLOCK_SHIFT"),
    option_env!("GPUMALLOC_WIDE_BLOCK_MAX_UNIT_SHIFT"),
    option_env!("GPUMALLOC_WIDE_SPARES"),
    option_env!("GPUMALLOC_WHOLE_CLAIM_SALT"),
    option_env!("GPUMALLOC_COUNTED_FORMAT"),
    option_env!("GPUMALLOC_FIRST_INSTALL_SPARES"),
    option_env!("GPUMALLOC_INSTALL_CLOCK_CLASS"),
    option_env!("GPUMALLOC_SLOT_RUN"),
    option_env!("GPUMALLOC_SLOT_RUN_BLOCKS"),
    option_env!("GPUMALLOC_SEGMENT_RUNS"),
    option_env!("GPUMALLOC_WHOLE_CLAIM_ADJACENT"),
    option_env!("GPUMALLOC_MAX_SLICE_SHIFT"),
    option_env!("GPUMALLOC_STRIPE"),
    option_env!("GPUMALLOC_STRIPE_BLOCKS"),
    option_env!("GPUMALLOC_STRIPE_REUSE"),
];

/// FNV-1a over `bytes`, continuing from `hash`.
const fn fnv(mut hash: u64, bytes: &[u8]) -> u64 {
    let mut i = 0;
    while i < bytes.len() {
        hash ^= bytes[i] as u64;
        hash = hash.wrapping_mul(0x0100_0000_01b3);
        i += 1;
    }
    hash
}

const fn number(hash: u64, value: u64) -> u64 {
    fnv(hash, &value.to_le_bytes())
}

/// The fingerprint of `values` (one per setting) over this source's
/// constants.
pub const fn fingerprint_of(values: &[Option<&str>]) -> u64 {
    let mut h = 0xcbf2_9ce4_8422_2325;
    let constants = [
        LAYOUT_VERSION,
        core::mem::size_of::<crate::Heap>() as u64,
        CLASSES as u64,
        MIN_SLICE_SHIFT as u64,
        MAX_SLICE_SHIFT as u64,
        SLICES_PER_BLOCK_SHIFT as u64,
        MIN_SEGMENT_SHIFT as u64,
        MAX_SEGMENT_SHIFT as u64,
        SLOTS_PER_CLASS as u64,
        SPARES_PER_SLOT as u64,
        STAT_WORDS,
        REQUEST_SLOTS as u64,
    ];
    let mut i = 0;
    while i < constants.len() {
        h = number(h, constants[i]);
        i += 1;
    }
    let mut i = 0;
    while i < values.len() {
        h = match values[i] {
            // A set value and an unset one never hash alike.
            Some(text) => fnv(number(h, 1), text.as_bytes()),
            None => number(h, 0),
        };
        i += 1;
    }
    h
}

/// This build's fingerprint.
pub const LAYOUT_FINGERPRINT: u64 = fingerprint_of(&SETTING_VALUES);

/// The fingerprint in the PTX, for the host to read.
#[cfg(target_arch = "nvptx64")]
#[unsafe(no_mangle)]
#[used]
pub static GPUMALLOC_LAYOUT_FINGERPRINT: u64 = LAYOUT_FINGERPRINT;

#[cfg(test)]
mod tests {
    use super::*;

    /// A setting's value, a setting set to its default and the version all
    /// change the number; the same inputs give the same number.
    #[test]
    fn settings_change_the_fingerprint() {
        let none = [None; 11];
        assert_eq!(fingerprint_of(&none), fingerprint_of(&none));
        let mut slots = none;
        slots[1] = Some("64");
        let mut default_slots = none;
        default_slots[1] = Some("32");
        let all = [
            fingerprint_of(&none),
            fingerprint_of(&slots),
            fingerprint_of(&default_slots),
        ];
        assert!(
            all[0] != all[1] && all[1] != all[2] && all[0] != all[2],
            "{all:x?}"
        );
    }
}
