//! Compiles `heap-kernels` (the kernels a heap needs: flush, grow, trim,
//! adopt a stitched run, free) to PTX with `ptx_builder` and embeds it
//! (`host::gpu::HEAP_KERNELS_PTX`), so that a heap never depends on the
//! module its `Gpu` was opened with. Set `GPUMALLOC_PTX_ARCH` to change the
//! architecture (default sm_80).

use std::path::Path;

fn main() {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    // The heap layout this crate computes and the one the PTX was built
    // with must agree: `build` reruns this script when a setting of
    // `gpu-kernel` changes (`ptx_builder::ALLOCATOR_SETTINGS`).
    let crate_dir = Path::new(&manifest_dir).join("../heap-kernels");
    match ptx_builder::PtxBuilder::new(crate_dir).build() {
        Ok(ptx) => println!(
            "cargo:rustc-env=GPUMALLOC_HEAP_KERNELS_PTX_PATH={}",
            ptx.display()
        ),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
