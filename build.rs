//! Compiles `gpu-kernels` (the host's kernels over the `gpu-kernel`
//! allocator) to PTX and embeds it in the root library (`gpumalloc::PTX`),
//! and compiles the example user kernel crate (`examples/user-kernel`) for
//! the numbered examples (`examples/01_first_alloc.rs` …), and the device C
//! ABI (`device-c-abi`, the PTX CUDA C++ links). All go through
//! `ptx_builder`, as a user's own `build.rs` would. Set `GPUMALLOC_PTX_ARCH`
//! to change the architecture (default sm_80).

use std::path::Path;

fn main() {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let root = Path::new(&manifest_dir);
    // `PtxBuilder::build` makes the nested PTX builds rerun when a setting
    // of `gpu-kernel` changes; this build's own setting is added here.
    println!("cargo:rerun-if-env-changed={ALLOC_BLOCKS_ENV}");
    println!("cargo:rerun-if-env-changed={FREE_BLOCKS_ENV}");
    for (crate_dir, env) in [
        ("gpu-kernels", "GPUMALLOC_PTX_PATH"),
        ("examples/user-kernel", "GPUMALLOC_USER_KERNEL_PTX_PATH"),
        ("device-c-abi", "GPUMALLOC_DEVICE_C_ABI_PTX_PATH"),
    ] {
        match ptx_builder::PtxBuilder::new(root.join(crate_dir)).build() {
            Ok(ptx) if crate_dir == "gpu-kernels" => {
                let ptx = bound_heap_kernels(&ptx);
                println!("cargo:rustc-env={env}={}", ptx.display());
            }
            Ok(ptx) => println!("cargo:rustc-env={env}={}", ptx.display()),
            Err(e) => {
                eprintln!("error: {e}");
                std::process::exit(1);
            }
        }
    }
}

/// Set to N (1..=8) to ask ptxas for N resident 256-thread blocks of
/// `heap_alloc` per SM (`.maxntid 256, 1, 1` and `.minnctapersm N`, which
/// caps its registers at 65536 / (256 N)), or to 0 for no launch bounds.
/// Rust has no launch-bounds attribute for NVPTX, so the directives are
/// added to the PTX text here; every launch uses 256 threads
/// (`host::gpu::BLOCK_THREADS`).
const ALLOC_BLOCKS_ENV: &str = "GPUMALLOC_ALLOC_BLOCKS_PER_SM";
/// The bound when `GPUMALLOC_ALLOC_BLOCKS_PER_SM` is not set: four blocks,
/// 64 registers. With the allocator's default code shape
/// (`GPUMALLOC_SPLIT_COLD=3`) ptxas fits `heap_alloc` in them without a
/// spill, and on the H100 slices allocate 4-14% faster than at 96
/// registers (issue 15; `docs/PERF.md`, "heap_alloc in 64 registers
/// again").
const ALLOC_BLOCKS_DEFAULT: u32 = 4;
/// As `GPUMALLOC_ALLOC_BLOCKS_PER_SM`, for `heap_free`.
const FREE_BLOCKS_ENV: &str = "GPUMALLOC_FREE_BLOCKS_PER_SM";
/// The bound when `GPUMALLOC_FREE_BLOCKS_PER_SM` is not set: eight blocks,
/// 32 registers (35 on sm_80 and 39 on sm_90 without), which ptxas meets
/// without a spill; a full SM of warps then hides more of each team's
/// release add. H100, kernel alone: every slice-size free 5-11% faster,
/// mixed -1% (issue 15; `docs/PERF.md`, "heap_free in 32 registers").
const FREE_BLOCKS_DEFAULT: u32 = 8;

/// The launch bound (blocks per SM) that `env` asks for, else `default`.
fn blocks_per_sm(env: &str, default: u32) -> u32 {
    match std::env::var(env) {
        Err(_) => default,
        Ok(text) => match text.parse() {
            Ok(n @ 0..=8) => n,
            _ => {
                eprintln!("error: {env} must be 0..=8, not {text:?}");
                std::process::exit(1);
            }
        },
    }
}

/// `text` with launch bounds of `blocks` 256-thread blocks per SM on the
/// entry `kernel` (none where `blocks` is 0).
fn bound_kernel(text: String, kernel: &str, blocks: u32) -> String {
    if blocks == 0 {
        return text;
    }
    let entry = text
        .find(&format!(".entry {kernel}("))
        .unwrap_or_else(|| panic!("the PTX has a {kernel} entry"));
    let body = entry + text[entry..].find("\n{").expect("the entry has a body");
    format!(
        "{}\n.maxntid 256, 1, 1\n.minnctapersm {blocks}{}",
        &text[..body],
        &text[body..]
    )
}

/// A copy of the PTX at `ptx` in `OUT_DIR` with launch bounds on
/// `heap_alloc` (`ALLOC_BLOCKS_DEFAULT`, or `GPUMALLOC_ALLOC_BLOCKS_PER_SM`)
/// and on `heap_free` (`GPUMALLOC_FREE_BLOCKS_PER_SM`), or the PTX itself
/// where neither has any.
fn bound_heap_kernels(ptx: &Path) -> std::path::PathBuf {
    let alloc = blocks_per_sm(ALLOC_BLOCKS_ENV, ALLOC_BLOCKS_DEFAULT);
    let free = blocks_per_sm(FREE_BLOCKS_ENV, FREE_BLOCKS_DEFAULT);
    if alloc == 0 && free == 0 {
        return ptx.to_path_buf();
    }
    let text = std::fs::read_to_string(ptx).expect("the PTX build's output is readable");
    let bounded = bound_kernel(bound_kernel(text, "heap_alloc", alloc), "heap_free", free);
    let out =
        Path::new(&std::env::var("OUT_DIR").expect("cargo sets OUT_DIR")).join("gpu_kernels.ptx");
    std::fs::write(&out, bounded).expect("OUT_DIR is writable");
    out
}
