//! The whole path for a user: a kernel crate of their own
//! (`examples/user-kernel`, which depends on `gpu-kernel`) → `ptx_builder`
//! in `build.rs` → PTX → this host program, which sets up a heap and
//! launches the user's kernel. Each thread builds a linked list in heap
//! memory, sums it and frees it.
//!
//! Run: `cargo run --release --example user_kernel`

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
        "user kernel on {}: {threads} threads built, summed and freed {len}-node lists; live bytes after: {}",
        gpu.name()?,
        stats.live_bytes
    );
    if stats.live_bytes != 0 {
        return Err("memory left allocated".into());
    }
    Ok(())
}
