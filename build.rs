//! Compiles `gpu-kernel` to PTX and embeds it in the root library
//! (`gpumalloc::PTX`), and compiles the example user kernel crate
//! (`examples/user-kernel`) for `examples/user_kernel.rs`. Both go through
//! `ptx_builder`, as a user's own `build.rs` would. Set `GPUMALLOC_PTX_ARCH`
//! to change the architecture (default sm_80).

use std::path::Path;

fn main() {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest_dir);
    for (crate_dir, env) in [
        ("gpu-kernel", "GPUMALLOC_PTX_PATH"),
        ("examples/user-kernel", "GPUMALLOC_USER_KERNEL_PTX_PATH"),
    ] {
        match ptx_builder::PtxBuilder::new(root.join(crate_dir)).build() {
            Ok(ptx) => println!("cargo:rustc-env={env}={}", ptx.display()),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
}
