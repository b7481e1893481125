//! Compiles `gpu-kernel` to PTX and embeds it in the root library
//! (`gpumalloc::PTX`). Set `GPUMALLOC_PTX_ARCH` to change the architecture.

fn main() {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let crate_dir = std::path::Path::new(&manifest_dir).join("gpu-kernel");
    match ptx_builder::PtxBuilder::new(crate_dir).build() {
        Ok(ptx) => println!("cargo:rustc-env=GPUMALLOC_PTX_PATH={}", ptx.display()),
        Err(e) => {
            eprintln!("error: {e}");
            std::process::exit(1);
        }
    }
}
