//! Shared by the GPU test files: opening the GPU, or saying why not.

use gpumalloc::Gpu;

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
