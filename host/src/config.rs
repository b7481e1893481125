//! `HeapConfig`: what a user chooses when creating a heap.

use gpu_kernel::Heap;
use gpu_kernel::layout::HeapLayout;
use gpu_kernel::layout::{CHECK_DOUBLE_FREE, LayoutError, NO_SPARES, TRAP_ON_MISUSE};

use crate::error::{Error, Result};

/// Options of a heap.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HeapConfig {
    /// Bytes of heap data (rounded down to whole segments). `None`: most of
    /// the GPU's free memory (see [`HeapConfig::DEFAULT_FREE_FRACTION`]).
    pub bytes: Option<u64>,
    /// Keep one bit per slice so a double free of a slice is detected
    /// (0.8% more memory; one more atomic per free).
    pub check_double_free: bool,
    /// Stop the kernel with a message on a wild or double free (it is always
    /// counted). On the CPU heap this panics.
    pub trap_on_misuse: bool,
    /// Let each slot keep spare claimed blocks (faster installs; up to
    /// three idle blocks per slot). A tuning knob; on by default.
    pub slot_spares: bool,
    /// log2 of the segment size (21..=24: 2 … 16 MiB). `None`: chosen from
    /// the heap's size when it is created
    /// ([`gpu_kernel::class::segment_shift_for`]: 2 MiB below 8 GiB, 4 MiB
    /// from 8 GiB, 8 MiB from 16 GiB, 16 MiB from 32 GiB, or the build's
    /// `GPUMALLOC_SEGMENT_SHIFT`). Small
    /// segments strand less of a small heap; large ones make the 512 B …
    /// 4 KiB classes claim segments less often.
    pub segment_shift: Option<u32>,
}

impl HeapConfig {
    /// Share of free GPU memory a default heap takes.
    pub const DEFAULT_FREE_FRACTION: f64 = 0.8;

    /// A heap of `bytes` with the default options: no double-free bitmap,
    /// no trap (misuse is counted), spares on. The same in debug and
    /// release builds: checking is the caller's explicit choice
    /// ([`HeapConfig::checked`], `trap_on_misuse`).
    pub fn with_bytes(bytes: u64) -> HeapConfig {
        HeapConfig {
            bytes: Some(bytes),
            ..HeapConfig::default()
        }
    }

    /// A heap of `bytes` with both checks off, as benchmarks run it.
    pub fn unchecked(bytes: u64) -> HeapConfig {
        HeapConfig {
            bytes: Some(bytes),
            check_double_free: false,
            trap_on_misuse: false,
            slot_spares: true,
            segment_shift: None,
        }
    }

    /// A heap of `bytes` that detects double frees and counts misuse
    /// without stopping, as tests run it.
    pub fn checked(bytes: u64) -> HeapConfig {
        HeapConfig {
            check_double_free: true,
            ..HeapConfig::unchecked(bytes)
        }
    }

    /// The layout (addresses left zero) of a heap of `bytes` with these
    /// options.
    pub fn layout(&self, bytes: u64) -> Result<HeapLayout> {
        Heap::layout_for_bytes(bytes, self.segment_shift, self.flags()).map_err(|e| {
            Error::HeapSize {
                bytes,
                why: match e {
                    LayoutError::TooSmall => "smaller than one segment (2 MiB unless chosen)",
                    LayoutError::TooLarge => "more segments than the heap supports",
                    LayoutError::BadSegmentShift => "segment shift outside 21..=24",
                },
            }
        })
    }

    /// The kernel-side flags.
    pub fn flags(&self) -> u32 {
        let mut flags = 0;
        if self.check_double_free {
            flags |= CHECK_DOUBLE_FREE;
        }
        if self.trap_on_misuse {
            flags |= TRAP_ON_MISUSE;
        }
        if !self.slot_spares {
            flags |= NO_SPARES;
        }
        flags
    }
}

impl Default for HeapConfig {
    /// Most of the GPU's free memory, checks off, in every build profile
    /// (a heap that traps in a debug build but counts in a release build
    /// surprised users).
    fn default() -> HeapConfig {
        HeapConfig {
            bytes: None,
            check_double_free: false,
            trap_on_misuse: false,
            slot_spares: true,
            segment_shift: None,
        }
    }
}
