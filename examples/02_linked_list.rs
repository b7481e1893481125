//! Example 02: a linked list per thread. The same path as example 01 (a
//! kernel crate of your own, `examples/user-kernel`, which depends on
//! `gpu-kernel` → `ptx_builder` in `build.rs` → PTX → this host program),
//! with many small allocations per thread that point at each other: each
//! of 65,536 threads builds a list of 16 nodes in heap memory, sums it and
//! frees it (`user_list_sum`). The host checks every sum and that nothing
//! is left allocated.
//!
//! Run: `cargo run --release --example 02_linked_list`

use gpumalloc::gpu::Arg;
use gpumalloc::{DeviceHeap, Gpu, HeapConfig};

/// The user crate's PTX: its own kernels only (the allocator is inlined
/// into them).
const USER_PTX: &str = include_str!(env!("GPUMALLOC_USER_KERNEL_PTX_PATH"));

fn main() -> Result<(), Box<dyn std::error::Error>> {
    if let Err(e) = Gpu::available() {
        println!("skipped: no GPU ({e})");
        return Ok(());
    }
    let gpu = Gpu::open(0, USER_PTX)?;
    let heap = DeviceHeap::new(&gpu, HeapConfig::with_bytes(1 << 30))?;
    let (threads, len) = (65_536u64, 16u64);
    let out = gpu.zeros(threads as usize)?;
    let args = [
        heap.arg(),
        Arg::U64(len),
        Arg::U64(gpu.address(&out)),
        Arg::U64(threads),
    ];
    gpu.launch("user_list_sum", threads, &args)?;
    let sums = gpu.download(&out)?;
    for (t, &sum) in sums.iter().enumerate() {
        let want = len * t as u64 * 1000 + len * (len - 1) / 2;
        if sum != want {
            return Err(format!("thread {t}: sum {sum}, expected {want}").into());
        }
    }
    let stats = heap.stats()?;
    println!(
        "02_linked_list on {}: {threads} threads built, summed and freed {len}-node lists; live bytes after: {}",
        gpu.name()?,
        stats.live_bytes
    );
    if stats.live_bytes != 0 {
        return Err("memory left allocated".into());
    }
    Ok(())
}
