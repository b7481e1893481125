//! Shared by the GPU test files: opening the GPU, or saying why not.

use gpumalloc::Gpu;
use gpumalloc::bench::allocator::{Allocator, Sizes};
use gpumalloc::bench::measure::{Buffers, Keep, Timing, round};

/// The GPU. The tests are `#[ignore]`d, so they run only when asked for
/// (`--include-ignored`); asked for on a machine without a GPU they fail,
/// saying so, rather than pass without checking anything.
pub fn gpu() -> Gpu {
    Gpu::require_for_test();
    gpumalloc::open_gpu(0).expect("a GPU is present but could not be opened")
}

/// One benchmark round (allocate, fill, verify, free) of `allocator`,
/// which must see no null and no wrong word; `what` names the round in a
/// failure.
#[allow(dead_code)] // not every GPU test file runs rounds
pub fn clean_round(
    gpu: &Gpu,
    allocator: &mut dyn Allocator,
    buffers: &mut Buffers,
    sizes: Sizes,
    timing: Timing,
    what: &str,
) {
    let out = round(gpu, allocator, buffers, sizes, Keep::default(), timing).unwrap();
    assert_eq!((out.nulls, out.wrong), (0, 0), "{what}");
}
