//! Shared by the GPU test files: opening the GPU, or saying why not.

use gpumalloc::Gpu;
use gpumalloc::bench::allocator::{Allocator, Sizes};
use gpumalloc::bench::measure::{Buffers, Keep, Timing, round};

/// The GPU, or `None` with a `skipped: no GPU (why)` line when there is
/// none (the tests are `#[ignore]`d; this covers `--include-ignored` on a
/// machine without one).
pub fn gpu() -> Option<Gpu> {
    if let Err(e) = Gpu::available() {
        println!("skipped: no GPU ({e})");
        return None;
    }
    Some(gpumalloc::open_gpu(0).expect("a GPU is present but could not be opened"))
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
